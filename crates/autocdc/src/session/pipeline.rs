//! Pipelines (SPEC §4.7): the streaming tables of a warehouse (or of one
//! schema) updated once each, every table after the tables it reads
//! (`REFRESH PIPELINE`, [`CdcSession::update_pipeline`]); flows that would
//! close a cycle are refused when defined.
//!
//! | table                               | in the update                            |
//! |-------------------------------------|------------------------------------------|
//! | its tables upstream all succeeded   | refreshed (`FULL` when asked, see below) |
//! | its refresh fails                   | `failed`, with the error's first line    |
//! | an upstream table failed or skipped | `skipped`, naming it                     |
//!
//! Tables that do not read one another update concurrently, at most
//! `autocdc.pipeline_max_concurrent_updates` at once; the result lists them
//! in the pipeline's order.
//!
//! `FULL` refreshes every table from scratch; `FULL (t, …)` those tables
//! and every table that reads them, directly or not. Every commit of the
//! update carries its `update_id` in the event log.
//!
//! An update of what changed (continuous mode, after its first cycle)
//! refreshes only the tables that have something new to read, judged just
//! before their turn (so an upstream commit of the same update counts):
//!
//! | flow's source                                   | new when                          |
//! |-------------------------------------------------|-----------------------------------|
//! | checkpointed: a streaming table, a stream, a file folder | its checkpoint would move |
//! | versioned snapshots (`WITH VERSION`)            | the version query offers a newer version |
//! | read whole (a query without streams, an in-memory table), periodic snapshots, snapshot functions | never (such flows run on full updates only) |
//! | `ONCE` flows                                    | never                             |
//!
//! Other tables are `unchanged`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, TableReference};
use datafusion::datasource::ViewTable;
use datafusion::logical_expr::LogicalPlan;
use futures::stream::{FuturesUnordered, StreamExt};

use super::CdcSession;
use crate::metrics::{run_count_fields, PipelineUpdate, TableStatus, TableUpdate, UpdateMetrics};
use crate::pipeline::dependencies::{flow_reads, through_views, PipelineGraph, Views};
use crate::pipeline::source::{in_from_clause, plan_changes};
use crate::spec::{FlowSource, FlowSpec};
use crate::sql::FullRefresh;
use crate::table::event::in_pipeline_update;
use crate::table::properties::last_version_property;
use crate::table::rejects::{rejects_table_name, takes_rejects};
use crate::table::ScdTable;
use crate::table::TableName;

/// What [`CdcSession::define`] did with a statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Defined {
    /// It ran (a new table or flow, or any other statement).
    Applied,
    /// The table or flow it defines exists as defined: nothing ran.
    Unchanged(String),
}

impl CdcSession {
    /// Run one statement of a pipeline's definitions idempotently (`autocdc
    /// run -f defs.sql`): a `CREATE [OR REFRESH] STREAMING TABLE` of an
    /// existing table is declared again as `CREATE OR REFRESH` declares it
    /// (its expectations become the table's; other columns or properties
    /// are an error naming them) without an update; a `CREATE FLOW` of an
    /// existing flow with the same definition and a `CREATE SCHEMA` of an
    /// existing schema do nothing; a flow defined differently from its
    /// stored definition is an error naming it and what differs; anything
    /// else runs as `sql` runs it.
    pub async fn define(&self, sql: &str) -> Result<Defined> {
        let (dialect, normalize) = self.parser_options();
        let flow = match crate::sql::parse_cdc_statement(sql, &dialect, normalize)? {
            Some(crate::sql::CdcStatement::CreateFlow(spec)) => Some(*spec),
            Some(crate::sql::CdcStatement::CreateStreamingTable(c)) => {
                if !self.warehouse.exists(&c.name).await? {
                    let created = match self.sql(sql).await {
                        Ok(df) => df.collect().await.map(|_| ()),
                        Err(e) => Err(e),
                    };
                    match created {
                        Ok(()) => return Ok(Defined::Applied),
                        // another process created it meanwhile: declared
                        // again below, as a table that was there
                        Err(e)
                            if e.to_string().contains(&format!(
                                "streaming table '{}' already exists",
                                c.name
                            )) => {}
                        Err(e) => return Err(e),
                    }
                }
                if self.declare_existing(&c, true).await? {
                    // (new expectations: the flows below are unchanged)
                    if c.query.is_none() && c.flow.is_none() {
                        return Ok(Defined::Applied);
                    }
                }
                let flow = c.query.clone().map(|query| {
                    FlowSpec::append(
                        c.name.table.clone(),
                        c.name.to_string(),
                        query,
                        c.dialect.clone(),
                    )
                });
                match flow.or(c.flow.map(|f| *f)) {
                    Some(flow) => Some(flow),
                    None => return Ok(Defined::Unchanged(format!("streaming table '{}'", c.name))),
                }
            }
            _ => None,
        };
        let Some(flow) = flow else {
            if let Some(schema) = self.existing_schema_created(sql, &dialect, normalize) {
                return Ok(Defined::Unchanged(format!("schema '{schema}'")));
            }
            self.sql(sql).await?.collect().await?;
            return Ok(Defined::Applied);
        };
        let target = TableName::parse(&flow.target)?;
        if let Some(defined) = self.stored_as_defined(&target, &flow, normalize).await? {
            return Ok(defined);
        }
        match self.sql(sql).await {
            Ok(df) => df.collect().await.map(|_| Defined::Applied),
            // another process defined it meanwhile (its commit came first):
            // as if it had been there
            Err(e) => match self.stored_as_defined(&target, &flow, normalize).await {
                Ok(Some(defined)) => Ok(defined),
                _ => Err(e),
            },
        }
    }

    /// `Unchanged` when `target` holds `flow` as defined, an error saying
    /// what differs when it holds another definition of it, `None` when it
    /// has no such flow.
    pub(super) async fn stored_as_defined(
        &self,
        target: &TableName,
        flow: &FlowSpec,
        normalize: bool,
    ) -> Result<Option<Defined>> {
        if !self.warehouse.exists(target).await? {
            return Ok(None);
        }
        let table = self.table(target).await?;
        table.refresh().await?;
        let Some(stored) = table.meta().flows.get(&flow.name).cloned() else {
            return Ok(None);
        };
        let name = &flow.name;
        let (stored, flow) = (
            crate::sql::spelled_flow(&stored, normalize),
            crate::sql::spelled_flow(flow, normalize),
        );
        if stored == flow {
            return Ok(Some(Defined::Unchanged(format!("flow '{name}'"))));
        }
        Err(DataFusionError::Plan(format!(
            "flow '{name}': its definition differs from the one '{target}' holds ({}); \
             a flow keeps its definition: DROP FLOW {name} and define it again (it then \
             starts afresh), or drop the table",
            crate::sql::flow_differences(&stored, &flow),
        )))
    }

    /// The streaming table and the flow statement `sql` defines, if any
    /// (`CREATE STREAMING TABLE t … [AS query | FLOW …]` defines the table
    /// and the flow named after it; `CREATE FLOW f … INTO t` the flow).
    pub fn defined_by(&self, sql: &str) -> Result<(Option<TableName>, Option<String>)> {
        let (dialect, normalize) = self.parser_options();
        Ok(
            match crate::sql::parse_cdc_statement(sql, &dialect, normalize)? {
                Some(crate::sql::CdcStatement::CreateFlow(spec)) => (None, Some(spec.name)),
                Some(crate::sql::CdcStatement::CreateStreamingTable(c)) => {
                    let flow =
                        (c.query.is_some() || c.flow.is_some()).then(|| c.name.table.clone());
                    (Some(c.name), flow)
                }
                _ => (None, None),
            },
        )
    }

    /// The flows of `tables` whose names are not among `flows`: flows a
    /// definitions file no longer names, which still run (`DROP FLOW`
    /// removes one).
    pub async fn flows_besides(
        &self,
        tables: &BTreeSet<TableName>,
        flows: &BTreeSet<String>,
    ) -> Result<Vec<(TableName, String)>> {
        let mut besides = Vec::new();
        for name in tables {
            if !self.warehouse.exists(name).await? {
                continue;
            }
            // (a table that cannot be opened is a failed row of the
            // pipeline update, not a reason to stop the run)
            let Ok(table) = self.table(name).await else {
                continue;
            };
            for flow in table.meta().flows.into_keys() {
                if !flows.contains(&flow) {
                    besides.push((name.clone(), flow));
                }
            }
        }
        Ok(besides)
    }

    /// The schema `sql` creates, when it is a `CREATE SCHEMA` of one that
    /// exists (in a definitions file, one that exists as defined).
    fn existing_schema_created(&self, sql: &str, dialect: &str, normalize: bool) -> Option<String> {
        let name = crate::sql::created_schema(sql, dialect, normalize)?;
        let state = self.ctx.state();
        let catalog = state.config().options().catalog.default_catalog.clone();
        let exists = self
            .ctx
            .catalog(&catalog)
            .is_some_and(|c| c.schema(&name).is_some());
        exists.then_some(name)
    }

    /// The pipeline of the warehouse's streaming tables (of `schema` only).
    async fn pipeline_graph(&self, schema: Option<&str>) -> Result<PipelineGraph> {
        Ok(self.pipeline_graph_and_unopened(schema).await?.0)
    }

    /// [`Self::pipeline_graph`], and the tables that cannot be opened (each
    /// with why), which are no part of it: one such table does not keep
    /// the others from updating, nor flows from being defined.
    async fn pipeline_graph_and_unopened(
        &self,
        schema: Option<&str>,
    ) -> Result<(PipelineGraph, Vec<(TableName, DataFusionError)>)> {
        let mut unopened = Vec::new();
        let mut tables = Vec::new();
        let mut reads = BTreeSet::new();
        // a target's rejects table is written by the target's updates: not a
        // table of the pipeline, and reading it is reading the target
        let mut rejects: Views = Views::new();
        for name in self.warehouse.list_tables().await? {
            if schema.is_some_and(|s| name.schema != s) {
                continue;
            }
            let table = match self.table(&name).await {
                Ok(table) => table,
                Err(e) => {
                    unopened.push((name, e));
                    continue;
                }
            };
            let meta = table.meta();
            if takes_rejects(&meta.properties) {
                rejects.insert(rejects_table_name(&name), BTreeSet::from([name.clone()]));
            }
            let flows: Vec<FlowSpec> = meta.flows.into_values().collect();
            for flow in &flows {
                reads.extend(flow_reads(flow)?);
            }
            tables.push((name, flows));
        }
        tables.retain(|(name, flows)| !(flows.is_empty() && rejects.contains_key(name)));
        if let Some(schema) = schema.filter(|_| tables.is_empty()) {
            // (a schema without streaming tables is an empty pipeline; a
            // name that is no schema at all, a mistake)
            let state = self.ctx.state();
            let catalog = state.config().options().catalog.default_catalog.clone();
            let known = self
                .ctx
                .catalog(&catalog)
                .is_some_and(|c| c.schema(schema).is_some());
            if !known {
                return Err(DataFusionError::Plan(format!(
                    "REFRESH PIPELINE {schema}: there is no schema '{schema}'"
                )));
            }
        }
        let members: BTreeSet<TableName> = tables.iter().map(|(n, _)| n.clone()).collect();
        let mut views = self.views_among(reads, &members).await?;
        views.extend(rejects);
        let graph =
            PipelineGraph::with_views(tables.iter().map(|(n, f)| (n.clone(), f.iter())), &views)?;
        Ok((graph, unopened))
    }

    /// The session's views among `names` (none of `tables`, the
    /// streaming tables), each with the relations its query reads, and
    /// the views among those in turn.
    async fn views_among(
        &self,
        names: BTreeSet<TableName>,
        tables: &BTreeSet<TableName>,
    ) -> Result<Views> {
        let mut views = Views::new();
        let mut seen = BTreeSet::new();
        let mut queue: VecDeque<TableName> = names.into_iter().collect();
        while let Some(name) = queue.pop_front() {
            if tables.contains(&name) || !seen.insert(name.clone()) {
                continue;
            }
            let reference = TableReference::partial(name.schema.as_str(), name.table.as_str());
            let Ok(provider) = self.ctx.table_provider(reference).await else {
                continue;
            };
            let Some(view) = provider.downcast_ref::<ViewTable>() else {
                continue;
            };
            let mut read = BTreeSet::new();
            view.logical_plan().apply_with_subqueries(|node| {
                if let LogicalPlan::TableScan(scan) = node {
                    let parts: Vec<String> = match &scan.table_name {
                        TableReference::Bare { table } => vec![table.to_string()],
                        TableReference::Partial { schema, table } => {
                            vec![schema.to_string(), table.to_string()]
                        }
                        TableReference::Full {
                            catalog,
                            schema,
                            table,
                        } => vec![catalog.to_string(), schema.to_string(), table.to_string()],
                    };
                    read.extend(TableName::from_parts(&parts).ok());
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
            queue.extend(read.iter().cloned());
            views.insert(name, read);
        }
        Ok(views)
    }

    /// Refuse `flow` into `target` if the tables it reads read `target`.
    pub(super) async fn refuse_cycles(&self, flow: &FlowSpec, target: &TableName) -> Result<()> {
        let reads = flow_reads(flow)?;
        if reads.is_empty() {
            return Ok(());
        }
        let graph = self.pipeline_graph(None).await?;
        let members: BTreeSet<TableName> = graph.upstream.keys().cloned().collect();
        let views = self.views_among(reads.clone(), &members).await?;
        let reads = through_views(reads, &views);
        for upstream in &reads {
            let path = if upstream == target {
                Some(vec![target.clone()])
            } else if graph.upstream.contains_key(upstream) {
                graph.path(target, upstream)
            } else {
                None
            };
            if let Some(mut path) = path {
                path.push(target.clone());
                let path: Vec<String> = path.iter().map(|t| t.to_string()).collect();
                return Err(DataFusionError::Plan(format!(
                    "flow '{}': reading '{upstream}' into '{target}' closes a cycle ({}): a pipeline's tables cannot read themselves",
                    flow.name,
                    path.join(" → ")
                )));
            }
        }
        Ok(())
    }

    /// The flows of `table` with anything new to read (see the module docs).
    async fn flows_with_new_data(&self, table: &ScdTable) -> Result<BTreeSet<String>> {
        let mut flows = BTreeSet::new();
        table.refresh().await?;
        let meta = table.meta();
        let state = self.ctx.state();
        for flow in meta.flows.values().filter(|f| !f.once) {
            match &flow.source {
                FlowSource::Snapshot {
                    version_query: Some(version_query),
                    ..
                } => {
                    let last = match (
                        meta.properties.get(&last_version_property(&flow.name)),
                        &meta.sequence_type,
                    ) {
                        (Some(text), Some(t)) => Some(crate::stored_value::from_text(text, t)?),
                        _ => None,
                    };
                    let next = self
                        .next_version(
                            flow,
                            version_query,
                            last.clone(),
                            meta.sequence_type.clone(),
                        )
                        .await?;
                    let newer = match (next, &last) {
                        (Some(_), None) => true,
                        (Some((_, next)), Some(last)) => {
                            next.partial_cmp(last) == Some(std::cmp::Ordering::Greater)
                        }
                        (None, _) => false,
                    };
                    if newer {
                        flows.insert(flow.name.clone());
                    }
                }
                FlowSource::Snapshot { .. } | FlowSource::SnapshotFunction => {}
                FlowSource::Table(_) | FlowSource::Query(_) | FlowSource::Debezium { .. } => {
                    let read = plan_changes(&state, flow, &meta)
                        .await
                        .map_err(|e| in_from_clause(&flow.name, e))?;
                    if let Some((key, value)) = read.checkpoint {
                        if meta.properties.get(&key) != Some(&value) {
                            flows.insert(flow.name.clone());
                        }
                    }
                }
            }
        }
        Ok(flows)
    }

    /// Update every table of the pipeline once (see the module docs);
    /// `only_changed`: only the tables with something new to read.
    pub(crate) async fn run_pipeline(
        &self,
        schema: Option<&str>,
        full: &FullRefresh,
        only_changed: bool,
    ) -> Result<PipelineUpdate> {
        let (graph, unopened) = self.pipeline_graph_and_unopened(schema).await?;
        let order = graph.order()?;
        let from_scratch: BTreeSet<TableName> = match full {
            FullRefresh::None => BTreeSet::new(),
            FullRefresh::All => order.iter().cloned().collect(),
            FullRefresh::Tables(tables) => {
                let mut set = BTreeSet::new();
                for t in tables {
                    if let Some((_, e)) = unopened.iter().find(|(name, _)| name == t) {
                        return Err(DataFusionError::Plan(format!(
                            "REFRESH PIPELINE … FULL ({t}): '{t}' cannot be opened, so it cannot be refreshed: {}",
                            first_line(e)
                        )));
                    }
                    if !graph.upstream.contains_key(t) {
                        return Err(DataFusionError::Plan(format!(
                            "REFRESH PIPELINE … FULL ({t}): '{t}' is not a streaming table of the pipeline"
                        )));
                    }
                    set.insert(t.clone());
                    set.extend(graph.downstream_of(t));
                }
                set
            }
        };
        let update_id = uuid::Uuid::new_v4().to_string();
        let limit = crate::config::autocdc_options(self.ctx.state().config())
            .pipeline_max_concurrent_updates
            .max(1);
        // each table starts once every table it reads is done, at most
        // `limit` at once, in the pipeline's order
        let mut pending: VecDeque<TableName> = order.iter().cloned().collect();
        let mut done: BTreeMap<TableName, TableUpdate> = BTreeMap::new();
        let mut running = FuturesUnordered::new();
        loop {
            while running.len() < limit {
                let ready = pending.iter().position(|t| {
                    graph
                        .upstream
                        .get(t)
                        .is_none_or(|reads| reads.iter().all(|r| r == t || done.contains_key(r)))
                });
                let Some(at) = ready else { break };
                let Some(name) = pending.remove(at) else {
                    break;
                };
                let blocked = graph.upstream.get(&name).and_then(|reads| {
                    reads.iter().filter(|r| **r != name).find(|r| {
                        done.get(*r).is_some_and(|t| {
                            !matches!(t.status, TableStatus::Updated | TableStatus::Unchanged)
                        })
                    })
                });
                if let Some(upstream) = blocked {
                    let message = match done.get(upstream).map(|t| &t.status) {
                        Some(TableStatus::Failed) => format!("upstream '{upstream}' failed"),
                        _ => format!("upstream '{upstream}' was not updated"),
                    };
                    done.insert(
                        name.clone(),
                        TableUpdate {
                            table: name,
                            status: TableStatus::Skipped,
                            runs: vec![],
                            message: Some(message),
                        },
                    );
                    continue;
                }
                let full = from_scratch.contains(&name);
                running.push(in_pipeline_update(
                    update_id.clone(),
                    self.update_table(name, full, only_changed),
                ));
            }
            match running.next().await {
                Some(update) => {
                    done.insert(update.table.clone(), update);
                }
                None => break,
            }
        }
        // (the order puts every table after what it reads: nothing waits here)
        if let Some(name) = pending.front() {
            return Err(DataFusionError::Internal(format!(
                "pipeline update: '{name}' waited for a table that never ran"
            )));
        }
        let mut tables: Vec<TableUpdate> =
            order.into_iter().filter_map(|t| done.remove(&t)).collect();
        tables.extend(unopened.into_iter().map(|(table, e)| TableUpdate {
            table,
            status: TableStatus::Failed,
            runs: vec![],
            message: Some(first_line(&e)),
        }));
        Ok(PipelineUpdate { update_id, tables })
    }

    /// One table's part of a pipeline update (see the module docs).
    async fn update_table(&self, name: TableName, full: bool, only_changed: bool) -> TableUpdate {
        let outcome = |status, message| TableUpdate {
            table: name.clone(),
            status,
            runs: vec![],
            message,
        };
        // (only the flows with something new run: the others would commit
        // an empty run, and the table's readers would then run too)
        let mut only = None;
        if only_changed && !full {
            let table = match self.table(&name).await {
                Ok(table) => table,
                Err(e) => return outcome(TableStatus::Failed, Some(first_line(&e))),
            };
            match self.flows_with_new_data(&table).await {
                // (a full refresh that did not finish is completed)
                Ok(_) if !table.meta().full_refresh_pending().is_empty() => {}
                Ok(flows) if flows.is_empty() => return outcome(TableStatus::Unchanged, None),
                Ok(flows) => only = Some(flows),
                Err(e) => return outcome(TableStatus::Failed, Some(first_line(&e))),
            }
        }
        let refreshed = self
            .refresh_runs(&name, full, only.as_ref())
            .await
            .and_then(|(batches, failed)| Ok((UpdateMetrics::from_batches(&batches)?, failed)));
        match refreshed {
            Ok((runs, None)) => TableUpdate {
                table: name,
                status: TableStatus::Updated,
                runs,
                message: None,
            },
            // a later flow failed: the runs before it committed, and count
            Ok((runs, Some(e))) => TableUpdate {
                table: name,
                status: TableStatus::Failed,
                runs,
                message: Some(first_line(&e)),
            },
            Err(e) => outcome(TableStatus::Failed, Some(first_line(&e))),
        }
    }
}

/// The first line of an error's message, with its root cause's when the
/// first line is only a context ("the update of 't' failed") that does not
/// say why.
fn first_line(e: &DataFusionError) -> String {
    let text = e.to_string();
    let top = text.lines().next().unwrap_or_default();
    let root = e.find_root().message().into_owned();
    let why = root.lines().next().unwrap_or_default();
    if why.is_empty() || top.contains(why) {
        top.to_string()
    } else {
        format!("{top}; cause: {why}")
    }
}

/// The columns of `REFRESH PIPELINE`'s result: one row per table.
pub(super) fn pipeline_result_schema() -> SchemaRef {
    let mut fields = vec![
        Field::new("update_id", DataType::Utf8, false),
        Field::new("table", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("flows", DataType::Int64, false),
    ];
    fields.extend(run_count_fields());
    fields.extend([
        Field::new("commit_version", DataType::Int64, true),
        Field::new("message", DataType::Utf8, true),
    ]);
    Arc::new(Schema::new(fields))
}

/// `update` as `REFRESH PIPELINE` prints it.
pub(super) fn pipeline_result(update: &PipelineUpdate) -> Result<RecordBatch> {
    let tables = &update.tables;
    let sum = |f: fn(&UpdateMetrics) -> i64| -> Int64Array {
        tables
            .iter()
            .map(|t| {
                (t.status == TableStatus::Updated || !t.runs.is_empty())
                    .then(|| t.runs.iter().map(f).sum::<i64>())
            })
            .collect()
    };
    let version: Int64Array = tables
        .iter()
        .map(|t| t.runs.iter().filter_map(|r| r.commit_version).max())
        .collect();
    Ok(RecordBatch::try_new(
        pipeline_result_schema(),
        vec![
            Arc::new(StringArray::from(vec![
                update.update_id.as_str();
                tables.len()
            ])),
            Arc::new(StringArray::from_iter_values(
                tables.iter().map(|t| t.table.to_string()),
            )),
            Arc::new(StringArray::from_iter_values(
                tables.iter().map(|t| t.status.name()),
            )),
            Arc::new(Int64Array::from_iter_values(
                tables.iter().map(|t| t.runs.len() as i64),
            )),
            Arc::new(sum(|r| r.num_upserted_rows)),
            Arc::new(sum(|r| r.num_deleted_rows)),
            Arc::new(sum(|r| r.num_input_rows)),
            Arc::new(sum(|r| r.num_late_rows_dropped)),
            Arc::new(version),
            Arc::new(StringArray::from_iter(
                tables.iter().map(|t| t.message.as_deref()),
            )),
        ],
    )?)
}
