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
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, HashMap, Result};
use datafusion::execution::cache::cache_manager::FileMetadataCache;
use datafusion::execution::session_state::SessionState;
use datafusion_common_runtime::SpawnedTask;
use deltalake_core::kernel::{Action, Add, LogicalFileView};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use roaring::RoaringTreemap;

use super::deletion_vectors::{probe_file, read_vectors, write_vectors, KeySet, ProbedFile};
use super::file_tail::Tail;
use super::plain_files::{PlainFilesTable, RowMask, TableLocation};
use super::probe_index::CachedIndex;
use super::stored_rows::{StoredRowsTable, SupersededFile};

/// Files probed at once, at least: a probe mostly waits for its one or two
/// reads (on an object store, tens of milliseconds each), and holds at most
/// a file's tail while it does.
pub const PROBES_IN_FLIGHT: usize = 16;

/// How an update probes data files for its keys.
#[derive(Clone)]
pub struct Probing {
    /// Files probed at once.
    pub concurrency: usize,
    /// The session's file metadata cache, where each file's metadata and key
    /// filters stay between updates ([`super::probe_index`]).
    pub cache: Arc<FileMetadataCache>,
}

impl Probing {
    /// Probing in `state`'s session: a file per target partition at once,
    /// and at least [`PROBES_IN_FLIGHT`].
    pub fn of(state: &SessionState) -> Self {
        Self {
            concurrency: state.config().target_partitions().max(PROBES_IN_FLIGHT),
            cache: state.runtime_env().cache_manager.get_file_metadata_cache(),
        }
    }
}

impl fmt::Debug for Probing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probing")
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

/// Bytes of small files an update keeps from probing them to read their
/// rows, at most (past them, files are read again).
const HELD_BYTES: usize = 32 << 20;

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
    /// Probe the data files `views` for the live rows whose key is in
    /// `keys`.
    pub async fn find(
        store: &Arc<dyn ObjectStore>,
        keys: Arc<KeySet>,
        views: Vec<LogicalFileView>,
        probing: &Probing,
    ) -> Result<Self> {
        // the files' deletion vectors first, read together (an update
        // writes the vectors of all the files it retires rows of to one file)
        let descriptors: Vec<_> = views
            .iter()
            .filter_map(|v| v.deletion_vector_descriptor())
            .collect();
        let mut vectors = read_vectors(store, &descriptors).await?.into_iter();
        let probes: Vec<(LogicalFileView, Option<RoaringTreemap>)> = views
            .into_iter()
            .map(|view| {
                let deleted = match view.deletion_vector_descriptor() {
                    Some(_) => vectors.next(),
                    None => None,
                };
                (view, deleted)
            })
            .collect();
        let mut held = 0usize;
        let files: Vec<SupersededFile> = futures::stream::iter(probes)
            .map(|(view, deleted)| {
                // (a task per file: decoding and probing keys is CPU work)
                let (store, keys) = (Arc::clone(store), Arc::clone(&keys));
                let cache = Arc::clone(&probing.cache);
                SpawnedTask::spawn(async move {
                    probe(&store, &keys, view, deleted, cache.as_ref()).await
                })
                .join()
            })
            .buffer_unordered(probing.concurrency.max(1))
            .map(|joined| joined.map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))?)
            .try_filter_map(|file| futures::future::ready(Ok(file)))
            .map_ok(|mut file| {
                // (files held whole for the read of their rows: a bounded amount)
                if let Some(tail) = &file.tail {
                    held += tail.len();
                    if held > HELD_BYTES {
                        file.tail = None;
                    }
                }
                file
            })
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

    /// The rows found as plain Parquet scans of their files, each file
    /// read for its found positions only (`autocdc.plain_parquet_reads`).
    pub fn plain_provider(&self, table: TableLocation<'_>) -> Result<Arc<dyn TableProvider>> {
        let files = self
            .files
            .iter()
            .map(|f| (f.view.clone(), RowMask::Selected(f.rows.clone())))
            .collect();
        Ok(Arc::new(PlainFilesTable::with_masks(table, files)?))
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
            // (the file keeps its tags: whether its rows are visible is what
            // the published table goes by, now and when a RESTORE adds it
            // back)
            #[allow(deprecated)]
            let tags = view.add_action().tags;
            actions.push(Action::Add(Add {
                path: view.path().to_string(),
                partition_values: view.partition_values_map(),
                size: view.size(),
                modification_time: view.modification_time(),
                data_change: true,
                stats: view.stats().map(|s| wide_bounds(&s)),
                tags,
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

/// The live rows of `view` (`deleted`: the rows its deletion vector marks)
/// whose key is in `keys`; `None` when it has none.
async fn probe(
    store: &Arc<dyn ObjectStore>,
    keys: &KeySet,
    view: LogicalFileView,
    deleted: Option<RoaringTreemap>,
    cache: &FileMetadataCache,
) -> Result<Option<SupersededFile>> {
    let path = view.object_store_path();
    let cached = CachedIndex::new(cache, &view);
    let ProbedFile {
        mut rows,
        metadata,
        tail,
    } = probe_file(store, &path, view.size().max(0) as u64, keys, Some(&cached)).await?;
    if let Some(deleted) = &deleted {
        rows -= deleted;
    }
    Ok((!rows.is_empty()).then_some(SupersededFile {
        view,
        metadata,
        // (a small file read whole: its rows are read from memory)
        tail: tail.filter(Tail::is_whole_file),
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
