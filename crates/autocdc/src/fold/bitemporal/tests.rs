//! The BITEMPORAL fold on a hand-made history, every split of the input.

use super::super::columns::{Kind, CHANGE_DELETE, STORED_ERASED_THROUGH, STORED_UPSERT_EVENT};
use super::super::test_support::{del, every_split, fold, mark, rows, spec, up};
use super::super::ScdType;

/// Business time 10: `a`, known at 10, corrected to `b` at 20; business
/// time 30: `c`, known at 25. The beliefs: at 10 `a` from 10 on; at 20 `b`
/// from 10 on; from 25 `b` over [10, 30) and `c` from 30 on.
#[test]
fn rows_carry_the_system_intervals_they_were_believed_over() {
    let events = [
        up(1, "a", 10).at(10),
        up(1, "b", 10).at(20),
        up(1, "c", 30).at(25),
    ];
    let table = every_split(events.len(), |split| {
        let spec = spec(ScdType::Bitemporal, vec![], None);
        let (out, counts) = fold(&spec, &events, None, split).expect("fold");
        assert_eq!(counts.input_rows, 3);
        // [id, v, __start_at, __end_at, __system_start_at, __system_end_at]
        rows(&out, &[Kind::Upsert as i8])
            .iter()
            .map(|r| r.split(' ').take(6).collect::<Vec<_>>().join(" "))
            .collect::<Vec<String>>()
    });
    assert_eq!(
        table,
        [
            "id=1 v=a start_at=10 end_at=NULL system_start_at=10 system_end_at=20",
            "id=1 v=b start_at=10 end_at=30 system_start_at=25 system_end_at=NULL",
            "id=1 v=b start_at=10 end_at=NULL system_start_at=20 system_end_at=25",
            "id=1 v=c start_at=30 end_at=NULL system_start_at=25 system_end_at=NULL",
        ]
    );
}

/// A DML DELETE erases a key: its rows leave (deletes in the change feed),
/// its events go, and a mark at its greatest sequence stays; later source
/// events at or before the mark are dropped, later ones fold as usual.
#[test]
fn a_dml_delete_erases_the_key() {
    let spec = spec(ScdType::Bitemporal, vec![], None);
    let events = [
        up(1, "a", 10).at(10).stored(),
        up(1, "c", 30).at(25).stored(),
        del(1, 10).at(40).dml(),
    ];
    let (rows_left, hidden, deletes, marks, counts) = every_split(events.len(), |split| {
        let (out, counts) = fold(&spec, &events, None, split).expect("fold");
        (
            rows(&out, &[Kind::Upsert as i8]),
            rows(&out, &[STORED_UPSERT_EVENT]),
            rows(&out, &[CHANGE_DELETE]).len(),
            rows(&out, &[STORED_ERASED_THROUGH]),
            counts,
        )
    });
    assert!(
        rows_left.is_empty() && hidden.is_empty(),
        "{rows_left:?} {hidden:?}"
    );
    assert_eq!((deletes, counts.deleted), (3, 3));
    assert_eq!(marks.len(), 1);
    assert!(marks[0].contains("cdc_seq=30"), "{marks:?}");

    let later = [
        mark(1, STORED_ERASED_THROUGH, 30),
        up(1, "a", 10).at(10),
        up(1, "d", 35).at(50),
    ];
    let (left, counts) = every_split(later.len(), |split| {
        let (out, counts) = fold(&spec, &later, None, split).expect("fold");
        (rows(&out, &[Kind::Upsert as i8]).len(), counts)
    });
    assert_eq!((left, counts.late, counts.events_added), (1, 1, 1));
}
