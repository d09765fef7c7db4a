//! Planner hooks: turn the logical `AutoCdc` / `CdcCommit` nodes into execs.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};

use super::{
    AutoCdcExec, CdcCommitExec, CdcWriteExec, ExpectationsExec, RejectsExec, SnapshotDiffExec,
    StagedEventsExec,
};
use crate::logical::{
    AutoCdcNode, CdcCommitNode, CdcWriteNode, ExpectationsNode, RejectsNode, SnapshotDiffNode,
    StagedEventsNode,
};

/// Plans `AutoCdcNode`, `SnapshotDiffNode`, `CdcWriteNode` and `CdcCommitNode`.
#[derive(Debug, Default)]
pub struct CdcExtensionPlanner;

#[async_trait]
impl ExtensionPlanner for CdcExtensionPlanner {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session_state: &dyn Session,
        planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let Some(n) = node.as_any().downcast_ref::<AutoCdcNode>() {
            let [events, truncates] = physical_inputs else {
                return Err(DataFusionError::Internal("AutoCdc needs two inputs".into()));
            };
            return Ok(Some(Arc::new(AutoCdcExec::try_new(
                n.spec.clone(),
                Arc::clone(events),
                Arc::clone(truncates),
            )?)));
        }
        if let Some(n) = node.as_any().downcast_ref::<ExpectationsNode>() {
            let ([input], [logical]) = (physical_inputs, logical_inputs) else {
                return Err(DataFusionError::Internal(
                    "Expectations needs one input".into(),
                ));
            };
            let conditions = n
                .conditions
                .iter()
                .map(|c| {
                    planner.create_physical_expr(c, logical.schema(), session_state, planning_ctx)
                })
                .collect::<Result<Vec<_>>>()?;
            return Ok(Some(Arc::new(
                ExpectationsExec::try_new(
                    n.flow.clone(),
                    conditions,
                    Arc::clone(&n.counts),
                    Arc::clone(input),
                )?
                .with_rejects(n.rejects.clone()),
            )));
        }
        if let Some(n) = node.as_any().downcast_ref::<RejectsNode>() {
            let [input] = physical_inputs else {
                return Err(DataFusionError::Internal("Rejects needs one input".into()));
            };
            return Ok(Some(Arc::new(RejectsExec::try_new(
                Arc::clone(&n.sink),
                n.conflicts,
                Arc::clone(input),
            )?)));
        }
        if let Some(n) = node.as_any().downcast_ref::<StagedEventsNode>() {
            let [input] = physical_inputs else {
                return Err(DataFusionError::Internal(
                    "StagedEvents needs one input".into(),
                ));
            };
            return Ok(Some(Arc::new(StagedEventsExec::new(
                Arc::clone(&n.stage),
                n.role,
                Arc::clone(input),
                session_state.config().target_partitions(),
            ))));
        }
        if let Some(n) = node.as_any().downcast_ref::<CdcWriteNode>() {
            let [input] = physical_inputs else {
                return Err(DataFusionError::Internal("CdcWrite needs one input".into()));
            };
            let per_partition =
                crate::config::autocdc_options(session_state.config()).plain_parquet_reads;
            return Ok(Some(Arc::new(
                CdcWriteExec::try_new(Arc::clone(&n.request), Arc::clone(input))?
                    .per_partition(per_partition),
            )));
        }
        if let Some(n) = node.as_any().downcast_ref::<CdcCommitNode>() {
            let [input] = physical_inputs else {
                return Err(DataFusionError::Internal(
                    "CdcCommit needs one input".into(),
                ));
            };
            return Ok(Some(Arc::new(CdcCommitExec::new(
                Arc::clone(&n.request),
                Arc::clone(input),
            ))));
        }
        if let Some(n) = node.as_any().downcast_ref::<SnapshotDiffNode>() {
            let [input] = physical_inputs else {
                return Err(DataFusionError::Internal(
                    "SnapshotDiff needs one input".into(),
                ));
            };
            let options = crate::config::autocdc_options(session_state.config());
            return Ok(Some(Arc::new(SnapshotDiffExec::new(
                n.flow.clone(),
                n.key_indices.clone(),
                n.version.clone(),
                n.written_at.clone(),
                Arc::clone(input),
                options.indexed_fold,
                options.indexed_fold_max_bytes,
            ))));
        }
        Ok(None)
    }
}

/// Query planner that adds [`CdcExtensionPlanner`] to DataFusion's default planner.
#[derive(Debug, Default)]
pub struct CdcQueryPlanner;

#[async_trait]
impl QueryPlanner for CdcQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session_state: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(CdcExtensionPlanner)])
            .create_physical_plan(logical_plan, session_state)
            .await
    }
}
