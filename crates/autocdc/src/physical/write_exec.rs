//! `CdcWriteExec`: writes the new state of a target into files, commits nothing.
//!
//! ```text
//!   CdcCommitExec
//!        ▲  manifest rows: one per file (its Delta `Add`) + a summary
//!   CdcWriteExec ── data files, one series per key bucket ─┐
//!        ▲          change data feed files (_change_data/) ├─► object store
//!        │          the truncate watermark row (bucket -1) ┘
//!   AutoCdcExec  (N partitions, gathered here; or an append flow's rows)
//! ```
//!
//! The fold's partitions are gathered and their rows routed by key bucket to
//! one writer task per target partition, each owning the files of its
//! buckets, so a bucket gets one file series per update whatever the
//! fold's partitioning. Every fold partition carries the truncate watermark
//! row when the target has one; it is written once. The output is the
//! manifest ([`crate::table::manifest`]): the commit reads it and nothing
//! else.
//!
//! *Per partition* (for plans run by a cluster, whose tasks each run one
//! partition of the fold, and for a fold that routes its events by the
//! target's buckets, `AutoCdcExec::with_bucket_exchange`): partition `p`
//! writes the rows of fold partition `p` and returns their manifest, so a
//! bucket gets a file series per fold partition that holds its keys — one,
//! when the fold routes by bucket: each partition then writes its own
//! buckets, in the order it emits them, with no gathering of partitions
//! and no writer waiting on another's. Each partition writes the watermark
//! row it carries; the commit keeps one of those files
//! ([`Manifest`](crate::table::manifest::Manifest)).

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::{AsArray, BooleanArray, Int8Array, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::compute::kernels::cmp::eq;
use arrow::datatypes::{Int8Type, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};

use super::codec::store_from_runtime;
use super::{AutoCdcExec, StoreResolver};
use crate::fold::columns::KIND_COL;
use crate::fold::{FoldCounts, Kind};
use crate::logical::WriteRequest;
use crate::table::commit::{write_rows, ChangeFeed, FileWriting, OutcomeSlot, Retired};
use crate::table::manifest::{encode, manifest_schema};

/// Writes an update's files and returns their manifest (see the module docs).
pub struct CdcWriteExec {
    request: Arc<WriteRequest>,
    input: Arc<dyn ExecutionPlan>,
    /// Whether each fold partition is written by a partition of its own.
    per_partition: bool,
    /// Where a DML statement's rows operator leaves its counts and the
    /// rows it retires (`None`: the input is a fold or an append flow's rows).
    statement: Option<OutcomeSlot>,
    /// Finds the object store of the request's location when it runs.
    stores: StoreResolver,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl CdcWriteExec {
    /// Whether each fold partition is written by a partition of its own
    /// (see the module docs).
    pub fn is_per_partition(&self) -> bool {
        self.per_partition
    }

    /// The operator writing each fold partition in a partition of its own.
    pub fn per_partition(self, per_partition: bool) -> Self {
        let partitions = if per_partition {
            self.input.output_partitioning().partition_count()
        } else {
            1
        };
        Self {
            per_partition,
            properties: Arc::new(write_properties(partitions)),
            ..self
        }
    }

    /// The operator writing a DML statement's rows: their operator leaves
    /// the statement's counts and retired rows in `slot`, passed on in the
    /// manifest.
    pub fn for_statement(self, slot: OutcomeSlot) -> Self {
        Self {
            statement: Some(slot),
            ..self
        }
    }

    /// The operator finding its store with `resolver` (the codec's, in a
    /// process whose stores are not registered in its `RuntimeEnv`).
    pub fn with_store_resolver(self, resolver: StoreResolver) -> Self {
        Self {
            stores: resolver,
            ..self
        }
    }

    /// Whether the operator writes a DML statement's rows (a plan that runs
    /// where it was planned: the codec refuses it).
    pub fn is_statement(&self) -> bool {
        self.statement.is_some()
    }

    /// Where and how the operator writes.
    pub fn request(&self) -> &Arc<WriteRequest> {
        &self.request
    }

    /// Create the operator over `input`: a fold, or rows in the data file
    /// layout (an append flow's).
    pub fn try_new(request: Arc<WriteRequest>, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Ok(Self {
            request,
            input,
            per_partition: false,
            statement: None,
            stores: Arc::new(store_from_runtime),
            properties: Arc::new(write_properties(1)),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl fmt::Debug for CdcWriteExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CdcWriteExec")
            .field("request", &self.request)
            .field("per_partition", &self.per_partition)
            .field("statement", &self.statement.is_some())
            .finish_non_exhaustive()
    }
}

fn write_properties(partitions: usize) -> PlanProperties {
    PlanProperties::new(
        EquivalenceProperties::new(manifest_schema()),
        Partitioning::UnknownPartitioning(partitions),
        EmissionType::Final,
        Boundedness::Bounded,
    )
}

/// Metrics of [`CdcWriteExec`].
#[derive(Debug, Clone)]
struct WriteMetrics {
    /// Data files written (state rows and the watermark).
    files_written: Count,
    /// Change data feed files written.
    change_files_written: Count,
    /// Rows written, to data and change files.
    rows_written: Count,
    /// Bytes of the files written.
    bytes_written: Count,
    /// Time from the first row to the last file closed.
    write_time: Time,
}

impl WriteMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        let m = || MetricBuilder::new(metrics);
        Self {
            files_written: m().counter("num_files_written", 0),
            change_files_written: m().counter("num_change_files_written", 0),
            rows_written: m().counter("num_rows_written", 0),
            bytes_written: m().counter("bytes_written", 0),
            write_time: m().subset_time("write_time", 0),
        }
    }
}

impl DisplayAs for CdcWriteExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(f, "CdcWriteExec: {}", self.request)?;
                if self.per_partition {
                    write!(f, ", per_partition")?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => {
                writeln!(f, "target={}", self.request.target)?;
                write!(f, "buckets={}", self.request.buckets)?;
                if self.request.change_feed == ChangeFeed::FromAdds {
                    write!(f, "\nchange_feed=from_adds")?;
                }
                Ok(())
            }
        }
    }
}

impl ExecutionPlan for CdcWriteExec {
    fn name(&self) -> &str {
        "CdcWriteExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    /// The write takes the fold's partitions as they are: a fold of one
    /// partition (a small input) must not get a round-robin repartition
    /// between it and the write, which writes the output of a fold only.
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
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("CdcWriteExec needs one child".into()))?;
        let exec =
            Self::try_new(Arc::clone(&self.request), input)?.per_partition(self.per_partition);
        Ok(Arc::new(Self {
            statement: self.statement.clone(),
            stores: Arc::clone(&self.stores),
            ..exec
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let partitions = self.properties.output_partitioning().partition_count();
        if partition >= partitions {
            return Err(DataFusionError::Internal(format!(
                "CdcWriteExec has {partitions} partitions, got {partition}"
            )));
        }
        // (the store of the table's location, as this task's process has it)
        let store = (self.stores)(&self.request.location, &context)?;
        let index_cache = context
            .runtime_env()
            .cache_manager
            .get_file_metadata_cache();
        let (rows, writers) = if self.per_partition {
            (self.input.execute(partition, context)?, 1)
        } else {
            let writers = context.session_config().target_partitions();
            // the fold's partitions run on tasks of their own
            let rows = if self.input.output_partitioning().partition_count() > 1 {
                CoalescePartitionsExec::new(Arc::clone(&self.input)).execute(0, context)?
            } else {
                self.input.execute(0, context)?
            };
            (rows, writers)
        };
        let per_partition = self.per_partition;
        let metrics = WriteMetrics::new(&self.metrics);
        let rows = OneWatermark::new(rows, metrics.rows_written.clone())?;
        let saw_watermark = rows.seen();
        let request = Arc::clone(&self.request);
        let fold = Arc::clone(&self.input);
        let statement = self.statement.clone();
        let write = async move {
            let timer = metrics.write_time.timer();
            let written = write_rows(
                &store,
                Box::pin(rows),
                &request.key_indices,
                request.buckets,
                FileWriting {
                    compression: request.compression,
                    tasks: writers,
                    index_cache: Some(index_cache),
                },
                request.change_feed,
            )
            .await?;
            timer.done();
            metrics.files_written.add(written.adds.len());
            metrics.change_files_written.add(written.change_files.len());
            let bytes = written
                .adds
                .iter()
                .chain(&written.change_files)
                .map(|a| a.size.max(0) as usize)
                .sum();
            metrics.bytes_written.add(bytes);
            if let Some(slot) = statement {
                let outcome = slot
                    .lock()
                    .map_err(|_| DataFusionError::Internal("poisoned statement outcome".into()))?
                    .take()
                    .ok_or_else(|| {
                        DataFusionError::Internal(format!(
                            "{}: the statement's rows left no outcome",
                            request.target
                        ))
                    })?;
                return encode(
                    &written,
                    &outcome.retired,
                    &outcome.counts,
                    saw_watermark.value() > 0,
                );
            }
            let counts = match fold.downcast_ref::<AutoCdcExec>() {
                Some(fold) if per_partition => fold.partition_counts(partition),
                Some(fold) => fold.counts(),
                // rows that are not a fold's (an append flow's) are new rows
                None => {
                    let rows = metrics.rows_written.value();
                    FoldCounts {
                        input_rows: rows,
                        upserted: rows,
                        ..Default::default()
                    }
                }
            };
            encode(
                &written,
                &Retired::default(),
                &counts,
                saw_watermark.value() > 0,
            )
        };
        Ok(Box::pin(CdcWriteStream {
            state: WriteState::Writing(write.boxed()),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// The fold's rows with the truncate watermark row kept once (every fold
/// partition carries it); counts the rows passed on.
struct OneWatermark {
    input: SendableRecordBatchStream,
    kind: usize,
    /// Watermark rows passed on (0 or 1).
    seen: Count,
    rows: Count,
}

impl OneWatermark {
    fn new(input: SendableRecordBatchStream, rows: Count) -> Result<Self> {
        let kind = input.schema().index_of(KIND_COL)?;
        Ok(Self {
            input,
            kind,
            seen: Count::new(),
            rows,
        })
    }

    /// Shared count of watermark rows passed on.
    fn seen(&self) -> Count {
        self.seen.clone()
    }

    fn pass(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let kinds = batch.column(self.kind).as_primitive::<Int8Type>();
        let watermarks = eq(kinds, &Int8Array::new_scalar(Kind::Truncate as i8))?;
        let batch = if watermarks.true_count() == 0 {
            batch
        } else {
            // keep the first watermark row of the update, drop the others
            let mut first = self.seen.value() == 0;
            let keep: BooleanArray = watermarks
                .iter()
                .map(|w| {
                    Some(match w {
                        Some(true) => std::mem::replace(&mut first, false),
                        _ => true,
                    })
                })
                .collect();
            if self.seen.value() == 0 {
                self.seen.add(1);
            }
            filter_record_batch(&batch, &keep)?
        };
        self.rows.add(batch.num_rows());
        Ok(batch)
    }
}

impl Stream for OneWatermark {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.input.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(batch))) => Poll::Ready(Some(self.pass(batch))),
            other => other,
        }
    }
}

impl RecordBatchStream for OneWatermark {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
}

/// States of [`CdcWriteStream`].
enum WriteState {
    /// Writing the files; resolves to the manifest.
    Writing(BoxFuture<'static, Result<RecordBatch>>),
    /// The manifest was returned (or the write failed).
    Done,
}

/// The output of [`CdcWriteExec`]: one manifest batch once every file is written.
struct CdcWriteStream {
    state: WriteState,
}

impl Stream for CdcWriteStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match &mut self.state {
            WriteState::Writing(write) => match write.poll_unpin(cx) {
                Poll::Ready(manifest) => {
                    self.state = WriteState::Done;
                    Poll::Ready(Some(manifest))
                }
                Poll::Pending => Poll::Pending,
            },
            WriteState::Done => Poll::Ready(None),
        }
    }
}

impl RecordBatchStream for CdcWriteStream {
    fn schema(&self) -> SchemaRef {
        manifest_schema()
    }
}
