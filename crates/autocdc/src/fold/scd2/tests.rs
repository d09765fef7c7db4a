//! The SCD 2 fold's rules on hand-made batches, every split of the input.

use super::super::columns::{
    Kind, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE, STORED_DELETE_EVENT,
    STORED_UPSERT_EVENT,
};
use super::super::columns::{
    STORED_DML_DELETE_EVENT, STORED_DML_UPSERT_EVENT, STORED_ERASED_AT, STORED_ERASED_THROUGH,
};
use super::super::test_support::{
    below, del, every_split, fold, mark, rows, spec, up, up_null, Ev,
};
use super::super::{FoldCounts, FoldSpec, PartialUpdates, ScdType};
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, Int8Type};

const VERSION: i8 = Kind::Upsert as i8;
const CHANGES: [i8; 4] = [
    CHANGE_INSERT,
    CHANGE_PREIMAGE,
    CHANGE_POSTIMAGE,
    CHANGE_DELETE,
];

/// Tracks `v` (column 1) unless `tracked` says otherwise.
fn scd2(tracked: Vec<usize>, partial: Option<PartialUpdates>) -> FoldSpec {
    spec(ScdType::Type2, tracked, partial)
}

/// Runs `events` in every split; all must agree. Returns the versions, the
/// hidden events, the change rows, and the counts.
fn run(spec: &FoldSpec, events: &[Ev]) -> (Vec<String>, Vec<String>, Vec<String>, FoldCounts) {
    every_split(events.len(), |split| {
        let (out, counts) = fold(spec, events, None, split).expect("fold");
        (
            rows(&out, &[VERSION]),
            rows(&out, &[STORED_UPSERT_EVENT, STORED_DELETE_EVENT]),
            rows(&out, &CHANGES),
            counts,
        )
    })
}

/// | seq | event      | history (tracked: v)                 |
/// |-----|------------|--------------------------------------|
/// | 1   | a          | opens [1, …) with a                  |
/// | 2   | a          | same tracked value: continues it     |
/// | 3   | b          | closes it at 3, opens [3, …)         |
/// | 5   | delete     | closes it at 5                       |
/// | 7   | c          | opens [7, NULL)                      |
#[test]
fn versions_open_on_tracked_changes_and_close_on_deletes() {
    let (versions, events, changes, counts) = run(
        &scd2(vec![1], None),
        &[
            up(1, "a", 1),
            up(1, "a", 2),
            up(1, "b", 3),
            del(1, 5),
            up(1, "c", 7),
        ],
    );
    assert_eq!(
        versions,
        [
            "id=1 v=a start_at=1 end_at=3 cdc_seq=2",
            "id=1 v=b start_at=3 end_at=5 cdc_seq=3",
            "id=1 v=c start_at=7 end_at=NULL cdc_seq=7",
        ]
    );
    // every event is kept: a version stands for its last event (a@2, b@3,
    // c@7), the others are hidden with their own values
    assert_eq!(
        events,
        [
            "id=1 v=NULL start_at=NULL end_at=NULL cdc_seq=5",
            "id=1 v=a start_at=NULL end_at=NULL cdc_seq=1",
        ]
    );
    // a new key: every version is an insert, and the counts are the rows
    // the update inserts, updates and deletes (SPEC §4), not its events
    assert_eq!(changes, versions);
    assert_eq!(
        counts,
        FoldCounts {
            input_rows: 5,
            upserted: 3,
            deleted: 0,
            tombstones: 0,
            late: 0,
            duplicates: 0,
            events_added: 5,
        }
    );
}

/// With no tracked column, an upsert updates the current version in place.
#[test]
fn untracked_changes_update_the_current_version() {
    let (versions, _, _, _) = run(&scd2(vec![], None), &[up(1, "a", 1), up(1, "b", 2)]);
    assert_eq!(versions, ["id=1 v=b start_at=1 end_at=NULL cdc_seq=2"]);
}

/// A late event splits the stored history where it belongs: the version it
/// cuts short is an update (pre- and post-image), its own an insert.
#[test]
fn a_late_event_splits_a_version() {
    let (versions, _, changes, counts) = run(
        &scd2(vec![1], None),
        &[
            up(1, "a", 1).stored(),
            up(1, "c", 5).stored(),
            up(1, "b", 3),
        ],
    );
    assert_eq!(
        versions,
        [
            "id=1 v=a start_at=1 end_at=3 cdc_seq=1",
            "id=1 v=b start_at=3 end_at=5 cdc_seq=3",
            "id=1 v=c start_at=5 end_at=NULL cdc_seq=5",
        ]
    );
    assert_eq!(
        changes,
        [
            "id=1 v=a start_at=1 end_at=3 cdc_seq=1",
            "id=1 v=a start_at=1 end_at=5 cdc_seq=1",
            "id=1 v=b start_at=3 end_at=5 cdc_seq=3",
        ]
    );
    assert_eq!((counts.input_rows, counts.events_added), (1, 1));
}

/// A delete stored before the upserts it follows closes them when they come.
#[test]
fn an_early_delete_closes_later_arriving_upserts() {
    let (versions, _, changes, _) = run(&scd2(vec![1], None), &[del(1, 2).stored(), up(1, "a", 1)]);
    assert_eq!(versions, ["id=1 v=a start_at=1 end_at=2 cdc_seq=1"]);
    assert_eq!(changes, versions);
}

/// A replay of a stored event changes nothing; a different event at a
/// stored sequence is a conflict naming the flow, key and sequence.
#[test]
fn replays_change_nothing_and_conflicts_fail() {
    let (versions, _, changes, counts) = run(
        &scd2(vec![1], None),
        &[up(1, "a", 1).stored(), up(1, "a", 1)],
    );
    assert_eq!(versions, ["id=1 v=a start_at=1 end_at=NULL cdc_seq=1"]);
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!((counts.duplicates, counts.events_added), (1, 0));

    let err = fold(
        &scd2(vec![1], None),
        &[up(1, "a", 1).stored(), up(1, "b", 1)],
        None,
        2,
    )
    .expect_err("a conflict")
    .to_string();
    assert!(
        err.contains("flow 'f': conflicting events for key (id=1) at SEQUENCE BY value 1 (against a stored event)"),
        "{err}"
    );
}

/// Under IGNORE NULL UPDATES the merge comes before the tracked-column
/// comparison: a NULL keeps `a` (no new version); hidden events stay raw.
#[test]
fn partial_updates_merge_before_tracking() {
    let (versions, events, _, _) = run(
        &scd2(vec![1], Some(PartialUpdates::IgnoreNulls(vec![1]))),
        &[up(1, "a", 1), up_null(1, 2), up(1, "b", 3)],
    );
    assert_eq!(
        versions,
        [
            "id=1 v=a start_at=1 end_at=3 cdc_seq=2",
            "id=1 v=b start_at=3 end_at=NULL cdc_seq=3",
        ]
    );
    // a version does not hold its events' raw values: every event is hidden
    assert_eq!(
        events,
        [
            "id=1 v=NULL start_at=NULL end_at=NULL cdc_seq=2",
            "id=1 v=a start_at=NULL end_at=NULL cdc_seq=1",
            "id=1 v=b start_at=NULL end_at=NULL cdc_seq=3",
        ]
    );
}

/// Under partial updates a version holds merged values, so a late event
/// changes the versions after it: the stored history is the merge of the
/// stored events alone, and the change feed goes from it to the new one.
///
/// | seq | stored       | before (merged) | late b@2 | after (merged)   |
/// |-----|--------------|-----------------|----------|------------------|
/// | 1   | a            | a [1, NULL)     |          | a [1, 2)         |
/// | 2   |              |                 | b        | b [2, NULL)      |
/// | 3   | NULL (keeps) | (absorbed: a)   |          | (absorbed: b)    |
#[test]
fn a_late_event_under_partial_updates_changes_the_merged_versions_after_it() {
    let spec = scd2(vec![1], Some(PartialUpdates::IgnoreNulls(vec![1])));
    let (versions, _, changes, counts) = run(
        &spec,
        &[
            up(1, "a", 1).stored(),
            up_null(1, 3).stored(),
            up(1, "a", 3).implied(),
            up(1, "b", 2),
        ],
    );
    assert_eq!(
        versions,
        [
            "id=1 v=a start_at=1 end_at=2 cdc_seq=1",
            "id=1 v=b start_at=2 end_at=NULL cdc_seq=3",
        ]
    );
    // the stored version as it was (a, absorbing NULL@3), closed at 2;
    // nothing of a version [3, NULL) that never was
    assert_eq!(
        changes,
        [
            "id=1 v=a start_at=1 end_at=2 cdc_seq=1",
            "id=1 v=a start_at=1 end_at=NULL cdc_seq=3",
            "id=1 v=b start_at=2 end_at=NULL cdc_seq=3",
        ]
    );
    assert_eq!((counts.upserted, counts.deleted), (2, 0));
}

/// Read back, a version is its last event again ([`Ev::implied`]); where
/// that event is also stored as itself — an older writer's hidden copy, a
/// raw event under partial updates — the stored one is the event.
///
/// | stored at seq s              | the event at s | hidden after      |
/// |------------------------------|----------------|-------------------|
/// | a version (implied) only     | the version's  | none (a version)  |
/// | a version and a hidden copy  | the copy       | none (a version)  |
/// | merged version, raw event    | the raw event  | the raw event     |
#[test]
fn a_version_is_read_back_as_its_event() {
    let spec = scd2(vec![1], None);
    let late_b = [
        "id=1 v=a start_at=1 end_at=3 cdc_seq=1",
        "id=1 v=b start_at=3 end_at=NULL cdc_seq=3",
    ];
    for copy in [false, true] {
        let mut events = vec![up(1, "a", 1).implied(), up(1, "b", 3)];
        if copy {
            events.push(up(1, "a", 1).stored());
        }
        let (versions, hidden, changes, counts) = run(&spec, &events);
        assert_eq!(versions, late_b, "copy: {copy}");
        assert!(hidden.is_empty(), "copy: {copy}: {hidden:?}");
        assert_eq!(
            changes,
            [
                "id=1 v=a start_at=1 end_at=3 cdc_seq=1",
                "id=1 v=a start_at=1 end_at=NULL cdc_seq=1",
                "id=1 v=b start_at=3 end_at=NULL cdc_seq=3",
            ],
            "copy: {copy}"
        );
        assert_eq!((counts.duplicates, counts.events_added), (0, 1));
    }
    // a replay of a version's event is a duplicate, another event a conflict
    let (_, _, changes, counts) = run(&spec, &[up(1, "a", 1).implied(), up(1, "a", 1)]);
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!((counts.duplicates, counts.events_added), (1, 0));
    let err = fold(&spec, &[up(1, "a", 1).implied(), up(1, "b", 1)], None, 2)
        .expect_err("a conflict")
        .to_string();
    assert!(
        err.contains("at SEQUENCE BY value 1 (against a stored event)"),
        "{err}"
    );

    // partial updates: the version holds the merged a@2, the event is NULL@2
    let (versions, hidden, _, _) = run(
        &scd2(vec![1], Some(PartialUpdates::IgnoreNulls(vec![1]))),
        &[
            up(1, "a", 1).stored(),
            up_null(1, 2).stored(),
            up(1, "a", 2).implied(),
            up(1, "b", 3),
        ],
    );
    assert_eq!(
        versions,
        [
            "id=1 v=a start_at=1 end_at=3 cdc_seq=2",
            "id=1 v=b start_at=3 end_at=NULL cdc_seq=3",
        ]
    );
    assert_eq!(
        hidden,
        [
            "id=1 v=NULL start_at=NULL end_at=NULL cdc_seq=2",
            "id=1 v=a start_at=NULL end_at=NULL cdc_seq=1",
            "id=1 v=b start_at=NULL end_at=NULL cdc_seq=3",
        ]
    );
}

/// What an update stores, read back as the next update reads it: versions
/// as their events, hidden rows as stored events, DML-written rows and
/// marks as such. With `copies`, every version's event is also stored as
/// itself, as an older writer stored it.
fn read_back(out: &[RecordBatch], copies: bool) -> Vec<Ev> {
    let mut events = Vec::new();
    for batch in out {
        let id = batch.column(0).as_primitive::<Int64Type>();
        let v = batch.column(1).as_string::<i32>();
        let seq = batch.column_by_name("__cdc_seq").expect("seq");
        let seq = seq.as_primitive::<Int64Type>();
        let kind = batch.column_by_name("__cdc_kind").expect("kind");
        let kind = kind.as_primitive::<Int8Type>();
        for r in 0..batch.num_rows() {
            let value: &'static str = match v.is_null(r) {
                true => "",
                false => Box::leak(v.value(r).to_string().into_boxed_str()),
            };
            let upsert = match v.is_null(r) {
                true => up_null(id.value(r), seq.value(r)),
                false => up(id.value(r), value, seq.value(r)),
            };
            let delete = del(id.value(r), seq.value(r));
            match kind.value(r) {
                VERSION => {
                    events.push(upsert.implied());
                    if copies {
                        events.push(upsert.stored());
                    }
                }
                STORED_UPSERT_EVENT => events.push(upsert.stored()),
                STORED_DELETE_EVENT => events.push(delete.stored()),
                STORED_DML_UPSERT_EVENT => events.push(upsert.by_dml()),
                STORED_DML_DELETE_EVENT => events.push(delete.by_dml()),
                code @ (STORED_ERASED_AT | STORED_ERASED_THROUGH) => {
                    events.push(mark(id.value(r), code, seq.value(r)))
                }
                _ => {}
            }
        }
    }
    events
}

/// History is a function of the set of events (SPEC §2.4), now that
/// versions stand for events: random histories of three keys, their
/// events cut into three updates, each folded over what the one before
/// stored (read back with and without an older writer's copies), give the
/// versions of one update folding them all; and the last update's stored
/// rows hold every event once.
#[test]
fn updates_over_stored_versions_fold_like_one() {
    let spec = scd2(vec![1], None);
    let values = ["a", "b", "c"];
    for seed in 0..300 {
        let mut below = below(seed);
        let mut events = Vec::new();
        for id in 1..=3 {
            let mut seqs: Vec<i64> = (0..below(8)).map(|_| 1 + below(12) as i64).collect();
            seqs.sort_unstable();
            seqs.dedup();
            for seq in seqs {
                events.push(match below(4) {
                    0 => del(id, seq),
                    v => up(id, values[v as usize - 1], seq),
                });
            }
        }
        let updates: Vec<usize> = events.iter().map(|_| below(3) as usize).collect();
        let (all, _) = fold(&spec, &events, None, 1000).expect("fold");
        let whole = rows(&all, &[VERSION]);
        for copies in [false, true] {
            let mut stored: Vec<Ev> = Vec::new();
            let mut last = Vec::new();
            for update in 0..3 {
                let mut input = stored.clone();
                input.extend(
                    events
                        .iter()
                        .zip(&updates)
                        .filter(|(_, &u)| u == update)
                        .map(|(e, _)| *e),
                );
                let (out, _) = fold(&spec, &input, None, 1 + below(5) as usize)
                    .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                stored = read_back(&out, copies);
                last = out;
            }
            assert_eq!(
                rows(&last, &[VERSION]),
                whole,
                "seed {seed}, copies {copies}"
            );
            // every event once: as a version or hidden
            let mut kept: Vec<(i64, i64)> = read_back(&last, false)
                .iter()
                .map(|e| (e.id, e.seq))
                .collect();
            kept.sort_unstable();
            let mut expected: Vec<(i64, i64)> = events.iter().map(|e| (e.id, e.seq)).collect();
            expected.sort_unstable();
            assert_eq!(kept, expected, "seed {seed}, copies {copies}");
        }
    }
}

/// The change feed takes each update's versions to the next one's: random
/// histories under IGNORE NULL UPDATES (late events change the merged
/// values of the versions after them), cut into three updates each folded
/// over what the one before stored; the versions before, less the deleted
/// rows and pre-images, plus the inserted rows and post-images, are the
/// versions after — and the last update's are those of one update folding
/// every event. (Rows as the published table shows them: without the
/// sequence of the event a version stands for.)
#[test]
fn change_feeds_under_partial_updates_take_each_update_to_the_next() {
    let spec = scd2(vec![1], Some(PartialUpdates::IgnoreNulls(vec![1])));
    let rows = |out: &[RecordBatch], kinds: &[i8]| -> Vec<String> {
        let mut published: Vec<String> = rows(out, kinds)
            .into_iter()
            .map(|r| match r.find(" cdc_seq=") {
                Some(at) => r[..at].to_string(),
                None => r,
            })
            .collect();
        published.sort();
        published
    };
    let values = ["a", "b"];
    for seed in 0..300 {
        let mut below = below(seed);
        let mut events = Vec::new();
        for id in 1..=3 {
            let mut seqs: Vec<i64> = (0..below(7)).map(|_| 1 + below(12) as i64).collect();
            seqs.sort_unstable();
            seqs.dedup();
            for seq in seqs {
                events.push(match below(5) {
                    0 => del(id, seq),
                    1 | 2 => up_null(id, seq),
                    v => up(id, values[v as usize - 3], seq),
                });
            }
        }
        let updates: Vec<usize> = events.iter().map(|_| below(3) as usize).collect();
        let (all, _) = fold(&spec, &events, None, 1000).expect("fold");
        let mut stored: Vec<Ev> = Vec::new();
        let mut visible: Vec<String> = Vec::new();
        for update in 0..3 {
            let mut input = stored.clone();
            input.extend(
                events
                    .iter()
                    .zip(&updates)
                    .filter(|(_, &u)| u == update)
                    .map(|(e, _)| *e),
            );
            let (out, _) = fold(&spec, &input, None, 1 + below(5) as usize)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            let mut expected = visible.clone();
            for gone in rows(&out, &[CHANGE_DELETE, CHANGE_PREIMAGE]) {
                let at = expected.iter().position(|v| *v == gone);
                let at = at.unwrap_or_else(|| {
                    panic!("seed {seed}, update {update}: {gone} was not a version: {visible:?}")
                });
                expected.remove(at);
            }
            expected.extend(rows(&out, &[CHANGE_INSERT, CHANGE_POSTIMAGE]));
            expected.sort();
            visible = rows(&out, &[VERSION]);
            assert_eq!(visible, expected, "seed {seed}, update {update}");
            stored = read_back(&out, false);
        }
        assert_eq!(visible, rows(&all, &[VERSION]), "seed {seed}");
    }
}

/// Hidden rows written by DML: events, then erasure marks.
fn dml_rows(spec: &FoldSpec, events: &[Ev]) -> (Vec<String>, Vec<String>) {
    every_split(events.len(), |split| {
        let (out, _) = fold(spec, events, None, split).expect("fold");
        (
            rows(&out, &[STORED_DML_UPSERT_EVENT, STORED_DML_DELETE_EVENT]),
            rows(&out, &[STORED_ERASED_AT, STORED_ERASED_THROUGH]),
        )
    })
}

/// A DML statement's edited history replaces the stored one (SPEC §4.2):
///
/// | stored          | statement      | after                                 |
/// |-----------------|----------------|---------------------------------------|
/// | a@1 b@3 del@5   | a@1 x@3 del@5  | [1,3) a, [3,5) x; b→x an update        |
/// | (events kept as flow-written) | | the statement's, DML-written; no marks |
#[test]
fn a_dml_history_replaces_the_stored_one() {
    let spec = scd2(vec![1], None);
    let events = [
        up(1, "a", 1).stored(),
        up(1, "b", 3).stored(),
        del(1, 5).stored(),
        up(1, "a", 1).dml(),
        up(1, "x", 3).dml(),
        del(1, 5).dml(),
    ];
    let (versions, flow_events, changes, counts) = run(&spec, &events);
    assert_eq!(
        versions,
        [
            "id=1 v=a start_at=1 end_at=3 cdc_seq=1",
            "id=1 v=x start_at=3 end_at=5 cdc_seq=3",
        ]
    );
    assert!(flow_events.is_empty(), "{flow_events:?}");
    assert_eq!(
        changes,
        [
            "id=1 v=b start_at=3 end_at=5 cdc_seq=3",
            "id=1 v=x start_at=3 end_at=5 cdc_seq=3",
        ]
    );
    let (dml, marks) = dml_rows(&spec, &events);
    assert_eq!(
        dml,
        [
            "id=1 v=NULL start_at=NULL end_at=NULL cdc_seq=5",
            "id=1 v=a start_at=NULL end_at=NULL cdc_seq=1",
            "id=1 v=x start_at=NULL end_at=NULL cdc_seq=3",
        ]
    );
    assert!(marks.is_empty(), "{marks:?}");
    assert_eq!(
        (counts.upserted, counts.deleted, counts.input_rows),
        (1, 0, 0)
    );
}

/// A stored event the statement's history does not have (an absorbed
/// upsert, a deleted version's start) leaves an erased-at mark; a key left
/// without versions is erased through its greatest sequence, its versions
/// deleted in the change feed.
#[test]
fn removed_events_leave_erasure_marks() {
    let spec = scd2(vec![1], None);
    let (_, marks) = dml_rows(
        &spec,
        &[
            up(1, "a", 1).stored(),
            up(1, "a", 2).stored(),
            up(1, "z", 1).dml(),
        ],
    );
    assert_eq!(marks, ["id=1 v=a start_at=NULL end_at=NULL cdc_seq=2"]);

    let events = [
        up(1, "a", 1).stored(),
        del(1, 3).stored(),
        up(1, "b", 5).stored(),
        mark(1, STORED_ERASED_AT, 4),
        del(1, 5).dml(),
    ];
    let (versions, _, changes, counts) = run(&spec, &events);
    assert!(versions.is_empty(), "{versions:?}");
    assert_eq!(
        changes,
        [
            "id=1 v=a start_at=1 end_at=3 cdc_seq=1",
            "id=1 v=b start_at=5 end_at=NULL cdc_seq=5",
        ]
    );
    assert_eq!(counts.deleted, 2);
    let (dml, marks) = dml_rows(&spec, &events);
    assert!(dml.is_empty(), "{dml:?}");
    assert_eq!(marks, ["id=1 v=b start_at=NULL end_at=NULL cdc_seq=5"]);
}

/// After DML, a new event at a DML-written sequence or an erased one is a
/// replay of what was corrected and dropped as late; others fold as usual.
/// After an erasure, every new event at or before its mark is dropped.
#[test]
fn replays_of_corrected_events_are_dropped() {
    let spec = scd2(vec![1], None);
    let (versions, _, _, counts) = run(
        &spec,
        &[
            up(1, "z", 1).by_dml(),
            mark(1, STORED_ERASED_AT, 2),
            up(1, "a", 1),
            up(1, "a", 2),
            up(1, "c", 4),
        ],
    );
    assert_eq!(
        versions,
        [
            "id=1 v=c start_at=4 end_at=NULL cdc_seq=4",
            "id=1 v=z start_at=1 end_at=4 cdc_seq=1",
        ]
    );
    assert_eq!(
        (counts.input_rows, counts.late, counts.events_added),
        (3, 2, 1)
    );
    let (dml, marks) = dml_rows(
        &spec,
        &[
            up(1, "z", 1).by_dml(),
            mark(1, STORED_ERASED_AT, 2),
            up(1, "c", 4),
        ],
    );
    assert_eq!(dml, ["id=1 v=z start_at=NULL end_at=NULL cdc_seq=1"]);
    assert_eq!(marks.len(), 1, "{marks:?}");

    let (versions, _, _, counts) = run(
        &spec,
        &[
            mark(1, STORED_ERASED_THROUGH, 5),
            up(1, "x", 3),
            up(1, "b", 5),
            up(1, "y", 6),
        ],
    );
    assert_eq!(versions, ["id=1 v=y start_at=6 end_at=NULL cdc_seq=6"]);
    assert_eq!((counts.late, counts.events_added), (2, 1));
}

/// Emitting visible rows only (a fold read as rows), the fold emits exactly
/// the versions of the full output, with the same counts: no hidden events,
/// marks or change rows.
#[test]
fn visible_only_emits_the_versions() {
    let events = [
        up(1, "a", 1).stored(),
        up(1, "b", 3),
        up_null(1, 5),
        del(1, 4),
        up(2, "x", 2),
        del(2, 6),
        up(3, "y", 1).stored(),
        up(3, "y", 2),
    ];
    for partial in [None, Some(PartialUpdates::IgnoreNulls(vec![1]))] {
        let full = scd2(vec![1], partial.clone());
        let (versions, _, _, counts) = run(&full, &events);
        let visible = FoldSpec {
            visible_only: true,
            ..full
        };
        let every_kind: Vec<i8> = (0..=20).collect();
        let got = every_split(events.len(), |split| {
            let (out, counts) = fold(&visible, &events, None, split).expect("fold");
            (rows(&out, &every_kind), counts)
        });
        assert_eq!(got, (versions, counts), "partial: {partial:?}");
    }
}

/// An output batch's rows are ordered by the files they go to (versions,
/// hidden rows, change rows), each kind in the order it was emitted, with
/// every attribute of a row moved along.
#[test]
fn output_rows_are_ordered_by_file() {
    let mut emit = super::Emit::default();
    emit.event(0, STORED_UPSERT_EVENT);
    emit.change(1, 1, None, CHANGE_INSERT);
    emit.version(2, 2, Some(3));
    emit.event(3, STORED_DELETE_EVENT);
    emit.version(4, 4, None);
    emit.change(5, 6, Some(7), CHANGE_DELETE);
    emit.by_file();
    assert_eq!(emit.rows, vec![2, 4, 0, 3, 1, 5]);
    assert_eq!(
        emit.kind,
        vec![
            VERSION,
            VERSION,
            STORED_UPSERT_EVENT,
            STORED_DELETE_EVENT,
            CHANGE_INSERT,
            CHANGE_DELETE
        ]
    );
    assert_eq!(
        emit.start,
        vec![Some(2), Some(4), None, None, Some(1), Some(6)]
    );
    assert_eq!(emit.end, vec![Some(3), None, None, None, None, Some(7)]);
    assert_eq!(emit.written, vec![2, 4, 0, 3, 1, 5]);
    // already in order: unchanged
    let before = (emit.rows.clone(), emit.kind.clone());
    emit.by_file();
    assert_eq!((emit.rows, emit.kind), before);
}
