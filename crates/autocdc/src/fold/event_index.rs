//! A compact, sortable index of retained event batches: the indexed folds
//! order events by `(keys, seq, origin)` through it instead of sorting the
//! events themselves.
//!
//! One 32-byte entry per event holds the sequence's value bytes as a `u64`
//! (its row-format bytes without the null byte: they order alike), the key
//! likewise (fixed-width keys whose values take at most 8 bytes) or as a
//! 64-bit hash (strings, wider keys), the origin and kind, the event's place
//! (`batch:row`) and a 40-bit tag. Keys and sequences hold no nulls (the
//! folds reject them first; the index refuses them too), so every null byte
//! left out is the same. With hashed keys the row-format keys of every batch
//! are kept too, so that keys whose hashes collide are told apart:
//!
//! | keys                              | entry key          | after [`EventIndex::sort`]                          |
//! |-----------------------------------|--------------------|-----------------------------------------------------|
//! | fixed-width, values ≤ 8 bytes     | value bytes, `u64` | ordered by key, then sequence, then origin          |
//! | any other orderable type          | 64-bit hash        | grouped by key (groups in hash order), each by sequence, then origin |
//!
//! [`EventIndex::group_end`] then finds each key's events: a run of equal
//! entry keys, split by the row-format keys only where hashes collided.
//!
//! Inline keys whose values lie close together, as generated ids do, are
//! ordered by counting instead of comparing ([`super::key_slots`]): an
//! *order* of the entries' positions, grouped by key, each key's in the
//! order they were pushed, input partition after input partition (the
//! exchange interleaves the partitions' batches; each reads its range of
//! the source's files in order, and they are taken in the order their
//! first events are in sequence). The entries stay where they are:
//! [`EventIndex::window`] copies them out in that order a window at a time
//! and sorts only each key's run by sequence and origin — a few entries,
//! already in order when events arrive in sequence order. The order and the
//! counts are memory the caller grants ([`EventIndex::sort`]: an operator
//! asks its pool); refused, the entries are sorted in place.
//!
//! Either way the folds read the sorted entries through
//! [`EventIndex::window`] (whole key groups, at least so many entries) or a
//! [`GroupWalk`] (one key group at a time, each ordered as it is handed out).

use std::hash::BuildHasher;
use std::ops::Range;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use arrow::buffer::NullBuffer;
use arrow::compute::take_record_batch;
use arrow::datatypes::{DataType, Int8Type, Schema};
use arrow::row::{Row, RowConverter, Rows, SortField};
use datafusion::common::{DataFusionError, Result};

use super::columns::{EventLayout, Origin};
use super::errors::check_event_nulls;
use super::key_slots::{KeySpan, SlotPlan};
use super::rows::{decode_values, encode_values, row_converter, to_rows, ValueBytes};

/// One event in the index: key and sequence as integers that order like
/// their row-format bytes, its place, a 40-bit tag a fold may set
/// ([`EventIndex::tag_batch`]), then origin (stored first) and kind; 32
/// bytes.
#[derive(Debug, Clone, Copy)]
pub struct IndexEntry {
    pub key: u64,
    pub seq: u64,
    pub batch: u32,
    pub row: u32,
    tag_low: u32,
    tag_high: u8,
    pub origin: i8,
    pub kind: i8,
}

impl IndexEntry {
    /// Whether the event is a stored row (not a new event).
    pub fn stored(&self) -> bool {
        self.origin == Origin::Stored as i8
    }

    /// The tag (0 unless set).
    pub fn tag(&self) -> u64 {
        u64::from(self.tag_low) | (u64::from(self.tag_high) << 32)
    }

    /// Set the tag to the low 40 bits of `tag`.
    fn set_tag(&mut self, tag: u64) {
        self.tag_low = tag as u32;
        self.tag_high = (tag >> 32) as u8;
    }
}

/// How index entries hold keys (see the module docs).
#[derive(Debug)]
enum EntryKeys {
    /// As their value bytes.
    Inline(ValueBytes),
    /// As a hash, with the row-format keys of each indexed batch (to tell
    /// keys whose hashes collide apart).
    Hashed(Vec<Rows>),
}

/// The index of one partition's retained events (see the module docs).
#[derive(Debug)]
pub struct EventIndex {
    flow: String,
    /// The events' layout (the errors of a NULL key or sequence name its
    /// columns).
    layout: EventLayout,
    key_indices: Vec<usize>,
    seq: usize,
    origin: usize,
    kind: usize,
    key_converter: RowConverter,
    seq_converter: RowConverter,
    /// How entries hold keys (see the module docs).
    keys: EntryKeys,
    /// The value bytes of sequences, and their type.
    seq_bytes: ValueBytes,
    seq_type: DataType,
    /// Mask applied to key hashes (all bits; fewer in tests, to collide).
    key_hash_mask: u64,
    /// Whether two keys shared a hash (set by [`Self::sort`]).
    collided: bool,
    /// The origin of every entry pushed so far, while they share one
    /// (tracked as batches arrive, where their values are in the cache, so
    /// that a sort needs no pass of its own to learn it).
    one_origin: Option<i8>,
    entries: Vec<IndexEntry>,
    /// Where the entries of each input partition begin: `(source, first
    /// entry)`, once per run of batches from one source.
    sources: Vec<(u32, usize)>,
    /// After a counting sort: the entries' positions, grouped by key, keys
    /// in order (see the module docs).
    order: Option<Vec<u32>>,
    /// The least and greatest inline key pushed, and the bits set in any.
    key_span: Option<KeySpan>,
    /// Each pushed batch's entry keys and sequences, before they become
    /// entries (buffers reused from batch to batch).
    key_values: Vec<u64>,
    seq_values: Vec<u64>,
}

impl EventIndex {
    /// Whether events of `input_schema` can be indexed: a fixed-width
    /// sequence whose value takes at most 8 bytes, keys of any orderable
    /// type.
    pub fn supports(layout: &EventLayout, input_schema: &Schema) -> bool {
        let keys: Vec<SortField> = layout
            .key_indices
            .iter()
            .map(|&i| SortField::new(input_schema.field(i).data_type().clone()))
            .collect();
        ValueBytes::new([input_schema.field(layout.seq()).data_type()]).is_some()
            && RowConverter::supports_fields(&keys)
    }

    /// An empty index of events of `input_schema` laid out as `layout`.
    pub fn try_new(flow: &str, layout: &EventLayout, input_schema: &Schema) -> Result<Self> {
        let seq_bytes = ValueBytes::new([input_schema.field(layout.seq()).data_type()])
            .filter(|_| Self::supports(layout, input_schema))
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "flow '{flow}': keys or sequence too wide for an indexed fold"
                ))
            })?;
        let key_bytes = ValueBytes::new(
            layout
                .key_indices
                .iter()
                .map(|&i| input_schema.field(i).data_type()),
        );
        Ok(Self {
            flow: flow.to_string(),
            layout: layout.clone(),
            key_indices: layout.key_indices.clone(),
            seq: layout.seq(),
            origin: layout.origin(),
            kind: layout.kind(),
            key_converter: row_converter(input_schema, &layout.key_indices)?,
            seq_converter: row_converter(input_schema, &[layout.seq()])?,
            keys: match key_bytes {
                Some(bytes) => EntryKeys::Inline(bytes),
                None => EntryKeys::Hashed(Vec::new()),
            },
            seq_bytes,
            seq_type: input_schema.field(layout.seq()).data_type().clone(),
            key_hash_mask: u64::MAX,
            collided: false,
            one_origin: None,
            entries: Vec::new(),
            sources: Vec::new(),
            order: None,
            key_span: None,
            key_values: Vec::new(),
            seq_values: Vec::new(),
        })
    }

    /// Keep only `mask`'s bits of key hashes (tests: to make keys collide).
    #[cfg(test)]
    pub fn with_key_hash_mask(mut self, mask: u64) -> Self {
        self.key_hash_mask = mask;
        self
    }

    /// Whether keys are hashed (see the module docs).
    pub fn hashes_keys(&self) -> bool {
        matches!(self.keys, EntryKeys::Hashed(_))
    }

    /// `sequences` (of the sequence column's type, no nulls) as entries
    /// hold them: to compare with [`IndexEntry::seq`].
    pub fn sequence_values(&self, sequences: &ArrayRef) -> Result<Vec<u64>> {
        if sequences.data_type() != &self.seq_type {
            return Err(DataFusionError::Internal(format!(
                "flow '{}': sequences of type {} compared with a sequence of type {}",
                self.flow,
                sequences.data_type(),
                self.seq_type
            )));
        }
        self.refuse_nulls(sequences.as_ref(), "sequence")?;
        let mut out = Vec::with_capacity(sequences.len());
        if !encode_values(sequences.as_ref(), None, &mut out) {
            let rows = self
                .seq_converter
                .convert_columns(std::slice::from_ref(sequences))?;
            out.extend(rows.iter().map(|row| self.seq_bytes.bits(row.as_ref())));
        }
        Ok(out)
    }

    /// Sequences as entries hold them ([`Self::sequence_values`]), back as
    /// an array of the sequence's type with `nulls` (see [`decode_values`]).
    pub fn sequence_array(&self, bits: Vec<u64>, nulls: Option<NullBuffer>) -> Result<ArrayRef> {
        decode_values(&bits, &self.seq_type, &self.seq_converter, nulls)
    }

    /// An error if `column` holds a null (a key or sequence: the folds
    /// reject them before they reach the index, which leaves null bytes out).
    fn refuse_nulls(&self, column: &dyn Array, what: &str) -> Result<()> {
        if column.null_count() > 0 {
            return Err(DataFusionError::Internal(format!(
                "flow '{}': a null {what} reached the event index",
                self.flow
            )));
        }
        Ok(())
    }

    /// Index the rows of `batch`, the `b`-th batch retained; returns how
    /// many are new events (not stored rows).
    pub fn push(&mut self, batch: &RecordBatch, b: usize) -> Result<usize> {
        self.push_rows(batch, b, None, 0)
    }

    /// Index `rows` of `batch` (ascending positions; every row when
    /// `None`), the `b`-th batch retained, read by input partition
    /// `source`: entries point at their rows in the whole batch. Returns how
    /// many are new events (not stored rows).
    pub fn push_rows(
        &mut self,
        batch: &RecordBatch,
        b: usize,
        rows: Option<&[u32]>,
        source: u32,
    ) -> Result<usize> {
        let n = batch.num_rows();
        let too_many = |what: String| {
            DataFusionError::ResourcesExhausted(format!("flow '{}': {what}", self.flow))
        };
        let b =
            u32::try_from(b).map_err(|_| too_many("too many batches in one partition".into()))?;
        if u32::try_from(n).is_err() {
            return Err(too_many(format!("batch of {n} rows")));
        }
        if let Some(rows) = rows {
            if rows.iter().any(|&r| r as usize >= n) {
                return Err(DataFusionError::Internal(format!(
                    "flow '{}': a row past the end of a batch of {n} rows",
                    self.flow
                )));
            }
        }
        // (a fold that reads its events through the index meets them here
        // first: the error a NULL key or sequence is to users)
        check_event_nulls(&self.flow, &self.layout, batch)?;
        // the keys and sequences of the rows indexed (of `rows` alone: a
        // partition sharing batches with others encodes only its own)
        let count = rows.map_or(n, <[u32]>::len);
        let mut seqs = std::mem::take(&mut self.seq_values);
        seqs.clear();
        if !encode_values(batch.column(self.seq).as_ref(), rows, &mut seqs) {
            let encoded_rows = to_rows(&self.seq_converter, batch, &[self.seq])?;
            let seq_bytes = &self.seq_bytes;
            seqs.reserve(count);
            each_position(rows, n, |i| {
                seqs.push(seq_bytes.bits(encoded_rows.row(i).as_ref()))
            });
        }
        let mut keys = std::mem::take(&mut self.key_values);
        keys.clear();
        match &mut self.keys {
            EntryKeys::Hashed(key_rows) => {
                // (every row's key is kept: entries point into the whole batch)
                let encoded_rows = to_rows(&self.key_converter, batch, &self.key_indices)?;
                let hasher = datafusion::common::hash_utils::RandomState::default();
                let mask = self.key_hash_mask;
                keys.reserve(count);
                each_position(rows, n, |i| {
                    keys.push(hasher.hash_one(encoded_rows.row(i).as_ref()) & mask)
                });
                key_rows.push(encoded_rows);
            }
            EntryKeys::Inline(key_bytes) => {
                let from_values = match self.key_indices[..] {
                    [key] => encode_values(batch.column(key).as_ref(), rows, &mut keys),
                    _ => false,
                };
                if !from_values {
                    let encoded_rows = to_rows(&self.key_converter, batch, &self.key_indices)?;
                    keys.reserve(count);
                    each_position(rows, n, |i| {
                        keys.push(key_bytes.bits(encoded_rows.row(i).as_ref()))
                    });
                }
                self.key_span = KeySpan::join(self.key_span, KeySpan::of(&keys));
            }
        }
        let origins = batch
            .column(self.origin)
            .as_primitive::<Int8Type>()
            .values();
        let kinds = batch.column(self.kind).as_primitive::<Int8Type>().values();
        self.entries.reserve(keys.len());
        // what every row of the batch shares, its rows share
        if let Some(&first) = origins.first() {
            if self.entries.is_empty() {
                self.one_origin = Some(first);
            }
            if self
                .one_origin
                .is_some_and(|o| origins.iter().any(|&other| other != o))
            {
                self.one_origin = None;
            }
        }
        let before = self.entries.len();
        if self.sources.last().is_none_or(|&(s, _)| s != source) {
            self.sources.push((source, before));
        }
        let entry = |i: usize, (&key, &seq): (&u64, &u64)| IndexEntry {
            key,
            seq,
            batch: b,
            row: i as u32,
            tag_low: 0,
            tag_high: 0,
            origin: origins[i],
            kind: kinds[i],
        };
        let values = keys.iter().zip(&seqs);
        match rows {
            Some(rows) => self
                .entries
                .extend(rows.iter().zip(values).map(|(&r, e)| entry(r as usize, e))),
            None => self
                .entries
                .extend(values.enumerate().map(|(i, e)| entry(i, e))),
        }
        let new_events = self.entries[before..]
            .iter()
            .filter(|e| e.origin != Origin::Stored as i8 && e.origin != Origin::Implied as i8)
            .count();
        (self.key_values, self.seq_values) = (keys, seqs);
        Ok(new_events)
    }

    /// Tag the entries of the last batch pushed with `tags`, one per row
    /// (40 bits of each kept). Before [`Self::sort`] only.
    pub fn tag_batch(&mut self, tags: &[u64]) {
        let first = self.entries.len().saturating_sub(tags.len());
        for (e, &tag) in self.entries[first..].iter_mut().zip(tags) {
            e.set_tag(tag);
        }
    }

    /// [`Self::push`], then reorder `batch` by its entries' order (keys,
    /// sequence, origin) and return it reordered: the entries point into the
    /// reordered batch, which the caller retains instead. A gather in index
    /// order then reads each retained batch front to back, so the cache
    /// lines it loads serve the rows that follow.
    pub fn push_ordered(&mut self, batch: &RecordBatch, b: usize) -> Result<(RecordBatch, usize)> {
        let first = self.entries.len();
        let new_events = self.push(batch, b)?;
        let one_origin = self.one_origin.is_some();
        let entries = &mut self.entries[first..];
        order_entries(entries, one_origin);
        let order = UInt32Array::from_iter_values(entries.iter().map(|e| e.row));
        for (row, e) in entries.iter_mut().enumerate() {
            e.row = row as u32;
        }
        let ordered = take_record_batch(batch, &order)?;
        if let EntryKeys::Hashed(key_rows) = &mut self.keys {
            if let Some(rows) = key_rows.last_mut() {
                // the batch's keys, moved as its rows were (not encoded again)
                let mut moved = self.key_converter.empty_rows(rows.num_rows(), rows.size());
                for &r in order.values() {
                    moved.push(rows.row(r as usize));
                }
                *rows = moved;
            }
        }
        Ok((ordered, new_events))
    }

    /// The entries' positions as runs: each input partition's in the order
    /// they were pushed, the partitions in the order their first events
    /// are in sequence (the median sequence of each one's first run).
    ///
    /// Why: partitions read a source's files in ranges, and the exchange
    /// interleaves their batches as they come; a key's events then arrive
    /// out of sequence order, which the sort of each key's events (see
    /// [`Self::window`]) must undo. Pushed partition by partition, in the
    /// order of the ranges they read, they are mostly in order already.
    /// (Which partition reads which range is the scan's to decide: the
    /// partitions are ordered by their events, not by their numbers.)
    fn runs_by_source(&self) -> Vec<Range<usize>> {
        let ends = self.sources.iter().skip(1).map(|&(_, start)| start);
        let runs = self
            .sources
            .iter()
            .zip(ends.chain(std::iter::once(self.entries.len())))
            .map(|(&(source, start), end)| (source, start..end));
        // each run ranked by its partition: the median sequence of the
        // partition's first run, then its number
        let mut medians: Vec<(u32, u64)> = Vec::new();
        let mut seqs = Vec::new();
        let mut ranked: Vec<((u64, u32), Range<usize>)> = Vec::with_capacity(self.sources.len());
        for (source, run) in runs {
            let median = match medians.iter().find(|(s, _)| *s == source) {
                Some(&(_, median)) => median,
                None => {
                    seqs.clear();
                    seqs.extend(self.entries[run.clone()].iter().take(1024).map(|e| e.seq));
                    let middle = seqs.len() / 2;
                    let median = match seqs.is_empty() {
                        true => u64::MAX,
                        false => *seqs.select_nth_unstable(middle).1,
                    };
                    medians.push((source, median));
                    median
                }
            };
            ranked.push(((median, source), run));
        }
        ranked.sort_by_key(|(rank, _)| *rank);
        ranked.into_iter().map(|(_, run)| run).collect()
    }

    /// Bytes held: the entries and, with hashed keys, the row-format keys.
    pub fn memory_size(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<IndexEntry>()
            + self.sources.capacity() * std::mem::size_of::<(u32, usize)>()
            + self.order.as_ref().map_or(0, |o| o.capacity() * 4)
            + (self.key_values.capacity() + self.seq_values.capacity()) * 8
            + match &self.keys {
                EntryKeys::Hashed(rows) => rows.iter().map(Rows::size).sum(),
                EntryKeys::Inline(_) => 0,
            }
    }

    /// Number of events indexed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entries as pushed (tests).
    #[cfg(test)]
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Every entry in index order, once sorted (tests; folds read windows).
    #[cfg(test)]
    pub fn sorted_entries(&self) -> Vec<IndexEntry> {
        let mut all = Vec::new();
        self.window(0, usize::MAX, &mut all);
        all
    }

    /// Free the entries (the retained key rows stay until dropped).
    pub fn clear(&mut self) {
        self.entries = Vec::new();
        self.sources = Vec::new();
        self.order = None;
        self.key_span = None;
    }

    /// The row-format key of an entry (hashed keys only).
    fn key_of<'a>(key_rows: &'a [Rows], e: &IndexEntry) -> Row<'a> {
        key_rows[e.batch as usize].row(e.row as usize)
    }

    /// Bytes a counting sort would hold beside the entries (its order and
    /// counts, see the module docs), when the keys allow one (tests: what
    /// [`Self::sort`] asks for).
    #[cfg(test)]
    pub fn counting_scratch(&self) -> Option<usize> {
        self.counting_plan()
            .map(|plan| plan.scratch_bytes(self.entries.len()))
    }

    /// How a counting sort would place the entries' keys, when they allow
    /// one (inline keys only: hashes lie far apart).
    fn counting_plan(&self) -> Option<SlotPlan> {
        let EntryKeys::Inline(_) = self.keys else {
            return None;
        };
        SlotPlan::new(self.key_span?, self.entries.len())
    }

    /// Sort the entries by `(keys, seq, origin)` (read them with
    /// [`Self::window`]); with hashed keys, runs whose keys collide are
    /// ordered by the keys themselves, so that each key's events are
    /// contiguous. `scratch` is asked for the bytes of a counting sort (its
    /// order and counts) where the keys allow one; when it refuses, the
    /// entries are sorted in place.
    pub fn sort(&mut self, scratch: &mut dyn FnMut(usize) -> bool) {
        if let Some(plan) = self.counting_plan() {
            if scratch(plan.scratch_bytes(self.entries.len())) {
                let runs = self.runs_by_source();
                self.order = Some(plan.order_runs(&self.entries, &runs, |e| e.key));
                return;
            }
        }
        order_entries(&mut self.entries, self.one_origin.is_some());
        let EntryKeys::Hashed(key_rows) = &self.keys else {
            return;
        };
        let mut start = 0;
        while start < self.entries.len() {
            let hash = self.entries[start].key;
            let end = start
                + self.entries[start..]
                    .iter()
                    .position(|e| e.key != hash)
                    .unwrap_or(self.entries.len() - start);
            let first = Self::key_of(key_rows, &self.entries[start]);
            let run = &mut self.entries[start..end];
            if !run[1..].iter().all(|e| Self::key_of(key_rows, e) == first) {
                self.collided = true;
                run.sort_unstable_by(|a, b| {
                    Self::key_of(key_rows, a)
                        .cmp(&Self::key_of(key_rows, b))
                        .then(a.seq.cmp(&b.seq))
                        .then(a.origin.cmp(&b.origin))
                });
            }
            start = end;
        }
    }

    /// Copy the sorted entries from the `from`-th on into `window`: at
    /// least `at_least` of them (or all that are left), ending with a whole
    /// key group, each key's entries by sequence and origin. Returns where
    /// the next window starts ([`Self::len`] at the end).
    pub fn window(&self, from: usize, at_least: usize, window: &mut Vec<IndexEntry>) -> usize {
        let end = self.window_of_groups(from, at_least, window);
        if self.order.is_some() {
            for group in window.chunk_by_mut(|a, b| a.key == b.key) {
                order_group(group);
            }
        }
        end
    }

    /// [`Self::window`], but after a counting sort each key's entries are
    /// left in the order they were pushed ([`Self::order_group`] sorts one).
    fn window_of_groups(
        &self,
        from: usize,
        at_least: usize,
        window: &mut Vec<IndexEntry>,
    ) -> usize {
        window.clear();
        let n = self.entries.len();
        if from >= n {
            return n;
        }
        let last = from.saturating_add(at_least.max(1)).min(n) - 1;
        let Some(order) = &self.order else {
            let end = self.group_end(&self.entries, last);
            window.extend_from_slice(&self.entries[from..end]);
            return end;
        };
        let key = self.entries[order[last] as usize].key;
        let end = last
            + 1
            + order[last + 1..]
                .iter()
                .take_while(|&&p| self.entries[p as usize].key == key)
                .count();
        window.extend(order[from..end].iter().map(|&p| self.entries[p as usize]));
        end
    }

    /// Order one key's entries of a [`Self::window_of_groups`] by sequence
    /// and origin (after a sort in place they already are).
    fn order_group(&self, group: &mut [IndexEntry]) {
        if self.order.is_some() {
            order_group(group);
        }
    }

    /// End of the key group holding `entries[start]`, entries in index
    /// order (a [`Self::window`]): the entries after `start` of that group,
    /// then the end.
    pub fn group_end(&self, entries: &[IndexEntry], start: usize) -> usize {
        let key = entries[start].key;
        let same_entry_key = |e: &IndexEntry| e.key == key;
        let run = match (&self.keys, self.collided) {
            (EntryKeys::Hashed(key_rows), true) => {
                let first = Self::key_of(key_rows, &entries[start]);
                entries[start..]
                    .iter()
                    .position(|e| !same_entry_key(e) || Self::key_of(key_rows, e) != first)
            }
            _ => entries[start..].iter().position(|e| !same_entry_key(e)),
        };
        start + run.unwrap_or(entries.len() - start)
    }
}

/// Entries a [`GroupWalk`] copies out at a time ([`EventIndex::window`]):
/// 128 KiB, so that a window stays in the core's cache while it is walked.
const WALK_ENTRIES: usize = 4096;

/// The key groups of a sorted index, one after another, read a window at a
/// time ([`EventIndex::window`]) into a buffer of its own, so that a fold
/// may change itself while it holds a group.
#[derive(Debug, Default)]
pub struct GroupWalk {
    /// Where the next window starts.
    from: usize,
    window: Vec<IndexEntry>,
    /// Where the next group starts in the window.
    start: usize,
}

impl GroupWalk {
    /// The next key group of `index` (sorted), in index order, by sequence
    /// and origin; `None` after the last.
    pub fn next<'a>(&'a mut self, index: &EventIndex) -> Option<&'a [IndexEntry]> {
        if self.start >= self.window.len() {
            if self.from >= index.len() {
                return None;
            }
            self.from = index.window_of_groups(self.from, WALK_ENTRIES, &mut self.window);
            self.start = 0;
        }
        let end = index.group_end(&self.window, self.start);
        let group = &mut self.window[self.start..end];
        // (each group found once: ordered here, not again by a window)
        index.order_group(group);
        self.start = end;
        Some(group)
    }
}

/// One key's entries, pushed in any order, by sequence and origin (stable:
/// equal events keep the order they were pushed in).
fn order_group(group: &mut [IndexEntry]) {
    let by_seq = |e: &IndexEntry| (e.seq, e.origin);
    if !group.is_sorted_by_key(by_seq) {
        group.sort_by_key(by_seq);
    }
}

/// `f` of each of `rows` (every row `0..n` when `None`), in order.
fn each_position(rows: Option<&[u32]>, n: usize, mut f: impl FnMut(usize)) {
    match rows {
        Some(rows) => rows.iter().for_each(|&r| f(r as usize)),
        None => (0..n).for_each(f),
    }
}

/// Order `entries` by `(key, seq, origin)`, sorting one `u128` per entry
/// (key and sequence, 64 bits each) and then, unless every entry has the
/// same origin (`one_origin`), the rare runs of equal key and sequence by
/// origin.
fn order_entries(entries: &mut [IndexEntry], one_origin: bool) {
    let packed = |e: &IndexEntry| (u128::from(e.key) << 64) | u128::from(e.seq);
    entries.sort_unstable_by_key(packed);
    if one_origin {
        return;
    }
    let mut start = 0;
    while start < entries.len() {
        let at = packed(&entries[start]);
        let end = start
            + entries[start..]
                .iter()
                .position(|e| packed(e) != at)
                .unwrap_or(entries.len() - start);
        if end - start > 1 {
            entries[start..end].sort_unstable_by_key(|e| e.origin);
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, Int8Array, StringArray};
    use arrow::datatypes::{DataType, Field};
    use std::sync::Arc;

    #[test]
    fn entries_stay_32_bytes_and_tags_keep_40_bits() {
        assert_eq!(std::mem::size_of::<IndexEntry>(), 32);
        let mut e = IndexEntry {
            key: 0,
            seq: 0,
            batch: 0,
            row: 0,
            tag_low: 0,
            tag_high: 0,
            origin: 0,
            kind: 0,
        };
        e.set_tag(u64::MAX);
        assert_eq!(e.tag(), (1 << 40) - 1);
        e.set_tag(0x12_3456_789a);
        assert_eq!(e.tag(), 0x12_3456_789a);
    }

    fn layout() -> EventLayout {
        EventLayout {
            target_columns: vec!["id".into()],
            key_indices: vec![0],
            system_seq: false,
            update_list: false,
            sequence_groups: Vec::new(),
            group_sequences: false,
        }
    }

    /// Events keyed by `id` of type `key`, laid out as [`layout`] says.
    fn event_schema(key: DataType) -> Arc<Schema> {
        Arc::new(Schema::new(vec![
            Field::new("id", key, true),
            Field::new("__cdc_seq", DataType::Int64, true),
            Field::new("__cdc_kind", DataType::Int8, false),
            Field::new("__cdc_written_at", DataType::Int64, true),
            Field::new("__cdc_origin", DataType::Int8, false),
        ]))
    }

    /// Events `(key, seq)`, all new upserts, keys as strings (hashed).
    fn batch(events: &[(&str, i64)]) -> RecordBatch {
        let schema = event_schema(DataType::Utf8);
        let n = events.len();
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from_iter_values(events.iter().map(|e| e.0))),
                Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.1))),
                Arc::new(Int8Array::from(vec![0; n])),
                Arc::new(Int64Array::from(vec![0; n])),
                Arc::new(Int8Array::from(vec![Origin::New as i8; n])),
            ],
        )
        .unwrap()
    }

    /// The groups of the sorted index as `(batch, row)` lists.
    fn groups(index: &EventIndex) -> Vec<Vec<(u32, u32)>> {
        let sorted = index.sorted_entries();
        let mut out = Vec::new();
        let mut start = 0;
        while start < sorted.len() {
            let end = index.group_end(&sorted, start);
            out.push(
                sorted[start..end]
                    .iter()
                    .map(|e| (e.batch, e.row))
                    .collect(),
            );
            start = end;
        }
        out
    }

    /// Batches of two input partitions arrive interleaved; counted, each
    /// key's events are ordered partition by partition, the partition
    /// whose events come first in sequence first (whatever its number), so
    /// that the later sort by sequence finds them in order.
    #[test]
    fn a_keys_events_are_ordered_partition_by_partition() -> Result<()> {
        use arrow::array::Int32Array;
        let schema = event_schema(DataType::Int32);
        for later in [1u32, 0] {
            let mut next = crate::fold::test_support::below(3);
            let mut index = EventIndex::try_new("f", &layout(), &schema)?;
            let sources = [1u32, 0, 1, 0, 0, 1];
            // the partition `later` read the later half of the sequence
            let mut seq_of_source = [0i64, 0];
            seq_of_source[later as usize] = 1000;
            for (b, &source) in sources.iter().enumerate() {
                let n = 200;
                let ids: Vec<i32> = (0..n).map(|_| next(20) as i32).collect();
                let seqs: Vec<i64> = (0..n)
                    .map(|_| {
                        seq_of_source[source as usize] += 1;
                        seq_of_source[source as usize]
                    })
                    .collect();
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(Int32Array::from(ids)),
                    Arc::new(Int64Array::from(seqs)),
                    Arc::new(Int8Array::from(vec![0; n])),
                    Arc::new(Int64Array::from(vec![0; n])),
                    Arc::new(Int8Array::from(vec![Origin::New as i8; n])),
                ];
                let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
                index.push_rows(&batch, b, None, source)?;
            }
            index.sort(&mut |_| true);
            let order = index.order.clone().expect("counted");
            // in the order, each key's entries: the earlier partition's,
            // then the later one's, hence ascending sequences already
            let entries: Vec<IndexEntry> =
                order.iter().map(|&p| index.entries[p as usize]).collect();
            assert_eq!(entries.len(), 6 * 200);
            for group in entries.chunk_by(|a, b| a.key == b.key) {
                let in_order = group.windows(2).all(|w| w[0].seq < w[1].seq);
                assert!(in_order, "later: {later}, {group:?}");
            }
            // the index reads the same either way
            let sorted = index.sorted_entries();
            assert!(sorted
                .windows(2)
                .all(|w| (w[0].key, w[0].seq) < (w[1].key, w[1].seq)));
        }
        Ok(())
    }

    #[test]
    fn colliding_keys_form_separate_groups_each_by_sequence() -> Result<()> {
        let b0 = batch(&[("a", 3), ("b", 2), ("a", 1)]);
        let b1 = batch(&[("c", 5), ("b", 1), ("a", 2)]);
        let schema = b0.schema();
        for mask in [u64::MAX, 0] {
            let mut index = EventIndex::try_new("f", &layout(), &schema)?.with_key_hash_mask(mask);
            assert!(index.hashes_keys());
            assert_eq!(index.push(&b0, 0)?, 3);
            assert_eq!(index.push(&b1, 1)?, 3);
            index.sort(&mut |_| panic!("hashed keys are not counted"));
            let mut found = groups(&index);
            found.sort();
            // a: seq 1 (0:2), 2 (1:2), 3 (0:0); c; b: 1 (1:1), 2 (0:1)
            assert_eq!(
                found,
                vec![
                    vec![(0, 2), (1, 2), (0, 0)],
                    vec![(1, 0)],
                    vec![(1, 1), (0, 1)],
                ],
                "mask {mask:#x}"
            );
            assert_eq!(index.collided, mask == 0);
        }
        Ok(())
    }

    #[test]
    fn ordered_batches_are_indexed_where_they_were_moved() -> Result<()> {
        let b0 = batch(&[("b", 2), ("a", 3), ("b", 1), ("a", 1)]);
        let b1 = batch(&[("c", 5), ("a", 2)]);
        for mask in [u64::MAX, 0] {
            let mut index =
                EventIndex::try_new("f", &layout(), &b0.schema())?.with_key_hash_mask(mask);
            let (o0, new0) = index.push_ordered(&b0, 0)?;
            let (o1, _) = index.push_ordered(&b1, 1)?;
            assert_eq!(new0, 4);
            let ordered = [o0, o1];
            index.sort(&mut |_| panic!("hashed keys are not counted"));
            // each group: one key, sequences ascending, read from the
            // reordered batches
            let mut seen = Vec::new();
            for group in groups(&index) {
                let events: Vec<(String, i64)> = group
                    .iter()
                    .map(|&(b, r)| {
                        let batch = &ordered[b as usize];
                        let key = batch.column(0).as_string::<i32>().value(r as usize);
                        let seq = batch
                            .column(1)
                            .as_primitive::<arrow::datatypes::Int64Type>();
                        (key.to_string(), seq.value(r as usize))
                    })
                    .collect();
                seen.push(events);
            }
            seen.sort();
            let expected: Vec<Vec<(String, i64)>> = vec![
                vec![("a".into(), 1), ("a".into(), 2), ("a".into(), 3)],
                vec![("b".into(), 1), ("b".into(), 2)],
                vec![("c".into(), 5)],
            ];
            assert_eq!(seen, expected, "mask {mask:#x}");
        }
        Ok(())
    }

    /// The sorted index lists the events in the order of their values
    /// `(key, seq, origin)`, sorted here as plain integers: keys of both
    /// signs as one column or two (their value bytes joined), equal
    /// sequences of stored and new events, negative sequences; sorted by
    /// counting (one close key column), equal events keep the order they
    /// were pushed in.
    #[test]
    fn the_index_orders_events_by_key_sequence_and_origin() -> Result<()> {
        for counting in [false, true] {
            index_orders_events(counting)?;
        }
        Ok(())
    }

    fn index_orders_events(counting: bool) -> Result<()> {
        use arrow::array::{ArrayRef, Int16Array, Int32Array};
        let mut next = crate::fold::test_support::below(7);
        for composite in [false, true] {
            let mut fields = vec![
                Field::new("id", DataType::Int32, true),
                Field::new("__cdc_seq", DataType::Int64, true),
                Field::new("__cdc_kind", DataType::Int8, false),
                Field::new("__cdc_written_at", DataType::Int64, true),
                Field::new("__cdc_origin", DataType::Int8, false),
            ];
            let mut layout = layout();
            if composite {
                fields.insert(1, Field::new("part", DataType::Int16, true));
                layout.target_columns.push("part".into());
                layout.key_indices.push(1);
            }
            let schema = Arc::new(Schema::new(fields));
            let mut model = Vec::new();
            let mut index = EventIndex::try_new("f", &layout, &schema)?;
            assert!(!index.hashes_keys());
            for b in 0..4 {
                let n = 300;
                let ids: Vec<i32> = (0..n).map(|_| next(40) as i32 - 20).collect();
                let parts: Vec<i16> = (0..n).map(|_| next(3) as i16 - 1).collect();
                let seqs: Vec<i64> = (0..n).map(|_| next(30) as i64 - 15).collect();
                let origins: Vec<i8> = (0..n).map(|_| next(2) as i8).collect();
                for r in 0..n {
                    let part = if composite { parts[r] } else { 0 };
                    model.push((ids[r], part, seqs[r], origins[r]));
                }
                let mut columns: Vec<ArrayRef> = vec![
                    Arc::new(Int32Array::from(ids)),
                    Arc::new(Int64Array::from(seqs)),
                    Arc::new(Int8Array::from(vec![0; n])),
                    Arc::new(Int64Array::from(vec![0; n])),
                    Arc::new(Int8Array::from(origins)),
                ];
                if composite {
                    columns.insert(1, Arc::new(Int16Array::from(parts)));
                }
                index.push(&RecordBatch::try_new(Arc::clone(&schema), columns)?, b)?;
            }
            // 40 ids close together count; with the parts, too far apart
            assert_eq!(index.counting_scratch().is_some(), !composite);
            let mut asked = None;
            index.sort(&mut |bytes| {
                asked = Some(bytes);
                counting
            });
            assert_eq!(asked, index.counting_scratch());
            let pushed = |e: &IndexEntry| e.batch as usize * 300 + e.row as usize;
            let sorted = index.sorted_entries();
            let found: Vec<_> = sorted.iter().map(|e| model[pushed(e)]).collect();
            let what = format!("composite: {composite}, counting: {counting}");
            if counting && !composite {
                // stable: the push position last
                let at: Vec<_> = sorted.iter().map(pushed).collect();
                let mut by_push: Vec<_> = model.iter().copied().zip(0..).collect();
                by_push.sort();
                let expected: Vec<usize> = by_push.iter().map(|&(_, i)| i).collect();
                assert_eq!(at, expected, "{what}");
            }
            model.sort();
            assert_eq!(found, model, "{what}");
        }
        Ok(())
    }

    /// Windows of any size, read one after another, give the whole sorted
    /// index, each ending with a whole key group; sorted by counting or in
    /// place, by inline keys or hashed ones.
    #[test]
    fn windows_hold_whole_groups_and_together_the_index() -> Result<()> {
        use arrow::array::Int32Array;
        let keys = [3, 1, 3, 2, 1, 3, 5, 1, 3, 2];
        let seqs = [9, 4, 1, 2, 8, 5, 1, 6, 7, 3];
        let n = keys.len();
        let int_keys = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int32, true),
                Field::new("__cdc_seq", DataType::Int64, true),
                Field::new("__cdc_kind", DataType::Int8, false),
                Field::new("__cdc_written_at", DataType::Int64, true),
                Field::new("__cdc_origin", DataType::Int8, false),
            ])),
            vec![
                Arc::new(Int32Array::from(keys.to_vec())),
                Arc::new(Int64Array::from(seqs.to_vec())),
                Arc::new(Int8Array::from(vec![0; n])),
                Arc::new(Int64Array::from(vec![0; n])),
                Arc::new(Int8Array::from(vec![Origin::New as i8; n])),
            ],
        )?;
        let names: Vec<String> = keys.iter().map(|k| format!("k{k}")).collect();
        let string_keys = batch(
            &names
                .iter()
                .zip(seqs)
                .map(|(k, s)| (k.as_str(), s))
                .collect::<Vec<_>>(),
        );
        for (events, counting) in [(&int_keys, true), (&int_keys, false), (&string_keys, false)] {
            let mut index = EventIndex::try_new("f", &layout(), &events.schema())?;
            index.push(events, 0)?;
            index.sort(&mut |_| counting);
            let all = index.sorted_entries();
            let starts: Vec<usize> = (0..n)
                .filter(|&i| i == 0 || index.group_end(&all, i - 1) == i)
                .collect();
            for at_least in 1..=n + 1 {
                let (mut from, mut joined, mut window) = (0, Vec::new(), Vec::new());
                while from < index.len() {
                    let next = index.window(from, at_least, &mut window);
                    let what = format!("counting {counting}, windows of {at_least}, from {from}");
                    assert_eq!(next - from, window.len(), "{what}");
                    assert!(window.len() >= at_least.min(n - from), "{what}");
                    assert!(next == n || starts.contains(&next), "{what}");
                    joined.extend(window.iter().map(|e| (e.key, e.seq, e.row)));
                    from = next;
                }
                let expected: Vec<_> = all.iter().map(|e| (e.key, e.seq, e.row)).collect();
                assert_eq!(
                    joined, expected,
                    "counting {counting}, windows of {at_least}"
                );
            }
            // a walk gives the same entries, group by group
            let (mut walk, mut walked) = (GroupWalk::default(), Vec::new());
            while let Some(group) = walk.next(&index) {
                assert_eq!(index.group_end(group, 0), group.len());
                walked.extend(group.iter().map(|e| (e.key, e.seq, e.row)));
            }
            let expected: Vec<_> = all.iter().map(|e| (e.key, e.seq, e.row)).collect();
            assert_eq!(walked, expected, "counting {counting}");
            // each key's sequences ascend
            for w in all.windows(2) {
                assert!(w[0].key != w[1].key || w[0].seq < w[1].seq);
            }
        }
        Ok(())
    }

    /// Keys far apart for their number, hashed keys and an empty index are
    /// sorted in place: no scratch is asked for.
    #[test]
    fn only_close_inline_keys_are_sorted_by_counting() -> Result<()> {
        let schema = event_schema(DataType::Int64);
        let events = |ids: Vec<i64>| -> Result<RecordBatch> {
            let n = ids.len();
            Ok(RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(Int64Array::from(vec![1; n])),
                    Arc::new(Int8Array::from(vec![0; n])),
                    Arc::new(Int64Array::from(vec![0; n])),
                    Arc::new(Int8Array::from(vec![Origin::New as i8; n])),
                ],
            )?)
        };
        let index_of = |ids: Vec<i64>| -> Result<EventIndex> {
            let mut index = EventIndex::try_new("f", &layout(), &schema)?;
            index.push(&events(ids)?, 0)?;
            Ok(index)
        };
        // an order of the entries, and the counts
        let close = index_of(vec![-3, 5, 7_000_000, 7_000_001])?;
        assert_eq!(close.counting_scratch(), None);
        // one slot per value between the least and the greatest key
        let ids: Vec<i64> = (0..3000).map(|i| 7_000_001 + 4 * i).collect();
        assert_eq!(
            index_of(ids)?.counting_scratch(),
            Some(4 * (3000 + 4 * 2999 + 1))
        );
        // ... of those keys can take: all are multiples of 4 here
        let ids: Vec<i64> = (0..3000).map(|i| 7_000_000 + 4 * i).collect();
        assert_eq!(index_of(ids)?.counting_scratch(), Some(4 * (3000 + 3000)));
        // too many slots for the entries
        let ids: Vec<i64> = (0..3000).map(|i| 7_000_001 + 5 * i).collect();
        assert_eq!(index_of(ids)?.counting_scratch(), None);
        let mut empty = EventIndex::try_new("f", &layout(), &schema)?;
        assert_eq!(empty.counting_scratch(), None);
        empty.sort(&mut |_| panic!("no scratch for an empty index"));
        let hashed = EventIndex::try_new("f", &layout(), &batch(&[("a", 1)]).schema())?;
        assert_eq!(hashed.counting_scratch(), None);
        Ok(())
    }

    /// Indexing some rows of a batch gives the entries that indexing the
    /// whole batch gives those rows, whichever way keys and sequences are
    /// encoded: from their values (integers), through the row format
    /// (floats), or hashed (strings); rows past the end, and null keys and
    /// sequences, are refused.
    #[test]
    fn some_rows_are_indexed_as_the_whole_batch_indexes_them() -> Result<()> {
        use arrow::array::{ArrayRef, Float32Array, Float64Array, Int32Array};
        let ids: [ArrayRef; 3] = [
            Arc::new(Int32Array::from(vec![4, -1, 7, 2, 9])),
            Arc::new(Float32Array::from(vec![4.5, -1.0, 7.0, 2.25, 9.0])),
            Arc::new(StringArray::from(vec!["d", "a", "g", "b", "i"])),
        ];
        let seqs: [ArrayRef; 2] = [
            Arc::new(Int64Array::from(vec![5, 3, 8, 1, 2])),
            Arc::new(Float64Array::from(vec![5.0, -3.5, 8.0, 1.0, 2.0])),
        ];
        let rows = [3u32, 1, 4];
        let (stored, new) = (Origin::Stored as i8, Origin::New as i8);
        let fields = |e: &IndexEntry| (e.key, e.seq, e.origin, e.kind, e.batch, e.row);
        for id in &ids {
            for seq in &seqs {
                let mut columns = event_schema(id.data_type().clone()).fields().to_vec();
                columns[1] = Arc::new(Field::new("__cdc_seq", seq.data_type().clone(), true));
                let schema = Arc::new(Schema::new(columns));
                let batch = RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::clone(id),
                        Arc::clone(seq),
                        Arc::new(Int8Array::from(vec![0, 1, 0, 1, 0])),
                        Arc::new(Int64Array::from(vec![0; 5])),
                        Arc::new(Int8Array::from(vec![stored, stored, new, new, stored])),
                    ],
                )?;
                let mut whole = EventIndex::try_new("f", &layout(), &schema)?;
                whole.push(&batch, 0)?;
                let expected: Vec<_> = rows
                    .iter()
                    .map(|&r| fields(&whole.entries()[r as usize]))
                    .collect();
                let mut some = EventIndex::try_new("f", &layout(), &schema)?;
                // of rows 3, 1, 4 only row 3 is new
                assert_eq!(some.push_rows(&batch, 0, Some(&rows), 0)?, 1);
                let found: Vec<_> = some.entries().iter().map(fields).collect();
                assert_eq!(found, expected, "{} / {}", id.data_type(), seq.data_type());
                assert!(some.push_rows(&batch, 1, Some(&[5]), 0).is_err());
                // a null key or sequence, even in a row not indexed
                for column in [0, 1] {
                    let mut with_null = batch.columns().to_vec();
                    let valid =
                        arrow::buffer::NullBuffer::from(vec![true, true, true, true, false]);
                    with_null[column] = arrow::array::make_array(
                        with_null[column]
                            .to_data()
                            .into_builder()
                            .nulls(Some(valid))
                            .build()?,
                    );
                    let with_null = RecordBatch::try_new(Arc::clone(&schema), with_null)?;
                    let before = some.len();
                    assert!(some.push_rows(&with_null, 1, Some(&rows[..1]), 0).is_err());
                    assert_eq!(some.len(), before);
                }
            }
        }
        Ok(())
    }

    /// Sequences compared with the entries' (a truncate watermark) are
    /// encoded as the entries hold them; another type, or a null, is
    /// refused.
    #[test]
    fn sequence_values_compare_like_the_entries() -> Result<()> {
        use arrow::array::{ArrayRef, Int32Array};
        let b0 = batch(&[("a", -7), ("b", 0), ("c", 40)]);
        let mut index = EventIndex::try_new("f", &layout(), &b0.schema())?;
        index.push(&b0, 0)?;
        let seqs: Vec<u64> = index.entries().iter().map(|e| e.seq).collect();
        let same: ArrayRef = Arc::new(Int64Array::from(vec![-7, 0, 40]));
        assert_eq!(index.sequence_values(&same)?, seqs);
        let between: ArrayRef = Arc::new(Int64Array::from(vec![-1, 39]));
        let between = index.sequence_values(&between)?;
        assert!(seqs[0] < between[0] && between[0] < seqs[1]);
        assert!(seqs[1] < between[1] && between[1] < seqs[2]);
        let other: ArrayRef = Arc::new(Int32Array::from(vec![0]));
        assert!(index.sequence_values(&other).is_err());
        let null: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None]));
        assert!(index.sequence_values(&null).is_err());
        Ok(())
    }
}
