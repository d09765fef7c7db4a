//! Streams inside a flow's source query (SPEC §4.3): each `STREAM t`,
//! `STREAM(t)` or `stream(t)` of the query, with its optional
//! `WITH (readChangeFeed = true | skipChangeCommits = true)`, reads the new
//! versions of the streaming table `t` only, as in a flow's `FROM`.
//!
//! ```text
//!  source query ─► parse ─► find the streams ─► per streaming table: the SQL
//!                                               of what this update reads
//!                  plan ◄── replace each stream by (that SQL) AS <alias>
//! ```
//!
//! A stream of a file folder (a listing table, `CREATE EXTERNAL TABLE …
//! LOCATION 'folder/'`) reads the files not read yet, as a flow's `FROM`
//! does:
//!
//! ```text
//!  STREAM landing ─► (SELECT * FROM landing AS __cdc_stream_files_0) AS landing
//!                    planned, then that scan's source replaced by the new files
//! ```
//!
//! What each stream has read is checkpointed per table, with the update's
//! data ([`SourceCheckpoint::Streams`]); a stream of anything else (a plain
//! table, a view) reads it whole.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DataFusionError, Result, TableReference};
use datafusion::datasource::listing::ListingTable;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::{DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr as SqlExpr, FunctionArg, FunctionArgExpr, Ident, TableAlias, TableFactor,
    Value, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::{dialect_from_str, Dialect};
use datafusion::sql::sqlparser::parser::Parser;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::{col, lit, Expr, LogicalPlanBuilder};

use super::checkpoint::{SourceCheckpoint, StreamCheckpoint};
use super::folders;
use crate::spec::{FlowSource, FlowSpec, StreamRead};
use crate::table::changes::changes_provider;
use crate::table::ScdTable;

/// Name of the scan of a streaming table's change feed.
pub(super) const CHANGES_SCAN: &str = "__cdc_source_changes";

/// One stream of a query: the table as written, how it is read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Stream {
    pub(super) table: String,
    read: StreamRead,
    /// `startingVersion`: where a new stream starts (`None`: at the
    /// table's current snapshot).
    starting: Option<u64>,
}

/// The stream a table factor names, if it is one; an error for a stream
/// with options it does not know.
pub(super) fn stream_of(factor: &TableFactor) -> Option<Result<Stream>> {
    let TableFactor::Table {
        name,
        alias,
        args,
        with_hints,
        ..
    } = factor
    else {
        return None;
    };
    if name.0.len() != 1 || !name.to_string().eq_ignore_ascii_case("stream") {
        return None;
    }
    let table = match (args, alias) {
        // stream(t), STREAM(schema.t)
        (Some(args), _) => match args.args.as_slice() {
            [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => match e {
                // (quoted parts stay quoted: `STREAM("MyT")` is not `myt`)
                SqlExpr::Identifier(i) => i.to_string(),
                SqlExpr::CompoundIdentifier(parts) => parts
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join("."),
                _ => return None,
            },
            _ => return None,
        },
        // STREAM t: parsed as the table `STREAM` aliased `t`
        (None, Some(alias)) => alias.name.to_string(),
        (None, None) => return None,
    };
    Some(options(&table, with_hints).map(|(read, starting)| Stream {
        table,
        read,
        starting,
    }))
}

/// The mode and the starting version `WITH (...)` options give a stream.
fn options(table: &str, hints: &[SqlExpr]) -> Result<(StreamRead, Option<u64>)> {
    let mut read = StreamRead::AppendOnly;
    let mut starting = None;
    for hint in hints {
        let SqlExpr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } = hint
        else {
            return Err(option_error(table, &hint.to_string()));
        };
        let SqlExpr::Identifier(option) = left.as_ref() else {
            return Err(option_error(table, &hint.to_string()));
        };
        // (a second value would silently win over the first)
        let before = hints.iter().take_while(|h| !std::ptr::eq(*h, hint));
        if before.into_iter().any(|h| {
            matches!(h, SqlExpr::BinaryOp { left, .. }
                if matches!(left.as_ref(), SqlExpr::Identifier(o) if o.value.eq_ignore_ascii_case(&option.value)))
        }) {
            return Err(DataFusionError::Plan(format!(
                "STREAM {table}: option {} is given twice",
                option.value
            )));
        }
        if option.value.eq_ignore_ascii_case("startingVersion") {
            let version = match right.as_ref() {
                SqlExpr::Value(v) => match &v.value {
                    Value::Number(n, _) | Value::SingleQuotedString(n) => n.parse::<u64>().ok(),
                    _ => None,
                },
                _ => None,
            };
            let Some(version) = version else {
                return Err(DataFusionError::Plan(format!(
                    "STREAM {table}: startingVersion takes a version (a whole number from 0), not {right}"
                )));
            };
            starting = Some(version);
            continue;
        }
        let on = match right.as_ref() {
            SqlExpr::Value(v) => match &v.value {
                Value::Boolean(b) => *b,
                Value::SingleQuotedString(s) if s.eq_ignore_ascii_case("true") => true,
                Value::SingleQuotedString(s) if s.eq_ignore_ascii_case("false") => false,
                _ => return Err(option_error(table, &hint.to_string())),
            },
            _ => return Err(option_error(table, &hint.to_string())),
        };
        let chosen = if option.value.eq_ignore_ascii_case("readChangeFeed") {
            StreamRead::ChangeFeed
        } else if option.value.eq_ignore_ascii_case("skipChangeCommits") {
            StreamRead::SkipChangeCommits
        } else {
            return Err(option_error(table, &hint.to_string()));
        };
        if on {
            if read != StreamRead::AppendOnly && read != chosen {
                return Err(DataFusionError::Plan(format!(
                    "STREAM {table} takes readChangeFeed or skipChangeCommits, not both"
                )));
            }
            read = chosen;
        }
    }
    Ok((read, starting))
}

fn option_error(table: &str, option: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "STREAM {table}: unknown option {option} (known: readChangeFeed = true, skipChangeCommits = true, startingVersion = n)"
    ))
}

/// The last part of a table name as written (`s."MyT"` → `"MyT"`).
fn last_ident(table: &str) -> Ident {
    let last = table.rsplit('.').next().unwrap_or(table);
    match last.strip_prefix('"').and_then(|l| l.strip_suffix('"')) {
        Some(quoted) => Ident::with_quote('"', quoted),
        None => Ident::new(last),
    }
}

/// Visits every table factor: finds the streams, or replaces them.
struct Streams<'a> {
    found: Vec<Stream>,
    /// Replacement subquery SQL by table as written and how it is read
    /// (the replacing pass).
    replace: Option<&'a BTreeMap<Stream, String>>,
    dialect: &'a dyn Dialect,
}

impl VisitorMut for Streams<'_> {
    type Break = DataFusionError;

    fn post_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<Self::Break> {
        let stream = match stream_of(factor) {
            None => return ControlFlow::Continue(()),
            Some(Err(e)) => return ControlFlow::Break(e),
            Some(Ok(stream)) => stream,
        };
        let Some(replace) = self.replace else {
            self.found.push(stream);
            return ControlFlow::Continue(());
        };
        let Some(sql) = replace.get(&stream) else {
            return ControlFlow::Continue(());
        };
        let alias = match factor {
            // `STREAM t`: its "alias" is the table
            TableFactor::Table {
                alias: Some(alias),
                args: Some(_),
                ..
            } => alias.clone(),
            _ => TableAlias {
                explicit: true,
                name: last_ident(&stream.table),
                columns: vec![],
                at: None,
            },
        };
        let subquery = match Parser::new(self.dialect)
            .try_with_sql(sql)
            .and_then(|mut p| p.parse_query())
        {
            Ok(query) => query,
            Err(e) => return ControlFlow::Break(DataFusionError::SQL(Box::new(e), None)),
        };
        *factor = TableFactor::Derived {
            lateral: false,
            subquery,
            alias: Some(alias),
            sample: None,
        };
        ControlFlow::Continue(())
    }
}

/// A string literal of `s`.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The dialect named `dialect`.
fn dialect(dialect: &str) -> Result<Box<dyn Dialect>> {
    dialect_from_str(dialect)
        .ok_or_else(|| DataFusionError::Plan(format!("unsupported SQL dialect '{dialect}'")))
}

/// Parse `query` and find its streams.
fn parse(query: &str, dialect_name: &str) -> Result<(DFStatement, Vec<Stream>)> {
    let d = dialect(dialect_name)?;
    let mut statement = DFParserBuilder::new(query)
        .with_dialect(d.as_ref())
        .build()?
        .parse_statements()?
        .pop_front()
        .ok_or_else(|| DataFusionError::Plan("empty flow source".to_string()))?;
    let mut visitor = Streams {
        found: vec![],
        replace: None,
        dialect: d.as_ref(),
    };
    if let DFStatement::Statement(ast) = &mut statement {
        if let ControlFlow::Break(e) = ast.visit(&mut visitor) {
            return Err(e);
        }
        crate::values_columns::name_values_columns(ast, dialect_name);
    }
    Ok((statement, visitor.found))
}

/// Replace the streams of `statement` by the subqueries of `replace`.
fn replace_streams(
    statement: &mut DFStatement,
    replace: &BTreeMap<Stream, String>,
    dialect_name: &str,
) -> Result<()> {
    let d = dialect(dialect_name)?;
    let mut visitor = Streams {
        found: vec![],
        replace: Some(replace),
        dialect: d.as_ref(),
    };
    if let DFStatement::Statement(ast) = statement {
        if let ControlFlow::Break(e) = ast.visit(&mut visitor) {
            return Err(e);
        }
    }
    Ok(())
}

/// Check that `flow`, an append flow, reads only incremental sources: its
/// query has streams, each of a streaming table or a file folder (anything
/// else would be appended again at every run).
pub(crate) async fn check_append_sources(state: &SessionState, flow: &FlowSpec) -> Result<()> {
    let FlowSource::Query(query) = &flow.source else {
        return Err(DataFusionError::Plan(format!(
            "append flow '{}': its source must be a query",
            flow.name
        )));
    };
    let (_, found) = parse(query, &flow.dialect)?;
    if found.is_empty() {
        return Err(DataFusionError::Plan(format!(
            "append flow '{}': its query reads no stream, so every run would append the same rows again; read a streaming table or a file folder as STREAM t",
            flow.name
        )));
    }
    for stream in &found {
        let reference = TableReference::parse_str(&stream.table);
        let provider = match state.schema_for_ref(reference.clone()) {
            Ok(schema) => schema.table(reference.table()).await?,
            Err(_) => None,
        };
        if provider.is_none() {
            return Err(DataFusionError::Plan(format!(
                "append flow '{}': STREAM {}: no table of that name (define it before the flow)",
                flow.name, stream.table
            )));
        }
        let incremental = provider
            .as_ref()
            .is_some_and(|p| p.downcast_ref::<ScdTable>().is_some())
            || folder(provider.as_ref(), stream)
                .map_err(|e| in_flow(&flow.name, e))?
                .is_some();
        if !incremental {
            return Err(DataFusionError::Plan(format!(
                "append flow '{}': STREAM {} reads neither a streaming table nor a file folder, so every run would append its rows again",
                flow.name, stream.table
            )));
        }
    }
    Ok(())
}

/// `e`, said of append flow `flow`.
fn in_flow(flow: &str, e: DataFusionError) -> DataFusionError {
    let message = match e {
        DataFusionError::Plan(message) | DataFusionError::NotImplemented(message) => message,
        e => e.to_string(),
    };
    DataFusionError::Plan(format!("append flow '{flow}': {message}"))
}

/// A source query with its streams reading what is new ([`plan_query`]).
pub(super) struct StreamsRead {
    /// The query, each stream replaced by what it reads.
    pub(super) plan: LogicalPlan,
    /// What the streams will have read.
    pub(super) checkpoint: SourceCheckpoint,
    /// When the newest input the streams read arrived (milliseconds since
    /// the epoch): a new file's modification time, or the commit time of a
    /// streaming table's version; `None` when they read nothing new.
    pub(super) newest_input_ms: Option<i64>,
}

/// Plan `query` (a flow's source query, in `dialect`) with each stream of a
/// streaming table reading what is new since `previous`; `None` when the
/// query has no stream (it is read whole).
pub(super) async fn plan_query(
    state: &SessionState,
    query: &str,
    dialect_name: &str,
    previous: Option<SourceCheckpoint>,
) -> Result<Option<StreamsRead>> {
    let (mut statement, found) = parse(query, dialect_name)?;
    if found.is_empty() {
        return Ok(None);
    }
    // how the dialect quotes a column name
    let quote = dialect(dialect_name)?
        .identifier_quote_style("c")
        .unwrap_or('"');
    let (read_before, folders_before) = match previous {
        Some(SourceCheckpoint::Streams { tables, folders }) => (tables, folders),
        _ => (BTreeMap::new(), BTreeMap::new()),
    };
    let mut read_now = BTreeMap::new();
    let mut folders_now = BTreeMap::new();
    let mut replace: BTreeMap<Stream, String> = BTreeMap::new();
    // what the scan under each alias reads: a folder's new files, or a
    // streaming table at the version its checkpoint records
    let mut scans: BTreeMap<String, Arc<dyn TableProvider>> = BTreeMap::new();
    let mut newest_input_ms: Option<i64> = None;
    // the folders' new files, each registered while the query is planned
    let mut files_tables: Vec<(Arc<dyn SchemaProvider>, String)> = Vec::new();
    let planned = async {
        for stream in &found {
            // (two streams of one table may read it in different ways)
            let key = stream.clone();
            if replace.contains_key(&key) {
                continue;
            }
            let reference = TableReference::parse_str(&stream.table);
            let provider = match state.schema_for_ref(reference.clone()) {
                Ok(schema) => schema.table(reference.table()).await?,
                Err(_) => None,
            };
            if let Some(listing) = folder(provider.as_ref(), stream)? {
                // a folder's new files, however the stream reads them
                let read_already = replace
                    .iter()
                    .find(|(other, _)| other.table == stream.table)
                    .map(|(_, sql)| sql.clone());
                if let Some(sql) = read_already {
                    replace.insert(key, sql);
                    continue;
                }
                let empty = BTreeSet::new();
                let read = folders_before.get(&stream.table).unwrap_or(&empty);
                let new = folders::new_files(state, listing, read).await?;
                newest_input_ms = newest_input_ms.max(new.newest_ms);
                // planned as a table of its own while the query is planned,
                // beside the folder's table in its schema (the default schema
                // may take no tables): its columns are the new files' (a
                // column a later file adds is one of them, also under the
                // query's `*`), not the folder's as declared
                let name = format!(
                    "{FILES_PREFIX}{}",
                    FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                );
                let defaults = &state.config_options().catalog;
                let at = reference
                    .clone()
                    .resolve(&defaults.default_catalog, &defaults.default_schema);
                let schema = state.schema_for_ref(reference.clone())?;
                schema.register_table(name.clone(), new.provider)?;
                files_tables.push((schema, name.clone()));
                let qualified = [at.catalog.as_ref(), at.schema.as_ref(), name.as_str()]
                    .map(|part| Ident::with_quote(quote, part).to_string())
                    .join(".");
                replace.insert(key, format!("SELECT * FROM {qualified}"));
                folders_now.insert(stream.table.clone(), new.read);
                continue;
            }
            let Some(table) = provider.as_ref().and_then(|p| p.downcast_ref::<ScdTable>()) else {
                if stream.read == StreamRead::ChangeFeed {
                    return Err(DataFusionError::Plan(format!(
                        "{}: '{}' is not a streaming table, and only streaming tables have a change feed",
                        stream.read.describe(&stream.table),
                        stream.table
                    )));
                }
                // not a streaming table: read whole, as `stream(t)` does
                replace.insert(key, format!("SELECT * FROM {}", stream.table));
                continue;
            };
            // (the lookup brought it to its latest version)
            let version = table.delta().version().unwrap_or(0);
            let table_id = table.delta_table_id();
            let since = match read_before.get(&stream.table) {
                Some(read) => Some(same_table(
                    &stream.table,
                    &read.table_id,
                    read.version,
                    &table_id,
                    version,
                )?),
                None => None,
            };
            let name = quoted(&table.name().to_string());
            // the first commit to read; `None`: a new stream starts at the
            // table's current snapshot
            let first = match (since, stream.starting) {
                (Some(read), _) => Some(read + 1),
                (None, Some(starting)) => Some(check_starting(&stream.table, starting, version)?),
                (None, None) => None,
            };
            if first.is_none_or(|from| from <= version) {
                newest_input_ms = newest_input_ms.max(table.commit_time(version).await?);
            }
            let sql = match (stream.read, first) {
                // the snapshot as inserts at its version, as its change feed
                // would have them
                (StreamRead::ChangeFeed, None) => {
                    let alias = format!("{SCAN_PREFIX}{}", scans.len());
                    scans.insert(alias.clone(), Arc::new(table.pinned()));
                    let at_micros = table.commit_time(version).await?.unwrap_or(0) * 1000;
                    format!(
                        "SELECT *, 'insert' AS _change_type, CAST({version} AS BIGINT) AS \
                         _commit_version, arrow_cast({at_micros}, 'Timestamp(Microsecond, \
                         Some(\"UTC\"))') AS _commit_timestamp FROM {} AS {alias}",
                        stream.table
                    )
                }
                (StreamRead::ChangeFeed, Some(from)) => {
                    if from > version {
                        format!("SELECT * FROM table_changes({name}, 0) WHERE false")
                    } else {
                        // (to `version`: what the checkpoint records)
                        let undone = restored_away(table, from, version).await?;
                        format!(
                            "SELECT * FROM table_changes({name}, {from}, {version}){}",
                            not_in_versions(" WHERE", &undone)
                        )
                    }
                }
                (_, None) => {
                    // the version the checkpoint records, whatever later lookups
                    // (this query's planning among them) load
                    let alias = format!("{SCAN_PREFIX}{}", scans.len());
                    scans.insert(alias.clone(), Arc::new(table.pinned()));
                    format!("SELECT * FROM {} AS {alias}", stream.table)
                }
                (_, Some(from)) if from > version => {
                    format!("SELECT * FROM {} WHERE false", stream.table)
                }
                (mode, Some(from)) => {
                    let skipped =
                        versions_not_appended(state, table, from, version, mode, &stream.table)
                            .await?;
                    // the columns a read of the table shows (an SCD 2 target's
                    // `__start_at` / `__end_at` among them)
                    let columns: Vec<String> = TableProvider::schema(table)
                        .fields()
                        .iter()
                        .map(|f| Ident::with_quote(quote, f.name()).to_string())
                        .collect();
                    let mut sql = format!(
                        "SELECT {} FROM table_changes({name}, {from}, {version}) \
                         WHERE _change_type = 'insert'",
                        columns.join(", ")
                    );
                    sql.push_str(&not_in_versions(" AND", &skipped));
                    sql
                }
            };
            replace.insert(key, sql);
            read_now.insert(stream.table.clone(), StreamCheckpoint { table_id, version });
        }
        replace_streams(&mut statement, &replace, dialect_name)?;
        state.statement_to_plan(statement).await
    }
    .await;
    for (schema, name) in files_tables {
        schema.deregister_table(&name)?;
    }
    let plan = scan_providers(planned?, scans)?;
    let checkpoint = SourceCheckpoint::Streams {
        tables: read_now,
        folders: folders_now,
    };
    Ok(Some(StreamsRead {
        plan,
        checkpoint,
        newest_input_ms,
    }))
}

/// The version `read` a checkpoint recorded of the table `name` (then of
/// id `read_id`), checked against the table now (`table_id`, at
/// `version`): a table dropped and created again since is another table,
/// whose versions say nothing of what was read, so the stream fails
/// rather than mix the two tables' rows (as Delta streams do).
pub(super) fn same_table(
    name: &str,
    read_id: &str,
    read: u64,
    table_id: &str,
    version: u64,
) -> Result<u64> {
    if read_id != table_id || read > version {
        return Err(DataFusionError::Plan(format!(
            "'{name}' is not the table read last (version {read} of table id \
             {read_id}; it is now table id {table_id}): it was dropped and created again \
             since; REFRESH … FULL of the reading table reads it from the start"
        )));
    }
    Ok(read)
}

/// The first version a new stream with `startingVersion = starting` reads
/// of `table`, whose latest version is `version`: an error for a version
/// it does not have yet.
pub(super) fn check_starting(table: &str, starting: u64, version: u64) -> Result<u64> {
    if starting > version {
        return Err(DataFusionError::Plan(format!(
            "STREAM {table} WITH (startingVersion = {starting}): '{table}' has versions 0 to \
             {version}, not {starting}"
        )));
    }
    Ok(starting)
}

/// Alias of the scan a stream becomes, before its source is replaced by
/// what the stream reads (then a number).
const SCAN_PREFIX: &str = "__cdc_stream_scan_";

/// Name under which a folder's new files are planned (then a number, from
/// [`FILES`]: unique in the process, as updates run at once).
const FILES_PREFIX: &str = "__cdc_stream_files_";

/// The next number of [`FILES_PREFIX`].
static FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The folder (a listing table) `provider` is, if it is one that a stream
/// reads by its new files; an error for a stream of a folder that cannot be
/// read that way.
fn folder<'a>(
    provider: Option<&'a Arc<dyn TableProvider>>,
    stream: &Stream,
) -> Result<Option<&'a ListingTable>> {
    let Some(listing) = provider.and_then(|p| p.downcast_ref::<ListingTable>()) else {
        return Ok(None);
    };
    if stream.read == StreamRead::ChangeFeed {
        // (the caller's error for anything that is not a streaming table)
        return Ok(None);
    }
    if !listing.options().table_partition_cols.is_empty() {
        return Err(DataFusionError::NotImplemented(format!(
            "{}: '{}' is a partitioned folder, which a stream cannot read by its new files yet; \
             read it without STREAM in an AUTO CDC flow's FROM",
            stream.read.describe(&stream.table),
            stream.table
        )));
    }
    Ok(Some(listing))
}

/// `plan` with the scan under each alias of `scans` reading that provider
/// (a folder's new files, a pinned streaming table) instead of the table
/// the query names; the schemas above it recomputed (the new files'
/// columns are all nullable).
fn scan_providers(
    plan: LogicalPlan,
    scans: BTreeMap<String, Arc<dyn TableProvider>>,
) -> Result<LogicalPlan> {
    if scans.is_empty() {
        return Ok(plan);
    }
    // (a stream read twice in the query is one alias, scanned twice)
    let mut unused: BTreeSet<&String> = scans.keys().collect();
    let plan = plan
        .transform_up_with_subqueries(|node| {
            if let LogicalPlan::SubqueryAlias(alias) = &node {
                if let (Some((name, provider)), LogicalPlan::TableScan(scan)) = (
                    scans.get_key_value(alias.alias.table()),
                    alias.input.as_ref(),
                ) {
                    unused.remove(name);
                    let scan = LogicalPlanBuilder::scan(
                        scan.table_name.clone(),
                        provider_as_source(Arc::clone(provider)),
                        None,
                    )?
                    .alias(alias.alias.clone())?
                    .build()?;
                    return Ok(Transformed::yes(scan));
                }
            }
            Ok(Transformed::yes(node.recompute_schema()?))
        })?
        .data;
    match unused.first() {
        None => Ok(plan),
        Some(alias) => Err(DataFusionError::Internal(format!(
            "the scan of a stream ({alias}) is not in the planned query"
        ))),
    }
}

/// The versions of `table` from `from` on that updated or deleted rows
/// rather than only adding them (their change feed has other rows than
/// `insert`), in order.
pub(super) async fn changing_versions(
    state: &SessionState,
    table: &ScdTable,
    from: u64,
) -> Result<Vec<i64>> {
    let changing = LogicalPlanBuilder::scan(
        CHANGES_SCAN,
        provider_as_source(changes_provider(table, from, None)?),
        None,
    )?
    .filter(col("_change_type").not_eq(lit("insert")))?
    .aggregate(vec![col("_commit_version")], Vec::<Expr>::new())?
    .sort(vec![col("_commit_version").sort(true, false)])?
    .build()?;
    let batches = DataFrame::new(state.clone(), changing).collect().await?;
    let mut versions: Vec<i64> = Vec::new();
    for batch in &batches {
        let column = arrow::compute::cast(batch.column(0), &arrow::datatypes::DataType::Int64)?;
        versions.extend(column.as_primitive::<Int64Type>().iter().flatten());
    }
    Ok(versions)
}

/// The versions from `from` on (to `version`) of `table` that a `RESTORE`
/// among them undid: one back to a version the stream had read (`from - 1`
/// or later) makes the table what it was before them, so the stream reads
/// none of them — a failed full refresh's clear and the restore after it,
/// an update restored away leave its readers as they were. A restore to an
/// earlier version, or to one undone so, is read as the change it is.
pub(super) async fn restored_away(
    table: &ScdTable,
    from: u64,
    version: u64,
) -> Result<BTreeSet<i64>> {
    let mut undone = BTreeSet::new();
    for (restore, to) in crate::table::event::restores(&table.delta(), from..=version).await? {
        if to + 1 >= from && !undone.contains(&(to as i64)) {
            undone.extend((to + 1..=restore).map(|v| v as i64));
        }
    }
    Ok(undone)
}

/// The versions from `from` to `version` of `table` whose inserts an
/// append-only read (`mode`) of it as `name` leaves out: those that updated
/// or deleted rows (an error when `mode` is `AppendOnly`; skipped under
/// `skipChangeCommits`) and those a restore undid ([`restored_away`]).
pub(super) async fn versions_not_appended(
    state: &SessionState,
    table: &ScdTable,
    from: u64,
    version: u64,
    mode: StreamRead,
    name: &str,
) -> Result<BTreeSet<i64>> {
    let undone = restored_away(table, from, version).await?;
    let mut skipped: BTreeSet<i64> = changing_versions(state, table, from)
        .await?
        .into_iter()
        .filter(|v| !undone.contains(v))
        .collect();
    if let (StreamRead::AppendOnly, Some(first)) = (mode, skipped.first()) {
        return Err(not_append_only(mode, name, *first));
    }
    skipped.extend(undone);
    Ok(skipped)
}

/// `{joiner} _commit_version NOT IN (…)` of `versions`; nothing when none.
fn not_in_versions(joiner: &str, versions: &BTreeSet<i64>) -> String {
    if versions.is_empty() {
        return String::new();
    }
    let list: Vec<String> = versions.iter().map(i64::to_string).collect();
    format!("{joiner} _commit_version NOT IN ({})", list.join(", "))
}

/// The error of an append-only stream of `name` meeting version `version`,
/// which updated or deleted rows.
pub(super) fn not_append_only(mode: StreamRead, name: &str, version: i64) -> DataFusionError {
    DataFusionError::Plan(format!(
        "{}: commit {version} of '{name}' updated or deleted rows, and the stream is append-only; \
         read it WITH (skipChangeCommits = true) to skip such commits, or \
         WITH (readChangeFeed = true) to read their changes",
        mode.describe(name)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;

    fn streams(sql: &str) -> Result<Vec<Stream>> {
        let mut statement = Parser::new(&GenericDialect {})
            .try_with_sql(sql)
            .and_then(|mut p| p.parse_statement())
            .map_err(|e| DataFusionError::SQL(Box::new(e), None))?;
        let mut visitor = Streams {
            found: vec![],
            replace: None,
            dialect: &GenericDialect {},
        };
        match statement.visit(&mut visitor) {
            ControlFlow::Break(e) => Err(e),
            ControlFlow::Continue(()) => Ok(visitor.found),
        }
    }

    #[test]
    fn the_three_stream_forms_and_their_options_are_found() -> Result<()> {
        let found = streams(
            "SELECT * FROM STREAM a WITH (readChangeFeed = true, startingVersion = 2) \
             JOIN STREAM(s.b) WITH (skipChangeCommits = 'true') ON true \
             JOIN stream(c) AS c2 ON true JOIN d ON true",
        )?;
        assert_eq!(
            found,
            [
                Stream {
                    table: "a".into(),
                    read: StreamRead::ChangeFeed,
                    starting: Some(2),
                },
                Stream {
                    table: "s.b".into(),
                    read: StreamRead::SkipChangeCommits,
                    starting: None,
                },
                Stream {
                    table: "c".into(),
                    read: StreamRead::AppendOnly,
                    starting: None,
                },
            ]
        );
        let err = streams("SELECT * FROM STREAM a WITH (startingTimestamp = 1)").unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown option startingTimestamp = 1"),
            "{err}"
        );
        Ok(())
    }
}
