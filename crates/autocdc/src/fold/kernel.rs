//! The interface the `AutoCdcExec` operator drives, one implementation per
//! storage type.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::row::{OwnedRow, Row, RowConverter, Rows};
use datafusion::common::Result;

use super::errors::check_truncate_sequences;
use super::rows::{row_converter, to_rows};
use super::FoldCounts;

/// A streaming per-key fold over event batches sorted by
/// `(keys, seq, origin)`.
pub trait FoldKernel: Send + std::fmt::Debug {
    /// Raise the truncate watermark with the sequences of TRUNCATE events
    /// (SCD 1 only; other kernels never get TRUNCATE events): stored rows
    /// and new events at or below them are removed.
    fn observe_watermark(&mut self, sequences: &ArrayRef) -> Result<()>;
    /// Raise the truncate watermark with the stored watermark (earlier
    /// updates' TRUNCATEs): it keeps new events at or below it out, but
    /// removes no stored row — those it removed are gone, and those below
    /// it now were written later by DML (an `INSERT` without a tombstone
    /// takes the least sequence).
    fn observe_stored_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        self.observe_watermark(sequences)
    }
    /// The truncate watermark as a one-element array, once observed.
    fn watermark_value(&self) -> Option<&ArrayRef>;
    /// Fold one sorted batch; returns the stored rows of the key groups it
    /// completed.
    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>>;
    /// Finish the last open key group.
    fn finish_all(&mut self) -> Result<Option<RecordBatch>>;
    /// From now on every pushed batch ends with a whole key group (no later
    /// batch holds its keys): kernels that carry a batch's last group over
    /// to the next batch fold it at once instead ([`GroupCarry::whole_groups`]).
    fn expect_whole_groups(&mut self) {}
    /// What the fold did so far.
    fn counts(&self) -> FoldCounts;
    /// Schema of the produced rows.
    fn output_schema(&self) -> &SchemaRef;
}

/// The truncate watermarks of an SCD 1 fold, each as a row of the fold's
/// sequence converter and as a one-element array: the greatest TRUNCATE
/// seen, stored or new (new events at or below it are dropped), and the
/// greatest of this update (stored rows at or below it go; see
/// [`FoldKernel::observe_stored_watermark`]).
#[derive(Debug, Default)]
pub struct TruncateWatermarks {
    all: Option<(OwnedRow, ArrayRef)>,
    this_update: Option<(OwnedRow, ArrayRef)>,
}

impl TruncateWatermarks {
    /// Raise them with the TRUNCATE sequences `sequences` of this update
    /// (`this_update`) or of the stored watermark; NULLs fail the fold.
    pub fn raise(
        &mut self,
        flow: &str,
        converter: &RowConverter,
        sequences: &ArrayRef,
        this_update: bool,
    ) -> Result<()> {
        check_truncate_sequences(flow, sequences.as_ref())?;
        let rows = converter.convert_columns(std::slice::from_ref(sequences))?;
        let raise = |slot: &mut Option<(OwnedRow, ArrayRef)>, row: Row<'_>, i: usize| {
            if slot.as_ref().is_none_or(|(w, _)| row > w.row()) {
                *slot = Some((row.owned(), sequences.slice(i, 1)));
            }
        };
        for (i, row) in rows.iter().enumerate() {
            raise(&mut self.all, row, i);
            if this_update {
                raise(&mut self.this_update, row, i);
            }
        }
        Ok(())
    }

    /// The greatest TRUNCATE seen.
    pub fn all(&self) -> Option<&OwnedRow> {
        self.all.as_ref().map(|(row, _)| row)
    }

    /// The greatest TRUNCATE of this update.
    pub fn this_update(&self) -> Option<&OwnedRow> {
        self.this_update.as_ref().map(|(row, _)| row)
    }

    /// [`Self::all`] as a one-element array (the watermark row's sequence).
    pub fn value(&self) -> Option<&ArrayRef> {
        self.all.as_ref().map(|(_, value)| value)
    }

    /// [`Self::this_update`] as a one-element array.
    pub fn this_update_value(&self) -> Option<&ArrayRef> {
        self.this_update.as_ref().map(|(_, value)| value)
    }
}

/// First row of the last key group of `keys` (`n` rows, `n > 0`).
fn last_group_start(keys: &Rows, n: usize) -> usize {
    let mut start = n.saturating_sub(1);
    while start > 0 && keys.row(start - 1) == keys.row(n - 1) {
        start -= 1;
    }
    start
}

/// Carries the last key group of each batch over to the next one, for folds
/// that need whole key groups (SCD 2, BITEMPORAL, partial updates).
#[derive(Debug)]
pub struct GroupCarry {
    schema: SchemaRef,
    keys: RowConverter,
    key_indices: Vec<usize>,
    carry: Option<RecordBatch>,
    /// Batches end with whole key groups: nothing to carry.
    whole_groups: bool,
}

impl GroupCarry {
    /// A carry for batches of `schema` keyed by the columns `key_indices`.
    pub fn try_new(schema: &SchemaRef, key_indices: &[usize]) -> Result<Self> {
        Ok(Self {
            schema: Arc::clone(schema),
            keys: row_converter(schema, key_indices)?,
            key_indices: key_indices.to_vec(),
            carry: None,
            whole_groups: false,
        })
    }

    /// From now on every batch ends with a whole key group (see
    /// [`FoldKernel::expect_whole_groups`]): [`Self::push`] carries nothing
    /// and converts no key.
    pub fn whole_groups(&mut self) {
        self.whole_groups = true;
    }

    /// `batch` (non-empty) behind the carried rows, and how many of its
    /// leading rows are whole key groups; the last group is carried on.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<(RecordBatch, usize)> {
        if self.whole_groups && self.carry.is_none() {
            return Ok((batch.clone(), batch.num_rows()));
        }
        let input = match self.carry.take() {
            Some(carry) => concat_batches(&self.schema, [&carry, batch])?,
            None => batch.clone(),
        };
        let keys = to_rows(&self.keys, &input, &self.key_indices)?;
        let n = input.num_rows();
        let last = last_group_start(&keys, n);
        self.carry = Some(input.slice(last, n - last));
        Ok((input, last))
    }

    /// The rows still carried: the last key group.
    pub fn finish(&mut self) -> Option<RecordBatch> {
        self.carry.take()
    }
}
