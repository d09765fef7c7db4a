//! Deferred equality checks of the indexed folds and the indexed snapshot
//! diff: pairs of retained rows compared all at once, after the index was
//! walked.
//!
//! Walking a sorted index, a fold meets pairs of rows whose values it must
//! compare (a replay and its first copy, an absorbed upsert and the version
//! it continues, a stored row and its update, a key's live and snapshot
//! rows). Comparing each pair where it is met would build a comparator per
//! pair and column; the callers collect them instead and [`equal_pairs`]
//! compares them column by column:
//!
//! | column type                                   | compared                                  |
//! |-----------------------------------------------|-------------------------------------------|
//! | primitive (integers, floats, decimals, times) | in place, by value (floats by their bits) |
//! | boolean, string, binary (any offsets, views)  | in place, by value                        |
//! | any other (nested, dictionary, ...)           | gathered 8 192 pairs at a time, in Arrow's row format |
//!
//! Either way NULLs are equal, a float equals only itself bit for bit
//! (`-0.0` differs from `0.0`, a NaN equals the same NaN): the equality of
//! Arrow's row format, in which the sorted folds and diff compare rows. In
//! place, nothing is copied: each pair reads its two values where they lie.

use arrow::array::{
    downcast_primitive, Array, BooleanArray, FixedSizeBinaryArray, GenericByteArray,
    GenericByteViewArray, PrimitiveArray, RecordBatch,
};
use arrow::compute::interleave;
use arrow::datatypes::{
    ArrowNativeTypeOp, BinaryType, BinaryViewType, ByteArrayType, ByteViewType, DataType,
    LargeBinaryType, LargeUtf8Type, StringViewType, Utf8Type,
};
use arrow::row::{RowConverter, SortField};
use datafusion::common::Result;

use super::event_index::IndexEntry;

/// Two retained rows: `[batch, row]` of the first, then of the second.
pub type Pair = [u32; 4];

/// Pairs gathered at once for a column not compared in place.
const WINDOW: usize = 8192;

/// The places of two index entries, as a check pair.
pub fn pair(a: &IndexEntry, b: &IndexEntry) -> Pair {
    [a.batch, a.row, b.batch, b.row]
}

/// Whether the two rows of each pair of `batches` hold equal values (NULLs
/// equal, floats by their bits) in `columns`.
pub fn equal_pairs(
    batches: &[RecordBatch],
    pairs: &[Pair],
    columns: &[usize],
) -> Result<Vec<bool>> {
    let mut equal = vec![true; pairs.len()];
    for &c in columns {
        let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
        if !and_equal_in_place(&arrays, pairs, &mut equal) {
            and_equal_gathered(&arrays, pairs, &mut equal)?;
        }
    }
    Ok(equal)
}

/// `equal` and-ed with whether each pair's values in one column (its array
/// in every batch) are equal, read where they lie; false, `equal` as it
/// was, when the column's type is not compared in place.
fn and_equal_in_place(arrays: &[&dyn Array], pairs: &[Pair], equal: &mut [bool]) -> bool {
    macro_rules! primitive {
        ($t:ty) => {
            and_equal_typed::<PrimitiveArray<$t>>(arrays, pairs, equal, |a, i, b, j| {
                a.value(i).is_eq(b.value(j))
            })
        };
    }
    let Some(first) = arrays.first() else {
        return true;
    };
    downcast_primitive! {
        first.data_type() => (primitive),
        DataType::Boolean => and_equal_typed::<BooleanArray>(arrays, pairs, equal, |a, i, b, j| {
            a.value(i) == b.value(j)
        }),
        DataType::Utf8 => and_equal_bytes::<Utf8Type>(arrays, pairs, equal),
        DataType::LargeUtf8 => and_equal_bytes::<LargeUtf8Type>(arrays, pairs, equal),
        DataType::Binary => and_equal_bytes::<BinaryType>(arrays, pairs, equal),
        DataType::LargeBinary => and_equal_bytes::<LargeBinaryType>(arrays, pairs, equal),
        DataType::Utf8View => and_equal_views::<StringViewType>(arrays, pairs, equal),
        DataType::BinaryView => and_equal_views::<BinaryViewType>(arrays, pairs, equal),
        DataType::FixedSizeBinary(_) => {
            and_equal_typed::<FixedSizeBinaryArray>(arrays, pairs, equal, |a, i, b, j| {
                a.value(i) == b.value(j)
            })
        }
        _ => false
    }
}

fn and_equal_bytes<T: ByteArrayType>(
    arrays: &[&dyn Array],
    pairs: &[Pair],
    equal: &mut [bool],
) -> bool {
    and_equal_typed::<GenericByteArray<T>>(arrays, pairs, equal, |a, i, b, j| {
        let (a, b): (&[u8], &[u8]) = (a.value(i).as_ref(), b.value(j).as_ref());
        a == b
    })
}

/// Views compare by their first 16 bytes when the values are inlined (at
/// most 12 bytes), by length and prefix before the bytes otherwise.
fn and_equal_views<T: ByteViewType>(
    arrays: &[&dyn Array],
    pairs: &[Pair],
    equal: &mut [bool],
) -> bool {
    and_equal_typed::<GenericByteViewArray<T>>(arrays, pairs, equal, |a, i, b, j| {
        let (view_a, view_b) = (a.views()[i], b.views()[j]);
        // the length, then the first 4 bytes, in the low 64 bits
        let (len_prefix_a, len_prefix_b) = (view_a as u64, view_b as u64);
        if len_prefix_a != len_prefix_b {
            return false;
        }
        if view_a as u32 <= 12 {
            return view_a == view_b;
        }
        let (a, b): (&[u8], &[u8]) = (a.value(i).as_ref(), b.value(j).as_ref());
        a == b
    })
}

/// [`and_equal_in_place`] over arrays of type `A` (false when one is of
/// another type), `eq` comparing two valid values.
fn and_equal_typed<A: Array + 'static>(
    arrays: &[&dyn Array],
    pairs: &[Pair],
    equal: &mut [bool],
    eq: impl Fn(&A, usize, &A, usize) -> bool,
) -> bool {
    let Some(arrays) = arrays
        .iter()
        .map(|a| a.as_any().downcast_ref::<A>())
        .collect::<Option<Vec<&A>>>()
    else {
        return false;
    };
    for (&[batch_a, i, batch_b, j], equal) in pairs.iter().zip(equal) {
        if !*equal {
            continue;
        }
        let (a, b) = (arrays[batch_a as usize], arrays[batch_b as usize]);
        let (i, j) = (i as usize, j as usize);
        *equal = match (a.is_valid(i), b.is_valid(j)) {
            (true, true) => eq(a, i, b, j),
            (valid_a, valid_b) => valid_a == valid_b,
        };
    }
    true
}

/// `equal` and-ed with whether each pair's values in one column are equal
/// in Arrow's row format, both sides gathered [`WINDOW`] pairs at a time.
fn and_equal_gathered(arrays: &[&dyn Array], pairs: &[Pair], equal: &mut [bool]) -> Result<()> {
    let Some(first) = arrays.first() else {
        return Ok(());
    };
    let converter = RowConverter::new(vec![SortField::new(first.data_type().clone())])?;
    for (window, equal) in pairs.chunks(WINDOW).zip(equal.chunks_mut(WINDOW)) {
        let a: Vec<(usize, usize)> = window
            .iter()
            .map(|p| (p[0] as usize, p[1] as usize))
            .collect();
        let b: Vec<(usize, usize)> = window
            .iter()
            .map(|p| (p[2] as usize, p[3] as usize))
            .collect();
        let a = converter.convert_columns(&[interleave(arrays, &a)?])?;
        let b = converter.convert_columns(&[interleave(arrays, &b)?])?;
        for (i, equal) in equal.iter_mut().enumerate() {
            *equal = *equal && a.row(i) == b.row(i);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    #[test]
    fn pairs_are_equal_when_every_column_is() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
        ]));
        let batch = |a: Vec<Option<i64>>, b: Vec<Option<&str>>| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(a)),
                    Arc::new(StringArray::from(b)),
                ],
            )
        };
        let batches = [
            batch(
                vec![Some(1), None, Some(3)],
                vec![Some("x"), None, Some("y")],
            )?,
            batch(vec![Some(1), None], vec![Some("z"), None])?,
        ];
        let pairs = [[0, 0, 1, 0], [0, 1, 1, 1], [0, 2, 1, 0]];
        // NULLs are equal; (0,0) and (1,0) differ only in `b`
        assert_eq!(
            equal_pairs(&batches, &pairs, &[0, 1])?,
            [false, true, false]
        );
        assert_eq!(equal_pairs(&batches, &pairs, &[0])?, [true, true, false]);
        assert_eq!(equal_pairs(&batches, &pairs, &[])?, [true, true, true]);
        Ok(())
    }

    /// Every pair of rows of every type, compared in place or gathered,
    /// against their rows in Arrow's row format (converted whole, batch by
    /// batch: equal exactly when the row format's bytes are).
    #[test]
    fn pairs_compare_like_the_row_format_in_every_type() -> Result<()> {
        use arrow::array::{
            ArrayRef, BinaryViewArray, BooleanArray, Decimal128Array, DictionaryArray,
            FixedSizeBinaryArray, Float64Array, Int32Array, LargeStringArray, ListArray,
            StringViewArray, TimestampMicrosecondArray,
        };
        use arrow::datatypes::{Int32Type, Int8Type};
        let texts = [
            Some(""),
            Some("a"),
            Some("abcdefghijkl"),
            Some("abcdefghijklm"),
            Some("abcdXfghijklm"),
            Some("abcdefghijklmnopqrstuvwxyz"),
            Some("abcdefghijklmnopqrstuvwxyZ"),
            None,
        ];
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![Some(1), Some(1), None, Some(-2)])),
            Arc::new(Float64Array::from(vec![
                Some(0.0),
                Some(-0.0),
                Some(f64::NAN),
                Some(f64::from_bits(f64::NAN.to_bits() | 1)),
                None,
                Some(1.5),
            ])),
            Arc::new(BooleanArray::from(vec![Some(true), Some(false), None])),
            Arc::new(StringArray::from(texts.to_vec())),
            Arc::new(LargeStringArray::from(texts.to_vec())),
            Arc::new(StringViewArray::from(texts.to_vec())),
            Arc::new(BinaryViewArray::from(
                texts
                    .iter()
                    .map(|t| t.map(str::as_bytes))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                [Some(b"ab"), Some(b"ac"), None].into_iter(),
                2,
            )?),
            Arc::new(
                Decimal128Array::from(vec![Some(100), Some(1), None])
                    .with_precision_and_scale(10, 2)?,
            ),
            Arc::new(
                TimestampMicrosecondArray::from(vec![Some(1), Some(2), None]).with_timezone("UTC"),
            ),
            // gathered
            Arc::new(
                [Some("x"), Some("y"), None, Some("x")]
                    .into_iter()
                    .collect::<DictionaryArray<Int8Type>>(),
            ),
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
                Some(vec![Some(1), None]),
                Some(vec![Some(1)]),
                Some(vec![]),
                None,
                Some(vec![Some(1), None]),
            ])),
        ];
        for column in columns {
            let t = column.data_type().clone();
            let schema = Arc::new(Schema::new(vec![Field::new("c", t.clone(), true)]));
            // batch 1 holds the values in the reverse order
            let reversed = arrow::compute::take(
                &column,
                &(0..column.len() as u32)
                    .rev()
                    .collect::<arrow::array::UInt32Array>(),
                None,
            )?;
            let batches = [
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::clone(&column)])?,
                RecordBatch::try_new(schema, vec![reversed])?,
            ];
            let converter = RowConverter::new(vec![SortField::new(t.clone())])?;
            let rows = batches
                .iter()
                .map(|b| converter.convert_columns(b.columns()))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let n = column.len() as u32;
            let mut pairs = Vec::new();
            for (a, b) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                for i in 0..n {
                    for j in 0..n {
                        pairs.push([a, i, b, j]);
                    }
                }
            }
            let expected: Vec<bool> = pairs
                .iter()
                .map(|&[a, i, b, j]| {
                    rows[a as usize].row(i as usize) == rows[b as usize].row(j as usize)
                })
                .collect();
            assert_eq!(equal_pairs(&batches, &pairs, &[0])?, expected, "{t}");
            // the column twice: a pair found different in the first stays so
            let both = batches
                .iter()
                .map(|b| {
                    RecordBatch::try_from_iter([
                        ("c", Arc::clone(b.column(0))),
                        ("d", Arc::clone(b.column(0))),
                    ])
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let equal = equal_pairs(&both, &pairs, &[0, 1])?;
            assert_eq!(equal, expected, "{t}, two columns");
        }
        Ok(())
    }
}
