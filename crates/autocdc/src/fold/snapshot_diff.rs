//! Snapshot diff: the change events that turn the target's live
//! state into a snapshot at version `v`.
//!
//! Input: the snapshot's rows and the target's live rows, tagged by side
//! (`__cdc_side`: 0 live, 1 snapshot) and sorted by `(keys, side)` — so each
//! key is a group of at most one live and one snapshot row, and the diff
//! streams like a merge join (DataFusion sorts and spills the input).
//!
//! ```text
//!  key in      live only   snapshot only   both, differing   both, equal
//!  event       DELETE@v    UPSERT@v        UPSERT@v          —
//! ```
//! A key twice in the snapshot is an error naming the flow, key and version.

use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, AsArray, Int8Array, RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take};
use arrow::datatypes::{DataType, Field, Int8Type, Schema, SchemaRef};
use arrow::row::{RowConverter, Rows};
use datafusion::common::{DataFusionError, Result, ScalarValue};

use super::columns::{Kind, Origin, KIND_COL, ORIGIN_COL, SEQ_COL, WRITTEN_AT_COL};
use super::errors::format_key;
use super::rows::{row_converter, to_rows};

/// Side tag column of the diff input.
pub const SIDE_COL: &str = "__cdc_side";
/// A live row of the target.
pub const SIDE_LIVE: i8 = 0;
/// A row of the snapshot.
pub const SIDE_SNAPSHOT: i8 = 1;

/// Schema of the events a diff produces from its input schema
/// `[target columns..., __cdc_side]`.
pub fn diff_output_schema(
    input: &Schema,
    version_type: &DataType,
    written_at_type: &DataType,
) -> SchemaRef {
    let n = input.fields().len() - 1;
    let mut fields: Vec<Field> = (0..n)
        .map(|i| input.field(i).clone().with_nullable(true))
        .collect();
    fields.push(Field::new(SEQ_COL, version_type.clone(), true));
    fields.push(Field::new(KIND_COL, DataType::Int8, false));
    fields.push(Field::new(WRITTEN_AT_COL, written_at_type.clone(), true));
    fields.push(Field::new(ORIGIN_COL, DataType::Int8, false));
    Arc::new(Schema::new(fields))
}

/// Streaming snapshot diff over key-sorted, side-tagged batches.
#[derive(Debug)]
pub struct SnapshotDiff {
    flow: String,
    key_indices: Vec<usize>,
    target_columns: Vec<String>,
    version: ScalarValue,
    written_at: ScalarValue,
    input_schema: SchemaRef,
    output_schema: SchemaRef,
    key_converter: RowConverter,
    value_converter: RowConverter,
    /// Every column but the side: a row's identity.
    value_columns: Vec<usize>,
    carry: Option<RecordBatch>,
    /// Events produced: upserts, deletes.
    pub counts: (usize, usize),
}

impl SnapshotDiff {
    /// A diff producing events at `version`, stamped `written_at`.
    pub fn try_new(
        flow: &str,
        key_indices: Vec<usize>,
        version: ScalarValue,
        written_at: ScalarValue,
        input_schema: &SchemaRef,
    ) -> Result<Self> {
        let n = input_schema.fields().len() - 1;
        let value_columns: Vec<usize> = (0..n).collect();
        Ok(Self {
            flow: flow.to_string(),
            key_converter: row_converter(input_schema, &key_indices)?,
            value_converter: row_converter(input_schema, &value_columns)?,
            value_columns,
            target_columns: (0..n)
                .map(|i| input_schema.field(i).name().clone())
                .collect(),
            output_schema: diff_output_schema(
                input_schema,
                &version.data_type(),
                &written_at.data_type(),
            ),
            input_schema: Arc::clone(input_schema),
            key_indices,
            version,
            written_at,
            carry: None,
            counts: (0, 0),
        })
    }

    /// Diff one sorted batch; returns the events of the key groups it completed.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        if batch.num_rows() == 0 {
            return Ok(None);
        }
        let input = match self.carry.take() {
            Some(carry) => concat_batches(&self.input_schema, [&carry, batch])?,
            None => batch.clone(),
        };
        let keys = to_rows(&self.key_converter, &input, &self.key_indices)?;
        let n = input.num_rows();
        let mut last_start = n - 1;
        while last_start > 0 && keys.row(last_start - 1) == keys.row(n - 1) {
            last_start -= 1;
        }
        self.carry = Some(input.slice(last_start, n - last_start));
        self.diff(&input, &keys, last_start)
    }

    /// Diff the last key group.
    pub fn finish(&mut self) -> Result<Option<RecordBatch>> {
        let Some(carry) = self.carry.take() else {
            return Ok(None);
        };
        let keys = to_rows(&self.key_converter, &carry, &self.key_indices)?;
        let n = carry.num_rows();
        self.diff(&carry, &keys, n)
    }

    fn diff(
        &mut self,
        batch: &RecordBatch,
        keys: &Rows,
        end: usize,
    ) -> Result<Option<RecordBatch>> {
        if end == 0 {
            return Ok(None);
        }
        let n = batch.num_columns() - 1;
        let values = to_rows(&self.value_converter, batch, &self.value_columns)?;
        let sides = batch.column(n).as_primitive::<Int8Type>();
        let mut rows: Vec<u32> = Vec::new();
        let mut kinds: Vec<i8> = Vec::new();
        let mut start = 0;
        while start < end {
            let mut stop = start + 1;
            while stop < end && keys.row(stop) == keys.row(start) {
                stop += 1;
            }
            let mut live = None;
            let mut snap = None;
            for i in start..stop {
                if sides.value(i) == SIDE_LIVE {
                    live = Some(i);
                } else if snap.replace(i).is_some() {
                    return Err(duplicate_key_error(
                        &self.flow,
                        &self.target_columns,
                        &self.key_indices,
                        batch,
                        i,
                        &self.version,
                    ));
                }
            }
            match (live, snap) {
                (Some(l), None) => {
                    rows.push(l as u32);
                    kinds.push(Kind::Delete as i8);
                    self.counts.1 += 1;
                }
                (None, Some(s)) => {
                    rows.push(s as u32);
                    kinds.push(Kind::Upsert as i8);
                    self.counts.0 += 1;
                }
                (Some(l), Some(s)) if values.row(l) != values.row(s) => {
                    rows.push(s as u32);
                    kinds.push(Kind::Upsert as i8);
                    self.counts.0 += 1;
                }
                _ => {}
            }
            start = stop;
        }
        if rows.is_empty() {
            return Ok(None);
        }
        let indices = UInt32Array::from(rows);
        let columns = (0..n)
            .map(|i| Ok(take(batch.column(i).as_ref(), &indices, None)?))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(diff_events(
            &self.output_schema,
            columns,
            kinds,
            &self.version,
            &self.written_at,
        )?))
    }
}

/// The error for the key of row `row` of `batch` (its key columns
/// `key_indices` of `columns`) found twice in a snapshot — or, when the key
/// has a NULL, the NULL key's error (as for one row of it: a NULL is no
/// key, two of them are not one key twice).
pub(crate) fn duplicate_key_error(
    flow: &str,
    columns: &[String],
    key_indices: &[usize],
    batch: &RecordBatch,
    row: usize,
    version: &ScalarValue,
) -> DataFusionError {
    let version = super::errors::scalar_text(version);
    if let Some(&null) = key_indices.iter().find(|&&k| batch.column(k).is_null(row)) {
        return crate::error::CdcError::NullKey {
            flow: flow.to_string(),
            column: columns[null].clone(),
            kind: Kind::Upsert.name(),
            sequence: version,
        }
        .into();
    }
    let key = format_key(columns, key_indices, batch, row);
    DataFusionError::Execution(format!(
        "flow '{flow}': duplicate key ({key}) in the snapshot at version {version}; nothing was committed"
    ))
}

/// Change events (`output_schema`) of the diff: the target `columns` of the
/// chosen rows, of `kinds`, at `version`, stamped `written_at`.
pub(crate) fn diff_events(
    output_schema: &SchemaRef,
    mut columns: Vec<ArrayRef>,
    kinds: Vec<i8>,
    version: &ScalarValue,
    written_at: &ScalarValue,
) -> Result<RecordBatch> {
    let len = kinds.len();
    columns.push(version.to_array_of_size(len)?);
    columns.push(Arc::new(Int8Array::from(kinds)));
    columns.push(if written_at.is_null() {
        new_null_array(&written_at.data_type(), len)
    } else {
        written_at.to_array_of_size(len)?
    });
    columns.push(Arc::new(Int8Array::from(vec![Origin::New as i8; len])));
    Ok(RecordBatch::try_new(Arc::clone(output_schema), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};

    fn input(ids: &[i64], vs: &[&str], sides: &[i8]) -> RecordBatch {
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

    fn diff(batches: &[RecordBatch]) -> Result<Vec<(i64, String, i8)>> {
        let schema = batches[0].schema();
        let mut d = SnapshotDiff::try_new(
            "f",
            vec![0],
            ScalarValue::Int64(Some(7)),
            ScalarValue::Int64(None),
            &schema,
        )?;
        let mut out = Vec::new();
        for b in batches {
            out.extend(d.push(b)?);
        }
        out.extend(d.finish()?);
        Ok(out
            .iter()
            .flat_map(|b| {
                let ids = b
                    .column(0)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .clone();
                let vs = b.column(1).as_string::<i32>().clone();
                let ks = b.column(3).as_primitive::<Int8Type>().clone();
                (0..b.num_rows()).map(move |i| (ids.value(i), vs.value(i).to_string(), ks.value(i)))
            })
            .collect())
    }

    #[test]
    fn diff_across_batch_boundaries() {
        // keys: 1 live only, 2 equal, 3 changed (split over batches), 4 new
        let a = input(&[1, 2, 2, 3], &["a", "b", "b", "c"], &[0, 0, 1, 0]);
        let b = input(&[3, 4], &["C", "d"], &[1, 1]);
        assert_eq!(
            diff(&[a, b]).unwrap(),
            vec![(1, "a".into(), 1), (3, "C".into(), 0), (4, "d".into(), 0)]
        );
    }

    #[test]
    fn duplicate_snapshot_key_is_an_error() {
        let a = input(&[5], &["x"], &[1]);
        let b = input(&[5], &["y"], &[1]);
        let err = diff(&[a, b]).unwrap_err().to_string();
        assert!(
            err.contains("duplicate key (id=5) in the snapshot at version 7"),
            "{err}"
        );
    }
}
