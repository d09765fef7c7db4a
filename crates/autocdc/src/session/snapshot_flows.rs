//! Snapshot flows (`AUTO CDC FROM SNAPSHOT`): every newer version in
//! ascending order, one commit each; the version query and
//! `current_snapshot_version()` / `last_snapshot_version()`.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::DataFrame;

use crate::functions::{SnapshotVersionFunction, CURRENT_SNAPSHOT_VERSION, LAST_SNAPSHOT_VERSION};
use crate::physical::commit_exec::result_batch;
use crate::pipeline::{plan_update, Planning, UpdateSource};
use crate::spec::resolve::{plan_source, written_at_value};
use crate::spec::FlowSource;
use crate::spec::FlowSpec;
use crate::table::commit::commit_event;
use crate::table::event::{CommitEvent, Operation};
use crate::table::properties::last_version_property;
use crate::table::{ScdTable, TableName};

use super::{CdcSession, SnapshotFunction};

impl CdcSession {
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

    /// The flows of `target` that read a snapshot function (each needs
    /// [`CdcSession::register_snapshot_function`] in a new process).
    pub async fn snapshot_function_flows(&self, target: &TableName) -> Result<Vec<String>> {
        let table = self.table(target).await?;
        let meta = table.meta();
        Ok(meta
            .flows
            .values()
            .filter(|flow| matches!(flow.source, FlowSource::SnapshotFunction))
            .map(|flow| flow.name.clone())
            .collect())
    }

    /// Create a snapshot flow that reads the Rust `function`. The function is
    /// registered before the flow runs; when the definition does not land
    /// (the flow is refused, or fails before its first commit) the function
    /// registered before is put back: a refused call changes nothing.
    pub(crate) async fn create_function_flow(
        &self,
        spec: FlowSpec,
        function: SnapshotFunction,
    ) -> Result<Vec<RecordBatch>> {
        let target = TableName::parse(&spec.target)?;
        let key = (target.clone(), spec.name.clone());
        let before = self.stored_flow(&target, &spec.name).await;
        let previous = self
            .snapshot_functions
            .lock()
            .ok()
            .and_then(|mut f| f.insert(key.clone(), function));
        let created = self.create_flow(spec).await;
        if created.is_err() && self.stored_flow(&target, &key.1).await == before {
            if let Ok(mut f) = self.snapshot_functions.lock() {
                match previous {
                    Some(previous) => f.insert(key, previous),
                    None => f.remove(&key),
                };
            }
        }
        created
    }

    /// The stored definition of flow `name` of `target`, if both exist.
    async fn stored_flow(&self, target: &TableName, name: &str) -> Option<FlowSpec> {
        let table = self.table(target).await.ok()?;
        let flow = table.meta().flows.get(name).cloned();
        flow
    }

    /// Run a snapshot flow: every available version in ascending order, each
    /// committed on its own. One result row per version. When a version
    /// fails after others of this update committed, the error names those:
    /// they stay.
    ///
    /// `operation`: `CREATE FLOW` registers the flow with its first commit;
    /// a full refresh's clear (`REFRESH FULL`) is carried by its first
    /// version's commit, so that a failure before it leaves the table as it
    /// was, or is a commit of its own when there is no version to apply.
    pub(super) async fn run_snapshot_flow(
        &self,
        table: &Arc<ScdTable>,
        spec: &FlowSpec,
        operation: Operation,
    ) -> Result<Vec<RecordBatch>> {
        // (within a full refresh, its failure puts the table back as it was
        // before the refresh: no version it applied stays)
        let full_refresh = operation == Operation::FullRefresh
            || table.meta().full_refresh_pending().contains(&spec.name);
        let mut applied = Vec::new();
        self.run_snapshot_versions(table, spec, operation, &mut applied)
            .await
            .map_err(|e| match applied.is_empty() || full_refresh {
                true => e,
                false => e.context(format!(
                    "flow '{}': snapshot version(s) {} of this update were applied before \
                     and stay committed (each version is a commit of its own)",
                    spec.name,
                    applied.join(", ")
                )),
            })
    }

    /// [`Self::run_snapshot_flow`]; the versions committed pushed on
    /// `applied` (as the user gave them).
    async fn run_snapshot_versions(
        &self,
        table: &Arc<ScdTable>,
        spec: &FlowSpec,
        operation: Operation,
        applied: &mut Vec<String>,
    ) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        let mut skipped_at = None;
        let mut register = operation == Operation::CreateFlow;
        let mut clearing = operation == Operation::FullRefresh;
        loop {
            let meta = match clearing {
                true => table.meta().cleared(),
                false => table.meta(),
            };
            let last = match (
                meta.properties.get(&last_version_property(&spec.name)),
                &meta.sequence_type,
            ) {
                (Some(text), Some(t)) => Some(crate::stored_value::from_text(text, t)?),
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
            // a float version's -0.0 is its 0.0 (as a float sequence's): no
            // later 0.0 is newer than it
            let version = crate::spec::resolve::unsigned_zero_value(version);
            if let ScalarValue::TimestampNanosecond(Some(ns), _) = &version {
                if ns % 1000 != 0 {
                    return Err(DataFusionError::Plan(format!(
                        "flow '{}': the snapshot version {} has nanoseconds, and versions are \
                         kept to the microsecond: versions within one microsecond would be \
                         one; nothing of it was applied",
                        spec.name,
                        crate::fold::errors::scalar_text(&version)
                    )));
                }
            }
            // (versions as the user gave them, for messages)
            let given = version.data_type();
            let shown = |v: &ScalarValue| match v.cast_to(&given) {
                Ok(v) => crate::fold::errors::scalar_text(&v),
                Err(_) => v.to_string(),
            };
            let version = stored_version(spec, version, &meta)?;
            if let Some(last) = &last {
                if version.partial_cmp(last) != Some(std::cmp::Ordering::Greater) {
                    // out of order: ignored, as the reference says; the
                    // update ends here (the version query would offer it again)
                    let details = format!(
                        "snapshot version {} skipped: not newer than the last processed version {}; nothing of it was applied",
                        shown(&version),
                        shown(last)
                    );
                    log::warn!("flow '{}': {details}", spec.name);
                    let event = CommitEvent::new(
                        Operation::SnapshotSkipped,
                        Some(&spec.name),
                        std::time::Instant::now(),
                    )
                    .with_details(details);
                    skipped_at = Some(commit_event(table, event).await?);
                    break;
                }
            }
            let shown_version = shown(&version);
            let operation = match clearing {
                true => Operation::FullRefresh,
                false => Operation::flow_run(register),
            };
            let update = plan_update(
                &state,
                Arc::clone(table),
                spec,
                operation,
                now,
                UpdateSource::Snapshot {
                    plan: Box::new(plan),
                    version,
                },
                Planning::Run,
            )
            .await?;
            out.extend(
                DataFrame::new(state, update)
                    .collect()
                    .await?
                    .into_iter()
                    .filter(|b| b.num_rows() > 0),
            );
            applied.push(shown_version);
            // (each version's commit names its own rejects: delivered
            // before the next version's commit names others)
            self.deliver_rejects(table).await?;
            register = false;
            clearing = false;
        }
        if register {
            // no version to process yet: the definition still lands
            self.commit_definition(table, spec).await?;
        }
        if clearing {
            // no version to carry the full refresh's clear: it is a commit
            // of its own (from scratch, the table holds nothing yet)
            let rows = self.clear(table, Some(&spec.name)).await?;
            out.push(result_batch(
                &spec.name,
                crate::fold::FoldCounts {
                    deleted: rows as usize,
                    ..Default::default()
                },
                table.delta().version().map(|v| v as i64),
            )?);
        }
        if out.is_empty() {
            // (a skipped version's commit is the run's)
            out.push(result_batch(&spec.name, Default::default(), skipped_at)?);
        }
        Ok(out)
    }

    /// The next snapshot of a snapshot flow and its version, if any.
    pub(super) async fn next_snapshot(
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
                            "flow '{}' of '{}' reads a snapshot function (next_snapshot_and_version) \
                             that is not registered in this session: a function lives in the \
                             process that registered it; register it again in each new one \
                             (register_snapshot_function)",
                            spec.name,
                            table.name()
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

    /// The next version of a versioned snapshot flow: run the version query
    /// with `last_snapshot_version()` bound. `None` when it returns no row.
    pub(super) async fn next_version(
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
    pub(super) async fn plan_version_query(
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
        // plan once with a guess (the name the query's first column is given,
        // the stored type, else NULL's type, which any comparison takes),
        // again with what the query produced
        let mut column = (
            output_name(version_query, &spec.dialect).unwrap_or_else(|| "version".to_string()),
            sequence_type.unwrap_or(DataType::Null),
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
    pub(super) async fn plan_snapshot_query(
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
}

/// The name a query's first output column is given, when it says it (`AS
/// name`, or a plain column): what `last_snapshot_version()`'s column is
/// named before the query is planned.
fn output_name(query: &str, dialect: &str) -> Option<String> {
    use datafusion::sql::sqlparser::ast::{Expr, SelectItem, SetExpr, Statement};
    use datafusion::sql::sqlparser::dialect::{dialect_from_str, GenericDialect};
    use datafusion::sql::sqlparser::parser::Parser;
    let dialect = dialect_from_str(dialect).unwrap_or(Box::new(GenericDialect {}));
    let statements = Parser::parse_sql(dialect.as_ref(), query).ok()?;
    let Some(Statement::Query(query)) = statements.first() else {
        return None;
    };
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let ident = match select.projection.first()? {
        SelectItem::ExprWithAlias { alias, .. } => alias.clone(),
        SelectItem::UnnamedExpr(Expr::Identifier(ident)) => ident.clone(),
        _ => return None,
    };
    Some(match ident.quote_style {
        Some(_) => ident.value,
        None => ident.value.to_lowercase(),
    })
}

/// `version` (a snapshot flow's next) as the target stores versions: the
/// type of its stored sequences, or of a declared SCD 2 target's
/// `__START_AT` — an integer of another width, a time in another zone's
/// notation (the same instant) cast to it; another type refused.
pub(super) fn stored_version(
    spec: &FlowSpec,
    version: ScalarValue,
    meta: &crate::table::meta::TableMeta,
) -> Result<ScalarValue> {
    let fixed = meta.sequence_type.clone().or(meta.start_at_type.clone());
    Ok(match &fixed {
        Some(t) if version.data_type() != *t => {
            // the version as stored (a timestamp's microseconds, say),
            // an integer of another width, or a time in another
            // zone's notation (the same instant)
            let stored = crate::spec::resolve::storage_type(&version.data_type());
            let same_instants = matches!(
                (&stored, t),
                (DataType::Timestamp(a, _), DataType::Timestamp(b, _)) if a == b
            );
            if stored != *t
                && !same_instants
                && !(version.data_type().is_integer() && t.is_integer())
            {
                return Err(DataFusionError::Plan(format!(
                    "flow '{}': the snapshot version type {} differs from the target's sequence type {t}",
                    spec.name,
                    version.data_type()
                )));
            }
            version.cast_to(t).map_err(|_| {
                DataFusionError::Plan(format!(
                    "flow '{}': the snapshot version {} does not fit the target's \
                     sequence type {t} (its versions are stored as that type, which \
                     cannot widen); nothing was committed",
                    spec.name,
                    crate::fold::errors::scalar_text(&version)
                ))
            })?
        }
        _ => version,
    })
}
