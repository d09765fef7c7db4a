//! A compact, sortable index of retained event batches: the indexed folds
//! order events by `(keys, seq, origin)` through it instead of sorting the
//! events themselves.
//!
//! One 48-byte entry per event holds the sequence as an integer that orders
//! like its Arrow row-format bytes, the key likewise (fixed-width keys up to
//! 16 bytes) or as a 64-bit hash (strings, wide composites), the origin and
//! kind, and the event's place (`batch:row`). With hashed keys the row-format
//! keys of every batch are kept too, so that keys whose hashes collide are
//! told apart:
//!
//! | keys                          | entry key                  | after [`EventIndex::sort`]                          |
//! |-------------------------------|----------------------------|-----------------------------------------------------|
//! | fixed-width, ≤ 16 bytes       | row-format bytes as `u128` | ordered by key, then sequence, then origin          |
//! | any other orderable type      | 64-bit hash                | grouped by key (groups in hash order), each by sequence, then origin |
//!
//! [`EventIndex::group_end`] then finds each key's events: a run of equal
//! entry keys, split by the row-format keys only where hashes collided.

use std::hash::BuildHasher;

use arrow::array::{AsArray, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{Int8Type, Schema};
use arrow::row::{Row, RowConverter, Rows, SortField};
use datafusion::common::{DataFusionError, Result};

use super::columns::{EventLayout, Origin};
use super::rows::{
    encode_values, encoded, encoded_width, row_converter, to_rows, MAX_ENCODED_BYTES,
};

/// Widest row-format key or sequence an entry sorts as 64 bits: a null
/// byte and 8 bytes of value (see [`EventIndex::sort`]).
const PACKED_BYTES: usize = 9;

/// One event in the index: key and sequence as integers that order like
/// their row-format bytes, then origin (stored first), kind and place, and
/// a 48-bit tag a fold may set ([`EventIndex::tag_batch`]; in the padding
/// of the 48-byte entry).
#[derive(Debug, Clone, Copy)]
pub struct IndexEntry {
    pub key: u128,
    pub seq: u128,
    pub origin: i8,
    pub kind: i8,
    pub batch: u32,
    pub row: u32,
    tag_low: u32,
    tag_high: u16,
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

    /// Set the tag to the low 48 bits of `tag`.
    fn set_tag(&mut self, tag: u64) {
        self.tag_low = tag as u32;
        self.tag_high = (tag >> 32) as u16;
    }
}

/// The index of one partition's retained events (see the module docs).
#[derive(Debug)]
pub struct EventIndex {
    flow: String,
    key_indices: Vec<usize>,
    seq: usize,
    origin: usize,
    kind: usize,
    key_converter: RowConverter,
    seq_converter: RowConverter,
    /// Row-format keys of each indexed batch, when keys are hashed.
    key_rows: Option<Vec<Rows>>,
    /// Mask applied to key hashes (all bits; fewer in tests, to collide).
    key_hash_mask: u64,
    /// Whether two keys shared a hash (set by [`Self::sort`]).
    collided: bool,
    /// Whether an entry's key and sequence each fit 64 bits (see
    /// [`sort_packed`]): hashed or inline keys, and sequences, of at most 8
    /// bytes behind their null byte.
    packable: bool,
    /// What the entries pushed so far share (see [`Shared`]).
    shared: Shared,
    entries: Vec<IndexEntry>,
    /// Each pushed batch's entry keys and sequences, before they become
    /// entries (buffers reused from batch to batch).
    key_values: Vec<u128>,
    seq_values: Vec<u128>,
}

impl EventIndex {
    /// Whether events of `input_schema` can be indexed: a fixed-width
    /// sequence of at most 16 bytes in row format, keys of any orderable type.
    pub fn supports(layout: &EventLayout, input_schema: &Schema) -> bool {
        let seq = encoded_width([input_schema.field(layout.seq()).data_type()]);
        let keys: Vec<SortField> = layout
            .key_indices
            .iter()
            .map(|&i| SortField::new(input_schema.field(i).data_type().clone()))
            .collect();
        seq.is_some_and(|w| w <= MAX_ENCODED_BYTES) && RowConverter::supports_fields(&keys)
    }

    /// Whether the keys fit an entry as they are (otherwise they are hashed).
    fn inline_keys(layout: &EventLayout, input_schema: &Schema) -> bool {
        encoded_width(
            layout
                .key_indices
                .iter()
                .map(|&i| input_schema.field(i).data_type()),
        )
        .is_some_and(|w| w <= MAX_ENCODED_BYTES)
    }

    /// An empty index of events of `input_schema` laid out as `layout`.
    pub fn try_new(flow: &str, layout: &EventLayout, input_schema: &Schema) -> Result<Self> {
        if !Self::supports(layout, input_schema) {
            return Err(DataFusionError::Internal(format!(
                "flow '{flow}': keys or sequence too wide for an indexed fold"
            )));
        }
        let hashed = !Self::inline_keys(layout, input_schema);
        let fits_64_bits = |columns: &[usize]| {
            encoded_width(columns.iter().map(|&i| input_schema.field(i).data_type()))
                .is_some_and(|w| w <= PACKED_BYTES)
        };
        Ok(Self {
            flow: flow.to_string(),
            key_indices: layout.key_indices.clone(),
            seq: layout.seq(),
            origin: layout.origin(),
            kind: layout.kind(),
            key_converter: row_converter(input_schema, &layout.key_indices)?,
            seq_converter: row_converter(input_schema, &[layout.seq()])?,
            key_rows: hashed.then(Vec::new),
            packable: (hashed || fits_64_bits(&layout.key_indices))
                && fits_64_bits(&[layout.seq()]),
            key_hash_mask: u64::MAX,
            collided: false,
            shared: Shared::default(),
            entries: Vec::new(),
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
        self.key_rows.is_some()
    }

    /// The sequence converter (row format of the sequence column).
    pub fn seq_converter(&self) -> &RowConverter {
        &self.seq_converter
    }

    /// Index the rows of `batch`, the `b`-th batch retained; returns how
    /// many are new events (not stored rows).
    pub fn push(&mut self, batch: &RecordBatch, b: usize) -> Result<usize> {
        self.push_rows(batch, b, None)
    }

    /// Index `rows` of `batch` (ascending positions; every row when
    /// `None`), the `b`-th batch retained: entries point at their rows in
    /// the whole batch. Returns how many are new events (not stored rows).
    pub fn push_rows(
        &mut self,
        batch: &RecordBatch,
        b: usize,
        rows: Option<&[u32]>,
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
        // the keys and sequences of the rows indexed (of `rows` alone: a
        // partition sharing batches with others encodes only its own)
        let mut seqs = std::mem::take(&mut self.seq_values);
        seqs.clear();
        if !encode_values(batch.column(self.seq).as_ref(), rows, &mut seqs) {
            let encoded_rows = to_rows(&self.seq_converter, batch, &[self.seq])?;
            seqs.reserve(rows.map_or(n, <[u32]>::len));
            each_position(rows, n, |i| seqs.push(encoded(&encoded_rows, i)));
        }
        let mut keys = std::mem::take(&mut self.key_values);
        keys.clear();
        if let Some(key_rows) = &mut self.key_rows {
            // (every row's key is kept: entries point into the whole batch)
            let encoded_rows = to_rows(&self.key_converter, batch, &self.key_indices)?;
            let hasher = datafusion::common::hash_utils::RandomState::default();
            let mask = self.key_hash_mask;
            keys.reserve(rows.map_or(n, <[u32]>::len));
            each_position(rows, n, |i| {
                keys.push(u128::from(
                    hasher.hash_one(encoded_rows.row(i).as_ref()) & mask,
                ))
            });
            key_rows.push(encoded_rows);
        } else {
            let from_values = match self.key_indices[..] {
                [key] => encode_values(batch.column(key).as_ref(), rows, &mut keys),
                _ => false,
            };
            if !from_values {
                let encoded_rows = to_rows(&self.key_converter, batch, &self.key_indices)?;
                keys.reserve(rows.map_or(n, <[u32]>::len));
                each_position(rows, n, |i| keys.push(encoded(&encoded_rows, i)));
            }
        }
        let origins = batch
            .column(self.origin)
            .as_primitive::<Int8Type>()
            .values();
        let kinds = batch.column(self.kind).as_primitive::<Int8Type>().values();
        self.entries.reserve(keys.len());
        // what every row of the batch shares, its rows share
        self.shared
            .observe(self.entries.is_empty(), &keys, &seqs, origins);
        let before = self.entries.len();
        let entry = |i: usize, (&key, &seq): (&u128, &u128)| IndexEntry {
            key,
            seq,
            origin: origins[i],
            kind: kinds[i],
            batch: b,
            row: i as u32,
            tag_low: 0,
            tag_high: 0,
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
            .filter(|e| e.origin != Origin::Stored as i8)
            .count();
        (self.key_values, self.seq_values) = (keys, seqs);
        Ok(new_events)
    }

    /// Tag the entries of the last batch pushed with `tags`, one per row
    /// (48 bits of each kept). Before [`Self::sort`] only.
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
        let packing = self.packing();
        let entries = &mut self.entries[first..];
        order_entries(entries, packing);
        let order = UInt32Array::from_iter_values(entries.iter().map(|e| e.row));
        for (row, e) in entries.iter_mut().enumerate() {
            e.row = row as u32;
        }
        let ordered = take_record_batch(batch, &order)?;
        if let Some(key_rows) = &mut self.key_rows {
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

    /// Bytes held: the entries and, with hashed keys, the row-format keys.
    pub fn memory_size(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<IndexEntry>()
            + (self.key_values.capacity() + self.seq_values.capacity()) * 16
            + self
                .key_rows
                .as_ref()
                .map_or(0, |rows| rows.iter().map(Rows::size).sum())
    }

    /// Number of events indexed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entries (in `(keys, seq, origin)` order once sorted).
    pub fn entries(&self) -> &[IndexEntry] {
        &self.entries
    }

    /// Free the entries (the retained key rows stay until dropped).
    pub fn clear(&mut self) {
        self.entries = Vec::new();
    }

    /// How entries sort packed (see [`sort_packed`]), if they can: whether
    /// keys are hashed, and whether every entry has the same origin.
    fn packing(&self) -> Option<Packing> {
        (self.packable && self.shared.null_bytes.is_some()).then(|| Packing {
            hashed: self.key_rows.is_some(),
            one_origin: self.shared.origin.is_some(),
        })
    }

    /// The row-format key of an entry (hashed keys only).
    fn key_of<'a>(key_rows: &'a [Rows], e: &IndexEntry) -> Row<'a> {
        key_rows[e.batch as usize].row(e.row as usize)
    }

    /// Sort the entries by `(keys, seq, origin)`; with hashed keys, runs
    /// whose keys collide are ordered by the keys themselves, so that each
    /// key's events are contiguous.
    pub fn sort(&mut self) {
        // (a stable sort, merging the runs of `push_ordered`, was slower and
        // needs half the entries again: benches/README.md, "tried")
        let packing = self.packing();
        order_entries(&mut self.entries, packing);
        let Some(key_rows) = &self.key_rows else {
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

    /// End of the key group holding entry `start` of the sorted index (the
    /// entries after `start` of that group, then the end).
    pub fn group_end(&self, start: usize) -> usize {
        let entries = &self.entries;
        let key = entries[start].key;
        let same_entry_key = |e: &IndexEntry| e.key == key;
        let run = match (&self.key_rows, self.collided) {
            (Some(key_rows), true) => {
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

/// `f` of each of `rows` (every row `0..n` when `None`), in order.
fn each_position(rows: Option<&[u32]>, n: usize, mut f: impl FnMut(usize)) {
    match rows {
        Some(rows) => rows.iter().for_each(|&r| f(r as usize)),
        None => (0..n).for_each(f),
    }
}

/// What every entry pushed so far shares, while it does: the null bytes of
/// its key and sequence (hashed keys have none: 0), and its origin. Tracked
/// as batches arrive, where their values are in the cache, so that a sort
/// needs no pass of its own to learn it.
#[derive(Debug, Clone, Copy, Default)]
struct Shared {
    /// The key's and the sequence's first byte, if the same in every entry.
    null_bytes: Option<(u8, u8)>,
    /// The origin, if the same in every entry.
    origin: Option<i8>,
}

impl Shared {
    /// Account for one batch's entry keys, sequences and origins; `first`:
    /// no entry came before them.
    fn observe(&mut self, first: bool, keys: &[u128], seqs: &[u128], origins: &[i8]) {
        let null_byte = |v: &u128| (v >> 120) as u8;
        let (Some(key), Some(seq), Some(&origin)) = (keys.first(), seqs.first(), origins.first())
        else {
            return;
        };
        if first {
            *self = Self {
                null_bytes: Some((null_byte(key), null_byte(seq))),
                origin: Some(origin),
            };
        }
        if let Some((key, seq)) = self.null_bytes {
            if !(keys.iter().all(|k| null_byte(k) == key)
                && seqs.iter().all(|s| null_byte(s) == seq))
            {
                self.null_bytes = None;
            }
        }
        if self
            .origin
            .is_some_and(|o| origins.iter().any(|&other| other != o))
        {
            self.origin = None;
        }
    }
}

/// How a packed sort applies (see [`EventIndex::packing`]).
#[derive(Debug, Clone, Copy)]
struct Packing {
    hashed: bool,
    one_origin: bool,
}

/// Order `entries` by `(key, seq, origin)`: packed where `packing` allows,
/// else by the tuple.
fn order_entries(entries: &mut [IndexEntry], packing: Option<Packing>) {
    match packing {
        Some(Packing { hashed, one_origin }) => sort_packed(entries, hashed, one_origin),
        None => entries.sort_unstable_by_key(|e| (e.key, e.seq, e.origin)),
    }
}

/// Order `entries` by `(key, seq, origin)` as [`EventIndex::sort`] does,
/// sorting one `u128` per entry instead of a `(u128, u128, i8)`: key and
/// sequence packed, 64 bits each (hashed keys are their low 64 bits, inline
/// keys and sequences the 8 bytes after their null byte), then, unless
/// every entry has the same origin, the rare runs of equal key and sequence
/// by origin. Applies where they fit (`EventIndex::packable`) and every
/// inline key and every sequence starts with the same null byte
/// ([`Shared`]), so that the bytes left out are equal.
fn sort_packed(entries: &mut [IndexEntry], hashed: bool, one_origin: bool) {
    let key = |e: &IndexEntry| {
        if hashed {
            e.key as u64
        } else {
            (e.key >> 56) as u64
        }
    };
    let packed = |e: &IndexEntry| (u128::from(key(e)) << 64) | u128::from((e.seq >> 56) as u64);
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
    fn entries_stay_48_bytes_and_tags_keep_48_bits() {
        assert_eq!(std::mem::size_of::<IndexEntry>(), 48);
        let mut e = IndexEntry {
            key: 0,
            seq: 0,
            origin: 0,
            kind: 0,
            batch: 0,
            row: 0,
            tag_low: 0,
            tag_high: 0,
        };
        e.set_tag(u64::MAX);
        assert_eq!(e.tag(), (1 << 48) - 1);
        e.set_tag(0x1234_5678_9abc);
        assert_eq!(e.tag(), 0x1234_5678_9abc);
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
        let mut out = Vec::new();
        let mut start = 0;
        while start < index.len() {
            let end = index.group_end(start);
            out.push(
                index.entries()[start..end]
                    .iter()
                    .map(|e| (e.batch, e.row))
                    .collect(),
            );
            start = end;
        }
        out
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
            index.sort();
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
            index.sort();
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

    /// The packed sort orders entries exactly as the tuple sort does:
    /// integer keys of both signs, equal sequences of stored and new
    /// events, negative sequences.
    #[test]
    fn the_packed_sort_orders_like_the_tuple_sort() -> Result<()> {
        let schema = event_schema(DataType::Int32);
        let mut state = 7u64;
        let mut next = move |m: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        let batches: Vec<RecordBatch> = (0..4)
            .map(|_| {
                let n = 300;
                let ids: Vec<i32> = (0..n).map(|_| next(40) as i32 - 20).collect();
                let seqs: Vec<i64> = (0..n).map(|_| next(30) as i64 - 15).collect();
                let origins: Vec<i8> = (0..n).map(|_| next(2) as i8).collect();
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::new(arrow::array::Int32Array::from(ids)),
                        Arc::new(Int64Array::from(seqs)),
                        Arc::new(Int8Array::from(vec![0; n])),
                        Arc::new(Int64Array::from(vec![0; n])),
                        Arc::new(Int8Array::from(origins)),
                    ],
                )
            })
            .collect::<std::result::Result<_, _>>()?;
        let sorted = |packable: bool| -> Result<Vec<(u128, u128, i8)>> {
            let mut index = EventIndex::try_new("f", &layout(), &schema)?;
            assert!(index.packable && !index.hashes_keys());
            index.packable = packable;
            for (b, batch) in batches.iter().enumerate() {
                index.push(batch, b)?;
            }
            index.sort();
            Ok(index
                .entries()
                .iter()
                .map(|e| (e.key, e.seq, e.origin))
                .collect())
        };
        let (packed, tuple) = (sorted(true)?, sorted(false)?);
        assert!(tuple.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(packed, tuple);
        Ok(())
    }

    /// Indexing some rows of a batch gives the entries that indexing the
    /// whole batch gives those rows, whichever way keys and sequences are
    /// encoded: from their values (no nulls), through the row format
    /// (nulls), or hashed (strings); rows past the end are refused.
    #[test]
    fn some_rows_are_indexed_as_the_whole_batch_indexes_them() -> Result<()> {
        use arrow::array::{ArrayRef, Int32Array};
        let ids: [ArrayRef; 4] = [
            Arc::new(Int32Array::from(vec![4, -1, 7, 2, 9])),
            Arc::new(Int32Array::from(vec![
                Some(4),
                None,
                Some(7),
                Some(2),
                None,
            ])),
            Arc::new(StringArray::from(vec!["d", "a", "g", "b", "i"])),
            Arc::new(StringArray::from(vec![
                Some("d"),
                None,
                Some("g"),
                None,
                Some("i"),
            ])),
        ];
        let seqs: [ArrayRef; 2] = [
            Arc::new(Int64Array::from(vec![5, 3, 8, 1, 2])),
            Arc::new(Int64Array::from(vec![
                Some(5),
                Some(3),
                None,
                Some(1),
                None,
            ])),
        ];
        let rows = [3u32, 1, 4];
        let fields = |e: &IndexEntry| (e.key, e.seq, e.origin, e.kind, e.batch, e.row);
        for id in &ids {
            for seq in &seqs {
                let schema = event_schema(id.data_type().clone());
                let batch = RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        Arc::clone(id),
                        Arc::clone(seq),
                        Arc::new(Int8Array::from(vec![0, 1, 0, 1, 0])),
                        Arc::new(Int64Array::from(vec![0; 5])),
                        Arc::new(Int8Array::from(vec![0, 0, 1, 1, 0])),
                    ],
                )?;
                let mut whole = EventIndex::try_new("f", &layout(), &schema)?;
                whole.push(&batch, 0)?;
                let expected: Vec<_> = rows
                    .iter()
                    .map(|&r| fields(&whole.entries()[r as usize]))
                    .collect();
                let mut some = EventIndex::try_new("f", &layout(), &schema)?;
                // (origin 0 is a stored row: of rows 3, 1, 4 only row 3 is new)
                assert_eq!(some.push_rows(&batch, 0, Some(&rows))?, 1);
                let found: Vec<_> = some.entries().iter().map(fields).collect();
                assert_eq!(found, expected, "{} / {}", id.data_type(), seq.data_type());
                assert!(some.push_rows(&batch, 1, Some(&[5])).is_err());
            }
        }
        Ok(())
    }
}
