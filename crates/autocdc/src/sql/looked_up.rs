//! The tables a statement reads that DataFusion does not look up before
//! planning it.
//!
//! DataFusion looks up every table a statement names (asynchronously, each
//! at its latest version: `session::latest_schema`) before it plans it. The
//! table functions that name a table — `stream(t)`, and the ones taking its
//! name as a string — are called while it plans, synchronously, and take
//! the session's table as it is; so the session looks these names up first.
//! They are found in the statement's tokens, whatever statement it is (a
//! query relation `FROM AUTO CDC (…)` or a `CREATE FLOW` too):
//!
//! | written                                          | name looked up           |
//! |--------------------------------------------------|--------------------------|
//! | `stream(s.t)`, `STREAM s.t`                      | `s.t`, as the session folds names |
//! | `table_as_of('s.t', …)`, `table_changes`, `event_log`, `scd2_as_of`, `bitemporal_as_of` | `s.t` read as SQL |
//!
//! A name that is no table is the planner's to report.

use datafusion::common::TableReference;
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

/// The table functions taking a streaming table's name as a string first.
const NAMING_FUNCTIONS: [&str; 5] = [
    "table_as_of",
    "table_changes",
    "event_log",
    "scd2_as_of",
    "bitemporal_as_of",
];

/// Whether `sql` may name a table through a function (a cheap test before
/// [`looked_up_tables`]).
pub fn may_name_tables_in_functions(sql: &str) -> bool {
    let bytes = sql.as_bytes();
    bytes.windows(6).any(|w| w.eq_ignore_ascii_case(b"stream"))
        || bytes.windows(4).any(|w| w.eq_ignore_ascii_case(b"_of("))
        || bytes
            .windows(8)
            .any(|w| w.eq_ignore_ascii_case(b"_changes"))
        || bytes
            .windows(9)
            .any(|w| w.eq_ignore_ascii_case(b"event_log"))
}

/// The tables `sql` names through functions (see the module docs), unquoted
/// parts of a stream's name folded to lower case when `normalize`.
pub fn looked_up_tables(sql: &str, dialect: &str, normalize: bool) -> Vec<TableReference> {
    let Some(d) = dialect_from_str(dialect) else {
        return vec![];
    };
    let Ok(tokens) = Tokenizer::new(d.as_ref(), sql).tokenize() else {
        return vec![];
    };
    let tokens: Vec<&Token> = tokens
        .iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    let name_at = |mut at: usize| {
        let mut parts: Vec<String> = vec![];
        while let Some(Token::Word(w)) = tokens.get(at) {
            parts.push(match w.quote_style.is_none() && normalize {
                true => w.value.to_lowercase(),
                false => w.value.clone(),
            });
            match tokens.get(at + 1) {
                Some(Token::Period) => at += 2,
                _ => break,
            }
        }
        match parts.as_slice() {
            [table] => Some(TableReference::bare(table.as_str())),
            [schema, table] => Some(TableReference::partial(schema.as_str(), table.as_str())),
            [catalog, schema, table] => Some(TableReference::full(
                catalog.as_str(),
                schema.as_str(),
                table.as_str(),
            )),
            _ => None,
        }
    };
    let mut found = vec![];
    for (at, token) in tokens.iter().enumerate() {
        let Token::Word(w) = token else { continue };
        if w.quote_style.is_some() {
            continue;
        }
        if w.value.eq_ignore_ascii_case("stream") {
            found.extend(match tokens.get(at + 1) {
                Some(Token::LParen) => name_at(at + 2),
                Some(Token::Word(_)) => name_at(at + 1),
                _ => None,
            });
        } else if NAMING_FUNCTIONS
            .iter()
            .any(|f| w.value.eq_ignore_ascii_case(f))
        {
            if let (Some(Token::LParen), Some(Token::SingleQuotedString(name))) =
                (tokens.get(at + 1), tokens.get(at + 2))
            {
                found.push(TableReference::from(name.as_str()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_found_in_any_statement() {
        let sql = "SELECT * FROM AUTO CDC (SELECT * FROM stream(s.\"T\")) KEYS (id) \
                   SEQUENCE BY seq JOIN STREAM U ON true, -- stream\n STREAM (v) \
                   JOIN table_as_of('w.Mixed', 3) ON true JOIN event_log('\"Q\"') ON true";
        assert!(may_name_tables_in_functions(sql));
        let names = |normalize| {
            looked_up_tables(sql, "generic", normalize)
                .iter()
                .map(|n| n.to_vec())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(true),
            [
                vec!["s", "T"],
                vec!["u"],
                vec!["v"],
                vec!["w", "mixed"],
                vec!["Q"]
            ]
        );
        assert_eq!(names(false)[1], ["U"]);
        assert!(!may_name_tables_in_functions("SELECT 1"));
    }
}
