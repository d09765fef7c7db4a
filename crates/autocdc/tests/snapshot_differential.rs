//! Differential property test of AUTO CDC FROM SNAPSHOT: random
//! sequences of snapshots (random key subsets, values with NULLs, empty
//! snapshots) are applied to an SCD 1 target, which must equal the last
//! snapshot after every refresh, with a change feed that holds exactly the
//! difference of consecutive snapshots — whichever diff engine runs
//! (indexed, sorted, indexed falling back to sorting) and whether the update
//! rewrites buckets, uses deletion vectors (compacting a bucket once it
//! holds more than two files), or decides by the diff's size (a diff too
//! large for vectors is resumed by the rewrite, not run again).
//!
//! ```text
//! AUTOCDC_MODEL_CASES=2000 cargo test --release -p datafusion-autocdc --test snapshot_differential
//! ```

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int32Type;
use datafusion::prelude::SessionConfig;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("AUTOCDC_MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(24)
}

/// A snapshot: value (nullable) per key.
type Snapshot = BTreeMap<i32, Option<i32>>;

/// How the diff and the update run.
#[derive(Debug, Clone, Copy)]
enum Engine {
    Indexed,
    Sorted,
    IndexedOutOfMemory,
}

fn engine() -> impl Strategy<Value = Engine> {
    prop_oneof![
        Just(Engine::Indexed),
        Just(Engine::Sorted),
        Just(Engine::IndexedOutOfMemory)
    ]
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    let value = prop_oneof![1 => Just(None), 3 => (0..3i32).prop_map(Some)];
    prop::collection::btree_map(0..12i32, value, 0..10)
}

fn source_sql(snapshot: &Snapshot) -> String {
    if snapshot.is_empty() {
        return "SELECT CAST(NULL AS INT) AS id, CAST(NULL AS INT) AS v WHERE false".into();
    }
    let rows: Vec<String> = snapshot
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("({k}, {v})"),
            None => format!("({k}, NULL)"),
        })
        .collect();
    format!(
        "SELECT CAST(column1 AS INT) AS id, CAST(column2 AS INT) AS v FROM (VALUES {})",
        rows.join(", ")
    )
}

fn pairs(batches: &[RecordBatch]) -> Vec<(i32, Option<i32>)> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_primitive::<Int32Type>();
        let vs = b.column(1).as_primitive::<Int32Type>();
        for i in 0..b.num_rows() {
            out.push((ids.value(i), (!vs.is_null(i)).then(|| vs.value(i))));
        }
    }
    out.sort();
    out
}

/// The change feed of one refresh that turns `old` into `new` (SCD 1):
/// (key, value, change type), sorted.
fn expected_changes(old: &Snapshot, new: &Snapshot) -> Vec<(i32, Option<i32>, String)> {
    let mut out = Vec::new();
    for (k, v) in old {
        match new.get(k) {
            None => out.push((*k, *v, "delete".to_string())),
            Some(n) if n != v => {
                out.push((*k, *v, "update_preimage".to_string()));
                out.push((*k, *n, "update_postimage".to_string()));
            }
            _ => {}
        }
    }
    for (k, v) in new {
        if !old.contains_key(k) {
            out.push((*k, *v, "insert".to_string()));
        }
    }
    out.sort();
    out
}

/// How updates retire stored rows.
#[derive(Debug, Clone, Copy)]
enum Vectors {
    /// Always rewrite the touched buckets.
    Never,
    /// Deletion vectors whenever the table takes them (compacting past 2
    /// files a bucket).
    Always,
    /// By the diff's size: vectors for at most a fifth of the live rows,
    /// else a rewrite that reads the diff already run.
    BySize,
}

fn vectors() -> impl Strategy<Value = Vectors> {
    prop_oneof![
        Just(Vectors::Never),
        Just(Vectors::Always),
        Just(Vectors::BySize)
    ]
}

async fn run(snapshots: &[Snapshot], engine: Engine, vectors: Vectors, partitions: usize) {
    let config = SessionConfig::new()
        .with_batch_size(2)
        .with_target_partitions(partitions);
    let s = CdcSession::open(AutoCdcConfig::in_memory().with_session_config(config))
        .await
        .unwrap();
    let exec = |sql: String| {
        let s = &s;
        async move {
            s.sql(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .collect()
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        }
    };
    match engine {
        Engine::Indexed => {}
        Engine::Sorted => {
            exec("SET autocdc.indexed_fold = false".into()).await;
        }
        Engine::IndexedOutOfMemory => {
            exec("SET autocdc.indexed_fold_max_bytes = 1".into()).await;
        }
    }
    match vectors {
        Vectors::Always => {
            exec("SET autocdc.deletion_vector_max_fraction = 1000".into()).await;
            // past 2 files in a bucket, an update compacts the buckets it touches
            exec("SET autocdc.deletion_vector_max_files_per_bucket = 2".into()).await;
        }
        Vectors::BySize => {
            exec("SET autocdc.deletion_vector_max_fraction = 0.2".into()).await;
        }
        Vectors::Never => {
            exec("SET autocdc.deletion_vectors = false".into()).await;
        }
    }
    // half the cases plan as for a cluster: stored rows read as plain
    // Parquet scans, one manifest per fold partition
    if snapshots.len().is_multiple_of(2) {
        exec("SET autocdc.plain_parquet_reads = true".into()).await;
    }
    exec("CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '3')".into()).await;
    let mut previous = Snapshot::new();
    let mut feed_rows = 0;
    for (i, snapshot) in snapshots.iter().enumerate() {
        exec(format!(
            "CREATE OR REPLACE TABLE snap AS {}",
            source_sql(snapshot)
        ))
        .await;
        exec(if i == 0 {
            "CREATE FLOW f AS AUTO CDC INTO t FROM SNAPSHOT (SELECT * FROM snap) KEYS (id) STORED AS SCD TYPE 1".into()
        } else {
            "REFRESH STREAMING TABLE t".into()
        })
        .await;
        let target = pairs(&exec("SELECT CAST(id AS INT), CAST(v AS INT) FROM t".into()).await);
        let expected: Vec<(i32, Option<i32>)> = snapshot.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(target, expected, "after snapshot {i}");

        let feed =
            exec("SELECT CAST(id AS INT), CAST(v AS INT), arrow_cast(_change_type, 'Utf8'), CAST(_commit_version AS BIGINT) FROM table_changes('t', 0)".into())
                .await;
        let last_version = feed
            .iter()
            .flat_map(|b| {
                b.column(3)
                    .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                    .values()
                    .to_vec()
            })
            .max();
        let mut changes: Vec<(i32, Option<i32>, String)> = Vec::new();
        for b in &feed {
            let ids = b.column(0).as_primitive::<Int32Type>();
            let vs = b.column(1).as_primitive::<Int32Type>();
            let types = b.column(2).as_string::<i32>();
            let versions = b
                .column(3)
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
            for r in 0..b.num_rows() {
                if Some(versions.value(r)) == last_version {
                    changes.push((
                        ids.value(r),
                        (!vs.is_null(r)).then(|| vs.value(r)),
                        types.value(r).to_string(),
                    ));
                }
            }
        }
        changes.sort();
        let expected = expected_changes(&previous, snapshot);
        let total: usize = feed.iter().map(RecordBatch::num_rows).sum();
        if expected.is_empty() {
            // a refresh that changes nothing adds no change rows
            assert_eq!(total, feed_rows, "change feed of snapshot {i}");
        } else {
            assert_eq!(changes, expected, "change feed of snapshot {i}");
        }
        feed_rows = total;
        previous = snapshot.clone();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), .. ProptestConfig::default() })]

    #[test]
    fn snapshots_equal_the_model(
        snapshots in prop::collection::vec(snapshot(), 1..5),
        engine in engine(),
        vectors in vectors(),
        partitions in 1usize..3,
    ) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(run(&snapshots, engine, vectors, partitions));
    }
}
