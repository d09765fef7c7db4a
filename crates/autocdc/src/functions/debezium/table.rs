//! `debezium('path')`: the table function and its provider.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, DataFusionError, Result, ScalarValue};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use futures::TryStreamExt;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use super::decode::DebeziumLayout;
use super::exec::DebeziumExec;
use super::moved_keys::MovedKeys;
use crate::table::reject_sink::UnreadableLines;

/// How much of each of the first files the layout is inferred from.
const SAMPLE_BYTES: u64 = 1 << 20;
/// How many files the layout is inferred from.
const SAMPLE_FILES: usize = 4;

/// The event files under `path` (a file, or a folder: its `*.json` and
/// `*.jsonl` files at any depth), sorted by location, with the store that
/// holds them.
pub(crate) async fn list_event_files(
    runtime: &RuntimeEnv,
    path: &str,
) -> Result<(Arc<dyn ObjectStore>, Vec<ObjectMeta>)> {
    let url = ListingTableUrl::parse(path)?;
    let store = runtime.object_store(&url)?;
    let single = match url.is_folder() {
        true => None,
        false => store.head(url.prefix()).await.ok(),
    };
    let mut files: Vec<ObjectMeta> = match single {
        Some(meta) => vec![meta],
        None => store
            .list(Some(url.prefix()))
            .try_filter(|m| {
                let name = m.location.as_ref();
                futures::future::ready(name.ends_with(".json") || name.ends_with(".jsonl"))
            })
            .try_collect()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?,
    };
    files.sort_by(|a, b| a.location.cmp(&b.location));
    Ok((store, files))
}

/// Debezium change events in JSON files, one row per event (see
/// [`super::decode`]).
#[derive(Debug)]
pub(crate) struct DebeziumTable {
    store: Arc<dyn ObjectStore>,
    files: Vec<ObjectMeta>,
    layout: Arc<DebeziumLayout>,
    moved: Option<Arc<MovedKeys>>,
    unreadable: Option<Arc<UnreadableLines>>,
}

impl DebeziumTable {
    /// The events of `files`, laid out as their first files say
    /// (`sample`: files to infer from when `files` is empty, e.g. a flow's
    /// files already read). With `keys`, primary-key changes also yield
    /// the DELETE of the old key ([`super::moved_keys`]). With
    /// `unreadable`, malformed events are left out of the layout's samples
    /// and of the scan and kept there (for the rejects of a flow whose
    /// target takes them) instead of failing it.
    pub(crate) async fn open(
        path: &str,
        store: Arc<dyn ObjectStore>,
        files: Vec<ObjectMeta>,
        sample: &[ObjectMeta],
        keys: Option<&[String]>,
        unreadable: Option<Arc<UnreadableLines>>,
    ) -> Result<Self> {
        let from = if files.is_empty() { sample } else { &files };
        if from.is_empty() {
            return plan_err!("debezium('{path}'): no event files (*.json, *.jsonl) there");
        }
        let mut samples = Vec::new();
        for meta in from.iter().take(SAMPLE_FILES) {
            let end = meta.size.min(SAMPLE_BYTES);
            let bytes = store
                .get_range(&meta.location, 0..end)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            // whole lines only
            let bytes = match (end < meta.size, bytes.iter().rposition(|&b| b == b'\n')) {
                (true, Some(last)) => bytes.slice(..last + 1),
                _ => bytes,
            };
            let bytes: Vec<u8> = match unreadable {
                // (the scan reports them; the layout ignores them)
                Some(_) => json_objects_only(&bytes),
                None => bytes.to_vec(),
            };
            samples.push((meta.location.to_string(), bytes));
        }
        let refs: Vec<(&str, &[u8])> = samples
            .iter()
            .map(|(name, bytes)| (name.as_str(), bytes.as_ref()))
            .collect();
        let layout =
            DebeziumLayout::infer(&refs).map_err(|e| e.context(format!("debezium('{path}')")))?;
        let moved = match keys {
            Some(keys) => Some(Arc::new(MovedKeys::try_new(&layout.schema(), keys)?)),
            None => None,
        };
        Ok(Self {
            store,
            files,
            layout: Arc::new(layout),
            moved,
            unreadable,
        })
    }
}

/// The lines of `bytes` that are JSON objects (or tombstones).
fn json_objects_only(bytes: &[u8]) -> Vec<u8> {
    let mut kept = Vec::with_capacity(bytes.len());
    for line in bytes.split(|b| *b == b'\n') {
        let trimmed = line.trim_ascii();
        let object = trimmed.first() == Some(&b'{')
            && serde_json::from_slice::<serde::de::IgnoredAny>(trimmed).is_ok();
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
