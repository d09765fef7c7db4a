//! Writing and committing one update of a streaming table.
//!
//! [`write_rows`] streams the fold's output into bucketed Parquet data files
//! and `_change_data/` files (nothing is committed yet); [`commit_written`]
//! then makes the one Delta commit of the update: removal of the files of the
//! buckets it rewrote (or deletion vectors marking the rows it replaced), the
//! new data and change files, the flow's metadata and its checkpoint (a `txn`
//! action), all or nothing.
//!
//! ```text
//!  fold output ──► route by bucket ──► writer tasks (Parquet, one file series per bucket)
//!                        │                         │ adds, change files
//!                        ▼                         ▼
//!                 change rows ─────────► commit: remove ∪ DV ∪ add ∪ cdc ∪ metadata ∪ txn
//! ```

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, AsArray, BooleanArray, Int32Array, RecordBatch, StringArray};
use arrow::compute::{filter, filter_record_batch};
use arrow::datatypes::{Field, Int32Type, Int8Type, Schema, SchemaRef};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::cache::cache_manager::FileMetadataCache;
use datafusion::execution::SendableRecordBatchStream;
use datafusion_common_runtime::SpawnedTask;
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake_core::kernel::{Action, Add, AddCDCFile, MetadataExt, Remove, Transaction};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use futures::StreamExt;

use super::bucket::{bucket_array, WATERMARK_BUCKET};
use super::event::{CommitEvent, Operation};
pub(crate) use super::files::{bucket_of, data_files};
pub use super::meta::MetadataChange;
use super::properties::checkpoint_app_id;
use super::reject_sink::{write_pending, RejectSink};
use super::stage::{Replacement, UpdateStage};
use super::superseded::Superseded;
use super::writer::{group_by_bucket, BucketWriter, FileCompression, FileRows};
use super::{delta_err, ScdTable, TableName};
use crate::error::CdcError;
use crate::fold::columns::{change_type_name, Kind, CHANGE_INSERT, KIND_COL};
use crate::fold::FoldCounts;
use crate::spec::expectations::ExpectationCounts;
use crate::spec::FlowSpec;

/// Column of the change data feed files holding the change type.
pub const CHANGE_TYPE_COL: &str = "_change_type";

/// Schema of the change data feed files: the data file columns (the fold
/// output; readers expect every table column) plus `_change_type`.
fn change_data_schema(output: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = output.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(
        CHANGE_TYPE_COL,
        arrow::datatypes::DataType::Utf8,
        false,
    ));
    Arc::new(Schema::new(fields))
}

/// Change data feed rows of the fold output in the change file layout.
fn change_data_batch(rows: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let kinds = rows
        .column(rows.schema().index_of(KIND_COL)?)
        .as_primitive::<Int8Type>();
    let change_types: StringArray = kinds
        .values()
        .iter()
        .map(|k| change_type_name(*k))
        .collect();
    let mut columns: Vec<ArrayRef> = rows.columns().to_vec();
    columns.push(Arc::new(change_types));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Everything the commit of one flow run needs.
#[derive(Debug)]
pub struct CommitRequest {
    /// Target name.
    pub target: TableName,
    /// Target table.
    pub table: Arc<ScdTable>,
    /// The flow being run.
    pub flow: FlowSpec,
    /// Changes of the table's metadata (flow definition, schema,
    /// checkpoints of sources) committed with the update.
    pub metadata: Vec<MetadataChange>,
    /// Checkpoint: the flow's run number recorded as a Delta `txn` action.
    pub run: i64,
    /// The stored rows the update replaces.
    pub replaces: Replaces,
    /// What the update is, for the event log.
    pub operation: Operation,
    /// When the update was planned.
    pub started: Instant,
    /// The counts of the target's expectations on the update's rows.
    pub expectations: Option<Arc<ExpectationCounts>>,
    /// The pipeline update it belongs to (taken when it was planned).
    pub update_id: Option<String>,
    /// When the newest of what it read arrived (ms since the epoch).
    pub newest_input_ms: Option<i64>,
    /// Where the run's rejected events are (a target with rejects on).
    pub rejects: Option<Arc<RejectSink>>,
    /// The update carries a full refresh's clear: every data file of the
    /// table goes, whatever the update writes; its change feed is what
    /// changed between the rows of those files and of the files it writes
    /// (`CdcCommitExec` computes it, and its counts).
    pub clears: bool,
}

/// What of the stored rows an update replaces.
#[derive(Debug, Clone)]
pub enum Replaces {
    /// Every stored row (it read them all).
    All,
    /// None (it only adds rows).
    Nothing,
    /// What its stage chose when it ran ([`crate::table::stage`]).
    Staged(Arc<UpdateStage>),
}

/// The files one update wrote (nothing committed yet): what
/// `CdcWriteExec` reports to `CdcCommitExec` in its manifest.
#[derive(Debug, Clone, Default)]
pub struct WrittenFiles {
    /// New data files (state rows, bucketed).
    pub adds: Vec<deltalake_core::kernel::Add>,
    /// New change data feed files.
    pub change_files: Vec<deltalake_core::kernel::Add>,
}

/// Result of a commit.
#[derive(Debug, Clone, Copy)]
pub struct CommitOutcome {
    /// Delta version committed.
    pub version: i64,
    /// Data files added.
    pub files_added: usize,
    /// Data files removed (rewritten buckets).
    pub files_removed: usize,
}

/// Commit the files an update wrote atomically with the request's metadata
/// and checkpoint. `changed`: whether the fold changed the stored state (or
/// raised the truncate watermark); when it did not, the written files are
/// deleted and only the checkpoint (and metadata) is committed.
pub async fn commit_written(
    request: &CommitRequest,
    written: WrittenFiles,
    changed: bool,
    counts: &FoldCounts,
) -> Result<CommitOutcome> {
    let table = request.table.delta();
    let store = table.object_store();
    let WrittenFiles { adds, change_files } = written;

    let snapshot = table.snapshot().map_err(delta_err)?;
    let log_store = table.log_store();
    let mut event = CommitEvent::new(request.operation, Some(&request.flow.name), request.started);
    event.upserted = counts.upserted as u64;
    event.deleted = counts.deleted as u64;
    event.input = counts.input_rows as u64;
    event.late = counts.late as u64;
    event.expectations = request.expectations.as_ref().map(|e| e.to_json());
    event.update_id = request.update_id.clone();
    event.newest_input_ms = request.newest_input_ms;
    let mut metadata = request.metadata.clone();
    // the rejected events, in a file the commit names (delivered after it)
    // (a full refresh reads every flow's sources again: the one clearing
    // the table, and each other flow it marked, until that one commits)
    // (and a restore rewinds its append flows to its version, until each
    // commits)
    let meta = request.table.meta();
    let read_again = if request.clears || meta.full_refresh_pending().contains(&request.flow.name) {
        Some(None)
    } else {
        meta.read_again_after_restore(&request.flow.name).map(Some)
    };
    let pending = match &request.rejects {
        Some(sink) => write_pending(&store, sink, read_again).await?,
        None => None,
    };
    if let Some(pending) = &pending {
        event.rejects = Some(pending.id.clone());
        event.rejected = pending.rows as u64;
        metadata.push(pending.property()?);
    }
    let mut actions = vec![event.action()];
    let mut files_removed = 0;
    let (all, nothing) = (
        Replacement::default(),
        Replacement {
            touched: Some(Vec::new()),
            ..Default::default()
        },
    );
    let replacement = match &request.replaces {
        Replaces::All => &all,
        Replaces::Nothing => &nothing,
        Replaces::Staged(stage) => stage.replacement().ok_or_else(|| {
            DataFusionError::Internal(format!(
                "flow '{}': the update's stage did not run; nothing was committed",
                request.flow.name
            ))
        })?,
    };
    // a widened column is rewritten in every file even when the events
    // change no row: the new schema is committed with files of its types
    // (and a full refresh's clear removes every file)
    let changed = changed
        || request.clears
        || matches!(&request.replaces, Replaces::Staged(stage) if stage.rewrites_all());
    if changed {
        // replace exactly the buckets this update read
        let views = data_files(&table).await?;
        for view in &views {
            let bucket = bucket_of(view);
            let rewritten = match (&replacement.touched, bucket) {
                (None, _) | (_, None) => true,
                (Some(touched), Some(b)) => b == WATERMARK_BUCKET || touched.contains(&b),
            };
            // with deletion vectors, the files of the touched buckets stay,
            // less the stored rows of the update's keys
            let kept = replacement.superseded.is_some()
                && bucket
                    .is_none_or(|b| b != WATERMARK_BUCKET && !replacement.compacted.contains(&b));
            if rewritten && !kept {
                actions.push(Action::Remove(view.remove_action(true)));
                files_removed += 1;
            }
        }
        if let Some(superseded) = &replacement.superseded {
            let retired = superseded.retire(&store, &views).await.map_err(|e| {
                e.context(format!(
                    "flow '{}': marking the replaced rows of '{}'; nothing of this update was committed",
                    request.flow.name, request.target
                ))
            })?;
            actions.extend(retired);
        }
        actions.extend(adds.iter().cloned().map(Action::Add));
        actions.extend(change_files.into_iter().map(change_file_action));
    } else {
        // nothing changed: keep the current files, discard the rewritten ones
        BucketWriter::discard(&store, &adds).await?;
        BucketWriter::discard(&store, &change_files).await?;
    }
    if !metadata.is_empty() {
        actions.push(Action::Metadata(changed_metadata(
            snapshot.metadata(),
            &metadata,
        )?));
    }
    let run = (checkpoint_app_id(&request.flow.name), request.run);
    actions.push(Action::Txn(Transaction::new(run.0.clone(), run.1)));
    let built_on = snapshot.version();
    let operation = DeltaOperation::Write {
        mode: SaveMode::Overwrite,
        partition_by: None,
        predicate: None,
    };
    request.table.check_published().await?;
    let commit = super::commit_builder()
        .with_actions(actions)
        .build(Some(snapshot), log_store, operation)
        .await
        .map_err(|e| CdcError::CommitFailed {
            flow: request.flow.name.clone(),
            target: request.target.to_string(),
            conflict: lost_a_race(&e),
            cause: commit_error_text(&e),
        })?;
    request.table.committed(commit.snapshot()).await?;
    request
        .table
        .committed_runs(built_on, commit.version(), std::slice::from_ref(&run));
    request.table.publish().await?;
    Ok(CommitOutcome {
        version: commit.version() as i64,
        files_added: if changed { adds.len() } else { 0 },
        files_removed,
    })
}

/// Commit `event` alone (no data, no checkpoint moves) to `table`'s state
/// store: an event-log entry such as a skipped snapshot version. Returns
/// the version committed.
pub(crate) async fn commit_event(table: &ScdTable, event: CommitEvent) -> Result<i64> {
    Edit::new(EditKind::Update).event(event).commit(table).await
}

/// What an [`Edit`] replaces of the stored rows.
#[derive(Debug)]
pub(crate) enum Replaced {
    /// Nothing: the edit adds rows, or only metadata.
    Nothing,
    /// Every data file of the loaded version.
    All,
    /// These data files (their `remove` actions, deletion vectors included).
    Files(Vec<Remove>),
    /// What a DML statement's rows operator retired ([`Retired`]).
    Retired(Retired),
}

/// The actions retiring the stored rows a DML statement replaces, made
/// before its commit (deletion vectors written, nothing committed): what
/// its rows operator reports to the commit through the manifest
/// ([`super::manifest`]).
#[derive(Debug, Clone, Default)]
pub struct Retired(pub(crate) Vec<Action>);

impl Retired {
    /// The rows `superseded` found, marked with deletion vectors (files
    /// left without rows removed).
    pub(crate) async fn rows(table: &ScdTable, superseded: &Superseded) -> Result<Self> {
        let delta = table.delta();
        let current = data_files(&delta).await?;
        Ok(Self(
            superseded.retire(&delta.object_store(), &current).await?,
        ))
    }

    /// Every data file of the table's loaded version (a rewrite).
    pub(crate) async fn all(table: &ScdTable) -> Result<Self> {
        Ok(Self(remove_all(&table.delta()).await?))
    }

    /// Files removed, whole or for a new deletion vector.
    pub fn files(&self) -> usize {
        self.0
            .iter()
            .filter(|a| matches!(a, Action::Remove(_)))
            .count()
    }
}

/// What a DML statement's rows operator found, for its writer: the
/// statement's counts and the rows it retires. Filled when its rows are
/// done ([`OutcomeSlot`]).
#[derive(Debug, Default)]
pub struct StatementOutcome {
    /// Rows inserted or updated (`upserted`) and deleted (`deleted`).
    pub counts: FoldCounts,
    /// The stored rows replaced.
    pub retired: Retired,
}

/// Where a statement's rows operator leaves its [`StatementOutcome`] for
/// the writer of those rows (both are planned together).
pub type OutcomeSlot = Arc<std::sync::Mutex<Option<StatementOutcome>>>;

/// The commit of a DML statement: its written files and retired rows (the
/// manifest), its event, recorded as its kind of Delta operation.
#[derive(Debug)]
pub struct StatementCommit {
    /// Target table.
    pub table: Arc<ScdTable>,
    /// `UPDATE`, `DELETE`, `INSERT` or `MERGE` (for plans and messages).
    pub statement: &'static str,
    kind: EditKind,
    operation: Operation,
}

impl StatementCommit {
    /// The commit of `statement` on `table`.
    pub(crate) fn new(
        table: Arc<ScdTable>,
        statement: &'static str,
        kind: EditKind,
        operation: Operation,
    ) -> Self {
        Self {
            table,
            statement,
            kind,
            operation,
        }
    }

    /// Commit what the manifest says: the files written, the rows retired,
    /// an event with the statement's counts. Returns the version.
    pub(crate) async fn commit(
        &self,
        written: WrittenFiles,
        retired: Retired,
        counts: &FoldCounts,
        started: Instant,
    ) -> Result<i64> {
        let mut event = CommitEvent::new(self.operation, None, started);
        event.upserted = counts.upserted as u64;
        event.deleted = counts.deleted as u64;
        Edit::new(self.kind)
            .event(event)
            .written(written)
            .replacing(Replaced::Retired(retired))
            .commit(&self.table)
            .await
    }
}

/// The kind of Delta operation an [`Edit`] is recorded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EditKind {
    /// Rows replaced (`INSERT`, `MERGE` on a keyed target).
    Overwrite,
    /// `UPDATE`.
    Update,
    /// `DELETE`, a full refresh.
    Delete,
    /// Properties only (a flow definition).
    SetProperties,
    /// `RESTORE` to an older version.
    Restore {
        /// The version restored.
        version: u64,
    },
}

impl EditKind {
    fn operation(self) -> DeltaOperation {
        let write = |mode| DeltaOperation::Write {
            mode,
            partition_by: None,
            predicate: None,
        };
        match self {
            Self::Overwrite => write(SaveMode::Overwrite),
            Self::Update => DeltaOperation::Update { predicate: None },
            Self::Delete => DeltaOperation::Delete { predicate: None },
            Self::SetProperties => DeltaOperation::SetTableProperties {
                properties: Default::default(),
            },
            Self::Restore { version } => DeltaOperation::Restore {
                version: Some(version as _),
                datetime: None,
            },
        }
    }
}

/// One commit of a table other than a flow run's ([`commit_written`]): a
/// DML statement's rows, a full refresh, a flow definition, an event.
/// Everything in it is committed at once or not at all.
#[derive(Debug)]
pub(crate) struct Edit {
    kind: EditKind,
    event: Option<CommitEvent>,
    written: WrittenFiles,
    replaced: Replaced,
    metadata: Vec<MetadataChange>,
}

impl Edit {
    /// An edit recorded as `kind`, with nothing in it yet.
    pub(crate) fn new(kind: EditKind) -> Self {
        Self {
            kind,
            event: None,
            written: WrittenFiles::default(),
            replaced: Replaced::Nothing,
            metadata: Vec::new(),
        }
    }

    /// Log `event` with it.
    pub(crate) fn event(self, event: CommitEvent) -> Self {
        Self {
            event: Some(event),
            ..self
        }
    }

    /// Commit the files `written`.
    pub(crate) fn written(self, written: WrittenFiles) -> Self {
        Self { written, ..self }
    }

    /// Retire `replaced` of the stored rows.
    pub(crate) fn replacing(self, replaced: Replaced) -> Self {
        Self { replaced, ..self }
    }

    /// Change the table's metadata.
    pub(crate) fn metadata(mut self, change: MetadataChange) -> Self {
        self.metadata.push(change);
        self
    }

    /// Make the commit; returns the version committed. On failure nothing
    /// is committed (files written for it are orphans `VACUUM` removes).
    pub(crate) async fn commit(self, table: &ScdTable) -> Result<i64> {
        let delta = table.delta();
        let snapshot = delta.snapshot().map_err(delta_err)?;
        let log_store = delta.log_store();
        // the published table follows changes of rows or of metadata
        let publish = self.kind != EditKind::SetProperties
            && (!self.written.adds.is_empty()
                || !matches!(self.replaced, Replaced::Nothing)
                || !self.metadata.is_empty());
        let mut actions: Vec<Action> = self.event.iter().map(CommitEvent::action).collect();
        match self.replaced {
            Replaced::Nothing => {}
            Replaced::All => actions.extend(remove_all(&delta).await?),
            Replaced::Files(files) => actions.extend(files.into_iter().map(Action::Remove)),
            Replaced::Retired(retired) => actions.extend(retired.0),
        }
        let WrittenFiles { adds, change_files } = self.written;
        actions.extend(adds.into_iter().map(Action::Add));
        actions.extend(change_files.into_iter().map(change_file_action));
        if !self.metadata.is_empty() {
            actions.push(Action::Metadata(changed_metadata(
                snapshot.metadata(),
                &self.metadata,
            )?));
        }
        let built_on = snapshot.version();
        table.check_published().await?;
        let commit = super::commit_builder()
            .with_actions(actions)
            .build(Some(snapshot), log_store, self.kind.operation())
            .await
            .map_err(|e| {
                DataFusionError::Execution(format!(
                    "commit to '{}' failed: {}; nothing of this statement was committed{}",
                    table.name(),
                    commit_error_text(&e),
                    match lost_a_race(&e) {
                        true => " (another writer committed first): run it again",
                        false => "",
                    }
                ))
            })?;
        table.committed(commit.snapshot()).await?;
        table.committed_runs(built_on, commit.version(), &[]);
        if publish {
            table.publish().await?;
        }
        Ok(commit.version() as i64)
    }
}

/// `current` with `changes` made, in order.
fn changed_metadata(
    current: &deltalake_core::kernel::Metadata,
    changes: &[MetadataChange],
) -> Result<deltalake_core::kernel::Metadata> {
    let mut metadata = current.clone();
    for change in changes {
        metadata = match change {
            MetadataChange::Set(key, value) => metadata
                .add_config_key(key.clone(), value.clone())
                .map_err(delta_err)?,
            MetadataChange::Remove(keys) => keys
                .iter()
                .filter(|k| metadata.configuration().contains_key(k.as_str()))
                .cloned()
                .collect::<Vec<_>>()
                .into_iter()
                .try_fold(metadata, |m, name| {
                    m.remove_config_key(&name).map_err(delta_err)
                })?,
            MetadataChange::RemovePrefixed(prefixes) => {
                let names: Vec<String> = metadata
                    .configuration()
                    .keys()
                    .filter(|k| prefixes.iter().any(|p| k.starts_with(p.as_str())))
                    .cloned()
                    .collect();
                names.into_iter().try_fold(metadata, |m, name| {
                    m.remove_config_key(&name).map_err(delta_err)
                })?
            }
            MetadataChange::Schema(schema) => {
                let kernel: deltalake_core::kernel::StructType =
                    schema.as_ref().try_into_kernel().map_err(delta_err)?;
                metadata.with_schema(&kernel).map_err(delta_err)?
            }
        };
    }
    Ok(metadata)
}

/// The `cdc` action committing a change data file the writer wrote.
pub(crate) fn change_file_action(file: Add) -> Action {
    Action::Cdc(AddCDCFile {
        path: file.path,
        size: file.size,
        partition_values: file.partition_values,
        data_change: false,
        tags: None,
    })
}

/// `Remove` actions of every data file of `table`'s loaded version.
pub(crate) async fn remove_all(table: &deltalake_core::DeltaTable) -> Result<Vec<Action>> {
    Ok(data_files(table)
        .await?
        .into_iter()
        .map(|v| Action::Remove(v.remove_action(true)))
        .collect())
}

/// How an update's change data feed reaches its readers.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, serde::Serialize, serde::Deserialize,
)]
pub enum ChangeFeed {
    /// In `_change_data/` files, one row per change.
    Files,
    /// Derived by readers from the update's new files, as Delta does when
    /// a commit has no change files: for an update of a target without
    /// rows, whose changes can only be inserts of the visible rows it
    /// writes, so no change file is written.
    FromAdds,
}

/// How [`write_rows`] writes its files.
#[derive(Clone)]
pub struct FileWriting {
    /// The table's codec.
    pub compression: FileCompression,
    /// Writer tasks.
    pub tasks: usize,
    /// The session's file metadata cache, given what later probes need of
    /// each data file written ([`super::probe_index`]); `None`: not kept.
    pub index_cache: Option<Arc<FileMetadataCache>>,
}

impl std::fmt::Debug for FileWriting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriting")
            .field("compression", &self.compression)
            .field("tasks", &self.tasks)
            .field("index_cache", &self.index_cache.is_some())
            .finish()
    }
}

/// Write the rows of a new state into bucketed data files and its change data
/// feed rows (kinds ≥ `CHANGE_INSERT`) into `_change_data/` files; returns
/// both file lists (nothing is committed). Visible and hidden state rows go
/// to different files ([`FileRows`]); a truncate watermark row goes to the
/// watermark bucket.
///
/// Encoding and compressing Parquet is most of the work, so it runs on
/// `writing.tasks` tasks, each owning the files of the buckets `b` with
/// `b % tasks` equal to its number (one file series per bucket, as with a
/// single writer); this task only computes buckets and routes rows.
pub async fn write_rows(
    store: &Arc<dyn object_store::ObjectStore>,
    mut input: SendableRecordBatchStream,
    key_indices: &[usize],
    bucket_count: i32,
    writing: FileWriting,
    change_feed: ChangeFeed,
) -> Result<WrittenFiles> {
    let schema = input.schema();
    let change_schema = change_data_schema(&schema);
    let kind_index = schema.index_of(KIND_COL)?;
    let writers = writing.tasks.max(1);
    let (mut routes, mut tasks) = (Vec::with_capacity(writers), Vec::with_capacity(writers));
    for _ in 0..writers {
        let (route, rows) = tokio::sync::mpsc::channel(2);
        routes.push(route);
        tasks.push(SpawnedTask::spawn(write_routed(
            Arc::clone(store),
            Arc::clone(&schema),
            Arc::clone(&change_schema),
            key_indices.to_vec(),
            writing.clone(),
            rows,
        )));
    }
    let routed = async {
        while let Some(batch) = input.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let keys: Vec<ArrayRef> = key_indices
                .iter()
                .map(|&i| Arc::clone(batch.column(i)))
                .collect();
            let buckets = bucket_array(&keys, batch.num_rows(), bucket_count)?;
            let kinds = batch.column(kind_index).as_primitive::<Int8Type>();
            let buckets: Int32Array = buckets
                .values()
                .iter()
                .zip(kinds.values().iter())
                .map(|(b, k)| {
                    if *k == Kind::Truncate as i8 {
                        WATERMARK_BUCKET
                    } else {
                        *b
                    }
                })
                .collect();
            // visible state rows, hidden state rows and change data feed
            // rows go to different files
            let visible = BooleanArray::from_unary(kinds, |k| k == Kind::Upsert as i8);
            route_some(&routes, FileRows::Visible, &batch, &buckets, &visible).await?;
            let hidden = BooleanArray::from_unary(kinds, |k| {
                k != Kind::Upsert as i8 && k < CHANGE_INSERT
            });
            route_some(&routes, FileRows::Hidden, &batch, &buckets, &hidden).await?;
            let changes = BooleanArray::from_unary(kinds, |k| k >= CHANGE_INSERT);
            if changes.true_count() == 0 {
                continue;
            }
            if change_feed == ChangeFeed::FromAdds {
                if let Some(kind) = kinds.values().iter().find(|k| **k > CHANGE_INSERT) {
                    return Err(DataFusionError::Internal(format!(
                        "an update of a target without rows changed a row ({}); nothing was committed",
                        change_type_name(*kind).unwrap_or("unknown change")
                    )));
                }
                continue;
            }
            let (rows, row_buckets) = select(&batch, &buckets, &changes)?;
            let rows = change_data_batch(&rows, &change_schema)?;
            route(&routes, FileRows::Changes, rows, &row_buckets).await?;
        }
        Ok::<_, DataFusionError>(())
    }
    .await;
    drop(routes);
    let mut written = WrittenFiles::default();
    let mut failure = routed.err();
    for task in tasks {
        match task.join().await {
            Ok(Ok((visible, hidden, changes))) => {
                written.adds.extend(visible);
                written.adds.extend(hidden);
                written.change_files.extend(changes);
            }
            // a writer's own error explains a failed route best
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(DataFusionError::ExecutionJoin(Box::new(e))),
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(written),
    }
}

/// Route the rows of `batch` selected by `selected` (all of them without a copy).
async fn route_some(
    routes: &[tokio::sync::mpsc::Sender<RoutedRows>],
    rows: FileRows,
    batch: &RecordBatch,
    buckets: &Int32Array,
    selected: &BooleanArray,
) -> Result<()> {
    match selected.true_count() {
        0 => Ok(()),
        n if n == batch.num_rows() => route(routes, rows, batch.clone(), buckets).await,
        _ => {
            let (part, part_buckets) = select(batch, buckets, selected)?;
            route(routes, rows, part, &part_buckets).await
        }
    }
}

/// The rows of `batch` and their `buckets` selected by `selected` (no
/// nulls): a slice where they are one run of rows (a fold that orders its
/// output by file, `crate::fold::scd2`), else a filtered copy.
fn select(
    batch: &RecordBatch,
    buckets: &Int32Array,
    selected: &BooleanArray,
) -> Result<(RecordBatch, Int32Array)> {
    let mut runs = selected.values().set_slices();
    if let (Some((start, end)), None) = (runs.next(), runs.next()) {
        let len = end - start;
        return Ok((batch.slice(start, len), buckets.slice(start, len)));
    }
    let part = filter_record_batch(batch, selected)?;
    let part_buckets = filter(buckets, selected)?;
    Ok((part, part_buckets.as_primitive::<Int32Type>().clone()))
}

/// Rows for one writer task, with their buckets.
type RoutedRows = (FileRows, RecordBatch, Int32Array);

/// Send each row of `rows` to the writer task of its bucket.
async fn route(
    routes: &[tokio::sync::mpsc::Sender<RoutedRows>],
    kind: FileRows,
    rows: RecordBatch,
    buckets: &Int32Array,
) -> Result<()> {
    let closed = || DataFusionError::Execution("a file writer stopped".into());
    let writers = routes.len() as i32;
    let writer_of = |b: i32| b.rem_euclid(writers) as usize;
    let first = buckets.values().first().map(|b| writer_of(*b));
    if let Some(w) = first.filter(|&w| buckets.values().iter().all(|b| writer_of(*b) == w)) {
        return routes[w]
            .send((kind, rows, buckets.clone()))
            .await
            .map_err(|_| closed());
    }
    // one copy grouping the rows by writer, then bucket: each writer gets
    // a slice, already grouped for its files
    let (rows, buckets) = group_by_bucket(&rows, buckets, |b| writer_of(b) as i32)?;
    let values = buckets.values();
    let mut start = 0;
    while start < values.len() {
        let w = writer_of(values[start]);
        let len = values[start..]
            .iter()
            .position(|b| writer_of(*b) != w)
            .unwrap_or(values.len() - start);
        routes[w]
            .send((kind, rows.slice(start, len), buckets.slice(start, len)))
            .await
            .map_err(|_| closed())?;
        start += len;
    }
    Ok(())
}

/// One writer task of [`write_rows`]: writes the rows routed to it;
/// returns its visible, hidden and change files.
async fn write_routed(
    store: Arc<dyn object_store::ObjectStore>,
    schema: SchemaRef,
    change_schema: SchemaRef,
    key_indices: Vec<usize>,
    writing: FileWriting,
    mut rows: tokio::sync::mpsc::Receiver<RoutedRows>,
) -> Result<(Vec<Add>, Vec<Add>, Vec<Add>)> {
    let FileWriting {
        compression,
        index_cache,
        ..
    } = writing;
    let mut visible = BucketWriter::new(Arc::clone(&store), Arc::clone(&schema), FileRows::Visible)
        .with_key_filters(&key_indices)
        .with_compression(compression)
        .with_index_cache(index_cache.clone());
    let mut hidden = BucketWriter::new(Arc::clone(&store), schema, FileRows::Hidden)
        .with_key_filters(&key_indices)
        .with_compression(compression)
        .with_index_cache(index_cache);
    let mut changes =
        BucketWriter::new(store, change_schema, FileRows::Changes).with_compression(compression);
    while let Some((kind, batch, buckets)) = rows.recv().await {
        match kind {
            FileRows::Visible => visible.write(&batch, &buckets).await?,
            FileRows::Hidden => hidden.write(&batch, &buckets).await?,
            FileRows::Changes => changes.write(&batch, &buckets).await?,
        }
    }
    // (their uploads wait for the store together)
    futures::try_join!(visible.finish(), hidden.finish(), changes.finish())
}

/// Whether a failed commit lost a race with another writer (running it
/// again may succeed), rather than being refused for what it holds.
/// What a failed Delta commit says, on one line and without deltalake's
/// advice (`Help: … the isolation level can be set to Snapshot Isolation`,
/// a setting of deltalake's that statements here do not take).
pub(crate) fn commit_error_text(error: &deltalake_core::DeltaTableError) -> String {
    let text = error.to_string();
    let text = match text.find("Help:") {
        Some(at) => &text[..at],
        None => &text,
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn lost_a_race(error: &deltalake_core::DeltaTableError) -> bool {
    use deltalake_core::kernel::transaction::TransactionError;
    matches!(
        error,
        deltalake_core::DeltaTableError::Transaction {
            source: TransactionError::VersionAlreadyExists(_)
                | TransactionError::CommitConflict(_)
                | TransactionError::MaxCommitAttempts(_)
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;
    use arrow::datatypes::Int64Type;

    /// A commit that lost a race says so in one line, without deltalake's
    /// advice to change an isolation level statements here do not take.
    #[test]
    fn a_lost_race_is_told_in_one_line_without_deltalakes_advice() {
        use deltalake_core::kernel::transaction::{CommitConflictError, TransactionError};
        let e = deltalake_core::DeltaTableError::Transaction {
            source: TransactionError::CommitConflict(CommitConflictError::ConcurrentDeleteRead),
        };
        assert!(e.to_string().contains("Snapshot Isolation"), "{e}");
        let text = commit_error_text(&e);
        assert!(!text.contains("Help") && !text.contains('\n'), "{text}");
        assert!(text.contains("deleted data this operation read"), "{text}");
        assert!(lost_a_race(&e));
    }

    /// Rows selected in one run are a slice of the batch (no copy); others
    /// are a filtered copy; either way the rows and buckets a filter gives.
    #[test]
    fn one_run_of_rows_is_selected_as_a_slice() -> Result<()> {
        let values: ArrayRef = Arc::new(Int64Array::from_iter_values(0..6));
        let batch = RecordBatch::try_from_iter([("v", values)])?;
        let buckets = Int32Array::from(vec![3, 1, 4, 1, 5, 9]);
        let base = batch
            .column(0)
            .as_primitive::<Int64Type>()
            .values()
            .as_ptr();
        for (selected, first, one_run) in [
            ([false, true, true, true, false, false], 1, true),
            ([true; 6], 0, true),
            ([false, false, false, false, false, true], 5, true),
            ([true, false, true, false, false, true], 0, false),
        ] {
            let selected = BooleanArray::from(selected.to_vec());
            let (rows, row_buckets) = select(&batch, &buckets, &selected)?;
            assert_eq!(rows, filter_record_batch(&batch, &selected)?);
            assert_eq!(
                &row_buckets,
                filter(&buckets, &selected)?.as_primitive::<Int32Type>()
            );
            let at = rows.column(0).as_primitive::<Int64Type>().values().as_ptr();
            assert_eq!(at == base.wrapping_add(first), one_run, "{selected:?}");
        }
        Ok(())
    }
}
