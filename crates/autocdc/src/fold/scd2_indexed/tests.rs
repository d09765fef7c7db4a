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
        ..spec(ScdType::Type2, tracked, None)
    }
}

/// `events` cut into batches of `split` (each sorted, out of order with
/// each other), folded by the indexed kernel with `mask` on tracked
/// hashes.
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
            .with_visible_only(spec.visible_only)
            .with_tracked_hash_mask(mask);
    for b in &batches {
        fold.push(b)?;
    }
    fold.finish()?;
    let mut out = Vec::new();
    while let Some(b) = fold.next_output(8192)? {
        assert_eq!(b.schema(), *fold.output_schema());
        out.push(b);
    }
    let folded_again = fold.rerun.is_some();
    Ok((out, fold.counts(), folded_again))
}

/// [`events`], those of even seeds' first half stored (read back from a
/// target that folded them) unless a query's.
fn history(seed: u64, query: bool) -> Vec<Ev> {
    let mut events = events(seed, 200);
    if !query && seed.is_multiple_of(2) {
        // stored events are distinct: a target keeps one per key and sequence
        let mut seen = std::collections::HashSet::new();
        for e in events.iter_mut().take(100) {
            if seen.insert((e.id, e.seq)) {
                *e = e.stored();
            }
        }
    }
    events
}

/// A flow's SCD 2 fold spec tracking `tracked`.
fn flow_spec(tracked: Vec<usize>) -> FoldSpec {
    spec(ScdType::Type2, tracked, None)
}

#[test]
fn folds_like_the_sorted_kernel() -> Result<()> {
    for (tracked, query) in [
        (vec![1], true),
        (vec![], true),
        (vec![1], false),
        (vec![], false),
    ] {
        let spec = match query {
            true => query_spec(tracked.clone()),
            false => flow_spec(tracked.clone()),
        };
        for seed in 0..12 {
            let events = history(seed, query);
            let (expected, expected_counts) = fold(&spec, &events, None, 1000)?;
            assert!(!expected.is_empty());
            for split in [1, 7, 64, 200] {
                let (out, counts, folded_again) = run_indexed(&spec, &events, split, u64::MAX)?;
                let what = format!("query {query} tracked {tracked:?} seed {seed} split {split}");
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
    for query in [true, false] {
        let spec = match query {
            true => query_spec(vec![1]),
            false => flow_spec(vec![1]),
        };
        for seed in 0..6 {
            let events = history(seed, query);
            let (expected, expected_counts) = fold(&spec, &events, None, 1000)?;
            // every hash 0: every upsert after another looks absorbed
            let (out, counts, folded_again) = run_indexed(&spec, &events, 9, 0)?;
            let what = format!("query {query} seed {seed}");
            assert!(folded_again, "{what}");
            assert_eq!(rows_by_kind(&out), rows_by_kind(&expected), "{what}");
            assert_eq!(counts, expected_counts, "{what}");
        }
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
        (4, 1, 1, 1)
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
fn truncates_are_refused() -> Result<()> {
    let spec = flow_spec(vec![1]);
    let input = batch(&spec.layout, &[up(1, "a", 1)]);
    let fold = IndexedScd2Fold::try_new("f", spec.layout.clone(), vec![1], &input.schema())?;
    let none: ArrayRef = Arc::new(arrow::array::Int64Array::from(Vec::<i64>::new()));
    let some: ArrayRef = Arc::new(arrow::array::Int64Array::from(vec![3]));
    assert!(fold.observe_watermark(&none).is_ok());
    let message = fold.observe_watermark(&some).map_err(|e| e.to_string());
    assert!(message.is_err_and(|m| m.contains("TRUNCATE is not allowed with SCD TYPE 2")));
    Ok(())
}

/// `events` folded by the sorted kernel and by the indexed one (batches of
/// 2): the same rows and counts, or the same error.
fn same_as_sorted(spec: &FoldSpec, events: &[Ev]) {
    let expected = fold(spec, events, None, 1000).map(|(out, c)| (rows_by_kind(&out), c));
    let got = run_indexed(spec, events, 2, u64::MAX).map(|(out, c, _)| (rows_by_kind(&out), c));
    match (expected, got) {
        (Ok(expected), Ok(got)) => assert_eq!(got, expected, "{events:?}"),
        (Err(expected), Err(got)) => assert_eq!(got.to_string(), expected.to_string()),
        (expected, got) => panic!("{events:?}: expected {expected:?}, got {got:?}"),
    }
}

/// A late event splits a stored version (the old version's pre-image, the
/// post-image and an insert), a late delete ends one early, a replay of a
/// stored event is dropped and one that differs conflicts with it.
#[test]
fn change_rows_match_the_versions_before_and_after() {
    let spec = flow_spec(vec![1]);
    let cases = [
        vec![
            up(1, "a", 1).stored(),
            up(1, "b", 5).stored(),
            up(1, "c", 3),
        ],
        vec![
            up(1, "a", 1).stored(),
            up(1, "a", 5).stored(),
            up(1, "b", 3),
        ],
        vec![up(1, "a", 1).stored(), up(1, "b", 5).stored(), del(1, 3)],
        vec![
            up(1, "a", 1).stored(),
            del(1, 5).stored(),
            up(1, "a", 7),
            up(1, "a", 1),
        ],
        vec![
            up(1, "a", 1).stored(),
            up(1, "a", 2),
            up(2, "x", 1).stored(),
            up(2, "y", 1),
        ],
    ];
    for events in cases {
        same_as_sorted(&spec, &events);
    }
    // an untracked change of the open version: its pre- and post-image
    let spec = flow_spec(vec![]);
    same_as_sorted(&spec, &[up(1, "a", 1).stored(), up(1, "b", 2)]);
}

/// Rows a DML statement wrote (an erasure mark here) make the partition
/// fold with the sorted kernel, whose rules they follow.
#[test]
fn dml_rows_fold_with_the_sorted_kernel() -> Result<()> {
    let spec = flow_spec(vec![1]);
    let events = [
        up(1, "a", 1).stored(),
        crate::fold::test_support::mark(1, crate::fold::columns::STORED_ERASED_THROUGH, 4),
        up(1, "b", 3),
        up(1, "c", 6),
    ];
    let (expected, expected_counts) = fold(&spec, &events, None, 1000)?;
    let (out, counts, folded_again) = run_indexed(&spec, &events, 3, u64::MAX)?;
    assert!(folded_again);
    assert_eq!(rows_by_kind(&out), rows_by_kind(&expected));
    assert_eq!(counts, expected_counts);
    Ok(())
}

/// A flow's rows leave in key order (its target stays clustered by key:
/// a later update reads a key's rows from few pages); a query's in the
/// order their events arrived.
#[test]
fn a_flow_emits_in_key_order() -> Result<()> {
    let ids = |out: &[RecordBatch]| -> Vec<i64> {
        out.iter()
            .flat_map(|b| {
                let ids = b.column(0).as_primitive::<arrow::datatypes::Int64Type>();
                ids.values().to_vec()
            })
            .collect()
    };
    let events = history(1, false);
    let (out, _, _) = run_indexed(&flow_spec(vec![1]), &events, 7, u64::MAX)?;
    let flow = ids(&out);
    assert!(flow.windows(2).all(|w| w[0] <= w[1]), "{flow:?}");
    let (out, _, _) = run_indexed(&query_spec(vec![1]), &events, 7, u64::MAX)?;
    let query = ids(&out);
    assert!(!query.windows(2).all(|w| w[0] <= w[1]), "{query:?}");
    Ok(())
}

/// Sequences of every fixed-width type up to 8 bytes come back as they
/// were: integers of 8 and 4 bytes and the types stored as them directly,
/// others through their row format (flows and queries alike).
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
        for spec in [query_spec(vec![1]), flow_spec(vec![1])] {
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
                IndexedScd2Fold::try_new("f", spec.layout.clone(), vec![1], &input.schema())?
                    .with_visible_only(spec.visible_only);
            // in two batches, the second first
            fold.push(&input.slice(3, 3))?;
            fold.push(&input.slice(0, 3))?;
            fold.finish()?;
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
