//! SCD TYPE 1: updates apply one after the other; inside an
//! update, events apply one at a time in sequence order (a TRUNCATE after the
//! key events of its sequence).

use std::collections::BTreeMap;

use super::{Event, Kind, Partial, Row};

/// Stored state: per key the row (`None` = tombstone) and its sequence, and
/// the truncate watermark.
#[derive(Debug, Default)]
pub struct Scd1 {
    keys: BTreeMap<i32, (Option<Row>, i32)>,
    watermark: Option<i32>,
}

impl Scd1 {
    /// Apply one update.
    pub fn apply(&mut self, update: &[Event], partial: Partial) {
        let mut events = update.to_vec();
        events.sort_by_key(|e| (e.seq, e.kind == Kind::Truncate));
        for e in events {
            if e.kind == Kind::Truncate {
                self.keys.retain(|_, (_, seq)| *seq > e.seq);
                self.watermark = self.watermark.max(Some(e.seq));
                continue;
            }
            let stored = self.keys.get(&e.id);
            let late = stored.is_some_and(|(_, seq)| *seq >= e.seq)
                || self.watermark.is_some_and(|w| e.seq <= w);
            if late {
                continue;
            }
            let live = stored.and_then(|(row, _)| *row);
            let row = match e.kind {
                Kind::Delete => None,
                _ => Some(partial.merge(live, &e)),
            };
            self.keys.insert(e.id, (row, e.seq));
        }
    }

    /// Visible rows: `(id, a, b)`, sorted.
    pub fn rows(&self) -> Vec<(i32, Option<i32>, Option<i32>)> {
        self.keys
            .iter()
            .filter_map(|(id, (row, _))| row.map(|r| (*id, r[0], r[1])))
            .collect()
    }
}
