//! Property tests of SCD type 2 (SPEC §2.4, §2.7): for random per-key
//! histories — upserts, deletes, equal-value repeats, untracked-only changes,
//! replayed duplicates — any split into updates and any order inside them give
//! the table of a naive reference fold (so, in particular, the table of one
//! update of all events), with and without TRACK HISTORY.

use std::collections::BTreeMap;

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
    seq: i32,
    delete: bool,
    name: i32,
    city: i32,
}

/// A visible version: (key, start) → (name, city, end).
type Table = BTreeMap<(i32, i32), (i32, i32, Option<i32>)>;

/// The SPEC §2.4 fold, written as plainly as possible.
fn reference(events: &[Event], track_city: bool) -> Table {
    let mut by_key: BTreeMap<i32, BTreeMap<i32, Event>> = BTreeMap::new();
    for e in events {
        by_key.entry(e.key).or_default().insert(e.seq, *e);
    }
    let mut out = Table::new();
    for (key, history) in by_key {
        // current version: (start, name, city)
        let mut cur: Option<(i32, i32, i32)> = None;
        for (seq, e) in history {
            if e.delete {
                if let Some((start, name, city)) = cur.take() {
                    out.insert((key, start), (name, city, Some(seq)));
                }
                continue;
            }
            cur = match cur {
                Some((start, name, city)) if name == e.name && (!track_city || city == e.city) => {
                    Some((start, e.name, e.city))
                }
                Some((start, name, city)) => {
                    out.insert((key, start), (name, city, Some(seq)));
                    Some((seq, e.name, e.city))
                }
                None => Some((seq, e.name, e.city)),
            };
        }
        if let Some((start, name, city)) = cur {
            out.insert((key, start), (name, city, None));
        }
    }
    out
}

fn values_sql(events: &[Event]) -> String {
    if events.is_empty() {
        return "SELECT CAST(NULL AS BIGINT) AS id, CAST(NULL AS BIGINT) AS name, CAST(NULL AS BIGINT) AS city, CAST(NULL AS TEXT) AS op, CAST(NULL AS BIGINT) AS seq WHERE false".into();
    }
    let rows: Vec<String> = events
        .iter()
        .map(|e| {
            format!(
                "({}, {}, {}, '{}', {})",
                e.key,
                e.name,
                e.city,
                if e.delete { "D" } else { "U" },
                e.seq
            )
        })
        .collect();
    format!(
        "SELECT CAST(column1 AS BIGINT) AS id, CAST(column2 AS BIGINT) AS name, CAST(column3 AS BIGINT) AS city, column4 AS op, CAST(column5 AS BIGINT) AS seq FROM (VALUES {})",
        rows.join(", ")
    )
}

fn read(batches: &[RecordBatch]) -> Table {
    let mut out = Table::new();
    for b in batches {
        let col = |i: usize| b.column(i).as_primitive::<Int32Type>().clone();
        let (id, name, city, start, end) = (col(0), col(1), col(2), col(3), col(4));
        for i in 0..b.num_rows() {
            out.insert(
                (id.value(i), start.value(i)),
                (
                    name.value(i),
                    city.value(i),
                    (!end.is_null(i)).then(|| end.value(i)),
                ),
            );
        }
    }
    out
}

async fn run(updates: &[Vec<Event>], track_city: bool, partitions: usize) -> Table {
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
    let track = if track_city {
        ""
    } else {
        " TRACK HISTORY ON * EXCEPT (city)"
    };
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
            format!("CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, name, city) STORED AS SCD TYPE 2{track}")
        } else {
            "REFRESH STREAMING TABLE t".to_string()
        };
        s.sql(&stmt)
            .await
            .unwrap_or_else(|e| panic!("{stmt}: {e}"))
            .collect()
            .await
            .unwrap();
    }
    let sql = "SELECT CAST(id AS INT), CAST(name AS INT), CAST(city AS INT), CAST(__start_at AS INT), CAST(__end_at AS INT) FROM t";
    read(&s.sql(sql).await.unwrap().collect().await.unwrap())
}

/// Up to 20 events over 3 keys, one per (key, sequence) — plus exact replays.
fn history() -> impl Strategy<Value = Vec<Event>> {
    let event = (
        0..3i32,
        0..30i32,
        prop::bool::weighted(0.25),
        0..2i32,
        0..2i32,
    )
        .prop_map(|(key, seq, delete, name, city)| Event {
            key,
            seq,
            delete,
            name,
            city,
        });
    prop::collection::vec((event, prop::bool::weighted(0.2)), 0..20).prop_map(|raw| {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (e, replay) in raw {
            if seen.insert((e.key, e.seq)) {
                out.push(e);
                if replay {
                    out.push(e);
                }
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    #[test]
    fn history_is_a_function_of_the_set_of_events(
        events in history(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        track_city in any::<bool>(),
        partitions in 1usize..4,
    ) {
        let updates = shuffle_and_split(&events, order, &cuts);
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let got = rt.block_on(run(&updates, track_city, partitions));
        prop_assert_eq!(&got, &reference(&events, track_city), "updates: {:?}", updates);
    }
}
