//! `CREATE [OR REFRESH] STREAMING TABLE`: a new Delta table with its
//! protocol, declared columns and table properties.

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{DataFusionError, Result, TableReference};

use crate::fold::columns::{INTERNAL_PREFIX, KIND_COL};
use crate::spec::resolve::storage_type;
use crate::sql::CreateStreamingTable;
use crate::table::bucket::{bucket_field, DEFAULT_BUCKETS};
use crate::table::delta_err;
use crate::table::meta::{parse_compression, TableDecl};
use crate::table::properties::{
    BUCKETS_PROPERTY, CHANGE_DATA_FEED_PROPERTY, COMPRESSION_PROPERTY, DELETION_VECTORS_PROPERTY,
    TABLE_KEY,
};
use crate::table::rejects::{rejects_table_name, takes_rejects, REJECTS_COLUMNS, REJECTS_PROPERTY};

use super::CdcSession;

impl CdcSession {
    pub(crate) async fn create_table(&self, c: CreateStreamingTable) -> Result<()> {
        if self.warehouse.exists(&c.name).await? {
            if c.or_refresh || c.if_not_exists {
                let table = self.table(&c.name).await?;
                if takes_rejects(&table.meta().properties) {
                    self.create_rejects_table(&c).await?;
                }
                return Ok(());
            }
            return Err(DataFusionError::Plan(format!(
                "streaming table '{}' already exists",
                c.name
            )));
        }
        let reference = TableReference::partial(c.name.schema.clone(), c.name.table.clone());
        if self.ctx.table_exist(reference).unwrap_or(false) {
            return Err(DataFusionError::Plan(format!(
                "a table named '{}' already exists in this session",
                c.name
            )));
        }
        let mut fields = Vec::with_capacity(c.columns.len() + 1);
        if !c.columns.is_empty() {
            let state = self.dialect_state(&c.dialect);
            let select = c
                .columns
                .iter()
                .enumerate()
                .map(|(i, (_, ty))| format!("CAST(NULL AS {ty}) AS c{i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let plan = state
                .create_logical_plan(&format!("SELECT {select}"))
                .await?;
            for ((name, _), field) in c.columns.iter().zip(plan.schema().fields()) {
                if name.starts_with(INTERNAL_PREFIX) {
                    return Err(DataFusionError::Plan(format!(
                        "streaming table '{}': column '{name}' uses the reserved prefix {INTERNAL_PREFIX}",
                        c.name
                    )));
                }
                fields.push(Field::new(name, storage_type(field.data_type()), true));
            }
        }
        fields.push(Field::new(KIND_COL, DataType::Int8, false));
        fields.push(bucket_field());
        let buckets = match c.properties.iter().find(|(k, _)| k == BUCKETS_PROPERTY) {
            Some((_, v)) => v.parse::<i32>().ok().filter(|b| *b > 0).ok_or_else(|| {
                DataFusionError::Plan(format!("streaming table '{}': {BUCKETS_PROPERTY} must be a positive integer, got '{v}'", c.name))
            })?,
            None => DEFAULT_BUCKETS,
        };
        if let Some((_, v)) = c.properties.iter().find(|(k, _)| k == COMPRESSION_PROPERTY) {
            parse_compression(v)
                .map_err(|e| DataFusionError::Plan(format!("streaming table '{}': {e}", c.name)))?;
        }
        // per-column sequencing: the properties are read now, the groups
        // checked against the columns when a flow plans
        let properties: std::collections::HashMap<String, String> =
            c.properties.iter().cloned().collect();
        crate::spec::sequence_groups::declared(&c.name.to_string(), &properties)?;
        let decl = TableDecl {
            declared_columns: !c.columns.is_empty(),
            expectations: c.expectations.clone(),
        };
        let mut config: Vec<(String, Option<String>)> = vec![(
            TABLE_KEY.to_string(),
            Some(serde_json::to_string(&decl).map_err(delta_err)?),
        )];
        config.extend(
            c.properties
                .iter()
                .filter(|(k, _)| k != BUCKETS_PROPERTY)
                .map(|(k, v)| (k.clone(), Some(v.clone()))),
        );
        config.push((BUCKETS_PROPERTY.to_string(), Some(buckets.to_string())));
        // every update writes its net change as Delta CDC files
        config.push((
            CHANGE_DATA_FEED_PROPERTY.to_string(),
            Some("true".to_string()),
        ));
        let deletion_vectors =
            crate::config::autocdc_options(self.ctx.state().config()).deletion_vectors;
        if deletion_vectors {
            config.push((
                DELETION_VECTORS_PROPERTY.to_string(),
                Some("true".to_string()),
            ));
        }
        self.warehouse
            .create_state_store(&c.name, Schema::new(fields), config, deletion_vectors)
            .await?;
        let rejects = c
            .properties
            .iter()
            .any(|(k, v)| k == REJECTS_PROPERTY && v.eq_ignore_ascii_case("true"));
        if rejects {
            self.create_rejects_table(&c).await?;
        }
        self.attach(c.name).await?;
        Ok(())
    }

    /// `<t>__rejects` of a target with rejects on, unless it exists.
    async fn create_rejects_table(&self, target: &CreateStreamingTable) -> Result<()> {
        let rejects = CreateStreamingTable {
            name: rejects_table_name(&target.name),
            or_refresh: false,
            if_not_exists: true,
            columns: REJECTS_COLUMNS
                .iter()
                .map(|(name, ty)| (name.to_string(), ty.to_string()))
                .collect(),
            properties: vec![],
            dialect: target.dialect.clone(),
            query: None,
            flow: None,
            expectations: vec![],
        };
        Box::pin(self.create_table(rejects)).await
    }
}
