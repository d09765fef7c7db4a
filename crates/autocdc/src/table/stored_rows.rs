//! Reading the stored rows a small update replaces, by position
//! ([`StoredRowsTable`] → [`StoredRowsExec`]).
//!
//! The rows were found by key while the update was planned
//! ([`Superseded`](super::superseded::Superseded)); this scan reads just
//! them, one partition per group of data files, so `EXPLAIN ANALYZE` shows
//! how many files and rows a small update read:
//!
//! ```text
//!  StoredRowsExec: files=16, rows=96720     one partition per file group
//!    partition p: file 1 ─► Parquet read with a row selection ─► conform ─┐
//!                 file 2 ─► …                                            ├─► batches
//! ```
//!
//! Only the projected columns are decoded; filters are left to a
//! `FilterExec` above.

use std::fmt;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::{new_null_array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::compute::cast;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use deltalake_core::kernel::LogicalFileView;
use deltalake_core::parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection};
use deltalake_core::parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::ObjectStore;
use roaring::RoaringTreemap;

use super::file_tail::{Tail, TailReader};

/// One data file holding stored rows of an update's keys (found by
/// [`Superseded`](super::superseded::Superseded)'s probe).
#[derive(Clone)]
pub(super) struct SupersededFile {
    pub(super) view: LogicalFileView,
    /// The file's Parquet metadata, loaded by the probe.
    pub(super) metadata: ArrowReaderMetadata,
    /// All of the file, when the probe read it whole.
    pub(super) tail: Option<Tail>,
    /// Rows deleted by the file's vector before this update.
    pub(super) deleted: Option<RoaringTreemap>,
    /// Live rows whose key is one of the update's.
    pub(super) rows: RoaringTreemap,
}

/// The stored rows of an update's keys as a table: groups of data files
/// with the positions to read in each.
pub struct StoredRowsTable {
    store: Arc<dyn ObjectStore>,
    schema: SchemaRef,
    /// (shared with every scan's exec)
    groups: Arc<Vec<Vec<SupersededFile>>>,
}

impl fmt::Debug for StoredRowsTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredRowsTable")
            .field("partitions", &self.groups.len())
            .finish()
    }
}

impl StoredRowsTable {
    pub(super) fn new(
        store: Arc<dyn ObjectStore>,
        schema: SchemaRef,
        groups: Vec<Vec<SupersededFile>>,
    ) -> Self {
        Self {
            store,
            schema,
            groups: Arc::new(groups),
        }
    }
}

#[async_trait]
impl TableProvider for StoredRowsTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(columns) => Arc::new(self.schema.project(columns)?),
            None => Arc::clone(&self.schema),
        };
        Ok(Arc::new(StoredRowsExec::new(
            Arc::clone(&self.store),
            schema,
            Arc::clone(&self.groups),
        )))
    }
}

/// Reads the stored rows of an update's keys by position: partition `p`
/// reads the files of group `p` in turn, each with a Parquet row selection
/// (and the page index, so pages without a selected row are skipped).
pub struct StoredRowsExec {
    store: Arc<dyn ObjectStore>,
    groups: Arc<Vec<Vec<SupersededFile>>>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for StoredRowsExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredRowsExec")
            .field("files", &self.num_files())
            .field("rows", &self.num_rows())
            .finish()
    }
}

impl StoredRowsExec {
    fn new(
        store: Arc<dyn ObjectStore>,
        schema: SchemaRef,
        groups: Arc<Vec<Vec<SupersededFile>>>,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(groups.len().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            store,
            groups,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// Data files read.
    pub fn num_files(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }

    /// Rows read (the positions found).
    pub fn num_rows(&self) -> u64 {
        self.groups.iter().flatten().map(|f| f.rows.len()).sum()
    }
}

impl DisplayAs for StoredRowsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "StoredRowsExec: files={}, rows={}",
                self.num_files(),
                self.num_rows()
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "files={}", self.num_files())?;
                write!(f, "rows={}", self.num_rows())
            }
        }
    }
}

impl ExecutionPlan for StoredRowsExec {
    fn name(&self) -> &str {
        "StoredRowsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "StoredRowsExec has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = self.schema();
        let files = match self.groups.get(partition) {
            Some(files) => files.clone(),
            None if self.groups.is_empty() => Vec::new(),
            None => {
                return Err(DataFusionError::Internal(format!(
                    "StoredRowsExec: no partition {partition} of {}",
                    self.groups.len()
                )))
            }
        };
        let batch_size = context.session_config().batch_size();
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let store = Arc::clone(&self.store);
        let read_schema = Arc::clone(&schema);
        let stream = futures::stream::iter(files)
            .then(move |file| {
                let (store, schema) = (Arc::clone(&store), Arc::clone(&read_schema));
                async move { read_rows(store, schema, file, batch_size).await }
            })
            .try_flatten()
            .boxed();
        let stream = Timed {
            inner: stream,
            baseline,
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// A stream of stored rows recording the exec's baseline metrics: the time
/// spent decoding (`elapsed_compute`: polls of the reader, waits for the
/// object store excluded) and the rows, batches and bytes produced.
struct Timed {
    inner: BoxStream<'static, Result<RecordBatch>>,
    baseline: BaselineMetrics,
}

impl Stream for Timed {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let timer = this.baseline.elapsed_compute().timer();
        let poll = this.inner.poll_next_unpin(cx);
        timer.done();
        this.baseline.record_poll(poll)
    }
}

/// The rows `file.rows` of one data file, conformed to `schema`.
async fn read_rows(
    store: Arc<dyn ObjectStore>,
    schema: SchemaRef,
    file: SupersededFile,
    batch_size: usize,
) -> Result<impl futures::Stream<Item = Result<RecordBatch>>> {
    let path = file.view.object_store_path();
    let reader =
        TailReader::new(&store, &path, file.view.size().max(0) as u64).with(file.tail.clone());
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
pub(crate) fn conform(
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
