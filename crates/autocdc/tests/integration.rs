//! End-to-end tests of the library: restart on a local warehouse, Delta
//! compatibility, EXPLAIN, the Rust API example.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionContext;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

mod common;
use common::exec;

#[allow(dead_code)]
#[path = "../../../examples/rust_api.rs"]
mod rust_api;

async fn rows(s: &CdcSession, sql: &str) -> Vec<String> {
    let batches = s
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap();
    lines(&batches)
}

/// The error `sql` fails with, when it is planned or when it runs.
async fn error_of(s: &CdcSession, sql: &str) -> String {
    match s.sql(sql).await {
        Err(e) => e.to_string(),
        Ok(df) => match df.collect().await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{sql}: no error"),
        },
    }
}

/// `id`, `v` and `_change_type` of target `t`'s changes from `version` on.
async fn changes_since(s: &CdcSession, version: u64) -> Vec<String> {
    let query = format!(
        "SELECT id, v, _change_type FROM table_changes('t', {version}) ORDER BY id, _change_type"
    );
    rows(s, &query).await
}

fn lines(batches: &[RecordBatch]) -> Vec<String> {
    let table = pretty_format_batches(batches).unwrap().to_string();
    table
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// The flow definition lives in the warehouse: a new process REFRESHes it.
#[tokio::test]
async fn restart_on_the_same_local_warehouse() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let wh = wh.to_str().unwrap();
    {
        let s = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
        exec(&s, "CREATE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES (1, 'a', 'I', 1), (2, 'b', 'I', 1)").await;
        exec(&s, "CREATE STREAMING TABLE app.t").await;
        exec(&s, "CREATE FLOW f AS AUTO CDC INTO app.t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)").await;
        assert_eq!(
            rows(&s, "SELECT * FROM app.t ORDER BY id").await,
            ["| 1 | a |", "| 2 | b |"]
        );
    }
    let s = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    // the table is known before any statement of ours ran
    assert_eq!(
        rows(&s, "SELECT * FROM app.t ORDER BY id").await,
        ["| 1 | a |", "| 2 | b |"]
    );
    exec(&s, "CREATE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES (1, 'a', 'I', 1), (2, 'b', 'I', 1), (1, NULL, 'D', 2), (3, 'c', 'I', 1), (2, 'b2', 'U', 3)").await;
    assert_eq!(
        rows(&s, "REFRESH STREAMING TABLE app.t").await,
        ["| f | 2 | 1 | 5 | 2 | 2 |"]
    );
    assert_eq!(
        rows(&s, "SELECT * FROM app.t ORDER BY id").await,
        ["| 2 | b2 |", "| 3 | c |"]
    );
}

/// `stream(t)` in a query of a session that did not create `t` reads it
/// every time (its lookup while planning did I/O, and failed when that was
/// not done at once), and at its latest version.
#[tokio::test(flavor = "multi_thread")]
async fn stream_in_a_query_of_another_session_reads_the_latest_rows() {
    let dir = tempfile::tempdir().unwrap();
    let one = with_a_flow_into(&dir, "base").await;
    let two = session_in(&dir).await;
    for _ in 0..10 {
        assert_eq!(
            rows(&two, "SELECT count(*) FROM stream(base)").await,
            ["| 2 |"]
        );
    }
    exec(&one, "INSERT INTO src VALUES (3, 'c', 1)").await;
    exec(&one, "REFRESH STREAMING TABLE base").await;
    assert_eq!(
        rows(&two, "SELECT id FROM AUTO CDC (SELECT * FROM stream(base)) KEYS (id) SEQUENCE BY seq ORDER BY id").await,
        ["| 1 |", "| 2 |", "| 3 |"]
    );
    exec(&one, "INSERT INTO src VALUES (4, 'd', 1)").await;
    exec(&one, "REFRESH STREAMING TABLE base").await;
    assert_eq!(
        rows(&two, "SELECT count(*) FROM stream(base)").await,
        ["| 4 |"]
    );
    // and the functions naming a table by a string: its latest version too
    exec(&one, "INSERT INTO src VALUES (5, 'e', 1)").await;
    exec(&one, "REFRESH STREAMING TABLE base").await;
    assert_eq!(
        rows(&two, "SELECT count(*) FROM table_as_of('base', 4)").await,
        ["| 5 |"]
    );
    assert_eq!(
        rows(&two, "SELECT max(commit_version) FROM event_log('base')").await,
        ["| 4 |"]
    );
}

/// A table another session dropped, or dropped and created again, is read
/// as it is now: an error naming it, or the new table — never the old one's
/// files (a raw "object not found") or its flows laid over the new log.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_dropped_and_created_again_elsewhere_is_read_anew() {
    let dir = tempfile::tempdir().unwrap();
    let one = with_a_flow_into(&dir, "t").await;
    let two = session_in(&dir).await;
    assert_eq!(
        rows(&two, "SELECT id FROM t ORDER BY id").await,
        ["| 1 |", "| 2 |"]
    );

    // (read on to another writer's commit)
    exec(&one, "INSERT INTO src VALUES (3, 'c', 1)").await;
    exec(&one, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(&two, "SELECT id FROM t ORDER BY id").await,
        ["| 1 |", "| 2 |", "| 3 |"]
    );

    exec(&one, "DROP STREAMING TABLE t").await;
    let gone = two.sql("SELECT * FROM t").await.expect_err("t was dropped");
    assert!(
        gone.to_string()
            .contains("streaming table 't' was dropped since this session read it"),
        "{gone}"
    );

    // created again, with more commits than the old one had when `two` read it
    exec(
        &one,
        "CREATE TABLE src2 (k INT, w TEXT, s INT) AS VALUES (7, 'x', 1)",
    )
    .await;
    exec(&one, "CREATE STREAMING TABLE t").await;
    exec(
        &one,
        "CREATE FLOW g AS AUTO CDC INTO t FROM src2 KEYS (k) SEQUENCE BY s",
    )
    .await;
    exec(&one, "INSERT INTO src2 VALUES (8, 'y', 1)").await;
    exec(&one, "REFRESH STREAMING TABLE t").await;
    exec(&one, "INSERT INTO src2 VALUES (9, 'z', 1)").await;
    exec(&one, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(&two, "SELECT k, w FROM t ORDER BY k").await,
        ["| 7 | x |", "| 8 | y |", "| 9 | z |"]
    );
    // its refresh runs the new table's flow (whose source it does not have)
    let refresh = two
        .sql("REFRESH STREAMING TABLE t")
        .await
        .expect_err("flow g reads src2, a table of the other session");
    assert!(refresh.to_string().contains("flow 'g'"), "{refresh}");
}

/// A session on a local warehouse in `dir/wh` holding `src` (ids 1, 2) and
/// the streaming table `table` of an SCD 1 flow `f` from it.
async fn with_a_flow_into(dir: &tempfile::TempDir, table: &str) -> CdcSession {
    let one = session_in(dir).await;
    exec(
        &one,
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
    )
    .await;
    exec(&one, &format!("CREATE STREAMING TABLE {table}")).await;
    exec(
        &one,
        &format!("CREATE FLOW f AS AUTO CDC INTO {table} FROM src KEYS (id) SEQUENCE BY seq"),
    )
    .await;
    one
}

/// A session on a local warehouse in `dir/wh`.
async fn session_in(dir: &tempfile::TempDir) -> CdcSession {
    let wh = dir.path().join("wh");
    CdcSession::open(AutoCdcConfig::new(wh.to_str().unwrap()))
        .await
        .unwrap()
}

/// A PostgreSQL Debezium event (payload only) of the row `{id, name}`,
/// `op` at LSN `lsn` (`None`: its source has no LSN).
fn pg_event(op: &str, id: i64, name: &str, lsn: Option<i64>) -> String {
    let lsn = lsn.map_or(String::new(), |l| format!(r#","lsn":{l}"#));
    format!(
        r#"{{"before":null,"after":{{"id":{id},"name":"{name}"}},"source":{{"connector":"postgresql","ts_ms":1700000000000{lsn}}},"op":"{op}","ts_ms":1700000000000}}"#
    )
}

/// The folder of a streaming table's state store (`<table>/_autocdc/state`).
fn state_dir(dir: &tempfile::TempDir, table: &str) -> std::path::PathBuf {
    dir.path()
        .join("public")
        .join(table)
        .join("_autocdc")
        .join("state")
}

/// A new Delta table at `folder` holding `columns`, as another tool writes it.
async fn write_delta_table(
    folder: &std::path::Path,
    columns: Vec<(&str, datafusion::arrow::array::ArrayRef)>,
) {
    std::fs::create_dir_all(folder).unwrap();
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let url = url::Url::from_directory_path(folder).unwrap();
    deltalake_core::DeltaTableBuilder::from_url(url)
        .unwrap()
        .build()
        .unwrap()
        .write([batch])
        .await
        .unwrap();
}

/// The Delta table at `path`, opened by deltalake's own reader, and a
/// context where its provider is registered as `raw`.
async fn open_raw(path: std::path::PathBuf) -> (deltalake_core::DeltaTable, SessionContext) {
    let url = url::Url::from_directory_path(path).unwrap();
    let table = deltalake_core::DeltaTableBuilder::from_url(url)
        .unwrap()
        .load()
        .await
        .unwrap();
    let ctx = SessionContext::new();
    ctx.register_table("raw", table.table_provider().await.unwrap())
        .unwrap();
    (table, ctx)
}

/// Rows of a Delta table read by deltalake's own reader, sorted, and its columns.
async fn read_with_deltalake(path: std::path::PathBuf) -> (Vec<String>, Vec<String>) {
    let (_, ctx) = open_raw(path).await;
    let df = ctx.sql("SELECT * FROM raw").await.unwrap();
    let columns = df
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let mut rows = lines(&df.collect().await.unwrap());
    rows.sort();
    (rows, columns)
}

/// The table at a target's path is what `SELECT *` shows, to deltalake's
/// own reader too: the user columns and the visible rows (no tombstone, no
/// hidden SCD 2 event, no `__cdc_*` column), at the state store's versions.
/// The state store under `_autocdc/state` holds the rest: live rows,
/// tombstones, sequences, the flow definition.
#[tokio::test]
async fn target_is_a_plain_delta_table() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().to_str().unwrap();
    let s = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    exec(&s, "CREATE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES (1, 'a', 'I', 1), (2, 'b', 'I', 1), (2, NULL, 'D', 4)").await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(&s, "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)").await;

    let (table, ctx) = open_raw(state_dir(&dir, "t")).await;
    assert_eq!(table.version(), Some(1));
    let batches = ctx
        .sql("SELECT id, v, __cdc_seq, __cdc_kind FROM raw ORDER BY id")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(lines(&batches), ["| 1 | a | 1 | 0 |", "| 2 | | 4 | 1 |"]);
    let config = table.snapshot().unwrap().metadata().configuration().clone();
    assert!(
        config.contains_key("autocdc.flow.f"),
        "flow definition stored with the table: {config:?}"
    );

    // the published table: the live row only, the user columns only
    let published = dir.path().join("public").join("t");
    let (live, columns) = read_with_deltalake(published.clone()).await;
    assert_eq!(columns, ["id", "v"]);
    assert_eq!(live, ["| 1 | a |"]);

    // a deletion vector, a late event, a truncate, and SCD 2 history
    exec(
        &s,
        "INSERT INTO src VALUES (1, 'a2', 'U', 5), (3, 'c', 'U', 5), (1, 'late', 'U', 2)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    let ours = {
        let mut r = rows(&s, "SELECT * FROM t").await;
        r.sort();
        r
    };
    assert_eq!(read_with_deltalake(published.clone()).await.0, ours);
    exec(&s, "CREATE STREAMING TABLE h").await;
    exec(&s, "CREATE FLOW fh AS AUTO CDC INTO h FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op) STORED AS SCD TYPE 2").await;
    let (history, columns) = read_with_deltalake(dir.path().join("public").join("h")).await;
    assert_eq!(columns, ["id", "v", "seq", "__start_at", "__end_at"]);
    let mut ours = rows(&s, "SELECT * FROM h").await;
    ours.sort();
    assert_eq!(history, ours);
}

/// EXPLAIN shows the operators; EXPLAIN ANALYZE runs the update and shows metrics.
#[tokio::test]
async fn explain_refresh_shows_the_operators() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(
        &s,
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await;

    exec(&s, "SET datafusion.execution.target_partitions = 2").await;
    let plan = rows(&s, "EXPLAIN REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    for op in [
        "CdcCommit: target=t, flow=f",
        "AutoCdc: flow=f, keys=[id]",
        "CdcCommitExec",
        // routed by the target's bucket: each bucket reaches the writer in key order
        "AutoCdcExec: flow=f, keys=[id], stored_as=SCD TYPE 1, fold=indexed, key_exchange=2 by 16 buckets",
    ] {
        assert!(plan.contains(op), "missing {op} in\n{plan}");
    }
    // 3 partitions do not divide 16 buckets: routed by hash
    exec(&s, "SET datafusion.execution.target_partitions = 3").await;
    let three = rows(&s, "EXPLAIN REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    assert!(three.contains("fold=indexed, key_exchange=3 |"), "{three}");
    exec(&s, "SET datafusion.execution.target_partitions = 2").await;
    // the tree format says how the fold's events are routed too
    exec(&s, "SET datafusion.explain.format = 'tree'").await;
    let tree = rows(&s, "EXPLAIN REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    // (a box wraps the line: "key_exchange:" then "2 by 16 buckets")
    assert!(tree.contains("key_exchange:"), "{tree}");
    assert!(tree.contains("2 by 16 buckets"), "{tree}");
    exec(&s, "SET datafusion.explain.format = 'indent'").await;
    // the indexed fold sorts its own index, not the events, and routes
    // them to its partitions itself
    assert!(!plan.contains("SortExec"), "{plan}");
    assert!(
        !plan.contains("RepartitionExec: partitioning=Hash"),
        "{plan}"
    );
    exec(&s, "SET autocdc.key_exchange = false").await;
    let repartitioned = rows(&s, "EXPLAIN REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    for op in [
        "AutoCdcExec: flow=f, keys=[id], stored_as=SCD TYPE 1, fold=indexed |",
        "RepartitionExec: partitioning=Hash([id@0], 2)",
    ] {
        assert!(
            repartitioned.contains(op),
            "missing {op} in\n{repartitioned}"
        );
    }
    exec(&s, "SET autocdc.key_exchange = true").await;
    exec(&s, "SET autocdc.indexed_fold = false").await;
    let sorted = rows(&s, "EXPLAIN REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    for op in ["fold=sorted", "SortExec: expr=[id@0 ASC"] {
        assert!(sorted.contains(op), "missing {op} in\n{sorted}");
    }
    exec(&s, "SET autocdc.indexed_fold = true").await;

    exec(&s, "INSERT INTO src VALUES (3, 'c', 1)").await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    for metric in [
        "AutoCdcExec",
        "num_upserted_rows=1",
        "num_late_rows_dropped=2",
        "num_input_rows=3",
        "CdcCommitExec",
        "commit_version=2",
    ] {
        assert!(analyzed.contains(metric), "missing {metric} in\n{analyzed}");
    }
    // EXPLAIN ANALYZE ran a real update
    assert_eq!(
        rows(&s, "SELECT id FROM t ORDER BY id").await,
        ["| 1 |", "| 2 |", "| 3 |"]
    );
}

/// A session of two partitions and batches of 1024 rows in a memory pool of
/// `limit`; in a tight one (12M) sorts reserve nothing for their merge.
async fn bounded_session(limit: &str) -> CdcSession {
    let config = datafusion::prelude::SessionConfig::new()
        .with_target_partitions(2)
        .with_batch_size(1024);
    let s = CdcSession::open(AutoCdcConfig::in_memory().with_session_config(config))
        .await
        .unwrap();
    exec(
        &s,
        &format!("SET datafusion.runtime.memory_limit = '{limit}'"),
    )
    .await;
    if limit == "12M" {
        exec(
            &s,
            "SET datafusion.execution.sort_spill_reservation_bytes = 0",
        )
        .await;
    }
    s
}

/// In a bounded pool far smaller than the events, both partitions' indexed
/// folds fall back to sorting, each sort in its own share of the pool: the
/// update completes with the same rows in a comfortable and in a tight pool.
#[tokio::test]
async fn both_partitions_fall_back_within_a_bounded_pool() {
    for limit in ["64M", "12M"] {
        let s = bounded_session(limit).await;
        // 200 k events over 50 k keys, in descending sequence order per key
        // (the latest event of key k has seq 3 and value 'v{k}-3')
        exec(
            &s,
            "CREATE TABLE src AS SELECT value % 50000 AS id, 4 - value / 50000 AS seq, \
             concat('v', CAST(value % 50000 AS VARCHAR), '-', CAST(4 - value / 50000 AS VARCHAR), \
             repeat('x', 40)) AS v FROM generate_series(0, 199999)",
        )
        .await;
        exec(&s, "CREATE STREAMING TABLE t").await;
        exec(
            &s,
            "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
        )
        .await;
        exec(&s, "SET autocdc.indexed_fold_max_bytes = 1").await;
        exec(
            &s,
            "INSERT INTO src VALUES (7, 9, 'seven'), (50001, 1, 'new')",
        )
        .await;
        let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
            .await
            .join("\n");
        let fold = operator_line(&analyzed, "AutoCdcExec");
        assert!(fold.contains("num_sort_fallbacks=2,"), "{limit}: {fold}");
        assert!(fold.contains("num_upserted_rows=2,"), "{limit}: {fold}");
        assert_eq!(
            rows(
                &s,
                "SELECT count(*), max(v) FILTER (WHERE id = 7), max(v) FILTER (WHERE id = 8), \
                 max(v) FILTER (WHERE id = 50001), min(seq) FROM t"
            )
            .await,
            [format!(
                "| 50001 | seven | v8-4{} | new | 1 |",
                "x".repeat(40)
            )],
            "{limit}"
        );
    }
}

/// SCD 2 (and every fold but plain SCD 1) orders its events through a
/// sorted index (`fold=index-sorted`) instead of DataFusion's sort; when the
/// pool refuses it, each partition hands its events to the spilling sort.
/// The three ways give the same history, late events included.
#[tokio::test]
async fn scd2_history_is_the_same_index_sorted_sorted_or_fallen_back() {
    let mut histories = Vec::new();
    for mode in ["index-sorted", "fall back", "sorted"] {
        let config = datafusion::prelude::SessionConfig::new()
            .with_target_partitions(2)
            .with_batch_size(1000);
        let s = CdcSession::open(AutoCdcConfig::in_memory().with_session_config(config))
            .await
            .unwrap();
        match mode {
            "fall back" => exec(&s, "SET autocdc.indexed_fold_max_bytes = 1").await,
            "sorted" => exec(&s, "SET autocdc.indexed_fold = false").await,
            _ => {}
        }
        // 20 k events over 5 k keys, sequences descending per key, values
        // repeating (absorbed upserts) and every 7th event a delete
        exec(
            &s,
            "CREATE TABLE src AS SELECT CAST(value % 5000 AS VARCHAR) AS id, \
             4 - value / 5000 AS seq, CAST((value / 10000) AS VARCHAR) AS v, \
             CASE WHEN value % 7 = 0 THEN 'D' ELSE 'U' END AS op \
             FROM generate_series(0, 19999)",
        )
        .await;
        exec(&s, "CREATE STREAMING TABLE t").await;
        exec(
            &s,
            "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' \
             SEQUENCE BY seq COLUMNS * EXCEPT (op) STORED AS SCD TYPE 2",
        )
        .await;
        exec(&s, "REFRESH STREAMING TABLE t").await;
        // late and new events of a few keys
        exec(
            &s,
            "INSERT INTO src VALUES ('7', 0, 'late', 'U'), ('8', 9, 'new', 'U'), \
             ('9', 5, 'gone', 'D'), ('x', 1, 'fresh', 'U')",
        )
        .await;
        let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
            .await
            .join("\n");
        let fold = operator_line(&analyzed, "AutoCdcExec");
        let expected = match mode {
            "sorted" => "fold=sorted",
            _ => "fold=index-sorted",
        };
        assert!(fold.contains(expected), "{mode}: {fold}");
        let fallbacks = if mode == "fall back" { 2 } else { 0 };
        assert!(
            fold.contains(&format!("num_sort_fallbacks={fallbacks},")),
            "{mode}: {fold}"
        );
        assert_eq!(analyzed.contains("SortExec"), mode == "sorted", "{mode}");
        histories.push(
            rows(
                &s,
                "SELECT id, v, seq, __START_AT, __END_AT FROM t ORDER BY id, __START_AT",
            )
            .await,
        );
    }
    assert!(histories[0].len() > 10_000, "{}", histories[0].len());
    assert_eq!(histories[0], histories[1], "fall back");
    assert_eq!(histories[0], histories[2], "sorted");
}

/// A failed first run leaves no flow behind and the target unchanged.
/// When the memory pool refuses the indexed SCD 1 fold, the partition falls
/// back to DataFusion's spilling sort with the events it already holds: same
/// rows, same counts as with enough memory.
#[tokio::test]
async fn indexed_fold_falls_back_to_sorting_when_memory_runs_short() {
    let mut results = Vec::new();
    // (the memory table source is re-read whole: its first four rows are late)
    for limit in [None, Some("16K")] {
        let config = datafusion::prelude::SessionConfig::new().with_batch_size(4);
        let s = CdcSession::open(AutoCdcConfig::in_memory().with_session_config(config))
            .await
            .unwrap();
        if let Some(limit) = limit {
            exec(
                &s,
                &format!("SET datafusion.runtime.memory_limit = '{limit}'"),
            )
            .await;
            // the sort it falls back to merges within the pool too
            exec(
                &s,
                "SET datafusion.execution.sort_spill_reservation_bytes = 0",
            )
            .await;
        }
        exec(
            &s,
            "CREATE TABLE src (id INT, v TEXT, seq INT, op TEXT) AS VALUES \
             (1, 'a', 1, 'U'), (2, 'b', 1, 'U'), (3, 'c', 1, 'U'), (4, 'd', 1, 'U')",
        )
        .await;
        exec(&s, "CREATE STREAMING TABLE t").await;
        exec(
            &s,
            "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) \
             APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op)",
        )
        .await;
        exec(
            &s,
            "INSERT INTO src VALUES (1, 'a2', 5, 'U'), (1, 'a1', 3, 'U'), (2, 'b', 0, 'U'), \
             (3, NULL, 2, 'D'), (5, 'e', 1, 'U'), (5, 'e', 1, 'U'), (6, 'f', 2, 'U'), \
             (6, 'g', 4, 'U'), (7, 'h', 1, 'U'), (8, 'i', 1, 'U'), (9, 'j', 1, 'U')",
        )
        .await;
        exec(
            &s,
            "INSERT INTO src SELECT CAST(value AS INT), 'x', 1, 'U' FROM generate_series(100, 399)",
        )
        .await;
        let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
            .await
            .join("\n");
        assert!(analyzed.contains("fold=indexed"), "{analyzed}");
        let fell_back = !analyzed.contains("num_sort_fallbacks=0,");
        assert_eq!(fell_back, limit.is_some(), "{analyzed}");
        for metric in [
            "num_upserted_rows=306",
            "num_deleted_rows=1",
            "num_late_rows_dropped=5",
            "num_duplicate_rows_dropped=1",
        ] {
            assert!(analyzed.contains(metric), "missing {metric} in\n{analyzed}");
        }
        results.push(rows(&s, "SELECT id, v, seq FROM t WHERE id < 100 ORDER BY id").await);
        assert_eq!(rows(&s, "SELECT count(*) FROM t").await, ["| 308 |"]);
    }
    assert_eq!(
        results[0],
        [
            "| 1 | a2 | 5 |",
            "| 2 | b | 1 |",
            "| 4 | d | 1 |",
            "| 5 | e | 1 |",
            "| 6 | g | 4 |",
            "| 7 | h | 1 |",
            "| 8 | i | 1 |",
            "| 9 | j | 1 |"
        ]
    );
    assert_eq!(results[0], results[1]);
}

#[tokio::test]
async fn failed_create_flow_leaves_nothing() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(
        &s,
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (1, 'b', 1)",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    let err = s
        .sql("CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq")
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("conflicting events for key (id=1)"),
        "{err}"
    );
    let table = s
        .streaming_table(&datafusion_autocdc::table::TableName::parse("t").unwrap())
        .unwrap();
    assert!(table.meta().flows.is_empty());
    assert_eq!(table.delta().version(), Some(0));
    // the name is free again
    exec(
        &s,
        "CREATE OR REPLACE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await;
    assert_eq!(rows(&s, "SELECT * FROM t").await, ["| 1 | a | 1 |"]);
}

#[tokio::test]
async fn rust_api_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (metrics, batches) = rust_api::run(dir.path().to_str().unwrap()).await.unwrap();
    assert_eq!(
        (
            metrics.flow.as_str(),
            metrics.num_upserted_rows,
            metrics.num_input_rows
        ),
        ("users_flow", 3, 8)
    );
    assert_eq!(
        lines(&batches),
        [
            "| 124 | Raul | Oaxaca |",
            "| 125 | Mercedes | Guadalajara |",
            "| 126 | Lily | Merida |"
        ]
    );
}

/// EXPLAIN ANALYZE of an SCD 2 update shows the operator with its row counts.
#[tokio::test]
async fn explain_analyze_scd2_update() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(&s, "CREATE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES (1, 'a', 'U', 1), (1, 'b', 'U', 2), (2, 'x', 'U', 1)").await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(&s, "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2").await;
    exec(&s, "INSERT INTO src VALUES (1, NULL, 'D', 3)").await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    // 3 stored events + 1 new; out: 4 hidden events + 3 versions (a[1,2) b[2,3) x[1,∞))
    for needle in [
        "AutoCdcExec: flow=f, keys=[id], stored_as=SCD TYPE 2",
        "output_rows=7",
        "num_input_rows=4",
        "num_events_added=1",
        // the delete closes b's version: an update of that row (SPEC §4)
        "num_upserted_rows=1",
        "num_deleted_rows=0",
        "num_duplicate_rows_dropped=3",
    ] {
        assert!(analyzed.contains(needle), "missing {needle} in\n{analyzed}");
    }
    assert_eq!(
        rows(
            &s,
            "SELECT v, __start_at, __end_at FROM t ORDER BY id, __start_at"
        )
        .await,
        ["| a | 1 | 2 |", "| b | 2 | 3 |", "| x | 1 | |"]
    );
}

/// Without deletion vectors, an update reads and rewrites only the key
/// buckets its events touch.
#[tokio::test]
async fn updates_rewrite_only_touched_buckets() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(&s, "SET autocdc.deletion_vectors = false").await;
    exec(
        &s,
        "CREATE TABLE src AS SELECT value AS id, 'v' AS v, 1 AS seq FROM generate_series(1, 200)",
    )
    .await;
    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '8')",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await;
    let t = s
        .streaming_table(&datafusion_autocdc::table::TableName::parse("t").unwrap())
        .unwrap();
    assert_eq!(
        t.delta().get_file_uris().unwrap().count(),
        8,
        "one file per bucket"
    );

    // one changed key: one bucket read and rewritten
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT 7 AS id, 'changed' AS v, 2 AS seq",
    )
    .await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    assert!(analyzed.contains("num_files_written=1"), "{analyzed}");
    assert!(analyzed.contains("num_upserted_rows=1"), "{analyzed}");
    assert_eq!(t.delta().get_file_uris().unwrap().count(), 8);
    assert_eq!(
        rows(
            &s,
            "SELECT count(*), count(*) FILTER (WHERE v = 'changed') FROM t"
        )
        .await,
        ["| 200 | 1 |"]
    );
}

/// (number of data files, number with a deletion vector, rows they delete)
/// of a streaming table's current version.
async fn deletion_vector_files(s: &CdcSession, name: &str) -> (usize, usize, i64) {
    let views = file_views(s, name).await;
    let vectors: Vec<i64> = views
        .iter()
        .filter_map(|v| v.deletion_vector_descriptor().map(|d| d.cardinality))
        .collect();
    (views.len(), vectors.len(), vectors.iter().sum())
}

/// A small update of a large table keeps the files it touches and retires
/// the stored rows of its keys with deletion vectors; its new rows go to a
/// new file. Our provider, the change feed and deltalake's own reader agree,
/// vectors accumulate over updates and survive a restart, and a large update
/// rewrites its buckets (files with vectors included).
#[tokio::test]
async fn small_updates_retire_rows_with_deletion_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().to_str().unwrap().to_string();
    let s = CdcSession::open(AutoCdcConfig::new(&warehouse))
        .await
        .unwrap();
    exec(
        &s,
        "CREATE TABLE src AS SELECT value AS id, 'v' AS v, 'U' AS op, 1 AS seq FROM generate_series(1, 200)",
    )
    .await;
    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '8')",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op)",
    )
    .await;
    assert_eq!(deletion_vector_files(&s, "t").await, (8, 0, 0));

    // two keys of 200: a vector on the files holding them, new files for their rows
    exec(
        &s,
        "CREATE OR REPLACE TABLE src (id BIGINT, v TEXT, op TEXT, seq BIGINT) AS VALUES (7, 'changed', 'U', 2), (9, NULL, 'D', 2)",
    )
    .await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    // (7 and 9 fall in two buckets: a new file in each)
    assert!(analyzed.contains("num_files_written=2"), "{analyzed}");
    assert!(analyzed.contains("num_upserted_rows=1"), "{analyzed}");
    assert!(analyzed.contains("num_deleted_rows=1"), "{analyzed}");
    // the fold reads the 2 stored rows of those keys, not the 200: they
    // were found by key before it ran and are read by position
    let scan = analyzed
        .lines()
        .find(|l| l.contains("StoredRowsExec"))
        .unwrap_or_else(|| panic!("no read of the stored rows by position: {analyzed}"));
    assert!(
        scan.contains("StoredRowsExec: files=2, rows=2,")
            && scan.contains("output_rows=2,")
            && scan.contains("output_batches=2]")
            && !scan.contains("elapsed_compute=2ns")
            && !scan.contains("output_bytes=0.0 B"),
        "{analyzed}"
    );
    assert!(!analyzed.contains("HashJoinExec"), "{analyzed}");
    assert_eq!(deletion_vector_files(&s, "t").await, (10, 2, 2));
    assert_eq!(
        rows(
            &s,
            "SELECT count(*), max(v) FILTER (WHERE id = 7), count(*) FILTER (WHERE id = 9) FROM t"
        )
        .await,
        ["| 199 | changed | 0 |"]
    );
    assert_eq!(
        changes_since(&s, 2).await,
        [
            "| 7 | changed | update_postimage |",
            "| 7 | v | update_preimage |",
            "| 9 | v | delete |",
        ]
    );

    // the same key again: the file of its last row held only that row and
    // goes; the vectors of the first files stay as they were
    exec(
        &s,
        "CREATE OR REPLACE TABLE src (id BIGINT, v TEXT, op TEXT, seq BIGINT) AS VALUES (7, 'again', 'U', 3)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    let (files, _, deleted) = deletion_vector_files(&s, "t").await;
    assert_eq!((files, deleted), (10, 2));
    let expected = ["| 199 | again | 0 |"];
    let query =
        "SELECT count(*), max(v) FILTER (WHERE id = 7), count(*) FILTER (WHERE id = 9) FROM t";
    assert_eq!(rows(&s, query).await, expected);

    // deltalake's own reader applies the vectors: one stored row per key
    // (the tombstone of 9 included)
    let (_, ctx) = open_raw(state_dir(&dir, "t")).await;
    let batches = ctx
        .sql("SELECT count(*), count(DISTINCT id), max(v) FILTER (WHERE id = 7), max(__cdc_kind) FILTER (WHERE id = 9) FROM raw WHERE __cdc_kind IN (0, 1)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(lines(&batches), ["| 200 | 200 | again | 1 |"]);

    // a new process reads the vectors back
    drop(s);
    let s = CdcSession::open(AutoCdcConfig::new(&warehouse))
        .await
        .unwrap();
    assert_eq!(rows(&s, query).await, expected);

    // ten more keys: files that already have a vector get the union of old
    // and new rows (the vectors are read back from storage)
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT value AS id, 'ten' AS v, 'U' AS op, 4 AS seq FROM generate_series(20, 29)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    let (_, with_vectors, deleted) = deletion_vector_files(&s, "t").await;
    assert_eq!(deleted, 12);
    assert!(with_vectors >= 2, "{with_vectors}");
    assert_eq!(
        rows(&s, "SELECT count(*), count(*) FILTER (WHERE v = 'ten'), max(v) FILTER (WHERE id = 7) FROM t").await,
        ["| 199 | 10 | again |"]
    );

    // a large update rewrites its buckets: no vector is left
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT value AS id, 'all' AS v, 'U' AS op, 10 AS seq FROM generate_series(1, 200)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(deletion_vector_files(&s, "t").await, (8, 0, 0));
    assert_eq!(
        rows(&s, "SELECT count(*), min(v), max(v) FROM t").await,
        ["| 200 | all | all |"]
    );
}

/// A session on a warehouse in `dir` whose SCD 1 target `t` (table
/// properties `properties`, e.g. `'autocdc.buckets' = '4'`) holds keys
/// 1..=200 (`v` = 'v') from flow `f` over the memory table `src`.
async fn two_hundred_keys(dir: &tempfile::TempDir, properties: &str) -> CdcSession {
    let s = CdcSession::open(AutoCdcConfig::new(dir.path().to_str().unwrap()))
        .await
        .unwrap();
    exec(
        &s,
        "CREATE TABLE src AS SELECT value AS id, 'v' AS v, 1 AS seq FROM generate_series(1, 200)",
    )
    .await;
    exec(
        &s,
        &format!("CREATE STREAMING TABLE t TBLPROPERTIES ({properties})"),
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await;
    s
}

/// The data and change files of a table created with
/// `'autocdc.compression' = 'lz4'` are LZ4 Parquet, from its first load to
/// a small update that probes and retires rows in them, and read back
/// exactly; a value naming no codec is refused at CREATE.
#[tokio::test]
async fn a_tables_compression_property_sets_the_codec_of_its_files() {
    use deltalake_core::parquet::basic::Compression;
    use deltalake_core::parquet::file::reader::{FileReader, SerializedFileReader};

    let dir = tempfile::tempdir().unwrap();
    let s = two_hundred_keys(
        &dir,
        "'autocdc.compression' = 'lz4', 'autocdc.buckets' = '4'",
    )
    .await;
    exec(
        &s,
        "CREATE OR REPLACE TABLE src (id BIGINT, v TEXT, seq BIGINT) AS VALUES (7, 'changed', 2), (300, 'new', 2)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        deletion_vector_files(&s, "t").await.1,
        1,
        "rows retired in place"
    );
    assert_eq!(
        rows(
            &s,
            "SELECT count(*), max(v) FILTER (WHERE id = 7), max(v) FILTER (WHERE id = 300) FROM t"
        )
        .await,
        ["| 201 | changed | new |"]
    );
    assert_eq!(
        changes_since(&s, 2).await,
        [
            "| 7 | changed | update_postimage |",
            "| 7 | v | update_preimage |",
            "| 300 | new | insert |",
        ]
    );
    // every data and change file on disk (not Delta's own checkpoints)
    let mut files = Vec::new();
    let mut folders = vec![dir.path().to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.ends_with("_delta_log") {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "parquet") {
                files.push(path);
            }
        }
    }
    assert!(files
        .iter()
        .any(|f| f.to_string_lossy().contains("_change_data")));
    assert!(files.len() >= 6, "{files:?}");
    for file in &files {
        assert!(file.to_string_lossy().ends_with(".lz4.parquet"), "{file:?}");
        let reader = SerializedFileReader::new(std::fs::File::open(file).unwrap()).unwrap();
        for group in reader.metadata().row_groups() {
            for column in group.columns() {
                assert_eq!(column.compression(), Compression::LZ4_RAW, "{file:?}");
            }
        }
    }

    let error = s
        .sql("CREATE STREAMING TABLE u TBLPROPERTIES ('autocdc.compression' = 'gzip')")
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        error.contains(
            "streaming table 'u': autocdc.compression must be one of zstd, lz4, snappy, got 'gzip'"
        ),
        "{error}"
    );
    assert!(
        !dir.path().join("public/u").exists(),
        "nothing written for u"
    );
}

/// SCD 1 DML of few keys of a large table costs what it changes: each
/// statement writes a file for its new rows and retires the stored rows of
/// its keys with deletion vectors, leaving every other file as it was; a
/// statement over most keys rewrites the table. Rows and change feed are
/// exact either way.
#[tokio::test]
async fn small_scd1_dml_retires_rows_with_deletion_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_hundred_keys(&dir, "'autocdc.buckets' = '8'").await;
    assert_eq!(deletion_vector_files(&s, "t").await, (8, 0, 0));
    let key = |id: i64| format!("SELECT id, v, seq FROM t WHERE id = {id}");

    // UPDATE of one key: one new file, a vector of one row
    exec(&s, "UPDATE t SET v = 'u' WHERE id = 7").await;
    assert_eq!(deletion_vector_files(&s, "t").await, (9, 1, 1));
    assert_eq!(rows(&s, &key(7)).await, ["| 7 | u | 1 |"]);
    // DELETE of one key: its tombstone replaces its row
    exec(&s, "DELETE FROM t WHERE id = 9").await;
    let (files, vectors, deleted) = deletion_vector_files(&s, "t").await;
    assert_eq!((files, deleted), (10, 2), "{vectors}");
    // INSERT of the deleted key: the new row replaces its tombstone
    exec(&s, "INSERT INTO t VALUES (9, 'back', 5)").await;
    let (files, _, deleted) = deletion_vector_files(&s, "t").await;
    assert_eq!((files, deleted), (10, 2));
    assert_eq!(rows(&s, &key(9)).await, ["| 9 | back | 5 |"]);
    // MERGE of two keys
    exec(
        &s,
        "MERGE INTO t USING (SELECT 7 AS id, 'm' AS v UNION ALL SELECT 300, 'new') AS src \
         ON t.id = src.id WHEN MATCHED THEN UPDATE SET v = src.v \
         WHEN NOT MATCHED THEN INSERT (id, v, seq) VALUES (src.id, src.v, 1)",
    )
    .await;
    assert_eq!(
        rows(
            &s,
            "SELECT count(*), count(*) FILTER (WHERE v = 'v') FROM t"
        )
        .await,
        ["| 201 | 198 |"]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT id, v, _change_type, _commit_version FROM table_changes('t', 2) \
             ORDER BY _commit_version, id, _change_type"
        )
        .await,
        [
            "| 7 | u | update_postimage | 2 |",
            "| 7 | v | update_preimage | 2 |",
            "| 9 | v | delete | 3 |",
            "| 9 | back | insert | 4 |",
            "| 7 | m | update_postimage | 5 |",
            "| 7 | u | update_preimage | 5 |",
            "| 300 | new | insert | 5 |",
        ]
    );
    // a key the WHERE names whose row it does not match keeps its row, and
    // the change feed has nothing of it
    assert_eq!(
        rows(&s, "UPDATE t SET v = 'no' WHERE id = 8 AND v = 'other'").await,
        ["| 0 |"]
    );
    assert_eq!(
        rows(
            &s,
            "DELETE FROM t WHERE id IN (8, 100000, NULL) AND v = 'other'"
        )
        .await,
        ["| 0 |"]
    );
    assert_eq!(rows(&s, &key(8)).await, ["| 8 | v | 1 |"]);
    assert_eq!(
        rows(&s, "SELECT count(*) FROM table_changes('t', 6)").await,
        ["| 0 |"]
    );
    // the next event of a key DML wrote applies by the stored sequence
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT * FROM (VALUES (7, 'late', 0), (9, 'event', 2)) \
         AS s(id, v, seq)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(&s, "SELECT id, v FROM t WHERE id IN (7, 9) ORDER BY id").await,
        ["| 7 | m |", "| 9 | event |"]
    );

    // an UPDATE of every key rewrites the table: no vector is left
    exec(&s, "UPDATE t SET v = 'all'").await;
    let (_, vectors, _) = deletion_vector_files(&s, "t").await;
    assert_eq!(vectors, 0);
    assert_eq!(
        rows(&s, "SELECT count(*), count(DISTINCT v) FROM t").await,
        ["| 201 | 1 |"]
    );
}

/// The data files of the streaming table `name`'s state store.
async fn file_views(s: &CdcSession, name: &str) -> Vec<deltalake_core::kernel::LogicalFileView> {
    use futures::TryStreamExt;
    let t = s
        .streaming_table(&datafusion_autocdc::table::TableName::parse(name).unwrap())
        .unwrap();
    let delta = t.delta();
    let log_store = delta.log_store();
    delta
        .snapshot()
        .unwrap()
        .snapshot()
        .file_views(log_store.as_ref(), None)
        .try_collect()
        .await
        .unwrap()
}

/// Data files and deletion vectors of each key bucket of `name`:
/// `(bucket, files, vectors)`, by bucket.
async fn files_per_bucket(s: &CdcSession, name: &str) -> Vec<(i32, usize, usize)> {
    let views = file_views(s, name).await;
    let mut buckets = std::collections::BTreeMap::<i32, (usize, usize)>::new();
    for view in &views {
        let bucket = view
            .partition_values_map()
            .get("__cdc_bucket")
            .cloned()
            .flatten()
            .and_then(|b| b.parse::<i32>().ok())
            .unwrap();
        let entry = buckets.entry(bucket).or_default();
        entry.0 += 1;
        entry.1 += usize::from(view.deletion_vector_descriptor().is_some());
    }
    buckets.into_iter().map(|(b, (f, v))| (b, f, v)).collect()
}

/// Small updates add a file to each bucket they touch and retire stored
/// rows with deletion vectors; each such update also compacts the fullest
/// ⌈touched ÷ limit⌉ of its buckets holding more than half
/// `autocdc.deletion_vector_max_files_per_bucket` files: it reads them
/// whole and rewrites each into one file without vectors, while the other
/// buckets keep their vectors — the same rows and an exact change feed.
#[tokio::test]
async fn small_updates_compact_their_fullest_buckets_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_hundred_keys(&dir, "'autocdc.buckets' = '2'").await;
    exec(&s, "SET autocdc.deletion_vector_max_files_per_bucket = 2").await;
    assert_eq!(files_per_bucket(&s, "t").await, [(0, 1, 0), (1, 1, 0)]);
    let update = |first: i64, seq: i64| {
        format!(
            "CREATE OR REPLACE TABLE src AS SELECT value AS id, 'u{seq}' AS v, {seq} AS seq FROM generate_series({first}, {})",
            first + 7
        )
    };
    // eight keys in both buckets: vectors on the first files, a new file in
    // each bucket
    exec(&s, &update(1, 2)).await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(files_per_bucket(&s, "t").await, [(0, 2, 1), (1, 2, 1)]);
    // both buckets hold more than 2 ÷ 2 files: the fuller-or-lower one
    // (bucket 0) is compacted, bucket 1 takes vectors and a third file
    exec(&s, &update(11, 3)).await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    assert!(analyzed.contains("StoredRowsExec"), "{analyzed}");
    assert_eq!(files_per_bucket(&s, "t").await, [(0, 1, 0), (1, 3, 1)]);
    // then the fuller bucket 1; bucket 0 takes vectors
    exec(&s, &update(21, 4)).await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(files_per_bucket(&s, "t").await, [(0, 2, 1), (1, 1, 0)]);
    assert_eq!(
        rows(&s, "SELECT v, count(*) FROM t GROUP BY v ORDER BY v").await,
        ["| u2 | 8 |", "| u3 | 8 |", "| u4 | 8 |", "| v | 176 |"]
    );
    for (version, seq, first) in [(3, 3, 11), (4, 4, 21)] {
        let feed = rows(
            &s,
            &format!("SELECT _change_type, count(*), min(id), max(id), min(v), max(v) FROM table_changes('t', {version}, {version}) GROUP BY _change_type ORDER BY _change_type"),
        )
        .await;
        assert_eq!(
            feed,
            [
                format!(
                    "| update_postimage | 8 | {first} | {} | u{seq} | u{seq} |",
                    first + 7
                ),
                format!("| update_preimage | 8 | {first} | {} | v | v |", first + 7),
            ]
        );
    }
    // without a limit, nothing is compacted
    exec(&s, "SET autocdc.deletion_vector_max_files_per_bucket = 0").await;
    exec(&s, &update(31, 5)).await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(files_per_bucket(&s, "t").await, [(0, 3, 1), (1, 2, 1)]);
}

/// A change feed read from a version a Delta tool has cleaned out of the
/// table's log (as its `delta.logRetentionDuration` allows; our commits
/// never clean it) says so, naming the table and the version, where
/// deltalake says "Invalid table version: 1"; later versions still read.
#[tokio::test]
async fn a_change_feed_from_a_cleaned_up_version_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().join("wh");
    let s = CdcSession::open(AutoCdcConfig::new(warehouse.to_str().unwrap()))
        .await
        .unwrap();
    exec(&s, "CREATE TABLE src (id INT, seq INT) AS VALUES (1, 1)").await;
    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('delta.checkpointInterval' = '2')",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await;
    for id in 2..=4 {
        exec(&s, &format!("INSERT INTO src VALUES ({id}, {id})")).await;
        exec(&s, "REFRESH STREAMING TABLE t").await;
    }
    drop(s);
    // the table at the path cleaned up to its checkpoint at version 3
    let log = warehouse.join("public/t/_delta_log");
    for file in [
        "00000000000000000000.json",
        "00000000000000000001.json",
        "00000000000000000001.checkpoint.parquet",
        "00000000000000000002.json",
    ] {
        std::fs::remove_file(log.join(file)).unwrap();
    }
    let s = CdcSession::open(AutoCdcConfig::new(warehouse.to_str().unwrap()))
        .await
        .unwrap();
    let err = match s.sql("SELECT count(*) FROM table_changes('t', 1)").await {
        Ok(df) => df.collect().await.map(|_| ()),
        Err(e) => Err(e),
    }
    .expect_err("version 1 is gone");
    assert!(
        err.to_string().contains(
            "the change data feed of 't' from version 1: version 1 is no longer in its log"
        ),
        "{err}"
    );
    assert_eq!(
        rows(&s, "SELECT count(*) FROM table_changes('t', 3)").await,
        ["| 2 |"]
    );
}

/// Commits write a Delta checkpoint every `delta.checkpointInterval`
/// versions, so a table opens from its last checkpoint instead of
/// replaying every commit. The checkpoint keeps the deletion vectors, the
/// flow definitions and the flows' checkpoints; the older commits stay, for
/// the change feed.
#[tokio::test]
async fn commits_write_delta_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let warehouse = dir.path().to_str().unwrap().to_string();
    let s = two_hundred_keys(
        &dir,
        "'delta.checkpointInterval' = '3', 'autocdc.buckets' = '4'",
    )
    .await;
    // small updates of two keys: deletion vectors
    for seq in 2..=6 {
        exec(
            &s,
            &format!("CREATE OR REPLACE TABLE src (id BIGINT, v TEXT, seq BIGINT) AS VALUES (1, 'v{seq}', {seq}), ({seq}, 'new', {seq})"),
        )
        .await;
        exec(&s, "REFRESH STREAMING TABLE t").await;
    }
    let log = state_dir(&dir, "t").join("_delta_log");
    let mut checkpoints: Vec<String> = std::fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".checkpoint"))
        .collect();
    checkpoints.sort();
    let versions = rows(&s, "SELECT max(_commit_version) FROM table_changes('t', 0)").await;
    assert_eq!(versions, ["| 6 |"]);
    // versions 2 and 5 end a run of 3 commits
    assert_eq!(
        checkpoints,
        [
            "00000000000000000002.checkpoint.parquet",
            "00000000000000000005.checkpoint.parquet"
        ]
    );
    assert!(log.join("_last_checkpoint").exists());
    assert!(log.join("00000000000000000000.json").exists());
    let files = deletion_vector_files(&s, "t").await;
    assert!(files.1 > 0, "{files:?}");
    let query =
        "SELECT count(*), count(*) FILTER (WHERE v = 'v'), max(v) FILTER (WHERE id = 1) FROM t";
    let expected = ["| 200 | 194 | v6 |"];
    assert_eq!(rows(&s, query).await, expected);

    // a new process opens the table from the checkpoint: the same rows and
    // vectors, the change feed still reaches the first commits, and the
    // flow goes on
    drop(s);
    let s = CdcSession::open(AutoCdcConfig::new(&warehouse))
        .await
        .unwrap();
    assert_eq!(rows(&s, query).await, expected);
    assert_eq!(deletion_vector_files(&s, "t").await, files);
    assert_eq!(
        rows(
            &s,
            "SELECT id, v, _change_type FROM table_changes('t', 2, 2) ORDER BY id, _change_type"
        )
        .await,
        [
            "| 1 | v2 | update_postimage |",
            "| 1 | v | update_preimage |",
            "| 2 | new | update_postimage |",
            "| 2 | v | update_preimage |"
        ]
    );
    exec(
        &s,
        "CREATE TABLE src (id BIGINT, v TEXT, seq BIGINT) AS VALUES (1, 'v7', 7)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(rows(&s, query).await, ["| 200 | 194 | v7 |"]);
}

/// Stored rows found while an update is planned are retired at commit only
/// if their files are still as they were: when another commit has given a
/// probed file a new vector in between, the positions could be wrong and
/// the retirement is refused (the update must run again).
#[tokio::test]
async fn rows_found_before_another_commit_are_not_retired() {
    use datafusion_autocdc::table::deletion_vectors::KeySet;
    use datafusion_autocdc::table::superseded::{Probing, Superseded};
    use futures::TryStreamExt;

    let dir = tempfile::tempdir().unwrap();
    let s = two_hundred_keys(&dir, "'autocdc.buckets' = '4'").await;
    let t = s
        .streaming_table(&datafusion_autocdc::table::TableName::parse("t").unwrap())
        .unwrap();
    let files = |delta: deltalake_core::DeltaTable| async move {
        let snapshot = delta.snapshot().unwrap().snapshot().clone();
        snapshot
            .file_views(delta.log_store().as_ref(), None)
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
    };

    // an update of key 7 is planned: its stored row is found
    let key = RecordBatch::try_from_iter([(
        "id",
        std::sync::Arc::new(datafusion::arrow::array::Int64Array::from(vec![7]))
            as datafusion::arrow::array::ArrayRef,
    )])
    .unwrap();
    let keys = std::sync::Arc::new(KeySet::try_new(vec!["id".into()], &[key]).unwrap());
    let store = t.delta().object_store();
    let planned = files(t.delta()).await;
    let probing = Probing::of(&s.context().state());
    let found = Superseded::find(&store, keys, planned.clone(), &probing)
        .await
        .unwrap();
    // (retiring it against the table as planned is fine: a remove and an add)
    assert_eq!(found.retire(&store, &planned).await.unwrap().len(), 2);

    // meanwhile another update of key 7 commits a vector on that file
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT 7 AS id, 'other' AS v, 2 AS seq",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    t.refresh().await.unwrap();
    let now = files(t.delta()).await;
    let err = found.retire(&store, &now).await.unwrap_err().to_string();
    assert!(
        err.contains("changed after the update was planned") && err.contains("run it again"),
        "{err}"
    );
}

/// A damaged deletion vector stops the update that needs it with an error
/// naming the vector file; nothing is committed. (The process that wrote
/// the vector keeps its bytes and reads them from memory: a process that
/// opens the table after the damage meets it.)
#[tokio::test]
async fn a_damaged_deletion_vector_fails_the_update_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let s = two_hundred_keys(&dir, "'autocdc.buckets' = '4'").await;
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT 7 AS id, 'changed' AS v, 2 AS seq",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    let table_dir = state_dir(&dir, "t");
    let vector = std::fs::read_dir(&table_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("deletion_vector_"))
        .expect("a deletion vector file");
    let mut bytes = std::fs::read(&vector).unwrap();
    let last = bytes.len() - 6;
    bytes[last] ^= 0xff;
    std::fs::write(&vector, bytes).unwrap();
    drop(s);
    let s = CdcSession::open(AutoCdcConfig::new(dir.path().to_str().unwrap()))
        .await
        .unwrap();
    let t = s
        .streaming_table(&datafusion_autocdc::table::TableName::parse("t").unwrap())
        .unwrap();
    let version = t.delta().version();

    // key 7 again: its first file's vector must be read to add to it
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT 7 AS id, 'again' AS v, 3 AS seq",
    )
    .await;
    // (finding the stored rows of the update's keys meets the damage first)
    let err = match s.sql("REFRESH STREAMING TABLE t").await {
        Ok(df) => df.collect().await.unwrap_err(),
        Err(e) => e,
    }
    .to_string();
    let name = vector.file_name().unwrap().to_string_lossy().to_string();
    for needle in ["checksum", name.as_str(), "flow 'f'"] {
        assert!(err.contains(needle), "missing {needle} in: {err}");
    }
    t.refresh().await.unwrap();
    assert_eq!(t.delta().version(), version);
}

/// A snapshot that differs from the target in few keys is applied like a
/// small change feed: deletion vectors on the files holding those keys, new
/// rows in new files; the target equals the snapshot and the change feed
/// holds the diff.
#[tokio::test]
async fn small_snapshot_diffs_use_deletion_vectors() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(
        &s,
        "CREATE TABLE snap AS SELECT value AS id, 'v' AS v FROM generate_series(1, 200)",
    )
    .await;
    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '4')",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM SNAPSHOT (SELECT * FROM snap) KEYS (id) STORED AS SCD TYPE 1",
    )
    .await;
    assert_eq!(deletion_vector_files(&s, "t").await, (4, 0, 0));
    // 5 changed, 3 deleted, 2 new keys
    exec(
        &s,
        "CREATE OR REPLACE TABLE snap AS
           SELECT value AS id, CASE WHEN value <= 5 THEN 'changed' ELSE 'v' END AS v
           FROM generate_series(1, 202) WHERE value NOT IN (10, 11, 12)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    let (files, with_vectors, deleted) = deletion_vector_files(&s, "t").await;
    assert!(with_vectors > 0 && files > 4, "{files} {with_vectors}");
    assert_eq!(deleted, 8);
    assert_eq!(
        rows(&s, "SELECT count(*) FROM ((SELECT id, v FROM t EXCEPT ALL SELECT id, v FROM snap) UNION ALL (SELECT id, v FROM snap EXCEPT ALL SELECT id, v FROM t))").await,
        ["| 0 |"]
    );
    assert_eq!(
        rows(&s, "SELECT _change_type, count(*) FROM table_changes('t', 2) GROUP BY _change_type ORDER BY _change_type").await,
        [
            "| delete | 3 |",
            "| insert | 2 |",
            "| update_postimage | 5 |",
            "| update_preimage | 5 |",
        ]
    );
}

/// The indexed snapshot diff hands its rows to a sort when it may not hold
/// them, with the same result.
#[tokio::test]
async fn indexed_snapshot_diff_falls_back_to_sorting() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(
        &s,
        "CREATE TABLE snap (id INT, v TEXT) AS VALUES (1, 'a'), (2, 'b'), (3, 'c')",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM SNAPSHOT (SELECT * FROM snap) KEYS (id)",
    )
    .await;
    exec(
        &s,
        "CREATE OR REPLACE TABLE snap (id INT, v TEXT) AS VALUES (1, 'a'), (2, 'B'), (4, 'd')",
    )
    .await;
    exec(&s, "SET autocdc.indexed_fold_max_bytes = 1").await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    let diff = analyzed
        .lines()
        .find(|l| l.contains("SnapshotDiffExec"))
        .expect(&analyzed);
    assert!(diff.contains("diff=indexed"), "{diff}");
    assert!(!diff.contains("num_sort_fallbacks=0"), "{diff}");
    assert!(diff.contains("num_sort_fallbacks="), "{diff}");
    assert!(
        diff.contains("num_upserts=2") && diff.contains("num_deletes=1"),
        "{diff}"
    );
    assert_eq!(
        rows(&s, "SELECT id, v FROM t ORDER BY id").await,
        ["| 1 | a |", "| 2 | B |", "| 4 | d |"]
    );
}

/// Retention: a tombstone blocks a late upsert until it expires
/// (`pipelines.cdc.tombstoneGCThresholdInSeconds`, by the session clock).
#[tokio::test]
async fn tombstones_expire_after_the_retention_threshold() {
    use std::sync::Arc;

    use chrono::{Duration, TimeZone, Utc};
    use datafusion_autocdc::clock::ManualClock;

    let clock = Arc::new(ManualClock::new(
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
    ));
    let s = CdcSession::open(AutoCdcConfig::in_memory().with_clock(clock.clone()))
        .await
        .unwrap();
    exec(&s, "CREATE STREAMING TABLE t TBLPROPERTIES ('pipelines.cdc.tombstoneGCThresholdInSeconds' = '3600')").await;
    exec(&s, "CREATE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES (1, 'a', 'U', 1), (1, NULL, 'D', 5), (2, 'b', 'U', 1)").await;
    exec(&s, "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, v)").await;
    assert_eq!(rows(&s, "SELECT * FROM t ORDER BY id").await, ["| 2 | b |"]);

    // before expiry the tombstone (sequence 5) blocks a late upsert at 3
    clock.advance(Duration::minutes(59));
    exec(&s, "CREATE OR REPLACE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES (1, 'late', 'U', 3)").await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(rows(&s, "SELECT * FROM t ORDER BY id").await, ["| 2 | b |"]);

    // after expiry it is gone: the late upsert applies as new
    clock.advance(Duration::minutes(2));
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(&s, "SELECT * FROM t ORDER BY id").await,
        ["| 1 | late |", "| 2 | b |"]
    );
}

#[allow(dead_code)]
#[path = "../../../examples/bitemporal.rs"]
mod bitemporal_example;

/// `examples/bitemporal.rs`: the BITEMPORAL example table and both as-of answers.
#[tokio::test]
async fn bitemporal_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let answers = bitemporal_example::run(dir.path().to_str().unwrap())
        .await
        .unwrap();
    assert_eq!(
        lines(&answers.table),
        [
            "| A | XFv1 | 2024-06-01T10:01:00 | | 2024-06-01T10:05:00 | 2024-06-01T12:20:00 |",
            "| A | XFv1 | 2024-06-01T10:01:00 | 2024-06-01T12:15:43 | 2024-06-01T12:20:00 | 2024-06-01T12:25:00 |",
            "| A | XFv1 | 2024-06-01T10:01:00 | 2024-06-01T12:05:00 | 2024-06-01T12:25:00 | |",
            "| A | XFv3 | 2024-06-01T12:05:00 | 2024-06-01T12:15:43 | 2024-06-01T12:25:00 | |",
            "| A | XFv2 | 2024-06-01T12:15:43 | | 2024-06-01T12:20:00 | 2024-06-01T12:30:00 |",
            "| A | XFv2 | 2024-06-01T12:15:43 | 2024-06-01T12:30:00 | 2024-06-01T12:30:00 | |",
        ]
    );
    assert_eq!(lines(&answers.now), ["| A | XFv3 |"]);
    assert_eq!(lines(&answers.as_known), ["| A | XFv1 |"]);
}

#[allow(dead_code)]
#[path = "../../../examples/snapshot.rs"]
mod snapshot_example;

#[tokio::test]
async fn snapshot_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let batches = snapshot_example::run(
        dir.path().join("wh").to_str().unwrap(),
        &dir.path().join("snaps"),
    )
    .await
    .unwrap();
    assert_eq!(
        lines(&batches),
        [
            "| 1 | Oaxaca | 1 | 2 |",
            "| 2 | Monterrey | 1 | 2 |",
            "| 2 | Carmel | 2 | |",
            "| 3 | Tijuana | 1 | 2 |",
            "| 3 | Los Angeles | 2 | |",
            "| 4 | Death Valley | 2 | |",
            "| 6 | Kings Canyon | 2 | |",
        ]
    );
}

/// EXPLAIN shows SnapshotDiff under AutoCdc.
#[tokio::test]
async fn explain_snapshot_flow_shows_snapshot_diff() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(&s, "CREATE TABLE snap (id INT, v TEXT) AS VALUES (1, 'a')").await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM SNAPSHOT (SELECT * FROM snap) KEYS (id)",
    )
    .await;
    let plan = rows(&s, "EXPLAIN REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    let auto_cdc = plan.find("AutoCdc: flow=f").expect(&plan);
    let diff = plan.find("SnapshotDiff: flow=f, keys=[id]").expect(&plan);
    assert!(auto_cdc < diff, "SnapshotDiff under AutoCdc:\n{plan}");
    for op in [
        "AutoCdcExec",
        "SnapshotDiffExec: flow=f, keys=[id]",
        "diff=indexed",
    ] {
        assert!(plan.contains(op), "missing {op} in\n{plan}");
    }
    // the indexed diff (integer keys) needs no sort
    assert!(!plan.contains("SortExec"), "{plan}");
    // and over two partitions routes its rows itself (no repartition), as
    // the tree format says too
    exec(&s, "SET datafusion.execution.target_partitions = 2").await;
    let two = rows(&s, "EXPLAIN REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    assert!(two.contains("diff=indexed, key_exchange=2"), "{two}");
    assert!(!two.contains("RepartitionExec: partitioning=Hash"), "{two}");
    exec(&s, "SET datafusion.explain.format = 'tree'").await;
    let tree = rows(&s, "EXPLAIN REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    assert!(tree.contains("diff: indexed"), "{tree}");
    assert!(tree.contains("key_exchange: 2 "), "{tree}");
    exec(&s, "SET datafusion.explain.format = 'indent'").await;
    exec(&s, "SET autocdc.indexed_fold = false").await;
    let plan = rows(&s, "EXPLAIN REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    for op in ["diff=sorted", "SortExec"] {
        assert!(plan.contains(op), "missing {op} in\n{plan}");
    }
}

/// Snapshot flows report their metrics like change-feed flows.
#[tokio::test]
async fn snapshot_flow_metrics() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(
        &s,
        "CREATE TABLE snap (id INT, v TEXT) AS VALUES (1, 'a'), (2, 'b'), (3, 'c')",
    )
    .await;
    s.create_streaming_table("t").await.unwrap();
    let first = s
        .create_auto_cdc_from_snapshot_flow("t")
        .keys(["id"])
        .source("snap")
        .await
        .unwrap();
    assert_eq!(
        (first[0].num_upserted_rows, first[0].num_deleted_rows),
        (3, 0)
    );
    exec(
        &s,
        "CREATE OR REPLACE TABLE snap (id INT, v TEXT) AS VALUES (1, 'a'), (2, 'B')",
    )
    .await;
    let second = s.refresh_streaming_table("t", false).await.unwrap();
    assert_eq!(
        (
            second[0].num_upserted_rows,
            second[0].num_deleted_rows,
            second[0].num_input_rows
        ),
        (1, 1, 2)
    );
}

/// The change data feed reads the same through deltalake's own CDF reader.
#[tokio::test]
async fn change_feed_reads_through_deltalakes_reader() {
    let dir = tempfile::tempdir().unwrap();
    let s = CdcSession::open(AutoCdcConfig::new(dir.path().to_str().unwrap()))
        .await
        .unwrap();
    exec(&s, "CREATE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES (1, 'a', 'U', 1), (2, 'b', 'U', 1)").await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(&s, "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, v)").await;
    exec(
        &s,
        "INSERT INTO src VALUES (1, 'a2', 'U', 2), (2, NULL, 'D', 2)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    let ours = rows(&s, "SELECT id, v, _change_type, _commit_version FROM table_changes('t', 0) ORDER BY _commit_version, id, _change_type").await;

    let url = url::Url::from_directory_path(dir.path().join("public").join("t")).unwrap();
    let table = deltalake_core::DeltaTableBuilder::from_url(url)
        .unwrap()
        .load()
        .await
        .unwrap();
    let provider = deltalake_core::delta_datafusion::DeltaCdfTableProvider::try_new(
        table.scan_cdf().with_starting_version(0),
    )
    .unwrap();
    let ctx = SessionContext::new();
    ctx.register_table("feed", std::sync::Arc::new(provider))
        .unwrap();
    // (no ORDER BY here: over deltalake's raw CDF scan it trips the
    // zero-partition branch that table_changes() removes)
    let batches = ctx
        .sql("SELECT id, v, _change_type, _commit_version FROM feed")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut theirs = lines(&batches);
    let mut sorted_ours = ours.clone();
    theirs.sort();
    sorted_ours.sort();
    assert_eq!(sorted_ours, theirs);
    assert_eq!(
        ours,
        [
            "| 1 | a | insert | 1 |",
            "| 2 | b | insert | 1 |",
            "| 1 | a2 | update_postimage | 2 |",
            "| 1 | a | update_preimage | 2 |",
            "| 2 | b | delete | 2 |",
        ]
    );
}

/// The Rust builder's partial-update parameters behave like the SQL
/// clauses.
#[tokio::test]
async fn builder_partial_updates() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(&s, "CREATE TABLE feed (id INT, a TEXT, b TEXT, cols VARCHAR[], seq INT) AS VALUES (1, 'a1', 'b1', NULL, 1), (1, NULL, NULL, ['b'], 2)").await;
    // IGNORE NULL UPDATES ON * EXCEPT (b): a keeps a1, b takes the NULL
    s.create_streaming_table("t_ignore").await.unwrap();
    s.create_auto_cdc_flow("t_ignore", "feed")
        .keys(["id"])
        .sequence_by("seq")
        .except_column_list(["cols", "seq"])
        .ignore_null_updates_except_column_list(["b"])
        .await
        .unwrap();
    assert_eq!(rows(&s, "SELECT * FROM t_ignore").await, ["| 1 | a1 | |"]);
    // ON (b) only: a takes the NULL, b keeps b1
    s.create_streaming_table("t_on").await.unwrap();
    s.create_auto_cdc_flow("t_on", "feed")
        .keys(["id"])
        .sequence_by("seq")
        .except_column_list(["cols", "seq"])
        .ignore_null_updates_column_list(["b"])
        .await
        .unwrap();
    assert_eq!(rows(&s, "SELECT * FROM t_on").await, ["| 1 | | b1 |"]);
    // COLUMNS TO UPDATE cols: the second event writes only b (to NULL)
    s.create_streaming_table("t_cols").await.unwrap();
    s.create_auto_cdc_flow("t_cols", "feed")
        .keys(["id"])
        .sequence_by("seq")
        .except_column_list(["seq"])
        .columns_to_update("cols")
        .await
        .unwrap();
    assert_eq!(rows(&s, "SELECT * FROM t_cols").await, ["| 1 | a1 | |"]);
}

/// The line of `op` in an `EXPLAIN ANALYZE` output.
fn operator_line<'a>(analyzed: &'a str, op: &str) -> &'a str {
    analyzed
        .lines()
        .find(|l| l.contains(&format!("{op}:")))
        .unwrap_or_else(|| panic!("no {op} in\n{analyzed}"))
}

/// `EXPLAIN ANALYZE REFRESH` shows the writer and the commit with what each
/// did: on the small path (deletion vectors, no file removed), the large
/// path (the touched bucket rewritten) and for a snapshot diff.
#[tokio::test]
async fn write_and_commit_operators_report_their_work() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(
        &s,
        "CREATE TABLE src AS SELECT value AS id, 'v' AS v, 1 AS seq FROM generate_series(1, 200)",
    )
    .await;
    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '8')",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await;

    // small: one changed key, a deletion vector on its file, one new file
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT 7 AS id, 'changed' AS v, 2 AS seq",
    )
    .await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    let write = operator_line(&analyzed, "CdcWriteExec");
    for m in [
        "target=t",
        "buckets=8",
        "num_files_written=1,",
        // the live row and its update pre- and post-image
        "num_rows_written=3,",
        "num_change_files_written=1,",
        "write_time=",
    ] {
        assert!(write.contains(m), "missing {m} in {write}");
    }
    let commit = operator_line(&analyzed, "CdcCommitExec");
    for m in [
        "num_files_added=1,",
        "num_files_removed=0,",
        "commit_version=2",
        "commit_time=",
    ] {
        assert!(commit.contains(m), "missing {m} in {commit}");
    }

    // large: the touched bucket is rewritten
    exec(&s, "SET autocdc.deletion_vectors = false").await;
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT 7 AS id, 'again' AS v, 3 AS seq",
    )
    .await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    let write = operator_line(&analyzed, "CdcWriteExec");
    assert!(write.contains("num_files_written=1,"), "{write}");
    let commit = operator_line(&analyzed, "CdcCommitExec");
    // the bucket's file from the load and the one of the small update
    assert!(commit.contains("num_files_removed=2,"), "{commit}");
    assert!(commit.contains("num_files_added=1,"), "{commit}");
    assert_eq!(
        rows(&s, "SELECT count(*), max(v) FILTER (WHERE id = 7) FROM t").await,
        ["| 200 | again |"]
    );

    // a snapshot diff: everything replaced, one file per bucket
    exec(
        &s,
        "CREATE TABLE snap AS SELECT value AS id, 'w' AS v FROM generate_series(1, 100)",
    )
    .await;
    exec(
        &s,
        "CREATE STREAMING TABLE u TBLPROPERTIES ('autocdc.buckets' = '4')",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW g AS AUTO CDC INTO u FROM SNAPSHOT (SELECT * FROM snap) KEYS (id)",
    )
    .await;
    exec(
        &s,
        "CREATE OR REPLACE TABLE snap AS SELECT value AS id, 'x' AS v FROM generate_series(1, 100)",
    )
    .await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE u")
        .await
        .join("\n");
    let write = operator_line(&analyzed, "CdcWriteExec");
    assert!(write.contains("num_files_written=4,"), "{write}");
    // 100 live rows, 100 pre-images, 100 post-images
    assert!(write.contains("num_rows_written=300,"), "{write}");
    let commit = operator_line(&analyzed, "CdcCommitExec");
    assert!(commit.contains("num_files_removed=4,"), "{commit}");
    assert!(commit.contains("num_files_added=4,"), "{commit}");
}

/// Whether an operator follows `op` in a plan printed as table rows (whose
/// indentation is not kept): for the lowest operator of a chain, its input.
fn has_child(analyzed: &str, op: &str) -> bool {
    let lines: Vec<&str> = analyzed.lines().collect();
    lines
        .iter()
        .position(|l| l.contains(&format!("{op}:")))
        .and_then(|i| lines.get(i + 1))
        .is_some_and(|next| next.contains("Exec:"))
}

/// `EXPLAIN ANALYZE` of `UPDATE`, `DELETE`, `INSERT` and `MERGE` shows each
/// statement as a plan: its rows (`DmlRowsExec`, an `INSERT`'s rows as its
/// child), the writer and the commit, with what each did — on SCD 1 (few
/// keys: deletion vectors; past the budget: a rewrite) and SCD 2 targets
/// (`UPDATE`, `DELETE`, `INSERT`, `MERGE`).
#[tokio::test]
async fn dml_statements_run_as_write_and_commit_plans() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(
        &s,
        "CREATE TABLE src AS SELECT value AS id, 'v' AS v, 1 AS seq FROM generate_series(1, 100)",
    )
    .await;
    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '4')",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await;
    let analyze = |sql: &'static str| {
        let s = &s;
        async move { rows(s, &format!("EXPLAIN ANALYZE {sql}")).await.join("\n") }
    };
    let expect = |analyzed: &str, op: &str, marks: &[&str]| {
        let line = operator_line(analyzed, op);
        for m in marks {
            assert!(line.contains(m), "missing {m} in {line}\n{analyzed}");
        }
    };

    // UPDATE of one key: one file written, its stored row's file retired
    // with a deletion vector
    let analyzed = analyze("UPDATE t SET v = 'u' WHERE id = 7").await;
    expect(
        &analyzed,
        "DmlRowsExec",
        &["statement=UPDATE", "num_files_retired=1", "rewrite=0"],
    );
    expect(
        &analyzed,
        "CdcWriteExec",
        // the live row, its pre- and post-image
        &["target=t", "num_files_written=1,", "num_rows_written=3,"],
    );
    expect(
        &analyzed,
        "CdcCommitExec",
        &[
            "statement=UPDATE",
            "num_files_added=1,",
            "num_files_removed=1,",
        ],
    );
    assert_eq!(rows(&s, "SELECT v FROM t WHERE id = 7").await, ["| u |"]);

    // DELETE of two keys: two tombstones and their two change rows
    let analyzed = analyze("DELETE FROM t WHERE id IN (1, 2)").await;
    expect(&analyzed, "DmlRowsExec", &["statement=DELETE", "rewrite=0"]);
    expect(&analyzed, "CdcWriteExec", &["num_rows_written=4,"]);
    expect(&analyzed, "CdcCommitExec", &["statement=DELETE"]);
    assert!(!has_child(&analyzed, "DmlRowsExec"), "{analyzed}");
    assert_eq!(rows(&s, "SELECT count(*) FROM t").await, ["| 98 |"]);

    // INSERT: its rows are the input of the statement's rows
    let analyzed = analyze("INSERT INTO t VALUES (1, 'back', 5)").await;
    expect(&analyzed, "DmlRowsExec", &["statement=INSERT"]);
    assert!(has_child(&analyzed, "DmlRowsExec"), "{analyzed}");
    expect(&analyzed, "CdcCommitExec", &["statement=INSERT"]);
    assert_eq!(rows(&s, "SELECT v FROM t WHERE id = 1").await, ["| back |"]);

    // MERGE
    let analyzed = analyze(
        "MERGE INTO t USING (SELECT 3 AS id, 'm' AS v) AS s ON t.id = s.id \
         WHEN MATCHED THEN UPDATE SET v = s.v",
    )
    .await;
    expect(&analyzed, "DmlRowsExec", &["statement=MERGE", "rewrite=0"]);
    expect(&analyzed, "CdcWriteExec", &["num_files_written=1,"]);
    expect(&analyzed, "CdcCommitExec", &["statement=MERGE"]);
    assert_eq!(rows(&s, "SELECT v FROM t WHERE id = 3").await, ["| m |"]);

    // past the deletion-vector budget, the statement rewrites every file
    exec(&s, "SET autocdc.deletion_vector_max_fraction = 0").await;
    let analyzed = analyze("UPDATE t SET v = 'all'").await;
    expect(&analyzed, "DmlRowsExec", &["rewrite=1"]);
    // 99 live rows, their pre- and post-images, key 2's tombstone: a file
    // of live rows per bucket and one of the tombstone
    expect(&analyzed, "CdcWriteExec", &["num_rows_written=298,"]);
    expect(&analyzed, "CdcCommitExec", &["num_files_added=5,"]);
    assert_eq!(
        rows(&s, "SELECT count(*), min(v), max(v) FROM t").await,
        ["| 99 | all | all |"]
    );
    // nothing of these statements is left out of the event log
    assert_eq!(
        rows(
            &s,
            "SELECT operation, count(*) FROM event_log('t') \
             WHERE operation IN ('UPDATE', 'DELETE', 'INSERT', 'MERGE') \
             GROUP BY operation ORDER BY operation"
        )
        .await,
        [
            "| DELETE | 1 |",
            "| INSERT | 1 |",
            "| MERGE | 1 |",
            "| UPDATE | 2 |"
        ]
    );

    // SCD 2: a statement is an update of the keys' histories
    exec(
        &s,
        "CREATE STREAMING TABLE h TBLPROPERTIES ('autocdc.buckets' = '4')",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW g AS AUTO CDC INTO h FROM src KEYS (id) SEQUENCE BY seq STORED AS SCD TYPE 2",
    )
    .await;
    for sql in [
        "UPDATE h SET v = 'w' WHERE id = 5",
        "DELETE FROM h WHERE id = 6",
        "INSERT INTO h VALUES (500, 'n', 1, 10, NULL)",
        "MERGE INTO h USING (SELECT 7 AS id, 'm' AS v) AS s \
         ON h.id = s.id AND h.__END_AT IS NULL WHEN MATCHED THEN UPDATE SET v = s.v",
    ] {
        let analyzed = analyze(sql).await;
        expect(&analyzed, "AutoCdcExec", &[]);
        expect(
            &analyzed,
            "CdcWriteExec",
            &["target=h", "num_files_written="],
        );
        expect(
            &analyzed,
            "CdcCommitExec",
            &["target=h", "num_files_added="],
        );
    }
    assert_eq!(
        rows(
            &s,
            "SELECT count(*), count(*) FILTER (WHERE id = 500), \
             count(*) FILTER (WHERE id = 6) FROM h"
        )
        .await,
        ["| 100 | 1 | 0 |"]
    );
    assert_eq!(
        rows(&s, "SELECT v FROM h WHERE id IN (5, 7) ORDER BY id").await,
        ["| w |", "| m |"]
    );
}

/// `create_streaming_table` takes the Python parameters `schema` (a column
/// list in SQL) and `table_properties`; a flow then fills the declared
/// columns, and a schema that is not a column list is refused with nothing
/// created.
#[tokio::test]
async fn create_streaming_table_takes_a_schema_and_properties() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    s.create_streaming_table("typed")
        .schema("id BIGINT, amount DECIMAL(10, 2), name STRING")
        .table_properties([("autocdc.buckets", "4")])
        .await
        .unwrap();
    let t = s
        .streaming_table(&datafusion_autocdc::table::TableName::parse("typed").unwrap())
        .unwrap();
    assert_eq!(t.meta().buckets, 4);
    let schema = s.sql("SELECT * FROM typed").await.unwrap().schema().clone();
    let columns: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect();
    assert_eq!(
        columns,
        ["id Int64", "amount Decimal128(10, 2)", "name Utf8View"]
    );
    exec(
        &s,
        "CREATE TABLE feed (id BIGINT, amount DECIMAL(10, 2), name TEXT, seq INT) AS VALUES (1, 2.50, 'a', 1)",
    )
    .await;
    let run = s
        .create_auto_cdc_flow("typed", "feed")
        .keys(["id"])
        .sequence_by("seq")
        .except_column_list(["seq"])
        .await
        .unwrap();
    assert_eq!(run.num_upserted_rows, 1);
    assert_eq!(rows(&s, "SELECT * FROM typed").await, ["| 1 | 2.50 | a |"]);

    let refused = s
        .create_streaming_table("untyped")
        .schema("id")
        .await
        .expect_err("a column without a type is refused");
    assert!(
        refused
            .to_string()
            .contains("create_streaming_table('untyped'): schema 'id' is not a column list"),
        "{refused}"
    );
    assert!(s.sql("SELECT * FROM untyped").await.is_err());
    // and one going on past its columns (what follows would be lost)
    let refused = s
        .create_streaming_table("tail")
        .schema("id BIGINT) AS SELECT 1 AS id --")
        .await
        .expect_err("a query after the columns is refused");
    assert!(
        refused
            .to_string()
            .contains("schema 'id BIGINT) AS SELECT 1 AS id --' is not a column list ('name TYPE, ...'): it goes on after the columns"),
        "{refused}"
    );
    assert!(s.sql("SELECT * FROM tail").await.is_err());

    // the name is the table's own (Rust names are not SQL), with a schema as
    // without one
    s.create_streaming_table("Mixed")
        .schema("id BIGINT, v STRING")
        .await
        .unwrap();
    s.create_streaming_table("Sp Tbl")
        .schema("id BIGINT")
        .await
        .unwrap();
    let mixed = s.sql("SELECT * FROM \"Mixed\"").await.unwrap();
    let names: Vec<&String> = mixed.schema().fields().iter().map(|f| f.name()).collect();
    assert_eq!(names, ["id", "v"]);
    assert!(s.sql("SELECT * FROM mixed").await.is_err());
    assert_eq!(rows(&s, "SELECT count(*) FROM \"Sp Tbl\"").await, ["| 0 |"]);
}

/// A table of the earlier layout (its state store at the table's own
/// folder, no published table) is read and updated as before, and is not
/// given a published table over its files.
#[tokio::test]
async fn tables_of_the_earlier_layout_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().to_str().unwrap().to_string();
    {
        let s = CdcSession::open(AutoCdcConfig::new(&wh)).await.unwrap();
        exec(
            &s,
            "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
        )
        .await;
        exec(&s, "CREATE STREAMING TABLE t").await;
        exec(
            &s,
            "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
        )
        .await;
    }
    // rebuild the earlier layout: the state store's files at the table's folder
    let table = dir.path().join("public").join("t");
    std::fs::remove_dir_all(table.join("_delta_log")).unwrap();
    let state = table.join("_autocdc").join("state");
    for entry in std::fs::read_dir(&state).unwrap() {
        let entry = entry.unwrap();
        std::fs::rename(entry.path(), table.join(entry.file_name())).unwrap();
    }
    for entry in std::fs::read_dir(&table).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().contains("deletion_vector_") {
            std::fs::remove_file(path).unwrap();
        }
    }
    std::fs::remove_dir_all(table.join("_autocdc")).unwrap();

    let s = CdcSession::open(AutoCdcConfig::new(&wh)).await.unwrap();
    exec(
        &s,
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 2)",
    )
    .await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(&s, "SELECT id, v FROM t ORDER BY id").await,
        ["| 1 | a |", "| 2 | b |"]
    );
    assert!(!table.join("_autocdc").exists(), "no state store was made");
    exec(&s, "CREATE OR REFRESH STREAMING TABLE t").await;
    assert_eq!(rows(&s, "SELECT count(*) FROM t").await, ["| 2 |"]);
}

/// The actions of one commit of a Delta log, by kind: `(kind, action)`.
fn log_actions(table_dir: &std::path::Path, version: u64) -> Vec<(String, serde_json::Value)> {
    let file = table_dir
        .join("_delta_log")
        .join(format!("{version:020}.json"));
    std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        .lines()
        .map(|line| {
            let action: serde_json::Value = serde_json::from_str(line).unwrap();
            let (kind, body) = action.as_object().unwrap().iter().next().unwrap();
            (kind.clone(), body.clone())
        })
        .collect()
}

/// An update of a target without rows writes no change data file (Delta
/// readers derive its inserts from its files, and so does `table_changes`);
/// visible and hidden state rows go to separate files, tagged, and the
/// published table adds the visible ones without a deletion vector. The
/// next update writes its change files.
#[tokio::test]
async fn a_first_load_writes_no_change_files() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().to_str().unwrap();
    let s = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    exec(&s, "CREATE TABLE src (id INT, v TEXT, op TEXT, seq INT)").await;
    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '1')",
    )
    .await;
    exec(&s, "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op)").await;
    exec(
        &s,
        "INSERT INTO src VALUES (1, 'a', 'U', 1), (2, 'b', 'U', 1), (3, 'c', 'U', 1), (3, NULL, 'D', 2), (9, NULL, 'D', 1)",
    )
    .await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    let write = operator_line(&analyzed, "CdcWriteExec");
    for m in [
        "change_feed=from_adds",
        // live rows 1, 2 in one file, tombstones 3, 9 in another
        "num_files_written=2,",
        "num_change_files_written=0,",
    ] {
        assert!(write.contains(m), "missing {m} in {write}");
    }
    let version = s.sql("SELECT max(_commit_version) FROM table_changes('t', 0)");
    let version = lines(&version.await.unwrap().collect().await.unwrap());
    assert_eq!(version, ["| 2 |"]);
    assert_eq!(
        rows(
            &s,
            "SELECT id, v, _change_type, _commit_version FROM table_changes('t', 0) ORDER BY id"
        )
        .await,
        ["| 1 | a | insert | 2 |", "| 2 | b | insert | 2 |"]
    );

    // the state store: one visible and one hidden file, no change file
    let state = log_actions(&state_dir(&dir, "t"), 2);
    let mut tags: Vec<String> = state
        .iter()
        .filter(|(kind, _)| kind == "add")
        .map(|(_, add)| add["tags"]["autocdc.rows"].as_str().unwrap().to_string())
        .collect();
    tags.sort();
    assert_eq!(tags, ["hidden", "visible"]);
    assert!(state.iter().all(|(kind, _)| kind != "cdc"), "{state:?}");
    // the published table: the visible file only, whole
    let published = log_actions(&dir.path().join("public").join("t"), 2);
    let adds: Vec<_> = published.iter().filter(|(k, _)| k == "add").collect();
    assert_eq!(adds.len(), 1, "{published:?}");
    assert!(adds[0].1["deletionVector"].is_null(), "{published:?}");
    assert!(published.iter().all(|(kind, _)| kind != "cdc"));
    assert_eq!(
        read_with_deltalake(dir.path().join("public").join("t"))
            .await
            .0,
        ["| 1 | a | 1 |", "| 2 | b | 1 |"]
    );

    // the next update has rows to change: change files again
    exec(
        &s,
        "INSERT INTO src VALUES (1, 'a2', 'U', 3), (4, 'd', 'U', 3)",
    )
    .await;
    let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
        .await
        .join("\n");
    let write = operator_line(&analyzed, "CdcWriteExec");
    assert!(!write.contains("from_adds"), "{write}");
    assert!(write.contains("num_change_files_written=1,"), "{write}");
    assert_eq!(
        rows(
            &s,
            "SELECT id, v, _change_type FROM table_changes('t', 3) ORDER BY id, _change_type DESC"
        )
        .await,
        [
            "| 1 | a | update_preimage |",
            "| 1 | a2 | update_postimage |",
            "| 4 | d | insert |"
        ]
    );
}

#[allow(dead_code)]
#[path = "../../../examples/plain_session.rs"]
mod plain_session_example;

/// `examples/plain_session.rs`: a plain `SessionContext` reads a target, its
/// change feed, an older version and a table created after it registered
/// the warehouse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_session_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let answers = plain_session_example::run(dir.path().to_str().unwrap())
        .await
        .unwrap();
    assert_eq!(lines(&answers.users), ["| 1 | anne |"]);
    assert_eq!(
        lines(&answers.changes),
        [
            "| 1 | ann | insert | 1 |",
            "| 2 | bob | insert | 1 |",
            "| 1 | ann | update_preimage | 2 |",
            "| 1 | anne | update_postimage | 2 |",
            "| 2 | bob | delete | 2 |",
        ]
    );
    assert_eq!(
        lines(&answers.first_version),
        ["| 1 | ann |", "| 2 | bob |"]
    );
    assert_eq!(lines(&answers.later), ["| 1 | anne |", "| 2 | |"]);
}

/// The event log lives in the Delta commit information: it survives a
/// restart, and the published table's history shows each run's operation and
/// metrics to other Delta readers.
#[tokio::test]
async fn the_event_log_survives_a_restart_and_is_in_the_published_history() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().to_str().unwrap();
    {
        let s = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
        exec(
            &s,
            "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
        )
        .await;
        exec(&s, "CREATE STREAMING TABLE t").await;
        exec(
            &s,
            "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
        )
        .await;
    }
    let s = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    assert_eq!(
        rows(&s, "SELECT commit_version, operation, flow, num_upserted_rows, num_input_rows FROM event_log('t') ORDER BY commit_version").await,
        ["| 0 | CREATE TABLE | | | |", "| 1 | CREATE FLOW | f | 2 | 2 |"]
    );
    let published = log_actions(&dir.path().join("public").join("t"), 1);
    let (kind, info) = &published[0];
    assert_eq!(kind, "commitInfo");
    assert_eq!(info["operation"], "CREATE FLOW");
    assert_eq!(info["operationParameters"]["flow"], "f");
    assert_eq!(info["operationMetrics"]["numUpsertedRows"], "2");
}

/// `table_as_of('t', TIMESTAMP …)` reads the newest commit made at or before
/// that time — by the commit times `event_log` shows.
#[tokio::test]
async fn table_as_of_a_commit_time_reads_the_newest_commit_then() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(
        &s,
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq)",
    )
    .await;
    for (id, v) in [(1, "b"), (2, "c")] {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        exec(&s, &format!("INSERT INTO src VALUES ({id}, '{v}', 2)")).await;
        exec(&s, "REFRESH STREAMING TABLE t").await;
    }
    let log = s
        .sql("SELECT commit_version, CAST(commit_timestamp AS BIGINT) FROM event_log('t') ORDER BY 1")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let commits: Vec<(i64, i64)> = lines(&log)
        .iter()
        .map(|l| {
            let cells: Vec<i64> = l.split('|').filter_map(|c| c.trim().parse().ok()).collect();
            (cells[0], cells[1])
        })
        .collect();
    assert!(commits.len() >= 3, "{commits:?}");
    for (i, &(version, ms)) in commits.iter().enumerate() {
        // at the commit's own time, and just before the next commit
        let next = commits.get(i + 1).map_or(ms + 1000, |&(_, next)| next);
        for at in [ms, next - 1] {
            let newest = commits
                .iter()
                .filter(|&&(_, t)| t <= at)
                .map(|&(v, _)| v)
                .max()
                .unwrap();
            assert!(newest >= version);
            assert_eq!(
                rows(
                    &s,
                    &format!(
                        "SELECT * FROM table_as_of('t', to_timestamp_millis({at})) ORDER BY id"
                    )
                )
                .await,
                rows(
                    &s,
                    &format!("SELECT * FROM table_as_of('t', {newest}) ORDER BY id")
                )
                .await,
                "at {at} ms (commits {commits:?})"
            );
        }
    }
    let before = commits[0].1 - 1;
    let err = s
        .sql(&format!(
            "SELECT * FROM table_as_of('t', to_timestamp_millis({before}))"
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("the table was created after that time"),
        "{err}"
    );
    // later than every commit: the latest
    assert_eq!(
        rows(&s, "SELECT * FROM table_as_of('t', now()) ORDER BY id").await,
        ["| 1 | b |", "| 2 | c |"]
    );
}

/// A commit time `event_log` shows resolves to the same version in
/// `table_as_of` and in a Delta reader's time travel of the table at the
/// path (deltalake's `load_with_datetime`): both go by the published
/// commits, written a few milliseconds after the state store's.
#[tokio::test]
async fn event_log_times_are_the_times_delta_readers_travel_by() {
    let dir = tempfile::tempdir().unwrap();
    let s = CdcSession::open(AutoCdcConfig::new(dir.path().to_str().unwrap()))
        .await
        .unwrap();
    exec(
        &s,
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq)",
    )
    .await;
    for (id, v) in [(1, "b"), (2, "c"), (3, "d")] {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        exec(&s, &format!("INSERT INTO src VALUES ({id}, '{v}', 2)")).await;
        exec(&s, "REFRESH STREAMING TABLE t").await;
    }
    let log = rows(
        &s,
        "SELECT commit_version, CAST(commit_timestamp AS BIGINT) FROM event_log('t') \
         WHERE commit_version > 0 ORDER BY 1",
    )
    .await;
    let (mut reader, _) = open_raw(dir.path().join("public").join("t")).await;
    assert_eq!(log.len(), 4, "{log:?}");
    for line in &log {
        let cells: Vec<i64> = line
            .split('|')
            .filter_map(|c| c.trim().parse().ok())
            .collect();
        let (version, ms) = (cells[0], cells[1]);
        let at = chrono::DateTime::from_timestamp_millis(ms).unwrap();
        reader.load_with_datetime(at).await.unwrap();
        assert_eq!(reader.version(), Some(version as u64), "at {at} ({log:?})");
        let ours = rows(
            &s,
            &format!("SELECT * FROM table_as_of('t', to_timestamp_millis({ms})) ORDER BY id"),
        )
        .await;
        let by_version = rows(
            &s,
            &format!("SELECT * FROM table_as_of('t', {version}) ORDER BY id"),
        )
        .await;
        assert_eq!(ours, by_version, "at {at} ({log:?})");
    }
}

/// The Rust API of the history queries returns the SQL functions' rows.
#[tokio::test]
async fn history_queries_from_rust() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(&s, "CREATE TABLE src (id INT, v TEXT, seq INT, st INT) AS VALUES (1, 'a', 1, 10), (1, 'b', 5, 20)").await;
    exec(&s, "CREATE STREAMING TABLE h").await;
    exec(&s, "CREATE FLOW f AS AUTO CDC INTO h FROM src KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq, st) STORED AS SCD TYPE 2").await;
    exec(&s, "CREATE STREAMING TABLE b").await;
    exec(&s, "CREATE FLOW g AS AUTO CDC INTO b FROM src KEYS (id) SEQUENCE BY seq SYSTEM SEQUENCE BY st COLUMNS * EXCEPT (seq, st) STORED AS BITEMPORAL").await;
    let collect =
        |df: datafusion::prelude::DataFrame| async move { lines(&df.collect().await.unwrap()) };
    assert_eq!(
        collect(s.scd2_as_of("h", 4).await.unwrap()).await,
        ["| 1 | a |"]
    );
    assert_eq!(
        collect(s.scd2_as_of("h", 5i64).await.unwrap()).await,
        ["| 1 | b |"]
    );
    assert_eq!(
        collect(s.bitemporal_as_of("b", 7, Some(15.into())).await.unwrap()).await,
        ["| 1 | a |"]
    );
    assert_eq!(
        collect(s.bitemporal_as_of("b", 7, None).await.unwrap()).await,
        ["| 1 | b |"]
    );
    assert_eq!(
        collect(s.table_as_of("h", 0i64).await.unwrap()).await,
        Vec::<String>::new()
    );
    let err = s.scd2_as_of("b", 4).await.unwrap_err().to_string();
    assert!(
        err.contains("'b' is BITEMPORAL (use bitemporal_as_of)"),
        "{err}"
    );
}

/// `RESTORE … TIMESTAMP AS OF` restores the newest commit made at or
/// before that time; the Rust API reports what the restore did.
#[tokio::test]
async fn restore_by_commit_time() {
    use datafusion_autocdc::api::RestoreTo;
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    let land = |name: &'static str, values: &'static str| {
        let s = &s;
        async move {
            exec(s, &format!("COPY (SELECT CAST(column1 AS INT) AS id, column2 AS v, CAST(column3 AS INT) AS seq FROM (VALUES {values})) TO 'memory:///feed/{name}.parquet' STORED AS PARQUET")).await;
        }
    };
    land("f1", "(1, 'a', 1)").await;
    exec(
        &s,
        "CREATE EXTERNAL TABLE feed STORED AS PARQUET LOCATION 'memory:///feed/'",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(&s, "CREATE FLOW f AS AUTO CDC INTO t FROM feed KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq)").await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    land("f2", "(1, 'b', 2), (2, 'c', 1)").await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    let at = rows(
        &s,
        "SELECT CAST(commit_timestamp AS VARCHAR) FROM event_log('t') WHERE commit_version = 1",
    )
    .await;
    let at = at[0].trim_matches(|c| c == '|' || c == ' ').to_string();
    let restored = s
        .restore_streaming_table("t", RestoreTo::Timestamp(at.clone()))
        .await
        .unwrap_or_else(|e| panic!("{at}: {e}"));
    assert_eq!(
        (
            restored.restored_version,
            restored.commit_version,
            restored.num_upserted_rows,
            restored.num_deleted_rows
        ),
        (1, 3, 1, 1),
        "{restored:?}"
    );
    assert_eq!(rows(&s, "SELECT * FROM t ORDER BY id").await, ["| 1 | a |"]);
    // the restored checkpoint: the second file is read again
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(&s, "SELECT * FROM t ORDER BY id").await,
        ["| 1 | b |", "| 2 | c |"]
    );
}

/// Malformed Debezium events (not JSON, an unknown `op`) fail the update,
/// naming file and line — unless the target takes rejects: then they go to
/// `t__rejects` as written (reason naming file and line), and the good
/// events of the same file apply.
#[tokio::test]
async fn malformed_debezium_events_fail_or_are_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let cdc = dir.path().join("cdc");
    std::fs::create_dir_all(&cdc).unwrap();
    let lines = [
        pg_event("c", 1, "Ann", Some(1)),
        "{not json".to_string(),
        pg_event("x", 2, "Bob", Some(2)),
        pg_event("u", 1, "Anna", Some(3)),
    ];
    std::fs::write(cdc.join("part-0.json"), lines.join("\n") + "\n").unwrap();
    let s = session_in(&dir).await;
    let path = format!("{}/", cdc.to_str().unwrap());
    exec(&s, "CREATE STREAMING TABLE strict").await;
    let err = error_of(
        &s,
        &format!("CREATE FLOW f AS AUTO CDC INTO strict FROM debezium('{path}') KEYS (id)"),
    )
    .await;
    assert!(err.contains("part-0.json' line 2"), "{err}");
    assert_eq!(rows(&s, "SELECT count(*) FROM strict").await, ["| 0 |"]);

    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.rejects' = 'true')",
    )
    .await;
    exec(
        &s,
        &format!("CREATE FLOW f AS AUTO CDC INTO t FROM debezium('{path}') KEYS (id)"),
    )
    .await;
    assert_eq!(rows(&s, "SELECT * FROM t").await, ["| 1 | Anna |"]);
    let rejects = rows(
        &s,
        "SELECT flow, key IS NULL, reason LIKE '%part-0.json'' line 2%', reason LIKE '%line 3%', \"row\" FROM t__rejects ORDER BY reason",
    )
    .await;
    assert_eq!(rejects.len(), 2, "{rejects:?}");
    assert!(
        rejects[0].starts_with("| f | true | true | false | {not json |"),
        "{rejects:?}"
    );
    assert!(
        rejects[1].contains("| f | true | false | true |"),
        "{rejects:?}"
    );
    assert!(rejects[1].contains(r#""op":"x""#), "{rejects:?}");
    // (the reason is the message alone)
    assert!(
        !rejects.iter().any(|r| r.contains("Execution error")),
        "{rejects:?}"
    );
    // the event log counts each once, though an SCD 1 flow reads the file
    // twice (its rows, its truncates)
    assert_eq!(
        rows(
            &s,
            "SELECT num_rejected_rows FROM event_log('t') WHERE flow = 'f'"
        )
        .await,
        ["| 2 |"]
    );
    // nothing is rejected twice: the file was read
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(rows(&s, "SELECT count(*) FROM t__rejects").await, ["| 2 |"]);
}

/// A widening update rewrites every file even when its events change no
/// row (here its only event is late): the published schema's type is the
/// type of every file a Delta reader reads, as does a RESTORE to a version
/// whose files hold the narrower type.
#[tokio::test]
async fn a_widening_update_rewrites_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let feed = dir.path().join("feed");
    std::fs::create_dir_all(&feed).unwrap();
    let s = session_in(&dir).await;
    let feed = feed.to_str().unwrap();
    exec(&s, &format!("COPY (SELECT CAST(column1 AS INT) AS id, CAST(column2 AS INT) AS w, CAST(column3 AS INT) AS seq FROM (VALUES (1, 10, 5), (2, 20, 5))) TO '{feed}/a.parquet' STORED AS PARQUET")).await;
    exec(
        &s,
        &format!("CREATE EXTERNAL TABLE feed STORED AS PARQUET LOCATION '{feed}/'"),
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(&s, "CREATE FLOW f AS AUTO CDC INTO t FROM feed KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq)").await;
    exec(&s, &format!("COPY (SELECT CAST(1 AS INT) AS id, CAST(99 AS BIGINT) AS w, CAST(3 AS INT) AS seq) TO '{feed}/b.parquet' STORED AS PARQUET")).await;
    exec(&s, "DROP TABLE feed").await;
    exec(&s, &format!("CREATE EXTERNAL TABLE feed (id INT, w BIGINT, seq INT) STORED AS PARQUET LOCATION '{feed}/'")).await;
    assert_eq!(
        rows(&s, "REFRESH STREAMING TABLE t").await,
        ["| f | 0 | 0 | 1 | 1 | 2 |"]
    );
    let published_types = || async {
        let (published, _) = open_raw(dir.path().join("wh").join("public").join("t")).await;
        let ctx = SessionContext::new();
        let uris: Vec<String> = published.get_file_uris().unwrap().collect();
        assert!(!uris.is_empty());
        let mut types = Vec::new();
        for uri in uris {
            let path = uri.strip_prefix("file://").unwrap_or(&uri).to_string();
            let file = ctx
                .read_parquet(path.as_str(), Default::default())
                .await
                .unwrap();
            let field = file.schema().field_with_unqualified_name("w").unwrap();
            types.push(field.data_type().clone());
        }
        types
    };
    for data_type in published_types().await {
        assert_eq!(data_type, arrow::datatypes::DataType::Int64);
    }
    assert_eq!(
        rows(&s, "SELECT * FROM t ORDER BY id").await,
        ["| 1 | 10 |", "| 2 | 20 |"]
    );
    // a RESTORE to before the widening writes the rows of that version's
    // files again in the wider type
    exec(&s, "UPDATE t SET w = 30 WHERE id = 2").await;
    exec(&s, "RESTORE STREAMING TABLE t TO VERSION AS OF 1").await;
    assert_eq!(
        rows(&s, "SELECT * FROM t ORDER BY id").await,
        ["| 1 | 10 |", "| 2 | 20 |"]
    );
    for data_type in published_types().await {
        assert_eq!(data_type, arrow::datatypes::DataType::Int64);
    }
    assert_eq!(
        rows(
            &s,
            "SELECT id, w, _change_type FROM table_changes('t', 4) ORDER BY id, _change_type"
        )
        .await,
        [
            "| 2 | 20 | update_postimage |",
            "| 2 | 30 | update_preimage |"
        ]
    );
}

/// A warehouse whose rejects table is gone (an earlier version let DROP
/// remove it alone) opens: the rejects table is created again and the
/// target's next rejects reach it.
#[tokio::test]
async fn a_warehouse_without_a_targets_rejects_table_opens() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().to_str().unwrap();
    {
        let s = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
        exec(
            &s,
            "CREATE TABLE feed (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
        )
        .await;
        exec(
            &s,
            "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.rejects' = 'true')",
        )
        .await;
        exec(
            &s,
            "CREATE FLOW f AS AUTO CDC INTO t FROM feed KEYS (id) SEQUENCE BY seq",
        )
        .await;
    }
    std::fs::remove_dir_all(dir.path().join("public").join("t__rejects")).unwrap();
    let s = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    assert_eq!(rows(&s, "SELECT * FROM t").await, ["| 1 | a | 1 |"]);
    assert_eq!(rows(&s, "SELECT count(*) FROM t__rejects").await, ["| 0 |"]);
}

/// A Debezium source is sequenced by its connector's position in every
/// update (PostgreSQL: the LSN): an event without one is a NULL sequence
/// (the update fails, nothing committed) rather than a switch to
/// timestamps that would make later LSNs look late. New files holding no
/// row (tombstones, messages, a truncate) take the columns of the files
/// read before: the tombstones and messages are nothing, the truncate
/// applies.
#[tokio::test]
async fn debezium_updates_keep_their_sequence_and_read_rowless_files() {
    let dir = tempfile::tempdir().unwrap();
    let cdc = dir.path().join("cdc");
    std::fs::create_dir_all(&cdc).unwrap();
    let write = |file: &str, lines: &[String]| {
        std::fs::write(cdc.join(file), lines.join("\n") + "\n").unwrap();
    };
    write(
        "part-0.json",
        &[
            pg_event("c", 1, "v1", Some(10)),
            pg_event("c", 2, "w1", Some(11)),
        ],
    );
    let s = session_in(&dir).await;
    let path = format!("{}/", cdc.to_str().unwrap());
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        &format!("CREATE FLOW f AS AUTO CDC INTO t FROM debezium('{path}') KEYS (id)"),
    )
    .await;
    // an event without an LSN fails the update
    write("part-1.json", &[pg_event("u", 1, "v2", None)]);
    let err = error_of(&s, "REFRESH STREAMING TABLE t").await;
    assert!(
        err.contains("flow 'f': SEQUENCE BY value is NULL for key (id=1); nothing was committed"),
        "{err}"
    );
    // without it, later LSNs apply
    std::fs::remove_file(cdc.join("part-1.json")).unwrap();
    write("part-2.json", &[pg_event("u", 1, "v3", Some(30))]);
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(&s, "SELECT * FROM t ORDER BY id").await,
        ["| 1 | v3 |", "| 2 | w1 |"]
    );
    // tombstones and a logical message only: nothing to apply
    let message = r#"{"op":"m","ts_ms":1,"source":{"connector":"postgresql","lsn":31},"message":{"prefix":"p","content":"aGk="}}"#;
    write("part-3.json", &["null".to_string(), message.to_string()]);
    assert_eq!(
        rows(&s, "REFRESH STREAMING TABLE t").await,
        ["| f | 0 | 0 | 0 | 0 | 3 |"]
    );
    // a truncate only: it applies
    let truncate = r#"{"before":null,"after":null,"source":{"connector":"postgresql","lsn":40},"op":"t","ts_ms":1}"#;
    write("part-4.json", &[truncate.to_string()]);
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(rows(&s, "SELECT count(*) FROM t").await, ["| 0 |"]);
}

/// A column added to a Debezium source table after the first files: the
/// layout samples the last events of every file too, so the column and its
/// values reach the target in the same update. A column that only the
/// middle of a large file has (added and dropped again there) is not in
/// the samples: the update fails naming file, line and column, instead of
/// leaving its values out; the target stays as it was.
#[tokio::test]
async fn debezium_columns_added_after_the_first_files() {
    let dir = tempfile::tempdir().unwrap();
    let event = |id: i64, lsn: i64, extra: &str| {
        format!(
            r#"{{"before":null,"after":{{"id":{id},"name":"n{id}"{extra}}},"source":{{"connector":"postgresql","lsn":{lsn}}},"op":"c"}}"#
        )
    };
    let added = dir.path().join("added");
    std::fs::create_dir_all(&added).unwrap();
    for file in 0..6i64 {
        let lines: Vec<String> = (0..3)
            .map(|i| {
                let id = file * 3 + i;
                // the column exists from the fifth file's second event on
                let extra = match id >= 13 {
                    true => format!(r#","email":"e{id}""#),
                    false => String::new(),
                };
                event(id, id, &extra)
            })
            .collect();
        std::fs::write(
            added.join(format!("part-{file}.json")),
            lines.join("\n") + "\n",
        )
        .unwrap();
    }
    let wh = dir.path().join("wh");
    let s = CdcSession::open(AutoCdcConfig::new(wh.to_str().unwrap()))
        .await
        .unwrap();
    exec(&s, "CREATE STREAMING TABLE t").await;
    let path = format!("{}/", added.to_str().unwrap());
    exec(
        &s,
        &format!("CREATE FLOW f AS AUTO CDC INTO t FROM debezium('{path}') KEYS (id)"),
    )
    .await;
    assert_eq!(
        rows(&s, "SELECT id, email FROM t WHERE id >= 11 ORDER BY id").await,
        [
            "| 11 | |",
            "| 12 | |",
            "| 13 | e13 |",
            "| 14 | e14 |",
            "| 15 | e15 |",
            "| 16 | e16 |",
            "| 17 | e17 |"
        ]
    );

    // 20 000 events of about 100 bytes; only events 12 000..12 010 have `tmp`
    let middle = dir.path().join("middle");
    std::fs::create_dir_all(&middle).unwrap();
    let lines: Vec<String> = (0..20_000)
        .map(|id| match (12_000..12_010).contains(&id) {
            true => event(id, id, r#","tmp":1"#),
            false => event(id, id, ""),
        })
        .collect();
    std::fs::write(middle.join("part-0.json"), lines.join("\n") + "\n").unwrap();
    exec(&s, "CREATE STREAMING TABLE m").await;
    let path = format!("{}/", middle.to_str().unwrap());
    let err = error_of(
        &s,
        &format!("CREATE FLOW g AS AUTO CDC INTO m FROM debezium('{path}') KEYS (id)"),
    )
    .await;
    assert!(
        err.contains("part-0.json' line 12001: the event has column 'tmp'")
            && err.contains("(id, name)"),
        "{err}"
    );
    assert_eq!(rows(&s, "SELECT count(*) FROM m").await, ["| 0 |"]);
    let err = error_of(&s, &format!("SELECT count(*) FROM debezium('{path}')")).await;
    assert!(err.contains("column 'tmp'"), "{err}");
}

/// Schema-less Debezium events type a column by its values. An update whose
/// new events leave a column NULL keeps the target's type for it (it was
/// read as Utf8 and failed the flow as a type change), and numbers arriving
/// for a column the first events left NULL (so the target holds it as
/// text) are read as text.
#[tokio::test]
async fn debezium_null_only_columns_keep_the_targets_type() {
    let dir = tempfile::tempdir().unwrap();
    let cdc = dir.path().join("cdc");
    std::fs::create_dir_all(&cdc).unwrap();
    let write = |file: &str, line: String| {
        std::fs::write(cdc.join(file), line + "\n").unwrap();
    };
    let event = |id: i64, lsn: i64, score: &str, note: &str| {
        format!(
            r#"{{"before":null,"after":{{"id":{id},"score":{score},"note":{note}}},"source":{{"connector":"postgresql","lsn":{lsn}}},"op":"c"}}"#
        )
    };
    write("part-0.json", event(1, 10, "3", "null"));
    let s = session_in(&dir).await;
    let path = format!("{}/", cdc.to_str().unwrap());
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        &format!("CREATE FLOW f AS AUTO CDC INTO t FROM debezium('{path}') KEYS (id)"),
    )
    .await;
    // (a second target, taking rejects)
    exec(
        &s,
        "CREATE STREAMING TABLE r TBLPROPERTIES ('autocdc.rejects' = 'true')",
    )
    .await;
    exec(
        &s,
        &format!("CREATE FLOW g AS AUTO CDC INTO r FROM debezium('{path}') KEYS (id)"),
    )
    .await;
    write("part-1.json", event(2, 20, "null", "7"));
    exec(&s, "REFRESH STREAMING TABLE t").await;
    write("part-2.json", event(3, 30, "null", "true"));
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(
            &s,
            "SELECT id, score, note, arrow_typeof(score), arrow_typeof(note) FROM t ORDER BY id"
        )
        .await,
        [
            "| 1 | 3 | | Int64 | Utf8View |",
            "| 2 | | 7 | Int64 | Utf8View |",
            "| 3 | | true | Int64 | Utf8View |"
        ]
    );

    // a value that does not fit a typed column fails its event, naming it;
    // with rejects on, it is one reject and the other events apply
    write("part-3.json", event(4, 40, "\"many\"", "null"));
    let err = error_of(&s, "REFRESH STREAMING TABLE t").await;
    assert!(err.contains("part-3.json' line 1"), "{err}");
    std::fs::write(
        cdc.join("part-4.json"),
        [event(5, 50, "\"many\"", "null"), event(6, 60, "6", "null")].join("\n") + "\n",
    )
    .unwrap();
    exec(&s, "REFRESH STREAMING TABLE r").await;
    assert_eq!(
        rows(&s, "SELECT id, score FROM r ORDER BY id").await,
        ["| 1 | 3 |", "| 2 | |", "| 3 | |", "| 6 | 6 |"]
    );
    assert_eq!(
        rows(
            &s,
            "SELECT count(*) FROM r__rejects WHERE \"row\" LIKE '%many%'"
        )
        .await,
        ["| 2 |"]
    );
}

/// A RESTORE to a version whose files carry deletion vectors adds those
/// files back to the published table too: they kept no tag saying their
/// rows are visible, so the published table left them out, and Delta
/// readers lost every other row of the file (95 of 100 rows here).
#[tokio::test]
async fn restore_publishes_files_with_deletion_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let land = dir.path().join("land");
    std::fs::create_dir_all(&land).unwrap();
    let rows_csv: String = (1..=100).map(|i| format!("{i},a,1\n")).collect();
    std::fs::write(land.join("b1.csv"), format!("id,a,seq\n{rows_csv}")).unwrap();
    let s = session_in(&dir).await;
    exec(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE land (id INT, a VARCHAR, seq BIGINT) STORED AS CSV \
             LOCATION '{}/' OPTIONS ('format.has_header' 'true')",
            land.display()
        ),
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE r").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO r FROM land KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq)",
    )
    .await;
    exec(&s, "UPDATE r SET a = 'dml' WHERE id = 7").await;
    exec(&s, "REFRESH STREAMING TABLE r FULL").await;
    exec(&s, "RESTORE STREAMING TABLE r TO VERSION AS OF 2").await;
    let published = dir.path().join("wh/public/r");
    let mut ours = rows(&s, "SELECT * FROM r").await;
    ours.sort();
    assert_eq!(ours.len(), 100);
    assert_eq!(read_with_deltalake(published.clone()).await.0, ours);
    // and later commits keep it so
    exec(&s, "UPDATE r SET a = 'again' WHERE id = 23").await;
    let mut ours = rows(&s, "SELECT * FROM r").await;
    ours.sort();
    assert_eq!(read_with_deltalake(published).await.0, ours);
}

/// `COMMENT '…'` is the table's description, in the Delta table readers
/// see (it was parsed and thrown away); a declaration with another comment
/// is refused, naming both.
#[tokio::test]
async fn a_table_comment_is_its_delta_description() {
    let dir = tempfile::tempdir().unwrap();
    let s = session_in(&dir).await;
    exec(
        &s,
        "CREATE STREAMING TABLE t (id INT, v STRING) COMMENT 'users by id'",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM (SELECT * FROM VALUES (1, 'a', 1) AS s(id, v, seq)) \
         KEYS (id) SEQUENCE BY seq COLUMNS (id, v)",
    )
    .await;
    let log = std::fs::read_dir(dir.path().join("wh/public/t/_delta_log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<String>();
    assert!(log.contains(r#""description":"users by id""#), "{log}");
    exec(
        &s,
        "CREATE OR REFRESH STREAMING TABLE t (id INT, v STRING) COMMENT 'users by id'",
    )
    .await;
    let err = error_of(
        &s,
        "CREATE OR REFRESH STREAMING TABLE t (id INT, v STRING) COMMENT 'other'",
    )
    .await;
    assert!(
        err.contains("it says COMMENT 'other', and the table has 'users by id'"),
        "{err}"
    );
}

/// Without a target to go by, one object among a column's strings does
/// not make the column nested (which failed every other event of the
/// file): the column is text, and the object's event is the one that fails
/// (or is a reject).
#[tokio::test]
async fn a_stray_nested_debezium_value_is_the_reject() {
    let dir = tempfile::tempdir().unwrap();
    let cdc = dir.path().join("cdc");
    std::fs::create_dir_all(&cdc).unwrap();
    let event = |id: i64, name: &str| {
        format!(
            r#"{{"before":null,"after":{{"id":{id},"name":{name}}},"source":{{"connector":"postgresql","lsn":{id}}},"op":"c"}}"#
        )
    };
    let lines = [event(1, "\"a\""), event(2, r#"{"x":1}"#), event(3, "\"c\"")];
    std::fs::write(cdc.join("part-0.json"), lines.join("\n") + "\n").unwrap();
    let s = session_in(&dir).await;
    let path = format!("{}/", cdc.to_str().unwrap());
    let err = error_of(&s, &format!("SELECT * FROM debezium('{path}')")).await;
    assert!(err.contains("part-0.json' line 2"), "{err}");
    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.rejects' = 'true')",
    )
    .await;
    exec(
        &s,
        &format!("CREATE FLOW f AS AUTO CDC INTO t FROM debezium('{path}') KEYS (id)"),
    )
    .await;
    assert_eq!(
        rows(&s, "SELECT * FROM t ORDER BY id").await,
        ["| 1 | a |", "| 3 | c |"]
    );
    assert_eq!(
        rows(&s, "SELECT \"row\" LIKE '%\"x\":1%' FROM t__rejects").await,
        ["| true |"]
    );
}

/// An update whose events fail (a duplicate key in a snapshot) fails once:
/// the operators that read the update's staged events after the failure get
/// its error instead of running the events' plan a second time (which made
/// DataFusion's repartition panic on worker threads: "partition not used
/// yet").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_update_runs_its_events_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static PANICS: AtomicUsize = AtomicUsize::new(0);
    let previous = std::sync::Arc::new(std::panic::take_hook());
    let chained = std::sync::Arc::clone(&previous);
    std::panic::set_hook(Box::new(move |info| {
        if info.to_string().contains("partition not used yet") {
            PANICS.fetch_add(1, Ordering::SeqCst);
        }
        chained(info);
    }));

    let dir = tempfile::tempdir().unwrap();
    let s = CdcSession::open(AutoCdcConfig::new(dir.path().to_str().unwrap()))
        .await
        .unwrap();
    exec(
        &s,
        "CREATE TABLE snaps (v BIGINT, id INT, name TEXT) AS VALUES (10, 1, 'a'), (10, 2, 'b')",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t \
         FROM SNAPSHOT (SELECT id, name FROM snaps WHERE v = (SELECT v FROM current_snapshot_version())) \
         WITH VERSION (SELECT min(v) AS v FROM snaps WHERE v > (SELECT coalesce(max(v), 0) FROM last_snapshot_version())) \
         KEYS (id) STORED AS SCD TYPE 2",
    )
    .await;
    exec(&s, "INSERT INTO snaps VALUES (40, 1, 'x'), (40, 1, 'y')").await;
    for _ in 0..3 {
        let err = error_of(&s, "REFRESH STREAMING TABLE t").await;
        assert!(
            err.contains("flow 'f': duplicate key (id=1) in the snapshot at version 40"),
            "{err}"
        );
    }
    let _ = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| previous(info)));
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
    assert_eq!(
        rows(&s, "SELECT id, name FROM t ORDER BY id").await,
        ["| 1 | a |", "| 2 | b |"]
    );
}

/// With rejects on, a partition's events are checked for conflicts in
/// memory; in a pool too small for them they are sorted (spilling) and
/// checked as they come: the same rows reach the target and the rejects.
#[tokio::test]
async fn rejects_are_found_within_a_bounded_pool() {
    let mut results = Vec::new();
    for limit in ["256M", "12M"] {
        let s = bounded_session(limit).await;
        exec(&s, "SET autocdc.indexed_fold_max_bytes = 1").await;
        exec(&s, "CREATE TABLE src (id BIGINT, seq BIGINT, v VARCHAR)").await;
        exec(
            &s,
            "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.rejects' = 'true')",
        )
        .await;
        exec(
            &s,
            "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
        )
        .await;
        // 200 k events over 50 k keys; keys divisible by 1000 also get an
        // event at sequence 2 that conflicts with theirs
        exec(
            &s,
            "INSERT INTO src SELECT value % 50000, value / 50000, \
             concat('v', CAST(value AS VARCHAR), repeat('x', 40)) FROM generate_series(0, 199999) \
             UNION ALL SELECT value * 1000, 2, 'other' FROM generate_series(0, 49)",
        )
        .await;
        let analyzed = rows(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
            .await
            .join("\n");
        let rejects = operator_line(&analyzed, "RejectsExec");
        let fallbacks = match limit {
            "12M" => {
                rejects.contains("num_sort_fallbacks=") && !rejects.contains("num_sort_fallbacks=0")
            }
            _ => rejects.contains("num_sort_fallbacks=0"),
        };
        assert!(fallbacks, "{limit}: {rejects}");
        results.push((
            rows(
                &s,
                "SELECT count(*), sum(id), count(*) FILTER (WHERE v = 'other'), max(seq) FROM t",
            )
            .await,
            rows(
                &s,
                "SELECT count(*), count(DISTINCT key), min(reason) FROM t__rejects",
            )
            .await,
        ));
    }

    assert_eq!(results[0], results[1], "{results:?}");
    assert_eq!(
        results[0].1,
        ["| 100 | 50 | conflicting events (same key and sequence, different values) |"]
    );
}

/// The state store rows of target `t` of kinds `kinds`, as
/// `(id, v, __cdc_seq, __cdc_kind)`, sorted.
async fn state_rows(dir: &tempfile::TempDir, kinds: &str) -> Vec<String> {
    let (_, ctx) = open_raw(state_dir(dir, "t")).await;
    let sql = format!(
        "SELECT id, v, __cdc_seq, __cdc_kind FROM raw WHERE __cdc_kind IN ({kinds}) \
         ORDER BY __cdc_kind, id, __cdc_seq"
    );
    lines(&ctx.sql(&sql).await.unwrap().collect().await.unwrap())
}

/// An SCD 2 version stands for the last event it absorbed: only the other
/// events are stored hidden (absorbed upserts, deletes). A table an older
/// writer wrote, with every event stored hidden as well, folds the same:
/// the event stored as itself is the one the version implies.
#[tokio::test]
async fn scd2_versions_stand_for_their_last_events() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().to_str().unwrap().to_string();
    let source = "CREATE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES \
                  (1, 'a', 'U', 10), (1, 'a', 'U', 12), (1, 'b', 'U', 20), \
                  (2, 'c', 'U', 10), (2, NULL, 'D', 30)";
    {
        let s = CdcSession::open(AutoCdcConfig::new(&wh)).await.unwrap();
        exec(&s, source).await;
        exec(&s, "CREATE STREAMING TABLE t").await;
        exec(
            &s,
            "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' \
             SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2",
        )
        .await;
    }
    // versions (kind 0) stand for a@12, b@20, c@10; hidden: a@10
    // (absorbed) and the delete at 30
    assert_eq!(
        state_rows(&dir, "0, 3, 4").await,
        [
            "| 1 | a | 12 | 0 |",
            "| 1 | b | 20 | 0 |",
            "| 2 | c | 10 | 0 |",
            "| 1 | a | 10 | 3 |",
            "| 2 | | 30 | 4 |",
        ]
    );
    // an older writer stored each version's event hidden too: add them
    let (table, ctx) = open_raw(state_dir(&dir, "t")).await;
    let copies = ctx
        .sql(
            "SELECT * REPLACE (CAST(NULL AS INT) AS __start_at, CAST(NULL AS INT) AS __end_at, \
             CAST(3 AS TINYINT) AS __cdc_kind) FROM raw WHERE __cdc_kind = 0",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    table
        .write(copies)
        .with_save_mode(deltalake_core::protocol::SaveMode::Append)
        .await
        .unwrap();
    assert_eq!(
        state_rows(&dir, "3").await,
        [
            "| 1 | a | 10 | 3 |",
            "| 1 | a | 12 | 3 |",
            "| 1 | b | 20 | 3 |",
            "| 2 | c | 10 | 3 |",
        ]
    );

    // a late event of key 1 and replays of every event, folded over both
    // kinds of stored history
    let s = CdcSession::open(AutoCdcConfig::new(&wh)).await.unwrap();
    exec(&s, source).await;
    exec(&s, "INSERT INTO src VALUES (1, 'x', 'U', 15)").await;
    exec(&s, "REFRESH STREAMING TABLE t").await;
    let history = [
        "| 1 | a | 10 | 15 |",
        "| 1 | x | 15 | 20 |",
        "| 1 | b | 20 | |",
        "| 2 | c | 10 | 30 |",
    ];
    assert_eq!(
        rows(
            &s,
            "SELECT id, v, __START_AT, __END_AT FROM t ORDER BY id, __START_AT"
        )
        .await,
        history
    );
    assert_eq!(
        rows(
            &s,
            "SELECT id, v, _change_type FROM table_changes('t', 3) ORDER BY id, _change_type, v"
        )
        .await,
        [
            "| 1 | x | insert |",
            "| 1 | a | update_postimage |",
            "| 1 | a | update_preimage |",
        ]
    );
    // both keys' stored rows were rewritten (the replays touch key 2):
    // the versions stand for a@12, x@15, b@20 and c@10, no copy is left
    assert_eq!(
        state_rows(&dir, "0, 3, 4").await,
        [
            "| 1 | a | 12 | 0 |",
            "| 1 | x | 15 | 0 |",
            "| 1 | b | 20 | 0 |",
            "| 2 | c | 10 | 0 |",
            "| 1 | a | 10 | 3 |",
            "| 2 | | 30 | 4 |",
        ]
    );
    // any Delta reader sees the versions only
    let (published, _) = read_with_deltalake(dir.path().join("public").join("t")).await;
    assert_eq!(published.len(), 4, "{published:?}");
}

/// Another Delta writer appending to the table at a target's path would
/// part it from what we read and number its versions apart from the state
/// store's: the table is refused, by a session opened after it and by one
/// holding it since before, saying which versions and what undoes them;
/// the state store is left as it was, and removing the foreign commit
/// brings the table back.
#[tokio::test]
async fn a_foreign_commit_at_the_path_is_refused_and_loses_nothing() {
    use datafusion::arrow::array::{Int32Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().to_str().unwrap();
    let s = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    exec(
        &s,
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(&s, "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq)").await;

    let published = dir.path().join("public").join("t");
    let (table, _) = open_raw(published.clone()).await;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, true),
        Field::new("v", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int32Array::from(vec![10])),
            Arc::new(StringArray::from(vec!["ext"])),
        ],
    )
    .unwrap();
    table
        .write([batch])
        .with_save_mode(deltalake_core::protocol::SaveMode::Append)
        .await
        .unwrap();

    let refused = "has version 2 (WRITE), which another Delta writer committed";
    let undo = "Remove the commit file _delta_log/00000000000000000002.json";
    // the session that held the table before: its writes are refused
    let e = error_of(&s, "UPDATE t SET v = 'a2' WHERE id = 1").await;
    assert!(e.contains(refused) && e.contains(undo), "{e}");
    let e = error_of(&s, "REFRESH STREAMING TABLE t FULL").await;
    assert!(e.contains(refused), "{e}");
    // a session opened after it: the table is not read; the others update
    let later = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    let e = error_of(&later, "SELECT * FROM t").await;
    assert!(
        e.contains("'t' cannot be opened") && e.contains(refused),
        "{e}"
    );
    exec(
        &later,
        "CREATE TABLE src2 (id INT, v TEXT, seq INT) AS VALUES (7, 'g', 1)",
    )
    .await;
    exec(&later, "CREATE STREAMING TABLE other").await;
    exec(
        &later,
        "CREATE FLOW o AS AUTO CDC INTO other FROM src2 KEYS (id) SEQUENCE BY seq",
    )
    .await;
    let update = later.update_pipeline().await.unwrap();
    let statuses: Vec<String> = update
        .tables
        .iter()
        .map(|t| format!("{} {}", t.table, t.status.name()))
        .collect();
    assert_eq!(statuses, ["other updated", "t failed"]);
    assert!(update.tables[1]
        .message
        .as_deref()
        .is_some_and(|m| m.contains(refused)));
    let e = error_of(&later, "REFRESH PIPELINE public FULL (t)").await;
    assert!(
        e.contains("'t' cannot be opened, so it cannot be refreshed") && e.contains(refused),
        "{e}"
    );
    // (what `autocdc run` asks of the tables its files define)
    let names: std::collections::BTreeSet<_> = ["t", "other"]
        .iter()
        .map(|n| datafusion_autocdc::table::TableName::parse(n).unwrap())
        .collect();
    let besides = later
        .flows_besides(&names, &Default::default())
        .await
        .unwrap();
    assert_eq!(besides.len(), 1, "{besides:?}");
    // a plain DataFusion context with the warehouse as a catalog reads the
    // others, and says why it cannot read `t`
    let ctx = SessionContext::new();
    datafusion_autocdc::catalog::register_warehouse(
        &ctx,
        "wh",
        datafusion_autocdc::table::Warehouse::open(wh).unwrap(),
    )
    .await
    .unwrap();
    let read = ctx.sql("SELECT v FROM wh.public.other").await.unwrap();
    assert_eq!(lines(&read.collect().await.unwrap()), ["| g |"]);
    let e = match ctx.sql("SELECT * FROM wh.public.t").await {
        Err(e) => e.to_string(),
        Ok(df) => df
            .collect()
            .await
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string()),
    };
    assert!(e.contains(refused), "{e}");
    // nothing was committed to the state store
    let (state, _) = open_raw(state_dir(&dir, "t")).await;
    assert_eq!(state.version(), Some(1));

    std::fs::remove_file(
        published
            .join("_delta_log")
            .join("00000000000000000002.json"),
    )
    .unwrap();
    let again = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    exec(&again, "UPDATE t SET v = 'a2' WHERE id = 1").await;
    assert_eq!(
        rows(&again, "SELECT * FROM t ORDER BY id").await,
        ["| 1 | a2 |", "| 2 | b |"]
    );
    let (live, _) = read_with_deltalake(published).await;
    assert_eq!(live, ["| 1 | a2 |", "| 2 | b |"]);
}

/// A Debezium event file appended to after a flow read it (a sink that
/// appends, a file listed while it is written) is read on from where the
/// flow stopped: the new events once, a last line still being written once
/// it is whole; a file shorter than what was read fails the update and
/// commits nothing.
#[tokio::test]
async fn debezium_files_appended_to_are_read_on_from_where_they_were_read() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events");
    std::fs::create_dir_all(&events).unwrap();
    let file = events.join("a.json");
    let append = |text: &str| {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&file)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    };
    append(&format!("{}\n", pg_event("c", 1, "a", Some(101))));
    let s = session_in(&dir).await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        &format!(
            "CREATE FLOW f AS AUTO CDC INTO t FROM debezium('{}/') KEYS (id)",
            events.display()
        ),
    )
    .await;
    let last = pg_event("c", 3, "d", Some(104));
    let (head, tail) = last.split_at(40);
    append(&format!(
        "{}\n{}\n{head}",
        pg_event("u", 1, "b", Some(102)),
        pg_event("c", 2, "c", Some(103))
    ));
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(&s, "SELECT * FROM t ORDER BY id").await,
        ["| 1 | b |", "| 2 | c |"]
    );
    append(&format!("{tail}\n"));
    exec(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(&s, "SELECT * FROM t ORDER BY id").await,
        ["| 1 | b |", "| 2 | c |", "| 3 | d |"]
    );
    // away from the folder while another file comes, then back: not read
    // again (it was read from its start)
    std::fs::rename(&file, dir.path().join("a.away")).unwrap();
    std::fs::write(
        events.join("b.json"),
        format!("{}\n", pg_event("c", 4, "e", Some(105))),
    )
    .unwrap();
    let refreshed = rows(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(refreshed, ["| f | 1 | 0 | 1 | 0 | 4 |"]);
    std::fs::rename(dir.path().join("a.away"), &file).unwrap();
    let refreshed = rows(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(refreshed, ["| f | 0 | 0 | 0 | 0 | 5 |"]);
    std::fs::remove_file(events.join("b.json")).unwrap();
    let version = rows(&s, "SELECT max(commit_version) FROM event_log('t')").await;

    // written anew, longer: what was read no longer ends a line there
    let longer: String = (10..20)
        .map(|i| format!("{}\n", pg_event("c", i, "zzzzzz", Some(200 + i))))
        .collect();
    std::fs::write(&file, longer).unwrap();
    let e = error_of(&s, "REFRESH STREAMING TABLE t").await;
    assert!(
        e.contains("no longer ends a line") && e.contains("rewritten"),
        "{e}"
    );
    std::fs::write(&file, format!("{}\n", pg_event("c", 9, "z", Some(1)))).unwrap();
    let e = error_of(&s, "REFRESH STREAMING TABLE t").await;
    assert!(
        e.contains("a.json' has") && e.contains("fewer than the") && e.contains("rewritten"),
        "{e}"
    );
    assert_eq!(
        rows(&s, "SELECT max(commit_version) FROM event_log('t')").await,
        version
    );
}

/// A `time` column (Debezium's `MicroTime`) has no Delta type: a flow
/// `FROM debezium(...)` stores it as text, in order, rather than failing
/// every update; the table function keeps its Arrow time type. SQL Server
/// events are ordered by their LSNs, so one transaction's two updates of a
/// key (one `ts_ms`) apply in order instead of conflicting, after the
/// snapshot reads, which have no change LSN (their sequence is no NULL).
#[tokio::test]
async fn debezium_times_are_stored_as_text_and_sql_server_orders_by_lsn() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events");
    std::fs::create_dir_all(&events).unwrap();
    let schema = r#"{"type":"struct","fields":[{"type":"struct","field":"before","optional":true,"fields":[{"type":"int32","field":"id"},{"type":"int64","field":"at","name":"io.debezium.time.MicroTime"}]},{"type":"struct","field":"after","optional":true,"fields":[{"type":"int32","field":"id"},{"type":"int64","field":"at","name":"io.debezium.time.MicroTime"}]},{"type":"struct","field":"source","fields":[{"type":"string","field":"connector"},{"type":"int64","field":"ts_ms"},{"type":"string","field":"change_lsn","optional":true},{"type":"string","field":"commit_lsn","optional":true},{"type":"int64","field":"event_serial_no","optional":true}]},{"type":"string","field":"op"},{"type":"int64","field":"ts_ms"}]}"#;
    let event = |op: &str, id: i32, at: i64, commit: &str, change: Option<(&str, i64)>| {
        // (a snapshot read has neither change LSN nor serial number)
        let (change, serial) = match change {
            Some((change, serial)) => (format!(r#""{change}""#), serial.to_string()),
            None => ("null".to_string(), "null".to_string()),
        };
        format!(
            r#"{{"schema":{schema},"payload":{{"before":null,"after":{{"id":{id},"at":{at}}},"source":{{"connector":"sqlserver","ts_ms":1700000005000,"change_lsn":{change},"commit_lsn":"{commit}","event_serial_no":{serial}}},"op":"{op}","ts_ms":1700000005000}}}}"#
        )
    };
    std::fs::write(
        events.join("a.json"),
        [
            event("r", 1, 3_723_000_001, "00000025:00000d98:0003", None),
            event("r", 2, 3_723_000_001, "00000025:00000d98:0003", None),
            event(
                "u",
                1,
                37_230_500_000,
                "00000026:00000010:0009",
                Some(("00000026:00000010:0002", 1)),
            ),
            event(
                "u",
                1,
                45_000_000_000,
                "00000026:00000010:0009",
                Some(("00000026:00000010:0004", 2)),
            ),
        ]
        .join("\n"),
    )
    .unwrap();
    let s = session_in(&dir).await;
    let source = format!("debezium('{}/')", events.display());
    assert_eq!(
        rows(
            &s,
            &format!("SELECT arrow_typeof(at) FROM {source} LIMIT 1")
        )
        .await,
        ["| Time64(µs) |"]
    );
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        &format!("CREATE FLOW f AS AUTO CDC INTO t FROM {source} KEYS (id)"),
    )
    .await;
    assert_eq!(
        rows(&s, "SELECT id, at FROM t ORDER BY id").await,
        ["| 1 | 12:30:00 |", "| 2 | 01:02:03.000001 |"]
    );
}

/// The Delta properties a table is declared with (checkpoint interval, log
/// retention) are the published table's too: Delta readers and tools follow
/// the table at the path, not the state store.
#[tokio::test]
async fn declared_delta_properties_reach_the_table_at_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let s = CdcSession::open(AutoCdcConfig::new(dir.path().to_str().unwrap()))
        .await
        .unwrap();
    exec(
        &s,
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
    )
    .await;
    exec(
        &s,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('delta.checkpointInterval' = '5', \
         'delta.logRetentionDuration' = 'interval 60 days')",
    )
    .await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await;
    let (table, _) = open_raw(dir.path().join("public").join("t")).await;
    let config = table.snapshot().unwrap().metadata().configuration().clone();
    assert_eq!(
        config.get("delta.checkpointInterval").map(String::as_str),
        Some("5")
    );
    assert_eq!(
        config.get("delta.logRetentionDuration").map(String::as_str),
        Some("interval 60 days")
    );
    assert_eq!(
        config.get("delta.enableChangeDataFeed").map(String::as_str),
        Some("true")
    );
}

/// A Delta table another tool wrote into a warehouse folder is read as the
/// Delta table it is (it failed every read naming our bookkeeping column),
/// and may feed a flow; it is never written here. Any Delta table is read
/// with `CREATE EXTERNAL TABLE … STORED AS DELTA`.
#[tokio::test]
async fn a_delta_table_another_tool_wrote_is_read_as_it_is() {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("public").join("ext");
    write_delta_table(
        &folder,
        vec![
            ("id", Arc::new(Int64Array::from(vec![1, 2])) as _),
            ("v", Arc::new(StringArray::from(vec!["a", "b"])) as _),
        ],
    )
    .await;

    let wh = dir.path().to_str().unwrap();
    let s = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    assert_eq!(
        rows(&s, "SELECT * FROM ext ORDER BY id").await,
        ["| 1 | a |", "| 2 | b |"]
    );
    exec(&s, "CREATE STREAMING TABLE m").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO m FROM ext KEYS (id) SEQUENCE BY id",
    )
    .await;
    assert_eq!(
        rows(&s, "SELECT * FROM m ORDER BY id").await,
        ["| 1 | a |", "| 2 | b |"]
    );
    let e = error_of(&s, "REFRESH STREAMING TABLE ext").await;
    assert!(e.contains("a Delta table another tool wrote"), "{e}");
    let e = error_of(&s, "INSERT INTO ext VALUES (3, 'c')").await;
    assert!(e.contains("is read here only"), "{e}");
    // the other tool writes on: each statement reads its latest version
    let more = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![3])),
            Arc::new(StringArray::from(vec!["c"])),
        ],
    )
    .unwrap();
    let url = url::Url::from_directory_path(&folder).unwrap();
    deltalake_core::DeltaTableBuilder::from_url(url)
        .unwrap()
        .load()
        .await
        .unwrap()
        .write([more])
        .with_save_mode(deltalake_core::protocol::SaveMode::Append)
        .await
        .unwrap();
    assert_eq!(rows(&s, "SELECT count(*) FROM ext").await, ["| 3 |"]);
    exec(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE d STORED AS DELTA LOCATION '{}'",
            folder.display()
        ),
    )
    .await;
    assert_eq!(rows(&s, "SELECT count(*) FROM d").await, ["| 3 |"]);
    let e = error_of(&s, "INSERT INTO d VALUES (4, 'd')").await;
    assert!(e.contains("is read here only"), "{e}");
    let e = error_of(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE d2 STORED AS DELTA LOCATION '{}' OPTIONS ('version' '0')",
            folder.display()
        ),
    )
    .await;
    assert!(e.contains("option 'format.version' is not taken"), "{e}");

    // one another tool writes after the session opened is not taken over
    let later = dir.path().join("public").join("later");
    std::fs::create_dir_all(&later).unwrap();
    let one = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)])),
        vec![Arc::new(Int64Array::from(vec![1]))],
    )
    .unwrap();
    deltalake_core::DeltaTableBuilder::from_url(url::Url::from_directory_path(&later).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .write([one])
        .await
        .unwrap();
    let e = error_of(&s, "CREATE STREAMING TABLE later").await;
    assert!(e.contains("holds a Delta table another tool wrote"), "{e}");
    assert!(!later.join("_autocdc").exists());
}

/// A Delta table read with `STORED AS DELTA` in a session with no streaming
/// table yet is read at its latest version at each statement too.
#[tokio::test]
async fn a_delta_table_read_with_stored_as_delta_stays_current() {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let batch = || {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)])),
            vec![Arc::new(Int64Array::from(vec![1]))],
        )
        .unwrap()
    };
    let url = url::Url::from_directory_path(dir.path()).unwrap();
    let table = deltalake_core::DeltaTableBuilder::from_url(url)
        .unwrap()
        .build()
        .unwrap()
        .write([batch()])
        .await
        .unwrap();
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    exec(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE e STORED AS DELTA LOCATION '{}'",
            dir.path().display()
        ),
    )
    .await;
    assert_eq!(rows(&s, "SELECT count(*) FROM e").await, ["| 1 |"]);
    table
        .write([batch()])
        .with_save_mode(deltalake_core::protocol::SaveMode::Append)
        .await
        .unwrap();
    assert_eq!(rows(&s, "SELECT count(*) FROM e").await, ["| 2 |"]);
}

/// A Delta table of another tool with a column named as one of ours is
/// still another tool's: read as it is, never taken for a streaming table
/// of the earlier layout (whose flow would rewrite it, and whose DROP
/// deletes the folder).
#[tokio::test]
async fn a_foreign_table_with_a_column_named_as_ours_is_still_foreign() {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("public").join("kind");
    // (our columns by name and type, but not our partitioning)
    write_delta_table(
        &folder,
        vec![
            ("id", Arc::new(Int64Array::from(vec![1, 2]))),
            (
                "__cdc_kind",
                Arc::new(datafusion::arrow::array::Int8Array::from(vec![1, 1])),
            ),
            (
                "__cdc_bucket",
                Arc::new(datafusion::arrow::array::Int32Array::from(vec![0, 0])),
            ),
            ("v", Arc::new(StringArray::from(vec!["x", "y"]))),
        ],
    )
    .await;
    let s = CdcSession::open(AutoCdcConfig::new(dir.path().to_str().unwrap()))
        .await
        .unwrap();
    assert_eq!(
        rows(&s, "SELECT id, v FROM kind ORDER BY id").await,
        ["| 1 | x |", "| 2 | y |"]
    );
    let e = error_of(&s, "DROP STREAMING TABLE kind").await;
    assert!(e.contains("does not exist"), "{e}");
    assert!(folder.join("_delta_log").exists());
}

/// A session that was open when another session (or process) created a
/// streaming table, or another tool wrote a Delta table into the warehouse,
/// reads it by name, its changes and its history (it said "not found" for
/// the life of the session).
#[tokio::test]
async fn tables_created_after_a_session_opened_are_found_by_name() {
    use datafusion::arrow::array::Int64Array;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().to_str().unwrap();
    let early = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    let other = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
    exec(
        &other,
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
    )
    .await;
    exec(&other, "CREATE STREAMING TABLE late").await;
    exec(
        &other,
        "CREATE FLOW f AS AUTO CDC INTO late FROM src KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq)",
    )
    .await;
    assert_eq!(
        rows(&early, "SELECT * FROM late ORDER BY id").await,
        ["| 1 | a |", "| 2 | b |"]
    );
    assert_eq!(
        rows(
            &early,
            "SELECT id, _change_type FROM table_changes('late', 0) ORDER BY id"
        )
        .await,
        ["| 1 | insert |", "| 2 | insert |"]
    );
    exec(&early, "DELETE FROM late WHERE id = 1").await;
    assert_eq!(rows(&other, "SELECT * FROM late").await, ["| 2 | b |"]);

    // another tool's Delta table, written after the session opened
    let folder = dir.path().join("public").join("ext");
    write_delta_table(
        &folder,
        vec![("n", Arc::new(Int64Array::from(vec![7])) as _)],
    )
    .await;
    assert_eq!(rows(&early, "SELECT * FROM ext").await, ["| 7 |"]);
    // a name that is no table still says so
    let e = error_of(&early, "SELECT * FROM nothing_here").await;
    assert!(e.contains("not found"), "{e}");

    // a refresh of a flow whose source another session created since:
    // found the first time (it said "no table of that name" once)
    exec(
        &other,
        "CREATE TABLE upsrc (id INT, v TEXT) AS VALUES (5, 'e')",
    )
    .await;
    exec(&other, "CREATE STREAMING TABLE up").await;
    exec(
        &other,
        "CREATE FLOW uf AS AUTO CDC INTO up FROM upsrc KEYS (id) SEQUENCE BY id",
    )
    .await;
    exec(&other, "CREATE STREAMING TABLE down").await;
    exec(
        &other,
        "CREATE FLOW g AS INSERT INTO down BY NAME SELECT * FROM STREAM up",
    )
    .await;
    exec(&other, "INSERT INTO up VALUES (6, 'f')").await;
    assert!(
        rows(&early, "EXPLAIN REFRESH STREAMING TABLE down")
            .await
            .len()
            > 1
    );
    exec(&early, "REFRESH STREAMING TABLE down").await;
    assert_eq!(
        rows(&early, "SELECT * FROM down ORDER BY id").await,
        ["| 5 | e |", "| 6 | f |"]
    );

    // a statement that may have committed before it failed is not run
    // again: a refresh whose second flow's source is gone commits its
    // first flow once (it ran twice when another table had come meanwhile)
    exec(
        &early,
        "CREATE TABLE a1 (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
    )
    .await;
    exec(
        &early,
        "CREATE TABLE a2 (id INT, v TEXT, seq INT) AS VALUES (2, 'b', 1)",
    )
    .await;
    exec(&early, "CREATE STREAMING TABLE two").await;
    for (flow, source) in [("f1", "a1"), ("f2", "a2")] {
        exec(
            &early,
            &format!(
                "CREATE FLOW {flow} AS AUTO CDC INTO two FROM {source} KEYS (id) SEQUENCE BY seq"
            ),
        )
        .await;
    }
    exec(&early, "DROP TABLE a2").await;
    exec(&other, "CREATE STREAMING TABLE later_still").await;
    let before = rows(&early, "SELECT count(*) FROM event_log('two')").await;
    let e = error_of(&early, "REFRESH STREAMING TABLE two").await;
    assert!(e.contains("a2"), "{e}");
    let refreshes = rows(
        &early,
        "SELECT flow, count(*) FROM event_log('two') WHERE operation = 'REFRESH' GROUP BY flow",
    )
    .await;
    assert_eq!(refreshes, ["| f1 | 1 |"], "{before:?}");
}

/// Fails every request under one table's folder, as a folder without read
/// permission does (`chmod 000`; the tests run as a user whom permissions
/// may not stop).
#[derive(Debug)]
struct UnreadableFolder(&'static [&'static str]);

impl common::observed_store::Observer for UnreadableFolder {
    fn request(&self, request: common::observed_store::Request<'_>) -> object_store::Result<()> {
        use common::observed_store::Request;
        let under = |p: &object_store::path::Path| {
            self.0.iter().any(|folder| p.as_ref().starts_with(folder))
        };
        let refused = match request {
            Request::Get { location, .. } | Request::Put { location } => under(location),
            Request::List { prefix } => prefix.is_some_and(under),
            Request::Other => false,
        };
        match refused {
            true => Err(object_store::Error::Generic {
                store: "local",
                source: "Permission denied (os error 13)".into(),
            }),
            false => Ok(()),
        }
    }
}

/// One table whose folder cannot be read does not close the warehouse (it
/// stopped every statement, a SELECT of another table included): the
/// others are read and updated, the pipeline says why that one failed.
#[tokio::test]
async fn a_table_folder_that_cannot_be_read_does_not_close_the_warehouse() {
    use std::sync::Arc;
    let memory = Arc::new(object_store::memory::InMemory::new());
    let s = CdcSession::open(AutoCdcConfig::in_memory_on(memory.clone()))
        .await
        .unwrap();
    exec(&s, "CREATE TABLE src (id INT, seq INT) AS VALUES (1, 1)").await;
    for t in ["a", "b"] {
        exec(&s, &format!("CREATE STREAMING TABLE {t}")).await;
        exec(
            &s,
            &format!("CREATE FLOW f{t} AS AUTO CDC INTO {t} FROM src KEYS (id) SEQUENCE BY seq"),
        )
        .await;
    }
    // (and a folder of another user's beside the schemas, as a volume's
    // `lost+found`)
    use object_store::ObjectStoreExt;
    memory
        .put(
            &"lost+found/x".into(),
            bytes::Bytes::from_static(b"x").into(),
        )
        .await
        .unwrap();
    let store = Arc::new(common::observed_store::ObservedStore::new(
        memory,
        UnreadableFolder(&["public/a/", "lost+found"]),
    ));
    let later = CdcSession::open(AutoCdcConfig::in_memory_on(store))
        .await
        .unwrap();
    assert_eq!(rows(&later, "SELECT * FROM b").await, ["| 1 | 1 |"]);
    let e = error_of(&later, "SELECT * FROM a").await;
    assert!(
        e.contains("'a' cannot be opened") && e.contains("Permission denied"),
        "{e}"
    );
    exec(
        &later,
        "CREATE TABLE src (id INT, seq INT) AS VALUES (2, 1)",
    )
    .await;
    let update = later.update_pipeline().await.unwrap();
    let statuses: Vec<String> = update
        .tables
        .iter()
        .map(|t| format!("{} {}", t.table, t.status.name()))
        .collect();
    assert_eq!(statuses, ["b updated", "a failed"]);
    assert_eq!(
        rows(&later, "SELECT * FROM b ORDER BY id").await,
        ["| 1 | 1 |", "| 2 | 1 |"]
    );
}

/// Another tool's Delta table with a float column of one number and NaN is
/// read as it is: DataFusion 55 took the column for a constant from the
/// files' statistics that deltalake gives (which leave NaN out).
#[tokio::test]
async fn nan_in_another_tools_delta_table_is_read_as_nan() {
    use datafusion::arrow::array::{Float64Array, Int64Array};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("public").join("ext");
    write_delta_table(
        &folder,
        vec![
            ("id", Arc::new(Int64Array::from(vec![1, 2])) as _),
            ("v", Arc::new(Float64Array::from(vec![1.5, f64::NAN])) as _),
        ],
    )
    .await;
    let s = CdcSession::open(AutoCdcConfig::new(dir.path().to_str().unwrap()))
        .await
        .unwrap();
    let expected = ["| 1 | 1.5 |", "| 2 | NaN |"];
    assert_eq!(rows(&s, "SELECT * FROM ext ORDER BY id").await, expected);
    assert_eq!(
        rows(&s, "SELECT count(*) FROM ext WHERE v = 1.5").await,
        ["| 1 |"]
    );
    exec(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE dx STORED AS DELTA LOCATION '{}'",
            folder.display()
        ),
    )
    .await;
    assert_eq!(rows(&s, "SELECT * FROM dx ORDER BY id").await, expected);
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM ext KEYS (id) SEQUENCE BY id",
    )
    .await;
    assert_eq!(rows(&s, "SELECT * FROM t ORDER BY id").await, expected);
}
