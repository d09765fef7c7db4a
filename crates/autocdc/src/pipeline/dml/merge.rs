//! `MERGE INTO t USING s ON c WHEN ...` on an SCD 1 target (SPEC §4.2):
//! one commit with its change feed, like the other DML.
//!
//! ```text
//!  source LEFT JOIN t (live rows) ON c ──► per source row: the first clause
//!  whose kind (MATCHED / NOT MATCHED) and condition hold, and its values
//!      │  (a target row matched twice, an inserted key twice or live: errors)
//!      ▼
//!  updates U, deletes D, inserts I (by key) ──► the table rewritten: rows of
//!  other keys kept; U rows updated in place (sequence kept), D rows become
//!  tombstones at their sequence, I rows live at their tombstone's sequence
//!  (or the least); pre/post images, deletes and inserts in the change feed
//! ```
//!
//! On SCD 1 targets, when the keys of U ∪ D ∪ I are at most the
//! deletion-vector budget, their stored rows are found by key (the key
//! columns of their buckets' files probed, the rows read by position) and
//! the steps after the match read only those; the statement then writes the
//! new rows of those keys and retires the found ones with deletion vectors,
//! so its cost follows the keys, not the table. When the ON clause equates
//! the keys with the source, the source's keys are found before the match
//! and the match reads only their rows; when the statement then changes
//! exactly those keys, the rows found are the ones it replaces (not found
//! twice).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::TableReference;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::{provider_as_source, MemTable};
use datafusion::execution::session_state::SessionState;
use datafusion::functions::expr_fn::coalesce;
use datafusion::logical_expr::cast;
use datafusion::logical_expr::{col, lit, when, Expr, JoinType, LogicalPlan, LogicalPlanBuilder};
use datafusion::physical_plan::{collect, ExecutionPlan};
use datafusion::sql::sqlparser::ast::{BinaryOperator, Expr as SqlExpr, Ident};
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use datafusion::sql::sqlparser::parser::Parser;

use super::history::{History, DROP_COL};
use super::rows_exec::{Prepare, Statement};
use super::{
    column, counted, file_columns, find_keys, found_scan, key_positions, keyed_flow, raw_plan,
    read_found, statement_plan, unqualified, InsertedRows, NewRows, Replacing, StatementRows,
};
use crate::fit::fit_scalar;
use crate::fold::columns::{
    Kind, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE, KIND_COL, SEQ_COL,
    START_AT_COL, WRITTEN_AT_COL,
};
use crate::pipeline::deletion_vector_budget;
use crate::spec::resolve::unsigned_zero_value;
use crate::spec::{sequence_groups, ScdType};
use crate::sql::{MergeAction, MergeStatement};
use crate::table::commit::EditKind;
use crate::table::event::Operation;
use crate::table::superseded::Superseded;
use crate::table::ScdTable;

/// The plan of `merge` on `table` (its clauses matched to the source rows
/// now); it yields the number of target rows it updated, deleted or
/// inserted.
pub async fn merge(
    state: &SessionState,
    table: Arc<ScdTable>,
    merge: &MergeStatement,
) -> Result<Arc<dyn ExecutionPlan>> {
    let name = table.name().to_string();
    let meta = table.meta();
    if merge.clauses.is_empty() {
        return Err(DataFusionError::Plan(format!(
            "MERGE INTO {name}: no WHEN clause: say what a matched or unmatched source row \
             does (WHEN MATCHED THEN UPDATE SET … | DELETE, WHEN NOT MATCHED THEN INSERT …)"
        )));
    }
    // (a table without a flow has no keys to match by; a rejects table
    // takes no DML: the flow's refusal says which)
    let flow = keyed_flow(&table, "MERGE")?;
    // (a flow that has not run yet: the storage it declares)
    let history = match meta.stored_as.unwrap_or(flow.stored_as_scd_type) {
        ScdType::Type1 => None,
        ScdType::Type2 => Some(History::new(Arc::clone(&table), "MERGE")?),
        ScdType::Bitemporal => {
            return Err(DataFusionError::NotImplemented(format!(
                "MERGE INTO {name} (BITEMPORAL) is not supported: its rows are beliefs over \
                 system time, written by its flows; DELETE erases whole keys"
            )))
        }
    };
    let refuse = |why: String| {
        DataFusionError::Execution(format!("MERGE INTO {name}: {why}; nothing was changed"))
    };
    let key_index = key_positions(&table, &flow)?;
    if key_index.is_empty() {
        // (an append flow's table: rows without keys, so nothing to match)
        return Err(refuse(format!(
            "the table has no keys (flow '{}' appends rows), and MERGE matches rows by key; \
             use INSERT, UPDATE or DELETE",
            flow.name
        )));
    }
    // the columns clauses read and write: the user columns (SCD 2: and the
    // business interval; a version is identified by its key and start)
    let (user, identity) = match &history {
        None => (Arc::clone(&meta.user_schema), key_index.clone()),
        Some(history) => {
            let provider = TableProvider::schema(table.as_ref());
            let columns = history.version_columns();
            let schema = Arc::new(Schema::new(
                columns
                    .iter()
                    .map(|c| Ok(provider.field_with_name(c)?.clone()))
                    .collect::<Result<Vec<_>>>()?,
            ));
            let start = schema.index_of(START_AT_COL)?;
            let identity = key_index.iter().copied().chain([start]).collect();
            (schema, identity)
        }
    };
    let keys: Vec<String> = key_index
        .iter()
        .map(|&i| user.field(i).name().clone())
        .collect();
    let identity_names: Vec<String> = identity
        .iter()
        .map(|&i| user.field(i).name().clone())
        .collect();
    let values: Vec<usize> = (0..user.fields().len())
        .filter(|i| !key_index.contains(i))
        .collect();
    let position = |c: &str| -> Result<usize> {
        user.fields()
            .iter()
            .position(|f| f.name() == c || f.name().eq_ignore_ascii_case(c))
            .ok_or_else(|| refuse(format!("'{c}' is not a column of the table")))
    };

    // 1. per source row: the clause that applies, and its values
    // (the statement's own texts are in its dialect, so is the query made
    // of them: its names quoted as the dialect quotes names — a `"` is a
    // string's under `databricks` — and its own names, `__tk0`, … quoted too,
    // which some dialects take for no identifier unquoted)
    let quote = sql_dialect_quote(&merge.dialect)?;
    let q = |s: &str| Ident::with_quote(quote, s).to_string();
    let alias = q(&merge.target_alias);
    let mut select: Vec<String> = identity_names
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{alias}.{} AS {}", q(k), q(&format!("__tk{i}"))))
        .collect();
    let matched = format!("{alias}.{} IS NOT NULL", q(&keys[0]));
    // (the source's columns, for the clauses' unqualified names: when its
    // query does not plan alone, the MERGE's own planning reports it)
    let source_sql = crate::sql::with_databricks_values_columns(
        &format!("SELECT * FROM {}", merge.source),
        &merge.dialect,
    )
    .into_owned();
    let source_columns: Option<Vec<String>> = state
        .create_logical_plan(&source_sql)
        .await
        .ok()
        .map(|plan| {
            plan.schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect()
        });
    let target_columns: Vec<String> = user.fields().iter().map(|f| f.name().clone()).collect();
    check_clauses(merge, &refuse, &target_columns, source_columns.as_deref())?;
    let mut case = String::from("CASE");
    for (n, clause) in merge.clauses.iter().enumerate() {
        let kind = if clause.matched {
            matched.clone()
        } else {
            format!("NOT ({matched})")
        };
        let condition = clause.condition.as_deref().unwrap_or("1 = 1");
        case.push_str(&format!(" WHEN ({kind}) AND ({condition}) THEN {n}"));
        match &clause.action {
            MergeAction::Update(set) => {
                for (c, e) in set {
                    let i = position(c)?;
                    if key_index.contains(&i) {
                        return Err(refuse(format!("key column '{c}' cannot be updated")));
                    }
                    select.push(format!("({e}) AS {}", q(&format!("__u{n}_{i}"))));
                }
            }
            MergeAction::Delete => {}
            MergeAction::Insert {
                columns,
                values: exprs,
            } => {
                let columns: Vec<usize> = if columns.is_empty() {
                    (0..user.fields().len()).collect()
                } else {
                    columns.iter().map(|c| position(c)).collect::<Result<_>>()?
                };
                if columns.len() != exprs.len() {
                    return Err(refuse(format!(
                        "INSERT gives {} values for {} columns",
                        exprs.len(),
                        columns.len()
                    )));
                }
                for (i, e) in columns.iter().zip(exprs) {
                    select.push(format!("({e}) AS {}", q(&format!("__i{n}_{i}"))));
                }
            }
        }
    }
    case.push_str(&format!(" ELSE -1 END AS {}", q("__clause")));
    select.push(case);
    // (SCD 1: the matched row's values, to leave out an update that sets
    // them to what they are: it changes nothing, SPEC §4)
    if history.is_none() {
        for &i in &values {
            select.push(format!(
                "{alias}.{} AS {}",
                q(user.field(i).name()),
                q(&format!("__cur{i}"))
            ));
        }
    }
    let target = format!("{}.{}", q(&table.name().schema), q(&table.name().table));
    let sql = format!(
        "SELECT {} FROM {} LEFT JOIN {target} AS {alias} ON {}",
        select.join(", "),
        merge.source,
        merge.on
    );
    // (the source may be a VALUES list: under `databricks` its columns are
    // col1, col2, …)
    let sql = crate::sql::with_databricks_values_columns(&sql, &merge.dialect);
    let mut plan = state.create_logical_plan(&sql).await?;
    // (SCD 1: matched against the stored rows of the source's keys only,
    // when the ON clause equates every key with the source and they are few)
    let mut probed = None;
    if history.is_none() {
        if let Some((rows, source_keys)) =
            source_key_rows(state, &table, merge, &keys, &user).await?
        {
            plan = with_target_rows(plan, &table, rows)?;
            probed = Some(source_keys);
        }
    }
    let rows = collect(state.create_physical_plan(&plan).await?, state.task_ctx()).await?;

    // 2. the updates, deletes and inserts, by key
    let mut matched_keys: HashMap<Vec<ScalarValue>, usize> = HashMap::new();
    let mut inserted_keys: HashMap<Vec<ScalarValue>, ()> = HashMap::new();
    let mut updates: Vec<(Vec<ScalarValue>, Vec<Option<ScalarValue>>)> = Vec::new();
    let mut deletes: Vec<Vec<ScalarValue>> = Vec::new();
    let mut inserts: Vec<Vec<ScalarValue>> = Vec::new();
    let describe = |key: &[ScalarValue]| {
        identity_names
            .iter()
            .zip(key)
            .map(|(k, v)| format!("{k} = {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for batch in &rows {
        let clause_col = arrow::compute::cast(
            batch.column(batch.schema().index_of("__clause")?),
            &DataType::Int64,
        )?;
        let clauses = clause_col.as_primitive::<Int64Type>();
        let scalar = |name: &str, row: usize| -> Result<Option<ScalarValue>> {
            match batch.schema().index_of(name) {
                Ok(i) => Ok(Some(ScalarValue::try_from_array(batch.column(i), row)?)),
                Err(_) => Ok(None),
            }
        };
        // whether an update's values (`set`, one per value column, `None`
        // where it assigns none) are those the matched row holds
        let sets_what_is = |set: &[Option<ScalarValue>], row: usize| -> Result<bool> {
            for (value, &i) in set.iter().zip(&values) {
                let Some(value) = value else { continue };
                let Some(current) = scalar(&format!("__cur{i}"), row)? else {
                    return Ok(false);
                };
                // (in the column's type: the scan may read text as views;
                // a value the type cannot hold is no value it holds, and is
                // refused when written)
                let field = user.field(i);
                let value = match fit_scalar(value, field.data_type())? {
                    Some(value) => value,
                    None => return Ok(false),
                };
                match current.cast_to(field.data_type()) {
                    Ok(current) if same_value(&value, &current) => {}
                    _ => return Ok(false),
                }
            }
            Ok(true)
        };
        for row in 0..batch.num_rows() {
            let target_key: Vec<ScalarValue> = (0..identity.len())
                .map(|i| ScalarValue::try_from_array(batch.column(i), row))
                .collect::<Result<_>>()?;
            let is_match = !target_key[0].is_null();
            if is_match {
                let seen = matched_keys.entry(target_key.clone()).or_insert(0);
                *seen += 1;
                if *seen > 1 {
                    return Err(refuse(format!(
                        "the target {} ({}) is matched by more than one source row",
                        if history.is_some() {
                            "version"
                        } else {
                            "row of key"
                        },
                        describe(&target_key)
                    )));
                }
            }
            if clauses.is_null(row) || clauses.value(row) < 0 {
                continue;
            }
            let n = clauses.value(row) as usize;
            let Some(clause) = merge.clauses.get(n) else {
                return Err(DataFusionError::Internal(format!(
                    "MERGE INTO {name}: clause {n} chosen, of {}",
                    merge.clauses.len()
                )));
            };
            match &clause.action {
                MergeAction::Update(_) => {
                    let set: Vec<Option<ScalarValue>> = values
                        .iter()
                        .map(|&i| scalar(&format!("__u{n}_{i}"), row))
                        .collect::<Result<_>>()?;
                    if history.is_none() && sets_what_is(&set, row)? {
                        continue;
                    }
                    updates.push((target_key, set));
                }
                MergeAction::Delete => deletes.push(target_key),
                MergeAction::Insert { .. } => {
                    let mut values: Vec<ScalarValue> = (0..user.fields().len())
                        .map(|i| {
                            Ok(scalar(&format!("__i{n}_{i}"), row)?.unwrap_or(ScalarValue::Null))
                        })
                        .collect::<Result<_>>()?;
                    // (a float key's -0.0 is its 0.0, as in flows)
                    for &i in &key_index {
                        values[i] = unsigned_zero_value(std::mem::replace(
                            &mut values[i],
                            ScalarValue::Null,
                        ));
                    }
                    let key: Vec<ScalarValue> =
                        key_index.iter().map(|&i| values[i].clone()).collect();
                    if key.iter().any(ScalarValue::is_null) {
                        return Err(refuse(format!(
                            "an inserted row has a NULL key ({})",
                            keys.join(", ")
                        )));
                    }
                    // SCD 2 inserts versions: overlaps are checked with the history
                    if history.is_none() && inserted_keys.insert(key.clone(), ()).is_some() {
                        return Err(refuse(format!(
                            "key ({}) is inserted twice",
                            describe(&key)
                        )));
                    }
                    inserts.push(values);
                }
            }
        }
    }
    let affected = (updates.len() + deletes.len() + inserts.len()) as u64;

    // 3. as tables: U (key, per value column: assigned?, value), D (key), I (rows)
    let key_fields: Vec<Field> = identity
        .iter()
        .enumerate()
        .map(|(n, &i)| Field::new(format!("__k{n}"), user.field(i).data_type().clone(), true))
        .collect();
    let key_names: Vec<String> = key_fields.iter().map(|f| f.name().clone()).collect();
    // (a value of the source's type, as the column's: one it cannot hold
    // fails the statement naming it)
    let column_of = |scalars: Vec<ScalarValue>, field: &Field| -> Result<Arc<dyn Array>> {
        let data_type = field.data_type();
        let casted = scalars
            .into_iter()
            .map(|s| {
                fit_scalar(&s, data_type)?.ok_or_else(|| {
                    let column = field.name().strip_prefix("__v_").unwrap_or(field.name());
                    refuse(format!(
                        "column '{column}' has the value {s}, which its type {data_type} \
                         cannot hold"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if casted.is_empty() {
            return Ok(arrow::array::new_empty_array(data_type));
        }
        ScalarValue::iter_to_array(casted)
    };
    let table_of = |fields: Vec<Field>, columns: Vec<Arc<dyn Array>>| -> Result<LogicalPlan> {
        let schema = Arc::new(Schema::new(fields));
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
        LogicalPlanBuilder::scan(
            "__cdc_merge",
            provider_as_source(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?)),
            None,
        )?
        .build()
    };
    let keys_table = |rows: &[Vec<ScalarValue>]| -> Result<LogicalPlan> {
        let columns = key_fields
            .iter()
            .enumerate()
            .map(|(n, f)| column_of(rows.iter().map(|k| k[n].clone()).collect(), f))
            .collect::<Result<_>>()?;
        table_of(key_fields.clone(), columns)
    };
    let mut u_fields = key_fields.clone();
    let mut u_columns: Vec<Arc<dyn Array>> = key_fields
        .iter()
        .enumerate()
        .map(|(n, f)| column_of(updates.iter().map(|(k, _)| k[n].clone()).collect(), f))
        .collect::<Result<_>>()?;
    for (v, &i) in values.iter().enumerate() {
        let field = user.field(i);
        u_fields.push(Field::new(format!("__has{i}"), DataType::Boolean, false));
        let has: BooleanArray = updates
            .iter()
            .map(|(_, set)| Some(set[v].is_some()))
            .collect();
        u_columns.push(Arc::new(has));
        u_fields.push(Field::new(
            format!("__set{i}"),
            field.data_type().clone(),
            true,
        ));
        u_columns.push(column_of(
            updates
                .iter()
                .map(|(_, set)| set[v].clone().unwrap_or(ScalarValue::Null))
                .collect(),
            field,
        )?);
    }
    let updated_table = table_of(u_fields, u_columns)?;
    let deleted_table = keys_table(&deletes)?;
    let i_fields: Vec<Field> = user
        .fields()
        .iter()
        .map(|f| Field::new(format!("__v_{}", f.name()), f.data_type().clone(), true))
        .collect();
    let i_columns = i_fields
        .iter()
        .enumerate()
        .map(|(i, f)| column_of(inserts.iter().map(|r| r[i].clone()).collect(), f))
        .collect::<Result<_>>()?;
    let inserted_table = table_of(i_fields, i_columns)?;
    let inserted_keys_cols: Vec<String> = key_index
        .iter()
        .map(|&i| format!("__v_{}", user.field(i).name()))
        .collect();
    let counts = ((updates.len() + inserts.len()) as u64, deletes.len() as u64);
    let tables = Actions {
        updated: updated_table,
        deleted: deleted_table,
        inserted: inserted_table,
        key_names,
        inserted_keys_cols,
        values,
    };
    match history {
        Some(history) => {
            let plan = merge_versions(state, &history, &identity_names, tables).await?;
            counted(Some(plan), affected)
        }
        None => {
            // the statement changes the source's keys exactly (the usual
            // MERGE): their stored rows, found for the match, are those
            // it replaces
            let key_types: Vec<DataType> = key_index
                .iter()
                .map(|&i| user.field(i).data_type().clone())
                .collect();
            let changed = updates
                .iter()
                .map(|(k, _)| k)
                .chain(&deletes)
                .chain(inserted_keys.keys());
            let reuse = match probed {
                Some(probed) if probed.are(changed, &key_types)? => Some(probed.found),
                _ => None,
            };
            let statement = apply_scd1(
                state,
                Arc::clone(&table),
                keys,
                user,
                tables,
                counts,
                reuse,
                refuse,
                describe,
            )
            .await?;
            // (the clauses were matched above: the rows are ready)
            let prepare: Prepare = Arc::new(move |_| {
                let statement = statement.clone();
                Box::pin(async move { Ok(statement) })
            });
            statement_plan(
                table,
                state,
                "MERGE",
                (EditKind::Overwrite, Operation::Merge),
                None,
                prepare,
            )
        }
    }
}

/// Refuse what the clauses of `merge` cannot mean (`refuse` words it):
///
/// | in a clause                                   | why                                     |
/// |-----------------------------------------------|-----------------------------------------|
/// | a column assigned or inserted twice           | which value would it take               |
/// | a subquery (`IN (SELECT …)`, `EXISTS`, …)     | join it into the `USING` source instead |
/// | `WHEN NOT MATCHED` reading the target (`t.v`, or `v` the source lacks) | an unmatched row has no target row |
fn check_clauses(
    merge: &MergeStatement,
    refuse: &dyn Fn(String) -> DataFusionError,
    target_columns: &[String],
    source_columns: Option<&[String]>,
) -> Result<()> {
    let dialect = dialect_from_str(&merge.dialect).ok_or_else(|| {
        DataFusionError::Plan(format!("unsupported SQL dialect '{}'", merge.dialect))
    })?;
    let parse = |text: &str| -> Option<SqlExpr> {
        Parser::new(dialect.as_ref())
            .try_with_sql(text)
            .ok()?
            .parse_expr()
            .ok()
    };
    // (a name part as SQL reads it: folded unless quoted)
    let read = |ident: &Ident| match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_lowercase(),
    };
    let (alias, table) = (&merge.target_alias, &merge.target.table);
    for clause in &merge.clauses {
        let when = match clause.matched {
            true => "WHEN MATCHED",
            false => "WHEN NOT MATCHED",
        };
        let (columns, values): (Vec<&String>, Vec<&String>) = match &clause.action {
            MergeAction::Update(set) => set.iter().map(|(c, e)| (c, e)).unzip(),
            MergeAction::Insert { columns, values } => {
                (columns.iter().collect(), values.iter().collect())
            }
            MergeAction::Delete => (Vec::new(), Vec::new()),
        };
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = columns.iter().find(|c| !seen.insert(c.to_lowercase())) {
            return Err(refuse(format!("{when}: column '{twice}' is given twice")));
        }
        for text in values.into_iter().chain(clause.condition.as_ref()) {
            let Some(expr) = parse(text) else { continue };
            let mut subquery = false;
            let mut reads_target = None;
            let _ = datafusion::sql::sqlparser::ast::visit_expressions(&expr, |e| {
                match e {
                    SqlExpr::Subquery(_) | SqlExpr::InSubquery { .. } | SqlExpr::Exists { .. } => {
                        subquery = true
                    }
                    // `v`, a column of the target and not of the source
                    SqlExpr::Identifier(ident)
                        if target_columns.contains(&read(ident))
                            && source_columns.is_some_and(|s| !s.contains(&read(ident))) =>
                    {
                        reads_target.get_or_insert_with(|| e.to_string());
                    }
                    // `t.v`, `t.st.x`, `schema.table.v`
                    SqlExpr::CompoundIdentifier(parts)
                        if parts.len() >= 2
                            && (read(&parts[0]) == *alias
                                || (parts.len() == 3 && read(&parts[1]) == *table)) =>
                    {
                        reads_target.get_or_insert_with(|| e.to_string());
                    }
                    _ => {}
                }
                std::ops::ControlFlow::<()>::Continue(())
            });
            if subquery {
                return Err(refuse(format!(
                    "{when}: a subquery in '{text}' is not supported; join what it reads \
                     into the USING source"
                )));
            }
            if let (false, Some(column)) = (clause.matched, reads_target) {
                return Err(refuse(format!(
                    "WHEN NOT MATCHED: '{text}' reads the target's {column}, and an unmatched \
                     source row has no target row"
                )));
            }
        }
    }
    Ok(())
}

/// The character `dialect` quotes names with (`"`, or `` ` `` where a `"`
/// starts a string, as under `databricks`).
fn sql_dialect_quote(dialect: &str) -> Result<char> {
    let d = dialect_from_str(dialect)
        .ok_or_else(|| DataFusionError::Plan(format!("unsupported SQL dialect '{dialect}'")))?;
    Ok(['"', '`']
        .into_iter()
        .find(|c| d.is_delimited_identifier_start(*c))
        .unwrap_or('"'))
}

/// The source expressions `on` equates with each of `keys` of the target
/// (named `alias`): `alias.key = e` conjuncts where `e` does not name the
/// target. `None` unless every key has one.
fn key_equalities(on: &str, dialect: &str, alias: &str, keys: &[String]) -> Option<Vec<String>> {
    fn conjuncts(expr: SqlExpr, out: &mut Vec<SqlExpr>) {
        match expr {
            SqlExpr::BinaryOp {
                left,
                op: BinaryOperator::And,
                right,
            } => {
                conjuncts(*left, out);
                conjuncts(*right, out);
            }
            SqlExpr::Nested(inner) => conjuncts(*inner, out),
            other => out.push(other),
        }
    }
    let dialect = dialect_from_str(dialect)?;
    let expr = Parser::new(dialect.as_ref())
        .try_with_sql(on)
        .ok()?
        .parse_expr()
        .ok()?;
    let mut all = Vec::new();
    conjuncts(expr, &mut all);
    let target = format!("{}.", alias.to_lowercase());
    let mut found: Vec<Option<String>> = vec![None; keys.len()];
    for conjunct in all {
        let SqlExpr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } = conjunct
        else {
            continue;
        };
        for (side, other) in [(&left, &right), (&right, &left)] {
            let SqlExpr::CompoundIdentifier(parts) = side.as_ref() else {
                continue;
            };
            let [table, column] = parts.as_slice() else {
                continue;
            };
            let key = keys
                .iter()
                .position(|k| k.eq_ignore_ascii_case(&column.value));
            let names_target = other.to_string().to_lowercase().contains(&target);
            if let (true, Some(k), false) =
                (table.value.eq_ignore_ascii_case(alias), key, names_target)
            {
                found[k] = Some(other.to_string());
            }
        }
    }
    found.into_iter().collect()
}

/// The live rows (user columns) of the keys that the source of `merge`
/// can match, found by key: when its ON clause equates every key of the
/// target with the source ([`key_equalities`]) and the source's values are
/// at most the deletion-vector budget. `None` otherwise (and when the
/// source's values cannot be read as keys: the whole target is matched,
/// and reports what is wrong).
async fn source_key_rows(
    state: &SessionState,
    table: &ScdTable,
    merge: &MergeStatement,
    keys: &[String],
    user: &SchemaRef,
) -> Result<Option<(LogicalPlan, SourceKeys)>> {
    let Some(budget) = deletion_vector_budget(state, table).await? else {
        return Ok(None);
    };
    let Some(exprs) = key_equalities(&merge.on, &merge.dialect, &merge.target_alias, keys) else {
        return Ok(None);
    };
    let quote = sql_dialect_quote(&merge.dialect)?;
    let sql = format!(
        "SELECT DISTINCT {} FROM {} LIMIT {}",
        exprs
            .iter()
            .enumerate()
            .map(|(i, e)| format!("({e}) AS {}", Ident::with_quote(quote, format!("__k{i}"))))
            .collect::<Vec<_>>()
            .join(", "),
        merge.source,
        budget + 1
    );
    let sql = crate::sql::with_databricks_values_columns(&sql, &merge.dialect);
    let batches = match state.create_logical_plan(&sql).await {
        Ok(plan) => match state.create_physical_plan(&plan).await {
            Ok(physical) => collect(physical, state.task_ctx()).await.ok(),
            Err(_) => None,
        },
        Err(_) => None,
    };
    let Some(batches) = batches else {
        return Ok(None);
    };
    let count: usize = batches.iter().map(RecordBatch::num_rows).sum();
    if count == 0 || count > budget {
        return Ok(None);
    }
    // as the target's key columns
    let fields: Vec<Field> = keys
        .iter()
        .map(|k| Ok(user.field_with_name(k)?.clone().with_nullable(true)))
        .collect::<Result<_>>()?;
    let schema = Arc::new(Schema::new(fields));
    let mut typed = Vec::with_capacity(batches.len());
    for batch in &batches {
        let columns = batch
            .columns()
            .iter()
            .zip(schema.fields())
            .map(|(c, f)| arrow::compute::cast(c, f.data_type()))
            .collect::<std::result::Result<Vec<_>, _>>();
        match columns {
            Ok(columns) => typed.push(RecordBatch::try_new(Arc::clone(&schema), columns)?),
            Err(_) => return Ok(None),
        }
    }
    let mut source_keys = HashSet::with_capacity(count);
    for batch in &typed {
        for row in 0..batch.num_rows() {
            source_keys.insert(
                batch
                    .columns()
                    .iter()
                    .map(|c| ScalarValue::try_from_array(c, row))
                    .collect::<Result<Vec<_>>>()?,
            );
        }
    }
    let found = find_keys(table, state, typed).await?;
    let plan = found_scan(table, state, &found)?
        .filter(column(KIND_COL).eq(lit(Kind::Upsert as i8)))?
        .build()?;
    let found = SourceKeys {
        keys: source_keys,
        found: Arc::new(found),
    };
    Ok(Some((plan, found)))
}

/// The keys of a MERGE's source (as the target's key types) and their
/// stored rows, found to match the source against.
struct SourceKeys {
    keys: HashSet<Vec<ScalarValue>>,
    found: Arc<Superseded>,
}

impl SourceKeys {
    /// Whether `keys` (the keys a statement changes, of `types`) are these
    /// keys, every one.
    fn are<'a>(
        &self,
        keys: impl Iterator<Item = &'a Vec<ScalarValue>>,
        types: &[DataType],
    ) -> Result<bool> {
        let mut seen = HashSet::with_capacity(self.keys.len());
        for key in keys {
            let typed = key
                .iter()
                .zip(types)
                .map(|(v, t)| v.cast_to(t))
                .collect::<Result<Vec<_>>>()?;
            if !self.keys.contains(&typed) {
                return Ok(false);
            }
            seen.insert(typed);
        }
        Ok(seen.len() == self.keys.len())
    }
}

/// `plan` (a MERGE's match) with its scan of `table` replaced by `rows`
/// (stored rows of the target, read as the scan's columns).
fn with_target_rows(plan: LogicalPlan, table: &ScdTable, rows: LogicalPlan) -> Result<LogicalPlan> {
    let target = TableReference::partial(table.name().schema.as_str(), table.name().table.as_str());
    plan.transform_up(|node| match node {
        LogicalPlan::TableScan(scan) if scan.table_name == target => {
            let columns = scan
                .projected_schema
                .fields()
                .iter()
                .map(|f| cast(column(f.name()), f.data_type().clone()).alias(f.name()))
                .collect::<Vec<_>>();
            let replaced = LogicalPlanBuilder::from(rows.clone())
                .project(columns)?
                .alias(scan.table_name.clone())?
                .build()?;
            Ok(Transformed::yes(replaced))
        }
        other => Ok(Transformed::yes(other.recompute_schema()?)),
    })
    .map(|t| t.data)
}

/// The stored rows (live rows and tombstones) of the keys `affected` (its
/// columns `key_names`, the table's `keys`) when there are at most `budget`
/// of them, found by key and read: what they are found as, and the rows.
async fn found_rows(
    state: &SessionState,
    table: &ScdTable,
    affected: &LogicalPlan,
    keys: &[String],
    key_names: &[String],
    budget: usize,
) -> Result<Option<(Arc<Superseded>, InsertedRows)>> {
    let plan = LogicalPlanBuilder::from(affected.clone())
        .project(
            key_names
                .iter()
                .zip(keys)
                .map(|(n, k)| column(n).alias(k))
                .collect::<Vec<_>>(),
        )?
        .distinct()?
        .limit(0, Some(budget + 1))?
        .build()?;
    let batches = collect(state.create_physical_plan(&plan).await?, state.task_ctx()).await?;
    let count: usize = batches.iter().map(RecordBatch::num_rows).sum();
    if count == 0 || count > budget {
        return Ok(None);
    }
    let found = find_keys(table, state, batches).await?;
    let rows = read_found(table, state, &found).await?;
    Ok(Some((Arc::new(found), rows)))
}

/// A MERGE's actions as tables: updated target rows (identity, and per
/// value column `__has{i}` / `__set{i}`), deleted ones (identity), inserted
/// rows (`__v_<column>`).
struct Actions {
    updated: LogicalPlan,
    deleted: LogicalPlan,
    inserted: LogicalPlan,
    /// Identity columns of `updated` / `deleted` (`__k{n}`).
    key_names: Vec<String>,
    /// Key columns of `inserted`.
    inserted_keys_cols: Vec<String>,
    /// Value (non-key) columns, by position.
    values: Vec<usize>,
}

/// SCD 2: the versions of the touched keys, updated, deleted (dropped) and
/// inserted, become the keys' histories.
async fn merge_versions(
    state: &SessionState,
    history: &History,
    identity: &[String],
    actions: Actions,
) -> Result<Arc<dyn ExecutionPlan>> {
    let Actions {
        updated,
        deleted,
        inserted,
        key_names,
        inserted_keys_cols,
        values,
    } = actions;
    let columns = history.version_columns();
    let key_count = history.keys.len();
    let keys_of = |plan: &LogicalPlan, names: &[String]| -> Result<LogicalPlanBuilder> {
        LogicalPlanBuilder::from(plan.clone()).project(
            names[..key_count]
                .iter()
                .zip(&history.keys)
                .map(|(n, k)| column(n).alias(k))
                .collect::<Vec<_>>(),
        )
    };
    let touched = history.keys_of(
        keys_of(&updated, &key_names)?
            .union(keys_of(&deleted, &key_names)?.build()?)?
            .union(keys_of(&inserted, &inserted_keys_cols)?.build()?)?,
    )?;
    let identity_of = |prefix: &str| -> Vec<String> {
        (0..identity.len())
            .map(|n| format!("{prefix}{n}"))
            .collect()
    };
    let deleted = LogicalPlanBuilder::from(deleted)
        .project(
            key_names
                .iter()
                .zip(identity_of("__d"))
                .map(|(k, d)| column(k).alias(d))
                .chain([lit(true).alias("__deleted")])
                .collect::<Vec<_>>(),
        )?
        .build()?;
    let mut edited: Vec<Expr> = Vec::with_capacity(columns.len() + 1);
    for (i, c) in columns.iter().enumerate() {
        edited.push(if values.contains(&i) {
            when(
                column(&format!("__has{i}")).is_true(),
                column(&format!("__set{i}")),
            )
            .otherwise(column(c))?
            .alias(c)
        } else {
            column(c)
        });
    }
    edited.push(coalesce(vec![column("__deleted"), lit(false)]).alias(DROP_COL));
    let edited = history
        .versions_of(touched)?
        .join(
            updated,
            JoinType::Left,
            (unqualified(identity), unqualified(&key_names)),
            None,
        )?
        .join(
            deleted,
            JoinType::Left,
            (unqualified(identity), unqualified(&identity_of("__d"))),
            None,
        )?
        .project(edited)?;
    let new_versions = LogicalPlanBuilder::from(inserted).project(
        columns
            .iter()
            .map(|c| column(&format!("__v_{c}")).alias(c))
            .chain([lit(false).alias(DROP_COL)])
            .collect::<Vec<_>>(),
    )?;
    let edited = edited.union(new_versions.build()?)?.build()?;
    history.replace(state, edited, Operation::Merge).await
}

/// Whether two values of one column are the same as `IS NOT DISTINCT
/// FROM` sees them (an `UPDATE` judges so): floats by value, `0.0` and
/// `-0.0` alike, NaN like NaN; others as equal scalars.
fn same_value(a: &ScalarValue, b: &ScalarValue) -> bool {
    let float = |v: &ScalarValue| match v {
        ScalarValue::Float16(Some(f)) => Some(f64::from(*f)),
        ScalarValue::Float32(Some(f)) => Some(f64::from(*f)),
        ScalarValue::Float64(Some(f)) => Some(*f),
        _ => None,
    };
    match (float(a), float(b)) {
        (Some(x), Some(y)) => x == y || (x.is_nan() && y.is_nan()),
        _ => a == b,
    }
}

/// The sequence groups of `table` (per-column sequencing): each group's
/// state column and its members (positions in `user`); none without.
fn assigned_groups(table: &ScdTable, user: &SchemaRef) -> Result<Vec<(String, Vec<usize>)>> {
    let Some(declared) =
        sequence_groups::declared(&table.name().to_string(), &table.meta().properties)?
    else {
        return Ok(Vec::new());
    };
    let flow = keyed_flow(table, "MERGE")?;
    let keys = key_positions(table, &flow)?;
    let names: Vec<String> = user.fields().iter().map(|f| f.name().clone()).collect();
    Ok(
        sequence_groups::resolve(&flow.name, &declared, &names, &keys)?
            .into_iter()
            .map(|g| (g.state_column(), g.members))
            .collect(),
    )
}

/// SCD 1: the table rewritten with the actions applied (live keys checked).
#[allow(clippy::too_many_arguments)]
async fn apply_scd1(
    state: &SessionState,
    table: Arc<ScdTable>,
    keys: Vec<String>,
    user: SchemaRef,
    actions: Actions,
    (upserted, deleted): (u64, u64),
    probed: Option<Arc<Superseded>>,
    refuse: impl Fn(String) -> DataFusionError,
    describe: impl Fn(&[ScalarValue]) -> String,
) -> Result<Statement> {
    let Actions {
        updated: updated_table,
        deleted: deleted_table,
        inserted: inserted_table,
        key_names,
        inserted_keys_cols,
        values,
    } = actions;

    let affected_keys = LogicalPlanBuilder::from(deleted_table.clone())
        .union(
            LogicalPlanBuilder::from(updated_table.clone())
                .project(key_names.iter().map(|k| column(k)).collect::<Vec<_>>())?
                .build()?,
        )?
        .union(
            LogicalPlanBuilder::from(inserted_table.clone())
                .project(
                    inserted_keys_cols
                        .iter()
                        .zip(&key_names)
                        .map(|(c, k)| column(c).alias(k))
                        .collect::<Vec<_>>(),
                )?
                .build()?,
        )?
        .build()?;
    // the stored rows of the statement's keys: when they are few, found by
    // key (read by position, retired with deletion vectors), or found
    // already (`probed`); else the table
    let found = match (probed, deletion_vector_budget(state, &table).await?) {
        (Some(found), _) => {
            let rows = read_found(&table, state, &found).await?;
            Some((found, rows))
        }
        (None, Some(budget)) => {
            found_rows(state, &table, &affected_keys, &keys, &key_names, budget).await?
        }
        (None, None) => None,
    };
    let stored = || -> Result<LogicalPlanBuilder> {
        match &found {
            Some((_, rows)) => rows.scan(),
            None => raw_plan(&table),
        }
    };

    // 4. inserted keys must not be live
    let live = || -> Result<LogicalPlanBuilder> {
        stored()?.filter(column(KIND_COL).eq(lit(Kind::Upsert as i8)))
    };
    let clash = LogicalPlanBuilder::from(inserted_table.clone())
        .join(
            live()?.build()?,
            JoinType::LeftSemi,
            (unqualified(&inserted_keys_cols), unqualified(&keys)),
            None,
        )?
        .limit(0, Some(1))?
        .build()?;
    let clash = collect(state.create_physical_plan(&clash).await?, state.task_ctx()).await?;
    if let Some(batch) = clash.iter().find(|b| b.num_rows() > 0) {
        let key: Vec<ScalarValue> = inserted_keys_cols
            .iter()
            .map(|c| ScalarValue::try_from_array(batch.column(batch.schema().index_of(c)?), 0))
            .collect::<Result<_>>()?;
        return Err(refuse(format!(
            "key ({}) inserted by WHEN NOT MATCHED is live",
            describe(&key)
        )));
    }

    // 5. the new state and its change feed
    let columns = file_columns(&table);
    // per-column sequencing: a group an update assigns counts as written
    // at the row's sequence (as `UPDATE` makes it)
    let groups = assigned_groups(&table, &user)?;
    let new = NewRows::new(&table, state, refuse)?;
    let now = new.now.clone();
    let all = || columns.iter().map(|c| column(c)).collect::<Vec<_>>();
    let kept = raw_plan(&table)?
        .join(
            affected_keys,
            JoinType::LeftAnti,
            (unqualified(&keys), unqualified(&key_names)),
            None,
        )?
        .project(all())?
        .build()?;
    let updated_rows = |kind: i8| -> Result<LogicalPlan> {
        let projection = columns
            .iter()
            .map(|c| {
                let value = match user.fields().iter().position(|f| f.name() == c) {
                    Some(i) if values.contains(&i) => {
                        when(column(&format!("__has{i}")), column(&format!("__set{i}")))
                            .otherwise(column(c))?
                    }
                    _ if c == KIND_COL => lit(kind),
                    _ => match groups.iter().find(|(state, _)| state == c) {
                        Some((_, members)) => members
                            .iter()
                            .filter(|&&m| values.contains(&m))
                            .map(|m| column(&format!("__has{m}")))
                            .reduce(Expr::or)
                            .map(|assigned| when(assigned, column(SEQ_COL)).otherwise(column(c)))
                            .transpose()?
                            .unwrap_or_else(|| column(c)),
                        None => column(c),
                    },
                };
                Ok(value.alias(c))
            })
            .collect::<Result<Vec<_>>>()?;
        live()?
            .join(
                updated_table.clone(),
                JoinType::Inner,
                (unqualified(&keys), unqualified(&key_names)),
                None,
            )?
            .project(projection)?
            .build()
    };
    let old_rows = |target: &LogicalPlan, kind: i8, written: bool| -> Result<LogicalPlan> {
        let projection = columns
            .iter()
            .map(|c| match c.as_str() {
                KIND_COL => lit(kind).alias(c),
                WRITTEN_AT_COL if written => lit(now.clone()).alias(c),
                _ => column(c),
            })
            .collect::<Vec<_>>();
        live()?
            .join(
                target.clone(),
                JoinType::LeftSemi,
                (unqualified(&keys), unqualified(&key_names)),
                None,
            )?
            .project(projection)?
            .build()
    };
    let tombstones = stored()?
        .filter(column(KIND_COL).eq(lit(Kind::Delete as i8)))?
        .project(
            keys.iter()
                .zip(&key_names)
                .map(|(k, n)| column(k).alias(format!("__t{n}")))
                .chain([column(SEQ_COL).alias("__tomb_seq")])
                .collect::<Vec<_>>(),
        )?
        .build()?;
    let inserted_rows = |kind: i8| -> Result<LogicalPlan> {
        let projection = new.projection(kind, col("__tomb_seq"), |c| {
            user.field_with_name(c)
                .is_ok()
                .then(|| column(&format!("__v_{c}")))
        });
        LogicalPlanBuilder::from(inserted_table.clone())
            .join(
                tombstones.clone(),
                JoinType::Left,
                (
                    unqualified(&inserted_keys_cols),
                    unqualified(
                        &key_names
                            .iter()
                            .map(|n| format!("__t{n}"))
                            .collect::<Vec<_>>(),
                    ),
                ),
                None,
            )?
            .project(projection)?
            .build()
    };
    let changed = LogicalPlanBuilder::from(updated_rows(Kind::Upsert as i8)?)
        .union(old_rows(&deleted_table, Kind::Delete as i8, true)?)?
        .union(inserted_rows(Kind::Upsert as i8)?)?
        .union(old_rows(&updated_table, CHANGE_PREIMAGE, false)?)?
        .union(updated_rows(CHANGE_POSTIMAGE)?)?
        .union(old_rows(&deleted_table, CHANGE_DELETE, false)?)?
        .union(inserted_rows(CHANGE_INSERT)?)?
        .build()?;
    let rows = StatementRows { changed, kept };
    let replacing = match found {
        Some((found, _)) => Replacing::Found(found),
        None => deletion_vector_budget(state, &table)
            .await?
            .map_or(Replacing::Rewrite, Replacing::UpTo),
    };
    Ok(Statement {
        rows,
        replacing,
        upserted,
        deleted,
    })
}

#[cfg(test)]
mod tests {
    use super::key_equalities;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn on_clauses_that_equate_every_key_with_the_source() {
        let eq = |on: &str, k: &[&str]| key_equalities(on, "generic", "t", &keys(k));
        assert_eq!(eq("t.id = s.id", &["id"]), Some(vec!["s.id".to_string()]));
        assert_eq!(
            eq("s.id + 1 = T.ID", &["id"]),
            Some(vec!["s.id + 1".to_string()])
        );
        assert_eq!(
            eq("(t.a = s.x AND s.flag) AND t.b = s.y", &["a", "b"]),
            Some(vec!["s.x".to_string(), "s.y".to_string()])
        );
        // a key not equated, a disjunction, an equation with the target
        assert_eq!(eq("t.a = s.x", &["a", "b"]), None);
        assert_eq!(eq("t.id = s.id OR t.id = s.other", &["id"]), None);
        assert_eq!(eq("t.id = t.other", &["id"]), None);
        assert_eq!(eq("t.v = s.v", &["id"]), None);
        assert_eq!(eq("not sql (", &["id"]), None);
    }
}
