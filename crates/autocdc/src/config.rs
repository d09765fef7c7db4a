//! Session configuration.

use std::sync::Arc;

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

    /// Replace the DataFusion session configuration.
    pub fn with_session_config(mut self, session_config: SessionConfig) -> Self {
        self.session_config = session_config;
        self
    }
}
