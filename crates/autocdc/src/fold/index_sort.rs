//! Sorting the indexed engines' entries by their integer sort keys.
//!
//! The indexed SCD 1 fold and the indexed snapshot diff sort one entry per
//! row (32–48 bytes) by keys that are order-preserving `u128`s (row-format
//! bytes read big-endian). A comparison sort of those entries spent ~10 % of
//! a 10 M-event load in `quicksort`, moving wide entries and comparing
//! tuples of `u128`s. Usually few bits of the keys vary (a 64-bit key over
//! 2 M values varies in 21 of its 128 bits): [`Packing`] keeps only the
//! window of bits that varies in each component and concatenates them into
//! one `u64` that orders like the tuple; [`sort_packed`] then sorts
//! `(u64, position)` pairs with a stable LSD radix sort ([`radix_order`]),
//! skipping digits that are equal everywhere, and permutes the entries in
//! place. When the varying bits do not fit in 64 the engines keep their
//! comparison sort.
//!
//! ```text
//!  components (u128 …) ─► AND / OR of each ─► varying window per component
//!        ─► packed u64 per entry ─► LSD radix (11-bit digits) ─► permutation
//! ```

/// The bits of each sort-key component that vary over a set of entries,
/// packed into one `u64` (most significant component first).
#[derive(Debug, Clone)]
pub struct Packing {
    /// Per component: (shift right, width) of its varying window.
    windows: Vec<(u32, u32)>,
    /// Total packed width in bits.
    bits: u32,
}

impl Packing {
    /// The packing of components whose bitwise AND / OR over all entries are
    /// `ranges[i] = (and, or)`; `None` when the varying bits exceed 64.
    pub fn new(ranges: &[(u128, u128)]) -> Option<Self> {
        let mut windows = Vec::with_capacity(ranges.len());
        let mut bits = 0u32;
        for &(and, or) in ranges {
            let varying = and ^ or;
            let window = if varying == 0 {
                (0, 0)
            } else {
                let shift = varying.trailing_zeros();
                (shift, 128 - varying.leading_zeros() - shift)
            };
            bits += window.1;
            windows.push(window);
        }
        (bits <= 64).then_some(Self { windows, bits })
    }

    /// Packed width in bits.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// The packed key of one entry's components (as many as the packing's).
    /// Bits outside a component's window are equal in every entry, so the
    /// packed keys order like the component tuples.
    #[inline]
    pub fn pack(&self, components: &[u128]) -> u64 {
        let mut packed = 0u64;
        for (&value, &(shift, width)) in components.iter().zip(&self.windows) {
            if width == 0 {
                continue;
            }
            let part = ((value >> shift) & ((1u128 << width) - 1)) as u64;
            packed = if width == 64 {
                part
            } else {
                (packed << width) | part
            };
        }
        packed
    }
}

/// The positions of `items` (packed key, position) in ascending key
/// order, equal keys in their original order: a stable LSD radix sort over
/// the low `bits` bits (digits equal in every key are skipped).
pub fn radix_order(mut current: Vec<(u64, u32)>, bits: u32) -> Vec<u32> {
    const DIGIT: u32 = 11;
    const BUCKETS: usize = 1 << DIGIT;
    let n = current.len();
    let mut next = vec![(0u64, 0u32); n];
    let mut counts = vec![0usize; BUCKETS];
    for pass in 0..bits.div_ceil(DIGIT) {
        let shift = pass * DIGIT;
        let digit = |k: u64| ((k >> shift) as usize) & (BUCKETS - 1);
        counts.iter_mut().for_each(|c| *c = 0);
        for &(k, _) in &current {
            counts[digit(k)] += 1;
        }
        if counts.contains(&n) {
            continue; // one digit value everywhere: already in order
        }
        let mut offset = 0;
        for c in counts.iter_mut() {
            let count = *c;
            *c = offset;
            offset += count;
        }
        for &item in &current {
            let d = digit(item.0);
            next[counts[d]] = item;
            counts[d] += 1;
        }
        std::mem::swap(&mut current, &mut next);
    }
    drop(next);
    current.into_iter().map(|(_, i)| i).collect()
}

/// Sort `items` by `packing` of their components (`components(item)`) when
/// it fits; `false` (nothing done) otherwise. Needs 16 bytes per item for
/// the sort and 4 for the order, then permutes `items` in place.
pub fn sort_packed<T: Copy, const N: usize>(
    items: &mut [T],
    components: impl Fn(&T) -> [u128; N],
) -> bool {
    let mut ranges = [(!0u128, 0u128); N];
    for item in items.iter() {
        for (range, value) in ranges.iter_mut().zip(components(item)) {
            *range = (range.0 & value, range.1 | value);
        }
    }
    let Some(packing) = Packing::new(&ranges) else {
        return false;
    };
    let keyed = items
        .iter()
        .enumerate()
        .map(|(i, item)| (packing.pack(&components(item)), i as u32))
        .collect();
    let order = radix_order(keyed, packing.bits());
    permute(items, order);
    true
}

/// `items[i] = old items[order[i]]` for every `i`, in place (following the
/// permutation's cycles).
fn permute<T: Copy>(items: &mut [T], mut order: Vec<u32>) {
    const DONE: u32 = u32::MAX;
    for start in 0..items.len() {
        if order[start] == DONE {
            continue;
        }
        let first = items[start];
        let mut pos = start;
        loop {
            let source = order[pos] as usize;
            order[pos] = DONE;
            if source == start {
                items[pos] = first;
                break;
            }
            items[pos] = items[source];
            pos = source;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift).
    fn numbers(seed: u64) -> impl FnMut() -> u64 {
        let mut state = seed | 1;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    /// Packed radix order = comparison sort of the tuples, for components
    /// that are constant, narrow, placed high in the `u128` (like row-format
    /// keys) or wide, with ties kept in input order.
    #[test]
    fn radix_order_of_packed_keys_equals_sorting_the_tuples() {
        let mut next = numbers(42);
        for case in 0..200u64 {
            let n = (next() % 3000) as usize;
            let key_bits = next() % 40;
            let seq_bits = next() % 24;
            let key_shift = [0, 40, 88][(case % 3) as usize];
            let entries: Vec<(u128, u128, u128, usize)> = (0..n)
                .map(|i| {
                    let key =
                        ((next() & ((1 << key_bits) - 1)) as u128) << key_shift | (1u128 << 127);
                    let seq = (next() & ((1 << seq_bits) - 1)) as u128;
                    let origin = if case % 2 == 0 {
                        1
                    } else {
                        (next() % 2) as u128
                    };
                    (key, seq, origin, i)
                })
                .collect();
            let mut sorted = entries.clone();
            assert!(sort_packed(&mut sorted, |e| [e.0, e.1, e.2]));
            let mut expected = entries.clone();
            expected.sort_by_key(|e| (e.0, e.1, e.2, e.3));
            assert_eq!(sorted, expected, "case {case}");
        }
    }

    #[test]
    fn wide_components_do_not_pack() {
        let mut items = [(u128::MAX, 0u128), (0, 0), (0, 7)];
        assert!(!sort_packed(&mut items, |e| [e.0, e.1]));
        assert_eq!(items, [(u128::MAX, 0u128), (0, 0), (0, 7)]);
        let mut items = [u64::MAX as u128, 0, 5];
        assert!(sort_packed(&mut items, |e| [*e]));
        assert_eq!(items, [0, 5, u64::MAX as u128]);
        let ranges = [(0u128, u64::MAX as u128), (0u128, 1u128)];
        assert!(Packing::new(&ranges).is_none());
        let ranges = [(0u128, u64::MAX as u128)];
        assert_eq!(Packing::new(&ranges).map(|p| p.bits()), Some(64));
    }
}
