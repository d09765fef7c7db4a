//! Delta tables this crate does not write: a table another tool wrote into
//! a warehouse folder, and `CREATE EXTERNAL TABLE … STORED AS DELTA`.
//!
//! Each is read as deltalake reads it, at its latest version when a
//! statement looks it up (as streaming tables are), and never written: an
//! `INSERT` (deltalake's provider takes them) would commit to another
//! tool's table, or, over a streaming table's path, to a table whose every
//! commit is ours.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::common::{plan_err, DataFusionError, Result, Statistics};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{CreateExternalTable, Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use deltalake_core::DeltaTable;

use super::{delta_err, table_builder};

/// `plan` with the statistics of its Parquet files left out: DataFusion 55
/// reads a column whose file statistics hold one value and no NULLs as that
/// value, and Delta's statistics (as Parquet's) leave NaN out, so a file of
/// `1.5` and `NaN` read `1.5` twice (sessions turn statistics off for
/// folders, `datafusion.execution.collect_statistics`; deltalake gives them
/// from the log).
fn without_file_statistics(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    use datafusion::common::tree_node::{Transformed, TreeNode};
    use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig};
    use datafusion::datasource::source::DataSourceExec;
    plan.transform_down(|node| {
        let Some(config) = node
            .downcast_ref::<DataSourceExec>()
            .and_then(|source| source.data_source().downcast_ref::<FileScanConfig>())
        else {
            return Ok(Transformed::no(node));
        };
        let files = || config.file_groups.iter().flat_map(|g| g.files());
        if files().all(|f| f.statistics.is_none()) {
            return Ok(Transformed::no(node));
        }
        let mut config = config.clone();
        config.file_groups = config
            .file_groups
            .iter()
            .map(|group| {
                FileGroup::new(
                    group
                        .files()
                        .iter()
                        .map(|file| {
                            let mut file = file.clone();
                            file.statistics = None;
                            file
                        })
                        .collect(),
                )
            })
            .collect();
        Ok(Transformed::yes(DataSourceExec::from_data_source(config)))
    })
    .map(|transformed| transformed.data)
}

/// A Delta table read here and written elsewhere (see the module docs).
#[derive(Debug)]
pub struct ForeignDelta {
    /// What messages call it.
    name: String,
    /// The table, brought to its latest version by [`Self::refresh`].
    table: tokio::sync::RwLock<DeltaTable>,
    /// deltalake's reader of the version loaded.
    reader: std::sync::RwLock<Arc<dyn TableProvider>>,
}

impl ForeignDelta {
    /// `table` (loaded), called `name` in messages.
    pub async fn new(name: String, table: DeltaTable) -> Result<Self> {
        let reader = table.table_provider().await.map_err(delta_err)?;
        Ok(Self {
            name,
            table: tokio::sync::RwLock::new(table),
            reader: std::sync::RwLock::new(reader),
        })
    }

    /// Read the latest version from now on (a lookup by a statement).
    pub async fn refresh(&self) -> Result<()> {
        let mut table = self.table.write().await;
        let before = table.version();
        table.update_state().await.map_err(delta_err)?;
        if table.version() != before {
            let reader = table.table_provider().await.map_err(delta_err)?;
            if let Ok(mut current) = self.reader.write() {
                *current = reader;
            }
        }
        Ok(())
    }

    fn reader(&self) -> Result<Arc<dyn TableProvider>> {
        self.reader
            .read()
            .map(|r| Arc::clone(&r))
            .map_err(|_| DataFusionError::Internal("poisoned Delta reader".into()))
    }
}

#[async_trait]
impl TableProvider for ForeignDelta {
    fn schema(&self) -> SchemaRef {
        match self.reader() {
            Ok(reader) => reader.schema(),
            Err(_) => Arc::new(arrow::datatypes::Schema::empty()),
        }
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self
            .reader()?
            .scan(state, projection, filters, limit)
            .await?;
        without_file_statistics(plan)
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        self.reader()?.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<Statistics> {
        self.reader().ok()?.statistics()
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        _input: Arc<dyn ExecutionPlan>,
        _op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan_err!(
            "INSERT INTO {}: a Delta table this warehouse does not write (another tool's, \
             or one read with STORED AS DELTA) is read here only",
            self.name
        )
    }
}

/// `CREATE EXTERNAL TABLE … STORED AS DELTA LOCATION 'path'`: a
/// [`ForeignDelta`] on the session's object store for the path.
#[derive(Debug, Default)]
pub struct ForeignDeltaFactory;

#[async_trait]
impl TableProviderFactory for ForeignDeltaFactory {
    async fn create(
        &self,
        state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> Result<Arc<dyn TableProvider>> {
        let [location] = cmd.locations.as_slice() else {
            return plan_err!(
                "CREATE EXTERNAL TABLE {} STORED AS DELTA: give one LOCATION",
                cmd.name
            );
        };
        let refuse = |what: &str| {
            plan_err!(
                "CREATE EXTERNAL TABLE {} STORED AS DELTA: {what} (a Delta table is read at \
                 its latest version, with its own columns and partitions)",
                cmd.name
            )
        };
        if !cmd.schema.fields().is_empty() {
            return refuse("columns are not declared");
        }
        if !cmd.table_partition_cols.is_empty() {
            return refuse("PARTITIONED BY is not taken");
        }
        // (time travel is `table_as_of` on streaming tables; here it would
        // be ignored by the storage options)
        if let Some(key) = cmd.options.keys().find(|k| {
            let last = k.rsplit('.').next().unwrap_or(k).to_ascii_lowercase();
            matches!(
                last.as_str(),
                "version" | "versionasof" | "timestampasof" | "timestamp"
            )
        }) {
            return refuse(&format!("option '{key}' is not taken"));
        }
        let url = ListingTableUrl::parse(location)?;
        let store = state.runtime_env().object_store(&url)?;
        let mut table_url: url::Url = AsRef::<url::Url>::as_ref(&url).clone();
        if !table_url.path().ends_with('/') {
            table_url.set_path(&format!("{}/", table_url.path()));
        }
        let table = table_builder(table_url, store)?
            .with_storage_options(cmd.options.clone())
            .load()
            .await
            .map_err(|e| {
                DataFusionError::Plan(format!(
                    "CREATE EXTERNAL TABLE {} STORED AS DELTA: no Delta table at '{}': {e}",
                    cmd.name, location
                ))
            })?;
        Ok(Arc::new(
            ForeignDelta::new(cmd.name.to_string(), table).await?,
        ))
    }
}
