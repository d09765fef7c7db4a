//! `INSERT INTO t ...` on an SCD 1 target: new keys become live rows (on
//! an append flow's table, which has no keys: new rows).

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::common::{Column, DataFusionError, Result, ScalarValue};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{col, lit, Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_plan::{collect, ExecutionPlan};

use super::rows_exec::Statement;
use super::{
    column, file_columns, key_positions, raw_plan, unqualified, InsertedRows, NewRows, Replacing,
    StatementRows,
};
use crate::fold::columns::{Kind, CHANGE_INSERT, KIND_COL, SEQ_COL};
use crate::pipeline::deletion_vector_budget;
use crate::spec::resolve::unsigned_zero;
use crate::spec::FlowSpec;
use crate::table::ScdTable;

/// `INSERT INTO t ...` on an SCD 1 target: each row is a live row of a key
/// the table does not hold live (a live key, a key inserted twice or a NULL
/// key is an error naming it, and nothing is written). A row takes the
/// sequence of its key's tombstone, which it replaces, so replays of older
/// events stay dropped; without one it takes the least value of the
/// sequence type (older than any event: the next event of its key applies,
/// a TRUNCATE removes it).
pub(super) async fn insert_scd1(
    table: Arc<ScdTable>,
    state: SessionState,
    input: Arc<dyn ExecutionPlan>,
    flow: FlowSpec,
) -> Result<Statement> {
    let user = table.meta().user_schema;
    let keys: Vec<String> = key_positions(&table, &flow)?
        .into_iter()
        .map(|i| user.field(i).name().clone())
        .collect();
    let schema = input.schema();
    let rows = InsertedRows::collect(input, &state).await?;
    let inserted = rows.count;
    // (a float key's -0.0 is its 0.0, as in flows)
    let source = || -> Result<LogicalPlanBuilder> {
        let scan = rows.scan()?;
        let projection: Vec<Expr> = scan
            .schema()
            .iter()
            .map(|(qualifier, field)| {
                let value = Expr::Column(Column::new(qualifier.cloned(), field.name()));
                if keys.contains(field.name()) {
                    let normal = unsigned_zero(value, field.data_type())?;
                    Ok(normal.alias_qualified(qualifier.cloned(), field.name()))
                } else {
                    Ok(value)
                }
            })
            .collect::<Result<_>>()?;
        scan.project(projection)
    };
    let key_of = |batch: &RecordBatch| -> Result<String> {
        let parts = keys
            .iter()
            .map(|k| {
                let value = datafusion::common::ScalarValue::try_from_array(
                    batch.column(batch.schema().index_of(k)?),
                    0,
                )?;
                Ok(format!("{k} = {value}"))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(parts.join(", "))
    };
    let first = |plan: LogicalPlan| {
        let state = state.clone();
        async move {
            let plan = LogicalPlanBuilder::from(plan).limit(0, Some(1))?.build()?;
            let batches =
                collect(state.create_physical_plan(&plan).await?, state.task_ctx()).await?;
            Ok::<_, DataFusionError>(batches.into_iter().find(|b| b.num_rows() > 0))
        }
    };
    let refuse = |why: String| {
        DataFusionError::Execution(format!(
            "INSERT INTO {}: {why}; nothing was inserted",
            table.name()
        ))
    };
    if keys.is_empty() {
        // an append flow's table: rows have no key, each row is new
        let columns = file_columns(&table);
        let new = NewRows::new(&table, &state, refuse)?;
        let new_rows = |kind: i8| -> Result<LogicalPlan> {
            let projection = new.projection(kind, lit(ScalarValue::Null), |c| {
                schema
                    .field_with_name(c)
                    .is_ok()
                    .then(|| Expr::Column(Column::new(Some("__cdc_insert"), c)))
            });
            source()?.project(projection)?.build()
        };
        let kept = raw_plan(&table)?
            .project(columns.iter().map(|c| column(c)).collect::<Vec<_>>())?
            .build()?;
        let changed = LogicalPlanBuilder::from(new_rows(Kind::Upsert as i8)?)
            .union(new_rows(CHANGE_INSERT)?)?
            .build()?;
        return Ok(Statement {
            rows: StatementRows { changed, kept },
            // (stored rows have no key to be replaced by)
            replacing: Replacing::Nothing,
            upserted: inserted,
            deleted: 0,
        });
    }
    let key_cols = || keys.iter().map(|k| column(k)).collect::<Vec<_>>();
    // NULL keys, keys inserted twice, keys live already
    let null_key = keys
        .iter()
        .map(|k| column(k).is_null())
        .reduce(Expr::or)
        .unwrap_or(lit(false));
    if first(source()?.filter(null_key)?.build()?).await?.is_some() {
        return Err(refuse(format!(
            "a row has a NULL key ({})",
            keys.join(", ")
        )));
    }
    let twice = source()?
        .aggregate(
            key_cols(),
            vec![datafusion::functions_aggregate::count::count(lit(1)).alias("__n")],
        )?
        .filter(col("__n").gt(lit(1i64)))?
        .build()?;
    if let Some(batch) = first(twice).await? {
        return Err(refuse(format!(
            "key ({}) is inserted twice",
            key_of(&batch)?
        )));
    }
    let stored = |kind: Kind| -> Result<LogicalPlanBuilder> {
        let mut projection: Vec<Expr> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| column(k).alias(format!("__k{i}")))
            .collect();
        projection.push(column(SEQ_COL).alias("__stored_seq"));
        raw_plan(&table)?
            .filter(column(KIND_COL).eq(lit(kind as i8)))?
            .project(projection)
    };
    let stored_keys: Vec<String> = (0..keys.len()).map(|i| format!("__k{i}")).collect();
    let live = source()?
        .join(
            stored(Kind::Upsert)?.build()?,
            datafusion::logical_expr::JoinType::LeftSemi,
            (unqualified(&keys), unqualified(&stored_keys)),
            None,
        )?
        .build()?;
    if let Some(batch) = first(live).await? {
        return Err(refuse(format!(
            "key ({}) is live; UPDATE it, or DELETE it first",
            key_of(&batch)?
        )));
    }

    let columns = file_columns(&table);
    let new = NewRows::new(&table, &state, refuse)?;
    // the new rows, each with its key's tombstone sequence
    let with_tombstones = source()?
        .join(
            stored(Kind::Delete)?.build()?,
            datafusion::logical_expr::JoinType::Left,
            (unqualified(&keys), unqualified(&stored_keys)),
            None,
        )?
        .build()?;
    let new_rows = |kind: i8| -> Result<LogicalPlan> {
        let projection = new.projection(kind, col("__stored_seq"), |c| {
            schema
                .field_with_name(c)
                .is_ok()
                .then(|| Expr::Column(Column::new(Some("__cdc_insert"), c)))
        });
        LogicalPlanBuilder::from(with_tombstones.clone())
            .project(projection)?
            .build()
    };
    let all = || columns.iter().map(|c| column(c)).collect::<Vec<_>>();
    // stored rows but the tombstones the new rows replace
    let kept = raw_plan(&table)?
        .filter(column(KIND_COL).not_eq(lit(Kind::Delete as i8)))?
        .project(all())?
        .union(
            raw_plan(&table)?
                .filter(column(KIND_COL).eq(lit(Kind::Delete as i8)))?
                .join(
                    source()?.project(key_cols())?.build()?,
                    datafusion::logical_expr::JoinType::LeftAnti,
                    (unqualified(&keys), unqualified(&keys)),
                    None,
                )?
                .project(all())?
                .build()?,
        )?
        .build()?;
    let changed = LogicalPlanBuilder::from(new_rows(Kind::Upsert as i8)?)
        .union(new_rows(CHANGE_INSERT)?)?
        .build()?;
    let rows = StatementRows { changed, kept };
    let replacing = deletion_vector_budget(&state, &table)
        .await?
        .map_or(Replacing::Rewrite, Replacing::UpTo);
    Ok(Statement {
        rows,
        replacing,
        upserted: inserted,
        deleted: 0,
    })
}
