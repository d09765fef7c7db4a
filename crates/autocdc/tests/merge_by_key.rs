//! A small `MERGE` on an SCD 1 target reads only the stored rows of the
//! keys it changes (found by key, retired with deletion vectors): the same
//! table and change feed as the statement rewriting the table.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

mod common;
use common::exec;

async fn text(s: &CdcSession, sql: &str) -> String {
    let batches = s
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    pretty_format_batches(&batches).unwrap().to_string()
}

/// The source of the MERGE: matched: 3 updated, 7 deleted; not matched: 50
/// (a tombstone) and 900 inserted; 8 untouched by a condition.
const SOURCE: &str = "(VALUES (3, 'x'), (7, 'del'), (50, 'back'), (900, 'new'), (8, 'keep'))";

/// The same without 8: the statement changes every key of its source (the
/// stored rows found to match the source are those it replaces).
const EVERY_KEY_CHANGED: &str = "(VALUES (3, 'x'), (7, 'del'), (50, 'back'), (900, 'new'))";

/// The target and its change feed after the script, with deletion vectors
/// on or off, merging `source`; and the plan of the MERGE run.
async fn run(deletion_vectors: bool, source: &str) -> (Vec<String>, String) {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(
        &s,
        &format!("SET autocdc.deletion_vectors = {deletion_vectors}"),
    )
    .await;
    exec(
        &s,
        "CREATE TABLE src AS SELECT value AS id, 'v' || value AS v, 1 AS seq, \
         CASE WHEN value % 50 = 0 THEN 'D' ELSE 'U' END AS op FROM range(1, 201)",
    )
    .await;
    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '4')",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) \
         APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, v)",
    )
    .await;
    let plan = text(
        &s,
        &format!(
            "EXPLAIN ANALYZE MERGE INTO t USING {source} AS s(id, v) ON t.id = s.id \
             WHEN MATCHED AND s.v = 'del' THEN DELETE \
             WHEN MATCHED AND s.v <> 'keep' THEN UPDATE SET v = s.v \
             WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"
        ),
    )
    .await;
    let out = vec![
        text(&s, "SELECT * FROM t ORDER BY id").await,
        text(
            &s,
            "SELECT id, v, _change_type FROM table_changes('t', 2) ORDER BY id, _change_type",
        )
        .await,
    ];
    (out, plan)
}

#[tokio::test]
async fn a_small_merge_equals_the_rewrite() {
    let (by_key, plan) = run(true, SOURCE).await;
    assert!(plan.contains("rewrite=0"), "{plan}");
    let (rewritten, plan) = run(false, SOURCE).await;
    assert!(plan.contains("rewrite=1"), "{plan}");
    assert_eq!(by_key, rewritten);
    assert!(by_key[0].contains("| 3   | x    |"), "{}", by_key[0]);
    assert!(by_key[0].contains("| 50  | back |"), "{}", by_key[0]);
    assert!(by_key[0].contains("| 900 | new  |"), "{}", by_key[0]);
    assert!(!by_key[0].contains("| 7   |"), "{}", by_key[0]);
    assert!(by_key[0].contains("| 8   | v8   |"), "{}", by_key[0]);
}

#[tokio::test]
async fn a_merge_changing_every_source_key_equals_the_rewrite() {
    let (by_key, plan) = run(true, EVERY_KEY_CHANGED).await;
    assert!(plan.contains("rewrite=0"), "{plan}");
    let (rewritten, plan) = run(false, EVERY_KEY_CHANGED).await;
    assert!(plan.contains("rewrite=1"), "{plan}");
    assert_eq!(by_key, rewritten);
    assert!(by_key[0].contains("| 3   | x    |"), "{}", by_key[0]);
    assert!(by_key[0].contains("| 8   | v8   |"), "{}", by_key[0]);
    assert!(!by_key[0].contains("| 7   |"), "{}", by_key[0]);
}
