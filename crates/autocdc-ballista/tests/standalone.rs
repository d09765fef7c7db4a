//! Updates on an in-process Ballista cluster (a scheduler and two
//! executors) equal the same updates run locally: the script of
//! `cluster_script.sql` (SCD 1 with deletes, a truncate and late events,
//! SCD 2, a snapshot flow; three updates each), its targets and change
//! feeds, DML statements, and `AUTO CDC` relations in queries; both executors ran tasks;
//! `EXPLAIN` shows where writes and folding queries run.

use std::path::Path;

use arrow::util::pretty::pretty_format_batches;
use autocdc_ballista::{open_session, Cluster};
use datafusion::common::Result;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

/// The statements of the script, with `{dir}` replaced.
fn script(dir: &Path) -> Vec<String> {
    include_str!("cluster_script.sql")
        .replace("{dir}", &dir.to_string_lossy())
        .split(';')
        .map(|s| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|s| !s.trim().is_empty())
        .collect()
}

/// Run the script; the results of its queries, as text.
async fn run(session: &CdcSession, dir: &Path) -> Result<Vec<String>> {
    let mut results = Vec::new();
    for statement in script(dir) {
        let batches = session
            .sql(&statement)
            .await
            .map_err(|e| e.context(statement.clone()))?
            .collect()
            .await
            .map_err(|e| e.context(statement.clone()))?;
        if statement.trim_start().starts_with("SELECT") {
            results.push(format!("{statement}\n{}", pretty_format_batches(&batches)?));
        }
    }
    Ok(results)
}

fn config(dir: &Path) -> AutoCdcConfig {
    AutoCdcConfig::new(dir.join("warehouse").to_string_lossy().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standalone_updates_equal_local_ones() -> Result<()> {
    let local_dir = tempfile::tempdir()?;
    let local = CdcSession::open(config(local_dir.path())).await?;
    let expected = run(&local, local_dir.path()).await?;

    let cluster_dir = tempfile::tempdir()?;
    let cluster = open_session(
        config(cluster_dir.path()),
        &Cluster::Standalone { executors: 2 },
    )
    .await?;
    let got = run(&cluster.session, cluster_dir.path()).await?;
    assert_eq!(got.len(), 10);
    for (g, e) in got.iter().zip(&expected) {
        assert_eq!(g, e);
    }
    // the script's DML took effect: updated, deleted, merged rows
    assert!(
        got[0].contains("Bergen") && got[0].contains("Graz"),
        "{}",
        got[0]
    );
    assert!(!got[0].contains("Flo"), "{}", got[0]);
    assert!(got[1].contains("Turin"), "{}", got[1]);

    // both executors ran tasks
    let tasks = cluster
        .standalone
        .as_ref()
        .expect("standalone")
        .tasks
        .snapshot();
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    assert!(tasks.values().all(|&n| n > 0), "{tasks:?}");

    // EXPLAIN shows the writes running on the cluster
    let explain = |sql: String| {
        let session = &cluster.session;
        async move {
            let plan = session.sql(&sql).await?.collect().await?;
            Ok::<_, datafusion::error::DataFusionError>(pretty_format_batches(&plan)?.to_string())
        }
    };
    for table in ["s1", "s2", "sn"] {
        let text = explain(format!("EXPLAIN REFRESH STREAMING TABLE {table}")).await?;
        let on_cluster = format!("DistributedWriteExec: scheduler={}", cluster.scheduler);
        assert!(text.contains(&on_cluster), "{text}");
        assert!(text.contains("StoredFilesExec"), "{text}");
        assert!(!text.contains("DeltaScanExec"), "{text}");
    }

    // a query that folds runs whole on the cluster
    let text = explain(
        "EXPLAIN SELECT count(*) FROM AUTO CDC (SELECT * FROM changes) KEYS (id) \
         SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)"
            .to_string(),
    )
    .await?;
    let on_cluster = format!("DistributedQueryExec: scheduler={}", cluster.scheduler);
    assert!(text.contains(&on_cluster), "{text}");
    assert!(text.contains("AutoCdcExec"), "{text}");
    Ok(())
}

/// A source of rows made in this process (`StreamingTableExec` over a
/// partition stream: no codec can ship it).
#[derive(Debug)]
struct Generated(arrow::array::RecordBatch);

impl datafusion::physical_plan::streaming::PartitionStream for Generated {
    fn schema(&self) -> &arrow::datatypes::SchemaRef {
        self.0.schema_ref()
    }

    fn execute(
        &self,
        _ctx: std::sync::Arc<datafusion::execution::TaskContext>,
    ) -> datafusion::execution::SendableRecordBatchStream {
        let batch = self.0.clone();
        Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                batch.schema(),
                futures::stream::iter([Ok(batch)]),
            ),
        )
    }
}

/// A flow whose source only the client can read runs its writes locally;
/// `EXPLAIN` says why, and the update is still right.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plans_that_cannot_travel_run_locally_and_say_so() -> Result<()> {
    use std::sync::Arc;
    let dir = tempfile::tempdir()?;
    let cluster = open_session(config(dir.path()), &Cluster::Standalone { executors: 2 }).await?;
    let s = &cluster.session;
    let batch = arrow::record_batch::RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(arrow::array::Int32Array::from(vec![1, 2])) as arrow::array::ArrayRef,
        ),
        (
            "v",
            Arc::new(arrow::array::StringArray::from(vec!["a", "b"])),
        ),
        ("seq", Arc::new(arrow::array::Int32Array::from(vec![1, 1]))),
    ])?;
    let table = datafusion::catalog::streaming::StreamingTable::try_new(
        batch.schema(),
        vec![Arc::new(Generated(batch))],
    )?;
    s.context().register_table("generated", Arc::new(table))?;
    for sql in [
        "CREATE STREAMING TABLE t",
        "CREATE FLOW f AS AUTO CDC INTO t FROM generated KEYS (id) SEQUENCE BY seq",
    ] {
        s.sql(sql).await?.collect().await?;
    }
    let rows = s
        .sql("SELECT id, v FROM t ORDER BY id")
        .await?
        .collect()
        .await?;
    assert_eq!(
        pretty_format_batches(&rows)?.to_string(),
        "+----+---+\n| id | v |\n+----+---+\n| 1  | a |\n| 2  | b |\n+----+---+"
    );
    let plan = s
        .sql("EXPLAIN REFRESH STREAMING TABLE t")
        .await?
        .collect()
        .await?;
    let text = pretty_format_batches(&plan)?.to_string();
    assert!(
        text.contains("DistributedWriteExec: runs locally ("),
        "{text}"
    );

    // expectations count in this process: a flow checked by them runs here
    for sql in [
        "CREATE TABLE events (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, NULL, 1)",
        "CREATE STREAMING TABLE checked (id INT, v STRING, \
         CONSTRAINT has_v EXPECT (v IS NOT NULL) ON VIOLATION DROP ROW)",
        "CREATE FLOW checked_flow AS AUTO CDC INTO checked FROM events KEYS (id) SEQUENCE BY seq \
         COLUMNS (id, v)",
    ] {
        s.sql(sql).await?.collect().await?;
    }
    let rows = s.sql("SELECT id, v FROM checked").await?.collect().await?;
    assert_eq!(
        pretty_format_batches(&rows)?.to_string(),
        "+----+---+\n| id | v |\n+----+---+\n| 1  | a |\n+----+---+"
    );
    let plan = s
        .sql("EXPLAIN FORMAT indent REFRESH STREAMING TABLE checked")
        .await?
        .collect()
        .await?;
    let text = pretty_format_batches(&plan)?.to_string();
    assert!(
        text.contains("DistributedWriteExec: runs locally (") && text.contains("ExpectationsExec"),
        "{text}"
    );
    Ok(())
}

/// A plan holding an in-memory table of more than tonic's default 4 MiB
/// reaches the standalone executors (its job waited for ever), for a query
/// relation and a flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plans_holding_large_in_memory_tables_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = open_session(config(dir.path()), &Cluster::Standalone { executors: 2 }).await?;
    let s = &cluster.session;
    let count = |sql: &'static str| async move {
        let batches = s.sql(sql).await?.collect().await?;
        Ok::<_, datafusion::error::DataFusionError>(pretty_format_batches(&batches)?.to_string())
    };
    // 400 000 rows of two BIGINTs and a string: about 12 MiB
    for sql in [
        "CREATE TABLE big AS SELECT value % 5003 AS id, (value * 7919) % 200003 AS seq, \
         'some text ' || value AS v FROM range(400000)",
        "CREATE STREAMING TABLE t",
        "CREATE FLOW f AS AUTO CDC INTO t FROM big KEYS (id) SEQUENCE BY seq",
    ] {
        tokio::time::timeout(std::time::Duration::from_secs(120), async {
            s.sql(sql).await?.collect().await
        })
        .await
        .expect("the statement's job never ended")?;
    }
    // (a job that waits for ever fails the test instead)
    let folded = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        count("SELECT count(*) AS n FROM AUTO CDC (SELECT * FROM big) KEYS (id) SEQUENCE BY seq"),
    )
    .await
    .expect("the relation's job never ended")?;
    assert!(folded.contains("| 5003 |"), "{folded}");
    let stored = count("SELECT count(*) AS n FROM t").await?;
    assert!(stored.contains("| 5003 |"), "{stored}");
    Ok(())
}

/// An update of a few hundred thousand events (staged by the client, under
/// the stage's 64 MiB) and a DML statement of as many rows run on the
/// cluster: their plans carried every row, and a plan past gRPC's 16 MiB
/// failed with a transport error ("h2 protocol error").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn updates_and_statements_of_many_rows_run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let land = dir.path().join("land");
    std::fs::create_dir_all(&land)?;
    let land = land.to_string_lossy();
    let cluster = open_session(config(dir.path()), &Cluster::Standalone { executors: 2 }).await?;
    let s = &cluster.session;
    let rows = |sql: String| async move {
        let batches = tokio::time::timeout(std::time::Duration::from_secs(300), async {
            s.sql(&sql).await?.collect().await
        })
        .await
        .expect("the statement's job never ended")
        .map_err(|e| e.context(sql))?;
        Ok::<_, datafusion::error::DataFusionError>(pretty_format_batches(&batches)?.to_string())
    };
    for sql in [
        format!(
            "COPY (SELECT value AS id, 'v0' AS v, value AS n, 0 AS seq FROM range(1000)) \
             TO '{land}/b0.parquet'"
        ),
        format!("CREATE EXTERNAL TABLE land STORED AS PARQUET LOCATION '{land}/'"),
        "CREATE STREAMING TABLE s".to_string(),
        "CREATE FLOW sf AS AUTO CDC INTO s FROM STREAM land KEYS (id) SEQUENCE BY seq".into(),
        "CREATE STREAMING TABLE h".to_string(),
        "CREATE FLOW hf AS AUTO CDC INTO h FROM STREAM land KEYS (id) SEQUENCE BY seq \
         STORED AS SCD TYPE 2"
            .into(),
        format!(
            "COPY (SELECT value AS id, 'v1_' || (value % 97) AS v, value * 2 AS n, 1 AS seq \
             FROM range(450000)) TO '{land}/b1.parquet'"
        ),
    ] {
        rows(sql).await?;
    }
    rows("REFRESH STREAMING TABLE s".into()).await?;
    let stored = rows("SELECT count(*) AS c, sum(n) AS n FROM s".into()).await?;
    assert!(stored.contains("| 450000 | 202499550000 |"), "{stored}");
    rows("REFRESH STREAMING TABLE h".into()).await?;
    let updated = rows("UPDATE h SET n = 1 WHERE __end_at IS NULL AND id < 200000".into()).await?;
    assert!(updated.contains("| 200000 |"), "{updated}");
    let ones = rows("SELECT count(*) AS c FROM h WHERE n = 1 AND __end_at IS NULL".into()).await?;
    assert!(ones.contains("| 200000 |"), "{ones}");
    Ok(())
}

/// An error raised on an executor (a NULL key) reads as it does when the
/// update runs here: its message, not the debug text of the errors around
/// it that Ballista hands back; the target is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_raised_on_executors_read_as_local_ones() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = open_session(config(dir.path()), &Cluster::Standalone { executors: 2 }).await?;
    let s = &cluster.session;
    for sql in [
        "CREATE TABLE c (id INT, name VARCHAR, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
        "CREATE STREAMING TABLE t",
        "CREATE FLOW f AS AUTO CDC INTO t FROM c KEYS (id) SEQUENCE BY seq",
        "INSERT INTO c VALUES (NULL, 'x', 2), (3, 'c', 2)",
    ] {
        s.sql(sql).await?.collect().await?;
    }
    let expected = "flow 'f': KEYS column 'id' is NULL in a UPSERT event with sequence 2; \
                    nothing was committed";
    let refresh = match s.sql("REFRESH STREAMING TABLE t").await {
        Ok(df) => df.collect().await.map(|_| ()),
        Err(e) => Err(e),
    };
    let err = refresh.expect_err("a NULL key").to_string();
    assert!(err.contains(expected), "{err}");
    assert!(!err.contains("DataFusionError("), "{err}");
    let query = s
        .sql("SELECT * FROM AUTO CDC (SELECT * FROM c) KEYS (id) SEQUENCE BY seq")
        .await?
        .collect()
        .await
        .expect_err("a NULL key")
        .to_string();
    assert!(
        query.contains("KEYS column 'id' is NULL") && !query.contains("DataFusionError("),
        "{query}"
    );
    let rows = pretty_format_batches(&s.sql("SELECT count(*) FROM t").await?.collect().await?)?;
    assert!(rows.to_string().contains("| 2 "), "{rows}");
    Ok(())
}

/// A cluster session's settings travel with its jobs (listed under their
/// prefix), and an update with `autocdc.plain_parquet_reads` off — which
/// read the rows of one fold partition of several — is refused, nothing
/// written; set back, the update runs whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn updates_without_plain_reads_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = open_session(config(dir.path()), &Cluster::Standalone { executors: 2 }).await?;
    let s = &cluster.session;
    for sql in [
        "SET datafusion.execution.target_partitions = 4",
        "CREATE TABLE c AS SELECT value AS id, 1 AS seq FROM generate_series(1, 2000)",
        "CREATE STREAMING TABLE t",
        "SET autocdc.plain_parquet_reads = false",
    ] {
        s.sql(sql).await?.collect().await?;
    }
    let flow = "CREATE FLOW f AS AUTO CDC INTO t FROM c KEYS (id) SEQUENCE BY seq";
    let refused = match s.sql(flow).await {
        Ok(df) => df.collect().await.map(|_| ()),
        Err(e) => Err(e),
    };
    let err = refused.expect_err("refused").to_string();
    assert!(
        err.contains("autocdc.plain_parquet_reads is false, but a session on a Ballista cluster"),
        "{err}"
    );
    s.sql("SET autocdc.plain_parquet_reads = true")
        .await?
        .collect()
        .await?;
    s.sql(flow).await?.collect().await?;
    let rows = pretty_format_batches(&s.sql("SELECT count(*) FROM t").await?.collect().await?)?;
    assert!(rows.to_string().contains("| 2000 "), "{rows}");
    Ok(())
}

/// A plan reading a table's change data through deltalake's store of this
/// process (an append flow's stream of a streaming table) runs here and
/// says why (on a cluster of other processes its executors could not
/// decode it: "No suitable object store found for delta-rs://…"); so do
/// rejects, named by their operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plans_reading_stores_of_this_process_run_locally() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = open_session(config(dir.path()), &Cluster::Standalone { executors: 2 }).await?;
    let s = &cluster.session;
    for sql in [
        "CREATE TABLE c (id INT, name VARCHAR, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
        "CREATE STREAMING TABLE up",
        "CREATE FLOW upf AS AUTO CDC INTO up FROM c KEYS (id) SEQUENCE BY seq",
        "CREATE STREAMING TABLE app AS SELECT id, name FROM STREAM up",
        "INSERT INTO c VALUES (3, 'c', 2)",
        "REFRESH STREAMING TABLE up",
        "CREATE STREAMING TABLE r TBLPROPERTIES ('autocdc.rejects' = 'true')",
        "CREATE FLOW rf AS AUTO CDC INTO r FROM c KEYS (id) SEQUENCE BY seq",
    ] {
        s.sql(sql).await?.collect().await?;
    }
    let explain = |table: &'static str| async move {
        let plan = s
            .sql(&format!(
                "EXPLAIN FORMAT indent REFRESH STREAMING TABLE {table}"
            ))
            .await?
            .collect()
            .await?;
        Ok::<_, datafusion::error::DataFusionError>(pretty_format_batches(&plan)?.to_string())
    };
    let app = explain("app").await?;
    assert!(
        app.contains("DistributedWriteExec: runs locally (it reads through delta-rs://"),
        "{app}"
    );
    let r = explain("r").await?;
    assert!(
        r.contains("runs locally (RejectsExec works with this process's state"),
        "{r}"
    );
    s.sql("REFRESH STREAMING TABLE app")
        .await?
        .collect()
        .await?;
    let rows = pretty_format_batches(&s.sql("SELECT count(*) FROM app").await?.collect().await?)?;
    assert!(rows.to_string().contains("| 3 "), "{rows}");
    Ok(())
}
