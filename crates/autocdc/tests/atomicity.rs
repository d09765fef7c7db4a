//! Atomicity (SPEC §2.7): an update that fails at any write to storage leaves
//! the target as it was; running it again — in a new session on the same
//! warehouse — gives the table and change feed of a fault-free run.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// An object store whose `n`-th write (put, multipart put, copy) fails.
#[derive(Debug)]
struct FaultyStore {
    inner: InMemory,
    writes: AtomicUsize,
    fail_at: AtomicUsize,
}

impl FaultyStore {
    fn new() -> Self {
        Self {
            inner: InMemory::new(),
            writes: AtomicUsize::new(0),
            fail_at: AtomicUsize::new(0),
        }
    }
    /// Fail the `n`-th write from now (0: never).
    fn arm(&self, n: usize) {
        self.writes.store(0, Ordering::SeqCst);
        self.fail_at.store(n, Ordering::SeqCst);
    }
    fn fired(&self) -> bool {
        let at = self.fail_at.load(Ordering::SeqCst);
        at > 0 && self.writes.load(Ordering::SeqCst) >= at
    }
    fn write(&self) -> object_store::Result<()> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.fail_at.load(Ordering::SeqCst) {
            return Err(object_store::Error::Generic {
                store: "faulty",
                source: format!("injected fault at write {n}").into(),
            });
        }
        Ok(())
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore")
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.write()?;
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.write()?;
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.write()?;
        self.inner.copy_opts(from, to, options).await
    }
}

async fn run(s: &CdcSession, sql: &str) -> datafusion::error::Result<String> {
    let batches = s.sql(sql).await?.collect().await?;
    Ok(pretty_format_batches(&batches)?.to_string())
}

const FIRST: &str = "(1, 'a', 'U', 1), (2, 'b', 'U', 1), (3, 'c', 'U', 1)";
const SECOND: &str = "(1, 'a2', 'U', 2), (2, NULL, 'D', 2), (4, 'd', 'U', 2), (3, 'c0', 'U', 0)";

async fn setup(s: &CdcSession, stored_as: &str) {
    run(
        s,
        &format!("CREATE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES {FIRST}"),
    )
    .await
    .unwrap();
    run(s, "CREATE STREAMING TABLE t").await.unwrap();
    let flow = if stored_as == "SNAPSHOT" {
        // periodic snapshots of the rows that are not deleted
        "CREATE FLOW f AS AUTO CDC INTO t FROM SNAPSHOT (SELECT id, v FROM src WHERE op <> 'D' AND seq > 0) KEYS (id)".to_string()
    } else {
        format!("CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, v) STORED AS {stored_as}")
    };
    run(s, &flow).await.unwrap();
}

async fn second_update(s: &CdcSession) -> datafusion::error::Result<String> {
    run(
        s,
        &format!(
            "CREATE OR REPLACE TABLE src (id INT, v TEXT, op TEXT, seq INT) AS VALUES {SECOND}"
        ),
    )
    .await?;
    run(s, "REFRESH STREAMING TABLE t").await
}

/// Visible rows and the change feed (without commit versions, which a
/// retried update may shift).
async fn observe(s: &CdcSession) -> (String, String) {
    let sorted = |table: String| {
        let mut lines: Vec<&str> = table.lines().collect();
        lines.sort_unstable();
        lines.join("\n")
    };
    let rows = run(s, "SELECT * FROM t").await.unwrap();
    let feed = run(
        s,
        "SELECT * EXCEPT (_commit_version, _commit_timestamp) FROM table_changes('t', 0)",
    )
    .await
    .unwrap();
    (sorted(rows), sorted(feed))
}

async fn check(stored_as: &str) {
    // the fault-free result
    let clean = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    setup(&clean, stored_as).await;
    let before = observe(&clean).await;
    second_update(&clean).await.unwrap();
    let expected = observe(&clean).await;

    for n in 1.. {
        let store = Arc::new(FaultyStore::new());
        let s = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone()))
            .await
            .unwrap();
        setup(&s, stored_as).await;
        store.arm(n);
        let failed = second_update(&s).await.is_err();
        let fired = store.fired();
        store.arm(0);
        if failed {
            // nothing visible changed ... unless the failing write came after the commit
            let now = observe(&s).await;
            assert!(
                now == before || now == expected,
                "{stored_as}, fault at write {n}: partial state\n{}\n{}",
                now.0,
                now.1
            );
        }
        // a new process on the same warehouse runs the update again
        let again = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone()))
            .await
            .unwrap();
        second_update(&again)
            .await
            .unwrap_or_else(|e| panic!("{stored_as}, retry after fault at write {n}: {e}"));
        assert_eq!(
            observe(&again).await,
            expected,
            "{stored_as}, fault at write {n}"
        );
        if !fired {
            assert!(n > 1, "the update wrote nothing");
            eprintln!(
                "{stored_as}: a fault at each of the update's {} writes checked",
                n - 1
            );
            break;
        }
    }
}

#[tokio::test]
async fn scd1_update_is_atomic_at_every_write() {
    check("SCD TYPE 1").await;
}

#[tokio::test]
async fn scd2_update_is_atomic_at_every_write() {
    check("SCD TYPE 2").await;
}

#[tokio::test]
async fn snapshot_update_is_atomic_at_every_write() {
    check("SNAPSHOT").await;
}
