//! Property tests of SCD type 1 (SPEC §2.3, §2.7) against a naive reference:
//! any split of the events into updates, any order inside them, tiny batches
//! and several partitions give the same target as the reference fold, and a
//! replay changes nothing.

use std::collections::BTreeMap;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int32Type;
use datafusion::prelude::SessionConfig;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use proptest::prelude::*;

mod common;
use common::shuffle_and_split;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Upsert,
    Delete,
    Truncate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Event {
    key: i32,
    seq: i32,
    op: Op,
    value: i32,
}

/// The obviously-correct model: with `T` the greatest TRUNCATE sequence, a
/// key's row is its greatest-sequence event above `T`, if that is an upsert.
fn reference(events: &[Event]) -> BTreeMap<i32, (i32, i32)> {
    let t = events
        .iter()
        .filter(|e| e.op == Op::Truncate)
        .map(|e| e.seq)
        .max();
    let mut last: BTreeMap<i32, Event> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.op != Op::Truncate && t.is_none_or(|t| e.seq > t))
    {
        match last.get(&e.key) {
            Some(prev) if prev.seq >= e.seq => {}
            _ => {
                last.insert(e.key, *e);
            }
        }
    }
    last.into_iter()
        .filter(|(_, e)| e.op == Op::Upsert)
        .map(|(k, e)| (k, (e.value, e.seq)))
        .collect()
}

fn values_sql(events: &[Event]) -> String {
    if events.is_empty() {
        return "SELECT CAST(NULL AS BIGINT) AS id, CAST(NULL AS BIGINT) AS v, CAST(NULL AS TEXT) AS op, CAST(NULL AS BIGINT) AS seq WHERE false".into();
    }
    let rows: Vec<String> = events
        .iter()
        .map(|e| {
            let op = match e.op {
                Op::Upsert => "U",
                Op::Delete => "D",
                Op::Truncate => "T",
            };
            let key = if e.op == Op::Truncate {
                "NULL".to_string()
            } else {
                e.key.to_string()
            };
            format!("({key}, {}, '{op}', {})", e.value, e.seq)
        })
        .collect();
    format!(
        "SELECT CAST(column1 AS BIGINT) AS id, CAST(column2 AS BIGINT) AS v, column3 AS op, CAST(column4 AS BIGINT) AS seq FROM (VALUES {})",
        rows.join(", ")
    )
}

fn table(batches: &[RecordBatch]) -> BTreeMap<i32, (i32, i32)> {
    let mut out = BTreeMap::new();
    for b in batches {
        let (id, v, seq) = (
            b.column(0).as_primitive::<Int32Type>(),
            b.column(1).as_primitive::<Int32Type>(),
            b.column(2).as_primitive::<Int32Type>(),
        );
        for i in 0..b.num_rows() {
            out.insert(id.value(i), (v.value(i), seq.value(i)));
        }
    }
    out
}

async fn run(
    updates: &[Vec<Event>],
    partitions: usize,
) -> (BTreeMap<i32, (i32, i32)>, BTreeMap<i32, (i32, i32)>) {
    let config = SessionConfig::new()
        .with_batch_size(2)
        .with_target_partitions(partitions);
    let s = CdcSession::open(AutoCdcConfig::in_memory().with_session_config(config))
        .await
        .unwrap();
    s.sql(&format!(
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '{}')",
        partitions * 2 - 1
    ))
    .await
    .unwrap();
    for (i, chunk) in updates.iter().enumerate() {
        s.sql(&format!(
            "CREATE OR REPLACE TABLE src AS {}",
            values_sql(chunk)
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
        let stmt = if i == 0 {
            "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' SEQUENCE BY seq COLUMNS (id, v, seq)"
        } else {
            "REFRESH STREAMING TABLE t"
        };
        s.sql(stmt)
            .await
            .unwrap_or_else(|e| panic!("{stmt}: {e}"))
            .collect()
            .await
            .unwrap();
    }
    let read = "SELECT CAST(id AS INT), CAST(v AS INT), CAST(seq AS INT) FROM t";
    let before = table(&s.sql(read).await.unwrap().collect().await.unwrap());
    // replay the last update
    s.sql("REFRESH STREAMING TABLE t")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let after = table(&s.sql(read).await.unwrap().collect().await.unwrap());
    (before, after)
}

fn event() -> impl Strategy<Value = Event> {
    (
        0..6i32,
        0..16i32,
        prop_oneof![6 => Just(Op::Upsert), 3 => Just(Op::Delete), 1 => Just(Op::Truncate)],
        0..3i32,
    )
        .prop_map(|(key, seq, op, value)| Event {
            key,
            seq,
            op,
            value,
        })
}

/// Events without conflicts: one event per (key, sequence), repeated exactly
/// at random to exercise same-event deduplication; truncates keyless.
fn history() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec((event(), any::<bool>()), 0..24).prop_map(|raw| {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (e, dup) in raw {
            let id = if e.op == Op::Truncate {
                (-1, e.seq)
            } else {
                (e.key, e.seq)
            };
            if e.op != Op::Truncate && !seen.insert(id) {
                continue;
            }
            out.push(e);
            if dup {
                out.push(e);
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    #[test]
    fn any_split_and_order_equals_the_reference(
        events in history(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partitions in 1usize..4,
    ) {
        let updates = shuffle_and_split(&events, order, &cuts);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (got, replayed) = rt.block_on(run(&updates, partitions));
        let expected = reference(&events);
        prop_assert_eq!(&got, &expected, "updates: {:?}", updates);
        prop_assert_eq!(&replayed, &expected);
    }
}
