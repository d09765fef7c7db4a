//! Ordering entries by key without comparing them: a counting sort over
//! *key slots*, for keys held as order-preserving integers (the event
//! index's value bytes) whose values lie close together, as generated ids
//! do.
//!
//! ```text
//!  keys seen      KeySpan { lo, hi, bits }      SlotPlan::new(span, n)
//!  (min, max, OR) ──────────────────────────► one slot per value a key can
//!                                              take: (k - lo) >> shift, at
//!                                              most SLOTS_PER_ENTRY per entry
//!  SlotPlan::order(entries)
//!    pass 1: count the entries of each slot, then turn counts into places
//!    pass 2: write each entry's position at its slot's next place
//!  ─► positions grouped by key, keys ascending, each key's in entry order
//! ```
//!
//! The entries themselves stay where they are: the order takes 4 bytes per
//! entry and the counts 4 bytes per slot ([`SlotPlan::scratch_bytes`]), which
//! the caller asks its memory pool for. Keys spread wider get no plan: slots
//! shared by several keys, each slot's entries sorted after, were slower
//! than sorting, and moving the entries to a second array instead of
//! writing an order gained too little for its memory (benches/README.md,
//! "tried").

use std::ops::Range;

/// Most key slots a plan may use per entry (beyond [`SLOTS_ANY`]): the
/// counts then take at most 16 bytes per entry, and visiting the slots
/// costs about what placing an entry does.
pub const SLOTS_PER_ENTRY: usize = 4;

/// Key slots a plan may use however few the entries.
const SLOTS_ANY: usize = 1 << 12;

/// The least and greatest of some keys, and the bits set in any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpan {
    lo: u64,
    hi: u64,
    bits: u64,
}

impl KeySpan {
    /// The span of `keys` (`None` when there are none).
    pub fn of(keys: &[u64]) -> Option<Self> {
        Some(Self {
            lo: *keys.iter().min()?,
            hi: *keys.iter().max()?,
            bits: keys.iter().fold(0, |bits, &k| bits | k),
        })
    }

    /// `span` joined with `other`: the span of both's keys, either possibly
    /// unknown.
    pub fn join(span: Option<Self>, other: Option<Self>) -> Option<Self> {
        match (span, other) {
            (Some(a), Some(b)) => Some(Self {
                lo: a.lo.min(b.lo),
                hi: a.hi.max(b.hi),
                bits: a.bits | b.bits,
            }),
            (a, b) => a.or(b),
        }
    }
}

/// Where a counting sort places keys: key `k` counts in slot
/// `(k - lo) >> shift` of `slots`. Every key has `shift` low zero bits
/// (values are left-aligned in their integers), so distinct keys take
/// distinct slots, in key order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotPlan {
    lo: u64,
    shift: u32,
    slots: usize,
}

impl SlotPlan {
    /// A plan for `entries` entries whose keys span `span`, when they are
    /// close enough (at most [`SLOTS_PER_ENTRY`] slots per entry) and their
    /// positions fit 32 bits.
    pub fn new(span: KeySpan, entries: usize) -> Option<Self> {
        u32::try_from(entries).ok()?;
        let shift = span.bits.trailing_zeros().min(63);
        let slots = usize::try_from((span.hi - span.lo) >> shift)
            .ok()?
            .checked_add(1)?;
        let most = entries.saturating_mul(SLOTS_PER_ENTRY).max(SLOTS_ANY);
        (slots <= most).then_some(Self {
            lo: span.lo,
            shift,
            slots,
        })
    }

    /// Bytes [`Self::order`] holds for `entries` entries: the order and the
    /// counts.
    pub fn scratch_bytes(&self, entries: usize) -> usize {
        (entries + self.slots) * std::mem::size_of::<u32>()
    }

    /// The slot of `key` (a key of the span the plan was made for).
    fn slot(&self, key: u64) -> usize {
        ((key - self.lo) >> self.shift) as usize
    }

    /// The positions of `entries` grouped by `key`, keys ascending, each
    /// key's positions ascending. Every key must lie in the plan's span.
    pub fn order<T>(&self, entries: &[T], key: impl Fn(&T) -> u64) -> Vec<u32> {
        self.order_runs(entries, std::slice::from_ref(&(0..entries.len())), key)
    }

    /// [`Self::order`] of the positions in `runs` (ranges of positions, each
    /// position in one at most), each key's positions in the order of the
    /// runs, ascending within each. Positions in no run are left out.
    pub fn order_runs<T>(
        &self,
        entries: &[T],
        runs: &[Range<usize>],
        key: impl Fn(&T) -> u64,
    ) -> Vec<u32> {
        let runs = || {
            runs.iter()
                .filter_map(|run| Some((run.start, entries.get(run.clone())?)))
        };
        // each slot's count, then where its first position goes
        let mut next = vec![0u32; self.slots];
        let mut held = 0;
        for (_, run) in runs() {
            for e in run {
                next[self.slot(key(e))] += 1;
            }
            held += run.len();
        }
        let mut at = 0;
        for place in &mut next {
            (*place, at) = (at, at + *place);
        }
        let mut order = vec![0u32; held];
        for (start, run) in runs() {
            // (positions fit 32 bits: checked by `new`)
            for (position, e) in (start as u32..).zip(run) {
                let place = &mut next[self.slot(key(e))];
                order[*place as usize] = position;
                *place += 1;
            }
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order is a stable sort by key, with and without common low zero
    /// bits; keys too far apart get no plan.
    #[test]
    fn the_order_is_a_stable_sort_by_key() {
        let mut next = crate::fold::test_support::below(11);
        for shift in [0u32, 8, 48] {
            let keys: Vec<u64> = (0..500).map(|_| (1000 + next(300)) << shift).collect();
            let plan = SlotPlan::new(KeySpan::of(&keys).unwrap(), keys.len()).unwrap();
            assert!(plan.slots <= 300, "shift {shift}: {plan:?}");
            let order = plan.order(&keys, |&k| k);
            let mut expected: Vec<u32> = (0..500).collect();
            expected.sort_by_key(|&i| keys[i as usize]);
            assert_eq!(order, expected, "shift {shift}");
        }
        let far = [1u64, 1 << 40];
        assert_eq!(SlotPlan::new(KeySpan::of(&far).unwrap(), 2), None);
        assert_eq!(KeySpan::of(&[]), None);
    }

    /// Spans join as the spans of all their keys.
    #[test]
    fn spans_join() {
        let a = KeySpan::of(&[4, 6]);
        let b = KeySpan::of(&[3]);
        assert_eq!(KeySpan::join(a, b), KeySpan::of(&[3, 4, 6]));
        assert_eq!(KeySpan::join(None, b), b);
        assert_eq!(KeySpan::join(a, None), a);
        let plan = SlotPlan::new(KeySpan::of(&[3, 4, 6]).unwrap(), 3).unwrap();
        assert_eq!(plan.scratch_bytes(3), 4 * (3 + 4));
    }

    /// Ordered by runs, each key's positions follow the runs' order: a
    /// stable sort by key of the runs' positions, taken run after run.
    #[test]
    fn runs_order_each_keys_positions() {
        let mut next = crate::fold::test_support::below(5);
        let keys: Vec<u64> = (0..400).map(|_| 100 + next(40)).collect();
        let plan = SlotPlan::new(KeySpan::of(&keys).unwrap(), keys.len()).unwrap();
        for runs in [
            std::iter::once(0..400).collect(),
            vec![300..400, 0..100, 200..300, 100..200],
            vec![350..400, 0..350],
            vec![10..20, 0..0, 30..40],
        ] {
            let mut model: Vec<u32> = runs
                .iter()
                .flat_map(|r| r.start as u32..r.end as u32)
                .collect();
            model.sort_by_key(|&p| keys[p as usize]);
            assert_eq!(plan.order_runs(&keys, &runs, |&k| k), model, "{runs:?}");
        }
    }
}
