//! `autocdc --ballista`: the scripts of the Ballista crate run on a cluster
//! print what they print run locally — their targets and change feeds — and
//! both executors ran tasks:
//! * `cluster_script.sql`: SCD 1 with deletes, a truncate and late events,
//!   SCD 2, a snapshot flow; three small updates each;
//! * `cluster_plain_reads.sql`: SCD 1, SCD 2, BITEMPORAL and snapshot flows
//!   over 200 000 events, three updates each, large enough that the
//!   cluster reads several stored files per bucket (plain Parquet reads,
//!   which must never be split into byte ranges).
//!
//! Both on a scheduler and two executors started as processes on 127.0.0.1
//! (`df://127.0.0.1:PORT`); the first also on a standalone cluster.

use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SCRIPT: &str = include_str!("../../autocdc-ballista/tests/cluster_script.sql");
const PLAIN_READS: &str = include_str!("../../autocdc-ballista/tests/cluster_plain_reads.sql");

/// Write `script` for `dir` (its sources live there) and return its path.
fn script_in(script: &str, dir: &Path) -> PathBuf {
    let path = dir.join("script.sql");
    std::fs::write(&path, script.replace("{dir}", &dir.to_string_lossy())).expect("script");
    path
}

/// Run the CLI on `script` in a fresh folder; stdout and stderr.
fn run_cli(script: &str, extra: &[&str]) -> (String, String) {
    let dir = tempfile::tempdir().expect("a folder");
    let script = script_in(script, dir.path());
    let warehouse = dir.path().join("warehouse");
    let out = Command::new(env!("CARGO_BIN_EXE_autocdc"))
        .args(["-q", "--format", "csv", "--warehouse"])
        .arg(&warehouse)
        .arg("-f")
        .arg(&script)
        .args(extra)
        .output()
        .expect("autocdc runs");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "autocdc {extra:?} failed:\n{stderr}\n{stdout}"
    );
    (stdout, stderr)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn wait_for_port(port: u16, what: &str) {
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what} is not listening on {port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A process killed when the test ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A binary of the Ballista crate, built beside `autocdc` by `cargo test --workspace`.
fn sibling(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_autocdc"))
        .parent()
        .expect("a folder")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo test --workspace builds it)",
        path.display()
    );
    path
}

/// Lines of an executor's stderr that report a task.
fn tasks_in(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("autocdc-executor ") && l.contains(": task "))
        .count()
}

#[test]
fn a_cluster_of_processes_prints_what_a_local_run_prints() {
    let local: Vec<String> = [SCRIPT, PLAIN_READS]
        .iter()
        .map(|script| run_cli(script, &[]).0)
        .collect();

    let logs = tempfile::tempdir().expect("a folder");
    let scheduler_port = free_port();
    let _scheduler = Running(
        Command::new(sibling("autocdc-scheduler"))
            .args(["--bind-host", "127.0.0.1", "--bind-port"])
            .arg(scheduler_port.to_string())
            .stdout(Stdio::null())
            .stderr(File::create(logs.path().join("scheduler.log")).expect("a log"))
            .spawn()
            .expect("autocdc-scheduler starts"),
    );
    wait_for_port(scheduler_port, "autocdc-scheduler");
    let mut executors = Vec::new();
    for i in 0..2 {
        let (flight, grpc) = (free_port(), free_port());
        let work = logs.path().join(format!("work{i}"));
        std::fs::create_dir_all(&work).expect("a work folder");
        let log = logs.path().join(format!("executor{i}.log"));
        let child = Command::new(sibling("autocdc-executor"))
            .args(["--bind-host", "127.0.0.1", "--scheduler-host", "127.0.0.1"])
            .args(["--scheduler-port", &scheduler_port.to_string()])
            .args(["--bind-port", &flight.to_string()])
            .args(["--bind-grpc-port", &grpc.to_string()])
            .args(["--concurrent-tasks", "2"])
            .arg("--work-dir")
            .arg(&work)
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("a log"))
            .spawn()
            .expect("autocdc-executor starts");
        executors.push((Running(child), log, flight));
    }
    for (_, _, flight) in &executors {
        wait_for_port(*flight, "autocdc-executor");
    }
    // (executors register with their first poll)
    std::thread::sleep(Duration::from_secs(2));

    let cluster = format!("df://127.0.0.1:{scheduler_port}");
    for (script, local) in [SCRIPT, PLAIN_READS].iter().zip(&local) {
        let (remote, _) = run_cli(script, &["--ballista", &cluster]);
        assert_eq!(&remote, local);
    }
    for (_, log, _) in &executors {
        let tasks = tasks_in(log);
        assert!(
            tasks > 0,
            "{} ran no task:\n{}",
            log.display(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
}

#[test]
fn a_standalone_cluster_prints_what_a_local_run_prints() {
    let (local, _) = run_cli(SCRIPT, &[]);
    let (remote, stderr) = run_cli(SCRIPT, &["--ballista", "standalone"]);
    assert_eq!(remote, local);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("ballista standalone: tasks by executor: "))
        .unwrap_or_else(|| panic!("no task line in:\n{stderr}"));
    let counts: Vec<usize> = line
        .rsplit(": ")
        .next()
        .unwrap_or_default()
        .split(", ")
        .filter_map(|e| e.rsplit('=').next()?.parse().ok())
        .collect();
    assert_eq!(counts.len(), 2, "{line}");
    assert!(counts.iter().all(|&n| n > 0), "{line}");
}
