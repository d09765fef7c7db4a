//! Append flows (SPEC §4.4): `CREATE FLOW f AS INSERT INTO t BY NAME query`
//! and `CREATE STREAMING TABLE t AS query`. Each run appends the rows the
//! query yields from the new data of its streams, exactly once: the streams'
//! checkpoint commits with the rows.
//!
//! ```text
//!   CdcCommitExec ── one commit: adds + checkpoint + flow definition
//!        ▲
//!   CdcWriteExec ─── files of visible rows (no change files: readers
//!        ▲            derive the inserts from the adds)
//!   [ExpectationsExec]
//!        ▲
//!   query (streams read from their checkpoints), columns by name, cast to
//!   the table's, as state rows (live, no sequence)
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
use datafusion::logical_expr::{cast, col, lit, Expr, Extension, LogicalPlan, LogicalPlanBuilder};
use datafusion::scalar::ScalarValue;

use super::source;
use crate::fold::columns::{Kind, INTERNAL_PREFIX, KIND_COL, SEQ_COL, WRITTEN_AT_COL};
use crate::logical::{CdcCommitNode, CdcWriteNode};
use crate::spec::resolve::{
    check_change_feed_names_in, compatible, storage_type, written_at_type, written_at_value,
    RESERVED_COLUMNS,
};
use crate::spec::FlowSpec;
use crate::table::bucket::bucket_field;
use crate::table::commit::{ChangeFeed, CommitRequest, MetadataChange, Replaces};
use crate::table::event::Operation;
use crate::table::properties::FLOW_KEY_PREFIX;
use crate::table::reject_sink::RejectSink;
use crate::table::rejects::takes_rejects;
use crate::table::{delta_err, ScdTable};

/// The plan of one run of `flow` (an append flow) into `table`: its rows,
/// written by a `CdcWriteExec` and committed by a `CdcCommitExec`.
pub async fn plan_append(
    state: &SessionState,
    table: Arc<ScdTable>,
    flow: &FlowSpec,
    operation: Operation,
    now: DateTime<Utc>,
) -> Result<LogicalPlan> {
    let started = Instant::now();
    // (a full refresh's first update carries its clear: see `plan_update`)
    let clearing = operation == Operation::FullRefresh;
    let meta = match clearing {
        true => table.meta().cleared(),
        false => table.meta(),
    };
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
        // (a table with them would read as an SCD 2 or BITEMPORAL target)
        if RESERVED_COLUMNS.contains(&field.name().to_lowercase().as_str()) {
            return Err(DataFusionError::Plan(format!(
                "flow '{}': column '{}' of the query uses a name reserved for the history \
                 columns of SCD 2 and BITEMPORAL targets ({}); rename it in the query \
                 (SELECT {} AS …)",
                flow.name,
                field.name(),
                RESERVED_COLUMNS.join(", "),
                field.name()
            )));
        }
        if meta.user_schema.fields().is_empty()
            && !crate::spec::resolve::delta_can_store(field.data_type())
        {
            return Err(DataFusionError::Plan(format!(
                "flow '{}': column '{}' of the query has type {}, which a Delta table cannot \
                 store: CAST it (to a TIMESTAMP, a BIGINT or a STRING, say), or leave it out",
                flow.name,
                field.name(),
                field.data_type()
            )));
        }
        if let Ok(column) = user_schema.field_with_name(field.name()) {
            // (a fraction cut off, a boolean written as text: a changed value)
            if !compatible(field.data_type(), column.data_type()) {
                return Err(DataFusionError::Plan(format!(
                    "flow '{}': INSERT INTO {} BY NAME: column '{}' has type {} in the query \
                     but {} in the table; CAST it in the query if the conversion is meant",
                    flow.name,
                    table.name(),
                    field.name(),
                    field.data_type(),
                    column.data_type()
                )));
            }
        } else {
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
    let names: Vec<String> = user_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    check_change_feed_names_in(&flow.name, "query", &names)?;
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
    // (a value the table's narrower column cannot hold, an upstream column
    // widened since, fails naming the flow, column and value)
    let source = super::fits::with_fit_checks(&flow.name, "INSERT INTO", read.plan, &user_schema)?;
    let rows = LogicalPlanBuilder::from(source).project(columns)?.build()?;
    // the table's expectations check the rows to append
    // with rejects on, the rows an expectation drops go to the rejects
    let rejects = takes_rejects(&meta.properties)
        .then(|| Arc::new(RejectSink::new(flow.name.clone(), Vec::new())));
    let (rows, expectations) = if meta.decl.expectations.is_empty() {
        (rows, None)
    } else {
        let (rows, counts) =
            super::check_expectations(state, flow, &meta.decl.expectations, rows, rejects.clone())?;
        (rows, Some(counts))
    };
    let mut metadata = Vec::new();
    if clearing {
        metadata.push(MetadataChange::forget_reads());
    }
    metadata.extend(meta.full_refresh_marks(&flow.name, clearing));
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
        metadata.push(MetadataChange::Schema(Arc::new(Schema::new(fields))));
    }
    if operation == Operation::CreateFlow {
        let json = serde_json::to_string(flow).map_err(delta_err)?;
        metadata.push(MetadataChange::Set(
            format!("{FLOW_KEY_PREFIX}{}", flow.name),
            json,
        ));
    }
    if let Some((key, value)) = read.checkpoint {
        metadata.push(MetadataChange::Set(key, value));
    }
    // rows spread over buckets by all their columns; no change file:
    // readers derive the inserts from the new files
    let spread = (0..user_schema.fields().len()).collect();
    let write = super::write_request(&table, &flow.name, spread, ChangeFeed::FromAdds);
    let commit = CommitRequest {
        target: table.name().clone(),
        table: Arc::clone(&table),
        flow: flow.clone(),
        metadata,
        run: super::next_run(&table, &flow.name).await?,
        // no stored row is replaced (but by a clear)
        replaces: match clearing {
            true => Replaces::All,
            false => Replaces::Nothing,
        },
        operation,
        started,
        expectations,
        update_id: crate::table::event::current_update_id(),
        newest_input_ms: read.newest_input_ms,
        rejects,
        clears: clearing,
    };
    let write = LogicalPlan::Extension(Extension {
        node: Arc::new(CdcWriteNode::try_new(Arc::new(write), rows)?),
    });
    Ok(LogicalPlan::Extension(Extension {
        node: Arc::new(CdcCommitNode::try_new(Arc::new(commit), write)?),
    }))
}
