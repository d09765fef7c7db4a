//! `CREATE FLOW ... AS AUTO CDC` / `APPLY CHANGES INTO`: the rules between
//! a target's flows, then the flow's first update; running one update of a
//! change-feed flow.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use datafusion::prelude::DataFrame;

use crate::pipeline::append::plan_append;
use crate::pipeline::failed_read::{file_that_fails, is_read_error};
use crate::pipeline::streams::check_append_sources;
use crate::pipeline::{plan_update, Planning, UpdateSource};
use crate::spec::shared_target::check_joins_target;
use crate::spec::FlowSpec;
use crate::table::commit::{Edit, EditKind, MetadataChange};
use crate::table::delta_err;
use crate::table::event::Operation;
use crate::table::properties::{FLOW_KEY_PREFIX, SOURCE_CHECKPOINT_PREFIX};
use crate::table::rejects::{deliver, rejects_table_name, takes_rejects};
use crate::table::{ScdTable, TableName};

use super::CdcSession;

impl CdcSession {
    pub(crate) async fn create_flow(&self, spec: FlowSpec) -> Result<Vec<RecordBatch>> {
        // (the SQL parser derives them too; the Rust and Python builders not)
        let spec = spec.with_source_defaults();
        let target = TableName::parse(&spec.target)?;
        self.refuse_on_rejects_table(&format!("flow '{}': INTO", spec.name), &target)
            .await?;
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
        if spec.source.is_snapshot() && !meta.decl.expectations.is_empty() {
            let names: Vec<&str> = meta
                .decl
                .expectations
                .iter()
                .map(|e| e.name.as_str())
                .collect();
            return Err(DataFusionError::Plan(format!(
                "flow '{}': target '{target}' has expectations (CONSTRAINT {}), and a snapshot flow takes none (AUTO CDC FROM SNAPSHOT defines no expectations)",
                spec.name,
                names.join(", ")
            )));
        }
        if let Some(other) = meta.flows.values().find(|f| f.append != spec.append) {
            let kind = |append: bool| {
                if append {
                    "an append flow"
                } else {
                    "an AUTO CDC flow"
                }
            };
            return Err(DataFusionError::Plan(format!(
                "flow '{}': '{target}' is written by {} ('{}'), so {} cannot write it too",
                spec.name,
                kind(other.append),
                other.name,
                kind(spec.append)
            )));
        }
        if spec.append && !spec.once {
            // (a flow that runs once appends its query's rows once: any
            // source will do)
            check_append_sources(&self.ctx.state(), &spec).await?;
        } else {
            check_joins_target(&spec, meta.flows.values(), &target, &target_columns)?;
        }
        self.refuse_cycles(&spec, &target).await?;
        self.run_flow(&table, &spec, Operation::CreateFlow).await
    }

    /// Commit a flow definition without data.
    pub(super) async fn commit_definition(&self, table: &ScdTable, spec: &FlowSpec) -> Result<()> {
        let json = serde_json::to_string(spec).map_err(delta_err)?;
        Edit::new(EditKind::SetProperties)
            .metadata(MetadataChange::Set(
                format!("{FLOW_KEY_PREFIX}{}", spec.name),
                json,
            ))
            .commit(table)
            .await?;
        Ok(())
    }

    /// Run one update of `spec`, which is `operation` (its first run, a
    /// refresh, or the first of a full refresh, which carries its clear);
    /// an error that does not say which flow failed (a source that cannot
    /// be read, say) is given that context.
    pub(super) async fn run_flow(
        &self,
        table: &Arc<ScdTable>,
        spec: &FlowSpec,
        operation: Operation,
    ) -> Result<Vec<RecordBatch>> {
        let named = format!("flow '{}'", spec.name);
        // rejects an interrupted update committed reach their table first
        self.deliver_rejects(table).await?;
        let out = match self.run_flow_unnamed(table, spec, operation).await {
            Ok(out) => out,
            Err(e) if e.to_string().contains(&named) => return Err(e),
            Err(e) => {
                // a reader's error names no file: find the one it failed on
                let failed_file = match is_read_error(&e) {
                    true => {
                        let key = format!("{SOURCE_CHECKPOINT_PREFIX}{}", spec.name);
                        let checkpoint = table.meta().properties.get(&key).cloned();
                        file_that_fails(&self.ctx.state(), spec, checkpoint.as_deref(), &e).await
                    }
                    false => None,
                };
                return Err(match failed_file {
                    Some((file, cause)) => cause.context(format!(
                        "{named}: the update of '{}' failed reading {file}; nothing was committed",
                        table.name()
                    )),
                    None => e.context(format!(
                        "{named}: the update of '{}' failed; nothing was committed",
                        table.name()
                    )),
                });
            }
        };
        self.deliver_rejects(table).await.map_err(|e| {
            e.context(format!(
                "{named}: the update of '{}' committed; its rejected events reach {} with the next update",
                table.name(),
                rejects_table_name(table.name())
            ))
        })?;
        Ok(out)
    }

    /// Append the rejected events `table`'s last commit recorded to its
    /// rejects table, unless delivered ([`crate::table::rejects`]).
    pub(super) async fn deliver_rejects(&self, table: &ScdTable) -> Result<()> {
        if !takes_rejects(&table.meta().properties) {
            return Ok(());
        }
        let name = rejects_table_name(table.name());
        if !self.warehouse.exists(&name).await? {
            // (dropped by an earlier version, which let it go alone)
            let dialect = self
                .ctx
                .state()
                .config()
                .options()
                .sql_parser
                .dialect
                .to_string();
            self.create_rejects_table_of(table.name(), &dialect).await?;
        }
        let rejects = self.table(&name).await?;
        deliver(table, &rejects, self.clock.now().timestamp_micros()).await?;
        Ok(())
    }

    pub(super) async fn run_flow_unnamed(
        &self,
        table: &Arc<ScdTable>,
        spec: &FlowSpec,
        operation: Operation,
    ) -> Result<Vec<RecordBatch>> {
        if spec.source.is_snapshot() {
            return self.run_snapshot_flow(table, spec, operation).await;
        }
        let state = self.ctx.state();
        if spec.append && !spec.once && operation != Operation::CreateFlow {
            // (a name read as a stream may name another table by now: one
            // read whole would be appended again at every run)
            check_append_sources(&state, spec).await?;
        }
        let plan = if spec.append {
            plan_append(&state, Arc::clone(table), spec, operation, self.clock.now()).await?
        } else {
            plan_update(
                &state,
                Arc::clone(table),
                spec,
                operation,
                self.clock.now(),
                UpdateSource::Changes,
                Planning::Run,
            )
            .await?
        };
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
}
