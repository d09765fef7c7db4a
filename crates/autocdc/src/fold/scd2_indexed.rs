//! Indexed SCD type 2 fold: the rows of [`super::Scd2Fold`] without
//! ordering, gathering or row-encoding the events.
//!
//! Fed through an [`IndexSortedFold`], the sorted kernel had every event
//! ordered, gathered and row-encoded to learn which upserts open a version.
//! This kernel indexes each event as it arrives ([`EventIndex`]) with a
//! 48-bit hash of its tracked columns (the entry's tag), walks the sorted
//! index key by key with the rules of the sorted fold, comparing tracked
//! values by hash, and records what each event emits — itself as a hidden
//! event, the version it is the latest event of (the row whose values the
//! version shows) with its start and end, that version's change row — by
//! the event's place. A flow's rows are then gathered in key order, from
//! batches each put in key order as they arrived (so that the gather reads
//! every batch front to back, and the target stays clustered by key: a
//! later update reads a key's rows from few pages); a query's are emitted a
//! retained batch at a time, in arrival order (the batch's rows, taken).
//!
//! | event of a key, by sequence          | walk                                                           |
//! |--------------------------------------|----------------------------------------------------------------|
//! | same sequence as the last kept event | a replay: dropped (checked equal afterwards)                   |
//! | DELETE                               | closes the open version at its sequence; none open: a tombstone |
//! | UPSERT, no open version              | opens a version                                                |
//! | UPSERT, tracked hash equal to the version's latest event's | absorbed: the version's latest event (checked equal afterwards) |
//! | UPSERT, tracked hash different       | closes the open version at its sequence, opens a version       |
//!
//! A key with new events also gets its change rows: its versions before
//! this update (of its stored events alone) matched with those after by
//! start, as the sorted fold matches them; a version in both whose values
//! may differ is checked afterwards too.
//!
//! Hashes decide nothing alone: every pair the walk took as equal is
//! compared exactly once the walk is done ([`equal_pairs`]). A replay that
//! differs from its first copy is a conflict (the fold fails, as the sorted
//! fold does); an absorbed upsert that differs means two tracked values
//! hashed alike, and the partition is folded again by the sorted kernel
//! through an [`IndexSortedFold`] (tests force it with a hash mask). So is
//! a partition holding rows a DML statement wrote (erasure marks and edited
//! histories: rare, and the sorted kernel's rules).
//!
//! The kernel holds every event of its partition: the operator accounts for
//! [`IndexedScd2Fold::memory_size`] in the session's memory pool and, when
//! the pool refuses, hands the retained batches
//! ([`IndexedScd2Fold::into_batches`]) and the rest of its input to a
//! spilling sort and the sorted fold.

use std::sync::Arc;

use arrow::array::{
    make_array, Array, ArrayRef, AsArray, Int8Array, PrimitiveArray, RecordBatch, UInt32Array,
};
use arrow::buffer::NullBuffer;
use arrow::compute::{interleave_record_batch, take_record_batch};
use arrow::datatypes::{DataType, Int32Type, Int64Type, Int8Type, Schema, SchemaRef};
use arrow::row::RowConverter;
use datafusion::common::hash_utils::{create_hashes, RandomState};
use datafusion::common::{DataFusionError, Result};

use super::columns::{
    EventLayout, Kind, Origin, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE,
    STORED_DELETE_EVENT, STORED_UPSERT_EVENT,
};
use super::errors::{check_event_nulls, conflict_error};
use super::event_index::{EventIndex, IndexEntry};
use super::pairs::{equal_pairs, pair, Pair};
use super::retained::retained;
use super::rows::{encoded_width, row_converter};
use super::scd2::{scd2_output_schema, truncate_not_allowed};
use super::{FoldCounts, IndexSortedFold, Scd2Fold};

/// Widest row-format sequence this kernel keeps: a null byte and 8 bytes of
/// value, so that a sequence fits a `u64` ([`seq_bits`]).
const MAX_SEQ_BYTES: usize = 9;

/// What an event emits, as bits of [`BatchEmits::flags`]: itself, as a
/// hidden event ...
const EVENT: u8 = 1;
/// ... the version it is the latest event of ...
const VERSION: u8 = 2;
/// ... (which an event closed; otherwise the key's open version) ...
const CLOSED: u8 = 4;
/// ... and that version's change row: inserted, or the post-image of an
/// update.
const INSERTED: u8 = 8;
const POSTIMAGE: u8 = 16;
/// ... and the change row of the version before this update it was the
/// latest event of (in [`BatchEmits::before`]).
const BEFORE: u8 = 32;

/// The value bytes of an index entry's sequence (its row-format bytes after
/// the null byte; at most 8, see [`MAX_SEQ_BYTES`]), as a big-endian `u64`.
fn seq_bits(e: &IndexEntry) -> u64 {
    (e.seq >> 56) as u64
}

/// Indexed SCD 2 fold of one partition (see the module docs).
pub struct IndexedScd2Fold {
    flow: String,
    /// Emit versions only (see `FoldSpec::visible_only`).
    visible_only: bool,
    layout: EventLayout,
    tracked: Vec<usize>,
    /// Target columns and kind: what two copies of one event must share.
    value_columns: Vec<usize>,
    /// Non-key target columns: what tells two versions' values apart.
    visible_columns: Vec<usize>,
    input_schema: SchemaRef,
    output_schema: SchemaRef,
    hash_state: RandomState,
    /// Mask applied to tracked hashes (all bits; none in tests, to collide).
    tracked_hash_mask: u64,
    /// Tracked hashes of the batch being indexed (reused).
    hashes: Vec<u64>,
    seq_converter: RowConverter,
    /// Row-format width of the sequence, and the byte that starts every
    /// (non-NULL) sequence's encoding.
    seq_width: usize,
    seq_marker: u8,
    batches: Vec<RecordBatch>,
    /// What the events of each retained batch emit (sized with it).
    emits: Vec<BatchEmits>,
    retained_bytes: usize,
    index: EventIndex,
    /// A row written by a DML statement was pushed: the sorted kernel folds.
    dml_rows: bool,
    counts: FoldCounts,
    /// Next retained batch (a query's) or index entry (a flow's) to emit
    /// the rows of.
    next: usize,
    /// The partition folded by the sorted kernel instead.
    rerun: Option<Box<IndexSortedFold>>,
}

/// What the events of one retained batch emit, by row.
#[derive(Debug)]
struct BatchEmits {
    /// [`EVENT`], [`VERSION`], [`CLOSED`], [`INSERTED`], [`POSTIMAGE`],
    /// [`BEFORE`] ...
    flags: Vec<u8>,
    /// ... and for a version, its start and end sequences ([`seq_bits`]).
    start: Vec<u64>,
    end: Vec<u64>,
    /// Change rows of versions before this update (deleted, or pre-images)
    /// whose latest event is a row of the batch, by row once walked.
    before: Vec<BeforeRow>,
}

/// A change row of a version before this update.
#[derive(Debug, Clone, Copy)]
struct BeforeRow {
    row: u32,
    kind: i8,
    start: u64,
    end: Option<u64>,
}

impl BatchEmits {
    fn new(rows: usize) -> Self {
        Self {
            flags: vec![0; rows],
            start: vec![0; rows],
            end: vec![0; rows],
            before: Vec::new(),
        }
    }

    fn memory_size(&self) -> usize {
        self.flags.capacity()
            + (self.start.capacity() + self.end.capacity()) * 8
            + self.before.capacity() * std::mem::size_of::<BeforeRow>()
    }
}

/// A version of a key's history, as positions in its group of entries: the
/// event that opened it, its latest event, the event that closed it.
#[derive(Debug, Clone, Copy)]
struct Version {
    open: usize,
    last: usize,
    close: Option<usize>,
}

/// Pairs the walk took as equal (or whose difference decides a change
/// row), compared once it is done.
#[derive(Debug, Default)]
struct Checks {
    /// (kept event, its replay), and whether the kept one is stored.
    replays: Vec<(Pair, bool)>,
    /// (a version's latest event, the upsert it absorbed).
    absorbed: Vec<Pair>,
    /// (latest event before, latest event after) of a version in both
    /// histories with the same end: if their values differ, the old
    /// version's pre-image and the new one's post-image.
    updated: Vec<(Pair, BeforeRow)>,
}

/// Buffers of the walk, reused by every key.
#[derive(Debug, Default)]
struct Scratch {
    kept: Vec<usize>,
    stored: Vec<usize>,
    after: Vec<Version>,
    before: Vec<Version>,
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
    /// an [`EventIndex`] takes, with a sequence of at most 8 bytes.
    pub fn supports(layout: &EventLayout, input_schema: &Schema) -> bool {
        EventIndex::supports(layout, input_schema)
            && encoded_width([input_schema.field(layout.seq()).data_type()])
                .is_some_and(|w| w <= MAX_SEQ_BYTES)
    }

    /// Create a fold of events of `input_schema` (new events and a
    /// target's stored ones) into the rows of their keys' histories;
    /// `tracked` are the tracked target columns.
    pub fn try_new(
        flow: &str,
        layout: EventLayout,
        tracked: Vec<usize>,
        input_schema: &SchemaRef,
    ) -> Result<Self> {
        let seq_width = encoded_width([input_schema.field(layout.seq()).data_type()])
            .filter(|_| Self::supports(&layout, input_schema))
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "flow '{flow}': keys or sequence too wide for an indexed SCD 2 fold"
                ))
            })?;
        let value_columns = (0..layout.num_target())
            .chain([layout.kind()])
            .chain(layout.update_list())
            .collect();
        let visible_columns = (0..layout.num_target())
            .filter(|c| !layout.key_indices.contains(c))
            .collect();
        Ok(Self {
            flow: flow.to_string(),
            visible_only: false,
            index: EventIndex::try_new(flow, &layout, input_schema)?,
            seq_converter: row_converter(input_schema, &[layout.seq()])?,
            output_schema: scd2_output_schema(&layout, input_schema),
            input_schema: Arc::clone(input_schema),
            value_columns,
            visible_columns,
            tracked,
            layout,
            hash_state: RandomState::default(),
            tracked_hash_mask: u64::MAX,
            hashes: Vec::new(),
            seq_width,
            seq_marker: 0,
            batches: Vec::new(),
            emits: Vec::new(),
            retained_bytes: 0,
            dml_rows: false,
            counts: FoldCounts::default(),
            next: 0,
            rerun: None,
        })
    }

    /// Emit versions only: no hidden events or change rows (a fold read as
    /// rows).
    pub fn with_visible_only(mut self, visible_only: bool) -> Self {
        self.visible_only = visible_only;
        self
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

    /// TRUNCATE sequences (of this update or stored): none are allowed with
    /// SCD TYPE 2.
    pub fn observe_watermark(&self, sequences: &ArrayRef) -> Result<()> {
        match sequences.is_empty() {
            true => Ok(()),
            false => Err(truncate_not_allowed(&self.flow)),
        }
    }

    /// Bytes held: the retained batches, the index and what the events
    /// emit.
    pub fn memory_size(&self) -> usize {
        self.retained_bytes
            + self.index.memory_size()
            + self
                .emits
                .iter()
                .map(BatchEmits::memory_size)
                .sum::<usize>()
            + self.hashes.capacity() * 8
            + self.rerun.as_ref().map_or(0, |r| r.memory_size())
    }

    /// The retained event batches, in arrival order (to fold them another
    /// way when memory runs short).
    pub fn into_batches(self) -> Vec<RecordBatch> {
        self.batches
    }

    /// Index one batch of events (new and stored, any order) and hash its
    /// tracked columns.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let n = batch.num_rows();
        if n == 0 {
            return Ok(());
        }
        check_event_nulls(&self.flow, &self.layout, batch)?;
        let origins = batch
            .column(self.layout.origin())
            .as_primitive::<Int8Type>();
        self.dml_rows |= origins
            .values()
            .iter()
            .any(|&o| o != Origin::New as i8 && o != Origin::Stored as i8);
        self.counts.input_rows += self.index.push(batch, self.batches.len())?;
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
        self.emits.push(BatchEmits::new(n));
        // a flow's rows leave in key order: each batch is put in it now, so
        // that the gather then reads every batch front to back
        let batch = match self.visible_only {
            true => retained(batch)?,
            false => self.index.order_last(batch)?,
        };
        self.retained_bytes += batch.get_array_memory_size();
        self.batches.push(batch);
        Ok(())
    }

    /// Fold the index once every batch was pushed: sort it, walk every key
    /// group, then check the pairs taken as equal (a conflicting replay
    /// fails here, before any output; colliding tracked hashes, or rows a
    /// DML statement wrote, fold the partition with the sorted kernel).
    pub fn finish(&mut self) -> Result<()> {
        if self.dml_rows {
            return self.fold_sorted();
        }
        self.index.sort();
        if let Some(e) = self.index.entries().first() {
            self.seq_marker = (e.seq >> 120) as u8;
        }
        let mut checks = Checks::default();
        let mut scratch = Scratch::default();
        let mut start = 0;
        while start < self.index.len() {
            let end = self.index.group_end(start);
            let group = &self.index.entries()[start..end];
            let walk = Walk {
                group,
                visible_only: self.visible_only,
                emits: &mut self.emits,
                counts: &mut self.counts,
                checks: &mut checks,
            };
            walk.run(&mut scratch);
            start = end;
        }
        self.hashes = Vec::new();
        let same = equal_pairs(
            &self.batches,
            &checks.replays.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            &self.value_columns,
        )?;
        if let Some(i) = same.iter().position(|same| !same) {
            let ([_, _, b, r], stored) = checks.replays[i];
            return Err(conflict_error(
                &self.flow,
                &self.layout,
                &self.batches[b as usize],
                r as usize,
                stored,
            ));
        }
        let same = equal_pairs(&self.batches, &checks.absorbed, &self.tracked)?;
        if same.contains(&false) {
            return self.fold_sorted();
        }
        let pairs: Vec<Pair> = checks.updated.iter().map(|(p, _)| *p).collect();
        let same = equal_pairs(&self.batches, &pairs, &self.visible_columns)?;
        for ((pair, preimage), same) in checks.updated.into_iter().zip(same) {
            if !same {
                let [old_batch, old_row, batch, row] = pair;
                let old = &mut self.emits[old_batch as usize];
                old.before.push(preimage);
                old.flags[old_row as usize] |= BEFORE;
                self.emits[batch as usize].flags[row as usize] |= POSTIMAGE;
            }
        }
        for emits in &mut self.emits {
            emits.before.sort_unstable_by_key(|b| b.row);
        }
        if self.visible_only {
            // a query's rows leave in arrival order: the index is done
            self.index.clear();
        }
        Ok(())
    }

    /// Fold the retained events with the sorted kernel instead (see the
    /// module docs).
    fn fold_sorted(&mut self) -> Result<()> {
        let kernel = Scd2Fold::try_new(
            &self.flow,
            self.layout.clone(),
            self.tracked.clone(),
            None,
            &self.input_schema,
        )?
        .with_visible_only(self.visible_only);
        let mut fold = IndexSortedFold::try_new(
            &self.flow,
            &self.layout,
            &self.input_schema,
            Box::new(kernel),
        )?;
        for batch in std::mem::take(&mut self.batches) {
            fold.push(&batch)?;
        }
        fold.finish();
        self.index.clear();
        self.emits = Vec::new();
        self.retained_bytes = 0;
        self.rerun = Some(Box::new(fold));
        Ok(())
    }

    /// The next output batch, `None` at the end: the rows of about
    /// `batch_size` events in key order (a flow's: its target stays
    /// clustered by key), or those of the next retained batch (a query's;
    /// the batch is released).
    pub fn next_output(&mut self, batch_size: usize) -> Result<Option<RecordBatch>> {
        if let Some(rerun) = &mut self.rerun {
            return rerun.next_output(batch_size);
        }
        match self.visible_only {
            true => self.next_in_arrival_order(),
            false => self.next_in_key_order(batch_size),
        }
    }

    fn next_in_arrival_order(&mut self) -> Result<Option<RecordBatch>> {
        while self.next < self.batches.len() {
            let b = self.next;
            self.next += 1;
            let batch = std::mem::replace(
                &mut self.batches[b],
                RecordBatch::new_empty(Arc::clone(&self.input_schema)),
            );
            self.retained_bytes = self
                .retained_bytes
                .saturating_sub(batch.get_array_memory_size());
            let emits = std::mem::replace(&mut self.emits[b], BatchEmits::new(0));
            let kinds = batch.column(self.layout.kind()).as_primitive::<Int8Type>();
            let mut out = Rows::default();
            for (r, &kind) in kinds.values().iter().enumerate() {
                event_rows(&emits, r, r, kind, &mut out);
            }
            if out.rows.is_empty() {
                continue;
            }
            let in_order = out.rows.len() == batch.num_rows()
                && out.rows.iter().enumerate().all(|(i, &r)| i == r as usize);
            let source = match in_order {
                true => batch,
                false => {
                    let rows = UInt32Array::from(std::mem::take(&mut out.rows));
                    take_record_batch(&batch, &rows)?
                }
            };
            return self.assemble(&source, out).map(Some);
        }
        Ok(None)
    }

    fn next_in_key_order(&mut self, batch_size: usize) -> Result<Option<RecordBatch>> {
        let batch_size = batch_size.max(1);
        while self.next < self.index.len() {
            let last = (self.next + batch_size).min(self.index.len()) - 1;
            let end = self.index.group_end(last);
            // the window's events are gathered once, then taken as often as
            // each has rows (a take within the window is cache-local; an
            // event has up to four)
            let mut out = Rows::default();
            let mut events = Vec::with_capacity(end - self.next);
            for e in &self.index.entries()[self.next..end] {
                let b = e.batch as usize;
                let before = out.rows.len();
                let row = e.row as usize;
                event_rows(&self.emits[b], row, events.len(), e.kind, &mut out);
                if out.rows.len() > before {
                    events.push((b, row));
                }
            }
            self.next = end;
            if out.rows.is_empty() {
                continue;
            }
            let sources: Vec<&RecordBatch> = self.batches.iter().collect();
            let gathered = interleave_record_batch(&sources, &events)?;
            let rows = UInt32Array::from(std::mem::take(&mut out.rows));
            let source = take_record_batch(&gathered, &rows)?;
            return self.assemble(&source, out).map(Some);
        }
        // every row is out: free the events
        self.index.clear();
        self.batches = Vec::new();
        self.emits = Vec::new();
        self.retained_bytes = 0;
        Ok(None)
    }

    /// Output rows from `source`, holding the events of `out`'s rows in
    /// their order, and `out`'s kinds and sequences.
    fn assemble(&self, source: &RecordBatch, out: Rows) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = source.columns()[..self.layout.num_target()].to_vec();
        columns.push(self.decode(out.start)?);
        columns.push(self.decode(out.end)?);
        columns.push(Arc::clone(source.column(self.layout.seq())));
        columns.push(Arc::new(Int8Array::from(out.kinds)));
        columns.push(Arc::clone(source.column(self.layout.written_at())));
        if let Some(list) = self.layout.update_list() {
            columns.push(Arc::clone(source.column(list)));
        }
        Ok(RecordBatch::try_new(
            Arc::clone(&self.output_schema),
            columns,
        )?)
    }

    /// Sequences kept as [`seq_bits`], back as an array of the sequence's
    /// type: integers of 8 and 4 bytes (and the types stored as them:
    /// timestamps, dates, times, durations) directly, others through their
    /// row format.
    fn decode(&self, seqs: Seqs) -> Result<ArrayRef> {
        let data_type = self.input_schema.field(self.layout.seq()).data_type();
        let nulls = match seqs.valid.iter().all(|&v| v) {
            true => None,
            false => Some(NullBuffer::from(seqs.valid)),
        };
        // the row format flips a signed integer's sign bit, big-endian
        let values = match data_type.primitive_width() {
            Some(8) if data_type.is_signed_integer() || is_i64_backed(data_type) => {
                let v: Vec<i64> = seqs.bits.iter().map(|&b| (b ^ (1 << 63)) as i64).collect();
                Some(PrimitiveArray::<Int64Type>::new(v.into(), nulls.clone()).into_data())
            }
            Some(4) if data_type.is_signed_integer() || is_i32_backed(data_type) => {
                let v: Vec<i32> = seqs
                    .bits
                    .iter()
                    .map(|&b| (((b >> 32) as u32) ^ (1 << 31)) as i32)
                    .collect();
                Some(PrimitiveArray::<Int32Type>::new(v.into(), nulls.clone()).into_data())
            }
            _ => None,
        };
        if let Some(values) = values {
            let data = values.into_builder().data_type(data_type.clone()).build()?;
            return Ok(make_array(data));
        }
        let w = self.seq_width;
        let mut bytes = Vec::with_capacity(seqs.bits.len() * w);
        for s in &seqs.bits {
            bytes.push(self.seq_marker);
            bytes.extend_from_slice(&s.to_be_bytes()[..w - 1]);
        }
        let parser = self.seq_converter.parser();
        let rows = bytes.chunks_exact(w).map(|row| parser.parse(row));
        let decoded = self
            .seq_converter
            .convert_rows(rows)?
            .pop()
            .ok_or_else(|| DataFusionError::Internal("sequence decoded to no column".into()))?;
        match nulls {
            None => Ok(decoded),
            Some(nulls) => Ok(make_array(
                decoded
                    .into_data()
                    .into_builder()
                    .nulls(Some(nulls))
                    .build()?,
            )),
        }
    }
}

/// Types whose values are stored as `i64` (and encoded like it in rows).
fn is_i64_backed(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Timestamp(_, _) | DataType::Date64 | DataType::Time64(_) | DataType::Duration(_)
    )
}

/// Types whose values are stored as `i32` (and encoded like it in rows).
fn is_i32_backed(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Date32 | DataType::Time32(_))
}

/// Output rows, as they are listed: the event each shows (a row of the
/// batch they are taken from), its kind and sequences.
#[derive(Debug, Default)]
struct Rows {
    rows: Vec<u32>,
    kinds: Vec<i8>,
    start: Seqs,
    end: Seqs,
}

/// Sequences kept as [`seq_bits`], some NULL.
#[derive(Debug, Default)]
struct Seqs {
    bits: Vec<u64>,
    valid: Vec<bool>,
}

impl Seqs {
    fn push(&mut self, seq: Option<u64>) {
        self.bits.push(seq.unwrap_or_default());
        self.valid.push(seq.is_some());
    }
}

impl Rows {
    fn push(&mut self, row: usize, kind: i8, start: Option<u64>, end: Option<u64>) {
        self.rows.push(row as u32);
        self.kinds.push(kind);
        self.start.push(start);
        self.end.push(end);
    }
}

/// List the rows event `row` of `emits`' batch (of kind `kind`) emits,
/// each showing row `place` of the batch they are taken from: the event
/// itself as a hidden event, its version, the version's change row, the
/// change row of its version before this update.
fn event_rows(emits: &BatchEmits, row: usize, place: usize, kind: i8, out: &mut Rows) {
    let flags = emits.flags[row];
    if flags == 0 {
        return;
    }
    if flags & EVENT != 0 {
        let code = match kind == Kind::Delete as i8 {
            true => STORED_DELETE_EVENT,
            false => STORED_UPSERT_EVENT,
        };
        out.push(place, code, None, None);
    }
    let start = Some(emits.start[row]);
    let end = (flags & CLOSED != 0).then_some(emits.end[row]);
    if flags & VERSION != 0 {
        out.push(place, Kind::Upsert as i8, start, end);
    }
    if flags & INSERTED != 0 {
        out.push(place, CHANGE_INSERT, start, end);
    } else if flags & POSTIMAGE != 0 {
        out.push(place, CHANGE_POSTIMAGE, start, end);
    }
    if flags & BEFORE != 0 {
        let at = emits.before.binary_search_by_key(&(row as u32), |b| b.row);
        if let Ok(i) = at {
            let b = &emits.before[i];
            out.push(place, b.kind, Some(b.start), b.end);
        }
    }
}

/// The walk of one key's entries (in sequence order), recording what its
/// events emit (see the module docs).
struct Walk<'a> {
    group: &'a [IndexEntry],
    visible_only: bool,
    emits: &'a mut [BatchEmits],
    counts: &'a mut FoldCounts,
    checks: &'a mut Checks,
}

impl Walk<'_> {
    fn flag(&mut self, i: usize, bits: u8) {
        let e = &self.group[i];
        self.emits[e.batch as usize].flags[e.row as usize] |= bits;
    }

    fn run(mut self, scratch: &mut Scratch) {
        let group = self.group;
        let is_new = |i: usize| group[i].origin == Origin::New as i8;
        // 1. events: drop replays (checked later), keep every distinct one
        scratch.kept.clear();
        for (i, e) in group.iter().enumerate() {
            if let Some(&p) = scratch.kept.last().filter(|&&p| group[p].seq == e.seq) {
                let stored = group[p].origin != Origin::New as i8;
                self.checks.replays.push((pair(&group[p], e), stored));
                if is_new(i) {
                    self.counts.duplicates += 1;
                }
                continue;
            }
            scratch.kept.push(i);
            if !self.visible_only {
                self.flag(i, EVENT);
            }
            if is_new(i) {
                self.counts.events_added += 1;
            }
        }
        // 2. the history of every event, and what the new ones did
        self.versions(&scratch.kept, &mut scratch.after);
        for v in scratch.after.iter() {
            self.record(v, VERSION);
        }
        let mut closing_deletes = 0;
        for v in scratch.after.iter() {
            if let Some(c) = v.close {
                if is_new(c) && group[c].kind == Kind::Delete as i8 {
                    closing_deletes += 1;
                }
            }
        }
        let mut any_new = false;
        for &i in scratch.kept.iter().filter(|&&i| is_new(i)) {
            any_new = true;
            match group[i].kind == Kind::Delete as i8 {
                true => self.counts.tombstones += 1,
                false => self.counts.upserted += 1,
            }
        }
        self.counts.tombstones -= closing_deletes;
        self.counts.deleted += closing_deletes;
        if self.visible_only || !any_new {
            return;
        }
        // 3. the change rows: versions of the stored events alone matched
        // with those of all by start
        scratch.stored.clear();
        scratch
            .stored
            .extend(scratch.kept.iter().copied().filter(|&i| !is_new(i)));
        self.versions(&scratch.stored, &mut scratch.before);
        self.changes(&scratch.before, &scratch.after);
    }

    /// Fold events `list` (positions in the group, in sequence order) into
    /// `out`'s versions, comparing tracked values by hash.
    fn versions(&mut self, list: &[usize], out: &mut Vec<Version>) {
        let group = self.group;
        out.clear();
        let mut cur: Option<(usize, usize)> = None;
        for &i in list {
            if group[i].kind == Kind::Delete as i8 {
                if let Some((open, last)) = cur.take() {
                    out.push(Version {
                        open,
                        last,
                        close: Some(i),
                    });
                }
                continue;
            }
            cur = match cur {
                Some((open, last)) if group[last].tag() == group[i].tag() => {
                    self.checks.absorbed.push(pair(&group[last], &group[i]));
                    Some((open, i))
                }
                Some((open, last)) => {
                    out.push(Version {
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
            out.push(Version {
                open,
                last,
                close: None,
            });
        }
    }

    /// Record version `v` at its latest event, with `bits` ([`VERSION`] or
    /// a change row's).
    fn record(&mut self, v: &Version, bits: u8) {
        let (last, open) = (&self.group[v.last], &self.group[v.open]);
        let at = &mut self.emits[last.batch as usize];
        let row = last.row as usize;
        at.start[row] = seq_bits(open);
        match v.close {
            Some(c) => {
                at.flags[row] |= bits | CLOSED;
                at.end[row] = seq_bits(&self.group[c]);
            }
            None => at.flags[row] |= bits,
        }
    }

    /// A change row of version `v` before this update.
    fn before_row(&self, v: &Version, kind: i8) -> BeforeRow {
        BeforeRow {
            row: self.group[v.last].row,
            kind,
            start: seq_bits(&self.group[v.open]),
            end: v.close.map(|c| seq_bits(&self.group[c])),
        }
    }

    /// The change rows of a key from its versions `before` to `after`,
    /// matched by start: only before, deleted; only after, inserted; in
    /// both with another end, updated; with the same end, updated if the
    /// values differ (checked later).
    fn changes(&mut self, before: &[Version], after: &[Version]) {
        let group = self.group;
        let (mut o, mut n) = (0, 0);
        while o < before.len() || n < after.len() {
            let order = match (before.get(o), after.get(n)) {
                (Some(old), Some(new)) => group[old.open].seq.cmp(&group[new.open].seq),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            match order {
                std::cmp::Ordering::Less => {
                    let old = &before[o];
                    let row = self.before_row(old, CHANGE_DELETE);
                    self.emits[group[old.last].batch as usize].before.push(row);
                    self.flag(old.last, BEFORE);
                    o += 1;
                }
                std::cmp::Ordering::Greater => {
                    self.flag(after[n].last, INSERTED);
                    n += 1;
                }
                std::cmp::Ordering::Equal => {
                    let (old, new) = (&before[o], &after[n]);
                    let end = |v: &Version| v.close.map(|c| group[c].seq);
                    let preimage = self.before_row(old, CHANGE_PREIMAGE);
                    if end(old) != end(new) {
                        self.emits[group[old.last].batch as usize]
                            .before
                            .push(preimage);
                        self.flag(old.last, BEFORE);
                        self.flag(new.last, POSTIMAGE);
                    } else if old.last != new.last {
                        let pair = pair(&group[old.last], &group[new.last]);
                        self.checks.updated.push((pair, preimage));
                    }
                    o += 1;
                    n += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
