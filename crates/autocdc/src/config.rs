//! Session configuration.

use datafusion::prelude::SessionConfig;

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
        }
    }

    /// A config with a fresh in-memory warehouse.
    pub fn in_memory() -> Self {
        Self::new("memory://")
    }

    /// Replace the DataFusion session configuration.
    pub fn with_session_config(mut self, session_config: SessionConfig) -> Self {
        self.session_config = session_config;
        self
    }
}
