//! `DELETE`, `UPDATE` and `INSERT` on the versions of SCD 2 targets, and
//! `DELETE` of whole keys on BITEMPORAL ones: each statement yields the
//! edited versions of the keys it touches, which [`History::replace`]
//! plans as their histories: the statement's plan is that update's.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::execution::session_state::SessionState;
use datafusion::functions_aggregate::expr_fn::{count, sum};
use datafusion::logical_expr::expr_rewriter::unnormalize_col;
use datafusion::logical_expr::{cast, lit, when, Expr, LogicalPlanBuilder};
use datafusion::physical_plan::{collect, ExecutionPlan};

use super::history::{count_rows, History, DROP_COL};
use super::{column, predicate, InsertedRows};
use crate::table::event::Operation;

/// A statement's plan (`None`: it changes nothing) and the number of rows
/// it affects.
type Planned = (Option<Arc<dyn ExecutionPlan>>, u64);

/// `DELETE FROM t [WHERE ...]`: the matching versions leave their keys'
/// histories (BITEMPORAL: every row of each key must match; the key is
/// erased). Plans it; counts the rows deleted.
pub(super) async fn delete(
    history: History,
    state: SessionState,
    filters: Vec<Expr>,
) -> Result<Planned> {
    let hit = predicate(filters);
    let deleted = count_rows(&state, history.versions()?.filter(hit.clone())?).await?;
    let touched = history.keys_of(history.versions()?.filter(hit.clone())?)?;
    if history.bitemporal() {
        whole_keys(&history, &state, touched.clone(), hit.clone()).await?;
    }
    let mut edited: Vec<Expr> = history
        .version_columns()
        .iter()
        .map(|c| column(c))
        .collect();
    edited.push(hit.alias(DROP_COL));
    let edited = history.versions_of(touched)?.project(edited)?.build()?;
    let plan = history.replace(&state, edited, Operation::Delete).await?;
    Ok((Some(plan), deleted))
}

/// BITEMPORAL `DELETE` erases whole keys: fail naming a key whose rows
/// `hit` matches only some of.
async fn whole_keys(
    history: &History,
    state: &SessionState,
    touched: datafusion::logical_expr::LogicalPlan,
    hit: Expr,
) -> Result<()> {
    let keys: Vec<Expr> = history.keys.iter().map(|k| column(k)).collect();
    let partial = history
        .versions_of(touched)?
        .aggregate(
            keys,
            vec![
                count(lit(1)).alias("__dml_rows"),
                sum(when(hit, lit(1i64)).otherwise(lit(0i64))?).alias("__dml_hit"),
            ],
        )?
        .filter(column("__dml_rows").not_eq(column("__dml_hit")))?
        .limit(0, Some(1))?
        .build()?;
    let rows = collect(
        state.create_physical_plan(&partial).await?,
        state.task_ctx(),
    )
    .await?;
    if let Some(batch) = rows.iter().find(|b| b.num_rows() > 0) {
        let n = |c: &str| -> Result<String> {
            Ok(datafusion::common::ScalarValue::try_from_array(
                batch.column(batch.schema().index_of(c)?),
                0,
            )?
            .to_string())
        };
        return Err(history.refuse(format!(
            "the condition matches {} of the {} rows of key ({}); DELETE on a BITEMPORAL \
             target erases whole keys, so it must match every row of each key it touches \
             (e.g. a condition on the key columns)",
            n("__dml_hit")?,
            n("__dml_rows")?,
            history.describe_key(batch)?
        )));
    }
    Ok(())
}

/// `UPDATE t SET ... [WHERE ...]`: matching versions take the assigned
/// values (`__start_at` / `__end_at` included; key columns cannot be
/// assigned). Plans it; counts the versions updated.
pub(super) async fn update(
    history: History,
    state: SessionState,
    assignments: Vec<(String, Expr)>,
    filters: Vec<Expr>,
) -> Result<Planned> {
    for (name, _) in &assignments {
        if history.keys.iter().any(|k| k == name) {
            return Err(history.refuse(format!("key column '{name}' cannot be assigned")));
        }
    }
    let hit = predicate(filters);
    let updated = count_rows(&state, history.versions()?.filter(hit.clone())?).await?;
    let touched = history.keys_of(history.versions()?.filter(hit.clone())?)?;
    let versions = history.versions_of(touched)?;
    let schema = Arc::clone(versions.schema());
    let mut edited = history
        .version_columns()
        .iter()
        .map(|c| {
            let Some((_, e)) = assignments.iter().find(|(n, _)| n == c) else {
                return Ok(column(c));
            };
            let data_type = schema.field_with_unqualified_name(c)?.data_type().clone();
            Ok(
                when(hit.clone(), cast(unnormalize_col(e.clone()), data_type))
                    .otherwise(column(c))?
                    .alias(c),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    edited.push(lit(false).alias(DROP_COL));
    let edited = versions.project(edited)?.build()?;
    let plan = history.replace(&state, edited, Operation::Update).await?;
    Ok((Some(plan), updated))
}

/// `INSERT INTO t ...`: the rows are new versions of their keys, beside
/// the versions they have. Plans it; counts the rows inserted.
pub(super) async fn insert(
    history: History,
    state: SessionState,
    input: Arc<dyn ExecutionPlan>,
) -> Result<Planned> {
    let inserted = InsertedRows::collect(input, &state).await?;
    if inserted.count == 0 {
        return Ok((None, 0));
    }
    let rows = || inserted.scan();
    let null_key = history
        .keys
        .iter()
        .map(|k| column(k).is_null())
        .reduce(Expr::or)
        .unwrap_or(lit(false));
    if count_rows(&state, rows()?.filter(null_key)?).await? > 0 {
        return Err(history.refuse(format!(
            "an inserted row has a NULL key ({})",
            history.keys.join(", ")
        )));
    }
    let versions = history.versions_of(history.keys_of(rows()?)?)?;
    let types = Arc::clone(versions.schema());
    let project = |plan: LogicalPlanBuilder| -> Result<LogicalPlanBuilder> {
        let mut columns = history
            .version_columns()
            .iter()
            .map(|c| {
                let data_type = types.field_with_unqualified_name(c)?.data_type().clone();
                Ok(cast(column(c), data_type).alias(c))
            })
            .collect::<Result<Vec<_>>>()?;
        columns.push(lit(false).alias(DROP_COL));
        plan.project(columns)
    };
    let edited = project(versions)?
        .union(project(rows()?)?.build()?)?
        .build()?;
    let plan = history.replace(&state, edited, Operation::Insert).await?;
    Ok((Some(plan), inserted.count))
}
