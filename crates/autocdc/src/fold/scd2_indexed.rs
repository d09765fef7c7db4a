//! Indexed SCD type 2 fold of a query: the versions [`super::Scd2Fold`]
//! emits for a fold read as rows (`FoldSpec::visible_only`), without
//! ordering, gathering or encoding the events.
//!
//! A query's SCD 2 relation (`FROM AUTO CDC (…) STORED AS SCD TYPE 2`)
//! folds new events into an empty target and returns only the versions.
//! Fed through an [`IndexSortedFold`], the sorted kernel had every event
//! ordered, gathered and row-encoded to learn which upserts open a version.
//! This kernel indexes each event as it arrives ([`EventIndex`]) with a
//! 40-bit hash of its tracked columns (the entry's tag), walks the sorted
//! index key by key with the rules of the sorted fold, comparing tracked
//! values by hash, and records each version at its latest event (the row
//! whose values it shows) with its start and end sequences. Versions are then emitted a retained
//! batch at a time, in arrival order: the batch's version rows, taken.
//!
//! | event of a key, by sequence          | walk                                                           |
//! |--------------------------------------|----------------------------------------------------------------|
//! | same sequence as the last kept event | a replay: dropped (checked equal afterwards)                   |
//! | DELETE                               | closes the open version at its sequence; none open: a tombstone |
//! | UPSERT, no open version              | opens a version                                                |
//! | UPSERT, tracked hash equal to the version's latest event's | absorbed: the version's latest event (checked equal afterwards) |
//! | UPSERT, tracked hash different       | closes the open version at its sequence, opens a version       |
//!
//! Hashes decide nothing alone: every pair the walk took as equal is
//! compared exactly once the walk is done ([`equal_pairs`]). A replay that
//! differs from its first copy is a conflict (the fold fails, as the sorted
//! fold does); an absorbed upsert that differs means two tracked values
//! hashed alike, and the partition is folded again by the sorted kernel
//! through an [`IndexSortedFold`] (tests force it with a hash mask).
//!
//! The kernel holds every event of its partition: the operator accounts for
//! [`IndexedScd2Fold::memory_size`] in the session's memory pool and, when
//! the pool refuses, hands the retained batches
//! ([`IndexedScd2Fold::into_batches`]) and the rest of its input to a
//! spilling sort and the sorted fold.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int8Array, RecordBatch, UInt32Array};
use arrow::buffer::NullBuffer;
use arrow::compute::take;
use arrow::datatypes::{Int8Type, Schema, SchemaRef};
use datafusion::common::hash_utils::{create_hashes, RandomState};
use datafusion::common::{DataFusionError, Result};

use super::columns::{EventLayout, Kind, Origin};
use super::errors::{check_event_nulls, conflict_error};
use super::event_index::{EventIndex, GroupWalk, IndexEntry};
use super::pairs::{equal_pairs, pair, Pair};
use super::retained::Retained;
use super::scd2::{scd2_output_schema, truncate_not_allowed};
use super::{FoldCounts, IndexSortedFold, Scd2Fold};

/// What an event is to the versions, once the index is walked.
const NOT_A_VERSION: u8 = 0;
/// The latest event of a version that an event closed.
const CLOSED_VERSION: u8 = 1;
/// The latest event of the key's open version.
const OPEN_VERSION: u8 = 2;

/// Indexed SCD 2 fold of one partition of a query (see the module docs).
pub struct IndexedScd2Fold {
    flow: String,
    layout: EventLayout,
    tracked: Vec<usize>,
    /// Target columns and kind (and the `COLUMNS TO UPDATE` list): what two
    /// copies of one event must share.
    value_columns: Vec<usize>,
    input_schema: SchemaRef,
    output_schema: SchemaRef,
    hash_state: RandomState,
    /// Mask applied to tracked hashes (all bits; none in tests, to collide).
    tracked_hash_mask: u64,
    /// Tracked hashes of the batch being indexed (reused).
    hashes: Vec<u64>,
    batches: Retained,
    /// The versions found, by retained batch (sized with it).
    versions: Vec<BatchVersions>,
    index: EventIndex,
    counts: FoldCounts,
    /// Next retained batch to emit the versions of.
    next: usize,
    /// The partition folded again by the sorted kernel (tracked hashes
    /// collided).
    rerun: Option<Box<IndexSortedFold>>,
}

/// The versions recorded at the events of one retained batch, by row.
#[derive(Debug)]
struct BatchVersions {
    /// [`NOT_A_VERSION`], [`CLOSED_VERSION`] or [`OPEN_VERSION`] ...
    version: Vec<u8>,
    /// ... and for a version, its start and end sequences (as
    /// [`IndexEntry::seq`] holds them).
    start: Vec<u64>,
    end: Vec<u64>,
}

impl BatchVersions {
    fn new(rows: usize) -> Self {
        Self {
            version: vec![NOT_A_VERSION; rows],
            start: vec![0; rows],
            end: vec![0; rows],
        }
    }

    fn memory_size(&self) -> usize {
        self.version.capacity() + (self.start.capacity() + self.end.capacity()) * 8
    }
}

/// Record the version whose latest event is `last`, from `open` to `close`
/// (still open: `None`).
fn record(
    versions: &mut [BatchVersions],
    last: &IndexEntry,
    open: &IndexEntry,
    close: Option<&IndexEntry>,
) {
    let (at, row) = (&mut versions[last.batch as usize], last.row as usize);
    at.start[row] = open.seq;
    match close {
        Some(close) => {
            at.version[row] = CLOSED_VERSION;
            at.end[row] = close.seq;
        }
        None => at.version[row] = OPEN_VERSION,
    }
}

/// Pairs the walk took as equal, compared once it is done.
#[derive(Debug, Default)]
struct Checks {
    /// (kept event, its replay).
    replays: Vec<Pair>,
    /// (a version's latest event, the upsert it absorbed).
    absorbed: Vec<Pair>,
}

impl std::fmt::Debug for IndexedScd2Fold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexedScd2Fold")
            .field("flow", &self.flow)
            .field("batches", &self.batches.len())
            .field("events", &self.index.len())
            .field("counts", &self.counts)
            .field("rerun", &self.rerun.is_some())
            .finish()
    }
}

impl IndexedScd2Fold {
    /// Whether events of `input_schema` can be folded by this kernel: what
    /// an [`EventIndex`] takes (a sequence whose value takes at most 8
    /// bytes, kept as a `u64`).
    pub fn supports(layout: &EventLayout, input_schema: &Schema) -> bool {
        EventIndex::supports(layout, input_schema)
    }

    /// Create a fold of events of `input_schema` (new events only: a query
    /// reads no target) into the versions of their keys; `tracked` are the
    /// tracked target columns.
    pub fn try_new(
        flow: &str,
        layout: EventLayout,
        tracked: Vec<usize>,
        input_schema: &SchemaRef,
    ) -> Result<Self> {
        let value_columns = (0..layout.num_target())
            .chain([layout.kind()])
            .chain(layout.update_list())
            .collect();
        // (an update's events share its time stamp and their origin)
        let constant_columns = [layout.written_at(), layout.origin()];
        Ok(Self {
            flow: flow.to_string(),
            index: EventIndex::try_new(flow, &layout, input_schema)?,
            output_schema: scd2_output_schema(&layout, input_schema),
            input_schema: Arc::clone(input_schema),
            value_columns,
            tracked,
            layout,
            hash_state: RandomState::default(),
            tracked_hash_mask: u64::MAX,
            hashes: Vec::new(),
            batches: Retained::default().with_constant_columns(&constant_columns),
            versions: Vec::new(),
            counts: FoldCounts::default(),
            next: 0,
            rerun: None,
        })
    }

    /// Keep only `mask`'s bits of tracked hashes (tests: to make different
    /// values collide).
    #[cfg(test)]
    pub fn with_tracked_hash_mask(mut self, mask: u64) -> Self {
        self.tracked_hash_mask = mask;
        self
    }

    /// Schema of the batches this fold produces (the sorted fold's).
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output_schema
    }

    /// Counts so far (final once every output batch was taken).
    pub fn counts(&self) -> FoldCounts {
        match &self.rerun {
            Some(rerun) => rerun.counts(),
            None => self.counts,
        }
    }

    /// TRUNCATE events: none are allowed with SCD TYPE 2.
    pub fn observe_watermark(&self, sequences: &ArrayRef) -> Result<()> {
        match sequences.is_empty() {
            true => Ok(()),
            false => Err(truncate_not_allowed(&self.flow)),
        }
    }

    /// Bytes held: the retained batches, the index and what is kept per
    /// event.
    pub fn memory_size(&self) -> usize {
        self.batches.memory_size()
            + self.index.memory_size()
            + self
                .versions
                .iter()
                .map(BatchVersions::memory_size)
                .sum::<usize>()
            + self.hashes.capacity() * 8
            + self.rerun.as_ref().map_or(0, |r| r.memory_size())
    }

    /// The retained event batches, in arrival order (to fold them another
    /// way when memory runs short).
    pub fn into_batches(self) -> Result<Vec<RecordBatch>> {
        self.batches.into_batches()
    }

    /// Index one batch of new events (any order) and hash its tracked
    /// columns.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        self.push_from(batch, 0)
    }

    /// [`Self::push`] of a batch read by input partition `source`.
    pub fn push_from(&mut self, batch: &RecordBatch, source: u32) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        check_event_nulls(&self.flow, &self.layout, batch)?;
        let origins = batch
            .column(self.layout.origin())
            .as_primitive::<Int8Type>();
        if origins.values().iter().any(|&o| o != Origin::New as i8) {
            return Err(DataFusionError::Internal(format!(
                "flow '{}': an indexed SCD 2 fold reads new events only",
                self.flow
            )));
        }
        self.counts.input_rows += self
            .index
            .push_rows(batch, self.batches.len(), None, source)?;
        if !self.tracked.is_empty() {
            self.hashes.clear();
            self.hashes.resize(n, 0);
            let columns = self.tracked.iter().map(|&c| batch.column(c));
            create_hashes(columns, &self.hash_state, &mut self.hashes)?;
            self.hashes
                .iter_mut()
                .for_each(|h| *h &= self.tracked_hash_mask);
            self.index.tag_batch(&self.hashes);
        }
        self.versions.push(BatchVersions::new(n));
        self.batches.push(batch)?;
        Ok(())
    }

    /// Fold the index once every batch was pushed: sort it, walk every key
    /// group, then check the pairs taken as equal (a conflicting replay
    /// fails here, before any output; colliding tracked hashes fold the
    /// partition again with the sorted kernel). `scratch` grants or refuses
    /// the bytes of a counting sort (see [`EventIndex::sort`]).
    pub fn finish(&mut self, scratch: &mut dyn FnMut(usize) -> bool) -> Result<()> {
        self.index.sort(scratch);
        let mut checks = Checks::default();
        let mut groups = GroupWalk::default();
        while let Some(group) = groups.next(&self.index) {
            walk(group, &mut self.versions, &mut self.counts, &mut checks);
        }
        self.index.clear();
        self.hashes = Vec::new();
        let same = equal_pairs(self.batches.batches(), &checks.replays, &self.value_columns)?;
        if let Some(i) = same.iter().position(|same| !same) {
            let [_, _, b, r] = checks.replays[i];
            return Err(conflict_error(
                &self.flow,
                &self.layout,
                &self.batches.batches()[b as usize],
                r as usize,
                false,
            ));
        }
        let same = equal_pairs(self.batches.batches(), &checks.absorbed, &self.tracked)?;
        if same.contains(&false) {
            self.fold_again()?;
        }
        Ok(())
    }

    /// Fold the retained events with the sorted kernel instead (two tracked
    /// values hashed alike).
    fn fold_again(&mut self) -> Result<()> {
        let kernel = Scd2Fold::try_new(
            &self.flow,
            self.layout.clone(),
            self.tracked.clone(),
            None,
            &self.input_schema,
        )?
        .with_visible_only(true);
        let mut fold = IndexSortedFold::try_new(
            &self.flow,
            &self.layout,
            &self.input_schema,
            Box::new(kernel),
        )?;
        for batch in std::mem::take(&mut self.batches).into_batches()? {
            fold.push(&batch)?;
        }
        // (in place: no memory was granted for this rare second fold)
        fold.finish(&mut |_| false);
        self.versions = Vec::new();
        self.rerun = Some(Box::new(fold));
        Ok(())
    }

    /// The versions of the next retained batch that has any, in its row
    /// order (the batch is released); `None` at the end.
    pub fn next_output(&mut self, batch_size: usize) -> Result<Option<RecordBatch>> {
        if let Some(rerun) = &mut self.rerun {
            return rerun.next_output(batch_size);
        }
        while self.next < self.batches.len() {
            let b = self.next;
            self.next += 1;
            let batch = self.batches.release(b);
            let versions = std::mem::replace(&mut self.versions[b], BatchVersions::new(0));
            let rows = UInt32Array::from_iter_values(
                (0..versions.version.len())
                    .filter(|&r| versions.version[r] != NOT_A_VERSION)
                    .map(|r| r as u32),
            );
            if !rows.is_empty() {
                return self.emit(&batch, &versions, &rows).map(Some);
            }
        }
        Ok(None)
    }

    /// The `versions` recorded at `rows` of `batch`, as output rows.
    fn emit(
        &self,
        batch: &RecordBatch,
        versions: &BatchVersions,
        rows: &UInt32Array,
    ) -> Result<RecordBatch> {
        let every_row = rows.len() == batch.num_rows();
        let pick = |c: usize| -> Result<ArrayRef> {
            match every_row {
                true => Ok(Arc::clone(batch.column(c))),
                false => Ok(take(batch.column(c).as_ref(), rows, None)?),
            }
        };
        let at = || rows.values().iter().map(|&r| r as usize);
        let mut columns = (0..self.layout.num_target())
            .map(pick)
            .collect::<Result<Vec<_>>>()?;
        columns.push(
            self.index
                .sequence_array(at().map(|r| versions.start[r]).collect(), None)?,
        );
        let closed = NullBuffer::from_iter(at().map(|r| versions.version[r] == CLOSED_VERSION));
        let closed = (closed.null_count() > 0).then_some(closed);
        columns.push(
            self.index
                .sequence_array(at().map(|r| versions.end[r]).collect(), closed)?,
        );
        columns.push(pick(self.layout.seq())?);
        columns.push(Arc::new(Int8Array::from(vec![
            Kind::Upsert as i8;
            rows.len()
        ])));
        columns.push(pick(self.layout.written_at())?);
        if let Some(list) = self.layout.update_list() {
            columns.push(pick(list)?);
        }
        Ok(RecordBatch::try_new(
            Arc::clone(&self.output_schema),
            columns,
        )?)
    }
}

/// Walk one key's events (`group`, in sequence order) with the rules of the
/// module docs' table, recording its versions. (Every version is a row the
/// fold inserts: the upserted rows, as a flow's first update counts them.)
fn walk(
    group: &[IndexEntry],
    versions: &mut [BatchVersions],
    counts: &mut FoldCounts,
    checks: &mut Checks,
) {
    let mut kept: Option<&IndexEntry> = None;
    // the open version: its first event and its latest
    let mut open: Option<(&IndexEntry, &IndexEntry)> = None;
    for e in group {
        if let Some(k) = kept.filter(|k| k.seq == e.seq) {
            checks.replays.push(pair(k, e));
            counts.duplicates += 1;
            continue;
        }
        kept = Some(e);
        counts.events_added += 1;
        if e.kind == Kind::Delete as i8 {
            match open.take() {
                Some((first, last)) => {
                    record(versions, last, first, Some(e));
                    counts.upserted += 1;
                }
                None => counts.tombstones += 1,
            }
            continue;
        }
        open = match open {
            Some((first, last)) if last.tag() == e.tag() => {
                checks.absorbed.push(pair(last, e));
                Some((first, e))
            }
            Some((first, last)) => {
                record(versions, last, first, Some(e));
                counts.upserted += 1;
                Some((e, e))
            }
            None => Some((e, e)),
        };
    }
    if let Some((first, last)) = open {
        record(versions, last, first, None);
        counts.upserted += 1;
    }
}

#[cfg(test)]
mod tests;
