//! Append flows (SPEC §4.4): `CREATE FLOW f AS INSERT INTO t BY NAME query`
//! and `CREATE STREAMING TABLE t AS query`. Each run appends the rows the
//! query yields from the new data of its streams, exactly once: the streams'
//! checkpoint commits with the rows.
//!
//! ```text
//!  query (streams read from their checkpoints) ─► columns by name, cast to
//!  the table's ─► state rows (live, no sequence) ─► files of visible rows
//!  ─► one commit: adds + checkpoint + flow definition (no change files:
//!     readers derive the inserts from the adds)
//! ```
//!
//! The rows are stored as live rows without a sequence, so the table reads,
//! publishes, time-travels and feeds `table_changes` like any target. An
//! append flow has no keys: the table's buckets spread rows by all their
//! columns.

use std::sync::Arc;
use std::time::Instant;

use arrow::datatypes::{DataType, Field, Schema};
use chrono::{DateTime, Utc};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{cast, col, lit, Expr, LogicalPlanBuilder};
use datafusion::physical_plan::execute_stream;
use datafusion::scalar::ScalarValue;

use super::source;
use crate::fold::columns::{Kind, INTERNAL_PREFIX, KIND_COL, SEQ_COL, WRITTEN_AT_COL};
use crate::spec::resolve::{storage_type, written_at_type, written_at_value};
use crate::spec::FlowSpec;
use crate::table::bucket::bucket_field;
use crate::table::commit::{write_rows, ChangeFeed, Edit, EditKind, MetadataChange, WrittenFiles};
use crate::table::event::{CommitEvent, Operation};
use crate::table::properties::FLOW_KEY_PREFIX;
use crate::table::{delta_err, ScdTable};

/// What one run of an append flow did.
#[derive(Debug, Clone, Copy)]
pub struct Appended {
    /// Rows the query yielded and the run appended.
    pub rows: u64,
    /// The commit's version.
    pub version: i64,
}

/// Run `flow` (an append flow) once into `table`.
pub async fn run_append(
    state: &SessionState,
    table: Arc<ScdTable>,
    flow: &FlowSpec,
    operation: Operation,
    now: DateTime<Utc>,
) -> Result<Appended> {
    let started = Instant::now();
    let meta = table.meta();
    let read = source::plan_changes(state, flow, &meta)
        .await
        .map_err(|e| source::in_from_clause(&flow.name, e))?;
    let source_schema = read.plan.schema().clone();
    // the table's columns: declared or fixed by an earlier run, else the query's
    let user_schema = if meta.user_schema.fields().is_empty() {
        Arc::new(Schema::new(
            source_schema
                .fields()
                .iter()
                .map(|f| Field::new(f.name(), storage_type(f.data_type()), true))
                .collect::<Vec<_>>(),
        ))
    } else {
        Arc::clone(&meta.user_schema)
    };
    for field in source_schema.fields() {
        if field.name().starts_with(INTERNAL_PREFIX) {
            return Err(DataFusionError::Plan(format!(
                "flow '{}': column '{}' uses the reserved prefix {INTERNAL_PREFIX}",
                flow.name,
                field.name()
            )));
        }
        if user_schema.field_with_name(field.name()).is_err() {
            return Err(DataFusionError::Plan(format!(
                "flow '{}': INSERT INTO {} BY NAME: column '{}' of the query is not a column of the table ({})",
                flow.name,
                table.name(),
                field.name(),
                user_schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    // by name; a column the query lacks is NULL
    let mut columns: Vec<Expr> = user_schema
        .fields()
        .iter()
        .map(|f| {
            let value = if source_schema.field_with_unqualified_name(f.name()).is_ok() {
                col(datafusion::common::Column::new_unqualified(f.name()))
            } else {
                lit(ScalarValue::Null)
            };
            cast(value, f.data_type().clone()).alias(f.name())
        })
        .collect();
    columns.push(cast(lit(ScalarValue::Null), DataType::Int64).alias(SEQ_COL));
    columns.push(lit(Kind::Upsert as i8).alias(KIND_COL));
    columns.push(lit(written_at_value(now.timestamp_micros())).alias(WRITTEN_AT_COL));
    let rows = LogicalPlanBuilder::from(read.plan)
        .project(columns)?
        .build()?;
    // the table's expectations check the rows to append
    let (rows, expectations) = if meta.decl.expectations.is_empty() {
        (rows, None)
    } else {
        let (rows, counts) = super::check_expectations(state, flow, &meta.decl.expectations, rows)?;
        (rows, Some(counts))
    };
    let physical = state.create_physical_plan(&rows).await?;
    let delta = table.delta();
    let store = delta.object_store();
    // rows spread over buckets by all their columns
    let spread: Vec<usize> = (0..user_schema.fields().len()).collect();
    let stream = execute_stream(physical, state.task_ctx())?;
    let WrittenFiles { adds, .. } = write_rows(
        &store,
        stream,
        &spread,
        meta.buckets,
        state.config().target_partitions(),
        ChangeFeed::FromAdds,
    )
    .await?;
    let appended: u64 = adds
        .iter()
        .filter_map(|a| {
            let stats: serde_json::Value = serde_json::from_str(a.stats.as_deref()?).ok()?;
            stats.get("numRecords")?.as_u64()
        })
        .sum();

    let mut edit = Edit::new(EditKind::Append);
    if meta.sequence_type.is_none() {
        // the first run fixes the table's columns
        let mut fields: Vec<Field> = user_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new(SEQ_COL, DataType::Int64, true));
        fields.push(Field::new(KIND_COL, DataType::Int8, false));
        fields.push(Field::new(WRITTEN_AT_COL, written_at_type(), true));
        fields.push(bucket_field());
        edit = edit.metadata(MetadataChange::Schema(Arc::new(Schema::new(fields))));
    }
    if operation == Operation::CreateFlow {
        let json = serde_json::to_string(flow).map_err(delta_err)?;
        edit = edit.metadata(MetadataChange::Set(
            format!("{FLOW_KEY_PREFIX}{}", flow.name),
            json,
        ));
    }
    if let Some((key, value)) = read.checkpoint {
        edit = edit.metadata(MetadataChange::Set(key, value));
    }
    let mut event = CommitEvent::new(operation, Some(&flow.name), started);
    event.upserted = appended;
    event.input = appended;
    event.expectations = expectations.map(|c| c.to_json());
    event.newest_input_ms = read.newest_input_ms;
    let version = edit
        .event(event)
        .written(WrittenFiles {
            adds,
            change_files: Vec::new(),
        })
        .next_run_of(&flow.name)
        .commit(&table)
        .await
        .map_err(|e| {
            DataFusionError::Execution(format!(
                "flow '{}': the append to '{}' could not be committed; nothing was appended: {e}",
                flow.name,
                table.name()
            ))
        })?;
    Ok(Appended {
        rows: appended,
        version,
    })
}
