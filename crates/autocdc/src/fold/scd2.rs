//! SCD type 2 fold.
//!
//! History is a function of the *set* of events: the target keeps, hidden,
//! every event ever folded into a key's history (upserts that changed nothing
//! visible and deletes with nothing to close included), and each update
//! re-folds every key it touches over its stored events plus the new ones.
//! A late event therefore lands exactly where it would have had it arrived in
//! order, and replays (equal events at equal sequence) are dropped.
//!
//! ```text
//!  events of one key, by seq        fold                      stored rows
//!  ┌──────────────────────┐   cur = open version     ┌───────────────────────────┐
//!  │ d@7  (stored event)  │   upsert, tracked ≠ cur: │ event d@7, e@8, d@9 (hidden)│
//!  │ e@8  (new, late)     │──►  close cur at s, open │ d [7, 8)                   │
//!  │ d@9  (stored event)  │   upsert, tracked = cur: │ e [8, 9)                   │
//!  └──────────────────────┘     update cur in place  │ d [9, NULL)                │
//!                             delete: close cur at s └───────────────────────────┘
//! ```
//!
//! Output rows are `[target columns..., __start_at, __end_at, __cdc_seq,
//! __cdc_kind]`: versions (kind 0, visible) and hidden events (kinds 3/4),
//! built with `take` from the input batch. A key group spanning batches is
//! carried over as a slice of its rows.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int8Array, RecordBatch, UInt32Array};
use arrow::compute::kernels::zip::zip;
use arrow::compute::take;
use arrow::datatypes::{Field, Int8Type, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows};
use datafusion::common::{DataFusionError, Result};

use super::columns::{
    EventLayout, Kind, Origin, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE,
    END_AT_COL, KIND_COL, SEQ_COL, START_AT_COL, STORED_DELETE_EVENT, STORED_UPSERT_EVENT,
};
use super::errors::{check_event_nulls, conflict_error};
use super::kernel::{FoldKernel, GroupCarry};
use super::partial::{Chain, Merger, PartialUpdates};
use super::rows::{row_converter, to_rows};
use super::FoldCounts;

/// Output schema of the SCD 2 fold for an event input schema.
pub fn scd2_output_schema(layout: &EventLayout, input: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = (0..layout.num_target())
        .map(|i| input.field(i).clone().with_nullable(true))
        .collect();
    let seq_type = input.field(layout.seq()).data_type().clone();
    fields.push(Field::new(START_AT_COL, seq_type.clone(), true));
    fields.push(Field::new(END_AT_COL, seq_type.clone(), true));
    fields.push(Field::new(SEQ_COL, seq_type, true));
    fields.push(Field::new(KIND_COL, arrow::datatypes::DataType::Int8, true));
    fields.push(input.field(layout.written_at()).clone().with_nullable(true));
    if let Some(list) = layout.update_list() {
        fields.push(input.field(list).clone().with_nullable(true));
    }
    Arc::new(Schema::new(fields))
}

/// Streaming SCD 2 fold.
#[derive(Debug)]
pub struct Scd2Fold {
    flow: String,
    layout: EventLayout,
    output_schema: SchemaRef,
    key_converter: RowConverter,
    seq_converter: RowConverter,
    /// All target columns but the sequence, plus the kind: event identity.
    value_columns: Vec<usize>,
    value_converter: RowConverter,
    tracked: Vec<usize>,
    tracked_converter: RowConverter,
    /// All target columns: a version's visible values.
    target_columns: Vec<usize>,
    target_converter: RowConverter,
    carry: GroupCarry,
    counts: FoldCounts,
    scratch: Scratch,
    /// Partial updates: versions take merged rows, hidden events raw ones.
    merger: Option<Merger>,
}

/// Rows to emit for one batch.
#[derive(Default)]
struct Emit {
    rows: Vec<u32>,
    start: Vec<Option<u32>>,
    end: Vec<Option<u32>>,
    kind: Vec<i8>,
}

impl Emit {
    fn event(&mut self, row: usize, kind: i8) {
        self.rows.push(row as u32);
        self.start.push(None);
        self.end.push(None);
        self.kind.push(if kind == Kind::Delete as i8 {
            STORED_DELETE_EVENT
        } else {
            STORED_UPSERT_EVENT
        });
    }

    /// A change data feed row for a version.
    fn change(&mut self, last: usize, open: usize, close: Option<usize>, kind: i8) {
        self.rows.push(last as u32);
        self.start.push(Some(open as u32));
        self.end.push(close.map(|c| c as u32));
        self.kind.push(kind);
    }

    /// A version with the values of `last` (its latest absorbed event),
    /// valid over [seq(open), seq(close)).
    fn version(&mut self, last: usize, open: usize, close: Option<usize>) {
        self.rows.push(last as u32);
        self.start.push(Some(open as u32));
        self.end.push(close.map(|c| c as u32));
        self.kind.push(Kind::Upsert as i8);
    }
}

/// Row encodings and codes of one batch, shared by its key groups.
#[derive(Clone, Copy)]
struct BatchRows<'a> {
    seqs: &'a Rows,
    values: &'a Rows,
    targets: &'a Rows,
    tracked: &'a Rows,
    kinds: &'a Int8Array,
    origins: &'a Int8Array,
}

/// Buffers reused by every key group of a fold.
#[derive(Debug, Default)]
struct Scratch {
    kept: Vec<usize>,
    stored: Vec<usize>,
    versions: Vec<Version>,
    before: Vec<Version>,
}

/// A version of a key's history, as rows of the batch: the event that opened
/// it, the latest event absorbed into it, the event that closed it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Version {
    pub(super) open: usize,
    pub(super) last: usize,
    pub(super) close: Option<usize>,
}

/// Fold a key's distinct events (in sequence order) into its versions
///.
pub(super) fn fold_versions(
    events: &[usize],
    kinds: &Int8Array,
    tracked: &Rows,
    versions: &mut Vec<Version>,
) {
    versions.clear();
    let mut cur: Option<(usize, usize)> = None;
    for &i in events {
        if kinds.value(i) == Kind::Delete as i8 {
            if let Some((open, last)) = cur.take() {
                versions.push(Version {
                    open,
                    last,
                    close: Some(i),
                });
            }
            continue;
        }
        cur = match cur {
            Some((open, last)) if tracked.row(last) == tracked.row(i) => Some((open, i)),
            Some((open, last)) => {
                versions.push(Version {
                    open,
                    last,
                    close: Some(i),
                });
                Some((i, i))
            }
            None => Some((i, i)),
        };
    }
    if let Some((open, last)) = cur {
        versions.push(Version {
            open,
            last,
            close: None,
        });
    }
}

impl Scd2Fold {
    /// Create a fold; `tracked` are the indices of the tracked target columns.
    pub fn try_new(
        flow: &str,
        layout: EventLayout,
        tracked: Vec<usize>,
        partial: Option<PartialUpdates>,
        input_schema: &SchemaRef,
    ) -> Result<Self> {
        let value_columns: Vec<usize> = (0..layout.num_target())
            .chain([layout.kind()])
            .chain(layout.update_list())
            .collect();
        let target_columns: Vec<usize> = (0..layout.num_target()).collect();
        let converter = |columns: &[usize]| row_converter(input_schema, columns);
        Ok(Self {
            flow: flow.to_string(),
            key_converter: converter(&layout.key_indices)?,
            seq_converter: converter(&[layout.seq()])?,
            value_converter: converter(&value_columns)?,
            // empty when no column is tracked: every upsert continues the
            // current version
            tracked_converter: converter(&tracked)?,
            target_converter: converter(&target_columns)?,
            target_columns,
            output_schema: scd2_output_schema(&layout, input_schema),
            carry: GroupCarry::try_new(input_schema, &layout.key_indices)?,
            value_columns,
            tracked,
            counts: FoldCounts::default(),
            scratch: Scratch::default(),
            merger: partial.map(|mode| Merger::new(flow, layout.clone(), mode)),
            layout,
        })
    }

    fn check_nulls(&self, batch: &RecordBatch) -> Result<()> {
        check_event_nulls(&self.flow, &self.layout, batch)
    }

    /// Fold the complete key groups in rows `[0, end)` of `batch`.
    fn fold(&mut self, batch: &RecordBatch, end: usize) -> Result<Option<RecordBatch>> {
        if end == 0 {
            return Ok(None);
        }
        let keys = to_rows(&self.key_converter, batch, &self.layout.key_indices)?;
        let seqs = to_rows(&self.seq_converter, batch, &[self.layout.seq()])?;
        let values = to_rows(&self.value_converter, batch, &self.value_columns)?;
        // versions hold merged rows under partial updates (the
        // merge happens before the tracked-column comparison)
        let merged = match &self.merger {
            Some(merger) => Some(merger.merge(batch, end, &keys, &seqs, Chain::History)?),
            None => None,
        };
        let version_rows = merged.as_ref().unwrap_or(batch);
        let tracked = to_rows(&self.tracked_converter, version_rows, &self.tracked)?;
        let targets = to_rows(&self.target_converter, version_rows, &self.target_columns)?;
        let kinds = batch.column(self.layout.kind()).as_primitive::<Int8Type>();
        let origins = batch
            .column(self.layout.origin())
            .as_primitive::<Int8Type>();
        let rows = BatchRows {
            seqs: &seqs,
            values: &values,
            targets: &targets,
            tracked: &tracked,
            kinds,
            origins,
        };
        // per-key work reuses the fold's scratch buffers (no allocation per key)
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut emit = Emit::default();
        let mut start = 0;
        while start < end {
            let mut stop = start + 1;
            while stop < end && keys.row(stop) == keys.row(start) {
                stop += 1;
            }
            self.fold_group(batch, (start, stop), &rows, &mut emit, &mut scratch)?;
            start = stop;
        }
        self.scratch = scratch;
        self.build(batch, merged.as_ref(), emit).map(Some)
    }

    /// Fold one key group (rows `start..stop`).
    fn fold_group(
        &mut self,
        batch: &RecordBatch,
        (start, stop): (usize, usize),
        rows: &BatchRows<'_>,
        emit: &mut Emit,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let BatchRows {
            seqs,
            values,
            targets,
            tracked,
            kinds,
            origins,
        } = *rows;
        // 1. events: drop replays, reject conflicts, keep every distinct event
        let Scratch {
            kept,
            stored,
            versions,
            before,
        } = scratch;
        kept.clear();
        for i in start..stop {
            let new = origins.value(i) == Origin::New as i8;
            if new {
                self.counts.input_rows += 1;
            }
            if let Some(&p) = kept.last().filter(|&&p| seqs.row(p) == seqs.row(i)) {
                if values.row(p) != values.row(i) {
                    let stored = origins.value(p) == Origin::Stored as i8;
                    return Err(conflict_error(&self.flow, &self.layout, batch, i, stored));
                }
                if new {
                    self.counts.duplicates += 1;
                }
                continue;
            }
            kept.push(i);
            emit.event(i, kinds.value(i));
            if new {
                self.counts.events_added += 1;
            }
        }
        // 2. the history of all events (stored), and of the stored ones alone
        let is_new = |i: usize| origins.value(i) == Origin::New as i8;
        fold_versions(kept, kinds, tracked, versions);
        for v in versions.iter() {
            emit.version(v.last, v.open, v.close);
        }
        for &i in kept.iter().filter(|&&i| is_new(i)) {
            if kinds.value(i) == Kind::Delete as i8 {
                if versions.iter().any(|v| v.close == Some(i)) {
                    self.counts.deleted += 1;
                } else {
                    self.counts.tombstones += 1;
                }
            } else {
                self.counts.upserted += 1;
            }
        }
        if !kept.iter().any(|&i| is_new(i)) {
            return Ok(());
        }
        stored.clear();
        stored.extend(kept.iter().copied().filter(|&i| !is_new(i)));
        fold_versions(stored, kinds, tracked, before);
        // 3. the change data feed: versions matched by their start
        let same_end = |a: Option<usize>, b: Option<usize>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => seqs.row(a) == seqs.row(b),
            _ => false,
        };
        let (mut o, mut n) = (0, 0);
        while o < before.len() || n < versions.len() {
            let order = match (before.get(o), versions.get(n)) {
                (Some(old), Some(new)) => seqs.row(old.open).cmp(&seqs.row(new.open)),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            match order {
                std::cmp::Ordering::Less => {
                    let old = &before[o];
                    emit.change(old.last, old.open, old.close, CHANGE_DELETE);
                    o += 1;
                }
                std::cmp::Ordering::Greater => {
                    let new = &versions[n];
                    emit.change(new.last, new.open, new.close, CHANGE_INSERT);
                    n += 1;
                }
                std::cmp::Ordering::Equal => {
                    let (old, new) = (&before[o], &versions[n]);
                    if targets.row(old.last) != targets.row(new.last)
                        || !same_end(old.close, new.close)
                    {
                        emit.change(old.last, old.open, old.close, CHANGE_PREIMAGE);
                        emit.change(new.last, new.open, new.close, CHANGE_POSTIMAGE);
                    }
                    o += 1;
                    n += 1;
                }
            }
        }
        Ok(())
    }

    fn build(
        &self,
        batch: &RecordBatch,
        merged: Option<&RecordBatch>,
        emit: Emit,
    ) -> Result<RecordBatch> {
        let rows = UInt32Array::from(emit.rows);
        let seq = batch.column(self.layout.seq());
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.output_schema.fields().len());
        // hidden events keep their raw values, versions and changes the merged ones
        let is_event = merged.map(|_| {
            BooleanArray::from_iter(
                emit.kind
                    .iter()
                    .map(|&k| Some(k == STORED_UPSERT_EVENT || k == STORED_DELETE_EVENT)),
            )
        });
        for i in 0..self.layout.num_target() {
            let raw = take(batch.column(i).as_ref(), &rows, None)?;
            columns.push(match (merged, &is_event) {
                (Some(merged), Some(is_event)) => {
                    let merged = take(merged.column(i).as_ref(), &rows, None)?;
                    zip(is_event, &raw, &merged)?
                }
                _ => raw,
            });
        }
        columns.push(take(seq.as_ref(), &UInt32Array::from(emit.start), None)?);
        columns.push(take(seq.as_ref(), &UInt32Array::from(emit.end), None)?);
        columns.push(take(seq.as_ref(), &rows, None)?);
        columns.push(Arc::new(Int8Array::from(emit.kind)));
        columns.push(take(
            batch.column(self.layout.written_at()).as_ref(),
            &rows,
            None,
        )?);
        if let Some(list) = self.layout.update_list() {
            columns.push(take(batch.column(list).as_ref(), &rows, None)?);
        }
        Ok(RecordBatch::try_new(
            Arc::clone(&self.output_schema),
            columns,
        )?)
    }
}

impl FoldKernel for Scd2Fold {
    fn observe_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        if sequences.is_empty() {
            return Ok(());
        }
        Err(DataFusionError::Execution(format!(
            "flow '{}': TRUNCATE is not allowed with SCD TYPE 2",
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
        // the last key group may continue in the next batch
        let (input, whole) = self.carry.push(batch)?;
        self.fold(&input, whole)
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
