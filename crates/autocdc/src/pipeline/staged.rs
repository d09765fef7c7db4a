//! Staging an update's new change events: read once, while the update is
//! planned, to fit its plan to them.
//!
//! Which key buckets an update reads and rewrites, and whether it may retire
//! its keys' stored rows with deletion vectors, depend on its events. They
//! are pulled once from the flow's source, up to [`STAGE_MAX_BYTES`] held in
//! memory (and granted by the memory pool):
//!
//! ```text
//!  events ─► pull, bucket each batch ─┬─ end within the budget: Small — the plan reads
//!                                     │    the events from memory; touched buckets known
//!                                     └─ over it: Large — the plan reads the pulled
//!                                          batches, then the rest of the same run;
//!                                          every bucket is rewritten
//! ```
//!
//! Either way the source is read once: a small update's key probe and fold
//! read the staged batches (which keep their share of the pool until the
//! update's plan is dropped), a large one's fold the resumed stream. (A large
//! update of a flow with `APPLY AS TRUNCATE` reads its source again for the
//! truncate events, which the fold needs before any key.)

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{Int8Type, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::Result;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::{provider_as_source, MemTable};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, TableType};
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;

use super::started::resume_stream;
use crate::fold::columns::Kind;
use crate::fold::EventLayout;
use crate::table::bucket::bucket_array;

/// Most bytes of events an update holds in memory to plan itself.
pub const STAGE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// An update's events, read once.
#[derive(Debug)]
pub enum StagedEvents {
    /// Every event, in memory.
    Small {
        /// Reads the staged batches.
        events: LogicalPlan,
        /// The key buckets the events fall in; `None` when one is a TRUNCATE
        /// (it touches every key).
        touched: Option<Vec<i32>>,
    },
    /// More than the stage holds: the pulled batches, then the rest of the
    /// same run, readable once.
    Large {
        /// Reads the resumed run.
        events: LogicalPlan,
    },
}

/// `schema` with every field nullable.
fn all_nullable(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<_> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    Arc::new(arrow::datatypes::Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ))
}

/// Pull `events` (laid out as `layout`) once, bucketing them into `buckets`.
pub async fn stage_events(
    state: &SessionState,
    flow: &str,
    layout: &EventLayout,
    events: &LogicalPlan,
    buckets: i32,
) -> Result<StagedEvents> {
    let mut stream = DataFrame::new(state.clone(), events.clone())
        .execute_stream()
        .await?;
    // declared nullable: a plan may say a column holds no NULL while its
    // batches do, and a staged table travels in plans that check
    let schema = all_nullable(&stream.schema());
    let reservation = MemoryConsumer::new(format!("CdcStagedEvents[{flow}]"))
        .register(&state.runtime_env().memory_pool);
    let mut pulled: Vec<RecordBatch> = Vec::new();
    let mut touched = vec![false; usize::try_from(buckets).unwrap_or(0)];
    let mut truncated = false;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        let size = batch.get_array_memory_size();
        let fits =
            reservation.size() + size <= STAGE_MAX_BYTES && reservation.try_grow(size).is_ok();
        if !fits {
            pulled.push(batch);
            let table = resume_stream(
                format!("flow '{flow}': the change events read while planning"),
                pulled,
                stream,
            )?;
            let events = LogicalPlanBuilder::scan("__cdc_events", provider_as_source(table), None)?
                .build()?;
            return Ok(StagedEvents::Large { events });
        }
        let batch = batch.with_schema(Arc::clone(&schema))?;
        let kinds = batch.column(layout.kind()).as_primitive::<Int8Type>();
        let keys: Vec<ArrayRef> = layout
            .key_indices
            .iter()
            .map(|&i| Arc::clone(batch.column(i)))
            .collect();
        let rows = bucket_array(&keys, batch.num_rows(), buckets)?;
        for (bucket, kind) in rows.values().iter().zip(kinds.values().iter()) {
            if *kind == Kind::Truncate as i8 {
                truncated = true;
            } else if let Some(hit) = usize::try_from(*bucket)
                .ok()
                .and_then(|b| touched.get_mut(b))
            {
                *hit = true;
            }
        }
        pulled.push(batch);
    }
    // one partition per target partition, so the plan reads them in parallel
    let partitions = state.config().target_partitions().max(1);
    let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(); partitions];
    for (i, batch) in pulled.into_iter().enumerate() {
        parts[i % partitions].push(batch);
    }
    let table = StagedTable {
        batches: MemTable::try_new(schema, parts)?,
        _reservation: reservation,
    };
    let events =
        LogicalPlanBuilder::scan("__cdc_events", provider_as_source(Arc::new(table)), None)?
            .build()?;
    let touched = (!truncated).then(|| {
        touched
            .iter()
            .enumerate()
            .filter(|(_, hit)| **hit)
            .map(|(b, _)| b as i32)
            .collect()
    });
    Ok(StagedEvents::Small { events, touched })
}

/// Staged events: a [`MemTable`] that holds its share of the memory pool for
/// as long as the update's plan holds it.
#[derive(Debug)]
struct StagedTable {
    batches: MemTable,
    _reservation: MemoryReservation,
}

#[async_trait]
impl TableProvider for StagedTable {
    fn schema(&self) -> SchemaRef {
        self.batches.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.batches.scan(state, projection, filters, limit).await
    }
}
