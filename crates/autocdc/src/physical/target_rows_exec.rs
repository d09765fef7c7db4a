//! `TargetRowsExec`: the stored rows an update folds with its events, as its
//! stage chose them when it ran ([`crate::table::stage`]).
//!
//! The plan of an update does not depend on its data: this operator stands
//! where its stored rows are read and, when first executed, waits for the
//! stage (running it if no other operator has), then scans what it chose —
//! every stored row, the rows of the touched buckets, or the probed rows of
//! the update's keys plus the buckets it compacts — with the projection and
//! filters pushed into it. Whole files are read as plain Parquet scans with
//! their deletion vectors applied (`StoredFilesExec`), spread over the
//! partitions; bucket filters prune whole files (the bucket is the state
//! store's partition column). Its metrics: `touched_buckets`
//! (0 when all are read), `superseded_rows`, `compacted_buckets`, `read_all`;
//! once it ran, the scan it chose is its child (`EXPLAIN ANALYZE` shows it
//! beneath it, with its metrics; `EXPLAIN` shows no child).

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{col, lit, Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::TryStreamExt;
use tokio::sync::OnceCell;

use crate::table::bucket::BUCKET_COL;
use crate::table::stage::{Replacement, UpdateStage};
use crate::table::ScdTable;

/// The stored rows of an update's target, read as its stage chooses: the
/// provider an update's plan scans.
#[derive(Debug)]
pub struct TargetRowsTable {
    stage: Arc<UpdateStage>,
    table: Arc<ScdTable>,
    schema: SchemaRef,
}

impl TargetRowsTable {
    /// The stored rows of `table` that the update of `stage` reads.
    pub fn new(stage: Arc<UpdateStage>, table: Arc<ScdTable>) -> Self {
        let schema = table.raw_provider().schema();
        Self {
            stage,
            table,
            schema,
        }
    }
}

#[async_trait]
impl TableProvider for TargetRowsTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => Arc::clone(&self.schema),
        };
        Ok(Arc::new(TargetRowsExec {
            stage: Arc::clone(&self.stage),
            table: Arc::clone(&self.table),
            projection: projection.cloned(),
            filters: filters.to_vec(),
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(schema),
                Partitioning::UnknownPartitioning(state.config().target_partitions().max(1)),
                EmissionType::Incremental,
                Boundedness::Bounded,
            )),
            scan: Arc::new(OnceCell::new()),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }
}

/// Reads the stored rows its update's stage chose (see the module docs).
#[derive(Debug)]
pub struct TargetRowsExec {
    stage: Arc<UpdateStage>,
    table: Arc<ScdTable>,
    projection: Option<Vec<usize>>,
    filters: Vec<Expr>,
    properties: Arc<PlanProperties>,
    /// The scan chosen, made once for all partitions.
    scan: Arc<OnceCell<Arc<dyn ExecutionPlan>>>,
    metrics: ExecutionPlanMetricsSet,
}

impl DisplayAs for TargetRowsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let columns = || {
            let schema = self.properties.eq_properties.schema();
            schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "TargetRowsExec: target={}, flow={}, projection=[{}]",
                self.table.name(),
                self.stage.flow(),
                columns()
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "target={}", self.table.name())?;
                write!(f, "flow={}", self.stage.flow())
            }
        }
    }
}

impl TargetRowsExec {
    /// The scan of what `replacement` says the update reads.
    async fn chosen_scan(
        table: &ScdTable,
        replacement: &Replacement,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        context: &TaskContext,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let state = SessionStateBuilder::new()
            .with_config(context.session_config().clone())
            .with_runtime_env(context.runtime_env())
            .build();
        let raw = table.raw_provider();
        // whole files: plain scans, spread over the partitions
        let files = || table.plain_files();
        let in_buckets = |buckets: &[i32]| {
            let mut filters = filters.to_vec();
            filters.push(col(BUCKET_COL).in_list(buckets.iter().map(|b| lit(*b)).collect(), false));
            filters
        };
        match (&replacement.superseded, &replacement.touched) {
            (Some(superseded), _) => {
                let rows = superseded
                    .provider(
                        &table.delta().object_store(),
                        raw.schema(),
                        state.config().target_partitions(),
                    )?
                    .scan(&state, projection, filters, None)
                    .await?;
                if replacement.compacted.is_empty() {
                    return Ok(rows);
                }
                let whole = files()
                    .await?
                    .scan(
                        &state,
                        projection,
                        &in_buckets(&replacement.compacted),
                        None,
                    )
                    .await?;
                UnionExec::try_new(vec![rows, whole])
            }
            (None, Some(touched)) => {
                files()
                    .await?
                    .scan(&state, projection, &in_buckets(touched), None)
                    .await
            }
            (None, None) => files().await?.scan(&state, projection, filters, None).await,
        }
    }
}

impl ExecutionPlan for TargetRowsExec {
    fn name(&self) -> &str {
        "TargetRowsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    /// None when planned; once it ran, the scan it chose (so that `EXPLAIN
    /// ANALYZE` shows what it read, with its metrics).
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.scan.get().into_iter().collect()
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
        // (its only child is the scan it chose, which it keeps)
        if children.len() == self.children().len() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "TargetRowsExec takes no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let partitions = self.properties.output_partitioning().partition_count();
        if partition >= partitions {
            return Err(DataFusionError::Internal(format!(
                "TargetRowsExec has {partitions} partitions, got {partition}"
            )));
        }
        let (stage, table, scan) = (
            Arc::clone(&self.stage),
            Arc::clone(&self.table),
            Arc::clone(&self.scan),
        );
        let (projection, filters) = (self.projection.clone(), self.filters.clone());
        let metrics = self.metrics.clone();
        let output_rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let stream = futures::stream::once(async move {
            let scan = scan
                .get_or_try_init(|| async {
                    let staged = stage.staged(&context).await?;
                    let chosen = &staged.replacement;
                    let m = MetricBuilder::new(&metrics);
                    m.clone()
                        .counter("touched_buckets", 0)
                        .add(chosen.touched.as_ref().map_or(0, Vec::len));
                    m.clone().counter("superseded_rows", 0).add(
                        chosen
                            .superseded
                            .as_ref()
                            .map_or(0, |s| s.num_rows() as usize),
                    );
                    m.clone()
                        .counter("compacted_buckets", 0)
                        .add(chosen.compacted.len());
                    m.counter("read_all", 0)
                        .add(usize::from(chosen.touched.is_none()));
                    Self::chosen_scan(&table, chosen, projection.as_ref(), &filters, &context).await
                })
                .await?;
            let streams = (partition..scan.output_partitioning().partition_count())
                .step_by(partitions)
                .map(|i| scan.execute(i, Arc::clone(&context)))
                .collect::<Result<Vec<_>>>()?;
            Ok::<_, DataFusionError>(futures::stream::select_all(streams))
        })
        .try_flatten()
        .inspect_ok(move |batch| output_rows.add(batch.num_rows()));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.properties.eq_properties.schema().clone(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
