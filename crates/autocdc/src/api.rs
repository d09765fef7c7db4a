//! The Rust API, mirroring the Python `create_auto_cdc_flow` parameters.
//!
//! ```no_run
//! # async fn demo(session: &datafusion_autocdc::CdcSession) -> datafusion::error::Result<()> {
//! session.create_streaming_table("target").await?;
//! let metrics = session
//!     .create_auto_cdc_flow("target", "cdc_source")
//!     .keys(["id"])
//!     .sequence_by("seq")
//!     .apply_as_deletes("op = 'DELETE'")
//!     .except_column_list(["op", "seq"])
//!     .await?;
//! println!("{} rows upserted", metrics.num_upserted_rows);
//! # Ok(()) }
//! ```

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use std::sync::Arc;

use datafusion::catalog::TableFunctionArgs;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::{lit, Expr};
use datafusion::prelude::DataFrame;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;

pub use crate::metrics::{PipelineUpdate, RestoreMetrics, TableStatus, TableUpdate, UpdateMetrics};
use crate::session::{CdcSession, SnapshotFunction};
use crate::spec::expectations::{Expectation, OnViolation};
use crate::spec::{ColumnSelection, FlowSource, FlowSpec, ScdType, SequenceBy};
pub use crate::sql::RestoreTo;
use crate::sql::{parse_cdc_statement, CdcStatement, CreateStreamingTable, FullRefresh};
use crate::table::TableName;

/// Builder of `create_streaming_table` (the Python parameters `schema`,
/// `comment`, `table_properties` and `expect_all*`); `.await` creates the
/// table.
#[must_use = "a table builder does nothing until awaited"]
pub struct CreateStreamingTableBuilder<'a> {
    session: &'a CdcSession,
    name: String,
    schema: Option<String>,
    comment: Option<String>,
    properties: Vec<(String, String)>,
    expectations: Vec<Expectation>,
}

impl CreateStreamingTableBuilder<'_> {
    /// `comment`: the table's description (`COMMENT '…'`), in the Delta
    /// table readers see.
    pub fn comment(mut self, comment: impl Into<String>) -> Self {
        self.comment = Some(comment.into());
        self
    }

    /// `expect_all`: expectations `(name, condition)` whose failing rows are
    /// kept and counted.
    pub fn expect_all<I, K, V>(self, expectations: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.expect(expectations, OnViolation::Keep)
    }

    /// `expect_all_or_drop`: expectations whose failing rows are dropped.
    pub fn expect_all_or_drop<I, K, V>(self, expectations: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.expect(expectations, OnViolation::DropRow)
    }

    /// `expect_all_or_fail`: expectations whose failing rows fail the update.
    pub fn expect_all_or_fail<I, K, V>(self, expectations: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.expect(expectations, OnViolation::FailUpdate)
    }

    fn expect<I, K, V>(mut self, expectations: I, on_violation: OnViolation) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.expectations.extend(
            expectations
                .into_iter()
                .map(|(name, condition)| Expectation {
                    name: name.into(),
                    condition: condition.into(),
                    on_violation,
                    dialect: "generic".into(),
                }),
        );
        self
    }

    /// Declare the columns, as SQL: `"id BIGINT, name STRING, amount DECIMAL(10, 2)"`.
    pub fn schema(mut self, columns: impl Into<String>) -> Self {
        self.schema = Some(columns.into());
        self
    }

    /// Add table properties (`TBLPROPERTIES`, e.g. `autocdc.buckets`).
    pub fn table_properties<I, K, V>(mut self, properties: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.properties
            .extend(properties.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }
}

impl<'a> IntoFuture for CreateStreamingTableBuilder<'a> {
    type Output = Result<()>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let name = TableName::parse(&self.name)?;
            let declared = match &self.schema {
                // the columns are read by the statement parser, as in SQL
                // (under a stand-in name: the table's is already parsed)
                Some(columns) => {
                    let sql = format!("CREATE OR REFRESH STREAMING TABLE t ({columns})");
                    let refused = |why: String| {
                        DataFusionError::Plan(format!(
                            "create_streaming_table('{}'): schema '{columns}' is not a column list ('name TYPE, ...'): {why}",
                            self.name
                        ))
                    };
                    match parse_cdc_statement(&sql, "generic", true) {
                        // (only columns and constraints: a query, a flow, a
                        // comment or properties after them would be lost)
                        Ok(Some(CdcStatement::CreateStreamingTable(parsed)))
                            if parsed.query.is_some()
                                || parsed.flow.is_some()
                                || parsed.comment.is_some()
                                || !parsed.properties.is_empty() =>
                        {
                            return Err(refused(
                                "it goes on after the columns (a query, a flow, a comment or \
                                 properties are arguments of their own)"
                                    .into(),
                            ))
                        }
                        Ok(Some(CdcStatement::CreateStreamingTable(parsed))) => {
                            CreateStreamingTable { name, ..parsed }
                        }
                        Ok(_) => return Err(refused("not a table declaration".into())),
                        Err(e) => return Err(refused(e.to_string())),
                    }
                }
                None => CreateStreamingTable {
                    name,
                    or_refresh: true,
                    if_not_exists: true,
                    columns: vec![],
                    properties: vec![],
                    dialect: "generic".into(),
                    query: None,
                    flow: None,
                    expectations: vec![],
                    comment: None,
                },
            };
            let mut statement = declared;
            statement.properties.extend(self.properties);
            if self.comment.is_some() {
                statement.comment = self.comment;
            }
            for expectation in self.expectations {
                // (refused now, as `CONSTRAINT … EXPECT (…)` is when parsed)
                let parsed = Parser::new(&GenericDialect {})
                    .try_with_sql(&expectation.condition)
                    .and_then(|mut p| {
                        let expr = p.parse_expr()?;
                        p.expect_token(&Token::EOF)?;
                        Ok(expr)
                    });
                if let Err(e) = parsed {
                    return Err(DataFusionError::Plan(format!(
                        "create_streaming_table('{}'): expectation '{}': '{}' is not a condition: {e}",
                        self.name, expectation.name, expectation.condition
                    )));
                }
                if statement
                    .expectations
                    .iter()
                    .any(|e| e.name == expectation.name)
                {
                    return Err(DataFusionError::Plan(format!(
                        "create_streaming_table('{}'): expectation '{}' is defined twice",
                        self.name, expectation.name
                    )));
                }
                statement.expectations.push(expectation);
            }
            self.session.create_table(statement).await
        })
    }
}

/// Builder of an AUTO CDC flow; `.await` creates the flow and runs its first
/// update.
#[must_use = "a flow builder does nothing until awaited"]
pub struct AutoCdcFlowBuilder<'a> {
    session: &'a CdcSession,
    spec: FlowSpec,
}

impl CdcSession {
    /// `create_streaming_table(name)`: declare a target; `.await` creates it
    /// (kept if it exists, like `CREATE OR REFRESH STREAMING TABLE`). Its
    /// schema comes from its first flow unless [`CreateStreamingTableBuilder::schema`]
    /// declares one.
    pub fn create_streaming_table(&self, name: &str) -> CreateStreamingTableBuilder<'_> {
        CreateStreamingTableBuilder {
            session: self,
            name: name.to_string(),
            schema: None,
            comment: None,
            properties: Vec::new(),
            expectations: Vec::new(),
        }
    }

    /// `create_auto_cdc_flow(target=..., source=...)`: start building a flow
    /// reading the table or view `source` — or, written
    /// `debezium('path')`, Debezium change events (see
    /// [`AutoCdcFlowBuilder::source_debezium`]).
    pub fn create_auto_cdc_flow(&self, target: &str, source: &str) -> AutoCdcFlowBuilder<'_> {
        let name = target.rsplit('.').next().unwrap_or(target).to_string();
        let source = match debezium_path(source) {
            Some(path) => FlowSource::Debezium { path },
            None => FlowSource::Table(table_sql(source)),
        };
        AutoCdcFlowBuilder {
            session: self,
            spec: FlowSpec::new(name, target, source),
        }
    }

    /// Run every flow of `target` again (`REFRESH STREAMING TABLE`).
    pub async fn refresh_streaming_table(
        &self,
        target: &str,
        full: bool,
    ) -> Result<Vec<UpdateMetrics>> {
        let batches = self.refresh(&TableName::parse(target)?, full).await?;
        UpdateMetrics::from_batches(&batches)
    }

    /// `scd2_as_of(table, business_time)`: the versions of an SCD 2 target
    /// valid at `business_time`, one row per key, without the interval
    /// columns (SPEC §4.9). The point takes the sequence's type (an integer,
    /// a timestamp, …; see [`ScalarValue`]'s `From` implementations).
    pub async fn scd2_as_of(
        &self,
        table: &str,
        business_time: impl Into<ScalarValue>,
    ) -> Result<DataFrame> {
        self.function_frame("scd2_as_of", table, [business_time.into()])
            .await
    }

    /// `bitemporal_as_of(table, business_time [, system_time])`: what a
    /// BITEMPORAL target recorded at `system_time` (`None`: the current
    /// belief) about `business_time`, one row per key (SPEC §4.9).
    pub async fn bitemporal_as_of(
        &self,
        table: &str,
        business_time: impl Into<ScalarValue>,
        system_time: Option<ScalarValue>,
    ) -> Result<DataFrame> {
        let points: Vec<ScalarValue> = std::iter::once(business_time.into())
            .chain(system_time)
            .collect();
        self.function_frame("bitemporal_as_of", table, points).await
    }

    /// `table_as_of(table, at)`: a streaming table as of a commit version
    /// (an integer) or a commit time (a timestamp).
    pub async fn table_as_of(&self, table: &str, at: impl Into<ScalarValue>) -> Result<DataFrame> {
        self.function_frame("table_as_of", table, [at.into()]).await
    }

    /// The rows of table function `function` called on `table` (first
    /// brought to its latest version, as a statement naming it would) and
    /// `args`.
    async fn function_frame(
        &self,
        function: &str,
        table: &str,
        args: impl IntoIterator<Item = ScalarValue>,
    ) -> Result<DataFrame> {
        // (a name that is no table: the function says so)
        let _ = self
            .context()
            .table_provider(datafusion::common::TableReference::from(table))
            .await;
        let args: Vec<Expr> = std::iter::once(lit(table))
            .chain(args.into_iter().map(lit))
            .collect();
        let state = self.context().state();
        let provider = self
            .context()
            .table_function(function)?
            .create_table_provider_with_args(TableFunctionArgs::new(&args, &state))?;
        self.context().read_table(provider)
    }
}

fn names<I, S>(cols: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    cols.into_iter().map(Into::into).collect()
}

/// Setters shared by the flow builders (the Python parameter names).
macro_rules! flow_setters {
    () => {
        /// `name`: the flow name (default: the target's name).
        pub fn name(mut self, name: impl Into<String>) -> Self {
            self.spec.name = name.into();
            self
        }
        /// `keys`.
        pub fn keys<I: IntoIterator<Item = S>, S: Into<String>>(mut self, keys: I) -> Self {
            self.spec.keys = names(keys);
            self
        }
        /// `column_list`.
        pub fn column_list<I: IntoIterator<Item = S>, S: Into<String>>(
            mut self,
            columns: I,
        ) -> Self {
            self.spec.columns = ColumnSelection::Only(names(columns));
            self
        }
        /// `except_column_list`.
        pub fn except_column_list<I: IntoIterator<Item = S>, S: Into<String>>(
            mut self,
            columns: I,
        ) -> Self {
            self.spec.columns = ColumnSelection::Except(names(columns));
            self
        }
        /// `stored_as_scd_type`.
        pub fn stored_as_scd_type(mut self, scd: ScdType) -> Self {
            self.spec.stored_as_scd_type = scd;
            self
        }
        /// `track_history_column_list`.
        pub fn track_history_column_list<I: IntoIterator<Item = S>, S: Into<String>>(
            mut self,
            columns: I,
        ) -> Self {
            self.spec.track_history = Some(ColumnSelection::Only(names(columns)));
            self
        }
        /// `track_history_except_column_list`.
        pub fn track_history_except_column_list<I: IntoIterator<Item = S>, S: Into<String>>(
            mut self,
            columns: I,
        ) -> Self {
            self.spec.track_history = Some(ColumnSelection::Except(names(columns)));
            self
        }
    };
}

/// A table name given to a builder as SQL: as written when it reads as a
/// table reference (`users`, `s.t`, `"Mixed"`); else the name itself,
/// quoted (`Src Tbl` would read as table `Src` aliased `Tbl`).
fn table_sql(name: &str) -> String {
    let reference = Parser::new(&GenericDialect {})
        .try_with_sql(name)
        .and_then(|mut p| {
            p.parse_object_name(false)?;
            p.expect_token(&Token::EOF)
        });
    match reference {
        Ok(_) => name.to_string(),
        Err(_) => format!("\"{}\"", name.replace('"', "\"\"")),
    }
}

/// The path of a source written `debezium('path')` (any case, spaces
/// around), if it is one.
fn debezium_path(source: &str) -> Option<String> {
    let s = source.trim();
    let open = s.find('(')?;
    if !s[..open].trim().eq_ignore_ascii_case("debezium") || !s.ends_with(')') {
        return None;
    }
    let inner = s[open + 1..s.len() - 1].trim();
    let quoted = inner.strip_prefix('\'')?.strip_suffix('\'')?;
    Some(quoted.replace("''", "'"))
}

impl AutoCdcFlowBuilder<'_> {
    flow_setters!();

    /// Read a SQL query instead of a table.
    pub fn source_query(mut self, sql: impl Into<String>) -> Self {
        self.spec.source = FlowSource::Query(sql.into());
        self
    }
    /// Read Debezium change events (JSON Lines) from a file or a folder:
    /// the files not read yet at each update; the delete, truncate and
    /// sequence clauses and the columns derive from the envelope unless set
    /// (SQL `FROM debezium('path')`).
    pub fn source_debezium(mut self, path: impl Into<String>) -> Self {
        self.spec.source = FlowSource::Debezium { path: path.into() };
        self
    }
    /// `PREVIOUS KEYS (e1, ...)`: SQL expressions of the source giving each
    /// event's previous key (one per key column); an upsert whose previous
    /// key differs from its key also deletes the previous key.
    pub fn previous_keys<I: IntoIterator<Item = S>, S: Into<String>>(mut self, exprs: I) -> Self {
        self.spec.previous_keys = names(exprs);
        self
    }
    /// `sequence_by`: a column.
    pub fn sequence_by(mut self, column: impl Into<String>) -> Self {
        self.spec.sequence_by = Some(SequenceBy::Column(column.into()));
        self
    }
    /// `sequence_by=struct(...)`: several columns, ordered left to right.
    pub fn sequence_by_struct<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        columns: I,
    ) -> Self {
        self.spec.sequence_by = Some(SequenceBy::Struct(names(columns)));
        self
    }
    /// `apply_as_deletes`: SQL condition.
    pub fn apply_as_deletes(mut self, condition: impl Into<String>) -> Self {
        self.spec.apply_as_deletes = Some(condition.into());
        self
    }
    /// `apply_as_truncates`: SQL condition.
    pub fn apply_as_truncates(mut self, condition: impl Into<String>) -> Self {
        self.spec.apply_as_truncates = Some(condition.into());
        self
    }
    /// `ignore_null_updates`: NULLs in an upsert keep the current value of
    /// every non-key column.
    pub fn ignore_null_updates(mut self, on: bool) -> Self {
        self.spec.ignore_null_updates = on.then_some(ColumnSelection::All);
        self
    }
    /// `ignore_null_updates_column_list`: only these columns keep their value
    /// on NULL; the others take NULL.
    pub fn ignore_null_updates_column_list<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        columns: I,
    ) -> Self {
        self.spec.ignore_null_updates = Some(ColumnSelection::Only(names(columns)));
        self
    }
    /// `ignore_null_updates_except_column_list`: all columns but these keep
    /// their value on NULL.
    pub fn ignore_null_updates_except_column_list<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        columns: I,
    ) -> Self {
        self.spec.ignore_null_updates = Some(ColumnSelection::Except(names(columns)));
        self
    }
    /// `columns_to_update`: a source column of type `List<Utf8>` naming the
    /// target columns each upsert writes.
    pub fn columns_to_update(mut self, column: impl Into<String>) -> Self {
        self.spec.columns_to_update = Some(column.into());
        self
    }
    /// `system_sequence_by`: the system-time column of a BITEMPORAL target
    ///.
    pub fn system_sequence_by(mut self, column: impl Into<String>) -> Self {
        self.spec.system_sequence_by = Some(column.into());
        self
    }
    /// `once`.
    pub fn once(mut self, once: bool) -> Self {
        self.spec.once = once;
        self
    }
    /// The definition built so far.
    pub fn spec(&self) -> &FlowSpec {
        &self.spec
    }
}

impl<'a> IntoFuture for AutoCdcFlowBuilder<'a> {
    type Output = Result<UpdateMetrics>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let batches = self.session.create_flow(self.spec).await?;
            UpdateMetrics::from_batches(&batches)?
                .into_iter()
                .next()
                .ok_or_else(|| {
                    datafusion::common::DataFusionError::Internal(
                        "flow run returned no metrics".into(),
                    )
                })
        })
    }
}

/// Builder of an AUTO CDC FROM SNAPSHOT flow (`create_auto_cdc_from_snapshot_flow`);
/// `.await` creates the flow and processes every available snapshot.
#[must_use = "a flow builder does nothing until awaited"]
pub struct SnapshotFlowBuilder<'a> {
    session: &'a CdcSession,
    spec: FlowSpec,
    function: Option<SnapshotFunction>,
}

impl CdcSession {
    /// `create_auto_cdc_from_snapshot_flow(target=...)`: start building a
    /// snapshot flow; give it a `source`/`snapshot_query` or a
    /// `next_snapshot_and_version` function.
    pub fn create_auto_cdc_from_snapshot_flow(&self, target: &str) -> SnapshotFlowBuilder<'_> {
        let name = target.rsplit('.').next().unwrap_or(target).to_string();
        let source = FlowSource::Snapshot {
            query: String::new(),
            version_query: None,
        };
        SnapshotFlowBuilder {
            session: self,
            spec: FlowSpec::new(name, target, source),
            function: None,
        }
    }
}

impl SnapshotFlowBuilder<'_> {
    flow_setters!();

    /// `once`: process the available snapshots when created and again on a
    /// full refresh only (a backfill beside change flows).
    pub fn once(mut self, once: bool) -> Self {
        self.spec.once = once;
        self
    }

    /// `source`: a table read whole at every update (periodic snapshots).
    pub fn source(self, table: &str) -> Self {
        self.snapshot_query(format!("SELECT * FROM {}", table_sql(table)))
    }
    /// The snapshot as a SQL query (may use `current_snapshot_version()`).
    pub fn snapshot_query(mut self, sql: impl Into<String>) -> Self {
        let version_query = match &self.spec.source {
            FlowSource::Snapshot { version_query, .. } => version_query.clone(),
            _ => None,
        };
        self.spec.source = FlowSource::Snapshot {
            query: sql.into(),
            version_query,
        };
        self
    }
    /// The next version as a SQL query (may use `last_snapshot_version()`).
    pub fn version_query(mut self, sql: impl Into<String>) -> Self {
        let query = match &self.spec.source {
            FlowSource::Snapshot { query, .. } => query.clone(),
            _ => String::new(),
        };
        self.spec.source = FlowSource::Snapshot {
            query,
            version_query: Some(sql.into()),
        };
        self
    }
    /// `snapshot_and_version`: a function returning, for the last processed
    /// version (`None` at first), the next snapshot and its version, or
    /// `None` when there is none. It lives in this process: a new process
    /// registers it again with [`CdcSession::register_snapshot_function`].
    pub fn next_snapshot_and_version<V, F>(mut self, next: F) -> Self
    where
        V: Into<ScalarValue> + TryFrom<ScalarValue, Error = DataFusionError> + 'static,
        F: Fn(Option<V>) -> Result<Option<(DataFrame, V)>> + Send + Sync + 'static,
    {
        let function: SnapshotFunction = Arc::new(move |last: Option<ScalarValue>| {
            let last = last.map(V::try_from).transpose()?;
            Ok(next(last)?.map(|(df, v)| (df, v.into())))
        });
        self.spec.source = FlowSource::SnapshotFunction;
        self.function = Some(function);
        self
    }
}

impl<'a> IntoFuture for SnapshotFlowBuilder<'a> {
    type Output = Result<Vec<UpdateMetrics>>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            if matches!(&self.spec.source, FlowSource::Snapshot { query, .. } if query.is_empty()) {
                return Err(DataFusionError::Plan(format!(
                    "flow '{}': a snapshot flow needs a source, a snapshot query or a snapshot function",
                    self.spec.name
                )));
            }
            let batches = match self.function {
                Some(function) => {
                    self.session
                        .create_function_flow(self.spec, function)
                        .await?
                }
                None => self.session.create_flow(self.spec).await?,
            };
            UpdateMetrics::from_batches(&batches)
        })
    }
}

/// Builder of an append flow (`create_append_flow`, the reference's
/// `@dp.append_flow`); `.await` creates the flow and runs it once.
#[must_use = "a flow builder does nothing until awaited"]
pub struct AppendFlowBuilder<'a> {
    session: &'a CdcSession,
    target: String,
    name: Option<String>,
    source: Option<AppendSource>,
    once: bool,
}

/// What an append flow appends.
enum AppendSource {
    /// A table: its new rows (`STREAM t`); all of it for a `once` flow.
    Table(String),
    /// The rows of a query.
    Query(String),
}

impl CdcSession {
    /// `create_append_flow(target=...)`: start building an append flow into
    /// `target`; give it a `source` table or a `query`.
    pub fn create_append_flow(&self, target: &str) -> AppendFlowBuilder<'_> {
        AppendFlowBuilder {
            session: self,
            target: target.to_string(),
            name: None,
            source: None,
            once: false,
        }
    }
}

impl AppendFlowBuilder<'_> {
    /// `name`: the flow name (default: the target's name).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// `source`: a streaming table whose new rows each run appends (`STREAM
    /// t`); with `once`, any table, appended whole once.
    pub fn source(mut self, table: impl Into<String>) -> Self {
        self.source = Some(AppendSource::Table(table.into()));
        self
    }
    /// The rows to append as a SQL query (reading streams as `STREAM t`).
    pub fn query(mut self, sql: impl Into<String>) -> Self {
        self.source = Some(AppendSource::Query(sql.into()));
        self
    }
    /// `once`: append when created and on a full refresh only.
    pub fn once(mut self, once: bool) -> Self {
        self.once = once;
        self
    }
}

impl<'a> IntoFuture for AppendFlowBuilder<'a> {
    type Output = Result<UpdateMetrics>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let target = TableName::parse(&self.target)?;
            let name = self.name.unwrap_or_else(|| target.table.clone());
            let query = match self.source {
                Some(AppendSource::Table(table)) if self.once => {
                    format!("SELECT * FROM {}", table_sql(&table))
                }
                Some(AppendSource::Table(table)) => {
                    format!("SELECT * FROM STREAM {}", table_sql(&table))
                }
                Some(AppendSource::Query(sql)) => sql,
                None => {
                    return Err(DataFusionError::Plan(format!(
                        "append flow '{name}': give a source table or a query"
                    )))
                }
            };
            let mut spec = FlowSpec::append(name, target.to_string(), query, "generic".into());
            spec.once = self.once;
            let batches = self.session.create_flow(spec).await?;
            UpdateMetrics::from_batches(&batches)?
                .into_iter()
                .next()
                .ok_or_else(|| DataFusionError::Internal("flow run returned no metrics".into()))
        })
    }
}

/// Builder of a pipeline update (`REFRESH PIPELINE`); `.await` runs it.
#[must_use = "a pipeline update does nothing until awaited"]
pub struct UpdatePipelineBuilder<'a> {
    session: &'a CdcSession,
    schema: Option<String>,
    full: FullRefresh,
    only_changed: bool,
}

impl CdcSession {
    /// Update every streaming table of the warehouse once, each after the
    /// tables it reads (`REFRESH PIPELINE`).
    pub fn update_pipeline(&self) -> UpdatePipelineBuilder<'_> {
        UpdatePipelineBuilder {
            session: self,
            schema: None,
            full: FullRefresh::None,
            only_changed: false,
        }
    }
}

impl UpdatePipelineBuilder<'_> {
    /// Only the tables of `schema`.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }
    /// Only the tables with something new to read (a continuous pipeline's
    /// cycles after its first); the others are `Unchanged`.
    pub fn only_changed(mut self, only_changed: bool) -> Self {
        self.only_changed = only_changed;
        self
    }
    /// Every table from scratch (`FULL`).
    pub fn full_refresh_all(mut self) -> Self {
        self.full = FullRefresh::All;
        self
    }
    /// These tables and every table reading them from scratch (`FULL (t, …)`).
    pub fn full_refresh<I: IntoIterator<Item = S>, S: AsRef<str>>(
        mut self,
        tables: I,
    ) -> Result<Self> {
        let tables = tables
            .into_iter()
            .map(|t| TableName::parse(t.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        self.full = FullRefresh::Tables(tables);
        Ok(self)
    }
}

impl<'a> IntoFuture for UpdatePipelineBuilder<'a> {
    type Output = Result<PipelineUpdate>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            self.session
                .run_pipeline(self.schema.as_deref(), &self.full, self.only_changed)
                .await
        })
    }
}
