//! `CdcSession`: a DataFusion session on a warehouse of streaming tables whose
//! `sql()` understands the AUTO CDC statements and hands every other
//! statement to DataFusion unchanged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::MemorySchemaProvider;
use datafusion::common::{DataFusionError, Result, ScalarValue, TableReference};
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
use datafusion::prelude::{DataFrame, SessionContext};
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake_core::kernel::Action;
use deltalake_core::kernel::StructType;
use deltalake_core::protocol::DeltaOperation;
use futures::TryStreamExt;

use crate::clock::Clock;
use crate::config::AutoCdcConfig;
use crate::fold::columns::{INTERNAL_PREFIX, KIND_COL};
use crate::functions::{
    MisplacedSnapshotVersion, SnapshotVersionFunction, StreamFunction, TableAsOfFunction,
    TableChangesFunction, TableRegistry, CURRENT_SNAPSHOT_VERSION, LAST_SNAPSHOT_VERSION,
};
use crate::physical::commit_exec::result_batch;
use crate::physical::commit_exec::result_schema;
use crate::pipeline::dml::PipelineDml;
use crate::pipeline::{plan_update, Planning, UpdateSource};
use crate::spec::resolve::storage_type;
use crate::spec::resolve::{plan_source, written_at_value};
use crate::spec::shared_target::check_joins_target;
use crate::spec::FlowSource;
use crate::spec::FlowSpec;
use crate::sql::{parse_cdc_statement, CdcStatement, CreateStreamingTable};
use crate::table::bucket::{bucket_field, BUCKET_COL, DEFAULT_BUCKETS};
use crate::table::delta_err;
use crate::table::meta::TableDecl;
use crate::table::properties::{
    last_version_property, BUCKETS_PROPERTY, CHANGE_DATA_FEED_PROPERTY, DELETION_VECTORS_PROPERTY,
    FLOW_KEY_PREFIX, SNAPSHOT_PROPERTY_PREFIX, SNAPSHOT_WATERMARK_PROPERTY,
    SOURCE_CHECKPOINT_PREFIX, TABLE_KEY,
};
use crate::table::{ScdTable, TableName, Warehouse};
use crate::AutoCdc;
use deltalake_core::kernel::MetadataExt;

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
        let state = AutoCdc::install(
            SessionStateBuilder::new()
                .with_config(crate::config::with_autocdc_options(config.session_config))
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
                schema,
            )),
        );
        let session = Self {
            ctx,
            warehouse,
            tables,
            clock: Arc::clone(&config.clock),
            snapshot_functions: Mutex::new(HashMap::new()),
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
                let batches = self.create_flow(*spec).await?;
                self.ctx.read_batches(batches)
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
        let table = ScdTable::load(&self.warehouse, name.clone())
            .await?
            .into_shared(Arc::new(PipelineDml));
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
        // every update writes its net change as Delta CDC files
        config.push((
            CHANGE_DATA_FEED_PROPERTY.to_string(),
            Some("true".to_string()),
        ));
        let deletion_vectors =
            crate::config::autocdc_options(self.ctx.state().config()).deletion_vectors;
        if deletion_vectors {
            config.push((
                DELETION_VECTORS_PROPERTY.to_string(),
                Some("true".to_string()),
            ));
        }
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
            .with_actions([Action::Protocol(table_protocol(deletion_vectors)?)])
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

    pub(crate) async fn create_flow(&self, spec: FlowSpec) -> Result<Vec<RecordBatch>> {
        let target = TableName::parse(&spec.target)?;
        let table = self.table(&target).await.map_err(|e| {
            let msg = match e {
                DataFusionError::Plan(m) => m,
                other => other.to_string(),
            };
            DataFusionError::Plan(format!("flow '{}': INTO: {msg}", spec.name))
        })?;
        let meta = table.meta();
        let target_columns: Vec<String> = meta
            .user_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        check_joins_target(&spec, meta.flows.values(), &target, &target_columns)?;
        self.run_flow(&table, &spec, true).await
    }

    /// Register the Rust function a snapshot flow reads
    /// (`next_snapshot_and_version`); needed again in every new process.
    pub fn register_snapshot_function(
        &self,
        target: &TableName,
        flow: &str,
        function: SnapshotFunction,
    ) {
        if let Ok(mut f) = self.snapshot_functions.lock() {
            f.insert((target.clone(), flow.to_string()), function);
        }
    }

    /// Run a snapshot flow: every available version in ascending order, each
    /// committed on its own. One result row per version.
    async fn run_snapshot_flow(
        &self,
        table: &Arc<ScdTable>,
        spec: &FlowSpec,
        register: bool,
    ) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        let mut register = register;
        loop {
            let meta = table.meta();
            let last = match (
                meta.properties.get(&last_version_property(&spec.name)),
                &meta.sequence_type,
            ) {
                (Some(text), Some(t)) => Some(ScalarValue::try_from_string(text.clone(), t)?),
                _ => None,
            };
            let now = self.clock.now();
            let state = self.ctx.state();
            if !out.is_empty()
                && matches!(
                    &spec.source,
                    FlowSource::Snapshot {
                        version_query: None,
                        ..
                    }
                )
            {
                break; // periodic: one snapshot per update
            }
            let next = self
                .next_snapshot(table, spec, last.clone(), meta.sequence_type.clone(), now)
                .await?;
            let Some((plan, version)) = next else { break };
            let version = match &meta.sequence_type {
                Some(t) if version.data_type() != *t => {
                    if !(version.data_type().is_integer() && t.is_integer()) {
                        return Err(DataFusionError::Plan(format!(
                            "flow '{}': the snapshot version type {} differs from the target's sequence type {t}",
                            spec.name,
                            version.data_type()
                        )));
                    }
                    version.cast_to(t)?
                }
                _ => version,
            };
            if let Some(last) = &last {
                if version.partial_cmp(last) != Some(std::cmp::Ordering::Greater) {
                    return Err(DataFusionError::Execution(format!(
                        "flow '{}': out-of-order snapshot version {version}: the last processed version is {last}; nothing was applied",
                        spec.name
                    )));
                }
            }
            let update = plan_update(
                &state,
                Arc::clone(table),
                spec,
                register,
                now,
                UpdateSource::Snapshot {
                    plan: Box::new(plan),
                    version,
                },
                Planning::Adaptive,
            )
            .await?;
            out.extend(
                DataFrame::new(state, update)
                    .collect()
                    .await?
                    .into_iter()
                    .filter(|b| b.num_rows() > 0),
            );
            register = false;
        }
        if register {
            // no version to process yet: the definition still lands
            self.commit_definition(table, spec).await?;
        }
        if out.is_empty() {
            out.push(result_batch(&spec.name, Default::default(), None)?);
        }
        Ok(out)
    }

    /// The next snapshot of a snapshot flow and its version, if any.
    async fn next_snapshot(
        &self,
        table: &ScdTable,
        spec: &FlowSpec,
        last: Option<ScalarValue>,
        sequence_type: Option<DataType>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<(LogicalPlan, ScalarValue)>> {
        match &spec.source {
            FlowSource::Snapshot {
                query,
                version_query: None,
            } => {
                let version = written_at_value(now.timestamp_micros());
                let plan = self
                    .plan_snapshot_query(spec, query, "version", &version)
                    .await?;
                Ok(Some((plan, version)))
            }
            FlowSource::Snapshot {
                query,
                version_query: Some(vq),
            } => match self.next_version(spec, vq, last, sequence_type).await? {
                None => Ok(None),
                Some((column, version)) => {
                    let plan = self
                        .plan_snapshot_query(spec, query, &column, &version)
                        .await?;
                    Ok(Some((plan, version)))
                }
            },
            FlowSource::SnapshotFunction => {
                let function = self
                    .snapshot_functions
                    .lock()
                    .ok()
                    .and_then(|f| f.get(&(table.name().clone(), spec.name.clone())).cloned())
                    .ok_or_else(|| {
                        DataFusionError::Plan(format!(
                            "flow '{}': reads a Rust snapshot function that is not registered in this session",
                            spec.name
                        ))
                    })?;
                Ok(function(last)?.map(|(df, version)| (df.into_unoptimized_plan(), version)))
            }
            _ => Err(DataFusionError::Internal(format!(
                "flow '{}' is not a snapshot flow",
                spec.name
            ))),
        }
    }

    /// The update plan of a flow's next run (its next snapshot, for snapshot
    /// flows). With [`Planning::ReadNothing`] no data is read: a versioned
    /// snapshot flow's version query is planned, not run, and the snapshot
    /// planned at a NULL version of its type.
    async fn plan_flow_for_explain(
        &self,
        table: &Arc<ScdTable>,
        flow: &FlowSpec,
        planning: Planning,
    ) -> Result<LogicalPlan> {
        let state = self.ctx.state();
        let now = self.clock.now();
        if !flow.source.is_snapshot() {
            return plan_update(
                &state,
                Arc::clone(table),
                flow,
                false,
                now,
                UpdateSource::Changes,
                planning,
            )
            .await;
        }
        let meta = table.meta();
        let last = match (
            meta.properties.get(&last_version_property(&flow.name)),
            &meta.sequence_type,
        ) {
            (Some(text), Some(t)) => Some(ScalarValue::try_from_string(text.clone(), t)?),
            _ => None,
        };
        let next = match (planning, &flow.source) {
            (
                Planning::ReadNothing,
                FlowSource::Snapshot {
                    query,
                    version_query: Some(version_query),
                },
            ) => {
                let (_, plan) = self
                    .plan_version_query(flow, version_query, last, meta.sequence_type.clone())
                    .await?;
                let field = plan.schema().field(0);
                let version = ScalarValue::try_from(field.data_type())?;
                let snapshot = self
                    .plan_snapshot_query(flow, query, field.name(), &version)
                    .await?;
                Some((snapshot, version))
            }
            _ => {
                self.next_snapshot(table, flow, last, meta.sequence_type.clone(), now)
                    .await?
            }
        };
        let (plan, version) = next.ok_or_else(|| {
            DataFusionError::Plan(format!(
                "flow '{}': no newer snapshot version to explain",
                flow.name
            ))
        })?;
        plan_update(
            &state,
            Arc::clone(table),
            flow,
            false,
            now,
            UpdateSource::Snapshot {
                plan: Box::new(plan),
                version,
            },
            planning,
        )
        .await
    }

    /// Commit a flow definition without data.
    async fn commit_definition(&self, table: &ScdTable, spec: &FlowSpec) -> Result<()> {
        let delta = table.delta();
        let snapshot = delta.snapshot().map_err(delta_err)?;
        let json = serde_json::to_string(spec).map_err(delta_err)?;
        let md = snapshot
            .metadata()
            .clone()
            .add_config_key(format!("{FLOW_KEY_PREFIX}{}", spec.name), json)
            .map_err(delta_err)?;
        crate::table::commit_builder()
            .with_actions(vec![Action::Metadata(md)])
            .build(
                Some(snapshot),
                delta.log_store(),
                DeltaOperation::SetTableProperties {
                    properties: Default::default(),
                },
            )
            .await
            .map_err(delta_err)?;
        table.refresh().await
    }

    /// The next version of a versioned snapshot flow: run the version query
    /// with `last_snapshot_version()` bound. `None` when it returns no row.
    async fn next_version(
        &self,
        spec: &FlowSpec,
        version_query: &str,
        last: Option<ScalarValue>,
        sequence_type: Option<DataType>,
    ) -> Result<Option<(String, ScalarValue)>> {
        let context = |e: DataFusionError| {
            DataFusionError::Plan(format!("flow '{}': WITH VERSION: {e}", spec.name))
        };
        let (state, plan) = self
            .plan_version_query(spec, version_query, last, sequence_type)
            .await?;
        let column = plan.schema().field(0).name().clone();
        let batches = DataFrame::new(state, plan)
            .collect()
            .await
            .map_err(context)?;
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        match rows {
            0 => Ok(None),
            1 => {
                let batch = batches
                    .iter()
                    .find(|b| b.num_rows() == 1)
                    .ok_or_else(|| DataFusionError::Internal("lost row".into()))?;
                let version = ScalarValue::try_from_array(batch.column(0), 0)?;
                if version.is_null() {
                    return Ok(None);
                }
                Ok(Some((column, version)))
            }
            n => Err(context(DataFusionError::Plan(format!(
                "the version query returned {n} rows; it must return at most one"
            )))),
        }
    }

    /// Plan (not run) a flow's version query, with `last_snapshot_version()`
    /// bound to `last`; the plan has one column.
    async fn plan_version_query(
        &self,
        spec: &FlowSpec,
        version_query: &str,
        last: Option<ScalarValue>,
        sequence_type: Option<DataType>,
    ) -> Result<(SessionState, LogicalPlan)> {
        let context = |e: DataFusionError| {
            DataFusionError::Plan(format!("flow '{}': WITH VERSION: {e}", spec.name))
        };
        // the function's column takes the name and type of the query's output:
        // plan once with a guess, again with what the query produced
        let mut column = (
            "version".to_string(),
            sequence_type.unwrap_or(DataType::Int64),
        );
        let mut plan = None;
        for _ in 0..2 {
            let mut state = self.ctx.state();
            state.register_udtf(
                LAST_SNAPSHOT_VERSION,
                Arc::new(SnapshotVersionFunction::new(
                    LAST_SNAPSHOT_VERSION,
                    column.0.clone(),
                    column.1.clone(),
                    last.clone(),
                )),
            );
            let p = plan_source(
                &state,
                &FlowSource::Query(version_query.to_string()),
                &spec.dialect,
            )
            .await
            .map_err(context)?;
            let field = p.schema().field(0);
            let produced = (field.name().clone(), field.data_type().clone());
            let done = produced == column;
            column = produced;
            plan = Some((state, p));
            if done {
                break;
            }
        }
        let Some((state, plan)) = plan else {
            return Err(DataFusionError::Internal(format!(
                "flow '{}': the version query was not planned",
                spec.name
            )));
        };
        if plan.schema().fields().len() != 1 {
            return Err(context(DataFusionError::Plan(
                "the version query must return one column".into(),
            )));
        }
        Ok((state, plan))
    }

    /// Plan the snapshot query with `current_snapshot_version()` bound.
    async fn plan_snapshot_query(
        &self,
        spec: &FlowSpec,
        query: &str,
        column: &str,
        version: &ScalarValue,
    ) -> Result<LogicalPlan> {
        let mut state = self.ctx.state();
        state.register_udtf(
            CURRENT_SNAPSHOT_VERSION,
            Arc::new(SnapshotVersionFunction::new(
                CURRENT_SNAPSHOT_VERSION,
                column.to_string(),
                version.data_type(),
                Some(version.clone()),
            )),
        );
        plan_source(&state, &FlowSource::Query(query.to_string()), &spec.dialect)
            .await
            .map_err(|e| DataFusionError::Plan(format!("flow '{}': FROM SNAPSHOT: {e}", spec.name)))
    }

    /// Run one update of `spec`; an error that does not say which flow
    /// failed (a source that cannot be read, say) is given that context.
    async fn run_flow(
        &self,
        table: &Arc<ScdTable>,
        spec: &FlowSpec,
        register: bool,
    ) -> Result<Vec<RecordBatch>> {
        let named = format!("flow '{}'", spec.name);
        self.run_flow_unnamed(table, spec, register)
            .await
            .map_err(|e| {
                if e.to_string().contains(&named) {
                    e
                } else {
                    e.context(format!(
                        "{named}: the update of '{}' failed; nothing was committed",
                        table.name()
                    ))
                }
            })
    }

    async fn run_flow_unnamed(
        &self,
        table: &Arc<ScdTable>,
        spec: &FlowSpec,
        register: bool,
    ) -> Result<Vec<RecordBatch>> {
        if spec.source.is_snapshot() {
            return self.run_snapshot_flow(table, spec, register).await;
        }
        let state = self.ctx.state();
        let plan = plan_update(
            &state,
            Arc::clone(table),
            spec,
            register,
            self.clock.now(),
            UpdateSource::Changes,
            Planning::Adaptive,
        )
        .await?;
        let batches: Vec<RecordBatch> = DataFrame::new(state, plan)
            .collect()
            .await?
            .into_iter()
            .filter(|b| b.num_rows() > 0)
            .collect();
        if batches.is_empty() {
            return Err(DataFusionError::Internal(format!(
                "flow '{}' returned no result",
                spec.name
            )));
        }
        Ok(batches)
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
            out.extend(self.run_flow(&table, &flow, false).await?);
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
        let mut actions: Vec<Action> = snapshot
            .snapshot()
            .file_views(log_store.as_ref(), None)
            .map_ok(|v| Action::Remove(v.remove_action(true)))
            .try_collect()
            .await
            .map_err(delta_err)?;
        // forget what the flows read: they read their sources (and every
        // snapshot version) again
        let mut metadata = snapshot.metadata().clone();
        let checkpoints: Vec<String> = metadata
            .configuration()
            .keys()
            .filter(|k| {
                k.starts_with(SOURCE_CHECKPOINT_PREFIX)
                    || k.starts_with(SNAPSHOT_PROPERTY_PREFIX)
                    || k.as_str() == SNAPSHOT_WATERMARK_PROPERTY
            })
            .cloned()
            .collect();
        if !checkpoints.is_empty() {
            for key in checkpoints {
                metadata = metadata.remove_config_key(&key).map_err(delta_err)?;
            }
            actions.push(Action::Metadata(metadata));
        }
        crate::table::commit_builder()
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
            // EXPLAIN plans without reading; EXPLAIN ANALYZE runs the update
            let planning = if analyze {
                Planning::Adaptive
            } else {
                Planning::ReadNothing
            };
            let plan = self.plan_flow_for_explain(&table, &flow, planning).await?;
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

/// Protocol of a new streaming table: table features (reader 3, writer 7)
/// with `timestampNtz`, so that flows can store `TIMESTAMP` (without time
/// zone) columns and sequences whose types are fixed only by the first update,
/// and `changeDataFeed`.
fn table_protocol(deletion_vectors: bool) -> Result<deltalake_core::kernel::Protocol> {
    let mut readers = vec!["timestampNtz"];
    let mut writers = vec!["timestampNtz", "changeDataFeed"];
    if deletion_vectors {
        readers.push("deletionVectors");
        writers.push("deletionVectors");
    }
    serde_json::from_value(serde_json::json!({
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": readers,
        "writerFeatures": writers,
    }))
    .map_err(delta_err)
}
