//! Rejects (SPEC §4.8): with `TBLPROPERTIES ('autocdc.rejects' = 'true')` a
//! flow's events that would fail its update (a NULL key, a NULL sequence)
//! and the rows an expectation drops go to the streaming table
//! `<t>__rejects` instead, and the update applies the other events.
//!
//! | column           | type     | holds                                          |
//! |------------------|----------|------------------------------------------------|
//! | `flow`           | `STRING` | the flow that brought the event                |
//! | `reason`         | `STRING` | why it was rejected (`NULL sequence`, `NULL key column 'id'`, `expectation 'e' (…) DROP ROW`) |
//! | `key`            | `STRING` | `k1=v1, k2=v2` (NULL for flows without keys)   |
//! | `sequence`       | `STRING` | the event's sequence value, as text (BITEMPORAL: `seq (system s)`) |
//! | `change`         | `STRING` | `UPSERT`, `DELETE` or `TRUNCATE`               |
//! | `row`            | `STRING` | the event's target columns as a JSON object    |
//! | `commit_version` | `BIGINT` | the target's commit that applied the update    |
//!
//! Atomicity: the target's commit is the only point of decision. The
//! rejected rows are written first as one Parquet file in the target's
//! state folder (`_autocdc/state/_rejects/<id>.parquet`, never part of a
//! Delta table), and the target's commit names that file in its (hidden)
//! state-store property `autocdc.rejects.pending` and in its event-log
//! entry. [`deliver`] then appends the file's rows, with the commit's
//! version, to `<t>__rejects`, in one commit that also records the
//! delivered id (`autocdc.rejects.delivered`): it runs after each update
//! and before the next, so an interruption between the two commits is
//! repaired by the next update (or the next session's open), and a delivery
//! is never repeated. An update that fails commits nothing, and its file is
//! never delivered (a failed commit may still have been written, so the
//! file stays until a delivery takes it).

use std::collections::HashMap;
use std::sync::Arc;

use std::collections::HashSet;

use arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, Int64Array, Int8Array, RecordBatch,
    StringArray,
};
use arrow::compute::{cast as cast_array, filter_record_batch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::Column;
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::{cast, col, lit, Expr};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::prelude::SessionContext;
use deltalake_core::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use deltalake_core::parquet::file::reader::ChunkReader;
use object_store::path::Path;
use object_store::ObjectStoreExt;

use super::bucket::bucket_field;
use super::commit::{write_rows, ChangeFeed, Edit, EditKind, FileWriting, MetadataChange};
use super::event::{logged_commits, CommitEvent, Operation};
use super::reject_sink::{pending_schema, PendingRejects, PENDING_COLUMNS};
use super::{ScdTable, TableName};
use crate::fold::columns::{Kind, KIND_COL, SEQ_COL, WRITTEN_AT_COL};
use crate::spec::resolve::{written_at_type, written_at_value};

/// The table property that turns rejects on.
pub const REJECTS_PROPERTY: &str = "autocdc.rejects";
/// The rejects table's state-store property naming the last delivery.
const DELIVERED_PROPERTY: &str = "autocdc.rejects.delivered";
/// Suffix of the rejects table's name.
pub const REJECTS_SUFFIX: &str = "__rejects";

/// The rejects table's columns, in SQL (`CREATE STREAMING TABLE`).
pub(crate) const REJECTS_COLUMNS: [(&str, &str); 7] = [
    ("flow", "STRING"),
    ("reason", "STRING"),
    ("key", "STRING"),
    ("sequence", "STRING"),
    ("change", "STRING"),
    ("row", "STRING"),
    ("commit_version", "BIGINT"),
];

/// Whether a table's properties turn rejects on.
pub fn takes_rejects(properties: &HashMap<String, String>) -> bool {
    properties
        .get(REJECTS_PROPERTY)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The rejects table of `target`.
pub fn rejects_table_name(target: &TableName) -> TableName {
    TableName {
        schema: target.schema.clone(),
        table: format!("{}{REJECTS_SUFFIX}", target.table),
    }
}

/// Append `target`'s last rejects file to `rejects` (its `<t>__rejects`),
/// unless it was delivered already; returns the rows delivered. See the
/// module docs.
pub(crate) async fn deliver(
    target: &ScdTable,
    rejects: &ScdTable,
    now_micros: i64,
) -> Result<usize> {
    let Some(pending) = PendingRejects::read(&target.meta().properties) else {
        return Ok(0);
    };
    rejects.refresh().await?;
    if rejects.meta().properties.get(DELIVERED_PROPERTY) == Some(&pending.id) {
        return Ok(0);
    }
    let delta = target.delta();
    let version = committed_version(target, &pending.id).await?;
    let store = delta.object_store();
    let bytes = store
        .get(&Path::from(pending.path.as_str()))
        .await
        .map_err(|e| {
            DataFusionError::Execution(format!(
                "rejects of '{}': reading {}: {e}",
                target.name(),
                pending.path
            ))
        })?
        .bytes()
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    // an event rejected again (a source read whole by every update) is the
    // same event: it is kept once, with the version that first rejected it.
    // An append flow's rows are not events: each is new (its streams read
    // every row once), however alike two are — but for those a full
    // refresh reads again: as many alike as were delivered are not new.
    let (known, known_since) = delivered_events(rejects, pending.read_again_after).await?;
    // (what an append flow reads again: everything after a full refresh,
    // what came after the version a restore went back to)
    let appended_known = match pending.read_again_after {
        Some(_) => &known_since,
        None => &known,
    };
    let target_meta = target.meta();
    let appending: HashSet<&str> = target_meta
        .flows
        .values()
        .filter(|f| f.append)
        .map(|f| f.name.as_str())
        .collect();
    let rows = read_pending(bytes, version)?
        .into_iter()
        .map(|batch| {
            new_events(
                batch,
                &known,
                appended_known,
                &appending,
                pending.read_again,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let count: usize = rows.iter().map(RecordBatch::num_rows).sum();
    let meta = rejects.meta();
    let mut edit = Edit::new(EditKind::Update).metadata(MetadataChange::Set(
        DELIVERED_PROPERTY.to_string(),
        pending.id.clone(),
    ));
    let mut event = CommitEvent::new(Operation::Rejects, None, std::time::Instant::now());
    event.upserted = count as u64;
    event.input = count as u64;
    edit =
        edit.event(event.with_details(format!("rejects of '{}' version {version}", target.name())));
    if meta.sequence_type.is_none() {
        // the first delivery fixes the stored columns, as an append flow's
        // first run does
        edit = edit.metadata(MetadataChange::Schema(state_schema(&meta.user_schema)));
    }
    let row_schema = Arc::new(Schema::new(
        state_schema(&meta.user_schema).fields()[..meta.user_schema.fields().len() + 3].to_vec(),
    ));
    let state_rows = rows
        .iter()
        .map(|batch| as_state_rows(batch, &row_schema, now_micros))
        .collect::<Result<Vec<_>>>()?;
    let spread: Vec<usize> = (0..meta.user_schema.fields().len()).collect();
    let stream = MemoryStream::try_new(state_rows, row_schema, None)?;
    let written = write_rows(
        &rejects.delta().object_store(),
        Box::pin(stream),
        &spread,
        meta.buckets,
        FileWriting {
            compression: meta.compression,
            tasks: 1,
            index_cache: None,
        },
        ChangeFeed::FromAdds,
    )
    .await?;
    edit.written(written).commit(rejects).await?;
    // delivered: the file is not needed any more
    let _ = store.delete(&Path::from(pending.path.as_str())).await;
    Ok(count)
}

/// One rejected event's identity: its pending columns, joined.
fn identity(columns: &[&StringArray], row: usize) -> String {
    let mut text = String::new();
    for column in columns {
        if column.is_valid(row) {
            text.push_str(column.value(row));
        } else {
            text.push('\u{0}');
        }
        text.push('\u{1f}');
    }
    text
}

/// The pending columns of `batch`, as strings.
fn pending_columns(batch: &RecordBatch) -> Result<Vec<&StringArray>> {
    PENDING_COLUMNS
        .iter()
        .map(|name| {
            batch
                .column(batch.schema().index_of(name)?)
                .as_string_opt::<i32>()
                .ok_or_else(|| DataFusionError::Internal(format!("rejects: '{name}' is not text")))
        })
        .collect()
}

/// The identities of the events `rejects` holds, each with how many: all
/// of them, and those delivered by target commits after `after`.
async fn delivered_events(
    rejects: &ScdTable,
    after: Option<i64>,
) -> Result<(HashMap<String, usize>, HashMap<String, usize>)> {
    let ctx = SessionContext::new();
    let mut columns: Vec<Expr> = PENDING_COLUMNS
        .iter()
        .map(|name| cast(col(Column::new_unqualified(*name)), DataType::Utf8).alias(*name))
        .collect();
    columns.push(cast(col("commit_version"), DataType::Int64).alias("commit_version"));
    let batches = ctx
        .read_table(rejects.raw_provider())?
        .filter(col(KIND_COL).eq(lit(Kind::Upsert as i8)))?
        .select(columns)?
        .collect()
        .await?;
    let mut known = HashMap::new();
    let mut since = HashMap::new();
    for batch in &batches {
        let columns = pending_columns(batch)?;
        let versions = batch
            .column(batch.schema().index_of("commit_version")?)
            .as_primitive_opt::<arrow::datatypes::Int64Type>()
            .ok_or_else(|| DataFusionError::Internal("rejects: commit_version".into()))?;
        for row in 0..batch.num_rows() {
            let id = identity(&columns, row);
            if after.is_some_and(|after| versions.is_valid(row) && versions.value(row) > after) {
                *since.entry(id.clone()).or_insert(0) += 1;
            }
            *known.entry(id).or_insert(0) += 1;
        }
    }
    Ok((known, since))
}

/// The rows of `batch` not in `known` (nor earlier in `batch`), and every
/// row of the `appending` flows — when they read rows again (`read_again`),
/// those beyond as many alike as `appended_known` (what they read again)
/// holds.
fn new_events(
    batch: RecordBatch,
    known: &HashMap<String, usize>,
    appended_known: &HashMap<String, usize>,
    appending: &HashSet<&str>,
    read_again: bool,
) -> Result<RecordBatch> {
    let columns = pending_columns(&batch)?;
    // (`flow` is the first pending column)
    let flows = columns[0];
    let mut seen: HashMap<String, usize> = HashMap::new();
    let keep: BooleanArray = (0..batch.num_rows())
        .map(|row| {
            let appended = flows.is_valid(row) && appending.contains(flows.value(row));
            if appended && !read_again {
                return Some(true);
            }
            let id = identity(&columns, row);
            let delivered = match appended {
                true => appended_known,
                false => known,
            }
            .get(&id)
            .copied()
            .unwrap_or(0);
            let seen = seen.entry(id).or_insert(0);
            *seen += 1;
            Some(match appended {
                true => *seen > delivered,
                false => delivered == 0 && *seen == 1,
            })
        })
        .collect();
    Ok(filter_record_batch(&batch, &keep)?)
}

/// The state-store schema of the rejects table: its columns, then the
/// columns of rows stored without a sequence (as append flows store them).
fn state_schema(user: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = user.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(SEQ_COL, DataType::Int64, true));
    fields.push(Field::new(KIND_COL, DataType::Int8, false));
    fields.push(Field::new(WRITTEN_AT_COL, written_at_type(), true));
    fields.push(bucket_field());
    Arc::new(Schema::new(fields))
}

/// Rejects rows as live state rows of `schema` (the rejects table's
/// columns, a NULL sequence, `UPSERT`, written at `now_micros`).
fn as_state_rows(rows: &RecordBatch, schema: &SchemaRef, now_micros: i64) -> Result<RecordBatch> {
    let n = rows.num_rows();
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let column: ArrayRef = match field.name().as_str() {
            SEQ_COL => Arc::new(Int64Array::new_null(n)),
            KIND_COL => Arc::new(Int8Array::from(vec![Kind::Upsert as i8; n])),
            WRITTEN_AT_COL => written_at_value(now_micros).to_array_of_size(n)?,
            name => match rows.schema().index_of(name) {
                Ok(i) => cast_array(rows.column(i), field.data_type())?,
                Err(_) => new_null_array(field.data_type(), n),
            },
        };
        columns.push(column);
    }
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// The version of `target`'s commit that recorded the rejects `id`.
async fn committed_version(target: &ScdTable, id: &str) -> Result<i64> {
    let commits = logged_commits(&target.delta()).await?;
    commits
        .iter()
        .rev()
        .find(|c| c.event.as_ref().and_then(|(e, _)| e.rejects.as_deref()) == Some(id))
        .map(|c| c.version)
        .ok_or_else(|| {
            DataFusionError::Execution(format!(
                "rejects of '{}': no commit records the rejects file {id}",
                target.name()
            ))
        })
}

/// The rows of a pending file, with `commit_version`.
fn read_pending<R: ChunkReader + 'static>(bytes: R, version: i64) -> Result<Vec<RecordBatch>> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.build())
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    let mut fields: Vec<Field> = pending_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("commit_version", DataType::Int64, true));
    let schema = Arc::new(Schema::new(fields));
    reader
        .map(|batch| {
            let batch = batch?;
            let mut columns = batch.columns().to_vec();
            columns.push(Arc::new(Int64Array::from(vec![version; batch.num_rows()])));
            Ok(RecordBatch::try_new(Arc::clone(&schema), columns)?)
        })
        .collect()
}
