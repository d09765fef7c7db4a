//! `EXPLAIN REFRESH` prints the operator tree that the following `REFRESH`
//! runs: the lines of `EXPLAIN ANALYZE REFRESH` less their metrics, for a
//! small update (deletion vectors), a large one (touched buckets
//! rewritten), one with a TRUNCATE (every bucket) and a snapshot flow. What
//! each update chose shows in the metrics of the run (`TargetRowsExec`) and,
//! once it ran, as the scan beneath `TargetRowsExec`, which the comparison
//! leaves out.

use std::sync::Arc;

use chrono::{TimeZone, Utc};
use datafusion::arrow::array::{Array, AsArray};
use datafusion_autocdc::clock::ManualClock;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

mod common;
use common::exec;

/// A session whose clock stands still (plans hold the retention cutoff).
async fn session() -> CdcSession {
    let clock = Arc::new(ManualClock::new(
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
    ));
    CdcSession::open(AutoCdcConfig::in_memory().with_clock(clock))
        .await
        .unwrap()
}

/// The physical plan `sql` (an `EXPLAIN [ANALYZE] …`) prints.
async fn physical_plan(s: &CdcSession, sql: &str) -> String {
    let batches = s
        .sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let mut plans = Vec::new();
    for batch in &batches {
        let (kinds, texts) = (
            batch.column(0).as_string::<i32>(),
            batch.column(1).as_string::<i32>(),
        );
        for i in 0..batch.num_rows() {
            if !kinds.is_null(i) && ["physical_plan", "Plan with Metrics"].contains(&kinds.value(i))
            {
                plans.push(texts.value(i).to_string());
            }
        }
    }
    assert_eq!(
        plans.len(),
        1,
        "{sql}: one physical plan expected: {plans:?}"
    );
    plans.remove(0)
}

/// An analysed `plan` without its metrics and without what the operators
/// that choose when they run show beneath them once they ran (the scan
/// `TargetRowsExec` chose: lines indented deeper than it, up to the next
/// line at its depth or above).
fn without_metrics(plan: &str) -> String {
    let depth = |line: &str| line.len() - line.trim_start().len();
    let mut kept = Vec::new();
    let mut chosen_below: Option<usize> = None;
    for line in plan.lines() {
        if let Some(d) = chosen_below {
            if depth(line) > d {
                continue;
            }
            chosen_below = None;
        }
        if line.trim_start().starts_with("TargetRowsExec") {
            chosen_below = Some(depth(line));
        }
        kept.push(match line.find(", metrics=[") {
            Some(at) => &line[..at],
            None => line,
        });
    }
    kept.join("\n")
}

/// The value of `metric` on the line of `operator` in an analysed plan.
fn metric(plan: &str, operator: &str, metric: &str) -> usize {
    let line = plan
        .lines()
        .find(|l| l.trim_start().starts_with(operator))
        .unwrap_or_else(|| panic!("no {operator} in\n{plan}"));
    let at = line
        .find(&format!("{metric}="))
        .unwrap_or_else(|| panic!("no {metric} in {line}"));
    line[at + metric.len() + 1..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|e| panic!("{metric} in {line}: {e}"))
}

/// EXPLAIN, then EXPLAIN ANALYZE (which runs the update): the same tree;
/// returns the analysed plan.
async fn explained_then_run(s: &CdcSession, case: &str) -> String {
    let explained = physical_plan(s, "EXPLAIN FORMAT INDENT REFRESH STREAMING TABLE t").await;
    let analysed = physical_plan(s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE t").await;
    assert_eq!(
        explained.trim_end(),
        without_metrics(&analysed).trim_end(),
        "{case}: EXPLAIN printed another plan than the one REFRESH ran"
    );
    // (what TargetRowsExec chose shows beneath it once it ran)
    assert!(
        analysed.contains("StoredRowsExec") || analysed.contains("StoredFilesExec"),
        "{case}: no chosen scan in\n{analysed}"
    );
    for op in [
        "StagedEventsExec",
        "TargetRowsExec",
        "AutoCdcExec",
        "CdcCommitExec",
    ] {
        assert!(explained.contains(op), "{case}: no {op} in\n{explained}");
    }
    analysed
}

#[tokio::test]
async fn explain_refresh_prints_the_tree_refresh_runs() {
    let s = session().await;
    exec(
        &s,
        "CREATE TABLE src AS SELECT value AS id, 'a' AS v, 1 AS seq, 'U' AS op FROM range(1000)",
    )
    .await;
    exec(&s, "CREATE STREAMING TABLE t").await;
    exec(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) \
         APPLY AS TRUNCATE WHEN op = 'T' SEQUENCE BY seq COLUMNS (id, v)",
    )
    .await;

    // (each update reads what `src` holds then)
    // small: two keys of a thousand, retired with deletion vectors
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT value AS id, 'b' AS v, 2 AS seq, 'U' AS op \
         FROM range(1, 3)",
    )
    .await;
    let small = explained_then_run(&s, "small update").await;
    assert_eq!(
        metric(&small, "TargetRowsExec", "superseded_rows"),
        2,
        "{small}"
    );
    assert_eq!(metric(&small, "TargetRowsExec", "read_all"), 0, "{small}");
    assert_eq!(metric(&small, "StagedEventsExec", "streamed"), 0, "{small}");

    // large: every key again, over the deletion-vector budget: the touched
    // buckets are rewritten
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT value AS id, 'c' AS v, 3 AS seq, 'U' AS op \
         FROM range(1000)",
    )
    .await;
    let large = explained_then_run(&s, "large update").await;
    assert_eq!(
        metric(&large, "TargetRowsExec", "superseded_rows"),
        0,
        "{large}"
    );
    assert_eq!(metric(&large, "TargetRowsExec", "read_all"), 0, "{large}");
    assert!(
        metric(&large, "TargetRowsExec", "touched_buckets") > 0,
        "{large}"
    );

    // a TRUNCATE touches every key: everything is read
    exec(
        &s,
        "CREATE OR REPLACE TABLE src AS SELECT * FROM (VALUES \
         (CAST(NULL AS BIGINT), CAST(NULL AS TEXT), CAST(4 AS BIGINT), 'T'), (7, 'd', 5, 'U')) \
         AS v(id, v, seq, op)",
    )
    .await;
    let truncated = explained_then_run(&s, "truncate").await;
    assert_eq!(
        metric(&truncated, "TargetRowsExec", "read_all"),
        1,
        "{truncated}"
    );

    let rows = s
        .sql("SELECT count(*) AS n, max(v) AS v FROM t")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&rows)
        .unwrap()
        .to_string();
    assert!(text.contains("| 1 | d |"), "{text}");
}

#[tokio::test]
async fn explain_refresh_of_a_snapshot_flow_prints_the_tree_it_runs() {
    let s = session().await;
    exec(
        &s,
        "CREATE TABLE snap AS SELECT value AS id, 'a' AS v FROM range(1000)",
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
        "CREATE OR REPLACE TABLE snap AS SELECT value AS id, CASE WHEN value < 3 THEN 'b' ELSE 'a' END AS v FROM range(1000)",
    )
    .await;
    let run = explained_then_run(&s, "snapshot").await;
    assert!(run.contains("SnapshotDiffExec"), "{run}");
    assert_eq!(
        metric(&run, "TargetRowsExec", "superseded_rows"),
        3,
        "{run}"
    );
}

/// An update whose events are more than the stage holds streams them: the
/// partitions share the run (`streamed=1`), the stored rows are read whole
/// in both partitions, every event is folded once and the target holds
/// exactly the update's rows.
#[tokio::test(flavor = "multi_thread")]
async fn an_update_over_the_stage_budget_streams_every_event_once() {
    let s = session().await;
    for sql in [
        "SET datafusion.execution.target_partitions = 2",
        "CREATE TABLE src AS SELECT value AS id, 'a' AS v, 1 AS seq FROM range(1000)",
        "CREATE STREAMING TABLE t",
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
        // (the pool refuses to hold the events: the stage streams them,
        // and the fold sorts them, spilling)
        "SET datafusion.runtime.memory_limit = '8M'",
        "SET datafusion.execution.sort_spill_reservation_bytes = 1048576",
        "CREATE OR REPLACE TABLE src AS SELECT value % 1000 AS id, \
         'c' || CAST(value AS TEXT) AS v, value + 2 AS seq FROM range(300000)",
    ] {
        exec(&s, sql).await;
    }
    let large = explained_then_run(&s, "streamed update").await;
    assert_eq!(metric(&large, "StagedEventsExec", "streamed"), 1, "{large}");
    let staged = large
        .lines()
        .find(|l| l.trim_start().starts_with("StagedEventsExec"))
        .unwrap_or_default();
    assert!(staged.contains("output_rows=300.0 K"), "{staged}");
    // every stored row is read, whole files spread over both partitions
    assert_eq!(metric(&large, "TargetRowsExec", "read_all"), 1, "{large}");
    let scan = large
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with("DataSourceExec: file_groups={2 groups")
        })
        .is_some();
    assert!(scan && large.contains("StoredFilesExec"), "{large}");
    let rows = s
        .sql("SELECT count(*) AS n, min(v) AS lo, max(v) AS hi FROM t")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let text = arrow::util::pretty::pretty_format_batches(&rows)
        .unwrap()
        .to_string();
    // each key's last event: value 299000 + id
    assert!(text.contains("| 1000 | c299000 | c299999 |"), "{text}");
}
