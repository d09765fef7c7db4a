//! `table_as_of('target', version)`: a streaming table as of an older Delta
//! commit version (time travel) — its live rows then, bookkeeping hidden, in
//! the table's current columns (a column added since reads NULL).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Column, Result, ScalarValue};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::{
    cast, col, lit, Expr, LogicalPlanBuilder, TableProviderFilterPushDown, TableType,
};
use datafusion::physical_plan::ExecutionPlan;

use super::TableRegistry;
use crate::table::ScdTable;

/// The `table_as_of` table function.
#[derive(Debug)]
pub struct TableAsOfFunction {
    tables: TableRegistry,
}

impl TableAsOfFunction {
    /// A function over the session's streaming tables.
    pub fn new(tables: TableRegistry) -> Self {
        Self { tables }
    }
}

impl TableFunctionImpl for TableAsOfFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        let [Expr::Literal(name, _), Expr::Literal(version, _)] = args else {
            return plan_err!(
                "table_as_of('target', version) takes a table name and a commit version"
            );
        };
        let (ScalarValue::Utf8(Some(name)) | ScalarValue::Utf8View(Some(name))) = name else {
            return plan_err!(
                "table_as_of(): the first argument is a streaming table name as a string"
            );
        };
        let version = match version.cast_to(&arrow::datatypes::DataType::Int64) {
            Ok(ScalarValue::Int64(Some(v))) if v >= 0 => v as u64,
            _ => {
                return plan_err!(
                    "table_as_of(): the version must be a non-negative integer, got {version}"
                )
            }
        };
        let table = super::lookup_table(&self.tables, "table_as_of", name)?;
        let latest = table.delta().version().unwrap_or(0);
        if version > latest {
            return plan_err!(
                "table_as_of('{name}', {version}): the table's versions are 0 to {latest}"
            );
        }
        Ok(Arc::new(AsOfTable { table, version }))
    }
}

/// A streaming table read at an older version (loaded when scanned).
#[derive(Debug)]
struct AsOfTable {
    table: Arc<ScdTable>,
    version: u64,
}

#[async_trait]
impl TableProvider for AsOfTable {
    fn schema(&self) -> SchemaRef {
        self.table.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let old = self.table.as_of(self.version).await?;
        let schema = self.schema();
        if old.schema() == schema {
            return old.scan(state, projection, filters, limit).await;
        }
        // an older schema (SPEC §2.9): its rows in the current columns, NULL
        // in the columns added since, cast where a column widened since
        let old_schema = old.schema();
        let columns: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..schema.fields().len()).collect(),
        };
        let exprs: Vec<Expr> = columns
            .iter()
            .map(|&i| {
                let field = schema.field(i);
                let value = if old_schema.field_with_name(field.name()).is_ok() {
                    col(Column::new_unqualified(field.name()))
                } else {
                    lit(ScalarValue::Null)
                };
                cast(value, field.data_type().clone()).alias(field.name())
            })
            .collect();
        let plan =
            LogicalPlanBuilder::scan("__cdc_as_of", provider_as_source(Arc::new(old)), None)?
                .project(exprs)?
                .build()?;
        state.create_physical_plan(&plan).await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }
}
