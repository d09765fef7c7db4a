//! `TRUNCATE [TABLE] t` as `DELETE FROM t`.
//!
//! DataFusion 55 plans `TRUNCATE` but none of the tables a session holds
//! takes it (its in-memory tables and our streaming tables alike: "TRUNCATE
//! not supported"), while the documentation's examples empty a table so
//! between snapshots. Every row goes either way; the statement returns the
//! rows removed.
//!
//! | written                                   | planned as        |
//! |-------------------------------------------|-------------------|
//! | `TRUNCATE TABLE t`, `TRUNCATE t`          | `DELETE FROM t`   |
//! | `EXPLAIN [ANALYZE] [VERBOSE] [FORMAT f] TRUNCATE …` | `EXPLAIN … DELETE FROM t` |
//! | several tables, partitions, `IF EXISTS`, `CASCADE`, … | as written (DataFusion reports it) |

use std::borrow::Cow;

use datafusion::sql::sqlparser::ast::Statement;
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use datafusion::sql::sqlparser::parser::Parser;

/// `sql` as `DELETE FROM t` when it is a plain `TRUNCATE [TABLE] t`; as
/// written otherwise (only text starting with `TRUNCATE` is parsed).
pub fn truncate_as_delete<'a>(sql: &'a str, dialect: &str) -> Cow<'a, str> {
    let body = past_comments(sql, dialect);
    // `EXPLAIN [ANALYZE] [VERBOSE] [FORMAT f]` before it: the statement it
    // explains
    let words: Vec<(usize, &str)> = body
        .split_whitespace()
        .take(6)
        .map(|w| (w.as_ptr() as usize - sql.as_ptr() as usize, w))
        .collect();
    if words
        .first()
        .is_some_and(|(_, w)| w.eq_ignore_ascii_case("explain"))
    {
        // (its options: ANALYZE, VERBOSE, FORMAT <format>)
        let mut at_statement = 1;
        while let Some((_, word)) = words.get(at_statement) {
            at_statement += match word.to_ascii_lowercase().as_str() {
                "analyze" | "verbose" => 1,
                "format" => 2,
                _ => break,
            };
        }
        if let Some(&(at, _)) = words.get(at_statement) {
            let (head, explained) = sql.split_at(at);
            return match truncate_as_delete(explained, dialect) {
                Cow::Owned(delete) => Cow::Owned(format!("{head}{delete}")),
                Cow::Borrowed(_) => Cow::Borrowed(sql),
            };
        }
        return Cow::Borrowed(sql);
    }
    let is_truncate = body
        .get(..8)
        .is_some_and(|w| w.eq_ignore_ascii_case("truncate"));
    if !is_truncate {
        return Cow::Borrowed(sql);
    }
    let Some(dialect) = dialect_from_str(dialect) else {
        return Cow::Borrowed(sql);
    };
    let Ok(statements) = Parser::parse_sql(dialect.as_ref(), sql) else {
        return Cow::Borrowed(sql);
    };
    let [Statement::Truncate(truncate)] = statements.as_slice() else {
        return Cow::Borrowed(sql);
    };
    let plain = truncate.partitions.is_none()
        && !truncate.if_exists
        && truncate.identity.is_none()
        && truncate.cascade.is_none()
        && truncate.on_cluster.is_none();
    match truncate.table_names.as_slice() {
        [target] if plain && !target.only && !target.has_asterisk => {
            Cow::Owned(format!("DELETE FROM {}", target.name))
        }
        _ => Cow::Borrowed(sql),
    }
}

/// `sql` from its first token: past white space and comments, as the
/// dialect's tokenizer reads them (`--`, `/* */` nested, `#` in MySQL and
/// BigQuery); as given when it does not tokenize (the parser reports it).
fn past_comments<'a>(sql: &'a str, dialect: &str) -> &'a str {
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Some(dialect) = dialect_from_str(dialect) else {
        return sql;
    };
    let Ok(tokens) = Tokenizer::new(dialect.as_ref(), sql).tokenize_with_location() else {
        return sql;
    };
    let Some(first) = tokens
        .iter()
        .find(|t| !matches!(t.token, Token::Whitespace(_)))
    else {
        return "";
    };
    // (its location is a line and a column, both counted from 1, in chars)
    let (line, column) = (first.span.start.line, first.span.start.column);
    let mut at_line = 1;
    let mut at_column = 1;
    for (offset, c) in sql.char_indices() {
        if at_line == line && at_column == column {
            return &sql[offset..];
        }
        if c == '\n' {
            at_line += 1;
            at_column = 1;
        } else {
            at_column += 1;
        }
    }
    ""
}

#[cfg(test)]
mod tests {
    use super::truncate_as_delete;

    #[test]
    fn an_explained_truncate_explains_the_delete() {
        assert_eq!(
            truncate_as_delete("EXPLAIN TRUNCATE TABLE t", "generic"),
            "EXPLAIN DELETE FROM t"
        );
        assert_eq!(
            truncate_as_delete("explain  analyze VERBOSE\ntruncate t", "generic"),
            "explain  analyze VERBOSE\nDELETE FROM t"
        );
        assert_eq!(
            truncate_as_delete("EXPLAIN FORMAT indent VERBOSE TRUNCATE t", "generic"),
            "EXPLAIN FORMAT indent VERBOSE DELETE FROM t"
        );
        assert_eq!(
            truncate_as_delete("EXPLAIN SELECT 1", "generic"),
            "EXPLAIN SELECT 1"
        );
    }

    #[test]
    fn a_plain_truncate_is_a_delete_of_every_row() {
        assert_eq!(
            truncate_as_delete("TRUNCATE TABLE main.s.\"T\"", "generic"),
            "DELETE FROM main.s.\"T\""
        );
        assert_eq!(
            truncate_as_delete(" truncate t;", "databricks"),
            "DELETE FROM t"
        );
        assert_eq!(
            truncate_as_delete(
                "-- empty it\n/* before /* nested */ the load */ TRUNCATE t",
                "generic"
            ),
            "DELETE FROM t"
        );
        assert_eq!(
            truncate_as_delete("EXPLAIN -- the plan\nTRUNCATE t", "generic"),
            "EXPLAIN DELETE FROM t"
        );
        assert_eq!(
            truncate_as_delete("# empty it\nTRUNCATE t", "mysql"),
            "DELETE FROM t"
        );
        for other in [
            "-- TRUNCATE t\nSELECT 1",
            "/* unterminated TRUNCATE t",
            "TRUNCATE TABLE a, b",
            "SELECT 1",
            "TRUNCATE TABLE t CASCADE",
        ] {
            assert_eq!(truncate_as_delete(other, "postgresql"), other);
        }
    }
}
