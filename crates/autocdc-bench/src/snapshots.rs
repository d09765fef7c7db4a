//! Snapshot pairs: two full copies of a table `id BIGINT, <value columns>`,
//! the second with a share of rows changed, deleted and inserted.

use std::io::Write;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Builder, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;

use crate::rng::{mix64, Rng};
use crate::values::{ValueBuilders, ValueColumns};
use crate::{
    check_fraction, check_sizes, writer_properties, Error, Result, DEFAULT_BATCH_ROWS,
    DEFAULT_ROW_GROUP_ROWS,
};

/// Multiplier of the key scramble: odd, so `i -> i * KEY_SCRAMBLE mod 2^63` is
/// a bijection and distinct rows get distinct, unordered, non-negative keys.
const KEY_SCRAMBLE: u64 = 0x9e37_79b9_7f4a_7c15;

/// Parameters of a generated snapshot pair.
///
/// The first snapshot has `rows` rows with distinct keys in scrambled (not
/// sorted) order. Each of its rows is, in the second snapshot, deleted with
/// probability `deleted_fraction`, changed (every value column drawn anew)
/// with probability `changed_fraction`, and unchanged otherwise; then
/// `round(rows * inserted_fraction)` rows with new keys follow.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotsConfig {
    /// Rows of the first snapshot.
    pub rows: u64,
    /// Share of rows changed in the second snapshot.
    pub changed_fraction: f64,
    /// Share of rows absent from the second snapshot.
    pub deleted_fraction: f64,
    /// New rows of the second snapshot, as a share of `rows`.
    pub inserted_fraction: f64,
    /// The value columns.
    pub columns: ValueColumns,
    /// Seed of every random choice.
    pub seed: u64,
    /// Rows per Arrow batch.
    pub batch_rows: usize,
    /// Rows per Parquet row group.
    pub row_group_rows: usize,
}

impl Default for SnapshotsConfig {
    /// 2 M rows; 1 % changed, 0.5 % deleted, 0.5 % inserted.
    fn default() -> Self {
        Self {
            rows: 2_000_000,
            changed_fraction: 0.01,
            deleted_fraction: 0.005,
            inserted_fraction: 0.005,
            columns: ValueColumns::default(),
            seed: 42,
            batch_rows: DEFAULT_BATCH_ROWS,
            row_group_rows: DEFAULT_ROW_GROUP_ROWS,
        }
    }
}

impl SnapshotsConfig {
    /// Checks every parameter.
    pub fn validate(&self) -> Result<()> {
        check_fraction("changed fraction", self.changed_fraction)?;
        check_fraction("deleted fraction", self.deleted_fraction)?;
        check_fraction("inserted fraction", self.inserted_fraction)?;
        if self.changed_fraction + self.deleted_fraction > 1.0 {
            return Err(Error::Config(
                "changed and deleted fractions must add up to at most 1".into(),
            ));
        }
        let total = self.rows as f64 * (1.0 + self.inserted_fraction);
        if total > i64::MAX as f64 / 2.0 {
            return Err(Error::Config(format!("too many rows: {}", self.rows)));
        }
        check_sizes(self.batch_rows, self.row_group_rows)
    }

    /// How many rows the second snapshot inserts.
    fn inserted_rows(&self) -> u64 {
        (self.rows as f64 * self.inserted_fraction).round() as u64
    }
}

/// What a generated snapshot pair contains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotsSummary {
    /// Rows of the first snapshot.
    pub first_rows: u64,
    /// Rows of the second snapshot.
    pub second_rows: u64,
    /// Keys whose values changed.
    pub changed: u64,
    /// Keys of the first snapshot only.
    pub deleted: u64,
    /// Keys of the second snapshot only.
    pub inserted: u64,
}

/// The schema of a snapshot with `columns`: `id` then the value columns, none
/// of them nullable.
pub fn snapshot_schema(columns: &ValueColumns) -> SchemaRef {
    let mut fields = vec![Field::new("id", DataType::Int64, false)];
    fields.extend(columns.fields(false));
    Arc::new(Schema::new(fields))
}

/// Writes the snapshot pair described by `config`, the first snapshot to
/// `first` and the second to `second`, as Parquet, in one streaming pass
/// (memory: a batch and a row group per file).
pub fn write_snapshots<A, B>(
    config: &SnapshotsConfig,
    first: A,
    second: B,
) -> Result<SnapshotsSummary>
where
    A: Write + Send,
    B: Write + Send,
{
    config.validate()?;
    let mut rng = Rng::new(config.seed, 2);
    let mut first = SnapshotWriter::new(config, first)?;
    let mut second = SnapshotWriter::new(config, second)?;
    let mut summary = SnapshotsSummary::default();
    for row in 0..config.rows {
        let id = key(row);
        let values = row_values(config.seed, row);
        first.push(id, values)?;
        let fate = rng.unit();
        if fate < config.deleted_fraction {
            summary.deleted += 1;
        } else if fate < config.deleted_fraction + config.changed_fraction {
            summary.changed += 1;
            second.push(id, mix64(values ^ KEY_SCRAMBLE))?;
        } else {
            second.push(id, values)?;
        }
    }
    let end = config.rows + config.inserted_rows();
    for row in config.rows..end {
        summary.inserted += 1;
        second.push(key(row), row_values(config.seed, row))?;
    }
    summary.first_rows = first.close()?;
    summary.second_rows = second.close()?;
    Ok(summary)
}

/// The key of row number `row`.
fn key(row: u64) -> i64 {
    (row.wrapping_mul(KEY_SCRAMBLE) & (i64::MAX as u64)) as i64
}

/// The value seed of row number `row` in the first snapshot.
fn row_values(seed: u64, row: u64) -> u64 {
    mix64(mix64(seed) ^ row)
}

/// Batches snapshot rows and writes them as Parquet.
struct SnapshotWriter<W: Write + Send> {
    writer: ArrowWriter<W>,
    schema: SchemaRef,
    batch_rows: usize,
    ids: Int64Builder,
    values: ValueBuilders,
    buffered: usize,
    rows: u64,
}

impl<W: Write + Send> SnapshotWriter<W> {
    fn new(config: &SnapshotsConfig, sink: W) -> Result<Self> {
        let schema = snapshot_schema(&config.columns);
        let writer = ArrowWriter::try_new(
            sink,
            Arc::clone(&schema),
            Some(writer_properties(config.row_group_rows)),
        )?;
        Ok(Self {
            writer,
            schema,
            batch_rows: config.batch_rows,
            ids: Int64Builder::with_capacity(config.batch_rows),
            values: ValueBuilders::new(&config.columns, config.batch_rows),
            buffered: 0,
            rows: 0,
        })
    }

    fn push(&mut self, id: i64, values: u64) -> Result<()> {
        self.ids.append_value(id);
        self.values.append(values);
        self.rows += 1;
        self.buffered += 1;
        if self.buffered == self.batch_rows {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.buffered == 0 {
            return Ok(());
        }
        let mut columns: Vec<ArrayRef> = vec![Arc::new(self.ids.finish())];
        columns.extend(self.values.finish());
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        self.writer.write(&batch)?;
        self.buffered = 0;
        Ok(())
    }

    /// Writes what is buffered and the file footer; returns the rows written.
    fn close(mut self) -> Result<u64> {
        self.flush()?;
        let mut sink = self.writer.into_inner()?;
        sink.flush()?;
        Ok(self.rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    use arrow::array::AsArray;
    use arrow::datatypes::{Float64Type, Int64Type};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    /// Every row of a snapshot file as `id -> (i1, i2, s1, s2, d1 bits)`.
    type Rows = HashMap<i64, (i64, i64, String, String, u64)>;

    fn read(file: std::fs::File) -> Rows {
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet footer")
            .build()
            .expect("reader");
        let mut rows = HashMap::new();
        for batch in reader {
            let batch = batch.expect("batch");
            let col = |i: usize| batch.column(i).as_primitive::<Int64Type>().clone();
            let (ids, i1, i2) = (col(0), col(1), col(2));
            let s1 = batch.column(3).as_string::<i32>();
            let s2 = batch.column(4).as_string::<i32>();
            let d1 = batch.column(5).as_primitive::<Float64Type>();
            for r in 0..batch.num_rows() {
                let row = (
                    i1.value(r),
                    i2.value(r),
                    s1.value(r).to_string(),
                    s2.value(r).to_string(),
                    d1.value(r).to_bits(),
                );
                assert!(rows.insert(ids.value(r), row).is_none(), "duplicate key");
            }
        }
        rows
    }

    #[test]
    fn second_snapshot_differs_as_summarised() {
        let config = SnapshotsConfig {
            rows: 10_000,
            changed_fraction: 0.1,
            deleted_fraction: 0.05,
            inserted_fraction: 0.02,
            batch_rows: 777,
            row_group_rows: 3000,
            ..SnapshotsConfig::default()
        };
        let mut a = tempfile::tempfile().expect("temp file");
        let mut b = tempfile::tempfile().expect("temp file");
        let summary = write_snapshots(&config, &mut a, &mut b).expect("generate");
        let (first, second) = (read(a), read(b));
        assert_eq!(first.len() as u64, summary.first_rows);
        assert_eq!(second.len() as u64, summary.second_rows);
        assert_eq!(summary.first_rows, 10_000);
        assert_eq!(summary.inserted, 200);
        assert_eq!(
            summary.second_rows,
            summary.first_rows - summary.deleted + summary.inserted
        );
        let first_keys: HashSet<_> = first.keys().collect();
        let second_keys: HashSet<_> = second.keys().collect();
        assert_eq!(
            first_keys.difference(&second_keys).count() as u64,
            summary.deleted
        );
        assert_eq!(
            second_keys.difference(&first_keys).count() as u64,
            summary.inserted
        );
        let changed = first
            .iter()
            .filter(|(id, row)| second.get(id).is_some_and(|new| new != *row))
            .count() as u64;
        assert_eq!(changed, summary.changed);
        assert!((summary.changed as f64 / 10_000.0 - 0.1).abs() < 0.02);
        assert!((summary.deleted as f64 / 10_000.0 - 0.05).abs() < 0.015);
        assert!(first.keys().all(|id| *id >= 0));
    }

    #[test]
    fn bad_fractions_are_rejected() {
        let config = SnapshotsConfig {
            changed_fraction: 0.7,
            deleted_fraction: 0.7,
            ..SnapshotsConfig::default()
        };
        let error =
            write_snapshots(&config, std::io::sink(), std::io::sink()).expect_err("rejected");
        assert!(matches!(error, Error::Config(_)), "{error}");
    }
}
