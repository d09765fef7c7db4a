//! Validation of a [`FlowSpec`] against its source and target (clauses,
//! columns, types), producing the logical plan of the flow's change events.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, DataFusionError, Result, ScalarValue};
use datafusion::execution::session_state::SessionState;
use datafusion::functions::expr_fn::{coalesce, concat, named_struct};
use datafusion::logical_expr::{
    cast, lit, try_cast, when, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder,
};
use datafusion::sql::parser::DFParserBuilder;
use datafusion::sql::sqlparser::dialect::dialect_from_str;

use super::{ColumnSelection, FlowSource, FlowSpec, ScdType, SequenceBy};
use crate::fold::columns::{
    EventLayout, Kind, Origin, INTERNAL_PREFIX, KIND_COL, ORIGIN_COL, SEQ_COL, SYSTEM_SEQ_COL,
    UPDATE_LIST_COL, WRITTEN_AT_COL,
};
use crate::fold::PartialUpdates;
use crate::raise::raise_if;

/// SCD column names reserved in sources and targets.
pub const RESERVED_COLUMNS: [&str; 4] = [
    "__start_at",
    "__end_at",
    "__system_start_at",
    "__system_end_at",
];

/// Error naming `flow` when one of its target columns has a name of the
/// change data feed's own columns (a readChangeFeed source without a
/// `COLUMNS` clause brings all three): the target's feed would have the
/// column twice. (A query relation has no feed: it keeps them.)
pub fn check_change_feed_names(flow: &str, target_columns: &[String]) -> Result<()> {
    check_change_feed_names_in(flow, "COLUMNS", target_columns)
}

/// [`check_change_feed_names`] of the columns `clause` gives the target (an
/// append flow's query, which has no `COLUMNS` clause).
pub fn check_change_feed_names_in(
    flow: &str,
    clause: &str,
    target_columns: &[String],
) -> Result<()> {
    const CHANGE_FEED_COLUMNS: [&str; 3] = ["_change_type", "_commit_version", "_commit_timestamp"];
    match target_columns
        .iter()
        .find(|c| CHANGE_FEED_COLUMNS.contains(&c.to_ascii_lowercase().as_str()))
    {
        Some(name) => Err(flow_err(
            flow,
            clause,
            format!(
                "column '{name}' would be a target column, and the target's change data feed \
                 has a column of that name: leave it out ({})",
                match clause {
                    "COLUMNS" =>
                        "COLUMNS * EXCEPT (_change_type, _commit_version, \
                                  _commit_timestamp), or SELECT * EXCEPT (…) in a query",
                    _ => "SELECT * EXCEPT (_change_type, _commit_version, _commit_timestamp)",
                }
            ),
        )),
        None => Ok(()),
    }
}

/// What the target already fixes for its flows.
#[derive(Debug, Clone, Default)]
pub struct TargetShape {
    /// User columns of the target, if known (declared or set by a flow).
    pub columns: Option<SchemaRef>,
    /// Sequence type fixed by an earlier flow.
    pub sequence_type: Option<DataType>,
    /// Storage type fixed by an earlier flow or declared SCD columns.
    pub stored_as: Option<ScdType>,
    /// Type of the target's `__start_at` / `__end_at` columns, if any.
    pub start_at_type: Option<DataType>,
    /// Type of the target's `__system_start_at` / `__system_end_at` columns.
    pub system_start_at_type: Option<DataType>,
    /// The target stores `COLUMNS TO UPDATE` lists with its events (SCD 2).
    pub update_list: bool,
    /// The target's columns were declared.
    pub declared: bool,
}

/// A validated flow: the plan of its new change events and the target layout.
#[derive(Debug, Clone)]
pub struct ResolvedFlow {
    /// New events: `[target columns..., __cdc_seq, __cdc_kind, __cdc_origin]`.
    pub events: LogicalPlan,
    /// User columns of the target, with storage types.
    pub target_schema: SchemaRef,
    /// Storage type of the sequence.
    pub sequence_type: DataType,
    /// Column positions of event batches.
    pub layout: EventLayout,
    /// Tracked target columns (SCD 2).
    pub tracked: Vec<usize>,
    /// `IGNORE NULL UPDATES` / `COLUMNS TO UPDATE`.
    pub partial: Option<PartialUpdates>,
    /// Storage type of the system sequence (BITEMPORAL).
    pub system_sequence_type: Option<DataType>,
}

fn flow_err(flow: &str, clause: &str, msg: impl std::fmt::Display) -> DataFusionError {
    // (a planning error of the clause's expression, without its prefix)
    let msg = msg.to_string();
    let msg = msg.strip_prefix("Error during planning: ").unwrap_or(&msg);
    DataFusionError::Plan(format!("flow '{flow}': {clause}: {msg}"))
}

/// Whether a `PREVIOUS KEYS` expression of type `previous` may name keys
/// of type `key`: the same type, NULL, or the same kind (integers, text,
/// binary), whose cast to the key's type changes no value it can hold (an
/// integer beyond the key's range fails the cast). A decimal cast to an
/// integer key, or text parsed as a number, would name another key.
fn previous_key_fits(previous: &DataType, key: &DataType) -> bool {
    let text =
        |t: &DataType| matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    let binary = |t: &DataType| {
        matches!(
            t,
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView
        )
    };
    let value = |t: &DataType| match t {
        DataType::Dictionary(_, value) => value.as_ref().clone(),
        other => other.clone(),
    };
    let (previous, key) = (value(previous), value(key));
    previous == key
        || previous == DataType::Null
        || (previous.is_integer() && key.is_integer())
        || (text(&previous) && text(&key))
        || (binary(&previous) && binary(&key))
}

/// Storage type of a `COLUMNS TO UPDATE` list: `List<Utf8>`.
pub fn update_list_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)))
}

/// Parse SQL text written in `dialect` into a DataFusion expression over `schema`.
pub fn plan_sql_expr(
    state: &SessionState,
    text: &str,
    dialect: &str,
    schema: &DFSchema,
) -> Result<Expr> {
    let d = dialect_from_str(dialect)
        .ok_or_else(|| DataFusionError::Plan(format!("unsupported SQL dialect '{dialect}'")))?;
    let sql_expr = DFParserBuilder::new(text)
        .with_dialect(d.as_ref())
        .build()?
        .parse_into_expr()?;
    let expr = state.create_logical_expr_from_sql_expr(sql_expr, schema)?;
    // (a clause is judged per event: it cannot run a query, nor reach past
    // its event)
    let mut refused = None;
    expr.apply(|e| {
        refused = match e {
            Expr::ScalarSubquery(_) | Expr::InSubquery(_) | Expr::Exists(_) => Some(
                "a subquery, which a clause cannot run: join what it reads into the source \
                 query instead",
            ),
            Expr::AggregateFunction(_) | Expr::WindowFunction(_) | Expr::Unnest(_) => Some(
                "an aggregate, window function or unnest, which a clause cannot run: it is \
                 judged row by row; compute the value in the source query instead",
            ),
            _ => None,
        };
        Ok(match refused {
            Some(_) => TreeNodeRecursion::Stop,
            None => TreeNodeRecursion::Continue,
        })
    })?;
    if let Some(why) = refused {
        return Err(DataFusionError::Plan(format!("'{text}' holds {why}")));
    }
    Ok(expr)
}

/// The error of a clause naming `column` twice.
fn named_twice(flow: &str, clause: &str, column: &str) -> DataFusionError {
    flow_err(flow, clause, format!("column '{column}' is named twice"))
}

/// Plan a flow source (table name or query text in `dialect`).
pub async fn plan_source(
    state: &SessionState,
    source: &FlowSource,
    dialect: &str,
) -> Result<LogicalPlan> {
    let sql = match source {
        FlowSource::Table(name) => format!("SELECT * FROM {name}"),
        FlowSource::Query(q) | FlowSource::Snapshot { query: q, .. } => q.clone(),
        FlowSource::Debezium { path } => {
            format!("SELECT * FROM debezium('{}')", path.replace('\'', "''"))
        }
        FlowSource::SnapshotFunction => {
            return Err(DataFusionError::Plan(
                "this snapshot flow reads a Rust function: register it with the session again"
                    .to_string(),
            ))
        }
    };
    let statement = {
        let d = dialect_from_str(dialect)
            .ok_or_else(|| DataFusionError::Plan(format!("unsupported SQL dialect '{dialect}'")))?;
        let mut statements = DFParserBuilder::new(sql.as_str())
            .with_dialect(d.as_ref())
            .build()?
            .parse_statements()?;
        let mut statement = statements
            .pop_front()
            .ok_or_else(|| DataFusionError::Plan("empty flow source".to_string()))?;
        if let datafusion::sql::parser::Statement::Statement(ast) = &mut statement {
            crate::values_columns::name_values_columns(ast, dialect);
        }
        statement
    };
    state.statement_to_plan(statement).await
}

/// The target columns, each cast to its stored type: the common prefix of
/// every event and stored-row projection.
pub fn target_projection(target_schema: &Schema) -> Vec<Expr> {
    target_schema
        .fields()
        .iter()
        .map(|f| {
            cast(
                Expr::Column(Column::new_unqualified(f.name())),
                f.data_type().clone(),
            )
            .alias(f.name())
        })
        .collect()
}

/// Type of the `__cdc_written_at` column.
pub fn written_at_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

/// A `__cdc_written_at` value.
pub fn written_at_value(micros: i64) -> ScalarValue {
    ScalarValue::TimestampMicrosecond(Some(micros), Some("UTC".into()))
}

/// Map a column type to the type it is stored with in Delta.
pub fn storage_type(dt: &DataType) -> DataType {
    let mapped = mapped_type(dt);
    as_delta_stores(&mapped).unwrap_or(mapped)
}

/// `dt` as a Delta table gives it back (its reader's Arrow types: a list's
/// item named `element`, a map's entries `key_value`, fixed-size binaries
/// and lists plain, Date64 as Date32), so that a source column and the
/// stored one compare equal; `None` for a type Delta cannot store (a time,
/// a duration, an interval, Decimal256).
pub fn as_delta_stores(dt: &DataType) -> Option<DataType> {
    use deltalake_core::kernel::engine::arrow_conversion::{TryIntoArrow, TryIntoKernel};
    let kernel: deltalake_core::kernel::DataType = dt.try_into_kernel().ok()?;
    (&kernel).try_into_arrow().ok()
}

/// Whether a target can store a column of type `dt` (a Delta table has no
/// time, duration, interval or Decimal256).
pub(crate) fn delta_can_store(dt: &DataType) -> bool {
    as_delta_stores(&mapped_type(dt)).is_some()
}

/// The type a source column is stored as, before Delta's own round trip
/// ([`storage_type`]).
fn mapped_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 => DataType::Int64,
        DataType::UInt64 => DataType::Decimal128(20, 0),
        DataType::Float16 => DataType::Float32,
        // Delta knows timestamps in UTC and without a zone: a zoned
        // timestamp is an instant, kept as such in UTC
        DataType::Timestamp(_, tz) => {
            DataType::Timestamp(TimeUnit::Microsecond, tz.as_ref().map(|_| Arc::from("UTC")))
        }
        DataType::Dictionary(_, v) => mapped_type(v),
        DataType::Struct(fields) => DataType::Struct(
            fields
                .iter()
                .map(|f| Field::new(f.name(), mapped_type(f.data_type()), true))
                .collect::<Fields>(),
        ),
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _) => DataType::List(Arc::new(Field::new(
            f.name(),
            mapped_type(f.data_type()),
            true,
        ))),
        DataType::Map(entries, sorted) => match entries.data_type() {
            DataType::Struct(fields) => DataType::Map(
                Arc::new(Field::new(
                    entries.name(),
                    DataType::Struct(
                        fields
                            .iter()
                            .map(|f| {
                                Field::new(f.name(), mapped_type(f.data_type()), f.is_nullable())
                            })
                            .collect::<Fields>(),
                    ),
                    entries.is_nullable(),
                )),
                *sorted,
            ),
            _ => dt.clone(),
        },
        other => other.clone(),
    }
}

/// Whether values of this type can order events.
pub fn is_orderable(dt: &DataType) -> bool {
    match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal32(_, _)
        | DataType::Decimal64(_, _)
        | DataType::Decimal128(_, _)
        | DataType::Decimal256(_, _)
        | DataType::Date32
        | DataType::Date64
        | DataType::Timestamp(_, _)
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View => true,
        DataType::Struct(fields) => {
            !fields.is_empty() && fields.iter().all(|f| is_orderable(f.data_type()))
        }
        _ => false,
    }
}

/// Two types belong to the same family, so a source column may be cast to the
/// target's type without changing its meaning.
/// A declared target keeps exactly its columns; the flow's source types must
/// convert into theirs.
fn declared_columns(
    flow: &str,
    existing: &SchemaRef,
    flow_columns: &[String],
    source_schema: &DFSchema,
) -> Result<SchemaRef> {
    let existing_names: Vec<&String> = existing.fields().iter().map(|f| f.name()).collect();
    let mut sorted_flow = flow_columns.to_vec();
    sorted_flow.sort();
    let mut sorted_target: Vec<String> = existing_names.iter().map(|s| s.to_string()).collect();
    sorted_target.sort();
    if sorted_flow != sorted_target {
        return Err(flow_err(
            flow,
            "COLUMNS",
            format!(
                "the flow's columns ({}) do not match the columns declared for the target ({}); \
                 a declared target keeps its columns: drop it and create it again with \
                 the flow's columns, or let the target take its flows' columns by \
                 declaring none",
                flow_columns.join(", "),
                existing_names
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    for field in existing.fields() {
        let source_type = source_schema
            .field_with_unqualified_name(field.name())?
            .data_type();
        if !compatible(source_type, field.data_type()) {
            return Err(flow_err(
                flow,
                "COLUMNS",
                format!(
                    "column '{}' has type {source_type} in the source but {} in the target",
                    field.name(),
                    field.data_type()
                ),
            ));
        }
    }
    Ok(Arc::clone(existing))
}

/// A target column for the flow column `c`, typed by the source.
fn new_column(flow: &str, c: &str, source_schema: &DFSchema) -> Result<Field> {
    let dt = source_schema.field_with_unqualified_name(c)?.data_type();
    if *dt == DataType::Null {
        return Err(flow_err(flow, "COLUMNS", format!("column '{c}' has no type (only NULL literals): CAST it, or declare the target's columns")));
    }
    storable(flow, c, dt)?;
    Ok(Field::new(c, storage_type(dt), true))
}

/// Error naming `flow` and column `c` when a Delta table cannot store its
/// type `dt` (a time, a duration, an interval, Decimal256): refused when
/// the flow plans, rather than when its commit fails.
fn storable(flow: &str, c: &str, dt: &DataType) -> Result<()> {
    match as_delta_stores(&mapped_type(dt)) {
        Some(_) => Ok(()),
        None => Err(flow_err(
            flow,
            "COLUMNS",
            format!(
                "column '{c}' has type {dt}, which a Delta table cannot store: CAST it (to a \
                 TIMESTAMP, a BIGINT or a STRING, say), or leave it out"
            ),
        )),
    }
}

/// Why a sequence of type `data_type` (not [`is_orderable`]) is refused,
/// and what to do.
fn not_orderable(data_type: &DataType) -> String {
    match data_type {
        DataType::Dictionary(_, values) if is_orderable(values) => format!(
            "which is dictionary-encoded: CAST it to its values' type ({values}) to sequence by it"
        ),
        _ => "which is not orderable (use integers, decimals, dates, timestamps, strings or a \
              STRUCT of those)"
            .to_string(),
    }
}

/// Error naming `flow` and the clause when a target could not store the
/// sequence or system sequence of `resolved` (a Decimal256, say: each row
/// keeps its sequence, SCD 2 versions their bounds): refused when the flow
/// plans, rather than when its commit fails.
pub(crate) fn check_sequences_storable(
    flow: &str,
    sequence_clause: &str,
    resolved: &ResolvedFlow,
) -> Result<()> {
    let sequences = [
        (sequence_clause, Some(&resolved.sequence_type)),
        ("SYSTEM SEQUENCE BY", resolved.system_sequence_type.as_ref()),
    ];
    for (clause, data_type) in sequences {
        let Some(data_type) = data_type else { continue };
        if as_delta_stores(&mapped_type(data_type)).is_none() {
            return Err(flow_err(
                flow,
                clause,
                format!(
                    "type {data_type}, which a Delta table cannot store (the target keeps \
                     each row's sequence): CAST it (to a DECIMAL(38, s), a BIGINT or a \
                     STRING, say)"
                ),
            ));
        }
    }
    Ok(())
}

/// An undeclared target's columns after this flow (SPEC §2.9): its columns
/// in order, each widened to the flow's type where that is wider, then the
/// flow's new columns at the end. A column whose type changes other than by
/// widening is an error naming it and both types.
fn evolved_columns(
    flow: &str,
    existing: &SchemaRef,
    flow_columns: &[String],
    source_schema: &DFSchema,
) -> Result<SchemaRef> {
    let mut fields: Vec<Field> = Vec::with_capacity(existing.fields().len());
    for field in existing.fields() {
        if !flow_columns.contains(field.name()) {
            fields.push(field.as_ref().clone());
            continue;
        }
        let source = storage_type(
            source_schema
                .field_with_unqualified_name(field.name())?
                .data_type(),
        );
        let target = field.data_type();
        let data_type = if widens(target, &source) {
            source
        } else if source == *target || source == DataType::Null || widens(&source, target) {
            target.clone()
        } else {
            return Err(flow_err(
                flow,
                "COLUMNS",
                format!(
                    "column '{}' has type {source} in the source but {target} in the target: \
                     a target's column type may only widen (int8 → int16 → int32 → int64, \
                     float32 → float64, decimal precision up, date → timestamp); nothing was \
                     committed",
                    field.name()
                ),
            ));
        };
        fields.push(Field::new(field.name(), data_type, true));
    }
    for c in flow_columns {
        if existing.field_with_name(c).is_err() {
            // (Delta's column names ignore case: this would be the same
            // column twice, the target's left NULL)
            if let Some(same) = existing
                .fields()
                .iter()
                .find(|f| f.name().eq_ignore_ascii_case(c))
            {
                return Err(flow_err(
                    flow,
                    "COLUMNS",
                    format!(
                        "column '{c}' of the source and the target's column '{}' differ only \
                         in case: name it as the target does in the source (SELECT \"{c}\" AS \
                         \"{}\" …); nothing was committed",
                        same.name(),
                        same.name()
                    ),
                ));
            }
            fields.push(new_column(flow, c, source_schema)?);
        }
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// Whether a column of type `from` may widen to `to` (SPEC §2.9), both
/// storage types.
pub fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let int_rank = |t: &DataType| match t {
        Int8 => Some(1),
        Int16 => Some(2),
        Int32 => Some(3),
        Int64 => Some(4),
        _ => None,
    };
    match (from, to) {
        (Float32, Float64) => true,
        (Decimal128(p1, s1), Decimal128(p2, s2)) => {
            s2 >= s1 && p2 > p1 && (*p2 as i16 - *s2 as i16) >= (*p1 as i16 - *s1 as i16)
        }
        (Date32, Timestamp(_, _)) => true,
        _ => matches!((int_rank(from), int_rank(to)), (Some(a), Some(b)) if a < b),
    }
}

/// Whether a source column of type `source` may feed a declared target
/// column of type `target`: the same type, a NULL literal, a number that
/// loses no fraction (values that do not fit fail at the update, see
/// `pipeline::fits`), a timestamp of the same zone, a date (into a date or
/// a timestamp without zone), lists and structs of such.
pub(crate) fn compatible(source: &DataType, target: &DataType) -> bool {
    let s = storage_type(source);
    let t = storage_type(target);
    let fields_fit = |a: &arrow::datatypes::Fields, b: &arrow::datatypes::Fields| {
        a.len() == b.len()
            && a.iter()
                .zip(b.iter())
                .all(|(a, b)| a.name() == b.name() && compatible(a.data_type(), b.data_type()))
    };
    s == t
        || s == DataType::Null
        || numeric_fits(&s, &t)
        || matches!((&s, &t), (DataType::Timestamp(_, a), DataType::Timestamp(_, b)) if a == b)
        || matches!(
            (&s, &t),
            (
                DataType::Date32 | DataType::Date64,
                DataType::Date32 | DataType::Date64 | DataType::Timestamp(_, None)
            )
        )
        // (a list's items, a struct's fields: as columns)
        || match (&s, &t) {
            (
                DataType::List(a) | DataType::LargeList(a),
                DataType::List(b) | DataType::LargeList(b),
            ) => compatible(a.data_type(), b.data_type()),
            (DataType::Struct(a), DataType::Struct(b)) => fields_fit(a, b),
            _ => false,
        }
}

/// Numbers convert into a numeric column, but never by dropping a fraction
/// (keys 1.25 and 1.75 must not both become 1).
fn numeric_fits(source: &DataType, target: &DataType) -> bool {
    let fractional = |d: &DataType| {
        d.is_floating()
            || matches!(d, DataType::Decimal128(_, scale) | DataType::Decimal256(_, scale) if *scale > 0)
    };
    source.is_numeric() && target.is_numeric() && (!fractional(source) || fractional(target))
}

/// Find a source column by name: exact match first, then a unique
/// case-insensitive match (sources often keep mixed-case names that unquoted
/// SQL identifiers fold to lower case).
fn find_column<'a>(names: &'a [String], name: &str) -> Option<&'a String> {
    names.iter().find(|n| *n == name).or_else(|| {
        let mut it = names.iter().filter(|n| n.eq_ignore_ascii_case(name));
        match (it.next(), it.next()) {
            (Some(n), None) => Some(n),
            _ => None,
        }
    })
}

/// `PREVIOUS KEYS`: what turns a primary-key change into a DELETE of the
/// previous key and an UPSERT of the new one, at the same sequence.
///
/// | event                                        | becomes                          |
/// |----------------------------------------------|----------------------------------|
/// | UPSERT, previous key NULL (any part)         | itself                           |
/// | UPSERT, key NULL (any part)                  | itself (it fails, or is a reject)|
/// | UPSERT, previous key = key                   | itself                           |
/// | UPSERT, previous key ≠ key                   | itself + DELETE of previous key  |
/// | DELETE / TRUNCATE                            | itself                           |
///
/// The DELETE carries the previous key, the upsert's values in every other
/// column, and the event's sequence (and system sequence): in SCD 1 the old
/// key is gone, in SCD 2 its open version closes there. With the upsert's
/// values, expectations judge the two alike: a row an expectation drops
/// (or fails on) moves no key. The source is read twice (the events, and
/// the moves among them).
struct MovedKeys<'a> {
    target_schema: &'a SchemaRef,
    /// Key columns, as positions of the target columns.
    key_indices: &'a [usize],
    /// How many target columns lead the event projection.
    num_target: usize,
    /// Whether a source row is an UPSERT.
    upsert: Expr,
}

impl MovedKeys<'_> {
    fn with_deletes(
        self,
        state: &SessionState,
        spec: &FlowSpec,
        source: LogicalPlan,
        projection: Vec<Expr>,
    ) -> Result<LogicalPlan> {
        let flow = spec.name.as_str();
        const CLAUSE: &str = "PREVIOUS KEYS";
        if spec.previous_keys.len() != self.key_indices.len() {
            return Err(flow_err(
                flow,
                CLAUSE,
                format!(
                    "{} expression(s) for {} key column(s): give one per key column, in the order of KEYS",
                    spec.previous_keys.len(),
                    self.key_indices.len()
                ),
            ));
        }
        if spec.stored_as_scd_type == ScdType::Bitemporal {
            return Err(flow_err(
                flow,
                CLAUSE,
                "is not allowed with STORED AS BITEMPORAL",
            ));
        }
        let source_schema = Arc::clone(source.schema());
        // KEYS order → the previous key of each key column
        let mut moved = Vec::new();
        let mut previous = vec![None; self.num_target];
        for (key, text) in spec.keys.iter().zip(&spec.previous_keys) {
            let position = self
                .target_schema
                .fields()
                .iter()
                .position(|f| f.name().eq_ignore_ascii_case(key))
                .filter(|p| self.key_indices.contains(p))
                .ok_or_else(|| {
                    flow_err(
                        flow,
                        CLAUSE,
                        format!("key column '{key}' is not a target column"),
                    )
                })?;
            let field = self.target_schema.field(position);
            let expr = plan_sql_expr(state, text, &spec.dialect, &source_schema)
                .map_err(|e| flow_err(flow, CLAUSE, e))?;
            let typed = expr
                .get_type(&source_schema)
                .map_err(|e| flow_err(flow, CLAUSE, e))?;
            if !previous_key_fits(&typed, field.data_type()) {
                return Err(flow_err(
                    flow,
                    CLAUSE,
                    format!(
                        "expression '{text}' is of type {typed}, key column '{}' of type {}: \
                         a previous key must be of the key's kind (integers for integers, \
                         text for text, else the same type), since a cast could \
                         delete another key; cast it if that is meant",
                        field.name(),
                        field.data_type()
                    ),
                ));
            }
            // (a wider integer that does not fit the key fails the update
            // naming it — in the DELETE's projection, which sees the
            // flow's events only: a filter may also see rows the source
            // query leaves out)
            let old = try_cast(expr.clone(), field.data_type().clone());
            let message = concat(vec![
                lit(format!("flow '{flow}': {CLAUSE}: the previous key ")),
                cast(expr.clone(), DataType::Utf8),
                lit(format!(
                    " does not fit key column '{}' of type {}; nothing was committed",
                    field.name(),
                    field.data_type()
                )),
            ]);
            let misfit = expr.clone().is_not_null().and(old.clone().is_null());
            let checked = when(raise_if(when(misfit, message).end()?), old.clone()).end()?;
            let now = cast(
                Expr::Column(Column::new_unqualified(field.name())),
                field.data_type().clone(),
            );
            moved.push((expr, old, now));
            previous[position] = Some(unsigned_zero(checked, field.data_type())?);
        }
        let complete = moved
            .iter()
            .map(|(raw, _, now)| raw.clone().is_not_null().and(now.clone().is_not_null()))
            .reduce(Expr::and)
            .unwrap_or(lit(false));
        let differs = moved
            .into_iter()
            .map(|(_, old, now)| {
                Expr::BinaryExpr(datafusion::logical_expr::BinaryExpr::new(
                    Box::new(old),
                    datafusion::logical_expr::Operator::IsDistinctFrom,
                    Box::new(now),
                ))
            })
            .reduce(Expr::or)
            .unwrap_or(lit(false));
        let filter = self.upsert.and(complete).and(differs);
        let deletes: Vec<Expr> = projection
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let Expr::Alias(alias) = e else {
                    return e.clone();
                };
                let name = alias.name.clone();
                if let Some(Some(old)) = previous.get(i) {
                    let data_type = self.target_schema.field(i).data_type().clone();
                    return cast(old.clone(), data_type).alias(name);
                }
                match name.as_str() {
                    KIND_COL => lit(Kind::Delete as i8).alias(name),
                    UPDATE_LIST_COL => cast(lit(ScalarValue::Null), update_list_type()).alias(name),
                    _ => e.clone(),
                }
            })
            .collect();
        let deletes = LogicalPlanBuilder::from(source.clone())
            .filter(filter)?
            .project(deletes)?
            .build()?;
        LogicalPlanBuilder::from(source)
            .project(projection)?
            .union(deletes)?
            .build()
    }
}

/// `value` with a float's -0.0 made 0.0 (a key's, a sequence's, a
/// snapshot version's: SQL equates the two, the folds compare by bits);
/// any other value as it is. [`unsigned_zero`] for an expression.
pub(crate) fn unsigned_zero_value(value: ScalarValue) -> ScalarValue {
    match value {
        // (-0.0 + 0.0 is 0.0; any other value stays as it is)
        ScalarValue::Float64(Some(v)) => ScalarValue::Float64(Some(v + 0.0)),
        ScalarValue::Float32(Some(v)) => ScalarValue::Float32(Some(v + 0.0)),
        other => other,
    }
}

/// `value`, of type `data_type`, with a float's -0.0 made 0.0 (keys: SQL
/// equates the two, the folds compare keys by their bits); other types as
/// they are.
pub(crate) fn unsigned_zero(value: Expr, data_type: &DataType) -> Result<Expr> {
    if !data_type.is_floating() {
        return Ok(value);
    }
    let zero = cast(lit(0.0), data_type.clone());
    when(value.clone().eq(zero.clone()), zero).otherwise(value)
}

/// Validate `spec` against its planned `source` and the `target` shape.
///
/// `now_micros` (UTC µs by the session clock) stamps the rows this update
/// writes (see [`WRITTEN_AT_COL`]).
pub fn resolve(
    state: &SessionState,
    spec: &FlowSpec,
    source: LogicalPlan,
    target: &TargetShape,
    now_micros: i64,
    sequence_override: Option<Expr>,
) -> Result<ResolvedFlow> {
    let flow = spec.name.as_str();
    if spec.source.is_snapshot() {
        let refused = [
            (spec.sequence_by.is_some(), "SEQUENCE BY"),
            (spec.apply_as_deletes.is_some(), "APPLY AS DELETE WHEN"),
            (spec.apply_as_truncates.is_some(), "APPLY AS TRUNCATE WHEN"),
            (spec.ignore_null_updates.is_some(), "IGNORE NULL UPDATES"),
            (spec.columns_to_update.is_some(), "COLUMNS TO UPDATE"),
            (spec.system_sequence_by.is_some(), "SYSTEM SEQUENCE BY"),
            (!spec.previous_keys.is_empty(), "PREVIOUS KEYS"),
            (
                spec.stored_as_scd_type == ScdType::Bitemporal,
                "STORED AS BITEMPORAL",
            ),
        ];
        if let Some((_, clause)) = refused.iter().find(|(on, _)| *on) {
            return Err(flow_err(
                flow,
                clause,
                "not allowed with FROM SNAPSHOT (snapshots are ordered by their version)",
            ));
        }
    }
    // Clauses this version does not implement: refuse clearly, never ignore.
    let unsupported = [(
        spec.stored_as_scd_type == ScdType::Bitemporal && spec.ignore_null_updates.is_some(),
        "IGNORE NULL UPDATES with STORED AS BITEMPORAL",
    )];
    if spec.columns_to_update.is_some() && spec.stored_as_scd_type == ScdType::Bitemporal {
        return Err(flow_err(
            flow,
            "COLUMNS TO UPDATE",
            "is not allowed with STORED AS BITEMPORAL",
        ));
    }
    if spec.apply_as_truncates.is_some() && spec.stored_as_scd_type != ScdType::Type1 {
        return Err(flow_err(
            flow,
            "APPLY AS TRUNCATE WHEN",
            format!(
                "TRUNCATE is not allowed with STORED AS {}",
                spec.stored_as_scd_type
            ),
        ));
    }
    if spec.system_sequence_by.is_some() && spec.stored_as_scd_type != ScdType::Bitemporal {
        return Err(flow_err(
            flow,
            "SYSTEM SEQUENCE BY",
            "requires STORED AS BITEMPORAL",
        ));
    }
    if spec.stored_as_scd_type == ScdType::Bitemporal && spec.system_sequence_by.is_none() {
        return Err(flow_err(
            flow,
            "STORED AS BITEMPORAL",
            "requires SYSTEM SEQUENCE BY",
        ));
    }
    if spec.columns_to_update.is_some() && spec.ignore_null_updates.is_some() {
        return Err(flow_err(
            flow,
            "COLUMNS TO UPDATE",
            "cannot be combined with IGNORE NULL UPDATES",
        ));
    }
    if spec.track_history.is_some() && spec.stored_as_scd_type != ScdType::Type2 {
        return Err(flow_err(
            flow,
            "TRACK HISTORY ON",
            "requires STORED AS SCD TYPE 2",
        ));
    }
    if let Some(existing) = target.stored_as {
        if existing != spec.stored_as_scd_type {
            return Err(flow_err(
                flow,
                "STORED AS",
                format!(
                    "the target stores {existing}, the flow asks for {}",
                    spec.stored_as_scd_type
                ),
            ));
        }
    }
    if let Some((_, clause)) = unsupported.iter().find(|(on, _)| *on) {
        return Err(DataFusionError::NotImplemented(format!(
            "flow '{flow}': {clause} is not supported yet"
        )));
    }

    let source_schema = Arc::clone(source.schema());
    let source_names: Vec<String> = source_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    for name in &source_names {
        let lower = name.to_ascii_lowercase();
        if RESERVED_COLUMNS.contains(&lower.as_str()) || lower.starts_with(INTERNAL_PREFIX) {
            return Err(flow_err(
                flow,
                "source",
                format!("column '{name}' uses a reserved name"),
            ));
        }
        // (DataFusion names the common subexpressions it computes once so:
        // a column of such a name was read as one of them, its values lost)
        if lower.starts_with("__common_expr") {
            return Err(flow_err(
                flow,
                "source",
                format!(
                    "column '{name}' uses a name DataFusion gives its own common \
                     subexpressions (__common_expr_N); rename it"
                ),
            ));
        }
    }
    let lookup = |clause: &str, name: &str| -> Result<String> {
        find_column(&source_names, name).cloned().ok_or_else(|| {
            flow_err(
                flow,
                clause,
                format!(
                    "column '{name}' does not exist in the source (columns: {})",
                    source_names.join(", ")
                ),
            )
        })
    };

    // COLUMNS TO UPDATE: a list of target column names, never a target column
    let update_list = match &spec.columns_to_update {
        Some(name) => {
            let name = lookup("COLUMNS TO UPDATE", name)?;
            let data_type = source_schema
                .field_with_unqualified_name(&name)?
                .data_type();
            let strings = match data_type {
                DataType::List(f) | DataType::LargeList(f) | DataType::ListView(f) => matches!(
                    f.data_type(),
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
                ),
                DataType::Null => true,
                _ => false,
            };
            if !strings {
                return Err(flow_err(
                    flow,
                    "COLUMNS TO UPDATE",
                    format!("column '{name}' has type {data_type}, expected an array of strings (List<Utf8>)"),
                ));
            }
            Some(name)
        }
        None => None,
    };
    let source_columns: Vec<String> = source_names
        .iter()
        .filter(|n| Some(*n) != update_list.as_ref())
        .cloned()
        .collect();

    // COLUMNS selection → target columns
    let target_columns: Vec<String> = match &spec.columns {
        ColumnSelection::All => source_columns.clone(),
        ColumnSelection::Only(list) => {
            let mut names: Vec<String> = Vec::with_capacity(list.len());
            for c in list {
                let name = lookup("COLUMNS", c)?;
                if Some(&name) == update_list.as_ref() {
                    return Err(flow_err(
                        flow,
                        "COLUMNS",
                        format!("column '{name}' is the COLUMNS TO UPDATE column; it is never a target column"),
                    ));
                }
                if names.contains(&name) {
                    return Err(named_twice(flow, "COLUMNS", &name));
                }
                names.push(name);
            }
            names
        }
        ColumnSelection::Except(list) => {
            let excluded = list
                .iter()
                .map(|c| lookup("COLUMNS * EXCEPT", c))
                .collect::<Result<Vec<_>>>()?;
            source_columns
                .iter()
                .filter(|n| !excluded.contains(n))
                .cloned()
                .collect()
        }
    };
    // (Delta's column names are case-insensitive: the write would fail)
    for (i, name) in target_columns.iter().enumerate() {
        if let Some(other) = target_columns[..i]
            .iter()
            .find(|o| o.eq_ignore_ascii_case(name))
        {
            return Err(flow_err(
                flow,
                "COLUMNS",
                format!(
                    "columns '{other}' and '{name}' differ only in case, and a table's column \
                     names do not: rename one in the source query, or leave it out"
                ),
            ));
        }
    }
    if spec.keys.is_empty() {
        return Err(flow_err(
            flow,
            "KEYS",
            "at least one key column is required",
        ));
    }
    let mut key_indices = Vec::with_capacity(spec.keys.len());
    for key in &spec.keys {
        let name = lookup("KEYS", key)?;
        let idx = target_columns
            .iter()
            .position(|c| *c == name)
            .ok_or_else(|| {
                flow_err(
                    flow,
                    "KEYS",
                    format!("key column '{name}' is not among the target columns"),
                )
            })?;
        if key_indices.contains(&idx) {
            return Err(named_twice(flow, "KEYS", &name));
        }
        key_indices.push(idx);
    }

    // SEQUENCE BY (or the snapshot version)
    let is_snapshot_version = sequence_override.is_some();
    let seq_expr = match (sequence_override, &spec.sequence_by) {
        (Some(version), _) => version,
        (None, None) => return Err(flow_err(flow, "SEQUENCE BY", "the clause is required")),
        (None, Some(sequence_by)) => match sequence_by {
            SequenceBy::Column(c) => {
                Expr::Column(Column::new_unqualified(lookup("SEQUENCE BY", c)?))
            }
            SequenceBy::Struct(cols) => {
                let mut args = Vec::with_capacity(cols.len() * 2);
                for c in cols {
                    let name = lookup("SEQUENCE BY", c)?;
                    if args.contains(&lit(name.clone())) {
                        return Err(named_twice(flow, "SEQUENCE BY", &name));
                    }
                    args.push(lit(name.clone()));
                    args.push(Expr::Column(Column::new_unqualified(name)));
                }
                named_struct(args)
            }
            SequenceBy::Expr(text) => plan_sql_expr(state, text, &spec.dialect, &source_schema)
                .map_err(|e| flow_err(flow, "SEQUENCE BY", e))?,
        },
    };
    let seq_source_type = seq_expr
        .get_type(&source_schema)
        .map_err(|e| flow_err(flow, "SEQUENCE BY", e))?;
    if !is_orderable(&seq_source_type) {
        let what = match (is_snapshot_version, &spec.sequence_by) {
            (true, _) | (false, None) => "the snapshot version".to_string(),
            (false, Some(SequenceBy::Column(c))) => format!("column '{c}'"),
            (false, Some(SequenceBy::Struct(cols))) => format!("STRUCT({})", cols.join(", ")),
            (false, Some(SequenceBy::Expr(text))) => format!("`{text}`"),
        };
        return Err(flow_err(
            flow,
            "SEQUENCE BY",
            format!(
                "{what} has type {seq_source_type}, {}",
                not_orderable(&seq_source_type)
            ),
        ));
    }
    let mut sequence_type = storage_type(&seq_source_type);
    if let Some(existing) = &target.sequence_type {
        if widens(&sequence_type, existing) {
            // a narrower sequence orders among the stored ones as their type
            sequence_type = existing.clone();
        } else if *existing != sequence_type {
            let why = match (widens(existing, &sequence_type), spec.stored_as_scd_type) {
                (true, ScdType::Type1) => {
                    "the target stores its sequences as that type, which cannot widen: \
                     cast the sequence to it, or store the events in a new target"
                }
                (true, _) => {
                    "the target stores its sequences (and __START_AT / __END_AT) as that \
                         type, which cannot widen: cast the sequence to it, or store the \
                         events in a new target"
                }
                (false, _) => {
                    "a target's events are ordered by one sequence type, fixed by its \
                          first update"
                }
            };
            return Err(flow_err(
                flow,
                "SEQUENCE BY",
                format!(
                    "type {sequence_type} differs from the target's sequence type {existing}: \
                     {why}; nothing was committed"
                ),
            ));
        }
    }

    // SYSTEM SEQUENCE BY (BITEMPORAL)
    let system_sequence = match &spec.system_sequence_by {
        Some(text) => {
            let is_name = text.chars().all(|c| c.is_alphanumeric() || c == '_');
            let expr = if is_name {
                Expr::Column(Column::new_unqualified(lookup("SYSTEM SEQUENCE BY", text)?))
            } else {
                plan_sql_expr(state, text, &spec.dialect, &source_schema)
                    .map_err(|e| flow_err(flow, "SYSTEM SEQUENCE BY", e))?
            };
            let source_type = expr
                .get_type(&source_schema)
                .map_err(|e| flow_err(flow, "SYSTEM SEQUENCE BY", e))?;
            if !is_orderable(&source_type) {
                return Err(flow_err(
                    flow,
                    "SYSTEM SEQUENCE BY",
                    format!(
                        "`{text}` has type {source_type}, {}",
                        not_orderable(&source_type)
                    ),
                ));
            }
            let system_type = storage_type(&source_type);
            if let Some(existing) = &target.system_start_at_type {
                if *existing != system_type {
                    return Err(flow_err(flow, "SYSTEM SEQUENCE BY", format!("type {system_type} differs from the type {existing} of the target's __SYSTEM_START_AT and __SYSTEM_END_AT")));
                }
            }
            Some((expr, system_type))
        }
        None => None,
    };
    if spec.stored_as_scd_type == ScdType::Bitemporal
        && target.declared
        && target.system_start_at_type.is_none()
    {
        return Err(flow_err(flow, "STORED AS BITEMPORAL", "the declared target must include the columns __START_AT, __END_AT (SEQUENCE BY type) and __SYSTEM_START_AT, __SYSTEM_END_AT (SYSTEM SEQUENCE BY type)"));
    }
    if spec.stored_as_scd_type == ScdType::Type2
        && target.sequence_type.is_some()
        && target.update_list != update_list.is_some()
    {
        return Err(flow_err(flow, "COLUMNS TO UPDATE", "all SCD TYPE 2 flows of a target must agree on using COLUMNS TO UPDATE (the target stores each event's list)"));
    }

    // Target schema: the declared one; an undeclared target's evolved by
    // the flow's columns (SPEC §2.9); else derived from the source.
    let target_schema: SchemaRef = match &target.columns {
        Some(existing) if !existing.fields().is_empty() && target.declared => {
            declared_columns(flow, existing, &target_columns, &source_schema)?
        }
        Some(existing) if !existing.fields().is_empty() => {
            evolved_columns(flow, existing, &target_columns, &source_schema)?
        }
        _ => {
            let fields: Vec<Field> = target_columns
                .iter()
                .map(|c| new_column(flow, c, &source_schema))
                .collect::<Result<_>>()?;
            Arc::new(Schema::new(fields))
        }
    };
    let target_names: Vec<String> = target_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    if spec.stored_as_scd_type != ScdType::Type1 {
        // (what orders a snapshot flow's versions is its snapshots' version)
        let ordered_by = match &spec.source {
            FlowSource::Snapshot { .. } | FlowSource::SnapshotFunction => "the snapshot version",
            _ => "SEQUENCE BY",
        };
        match &target.start_at_type {
            Some(t) if *t != sequence_type => {
                return Err(flow_err(flow, "STORED AS SCD TYPE 2", format!("the target's __START_AT and __END_AT have type {t}, but {ordered_by} has type {sequence_type}")));
            }
            None if target.declared => {
                return Err(flow_err(flow, "STORED AS SCD TYPE 2", format!("the declared target must include the columns __START_AT and __END_AT with the type of {ordered_by}, {sequence_type}")));
            }
            _ => {}
        }
    }
    // Keys are a set of columns: `KEYS (a, b)` and `KEYS (b, a)`
    // name the same key, so every flow of a target hashes, buckets, sorts
    // and compares its keys in the target's column order.
    let mut key_indices: Vec<usize> = key_indices
        .iter()
        .map(|&i| {
            target_names
                .iter()
                .position(|n| *n == target_columns[i])
                .unwrap_or(i)
        })
        .collect();
    key_indices.sort_unstable();
    key_indices.dedup();

    // Event kind: TRUNCATE, else DELETE, else UPSERT (NULL conditions are false).
    let condition = |clause: &str, text: &Option<String>| -> Result<Option<Expr>> {
        let Some(text) = text else { return Ok(None) };
        let e = plan_sql_expr(state, text, &spec.dialect, &source_schema)
            .map_err(|e| flow_err(flow, clause, e))?;
        let t = e
            .get_type(&source_schema)
            .map_err(|e| flow_err(flow, clause, e))?;
        if t != DataType::Boolean && t != DataType::Null {
            return Err(flow_err(
                flow,
                clause,
                format!("condition `{text}` has type {t}, expected BOOLEAN"),
            ));
        }
        Ok(Some(coalesce(vec![cast(e, DataType::Boolean), lit(false)])))
    };
    let deletes = condition("APPLY AS DELETE WHEN", &spec.apply_as_deletes)?;
    let truncates = condition("APPLY AS TRUNCATE WHEN", &spec.apply_as_truncates)?;
    let kind = match (truncates, deletes) {
        (None, None) => lit(Kind::Upsert as i8),
        (Some(t), None) => when(t, lit(Kind::Truncate as i8)).otherwise(lit(Kind::Upsert as i8))?,
        (None, Some(d)) => when(d, lit(Kind::Delete as i8)).otherwise(lit(Kind::Upsert as i8))?,
        // nested, not `CASE WHEN t … WHEN d … ELSE …`: the optimizer rewrites
        // the update's `kind != truncate` over the flat form into
        // `t IS NOT TRUE AND (d IS TRUE OR d IS NOT TRUE)`, a filter that
        // evaluates a tautology on every event
        (Some(t), Some(d)) => when(t, lit(Kind::Truncate as i8))
            .otherwise(when(d, lit(Kind::Delete as i8)).otherwise(lit(Kind::Upsert as i8))?)?,
    };

    // target columns the flow does not select are NULL in its events
    let mut projection: Vec<Expr> = target_schema
        .fields()
        .iter()
        .map(|f| {
            let value = if target_columns.contains(f.name()) {
                Expr::Column(Column::new_unqualified(f.name()))
            } else {
                lit(ScalarValue::Null)
            };
            cast(value, f.data_type().clone()).alias(f.name())
        })
        .collect();
    // a float key's -0.0 is its 0.0: SQL equates them (as `GROUP BY`
    // does), while the folds compare keys by their bits
    for &i in &key_indices {
        let field = target_schema.field(i);
        let value = cast(
            Expr::Column(Column::new_unqualified(field.name())),
            field.data_type().clone(),
        );
        projection[i] = unsigned_zero(value, field.data_type())?.alias(field.name());
    }
    let num_target = projection.len();
    // and so is a float sequence's: two events at -0.0 and 0.0 share one
    // sequence (a conflict unless equal), not two versions, one empty
    projection
        .push(unsigned_zero(cast(seq_expr, sequence_type.clone()), &sequence_type)?.alias(SEQ_COL));
    let upsert = kind.clone().eq(lit(Kind::Upsert as i8));
    projection.push(kind.alias(KIND_COL));
    projection.push(lit(written_at_value(now_micros)).alias(WRITTEN_AT_COL));
    projection.push(lit(Origin::New as i8).alias(ORIGIN_COL));
    if let Some((expr, system_type)) = &system_sequence {
        projection.push(
            unsigned_zero(cast(expr.clone(), system_type.clone()), system_type)?
                .alias(SYSTEM_SEQ_COL),
        );
    }
    if let Some(name) = &update_list {
        projection.push(
            cast(
                Expr::Column(Column::new_unqualified(name)),
                update_list_type(),
            )
            .alias(UPDATE_LIST_COL),
        );
    }
    let events = if spec.previous_keys.is_empty() {
        LogicalPlanBuilder::from(source)
            .project(projection)?
            .build()?
    } else {
        let moved = MovedKeys {
            target_schema: &target_schema,
            key_indices: &key_indices,
            num_target,
            upsert,
        };
        moved.with_deletes(state, spec, source, projection)?
    };

    let key_set: Vec<usize> = key_indices.clone();
    let target_column = |clause: &str, name: &str| -> Result<usize> {
        target_names
            .iter()
            .position(|n| n == name)
            .or_else(|| {
                target_names
                    .iter()
                    .position(|n| n.eq_ignore_ascii_case(name))
            })
            .ok_or_else(|| {
                flow_err(
                    flow,
                    clause,
                    format!(
                        "column '{name}' is not a target column (columns: {})",
                        target_names.join(", ")
                    ),
                )
            })
    };
    let non_keys = (0..target_names.len()).filter(|i| !key_set.contains(i));
    let tracked: Vec<usize> = match &spec.track_history {
        None | Some(ColumnSelection::All) => non_keys.collect(),
        Some(ColumnSelection::Only(list)) => list
            .iter()
            .map(|c| target_column("TRACK HISTORY ON", c))
            .collect::<Result<_>>()?,
        Some(ColumnSelection::Except(list)) => {
            let excluded = list
                .iter()
                .map(|c| target_column("TRACK HISTORY ON * EXCEPT", c))
                .collect::<Result<Vec<_>>>()?;
            non_keys.filter(|i| !excluded.contains(i)).collect()
        }
    };

    let partial = match (&spec.ignore_null_updates, &update_list) {
        (Some(selection), _) => {
            let non_keys = (0..target_names.len()).filter(|i| !key_set.contains(i));
            Some(PartialUpdates::IgnoreNulls(match selection {
                ColumnSelection::All => non_keys.collect(),
                ColumnSelection::Only(list) => list
                    .iter()
                    .map(|c| target_column("IGNORE NULL UPDATES ON", c))
                    .collect::<Result<_>>()?,
                ColumnSelection::Except(list) => {
                    let excluded = list
                        .iter()
                        .map(|c| target_column("IGNORE NULL UPDATES ON * EXCEPT", c))
                        .collect::<Result<Vec<_>>>()?;
                    non_keys.filter(|i| !excluded.contains(i)).collect()
                }
            }))
        }
        (None, Some(_)) => Some(PartialUpdates::ColumnsToUpdate),
        (None, None) => None,
    };

    Ok(ResolvedFlow {
        partial,
        system_sequence_type: system_sequence.map(|(_, t)| t),
        tracked,
        events,
        target_schema,
        sequence_type,
        layout: EventLayout {
            target_columns: target_names,
            key_indices,
            system_seq: spec.system_sequence_by.is_some(),
            update_list: spec.columns_to_update.is_some(),
            sequence_groups: Vec::new(),
            group_sequences: false,
        },
    })
}
