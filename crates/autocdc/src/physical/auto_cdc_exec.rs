//! `AutoCdcExec`: the physical form of [`crate::logical::AutoCdcNode`].
//!
//! ```text
//!            AutoCdcExec  (one fold per partition)
//!             ▲                 ▲
//!   sorted by (keys, seq,       │ SinglePartition, collected once and
//!   origin), partitioned by     │ shared by all partitions
//!   keys                        │
//!   events (stored ∪ new)    truncate sequences
//! ```
//!
//! The operator only declares what it needs — key partitioning and
//! `(keys, seq, origin)` ordering on the events — and DataFusion inserts the
//! repartitioning and (spilling) sorts, so it runs on all cores with memory
//! bounded by the session's pool. Partition 0 also emits the truncate
//! watermark row.

use std::fmt;
use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, Int8Array, RecordBatch};
use arrow::compute::{concat, SortOptions};
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
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

use crate::fold::columns::{KIND_COL, SEQ_COL};
use crate::fold::{FoldCounts, FoldKernel, FoldSpec, Kind};

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
    truncate_sequences: Arc<OnceCell<std::result::Result<Option<ArrayRef>, Arc<DataFusionError>>>>,
}

/// Metric names reported by [`AutoCdcExec`].
pub mod metric {
    /// New events read.
    pub const INPUT_ROWS: &str = "num_input_rows";
    /// Live rows inserted or updated.
    pub const UPSERTED: &str = "num_upserted_rows";
    /// Live rows removed.
    pub const DELETED: &str = "num_deleted_rows";
    /// Tombstones written.
    pub const TOMBSTONES: &str = "num_tombstones_written";
    /// Late (or replayed) events dropped.
    pub const LATE: &str = "num_late_rows_dropped";
    /// Duplicate events dropped.
    pub const DUPLICATES: &str = "num_duplicate_rows_dropped";
    /// New events added to stored histories (SCD 2).
    pub const EVENTS_ADDED: &str = "num_events_added";
    /// Truncate watermark raised (1) or not (0).
    pub const WATERMARK: &str = "num_truncates_applied";
}

impl AutoCdcExec {
    /// Create the operator over its two inputs (see the module docs).
    pub fn try_new(
        spec: FoldSpec,
        events: Arc<dyn ExecutionPlan>,
        truncates: Arc<dyn ExecutionPlan>,
    ) -> Result<Self> {
        let schema = spec.output_schema(events.schema().as_ref())?;
        let properties = Arc::new(Self::compute_properties(&events, Arc::clone(&schema)));
        Ok(Self {
            spec,
            events,
            truncates,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
            truncate_sequences: Arc::new(OnceCell::new()),
        })
    }

    fn compute_properties(events: &Arc<dyn ExecutionPlan>, schema: SchemaRef) -> PlanProperties {
        PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(events.output_partitioning().partition_count()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        )
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

    /// Whether the last execution raised the truncate watermark.
    pub fn truncated(&self) -> bool {
        self.metrics
            .clone_inner()
            .sum_by_name(metric::WATERMARK)
            .map(|v| v.as_usize())
            .unwrap_or(0)
            > 0
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
                    "AutoCdcExec: flow={}, keys=[{}], stored_as={}",
                    self.spec.flow,
                    keys.join(", "),
                    self.spec.stored_as
                )
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "flow={}", self.spec.flow)?;
                write!(f, "keys=[{}]", keys.join(", "))
            }
        }
    }
}

struct FoldState {
    fold: Box<dyn FoldKernel>,
    input: SendableRecordBatchStream,
    finished: bool,
    partition: usize,
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

impl FoldState {
    /// Next output batch, or `None` at the end.
    async fn next(&mut self) -> Result<Option<RecordBatch>> {
        if self.finished {
            return Ok(None);
        }
        while let Some(batch) = self.input.next().await {
            let batch = batch?;
            let _timer = self.baseline.elapsed_compute().timer();
            if let Some(out) = self.fold.push(&batch)? {
                if out.num_rows() > 0 {
                    return Ok(Some(out));
                }
            }
        }
        self.finished = true;
        let mut parts = Vec::new();
        if let Some(last) = self.fold.finish_all()? {
            parts.push(last);
        }
        if self.partition == 0 {
            if let Some(wm) = self.fold.watermark_value() {
                parts.push(self.watermark_row(wm)?);
                self.counters.watermark.add(1);
            }
        }
        self.counters.record(self.fold.counts());
        if parts.is_empty() {
            return Ok(None);
        }
        Ok(Some(arrow::compute::concat_batches(
            self.fold.output_schema(),
            &parts,
        )?))
    }

    /// The truncate watermark row: keyless, kind TRUNCATE, sequence `wm`.
    fn watermark_row(&self, wm: &ArrayRef) -> Result<RecordBatch> {
        let schema = self.fold.output_schema();
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
}

impl ExecutionPlan for AutoCdcExec {
    fn name(&self) -> &str {
        "AutoCdcExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        InputDistributionRequirements::new(vec![
            Distribution::KeyPartitioned(self.key_exprs()),
            Distribution::SinglePartition,
        ])
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
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
        vec![LexOrdering::new(sort).map(OrderingRequirements::from), None]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![true, false]
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
        Ok(Arc::new(Self::try_new(
            self.spec.clone(),
            events,
            truncates,
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.events.execute(partition, Arc::clone(&context))?;
        let fold = self.spec.kernel(&input.schema())?;
        let truncates = Arc::clone(&self.truncates);
        let cell = Arc::clone(&self.truncate_sequences);
        let counters = Counters::new(&self.metrics, partition);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let schema = Arc::clone(&self.schema);
        let state = async move {
            let collected = cell
                .get_or_init(|| async move {
                    let gather = async move {
                        let batches = collect(truncates, context).await?;
                        let arrays: Vec<&dyn arrow::array::Array> =
                            batches.iter().map(|b| b.column(0).as_ref()).collect();
                        if arrays.is_empty() {
                            return Ok::<_, DataFusionError>(None);
                        }
                        Ok(Some(concat(&arrays)?))
                    };
                    gather.await.map_err(Arc::new)
                })
                .await;
            let seqs = collected
                .as_ref()
                .map_err(|e| DataFusionError::Shared(Arc::clone(e)))?;
            let mut fold = fold;
            if let Some(seqs) = seqs {
                if !seqs.is_empty() {
                    fold.observe_watermark(seqs)?;
                }
            }
            Ok::<_, DataFusionError>(FoldState {
                fold,
                input,
                finished: false,
                partition,
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
