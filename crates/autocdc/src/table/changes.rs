//! The change data feed of a streaming table, read through deltalake's own
//! CDF reader as any Delta reader reads it: the published table's visible
//! columns plus `_change_type`, `_commit_version` (BIGINT) and
//! `_commit_timestamp` (TIMESTAMP, UTC), the types Delta gives them.
//! `table_changes` and the flows reading a streaming table's changes share it.

use std::sync::Arc;

use arrow::datatypes::{DataType, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use deltalake_core::delta_datafusion::DeltaCdfTableProvider;
use deltalake_core::DeltaTable;

use super::provider::{plan_read, ReadRequest};
use super::published::{publish, PublishedLocation};
use super::ScdTable;
use crate::fold::columns::INTERNAL_PREFIX;

/// The change feed's commit version: a Delta `long` (deltalake reads it as
/// `UInt64`; a reader sees `BIGINT`).
const COMMIT_VERSION: &str = "_commit_version";
/// The change feed's commit time: a Delta `timestamp` (deltalake reads it
/// as milliseconds without a zone; a reader sees microseconds in UTC).
const COMMIT_TIMESTAMP: &str = "_commit_timestamp";

/// The change data feed of `table` over versions `from..=to` (`to`: the
/// latest): that of its published table, which holds only the visible
/// columns and rows (tables of the earlier layout: their own, with the
/// `__cdc_*` columns hidden).
pub(crate) fn changes_provider(
    table: &ScdTable,
    from: u64,
    to: Option<u64>,
) -> Result<Arc<dyn TableProvider>> {
    let state = table.delta();
    // the schema: the state's change feed less our columns, which is the
    // published table's change feed
    let state_changes = cdf_provider(&state, from, to)?;
    let fields: Vec<_> = state_changes
        .schema()
        .fields()
        .iter()
        .filter(|f| !f.name().starts_with(INTERNAL_PREFIX))
        .map(|f| match f.name().as_str() {
            COMMIT_VERSION => Arc::new(f.as_ref().clone().with_data_type(DataType::Int64)),
            COMMIT_TIMESTAMP => Arc::new(f.as_ref().clone().with_data_type(DataType::Timestamp(
                TimeUnit::Microsecond,
                Some("UTC".into()),
            ))),
            _ => Arc::clone(f),
        })
        .collect();
    let source = match table.published_location() {
        Some(location) => ChangesSource::Published {
            state,
            location: location.clone(),
        },
        None => ChangesSource::Ready(state_changes),
    };
    Ok(Arc::new(ChangesTable {
        name: table.name().to_string(),
        source,
        from,
        to,
        schema: Arc::new(Schema::new(fields)),
    }))
}

/// deltalake's change data feed reader of `table` over `from..=to`.
fn cdf_provider(table: &DeltaTable, from: u64, to: Option<u64>) -> Result<Arc<dyn TableProvider>> {
    let mut builder = table.clone().scan_cdf().with_starting_version(from);
    if let Some(to) = to {
        builder = builder.with_ending_version(to);
    }
    Ok(Arc::new(
        DeltaCdfTableProvider::try_new(builder)
            .map_err(|e| DataFusionError::External(Box::new(e)))?,
    ))
}

/// Where a change feed is read from.
#[derive(Debug)]
enum ChangesSource {
    /// The published table of a state store, opened when read.
    Published {
        state: DeltaTable,
        location: PublishedLocation,
    },
    /// A reader ready to scan.
    Ready(Arc<dyn TableProvider>),
}

/// The change feed of one table over a version range.
#[derive(Debug)]
struct ChangesTable {
    /// The table's name (for messages).
    name: String,
    source: ChangesSource,
    from: u64,
    to: Option<u64>,
    schema: SchemaRef,
}

impl ChangesTable {
    /// `error` as what it means when deltalake finds a version of the range
    /// no longer in the log: a Delta tool cleaned the log up, following the
    /// table's `delta.logRetentionDuration` (our commits never do).
    fn cleaned_up(&self, error: DataFusionError) -> DataFusionError {
        let text = error.to_string();
        let Some(at) = text.find("Invalid table version: ") else {
            return error;
        };
        let version: String = text[at + 23..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        DataFusionError::Plan(format!(
            "the change data feed of '{}' from version {}: version {version} is no longer in \
             its log (a Delta tool cleaned the log up, as its delta.logRetentionDuration \
             allows); read it from a later version, or REFRESH … FULL the table whose flow \
             reads it",
            self.name, self.from
        ))
    }

    /// The reader of the change feed; `None`: the table has no published
    /// table yet (no flow has given it columns), so no change.
    async fn reader(&self) -> Result<Option<Arc<dyn TableProvider>>> {
        match &self.source {
            ChangesSource::Ready(reader) => Ok(Some(Arc::clone(reader))),
            ChangesSource::Published { state, location } => {
                // what an interrupted update committed is published first
                publish(state, location).await?;
                match location.load().await? {
                    Some(published) => Ok(Some(cdf_provider(&published, self.from, self.to)?)),
                    None => Ok(None),
                }
            }
        }
    }
}

#[async_trait]
impl TableProvider for ChangesTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
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
        let Some(reader) = self.reader().await.map_err(|e| self.cleaned_up(e))? else {
            let schema = match projection {
                Some(p) => Arc::new(self.schema.project(p)?),
                None => Arc::clone(&self.schema),
            };
            return Ok(Arc::new(EmptyExec::new(schema)));
        };
        let read = ReadRequest {
            projection,
            filters,
            limit,
        };
        let plan = plan_read(state, "changes", reader, &self.schema, None, read)
            .await
            .map_err(|e| self.cleaned_up(e))?;
        drop_empty_branches(plan)
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }
}

/// deltalake's CDF scan unions three file scans (CDC, add and remove files);
/// a range without files of a kind leaves a zero-partition branch, which a
/// sort pushed below the union rejects (SanityCheckPlan). Drop such branches;
/// a plan left with none becomes one empty partition.
fn drop_empty_branches(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = plan.schema();
    let plan = plan
        .transform_up(|node| {
            if node.downcast_ref::<UnionExec>().is_none() {
                return Ok(Transformed::no(node));
            }
            let children: Vec<Arc<dyn ExecutionPlan>> = node
                .children()
                .into_iter()
                .filter(|c| c.output_partitioning().partition_count() > 0)
                .cloned()
                .collect();
            if children.len() == node.children().len() {
                return Ok(Transformed::no(node));
            }
            if children.is_empty() {
                return Ok(Transformed::yes(
                    Arc::new(EmptyExec::new(node.schema())) as Arc<dyn ExecutionPlan>
                ));
            }
            Ok(Transformed::yes(UnionExec::try_new(children)?))
        })?
        .data;
    if plan.output_partitioning().partition_count() == 0 {
        return Ok(Arc::new(EmptyExec::new(schema)));
    }
    Ok(plan)
}
