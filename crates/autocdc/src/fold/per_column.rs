//! SCD 1 with per-column sequencing (`autocdc.sequencePerColumn`, SPEC §2.6).
//!
//! Every non-key column belongs to one [`SequenceGroup`] (a named group of
//! `autocdc.sequenceGroups`, or the column on its own), and the stored row
//! keeps each group's sequence beside the row's own (`__cdc_seq_<group>`,
//! state store only). An update applies the stored row first, then its new
//! events in sequence order, with these rules (`s` the event's sequence, `R`
//! the row's, `gs` a group's; NULL `gs`: never written):
//!
//! | event          | state      | effect                                                        |
//! |----------------|------------|---------------------------------------------------------------|
//! | UPSERT at s    | live       | each group it writes with `gs < s` takes its values, `gs = s`; `R = max(R, s)` |
//! | UPSERT at s    | tombstone  | `s ≤ R`: late, dropped; else live from nothing: the groups it writes, `R = s` |
//! | UPSERT at s    | no row     | live from nothing (as above)                                  |
//! | DELETE at s    | live       | groups with `gs < s` become NULL at `gs = s`; `R < s`: tombstone at `s` |
//! | DELETE at s    | tombstone  | tombstone at `max(R, s)`                                      |
//! | TRUNCATE at t  | any        | (this update's) groups with `gs ≤ t` NULL at `gs = t`; `R ≤ t`: the row goes, no tombstone |
//! | any, `s ≤ T`   | —          | dropped (`T` the truncate watermark)                          |
//!
//! A group's value is always that of the newest event that wrote it since
//! the key's last DELETE or TRUNCATE, and the row is live when its newest
//! UPSERT is newer than both: the same as folding every event ever seen in
//! sequence order, so the result does not depend on the order events arrive
//! in nor on how they are split into updates. A DELETE and an UPSERT at
//! one sequence conflict (SPEC §2.2): in one update that is an error;
//! across updates what was applied first stays, as in SCD 1 — a row DML
//! inserts takes its key's tombstone's sequence, so a replay of that DELETE
//! leaves it. The first UPSERT to write a group keeps it.
//!
//! ```text
//!  stored  k1  a=1@3  b=2@5   R=5          new  k1 @4 b=9   (late for b)
//!                                               k1 @4 a=7   (a@3 < 4: set)
//!  output  k1  a=7@4  b=2@5   R=5          + update_preimage / _postimage
//! ```
//!
//! Like [`super::partial::MergingScd1Fold`] it takes whole key groups
//! ([`GroupCarry`]); its output rows are the stored row of every key it saw
//! (unchanged, or rebuilt from the rows its groups came from with one `take`
//! or `interleave` per column) and the change data feed rows.

use std::sync::Arc;

use arrow::array::{
    make_comparator, new_null_array, Array, ArrayRef, AsArray, DynComparator, Int8Array,
    RecordBatch, UInt32Array,
};
use arrow::compute::{interleave, take, SortOptions};
use arrow::datatypes::{Int8Type, Schema, SchemaRef};
use arrow::row::{OwnedRow, Row, RowConverter, Rows};
use datafusion::common::{DataFusionError, Result};

use super::columns::{
    all_nullable, EventLayout, Kind, Origin, SequenceGroup, CHANGE_DELETE, CHANGE_INSERT,
    CHANGE_POSTIMAGE, CHANGE_PREIMAGE,
};
use super::errors::{check_event_nulls, conflict_error};
use super::kernel::{FoldKernel, GroupCarry, TruncateWatermarks};
use super::partial::{Merger, PartialUpdates};
use super::rows::{row_converter, to_rows};
use super::FoldCounts;

/// Stored rows of the fold: the event columns up to `__cdc_written_at`,
/// then each group's sequence.
pub fn output_schema(layout: &EventLayout, input: &Schema) -> Result<SchemaRef> {
    let mut columns: Vec<usize> = (0..layout.origin()).collect();
    columns.extend((0..layout.sequence_groups.len()).filter_map(|g| layout.group_seq(g)));
    Ok(all_nullable(&input.project(&columns)?))
}

/// Where a sequence of the folded row comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Seq {
    /// Never written.
    #[default]
    Null,
    /// The sequence of the event at this row.
    Event(usize),
    /// The group's own stored sequence, in the stored row at this row.
    Stored(usize),
    /// The greatest TRUNCATE of this update.
    Truncated,
}

/// Interleave source of each [`Seq`]: `[sequences, NULL, truncated, stored]`.
fn source(seq: Seq) -> (usize, usize) {
    match seq {
        Seq::Event(i) => (0, i),
        Seq::Null => (1, 0),
        Seq::Truncated => (2, 0),
        Seq::Stored(i) => (3, i),
    }
}

/// The folded state of the key being folded (buffers reused across keys).
#[derive(Debug, Default)]
struct KeyState {
    live: bool,
    /// The row's sequence (`Null`: no row).
    row_seq: Seq,
    /// Per group: the row whose values it holds (`None`: NULL).
    values: Vec<Option<usize>>,
    /// Per group: its sequence.
    seqs: Vec<Seq>,
    /// The state differs from the stored row.
    dirty: bool,
    /// The last new event that changed it.
    written_by: Option<usize>,
}

/// Output rows being gathered, column by column.
#[derive(Debug, Default)]
struct Out {
    values: Vec<Vec<Option<u32>>>,
    seq: Vec<(usize, usize)>,
    kinds: Vec<i8>,
    written_at: Vec<u32>,
    group_seqs: Vec<Vec<(usize, usize)>>,
}

/// SCD 1 fold with per-column sequencing (see the module docs).
#[derive(Debug)]
pub struct PerColumnScd1Fold {
    merger: Merger,
    /// Group of each target column (`usize::MAX`: a key column).
    group_of: Vec<usize>,
    output_schema: SchemaRef,
    key_converter: RowConverter,
    seq_converter: RowConverter,
    carry: GroupCarry,
    watermarks: TruncateWatermarks,
    counts: FoldCounts,
    state: KeyState,
}

impl PerColumnScd1Fold {
    /// A fold of events of `input_schema` (laid out as `layout`, with its
    /// group sequences) under the partial-update option `mode`.
    pub fn try_new(
        flow: &str,
        layout: EventLayout,
        mode: Option<PartialUpdates>,
        input_schema: &SchemaRef,
    ) -> Result<Self> {
        if !layout.group_sequences || layout.sequence_groups.is_empty() {
            return Err(DataFusionError::Internal(format!(
                "flow '{flow}': a per-column fold without group sequences"
            )));
        }
        let mut group_of = vec![usize::MAX; layout.num_target()];
        for (g, group) in layout.sequence_groups.iter().enumerate() {
            for &c in &group.members {
                group_of[c] = g;
            }
        }
        let merger = match mode {
            Some(mode) => Merger::new(flow, layout.clone(), mode),
            None => Merger::whole_rows(flow, layout.clone()),
        };
        Ok(Self {
            output_schema: output_schema(&layout, input_schema)?,
            key_converter: row_converter(input_schema, &layout.key_indices)?,
            seq_converter: row_converter(input_schema, &[layout.seq()])?,
            carry: GroupCarry::try_new(input_schema, &layout.key_indices)?,
            group_of,
            merger,
            watermarks: TruncateWatermarks::default(),
            counts: FoldCounts::default(),
            state: KeyState::default(),
        })
    }

    fn layout(&self) -> &EventLayout {
        self.merger.layout()
    }

    fn groups(&self) -> &[SequenceGroup] {
        &self.merger.layout().sequence_groups
    }

    fn raise_watermark(&mut self, sequences: &ArrayRef, truncating: bool) -> Result<()> {
        let flow = self.merger.flow().to_string();
        self.watermarks
            .raise(&flow, &self.seq_converter, sequences, truncating)
    }

    fn flow(&self) -> &str {
        self.merger.flow()
    }

    /// Fold the whole key groups in rows `[0, end)` of `batch`.
    fn fold(&mut self, batch: &RecordBatch, end: usize) -> Result<Option<RecordBatch>> {
        if end == 0 {
            return Ok(None);
        }
        let layout = self.layout().clone();
        let keys = to_rows(&self.key_converter, batch, &layout.key_indices)?;
        let seqs = to_rows(&self.seq_converter, batch, &[layout.seq()])?;
        let groups = self.groups().len();
        let group_seq_columns = (0..groups)
            .map(|g| {
                layout
                    .group_seq(g)
                    .ok_or_else(|| DataFusionError::Internal("no group sequence column".into()))
            })
            .collect::<Result<Vec<_>>>()?;
        let group_seqs = group_seq_columns
            .iter()
            .map(|&c| to_rows(&self.seq_converter, batch, &[c]))
            .collect::<Result<Vec<_>>>()?;
        let writes = self.merger.writes(batch, end)?;
        // (owned copies: the fold below counts into `self`)
        let truncated = self.watermarks.this_update().cloned();
        let watermark = self.watermarks.all().cloned();
        let ctx = Batch {
            batch,
            seqs: &seqs,
            group_seqs: &group_seqs,
            group_seq_columns: &group_seq_columns,
            kinds: batch.column(layout.kind()).as_primitive::<Int8Type>(),
            origins: batch.column(layout.origin()).as_primitive::<Int8Type>(),
            writes: &writes,
            truncated: truncated.as_ref().map(OwnedRow::row),
            watermark: watermark.as_ref().map(OwnedRow::row),
        };
        let mut out = Out {
            values: vec![Vec::new(); layout.num_target()],
            group_seqs: vec![Vec::new(); groups],
            ..Out::default()
        };
        let mut comparators: Option<Vec<Option<DynComparator>>> = None;
        let mut state = std::mem::take(&mut self.state);
        let mut start = 0;
        while start < end {
            let mut stop = start + 1;
            while stop < end && keys.row(stop) == keys.row(start) {
                stop += 1;
            }
            let result = self.fold_key(&ctx, start..stop, &mut state, &mut out, &mut comparators);
            if let Err(e) = result {
                self.state = state;
                return Err(e);
            }
            start = stop;
        }
        self.state = state;
        self.build(batch, &layout, &group_seq_columns, out)
            .map(Some)
    }

    /// Fold the rows `range` of one key into `out`.
    fn fold_key(
        &mut self,
        b: &Batch<'_>,
        range: std::ops::Range<usize>,
        state: &mut KeyState,
        out: &mut Out,
        comparators: &mut Option<Vec<Option<DynComparator>>>,
    ) -> Result<()> {
        let groups = self.groups().len();
        let n = self.layout().num_target();
        state.live = false;
        state.row_seq = Seq::Null;
        state.values.clear();
        state.values.resize(groups, None);
        state.seqs.clear();
        state.seqs.resize(groups, Seq::Null);
        state.dirty = false;
        state.written_by = None;

        // the stored row is the base
        let stored = range
            .clone()
            .find(|&i| b.origins.value(i) == Origin::Stored as i8);
        let mut visible = None;
        if let Some(st) = stored {
            state.row_seq = Seq::Event(st);
            if b.kinds.value(st) == Kind::Upsert as i8 {
                state.live = true;
                visible = Some(st);
                for g in 0..groups {
                    state.values[g] = Some(st);
                    state.seqs[g] = if b.batch.column(b.group_seq_columns[g]).is_valid(st) {
                        Seq::Stored(st)
                    } else {
                        Seq::Null
                    };
                }
            } else {
                state.seqs.fill(Seq::Event(st));
            }
            // this update's TRUNCATEs
            if let Some(t) = b.truncated {
                if b.seqs.row(st) <= t {
                    state.live = false;
                    state.row_seq = Seq::Null;
                    state.values.fill(None);
                    state.seqs.fill(Seq::Null);
                    state.dirty = true;
                } else {
                    for g in 0..groups {
                        if b.seq(state.seqs[g], g).is_some_and(|s| s <= t) {
                            state.values[g] = None;
                            state.seqs[g] = Seq::Truncated;
                            state.dirty = true;
                        }
                    }
                }
            }
        }

        let mut previous: Option<usize> = None;
        for i in range.clone() {
            if b.origins.value(i) == Origin::Stored as i8 {
                continue;
            }
            self.counts.input_rows += 1;
            let s = b.seqs.row(i);
            if let Some(p) = previous.filter(|&p| b.seqs.row(p) == s) {
                if !self.merger.same_event(b.batch, p, i)? {
                    return Err(conflict_error(
                        self.flow(),
                        self.layout(),
                        b.batch,
                        i,
                        false,
                    ));
                }
                self.counts.duplicates += 1;
                continue;
            }
            previous = Some(i);
            if b.watermark.is_some_and(|w| s <= w) {
                continue;
            }
            let row_seq = b.seq(state.row_seq, 0);
            let changed = if b.kinds.value(i) == Kind::Upsert as i8 {
                if !state.live && row_seq.is_some_and(|r| s <= r) {
                    false
                } else {
                    let mut changed = !state.live || row_seq.is_some_and(|r| r < s);
                    let row = &b.writes[i * n..(i + 1) * n];
                    for (g, group) in self.groups().iter().enumerate() {
                        let newer = b.seq(state.seqs[g], g).is_none_or(|gs| gs < s);
                        if newer && group.members.iter().any(|&c| row[c]) {
                            state.values[g] = Some(i);
                            state.seqs[g] = Seq::Event(i);
                            changed = true;
                        }
                    }
                    if changed && (!state.live || row_seq.is_some_and(|r| r < s)) {
                        state.row_seq = Seq::Event(i);
                    }
                    state.live = true;
                    changed
                }
            } else if state.live {
                // (what was written at s came first: it stays)
                let mut changed = false;
                for g in 0..groups {
                    if b.seq(state.seqs[g], g).is_none_or(|gs| gs < s) {
                        changed |= state.values[g].is_some() || b.seq(state.seqs[g], g) != Some(s);
                        state.values[g] = None;
                        state.seqs[g] = Seq::Event(i);
                    }
                }
                if row_seq.is_none_or(|r| r < s) {
                    state.live = false;
                    state.row_seq = Seq::Event(i);
                    changed = true;
                }
                changed
            } else if row_seq.is_none_or(|r| r < s) {
                state.row_seq = Seq::Event(i);
                state.values.fill(None);
                state.seqs.fill(Seq::Event(i));
                true
            } else {
                false
            };
            if changed {
                state.dirty = true;
                state.written_by = Some(i);
            } else {
                self.counts.late += 1;
            }
        }

        if !state.dirty {
            if let Some(st) = stored {
                out.stored(b, st, None);
            }
            return Ok(());
        }
        let key_row = range.start;
        // (a row changed by this update's TRUNCATE alone keeps its time)
        let written = state.written_by.or(stored).unwrap_or(key_row);
        let merged = |out: &mut Out, kind: i8, tombstone: Option<usize>| {
            out.merged(key_row, written, state, &self.group_of, kind, tombstone)
        };
        match (state.live, state.row_seq) {
            // (counted as the change feed shows it: a row inserted, or one
            // whose values change)
            (true, _) => {
                merged(out, Kind::Upsert as i8, None);
                match visible {
                    None => {
                        self.counts.upserted += 1;
                        merged(out, CHANGE_INSERT, None);
                    }
                    Some(st) => {
                        let comparators = match comparators {
                            Some(c) => c,
                            None => {
                                comparators.insert(column_comparators(b.batch, &self.group_of)?)
                            }
                        };
                        if !same_values(comparators, st, state, &self.group_of, b.batch) {
                            self.counts.upserted += 1;
                            out.stored(b, st, Some(CHANGE_PREIMAGE));
                            merged(out, CHANGE_POSTIMAGE, None);
                        }
                    }
                }
            }
            (false, Seq::Event(d)) => {
                self.counts.tombstones += 1;
                merged(out, Kind::Delete as i8, Some(d));
                if let Some(st) = visible {
                    self.counts.deleted += 1;
                    out.stored(b, st, Some(CHANGE_DELETE));
                }
            }
            (false, _) => {
                if let Some(st) = visible {
                    self.counts.deleted += 1;
                    out.stored(b, st, Some(CHANGE_DELETE));
                }
            }
        }
        Ok(())
    }

    fn build(
        &self,
        batch: &RecordBatch,
        layout: &EventLayout,
        group_seq_columns: &[usize],
        out: Out,
    ) -> Result<RecordBatch> {
        let seq_column = batch.column(layout.seq());
        let null = new_null_array(seq_column.data_type(), 1);
        let truncated = self
            .watermarks
            .this_update_value()
            .map_or_else(|| Arc::clone(&null), Arc::clone);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.output_schema.fields().len());
        for (c, sources) in out.values.into_iter().enumerate() {
            columns.push(take(
                batch.column(c).as_ref(),
                &UInt32Array::from(sources),
                None,
            )?);
        }
        let seq_sources: [&dyn Array; 4] = [seq_column.as_ref(), &null, &truncated, &null];
        columns.push(interleave(&seq_sources, &out.seq)?);
        columns.push(Arc::new(Int8Array::from(out.kinds)));
        columns.push(take(
            batch.column(layout.written_at()).as_ref(),
            &UInt32Array::from(out.written_at),
            None,
        )?);
        for (g, sources) in out.group_seqs.iter().enumerate() {
            let stored = batch.column(group_seq_columns[g]);
            let arrays: [&dyn Array; 4] = [seq_column.as_ref(), &null, &truncated, stored.as_ref()];
            columns.push(interleave(&arrays, sources)?);
        }
        Ok(RecordBatch::try_new(
            Arc::clone(&self.output_schema),
            columns,
        )?)
    }
}

/// What [`PerColumnScd1Fold::fold_key`] reads of one batch.
struct Batch<'a> {
    batch: &'a RecordBatch,
    seqs: &'a Rows,
    group_seqs: &'a [Rows],
    group_seq_columns: &'a [usize],
    kinds: &'a arrow::array::PrimitiveArray<Int8Type>,
    origins: &'a arrow::array::PrimitiveArray<Int8Type>,
    writes: &'a [bool],
    truncated: Option<Row<'a>>,
    watermark: Option<Row<'a>>,
}

impl<'a> Batch<'a> {
    /// The value of `seq` (of group `g` when it is a stored group sequence).
    fn seq(&self, seq: Seq, g: usize) -> Option<Row<'a>> {
        match seq {
            Seq::Null => None,
            Seq::Event(i) => Some(self.seqs.row(i)),
            Seq::Stored(i) => Some(self.group_seqs[g].row(i)),
            Seq::Truncated => self.truncated,
        }
    }
}

impl Out {
    /// The stored row `st` as it is (with `kind` instead of its own).
    fn stored(&mut self, b: &Batch<'_>, st: usize, kind: Option<i8>) {
        for values in &mut self.values {
            values.push(Some(st as u32));
        }
        self.seq.push(source(Seq::Event(st)));
        self.kinds.push(kind.unwrap_or(b.kinds.value(st)));
        self.written_at.push(st as u32);
        for (g, seqs) in self.group_seqs.iter_mut().enumerate() {
            let valid = b.batch.column(b.group_seq_columns[g]).is_valid(st);
            seqs.push(source(if valid { Seq::Stored(st) } else { Seq::Null }));
        }
    }

    /// The folded row of the key at `key_row` with `kind`, written at the
    /// time of row `written`; a tombstone (`tombstone`: its DELETE) keeps
    /// only the key.
    fn merged(
        &mut self,
        key_row: usize,
        written: usize,
        state: &KeyState,
        group_of: &[usize],
        kind: i8,
        tombstone: Option<usize>,
    ) {
        for (c, values) in self.values.iter_mut().enumerate() {
            values.push(match group_of[c] {
                usize::MAX => Some(key_row as u32),
                _ if tombstone.is_some() => None,
                g => state.values[g].map(|i| i as u32),
            });
        }
        self.seq.push(source(state.row_seq));
        self.kinds.push(kind);
        self.written_at.push(tombstone.unwrap_or(written) as u32);
        for (g, seqs) in self.group_seqs.iter_mut().enumerate() {
            seqs.push(match tombstone {
                Some(_) => source(Seq::Null),
                None => source(state.seqs[g]),
            });
        }
    }
}

/// A comparator of each non-key target column with itself.
fn column_comparators(
    batch: &RecordBatch,
    group_of: &[usize],
) -> Result<Vec<Option<DynComparator>>> {
    group_of
        .iter()
        .enumerate()
        .map(|(c, &g)| {
            if g == usize::MAX {
                return Ok(None);
            }
            let column = batch.column(c);
            Ok(Some(make_comparator(
                column.as_ref(),
                column.as_ref(),
                SortOptions::default(),
            )?))
        })
        .collect()
}

/// Whether the folded row holds the stored row `st`'s value in every column.
fn same_values(
    comparators: &[Option<DynComparator>],
    st: usize,
    state: &KeyState,
    group_of: &[usize],
    batch: &RecordBatch,
) -> bool {
    comparators.iter().enumerate().all(|(c, cmp)| {
        let Some(cmp) = cmp else { return true };
        match state.values[group_of[c]] {
            Some(i) => cmp(st, i).is_eq(),
            None => batch.column(c).is_null(st),
        }
    })
}

impl FoldKernel for PerColumnScd1Fold {
    fn observe_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        self.raise_watermark(sequences, true)
    }

    fn observe_stored_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        self.raise_watermark(sequences, false)
    }

    fn watermark_value(&self) -> Option<&ArrayRef> {
        self.watermarks.value()
    }

    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        if batch.num_rows() == 0 {
            return Ok(None);
        }
        check_event_nulls(self.flow(), self.layout(), batch)?;
        let (input, whole) = self.carry.push(batch)?;
        self.fold(&input, whole)
    }

    fn expect_whole_groups(&mut self) {
        self.carry.whole_groups();
    }

    fn finish_all(&mut self) -> Result<Option<RecordBatch>> {
        match self.carry.finish() {
            Some(rest) => {
                let rows = rest.num_rows();
                self.fold(&rest, rows)
            }
            None => Ok(None),
        }
    }

    fn counts(&self) -> FoldCounts {
        self.counts
    }

    fn output_schema(&self) -> &SchemaRef {
        &self.output_schema
    }
}

#[cfg(test)]
mod tests;
