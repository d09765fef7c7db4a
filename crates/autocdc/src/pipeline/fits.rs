//! Values that do not fit a declared target's type: a declared column keeps
//! its type, and a source of a wider type of the same family (a BIGINT fed
//! to an INT column) converts into it. A value that does not fit — out of
//! range, a decimal that would round, a float that would overflow to an
//! infinity — fails the update with a message naming the flow, column and
//! value, rather than with a cast error naming none or a changed value.
//! (An undeclared target widens instead,
//! SPEC §2.9: its casts never fail.)
//!
//! Sequences and keys are kept to the microsecond (Delta's timestamps): a
//! nanosecond `SEQUENCE BY` or `SYSTEM SEQUENCE BY` column whose value has
//! nanoseconds would order events wrongly (two within one microsecond
//! compare equal, a newer one reads as late), and a nanosecond key column's
//! would merge keys (two within one microsecond become one), so such a
//! value fails the update naming the flow, clause and value.

use std::sync::Arc;

use arrow::datatypes::{DataType, Schema, TimeUnit};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, Result};
use datafusion::datasource::source_as_provider;
use datafusion::functions::expr_fn::concat;
use datafusion::logical_expr::expr::Cast;
use datafusion::logical_expr::{
    cast, lit, when, DmlStatement, Expr, ExprSchemable, LogicalPlan, LogicalPlanBuilder,
    Projection, Values, WriteOp,
};
use datafusion::optimizer::AnalyzerRule;

use crate::fit::fit;
use crate::raise::raise_if;
use crate::spec::resolve::{compatible, storage_type, widens};
use crate::spec::{FlowSpec, SequenceBy};
use crate::table::ScdTable;

/// `source` with a check of every value it casts to a narrower target type
/// (a declared INT column fed BIGINT, say): a value that does not fit fails
/// the update with a message naming the flow, column and value, rather
/// than with a cast error naming none. The check is DML's
/// ([`crate::fit`]): each such column is read as `autocdc_fit(c, …)`, in
/// the target's type (its exact conversion: a float into a decimal), in a
/// projection of every column (see [`with_value_checks`] on why not a
/// filter).
pub(super) fn with_fit_checks(
    flow: &str,
    clause: &str,
    source: LogicalPlan,
    target_schema: &Schema,
) -> Result<LogicalPlan> {
    let source_schema = Arc::clone(source.schema());
    let mut checked = false;
    let columns = source_schema
        .columns()
        .into_iter()
        .zip(source_schema.fields())
        .map(|(column, field)| {
            let name = column.name.clone();
            let value = Expr::Column(column);
            let Ok(target) = target_schema.field_with_name(&name) else {
                return Ok(value);
            };
            let to = target.data_type();
            // (a type the target's cannot take stays as it is: the flow's
            // type checks refuse it, naming both)
            if !needs_fit_check(&storage_type(field.data_type()), to)
                || !compatible(field.data_type(), to)
            {
                return Ok(value);
            }
            checked = true;
            let kept = fit(
                value,
                to,
                format!("flow '{flow}': {clause}: column '{name}' has the value "),
                format!(", which the target's type {to} cannot hold; nothing was committed"),
            )?;
            Ok(kept.alias(name))
        })
        .collect::<Result<Vec<_>>>()?;
    match checked {
        true => LogicalPlanBuilder::from(source).project(columns)?.build(),
        false => Ok(source),
    }
}

/// Whether a value of type `from` needs a check to be kept as `to`: a
/// numeric type that neither is nor widens to it.
fn needs_fit_check(from: &DataType, to: &DataType) -> bool {
    !(from == to || *from == DataType::Null || widens(from, to) || !from.is_numeric())
}

/// [`needs_fit_check`], or text a statement gives a number, date or time
/// column (read when it is written: `'300'` for a TINYINT).
fn statement_needs_fit_check(from: &DataType, to: &DataType) -> bool {
    let text = matches!(
        from,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    );
    needs_fit_check(from, to)
        || (text && (to.is_numeric() || to.is_temporal() || *to == DataType::Boolean))
}

/// `source` with a check that the values of `flow`'s sequence columns (a
/// column each) and key columns lose nothing when kept to the microsecond
/// (see the module docs).
pub(crate) fn with_sequence_precision_checks(
    flow: &FlowSpec,
    source: LogicalPlan,
) -> Result<LogicalPlan> {
    let source_schema = Arc::clone(source.schema());
    const ORDERED: &str = " has nanoseconds, and sequences are kept to the microsecond: \
         events within one microsecond would be ordered wrongly; nothing was committed";
    const MERGED: &str = " has nanoseconds, and keys are kept to the microsecond: keys \
         within one microsecond would be one key; CAST it to TIMESTAMP (microseconds) if \
         that is meant, or key by another column; nothing was committed";
    // (clause, column, why a value with nanoseconds is refused)
    let mut columns: Vec<(&str, &str, &str)> = Vec::new();
    if let Some(SequenceBy::Column(c)) = &flow.sequence_by {
        columns.push(("SEQUENCE BY", c, ORDERED));
    }
    if let Some(c) = &flow.system_sequence_by {
        columns.push(("SYSTEM SEQUENCE BY", c, ORDERED));
    }
    columns.extend(flow.keys.iter().map(|k| ("KEYS", k.as_str(), MERGED)));
    let mut checks = Vec::new();
    for (clause, name, why) in &columns {
        let Ok(field) = source_schema.field_with_unqualified_name(name) else {
            continue;
        };
        let prefix = format!("flow '{}': {clause} value ", flow.name);
        if let Some(check) = microsecond_check(field, prefix, why)? {
            checks.push((field.name().clone(), check));
        }
    }
    with_value_checks(source, checks)
}

/// `source` with each of `checks` (a column's name and a check of its
/// values, `true` or a failure) made where the column is read:
/// `CASE WHEN check THEN c END AS c`, or `source` as it is without any.
///
/// A check is part of its column's value rather than a filter of its own:
/// the optimizers would merge such a filter into the source query's
/// `WHERE` (`autocdc_raise(…) AND v = 1`), whose `AND` evaluates both
/// sides over whole batches, so that a row the query leaves out failed the
/// update. A projection of every column sees the rows the filters below it
/// kept, and is not moved below them.
fn with_value_checks(source: LogicalPlan, checks: Vec<(String, Expr)>) -> Result<LogicalPlan> {
    if checks.is_empty() {
        return Ok(source);
    }
    let columns = source
        .schema()
        .columns()
        .into_iter()
        .map(|column| {
            let check = checks
                .iter()
                .filter(|(name, _)| *name == column.name)
                .map(|(_, check)| check.clone())
                .reduce(Expr::and);
            let name = column.name.clone();
            let value = Expr::Column(column);
            Ok(match check {
                Some(check) => when(check, value).end()?.alias(name),
                None => value,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    LogicalPlanBuilder::from(source).project(columns)?.build()
}

/// The check of one nanosecond timestamp column (`None` for another type):
/// a value with nanoseconds fails with `prefix`, the value, then `why`.
fn microsecond_check(
    field: &arrow::datatypes::Field,
    prefix: String,
    why: &str,
) -> Result<Option<Expr>> {
    let DataType::Timestamp(TimeUnit::Nanosecond, zone) = field.data_type() else {
        return Ok(None);
    };
    let value = Expr::Column(Column::new_unqualified(field.name()));
    let micros = DataType::Timestamp(TimeUnit::Microsecond, zone.clone());
    let kept = cast(cast(value.clone(), micros), field.data_type().clone());
    let message = concat(vec![
        lit(prefix),
        cast(value.clone(), DataType::Utf8),
        lit(why),
    ]);
    Ok(Some(raise_if(when(kept.not_eq(value), message).end()?)))
}

/// `INSERT` into and `UPDATE` of a streaming table with a check of each
/// value DataFusion's planner casts to a narrower column type (a BIGINT
/// into a TINYINT column, say): one that does not fit fails the statement
/// naming it, the table and the column, rather than with Arrow's cast error
/// naming neither. An analyzer rule: the optimizers would fold a literal's
/// cast, and fail, before any hook of the table sees it.
///
/// ```text
/// Dml: op=[Insert Into] table=[t]         Dml: op=[Insert Into] table=[t]
///   Projection: CAST(x AS Int8) AS v  ──►   Projection: autocdc_fit(x, Int8 NULL, …) AS v
///     …                                       …
///   (or VALUES cast to t's types)           (or VALUES of autocdc_fit(…))
/// ```
#[derive(Debug, Default)]
pub struct DmlFitChecks;

impl AnalyzerRule for DmlFitChecks {
    fn name(&self) -> &str {
        "autocdc_dml_fit_checks"
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        Ok(plan
            .transform_down(|node| {
                let LogicalPlan::Dml(dml) = &node else {
                    return Ok(Transformed::no(node));
                };
                let statement = match dml.op {
                    WriteOp::Insert(_) => "INSERT INTO",
                    WriteOp::Update => "UPDATE",
                    _ => return Ok(Transformed::no(node)),
                };
                let streaming = source_as_provider(&dml.target)
                    .is_ok_and(|p| p.downcast_ref::<ScdTable>().is_some());
                let LogicalPlan::Projection(projection) = dml.input.as_ref() else {
                    return Ok(Transformed::no(node));
                };
                if !streaming {
                    return Ok(Transformed::no(node));
                }
                let checked = |column: &str, e: &Expr, schema: &DFSchema| -> Result<Option<Expr>> {
                    let Expr::Cast(Cast { expr, field }) = e else {
                        return Ok(None);
                    };
                    let (from, to) = (expr.get_type(schema)?, field.data_type());
                    if !statement_needs_fit_check(&from, to) {
                        return Ok(None);
                    }
                    let before = format!(
                        "{statement} {}: column '{column}' has the value ",
                        dml.table_name
                    );
                    let after = format!(", which its type {to} cannot hold; nothing was changed");
                    fit(expr.as_ref().clone(), to, before, after).map(Some)
                };
                // the statement's columns, and the target column each is
                let mut changed = false;
                let mut targets = Vec::new();
                let mut exprs = Vec::with_capacity(projection.expr.len());
                for e in &projection.expr {
                    let Expr::Alias(alias) = e else {
                        exprs.push(e.clone());
                        continue;
                    };
                    let inner = match alias.expr.as_ref() {
                        Expr::Cast(Cast { expr, .. }) => expr.as_ref(),
                        other => other,
                    };
                    if let Expr::Column(c) = inner {
                        let at = projection.input.schema().index_of_column(c).ok();
                        targets.push((at, alias.name.clone()));
                    }
                    match checked(&alias.name, &alias.expr, projection.input.schema())? {
                        Some(fitted) => {
                            changed = true;
                            exprs.push(
                                fitted.alias_qualified(alias.relation.clone(), alias.name.clone()),
                            );
                        }
                        None => exprs.push(e.clone()),
                    }
                }
                // `INSERT … VALUES`, also below a query (`SELECT * FROM
                // (VALUES …)`): DataFusion casts the literals to the
                // target's types in the VALUES themselves
                let width = dml.target.schema().fields().len();
                let fed = projection.input.schema().fields().len();
                let target_names: Vec<String> = dml
                    .target
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect();
                let input =
                    Arc::unwrap_or_clone(Arc::clone(&projection.input)).transform_up(|plan| {
                        let LogicalPlan::Values(values) = &plan else {
                            return Ok(Transformed::no(plan));
                        };
                        let empty = DFSchema::empty();
                        let mut fitted_any = false;
                        let mut rows = Vec::with_capacity(values.values.len());
                        for row in &values.values {
                            let mut fitted = Vec::with_capacity(row.len());
                            for (i, (e, field)) in
                                row.iter().zip(values.schema.fields()).enumerate()
                            {
                                // the target column it is: by the statement's
                                // projection, or by position when as wide
                                // (DataFusion types a VALUES list's column i
                                // as the statement's column i: the target
                                // column the query's column i feeds)
                                let column = targets
                                    .iter()
                                    .find(|(from, _)| *from == Some(i) && row.len() == fed)
                                    .map(|(_, to)| to.clone())
                                    .or_else(|| {
                                        (row.len() == width).then(|| target_names[i].clone())
                                    })
                                    .unwrap_or_else(|| field.name().clone());
                                let (inner, alias) = match e {
                                    Expr::Alias(alias) => (alias.expr.as_ref(), Some(alias)),
                                    other => (other, None),
                                };
                                match checked(&column, inner, &empty)? {
                                    Some(e) => {
                                        fitted_any = true;
                                        fitted.push(match alias {
                                            Some(a) => e.alias_qualified(
                                                a.relation.clone(),
                                                a.name.clone(),
                                            ),
                                            None => e,
                                        });
                                    }
                                    None => fitted.push(e.clone()),
                                }
                            }
                            rows.push(fitted);
                        }
                        if !fitted_any {
                            return Ok(Transformed::no(plan));
                        }
                        Ok(Transformed::yes(LogicalPlan::Values(Values {
                            schema: Arc::clone(&values.schema),
                            values: rows,
                        })))
                    })?;
                changed |= input.transformed;
                let input = Arc::new(input.data);
                if !changed {
                    return Ok(Transformed::no(node));
                }
                let projection = Projection::try_new(exprs, input)?;
                let dml = DmlStatement {
                    input: Arc::new(LogicalPlan::Projection(projection)),
                    ..dml.clone()
                };
                Ok(Transformed::new(
                    LogicalPlan::Dml(dml),
                    true,
                    TreeNodeRecursion::Jump,
                ))
            })?
            .data)
    }
}
