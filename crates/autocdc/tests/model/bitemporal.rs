//! BITEMPORAL by definition: at every system time in the data,
//! recompute the belief from scratch (per business sequence the latest-known
//! event, then the SCD 2 history), and record each row with the maximal
//! system-time intervals over which it is believed.

use std::collections::{BTreeMap, BTreeSet};

use super::{Event, Kind, Row};

/// `(id, a, b, start, end, system start, system end)`.
pub type BiRow = (
    i32,
    Option<i32>,
    Option<i32>,
    i32,
    Option<i32>,
    i32,
    Option<i32>,
);

/// SCD 2 history (every column tracked) of one key's belief: (values, start, end).
fn belief_history(events: &BTreeMap<i32, Event>) -> BTreeSet<(Row, i32, Option<i32>)> {
    let mut out = BTreeSet::new();
    let mut cur: Option<(i32, Row)> = None;
    for (&seq, e) in events {
        if e.kind == Kind::Delete {
            if let Some((start, row)) = cur.take() {
                out.insert((row, start, Some(seq)));
            }
            continue;
        }
        cur = match cur {
            Some((start, row)) if row == e.values => Some((start, row)),
            Some((start, row)) => {
                out.insert((row, start, Some(seq)));
                Some((seq, e.values))
            }
            None => Some((seq, e.values)),
        };
    }
    if let Some((start, row)) = cur {
        out.insert((row, start, None));
    }
    out
}

/// Every row of every belief with its system intervals, sorted.
pub fn table(events: &[Event]) -> Vec<BiRow> {
    let keys: BTreeSet<i32> = events.iter().map(|e| e.id).collect();
    let mut out = BTreeSet::new();
    for id in keys {
        let mine: Vec<&Event> = events.iter().filter(|e| e.id == id).collect();
        let times: BTreeSet<i32> = mine.iter().map(|e| e.st).collect();
        let mut open: BTreeMap<(Row, i32, Option<i32>), i32> = BTreeMap::new();
        for &t in &times {
            let mut belief: BTreeMap<i32, Event> = BTreeMap::new();
            for e in mine.iter().filter(|e| e.st <= t) {
                if belief.get(&e.seq).is_none_or(|known| known.st <= e.st) {
                    belief.insert(e.seq, **e);
                }
            }
            let rows = belief_history(&belief);
            let gone: Vec<_> = open.keys().filter(|r| !rows.contains(r)).copied().collect();
            for r in gone {
                if let Some(from) = open.remove(&r) {
                    out.insert((id, r.0[0], r.0[1], r.1, r.2, from, Some(t)));
                }
            }
            for r in rows {
                open.entry(r).or_insert(t);
            }
        }
        for (r, from) in open {
            out.insert((id, r.0[0], r.0[1], r.1, r.2, from, None));
        }
    }
    out.into_iter().collect()
}
