//! Deferred equality checks of the indexed folds: pairs of retained rows
//! compared all at once, after the index was folded.
//!
//! Walking a sorted index, a fold meets pairs of events whose values it
//! must compare (a replay and its first copy, an absorbed upsert and the
//! version it continues, a stored row and its update). Comparing each pair
//! where it is met would build a comparator per pair and column (~4 % of a
//! 10 M-event SCD 1 load with 1 % replays); the folds collect them instead
//! and [`equal_pairs`] gathers both sides of a window of pairs and compares
//! them column by column.

use std::cmp::Ordering;

use arrow::array::{make_comparator, Array, RecordBatch};
use arrow::compute::{interleave, SortOptions};
use datafusion::common::Result;

use super::event_index::IndexEntry;

/// Two retained rows: `[batch, row]` of the first, then of the second.
pub type Pair = [u32; 4];

/// The places of two index entries, as a check pair.
pub fn pair(a: &IndexEntry, b: &IndexEntry) -> Pair {
    [a.batch, a.row, b.batch, b.row]
}

/// Whether the two rows of each pair of `batches` hold equal values (NULLs
/// equal) in `columns`.
pub fn equal_pairs(
    batches: &[RecordBatch],
    pairs: &[Pair],
    columns: &[usize],
) -> Result<Vec<bool>> {
    const WINDOW: usize = 8192;
    let mut equal = vec![true; pairs.len()];
    for (window, equal) in pairs.chunks(WINDOW).zip(equal.chunks_mut(WINDOW)) {
        let left: Vec<(usize, usize)> = window
            .iter()
            .map(|p| (p[0] as usize, p[1] as usize))
            .collect();
        let right: Vec<(usize, usize)> = window
            .iter()
            .map(|p| (p[2] as usize, p[3] as usize))
            .collect();
        for &c in columns {
            let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
            let (l, r) = (interleave(&arrays, &left)?, interleave(&arrays, &right)?);
            let cmp = make_comparator(l.as_ref(), r.as_ref(), SortOptions::default())?;
            for (i, equal) in equal.iter_mut().enumerate() {
                *equal = *equal && cmp(i, i) == Ordering::Equal;
            }
        }
    }
    Ok(equal)
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
    /// Every pair of rows of every type against their rows in Arrow's row
    /// format (converted whole, batch by batch: equal exactly when the row
    /// format's bytes are, the sorted folds' equality): NULLs equal, floats
    /// by their bits, strings inlined in views or not.
    #[test]
    fn pairs_compare_like_the_row_format_in_every_type() -> Result<()> {
        use arrow::array::{
            ArrayRef, BinaryViewArray, BooleanArray, Decimal128Array, DictionaryArray,
            FixedSizeBinaryArray, Float64Array, Int32Array, LargeStringArray, ListArray,
            StringViewArray, TimestampMicrosecondArray,
        };
        use arrow::datatypes::{Int32Type, Int8Type};
        use arrow::row::{RowConverter, SortField};
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
