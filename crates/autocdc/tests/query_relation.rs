//! AUTO CDC in a query (`AutoCdcDataFrame::auto_cdc`): over the same events,
//! the relation holds what a flow's target holds after its first update —
//! SCD 1 with deletes, truncates and late events, SCD 2 with TRACK HISTORY,
//! BITEMPORAL, partial updates — and refuses what a flow refuses, with the
//! flow's message; `auto_cdc_changes` holds the change feed that update
//! writes.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion_autocdc::sql::{parse_cdc_statement, CdcStatement};
use datafusion_autocdc::{AutoCdcConfig, AutoCdcDataFrame, CdcSession, FlowSpec};

async fn text(s: &CdcSession, sql: &str) -> Result<String> {
    let batches = s.sql(sql).await?.collect().await?;
    Ok(pretty_format_batches(&batches)?.to_string())
}

fn spec(flow_sql: &str) -> FlowSpec {
    match parse_cdc_statement(flow_sql, "generic", true) {
        Ok(Some(CdcStatement::CreateFlow(spec))) => *spec,
        other => panic!("not a flow: {other:?}"),
    }
}

/// The flow `flow_sql` (into `target`, from `ev`) and the relation over `ev`
/// hold the same rows.
async fn same_rows(s: &CdcSession, target: &str, flow_sql: &str, order: &str) -> Result<()> {
    text(s, &format!("CREATE STREAMING TABLE {target}")).await?;
    text(s, flow_sql).await?;
    let relation = s.context().table("ev").await?.auto_cdc(&spec(flow_sql))?;
    s.context()
        .register_table(format!("{target}_q"), relation.into_view())?;
    let flow = text(s, &format!("SELECT * FROM {target} ORDER BY {order}")).await?;
    let query = text(s, &format!("SELECT * FROM {target}_q ORDER BY {order}")).await?;
    assert_eq!(flow, query, "{flow_sql}");
    assert!(flow.lines().count() > 4, "{flow}");
    // and the change feed of that update is the relation's `WITH CHANGES`
    let changes = s
        .context()
        .table("ev")
        .await?
        .auto_cdc_changes(&spec(flow_sql))?;
    s.context()
        .register_table(format!("{target}_c"), changes.into_view())?;
    let flow = text(
        s,
        &format!(
            "SELECT * EXCEPT (_commit_version, _commit_timestamp) FROM table_changes('{target}', 0) \
             ORDER BY _change_type, {order}"
        ),
    )
    .await?;
    let query = text(
        s,
        &format!("SELECT * FROM {target}_c ORDER BY _change_type, {order}"),
    )
    .await?;
    assert_eq!(flow, query, "the change feed of {flow_sql}");
    Ok(())
}

#[tokio::test]
async fn the_relation_holds_what_a_flow_target_holds() -> Result<()> {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    text(
        &s,
        "CREATE TABLE ev (id INT, name TEXT, city TEXT, op TEXT, seq INT) AS VALUES
           (124, 'Raul', 'Oaxaca', 'INSERT', 1), (123, 'Isabel', 'Monterrey', 'INSERT', 1),
           (125, 'Mercedes', 'Tijuana', 'INSERT', 2), (126, 'Lily', 'Cancun', 'INSERT', 2),
           (123, NULL, NULL, 'DELETE', 6), (125, 'Mercedes', 'Guadalajara', 'UPDATE', 6),
           (125, 'Mercedes', 'Mexicali', 'UPDATE', 5), (123, 'Isabel', 'Chihuahua', 'UPDATE', 5),
           (0, NULL, NULL, 'TRUNCATE', 3), (126, NULL, 'Merida', 'UPDATE', 7)",
    )
    .await?;
    same_rows(
        &s,
        "scd1",
        "CREATE FLOW scd1 AS AUTO CDC INTO scd1 FROM ev KEYS (id)
           APPLY AS DELETE WHEN op = 'DELETE' APPLY AS TRUNCATE WHEN op = 'TRUNCATE'
           SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)",
        "id",
    )
    .await?;
    same_rows(
        &s,
        "scd2",
        "CREATE FLOW scd2 AS AUTO CDC INTO scd2 FROM ev KEYS (id)
           APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)
           STORED AS SCD TYPE 2 TRACK HISTORY ON (city)",
        "id, __START_AT",
    )
    .await?;
    same_rows(
        &s,
        "partial",
        "CREATE FLOW partial AS AUTO CDC INTO partial FROM ev KEYS (id) IGNORE NULL UPDATES
           APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)",
        "id",
    )
    .await?;
    text(
        &s,
        "CREATE TABLE bev (id INT, x TEXT, bt INT, st INT) AS VALUES
           (1, 'x10', 10, 100), (1, 'x20', 20, 200), (1, 'x15', 15, 300), (2, 'y', 5, 50)",
    )
    .await?;
    // (the helper reads `ev`: bev through a flow of its own)
    text(&s, "CREATE STREAMING TABLE bi").await?;
    let flow = "CREATE FLOW bi AS AUTO CDC INTO bi FROM bev KEYS (id) SEQUENCE BY bt
                SYSTEM SEQUENCE BY st STORED AS BITEMPORAL";
    text(&s, flow).await?;
    let relation = s.context().table("bev").await?.auto_cdc(&spec(flow))?;
    s.context().register_table("bi_q", relation.into_view())?;
    let order = "id, __START_AT, __SYSTEM_START_AT";
    assert_eq!(
        text(&s, &format!("SELECT * FROM bi ORDER BY {order}")).await?,
        text(&s, &format!("SELECT * FROM bi_q ORDER BY {order}")).await?
    );
    Ok(())
}

#[tokio::test]
async fn the_relation_refuses_what_a_flow_refuses() -> Result<()> {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    text(
        &s,
        "CREATE TABLE ev (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (NULL, 'b', 2)",
    )
    .await?;
    let flow = "CREATE FLOW q AS AUTO CDC INTO q FROM ev KEYS (id) SEQUENCE BY seq";
    let relation = s.context().table("ev").await?.auto_cdc(&spec(flow))?;
    let err = relation.collect().await.expect_err("a NULL key");
    assert!(
        err.to_string().contains("flow 'q'") && err.to_string().contains("NULL"),
        "{err}"
    );
    let bad = "CREATE FLOW q AS AUTO CDC INTO q FROM ev KEYS (nope) SEQUENCE BY seq";
    let err = s
        .context()
        .table("ev")
        .await?
        .auto_cdc(&spec(bad))
        .expect_err("an unknown key");
    assert!(err.to_string().contains("flow 'q': KEYS"), "{err}");
    // EXPLAIN shows the fold, without writes
    let plan = s
        .context()
        .table("ev")
        .await?
        .filter(datafusion::prelude::col("id").is_not_null())?
        .auto_cdc(&spec(flow))?
        .explain(false, false)?
        .collect()
        .await?;
    let plan = pretty_format_batches(&plan)?.to_string();
    assert!(
        plan.contains("AutoCdcExec") && !plan.contains("CdcWriteExec"),
        "{plan}"
    );
    Ok(())
}

/// The SQL relation is the DataFrame method: same rows, and `EXPLAIN`
/// shows the fold; the names it plans under do not outlive the statement.
#[tokio::test]
async fn the_sql_relation_plans_the_fold() -> Result<()> {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    text(
        &s,
        "CREATE TABLE ev (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (1, 'b', 2), (2, 'c', 1)",
    )
    .await?;
    let sql = "SELECT * FROM AUTO CDC (SELECT * FROM ev) KEYS (id) SEQUENCE BY seq \
               COLUMNS (id, v) STORED AS SCD TYPE 2 AS r ORDER BY id, __START_AT";
    let rows = text(&s, sql).await?;
    let flow = "CREATE FLOW q AS AUTO CDC INTO q FROM ev KEYS (id) SEQUENCE BY seq \
                COLUMNS (id, v) STORED AS SCD TYPE 2";
    let relation = s.context().table("ev").await?.auto_cdc(&spec(flow))?;
    s.context()
        .register_table("by_method", relation.into_view())?;
    assert_eq!(
        rows,
        text(&s, "SELECT * FROM by_method ORDER BY id, __START_AT").await?
    );
    let plan = text(&s, &format!("EXPLAIN {sql}")).await?;
    assert!(plan.contains("AutoCdcExec: flow=auto_cdc"), "{plan}");
    let tables = text(&s, "SELECT table_name FROM information_schema.tables").await;
    if let Ok(tables) = tables {
        assert!(!tables.contains("__autocdc_relation"), "{tables}");
    }
    Ok(())
}

/// A filter on the key columns is planned below the fold, on its events;
/// one on other columns stays above it.
#[tokio::test]
async fn key_filters_go_below_the_fold() -> Result<()> {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    text(
        &s,
        "CREATE TABLE ev (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (1, 'b', 2), (2, 'c', 1)",
    )
    .await?;
    let sql = "SELECT * FROM AUTO CDC (SELECT * FROM ev) KEYS (id) SEQUENCE BY seq \
               COLUMNS (id, v) AS r WHERE r.id = 1 AND r.v <> 'x'";
    let plan = s
        .sql(sql)
        .await?
        .into_optimized_plan()?
        .display_indent()
        .to_string();
    let fold = plan.find("AutoCdc:").expect("the fold is planned");
    let key = plan
        .find("ev.id = Int32(1)")
        .expect("the key filter is planned");
    let other = plan
        .find("v != Utf8(\"x\")")
        .expect("the other filter is planned");
    assert!(key > fold, "the key filter below the fold:\n{plan}");
    assert!(other < fold, "the other filter above the fold:\n{plan}");
    assert_eq!(
        text(&s, sql)
            .await?
            .lines()
            .filter(|l| l.starts_with("| 1"))
            .count(),
        1
    );
    Ok(())
}

/// A query reads only the source columns its result needs: the keys, the
/// sequence, the delete condition's and (SCD 2) the tracked columns; the
/// rows it returns are those of the whole relation. A change feed (`WITH
/// CHANGES`) compares whole rows, so it reads every column.
#[tokio::test]
async fn queries_read_only_the_columns_they_need() -> Result<()> {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    text(
        &s,
        "CREATE TABLE ev (id INT, a TEXT, b INT, op TEXT, seq INT) AS VALUES \
         (1, 'x', 1, 'U', 1), (1, 'y', 2, 'U', 2), (2, 'z', 3, 'U', 1), (2, NULL, NULL, 'D', 3), \
         (3, 'w', 4, 'U', 5)",
    )
    .await?;
    let scan = |plan: &str| -> String {
        plan.lines()
            .find(|l| l.contains("TableScan: ev"))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let relation = |extra: &str| {
        format!(
            "AUTO CDC (SELECT * FROM ev) KEYS (id) APPLY AS DELETE WHEN op = 'D' \
             SEQUENCE BY seq COLUMNS * EXCEPT (op) {extra}"
        )
    };
    let plan = |sql: String| {
        let s = &s;
        async move {
            Ok::<_, datafusion::error::DataFusionError>(
                s.sql(&sql)
                    .await?
                    .into_optimized_plan()?
                    .display_indent()
                    .to_string(),
            )
        }
    };
    let scd1 = format!(
        "SELECT count(*) AS n, sum(seq) AS s FROM {} AS t",
        relation("")
    );
    assert_eq!(
        scan(&plan(scd1.clone()).await?),
        "TableScan: ev projection=[id, op, seq]"
    );
    let rows = text(&s, &scd1).await?;
    assert!(rows.contains("| 2 | 7 |"), "{rows}");
    let scd2 = format!(
        "SELECT id, __start_at, __end_at FROM {} AS t",
        relation("STORED AS SCD TYPE 2 TRACK HISTORY ON (b)")
    );
    assert_eq!(
        scan(&plan(scd2.clone()).await?),
        "TableScan: ev projection=[id, b, op, seq]"
    );
    let pruned = text(
        &s,
        &format!("SELECT * FROM ({scd2}) ORDER BY id, __start_at"),
    )
    .await?;
    // what a flow (which reads every column) stores
    text(&s, "CREATE STREAMING TABLE h").await?;
    text(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO h FROM ev KEYS (id) APPLY AS DELETE WHEN op = 'D' \
         SEQUENCE BY seq COLUMNS * EXCEPT (op) STORED AS SCD TYPE 2 TRACK HISTORY ON (b)",
    )
    .await?;
    let stored = text(
        &s,
        "SELECT id, __start_at, __end_at FROM h ORDER BY id, __start_at",
    )
    .await?;
    assert_eq!(pruned, stored);
    assert_eq!(pruned.lines().count(), 8, "{pruned}");
    let changes = format!("SELECT count(*) FROM {} WITH CHANGES AS t", relation(""));
    assert_eq!(
        scan(&plan(changes).await?),
        "TableScan: ev projection=[id, a, b, op, seq]"
    );
    Ok(())
}

#[allow(dead_code)]
#[path = "../../../examples/query_time.rs"]
mod query_time_example;

/// `examples/query_time.rs`: the history and the current rows of a change
/// feed, asked in queries.
#[tokio::test]
async fn the_query_time_example_runs() -> Result<()> {
    let answers = query_time_example::run().await?;
    let history = pretty_format_batches(&answers.history)?.to_string();
    assert_eq!(
        history.lines().filter(|l| l.starts_with("| 1")).count(),
        4,
        "{history}"
    );
    assert!(
        history.contains("| 124    | Oaxaca      | 1     | 7     |"),
        "{history}"
    );
    let current = pretty_format_batches(&answers.current)?.to_string();
    assert!(
        current.contains("| 125    | Guadalajara |") && !current.contains("124"),
        "{current}"
    );
    Ok(())
}

/// The rows of `frame` sorted by `by`, one line each, blanks collapsed.
async fn sorted_rows(frame: datafusion::prelude::DataFrame, by: &[&str]) -> Result<Vec<String>> {
    let batches = frame
        .sort_by(by.iter().map(|c| datafusion::prelude::col(*c)).collect())?
        .collect()
        .await?;
    Ok(pretty_format_batches(&batches)?
        .to_string()
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect())
}

/// `snapshot_diff` over a DataFrame of snapshots tagged by version: the
/// events it derives, and the fold of them.
#[tokio::test]
async fn snapshot_diff_folds_consecutive_snapshots() -> Result<()> {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    s.sql("CREATE TABLE snaps (v INT, id INT, name TEXT) AS VALUES (1, 1, 'a'), (1, 2, 'b'), (2, 1, 'a'), (3, 1, 'c'), (3, 2, 'd')")
        .await?;
    let events = datafusion_autocdc::query::snapshot_events(
        s.context().table("snaps").await?,
        &["id".to_string()],
        "v",
    )?;
    assert_eq!(
        sorted_rows(events, &["__snapshot_version", "id"]).await?,
        [
            "| 1 | a | 1 | false |",
            "| 2 | b | 1 | false |",
            "| 1 | a | 2 | false |",
            "| 2 | | 2 | true |",
            "| 1 | c | 3 | false |",
            "| 2 | d | 3 | false |",
        ]
    );
    let mut flow = FlowSpec::new(
        "snapshots",
        "t",
        datafusion_autocdc::FlowSource::Table("snaps".into()),
    );
    flow.keys = vec!["id".into()];
    flow.stored_as_scd_type = datafusion_autocdc::ScdType::Type2;
    let history = s
        .context()
        .table("snaps")
        .await?
        .snapshot_diff(&flow, "v")?;
    assert_eq!(
        sorted_rows(history, &["id", "__start_at"]).await?,
        [
            "| 1 | a | 1 | 3 |",
            "| 1 | c | 3 | |",
            "| 2 | b | 1 | 2 |",
            "| 2 | d | 3 | |",
        ]
    );
    Ok(())
}

/// A query's SCD 2 history folds its index (`fold=indexed`: versions found
/// by tracked-value hashes, checked exactly); when the pool refuses it,
/// each partition hands its events to the spilling sort; with
/// `autocdc.indexed_fold = false` DataFusion sorts them. The three give the
/// same versions, absorbed upserts, replays and deletes included.
#[tokio::test]
async fn a_query_history_is_the_same_indexed_sorted_or_fallen_back() -> Result<()> {
    let mut histories = Vec::new();
    for mode in ["indexed", "fall back", "sorted"] {
        let config = datafusion::prelude::SessionConfig::new()
            .with_target_partitions(2)
            .with_batch_size(1000);
        let s = CdcSession::open(AutoCdcConfig::in_memory().with_session_config(config)).await?;
        match mode {
            "fall back" => text(&s, "SET autocdc.indexed_fold_max_bytes = 1").await?,
            "sorted" => text(&s, "SET autocdc.indexed_fold = false").await?,
            _ => String::new(),
        };
        // 20 k events over 5 k keys, sequences descending per key, values
        // repeating (absorbed upserts), every 7th event a delete, and the
        // first 1 000 events replayed
        text(
            &s,
            "CREATE TABLE ev AS SELECT CAST(value % 5000 AS VARCHAR) AS id, \
             4 - value / 5000 AS seq, CAST((value / 10000) AS VARCHAR) AS v, \
             CASE WHEN value % 7 = 0 THEN 'D' ELSE 'U' END AS op \
             FROM generate_series(0, 19999) \
             UNION ALL SELECT CAST(value % 5000 AS VARCHAR), 4 - value / 5000, \
             CAST((value / 10000) AS VARCHAR), CASE WHEN value % 7 = 0 THEN 'D' ELSE 'U' END \
             FROM generate_series(0, 999)",
        )
        .await?;
        let sql = "SELECT id, v, __START_AT, __END_AT FROM AUTO CDC (SELECT * FROM ev) KEYS (id) \
                   APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) \
                   STORED AS SCD TYPE 2 AS h ORDER BY id, __START_AT";
        let analyzed = text(&s, &format!("EXPLAIN ANALYZE {sql}")).await?;
        let fold = analyzed
            .lines()
            .find(|l| l.contains("AutoCdcExec"))
            .unwrap_or_default();
        let expected = if mode == "sorted" {
            "fold=sorted"
        } else {
            "fold=indexed"
        };
        assert!(fold.contains(expected), "{mode}: {fold}");
        let fallbacks = if mode == "fall back" { 2 } else { 0 };
        assert!(
            fold.contains(&format!("num_sort_fallbacks={fallbacks},")),
            "{mode}: {fold}"
        );
        assert!(
            fold.contains("num_duplicate_rows_dropped=1.00 K"),
            "{mode}: {fold}"
        );
        assert_eq!(
            analyzed.contains("SortExec: expr=[id@0 ASC, __cdc_seq"),
            mode == "sorted",
            "{mode}"
        );
        histories.push(text(&s, sql).await?);
    }
    assert!(histories[0].lines().count() > 5_000, "{}", histories[0]);
    assert_eq!(histories[0], histories[1], "fall back");
    assert_eq!(histories[0], histories[2], "sorted");
    Ok(())
}
