//! `DistributedWriteExec`: the writing part of an update, run by a Ballista
//! cluster; and `DistributeWrites`, the physical optimizer rule that puts it
//! under every `CdcCommitExec` whose input can travel — and over a query
//! that folds without committing (`FROM AUTO CDC (…)`, `FROM SNAPSHOTS
//! (…)`), shown as `DistributedQueryExec`: the whole query runs on the
//! cluster and its rows stream back.
//!
//! ```text
//!  client                                   cluster
//!  CdcCommitExec ◄── manifests ───────────┐
//!    DistributedWriteExec ── plan bytes ──► scheduler: stages, tasks
//!      CdcWriteExec (per partition)          executors: scans, shuffles,
//!        AutoCdcExec ...                     fold, files to the warehouse
//! ```
//!
//! The subtree under the commit is encoded with [`crate::physical_codec`]
//! and submitted as a physical plan; its output (one manifest per write
//! partition) streams back, and the commit runs here, once. A subtree that
//! cannot be encoded (a source only this process can read: an in-progress
//! stream, delta-rs' change feed scan) runs here, and `EXPLAIN` says why.
//! A retried or failed task leaves files no manifest names: they are never
//! committed (vacuum removes them).

use std::fmt;
use std::sync::{Arc, OnceLock};

use ballista_core::execution_plans::execute_physical_plan;
use ballista_core::extension::SessionConfigExt;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::config::ConfigOptions;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use datafusion_autocdc::config::AutoCdcOptions;
use datafusion_autocdc::physical::{AutoCdcExec, CdcCommitExec, SnapshotDiffExec};
use datafusion_proto::physical_plan::{AsExecutionPlan, PhysicalExtensionCodec};
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::TryStreamExt;
use prost::Message;

use crate::codec::physical_codec;
use crate::window_sorts::with_explicit_window_sorts;

/// Where the input of a commit runs.
#[derive(Debug, Clone)]
enum Placement {
    /// On the cluster whose scheduler listens at this URL (`http://host:port`).
    Cluster(String),
    /// Here: the plan cannot be encoded, for this reason.
    Local(String),
}

/// What a [`DistributedWriteExec`] runs on the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The writing part of an update (under its commit).
    Write,
    /// A whole query that folds (an `AUTO CDC` relation).
    Query,
}

/// Runs its input on a Ballista cluster (see the module docs).
pub struct DistributedWriteExec {
    input: Arc<dyn ExecutionPlan>,
    placement: Placement,
    role: Role,
    codec: Arc<dyn PhysicalExtensionCodec>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for DistributedWriteExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedWriteExec")
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}

impl DistributedWriteExec {
    fn new(input: Arc<dyn ExecutionPlan>, placement: Placement, role: Role) -> Self {
        let properties = Arc::new(PlanProperties::new(
            input.equivalence_properties().clone(),
            // the cluster's output comes back as one stream
            datafusion::physical_plan::Partitioning::UnknownPartitioning(1),
            input.pipeline_behavior(),
            input.boundedness(),
        ));
        Self {
            input,
            placement,
            role,
            codec: physical_codec(),
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// Whether the input runs on the cluster (else here).
    pub fn is_distributed(&self) -> bool {
        matches!(self.placement, Placement::Cluster(_))
    }
}

impl DisplayAs for DistributedWriteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let name = self.name();
        match &self.placement {
            Placement::Cluster(url) => write!(f, "{name}: scheduler={url}"),
            Placement::Local(why) => write!(f, "{name}: runs locally ({why})"),
        }
    }
}

impl ExecutionPlan for DistributedWriteExec {
    fn name(&self) -> &str {
        match self.role {
            Role::Write => "DistributedWriteExec",
            Role::Query => "DistributedQueryExec",
        }
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    /// The input is shown (and optimised) as a child, but run by the
    /// cluster when the placement says so.
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
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
        let input = children.pop().ok_or_else(|| {
            DataFusionError::Internal("DistributedWriteExec needs one child".into())
        })?;
        Ok(Arc::new(Self::new(
            input,
            self.placement.clone(),
            self.role,
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "DistributedWriteExec has one partition, got {partition}"
            )));
        }
        let scheduler = match &self.placement {
            Placement::Local(_) => {
                let input = Arc::clone(&self.input);
                return if input.output_partitioning().partition_count() == 1 {
                    input.execute(0, context)
                } else {
                    datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec::new(
                        input,
                    )
                    .execute(0, context)
                };
            }
            Placement::Cluster(url) => url.clone(),
        };
        let job_time = MetricBuilder::new(&self.metrics).subset_time("cluster_time", 0);
        let input = Arc::clone(&self.input);
        let codec = Arc::clone(&self.codec);
        let schema = input.schema();
        let session_config = context.session_config().clone();
        let session_id = context.session_id();
        let run = async move {
            let timer = job_time.timer();
            let ballista = session_config.ballista_config();
            let stream = execute_physical_plan::<PhysicalPlanNode>(
                scheduler,
                &ballista,
                input,
                codec.as_ref(),
                session_id,
                session_config,
            )
            .await
            .map_err(cluster_error)?;
            let batches: Vec<_> = stream.try_collect().await.map_err(cluster_error)?;
            timer.done();
            Ok::<_, DataFusionError>(futures::stream::iter(batches.into_iter().map(Ok)))
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(run).try_flatten(),
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// A failed job's error as the error that failed its task (Ballista gives
/// it back as debug text, `…DataFusionError(Shared(External(…)))`), so that
/// it reads as it does when the update runs here.
fn cluster_error(e: DataFusionError) -> DataFusionError {
    match datafusion_autocdc::error::remote_message(&e.to_string()) {
        Some(message) => DataFusionError::Execution(message),
        None => e,
    }
}

/// The largest encoded plan sent to the cluster: a job's plan travels in
/// one gRPC message (16 MiB by Ballista's default,
/// `ballista.client.grpc_max_message_size`), and so do its tasks'; a larger
/// one runs here rather than failing with a transport error.
const PLAN_MAX_BYTES: usize = 8 * 1024 * 1024;

/// Puts a [`DistributedWriteExec`] under every `CdcCommitExec` (see the
/// module docs).
#[derive(Debug)]
pub struct DistributeWrites {
    /// The scheduler's gRPC endpoint (`http://host:port`), once known.
    scheduler: Arc<OnceLock<String>>,
}

impl DistributeWrites {
    /// Run update writes on the cluster whose scheduler endpoint is set in
    /// `scheduler` (plans made before it is set run here).
    pub fn new(scheduler: Arc<OnceLock<String>>) -> Self {
        Self { scheduler }
    }
}

impl PhysicalOptimizerRule for DistributeWrites {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // an update of a cluster writes one manifest per fold partition
        // (plain Parquet reads); one that does not would lose the rows of
        // every partition but one: refused
        let plain_reads = config
            .extensions
            .get::<AutoCdcOptions>()
            .is_none_or(|options| options.plain_parquet_reads);
        let writes = plan.exists(|n| Ok(n.downcast_ref::<CdcCommitExec>().is_some()))?;
        if writes && !plain_reads {
            return Err(DataFusionError::Plan(
                "autocdc.plain_parquet_reads is false, but a session on a Ballista cluster \
                 reads stored rows as plain Parquet scans and writes a manifest per fold \
                 partition: SET autocdc.plain_parquet_reads = true (its value in cluster \
                 sessions); nothing was run"
                    .to_string(),
            ));
        }
        let codec = physical_codec();
        // (stages of a cluster know no constants of the stages before them)
        let plan = with_explicit_window_sorts(plan)?;
        let placement = |input: &Arc<dyn ExecutionPlan>| {
            if let Some(store) = process_store(input) {
                return Placement::Local(format!(
                    "it reads through {store}, a store of this process that the cluster's \
                     executors cannot reach (a table's change data, read by deltalake)"
                ));
            }
            let encoded =
                PhysicalPlanNode::try_from_physical_plan(Arc::clone(input), codec.as_ref());
            match (self.scheduler.get(), encoded) {
                (Some(_), Ok(node)) if node.encoded_len() > PLAN_MAX_BYTES => {
                    Placement::Local(format!(
                        "its plan is {} MiB, which carries the rows it writes (a DML \
                         statement's, say), more than a job's message to the cluster holds \
                         ({} MiB here, of Ballista's 16 MiB)",
                        node.encoded_len().div_ceil(1024 * 1024),
                        PLAN_MAX_BYTES / (1024 * 1024)
                    ))
                }
                (Some(url), Ok(_)) => Placement::Cluster(url.clone()),
                (None, _) => Placement::Local("no cluster yet".to_string()),
                (_, Err(e)) => Placement::Local(untravelled(&e.to_string())),
            }
        };
        let folds = plan.exists(|n| {
            Ok(n.downcast_ref::<AutoCdcExec>().is_some()
                || n.downcast_ref::<SnapshotDiffExec>().is_some())
        })?;
        let placed = plan.exists(|n| {
            Ok(n.downcast_ref::<CdcCommitExec>().is_some()
                || n.downcast_ref::<DistributedWriteExec>().is_some())
        })?;
        if folds && !placed {
            // a query that folds: all of it runs on the cluster, its rows
            // come back as one stream
            let input = if plan.output_partitioning().partition_count() > 1 {
                Arc::new(CoalescePartitionsExec::new(plan)) as Arc<dyn ExecutionPlan>
            } else {
                plan
            };
            let placement = placement(&input);
            return Ok(Arc::new(DistributedWriteExec::new(
                input,
                placement,
                Role::Query,
            )));
        }
        plan.transform_down(|node| {
            if node.downcast_ref::<CdcCommitExec>().is_none() {
                return Ok(Transformed::no(node));
            }
            let [input] = node.children()[..] else {
                return Ok(Transformed::no(node));
            };
            if input.downcast_ref::<DistributedWriteExec>().is_some() {
                return Ok(Transformed::no(node));
            }
            let write = Arc::new(DistributedWriteExec::new(
                Arc::clone(input),
                placement(input),
                Role::Write,
            ));
            #[allow(deprecated)]
            let node = node.with_new_children(vec![write])?;
            Ok(Transformed::new(node, true, TreeNodeRecursion::Jump))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "distribute_writes"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The first line of an error message (they can hold whole plans).
fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or_default().to_string()
}

/// Why a plan the codec refused runs here: the operator it could not
/// encode (one that works with this process's state, such as
/// `RejectsExec`, whose rejects the commit here writes), else the
/// codec's first line.
fn untravelled(message: &str) -> String {
    let operator = message
        .split("Unsupported plan node, name: [")
        .nth(1)
        .and_then(|rest| rest.split(']').next());
    match operator {
        Some(name) => format!("{name} works with this process's state and cannot travel"),
        None => first_line(message),
    }
}

/// The object store of this process only (deltalake's `delta-rs://` stores,
/// registered per table as it is read) that a file scan of `plan` reads,
/// if any: a cluster's executors resolve stores by URL and have none of it.
fn process_store(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    use datafusion::datasource::physical_plan::FileScanConfig;
    use datafusion::datasource::source::DataSourceExec;
    let mut found = None;
    let _ = plan.apply(|node| {
        let url = node
            .downcast_ref::<DataSourceExec>()
            .and_then(|exec| exec.data_source().downcast_ref::<FileScanConfig>())
            .map(|config| config.object_store_url.as_str().to_string());
        match url {
            Some(url) if url.starts_with("delta-rs://") => {
                found = Some(url);
                Ok(TreeNodeRecursion::Stop)
            }
            _ => Ok(TreeNodeRecursion::Continue),
        }
    });
    found
}
