//! Each key's latest event in one pass over the index, without ordering
//! it: the SCD 1 fold of new events whose keys lie close together (no
//! stored rows: a first load, a query).
//!
//! An SCD 1 fold of new events keeps each key's event of greatest
//! sequence, and must still meet every pair of events of one key and
//! sequence (a replay is dropped, a conflict fails the fold, SPEC §2.2).
//! Ordering every event by key and sequence finds both, but costs a
//! scatter and a gather of every entry (the counting sort, then its
//! windows). This pass reads the entries once, input partition after input
//! partition in the order [`EventIndex::sort`] uses, and keeps one 16-byte
//! slot per key ([`SlotPlan`]):
//!
//! | event of a key, in pass order          | slot                                             |
//! |----------------------------------------|--------------------------------------------------|
//! | first                                  | holds it                                         |
//! | sequence above the slot's              | holds it instead                                 |
//! | sequence equal to the slot's           | a pair to check (first copy, this one)           |
//! | sequence below the slot's              | the key is *unordered*: folded from its events   |
//!
//! A key whose events came in ascending sequence order (replays aside) met
//! each of its equal pairs at the slot: its latest event and those pairs are
//! all its fold needs. An unordered key may hold equal pairs the slot never
//! saw; its events are taken out in a second pass and ordered by sequence,
//! as a sort would have, and folded whole. Sources that deliver most keys
//! in order (a change feed read in sequence order, some events late) leave
//! few unordered keys; when they are more than one event in
//! [`LEFTOVER_SHARE`], the pass gives up and the index is sorted instead.
//!
//! [`LatestWalk::next`] then hands out the keys in key order, as a walk of
//! the sorted index would: a key's group (its latest event alone, or an
//! unordered key's events by sequence) and the pairs the slot met.

use std::hint::select_unpredictable;
use std::ops::Range;

use super::columns::Origin;
use super::event_index::IndexEntry;
use super::key_slots::SlotPlan;
use super::pairs::Pair;

/// At most one entry in this many may belong to unordered keys: past
/// that, ordering the whole index costs less than the pass.
pub const LEFTOVER_SHARE: usize = 8;

/// One key's place in the pass: its latest event met, as much of it as a
/// fold reads (the origin is [`Origin::New`]), in 16 bytes: its sequence,
/// its place and kind (the kind in the top two bits of the batch, see
/// [`LatestWalk::try_new`]), so that handing it out reads no entry again.
#[derive(Debug, Clone, Copy)]
struct Slot {
    seq: u64,
    kind_batch: u32,
    row: u32,
}

impl Slot {
    /// A slot no event reached yet.
    const EMPTY: Self = Self {
        seq: 0,
        kind_batch: u32::MAX,
        row: 0,
    };

    fn of(e: &IndexEntry) -> Self {
        Self {
            seq: e.seq,
            kind_batch: (e.kind as u32 & 3) << BATCH_BITS | e.batch,
            row: e.row,
        }
    }

    fn is_empty(&self) -> bool {
        self.kind_batch == u32::MAX
    }

    fn batch(&self) -> u32 {
        self.kind_batch & ((1 << BATCH_BITS) - 1)
    }

    fn entry(&self, key: u64) -> IndexEntry {
        let kind = (self.kind_batch >> BATCH_BITS) as i8;
        IndexEntry::new(
            key,
            self.seq,
            [self.batch(), self.row],
            Origin::New as i8,
            kind,
        )
    }
}

/// Bits a [`Slot`] keeps of a batch number.
const BATCH_BITS: u32 = 30;

/// Bits of a bit set over the slots.
#[derive(Debug)]
struct SlotBits(Vec<u64>);

impl SlotBits {
    fn new(slots: usize) -> Self {
        Self(vec![0; slots.div_ceil(64)])
    }

    fn get(&self, slot: usize) -> bool {
        self.0[slot / 64] & (1 << (slot % 64)) != 0
    }

    fn set(&mut self, slot: usize) {
        self.0[slot / 64] |= 1 << (slot % 64);
    }

    fn bytes(slots: usize) -> usize {
        slots.div_ceil(64) * 8
    }
}

/// Each key's latest event, handed out in key order (see the module docs).
#[derive(Debug)]
pub struct LatestWalk {
    plan: SlotPlan,
    slots: Vec<Slot>,
    unordered: SlotBits,
    /// The unordered keys' events, by key, then sequence and origin (each
    /// key's equal events in pass order).
    leftovers: Vec<IndexEntry>,
    /// Pairs met at the slots of keys left ordered, by slot (each slot's in
    /// pass order), and the slot of each.
    pairs: Vec<Pair>,
    pair_slots: Vec<u32>,
    /// The next slot, leftover and pair to hand out.
    next_slot: usize,
    next_leftover: usize,
    next_pair: usize,
    /// The group handed out for an ordered key (one entry).
    latest: Vec<IndexEntry>,
}

impl LatestWalk {
    /// Bytes the pass holds beside the entries, at most, for `entries`
    /// entries over `plan`'s slots: the slots, the set of unordered keys
    /// and the leftovers it may take out. (The pairs, one per replay, are
    /// not counted: a sorted walk collects them too.)
    pub fn scratch_bytes(plan: &SlotPlan, entries: usize) -> usize {
        plan.slots() * std::mem::size_of::<Slot>()
            + SlotBits::bytes(plan.slots())
            + entries / LEFTOVER_SHARE * std::mem::size_of::<IndexEntry>()
    }

    /// The pass over `entries` taken run by run (each position in one run
    /// at most; every entry's key in `plan`'s span); `None` when too many
    /// keys are unordered (see the module docs).
    pub fn try_new(entries: &[IndexEntry], runs: &[Range<usize>], plan: &SlotPlan) -> Option<Self> {
        // (kinds take two bits, batch numbers the rest: see `Slot`)
        let kinds_fit = |e: &IndexEntry| (0..=2).contains(&e.kind) && e.batch < 1 << BATCH_BITS;
        if !entries
            .iter()
            .all(|e| e.origin == Origin::New as i8 && kinds_fit(e))
        {
            return None;
        }
        let mut slots = vec![Slot::EMPTY; plan.slots()];
        let mut unordered = SlotBits::new(plan.slots());
        let mut pairs: Vec<(u32, Pair)> = Vec::new();
        let total: usize = runs.iter().map(|r| r.len()).sum();
        let most = total / LEFTOVER_SHARE;
        // keys turned unordered (each holds two events at least)
        let mut unordered_keys = 0usize;
        for run in runs {
            let Some(run_entries) = entries.get(run.clone()) else {
                continue;
            };
            for e in run_entries {
                let s = plan.slot(e.key);
                let slot = &mut slots[s];
                // without a branch on what the slot held, so that the
                // misses of consecutive events overlap
                let newer = slot.is_empty() | (e.seq > slot.seq);
                *slot = select_unpredictable(newer, Slot::of(e), *slot);
                if newer || unordered.get(s) {
                    continue;
                }
                if e.seq == slot.seq {
                    pairs.push((s as u32, [slot.batch(), slot.row, e.batch, e.row]));
                } else {
                    unordered.set(s);
                    unordered_keys += 1;
                    if 2 * unordered_keys > most {
                        return None;
                    }
                }
            }
        }
        let mut leftovers: Vec<IndexEntry> = Vec::with_capacity(2 * unordered_keys);
        if unordered_keys > 0 {
            let run_entries = runs
                .iter()
                .flat_map(|run| entries.get(run.clone()).unwrap_or_default());
            for e in run_entries.filter(|e| unordered.get(plan.slot(e.key))) {
                if leftovers.len() == most {
                    return None;
                }
                leftovers.push(*e);
            }
            // stable: a key's equal events stay in pass order
            leftovers.sort_by_key(|e| (e.key, e.seq, e.origin));
            pairs.retain(|(s, _)| !unordered.get(*s as usize));
        }
        // stable: a slot's pairs stay in pass order, which is their
        // sequence order
        pairs.sort_by_key(|(s, _)| *s);
        let (pair_slots, pairs) = pairs.into_iter().unzip();
        Some(Self {
            plan: *plan,
            slots,
            unordered,
            leftovers,
            pairs,
            pair_slots,
            next_slot: 0,
            next_leftover: 0,
            next_pair: 0,
            latest: Vec::with_capacity(1),
        })
    }

    /// The next key, in key order: its group (the latest event alone, or an
    /// unordered key's events by sequence and origin) and the equal pairs
    /// met at its slot (none for an unordered key: its group holds them);
    /// `None` after the last.
    pub fn next(&mut self) -> Option<(&[IndexEntry], &[Pair])> {
        let (s, slot) = self
            .slots
            .iter()
            .enumerate()
            .skip(self.next_slot)
            .find(|(_, slot)| !slot.is_empty())
            .map(|(s, slot)| (s, *slot))?;
        self.next_slot = s + 1;
        if self.unordered.get(s) {
            let start = self.next_leftover;
            let key = self.leftovers.get(start)?.key;
            let end = start
                + self.leftovers[start..]
                    .iter()
                    .take_while(|e| e.key == key)
                    .count();
            self.next_leftover = end;
            return Some((&self.leftovers[start..end], &[]));
        }
        self.latest.clear();
        self.latest.push(slot.entry(self.plan.key(s)));
        let start = self.next_pair;
        let end = start
            + self.pair_slots[start..]
                .iter()
                .take_while(|&&p| p as usize == s)
                .count();
        self.next_pair = end;
        Some((&self.latest, &self.pairs[start..end]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::key_slots::KeySpan;
    use crate::fold::pairs::pair;

    /// What the walk hands out for one key: its group's `(seq, row)`s and
    /// its pairs.
    type Handed = (u64, Vec<(u64, u32)>, Vec<Pair>);

    /// Every key the walk hands out, in order.
    fn walk(entries: &[IndexEntry], runs: &[Range<usize>]) -> Option<Vec<Handed>> {
        let keys: Vec<u64> = entries.iter().map(|e| e.key).collect();
        let plan = SlotPlan::new(KeySpan::of(&keys)?, keys.len())?;
        let mut walk = LatestWalk::try_new(entries, runs, &plan)?;
        let mut out = Vec::new();
        while let Some((group, pairs)) = walk.next() {
            let seqs = group.iter().map(|e| (e.seq, e.row)).collect();
            out.push((group[0].key, seqs, pairs.to_vec()));
        }
        Some(out)
    }

    /// The model: each key's events in run order; if no event's sequence
    /// is below one met before it, the key's latest event (the first of its
    /// greatest sequence) and a pair for every later copy of a sequence;
    /// otherwise all its events, by sequence (stable).
    fn model(entries: &[IndexEntry], runs: &[Range<usize>]) -> Vec<Handed> {
        let in_order: Vec<IndexEntry> = runs
            .iter()
            .flat_map(|r| entries[r.clone()].iter().copied())
            .collect();
        let mut keys: Vec<u64> = in_order.iter().map(|e| e.key).collect();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .map(|key| {
                let mine: Vec<IndexEntry> =
                    in_order.iter().filter(|e| e.key == key).copied().collect();
                let ordered = mine.windows(2).all(|w| {
                    let most = mine.iter().take_while(|e| !std::ptr::eq(*e, &w[1]));
                    most.map(|e| e.seq).max().is_none_or(|m| w[1].seq >= m)
                });
                if ordered {
                    let top = mine.iter().map(|e| e.seq).max().unwrap_or(0);
                    let first = mine.iter().find(|e| e.seq == top).copied();
                    let mut pairs = Vec::new();
                    for (i, e) in mine.iter().enumerate() {
                        if let Some(f) = mine[..i].iter().find(|f| f.seq == e.seq) {
                            pairs.push(pair(f, e));
                        }
                    }
                    let first = first.map(|e| vec![(e.seq, e.row)]).unwrap_or_default();
                    (key, first, pairs)
                } else {
                    let mut all: Vec<(u64, u32)> = mine.iter().map(|e| (e.seq, e.row)).collect();
                    all.sort_by_key(|&(seq, _)| seq);
                    (key, all, Vec::new())
                }
            })
            .collect()
    }

    /// Keys met in and out of sequence order, replays among them, read in
    /// runs in several orders: the walk hands out what the model says, or
    /// gives up when more than one entry in `LEFTOVER_SHARE` belongs to an
    /// unordered key.
    #[test]
    fn the_walk_hands_out_what_the_model_says() {
        let mut next = crate::fold::test_support::below(23);
        let (mut walked, mut gave_up) = (0, 0);
        for round in 0..400 {
            let n = 1 + next(120) as usize;
            let keys = 1 + next(40);
            let late = [0, 2, 10, 50][round % 4];
            let entries: Vec<IndexEntry> = (0..n)
                .map(|i| {
                    let seq = if next(100) < late {
                        next(i as u64 + 1)
                    } else {
                        i as u64
                    };
                    IndexEntry::new_upsert(100 + next(keys) * 8, seq, i as u32)
                })
                .collect();
            let cut = next(n as u64 + 1) as usize;
            for runs in [std::iter::once(0..n).collect(), vec![cut..n, 0..cut]] {
                let model = model(&entries, &runs);
                let leftover: usize = model
                    .iter()
                    .filter(|(key, group, _)| {
                        let all = entries.iter().filter(|e| e.key == *key).count();
                        group.len() == all && all > 1 && model_unordered(&entries, &runs, *key)
                    })
                    .map(|(_, group, _)| group.len())
                    .sum();
                match walk(&entries, &runs) {
                    Some(got) => {
                        walked += 1;
                        assert_eq!(got, model, "round {round} runs {runs:?}");
                    }
                    None => {
                        gave_up += 1;
                        assert!(
                            leftover > n / LEFTOVER_SHARE,
                            "round {round}: {leftover} of {n}"
                        );
                    }
                }
            }
        }
        assert!(
            walked > 100 && gave_up > 10,
            "walked {walked}, gave up {gave_up}"
        );
    }

    /// Whether some event of `key` comes, in run order, after one of
    /// greater sequence.
    fn model_unordered(entries: &[IndexEntry], runs: &[Range<usize>], key: u64) -> bool {
        let seqs: Vec<u64> = runs
            .iter()
            .flat_map(|r| entries[r.clone()].iter())
            .filter(|e| e.key == key)
            .map(|e| e.seq)
            .collect();
        seqs.iter()
            .enumerate()
            .any(|(i, s)| seqs[..i].iter().any(|m| m > s))
    }
}
