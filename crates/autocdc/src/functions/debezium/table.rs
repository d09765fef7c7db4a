//! `debezium('path')`: the table function and its provider.

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use super::decode::DebeziumLayout;
use super::exec::{DebeziumExec, FileNames};
use super::files::{list_event_files, EventFile};
use super::moved_keys::MovedKeys;
use crate::fold::ScdType;
use crate::table::reject_sink::UnreadableLines;

/// How much of each of the first files the layout is inferred from.
const SAMPLE_BYTES: u64 = 1 << 20;
/// How many files the layout is inferred from the heads of.
const SAMPLE_FILES: usize = 4;
/// How much of the end of every file to scan the layout is also inferred
/// from.
const TAIL_BYTES: u64 = 256 << 10;
/// How many samples are read at once.
const SAMPLE_READS: usize = 8;

/// The flow a Debezium source is read for.
#[derive(Debug)]
pub(crate) struct FlowUse<'a> {
    pub name: &'a str,
    /// Its KEYS: a primary-key change also yields the DELETE of the old key
    /// ([`super::moved_keys`]).
    pub keys: &'a [String],
    /// What its target is stored as: but for SCD TYPE 1, a truncate event
    /// fails the update (or is a reject) instead of reading as an event
    /// with NULL keys.
    pub stored_as: ScdType,
    /// The columns its target has: what the source's earlier events were
    /// read as (see [`DebeziumLayout::infer_known`]).
    pub known_columns: &'a Schema,
}

/// Debezium change events in JSON files, one row per event (see
/// [`super::decode`]).
#[derive(Debug)]
pub(crate) struct DebeziumTable {
    store: Arc<dyn ObjectStore>,
    files: Vec<EventFile>,
    names: Arc<FileNames>,
    layout: Arc<DebeziumLayout>,
    moved: Option<Arc<MovedKeys>>,
    unreadable: Option<Arc<UnreadableLines>>,
}

impl DebeziumTable {
    /// The events of `files`, laid out as samples of them say: the first
    /// events of the first files and the last events of every file (a
    /// column added to the source table shows in the events after it;
    /// `sample`: files to infer from when `files` is empty, e.g. a flow's
    /// files already read). For a `flow`, see [`FlowUse`]. With
    /// `unreadable`, malformed events are left out of the layout's samples
    /// and of the scan and kept there (for the rejects of a flow whose
    /// target takes them) instead of failing it.
    pub(crate) async fn open(
        path: &str,
        store: Arc<dyn ObjectStore>,
        files: Vec<EventFile>,
        sample: &[ObjectMeta],
        flow: Option<&FlowUse<'_>>,
        unreadable: Option<Arc<UnreadableLines>>,
    ) -> Result<Self> {
        let parts: Vec<ObjectMeta> = files.iter().map(|f| f.meta.clone()).collect();
        let from = if parts.is_empty() { sample } else { &parts };
        if from.is_empty() {
            return plan_err!("debezium('{path}'): no event files (*.json, *.jsonl) there");
        }
        // the head of the first files, and the tail of every file to scan:
        // a column added to the source shows in the events after it
        let heads = from
            .iter()
            .take(SAMPLE_FILES)
            .map(|meta| (meta, Sample::Head));
        let tails = parts
            .iter()
            .enumerate()
            .filter(|(i, meta)| *i >= SAMPLE_FILES || meta.size > SAMPLE_BYTES)
            .map(|(_, meta)| (meta, Sample::Tail));
        let parts: Vec<(ObjectMeta, Sample)> = heads
            .chain(tails)
            .map(|(meta, part)| (meta.clone(), part))
            .collect();
        let objects_only = unreadable.is_some();
        let names = Arc::new(FileNames::new(path)?);
        let samples = read_samples(&store, &names, parts, objects_only).await?;
        let refs: Vec<(&str, &[u8])> = samples
            .iter()
            .map(|(name, bytes)| (name.as_str(), bytes.as_ref()))
            .collect();
        let context = |e: DataFusionError| e.context(format!("debezium('{path}')"));
        let empty = Schema::empty();
        let known = flow.map_or(&empty, |flow| flow.known_columns);
        let mut layout = match DebeziumLayout::infer_known(&refs, known).map_err(context)? {
            Some(layout) => layout,
            // new files of tombstones, messages or truncates only: their
            // columns are those of the files read before
            None if !files.is_empty() && !sample.is_empty() => {
                let heads = sample
                    .iter()
                    .take(SAMPLE_FILES)
                    .map(|meta| (meta.clone(), Sample::Head))
                    .collect();
                let earlier = read_samples(&store, &names, heads, objects_only).await?;
                let all: Vec<(&str, &[u8])> = earlier
                    .iter()
                    .map(|(name, bytes)| (name.as_str(), bytes.as_ref()))
                    .chain(refs.iter().copied())
                    .collect();
                DebeziumLayout::infer_known_or_fail(&all, known).map_err(context)?
            }
            None => DebeziumLayout::infer_known_or_fail(&refs, known).map_err(context)?,
        };
        let moved = match flow {
            Some(flow) => Some(Arc::new(MovedKeys::try_new(&layout.schema(), flow.keys)?)),
            None => None,
        };
        if let Some(FlowUse {
            name, stored_as, ..
        }) = flow.filter(|f| f.stored_as != ScdType::Type1)
        {
            layout = layout.refusing_truncates(format!(
                "a truncate event (op 't'), which flow '{name}' cannot apply: its target \
                 is STORED AS {stored_as}, and a TRUNCATE applies to SCD TYPE 1 targets only"
            ));
        }
        Ok(Self {
            store,
            files,
            names,
            layout: Arc::new(layout),
            moved,
            unreadable,
        })
    }
}

/// Which part of a file a layout sample is.
#[derive(Debug, Clone, Copy)]
enum Sample {
    /// Its first [`SAMPLE_BYTES`].
    Head,
    /// Its last [`TAIL_BYTES`].
    Tail,
}

/// The samples `parts` (see [`read_sample`]), [`SAMPLE_READS`] at once.
async fn read_samples(
    store: &Arc<dyn ObjectStore>,
    names: &FileNames,
    parts: Vec<(ObjectMeta, Sample)>,
    objects_only: bool,
) -> Result<Vec<(String, Vec<u8>)>> {
    futures::stream::iter(parts)
        .map(|(meta, part)| {
            let name = names.of(&meta.location);
            read_sample(Arc::clone(store), meta, name, part, objects_only)
        })
        .buffered(SAMPLE_READS)
        .try_collect()
        .await
}

/// The whole lines of one part of `meta`, named `name` (`objects_only`:
/// only the lines that are JSON objects, see [`json_objects_only`]).
async fn read_sample(
    store: Arc<dyn ObjectStore>,
    meta: ObjectMeta,
    name: String,
    part: Sample,
    objects_only: bool,
) -> Result<(String, Vec<u8>)> {
    let range = match part {
        Sample::Head => 0..meta.size.min(SAMPLE_BYTES),
        Sample::Tail => meta.size.saturating_sub(TAIL_BYTES)..meta.size,
    };
    let bytes = store
        .get_range(&meta.location, range.clone())
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    // whole lines only: drop a line cut at either end
    let end = match (
        range.end < meta.size,
        bytes.iter().rposition(|&b| b == b'\n'),
    ) {
        (true, Some(last)) => last + 1,
        (true, None) => 0,
        (false, _) => bytes.len(),
    };
    let start = match (
        range.start > 0,
        bytes[..end].iter().position(|&b| b == b'\n'),
    ) {
        (true, Some(first)) => first + 1,
        (true, None) => end,
        (false, _) => 0,
    };
    let bytes = &bytes[start..end];
    let bytes = match objects_only {
        // (the scan reports them; the layout ignores them)
        true => json_objects_only(bytes),
        false => bytes.to_vec(),
    };
    Ok((name, bytes))
}

/// The lines of `bytes` that are JSON objects (or tombstones) whose values
/// all read (a number out of a double's range, `1e400`, does not).
fn json_objects_only(bytes: &[u8]) -> Vec<u8> {
    let mut kept = Vec::with_capacity(bytes.len());
    for line in bytes.split(|b| *b == b'\n') {
        let trimmed = line.trim_ascii();
        let object = trimmed.first() == Some(&b'{')
            && serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(trimmed)
                .is_ok();
        if object || trimmed.is_empty() || trimmed == b"null" {
            kept.extend_from_slice(line);
            kept.push(b'\n');
        }
    }
    kept
}

#[async_trait]
impl TableProvider for DebeziumTable {
    fn schema(&self) -> SchemaRef {
        self.layout.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(DebeziumExec::try_new(
            Arc::clone(&self.store),
            self.files.clone(),
            Arc::clone(&self.names),
            Arc::clone(&self.layout),
            self.moved.clone(),
            self.unreadable.clone(),
            projection.cloned(),
            limit,
            state.config().target_partitions(),
            state.config().batch_size(),
        )?))
    }
}

/// The `debezium('path')` table function.
#[derive(Debug, Default)]
pub struct DebeziumFunction;

impl TableFunctionImpl for DebeziumFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let [Expr::Literal(ScalarValue::Utf8(Some(path)) | ScalarValue::Utf8View(Some(path)), _)] =
            args.exprs()
        else {
            return plan_err!(
                "debezium() takes one argument, a path as a string literal: debezium('folder/')"
            );
        };
        let runtime = args.session().runtime_env();
        let path = path.clone();
        // listing and sampling are I/O: on a thread of their own (a table
        // function is planned synchronously, maybe inside the session's
        // runtime)
        let table = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime_io = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| DataFusionError::External(Box::new(e)))?;
                    runtime_io.block_on(async {
                        let (store, files) = list_event_files(runtime, &path).await?;
                        let files = files.into_iter().map(EventFile::whole).collect();
                        DebeziumTable::open(&path, store, files, &[], None, None).await
                    })
                })
                .join()
                .map_err(|_| {
                    DataFusionError::Internal("debezium(): the reading thread panicked".into())
                })?
        })?;
        Ok(Arc::new(table))
    }
}
