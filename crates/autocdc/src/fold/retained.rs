//! Batches an indexed fold retains until its input ends, held at the size
//! of their rows.
//!
//! An upstream operator may hand over a batch whose buffers were sized for
//! more rows than it holds (a coalescer flushing a half-full batch keeps
//! the capacity it reserved). Passed along, such a batch costs nothing;
//! retained with every other batch of a partition, the slack adds up: at
//! 10 M events, half of the batches an SCD 2 query's fold received held
//! about half their bytes unused (~280 MB). [`retained`] copies those few
//! to tight buffers and keeps the others as they are; [`Retained`] holds an
//! indexed fold's batches so.

use arrow::array::{Array, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use datafusion::common::Result;

/// Bytes held beyond those the rows use, in eighths of the used bytes,
/// above which a retained batch is copied (⅜: 37.5 % slack).
const MAX_SLACK_EIGHTHS: usize = 3;

/// `batch`, or a copy of it in buffers of its rows' size when its buffers
/// hold much more (see the module docs).
pub fn retained(batch: &RecordBatch) -> Result<RecordBatch> {
    let held = batch.get_array_memory_size();
    let mut used = 0;
    for column in batch.columns() {
        used += column.to_data().get_slice_memory_size()?;
    }
    if held <= used + used * MAX_SLACK_EIGHTHS / 8 {
        return Ok(batch.clone());
    }
    let rows = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    Ok(take_record_batch(batch, &rows)?)
}

/// The batches an indexed fold retains (each [`retained`]), and the bytes
/// they hold.
#[derive(Debug, Default)]
pub struct Retained {
    batches: Vec<RecordBatch>,
    bytes: usize,
}

impl Retained {
    /// Retain `batch` as the next batch.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let batch = retained(batch)?;
        self.bytes += batch.get_array_memory_size();
        self.batches.push(batch);
        Ok(())
    }

    /// The batches, in the order they were retained.
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }

    /// Number of batches retained.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Bytes held.
    pub fn memory_size(&self) -> usize {
        self.bytes
    }

    /// Batch `b`, released (an empty batch takes its place).
    pub fn release(&mut self, b: usize) -> RecordBatch {
        let empty = RecordBatch::new_empty(self.batches[b].schema());
        let batch = std::mem::replace(&mut self.batches[b], empty);
        self.bytes = self.bytes.saturating_sub(batch.get_array_memory_size());
        batch
    }

    /// The batches, in the order they were retained.
    pub fn into_batches(self) -> Vec<RecordBatch> {
        self.batches
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Builder, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    #[test]
    fn slack_is_dropped_and_tight_batches_are_kept() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Utf8, true),
        ]));
        // a builder sized for 8192 rows, holding 100
        let mut a = Int64Builder::with_capacity(8192);
        a.append_slice(&(0..100).collect::<Vec<i64>>());
        let b = StringArray::from_iter((0..100).map(|i| Some(format!("v{i}"))));
        let loose = RecordBatch::try_new(schema, vec![Arc::new(a.finish()), Arc::new(b)])?;
        let kept = retained(&loose)?;
        assert_eq!(kept, loose);
        assert!(kept.get_array_memory_size() * 4 < loose.get_array_memory_size());
        // a tight batch (the copy) is kept as it is: the same buffers
        let again = retained(&kept)?;
        assert_eq!(again, kept);
        for (a, b) in again.columns().iter().zip(kept.columns()) {
            assert_eq!(
                a.to_data().buffers()[0].as_ptr(),
                b.to_data().buffers()[0].as_ptr()
            );
        }
        Ok(())
    }
}
