//! Indexed SCD type 1 fold: the result of [`super::Scd1Fold`] without
//! sorting the events themselves.
//!
//! Sorting every column of every event by `(keys, seq, origin)` was most of
//! an SCD 1 update's cost (DataFusion's sort moves whole rows, twice: into
//! sorted runs and through the merge). When the sequence is fixed-width
//! ([`IndexedScd1Fold::supports`]: integers, dates, timestamps, ... whose
//! values take at most 8 bytes), this kernel keeps the event batches where
//! they are and sorts a compact [`EventIndex`] instead (one 32-byte entry per
//! event: the sequence and the key, or its hash, as order-preserving
//! integers), then folds the index with the rules of the sorted fold and
//! gathers only the rows it emits:
//!
//! ```text
//!  push(batch)                 finish                   next_output
//!  ┌─────────────┐  row format ┌──────────────────────┐ ┌──────────────────────┐
//!  │ k1 seq 3 new│ ──────────► │ (key, seq, batch:row,│ │ per key group: winner│
//!  │ k2 seq 9 del│  as u64     │  origin, kind)       │►│ dups, conflicts, late│
//!  │ k1 seq 7 new│             │ sort_unstable        │ │ → interleave winners │
//!  └─────────────┘             └──────────────────────┘ │   + change feed rows │
//!   retained (tight:                                    └──────────────────────┘
//!   retained.rs)
//! ```
//!
//! The kernel holds every event of its partition: the operator accounts for
//! [`IndexedScd1Fold::memory_size`] in the session's memory pool and, when the
//! pool refuses, hands the retained batches ([`IndexedScd1Fold::into_batches`])
//! and the rest of its input to a spilling sort and the sorted fold.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int8Array, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{Int8Type, SchemaRef};
use datafusion::common::{DataFusionError, Result};

use super::columns::{
    scd1_output_schema, EventLayout, Kind, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE,
    CHANGE_PREIMAGE,
};
use super::emits::{Emit, EmitQueue};
use super::errors::{check_event_nulls, check_truncate_sequences, conflict_error};
use super::event_index::{EventIndex, GroupWalk, IndexEntry};
use super::pairs::{equal_pairs, pair, Pair};
use super::retained::Retained;
use super::FoldCounts;

/// Indexed SCD 1 fold of one partition (see the module docs).
pub struct IndexedScd1Fold {
    flow: String,
    layout: EventLayout,
    output_schema: SchemaRef,
    new_wins_ties: bool,
    /// Emit live rows only (see `FoldSpec::visible_only`).
    visible_only: bool,
    batches: Retained,
    index: EventIndex,
    watermark: Option<u64>,
    watermark_value: Option<ArrayRef>,
    /// The greatest TRUNCATE of this update (see `Scd1Fold`).
    truncated_through: Option<u64>,
    counts: FoldCounts,
    /// Rows to emit, once finished.
    emits: Option<EmitQueue>,
}

/// [`Emit::kind`] of a row emitted with its own kind (a stored row); other
/// emits carry a change feed kind.
const KEEP_KIND: i8 = -1;

impl std::fmt::Debug for IndexedScd1Fold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexedScd1Fold")
            .field("flow", &self.flow)
            .field("batches", &self.batches.len())
            .field("events", &self.index.len())
            .field("counts", &self.counts)
            .finish()
    }
}

impl IndexedScd1Fold {
    /// Whether events of `input_schema` can be folded by this kernel: a
    /// fixed-width sequence whose value takes at most 8 bytes (keys of any
    /// orderable type; see [`EventIndex`]).
    pub fn supports(layout: &EventLayout, input_schema: &arrow::datatypes::Schema) -> bool {
        EventIndex::supports(layout, input_schema)
    }

    /// Emit live rows only: no change rows or tombstones (a fold read as
    /// rows).
    pub fn with_visible_only(mut self, visible_only: bool) -> Self {
        self.visible_only = visible_only;
        self
    }

    /// Create a fold for events of `input_schema` (see [`EventLayout`]);
    /// output rows have the input columns minus `__cdc_origin`.
    pub fn try_new(
        flow: &str,
        layout: EventLayout,
        input_schema: &SchemaRef,
        new_wins_ties: bool,
    ) -> Result<Self> {
        // (an update's events share its time stamp and their origin)
        let constant_columns = [layout.written_at(), layout.origin()];
        Ok(Self {
            flow: flow.to_string(),
            index: EventIndex::try_new(flow, &layout, input_schema)?,
            output_schema: scd1_output_schema(&layout, input_schema)?,
            layout,
            new_wins_ties,
            visible_only: false,
            batches: Retained::default().with_constant_columns(&constant_columns),
            watermark: None,
            watermark_value: None,
            truncated_through: None,
            counts: FoldCounts::default(),
            emits: None,
        })
    }

    /// Schema of the batches this fold produces.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output_schema
    }

    /// Counts so far (final once every output batch was taken).
    pub fn counts(&self) -> FoldCounts {
        self.counts
    }

    /// Raise the truncate watermark to the greatest of `sequences`, TRUNCATE
    /// event sequences; must be called before [`Self::finish`]. NULLs are
    /// rejected.
    pub fn observe_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        self.raise_watermark(sequences, true)
    }

    /// Raise the truncate watermark to the stored watermark (see
    /// [`FoldKernel::observe_stored_watermark`](super::kernel::FoldKernel)).
    pub fn observe_stored_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        self.raise_watermark(sequences, false)
    }

    fn raise_watermark(&mut self, sequences: &ArrayRef, truncating: bool) -> Result<()> {
        check_truncate_sequences(&self.flow, sequences.as_ref())?;
        for (i, seq) in self
            .index
            .sequence_values(sequences)?
            .into_iter()
            .enumerate()
        {
            if self.watermark.is_none_or(|w| seq > w) {
                self.watermark = Some(seq);
                self.watermark_value = Some(sequences.slice(i, 1));
            }
            if truncating && self.truncated_through.is_none_or(|w| seq > w) {
                self.truncated_through = Some(seq);
            }
        }
        Ok(())
    }

    /// The truncate watermark as a one-element array, once observed.
    pub fn watermark_value(&self) -> Option<&ArrayRef> {
        self.watermark_value.as_ref()
    }

    /// Bytes held: the retained batches and the index.
    pub fn memory_size(&self) -> usize {
        self.batches.memory_size()
            + self.index.memory_size()
            + self.emits.as_ref().map_or(0, EmitQueue::memory_size)
    }

    /// The retained events, in arrival order (to fold them another way
    /// when memory runs short).
    pub fn into_batches(self) -> Result<Vec<RecordBatch>> {
        self.batches.into_batches()
    }

    /// Index one batch of events (stored rows and new events, any order).
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        self.push_rows(batch, None, 0)
    }

    /// Index `rows` of `batch` (ascending; all when `None`), a batch shared
    /// with other partitions' folds and read by input partition `source`:
    /// it is retained whole and the index points into it, so that no row is
    /// copied. (With hashed keys, whose row-format keys the index keeps per
    /// batch, the rows are copied first: the index would keep the other
    /// partitions' keys too.)
    pub fn push_rows(
        &mut self,
        batch: &RecordBatch,
        rows: Option<&UInt32Array>,
        source: u32,
    ) -> Result<()> {
        let taken;
        let (batch, rows) = match rows {
            Some(r) if self.index.hashes_keys() => {
                taken = take_record_batch(batch, r)?;
                (&taken, None)
            }
            _ => (batch, rows),
        };
        if rows.map_or(batch.num_rows(), |r| r.len()) == 0 {
            return Ok(());
        }
        check_event_nulls(&self.flow, &self.layout, batch)?;
        let b = self.batches.len();
        // the index points into the batch as retained (its rows may have
        // been copied out)
        let (kept, rows) = self.batches.push_rows(batch, rows)?;
        let positions = rows.map(|r| r.values().as_ref());
        self.counts.input_rows += self.index.push_rows(kept, b, positions, source)?;
        Ok(())
    }

    /// Fold the index once every batch was pushed: sort it, fold every key
    /// group (errors — conflicting events — surface here, before any
    /// output), and order the rows to emit by the batch they come from, so
    /// that [`Self::next_output`] gathers them a few batches at a time.
    /// `scratch` grants or refuses the bytes of a counting sort (see
    /// [`EventIndex::sort`]).
    pub fn finish(&mut self, scratch: &mut dyn FnMut(usize) -> bool) -> Result<()> {
        self.index.sort(scratch);
        let (mut emits, mut checks) = (Vec::new(), Checks::default());
        let mut groups = GroupWalk::default();
        while let Some(group) = groups.next(&self.index) {
            self.fold_group(group, &mut emits, &mut checks)?;
        }
        // the index is no longer needed: free it before emitting
        self.index.clear();
        self.run_checks(checks, &mut emits)?;
        self.emits = Some(EmitQueue::new(emits, self.batches.len()));
        Ok(())
    }

    /// The next output batch (about `batch_size` rows, gathered from a few
    /// consecutive retained batches): stored rows and change feed rows;
    /// `None` at the end.
    pub fn next_output(&mut self, batch_size: usize) -> Result<Option<RecordBatch>> {
        let Some(queue) = self.emits.as_mut() else {
            return Err(DataFusionError::Internal(
                "IndexedScd1Fold::next_output before finish".into(),
            ));
        };
        let Some((gathered, emits)) = queue.next_window(self.batches.batches(), batch_size)? else {
            return Ok(None);
        };
        let input_kinds = gathered
            .column(self.layout.kind())
            .as_primitive::<Int8Type>();
        let kinds: Int8Array = emits
            .iter()
            .zip(input_kinds.values().iter())
            .map(|(e, k)| Some(if e.kind == KEEP_KIND { *k } else { e.kind }))
            .collect();
        let mut columns = gathered.columns()[..self.layout.origin()].to_vec();
        columns[self.layout.kind()] = Arc::new(kinds);
        Ok(Some(RecordBatch::try_new(
            Arc::clone(&self.output_schema),
            columns,
        )?))
    }

    /// Fold one key's events, in index order: check equal-sequence events,
    /// count late and duplicate ones, and emit the stored row and change
    /// feed rows, as [`super::Scd1Fold`] does.
    fn fold_group(
        &mut self,
        group: &[IndexEntry],
        emits: &mut Vec<Emit>,
        checks: &mut Checks,
    ) -> Result<()> {
        let stored = group.iter().find(|e| e.stored()).copied();
        let stored_seq = stored.map(|s| s.seq);
        let (mut late, mut duplicates) = (0, 0);
        let mut winner = group[0];
        let mut i = 0;
        while i < group.len() {
            let seq = group[i].seq;
            let mut j = i + 1;
            while j < group.len() && group[j].seq == seq {
                j += 1;
            }
            // at equal sequence the stored row sorts first
            let news = &group[i + usize::from(group[i].stored())..j];
            if stored_seq == Some(seq) && !self.new_wins_ties {
                // the stored row wins: the new events are late
                late += news.len();
                winner = group[i];
            } else {
                if let Some(first) = news.first() {
                    if stored_seq.is_some_and(|s| seq < s) {
                        // late, every one: never a conflict, nor a
                        // duplicate (as at the stored sequence)
                        late += news.len();
                    } else {
                        // (must be the same event: checked with all others
                        // at the end)
                        for other in &news[1..] {
                            checks.events.push(pair(first, other));
                        }
                        duplicates += news.len() - 1;
                    }
                }
                winner = news.first().copied().unwrap_or(group[i]);
            }
            i = j;
        }
        self.counts.late += late;
        self.counts.duplicates += duplicates;

        let visible_only = self.visible_only;
        let mut emit = |e: &IndexEntry, kind: Option<i8>| {
            // (live rows only: no change rows, no tombstones)
            if visible_only && (kind.is_some() || e.kind != Kind::Upsert as i8) {
                return;
            }
            emits.push(Emit {
                batch: e.batch,
                row: e.row,
                kind: kind.unwrap_or(KEEP_KIND),
            });
        };
        let live = stored.filter(|s| s.kind == Kind::Upsert as i8);
        // a stored row goes only by a TRUNCATE of this update
        let watermark = if winner.stored() {
            self.truncated_through
        } else {
            self.watermark
        };
        if watermark.is_some_and(|w| winner.seq <= w) {
            // every new event is at or below the watermark: the live stored
            // row stays unless a TRUNCATE of this update reaches it (a
            // tombstone there keeps nothing out: it goes, as in `Scd1Fold`)
            if let Some(live) = &live {
                if !winner.stored() && self.truncated_through.is_none_or(|t| live.seq > t) {
                    emit(live, None);
                    return Ok(());
                }
            }
            if let Some(live) = &live {
                self.counts.deleted += 1;
                emit(live, Some(CHANGE_DELETE));
            }
            return Ok(());
        }
        if !winner.stored() {
            if winner.kind == Kind::Delete as i8 {
                self.counts.tombstones += 1;
                if let Some(live) = &live {
                    self.counts.deleted += 1;
                    emit(live, Some(CHANGE_DELETE));
                }
            } else {
                match &live {
                    None => {
                        self.counts.upserted += 1;
                        emit(&winner, Some(CHANGE_INSERT));
                    }
                    // change feed rows, and an upserted row, unless nothing
                    // visible changes (compared with all others at the end)
                    Some(live) => checks.values.push(pair(live, &winner)),
                }
            }
        }
        emit(&winner, None);
        Ok(())
    }

    /// Run the deferred equality checks: a replay that differs from its
    /// first copy fails the fold (the first in key order is reported); an
    /// update that changes a visible column emits its pre- and post-image
    /// and is an upserted row.
    fn run_checks(&mut self, checks: Checks, emits: &mut Vec<Emit>) -> Result<()> {
        let seq = self.layout.seq();
        let event_columns: Vec<usize> = (0..self.layout.origin()).filter(|c| *c != seq).collect();
        let same = equal_pairs(self.batches.batches(), &checks.events, &event_columns)?;
        if let Some(i) = same.iter().position(|same| !same) {
            let [_, _, b, r] = checks.events[i];
            return Err(conflict_error(
                &self.flow,
                &self.layout,
                &self.batches.batches()[b as usize],
                r as usize,
                false,
            ));
        }
        let target_columns: Vec<usize> = (0..self.layout.num_target()).collect();
        let same = equal_pairs(self.batches.batches(), &checks.values, &target_columns)?;
        for ([live_batch, live_row, batch, row], same) in checks.values.into_iter().zip(same) {
            if !same {
                self.counts.upserted += 1;
                if self.visible_only {
                    continue;
                }
                emits.push(Emit {
                    batch: live_batch,
                    row: live_row,
                    kind: CHANGE_PREIMAGE,
                });
                emits.push(Emit {
                    batch,
                    row,
                    kind: CHANGE_POSTIMAGE,
                });
            }
        }
        Ok(())
    }
}

/// Equality checks found while folding, run at the end over all pairs at
/// once ([`equal_pairs`]).
#[derive(Debug, Default)]
struct Checks {
    /// (first copy, other copy) of events of one key and sequence.
    events: Vec<Pair>,
    /// (live stored row, new winning event) of an update.
    values: Vec<Pair>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::columns::Origin;
    use crate::fold::Scd1Fold;
    use arrow::array::{Int64Array, StringArray};
    use arrow::compute::{concat_batches, lexsort_to_indices, take_record_batch, SortColumn};
    use arrow::datatypes::{DataType, Field, Schema};

    impl IndexedScd1Fold {
        /// Keep only `mask`'s bits of key hashes, so that keys collide.
        fn with_key_hash_mask(mut self, mask: u64) -> Self {
            self.index = self.index.with_key_hash_mask(mask);
            self
        }
    }

    fn layout() -> EventLayout {
        EventLayout {
            target_columns: vec!["id".into(), "v".into()],
            key_indices: vec![0],
            system_seq: false,
            update_list: false,
            sequence_groups: Vec::new(),
            group_sequences: false,
        }
    }

    /// Keys are integers, or (`string_keys`) strings: hashed in the index.
    fn schema(string_keys: bool) -> SchemaRef {
        let key = if string_keys {
            DataType::Utf8
        } else {
            DataType::Int64
        };
        Arc::new(Schema::new(vec![
            Field::new("id", key, true),
            Field::new("v", DataType::Utf8, true),
            Field::new("__cdc_seq", DataType::Int64, true),
            Field::new("__cdc_kind", DataType::Int8, false),
            Field::new("__cdc_written_at", DataType::Int64, true),
            Field::new("__cdc_origin", DataType::Int8, false),
        ]))
    }

    /// (id, v, seq, kind, origin)
    type Event = (i64, &'static str, i64, Kind, Origin);

    /// A TRUNCATE of this update, or the stored watermark.
    #[derive(Debug, Clone, Copy)]
    struct Watermark {
        seq: i64,
        stored: bool,
    }

    /// How a fold is told a watermark (either fold's methods).
    type Observe<F> = fn(&mut F, &ArrayRef) -> Result<()>;

    impl Watermark {
        /// Tell `fold` the watermark: as the stored one, or as a TRUNCATE
        /// of this update.
        fn hand_to<F>(self, fold: &mut F, stored: Observe<F>, new: Observe<F>) -> Result<()> {
            let seqs = Arc::new(Int64Array::from(vec![self.seq])) as ArrayRef;
            if self.stored {
                stored(fold, &seqs)
            } else {
                new(fold, &seqs)
            }
        }
    }

    const TRUNCATE_4: Watermark = Watermark {
        seq: 4,
        stored: false,
    };

    fn batch(events: &[Event], string_keys: bool) -> RecordBatch {
        let ids: ArrayRef = if string_keys {
            Arc::new(StringArray::from_iter_values(
                events.iter().map(|e| format!("key-{}", e.0)),
            ))
        } else {
            Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.0)))
        };
        RecordBatch::try_new(
            schema(string_keys),
            vec![
                ids,
                Arc::new(StringArray::from_iter_values(events.iter().map(|e| e.1))),
                Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.2))),
                Arc::new(Int8Array::from_iter_values(
                    events.iter().map(|e| e.3 as i8),
                )),
                Arc::new(Int64Array::from_iter_values(events.iter().map(|_| 0))),
                Arc::new(Int8Array::from_iter_values(
                    events.iter().map(|e| e.4 as i8),
                )),
            ],
        )
        .unwrap()
    }

    fn sorted(batch: &RecordBatch) -> RecordBatch {
        let columns = [0, 2, 5]
            .iter()
            .map(|&c| SortColumn {
                values: Arc::clone(batch.column(c)),
                options: None,
            })
            .collect::<Vec<_>>();
        let indices = lexsort_to_indices(&columns, None).unwrap();
        take_record_batch(batch, &indices).unwrap()
    }

    /// Rows of a fold output as text, sorted (order is not part of the result).
    fn rows(batches: &[RecordBatch], string_keys: bool) -> Vec<String> {
        let schema = scd1_output_schema(&layout(), &schema(string_keys)).unwrap();
        let all = concat_batches(&schema, batches).unwrap();
        let mut out: Vec<String> = (0..all.num_rows())
            .map(|i| {
                (0..all.num_columns())
                    .map(|c| {
                        datafusion::common::ScalarValue::try_from_array(all.column(c), i)
                            .unwrap()
                            .to_string()
                    })
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect();
        out.sort();
        out
    }

    type Folded = (Vec<String>, FoldCounts);

    fn run_indexed(
        events: &[Event],
        ties: bool,
        watermark: Option<Watermark>,
        string_keys: bool,
        key_hash_mask: u64,
    ) -> Result<Folded> {
        run_indexed_emitting(events, ties, watermark, string_keys, key_hash_mask, false)
    }

    /// The indexed fold of `events`, its index sorted by counting and in
    /// place: both must give the same rows, counts or error.
    fn run_indexed_emitting(
        events: &[Event],
        ties: bool,
        watermark: Option<Watermark>,
        string_keys: bool,
        key_hash_mask: u64,
        visible_only: bool,
    ) -> Result<Folded> {
        let run = |counting: bool| -> Result<Folded> {
            let mut fold = IndexedScd1Fold::try_new("f", layout(), &schema(string_keys), ties)?
                .with_key_hash_mask(key_hash_mask)
                .with_visible_only(visible_only);
            assert_eq!(fold.index.hashes_keys(), string_keys);
            if let Some(w) = watermark {
                w.hand_to(
                    &mut fold,
                    IndexedScd1Fold::observe_stored_watermark,
                    IndexedScd1Fold::observe_watermark,
                )?;
            }
            // one event per batch: key groups cross batches
            for e in events {
                fold.push(&batch(std::slice::from_ref(e), string_keys))?;
            }
            fold.finish(&mut |_| counting)?;
            let mut out = Vec::new();
            while let Some(b) = fold.next_output(2)? {
                out.push(b);
            }
            Ok((rows(&out, string_keys), fold.counts()))
        };
        let (counted, compared) = (run(true), run(false));
        match (&counted, &compared) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            _ => panic!("counting gave {counted:?}, comparing {compared:?}"),
        }
        counted
    }

    fn run_sorted(
        events: &[Event],
        ties: bool,
        watermark: Option<Watermark>,
        string_keys: bool,
    ) -> Result<Folded> {
        run_sorted_emitting(events, ties, watermark, string_keys, false)
    }

    fn run_sorted_emitting(
        events: &[Event],
        ties: bool,
        watermark: Option<Watermark>,
        string_keys: bool,
        visible_only: bool,
    ) -> Result<Folded> {
        let mut fold = Scd1Fold::try_new("f", layout(), &schema(string_keys))?
            .with_new_wins_ties(ties)
            .with_visible_only(visible_only);
        if let Some(w) = watermark {
            w.hand_to(
                &mut fold,
                Scd1Fold::observe_stored_watermark,
                Scd1Fold::observe_watermark,
            )?;
        }
        let mut out = Vec::new();
        if let Some(b) = fold.push(&sorted(&batch(events, string_keys)))? {
            out.push(b);
        }
        if let Some(b) = fold.finish_all()? {
            out.push(b);
        }
        Ok((rows(&out, string_keys), fold.counts()))
    }

    use Kind::{Delete as D, Upsert as U};
    use Origin::{New as N, Stored as S};

    fn cases() -> Vec<Vec<Event>> {
        vec![
            // plain history, a delete, a replay
            vec![
                (1, "a", 1, U, N),
                (1, "b", 3, U, N),
                (2, "x", 2, U, N),
                (2, "", 5, D, N),
                (1, "b", 3, U, N),
            ],
            // stored row: late, equal (late), newer; tombstone stored
            vec![
                (1, "s", 5, U, S),
                (1, "a", 3, U, N),
                (1, "a", 3, U, N),
                (1, "t", 5, U, N),
                (1, "n", 7, U, N),
                (2, "", 4, D, S),
                (2, "y", 2, U, N),
            ],
            // late events that differ from each other: late, no conflict
            vec![
                (1, "s", 5, U, S),
                (1, "a", 3, U, N),
                (1, "b", 3, U, N),
                (1, "a", 3, U, N),
                (2, "", 4, D, S),
                (2, "y", 2, U, N),
                (2, "", 2, D, N),
            ],
            // update to the same values: no change feed rows
            vec![(1, "s", 5, U, S), (1, "s", 6, U, N), (3, "z", 1, U, S)],
            // delete of a live row
            vec![(1, "s", 5, U, S), (1, "", 6, D, N)],
            // rows DML inserted at the least sequence: a late event, a newer
            // one, none
            vec![
                (1, "dml", i64::MIN, U, S),
                (1, "late", 0, U, N),
                (2, "ins", i64::MIN, U, S),
                (2, "new", 5, U, N),
                (3, "x", i64::MIN, U, S),
                (4, "", i64::MIN, D, S),
                (4, "late", 2, U, N),
            ],
            // many keys, interleaved, for hash collisions
            (0..12)
                .flat_map(|k| {
                    [
                        (k, "old", 2, U, S),
                        (k, "new", 1 + k % 3, U, N),
                        (k + 20, "x", k, U, N),
                    ]
                })
                .collect(),
        ]
    }

    #[test]
    fn equals_the_sorted_fold() {
        for events in &cases() {
            for ties in [false, true] {
                let stored_4 = Watermark {
                    seq: 4,
                    stored: true,
                };
                for wm in [None, Some(TRUNCATE_4), Some(stored_4)] {
                    let expected = run_sorted(events, ties, wm, false).unwrap();
                    let got = run_indexed(events, ties, wm, false, u64::MAX).unwrap();
                    assert_eq!(got, expected, "{events:?} ties={ties} watermark={wm:?}");
                }
            }
        }
    }

    /// String keys are hashed into the index; colliding hashes (here: only
    /// one or two hash values) still fold every key on its own.
    #[test]
    fn hashed_keys_equal_the_sorted_fold_even_when_hashes_collide() {
        for events in &cases() {
            for ties in [false, true] {
                let expected = run_sorted(
                    events,
                    ties,
                    Some(Watermark {
                        seq: 1,
                        stored: false,
                    }),
                    true,
                )
                .unwrap();
                for mask in [u64::MAX, 1, 0] {
                    let got = run_indexed(
                        events,
                        ties,
                        Some(Watermark {
                            seq: 1,
                            stored: false,
                        }),
                        true,
                        mask,
                    )
                    .unwrap();
                    assert_eq!(got, expected, "{events:?} ties={ties} mask={mask}");
                }
            }
        }
    }

    /// Emitting visible rows only, both folds emit exactly the live rows of
    /// the full output, with the same counts.
    #[test]
    fn visible_only_emits_the_live_rows() {
        for events in &cases() {
            for wm in [None, Some(TRUNCATE_4)] {
                let (full, counts) = run_sorted(events, false, wm, false).unwrap();
                let live: Vec<String> = full
                    .into_iter()
                    .filter(|r| r.split('|').nth(3) == Some("0"))
                    .collect();
                let sorted = run_sorted_emitting(events, false, wm, false, true).unwrap();
                let indexed =
                    run_indexed_emitting(events, false, wm, false, u64::MAX, true).unwrap();
                assert_eq!(
                    sorted,
                    (live.clone(), counts),
                    "{events:?} watermark={wm:?}"
                );
                assert_eq!(indexed, (live, counts), "{events:?} watermark={wm:?}");
            }
        }
    }

    /// Two folds sharing one batch, each given the rows of its keys (as a
    /// key exchange hands them), together fold what one fold of the whole
    /// batch does: whether the batch is kept shared, or copied because its
    /// buffers are loose (a slice) or its keys are hashed.
    #[test]
    fn folds_sharing_a_batch_fold_their_rows() {
        for events in &cases() {
            for string_keys in [false, true] {
                let (expected, _) = run_sorted(events, false, None, string_keys).unwrap();
                let whole = batch(events, string_keys);
                let four: Vec<Event> = events
                    .iter()
                    .cycle()
                    .take(4 * events.len())
                    .copied()
                    .collect();
                let slice = batch(&four, string_keys).slice(0, events.len());
                for shared in [whole, slice] {
                    let mut out = Vec::new();
                    for parity in [0, 1] {
                        let mut fold =
                            IndexedScd1Fold::try_new("f", layout(), &schema(string_keys), false)
                                .unwrap();
                        let rows = UInt32Array::from_iter_values(
                            (0..events.len() as u32)
                                .filter(|&i| events[i as usize].0.rem_euclid(2) == parity),
                        );
                        fold.push_rows(&shared, Some(&rows), 0).unwrap();
                        fold.finish(&mut |_| parity == 0).unwrap();
                        while let Some(b) = fold.next_output(2).unwrap() {
                            out.push(b);
                        }
                    }
                    assert_eq!(rows(&out, string_keys), expected, "{events:?}");
                }
            }
        }
    }

    #[test]
    fn conflicting_events_fail_at_any_sequence() {
        // the conflict is below the winning sequence
        let events = vec![(1, "a", 3, U, N), (1, "z", 9, U, N), (1, "b", 3, U, N)];
        for string_keys in [false, true] {
            let err = run_indexed(&events, false, None, string_keys, 0)
                .unwrap_err()
                .to_string();
            assert!(err.contains("flow 'f'") && err.contains("id="), "{err}");
            assert!(run_sorted(&events, false, None, string_keys).is_err());
        }
    }
}
