//! The key exchange of an indexed fold: each fold partition receives the
//! input's batches whole, shared, with the positions of the rows whose keys
//! are its own — no row is copied on the way.
//!
//! ```text
//!  input partition 0 ──► route ──┬─► (batch, rows of partition 0) ──► fold 0
//!  input partition 1 ──► route ──┼─► (batch, rows of partition 1) ──► fold 1
//!        …                       └─► …
//!  route: hash the key columns, a partition per hash (as DataFusion's
//!  hash repartition does) or per key bucket, positions per partition, one
//!  shared batch
//! ```
//!
//! DataFusion's `RepartitionExec` gathers each output partition's rows into
//! a batch of its own (`take` of every column): for a fold that retains its
//! batches and indexes their rows by position anyway, that copy of every
//! event (and the strings in them) is wasted, and is the cost that a second
//! core paid and the first did not. Routing is one task per input
//! partition. A router waits while every partition still read has a few
//! batches queued (the gate of DataFusion's repartition, which waits at
//! one): a reader that drains the partitions one after another is never
//! stalled, and the routers go no faster than the fastest reader, so that
//! batches queue only ahead of slower ones (a fold that spills, a partition
//! not read yet; as in DataFusion, those queues are not bounded, and a
//! partition that receives no rows at all leaves the gate open). A
//! partition's stream ends when every input partition has ended; an input's
//! error reaches every partition. The tasks stop when the streams are
//! dropped.
//!
//! A fold that feeds a target's writer routes by the key's bucket in the
//! target ([`Routing::Buckets`]): every bucket is then folded by one
//! partition, which writes it itself; an index-sorted fold emits its rows
//! in key order, so each bucket's row groups arrive sorted and are written
//! without a sort (`crate::table::writer`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::hash_utils::{create_hashes, RandomState};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, Time};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion_common_runtime::SpawnedTask;
use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::Notify;

use crate::table::bucket::bucket_array;

/// A batch and the rows of it that are one partition's (all when `rows` is
/// `None`).
#[derive(Debug, Clone)]
pub(crate) struct KeyRows {
    pub batch: RecordBatch,
    /// Ascending positions in `batch`.
    pub rows: Option<UInt32Array>,
    /// The input partition the batch came from: a fold orders a key's
    /// events partition by partition before it sorts them by sequence (see
    /// `EventIndex::sort`).
    pub source: u32,
}

impl KeyRows {
    /// All of `batch` (of the first input partition).
    pub fn whole(batch: RecordBatch) -> Self {
        Self {
            batch,
            rows: None,
            source: 0,
        }
    }

    /// The partition's rows as a batch of their own (a copy where the
    /// batch is shared).
    pub fn into_batch(self) -> Result<RecordBatch> {
        match self.rows {
            Some(rows) => Ok(take_record_batch(&self.batch, &rows)?),
            None => Ok(self.batch),
        }
    }
}

/// A stream of one partition's [`KeyRows`].
pub(crate) struct KeyRowsStream {
    schema: SchemaRef,
    rows: BoxStream<'static, Result<KeyRows>>,
}

impl KeyRowsStream {
    /// Every row of every batch of `input`.
    pub fn whole(input: SendableRecordBatchStream) -> Self {
        Self {
            schema: input.schema(),
            rows: input.map(|b| b.map(KeyRows::whole)).boxed(),
        }
    }

    /// The schema of the batches.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// The next batch and its rows.
    pub async fn next(&mut self) -> Option<Result<KeyRows>> {
        self.rows.next().await
    }

    /// The stream with `f` applied to each item.
    pub fn map(self, f: impl FnMut(Result<KeyRows>) -> Result<KeyRows> + Send + 'static) -> Self {
        Self {
            schema: self.schema,
            rows: self.rows.map(f).boxed(),
        }
    }

    /// The partition's rows as batches of their own (shared batches copied).
    pub fn into_batches(self) -> SendableRecordBatchStream {
        let batches = self.rows.map(|r| r.and_then(KeyRows::into_batch));
        Box::pin(RecordBatchStreamAdapter::new(self.schema, batches))
    }
}

/// Hash state of the routing (fixed: the same keys go to the same
/// partition in every run).
const ROUTING: RandomState = RandomState::with_seed(0x0a07_0cdc);

/// How an exchange chooses the partition of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Routing {
    /// By a hash of the key, as DataFusion's hash repartition does.
    Hash,
    /// By the key's bucket in a target of this many buckets (a multiple of
    /// the partitions, so that each partition gets as many): partition
    /// `bucket % partitions`.
    Buckets(i32),
}

/// Routes the batches of an input's partitions to `partitions` folds by
/// their keys (see the module docs). One per operator; each execution of
/// the operator's partitions starts a run.
#[derive(Debug)]
pub(crate) struct KeyExchange {
    /// Positions of the key columns in the input.
    keys: Vec<usize>,
    partitions: usize,
    routing: Routing,
    run: Mutex<Option<Run>>,
}

/// One execution: the partitions' receivers not taken yet, the gate, and
/// the routing tasks (aborted when the last stream holding them is
/// dropped).
#[derive(Debug)]
struct Run {
    receivers: Vec<Option<UnboundedReceiver<Result<KeyRows>>>>,
    gate: Arc<Gate>,
    tasks: Arc<Vec<SpawnedTask<()>>>,
}

/// Batches the routers may queue for every partition before they wait: a
/// little reading ahead, so that a fold seldom finds its queue empty (on
/// the 10 M-event load as fast as DataFusion's one, and as without a gate).
const AHEAD: usize = 4;

/// The backpressure of one run (see the module docs).
#[derive(Debug)]
struct Gate {
    /// Batches sent to each partition and not received yet.
    queued: Vec<AtomicUsize>,
    /// Whether each partition's stream was dropped.
    dropped: Vec<AtomicBool>,
    /// Woken when a queue empties or a stream is dropped.
    room: Notify,
}

impl Gate {
    fn new(partitions: usize) -> Self {
        Self {
            queued: (0..partitions).map(|_| AtomicUsize::new(0)).collect(),
            dropped: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
            room: Notify::new(),
        }
    }

    /// Whether every partition still read has [`AHEAD`] batches queued.
    fn full(&self) -> bool {
        let mut read = false;
        for (queued, dropped) in self.queued.iter().zip(&self.dropped) {
            if dropped.load(Ordering::Acquire) {
                continue;
            }
            read = true;
            if queued.load(Ordering::Acquire) < AHEAD {
                return false;
            }
        }
        read
    }

    /// Wait until some partition still read has fewer than [`AHEAD`]
    /// batches queued.
    async fn room(&self) {
        loop {
            let mut woken = std::pin::pin!(self.room.notified());
            woken.as_mut().enable();
            if !self.full() {
                return;
            }
            woken.await;
        }
    }

    fn sent(&self, partition: usize) {
        self.queued[partition].fetch_add(1, Ordering::AcqRel);
    }

    fn received(&self, partition: usize) {
        if self.queued[partition].fetch_sub(1, Ordering::AcqRel) == AHEAD {
            self.room.notify_waiters();
        }
    }

    fn drop_partition(&self, partition: usize) {
        self.dropped[partition].store(true, Ordering::Release);
        self.room.notify_waiters();
    }
}

/// One partition's end of a run: tells the gate what it receives, and that
/// it is gone when dropped.
struct Reader {
    receiver: UnboundedReceiver<Result<KeyRows>>,
    partition: usize,
    gate: Arc<Gate>,
    /// Keeps the routers running while the partition is read.
    _tasks: Arc<Vec<SpawnedTask<()>>>,
}

impl Reader {
    async fn next(&mut self) -> Option<Result<KeyRows>> {
        let next = self.receiver.recv().await?;
        self.gate.received(self.partition);
        Some(next)
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.gate.drop_partition(self.partition);
    }
}

impl KeyExchange {
    /// An exchange over the key columns at `keys` into `partitions`,
    /// routing by `routing`.
    pub fn new(keys: Vec<usize>, partitions: usize, routing: Routing) -> Self {
        Self {
            keys,
            partitions: partitions.max(1),
            routing,
            run: Mutex::new(None),
        }
    }

    /// Number of output partitions.
    pub fn partitions(&self) -> usize {
        self.partitions
    }

    /// How keys are routed.
    pub fn routing(&self) -> Routing {
        self.routing
    }

    /// The rows of `partition`'s keys in `input`'s batches. The first call
    /// of a run executes every partition of `input`.
    pub fn stream(
        &self,
        input: &Arc<dyn ExecutionPlan>,
        partition: usize,
        context: &Arc<TaskContext>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Result<KeyRowsStream> {
        if partition >= self.partitions {
            return Err(DataFusionError::Internal(format!(
                "key exchange of {} partitions asked for partition {partition}",
                self.partitions
            )));
        }
        let mut run = self
            .run
            .lock()
            .map_err(|_| DataFusionError::Internal("key exchange lock poisoned".into()))?;
        let taken = run
            .as_ref()
            .is_none_or(|r| r.receivers[partition].is_none());
        if taken {
            *run = Some(self.start(input, context, metrics)?);
        }
        let run = run
            .as_mut()
            .ok_or_else(|| DataFusionError::Internal("key exchange not started".into()))?;
        let receiver = run.receivers[partition]
            .take()
            .ok_or_else(|| DataFusionError::Internal("key exchange partition taken".into()))?;
        let reader = Reader {
            receiver,
            partition,
            gate: Arc::clone(&run.gate),
            _tasks: Arc::clone(&run.tasks),
        };
        let rows = futures::stream::unfold(reader, |mut reader| async move {
            let next = reader.next().await?;
            Some((next, reader))
        });
        Ok(KeyRowsStream {
            schema: input.schema(),
            rows: rows.boxed(),
        })
    }

    /// Execute every input partition, each routed by a task of its own.
    fn start(
        &self,
        input: &Arc<dyn ExecutionPlan>,
        context: &Arc<TaskContext>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Result<Run> {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..self.partitions).map(|_| unbounded_channel()).unzip();
        let inputs = input.output_partitioning().partition_count();
        let gate = Arc::new(Gate::new(self.partitions));
        let mut tasks = Vec::with_capacity(inputs);
        for i in 0..inputs {
            let stream = input.execute(i, Arc::clone(context))?;
            let router = Router {
                source: u32::try_from(i).unwrap_or(u32::MAX),
                keys: self.keys.clone(),
                routing: self.routing,
                outputs: senders.clone(),
                gate: Arc::clone(&gate),
                time: MetricBuilder::new(metrics).subset_time("key_exchange_time", i),
            };
            tasks.push(SpawnedTask::spawn(router.route(stream)));
        }
        Ok(Run {
            receivers: receivers.into_iter().map(Some).collect(),
            gate,
            tasks: Arc::new(tasks),
        })
    }
}

/// Routes one input partition.
struct Router {
    /// The input partition routed.
    source: u32,
    keys: Vec<usize>,
    routing: Routing,
    outputs: Vec<UnboundedSender<Result<KeyRows>>>,
    gate: Arc<Gate>,
    /// Time spent hashing and routing.
    time: Time,
}

impl Router {
    async fn route(self, mut input: SendableRecordBatchStream) {
        let mut hashes = Vec::new();
        let mut positions: Vec<Vec<u32>> = vec![Vec::new(); self.outputs.len()];
        while let Some(batch) = input.next().await {
            let routed = batch.and_then(|batch| {
                let _timer = self.time.timer();
                self.split(&batch, &mut hashes, &mut positions)?;
                Ok(batch)
            });
            let batch = match routed {
                Ok(batch) => batch,
                Err(e) => {
                    let e = Arc::new(e);
                    for (p, output) in self.outputs.iter().enumerate() {
                        self.gate.sent(p);
                        let _ = output.send(Err(DataFusionError::Shared(Arc::clone(&e))));
                    }
                    return;
                }
            };
            self.gate.room().await;
            let mut open = false;
            for (p, (output, rows)) in self.outputs.iter().zip(&mut positions).enumerate() {
                if rows.is_empty() {
                    open |= !output.is_closed();
                    continue;
                }
                let rows = if rows.len() == batch.num_rows() {
                    rows.clear();
                    None
                } else {
                    Some(UInt32Array::from(std::mem::take(rows)))
                };
                self.gate.sent(p);
                let sent = output.send(Ok(KeyRows {
                    batch: batch.clone(),
                    rows,
                    source: self.source,
                }));
                open |= sent.is_ok();
            }
            if !open {
                // every partition's stream was dropped
                return;
            }
        }
    }

    /// The positions of `batch`'s rows by partition (`positions` emptied
    /// first; `hashes` reused).
    fn split(
        &self,
        batch: &RecordBatch,
        hashes: &mut Vec<u64>,
        positions: &mut [Vec<u32>],
    ) -> Result<()> {
        let n = batch.num_rows();
        if u32::try_from(n).is_err() {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "key exchange: batch of {n} rows"
            )));
        }
        let keys: Vec<ArrayRef> = self
            .keys
            .iter()
            .map(|&k| Arc::clone(batch.column(k)))
            .collect();
        let partitions = positions.len() as u64;
        // (no division per row where the partitions are a power of two)
        let partition_of = |hash: u64| match partitions.is_power_of_two() {
            true => (hash & (partitions - 1)) as usize,
            false => (hash % partitions) as usize,
        };
        let expected = n / positions.len() + n / 16;
        for rows in positions.iter_mut() {
            rows.clear();
            rows.reserve(expected);
        }
        match self.routing {
            Routing::Hash => {
                hashes.clear();
                hashes.resize(n, 0);
                create_hashes(&keys, &ROUTING, hashes)?;
                for (row, &hash) in hashes.iter().enumerate() {
                    positions[partition_of(hash)].push(row as u32);
                }
            }
            Routing::Buckets(buckets) => {
                let buckets = bucket_array(&keys, n, buckets)?;
                for (row, &bucket) in buckets.values().iter().enumerate() {
                    positions[partition_of(bucket as u64)].push(row as u32);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::prelude::SessionContext;
    use std::collections::HashMap;

    fn batch(keys: &[i64], values: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(keys.to_vec())),
                Arc::new(Int64Array::from(values.to_vec())),
            ],
        )
        .unwrap()
    }

    /// Three input partitions into two: every row reaches exactly one
    /// partition, every key one partition (routed by bucket: the
    /// partition of its bucket in the target), and the batches are shared,
    /// not copied.
    #[tokio::test]
    async fn every_row_reaches_the_partition_of_its_key_once_and_uncopied() -> Result<()> {
        for routing in [Routing::Hash, Routing::Buckets(4)] {
            routes_every_row_once(routing).await?;
        }
        Ok(())
    }

    async fn routes_every_row_once(routing: Routing) -> Result<()> {
        let inputs = vec![
            vec![batch(&[1, 2, 3, 4, 1], &[0, 1, 2, 3, 4])],
            vec![
                batch(&[5, 6, 2, 7], &[5, 6, 7, 8]),
                batch(&[8, 9], &[9, 10]),
            ],
            vec![],
        ];
        let schema = inputs[0][0].schema();
        let originals: Vec<RecordBatch> = inputs.iter().flatten().cloned().collect();
        let input = MemorySourceConfig::try_new_exec(&inputs, schema, None)?;
        let input: Arc<dyn ExecutionPlan> = input;
        let exchange = KeyExchange::new(vec![0], 2, routing);
        let context = SessionContext::new().task_ctx();
        let metrics = ExecutionPlanMetricsSet::new();
        let mut seen: HashMap<i64, usize> = HashMap::new(); // value -> partition
        let mut key_partition: HashMap<Option<i64>, usize> = HashMap::new();
        for p in 0..2 {
            let mut stream = exchange.stream(&input, p, &context, &metrics)?;
            while let Some(rows) = stream.next().await {
                let rows = rows?;
                assert!(
                    originals.iter().any(|o| std::ptr::eq(
                        o.column(1).to_data().buffers()[0].as_ptr(),
                        rows.batch.column(1).to_data().buffers()[0].as_ptr()
                    )),
                    "a batch was copied"
                );
                let batch = rows.into_batch()?;
                let keys = batch.column(0).as_primitive::<Int64Type>();
                let values = batch.column(1).as_primitive::<Int64Type>();
                for i in 0..batch.num_rows() {
                    assert_eq!(seen.insert(values.value(i), p), None, "row twice");
                    let key = keys.is_valid(i).then(|| keys.value(i));
                    assert_eq!(*key_partition.entry(key).or_insert(p), p, "key split");
                    if let Routing::Buckets(buckets) = routing {
                        let column: ArrayRef = Arc::new(Int64Array::from(vec![key]));
                        let bucket = bucket_array(&[column], 1, buckets)?.value(0);
                        assert_eq!(bucket as usize % 2, p, "key {key:?} of bucket {bucket}");
                    }
                }
            }
        }
        assert_eq!(seen.len(), 11);
        Ok(())
    }

    /// Partitions read side by side keep short queues (without the gate
    /// the router would queue all 64 batches at the first wait); read one
    /// after the other, each gets all its rows (above: nothing stalls).
    #[tokio::test]
    async fn partitions_read_together_keep_short_queues() -> Result<()> {
        let keys: Vec<i64> = (0..16).collect();
        let batches: Vec<RecordBatch> = (0..64).map(|i| batch(&keys, &[i; 16])).collect();
        let schema = batches[0].schema();
        let input = MemorySourceConfig::try_new_exec(&[batches], schema, None)?;
        let input: Arc<dyn ExecutionPlan> = input;
        let exchange = KeyExchange::new(vec![0], 2, Routing::Hash);
        let context = SessionContext::new().task_ctx();
        let metrics = ExecutionPlanMetricsSet::new();
        let mut streams = [
            exchange.stream(&input, 0, &context, &metrics)?,
            exchange.stream(&input, 1, &context, &metrics)?,
        ];
        let gate = match exchange.run.lock() {
            Ok(run) => Arc::clone(&run.as_ref().expect("started").gate),
            Err(_) => panic!("poisoned"),
        };
        let (mut rows, mut longest) = (0, 0);
        let mut open = [true, true];
        while open.iter().any(|&o| o) {
            for (p, stream) in streams.iter_mut().enumerate() {
                if !open[p] {
                    continue;
                }
                match stream.next().await {
                    Some(next) => rows += next?.into_batch()?.num_rows(),
                    None => open[p] = false,
                }
                for queued in &gate.queued {
                    longest = longest.max(queued.load(Ordering::Acquire));
                }
            }
        }
        assert_eq!(rows, 64 * 16);
        assert!(longest <= AHEAD + 2, "a queue of {longest} batches");
        Ok(())
    }
}
