//! `stream(table)`: the documented way to name a flow source. Flows read
//! their whole source at every update (replays are harmless), so
//! `stream(t)` reads `t` itself; it exists so the documented SQL —
//! `FROM stream(cdc_data.users)` — works verbatim in flows and in queries.
//!
//! A table function is called while a statement is planned, synchronously:
//! a streaming table is taken from the session's tables as it is (the
//! session brings the tables a statement streams to their latest version
//! before planning it), any other table from its schema when that answers
//! at once.

use std::sync::Arc;

use datafusion::catalog::{
    CatalogProviderList, TableFunctionArgs, TableFunctionImpl, TableProvider,
};
use datafusion::common::{plan_err, DataFusionError, Result, TableReference};
use datafusion::logical_expr::Expr;
use futures::FutureExt;

use super::TableRegistry;
use crate::table::TableName;

/// The `stream(table)` table function.
#[derive(Debug)]
pub struct StreamFunction {
    catalogs: Arc<dyn CatalogProviderList>,
    /// The catalog of the session's streaming tables.
    catalog: String,
    /// The session's streaming tables.
    tables: TableRegistry,
}

impl StreamFunction {
    /// A function resolving names in `catalogs` (by the session's default
    /// catalog and schema when called), streaming tables of `catalog` in
    /// `tables`.
    pub fn new(
        catalogs: Arc<dyn CatalogProviderList>,
        catalog: String,
        tables: TableRegistry,
    ) -> Self {
        Self {
            catalogs,
            catalog,
            tables,
        }
    }
}

impl TableFunctionImpl for StreamFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        // (names resolve by the defaults the session has now: `SET
        // datafusion.catalog.default_schema` moves them)
        let defaults = &args.session().config_options().catalog;
        let (default_catalog, default_schema) = (
            defaults.default_catalog.clone(),
            defaults.default_schema.clone(),
        );
        let [Expr::Column(column)] = args.exprs() else {
            return plan_err!("stream() takes one table name, e.g. stream(cdc_data.users)");
        };
        // `stream(a.b.c)` arrives as column `c` of relation `a.b`
        let reference = match &column.relation {
            None => TableReference::bare(column.name.clone()),
            Some(TableReference::Bare { table }) => {
                TableReference::partial(table.clone(), column.name.clone())
            }
            Some(r) => TableReference::full(
                r.schema().unwrap_or_default().to_string(),
                r.table().to_string(),
                column.name.clone(),
            ),
        };
        let resolved = reference.clone().resolve(&default_catalog, &default_schema);
        if *resolved.catalog == *self.catalog {
            let name = TableName {
                schema: resolved.schema.to_string(),
                table: resolved.table.to_string(),
            };
            let streaming = self
                .tables
                .lock()
                .map_err(|_| DataFusionError::Internal("poisoned table registry".into()))?
                .get(&name)
                .cloned();
            if let Some(table) = streaming {
                return Ok(table);
            }
        }
        let schema = self
            .catalogs
            .catalog(&resolved.catalog)
            .and_then(|c| c.schema(&resolved.schema))
            .ok_or_else(|| {
                DataFusionError::Plan(format!("stream(): schema '{}' not found", resolved.schema))
            })?;
        // catalogs of this session answer at once; anything else is refused
        // rather than blocking the planner
        match schema.table(&resolved.table).now_or_never() {
            Some(Ok(Some(table))) => Ok(table),
            Some(Ok(None)) => plan_err!("stream(): table '{reference}' not found"),
            Some(Err(e)) => Err(e),
            None => plan_err!("stream(): table '{reference}' cannot be resolved synchronously"),
        }
    }
}
