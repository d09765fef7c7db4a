//! DML on streaming tables (`DELETE FROM`, `UPDATE`, `INSERT INTO` through
//! DataFusion's `TableProvider` hooks, `MERGE INTO` parsed by our front
//! end), keeping the bookkeeping later flows sequence against (the
//! documentation's "DML on targets"):
//!
//! * SCD 1 `DELETE`: matching live rows become tombstones at their stored
//!   sequence, so a late event for the key stays dropped;
//! * SCD 1 `UPDATE`: matching live rows change in place, keeping their
//!   sequence; key columns cannot be assigned;
//! * SCD 1 `INSERT`: new keys become live rows, each taking its key's
//!   tombstone sequence, or the least sequence value (a live key, a key
//!   inserted twice, a NULL key are errors naming it);
//! * SCD 1 `MERGE` ([`merge`]): the first `WHEN` clause that holds for a
//!   source row updates, deletes or inserts, with the same bookkeeping;
//! * SCD 2 `DELETE`, `UPDATE`, `INSERT`, `MERGE` ([`versions`], [`merge`]):
//!   statements edit versions, and the edited versions of each key become its
//!   history, written by DML ([`history`]): replays of what they corrected
//!   are ignored, an erased key stays erased within the retention;
//! * BITEMPORAL `DELETE` erases whole keys; other DML is refused.
//!
//! Every statement is a plan ending in one Delta commit with its change data
//! feed, yielding the number of rows affected:
//!
//! * SCD 1: `count ◄ CdcCommitExec ◄ CdcWriteExec ◄ DmlRowsExec [◄ input]`
//!   ([`rows_exec`]): when it runs, the statement's rows are prepared and, for
//!   few keys, only the rows it changes are written and their stored rows
//!   retired with deletion vectors (else every file is rewritten);
//! * SCD 2 / BITEMPORAL: `count ◄` the update of the touched keys'
//!   histories (`CdcCommitExec ◄ CdcWriteExec ◄ AutoCdcExec`), whose edited
//!   versions are read and checked when it is planned.
//!
//! Schema-changing DML is refused by DataFusion before it reaches the table
//! (insert schemas must match).

use std::sync::Arc;

use arrow::array::{AsArray, BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, Int8Type, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::common::tree_node::TreeNode;
use datafusion::common::ScalarValue;
use datafusion::common::{Column, DataFusionError, Result};
use datafusion::datasource::{provider_as_source, MemTable};
use datafusion::execution::session_state::SessionState;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::functions::expr_fn::coalesce;
use datafusion::logical_expr::expr_rewriter::unnormalize_col;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{
    cast, col, lit, when, BinaryExpr, Expr, LogicalPlan, LogicalPlanBuilder, Operator, Volatility,
};
use datafusion::physical_expr::expressions::{self as physical, Literal};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{collect, ExecutionPlan};
use futures::StreamExt;

mod history;
mod insert;
mod merge;
mod rows_exec;
mod versions;

use history::History;
use insert::insert_scd1;
pub use merge::merge;
pub use rows_exec::DmlRowsExec;
use rows_exec::{Prepare, Statement};

use crate::fit::FIT;
use crate::fold::columns::{
    Kind, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE, GROUP_SEQ_PREFIX,
    KIND_COL, SEQ_COL, WRITTEN_AT_COL,
};
use crate::fold::count;
use crate::physical::{CdcCommitExec, CdcWriteExec};
use crate::pipeline::{deletion_vector_budget, find_superseded, write_request};
use crate::raise::RAISE;
use crate::spec::resolve::written_at_value;
use crate::spec::sequence_groups;
use crate::spec::{FlowSpec, ScdType};
use crate::table::bucket::bucket_array;
use crate::table::bucket::BUCKET_COL;
use crate::table::commit::{ChangeFeed, EditKind, OutcomeSlot, StatementCommit};
use crate::table::deletion_vectors::KeySet;
use crate::table::event::Operation;
use crate::table::provider::TargetDml;
use crate::table::superseded::Superseded;
use crate::table::ScdTable;

/// The physical plan of an SCD 1 statement: its rows, prepared by
/// `prepare` when the plan runs (from `input`, an `INSERT`'s rows, if any),
/// written and committed; yields the `count` of rows it affected.
///
/// ```text
///   ProjectionExec: count   ◄ CdcCommitExec ◄ CdcWriteExec ◄ DmlRowsExec [◄ input]
/// ```
fn statement_plan(
    table: Arc<ScdTable>,
    state: &SessionState,
    statement: &'static str,
    (kind, operation): (EditKind, Operation),
    input: Option<Arc<dyn ExecutionPlan>>,
    prepare: Prepare,
) -> Result<Arc<dyn ExecutionPlan>> {
    let flow = keyed_flow(&table, statement)?;
    let keys = key_positions(&table, &flow)?;
    let slot = OutcomeSlot::default();
    let rows = Arc::new(DmlRowsExec::new(
        statement,
        Arc::clone(&table),
        state.clone(),
        prepare,
        input,
        Arc::clone(&slot),
    ));
    let request = write_request(&table, statement, keys, ChangeFeed::Files);
    let write = Arc::new(CdcWriteExec::try_new(Arc::new(request), rows)?.for_statement(slot));
    let commit = StatementCommit::new(table, statement, kind, operation);
    let commit = Arc::new(CdcCommitExec::statement(Arc::new(commit), write));
    let schema = commit.schema();
    let affected = physical::binary(
        physical::col(count::UPSERTED, &schema)?,
        Operator::Plus,
        physical::col(count::DELETED, &schema)?,
        &schema,
    )?;
    let count = physical::cast(affected, &schema, DataType::UInt64)?;
    Ok(Arc::new(ProjectionExec::try_new(
        vec![(count, "count".to_string())],
        commit,
    )?))
}

/// The plan of a statement that affected `count` rows: `plan`, which makes
/// its commit, yielding `count` (`None`: nothing to commit).
fn counted(plan: Option<Arc<dyn ExecutionPlan>>, count: u64) -> Result<Arc<dyn ExecutionPlan>> {
    let count: Arc<dyn PhysicalExpr> = Arc::new(Literal::new(ScalarValue::UInt64(Some(count))));
    let plan = match plan {
        Some(plan) => plan,
        None => Arc::new(PlaceholderRowExec::new(Arc::new(Schema::empty()))),
    };
    Ok(Arc::new(ProjectionExec::try_new(
        vec![(count, "count".to_string())],
        plan,
    )?))
}

fn session_state(state: &dyn datafusion::catalog::Session) -> Result<SessionState> {
    state
        .as_any()
        .downcast_ref::<SessionState>()
        .cloned()
        .ok_or_else(|| {
            DataFusionError::NotImplemented(
                "DML on streaming tables needs a DataFusion SessionState".into(),
            )
        })
}

/// The flow that defines a table's keys (DML needs them).
fn keyed_flow(table: &ScdTable, statement: &str) -> Result<FlowSpec> {
    let meta = table.meta();
    meta.flows.into_values().next().ok_or_else(|| {
        let name = table.name();
        // (a rejects table holds rows, written by its target's updates: its
        // name and columns tell it)
        let rejects_columns = meta
            .user_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .eq(crate::table::rejects::REJECTS_COLUMNS
                .iter()
                .map(|(c, _)| *c));
        let rejects_of = name
            .table
            .strip_suffix(crate::table::rejects::REJECTS_SUFFIX)
            .filter(|_| rejects_columns);
        match rejects_of {
            Some(target) => DataFusionError::Plan(format!(
                "{statement} on streaming table '{name}': it is the rejects table of \
                 '{target}', appended to by its updates only; it takes no DML"
            )),
            None => DataFusionError::Plan(format!(
                "{statement} on streaming table '{name}': it has no flow yet, so its keys are \
                 unknown"
            )),
        }
    })
}

/// Positions of the table's key columns, in the table's column order (the
/// order every flow buckets and compares them in, whatever its KEYS order).
fn key_positions(table: &ScdTable, flow: &FlowSpec) -> Result<Vec<usize>> {
    let meta = table.meta();
    let mut positions = flow
        .keys
        .iter()
        .map(|k| {
            meta.user_column(k).ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "key column '{k}' is not a column of '{}'",
                    table.name()
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    positions.sort_unstable();
    positions.dedup();
    Ok(positions)
}

/// BITEMPORAL targets take `DELETE` (erasure) only: their rows are beliefs
/// over system time, written by their flows.
fn refuse_on_bitemporal(table: &ScdTable, statement: &str) -> Result<()> {
    if table.meta().stored_as == Some(ScdType::Bitemporal) {
        return Err(DataFusionError::NotImplemented(format!(
            "{statement} on streaming table '{}' (BITEMPORAL) is not supported: its rows are \
             beliefs over system time, written by its flows; DELETE erases whole keys",
            table.name()
        )));
    }
    Ok(())
}

/// Columns of the data files, in order (the table schema without the bucket).
fn file_columns(table: &ScdTable) -> Vec<String> {
    table
        .raw_provider()
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| n != BUCKET_COL)
        .collect()
}

fn column(name: &str) -> Expr {
    Expr::Column(Column::new_unqualified(name))
}

/// Columns named exactly `names` (a join's keys: a `String` would be read
/// as SQL, `"userId"` folded to `userid` and `a.b` split at the dot).
fn unqualified(names: &[String]) -> Vec<Column> {
    names.iter().map(Column::new_unqualified).collect()
}

/// `WHERE` filters as one predicate that is false where they are NULL.
fn predicate(filters: Vec<Expr>) -> Expr {
    let filter = filters
        .into_iter()
        .map(unnormalize_col)
        .reduce(Expr::and)
        .unwrap_or(lit(true));
    coalesce(vec![filter, lit(false)])
}

/// Live rows of the data files that `filters` match.
fn matching(filters: Vec<Expr>) -> Expr {
    col(KIND_COL)
        .eq(lit(Kind::Upsert as i8))
        .and(predicate(filters))
}

/// Rows collected once (an `INSERT`'s, the few a statement changes): how
/// many, and a table of them.
struct InsertedRows {
    count: u64,
    rows: Arc<MemTable>,
}

impl InsertedRows {
    async fn collect(input: Arc<dyn ExecutionPlan>, state: &SessionState) -> Result<Self> {
        let schema = input.schema();
        let batches = collect(input, state.task_ctx()).await?;
        let count = batches.iter().map(|b| b.num_rows() as u64).sum();
        Ok(Self {
            count,
            rows: Arc::new(MemTable::try_new(schema, vec![batches])?),
        })
    }

    fn scan(&self) -> Result<LogicalPlanBuilder> {
        LogicalPlanBuilder::scan(
            "__cdc_insert",
            provider_as_source(Arc::clone(&self.rows) as _),
            None,
        )
    }
}

/// What an SCD 1 statement writes, in the data file layout: `changed`, the
/// new row of every key it affects and its change data feed rows; `kept`,
/// the stored rows of every other key.
#[derive(Clone)]
struct StatementRows {
    changed: LogicalPlan,
    kept: LogicalPlan,
}

/// How a statement replaces the stored rows of the keys it affects.
#[derive(Clone)]
enum Replacing {
    /// Their rows were found by key ([`Superseded`]): the statement writes
    /// `changed` and retires those rows with deletion vectors.
    Found(Arc<Superseded>),
    /// `changed` is read up to this many keys, then the stored rows of its
    /// keys are found and retired with deletion vectors; past it, as
    /// [`Replacing::Rewrite`].
    UpTo(usize),
    /// The table is rewritten from `kept` and `changed`.
    Rewrite,
    /// No stored row is replaced: `changed` is written, and that is all (an
    /// `INSERT` into a table without keys).
    Nothing,
}

/// The rows a small statement changes, held until written: at most one
/// data row per key it affects, so at most its deletion-vector budget of
/// data rows (and their change rows).
struct ChangedRows {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    /// The key columns of the data rows (not the change rows).
    keys: Vec<RecordBatch>,
}

impl ChangedRows {
    /// The rows of `stream`, or `None` once it has more than `budget` data
    /// rows (the statement then rewrites the table).
    async fn collect(
        mut stream: SendableRecordBatchStream,
        key_indices: &[usize],
        budget: usize,
    ) -> Result<Option<Self>> {
        let schema = stream.schema();
        let kind = schema.index_of(KIND_COL)?;
        let (mut batches, mut keys, mut data_rows) = (Vec::new(), Vec::new(), 0);
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let kinds = batch.column(kind).as_primitive::<Int8Type>();
            let data = BooleanArray::from_unary(kinds, |k| k < CHANGE_INSERT);
            data_rows += data.true_count();
            if data_rows > budget {
                return Ok(None);
            }
            if data.true_count() > 0 {
                keys.push(filter_record_batch(&batch.project(key_indices)?, &data)?);
            }
            batches.push(batch);
        }
        Ok(Some(Self {
            schema,
            batches,
            keys,
        }))
    }

    /// The rows as a stream, for the writer.
    fn stream(&self) -> SendableRecordBatchStream {
        let batches: Vec<Result<RecordBatch>> = self.batches.iter().cloned().map(Ok).collect();
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            futures::stream::iter(batches),
        ))
    }
}

async fn count(state: &SessionState, plan: LogicalPlan) -> Result<u64> {
    let batches = collect(state.create_physical_plan(&plan).await?, state.task_ctx()).await?;
    Ok(batches.iter().map(|b| b.num_rows() as u64).sum())
}

/// An `UPDATE` or `DELETE` (SCD 1): every stored row matching `hit` becomes
/// its `edit`'s state row, with one change data feed row per image of each
/// one it changes; `named_keys`: the keys its `WHERE` names, if any. The
/// statement affects the rows it changes.
async fn rewrite_rows(
    table: Arc<ScdTable>,
    state: SessionState,
    edit: Edit,
    hit: Expr,
    named_keys: Option<RecordBatch>,
    kind: EditKind,
) -> Result<Statement> {
    let Edit {
        state_rows,
        images,
        changes,
    } = edit;
    let changed_hit = match changes {
        Some(changes) => hit.clone().and(changes),
        None => hit.clone(),
    };
    // few matching rows are found by their keys — the keys the `WHERE`
    // names, or else those of the rows it matches (only the columns of the
    // predicate are read to find those) — then read by position and
    // retired with deletion vectors; more rewrite the table
    let found = match deletion_vector_budget(&state, &table).await? {
        Some(budget) => match named_keys {
            Some(keys) if keys.num_rows() <= budget => {
                Some(find_keys(&table, &state, vec![keys]).await?)
            }
            _ => find_matching(&table, &state, &hit, budget).await?,
        },
        None => None,
    };
    let (hits, replacing, matching) = match found {
        Some(found) => {
            // (read once, by position: the new rows and every change image
            // are projections of them)
            let rows = read_found(&table, &state, &found).await?;
            let hits = count(&state, rows.scan()?.filter(changed_hit.clone())?.build()?).await?;
            (hits, Replacing::Found(Arc::new(found)), Some(rows))
        }
        None => {
            let all = raw_plan(&table)?.filter(changed_hit.clone())?.build()?;
            (count(&state, all).await?, Replacing::Rewrite, None)
        }
    };
    let matching_rows = matching;
    let matching = || -> Result<LogicalPlanBuilder> {
        match &matching_rows {
            Some(rows) => rows.scan()?.filter(hit.clone()),
            None => raw_plan(&table)?.filter(hit.clone()),
        }
    };
    let (upserted, deleted) = match kind {
        EditKind::Delete => (0, hits),
        _ => (hits, 0),
    };
    // the new rows of the matching keys, and their change rows
    let mut changed = matching()?.project(state_rows)?;
    for image in images {
        let rows = matching()?.filter(changed_hit.clone())?.project(image)?;
        changed = changed.union(rows.build()?)?;
    }
    let columns: Vec<Expr> = file_columns(&table).iter().map(|c| column(c)).collect();
    if let Some(rows) = &matching_rows {
        // rows found by a key the `WHERE` names that it does not match are
        // retired too: they are written again as they are
        changed = changed.union(
            rows.scan()?
                .filter(Expr::Not(Box::new(hit.clone())))?
                .project(columns.clone())?
                .build()?,
        )?;
    }
    let kept = raw_plan(&table)?
        .filter(Expr::Not(Box::new(hit.clone())))?
        .project(columns)?
        .build()?;
    let rows = StatementRows {
        changed: changed.build()?,
        kept,
    };
    Ok(Statement {
        rows,
        replacing,
        upserted,
        deleted,
    })
}

/// The stored rows that `hit` matches, when there are at most `budget`:
/// their keys are read (only the columns `hit` needs are decoded), then
/// their rows found by key in the files of their buckets.
async fn find_matching(
    table: &ScdTable,
    state: &SessionState,
    hit: &Expr,
    budget: usize,
) -> Result<Option<Superseded>> {
    let flow = keyed_flow(table, "DML")?;
    let user = table.meta().user_schema;
    let names: Vec<String> = key_positions(table, &flow)?
        .into_iter()
        .map(|i| user.field(i).name().clone())
        .collect();
    // (plain Parquet scans of the data files: planned without reading more
    // of the Delta log than the file list)
    let stored = Arc::new(table.plain_files().await?);
    let plan =
        LogicalPlanBuilder::scan(table.name().table.clone(), provider_as_source(stored), None)?
            .filter(hit.clone())?
            .project(names.iter().map(|n| column(n)))?
            .limit(0, Some(budget + 1))?
            .build()?;
    let physical = state.create_physical_plan(&plan).await?;
    let schema = physical.schema();
    let mut keys = collect(physical, state.task_ctx()).await?;
    let count: usize = keys.iter().map(RecordBatch::num_rows).sum();
    if count > budget {
        return Ok(None);
    }
    // (no key: a set of none, which finds nothing in no bucket)
    keys.push(RecordBatch::new_empty(schema));
    Ok(Some(find_keys(table, state, keys).await?))
}

/// The stored rows of the keys `keys` (batches of the key columns, at least
/// one), found in the files of their buckets.
async fn find_keys(
    table: &ScdTable,
    state: &SessionState,
    keys: Vec<RecordBatch>,
) -> Result<Superseded> {
    let mut touched = Vec::new();
    for batch in &keys {
        let buckets = bucket_array(batch.columns(), batch.num_rows(), table.meta().buckets)?;
        touched.extend(buckets.values().iter().copied());
    }
    touched.sort_unstable();
    touched.dedup();
    let names = match keys.first() {
        Some(batch) => batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect(),
        None => Vec::new(),
    };
    let keys = Arc::new(KeySet::try_new(names, &keys)?);
    find_superseded(state, table, keys, &touched).await
}

/// The stored rows `found` located, as a scan reading them by position.
fn found_scan(
    table: &ScdTable,
    state: &SessionState,
    found: &Superseded,
) -> Result<LogicalPlanBuilder> {
    let provider = found.provider(
        &table.delta().object_store(),
        table.raw_provider().schema(),
        state.config().target_partitions(),
    )?;
    LogicalPlanBuilder::scan(
        table.name().table.clone(),
        provider_as_source(provider),
        None,
    )
}

/// The stored rows `found` located, read (by position) into memory.
async fn read_found(
    table: &ScdTable,
    state: &SessionState,
    found: &Superseded,
) -> Result<InsertedRows> {
    let plan = found_scan(table, state, found)?.build()?;
    InsertedRows::collect(state.create_physical_plan(&plan).await?, state).await
}

/// The values the key of `table` takes in the rows `filters` can match,
/// when they name them: a conjunct `key = v` or `key IN (v, …)` of a
/// single-column key, as a batch of that column (`None`: they do not).
fn named_keys(table: &ScdTable, filters: &[Expr]) -> Result<Option<RecordBatch>> {
    let flow = keyed_flow(table, "DML")?;
    let positions = key_positions(table, &flow)?;
    let [position] = positions.as_slice() else {
        return Ok(None);
    };
    let user = table.meta().user_schema;
    let field = user.field(*position);
    let is_key = |e: &Expr| matches!(e, Expr::Column(c) if c.name == *field.name());
    let literal = |e: &Expr| match e {
        Expr::Literal(value, _) => value.cast_to(field.data_type()).ok(),
        _ => None,
    };
    for conjunct in filters.iter().flat_map(split_conjunction) {
        let values: Option<Vec<ScalarValue>> = match conjunct {
            Expr::BinaryExpr(b) if b.op == Operator::Eq && is_key(&b.left) => {
                literal(&b.right).map(|v| vec![v])
            }
            Expr::BinaryExpr(b) if b.op == Operator::Eq && is_key(&b.right) => {
                literal(&b.left).map(|v| vec![v])
            }
            Expr::InList(list) if !list.negated && is_key(&list.expr) => {
                list.list.iter().map(literal).collect()
            }
            _ => None,
        };
        let Some(values) = values else { continue };
        // (a NULL key matches nothing)
        let values: Vec<ScalarValue> = values.into_iter().filter(|v| !v.is_null()).collect();
        let array = if values.is_empty() {
            arrow::array::new_empty_array(field.data_type())
        } else {
            ScalarValue::iter_to_array(values)?
        };
        let schema = Arc::new(Schema::new(vec![field.as_ref().clone()]));
        return Ok(Some(RecordBatch::try_new(schema, vec![array])?));
    }
    Ok(None)
}

/// The data-file rows DML writes for keys that were not live (`INSERT`,
/// `MERGE ... WHEN NOT MATCHED`): their values, the sequence of the key's
/// tombstone or else the least one (older than any event), written now.
struct NewRows {
    /// Data-file columns and their types.
    columns: Vec<(String, DataType)>,
    /// The least sequence, typed.
    least: Expr,
    /// `__cdc_written_at` of the statement.
    now: datafusion::common::ScalarValue,
}

impl NewRows {
    /// For `table`; `refuse` words the error of a sequence type without a
    /// least value.
    fn new(
        table: &ScdTable,
        state: &SessionState,
        refuse: impl Fn(String) -> DataFusionError,
    ) -> Result<Self> {
        let raw_schema = table.raw_provider().schema();
        let columns = file_columns(table)
            .into_iter()
            .map(|c| {
                let data_type = raw_schema.field_with_name(&c)?.data_type().clone();
                Ok((c, data_type))
            })
            .collect::<Result<Vec<_>>>()?;
        let seq_type = raw_schema.field_with_name(SEQ_COL)?.data_type().clone();
        let least = least_sequence(&seq_type).ok_or_else(|| {
            refuse(format!(
                "its sequence type {seq_type} has no least value to give rows of keys without a tombstone"
            ))
        })?;
        Ok(Self {
            columns,
            least: cast(lit(least), seq_type),
            now: written_at_value(crate::clock::now(state.config()).timestamp_micros()),
        })
    }

    /// The projection of a row of kind `kind` (live, or a change kind):
    /// `tombstone_seq` is its key's tombstone sequence (NULL without one),
    /// `value(c)` its value of the user column `c` (`None`: not a user column).
    fn projection(
        &self,
        kind: i8,
        tombstone_seq: Expr,
        value: impl Fn(&str) -> Option<Expr>,
    ) -> Vec<Expr> {
        self.columns
            .iter()
            .map(|(c, data_type)| {
                let e = match c.as_str() {
                    // (a row written by DML counts as written at its
                    // sequence in every column: per-column sequencing)
                    SEQ_COL => coalesce(vec![tombstone_seq.clone(), self.least.clone()]),
                    c if c.starts_with(GROUP_SEQ_PREFIX) => {
                        coalesce(vec![tombstone_seq.clone(), self.least.clone()])
                    }
                    KIND_COL => lit(kind),
                    WRITTEN_AT_COL => lit(self.now.clone()),
                    c => value(c).unwrap_or(lit(datafusion::common::ScalarValue::Null)),
                };
                cast(e, data_type.clone()).alias(c)
            })
            .collect()
    }
}

/// The least value of a sequence type: the sequence of a row written by DML
/// for a key without a tombstone, older than any event.
fn least_sequence(seq_type: &DataType) -> Option<datafusion::common::ScalarValue> {
    match seq_type {
        DataType::Utf8 => Some(datafusion::common::ScalarValue::Utf8(Some(String::new()))),
        DataType::LargeUtf8 => Some(datafusion::common::ScalarValue::LargeUtf8(Some(
            String::new(),
        ))),
        DataType::Utf8View => Some(datafusion::common::ScalarValue::Utf8View(Some(
            String::new(),
        ))),
        // (a STRUCT orders by its fields in turn: the least of each)
        DataType::Struct(fields) => {
            let children = fields
                .iter()
                .map(|f| least_sequence(f.data_type())?.to_array().ok())
                .collect::<Option<Vec<_>>>()?;
            let array = arrow::array::StructArray::try_new(fields.clone(), children, None).ok()?;
            Some(datafusion::common::ScalarValue::Struct(Arc::new(array)))
        }
        t => datafusion::common::ScalarValue::min(t),
    }
}

fn raw_plan(table: &ScdTable) -> Result<LogicalPlanBuilder> {
    LogicalPlanBuilder::scan(
        table.name().table.clone(),
        provider_as_source(table.raw_provider()),
        None,
    )
}

/// The rows an SCD 1 `UPDATE` or `DELETE` writes, as projections of the
/// stored rows over the data file `columns` of the table (`hit`: whether
/// the statement matches a row).
struct Edit {
    /// Every matching row's new state.
    state_rows: Vec<Expr>,
    /// One change data feed row per image.
    images: Vec<Vec<Expr>>,
    /// Whether a matching row changes (an `UPDATE` that sets a row's
    /// values to what they were changes nothing: no feed rows, not counted,
    /// SPEC §4); `None`: every matching row does.
    changes: Option<Expr>,
}

type Projections = dyn Fn(&ScdTable, &Expr, &[String]) -> Result<Edit> + Send + Sync;

/// How an SCD 1 `UPDATE` or `DELETE` (`kind`) of the rows `filters` match
/// is prepared when it runs: the keys its `WHERE` names, its projections.
fn rewriting(
    table: &Arc<ScdTable>,
    state: &SessionState,
    filters: Vec<Expr>,
    kind: EditKind,
    projections: Arc<Projections>,
) -> Prepare {
    let (table, state) = (Arc::clone(table), state.clone());
    Arc::new(move |_| {
        let (table, state) = (Arc::clone(&table), state.clone());
        let (filters, projections) = (filters.clone(), Arc::clone(&projections));
        Box::pin(async move {
            let named = named_keys(&table, &filters)?;
            let hit = matching(filters);
            let columns = file_columns(&table);
            let edit = projections(&table, &hit, &columns)?;
            rewrite_rows(table, state, edit, hit, named, kind).await
        })
    })
}

/// The update pipeline's DML: what [`ScdTable`]'s `TableProvider` hooks call.
#[derive(Debug, Default)]
pub struct PipelineDml;

#[async_trait]
impl TargetDml for PipelineDml {
    /// `DELETE FROM t [WHERE ...]` (SCD 1): live rows become tombstones.
    async fn delete(
        &self,
        table: Arc<ScdTable>,
        state: &dyn datafusion::catalog::Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if table.meta().stored_as != Some(ScdType::Type1) {
            let history = History::new(table, "DELETE")?;
            let state = session_state(state)?;
            let (plan, count) = versions::delete(history, state, filters).await?;
            return counted(plan, count);
        }
        keyed_flow(&table, "DELETE")?;
        let state = session_state(state)?;
        let now = written_at_value(crate::clock::now(state.config()).timestamp_micros());
        let prepare = rewriting(
            &table,
            &state,
            filters,
            EditKind::Delete,
            Arc::new(move |_, hit, columns| {
                let state_rows: Vec<Expr> = columns
                    .iter()
                    .map(|c| match c.as_str() {
                        KIND_COL => when(hit.clone(), lit(Kind::Delete as i8))
                            .otherwise(column(c))
                            .map(|e| e.alias(c)),
                        WRITTEN_AT_COL => when(hit.clone(), lit(now.clone()))
                            .otherwise(column(c))
                            .map(|e| e.alias(c)),
                        _ => Ok(column(c)),
                    })
                    .collect::<Result<_>>()?;
                let change_rows: Vec<Expr> = columns
                    .iter()
                    .map(|c| {
                        if c == KIND_COL {
                            lit(CHANGE_DELETE).alias(c)
                        } else {
                            column(c)
                        }
                    })
                    .collect();
                Ok(Edit {
                    state_rows,
                    images: vec![change_rows],
                    changes: None,
                })
            }),
        );
        statement_plan(
            table,
            &state,
            "DELETE",
            (EditKind::Delete, Operation::Delete),
            None,
            prepare,
        )
    }

    /// `UPDATE t SET ... [WHERE ...]` (SCD 1): live rows change in place.
    async fn update(
        &self,
        table: Arc<ScdTable>,
        state: &dyn datafusion::catalog::Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if table.meta().stored_as != Some(ScdType::Type1) {
            refuse_on_bitemporal(&table, "UPDATE")?;
            let history = History::new(table, "UPDATE")?;
            let state = session_state(state)?;
            let (plan, count) = versions::update(history, state, assignments, filters).await?;
            return counted(plan, count);
        }
        let flow = keyed_flow(&table, "UPDATE")?;
        let keys = key_positions(&table, &flow)?;
        let user = table.meta().user_schema;
        // (the new values are read more than once: the stored row, its
        // change images, whether it changed; a volatile one would differ)
        // (a value check, `autocdc_raise` or `autocdc_fit`, is volatile only
        // so that no optimizer moves it: it gives the value or fails, each
        // time alike)
        let volatile = |e: &Expr| {
            e.exists(|e| {
                Ok(matches!(e, Expr::ScalarFunction(f)
                    if f.func.name() != RAISE && f.func.name() != FIT
                        && f.func.signature().volatility == Volatility::Volatile))
            })
        };
        if let Some((name, _)) = assignments
            .iter()
            .find(|(_, e)| volatile(e).unwrap_or(true))
        {
            return Err(DataFusionError::Plan(format!(
                "UPDATE of streaming table '{}': the value of '{name}' is volatile \
                 (random(), uuid(), …), and the stored row and its change feed would \
                 each see another: compute it in a source and MERGE it in",
                table.name()
            )));
        }
        for (name, _) in &assignments {
            if keys.iter().any(|&k| user.field(k).name() == name) {
                return Err(DataFusionError::Plan(format!(
                    "UPDATE of streaming table '{}': key column '{name}' cannot be assigned",
                    table.name()
                )));
            }
        }
        // per-column sequencing: the groups it assigns count as written at
        // the row's sequence
        let names: Vec<String> = user.fields().iter().map(|f| f.name().clone()).collect();
        let written_groups: Vec<String> =
            match sequence_groups::declared(&table.name().to_string(), &table.meta().properties)? {
                Some(declared) => sequence_groups::resolve(&flow.name, &declared, &names, &keys)?
                    .into_iter()
                    .filter(|g| {
                        g.members
                            .iter()
                            .any(|&c| assignments.iter().any(|(n, _)| n == &names[c]))
                    })
                    .map(|g| g.state_column())
                    .collect(),
                None => Vec::new(),
            };
        let state = session_state(state)?;
        let prepare = rewriting(
            &table,
            &state,
            filters,
            EditKind::Update,
            Arc::new(move |table, hit, columns| {
                let raw_schema = table.raw_provider().schema();
                let assigned = |c: &str| {
                    assignments
                        .iter()
                        .find(|(n, _)| n == c)
                        .map(|(_, e)| unnormalize_col(e.clone()))
                };
                let new_value = |c: &str| -> Result<Expr> {
                    Ok(match assigned(c) {
                        Some(e) => cast(e, raw_schema.field_with_name(c)?.data_type().clone()),
                        None => column(c),
                    })
                };
                // whether a matching row changes: a row set to what it holds
                // (NULL to NULL, 0.0 to -0.0 too) stays exactly as it was
                let changes = assignments
                    .iter()
                    .map(|(c, _)| {
                        Ok(Expr::BinaryExpr(BinaryExpr::new(
                            Box::new(new_value(c)?),
                            Operator::IsDistinctFrom,
                            Box::new(column(c)),
                        )))
                    })
                    .collect::<Result<Vec<_>>>()?
                    .into_iter()
                    .reduce(Expr::or)
                    // (every column set to itself, `SET v = v`, which the
                    // plan shows as no assignment: no row changes)
                    .or(Some(lit(false)));
                let changed = match &changes {
                    Some(changes) => hit.clone().and(changes.clone()),
                    None => hit.clone(),
                };
                let state_rows: Vec<Expr> = columns
                    .iter()
                    .map(|c| match assigned(c) {
                        Some(_) => Ok(when(changed.clone(), new_value(c)?)
                            .otherwise(column(c))?
                            .alias(c)),
                        None if written_groups.contains(c) => {
                            Ok(when(changed.clone(), column(SEQ_COL))
                                .otherwise(column(c))?
                                .alias(c))
                        }
                        None => Ok(column(c)),
                    })
                    .collect::<Result<_>>()?;
                let image = |kind: i8, new: bool| -> Result<Vec<Expr>> {
                    columns
                        .iter()
                        .map(|c| {
                            Ok(if c == KIND_COL {
                                lit(kind).alias(c)
                            } else if new {
                                new_value(c)?.alias(c)
                            } else {
                                column(c)
                            })
                        })
                        .collect()
                };
                let images = vec![
                    image(CHANGE_PREIMAGE, false)?,
                    image(CHANGE_POSTIMAGE, true)?,
                ];
                Ok(Edit {
                    state_rows,
                    images,
                    changes,
                })
            }),
        );
        statement_plan(
            table,
            &state,
            "UPDATE",
            (EditKind::Update, Operation::Update),
            None,
            prepare,
        )
    }

    /// `INSERT INTO t ...`: SCD 1 rows become live rows of new keys; SCD 2
    /// rows become events folded into history.
    async fn insert(
        &self,
        table: Arc<ScdTable>,
        state: &dyn datafusion::catalog::Session,
        input: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if table.meta().stored_as == Some(ScdType::Type1) {
            let flow = keyed_flow(&table, "INSERT")?;
            let state = session_state(state)?;
            let (this, planning) = (Arc::clone(&table), state.clone());
            let prepare: Prepare = Arc::new(move |input| {
                let (table, state, flow) = (Arc::clone(&this), planning.clone(), flow.clone());
                Box::pin(async move {
                    let input = input.ok_or_else(|| {
                        DataFusionError::Internal("INSERT without its rows".into())
                    })?;
                    insert_scd1(table, state, input, flow).await
                })
            });
            return statement_plan(
                table,
                &state,
                "INSERT",
                (EditKind::Overwrite, Operation::Insert),
                Some(input),
                prepare,
            );
        }
        refuse_on_bitemporal(&table, "INSERT")?;
        let history = History::new(table, "INSERT")?;
        let state = session_state(state)?;
        let (plan, count) = versions::insert(history, state, input).await?;
        counted(plan, count)
    }
}
