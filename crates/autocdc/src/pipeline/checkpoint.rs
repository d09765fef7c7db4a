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
    /// Event files (`debezium('folder/')`): how many bytes of each were
    /// read; a file appended to since is read on from there.
    EventFiles {
        /// Object store locations and the bytes read of each.
        files: BTreeMap<String, u64>,
    },
    /// The streams of a source query ([`super::streams`]): what each
    /// streaming table has been read up to, and the files each folder has
    /// had read, by its name in the query.
    Streams {
        /// Streaming tables, by name as written.
        tables: BTreeMap<String, StreamCheckpoint>,
        /// Folders (listing tables), by name as written: the object store
        /// locations read so far.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        folders: BTreeMap<String, BTreeSet<String>>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_checkpoints_read_before_folders_had_files_still_read() {
        let old = r#"{"kind":"streams","tables":{"t":{"table_id":"x","version":3}}}"#;
        let parsed: SourceCheckpoint = serde_json::from_str(old).expect("parses");
        let SourceCheckpoint::Streams { tables, folders } = &parsed else {
            panic!("{parsed:?}");
        };
        assert_eq!(tables["t"].version, 3);
        assert!(folders.is_empty());
        // (and written as before while no folder is streamed)
        assert_eq!(serde_json::to_string(&parsed).expect("writes"), old);

        let with_folder = SourceCheckpoint::Streams {
            tables: BTreeMap::new(),
            folders: [("landing".to_string(), ["a/f1.parquet".to_string()].into())].into(),
        };
        let json = serde_json::to_string(&with_folder).expect("writes");
        assert_eq!(
            serde_json::from_str::<SourceCheckpoint>(&json).expect("parses"),
            with_folder
        );
    }
}
