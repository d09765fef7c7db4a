//! File folders as incremental sources: the files of a listing table
//! (`CREATE EXTERNAL TABLE … LOCATION 'dir/'`) that a flow or a stream has
//! not read yet, listed from the store itself (the session's listing cache
//! may not know files written since it was filled).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::datasource::provider::DefaultTableFactory;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::CreateExternalTable;
use futures::TryStreamExt;
use object_store::{ObjectMeta, ObjectStoreExt};

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
    let new: Vec<&FolderFile> = files
        .iter()
        .filter(|file| !read.contains(&file.location))
        .filter(|file| !empty.contains(&file.location))
        .collect();
    let newest_ms = new.iter().map(|file| file.modified_ms()).max();
    // the files are named explicitly, also for a whole read: the session's
    // listing cache may miss files written since it was filled
    let provider: Arc<dyn TableProvider> = if new.is_empty() {
        Arc::new(EmptyTable::new(all_nullable(listing.schema().as_ref())))
    } else {
        let schema = schema_of(state, listing, &new).await?;
        let config = ListingTableConfig::new_with_multi_paths(
            new.iter().map(|file| file.url.clone()).collect(),
        )
        .with_listing_options(listing.options().clone())
        .with_schema(schema);
        Arc::new(ListingTable::try_new(config)?)
    };
    let mut now_read = read.clone();
    now_read.extend(new.into_iter().map(|file| file.location.clone()));
    Ok(NewFiles {
        provider,
        read: now_read,
        newest_ms,
    })
}

/// The schema the new files `new` of `listing` are read with: the folder's
/// (every column nullable), then the columns the new files add, after it —
/// as a read of the whole folder now would infer it. The folder's schema
/// was inferred when the table was declared: a long-lived session (a
/// continuous pipeline) would otherwise drop a column first seen in a
/// later file. The folder's own columns keep their types (a new file's
/// values are cast to them, as its scans cast them).
///
/// A new column takes its type in the new files read together (as the
/// format infers several files: a JSON column holding integers and
/// fractions is a double); where they cannot be (one holds a column of the
/// folder in another type), file by file: the first file's type, or a
/// later one's that widens it, and files that hold it in types of other
/// kinds fail the update, naming them. A folder declared with its columns
/// keeps them, and so does a CSV folder (read by position: a column added
/// before others would shift their values).
async fn schema_of(
    state: &SessionState,
    listing: &ListingTable,
    new: &[&FolderFile],
) -> Result<SchemaRef> {
    let declared = all_nullable(listing.schema().as_ref());
    let format = &listing.options().format;
    if declares_columns(state, listing) || format.get_ext().eq_ignore_ascii_case("csv") {
        return Ok(declared);
    }
    let mut fields: Vec<Field> = declared
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let known = fields.len();
    let together = match infer(state, listing, new).await {
        Ok(schema) => Some(vec![(None, schema)]),
        Err(_) => None,
    };
    let found = match together {
        Some(found) => found,
        None => {
            let mut found = Vec::new();
            for &file in new {
                // (a file that cannot be read adds nothing: its scan fails,
                // naming it)
                if let Ok(schema) = infer(state, listing, &[file]).await {
                    found.push((Some(file.location.as_str()), schema));
                }
            }
            found
        }
    };
    let mut first_in: Vec<Option<&str>> = Vec::new();
    for (file, schema) in &found {
        for field in schema.fields() {
            let Some(at) = fields.iter().position(|f| f.name() == field.name()) else {
                fields.push(field.as_ref().clone().with_nullable(true));
                first_in.push(*file);
                continue;
            };
            let Some(added) = at.checked_sub(known) else {
                continue;
            };
            let had = fields[at].data_type().clone();
            if had == *field.data_type() || widens(field.data_type(), &had) {
                continue;
            }
            if widens(&had, field.data_type()) {
                fields[at].set_data_type(field.data_type().clone());
                continue;
            }
            return Err(DataFusionError::Plan(format!(
                "folder '{}': the new files '{}' and '{}' hold the column '{}', which the \
                 folder's earlier files lack, as {had} and {}: a column files add must have \
                 one type (or a wider one of its kind) in all of them; nothing was read",
                listing.table_paths().first().map_or("", |url| url.as_str()),
                first_in[added].unwrap_or("?"),
                file.unwrap_or("?"),
                field.name(),
                field.data_type()
            )));
        }
    }
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        declared.metadata().clone(),
    )))
}

/// The schema `listing`'s format infers from `files` read together.
async fn infer(
    state: &SessionState,
    listing: &ListingTable,
    files: &[&FolderFile],
) -> Result<SchemaRef> {
    let mut by_store: BTreeMap<String, (&ListingTableUrl, Vec<ObjectMeta>)> = BTreeMap::new();
    for file in files {
        by_store
            .entry(file.url.object_store().as_str().to_string())
            .or_insert_with(|| (&file.url, Vec::new()))
            .1
            .push(file.meta.clone());
    }
    let mut schemas = Vec::new();
    for (url, metas) in by_store.into_values() {
        let store = state.runtime_env().object_store(url)?;
        let schema = listing
            .options()
            .format
            .infer_schema(state, &store, &metas)
            .await?;
        schemas.push(schema.as_ref().clone());
    }
    Ok(Arc::new(Schema::try_merge(schemas)?))
}

/// The tables a session's `CREATE EXTERNAL TABLE t (id INT, …) STORED AS …`
/// declared with their columns (a session configuration extension, filled
/// by [`FolderTableFactory`]): their files are read in the columns declared.
/// (DataFusion keeps no trace of it: its definition text of such a table
/// leaves the columns out.)
#[derive(Debug, Default)]
pub(crate) struct DeclaredColumns(Mutex<Vec<Weak<dyn TableProvider>>>);

impl DeclaredColumns {
    /// Whether `listing` is one of them (held weakly: a dropped table's
    /// allocation stays until this list forgets it, so its address cannot
    /// stand for another table).
    fn hold(&self, listing: &ListingTable) -> bool {
        let mut tables = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        tables.retain(|table| table.strong_count() > 0);
        tables
            .iter()
            .any(|table| std::ptr::addr_eq(table.as_ptr(), listing as *const ListingTable))
    }
}

/// DataFusion's factory of `CREATE EXTERNAL TABLE … STORED AS PARQUET`
/// (CSV, JSON, …) tables, noting those declared with their columns in the
/// session's [`DeclaredColumns`].
#[derive(Debug, Default)]
pub(crate) struct FolderTableFactory(DefaultTableFactory);

#[async_trait]
impl TableProviderFactory for FolderTableFactory {
    async fn create(
        &self,
        state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> Result<Arc<dyn TableProvider>> {
        let table = self.0.create(state, cmd).await?;
        if !cmd.schema.fields().is_empty() {
            if let Some(declared) = state.config().get_extension::<DeclaredColumns>() {
                declared
                    .0
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push(Arc::downgrade(&table));
            }
        }
        Ok(table)
    }
}

/// Whether `listing` was declared with its columns, not inferred from its
/// files.
fn declares_columns(state: &SessionState, listing: &ListingTable) -> bool {
    state
        .config()
        .get_extension::<DeclaredColumns>()
        .is_some_and(|declared| declared.hold(listing))
}

/// Whether values of type `from` all fit `to`, a wider type of their kind.
fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let rank = |t: &DataType| match t {
        Int8 | UInt8 | Float16 => 1,
        Int16 | UInt16 | Float32 => 2,
        Int32 | UInt32 | Float64 => 3,
        Int64 | UInt64 => 4,
        _ => 0,
    };
    match (from, to) {
        (Int8 | Int16 | Int32, Int16 | Int32 | Int64)
        | (UInt8 | UInt16 | UInt32, UInt16 | UInt32 | UInt64)
        | (Float16 | Float32, Float32 | Float64) => rank(from) < rank(to),
        (Decimal128(p, s), Decimal128(to_p, to_s)) => {
            to_s >= s && (*to_p as i16 - *to_s as i16) >= (*p as i16 - *s as i16)
        }
        _ => false,
    }
}

/// A data file of a folder.
pub(super) struct FolderFile {
    /// Its location in its store (what a checkpoint keeps).
    pub(super) location: String,
    /// Its URL, to scan it alone.
    pub(super) url: ListingTableUrl,
    /// What its store listed of it.
    meta: ObjectMeta,
}

impl FolderFile {
    /// Its modification time, in ms.
    pub(super) fn modified_ms(&self) -> i64 {
        self.meta.last_modified.timestamp_millis()
    }
}

/// The data files of `listing`, by location, and the locations of those
/// that are empty.
pub(super) async fn list_files(
    state: &SessionState,
    listing: &ListingTable,
) -> Result<(Vec<FolderFile>, BTreeSet<String>)> {
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
            let url = ListingTableUrl::parse(format!("{}{path}", base.as_str()))?;
            out.push(FolderFile {
                location: meta.location.to_string(),
                url,
                meta,
            });
        }
    }
    out.sort_by(|a, b| a.location.cmp(&b.location));
    out.dedup_by(|a, b| a.location == b.location);
    Ok((out, empty))
}
