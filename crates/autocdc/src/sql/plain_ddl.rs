//! DataFusion's own DDL, where it names what may be a streaming table.
//!
//! DataFusion runs `DROP TABLE t`, `DROP VIEW t`, `CREATE OR REPLACE
//! {TABLE | VIEW} t` and `DROP SCHEMA s CASCADE` against the session's
//! catalog only: on a streaming table they would report success and forget
//! it in this session, while its Delta table stays (and comes back in the
//! next). [`plain_ddl_targets`] finds the names such a statement touches, so
//! that the session refuses it when one is a streaming table.
//!
//! | statement                                   | [`PlainDdl`]              |
//! |---------------------------------------------|---------------------------|
//! | `DROP TABLE` / `DROP VIEW` names            | `Drop(names)`             |
//! | `CREATE OR REPLACE TABLE` / `VIEW` name     | `Replace(name)`           |
//! | `DROP SCHEMA s` (with or without `CASCADE`) | `DropSchema(s)`           |
//! | anything else, or SQL that does not parse   | none                      |
//!
//! [`created_schema`] names the schema of a lone `CREATE SCHEMA`, which
//! `autocdc run` leaves alone when the schema exists; [`is_lone_query`]
//! tells a query from statements that would run when planned.

use datafusion::sql::parser::{DFParser, Statement};
use datafusion::sql::sqlparser::ast::{Ident, ObjectName, ObjectType, Statement as SqlStatement};
use datafusion::sql::sqlparser::dialect::{dialect_from_str, GenericDialect};

use crate::table::TableName;

/// What a DataFusion DDL statement would do to names that may be
/// streaming tables (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlainDdl {
    /// `DROP TABLE` / `DROP VIEW` of these names.
    Drop(Vec<TableName>),
    /// `CREATE OR REPLACE TABLE` / `VIEW` of this name.
    Replace(TableName),
    /// `DROP SCHEMA` of this schema.
    DropSchema(String),
}

/// The schema a lone `CREATE SCHEMA` statement `sql` names (folded to lower
/// case when `normalize` and unquoted); `None` for anything else.
pub fn created_schema(sql: &str, dialect: &str, normalize: bool) -> Option<String> {
    let parsed = match dialect_from_str(dialect) {
        Some(d) => DFParser::parse_sql_with_dialect(sql, d.as_ref()),
        None => DFParser::parse_sql_with_dialect(sql, &GenericDialect {}),
    };
    let statements = parsed.ok()?;
    let [Statement::Statement(statement)] = statements.iter().collect::<Vec<_>>()[..] else {
        return None;
    };
    let SqlStatement::CreateSchema { schema_name, .. } = statement.as_ref() else {
        return None;
    };
    let name = schema_name.to_string();
    Some(match (normalize, name.starts_with('"')) {
        (true, false) => name.to_lowercase(),
        _ => name.trim_matches('"').to_string(),
    })
}

/// Whether `sql` (in `dialect`) is one query (`SELECT`, `VALUES`, `WITH
/// …`) and nothing else: no statement that would run when planned.
pub fn is_lone_query(sql: &str, dialect: &str) -> bool {
    let parsed = match dialect_from_str(dialect) {
        Some(d) => DFParser::parse_sql_with_dialect(sql, d.as_ref()),
        None => DFParser::parse_sql_with_dialect(sql, &GenericDialect {}),
    };
    matches!(
        parsed.ok().as_ref().map(|s| s.iter().collect::<Vec<_>>()).as_deref(),
        Some([Statement::Statement(statement)]) if matches!(statement.as_ref(), SqlStatement::Query(_))
    )
}

/// The DDL of `sql` (one or more statements, in `dialect`; identifiers
/// folded to lower case when `normalize`) that may touch streaming tables.
pub fn plain_ddl_targets(sql: &str, dialect: &str, normalize: bool) -> Vec<PlainDdl> {
    let parsed = match dialect_from_str(dialect) {
        Some(d) => DFParser::parse_sql_with_dialect(sql, d.as_ref()),
        None => DFParser::parse_sql_with_dialect(sql, &GenericDialect {}),
    };
    let Ok(statements) = parsed else {
        return Vec::new();
    };
    let ident = |i: &Ident| match (i.quote_style, normalize) {
        (None, true) => i.value.to_lowercase(),
        _ => i.value.clone(),
    };
    let name = |n: &ObjectName| -> Option<TableName> {
        let parts: Option<Vec<String>> = n.0.iter().map(|p| p.as_ident().map(ident)).collect();
        TableName::from_parts(&parts?).ok()
    };
    statements
        .iter()
        .filter_map(|statement| {
            let Statement::Statement(statement) = statement else {
                return None;
            };
            match statement.as_ref() {
                SqlStatement::Drop {
                    object_type: ObjectType::Table | ObjectType::View,
                    names,
                    ..
                } => Some(PlainDdl::Drop(names.iter().filter_map(name).collect())),
                SqlStatement::Drop {
                    object_type: ObjectType::Schema,
                    names,
                    ..
                } => names
                    .first()
                    .and_then(|n| n.0.last())
                    .and_then(|p| p.as_ident())
                    .map(|i| PlainDdl::DropSchema(ident(i))),
                SqlStatement::CreateTable(create) if create.or_replace => {
                    name(&create.name).map(PlainDdl::Replace)
                }
                SqlStatement::CreateView(create) if create.or_replace => {
                    name(&create.name).map(PlainDdl::Replace)
                }
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(sql: &str) -> Vec<PlainDdl> {
        plain_ddl_targets(sql, "generic", true)
    }

    fn name(schema: &str, table: &str) -> TableName {
        TableName {
            schema: schema.to_string(),
            table: table.to_string(),
        }
    }

    #[test]
    fn finds_the_names_ddl_touches() {
        assert_eq!(
            targets("DROP TABLE T; DROP VIEW IF EXISTS s.\"V\""),
            [
                PlainDdl::Drop(vec![name("public", "t")]),
                PlainDdl::Drop(vec![name("s", "V")])
            ]
        );
        assert_eq!(
            targets("CREATE OR REPLACE VIEW t AS SELECT 1"),
            [PlainDdl::Replace(name("public", "t"))]
        );
        assert_eq!(
            targets("CREATE OR REPLACE TABLE s.t (a INT)"),
            [PlainDdl::Replace(name("s", "t"))]
        );
        assert_eq!(
            targets("DROP SCHEMA S CASCADE"),
            [PlainDdl::DropSchema("s".into())]
        );
        assert!(targets("CREATE TABLE t (a INT); SELECT 1; DROP FUNCTION f").is_empty());
        assert!(targets("not sql at all").is_empty());
    }
}
