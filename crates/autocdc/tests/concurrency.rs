//! Two sessions updating one target at once: each update either commits or
//! fails with a clear conflict error; no update is lost.

use std::sync::Arc;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use object_store::memory::InMemory;

async fn run(s: &CdcSession, sql: &str) -> datafusion::error::Result<String> {
    let batches = s.sql(sql).await?.collect().await?;
    Ok(pretty_format_batches(&batches)?.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_never_lose_a_change() {
    for round in 0..5 {
        let store = Arc::new(InMemory::new());
        let a = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone()))
            .await
            .unwrap();
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
        let b = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone()))
            .await
            .unwrap();
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
            }
        }
        // a failed one, run again, applies; nothing committed is lost
        let reader = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone()))
            .await
            .unwrap();
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
