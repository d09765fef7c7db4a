//! Hostile SQL never panics the statement parser: random sequences of our
//! keywords, punctuation, literals and arbitrary text either parse or give an
//! error, under every dialect we document.

use datafusion_autocdc::sql::parse_cdc_statement;
use proptest::prelude::*;

const WORDS: &[&str] = &[
    "CREATE",
    "OR",
    "REFRESH",
    "STREAMING",
    "TABLE",
    "FLOW",
    "AS",
    "AUTO",
    "CDC",
    "ONCE",
    "INTO",
    "FROM",
    "SNAPSHOT",
    "WITH",
    "VERSION",
    "stream",
    "(",
    ")",
    "KEYS",
    "SEQUENCE",
    "BY",
    "STRUCT",
    "APPLY",
    "CHANGES",
    "DELETE",
    "TRUNCATE",
    "WHEN",
    "SYSTEM",
    "COLUMNS",
    "*",
    "EXCEPT",
    "STORED",
    "SCD",
    "TYPE",
    "1",
    "2",
    "3",
    "BITEMPORAL",
    "TRACK",
    "HISTORY",
    "ON",
    "IGNORE",
    "NULL",
    "UPDATES",
    "TO",
    "UPDATE",
    "FULL",
    "DROP",
    "IF",
    "NOT",
    "EXISTS",
    "EXPLAIN",
    "ANALYZE",
    "VERBOSE",
    "TBLPROPERTIES",
    "COMMENT",
    "SELECT",
    "'x'",
    "\"y\"",
    "`z`",
    "a",
    "b.c",
    "a.b.c",
    ",",
    ";",
    "=",
    "--",
    "/*",
    "*/",
    "..",
    "/",
    "INT",
    "STRING",
];

/// Statement openings that reach the deeper parsing paths.
const PREFIXES: &[&str] = &[
    "",
    "CREATE FLOW f AS AUTO CDC INTO t FROM s",
    "CREATE FLOW f AS AUTO CDC INTO t FROM SNAPSHOT (SELECT 1)",
    "CREATE OR REFRESH STREAMING TABLE t",
    "APPLY CHANGES INTO t FROM stream(s) KEYS (id)",
    "REFRESH STREAMING TABLE",
    "EXPLAIN ANALYZE",
    "DROP STREAMING TABLE",
];

fn statement() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        8 => prop::sample::select(WORDS).prop_map(str::to_string),
        1 => any::<String>(),
    ];
    (
        prop::sample::select(PREFIXES),
        prop::collection::vec(token, 0..24),
    )
        .prop_map(|(prefix, t)| format!("{prefix} {}", t.join(" ")))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn parser_never_panics(sql in statement()) {
        for dialect in ["generic", "databricks", "postgresql"] {
            let _ = parse_cdc_statement(&sql, dialect, true);
        }
    }
}
