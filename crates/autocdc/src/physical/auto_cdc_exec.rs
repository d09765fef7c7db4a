//! `AutoCdcExec`: the physical form of [`crate::logical::AutoCdcNode`].
//!
//! ```text
//!            AutoCdcExec  (one fold per partition)
//!             ▲                 ▲
//!   partitioned by keys;        │ SinglePartition, collected once and
//!   sorted by (keys, seq,       │ shared by all partitions
//!   origin) if fold=sorted      │
//!   events (stored ∪ new)    truncate sequences
//! ```
//!
//! The operator declares what it needs — key partitioning, and for
//! `fold=sorted` `(keys, seq, origin)` ordering on the events — and
//! DataFusion inserts the repartitioning and (spilling) sorts, so it runs on
//! all cores with memory bounded by the session's pool. Where the sequence
//! is fixed-width ([`FoldEngine`]) no sort is needed below: SCD 1 folds with
//! the [`IndexedScd1Fold`] and a query's SCD 2 with the [`IndexedScd2Fold`]
//! (`fold=indexed` in `EXPLAIN`); every other fold feeds its sorted kernel
//! through an [`IndexSortedFold`] (`fold=index-sorted`). All reserve what
//! they hold in the pool and, when refused, sort the rest of their
//! partition themselves (a `SortExec` over what they retained and the
//! remaining input, metric `num_sort_fallbacks`). Every partition ends
//! with the target's truncate watermark row, if it has one (the writer
//! keeps one).
//!
//! An indexed fold may take its events through a [`KeyExchange`] of its own
//! instead of DataFusion's hash repartition ([`AutoCdcExec::with_key_exchange`],
//! `key_exchange=N` in `EXPLAIN`): each partition then receives the input's
//! batches whole, shared, with the positions of its keys' rows, and indexes
//! those rows where they are — the repartition's copy of every event is
//! gone. A fold that feeds a target's writer routes by the target's key
//! buckets ([`AutoCdcExec::with_bucket_exchange`], `key_exchange=N by B
//! buckets`), index-sorted folds too: each partition then writes buckets
//! of its own, and an index-sorted fold gathers its events grouped by
//! bucket ([`IndexSortedFold::with_groups`]), so that the writer takes its
//! output as it comes.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, Int8Array, RecordBatch};
use arrow::compute::{concat, SortOptions};
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};
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
    collect, DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties,
};
use futures::StreamExt;
use tokio::sync::OnceCell;

use super::adaptive::{
    AdaptivePartition, FallBack, Finished, IndexedKernel, MakeSorted, SortedKernel,
};
use super::key_exchange::{KeyExchange, KeyRows, KeyRowsStream, Routing};
use crate::fold::columns::{Origin, KIND_COL, SEQ_COL};
use crate::fold::index_sorted::GroupOf;
use crate::fold::late::LateEvents;
use crate::fold::{
    FoldCounts, FoldEngine, FoldKernel, FoldSpec, IndexSortedFold, IndexedScd1Fold,
    IndexedScd2Fold, Kind, ScdType,
};
use crate::table::bucket::bucket_array;

/// Folds sorted change events into the new stored state of an SCD 1 target.
#[derive(Debug)]
pub struct AutoCdcExec {
    spec: FoldSpec,
    events: Arc<dyn ExecutionPlan>,
    truncates: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// The truncate sequences, collected once for all partitions (an error
    /// too: the input must not be executed twice).
    truncate_sequences: Arc<OnceCell<std::result::Result<TruncateSequences, Arc<DataFusionError>>>>,
    /// Set when one partition's indexed fold ran out of memory: the others
    /// then sort too, instead of holding memory the sorts need.
    sorting: Arc<AtomicBool>,
    /// The exchange that routes the events to the partitions, when the
    /// operator routes them itself (see the module docs).
    exchange: Option<Arc<KeyExchange>>,
}

/// Metric names reported by [`AutoCdcExec`] (the counts as
/// [`crate::fold::count`] names them).
pub mod metric {
    pub use crate::fold::count::{
        DELETED, DUPLICATES, EVENTS_ADDED, INPUT_ROWS, LATE, TOMBSTONES, UPSERTED,
    };
    /// Partitions that emitted the target's truncate watermark row (every
    /// partition does when the target has a watermark, new or stored).
    pub const WATERMARK: &str = "num_truncates_applied";
    /// Partitions whose indexed fold ran out of memory and sorted instead.
    pub const SORT_FALLBACKS: &str = "num_sort_fallbacks";
}

impl AutoCdcExec {
    /// Create the operator over its two inputs (see the module docs).
    pub fn try_new(
        spec: FoldSpec,
        events: Arc<dyn ExecutionPlan>,
        truncates: Arc<dyn ExecutionPlan>,
    ) -> Result<Self> {
        let schema = spec.output_schema(events.schema().as_ref())?;
        let partitions = events.output_partitioning().partition_count();
        let properties = Arc::new(Self::compute_properties(partitions, Arc::clone(&schema)));
        Ok(Self {
            spec,
            events,
            truncates,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
            truncate_sequences: Arc::new(OnceCell::new()),
            sorting: Arc::new(AtomicBool::new(false)),
            exchange: None,
        })
    }

    /// The operator folding in `partitions` partitions, its events routed
    /// to them by a [`KeyExchange`] of its own instead of a hash
    /// repartition below (see the module docs). Only an indexed fold
    /// routes so (its kernels index rows where they are); otherwise, or
    /// for one partition, the operator is returned as it was.
    pub fn with_key_exchange(self, partitions: usize) -> Self {
        if self.engine() != FoldEngine::Indexed {
            return self;
        }
        self.exchange_by(partitions, Routing::Hash)
    }

    /// The operator folding in `partitions` partitions, each key routed
    /// by its bucket in a target of `buckets` buckets (see
    /// [`super::key_exchange`]): each bucket is folded by one partition,
    /// which writes it itself (`CdcWriteExec` per partition) — for an
    /// index-sorted fold in key order, so that the writer has no row group
    /// to sort. An indexed or index-sorted fold routes so when `buckets` is
    /// a multiple of `partitions` (each partition then folds as many
    /// buckets); otherwise this is [`Self::with_key_exchange`].
    pub fn with_bucket_exchange(self, partitions: usize, buckets: i32) -> Self {
        let divides =
            buckets > 0 && partitions > 0 && (buckets as usize).is_multiple_of(partitions);
        let routes = self.engine() != FoldEngine::Sorted;
        if divides && routes {
            self.exchange_by(partitions, Routing::Buckets(buckets))
        } else {
            self.with_key_exchange(partitions)
        }
    }

    /// The operator routing its events to `partitions` by `routing` (for
    /// two or more partitions).
    fn exchange_by(mut self, partitions: usize, routing: Routing) -> Self {
        if partitions < 2 {
            return self;
        }
        let keys = self.spec.layout.key_indices.clone();
        self.exchange = Some(Arc::new(KeyExchange::new(keys, partitions, routing)));
        self.properties = Arc::new(Self::compute_properties(
            partitions,
            Arc::clone(&self.schema),
        ));
        self
    }

    /// A new operator like this one (not sharing its runs), routing its
    /// events by bucket ([`Self::with_bucket_exchange`]).
    pub fn routed_by_bucket(&self, partitions: usize, buckets: i32) -> Result<Self> {
        Ok(Self::try_new(
            self.spec.clone(),
            Arc::clone(&self.events),
            Arc::clone(&self.truncates),
        )?
        .with_bucket_exchange(partitions, buckets))
    }

    /// The partitions of the key exchange, if the operator routes its
    /// events itself.
    pub fn key_exchange(&self) -> Option<usize> {
        self.exchange.as_ref().map(|x| x.partitions())
    }

    /// The buckets by which the key exchange routes, if it routes by bucket.
    pub fn bucket_routing(&self) -> Option<i32> {
        match self.exchange.as_ref()?.routing() {
            Routing::Buckets(buckets) => Some(buckets),
            Routing::Hash => None,
        }
    }

    fn compute_properties(partitions: usize, schema: SchemaRef) -> PlanProperties {
        PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        )
    }

    /// How the events are ordered and folded (`fold=…` in `EXPLAIN`).
    fn engine(&self) -> FoldEngine {
        self.spec.engine(&self.events.schema())
    }

    /// What the operator folds, and how.
    pub fn spec(&self) -> &FoldSpec {
        &self.spec
    }

    /// Flow name.
    pub fn flow(&self) -> &str {
        &self.spec.flow
    }

    /// Counts of the last execution, summed over partitions.
    pub fn counts(&self) -> FoldCounts {
        let m = self.metrics.clone_inner();
        let get = |name: &str| m.sum_by_name(name).map(|v| v.as_usize()).unwrap_or(0);
        FoldCounts {
            input_rows: get(metric::INPUT_ROWS),
            upserted: get(metric::UPSERTED),
            deleted: get(metric::DELETED),
            tombstones: get(metric::TOMBSTONES),
            late: get(metric::LATE),
            duplicates: get(metric::DUPLICATES),
            events_added: get(metric::EVENTS_ADDED),
        }
    }

    /// Counts of the last execution of one partition.
    pub fn partition_counts(&self, partition: usize) -> FoldCounts {
        let m = self.metrics.clone_inner();
        let get = |name: &str| {
            m.iter()
                .filter(|x| x.partition() == Some(partition) && x.value().name() == name)
                .map(|x| x.value().as_usize())
                .sum()
        };
        FoldCounts {
            input_rows: get(metric::INPUT_ROWS),
            upserted: get(metric::UPSERTED),
            deleted: get(metric::DELETED),
            tombstones: get(metric::TOMBSTONES),
            late: get(metric::LATE),
            duplicates: get(metric::DUPLICATES),
            events_added: get(metric::EVENTS_ADDED),
        }
    }

    /// Whether the last execution raised the truncate watermark.
    pub fn truncated(&self) -> bool {
        self.metrics
            .clone_inner()
            .sum_by_name(metric::WATERMARK)
            .map(|v| v.as_usize())
            .unwrap_or(0)
            > 0
    }

    /// `(keys, seq, origin)`: the order the sorted kernels fold in.
    fn fold_ordering(&self) -> Option<LexOrdering> {
        let schema = self.events.schema();
        let asc = SortOptions {
            descending: false,
            nulls_first: true,
        };
        let mut sort: Vec<PhysicalSortExpr> = self
            .key_exprs()
            .into_iter()
            .map(|e| PhysicalSortExpr::new(e, asc))
            .collect();
        for i in [self.spec.layout.seq(), self.spec.layout.origin()] {
            sort.push(PhysicalSortExpr::new(
                Arc::new(Column::new(schema.field(i).name(), i)),
                asc,
            ));
        }
        LexOrdering::new(sort)
    }

    fn key_exprs(&self) -> Vec<Arc<dyn PhysicalExpr>> {
        let schema = self.events.schema();
        self.spec
            .layout
            .key_indices
            .iter()
            .map(|&i| Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>)
            .collect()
    }
}

impl DisplayAs for AutoCdcExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let keys = self.spec.key_names();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "AutoCdcExec: flow={}, keys=[{}], stored_as={}, fold={}",
                    self.spec.flow,
                    keys.join(", "),
                    self.spec.stored_as,
                    self.engine().name()
                )?;
                if let Some(partitions) = self.key_exchange() {
                    write!(f, ", key_exchange={partitions}")?;
                }
                if let Some(buckets) = self.bucket_routing() {
                    write!(f, " by {buckets} buckets")?;
                }
                match &self.spec.late_through {
                    Some(through) => write!(f, ", late_through={through}"),
                    None => Ok(()),
                }
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "flow={}", self.spec.flow)?;
                writeln!(f, "keys=[{}]", keys.join(", "))?;
                write!(f, "fold={}", self.engine().name())?;
                if let Some(partitions) = self.key_exchange() {
                    write!(f, "\nkey_exchange={partitions}")?;
                }
                match self.bucket_routing() {
                    Some(buckets) => write!(f, " by {buckets} buckets"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// One partition's fold: an in-memory kernel or a sorted kernel, and the
/// fall-back between them ([`AdaptivePartition`]).
type FoldRun = AdaptivePartition<InMemoryFold, Box<dyn FoldKernel>>;

/// The in-memory engines of [`FoldEngine`].
enum InMemoryFold {
    IndexedScd1(Box<IndexedScd1Fold>),
    IndexedScd2(Box<IndexedScd2Fold>),
    IndexSorted(Box<IndexSortedFold>),
}

/// The fold's truncate input, collected once: sequences of this update's
/// TRUNCATE events, and the stored watermark (rows whose optional second
/// column, `__cdc_origin`, says `Stored`; see
/// [`FoldKernel::observe_stored_watermark`]).
#[derive(Debug, Clone, Default)]
struct TruncateSequences {
    events: Option<ArrayRef>,
    stored: Option<ArrayRef>,
}

impl TruncateSequences {
    fn try_new(batches: &[RecordBatch]) -> Result<Self> {
        let nonempty = |arrays: Vec<ArrayRef>| -> Result<Option<ArrayRef>> {
            let refs: Vec<&dyn arrow::array::Array> = arrays.iter().map(|a| a.as_ref()).collect();
            if refs.iter().all(|a| a.is_empty()) {
                return Ok(None);
            }
            Ok(Some(concat(&refs)?))
        };
        let (mut events, mut stored) = (Vec::new(), Vec::new());
        for batch in batches {
            let seqs = batch.column(0);
            match batch.columns().get(1) {
                None => events.push(Arc::clone(seqs)),
                Some(origins) => {
                    let is_stored = arrow::compute::kernels::cmp::eq(
                        origins,
                        &Int8Array::new_scalar(Origin::Stored as i8),
                    )?;
                    stored.push(arrow::compute::filter(seqs, &is_stored)?);
                    events.push(arrow::compute::filter(
                        seqs,
                        &arrow::compute::not(&is_stored)?,
                    )?);
                }
            }
        }
        Ok(Self {
            events: nonempty(events)?,
            stored: nonempty(stored)?,
        })
    }
}

impl SortedKernel for Box<dyn FoldKernel> {
    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        FoldKernel::push(self.as_mut(), batch)
    }
    fn finish(&mut self) -> Result<Option<RecordBatch>> {
        self.finish_all()
    }
}

impl IndexedKernel for InMemoryFold {
    fn push(&mut self, rows: KeyRows) -> Result<()> {
        match self {
            // indexes the rows where they are
            Self::IndexedScd1(fold) => fold.push_rows(&rows.batch, rows.rows.as_ref(), rows.source),
            Self::IndexedScd2(fold) => {
                let source = rows.source;
                fold.push_from(&rows.into_batch()?, source)
            }
            Self::IndexSorted(fold) => fold.push(&rows.into_batch()?),
        }
    }
    fn memory_size(&self) -> usize {
        match self {
            Self::IndexedScd1(fold) => fold.memory_size(),
            Self::IndexedScd2(fold) => fold.memory_size(),
            Self::IndexSorted(fold) => fold.memory_size(),
        }
    }
    fn finish(&mut self, scratch: &mut dyn FnMut(usize) -> bool) -> Result<()> {
        match self {
            Self::IndexedScd1(fold) => fold.finish(scratch),
            Self::IndexedScd2(fold) => fold.finish(scratch),
            Self::IndexSorted(fold) => {
                fold.finish(scratch);
                Ok(())
            }
        }
    }
    fn next_output(&mut self, batch_size: usize) -> Result<Option<RecordBatch>> {
        match self {
            Self::IndexedScd1(fold) => fold.next_output(batch_size),
            Self::IndexedScd2(fold) => fold.next_output(batch_size),
            Self::IndexSorted(fold) => fold.next_output(batch_size),
        }
    }
    fn into_batches(self) -> Result<Vec<RecordBatch>> {
        match self {
            Self::IndexedScd1(fold) => fold.into_batches(),
            Self::IndexedScd2(fold) => fold.into_batches(),
            Self::IndexSorted(fold) => Ok(fold.into_batches()),
        }
    }
}

impl InMemoryFold {
    /// Counts, truncate watermark and output schema of the kernel.
    fn results(&self) -> (FoldCounts, Option<ArrayRef>, SchemaRef) {
        match self {
            Self::IndexedScd1(fold) => (
                fold.counts(),
                fold.watermark_value().cloned(),
                Arc::clone(fold.output_schema()),
            ),
            Self::IndexedScd2(fold) => (fold.counts(), None, Arc::clone(fold.output_schema())),
            Self::IndexSorted(fold) => (
                fold.counts(),
                fold.watermark_value().cloned(),
                Arc::clone(fold.output_schema()),
            ),
        }
    }
}

struct FoldState {
    run: FoldRun,
    finished: bool,
    counters: Counters,
    baseline: BaselineMetrics,
}

struct Counters {
    input_rows: Count,
    upserted: Count,
    deleted: Count,
    tombstones: Count,
    late: Count,
    duplicates: Count,
    events_added: Count,
    watermark: Count,
    sort_fallbacks: Count,
}

impl Counters {
    fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let c = |name: &'static str| MetricBuilder::new(metrics).counter(name, partition);
        Self {
            input_rows: c(metric::INPUT_ROWS),
            upserted: c(metric::UPSERTED),
            deleted: c(metric::DELETED),
            tombstones: c(metric::TOMBSTONES),
            late: c(metric::LATE),
            duplicates: c(metric::DUPLICATES),
            events_added: c(metric::EVENTS_ADDED),
            watermark: c(metric::WATERMARK),
            sort_fallbacks: c(metric::SORT_FALLBACKS),
        }
    }

    fn record(&self, counts: FoldCounts) {
        self.input_rows.add(counts.input_rows);
        self.upserted.add(counts.upserted);
        self.deleted.add(counts.deleted);
        self.tombstones.add(counts.tombstones);
        self.late.add(counts.late);
        self.duplicates.add(counts.duplicates);
        self.events_added.add(counts.events_added);
    }
}

/// `input` without the events late against a watermark of the target
/// ([`LateEvents`]), counted as input rows and as late.
fn without_late_events(
    input: KeyRowsStream,
    late: LateEvents,
    counters: &Counters,
) -> KeyRowsStream {
    let (input_rows, late_rows) = (counters.input_rows.clone(), counters.late.clone());
    input.map(move |rows| {
        let rows = rows?;
        let source = rows.source;
        let (kept, dropped) = late.drop_late(&rows.into_batch()?)?;
        input_rows.add(dropped);
        late_rows.add(dropped);
        Ok(KeyRows {
            source,
            ..KeyRows::whole(kept)
        })
    })
}

impl FoldState {
    /// Next output batch, or `None` at the end.
    async fn next(&mut self) -> Result<Option<RecordBatch>> {
        if self.finished {
            return Ok(None);
        }
        if let Some(out) = self.run.next().await? {
            return Ok(Some(out));
        }
        self.finished = true;
        let (counts, watermark, schema) = match self.run.kernel()? {
            Finished::Sorted(fold) => (
                fold.counts(),
                fold.watermark_value().cloned(),
                Arc::clone(fold.output_schema()),
            ),
            Finished::Indexed(fold) => fold.results(),
        };
        self.counters.record(counts);
        // every partition carries the watermark: what a partition emits
        // does not depend on its number (the writer keeps one)
        match watermark {
            Some(wm) => {
                self.counters.watermark.add(1);
                Ok(Some(watermark_row(&schema, &wm)?))
            }
            None => Ok(None),
        }
    }
}

/// The truncate watermark row: keyless, kind TRUNCATE, sequence `wm`.
fn watermark_row(schema: &SchemaRef, wm: &ArrayRef) -> Result<RecordBatch> {
    let columns: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| match f.name().as_str() {
            SEQ_COL => Arc::clone(wm),
            KIND_COL => Arc::new(Int8Array::from(vec![Kind::Truncate as i8])) as ArrayRef,
            _ => new_null_array(f.data_type(), 1),
        })
        .collect();
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

impl ExecutionPlan for AutoCdcExec {
    fn name(&self) -> &str {
        "AutoCdcExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        let events = match self.exchange {
            // the operator routes its events itself
            Some(_) => Distribution::UnspecifiedDistribution,
            None => Distribution::KeyPartitioned(self.key_exprs()),
        };
        InputDistributionRequirements::new(vec![events, Distribution::SinglePartition])
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        if self.engine() != FoldEngine::Sorted {
            return vec![None, None];
        }
        vec![self.fold_ordering().map(OrderingRequirements::from), None]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![self.exchange.is_none(), false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.events, &self.truncates]
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
        if children.len() != 2 {
            return Err(DataFusionError::Internal(
                "AutoCdcExec needs two children".into(),
            ));
        }
        let truncates = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("missing child".into()))?;
        let events = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("missing child".into()))?;
        let exec = Self::try_new(self.spec.clone(), events, truncates)?;
        Ok(Arc::new(
            match (self.key_exchange(), self.bucket_routing()) {
                (Some(partitions), Some(buckets)) => exec.with_bucket_exchange(partitions, buckets),
                (Some(partitions), None) => exec.with_key_exchange(partitions),
                (None, _) => exec,
            },
        ))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = match &self.exchange {
            Some(exchange) => exchange.stream(&self.events, partition, &context, &self.metrics)?,
            None => KeyRowsStream::whole(self.events.execute(partition, Arc::clone(&context))?),
        };
        let engine = self.engine();
        let ordering = self
            .fold_ordering()
            .ok_or_else(|| DataFusionError::Internal("AutoCdcExec: flow without keys".into()))?;
        // in a bounded pool, leave at least half of it to the other
        // operators and to the sorts a fall-back needs
        let partitions = self.properties.partitioning.partition_count().max(1);
        let pool_share = match context.memory_pool().memory_limit() {
            MemoryLimit::Finite(limit) => limit / 2 / partitions,
            MemoryLimit::Infinite | MemoryLimit::Unknown => 0,
        };
        let indexed_cap = match (self.spec.indexed_fold_max_bytes, pool_share) {
            (0, share) => share,
            (cap, 0) => cap,
            (cap, share) => cap.min(share),
        };
        let sorting = Arc::clone(&self.sorting);
        let spec = self.spec.clone();
        let fold_spec = self.spec.clone();
        let truncates = Arc::clone(&self.truncates);
        let cell = Arc::clone(&self.truncate_sequences);
        let counters = Counters::new(&self.metrics, partition);
        let input = match &self.spec.late_through {
            Some(through) => {
                let late = LateEvents::try_new(&self.spec.layout, &input.schema(), through)?;
                without_late_events(input, late, &counters)
            }
            None => input,
        };
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let schema = Arc::clone(&self.schema);
        // an index-sorted fold routed by bucket gathers its events grouped
        // by bucket, as its target's writer takes them
        let bucket_groups = self.bucket_routing().map(|buckets| {
            let keys = self.spec.layout.key_indices.clone();
            let group_of: GroupOf = Arc::new(move |batch: &RecordBatch| {
                let columns: Vec<ArrayRef> =
                    keys.iter().map(|&k| Arc::clone(batch.column(k))).collect();
                bucket_array(&columns, batch.num_rows(), buckets)
            });
            (buckets.max(0) as usize, group_of)
        });
        let state = async move {
            let task = Arc::clone(&context);
            let collected = cell
                .get_or_init(|| async move {
                    let gather = async move {
                        let batches = collect(truncates, task).await?;
                        TruncateSequences::try_new(&batches)
                    };
                    gather.await.map_err(Arc::new)
                })
                .await;
            let seqs = collected
                .as_ref()
                .map_err(|e| DataFusionError::Shared(Arc::clone(e)))?
                .clone();
            // events at or below an earlier update's TRUNCATE are late
            let input = match (&seqs.stored, fold_spec.stored_as) {
                (Some(stored), ScdType::Type1) => {
                    let late = LateEvents::at_or_below(&fold_spec.layout, &input.schema(), stored)?;
                    without_late_events(input, late, &counters)
                }
                _ => input,
            };
            // a sorted kernel (from the start or after a fall-back) knows
            // the truncate watermark before its first event
            let watermark = seqs.clone();
            let sorted_kernel = move |schema: &SchemaRef| -> Result<Box<dyn FoldKernel>> {
                let mut kernel = spec.kernel(schema)?;
                if let Some(seqs) = &watermark.events {
                    kernel.observe_watermark(seqs)?;
                }
                if let Some(seqs) = &watermark.stored {
                    kernel.observe_stored_watermark(seqs)?;
                }
                Ok(kernel)
            };
            let fall_back = |make_sorted: Option<MakeSorted<Box<dyn FoldKernel>>>| FallBack {
                ordering,
                context: Arc::clone(&context),
                sorting,
                indexed_cap,
                partitions,
                fallbacks: counters.sort_fallbacks.clone(),
                elapsed_compute: baseline.elapsed_compute().clone(),
                make_sorted,
            };
            let in_memory = match engine {
                FoldEngine::Indexed if fold_spec.stored_as == ScdType::Type2 => {
                    let fold = Box::new(fold_spec.indexed_scd2_kernel(&input.schema())?);
                    for seqs in [&seqs.events, &seqs.stored].into_iter().flatten() {
                        fold.observe_watermark(seqs)?;
                    }
                    Some(InMemoryFold::IndexedScd2(fold))
                }
                FoldEngine::Indexed => {
                    let mut fold = Box::new(fold_spec.indexed_kernel(&input.schema())?);
                    if let Some(seqs) = &seqs.events {
                        fold.observe_watermark(seqs)?;
                    }
                    if let Some(seqs) = &seqs.stored {
                        fold.observe_stored_watermark(seqs)?;
                    }
                    Some(InMemoryFold::IndexedScd1(fold))
                }
                FoldEngine::IndexSorted => {
                    let schema = input.schema();
                    let mut fold = IndexSortedFold::try_new(
                        &fold_spec.flow,
                        &fold_spec.layout,
                        &schema,
                        sorted_kernel.clone()(&schema)?,
                    )?;
                    if let Some((buckets, group_of)) = bucket_groups {
                        fold = fold.with_groups(buckets, group_of);
                    }
                    Some(InMemoryFold::IndexSorted(Box::new(fold)))
                }
                FoldEngine::Sorted => None,
            };
            let run = match in_memory {
                Some(fold) => {
                    let reservation = MemoryConsumer::new(format!("AutoCdcExec[{partition}]"))
                        .with_can_spill(true)
                        .register(context.memory_pool());
                    FoldRun::indexed(
                        fold,
                        input,
                        reservation,
                        fall_back(Some(Box::new(sorted_kernel))),
                    )
                }
                None => {
                    let kernel = sorted_kernel(&input.schema())?;
                    FoldRun::sorted(kernel, input.into_batches(), fall_back(None))
                }
            };
            Ok::<_, DataFusionError>(FoldState {
                run,
                finished: false,
                counters,
                baseline,
            })
        };
        let stream = futures::stream::once(state)
            .map(|state| {
                let stream = futures::stream::try_unfold(state, |state| async move {
                    let mut state = state?;
                    let next = state.next().await?;
                    if let Some(b) = &next {
                        state.baseline.record_output(b.num_rows());
                    }
                    Ok(next.map(|b| (b, Ok(state))))
                });
                stream.boxed()
            })
            .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
