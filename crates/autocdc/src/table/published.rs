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
//! * the state files of visible rows only: the writer puts visible rows
//!   (live rows, versions) and hidden ones (tombstones, hidden events, the
//!   truncate watermark) in separate files and tags each `Add`
//!   ([`FileRows`]), so publishing reads no data file; a file the state store
//!   retired rows of (its deletion vector) is published with a vector hiding
//!   them. Files of an older writer may mix both: their `__cdc_kind` column
//!   is read and the hidden rows join the vector; a file with no visible row
//!   is left out;
//! * the state store's change data files as its own (`cdc` actions), so its
//!   change data feed is the flows' change feed. A version without change
//!   files (an update of a target without rows, a full refresh) lets Delta
//!   readers derive its changes from its files, as the protocol says.
//!
//! A table made without deletion vectors (`autocdc.deletion_vectors =
//! false`) has none in its published table either: its state store rewrites
//! files instead of retiring rows in them, so a visible file never has a row
//! to hide, and pyarrow-based readers read it.
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
use deltalake_core::kernel::transaction::CommitProperties;
use deltalake_core::kernel::{
    Action, Add, AddCDCFile, CommitInfo, DeletionVectorDescriptor, LogicalFileView, MetadataExt,
    StructType, Transaction,
};
use deltalake_core::logstore::get_actions;
use deltalake_core::parquet::arrow::arrow_reader::ArrowReaderOptions;
use deltalake_core::parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStore;
use roaring::RoaringTreemap;

use super::deletion_vectors::{read_vectors, write_vectors};
use super::file_tail::TailReader;
use super::properties::{CHANGE_DATA_FEED_PROPERTY, DELETION_VECTORS_PROPERTY};
use super::writer::FileRows;
use super::{commit_builder, delta_err, streaming_protocol, table_builder, takes_deletion_vectors};
use crate::fold::columns::{Kind, INTERNAL_PREFIX, KIND_COL};

/// Deletion vectors and files read at once while publishing a version.
const CONCURRENT_READS: usize = 16;

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
    /// The published table as [`publish`] last loaded it (shared by the
    /// clones of this location): the next publish reads only the commits
    /// made since, instead of the whole log again.
    last: Arc<tokio::sync::Mutex<Option<DeltaTable>>>,
    /// The last state version published from here, and the published
    /// version that published it: while the published table is still at
    /// that version, [`publish`] need not read its log for it.
    published: Arc<std::sync::Mutex<Option<(u64, i64)>>>,
}

impl PublishedLocation {
    /// The table at `url`, on `store`.
    pub fn new(url: url::Url, store: Arc<dyn ObjectStore>) -> Self {
        Self {
            url,
            store,
            last: Arc::default(),
            published: Arc::default(),
        }
    }

    /// The published table at its latest version, brought up to date from
    /// the last one loaded here when there is one (`NotATable`: not
    /// created yet).
    async fn latest(&self) -> std::result::Result<DeltaTable, DeltaTableError> {
        let mut last = self.last.lock().await;
        if let Some(table) = last.as_mut() {
            match table.update_incremental(None).await {
                Ok(()) => return Ok(table.clone()),
                // (its log was cleaned up since, say): load it afresh
                Err(_) => *last = None,
            }
        }
        let table = self
            .builder()
            .map_err(|e| DeltaTableError::Generic(e.to_string()))?
            .load()
            .await?;
        *last = Some(table.clone());
        Ok(table)
    }

    /// Forget the published table loaded here (the table at the path is
    /// another one: dropped and created again).
    pub async fn forget(&self) {
        *self.last.lock().await = None;
        if let Ok(mut published) = self.published.lock() {
            *published = None;
        }
    }

    /// The state version published from here by published version `at`,
    /// if that is the last publish made here.
    fn last_published(&self, at: u64) -> Option<i64> {
        let published = self.published.lock().ok()?;
        published
            .filter(|(version, _)| *version == at)
            .map(|(_, seen)| seen)
    }

    /// Published version `version` published state version `seen`.
    fn remember(&self, version: u64, seen: i64) {
        if let Ok(mut published) = self.published.lock() {
            *published = Some((version, seen));
        }
    }

    /// Fail when the published table has commits this crate did not make
    /// (another Delta writer wrote to the table at the path; see
    /// [`foreign_commits`]); nothing to check before it exists.
    pub async fn check_own(&self) -> Result<()> {
        let table = match self.latest().await {
            Ok(table) => table,
            Err(DeltaTableError::NotATable(_)) => return Ok(()),
            Err(e) => return Err(delta_err(e)),
        };
        let seen = self.seen(&table).await?;
        foreign_commits(&table, seen, &self.url).await
    }

    /// The last state version `table` (the published table, loaded here)
    /// published.
    async fn seen(&self, table: &DeltaTable) -> Result<i64> {
        if let Some(seen) = table.version().and_then(|at| self.last_published(at)) {
            return Ok(seen);
        }
        Ok(table
            .snapshot()
            .map_err(delta_err)?
            .transaction_version(table.log_store().as_ref(), STATE_APP_ID)
            .await
            .map_err(delta_err)?
            .unwrap_or(0))
    }

    /// A builder of the published table.
    pub fn builder(&self) -> Result<DeltaTableBuilder> {
        table_builder(self.url.clone(), Arc::clone(&self.store))
    }

    /// The published table at its latest version (`None`: not created yet).
    pub async fn load(&self) -> Result<Option<DeltaTable>> {
        match self.builder()?.load().await {
            Ok(table) => Ok(Some(table)),
            Err(DeltaTableError::NotATable(_)) => Ok(None),
            Err(e) => Err(delta_err(e)),
        }
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
        let table = match published.latest().await {
            Ok(table) => table,
            Err(DeltaTableError::NotATable(_)) => {
                if user_schema.fields().count() == 0 {
                    // no column yet (the first flow fixes them): no table yet
                    return Ok(None);
                }
                // version 0 stands for the state store's version 0 (the
                // CREATE), with the columns known now; the state versions
                // after it follow one by one
                let snapshot = state.snapshot().map_err(delta_err)?;
                let vectors = takes_deletion_vectors(snapshot);
                let configuration = snapshot.metadata().configuration();
                let comment = declared_comment(configuration);
                // the Delta properties declared (log retention, checkpoint
                // interval, ...): what Delta readers and writers of the
                // table at the path follow
                let declared: Vec<(String, Option<String>)> = configuration
                    .iter()
                    .filter(|(k, _)| {
                        k.starts_with("delta.")
                            && k.as_str() != CHANGE_DATA_FEED_PROPERTY
                            && k.as_str() != DELETION_VECTORS_PROPERTY
                    })
                    .map(|(k, v)| (k.clone(), Some(v.clone())))
                    .collect();
                let table = create(
                    published.builder()?,
                    &user_schema,
                    vectors,
                    comment,
                    declared,
                );
                match table.await {
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
        let seen = published.seen(&table).await?;
        // (publishing on top would number its versions apart from the
        // state store's and keep rows no reader of ours sees)
        foreign_commits(&table, seen, &published.url).await?;
        if seen >= state_version {
            return Ok(last);
        }
        // one published commit per state version: the published table's
        // versions are the state store's
        let outcome = commit(state, &table, seen + 1, &user_schema).await;
        if let Ok(Some(version)) = &outcome {
            published.remember(*version, seen + 1);
        }
        match outcome {
            // the last version published: nothing to load again
            Ok(version) if seen + 1 >= state_version => return Ok(version.or(last)),
            Ok(version) => {
                last = version;
                attempts = 0;
            }
            Err(PublishError::Commit(_)) if attempts < 2 => attempts += 1,
            Err(PublishError::Commit(e)) | Err(PublishError::Other(e)) => return Err(e),
        }
    }
}

/// Fail when `table`, the published table, is past version `seen`, the
/// last state version it published: every commit of ours publishes one
/// state version as the version of that number, so a later version is
/// another writer's (a Delta tool appending to or deleting from the table
/// at the path). Its rows would be seen by Delta readers and never by
/// ours, and the versions of the two would part; nothing is committed on
/// top of it.
async fn foreign_commits(table: &DeltaTable, seen: i64, url: &url::Url) -> Result<()> {
    let Some(at) = table.version().map(|v| v as i64) else {
        return Ok(());
    };
    if at <= seen {
        return Ok(());
    }
    let first = seen + 1;
    let operations: Vec<String> = table
        .history(Some((at - seen) as usize))
        .filter_map(|info| async move { info.ok()?.operation })
        .collect::<Vec<_>>()
        .await;
    let versions = if first == at {
        format!("version {at}")
    } else {
        format!("versions {first} to {at}")
    };
    let files = if first == at {
        format!("the commit file _delta_log/{first:020}.json")
    } else {
        format!("the commit files _delta_log/{first:020}.json to {at:020}.json")
    };
    // (a checkpoint the other writer made of those versions would load
    // them still)
    let files = format!(
        "{files} (with any checkpoint of those versions, \
         _delta_log/<version>.checkpoint.parquet, and then _delta_log/_last_checkpoint)"
    );
    let what = if operations.is_empty() {
        String::new()
    } else {
        format!(" ({})", operations.join(", "))
    };
    Err(DataFusionError::Execution(format!(
        "the Delta table at {url} has {versions}{what}, which another Delta writer committed: \
         a streaming table is written through autocdc only (its rows live in its state store, \
         and what Delta readers see is derived from it), so it is neither read nor written \
         here until they are undone; nothing was changed. Remove {files} to undo them, \
         or DROP STREAMING TABLE and define it anew"
    )))
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

/// Create the published table (no file yet), with deletion vectors when
/// its state store takes them: without, the state store rewrites files
/// instead of hiding rows in them, and so the published table never needs
/// to hide a row (readers without deletion vectors can read it).
async fn create(
    published: DeltaTableBuilder,
    schema: &StructType,
    deletion_vectors: bool,
    comment: Option<String>,
    declared: Vec<(String, Option<String>)>,
) -> Result<DeltaTable> {
    let table = published.build().map_err(delta_err)?;
    let mut create = table.create();
    if let Some(comment) = comment {
        create = create.with_comment(comment);
    }
    create
        .with_columns(schema.fields().cloned())
        .with_actions([Action::Protocol(streaming_protocol(deletion_vectors)?)])
        .with_configuration([
            (
                CHANGE_DATA_FEED_PROPERTY.to_string(),
                Some("true".to_string()),
            ),
            (
                DELETION_VECTORS_PROPERTY.to_string(),
                Some(deletion_vectors.to_string()),
            ),
        ])
        .with_configuration(declared)
        .with_raise_if_key_not_exists(false)
        // (one another publisher creates meanwhile fails this one, which
        // then reads it, rather than being replaced by it)
        .with_commit_properties(CommitProperties::default().with_max_retries(0))
        .await
        .map_err(delta_err)
}

/// The `COMMENT` the table was declared with (its state store's
/// declaration, [`super::properties::TABLE_KEY`]).
fn declared_comment(configuration: &std::collections::HashMap<String, String>) -> Option<String> {
    let decl: super::meta::TableDecl =
        serde_json::from_str(configuration.get(super::properties::TABLE_KEY)?).ok()?;
    decl.comment
}

/// What one state version did.
struct StateVersion {
    /// Each state file's last `add` (`None`: removed).
    files: BTreeMap<String, Option<Add>>,
    /// Its change data files.
    cdc: Vec<AddCDCFile>,
    /// Its commit information (the event log's entry).
    info: Option<CommitInfo>,
}

/// What the state version `version` did.
async fn state_changes(state: &DeltaTable, version: i64) -> Result<StateVersion> {
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
    let mut info = None;
    for action in get_actions(version, &bytes).map_err(delta_err)? {
        match action {
            Action::Add(add) => {
                files.insert(add.path.clone(), Some(add));
            }
            Action::Remove(remove) => {
                files.insert(remove.path, None);
            }
            Action::Cdc(file) => cdc.push(file),
            Action::CommitInfo(commit) => info = Some(commit),
            _ => {}
        }
    }
    Ok(StateVersion { files, cdc, info })
}

/// Positions of the rows of a state file that are not visible, and its
/// number of rows.
async fn hidden_rows(store: &Arc<dyn ObjectStore>, add: &Add) -> Result<(RoaringTreemap, u64)> {
    let path = Path::from_url_path(&add.path).map_err(delta_err)?;
    // (a state file just written: small, read with one request)
    let reader = TailReader::new(store, &path, add.size.max(0) as u64);
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
            .and_then(|c| c.as_primitive_opt::<Int8Type>())
            .ok_or_else(|| {
                DataFusionError::Execution(format!(
                    "state file '{path}' has no {KIND_COL} column of 8-bit integers"
                ))
            })?;
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

/// Number of rows of a file, from its statistics.
fn num_records(add: &Add) -> Option<u64> {
    let stats: serde_json::Value = serde_json::from_str(add.stats.as_deref()?).ok()?;
    stats.get("numRecords")?.as_u64()
}

/// The rows of a state file the published table hides, and the file's
/// number of rows; `None` when none of its rows is visible.
///
/// Tagged files ([`FileRows`]) are not read: a visible file hides what the
/// state store retired from it, a hidden file is not published. A file of
/// an older version of the writer may hold both kinds: its kinds are read,
/// or, when it is published already, its vector grows by what the state
/// store retired (the state's vector only ever grows).
async fn hidden_of(
    state_store: &Arc<dyn ObjectStore>,
    add: &Add,
    vectors: Vectors,
    published: Option<&LogicalFileView>,
) -> Result<Option<(RoaringTreemap, u64)>> {
    let (hidden, rows) = match (FileRows::of(add), num_records(add)) {
        (Some(FileRows::Hidden), _) => return Ok(None),
        (Some(FileRows::Visible), Some(rows)) => (vectors.retired.unwrap_or_default(), rows),
        _ => match (vectors.retired, published) {
            (Some(mut retired), Some(view)) => {
                if let Some(old) = vectors.old {
                    retired |= old;
                }
                match view.num_records() {
                    Some(rows) => (retired, rows as u64),
                    None => {
                        let (kinds, rows) = hidden_rows(state_store, add).await?;
                        (retired | kinds, rows)
                    }
                }
            }
            // a file not published now (a RESTORE adds back one removed
            // since) shows what its kinds and the state's vector leave
            (Some(retired), None) => {
                let (kinds, rows) = hidden_rows(state_store, add).await?;
                (retired | kinds, rows)
            }
            (None, _) => hidden_rows(state_store, add).await?,
        },
    };
    Ok((hidden.len() < rows).then_some((hidden, rows)))
}

/// The deletion vectors [`hidden_of`] needs for one added file, read
/// beforehand with those of the other files.
struct Vectors {
    /// The state store's vector of the file.
    retired: Option<RoaringTreemap>,
    /// The published vector of the file ([`old_vector`]).
    old: Option<RoaringTreemap>,
}

/// The published vector [`hidden_of`] adds to an untagged file's retired
/// rows: that of its published version, when the state retired rows of it.
fn old_vector(add: &Add, published: Option<&LogicalFileView>) -> Option<DeletionVectorDescriptor> {
    match (FileRows::of(add), num_records(add)) {
        (Some(FileRows::Hidden), _) | (Some(FileRows::Visible), Some(_)) => None,
        _ => add
            .deletion_vector
            .as_ref()
            .and(published)
            .and_then(LogicalFileView::deletion_vector_descriptor),
    }
}

/// Commit the effect of the state version `version` on the published table.
async fn commit(
    state: &DeltaTable,
    published: &DeltaTable,
    version: i64,
    user_schema: &StructType,
) -> std::result::Result<Option<u64>, PublishError> {
    let StateVersion { files, cdc, info } = state_changes(state, version).await?;
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
    let mut removed = Vec::new();
    let mut adds = Vec::new();
    for (path, add) in files {
        let target = published_path(&path);
        let view = current.get(&target);
        if let Some(view) = view {
            removed.push(view.remove_action(true));
        }
        if let Some(add) = add {
            adds.push((target, add, view.cloned()));
        }
    }
    // what each added file hides: the state's vectors of the files read
    // together (one request per vector file), then the rest concurrently
    // (a hidden file is not published: its vector is not needed)
    let vector = |add: &Add| match FileRows::of(add) {
        Some(FileRows::Hidden) => None,
        _ => add.deletion_vector.clone(),
    };
    let descriptors: Vec<_> = adds.iter().filter_map(|(_, add, _)| vector(add)).collect();
    let mut vectors = read_vectors(&state_store, &descriptors).await?.into_iter();
    let olds: Vec<_> = adds
        .iter()
        .filter_map(|(_, add, view)| old_vector(add, view.as_ref()))
        .collect();
    let mut old_vectors = read_vectors(&published_store, &olds).await?.into_iter();
    let adds: Vec<_> = adds
        .into_iter()
        .map(|(target, add, view)| {
            let retired = vector(&add).and_then(|_| vectors.next());
            let old = old_vector(&add, view.as_ref()).and_then(|_| old_vectors.next());
            (target, add, view, Vectors { retired, old })
        })
        .collect();
    let mut added: Vec<(Add, RoaringTreemap)> = futures::stream::iter(adds)
        .map(|(target, add, view, vectors)| {
            let state_store = Arc::clone(&state_store);
            async move {
                let hidden = hidden_of(&state_store, &add, vectors, view.as_ref()).await?;
                Ok::<_, DataFusionError>(hidden.map(|(hidden, rows)| {
                    let add = Add {
                        path: target,
                        partition_values: Default::default(),
                        size: add.size,
                        modification_time: add.modification_time,
                        data_change: true,
                        stats: Some(format!("{{\"numRecords\":{rows}}}")),
                        ..Default::default()
                    };
                    (add, hidden)
                }))
            }
        })
        .buffered(CONCURRENT_READS)
        .try_filter_map(|added| futures::future::ready(Ok(added)))
        .try_collect()
        .await?;
    // Without change files, Delta readers derive a version's changes from
    // its files: right for a version that only adds files (an update of a
    // target without rows) or only removes them (a full refresh); a version
    // doing both without a change file changed hidden rows only (a bucket
    // rewritten for a tombstone), so its files are no change.
    if cdc.is_empty() && !removed.is_empty() && !added.is_empty() {
        removed.iter_mut().for_each(|r| r.data_change = false);
        added.iter_mut().for_each(|(a, _)| a.data_change = false);
    }
    let takes_vectors = takes_deletion_vectors(snapshot);
    if let Some((add, _)) = added.iter().find(|(_, h)| !h.is_empty() && !takes_vectors) {
        return Err(PublishError::Other(DataFusionError::Execution(format!(
            "state file '{}' has rows to hide, but the published table was created without deletion vectors; REFRESH the table FULL to rewrite its files",
            add.path
        ))));
    }
    // the state commit's operation and metrics, for readers of the history
    let mut actions: Vec<Action> = info
        .filter(|info| info.operation.is_some())
        .map(|info| {
            Action::CommitInfo(CommitInfo {
                timestamp: Some(chrono::Utc::now().timestamp_millis()),
                operation: info.operation,
                operation_parameters: info.operation_parameters,
                engine_info: info.engine_info,
                info: info
                    .info
                    .into_iter()
                    .filter(|(key, _)| key == "operationMetrics")
                    .collect(),
                ..Default::default()
            })
        })
        .into_iter()
        .collect();
    actions.extend(removed.into_iter().map(Action::Remove));
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
            "publishing the table's new state failed: {}; the update itself is committed, and the next update or opening of the table publishes it",
            super::commit::commit_error_text(&e)
        )))),
    }
}
