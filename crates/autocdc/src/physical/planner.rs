//! Planner hooks: turn the logical `AutoCdc` / `CdcCommit` nodes into execs.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    lit, DmlStatement, Expr, LogicalPlan, TableScan, TableScanBuilder, UserDefinedLogicalNode,
    WriteOp,
};
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
use crate::table::ScdTable;

/// `input`, a target writer's, with its fold's events routed to its
/// partitions by the target's `buckets` when the session routes a fold's
/// events itself ([`AutoCdcExec::with_bucket_exchange`]: each bucket's rows
/// then reach the writer in the order the fold emits them); otherwise
/// `input` itself.
fn route_by_bucket(
    input: &Arc<dyn ExecutionPlan>,
    buckets: i32,
    config: &datafusion::prelude::SessionConfig,
) -> Result<Arc<dyn ExecutionPlan>> {
    let routes = crate::config::autocdc_options(config).key_exchange;
    Ok(match input.downcast_ref::<AutoCdcExec>() {
        Some(fold) if routes => {
            Arc::new(fold.routed_by_bucket(config.target_partitions(), buckets)?)
        }
        _ => Arc::clone(input),
    })
}

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
            let exec =
                AutoCdcExec::try_new(n.spec.clone(), Arc::clone(events), Arc::clone(truncates))?;
            let config = session_state.config();
            let exec = if crate::config::autocdc_options(config).key_exchange {
                exec.with_key_exchange(config.target_partitions())
            } else {
                exec
            };
            return Ok(Some(Arc::new(exec)));
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
            let input = route_by_bucket(input, n.request.buckets, session_state.config())?;
            // (a fold routed by bucket: each partition writes buckets of its own)
            let by_bucket = input
                .downcast_ref::<AutoCdcExec>()
                .is_some_and(|fold| fold.bucket_routing().is_some());
            let per_partition = by_bucket
                || crate::config::autocdc_options(session_state.config()).plain_parquet_reads;
            return Ok(Some(Arc::new(
                CdcWriteExec::try_new(Arc::clone(&n.request), input)?.per_partition(per_partition),
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
            let config = session_state.config();
            let options = crate::config::autocdc_options(config);
            let exec = SnapshotDiffExec::new(
                n.flow.clone(),
                n.key_indices.clone(),
                n.version.clone(),
                n.written_at.clone(),
                Arc::clone(input),
                options.indexed_fold,
                options.indexed_fold_max_bytes,
            );
            let exec = match options.key_exchange {
                true => exec.with_key_exchange(config.target_partitions()),
                false => exec,
            };
            return Ok(Some(Arc::new(exec)));
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
        let planner =
            DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(CdcExtensionPlanner)]);
        if !updates_or_deletes(logical_plan)? {
            return planner
                .create_physical_plan(logical_plan, session_state)
                .await;
        }
        let logical_plan = without_target_scans(logical_plan.clone())?;
        planner
            .create_physical_plan(&logical_plan, session_state)
            .await
    }
}

/// Whether `plan` holds an `UPDATE` or a `DELETE` (itself, or under an
/// `EXPLAIN`): only those are rewritten by [`without_target_scans`].
fn updates_or_deletes(plan: &LogicalPlan) -> Result<bool> {
    plan.exists(|node| {
        Ok(matches!(node, LogicalPlan::Dml(dml) if matches!(dml.op, WriteOp::Update | WriteOp::Delete)))
    })
}

/// Refuse an `UPDATE` or `DELETE` of a streaming table whose input reads
/// more than its target: a subquery in its `WHERE` (`IN (SELECT …)`,
/// `EXISTS`, a scalar subquery) or an `UPDATE … FROM`. DataFusion hands the
/// target's provider only the predicates on the target itself, so the rows
/// such a statement names cannot reach [`ScdTable`]'s hooks: planned as is,
/// it would change every row. `MERGE` says the same with a source.
fn refuse_other_reads(dml: &DmlStatement) -> Result<()> {
    let reads_more = dml.input.exists(|node| {
        let subquery = node.expressions().iter().try_fold(false, |found, e| {
            Ok::<_, DataFusionError>(
                found
                    || e.exists(|e| {
                        Ok(matches!(
                            e,
                            Expr::Exists(_) | Expr::InSubquery(_) | Expr::ScalarSubquery(_)
                        ))
                    })?,
            )
        })?;
        Ok(subquery
            || match node {
                LogicalPlan::TableScan(scan) => scan.table_name != dml.table_name,
                LogicalPlan::Join(_)
                | LogicalPlan::Subquery(_)
                | LogicalPlan::Union(_)
                | LogicalPlan::Aggregate(_)
                | LogicalPlan::Window(_) => true,
                _ => false,
            })
    })?;
    if !reads_more {
        return Ok(());
    }
    let (statement, action) = match dml.op {
        WriteOp::Delete => ("DELETE", "DELETE"),
        _ => ("UPDATE", "UPDATE SET …"),
    };
    let table = &dml.table_name;
    Err(DataFusionError::NotImplemented(format!(
        "{statement} on streaming table '{table}' with a subquery or another table in its \
         WHERE is not supported (only conditions on the table's own columns select its \
         rows); use MERGE INTO {table} USING (…) ON … WHEN MATCHED THEN {action}"
    )))
}

/// `plan` with the target scan of each `UPDATE` and `DELETE` of a streaming
/// table made a scan of no rows (same columns, filters and assignments).
///
/// DataFusion plans such a statement's input — the target's scan under its
/// `WHERE` and `SET` — before it asks the target's provider for the
/// statement's plan, which does not use it: [`ScdTable`]'s hooks take the
/// filters and assignments and find the rows by key. Planning a streaming
/// table's scan reads the metadata of every data file (deltalake reads the
/// deletion vectors and footers of all of them), a cost that grew with the
/// table, not with the statement.
fn without_target_scans(plan: LogicalPlan) -> Result<LogicalPlan> {
    Ok(plan
        .transform_down(|node| {
            let LogicalPlan::Dml(dml) = &node else {
                return Ok(Transformed::no(node));
            };
            let streaming = source_as_provider(&dml.target)
                .is_ok_and(|p| p.downcast_ref::<ScdTable>().is_some());
            if !matches!(dml.op, WriteOp::Update | WriteOp::Delete) || !streaming {
                return Ok(Transformed::no(node));
            }
            refuse_other_reads(dml)?;
            let scans_target = dml.input.exists(|n| {
                Ok(matches!(n, LogicalPlan::TableScan(scan) if scan.table_name == dml.table_name))
            })?;
            if !scans_target {
                // the optimizer proved that no row matches (`WHERE 1 = 0`
                // became an empty relation): without a scan of the target,
                // DataFusion would pass no filter at all, which means every
                // row; a scan filtered by `false` says no row
                let empty = EmptyTable::new(dml.target.schema());
                let scan = TableScanBuilder::new(
                    dml.table_name.clone(),
                    provider_as_source(Arc::new(empty)),
                )
                .with_filters(vec![lit(false)])
                .build()?;
                let dml = DmlStatement {
                    input: Arc::new(LogicalPlan::TableScan(scan)),
                    ..dml.clone()
                };
                return Ok(Transformed::new(
                    LogicalPlan::Dml(dml),
                    true,
                    TreeNodeRecursion::Jump,
                ));
            }
            let input = Arc::unwrap_or_clone(Arc::clone(&dml.input))
                .transform_down(|input| match input {
                    LogicalPlan::TableScan(scan) if scan.table_name == dml.table_name => {
                        let empty = EmptyTable::new(scan.source.schema());
                        let scan = TableScan {
                            source: provider_as_source(Arc::new(empty)),
                            ..scan
                        };
                        Ok(Transformed::new(
                            LogicalPlan::TableScan(scan),
                            true,
                            TreeNodeRecursion::Stop,
                        ))
                    }
                    other => Ok(Transformed::no(other)),
                })?
                .data;
            let dml = DmlStatement {
                input: Arc::new(input),
                ..dml.clone()
            };
            Ok(Transformed::new(
                LogicalPlan::Dml(dml),
                true,
                TreeNodeRecursion::Jump,
            ))
        })?
        .data)
}
