//! SCD TYPE 1: updates apply one after the other; inside an
//! update, events apply one at a time in sequence order (a TRUNCATE after the
//! key events of its sequence).

use std::collections::BTreeMap;

use super::{Event, Kind, Merge, Row};

/// A DML statement on the target.
#[derive(Debug, Clone, Copy)]
pub enum Dml {
    /// `DELETE FROM t WHERE id = k`.
    Delete(i32),
    /// `UPDATE t SET a = v WHERE id = k`.
    Update(i32, Option<i32>),
    /// `INSERT INTO t VALUES (k, a, b)`.
    Insert(i32, Row),
}

/// Stored state: per key the row (`None` = tombstone) and its sequence, and
/// the truncate watermark.
#[derive(Debug, Default)]
pub struct Scd1 {
    keys: BTreeMap<i32, (Option<Row>, i32)>,
    watermark: Option<i32>,
}

impl Scd1 {
    /// Apply one update.
    pub fn apply(&mut self, update: &[Event], merge: impl Into<Merge>) {
        let merge = merge.into();
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
                _ => Some(merge.merge(live, &e)),
            };
            self.keys.insert(e.id, (row, e.seq));
        }
    }

    /// Apply a DML statement and return its SQL; `None` for an `INSERT` of a
    /// live key (an error the engine reports; the test does not issue it).
    pub fn dml(&mut self, op: Dml) -> Option<String> {
        let sql = |v: Option<i32>| v.map_or("NULL".to_string(), |v| v.to_string());
        match op {
            Dml::Delete(id) => {
                if let Some((row, _)) = self.keys.get_mut(&id) {
                    // a live row becomes a tombstone at its sequence
                    *row = None;
                }
                Some(format!("DELETE FROM t WHERE id = {id}"))
            }
            Dml::Update(id, a) => {
                if let Some((Some(row), _)) = self.keys.get_mut(&id) {
                    row[0] = a;
                }
                Some(format!("UPDATE t SET a = {} WHERE id = {id}", sql(a)))
            }
            Dml::Insert(id, row) => {
                let seq = match self.keys.get(&id) {
                    Some((Some(_), _)) => return None,
                    // the tombstone's sequence
                    Some((None, seq)) => *seq,
                    // older than any event
                    None => i32::MIN,
                };
                self.keys.insert(id, (Some(row), seq));
                Some(format!(
                    "INSERT INTO t VALUES ({id}, {}, {})",
                    sql(row[0]),
                    sql(row[1])
                ))
            }
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
