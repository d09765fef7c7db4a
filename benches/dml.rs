//! DML benchmark: what a statement that changes few rows of a large SCD 1
//! target costs, beside a flow update of as many keys.
//!
//! ```text
//! cargo bench -p datafusion-autocdc --bench dml [-- KEYS]
//! ```
//! Loads KEYS keys (2,000,000 by default) into an SCD 1 target on an
//! in-memory warehouse, then times, three times each (new keys every
//! time): a `REFRESH` of 100 changed keys, an `UPDATE` of 100 rows, a
//! `DELETE` of 100 rows, a `MERGE` updating 100 rows, an `UPDATE` of one
//! row, and the 100-row `UPDATE` again with
//! `autocdc.deletion_vector_max_fraction = 0` (a rewrite of the table).
//! Prints each median, its ratio to the refresh, and the object-store
//! requests of the statement's last round (gets — one per range read —,
//! lists, puts, others: copies, renames, deletes).
//!
//! ```text
//! cargo bench -p datafusion-autocdc --bench dml -- KEYS --latency-ms 20
//! ```
//! puts the warehouse behind `object_store`'s `ThrottledStore`: every get,
//! list and put waits that long first, as on a remote object store, so the
//! medians show what the requests cost there. With `DML_TRACE=1` every
//! request is printed (to stderr) after the statement that makes it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::error::Result;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use object_store::memory::InMemory;
use object_store::throttle::{ThrottleConfig, ThrottledStore};

// (what the tests use; the trace prints its requests' fields)
#[allow(dead_code)]
#[path = "../crates/autocdc/tests/common/observed_store.rs"]
mod observed_store;
use observed_store::{ObservedStore, Observer, Request};

/// Counts the requests of each kind (and prints them with `DML_TRACE=1`).
#[derive(Debug, Default)]
struct Requests {
    gets: AtomicUsize,
    lists: AtomicUsize,
    puts: AtomicUsize,
    others: AtomicUsize,
}

impl Requests {
    /// The counts so far, then zero.
    fn take(&self) -> [usize; 4] {
        [&self.gets, &self.lists, &self.puts, &self.others].map(|c| c.swap(0, Ordering::SeqCst))
    }
}

impl Observer for Requests {
    fn request(&self, request: Request<'_>) -> object_store::Result<()> {
        if tracing() {
            eprintln!("{request:?}");
        }
        let counter = match request {
            Request::Get { .. } => &self.gets,
            Request::List { .. } => &self.lists,
            Request::Put { .. } => &self.puts,
            Request::Other => &self.others,
        };
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Whether to print every request (`DML_TRACE=1`), each statement first.
fn tracing() -> bool {
    std::env::var_os("DML_TRACE").is_some()
}

/// Events for the keys `ids`, values tagged `tag`, at sequence `seq`.
fn events(ids: impl Iterator<Item = i64>, tag: &str, seq: i64) -> Result<RecordBatch> {
    let ids: Int64Array = ids.collect();
    let vs: StringArray = (0..ids.len()).map(|i| Some(format!("{tag}{i}"))).collect();
    let seqs = Int64Array::from(vec![seq; ids.len()]);
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, false),
            Field::new("seq", DataType::Int64, false),
        ])),
        vec![Arc::new(ids), Arc::new(vs), Arc::new(seqs)],
    )?)
}

/// One run of a statement: its time and its requests.
type Run = (f64, [usize; 4]);

async fn run(session: &CdcSession, requests: &Requests, sql: &str) -> Result<Run> {
    requests.take();
    if tracing() {
        eprintln!("=== {}", &sql[..sql.len().min(60)]);
    }
    let start = Instant::now();
    session.sql(sql).await?.collect().await?;
    Ok((start.elapsed().as_secs_f64(), requests.take()))
}

/// The median time of `runs` and the requests of the last.
fn median(runs: Vec<Run>) -> Run {
    let requests = runs.last().map_or([0; 4], |r| r.1);
    let mut times: Vec<f64> = runs.iter().map(|r| r.0).collect();
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], requests)
}

/// `KEYS` (the first number among the arguments) and `--latency-ms N`.
fn arguments() -> (i64, u64) {
    let args: Vec<String> = std::env::args().collect();
    let latency = args
        .iter()
        .position(|a| a == "--latency-ms")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(0);
    let keys = args
        .iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || args[i - 1] != "--latency-ms")
        .find_map(|(_, a)| a.parse().ok())
        .unwrap_or(2_000_000);
    (keys, latency)
}

#[tokio::main]
async fn main() -> Result<()> {
    let (keys, latency_ms) = arguments();
    let wait = Duration::from_millis(latency_ms);
    let throttled = ThrottledStore::new(
        InMemory::new(),
        ThrottleConfig {
            wait_get_per_call: wait,
            wait_list_per_call: wait,
            wait_list_with_delimiter_per_call: wait,
            wait_put_per_call: wait,
            wait_delete_per_call: wait,
            ..ThrottleConfig::default()
        },
    );
    let store = Arc::new(ObservedStore::new(Arc::new(throttled), Requests::default()));
    let session = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone())).await?;
    let requests = store.observer();
    let ctx = session.context();
    ctx.register_batch("feed", events(0..keys, "v", 1)?)?;
    session.sql("CREATE STREAMING TABLE t").await?;
    let (load, _) = run(
        &session,
        requests,
        "CREATE FLOW f AS AUTO CDC INTO t FROM feed KEYS (id) SEQUENCE BY seq",
    )
    .await?;
    println!("{:<40} {keys:>10} keys {load:>8.3} s", "load");

    // 100 keys at a time, spread over the table, new ones each round
    let hundred = |round: i64, part: i64| {
        (0..100).map(move |i| (i * 7919 + round * 100 + part * 1000) % keys)
    };
    let (mut refreshes, mut updates, mut deletes, mut rewrites) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut merges, mut one_row) = (Vec::new(), Vec::new());
    for round in 0..3 {
        ctx.deregister_table("feed")?;
        ctx.register_batch("feed", events(hundred(round, 0), "r", 2 + round)?)?;
        refreshes.push(run(&session, requests, "REFRESH STREAMING TABLE t").await?);
        let list = |part| {
            hundred(round, part)
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        updates.push(
            run(
                &session,
                requests,
                &format!("UPDATE t SET v = 'u' WHERE id IN ({})", list(1)),
            )
            .await?,
        );
        deletes.push(
            run(
                &session,
                requests,
                &format!("DELETE FROM t WHERE id IN ({})", list(2)),
            )
            .await?,
        );
        ctx.deregister_table("changes")?;
        ctx.register_batch("changes", events(hundred(round, 4), "m", 0)?)?;
        merges.push(
            run(
                &session,
                requests,
                "MERGE INTO t USING changes c ON t.id = c.id \
                 WHEN MATCHED THEN UPDATE SET v = c.v",
            )
            .await?,
        );
        let key = (round * 104_729 + 5) % keys;
        one_row.push(
            run(
                &session,
                requests,
                &format!("UPDATE t SET v = 'o' WHERE id = {key}"),
            )
            .await?,
        );
        // the same statement rewriting the table (what it did before
        // deletion vectors)
        run(
            &session,
            requests,
            "SET autocdc.deletion_vector_max_fraction = 0",
        )
        .await?;
        let sql = format!("UPDATE t SET v = 'w' WHERE id IN ({})", list(3));
        rewrites.push(run(&session, requests, &sql).await?);
        run(
            &session,
            requests,
            "SET autocdc.deletion_vector_max_fraction = 0.1",
        )
        .await?;
    }
    let (refresh, refresh_requests) = median(refreshes);
    for (label, time) in [
        ("REFRESH of 100 changed keys", (refresh, refresh_requests)),
        ("UPDATE of 100 rows", median(updates)),
        ("DELETE of 100 rows", median(deletes)),
        ("MERGE of 100 rows", median(merges)),
        ("UPDATE of one row", median(one_row)),
        ("UPDATE of 100 rows, rewriting the table", median(rewrites)),
    ] {
        let (time, [gets, lists, puts, others]) = time;
        println!(
            "{label:<40} {keys:>10} keys {time:>8.3} s {:>6.2}x the refresh \
             requests: {gets:>4} get {lists:>3} list {puts:>3} put {others:>3} other",
            time / refresh
        );
    }
    Ok(())
}
