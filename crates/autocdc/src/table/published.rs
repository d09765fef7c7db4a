//! The published table: what any Delta reader sees at a target's path.
//!
//! A streaming table is two Delta tables in one folder:
//!
//! ```text
//!  <warehouse>/<schema>/<table>/
//!    _delta_log/              the published table: user columns, visible rows
//!    _autocdc/state/          the state store: every row a flow keeps
//!      _delta_log/            (live rows, tombstones, the truncate watermark,
//!      __cdc_bucket=N/...     hidden SCD 2 events, __cdc_* columns, flow
//!      _change_data/...       definitions and checkpoints)
//! ```
//!
//! The published table writes no data of its own: its log adds the state
//! store's files (`_autocdc/state/...`, relative paths) with
//!
//! * a schema of the user columns only (plus `__start_at` / `__end_at`, and
//!   the system columns of BITEMPORAL targets): Delta readers read a file's
//!   columns by the table's schema, so the `__cdc_*` columns in the files
//!   are never read, and it has no partition column;
//! * on each file, a deletion vector marking every row that is not visible
//!   (`__cdc_kind` other than a live row or version) and every row the state
//!   store itself marked deleted; a file with no visible row is left out;
//! * the state store's change data files as its own (`cdc` actions), so its
//!   change data feed is the flows' change feed.
//!
//! Folders that start with `_` are not data to Delta readers and VACUUM of
//! the published table leaves them alone.
//!
//! The published table is a function of the state store's log: [`publish`]
//! reads the state versions the published table has not seen yet (its
//! `txn` for the application id [`STATE_APP_ID`] holds the last one) and
//! commits the effect of each as one commit, so version `v` of the published
//! table shows version `v` of the state store (`table_changes`, `table_as_of`
//! and the versions in the metrics mean both). It runs after every commit to
//! the state store and when a table is opened, so a failure between the two
//! commits is repaired by the next update or the next open: published readers
//! see the state of some committed update, never half of one.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Int8Type, Schema};
use datafusion::common::{DataFusionError, Result};
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake_core::kernel::{Action, Add, AddCDCFile, MetadataExt, StructType, Transaction};
use deltalake_core::logstore::get_actions;
use deltalake_core::parquet::arrow::arrow_reader::ArrowReaderOptions;
use deltalake_core::parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStore;
use roaring::RoaringTreemap;

use super::deletion_vectors::{object_reader, read_vector, write_vectors};
use super::properties::{CHANGE_DATA_FEED_PROPERTY, DELETION_VECTORS_PROPERTY};
use super::{commit_builder, delta_err, streaming_protocol, table_builder};
use crate::fold::columns::{Kind, INTERNAL_PREFIX, KIND_COL};

/// Folder of our bookkeeping inside a table's folder.
pub const STATE_FOLDER: &str = "_autocdc";
/// The state store's folder inside [`STATE_FOLDER`].
pub const STATE_TABLE: &str = "state";
/// `txn` application id of the published table: the last state version published.
pub const STATE_APP_ID: &str = "autocdc.state";

/// Path of a state store file as the published table adds it.
fn published_path(state_path: &str) -> String {
    format!("{STATE_FOLDER}/{STATE_TABLE}/{state_path}")
}

/// Where a published table lives: its URL on the warehouse's store.
#[derive(Debug, Clone)]
pub struct PublishedLocation {
    url: url::Url,
    store: Arc<dyn ObjectStore>,
}

impl PublishedLocation {
    /// The table at `url`, on `store`.
    pub fn new(url: url::Url, store: Arc<dyn ObjectStore>) -> Self {
        Self { url, store }
    }

    /// A builder of the published table.
    pub fn builder(&self) -> Result<DeltaTableBuilder> {
        table_builder(self.url.clone(), Arc::clone(&self.store))
    }
}

/// Publish every state version of `state` (loaded at its latest version)
/// that the published table at `published` has not seen; returns the
/// published version committed, if any.
pub async fn publish(state: &DeltaTable, published: &PublishedLocation) -> Result<Option<u64>> {
    let Some(state_version) = state.version() else {
        return Ok(None);
    };
    let state_version = state_version as i64;
    let user_schema = user_schema(state)?;
    let mut last = None;
    // a retry finds the work done by a concurrent publisher
    let mut attempts = 0;
    loop {
        let table = match published.builder()?.load().await {
            Ok(table) => table,
            Err(DeltaTableError::NotATable(_)) => {
                if user_schema.fields().count() == 0 {
                    // no column yet (the first flow fixes them): no table yet
                    return Ok(None);
                }
                // version 0 stands for the state store's version 0 (the
                // CREATE), with the columns known now; the state versions
                // after it follow one by one
                match create(published.builder()?, &user_schema).await {
                    Ok(table) => table,
                    Err(_) if attempts < 2 => {
                        attempts += 1;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(delta_err(e)),
        };
        let seen = table
            .snapshot()
            .map_err(delta_err)?
            .transaction_version(table.log_store().as_ref(), STATE_APP_ID)
            .await
            .map_err(delta_err)?
            .unwrap_or(0);
        if seen >= state_version {
            return Ok(last);
        }
        // one published commit per state version: the published table's
        // versions are the state store's
        match commit(state, &table, seen + 1, &user_schema).await {
            Ok(version) => {
                last = version;
                attempts = 0;
            }
            Err(PublishError::Commit(_)) if attempts < 2 => attempts += 1,
            Err(PublishError::Commit(e)) | Err(PublishError::Other(e)) => return Err(e),
        }
    }
}

enum PublishError {
    /// The published commit failed (another publisher may have committed first).
    Commit(DataFusionError),
    Other(DataFusionError),
}

impl From<DataFusionError> for PublishError {
    fn from(e: DataFusionError) -> Self {
        Self::Other(e)
    }
}

/// The published schema: the state store's columns less ours.
fn user_schema(state: &DeltaTable) -> Result<StructType> {
    let snapshot = state.snapshot().map_err(delta_err)?;
    let arrow = snapshot.snapshot().arrow_schema();
    let fields: Vec<_> = arrow
        .fields()
        .iter()
        .filter(|f| !f.name().starts_with(INTERNAL_PREFIX))
        .map(|f| f.as_ref().clone())
        .collect();
    (&Schema::new(fields)).try_into_kernel().map_err(delta_err)
}

/// Create the published table (no file yet).
async fn create(published: DeltaTableBuilder, schema: &StructType) -> Result<DeltaTable> {
    let table = published.build().map_err(delta_err)?;
    table
        .create()
        .with_columns(schema.fields().cloned())
        .with_actions([Action::Protocol(streaming_protocol(true)?)])
        .with_configuration([
            (
                CHANGE_DATA_FEED_PROPERTY.to_string(),
                Some("true".to_string()),
            ),
            (
                DELETION_VECTORS_PROPERTY.to_string(),
                Some("true".to_string()),
            ),
        ])
        .with_raise_if_key_not_exists(false)
        .await
        .map_err(delta_err)
}

/// What the state version `version` did to each state file: its last
/// `add` (`None`: removed), and its change data files.
async fn state_changes(
    state: &DeltaTable,
    version: i64,
) -> Result<(BTreeMap<String, Option<Add>>, Vec<AddCDCFile>)> {
    let version = version as u64;
    let Some(bytes) = state
        .log_store()
        .read_commit_entry(version)
        .await
        .map_err(delta_err)?
    else {
        return Err(DataFusionError::Execution(format!(
            "state store version {version} is missing from its log: the published table cannot follow it"
        )));
    };
    let mut files = BTreeMap::new();
    let mut cdc = Vec::new();
    for action in get_actions(version, &bytes).map_err(delta_err)? {
        match action {
            Action::Add(add) => {
                files.insert(add.path.clone(), Some(add));
            }
            Action::Remove(remove) => {
                files.insert(remove.path, None);
            }
            Action::Cdc(file) => cdc.push(file),
            _ => {}
        }
    }
    Ok((files, cdc))
}

/// Positions of the rows of a state file that are not visible, and its
/// number of rows.
async fn hidden_rows(store: &Arc<dyn ObjectStore>, add: &Add) -> Result<(RoaringTreemap, u64)> {
    let path = Path::from_url_path(&add.path).map_err(delta_err)?;
    let reader = object_reader(store, &path, add.size.max(0) as u64);
    let builder =
        ParquetRecordBatchStreamBuilder::new_with_options(reader, ArrowReaderOptions::new())
            .await?;
    let mask = ProjectionMask::columns(builder.parquet_schema(), [KIND_COL]);
    let mut stream = builder.with_projection(mask).build()?;
    let mut hidden = RoaringTreemap::new();
    let mut row = 0u64;
    while let Some(batch) = stream.try_next().await? {
        let kinds = batch
            .column_by_name(KIND_COL)
            .ok_or_else(|| {
                DataFusionError::Execution(format!("state file '{path}' has no {KIND_COL}"))
            })?
            .as_primitive::<Int8Type>();
        // positions come in increasing order: appended, not inserted
        let visible = Kind::Upsert as i8;
        for (i, kind) in kinds.values().iter().enumerate() {
            if *kind != visible || kinds.is_null(i) {
                hidden
                    .try_push(row + i as u64)
                    .map_err(|_| DataFusionError::Internal("row positions out of order".into()))?;
            }
        }
        row += kinds.len() as u64;
    }
    Ok((hidden, row))
}

/// Commit the effect of the state version `version` on the published table.
async fn commit(
    state: &DeltaTable,
    published: &DeltaTable,
    version: i64,
    user_schema: &StructType,
) -> std::result::Result<Option<u64>, PublishError> {
    let (files, cdc) = state_changes(state, version).await?;
    let snapshot = published.snapshot().map_err(delta_err)?;
    let current: BTreeMap<String, _> = snapshot
        .snapshot()
        .file_views(published.log_store().as_ref(), None)
        .map_ok(|view| (view.path().to_string(), view))
        .try_collect()
        .await
        .map_err(delta_err)?;
    let state_store = state.object_store();
    let published_store = published.object_store();
    let mut actions = Vec::new();
    let mut added: Vec<(Add, RoaringTreemap)> = Vec::new();
    for (path, add) in files {
        let target = published_path(&path);
        if let Some(view) = current.get(&target) {
            actions.push(Action::Remove(view.remove_action(true)));
        }
        let Some(add) = add else { continue };
        let (hidden, rows) = match (&add.deletion_vector, current.get(&target)) {
            // more rows of a published file retired: its vector grows by
            // them (the state's vector only ever grows), no need to read it
            (Some(retired), Some(view)) => {
                let mut hidden = match view.deletion_vector_descriptor() {
                    Some(old) => read_vector(&published_store, &old).await?,
                    None => RoaringTreemap::new(),
                };
                hidden |= read_vector(&state_store, retired).await?;
                let rows = view.num_records().map(|n| n as u64);
                match rows {
                    Some(rows) => (hidden, rows),
                    None => {
                        let (mut all, rows) = hidden_rows(&state_store, &add).await?;
                        all |= hidden;
                        (all, rows)
                    }
                }
            }
            // a file not published (nothing of it visible) stays so
            (Some(_), None) => continue,
            (None, _) => hidden_rows(&state_store, &add).await?,
        };
        if hidden.len() >= rows {
            continue;
        }
        added.push((
            Add {
                path: target,
                partition_values: Default::default(),
                size: add.size,
                modification_time: add.modification_time,
                data_change: true,
                stats: Some(format!("{{\"numRecords\":{rows}}}")),
                ..Default::default()
            },
            hidden,
        ));
    }
    // one deletion vector file for every file that hides rows
    let masked: Vec<usize> = (0..added.len())
        .filter(|&i| !added[i].1.is_empty())
        .collect();
    if !masked.is_empty() {
        let vectors: Vec<RoaringTreemap> = masked.iter().map(|&i| added[i].1.clone()).collect();
        let descriptors = write_vectors(&published_store, &vectors).await?;
        for (i, descriptor) in masked.into_iter().zip(descriptors) {
            added[i].0.deletion_vector = Some(descriptor);
        }
    }
    actions.extend(added.into_iter().map(|(add, _)| Action::Add(add)));
    actions.extend(cdc.into_iter().map(|file| {
        Action::Cdc(AddCDCFile {
            path: published_path(&file.path),
            partition_values: Default::default(),
            ..file
        })
    }));
    let schema_changed = snapshot.schema().as_ref() != user_schema;
    if schema_changed {
        let metadata = snapshot
            .metadata()
            .clone()
            .with_schema(user_schema)
            .map_err(delta_err)?;
        actions.push(Action::Metadata(metadata));
    }
    // a state version without data (a flow definition) is published too,
    // empty, so that both tables count versions alike
    actions.push(Action::Txn(Transaction::new(STATE_APP_ID, version)));
    let operation = DeltaOperation::Write {
        mode: SaveMode::Append,
        partition_by: None,
        predicate: None,
    };
    let result = commit_builder()
        .with_actions(actions)
        .build(Some(snapshot), published.log_store(), operation)
        .await;
    match result {
        Ok(done) => Ok(Some(done.version())),
        Err(e) => Err(PublishError::Commit(DataFusionError::Execution(format!(
            "publishing the table's new state failed: {e}; the update itself is committed, and the next update or opening of the table publishes it"
        )))),
    }
}
