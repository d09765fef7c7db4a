//! `StagedEventsExec`: an update's new change events, read once through its
//! stage ([`crate::table::stage`]) when the update runs.
//!
//! ```text
//!  AutoCdcExec
//!    … StagedEventsExec: flow=f, role=events      ◄─ the stage runs its input once
//!        (the flow's events)
//!    … TargetRowsExec: flow=f                     ◄─ reads what the stage chose
//!  (truncates)
//!    … StagedEventsExec: flow=f, role=truncates   ◄─ the staged events again, or its
//!        (the flow's events)                          own input for a large update
//! ```
//!
//! The `events` operator binds its input to the stage; whichever operator
//! of the update asks first runs the stage. Its partitions share the staged
//! batches, or a large update's run (the pulled batches first), each taking
//! the next batch when it wants one. Its metrics say what the stage did:
//! `staged_rows`, `staged_bytes` and `streamed` (1: over the budget).

use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::TryStreamExt;

use crate::logical::StagedRole;
use crate::table::stage::{read_all, UpdateStage};

/// Passes an update's events on from its stage (see the module docs).
#[derive(Debug)]
pub struct StagedEventsExec {
    stage: Arc<UpdateStage>,
    role: StagedRole,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StagedEventsExec {
    /// `role` of the update of `stage`, over the events' plan `input`, in
    /// `partitions` partitions (the events role; the truncates have one).
    pub fn new(
        stage: Arc<UpdateStage>,
        role: StagedRole,
        input: Arc<dyn ExecutionPlan>,
        partitions: usize,
    ) -> Self {
        if role == StagedRole::Events {
            stage.bind(Arc::clone(&input));
        }
        let partitions = match role {
            StagedRole::Events => partitions.max(1),
            StagedRole::Truncates => 1,
        };
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(input.schema()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            stage,
            role,
            input,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for StagedEventsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "StagedEventsExec: flow={}, role={}",
                self.stage.flow(),
                self.role
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "flow={}", self.stage.flow())?;
                write!(f, "role={}", self.role)
            }
        }
    }
}

impl ExecutionPlan for StagedEventsExec {
    fn name(&self) -> &str {
        "StagedEventsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
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
            .ok_or_else(|| DataFusionError::Internal("StagedEventsExec needs one child".into()))?;
        Ok(Arc::new(Self::new(
            Arc::clone(&self.stage),
            self.role,
            input,
            self.properties.output_partitioning().partition_count(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let partitions = self.properties.output_partitioning().partition_count();
        if partition >= partitions {
            return Err(DataFusionError::Internal(format!(
                "StagedEventsExec has {partitions} partitions, got {partition}"
            )));
        }
        let (stage, role, input) = (Arc::clone(&self.stage), self.role, Arc::clone(&self.input));
        let output_rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let figures = (partition == 0 && role == StagedRole::Events).then(|| {
            let m = MetricBuilder::new(&self.metrics);
            (
                m.clone().counter("staged_rows", 0),
                m.clone().counter("staged_bytes", 0),
                m.counter("streamed", 0),
            )
        });
        let schema = self.input.schema();
        let stream = futures::stream::once(async move {
            let staged = stage.staged(&context).await?;
            if let Some((rows, bytes, streamed)) = figures {
                rows.add(staged.rows);
                bytes.add(staged.bytes);
                streamed.add(usize::from(staged.is_large()));
            }
            let events: SendableRecordBatchStream = match staged.batches(partition, partitions) {
                Some(batches) => {
                    let schema = input.schema();
                    Box::pin(RecordBatchStreamAdapter::new(
                        schema,
                        futures::stream::iter(batches.into_iter().map(Ok)),
                    ))
                }
                // a large update: the partitions share the rest of the
                // run; its truncates read the input again
                None => match role {
                    StagedRole::Truncates => read_all(input, &context)?,
                    StagedRole::Events => staged
                        .take_rest(stage.flow(), partition)?
                        .ok_or_else(|| DataFusionError::Internal("no staged run".into()))?,
                },
            };
            Ok::<_, DataFusionError>(events)
        })
        .try_flatten()
        .inspect_ok(move |batch| output_rows.add(batch.num_rows()));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
