//! Two sessions updating one target at once: each update either commits or
//! fails with a clear conflict error; no update is lost.

use std::sync::Arc;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use object_store::memory::InMemory;

/// A session on the in-memory warehouse `store`.
async fn session(store: &Arc<InMemory>) -> CdcSession {
    CdcSession::open(AutoCdcConfig::in_memory_on(store.clone()))
        .await
        .unwrap()
}

async fn run(s: &CdcSession, sql: &str) -> datafusion::error::Result<String> {
    let batches = s.sql(sql).await?.collect().await?;
    Ok(pretty_format_batches(&batches)?.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_never_lose_a_change() {
    for round in 0..5 {
        let store = Arc::new(InMemory::new());
        let a = session(&store).await;
        run(
            &a,
            "CREATE TABLE src_a (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
        )
        .await
        .unwrap();
        run(&a, "CREATE STREAMING TABLE t").await.unwrap();
        run(
            &a,
            "CREATE FLOW fa AS AUTO CDC INTO t FROM src_a KEYS (id) SEQUENCE BY seq",
        )
        .await
        .unwrap();
        let b = session(&store).await;
        run(
            &b,
            "CREATE TABLE src_b (id INT, v TEXT, seq INT) AS VALUES (2, 'b', 1)",
        )
        .await
        .unwrap();
        run(
            &b,
            "CREATE FLOW fb AS AUTO CDC INTO t FROM src_b KEYS (id) SEQUENCE BY seq",
        )
        .await
        .unwrap();
        run(
            &a,
            "CREATE TABLE src_b (id INT, v TEXT, seq INT) AS VALUES (2, 'b', 1)",
        )
        .await
        .unwrap();
        run(
            &b,
            "CREATE TABLE src_a (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
        )
        .await
        .unwrap();

        // both sessions change different keys at the same time
        run(&a, "CREATE OR REPLACE TABLE src_a (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (10, 'from a', 2)").await.unwrap();
        run(&b, "CREATE OR REPLACE TABLE src_b (id INT, v TEXT, seq INT) AS VALUES (2, 'b', 1), (20, 'from b', 2)").await.unwrap();
        let (ra, rb) = tokio::join!(
            run(&a, "REFRESH STREAMING TABLE t"),
            run(&b, "REFRESH STREAMING TABLE t")
        );
        for r in [&ra, &rb] {
            if let Err(e) = r {
                let msg = e.to_string();
                assert!(
                    msg.contains("commit to 't' failed"),
                    "round {round}: unclear failure: {msg}"
                );
                // and a program sees which flow's commit failed
                let typed = datafusion_autocdc::CdcError::find(e);
                assert!(
                    matches!(typed, Some(datafusion_autocdc::CdcError::CommitFailed { flow, target, .. }) if flow.starts_with('f') && target.ends_with('t')),
                    "round {round}: not a typed commit failure: {typed:?}"
                );
            }
        }
        // a failed one, run again, applies; nothing committed is lost
        let reader = session(&store).await;
        run(
            &reader,
            "CREATE TABLE src_a (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (10, 'from a', 2)",
        )
        .await
        .unwrap();
        run(
            &reader,
            "CREATE TABLE src_b (id INT, v TEXT, seq INT) AS VALUES (2, 'b', 1), (20, 'from b', 2)",
        )
        .await
        .unwrap();
        let seen = run(&reader, "SELECT id FROM t ORDER BY id").await.unwrap();
        if ra.is_ok() {
            assert!(
                seen.contains("| 10 |"),
                "round {round}: session a's committed update was lost:\n{seen}"
            );
        }
        if rb.is_ok() {
            assert!(
                seen.contains("| 20 |"),
                "round {round}: session b's committed update was lost:\n{seen}"
            );
        }
        run(&reader, "REFRESH STREAMING TABLE t").await.unwrap();
        let all = run(&reader, "SELECT id FROM t ORDER BY id").await.unwrap();
        for id in ["| 1  |", "| 2  |", "| 10 |", "| 20 |"] {
            assert!(all.contains(id), "round {round}: missing {id}:\n{all}");
        }
    }
}

/// Readers during updates see the previous or the next version of the
/// target, never a mix: every update rewrites all keys to one value, so any
/// read must show every key with one and the same value — both in the
/// writer's own session and in processes that open the warehouse afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_see_a_partial_update() {
    const KEYS: i64 = 20;
    const ROUNDS: i64 = 8;
    let store = Arc::new(InMemory::new());
    let writer = session(&store).await;
    let source = |round: i64| {
        format!(
            "CREATE OR REPLACE TABLE src AS SELECT value AS id, {round} AS v, {round} AS seq FROM generate_series(1, {KEYS})"
        )
    };
    run(&writer, &source(0)).await.unwrap();
    run(
        &writer,
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '4')",
    )
    .await
    .unwrap();
    run(
        &writer,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await
    .unwrap();

    let check = |seen: String, who: &str| {
        // one row: count, min(v), max(v)
        let row: Vec<&str> = seen
            .lines()
            .find(|l| l.starts_with("| ") && !l.contains("count"))
            .unwrap_or_default()
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(row.len(), 3, "{who}: {seen}");
        assert_eq!(row[0], KEYS.to_string(), "{who}: keys missing:\n{seen}");
        assert_eq!(row[1], row[2], "{who}: a mix of two versions:\n{seen}");
        row[1].parse::<i64>().unwrap()
    };
    let query = "SELECT count(*), min(v), max(v) FROM t";
    let write = async {
        for round in 1..=ROUNDS {
            run(&writer, &source(round)).await.unwrap();
            run(&writer, "REFRESH STREAMING TABLE t").await.unwrap();
        }
    };
    let read_same_session = async {
        let mut last = 0;
        for _ in 0..40 {
            let v = check(run(&writer, query).await.unwrap(), "same session");
            assert!(v >= last, "same session went back from {last} to {v}");
            last = v;
            tokio::task::yield_now().await;
        }
    };
    let read_new_process = async {
        let mut last = 0;
        for _ in 0..15 {
            let reader = session(&store).await;
            let v = check(run(&reader, query).await.unwrap(), "new process");
            assert!(v >= last, "new process went back from {last} to {v}");
            last = v;
        }
    };
    tokio::join!(write, read_same_session, read_new_process);
    let end = check(run(&writer, query).await.unwrap(), "after");
    assert_eq!(end, ROUNDS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_of_one_table_make_one_table() {
    // (a local folder: two processes' race, as in-memory stores serialise)
    for round in 0..12 {
        let dir = tempfile::tempdir().unwrap();
        let wh = dir.path().join("wh");
        let wh = wh.to_str().unwrap();
        let a = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
        let b = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
        let (ra, rb) = tokio::join!(
            run(&a, "CREATE STREAMING TABLE x (id INT, v STRING)"),
            run(
                &b,
                "CREATE STREAMING TABLE x (id INT, w BIGINT, z DOUBLE) TBLPROPERTIES ('autocdc.buckets' = '4')"
            )
        );
        // exactly one succeeds; the other says the table exists
        assert!(ra.is_ok() != rb.is_ok(), "round {round}: {ra:?} / {rb:?}");
        let failed = ra.as_ref().err().or(rb.as_ref().err()).unwrap();
        assert!(
            failed
                .to_string()
                .contains("streaming table 'x' already exists"),
            "round {round}: {failed}"
        );
        // one CREATE, whose columns are the winner's
        let c = CdcSession::open(AutoCdcConfig::new(wh)).await.unwrap();
        let log = run(&c, "SELECT operation FROM event_log('x')")
            .await
            .unwrap();
        assert_eq!(
            log.matches("CREATE TABLE").count(),
            1,
            "round {round}: {log}"
        );
        let columns = run(&c, "DESCRIBE x").await.unwrap();
        let winner_b = rb.is_ok();
        assert_eq!(
            columns.contains("| w "),
            winner_b,
            "round {round}: {columns}"
        );
        assert_eq!(
            columns.contains("| v "),
            !winner_b,
            "round {round}: {columns}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_losing_a_commit_race_names_the_table() {
    let store = Arc::new(InMemory::new());
    let a = session(&store).await;
    run(
        &a,
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
    )
    .await
    .unwrap();
    run(&a, "CREATE STREAMING TABLE t").await.unwrap();
    run(
        &a,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await
    .unwrap();
    let b = session(&store).await;
    // (how many races are lost depends on timing: each loss is explained)
    for round in 0..10 {
        let (sql_a, sql_b) = (
            format!("UPDATE t SET v = 'a{round}' WHERE id = 1"),
            format!("UPDATE t SET v = 'b{round}' WHERE id = 1"),
        );
        let (ra, rb) = tokio::join!(run(&a, &sql_a), run(&b, &sql_b));
        for r in [&ra, &rb] {
            if let Err(e) = r {
                let msg = e.to_string();
                assert!(
                    msg.contains("commit to 't' failed")
                        && msg.contains("nothing of this statement was committed"),
                    "round {round}: unclear failure: {msg}"
                );
            }
        }
        assert!(ra.is_ok() || rb.is_ok(), "round {round}: both failed");
    }
}

/// A source that, when armed, lets another session commit to `t` and then
/// fails: a full refresh's later flow failing after a foreign commit.
#[derive(Debug)]
struct InterferingSource {
    rows: datafusion::datasource::MemTable,
    store: Arc<InMemory>,
    armed: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl datafusion::catalog::TableProvider for InterferingSource {
    fn schema(&self) -> datafusion::arrow::datatypes::SchemaRef {
        self.rows.schema()
    }
    fn table_type(&self) -> datafusion::datasource::TableType {
        datafusion::datasource::TableType::Base
    }
    async fn scan(
        &self,
        state: &dyn datafusion::catalog::Session,
        projection: Option<&Vec<usize>>,
        filters: &[datafusion::prelude::Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let store = Arc::clone(&self.store);
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Runtime::new().unwrap();
                runtime.block_on(async {
                    let b = CdcSession::open(AutoCdcConfig::in_memory_on(store))
                        .await
                        .unwrap();
                    run(&b, "UPDATE t SET v = 'by b' WHERE id = 1")
                        .await
                        .unwrap();
                })
            })
            .join()
            .unwrap();
            return Err(datafusion::error::DataFusionError::Execution(
                "the source is gone".into(),
            ));
        }
        self.rows.scan(state, projection, filters, limit).await
    }
}

/// A full refresh whose later flow fails brings the table back to where it
/// began — but not over another writer's commit made meanwhile: that
/// restore undid an UPDATE the other writer had been told was committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_full_refresh_never_undoes_another_writers_commit() {
    use datafusion::arrow::array::{Int32Array, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    let store = Arc::new(InMemory::new());
    let a = session(&store).await;
    run(
        &a,
        "CREATE TABLE src1 (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
    )
    .await
    .unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new("v", DataType::Utf8, false),
        Field::new("seq", DataType::Int32, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int32Array::from(vec![2])),
            Arc::new(StringArray::from(vec!["b"])),
            Arc::new(Int32Array::from(vec![1])),
        ],
    )
    .unwrap();
    let source = Arc::new(InterferingSource {
        rows: datafusion::datasource::MemTable::try_new(schema, vec![vec![batch]]).unwrap(),
        store: store.clone(),
        armed: false.into(),
    });
    a.context()
        .register_table("src2", Arc::clone(&source) as _)
        .unwrap();
    run(&a, "CREATE STREAMING TABLE t").await.unwrap();
    for (flow, src) in [("f1", "src1"), ("f2", "src2")] {
        run(
            &a,
            &format!("CREATE FLOW {flow} AS AUTO CDC INTO t FROM {src} KEYS (id) SEQUENCE BY seq"),
        )
        .await
        .unwrap();
    }
    // f1 commits the clear and its rows; another session updates; f2 fails
    source
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let err = run(&a, "REFRESH STREAMING TABLE t FULL")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("another writer committed since it began (version 4)")
            && err.contains("the source is gone"),
        "{err}"
    );
    let rows = run(&a, "SELECT id, v FROM t ORDER BY id").await.unwrap();
    assert!(
        rows.contains("by b"),
        "the other writer's UPDATE was undone:\n{rows}"
    );
    let log = run(
        &a,
        "SELECT operation FROM event_log('t') ORDER BY commit_version",
    )
    .await
    .unwrap();
    assert!(!log.contains("RESTORE"), "{log}");
    // the next refresh completes the full refresh
    run(&a, "REFRESH STREAMING TABLE t").await.unwrap();
    let rows = run(&a, "SELECT id, v FROM t ORDER BY id").await.unwrap();
    assert_eq!(
        rows.trim(),
        "+----+------+\n| id | v    |\n+----+------+\n| 1  | by b |\n| 2  | b    |\n+----+------+"
    );
}
