//! Arrow row format of event columns: the folds compare keys and sequences
//! as byte strings.
//!
//! Both helpers are total over an empty column set. Arrow's converter of no
//! column produces no row at all (it takes the row count from the first
//! column), so a kernel indexing such `Rows` by input row would panic; here
//! an empty set is encoded as one all-NULL column instead, which gives every
//! row the same (empty) value. That is what an empty tracked set (SCD 2
//! flows whose every non-key column is untracked) and a keys-only source
//! mean: nothing to compare, every row equal.

use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Schema};
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::Result;

/// A converter of `columns` of `schema` to the row format (of a NULL column
/// when `columns` is empty, see the module docs).
pub fn row_converter(schema: &Schema, columns: &[usize]) -> Result<RowConverter> {
    if columns.is_empty() {
        return Ok(RowConverter::new(vec![SortField::new(DataType::Null)])?);
    }
    Ok(RowConverter::new(
        columns
            .iter()
            .map(|&i| SortField::new(schema.field(i).data_type().clone()))
            .collect(),
    )?)
}

/// `columns` of `batch` in row format (one allocation per batch), made by a
/// [`row_converter`] of the same columns: one row per row of `batch`, even
/// when `columns` is empty.
pub fn to_rows(converter: &RowConverter, batch: &RecordBatch, columns: &[usize]) -> Result<Rows> {
    if columns.is_empty() {
        let nulls = new_null_array(&DataType::Null, batch.num_rows());
        return Ok(converter.convert_columns(&[nulls])?);
    }
    let arrays: Vec<ArrayRef> = columns
        .iter()
        .map(|&i| Arc::clone(batch.column(i)))
        .collect();
    Ok(converter.convert_columns(&arrays)?)
}

/// Widest row-format encoding that fits an index entry (a `u128`).
pub const MAX_ENCODED_BYTES: usize = 16;

/// Row `i` of `rows` (at most 16 bytes) as a big-endian integer: integers
/// compare like the bytes since every row of a fixed-width encoding has the
/// same length.
pub fn encoded(rows: &Rows, i: usize) -> u128 {
    let row = rows.row(i);
    let bytes = row.as_ref();
    let mut buf = [0u8; MAX_ENCODED_BYTES];
    let n = bytes.len().min(MAX_ENCODED_BYTES);
    buf[..n].copy_from_slice(&bytes[..n]);
    u128::from_be_bytes(buf)
}

/// Row-format width of fixed-width `types` (1 null byte + the value each),
/// if every type is fixed-width.
pub fn encoded_width<'a>(types: impl IntoIterator<Item = &'a DataType>) -> Option<usize> {
    types
        .into_iter()
        .map(|t| match t {
            DataType::Boolean => Some(2),
            t => t.primitive_width().map(|w| w + 1),
        })
        .sum()
}
