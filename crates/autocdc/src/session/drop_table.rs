//! `DROP STREAMING TABLE`.

use datafusion::common::{DataFusionError, Result, TableReference};

use crate::table::TableName;

use super::CdcSession;

impl CdcSession {
    pub(super) async fn drop_table(&self, name: &TableName, if_exists: bool) -> Result<()> {
        if !self.warehouse.exists(name).await? {
            if if_exists {
                return Ok(());
            }
            return Err(DataFusionError::Plan(format!(
                "streaming table '{name}' does not exist"
            )));
        }
        self.warehouse.delete_table(name).await?;
        self.ctx.deregister_table(TableReference::partial(
            name.schema.clone(),
            name.table.clone(),
        ))?;
        if let Ok(mut tables) = self.tables.lock() {
            tables.remove(name);
        }
        Ok(())
    }
}
