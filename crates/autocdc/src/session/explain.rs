//! `EXPLAIN [ANALYZE] REFRESH STREAMING TABLE`: the plan of each flow's next
//! update, read without data; with ANALYZE, the update run. `EXPLAIN
//! [ANALYZE] MERGE INTO`: the statement's plan (with ANALYZE, run). Also the same
//! plans as physical plans, for callers that ship or inspect them.

use std::str::FromStr;
use std::sync::Arc;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::format::ExplainFormat;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{ExplainOption, LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::{collect, ExecutionPlan};
use datafusion::prelude::DataFrame;

use crate::pipeline::append::plan_append;
use crate::pipeline::{plan_update, Planning, UpdateSource};
use crate::spec::FlowSource;
use crate::spec::FlowSpec;
use crate::sql::{CdcStatement, MergeStatement};
use crate::table::event::Operation;
use crate::table::properties::last_version_property;
use crate::table::{ScdTable, TableName};

use super::CdcSession;

impl CdcSession {
    /// The update plan of a flow's next run (its next snapshot, for snapshot
    /// flows). With [`Planning::Explain`] no data is read: a versioned
    /// snapshot flow's version query is planned, not run, and the snapshot
    /// planned at a NULL version of its type. `operation`: what the run is
    /// (the first run of a full refresh carries its clear).
    pub(super) async fn plan_flow_for_explain(
        &self,
        table: &Arc<ScdTable>,
        flow: &FlowSpec,
        planning: Planning,
        operation: Operation,
    ) -> Result<LogicalPlan> {
        let state = self.ctx.state();
        let now = self.clock.now();
        if flow.append {
            return plan_append(&state, Arc::clone(table), flow, operation, now).await;
        }
        if !flow.source.is_snapshot() {
            return plan_update(
                &state,
                Arc::clone(table),
                flow,
                operation,
                now,
                UpdateSource::Changes,
                planning,
            )
            .await;
        }
        // (a full refresh's first run carries its clear: as into an empty
        // table, every version read again)
        let meta = match operation {
            Operation::FullRefresh => table.meta().cleared(),
            _ => table.meta(),
        };
        let last = match (
            meta.properties.get(&last_version_property(&flow.name)),
            &meta.sequence_type,
        ) {
            (Some(text), Some(t)) => Some(crate::stored_value::from_text(text, t)?),
            _ => None,
        };
        let next = match (planning, &flow.source) {
            (
                Planning::Explain,
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
        // (as the flow's run stores it: the target's sequence type)
        let version = match version.is_null() {
            true => version,
            false => super::snapshot_flows::stored_version(flow, version, &meta)?,
        };
        plan_update(
            &state,
            Arc::clone(table),
            flow,
            operation,
            now,
            UpdateSource::Snapshot {
                plan: Box::new(plan),
                version,
            },
            planning,
        )
        .await
    }

    pub(super) async fn explain(
        &self,
        statement: CdcStatement,
        analyze: bool,
        verbose: bool,
        format: Option<&str>,
    ) -> Result<DataFrame> {
        let (name, full) =
            match statement {
                CdcStatement::Refresh { name, full } => (name, full),
                CdcStatement::Merge(merge) => {
                    return self.explain_merge(&merge, analyze, verbose).await
                }
                _ => return Err(DataFusionError::NotImplemented(
                    "EXPLAIN supports REFRESH STREAMING TABLE and MERGE INTO among the AUTO CDC \
                     statements"
                        .to_string(),
                )),
            };
        let table = self.table(&name).await?;
        table.refresh().await?;
        self.attach_sources_of(&table).await?;
        // (without ANALYZE nothing runs: the plans are those of a refresh)
        let full = full && analyze;
        let before = table.delta().version().unwrap_or(0);
        let (runs, clear_first) = Self::runs(&table, full);
        if clear_first {
            self.clear(&table, None).await?;
        }
        let cleared = full.then_some(before);
        match self
            .explain_flows(&table, runs, analyze, verbose, format)
            .await
        {
            Ok(batches) => self.ctx.read_batches(batches),
            Err(e) => Err(self.undo_clear(&table, cleared, e).await),
        }
    }

    /// The plans of `table`'s flows (run, with ANALYZE).
    async fn explain_flows(
        &self,
        table: &Arc<ScdTable>,
        runs: Vec<(FlowSpec, Operation)>,
        analyze: bool,
        verbose: bool,
        format: Option<&str>,
    ) -> Result<Vec<RecordBatch>> {
        let name = table.name();
        let state = self.ctx.state();
        let format = explain_format(&state, format, analyze, verbose)?;
        let mut batches = Vec::new();
        for (flow, operation) in runs {
            // EXPLAIN plans without reading; EXPLAIN ANALYZE runs the update
            let planning = if analyze {
                // (an update run here delivers its rejects as REFRESH does:
                // an interrupted update's first, then its own)
                self.deliver_rejects(table).await?;
                Planning::Run
            } else {
                Planning::Explain
            };
            let plan = self
                .plan_flow_for_explain(table, &flow, planning, operation)
                .await?;
            let explained: LogicalPlan = LogicalPlanBuilder::from(plan)
                .explain_option_format(
                    ExplainOption::default()
                        .with_verbose(verbose)
                        .with_analyze(analyze)
                        .with_format(format.clone()),
                )?
                .build()?;
            batches.extend(DataFrame::new(state.clone(), explained).collect().await?);
            if analyze {
                self.deliver_rejects(table).await?;
            }
        }
        if batches.is_empty() {
            return Err(DataFusionError::Plan(format!(
                "streaming table '{name}' has no flow to explain"
            )));
        }
        Ok(batches)
    }

    /// `EXPLAIN [ANALYZE] MERGE INTO …`: the statement's physical plan (its
    /// clauses are matched to the source rows when it is planned); with
    /// ANALYZE, run and shown with its metrics. Rendered indented, as
    /// DataFusion renders `EXPLAIN` of its own DML.
    async fn explain_merge(
        &self,
        merge: &MergeStatement,
        analyze: bool,
        verbose: bool,
    ) -> Result<DataFrame> {
        let (state, plan) = self.plan_merge(merge).await?;
        let (plan_type, text) = if analyze {
            collect(Arc::clone(&plan), state.task_ctx()).await?;
            let shown = DisplayableExecutionPlan::with_metrics(plan.as_ref()).indent(verbose);
            ("Plan with Metrics", shown.to_string())
        } else {
            let shown = DisplayableExecutionPlan::new(plan.as_ref()).indent(verbose);
            ("physical_plan", shown.to_string())
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("plan_type", DataType::Utf8, false),
            Field::new("plan", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(vec![plan_type])),
                Arc::new(StringArray::from(vec![text])),
            ],
        )?;
        self.ctx.read_batch(batch)
    }

    /// The physical plan of each flow's next update of `target`, planned
    /// without reading data (as `EXPLAIN REFRESH STREAMING TABLE` plans it),
    /// with the flow's name. Nothing runs and nothing is committed.
    pub async fn update_plans(
        &self,
        target: &str,
    ) -> Result<Vec<(String, Arc<dyn ExecutionPlan>)>> {
        let table = self.table(&TableName::parse(target)?).await?;
        table.refresh().await?;
        let state = self.ctx.state();
        let mut plans = Vec::new();
        for flow in Self::flows_to_run(&table, false) {
            let plan = self
                .plan_flow_for_explain(&table, &flow, Planning::Explain, Operation::Refresh)
                .await?;
            plans.push((flow.name.clone(), state.create_physical_plan(&plan).await?));
        }
        Ok(plans)
    }
}

/// The format of an `EXPLAIN … REFRESH`, as DataFusion chooses it for
/// `EXPLAIN <query>`: the statement's `FORMAT`, else the session's
/// `datafusion.explain.format`; `VERBOSE` and `ANALYZE` print indented
/// (DataFusion renders neither as a tree or a graph).
fn explain_format(
    state: &SessionState,
    format: Option<&str>,
    analyze: bool,
    verbose: bool,
) -> Result<ExplainFormat> {
    let asked = format.map(ExplainFormat::from_str).transpose()?;
    match asked {
        Some(ExplainFormat::Tree | ExplainFormat::Graphviz) if analyze || verbose => {
            Err(DataFusionError::Plan(format!(
                "EXPLAIN {} REFRESH: FORMAT {} is not supported (indent is)",
                if analyze { "ANALYZE" } else { "VERBOSE" },
                format.unwrap_or_default(),
            )))
        }
        Some(f) => Ok(f),
        None if analyze || verbose => Ok(ExplainFormat::Indent),
        None => Ok(state.config_options().explain.format.clone()),
    }
}
