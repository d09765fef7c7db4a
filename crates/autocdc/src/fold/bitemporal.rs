//! BITEMPORAL fold: business time × system time.
//!
//! The belief `B(T)` at system time `T` is the SCD 2 history (business time =
//! SEQUENCE BY) of the events whose system time is ≤ `T`, where of several
//! events of one business sequence only the latest by system time counts (a
//! correction). The target holds every row of every belief (values + business
//! interval) with each maximal system-time interval over which it belongs to
//! the belief. Like SCD 2, the target keeps every event, hidden, and each
//! update re-folds every touched key over its stored events plus the new ones,
//! so the result depends only on the set of events.
//!
//! ```text
//!  events of one key, by (bt, st)      for each system time T in the data:
//!  ┌──────────────────────────┐        belief B(T) = SCD 2 fold of the latest
//!  │ v1  bt 10:01  st 10:05   │          event per bt with st ≤ T
//!  │ v3  bt 12:05  st 12:25   │──►     rows of B(T) not in B(T-)  open at T
//!  │ v2  bt 12:15  st 12:20   │        rows of B(T-) not in B(T)  close at T
//!  │ del bt 12:30  st 12:30   │        rows still open at the end: system end NULL
//!  └──────────────────────────┘
//! ```
//!
//! Output rows are `[target columns..., __start_at, __end_at,
//! __system_start_at, __system_end_at, __cdc_seq, __cdc_kind,
//! __cdc_written_at, __cdc_system_seq]`: rows (kind 0), hidden events (kinds
//! 3/4) and change data feed rows, built with `take` from the input batch.
//!
//! Cost per key is O(system times × events); keys are independent.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int8Array, RecordBatch, UInt32Array};
use arrow::compute::take;
use arrow::datatypes::{Field, Int8Type, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows};
use datafusion::common::{DataFusionError, Result, ScalarValue};

use super::columns::{
    EventLayout, Kind, Origin, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE,
    END_AT_COL, KIND_COL, SEQ_COL, START_AT_COL, STORED_DELETE_EVENT, STORED_ERASED_THROUGH,
    STORED_UPSERT_EVENT, SYSTEM_END_AT_COL, SYSTEM_SEQ_COL, SYSTEM_START_AT_COL,
};
use super::errors::{check_event_nulls, format_key};
use super::kernel::{FoldKernel, GroupCarry};
use super::rows::{row_converter, to_rows};
use super::scd2::{fold_versions, Version};
use super::FoldCounts;

/// Output schema of the BITEMPORAL fold for an event input schema.
pub fn output_schema(layout: &EventLayout, input: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = (0..layout.num_target())
        .map(|i| input.field(i).clone().with_nullable(true))
        .collect();
    let seq_type = input.field(layout.seq()).data_type().clone();
    let system_type = layout
        .system_seq()
        .map(|i| input.field(i).data_type().clone())
        .unwrap_or_else(|| seq_type.clone());
    fields.push(Field::new(START_AT_COL, seq_type.clone(), true));
    fields.push(Field::new(END_AT_COL, seq_type.clone(), true));
    fields.push(Field::new(SYSTEM_START_AT_COL, system_type.clone(), true));
    fields.push(Field::new(SYSTEM_END_AT_COL, system_type.clone(), true));
    fields.push(Field::new(SEQ_COL, seq_type, true));
    fields.push(Field::new(KIND_COL, arrow::datatypes::DataType::Int8, true));
    fields.push(input.field(layout.written_at()).clone().with_nullable(true));
    fields.push(Field::new(SYSTEM_SEQ_COL, system_type, true));
    Arc::new(Schema::new(fields))
}

/// A row of the target: values of `last`, business interval
/// `[seq(open), seq(close))`, system interval `[sys(from), sys(to))`.
#[derive(Debug, Clone, Copy)]
struct BiRow {
    last: usize,
    open: usize,
    close: Option<usize>,
    from: usize,
    to: Option<usize>,
}

/// Row encodings of one batch.
#[derive(Clone, Copy)]
struct Encoded<'a> {
    seqs: &'a Rows,
    systems: &'a Rows,
    targets: &'a Rows,
    kinds: &'a Int8Array,
}

impl Encoded<'_> {
    fn same_end(&self, a: Option<usize>, b: Option<usize>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => self.seqs.row(a) == self.seqs.row(b),
            _ => false,
        }
    }

    /// Same values and business interval.
    fn same_version(&self, a: &Version, b: &Version) -> bool {
        self.seqs.row(a.open) == self.seqs.row(b.open)
            && self.targets.row(a.last) == self.targets.row(b.last)
            && self.same_end(a.close, b.close)
    }

    fn same_system_end(&self, a: Option<usize>, b: Option<usize>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => self.systems.row(a) == self.systems.row(b),
            _ => false,
        }
    }
}

/// Buffers reused by every key group.
#[derive(Debug, Default)]
struct Scratch {
    kept: Vec<usize>,
    subset: Vec<usize>,
    times: Vec<usize>,
    belief: Vec<usize>,
    versions: Vec<Version>,
    open: Vec<(Version, usize)>,
    next_open: Vec<(Version, usize)>,
    after: Vec<BiRow>,
    before: Vec<BiRow>,
}

/// The bitemporal rows of `events` (distinct, sorted by `(seq, system seq)`).
fn fold_rows(events: &[usize], enc: &Encoded<'_>, s: &mut Scratch, out: &mut Vec<BiRow>) {
    out.clear();
    // the system times that occur, ascending
    s.times.clear();
    s.times.extend_from_slice(events);
    s.times
        .sort_by(|&a, &b| enc.systems.row(a).cmp(&enc.systems.row(b)));
    s.times
        .dedup_by(|a, b| enc.systems.row(*a) == enc.systems.row(*b));
    s.open.clear();
    for &t in &s.times {
        let now = enc.systems.row(t);
        // belief at t: per business sequence, the latest event known at t
        s.belief.clear();
        let mut i = 0;
        while i < events.len() {
            let mut j = i;
            let mut pick = None;
            while j < events.len() && enc.seqs.row(events[j]) == enc.seqs.row(events[i]) {
                if enc.systems.row(events[j]) <= now {
                    pick = Some(events[j]);
                }
                j += 1;
            }
            s.belief.extend(pick);
            i = j;
        }
        // every target column is tracked: rows compare on all of them
        fold_versions(&s.belief, enc.kinds, enc.targets, &mut s.versions);
        // rows leaving the belief close at t, new ones open at t
        s.next_open.clear();
        let (mut o, mut n) = (0, 0);
        while o < s.open.len() || n < s.versions.len() {
            let order = match (s.open.get(o), s.versions.get(n)) {
                (Some((old, _)), Some(new)) => enc.seqs.row(old.open).cmp(&enc.seqs.row(new.open)),
                (Some(_), None) => Ordering::Less,
                _ => Ordering::Greater,
            };
            match order {
                Ordering::Less => {
                    let (old, from) = s.open[o];
                    out.push(close(old, from, Some(t)));
                    o += 1;
                }
                Ordering::Greater => {
                    s.next_open.push((s.versions[n], t));
                    n += 1;
                }
                Ordering::Equal => {
                    let (old, from) = s.open[o];
                    let new = s.versions[n];
                    if enc.same_version(&old, &new) {
                        s.next_open.push((old, from));
                    } else {
                        out.push(close(old, from, Some(t)));
                        s.next_open.push((new, t));
                    }
                    o += 1;
                    n += 1;
                }
            }
        }
        std::mem::swap(&mut s.open, &mut s.next_open);
    }
    out.extend(s.open.iter().map(|&(v, from)| close(v, from, None)));
}

fn close(v: Version, from: usize, to: Option<usize>) -> BiRow {
    BiRow {
        last: v.last,
        open: v.open,
        close: v.close,
        from,
        to,
    }
}

/// Rows to emit for one batch.
#[derive(Default)]
struct Emit {
    rows: Vec<u32>,
    start: Vec<Option<u32>>,
    end: Vec<Option<u32>>,
    system_start: Vec<Option<u32>>,
    system_end: Vec<Option<u32>>,
    kind: Vec<i8>,
    /// Row whose `__cdc_written_at` the output row takes.
    written: Vec<u32>,
}

impl Emit {
    fn event(&mut self, row: usize, kind: i8) {
        let code = if kind == Kind::Delete as i8 {
            STORED_DELETE_EVENT
        } else {
            STORED_UPSERT_EVENT
        };
        self.mark(row, code, row);
    }

    /// A hidden row with the stored code `code`, written at `written`'s time.
    fn mark(&mut self, row: usize, code: i8, written: usize) {
        self.rows.push(row as u32);
        self.start.push(None);
        self.end.push(None);
        self.system_start.push(None);
        self.system_end.push(None);
        self.kind.push(code);
        self.written.push(written as u32);
    }

    fn row(&mut self, r: &BiRow, kind: i8) {
        self.rows.push(r.last as u32);
        self.start.push(Some(r.open as u32));
        self.end.push(r.close.map(|c| c as u32));
        self.system_start.push(Some(r.from as u32));
        self.system_end.push(r.to.map(|c| c as u32));
        self.kind.push(kind);
        self.written.push(r.last as u32);
    }
}

/// Streaming BITEMPORAL fold over batches sorted by `(keys, seq, origin)`.
#[derive(Debug)]
pub struct BitemporalFold {
    flow: String,
    layout: EventLayout,
    system_index: usize,
    output_schema: SchemaRef,
    key_converter: RowConverter,
    seq_converter: RowConverter,
    system_converter: RowConverter,
    /// All target columns plus the kind: event identity.
    value_converter: RowConverter,
    value_columns: Vec<usize>,
    target_converter: RowConverter,
    carry: GroupCarry,
    counts: FoldCounts,
    scratch: Scratch,
}

impl BitemporalFold {
    /// Create a fold for events of `input_schema` (with a system sequence).
    pub fn try_new(flow: &str, layout: EventLayout, input_schema: &SchemaRef) -> Result<Self> {
        let system_index = layout.system_seq().ok_or_else(|| {
            DataFusionError::Internal("BITEMPORAL fold without a system sequence".into())
        })?;
        let value_columns: Vec<usize> = (0..layout.num_target()).chain([layout.kind()]).collect();
        let converter = |columns: &[usize]| row_converter(input_schema, columns);
        let target_columns: Vec<usize> = (0..layout.num_target()).collect();
        Ok(Self {
            flow: flow.to_string(),
            key_converter: converter(&layout.key_indices)?,
            seq_converter: converter(&[layout.seq()])?,
            system_converter: converter(&[system_index])?,
            value_converter: converter(&value_columns)?,
            target_converter: converter(&target_columns)?,
            value_columns,
            output_schema: output_schema(&layout, input_schema),
            carry: GroupCarry::try_new(input_schema, &layout.key_indices)?,
            system_index,
            layout,
            counts: FoldCounts::default(),
            scratch: Scratch::default(),
        })
    }

    fn check_nulls(&self, batch: &RecordBatch) -> Result<()> {
        check_event_nulls(&self.flow, &self.layout, batch)?;
        let system = batch.column(self.system_index);
        if let Some(row) = super::errors::first_null_value(system.as_ref()) {
            return Err(DataFusionError::Execution(format!(
                "flow '{}': SYSTEM SEQUENCE BY value is NULL for key ({}); nothing was committed",
                self.flow,
                format_key(
                    &self.layout.target_columns,
                    &self.layout.key_indices,
                    batch,
                    row
                )
            )));
        }
        Ok(())
    }

    fn conflict(&self, batch: &RecordBatch, row: usize, stored: bool) -> DataFusionError {
        let value = |c: usize| {
            ScalarValue::try_from_array(batch.column(c), row)
                .map(|s| s.to_string())
                .unwrap_or_default()
        };
        DataFusionError::Execution(format!(
            "flow '{}': conflicting events for key ({}) at SEQUENCE BY value {} and SYSTEM SEQUENCE BY value {}{}: \
             two events with the same key and both sequences differ in kind or content; nothing was committed",
            self.flow,
            format_key(&self.layout.target_columns, &self.layout.key_indices, batch, row),
            value(self.layout.seq()),
            value(self.system_index),
            if stored { " (against a stored event)" } else { "" },
        ))
    }

    /// Fold the complete key groups in rows `[0, end)` of `batch`.
    fn fold(&mut self, batch: &RecordBatch, end: usize) -> Result<Option<RecordBatch>> {
        if end == 0 {
            return Ok(None);
        }
        let keys = to_rows(&self.key_converter, batch, &self.layout.key_indices)?;
        let seqs = to_rows(&self.seq_converter, batch, &[self.layout.seq()])?;
        let systems = to_rows(&self.system_converter, batch, &[self.system_index])?;
        let values = to_rows(&self.value_converter, batch, &self.value_columns)?;
        let targets = to_rows(
            &self.target_converter,
            batch,
            &(0..self.layout.num_target()).collect::<Vec<_>>(),
        )?;
        let kinds = batch.column(self.layout.kind()).as_primitive::<Int8Type>();
        let origins = batch
            .column(self.layout.origin())
            .as_primitive::<Int8Type>();
        let enc = Encoded {
            seqs: &seqs,
            systems: &systems,
            targets: &targets,
            kinds,
        };
        let mut s = std::mem::take(&mut self.scratch);
        let mut emit = Emit::default();
        let mut start = 0;
        while start < end {
            let mut stop = start + 1;
            while stop < end && keys.row(stop) == keys.row(start) {
                stop += 1;
            }
            // a DML DELETE erases the key: its rows are deleted and every
            // new event at or before its greatest sequence will be dropped
            if let Some(statement) = (start..stop).find(|&i| origins.value(i) == Origin::Dml as i8)
            {
                self.erase(start..stop, statement, &enc, origins, &mut s, &mut emit);
                start = stop;
                continue;
            }
            let through = (start..stop).find(|&i| kinds.value(i) == STORED_ERASED_THROUGH);
            // 1. distinct events by (seq, system seq); equal pairs must be equal events
            s.kept.clear();
            for i in start..stop {
                if kinds.value(i) == STORED_ERASED_THROUGH {
                    emit.mark(i, STORED_ERASED_THROUGH, i);
                    continue;
                }
                if origins.value(i) == Origin::New as i8
                    && through.is_some_and(|t| seqs.row(i) <= seqs.row(t))
                {
                    self.counts.input_rows += 1;
                    self.counts.late += 1;
                    continue;
                }
                s.kept.push(i);
            }
            s.kept.sort_by(|&a, &b| {
                seqs.row(a)
                    .cmp(&seqs.row(b))
                    .then_with(|| systems.row(a).cmp(&systems.row(b)))
                    .then_with(|| origins.value(a).cmp(&origins.value(b)))
            });
            let mut w = 0;
            for r in 0..s.kept.len() {
                let i = s.kept[r];
                let new = origins.value(i) == Origin::New as i8;
                if new {
                    self.counts.input_rows += 1;
                }
                if w > 0 {
                    let p = s.kept[w - 1];
                    if seqs.row(p) == seqs.row(i) && systems.row(p) == systems.row(i) {
                        if values.row(p) != values.row(i) {
                            let stored = origins.value(p) == Origin::Stored as i8;
                            self.scratch = s;
                            return Err(self.conflict(batch, i, stored));
                        }
                        if new {
                            self.counts.duplicates += 1;
                        }
                        continue;
                    }
                }
                s.kept[w] = i;
                w += 1;
                emit.event(i, kinds.value(i));
                if new {
                    self.counts.events_added += 1;
                }
            }
            s.kept.truncate(w);
            // 2. the rows of all events
            let kept = std::mem::take(&mut s.kept);
            let mut after = std::mem::take(&mut s.after);
            fold_rows(&kept, &enc, &mut s, &mut after);
            for r in &after {
                emit.row(r, Kind::Upsert as i8);
            }
            // 3. the change data feed: rows of the stored events alone vs all
            if kept.iter().any(|&i| origins.value(i) == Origin::New as i8) {
                let mut subset = std::mem::take(&mut s.subset);
                subset.clear();
                subset.extend(
                    kept.iter()
                        .copied()
                        .filter(|&i| origins.value(i) == Origin::Stored as i8),
                );
                let mut before = std::mem::take(&mut s.before);
                fold_rows(&subset, &enc, &mut s, &mut before);
                let (upserted, deleted) = changes(&before, &after, &enc, &mut emit);
                self.counts.upserted += upserted;
                self.counts.deleted += deleted;
                s.before = before;
                s.subset = subset;
            }
            s.after = after;
            s.kept = kept;
            start = stop;
        }
        self.scratch = s;
        self.build(batch, emit).map(Some)
    }

    /// Erase the key of rows `group` for the DML row `statement`: its rows
    /// are deleted (in the change feed), its events dropped, and an
    /// erased-through mark at its greatest sequence kept.
    fn erase(
        &mut self,
        group: std::ops::Range<usize>,
        statement: usize,
        enc: &Encoded<'_>,
        origins: &Int8Array,
        s: &mut Scratch,
        emit: &mut Emit,
    ) {
        let mut subset = std::mem::take(&mut s.subset);
        subset.clear();
        subset.extend(group.clone().filter(|&i| {
            origins.value(i) == Origin::Stored as i8 && enc.kinds.value(i) != STORED_ERASED_THROUGH
        }));
        subset.sort_by(|&a, &b| {
            enc.seqs
                .row(a)
                .cmp(&enc.seqs.row(b))
                .then_with(|| enc.systems.row(a).cmp(&enc.systems.row(b)))
        });
        subset.dedup_by(|a, b| {
            enc.seqs.row(*a) == enc.seqs.row(*b) && enc.systems.row(*a) == enc.systems.row(*b)
        });
        let mut before = std::mem::take(&mut s.before);
        fold_rows(&subset, enc, s, &mut before);
        let (_, deleted) = changes(&before, &[], enc, emit);
        self.counts.deleted += deleted;
        let greatest = group
            .filter(|&i| origins.value(i) != Origin::Dml as i8)
            .max_by(|&a, &b| enc.seqs.row(a).cmp(&enc.seqs.row(b)));
        if let Some(g) = greatest {
            emit.mark(g, STORED_ERASED_THROUGH, statement);
        }
        s.before = before;
        s.subset = subset;
    }

    fn build(&self, batch: &RecordBatch, emit: Emit) -> Result<RecordBatch> {
        let rows = UInt32Array::from(emit.rows);
        let seq = batch.column(self.layout.seq());
        let system = batch.column(self.system_index);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.output_schema.fields().len());
        for i in 0..self.layout.num_target() {
            columns.push(take(batch.column(i).as_ref(), &rows, None)?);
        }
        columns.push(take(seq.as_ref(), &UInt32Array::from(emit.start), None)?);
        columns.push(take(seq.as_ref(), &UInt32Array::from(emit.end), None)?);
        columns.push(take(
            system.as_ref(),
            &UInt32Array::from(emit.system_start),
            None,
        )?);
        columns.push(take(
            system.as_ref(),
            &UInt32Array::from(emit.system_end),
            None,
        )?);
        columns.push(take(seq.as_ref(), &rows, None)?);
        columns.push(Arc::new(Int8Array::from(emit.kind)));
        columns.push(take(
            batch.column(self.layout.written_at()).as_ref(),
            &UInt32Array::from(emit.written),
            None,
        )?);
        columns.push(take(system.as_ref(), &rows, None)?);
        Ok(RecordBatch::try_new(
            Arc::clone(&self.output_schema),
            columns,
        )?)
    }
}

/// Change data feed rows between the rows before and after an update:
/// unmatched rows are deleted or inserted; a row whose system end moved is an
/// update (pre- and post-image).
fn changes(
    before: &[BiRow],
    after: &[BiRow],
    enc: &Encoded<'_>,
    emit: &mut Emit,
) -> (usize, usize) {
    let (mut upserted, mut deleted) = (0, 0);
    let same_row = |a: &BiRow, b: &BiRow| {
        enc.systems.row(a.from) == enc.systems.row(b.from)
            && enc.same_version(
                &Version {
                    last: a.last,
                    open: a.open,
                    close: a.close,
                },
                &Version {
                    last: b.last,
                    open: b.open,
                    close: b.close,
                },
            )
    };
    let mut matched = vec![false; after.len()];
    for old in before {
        match after
            .iter()
            .enumerate()
            .find(|(j, new)| !matched[*j] && same_row(old, new))
        {
            Some((j, new)) => {
                matched[j] = true;
                if !enc.same_system_end(old.to, new.to) {
                    emit.row(old, CHANGE_PREIMAGE);
                    emit.row(new, CHANGE_POSTIMAGE);
                    upserted += 1;
                }
            }
            None => {
                emit.row(old, CHANGE_DELETE);
                deleted += 1;
            }
        }
    }
    for (new, _) in after.iter().zip(&matched).filter(|(_, m)| !**m) {
        emit.row(new, CHANGE_INSERT);
        upserted += 1;
    }
    (upserted, deleted)
}

impl FoldKernel for BitemporalFold {
    fn observe_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        if sequences.is_empty() {
            return Ok(());
        }
        Err(DataFusionError::Execution(format!(
            "flow '{}': TRUNCATE is not allowed with BITEMPORAL",
            self.flow
        )))
    }

    fn watermark_value(&self) -> Option<&ArrayRef> {
        None
    }

    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        if batch.num_rows() == 0 {
            return Ok(None);
        }
        self.check_nulls(batch)?;
        let (input, whole) = self.carry.push(batch)?;
        self.fold(&input, whole)
    }

    fn expect_whole_groups(&mut self) {
        self.carry.whole_groups();
    }

    fn finish_all(&mut self) -> Result<Option<RecordBatch>> {
        match self.carry.finish() {
            Some(carry) => {
                let n = carry.num_rows();
                self.fold(&carry, n)
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
