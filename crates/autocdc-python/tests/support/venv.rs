//! Python virtual environments for tests that run Python (shared by the
//! Python module's tests and the CLI's interop test).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Run `command`, which must succeed; returns its stdout and stderr.
pub fn run(command: &mut Command, what: &str) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{what} failed:\n{text}");
    text
}

/// The Python of the virtual environment at `$env_var`, else `default`,
/// created with `packages` from the package registry unless it can
/// already `import` the comma-separated `imports`.
pub fn venv_python(env_var: &str, default: &Path, imports: &str, packages: &[&str]) -> PathBuf {
    let venv = std::env::var_os(env_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| default.to_path_buf());
    let python = venv.join("bin").join("python");
    // one creator at a time: tests running in parallel (threads of one test
    // binary, or binaries) share the environment
    if let Some(parent) = venv.parent() {
        std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
    }
    let lock_path = venv.with_extension("lock");
    let lock = std::fs::File::create(&lock_path)
        .unwrap_or_else(|e| panic!("{}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("locking {}: {e}", lock_path.display()));
    let ready = python.exists()
        && Command::new(&python)
            .args(["-c", &format!("import {imports}")])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ready {
        run(
            Command::new("python3")
                .args(["-m", "venv", "--clear"])
                .arg(&venv),
            "python3 -m venv",
        );
        run(
            Command::new(&python)
                .args(["-m", "pip", "install", "--quiet"])
                .args(packages),
            &format!("pip install {}", packages.join(" ")),
        );
    }
    drop(lock);
    python
}
