//! Every kernel over keys-only input: events whose only target columns are
//! the keys, and SCD 2 flows that track no column. The row format of an
//! empty column set must still give one (equal) row per input row, so these
//! inputs fold like any other instead of panicking.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Int32Array, Int64Array, Int8Array, ListBuilder, RecordBatch,
    StringBuilder, TimestampMicrosecondArray,
};
use arrow::compute::{lexsort_to_indices, take_record_batch, SortColumn};
use arrow::datatypes::{
    DataType, Field, Int32Type, Int64Type, Int8Type, Schema, SchemaRef, TimeUnit,
};
use datafusion::common::ScalarValue;

use super::columns::{
    EventLayout, Kind, Origin, CHANGE_INSERT, KIND_COL, ORIGIN_COL, SEQ_COL, WRITTEN_AT_COL,
};
use super::snapshot_diff::{SnapshotDiff, SIDE_COL, SIDE_LIVE, SIDE_SNAPSHOT};
use super::snapshot_diff_indexed::IndexedSnapshotDiff;
use super::test_support::fold_batch;
use super::ScdType;
use super::{FoldSpec, PartialUpdates};

/// (key a, key b, seq, kind, origin)
type Event = (i64, i64, i64, Kind, Origin);

/// Keys `(a, b)`, no value column; BITEMPORAL events carry a system
/// sequence equal to the sequence, COLUMNS TO UPDATE events an empty list.
fn layout(system_seq: bool, update_list: bool) -> EventLayout {
    EventLayout {
        target_columns: vec!["a".into(), "b".into()],
        key_indices: vec![0, 1],
        system_seq,
        update_list,
        sequence_groups: Vec::new(),
        group_sequences: false,
    }
}

fn schema(layout: &EventLayout) -> SchemaRef {
    let mut fields = vec![
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
    if layout.system_seq {
        fields.push(Field::new("__cdc_system_seq", DataType::Int64, true));
    }
    if layout.update_list {
        fields.push(Field::new(
            "__cdc_columns_to_update",
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            true,
        ));
    }
    Arc::new(Schema::new(fields))
}

/// `events` as one batch sorted by `(keys, seq, origin)`, as the exec feeds it.
fn events(layout: &EventLayout, events: &[Event]) -> RecordBatch {
    let seqs = Int64Array::from_iter_values(events.iter().map(|e| e.2));
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.0))),
        Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.1))),
        Arc::new(seqs.clone()),
        Arc::new(Int8Array::from_iter_values(
            events.iter().map(|e| e.3 as i8),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(events.iter().map(|_| 0))
                .with_timezone("UTC"),
        ),
        Arc::new(Int8Array::from_iter_values(
            events.iter().map(|e| e.4 as i8),
        )),
    ];
    if layout.system_seq {
        columns.push(Arc::new(seqs));
    }
    if layout.update_list {
        let mut lists = ListBuilder::new(StringBuilder::new());
        for _ in events {
            lists.append(true);
        }
        columns.push(Arc::new(lists.finish()));
    }
    let batch = RecordBatch::try_new(schema(layout), columns).expect("event batch");
    let order: Vec<SortColumn> = [0, 1, 2, 5]
        .iter()
        .map(|&c| SortColumn {
            values: Arc::clone(batch.column(c)),
            options: None,
        })
        .collect();
    let indices = lexsort_to_indices(&order, None).expect("sort");
    take_record_batch(&batch, &indices).expect("take")
}

/// Two keys: (1, 1) upserted twice then a replay, (2, 7) upserted and deleted.
fn feed() -> Vec<Event> {
    vec![
        (1, 1, 5, Kind::Upsert, Origin::New),
        (1, 1, 10, Kind::Upsert, Origin::New),
        (1, 1, 10, Kind::Upsert, Origin::New),
        (2, 7, 3, Kind::Upsert, Origin::New),
        (2, 7, 4, Kind::Delete, Origin::New),
    ]
}

fn spec(stored_as: ScdType, layout: EventLayout, partial: Option<PartialUpdates>) -> FoldSpec {
    FoldSpec {
        flow: "f".into(),
        layout,
        stored_as,
        tracked: vec![],
        new_wins_ties: false,
        partial,
        indexed_fold: false,
        indexed_fold_max_bytes: 0,
        visible_only: false,
        late_through: None,
    }
}

/// Run `spec`'s kernel over the feed, split into batches of `split` rows.
fn fold(spec: &FoldSpec, split: usize) -> Vec<RecordBatch> {
    let input = events(&spec.layout, &feed());
    fold_batch(spec, &input, None, split).expect("fold").0
}

/// `(a, b, columns at positions 2.., kind)` of each output row of `kind`.
fn rows_of_kind(batches: &[RecordBatch], kind_col: usize, kinds: &[i8]) -> Vec<Vec<Option<i64>>> {
    let mut rows = Vec::new();
    for batch in batches {
        let kind = batch.column(kind_col).as_primitive::<Int8Type>();
        for r in 0..batch.num_rows() {
            if kind.is_null(r) || !kinds.contains(&kind.value(r)) {
                continue;
            }
            let row = (0..kind_col)
                .map(|c| {
                    let col = batch.column(c).as_primitive::<Int64Type>();
                    col.is_valid(r).then(|| col.value(r))
                })
                .collect();
            rows.push(row);
        }
    }
    rows.sort();
    rows
}

#[test]
fn scd1_keys_only() {
    for partial in [None, Some(PartialUpdates::IgnoreNulls(vec![]))] {
        for split in [1, 2, 5] {
            let spec = spec(ScdType::Type1, layout(false, false), partial.clone());
            let out = fold(&spec, split);
            // live rows: [a, b, seq]; the deleted key leaves a tombstone
            let live = rows_of_kind(&out, 3, &[Kind::Upsert as i8]);
            assert_eq!(live, vec![vec![Some(1), Some(1), Some(10)]], "{partial:?}");
            let tombstones = rows_of_kind(&out, 3, &[Kind::Delete as i8]);
            assert_eq!(tombstones, vec![vec![Some(2), Some(7), Some(4)]]);
        }
    }
}

#[test]
fn scd1_columns_to_update_keys_only() {
    let spec = spec(
        ScdType::Type1,
        layout(false, true),
        Some(PartialUpdates::ColumnsToUpdate),
    );
    for split in [1, 3, 5] {
        let out = fold(&spec, split);
        let live = rows_of_kind(&out, 3, &[Kind::Upsert as i8]);
        assert_eq!(live, vec![vec![Some(1), Some(1), Some(10)]]);
    }
}

#[test]
fn scd1_indexed_keys_only() {
    let layout = layout(false, false);
    let input = events(&layout, &feed());
    let mut spec = spec(ScdType::Type1, layout, None);
    spec.indexed_fold = true;
    assert_eq!(
        spec.engine(&input.schema()),
        crate::fold::FoldEngine::Indexed
    );
    let mut kernel = spec.indexed_kernel(&input.schema()).expect("kernel");
    kernel.push(&input).expect("push");
    kernel.finish(&mut |_| true).expect("finish");
    let mut out = Vec::new();
    while let Some(batch) = kernel.next_output(2).expect("output") {
        out.push(batch);
    }
    let live = rows_of_kind(&out, 3, &[Kind::Upsert as i8]);
    assert_eq!(live, vec![vec![Some(1), Some(1), Some(10)]]);
}

/// SCD 2 with no tracked column: every upsert continues the current
/// version, so key (1, 1) has one version [5, NULL); key (2, 7) one closed
/// by its delete, [3, 4).
#[test]
fn scd2_no_tracked_column() {
    let partials = [
        None,
        Some(PartialUpdates::IgnoreNulls(vec![])),
        Some(PartialUpdates::ColumnsToUpdate),
    ];
    for partial in partials {
        let list = matches!(partial, Some(PartialUpdates::ColumnsToUpdate));
        for split in [1, 2, 5] {
            let spec = spec(ScdType::Type2, layout(false, list), partial.clone());
            let out = fold(&spec, split);
            // [a, b, __start_at, __end_at, __cdc_seq], kind at 5
            let versions = rows_of_kind(&out, 5, &[Kind::Upsert as i8]);
            assert_eq!(
                versions,
                vec![
                    vec![Some(1), Some(1), Some(5), None, Some(10)],
                    vec![Some(2), Some(7), Some(3), Some(4), Some(3)],
                ],
                "{partial:?}, batches of {split}"
            );
            let inserted = rows_of_kind(&out, 5, &[CHANGE_INSERT]);
            assert_eq!(inserted, versions);
        }
    }
}

/// BITEMPORAL over keys only (system time = business time here): key
/// (1, 1) is one row believed since 5; key (2, 7) was believed open over
/// system time [3, 4) and closed at 4 from then on.
#[test]
fn bitemporal_keys_only() {
    for split in [1, 2, 5] {
        let spec = spec(ScdType::Bitemporal, layout(true, false), None);
        let out = fold(&spec, split);
        let kind_col = out[0].schema().index_of(KIND_COL).expect("kind column");
        // [a, b, __start_at, __end_at, __system_start_at, __system_end_at]
        let rows: Vec<Vec<Option<i64>>> = rows_of_kind(&out, kind_col, &[Kind::Upsert as i8])
            .into_iter()
            .map(|r| r[..6].to_vec())
            .collect();
        assert_eq!(
            rows,
            vec![
                vec![Some(1), Some(1), Some(5), None, Some(5), None],
                vec![Some(2), Some(7), Some(3), None, Some(3), Some(4)],
                vec![Some(2), Some(7), Some(3), Some(4), Some(4), None],
            ],
            "batches of {split}"
        );
    }
}

fn diff_input(rows: &[(i32, i32, i8)]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Int32, true),
        Field::new(SIDE_COL, DataType::Int8, false),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Int8Array::from_iter_values(rows.iter().map(|r| r.2))),
        ],
    )
    .expect("diff input")
}

/// Keys `(a, b)` of 10 bytes in the row format (the indexed diff takes at
/// most 16). Live keys (1, 1) and (2, 2); the snapshot holds (2, 2) and (3, 3): one
/// DELETE and one UPSERT, the kept key unchanged (no value to differ).
fn diff_rows() -> Vec<(i32, i32, i8)> {
    vec![
        (1, 1, SIDE_LIVE),
        (2, 2, SIDE_LIVE),
        (2, 2, SIDE_SNAPSHOT),
        (3, 3, SIDE_SNAPSHOT),
    ]
}

fn diff_events(batches: &[RecordBatch]) -> Vec<(i32, i8)> {
    let mut out = Vec::new();
    for batch in batches {
        let a = batch.column(0).as_primitive::<Int32Type>();
        let kind = batch
            .column_by_name(KIND_COL)
            .expect("kind")
            .as_primitive::<Int8Type>();
        for r in 0..batch.num_rows() {
            out.push((a.value(r), kind.value(r)));
        }
    }
    out.sort();
    out
}

#[test]
fn snapshot_diffs_keys_only() {
    let expected = vec![(1, Kind::Delete as i8), (3, Kind::Upsert as i8)];
    let input = diff_input(&diff_rows());
    let version = ScalarValue::Int64(Some(9));
    let written_at = ScalarValue::TimestampMicrosecond(Some(0), Some("UTC".into()));

    for split in [1, 2, 4] {
        let mut diff = SnapshotDiff::try_new(
            "f",
            vec![0, 1],
            version.clone(),
            written_at.clone(),
            &input.schema(),
        )
        .expect("diff");
        let mut out = Vec::new();
        let mut offset = 0;
        while offset < input.num_rows() {
            let len = split.min(input.num_rows() - offset);
            out.extend(diff.push(&input.slice(offset, len)).expect("push"));
            offset += len;
        }
        out.extend(diff.finish().expect("finish"));
        assert_eq!(diff_events(&out), expected, "batches of {split}");
    }

    let mut indexed =
        IndexedSnapshotDiff::try_new("f", vec![0, 1], version, written_at, &input.schema())
            .expect("indexed diff");
    indexed.push(&input).expect("push");
    indexed.finish(&mut |_| true).expect("finish");
    let mut out = Vec::new();
    while let Some(batch) = indexed.next_output(3).expect("output") {
        out.push(batch);
    }
    assert_eq!(diff_events(&out), expected);
}
