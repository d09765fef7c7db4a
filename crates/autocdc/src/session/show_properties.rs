//! `SHOW TBLPROPERTIES name [(key)]`: a streaming table's properties, one
//! row each (`key`, `value`), as Databricks shows them.
//!
//! The properties are those of the table's Delta configuration that a user
//! sets or reads: `TBLPROPERTIES` given at creation, `autocdc.buckets`, the
//! tombstone retention and the `delta.*` ones. Our bookkeeping kept there
//! (the declaration, flow definitions, checkpoints, snapshot versions) is
//! not a property and is not shown.

use std::sync::Arc;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::Result;
use datafusion::dataframe::DataFrame;

use super::CdcSession;
use crate::table::properties::{
    FLOW_KEY_PREFIX, SNAPSHOT_PROPERTY_PREFIX, SNAPSHOT_WATERMARK_PROPERTY,
    SOURCE_CHECKPOINT_PREFIX, TABLE_KEY,
};
use crate::table::{delta_err, TableName};

/// Whether `key` is bookkeeping rather than a table property.
fn is_bookkeeping(key: &str) -> bool {
    key == TABLE_KEY
        || key == SNAPSHOT_WATERMARK_PROPERTY
        || [
            FLOW_KEY_PREFIX,
            SOURCE_CHECKPOINT_PREFIX,
            SNAPSHOT_PROPERTY_PREFIX,
        ]
        .iter()
        .any(|prefix| key.starts_with(prefix))
}

impl CdcSession {
    pub(super) async fn show_properties(
        &self,
        name: &TableName,
        key: Option<&str>,
    ) -> Result<DataFrame> {
        let table = self.table(name).await?;
        table.refresh().await?;
        let delta = table.delta();
        let configuration = delta
            .snapshot()
            .map_err(delta_err)?
            .metadata()
            .configuration()
            .clone();
        let mut rows: Vec<(String, String)> = match key {
            Some(key) => {
                let value = configuration
                    .get(key)
                    .filter(|_| !is_bookkeeping(key))
                    .cloned()
                    .unwrap_or_else(|| format!("Table {name} does not have property: {key}"));
                vec![(key.to_string(), value)]
            }
            None => configuration
                .into_iter()
                .filter(|(key, _)| !is_bookkeeping(key))
                .collect(),
        };
        rows.sort();
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("value", DataType::Utf8, false),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|(k, _)| k))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|(_, v)| v))),
            ],
        )?;
        self.ctx.read_batch(batch)
    }
}
