//! `DROP FLOW [IF EXISTS] f`: the flow leaves its target. One commit of the
//! target removes the flow's definition and what it read (its source
//! checkpoint, a snapshot flow's last version); the rows it wrote stay, and
//! the target's other flows run on. A flow defined again under the name
//! starts afresh (from the source's current snapshot, SPEC §4.3).
//!
//! Flows are named across the warehouse; a name that two targets hold is
//! refused, naming both (drop one of the tables, or keep both flows).

use datafusion::common::{DataFusionError, Result};

use crate::table::commit::{Edit, EditKind, MetadataChange};
use crate::table::event::{CommitEvent, Operation};
use crate::table::properties::{
    full_refresh_pending_property, last_version_property, read_again_property,
    source_checkpoint_property, FLOW_KEY_PREFIX,
};
use crate::table::TableName;

use super::CdcSession;

impl CdcSession {
    pub(super) async fn drop_flow(&self, flow: &str, if_exists: bool) -> Result<()> {
        let mut holders: Vec<TableName> = Vec::new();
        for name in self.warehouse.list_tables().await? {
            if self.table(&name).await?.meta().flows.contains_key(flow) {
                holders.push(name);
            }
        }
        let target = match holders.as_slice() {
            [] if if_exists => return Ok(()),
            [] => {
                return Err(DataFusionError::Plan(format!(
                    "DROP FLOW {flow}: no streaming table has a flow '{flow}'"
                )))
            }
            [one] => one.clone(),
            many => {
                let names: Vec<String> = many.iter().map(|t| format!("'{t}'")).collect();
                return Err(DataFusionError::Plan(format!(
                    "DROP FLOW {flow}: the tables {} each have a flow '{flow}'; nothing was \
                     changed",
                    names.join(" and ")
                )));
            }
        };
        let table = self.table(&target).await?;
        // (exact keys: `autocdc.flow.f` is a prefix of `autocdc.flow.f2`)
        let keys = [
            format!("{FLOW_KEY_PREFIX}{flow}"),
            source_checkpoint_property(flow),
            last_version_property(flow),
            full_refresh_pending_property(flow),
            read_again_property(flow),
        ];
        // (the log's `flow` names flows that ran: this one is gone)
        let event = CommitEvent::new(Operation::DropFlow, None, std::time::Instant::now())
            .with_details(format!("flow '{flow}'"));
        Edit::new(EditKind::SetProperties)
            .metadata(MetadataChange::Remove(keys.to_vec()))
            .event(event)
            .commit(&table)
            .await?;
        table.refresh().await
    }
}
