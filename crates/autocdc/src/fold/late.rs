//! Events older than a watermark of the target: once a snapshot at version
//! `v` was applied (SPEC §2.3, §3), or a TRUNCATE at `t` of an earlier update
//! of an SCD 1 target (§2.3), a change event whose sequence is at or below
//! `v` (`t`) is older than an authoritative state. It is late: taken out
//! before any kernel sees it, and counted as an input row and as late.
//!
//! | event of the update                             | late  |
//! |-------------------------------------------------|-------|
//! | new UPSERT or DELETE, sequence ≤ the watermark   | yes   |
//! | new UPSERT or DELETE, sequence > the watermark   | no    |
//! | NULL sequence or NULL key column                 | no: the kernel (or the rejects) reports it |
//! | TRUNCATE                                         | no: it applies after the snapshot's keys as ever |
//! | stored row, event written by DML                 | no    |
//!
//! A TRUNCATE of the update itself makes no event late: the events before
//! it apply, then it removes their keys (the kernels' rule).

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{Int8Type, Schema};
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::{DataFusionError, Result};

use super::columns::{EventLayout, Kind, Origin};

/// Finds the late events of batches laid out as an [`EventLayout`] says.
#[derive(Debug)]
pub struct LateEvents {
    seq: usize,
    kind: usize,
    origin: usize,
    keys: Vec<usize>,
    converter: RowConverter,
    /// The watermark candidates, in the row format of the sequence; the
    /// watermark is the greatest.
    through: Rows,
    /// Which of `through` is the watermark.
    greatest: usize,
}

impl LateEvents {
    /// Late events of `schema` (laid out as `layout`): those at or below
    /// `through`, the snapshot watermark as text of the sequence's type.
    pub fn try_new(layout: &EventLayout, schema: &Schema, through: &str) -> Result<Self> {
        let seq_type = schema.field(layout.seq()).data_type();
        let value = crate::stored_value::from_text(through, seq_type).map_err(|e| {
            DataFusionError::Execution(format!(
                "the snapshot watermark '{through}' is not a {seq_type} sequence: {e}"
            ))
        })?;
        Self::at_or_below(layout, schema, &value.to_array()?)
    }

    /// Late events of `schema` (laid out as `layout`): those at or below the
    /// greatest of `sequences` (the stored TRUNCATE sequences; not empty).
    pub fn at_or_below(
        layout: &EventLayout,
        schema: &Schema,
        sequences: &ArrayRef,
    ) -> Result<Self> {
        let seq_type = schema.field(layout.seq()).data_type();
        let converter = RowConverter::new(vec![SortField::new(seq_type.clone())])?;
        let through = converter.convert_columns(std::slice::from_ref(sequences))?;
        let greatest = (0..through.num_rows())
            .max_by(|a, b| through.row(*a).cmp(&through.row(*b)))
            .ok_or_else(|| DataFusionError::Internal("a watermark of no sequence".into()))?;
        Ok(Self {
            seq: layout.seq(),
            kind: layout.kind(),
            origin: layout.origin(),
            keys: layout.key_indices.clone(),
            converter,
            through,
            greatest,
        })
    }

    /// `batch` without its late events, and how many it had.
    pub fn drop_late(&self, batch: &RecordBatch) -> Result<(RecordBatch, usize)> {
        let seq = batch.column(self.seq);
        let kinds = batch.column(self.kind).as_primitive::<Int8Type>();
        let origins = batch.column(self.origin).as_primitive::<Int8Type>();
        let keys: Vec<_> = self.keys.iter().map(|&k| batch.column(k)).collect();
        let rows = self.converter.convert_columns(std::slice::from_ref(seq))?;
        let through = self.through.row(self.greatest);
        let mut late = 0;
        let kept: BooleanArray = (0..batch.num_rows())
            .map(|i| {
                let is_late = origins.value(i) == Origin::New as i8
                    && kinds.value(i) != Kind::Truncate as i8
                    && seq.is_valid(i)
                    && keys.iter().all(|k| k.is_valid(i))
                    && rows.row(i) <= through;
                late += usize::from(is_late);
                Some(!is_late)
            })
            .collect();
        if late == 0 {
            return Ok((batch.clone(), 0));
        }
        Ok((filter_record_batch(batch, &kept)?, late))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::test_support::layout;
    use arrow::array::{Int64Array, Int8Array, StringArray};
    use arrow::datatypes::{DataType, Field};
    use std::sync::Arc;

    #[test]
    fn only_new_key_events_at_or_below_the_watermark_are_late() -> Result<()> {
        let layout = layout(false);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
            Field::new("__cdc_seq", DataType::Int64, true),
            Field::new("__cdc_kind", DataType::Int8, false),
            Field::new("__cdc_written_at", DataType::Int64, true),
            Field::new("__cdc_origin", DataType::Int8, false),
        ]));
        let (up, del, trunc) = (Kind::Upsert as i8, Kind::Delete as i8, Kind::Truncate as i8);
        let (new, stored) = (Origin::New as i8, Origin::Stored as i8);
        // (id, seq, kind, origin), one row per case of the module's table
        let rows: [(Option<i64>, Option<i64>, i8, i8); 8] = [
            (Some(1), Some(4), up, new),    // late
            (Some(2), Some(5), del, new),   // late: at the watermark
            (Some(3), Some(6), up, new),    // newer
            (Some(4), None, up, new),       // NULL sequence: the kernel says
            (None, Some(2), up, new),       // NULL key: the kernel says
            (None, Some(1), trunc, new),    // a truncate
            (Some(5), Some(1), up, stored), // a stored row
            (Some(6), Some(3), del, new),   // late
        ];
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from(vec!["x"; 8])),
                Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1))),
                Arc::new(Int8Array::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(Int64Array::from(vec![0; 8])),
                Arc::new(Int8Array::from_iter_values(rows.iter().map(|r| r.3))),
            ],
        )?;
        let late = LateEvents::try_new(&layout, &schema, "5")?;
        let (kept, dropped) = late.drop_late(&batch)?;
        assert_eq!(dropped, 3);
        let ids: Vec<Option<i64>> = kept
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>()
            .iter()
            .collect();
        assert_eq!(ids, [Some(3), Some(4), None, None, Some(5)]);
        assert!(LateEvents::try_new(&layout, &schema, "five").is_err());
        Ok(())
    }
}
