//! Primary-key changes in Debezium events: an update (`_op = 'u'`) whose
//! `before` image holds a key other than its row's is also a DELETE of the
//! old key, at the same sequence.
//!
//! | event                                              | rows              |
//! |----------------------------------------------------|-------------------|
//! | `u`, `_before` NULL or a key column NULL in it      | the event         |
//! | `u`, a key column NULL in its row                  | the event (it fails, or is a reject) |
//! | `u`, `_before` key = row key                       | the event         |
//! | `u`, `_before` key ≠ row key                       | the event + a `d` of the `_before` key (other columns the row's, same `_seq`, same `_before`) |
//! | `c`, `r`, `d`, `t`                                 | the event         |
//!
//! The `d` carries the row's values, so that a flow's expectations judge
//! it as they judge the update: a row an expectation drops moves no key.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use arrow::compute::kernels::boolean::{and, or};
use arrow::compute::kernels::cmp::{distinct, eq};
use arrow::compute::{cast, filter_record_batch, is_not_null};
use datafusion::common::{DataFusionError, Result};

use super::decode::{BEFORE_COL, OP_COL};

/// The key columns of the rows (positions in the decoded schema and in the
/// `_before` struct).
#[derive(Debug, Clone)]
pub(crate) struct MovedKeys {
    /// Decoded-schema position of each key column.
    keys: Vec<usize>,
    /// Field position of each key column in `_before`.
    before_fields: Vec<usize>,
}

impl MovedKeys {
    /// For the key columns `names` of `schema` (a decoded schema).
    pub(crate) fn try_new(schema: &arrow::datatypes::Schema, names: &[String]) -> Result<Self> {
        let before = schema.field_with_name(BEFORE_COL)?;
        let arrow::datatypes::DataType::Struct(before_fields) = before.data_type() else {
            return Err(DataFusionError::Internal(format!(
                "debezium: {BEFORE_COL} is not a struct"
            )));
        };
        let find = |name: &str| -> Result<(usize, usize)> {
            let column = schema
                .fields()
                .iter()
                .position(|f| f.name().eq_ignore_ascii_case(name));
            let field = before_fields
                .iter()
                .position(|f| f.name().eq_ignore_ascii_case(name));
            match (column, field) {
                (Some(c), Some(f)) => Ok((c, f)),
                _ => Err(DataFusionError::Plan(format!(
                    "debezium: key column '{name}' is not a column of the events"
                ))),
            }
        };
        let (keys, before_fields) = names
            .iter()
            .map(|n| find(n))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        Ok(Self {
            keys,
            before_fields,
        })
    }

    /// The DELETE events of the old keys of `batch`'s primary-key changes,
    /// if any.
    pub(crate) fn deletes(&self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        let schema = batch.schema();
        let ops = batch.column(schema.index_of(OP_COL)?);
        let before = batch.column(schema.index_of(BEFORE_COL)?);
        let before = before.as_struct();
        let updates = eq(ops, &StringArray::new_scalar("u"))?;
        let mut moved = and(&updates, &is_not_null(before)?)?;
        let mut differs = BooleanArray::from(vec![false; batch.num_rows()]);
        for (&key, &field) in self.keys.iter().zip(&self.before_fields) {
            let now = batch.column(key);
            let old = cast(before.column(field), now.data_type())?;
            moved = and(&moved, &and(&is_not_null(&old)?, &is_not_null(now)?)?)?;
            differs = or(&differs, &distinct(&old, now)?)?;
        }
        let moved = and(&moved, &differs)?;
        if moved.true_count() == 0 {
            return Ok(None);
        }
        let rows = filter_record_batch(batch, &moved)?;
        let n = rows.num_rows();
        let old_keys: Vec<(usize, ArrayRef)> = self
            .keys
            .iter()
            .zip(&self.before_fields)
            .map(|(&key, &field)| {
                let before = rows.column(schema.index_of(BEFORE_COL)?).as_struct();
                Ok((
                    key,
                    cast(before.column(field), schema.field(key).data_type())?,
                ))
            })
            .collect::<Result<_>>()?;
        let op = schema.index_of(OP_COL)?;
        let columns: Vec<ArrayRef> = (0..schema.fields().len())
            .map(|i| {
                if let Some((_, old)) = old_keys.iter().find(|(k, _)| *k == i) {
                    Arc::clone(old)
                } else if i == op {
                    Arc::new(StringArray::from(vec!["d"; n])) as ArrayRef
                } else {
                    Arc::clone(rows.column(i))
                }
            })
            .collect();
        Ok(Some(RecordBatch::try_new(schema, columns)?))
    }
}
