//! `autocdc-slt`: runs sqllogictest files against `datafusion-autocdc`.
//!
//! ```text
//! autocdc-slt PATH...
//! ```
//!
//! Every `.slt` file given, or found (recursively, sorted) in a directory given, runs
//! in a fresh in-memory session. One line is printed per failing file (its path and
//! error; the error may span several lines), then `N passed, N failed`. The exit code
//! is non-zero when a file fails or no file is found.

use std::path::PathBuf;
use std::process::ExitCode;

use autocdc_sqllogictest::{collect_slt_files, run_files};
use clap::Parser;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "autocdc-slt",
    version,
    about = "Run sqllogictest files against datafusion-autocdc"
)]
struct Args {
    /// Test files, or directories searched recursively for `.slt` files.
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let files = match collect_slt_files(&args.paths) {
        Ok(files) => files,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    if files.is_empty() {
        eprintln!("error: no .slt files found");
        println!("0 passed, 0 failed");
        return ExitCode::FAILURE;
    }

    let summary = run_files(&files, |failure| println!("FAILED {failure}")).await;
    println!("{summary}");
    if summary.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
