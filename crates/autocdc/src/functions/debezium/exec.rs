//! `DebeziumExec`: reads and decodes Debezium event files, a share of the
//! files per partition, file by file (memory: one file's bytes and its
//! batches per partition).

use std::fmt;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt};

use super::decode::DebeziumLayout;
use super::files::EventFile;
use super::moved_keys::MovedKeys;
use crate::table::reject_sink::UnreadableLines;

/// Scans Debezium event files (see [`super::decode`]).
#[derive(Debug)]
pub(crate) struct DebeziumExec {
    store: Arc<dyn ObjectStore>,
    /// The files (parts of files) of each partition.
    partitions: Vec<Vec<EventFile>>,
    /// How messages name the files.
    names: Arc<FileNames>,
    layout: Arc<DebeziumLayout>,
    moved: Option<Arc<MovedKeys>>,
    /// Where malformed events go instead of failing the scan.
    unreadable: Option<Arc<UnreadableLines>>,
    projection: Option<Vec<usize>>,
    limit: Option<usize>,
    batch_rows: usize,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

/// How messages name the files of `debezium(path)`: under the path as
/// given (`/events/part-1.json`), not as the store's locations, which have
/// no leading `/`.
#[derive(Debug)]
pub(crate) struct FileNames {
    given: String,
    prefix: String,
}

impl FileNames {
    pub(crate) fn new(path: &str) -> Result<Self> {
        let url = ListingTableUrl::parse(path)?;
        Ok(Self {
            given: path.trim_end_matches('/').to_string(),
            prefix: url.prefix().to_string(),
        })
    }

    /// The name of the file at `location`.
    pub(crate) fn of(&self, location: &object_store::path::Path) -> String {
        let location = location.as_ref();
        match location.strip_prefix(self.prefix.as_str()) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                format!("{}{rest}", self.given)
            }
            _ => location.to_string(),
        }
    }
}

/// Metrics of one partition of [`DebeziumExec`].
struct ScanMetrics {
    baseline: BaselineMetrics,
    files_read: Count,
    bytes_read: Count,
    moved_keys: Count,
    unreadable: Count,
    decode_time: Time,
}

impl ScanMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        Self {
            baseline: BaselineMetrics::new(metrics, partition),
            files_read: MetricBuilder::new(metrics).counter("files_read", partition),
            bytes_read: MetricBuilder::new(metrics).counter("bytes_read", partition),
            moved_keys: MetricBuilder::new(metrics).counter("num_moved_keys", partition),
            unreadable: MetricBuilder::new(metrics).counter("num_unreadable_events", partition),
            decode_time: MetricBuilder::new(metrics).subset_time("decode_time", partition),
        }
    }
}

impl DebeziumExec {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn try_new(
        store: Arc<dyn ObjectStore>,
        files: Vec<EventFile>,
        names: Arc<FileNames>,
        layout: Arc<DebeziumLayout>,
        moved: Option<Arc<MovedKeys>>,
        unreadable: Option<Arc<UnreadableLines>>,
        projection: Option<Vec<usize>>,
        limit: Option<usize>,
        target_partitions: usize,
        batch_rows: usize,
    ) -> Result<Self> {
        let full = layout.schema();
        let schema = match &projection {
            Some(p) => Arc::new(full.project(p)?),
            None => full,
        };
        // the biggest files first, each to the partition with the fewest bytes
        let count = target_partitions.clamp(1, files.len().max(1));
        let mut partitions: Vec<(u64, Vec<EventFile>)> = vec![(0, Vec::new()); count];
        let mut files = files;
        files.sort_by(|a, b| {
            b.len()
                .cmp(&a.len())
                .then(a.meta.location.cmp(&b.meta.location))
        });
        for file in files {
            if let Some(lightest) = partitions.iter_mut().min_by_key(|(bytes, _)| *bytes) {
                lightest.0 += file.len();
                lightest.1.push(file);
            }
        }
        let partitions: Vec<Vec<EventFile>> = partitions
            .into_iter()
            .map(|(_, mut files)| {
                files.sort_by(|a, b| a.meta.location.cmp(&b.meta.location));
                files
            })
            .collect();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(partitions.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            store,
            partitions,
            names,
            layout,
            moved,
            unreadable,
            projection,
            limit,
            batch_rows: batch_rows.max(1),
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    fn files(&self) -> usize {
        self.partitions.iter().map(Vec::len).sum()
    }
}

impl DisplayAs for DebeziumExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "DebeziumExec: files={}, sequence={:?}",
                    self.files(),
                    self.layout.sequence()
                )?;
                if self.moved.is_some() {
                    write!(f, ", moved_keys")?;
                }
                if let Some(limit) = self.limit {
                    write!(f, ", limit={limit}")?;
                }
                Ok(())
            }
            DisplayFormatType::TreeRender => write!(f, "files={}", self.files()),
        }
    }
}

impl ExecutionPlan for DebeziumExec {
    fn name(&self) -> &str {
        "DebeziumExec"
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
                "DebeziumExec has no children".into(),
            ))
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let files = self.partitions.get(partition).cloned().ok_or_else(|| {
            DataFusionError::Internal(format!(
                "DebeziumExec has {} partitions, got {partition}",
                self.partitions.len()
            ))
        })?;
        let metrics = Arc::new(ScanMetrics::new(&self.metrics, partition));
        let (store, names, layout, moved) = (
            Arc::clone(&self.store),
            Arc::clone(&self.names),
            Arc::clone(&self.layout),
            self.moved.clone(),
        );
        let (projection, batch_rows) = (self.projection.clone(), self.batch_rows);
        let unreadable = self.unreadable.clone();
        let read = futures::stream::iter(files)
            .then(move |file| {
                let (store, names, layout, moved, projection, metrics, unreadable) = (
                    Arc::clone(&store),
                    Arc::clone(&names),
                    Arc::clone(&layout),
                    moved.clone(),
                    projection.clone(),
                    Arc::clone(&metrics),
                    unreadable.clone(),
                );
                async move {
                    let EventFile { meta, start } = file;
                    let bytes = store
                        .get_range(&meta.location, start..meta.size)
                        .await
                        .map_err(|e| DataFusionError::External(Box::new(e)))?;
                    metrics.files_read.add(1);
                    metrics.bytes_read.add(bytes.len());
                    let timer = metrics.decode_time.timer();
                    // (lines are counted from where the part begins)
                    let name = match start {
                        0 => names.of(&meta.location),
                        _ => format!("{} (from byte {start})", names.of(&meta.location)),
                    };
                    let decoded = match &unreadable {
                        None => layout.decode(&name, &bytes, batch_rows)?,
                        Some(lines) => {
                            let (batches, bad) =
                                layout.decode_lenient(&name, &bytes, batch_rows)?;
                            metrics.unreadable.add(bad.len());
                            for line in bad {
                                lines.push(line.reason, line.text)?;
                            }
                            batches
                        }
                    };
                    let mut out = Vec::new();
                    for batch in decoded {
                        let deletes = match &moved {
                            Some(moved) => moved.deletes(&batch)?,
                            None => None,
                        };
                        out.push(batch);
                        if let Some(deletes) = deletes {
                            metrics.moved_keys.add(deletes.num_rows());
                            out.push(deletes);
                        }
                    }
                    timer.done();
                    let projected = out
                        .into_iter()
                        .map(|b| match &projection {
                            Some(p) => b.project(p).map_err(DataFusionError::from),
                            None => Ok(b),
                        })
                        .collect::<Result<Vec<RecordBatch>>>()?;
                    metrics
                        .baseline
                        .record_output(projected.iter().map(RecordBatch::num_rows).sum::<usize>());
                    Ok::<_, DataFusionError>(futures::stream::iter(projected.into_iter().map(Ok)))
                }
            })
            .try_flatten();
        let limited = match self.limit {
            Some(limit) => read
                .scan(0usize, move |seen, batch| {
                    let out = match batch {
                        Ok(_) if *seen >= limit => None,
                        Ok(b) => {
                            let take = (limit - *seen).min(b.num_rows());
                            *seen += take;
                            Some(Ok(b.slice(0, take)))
                        }
                        Err(e) => Some(Err(e)),
                    };
                    futures::future::ready(out)
                })
                .boxed(),
            None => read.boxed(),
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            limited,
        )))
    }
}

#[cfg(test)]
mod tests {
    use object_store::path::Path;

    use super::FileNames;

    #[test]
    fn files_are_named_under_the_path_as_given() {
        let folder = FileNames::new("/events/").unwrap();
        assert_eq!(
            folder.of(&Path::from("events/a/part-1.json")),
            "/events/a/part-1.json"
        );
        let file = FileNames::new("/events/part-1.json").unwrap();
        assert_eq!(
            file.of(&Path::from("events/part-1.json")),
            "/events/part-1.json"
        );
        let memory = FileNames::new("memory:///dbz/").unwrap();
        assert_eq!(
            memory.of(&Path::from("dbz/part-2.json")),
            "memory:///dbz/part-2.json"
        );
    }
}
