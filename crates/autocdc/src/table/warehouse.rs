//! The warehouse: where streaming tables live (`<warehouse>/<schema>/<table>`,
//! each a Delta table) and the one object store they all share.
//!
//! deltalake builds a fresh, empty store for every `memory://` URL it parses,
//! so the warehouse owns a single store and hands it to every table through
//! `with_storage_backend`. That store keeps the Delta commit files and
//! deletion vectors it wrote or read, and answers the listing of a log
//! after this process's commit to it ([`LogCachingStore`]).

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Schema};
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result};
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake_core::kernel::transaction::CommitProperties;
use deltalake_core::kernel::{Action, StructType};
use deltalake_core::DeltaTableBuilder;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use url::Url;

use super::bucket::BUCKET_COL;
use super::foreign::ForeignDelta;
use super::log_cache::LogCachingStore;
use super::published::{PublishedLocation, STATE_FOLDER, STATE_TABLE};
use super::{delta_err, streaming_protocol};
use crate::fold::columns::KIND_COL;

/// Schema used for unqualified streaming table names.
pub const DEFAULT_SCHEMA: &str = "public";

/// A normalised `schema.table` name.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct TableName {
    /// Schema (folder) name.
    pub schema: String,
    /// Table name.
    pub table: String,
}

/// What a `<schema>/<table>` folder of a warehouse holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Folder {
    /// No Delta table.
    Empty,
    /// A streaming table: its state store under `_autocdc/state`.
    Streaming,
    /// A streaming table of the earlier layout: its state store is the
    /// Delta table at the folder (our columns, partitioned by bucket).
    Legacy,
    /// A Delta table another tool wrote.
    Foreign,
}

/// Characters a table's location may not hold: Delta readers (ours and
/// deltalake's) take a `%` for an escape (`p%20x` read as `p x`) and a `\`
/// for a `/`, and deltalake's change feed fails on the others (it builds a
/// URL whose host holds the path).
pub const REFUSED_IN_PATHS: [char; 6] = ['%', '\\', '[', ']', '^', '|'];

/// The first of [`REFUSED_IN_PATHS`] in `path`, if any.
pub fn refused_in_path(path: &str) -> Option<char> {
    path.chars().find(|c| REFUSED_IN_PATHS.contains(c))
}

/// Error for a warehouse folder whose path holds one of [`REFUSED_IN_PATHS`].
fn refuse_path(path: &std::path::Path) -> Result<()> {
    match refused_in_path(&path.to_string_lossy()) {
        Some(c) => Err(DataFusionError::Plan(format!(
            "warehouse folder '{}' has a '{c}' in its path, which Delta readers take for \
             something else or fail on: choose a folder without any of {}",
            path.display(),
            REFUSED_IN_PATHS
                .iter()
                .map(|c| format!("'{c}'"))
                .collect::<Vec<_>>()
                .join(" ")
        ))),
        None => Ok(()),
    }
}

impl TableName {
    /// Build from normalised name parts (`[table]`, `[schema, table]` or
    /// `[catalog, schema, table]`).
    pub fn from_parts(parts: &[String]) -> Result<Self> {
        // names become folders of the warehouse: they must never leave it
        for part in parts {
            // a dot inside a part would make `a.b` and `"a.b"` one name
            let bad = part.is_empty()
                || part.chars().any(|c| {
                    c == '/' || c == '.' || REFUSED_IN_PATHS.contains(&c) || c.is_control()
                });
            if bad {
                return Err(DataFusionError::Plan(format!(
                    "invalid streaming table name '{}': name parts must be non-empty and contain no '.', '/', control characters or any of {} (Delta readers take a '%' in a folder's name for an escape, a '\\' for a '/', and fail on the others)",
                    parts.join("."),
                    REFUSED_IN_PATHS.iter().map(|c| format!("'{c}'")).collect::<Vec<_>>().join(" ")
                )));
            }
        }
        match parts {
            [table] => Ok(Self {
                schema: DEFAULT_SCHEMA.to_string(),
                table: table.clone(),
            }),
            [schema, table] | [_, schema, table] => Ok(Self {
                schema: schema.clone(),
                table: table.clone(),
            }),
            _ => Err(DataFusionError::Plan(format!(
                "invalid streaming table name '{}'",
                parts.join(".")
            ))),
        }
    }

    /// Parse a dotted, already normalised name.
    pub fn parse(name: &str) -> Result<Self> {
        let parts: Vec<String> = name.split('.').map(str::to_string).collect();
        Self::from_parts(&parts)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.schema == DEFAULT_SCHEMA {
            write!(f, "{}", self.table)
        } else {
            write!(f, "{}.{}", self.schema, self.table)
        }
    }
}

/// The storage root of all streaming tables of a session.
#[derive(Debug)]
pub struct Warehouse {
    root: Url,
    store: Arc<dyn ObjectStore>,
}

impl Warehouse {
    /// Open a warehouse: `memory://` (a fresh in-memory store), `file:///abs/path`,
    /// or a local folder path (created if missing).
    pub fn open(location: &str) -> Result<Self> {
        if location.starts_with("memory://") {
            return Ok(Self {
                root: Url::parse("memory:///")
                    .map_err(|e| DataFusionError::External(Box::new(e)))?,
                store: Arc::new(LogCachingStore::new(Arc::new(InMemory::new()))),
            });
        }
        // (`file:relwh`, no `//`, would be read as `/relwh`)
        if location.starts_with("file:") && !location.starts_with("file://") {
            return Err(DataFusionError::Plan(format!(
                "warehouse '{location}' is not a local file URL: write \
                 file:///absolute/path (or the folder's path)"
            )));
        }
        let path = match location.starts_with("file:") {
            // (a URL: `file:///abs`, `file://localhost/abs`, `%20` for a space)
            true => Url::parse(location)
                .ok()
                .and_then(|url| url.to_file_path().ok())
                .ok_or_else(|| {
                    DataFusionError::Plan(format!(
                        "warehouse '{location}' is not a local file URL: write \
                         file:///absolute/path (or the folder's path)"
                    ))
                })?,
            false if location.contains("://") => {
                return Err(DataFusionError::NotImplemented(format!(
                    "warehouse '{location}': only local folders, file:// and memory:// are supported by this build"
                )))
            }
            false => std::path::PathBuf::from(location),
        };
        // (checked on the absolute path before anything is created)
        let absolute = std::path::absolute(&path).unwrap_or_else(|_| path.clone());
        refuse_path(&absolute)?;
        if path.exists() && !path.is_dir() {
            return Err(DataFusionError::Execution(format!(
                "warehouse '{}' is a file, not a folder",
                path.display()
            )));
        }
        std::fs::create_dir_all(&path).map_err(|e| {
            DataFusionError::Execution(format!(
                "cannot create warehouse folder '{}': {e}",
                path.display()
            ))
        })?;
        let abs = path.canonicalize().map_err(|e| {
            DataFusionError::Execution(format!("warehouse folder '{}': {e}", path.display()))
        })?;
        refuse_path(&abs)?;
        let root = Url::from_directory_path(&abs).map_err(|_| {
            DataFusionError::Execution(format!(
                "warehouse folder '{}' is not a valid path",
                abs.display()
            ))
        })?;
        Ok(Self {
            root,
            store: Arc::new(LogCachingStore::new(Arc::new(LocalFileSystem::new()))),
        })
    }

    /// A `memory://` warehouse on a given object store (tests: several
    /// sessions, or a fault-injecting store, on one in-memory warehouse).
    pub fn in_memory_on(store: Arc<dyn ObjectStore>) -> Result<Self> {
        Ok(Self {
            root: Url::parse("memory:///").map_err(|e| DataFusionError::External(Box::new(e)))?,
            store: Arc::new(LogCachingStore::new(store)),
        })
    }

    /// Root URL of the warehouse.
    pub fn root(&self) -> &Url {
        &self.root
    }

    /// The shared object store (rooted at `/` of the URL scheme).
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store)
    }

    /// URL of a table's folder.
    /// Name parts are pushed as percent-encoded path segments, never parsed
    /// as URL syntax: `%2e%2e`, `file:`, `?` and `#` stay literal folder names.
    pub fn table_url(&self, name: &TableName) -> Result<Url> {
        let mut url = self.root.clone();
        url.path_segments_mut()
            .map_err(|()| {
                DataFusionError::Plan(format!(
                    "warehouse location '{}' cannot hold tables",
                    self.root
                ))
            })?
            .pop_if_empty()
            .extend([name.schema.as_str(), name.table.as_str(), ""]);
        Ok(url)
    }

    /// URL of a table's state store: the Delta table under
    /// `<table>/_autocdc/state/` that holds everything a flow keeps (see
    /// [`super::published`]).
    pub fn state_url(&self, name: &TableName) -> Result<Url> {
        let mut url = self.table_url(name)?;
        let location = url.to_string();
        url.path_segments_mut()
            .map_err(|()| DataFusionError::Internal(format!("table location '{location}'")))?
            .pop_if_empty()
            .extend([STATE_FOLDER, STATE_TABLE, ""]);
        Ok(url)
    }

    /// Create the state store of a new streaming table `name`: `schema`
    /// (user columns, `__cdc_kind`, the bucket), partitioned by bucket, with
    /// the streaming protocol, the table properties `config` and the
    /// description `comment`.
    pub(crate) async fn create_state_store(
        &self,
        name: &TableName,
        schema: Schema,
        config: Vec<(String, Option<String>)>,
        deletion_vectors: bool,
        comment: Option<&str>,
    ) -> Result<()> {
        let kernel: StructType = (&schema).try_into_kernel().map_err(delta_err)?;
        let mut create = self
            .delta_builder(name)?
            .build()
            .map_err(delta_err)?
            .create();
        if let Some(comment) = comment {
            create = create.with_comment(comment);
        }
        let created = create
            .with_table_name(name.table.clone())
            .with_columns(kernel.fields().cloned())
            .with_partition_columns([BUCKET_COL])
            .with_actions([Action::Protocol(streaming_protocol(deletion_vectors)?)])
            .with_configuration(config)
            .with_raise_if_key_not_exists(false)
            // (a table another process creates meanwhile fails this one,
            // rather than being replaced by it)
            .with_commit_properties(CommitProperties::default().with_max_retries(0))
            .await;
        created.map(|_| ()).map_err(delta_err)
    }

    /// A Delta table builder for the state store of `name`, on the shared store.
    pub fn delta_builder(&self, name: &TableName) -> Result<DeltaTableBuilder> {
        self.builder_at(self.state_url(name)?)
    }

    /// Where the published table of `name` lives (the table's own folder).
    pub fn published_location(&self, name: &TableName) -> Result<PublishedLocation> {
        Ok(PublishedLocation::new(self.table_url(name)?, self.store()))
    }

    fn builder_at(&self, url: Url) -> Result<DeltaTableBuilder> {
        super::table_builder(url, self.store())
    }

    fn prefix(&self, url: &Url) -> Result<Path> {
        Path::from_url_path(url.path()).map_err(|e| DataFusionError::External(Box::new(e)))
    }

    /// Whether a streaming table exists at `name` (its state store, or a
    /// table of the earlier layout, see [`Self::is_legacy`]).
    pub async fn exists(&self, name: &TableName) -> Result<bool> {
        Ok(matches!(
            self.folder(name).await?,
            Folder::Streaming | Folder::Legacy
        ))
    }

    /// Whether the Delta table at `name`'s folder was written by another
    /// tool (see [`Folder::Foreign`]). Such a table is read as the Delta
    /// table it is ([`Self::foreign_provider`]), never written.
    pub async fn is_foreign(&self, name: &TableName) -> Result<bool> {
        Ok(self.folder(name).await? == Folder::Foreign)
    }

    /// What the folder of `name` holds.
    async fn folder(&self, name: &TableName) -> Result<Folder> {
        if self.has_log(&self.state_url(name)?).await? {
            return Ok(Folder::Streaming);
        }
        if !self.has_log(&self.table_url(name)?).await? {
            return Ok(Folder::Empty);
        }
        let table = self.legacy_builder(name)?.load().await.map_err(delta_err)?;
        let snapshot = table.snapshot().map_err(delta_err)?;
        // (ours is partitioned by bucket, and has every bookkeeping column
        // of its type; a table of another tool may have a column of one of
        // those names)
        let schema = snapshot.snapshot().arrow_schema();
        let ours = |column: &str, data_type: &DataType| {
            schema
                .field_with_name(column)
                .is_ok_and(|f| f.data_type() == data_type)
        };
        let legacy = snapshot.metadata().partition_columns() == [BUCKET_COL.to_string()]
            && ours(KIND_COL, &DataType::Int8)
            && ours(BUCKET_COL, &DataType::Int32);
        Ok(if legacy {
            Folder::Legacy
        } else {
            Folder::Foreign
        })
    }

    /// A foreign Delta table in the warehouse ([`Self::is_foreign`]) as a
    /// read-only table: its latest version, read by deltalake.
    pub async fn foreign_provider(&self, name: &TableName) -> Result<Arc<dyn TableProvider>> {
        let table = self.legacy_builder(name)?.load().await.map_err(delta_err)?;
        Ok(Arc::new(ForeignDelta::new(name.to_string(), table).await?))
    }

    /// Whether `name` is a table of the earlier layout, written before
    /// tables had a published table: its state store is the Delta table at
    /// its own folder. Such tables are read and updated as before, without
    /// a published table (`REFRESH ... FULL` does not change the layout;
    /// drop and re-create the table for the current one).
    pub async fn is_legacy(&self, name: &TableName) -> Result<bool> {
        Ok(self.folder(name).await? == Folder::Legacy)
    }

    /// A Delta table builder for a table of the earlier layout.
    pub fn legacy_builder(&self, name: &TableName) -> Result<DeltaTableBuilder> {
        self.builder_at(self.table_url(name)?)
    }

    async fn has_log(&self, table: &Url) -> Result<bool> {
        let log = self.prefix(table)?.clone().join("_delta_log");
        let mut listing = self.store.list(Some(&log));
        Ok(listing
            .try_next()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?
            .is_some())
    }

    /// Every streaming table stored in the warehouse.
    pub async fn list_tables(&self) -> Result<Vec<TableName>> {
        self.list_folders(&[Folder::Streaming, Folder::Legacy])
            .await
    }

    /// Every Delta table another tool wrote into the warehouse's folders
    /// ([`Self::is_foreign`]).
    pub async fn list_foreign_tables(&self) -> Result<Vec<TableName>> {
        self.list_folders(&[Folder::Foreign]).await
    }

    /// The `<schema>/<table>` folders holding one of `kinds`, sorted.
    async fn list_folders(&self, kinds: &[Folder]) -> Result<Vec<TableName>> {
        let root = self.prefix(&self.root)?;
        let mut names = Vec::new();
        let schemas = self
            .store
            .list_with_delimiter(Some(&root))
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        for schema in schemas.common_prefixes {
            let Some(schema_name) = schema.filename().map(str::to_string) else {
                continue;
            };
            // (a folder made by hand whose name Delta readers would take for
            // another's: never read)
            if let Some(c) = refused_in_path(&schema_name) {
                log::warn!("warehouse folder '{schema_name}' is not read: it holds a '{c}'");
                continue;
            }
            // (a folder that cannot be listed — another user's, such as a
            // volume's `lost+found` — holds no table this session can read;
            // it does not close the warehouse)
            let tables = match self.store.list_with_delimiter(Some(&schema)).await {
                Ok(tables) => tables,
                Err(e) => {
                    log::warn!("warehouse folder '{schema_name}' cannot be listed: {e}");
                    continue;
                }
            };
            for table in tables.common_prefixes {
                let Some(table_name) = table.filename().map(str::to_string) else {
                    continue;
                };
                if let Some(c) = refused_in_path(&table_name) {
                    log::warn!(
                        "warehouse folder '{schema_name}/{table_name}' is not read: it holds a '{c}'"
                    );
                    continue;
                }
                let name = TableName {
                    schema: schema_name.clone(),
                    table: table_name,
                };
                match self.folder(&name).await {
                    Ok(kind) if kinds.contains(&kind) => names.push(name),
                    Ok(_) => {}
                    // a folder that cannot be looked into (its permissions,
                    // say) does not close the warehouse: a streaming table
                    // that cannot be opened, whose opening says why
                    Err(e) if kinds.contains(&Folder::Streaming) => {
                        log::debug!("table folder '{name}' cannot be looked into: {e}");
                        names.push(name);
                    }
                    Err(_) => {}
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// Delete every object of a table.
    pub async fn delete_table(&self, name: &TableName) -> Result<()> {
        let prefix = self.prefix(&self.table_url(name)?)?;
        let paths: Vec<Path> = self
            .store
            .list(Some(&prefix))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        for p in paths {
            self.store
                .delete(&p)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
        // (a local store deletes files, not the folders that held them: the
        // table's folder goes too, with what is left of it empty)
        if let Ok(folder) = self.table_url(name)?.to_file_path() {
            remove_empty_folders(&folder);
        }
        Ok(())
    }
}

/// Remove `folder` and the folders under it that are empty once their
/// empty sub-folders are gone; a folder holding a file stays (another
/// process writing there, say).
fn remove_empty_folders(folder: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(folder) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_folders(&entry.path());
            }
        }
    }
    // (fails, and so keeps it, unless it is empty)
    let _ = std::fs::remove_dir(folder);
}
