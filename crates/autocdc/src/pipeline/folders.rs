//! File folders as incremental sources: the files of a listing table
//! (`CREATE EXTERNAL TABLE … LOCATION 'dir/'`) that a flow or a stream has
//! not read yet, listed from the store itself (the session's listing cache
//! may not know files written since it was filled).

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::execution::session_state::SessionState;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;

use crate::fold::columns::all_nullable;

/// The files of a folder (a listing table) not read yet.
pub(crate) struct NewFiles {
    /// A scan of the new files alone (no rows when there are none).
    pub(crate) provider: Arc<dyn TableProvider>,
    /// Every file read once this update is done: those read before and
    /// the new ones (the checkpoint to commit).
    pub(crate) read: BTreeSet<String>,
    /// The newest new file's modification time (ms; `None`: nothing new).
    pub(crate) newest_ms: Option<i64>,
}

/// The files of `listing` that are not in `read`, as a table of their own.
/// Every column of it is nullable: the folder's schema was inferred from
/// one file, and a newer file may hold NULLs where that one had none.
///
/// A file read once stays read, also if it leaves the folder for a while
/// (moved away and back: not read again). An empty file is not read yet:
/// its writer has created it and may not have written it (a Parquet file
/// is written whole, and read once it has bytes).
pub(crate) async fn new_files(
    state: &SessionState,
    listing: &ListingTable,
    read: &BTreeSet<String>,
) -> Result<NewFiles> {
    let (files, empty) = list_files(state, listing).await?;
    let new: Vec<&(String, ListingTableUrl, i64)> = files
        .iter()
        .filter(|(location, _, _)| !read.contains(location))
        .filter(|(location, _, _)| !empty.contains(location))
        .collect();
    let newest_ms = new.iter().map(|(_, _, modified)| *modified).max();
    let schema = all_nullable(listing.schema().as_ref());
    // the files are named explicitly, also for a whole read: the session's
    // listing cache may miss files written since it was filled
    let provider: Arc<dyn TableProvider> = if new.is_empty() {
        Arc::new(EmptyTable::new(schema))
    } else {
        let config = ListingTableConfig::new_with_multi_paths(
            new.iter().map(|(_, url, _)| url.clone()).collect(),
        )
        .with_listing_options(listing.options().clone())
        .with_schema(schema);
        Arc::new(ListingTable::try_new(config)?)
    };
    let mut now_read = read.clone();
    now_read.extend(new.into_iter().map(|(location, _, _)| location.clone()));
    Ok(NewFiles {
        provider,
        read: now_read,
        newest_ms,
    })
}

/// The data files of `listing` (location, URL, modification time in ms),
/// and the locations of those that are empty.
pub(super) async fn list_files(
    state: &SessionState,
    listing: &ListingTable,
) -> Result<(Vec<(String, ListingTableUrl, i64)>, BTreeSet<String>)> {
    let extension = listing.options().file_extension.clone();
    // (as the table's own scans: files in sub-folders, a job's
    // `_temporary/` say, are not the table's unless the session says so)
    let ignore_subdirectory = state
        .config_options()
        .execution
        .listing_table_ignore_subdirectory;
    let mut out = Vec::new();
    let mut empty = BTreeSet::new();
    for url in listing.table_paths() {
        let store = state.runtime_env().object_store(url)?;
        // list the store itself: the session's listing cache may not know
        // files written since the table was first read
        // a table over one file; otherwise a folder or a glob under a prefix
        let single = match url.is_folder() {
            true => None,
            false => store.head(url.prefix()).await.ok(),
        };
        let metas: Vec<_> = match single {
            Some(meta) => vec![meta],
            None => {
                let listed: Vec<_> = store
                    .list(Some(url.prefix()))
                    .try_collect()
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                listed
                    .into_iter()
                    .filter(|m| {
                        url.contains(&m.location, ignore_subdirectory)
                            && m.location.as_ref().ends_with(&extension)
                    })
                    .collect()
            }
        };
        for meta in metas {
            if meta.size == 0 {
                empty.insert(meta.location.to_string());
            }
            // the URL's path is decoded once to find the location: its `%`,
            // `?` and `#` (which would end a URL's path) and `\` (a `/` to
            // a URL) encoded
            let base = url.object_store();
            let path = meta
                .location
                .as_ref()
                .replace('%', "%25")
                .replace('?', "%3F")
                .replace('#', "%23")
                .replace('\\', "%5C");
            let file = ListingTableUrl::parse(format!("{}{path}", base.as_str()))?;
            out.push((
                meta.location.to_string(),
                file,
                meta.last_modified.timestamp_millis(),
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    Ok((out, empty))
}
