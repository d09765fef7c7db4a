//! Emitting from retained batches: the indexed kernels decide which input
//! rows to emit in key order, then gather them in input order, a few source
//! batches at a time and each batch's rows in ascending order, so each
//! gather reads a small window of memory front to back.

use arrow::array::RecordBatch;
use arrow::compute::interleave_record_batch;
use datafusion::common::Result;

/// A row to emit: its place in the retained batches and an output kind (the
/// kernel's to interpret).
#[derive(Debug, Clone, Copy, Default)]
pub struct Emit {
    /// Retained batch.
    pub batch: u32,
    /// Row in that batch.
    pub row: u32,
    /// Output kind.
    pub kind: i8,
}

/// Emitted rows ordered by source batch, handed out a window at a time.
#[derive(Debug, Default)]
pub struct EmitQueue {
    /// The rows, by source batch ...
    emits: Vec<Emit>,
    /// ... those of batch `b` at `offsets[b]..offsets[b + 1]`.
    offsets: Vec<usize>,
    /// First batch not handed out yet.
    next: usize,
}

impl EmitQueue {
    /// Order `emits` (rows of `batches` retained batches) by batch (a
    /// counting sort), then each batch's by row.
    pub fn new(emits: Vec<Emit>, batches: usize) -> Self {
        let mut offsets = vec![0usize; batches + 1];
        for e in &emits {
            offsets[e.batch as usize + 1] += 1;
        }
        for b in 0..batches {
            offsets[b + 1] += offsets[b];
        }
        let mut slots = offsets.clone();
        let mut ordered = vec![Emit::default(); emits.len()];
        for e in emits {
            let slot = &mut slots[e.batch as usize];
            ordered[*slot] = e;
            *slot += 1;
        }
        // (in key order, a batch's rows would be read at random)
        for b in 0..batches {
            ordered[offsets[b]..offsets[b + 1]].sort_unstable_by_key(|e| e.row);
        }
        Self {
            emits: ordered,
            offsets,
            next: 0,
        }
    }

    /// Bytes held.
    pub fn memory_size(&self) -> usize {
        self.emits.capacity() * std::mem::size_of::<Emit>()
            + self.offsets.capacity() * std::mem::size_of::<usize>()
    }

    /// The next window of about `batch_size` rows, from consecutive source
    /// batches of `batches`, gathered (every column); with the rows' emits.
    /// `None` at the end.
    pub fn next_window(
        &mut self,
        batches: &[RecordBatch],
        batch_size: usize,
    ) -> Result<Option<(RecordBatch, &[Emit])>> {
        let count = self.offsets.len().saturating_sub(1);
        while self.next < count {
            let first = self.next;
            let start = self.offsets[first];
            let mut last = first + 1;
            while last < count && self.offsets[last] - start < batch_size {
                last += 1;
            }
            self.next = last;
            let emits = &self.emits[start..self.offsets[last]];
            if emits.is_empty() {
                continue;
            }
            let sources: Vec<&RecordBatch> = batches[first..last].iter().collect();
            let places: Vec<(usize, usize)> = emits
                .iter()
                .map(|e| (e.batch as usize - first, e.row as usize))
                .collect();
            return Ok(Some((interleave_record_batch(&sources, &places)?, emits)));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, Int32Array};
    use arrow::datatypes::{DataType, Field, Int32Type, Schema};
    use std::sync::Arc;

    #[test]
    fn windows_follow_the_source_batches() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int32, false)]));
        let batch = |values: Vec<i32>| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(Int32Array::from(values))],
            )
        };
        let batches = vec![batch(vec![0, 1])?, batch(vec![10, 11])?, batch(vec![20])?];
        let emit = |batch, row| Emit {
            batch,
            row,
            kind: 0,
        };
        let mut queue = EmitQueue::new(vec![emit(2, 0), emit(0, 1), emit(0, 0), emit(2, 0)], 3);
        let mut seen = Vec::new();
        while let Some((rows, emits)) = queue.next_window(&batches, 2)? {
            assert_eq!(rows.num_rows(), emits.len());
            seen.push(rows.column(0).as_primitive::<Int32Type>().values().to_vec());
        }
        // batch 0 (by row), batch 1 has nothing, then batch 2
        assert_eq!(seen, vec![vec![0, 1], vec![20, 20]]);
        Ok(())
    }
}
