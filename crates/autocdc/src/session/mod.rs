//! `CdcSession`: a DataFusion session on a warehouse of streaming tables whose
//! `sql()` understands the AUTO CDC statements and hands every other
//! statement to DataFusion unchanged.
//!
//! This module opens the session and dispatches statements; each statement
//! is carried out by its own module: `create_table`, `create_flow`
//! (and one update of a change-feed flow), `snapshot_flows`, `refresh`,
//! `drop_table` and `explain`. DML reaches targets through DataFusion's
//! `TableProvider` hooks (planned in `pipeline::dml`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use datafusion::catalog::{MemorySchemaProvider, TableProvider};
use datafusion::common::{DataFusionError, Result, ScalarValue, TableReference};
use datafusion::execution::cache::cache_manager::CacheManagerConfig;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::prelude::{DataFrame, SessionContext};

use crate::clock::{Clock, SessionClock};
use crate::config::AutoCdcConfig;
use crate::functions::{
    BitemporalAsOfFunction, DebeziumFunction, EventLogFunction, MisplacedSnapshotVersion,
    Scd2AsOfFunction, StreamFunction, TableAsOfFunction, TableChangesFunction, TableRegistry,
    CURRENT_SNAPSHOT_VERSION, LAST_SNAPSHOT_VERSION,
};
use crate::pipeline::dml::PipelineDml;
use crate::sql::{parse_cdc_statement, CdcStatement};
use crate::table::{ScdTable, TableName, Warehouse};
use crate::AutoCdc;
use latest_schema::LatestSchema;

mod create_flow;
mod create_table;
mod drop_flow;
mod drop_table;
mod explain;
mod latest_schema;
mod pipeline;

pub use pipeline::Defined;
mod refresh;
mod restore;
mod show_properties;
mod snapshot_flows;

/// A DataFusion session with AUTO CDC statements and a warehouse of
/// streaming tables.
pub struct CdcSession {
    ctx: SessionContext,
    warehouse: Arc<Warehouse>,
    tables: TableRegistry,
    clock: Arc<dyn Clock>,
    snapshot_functions: Mutex<HashMap<(TableName, String), SnapshotFunction>>,
}

/// A Rust snapshot source (`next_snapshot_and_version`): given the last
/// processed version, the next snapshot and its version, or `None`.
pub type SnapshotFunction =
    Arc<dyn Fn(Option<ScalarValue>) -> Result<Option<(DataFrame, ScalarValue)>> + Send + Sync>;

impl std::fmt::Debug for CdcSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcSession")
            .field("warehouse", &self.warehouse.root().as_str())
            .finish()
    }
}

/// Whether planning `e` failed on a table name it does not know
/// (DataFusion's lookup, our table functions and DDL).
fn names_unknown_table(e: &DataFusionError) -> bool {
    let message = e.to_string();
    (message.contains("table '") && message.contains("' not found"))
        || message.contains("is not a streaming table")
        || message.contains("no table of that name")
}

/// Names of `AUTO CDC (…)` relations while their query is planned.
static RELATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How those names start.
const RELATION_PREFIX: &str = "__autocdc_relation_";

impl CdcSession {
    /// Open a session on a warehouse; every streaming table already stored
    /// there is registered.
    pub async fn open(config: AutoCdcConfig) -> Result<Self> {
        let warehouse = Arc::new(match &config.memory_store {
            Some(store) if config.warehouse.starts_with("memory://") => {
                Warehouse::in_memory_on(Arc::clone(store))?
            }
            _ => Warehouse::open(&config.warehouse)?,
        });
        // without DataFusion's cache of folder listings, which keeps what a
        // folder held when a table over it was first read for the life of
        // the session: a session reads a folder's files as they are now, as
        // a flow (or a continuous pipeline's next cycle) must
        let runtime = RuntimeEnvBuilder::new()
            .with_cache_manager(CacheManagerConfig::default().with_list_files_cache_limit(0))
            .build_arc()?;
        // without statistics of Parquet sources: DataFusion 55 takes a
        // column whose footer statistics have one value and no NULLs as that
        // constant, and Parquet statistics leave NaN out, so a column of
        // 0.1 and NaN read 0.1 twice, into the target
        let mut session_config = config.session_config;
        session_config.options_mut().execution.collect_statistics = false;
        let mut builder = AutoCdc::install(
            SessionStateBuilder::new()
                .with_runtime_env(runtime)
                // `CREATE EXTERNAL TABLE … STORED AS DELTA`: any Delta
                // table, read as deltalake reads it
                .with_table_factory(
                    "DELTA".to_string(),
                    Arc::new(crate::table::foreign::ForeignDeltaFactory),
                )
                .with_config(
                    crate::config::with_autocdc_options(session_config)
                        .with_extension(Arc::new(SessionClock(Arc::clone(&config.clock))))
                        .with_extension(Arc::new(
                            crate::pipeline::folders::DeclaredColumns::default(),
                        )),
                )
                .with_default_features(),
        );
        // folder tables note whether they were declared with their columns
        // (a folder's later files may add columns: read unless declared)
        for format in ["PARQUET", "CSV", "JSON", "NDJSON", "AVRO", "ARROW"] {
            builder = builder.with_table_factory(
                format.to_string(),
                Arc::new(crate::pipeline::folders::FolderTableFactory::default()),
            );
        }
        for rule in config.physical_optimizer_rules {
            builder = builder.with_physical_optimizer_rule(rule);
        }
        let state = builder.build();
        let ctx = SessionContext::new_with_state(state);
        ctx.register_object_store(warehouse.root(), warehouse.store());
        let (catalog, schema) = {
            let state = ctx.state();
            let options = &state.config().options().catalog;
            (
                options.default_catalog.clone(),
                options.default_schema.clone(),
            )
        };
        // the default schema looks its tables up at their latest version
        // from the start (a Delta table read with STORED AS DELTA there,
        // before any streaming table was attached, was read as it was
        // when created)
        if let Some(catalog) = ctx.catalog(&catalog) {
            if let Some(latest) = catalog.schema(&schema).and_then(LatestSchema::wrap) {
                catalog.register_schema(&schema, Arc::new(latest))?;
            }
        }
        let tables = TableRegistry::default();
        ctx.register_udtf(
            "table_changes",
            Arc::new(TableChangesFunction::new(Arc::clone(&tables))),
        );
        ctx.register_udtf(
            "table_as_of",
            Arc::new(TableAsOfFunction::new(Arc::clone(&tables))),
        );
        ctx.register_udtf(
            "event_log",
            Arc::new(EventLogFunction::new(Arc::clone(&tables))),
        );
        ctx.register_udtf("debezium", Arc::new(DebeziumFunction));
        ctx.register_relation_planner(Arc::new(crate::sql::TimeTravelPlanner))?;
        ctx.register_udtf(
            "scd2_as_of",
            Arc::new(Scd2AsOfFunction::new(Arc::clone(&tables))),
        );
        ctx.register_udtf(
            "bitemporal_as_of",
            Arc::new(BitemporalAsOfFunction::new(Arc::clone(&tables))),
        );
        ctx.register_udtf(
            LAST_SNAPSHOT_VERSION,
            Arc::new(MisplacedSnapshotVersion::last()),
        );
        ctx.register_udtf(
            CURRENT_SNAPSHOT_VERSION,
            Arc::new(MisplacedSnapshotVersion::current()),
        );
        ctx.register_udtf(
            "stream",
            Arc::new(StreamFunction::new(
                ctx.state().catalog_list().clone(),
                catalog,
                Arc::clone(&tables),
            )),
        );
        let session = Self {
            ctx,
            warehouse,
            tables,
            clock: Arc::clone(&config.clock),
            snapshot_functions: Mutex::new(HashMap::new()),
        };
        let mut attached = Vec::new();
        for name in session.warehouse.list_tables().await? {
            // (a table that cannot be opened does not close the warehouse:
            // the others open, and statements naming it say why it cannot)
            match session.attach(name.clone()).await {
                Ok(table) => attached.push(table),
                Err(e) => log::warn!("streaming table '{name}' cannot be opened: {e}"),
            }
        }
        // Delta tables other tools wrote into the warehouse's folders: read
        // as they are (a source), never written
        for name in session.warehouse.list_foreign_tables().await? {
            let registered = match session.warehouse.foreign_provider(&name).await {
                Ok(provider) => session.register_in_schema(&name, provider),
                Err(e) => Err(e),
            };
            if let Err(e) = registered {
                log::warn!("Delta table '{name}' cannot be read: {e}");
            }
        }
        // rejects an interrupted update committed reach their table, as its
        // published table catches up when opened
        // (one that cannot be delivered now does not keep the warehouse
        // closed: the table's next update delivers it or says why)
        for table in &attached {
            if let Err(e) = session.deliver_rejects(table).await {
                log::warn!(
                    "rejects of '{}' not delivered when the warehouse opened: {e}",
                    table.name()
                );
            }
        }
        Ok(session)
    }

    /// The underlying DataFusion context.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// The warehouse.
    pub fn warehouse(&self) -> &Arc<Warehouse> {
        &self.warehouse
    }

    /// A streaming table of this session.
    pub fn streaming_table(&self, name: &TableName) -> Option<Arc<ScdTable>> {
        self.tables.lock().ok().and_then(|t| t.get(name).cloned())
    }

    /// Run one SQL statement. AUTO CDC statements execute eagerly and return
    /// their result rows (one per flow run); everything else is
    /// `SessionContext::sql`.
    pub async fn sql(&self, sql: &str) -> Result<DataFrame> {
        let unknown = match self.sql_once(sql).await {
            Err(e) if names_unknown_table(&e) => e,
            planned => return planned,
        };
        // a table another session or process created since this one looked:
        // found now, and the statement planned again — unless it may have
        // committed something before it failed (a refresh of several flows,
        // a restore, an EXPLAIN ANALYZE: the others fail on an unknown name
        // when they are planned, before they run anything); one that cannot
        // be opened says why
        let (found, unopened) = self.attach_new_tables().await?;
        if found && self.may_run_again(sql) {
            return self.sql_once(sql).await;
        }
        // (the name as the error quotes it: qualified, or bare in the
        // default schema)
        let message = unknown.to_string();
        let default_schema = self
            .ctx
            .state()
            .config()
            .options()
            .catalog
            .default_schema
            .clone();
        match unopened.into_iter().find(|(name, _)| {
            let qualified = format!("{}.{}'", name.schema, name.table);
            message.contains(&format!("'{qualified}"))
                || message.contains(&format!(".{qualified}"))
                || (name.schema == default_schema && message.contains(&format!("'{}'", name.table)))
        }) {
            Some((name, e)) => Err(DataFusionError::Plan(format!(
                "streaming table '{name}' cannot be opened: {e}"
            ))),
            None => Err(unknown),
        }
    }

    /// Attach the tables created since this session looked when a flow of
    /// `table` reads one it does not know: a refresh (which is not planned
    /// again, [`Self::sql`]) then finds it the first time.
    pub(super) async fn attach_sources_of(&self, table: &ScdTable) -> Result<()> {
        let unknown = table
            .meta()
            .flows
            .values()
            .flat_map(|flow| crate::pipeline::dependencies::flow_reads(flow).unwrap_or_default())
            .any(|name| {
                let reference = TableReference::partial(name.schema, name.table);
                !self.ctx.table_exist(reference).unwrap_or(false)
            });
        if unknown {
            self.attach_new_tables().await?;
        }
        Ok(())
    }

    /// Whether `sql`, which failed naming an unknown table, committed nothing
    /// before it did (see [`Self::sql`]).
    fn may_run_again(&self, sql: &str) -> bool {
        let (dialect, normalize) = self.parser_options();
        !matches!(
            parse_cdc_statement(sql, &dialect, normalize),
            Ok(Some(
                CdcStatement::Refresh { .. }
                    | CdcStatement::RefreshPipeline { .. }
                    | CdcStatement::Restore { .. }
                    | CdcStatement::Explain { .. }
            ))
        )
    }

    /// Attach the tables of the warehouse this session has not seen (created
    /// by another session or process since it opened): whether there was
    /// one, and the tables that cannot be opened, with why.
    async fn attach_new_tables(&self) -> Result<(bool, Vec<(TableName, DataFusionError)>)> {
        let mut found = false;
        let mut unopened = Vec::new();
        for name in self.warehouse.list_tables().await? {
            if self.streaming_table(&name).is_some() {
                continue;
            }
            match self.attach(name.clone()).await {
                Ok(_) => found = true,
                Err(e) => unopened.push((name, e)),
            }
        }
        for name in self.warehouse.list_foreign_tables().await? {
            let reference = TableReference::partial(name.schema.clone(), name.table.clone());
            if self.ctx.table_exist(reference).unwrap_or(false) {
                continue;
            }
            match self.warehouse.foreign_provider(&name).await {
                Ok(provider) => {
                    self.register_in_schema(&name, provider)?;
                    found = true;
                }
                Err(e) => unopened.push((name, e)),
            }
        }
        Ok((found, unopened))
    }

    async fn sql_once(&self, sql: &str) -> Result<DataFrame> {
        let (dialect, normalize) = self.parser_options();
        // the tables it names through functions at their latest version:
        // those take them as they are while planning (`crate::sql::looked_up`)
        if crate::sql::may_name_tables_in_functions(sql) {
            for table in crate::sql::looked_up_tables(sql, &dialect, normalize) {
                // (a table it cannot look up: planning says why)
                let _ = self.ctx.table_provider(table).await;
            }
        }
        match parse_cdc_statement(sql, &dialect, normalize)? {
            // a query with `FROM AUTO CDC (query) …` relations: each planned
            // as the fold of its query under a name of its own
            None if sql
                .as_bytes()
                .windows(4)
                .any(|w| w.eq_ignore_ascii_case(b"AUTO"))
                || sql
                    .as_bytes()
                    .windows(9)
                    .any(|w| w.eq_ignore_ascii_case(b"SNAPSHOTS")) =>
            {
                let name = || {
                    let n = RELATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    format!("{RELATION_PREFIX}{n}")
                };
                match crate::sql::replace_auto_cdc_relations(sql, &dialect, normalize, name)? {
                    Some((rewritten, relations)) => {
                        self.sql_with_relations(&rewritten, relations, &dialect)
                            .await
                    }
                    None => {
                        self.refuse_plain_ddl(sql, &dialect, normalize).await?;
                        let sql = crate::sql::fold_update_targets(sql, &dialect, normalize);
                        let sql = crate::sql::with_databricks_values_columns(&sql, &dialect);
                        let sql = crate::sql::truncate_as_delete(&sql, &dialect);
                        self.ctx.sql(&sql).await
                    }
                }
            }
            None => {
                self.refuse_plain_ddl(sql, &dialect, normalize).await?;
                let sql = crate::sql::fold_update_targets(sql, &dialect, normalize);
                let sql = crate::sql::with_databricks_values_columns(&sql, &dialect);
                let sql = crate::sql::truncate_as_delete(&sql, &dialect);
                self.ctx.sql(&sql).await
            }
            Some(statement) => self.execute(statement).await,
        }
    }

    /// The session's SQL dialect and whether it folds unquoted identifiers
    /// to lower case: how its statements are parsed.
    pub(super) fn parser_options(&self) -> (String, bool) {
        let state = self.ctx.state();
        let parser = &state.config().options().sql_parser;
        (
            parser.dialect.to_string(),
            parser.enable_ident_normalization,
        )
    }

    /// Plan the query `sql` — one `SELECT`, `VALUES` or `WITH …`, with our
    /// relations and table functions — running nothing: anything else
    /// (DDL, DML, `REFRESH`, …) is refused, as [`Self::sql`] would run it
    /// at once. For callers that run the plan later (a provider).
    pub async fn query(&self, sql: &str) -> Result<DataFrame> {
        let (dialect, normalize) = self.parser_options();
        let statement = parse_cdc_statement(sql, &dialect, normalize)?.is_some();
        let plain = match crate::sql::replace_auto_cdc_relations(sql, &dialect, normalize, || {
            RELATION_PREFIX.to_string()
        })? {
            Some((rewritten, _)) => rewritten,
            None => sql.to_string(),
        };
        if statement || !crate::sql::is_lone_query(&plain, &dialect) {
            return Err(DataFusionError::Plan(format!(
                "not a query (one SELECT, VALUES or WITH …), which is planned now and run \
                 later: {}",
                sql.trim()
            )));
        }
        self.sql(sql).await
    }

    /// Plan `sql` (in `dialect`) with each of `relations` registered under
    /// its name while it is planned (the plan keeps what it read of them);
    /// a relation's query sees the CTEs of `sql`
    /// ([`crate::sql::with_outer_ctes`]).
    async fn sql_with_relations(
        &self,
        sql: &str,
        relations: Vec<(String, crate::sql::AutoCdcRelation)>,
        dialect: &str,
    ) -> Result<DataFrame> {
        use crate::query::AutoCdcDataFrame;
        let mut registered: Vec<String> = Vec::new();
        let mut planned = Ok(());
        let ctes = crate::sql::outer_ctes(sql, dialect);
        let mut pending = relations;
        while !pending.is_empty() {
            // the first relation whose query, and the CTEs it may be given,
            // read only relations planned already (a relation nested in
            // another's query, or in a CTE another reads, comes first)
            let ready = |(name, relation): &(String, crate::sql::AutoCdcRelation)| {
                let planned =
                    |text: &str| crate::sql::reads_only_planned(text, RELATION_PREFIX, &registered);
                planned(&relation.query)
                    && ctes
                        .iter()
                        .filter(|cte| !cte.contains(name.as_str()))
                        .all(|cte| planned(cte))
            };
            let next = pending.iter().position(ready).unwrap_or(0);
            let (name, relation) = pending.remove(next);
            let query = crate::sql::with_outer_ctes(
                sql,
                &relation.query,
                dialect,
                RELATION_PREFIX,
                &registered,
            );
            let events = match query {
                Ok(query) => {
                    let query = crate::sql::with_databricks_values_columns(&query, dialect);
                    self.ctx.sql(&query).await
                }
                Err(e) => Err(e),
            };
            let folded = match (events, &relation.snapshot_version, relation.changes) {
                (Ok(events), None, false) => events.auto_cdc(&relation.spec),
                (Ok(events), None, true) => events.auto_cdc_changes(&relation.spec),
                (Ok(snapshots), Some(version), false) => {
                    snapshots.snapshot_diff(&relation.spec, version)
                }
                (Ok(snapshots), Some(version), true) => {
                    snapshots.snapshot_diff_changes(&relation.spec, version)
                }
                (Err(e), _, _) => Err(e),
            };
            match folded.and_then(|df| self.ctx.register_table(name.as_str(), df.into_view())) {
                Ok(_) => registered.push(name),
                Err(e) => {
                    planned = Err(e);
                    break;
                }
            }
        }
        let result = match planned {
            Ok(()) => {
                let sql = crate::sql::with_databricks_values_columns(sql, dialect);
                self.ctx.sql(&sql).await
            }
            Err(e) => Err(e),
        };
        for name in registered {
            let _ = self.ctx.deregister_table(name.as_str());
        }
        result
    }

    /// Execute one parsed AUTO CDC statement.
    pub async fn execute(&self, statement: CdcStatement) -> Result<DataFrame> {
        match statement {
            CdcStatement::CreateStreamingTable(c) => {
                // `AS query`: the table's append flow, named after it;
                // `FLOW AUTO CDC …`: its AUTO CDC flow, likewise
                let flow = c
                    .query
                    .clone()
                    .map(|query| {
                        crate::spec::FlowSpec::append(
                            c.name.table.clone(),
                            c.name.to_string(),
                            query,
                            c.dialect.clone(),
                        )
                    })
                    .or_else(|| c.flow.clone().map(|f| *f));
                let name = c.name.clone();
                let existed = self.table(&name).await.is_ok();
                // `CREATE OR REFRESH … FLOW AUTO CDC …` again, as defined:
                // the table's definition again, and a refresh of its flow
                // (as the `AS query` form is; an ONCE flow does not run
                // again); defined otherwise: an error saying what differs,
                // before the table's definition changes anything
                let again = match (c.or_refresh && c.flow.is_some() && existed, &flow) {
                    (true, Some(flow)) => {
                        let (_, normalize) = self.parser_options();
                        self.stored_as_defined(&name, flow, normalize)
                            .await?
                            .is_some()
                    }
                    _ => false,
                };
                self.create_table(c).await?;
                if let (true, Some(flow)) = (again, &flow) {
                    if flow.once {
                        return self.empty();
                    }
                    let table = self.table(&name).await?;
                    let batches = self
                        .run_flow(&table, flow, crate::table::event::Operation::Refresh)
                        .await?;
                    return self.ctx.read_batches(batches);
                }
                match flow {
                    Some(flow) => match self.create_flow(flow).await {
                        Ok(batches) => self.ctx.read_batches(batches),
                        Err(e) => {
                            // one statement: a table it created goes with its flow
                            if !existed {
                                self.drop_table(&name, true).await?;
                            }
                            Err(e)
                        }
                    },
                    None => self.empty(),
                }
            }
            CdcStatement::RefreshPipeline { schema, full } => {
                let update = self.run_pipeline(schema.as_deref(), &full, false).await?;
                self.ctx.read_batch(pipeline::pipeline_result(&update)?)
            }
            CdcStatement::CreateFlow(spec) => {
                let batches = self.create_flow(*spec).await?;
                self.ctx.read_batches(batches)
            }
            CdcStatement::Refresh { name, full } => {
                let batches = self.refresh(&name, full).await?;
                self.ctx.read_batches(batches)
            }
            CdcStatement::Restore { name, to } => {
                let restored = self.restore_table(&name, &to).await?;
                self.ctx.read_batch(restored.to_batch()?)
            }
            CdcStatement::Drop { name, if_exists } => {
                self.drop_table(&name, if_exists).await?;
                self.empty()
            }
            CdcStatement::DropFlow { name, if_exists } => {
                self.drop_flow(&name, if_exists).await?;
                self.empty()
            }
            CdcStatement::Merge(merge) => {
                let (state, plan) = self.plan_merge(&merge).await?;
                let batches = datafusion::physical_plan::collect(plan, state.task_ctx()).await?;
                self.ctx.read_batches(batches)
            }
            CdcStatement::ShowProperties { name, key } => {
                self.show_properties(&name, key.as_deref()).await
            }
            CdcStatement::Explain {
                analyze,
                verbose,
                format,
                statement,
            } => {
                self.explain(*statement, analyze, verbose, format.as_deref())
                    .await
            }
        }
    }

    fn empty(&self) -> Result<DataFrame> {
        self.ctx
            .read_batch(RecordBatch::new_empty(Arc::new(Schema::empty())))
    }

    async fn attach(&self, name: TableName) -> Result<Arc<ScdTable>> {
        let table = ScdTable::load(&self.warehouse, name.clone())
            .await?
            .into_shared(Arc::new(PipelineDml));
        self.register_in_schema(&name, Arc::clone(&table) as _)?;
        if let Ok(mut tables) = self.tables.lock() {
            tables.insert(name, Arc::clone(&table));
        }
        Ok(table)
    }

    /// Register `table` as `name` in the context, in a schema whose
    /// streaming tables each statement reads at their latest version,
    /// whichever session or process committed it.
    fn register_in_schema(&self, name: &TableName, table: Arc<dyn TableProvider>) -> Result<()> {
        let catalog_name = self
            .ctx
            .state()
            .config()
            .options()
            .catalog
            .default_catalog
            .clone();
        let catalog = self
            .ctx
            .catalog(&catalog_name)
            .ok_or_else(|| DataFusionError::Plan(format!("catalog '{catalog_name}' not found")))?;
        let schema = catalog
            .schema(&name.schema)
            .unwrap_or_else(|| Arc::new(MemorySchemaProvider::new()));
        if let Some(latest) = LatestSchema::wrap(schema) {
            catalog.register_schema(&name.schema, Arc::new(latest))?;
        }
        let reference = TableReference::partial(name.schema.clone(), name.table.clone());
        self.ctx.deregister_table(reference.clone())?;
        self.ctx.register_table(reference, table)?;
        Ok(())
    }

    async fn table(&self, name: &TableName) -> Result<Arc<ScdTable>> {
        if let Some(t) = self.streaming_table(name) {
            return Ok(t);
        }
        if self.warehouse.exists(name).await? {
            return self.attach(name.clone()).await;
        }
        if self.warehouse.is_foreign(name).await? {
            return Err(DataFusionError::Plan(format!(
                "'{name}' is a Delta table another tool wrote into the warehouse, not a \
                 streaming table: it is read as it is (SELECT, a flow's FROM), never written here"
            )));
        }
        let reference = TableReference::partial(name.schema.clone(), name.table.clone());
        if self.ctx.table_exist(reference).unwrap_or(false) {
            return Err(DataFusionError::Plan(format!(
                "'{name}' is a table of this session (an external or registered table), not a \
                 streaming table: only streaming tables are written by flows, UPDATE, DELETE, \
                 MERGE and INSERT here"
            )));
        }
        Err(DataFusionError::Plan(format!(
            "'{name}' is not a streaming table: declare it with CREATE STREAMING TABLE {name}"
        )))
    }

    /// Plan a `MERGE` on its target's latest version (listed once: the
    /// lookups of the statement's SQL take the target as brought up to
    /// date here), in the statement's dialect.
    async fn plan_merge(
        &self,
        merge: &crate::sql::MergeStatement,
    ) -> Result<(
        SessionState,
        Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    )> {
        let table = self.table(&merge.target).await.map_err(|e| {
            DataFusionError::Plan(format!("MERGE INTO {}: {}", merge.target, e.message()))
        })?;
        table.refresh().await?;
        let state = self.dialect_state(&merge.dialect);
        // (boxed: the merge's planning is a large future, kept off the
        // stack of every statement's)
        let plan = latest_schema::with_current(
            vec![table.name().clone()],
            Box::pin(crate::pipeline::dml::merge(&state, table, merge)),
        )
        .await?;
        Ok((state, plan))
    }

    /// A copy of the session state whose SQL dialect is `dialect`.
    fn dialect_state(&self, dialect: &str) -> SessionState {
        let mut state = self.ctx.state();
        let _ = state
            .config_mut()
            .options_mut()
            .set("datafusion.sql_parser.dialect", dialect);
        state
    }
}
