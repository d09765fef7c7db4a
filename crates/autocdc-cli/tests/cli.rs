//! End-to-end tests of the `autocdc` binary.

use std::process::{Command, Output};

/// Runs the binary with a warehouse inside a fresh temporary directory.
fn autocdc(args: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let warehouse = dir.path().join("warehouse");
    let output = Command::new(env!("CARGO_BIN_EXE_autocdc"))
        .arg("--warehouse")
        .arg(&warehouse)
        .args(args)
        .output()
        .expect("run autocdc");
    (output, dir)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn command_prints_result_table() {
    let (output, dir) = autocdc(&["-c", "SELECT 1 AS x"]);
    let text = stdout(&output);
    assert!(
        output.status.success(),
        "stdout:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("| x |"), "{text}");
    assert!(text.contains("| 1 |"), "{text}");
    assert!(text.contains("1 row(s) fetched."), "{text}");
    assert!(dir.path().join("warehouse").is_dir(), "warehouse created");
}

#[test]
fn file_runs_statements_in_order() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let script = dir.path().join("script.sql");
    std::fs::write(
        &script,
        "-- a table; then a query\nCREATE TABLE t AS VALUES (41);\nSELECT column1 + 1 AS answer FROM t;\n",
    )
    .expect("write script");
    let script = script.to_str().expect("utf-8 path");

    let (output, _warehouse) = autocdc(&["-f", script]);
    let text = stdout(&output);
    assert!(
        output.status.success(),
        "stdout:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("0 row(s) fetched."), "{text}");
    assert!(text.contains("answer"), "{text}");
    assert!(text.contains("42"), "{text}");
}

#[test]
fn failing_statement_stops_with_error() {
    let (output, _dir) = autocdc(&["-c", "SELECT * FROM missing_table; SELECT 'unreached'"]);
    assert!(!output.status.success());
    assert!(!stdout(&output).contains("unreached"));
    assert!(String::from_utf8_lossy(&output.stderr).contains("Error"));
}

#[test]
fn missing_script_is_an_error() {
    let (output, dir) = autocdc(&["-f", "/nonexistent/script.sql"]);
    drop(dir);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read"));
}
