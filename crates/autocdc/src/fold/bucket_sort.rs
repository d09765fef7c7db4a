//! An unstable sort by a `u128` key for large slices: one in-place bucket
//! pass on the key's high 64 bits (an American flag sort's first digit),
//! then a comparison sort of each bucket.
//!
//! The index sorts of the folds order millions of 48-byte entries per
//! partition; moving them, not comparing them, is what a comparison sort
//! spends its time on (sorting them by a `u64` instead of a `u128` takes as
//! long), and until its parts fit the cache every level of its recursion
//! moves them through memory. One bucket pass moves each entry once, into
//! at most 256 buckets of about [`BUCKET_ITEMS`] entries that fit the L2
//! cache; more buckets were slower (their 256 write positions are what the
//! caches and the TLB follow at once). The digit is taken from the span of
//! the keys present (`(high - min) >> shift`), so that dense integer keys
//! (`0..2 M`) spread as well as hashes do; a skewed key distribution leaves
//! large buckets, sorted as a whole as before: never more than one extra
//! pass.

/// Below this many items a plain comparison sort is as fast.
const MIN_BUCKETED: usize = 1 << 16;

/// Items per bucket aimed at (under 1 MiB of 48-byte entries).
const BUCKET_ITEMS: usize = 1 << 14;

/// At most 2^8 buckets.
const MAX_BUCKET_BITS: u32 = 8;

/// Sort `items` by `key` (unstable: items of equal keys in any order), as
/// `items.sort_unstable_by_key(key)` does.
pub fn sort_unstable_by_u128<T: Copy>(items: &mut [T], key: impl Fn(&T) -> u128) {
    let n = items.len();
    if n < MIN_BUCKETED {
        items.sort_unstable_by_key(&key);
        return;
    }
    let high = |t: &T| (key(t) >> 64) as u64;
    let (min, max) = items.iter().fold((u64::MAX, 0), |(lo, hi), t| {
        let h = high(t);
        (lo.min(h), hi.max(h))
    });
    let span_bits = 64 - (max - min).leading_zeros();
    if span_bits == 0 {
        items.sort_unstable_by_key(&key);
        return;
    }
    let bits = (n / BUCKET_ITEMS)
        .max(2)
        .ilog2()
        .clamp(1, MAX_BUCKET_BITS)
        .min(span_bits);
    let shift = span_bits - bits;
    // monotone in the key, and < 2^bits since max - min < 2^span_bits
    let bucket = |t: &T| ((high(t) - min) >> shift) as usize;
    let buckets = 1usize << bits;

    let mut bounds = vec![0usize; buckets + 1];
    for t in items.iter() {
        bounds[bucket(t) + 1] += 1;
    }
    for b in 0..buckets {
        bounds[b + 1] += bounds[b];
    }
    // Place every item in its bucket by cycles of swaps: bucket `b`'s
    // items before `next[b]` are in place. Buckets before `b` are full when
    // `b` is filled, so the item carried always belongs to a bucket with room.
    let mut next = bounds[..buckets].to_vec();
    for b in 0..buckets {
        while next[b] < bounds[b + 1] {
            let mut item = items[next[b]];
            let mut to = bucket(&item);
            while to != b {
                std::mem::swap(&mut item, &mut items[next[to]]);
                next[to] += 1;
                to = bucket(&item);
            }
            items[next[b]] = item;
            next[b] += 1;
        }
    }
    for b in 0..buckets {
        items[bounds[b]..bounds[b + 1]].sort_unstable_by_key(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: u64) -> impl FnMut() -> u64 {
        let mut state = seed;
        move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state
        }
    }

    /// A key from a random number and the item's place.
    type Shape = Box<dyn Fn(u64, usize) -> u128>;

    /// Sorted like the standard library's sort, whatever the keys' spread.
    #[test]
    fn orders_like_the_standard_sort() {
        let n = MIN_BUCKETED * 3 + 17;
        let mut next = lcg(11);
        let shapes: Vec<(&str, Shape)> = vec![
            (
                "hashes",
                Box::new(|r, _| u128::from(r) << 64 | u128::from(r % 7)),
            ),
            (
                "dense",
                Box::new(|r, _| u128::from(r % 2000) << 64 | u128::from(r >> 60)),
            ),
            ("one key", Box::new(|r, _| 5u128 << 64 | u128::from(r))),
            ("low bits only", Box::new(|r, _| u128::from(r))),
            (
                "skewed",
                Box::new(|r, i| {
                    let high = if i % 1000 == 0 {
                        u64::MAX - r % 3
                    } else {
                        r % 50
                    };
                    u128::from(high) << 64 | u128::from(r % 3)
                }),
            ),
            ("two values", Box::new(|r, _| u128::from(r % 2) << 127)),
        ];
        for (shape, key) in shapes {
            let items: Vec<(u128, u32)> = (0..n).map(|i| (key(next(), i), i as u32)).collect();
            let mut ours = items.clone();
            sort_unstable_by_u128(&mut ours, |t| t.0);
            let mut expected = items.clone();
            expected.sort_unstable_by_key(|t| t.0);
            let keys = |v: &[(u128, u32)]| v.iter().map(|t| t.0).collect::<Vec<_>>();
            assert_eq!(keys(&ours), keys(&expected), "{shape}");
            let mut payloads: Vec<u32> = ours.iter().map(|t| t.1).collect();
            payloads.sort_unstable();
            assert!(
                payloads.iter().enumerate().all(|(i, &p)| p == i as u32),
                "{shape}"
            );
        }
    }

    #[test]
    fn small_and_empty_slices() {
        let mut empty: Vec<(u128, u8)> = Vec::new();
        sort_unstable_by_u128(&mut empty, |t| t.0);
        let mut few = vec![(3u128, 0u8), (1, 1), (2, 2)];
        sort_unstable_by_u128(&mut few, |t| t.0);
        assert_eq!(few, vec![(1, 1), (2, 2), (3, 0)]);
    }
}
