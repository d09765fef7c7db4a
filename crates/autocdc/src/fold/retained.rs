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
//!
//! A batch may also be shared with the folds of other partitions (a key
//! exchange hands each partition the whole batch and the rows of its keys,
//! `crate::physical::key_exchange`): [`Retained`] then keeps the rows with
//! it and counts the share of its bytes those rows are, so that the
//! partitions together count each batch once.

use arrow::array::{Array, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use datafusion::common::Result;

/// Bytes held beyond those the rows use, in eighths of the used bytes,
/// above which a retained batch is copied (⅜: 37.5 % slack).
const MAX_SLACK_EIGHTHS: usize = 3;

/// `batch`, or a copy of it in buffers of its rows' size when its buffers
/// hold much more (see the module docs).
pub fn retained(batch: &RecordBatch) -> Result<RecordBatch> {
    if !loose(batch)? {
        return Ok(batch.clone());
    }
    let rows = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    Ok(take_record_batch(batch, &rows)?)
}

/// Whether `batch`'s buffers hold much more than its rows use.
fn loose(batch: &RecordBatch) -> Result<bool> {
    let held = batch.get_array_memory_size();
    let mut used = 0;
    for column in batch.columns() {
        used += column.to_data().get_slice_memory_size()?;
    }
    Ok(held > used + used * MAX_SLACK_EIGHTHS / 8)
}

/// The batches an indexed fold retains (each [`retained`]), and the bytes
/// they hold.
#[derive(Debug, Default)]
pub struct Retained {
    batches: Vec<RecordBatch>,
    /// The rows of each batch that are this fold's (`None`: all of them).
    rows: Vec<Option<UInt32Array>>,
    /// Each batch's bytes, or its rows' share of them.
    sizes: Vec<usize>,
    bytes: usize,
}

impl Retained {
    /// Retain `batch` as the next batch.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        self.push_rows(batch, None).map(|_| ())
    }

    /// Retain `batch`, of which only `rows` (ascending) are this fold's
    /// when given: the batch is kept whole, shared (its other rows are
    /// other folds'), unless its buffers are loose, when `rows` are copied.
    /// Returns the batch as retained and the rows of it that are this
    /// fold's (`None`: all), which is what an index must point into.
    pub fn push_rows(
        &mut self,
        batch: &RecordBatch,
        rows: Option<&UInt32Array>,
    ) -> Result<(&RecordBatch, Option<&UInt32Array>)> {
        let (batch, rows) = match rows {
            Some(rows) if rows.len() < batch.num_rows() => {
                if loose(batch)? {
                    (take_record_batch(batch, rows)?, None)
                } else {
                    (batch.clone(), Some(rows.clone()))
                }
            }
            _ => (retained(batch)?, None),
        };
        let whole = batch.get_array_memory_size();
        let size = match &rows {
            Some(r) => whole * r.len() / batch.num_rows().max(1) + r.get_array_memory_size(),
            None => whole,
        };
        self.bytes += size;
        self.sizes.push(size);
        self.rows.push(rows);
        self.batches.push(batch);
        let b = self.batches.len() - 1;
        Ok((&self.batches[b], self.rows[b].as_ref()))
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
        self.rows[b] = None;
        self.bytes = self
            .bytes
            .saturating_sub(std::mem::take(&mut self.sizes[b]));
        batch
    }

    /// This fold's rows, in the order they were retained: each batch, or
    /// the copy of its rows where it was shared.
    pub fn into_batches(self) -> Result<Vec<RecordBatch>> {
        self.batches
            .into_iter()
            .zip(self.rows)
            .map(|(batch, rows)| match rows {
                Some(rows) => Ok(take_record_batch(&batch, &rows)?),
                None => Ok(batch),
            })
            .collect()
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
