//! Benchmark data for `datafusion-autocdc`: change feeds and snapshot pairs
//! written as Parquet, deterministically from a seed and in bounded memory.
//!
//! * [`write_events`] writes a CDC event stream — `id`, `seq`, `op` (`'U'` or
//!   `'D'`) and value columns — with a configurable share of deletes, late
//!   (out-of-order) events and duplicate replays. Events are produced and
//!   written a batch at a time: memory holds one batch, one Parquet row group,
//!   the late events not yet due and the replay window, never the stream.
//! * [`write_snapshots`] writes two full snapshots of a table, the second
//!   with a share of rows changed, deleted and inserted, streaming both files in
//!   one pass.
//! * [`write_debezium`] writes a Debezium (PostgreSQL connector) change history
//!   as JSON Lines files: snapshot reads, creates, updates, deletes, primary-key
//!   changes and tombstones, with or without the JSON converter's schema.
//!
//! The binary `autocdc-datagen` exposes both on the command line; the
//! side-by-side comparison `benches/compare.sh` uses it.

mod debezium;
mod events;
mod rng;
mod snapshots;
mod values;

use std::fmt;
use std::io;

use arrow::error::ArrowError;
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;

pub use debezium::{
    debezium_file_name, envelope_schema, write_debezium, DebeziumConfig, DebeziumSummary,
};
pub use events::{events_schema, write_events, EventsConfig, EventsSummary};
pub use snapshots::{snapshot_schema, write_snapshots, SnapshotsConfig, SnapshotsSummary};
pub use values::ValueColumns;

/// Rows per Arrow batch handed to the Parquet writer, unless configured.
pub const DEFAULT_BATCH_ROWS: usize = 64 * 1024;

/// Rows per Parquet row group, unless configured: small enough that a
/// 1 M-row file has several row groups for readers to scan in parallel.
pub const DEFAULT_ROW_GROUP_ROWS: usize = 128 * 1024;

/// An error of the generator: a bad parameter, or a failure to encode or write.
#[derive(Debug)]
pub enum Error {
    /// A parameter is out of range; the message names it.
    Config(String),
    /// Writing the output failed.
    Io(io::Error),
    /// Encoding Parquet failed.
    Parquet(ParquetError),
    /// Building an Arrow batch failed.
    Arrow(ArrowError),
}

/// The generator's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(message) => write!(f, "invalid parameter: {message}"),
            Error::Io(error) => write!(f, "I/O error: {error}"),
            Error::Parquet(error) => write!(f, "Parquet error: {error}"),
            Error::Arrow(error) => write!(f, "Arrow error: {error}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Config(_) => None,
            Error::Io(error) => Some(error),
            Error::Parquet(error) => Some(error),
            Error::Arrow(error) => Some(error),
        }
    }
}

impl From<io::Error> for Error {
    fn from(error: io::Error) -> Self {
        Error::Io(error)
    }
}

impl From<ParquetError> for Error {
    fn from(error: ParquetError) -> Self {
        Error::Parquet(error)
    }
}

impl From<ArrowError> for Error {
    fn from(error: ArrowError) -> Self {
        Error::Arrow(error)
    }
}

/// Checks that a fraction parameter lies in `[0, 1]`.
fn check_fraction(name: &str, value: f64) -> Result<()> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{name} must be between 0 and 1, got {value}"
        )))
    }
}

/// Checks the batch and row-group sizes shared by both generators.
fn check_sizes(batch_rows: usize, row_group_rows: usize) -> Result<()> {
    if batch_rows == 0 {
        return Err(Error::Config("batch rows must be positive".into()));
    }
    if row_group_rows == 0 {
        return Err(Error::Config("row group rows must be positive".into()));
    }
    Ok(())
}

/// Parquet writer properties of every generated file: Snappy (the most common
/// default among writers) and `row_group_rows` rows per row group.
fn writer_properties(row_group_rows: usize) -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(row_group_rows))
        .build()
}
