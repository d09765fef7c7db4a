//! The key exchange of an indexed fold: each fold partition receives the
//! input's batches whole, shared, with the positions of the rows whose keys
//! are its own — no row is copied on the way.
//!
//! ```text
//!  input partition 0 ──► route ──┬─► (batch, rows of partition 0) ──► fold 0
//!  input partition 1 ──► route ──┼─► (batch, rows of partition 1) ──► fold 1
//!        …                       └─► …
//!  route: hash the key columns, a partition per hash (as DataFusion's
//!  hash repartition does), positions per partition, one shared batch
//! ```
//!
//! DataFusion's `RepartitionExec` gathers each output partition's rows into
//! a batch of its own (`take` of every column): for a fold that retains its
//! batches and indexes their rows by position anyway, that copy of every
//! event (and the strings in them) is wasted, and is the cost that a second
//! core paid and the first did not. Routing is one task per input
//! partition; the channels are unbounded, since the folds retain every batch
//! they receive until their input ends (the memory is theirs to account),
//! and a reader that drains the partitions one after another must not stall
//! the others. A partition's stream ends when every input partition has
//! ended; an input's error reaches every partition. The tasks stop when the
//! streams are dropped.

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

/// A batch and the rows of it that are one partition's (all when `rows` is
/// `None`).
#[derive(Debug, Clone)]
pub(crate) struct KeyRows {
    pub batch: RecordBatch,
    /// Ascending positions in `batch`.
    pub rows: Option<UInt32Array>,
}

impl KeyRows {
    /// All of `batch`.
    pub fn whole(batch: RecordBatch) -> Self {
        Self { batch, rows: None }
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

/// Routes the batches of an input's partitions to `partitions` folds by
/// the hash of their keys (see the module docs). One per operator; each
/// execution of the operator's partitions starts a run.
#[derive(Debug)]
pub(crate) struct KeyExchange {
    /// Positions of the key columns in the input.
    keys: Vec<usize>,
    partitions: usize,
    run: Mutex<Option<Run>>,
}

/// One execution: the partitions' receivers not taken yet, and the routing
/// tasks (aborted when the last stream holding them is dropped).
#[derive(Debug)]
struct Run {
    receivers: Vec<Option<UnboundedReceiver<Result<KeyRows>>>>,
    tasks: Arc<Vec<SpawnedTask<()>>>,
}

impl KeyExchange {
    /// An exchange over the key columns at `keys` into `partitions`.
    pub fn new(keys: Vec<usize>, partitions: usize) -> Self {
        Self {
            keys,
            partitions: partitions.max(1),
            run: Mutex::new(None),
        }
    }

    /// Number of output partitions.
    pub fn partitions(&self) -> usize {
        self.partitions
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
        let tasks = Arc::clone(&run.tasks);
        let rows = futures::stream::unfold((receiver, tasks), |(mut receiver, tasks)| async move {
            let next = receiver.recv().await?;
            Some((next, (receiver, tasks)))
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
        let mut tasks = Vec::with_capacity(inputs);
        for i in 0..inputs {
            let stream = input.execute(i, Arc::clone(context))?;
            let router = Router {
                keys: self.keys.clone(),
                outputs: senders.clone(),
                time: MetricBuilder::new(metrics).subset_time("key_exchange_time", i),
            };
            tasks.push(SpawnedTask::spawn(router.route(stream)));
        }
        Ok(Run {
            receivers: receivers.into_iter().map(Some).collect(),
            tasks: Arc::new(tasks),
        })
    }
}

/// Routes one input partition.
struct Router {
    keys: Vec<usize>,
    outputs: Vec<UnboundedSender<Result<KeyRows>>>,
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
                    for output in &self.outputs {
                        let _ = output.send(Err(DataFusionError::Shared(Arc::clone(&e))));
                    }
                    return;
                }
            };
            let mut open = false;
            for (output, rows) in self.outputs.iter().zip(&mut positions) {
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
                let sent = output.send(Ok(KeyRows {
                    batch: batch.clone(),
                    rows,
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
        hashes.clear();
        hashes.resize(n, 0);
        create_hashes(&keys, &ROUTING, hashes)?;
        let partitions = positions.len() as u64;
        let expected = n / positions.len() + n / 16;
        for rows in positions.iter_mut() {
            rows.clear();
            rows.reserve(expected);
        }
        for (row, &hash) in hashes.iter().enumerate() {
            positions[(hash % partitions) as usize].push(row as u32);
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
    /// partition, every key one partition, and the batches are shared,
    /// not copied.
    #[tokio::test]
    async fn every_row_reaches_the_partition_of_its_key_once_and_uncopied() -> Result<()> {
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
        let exchange = KeyExchange::new(vec![0], 2);
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
                }
            }
        }
        assert_eq!(seen.len(), 11);
        Ok(())
    }
}
