//! Any sorted fold kernel fed through a sorted [`EventIndex`] instead of a
//! sort of the events.
//!
//! SCD 2, BITEMPORAL, partial-update and per-column folds consume events in
//! `(keys, seq, origin)` order. DataFusion's sort delivers that order by
//! moving every column of every event twice (into sorted runs, then through
//! the merge) and comparing row-format keys. This driver orders each batch
//! as it arrives by its own compact index entries (one `take`), sorts the
//! entries of all batches, and gathers the events in that order many
//! thousand at a time — each gather ending with a whole key group, so the
//! kernel carries nothing over — into the unchanged sorted kernel:
//!
//! ```text
//!  push(batch)                                  finish         next_output (≥ GATHER_ENTRIES entries)
//!  index (key, seq, origin) ─► take in that order ─► sort index ─► interleave rows ─► kernel.push
//! ```
//!
//! Because every retained batch is in index order, the gather reads each one
//! front to back: the cache lines it loads serve the rows that follow (a
//! gather from batches in arrival order missed the cache on nearly every
//! row and gained nothing over DataFusion's sort; `benches/README.md`).
//!
//! The rules stay the kernel's: only how its input is ordered changes. With
//! hashed keys (strings, wide composites) each key's events are contiguous
//! and in sequence order, but keys follow their hashes, not their values;
//! no kernel depends on the order between keys.

use std::sync::Arc;

use arrow::array::{Int32Array, RecordBatch};
use arrow::compute::interleave_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result};

use super::event_index::{EventIndex, IndexEntry};
use super::{EventLayout, FoldCounts, FoldKernel};

/// The group of each row of a batch of events (a target's key bucket:
/// every event of a key in one group), below a known count.
pub type GroupOf = Arc<dyn Fn(&RecordBatch) -> Result<Int32Array> + Send + Sync>;

/// Events gathered grouped ([`IndexSortedFold::with_groups`]).
#[derive(Clone)]
struct Grouping {
    group_of: GroupOf,
    groups: usize,
}

impl std::fmt::Debug for Grouping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Grouping({} groups)", self.groups)
    }
}

/// A sorted kernel and the index that feeds it (see the module docs).
#[derive(Debug)]
pub struct IndexSortedFold {
    kernel: Box<dyn FoldKernel>,
    index: EventIndex,
    batches: Vec<RecordBatch>,
    retained_bytes: usize,
    /// Next index entry to gather, once sorted.
    next: usize,
    /// The entries gathered next, and their rows' places (both reused).
    window: Vec<IndexEntry>,
    places: Vec<(usize, usize)>,
    /// What the kernel returned last and is not handed out yet.
    output: Option<RecordBatch>,
    /// Fewest entries gathered at once ([`GATHER_ENTRIES`]; fewer in tests).
    gather_entries: usize,
    /// How each gather's events are grouped, if they are (each entry's
    /// group is its tag).
    grouping: Option<Grouping>,
    finished: bool,
}

/// Fewest index entries gathered at once. Every gather visits every
/// retained batch (`interleave` checks and lists each column of each source,
/// and a window in key order reads from nearly all of them): in windows of
/// one output batch that was ~6 % of a 10 M-event SCD 2 load.
const GATHER_ENTRIES: usize = 65_536;

impl IndexSortedFold {
    /// Feed `kernel` (its watermarks already observed) the events of
    /// `input_schema` in index order.
    pub fn try_new(
        flow: &str,
        layout: &EventLayout,
        input_schema: &SchemaRef,
        mut kernel: Box<dyn FoldKernel>,
    ) -> Result<Self> {
        kernel.expect_whole_groups();
        Ok(Self {
            kernel,
            index: EventIndex::try_new(flow, layout, input_schema)?,
            batches: Vec::new(),
            retained_bytes: 0,
            next: 0,
            window: Vec::new(),
            places: Vec::new(),
            output: None,
            gather_entries: GATHER_ENTRIES,
            grouping: None,
            finished: false,
        })
    }

    /// Gather events grouped by `group_of` (values `0..groups`), each group
    /// still in index order: with a target's key buckets, each output batch
    /// reaches the writer grouped by bucket and each bucket's rows in key
    /// order, so the writer neither groups nor sorts them.
    pub fn with_groups(mut self, groups: usize, group_of: GroupOf) -> Self {
        self.grouping = Some(Grouping { group_of, groups });
        self
    }

    /// Gather at least `entries` entries at a time (tests: many gathers).
    #[cfg(test)]
    fn with_gather_entries(mut self, entries: usize) -> Self {
        self.gather_entries = entries;
        self
    }

    /// Retain and index one batch of events (any order).
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let (ordered, _) = self.index.push_ordered(batch, self.batches.len())?;
        if let Some(grouping) = &self.grouping {
            // (the batch's entries are its rows, in order: tag them)
            let groups = (grouping.group_of)(&ordered)?;
            let mut tags = Vec::with_capacity(groups.len());
            for &g in groups.values() {
                match usize::try_from(g) {
                    Ok(g) if g < grouping.groups => tags.push(g as u64),
                    _ => {
                        return Err(DataFusionError::Internal(format!(
                            "group {g} of an event, of {} groups",
                            grouping.groups
                        )))
                    }
                }
            }
            self.index.tag_batch(&tags);
        }
        self.retained_bytes += ordered.get_array_memory_size();
        self.batches.push(ordered);
        Ok(())
    }

    /// Bytes held: the retained batches and the index.
    pub fn memory_size(&self) -> usize {
        self.retained_bytes + self.index.memory_size()
    }

    /// The input ended: sort the index (`scratch` grants or refuses the
    /// bytes of a counting sort, see [`EventIndex::sort`]).
    pub fn finish(&mut self, scratch: &mut dyn FnMut(usize) -> bool) {
        self.index.sort(scratch);
    }

    /// The kernel's next non-empty output (at most `batch_size` rows),
    /// feeding it at least [`GATHER_ENTRIES`] events at a time in index
    /// order, each gather ending with a whole key group; `None` once every
    /// event was folded.
    pub fn next_output(&mut self, batch_size: usize) -> Result<Option<RecordBatch>> {
        let batch_size = batch_size.max(1);
        loop {
            if let Some(out) = self.next_slice(batch_size) {
                return Ok(Some(out));
            }
            if self.next < self.index.len() {
                let at_least = batch_size.max(self.gather_entries);
                let mut window = std::mem::take(&mut self.window);
                self.next = self.index.window(self.next, at_least, &mut window);
                self.places.clear();
                match &self.grouping {
                    Some(grouping) => group_places(&window, grouping.groups, &mut self.places),
                    None => self
                        .places
                        .extend(window.iter().map(|e| (e.batch as usize, e.row as usize))),
                }
                self.window = window;
                let sources: Vec<&RecordBatch> = self.batches.iter().collect();
                let sorted = interleave_record_batch(&sources, &self.places)?;
                self.output = self.kernel.push(&sorted)?;
                continue;
            }
            if self.finished {
                return Ok(None);
            }
            self.finished = true;
            // every event is in the kernel: free them before its last output
            self.index.clear();
            self.batches = Vec::new();
            self.retained_bytes = 0;
            self.output = self.kernel.finish_all()?;
        }
    }

    /// The next at most `batch_size` rows of the kernel's last output.
    fn next_slice(&mut self, batch_size: usize) -> Option<RecordBatch> {
        let out = self.output.take()?;
        if out.num_rows() <= batch_size {
            return (out.num_rows() > 0).then_some(out);
        }
        let rest = out.slice(batch_size, out.num_rows() - batch_size);
        self.output = Some(rest);
        Some(out.slice(0, batch_size))
    }

    /// The retained event batches (each in its own index order), to sort
    /// them another way when memory runs short.
    pub fn into_batches(self) -> Vec<RecordBatch> {
        self.batches
    }

    /// What the kernel did so far.
    pub fn counts(&self) -> FoldCounts {
        self.kernel.counts()
    }

    /// The kernel's truncate watermark, once observed.
    pub fn watermark_value(&self) -> Option<&arrow::array::ArrayRef> {
        self.kernel.watermark_value()
    }

    /// Schema of the kernel's output.
    pub fn output_schema(&self) -> &SchemaRef {
        self.kernel.output_schema()
    }
}

/// The places of `entries` (tagged with their group, below `groups`),
/// grouped by group, each group in the entries' order: a stable counting
/// sort, into `places`.
fn group_places(entries: &[IndexEntry], groups: usize, places: &mut Vec<(usize, usize)>) {
    let mut starts = vec![0usize; groups + 1];
    for e in entries {
        starts[e.tag() as usize + 1] += 1;
    }
    for g in 1..=groups {
        starts[g] += starts[g - 1];
    }
    places.resize(entries.len(), (0, 0));
    for e in entries {
        let at = &mut starts[e.tag() as usize];
        places[*at] = (e.batch as usize, e.row as usize);
        *at += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::test_support::{del, fold, rows_by_kind, spec, up, Ev};
    use crate::fold::ScdType;

    /// Events of 12 keys at sequences 0..40, values and kinds a function of
    /// `(id, seq)` (so events at an equal sequence are replays), in the
    /// order a small generator gives them.
    fn events(seed: u64) -> Vec<Ev> {
        const VALUES: [&str; 3] = ["a", "b", "c"];
        let mut state = seed;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state >> 33
        };
        (0..150)
            .map(|_| {
                let (id, seq) = ((next() % 12) as i64, (next() % 40) as i64);
                let mix = (id * 7 + seq * 3) as usize;
                if mix.is_multiple_of(5) {
                    del(id, seq)
                } else {
                    up(id, VALUES[mix % 3], seq)
                }
            })
            .collect()
    }

    /// `events` cut into unsorted batches of `split` rows.
    fn unsorted(spec_: &crate::fold::FoldSpec, events: &[Ev], split: usize) -> Vec<RecordBatch> {
        events
            .chunks(split)
            .map(|chunk| {
                // (`batch` sorts each chunk; the chunks stay out of order)
                crate::fold::test_support::batch(&spec_.layout, chunk)
            })
            .collect()
    }

    #[test]
    fn folds_like_the_kernel_over_sorted_events() -> Result<()> {
        for stored_as in [ScdType::Type2, ScdType::Bitemporal] {
            let tracked = if stored_as == ScdType::Type2 {
                vec![1]
            } else {
                vec![]
            };
            let spec = spec(stored_as, tracked, None);
            for seed in 0..8 {
                let events = events(seed);
                let (expected, expected_counts) = fold(&spec, &events, None, 1000)?;
                let runs = [(7, 3, GATHER_ENTRIES), (7, 3, 1), (50, 8192, 5), (1, 1, 1)];
                for ((split, batch_size, gather), grouped) in
                    runs.into_iter().flat_map(|run| [(run, false), (run, true)])
                {
                    let batches = unsorted(&spec, &events, split);
                    let schema = batches[0].schema();
                    let mut fold = IndexSortedFold::try_new(
                        "f",
                        &spec.layout,
                        &schema,
                        spec.kernel(&schema)?,
                    )?
                    .with_gather_entries(gather);
                    if grouped {
                        fold = fold.with_groups(3, by_id_mod_3());
                    }
                    for batch in &batches {
                        fold.push(batch)?;
                    }
                    // (gathers of one entry sort in place, the others by counting)
                    fold.finish(&mut |_| gather > 1);
                    let mut out = Vec::new();
                    while let Some(batch) = fold.next_output(batch_size)? {
                        assert!(batch.num_rows() > 0 && batch.num_rows() <= batch_size);
                        out.push(batch);
                    }
                    assert_eq!(
                        rows_by_kind(&out),
                        rows_by_kind(&expected),
                        "{stored_as} seed {seed} split {split} gather {gather} grouped {grouped}"
                    );
                    assert_eq!(fold.counts(), expected_counts);
                    assert!(fold.next_output(batch_size)?.is_none());
                }
            }
        }
        Ok(())
    }

    /// Groups `id % 3` of the events' key column.
    fn by_id_mod_3() -> GroupOf {
        Arc::new(|batch: &RecordBatch| {
            use arrow::array::AsArray;
            let ids = batch
                .column(0)
                .as_primitive::<arrow::datatypes::Int64Type>();
            Ok(Int32Array::from_iter_values(
                ids.values().iter().map(|id| id.rem_euclid(3) as i32),
            ))
        })
    }

    /// Grouped gathers take each group's events in index order (a stable
    /// counting sort), and an event of a group past the count is refused.
    #[test]
    fn grouped_gathers_keep_index_order_within_each_group() -> Result<()> {
        let spec = spec(ScdType::Type2, vec![1], None);
        let events = events(3);
        let batches = unsorted(&spec, &events, 10);
        let schema = batches[0].schema();
        let mut fold = IndexSortedFold::try_new("f", &spec.layout, &schema, spec.kernel(&schema)?)?
            .with_groups(3, by_id_mod_3());
        for batch in &batches {
            fold.push(batch)?;
        }
        fold.finish(&mut |_| true);
        let entries = fold.index.sorted_entries();
        let mut places = Vec::new();
        group_places(&entries, 3, &mut places);
        let expected: Vec<(usize, usize)> = (0..3)
            .flat_map(|g| {
                entries
                    .iter()
                    .filter(move |e| e.tag() == g)
                    .map(|e| (e.batch as usize, e.row as usize))
            })
            .collect();
        assert_eq!(places, expected);
        assert!(entries.iter().any(|e| e.tag() == 2));
        let mut refused =
            IndexSortedFold::try_new("f", &spec.layout, &schema, spec.kernel(&schema)?)?
                .with_groups(2, by_id_mod_3());
        assert!(batches.iter().try_for_each(|b| refused.push(b)).is_err());
        Ok(())
    }
}
