//! `RESTORE`: a streaming table's state store as it was at an older version,
//! as one new commit (history kept), which the published table follows.
//!
//! ```text
//!  files at now (C)      files at version n (N)          (path + deletion vector)
//!        │                       │
//!        ├── C \ N ──► removed   ├── N \ C ──► added again (their Add at n, tags kept)
//!        │                       │
//!        └── visible rows of C \ N ⟗ visible rows of N \ C, by identity ──► change rows
//!  checkpoint properties := those at n;   one commit: remove ∪ add ∪ cdc ∪ metadata
//! ```
//!
//! **Files.** A data file is the same in both versions when its path and its
//! deletion vector are; the others are removed, or added again as version
//! `n` had them — but when a column has widened since `n`: then their rows
//! are written again in the wider type, as new files (every file of the
//! table holds its schema's types, for readers without type widening). Every file added again must still be in the store (VACUUM
//! removes files older than its retention): one that is gone refuses the
//! restore, naming it.
//!
//! **Change feed.** Rows of the files both versions share are the same on
//! both sides, so only the visible rows of the files that differ are read —
//! the cost follows what the restore changes, not the table. They are
//! matched by identity (the keys; SCD 2 adds `__start_at`, BITEMPORAL also
//! `__system_start_at`, as the change feed of updates does):
//!
//! | row is visible      | change rows                                        |
//! |---------------------|----------------------------------------------------|
//! | now only            | `delete` (its values now)                          |
//! | at `n` only         | `insert` (its values at `n`)                       |
//! | both, values differ | `update_preimage` (now), `update_postimage` (at `n`) |
//! | both, equal         | none                                               |
//!
//! A table without keys (append flows only) has no identity: its rows match
//! by their values, copy by copy (a row twice now and once at `n` is one
//! `delete`), and the rows left over are `delete`s (now) and `insert`s (at
//! `n`).
//!
//! **Metadata.** The flows' source checkpoints and the snapshot versions
//! (`autocdc.source.*`, `autocdc.snapshot.*`, `autocdc.snapshot_watermark`)
//! become those of version `n` (absent then: absent now, so a flow defined
//! since reads its source from the start; so does a flow defined again
//! since under its name, with another definition); flow definitions, the schema
//! (files of an older schema read NULL in columns added since) and every
//! other property stay as they are.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Int8Type, SchemaRef};
use datafusion::common::NullEquality;
use datafusion::common::{Column, DataFusionError, Result};
use datafusion::datasource::provider_as_source;
use datafusion::execution::session_state::SessionState;
use datafusion::functions_window::expr_fn::row_number;
use datafusion::logical_expr::{
    lit, BinaryExpr, Expr, ExprFunctionExt, JoinType, LogicalPlan, LogicalPlanBuilder, Operator,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use deltalake_core::kernel::{Add, LogicalFileView};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStoreExt;

use super::bucket::BUCKET_COL;
use super::commit::{
    data_files, write_rows, ChangeFeed, Edit, EditKind, FileWriting, MetadataChange, Replaced,
    WrittenFiles,
};
use super::event::CommitEvent;
use super::plain_files::{PlainFilesTable, TableLocation};
use super::properties::{
    read_again_property, FLOW_KEY_PREFIX, FULL_REFRESH_PENDING_PREFIX, SNAPSHOT_PROPERTY_PREFIX,
    SNAPSHOT_WATERMARK_PROPERTY, SOURCE_CHECKPOINT_PREFIX,
};
use super::{delta_err, ScdTable};
use crate::fold::columns::{
    Kind, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE, INTERNAL_PREFIX,
    KIND_COL, START_AT_COL, SYSTEM_START_AT_COL,
};
use crate::fold::ScdType;

/// The number of a keyless row's copy among the equal rows of its side.
const COPY_COL: &str = "__autocdc_copy";

/// The two sides of the comparison: the table now, and at the version restored.
const NOW: &str = "now";
const THEN: &str = "then";

/// The properties a restore takes from the version it restores.
const RESTORED_PREFIXES: [&str; 4] = [
    SOURCE_CHECKPOINT_PREFIX,
    SNAPSHOT_PROPERTY_PREFIX,
    SNAPSHOT_WATERMARK_PROPERTY,
    FULL_REFRESH_PENDING_PREFIX,
];

/// The flow a restored property belongs to (`None`: the table's own).
fn flow_of_property(key: &str) -> Option<&str> {
    if let Some(flow) = key.strip_prefix(SOURCE_CHECKPOINT_PREFIX) {
        return Some(flow);
    }
    if let Some(flow) = key.strip_prefix(FULL_REFRESH_PENDING_PREFIX) {
        return Some(flow);
    }
    key.strip_prefix(SNAPSHOT_PROPERTY_PREFIX)
        .and_then(|rest| rest.strip_suffix(".last_version"))
}

/// What a restore did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// The version it committed.
    pub version: i64,
    /// Rows visible at the restored version only.
    pub inserted: u64,
    /// Rows visible in both, with other values.
    pub updated: u64,
    /// Rows visible now only.
    pub deleted: u64,
    /// Data files removed.
    pub files_removed: usize,
    /// Data files of the restored version added again.
    pub files_added: usize,
}

/// Whether a column of `then`'s schema has widened in `now`'s: files of
/// `then` hold the narrower type, which Delta readers (without the type
/// widening feature) would read under the wider one.
fn narrower_then(
    now: &deltalake_core::DeltaTable,
    then: &deltalake_core::DeltaTable,
) -> Result<bool> {
    let schema = |t: &deltalake_core::DeltaTable| -> Result<SchemaRef> {
        Ok(t.snapshot().map_err(delta_err)?.snapshot().arrow_schema())
    };
    let (current, restored) = (schema(now)?, schema(then)?);
    Ok(restored.fields().iter().any(|field| {
        current
            .field_with_name(field.name())
            .is_ok_and(|wider| wider.data_type() != field.data_type())
    }))
}

/// Restore `table` (loaded at its latest version) to its version `to`,
/// logging `event` (its counts are set here). `keys`: the target's key
/// columns (`None`: a table without keys).
pub(crate) async fn restore(
    state: &SessionState,
    table: &ScdTable,
    to: u64,
    keys: Option<&[String]>,
    mut event: CommitEvent,
) -> Result<Restored> {
    let began = std::time::Instant::now();
    let now = table.delta();
    let mut then = now.clone();
    then.load_version(to as _).await.map_err(delta_err)?;

    let (removed, added) = differing_files(&now, &then).await?;
    missing_files(table, &now, &added, to).await?;
    let (written, counts) = change_files(state, table, &removed, &added, keys).await?;
    // the files of `to` as they were; or, when a column has widened since,
    // their rows written again in the wider type (the schema stays)
    let readded: Vec<Add> = match !added.is_empty() && narrower_then(&now, &then)? {
        true => rewritten(state, table, &added, keys).await?,
        #[allow(deprecated)] // the Add as logged, tags and statistics included
        false => added.iter().map(LogicalFileView::add_action).collect(),
    };

    let then_properties = then
        .snapshot()
        .map_err(delta_err)?
        .metadata()
        .configuration()
        .clone();
    let mut edit = Edit::new(EditKind::Restore { version: to }).metadata(
        MetadataChange::RemovePrefixed(RESTORED_PREFIXES.iter().map(|p| p.to_string()).collect()),
    );
    // (a flow defined again since `n`, under its name but otherwise, is
    // not the flow those properties were of: it reads from the start)
    let now_flows = table.meta().flows;
    let redefined = |flow: &str| {
        let then_flow = then_properties
            .get(&format!("{FLOW_KEY_PREFIX}{flow}"))
            .and_then(|json| serde_json::from_str::<crate::spec::FlowSpec>(json).ok());
        then_flow.as_ref() != now_flows.get(flow)
    };
    let mut restored: Vec<(&String, &String)> = then_properties
        .iter()
        .filter(|(k, _)| RESTORED_PREFIXES.iter().any(|p| k.starts_with(p)))
        .filter(|(k, _)| flow_of_property(k).is_none_or(|flow| !redefined(flow)))
        .collect();
    restored.sort();
    for (key, value) in restored {
        edit = edit.metadata(MetadataChange::Set(key.clone(), value.clone()));
    }
    // append flows read again what they read since `to`: rows they reject
    // again, alike to those delivered after `to`, are not new rejects
    // (`rejects::deliver`)
    for flow in now_flows.values().filter(|f| f.append) {
        edit = edit.metadata(MetadataChange::Set(
            read_again_property(&flow.name),
            to.to_string(),
        ));
    }
    event.restored_version = Some(to);
    event.upserted = counts.inserted + counts.updated;
    event.deleted = counts.deleted;
    event.duration_ms += began.elapsed().as_millis() as u64;
    let files_removed = removed.len();
    let files_added = readded.len();
    let version = edit
        .event(event)
        .replacing(Replaced::Files(
            removed.iter().map(|f| f.remove_action(true)).collect(),
        ))
        .written(WrittenFiles {
            adds: readded,
            change_files: written.change_files,
        })
        .commit(table)
        .await?;
    Ok(Restored {
        version,
        inserted: counts.inserted,
        updated: counts.updated,
        deleted: counts.deleted,
        files_removed,
        files_added,
    })
}

/// The rows of the data files `files` (every state row their deletion
/// vectors keep), read in the table's current types and written again as
/// new data files: the `add`s of those files.
async fn rewritten(
    state: &SessionState,
    table: &ScdTable,
    files: &[LogicalFileView],
    keys: Option<&[String]>,
) -> Result<Vec<Add>> {
    let delta = table.delta();
    let raw = table.raw_provider().schema();
    let partition_columns = table.partition_columns()?;
    let location = TableLocation {
        url: delta.table_url(),
        store: delta.object_store(),
        schema: Arc::clone(&raw),
        partition_columns: &partition_columns,
    };
    let rows = PlainFilesTable::with_vectors(location, files.to_vec())?;
    let columns: Vec<String> = row_columns(&raw);
    let plan = LogicalPlanBuilder::scan(THEN, provider_as_source(Arc::new(rows)), None)?
        .project(columns.iter().map(|c| qualified(THEN, c).alias(c)))?
        .build()?;
    let physical = state.create_physical_plan(&plan).await?;
    let stream = datafusion::physical_plan::execute_stream(physical, state.task_ctx())?;
    let written = write_rows(
        &delta.object_store(),
        stream,
        &key_indices(&columns, keys),
        table.meta().buckets,
        file_writing(state, table),
        ChangeFeed::Files,
    )
    .await?;
    Ok(written.adds)
}

/// The data files of `now` that `then` does not have (same path and
/// deletion vector), and those of `then` that `now` does not have.
async fn differing_files(
    now: &deltalake_core::DeltaTable,
    then: &deltalake_core::DeltaTable,
) -> Result<(Vec<LogicalFileView>, Vec<LogicalFileView>)> {
    let identity = |view: &LogicalFileView| {
        (
            view.path().to_string(),
            view.deletion_vector_descriptor()
                .and_then(|d| serde_json::to_string(&d).ok()),
        )
    };
    let index = |files: Vec<LogicalFileView>| -> HashMap<_, LogicalFileView> {
        files.into_iter().map(|f| (identity(&f), f)).collect()
    };
    let mut now_files = index(data_files(now).await?);
    let mut then_files = index(data_files(then).await?);
    let shared: Vec<_> = now_files
        .keys()
        .filter(|k| then_files.contains_key(*k))
        .cloned()
        .collect();
    for key in &shared {
        now_files.remove(key);
        then_files.remove(key);
    }
    let sorted = |files: HashMap<_, LogicalFileView>| {
        let mut files: Vec<_> = files.into_values().collect();
        files.sort_by(|a, b| a.path().cmp(&b.path()));
        files
    };
    Ok((sorted(now_files), sorted(then_files)))
}

/// Refuse the restore when a file to add again is no longer in the store.
async fn missing_files(
    table: &ScdTable,
    now: &deltalake_core::DeltaTable,
    added: &[LogicalFileView],
    to: u64,
) -> Result<()> {
    let store = now.object_store();
    let paths: Vec<Path> = added
        .iter()
        .map(LogicalFileView::object_store_path)
        .collect();
    let mut missing = Vec::new();
    let mut heads = futures::stream::iter(paths)
        .map(|path| {
            let store = Arc::clone(&store);
            async move { (store.head(&path).await, path) }
        })
        .buffer_unordered(16);
    while let Some((head, path)) = heads.next().await {
        match head {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => missing.push(path),
            Err(e) => return Err(delta_err(e)),
        }
    }
    match missing.first() {
        None => Ok(()),
        Some(path) => Err(DataFusionError::Plan(format!(
            "RESTORE of '{}' to version {to}: {} of that version's data files are no longer \
             stored (VACUUM removed them), e.g. '{path}'; nothing was changed",
            table.name(),
            missing.len()
        ))),
    }
}

/// Counts of change rows by kind.
#[derive(Debug, Default)]
pub(crate) struct ChangeCounts {
    pub inserted: u64,
    pub updated: u64,
    pub deleted: u64,
}

/// Write the change data files of the restore: the visible rows of `removed`
/// against those of `added` (see the module docs).
async fn change_files(
    state: &SessionState,
    table: &ScdTable,
    removed: &[LogicalFileView],
    added: &[LogicalFileView],
    keys: Option<&[String]>,
) -> Result<(WrittenFiles, ChangeCounts)> {
    let raw = table.raw_provider().schema();
    let after = FilesAfter::Logged(added.to_vec());
    net_change_files(state, table, raw, removed.to_vec(), after, keys).await
}

/// The files of the table after a change.
pub(crate) enum FilesAfter<'a> {
    /// Data files of a version of the log.
    Logged(Vec<LogicalFileView>),
    /// Data files written for a commit not made yet.
    Written(&'a [Add]),
}

/// Write the change data files that take `table`'s visible rows in the
/// files `before` to those in the files `after`, both read in the raw
/// schema `raw` (the table's after the change), matched by identity (see
/// the module docs): a restore's, and a full refresh's, whose first update
/// replaces every file (rows it writes again unchanged are no change).
pub(crate) async fn net_change_files(
    state: &SessionState,
    table: &ScdTable,
    raw: SchemaRef,
    before: Vec<LogicalFileView>,
    after: FilesAfter<'_>,
    keys: Option<&[String]>,
) -> Result<(WrittenFiles, ChangeCounts)> {
    let delta = table.delta();
    let partition_columns = table.partition_columns()?;
    let location = || TableLocation {
        url: delta.table_url(),
        store: delta.object_store(),
        schema: Arc::clone(&raw),
        partition_columns: &partition_columns,
    };
    let before = PlainFilesTable::with_vectors(location(), before)?;
    let after = match after {
        FilesAfter::Logged(files) => PlainFilesTable::with_vectors(location(), files)?,
        FilesAfter::Written(adds) => PlainFilesTable::with_adds(location(), adds)?,
    };
    let (before, after) = (Arc::new(before), Arc::new(after));
    // the visible rows of the files before ("now") or after ("then")
    let visible = |side: &str| -> Result<LogicalPlanBuilder> {
        let rows = if side == NOW { &before } else { &after };
        LogicalPlanBuilder::scan(side, provider_as_source(Arc::clone(rows) as _), None)?
            .filter(qualified(side, KIND_COL).eq(lit(Kind::Upsert as i8)))
    };
    let columns = row_columns(&raw);
    // the change rows in the data file layout, the kind column telling them apart
    let rows_of = |side: &str, kind: i8| -> Vec<Expr> {
        columns
            .iter()
            .map(|c| {
                if c == KIND_COL {
                    lit(kind).alias(KIND_COL)
                } else {
                    qualified(side, c).alias(c)
                }
            })
            .collect()
    };
    let plan: LogicalPlan = match identity(table, keys) {
        None => {
            // rows match by their values, the i-th copy of a row on one
            // side with its i-th copy on the other (NULLs equal)
            let values: Vec<&String> = columns
                .iter()
                .filter(|c| !c.starts_with(INTERNAL_PREFIX))
                .collect();
            let numbered = |side: &str| -> Result<LogicalPlan> {
                let copy = row_number()
                    .partition_by(values.iter().map(|c| qualified(side, c)).collect())
                    .build()?
                    .alias(COPY_COL);
                visible(side)?.window(vec![copy])?.alias(side)?.build()
            };
            let on = |side: &str| -> Vec<Column> {
                values
                    .iter()
                    .map(|c| Column::new(Some(side), c.as_str()))
                    .chain([Column::new(Some(side), COPY_COL)])
                    .collect()
            };
            let unmatched = |join: JoinType, side: &str, kind: i8| -> Result<LogicalPlan> {
                LogicalPlanBuilder::from(numbered(NOW)?)
                    .join_detailed(
                        numbered(THEN)?,
                        join,
                        (on(NOW), on(THEN)),
                        None,
                        NullEquality::NullEqualsNull,
                    )?
                    .project(rows_of(side, kind))?
                    .build()
            };
            LogicalPlanBuilder::from(unmatched(JoinType::LeftAnti, NOW, CHANGE_DELETE)?)
                .union(unmatched(JoinType::RightAnti, THEN, CHANGE_INSERT)?)?
                .build()?
        }
        Some(identity) => {
            let on: Vec<Expr> = identity
                .iter()
                .map(|c| qualified(NOW, c).eq(qualified(THEN, c)))
                .collect();
            let differs = raw
                .fields()
                .iter()
                .filter(|f| !f.name().starts_with(INTERNAL_PREFIX))
                .filter(|f| !identity.contains(f.name()))
                .map(|f| {
                    Expr::BinaryExpr(BinaryExpr::new(
                        Box::new(qualified(NOW, f.name())),
                        Operator::IsDistinctFrom,
                        Box::new(qualified(THEN, f.name())),
                    ))
                })
                .reduce(Expr::or)
                .unwrap_or(lit(false));
            // each branch reads both sides, which hold only the rows of
            // the files that differ
            let joined = |join: JoinType| -> Result<LogicalPlanBuilder> {
                visible(NOW)?.join_on(visible(THEN)?.build()?, join, on.clone())
            };
            let deletes = joined(JoinType::LeftAnti)?.project(rows_of(NOW, CHANGE_DELETE))?;
            let inserts = joined(JoinType::RightAnti)?.project(rows_of(THEN, CHANGE_INSERT))?;
            let changed = || joined(JoinType::Inner)?.filter(differs.clone());
            let pre = changed()?.project(rows_of(NOW, CHANGE_PREIMAGE))?;
            let post = changed()?.project(rows_of(THEN, CHANGE_POSTIMAGE))?;
            deletes
                .union(inserts.build()?)?
                .union(pre.build()?)?
                .union(post.build()?)?
                .build()?
        }
    };
    let physical = state.create_physical_plan(&plan).await?;
    let stream = datafusion::physical_plan::execute_stream(physical, state.task_ctx())?;
    let schema = stream.schema();
    let counts = Arc::new(std::sync::Mutex::new(ChangeCounts::default()));
    let counted = {
        let counts = Arc::clone(&counts);
        stream.inspect_ok(move |batch: &RecordBatch| count(&counts, batch))
    };
    let written = write_rows(
        &delta.object_store(),
        Box::pin(RecordBatchStreamAdapter::new(schema, counted)),
        &key_indices(&columns, keys),
        table.meta().buckets,
        file_writing(state, table),
        ChangeFeed::Files,
    )
    .await?;
    let counts = std::mem::take(
        &mut *counts
            .lock()
            .map_err(|_| DataFusionError::Internal("poisoned restore counts".into()))?,
    );
    Ok((written, counts))
}

/// The columns of the rows a data file holds (its raw schema less the
/// bucket, a partition column).
fn row_columns(raw: &SchemaRef) -> Vec<String> {
    raw.fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| n != BUCKET_COL)
        .collect()
}

/// The positions in `columns` of what buckets its rows: the keys, or every
/// user column of a table without keys.
fn key_indices(columns: &[String], keys: Option<&[String]>) -> Vec<usize> {
    match keys {
        Some(keys) => keys
            .iter()
            .filter_map(|k| columns.iter().position(|c| c == k))
            .collect(),
        None => (0..columns.len())
            .filter(|&i| !columns[i].starts_with(crate::fold::columns::INTERNAL_PREFIX))
            .collect(),
    }
}

/// How a restore writes its files: as the table's updates do.
fn file_writing(state: &SessionState, table: &ScdTable) -> FileWriting {
    FileWriting {
        compression: table.meta().compression,
        tasks: state.config().target_partitions(),
        index_cache: Some(state.runtime_env().cache_manager.get_file_metadata_cache()),
    }
}

/// Add the change rows of `batch` to `counts` (an update counts once, by
/// its post-image).
fn count(counts: &std::sync::Mutex<ChangeCounts>, batch: &RecordBatch) {
    let Some(kinds) = batch.column_by_name(KIND_COL) else {
        return;
    };
    let kinds = kinds.as_primitive::<Int8Type>();
    if let Ok(mut counts) = counts.lock() {
        for kind in kinds.values().iter() {
            match *kind {
                CHANGE_INSERT => counts.inserted += 1,
                CHANGE_POSTIMAGE => counts.updated += 1,
                CHANGE_DELETE => counts.deleted += 1,
                _ => {}
            }
        }
    }
}

/// The target's key columns as stored (`None`: no keyed flow, rows have no
/// identity).
pub(crate) fn target_keys(table: &ScdTable) -> Option<Vec<String>> {
    let meta = table.meta();
    let flow = meta
        .flows
        .values()
        .find(|f| !f.append && !f.keys.is_empty())?;
    let stored: Vec<String> = flow
        .keys
        .iter()
        .filter_map(|k| {
            let position = meta.user_column(k)?;
            Some(meta.user_schema.field(position).name().clone())
        })
        .collect();
    (stored.len() == flow.keys.len()).then_some(stored)
}

/// The columns that name a visible row of `table`: its keys, and the
/// starts of its intervals (`None`: a table without keys).
fn identity(table: &ScdTable, keys: Option<&[String]>) -> Option<Vec<String>> {
    let mut identity = keys?.to_vec();
    match table.meta().stored_as {
        Some(ScdType::Type2) => identity.push(START_AT_COL.to_string()),
        Some(ScdType::Bitemporal) => {
            identity.push(START_AT_COL.to_string());
            identity.push(SYSTEM_START_AT_COL.to_string());
        }
        _ => {}
    }
    Some(identity)
}

/// A column of one side of the comparison.
fn qualified(side: &str, name: &str) -> Expr {
    Expr::Column(Column::new(Some(side), name))
}
