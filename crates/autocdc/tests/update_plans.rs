//! What `EXPLAIN REFRESH` prints: the session's `datafusion.explain.format`
//! (or the statement's `FORMAT`), and update plans without filters that are
//! always true.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

async fn run(s: &CdcSession, sql: &str) -> Result<String> {
    let batches = s.sql(sql).await?.collect().await?;
    Ok(pretty_format_batches(&batches)?.to_string())
}

/// A session with the source `feed` and four flows: SCD 1 with deletes,
/// SCD 1 with deletes and truncates, SCD 2, and a target written by a
/// snapshot flow and a change flow (its events are checked against the
/// snapshot's watermark).
async fn session() -> Result<CdcSession> {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    for sql in [
        "CREATE TABLE feed (id INT, v TEXT, op TEXT, seq INT) AS VALUES \
         (1, 'a', 'U', 1), (2, 'b', 'U', 1), (1, NULL, 'D', 2), (0, NULL, 'T', 0)",
        "CREATE TABLE snap (id INT, v TEXT) AS VALUES (1, 'x'), (3, 'y')",
        "CREATE STREAMING TABLE d1",
        "CREATE FLOW d1_flow AS AUTO CDC INTO d1 FROM feed KEYS (id) \
         APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)",
        "CREATE STREAMING TABLE t1",
        "CREATE FLOW t1_flow AS AUTO CDC INTO t1 FROM feed KEYS (id) \
         APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' \
         SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)",
        "CREATE STREAMING TABLE h2",
        "CREATE FLOW h2_flow AS AUTO CDC INTO h2 FROM feed KEYS (id) \
         APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) \
         STORED AS SCD TYPE 2",
        "CREATE VIEW feed64 AS SELECT id, v, op, CAST(seq AS BIGINT) AS seq FROM feed",
        "CREATE STREAMING TABLE both",
        "CREATE FLOW both_snapshot AS AUTO CDC INTO both FROM SNAPSHOT (SELECT * FROM snap) \
         WITH VERSION (SELECT min(seq) AS version FROM feed64 \
         WHERE seq > (SELECT coalesce(max(version), -1) FROM last_snapshot_version())) KEYS (id)",
        "CREATE FLOW both_changes AS AUTO CDC INTO both FROM feed64 KEYS (id) \
         APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)",
        "INSERT INTO feed VALUES (2, 'c', 'U', 5)",
    ] {
        run(&s, sql).await.map_err(|e| e.context(sql))?;
    }
    Ok(s)
}

/// The predicates of the plan's `FilterExec`s that hold a tautology
/// `x IS NOT DISTINCT FROM true OR x IS DISTINCT FROM true` (what the
/// optimizer makes of `x IS TRUE OR x IS NOT TRUE`).
fn always_true_filters(plan: &str) -> Vec<String> {
    const IS_TRUE_OR: &str = " IS NOT DISTINCT FROM true OR ";
    plan.lines()
        .filter_map(|line| line.split("FilterExec: ").nth(1))
        .map(|p| p.trim_end_matches('|').trim().to_string())
        .filter(|predicate| {
            predicate.match_indices(IS_TRUE_OR).any(|(at, _)| {
                let (left, right) = (&predicate[..at], &predicate[at + IS_TRUE_OR.len()..]);
                (0..left.len())
                    .filter(|&i| left.is_char_boundary(i))
                    .any(|i| right.starts_with(&format!("{} IS DISTINCT FROM true", &left[i..])))
            })
        })
        .collect()
}

#[test]
fn the_checker_finds_an_always_true_filter() {
    for plan in [
        "|   FilterExec: __common_expr_5@0 IS NOT DISTINCT FROM true OR \
         __common_expr_5@0 IS DISTINCT FROM true   |",
        "FilterExec: (t@0 IS NOT NULL AND t@0) IS DISTINCT FROM true AND ((op@3 = D) \
         IS NOT DISTINCT FROM true OR (op@3 = D) IS DISTINCT FROM true), projection=[seq@4]",
    ] {
        assert_eq!(always_true_filters(plan).len(), 1, "{plan}");
    }
    for plan in [
        "FilterExec: a@0 IS DISTINCT FROM true",
        "FilterExec: a@0 IS NOT DISTINCT FROM true OR b@1 IS DISTINCT FROM true",
    ] {
        assert!(always_true_filters(plan).is_empty(), "{plan}");
    }
}

#[tokio::test]
async fn update_plans_hold_no_filter_that_is_always_true() -> Result<()> {
    let s = session().await?;
    for table in ["d1", "t1", "h2", "both"] {
        let plan = run(
            &s,
            &format!("EXPLAIN FORMAT indent REFRESH STREAMING TABLE {table}"),
        )
        .await?;
        assert!(plan.contains("AutoCdcExec"), "{plan}");
        let found = always_true_filters(&plan);
        assert!(found.is_empty(), "{table}: {found:?}\n{plan}");
    }
    // a flow with truncates still separates them from the rows
    let plan = run(&s, "EXPLAIN FORMAT indent REFRESH STREAMING TABLE t1").await?;
    assert!(plan.contains("FilterExec"), "{plan}");
    // and the updates are right: without APPLY AS TRUNCATE, 'T' is an upsert
    run(&s, "REFRESH STREAMING TABLE d1").await?;
    run(&s, "REFRESH STREAMING TABLE t1").await?;
    let rows = |sql: &'static str| {
        let s = &s;
        async move {
            let batches = s.sql(sql).await?.collect().await?;
            Ok::<_, datafusion::error::DataFusionError>(
                datafusion::arrow::util::pretty::pretty_format_batches(&batches)?
                    .to_string()
                    .lines()
                    .filter(|l| l.starts_with("| "))
                    .skip(1)
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect::<Vec<_>>(),
            )
        }
    };
    assert_eq!(
        rows("SELECT id, v FROM d1 ORDER BY id").await?,
        ["| 0 | |", "| 2 | c |"]
    );
    assert_eq!(
        rows("SELECT id, v FROM t1 ORDER BY id").await?,
        ["| 2 | c |"]
    );
    Ok(())
}

#[tokio::test]
async fn explain_prints_in_the_sessions_format() -> Result<()> {
    let s = session().await?;
    let refresh = "REFRESH STREAMING TABLE d1";
    // DataFusion's default: indented
    let indent = run(&s, &format!("EXPLAIN {refresh}")).await?;
    assert!(indent.contains("AutoCdcExec: flow=d1_flow"), "{indent}");
    assert!(!indent.contains('┌'), "{indent}");

    run(&s, "SET datafusion.explain.format = 'tree'").await?;
    let tree = run(&s, &format!("EXPLAIN {refresh}")).await?;
    assert!(tree.contains('┌') && tree.contains("AutoCdcExec"), "{tree}");
    assert!(!tree.contains("AutoCdcExec: flow="), "{tree}");
    // one option away
    let again = run(&s, &format!("EXPLAIN FORMAT indent {refresh}")).await?;
    assert!(again.contains("AutoCdcExec: flow=d1_flow"), "{again}");
    // VERBOSE and ANALYZE print indented, as DataFusion does
    let verbose = run(&s, &format!("EXPLAIN VERBOSE {refresh}")).await?;
    assert!(verbose.contains("AutoCdcExec: flow=d1_flow"), "{verbose}");
    let err = run(&s, &format!("EXPLAIN VERBOSE FORMAT tree {refresh}"))
        .await
        .expect_err("tree is not verbose");
    assert!(
        err.to_string().contains("FORMAT tree is not supported"),
        "{err}"
    );
    let err = run(&s, &format!("EXPLAIN FORMAT boxes {refresh}"))
        .await
        .expect_err("no such format");
    assert!(err.to_string().contains("boxes"), "{err}");
    Ok(())
}

/// A target's expectations are checked between a flow's events and the fold,
/// and `EXPLAIN ANALYZE` counts each one's passed and failed rows.
#[tokio::test]
async fn expectations_sit_between_the_events_and_the_fold() -> Result<()> {
    let s = session().await?;
    for sql in [
        "CREATE STREAMING TABLE checked (id INT, v STRING, \
         CONSTRAINT has_v EXPECT (v IS NOT NULL) ON VIOLATION DROP ROW)",
        "CREATE FLOW checked_flow AS AUTO CDC INTO checked FROM feed KEYS (id) \
         SEQUENCE BY seq COLUMNS (id, v)",
    ] {
        run(&s, sql).await?;
    }
    let plan = run(&s, "EXPLAIN FORMAT indent REFRESH STREAMING TABLE checked").await?;
    let lines: Vec<&str> = plan.lines().collect();
    let fold = lines.iter().position(|l| l.contains("AutoCdcExec"));
    let check = lines.iter().position(|l| {
        l.contains("ExpectationsExec: flow=checked_flow, expectations=[has_v DROP ROW]")
    });
    assert!(
        matches!((fold, check), (Some(f), Some(c)) if f < c),
        "{plan}"
    );
    let analyzed = run(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE checked").await?;
    // feed: (1 a) (2 b) (1 NULL D) (0 NULL T) (2 c): two rows without v
    assert!(
        analyzed.contains("passed_has_v=3") && analyzed.contains("failed_has_v=2"),
        "{analyzed}"
    );
    Ok(())
}

/// An append flow's update is a plan like any flow's: `EXPLAIN REFRESH`
/// shows its write and commit over its query, `EXPLAIN ANALYZE REFRESH`
/// what they did, and a run with nothing new commits no file.
#[tokio::test]
async fn append_flow_updates_write_and_commit_as_plans() -> Result<()> {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    for sql in [
        "CREATE TABLE raw (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
        "CREATE STREAMING TABLE bronze",
        "CREATE FLOW fb AS AUTO CDC INTO bronze FROM raw KEYS (id) SEQUENCE BY seq",
        "CREATE STREAMING TABLE log AS SELECT id, upper(v) AS v FROM STREAM bronze",
        "INSERT INTO raw VALUES (3, 'c', 1), (4, 'd', 1)",
        "REFRESH STREAMING TABLE bronze",
    ] {
        run(&s, sql).await.map_err(|e| e.context(sql))?;
    }
    let plan = run(&s, "EXPLAIN FORMAT INDENT REFRESH STREAMING TABLE log").await?;
    let write = plan.find("CdcWriteExec: target=log,");
    let commit = plan.find("CdcCommitExec: target=log, flow=log");
    assert!(
        matches!((commit, write), (Some(c), Some(w)) if c < w),
        "{plan}"
    );
    assert!(!plan.contains("AutoCdcExec"), "{plan}");
    let analyzed = run(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE log").await?;
    for metric in ["num_rows_written=2", "num_files_added=", "commit_version="] {
        assert!(analyzed.contains(metric), "{metric}: {analyzed}");
    }
    assert!(analyzed.contains("num_files_removed=0"), "{analyzed}");
    assert_eq!(
        run(&s, "SELECT id, v FROM log ORDER BY id").await?,
        run(&s, "SELECT id, upper(v) AS v FROM raw ORDER BY id").await?
    );
    // nothing new: the checkpoint moves, no file is added
    let again = run(&s, "EXPLAIN ANALYZE REFRESH STREAMING TABLE log").await?;
    assert!(again.contains("num_files_added=0"), "{again}");
    assert_eq!(
        run(&s, "SELECT count(*) AS n FROM log")
            .await?
            .matches("| 4 |")
            .count(),
        1
    );
    Ok(())
}
