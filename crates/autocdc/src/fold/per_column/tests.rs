//! Per-column sequencing on hand-made batches: the module's rule table, and
//! every arrival order and split of small histories against one update of
//! all of them in sequence order.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, Int8Array, RecordBatch, TimestampMicrosecondArray,
};
use arrow::compute::{lexsort_to_indices, take_record_batch, SortColumn};
use arrow::datatypes::{DataType, Field, Int64Type, Int8Type, Schema, SchemaRef, TimeUnit};

use super::super::columns::{
    EventLayout, Kind, Origin, SequenceGroup, CHANGE_DELETE, CHANGE_INSERT, CHANGE_POSTIMAGE,
    KIND_COL, ORIGIN_COL, SEQ_COL, WRITTEN_AT_COL,
};
use super::super::kernel::FoldKernel;
use super::super::partial::PartialUpdates;
use super::PerColumnScd1Fold;

/// A row of `(id, a, b)`: an event, or a stored row with its group sequences.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ev {
    id: i64,
    a: Option<i64>,
    b: Option<i64>,
    seq: i64,
    kind: i8,
    stored: bool,
    /// Group sequences (stored rows).
    gs: [Option<i64>; 2],
}

fn up(id: i64, a: Option<i64>, b: Option<i64>, seq: i64) -> Ev {
    Ev {
        id,
        a,
        b,
        seq,
        kind: Kind::Upsert as i8,
        stored: false,
        gs: [None, None],
    }
}

fn del(id: i64, seq: i64) -> Ev {
    Ev {
        kind: Kind::Delete as i8,
        ..up(id, None, None, seq)
    }
}

/// Columns `a` and `b` apart, or together as one group `ab`.
fn layout(together: bool) -> EventLayout {
    let sequence_groups = if together {
        vec![SequenceGroup {
            name: "ab".into(),
            members: vec![1, 2],
        }]
    } else {
        vec![
            SequenceGroup {
                name: "a".into(),
                members: vec![1],
            },
            SequenceGroup {
                name: "b".into(),
                members: vec![2],
            },
        ]
    };
    EventLayout {
        target_columns: vec!["id".into(), "a".into(), "b".into()],
        key_indices: vec![0],
        system_seq: false,
        update_list: false,
        sequence_groups,
        group_sequences: true,
    }
}

fn schema(layout: &EventLayout) -> SchemaRef {
    let mut fields = vec![
        Field::new("id", DataType::Int64, true),
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Int64, true),
        Field::new(SEQ_COL, DataType::Int64, true),
        Field::new(KIND_COL, DataType::Int8, false),
        Field::new(
            WRITTEN_AT_COL,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new(ORIGIN_COL, DataType::Int8, false),
    ];
    for g in &layout.sequence_groups {
        fields.push(Field::new(g.state_column(), DataType::Int64, true));
    }
    Arc::new(Schema::new(fields))
}

/// `events` as one batch sorted by `(id, seq, origin)`.
fn batch(layout: &EventLayout, events: &[Ev]) -> RecordBatch {
    let int = |f: &dyn Fn(&Ev) -> Option<i64>| -> ArrayRef {
        Arc::new(Int64Array::from_iter(events.iter().map(f)))
    };
    let mut columns: Vec<ArrayRef> = vec![
        int(&|e| Some(e.id)),
        int(&|e| e.a),
        int(&|e| e.b),
        int(&|e| Some(e.seq)),
        Arc::new(Int8Array::from_iter_values(events.iter().map(|e| e.kind))),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(events.iter().map(|e| e.seq))
                .with_timezone("UTC"),
        ),
        Arc::new(Int8Array::from_iter_values(events.iter().map(|e| {
            if e.stored {
                Origin::Stored as i8
            } else {
                Origin::New as i8
            }
        }))),
    ];
    for g in 0..layout.sequence_groups.len() {
        columns.push(int(&|e| e.gs[g]));
    }
    let batch = RecordBatch::try_new(schema(layout), columns).expect("batch");
    let sort: Vec<SortColumn> = [0, 3, 6]
        .iter()
        .map(|&c| SortColumn {
            values: Arc::clone(batch.column(c)),
            options: None,
        })
        .collect();
    let order = lexsort_to_indices(&sort, None).expect("sort");
    take_record_batch(&batch, &order).expect("take")
}

/// One update: the stored rows and the new events folded, IGNORE NULL
/// UPDATES; returns the stored rows after it and the change rows.
fn update(
    layout: &EventLayout,
    stored: &[Ev],
    new: &[Ev],
    split: usize,
) -> (Vec<Ev>, Vec<(i8, Ev)>) {
    let mut rows: Vec<Ev> = stored.to_vec();
    rows.extend_from_slice(new);
    let input = batch(layout, &rows);
    let mut fold = PerColumnScd1Fold::try_new(
        "f",
        layout.clone(),
        Some(PartialUpdates::IgnoreNulls(vec![1, 2])),
        &schema(layout),
    )
    .expect("fold");
    let mut out = Vec::new();
    let n = input.num_rows();
    let cut = split.min(n);
    for part in [input.slice(0, cut), input.slice(cut, n - cut)] {
        out.extend(fold.push(&part).expect("push"));
    }
    out.extend(fold.finish_all().expect("finish"));
    let mut state = Vec::new();
    let mut changes = Vec::new();
    for b in &out {
        let col = |c: usize| b.column(c).as_primitive::<Int64Type>().clone();
        let (id, a, bb, seq) = (col(0), col(1), col(2), col(3));
        let kinds = b.column(4).as_primitive::<Int8Type>();
        let gs: Vec<_> = (6..b.num_columns())
            .map(|c| b.column(c).as_primitive::<Int64Type>().clone())
            .collect();
        for i in 0..b.num_rows() {
            let opt =
                |x: &arrow::array::PrimitiveArray<Int64Type>| x.is_valid(i).then(|| x.value(i));
            let mut g = [None, None];
            for (k, s) in gs.iter().enumerate() {
                g[k] = opt(s);
            }
            let row = Ev {
                id: id.value(i),
                a: opt(&a),
                b: opt(&bb),
                seq: seq.value(i),
                kind: kinds.value(i),
                stored: true,
                gs: g,
            };
            if row.kind == Kind::Upsert as i8 || row.kind == Kind::Delete as i8 {
                state.push(row);
            } else {
                changes.push((row.kind, row));
            }
        }
    }
    state.sort_by_key(|e| e.id);
    // the counts are the rows the change feed shows (SPEC §4)
    let of = |kinds: &[i8]| changes.iter().filter(|(k, _)| kinds.contains(k)).count();
    let counts = fold.counts();
    assert_eq!(
        (counts.upserted, counts.deleted),
        (of(&[CHANGE_INSERT, CHANGE_POSTIMAGE]), of(&[CHANGE_DELETE])),
        "{changes:?}"
    );
    (state, changes)
}

/// The live rows as `(id, a, b, row sequence)`.
fn live(state: &[Ev]) -> Vec<(i64, Option<i64>, Option<i64>, i64)> {
    state
        .iter()
        .filter(|e| e.kind == Kind::Upsert as i8)
        .map(|e| (e.id, e.a, e.b, e.seq))
        .collect()
}

fn stored(id: i64, a: Option<i64>, b: Option<i64>, seq: i64, gs: [Option<i64>; 2]) -> Ev {
    Ev {
        stored: true,
        gs,
        ..up(id, a, b, seq)
    }
}

/// | stored              | new            | live row after     | why                            |
/// |---------------------|----------------|--------------------|--------------------------------|
/// | a=1@3 b=2@5 (R 5)   | b=9@4          | a=1 b=2, R 5       | b@5 is newer: late for b       |
/// | a=1@3 b=2@5 (R 5)   | a=7@4          | a=7 b=2, R 5       | a@3 is older: a late event sets it |
/// | a=1@3 b=2@5 (R 5)   | delete@4       | a=NULL b=2, R 5    | a late delete clears older columns |
/// | a=1@3 b=2@5 (R 5)   | delete@5       | a=NULL b=2, R 5    | b@5 came first: a tie is a conflict, the first applied stays |
/// | a=1@3 b=2@5 (R 5)   | delete@6       | tombstone @6       | newer than every column        |
/// | tombstone @5        | a=7@4          | tombstone @5       | older than the tombstone       |
/// | tombstone @5        | a=7@6          | a=7 b=NULL, R 6    | from nothing                   |
#[test]
fn late_partial_events_set_older_columns() {
    let l = layout(false);
    let base = [stored(1, Some(1), Some(2), 5, [Some(3), Some(5)])];
    let (s, changes) = update(&l, &base, &[up(1, None, Some(9), 4)], usize::MAX);
    assert_eq!(live(&s), [(1, Some(1), Some(2), 5)]);
    assert!(changes.is_empty(), "{changes:?}");
    let (s, changes) = update(&l, &base, &[up(1, Some(7), None, 4)], usize::MAX);
    assert_eq!(live(&s), [(1, Some(7), Some(2), 5)]);
    assert_eq!(s[0].gs, [Some(4), Some(5)]);
    assert_eq!(changes.len(), 2, "pre- and post-image: {changes:?}");
    let (s, _) = update(&l, &base, &[del(1, 4)], usize::MAX);
    assert_eq!(live(&s), [(1, None, Some(2), 5)]);
    let (s, _) = update(&l, &base, &[del(1, 5)], usize::MAX);
    assert_eq!(live(&s), [(1, None, Some(2), 5)]);
    let (s, changes) = update(&l, &base, &[del(1, 6)], usize::MAX);
    assert_eq!(live(&s), []);
    assert_eq!((s[0].kind, s[0].seq), (Kind::Delete as i8, 6));
    assert_eq!(changes.len(), 1);
    let tomb = [Ev {
        kind: Kind::Delete as i8,
        ..stored(1, None, None, 5, [None, None])
    }];
    let (s, _) = update(&l, &tomb, &[up(1, Some(7), None, 4)], usize::MAX);
    assert_eq!(live(&s), []);
    let (s, _) = update(&l, &tomb, &[up(1, Some(7), None, 6)], usize::MAX);
    assert_eq!(live(&s), [(1, Some(7), None, 6)]);
    // b was cleared by the tombstone at 5: a late b@5.5 would set it
    assert_eq!(s[0].gs, [Some(6), Some(5)]);
}

/// Replaying what was applied changes nothing (the stored row comes back
/// as it was, with no change rows).
#[test]
fn replays_change_nothing() {
    let l = layout(false);
    let events = [
        up(1, Some(1), None, 1),
        up(1, None, Some(2), 3),
        del(1, 2),
        up(2, Some(5), Some(5), 4),
        del(3, 9),
    ];
    let (s, _) = update(&l, &[], &events, usize::MAX);
    let (again, changes) = update(&l, &s, &events, 2);
    assert_eq!(again, s);
    assert!(changes.is_empty(), "{changes:?}");
}

/// A group is written whole by the newest event that writes any of its
/// columns.
#[test]
fn a_group_is_set_together() {
    let l = layout(true);
    let (s, _) = update(&l, &[], &[up(1, Some(1), Some(1), 1)], usize::MAX);
    let (s, _) = update(&l, &s, &[up(1, None, Some(2), 3)], usize::MAX);
    assert_eq!(live(&s), [(1, None, Some(2), 3)]);
    let (s, _) = update(&l, &s, &[up(1, Some(9), Some(9), 2)], usize::MAX);
    assert_eq!(live(&s), [(1, None, Some(2), 3)]);
}

/// All permutations of `items`.
fn permutations(items: &[Ev]) -> Vec<Vec<Ev>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, first);
            out.push(p);
        }
    }
    out
}

/// Every arrival order of each history, split into one to three updates
/// anywhere, ends as one update of all its events (in sequence order).
#[test]
fn every_order_and_split_gives_the_same_rows() {
    let histories: [&[Ev]; 4] = [
        &[
            up(1, Some(1), None, 1),
            up(1, None, Some(2), 2),
            up(1, Some(3), None, 3),
            up(1, None, Some(4), 4),
        ],
        &[
            up(1, Some(1), Some(1), 1),
            del(1, 2),
            up(1, None, Some(3), 3),
            up(1, Some(4), None, 4),
        ],
        &[
            up(1, Some(1), Some(1), 2),
            del(1, 3),
            up(1, Some(5), None, 1),
            up(2, None, Some(7), 4),
            del(2, 5),
        ],
        &[
            up(1, None, Some(1), 5),
            del(1, 4),
            up(1, Some(2), None, 3),
            del(1, 1),
            up(1, Some(6), Some(6), 6),
        ],
    ];
    for together in [false, true] {
        let l = layout(together);
        for history in histories {
            let (expected, _) = update(&l, &[], history, usize::MAX);
            for order in permutations(history) {
                for cut1 in 0..=order.len() {
                    for cut2 in cut1..=order.len() {
                        let mut state = Vec::new();
                        for part in [&order[..cut1], &order[cut1..cut2], &order[cut2..]] {
                            state = update(&l, &state, part, 1).0;
                        }
                        assert_eq!(
                            live(&state),
                            live(&expected),
                            "order {order:?}, updates at {cut1} and {cut2}, groups together: {together}"
                        );
                    }
                }
            }
        }
    }
}
