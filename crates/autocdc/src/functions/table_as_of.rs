//! `table_as_of('target', version)` and `table_as_of('target', TIMESTAMP
//! '…')`: a streaming table as of an older Delta commit (time travel) — its
//! live rows then, bookkeeping hidden, in the table's current columns (a
//! column added since reads NULL). A timestamp names the newest commit made
//! at or before it (commit times are the commits' own, as `event_log` shows
//! them); it is resolved when the query runs.

use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
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
        let [Expr::Literal(name, _), Expr::Literal(at, _)] = args else {
            return plan_err!(
                "table_as_of('target', version | TIMESTAMP '…') takes a table name and a \
                 commit version or time"
            );
        };
        let (ScalarValue::Utf8(Some(name)) | ScalarValue::Utf8View(Some(name))) = name else {
            return plan_err!(
                "table_as_of(): the first argument is a streaming table name as a string"
            );
        };
        let at = match at.data_type() {
            DataType::Timestamp(..) | DataType::Date32 | DataType::Date64 => {
                match at.cast_to(&DataType::Timestamp(TimeUnit::Millisecond, None)) {
                    Ok(ScalarValue::TimestampMillisecond(Some(ms), _)) => At::Time(ms),
                    _ => return plan_err!("table_as_of(): the commit time must not be NULL"),
                }
            }
            // integers only: 1.9 is no version (a cast would make it 1)
            t => match at.cast_to(&DataType::Int64) {
                Ok(ScalarValue::Int64(Some(v))) if v >= 0 && (t.is_integer() || t.is_string()) => {
                    At::Version(v as u64)
                }
                _ => {
                    return plan_err!(
                        "table_as_of(): the version must be a non-negative integer or a \
                         TIMESTAMP, got {at}"
                    )
                }
            },
        };
        let table = super::lookup_table(&self.tables, "table_as_of", name)?;
        if let At::Version(version) = at {
            let latest = table.delta().version().unwrap_or(0);
            if version > latest {
                return plan_err!(
                    "table_as_of('{name}', {version}): the table's versions are 0 to {latest}"
                );
            }
        }
        Ok(Arc::new(AsOfTable { table, at }))
    }
}

/// Which commit a `table_as_of` call names.
#[derive(Debug, Clone, Copy)]
enum At {
    Version(u64),
    /// The newest commit at or before this time (ms since the epoch).
    Time(i64),
}

/// A streaming table read at an older version (loaded when scanned).
#[derive(Debug)]
struct AsOfTable {
    table: Arc<ScdTable>,
    at: At,
}

impl AsOfTable {
    /// The commit version the call names.
    async fn version(&self) -> Result<u64> {
        match self.at {
            At::Version(version) => Ok(version),
            At::Time(ms) => match self.table.version_at(ms).await? {
                Some(version) => Ok(version),
                None => {
                    let when = chrono::DateTime::from_timestamp_millis(ms)
                        .map_or_else(|| ms.to_string(), |t| t.naive_utc().to_string());
                    plan_err!(
                        "table_as_of('{}', TIMESTAMP '{when}'): the table was created after \
                         that time",
                        self.table.name()
                    )
                }
            },
        }
    }
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
        let old = self.table.as_of(self.version().await?).await?;
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
