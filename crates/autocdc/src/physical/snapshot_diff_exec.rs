//! `SnapshotDiffExec`: the physical form of
//! [`crate::logical::SnapshotDiffNode`].
//!
//! ```text
//!   SnapshotDiffExec (one merge per partition)
//!        ▲ partitioned by keys, sorted by (keys, side)
//!   Union(live rows tagged 0, snapshot rows tagged 1)
//! ```
//! Two engines, shown as `diff=` in `EXPLAIN`:
//! * `indexed` (keys of at most 16 bytes in Arrow's row format, setting
//!   `autocdc.indexed_fold`): no ordering is required; each partition keeps
//!   its rows and sorts a compact index of them
//!   ([`crate::fold::snapshot_diff_indexed`]). Its memory is reserved in the
//!   session's pool; when the pool refuses (or `autocdc.indexed_fold_max_bytes`
//!   is exceeded, or another partition already gave up) the partition hands
//!   what it kept and the rest of its input to DataFusion's spilling sort and
//!   goes on like `sorted` (metric `num_sort_fallbacks`). It may take its
//!   input through a key exchange of its own instead of DataFusion's hash
//!   repartition ([`SnapshotDiffExec::with_key_exchange`], `key_exchange=N`
//!   in `EXPLAIN`): each partition then indexes its keys' rows in the
//!   input's batches, shared, instead of a copy of them.
//! * `sorted`: like a sort-merge join: DataFusion repartitions and sorts
//!   (spilling) the input by `(keys, side)`; the operator keeps at most one
//!   key group across batches.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::compute::SortOptions;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{
    EquivalenceProperties, LexOrdering, OrderingRequirements, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::distribution_requirements::InputDistributionRequirements;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties,
};

use super::adaptive::{
    AdaptivePartition, FallBack, Finished, IndexedKernel, MakeSorted, SortedKernel,
};
use super::key_exchange::{KeyExchange, KeyRows, KeyRowsStream, Routing};
use crate::fold::snapshot_diff::{diff_output_schema, SnapshotDiff};
use crate::fold::snapshot_diff_indexed::IndexedSnapshotDiff;

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
    /// Diff by a sorted index of the rows instead of sorted rows.
    indexed: bool,
    /// Bytes one partition's indexed diff may hold (0: only the pool decides).
    indexed_cap: usize,
    /// Set once a partition's indexed diff fell back to sorting: the others
    /// then fall back too, leaving the pool to the sorts.
    sorting: Arc<AtomicBool>,
    /// The exchange that routes the input to the partitions, when the
    /// operator routes it itself.
    exchange: Option<Arc<KeyExchange>>,
}

/// The configuration of a [`SnapshotDiffExec`] (the arguments of
/// [`SnapshotDiffExec::new`]).
#[derive(Debug)]
pub struct DiffOptions<'a> {
    /// Flow name.
    pub flow: &'a str,
    /// Key column positions.
    pub key_indices: &'a [usize],
    /// The snapshot's version.
    pub version: &'a ScalarValue,
    /// The update's written-at time.
    pub written_at: &'a ScalarValue,
    /// Whether the indexed engine is used.
    pub indexed: bool,
    /// Bytes one partition's indexed diff may hold (0: only the pool decides).
    pub indexed_cap: usize,
}

impl SnapshotDiffExec {
    /// The operator's configuration.
    pub fn options(&self) -> DiffOptions<'_> {
        DiffOptions {
            flow: &self.flow,
            key_indices: &self.key_indices,
            version: &self.version,
            written_at: &self.written_at,
            indexed: self.indexed,
            indexed_cap: self.indexed_cap,
        }
    }

    /// Create the operator; `indexed` asks for the indexed engine (used when
    /// the keys fit it), `indexed_cap` bounds it per partition (0: no bound
    /// of its own).
    pub fn new(
        flow: String,
        key_indices: Vec<usize>,
        version: ScalarValue,
        written_at: ScalarValue,
        input: Arc<dyn ExecutionPlan>,
        indexed: bool,
        indexed_cap: usize,
    ) -> Self {
        let indexed =
            indexed && IndexedSnapshotDiff::supports(&key_indices, input.schema().as_ref());
        let schema = diff_output_schema(
            input.schema().as_ref(),
            &version.data_type(),
            &written_at.data_type(),
        );
        let properties =
            Self::compute_properties(input.output_partitioning().partition_count(), &schema);
        Self {
            flow,
            key_indices,
            version,
            written_at,
            input,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
            indexed,
            indexed_cap,
            sorting: Arc::new(AtomicBool::new(false)),
            exchange: None,
        }
    }

    /// The operator diffing in `partitions` partitions, its input routed to
    /// them by a [`KeyExchange`] of its own instead of a hash repartition
    /// below (see the module docs). Only the indexed diff routes so (it
    /// indexes rows where they are); otherwise, or for one partition, the
    /// operator is returned as it was.
    pub fn with_key_exchange(mut self, partitions: usize) -> Self {
        if !self.indexed || partitions < 2 {
            return self;
        }
        self.exchange = Some(Arc::new(KeyExchange::new(
            self.key_indices.clone(),
            partitions,
            Routing::Hash,
        )));
        self.properties = Self::compute_properties(partitions, &self.schema);
        self
    }

    /// The partitions of the key exchange, if the operator routes its
    /// input itself.
    pub fn key_exchange(&self) -> Option<usize> {
        self.exchange.as_ref().map(|x| x.partitions())
    }

    fn compute_properties(partitions: usize, schema: &SchemaRef) -> Arc<PlanProperties> {
        Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(schema)),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ))
    }

    /// The order the sorted engine needs: `(keys, side)`.
    fn diff_ordering(&self) -> Option<LexOrdering> {
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
        LexOrdering::new(sort)
    }

    fn engine_name(&self) -> &'static str {
        if self.indexed {
            "indexed"
        } else {
            "sorted"
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
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "SnapshotDiffExec: flow={}, keys=[{}], version={}, diff={}",
                    self.flow,
                    self.key_names().join(", "),
                    self.version,
                    self.engine_name()
                )?;
                match self.key_exchange() {
                    Some(partitions) => write!(f, ", key_exchange={partitions}"),
                    None => Ok(()),
                }
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "flow={}", self.flow)?;
                writeln!(f, "version={}", self.version)?;
                write!(f, "diff={}", self.engine_name())?;
                match self.key_exchange() {
                    Some(partitions) => write!(f, "\nkey_exchange={partitions}"),
                    None => Ok(()),
                }
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
        let input = match self.exchange {
            // the operator routes its input itself
            Some(_) => Distribution::UnspecifiedDistribution,
            None => Distribution::KeyPartitioned(self.key_exprs()),
        };
        InputDistributionRequirements::new(vec![input])
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![self.exchange.is_none()]
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        if self.indexed {
            return vec![None];
        }
        vec![self.diff_ordering().map(OrderingRequirements::from)]
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
        let exec = Self::new(
            self.flow.clone(),
            self.key_indices.clone(),
            self.version.clone(),
            self.written_at.clone(),
            input,
            self.indexed,
            self.indexed_cap,
        );
        Ok(Arc::new(match self.key_exchange() {
            Some(partitions) => exec.with_key_exchange(partitions),
            None => exec,
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = match &self.exchange {
            Some(exchange) => exchange.stream(&self.input, partition, &context, &self.metrics)?,
            None => KeyRowsStream::whole(self.input.execute(partition, Arc::clone(&context))?),
        };
        let schema = input.schema();
        let metric =
            |name: &'static str| MetricBuilder::new(&self.metrics).counter(name, partition);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let fall_back = |make_sorted: Option<MakeSorted<Box<SnapshotDiff>>>| -> Result<_> {
            Ok(FallBack {
                ordering: self.diff_ordering().ok_or_else(|| {
                    DataFusionError::Internal("SnapshotDiffExec: no ordering to sort by".into())
                })?,
                context: Arc::clone(&context),
                sorting: Arc::clone(&self.sorting),
                indexed_cap: self.indexed_cap,
                partitions: self.properties.partitioning.partition_count(),
                fallbacks: metric("num_sort_fallbacks"),
                elapsed_compute: baseline.elapsed_compute().clone(),
                make_sorted,
            })
        };
        let run = if self.indexed {
            let diff = Box::new(IndexedSnapshotDiff::try_new(
                &self.flow,
                self.key_indices.clone(),
                self.version.clone(),
                self.written_at.clone(),
                &schema,
            )?);
            let reservation = MemoryConsumer::new(format!("SnapshotDiffExec[{partition}]"))
                .register(context.memory_pool());
            // the sorted input has the schema of this one
            let sorted = Box::new(self.sorted_kernel(&schema)?);
            DiffRun::indexed(
                diff,
                input,
                reservation,
                fall_back(Some(Box::new(move |_| Ok(sorted))))?,
            )
        } else {
            DiffRun::sorted(
                Box::new(self.sorted_kernel(&schema)?),
                input.into_batches(),
                fall_back(None)?,
            )
        };
        let state = DiffState {
            run,
            finished: false,
            baseline,
            upserts: metric("num_upserts"),
            deletes: metric("num_deletes"),
        };
        let stream = futures::stream::try_unfold(state, |mut state| async move {
            Ok(state.next().await?.map(|batch| (batch, state)))
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

impl SnapshotDiffExec {
    fn sorted_kernel(&self, schema: &SchemaRef) -> Result<SnapshotDiff> {
        SnapshotDiff::try_new(
            &self.flow,
            self.key_indices.clone(),
            self.version.clone(),
            self.written_at.clone(),
            schema,
        )
    }
}

/// One partition's diff: the indexed or the sorted kernel, and the
/// fall-back between them ([`AdaptivePartition`]).
type DiffRun = AdaptivePartition<Box<IndexedSnapshotDiff>, Box<SnapshotDiff>>;

impl SortedKernel for Box<SnapshotDiff> {
    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        SnapshotDiff::push(self, batch)
    }
    fn finish(&mut self) -> Result<Option<RecordBatch>> {
        SnapshotDiff::finish(self)
    }
}

impl IndexedKernel for Box<IndexedSnapshotDiff> {
    fn push(&mut self, rows: KeyRows) -> Result<()> {
        IndexedSnapshotDiff::push_rows(self, &rows.batch, rows.rows.as_ref())
    }
    fn memory_size(&self) -> usize {
        IndexedSnapshotDiff::memory_size(self)
    }
    fn finish(&mut self, scratch: &mut dyn FnMut(usize) -> bool) -> Result<()> {
        IndexedSnapshotDiff::finish(self, scratch)
    }
    fn next_output(&mut self, batch_size: usize) -> Result<Option<RecordBatch>> {
        IndexedSnapshotDiff::next_output(self, batch_size)
    }
    fn into_batches(self) -> Result<Vec<RecordBatch>> {
        IndexedSnapshotDiff::into_batches(*self)
    }
}

/// One partition's diff as it runs.
struct DiffState {
    run: DiffRun,
    finished: bool,
    baseline: BaselineMetrics,
    upserts: Count,
    deletes: Count,
}

impl DiffState {
    /// Next batch of change events, or `None` at the end.
    async fn next(&mut self) -> Result<Option<RecordBatch>> {
        if self.finished {
            return Ok(None);
        }
        if let Some(out) = self.run.next().await? {
            self.baseline.record_output(out.num_rows());
            return Ok(Some(out));
        }
        self.finished = true;
        let (upserts, deletes) = match self.run.kernel()? {
            Finished::Sorted(diff) => diff.counts,
            Finished::Indexed(diff) => diff.counts,
        };
        self.upserts.add(upserts);
        self.deletes.add(deletes);
        Ok(None)
    }
}
