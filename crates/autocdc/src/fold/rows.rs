//! Arrow row format of event columns: the folds compare keys and sequences
//! as byte strings.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::Schema;
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::Result;

/// A converter of `columns` of `schema` to the row format.
pub fn row_converter(schema: &Schema, columns: &[usize]) -> Result<RowConverter> {
    Ok(RowConverter::new(
        columns
            .iter()
            .map(|&i| SortField::new(schema.field(i).data_type().clone()))
            .collect(),
    )?)
}

/// `columns` of `batch` in row format (one allocation per batch).
pub fn to_rows(converter: &RowConverter, batch: &RecordBatch, columns: &[usize]) -> Result<Rows> {
    let arrays: Vec<ArrayRef> = columns
        .iter()
        .map(|&i| Arc::clone(batch.column(i)))
        .collect();
    Ok(converter.convert_columns(&arrays)?)
}
