//! Hand-made event batches for the kernels' unit tests: a target `(id, v)`
//! keyed by `id`, INT64 sequences, events sorted as the exec feeds them.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, Int8Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow::compute::{lexsort_to_indices, take_record_batch, SortColumn};
use arrow::datatypes::{DataType, Field, Int8Type, Schema, TimeUnit};
use arrow::util::display::array_value_to_string;
use datafusion::common::Result;

use super::columns::{EventLayout, Kind, Origin, KIND_COL, ORIGIN_COL, SEQ_COL, WRITTEN_AT_COL};
use super::{FoldCounts, FoldSpec, PartialUpdates, ScdType};

/// A seeded pseudo-random source: each call gives a number below its
/// argument (a linear congruential generator's high bits; tests only).
pub fn below(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed;
    move |m| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % m
    }
}

/// One event (or stored row read back as one).
#[derive(Debug, Clone, Copy)]
pub struct Ev {
    pub id: i64,
    pub v: Option<&'static str>,
    pub seq: i64,
    pub kind: Kind,
    pub origin: Origin,
    /// System sequence (BITEMPORAL only).
    pub system: i64,
    /// Stored code of an erasure mark (instead of `kind`).
    pub mark: Option<i8>,
}

/// A new UPSERT of `id` to `v` at `seq`.
pub fn up(id: i64, v: &'static str, seq: i64) -> Ev {
    Ev {
        id,
        v: Some(v),
        seq,
        kind: Kind::Upsert,
        origin: Origin::New,
        system: seq,
        mark: None,
    }
}

/// An erasure mark of `id` with stored code `code` at `seq`, written by DML.
pub fn mark(id: i64, code: i8, seq: i64) -> Ev {
    Ev {
        mark: Some(code),
        origin: Origin::StoredByDml,
        ..del(id, seq)
    }
}

/// A new UPSERT of `id` with a NULL `v`.
pub fn up_null(id: i64, seq: i64) -> Ev {
    Ev {
        v: None,
        ..up(id, "", seq)
    }
}

/// A new DELETE of `id` at `seq`.
pub fn del(id: i64, seq: i64) -> Ev {
    Ev {
        v: None,
        kind: Kind::Delete,
        ..up(id, "", seq)
    }
}

impl Ev {
    /// The same, read back from the target.
    pub fn stored(self) -> Self {
        Self {
            origin: Origin::Stored,
            ..self
        }
    }

    /// The same, read back from the version that implies it.
    pub fn implied(self) -> Self {
        Self {
            origin: Origin::Implied,
            ..self
        }
    }

    /// The same, read back as written by a DML statement.
    pub fn by_dml(self) -> Self {
        Self {
            origin: Origin::StoredByDml,
            ..self
        }
    }

    /// The same, in a DML statement's edited history.
    pub fn dml(self) -> Self {
        Self {
            origin: Origin::Dml,
            ..self
        }
    }

    /// The same, known at system time `system` (BITEMPORAL).
    pub fn at(self, system: i64) -> Self {
        Self { system, ..self }
    }
}

/// Target `(id, v)` keyed by `id`.
pub fn layout(system_seq: bool) -> EventLayout {
    EventLayout {
        target_columns: vec!["id".into(), "v".into()],
        key_indices: vec![0],
        system_seq,
        update_list: false,
        sequence_groups: Vec::new(),
        group_sequences: false,
    }
}

/// A fold spec over [`layout`].
pub fn spec(stored_as: ScdType, tracked: Vec<usize>, partial: Option<PartialUpdates>) -> FoldSpec {
    FoldSpec {
        flow: "f".into(),
        layout: layout(stored_as == ScdType::Bitemporal),
        stored_as,
        tracked,
        new_wins_ties: false,
        partial,
        indexed_fold: false,
        indexed_fold_max_bytes: 0,
        visible_only: false,
        late_through: None,
    }
}

/// `events` as one batch sorted by `(id, seq, origin)`.
pub fn batch(layout: &EventLayout, events: &[Ev]) -> RecordBatch {
    let mut fields = vec![
        Field::new("id", DataType::Int64, true),
        Field::new("v", DataType::Utf8, true),
        Field::new(SEQ_COL, DataType::Int64, true),
        Field::new(KIND_COL, DataType::Int8, false),
        Field::new(
            WRITTEN_AT_COL,
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new(ORIGIN_COL, DataType::Int8, false),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.id))),
        Arc::new(StringArray::from_iter(events.iter().map(|e| e.v))),
        Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.seq))),
        Arc::new(Int8Array::from_iter_values(
            events.iter().map(|e| e.mark.unwrap_or(e.kind as i8)),
        )),
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(events.iter().map(|_| 0))
                .with_timezone("UTC"),
        ),
        Arc::new(Int8Array::from_iter_values(
            events.iter().map(|e| e.origin as i8),
        )),
    ];
    if layout.system_seq {
        fields.push(Field::new("__cdc_system_seq", DataType::Int64, true));
        columns.push(Arc::new(Int64Array::from_iter_values(
            events.iter().map(|e| e.system),
        )));
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("event batch");
    let order: Vec<SortColumn> = [0, 2, 5]
        .iter()
        .map(|&c| SortColumn {
            values: Arc::clone(batch.column(c)),
            options: None,
        })
        .collect();
    let indices = lexsort_to_indices(&order, None).expect("sort");
    take_record_batch(&batch, &indices).expect("take")
}

/// Fold `events` with `spec`'s kernel, fed `split` rows at a time, after
/// observing the TRUNCATE `watermark` (SCD 1).
pub fn fold(
    spec: &FoldSpec,
    events: &[Ev],
    watermark: Option<i64>,
    split: usize,
) -> Result<(Vec<RecordBatch>, FoldCounts)> {
    fold_batch(spec, &batch(&spec.layout, events), watermark, split)
}

/// [`fold`] after observing the stored truncate watermark `stored` (earlier
/// updates' TRUNCATEs) instead of a TRUNCATE of this update.
pub fn fold_below_stored_watermark(
    spec: &FoldSpec,
    events: &[Ev],
    stored: i64,
    split: usize,
) -> Result<(Vec<RecordBatch>, FoldCounts)> {
    let input = batch(&spec.layout, events);
    let mut kernel = spec.kernel(&input.schema())?;
    kernel.observe_stored_watermark(&(Arc::new(Int64Array::from(vec![stored])) as ArrayRef))?;
    push_all(kernel, &input, split)
}

/// [`fold`] of a batch already laid out and sorted.
pub fn fold_batch(
    spec: &FoldSpec,
    input: &RecordBatch,
    watermark: Option<i64>,
    split: usize,
) -> Result<(Vec<RecordBatch>, FoldCounts)> {
    let mut kernel = spec.kernel(&input.schema())?;
    if let Some(w) = watermark {
        kernel.observe_watermark(&(Arc::new(Int64Array::from(vec![w])) as ArrayRef))?;
    }
    push_all(kernel, input, split)
}

/// Feed `input` to `kernel`, `split` rows at a time, and finish it.
fn push_all(
    mut kernel: Box<dyn crate::fold::FoldKernel>,
    input: &RecordBatch,
    split: usize,
) -> Result<(Vec<RecordBatch>, FoldCounts)> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < input.num_rows() {
        let len = split.min(input.num_rows() - offset);
        out.extend(kernel.push(&input.slice(offset, len))?);
        offset += len;
    }
    out.extend(kernel.finish_all()?);
    Ok((out, kernel.counts()))
}

/// `run(split)` for every split of `n` input rows (a row a batch up to all
/// in one batch): every split must give the same result, which is returned.
pub fn every_split<T: PartialEq + std::fmt::Debug>(n: usize, run: impl Fn(usize) -> T) -> T {
    let first = run(1);
    for split in 2..=n {
        assert_eq!(first, run(split), "batches of {split}");
    }
    first
}

/// The output rows of every kind (stored codes, versions, change rows) as
/// [`rows`] gives them, kind by kind: what tells two folds' outputs apart.
pub fn rows_by_kind(batches: &[RecordBatch]) -> Vec<(i8, Vec<String>)> {
    (-8..16)
        .map(|kind| (kind, rows(batches, &[kind])))
        .filter(|(_, rows)| !rows.is_empty())
        .collect()
}

/// The output rows whose kind is one of `kinds`, as `col=value` text (the
/// written-at column left out), sorted.
pub fn rows(batches: &[RecordBatch], kinds: &[i8]) -> Vec<String> {
    let mut out = Vec::new();
    for batch in batches {
        let schema = batch.schema();
        let kind = batch
            .column(schema.index_of(KIND_COL).expect("kind column"))
            .as_primitive::<Int8Type>();
        for r in 0..batch.num_rows() {
            if kind.is_null(r) || !kinds.contains(&kind.value(r)) {
                continue;
            }
            let cells: Vec<String> = schema
                .fields()
                .iter()
                .enumerate()
                .filter(|(_, f)| f.name() != WRITTEN_AT_COL && f.name() != KIND_COL)
                .map(|(c, f)| {
                    let column = batch.column(c);
                    let value = if column.is_null(r) {
                        "NULL".to_string()
                    } else {
                        array_value_to_string(column, r).expect("display")
                    };
                    format!("{}={value}", f.name().trim_start_matches("__"))
                })
                .collect();
            out.push(cells.join(" "));
        }
    }
    out.sort();
    out
}
