//! The SCD 2 fold's rules on hand-made batches, every split of the input.

use super::super::columns::{
    Kind, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE, STORED_DELETE_EVENT,
    STORED_UPSERT_EVENT,
};
use super::super::columns::{
    STORED_DML_DELETE_EVENT, STORED_DML_UPSERT_EVENT, STORED_ERASED_AT, STORED_ERASED_THROUGH,
};
use super::super::test_support::{del, every_split, fold, mark, rows, spec, up, up_null, Ev};
use super::super::{FoldCounts, FoldSpec, PartialUpdates, ScdType};

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
    // every event is kept, hidden, with its own values
    assert_eq!(
        events,
        [
            "id=1 v=NULL start_at=NULL end_at=NULL cdc_seq=5",
            "id=1 v=a start_at=NULL end_at=NULL cdc_seq=1",
            "id=1 v=a start_at=NULL end_at=NULL cdc_seq=2",
            "id=1 v=b start_at=NULL end_at=NULL cdc_seq=3",
            "id=1 v=c start_at=NULL end_at=NULL cdc_seq=7",
        ]
    );
    // a new key: every version is an insert
    assert_eq!(changes, versions);
    assert_eq!(
        counts,
        FoldCounts {
            input_rows: 5,
            upserted: 4,
            deleted: 1,
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
    assert!(
        events.contains(&"id=1 v=NULL start_at=NULL end_at=NULL cdc_seq=2".to_string()),
        "{events:?}"
    );
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
