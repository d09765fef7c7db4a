//! One partition of an operator with two engines — an in-memory *indexed*
//! kernel and a *sorted* streaming kernel — and the fall-back from the first
//! to the second, written once for `AutoCdcExec` and `SnapshotDiffExec`.
//!
//! ```text
//!  Indexed ──push──► (memory grows) ──finish──► emitting ──► Finished
//!     │ refused by the pool, over its cap, or another partition sorts
//!     ▼
//!  retained batches + rest of the input ──SortExec (spilling)──► Sorted
//!  Sorted ──push──► output ... ──input ends──► finish ──► Finished
//! ```
//!
//! The kernels are the pure, I/O-free folds of [`crate::fold`]; this module
//! is their driver: it pulls the input, reserves the indexed kernel's memory
//! in the session's pool and, when it must fall back, hands what the kernel
//! retained and the rest of the input to DataFusion's sort
//! ([`sort_retained_and_rest`]) and continues with a sorted kernel.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::metrics::{Count, Time};
use futures::StreamExt;

use super::key_exchange::{KeyRows, KeyRowsStream};
use super::one_shot::{must_fall_back, sort_retained_and_rest, sort_share};

/// A kernel over input sorted as the operator requires.
pub(crate) trait SortedKernel: Send {
    /// Consume one sorted batch; returns the output it completed.
    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>>;
    /// The input ended: the rest of the output.
    fn finish(&mut self) -> Result<Option<RecordBatch>>;
}

/// A kernel that keeps its input, then sorts a compact index of it.
pub(crate) trait IndexedKernel: Send {
    /// Retain the partition's rows of one batch (the batch may be shared
    /// with other partitions, see [`super::key_exchange`]).
    fn push(&mut self, rows: KeyRows) -> Result<()>;
    /// Bytes held.
    fn memory_size(&self) -> usize;
    /// The input ended: sort the index. `scratch` is asked for memory a
    /// faster sort would hold for a while (granted from the operator's
    /// reservation, or refused).
    fn finish(&mut self, scratch: &mut dyn FnMut(usize) -> bool) -> Result<()>;
    /// Next output batch of at most `batch_size` rows once finished.
    fn next_output(&mut self, batch_size: usize) -> Result<Option<RecordBatch>>;
    /// The retained rows as batches of their own, for a fall-back to
    /// sorting.
    fn into_batches(self) -> Result<Vec<RecordBatch>>;
}

/// Builds the sorted kernel a fall-back continues with, for the sorted input's schema.
pub(crate) type MakeSorted<S> = Box<dyn FnOnce(&SchemaRef) -> Result<S> + Send>;

/// The engine of one partition.
enum Engine<I, S> {
    Sorted {
        kernel: S,
        input: SendableRecordBatchStream,
    },
    Indexed {
        kernel: I,
        input: KeyRowsStream,
        reservation: MemoryReservation,
        emitting: bool,
    },
    /// While switching engines.
    Switching,
}

/// The kernel a partition finished with.
pub(crate) enum Finished<'a, I, S> {
    Sorted(&'a S),
    Indexed(&'a I),
}

/// What a fall-back needs, and the operator's shared state.
pub(crate) struct FallBack<S> {
    /// The order the sorted kernel consumes.
    pub ordering: LexOrdering,
    pub context: Arc<TaskContext>,
    /// Set by the first partition that falls back: the others then sort
    /// too, instead of holding memory the sorts need.
    pub sorting: Arc<AtomicBool>,
    /// Bytes the indexed kernel may hold (0: no cap of its own).
    pub indexed_cap: usize,
    /// The operator's partitions, which share the pool's room for sorts.
    pub partitions: usize,
    /// Metric: partitions that fell back.
    pub fallbacks: Count,
    /// Metric: time in the kernels.
    pub elapsed_compute: Time,
    /// The sorted kernel to continue with.
    pub make_sorted: Option<MakeSorted<S>>,
}

/// One partition's run: the engine and its fall-back.
pub(crate) struct AdaptivePartition<I, S> {
    engine: Engine<I, S>,
    fall_back: FallBack<S>,
    finished: bool,
}

impl<I: IndexedKernel, S: SortedKernel> AdaptivePartition<I, S> {
    /// A partition running the sorted kernel (its input sorted below).
    pub fn sorted(kernel: S, input: SendableRecordBatchStream, fall_back: FallBack<S>) -> Self {
        Self {
            engine: Engine::Sorted { kernel, input },
            fall_back,
            finished: false,
        }
    }

    /// A partition running the indexed kernel, its memory reserved with `reservation`.
    pub fn indexed(
        kernel: I,
        input: KeyRowsStream,
        reservation: MemoryReservation,
        fall_back: FallBack<S>,
    ) -> Self {
        Self {
            engine: Engine::Indexed {
                kernel,
                input,
                reservation,
                emitting: false,
            },
            fall_back,
            finished: false,
        }
    }

    /// The kernel at work (or finished with).
    pub fn kernel(&self) -> Result<Finished<'_, I, S>> {
        match &self.engine {
            Engine::Sorted { kernel, .. } => Ok(Finished::Sorted(kernel)),
            Engine::Indexed { kernel, .. } => Ok(Finished::Indexed(kernel)),
            Engine::Switching => Err(lost()),
        }
    }

    /// Next non-empty output batch, or `None` once the partition is done
    /// (then [`Self::kernel`] gives the kernel it finished with).
    pub async fn next(&mut self) -> Result<Option<RecordBatch>> {
        if self.finished {
            return Ok(None);
        }
        let batch_size = self.fall_back.context.session_config().batch_size();
        loop {
            match &mut self.engine {
                Engine::Sorted { kernel, input } => {
                    while let Some(batch) = input.next().await {
                        let batch = batch?;
                        let _timer = self.fall_back.elapsed_compute.timer();
                        if let Some(out) = kernel.push(&batch)? {
                            if out.num_rows() > 0 {
                                return Ok(Some(out));
                            }
                        }
                    }
                    self.finished = true;
                    let _timer = self.fall_back.elapsed_compute.timer();
                    return Ok(kernel.finish()?.filter(|b| b.num_rows() > 0));
                }
                Engine::Indexed {
                    kernel,
                    input,
                    reservation,
                    emitting,
                } => {
                    if !*emitting {
                        let mut refused = false;
                        while let Some(rows) = input.next().await {
                            let rows = rows?;
                            let _timer = self.fall_back.elapsed_compute.timer();
                            kernel.push(rows)?;
                            if must_fall_back(
                                kernel.memory_size(),
                                self.fall_back.indexed_cap,
                                reservation,
                                &self.fall_back.sorting,
                            ) {
                                refused = true;
                                break;
                            }
                        }
                        if refused {
                            self.fall_back_to_sort()?;
                            continue;
                        }
                        let _timer = self.fall_back.elapsed_compute.timer();
                        kernel.finish(&mut |bytes| reservation.try_grow(bytes).is_ok())?;
                        // keep reserved what the kernel still holds (the
                        // sort's counts are freed; an index-sorted fold keeps
                        // its order, and every kernel its output's places,
                        // until its last output)
                        reservation.resize(kernel.memory_size());
                        *emitting = true;
                    }
                    let _timer = self.fall_back.elapsed_compute.timer();
                    if let Some(out) = kernel.next_output(batch_size)? {
                        return Ok(Some(out));
                    }
                    reservation.free();
                    self.finished = true;
                    return Ok(None);
                }
                Engine::Switching => return Err(lost()),
            }
        }
    }

    /// The pool refused the indexed kernel more memory: sort what it
    /// retained and the rest of the input (spilling as the pool requires)
    /// and go on with the sorted kernel.
    fn fall_back_to_sort(&mut self) -> Result<()> {
        let Engine::Indexed {
            kernel,
            input,
            reservation,
            ..
        } = std::mem::replace(&mut self.engine, Engine::Switching)
        else {
            return Err(DataFusionError::Internal(
                "no indexed kernel to fall back from".into(),
            ));
        };
        let f = &mut self.fall_back;
        f.sorting.store(true, Ordering::Relaxed);
        let share = sort_share(&f.context, f.partitions);
        let sorted = sort_retained_and_rest(
            kernel.into_batches()?,
            input.into_batches(),
            f.ordering.clone(),
            Arc::clone(&f.context),
            reservation,
            share,
        )?;
        let make = f
            .make_sorted
            .take()
            .ok_or_else(|| DataFusionError::Internal("fell back to sorting twice".into()))?;
        let kernel = make(&sorted.schema())?;
        f.fallbacks.add(1);
        self.engine = Engine::Sorted {
            kernel,
            input: sorted,
        };
        Ok(())
    }
}

fn lost() -> DataFusionError {
    DataFusionError::Internal("a partition's kernel was lost while switching engines".into())
}
