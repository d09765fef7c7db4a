//! What a flow has read of its source, checkpointed in the target with the
//! update's data (the table property `autocdc.source.<flow>`, JSON).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// What a flow has read of its source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SourceCheckpoint {
    /// A streaming table, read up to and including this Delta version.
    Delta {
        /// The source table's Delta table id: a source dropped and created
        /// again is read whole.
        table_id: String,
        /// Last version read.
        version: u64,
    },
    /// A listing table: the files read so far.
    Files {
        /// Object store locations.
        files: BTreeSet<String>,
    },
    /// The streams of a source query ([`super::streams`]): what each
    /// streaming table has been read up to, by its name in the query.
    Streams {
        /// By table name as written.
        tables: BTreeMap<String, StreamCheckpoint>,
    },
}

/// What one stream of a source query has read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCheckpoint {
    /// The streaming table's Delta table id.
    pub table_id: String,
    /// Last version read.
    pub version: u64,
}
