//! `CdcSession`: a DataFusion session on a warehouse of streaming tables whose
//! `sql()` understands the AUTO CDC statements and hands every other
//! statement to DataFusion unchanged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::MemorySchemaProvider;
use datafusion::common::{DataFusionError, Result, TableReference};
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::{DataFrame, SessionContext};
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake_core::kernel::transaction::CommitBuilder;
use deltalake_core::kernel::Action;
use deltalake_core::kernel::StructType;
use deltalake_core::protocol::DeltaOperation;
use futures::TryStreamExt;

use crate::clock::Clock;
use crate::config::AutoCdcConfig;
use crate::fold::columns::{INTERNAL_PREFIX, KIND_COL};
use crate::functions::StreamFunction;
use crate::physical::commit_exec::result_schema;
use crate::pipeline::{delta_err, plan_update};
use crate::spec::resolve::storage_type;
use crate::spec::FlowSpec;
use crate::sql::{parse_cdc_statement, CdcStatement, CreateStreamingTable};
use crate::table::bucket::{bucket_field, BUCKETS_PROPERTY, BUCKET_COL, DEFAULT_BUCKETS};
use crate::table::meta::TableDecl;
use crate::table::{ScdTable, TableName, Warehouse, TABLE_KEY};
use crate::AutoCdc;

/// A DataFusion session with AUTO CDC statements and a warehouse of
/// streaming tables.
pub struct CdcSession {
    ctx: SessionContext,
    warehouse: Arc<Warehouse>,
    tables: Mutex<HashMap<TableName, Arc<ScdTable>>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for CdcSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcSession")
            .field("warehouse", &self.warehouse.root().as_str())
            .finish()
    }
}

impl CdcSession {
    /// Open a session on a warehouse; every streaming table already stored
    /// there is registered.
    pub async fn open(config: AutoCdcConfig) -> Result<Self> {
        let warehouse = Arc::new(Warehouse::open(&config.warehouse)?);
        let state = AutoCdc::install(
            SessionStateBuilder::new()
                .with_config(config.session_config)
                .with_default_features(),
        )
        .build();
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
        ctx.register_udtf(
            "stream",
            Arc::new(StreamFunction::new(
                ctx.state().catalog_list().clone(),
                catalog,
                schema,
            )),
        );
        let session = Self {
            ctx,
            warehouse,
            tables: Mutex::new(HashMap::new()),
            clock: Arc::clone(&config.clock),
        };
        for name in session.warehouse.list_tables().await? {
            session.attach(name).await?;
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
        let state = self.ctx.state();
        let options = state.config().options();
        let dialect = options.sql_parser.dialect.to_string();
        let normalize = options.sql_parser.enable_ident_normalization;
        match parse_cdc_statement(sql, &dialect, normalize)? {
            None => self.ctx.sql(sql).await,
            Some(statement) => self.execute(statement).await,
        }
    }

    /// Execute one parsed AUTO CDC statement.
    pub async fn execute(&self, statement: CdcStatement) -> Result<DataFrame> {
        match statement {
            CdcStatement::CreateStreamingTable(c) => {
                self.create_table(c).await?;
                self.empty()
            }
            CdcStatement::CreateFlow(spec) => {
                let batch = self.create_flow(*spec).await?;
                self.ctx.read_batch(batch)
            }
            CdcStatement::Refresh { name, full } => {
                let batches = self.refresh(&name, full).await?;
                self.ctx.read_batches(batches)
            }
            CdcStatement::Drop { name, if_exists } => {
                self.drop_table(&name, if_exists).await?;
                self.empty()
            }
            CdcStatement::Explain {
                analyze,
                verbose,
                statement,
            } => self.explain(*statement, analyze, verbose).await,
        }
    }

    fn empty(&self) -> Result<DataFrame> {
        self.ctx
            .read_batch(RecordBatch::new_empty(Arc::new(Schema::empty())))
    }

    async fn attach(&self, name: TableName) -> Result<Arc<ScdTable>> {
        let table = Arc::new(ScdTable::load(&self.warehouse, name.clone()).await?);
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
        if catalog.schema(&name.schema).is_none() {
            catalog.register_schema(&name.schema, Arc::new(MemorySchemaProvider::new()))?;
        }
        let reference = TableReference::partial(name.schema.clone(), name.table.clone());
        self.ctx.deregister_table(reference.clone())?;
        self.ctx
            .register_table(reference, Arc::clone(&table) as _)?;
        if let Ok(mut tables) = self.tables.lock() {
            tables.insert(name, Arc::clone(&table));
        }
        Ok(table)
    }

    async fn table(&self, name: &TableName) -> Result<Arc<ScdTable>> {
        if let Some(t) = self.streaming_table(name) {
            return Ok(t);
        }
        if self.warehouse.exists(name).await? {
            return self.attach(name.clone()).await;
        }
        Err(DataFusionError::Plan(format!(
            "'{name}' is not a streaming table: declare it with CREATE STREAMING TABLE {name}"
        )))
    }

    pub(crate) async fn create_table(&self, c: CreateStreamingTable) -> Result<()> {
        if self.warehouse.exists(&c.name).await? {
            if c.or_refresh || c.if_not_exists {
                self.table(&c.name).await?;
                return Ok(());
            }
            return Err(DataFusionError::Plan(format!(
                "streaming table '{}' already exists",
                c.name
            )));
        }
        let reference = TableReference::partial(c.name.schema.clone(), c.name.table.clone());
        if self.ctx.table_exist(reference).unwrap_or(false) {
            return Err(DataFusionError::Plan(format!(
                "a table named '{}' already exists in this session",
                c.name
            )));
        }
        let mut fields = Vec::with_capacity(c.columns.len() + 1);
        if !c.columns.is_empty() {
            let state = self.dialect_state(&c.dialect);
            let select = c
                .columns
                .iter()
                .enumerate()
                .map(|(i, (_, ty))| format!("CAST(NULL AS {ty}) AS c{i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let plan = state
                .create_logical_plan(&format!("SELECT {select}"))
                .await?;
            for ((name, _), field) in c.columns.iter().zip(plan.schema().fields()) {
                if name.starts_with(INTERNAL_PREFIX) {
                    return Err(DataFusionError::Plan(format!(
                        "streaming table '{}': column '{name}' uses the reserved prefix {INTERNAL_PREFIX}",
                        c.name
                    )));
                }
                fields.push(Field::new(name, storage_type(field.data_type()), true));
            }
        }
        fields.push(Field::new(KIND_COL, DataType::Int8, false));
        fields.push(bucket_field());
        let buckets = match c.properties.iter().find(|(k, _)| k == BUCKETS_PROPERTY) {
            Some((_, v)) => v.parse::<i32>().ok().filter(|b| *b > 0).ok_or_else(|| {
                DataFusionError::Plan(format!("streaming table '{}': {BUCKETS_PROPERTY} must be a positive integer, got '{v}'", c.name))
            })?,
            None => DEFAULT_BUCKETS,
        };
        let kernel: StructType = (&Schema::new(fields))
            .try_into_kernel()
            .map_err(delta_err)?;
        let decl = TableDecl {
            declared_columns: !c.columns.is_empty(),
        };
        let mut config: Vec<(String, Option<String>)> = vec![(
            TABLE_KEY.to_string(),
            Some(serde_json::to_string(&decl).map_err(delta_err)?),
        )];
        config.extend(
            c.properties
                .iter()
                .filter(|(k, _)| k != BUCKETS_PROPERTY)
                .map(|(k, v)| (k.clone(), Some(v.clone()))),
        );
        config.push((BUCKETS_PROPERTY.to_string(), Some(buckets.to_string())));
        let table = self
            .warehouse
            .delta_builder(&c.name)?
            .build()
            .map_err(delta_err)?;
        table
            .create()
            .with_table_name(c.name.table.clone())
            .with_columns(kernel.fields().cloned())
            .with_partition_columns([BUCKET_COL])
            .with_configuration(config)
            .with_raise_if_key_not_exists(false)
            .await
            .map_err(delta_err)?;
        self.attach(c.name).await?;
        Ok(())
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

    pub(crate) async fn create_flow(&self, spec: FlowSpec) -> Result<RecordBatch> {
        let target = TableName::parse(&spec.target)?;
        let table = self.table(&target).await.map_err(|e| {
            let msg = match e {
                DataFusionError::Plan(m) => m,
                other => other.to_string(),
            };
            DataFusionError::Plan(format!("flow '{}': INTO: {msg}", spec.name))
        })?;
        if table.meta().flows.contains_key(&spec.name) {
            return Err(DataFusionError::Plan(format!(
                "flow '{}': a flow of that name already exists on target '{target}'",
                spec.name
            )));
        }
        self.run_flow(&table, &spec, true).await
    }

    async fn run_flow(
        &self,
        table: &Arc<ScdTable>,
        spec: &FlowSpec,
        register: bool,
    ) -> Result<RecordBatch> {
        let state = self.ctx.state();
        let plan = plan_update(&state, Arc::clone(table), spec, register, self.clock.now()).await?;
        let batches = DataFrame::new(state, plan).collect().await?;
        batches
            .into_iter()
            .find(|b| b.num_rows() > 0)
            .ok_or_else(|| {
                DataFusionError::Internal(format!("flow '{}' returned no result", spec.name))
            })
    }

    /// Flows of a table to run on a refresh.
    fn flows_to_run(table: &ScdTable, full: bool) -> Vec<FlowSpec> {
        table
            .meta()
            .flows
            .into_values()
            .filter(|f| full || !f.once)
            .collect()
    }

    pub(crate) async fn refresh(&self, name: &TableName, full: bool) -> Result<Vec<RecordBatch>> {
        let table = self.table(name).await?;
        table.refresh().await?;
        if full {
            self.clear(&table).await?;
        }
        let mut out = Vec::new();
        for flow in Self::flows_to_run(&table, full) {
            out.push(self.run_flow(&table, &flow, false).await?);
        }
        if out.is_empty() {
            out.push(RecordBatch::new_empty(result_schema()));
        }
        Ok(out)
    }

    /// Remove every row of a table (full refresh), keeping its definition.
    async fn clear(&self, table: &ScdTable) -> Result<()> {
        let delta = table.delta();
        let snapshot = delta.snapshot().map_err(delta_err)?;
        let log_store = delta.log_store();
        let actions: Vec<Action> = snapshot
            .snapshot()
            .file_views(log_store.as_ref(), None)
            .map_ok(|v| Action::Remove(v.remove_action(true)))
            .try_collect()
            .await
            .map_err(delta_err)?;
        CommitBuilder::default()
            .with_actions(actions)
            .build(
                Some(snapshot),
                log_store,
                DeltaOperation::Delete { predicate: None },
            )
            .await
            .map_err(delta_err)?;
        table.refresh().await
    }

    async fn drop_table(&self, name: &TableName, if_exists: bool) -> Result<()> {
        if !self.warehouse.exists(name).await? {
            if if_exists {
                return Ok(());
            }
            return Err(DataFusionError::Plan(format!(
                "streaming table '{name}' does not exist"
            )));
        }
        self.warehouse.delete_table(name).await?;
        self.ctx.deregister_table(TableReference::partial(
            name.schema.clone(),
            name.table.clone(),
        ))?;
        if let Ok(mut tables) = self.tables.lock() {
            tables.remove(name);
        }
        Ok(())
    }

    async fn explain(
        &self,
        statement: CdcStatement,
        analyze: bool,
        verbose: bool,
    ) -> Result<DataFrame> {
        let CdcStatement::Refresh { name, full } = statement else {
            return Err(DataFusionError::NotImplemented(
                "EXPLAIN supports REFRESH STREAMING TABLE among the AUTO CDC statements"
                    .to_string(),
            ));
        };
        let table = self.table(&name).await?;
        table.refresh().await?;
        if full && analyze {
            self.clear(&table).await?;
        }
        let state = self.ctx.state();
        let mut batches = Vec::new();
        for flow in Self::flows_to_run(&table, full) {
            let plan =
                plan_update(&state, Arc::clone(&table), &flow, false, self.clock.now()).await?;
            let explained: LogicalPlan = LogicalPlanBuilder::from(plan)
                .explain(verbose, analyze)?
                .build()?;
            batches.extend(DataFrame::new(state.clone(), explained).collect().await?);
        }
        if batches.is_empty() {
            return Err(DataFusionError::Plan(format!(
                "streaming table '{name}' has no flow to explain"
            )));
        }
        self.ctx.read_batches(batches)
    }
}
