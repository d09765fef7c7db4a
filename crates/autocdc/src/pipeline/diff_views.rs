//! The types a snapshot diff compares in: strings and binaries as views.
//!
//! Parquet is read into `Utf8View` / `BinaryView` arrays, and a target
//! stores `Utf8` / `Binary`. Cast before the diff, every string of both
//! sides — the whole snapshot and every live row — would be copied into
//! offset arrays, and copied again when the diff gathers the pairs it
//! compares, only for nearly all of them to be equal. The diff reads both
//! sides as views instead (a gather copies 16 bytes a value, not its
//! bytes) and its events, a few rows, are cast to the stored types after
//! it:
//!
//! ```text
//!  live rows ──(views)──┐
//!                       ├─► SnapshotDiff ──► cast to the stored types ──► events
//!  snapshot ──(views)───┘
//! ```

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{Column, Result};
use datafusion::logical_expr::expr::{Alias, Cast};
use datafusion::logical_expr::{
    cast, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder, Projection,
};

/// The view type a stored type is compared as (`None`: compared as it is).
fn view_of(stored: &DataType) -> Option<DataType> {
    match stored {
        DataType::Utf8 => Some(DataType::Utf8View),
        DataType::Binary => Some(DataType::BinaryView),
        _ => None,
    }
}

/// `target_schema` with its top-level strings and binaries as views.
pub(super) fn diff_schema(target_schema: &Schema) -> Schema {
    let fields: Vec<Field> = target_schema
        .fields()
        .iter()
        .map(|f| match view_of(f.data_type()) {
            Some(view) => f.as_ref().clone().with_data_type(view),
            None => f.as_ref().clone(),
        })
        .collect();
    Schema::new_with_metadata(fields, target_schema.metadata().clone())
}

/// `plan` with the casts of its top projection from a view to the stored
/// type left out (`CAST(s AS Utf8)` of a `Utf8View` column is `s`), so
/// that a projection to [`diff_schema`] over it converts nothing. Any other
/// plan is returned as it is (the diff then casts back to views: correct,
/// only slower).
pub(super) fn views_kept(plan: LogicalPlan) -> Result<LogicalPlan> {
    let LogicalPlan::Projection(projection) = plan else {
        return Ok(plan);
    };
    let Projection { expr, input, .. } = projection;
    let expr = expr
        .into_iter()
        .map(|e| without_view_cast(e, &input))
        .collect::<Result<Vec<_>>>()?;
    Ok(LogicalPlan::Projection(Projection::try_new(expr, input)?))
}

/// `e` (an aliased cast) without a cast of a view to its stored type.
fn without_view_cast(e: Expr, input: &LogicalPlan) -> Result<Expr> {
    Ok(match e {
        Expr::Alias(alias) => {
            let Alias {
                expr,
                relation,
                name,
                metadata,
            } = alias;
            Expr::Alias(Alias {
                expr: Box::new(without_view_cast(*expr, input)?),
                relation,
                name,
                metadata,
            })
        }
        Expr::Cast(Cast { expr, field }) => {
            let from = expr.get_type(input.schema())?;
            if view_of(field.data_type()).is_some_and(|view| view == from) {
                *expr
            } else {
                Expr::Cast(Cast { expr, field })
            }
        }
        e => e,
    })
}

/// The diff's events (`[target columns as views..., event columns...]`)
/// with the target columns cast to their stored types.
pub(super) fn stored_types(diff: LogicalPlan, target_schema: &Schema) -> Result<LogicalPlan> {
    let projection: Vec<Expr> = diff
        .schema()
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let column = Expr::Column(Column::new_unqualified(f.name()));
            match target_schema.fields().get(i) {
                Some(stored) if stored.data_type() != f.data_type() => {
                    cast(column, stored.data_type().clone()).alias(f.name())
                }
                _ => column,
            }
        })
        .collect();
    LogicalPlanBuilder::from(diff).project(projection)?.build()
}
