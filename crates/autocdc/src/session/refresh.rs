//! `REFRESH STREAMING TABLE [FULL]`: every flow of a target again (a full
//! refresh clears the target and its checkpoints first).

use arrow::array::RecordBatch;
use datafusion::common::Result;

use crate::physical::commit_exec::result_schema;
use crate::spec::FlowSpec;
use crate::table::commit::{Edit, EditKind, MetadataChange, Replaced};
use crate::table::event::{CommitEvent, Operation};
use crate::table::properties::{
    SNAPSHOT_PROPERTY_PREFIX, SNAPSHOT_WATERMARK_PROPERTY, SOURCE_CHECKPOINT_PREFIX,
};
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
    pub(super) async fn clear(&self, table: &ScdTable) -> Result<()> {
        let event = CommitEvent::new(Operation::FullRefresh, None, std::time::Instant::now());
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
        Ok(())
    }
}
