//! `REFRESH STREAMING TABLE [FULL]`: every flow of a target again. A full
//! refresh clears the target and its checkpoints with its first flow's
//! commit (or first, by a commit of its own, see [`CdcSession::runs`]),
//! and brings them back if a later flow fails.

use std::collections::BTreeSet;
use std::sync::Arc;

use arrow::array::{AsArray, Int64Array, RecordBatch};
use arrow::datatypes::Int64Type;
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result};

use crate::physical::commit_exec::result_schema;
use crate::spec::FlowSpec;
use crate::table::commit::{Edit, EditKind, MetadataChange, Replaced};
use crate::table::event::{CommitEvent, Operation};
use crate::table::properties::full_refresh_pending_property;
use crate::table::restore::restore;
use crate::table::{ScdTable, TableName};

use super::CdcSession;

impl CdcSession {
    /// Flows of a table to run on a refresh: on a full one all; else those
    /// not `ONCE`, and those a full refresh that did not finish (its process
    /// stopped) left to run, which complete it.
    pub(super) fn flows_to_run(table: &ScdTable, full: bool) -> Vec<FlowSpec> {
        let meta = table.meta();
        let pending = meta.full_refresh_pending();
        meta.flows
            .into_values()
            .filter(|f| full || !f.once || pending.contains(&f.name))
            .collect()
    }

    /// The runs of a refresh of `table`, each flow with what its run is;
    /// for a full refresh, whether the table is to be cleared first. The
    /// first run of a full refresh carries its clear, so that a failure or
    /// a crash before its commit leaves the table as it was (a snapshot
    /// flow's first version's commit carries it); not on a table of the
    /// earlier layout (its change feed would lack the clear's deletes):
    /// then the clear is a commit of its own.
    pub(super) fn runs(table: &ScdTable, full: bool) -> (Vec<(FlowSpec, Operation)>, bool) {
        let mut flows = Self::flows_to_run(table, full);
        if !full {
            let runs = flows.into_iter().map(|f| (f, Operation::Refresh)).collect();
            return (runs, false);
        }
        // (a snapshot flow's run may find no version to carry the clear:
        // it clears the table by itself then; a flow of another kind first)
        let carrier = flows
            .iter()
            .position(|f| !f.source.is_snapshot())
            .or((!flows.is_empty()).then_some(0))
            .filter(|_| table.is_published());
        let Some(carrier) = carrier else {
            let runs = flows.into_iter().map(|f| (f, Operation::Refresh)).collect();
            return (runs, true);
        };
        let first = flows.remove(carrier);
        let runs = std::iter::once((first, Operation::FullRefresh))
            .chain(flows.into_iter().map(|f| (f, Operation::Refresh)))
            .collect();
        (runs, false)
    }

    pub(crate) async fn refresh(&self, name: &TableName, full: bool) -> Result<Vec<RecordBatch>> {
        match self.refresh_runs(name, full, None).await? {
            (batches, None) => Ok(batches),
            (_, Some(e)) => Err(e),
        }
    }

    /// [`Self::refresh`], telling apart a failure that committed nothing
    /// (`Err`) from one at a later flow after earlier flows committed: the
    /// committed runs' result rows and the error (each flow's run is a
    /// commit of its own, so those stand). `only`: run just these flows
    /// (of a refresh that is not full).
    pub(crate) async fn refresh_runs(
        &self,
        name: &TableName,
        full: bool,
        only: Option<&BTreeSet<String>>,
    ) -> Result<(Vec<RecordBatch>, Option<DataFusionError>)> {
        if full {
            self.refuse_on_rejects_table(&format!("REFRESH STREAMING TABLE {name} FULL"), name)
                .await?;
        }
        let table = self.table(name).await?;
        table.refresh().await?;
        self.attach_sources_of(&table).await?;
        let before = table.delta().version().unwrap_or(0);
        // (a full refresh, or one completing a full refresh that did not
        // finish, ends by removing the marks of flows that committed nothing)
        let completing = full || !table.meta().full_refresh_pending().is_empty();
        let (mut runs, clear_first) = Self::runs(&table, full);
        if let Some(only) = only.filter(|_| !completing) {
            runs.retain(|(flow, _)| only.contains(&flow.name));
        }
        let mut cleared_rows = match clear_first {
            true => self.clear(&table, None).await?,
            false => 0,
        };
        let cleared = full.then_some(before);
        let mut out = Vec::new();
        let mut committed: Vec<String> = Vec::new();
        for (flow, operation) in runs {
            match self.run_flow(&table, &flow, operation).await {
                Err(e) if cleared.is_none() && !committed.is_empty() => {
                    // (each flow's run is a commit of its own: say which
                    // stand, rather than let "nothing was committed" speak
                    // for the statement; the cause on the first line, which
                    // is what a pipeline's row shows)
                    let message = e.find_root().message().into_owned();
                    let cause = message.lines().next().unwrap_or_default();
                    let cause = cause.trim_end_matches("; nothing was committed");
                    let error = e.context(format!(
                        "REFRESH STREAMING TABLE {name}: {cause}; flow '{}' committed nothing, \
                         and flow(s) {} ran before it and stay committed (each flow's run is a \
                         commit of its own)",
                        flow.name,
                        committed.join(", ")
                    ));
                    return Ok((out, Some(error)));
                }
                Ok(batches) => {
                    committed.push(format!("'{}'", flow.name));
                    // (a clear of its own counts with the first run, as a
                    // clear the first run carries does)
                    for batch in batches {
                        out.push(with_deleted_added(batch, cleared_rows)?);
                        cleared_rows = 0;
                    }
                }
                Err(e) => return Err(self.undo_clear(&table, cleared, e).await),
            }
        }
        if completing {
            self.finish_full_refresh(&table).await?;
        }
        if out.is_empty() {
            out.push(RecordBatch::new_empty(result_schema()));
        }
        Ok((out, None))
    }

    /// After a flow of a full refresh failed with `error`: the table back
    /// to `cleared` (the version before its clear: rows, state and
    /// checkpoints, as one restore commit), so that a failed full refresh
    /// leaves the table as it was (SPEC §2.7), not empty. Only its own
    /// commits are undone: when it committed nothing (its first run,
    /// carrying the clear, failed: say, lost a race), nothing is restored;
    /// when another writer committed since it began, restoring would undo
    /// that writer's commits too, so the table stays as the full refresh
    /// left it (its flows still to run marked: the next refresh completes
    /// it). Returns the error to report.
    pub(super) async fn undo_clear(
        &self,
        table: &ScdTable,
        cleared: Option<u64>,
        error: DataFusionError,
    ) -> DataFusionError {
        let Some(before) = cleared else {
            return error;
        };
        if let Err(e) = table.refresh().await {
            return error.context(format!("reloading '{}': {e}", table.name()));
        }
        let latest = table.delta().version().unwrap_or(0);
        let others = table.others_commits_after(before);
        if latest == before || others.len() as u64 == latest - before {
            return error;
        }
        if !others.is_empty() {
            let versions: Vec<String> = others.iter().map(u64::to_string).collect();
            return error.context(format!(
                "REFRESH STREAMING TABLE {name} FULL failed after clearing the table; \
                 another writer committed since it began (version {}), so it was not \
                 brought back to version {before} (that would undo those commits): \
                 REFRESH STREAMING TABLE {name} completes the full refresh, RESTORE \
                 TABLE {name} TO VERSION AS OF {before} goes back (undoing them too)",
                versions.join(", "),
                name = table.name(),
            ));
        }
        let undone = async {
            let event = CommitEvent::new(Operation::Restore, None, std::time::Instant::now())
                .with_details(format!(
                    "restored version {before}: the full refresh after it failed"
                ));
            let keys = crate::table::restore::target_keys(table);
            restore(&self.ctx.state(), table, before, keys.as_deref(), event).await
        };
        match undone.await {
            Ok(_) => error.context(format!(
                "REFRESH STREAMING TABLE {} FULL failed; the table is back as it was before \
                 it (version {before})",
                table.name()
            )),
            Err(undo) => error.context(format!(
                "REFRESH STREAMING TABLE {} FULL failed, and bringing the table back to \
                 version {before} failed too ({undo}): RESTORE TABLE {} TO VERSION AS OF \
                 {before} brings back its rows",
                table.name(),
                table.name()
            )),
        }
    }

    /// After every flow of `table` ran in a refresh: the marks of flows
    /// still to run of a full refresh removed (the flows ran but committed
    /// nothing, having nothing to add), in one commit of properties.
    pub(super) async fn finish_full_refresh(&self, table: &ScdTable) -> Result<()> {
        table.refresh().await?;
        let pending = table.meta().full_refresh_pending();
        if pending.is_empty() {
            return Ok(());
        }
        Edit::new(EditKind::SetProperties)
            .metadata(MetadataChange::Remove(
                pending
                    .iter()
                    .map(|f| full_refresh_pending_property(f))
                    .collect(),
            ))
            .commit(table)
            .await?;
        table.refresh().await
    }

    /// Remove every row of a table (full refresh), keeping its definition,
    /// as a commit of its own (see [`Self::runs`]); the rows removed (SCD 2:
    /// versions). Every flow but `by` (one that ran, finding nothing to
    /// apply) is marked to run before the full refresh is complete.
    pub(super) async fn clear(&self, table: &Arc<ScdTable>, by: Option<&str>) -> Result<u64> {
        let started = std::time::Instant::now();
        // its count: the rows its change feed deletes (SCD 2: versions)
        let rows = self
            .ctx
            .read_table(Arc::clone(table) as Arc<dyn TableProvider>)?
            .count()
            .await?;
        let mut event = CommitEvent::new(Operation::FullRefresh, None, started);
        event.deleted = rows as u64;
        // forget what the flows read: they read their sources (and every
        // snapshot version) again
        let edit = Edit::new(EditKind::Delete)
            .event(event)
            .replacing(Replaced::All)
            .metadata(MetadataChange::forget_reads());
        let edit = table
            .meta()
            .marks_of_flows_but(by)
            .into_iter()
            .fold(edit, Edit::metadata);
        edit.commit(table).await?;
        Ok(rows as u64)
    }
}

/// `batch` (a flow run's result row) with `rows` more deleted rows.
fn with_deleted_added(batch: RecordBatch, rows: u64) -> Result<RecordBatch> {
    if rows == 0 {
        return Ok(batch);
    }
    let index = batch.schema().index_of("num_deleted_rows")?;
    let deleted = batch
        .column(index)
        .as_primitive_opt::<Int64Type>()
        .ok_or_else(|| DataFusionError::Internal("num_deleted_rows is not Int64".into()))?;
    let added: Int64Array = deleted.unary(|n| n + rows as i64);
    let mut columns = batch.columns().to_vec();
    columns[index] = Arc::new(added);
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}
