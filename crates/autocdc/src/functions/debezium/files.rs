//! Event files: which files of `debezium('path')` there are, and which
//! part of each a flow reads (what was appended since it last read it, a
//! last line still being written left for later).

use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use futures::TryStreamExt;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

/// The event files under `path` (a file, or a folder: its `*.json` and
/// `*.jsonl` files at any depth), sorted by location, with the store that
/// holds them. Empty files hold no event and are left out (a file being
/// created, say: read once it has events).
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
    files.retain(|meta| meta.size > 0);
    files.sort_by(|a, b| a.location.cmp(&b.location));
    Ok((store, files))
}

/// The part of an event file to read: from byte `start` to the file's end
/// as `meta.size` says (a flow reads what was appended to a file since it
/// last read it, and leaves a last line still being written for later, see
/// [`readable_end`]).
#[derive(Debug, Clone)]
pub(crate) struct EventFile {
    /// The file, its `size` the end of the part.
    pub meta: ObjectMeta,
    /// Where the part begins (0: the whole file).
    pub start: u64,
}

impl EventFile {
    /// The whole file.
    pub(crate) fn whole(meta: ObjectMeta) -> Self {
        Self { meta, start: 0 }
    }

    /// How many bytes the part has.
    pub(crate) fn len(&self) -> u64 {
        self.meta.size.saturating_sub(self.start)
    }
}

/// Where the readable events of `meta` end, reading on from `start` (what
/// was read before): after its last line end, or at its end when what
/// follows that line end is blank or a whole JSON value. A last line that
/// is neither is still being written (a sink appending to the file, or a
/// file listed while it is written) and is read once it is whole.
pub(crate) async fn readable_end(
    store: &Arc<dyn ObjectStore>,
    meta: &ObjectMeta,
    start: u64,
) -> Result<u64> {
    /// How much of the end is read first to find the last line end.
    const WINDOW: u64 = 8 << 10;
    let whole = |tail: &[u8]| {
        let tail = tail.trim_ascii();
        tail.is_empty() || serde_json::from_slice::<serde_json::Value>(tail).is_ok()
    };
    let mut from = meta.size.saturating_sub(WINDOW).max(start);
    loop {
        let bytes = store
            .get_range(&meta.location, from..meta.size)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        match memchr::memrchr(b'\n', &bytes) {
            Some(last) if whole(&bytes[last + 1..]) => return Ok(meta.size),
            Some(last) => return Ok(from + last as u64 + 1),
            None if from == start => return Ok(if whole(&bytes) { meta.size } else { start }),
            // a last line longer than the window: read it from where the
            // part begins
            None => from = start,
        }
    }
}
