//! `CdcCommitExec`: commits the files an update wrote.
//!
//! ```text
//!   CdcCommitExec ── one Delta commit: add the written files, remove the
//!        ▲            replaced ones (or mark rows with deletion vectors),
//!        │            table metadata (flow definition, schema), txn(flow, run)
//!        │ manifest rows (SinglePartition)
//!   CdcWriteExec
//! ```
//!
//! A DML statement's commit ([`CdcCommitExec::statement`]) takes the
//! same manifest, with the stored rows the statement retires, and logs the
//! statement instead of a flow run (no checkpoint moves).
//!
//! The commit reads only its input, the manifest
//! ([`crate::table::manifest`]): the written files and what the fold did.
//! Nothing is visible until the commit: a failure anywhere before it leaves
//! the table and every checkpoint as they were (written files are orphans
//! that `VACUUM` removes). When the fold changed nothing, the new files are
//! deleted and only the checkpoint is committed.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::distribution_requirements::InputDistributionRequirements;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties,
};
use deltalake_core::kernel::Add;
use futures::StreamExt;

use crate::fold::FoldCounts;
use crate::logical::UPDATE_RESULT_COLUMNS;
use crate::table::commit::{
    commit_written, data_files, CommitOutcome, CommitRequest, MetadataChange, StatementCommit,
    WrittenFiles,
};
use crate::table::manifest::Manifest;
use crate::table::restore::{net_change_files, target_keys, ChangeCounts, FilesAfter};

/// What a [`CdcCommitExec`] commits.
#[derive(Debug, Clone)]
enum Committing {
    /// A flow's update: its files, metadata and checkpoint.
    Update(Arc<CommitRequest>),
    /// A DML statement's files and the stored rows it retires.
    Statement(Arc<StatementCommit>),
}

/// Commits the new state of a target (see the module docs).
#[derive(Debug)]
pub struct CdcCommitExec {
    committing: Committing,
    input: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl CdcCommitExec {
    /// Create the operator.
    pub fn new(request: Arc<CommitRequest>, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::committing(Committing::Update(request), input)
    }

    /// The operator committing a DML statement's rows: the written files
    /// and the retired rows of its manifest, in one commit logged as the
    /// statement. Its row's `flow` is the statement.
    pub fn statement(commit: Arc<StatementCommit>, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::committing(Committing::Statement(commit), input)
    }

    fn committing(committing: Committing, input: Arc<dyn ExecutionPlan>) -> Self {
        let schema = result_schema();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            committing,
            input,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

/// Metrics of [`CdcCommitExec`].
#[derive(Debug, Clone)]
struct CommitMetrics {
    /// Data files the commit added.
    files_added: Count,
    /// Data files the commit removed (rewritten buckets).
    files_removed: Count,
    /// The Delta version committed.
    commit_version: Gauge,
    /// Time to make the commit (deletion vectors included).
    commit_time: Time,
}

impl CommitMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        let m = || MetricBuilder::new(metrics);
        Self {
            files_added: m().counter("num_files_added", 0),
            files_removed: m().counter("num_files_removed", 0),
            commit_version: m().gauge("commit_version", 0),
            commit_time: m().subset_time("commit_time", 0),
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
        let (target, what, name) = match &self.committing {
            Committing::Update(request) => (
                request.target.to_string(),
                "flow",
                request.flow.name.as_str(),
            ),
            Committing::Statement(commit) => (
                commit.table.name().to_string(),
                "statement",
                commit.statement,
            ),
        };
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(f, "CdcCommitExec: target={target}, {what}={name}")
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "target={target}")?;
                write!(f, "{what}={name}")
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
        Ok(Arc::new(Self::committing(self.committing.clone(), input)))
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
        // every manifest: an input re-optimised elsewhere (a cluster's
        // scheduler) may come back with several partitions and no merge
        let mut input = if self.input.output_partitioning().partition_count() > 1 {
            CoalescePartitionsExec::new(Arc::clone(&self.input)).execute(0, Arc::clone(&context))?
        } else {
            self.input.execute(0, Arc::clone(&context))?
        };
        let committing = self.committing.clone();
        let metrics = CommitMetrics::new(&self.metrics);
        let started = Instant::now();
        let fut = async move {
            let mut manifest = Manifest::default();
            while let Some(batch) = input.next().await {
                manifest.read(&batch?)?;
            }
            let timer = metrics.commit_time.timer();
            let (name, outcome) = match committing {
                Committing::Update(request) => {
                    // (stored rows are retired by the update's own commit;
                    // retire entries come from DML statements only)
                    if !manifest.retired.0.is_empty() {
                        return Err(DataFusionError::Internal(format!(
                            "flow '{}': the manifest retires stored rows; nothing was committed",
                            request.flow.name
                        )));
                    }
                    let changed = manifest.changed();
                    if request.clears {
                        // (the fold wrote no change file: it saw no stored row)
                        let (changes, counts) =
                            refill_changes(&request, &manifest.written.adds, &context).await?;
                        manifest.written.change_files = changes.change_files;
                        manifest.counts.upserted = (counts.inserted + counts.updated) as usize;
                        manifest.counts.deleted = counts.deleted as usize;
                    }
                    let outcome =
                        commit_written(&request, manifest.written, changed, &manifest.counts)
                            .await?;
                    (request.flow.name.clone(), outcome)
                }
                Committing::Statement(commit) => {
                    let files_added = manifest.written.adds.len();
                    let files_removed = manifest.retired.files();
                    let version = commit
                        .commit(
                            manifest.written,
                            manifest.retired,
                            &manifest.counts,
                            started,
                        )
                        .await?;
                    let outcome = CommitOutcome {
                        version,
                        files_added,
                        files_removed,
                    };
                    (commit.statement.to_string(), outcome)
                }
            };
            timer.done();
            metrics.files_added.add(outcome.files_added);
            metrics.files_removed.add(outcome.files_removed);
            metrics.commit_version.set(outcome.version.max(0) as usize);
            result_batch(&name, manifest.counts, Some(outcome.version))
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

/// The change data files of an update carrying a full refresh's clear: the
/// visible rows of every data file of the table against those of the files
/// it wrote (`adds`), by identity, so that rows written again unchanged are
/// no change; and their counts.
async fn refill_changes(
    request: &CommitRequest,
    adds: &[Add],
    context: &TaskContext,
) -> Result<(WrittenFiles, ChangeCounts)> {
    let table = &request.table;
    let delta = table.delta();
    // both sides in the schema the update commits (its columns may have
    // widened or grown)
    let raw = request
        .metadata
        .iter()
        .rev()
        .find_map(|change| match change {
            MetadataChange::Schema(schema) => Some(Arc::clone(schema)),
            _ => None,
        })
        .unwrap_or_else(|| table.raw_provider().schema());
    let before = data_files(&delta).await?;
    let state = SessionStateBuilder::new()
        .with_config(context.session_config().clone())
        .with_runtime_env(context.runtime_env())
        .with_default_features()
        .build();
    let keys = target_keys(table);
    let after = FilesAfter::Written(adds);
    net_change_files(&state, table, raw, before, after, keys.as_deref()).await
}
