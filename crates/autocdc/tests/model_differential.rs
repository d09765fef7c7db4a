//! Differential property tests: random histories — keys, upserts,
//! deletes, truncates, NULLs in value columns, equal-value repeats, late
//! events, replays, partial-update options — are split at random into
//! updates, shuffled, run through the engine on tiny batches and several
//! partitions, and the target read back with SQL must equal the naive model
//! of `model/` (which shares no code with the engine). The same histories
//! folded at once by AUTO CDC in a query (`df.auto_cdc`) must equal the
//! model of one update.
//!
//! CI runs a few dozen cases per storage type; a long run:
//!
//! ```text
//! AUTOCDC_MODEL_CASES=35000 cargo test --release -p datafusion-autocdc --test model_differential
//! ```

use std::collections::HashSet;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int32Type;
use datafusion::prelude::SessionConfig;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use proptest::prelude::*;

mod common;
mod model;

use common::shuffle_and_split;
use model::{bitemporal, scd1, scd2, Event, Kind, Merge, Partial};

fn cases() -> u32 {
    std::env::var("AUTOCDC_MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(24)
}

/// Rows of the first `n` (nullable INT) columns of a query result.
fn read(batches: &[RecordBatch], n: usize) -> Vec<Vec<Option<i32>>> {
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            out.push(
                (0..n)
                    .map(|c| {
                        let col = b.column(c).as_primitive::<Int32Type>();
                        (!col.is_null(i)).then(|| col.value(i))
                    })
                    .collect(),
            );
        }
    }
    out.sort();
    out
}

/// Run `updates` through the engine (the first creates the flow `clauses`,
/// the others refresh) and read `select` back.
async fn engine(
    updates: &[Vec<Event>],
    clauses: &str,
    select: &str,
    width: usize,
    partitions: usize,
) -> Vec<Vec<Option<i32>>> {
    engine_with(
        updates,
        &[],
        &[],
        clauses,
        select,
        width,
        partitions,
        Fold::Indexed,
        "",
    )
    .await
}

/// How SCD 1 updates are folded (SCD 2 and BITEMPORAL always sort).
#[derive(Debug, Clone, Copy)]
enum Fold {
    /// The default: a sorted index of the events (`IndexedScd1Fold`).
    Indexed,
    /// `SET autocdc.indexed_fold = false`: DataFusion sorts the events.
    Sorted,
    /// The indexed fold out of memory after its first batch: it falls back
    /// to sorting, with what it already retained.
    IndexedOutOfMemory,
}

fn fold_choice() -> impl Strategy<Value = Fold> {
    prop_oneof![
        Just(Fold::Indexed),
        Just(Fold::Sorted),
        Just(Fold::IndexedOutOfMemory)
    ]
}

/// The source columns of one update (schema evolution): `b` may be
/// missing, `a` may come as BIGINT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    b: bool,
    wide_a: bool,
}

impl Shape {
    const FULL: Shape = Shape {
        b: true,
        wide_a: false,
    };

    /// `events` as this shape's source query.
    fn source_sql(self, events: &[Event]) -> String {
        let a = if self.wide_a {
            "CAST(a AS BIGINT) AS a"
        } else {
            "a"
        };
        let b = if self.b { ", b" } else { "" };
        format!(
            "SELECT id, {a}{b}, op, seq, st, cols FROM ({})",
            model::source_sql(events)
        )
    }

    /// What the model sees of `events` under this shape: no `b`, NULL.
    fn apply(self, events: &[Event]) -> Vec<Event> {
        events
            .iter()
            .map(|e| {
                let mut e = *e;
                if !self.b {
                    e.values[1] = None;
                }
                e
            })
            .collect()
    }
}

/// An in-memory session on tiny batches and `partitions` partitions.
async fn session(partitions: usize) -> CdcSession {
    let config = SessionConfig::new()
        .with_batch_size(2)
        .with_target_partitions(partitions);
    CdcSession::open(AutoCdcConfig::in_memory().with_session_config(config))
        .await
        .unwrap()
}

/// Run `stmt` to its end; a failure fails the test, naming it.
async fn run(s: &CdcSession, stmt: &str) -> Vec<RecordBatch> {
    s.sql(stmt)
        .await
        .unwrap_or_else(|e| panic!("{stmt}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{stmt}: {e}"))
}

/// Update `i` of the target `t`: the table `src` becomes `source`, then the
/// flow `f` with `clauses` is created (the first update) or `t` refreshed.
async fn update(s: &CdcSession, i: usize, source: &str, clauses: &str) {
    run(s, &format!("CREATE OR REPLACE TABLE src AS {source}")).await;
    let stmt = if i == 0 {
        format!("CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) {clauses}")
    } else {
        "REFRESH STREAMING TABLE t".to_string()
    };
    run(s, &stmt).await;
}

/// Run the updates; after update `i`, the statements `between[i]` (DML).
/// Update `i` reads its source in `shapes[i]` (all columns without one).
#[allow(clippy::too_many_arguments)]
async fn engine_with(
    updates: &[Vec<Event>],
    between: &[Vec<String>],
    shapes: &[Shape],
    clauses: &str,
    select: &str,
    width: usize,
    partitions: usize,
    fold: Fold,
    properties: &str,
) -> Vec<Vec<Option<i32>>> {
    let s = session(partitions).await;
    let setting = match fold {
        Fold::Indexed => None,
        Fold::Sorted => Some("SET autocdc.indexed_fold = false"),
        Fold::IndexedOutOfMemory => Some("SET autocdc.indexed_fold_max_bytes = 1"),
    };
    // half the cases (by the parity of their event count) retire stored
    // rows with deletion vectors on every update that can, compacting the
    // fullest touched buckets once they hold more than half of 1 to 3
    // files; the other half rewrite the touched buckets
    let events: usize = updates.iter().map(Vec::len).sum();
    let rewrite = if events.is_multiple_of(2) {
        vec![
            "SET autocdc.deletion_vector_max_fraction = 1000".to_string(),
            format!(
                "SET autocdc.deletion_vector_max_files_per_bucket = {}",
                1 + events % 3
            ),
        ]
    } else {
        vec!["SET autocdc.deletion_vectors = false".to_string()]
    };
    // and half of each half plans as for a cluster: stored rows read as
    // plain Parquet scans (deletion vectors applied by position), one
    // manifest per fold partition
    let plain = (events % 4 >= 2).then(|| "SET autocdc.plain_parquet_reads = true".to_string());
    for setting in setting
        .map(str::to_string)
        .into_iter()
        .chain(rewrite)
        .chain(plain)
    {
        s.sql(&setting).await.unwrap().collect().await.unwrap();
    }
    s.sql(&format!(
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '{}'{properties})",
        partitions * 2 - 1
    ))
    .await
    .unwrap();
    for (i, events) in updates.iter().enumerate() {
        let shape = shapes.get(i).copied().unwrap_or(Shape::FULL);
        update(&s, i, &shape.source_sql(events), clauses).await;
        for dml in between.get(i).into_iter().flatten() {
            run(&s, dml).await;
        }
    }
    read(
        &s.sql(select).await.unwrap().collect().await.unwrap(),
        width,
    )
}

/// AUTO CDC in a query over all `events` at once (`df.auto_cdc`, no
/// storage), read back with `select` from the view `t`.
async fn relation(
    events: &[Event],
    clauses: &str,
    select: &str,
    width: usize,
    partitions: usize,
) -> Vec<Vec<Option<i32>>> {
    use datafusion_autocdc::sql::{parse_cdc_statement, CdcStatement};
    use datafusion_autocdc::AutoCdcDataFrame;
    let s = session(partitions).await;
    let source = format!("CREATE TABLE src AS {}", Shape::FULL.source_sql(events));
    s.sql(&source).await.unwrap().collect().await.unwrap();
    let flow = format!("CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) {clauses}");
    let Ok(Some(CdcStatement::CreateFlow(spec))) = parse_cdc_statement(&flow, "generic", true)
    else {
        panic!("not a flow: {flow}")
    };
    let folded = s
        .context()
        .table("src")
        .await
        .unwrap()
        .auto_cdc(&spec)
        .unwrap_or_else(|e| panic!("{flow}: {e}"));
    s.context().register_table("t", folded.into_view()).unwrap();
    read(
        &s.sql(select)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{flow}: {e}")),
        width,
    )
}

/// An event that would fail an update: a NULL key or a NULL sequence (at
/// least one of them is NULL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Hostile {
    id: Option<i32>,
    seq: Option<i32>,
    delete: bool,
    a: Option<i32>,
}

fn hostile() -> impl Strategy<Value = Hostile> {
    (
        prop::option::of(0..3i32),
        prop::option::of(0..12i32),
        any::<bool>(),
        value(),
    )
        .prop_filter("a NULL key or sequence", |(id, seq, _, _)| {
            id.is_none() || seq.is_none()
        })
        .prop_map(|(id, seq, delete, a)| Hostile { id, seq, delete, a })
}

impl Hostile {
    /// Its row of the source, in `model::source_sql`'s columns.
    fn sql(self) -> String {
        let int = |v: Option<i32>| v.map_or("NULL".to_string(), |v| v.to_string());
        format!(
            "SELECT CAST({} AS INT) AS id, CAST({} AS INT) AS a, CAST(NULL AS INT) AS b, \
             '{}' AS op, CAST({} AS INT) AS seq, CAST(0 AS INT) AS st, \
             CAST(NULL AS VARCHAR[]) AS cols",
            int(self.id),
            int(self.a),
            if self.delete { "D" } else { "U" },
            int(self.seq)
        )
    }

    /// Its row of `<t>__rejects` (reason, key, sequence, change, row), as
    /// the rules say (SPEC §4.8), written by hand.
    fn rejected(self) -> String {
        let text = |v: Option<i32>| v.map_or("NULL".to_string(), |v| v.to_string());
        let json = |v: Option<i32>| v.map_or("null".to_string(), |v| v.to_string());
        let reason = if self.seq.is_none() {
            "NULL sequence"
        } else {
            "NULL key column 'id'"
        };
        format!(
            "{reason}|id={}|{}|{}|{{\"id\":{},\"a\":{},\"b\":null}}",
            text(self.id),
            text(self.seq),
            if self.delete { "DELETE" } else { "UPSERT" },
            json(self.id),
            json(self.a)
        )
    }
}

/// The updates of a rejects test: `events` and their conflicting `twins`
/// (a key event's copy with `a` set to the given value, outside the values
/// events take) shuffled and split at `cuts`, the `bad` events spread over
/// them, and a final replay of everything.
fn hostile_updates(
    events: &[Event],
    twins: &[(prop::sample::Index, i32)],
    bad: &[Hostile],
    order: u64,
    cuts: &[prop::sample::Index],
) -> Vec<(Vec<Event>, Vec<Hostile>)> {
    let mut all = events.to_vec();
    let keyed: Vec<Event> = events
        .iter()
        .copied()
        .filter(|e| e.kind != Kind::Truncate)
        .collect();
    if !keyed.is_empty() {
        for (index, value) in twins {
            let mut twin = *index.get(&keyed);
            twin.values[0] = Some(*value);
            all.push(twin);
        }
    }
    let mut updates: Vec<(Vec<Event>, Vec<Hostile>)> = shuffle_and_split(&all, order, cuts)
        .into_iter()
        .map(|u| (u, Vec::new()))
        .collect();
    if updates.is_empty() {
        updates.push((Vec::new(), Vec::new()));
    }
    let n = updates.len();
    for (i, h) in bad.iter().enumerate() {
        updates[i % n].1.push(*h);
    }
    updates.push((all, bad.to_vec()));
    updates
}

/// One update's events split by the conflict rule (SPEC §2.2, §4.8): the
/// key events of one (key, sequence) that differ in kind or values are all
/// rejected; the rest apply.
fn without_conflicts(update: &[Event]) -> (Vec<Event>, Vec<Event>) {
    let mut firsts: std::collections::HashMap<(i32, i32), (Kind, model::Row)> =
        std::collections::HashMap::new();
    let mut conflicting: HashSet<(i32, i32)> = HashSet::new();
    for e in update.iter().filter(|e| e.kind != Kind::Truncate) {
        let first = firsts.entry((e.id, e.seq)).or_insert((e.kind, e.values));
        if *first != (e.kind, e.values) {
            conflicting.insert((e.id, e.seq));
        }
    }
    update
        .iter()
        .partition(|e| e.kind == Kind::Truncate || !conflicting.contains(&(e.id, e.seq)))
}

/// A conflicting event's row of `<t>__rejects`, written by hand.
fn conflict_rejected(e: &Event) -> String {
    let json = |v: Option<i32>| v.map_or("null".to_string(), |v| v.to_string());
    format!(
        "conflicting events (same key and sequence, different values)|id={}|{}|{}|{{\"id\":{},\"a\":{},\"b\":{}}}",
        e.id,
        e.seq,
        if e.kind == Kind::Delete { "DELETE" } else { "UPSERT" },
        e.id,
        json(e.values[0]),
        json(e.values[1])
    )
}

/// Run `updates` (good events and hostile ones) into an SCD 1 target with
/// rejects on; its rows and its rejects, sorted.
async fn engine_with_rejects(
    updates: &[(Vec<Event>, Vec<Hostile>)],
    clauses: &str,
    select: &str,
    width: usize,
    partitions: usize,
) -> (Vec<Vec<Option<i32>>>, Vec<String>) {
    let s = session(partitions).await;
    s.sql("CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.rejects' = 'true')")
        .await
        .unwrap();
    for (i, (good, bad)) in updates.iter().enumerate() {
        let mut source = model::source_sql(good);
        for h in bad {
            source = format!("{source} UNION ALL {}", h.sql());
        }
        update(&s, i, &source, clauses).await;
    }
    let rows = read(
        &s.sql(select).await.unwrap().collect().await.unwrap(),
        width,
    );
    let batches = s
        .sql("SELECT reason, key, sequence, change, \"row\" FROM t__rejects")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut rejects = Vec::new();
    for b in &batches {
        for i in 0..b.num_rows() {
            let fields: Vec<String> = (0..5)
                .map(|c| {
                    let column = b.column(c);
                    if column.is_null(i) {
                        "NULL".to_string()
                    } else {
                        datafusion::arrow::util::display::array_value_to_string(column, i).unwrap()
                    }
                })
                .collect();
            rejects.push(fields.join("|"));
        }
    }
    rejects.sort();
    (rows, rejects)
}

/// Run `updates` from a file folder (one Parquet file per update: the flow
/// reads the files it has not read); right after update `at`, `RESTORE` the
/// target to the version update `to` (< `at`) committed and read it back with
/// `select`; then run the updates after `at`. Returns the rows after the
/// restore and at the end.
async fn engine_with_restore(
    updates: &[Vec<Event>],
    at: usize,
    to: usize,
    clauses: &str,
    select: &str,
    width: usize,
    partitions: usize,
) -> (Vec<Vec<Option<i32>>>, Vec<Vec<Option<i32>>>) {
    let s = session(partitions).await;
    let sql = |stmt: String| {
        let s = &s;
        async move { run(s, &stmt).await }
    };
    sql(format!(
        "CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '{}')",
        partitions * 2 - 1
    ))
    .await;
    let mut versions = Vec::new();
    let mut restored = Vec::new();
    for (i, update) in updates.iter().enumerate() {
        sql(format!(
            "COPY ({}) TO 'memory:///feed/u{i:03}.parquet' STORED AS PARQUET",
            model::source_sql(update)
        ))
        .await;
        if i == 0 {
            sql("CREATE EXTERNAL TABLE feed STORED AS PARQUET LOCATION 'memory:///feed/'".into())
                .await;
            sql(format!(
                "CREATE FLOW f AS AUTO CDC INTO t FROM feed KEYS (id) {clauses}"
            ))
            .await;
        } else {
            sql("REFRESH STREAMING TABLE t".into()).await;
        }
        let latest = sql("SELECT max(commit_version) FROM event_log('t')".into()).await;
        versions.push(
            latest[0]
                .column(0)
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .value(0),
        );
        if i == at {
            sql(format!(
                "RESTORE STREAMING TABLE t TO VERSION AS OF {}",
                versions[to]
            ))
            .await;
            restored = read(&sql(select.to_string()).await, width);
        }
    }
    (restored, read(&sql(select.to_string()).await, width))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn value() -> impl Strategy<Value = Option<i32>> {
    prop_oneof![1 => Just(None), 3 => (0..3i32).prop_map(Some)]
}

fn writes() -> impl Strategy<Value = Option<u8>> {
    prop_oneof![1 => Just(None), 2 => (0u8..4).prop_map(Some)]
}

fn partial() -> impl Strategy<Value = Partial> {
    prop_oneof![
        2 => Just(Partial::None),
        2 => any::<[bool; 2]>().prop_map(|keep| Partial::IgnoreNulls { keep }),
        1 => Just(Partial::ColumnsToUpdate),
    ]
}

/// Up to `n` events over 3 keys; at most one event per identity (`unique`),
/// some replayed exactly.
fn events(
    n: usize,
    truncates: bool,
    unique: fn(&Event) -> (i32, i32, i32, bool),
) -> impl Strategy<Value = Vec<Event>> {
    let kind = if truncates {
        prop_oneof![6 => Just(Kind::Upsert), 2 => Just(Kind::Delete), 1 => Just(Kind::Truncate)]
            .boxed()
    } else {
        prop_oneof![3 => Just(Kind::Upsert), 1 => Just(Kind::Delete)].boxed()
    };
    let event = (0..3i32, 0..12i32, 0..6i32, kind, value(), value(), writes()).prop_map(
        |(id, seq, st, kind, a, b, writes)| Event {
            id,
            seq,
            st,
            kind,
            values: [a, b],
            writes,
        },
    );
    prop::collection::vec((event, prop::bool::weighted(0.15)), 0..n).prop_map(move |raw| {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (e, replay) in raw {
            if seen.insert(unique(&e)) {
                out.push(e);
                if replay {
                    out.push(e);
                }
            }
        }
        out
    })
}

/// A DML statement on an SCD 1 target of keys 0..3.
fn dml() -> impl Strategy<Value = scd1::Dml> {
    prop_oneof![
        (0..3i32).prop_map(scd1::Dml::Delete),
        (0..3i32, value()).prop_map(|(id, a)| scd1::Dml::Update(id, a)),
        (0..3i32, value(), value()).prop_map(|(id, a, b)| scd1::Dml::Insert(id, [a, b])),
    ]
}

/// A DML statement on the versions of an SCD 2 target of keys 0..3.
fn scd2_dml() -> impl Strategy<Value = scd2::Dml> {
    let row = (value(), value()).prop_map(|(a, b)| [a, b]);
    prop_oneof![
        (0..3i32).prop_map(scd2::Dml::DeleteKey),
        (0..3i32, 0..4usize).prop_map(|(id, n)| scd2::Dml::DeleteVersion(id, n)),
        (0..3i32, 0..4usize, value()).prop_map(|(id, n, a)| scd2::Dml::Update(id, n, a)),
        (0..3i32, 0..13i32).prop_map(|(id, end)| scd2::Dml::Close(id, end)),
        (0..3i32, row, 0..13i32, prop::option::of(1..4i32)).prop_map(|(id, row, start, len)| {
            scd2::Dml::Insert(id, row, start, len.map(|l| start + l))
        }),
    ]
}

/// The table properties of per-column sequencing, `a` and `b` apart or in
/// one group.
fn per_column_properties(together: bool) -> String {
    let groups = if together {
        ", 'autocdc.sequenceGroups' = 'ab: a, b'"
    } else {
        ""
    };
    format!(", 'autocdc.sequencePerColumn' = 'true'{groups}")
}

/// Key events are unique per (key, seq), truncates per seq.
fn by_key_seq(e: &Event) -> (i32, i32, i32, bool) {
    let truncate = e.kind == Kind::Truncate;
    (if truncate { 0 } else { e.id }, e.seq, 0, truncate)
}

/// Unique per (key, business seq, system seq).
fn by_key_seq_st(e: &Event) -> (i32, i32, i32, bool) {
    (e.id, e.seq, e.st, false)
}

/// `events` with some upserts moving their row from another key (`moves[i]`
/// for event `i`, kept in `st` as old key + 1): only where the old key has
/// no other event at that sequence, and no other row moves from it at that
/// sequence (so that the model's DELETE is the only event of its key and
/// sequence, as the engine requires: two rows moving from one key at one
/// sequence are two DELETEs carrying different rows, a conflict).
fn with_moves(mut events: Vec<Event>, moves: &[Option<i32>]) -> Vec<Event> {
    let mut taken: HashSet<(i32, i32)> = events
        .iter()
        .filter(|e| e.kind != Kind::Truncate)
        .map(|e| (e.id, e.seq))
        .collect();
    for (i, e) in events.iter_mut().enumerate() {
        e.st = 0;
        if let Some(Some(old)) = moves.get(i) {
            if e.kind == Kind::Upsert && *old != e.id && taken.insert((*old, e.seq)) {
                e.st = old + 1;
            }
        }
    }
    // a replayed event moves like its first copy
    let mut first: std::collections::HashMap<(i32, i32), i32> = Default::default();
    for e in events.iter_mut().filter(|e| e.kind == Kind::Upsert) {
        e.st = *first.entry((e.id, e.seq)).or_insert(e.st);
    }
    events
}

/// The model's reading of [`with_moves`]: each move is a DELETE of the old
/// key beside its upsert.
fn moves_as_deletes(events: &[Event]) -> Vec<Event> {
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        out.push(Event { st: 0, ..*e });
        if e.st > 0 {
            out.push(Event {
                id: e.st - 1,
                st: 0,
                kind: Kind::Delete,
                values: [None, None],
                writes: None,
                ..*e
            });
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), .. ProptestConfig::default() })]

    /// SCD 1: updates in order, late events dropped, truncates, tombstones,
    /// partial updates; a final replay of everything changes nothing. One
    /// case in five selects no value column (a target of keys only).
    #[test]
    fn scd1_equals_the_model(
        events in events(16, true, by_key_seq),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partial in partial(),
        keys_only in prop::bool::weighted(0.2),
        partitions in 1usize..4,
        fold in fold_choice(),
    ) {
        // a keys-only target has no column to merge partial updates into
        let partial = if keys_only { Partial::None } else { partial };
        let mut updates = shuffle_and_split(&events, order, &cuts);
        updates.push(events.clone());
        let mut model = scd1::Scd1::default();
        for update in &updates {
            model.apply(update, partial);
        }
        let expected: Vec<Vec<Option<i32>>> = model
            .rows()
            .into_iter()
            .map(|(id, a, b)| if keys_only { vec![Some(id)] } else { vec![Some(id), a, b] })
            .collect();
        let (ignore, to_update) = partial.clauses();
        let columns = if keys_only { "(id)" } else { "(id, a, b)" };
        let clauses = format!(
            "{ignore} APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' \
             SEQUENCE BY seq COLUMNS {columns} {to_update}"
        );
        let (select, width) = if keys_only {
            ("SELECT id FROM t", 1)
        } else {
            ("SELECT id, a, b FROM t", 3)
        };
        let got = runtime().block_on(engine_with(
            &updates, &[], &[], &clauses, select, width, partitions, fold, "",
        ));
        prop_assert_eq!(got, expected, "fold: {:?}, partial: {:?}, keys only: {}, updates: {:?}", fold, partial, keys_only, updates);
        // the relation: one update of every event (with partial updates a
        // late event merges instead of being dropped: the model of one update)
        let mut once = scd1::Scd1::default();
        once.apply(&events, partial);
        let expected: Vec<Vec<Option<i32>>> = once
            .rows()
            .into_iter()
            .map(|(id, a, b)| if keys_only { vec![Some(id)] } else { vec![Some(id), a, b] })
            .collect();
        let got = runtime().block_on(relation(&events, &clauses, select, width, partitions));
        prop_assert_eq!(got, expected, "relation, partial: {:?}, keys only: {}, events: {:?}", partial, keys_only, events);
    }

    /// Per-column sequencing (SPEC §2.6), SCD 1: two arrival orders, each
    /// split into updates anywhere and followed by a replay of everything,
    /// give the same rows: those of one update of every event in sequence
    /// order, in the model. `a` and `b` are sequenced apart or as one group.
    #[test]
    fn scd1_per_column_equals_the_model(
        events in events(16, true, by_key_seq),
        arrivals in prop::collection::vec(
            (any::<u64>(), prop::collection::vec(any::<prop::sample::Index>(), 0..3)),
            2,
        ),
        partial in partial(),
        together in any::<bool>(),
        partitions in 1usize..4,
        fold in fold_choice(),
    ) {
        let merge = Merge { partial, together };
        let mut model = scd1::Scd1::default();
        model.apply(&events, merge);
        let expected: Vec<Vec<Option<i32>>> = model
            .rows()
            .into_iter()
            .map(|(id, a, b)| vec![Some(id), a, b])
            .collect();
        let (ignore, to_update) = partial.clauses();
        let clauses = format!(
            "{ignore} APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' \
             SEQUENCE BY seq COLUMNS (id, a, b) {to_update}"
        );
        let properties = per_column_properties(together);
        for (order, cuts) in &arrivals {
            let mut updates = shuffle_and_split(&events, *order, cuts);
            updates.push(events.clone());
            let got = runtime().block_on(engine_with(
                &updates, &[], &[], &clauses, "SELECT id, a, b FROM t", 3, partitions, fold,
                &properties,
            ));
            prop_assert_eq!(got, expected.clone(), "fold: {:?}, merge: {:?}, updates: {:?}", fold, merge, updates);
        }
    }

    /// Per-column sequencing, SCD 2: any split and order gives the model's
    /// history, groups written whole.
    #[test]
    fn scd2_per_column_equals_the_model(
        events in events(16, false, by_key_seq),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partial in partial(),
        together in any::<bool>(),
        partitions in 1usize..4,
    ) {
        let merge = Merge { partial, together };
        let expected: Vec<Vec<Option<i32>>> = scd2::history(&events, merge, [true, true])
            .into_iter()
            .map(|(id, a, b, start, end)| vec![Some(id), a, b, Some(start), end])
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let (ignore, to_update) = partial.clauses();
        let clauses = format!(
            "{ignore} APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, a, b) \
             STORED AS SCD TYPE 2 {to_update}"
        );
        let updates = shuffle_and_split(&events, order, &cuts);
        let got = runtime().block_on(engine_with(
            &updates, &[], &[], &clauses, "SELECT id, a, b, __start_at, __end_at FROM t", 5,
            partitions, Fold::Sorted, &per_column_properties(together),
        ));
        prop_assert_eq!(got, expected, "merge: {:?}, updates: {:?}", merge, updates);
    }

    /// SCD 1 with rejects on (SPEC §4.8): events with a NULL key or a NULL
    /// sequence, and conflicting events (twins of events at the same key and
    /// sequence with another value, landing in the same update or not),
    /// spread over the updates: each rejected event is in `t__rejects` once
    /// (a replay rejects nothing new) and the target equals the model of the
    /// events each update did not reject.
    #[test]
    fn scd1_with_rejects_equals_the_model(
        events in events(14, true, by_key_seq),
        twins in prop::collection::vec((any::<prop::sample::Index>(), 3..6i32), 0..3),
        bad in prop::collection::vec(hostile(), 0..6),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partitions in 1usize..4,
    ) {
        let updates = hostile_updates(&events, &twins, &bad, order, &cuts);
        let mut model = scd1::Scd1::default();
        let mut expected_rejects: HashSet<String> =
            bad.iter().copied().map(Hostile::rejected).collect();
        for (update, _) in &updates {
            let (applied, conflicting) = without_conflicts(update);
            model.apply(&applied, Partial::None);
            expected_rejects.extend(conflicting.iter().map(conflict_rejected));
        }
        let expected: Vec<Vec<Option<i32>>> = model
            .rows()
            .into_iter()
            .map(|(id, a, b)| vec![Some(id), a, b])
            .collect();
        let mut expected_rejects: Vec<String> = expected_rejects.into_iter().collect();
        expected_rejects.sort();
        let clauses = "APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' \
                       SEQUENCE BY seq COLUMNS (id, a, b)";
        let (rows, rejects) = runtime().block_on(engine_with_rejects(
            &updates, clauses, "SELECT id, a, b FROM t", 3, partitions,
        ));
        prop_assert_eq!(rows, expected, "updates: {:?}", updates);
        prop_assert_eq!(rejects, expected_rejects, "updates: {:?}", updates);
    }

    /// SCD 2 with rejects on: as for SCD 1, and a new event that differs
    /// from the stored event of its key and sequence (applied by an earlier
    /// update) is rejected while the stored one stays; the history equals
    /// the model's of the events each update kept.
    #[test]
    fn scd2_with_rejects_equals_the_model(
        events in events(14, false, by_key_seq),
        twins in prop::collection::vec((any::<prop::sample::Index>(), 3..6i32), 0..3),
        bad in prop::collection::vec(hostile(), 0..4),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partitions in 1usize..4,
    ) {
        let updates = hostile_updates(&events, &twins, &bad, order, &cuts);
        // the model: the events each update kept, by (key, sequence)
        let mut stored: std::collections::HashMap<(i32, i32), Event> =
            std::collections::HashMap::new();
        let mut expected_rejects: HashSet<String> =
            bad.iter().copied().map(Hostile::rejected).collect();
        for (update, _) in &updates {
            let mut fresh: Vec<Event> = Vec::new();
            for e in update {
                match stored.get(&(e.id, e.seq)) {
                    Some(s) if (s.kind, s.values) != (e.kind, e.values) => {
                        expected_rejects.insert(conflict_rejected(e));
                    }
                    Some(_) => {}
                    None => fresh.push(*e),
                }
            }
            let (applied, conflicting) = without_conflicts(&fresh);
            expected_rejects.extend(conflicting.iter().map(conflict_rejected));
            for e in applied {
                stored.insert((e.id, e.seq), e);
            }
        }
        let kept: Vec<Event> = stored.into_values().collect();
        let expected: Vec<Vec<Option<i32>>> = scd2::history(&kept, Partial::None, [true, true])
            .into_iter()
            .map(|(id, a, b, start, end)| vec![Some(id), a, b, Some(start), end])
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut expected_rejects: Vec<String> = expected_rejects.into_iter().collect();
        expected_rejects.sort();
        let clauses = "APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, a, b) \
                       STORED AS SCD TYPE 2";
        let (rows, rejects) = runtime().block_on(engine_with_rejects(
            &updates,
            clauses,
            "SELECT id, a, b, __start_at, __end_at FROM t",
            5,
            partitions,
        ));
        prop_assert_eq!(rows, expected, "updates: {:?}", updates);
        prop_assert_eq!(rejects, expected_rejects, "updates: {:?}", updates);
    }

    /// RESTORE (SPEC §4.9) in the middle of a history read from a file
    /// folder: right after the restore the target is the model of the
    /// updates up to the restored one; the next update reads the files of
    /// the undone updates again (with the next file), so at the end the
    /// target is the model of every update, the undone ones re-read.
    #[test]
    fn scd1_restore_equals_the_model(
        events in events(14, true, by_key_seq),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 1..4),
        order in any::<u64>(),
        at in any::<prop::sample::Index>(),
        to in any::<prop::sample::Index>(),
        partial in partial(),
        partitions in 1usize..4,
    ) {
        let updates = shuffle_and_split(&events, order, &cuts);
        let at = 1 + at.index(updates.len() - 1);
        let to = to.index(at);
        let model_of = |groups: &[Vec<Event>]| {
            let mut model = scd1::Scd1::default();
            for update in groups {
                model.apply(update, partial);
            }
            model
                .rows()
                .into_iter()
                .map(|(id, a, b)| vec![Some(id), a, b])
                .collect::<Vec<_>>()
        };
        // the engine's updates after the restore: the undone ones and the
        // next one read together, then the rest one by one (none when the
        // restore came last)
        let mut after: Vec<Vec<Event>> = updates[..=to].to_vec();
        if at + 1 < updates.len() {
            after.push(updates[to + 1..=at + 1].concat());
            after.extend(updates[at + 2..].iter().cloned());
        }
        let (ignore, to_update) = partial.clauses();
        let clauses = format!(
            "{ignore} APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' \
             SEQUENCE BY seq COLUMNS (id, a, b) {to_update}"
        );
        let (restored, end) = runtime().block_on(engine_with_restore(
            &updates, at, to, &clauses, "SELECT id, a, b FROM t", 3, partitions,
        ));
        prop_assert_eq!(restored, model_of(&updates[..=to]), "restored to update {} after {}: {:?}", to, at, updates);
        prop_assert_eq!(end, model_of(&after), "restored to update {} after {}: {:?}", to, at, updates);
    }

    /// The same for SCD 2: history is a function of the set of events, so
    /// after the restore it is that of the updates up to the restored one,
    /// and at the end that of every event.
    #[test]
    fn scd2_restore_equals_the_model(
        events in events(14, false, by_key_seq),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 1..4),
        order in any::<u64>(),
        at in any::<prop::sample::Index>(),
        to in any::<prop::sample::Index>(),
        partitions in 1usize..4,
    ) {
        let updates = shuffle_and_split(&events, order, &cuts);
        let at = 1 + at.index(updates.len() - 1);
        let to = to.index(at);
        let history = |events: Vec<Event>| {
            scd2::history(&events, Partial::None, [true, true])
                .into_iter()
                .map(|(id, a, b, start, end)| vec![Some(id), a, b, Some(start), end])
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
        };
        let clauses = "APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, a, b) \
                       STORED AS SCD TYPE 2";
        let (restored, end) = runtime().block_on(engine_with_restore(
            &updates, at, to, clauses, "SELECT id, a, b, __start_at, __end_at FROM t", 5, partitions,
        ));
        prop_assert_eq!(restored, history(updates[..=to].concat()), "restored to update {} after {}: {:?}", to, at, updates);
        let read = if at + 1 < updates.len() { updates.len() } else { to + 1 };
        prop_assert_eq!(end, history(updates[..read].concat()), "restored to update {} after {}: {:?}", to, at, updates);
    }

    /// SCD 1 with DML between updates: `DELETE` leaves a tombstone at the
    /// row's sequence, `UPDATE` keeps it, `INSERT` of a key not live takes
    /// its tombstone's sequence or the least one; later events (and a final
    /// replay of all of them) sequence against what DML left.
    #[test]
    fn scd1_with_dml_equals_the_model(
        events in events(14, true, by_key_seq),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partial in partial(),
        dml in prop::collection::vec(prop::collection::vec(dml(), 0..3), 4),
        partitions in 1usize..4,
        fold in fold_choice(),
    ) {
        let mut updates = shuffle_and_split(&events, order, &cuts);
        updates.push(events.clone());
        let mut model = scd1::Scd1::default();
        let mut between = Vec::new();
        for (update, ops) in updates.iter().zip(dml.iter().cycle()) {
            model.apply(update, partial);
            let mut statements = Vec::new();
            for op in ops {
                if let Some(sql) = model.dml(*op) {
                    statements.push(sql);
                }
            }
            between.push(statements);
        }
        let expected: Vec<Vec<Option<i32>>> = model
            .rows()
            .into_iter()
            .map(|(id, a, b)| vec![Some(id), a, b])
            .collect();
        let (ignore, to_update) = partial.clauses();
        let clauses = format!(
            "{ignore} APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' \
             SEQUENCE BY seq COLUMNS (id, a, b) {to_update}"
        );
        let got = runtime().block_on(engine_with(
            &updates, &between, &[], &clauses, "SELECT id, a, b FROM t", 3, partitions, fold, "",
        ));
        prop_assert_eq!(got, expected, "fold: {:?}, partial: {:?}, updates: {:?}, dml: {:?}", fold, partial, updates, between);
    }

    /// SCD 2: the history is a function of the set of events, for every
    /// option (TRACK HISTORY of both, one or no column, partial updates),
    /// split and order, and for targets of keys only.
    #[test]
    fn scd2_equals_the_model(
        events in events(16, false, by_key_seq),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partial in partial(),
        tracked in prop_oneof![Just([true, true]), Just([true, false]), Just([false, false])],
        keys_only in prop::bool::weighted(0.2),
        partitions in 1usize..4,
    ) {
        // a keys-only target tracks nothing and merges nothing
        let (partial, tracked) = if keys_only {
            (Partial::None, [false, false])
        } else {
            (partial, tracked)
        };
        let updates = shuffle_and_split(&events, order, &cuts);
        let expected: Vec<Vec<Option<i32>>> = scd2::history(&events, partial, tracked)
            .into_iter()
            .map(|(id, a, b, start, end)| if keys_only {
                vec![Some(id), Some(start), end]
            } else {
                vec![Some(id), a, b, Some(start), end]
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let (ignore, to_update) = partial.clauses();
        let track = match (keys_only, tracked) {
            (true, _) | (false, [true, true]) => "",
            (false, [true, false]) => "TRACK HISTORY ON (a)",
            (false, _) => "TRACK HISTORY ON * EXCEPT (a, b)",
        };
        let columns = if keys_only { "(id)" } else { "(id, a, b)" };
        let clauses = format!(
            "{ignore} APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS {columns} \
             STORED AS SCD TYPE 2 {track} {to_update}"
        );
        let (select, width) = if keys_only {
            ("SELECT id, __start_at, __end_at FROM t", 3)
        } else {
            ("SELECT id, a, b, __start_at, __end_at FROM t", 5)
        };
        let got = runtime().block_on(engine(&updates, &clauses, select, width, partitions));
        prop_assert_eq!(&got, &expected, "partial: {:?}, tracked: {:?}, keys only: {}, updates: {:?}", partial, tracked, keys_only, updates);
        let got = runtime().block_on(relation(&events, &clauses, select, width, partitions));
        prop_assert_eq!(got, expected, "relation, partial: {:?}, tracked: {:?}, keys only: {}, events: {:?}", partial, tracked, keys_only, events);
    }

    /// Primary-key changes (`PREVIOUS KEYS`): an upsert moving a row from
    /// another key is, in the model, a DELETE of that key and the upsert at
    /// the same sequence; any split and order, a final replay. (The old key
    /// travels in the `st` column, unused by SCD 1: `st - 1`, 0 = none.)
    #[test]
    fn scd1_key_changes_equal_the_model(
        events in events(14, true, by_key_seq),
        moves in prop::collection::vec(prop::option::weighted(0.3, 0..3i32), 28),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partitions in 1usize..4,
        fold in fold_choice(),
    ) {
        let events = with_moves(events, &moves);
        let mut updates = shuffle_and_split(&events, order, &cuts);
        updates.push(events.clone());
        let mut model = scd1::Scd1::default();
        for update in &updates {
            model.apply(&moves_as_deletes(update), Partial::None);
        }
        let expected: Vec<Vec<Option<i32>>> = model
            .rows()
            .into_iter()
            .map(|(id, a, b)| vec![Some(id), a, b])
            .collect();
        let clauses = "PREVIOUS KEYS (CASE WHEN st > 0 THEN st - 1 END) \
             APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T' \
             SEQUENCE BY seq COLUMNS (id, a, b)";
        let got = runtime().block_on(engine_with(
            &updates, &[], &[], clauses, "SELECT id, a, b FROM t", 3, partitions, fold, "",
        ));
        prop_assert_eq!(got, expected, "fold: {:?}, updates: {:?}", fold, updates);
    }

    /// SCD 2 with primary-key changes: the old key's version closes at the
    /// move, as if the DELETE had been written.
    #[test]
    fn scd2_key_changes_equal_the_model(
        events in events(14, false, by_key_seq),
        moves in prop::collection::vec(prop::option::weighted(0.3, 0..3i32), 28),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partitions in 1usize..4,
    ) {
        let events = with_moves(events, &moves);
        let updates = shuffle_and_split(&events, order, &cuts);
        let expected: Vec<Vec<Option<i32>>> =
            scd2::history(&moves_as_deletes(&events), Partial::None, [true, true])
                .into_iter()
                .map(|(id, a, b, start, end)| vec![Some(id), a, b, Some(start), end])
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
        let clauses = "PREVIOUS KEYS (CASE WHEN st > 0 THEN st - 1 END) \
             APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, a, b) STORED AS SCD TYPE 2";
        let got = runtime().block_on(engine(
            &updates, clauses, "SELECT id, a, b, __start_at, __end_at FROM t", 5, partitions,
        ));
        prop_assert_eq!(got, expected, "updates: {:?}", updates);
    }

    /// SCD 2 with DML between updates: statements edit versions; the
    /// edited versions become their keys' histories, replays of what they
    /// corrected are ignored (a final replay of every event included), and
    /// an erased key drops events at or before its greatest sequence.
    #[test]
    fn scd2_with_dml_equals_the_model(
        events in events(14, false, by_key_seq),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        tracked in prop_oneof![Just([true, true]), Just([true, false]), Just([false, false])],
        dml in prop::collection::vec(prop::collection::vec(scd2_dml(), 0..3), 4),
        partitions in 1usize..4,
    ) {
        let mut updates = shuffle_and_split(&events, order, &cuts);
        updates.push(events.clone());
        let mut model = scd2::Scd2Dml::new(tracked);
        let mut between = Vec::new();
        for (update, ops) in updates.iter().zip(dml.iter().cycle()) {
            model.apply(update);
            between.push(ops.iter().filter_map(|op| model.dml(*op)).collect::<Vec<_>>());
        }
        let expected: Vec<Vec<Option<i32>>> = model
            .versions()
            .into_iter()
            .map(|(id, a, b, start, end)| vec![Some(id), a, b, Some(start), end])
            .collect();
        let track = match tracked {
            [true, true] => "",
            [true, false] => "TRACK HISTORY ON (a)",
            _ => "TRACK HISTORY ON * EXCEPT (a, b)",
        };
        let clauses = format!(
            "APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS (id, a, b) \
             STORED AS SCD TYPE 2 {track}"
        );
        let got = runtime().block_on(engine_with(
            &updates,
            &between,
            &[],
            &clauses,
            "SELECT id, a, b, __start_at, __end_at FROM t",
            5,
            partitions,
            Fold::Sorted,
            "",
        ));
        prop_assert_eq!(got, expected, "tracked: {:?}, updates: {:?}, dml: {:?}", tracked, updates, between);
    }

    /// Schema evolution (SPEC §2.9), SCD 1 and SCD 2: each update's source
    /// may lack `b` (the target gains it when a source first has it; a
    /// source without it writes NULL) and may bring `a` as BIGINT (the
    /// column widens); the model sees NULL where the source had no `b`.
    #[test]
    fn schema_changes_equal_the_model(
        events in events(14, false, by_key_seq),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        shapes in prop::collection::vec((any::<bool>(), prop::bool::weighted(0.3)), 4),
        scd2 in any::<bool>(),
        partitions in 1usize..4,
    ) {
        let mut shapes: Vec<Shape> = shapes.into_iter().map(|(b, wide_a)| Shape { b, wide_a }).collect();
        // SCD 2 keeps every event: each event once (a replay with another
        // shape would be a different event at the same sequence)
        let events: Vec<Event> = if scd2 {
            let mut seen = HashSet::new();
            events.into_iter().filter(|e| seen.insert(*e)).collect()
        } else {
            events
        };
        let mut updates = shuffle_and_split(&events, order, &cuts);
        if !scd2 {
            // a final replay of everything (late, dropped)
            updates.push(events.clone());
        }
        shapes.truncate(updates.len());
        while shapes.len() < updates.len() {
            shapes.push(Shape::FULL);
        }
        // the table has `b` by the end
        if let Some(last) = shapes.last_mut() {
            last.b = true;
        }
        let shaped: Vec<Vec<Event>> = updates.iter().zip(&shapes).map(|(u, s)| s.apply(u)).collect();
        let (expected, clauses, select, width): (Vec<Vec<Option<i32>>>, &str, &str, usize) = if scd2 {
            let all: Vec<Event> = shaped.concat();
            (
                scd2::history(&all, Partial::None, [true, true])
                    .into_iter()
                    .map(|(id, a, b, start, end)| vec![Some(id), a, b, Some(start), end])
                    .collect(),
                "APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq, st, cols) \
                 STORED AS SCD TYPE 2",
                "SELECT id, CAST(a AS INT), b, __start_at, __end_at FROM t",
                5,
            )
        } else {
            let mut model = scd1::Scd1::default();
            for update in &shaped {
                model.apply(update, Partial::None);
            }
            (
                model.rows().into_iter().map(|(id, a, b)| vec![Some(id), a, b]).collect(),
                "APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq, st, cols)",
                "SELECT id, CAST(a AS INT), b FROM t",
                3,
            )
        };
        let got = runtime().block_on(engine_with(
            &updates, &[], &shapes, clauses, select, width, partitions, Fold::Indexed, "",
        ));
        let mut expected = expected;
        expected.sort();
        prop_assert_eq!(got, expected, "scd2: {}, shapes: {:?}, updates: {:?}", scd2, shapes, updates);
    }

    /// BITEMPORAL: the table is the beliefs at every system time, whatever
    /// the arrival order and split.
    #[test]
    fn bitemporal_equals_the_model(
        events in events(14, false, by_key_seq_st),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        order in any::<u64>(),
        partitions in 1usize..4,
    ) {
        let updates = shuffle_and_split(&events, order, &cuts);
        let expected: Vec<Vec<Option<i32>>> = bitemporal::table(&events)
            .into_iter()
            .map(|(id, a, b, s, e, ss, se)| vec![Some(id), a, b, Some(s), e, Some(ss), se])
            .collect();
        let clauses = "APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq SYSTEM SEQUENCE BY st \
                       COLUMNS (id, a, b) STORED AS BITEMPORAL";
        let select =
            "SELECT id, a, b, __start_at, __end_at, __system_start_at, __system_end_at FROM t";
        let got = runtime().block_on(engine(&updates, clauses, select, 7, partitions));
        prop_assert_eq!(&got, &expected, "updates: {:?}", updates);
        let got = runtime().block_on(relation(&events, clauses, select, 7, partitions));
        prop_assert_eq!(got, expected, "relation, events: {:?}", events);
    }
}
