//! The stored rows a small update replaces, found by key before it runs.
//!
//! A small update of a large table (its distinct keys at most
//! `autocdc.deletion_vector_max_fraction` of the live rows) neither reads
//! nor rewrites whole buckets. While it is planned, the key columns of the
//! data files in its buckets are probed for its keys; the fold then reads
//! only the rows found, and the commit marks exactly those rows deleted:
//!
//! ```text
//!  update's keys ─► KeySet ─► probe key columns of each data file ─► positions of live rows
//!                                                                     │    (old vector excluded)
//!    events ─────┐                                                    │
//!                ├─► AutoCdc ─► new files ─► commit: each probed file ◄┤
//!  StoredRowsExec┘                        gets old vector ∪ positions │
//!    ▲                                                                │
//!    └──── Parquet read of only those positions (row selection) ◄─────┘
//! ```
//!
//! Reading the key columns of every file is cheap next to decoding whole
//! rows; reading the rows at the found positions skips the decoding of all
//! others (and whole pages without any, through the page index). Positions
//! are those of the loaded table version: the commit refuses to apply them
//! to files that have since changed.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::compute::cast;
use arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, HashMap, Result, ScalarValue};
use datafusion_common_runtime::SpawnedTask;
use deltalake_core::kernel::{Action, Add, LogicalFileView};
use deltalake_core::parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection};
use deltalake_core::parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use roaring::RoaringTreemap;

use super::deletion_vectors::{object_reader, read_vector, superseded_rows, write_vectors, KeySet};
use super::stored_rows::StoredRowsTable;

/// One data file holding stored rows of the update's keys.
#[derive(Clone)]
pub(super) struct SupersededFile {
    view: LogicalFileView,
    /// The file's Parquet metadata, loaded by the probe.
    metadata: ArrowReaderMetadata,
    /// Rows deleted by the file's vector before this update.
    deleted: Option<RoaringTreemap>,
    /// Live rows whose key is one of the update's.
    pub(super) rows: RoaringTreemap,
}

/// The stored rows of an update's keys, by data file: what the fold reads
/// ([`Self::provider`]) and what the commit retires ([`Self::retire`]).
pub struct Superseded {
    keys: Arc<KeySet>,
    files: Vec<SupersededFile>,
}

impl fmt::Debug for Superseded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Superseded")
            .field("keys", &self.keys.len())
            .field("files", &self.files.len())
            .field("rows", &self.num_rows())
            .finish()
    }
}

impl Superseded {
    /// Probe the data files `views` (`concurrency` at once) for the live
    /// rows whose key is in `keys`.
    pub async fn find(
        store: &Arc<dyn ObjectStore>,
        keys: Arc<KeySet>,
        views: Vec<LogicalFileView>,
        concurrency: usize,
    ) -> Result<Self> {
        let files: Vec<SupersededFile> = futures::stream::iter(views)
            .map(|view| {
                // (a task per file: decoding and probing keys is CPU work)
                let (store, keys) = (Arc::clone(store), Arc::clone(&keys));
                SpawnedTask::spawn(async move { probe(&store, &keys, view).await }).join()
            })
            .buffer_unordered(concurrency.max(1))
            .map(|joined| joined.map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))?)
            .try_filter_map(|file| futures::future::ready(Ok(file)))
            .try_collect()
            .await?;
        Ok(Self { keys, files })
    }

    /// Number of stored rows found.
    pub fn num_rows(&self) -> u64 {
        self.files.iter().map(|f| f.rows.len()).sum()
    }

    /// A provider of the rows found, in `schema` (the raw table's: columns
    /// missing from a file are NULL, partition columns come from the file's
    /// partition values), read from `store` in `partitions` streams by a
    /// [`StoredRowsExec`](super::stored_rows::StoredRowsExec).
    pub fn provider(
        &self,
        store: &Arc<dyn ObjectStore>,
        schema: SchemaRef,
        partitions: usize,
    ) -> Result<Arc<dyn TableProvider>> {
        let partitions = partitions.clamp(1, self.files.len().max(1));
        let mut groups: Vec<Vec<SupersededFile>> = vec![Vec::new(); partitions];
        // largest first, each to the lightest group
        let mut files = self.files.clone();
        files.sort_by_key(|f| std::cmp::Reverse(f.rows.len()));
        let mut loads = vec![0u64; partitions];
        for file in files {
            let (lightest, _) = loads
                .iter()
                .enumerate()
                .min_by_key(|(_, load)| **load)
                .unwrap_or((0, &0));
            loads[lightest] += file.rows.len();
            groups[lightest].push(file);
        }
        Ok(Arc::new(StoredRowsTable::new(
            Arc::clone(store),
            schema,
            groups,
        )))
    }

    /// The actions retiring the rows found: for each file, a `remove` and an
    /// `add` of it with its old vector ∪ those rows (only the `remove` when
    /// no row is left). `current` are the table's data files now: a file
    /// probed but no longer there unchanged is an error (the positions would
    /// be wrong).
    pub async fn retire(
        &self,
        store: &Arc<dyn ObjectStore>,
        current: &[LogicalFileView],
    ) -> Result<Vec<Action>> {
        let now: HashMap<String, Option<(String, Option<i32>)>> = current
            .iter()
            .map(|v| (v.path().to_string(), vector_id(v)))
            .collect();
        let mut actions = Vec::with_capacity(2 * self.files.len());
        let (mut kept, mut vectors) = (Vec::new(), Vec::new());
        for file in &self.files {
            let path = file.view.path();
            if now.get(path.as_ref()) != Some(&vector_id(&file.view)) {
                return Err(DataFusionError::Execution(format!(
                    "data file '{path}' changed after the update was planned: run it again"
                )));
            }
            let mut rows = file.rows.clone();
            if let Some(deleted) = &file.deleted {
                rows |= deleted;
            }
            actions.push(Action::Remove(file.view.remove_action(true)));
            if file.view.num_records().map(|n| n as u64) != Some(rows.len()) {
                kept.push(&file.view);
                vectors.push(rows);
            }
        }
        if vectors.is_empty() {
            return Ok(actions);
        }
        let descriptors = write_vectors(store, &vectors).await?;
        for (view, descriptor) in kept.into_iter().zip(descriptors) {
            actions.push(Action::Add(Add {
                path: view.path().to_string(),
                partition_values: view.partition_values_map(),
                size: view.size(),
                modification_time: view.modification_time(),
                data_change: true,
                stats: view.stats().map(|s| wide_bounds(&s)),
                tags: None,
                deletion_vector: Some(descriptor),
                base_row_id: None,
                default_row_commit_version: None,
                clustering_provider: None,
            }));
        }
        Ok(actions)
    }
}

/// What identifies the deletion vector of `view`.
fn vector_id(view: &LogicalFileView) -> Option<(String, Option<i32>)> {
    view.deletion_vector_descriptor()
        .map(|d| (d.path_or_inline_dv, d.offset))
}

/// The live rows of `view` whose key is in `keys`; `None` when it has none.
async fn probe(
    store: &Arc<dyn ObjectStore>,
    keys: &KeySet,
    view: LogicalFileView,
) -> Result<Option<SupersededFile>> {
    let path = view.object_store_path();
    let (mut rows, metadata) =
        superseded_rows(store, &path, view.size().max(0) as u64, keys).await?;
    let deleted = match view.deletion_vector_descriptor() {
        Some(descriptor) => {
            let deleted = read_vector(store, &descriptor).await?;
            rows -= &deleted;
            Some(deleted)
        }
        None => None,
    };
    Ok((!rows.is_empty()).then_some(SupersededFile {
        view,
        metadata,
        deleted,
        rows,
    }))
}

/// File statistics marked as no longer tight (`tightBounds: false`): with
/// rows deleted by a vector, the minima, maxima and null counts of the whole
/// file only bound those of its live rows (`numRecords` stays the physical
/// count, as the protocol requires).
fn wide_bounds(stats: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(stats) {
        Ok(serde_json::Value::Object(mut fields)) => {
            fields.insert("tightBounds".into(), serde_json::Value::Bool(false));
            serde_json::Value::Object(fields).to_string()
        }
        _ => stats.to_string(),
    }
}

/// The rows `file.rows` of one data file, conformed to `schema`.
pub(super) async fn read_rows(
    store: Arc<dyn ObjectStore>,
    schema: SchemaRef,
    file: SupersededFile,
    batch_size: usize,
) -> Result<impl futures::Stream<Item = Result<RecordBatch>>> {
    let path = file.view.object_store_path();
    let reader = object_reader(&store, &path, file.view.size().max(0) as u64);
    // (the probe's metadata: the page index lets the reader skip pages
    // holding none of the rows)
    let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, file.metadata.clone());
    let total = builder.metadata().file_metadata().num_rows().max(0) as usize;
    let names: Vec<&str> = schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .filter(|n| builder.schema().field_with_name(n).is_ok())
        .collect();
    let mask = ProjectionMask::columns(builder.parquet_schema(), names);
    let stream = builder
        .with_projection(mask)
        .with_row_selection(selection(&file.rows, total))
        .with_batch_size(batch_size)
        .build()?;
    let partition = file.view.partition_values_map();
    Ok(stream.map(move |batch| conform(&batch?, &schema, &partition)))
}

/// A Parquet row selection of the positions `rows` out of `total`.
fn selection(rows: &RoaringTreemap, total: usize) -> RowSelection {
    let mut ranges: Vec<Range<usize>> = Vec::new();
    for row in rows.iter() {
        let row = row as usize;
        match ranges.last_mut() {
            Some(last) if last.end == row => last.end += 1,
            _ => ranges.push(row..row + 1),
        }
    }
    RowSelection::from_consecutive_ranges(ranges.into_iter(), total)
}

/// `batch` (columns of a data file) in `schema`: columns by name, cast when
/// the file stores another type; a partition column from the file's
/// partition values; a column the file lacks (added later) NULL.
fn conform(
    batch: &RecordBatch,
    schema: &SchemaRef,
    partition: &std::collections::HashMap<String, Option<String>>,
) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let columns = schema
        .fields()
        .iter()
        .map(|field| -> Result<ArrayRef> {
            if let Some(column) = batch.column_by_name(field.name()) {
                return Ok(if column.data_type() == field.data_type() {
                    Arc::clone(column)
                } else {
                    cast(column, field.data_type())?
                });
            }
            match partition.get(field.name()) {
                Some(Some(value)) => {
                    ScalarValue::try_from_string(value.clone(), field.data_type())?
                        .to_array_of_size(n)
                }
                Some(None) => ScalarValue::try_from(field.data_type())?.to_array_of_size(n),
                None => Ok(new_null_array(field.data_type(), n)),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(n)),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray, Int32Array, Int64Array};
    use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};

    /// A data file's batch in the table's schema: the key stored as another
    /// type is cast, the bucket comes from the partition values, a column
    /// added after the file was written is NULL.
    #[test]
    fn batches_are_conformed_to_the_table_schema() -> Result<()> {
        let file = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int32, false)])),
            vec![Arc::new(Int32Array::from(vec![3, 4]))],
        )?;
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("added", DataType::Utf8, true),
            Field::new("__cdc_bucket", DataType::Int32, true),
        ]));
        let partition = [("__cdc_bucket".to_string(), Some("5".to_string()))].into();
        let batch = conform(&file, &schema, &partition)?;
        assert_eq!(batch.schema(), schema);
        assert_eq!(
            batch.column(0).as_primitive::<Int64Type>(),
            &Int64Array::from(vec![3, 4])
        );
        assert_eq!(batch.column(1).null_count(), 2);
        assert_eq!(
            batch.column(2).as_primitive::<Int32Type>(),
            &Int32Array::from(vec![5, 5])
        );
        Ok(())
    }

    #[test]
    fn selections_coalesce_consecutive_rows() {
        let rows: RoaringTreemap = [0u64, 1, 2, 7, 9, 10].into_iter().collect();
        let selection = selection(&rows, 12);
        assert_eq!(selection.row_count(), 6);
        assert_eq!(selection.skipped_row_count(), 6);
        let ranges: Vec<_> = selection.iter().map(|s| (s.skip, s.row_count)).collect();
        assert_eq!(
            ranges,
            vec![
                (false, 3),
                (true, 4),
                (false, 1),
                (true, 1),
                (false, 2),
                (true, 1)
            ]
        );
    }
}
