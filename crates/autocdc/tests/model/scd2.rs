//! SCD TYPE 2: the history is a function of the set of
//! events: per key, sort the distinct events, merge partial updates (an
//! upsert after a delete starts from nothing), then open, close or update
//! versions by the tracked columns.

use std::collections::{BTreeMap, BTreeSet};

use super::{Event, Kind, Partial, Row};

/// A version: `(id, a, b, start, end)`.
pub type Version = (i32, Option<i32>, Option<i32>, i32, Option<i32>);

/// The versions of all keys; `tracked[c]`: column `c` is tracked.
pub fn history(events: &[Event], partial: Partial, tracked: [bool; 2]) -> Vec<Version> {
    let mut by_key: BTreeMap<i32, BTreeMap<i32, Event>> = BTreeMap::new();
    for e in events {
        by_key.entry(e.id).or_default().insert(e.seq, *e);
    }
    let mut out = BTreeSet::new();
    for (id, events) in by_key {
        let mut live: Option<Row> = None;
        let mut cur: Option<(i32, Row)> = None; // (start, values)
        for (seq, e) in events {
            if e.kind == Kind::Delete {
                live = None;
                if let Some((start, row)) = cur.take() {
                    out.insert((id, row[0], row[1], start, Some(seq)));
                }
                continue;
            }
            let row = partial.merge(live, &e);
            live = Some(row);
            let same_tracked = |old: &Row| (0..2).all(|c| !tracked[c] || old[c] == row[c]);
            cur = match cur {
                Some((start, old)) if same_tracked(&old) => Some((start, row)),
                Some((start, old)) => {
                    out.insert((id, old[0], old[1], start, Some(seq)));
                    Some((seq, row))
                }
                None => Some((seq, row)),
            };
        }
        if let Some((start, row)) = cur {
            out.insert((id, row[0], row[1], start, None));
        }
    }
    out.into_iter().collect()
}
