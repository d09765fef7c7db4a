//! SCD type 1 fold.
//!
//! SCD 1 keeps one stored row per key: the row itself (live) or a tombstone,
//! each carrying the sequence of the event that produced it, plus a single
//! truncate watermark for the whole target. Folding an update is therefore
//! "the greatest-sequence event of each key wins", with three refinements:
//!
//! * the stored row takes part as an event at its stored sequence and sorts
//!   before new events of equal sequence, so it wins ties: a new event with a
//!   sequence ≤ the stored one is late (or a replay) and is dropped;
//! * two *new* events of one key with equal sequence must be the same event
//!   (same kind and values), otherwise the update fails with a conflict —
//!   unless they are late: below the stored row's sequence they are dropped
//!   as late, whatever they hold (SPEC §2.2: SCD 1 keeps no events);
//! * a key whose winning sequence is ≤ the truncate watermark `T` (the greatest
//!   TRUNCATE sequence ever seen) disappears without a tombstone: `T` itself
//!   keeps older events out. A stored row goes only by a TRUNCATE of this
//!   update: the one below the stored watermark was written by DML after it
//!   (an `INSERT` without a tombstone has the least sequence, SPEC §4.2), and
//!   it stays when its key's new events are all ≤ `T`.
//!
//! ```text
//!  sorted by (keys, seq, origin)          per key                 output
//!  ┌──────────────┬─────┬────────┐   ┌──────────────────┐   ┌──────────────────┐
//!  │ k1 │ stored  │  5  │ live   │   │ winner = first   │   │ k1 v@7 live      │
//!  │ k1 │ new     │  3  │ upsert │──►│ event of the     │──►│ k2 @9 tombstone  │
//!  │ k1 │ new     │  7  │ upsert │   │ greatest seq,    │   │ (k3 @2 ≤ T: gone)│
//!  │ k2 │ new     │  9  │ delete │   │ dropped if ≤ T   │   └──────────────────┘
//!  └──────────────┴─────┴────────┘   └──────────────────┘
//! ```
//!
//! The kernel retains at most the current key group (one row per slot) across
//! batch boundaries, so memory is bounded by the batch size.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{make_comparator, ArrayRef, AsArray, Int8Array, RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take_record_batch, SortOptions};
use arrow::datatypes::{Int8Type, SchemaRef};
use arrow::row::{OwnedRow, Row, RowConverter, Rows};
use datafusion::common::{DataFusionError, Result};

use super::columns::{
    scd1_output_schema, EventLayout, Kind, Origin, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE,
    CHANGE_PREIMAGE,
};
use super::errors::{check_event_nulls, conflict_error};
use super::kernel::{FoldKernel, TruncateWatermarks};
use super::rows::{row_converter, to_rows};

/// What one fold did; reported as operator metrics and by the update.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FoldCounts {
    /// New events read from the source (UPSERT and DELETE).
    pub input_rows: usize,
    /// Live rows written by new events (inserted or updated keys; SCD 2:
    /// versions inserted or updated, closing one included — the change
    /// feed's inserts and update pairs).
    pub upserted: usize,
    /// Live rows removed (by DELETE or TRUNCATE; SCD 2: versions that no
    /// longer exist, as a late event moving a version's start removes it).
    pub deleted: usize,
    /// New tombstones written.
    pub tombstones: usize,
    /// New events dropped because the target already held that key at an
    /// equal or greater sequence.
    pub late: usize,
    /// New events dropped as exact duplicates of another (new or stored) event.
    pub duplicates: usize,
    /// New events added to a stored history (SCD 2).
    pub events_added: usize,
}

impl FoldCounts {
    /// Whether the fold changed the stored state at all: a new event that
    /// was neither late nor a duplicate changed it, if only the key's
    /// stored sequence (an upsert of the values the row holds; under
    /// per-column sequencing, a column's), which later events are late
    /// against.
    pub fn changed_state(&self) -> bool {
        self.upserted + self.deleted + self.tombstones + self.events_added > 0
            || self.input_rows > self.late + self.duplicates
    }
}

/// A row of the group that may live in the current batch or, when the group
/// spans a batch boundary, in a retained one-row batch.
#[derive(Debug, Clone)]
enum Slot {
    Here(usize),
    Carried { row: RecordBatch, seq: OwnedRow },
}

/// State of the key group being folded.
#[derive(Debug)]
struct Group {
    /// Key of the group once it spans a batch boundary.
    carried_key: Option<OwnedRow>,
    /// First row of the group in the current batch (when not carried).
    start: usize,
    /// Winning event so far: the first event of the greatest sequence.
    winner: Slot,
    winner_origin: Origin,
    /// Previous event of the group (for equal-sequence checks).
    prev: Slot,
    prev_origin: Origin,
    /// The target held a live row for this key.
    stored_live: bool,
    /// That live row (the pre-image of a change).
    stored: Option<Slot>,
    /// New events seen before the stored row (all late, if one follows).
    new_before_stored: usize,
    /// Of those, copies of an earlier one: duplicates, unless a stored
    /// row follows (then late, as the copies of a stored event are).
    copies_before_stored: usize,
    stored_seen: bool,
    /// Two new events of one sequence that differ, before any stored row:
    /// a conflict unless a stored row of a greater sequence follows (then
    /// both are late).
    pending_conflict: Option<DataFusionError>,
}

/// Streaming SCD 1 fold over batches sorted by `(keys, seq, origin)`.
pub struct Scd1Fold {
    flow: String,
    layout: EventLayout,
    output_schema: SchemaRef,
    key_converter: RowConverter,
    seq_converter: RowConverter,
    watermarks: TruncateWatermarks,
    group: Option<Group>,
    counts: FoldCounts,
    new_wins_ties: bool,
    /// Emit live rows only (see `FoldSpec::visible_only`).
    visible_only: bool,
}

impl std::fmt::Debug for Scd1Fold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scd1Fold")
            .field("flow", &self.flow)
            .field("layout", &self.layout)
            .field("counts", &self.counts)
            .finish()
    }
}

impl Scd1Fold {
    /// Create a fold for events of `input_schema` (see [`EventLayout`]);
    /// output rows have the input columns minus `__cdc_origin`.
    pub fn try_new(flow: &str, layout: EventLayout, input_schema: &SchemaRef) -> Result<Self> {
        Ok(Self {
            flow: flow.to_string(),
            key_converter: row_converter(input_schema, &layout.key_indices)?,
            seq_converter: row_converter(input_schema, &[layout.seq()])?,
            output_schema: scd1_output_schema(&layout, input_schema)?,
            layout,
            watermarks: TruncateWatermarks::default(),
            group: None,
            counts: FoldCounts::default(),
            new_wins_ties: false,
            visible_only: false,
        })
    }

    /// Let new events win ties with the stored row (snapshot flows).
    pub fn with_new_wins_ties(mut self, new_wins_ties: bool) -> Self {
        self.new_wins_ties = new_wins_ties;
        self
    }

    /// Emit live rows only: no change rows or tombstones (a fold read as
    /// rows).
    pub fn with_visible_only(mut self, visible_only: bool) -> Self {
        self.visible_only = visible_only;
        self
    }

    /// Schema of the batches this fold produces.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output_schema
    }

    /// Counts so far.
    pub fn counts(&self) -> FoldCounts {
        self.counts
    }

    /// Raise the truncate watermark to the greatest of `sequences`, TRUNCATE
    /// event sequences (see [`FoldKernel::observe_watermark`]). Must be
    /// called before [`Self::push`]. NULLs are rejected.
    pub fn observe_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        self.raise_watermark(sequences, true)
    }

    /// Raise the truncate watermark to the stored watermark (see
    /// [`FoldKernel::observe_stored_watermark`]).
    pub fn observe_stored_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        self.raise_watermark(sequences, false)
    }

    fn raise_watermark(&mut self, sequences: &ArrayRef, truncating: bool) -> Result<()> {
        self.watermarks
            .raise(&self.flow, &self.seq_converter, sequences, truncating)
    }

    /// The truncate watermark and the greatest TRUNCATE of this update, as
    /// rows (for the partial-update merge).
    pub(crate) fn watermark_rows(&self) -> (Option<&OwnedRow>, Option<&OwnedRow>) {
        (self.watermarks.all(), self.watermarks.this_update())
    }

    /// The truncate watermark as a one-element array, once observed.
    pub fn watermark_value(&self) -> Option<&ArrayRef> {
        self.watermarks.value()
    }

    /// Fold one sorted batch; returns the rows of the key groups it completed.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(None);
        }
        self.check_nulls(batch)?;
        let keys = to_rows(&self.key_converter, batch, &self.layout.key_indices)?;
        let seqs = to_rows(&self.seq_converter, batch, &[self.layout.seq()])?;
        let kinds = batch.column(self.layout.kind()).as_primitive::<Int8Type>();
        let origins = batch
            .column(self.layout.origin())
            .as_primitive::<Int8Type>();

        let mut emit = Emit::new(self.visible_only);
        for i in 0..n {
            let origin = if origins.value(i) == Origin::Stored as i8 {
                Origin::Stored
            } else {
                Origin::New
            };
            if origin == Origin::New {
                self.counts.input_rows += 1;
            }
            let kind = Kind::from_code(kinds.value(i)).unwrap_or(Kind::Upsert);
            let same_key = self.group.as_ref().is_some_and(|g| match &g.carried_key {
                Some(k) => k.row() == keys.row(i),
                None => keys.row(g.start) == keys.row(i),
            });
            if !same_key {
                if let Some(g) = self.group.take() {
                    self.finish(g, &seqs, Some(batch), &mut emit)?;
                }
                self.group = Some(Group {
                    carried_key: None,
                    start: i,
                    winner: Slot::Here(i),
                    winner_origin: origin,
                    prev: Slot::Here(i),
                    prev_origin: origin,
                    stored_live: origin == Origin::Stored && kind == Kind::Upsert,
                    stored: (origin == Origin::Stored && kind == Kind::Upsert)
                        .then_some(Slot::Here(i)),
                    new_before_stored: usize::from(origin == Origin::New),
                    stored_seen: origin == Origin::Stored,
                    copies_before_stored: 0,
                    pending_conflict: None,
                });
                continue;
            }
            let Some(mut g) = self.group.take() else {
                continue;
            };
            if origin == Origin::Stored {
                g.stored_seen = true;
                g.stored_live = kind == Kind::Upsert;
                g.stored = g.stored_live.then_some(Slot::Here(i));
                self.counts.late += g.new_before_stored;
                // (the new events before it, copies or conflicting, are late)
                g.copies_before_stored = 0;
                g.pending_conflict = None;
            } else if !g.stored_seen {
                g.new_before_stored += 1;
            }
            let equal_seq = slot_seq(&g.prev, &seqs) == seqs.row(i);
            if equal_seq {
                match (g.prev_origin, origin) {
                    (Origin::Stored, Origin::New) if self.new_wins_ties => {
                        g.winner = Slot::Here(i);
                        g.winner_origin = origin;
                        g.prev = Slot::Here(i);
                        g.prev_origin = origin;
                    }
                    (Origin::Stored | Origin::StoredByDml | Origin::Implied, _) => {
                        self.counts.late += 1
                    }
                    (Origin::New | Origin::Dml, Origin::New | Origin::Dml) => {
                        if !self.same_event(batch, &g.prev, i)? {
                            let err = self.conflict_error(batch, i);
                            if g.stored_seen {
                                self.group = Some(g);
                                return Err(err);
                            }
                            // (late if a stored row follows: counted so)
                            g.pending_conflict.get_or_insert(err);
                            self.group = Some(g);
                            continue;
                        }
                        if g.stored_seen {
                            self.counts.duplicates += 1;
                        } else {
                            g.copies_before_stored += 1;
                        }
                    }
                    // stored rows sort first at equal sequence
                    (
                        Origin::New | Origin::Dml,
                        Origin::Stored | Origin::StoredByDml | Origin::Implied,
                    ) => {
                        g.winner = Slot::Here(i);
                        g.winner_origin = origin;
                        g.prev = Slot::Here(i);
                        g.prev_origin = origin;
                    }
                }
            } else {
                g.winner = Slot::Here(i);
                g.winner_origin = origin;
                g.prev = Slot::Here(i);
                g.prev_origin = origin;
            }
            self.group = Some(g);
        }
        // carry the open group over the batch boundary
        if let Some(g) = self.group.as_mut() {
            if g.carried_key.is_none() {
                g.carried_key = Some(keys.row(g.start).owned());
            }
            g.winner = carry(batch, &seqs, &g.winner);
            g.prev = carry(batch, &seqs, &g.prev);
            g.stored = g.stored.as_ref().map(|s| carry(batch, &seqs, s));
        }
        self.build_output(batch, emit).map(Some)
    }

    /// Finish the last group; returns its row (if any survives).
    pub fn finish_all(&mut self) -> Result<Option<RecordBatch>> {
        let Some(g) = self.group.take() else {
            return Ok(None);
        };
        let empty = self.seq_converter.empty_rows(0, 0);
        let mut emit = Emit::new(self.visible_only);
        self.finish(g, &empty, None, &mut emit)?;
        if emit.carried.is_empty() {
            return Ok(None);
        }
        let parts = emit
            .carried
            .iter()
            .map(|(b, kind)| self.project(b, *kind))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(concat_batches(&self.output_schema, &parts)?))
    }

    /// Decide the stored row of a completed key group, and the change of
    /// its visible row (the change data feed).
    fn finish(
        &mut self,
        g: Group,
        seqs: &Rows,
        batch: Option<&RecordBatch>,
        emit: &mut Emit,
    ) -> Result<()> {
        if let Some(conflict) = g.pending_conflict {
            return Err(conflict);
        }
        // no stored row followed: the copies were duplicates
        self.counts.duplicates += g.copies_before_stored;
        let winner_seq = slot_seq(&g.winner, seqs);
        // a stored row goes only by a TRUNCATE of this update; a new event
        // by any (see `FoldKernel::observe_stored_watermark`)
        let watermark = match g.winner_origin {
            Origin::New => self.watermarks.all(),
            _ => self.watermarks.this_update(),
        };
        let truncated = watermark.is_some_and(|w| winner_seq <= w.row());
        if truncated {
            // every new event is at or below the watermark: the stored row
            // stays unless a TRUNCATE of this update reaches it
            if let Some(stored) = g.stored {
                let kept = g.winner_origin == Origin::New
                    && self
                        .watermarks
                        .this_update()
                        .is_none_or(|t| slot_seq(&stored, seqs) > t.row());
                if kept {
                    emit.push(stored, None);
                    return Ok(());
                }
                self.counts.deleted += 1;
                emit.push(stored, Some(CHANGE_DELETE));
            }
            return Ok(());
        }
        if g.winner_origin == Origin::New {
            let code = slot_kind(&g.winner, batch, self.layout.kind());
            if code == Kind::Delete as i8 {
                self.counts.tombstones += 1;
                if let Some(stored) = &g.stored {
                    self.counts.deleted += 1;
                    emit.push(stored.clone(), Some(CHANGE_DELETE));
                }
            } else {
                // (counted as the change feed shows it: an upsert that
                // changes no value of the live row updates nothing)
                match &g.stored {
                    None => {
                        self.counts.upserted += 1;
                        emit.push(g.winner.clone(), Some(CHANGE_INSERT));
                    }
                    Some(stored) => {
                        if !self.same_values(batch, stored, &g.winner)? {
                            self.counts.upserted += 1;
                            emit.push(stored.clone(), Some(CHANGE_PREIMAGE));
                            emit.push(g.winner.clone(), Some(CHANGE_POSTIMAGE));
                        }
                    }
                }
            }
        }
        let tombstone = slot_kind(&g.winner, batch, self.layout.kind()) != Kind::Upsert as i8;
        emit.state(g.winner, tombstone);
        Ok(())
    }

    /// Whether two rows hold the same value in every target column.
    fn same_values(&self, batch: Option<&RecordBatch>, a: &Slot, b: &Slot) -> Result<bool> {
        let side = |slot: &Slot| -> Result<(RecordBatch, usize)> {
            match (slot, batch) {
                (Slot::Here(i), Some(batch)) => Ok((batch.clone(), *i)),
                (Slot::Carried { row, .. }, _) => Ok((row.clone(), 0)),
                (Slot::Here(_), None) => {
                    Err(DataFusionError::Internal("row of a finished batch".into()))
                }
            }
        };
        let ((left, l), (right, r)) = (side(a)?, side(b)?);
        for c in 0..self.layout.num_target() {
            let cmp = make_comparator(
                left.column(c).as_ref(),
                right.column(c).as_ref(),
                SortOptions::default(),
            )?;
            if cmp(l, r) != Ordering::Equal {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn build_output(&self, batch: &RecordBatch, emit: Emit) -> Result<RecordBatch> {
        let mut parts = Vec::with_capacity(emit.carried.len() + 1);
        for (b, kind) in &emit.carried {
            parts.push(self.project(b, *kind)?);
        }
        if !emit.here.is_empty() {
            let (rows, overrides): (Vec<u32>, Vec<Option<i8>>) = emit.here.into_iter().unzip();
            let taken = take_record_batch(batch, &UInt32Array::from(rows))?;
            let kinds = taken.column(self.layout.kind()).as_primitive::<Int8Type>();
            let kinds: Int8Array = overrides
                .iter()
                .zip(kinds.values().iter())
                .map(|(o, k)| o.unwrap_or(*k))
                .collect();
            let mut columns = taken.columns()[..self.layout.origin()].to_vec();
            columns[self.layout.kind()] = Arc::new(kinds);
            parts.push(RecordBatch::try_new(
                Arc::clone(&self.output_schema),
                columns,
            )?);
        }
        Ok(concat_batches(&self.output_schema, &parts)?)
    }

    fn project(&self, batch: &RecordBatch, kind: Option<i8>) -> Result<RecordBatch> {
        let mut columns = batch.columns()[..self.layout.origin()].to_vec();
        if let Some(kind) = kind {
            columns[self.layout.kind()] = Arc::new(Int8Array::from(vec![kind; batch.num_rows()]));
        }
        Ok(RecordBatch::try_new(
            Arc::clone(&self.output_schema),
            columns,
        )?)
    }

    fn check_nulls(&self, batch: &RecordBatch) -> Result<()> {
        check_event_nulls(&self.flow, &self.layout, batch)
    }

    /// Same kind and same value in every target column.
    fn same_event(&self, batch: &RecordBatch, prev: &Slot, i: usize) -> Result<bool> {
        let (left, l) = match prev {
            Slot::Here(j) => (batch, *j),
            Slot::Carried { row, .. } => (row, 0),
        };
        for c in 0..self.layout.origin() {
            if c == self.layout.seq() {
                continue;
            }
            let cmp = make_comparator(
                left.column(c).as_ref(),
                batch.column(c).as_ref(),
                SortOptions::default(),
            )?;
            if cmp(l, i) != Ordering::Equal {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn conflict_error(&self, batch: &RecordBatch, i: usize) -> DataFusionError {
        conflict_error(&self.flow, &self.layout, batch, i, false)
    }
}

impl FoldKernel for Scd1Fold {
    fn observe_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        Scd1Fold::observe_watermark(self, sequences)
    }
    fn observe_stored_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        Scd1Fold::observe_stored_watermark(self, sequences)
    }
    fn watermark_value(&self) -> Option<&ArrayRef> {
        Scd1Fold::watermark_value(self)
    }
    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        Scd1Fold::push(self, batch)
    }
    fn finish_all(&mut self) -> Result<Option<RecordBatch>> {
        Scd1Fold::finish_all(self)
    }
    fn counts(&self) -> FoldCounts {
        Scd1Fold::counts(self)
    }
    fn output_schema(&self) -> &SchemaRef {
        Scd1Fold::output_schema(self)
    }
}

/// Rows chosen while folding one batch, each with its output kind when it
/// differs from its input kind (change data feed rows).
#[derive(Default)]
struct Emit {
    /// Change rows are left out (their kind is set), and so are the rows
    /// `Scd1Fold::finish` marks as tombstones.
    visible_only: bool,
    here: Vec<(u32, Option<i8>)>,
    carried: Vec<(RecordBatch, Option<i8>)>,
}

impl Emit {
    fn new(visible_only: bool) -> Self {
        Self {
            visible_only,
            ..Self::default()
        }
    }

    /// The state row `slot`, unless only live rows are emitted and it is a
    /// tombstone.
    fn state(&mut self, slot: Slot, tombstone: bool) {
        if !(self.visible_only && tombstone) {
            self.push(slot, None);
        }
    }

    fn push(&mut self, slot: Slot, kind: Option<i8>) {
        if self.visible_only && kind.is_some() {
            return;
        }
        match slot {
            Slot::Here(i) => self.here.push((i as u32, kind)),
            Slot::Carried { row, .. } => self.carried.push((row, kind)),
        }
    }
}

fn slot_kind(slot: &Slot, batch: Option<&RecordBatch>, kind_column: usize) -> i8 {
    match (slot, batch) {
        (Slot::Here(i), Some(batch)) => batch
            .column(kind_column)
            .as_primitive::<Int8Type>()
            .value(*i),
        (Slot::Carried { row, .. }, _) => {
            row.column(kind_column).as_primitive::<Int8Type>().value(0)
        }
        (Slot::Here(_), None) => Kind::Upsert as i8,
    }
}

fn slot_seq<'a>(slot: &'a Slot, seqs: &'a Rows) -> Row<'a> {
    match slot {
        Slot::Here(i) => seqs.row(*i),
        Slot::Carried { seq, .. } => seq.row(),
    }
}

fn carry(batch: &RecordBatch, seqs: &Rows, slot: &Slot) -> Slot {
    match slot {
        Slot::Here(i) => Slot::Carried {
            row: batch.slice(*i, 1),
            seq: seqs.row(*i).owned(),
        },
        carried => carried.clone(),
    }
}

#[cfg(test)]
mod tests;
