//! Indexed snapshot diff: the rules of [`super::snapshot_diff`] without
//! sorting the rows.
//!
//! The sorted diff needs its input — every column of the snapshot and of the
//! live target — sorted by `(keys, side)`, which moves each row several
//! times. This one keeps the input batches where they arrive and sorts a
//! 32-byte entry per row instead:
//!
//! ```text
//!  push(batch) ─► retain batch, its values in row format
//!              └► index += (key as u128, side, batch, row)
//!  finish()    ─► sort index by key ─► per key: live / snapshot / both
//!              └► changed rows (values compared as row-format bytes), by batch
//!  next_output ─► gather the changed rows, a few source batches at a time
//! ```
//!
//! Keys must encode to at most 16 bytes of Arrow's row format (integers,
//! dates, timestamps, ... and short composites of them): [`IndexedSnapshotDiff::supports`].
//! Memory grows with the input (the caller reserves [`IndexedSnapshotDiff::memory_size`]
//! and falls back to the sorted diff when the pool refuses).

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{Int8Type, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows};
use datafusion::common::{DataFusionError, Result, ScalarValue};

use super::columns::Kind;
use super::emits::{Emit, EmitQueue};
use super::errors::format_key;
use super::rows::{encoded, encoded_width, row_converter, to_rows, MAX_ENCODED_BYTES};
use super::snapshot_diff::{
    diff_events, diff_output_schema, duplicate_key_error, SIDE_LIVE, SIDE_SNAPSHOT,
};

/// One input row in the index.
#[derive(Debug, Clone, Copy)]
struct Entry {
    key: u128,
    side: i8,
    batch: u32,
    row: u32,
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
    value_converter: RowConverter,
    batches: Vec<RecordBatch>,
    /// Row-format values (every target column) of each retained batch.
    values: Vec<Rows>,
    index: Vec<Entry>,
    /// Bytes of `batches` and `values`.
    retained_bytes: usize,
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
            value_converter: row_converter(input_schema, &(0..n).collect::<Vec<_>>())?,
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
            batches: Vec::new(),
            values: Vec::new(),
            index: Vec::new(),
            retained_bytes: 0,
            emits: None,
            counts: (0, 0),
        })
    }

    /// Schema of the produced events.
    pub fn output_schema(&self) -> &SchemaRef {
        &self.output_schema
    }

    /// Bytes held: the retained batches, their row-format values and the index.
    pub fn memory_size(&self) -> usize {
        self.retained_bytes + self.index.capacity() * std::mem::size_of::<Entry>()
    }

    /// The retained input batches (for a fall-back to the sorted diff).
    pub fn into_batches(self) -> Vec<RecordBatch> {
        self.batches
    }

    /// Retain one input batch and index its rows.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let number = u32::try_from(self.batches.len())
            .map_err(|_| DataFusionError::Internal("too many batches in one diff".into()))?;
        let n = batch.num_columns() - 1;
        let keys = to_rows(&self.key_converter, batch, &self.key_indices)?;
        let values = to_rows(&self.value_converter, batch, &(0..n).collect::<Vec<_>>())?;
        let sides = batch.column(n).as_primitive::<Int8Type>();
        self.index.reserve(batch.num_rows());
        for (row, side) in sides.values().iter().enumerate() {
            self.index.push(Entry {
                key: encoded(&keys, row),
                side: *side,
                batch: number,
                row: row as u32,
            });
        }
        self.retained_bytes += batch.get_array_memory_size() + values.size();
        self.batches.push(batch.clone());
        self.values.push(values);
        Ok(())
    }

    /// Sort the index and decide every key; errors (a key twice in the
    /// snapshot) surface here, before any output.
    pub fn finish(&mut self) -> Result<()> {
        self.index.sort_unstable_by_key(|e| e.key);
        let (mut emits, mut pairs) = (Vec::new(), Vec::new());
        let mut start = 0;
        while start < self.index.len() {
            let key = self.index[start].key;
            let mut end = start + 1;
            while end < self.index.len() && self.index[end].key == key {
                end += 1;
            }
            self.diff_key(start, end, &mut emits, &mut pairs)?;
            start = end;
        }
        self.index = Vec::new();
        // keys on both sides: compare the values (row format) walking the
        // live rows in place order, so that one side is read sequentially
        pairs.sort_unstable_by_key(|[batch, row, ..]| (*batch, *row));
        for [live_batch, live_row, batch, row] in pairs {
            let old = self.values[live_batch as usize].row(live_row as usize);
            let new = self.values[batch as usize].row(row as usize);
            if old != new {
                emits.push(Emit {
                    batch,
                    row,
                    kind: Kind::Upsert as i8,
                });
                self.counts.0 += 1;
            }
        }
        self.values = Vec::new();
        self.emits = Some(EmitQueue::new(emits, self.batches.len()));
        Ok(())
    }

    /// The rows `start..end` of the sorted index share one key: at most one
    /// live and one snapshot row. A key on both sides goes to `pairs` as
    /// `[live batch, live row, snapshot batch, snapshot row]`.
    fn diff_key(
        &mut self,
        start: usize,
        end: usize,
        emits: &mut Vec<Emit>,
        pairs: &mut Vec<[u32; 4]>,
    ) -> Result<()> {
        let entries = &self.index[start..end];
        let live = entries.iter().find(|e| e.side == SIDE_LIVE);
        let mut snapshots = entries.iter().filter(|e| e.side == SIDE_SNAPSHOT);
        let snap = snapshots.next();
        if let Some(second) = snapshots.next() {
            let batch = &self.batches[second.batch as usize];
            let key = format_key(
                &self.target_columns,
                &self.key_indices,
                batch,
                second.row as usize,
            );
            return Err(duplicate_key_error(&self.flow, &key, &self.version));
        }
        let emit = |e: &Entry, kind: Kind| Emit {
            batch: e.batch,
            row: e.row,
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
            (Some(l), Some(s)) => pairs.push([l.batch, l.row, s.batch, s.row]),
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
        let Some((gathered, emits)) = queue.next_window(&self.batches, batch_size)? else {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::snapshot_diff::{SnapshotDiff, SIDE_COL};
    use super::*;
    use arrow::array::{Array, Int64Array, Int8Array, StringArray};
    use arrow::compute::{concat_batches, lexsort_to_indices, take_record_batch, SortColumn};
    use arrow::datatypes::{DataType, Field};

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

    fn indexed(batches: &[RecordBatch]) -> Result<Vec<(i64, Option<String>, i8)>> {
        let mut d = IndexedSnapshotDiff::try_new(
            "f",
            vec![0],
            ScalarValue::Int64(Some(7)),
            ScalarValue::Int64(None),
            &batches[0].schema(),
        )?;
        for b in batches {
            d.push(b)?;
        }
        d.finish()?;
        let mut out = Vec::new();
        while let Some(b) = d.next_output(2)? {
            out.push(b);
        }
        Ok(events(&out))
    }

    /// The sorted diff over the same rows, sorted by (key, side).
    fn sorted(batches: &[RecordBatch]) -> Result<Vec<(i64, Option<String>, i8)>> {
        let all = concat_batches(&batches[0].schema(), batches)?;
        let order = lexsort_to_indices(
            &[
                SortColumn {
                    values: Arc::clone(all.column(0)),
                    options: None,
                },
                SortColumn {
                    values: Arc::clone(all.column(2)),
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
            &all.schema(),
        )?;
        let mut out = Vec::new();
        out.extend(d.push(&all)?);
        out.extend(d.finish()?);
        Ok(events(&out))
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
