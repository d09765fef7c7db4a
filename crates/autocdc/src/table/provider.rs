//! `ScdTable`: the `TableProvider` of a streaming table.
//!
//! It scans the table's Delta data, keeps live rows only (tombstones and the
//! truncate watermark row are filtered out) and hides the `__cdc_*`
//! bookkeeping columns. Projections and filters are pushed into the Delta
//! scan by planning the read as an ordinary DataFusion plan.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, RwLock, Weak};

use arrow::datatypes::{Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{Column, DataFusionError, Result};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::expr_rewriter::unnormalize_col;
use datafusion::logical_expr::{
    cast, col, lit, Expr, LogicalPlanBuilder, TableProviderFilterPushDown, TableType,
};
use datafusion::physical_plan::ExecutionPlan;
use deltalake_core::table::state::DeltaTableState;
use deltalake_core::DeltaTable;
use object_store::{ObjectMeta, ObjectStoreExt};

use super::commit_times::{commit_file_time, commit_file_times, version_at};
use super::delta_err;
use super::files::data_files;
use super::known_runs::KnownRuns;
use super::meta::TableMeta;
use super::plain_files::{PlainFilesTable, TableLocation};
use super::published::{publish, PublishedLocation};
use super::warehouse::{TableName, Warehouse};
use crate::fold::columns::{Kind, INTERNAL_PREFIX, KIND_COL};

#[derive(Debug, Clone)]
struct Loaded {
    table: DeltaTable,
    meta: TableMeta,
    raw: Arc<dyn TableProvider>,
    schema: SchemaRef,
}

/// DML on a streaming table (`INSERT`, `DELETE`, `UPDATE`).
///
/// Storage reads a table but does not plan updates of it: DML is an update,
/// planned by the update pipeline, which sits above storage. The session
/// hands its implementation to every table it registers
/// ([`ScdTable::into_shared`]); a table without one (time travel) is
/// read-only.
#[async_trait]
pub trait TargetDml: Send + Sync + fmt::Debug {
    /// `INSERT INTO table ...` of the rows of `input`.
    async fn insert(
        &self,
        table: Arc<ScdTable>,
        state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>>;
    /// `DELETE FROM table [WHERE filters]`.
    async fn delete(
        &self,
        table: Arc<ScdTable>,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>>;
    /// `UPDATE table SET assignments [WHERE filters]`.
    async fn update(
        &self,
        table: Arc<ScdTable>,
        state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>>;
}

/// A streaming table: live rows of an AUTO CDC target.
#[derive(Debug)]
pub struct ScdTable {
    name: TableName,
    loaded: RwLock<Loaded>,
    /// The `Arc` this table lives in (DML statements outlive the call).
    this: Weak<ScdTable>,
    /// How DML on it is planned (`None`: read-only).
    dml: Option<Arc<dyn TargetDml>>,
    /// Where its published table lives (`None`: an old version of the
    /// table, or a table of the earlier layout without one).
    published: Option<PublishedLocation>,
    /// The flows' last runs at the loaded version, once looked up or
    /// committed here.
    runs: KnownRuns,
    /// The versions of the last commits made here (at most
    /// [`MADE_REMEMBERED`]), to tell them from other writers'.
    made: Mutex<VecDeque<u64>>,
    /// The commit file of the loaded version as last seen (see
    /// [`Self::refresh`]).
    tip: Mutex<Option<(u64, ObjectMeta)>>,
}

/// The commit file of `version` in `table`'s log, as the store has it.
async fn commit_file(table: &DeltaTable, version: u64) -> object_store::Result<ObjectMeta> {
    let log_store = table.log_store();
    let path = log_store
        .log_path()
        .clone()
        .join(format!("{version:020}.json"));
    log_store.object_store(None).head(&path).await
}

/// How many of a table's last commits made here it remembers.
const MADE_REMEMBERED: usize = 1024;

impl ScdTable {
    /// Load the latest version of a streaming table.
    pub async fn load(warehouse: &Warehouse, name: TableName) -> Result<Self> {
        let legacy = warehouse.is_legacy(&name).await?;
        let builder = if legacy {
            warehouse.legacy_builder(&name)?
        } else {
            warehouse.delta_builder(&name)?
        };
        let table = builder.load().await.map_err(delta_err)?;
        let loaded = Self::loaded(table).await?;
        let this = Self {
            published: if legacy {
                None
            } else {
                Some(warehouse.published_location(&name)?)
            },
            name,
            loaded: RwLock::new(loaded),
            this: Weak::new(),
            dml: None,
            runs: KnownRuns::default(),
            made: Mutex::default(),
            tip: Mutex::default(),
        };
        // (the loaded version's commit file, to know it again: `refresh`)
        let table = this.delta();
        if let Some(version) = table.version() {
            if let Ok(file) = commit_file(&table, version).await {
                this.same_tip(version, file);
            }
        }
        // a table another Delta writer wrote to is refused (see
        // `check_own`)
        this.check_published().await?;
        // what an interrupted update committed but did not publish; the
        // state is safe either way, and a table that cannot be published now
        // can still be read here (the next update publishes it or fails
        // saying why)
        let _ = this.publish().await;
        Ok(this)
    }

    /// Whether the table has a published table (tables of the earlier
    /// layout have none).
    pub fn is_published(&self) -> bool {
        self.published.is_some()
    }

    /// Where its published table lives (`None`: a table of the earlier layout).
    pub fn published_location(&self) -> Option<&PublishedLocation> {
        self.published.as_ref()
    }

    /// Bring the published table up to the loaded state (see
    /// [`super::published`]); called after every commit to the state store.
    pub async fn publish(&self) -> Result<()> {
        if let Some(location) = &self.published {
            publish(&self.delta(), location).await.map_err(|e| {
                e.context(format!(
                    "'{}': the update is committed, but the table at its path does not show it yet (the next update or opening of the table publishes it)",
                    self.name
                ))
            })?;
        }
        Ok(())
    }

    /// Fail when another Delta writer committed to the published table
    /// (see [`PublishedLocation::check_own`]): called when the table is
    /// opened and before every commit to its state store.
    pub async fn check_published(&self) -> Result<()> {
        match &self.published {
            Some(location) => location
                .check_own()
                .await
                .map_err(|e| e.context(format!("streaming table '{}'", self.name))),
            None => Ok(()),
        }
    }

    async fn loaded(table: DeltaTable) -> Result<Loaded> {
        let snapshot = table.snapshot().map_err(delta_err)?;
        let meta = TableMeta::decode(
            snapshot.snapshot().arrow_schema().as_ref(),
            snapshot.metadata().configuration(),
        )?;
        let raw = table.table_provider().await?;
        let raw_schema = raw.schema();
        let fields: Vec<_> = raw_schema
            .fields()
            .iter()
            .filter(|f| !f.name().starts_with(INTERNAL_PREFIX))
            .cloned()
            .collect();
        Ok(Loaded {
            table,
            meta,
            raw,
            schema: Arc::new(Schema::new(fields)),
        })
    }

    /// A read-only copy that keeps reading the version loaded now, whatever
    /// later refreshes of this table load: for a read whose rows must be
    /// those of the version it records (a flow's source checkpoint).
    pub(crate) fn pinned(&self) -> Self {
        self.read_only(self.read())
    }

    /// A read-only table of this one's name over `loaded` (no DML, no
    /// published table to keep up).
    fn read_only(&self, loaded: Loaded) -> Self {
        Self {
            name: self.name.clone(),
            loaded: RwLock::new(loaded),
            this: Weak::new(),
            dml: None,
            published: None,
            runs: KnownRuns::default(),
            made: Mutex::default(),
            tip: Mutex::default(),
        }
    }

    /// The table as of an older commit version (time travel): a provider of
    /// the live rows at that version.
    pub async fn as_of(&self, version: u64) -> Result<Self> {
        let mut table = self.delta();
        table.load_version(version as _).await.map_err(delta_err)?;
        Ok(self.read_only(Self::loaded(table).await?))
    }

    /// The table Delta readers read, unloaded (its log is all that is
    /// asked of it): the published table, or this one for a table of the
    /// earlier layout.
    fn readers_table(&self) -> Result<DeltaTable> {
        match &self.published {
            Some(location) => location.builder()?.build().map_err(delta_err),
            None => Ok(self.delta()),
        }
    }

    /// When commit `version` was made, as Delta readers' time travel sees it
    /// (milliseconds since the epoch; see [`super::commit_times`]; `None`:
    /// its log entry is no longer kept).
    pub async fn commit_time(&self, version: u64) -> Result<Option<i64>> {
        match commit_file_time(&self.readers_table()?, version).await? {
            Some(at) => Ok(Some(at)),
            // committed, not published yet
            None => super::event::commit_time_ms(&self.delta(), version).await,
        }
    }

    /// The time of every commit whose log entry is still kept, as
    /// [`Self::commit_time`] gives it: one listing of the readers' log.
    pub async fn commit_times(&self) -> Result<BTreeMap<u64, i64>> {
        let mut times = commit_file_times(&self.readers_table()?).await?;
        let latest = self.delta().version().unwrap_or(0);
        let published = times.last_key_value().map_or(0, |(&v, _)| v + 1);
        for version in published..=latest {
            if let Some(at) = super::event::commit_time_ms(&self.delta(), version).await? {
                times.insert(version, at);
            }
        }
        Ok(times)
    }

    /// The newest commit version made at or before `ms` (milliseconds since
    /// the epoch, the times [`Self::commit_times`] gives); `None` before the
    /// first commit.
    pub async fn version_at(&self, ms: i64) -> Result<Option<u64>> {
        let times = self.commit_times().await?;
        match (version_at(&times, ms), times.first_key_value()) {
            (None, Some((&oldest, _))) if oldest > 0 => Err(DataFusionError::Plan(format!(
                "'{}': the log entries of the commits before version {oldest} are no longer \
                 kept, so which version was current then is unknown",
                self.name
            ))),
            (found, _) => Ok(found),
        }
    }

    /// Put the table in an `Arc` that it knows, taking DML planned by `dml`.
    pub fn into_shared(self, dml: Arc<dyn TargetDml>) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            this: this.clone(),
            dml: Some(dml),
            ..self
        })
    }

    /// This table's `Arc` and DML planner, for a DML `statement`.
    fn writable(&self, statement: &str) -> Result<(Arc<Self>, &Arc<dyn TargetDml>)> {
        match (self.this.upgrade(), &self.dml) {
            (Some(this), Some(dml)) => Ok((this, dml)),
            _ => Err(DataFusionError::NotImplemented(format!(
                "{statement} on '{}': this handle of the table is read-only",
                self.name
            ))),
        }
    }

    /// Re-read the latest committed version (an error names the table).
    ///
    /// The table may have been dropped and created again under its name
    /// since it was loaded (by another session or process): its log then
    /// starts anew, and reading it on from the loaded version would keep
    /// the old table's files and flows, or lay the new table's commits over
    /// them. So the commit file of the loaded version is looked at beside
    /// the read of the log:
    ///
    /// | the loaded version's commit file   | the table is           |
    /// |------------------------------------|------------------------|
    /// | gone                               | another one (or none): read from the start |
    /// | other than when last seen here     | another one: read from the start |
    /// | as last seen, or not seen before   | the same one: read on  |
    ///
    /// A version is seen when loaded and when read on to (another writer's
    /// commit); one this table committed is seen at the next look, so a
    /// table dropped and created again with as many commits before that
    /// look goes unnoticed.
    pub async fn refresh(&self) -> Result<()> {
        let mut table = self.delta();
        let loaded = table.version();
        let before = table.clone();
        let probe = async {
            let version = loaded?;
            Some((version, commit_file(&before, version).await))
        };
        let (read, probed) = futures::join!(table.update_state(), probe);
        let same = match probed {
            None => true,
            Some((_, Err(object_store::Error::NotFound { .. }))) => false,
            // (the probe alone failing: the log read says more)
            Some((_, Err(_))) => true,
            Some((version, Ok(file))) => self.same_tip(version, file),
        };
        let updated = match (same, read) {
            (false, _) => self.reload().await,
            (true, Ok(())) => {
                // read on to another writer's commit: its file, to know it
                // again at the next look (one request, only then)
                if let Some(version) = table.version().filter(|v| Some(*v) != loaded) {
                    if let Ok(file) = commit_file(&table, version).await {
                        self.same_tip(version, file);
                    }
                }
                self.set(table).await
            }
            (true, Err(e)) => Err(delta_err(e)),
        };
        updated.map_err(|e| {
            e.context(format!(
                "streaming table '{}': reading its latest committed version",
                self.name
            ))
        })
    }

    /// The last run of the flow whose checkpoint application id is
    /// `app_id` (its `txn` version) at the loaded version; the log is
    /// replayed for it only when no lookup or commit here told it.
    pub async fn last_run(&self, app_id: &str) -> Result<Option<i64>> {
        let delta = self.delta();
        let snapshot = delta.snapshot().map_err(delta_err)?;
        let version = snapshot.version();
        if let Some(run) = self.runs.get(version, app_id) {
            return Ok(run);
        }
        let run = snapshot
            .transaction_version(delta.log_store().as_ref(), app_id)
            .await
            .map_err(delta_err)?;
        self.runs.found(version, app_id, run);
        Ok(run)
    }

    /// A commit made here on version `built_on` landed at `landed`, with
    /// the flow runs `runs` (application id, run).
    pub fn committed_runs(&self, built_on: u64, landed: u64, runs: &[(String, i64)]) {
        self.runs.committed(built_on, landed, runs);
        if let Ok(mut made) = self.made.lock() {
            if made.len() == MADE_REMEMBERED {
                made.pop_front();
            }
            made.push_back(landed);
        }
    }

    /// The versions after `version` committed by other writers than this
    /// table (as far as it remembers its own), oldest first.
    pub(crate) fn others_commits_after(&self, version: u64) -> Vec<u64> {
        let latest = self.delta().version().unwrap_or(0);
        let made = match self.made.lock() {
            Ok(made) => made.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        (version + 1..=latest)
            .filter(|v| !made.contains(v))
            .collect()
    }

    /// Take `state`, the table's state after a commit made here (deltalake
    /// brought it up to the commit it made: no need to read the log again).
    pub async fn committed(&self, state: DeltaTableState) -> Result<()> {
        let mut table = self.delta();
        table.state = Some(state);
        self.set(table).await
    }

    /// Whether `file`, the commit file of `version`, is the one seen last
    /// time (or none was seen): remembered for the next look.
    fn same_tip(&self, version: u64, file: ObjectMeta) -> bool {
        let Ok(mut tip) = self.tip.lock() else {
            return true;
        };
        let same = match tip.as_ref() {
            Some((seen, before)) if *seen == version => {
                before.size == file.size
                    && before.last_modified == file.last_modified
                    && before.e_tag == file.e_tag
            }
            _ => true,
        };
        *tip = Some((version, file));
        same
    }

    /// Read the table at its path from the start: the one found there now
    /// (dropped and created again), nothing remembered of the one before.
    async fn reload(&self) -> Result<()> {
        let log_store = self.delta().log_store();
        let mut table = DeltaTable::new(Arc::clone(&log_store));
        if let Err(e) = table.load().await {
            // (no log there any more: the table is gone)
            return Err(match log_store.is_delta_table_location().await {
                Ok(false) => DataFusionError::Plan(format!(
                    "streaming table '{}' was dropped since this session read it (by another \
                     session or process)",
                    self.name
                )),
                _ => delta_err(e),
            });
        }
        self.runs.forget();
        if let Some(published) = &self.published {
            published.forget().await;
        }
        if let Ok(mut made) = self.made.lock() {
            made.clear();
        }
        if let Ok(mut tip) = self.tip.lock() {
            *tip = None;
        }
        self.set(table).await
    }

    async fn set(&self, table: DeltaTable) -> Result<()> {
        let loaded = Self::loaded(table).await?;
        *self
            .loaded
            .write()
            .map_err(|_| DataFusionError::Internal("poisoned table lock".into()))? = loaded;
        Ok(())
    }

    fn read(&self) -> Loaded {
        match self.loaded.read() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Table name.
    pub fn name(&self) -> &TableName {
        &self.name
    }

    /// The partition columns of the state store.
    pub(crate) fn partition_columns(&self) -> Result<Vec<String>> {
        Ok(self
            .delta()
            .snapshot()
            .map_err(super::delta_err)?
            .metadata()
            .partition_columns()
            .to_vec())
    }

    /// The Delta table at the loaded version.
    pub fn delta(&self) -> DeltaTable {
        self.read().table
    }

    /// The Delta table id (unique per creation of the table).
    pub fn delta_table_id(&self) -> String {
        self.delta()
            .snapshot()
            .map(|s| s.metadata().id().to_string())
            .unwrap_or_default()
    }

    /// Metadata at the loaded version.
    pub fn meta(&self) -> TableMeta {
        self.read().meta
    }

    /// The raw stored rows as plain Parquet scans of the data files, their
    /// deletion vectors applied by us ([`PlainFilesTable`]): whole files
    /// spread over the session's partitions (delta-rs' scan reads files
    /// with deletion vectors in one partition), and a plan that can travel
    /// (`autocdc.plain_parquet_reads`).
    pub(crate) async fn plain_files(&self) -> Result<PlainFilesTable> {
        let delta = self.delta();
        PlainFilesTable::with_vectors(
            TableLocation {
                url: delta.table_url(),
                store: delta.object_store(),
                schema: self.raw_provider().schema(),
                partition_columns: &self.partition_columns()?,
            },
            data_files(&delta).await?,
        )
    }

    /// Provider over the raw stored rows (all rows, `__cdc_*` columns included).
    pub fn raw_provider(&self) -> Arc<dyn TableProvider> {
        self.read().raw
    }
}

#[async_trait]
impl TableProvider for ScdTable {
    fn schema(&self) -> SchemaRef {
        self.read().schema
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let loaded = self.read();
        let read = ReadRequest {
            projection,
            filters,
            limit,
        };
        let live = col(KIND_COL).eq(lit(Kind::Upsert as i8));
        plan_read(
            state,
            &self.name.table,
            loaded.raw,
            &loaded.schema,
            Some(live),
            read,
        )
        .await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn insert_into(
        &self,
        state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if op != InsertOp::Append {
            return Err(DataFusionError::NotImplemented(format!(
                "{op} on streaming table '{}' is not supported: INSERT adds rows; to replace \
                 them, DELETE FROM {} then INSERT (or REFRESH the table FULL)",
                self.name, self.name
            )));
        }
        let (table, dml) = self.writable("INSERT")?;
        dml.insert(table, state, input).await
    }

    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let (table, dml) = self.writable("DELETE")?;
        dml.delete(table, state, filters).await
    }

    async fn update(
        &self,
        state: &dyn Session,
        assignments: Vec<(String, Expr)>,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let (table, dml) = self.writable("UPDATE")?;
        dml.update(table, state, assignments, filters).await
    }
}

/// What DataFusion asks of a scan.
pub(crate) struct ReadRequest<'a> {
    /// Columns of the visible schema to return.
    pub projection: Option<&'a Vec<usize>>,
    /// Filters (pushed down as far as the source takes them).
    pub filters: &'a [Expr],
    /// Row limit hint.
    pub limit: Option<usize>,
}

/// Plan a read of `source` (whose columns include the visible `schema`) as an
/// ordinary DataFusion plan, so projections and filters reach the source's
/// own pushdown: rows matching `keep`, then the caller's filters, projection
/// and limit.
pub(crate) async fn plan_read(
    state: &dyn Session,
    name: &str,
    source: Arc<dyn TableProvider>,
    schema: &SchemaRef,
    keep: Option<Expr>,
    read: ReadRequest<'_>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let mut builder = LogicalPlanBuilder::scan(name, provider_as_source(source), None)?;
    // columns the source holds in another type are read as `schema` has them
    // (the caller's filters are in `schema`'s types; the optimizer takes them
    // through the casts to the source)
    let source_schema = Arc::clone(builder.schema());
    let retyped = schema.fields().iter().any(|f| {
        source_schema
            .field_with_unqualified_name(f.name())
            .is_ok_and(|s| s.data_type() != f.data_type())
    });
    if retyped {
        let columns = source_schema.fields().iter().map(|s| {
            let column = Expr::Column(Column::new_unqualified(s.name()));
            match schema.field_with_name(s.name()) {
                Ok(f) if s.data_type() != f.data_type() => {
                    cast(column, f.data_type().clone()).alias(f.name())
                }
                _ => column,
            }
        });
        builder = builder.project(columns)?;
    }
    for f in keep
        .into_iter()
        .chain(read.filters.iter().map(|f| unnormalize_col(f.clone())))
    {
        builder = builder.filter(f)?;
    }
    let column = |i: usize| Expr::Column(Column::new_unqualified(schema.field(i).name()));
    let columns: Vec<Expr> = match read.projection {
        Some(p) => p.iter().map(|&i| column(i)).collect(),
        None => (0..schema.fields().len()).map(column).collect(),
    };
    builder = builder.project(columns)?;
    if let Some(n) = read.limit {
        builder = builder.limit(0, Some(n))?;
    }
    state.create_physical_plan(&builder.build()?).await
}
