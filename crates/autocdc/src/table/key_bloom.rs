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
//!
//! Within a row group admitted, the pages of the first key column whose
//! page-index minimum and maximum bracket none of the keys its filters
//! admitted are skipped
//! ([`KeyValues::page_may_hold`]): data files sort each row group by key, so
//! a page's range is narrow.

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::{can_cast_types, cast};
use arrow::datatypes::{DataType, Int32Type, Int64Type};
use datafusion::common::Result;
use deltalake_core::parquet::basic::Type as PhysicalType;
use deltalake_core::parquet::bloom_filter::Sbbf;
use deltalake_core::parquet::file::page_index::column_index::ColumnIndexMetaData;

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

impl ValueKind {
    /// The Arrow type values are read as.
    fn data_type(self) -> DataType {
        match self {
            ValueKind::I32 => DataType::Int32,
            ValueKind::I64 => DataType::Int64,
            ValueKind::Bytes => DataType::Binary,
        }
    }
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

/// A data page's key bounds from the column index, in the form they are
/// compared in.
enum PageBounds<'a> {
    Integer(i64, i64),
    Bytes(&'a [u8], &'a [u8]),
}

impl KeyValues {
    /// The keys of `batches` (columns: the key columns, stored types);
    /// `None` when a key column has no filter or there are too many keys.
    pub(crate) fn try_new(batches: &[RecordBatch], distinct_keys: usize) -> Result<Option<Self>> {
        if distinct_keys > BLOOM_PROBE_MAX_KEYS {
            return Ok(None);
        }
        let mut keys: Vec<Vec<Value>> = Vec::with_capacity(distinct_keys);
        for batch in batches {
            let Some(columns) = batch
                .columns()
                .iter()
                .map(|c| {
                    value_kind(c.data_type())
                        .filter(|kind| can_cast_types(c.data_type(), &kind.data_type()))
                        .map(|kind| (kind, c))
                })
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

    /// Whether page `page` of the first key column, whose page index is
    /// `index`, may hold one of the keys `keys` (indices, as
    /// [`Self::admitted`] returns them): false only when it holds nulls alone
    /// or its minimum and maximum bracket none of their values (integer and
    /// byte-array columns; Parquet orders byte arrays as unsigned bytes, and
    /// a truncated bound still bounds).
    pub(crate) fn page_may_hold(
        &self,
        index: &ColumnIndexMetaData,
        page: usize,
        keys: &[usize],
    ) -> bool {
        // (no index, or one that does not describe this page: a foreign
        // or damaged file, read as if unindexed)
        if matches!(index, ColumnIndexMetaData::NONE) || page as u64 >= index.num_pages() {
            return true;
        }
        if index.is_null_page(page) {
            return false;
        }
        let first = |k: usize| self.keys.get(k).and_then(|key| key.first());
        let integer = |v: &Value| match v {
            Value::I32(v) => Some(i64::from(*v)),
            Value::I64(v) => Some(*v),
            Value::Bytes(_) => None,
        };
        // Integer pages of either width compare as i64: one comparison each.
        let bounds = match index {
            ColumnIndexMetaData::INT32(pages) => pages
                .min_value(page)
                .zip(pages.max_value(page))
                .map(|(&min, &max)| PageBounds::Integer(i64::from(min), i64::from(max))),
            ColumnIndexMetaData::INT64(pages) => pages
                .min_value(page)
                .zip(pages.max_value(page))
                .map(|(&min, &max)| PageBounds::Integer(min, max)),
            ColumnIndexMetaData::BYTE_ARRAY(pages) => pages
                .min_value(page)
                .zip(pages.max_value(page))
                .map(|(min, max)| PageBounds::Bytes(min, max)),
            _ => None,
        };
        match bounds {
            None => true,
            Some(PageBounds::Integer(min, max)) => keys.iter().any(|&k| {
                first(k)
                    .and_then(integer)
                    .is_none_or(|v| (min..=max).contains(&v))
            }),
            Some(PageBounds::Bytes(min, max)) => keys.iter().any(|&k| match first(k) {
                Some(Value::Bytes(v)) => min <= v.as_ref() && v.as_ref() <= max,
                _ => true,
            }),
        }
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

    /// The keys (indices) a row group whose key columns have `filters` (in
    /// key column order; `None`: no filter) may hold.
    pub(crate) fn admitted(&self, filters: &[Option<&Sbbf>]) -> Vec<usize> {
        (0..self.keys.len())
            .filter(|&k| Self::admits(&self.keys[k], filters))
            .collect()
    }

    /// Whether every filter of `filters` may hold its column's value of `key`.
    fn admits(key: &[Value], filters: &[Option<&Sbbf>]) -> bool {
        key.iter()
            .zip(filters)
            .all(|(value, filter)| filter.is_none_or(|f| value.in_filter(f)))
    }
}

/// The values of `column` (no NULLs: keys are never NULL).
fn values(kind: ValueKind, column: &ArrayRef) -> Result<Vec<Value>> {
    Ok(match kind {
        ValueKind::I32 => cast(column, &kind.data_type())?
            .as_primitive::<Int32Type>()
            .values()
            .iter()
            .map(|v| Value::I32(*v))
            .collect(),
        ValueKind::I64 => cast(column, &kind.data_type())?
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .map(|v| Value::I64(*v))
            .collect(),
        ValueKind::Bytes => {
            let column = cast(column, &kind.data_type())?;
            let column = column.as_binary::<i32>();
            (0..column.len())
                .map(|i| Value::Bytes(column.value(i).into()))
                .collect()
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int16Array, StringArray, StringViewArray};
    use arrow::datatypes::{Field, Schema};

    use super::*;

    fn keys(column: ArrayRef) -> KeyValues {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "k",
            column.data_type().clone(),
            false,
        )]));
        let batch = RecordBatch::try_new(schema, vec![column]).unwrap();
        KeyValues::try_new(&[batch], 2).unwrap().expect("checkable")
    }

    /// Keys are checked with the bytes Parquet hashed when it wrote them:
    /// strings (any string type) as their bytes, small integers as `i32`.
    #[test]
    fn keys_are_checked_as_parquet_hashed_them() {
        let mut strings = Sbbf::new_with_ndv_fpp(100, 0.01).unwrap();
        strings.insert("alpha");
        strings.insert("beta");
        for column in [
            Arc::new(StringArray::from(vec!["beta", "gamma"])) as ArrayRef,
            Arc::new(StringViewArray::from(vec!["beta", "gamma"])),
        ] {
            assert!(!keys(column).admitted(&[Some(&strings)]).is_empty());
        }
        let absent = keys(Arc::new(StringArray::from(vec!["delta", "epsilon"])));
        assert!(absent.admitted(&[Some(&strings)]).is_empty());
        assert!(
            !absent.admitted(&[None]).is_empty(),
            "no filter: may hold anything"
        );

        let mut ints = Sbbf::new_with_ndv_fpp(100, 0.01).unwrap();
        ints.insert(&7i32);
        assert!(!keys(Arc::new(Int16Array::from(vec![3, 7])))
            .admitted(&[Some(&ints)])
            .is_empty());
        assert!(keys(Arc::new(Int16Array::from(vec![3, 8])))
            .admitted(&[Some(&ints)])
            .is_empty());
    }

    #[test]
    fn too_many_keys_or_unsupported_types_check_nothing() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Float64, false)]));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(arrow::array::Float64Array::from(vec![1.0]))],
        )
        .unwrap();
        assert!(KeyValues::try_new(&[batch], 1).unwrap().is_none());
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int16, false)])),
            vec![Arc::new(Int16Array::from(vec![1]))],
        )
        .unwrap();
        assert!(KeyValues::try_new(&[batch], BLOOM_PROBE_MAX_KEYS + 1)
            .unwrap()
            .is_none());
    }
}
