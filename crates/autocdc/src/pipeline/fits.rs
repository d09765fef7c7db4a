//! Values that do not fit a declared target's type: a declared column keeps
//! its type, and a source of a wider type of the same family (a BIGINT fed
//! to an INT column) converts into it. A value that does not fit fails the
//! update with a message naming the flow, column and value, rather than
//! with a cast error naming none. (An undeclared target widens instead,
//! SPEC §2.9: its casts never fail.)

use std::sync::Arc;

use arrow::datatypes::{DataType, Schema};
use datafusion::common::{Column, Result};
use datafusion::functions::expr_fn::concat;
use datafusion::logical_expr::{cast, lit, try_cast, when, Expr, LogicalPlan, LogicalPlanBuilder};

use crate::functions::raise::raise_if;
use crate::spec::resolve::{storage_type, widens};

/// `source` with a check of every value it casts to a narrower target type
/// (a declared INT column fed BIGINT, say): a value that does not fit fails
/// the update with a message naming the flow, column and value, rather
/// than with a cast error naming none.
pub(super) fn with_fit_checks(
    flow: &str,
    source: LogicalPlan,
    target_schema: &Schema,
) -> Result<LogicalPlan> {
    let source_schema = Arc::clone(source.schema());
    let mut checks = Vec::new();
    for field in target_schema.fields() {
        let Ok(column) = source_schema.field_with_unqualified_name(field.name()) else {
            continue;
        };
        let from = storage_type(column.data_type());
        let to = field.data_type();
        if from == *to || from == DataType::Null || widens(&from, to) || !from.is_numeric() {
            continue;
        }
        let value = Expr::Column(Column::new_unqualified(field.name()));
        let message = concat(vec![
            lit(format!(
                "flow '{flow}': COLUMNS: column '{}' has the value ",
                field.name()
            )),
            cast(value.clone(), DataType::Utf8),
            lit(format!(
                ", which the target's type {to} cannot hold; nothing was committed"
            )),
        ]);
        let misfit = value
            .clone()
            .is_not_null()
            .and(try_cast(value, to.clone()).is_null());
        checks.push(raise_if(when(misfit, message).end()?));
    }
    match checks.into_iter().reduce(Expr::and) {
        None => Ok(source),
        Some(check) => LogicalPlanBuilder::from(source).filter(check)?.build(),
    }
}
