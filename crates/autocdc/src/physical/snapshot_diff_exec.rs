//! `SnapshotDiffExec`: the physical form of
//! [`crate::logical::SnapshotDiffNode`].
//!
//! ```text
//!   SnapshotDiffExec (one merge per partition)
//!        ▲ partitioned by keys, sorted by (keys, side)
//!   Union(live rows tagged 0, snapshot rows tagged 1)
//! ```
//! Like a sort-merge join: DataFusion repartitions and sorts (spilling) the
//! input; the operator keeps at most one key group across batches.

use std::fmt;
use std::sync::Arc;

use arrow::compute::SortOptions;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{
    EquivalenceProperties, LexOrdering, OrderingRequirements, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::distribution_requirements::InputDistributionRequirements;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties,
};
use futures::StreamExt;

use crate::fold::snapshot_diff::{diff_output_schema, SnapshotDiff};

/// Diffs a snapshot against the target's live rows.
#[derive(Debug)]
pub struct SnapshotDiffExec {
    flow: String,
    key_indices: Vec<usize>,
    version: ScalarValue,
    written_at: ScalarValue,
    input: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl SnapshotDiffExec {
    /// Create the operator.
    pub fn new(
        flow: String,
        key_indices: Vec<usize>,
        version: ScalarValue,
        written_at: ScalarValue,
        input: Arc<dyn ExecutionPlan>,
    ) -> Self {
        let schema = diff_output_schema(
            input.schema().as_ref(),
            &version.data_type(),
            &written_at.data_type(),
        );
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            flow,
            key_indices,
            version,
            written_at,
            input,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    fn key_exprs(&self) -> Vec<Arc<dyn PhysicalExpr>> {
        let schema = self.input.schema();
        self.key_indices
            .iter()
            .map(|&i| Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>)
            .collect()
    }

    fn key_names(&self) -> Vec<String> {
        let schema = self.input.schema();
        self.key_indices
            .iter()
            .map(|&i| schema.field(i).name().clone())
            .collect()
    }
}

impl DisplayAs for SnapshotDiffExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "SnapshotDiffExec: flow={}, keys=[{}], version={}",
                self.flow,
                self.key_names().join(", "),
                self.version
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "flow={}", self.flow)?;
                write!(f, "version={}", self.version)
            }
        }
    }
}

impl ExecutionPlan for SnapshotDiffExec {
    fn name(&self) -> &str {
        "SnapshotDiffExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        InputDistributionRequirements::new(vec![Distribution::KeyPartitioned(self.key_exprs())])
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        let schema = self.input.schema();
        let asc = SortOptions {
            descending: false,
            nulls_first: true,
        };
        let side = schema.fields().len() - 1;
        let mut sort: Vec<PhysicalSortExpr> = self
            .key_exprs()
            .into_iter()
            .map(|e| PhysicalSortExpr::new(e, asc))
            .collect();
        sort.push(PhysicalSortExpr::new(
            Arc::new(Column::new(schema.field(side).name(), side)),
            asc,
        ));
        vec![LexOrdering::new(sort).map(OrderingRequirements::from)]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("SnapshotDiffExec needs one child".into()))?;
        Ok(Arc::new(Self::new(
            self.flow.clone(),
            self.key_indices.clone(),
            self.version.clone(),
            self.written_at.clone(),
            input,
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let diff = SnapshotDiff::try_new(
            &self.flow,
            self.key_indices.clone(),
            self.version.clone(),
            self.written_at.clone(),
            &input.schema(),
        )?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let upserts = MetricBuilder::new(&self.metrics).counter("num_upserts", partition);
        let deletes = MetricBuilder::new(&self.metrics).counter("num_deletes", partition);
        let state = (diff, input, false);
        let stream = futures::stream::try_unfold(state, move |(mut diff, mut input, done)| {
            let baseline = baseline.clone();
            let (upserts, deletes) = (upserts.clone(), deletes.clone());
            async move {
                if done {
                    return Ok(None);
                }
                while let Some(batch) = input.next().await {
                    let batch = batch?;
                    let _timer = baseline.elapsed_compute().timer();
                    if let Some(out) = diff.push(&batch)? {
                        baseline.record_output(out.num_rows());
                        return Ok(Some((out, (diff, input, false))));
                    }
                }
                let last = diff.finish()?;
                upserts.add(diff.counts.0);
                deletes.add(diff.counts.1);
                match last {
                    Some(out) => {
                        baseline.record_output(out.num_rows());
                        Ok(Some((out, (diff, input, true))))
                    }
                    None => Ok(None),
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
