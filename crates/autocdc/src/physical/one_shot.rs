//! Falling back from an in-memory engine to DataFusion's spilling sort:
//! when to ([`must_fall_back`]) and how (`OneShotPartition` hands an
//! already-running stream to a plan once, so what the engine retained plus
//! the rest of its input feed a `SortExec`).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
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

/// A stream handed to a plan once (the rest of a partition's input).
pub(crate) struct OneShotPartition {
    schema: SchemaRef,
    stream: Mutex<Option<SendableRecordBatchStream>>,
}

impl OneShotPartition {
    pub(crate) fn new(schema: SchemaRef, stream: SendableRecordBatchStream) -> Self {
        Self {
            schema,
            stream: Mutex::new(Some(stream)),
        }
    }
}

impl fmt::Debug for OneShotPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OneShotPartition")
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
            None => Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.schema),
                futures::stream::once(async {
                    Err(DataFusionError::Internal(
                        "fall-back input executed twice".into(),
                    ))
                }),
            )),
        }
    }
}

/// `retained` batches followed by the rest of `input`, sorted by `ordering`
/// with DataFusion's `SortExec` (spilling as the memory pool requires).
pub(crate) fn sort_retained_and_rest(
    retained: Vec<arrow::array::RecordBatch>,
    input: SendableRecordBatchStream,
    ordering: LexOrdering,
    context: Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let schema = input.schema();
    let rows = futures::stream::iter(retained.into_iter().map(Ok)).chain(input);
    let rows: SendableRecordBatchStream =
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&schema), rows));
    let source = StreamingTableExec::try_new(
        Arc::clone(&schema),
        vec![Arc::new(OneShotPartition::new(schema, rows))],
        None,
        Vec::<LexOrdering>::new(),
        false,
        None,
    )?;
    SortExec::new(ordering, Arc::new(source)).execute(0, context)
}
