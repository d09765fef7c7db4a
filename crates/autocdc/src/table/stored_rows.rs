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
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
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
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::ObjectStore;

use super::superseded::{read_rows, SupersededFile};

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
