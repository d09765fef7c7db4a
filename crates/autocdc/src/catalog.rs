//! The warehouse as a DataFusion catalog, for any `SessionContext`.
//!
//! ```no_run
//! # async fn demo() -> datafusion::error::Result<()> {
//! use datafusion::prelude::SessionContext;
//! use datafusion_autocdc::catalog::register_warehouse;
//! use datafusion_autocdc::table::Warehouse;
//!
//! let ctx = SessionContext::new();
//! register_warehouse(&ctx, "warehouse", Warehouse::open("./warehouse")?).await?;
//! ctx.sql("SELECT * FROM warehouse.public.users").await?.show().await?;
//! ctx.sql("SELECT * FROM table_changes('users', 0)").await?.show().await?;
//! # Ok(()) }
//! ```
//!
//! [`register_warehouse`] registers the warehouse's object store, a catalog
//! whose schemas are the warehouse's schema folders and whose tables are its
//! streaming tables (read-only [`ScdTable`] providers: live rows, visible
//! columns), and the table functions `table_changes`, `table_as_of`,
//! `scd2_as_of`, `bitemporal_as_of` and `event_log` over them. A table created after the registration (by a `CdcSession`, another
//! process) is found by a query that names it; listings
//! (`information_schema`, `SHOW TABLES`) and the table functions know the
//! tables found so far. Flows, DML and `REFRESH` need a [`crate::CdcSession`].

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableProvider};
use datafusion::common::{DataFusionError, Result};
use datafusion::prelude::SessionContext;

use crate::functions::{
    BitemporalAsOfFunction, EventLogFunction, Scd2AsOfFunction, TableAsOfFunction,
    TableChangesFunction, TableRegistry,
};
use crate::table::{ScdTable, TableName, Warehouse};

/// Register `warehouse` in `ctx` as the catalog `name`, with our table
/// functions (see the module docs); returns the catalog.
pub async fn register_warehouse(
    ctx: &SessionContext,
    name: &str,
    warehouse: Warehouse,
) -> Result<Arc<WarehouseCatalog>> {
    let found = Arc::new(Found {
        warehouse: Arc::new(warehouse),
        registry: TableRegistry::default(),
    });
    ctx.register_object_store(found.warehouse.root(), found.warehouse.store());
    for table in found.warehouse.list_tables().await? {
        // (a table that cannot be opened — another Delta writer committed
        // to it, say — does not keep the others from being read; a query
        // naming it says why)
        if let Err(e) = found.load(table.clone()).await {
            log::warn!("streaming table '{table}' cannot be opened: {e}");
        }
    }
    let catalog = Arc::new(WarehouseCatalog {
        found: Arc::clone(&found),
    });
    ctx.register_catalog(name, Arc::clone(&catalog) as _);
    ctx.register_udtf(
        "table_changes",
        Arc::new(TableChangesFunction::new(Arc::clone(&found.registry))),
    );
    ctx.register_udtf(
        "table_as_of",
        Arc::new(TableAsOfFunction::new(Arc::clone(&found.registry))),
    );
    ctx.register_udtf(
        "event_log",
        Arc::new(EventLogFunction::new(Arc::clone(&found.registry))),
    );
    ctx.register_udtf(
        "scd2_as_of",
        Arc::new(Scd2AsOfFunction::new(Arc::clone(&found.registry))),
    );
    ctx.register_udtf(
        "bitemporal_as_of",
        Arc::new(BitemporalAsOfFunction::new(Arc::clone(&found.registry))),
    );
    ctx.register_relation_planner(Arc::new(crate::sql::TimeTravelPlanner))?;
    Ok(catalog)
}

/// A warehouse's streaming tables as a DataFusion catalog.
#[derive(Debug)]
pub struct WarehouseCatalog {
    found: Arc<Found>,
}

/// A warehouse and the tables found in it so far (shared with the table
/// functions).
#[derive(Debug)]
struct Found {
    warehouse: Arc<Warehouse>,
    registry: TableRegistry,
}

fn poisoned() -> DataFusionError {
    DataFusionError::Internal("poisoned table registry".into())
}

impl Found {
    /// Load a table and remember it.
    async fn load(&self, name: TableName) -> Result<Arc<ScdTable>> {
        let table = Arc::new(ScdTable::load(&self.warehouse, name.clone()).await?);
        self.registry
            .lock()
            .map_err(|_| poisoned())?
            .insert(name, Arc::clone(&table));
        Ok(table)
    }

    /// A table found before.
    fn known(&self, name: &TableName) -> Option<Arc<ScdTable>> {
        self.registry.lock().ok()?.get(name).cloned()
    }

    /// Names of the tables found so far, in `schema` or in every schema.
    fn names(&self, schema: Option<&str>) -> BTreeSet<TableName> {
        match self.registry.lock() {
            Ok(tables) => tables
                .keys()
                .filter(|n| schema.is_none_or(|s| n.schema == s))
                .cloned()
                .collect(),
            Err(_) => BTreeSet::new(),
        }
    }
}

impl CatalogProvider for WarehouseCatalog {
    fn schema_names(&self) -> Vec<String> {
        let schemas: BTreeSet<String> = self
            .found
            .names(None)
            .into_iter()
            .map(|n| n.schema)
            .collect();
        schemas.into_iter().collect()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        // any schema may hold tables created later
        Some(Arc::new(WarehouseSchema {
            found: Arc::clone(&self.found),
            schema: name.to_string(),
        }))
    }
}

/// One schema folder of a warehouse.
#[derive(Debug)]
struct WarehouseSchema {
    found: Arc<Found>,
    schema: String,
}

impl WarehouseSchema {
    fn name(&self, table: &str) -> TableName {
        TableName {
            schema: self.schema.clone(),
            table: table.to_string(),
        }
    }
}

#[async_trait]
impl SchemaProvider for WarehouseSchema {
    fn table_names(&self) -> Vec<String> {
        self.found
            .names(Some(&self.schema))
            .into_iter()
            .map(|n| n.table)
            .collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let name = self.name(name);
        if let Some(table) = self.found.known(&name) {
            // what other writers committed since
            table.refresh().await?;
            return Ok(Some(table as _));
        }
        if !self.found.warehouse.exists(&name).await? {
            return Ok(None);
        }
        Ok(Some(self.found.load(name).await? as _))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.found.known(&self.name(name)).is_some()
    }
}
