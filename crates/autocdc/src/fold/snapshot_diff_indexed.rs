//! Indexed snapshot diff: the rules of [`super::snapshot_diff`] without
//! sorting the rows.
//!
//! The sorted diff needs its input — every column of the snapshot and of the
//! live target — sorted by `(keys, side)`, which moves each row several
//! times. This one keeps the input batches where they arrive and orders a
//! 16- or 32-byte entry per row instead:
//!
//! ```text
//!  push(batch) ─► retain batch (shared with other partitions: rows routed here)
//!              └► index += (key, side, batch, row)
//!  finish()    ─► order index by key ─► per key: live / snapshot / both
//!              └► keys on both sides: gather their non-key columns, 8 192
//!                 pairs at a time, compare column-wise ─► changed rows
//!  next_output ─► gather the changed rows, a few source batches at a time
//! ```
//!
//! A single integer key without nulls is encoded from its values
//! ([`super::rows::encode_values`]: no projection, copy or conversion of the
//! rows) and held in 8 bytes: entries of 16 bytes. Any other key, or once a
//! batch's keys hold a NULL, is held in Arrow's row format (16 bytes, in
//! entries of 32 bytes; the entries already made are widened, as the row
//! format would have encoded their keys). An index of 8-byte keys lying
//! close together, as generated ids do, is ordered by counting
//! ([`super::key_slots`], its scratch granted by the caller's pool) rather
//! than sorted.
//!
//! Values are never converted to the row format as a whole (that
//! conversion, and the memory it took, was a fifth of a 2 M-row diff):
//! `IS DISTINCT FROM` over the gathered columns gives the row format's
//! equality (NULLs equal, floats by their bits); nested columns are
//! compared in the row format, chunk by chunk.
//!
//! A batch may be shared with the diffs of other partitions (a key exchange
//! routes each its rows, `crate::physical::key_exchange`): only the rows
//! given are indexed, the batch is retained whole and counts the share of
//! its bytes those rows are.
//!
//! Keys must encode to at most 16 bytes of Arrow's row format (integers,
//! dates, timestamps, ... and short composites of them): [`IndexedSnapshotDiff::supports`].
//! Memory grows with the input (the caller reserves [`IndexedSnapshotDiff::memory_size`]
//! and falls back to the sorted diff when the pool refuses).

use arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use arrow::buffer::BooleanBuffer;
use arrow::compute::kernels::cmp::distinct;
use arrow::compute::{interleave, take_record_batch};
use arrow::datatypes::{Int8Type, Schema, SchemaRef};
use arrow::row::{RowConverter, SortField};
use datafusion::common::{DataFusionError, Result, ScalarValue};

use super::columns::Kind;
use super::emits::{Emit, EmitQueue};
use super::key_slots::{KeySpan, SlotPlan};
use super::retained::Retained;
use super::rows::{
    encode_values, encoded, encoded_from_bits, encoded_width, row_converter, to_rows,
    MAX_ENCODED_BYTES,
};
use super::snapshot_diff::{diff_events, diff_output_schema, duplicate_key_error, SIDE_SNAPSHOT};

/// Pairs of rows compared at once (the gathered columns of one chunk).
const COMPARE_CHUNK: usize = 8192;

/// One input row in the index: its key (`K`: a value's 8 bytes or 16
/// bytes of row format), its batch, and its row and side in one `u32`.
#[derive(Debug, Clone, Copy)]
struct Entry<K> {
    key: K,
    batch: u32,
    /// The row, shifted left once; the low bit is set on the snapshot side.
    row_side: u32,
}

impl<K> Entry<K> {
    fn new(key: K, batch: u32, row: u32, side: i8) -> Self {
        Self {
            key,
            batch,
            row_side: (row << 1) | u32::from(side == SIDE_SNAPSHOT),
        }
    }

    fn row(&self) -> u32 {
        self.row_side >> 1
    }

    fn is_snapshot(&self) -> bool {
        self.row_side & 1 == 1
    }
}

/// Rows past this one in a batch do not fit [`Entry::row_side`].
const MAX_ROWS_PER_BATCH: usize = (u32::MAX >> 1) as usize;

/// The index of the rows pushed: 16-byte entries while every key was
/// encoded from its value (their value bytes, as [`encode_values`] gives
/// them), 32-byte entries of row-format keys once one was not.
#[derive(Debug)]
enum Index {
    Values(Vec<Entry<u64>>),
    Rows(Vec<Entry<u128>>),
}

impl Default for Index {
    fn default() -> Self {
        Self::Values(Vec::new())
    }
}

impl Index {
    fn memory_size(&self) -> usize {
        match self {
            Self::Values(index) => index.capacity() * std::mem::size_of::<Entry<u64>>(),
            Self::Rows(index) => index.capacity() * std::mem::size_of::<Entry<u128>>(),
        }
    }

    /// Add entries of row-format keys (`push` adds them to a vector), the
    /// value-encoded entries widened first if the index held them (a single
    /// integer key: the row format's encoding is the valid byte, then the
    /// value bytes).
    fn push_rows(&mut self, additional: usize, push: impl FnOnce(&mut Vec<Entry<u128>>)) {
        match self {
            Self::Rows(rows) => push(rows),
            Self::Values(values) => {
                let mut rows = Vec::with_capacity(values.len() + additional);
                rows.extend(values.iter().map(|e| Entry {
                    key: encoded_from_bits(e.key),
                    batch: e.batch,
                    row_side: e.row_side,
                }));
                push(&mut rows);
                *self = Self::Rows(rows);
            }
        }
    }
}

/// Indexed snapshot diff of one partition (see the module docs).
#[derive(Debug)]
pub struct IndexedSnapshotDiff {
    flow: String,
    key_indices: Vec<usize>,
    target_columns: Vec<String>,
    version: ScalarValue,
    written_at: ScalarValue,
    output_schema: SchemaRef,
    key_converter: RowConverter,
    /// The input batches (of a shared batch, its rows routed here).
    retained: Retained,
    index: Index,
    /// The keys of one batch's rows, encoded from their values (reused).
    key_scratch: Vec<u64>,
    /// The span of the keys encoded from their values: what ordering the
    /// index by counting needs.
    key_span: Option<KeySpan>,
    /// Change events to emit (their kinds), once finished.
    emits: Option<EmitQueue>,
    /// Events produced: upserts, deletes.
    pub counts: (usize, usize),
}

impl IndexedSnapshotDiff {
    /// Whether the keys of `input_schema` (`[target columns..., side]`) fit
    /// an index entry.
    pub fn supports(key_indices: &[usize], input_schema: &Schema) -> bool {
        encoded_width(
            key_indices
                .iter()
                .map(|&i| input_schema.field(i).data_type()),
        )
        .is_some_and(|w| w <= MAX_ENCODED_BYTES)
    }

    /// A diff producing events at `version`, stamped `written_at`.
    pub fn try_new(
        flow: &str,
        key_indices: Vec<usize>,
        version: ScalarValue,
        written_at: ScalarValue,
        input_schema: &SchemaRef,
    ) -> Result<Self> {
        if !Self::supports(&key_indices, input_schema) {
            return Err(DataFusionError::Internal(format!(
                "flow '{flow}': the indexed snapshot diff needs fixed-width keys of at most {MAX_ENCODED_BYTES} bytes"
            )));
        }
        let n = input_schema.fields().len() - 1;
        Ok(Self {
            flow: flow.to_string(),
            key_converter: row_converter(input_schema, &key_indices)?,
            target_columns: (0..n)
                .map(|i| input_schema.field(i).name().clone())
                .collect(),
            output_schema: diff_output_schema(
                input_schema,
                &version.data_type(),
                &written_at.data_type(),
            ),
            key_indices,
            version,
            written_at,
            retained: Retained::default(),
            index: Index::default(),
            key_scratch: Vec::new(),
            key_span: None,
            emits: None,
            counts: (0, 0),
        })
    }

    /// Bytes held: the retained batches, the index and, once finished,
    /// the change events to emit.
    pub fn memory_size(&self) -> usize {
        self.retained.memory_size()
            + self.index.memory_size()
            + self.emits.as_ref().map_or(0, EmitQueue::memory_size)
    }

    /// The retained input rows as batches of their own (for a fall-back to
    /// the sorted diff; the rows of a shared batch are copied).
    pub fn into_batches(self) -> Result<Vec<RecordBatch>> {
        self.retained.into_batches()
    }

    /// Retain one input batch and index its rows.
    #[cfg(test)]
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        self.push_rows(batch, None)
    }

    /// Retain `batch` and index its `rows` (ascending positions; every row
    /// when `None`): the batch may be shared with other partitions' diffs
    /// ([`Retained::push_rows`]).
    pub fn push_rows(&mut self, batch: &RecordBatch, rows: Option<&UInt32Array>) -> Result<()> {
        if rows.map_or(batch.num_rows(), Array::len) == 0 {
            return Ok(());
        }
        let number = u32::try_from(self.retained.len())
            .map_err(|_| DataFusionError::Internal("too many batches in one diff".into()))?;
        if batch.num_rows() > MAX_ROWS_PER_BATCH {
            return Err(DataFusionError::Internal(format!(
                "flow '{}': a batch of {} rows in a snapshot diff (at most {MAX_ROWS_PER_BATCH})",
                self.flow,
                batch.num_rows()
            )));
        }
        let (batch, rows) = self.retained.push_rows(batch, rows)?;
        let n = batch.num_columns() - 1;
        let sides = batch.column(n).as_primitive::<Int8Type>().values();
        let positions = rows.map(|r| r.values().as_ref());
        if let Some(rows) = positions {
            if rows.iter().any(|&r| r as usize >= sides.len()) {
                return Err(DataFusionError::Internal(format!(
                    "flow '{}': a row past the end of a batch of {} rows",
                    self.flow,
                    batch.num_rows()
                )));
            }
        }
        let keys = &mut self.key_scratch;
        keys.clear();
        let from_values = match self.key_indices[..] {
            [key] => encode_values(batch.column(key).as_ref(), positions, keys),
            _ => false,
        };
        if from_values {
            // a single integer key without nulls, encoded from its values
            // (their span is what the counting order of 8-byte keys needs)
            match &mut self.index {
                Index::Values(index) => {
                    self.key_span = KeySpan::join(self.key_span, KeySpan::of(keys));
                    push_entries(index, sides, positions, number, |i| keys[i]);
                }
                Index::Rows(index) => push_entries(index, sides, positions, number, |i| {
                    encoded_from_bits(keys[i])
                }),
            }
        } else {
            // only the rows routed here are encoded
            let (mine, key_columns) = match rows {
                Some(rows) => (
                    take_record_batch(&batch.project(&self.key_indices)?, rows)?,
                    (0..self.key_indices.len()).collect(),
                ),
                None => (batch.clone(), self.key_indices.clone()),
            };
            let encoded_keys = to_rows(&self.key_converter, &mine, &key_columns)?;
            self.index.push_rows(encoded_keys.num_rows(), |index| {
                push_entries(index, sides, positions, number, |i| {
                    encoded(&encoded_keys, i)
                })
            });
        }
        Ok(())
    }

    /// Order the index by key and decide every key; errors (a key twice in
    /// the snapshot) surface here, before any output. Keys encoded from
    /// their values that lie close together are ordered by counting
    /// (`super::key_slots`) when `scratch` grants its bytes, others are
    /// sorted; the pairs of rows to compare are grouped by a copy when
    /// `scratch` grants it, else sorted in place.
    pub fn finish(&mut self, scratch: &mut dyn FnMut(usize) -> bool) -> Result<()> {
        let (mut emits, mut pairs) = (Vec::new(), Vec::new());
        match std::mem::take(&mut self.index) {
            Index::Values(index) => self.diff_values(index, scratch, &mut emits, &mut pairs)?,
            Index::Rows(index) => self.diff_sorted(index, &mut emits, &mut pairs)?,
        }
        // keys on both sides: compare the values walking the live rows
        // batch by batch, so that one side is read a batch at a time (a
        // grouped copy when `scratch` grants it, else sorted in place)
        let pairs = if scratch(std::mem::size_of_val(pairs.as_slice())) {
            by_live_batch(pairs, self.retained.len())
        } else {
            pairs.sort_unstable_by_key(|&[batch, row, ..]| (batch, row));
            pairs
        };
        let values = ValueColumns::try_new(
            self.retained.batches(),
            &self.key_indices,
            self.target_columns.len(),
        )?;
        let mut upserts = 0;
        for chunk in pairs.chunks(COMPARE_CHUNK) {
            let changed = values.changed_pairs(chunk)?;
            for ([_, _, batch, row], changed) in chunk.iter().zip(changed.iter()) {
                if changed {
                    emits.push(Emit {
                        batch: *batch,
                        row: *row,
                        kind: Kind::Upsert as i8,
                    });
                    upserts += 1;
                }
            }
        }
        self.counts.0 += upserts;
        self.emits = Some(EmitQueue::new(emits, self.retained.len()));
        Ok(())
    }

    /// Decide every key of an index of 8-byte keys: ordered by counting
    /// when they lie close together and `scratch` grants its bytes, else
    /// sorted.
    fn diff_values(
        &mut self,
        index: Vec<Entry<u64>>,
        scratch: &mut dyn FnMut(usize) -> bool,
        emits: &mut Vec<Emit>,
        pairs: &mut Vec<[u32; 4]>,
    ) -> Result<()> {
        let plan = self
            .key_span
            .and_then(|span| SlotPlan::new(span, index.len()))
            .filter(|plan| scratch(plan.scratch_bytes(index.len())));
        let Some(plan) = plan else {
            return self.diff_sorted(index, emits, pairs);
        };
        let order = plan.order(&index, |e| e.key);
        let same_key = |a: &u32, b: &u32| index[*a as usize].key == index[*b as usize].key;
        for group in order.chunk_by(same_key) {
            let entries = group.iter().map(|&at| &index[at as usize]);
            self.diff_key(entries, emits, pairs)?;
        }
        Ok(())
    }

    /// Sort `index` by key and decide every key.
    fn diff_sorted<K: Ord + Copy>(
        &mut self,
        mut index: Vec<Entry<K>>,
        emits: &mut Vec<Emit>,
        pairs: &mut Vec<[u32; 4]>,
    ) -> Result<()> {
        index.sort_unstable_by_key(|e| e.key);
        for group in index.chunk_by(|a, b| a.key == b.key) {
            self.diff_key(group, emits, pairs)?;
        }
        Ok(())
    }

    /// `entries` share one key: at most one live and one snapshot row. A
    /// key on both sides goes to `pairs` as `[live batch, live row,
    /// snapshot batch, snapshot row]`.
    fn diff_key<'e, K: 'e>(
        &mut self,
        entries: impl IntoIterator<Item = &'e Entry<K>>,
        emits: &mut Vec<Emit>,
        pairs: &mut Vec<[u32; 4]>,
    ) -> Result<()> {
        let (mut live, mut snap) = (None, None);
        for e in entries {
            if !e.is_snapshot() {
                live = live.or(Some(e));
            } else if snap.is_none() {
                snap = Some(e);
            } else {
                return Err(duplicate_key_error(
                    &self.flow,
                    &self.target_columns,
                    &self.key_indices,
                    &self.retained.batches()[e.batch as usize],
                    e.row() as usize,
                    &self.version,
                ));
            }
        }
        let emit = |e: &Entry<K>, kind: Kind| Emit {
            batch: e.batch,
            row: e.row(),
            kind: kind as i8,
        };
        match (live, snap) {
            (Some(l), None) => {
                emits.push(emit(l, Kind::Delete));
                self.counts.1 += 1;
            }
            (None, Some(s)) => {
                emits.push(emit(s, Kind::Upsert));
                self.counts.0 += 1;
            }
            // compared later, in the live rows' order
            (Some(l), Some(s)) => pairs.push([l.batch, l.row(), s.batch, s.row()]),
            (None, None) => {}
        }
        Ok(())
    }

    /// The next batch of change events (about `batch_size` rows, gathered
    /// from a few consecutive retained batches); `None` at the end.
    pub fn next_output(&mut self, batch_size: usize) -> Result<Option<RecordBatch>> {
        let Some(queue) = self.emits.as_mut() else {
            return Err(DataFusionError::Internal(
                "IndexedSnapshotDiff::next_output before finish".into(),
            ));
        };
        let Some((gathered, emits)) = queue.next_window(self.retained.batches(), batch_size)?
        else {
            return Ok(None);
        };
        let n = gathered.num_columns() - 1;
        let columns = gathered.columns()[..n].to_vec();
        let kinds = emits.iter().map(|e| e.kind).collect();
        Ok(Some(diff_events(
            &self.output_schema,
            columns,
            kinds,
            &self.version,
            &self.written_at,
        )?))
    }
}

/// `pairs` (`[live batch, live row, snapshot batch, snapshot row]`) grouped
/// by live batch, batches ascending, each batch's pairs in the order given:
/// a counting sort over the `batches` batch numbers.
fn by_live_batch(pairs: Vec<[u32; 4]>, batches: usize) -> Vec<[u32; 4]> {
    // each batch's count, then where its first pair goes
    let mut next = vec![0usize; batches];
    for [batch, ..] in &pairs {
        next[*batch as usize] += 1;
    }
    let mut at = 0;
    for place in &mut next {
        (*place, at) = (at, at + *place);
    }
    let mut grouped = vec![[0u32; 4]; pairs.len()];
    for pair in pairs {
        let place = &mut next[pair[0] as usize];
        grouped[*place] = pair;
        *place += 1;
    }
    grouped
}

/// Index the rows at `positions` (every row when `None`) of batch
/// `number`, whose sides are `sides`; `key_at(i)` is the key of the `i`-th
/// row indexed.
fn push_entries<K>(
    index: &mut Vec<Entry<K>>,
    sides: &[i8],
    positions: Option<&[u32]>,
    number: u32,
    key_at: impl Fn(usize) -> K,
) {
    match positions {
        Some(rows) => {
            index.reserve(rows.len());
            index.extend(
                rows.iter()
                    .enumerate()
                    .map(|(i, &row)| Entry::new(key_at(i), number, row, sides[row as usize])),
            );
        }
        None => {
            index.reserve(sides.len());
            index.extend(
                sides
                    .iter()
                    .enumerate()
                    .map(|(row, &side)| Entry::new(key_at(row), number, row as u32, side)),
            );
        }
    }
}

/// The non-key columns of the retained batches, for comparing the values of
/// pairs of rows (the arrays of each column, once for the whole diff).
struct ValueColumns<'a> {
    /// Per column: its array in every batch, and a row converter when the
    /// column is nested.
    columns: Vec<(Vec<&'a dyn Array>, Option<RowConverter>)>,
}

impl<'a> ValueColumns<'a> {
    /// Columns `0..n` of `batches` but the keys (equal keys encode equally:
    /// only the other columns can differ).
    fn try_new(batches: &'a [RecordBatch], key_indices: &[usize], n: usize) -> Result<Self> {
        let mut columns = Vec::new();
        for column in (0..n).filter(|c| !key_indices.contains(c)) {
            let arrays: Vec<&dyn Array> =
                batches.iter().map(|b| b.column(column).as_ref()).collect();
            let converter = match arrays.first().map(|a| a.data_type()) {
                Some(t) if t.is_nested() => {
                    Some(RowConverter::new(vec![SortField::new(t.clone())])?)
                }
                _ => None,
            };
            columns.push((arrays, converter));
        }
        Ok(Self { columns })
    }

    /// Which of the `[live batch, live row, snapshot batch, snapshot row]`
    /// pairs differ in a value: each column of both sides is gathered for
    /// the chunk and compared column-wise (`IS DISTINCT FROM`: NULLs equal,
    /// floats by their bits, like the sorted diff's row-format comparison);
    /// nested columns are compared in the row format.
    fn changed_pairs(&self, pairs: &[[u32; 4]]) -> Result<BooleanBuffer> {
        let live: Vec<(usize, usize)> = pairs
            .iter()
            .map(|p| (p[0] as usize, p[1] as usize))
            .collect();
        let snapshot: Vec<(usize, usize)> = pairs
            .iter()
            .map(|p| (p[2] as usize, p[3] as usize))
            .collect();
        let mut changed = BooleanBuffer::new_unset(pairs.len());
        for (arrays, converter) in &self.columns {
            let old = interleave(arrays, &live)?;
            let new = interleave(arrays, &snapshot)?;
            let differs = match converter {
                Some(converter) => {
                    let (old, new) = (
                        converter.convert_columns(&[old])?,
                        converter.convert_columns(&[new])?,
                    );
                    BooleanBuffer::collect_bool(pairs.len(), |i| old.row(i) != new.row(i))
                }
                None => distinct(&old, &new)?.values().clone(),
            };
            changed = &changed | &differs;
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::snapshot_diff::{SnapshotDiff, SIDE_COL, SIDE_LIVE};
    use super::*;
    use arrow::array::{Array, Int64Array, Int8Array, StringArray};
    use arrow::compute::{concat_batches, lexsort_to_indices, take_record_batch, SortColumn};
    use arrow::datatypes::{DataType, Field, Int64Type};

    use crate::fold::columns::KIND_COL;

    fn input(ids: &[i64], vs: &[Option<&str>], sides: &[i8]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
            Field::new(SIDE_COL, DataType::Int8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(vs.to_vec())),
                Arc::new(Int8Array::from(sides.to_vec())),
            ],
        )
        .unwrap()
    }

    /// (id, v, kind) of the events, sorted.
    fn events(batches: &[RecordBatch]) -> Vec<(i64, Option<String>, i8)> {
        let mut out: Vec<_> = batches
            .iter()
            .flat_map(|b| {
                let ids = b
                    .column(0)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .clone();
                let vs = b.column(1).as_string::<i32>().clone();
                let ks = b.column(3).as_primitive::<Int8Type>().clone();
                (0..b.num_rows()).map(move |i| {
                    let v = (!vs.is_null(i)).then(|| vs.value(i).to_string());
                    (ids.value(i), v, ks.value(i))
                })
            })
            .collect();
        out.sort();
        out
    }

    /// An indexed diff of flow `f` keyed by its first column, at version 7.
    fn new_indexed(schema: &SchemaRef) -> Result<IndexedSnapshotDiff> {
        IndexedSnapshotDiff::try_new(
            "f",
            vec![0],
            ScalarValue::Int64(Some(7)),
            ScalarValue::Int64(None),
            schema,
        )
    }

    /// The indexed diff's events over `batches` (id first, the side last),
    /// produced `batch_size` rows at a time: the same whether its scratch
    /// is granted (the index ordered by counting, the pairs grouped by a
    /// copy) or refused (both sorted).
    fn indexed_batches(batches: &[RecordBatch], batch_size: usize) -> Result<Vec<RecordBatch>> {
        let run = |granted: bool| -> Result<(Vec<RecordBatch>, usize)> {
            let mut d = new_indexed(&batches[0].schema())?;
            for b in batches {
                d.push(b)?;
            }
            let mut asked = 0;
            d.finish(&mut |_| {
                asked += 1;
                granted
            })?;
            let mut out = Vec::new();
            while let Some(b) = d.next_output(batch_size)? {
                out.push(b);
            }
            Ok((out, asked))
        };
        let (counted, asked) = run(true)?;
        let (sorted, _) = run(false)?;
        assert_eq!(counted, sorted);
        // (integer keys without nulls, close together: ordered by counting,
        // then the pairs grouped)
        let nulls = batches.iter().any(|b| b.column(0).null_count() > 0);
        let integers = batches[0].schema().field(0).data_type().is_integer();
        assert_eq!(asked, 1 + usize::from(integers && !nulls));
        Ok(counted)
    }

    /// The sorted diff's events over the same rows, sorted by (key, side).
    fn sorted_batches(batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
        let schema = batches[0].schema();
        let all = concat_batches(&schema, batches)?;
        let order = lexsort_to_indices(
            &[
                SortColumn {
                    values: Arc::clone(all.column(0)),
                    options: None,
                },
                SortColumn {
                    values: Arc::clone(all.column(schema.fields().len() - 1)),
                    options: None,
                },
            ],
            None,
        )?;
        let all = take_record_batch(&all, &order)?;
        let mut d = SnapshotDiff::try_new(
            "f",
            vec![0],
            ScalarValue::Int64(Some(7)),
            ScalarValue::Int64(None),
            &schema,
        )?;
        let mut out = Vec::new();
        out.extend(d.push(&all)?);
        out.extend(d.finish()?);
        Ok(out)
    }

    fn indexed(batches: &[RecordBatch]) -> Result<Vec<(i64, Option<String>, i8)>> {
        Ok(events(&indexed_batches(batches, 2)?))
    }

    fn sorted(batches: &[RecordBatch]) -> Result<Vec<(i64, Option<String>, i8)>> {
        Ok(events(&sorted_batches(batches)?))
    }

    #[test]
    fn equals_the_sorted_diff() -> Result<()> {
        // live: 1 a, 2 b, 3 c, 5 NULL, 6 f; snapshot: 2 b, 3 C, 4 d, 5 NULL,
        // 6 NULL — in batches of mixed sides, out of order
        let batches = [
            input(&[3, 4, 1], &[Some("C"), Some("d"), Some("a")], &[1, 1, 0]),
            input(&[2, 5], &[Some("b"), None], &[0, 1]),
            input(&[6, 3, 2], &[Some("f"), Some("c"), Some("b")], &[0, 0, 1]),
            input(&[5, 6], &[None, None], &[0, 1]),
        ];
        let expected = vec![
            (1, Some("a".to_string()), Kind::Delete as i8),
            (3, Some("C".to_string()), Kind::Upsert as i8),
            (4, Some("d".to_string()), Kind::Upsert as i8),
            (6, None, Kind::Upsert as i8),
        ];
        assert_eq!(indexed(&batches)?, expected);
        assert_eq!(sorted(&batches)?, expected);
        Ok(())
    }

    /// (id, kind) of the events of both diffs over batches of any schema
    /// (`id` first, the side last).
    fn both_diffs(batches: &[RecordBatch]) -> Result<[Vec<(i64, i8)>; 2]> {
        let ids_kinds = |out: Vec<RecordBatch>| {
            let mut v: Vec<(i64, i8)> = out
                .iter()
                .flat_map(|b| {
                    let ids = b.column(0).as_primitive::<Int64Type>().clone();
                    let kind = b.schema().index_of(KIND_COL).unwrap();
                    let ks = b.column(kind).as_primitive::<Int8Type>().clone();
                    (0..b.num_rows()).map(move |i| (ids.value(i), ks.value(i)))
                })
                .collect();
            v.sort();
            v
        };
        let indexed = indexed_batches(batches, 1000)?;
        let sorted = sorted_batches(batches)?;
        Ok([ids_kinds(indexed), ids_kinds(sorted)])
    }

    #[test]
    fn entries_take_16_bytes_with_value_keys_and_32_with_row_format_keys() {
        assert_eq!(std::mem::size_of::<Entry<u64>>(), 16);
        assert_eq!(std::mem::size_of::<Entry<u128>>(), 32);
        let last = MAX_ROWS_PER_BATCH as u32;
        for (row, side) in [
            (0, SIDE_LIVE),
            (0, SIDE_SNAPSHOT),
            (last, SIDE_LIVE),
            (last, SIDE_SNAPSHOT),
        ] {
            let e = Entry::new(0u64, 3, row, side);
            assert_eq!(
                (e.batch, e.row(), e.is_snapshot()),
                (3, row, side == SIDE_SNAPSHOT)
            );
        }
    }

    #[test]
    fn pairs_are_grouped_by_live_batch_in_the_order_given() {
        let pairs = vec![[2, 5, 0, 0], [0, 9, 1, 1], [2, 1, 2, 2], [0, 3, 3, 3]];
        assert_eq!(
            by_live_batch(pairs, 3),
            vec![[0, 9, 1, 1], [0, 3, 3, 3], [2, 5, 0, 0], [2, 1, 2, 2]]
        );
        assert_eq!(by_live_batch(Vec::new(), 0), Vec::<[u32; 4]>::new());
    }

    /// A single integer key is encoded from its values, a batch whose keys
    /// hold a NULL through the row format: both encode a key alike, in
    /// every integer type, whether a batch is indexed whole or by the rows
    /// routed to it.
    #[test]
    fn keys_from_values_match_keys_through_the_row_format() -> Result<()> {
        use arrow::array::ArrayRef;
        use arrow::compute::cast;
        use arrow::datatypes::TimeUnit;
        let types = [
            DataType::Int8,
            DataType::Int16,
            DataType::Int32,
            DataType::Int64,
            DataType::UInt8,
            DataType::UInt32,
            DataType::UInt64,
            DataType::Date32,
            DataType::Timestamp(TimeUnit::Microsecond, None),
        ];
        for t in types {
            let schema = Arc::new(Schema::new(vec![
                Field::new("id", t.clone(), true),
                Field::new("v", DataType::Utf8, true),
                Field::new(SIDE_COL, DataType::Int8, false),
            ]));
            let batch = |ids: &[Option<i64>], vs: &[&str], sides: &[i8]| -> Result<RecordBatch> {
                let ids: ArrayRef = cast(&Int64Array::from(ids.to_vec()), &t)?;
                Ok(RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![
                        ids,
                        Arc::new(StringArray::from(vs.to_vec())),
                        Arc::new(Int8Array::from(sides.to_vec())),
                    ],
                )?)
            };
            // live 0 a, 5 b, 100 c, 7 d (no NULL key: encoded from values);
            // snapshot 0 a, 5 B, NULL n, 7 d (a NULL key: the row format)
            let live = batch(
                &[Some(0), Some(5), Some(100), Some(7)],
                &["a", "b", "c", "d"],
                &[SIDE_LIVE; 4],
            )?;
            let snapshot = batch(
                &[Some(0), Some(5), None, Some(7)],
                &["a", "B", "n", "d"],
                &[SIDE_SNAPSHOT; 4],
            )?;
            // the same rows shared by two batches of mixed sides, routed
            let shared = concat_batches(&schema, [&live, &snapshot])?;
            let (upsert, delete) = (Kind::Upsert as i8, Kind::Delete as i8);
            let expected = vec![(None, upsert), (Some(5), upsert), (Some(100), delete)];
            for routed in [false, true] {
                let mut d = new_indexed(&schema)?;
                if routed {
                    d.push_rows(&shared, Some(&UInt32Array::from(vec![0, 2, 5, 6])))?;
                    d.push_rows(&shared, Some(&UInt32Array::from(vec![1, 3, 4, 7])))?;
                } else {
                    d.push(&live)?;
                    d.push(&snapshot)?;
                }
                d.finish(&mut |_| true)?;
                let mut got = Vec::new();
                while let Some(b) = d.next_output(100)? {
                    let ids = cast(b.column(0), &DataType::Int64)?;
                    let ids = ids.as_primitive::<Int64Type>();
                    let kind = b.schema().index_of(KIND_COL)?;
                    let kinds = b.column(kind).as_primitive::<Int8Type>();
                    for i in 0..b.num_rows() {
                        got.push((ids.is_valid(i).then(|| ids.value(i)), kinds.value(i)));
                    }
                }
                got.sort();
                assert_eq!(got, expected, "{t}, routed: {routed}");
            }
        }
        Ok(())
    }

    /// Values are compared column-wise in chunks with the sorted diff's
    /// (row format) equality: -0.0 differs from 0.0, NaN equals NaN, NULL
    /// equals NULL, and nested values are compared whole; across more
    /// pairs than one chunk, only the changed keys are upserts.
    #[test]
    fn values_compare_like_the_sorted_diff() -> Result<()> {
        use arrow::array::{Float64Array, ListArray};
        use arrow::datatypes::Int32Type;
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("f", DataType::Float64, true),
            Field::new(
                "l",
                DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true))),
                true,
            ),
            Field::new(SIDE_COL, DataType::Int8, false),
        ]));
        type Row = (i64, Option<f64>, Option<Vec<Option<i32>>>);
        let side_batch = |rows: &[Row], side: i8| -> Result<RecordBatch> {
            Ok(RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(rows.iter().map(|r| r.0).collect::<Int64Array>()),
                    Arc::new(rows.iter().map(|r| r.1).collect::<Float64Array>()),
                    Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
                        rows.iter().map(|r| r.2.clone()),
                    )),
                    Arc::new(Int8Array::from(vec![side; rows.len()])),
                ],
            )?)
        };
        let n = 3 * COMPARE_CHUNK as i64;
        let live: Vec<Row> = (0..n)
            .map(|i| match i {
                1 => (i, Some(-0.0), None),
                2 => (i, Some(f64::NAN), None),
                3 => (i, None, None),
                4 | 5 => (i, Some(1.0), Some(vec![Some(1), Some(2)])),
                6 => (i, Some(1.0), None),
                _ => (i, Some(i as f64), Some(vec![Some(i as i32)])),
            })
            .collect();
        let mut snapshot = live.clone();
        snapshot[1].1 = Some(0.0);
        snapshot[5].2 = Some(vec![Some(1), Some(3)]);
        snapshot[6].2 = Some(vec![]);
        let far = n as usize - 7;
        snapshot[far].1 = None;
        snapshot.reverse();
        let batches: Vec<RecordBatch> = live
            .chunks(1000)
            .map(|c| side_batch(c, SIDE_LIVE))
            .chain(snapshot.chunks(700).map(|c| side_batch(c, SIDE_SNAPSHOT)))
            .collect::<Result<_>>()?;
        let upsert = Kind::Upsert as i8;
        let expected = vec![(1, upsert), (5, upsert), (6, upsert), (far as i64, upsert)];
        let [indexed, sorted] = both_diffs(&batches)?;
        assert_eq!(indexed, expected);
        assert_eq!(sorted, expected);
        Ok(())
    }

    /// Booleans, strings and binaries of each layout and decimals compare
    /// with the sorted diff's row-format equality, over pairs drawn from a
    /// few values and NULL: equal values, a value against NULL, NULL against
    /// NULL, long and short strings, strings of one length and prefix.
    #[test]
    fn every_layout_compares_like_the_sorted_diff() -> Result<()> {
        use arrow::array::{
            ArrayRef, BinaryViewArray, BooleanArray, Decimal128Array, LargeBinaryArray,
            LargeStringArray, StringViewArray,
        };
        let texts = [
            None,
            Some("a"),
            Some("b"),
            Some("name-1"),
            Some("name-2"),
            Some("twelve bytes"),
            Some("more than twelve bytes, a"),
            Some("more than twelve bytes, b"),
        ];
        let column = |values: &[usize], t: &DataType| -> Result<ArrayRef> {
            let pick = |i: &usize| texts[i % texts.len()];
            Ok(match t {
                DataType::Boolean => Arc::new(
                    values
                        .iter()
                        .map(|i| pick(i).map(|v| v.len() % 2 == 0))
                        .collect::<BooleanArray>(),
                ),
                DataType::Utf8View => {
                    Arc::new(values.iter().map(pick).collect::<StringViewArray>())
                }
                DataType::LargeUtf8 => {
                    Arc::new(values.iter().map(pick).collect::<LargeStringArray>())
                }
                DataType::BinaryView => Arc::new(BinaryViewArray::from_iter(
                    values.iter().map(|i| pick(i).map(str::as_bytes)),
                )),
                DataType::LargeBinary => Arc::new(LargeBinaryArray::from_iter(
                    values.iter().map(|i| pick(i).map(str::as_bytes)),
                )),
                _ => Arc::new(
                    values
                        .iter()
                        .map(|i| pick(i).map(|v| v.len() as i128))
                        .collect::<Decimal128Array>()
                        .with_precision_and_scale(20, 2)?,
                ),
            })
        };
        let types = [
            DataType::Boolean,
            DataType::Utf8View,
            DataType::LargeUtf8,
            DataType::BinaryView,
            DataType::LargeBinary,
            DataType::Decimal128(20, 2),
        ];
        let mut fields = vec![Field::new("id", DataType::Int64, false)];
        fields.extend(
            types
                .iter()
                .enumerate()
                .map(|(i, t)| Field::new(format!("c{i}"), t.clone(), true)),
        );
        fields.push(Field::new(SIDE_COL, DataType::Int8, false));
        let schema = Arc::new(Schema::new(fields));
        // a small linear congruential sequence draws the live values; the
        // snapshot changes one column of about half the keys (sometimes to
        // the same value)
        let mut state = 7u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        let keys = 500i64;
        let live: Vec<Vec<usize>> = (0..types.len())
            .map(|_| (0..keys).map(|_| next() % texts.len()).collect())
            .collect();
        let mut snapshot = live.clone();
        for key in 0..keys as usize {
            if next() % 2 == 0 {
                let (column, value) = (next() % types.len(), next() % texts.len());
                if let Some(v) = snapshot[column].get_mut(key) {
                    *v = value;
                }
            }
        }
        let mut batches = Vec::new();
        for (side, values) in [(SIDE_LIVE, &live), (SIDE_SNAPSHOT, &snapshot)] {
            let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(0..keys))];
            for (t, v) in types.iter().zip(values) {
                columns.push(column(v, t)?);
            }
            columns.push(Arc::new(Int8Array::from(vec![side; keys as usize])));
            let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
            batches.push(batch.slice(0, 200));
            batches.push(batch.slice(200, 300));
        }
        let [indexed, sorted] = both_diffs(&batches)?;
        assert_eq!(indexed, sorted);
        assert!(
            indexed.len() > 100 && indexed.len() < 300,
            "{}",
            indexed.len()
        );
        Ok(())
    }

    /// Two diffs sharing the batches, each indexing the rows routed to it
    /// (odd and even keys), give together the events of one diff over all
    /// rows; each holds its rows' share of the bytes, and a fall-back gets
    /// its own rows alone.
    #[test]
    fn diffs_sharing_batches_index_their_own_rows() -> Result<()> {
        let batches = [
            input(&[3, 4, 1], &[Some("C"), Some("d"), Some("a")], &[1, 1, 0]),
            input(&[2, 5], &[Some("b"), None], &[0, 1]),
            input(&[6, 3, 2], &[Some("f"), Some("c"), Some("b")], &[0, 0, 1]),
            input(&[5, 6], &[None, None], &[0, 1]),
        ];
        let routed = |b: &RecordBatch, parity: i64| -> Option<UInt32Array> {
            let ids = b.column(0).as_primitive::<arrow::datatypes::Int64Type>();
            let rows: Vec<u32> = (0..b.num_rows())
                .filter(|&i| ids.value(i) % 2 == parity)
                .map(|i| i as u32)
                .collect();
            (!rows.is_empty()).then(|| UInt32Array::from(rows))
        };
        let new_diff = || new_indexed(&batches[0].schema());
        let mut out = Vec::new();
        for parity in [0, 1] {
            let mut d = new_diff()?;
            for b in &batches {
                if let Some(rows) = routed(b, parity) {
                    d.push_rows(b, Some(&rows))?;
                }
            }
            let whole: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
            assert!(d.memory_size() < whole, "{} of {whole}", d.memory_size());
            d.finish(&mut |_| true)?;
            while let Some(b) = d.next_output(2)? {
                out.push(b);
            }
            // (what a fall-back sorts: the routed rows, copied)
            let mut fallen = new_diff()?;
            for b in &batches {
                if let Some(rows) = routed(b, parity) {
                    fallen.push_rows(b, Some(&rows))?;
                }
            }
            let ids: Vec<i64> = fallen
                .into_batches()?
                .iter()
                .flat_map(|b| {
                    let ids = b.column(0).as_primitive::<arrow::datatypes::Int64Type>();
                    ids.values().to_vec()
                })
                .collect();
            assert!(ids.iter().all(|id| id % 2 == parity), "{ids:?}");
            assert_eq!(ids.len(), 5);
        }
        assert_eq!(events(&out), indexed(&batches)?);
        Ok(())
    }

    #[test]
    fn duplicate_snapshot_key_is_an_error_before_any_output() {
        let batches = [
            input(&[5, 1], &[Some("x"), Some("a")], &[1, 0]),
            input(&[5], &[Some("x")], &[1]),
        ];
        let err = indexed(&batches).unwrap_err().to_string();
        assert!(
            err.contains("duplicate key (id=5) in the snapshot at version 7"),
            "{err}"
        );
    }

    #[test]
    fn wide_keys_are_not_supported() {
        let schema = input(&[1], &[None], &[0]).schema();
        assert!(IndexedSnapshotDiff::supports(&[0], &schema));
        assert!(!IndexedSnapshotDiff::supports(&[1], &schema));
    }
}
