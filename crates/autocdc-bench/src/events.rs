//! CDC event streams: `id BIGINT, seq BIGINT, op STRING, <value columns>`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Builder, RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;

use crate::rng::Rng;
use crate::values::{ValueBuilders, ValueColumns};
use crate::{
    check_fraction, check_sizes, writer_properties, Error, Result, DEFAULT_BATCH_ROWS,
    DEFAULT_ROW_GROUP_ROWS,
};

/// Parameters of a generated change feed.
///
/// The stream is built from *fresh* events with sequence numbers `1, 2, 3, ...`
/// in order, each for a key drawn uniformly from `0..keys`, a delete with
/// probability `delete_fraction` (values NULL) and an upsert otherwise (values
/// derived from a random seed). Then:
///
/// * with probability `late_fraction` a fresh event is *late*: it is written
///   between 1 and `max_delay` rows after the place it had in sequence order,
///   so later events — of its key too, when the key recurs within the delay —
///   come before it;
/// * with probability `replay_fraction` a row is a *replay*: an exact copy of
///   one of the last `replay_window` rows written (same key, sequence and
///   values), as an at-least-once source delivers.
///
/// `events` counts every row written, replays included. Sequence numbers are
/// unique among fresh events, so two rows with one sequence are identical.
#[derive(Clone, Debug, PartialEq)]
pub struct EventsConfig {
    /// Rows written, replays included.
    pub events: u64,
    /// Keys are drawn uniformly from `0..keys`.
    pub keys: u64,
    /// Share of fresh events that are deletes (`op = 'D'`).
    pub delete_fraction: f64,
    /// Share of fresh events written late (out of order).
    pub late_fraction: f64,
    /// How many rows after its place a late event may come (at least 1).
    pub max_delay: u64,
    /// Share of rows that replay a recent row.
    pub replay_fraction: f64,
    /// How many recent rows a replay picks from (at least 1).
    pub replay_window: usize,
    /// The value columns.
    pub columns: ValueColumns,
    /// Seed of every random choice: one seed, one stream.
    pub seed: u64,
    /// Rows per Arrow batch.
    pub batch_rows: usize,
    /// Rows per Parquet row group.
    pub row_group_rows: usize,
}

impl Default for EventsConfig {
    /// 1 M events over 200 k keys, 5 % deletes, 5 % late by up to one key
    /// count, 1 % replays.
    fn default() -> Self {
        Self {
            events: 1_000_000,
            keys: 200_000,
            delete_fraction: 0.05,
            late_fraction: 0.05,
            max_delay: 200_000,
            replay_fraction: 0.01,
            replay_window: 65_536,
            columns: ValueColumns::default(),
            seed: 42,
            batch_rows: DEFAULT_BATCH_ROWS,
            row_group_rows: DEFAULT_ROW_GROUP_ROWS,
        }
    }
}

impl EventsConfig {
    /// Checks every parameter.
    pub fn validate(&self) -> Result<()> {
        if self.keys == 0 || self.keys > i64::MAX as u64 {
            return Err(Error::Config(format!(
                "keys must be between 1 and {}, got {}",
                i64::MAX,
                self.keys
            )));
        }
        if self.events > i64::MAX as u64 {
            return Err(Error::Config(format!(
                "events must be at most {}, got {}",
                i64::MAX,
                self.events
            )));
        }
        check_fraction("delete fraction", self.delete_fraction)?;
        check_fraction("late fraction", self.late_fraction)?;
        check_fraction("replay fraction", self.replay_fraction)?;
        if self.max_delay == 0 {
            return Err(Error::Config("max delay must be at least 1".into()));
        }
        if self.replay_window == 0 {
            return Err(Error::Config("replay window must be at least 1".into()));
        }
        check_sizes(self.batch_rows, self.row_group_rows)
    }
}

/// What a generated stream contains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventsSummary {
    /// Rows written.
    pub rows: u64,
    /// Fresh events (distinct sequence numbers).
    pub fresh: u64,
    /// Fresh events that are deletes.
    pub deletes: u64,
    /// Fresh events written late.
    pub late: u64,
    /// Rows that replay an earlier row.
    pub replays: u64,
    /// Most late events held back at once (the generator's memory beyond a
    /// batch, a row group and the replay window).
    pub max_pending: u64,
}

/// The schema of a change feed with `columns`: `id`, `seq`, `op` (not null),
/// then the value columns (NULL in deletes).
pub fn events_schema(columns: &ValueColumns) -> SchemaRef {
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("seq", DataType::Int64, false),
        Field::new("op", DataType::Utf8, false),
    ];
    fields.extend(columns.fields(true));
    Arc::new(Schema::new(fields))
}

/// Writes the change feed described by `config` to `sink` as Parquet and
/// returns what it contains.
///
/// Memory is bounded by one batch, one row group, the late events not yet due
/// (about `late_fraction * max_delay / 2` of 32 bytes each) and the replay
/// window (32 bytes a row), whatever `events` is.
pub fn write_events<W: Write + Send>(config: &EventsConfig, sink: W) -> Result<EventsSummary> {
    config.validate()?;
    let mut rng = Rng::new(config.seed, 1);
    let mut out = EventWriter::new(config, sink)?;
    let mut summary = EventsSummary::default();
    // Late events by the row index at which they are due.
    let mut pending: BinaryHeap<Reverse<(u64, Event)>> = BinaryHeap::new();
    let mut produced = 0u64;
    while produced < config.events {
        while let Some(Reverse((due, _))) = pending.peek() {
            if *due > out.rows {
                break;
            }
            if let Some(Reverse((_, event))) = pending.pop() {
                out.push(event)?;
            }
        }
        produced += 1;
        if let Some(event) = out.recent_choice(&mut rng, config.replay_fraction) {
            summary.replays += 1;
            out.push(event)?;
            continue;
        }
        summary.fresh += 1;
        let delete = rng.chance(config.delete_fraction);
        summary.deletes += u64::from(delete);
        let event = Event {
            id: rng.below(config.keys) as i64,
            seq: summary.fresh as i64,
            delete,
            values: rng.next_u64(),
        };
        if rng.chance(config.late_fraction) {
            summary.late += 1;
            let due = out.rows + 1 + rng.below(config.max_delay);
            pending.push(Reverse((due, event)));
            summary.max_pending = summary.max_pending.max(pending.len() as u64);
        } else {
            out.push(event)?;
        }
    }
    while let Some(Reverse((_, event))) = pending.pop() {
        out.push(event)?;
    }
    summary.rows = out.close()?;
    Ok(summary)
}

/// One event before it is written: its values are a function of `values`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Event {
    id: i64,
    seq: i64,
    delete: bool,
    values: u64,
}

/// Batches events and writes them as Parquet; remembers the recent ones for
/// replays.
struct EventWriter<W: Write + Send> {
    writer: ArrowWriter<W>,
    schema: SchemaRef,
    batch_rows: usize,
    ids: Int64Builder,
    seqs: Int64Builder,
    ops: StringBuilder,
    values: ValueBuilders,
    buffered: usize,
    /// Rows pushed so far.
    rows: u64,
    /// A ring of the last rows pushed.
    recent: Vec<Event>,
    recent_capacity: usize,
}

impl<W: Write + Send> EventWriter<W> {
    fn new(config: &EventsConfig, sink: W) -> Result<Self> {
        let schema = events_schema(&config.columns);
        let writer = ArrowWriter::try_new(
            sink,
            Arc::clone(&schema),
            Some(writer_properties(config.row_group_rows)),
        )?;
        let capacity = config.batch_rows;
        Ok(Self {
            writer,
            schema,
            batch_rows: capacity,
            ids: Int64Builder::with_capacity(capacity),
            seqs: Int64Builder::with_capacity(capacity),
            ops: StringBuilder::with_capacity(capacity, capacity),
            values: ValueBuilders::new(&config.columns, capacity),
            buffered: 0,
            rows: 0,
            recent: Vec::with_capacity(config.replay_window.min(1 << 20)),
            recent_capacity: config.replay_window,
        })
    }

    /// With probability `p`, one of the recent rows (none before the first).
    fn recent_choice(&self, rng: &mut Rng, p: f64) -> Option<Event> {
        if self.recent.is_empty() || !rng.chance(p) {
            return None;
        }
        let index = rng.below(self.recent.len() as u64) as usize;
        self.recent.get(index).copied()
    }

    fn push(&mut self, event: Event) -> Result<()> {
        self.ids.append_value(event.id);
        self.seqs.append_value(event.seq);
        if event.delete {
            self.ops.append_value("D");
            self.values.append_nulls();
        } else {
            self.ops.append_value("U");
            self.values.append(event.values);
        }
        if self.recent.len() < self.recent_capacity {
            self.recent.push(event);
        } else {
            let slot = (self.rows % self.recent_capacity as u64) as usize;
            self.recent[slot] = event;
        }
        self.rows += 1;
        self.buffered += 1;
        if self.buffered == self.batch_rows {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.buffered == 0 {
            return Ok(());
        }
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.ids.finish()),
            Arc::new(self.seqs.finish()),
            Arc::new(self.ops.finish()),
        ];
        columns.extend(self.values.finish());
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        self.writer.write(&batch)?;
        self.buffered = 0;
        Ok(())
    }

    /// Writes what is buffered and the file footer; returns the rows written.
    fn close(mut self) -> Result<u64> {
        self.flush()?;
        let mut sink = self.writer.into_inner()?;
        sink.flush()?;
        Ok(self.rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use arrow::array::{Array, AsArray};
    use arrow::datatypes::Int64Type;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn small(events: u64) -> EventsConfig {
        EventsConfig {
            events,
            keys: 500,
            delete_fraction: 0.1,
            late_fraction: 0.2,
            max_delay: 400,
            replay_fraction: 0.05,
            replay_window: 100,
            batch_rows: 333,
            row_group_rows: 1000,
            ..EventsConfig::default()
        }
    }

    /// Generates into a temporary file and reads every batch back.
    fn generate(config: &EventsConfig) -> (EventsSummary, Vec<RecordBatch>) {
        let mut file = tempfile::tempfile().expect("temp file");
        let summary = write_events(config, &mut file).expect("generate");
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet footer")
            .build()
            .expect("reader");
        let batches = reader.collect::<std::result::Result<Vec<_>, _>>();
        (summary, batches.expect("read back"))
    }

    /// A row read back: (id, seq, op, i1, s2).
    type Row = (i64, i64, String, Option<i64>, Option<String>);

    fn rows(batches: &[RecordBatch]) -> Vec<Row> {
        let mut out = Vec::new();
        for batch in batches {
            let ids = batch.column(0).as_primitive::<Int64Type>();
            let seqs = batch.column(1).as_primitive::<Int64Type>();
            let ops = batch.column(2).as_string::<i32>();
            let i1 = batch.column(3).as_primitive::<Int64Type>();
            let s2 = batch.column(6).as_string::<i32>();
            for row in 0..batch.num_rows() {
                out.push((
                    ids.value(row),
                    seqs.value(row),
                    ops.value(row).to_string(),
                    i1.is_valid(row).then(|| i1.value(row)),
                    s2.is_valid(row).then(|| s2.value(row).to_string()),
                ));
            }
        }
        out
    }

    #[test]
    fn stream_has_the_configured_shape() {
        let config = small(20_000);
        let (summary, batches) = generate(&config);
        assert_eq!(batches[0].schema(), events_schema(&config.columns));
        let rows = rows(&batches);
        assert_eq!(rows.len() as u64, config.events);
        assert_eq!(summary.rows, config.events);
        assert_eq!(summary.fresh + summary.replays, config.events);

        // every sequence is one fresh event; its replays are exact copies
        let mut by_seq = HashMap::new();
        for row in &rows {
            let first = by_seq.entry(row.1).or_insert_with(|| row.clone());
            assert_eq!(first, row, "a replay differs from its event");
        }
        assert_eq!(by_seq.len() as u64, summary.fresh);
        assert_eq!(
            by_seq.keys().copied().max(),
            Some(summary.fresh as i64),
            "sequences are 1..=fresh"
        );

        // deletes have NULL values, upserts have values
        let deletes = by_seq.values().filter(|r| r.2 == "D").count() as u64;
        assert_eq!(deletes, summary.deletes);
        assert!(rows
            .iter()
            .all(|r| (r.2 == "D") == (r.3.is_none() && r.4.is_none())));
        assert!(rows.iter().all(|r| (0..500).contains(&r.0)));

        // shares are near the configured ones
        let share = |n: u64| n as f64 / config.events as f64;
        assert!((share(summary.deletes) - 0.1).abs() < 0.02);
        assert!((share(summary.late) - 0.2).abs() < 0.02);
        assert!((share(summary.replays) - 0.05).abs() < 0.01);
    }

    #[test]
    fn late_events_perturb_per_key_order() {
        // (no replays: they repeat old sequences too)
        let config = EventsConfig {
            replay_fraction: 0.0,
            ..small(20_000)
        };
        let (summary, batches) = generate(&config);
        assert!(summary.max_pending > 0);
        let mut last_seq: HashMap<i64, i64> = HashMap::new();
        let mut inversions = 0;
        for (id, seq, ..) in rows(&batches) {
            let last = last_seq.entry(id).or_insert(seq);
            if seq < *last {
                inversions += 1;
            }
            *last = (*last).max(seq);
        }
        assert!(inversions > 0, "no key saw an out-of-order event");
    }

    #[test]
    fn without_late_events_the_stream_is_in_order() {
        let config = EventsConfig {
            late_fraction: 0.0,
            ..small(5_000)
        };
        let (summary, batches) = generate(&config);
        assert_eq!(summary.late, 0);
        let seqs: Vec<i64> = rows(&batches).into_iter().map(|r| r.1).collect();
        let fresh: Vec<i64> = {
            let mut seen = std::collections::HashSet::new();
            seqs.iter().copied().filter(|s| seen.insert(*s)).collect()
        };
        assert!(fresh.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn one_seed_one_stream() {
        let config = small(3_000);
        let (_, a) = generate(&config);
        let (_, b) = generate(&config);
        let (_, c) = generate(&EventsConfig {
            seed: 7,
            ..config.clone()
        });
        assert_eq!(rows(&a), rows(&b));
        assert_ne!(rows(&a), rows(&c));
    }

    #[test]
    fn empty_stream_and_bad_parameters() {
        let (summary, batches) = generate(&small(0));
        assert_eq!(summary, EventsSummary::default());
        assert!(rows(&batches).is_empty());

        for bad in [
            EventsConfig {
                keys: 0,
                ..small(10)
            },
            EventsConfig {
                delete_fraction: 1.5,
                ..small(10)
            },
            EventsConfig {
                max_delay: 0,
                ..small(10)
            },
            EventsConfig {
                batch_rows: 0,
                ..small(10)
            },
        ] {
            let error = write_events(&bad, std::io::sink()).expect_err("rejected");
            assert!(matches!(error, Error::Config(_)), "{error}");
        }
    }
}
