//! Runs the module's pytest suite (`python_tests/`), the README's Python
//! example and `examples/quickstart.py`: the extension module this package
//! builds is loaded by CPython from a temporary folder, in a virtual
//! environment created on first use under the cargo target's temporary
//! folder (`AUTOCDC_PYTHON_VENV` to put it elsewhere) with pytest, pyarrow,
//! pandas, Polars and datafusion from the package registry. Without a `python3` the
//! tests say so and pass: the Rust tests need no Python.

use std::path::{Path, PathBuf};
use std::process::Command;

mod support;
use support::venv::{self, run};

/// The reader versions the tests were written against.
const PACKAGES: [&str; 5] = [
    "pyarrow==26.0.1",
    "polars==2.1.0",
    "pandas==2.3.3",
    "pytest==8.4.2",
    "datafusion==55.0.0",
];

/// Whether a `python3` can run here.
fn have_python() -> bool {
    let found = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("skipped: no python3 on this machine");
    }
    found
}

fn python() -> PathBuf {
    venv::venv_python(
        "AUTOCDC_PYTHON_VENV",
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-venv"),
        "pyarrow, polars, pandas, pytest, datafusion",
        &PACKAGES,
    )
}

/// The extension module cargo built for this test run: the package's
/// cdylib, in the test binary's `deps` folder.
fn extension_module() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("the test binary's folder");
    let name = if cfg!(target_os = "macos") {
        "libautocdc_python.dylib"
    } else {
        "libautocdc_python.so"
    };
    let module = deps.join(name);
    assert!(module.exists(), "{} was not built", module.display());
    module
}

/// A temporary folder holding the extension module as CPython imports it.
fn module_folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::copy(
        extension_module(),
        dir.path().join("datafusion_autocdc.abi3.so"),
    )
    .expect("copy the extension module");
    dir
}

#[test]
fn python_tests_pass() {
    if !have_python() {
        return;
    }
    let dir = module_folder();
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("python_tests");
    let report = run(
        Command::new(python())
            .args(["-m", "pytest", "-v", "-p", "no:cacheprovider"])
            .arg(&tests)
            .env("PYTHONPATH", dir.path()),
        "python -m pytest",
    );
    assert!(report.contains(" passed"), "{report}");
}

/// `examples/quickstart.py` runs and prints both targets.
#[test]
fn quickstart_example_runs() {
    if !have_python() {
        return;
    }
    let dir = module_folder();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart.py");
    let output = run(
        Command::new(python())
            .arg(&example)
            .current_dir(dir.path())
            .env("PYTHONPATH", dir.path()),
        "examples/quickstart.py",
    );
    assert!(
        output.contains("SCD TYPE 2") && output.contains("__start_at"),
        "{output}"
    );
}

/// The Python blocks of `text`, in order, as one script.
fn python_blocks(text: &str) -> String {
    text.split("```python")
        .skip(1)
        .map(|block| &block[..block.find("```").expect("the block's end")])
        .collect()
}

/// Run `script` in a fresh folder with the module importable; its output.
fn run_script(script: &str, what: &str) -> String {
    let dir = module_folder();
    let example = dir.path().join("example.py");
    std::fs::write(&example, script).expect("example");
    run(
        Command::new(python())
            .arg(&example)
            .current_dir(dir.path())
            .env("PYTHONPATH", dir.path()),
        what,
    )
}

/// The README's Python example and those of `docs/python.md` run as
/// written (each in a fresh folder).
#[test]
fn documented_python_examples_run() {
    if !have_python() {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let section = &readme[readme
        .find("## Python")
        .expect("the README's Python section")..];
    let section = &section[..section[3..]
        .find("\n## ")
        .map_or(section.len(), |end| end + 3)];
    let output = run_script(&python_blocks(section), "the README's Python example");
    assert!(output.contains("userId"), "{output}");
    let docs = std::fs::read_to_string(root.join("docs/python.md")).expect("docs/python.md");
    let script = python_blocks(&docs);
    assert!(script.contains("register_udtf"), "{script}");
    let output = run_script(&script, "the Python examples of docs/python.md");
    assert!(output.contains("| userId"), "{output}");
    assert!(output.contains("_change_type"), "{output}");
}
