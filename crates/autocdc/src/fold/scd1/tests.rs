//! The SCD 1 fold's rules on hand-made batches, every split of the input.

use super::super::columns::{
    Kind, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE, CHANGE_PREIMAGE,
};
use super::super::test_support::{
    del, every_split, fold, fold_below_stored_watermark, rows, spec, up, up_null, Ev,
};
use super::super::{FoldCounts, ScdType};

const LIVE: i8 = Kind::Upsert as i8;
const TOMBSTONE: i8 = Kind::Delete as i8;

fn scd1() -> super::super::FoldSpec {
    spec(ScdType::Type1, vec![], None)
}

/// Runs `events` in every split; all must agree. Returns the stored rows
/// (live, tombstones), the change rows, and the counts.
fn run(events: &[Ev], watermark: Option<i64>) -> (Vec<String>, Vec<String>, FoldCounts) {
    every_split(events.len(), |split| {
        let (out, counts) = fold(&scd1(), events, watermark, split).expect("fold");
        let changes = [
            CHANGE_INSERT,
            CHANGE_PREIMAGE,
            CHANGE_POSTIMAGE,
            CHANGE_DELETE,
        ];
        (rows(&out, &[LIVE, TOMBSTONE]), rows(&out, &changes), counts)
    })
}

/// | key | events (stored first at equal seq)    | result                    |
/// |-----|---------------------------------------|---------------------------|
/// | 1   | new b@3, stored a@5, new c@7          | c@7; b@3 late             |
/// | 2   | new delete@9                          | tombstone @9              |
/// | 3   | stored x@4, new x@4 (a replay)        | x@4 unchanged, late       |
/// | 4   | new p@1, new q@2, new NULL@6          | NULL@6 (inserted)         |
#[test]
fn the_greatest_sequence_wins_and_late_events_are_dropped() {
    let (state, changes, counts) = run(
        &[
            up(1, "b", 3),
            up(1, "a", 5).stored(),
            up(1, "c", 7),
            del(2, 9),
            up(3, "x", 4).stored(),
            up(3, "x", 4),
            up(4, "p", 1),
            up(4, "q", 2),
            up_null(4, 6),
        ],
        None,
    );
    assert_eq!(
        state,
        [
            "id=1 v=c cdc_seq=7",
            "id=2 v=NULL cdc_seq=9",
            "id=3 v=x cdc_seq=4",
            "id=4 v=NULL cdc_seq=6",
        ]
    );
    // key 1 updated, key 4 inserted; key 2 was never visible, key 3 unchanged
    assert_eq!(
        changes,
        [
            "id=1 v=a cdc_seq=5",
            "id=1 v=c cdc_seq=7",
            "id=4 v=NULL cdc_seq=6",
        ]
    );
    assert_eq!(
        counts,
        FoldCounts {
            input_rows: 7,
            upserted: 2,
            deleted: 0,
            tombstones: 1,
            late: 2,
            duplicates: 0,
            events_added: 0,
        }
    );
}

/// A delete of a live key leaves a tombstone, and a later-arriving older
/// upsert of the key stays dropped.
#[test]
fn deletes_leave_tombstones_that_keep_late_upserts_out() {
    let (state, changes, counts) = run(&[up(1, "a", 2).stored(), del(1, 5), up(1, "z", 4)], None);
    assert_eq!(state, ["id=1 v=NULL cdc_seq=5"]);
    assert_eq!(changes, ["id=1 v=a cdc_seq=2"]);
    assert_eq!(
        (counts.deleted, counts.tombstones, counts.upserted),
        (1, 1, 0)
    );

    let (state, _, counts) = run(&[del(1, 5).stored(), up(1, "z", 4)], None);
    assert_eq!(state, ["id=1 v=NULL cdc_seq=5"]);
    assert_eq!(counts.late, 1);
}

/// A key whose winning sequence is at or below the truncate watermark
/// disappears without a tombstone; newer keys stay.
#[test]
fn truncate_removes_keys_at_or_below_the_watermark() {
    let (state, changes, counts) = run(
        &[
            up(1, "a", 2).stored(),
            up(2, "b", 3),
            up(3, "c", 8).stored(),
            up(4, "d", 9),
        ],
        Some(3),
    );
    assert_eq!(state, ["id=3 v=c cdc_seq=8", "id=4 v=d cdc_seq=9"]);
    assert_eq!(changes, ["id=1 v=a cdc_seq=2", "id=4 v=d cdc_seq=9"]);
    assert_eq!((counts.deleted, counts.upserted), (1, 1));
}

/// | key | events (stored: inserted by DML at the least sequence) | watermark 3 stored | TRUNCATE at 3 now |
/// |-----|------------------------------------------|--------------------|-------------------|
/// | 1   | stored dml@MIN, new late@0               | dml@MIN, 0 dropped | gone (delete)     |
/// | 2   | stored ins@MIN, new new@5                | new@5 (update)     | new@5 (update)    |
/// | 3   | stored x@MIN                             | x@MIN              | gone (delete)     |
///
/// The stored watermark keeps late events out but removes no stored row:
/// the rows below it were written by DML after it (SPEC §4.2).
#[test]
fn only_a_truncate_of_this_update_removes_rows_below_the_watermark() {
    const LEAST: i64 = i64::MIN;
    let events = [
        up(1, "dml", LEAST).stored(),
        up(1, "late", 0),
        up(2, "ins", LEAST).stored(),
        up(2, "new", 5),
        up(3, "x", LEAST).stored(),
    ];
    let changes = [
        CHANGE_INSERT,
        CHANGE_PREIMAGE,
        CHANGE_POSTIMAGE,
        CHANGE_DELETE,
    ];
    let (state, changed, counts) = every_split(events.len(), |split| {
        let (out, counts) = fold_below_stored_watermark(&scd1(), &events, 3, split).expect("fold");
        (rows(&out, &[LIVE, TOMBSTONE]), rows(&out, &changes), counts)
    });
    let least = format!("cdc_seq={LEAST}");
    assert_eq!(
        state,
        [
            format!("id=1 v=dml {least}"),
            "id=2 v=new cdc_seq=5".to_string(),
            format!("id=3 v=x {least}"),
        ]
    );
    assert_eq!(
        changed,
        [
            format!("id=2 v=ins {least}"),
            "id=2 v=new cdc_seq=5".to_string()
        ]
    );
    assert_eq!((counts.deleted, counts.upserted), (0, 1));

    let (state, changed, counts) = run(&events, Some(3));
    assert_eq!(state, ["id=2 v=new cdc_seq=5"]);
    assert_eq!(
        changed,
        [
            format!("id=1 v=dml {least}"),
            format!("id=2 v=ins {least}"),
            "id=2 v=new cdc_seq=5".to_string(),
            format!("id=3 v=x {least}"),
        ]
    );
    assert_eq!((counts.deleted, counts.upserted), (2, 1));
}

/// Two new events of one key at one sequence: the same event is a
/// duplicate; different ones fail the fold, naming flow, key and sequence.
#[test]
fn equal_sequences_are_duplicates_or_conflicts() {
    let (state, _, counts) = run(&[up(1, "a", 1), up(1, "a", 1)], None);
    assert_eq!(state, ["id=1 v=a cdc_seq=1"]);
    assert_eq!(counts.duplicates, 1);

    let err = fold(&scd1(), &[up(1, "a", 1), up(1, "b", 1)], None, 2)
        .expect_err("a conflict")
        .to_string();
    assert!(
        err.contains("flow 'f': conflicting events for key (id=1) at SEQUENCE BY value 1"),
        "{err}"
    );
}

/// Below the key's stored sequence, events that differ from each other
/// are late, not a conflict (SCD 1 keeps no events to conflict with), and
/// copies of one are late too, as at the stored sequence.
#[test]
fn late_events_never_conflict() {
    let (state, changes, counts) = run(
        &[
            up(1, "x", 3),
            up(1, "y", 3),
            up(1, "x", 3),
            up(1, "a", 5).stored(),
            up(2, "p", 1),
            del(2, 1),
            del(2, 4).stored(),
        ],
        None,
    );
    assert_eq!(state, ["id=1 v=a cdc_seq=5", "id=2 v=NULL cdc_seq=4"]);
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!((counts.late, counts.duplicates), (5, 0));
    // above the stored sequence they still conflict
    let err = fold(
        &scd1(),
        &[up(1, "a", 5).stored(), up(1, "x", 6), up(1, "y", 6)],
        None,
        3,
    )
    .expect_err("a conflict")
    .to_string();
    assert!(
        err.contains("conflicting events for key (id=1) at SEQUENCE BY value 6"),
        "{err}"
    );
}

/// NULL keys and sequences are refused, naming the flow and the column.
#[test]
fn null_keys_and_sequences_are_errors() {
    let input = super::super::test_support::batch(&scd1().layout, &[up(1, "a", 1)]);
    let mut kernel = scd1().kernel(&input.schema()).expect("kernel");
    let nulls = arrow::compute::nullif(
        input.column(0),
        &arrow::array::BooleanArray::from(vec![true]),
    )
    .expect("nullif");
    let mut columns = input.columns().to_vec();
    columns[0] = nulls;
    let null_key = arrow::array::RecordBatch::try_new(input.schema(), columns).expect("batch");
    let err = kernel.push(&null_key).expect_err("a NULL key").to_string();
    assert!(err.contains("flow 'f': KEYS column 'id' is NULL"), "{err}");
}
