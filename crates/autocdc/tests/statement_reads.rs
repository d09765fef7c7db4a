//! A DML statement that names its rows by key reads only the files of
//! those keys' buckets, each small one with one request: its cost follows
//! the change, not the table. The warehouse sits on a store that records
//! every read.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use datafusion::error::Result;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use object_store::memory::InMemory;

mod common;
use common::observed_store::{ObservedStore, Observer, Request};

/// Records the objects read, with whether the read was of a range, and
/// the prefixes listed.
#[derive(Debug, Default)]
struct Reads {
    reads: Mutex<Vec<(String, bool)>>,
    lists: Mutex<Vec<String>>,
}

/// What `seen` holds so far, then nothing.
fn take<T>(seen: &Mutex<Vec<T>>) -> Vec<T> {
    seen.lock()
        .map(|mut seen| std::mem::take(&mut *seen))
        .unwrap_or_default()
}

impl Reads {
    /// The reads so far, then none.
    fn take(&self) -> Vec<(String, bool)> {
        take(&self.reads)
    }

    /// The prefixes listed so far, then none.
    fn take_lists(&self) -> Vec<String> {
        take(&self.lists)
    }
}

impl Observer for Reads {
    fn request(&self, request: Request<'_>) -> object_store::Result<()> {
        match request {
            // (a file's metadata alone is no read of it: a lookup asks for
            // its loaded version's commit file so, `ScdTable::refresh`)
            Request::Get {
                location,
                ranged,
                head: false,
            } => {
                if let Ok(mut reads) = self.reads.lock() {
                    reads.push((location.to_string(), ranged));
                }
            }
            Request::List { prefix } => {
                if let Ok(mut lists) = self.lists.lock() {
                    lists.push(prefix.map(|p| p.to_string()).unwrap_or_default());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// A session on an in-memory warehouse whose reads are recorded.
async fn observed_session() -> Result<(Arc<ObservedStore<Reads>>, CdcSession)> {
    let store = Arc::new(ObservedStore::new(
        Arc::new(InMemory::new()),
        Reads::default(),
    ));
    let session = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone())).await?;
    Ok((store, session))
}

/// An observed session whose table `t` (2000 keys, `v` = 'v') had 200
/// rows updated to 'w': every data file has a deletion vector.
async fn session_with_deletion_vectors() -> Result<(Arc<ObservedStore<Reads>>, CdcSession)> {
    let (store, s) = observed_session().await?;
    for sql in [
        "CREATE TABLE src AS SELECT value AS id, 'v' AS v, 1 AS seq FROM generate_series(1, 2000)",
        "CREATE STREAMING TABLE t",
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
        "UPDATE t SET v = 'w' WHERE id <= 200",
    ] {
        s.sql(sql).await?.collect().await?;
    }
    Ok((store, s))
}

/// The buckets whose data files `reads` read.
fn buckets_read(reads: &[(String, bool)]) -> BTreeSet<String> {
    reads
        .iter()
        .filter(|(path, _)| !path.contains("_change_data") && path.ends_with(".parquet"))
        .filter_map(|(path, _)| {
            let at = path.find("__cdc_bucket=")?;
            Some(path[at..].split('/').next()?.to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dml_statement_naming_its_keys_reads_only_their_buckets() -> Result<()> {
    let (store, s) = observed_session().await?;
    s.sql(
        "CREATE TABLE src AS SELECT value AS id, 'v' || CAST(value AS TEXT) AS v, 1 AS seq \
         FROM generate_series(1, 2000)",
    )
    .await?
    .collect()
    .await?;
    s.sql("CREATE STREAMING TABLE t").await?.collect().await?;
    s.sql("CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq")
        .await?
        .collect()
        .await?;
    // rows retired in every bucket: each data file has a deletion vector
    s.sql("UPDATE t SET v = 'w' WHERE id <= 200")
        .await?
        .collect()
        .await?;
    for (statement, label) in [
        ("UPDATE t SET v = 'x' WHERE id = 1234", "UPDATE"),
        ("DELETE FROM t WHERE id IN (1500)", "DELETE"),
    ] {
        store.observer().take();
        s.sql(statement).await?.collect().await?;
        let reads = store.observer().take();
        let buckets = buckets_read(&reads);
        assert_eq!(
            buckets.len(),
            1,
            "{label} read the data files of {buckets:?}"
        );
        // (a small file is probed and its rows read from one request)
        let mut per_file = std::collections::BTreeMap::<&str, usize>::new();
        for (path, _) in &reads {
            if path.contains("__cdc_bucket=") && !path.contains("_change_data") {
                *per_file.entry(path.as_str()).or_default() += 1;
            }
        }
        assert!(
            !per_file.is_empty() && per_file.values().all(|n| *n == 1),
            "{label} read data files more than once: {per_file:?}"
        );
        let whole_vectors: Vec<&String> = reads
            .iter()
            .filter(|(path, ranged)| path.contains("deletion_vector") && !ranged)
            .map(|(path, _)| path)
            .collect();
        assert!(
            whole_vectors.is_empty(),
            "{label} read deletion vector files whole: {whole_vectors:?}"
        );
    }
    let rows = s
        .sql("SELECT count(*) AS n, sum(CASE WHEN v = 'x' THEN 1 ELSE 0 END) AS x FROM t")
        .await?
        .collect()
        .await?;
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&rows)?.to_string();
    assert!(text.contains("| 1999 | 1 |"), "{text}");
    Ok(())
}

/// What a probe needs of a data file (metadata, page index, key bloom
/// filters) is in the session's file metadata cache from the moment the file
/// is written: a statement reads only the files whose filters admit its
/// keys, and a session whose cache holds nothing (limit 0) reads every file
/// of the keys' buckets.
#[tokio::test(flavor = "multi_thread")]
async fn files_whose_filters_rule_the_keys_out_are_not_read_again() -> Result<()> {
    for (cache_limit, cached) in [(None, true), (Some("0"), false)] {
        let (store, s) = observed_session().await?;
        let run = |sql: String| {
            let s = &s;
            async move { s.sql(&sql).await?.collect().await }
        };
        if let Some(limit) = cache_limit {
            run(format!(
                "SET datafusion.runtime.metadata_cache_limit = '{limit}'"
            ))
            .await?;
        }
        run(
            "CREATE TABLE src AS SELECT value AS id, 'v' AS v, 1 AS seq \
             FROM generate_series(1, 2000)"
                .into(),
        )
        .await?;
        run("CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '1')".into()).await?;
        run("CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq".into()).await?;
        // the data files each statement reads
        let data_files_read = |sql: &'static str| {
            let (run, store) = (&run, &store);
            async move {
                store.observer().take();
                run(sql.into()).await?;
                let read: BTreeSet<String> = store
                    .observer()
                    .take()
                    .into_iter()
                    .map(|(path, _)| path)
                    .filter(|p| p.contains("__cdc_bucket=") && !p.contains("_change_data"))
                    .collect();
                Ok::<_, datafusion::error::DataFusionError>(read)
            }
        };
        // the first load's file (then a new file holding key 1234 only)
        let first = data_files_read("UPDATE t SET v = 'x' WHERE id = 1234").await?;
        assert_eq!(first.len(), 1, "{first:?}");
        // (then one holding key 77 only)
        let second = data_files_read("UPDATE t SET v = 'y' WHERE id = 77").await?;
        let third = data_files_read("UPDATE t SET v = 'z' WHERE id = 78").await?;
        if cached {
            assert_eq!(second, first);
            assert_eq!(third, first);
        } else {
            assert!(
                second.is_superset(&first) && second.len() == 2,
                "{second:?}"
            );
            assert!(third.is_superset(&second) && third.len() == 3, "{third:?}");
        }
        let rows = s
            .sql("SELECT v, count(*) AS n FROM t WHERE v <> 'v' GROUP BY v ORDER BY v")
            .await?
            .collect()
            .await?;
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&rows)?.to_string();
        for v in ["x", "y", "z"] {
            assert!(text.contains(&format!("| {v} | 1 |")), "{text}");
        }
    }
    Ok(())
}

/// The Delta commit files and deletion vectors a session wrote or read are
/// read again from memory (`table/log_cache.rs`): a one-row statement after
/// others reads neither, and a new session reads each commit file of the
/// logs it opens at most once (deltalake reads each twice to bring a table
/// up to date).
#[tokio::test(flavor = "multi_thread")]
async fn log_files_and_deletion_vectors_are_read_at_most_once() -> Result<()> {
    let (store, s) = session_with_deletion_vectors().await?;
    let is_log_or_vector = |path: &str| {
        (path.contains("_delta_log/") && path.ends_with(".json"))
            || path.contains("deletion_vector_")
    };
    store.observer().take();
    s.sql("UPDATE t SET v = 'x' WHERE id = 1234")
        .await?
        .collect()
        .await?;
    let again: Vec<String> = store
        .observer()
        .take()
        .into_iter()
        .map(|(path, _)| path)
        .filter(|p| is_log_or_vector(p))
        .collect();
    assert!(again.is_empty(), "read again: {again:?}");

    // a new session on the same store: each commit file once
    store.observer().take();
    let other = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone())).await?;
    let rows = other
        .sql("SELECT count(*) AS n, sum(CASE WHEN v = 'x' THEN 1 ELSE 0 END) AS x FROM t")
        .await?
        .collect()
        .await?;
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&rows)?.to_string();
    assert!(text.contains("| 2000 | 1 |"), "{text}");
    other
        .sql("UPDATE t SET v = 'y' WHERE id = 77")
        .await?
        .collect()
        .await?;
    let mut commits = std::collections::BTreeMap::<String, usize>::new();
    for (path, _) in store.observer().take() {
        if path.contains("_delta_log/") && path.ends_with(".json") {
            *commits.entry(path).or_default() += 1;
        }
    }
    assert!(
        !commits.is_empty() && commits.values().all(|n| *n == 1),
        "commit files read more than once: {commits:?}"
    );
    Ok(())
}

/// The listing deltalake makes after each commit is answered by the
/// warehouse's store (`table/log_listing.rs`): a one-row `UPDATE` or
/// `MERGE` lists the state log when it starts (what others committed
/// since) and before its commit, and the published log before the state
/// commit (no other Delta writer committed to it: `check_published`), when
/// it publishes and before its commit, nothing more. Another session's commits (another
/// process's) are seen by the next query and statement of this one, through
/// the session or its DataFusion context.
#[tokio::test(flavor = "multi_thread")]
async fn a_statement_lists_each_log_when_it_starts_and_before_its_commits() -> Result<()> {
    let (store, s) = session_with_deletion_vectors().await?;
    for statement in [
        "UPDATE t SET v = 'x' WHERE id = 1234",
        // (the target named by the statement and by the SQL planned for it)
        "MERGE INTO t USING (SELECT 1235 AS id, 'm' AS v) AS c ON t.id = c.id \
         WHEN MATCHED THEN UPDATE SET v = c.v",
    ] {
        store.observer().take_lists();
        s.sql(statement).await?.collect().await?;
        let lists = store.observer().take_lists();
        let state = lists
            .iter()
            .filter(|p| p.ends_with("/t/_autocdc/state/_delta_log"))
            .count();
        let published = lists
            .iter()
            .filter(|p| p.ends_with("/t/_delta_log"))
            .count();
        assert_eq!(
            (state, published, lists.len()),
            (2, 3, 5),
            "{statement}: {lists:?}"
        );
    }

    // another session (another process) commits between two statements of
    // this one; each sees the other's rows
    let other = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone())).await?;
    other
        .sql("UPDATE t SET v = 'y' WHERE id = 77")
        .await?
        .collect()
        .await?;
    let seen = s
        .sql("SELECT v FROM t WHERE id = 77")
        .await?
        .collect()
        .await?;
    let seen = datafusion::arrow::util::pretty::pretty_format_batches(&seen)?.to_string();
    assert!(seen.contains("| y |"), "{seen}");
    s.sql("UPDATE t SET v = 'z' WHERE id = 78")
        .await?
        .collect()
        .await?;
    // through the session and through its DataFusion context alike (the
    // context's schemas bring a streaming table up to date at lookup)
    let query = "SELECT id, v FROM t WHERE id IN (1, 77, 78, 1234) ORDER BY id";
    for session in [&other, &s] {
        for rows in [
            session.context().sql(query).await?.collect().await?,
            session.sql(query).await?.collect().await?,
        ] {
            let text = datafusion::arrow::util::pretty::pretty_format_batches(&rows)?.to_string();
            let expected = [
                "+------+---+",
                "| id   | v |",
                "+------+---+",
                "| 1    | w |",
                "| 77   | y |",
                "| 78   | z |",
                "| 1234 | x |",
                "+------+---+",
            ]
            .join("\n");
            assert_eq!(text, expected);
        }
    }
    Ok(())
}
