//! SCD type 2 fold.
//!
//! History is a function of the *set* of events: the target keeps every
//! event ever folded into a key's history (upserts that changed nothing
//! visible and deletes with nothing to close included), and each update
//! re-folds every key it touches over its stored events plus the new ones.
//! A late event therefore lands exactly where it would have had it arrived in
//! order, and replays (equal events at equal sequence) are dropped.
//!
//! ```text
//!  events of one key, by seq        fold                     stored rows
//!  ┌──────────────────────┐   cur = open version     ┌───────────────────────────┐
//!  │ d@7  (hidden event)  │   upsert, tracked ≠ cur: │ d [7, 8)    stands for d@7  │
//!  │ e@8  (new, late)     │──►  close cur at s, open │ e [8, 9)    stands for e@8  │
//!  │ d@9  (hidden event)  │   upsert, tracked = cur: │ d [9, NULL) stands for d@10 │
//!  │ d@10 (a version)     │     update cur in place  │ d@9         hidden          │
//!  └──────────────────────┘   delete: close cur at s └───────────────────────────┘
//! ```
//!
//! A version stands for the last event it absorbed (its values, `__cdc_seq`
//! and `__cdc_written_at` are that event's): read back, it is that event
//! again ([`Origin::Implied`]), so the event is not stored hidden as well.
//! Every other event is (absorbed upserts, deletes), and so is a version's
//! last event where the version does not hold its values (partial updates:
//! versions hold merged rows) or its mark (DML-written events). An implied
//! event yields to an event stored as itself at its sequence (one an older
//! writer stored hidden too, or the raw event of a merged version).
//!
//! The change data feed goes from the versions of a key's stored events to
//! those of all its events. Under partial updates a version holds merged
//! rows, and a late event re-merges the versions after it: the stored
//! versions are then those of the stored events' own merge
//! ([`StoredMerge`]), what the update that stored them wrote.
//!
//! Output rows are `[target columns..., __start_at, __end_at, __cdc_seq,
//! __cdc_kind]`: versions (kind 0, visible) and hidden events (kinds 3/4),
//! built with `take` from the input batch. A key group spanning batches is
//! carried over as a slice of its rows.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int8Array, RecordBatch, UInt32Array};
use arrow::compute::kernels::zip::zip;
use arrow::compute::{interleave, take, take_record_batch};
use arrow::datatypes::{Field, Int8Type, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows};
use datafusion::common::{DataFusionError, Result};

use super::columns::{
    EventLayout, Kind, Origin, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE,
    END_AT_COL, KIND_COL, SEQ_COL, START_AT_COL, STORED_DELETE_EVENT, STORED_DML_DELETE_EVENT,
    STORED_DML_UPSERT_EVENT, STORED_ERASED_AT, STORED_ERASED_THROUGH, STORED_UPSERT_EVENT,
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

/// The error of TRUNCATE events in an SCD 2 flow.
pub(super) fn truncate_not_allowed(flow: &str) -> DataFusionError {
    DataFusionError::Execution(format!(
        "flow '{flow}': TRUNCATE is not allowed with SCD TYPE 2"
    ))
}

/// Streaming SCD 2 fold.
#[derive(Debug)]
pub struct Scd2Fold {
    flow: String,
    /// Emit versions only (see `FoldSpec::visible_only`).
    visible_only: bool,
    layout: EventLayout,
    output_schema: SchemaRef,
    key_converter: RowConverter,
    seq_converter: RowConverter,
    /// All target columns but the sequence, plus the kind: event identity.
    value_columns: Vec<usize>,
    value_converter: RowConverter,
    tracked: Vec<usize>,
    tracked_converter: RowConverter,
    /// The non-key target columns: a version's visible values (within a
    /// key, what tells two versions' values apart) ...
    visible_columns: Vec<usize>,
    visible_converter: RowConverter,
    /// ... the tracked columns, when every one is tracked (the default):
    /// then one encoding serves both.
    tracks_every_visible: bool,
    carry: GroupCarry,
    counts: FoldCounts,
    scratch: Scratch,
    /// Partial updates: versions take merged rows, hidden events raw ones.
    merger: Option<Merger>,
}

/// Rows to emit for one batch.
#[derive(Default)]
struct Emit {
    /// Versions only (see `FoldSpec::visible_only`).
    visible_only: bool,
    rows: Vec<u32>,
    start: Vec<Option<u32>>,
    end: Vec<Option<u32>>,
    kind: Vec<i8>,
    /// Row whose `__cdc_written_at` the output row takes (its own, but for
    /// marks made by a DML statement: the statement's).
    written: Vec<u32>,
    /// Under partial updates, the merged row whose values each output row
    /// takes: its own row of the batch's merge, or (a version as stored
    /// before this update) its row of the stored events' merge, numbered
    /// after the batch's merge's rows ([`StoredMerge::values`]).
    values: Option<Vec<u32>>,
}

impl Emit {
    /// A hidden event (or erasure mark) with the stored code `code`.
    fn event(&mut self, row: usize, code: i8) {
        self.mark(row, code, row);
    }

    /// A hidden row with the stored code `code`, written at `written`'s time.
    fn mark(&mut self, row: usize, code: i8, written: usize) {
        if self.visible_only {
            return;
        }
        self.rows.push(row as u32);
        self.start.push(None);
        self.end.push(None);
        self.kind.push(code);
        self.written.push(written as u32);
        if let Some(values) = &mut self.values {
            values.push(row as u32);
        }
    }

    /// A change data feed row for a version.
    fn change(&mut self, last: usize, open: usize, close: Option<usize>, kind: i8) {
        self.change_with(last, last, open, close, kind);
    }

    /// A change data feed row for a version whose values are those of
    /// merged row `values` (see [`Emit::values`]).
    fn change_with(
        &mut self,
        last: usize,
        values: usize,
        open: usize,
        close: Option<usize>,
        kind: i8,
    ) {
        if self.visible_only && kind != Kind::Upsert as i8 {
            return;
        }
        self.rows.push(last as u32);
        self.start.push(Some(open as u32));
        self.end.push(close.map(|c| c as u32));
        self.kind.push(kind);
        self.written.push(last as u32);
        if let Some(all) = &mut self.values {
            all.push(values as u32);
        }
    }

    /// A version with the values of `last` (its latest absorbed event),
    /// valid over [seq(open), seq(close)).
    fn version(&mut self, last: usize, open: usize, close: Option<usize>) {
        self.change(last, open, close, Kind::Upsert as i8);
    }

    /// Reorder the rows (stably) by the files they go to: versions, then
    /// hidden rows, then change rows. The writer then takes each kind of
    /// row as a slice of the output batch instead of filtering a copy out
    /// of it (`crate::table::commit`).
    fn by_file(&mut self) {
        let file = |kind: i8| match kind {
            k if k == Kind::Upsert as i8 => 0_u8,
            k if k >= CHANGE_INSERT => 2,
            _ => 1,
        };
        if self.kind.windows(2).all(|w| file(w[0]) <= file(w[1])) {
            return;
        }
        let mut order: Vec<usize> = (0..self.kind.len()).collect();
        order.sort_by_key(|&i| file(self.kind[i]));
        fn permute<T: Copy>(values: &mut Vec<T>, order: &[usize]) {
            *values = order.iter().map(|&i| values[i]).collect();
        }
        permute(&mut self.rows, &order);
        permute(&mut self.start, &order);
        permute(&mut self.end, &order);
        permute(&mut self.kind, &order);
        permute(&mut self.written, &order);
        if let Some(values) = &mut self.values {
            permute(values, &order);
        }
    }
}

/// The stored code of an event of kind `kind` from `origin`: DML-written
/// events keep their mark.
fn stored_code(kind: i8, origin: i8) -> i8 {
    let dml = origin == Origin::StoredByDml as i8 || origin == Origin::Dml as i8;
    match (kind == Kind::Delete as i8, dml) {
        (false, false) => STORED_UPSERT_EVENT,
        (true, false) => STORED_DELETE_EVENT,
        (false, true) => STORED_DML_UPSERT_EVENT,
        (true, true) => STORED_DML_DELETE_EVENT,
    }
}

/// Whether a stored row of kind `kind` is an erasure mark (not an event).
pub(super) fn is_mark(kind: i8) -> bool {
    kind == STORED_ERASED_AT || kind == STORED_ERASED_THROUGH
}

/// Row encodings and codes of one batch, shared by its key groups.
#[derive(Clone, Copy)]
struct BatchRows<'a> {
    seqs: &'a Rows,
    values: &'a Values,
    /// Non-key target columns (see [`Scd2Fold::visible_columns`]).
    visible: &'a Rows,
    tracked: &'a Rows,
    kinds: &'a Int8Array,
    origins: &'a Int8Array,
    /// Under partial updates, the merge of the stored events alone.
    stored: Option<&'a StoredMerge>,
}

impl BatchRows<'_> {
    /// Fold a key's stored events `events` into the versions stored before
    /// this update.
    fn stored_versions(&self, events: &[usize], versions: &mut Vec<Version>) {
        match self.stored {
            Some(s) => fold_versions_by(
                events,
                self.kinds,
                |a, b| s.tracked(a) == s.tracked(b),
                versions,
            ),
            None => fold_versions(events, self.kinds, self.tracked, versions),
        }
    }
}

/// Under partial updates a version holds merged values, and a late event
/// changes the merged values of the versions after it (a column it wrote
/// carried forward): the versions stored before this update are folded
/// over the merge of the stored events alone, which is what the update
/// that stored them merged, to tell what changed.
struct StoredMerge {
    /// Per row of the batch: its row in `merged` (stored rows only).
    at: Vec<u32>,
    /// The stored rows merged.
    merged: RecordBatch,
    tracked: Rows,
    /// The visible columns of `merged` (`None`: every one is tracked).
    visible: Option<Rows>,
    /// Rows of the batch's own merge: `merged`'s rows come after them in
    /// the values an output row takes ([`Emit::values`]).
    offset: usize,
}

impl StoredMerge {
    fn tracked(&self, row: usize) -> arrow::row::Row<'_> {
        self.tracked.row(self.at[row] as usize)
    }

    fn visible(&self, row: usize) -> arrow::row::Row<'_> {
        self.visible
            .as_ref()
            .unwrap_or(&self.tracked)
            .row(self.at[row] as usize)
    }

    /// The row of the output's values that stored row `row` takes.
    fn values(&self, row: usize) -> usize {
        self.offset + self.at[row] as usize
    }
}

/// Event identities (values and kind) of the rows of a batch that share
/// their key and sequence with a neighbour: the only rows whose identities
/// are compared (replays, and a DML statement's events of one sequence;
/// rows of one key and sequence are adjacent). Encoding every row was one
/// more encoding of every column of every event.
struct Values {
    /// The rows encoded, ascending ...
    rows: UInt32Array,
    /// ... and their identities, in that order.
    encoded: Option<Rows>,
}

impl Values {
    /// Identities of the rows of `batch[..end]` in runs of equal key and
    /// sequence, encoded with `converter` over `columns`.
    fn try_new(
        batch: &RecordBatch,
        end: usize,
        (keys, seqs): (&Rows, &Rows),
        converter: &RowConverter,
        columns: &[usize],
    ) -> Result<Self> {
        let same = |i: usize| seqs.row(i) == seqs.row(i - 1) && keys.row(i) == keys.row(i - 1);
        let rows = UInt32Array::from_iter_values(
            (0..end)
                .filter(|&i| (i > 0 && same(i)) || (i + 1 < end && same(i + 1)))
                .map(|i| i as u32),
        );
        if rows.is_empty() {
            return Ok(Self {
                rows,
                encoded: None,
            });
        }
        let picked = take_record_batch(batch, &rows)?;
        let encoded = Some(to_rows(converter, &picked, columns)?);
        Ok(Self { rows, encoded })
    }

    /// Whether rows `a` and `b` of the batch are the same event.
    fn same(&self, a: usize, b: usize) -> Result<bool> {
        let at = |i: usize| self.rows.values().binary_search(&(i as u32)).ok();
        match (&self.encoded, at(a), at(b)) {
            (Some(encoded), Some(a), Some(b)) => Ok(encoded.row(a) == encoded.row(b)),
            _ => Err(DataFusionError::Internal(
                "SCD 2 fold: identities compared of rows not sharing key and sequence".into(),
            )),
        }
    }
}

/// Buffers reused by every key group of a fold.
#[derive(Debug, Default)]
struct Scratch {
    kept: Vec<usize>,
    stored: Vec<usize>,
    marks: Vec<usize>,
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
    fold_versions_by(
        events,
        kinds,
        |a, b| tracked.row(a) == tracked.row(b),
        versions,
    );
}

/// [`fold_versions`], with `same(a, b)` telling whether events `a` and `b`
/// hold the same tracked values.
fn fold_versions_by(
    events: &[usize],
    kinds: &Int8Array,
    same: impl Fn(usize, usize) -> bool,
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
            Some((open, last)) if same(last, i) => Some((open, i)),
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
    /// Emit versions only: no hidden events, marks or change rows (a fold
    /// read as rows).
    pub fn with_visible_only(mut self, visible_only: bool) -> Self {
        self.visible_only = visible_only;
        self
    }

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
        let visible_columns: Vec<usize> = (0..layout.num_target())
            .filter(|c| !layout.key_indices.contains(c))
            .collect();
        let converter = |columns: &[usize]| row_converter(input_schema, columns);
        Ok(Self {
            flow: flow.to_string(),
            key_converter: converter(&layout.key_indices)?,
            seq_converter: converter(&[layout.seq()])?,
            value_converter: converter(&value_columns)?,
            // empty when no column is tracked: every upsert continues the
            // current version
            tracked_converter: converter(&tracked)?,
            visible_converter: converter(&visible_columns)?,
            tracks_every_visible: tracked == visible_columns,
            visible_columns,
            output_schema: scd2_output_schema(&layout, input_schema),
            carry: GroupCarry::try_new(input_schema, &layout.key_indices)?,
            value_columns,
            tracked,
            counts: FoldCounts::default(),
            scratch: Scratch::default(),
            merger: partial.map(|mode| Merger::new(flow, layout.clone(), mode)),
            visible_only: false,
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
        let values = Values::try_new(
            batch,
            end,
            (&keys, &seqs),
            &self.value_converter,
            &self.value_columns,
        )?;
        // versions hold merged rows under partial updates (the
        // merge happens before the tracked-column comparison)
        let merged = match &self.merger {
            Some(merger) => Some(merger.merge(batch, end, &keys, &seqs, Chain::History)?),
            None => None,
        };
        let version_rows = merged.as_ref().unwrap_or(batch);
        let tracked = to_rows(&self.tracked_converter, version_rows, &self.tracked)?;
        let visible = match self.tracks_every_visible {
            true => None,
            false => Some(to_rows(
                &self.visible_converter,
                version_rows,
                &self.visible_columns,
            )?),
        };
        let kinds = batch.column(self.layout.kind()).as_primitive::<Int8Type>();
        let origins = batch
            .column(self.layout.origin())
            .as_primitive::<Int8Type>();
        let stored = match (&self.merger, &merged) {
            (Some(merger), Some(merged)) => {
                self.stored_merge(merger, batch, end, origins, merged.num_rows())?
            }
            _ => None,
        };
        let rows = BatchRows {
            seqs: &seqs,
            values: &values,
            visible: visible.as_ref().unwrap_or(&tracked),
            tracked: &tracked,
            kinds,
            origins,
            stored: stored.as_ref(),
        };
        // per-key work reuses the fold's scratch buffers (no allocation per key)
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut emit = Emit {
            visible_only: self.visible_only,
            values: merged.as_ref().map(|_| Vec::new()),
            ..Emit::default()
        };
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
        let merged = merged.as_ref().map(|m| (m, stored.as_ref()));
        self.build(batch, merged, emit).map(Some)
    }

    /// The merge of the stored events of rows `[0, end)` (those neither new
    /// nor a DML statement's), when some are new; `offset` is the number of
    /// rows of the batch's own merge.
    fn stored_merge(
        &self,
        merger: &Merger,
        batch: &RecordBatch,
        end: usize,
        origins: &Int8Array,
        offset: usize,
    ) -> Result<Option<StoredMerge>> {
        let is_stored = |i: usize| {
            let origin = origins.value(i);
            origin != Origin::New as i8 && origin != Origin::Dml as i8
        };
        if (0..end).all(is_stored) {
            // nothing new: no key's history changes
            return Ok(None);
        }
        let mut at = vec![u32::MAX; end];
        let mut picked = Vec::new();
        for (i, at) in at.iter_mut().enumerate().filter(|(i, _)| is_stored(*i)) {
            *at = picked.len() as u32;
            picked.push(i as u32);
        }
        if picked.is_empty() {
            return Ok(None);
        }
        let stored = take_record_batch(batch, &UInt32Array::from(picked))?;
        let n = stored.num_rows();
        let keys = to_rows(&self.key_converter, &stored, &self.layout.key_indices)?;
        let seqs = to_rows(&self.seq_converter, &stored, &[self.layout.seq()])?;
        let merged = merger.merge(&stored, n, &keys, &seqs, Chain::History)?;
        let tracked = to_rows(&self.tracked_converter, &merged, &self.tracked)?;
        let visible = match self.tracks_every_visible {
            true => None,
            false => Some(to_rows(
                &self.visible_converter,
                &merged,
                &self.visible_columns,
            )?),
        };
        Ok(Some(StoredMerge {
            at,
            merged,
            tracked,
            visible,
            offset,
        }))
    }

    /// Fold one key group (rows `start..stop`): a DML statement's edited
    /// history replaces the stored one; otherwise new events join it.
    fn fold_group(
        &mut self,
        batch: &RecordBatch,
        (start, stop): (usize, usize),
        rows: &BatchRows<'_>,
        emit: &mut Emit,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let origins = rows.origins;
        if (start..stop).any(|i| origins.value(i) == Origin::Dml as i8) {
            return self.replace_group(batch, (start, stop), rows, emit, scratch);
        }
        let BatchRows {
            seqs,
            values,
            tracked,
            kinds,
            ..
        } = *rows;
        // a DML statement erased every version: new events at or before
        // the mark are dropped
        let through = (start..stop).find(|&i| {
            origins.value(i) == Origin::StoredByDml as i8 && kinds.value(i) == STORED_ERASED_THROUGH
        });
        // 1. events: drop replays, reject conflicts, keep every distinct event
        let Scratch {
            kept,
            stored,
            versions,
            before,
            ..
        } = scratch;
        kept.clear();
        // the latest DML-written row so far: it sorts before a new event of
        // equal sequence, which replays what the statement corrected
        let mut dml: Option<usize> = None;
        for i in start..stop {
            let origin = origins.value(i);
            if origin == Origin::StoredByDml as i8 {
                dml = Some(i);
                if is_mark(kinds.value(i)) {
                    emit.event(i, kinds.value(i));
                    continue;
                }
            }
            let new = origin == Origin::New as i8;
            if new {
                self.counts.input_rows += 1;
                let erased = through.is_some_and(|t| seqs.row(i) <= seqs.row(t))
                    || dml.is_some_and(|d| seqs.row(d) == seqs.row(i));
                if erased {
                    self.counts.late += 1;
                    continue;
                }
            }
            if let Some(&p) = kept.last().filter(|&&p| seqs.row(p) == seqs.row(i)) {
                // the event a version implies, also stored as itself
                if origin == Origin::Implied as i8 {
                    continue;
                }
                if !values.same(p, i)? {
                    let stored = origins.value(p) != Origin::New as i8;
                    return Err(conflict_error(&self.flow, &self.layout, batch, i, stored));
                }
                if new {
                    self.counts.duplicates += 1;
                }
                continue;
            }
            kept.push(i);
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
        self.emit_events(kept, versions, rows, emit);
        let closes = |i: usize| versions.iter().any(|v| v.close == Some(i));
        self.counts.tombstones += kept
            .iter()
            .filter(|&&i| is_new(i) && kinds.value(i) == Kind::Delete as i8 && !closes(i))
            .count();
        if !kept.iter().any(|&i| is_new(i)) {
            return Ok(());
        }
        stored.clear();
        stored.extend(kept.iter().copied().filter(|&i| !is_new(i)));
        rows.stored_versions(stored, before);
        // 3. the change data feed: versions matched by their start; the
        // rows it inserts, updates and deletes are the update's counts
        let (upserted, deleted) = changes(before, versions, rows, emit);
        self.counts.upserted += upserted;
        self.counts.deleted += deleted;
        Ok(())
    }

    /// The hidden events of a key: its `kept` events but those its
    /// `versions` imply (each version's last event, when the version holds
    /// that event's values — no partial updates — and DML did not write it).
    /// Read back, a version is that event again ([`Origin::Implied`]).
    fn emit_events(
        &self,
        kept: &[usize],
        versions: &[Version],
        rows: &BatchRows<'_>,
        emit: &mut Emit,
    ) {
        let BatchRows { kinds, origins, .. } = *rows;
        // versions hold merged rows under partial updates, not events
        let versions_hold_events = self.merger.is_none();
        // a version's last event comes after the last of the version before
        let mut lasts = versions.iter().map(|v| v.last).peekable();
        for &i in kept {
            let origin = origins.value(i);
            let implied = lasts.next_if_eq(&i).is_some()
                && versions_hold_events
                && origin != Origin::StoredByDml as i8
                && origin != Origin::Dml as i8;
            if !implied {
                emit.event(i, stored_code(kinds.value(i), origin));
            }
        }
    }

    /// A group with a DML statement's edited history (SPEC §4.2): the key's
    /// history becomes exactly the statement's events, kept as DML-written;
    /// sequences of stored events the statement removed are marked erased
    /// (a key left without versions: erased through its greatest sequence).
    ///
    /// | stored                 | statement's events | stored after                  |
    /// |------------------------|--------------------|-------------------------------|
    /// | events e at s          | events d at t      | d (DML-written), versions of d|
    /// | event at s, no d at s  | some version       | erased-at mark at s           |
    /// | anything               | no version         | erased-through mark at max(s) |
    /// | erased-at mark at s    | d at s             | dropped (d decides s)         |
    fn replace_group(
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
            tracked,
            kinds,
            origins,
            ..
        } = *rows;
        let Scratch {
            kept,
            stored,
            marks,
            versions,
            before,
        } = scratch;
        kept.clear();
        stored.clear();
        marks.clear();
        for i in start..stop {
            if origins.value(i) == Origin::Dml as i8 {
                if let Some(&p) = kept.last().filter(|&&p| seqs.row(p) == seqs.row(i)) {
                    if !values.same(p, i)? {
                        return Err(conflict_error(&self.flow, &self.layout, batch, i, false));
                    }
                    continue;
                }
                kept.push(i);
            } else if is_mark(kinds.value(i)) {
                marks.push(i);
            } else if origins.value(i) != Origin::New as i8 {
                // the event a version implies, also stored as itself
                let implied = origins.value(i) == Origin::Implied as i8
                    && stored.last().is_some_and(|&p| seqs.row(p) == seqs.row(i));
                if !implied {
                    stored.push(i);
                }
            } else {
                return Err(DataFusionError::Internal(format!(
                    "flow '{}': a DML statement's update holds a source event",
                    self.flow
                )));
            }
        }
        rows.stored_versions(stored, before);
        fold_versions(kept, kinds, tracked, versions);
        // the statement's time, for the marks it makes
        let now = kept[0];
        if versions.is_empty() {
            let greatest = stored
                .iter()
                .chain(marks.iter())
                .copied()
                .max_by(|&a, &b| seqs.row(a).cmp(&seqs.row(b)));
            if let Some(g) = greatest {
                emit.mark(g, STORED_ERASED_THROUGH, now);
            }
        } else {
            let at = |list: &[usize], i: usize| {
                list.binary_search_by(|&p| seqs.row(p).cmp(&seqs.row(i)))
                    .is_ok()
            };
            for &i in kept.iter() {
                emit.event(i, stored_code(kinds.value(i), Origin::Dml as i8));
            }
            for &m in marks.iter() {
                if kinds.value(m) == STORED_ERASED_THROUGH || !at(kept, m) {
                    emit.event(m, kinds.value(m));
                }
            }
            for &i in stored.iter() {
                let marked = marks
                    .iter()
                    .any(|&m| kinds.value(m) == STORED_ERASED_AT && seqs.row(m) == seqs.row(i));
                if !at(kept, i) && !marked {
                    emit.mark(i, STORED_ERASED_AT, now);
                }
            }
        }
        for v in versions.iter() {
            emit.version(v.last, v.open, v.close);
        }
        let (upserted, deleted) = changes(before, versions, rows, emit);
        self.counts.upserted += upserted;
        self.counts.deleted += deleted;
        self.counts.events_added += kept.len();
        Ok(())
    }

    /// The output rows `emit` names; under partial updates `merged` is the
    /// batch's merge and the stored events' (see [`Emit::values`]).
    fn build(
        &self,
        batch: &RecordBatch,
        merged: Option<(&RecordBatch, Option<&StoredMerge>)>,
        mut emit: Emit,
    ) -> Result<RecordBatch> {
        emit.by_file();
        // where each row's merged values are: (0, row of the batch's
        // merge) or (1, row of the stored events')
        let values: Option<Vec<(usize, usize)>> = match (merged, emit.values.take()) {
            (Some((merged, Some(_))), Some(values)) => Some(
                values
                    .iter()
                    .map(|&v| {
                        let v = v as usize;
                        match v.checked_sub(merged.num_rows()) {
                            Some(stored) => (1, stored),
                            None => (0, v),
                        }
                    })
                    .collect(),
            ),
            _ => None,
        };
        let rows = UInt32Array::from(emit.rows);
        let seq = batch.column(self.layout.seq());
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.output_schema.fields().len());
        // hidden events keep their raw values, versions and changes the merged ones
        let is_event = merged.map(|_| {
            BooleanArray::from_iter(
                emit.kind
                    .iter()
                    .map(|&k| Some((STORED_UPSERT_EVENT..=STORED_ERASED_THROUGH).contains(&k))),
            )
        });
        for i in 0..self.layout.num_target() {
            let raw = take(batch.column(i).as_ref(), &rows, None)?;
            columns.push(match (merged, &is_event) {
                (Some((merged, stored)), Some(is_event)) => {
                    let merged = match (stored, &values) {
                        (Some(stored), Some(values)) => interleave(
                            &[merged.column(i).as_ref(), stored.merged.column(i).as_ref()],
                            values,
                        )?,
                        _ => take(merged.column(i).as_ref(), &rows, None)?,
                    };
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
            &UInt32Array::from(emit.written),
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

/// The change data feed of a key from its versions `before` to `after`,
/// matched by their start: a version only before is deleted, only after
/// inserted, in both with other values or end updated (under partial
/// updates a version before holds the stored events' merge,
/// [`StoredMerge`]). Returns the rows upserted (inserted or updated) and
/// deleted: the update's counts.
fn changes(
    before: &[Version],
    after: &[Version],
    rows: &BatchRows<'_>,
    emit: &mut Emit,
) -> (usize, usize) {
    let BatchRows {
        seqs,
        visible,
        stored,
        ..
    } = *rows;
    // a version stored before, as stored: its values and their encoding
    let old_values = |i: usize| stored.map_or(i, |s| s.values(i));
    let old_visible = |i: usize| stored.map_or_else(|| visible.row(i), |s| s.visible(i));
    let same_end = |a: Option<usize>, b: Option<usize>| match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => seqs.row(a) == seqs.row(b),
        _ => false,
    };
    let (mut upserted, mut deleted) = (0, 0);
    let (mut o, mut n) = (0, 0);
    while o < before.len() || n < after.len() {
        let order = match (before.get(o), after.get(n)) {
            (Some(old), Some(new)) => seqs.row(old.open).cmp(&seqs.row(new.open)),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                let old = &before[o];
                let values = old_values(old.last);
                emit.change_with(old.last, values, old.open, old.close, CHANGE_DELETE);
                deleted += 1;
                o += 1;
            }
            std::cmp::Ordering::Greater => {
                let new = &after[n];
                emit.change(new.last, new.open, new.close, CHANGE_INSERT);
                upserted += 1;
                n += 1;
            }
            std::cmp::Ordering::Equal => {
                let (old, new) = (&before[o], &after[n]);
                if old_visible(old.last) != visible.row(new.last) || !same_end(old.close, new.close)
                {
                    let values = old_values(old.last);
                    emit.change_with(old.last, values, old.open, old.close, CHANGE_PREIMAGE);
                    emit.change(new.last, new.open, new.close, CHANGE_POSTIMAGE);
                    upserted += 1;
                }
                o += 1;
                n += 1;
            }
        }
    }
    (upserted, deleted)
}

impl FoldKernel for Scd2Fold {
    fn observe_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        if sequences.is_empty() {
            return Ok(());
        }
        Err(truncate_not_allowed(&self.flow))
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
