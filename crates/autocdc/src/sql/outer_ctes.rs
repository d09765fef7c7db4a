//! The common table expressions a query relation's query sees.
//!
//! An `AUTO CDC (query)` or `SNAPSHOTS (query)` relation's query is planned
//! on its own (under a name of its own, see
//! [`super::replace_auto_cdc_relations`]), so the `WITH` clause of the
//! statement around it would be out of its sight; SQL scoping makes it
//! visible, as to any subquery in `FROM`. The relation's query is therefore
//! given the statement's top-level CTEs, before its own:
//!
//! | outer CTE                                           | given |
//! |-----------------------------------------------------|-------|
//! | named like one of the relation query's own CTEs     | no (the inner one shadows it) |
//! | reading a relation not planned yet (a placeholder)  | no    |
//! | any other                                           | yes   |

use datafusion::common::{DataFusionError, Result};
use datafusion::sql::sqlparser::ast::{Cte, Query, Statement, With};
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use datafusion::sql::sqlparser::parser::Parser;

/// `query` (a relation's query, in `dialect`) with the top-level CTEs of
/// the statement `outer` it appears in, but those reading a relation
/// placeholder (`placeholder_prefix…`) that is not in `planned`; `query`
/// unchanged when there are none.
pub fn with_outer_ctes(
    outer: &str,
    query: &str,
    dialect: &str,
    placeholder_prefix: &str,
    planned: &[String],
) -> Result<String> {
    let d = dialect_from_str(dialect)
        .ok_or_else(|| DataFusionError::Plan(format!("unsupported SQL dialect '{dialect}'")))?;
    // (a statement we cannot read whole is DataFusion's to report)
    let Ok(statements) = Parser::new(d.as_ref())
        .try_with_sql(outer)
        .and_then(|mut p| p.parse_statements())
    else {
        return Ok(query.to_string());
    };
    let Some(with) = statements.first().and_then(statement_with) else {
        return Ok(query.to_string());
    };
    let mut inner: Query = Parser::new(d.as_ref())
        .try_with_sql(query)
        .and_then(|mut p| p.parse_query())
        .map(|q| *q)
        .map_err(|e| DataFusionError::SQL(Box::new(e), None))?;
    let own: Vec<String> = inner
        .with
        .iter()
        .flat_map(|w| {
            w.cte_tables
                .iter()
                .map(|c| c.alias.name.value.to_lowercase())
        })
        .collect();
    let given: Vec<Cte> = with
        .cte_tables
        .iter()
        .filter(|cte| !own.contains(&cte.alias.name.value.to_lowercase()))
        .filter(|cte| reads_only_planned(&cte.to_string(), placeholder_prefix, planned))
        .cloned()
        .collect();
    if given.is_empty() {
        return Ok(query.to_string());
    }
    inner.with = Some(match inner.with.take() {
        Some(mut own) => {
            own.recursive |= with.recursive;
            own.cte_tables.splice(0..0, given);
            own
        }
        None => With {
            cte_tables: given,
            ..with.clone()
        },
    });
    Ok(inner.to_string())
}

/// The texts of the top-level CTEs of the statement `outer` (none when it
/// cannot be parsed).
pub fn outer_ctes(outer: &str, dialect: &str) -> Vec<String> {
    let Some(d) = dialect_from_str(dialect) else {
        return Vec::new();
    };
    let Ok(statements) = Parser::new(d.as_ref())
        .try_with_sql(outer)
        .and_then(|mut p| p.parse_statements())
    else {
        return Vec::new();
    };
    statements
        .first()
        .and_then(statement_with)
        .map(|with| with.cte_tables.iter().map(Cte::to_string).collect())
        .unwrap_or_default()
}

/// The top-level `WITH` clause of a statement's query, if it has one.
fn statement_with(statement: &Statement) -> Option<&With> {
    let query = match statement {
        Statement::Query(query) => query,
        Statement::Insert(insert) => insert.source.as_ref()?,
        Statement::CreateView(view) => &view.query,
        Statement::CreateTable(create) => create.query.as_ref()?,
        _ => return None,
    };
    query.with.as_ref()
}

/// Whether every relation placeholder (`prefix…`) `text` names is in
/// `planned`.
pub fn reads_only_planned(text: &str, prefix: &str, planned: &[String]) -> bool {
    text.match_indices(prefix).all(|(at, _)| {
        let name: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        planned.contains(&name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(outer: &str, query: &str, planned: &[&str]) -> String {
        let planned: Vec<String> = planned.iter().map(|p| p.to_string()).collect();
        with_outer_ctes(outer, query, "generic", "__rel_", &planned).unwrap()
    }

    #[test]
    fn the_outer_ctes_come_first() {
        assert_eq!(
            given(
                "WITH src AS (SELECT * FROM src WHERE id = 1) SELECT * FROM __rel_1",
                "SELECT * FROM src",
                &[],
            ),
            "WITH src AS (SELECT * FROM src WHERE id = 1) SELECT * FROM src"
        );
        assert_eq!(
            given(
                "WITH a AS (SELECT 1), b AS (SELECT 2) SELECT * FROM __rel_1",
                "WITH c AS (SELECT 3), b AS (SELECT 4) SELECT * FROM a, b, c",
                &[],
            ),
            "WITH a AS (SELECT 1), c AS (SELECT 3), b AS (SELECT 4) SELECT * FROM a, b, c"
        );
    }

    #[test]
    fn no_outer_ctes_no_change() {
        assert_eq!(
            given("SELECT * FROM __rel_1", "SELECT * FROM src", &[]),
            "SELECT * FROM src"
        );
        assert_eq!(
            given(
                "INSERT INTO t SELECT * FROM __rel_1",
                "SELECT * FROM src",
                &[]
            ),
            "SELECT * FROM src"
        );
    }

    #[test]
    fn ctes_reading_relations_not_planned_are_left_out() {
        let outer = "WITH a AS (SELECT * FROM __rel_2), b AS (SELECT 1) SELECT * FROM a, __rel_3";
        assert_eq!(
            given(outer, "SELECT * FROM src", &[]),
            "WITH b AS (SELECT 1) SELECT * FROM src"
        );
        assert_eq!(
            given(outer, "SELECT * FROM src", &["__rel_2"]),
            "WITH a AS (SELECT * FROM __rel_2), b AS (SELECT 1) SELECT * FROM src"
        );
    }
}
