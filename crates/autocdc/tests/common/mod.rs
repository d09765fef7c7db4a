//! Helpers shared by the integration tests (each test file uses some).
#![allow(dead_code)]

pub mod observed_store;

use proptest::sample::Index;

/// Shuffle `events` deterministically by `order` (xorshift), then split them
/// into consecutive updates at the `cuts`.
pub fn shuffle_and_split<T: Clone>(events: &[T], order: u64, cuts: &[Index]) -> Vec<Vec<T>> {
    let mut shuffled = events.to_vec();
    let mut state = order | 1;
    for i in (1..shuffled.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        shuffled.swap(i, (state % (i as u64 + 1)) as usize);
    }
    let mut points: Vec<usize> = cuts.iter().map(|c| c.index(shuffled.len() + 1)).collect();
    points.sort_unstable();
    let mut updates = Vec::new();
    let mut start = 0;
    for p in points.into_iter().chain([shuffled.len()]) {
        updates.push(shuffled[start..p.max(start)].to_vec());
        start = p.max(start);
    }
    updates
}

/// Run `sql` to completion, panicking with the statement and the error.
pub async fn exec(s: &datafusion_autocdc::CdcSession, sql: &str) {
    s.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}
