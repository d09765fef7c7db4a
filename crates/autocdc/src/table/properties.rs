//! Every key this library writes into a streaming table's Delta
//! configuration (its table properties), and the application ids of its
//! `txn` actions. Values are strings; flow definitions and the declaration
//! are JSON.
//!
//! | key                                            | holds                                        |
//! |------------------------------------------------|----------------------------------------------|
//! | `autocdc.table`                                | how the table was declared                   |
//! | `autocdc.flow.<flow>`                          | a flow's definition                          |
//! | `autocdc.source.<flow>`                        | a flow's source checkpoint                   |
//! | `autocdc.snapshot_watermark`                   | the greatest snapshot version applied        |
//! | `autocdc.snapshot.<flow>.last_version`         | a snapshot flow's last processed version     |
//! | `autocdc.buckets`                              | the number of key buckets                    |
//! | `autocdc.compression`                          | the codec of data and change files           |
//! | `pipelines.cdc.tombstoneGCThresholdInSeconds`  | tombstone retention                          |
//! | `delta.enableChangeDataFeed`                   | Delta: the table writes a change data feed   |
//! | `delta.enableDeletionVectors`                  | Delta: writers may add deletion vectors      |
//!
//! A flow's run number is the version of the `txn` action of application id
//! [`checkpoint_app_id`], committed with the run's data.

/// How the table was declared (JSON).
pub const TABLE_KEY: &str = "autocdc.table";

/// Prefix of the keys holding one flow definition (JSON) each.
pub const FLOW_KEY_PREFIX: &str = "autocdc.flow.";

/// Prefix of the keys holding the flows' source checkpoints.
pub const SOURCE_CHECKPOINT_PREFIX: &str = "autocdc.source.";

/// The key of `flow`'s source checkpoint.
pub fn source_checkpoint_property(flow: &str) -> String {
    format!("{SOURCE_CHECKPOINT_PREFIX}{flow}")
}

/// The greatest snapshot version applied; change events at or below it are
/// dropped (a snapshot is authoritative up to its version).
pub const SNAPSHOT_WATERMARK_PROPERTY: &str = "autocdc.snapshot_watermark";

/// Prefix of the keys of snapshot flows.
pub const SNAPSHOT_PROPERTY_PREFIX: &str = "autocdc.snapshot.";

/// The key of the last snapshot version `flow` processed.
pub fn last_version_property(flow: &str) -> String {
    format!("{SNAPSHOT_PROPERTY_PREFIX}{flow}.last_version")
}

/// Prefix of the keys marking the flows a full refresh has still to run:
/// set by the commit that clears the table, each removed by its flow's
/// commit (see [`crate::table::meta::TableMeta::full_refresh_marks`]).
pub const FULL_REFRESH_PENDING_PREFIX: &str = "autocdc.full_refresh_pending.";

/// The key marking `flow` as still to run in a full refresh.
pub fn full_refresh_pending_property(flow: &str) -> String {
    format!("{FULL_REFRESH_PENDING_PREFIX}{flow}")
}

/// Prefix of the keys marking the append flows a restore rewound: their
/// next run reads rows again that they read before, so their rejected rows
/// alike to delivered ones are not new (set by `RESTORE`, each removed by
/// its flow's commit).
pub const READ_AGAIN_PREFIX: &str = "autocdc.read_again.";

/// The key marking `flow` as rewound by a restore.
pub fn read_again_property(flow: &str) -> String {
    format!("{READ_AGAIN_PREFIX}{flow}")
}

/// Number of key buckets.
pub const BUCKETS_PROPERTY: &str = "autocdc.buckets";

/// The codec of data and change files: `zstd` (default), `lz4`, `snappy`
/// ([`super::writer::FileCompression`]).
pub const COMPRESSION_PROPERTY: &str = "autocdc.compression";

/// Tombstone retention in seconds.
pub const TOMBSTONE_GC_PROPERTY: &str = "pipelines.cdc.tombstoneGCThresholdInSeconds";

/// Delta: the table writes a change data feed.
pub const CHANGE_DATA_FEED_PROPERTY: &str = "delta.enableChangeDataFeed";

/// Delta: writers may add deletion vectors.
pub const DELETION_VECTORS_PROPERTY: &str = "delta.enableDeletionVectors";

/// Delta `txn` application id of a flow's checkpoint.
pub fn checkpoint_app_id(flow: &str) -> String {
    format!("{FLOW_KEY_PREFIX}{flow}")
}
