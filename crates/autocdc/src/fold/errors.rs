//! Data errors of the fold kernels: each is a [`CdcError`] naming the flow,
//! the clause or key, and the offending value, and says that nothing was
//! committed (the update fails before its commit).

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::Int8Type;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::{DataFusionError, ScalarValue};

use super::columns::{EventLayout, Kind};
use crate::error::CdcError;

/// The value at `row` of `column`, as SQL shows it (a timestamp as a
/// time, not as its count of units).
fn value(batch: &RecordBatch, column: usize, row: usize) -> String {
    let options = FormatOptions::default().with_null("NULL");
    match ArrayFormatter::try_new(batch.column(column).as_ref(), &options) {
        Ok(formatter) => formatter.value(row).to_string(),
        Err(_) => ScalarValue::try_from_array(batch.column(column), row)
            .map(|s| s.to_string())
            .unwrap_or_default(),
    }
}

/// `value` as SQL shows it (see [`value`]).
pub(crate) fn scalar_text(value: &ScalarValue) -> String {
    let options = FormatOptions::default().with_null("NULL");
    value
        .to_array()
        .ok()
        .and_then(|array| {
            let formatter = ArrayFormatter::try_new(array.as_ref(), &options).ok()?;
            Some(formatter.value(0).to_string())
        })
        .unwrap_or_else(|| value.to_string())
}

/// `k1=v1, k2=v2` for the key of `row`.
pub fn format_key(
    columns: &[String],
    key_indices: &[usize],
    batch: &RecordBatch,
    row: usize,
) -> String {
    key_indices
        .iter()
        .map(|&k| format!("{}={}", columns[k], value(batch, k, row)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reject NULL sequences and NULL keys in an event batch.
pub fn check_event_nulls(
    flow: &str,
    layout: &EventLayout,
    batch: &RecordBatch,
) -> Result<(), DataFusionError> {
    let key = |row| format_key(&layout.target_columns, &layout.key_indices, batch, row);
    let seq = batch.column(layout.seq());
    if let Some(row) = first_null_value(seq.as_ref()) {
        return Err(CdcError::NullSequence {
            flow: flow.to_string(),
            key: Some(key(row)),
        }
        .into());
    }
    for &k in &layout.key_indices {
        let col = batch.column(k);
        if col.null_count() > 0 {
            let row = first_null(col.as_ref());
            let kind = Kind::from_code(
                batch
                    .column(layout.kind())
                    .as_primitive::<Int8Type>()
                    .value(row),
            )
            .unwrap_or(Kind::Upsert);
            return Err(CdcError::NullKey {
                flow: flow.to_string(),
                column: layout.target_columns[k].clone(),
                kind: kind.name(),
                sequence: value(batch, layout.seq(), row),
            }
            .into());
        }
    }
    Ok(())
}

/// Reject NULLs among TRUNCATE event sequences.
pub fn check_truncate_sequences(flow: &str, sequences: &dyn Array) -> Result<(), DataFusionError> {
    if first_null_value(sequences).is_some() {
        return Err(CdcError::NullSequence {
            flow: flow.to_string(),
            key: None,
        }
        .into());
    }
    Ok(())
}

/// Two events of one key with equal sequence but different content.
pub fn conflict_error(
    flow: &str,
    layout: &EventLayout,
    batch: &RecordBatch,
    row: usize,
    against_stored: bool,
) -> DataFusionError {
    CdcError::ConflictingEvents {
        flow: flow.to_string(),
        key: format_key(&layout.target_columns, &layout.key_indices, batch, row),
        sequence: value(batch, layout.seq(), row),
        against_stored,
    }
    .into()
}

fn first_null(array: &dyn Array) -> usize {
    (0..array.len()).find(|&i| array.is_null(i)).unwrap_or(0)
}

/// The first row whose value is NULL or, for a STRUCT (a `SEQUENCE BY
/// STRUCT(...)`), holds a NULL field at any depth (a NULL in a
/// sequence column is an error).
pub fn first_null_value(array: &dyn Array) -> Option<usize> {
    if array.null_count() > 0 {
        return Some(first_null(array));
    }
    let fields = array.as_struct_opt()?;
    fields
        .columns()
        .iter()
        .filter_map(|child| first_null_value(child.as_ref()))
        .min()
}
