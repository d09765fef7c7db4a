//! `VALUES` columns named as Databricks names them.
//!
//! DataFusion names the columns of a `VALUES` list `column1`, `column2`, …;
//! Databricks names them `col1`, `col2`, … and the documentation's
//! examples read them so (`SELECT col1 AS userId … FROM (VALUES …)`). Under
//! the `databricks` dialect, [`with_databricks_values_columns`] gives each
//! `(VALUES …)` in `FROM` without column names its Databricks names:
//!
//! | written (databricks dialect)         | planned as                                  |
//! |--------------------------------------|---------------------------------------------|
//! | `FROM (VALUES (1, 'a'))`             | `FROM (VALUES (1, 'a')) AS __values(col1, col2)` |
//! | `FROM (VALUES (1, 'a')) AS v`        | `FROM (VALUES (1, 'a')) AS v(col1, col2)`   |
//! | `FROM (VALUES (1, 'a')) AS v(a, b)`  | as written                                  |
//! | `WITH v AS (VALUES (1, 'a'))`        | `WITH v (col1, col2) AS (VALUES (1, 'a'))`  |
//! | a statement `VALUES (1, 'a')`        | `SELECT * FROM (VALUES (1, 'a')) AS __values(col1, col2)` |
//! | `CREATE TABLE t AS VALUES …`, `CREATE VIEW v AS VALUES …` | their `VALUES` so |
//! | `VALUES (1) UNION ALL VALUES (2)` (a query, in `FROM`, in `WITH`, under `CREATE … AS`) | its first `VALUES` so (a set operation takes its first part's names) |
//! | `INSERT INTO t VALUES …`             | as written (the target names the columns)  |
//! | any other dialect, or no `VALUES`    | as written                                  |
//!
//! The statements DataFusion plans (through [`with_databricks_values_columns`])
//! and the queries of flows (through [`name_values_columns`]) alike.

use std::borrow::Cow;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Ident, Query, SetExpr, Statement, TableAlias, TableAliasColumnDef, TableFactor, Values,
    VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use datafusion::sql::sqlparser::parser::Parser;

/// `sql` (in `dialect`) with Databricks' names for the columns of its
/// `VALUES` lists in `FROM` (see the module docs); as written otherwise,
/// and when it does not parse (the planner reports that).
pub fn with_databricks_values_columns<'a>(sql: &'a str, dialect: &str) -> Cow<'a, str> {
    let mentions_values = sql
        .as_bytes()
        .windows(6)
        .any(|w| w.eq_ignore_ascii_case(b"values"));
    if !dialect.eq_ignore_ascii_case("databricks") || !mentions_values {
        return Cow::Borrowed(sql);
    }
    let Some(parser_dialect) = dialect_from_str(dialect) else {
        return Cow::Borrowed(sql);
    };
    let Ok(mut statements) = Parser::parse_sql(parser_dialect.as_ref(), sql) else {
        return Cow::Borrowed(sql);
    };
    let mut named = false;
    for statement in &mut statements {
        named |= name_values_columns(statement, dialect);
    }
    if !named {
        return Cow::Borrowed(sql);
    }
    Cow::Owned(
        statements
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(";\n"),
    )
}

/// `statement` (in `dialect`) with Databricks' names for the columns of
/// its `VALUES` lists in `FROM` and `WITH` (see the module docs); whether
/// it named any. Under another dialect it is left as it is.
pub fn name_values_columns(statement: &mut Statement, dialect: &str) -> bool {
    if !dialect.eq_ignore_ascii_case("databricks") {
        return false;
    }
    let mut naming = Naming {
        named: false,
        dialect,
    };
    naming.named |= name_statement_values(statement, dialect);
    let _ = statement.visit(&mut naming);
    naming.named
}

/// A query that is a VALUES list or a set operation of them, or the query of
/// `CREATE … AS`, or the statement `EXPLAIN` explains: its first VALUES list
/// under Databricks' names; whether it had one.
fn name_statement_values(statement: &mut Statement, dialect: &str) -> bool {
    match statement {
        Statement::Query(query) => name_first_values(&mut query.body, dialect),
        Statement::CreateTable(create) => create
            .query
            .as_mut()
            .is_some_and(|query| name_first_values(&mut query.body, dialect)),
        Statement::CreateView(create) => name_first_values(&mut create.query.body, dialect),
        Statement::Explain { statement, .. } => name_statement_values(statement, dialect),
        _ => false,
    }
}

/// Whether `query` orders, limits or fetches its rows: a VALUES body it has
/// is named inside it (its `ORDER BY col1` reads the names), not by an alias
/// outside.
fn shapes_rows(query: &Query) -> bool {
    query.order_by.is_some() || query.limit_clause.is_some() || query.fetch.is_some()
}

/// `body` with its first `VALUES` list — itself, or the first part of a set
/// operation, nested — read under Databricks' names (`SELECT * FROM
/// (VALUES …) AS __values (col1, …)`); whether it had one.
fn name_first_values(body: &mut SetExpr, dialect: &str) -> bool {
    match body {
        SetExpr::Values(values) if !values.rows.is_empty() => {
            let sql = format!(
                "SELECT * FROM ({values}) AS __values ({})",
                databricks_names(values).join(", ")
            );
            let Some(parser_dialect) = dialect_from_str(dialect) else {
                return false;
            };
            match Parser::parse_sql(parser_dialect.as_ref(), &sql).as_deref() {
                Ok([Statement::Query(query)]) => {
                    *body = query.body.as_ref().clone();
                    true
                }
                _ => false,
            }
        }
        SetExpr::SetOperation { left, .. } => name_first_values(left, dialect),
        SetExpr::Query(query) => name_first_values(&mut query.body, dialect),
        _ => false,
    }
}

/// `col1`, `col2`, … for each column of `values`.
fn databricks_names(values: &Values) -> Vec<String> {
    let width = values.rows.first().map_or(0, |row| row.content.len());
    (1..=width).map(|i| format!("col{i}")).collect()
}

/// Names the columns of `VALUES` lists (see the module docs).
struct Naming<'a> {
    named: bool,
    dialect: &'a str,
}

impl VisitorMut for Naming<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        let Some(with) = &mut query.with else {
            return ControlFlow::Continue(());
        };
        for cte in &mut with.cte_tables {
            // (named inside even under a column list, which renames them)
            if shapes_rows(&cte.query) {
                self.named |= name_first_values(&mut cte.query.body, self.dialect);
                continue;
            }
            if !cte.alias.columns.is_empty() {
                continue;
            }
            match cte.query.body.as_mut() {
                SetExpr::Values(values) => {
                    cte.alias.columns = databricks_names(values)
                        .into_iter()
                        .map(TableAliasColumnDef::from_name)
                        .collect();
                    self.named = true;
                }
                body => self.named |= name_first_values(body, self.dialect),
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Derived {
            subquery, alias, ..
        } = factor
        else {
            return ControlFlow::Continue(());
        };
        // (named inside even under a column list, which renames them)
        if shapes_rows(subquery) {
            self.named |= name_first_values(&mut subquery.body, self.dialect);
            return ControlFlow::Continue(());
        }
        if alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
            return ControlFlow::Continue(());
        }
        let values = match subquery.body.as_mut() {
            SetExpr::Values(values) if !values.rows.is_empty() => values,
            SetExpr::Values(_) => return ControlFlow::Continue(()),
            body => {
                self.named |= name_first_values(body, self.dialect);
                return ControlFlow::Continue(());
            }
        };
        let names = databricks_names(values);
        let alias = alias.get_or_insert_with(|| TableAlias {
            explicit: true,
            name: Ident::new("__values"),
            columns: Vec::new(),
            at: None,
        });
        alias.columns = names
            .into_iter()
            .map(TableAliasColumnDef::from_name)
            .collect();
        self.named = true;
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::with_databricks_values_columns;

    #[test]
    fn values_lists_take_databricks_column_names_under_its_dialect() {
        let sql = "SELECT col1 AS id, col2 AS v FROM (VALUES (1, 'a'), (2, 'b'))";
        let named = with_databricks_values_columns(sql, "databricks");
        assert!(
            named.contains("(VALUES (1, 'a'), (2, 'b')) AS __values (col1, col2)"),
            "{named}"
        );
        let aliased = with_databricks_values_columns("SELECT * FROM (VALUES (1)) v", "databricks");
        assert!(aliased.contains("v (col1)"), "{aliased}");
        let cte = with_databricks_values_columns(
            "WITH v AS (VALUES (1, 2)) SELECT col2 FROM v",
            "databricks",
        );
        assert!(cte.contains("v (col1, col2) AS"), "{cte}");
        let bare = with_databricks_values_columns("VALUES (1, 'a')", "databricks");
        assert_eq!(
            bare,
            "SELECT * FROM (VALUES (1, 'a')) AS __values (col1, col2)"
        );
        for (sql, written) in [
            (
                "CREATE TABLE t AS VALUES (1, 2)",
                "CREATE TABLE t AS SELECT * FROM (VALUES (1, 2)) AS __values (col1, col2)",
            ),
            (
                "CREATE VIEW w AS VALUES (1)",
                "CREATE VIEW w AS SELECT * FROM (VALUES (1)) AS __values (col1)",
            ),
            (
                "VALUES (1) UNION ALL VALUES (2)",
                "SELECT * FROM (VALUES (1)) AS __values (col1) UNION ALL VALUES (2)",
            ),
            (
                "SELECT col1 FROM (VALUES (1) UNION ALL VALUES (2))",
                "SELECT col1 FROM (SELECT * FROM (VALUES (1)) AS __values (col1) UNION ALL VALUES (2))",
            ),
        ] {
            assert_eq!(with_databricks_values_columns(sql, "databricks"), written);
        }
        // inside a CTE, a derived table or EXPLAIN too
        for (sql, written) in [
            (
                "WITH w AS (VALUES (2), (1) ORDER BY col1 LIMIT 1) SELECT * FROM w",
                "WITH w AS (SELECT * FROM (VALUES (2), (1)) AS __values (col1) ORDER BY col1 LIMIT 1) SELECT * FROM w",
            ),
            (
                "SELECT * FROM (VALUES (2), (1) ORDER BY col1)",
                "SELECT * FROM (SELECT * FROM (VALUES (2), (1)) AS __values (col1) ORDER BY col1)",
            ),
            (
                "EXPLAIN VALUES (2), (1) ORDER BY col1",
                "EXPLAIN SELECT * FROM (VALUES (2), (1)) AS __values (col1) ORDER BY col1",
            ),
        ] {
            assert_eq!(with_databricks_values_columns(sql, "databricks"), written);
        }
        // a VALUES statement's ORDER BY and LIMIT stay on it, over the names
        assert_eq!(
            with_databricks_values_columns("VALUES (2), (1) ORDER BY col1 LIMIT 1", "databricks"),
            "SELECT * FROM (VALUES (2), (1)) AS __values (col1) ORDER BY col1 LIMIT 1"
        );
        // an INSERT's rows, columns named by the query, another dialect, no
        // VALUES: as written
        let insert = "INSERT INTO t VALUES (1, 2)";
        assert_eq!(with_databricks_values_columns(insert, "databricks"), insert);
        for (sql, dialect) in [
            ("SELECT * FROM (VALUES (1)) AS v(a)", "databricks"),
            (sql, "generic"),
            ("SELECT 1", "databricks"),
        ] {
            assert_eq!(with_databricks_values_columns(sql, dialect), sql);
        }
    }
}
