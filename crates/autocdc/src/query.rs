//! AUTO CDC in a query: the fold as a relation over any `DataFrame` of
//! change events, no storage and no state — what a flow's target would
//! hold after one update from an empty target (SPEC §4.10).
//!
//! ```text
//!  Projection: the target's columns (user and SCD columns, no __cdc_*)
//!    Filter: __cdc_kind = upsert          live rows and versions only
//!      AutoCdc: the flow's fold           the same operator as flows
//!        (events, resolved as a flow's)   (truncates: its second input)
//! ```
//!
//! The flow's clauses, validation and messages are a flow's: the spec is
//! resolved by `crate::spec::resolve` against an empty target. The
//! session must know the operators ([`crate::AutoCdc::install`]; a
//! [`crate::CdcSession`] does).

use std::ops::Not;
use std::sync::Arc;

use datafusion::common::{plan_err, Column, Result, ScalarValue};
use datafusion::functions::string::expr_fn::concat;
use datafusion::functions_window::expr_fn::lead;
use datafusion::logical_expr::{
    cast, col, lit, when, Expr, ExprFunctionExt, Extension, JoinType, LogicalPlan,
    LogicalPlanBuilder,
};
use datafusion::prelude::DataFrame;

use crate::fold::columns::{
    change_type_name, Kind, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE,
    INTERNAL_PREFIX, KIND_COL, SEQ_COL,
};
use crate::logical::AutoCdcNode;
use crate::pipeline::{fold_spec, with_sequence_precision_checks};
use crate::raise::{raise_if, text_of};
use crate::spec::resolve::{check_change_feed_names, is_orderable, resolve, TargetShape};
use crate::spec::{ColumnSelection, FlowSpec, SequenceBy};
use crate::table::commit::CHANGE_TYPE_COL;

/// AUTO CDC over a `DataFrame` of change events.
pub trait AutoCdcDataFrame {
    /// The rows a target of `flow`'s kind would hold after one update from
    /// an empty target, with these events as its source (`flow.source` is
    /// not read). SCD 2 rows carry `__START_AT` / `__END_AT`, BITEMPORAL
    /// rows the four time columns.
    fn auto_cdc(self, flow: &FlowSpec) -> Result<DataFrame>;

    /// The rows a snapshot flow's target of `flow`'s kind (its keys,
    /// columns, `STORED AS`, `TRACK HISTORY`) would hold after taking, in
    /// order, every snapshot these rows hold: a snapshot is the rows with
    /// one value of the column `version`, which sequences them (SCD 2:
    /// `__START_AT` / `__END_AT` are versions). See [`snapshot_events`].
    fn snapshot_diff(self, flow: &FlowSpec, version: &str) -> Result<DataFrame>;

    /// The change data feed that update would write (`WITH CHANGES`): the
    /// rows of [`Self::auto_cdc`]'s columns that changed, each with its
    /// `_change_type` (`insert`, `update_preimage`, `update_postimage`,
    /// `delete`), as a flow's `table_changes` shows them without the
    /// commit columns.
    fn auto_cdc_changes(self, flow: &FlowSpec) -> Result<DataFrame>;

    /// The change data feed of [`Self::snapshot_diff`] (see
    /// [`Self::auto_cdc_changes`]).
    fn snapshot_diff_changes(self, flow: &FlowSpec, version: &str) -> Result<DataFrame>;
}

/// What a fold in a query returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    /// The rows the target would hold.
    Rows,
    /// The change data feed it would write.
    Changes,
}

/// The prefix of the columns [`snapshot_events`] adds (no source column's).
const SNAPSHOT_PREFIX: &str = "__snapshot_";
/// The sequence of the change events of [`snapshot_events`].
const SNAPSHOT_VERSION: &str = "__snapshot_version";
/// Whether a change event of [`snapshot_events`] is a delete.
const SNAPSHOT_GONE: &str = "__snapshot_gone";

/// The change events that diffing consecutive snapshots gives, as rows
/// folded by AUTO CDC:
///
/// | a key at snapshot `v` …                                 | event                          |
/// |---------------------------------------------------------|--------------------------------|
/// | is present                                              | upsert of its row at `v`       |
/// | is present, and absent from the next snapshot `w`       | delete at `w`                  |
///
/// Upserts of unchanged rows are absorbed by the fold (an SCD 2 version
/// opens only when tracked values change), so the result is that of a
/// snapshot flow fed the snapshots in version order. `keys` and `version`
/// are columns of `snapshots`; the events carry every other column, then
/// `SNAPSHOT_VERSION` and `SNAPSHOT_GONE`.
pub fn snapshot_events(snapshots: DataFrame, keys: &[String], version: &str) -> Result<DataFrame> {
    snapshot_events_of("snapshots", snapshots, keys, version)
}

/// [`snapshot_events`] for flow `flow` (its name in the errors): a key twice
/// in one snapshot fails the query, naming key and version.
fn snapshot_events_of(
    flow: &str,
    snapshots: DataFrame,
    keys: &[String],
    version: &str,
) -> Result<DataFrame> {
    let column = |name: &str| Expr::Column(Column::new_unqualified(name));
    let schema = snapshots.schema().as_arrow().clone();
    if schema.field_with_name(version).is_err() {
        let columns: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        return plan_err!(
            "flow '{flow}': VERSION BY: column '{version}' does not exist in the snapshots ({})",
            columns.join(", ")
        );
    }
    // (the diff's own columns: a source column of such a name would be
    // ambiguous with them)
    if let Some(taken) = schema
        .fields()
        .iter()
        .find(|f| f.name().to_ascii_lowercase().starts_with(SNAPSHOT_PREFIX))
    {
        return plan_err!(
            "flow '{flow}': the snapshots' column '{}' uses a name of the diff's own columns \
             ({SNAPSHOT_PREFIX}*): rename it",
            taken.name()
        );
    }
    let values: Vec<&str> = schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .filter(|n| *n != version)
        .collect();
    // each row with its key's next version present (the same version: the
    // key is twice in that snapshot, an error)
    const NEXT: &str = "__snapshot_next";
    const KEY_NEXT: &str = "__snapshot_key_next";
    const AT: &str = "__snapshot_at";
    let order = || vec![column(version).sort(true, false)];
    let key_next = snapshots.clone().select(
        schema
            .fields()
            .iter()
            .map(|f| column(f.name()))
            .chain([lead(column(version), Some(1), None)
                .partition_by(keys.iter().map(|k| column(k)).collect())
                .order_by(order())
                .build()?
                .alias(KEY_NEXT)])
            .collect::<Vec<_>>(),
    )?;
    let twice = keys
        .iter()
        .map(|k| column(k).is_not_null())
        .fold(column(KEY_NEXT).eq(column(version)), Expr::and);
    let type_of = |name: &str| {
        schema
            .field_with_name(name)
            .map_or(&arrow::datatypes::DataType::Null, |f| f.data_type())
    };
    // `k1=v1, k2=v2` of a row's key, as text parts
    let key_text = || {
        keys.iter().enumerate().flat_map(|(i, k)| {
            let separator = if i == 0 { "" } else { ", " };
            [
                lit(format!("{separator}{k}=")),
                text_of(column(k), type_of(k)),
            ]
        })
    };
    let message: Vec<Expr> = std::iter::once(lit(format!("flow '{flow}': duplicate key (")))
        .chain(key_text())
        .chain([
            lit(") in the snapshot at version "),
            text_of(column(version), type_of(version)),
            lit("; nothing was committed"),
        ])
        .collect();
    let unversioned: Vec<Expr> = std::iter::once(lit(format!(
        "flow '{flow}': VERSION BY: column '{version}' is NULL in a row of key ("
    )))
    .chain(key_text())
    .chain([lit(
        "): every snapshot row needs its version; nothing was committed",
    )])
    .collect();
    let key_next = key_next.filter(raise_if(
        when(column(version).is_null(), concat(unversioned))
            .when(twice, concat(message))
            .otherwise(lit(ScalarValue::Utf8(None)))?,
    ))?;
    let present = key_next.clone().select(
        values
            .iter()
            .map(|n| column(n))
            .chain([
                column(version).alias(SNAPSHOT_VERSION),
                lit(false).alias(SNAPSHOT_GONE),
            ])
            .collect::<Vec<_>>(),
    )?;
    // each version and the one after it
    let next = snapshots
        .select(vec![column(version).alias(AT)])?
        .distinct()?
        .select(vec![
            column(AT),
            lead(column(AT), Some(1), None)
                .order_by(vec![column(AT).sort(true, false)])
                .build()?
                .alias(NEXT),
        ])?;
    let gone = key_next
        .join_on(next, JoinType::Inner, [column(version).eq(column(AT))])?
        .filter(
            column(NEXT).is_not_null().and(
                column(KEY_NEXT)
                    .is_null()
                    .or(column(KEY_NEXT).not_eq(column(NEXT))),
            ),
        )?;
    let gone = gone.select(
        schema
            .fields()
            .iter()
            .filter(|f| f.name() != version)
            .map(|f| {
                if keys.iter().any(|k| k == f.name()) {
                    column(f.name())
                } else {
                    cast(lit(ScalarValue::Null), f.data_type().clone()).alias(f.name())
                }
            })
            .chain([
                cast(
                    column(NEXT),
                    schema.field_with_name(version)?.data_type().clone(),
                )
                .alias(SNAPSHOT_VERSION),
                lit(true).alias(SNAPSHOT_GONE),
            ])
            .collect::<Vec<_>>(),
    )?;
    present.union(gone)
}

/// The clauses of a snapshots relation checked against `snapshots` as a
/// flow's are against its source, with a flow's messages.
fn check_snapshot_clauses(snapshots: &DataFrame, flow: &FlowSpec, version: &str) -> Result<()> {
    let schema = snapshots.schema().as_arrow();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let Ok(field) = schema.field_with_name(version) else {
        return plan_err!(
            "flow '{}': VERSION BY: column '{version}' does not exist in the snapshots ({})",
            flow.name,
            names.join(", ")
        );
    };
    if !is_orderable(field.data_type()) {
        return plan_err!(
            "flow '{}': VERSION BY: column '{version}' has type {}, which is not orderable \
             (use integers, decimals, dates, timestamps, strings or a STRUCT of those)",
            flow.name,
            field.data_type()
        );
    }
    let listed = match &flow.columns {
        ColumnSelection::Only(list) | ColumnSelection::Except(list) => list.as_slice(),
        ColumnSelection::All => &[],
    };
    if listed.iter().any(|c| c == version) {
        return plan_err!(
            "flow '{}': COLUMNS: column '{version}' is the VERSION BY column, which is never \
             a column of the result",
            flow.name
        );
    }
    for key in &flow.keys {
        if key == version {
            return plan_err!(
                "flow '{}': KEYS: column '{key}' is the VERSION BY column; a snapshot's rows \
                 are keyed by other columns",
                flow.name
            );
        }
        if !names.contains(&key.as_str()) {
            return plan_err!(
                "flow '{}': KEYS: column '{key}' does not exist in the snapshots ({})",
                flow.name,
                names
                    .iter()
                    .filter(|n| **n != version)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    Ok(())
}

impl AutoCdcDataFrame for DataFrame {
    fn auto_cdc(self, flow: &FlowSpec) -> Result<DataFrame> {
        fold(self, flow, Output::Rows)
    }

    fn snapshot_diff(self, flow: &FlowSpec, version: &str) -> Result<DataFrame> {
        diff(self, flow, version, Output::Rows)
    }

    fn auto_cdc_changes(self, flow: &FlowSpec) -> Result<DataFrame> {
        fold(self, flow, Output::Changes)
    }

    fn snapshot_diff_changes(self, flow: &FlowSpec, version: &str) -> Result<DataFrame> {
        diff(self, flow, version, Output::Changes)
    }
}

/// `events` folded by `flow`: the rows, or the change feed (`output`).
fn fold(events: DataFrame, flow: &FlowSpec, output: Output) -> Result<DataFrame> {
    let (state, events) = events.into_parts();
    let now = state.execution_props().query_execution_start_time;
    let now_micros = now.map_or(0, |t| t.timestamp_micros());
    // (sequences are kept to the microsecond here too: a value with
    // nanoseconds fails, naming it, as in a flow)
    let events = with_sequence_precision_checks(flow, events)?;
    let resolved = resolve(
        &state,
        flow,
        events,
        &TargetShape::default(),
        now_micros,
        None,
    )?;
    if output == Output::Changes {
        // (the feed's own columns come after the target's)
        check_change_feed_names(&flow.name, &resolved.layout.target_columns)?;
    }
    let kind_is = |k: Kind| col(KIND_COL).eq(lit(k as i8));
    let (rows, truncates) = match flow.apply_as_truncates {
        Some(_) => (
            LogicalPlanBuilder::from(resolved.events.clone())
                .filter(kind_is(Kind::Truncate).not())?
                .build()?,
            LogicalPlanBuilder::from(resolved.events.clone())
                .filter(kind_is(Kind::Truncate))?
                .project(vec![col(SEQ_COL)])?
                .build()?,
        ),
        None => (
            resolved.events.clone(),
            LogicalPlanBuilder::empty(false)
                .project(vec![cast(
                    lit(ScalarValue::Null),
                    resolved.sequence_type.clone(),
                )
                .alias(SEQ_COL)])?
                .build()?,
        ),
    };
    let mut fold = fold_spec(&state, flow, &resolved, false);
    // rows are read as they are: the fold emits only them, and the query
    // reads only the columns they need (a change feed compares every column
    // of a key's old and new rows)
    fold.visible_only = output == Output::Rows;
    let node = AutoCdcNode::try_new(fold, rows, truncates)?;
    let node = match output {
        Output::Rows => node.with_prunable_columns(),
        Output::Changes => node,
    };
    let folded = LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    });
    let mut visible: Vec<Expr> = folded
        .schema()
        .fields()
        .iter()
        .filter(|f| !f.name().starts_with(INTERNAL_PREFIX))
        .map(|f| Expr::Column(Column::new_unqualified(f.name())))
        .collect();
    let rows = match output {
        Output::Rows => kind_is(Kind::Upsert),
        Output::Changes => {
            let is = |k: i8| col(KIND_COL).eq(lit(k));
            let name = |k: i8| lit(change_type_name(k).unwrap_or_default());
            let change_type = when(is(CHANGE_INSERT), name(CHANGE_INSERT))
                .when(is(CHANGE_PREIMAGE), name(CHANGE_PREIMAGE))
                .when(is(CHANGE_POSTIMAGE), name(CHANGE_POSTIMAGE))
                .when(is(CHANGE_DELETE), name(CHANGE_DELETE))
                .end()?;
            visible.push(change_type.alias(CHANGE_TYPE_COL));
            col(KIND_COL).gt_eq(lit(CHANGE_INSERT))
        }
    };
    let plan = LogicalPlanBuilder::from(folded)
        .filter(rows)?
        .project(visible)?
        .build()?;
    Ok(DataFrame::new(state, plan))
}

/// The snapshots of `snapshots` (one per value of `version`) folded by
/// `flow`: the rows, or the change feed (`output`).
fn diff(snapshots: DataFrame, flow: &FlowSpec, version: &str, output: Output) -> Result<DataFrame> {
    check_snapshot_clauses(&snapshots, flow, version)?;
    let events = snapshot_events_of(&flow.name, snapshots, &flow.keys, version)?;
    let mut flow = flow.clone();
    flow.sequence_by = Some(SequenceBy::Column(SNAPSHOT_VERSION.to_string()));
    flow.apply_as_deletes = Some(SNAPSHOT_GONE.to_string());
    // (the events carry the version as their sequence only)
    let hidden = [SNAPSHOT_VERSION, SNAPSHOT_GONE].map(str::to_string);
    flow.columns = match flow.columns {
        ColumnSelection::All => ColumnSelection::Except(hidden.to_vec()),
        ColumnSelection::Except(mut except) => {
            except.extend(hidden);
            ColumnSelection::Except(except)
        }
        only @ ColumnSelection::Only(_) => only,
    };
    fold(events, &flow, output)
}
