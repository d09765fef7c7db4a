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

use arrow::array::{
    make_array, new_null_array, Array, ArrayRef, AsArray, PrimitiveArray, RecordBatch,
};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Date64Type, Int16Type, Int32Type, Int64Type,
    Int8Type, Schema, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::{DataFusionError, Result};

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

/// Widest row-format encoding [`encoded`] holds (a `u128`: the indexed
/// snapshot diff's keys).
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

/// The first byte of a valid (non-null) value in the row format, whatever
/// its type: what [`ValueBytes`] leaves out and a decoder puts back.
pub const VALID_BYTE: u8 = 1;

/// [`encoded`] of a valid value of a single fixed-width column, from its
/// value bytes `bits` ([`ValueBytes::bits`], [`encode_values`]): the valid
/// byte, then the value bytes.
pub fn encoded_from_bits(bits: u64) -> u128 {
    (u128::from(VALID_BYTE) << 120) | (u128::from(bits) << 56)
}

/// Widest value, null bytes left out, that an index entry holds as it is
/// (a `u64`; see [`ValueBytes`]).
pub const MAX_VALUE_BYTES: usize = 8;

/// The value bytes of a fixed-width row-format encoding of several columns
/// without nulls: each column's bytes after its null byte, concatenated and
/// left-aligned in a big-endian `u64`. Every valid value's null byte is
/// [`VALID_BYTE`], so leaving them out keeps the order of the rows.
#[derive(Debug, Clone)]
pub struct ValueBytes {
    /// Offsets in a row of the bytes kept, in order (at most 8).
    kept: Vec<usize>,
}

impl ValueBytes {
    /// The value bytes of `types` in row format, if every type is
    /// fixed-width and their values take at most [`MAX_VALUE_BYTES`].
    pub fn new<'a>(types: impl IntoIterator<Item = &'a DataType>) -> Option<Self> {
        let mut kept = Vec::new();
        let mut offset = 0;
        for t in types {
            let width = encoded_width([t])?;
            kept.extend(offset + 1..offset + width);
            offset += width;
        }
        (kept.len() <= MAX_VALUE_BYTES).then_some(Self { kept })
    }

    /// The value bytes of `row`, a row-format row of the types given to
    /// [`Self::new`].
    pub fn bits(&self, row: &[u8]) -> u64 {
        let mut buf = [0u8; MAX_VALUE_BYTES];
        for (b, &at) in buf.iter_mut().zip(&self.kept) {
            *b = row[at];
        }
        u64::from_be_bytes(buf)
    }
}

/// [`ValueBytes::bits`] of the `rows` of a single `column` (every row when
/// `None`; each below the column's length), computed from its values
/// instead of through the row format, appended to `out`: for integers,
/// dates and timestamps without nulls, whose row format is a valid byte
/// then the value's big-endian bits (the sign bit flipped). Returns false,
/// leaving `out` as it was, for any other column.
pub fn encode_values(column: &dyn Array, rows: Option<&[u32]>, out: &mut Vec<u64>) -> bool {
    fn fill<T: ArrowPrimitiveType>(
        column: &dyn Array,
        rows: Option<&[u32]>,
        out: &mut Vec<u64>,
        bits: impl Fn(T::Native) -> u64,
    ) {
        // the value's bytes, left-aligned
        let shift = 64 - 8 * std::mem::size_of::<T::Native>() as u32;
        let encode = |v: T::Native| bits(v) << shift;
        let values = column.as_primitive::<T>().values();
        match rows {
            None => out.extend(values.iter().map(|&v| encode(v))),
            Some(rows) => out.extend(rows.iter().map(|&r| encode(values[r as usize]))),
        }
    }
    if column.null_count() > 0 {
        return false;
    }
    match column.data_type() {
        DataType::Int8 => fill::<Int8Type>(column, rows, out, |v| u64::from(v as u8 ^ 0x80)),
        DataType::Int16 => fill::<Int16Type>(column, rows, out, |v| u64::from(v as u16 ^ 0x8000)),
        DataType::Int32 => {
            fill::<Int32Type>(column, rows, out, |v| u64::from(v as u32 ^ (1 << 31)))
        }
        DataType::Date32 => {
            fill::<Date32Type>(column, rows, out, |v| u64::from(v as u32 ^ (1 << 31)))
        }
        DataType::Int64 => fill::<Int64Type>(column, rows, out, |v| v as u64 ^ (1 << 63)),
        DataType::Date64 => fill::<Date64Type>(column, rows, out, |v| v as u64 ^ (1 << 63)),
        DataType::Timestamp(unit, _) => {
            let flip = |v: i64| v as u64 ^ (1 << 63);
            match unit {
                TimeUnit::Second => fill::<TimestampSecondType>(column, rows, out, flip),
                TimeUnit::Millisecond => fill::<TimestampMillisecondType>(column, rows, out, flip),
                TimeUnit::Microsecond => fill::<TimestampMicrosecondType>(column, rows, out, flip),
                TimeUnit::Nanosecond => fill::<TimestampNanosecondType>(column, rows, out, flip),
            }
        }
        DataType::UInt8 => fill::<UInt8Type>(column, rows, out, u64::from),
        DataType::UInt16 => fill::<UInt16Type>(column, rows, out, u64::from),
        DataType::UInt32 => fill::<UInt32Type>(column, rows, out, u64::from),
        DataType::UInt64 => fill::<UInt64Type>(column, rows, out, |v| v),
        _ => return false,
    }
    true
}

/// The inverse of [`encode_values`] and [`ValueBytes::bits`] for one
/// fixed-width column of `data_type`: `bits` back as an array of that type
/// with `nulls`. Integers of 8 and 4 bytes (and the types stored as them:
/// timestamps, dates, times, durations) are decoded directly, others
/// through their row format with `converter` (a converter of that one
/// column).
pub fn decode_values(
    bits: &[u64],
    data_type: &DataType,
    converter: &RowConverter,
    nulls: Option<NullBuffer>,
) -> Result<ArrayRef> {
    // the row format flips a signed integer's sign bit, big-endian
    let values = match data_type.primitive_width() {
        Some(8) if data_type.is_signed_integer() || is_i64_backed(data_type) => {
            let v: Vec<i64> = bits.iter().map(|&b| (b ^ (1 << 63)) as i64).collect();
            Some(PrimitiveArray::<Int64Type>::new(v.into(), nulls.clone()).into_data())
        }
        Some(4) if data_type.is_signed_integer() || is_i32_backed(data_type) => {
            let v: Vec<i32> = bits
                .iter()
                .map(|&b| (((b >> 32) as u32) ^ (1 << 31)) as i32)
                .collect();
            Some(PrimitiveArray::<Int32Type>::new(v.into(), nulls.clone()).into_data())
        }
        _ => None,
    };
    if let Some(values) = values {
        let data = values.into_builder().data_type(data_type.clone()).build()?;
        return Ok(make_array(data));
    }
    let w = encoded_width([data_type]).ok_or_else(|| {
        DataFusionError::Internal(format!("values of type {data_type} are not fixed-width"))
    })?;
    let mut bytes = Vec::with_capacity(bits.len() * w);
    for b in bits {
        bytes.push(VALID_BYTE);
        bytes.extend_from_slice(&b.to_be_bytes()[..w - 1]);
    }
    let parser = converter.parser();
    let rows = bytes.chunks_exact(w).map(|row| parser.parse(row));
    let decoded = converter
        .convert_rows(rows)?
        .pop()
        .ok_or_else(|| DataFusionError::Internal("values decoded to no column".into()))?;
    match nulls {
        None => Ok(decoded),
        Some(nulls) => Ok(make_array(
            decoded
                .into_data()
                .into_builder()
                .nulls(Some(nulls))
                .build()?,
        )),
    }
}

/// Types whose values are stored as `i64` (and encoded like it in rows).
fn is_i64_backed(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Timestamp(_, _) | DataType::Date64 | DataType::Time64(_) | DataType::Duration(_)
    )
}

/// Types whose values are stored as `i32` (and encoded like it in rows).
fn is_i32_backed(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Date32 | DataType::Time32(_))
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        Date32Array, Date64Array, Float64Array, Int16Array, Int32Array, Int64Array, Int8Array,
        TimestampMicrosecondArray, TimestampSecondArray, UInt16Array, UInt32Array, UInt64Array,
        UInt8Array,
    };
    use arrow::datatypes::Field;

    /// Every value computed directly equals its row-format encoding.
    #[test]
    fn values_encode_like_their_rows() -> Result<()> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int8Array::from(vec![i8::MIN, -1, 0, 1, i8::MAX])),
            Arc::new(Int16Array::from(vec![i16::MIN, -300, 0, 300, i16::MAX])),
            Arc::new(Int32Array::from(vec![
                i32::MIN,
                -70_000,
                0,
                70_000,
                i32::MAX,
            ])),
            Arc::new(Int64Array::from(vec![
                i64::MIN,
                -1 << 40,
                -1,
                0,
                1 << 40,
                i64::MAX,
            ])),
            Arc::new(UInt8Array::from(vec![0, 1, u8::MAX])),
            Arc::new(UInt16Array::from(vec![0, 1, u16::MAX])),
            Arc::new(UInt32Array::from(vec![0, 1, u32::MAX])),
            Arc::new(UInt64Array::from(vec![0, 1, u64::MAX])),
            Arc::new(Date32Array::from(vec![-20_000, 0, 20_000])),
            Arc::new(Date64Array::from(vec![-86_400_000, 0, 86_400_000])),
            Arc::new(TimestampSecondArray::from(vec![-5, 0, 5])),
            Arc::new(TimestampMicrosecondArray::from(vec![-5, 0, 5]).with_timezone("UTC")),
        ];
        for column in columns {
            let schema = Schema::new(vec![Field::new("c", column.data_type().clone(), true)]);
            let batch = RecordBatch::try_new(Arc::new(schema.clone()), vec![Arc::clone(&column)])?;
            let rows = to_rows(&row_converter(&schema, &[0])?, &batch, &[0])?;
            let value_bytes = ValueBytes::new([column.data_type()]).unwrap();
            assert!((0..column.len()).all(|i| rows.row(i).as_ref()[0] == VALID_BYTE));
            let expected: Vec<u64> = (0..column.len())
                .map(|i| value_bytes.bits(rows.row(i).as_ref()))
                .collect();
            let mut values = vec![7];
            assert!(
                encode_values(column.as_ref(), None, &mut values),
                "{}",
                column.data_type()
            );
            assert_eq!(values[1..], expected[..], "{}", column.data_type());
            assert!(
                values[1..].windows(2).all(|w| w[0] < w[1]),
                "{}",
                column.data_type()
            );
            // some rows only, in their order
            let mut some = Vec::new();
            assert!(encode_values(column.as_ref(), Some(&[2, 0]), &mut some));
            assert_eq!(some, [expected[2], expected[0]], "{}", column.data_type());
        }
        Ok(())
    }

    /// Values encoded as value bytes decode to the values they came from,
    /// directly (signed integers of 8 and 4 bytes, dates, timestamps) or
    /// through the row format (the others), with the nulls given.
    #[test]
    fn value_bytes_decode_to_their_values() -> Result<()> {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int8Array::from(vec![i8::MIN, -1, 0, i8::MAX])),
            Arc::new(Int32Array::from(vec![i32::MIN, -70_000, 0, i32::MAX])),
            Arc::new(Int64Array::from(vec![i64::MIN, -1, 0, i64::MAX])),
            Arc::new(UInt16Array::from(vec![0, 1, 300, u16::MAX])),
            Arc::new(UInt64Array::from(vec![0, 1, 1 << 40, u64::MAX])),
            Arc::new(Date32Array::from(vec![-20_000, 0, 1, 20_000])),
            Arc::new(TimestampMicrosecondArray::from(vec![-5, 0, 1, 5]).with_timezone("UTC")),
        ];
        for column in columns {
            let schema = Schema::new(vec![Field::new("c", column.data_type().clone(), true)]);
            let converter = row_converter(&schema, &[0])?;
            let mut bits = Vec::new();
            assert!(encode_values(column.as_ref(), None, &mut bits));
            let decoded = decode_values(&bits, column.data_type(), &converter, None)?;
            assert_eq!(decoded.as_ref(), column.as_ref(), "{}", column.data_type());
            let nulls = NullBuffer::from(vec![true, false, true, true]);
            let decoded = decode_values(&bits, column.data_type(), &converter, Some(nulls))?;
            assert_eq!(decoded.data_type(), column.data_type());
            assert!(
                decoded.is_null(1) && decoded.is_valid(0),
                "{}",
                column.data_type()
            );
        }
        Ok(())
    }

    /// Columns with nulls, and other types, are left to the row format.
    #[test]
    fn nulls_and_other_types_are_not_encoded() {
        let mut values = Vec::new();
        assert!(!encode_values(
            &Int64Array::from(vec![Some(1), None]),
            None,
            &mut values
        ));
        assert!(!encode_values(
            &Float64Array::from(vec![1.0]),
            Some(&[0]),
            &mut values
        ));
        assert!(values.is_empty());
    }

    /// Several columns' value bytes order rows as their row format does
    /// (null bytes left out), and values wider than 8 bytes do not fit.
    #[test]
    fn value_bytes_of_several_columns_order_like_their_rows() -> Result<()> {
        use arrow::array::BooleanArray;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int16Array::from(vec![-3, -3, 0, 0, 7, 7, 7, -3])),
            Arc::new(Int32Array::from(vec![
                5,
                -9,
                5,
                5,
                i32::MIN,
                i32::MAX,
                0,
                5,
            ])),
            Arc::new(BooleanArray::from(vec![
                true, false, false, true, true, false, true, false,
            ])),
        ];
        let fields: Vec<Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
            .collect();
        let schema = Schema::new(fields);
        let batch = RecordBatch::try_new(Arc::new(schema.clone()), columns)?;
        let rows = to_rows(&row_converter(&schema, &[0, 1, 2])?, &batch, &[0, 1, 2])?;
        let types: Vec<DataType> = schema
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        let value_bytes = ValueBytes::new(&types).unwrap();
        assert_eq!(value_bytes.kept.len(), 7);
        for i in 0..rows.num_rows() {
            for j in 0..rows.num_rows() {
                let (a, b) = (rows.row(i), rows.row(j));
                let (a, b) = (a.as_ref(), b.as_ref());
                assert_eq!(
                    value_bytes.bits(a).cmp(&value_bytes.bits(b)),
                    a.cmp(b),
                    "rows {i} and {j}"
                );
            }
        }
        assert_eq!(
            ValueBytes::new(&[DataType::Int64]).map(|v| v.kept.len()),
            Some(8)
        );
        assert!(ValueBytes::new(&[DataType::Int64, DataType::Int8]).is_none());
        assert!(ValueBytes::new(&[DataType::Decimal128(20, 2)]).is_none());
        assert!(ValueBytes::new(&[DataType::Utf8]).is_none());
        Ok(())
    }
}
