//! Streaming tables: Delta storage in the warehouse and the `TableProvider`
//! that shows their live rows.
//!
//! A streaming table is a state store (a Delta table under
//! `<table>/_autocdc/state/`, everything the flows keep) and the published
//! table at `<table>/` that Delta readers see ([`published`]). Updates,
//! DML and our own reads work on the state store; the published table follows
//! it after each commit.

pub mod bucket;
pub(crate) mod changes;
pub mod commit;
pub(crate) mod commit_times;
#[cfg(test)]
mod counted_store;
pub mod deletion_vectors;
pub mod event;
mod file_tail;
mod files;
pub mod foreign;
mod key_bloom;
mod known_runs;
mod log_cache;
mod log_listing;
pub mod manifest;
pub mod meta;
pub mod plain_files;
mod probe_index;
pub mod properties;
pub mod provider;
pub mod published;
pub(crate) mod reject_sink;
pub(crate) mod rejects;
pub(crate) mod restore;
pub mod stage;
pub mod stored_rows;
pub mod superseded;
mod warehouse;
pub mod writer;

pub use meta::TableMeta;
pub use provider::{ScdTable, TargetDml};
pub use warehouse::{refused_in_path, TableName, Warehouse, REFUSED_IN_PATHS};

use datafusion::common::DataFusionError;
use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties};

/// A builder of the Delta table at `url`, on the warehouse's `store`.
pub(crate) fn table_builder(
    url: url::Url,
    store: std::sync::Arc<dyn object_store::ObjectStore>,
) -> datafusion::common::Result<deltalake_core::DeltaTableBuilder> {
    Ok(deltalake_core::DeltaTableBuilder::from_url(url.clone())
        .map_err(delta_err)?
        .with_storage_backend(store, url))
}

/// A deltalake (or object store) error as a DataFusion error.
pub(crate) fn delta_err(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// The builder of every commit to a streaming table. After a commit whose
/// version is a multiple of `delta.checkpointInterval` (100 by default), it
/// writes a Delta checkpoint, so opening a table replays at most that many
/// JSON commits however many updates it has seen. Expired log files are
/// kept, so that time travel and `table_changes` reach every version.
pub(crate) fn commit_builder() -> CommitBuilder {
    CommitBuilder::from(
        CommitProperties::default()
            .with_create_checkpoint(true)
            .with_cleanup_expired_logs(Some(false)),
    )
}

/// Whether a table takes deletion vectors: its protocol has the feature and
/// its `delta.enableDeletionVectors` property is on.
pub(crate) fn takes_deletion_vectors(
    snapshot: &deltalake_core::table::state::DeltaTableState,
) -> bool {
    let featured = snapshot
        .protocol()
        .writer_features()
        .is_some_and(|f| f.iter().any(|f| f.to_string() == "deletionVectors"));
    let enabled = snapshot
        .metadata()
        .configuration()
        .get(properties::DELETION_VECTORS_PROPERTY)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    featured && enabled
}

/// Protocol of a new streaming table (state store or published table): table features (reader 3, writer 7)
/// with `timestampNtz`, so that flows can store `TIMESTAMP` (without time
/// zone) columns and sequences whose types are fixed only by the first update,
/// and `changeDataFeed`.
pub(crate) fn streaming_protocol(
    deletion_vectors: bool,
) -> datafusion::common::Result<deltalake_core::kernel::Protocol> {
    let mut readers = vec!["timestampNtz"];
    let mut writers = vec!["timestampNtz", "changeDataFeed"];
    if deletion_vectors {
        readers.push("deletionVectors");
        writers.push("deletionVectors");
    }
    serde_json::from_value(serde_json::json!({
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": readers,
        "writerFeatures": writers,
    }))
    .map_err(delta_err)
}
