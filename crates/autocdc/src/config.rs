//! Session configuration.

use std::any::Any;
use std::str::FromStr;
use std::sync::Arc;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::common::{DataFusionError, Result};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::prelude::SessionConfig;

use crate::clock::{Clock, SystemClock};

/// Warehouse used when none is given: a local folder.
pub const DEFAULT_WAREHOUSE: &str = "./warehouse";

/// Configuration of a [`crate::CdcSession`].
#[derive(Debug, Clone)]
pub struct AutoCdcConfig {
    /// Warehouse location: a local folder path, `file:///abs/path`, or
    /// `memory://` (a fresh in-memory warehouse, for tests).
    pub warehouse: String,
    /// DataFusion session configuration.
    pub session_config: SessionConfig,
    /// Clock stamping updates (retention is measured by it).
    pub clock: Arc<dyn Clock>,
    /// Object store of a `memory://` warehouse (default: a fresh one).
    pub memory_store: Option<Arc<dyn object_store::ObjectStore>>,
    /// Physical optimizer rules run after DataFusion's own (how a cluster
    /// integration takes over the writing part of update plans).
    pub physical_optimizer_rules: Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>>,
}

impl Default for AutoCdcConfig {
    fn default() -> Self {
        Self::new(DEFAULT_WAREHOUSE)
    }
}

impl AutoCdcConfig {
    /// A config for the given warehouse location.
    pub fn new(warehouse: impl Into<String>) -> Self {
        Self {
            warehouse: warehouse.into(),
            session_config: SessionConfig::new(),
            clock: Arc::new(SystemClock),
            memory_store: None,
            physical_optimizer_rules: Vec::new(),
        }
    }

    /// A config with a fresh in-memory warehouse.
    pub fn in_memory() -> Self {
        Self::new("memory://")
    }

    /// A `memory://` warehouse on `store`: sessions opened with the same
    /// store share their tables.
    pub fn in_memory_on(store: Arc<dyn object_store::ObjectStore>) -> Self {
        let mut config = Self::in_memory();
        config.memory_store = Some(store);
        config
    }

    /// Use another clock (tests of retention).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Run `rule` after DataFusion's physical optimizer rules.
    pub fn with_physical_optimizer_rule(
        mut self,
        rule: Arc<dyn PhysicalOptimizerRule + Send + Sync>,
    ) -> Self {
        self.physical_optimizer_rules.push(rule);
        self
    }

    /// Replace the DataFusion session configuration.
    pub fn with_session_config(mut self, session_config: SessionConfig) -> Self {
        self.session_config = session_config;
        self
    }
}

/// Session options of the AUTO CDC operators, set with
/// `SET autocdc.<name> = <value>` (or on the [`SessionConfig`] with
/// `with_option_extension`).
///
/// Written out rather than with DataFusion's `extensions_options!`, whose
/// entries leave out the `autocdc.` prefix: `SHOW autocdc.<name>` could not
/// find them, `information_schema.df_settings` listed them unprefixed, and a
/// Ballista job (which ships a session's entries and sets them again on the
/// executors) lost every one. Values are checked when set, and an error
/// names the setting.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AutoCdcOptions {
    /// See [`OPTIONS`]: `indexed_fold`.
    pub indexed_fold: bool,
    /// See [`OPTIONS`]: `indexed_fold_max_bytes`.
    pub indexed_fold_max_bytes: usize,
    /// See [`OPTIONS`]: `deletion_vectors`.
    pub deletion_vectors: bool,
    /// See [`OPTIONS`]: `deletion_vector_max_fraction` (at least 0).
    pub deletion_vector_max_fraction: f64,
    /// See [`OPTIONS`]: `deletion_vector_max_files_per_bucket`.
    pub deletion_vector_max_files_per_bucket: usize,
    /// See [`OPTIONS`]: `plain_parquet_reads`.
    pub plain_parquet_reads: bool,
    /// See [`OPTIONS`]: `key_exchange`.
    pub key_exchange: bool,
    /// See [`OPTIONS`]: `pipeline_max_concurrent_updates` (at least 1).
    pub pipeline_max_concurrent_updates: usize,
}

impl Default for AutoCdcOptions {
    fn default() -> Self {
        Self {
            indexed_fold: true,
            indexed_fold_max_bytes: 0,
            deletion_vectors: true,
            deletion_vector_max_fraction: 0.1,
            deletion_vector_max_files_per_bucket: 8,
            plain_parquet_reads: false,
            key_exchange: true,
            pipeline_max_concurrent_updates: 4,
        }
    }
}

/// The `autocdc.*` settings (without the prefix) and what each does, in the
/// order `SHOW ALL` lists them.
pub const OPTIONS: [(&str, &str); 8] = [
    (
        "indexed_fold",
        "Fold SCD type 1 updates (without partial updates, with a fixed-width sequence) by \
         sorting a compact index of the events instead of the events; falls back to \
         DataFusion's spilling sort when the memory pool refuses. `false` always sorts the \
         events.",
    ),
    (
        "indexed_fold_max_bytes",
        "Bytes one partition's indexed fold may hold before it falls back to sorting, beside \
         the memory pool's own limit; 0: only the pool.",
    ),
    (
        "deletion_vectors",
        "New streaming tables take Delta deletion vectors, and updates of tables that take \
         them retire the stored rows of their keys with deletion vectors instead of \
         rewriting whole key buckets. `false`: tables are created without the feature and \
         updates always rewrite.",
    ),
    (
        "deletion_vector_max_fraction",
        "An update uses deletion vectors when its distinct keys are at most this fraction \
         (at least 0; 1 or more: any update) of the table's live stored rows; larger updates \
         rewrite the buckets they touch.",
    ),
    (
        "deletion_vector_max_files_per_bucket",
        "Each update using deletion vectors adds a data file to every key bucket it touches; \
         to keep about this many files per bucket, it also rewrites whole the ⌈touched ÷ \
         limit⌉ fullest touched buckets holding more than limit ÷ 2 files, compacting each \
         into one file without the rows its vectors deleted (a few buckets per update, never \
         all at once). 0: no compaction.",
    ),
    (
        "plain_parquet_reads",
        "Updates read a target's stored rows as plain Parquet scans (`StoredFilesExec` over \
         a `DataSourceExec`, deletion vectors applied by row position) instead of delta-rs' \
         scan, and write one manifest per fold partition, so that their plans can be \
         serialised and run by other processes (set by the Ballista integration).",
    ),
    (
        "key_exchange",
        "An indexed fold (and an indexed snapshot diff) routes its input to its partitions \
         itself: each partition receives the input's batches whole, shared, with the positions \
         of its keys' rows, instead of a copy of those rows from DataFusion's hash repartition. `false`: the repartition \
         (as the Ballista integration sets it: its stages exchange rows between processes).",
    ),
    (
        "pipeline_max_concurrent_updates",
        "A pipeline update runs at most this many table updates at once (tables that do not \
         read one another; 1: one at a time).",
    ),
];

impl AutoCdcOptions {
    /// Set the option `name` (without the prefix) from its SQL text.
    fn set_option(&mut self, name: &str, value: &str) -> Result<()> {
        fn parsed<T: FromStr>(value: &str, what: &str) -> Result<T> {
            value
                .trim()
                .to_ascii_lowercase()
                .parse()
                .map_err(|_| DataFusionError::Configuration(format!("'{value}' is not {what}")))
        }
        const COUNT: &str = "a whole number of at least 0";
        match name {
            "indexed_fold" => self.indexed_fold = parsed(value, "true or false")?,
            "indexed_fold_max_bytes" => self.indexed_fold_max_bytes = parsed(value, COUNT)?,
            "deletion_vectors" => self.deletion_vectors = parsed(value, "true or false")?,
            "deletion_vector_max_fraction" => {
                const FRACTION: &str = "a fraction of at least 0 (1 or more: any update)";
                let fraction: f64 = parsed(value, FRACTION)?;
                if fraction.is_nan() || fraction < 0.0 {
                    return Err(DataFusionError::Configuration(format!(
                        "'{value}' is not {FRACTION}"
                    )));
                }
                self.deletion_vector_max_fraction = fraction
            }
            "deletion_vector_max_files_per_bucket" => {
                self.deletion_vector_max_files_per_bucket = parsed(value, COUNT)?
            }
            "plain_parquet_reads" => self.plain_parquet_reads = parsed(value, "true or false")?,
            "key_exchange" => self.key_exchange = parsed(value, "true or false")?,
            "pipeline_max_concurrent_updates" => {
                let most: usize = parsed(value, "a whole number of at least 1")?;
                if most == 0 {
                    return Err(DataFusionError::Configuration(format!(
                        "'{value}' is not a whole number of at least 1"
                    )));
                }
                self.pipeline_max_concurrent_updates = most
            }
            _ => {
                let names: Vec<_> = OPTIONS.iter().map(|(name, _)| *name).collect();
                return Err(DataFusionError::Configuration(format!(
                    "there is no such setting; the settings of AUTO CDC are autocdc.{}",
                    names.join(", autocdc.")
                )));
            }
        }
        Ok(())
    }

    /// Each option's value as `SHOW` prints it, in the order of [`OPTIONS`].
    fn values(&self) -> [String; 8] {
        [
            self.indexed_fold.to_string(),
            self.indexed_fold_max_bytes.to_string(),
            self.deletion_vectors.to_string(),
            self.deletion_vector_max_fraction.to_string(),
            self.deletion_vector_max_files_per_bucket.to_string(),
            self.plain_parquet_reads.to_string(),
            self.key_exchange.to_string(),
            self.pipeline_max_concurrent_updates.to_string(),
        ]
    }
}

impl ExtensionOptions for AutoCdcOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        // (`key` without the prefix; a value that does not fit changes nothing)
        self.set_option(key, value).map_err(|e| {
            let reason = match e {
                DataFusionError::Configuration(reason) => reason,
                other => other.to_string(),
            };
            DataFusionError::Configuration(format!(
                "SET {}.{key} = {value}: {reason}",
                Self::PREFIX
            ))
        })
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        OPTIONS
            .iter()
            .zip(self.values())
            .map(|((name, description), value)| ConfigEntry {
                key: format!("{}.{name}", Self::PREFIX),
                value: Some(value),
                description,
            })
            .collect()
    }
}

impl ConfigExtension for AutoCdcOptions {
    const PREFIX: &'static str = "autocdc";
}

/// `config` with [`AutoCdcOptions`] registered (kept if already there).
pub fn with_autocdc_options(config: SessionConfig) -> SessionConfig {
    if config
        .options()
        .extensions
        .get::<AutoCdcOptions>()
        .is_some()
    {
        config
    } else {
        config.with_option_extension(AutoCdcOptions::default())
    }
}

/// The [`AutoCdcOptions`] of a session (defaults when not registered).
pub fn autocdc_options(config: &SessionConfig) -> AutoCdcOptions {
    config
        .options()
        .extensions
        .get::<AutoCdcOptions>()
        .cloned()
        .unwrap_or_default()
}
