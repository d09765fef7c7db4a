//! `REFRESH STREAMING TABLE [FULL]`: every flow of a target again (a full
//! refresh clears the target and its checkpoints first, and brings them
//! back if a flow then fails).

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::catalog::TableProvider;
use datafusion::common::{DataFusionError, Result};

use crate::physical::commit_exec::result_schema;
use crate::spec::FlowSpec;
use crate::table::commit::{Edit, EditKind, MetadataChange, Replaced};
use crate::table::event::{CommitEvent, Operation};
use crate::table::properties::{
    SNAPSHOT_PROPERTY_PREFIX, SNAPSHOT_WATERMARK_PROPERTY, SOURCE_CHECKPOINT_PREFIX,
};
use crate::table::restore::restore;
use crate::table::{ScdTable, TableName};

use super::CdcSession;

impl CdcSession {
    /// Flows of a table to run on a refresh.
    pub(super) fn flows_to_run(table: &ScdTable, full: bool) -> Vec<FlowSpec> {
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
        let cleared = match full {
            true => Some(self.clear(&table).await?),
            false => None,
        };
        let mut out = Vec::new();
        for flow in Self::flows_to_run(&table, full) {
            match self.run_flow(&table, &flow, false).await {
                Ok(batches) => out.extend(batches),
                Err(e) => return Err(self.undo_clear(&table, cleared, e).await),
            }
        }
        if out.is_empty() {
            out.push(RecordBatch::new_empty(result_schema()));
        }
        Ok(out)
    }

    /// After a flow of a full refresh failed with `error`: the table back
    /// to `cleared` (the version before its clear: rows, state and
    /// checkpoints, as one restore commit), so that a failed full refresh
    /// leaves the table as it was (SPEC §2.7), not empty. Returns the
    /// error to report.
    pub(super) async fn undo_clear(
        &self,
        table: &ScdTable,
        cleared: Option<u64>,
        error: DataFusionError,
    ) -> DataFusionError {
        let Some(before) = cleared else {
            return error;
        };
        let undone = async {
            table.refresh().await?;
            let event = CommitEvent::new(Operation::Restore, None, std::time::Instant::now())
                .with_details(format!(
                    "restored version {before}: the full refresh after it failed"
                ));
            let keys = super::restore::target_keys(table);
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

    /// Remove every row of a table (full refresh), keeping its definition;
    /// returns the version before (see [`Self::undo_clear`]).
    pub(super) async fn clear(&self, table: &Arc<ScdTable>) -> Result<u64> {
        let started = std::time::Instant::now();
        let before = table.delta().version().unwrap_or(0);
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
        let checkpoints = MetadataChange::RemovePrefixed(vec![
            SOURCE_CHECKPOINT_PREFIX.to_string(),
            SNAPSHOT_PROPERTY_PREFIX.to_string(),
            SNAPSHOT_WATERMARK_PROPERTY.to_string(),
        ]);
        Edit::new(EditKind::Delete)
            .event(event)
            .replacing(Replaced::All)
            .metadata(checkpoints)
            .commit(table)
            .await?;
        Ok(before)
    }
}
