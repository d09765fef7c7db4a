//! A schema whose streaming tables are read at their latest committed
//! version.
//!
//! A session registers its streaming tables in schemas of its context. Each
//! [`ScdTable`] reads the Delta version it loaded last; another session or
//! process may have committed since. DataFusion looks a table up once for
//! each statement it plans (`SessionContext::sql`, `SessionContext::table`,
//! a flow's query), so bringing a streaming table to its latest version at
//! lookup makes every statement read what was committed when it was
//! planned — however it reaches the context. Other tables (sources the
//! user registered) are handed over as they are.
//!
//! A read that must match the version it records (a flow's source
//! checkpoint) scans [`ScdTable::pinned`], which later lookups do not move.
//! A statement that brought its target up to date itself and then plans
//! SQL naming it (`MERGE`) plans [`with_current`]: its lookups take the
//! target as it is, instead of listing its log a second time.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::common::Result;
use datafusion::logical_expr::TableType;

use crate::table::foreign::ForeignDelta;
use crate::table::{ScdTable, TableName};

tokio::task_local! {
    /// Streaming tables the running statement brought to their latest
    /// version already.
    static CURRENT: Vec<TableName>;
}

/// Run `planning` with `tables` taken as current by the lookups it makes.
pub(super) async fn with_current<F: Future>(tables: Vec<TableName>, planning: F) -> F::Output {
    CURRENT.scope(tables, planning).await
}

/// A schema of the session's context: `inner`'s tables, a streaming table
/// refreshed each time it is looked up.
#[derive(Debug)]
pub(super) struct LatestSchema {
    inner: Arc<dyn SchemaProvider>,
}

impl LatestSchema {
    /// `inner`, unless it already is a `LatestSchema`.
    pub(super) fn wrap(inner: Arc<dyn SchemaProvider>) -> Option<Self> {
        (!inner.is::<Self>()).then_some(Self { inner })
    }
}

#[async_trait]
impl SchemaProvider for LatestSchema {
    fn owner_name(&self) -> Option<&str> {
        self.inner.owner_name()
    }

    fn table_names(&self) -> Vec<String> {
        self.inner.table_names()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let table = self.inner.table(name).await?;
        let stale = |t: &ScdTable| {
            !CURRENT
                .try_with(|current| current.contains(t.name()))
                .unwrap_or(false)
        };
        if let Some(streaming) = table
            .as_ref()
            .and_then(|t| t.downcast_ref::<ScdTable>())
            .filter(|t| stale(t))
        {
            streaming.refresh().await?;
        }
        // (a Delta table another tool writes: its latest version too)
        if let Some(foreign) = table
            .as_ref()
            .and_then(|t| t.downcast_ref::<ForeignDelta>())
        {
            foreign.refresh().await?;
        }
        Ok(table)
    }

    async fn table_type(&self, name: &str) -> Result<Option<TableType>> {
        // (no refresh: what kind of table it is does not change)
        self.inner.table_type(name).await
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        self.inner.register_table(name, table)
    }

    fn deregister_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        self.inner.deregister_table(name)
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::common::Result;
    use datafusion::datasource::provider_as_source;
    use datafusion::logical_expr::LogicalPlanBuilder;
    use object_store::memory::InMemory;

    use crate::table::TableName;
    use crate::{AutoCdcConfig, CdcSession};

    async fn text(session: &CdcSession, sql: &str) -> Result<String> {
        let batches = session.context().sql(sql).await?.collect().await?;
        Ok(pretty_format_batches(&batches)?.to_string())
    }

    /// A lookup through the context reads what another session committed;
    /// a pinned copy keeps reading the version it was pinned at.
    #[tokio::test(flavor = "multi_thread")]
    async fn lookups_read_the_latest_version_and_pinned_copies_stay() -> Result<()> {
        let store = Arc::new(InMemory::new());
        let one = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone())).await?;
        for sql in [
            "CREATE TABLE raw (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
            "CREATE STREAMING TABLE t",
            "CREATE FLOW f AS AUTO CDC INTO t FROM raw KEYS (id) SEQUENCE BY seq",
        ] {
            one.sql(sql).await?.collect().await?;
        }
        let name = TableName::from_parts(&["t".to_string()])?;
        let Some(table) = one.streaming_table(&name) else {
            panic!("t is registered")
        };
        let pinned = Arc::new(table.pinned());

        let other = CdcSession::open(AutoCdcConfig::in_memory_on(store)).await?;
        other
            .sql("UPDATE t SET v = 'b' WHERE id = 1")
            .await?
            .collect()
            .await?;

        let latest = text(&one, "SELECT id, v FROM t").await?;
        assert!(latest.contains("| 1  | b |"), "{latest}");
        let plan = LogicalPlanBuilder::scan("pinned", provider_as_source(pinned), None)?.build()?;
        let batches = one
            .context()
            .execute_logical_plan(plan)
            .await?
            .collect()
            .await?;
        let before = pretty_format_batches(&batches)?.to_string();
        assert!(before.contains("| 1  | a |"), "{before}");
        Ok(())
    }
}
