//! The stage of an update: its new change events read once, when the update
//! runs, and the choice of the stored rows it replaces, made from them.
//!
//! Which stored rows an update reads and replaces depends on its events: the
//! key buckets they fall in, and whether their keys are few enough to retire
//! the keys' stored rows with deletion vectors. The plan of an update is the
//! same whatever its events (so `EXPLAIN REFRESH` prints the plan `REFRESH`
//! runs); the choice is made here, once, by whichever of the update's
//! operators needs it first (`StagedEventsExec` for the events,
//! `TargetRowsExec` for the stored rows), and read by the commit:
//!
//! ```text
//!  source ─► pull, bucket each batch ─┬─ ends within the budget: Small — events kept in memory;
//!                                     │   touched buckets known; few keys: probe their stored
//!                                     │   rows (deletion vectors), compact the fullest buckets
//!                                     └─ over it: Large — the pulled batches, then the rest of
//!                                         the same run; every bucket is read and rewritten
//! ```
//!
//! | events staged                   | stored rows read (`TargetRowsExec`)        | commit                                  |
//! |---------------------------------|--------------------------------------------|-----------------------------------------|
//! | over [`STAGE_MAX_BYTES`] (or a quarter of a smaller bounded memory pool), or a TRUNCATE, or a widened column | all | every file replaced |
//! | within it, keys over the budget or no deletion vectors | the touched buckets | the touched buckets' files replaced     |
//! | within it, keys within `autocdc.deletion_vector_max_fraction` | the keys' rows (probed), compacted buckets whole | vectors on the probed files; compacted buckets replaced |
//!
//! Either way the source is read once (a large update of a flow with
//! `APPLY AS TRUNCATE` reads it again for the truncate events, which the
//! fold needs before any key).

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Int8Type, SchemaRef};
use datafusion::common::{DataFusionError, HashMap, Result};
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use futures::StreamExt;
use tokio::sync::OnceCell;

use super::bucket::{bucket_array, WATERMARK_BUCKET};
use super::deletion_vectors::KeySet;
use super::files::{bucket_of, data_files};
use super::superseded::{Probing, Superseded};
use super::ScdTable;
use crate::fold::columns::{Kind, KIND_COL};

/// Most bytes of events an update holds in memory to choose what it reads.
pub const STAGE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The share of a bounded memory pool the stage may hold at most (its
/// memory cannot spill, and is held until the update ends): the rest is
/// left to the fold and the writer below it, whose sorts would otherwise
/// find the pool taken by events that just fit.
const STAGE_POOL_SHARE: usize = 4;

/// Most bytes of events an update holds in memory under `pool`:
/// [`STAGE_MAX_BYTES`], or a quarter of a smaller bounded pool.
fn stage_max_bytes(pool: &dyn MemoryPool) -> usize {
    match pool.memory_limit() {
        MemoryLimit::Finite(limit) => STAGE_MAX_BYTES.min(limit / STAGE_POOL_SHARE),
        MemoryLimit::Infinite | MemoryLimit::Unknown => STAGE_MAX_BYTES,
    }
}

/// What an update's stage needs to choose (settled when it is planned).
#[derive(Debug)]
pub struct StageConfig {
    /// The flow (for messages and the memory pool).
    pub flow: String,
    /// The target.
    pub table: Arc<ScdTable>,
    /// The key columns of the events.
    pub key_columns: Vec<String>,
    /// The target's number of key buckets.
    pub buckets: i32,
    /// Every bucket is rewritten whatever the events (a widened column).
    pub rewrite_all: bool,
    /// Most distinct keys whose stored rows are retired with deletion
    /// vectors (`None`: the session or the table takes none).
    pub deletion_vector_keys: Option<usize>,
    /// `autocdc.deletion_vector_max_files_per_bucket` (0: never compact).
    pub compaction_limit: usize,
    /// How data files are probed for the update's keys.
    pub probing: Probing,
}

/// The stored rows an update replaces.
#[derive(Debug, Clone, Default)]
pub struct Replacement {
    /// Buckets read and rewritten (`None`: all).
    pub touched: Option<Vec<i32>>,
    /// The stored rows of the update's keys when it retires them with
    /// deletion vectors instead of rewriting the touched buckets.
    pub superseded: Option<Arc<Superseded>>,
    /// Touched buckets rewritten whole although the update retires the
    /// other buckets' rows with deletion vectors (compaction).
    pub compacted: Vec<i32>,
}

/// The shared stage of one update (see the module docs).
pub struct UpdateStage {
    config: StageConfig,
    /// The events' plan, bound by the operator that reads them.
    source: Mutex<Option<Arc<dyn ExecutionPlan>>>,
    /// What the stage's one run gave (an error too: the events' plan runs
    /// once, and its operators cannot run a partition twice).
    staged: OnceCell<std::result::Result<Arc<Staged>, Arc<DataFusionError>>>,
}

impl fmt::Debug for UpdateStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpdateStage")
            .field("flow", &self.config.flow)
            .field("staged", &self.staged.get())
            .finish()
    }
}

/// The events of an update, read once.
pub struct Staged {
    /// The stored rows the update replaces.
    pub replacement: Replacement,
    /// Rows pulled (a large update: before going over the budget).
    pub rows: usize,
    /// Bytes pulled (a large update: before going over the budget).
    pub bytes: usize,
    events: StagedEvents,
}

impl fmt::Debug for Staged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Staged")
            .field("rows", &self.rows)
            .field("large", &self.is_large())
            .field("replacement", &self.replacement)
            .finish()
    }
}

enum StagedEvents {
    /// Every event, in memory (and granted by the pool until the events
    /// are handed to the fold: the operators that keep them account for
    /// them from then on — a sort's buffer of the same batches counted
    /// twice left the sort no room).
    Small {
        batches: Vec<RecordBatch>,
        reservation: MemoryReservation,
    },
    /// The batches pulled, then the rest of the same run.
    Large(SharedRun),
}

/// A large update's run, read once and shared by the partitions that pass
/// it on: each takes the next batch when it wants one, so what the plan
/// does above the stage (projections, the repartition by key) runs in every
/// partition, not in one.
struct SharedRun {
    schema: SchemaRef,
    run: Arc<tokio::sync::Mutex<Option<SendableRecordBatchStream>>>,
    /// The partitions that took their share.
    taken: Mutex<HashSet<usize>>,
}

impl SharedRun {
    fn new(run: SendableRecordBatchStream) -> Self {
        Self {
            schema: run.schema(),
            run: Arc::new(tokio::sync::Mutex::new(Some(run))),
            taken: Mutex::default(),
        }
    }

    /// Partition `partition`'s share: the batches it takes, until the run
    /// ends (`None`: it took it already).
    fn share(&self, partition: usize) -> Option<SendableRecordBatchStream> {
        let first = self
            .taken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(partition);
        if !first {
            return None;
        }
        let batches = futures::stream::unfold(Arc::clone(&self.run), |run| async move {
            let mut guard = run.lock().await;
            let next = match guard.as_mut() {
                Some(stream) => stream.next().await,
                None => None,
            };
            drop(guard);
            next.map(|batch| (batch, run))
        });
        Some(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            batches,
        )))
    }

    /// Stop the run (and what it pulled) where it is.
    fn let_go(&self) {
        if let Ok(mut run) = self.run.try_lock() {
            *run = None;
        }
    }
}

impl UpdateStage {
    /// A stage that has not run.
    pub fn new(config: StageConfig) -> Self {
        Self {
            config,
            source: Mutex::new(None),
            staged: OnceCell::new(),
        }
    }

    /// The flow the stage belongs to.
    pub fn flow(&self) -> &str {
        &self.config.flow
    }

    /// Read the events from `source` (the plan of the operator that passes
    /// them on: the last one bound is run).
    pub fn bind(&self, source: Arc<dyn ExecutionPlan>) {
        *self.source.lock().unwrap_or_else(PoisonError::into_inner) = Some(source);
    }

    /// The staged events and the choice, running the stage if no operator
    /// has yet (concurrent callers wait for the one that runs it; when the
    /// run failed, they get its error).
    pub async fn staged(&self, context: &Arc<TaskContext>) -> Result<Arc<Staged>> {
        self.staged
            .get_or_init(|| async { self.run(context).await.map(Arc::new).map_err(Arc::new) })
            .await
            .clone()
            .map_err(DataFusionError::Shared)
    }

    /// Whether the update rewrites every file whatever its events do (a
    /// widened column: see [`StageConfig::rewrite_all`]).
    pub fn rewrites_all(&self) -> bool {
        self.config.rewrite_all
    }

    /// What the update replaces, once the stage ran.
    pub fn replacement(&self) -> Option<&Replacement> {
        match self.staged.get() {
            Some(Ok(staged)) => Some(&staged.replacement),
            _ => None,
        }
    }

    async fn run(&self, context: &Arc<TaskContext>) -> Result<Staged> {
        let source = self
            .source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "flow '{}': the update's events have no plan",
                    self.config.flow
                ))
            })?;
        let mut stream = read_all(source, context)?;
        let schema = stream.schema();
        let kind = schema.index_of(KIND_COL)?;
        let keys = self
            .config
            .key_columns
            .iter()
            .map(|k| schema.index_of(k))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let reservation = MemoryConsumer::new(format!("CdcStagedEvents[{}]", self.config.flow))
            .register(context.memory_pool());
        let mut pulled: Vec<RecordBatch> = Vec::new();
        let (mut rows, mut bytes) = (0, 0);
        let mut touched = vec![false; usize::try_from(self.config.buckets).unwrap_or(0)];
        let mut truncated = false;
        let most = stage_max_bytes(context.memory_pool().as_ref());
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let size = batch.get_array_memory_size();
            rows += batch.num_rows();
            bytes += size;
            let fits = reservation.size() + size <= most && reservation.try_grow(size).is_ok();
            if !fits {
                pulled.push(batch);
                drop(reservation);
                let rest = futures::stream::iter(pulled.into_iter().map(Ok)).chain(stream);
                let rest = RecordBatchStreamAdapter::new(schema, rest);
                return Ok(Staged {
                    replacement: Replacement::default(),
                    rows,
                    bytes,
                    events: StagedEvents::Large(SharedRun::new(Box::pin(rest))),
                });
            }
            let kinds = batch.column(kind).as_primitive::<Int8Type>();
            let columns: Vec<_> = keys.iter().map(|&i| Arc::clone(batch.column(i))).collect();
            let bucket = bucket_array(&columns, batch.num_rows(), self.config.buckets)?;
            for (b, k) in bucket.values().iter().zip(kinds.values().iter()) {
                if *k == Kind::Truncate as i8 {
                    truncated = true;
                } else if let Some(hit) = usize::try_from(*b).ok().and_then(|b| touched.get_mut(b))
                {
                    *hit = true;
                }
            }
            pulled.push(batch);
        }
        let touched = (!truncated && !self.config.rewrite_all).then(|| {
            touched
                .iter()
                .enumerate()
                .filter(|(_, hit)| **hit)
                .map(|(b, _)| b as i32)
                .collect::<Vec<_>>()
        });
        let replacement = match touched {
            Some(touched) => self.replacement_of(touched, &pulled, &keys).await?,
            None => Replacement::default(),
        };
        Ok(Staged {
            replacement,
            rows,
            bytes,
            events: StagedEvents::Small {
                batches: pulled,
                reservation,
            },
        })
    }

    /// The stored rows replaced by the (staged) events `pulled`, which
    /// touch the buckets `touched` and whose key columns are at `keys`.
    async fn replacement_of(
        &self,
        touched: Vec<i32>,
        pulled: &[RecordBatch],
        keys: &[usize],
    ) -> Result<Replacement> {
        let buckets_only = |touched| Replacement {
            touched: Some(touched),
            ..Default::default()
        };
        let Some(max_keys) = self.config.deletion_vector_keys else {
            return Ok(buckets_only(touched));
        };
        let key_batches = pulled
            .iter()
            .map(|b| b.project(keys))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if key_batches.is_empty() {
            return Ok(buckets_only(touched));
        }
        // (counted up to the budget: past it, the set is not built whole)
        let keys = match KeySet::at_most(self.config.key_columns.clone(), &key_batches, max_keys)? {
            Some(keys) if !keys.is_empty() => keys,
            _ => return Ok(buckets_only(touched)),
        };
        let table = &self.config.table;
        let compacted = buckets_to_compact(table, &touched, self.config.compaction_limit).await?;
        let probed: Vec<i32> = touched
            .iter()
            .filter(|b| !compacted.contains(b))
            .copied()
            .collect();
        let superseded = find_in_buckets(table, Arc::new(keys), &probed, &self.config.probing)
            .await
            .map_err(|e| {
                e.context(format!(
                    "flow '{}': finding the stored rows of the update's keys in '{}'",
                    self.config.flow,
                    table.name()
                ))
            })?;
        Ok(Replacement {
            touched: Some(touched),
            superseded: Some(Arc::new(superseded)),
            compacted,
        })
    }
}

impl Staged {
    /// Whether the events were more than the stage holds.
    pub fn is_large(&self) -> bool {
        matches!(self.events, StagedEvents::Large(_))
    }

    /// The staged batches (every `of`-th from the `partition`-th), or `None`
    /// for a large update.
    /// The stage's grant from the pool ends here (see [`StagedEvents`]).
    pub fn batches(&self, partition: usize, of: usize) -> Option<Vec<RecordBatch>> {
        match &self.events {
            StagedEvents::Small {
                batches,
                reservation,
            } => {
                reservation.free();
                Some(
                    batches
                        .iter()
                        .skip(partition)
                        .step_by(of.max(1))
                        .cloned()
                        .collect(),
                )
            }
            StagedEvents::Large(_) => None,
        }
    }

    /// Partition `partition`'s share of a large update's run (the pulled
    /// batches first): the batches it takes while the partitions that read
    /// the run take theirs (`None`: not a large update).
    pub fn take_rest(
        &self,
        flow: &str,
        partition: usize,
    ) -> Result<Option<SendableRecordBatchStream>> {
        match &self.events {
            StagedEvents::Small { .. } => Ok(None),
            StagedEvents::Large(run) => run.share(partition).map(Some).ok_or_else(|| {
                DataFusionError::Execution(format!(
                    "flow '{flow}': the update's events were already read (a run is read once)"
                ))
            }),
        }
    }

    /// Stop a large update's run where it is: its events are not needed.
    pub fn let_go_of_rest(&self) {
        if let StagedEvents::Large(run) = &self.events {
            run.let_go();
        }
    }
}

/// Every partition of `plan` as one stream.
pub fn read_all(
    plan: Arc<dyn ExecutionPlan>,
    context: &Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    if plan.output_partitioning().partition_count() == 1 {
        plan.execute(0, Arc::clone(context))
    } else {
        CoalescePartitionsExec::new(plan).execute(0, Arc::clone(context))
    }
}

/// The stored rows of `keys` in the data files of the buckets `buckets`.
pub(crate) async fn find_in_buckets(
    table: &ScdTable,
    keys: Arc<KeySet>,
    buckets: &[i32],
    probing: &Probing,
) -> Result<Superseded> {
    let delta = table.delta();
    let views = data_files(&delta)
        .await?
        .into_iter()
        .filter(|v| bucket_of(v).is_some_and(|b| b != WATERMARK_BUCKET && buckets.contains(&b)))
        .collect();
    Superseded::find(&delta.object_store(), keys, views, probing).await
}

/// The buckets among `touched` that an update using deletion vectors
/// rewrites whole, compacting each into one file without the rows its
/// vectors deleted. Each such update adds a file to every bucket it
/// touches; with `limit` = `autocdc.deletion_vector_max_files_per_bucket`
/// (0: never compact), it also compacts the ⌈touched ÷ limit⌉ fullest
/// touched buckets holding more than limit ÷ 2 files (ties: lower bucket
/// first). Updates that touch every bucket so keep about `limit` files per
/// bucket, and each pays for a few buckets' rewrite instead of one update
/// in `limit` rewriting them all at once (a latency spike).
async fn buckets_to_compact(table: &ScdTable, touched: &[i32], limit: usize) -> Result<Vec<i32>> {
    if limit == 0 || touched.is_empty() {
        return Ok(Vec::new());
    }
    let mut files: HashMap<i32, usize> = Default::default();
    for bucket in data_files(&table.delta())
        .await?
        .iter()
        .filter_map(bucket_of)
    {
        if touched.contains(&bucket) {
            *files.entry(bucket).or_default() += 1;
        }
    }
    Ok(compaction_choice(
        files.into_iter().collect(),
        touched.len(),
        limit,
    ))
}

/// Which buckets to compact, given the data files of each touched bucket
/// (`files`), how many buckets are touched and the file limit (see
/// [`buckets_to_compact`]); sorted by bucket.
fn compaction_choice(mut files: Vec<(i32, usize)>, touched: usize, limit: usize) -> Vec<i32> {
    files.retain(|&(_, n)| n > limit / 2);
    files.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut chosen: Vec<i32> = files
        .into_iter()
        .take(touched.div_ceil(limit))
        .map(|(bucket, _)| bucket)
        .collect();
    chosen.sort_unstable();
    chosen
}

#[cfg(test)]
mod tests {
    use super::{compaction_choice, stage_max_bytes, SharedRun, STAGE_MAX_BYTES};
    use arrow::array::{AsArray, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::execution::memory_pool::{GreedyMemoryPool, UnboundedMemoryPool};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::StreamExt;
    use std::sync::Arc;

    #[tokio::test]
    async fn the_partitions_sharing_a_run_take_each_batch_once() {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let batches: Vec<datafusion::common::Result<RecordBatch>> = (0..100)
            .map(|n| {
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![Arc::new(Int64Array::from(vec![n]))],
                )
                .map_err(Into::into)
            })
            .collect();
        let run = SharedRun::new(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter(batches),
        )));
        let (Some(mut first), Some(mut second)) = (run.share(0), run.share(1)) else {
            panic!("no share");
        };
        assert!(run.share(1).is_none(), "a partition took its share twice");
        // the two take turns, then drain what is left
        let mut taken = Vec::new();
        let mut per_partition = [0, 0];
        loop {
            let (a, b) = (first.next().await, second.next().await);
            if a.is_none() && b.is_none() {
                break;
            }
            for (p, batch) in [a, b].into_iter().enumerate() {
                if let Some(batch) = batch {
                    let batch = batch.expect("batch");
                    taken.push(batch.column(0).as_primitive::<Int64Type>().value(0));
                    per_partition[p] += 1;
                }
            }
        }
        taken.sort_unstable();
        assert_eq!(taken, (0..100).collect::<Vec<i64>>());
        assert_eq!(per_partition, [50, 50]);
    }

    #[test]
    fn compaction_takes_the_fullest_touched_buckets_past_half_the_limit() {
        // 16 touched buckets, limit 8: two a time, the fullest first
        let files: Vec<(i32, usize)> = (0..16).map(|b| (b, 5 + (b as usize % 3))).collect();
        assert_eq!(compaction_choice(files, 16, 8), vec![2, 5]);
        // none past half the limit: none
        assert_eq!(
            compaction_choice(vec![(0, 4), (1, 3)], 2, 8),
            Vec::<i32>::new()
        );
        // one bucket touched: it alone, once past half the limit
        assert_eq!(compaction_choice(vec![(7, 5)], 1, 8), vec![7]);
        // ties go to the lower bucket
        assert_eq!(compaction_choice(vec![(3, 3), (1, 3)], 2, 2), vec![1]);
    }

    #[test]
    fn updates_touching_every_bucket_keep_about_limit_files_per_bucket() {
        // a simulation of the rule: each update adds a file to every bucket
        // and compacts the chosen ones into one file
        let (buckets, limit) = (16usize, 8usize);
        let mut files = vec![1usize; buckets];
        let mut most = 0;
        for _ in 0..200 {
            let chosen = compaction_choice(
                files
                    .iter()
                    .enumerate()
                    .map(|(b, &n)| (b as i32, n))
                    .collect(),
                buckets,
                limit,
            );
            assert!(chosen.len() <= 2);
            for (b, n) in files.iter_mut().enumerate() {
                *n = if chosen.contains(&(b as i32)) {
                    1
                } else {
                    *n + 1
                };
            }
            most = most.max(*files.iter().max().unwrap_or(&0));
        }
        assert!(most <= 2 * limit, "{most}");
    }

    /// The stage holds at most a quarter of a bounded pool (its memory
    /// cannot spill: events that just fit a 20 MB pool left the SCD 2
    /// fold's sorts below it none), and 64 MiB at most.
    #[test]
    fn the_stage_leaves_most_of_a_bounded_pool_to_the_fold() {
        let small = GreedyMemoryPool::new(20 * 1024 * 1024);
        assert_eq!(stage_max_bytes(&small), 5 * 1024 * 1024);
        let large = GreedyMemoryPool::new(1024 * 1024 * 1024);
        assert_eq!(stage_max_bytes(&large), STAGE_MAX_BYTES);
        assert_eq!(
            stage_max_bytes(&UnboundedMemoryPool::default()),
            STAGE_MAX_BYTES
        );
    }
}
