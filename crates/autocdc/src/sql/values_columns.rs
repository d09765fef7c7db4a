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
//! | any other dialect, or no `VALUES`    | as written                                  |

use std::borrow::Cow;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Ident, SetExpr, TableAlias, TableAliasColumnDef, TableFactor, VisitMut, VisitorMut,
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
    let mut naming = Naming { named: false };
    let _ = statements.visit(&mut naming);
    if !naming.named {
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

/// Names the columns of `VALUES` lists (see the module docs).
struct Naming {
    named: bool,
}

impl VisitorMut for Naming {
    type Break = ();

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
        let Some(width) = values.rows.first().map(|row| row.content.len()) else {
            return ControlFlow::Continue(());
        };
        if alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
            return ControlFlow::Continue(());
        }
        let alias = alias.get_or_insert_with(|| TableAlias {
            explicit: true,
            name: Ident::new("__values"),
            columns: Vec::new(),
            at: None,
        });
        alias.columns = (1..=width)
            .map(|i| TableAliasColumnDef::from_name(format!("col{i}")))
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
