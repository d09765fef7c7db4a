//! `DmlRowsExec`: the rows an SCD 1 DML statement writes, and the stored
//! rows they replace.
//!
//! ```text
//!   CdcCommitExec ── one commit: the written files, the retired rows, the
//!        ▲            statement's event (Delta UPDATE / DELETE / WRITE)
//!        │ manifest
//!   CdcWriteExec ─── data and change files of the rows
//!        ▲ rows in the data file layout; then the outcome (counts, retired rows)
//!   DmlRowsExec ──── prepares the statement (an INSERT's rows are its input),
//!        ▲           then replaces the stored rows of the keys it changes:
//!     [input]          few keys  → found by key, retired with deletion vectors
//!                      more      → every data file rewritten
//! ```
//!
//! The choice needs data (how many keys the statement changes), so the
//! operator makes it when it runs and reports it in its metrics; the
//! stored rows it retires reach the commit through the writer's manifest
//! ([`crate::table::manifest`]). Nothing is visible before the commit.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::session_state::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    execute_stream, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};

use super::{find_keys, key_positions, keyed_flow, ChangedRows, Replacing, StatementRows};
use crate::fold::FoldCounts;
use crate::table::bucket::BUCKET_COL;
use crate::table::commit::{OutcomeSlot, Retired, StatementOutcome};
use crate::table::stored_rows::conform;
use crate::table::ScdTable;

/// An SCD 1 statement ready to write: its rows, how they replace the
/// stored ones, and its counts.
#[derive(Clone)]
pub(super) struct Statement {
    pub(super) rows: StatementRows,
    pub(super) replacing: Replacing,
    /// Rows the statement inserts or updates.
    pub(super) upserted: u64,
    /// Rows the statement deletes.
    pub(super) deleted: u64,
}

/// Prepares a statement when its operator runs, from the operator's input
/// (an `INSERT`'s rows) if it has one.
pub(super) type Prepare = Arc<
    dyn Fn(Option<Arc<dyn ExecutionPlan>>) -> BoxFuture<'static, Result<Statement>> + Send + Sync,
>;

/// The rows of an SCD 1 DML statement (see the module docs).
pub struct DmlRowsExec {
    statement: &'static str,
    table: Arc<ScdTable>,
    state: SessionState,
    prepare: Prepare,
    input: Option<Arc<dyn ExecutionPlan>>,
    outcome: OutcomeSlot,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for DmlRowsExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmlRowsExec")
            .field("statement", &self.statement)
            .field("target", &self.table.name().to_string())
            .finish()
    }
}

impl DmlRowsExec {
    /// The rows of `statement` on `table`, prepared by `prepare` (from
    /// `input`, if any) when the operator runs; the outcome is left in
    /// `outcome` for the writer.
    pub(super) fn new(
        statement: &'static str,
        table: Arc<ScdTable>,
        state: SessionState,
        prepare: Prepare,
        input: Option<Arc<dyn ExecutionPlan>>,
        outcome: OutcomeSlot,
    ) -> Self {
        let raw = table.raw_provider().schema();
        let schema = Arc::new(Schema::new(
            raw.fields()
                .iter()
                .filter(|f| f.name() != BUCKET_COL)
                .cloned()
                .collect::<Vec<_>>(),
        ));
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            statement,
            table,
            state,
            prepare,
            input,
            outcome,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

/// Metrics of [`DmlRowsExec`].
#[derive(Debug, Clone)]
struct RowsMetrics {
    /// Rows passed to the writer (data and change rows).
    rows: Count,
    /// Stored data files retired: removed, or marked with deletion vectors.
    files_retired: Count,
    /// 1 when the statement rewrote every data file, 0 when it retired the
    /// rows of its keys with deletion vectors.
    rewrite: Gauge,
    /// Time to prepare the statement and find the rows it replaces.
    prepare_time: Time,
}

impl RowsMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        let m = || MetricBuilder::new(metrics);
        Self {
            rows: m().output_rows(0),
            files_retired: m().counter("num_files_retired", 0),
            rewrite: m().gauge("rewrite", 0),
            prepare_time: m().subset_time("prepare_time", 0),
        }
    }
}

impl DisplayAs for DmlRowsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "DmlRowsExec: statement={}, target={}",
                self.statement,
                self.table.name()
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "statement={}", self.statement)?;
                write!(f, "target={}", self.table.name())
            }
        }
    }
}

impl ExecutionPlan for DmlRowsExec {
    fn name(&self) -> &str {
        "DmlRowsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.input.iter().collect()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != self.input.iter().count() {
            return Err(DataFusionError::Internal(format!(
                "DmlRowsExec takes {} children, got {}",
                self.input.iter().count(),
                children.len()
            )));
        }
        Ok(Arc::new(Self::new(
            self.statement,
            Arc::clone(&self.table),
            self.state.clone(),
            Arc::clone(&self.prepare),
            children.into_iter().next(),
            Arc::clone(&self.outcome),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "DmlRowsExec has one partition, got {partition}"
            )));
        }
        let metrics = RowsMetrics::new(&self.metrics);
        let (table, state) = (Arc::clone(&self.table), self.state.clone());
        let (prepare, input) = (Arc::clone(&self.prepare), self.input.clone());
        let (slot, schema) = (Arc::clone(&self.outcome), Arc::clone(&self.schema));
        let rows = async move {
            let timer = metrics.prepare_time.timer();
            let statement = prepare(input).await?;
            let (rows, retired) =
                replace(&table, &state, statement.rows, statement.replacing).await?;
            timer.done();
            metrics.files_retired.add(retired.retired.files());
            metrics.rewrite.set(usize::from(retired.rewrite));
            let outcome = StatementOutcome {
                counts: FoldCounts {
                    input_rows: (statement.upserted + statement.deleted) as usize,
                    upserted: statement.upserted as usize,
                    deleted: statement.deleted as usize,
                    ..Default::default()
                },
                retired: retired.retired,
            };
            *slot
                .lock()
                .map_err(|_| DataFusionError::Internal("poisoned statement outcome".into()))? =
                Some(outcome);
            // (the statement's projections may type a column otherwise
            // than the files: cast, when they do)
            let same = rows.schema().fields() == schema.fields();
            let (schema, counted) = (Arc::clone(&schema), metrics.rows.clone());
            let no_partition = HashMap::new();
            Ok::<_, DataFusionError>(rows.map(move |batch| {
                let batch = match batch? {
                    batch if same => batch,
                    batch => conform(&batch, &schema, &no_partition)?,
                };
                counted.add(batch.num_rows());
                Ok(batch)
            }))
        };
        let stream = futures::stream::once(rows).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// The stored rows a statement retires, and whether it rewrote every file.
struct Replaced {
    retired: Retired,
    rewrite: bool,
}

/// The rows a statement writes and the stored rows they replace: with
/// deletion vectors (few keys: the table's budget) only the rows it
/// changes, so its cost follows them; else every stored row, rewritten.
async fn replace(
    table: &Arc<ScdTable>,
    state: &SessionState,
    rows: StatementRows,
    replacing: Replacing,
) -> Result<(SendableRecordBatchStream, Replaced)> {
    let run = |plan: LogicalPlan| async move {
        let physical = state.create_physical_plan(&plan).await?;
        execute_stream(physical, state.task_ctx())
    };
    let retired = |retired: Retired| Replaced {
        retired,
        rewrite: false,
    };
    match replacing {
        Replacing::Found(superseded) => {
            let replaced = Retired::rows(table, &superseded).await?;
            return Ok((run(rows.changed).await?, retired(replaced)));
        }
        Replacing::UpTo(budget) => {
            let flow = keyed_flow(table, "DML")?;
            let keys = key_positions(table, &flow)?;
            let changed = run(rows.changed.clone()).await?;
            if let Some(changed) = ChangedRows::collect(changed, &keys, budget).await? {
                let replaced = if changed.keys.iter().all(|b| b.num_rows() == 0) {
                    Retired::default()
                } else {
                    let found = find_keys(table, state, changed.keys.clone()).await?;
                    Retired::rows(table, &found).await?
                };
                return Ok((changed.stream(), retired(replaced)));
            }
        }
        Replacing::Nothing => {
            return Ok((run(rows.changed).await?, retired(Retired::default())));
        }
        Replacing::Rewrite => {}
    }
    let all = LogicalPlanBuilder::from(rows.kept)
        .union(rows.changed)?
        .build()?;
    let replaced = Replaced {
        retired: Retired::all(table).await?,
        rewrite: true,
    };
    Ok((run(all).await?, replaced))
}
