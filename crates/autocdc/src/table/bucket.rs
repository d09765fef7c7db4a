//! Key buckets: every stored row belongs to the bucket `fnv1a(keys) mod B`
//! (a hidden `__cdc_bucket` partition column), so an update reads and
//! rewrites only the buckets its keys touch — cost grows with the change, not
//! with the table.
//!
//! The hash is our own FNV-1a over a fixed encoding of the key values (not
//! DataFusion's or arrow's hashing, whose output may change between
//! versions): a stored row must stay in the bucket it was written to.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int32Array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Decimal128Type, Field, Int64Type};
use datafusion::common::{DataFusionError, Result, ScalarValue};

use super::properties::BUCKETS_PROPERTY;

/// Hidden partition column holding a row's bucket.
pub const BUCKET_COL: &str = "__cdc_bucket";
/// Buckets of a new table unless `TBLPROPERTIES` says otherwise.
pub const DEFAULT_BUCKETS: i32 = 16;
/// Bucket of the rows that belong to no key (the truncate watermark).
pub const WATERMARK_BUCKET: i32 = -1;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const NULL_MARK: u8 = 0xff;
const SEPARATOR: u8 = 0x1f;

fn mix(h: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *h ^= u64::from(*b);
        *h = h.wrapping_mul(FNV_PRIME);
    }
}

/// Fold one key column into the running hashes.
fn hash_column(hashes: &mut [u64], column: &ArrayRef) -> Result<()> {
    let column = match column.data_type() {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::Date32 => cast(column, &DataType::Int64)?,
        DataType::Utf8View | DataType::LargeUtf8 | DataType::Dictionary(_, _) => {
            cast(column, &DataType::Utf8)?
        }
        DataType::BinaryView | DataType::LargeBinary => cast(column, &DataType::Binary)?,
        DataType::Timestamp(_, _) | DataType::Date64 => cast(column, &DataType::Int64)?,
        _ => Arc::clone(column),
    };
    for (row, h) in hashes.iter_mut().enumerate() {
        if column.is_null(row) {
            mix(h, &[NULL_MARK]);
        } else {
            match column.data_type() {
                DataType::Int64 => mix(
                    h,
                    &column.as_primitive::<Int64Type>().value(row).to_le_bytes(),
                ),
                DataType::UInt64 => mix(
                    h,
                    &column
                        .as_primitive::<arrow::datatypes::UInt64Type>()
                        .value(row)
                        .to_le_bytes(),
                ),
                DataType::Utf8 => mix(h, column.as_string::<i32>().value(row).as_bytes()),
                DataType::Binary => mix(h, column.as_binary::<i32>().value(row)),
                DataType::Decimal128(_, _) => mix(
                    h,
                    &column
                        .as_primitive::<Decimal128Type>()
                        .value(row)
                        .to_le_bytes(),
                ),
                DataType::Boolean => mix(h, &[u8::from(column.as_boolean().value(row))]),
                // other key types: their canonical text (rare; allocates)
                _ => mix(
                    h,
                    ScalarValue::try_from_array(&column, row)?
                        .to_string()
                        .as_bytes(),
                ),
            }
        }
        mix(h, &[SEPARATOR]);
    }
    Ok(())
}

/// Bucket of every row of the key columns.
pub fn bucket_array(keys: &[ArrayRef], rows: usize, buckets: i32) -> Result<Int32Array> {
    if buckets <= 0 {
        return Err(DataFusionError::Execution(format!(
            "{BUCKETS_PROPERTY} must be positive, got {buckets}"
        )));
    }
    let mut hashes = vec![FNV_OFFSET; rows];
    for k in keys {
        hash_column(&mut hashes, k)?;
    }
    Ok(hashes
        .into_iter()
        .map(|h| (h % buckets as u64) as i32)
        .collect())
}

/// The bucket column's field.
pub fn bucket_field() -> Field {
    Field::new(BUCKET_COL, DataType::Int32, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};

    #[test]
    fn buckets_are_stable_and_type_independent() {
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
        let longs: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
        let a = bucket_array(&[ints], 3, 16).unwrap();
        let b = bucket_array(&[longs], 3, 16).unwrap();
        assert_eq!(a, b);
        // pinned values: a change here moves stored rows to other buckets
        let s: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
        assert_eq!(
            bucket_array(&[s], 2, 1000).unwrap().values().to_vec(),
            vec![bucket_of("a"), bucket_of("b")]
        );
    }

    fn bucket_of(s: &str) -> i32 {
        let mut h = FNV_OFFSET;
        mix(&mut h, s.as_bytes());
        mix(&mut h, &[SEPARATOR]);
        (h % 1000) as i32
    }
}
