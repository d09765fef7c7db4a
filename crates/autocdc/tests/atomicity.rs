//! Atomicity: an update interrupted at any call to storage —
//! one failing call, or a "crash" after which every call fails — leaves the
//! target as it was (or, if the interruption came after the commit, as the
//! finished update left it); running it again in a new process on the same
//! warehouse gives exactly the table and change feed of a fault-free run: no
//! lost change, no duplicated change, no partial commit visible to readers.
//! Checked for every call index of an SCD 1, SCD 2, BITEMPORAL and snapshot
//! update, of an SCD 1 update with rejects (its rejected events too) and of
//! a `RESTORE` (and the update after it), for our reads and for the table at the target's path read by
//! deltalake (its rows and its change data feed): the calls of both stores
//! (the state store and the published table) are counted.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use object_store::memory::InMemory;
use object_store::ObjectStore;

mod common;
use common::observed_store::{ObservedStore, Observer, Request};

/// How armed [`Faults`] misbehave at the `n`-th call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// That call fails; later calls succeed.
    Fail,
    /// That call and every later one fail: the process is gone.
    Crash,
}

/// Makes the `n`-th call of any kind — get, list, put, copy, delete — to an
/// [`ObservedStore`] (over a shared in-memory store) fail, or every call
/// from it on.
#[derive(Debug, Default)]
struct Faults {
    calls: AtomicUsize,
    fail_at: AtomicUsize,
    crash: AtomicBool,
}

impl Faults {
    /// Misbehave at the `n`-th call from now (0: never).
    fn arm(&self, n: usize, fault: Fault) {
        self.calls.store(0, Ordering::SeqCst);
        self.crash.store(fault == Fault::Crash, Ordering::SeqCst);
        self.fail_at.store(n, Ordering::SeqCst);
    }
    fn fired(&self) -> bool {
        let at = self.fail_at.load(Ordering::SeqCst);
        at > 0 && self.calls.load(Ordering::SeqCst) >= at
    }
}

impl Observer for Faults {
    fn request(&self, _: Request<'_>) -> object_store::Result<()> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let at = self.fail_at.load(Ordering::SeqCst);
        let crashed = self.crash.load(Ordering::SeqCst) && at > 0 && n >= at;
        if n == at || crashed {
            return Err(object_store::Error::Generic {
                store: "faulty",
                source: format!("injected fault at call {n}").into(),
            });
        }
        Ok(())
    }
}

/// A session on a fresh in-memory warehouse whose storage calls go
/// through [`Faults`] (unarmed), and the store under them.
async fn faulty_session() -> (Arc<InMemory>, Arc<ObservedStore<Faults>>, CdcSession) {
    let memory = Arc::new(InMemory::new());
    let store = Arc::new(ObservedStore::new(memory.clone(), Faults::default()));
    let s = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone()))
        .await
        .unwrap();
    (memory, store, s)
}

async fn run(s: &CdcSession, sql: &str) -> datafusion::error::Result<String> {
    let batches = s.sql(sql).await?.collect().await?;
    Ok(pretty_format_batches(&batches)?.to_string())
}

const FIRST: &str = "(1, 'a', 'U', 1), (2, 'b', 'U', 1), (3, 'c', 'U', 1)";
const SECOND: &str = "(1, 'a2', 'U', 2), (2, NULL, 'D', 2), (4, 'd', 'U', 2), (3, 'c0', 'U', 0)";
/// The second update of a target with rejects on: [`SECOND`] and events
/// that would fail it.
const SECOND_REJECTS: &str = "(1, 'a2', 'U', 2), (2, NULL, 'D', 2), (4, 'd', 'U', 2), (3, 'c0', 'U', 0), (NULL, 'x', 'U', 2), (5, 'e', 'U', NULL)";

async fn setup(s: &CdcSession, stored_as: &str) {
    if stored_as == RESTORE {
        return setup_restore(s).await;
    }
    run(
        s,
        &format!("CREATE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES {FIRST}"),
    )
    .await
    .unwrap();
    let properties = if stored_as == REJECTS {
        " TBLPROPERTIES ('autocdc.rejects' = 'true')"
    } else {
        ""
    };
    run(s, &format!("CREATE STREAMING TABLE t{properties}"))
        .await
        .unwrap();
    let flow = if stored_as == "BITEMPORAL" {
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq SYSTEM SEQUENCE BY seq COLUMNS (id, v) STORED AS BITEMPORAL".to_string()
    } else if stored_as == "SNAPSHOT" {
        // periodic snapshots of the rows that are not deleted
        "CREATE FLOW f AS AUTO CDC INTO t FROM SNAPSHOT (SELECT id, v FROM src WHERE op <> 'D' AND seq > 0) KEYS (id)".to_string()
    } else {
        let stored_as = if stored_as == REJECTS || stored_as == DML {
            "SCD TYPE 1"
        } else {
            stored_as
        };
        format!("CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, v) STORED AS {stored_as}")
    };
    run(s, &flow).await.unwrap();
}

/// An SCD 1 target with rejects on (`setup`'s `stored_as`).
const REJECTS: &str = "REJECTS";

/// An SCD 1 target; the step checked is an `UPDATE` of two keys (their
/// stored rows retired with deletion vectors).
const DML: &str = "DML";

/// An SCD 2 target reading a file folder, two files applied; the step
/// checked is a `RESTORE` to the version after the first.
const RESTORE: &str = "RESTORE";

/// The folder source of the `RESTORE` case.
const FEED: &str =
    "CREATE EXTERNAL TABLE IF NOT EXISTS feed STORED AS PARQUET LOCATION 'memory:///feeds/'";

/// One file of the folder source of the `RESTORE` case.
async fn land_file(s: &CdcSession, name: &str, values: &str) {
    land_file_in(s, "feeds", name, values).await
}

/// One Parquet file of events `values` at `memory:///<folder>/<name>.parquet`.
async fn land_file_in(s: &CdcSession, folder: &str, name: &str, values: &str) {
    run(
        s,
        &format!(
            "COPY (SELECT CAST(column1 AS INT) AS id, column2 AS v, column3 AS op, CAST(column4 AS INT) AS seq \
             FROM (VALUES {values})) TO 'memory:///{folder}/{name}.parquet' STORED AS PARQUET"
        ),
    )
    .await
    .unwrap();
}

async fn setup_restore(s: &CdcSession) {
    land_file(s, "f1", FIRST).await;
    run(
        s,
        "CREATE EXTERNAL TABLE feed STORED AS PARQUET LOCATION 'memory:///feeds/'",
    )
    .await
    .unwrap();
    run(s, "CREATE STREAMING TABLE t").await.unwrap();
    run(s, "CREATE FLOW f AS AUTO CDC INTO t FROM feed KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, v) STORED AS SCD TYPE 2")
        .await
        .unwrap();
    land_file(s, "f2", SECOND).await;
    run(s, "REFRESH STREAMING TABLE t").await.unwrap();
}

async fn second_update(s: &CdcSession, stored_as: &str) -> datafusion::error::Result<String> {
    if stored_as == RESTORE {
        // (a new process registers its source again)
        run(s, FEED).await?;
        return run(s, "RESTORE STREAMING TABLE t TO VERSION AS OF 1").await;
    }
    if stored_as == DML {
        // (idempotent: a retry after a commit that reported a failure
        // changes nothing more)
        return run(s, "UPDATE t SET v = 'x' WHERE id IN (1, 2) AND v <> 'x'").await;
    }
    let second = if stored_as == REJECTS {
        SECOND_REJECTS
    } else {
        SECOND
    };
    run(
        s,
        &format!(
            "CREATE OR REPLACE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES {second}"
        ),
    )
    .await?;
    run(s, "REFRESH STREAMING TABLE t").await
}

/// What readers see: our visible rows and change feed, and the table at the
/// target's path as deltalake's own reader and change data feed read it
/// (without commit versions, which a retried update may shift).
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    rows: String,
    feed: String,
    published_rows: String,
    published_feed: String,
    /// The rejected events (a target with rejects on), else empty.
    rejects: String,
}

fn sorted(table: String) -> String {
    let mut lines: Vec<&str> = table.lines().filter(|l| l.starts_with('|')).collect();
    lines.sort_unstable();
    lines.join("\n")
}

async fn observe(s: &CdcSession, memory: &Arc<InMemory>) -> Observed {
    let rows = run(s, "SELECT * FROM t").await.unwrap();
    let feed = run(
        s,
        "SELECT * EXCEPT (_commit_version, _commit_timestamp) FROM table_changes('t', 0)",
    )
    .await
    .unwrap();
    let url = url::Url::parse("memory:///public/t/").unwrap();
    let table = deltalake_core::DeltaTableBuilder::from_url(url.clone())
        .unwrap()
        .with_storage_backend(Arc::clone(memory) as Arc<dyn ObjectStore>, url)
        .load()
        .await
        .unwrap();
    let ctx = datafusion::prelude::SessionContext::new();
    ctx.register_table("published", table.table_provider().await.unwrap())
        .unwrap();
    let cdf = deltalake_core::delta_datafusion::DeltaCdfTableProvider::try_new(
        table.scan_cdf().with_starting_version(0),
    )
    .unwrap();
    ctx.register_table("published_feed", Arc::new(cdf)).unwrap();
    let published = |sql: &'static str| {
        let ctx = ctx.clone();
        async move {
            let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
            pretty_format_batches(&batches).unwrap().to_string()
        }
    };
    let rejects = match run(s, "SELECT * FROM t__rejects").await {
        Ok(rows) => sorted(rows),
        Err(_) => String::new(),
    };
    let observed = Observed {
        rejects,
        rows: sorted(rows),
        feed: sorted(feed),
        published_rows: sorted(published("SELECT * FROM published").await),
        published_feed: sorted(
            published("SELECT * EXCEPT (_commit_version, _commit_timestamp) FROM published_feed")
                .await,
        ),
    };
    // the table at the path is what we show
    assert_eq!(observed.published_rows, observed.rows, "published rows");
    assert_eq!(
        observed.published_feed, observed.feed,
        "published change feed"
    );
    observed
}

async fn check(stored_as: &str, fault: Fault) {
    // the fault-free result
    let clean_memory = Arc::new(InMemory::new());
    let clean = CdcSession::open(AutoCdcConfig::in_memory_on(clean_memory.clone()))
        .await
        .unwrap();
    setup(&clean, stored_as).await;
    let before = observe(&clean, &clean_memory).await;
    second_update(&clean, stored_as).await.unwrap();
    let expected = observe(&clean, &clean_memory).await;
    if stored_as == REJECTS {
        assert!(
            expected.rejects.contains("NULL key column 'id'")
                && expected.rejects.contains("NULL sequence"),
            "the rejects of the second update: {}",
            expected.rejects
        );
    }

    for n in 1.. {
        let (memory, store, s) = faulty_session().await;
        setup(&s, stored_as).await;
        store.observer().arm(n, fault);
        let failed = second_update(&s, stored_as).await.is_err();
        let fired = store.observer().fired();
        drop(s);
        // a new process on the same warehouse: readers see the previous or
        // the next state, never a mix; running the update again finishes it
        let again = CdcSession::open(AutoCdcConfig::in_memory_on(memory.clone()))
            .await
            .unwrap();
        if failed {
            let now = observe(&again, &memory).await;
            assert!(
                now == before || now == expected,
                "{stored_as}, {fault:?} at call {n}: partial state\n{now:?}"
            );
        }
        second_update(&again, stored_as)
            .await
            .unwrap_or_else(|e| panic!("{stored_as}, retry after {fault:?} at call {n}: {e}"));
        assert_eq!(
            observe(&again, &memory).await,
            expected,
            "{stored_as}, {fault:?} at call {n}"
        );
        if stored_as == RESTORE {
            // the restored checkpoint: the next update reads the second file again
            run(&again, "REFRESH STREAMING TABLE t").await.unwrap();
            assert_eq!(
                observe(&again, &memory).await.rows,
                before.rows,
                "{stored_as}, {fault:?} at call {n}: REFRESH after the RESTORE"
            );
        }
        if !fired {
            assert!(n > 1, "the update made no call");
            eprintln!(
                "{stored_as}: {fault:?} at each of the update's {} storage calls checked",
                n - 1
            );
            break;
        }
    }
}

#[tokio::test]
async fn scd1_update_is_atomic_at_every_call() {
    check("SCD TYPE 1", Fault::Fail).await;
    check("SCD TYPE 1", Fault::Crash).await;
}

#[tokio::test]
async fn scd2_update_is_atomic_at_every_call() {
    check("SCD TYPE 2", Fault::Fail).await;
    check("SCD TYPE 2", Fault::Crash).await;
}

#[tokio::test]
async fn bitemporal_update_is_atomic_at_every_call() {
    check("BITEMPORAL", Fault::Fail).await;
    check("BITEMPORAL", Fault::Crash).await;
}

#[tokio::test]
async fn update_with_rejects_is_atomic_at_every_call() {
    check(REJECTS, Fault::Fail).await;
    check(REJECTS, Fault::Crash).await;
}

/// A crash at every call. (Not also a lone failing call, as the updates
/// are: a restore stops at its first failed call like at a crash unless a
/// retry absorbs it, and its calls are many — both would double a long test.)
#[tokio::test]
async fn restore_is_atomic_at_every_call() {
    check(RESTORE, Fault::Crash).await;
}

#[tokio::test]
async fn dml_statement_is_atomic_at_every_call() {
    check(DML, Fault::Fail).await;
    check(DML, Fault::Crash).await;
}

#[tokio::test]
async fn snapshot_update_is_atomic_at_every_call() {
    check("SNAPSHOT", Fault::Fail).await;
    check("SNAPSHOT", Fault::Crash).await;
}

/// Two flows of one target, the second `ONCE`, over file folders.
async fn setup_two_flows(s: &CdcSession) {
    land_file_in(s, "a", "1", "(1, 'a', 'U', 1), (2, 'b', 'U', 1)").await;
    land_file_in(s, "b", "1", "(3, 'c', 'U', 1), (4, 'd', 'U', 1)").await;
    register_two_sources(s).await;
    for sql in [
        "CREATE STREAMING TABLE t",
        "CREATE FLOW fa AS AUTO CDC INTO t FROM a KEYS (id) SEQUENCE BY seq COLUMNS (id, v)",
        "CREATE FLOW fb AS AUTO CDC ONCE INTO t FROM b KEYS (id) SEQUENCE BY seq COLUMNS (id, v)",
    ] {
        run(s, sql).await.unwrap();
    }
}

/// The folder sources of [`setup_two_flows`] (a new process registers them
/// again).
async fn register_two_sources(s: &CdcSession) {
    for folder in ["a", "b"] {
        run(
            s,
            &format!("CREATE EXTERNAL TABLE IF NOT EXISTS {folder} STORED AS PARQUET LOCATION 'memory:///{folder}/'"),
        )
        .await
        .unwrap();
    }
}

/// A full refresh of two flows is two commits: one that clears the table
/// and runs the first flow, then the second flow's. A process that stops
/// at any call between them leaves the second flow marked as still to run,
/// and the next update runs it, `ONCE` though it is: its rows come back
/// (the update without the mark ran only the first flow, and the `ONCE`
/// flow's rows were gone until another full refresh).
#[tokio::test]
async fn a_full_refresh_stopped_at_any_call_is_completed_by_the_next_update() {
    let clean_memory = Arc::new(InMemory::new());
    let clean = CdcSession::open(AutoCdcConfig::in_memory_on(clean_memory.clone()))
        .await
        .unwrap();
    setup_two_flows(&clean).await;
    run(&clean, "REFRESH STREAMING TABLE t FULL").await.unwrap();
    let expected = observe(&clean, &clean_memory).await.rows;
    assert!(expected.contains("| 4  | d |"), "{expected}");
    for n in 1.. {
        let (memory, store, s) = faulty_session().await;
        setup_two_flows(&s).await;
        store.observer().arm(n, Fault::Crash);
        let _ = run(&s, "REFRESH STREAMING TABLE t FULL").await;
        let fired = store.observer().fired();
        drop(s);
        let again = CdcSession::open(AutoCdcConfig::in_memory_on(memory.clone()))
            .await
            .unwrap();
        register_two_sources(&again).await;
        run(&again, "REFRESH STREAMING TABLE t")
            .await
            .unwrap_or_else(|e| panic!("the update after a stop at call {n}: {e}"));
        assert_eq!(
            observe(&again, &memory).await.rows,
            expected,
            "the update after a stop at call {n}"
        );
        if !fired {
            eprintln!(
                "a full refresh stopped at each of its {} storage calls",
                n - 1
            );
            break;
        }
    }
}
