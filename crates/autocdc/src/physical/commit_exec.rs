//! `CdcCommitExec`: writes an update's new target state and commits it.
//!
//! ```text
//!   CdcCommitExec ── one Delta commit: add new files, remove replaced files,
//!        ▲            table metadata (flow definition, schema), txn(flow, run)
//!        │ SinglePartition
//!   AutoCdcExec
//! ```
//!
//! Nothing is visible until the commit: a failure anywhere before it leaves
//! the table and every checkpoint as they were (written files are orphans
//! that `VACUUM` removes). When the fold changed nothing, the new files are
//! discarded and only the checkpoint is committed.

use std::fmt;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::distribution_requirements::InputDistributionRequirements;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::StreamExt;

use super::AutoCdcExec;
use crate::fold::FoldCounts;
use crate::logical::UPDATE_RESULT_COLUMNS;
use crate::table::commit::{commit_state, CommitRequest};

/// Commits the new state of a target (see the module docs).
#[derive(Debug)]
pub struct CdcCommitExec {
    request: Arc<CommitRequest>,
    input: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl CdcCommitExec {
    /// Create the operator.
    pub fn new(request: Arc<CommitRequest>, input: Arc<dyn ExecutionPlan>) -> Self {
        let schema = result_schema();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            request,
            input,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

/// Schema of the row returned by an update.
pub fn result_schema() -> SchemaRef {
    Arc::new(Schema::new(
        UPDATE_RESULT_COLUMNS
            .iter()
            .map(|(n, t)| Field::new(*n, t.clone(), *n == "commit_version"))
            .collect::<Vec<_>>(),
    ))
}

/// Build the result row of one flow run.
pub fn result_batch(flow: &str, counts: FoldCounts, version: Option<i64>) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new(
        result_schema(),
        vec![
            Arc::new(StringArray::from(vec![flow])),
            Arc::new(Int64Array::from(vec![counts.upserted as i64])),
            Arc::new(Int64Array::from(vec![counts.deleted as i64])),
            Arc::new(Int64Array::from(vec![counts.input_rows as i64])),
            Arc::new(Int64Array::from(vec![counts.late as i64])),
            Arc::new(Int64Array::from(vec![version])),
        ],
    )?)
}

impl DisplayAs for CdcCommitExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "CdcCommitExec: target={}, flow={}",
                    self.request.target, self.request.flow.name
                )
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "target={}", self.request.target)?;
                write!(f, "flow={}", self.request.flow.name)
            }
        }
    }
}

impl ExecutionPlan for CdcCommitExec {
    fn name(&self) -> &str {
        "CdcCommitExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        InputDistributionRequirements::new(vec![Distribution::SinglePartition])
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
            .ok_or_else(|| DataFusionError::Internal("CdcCommitExec needs one child".into()))?;
        Ok(Arc::new(Self::new(Arc::clone(&self.request), input)))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "CdcCommitExec has one partition, got {partition}"
            )));
        }
        let writers = context.session_config().target_partitions();
        let input = self.input.execute(0, context)?;
        let request = Arc::clone(&self.request);
        let plan = Arc::clone(&self.input);
        let files_written = MetricBuilder::new(&self.metrics).counter("num_files_written", 0);
        let commit_version = MetricBuilder::new(&self.metrics).gauge("commit_version", 0);
        let fut = async move {
            let fold = find_fold(&plan)?;
            let outcome = commit_state(&request, input, writers, || {
                (fold.counts(), fold.truncated())
            })
            .await?;
            files_written.add(outcome.files_written);
            if let Some(v) = outcome.version {
                commit_version.set(v as usize);
            }
            result_batch(&request.flow.name, outcome.counts, outcome.version)
        };
        let stream = futures::stream::once(fut).boxed();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// The fold operator feeding this commit (its metrics are the update's counts).
fn find_fold(plan: &Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let mut found = None;
    plan.apply(|p| {
        if p.downcast_ref::<AutoCdcExec>().is_some() {
            found = Some(Arc::clone(p));
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    found.ok_or_else(|| DataFusionError::Internal("CdcCommitExec: no AutoCdcExec below".into()))
}

trait FoldProbe {
    fn counts(&self) -> FoldCounts;
    fn truncated(&self) -> bool;
}

impl FoldProbe for Arc<dyn ExecutionPlan> {
    fn counts(&self) -> FoldCounts {
        self.downcast_ref::<AutoCdcExec>()
            .map(AutoCdcExec::counts)
            .unwrap_or_default()
    }
    fn truncated(&self) -> bool {
        self.downcast_ref::<AutoCdcExec>()
            .is_some_and(AutoCdcExec::truncated)
    }
}
