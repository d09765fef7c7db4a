//! Parquet bloom filters on key columns: a small update's key probe skips
//! the row groups that cannot hold any of its keys.
//!
//! Data files carry a split-block bloom filter (Parquet's) per row group on
//! each key column of a supported type ([`bloom_column`]). The probe of a
//! small update ([`super::deletion_vectors::superseded_rows`]) checks its
//! keys against them before decoding a row group's keys, so its cost
//! follows the number of keys, not the size of the files:
//!
//! | key column type (stored)                     | value checked (Parquet's plain encoding) |
//! |----------------------------------------------|------------------------------------------|
//! | `Int8`, `Int16`, `Int32`, `Date32`           | the value as `i32`                       |
//! | `Int64`, `Timestamp(_)`                      | the value as `i64`                       |
//! | `Utf8`, `LargeUtf8`, `Utf8View`, `Binary`, … | the bytes                                |
//! | anything else                                | no filter: every row group is read       |
//!
//! A row group may hold a key when, for every key column, its filter says
//! the key's value may be present (a filter has false positives, never
//! false negatives). Files without filters (written before) are read whole.

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int32Type, Int64Type};
use datafusion::common::Result;
use deltalake_core::parquet::basic::Type as PhysicalType;
use deltalake_core::parquet::bloom_filter::Sbbf;

/// False-positive probability of a key column's filter.
pub(crate) const BLOOM_FPP: f64 = 0.01;

/// Updates with more keys than this probe every row group: with as many
/// keys nearly every row group holds one, and checking them all would cost
/// more than it saves.
pub(crate) const BLOOM_PROBE_MAX_KEYS: usize = 1024;

/// Whether a key column of type `data_type` gets a bloom filter.
pub(crate) fn bloom_column(data_type: &DataType) -> bool {
    value_kind(data_type).is_some()
}

#[derive(Debug, Clone, Copy)]
enum ValueKind {
    I32,
    I64,
    Bytes,
}

fn value_kind(data_type: &DataType) -> Option<ValueKind> {
    match data_type {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Date32 => {
            Some(ValueKind::I32)
        }
        DataType::Int64 | DataType::Timestamp(_, _) => Some(ValueKind::I64),
        DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView => Some(ValueKind::Bytes),
        _ => None,
    }
}

/// One key column's value as Parquet hashes it into a bloom filter.
#[derive(Debug, Clone)]
enum Value {
    I32(i32),
    I64(i64),
    Bytes(Box<[u8]>),
}

impl Value {
    fn in_filter(&self, filter: &Sbbf) -> bool {
        match self {
            Value::I32(v) => filter.check(v),
            Value::I64(v) => filter.check(v),
            Value::Bytes(v) => filter.check(v.as_ref()),
        }
    }
}

/// The keys of an update, by key column, in the form bloom filters check.
#[derive(Debug)]
pub(crate) struct KeyValues {
    /// `keys[k][c]`: key `k`'s value in key column `c`.
    keys: Vec<Vec<Value>>,
}

impl KeyValues {
    /// The keys of `batches` (columns: the key columns, stored types);
    /// `None` when a key column has no filter or there are too many keys.
    pub(crate) fn try_new(batches: &[RecordBatch], distinct_keys: usize) -> Result<Option<Self>> {
        if distinct_keys > BLOOM_PROBE_MAX_KEYS {
            return Ok(None);
        }
        let mut keys = Vec::with_capacity(distinct_keys);
        for batch in batches {
            let Some(columns) = batch
                .columns()
                .iter()
                .map(|c| value_kind(c.data_type()).map(|kind| (kind, c)))
                .collect::<Option<Vec<_>>>()
            else {
                return Ok(None);
            };
            let columns = columns
                .into_iter()
                .map(|(kind, c)| values(kind, c))
                .collect::<Result<Vec<_>>>()?;
            for row in 0..batch.num_rows() {
                keys.push(columns.iter().map(|c| c[row].clone()).collect());
            }
        }
        Ok(Some(Self { keys }))
    }

    /// Whether key column `column`'s filters can be checked in a file that
    /// stores it with Parquet physical type `physical`: a column written
    /// under an older, narrower type (a widened key) hashed other bytes, so
    /// its filters are not used.
    pub(crate) fn checkable(&self, column: usize, physical: PhysicalType) -> bool {
        let Some(value) = self.keys.first().and_then(|k| k.get(column)) else {
            return false;
        };
        matches!(
            (value, physical),
            (Value::I32(_), PhysicalType::INT32)
                | (Value::I64(_), PhysicalType::INT64)
                | (Value::Bytes(_), PhysicalType::BYTE_ARRAY)
        )
    }

    /// Whether a row group whose key columns have `filters` (in key column
    /// order; `None`: no filter) may hold one of the keys.
    pub(crate) fn may_be_in(&self, filters: &[Option<Sbbf>]) -> bool {
        self.keys.iter().any(|key| {
            key.iter()
                .zip(filters)
                .all(|(value, filter)| filter.as_ref().is_none_or(|f| value.in_filter(f)))
        })
    }
}

/// The values of `column` (no NULLs: keys are never NULL).
fn values(kind: ValueKind, column: &ArrayRef) -> Result<Vec<Value>> {
    Ok(match kind {
        ValueKind::I32 => cast(column, &DataType::Int32)?
            .as_primitive::<Int32Type>()
            .values()
            .iter()
            .map(|v| Value::I32(*v))
            .collect(),
        ValueKind::I64 => cast(column, &DataType::Int64)?
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .map(|v| Value::I64(*v))
            .collect(),
        ValueKind::Bytes => {
            let column = cast(column, &DataType::Binary)?;
            let column = column.as_binary::<i32>();
            (0..column.len())
                .map(|i| Value::Bytes(column.value(i).into()))
                .collect()
        }
    })
}
