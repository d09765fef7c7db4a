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
    // a statement that is a VALUES list: its rows under Databricks' names
    if let [Statement::Query(query)] = statements.as_slice() {
        if let (SetExpr::Values(values), None) = (query.body.as_ref(), &query.with) {
            return Cow::Owned(format!(
                "SELECT * FROM ({query}) AS __values ({})",
                databricks_names(values).join(", ")
            ));
        }
    }
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
    let mut naming = Naming { named: false };
    let _ = statement.visit(&mut naming);
    naming.named
}

/// `col1`, `col2`, … for each column of `values`.
fn databricks_names(values: &Values) -> Vec<String> {
    let width = values.rows.first().map_or(0, |row| row.content.len());
    (1..=width).map(|i| format!("col{i}")).collect()
}

/// Names the columns of `VALUES` lists (see the module docs).
struct Naming {
    named: bool,
}

impl VisitorMut for Naming {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        let Some(with) = &mut query.with else {
            return ControlFlow::Continue(());
        };
        for cte in &mut with.cte_tables {
            if let SetExpr::Values(values) = cte.query.body.as_ref() {
                if cte.alias.columns.is_empty() {
                    cte.alias.columns = databricks_names(values)
                        .into_iter()
                        .map(TableAliasColumnDef::from_name)
                        .collect();
                    self.named = true;
                }
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
        let SetExpr::Values(values) = subquery.body.as_ref() else {
            return ControlFlow::Continue(());
        };
        if values.rows.is_empty() || alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
            return ControlFlow::Continue(());
        }
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
        // columns named by the query, another dialect, no VALUES: as written
        for (sql, dialect) in [
            ("SELECT * FROM (VALUES (1)) AS v(a)", "databricks"),
            (sql, "generic"),
            ("SELECT 1", "databricks"),
        ] {
            assert_eq!(with_databricks_values_columns(sql, dialect), sql);
        }
    }
}
