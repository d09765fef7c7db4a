//! `EXPLAIN REFRESH` plans and reads no data: no source row, no snapshot
//! version, nothing committed; `EXPLAIN ANALYZE` and `REFRESH` run, and a
//! `REFRESH` reads a change feed once.
//!
//! Sources read through a volatile `probe(x)` function that counts the rows
//! it sees (and is true), so a test knows whether and how much a statement
//! read.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, BooleanArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

/// `probe(x)`: true, counting every row it is evaluated on.
#[derive(Debug)]
struct Probe {
    signature: Signature,
    rows: Arc<AtomicUsize>,
}

impl PartialEq for Probe {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.rows, &other.rows)
    }
}

impl Eq for Probe {}

impl std::hash::Hash for Probe {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        "probe".hash(state);
    }
}

impl ScalarUDFImpl for Probe {
    fn name(&self) -> &str {
        "probe"
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.rows.fetch_add(args.number_rows, Ordering::SeqCst);
        Ok(ColumnarValue::Array(Arc::new(BooleanArray::from(vec![
            true;
            args.number_rows
        ]))))
    }
}

/// A session with `probe` registered, and its row counter.
async fn session() -> (CdcSession, Arc<AtomicUsize>) {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    let rows = Arc::new(AtomicUsize::new(0));
    s.context().register_udf(ScalarUDF::new_from_impl(Probe {
        signature: Signature::any(1, Volatility::Volatile),
        rows: Arc::clone(&rows),
    }));
    (s, rows)
}

async fn collect(s: &CdcSession, sql: &str) -> Result<Vec<RecordBatch>> {
    s.sql(sql).await?.collect().await
}

async fn text(s: &CdcSession, sql: &str) -> String {
    let batches = collect(s, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    pretty_format_batches(&batches).unwrap().to_string()
}

/// The last `commit_version` a CREATE FLOW or REFRESH reported.
async fn run(s: &CdcSession, sql: &str) -> i64 {
    let batches = collect(s, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    batches
        .iter()
        .flat_map(|b| {
            let column = b.column(b.schema().index_of("commit_version").unwrap());
            column
                .as_primitive::<Int64Type>()
                .iter()
                .flatten()
                .collect::<Vec<_>>()
        })
        .max()
        .expect("a commit version")
}

/// Rows probed by `sql`, and its output.
async fn probed(s: &CdcSession, rows: &AtomicUsize, sql: &str) -> (usize, String) {
    rows.store(0, Ordering::SeqCst);
    let out = text(s, sql).await;
    (rows.load(Ordering::SeqCst), out)
}

#[tokio::test]
async fn explain_reads_no_source_row_and_commits_nothing() {
    let flows = [
        (
            "SCD 1",
            "CREATE FLOW f AS AUTO CDC INTO t FROM (SELECT * FROM src WHERE probe(id)) \
             KEYS (id) SEQUENCE BY seq",
            "AutoCdcExec",
        ),
        (
            "SCD 1 with truncates",
            "CREATE FLOW f AS AUTO CDC INTO t FROM (SELECT * FROM src WHERE probe(id)) \
             KEYS (id) APPLY AS TRUNCATE WHEN v = 'T' SEQUENCE BY seq",
            "AutoCdcExec",
        ),
        (
            "SCD 2",
            "CREATE FLOW f AS AUTO CDC INTO t FROM (SELECT * FROM src WHERE probe(id)) \
             KEYS (id) SEQUENCE BY seq STORED AS SCD TYPE 2",
            "AutoCdcExec",
        ),
        (
            "snapshot",
            "CREATE FLOW f AS AUTO CDC INTO t \
             FROM SNAPSHOT (SELECT id, v FROM snaps WHERE probe(id) \
                            AND version = (SELECT version FROM current_snapshot_version())) \
             WITH VERSION (SELECT min(version) AS version FROM snaps WHERE probe(id) \
                           AND version > (SELECT coalesce(max(version), 0) FROM last_snapshot_version())) \
             KEYS (id)",
            "SnapshotDiffExec",
        ),
    ];
    for (name, flow, operator) in flows {
        let (s, rows) = session().await;
        text(
            &s,
            "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
        )
        .await;
        text(
            &s,
            "CREATE TABLE snaps (version INT, id INT, v TEXT) AS VALUES (1, 1, 'a'), (1, 2, 'b')",
        )
        .await;
        text(&s, "CREATE STREAMING TABLE t").await;
        let before = run(&s, flow).await;
        // new data for the next update
        text(&s, "INSERT INTO src VALUES (3, 'c', 2)").await;
        text(&s, "INSERT INTO snaps VALUES (2, 1, 'a'), (2, 3, 'c')").await;
        let table = text(&s, "SELECT * FROM t ORDER BY id").await;

        let (read, plan) = probed(&s, &rows, "EXPLAIN REFRESH STREAMING TABLE t").await;
        assert_eq!(read, 0, "{name}: EXPLAIN read {read} source rows\n{plan}");
        assert!(plan.contains(operator), "{name}: no {operator} in\n{plan}");
        assert_eq!(
            text(&s, "SELECT * FROM t ORDER BY id").await,
            table,
            "{name}"
        );

        // the update itself reads its source (a change feed once: its three
        // rows), and is the next commit
        rows.store(0, Ordering::SeqCst);
        let version = run(&s, "REFRESH STREAMING TABLE t").await;
        let read = rows.load(Ordering::SeqCst);
        if operator == "SnapshotDiffExec" {
            assert!(read > 0, "{name}: REFRESH read nothing");
        } else {
            assert_eq!(read, 3, "{name}: REFRESH read {read} source rows");
        }
        assert_eq!(version, before + 1, "{name}: EXPLAIN committed");
    }
}

/// A flow over a CSV folder to which a corrupt file was added after its
/// first update: EXPLAIN plans it; REFRESH fails, naming the flow, and the
/// target is unchanged.
#[tokio::test]
async fn explain_plans_a_flow_whose_new_source_file_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events");
    std::fs::create_dir_all(&events).unwrap();
    std::fs::write(events.join("part-1.csv"), "id,v,seq\n1,a,1\n2,b,1\n").unwrap();
    let (s, _) = session().await;
    text(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE events (id INT, v TEXT, seq INT) STORED AS CSV \
             LOCATION '{}/' OPTIONS ('format.has_header' 'true')",
            events.display()
        ),
    )
    .await;
    text(&s, "CREATE STREAMING TABLE t").await;
    let version = run(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM events KEYS (id) SEQUENCE BY seq",
    )
    .await;
    let before = text(&s, "SELECT * FROM t ORDER BY id").await;
    std::fs::write(
        events.join("part-2.csv"),
        "id,v,seq\n3,c,not-a-number\n4,d\n",
    )
    .unwrap();

    let plan = text(&s, "EXPLAIN REFRESH STREAMING TABLE t").await;
    for op in ["AutoCdc: flow=f", "AutoCdcExec", "CdcCommitExec"] {
        assert!(plan.contains(op), "missing {op} in\n{plan}");
    }

    let err = collect(&s, "REFRESH STREAMING TABLE t")
        .await
        .expect_err("a corrupt source file fails the update")
        .to_string();
    assert!(
        err.contains("flow 'f'") && err.to_lowercase().contains("csv"),
        "{err}"
    );
    assert_eq!(text(&s, "SELECT * FROM t ORDER BY id").await, before);
    // nothing was committed: with the corrupt file gone, the next update
    // is the next version
    std::fs::remove_file(events.join("part-2.csv")).unwrap();
    assert_eq!(run(&s, "REFRESH STREAMING TABLE t").await, version + 1);
}
