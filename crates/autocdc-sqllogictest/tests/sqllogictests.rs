//! Runs every sqllogictest file under the workspace's `sqllogictests/` directory.

use std::path::PathBuf;

use autocdc_sqllogictest::{collect_slt_files, run_files};

/// The workspace-level `sqllogictests/` directory.
fn test_root() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../sqllogictests");
    // Shorter paths in failure reports; fall back to the joined path if it is missing.
    root.canonicalize().unwrap_or(root)
}

#[tokio::test(flavor = "multi_thread")]
async fn sqllogictests() {
    let root = test_root();
    let files = collect_slt_files(std::slice::from_ref(&root))
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", root.display()));
    assert!(!files.is_empty(), "no .slt files under {}", root.display());

    let summary = run_files(&files, |failure| eprintln!("FAILED {failure}\n")).await;
    if !summary.failures.is_empty() {
        let report: Vec<String> = summary.failures.iter().map(ToString::to_string).collect();
        panic!("{summary}\n\n{}", report.join("\n\n"));
    }
}
