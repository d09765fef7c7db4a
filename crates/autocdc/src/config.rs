//! Session configuration.

use std::sync::Arc;

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

datafusion::common::extensions_options! {
    /// Session options of the AUTO CDC operators, set with
    /// `SET autocdc.<name> = <value>` (or on the [`SessionConfig`] with
    /// `with_option_extension`).
    pub struct AutoCdcOptions {
        /// Fold SCD type 1 updates (without partial updates, with a
        /// fixed-width sequence) by sorting a compact index of the events instead of
        /// the events; falls back to DataFusion's spilling sort when the
        /// memory pool refuses. `false` always sorts the events.
        pub indexed_fold: bool, default = true
        /// Bytes one partition's indexed fold may hold before it falls back
        /// to sorting, beside the memory pool's own limit; 0: only the pool.
        pub indexed_fold_max_bytes: usize, default = 0
        /// New streaming tables take Delta deletion vectors, and updates of
        /// tables that take them retire the stored rows of their keys with
        /// deletion vectors instead of rewriting whole key buckets. `false`:
        /// tables are created without the feature and updates always rewrite.
        pub deletion_vectors: bool, default = true
        /// An update uses deletion vectors when its distinct keys are at most
        /// this fraction of the table's live stored rows; larger updates
        /// rewrite the buckets they touch.
        pub deletion_vector_max_fraction: f64, default = 0.1
        /// Each update using deletion vectors adds a data file to every
        /// key bucket it touches; to keep about this many files per bucket,
        /// it also rewrites whole the ⌈touched ÷ limit⌉ fullest touched
        /// buckets holding more than limit ÷ 2 files, compacting each into
        /// one file without the rows its vectors deleted (a few buckets per
        /// update, never all at once). 0: no compaction.
        pub deletion_vector_max_files_per_bucket: usize, default = 8
        /// Updates read a target's stored rows as plain Parquet scans
        /// (`StoredFilesExec` over a `DataSourceExec`, deletion vectors
        /// applied by row position) instead of delta-rs' scan, and write
        /// one manifest per fold partition, so that their plans can be
        /// serialised and run by other processes (set by the Ballista
        /// integration).
        pub plain_parquet_reads: bool, default = false
        /// An indexed fold routes its events to its partitions itself:
        /// each partition receives the input's batches whole, shared, with
        /// the positions of its keys' rows, instead of a copy of those rows
        /// from DataFusion's hash repartition. `false`: the repartition (as
        /// the Ballista integration sets it: its stages exchange rows
        /// between processes).
        pub key_exchange: bool, default = true
        /// A pipeline update runs at most this many table updates at once
        /// (tables that do not read one another; 1: one at a time).
        pub pipeline_max_concurrent_updates: usize, default = 4
    }
}

impl datafusion::common::config::ConfigExtension for AutoCdcOptions {
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
