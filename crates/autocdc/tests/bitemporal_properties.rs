//! Property test of BITEMPORAL targets (SPEC §2.5, §2.7): for random histories
//! (upserts, deletes, corrections at an equal business sequence, replayed
//! duplicates), any arrival order and any split into updates give the table of
//! a naive reference that recomputes the belief at every system time from
//! scratch.

use std::collections::{BTreeMap, BTreeSet};

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int32Type;
use datafusion::prelude::SessionConfig;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use proptest::prelude::*;

mod common;
use common::shuffle_and_split;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Event {
    key: i32,
    /// Business sequence.
    bt: i32,
    /// System sequence.
    st: i32,
    delete: bool,
    v: i32,
}

/// (key, v, start, end, system start, system end).
type Row = (i32, i32, i32, Option<i32>, i32, Option<i32>);

/// The SCD 2 history of one key's belief: (v, start, end).
fn history(events: &BTreeMap<i32, Event>) -> BTreeSet<(i32, i32, Option<i32>)> {
    let mut out = BTreeSet::new();
    let mut cur: Option<(i32, i32)> = None; // (start, v)
    for (&bt, e) in events {
        if e.delete {
            if let Some((start, v)) = cur.take() {
                out.insert((v, start, Some(bt)));
            }
            continue;
        }
        cur = match cur {
            Some((start, v)) if v == e.v => Some((start, v)),
            Some((start, v)) => {
                out.insert((v, start, Some(bt)));
                Some((bt, e.v))
            }
            None => Some((bt, e.v)),
        };
    }
    if let Some((start, v)) = cur {
        out.insert((v, start, None));
    }
    out
}

/// SPEC §2.5 by definition: the belief at every system time, from scratch.
fn reference(events: &[Event]) -> BTreeSet<Row> {
    let keys: BTreeSet<i32> = events.iter().map(|e| e.key).collect();
    let mut out = BTreeSet::new();
    for key in keys {
        let mine: Vec<&Event> = events.iter().filter(|e| e.key == key).collect();
        let times: BTreeSet<i32> = mine.iter().map(|e| e.st).collect();
        // row → system time it entered the belief
        let mut open: BTreeMap<(i32, i32, Option<i32>), i32> = BTreeMap::new();
        for &t in &times {
            let mut belief: BTreeMap<i32, Event> = BTreeMap::new();
            for e in mine.iter().filter(|e| e.st <= t) {
                match belief.get(&e.bt) {
                    Some(known) if known.st > e.st => {}
                    _ => {
                        belief.insert(e.bt, **e);
                    }
                }
            }
            let rows = history(&belief);
            let closed: Vec<_> = open.keys().filter(|r| !rows.contains(r)).copied().collect();
            for r in closed {
                let from = open.remove(&r).unwrap();
                out.insert((key, r.0, r.1, r.2, from, Some(t)));
            }
            for r in rows {
                open.entry(r).or_insert(t);
            }
        }
        for (r, from) in open {
            out.insert((key, r.0, r.1, r.2, from, None));
        }
    }
    out
}

fn values_sql(events: &[Event]) -> String {
    if events.is_empty() {
        return "SELECT CAST(NULL AS INT) AS id, CAST(NULL AS INT) AS v, CAST(NULL AS TEXT) AS op, CAST(NULL AS INT) AS bt, CAST(NULL AS INT) AS st WHERE false".into();
    }
    let rows: Vec<String> = events
        .iter()
        .map(|e| {
            format!(
                "({}, {}, '{}', {}, {})",
                e.key,
                e.v,
                if e.delete { "D" } else { "U" },
                e.bt,
                e.st
            )
        })
        .collect();
    format!(
        "SELECT CAST(column1 AS INT) AS id, CAST(column2 AS INT) AS v, column3 AS op, CAST(column4 AS INT) AS bt, CAST(column5 AS INT) AS st FROM (VALUES {})",
        rows.join(", ")
    )
}

fn read(batches: &[RecordBatch]) -> BTreeSet<Row> {
    let mut out = BTreeSet::new();
    for b in batches {
        let col = |i: usize| b.column(i).as_primitive::<Int32Type>().clone();
        let (id, v, start, end, from, to) = (col(0), col(1), col(2), col(3), col(4), col(5));
        for i in 0..b.num_rows() {
            let inserted = out.insert((
                id.value(i),
                v.value(i),
                start.value(i),
                (!end.is_null(i)).then(|| end.value(i)),
                from.value(i),
                (!to.is_null(i)).then(|| to.value(i)),
            ));
            assert!(inserted, "duplicate row in the target");
        }
    }
    out
}

async fn run(updates: &[Vec<Event>], partitions: usize) -> BTreeSet<Row> {
    let config = SessionConfig::new()
        .with_batch_size(3)
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
            "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' \
             SEQUENCE BY bt SYSTEM SEQUENCE BY st COLUMNS (id, v) STORED AS BITEMPORAL"
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
    let sql = "SELECT id, v, __start_at, __end_at, __system_start_at, __system_end_at FROM t";
    read(&s.sql(sql).await.unwrap().collect().await.unwrap())
}

/// Up to 16 events over 2 keys, one per (key, bt, st) — plus exact replays;
/// few business sequences, so corrections are frequent.
fn events() -> impl Strategy<Value = Vec<Event>> {
    let event = (
        0..2i32,
        0..6i32,
        0..8i32,
        prop::bool::weighted(0.25),
        0..3i32,
    )
        .prop_map(|(key, bt, st, delete, v)| Event {
            key,
            bt,
            st,
            delete,
            v,
        });
    prop::collection::vec((event, prop::bool::weighted(0.2)), 0..16).prop_map(|raw| {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (e, replay) in raw {
            if seen.insert((e.key, e.bt, e.st)) {
                out.push(e);
                if replay {
                    out.push(e);
                }
            }
        }
        out
    })
}

fn cases() -> u32 {
    std::env::var("AUTOCDC_PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(40)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), .. ProptestConfig::default() })]

    #[test]
    fn bitemporal_table_is_the_beliefs_at_every_system_time(
        events in events(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partitions in 1usize..4,
    ) {
        let updates = shuffle_and_split(&events, order, &cuts);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let got = rt.block_on(run(&updates, partitions));
        prop_assert_eq!(&got, &reference(&events), "updates: {:?}", updates);
    }
}
