//! [sqllogictest] support for `datafusion-autocdc`.
//!
//! Each `.slt` file runs in a fresh [`CdcSession`] on an in-memory warehouse with the
//! information schema enabled (see [`test_config`]). Results are rendered with the
//! conventions of DataFusion's own sqllogictest engine (see [`normalize`]), and the
//! runner is configured like DataFusion's: strict column type checking
//! ([`sqllogictest::strict_column_validator`]), trailing whitespace ignored
//! ([`value_normalizer`]) and `<slt:ignore>` markers supported ([`value_validator`]).
//!
//! The statements understood by the session (including AUTO CDC statements such as
//! `CREATE STREAMING TABLE`) can be used in `statement` and `query` records; the
//! `rowsort` / `valuesort` modes and column type letters `B D I P R T` are available
//! (see [`CdcColumnType`]).
//!
//! [sqllogictest]: https://github.com/risinglightdb/sqllogictest-rs

mod column_type;
mod engine;
pub mod normalize;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionConfig;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use sqllogictest::{MakeConnection, Runner, TestError};

pub use column_type::{column_types, CdcColumnType};
pub use engine::CdcDatabase;
pub use normalize::{convert_batches, value_normalizer, value_validator};

/// Extension of sqllogictest files.
pub const SLT_EXTENSION: &str = "slt";

/// The configuration of the session each test file runs in: an in-memory warehouse
/// and the information schema enabled; other settings are DataFusion's defaults.
pub fn test_config() -> AutoCdcConfig {
    AutoCdcConfig::in_memory()
        .with_session_config(SessionConfig::new().with_information_schema(true))
}

/// Opens a fresh session with [`test_config`].
pub async fn open_test_session() -> Result<CdcSession> {
    CdcSession::open(test_config()).await
}

/// Applies DataFusion's runner settings: strict column types, whitespace-tolerant
/// value comparison, and the `autocdc` / `datafusion` labels for `skipif` / `onlyif`.
pub fn configure_runner<M>(runner: &mut Runner<CdcDatabase, M>)
where
    M: MakeConnection<Conn = CdcDatabase>,
{
    runner.add_label("autocdc");
    runner.add_label("datafusion");
    runner.with_column_validator(sqllogictest::strict_column_validator);
    runner.with_normalizer(value_normalizer);
    runner.with_validator(value_validator);
}

/// Why a test file failed.
#[derive(Debug)]
pub enum SltError {
    /// The session for the file could not be opened.
    Session(DataFusionError),
    /// A record of the file failed (or the file could not be read or parsed).
    Test(TestError),
}

impl fmt::Display for SltError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Session(error) => write!(f, "cannot open session: {error}"),
            Self::Test(error) => write!(f, "{}", error.display(false).to_string().trim_end()),
        }
    }
}

impl std::error::Error for SltError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Session(error) => Some(error),
            Self::Test(error) => Some(error),
        }
    }
}

/// Runs one test file in a fresh session (see [`test_config`]).
pub async fn run_file(path: &Path) -> std::result::Result<(), SltError> {
    let session = Arc::new(open_test_session().await.map_err(SltError::Session)?);
    let mut runner = Runner::new(move || {
        let database = CdcDatabase::new(Arc::clone(&session));
        async move { Ok::<_, DataFusionError>(database) }
    });
    configure_runner(&mut runner);
    let outcome = runner.run_file_async(path).await;
    runner.shutdown_async().await;
    outcome.map_err(SltError::Test)
}

/// Expands `paths` into the list of test files to run: a directory contributes every
/// `.slt` file below it (recursively, sorted by path); any other path is taken as a
/// test file as given (so a missing file is reported when it is run).
pub fn collect_slt_files(paths: &[PathBuf]) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut found = Vec::new();
            find_slt_files(path, &mut found)?;
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// Appends the `.slt` files below `dir` to `found`.
fn find_slt_files(dir: &Path, found: &mut Vec<PathBuf>) -> io::Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot read {}: {e}", dir.display())))?;
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            find_slt_files(&path, found)?;
        } else if path.extension().is_some_and(|ext| ext == SLT_EXTENSION) {
            found.push(path);
        }
    }
    Ok(())
}

/// A test file that failed, with its error.
#[derive(Debug)]
pub struct FileFailure {
    /// The test file.
    pub path: PathBuf,
    /// Why it failed.
    pub error: SltError,
}

impl fmt::Display for FileFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.error)
    }
}

/// The outcome of running a set of test files.
#[derive(Debug, Default)]
pub struct RunSummary {
    /// Number of files that passed.
    pub passed: usize,
    /// The files that failed, in the order they ran.
    pub failures: Vec<FileFailure>,
}

impl RunSummary {
    /// Number of files that failed.
    pub fn failed(&self) -> usize {
        self.failures.len()
    }

    /// Whether at least one file ran and none failed.
    pub fn is_success(&self) -> bool {
        self.passed > 0 && self.failures.is_empty()
    }
}

impl fmt::Display for RunSummary {
    /// `N passed, N failed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} passed, {} failed", self.passed, self.failed())
    }
}

/// Runs `files` one after the other, each in its own session, calling `on_failure`
/// as soon as a file fails.
pub async fn run_files(files: &[PathBuf], mut on_failure: impl FnMut(&FileFailure)) -> RunSummary {
    let mut summary = RunSummary::default();
    for path in files {
        match run_file(path).await {
            Ok(()) => summary.passed += 1,
            Err(error) => {
                let failure = FileFailure {
                    path: path.clone(),
                    error,
                };
                on_failure(&failure);
                summary.failures.push(failure);
            }
        }
    }
    summary
}
