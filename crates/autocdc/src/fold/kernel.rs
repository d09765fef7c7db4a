//! The interface the `AutoCdcExec` operator drives, one implementation per
//! storage type.

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use datafusion::common::Result;

use super::FoldCounts;

/// A streaming per-key fold over event batches sorted by
/// `(keys, seq, origin)`.
pub trait FoldKernel: Send + std::fmt::Debug {
    /// Raise the truncate watermark (SCD 1 only; other kernels never get
    /// TRUNCATE events).
    fn observe_watermark(&mut self, sequences: &ArrayRef) -> Result<()>;
    /// The truncate watermark as a one-element array, once observed.
    fn watermark_value(&self) -> Option<&ArrayRef>;
    /// Fold one sorted batch; returns the stored rows of the key groups it
    /// completed.
    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>>;
    /// Finish the last open key group.
    fn finish_all(&mut self) -> Result<Option<RecordBatch>>;
    /// What the fold did so far.
    fn counts(&self) -> FoldCounts;
    /// Schema of the produced rows.
    fn output_schema(&self) -> &SchemaRef;
}

/// First row of the last key group of `keys` (`n` rows, `n > 0`): that group
/// may continue in the next batch, so folds carry it over.
pub fn last_group_start(keys: &arrow::row::Rows, n: usize) -> usize {
    let mut start = n.saturating_sub(1);
    while start > 0 && keys.row(start - 1) == keys.row(n - 1) {
        start -= 1;
    }
    start
}
