//! Falling back from an in-memory engine to DataFusion's spilling sort:
//! when to ([`must_fall_back`]) and how (`OneShotPartition` hands an
//! already-running stream to a plan once, so what the engine retained plus
//! the rest of its input feed a `SortExec`).
//!
//! In a bounded pool every partition's fall-back sort runs in a share of the
//! pool carved out for it ([`sort_share`]): the sort gets a greedy pool of
//! its own, whose size the partition holds as one reservation in the
//! session's pool until the sort's output is dropped. Without the carve-out
//! the partitions' sorts, their in-memory merges and the repartitioning
//! above them race for one greedy pool, and a merge that cannot grow fails
//! the whole update (`Resources exhausted` in `ExternalSorterMerge`).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use std::num::NonZeroUsize;

use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryLimit, MemoryPool, MemoryReservation, TrackConsumersPool,
};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;

/// Whether an in-memory (indexed) engine holding `size` bytes must give up
/// and sort: over its own `cap` (0: none), refused by the memory pool, or
/// another partition of its operator already `sorting`.
pub(crate) fn must_fall_back(
    size: usize,
    cap: usize,
    reservation: &mut MemoryReservation,
    sorting: &AtomicBool,
) -> bool {
    (cap > 0 && size > cap)
        || reservation.try_resize(size).is_err()
        || sorting.load(Ordering::Relaxed)
}

/// A stream handed to a plan once (the rest of a partition's input, or of
/// a run started earlier); executing it again is an error naming `what`.
pub(crate) struct OneShotPartition {
    schema: SchemaRef,
    what: String,
    stream: Mutex<Option<SendableRecordBatchStream>>,
}

impl OneShotPartition {
    pub(crate) fn new(what: impl Into<String>, stream: SendableRecordBatchStream) -> Self {
        Self {
            schema: stream.schema(),
            what: what.into(),
            stream: Mutex::new(Some(stream)),
        }
    }
}

impl fmt::Debug for OneShotPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OneShotPartition")
            .field("what", &self.what)
            .finish()
    }
}

impl PartitionStream for OneShotPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = self.stream.lock().ok().and_then(|mut s| s.take());
        match taken {
            Some(stream) => stream,
            None => {
                let error = DataFusionError::Execution(format!(
                    "{} was already read: it can be executed once",
                    self.what
                ));
                Box::pin(RecordBatchStreamAdapter::new(
                    Arc::clone(&self.schema),
                    futures::stream::once(async move { Err(error) }),
                ))
            }
        }
    }
}

/// Bytes of a bounded pool one partition's fall-back sort gets: a quarter of
/// the pool split between the operator's `partitions` — the other half is
/// left to the operators around it (repartitioning, writing), as the
/// indexed engines leave it (0 when the pool is unbounded).
pub(crate) fn sort_share(context: &TaskContext, partitions: usize) -> usize {
    match context.memory_pool().memory_limit() {
        MemoryLimit::Finite(limit) => limit / 2 / partitions.max(1),
        MemoryLimit::Infinite | MemoryLimit::Unknown => 0,
    }
}

/// Below this (or twice `sort_spill_reservation_bytes`) a share is not
/// carved out and the sort uses the session's pool, as without a share.
const MIN_VIABLE_SORT_POOL: usize = 1024 * 1024;

/// `retained` batches followed by the rest of `input`, sorted by `ordering`
/// with DataFusion's `SortExec` (spilling as the memory pool requires).
///
/// `reservation` is the engine's reservation in the session's pool; with a
/// `share` (bounded pool, see [`sort_share`]) it is grown to the share (or
/// kept at what the pool allows) and the sort runs in a pool of that size,
/// the reservation living as long as the sort's output. Without a share, or
/// when the pool cannot give one large enough for DataFusion's sort (twice
/// `sort_spill_reservation_bytes`, at least 1 MiB), the reservation is freed
/// and the sort uses the session's pool.
pub(crate) fn sort_retained_and_rest(
    retained: Vec<arrow::array::RecordBatch>,
    input: SendableRecordBatchStream,
    ordering: LexOrdering,
    context: Arc<TaskContext>,
    reservation: MemoryReservation,
    share: usize,
) -> Result<SendableRecordBatchStream> {
    let context = if share == 0 {
        reservation.free();
        context
    } else {
        // what the pool refuses the sort goes without: it spills sooner
        // (never more than the share: the other partitions have theirs)
        if reservation.size() < share {
            let _ = reservation.try_resize(share);
        }
        // a share too small for the sort's merge reservation and a batch
        // beside it would fail the sort: it then uses the session's pool
        let merge = context
            .session_config()
            .options()
            .execution
            .sort_spill_reservation_bytes;
        if reservation.size() < (2 * merge).max(MIN_VIABLE_SORT_POOL) {
            reservation.free();
            context
        } else {
            carved_context(&context, reservation.size())?
        }
    };
    let schema = input.schema();
    let rows = futures::stream::iter(retained.into_iter().map(Ok)).chain(input);
    let rows: SendableRecordBatchStream =
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&schema), rows));
    let source = StreamingTableExec::try_new(
        Arc::clone(&schema),
        vec![Arc::new(OneShotPartition::new(
            "the fall-back sort's input",
            rows,
        ))],
        None,
        Vec::<LexOrdering>::new(),
        false,
        None,
    )?;
    let sorted = SortExec::new(ordering, Arc::new(source)).execute(0, context)?;
    if reservation.size() == 0 {
        return Ok(sorted);
    }
    // the carved-out share is held until the sorted stream is dropped
    let held = futures::stream::unfold(
        (sorted, reservation),
        |(mut sorted, reservation)| async move {
            let next = sorted.next().await?;
            Some((next, (sorted, reservation)))
        },
    );
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, held)))
}

/// `context` with a greedy memory pool of `size` bytes of its own (the
/// caller holds `size` in the session's pool for it); disk manager, caches,
/// object stores and configuration are the session's.
fn carved_context(context: &TaskContext, size: usize) -> Result<Arc<TaskContext>> {
    const TOP_CONSUMERS: NonZeroUsize = NonZeroUsize::MIN.saturating_add(4);
    let pool: Arc<dyn MemoryPool> = Arc::new(TrackConsumersPool::new(
        GreedyMemoryPool::new(size),
        TOP_CONSUMERS,
    ));
    let runtime = RuntimeEnvBuilder::from_runtime_env(context.runtime_env().as_ref())
        .with_memory_pool(pool)
        .build_arc()?;
    Ok(Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        context.session_config().clone(),
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        runtime,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::execution::memory_pool::MemoryConsumer;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_expr::PhysicalSortExpr;

    const MB: usize = 1024 * 1024;

    fn batches(schema: &SchemaRef, rows: i64, per_batch: i64) -> Vec<RecordBatch> {
        (0..rows / per_batch)
            .map(|b| {
                // descending keys, so the sort has work to do
                let keys = (0..per_batch).map(|i| rows - (b * per_batch + i));
                RecordBatch::try_new(
                    Arc::clone(schema),
                    vec![Arc::new(Int64Array::from_iter_values(keys))],
                )
                .expect("batch")
            })
            .collect()
    }

    fn stream_of(schema: &SchemaRef, batches: Vec<RecordBatch>) -> SendableRecordBatchStream {
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(schema),
            futures::stream::iter(batches.into_iter().map(Ok)),
        ))
    }

    fn by_k(schema: &SchemaRef) -> LexOrdering {
        LexOrdering::new(vec![PhysicalSortExpr::new_default(
            col("k", schema).expect("column"),
        )])
        .expect("ordering")
    }

    /// The fall-back sort runs in a share carved out of a bounded pool: the
    /// session's pool holds exactly the share (never more: the other
    /// partitions have theirs) while the sorted stream lives (whatever the
    /// sort itself uses, spilling inside it) and nothing once it is
    /// dropped; the rows come out sorted.
    #[tokio::test]
    async fn the_fall_back_sort_runs_in_a_carved_out_share() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(128 * MB));
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::clone(&pool))
            .build_arc()
            .expect("runtime");
        let context = Arc::new(TaskContext::default().with_runtime(runtime));
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let share = sort_share(&context, 2);
        assert_eq!(share, 32 * MB);

        // 4 MB retained, 32 MB more to come: more than the share, so it spills
        let retained = batches(&schema, 512 * 1024, 8192);
        let rest = batches(&schema, 4 * 1024 * 1024, 8192);
        let input = stream_of(&schema, rest);
        let reservation = MemoryConsumer::new("engine").register(&pool);
        reservation.try_grow(4 * MB).expect("grow");
        let ordering = by_k(&schema);
        let mut sorted = sort_retained_and_rest(
            retained,
            input,
            ordering,
            Arc::clone(&context),
            reservation,
            share,
        )
        .expect("sort");
        assert_eq!(pool.reserved(), 32 * MB, "the share");

        let mut rows = 0;
        let mut last = i64::MIN;
        while let Some(batch) = sorted.next().await {
            let batch = batch.expect("sorted batch");
            assert_eq!(pool.reserved(), 32 * MB);
            let keys = batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("keys");
            for k in keys.values() {
                assert!(*k >= last, "{k} after {last}");
                last = *k;
            }
            rows += batch.num_rows();
        }
        assert_eq!(rows, 512 * 1024 + 4 * 1024 * 1024);
        drop(sorted);
        assert_eq!(pool.reserved(), 0);
    }

    /// A share too small to carve out (under 1 MiB here) is given back: the
    /// sort runs in the session's pool, as without a share.
    #[tokio::test]
    async fn a_share_too_small_is_not_carved_out() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(2 * MB));
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::clone(&pool))
            .build_arc()
            .expect("runtime");
        let mut config = datafusion::prelude::SessionConfig::new();
        config.options_mut().execution.sort_spill_reservation_bytes = 0;
        let context = Arc::new(
            TaskContext::default()
                .with_session_config(config)
                .with_runtime(runtime),
        );
        let share = sort_share(&context, 2);
        assert_eq!(share, MB / 2);
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let reservation = MemoryConsumer::new("engine").register(&pool);
        reservation.try_grow(1024).expect("grow");
        let input = stream_of(&schema, batches(&schema, 16, 4));
        let ordering = by_k(&schema);
        let sorted =
            sort_retained_and_rest(Vec::new(), input, ordering, context, reservation, share)
                .expect("sort");
        assert_eq!(pool.reserved(), 0, "nothing held for a share");
        let out: Vec<RecordBatch> = sorted.map(|b| b.expect("batch")).collect().await;
        let keys: Vec<i64> = out
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .expect("keys")
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(keys, (1..=16).collect::<Vec<i64>>());
    }

    /// Without a share (unbounded pool) the engine's reservation is freed
    /// and the sort uses the session's pool.
    #[tokio::test]
    async fn without_a_share_the_sort_uses_the_session_pool() {
        let context = Arc::new(TaskContext::default());
        assert_eq!(sort_share(&context, 2), 0);
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let reservation = MemoryConsumer::new("engine").register(context.memory_pool());
        reservation.grow(1024);
        let input = stream_of(&schema, batches(&schema, 16, 4));
        let ordering = by_k(&schema);
        let sorted = sort_retained_and_rest(Vec::new(), input, ordering, context, reservation, 0)
            .expect("sort");
        let out: Vec<RecordBatch> = sorted.map(|b| b.expect("batch")).collect().await;
        assert_eq!(out.iter().map(RecordBatch::num_rows).sum::<usize>(), 16);
    }
}
