//! Batches an indexed fold retains until its input ends, held at the size
//! of their rows.
//!
//! An upstream operator may hand over a batch whose buffers were sized for
//! more rows than it holds (a coalescer flushing a half-full batch keeps
//! the capacity it reserved). Passed along, such a batch costs nothing;
//! retained with every other batch of a partition, the slack adds up: at
//! 10 M events, half of the batches an SCD 2 query's fold received held
//! about half their bytes unused (~280 MB). [`retained`] copies those few
//! to tight buffers and keeps the others as they are; [`Retained`] holds an
//! indexed fold's batches so.
//!
//! A batch may also be shared with the folds of other partitions (a key
//! exchange hands each partition the whole batch and the rows of its keys,
//! `crate::physical::key_exchange`): [`Retained`] then keeps the rows with
//! it and counts the share of its bytes those rows are, so that the
//! partitions together count each batch once.
//!
//! Strings and binaries read as views (`Utf8View`, `BinaryView`) point
//! into buffers that several batches share — a Parquet page decoded once —
//! and an array reports every buffer it points into: counted so, each
//! batch would count its neighbours' strings too (3–4× the bytes held, and
//! an indexed fold or diff giving up on its memory that early). A view
//! column counts its views and the bytes of the values its rows point at.
//!
//! Some columns hold one value in every row of most batches: an update's
//! events all carry its time stamp and their origin. Retained as they come,
//! they are 9 bytes per event (90 MB at 10 M events) repeating one value;
//! [`Retained::with_constant_columns`] keeps such a column, while a batch's
//! rows all have one value, as a slice of one array shared by every batch.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, Scalar, UInt32Array};
use arrow::compute::kernels::cmp::eq;
use arrow::compute::take_record_batch;
use arrow::datatypes::{BinaryViewType, ByteViewType, DataType, StringViewType};
use datafusion::common::{Result, ScalarValue};

/// Bytes held beyond those the rows use, in eighths of the used bytes,
/// above which a retained batch is copied (⅜: 37.5 % slack).
const MAX_SLACK_EIGHTHS: usize = 3;

/// `batch`, or a copy of it in buffers of its rows' size when its buffers
/// hold much more (see the module docs).
pub fn retained(batch: &RecordBatch) -> Result<RecordBatch> {
    if !loose(batch)? {
        return Ok(batch.clone());
    }
    let rows = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    Ok(take_record_batch(batch, &rows)?)
}

/// Bytes `batch` holds, a view column counted by the values its rows
/// point at (see the module docs).
fn held_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|column| match column.data_type() {
            DataType::Utf8View => view_bytes::<StringViewType>(column, true),
            DataType::BinaryView => view_bytes::<BinaryViewType>(column, true),
            _ => column.get_array_memory_size(),
        })
        .sum()
}

/// A view array's views and nulls, and with `values` the bytes of the
/// values longer than a view holds inline.
fn view_bytes<T: ByteViewType>(column: &ArrayRef, values: bool) -> usize {
    let array = column.as_byte_view::<T>();
    let values: usize = match values {
        true => array
            .views()
            .iter()
            .map(|&view| match view as u32 {
                len if len > 12 => len as usize,
                _ => 0,
            })
            .sum(),
        false => 0,
    };
    let nulls = array.nulls().map_or(0, |n| n.buffer().capacity());
    array.views().inner().capacity() + nulls + values
}

/// Whether `batch`'s buffers hold much more than its rows use.
/// (A view column's values are left out of both sides: a copy would point
/// into the same buffers.)
fn loose(batch: &RecordBatch) -> Result<bool> {
    let (mut held, mut used) = (0, 0);
    for column in batch.columns() {
        held += match column.data_type() {
            DataType::Utf8View => view_bytes::<StringViewType>(column, false),
            DataType::BinaryView => view_bytes::<BinaryViewType>(column, false),
            _ => column.get_array_memory_size(),
        };
        used += column.to_data().get_slice_memory_size()?;
    }
    Ok(held > used + used * MAX_SLACK_EIGHTHS / 8)
}

/// The batches an indexed fold retains (each [`retained`]), and the bytes
/// they hold.
#[derive(Debug, Default)]
pub struct Retained {
    batches: Vec<RecordBatch>,
    /// The rows of each batch that are this fold's (`None`: all of them).
    rows: Vec<Option<UInt32Array>>,
    /// Each batch's bytes, or its rows' share of them.
    sizes: Vec<usize>,
    bytes: usize,
    /// Columns often holding one value, each with the array of that value
    /// its batches share while they do (see the module docs).
    constants: Vec<(usize, Option<ArrayRef>)>,
}

impl Retained {
    /// Keep the columns `columns` of every batch, when all its rows have one
    /// value, as a slice of one array shared by the batches (see the module
    /// docs).
    pub fn with_constant_columns(mut self, columns: &[usize]) -> Self {
        self.constants = columns.iter().map(|&c| (c, None)).collect();
        self
    }

    /// `batch` with each constant column whose rows all have one value
    /// replaced by a slice of the array shared for it; the bytes those
    /// slices report (their shared array's), and those of shared arrays
    /// made anew, in that order. A column whose values cannot be compared
    /// or repeated is kept as it came.
    fn share_constants(&mut self, batch: RecordBatch) -> Result<(RecordBatch, usize, usize)> {
        let n = batch.num_rows();
        if self.constants.is_empty() || n == 0 {
            return Ok((batch, 0, 0));
        }
        let mut columns = batch.columns().to_vec();
        let (mut slices, mut made) = (0, 0);
        for (c, shared) in &mut self.constants {
            let Some(column) = columns.get(*c) else {
                continue;
            };
            if column.null_count() > 0 || column.data_type().is_nested() {
                continue;
            }
            let first = column.slice(0, 1);
            match eq(column, &Scalar::new(&first)) {
                Ok(equal) if equal.true_count() == n => {}
                _ => continue,
            }
            let reusable = shared
                .as_ref()
                .filter(|s| s.len() >= n && s.slice(0, 1).as_ref() == first.as_ref());
            let array = match reusable {
                Some(array) => Arc::clone(array),
                None => {
                    // (as long as this batch: batches come at most so long,
                    // as a rule, and a slice counts its whole array)
                    let array = ScalarValue::try_from_array(column, 0)
                        .and_then(|value| value.to_array_of_size(n));
                    let array = match array {
                        Ok(array) if array.data_type() == column.data_type() => array,
                        _ => continue,
                    };
                    made += array.get_array_memory_size();
                    *shared = Some(Arc::clone(&array));
                    array
                }
            };
            let slice = array.slice(0, n);
            slices += slice.get_array_memory_size();
            columns[*c] = slice;
        }
        if slices == 0 {
            return Ok((batch, 0, made));
        }
        Ok((RecordBatch::try_new(batch.schema(), columns)?, slices, made))
    }

    /// Retain `batch` as the next batch.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        self.push_rows(batch, None).map(|_| ())
    }

    /// Retain `batch`, of which only `rows` (ascending) are this fold's
    /// when given: the batch is kept whole, shared (its other rows are
    /// other folds'), unless its buffers are loose, when `rows` are copied.
    /// Returns the batch as retained and the rows of it that are this
    /// fold's (`None`: all), which is what an index must point into.
    pub fn push_rows(
        &mut self,
        batch: &RecordBatch,
        rows: Option<&UInt32Array>,
    ) -> Result<(&RecordBatch, Option<&UInt32Array>)> {
        let (batch, rows) = match rows {
            Some(rows) if rows.len() < batch.num_rows() => {
                if loose(batch)? {
                    (take_record_batch(batch, rows)?, None)
                } else {
                    (batch.clone(), Some(rows.clone()))
                }
            }
            _ => (retained(batch)?, None),
        };
        let (batch, slices, made) = self.share_constants(batch)?;
        // (a shared array counts once, when made, and with no batch: it
        // stays counted while any batch released later may hold it)
        let whole = held_bytes(&batch).saturating_sub(slices);
        let size = match &rows {
            Some(r) => whole * r.len() / batch.num_rows().max(1) + r.get_array_memory_size(),
            None => whole,
        };
        self.bytes += size + made;
        self.sizes.push(size);
        self.rows.push(rows);
        self.batches.push(batch);
        let b = self.batches.len() - 1;
        Ok((&self.batches[b], self.rows[b].as_ref()))
    }

    /// The batches, in the order they were retained.
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }

    /// Number of batches retained.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Bytes held.
    pub fn memory_size(&self) -> usize {
        self.bytes
    }

    /// Batch `b`, released (an empty batch takes its place).
    pub fn release(&mut self, b: usize) -> RecordBatch {
        let empty = RecordBatch::new_empty(self.batches[b].schema());
        let batch = std::mem::replace(&mut self.batches[b], empty);
        self.rows[b] = None;
        self.bytes = self
            .bytes
            .saturating_sub(std::mem::take(&mut self.sizes[b]));
        batch
    }

    /// This fold's rows, in the order they were retained: each batch, or
    /// the copy of its rows where it was shared.
    pub fn into_batches(self) -> Result<Vec<RecordBatch>> {
        self.batches
            .into_iter()
            .zip(self.rows)
            .map(|(batch, rows)| match rows {
                Some(rows) => Ok(take_record_batch(&batch, &rows)?),
                None => Ok(batch),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two batches of views into one buffer of strings (a Parquet page
    /// decoded once) count their views and the values they point at, not
    /// the shared buffer each.
    #[test]
    fn views_count_the_values_they_point_at() -> Result<()> {
        use arrow::array::StringViewArray;
        let long: StringViewArray = (0..1000)
            .map(|i| Some(format!("a value of twenty {i:03}")))
            .collect();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "s",
            DataType::Utf8View,
            false,
        )]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(long) as ArrayRef])?;
        let mut retained = Retained::default();
        retained.push(&batch.slice(0, 500))?;
        retained.push(&batch.slice(500, 500))?;
        // 16 bytes a view and 21 bytes a value, each row once
        let rows = 1000 * (16 + 21);
        let held = retained.memory_size();
        assert!(held >= rows && held < rows + 512, "{held} for {rows}");
        assert!(held < 2 * batch.get_array_memory_size());
        Ok(())
    }
    use arrow::array::{Int64Builder, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    /// A constant column of one value in all its rows is kept as a slice of
    /// one shared array while the value holds and the array is long enough
    /// (anew otherwise); a column of two values, or with a null, is kept as
    /// it came. The rows read the same either way, and the bytes held count
    /// each shared array once.
    #[test]
    fn constant_columns_share_one_array() -> Result<()> {
        use arrow::array::{Int64Array, Int8Array};
        let schema = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, false),
            Field::new("at", DataType::Int64, true),
            Field::new("origin", DataType::Int8, false),
        ]));
        let batch = |n: i64, at: Vec<Option<i64>>, origin: i8| {
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from_iter_values(0..n)),
                    Arc::new(Int64Array::from(at)),
                    Arc::new(Int8Array::from(vec![origin; n as usize])),
                ],
            )
        };
        let pushed = vec![
            batch(1000, vec![Some(7); 1000], 1)?,
            batch(1000, vec![Some(7); 1000], 1)?,
            batch(3, vec![Some(7); 3], 1)?,
            batch(2, vec![Some(7), Some(8)], 1)?,
            batch(2, vec![Some(7), None], 1)?,
            batch(3, vec![Some(9); 3], 0)?,
            batch(4, vec![Some(9); 4], 0)?,
        ];
        let mut retained = Retained::default().with_constant_columns(&[1, 2]);
        for b in &pushed {
            retained.push(b)?;
        }
        assert_eq!(retained.batches(), pushed.as_slice());
        let ptr =
            |b: usize, c: usize| retained.batches()[b].column(c).to_data().buffers()[0].as_ptr();
        // one value: shared while it holds and the array is long enough
        assert_eq!(ptr(0, 1), ptr(1, 1));
        assert_eq!(ptr(0, 1), ptr(2, 1));
        assert_eq!(ptr(0, 2), ptr(3, 2));
        assert_eq!(ptr(0, 2), ptr(4, 2));
        // a new value, or a longer batch: anew
        assert_ne!(ptr(5, 1), ptr(0, 1));
        assert_ne!(ptr(6, 1), ptr(5, 1));
        assert_ne!(ptr(6, 2), ptr(5, 2));
        // two values, or a null: as they came
        for b in [3, 4] {
            assert_ne!(ptr(b, 1), ptr(0, 1));
        }
        // each shared array counts once
        let made: usize = [(7_i64, 1_i8, 1000), (9, 0, 3), (9, 0, 4)]
            .into_iter()
            .map(|(at, origin, n)| {
                let at = ScalarValue::Int64(Some(at)).to_array_of_size(n)?;
                let origin = ScalarValue::Int8(Some(origin)).to_array_of_size(n)?;
                Ok(at.get_array_memory_size() + origin.get_array_memory_size())
            })
            .sum::<Result<usize>>()?;
        // (small batches were copied to tight buffers: their own sizes)
        let size = |b: usize, c: usize| retained.batches()[b].column(c).get_array_memory_size();
        let own = (0..pushed.len()).map(|b| size(b, 0)).sum::<usize>() + size(3, 1) + size(4, 1);
        assert_eq!(retained.memory_size(), own + made);
        // releasing the batch that made a shared array keeps it counted
        // (later batches hold it)
        let first = size(0, 0);
        retained.release(0);
        assert_eq!(retained.memory_size(), own - first + made);
        Ok(())
    }

    #[test]
    fn slack_is_dropped_and_tight_batches_are_kept() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Utf8, true),
        ]));
        // a builder sized for 8192 rows, holding 100
        let mut a = Int64Builder::with_capacity(8192);
        a.append_slice(&(0..100).collect::<Vec<i64>>());
        let b = StringArray::from_iter((0..100).map(|i| Some(format!("v{i}"))));
        let loose = RecordBatch::try_new(schema, vec![Arc::new(a.finish()), Arc::new(b)])?;
        let kept = retained(&loose)?;
        assert_eq!(kept, loose);
        assert!(kept.get_array_memory_size() * 4 < loose.get_array_memory_size());
        // a tight batch (the copy) is kept as it is: the same buffers
        let again = retained(&kept)?;
        assert_eq!(again, kept);
        for (a, b) in again.columns().iter().zip(kept.columns()) {
            assert_eq!(
                a.to_data().buffers()[0].as_ptr(),
                b.to_data().buffers()[0].as_ptr()
            );
        }
        Ok(())
    }
}
