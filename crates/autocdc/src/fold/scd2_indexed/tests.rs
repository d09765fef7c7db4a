use super::*;
use crate::fold::test_support::{batch, del, fold, rows, rows_by_kind, spec, up, up_null, Ev};
use crate::fold::{FoldSpec, ScdType};

/// Events of 12 keys at sequences 0..40 in a generator's order: values
/// and kinds a function of `(id, seq)`, so that events at an equal
/// sequence are replays, and few values, so that many upserts repeat the
/// version they follow.
fn events(seed: u64, count: usize) -> Vec<Ev> {
    const VALUES: [&str; 2] = ["a", "b"];
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    (0..count)
        .map(|_| {
            let (id, seq) = ((next() % 12) as i64, (next() % 40) as i64);
            let mix = (id * 7 + seq * 3) as usize;
            match mix % 7 {
                0 => del(id, seq),
                1 => up_null(id, seq),
                m => up(id, VALUES[m % 2], seq),
            }
        })
        .collect()
}

/// A query's SCD 2 fold spec tracking `tracked`.
fn query_spec(tracked: Vec<usize>) -> FoldSpec {
    FoldSpec {
        visible_only: true,
        late_through: None,
        ..spec(ScdType::Type2, tracked, None)
    }
}

/// `events` cut into batches of `split` (each sorted, out of order with
/// each other), folded by the indexed kernel with `mask` on tracked
/// hashes, its index sorted by counting when `split` is odd and in place
/// when it is even.
fn run_indexed(
    spec: &FoldSpec,
    events: &[Ev],
    split: usize,
    mask: u64,
) -> Result<(Vec<RecordBatch>, FoldCounts, bool)> {
    let batches: Vec<RecordBatch> = events
        .chunks(split)
        .map(|chunk| batch(&spec.layout, chunk))
        .collect();
    let schema = batches[0].schema();
    let mut fold =
        IndexedScd2Fold::try_new("f", spec.layout.clone(), spec.tracked.clone(), &schema)?
            .with_tracked_hash_mask(mask);
    for b in &batches {
        fold.push(b)?;
    }
    fold.finish(&mut |_| split % 2 == 1)?;
    let mut out = Vec::new();
    while let Some(b) = fold.next_output(8192)? {
        assert_eq!(b.schema(), *fold.output_schema());
        out.push(b);
    }
    let folded_again = fold.rerun.is_some();
    Ok((out, fold.counts(), folded_again))
}

#[test]
fn folds_like_the_sorted_kernel() -> Result<()> {
    for tracked in [vec![1], vec![]] {
        let spec = query_spec(tracked.clone());
        for seed in 0..12 {
            let events = events(seed, 200);
            let (expected, expected_counts) = fold(&spec, &events, None, 1000)?;
            assert!(!expected.is_empty());
            for split in [1, 7, 64, 200] {
                let (out, counts, folded_again) = run_indexed(&spec, &events, split, u64::MAX)?;
                let what = format!("tracked {tracked:?} seed {seed} split {split}");
                assert_eq!(rows_by_kind(&out), rows_by_kind(&expected), "{what}");
                assert_eq!(counts, expected_counts, "{what}");
                assert!(!folded_again, "{what}");
            }
        }
    }
    Ok(())
}

#[test]
fn colliding_tracked_hashes_fold_again_with_the_sorted_kernel() -> Result<()> {
    let spec = query_spec(vec![1]);
    for seed in 0..6 {
        let events = events(seed, 200);
        let (expected, expected_counts) = fold(&spec, &events, None, 1000)?;
        // every hash 0: every upsert after another looks absorbed
        let (out, counts, folded_again) = run_indexed(&spec, &events, 9, 0)?;
        assert!(folded_again, "seed {seed}");
        assert_eq!(rows_by_kind(&out), rows_by_kind(&expected), "seed {seed}");
        assert_eq!(counts, expected_counts, "seed {seed}");
    }
    // with no tracked column every hash is equal and nothing collides
    let spec = query_spec(vec![]);
    let (_, _, folded_again) = run_indexed(&spec, &events(1, 200), 9, 0)?;
    assert!(!folded_again);
    Ok(())
}

#[test]
fn versions_show_their_latest_event_from_open_to_close() -> Result<()> {
    // absorbed upserts (same tracked value) keep the version open; a delete
    // closes it; a delete with nothing open is a tombstone; v untracked
    // only in the second spec
    let events = [
        up(1, "a", 1),
        up(1, "a", 2),
        up(1, "b", 4),
        del(1, 6),
        del(1, 7),
        up(1, "c", 9),
        up(1, "c", 9),
    ];
    let (out, counts, _) = run_indexed(&query_spec(vec![1]), &events, 2, u64::MAX)?;
    assert_eq!(
        rows(&out, &[Kind::Upsert as i8]),
        [
            "id=1 v=a start_at=1 end_at=4 cdc_seq=2",
            "id=1 v=b start_at=4 end_at=6 cdc_seq=4",
            "id=1 v=c start_at=9 end_at=NULL cdc_seq=9",
        ]
    );
    assert_eq!(
        (
            counts.upserted,
            counts.deleted,
            counts.tombstones,
            counts.duplicates
        ),
        // (the rows inserted: its three versions)
        (3, 0, 1, 1)
    );
    let (out, _, _) = run_indexed(&query_spec(vec![]), &events, 2, u64::MAX)?;
    assert_eq!(
        rows(&out, &[Kind::Upsert as i8]),
        [
            "id=1 v=b start_at=1 end_at=6 cdc_seq=4",
            "id=1 v=c start_at=9 end_at=NULL cdc_seq=9",
        ]
    );
    Ok(())
}

#[test]
fn conflicting_replays_fail_as_the_sorted_kernel_does() -> Result<()> {
    let spec = query_spec(vec![1]);
    for events in [
        vec![up(1, "a", 1), up(2, "a", 3), up(1, "b", 1)],
        vec![up(2, "a", 5), del(2, 5)],
    ] {
        let expected = fold(&spec, &events, None, 1000)
            .map(|_| ())
            .map_err(|e| e.to_string());
        let got = run_indexed(&spec, &events, 1, u64::MAX)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(expected.is_err());
        assert_eq!(got, expected);
    }
    Ok(())
}

#[test]
fn truncates_and_stored_rows_are_refused() -> Result<()> {
    let spec = query_spec(vec![1]);
    let input = batch(&spec.layout, &[up(1, "a", 1)]);
    let fold = IndexedScd2Fold::try_new("f", spec.layout.clone(), vec![1], &input.schema())?;
    let none: ArrayRef = Arc::new(arrow::array::Int64Array::from(Vec::<i64>::new()));
    let some: ArrayRef = Arc::new(arrow::array::Int64Array::from(vec![3]));
    assert!(fold.observe_watermark(&none).is_ok());
    let message = fold.observe_watermark(&some).map_err(|e| e.to_string());
    assert!(message.is_err_and(|m| m.contains("TRUNCATE is not allowed with SCD TYPE 2")));
    let mut fold = fold;
    let stored = batch(&spec.layout, &[up(1, "a", 1).stored()]);
    assert!(fold.push(&stored).is_err());
    Ok(())
}

/// Sequences of every fixed-width type up to 8 bytes come back as they
/// were: integers of 8 and 4 bytes and the types stored as them directly,
/// others through their row format.
#[test]
fn sequences_of_every_width_come_back() -> Result<()> {
    use arrow::compute::cast;
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    let types = [
        DataType::Int64,
        DataType::Int32,
        DataType::Int16,
        DataType::UInt64,
        DataType::UInt8,
        DataType::Float64,
        DataType::Date32,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
    ];
    let events = [
        up(1, "a", 1),
        up(1, "b", 30),
        del(1, 70),
        up(2, "a", 5),
        up(2, "a", 9),
        up(2, "c", 100),
    ];
    for data_type in types {
        for spec in [query_spec(vec![1])] {
            let sorted = batch(&spec.layout, &events);
            let seq = spec.layout.seq();
            let mut fields: Vec<Field> = sorted
                .schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields[seq] = Field::new(fields[seq].name(), data_type.clone(), true);
            let mut columns = sorted.columns().to_vec();
            columns[seq] = cast(&columns[seq], &data_type)?;
            let input = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
            let (expected, _) = crate::fold::test_support::fold_batch(&spec, &input, None, 100)?;
            let mut fold =
                IndexedScd2Fold::try_new("f", spec.layout.clone(), vec![1], &input.schema())?;
            // in two batches, the second first
            fold.push(&input.slice(3, 3))?;
            fold.push(&input.slice(0, 3))?;
            fold.finish(&mut |_| true)?;
            let mut out = Vec::new();
            while let Some(b) = fold.next_output(2)? {
                out.push(b);
            }
            assert_eq!(rows_by_kind(&out), rows_by_kind(&expected), "{data_type}");
            assert!(!rows_by_kind(&out).is_empty());
        }
    }
    Ok(())
}
