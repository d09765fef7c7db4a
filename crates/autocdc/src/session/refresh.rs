//! `REFRESH STREAMING TABLE [FULL]`: every flow of a target again (a full
//! refresh clears the target and its checkpoints first).

use arrow::array::RecordBatch;
use datafusion::common::Result;
use deltalake_core::kernel::Action;
use deltalake_core::protocol::DeltaOperation;

use crate::physical::commit_exec::result_schema;
use crate::spec::FlowSpec;
use crate::table::commit::remove_all;
use crate::table::delta_err;
use crate::table::event::{CommitEvent, Operation};
use crate::table::properties::{
    SNAPSHOT_PROPERTY_PREFIX, SNAPSHOT_WATERMARK_PROPERTY, SOURCE_CHECKPOINT_PREFIX,
};
use crate::table::{ScdTable, TableName};
use deltalake_core::kernel::MetadataExt;

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
        let delta = table.delta();
        let snapshot = delta.snapshot().map_err(delta_err)?;
        let log_store = delta.log_store();
        let event = CommitEvent::new(Operation::FullRefresh, None, std::time::Instant::now());
        let mut actions = vec![event.action()];
        actions.extend(remove_all(&delta).await?);
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
        table.refresh().await?;
        table.publish().await
    }
}
