//! Reading a target's stored rows as plain Parquet scans, for plans that
//! travel to other processes ([`PlainFilesTable`] → [`StoredFilesExec`]).
//!
//! delta-rs' scan (`DeltaScanExec`) and our by-position reader
//! (`StoredRowsExec`) cannot be serialised, and a cluster scheduler narrows
//! only the leaves it knows to a task's partitions. With
//! `autocdc.plain_parquet_reads` an update reads its stored rows through an
//! ordinary `DataSourceExec` over the state store's data files instead,
//! under an operator of ours that applies what the Delta log says about
//! single rows:
//!
//! ```text
//!  StoredFilesExec: files=…, masked=…      drops deleted rows (or keeps only
//!    DataSourceExec (Parquet)              the selected ones), drops __cdc_file
//!      file groups, no byte ranges, no predicate
//!      partition values: the file's own, then __cdc_file = its index
//! ```
//!
//! A file's mask is by row position, so the Parquet scan must yield every
//! row of a file, in order: the scan is built without a predicate and
//! without splitting files (its file groups are its declared partitioning,
//! which optimizers keep, here and wherever the plan is decoded), and
//! `StoredFilesExec` stops filters from being pushed into it; it refuses
//! an input whose files were split. Each file
//! sits in one file group and a group is read file after file, so a
//! stream's running count per file is the row position.
//!
//! | mask of file | rows passed on                                     |
//! |--------------|----------------------------------------------------|
//! | none         | every row                                          |
//! | `Deleted(v)` | rows whose position is not in `v` (its vector)     |
//! | `Selected(v)`| rows whose position is in `v` (a small update's)   |

use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::{Array, AsArray, BooleanArray, BooleanBufferBuilder, RecordBatch};
use arrow::buffer::BooleanBuffer;
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DFSchema, DataFusionError, Result, ScalarValue};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfig, FileScanConfigBuilder, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::datasource::TableType;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::utils::expr_to_columns;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use deltalake_core::kernel::{Add, DeletionVectorDescriptor, LogicalFileView};
use futures::{Stream, StreamExt};
use object_store::path::Path;
use object_store::ObjectStore;
use roaring::RoaringTreemap;
use url::Url;

use super::deletion_vectors::read_vectors;

/// Name of the column carrying a row's file index between the scan and
/// [`StoredFilesExec`] (never seen above it).
pub const FILE_INDEX_COL: &str = "__cdc_file";

/// Which rows of a data file are read, by position.
#[derive(Debug, Clone, PartialEq)]
pub enum RowMask {
    /// Every row but these (the file's deletion vector).
    Deleted(RoaringTreemap),
    /// Only these rows.
    Selected(RoaringTreemap),
}

/// A [`RowMask`] as sorted positions, for finding a batch's among them.
struct SortedMask {
    /// Whether the positions are the rows dropped (else the rows kept).
    deleted: bool,
    positions: Vec<u64>,
}

impl SortedMask {
    fn new(mask: &RowMask) -> Self {
        let (deleted, rows) = match mask {
            RowMask::Deleted(rows) => (true, rows),
            RowMask::Selected(rows) => (false, rows),
        };
        Self {
            deleted,
            positions: rows.iter().collect(),
        }
    }

    /// Which of the `len` rows from position `first` are passed on.
    fn keep(&self, first: u64, len: usize) -> BooleanBuffer {
        let end = first + len as u64;
        let lo = self.positions.partition_point(|&p| p < first);
        let hi = self.positions.partition_point(|&p| p < end);
        let mut bits = BooleanBufferBuilder::new(len);
        bits.append_n(len, self.deleted);
        for &position in &self.positions[lo..hi] {
            bits.set_bit((position - first) as usize, !self.deleted);
        }
        bits.finish()
    }
}

/// Which rows of a data file a plain read passes on.
#[derive(Debug, Clone)]
pub enum FileRows {
    /// Every row.
    All,
    /// The rows of this mask.
    Masked(RowMask),
    /// Every row but those of this deletion vector (read by the scans that
    /// read the file).
    Vector(DeletionVectorDescriptor),
}

/// One data file of a plain read.
#[derive(Debug, Clone)]
pub struct PlainFile {
    /// Path in the warehouse's store.
    pub path: Path,
    /// Size in bytes.
    pub size: u64,
    /// Its partition values, in the table's partition column order.
    pub partition_values: Vec<ScalarValue>,
    /// The rows read.
    pub rows: FileRows,
}

/// A data file as the log names it: its path in the table, size and
/// partition values (as text).
struct FileEntry {
    path: Path,
    size: i64,
    partition_values: HashMap<String, Option<String>>,
}

impl FileEntry {
    fn of(view: &LogicalFileView) -> Self {
        Self {
            path: view.object_store_path(),
            size: view.size(),
            partition_values: view.partition_values_map(),
        }
    }
}

/// The stored rows of a target as plain Parquet scans (see the module docs).
pub struct PlainFilesTable {
    /// The store the files are read from (registered in the session).
    store_url: ObjectStoreUrl,
    /// The table's store, rooted at the table (deletion vectors).
    store: Arc<dyn ObjectStore>,
    /// Raw schema: data columns, then the partition columns.
    schema: SchemaRef,
    /// The partition columns, at the end of `schema`.
    partition_fields: Vec<Arc<Field>>,
    files: Vec<PlainFile>,
}

impl fmt::Debug for PlainFilesTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlainFilesTable")
            .field("store", &self.store_url)
            .field("files", &self.files.len())
            .finish()
    }
}

/// Where a plain read finds a table: its root URL (the files, through the
/// session's stores), its store rooted there (deletion vectors), its raw
/// schema (partition columns last) and partition columns.
pub struct TableLocation<'a> {
    pub url: &'a Url,
    pub store: Arc<dyn ObjectStore>,
    pub schema: SchemaRef,
    pub partition_columns: &'a [String],
}

impl PlainFilesTable {
    /// The data files `views`, each read whole but for the rows its
    /// deletion vector marks (vectors are read by the scans that need them).
    pub fn with_vectors(table: TableLocation<'_>, views: Vec<LogicalFileView>) -> Result<Self> {
        let files = views
            .into_iter()
            .map(|view| {
                let rows = match view.deletion_vector_descriptor() {
                    Some(descriptor) => FileRows::Vector(descriptor),
                    None => FileRows::All,
                };
                (FileEntry::of(&view), rows)
            })
            .collect();
        Self::try_new(table, files)
    }

    /// The data files `adds` (written, maybe not committed yet), each read
    /// whole.
    pub fn with_adds(table: TableLocation<'_>, adds: &[Add]) -> Result<Self> {
        let files = adds
            .iter()
            .map(|add| {
                let path = Path::from_url_path(&add.path)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                let entry = FileEntry {
                    path,
                    size: add.size,
                    partition_values: add.partition_values.clone(),
                };
                Ok((entry, FileRows::All))
            })
            .collect::<Result<Vec<_>>>()?;
        Self::try_new(table, files)
    }

    /// The data files of `files`, each read for the rows of its mask.
    pub fn with_masks(
        table: TableLocation<'_>,
        files: Vec<(LogicalFileView, RowMask)>,
    ) -> Result<Self> {
        let files = files
            .into_iter()
            .map(|(view, mask)| (FileEntry::of(&view), FileRows::Masked(mask)))
            .collect();
        Self::try_new(table, files)
    }

    fn try_new(table: TableLocation<'_>, files: Vec<(FileEntry, FileRows)>) -> Result<Self> {
        let TableLocation {
            url: location,
            store,
            schema,
            partition_columns,
        } = table;
        let store_url =
            ObjectStoreUrl::parse(format!("{}://{}", location.scheme(), location.authority()))?;
        let root = Path::from_url_path(location.path())
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let partition_fields = partition_columns
            .iter()
            .map(|name| Ok(Arc::new(schema.field_with_name(name)?.clone())))
            .collect::<Result<Vec<_>>>()?;
        let files = files
            .into_iter()
            .map(|(entry, rows)| {
                let values = entry.partition_values;
                let partition_values = partition_fields
                    .iter()
                    .map(|field| match values.get(field.name()).cloned().flatten() {
                        Some(text) => ScalarValue::try_from_string(text, field.data_type()),
                        None => ScalarValue::try_from(field.data_type()),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(PlainFile {
                    path: Path::from_iter(root.parts().chain(entry.path.parts())),
                    size: entry.size.max(0) as u64,
                    partition_values,
                    rows,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            store_url,
            store,
            schema,
            partition_fields,
            files,
        })
    }

    /// The masks of the files `kept` (by file index; `None` for the others
    /// and files read whole), reading their deletion vectors together (the
    /// vectors of one file with one request).
    async fn masks(&self, kept: &[usize]) -> Result<Vec<Option<RowMask>>> {
        let mut masks = vec![None; self.files.len()];
        let mut vectors = Vec::new();
        for &i in kept {
            match &self.files[i].rows {
                FileRows::All => {}
                FileRows::Masked(mask) => masks[i] = Some(mask.clone()),
                FileRows::Vector(descriptor) => vectors.push((i, descriptor.clone())),
            }
        }
        let descriptors: Vec<_> = vectors.iter().map(|(_, d)| d.clone()).collect();
        let read = read_vectors(&self.store, &descriptors).await?;
        for ((i, _), deleted) in vectors.into_iter().zip(read) {
            masks[i] = Some(RowMask::Deleted(deleted));
        }
        Ok(masks)
    }

    /// Indices of the files whose partition values satisfy every filter
    /// that names only partition columns.
    fn pruned(&self, state: &dyn Session, filters: &[Expr]) -> Result<Vec<usize>> {
        let mut keep = vec![true; self.files.len()];
        if self.partition_fields.is_empty() || self.files.is_empty() {
            return Ok((0..self.files.len()).collect());
        }
        let partition_schema = Arc::new(Schema::new(self.partition_fields.clone()));
        let df_schema = DFSchema::try_from(Arc::clone(&partition_schema))?;
        let columns = (0..self.partition_fields.len())
            .map(|c| {
                ScalarValue::iter_to_array(self.files.iter().map(|f| f.partition_values[c].clone()))
            })
            .collect::<Result<Vec<_>>>()?;
        let values = RecordBatch::try_new(partition_schema, columns)?;
        for filter in filters {
            if !only_partition_columns(filter, &self.partition_fields) {
                continue;
            }
            let expr = state.create_physical_expr(filter.clone(), &df_schema)?;
            let result = expr.evaluate(&values)?.into_array(values.num_rows())?;
            let Some(result) = result.as_boolean_opt() else {
                continue;
            };
            for (i, k) in keep.iter_mut().enumerate() {
                *k &= result.is_valid(i) && result.value(i);
            }
        }
        Ok((0..self.files.len()).filter(|&i| keep[i]).collect())
    }
}

/// Whether `filter` names partition columns only.
fn only_partition_columns(filter: &Expr, partition_fields: &[Arc<Field>]) -> bool {
    let mut columns = std::collections::HashSet::new();
    expr_to_columns(filter, &mut columns).is_ok()
        && !columns.is_empty()
        && columns
            .iter()
            .all(|c| partition_fields.iter().any(|f| f.name() == &c.name))
}

#[async_trait]
impl TableProvider for PlainFilesTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Filters on partition columns prune files; every filter is applied
    /// again above the scan (rows of a file are never filtered inside it).
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let kept = self.pruned(state, filters)?;
        let data_columns = self.schema.fields().len() - self.partition_fields.len();
        let file_schema = Arc::new(Schema::new(self.schema.fields()[..data_columns].to_vec()));
        let mut partition_cols = self.partition_fields.clone();
        partition_cols.push(Arc::new(Field::new(
            FILE_INDEX_COL,
            DataType::UInt32,
            false,
        )));
        let table_schema = TableSchema::builder(file_schema)
            .with_table_partition_cols(partition_cols)
            .build();
        let source = Arc::new(ParquetSource::new(table_schema));
        // groups of about equal bytes, each file whole in one group
        let groups = state
            .config()
            .target_partitions()
            .clamp(1, kept.len().max(1));
        let mut order = kept.clone();
        order.sort_by_key(|&i| std::cmp::Reverse(self.files[i].size));
        let mut loads = vec![0u64; groups];
        let mut grouped: Vec<Vec<PartitionedFile>> = vec![Vec::new(); groups];
        for i in order {
            let file = &self.files[i];
            let lightest = (0..groups).min_by_key(|&g| loads[g]).unwrap_or(0);
            loads[lightest] += file.size;
            let mut values = file.partition_values.clone();
            values.push(ScalarValue::UInt32(Some(i as u32)));
            // (the location as it is: `PartitionedFile::new` parses its text
            // again, encoding a `%`, a `#` or a non-ASCII letter of the
            // warehouse's path or the table's name once more)
            let meta = object_store::ObjectMeta {
                location: file.path.clone(),
                last_modified: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
                size: file.size,
                e_tag: None,
                version: None,
            };
            grouped[lightest].push(PartitionedFile::from(meta).with_partition_values(values));
        }
        let mut file_groups: Vec<FileGroup> = grouped
            .into_iter()
            .filter(|g| !g.is_empty())
            .map(FileGroup::new)
            .collect();
        if file_groups.is_empty() {
            // one empty partition: a scan of none would have no partition,
            // which operators needing one cannot take
            file_groups.push(FileGroup::new(Vec::new()));
        }
        let mut columns: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.schema.fields().len()).collect(),
        };
        // the file index, after the projected columns
        columns.push(self.schema.fields().len());
        // Declared partitioning: file groups are the partitions, so no
        // optimizer (this process's, a scheduler's, an executor's) splits
        // them into byte ranges (`FileScanConfig::repartitioned`); the
        // declaration travels with the plan's bytes.
        let partitions = Partitioning::UnknownPartitioning(file_groups.len());
        let config = FileScanConfigBuilder::new(self.store_url.clone(), source)
            .with_file_groups(file_groups)
            .with_output_partitioning(Some(partitions))
            .with_projection_indices(Some(columns))?
            .build();
        let scan = DataSourceExec::from_data_source(config);
        let masks = self.masks(&kept).await?;
        Ok(Arc::new(StoredFilesExec::try_new(Arc::new(masks), scan)?))
    }
}

/// Applies the row masks of state-store files to a plain Parquet scan of
/// them (see the module docs): input columns are the output's, then
/// [`FILE_INDEX_COL`].
#[derive(Debug)]
pub struct StoredFilesExec {
    /// Mask of each file, by file index.
    masks: Arc<Vec<Option<RowMask>>>,
    input: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StoredFilesExec {
    /// The operator over `input`, whose last column is the file index.
    pub fn try_new(
        masks: Arc<Vec<Option<RowMask>>>,
        input: Arc<dyn ExecutionPlan>,
    ) -> Result<Self> {
        let input_schema = input.schema();
        let last = input_schema.fields().len().checked_sub(1);
        match last.map(|i| input_schema.field(i)) {
            Some(f) if f.name() == FILE_INDEX_COL && f.data_type() == &DataType::UInt32 => {}
            _ => {
                return Err(DataFusionError::Internal(format!(
                    "StoredFilesExec needs its input's last column to be {FILE_INDEX_COL} (UInt32), got {input_schema}"
                )))
            }
        }
        let schema = Arc::new(Schema::new_with_metadata(
            input_schema.fields()[..input_schema.fields().len() - 1].to_vec(),
            input_schema.metadata().clone(),
        ));
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            masks,
            input,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The mask of each file, by file index.
    pub fn masks(&self) -> &Arc<Vec<Option<RowMask>>> {
        &self.masks
    }

    /// Refuse a Parquet scan that would not yield whole files in order.
    fn check_input(&self) -> Result<()> {
        let Some(source) = self.input.downcast_ref::<DataSourceExec>() else {
            return Ok(());
        };
        let Some(config) = source.data_source().downcast_ref::<FileScanConfig>() else {
            return Ok(());
        };
        let split = config
            .file_groups
            .iter()
            .flat_map(|g| g.files())
            .find(|f| f.range.is_some());
        match split {
            Some(file) => Err(DataFusionError::Internal(format!(
                "StoredFilesExec: '{}' is read in byte ranges; row positions need whole files",
                file.object_meta.location
            ))),
            None => Ok(()),
        }
    }
}

impl DisplayAs for StoredFilesExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let masked = self.masks.iter().flatten().count();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "StoredFilesExec: files={}, masked={masked}",
                self.masks.len()
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "files={}", self.masks.len())?;
                write!(f, "masked={masked}")
            }
        }
    }
}

impl ExecutionPlan for StoredFilesExec {
    fn name(&self) -> &str {
        "StoredFilesExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    /// Splitting the files of the scan below would lose row positions.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Internal("StoredFilesExec needs one child".into()))?;
        Ok(Arc::new(Self::try_new(Arc::clone(&self.masks), input)?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.check_input()?;
        let input = self.input.execute(partition, context)?;
        let m = || MetricBuilder::new(&self.metrics);
        Ok(Box::pin(MaskedStream {
            input,
            schema: Arc::clone(&self.schema),
            masks: Arc::clone(&self.masks),
            positions: vec![0; self.masks.len()],
            sorted: (0..self.masks.len()).map(|_| None).collect(),
            rows_masked: m().counter("rows_masked", partition),
            output_rows: m().output_rows(partition),
        }))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// The rows of one partition of the scan with the masks applied.
struct MaskedStream {
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    masks: Arc<Vec<Option<RowMask>>>,
    /// Rows seen so far of each file: the position of its next row.
    positions: Vec<u64>,
    /// Masks of the files seen, sorted on first sight.
    sorted: Vec<Option<SortedMask>>,
    rows_masked: Count,
    output_rows: Count,
}

impl MaskedStream {
    fn apply(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        let last = batch.num_columns() - 1;
        let index = batch
            .column(last)
            .as_primitive_opt::<UInt32Type>()
            .ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "StoredFilesExec: {FILE_INDEX_COL} is not UInt32"
                ))
            })?;
        if index.null_count() > 0 {
            return Err(DataFusionError::Internal(format!(
                "StoredFilesExec: NULL {FILE_INDEX_COL}"
            )));
        }
        let rows = RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            batch.columns()[..last].to_vec(),
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )?;
        let files = index.values();
        // runs of one file (a batch of a Parquet scan holds one file's rows)
        let mut keep: Option<BooleanBufferBuilder> = None;
        let mut start = 0;
        while start < files.len() {
            let file = files[start];
            let end = start
                + files[start..]
                    .iter()
                    .position(|&f| f != file)
                    .unwrap_or(files.len() - start);
            let file = file as usize;
            let len = end - start;
            let position = self.positions.get_mut(file).ok_or_else(|| {
                DataFusionError::Internal(format!(
                    "StoredFilesExec: file index {file} beyond its {} files",
                    self.masks.len()
                ))
            })?;
            let mask = match &self.masks[file] {
                Some(mask) => {
                    Some(&*self.sorted[file].get_or_insert_with(|| SortedMask::new(mask)))
                }
                None => None,
            };
            match (mask, &mut keep) {
                (None, None) => {}
                (None, Some(builder)) => builder.append_n(len, true),
                (Some(mask), _) => {
                    let builder = keep.get_or_insert_with(|| {
                        let mut b = BooleanBufferBuilder::new(files.len());
                        b.append_n(start, true);
                        b
                    });
                    builder.append_buffer(&mask.keep(*position, len));
                }
            }
            *position += len as u64;
            start = end;
        }
        let Some(mut keep) = keep else {
            return Ok(rows);
        };
        let keep = BooleanArray::new(keep.finish(), None);
        let kept = filter_record_batch(&rows, &keep)?;
        self.rows_masked.add(rows.num_rows() - kept.num_rows());
        Ok(kept)
    }
}

impl Stream for MaskedStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.input.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(batch))) => {
                let out = self.apply(batch);
                if let Ok(batch) = &out {
                    self.output_rows.add(batch.num_rows());
                }
                Poll::Ready(Some(out))
            }
            other => other,
        }
    }
}

impl RecordBatchStream for MaskedStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
