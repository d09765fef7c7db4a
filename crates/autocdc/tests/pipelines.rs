//! Pipeline updates through the Rust API and `REFRESH PIPELINE`'s result:
//! one entry per table in dependency order, a failed table's readers
//! skipped, one `update_id` for the whole update.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion_autocdc::{AutoCdcConfig, CdcSession, TableStatus};

async fn run(s: &CdcSession, sql: &str) -> Result<String> {
    let batches = s.sql(sql).await?.collect().await?;
    Ok(pretty_format_batches(&batches)?.to_string())
}

/// raw → bronze → silver, and `side` reading raw too; `other` in schema o.
async fn session() -> Result<CdcSession> {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    for sql in [
        "CREATE TABLE raw (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
        "CREATE STREAMING TABLE silver",
        "CREATE STREAMING TABLE bronze",
        "CREATE FLOW bronze AS AUTO CDC INTO bronze FROM raw KEYS (id) SEQUENCE BY seq",
        "CREATE FLOW silver AS AUTO CDC INTO silver FROM bronze KEYS (id) SEQUENCE BY seq \
         STORED AS SCD TYPE 2",
        "CREATE STREAMING TABLE side",
        "CREATE FLOW side AS AUTO CDC INTO side FROM (SELECT * FROM raw WHERE id IS NOT NULL) \
         KEYS (id) SEQUENCE BY seq",
        "CREATE STREAMING TABLE o.other",
        "CREATE FLOW other AS AUTO CDC INTO o.other FROM raw KEYS (id) SEQUENCE BY seq",
    ] {
        run(&s, sql).await.map_err(|e| e.context(sql))?;
    }
    Ok(s)
}

#[tokio::test]
async fn tables_update_in_dependency_order_and_failures_skip_their_readers() -> Result<()> {
    let s = session().await?;
    run(&s, "INSERT INTO raw VALUES (3, 'c', 2)").await?;
    let update = s.update_pipeline().schema("public").await?;
    let tables: Vec<(String, TableStatus)> = update
        .tables
        .iter()
        .map(|t| (t.table.to_string(), t.status))
        .collect();
    assert_eq!(
        tables,
        [
            ("bronze".to_string(), TableStatus::Updated),
            ("side".to_string(), TableStatus::Updated),
            ("silver".to_string(), TableStatus::Updated),
        ]
    );
    assert_eq!(update.tables[0].runs[0].num_upserted_rows, 1);
    // every commit of the update carries its id
    let tagged = run(
        &s,
        &format!(
            "SELECT count(*) AS n FROM event_log('silver') WHERE update_id = '{}'",
            update.update_id
        ),
    )
    .await?;
    assert!(tagged.contains("| 1 |"), "{tagged}");

    // a NULL key fails bronze: silver is skipped, side goes on
    run(&s, "INSERT INTO raw VALUES (NULL, 'x', 3), (4, 'd', 3)").await?;
    let update = s.update_pipeline().await?;
    let by_name = |name: &str| {
        update
            .tables
            .iter()
            .find(|t| t.table.to_string() == name)
            .unwrap_or_else(|| panic!("{name} in {update:?}"))
    };
    assert_eq!(by_name("bronze").status, TableStatus::Failed);
    // (the first line names the flow and says why, not only that it failed)
    assert!(
        by_name("bronze")
            .message
            .as_deref()
            .is_some_and(|m| m.contains("flow 'bronze': KEYS column 'id' is NULL")),
        "{update:?}"
    );
    assert_eq!(by_name("silver").status, TableStatus::Skipped);
    assert_eq!(
        by_name("silver").message.as_deref(),
        Some("upstream 'bronze' failed")
    );
    assert_eq!(by_name("side").status, TableStatus::Updated);
    assert_eq!(by_name("o.other").status, TableStatus::Failed);
    Ok(())
}

#[tokio::test]
async fn refresh_pipeline_prints_one_row_per_table() -> Result<()> {
    let s = session().await?;
    let out = run(&s, "REFRESH PIPELINE public FULL (bronze)").await?;
    let rows: Vec<Vec<String>> = out
        .lines()
        .filter(|l| l.starts_with("| ") && !l.contains("update_id"))
        .map(|l| {
            l.split('|')
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .skip(1) // the update id
                .collect()
        })
        .collect();
    assert_eq!(
        rows,
        [
            // FULL (bronze): bronze and silver from scratch, one commit
            // each, their rows written again unchanged (no change); side
            // replays
            ["bronze", "updated", "1", "0", "0", "2", "0", "2"],
            ["side", "updated", "1", "0", "0", "2", "2", "2"],
            ["silver", "updated", "1", "0", "0", "2", "0", "2"],
        ],
        "{out}"
    );
    let err = run(&s, "REFRESH PIPELINE FULL (nope)")
        .await
        .expect_err("no such table");
    assert!(
        err.to_string()
            .contains("'nope' is not a streaming table of the pipeline"),
        "{err}"
    );
    Ok(())
}

/// An update of what changed runs only the tables with something new to
/// read, judged in order (an upstream commit of the same update counts);
/// flows reading their source whole never count as changed.
#[tokio::test]
async fn an_update_of_what_changed_skips_tables_with_nothing_new() -> Result<()> {
    let s = session().await?;
    let statuses = |update: &datafusion_autocdc::PipelineUpdate| -> Vec<String> {
        update
            .tables
            .iter()
            .map(|t| format!("{} {}", t.table, t.status.name()))
            .collect()
    };
    let update = s
        .update_pipeline()
        .schema("public")
        .only_changed(true)
        .await?;
    assert_eq!(
        statuses(&update),
        ["bronze unchanged", "side unchanged", "silver unchanged"]
    );
    // bronze reads raw whole (never "changed"); refreshed by hand, it is
    // new data for silver
    run(&s, "INSERT INTO raw VALUES (3, 'c', 2)").await?;
    run(&s, "REFRESH STREAMING TABLE bronze").await?;
    let update = s
        .update_pipeline()
        .schema("public")
        .only_changed(true)
        .await?;
    assert_eq!(
        statuses(&update),
        ["bronze unchanged", "side unchanged", "silver updated"]
    );
    assert_eq!(update.tables[2].runs[0].num_upserted_rows, 1);
    let update = s
        .update_pipeline()
        .schema("public")
        .only_changed(true)
        .await?;
    assert_eq!(
        statuses(&update),
        ["bronze unchanged", "side unchanged", "silver unchanged"]
    );
    Ok(())
}

/// The event log says when the newest input of a run arrived — here the
/// upstream commit it read — and the latency from there to its commit.
#[tokio::test]
async fn the_event_log_records_when_the_newest_input_arrived() -> Result<()> {
    let s = session().await?;
    run(&s, "INSERT INTO raw VALUES (3, 'c', 2)").await?;
    s.update_pipeline().schema("public").await?;
    let out = run(
        &s,
        "SELECT s.newest_input_at = b.commit_timestamp AS from_upstream, s.latency_ms >= 0 AS ok
         FROM (SELECT * FROM event_log('silver') ORDER BY commit_version DESC LIMIT 1) s,
              (SELECT * FROM event_log('bronze') ORDER BY commit_version DESC LIMIT 1) b",
    )
    .await?;
    assert!(out.contains("| true          | true |"), "{out}");
    // a source read whole (an in-memory table) has no arrival time
    let out = run(
        &s,
        "SELECT count(*) AS n FROM event_log('bronze') WHERE newest_input_at IS NOT NULL",
    )
    .await?;
    assert!(out.contains("| 0 |"), "{out}");
    Ok(())
}

/// Tables that do not read one another update at the same time, at most
/// `autocdc.pipeline_max_concurrent_updates` at once, and a table starts
/// only after the tables it reads have committed; the tables end the same
/// at any bound.
#[tokio::test]
async fn independent_tables_update_concurrently() -> Result<()> {
    let mut contents = Vec::new();
    for limit in [1, 4] {
        let dir = tempfile::tempdir()?;
        let s = CdcSession::open(AutoCdcConfig::new(dir.path().to_str().unwrap_or("."))).await?;
        run(
            &s,
            &format!("SET autocdc.pipeline_max_concurrent_updates = {limit}"),
        )
        .await?;
        run(
            &s,
            "CREATE TABLE raw AS SELECT value AS id, 'v' || value AS v, 1 AS seq \
             FROM generate_series(1, 2000)",
        )
        .await?;
        for t in ["a", "b", "c", "d"] {
            run(&s, &format!("CREATE STREAMING TABLE {t}")).await?;
            run(
                &s,
                &format!("CREATE FLOW {t} AS AUTO CDC INTO {t} FROM raw KEYS (id) SEQUENCE BY seq"),
            )
            .await?;
        }
        run(&s, "CREATE STREAMING TABLE top").await?;
        run(
            &s,
            "CREATE FLOW top AS AUTO CDC INTO top FROM a KEYS (id) SEQUENCE BY seq \
             STORED AS SCD TYPE 2",
        )
        .await?;
        run(
            &s,
            "INSERT INTO raw SELECT value AS id, 'w' AS v, 2 AS seq FROM generate_series(1, 500)",
        )
        .await?;
        let update = s.update_pipeline().await?;
        let tables: Vec<(String, TableStatus)> = update
            .tables
            .iter()
            .map(|t| (t.table.to_string(), t.status))
            .collect();
        assert_eq!(
            tables,
            ["a", "b", "c", "d", "top"]
                .map(|t| (t.to_string(), TableStatus::Updated))
                .to_vec(),
            "limit {limit}"
        );
        // (start, end) of each table's commit of this update, in ms
        let mut spans = std::collections::BTreeMap::new();
        for t in ["a", "b", "c", "d", "top"] {
            let batches = s
                .sql(&format!(
                    "SELECT CAST(commit_timestamp AS BIGINT) - duration_ms, \
                     CAST(commit_timestamp AS BIGINT) FROM event_log('{t}') \
                     WHERE update_id = '{}'",
                    update.update_id
                ))
                .await?
                .collect()
                .await?;
            let batch = &batches[0];
            let column = |i: usize| {
                batch
                    .column(i)
                    .as_any()
                    .downcast_ref::<datafusion::arrow::array::Int64Array>()
                    .map(|a| a.value(0))
            };
            spans.insert(t, (column(0).unwrap_or(0), column(1).unwrap_or(0)));
        }
        // `top` reads `a`: it starts after `a` committed (ms rounding aside)
        assert!(spans["top"].0 + 2 >= spans["a"].1, "{spans:?}");
        let overlapping = ["a", "b", "c", "d"].iter().any(|x| {
            ["a", "b", "c", "d"]
                .iter()
                .any(|y| x < y && spans[x].0 < spans[y].1 && spans[y].0 < spans[x].1)
        });
        assert_eq!(overlapping, limit > 1, "limit {limit}: {spans:?}");
        let mut tables = String::new();
        for t in ["a", "b", "c", "d", "top"] {
            tables += &run(&s, &format!("SELECT * FROM {t} ORDER BY 1, 2, 3")).await?;
        }
        contents.push(tables);
    }
    assert_eq!(contents[0], contents[1]);
    Ok(())
}

/// A target's rejects table is written by the target's updates: it is no
/// table of the pipeline (it was listed, `updated` with nothing counted),
/// and a table reading it runs after the target.
#[tokio::test]
async fn a_rejects_table_goes_with_its_target() -> Result<()> {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    for sql in [
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1)",
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.rejects' = 'true')",
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
        "CREATE STREAMING TABLE bad AS SELECT flow, reason FROM STREAM t__rejects",
        "INSERT INTO src VALUES (NULL, 'x', 2), (2, 'b', NULL)",
    ] {
        run(&s, sql).await.map_err(|e| e.context(sql))?;
    }
    let update = s.update_pipeline().await?;
    let tables: Vec<String> = update
        .tables
        .iter()
        .map(|t| format!("{} {}", t.table, t.status.name()))
        .collect();
    assert_eq!(tables, ["t updated", "bad updated"]);
    assert_eq!(update.tables[1].runs[0].num_upserted_rows, 2);
    Ok(())
}

/// A table whose flow fails with an error carrying context ("the update of
/// 't' failed") says why on its row's first line too: the cause follows.
#[tokio::test]
async fn a_failed_table_says_why_on_its_row() -> Result<()> {
    let dir = tempfile::tempdir()
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
    let landing = dir.path().join("landing");
    std::fs::create_dir_all(&landing)?;
    std::fs::write(landing.join("a.csv"), "id,v,seq\n1,a,1\n")?;
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    run(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE landing (id INT, v TEXT, seq INT) STORED AS CSV \
             LOCATION '{}/' OPTIONS ('format.has_header' 'true')",
            landing.display()
        ),
    )
    .await?;
    run(&s, "CREATE STREAMING TABLE t").await?;
    run(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM STREAM landing KEYS (id) SEQUENCE BY seq",
    )
    .await?;
    std::fs::write(landing.join("b.csv"), "id,v,seq\n2,b,notanint\n")?;
    let update = s.update_pipeline().await?;
    let message = update.tables[0].message.clone().unwrap_or_default();
    assert_eq!(update.tables[0].status, TableStatus::Failed);
    assert!(message.contains("notanint"), "{message}");
    Ok(())
}
