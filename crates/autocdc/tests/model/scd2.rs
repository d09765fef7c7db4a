//! SCD TYPE 2: the history is a function of the set of
//! events: per key, sort the distinct events, merge partial updates (an
//! upsert after a delete starts from nothing), then open, close or update
//! versions by the tracked columns.

use std::collections::{BTreeMap, BTreeSet};

use super::{Event, Kind, Merge, Partial, Row};

/// A version: `(id, a, b, start, end)`.
pub type Version = (i32, Option<i32>, Option<i32>, i32, Option<i32>);

/// The versions of all keys; `tracked[c]`: column `c` is tracked.
pub fn history(events: &[Event], merge: impl Into<Merge>, tracked: [bool; 2]) -> Vec<Version> {
    let merge = merge.into();
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
            let row = merge.merge(live, &e);
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

/// A DML statement on the versions of an SCD 2 target `t (id, a, b)`.
#[derive(Debug, Clone, Copy)]
pub enum Dml {
    /// `DELETE FROM t WHERE id = k`.
    DeleteKey(i32),
    /// `DELETE FROM t WHERE id = k AND __start_at = s` (the n-th version, by start).
    DeleteVersion(i32, usize),
    /// `UPDATE t SET a = v WHERE id = k AND __start_at = s` (the n-th version).
    Update(i32, usize, Option<i32>),
    /// `UPDATE t SET __end_at = e WHERE id = k AND __end_at IS NULL`.
    Close(i32, i32),
    /// `INSERT INTO t VALUES (k, a, b, start, end)`.
    Insert(i32, Row, i32, Option<i32>),
}

/// What the target keeps of one key: its events (and whether DML wrote
/// them), the sequences DML erased, and the sequence a DML erasure of the
/// whole key reaches.
#[derive(Debug, Default, Clone)]
struct KeyState {
    events: BTreeMap<i32, (Event, bool)>,
    erased_at: BTreeSet<i32>,
    erased_through: Option<i32>,
}

/// SCD 2 with DML (SPEC §4.2): flows add events to a key's history, except
/// an event at a sequence DML wrote or erased, or at or before a key's
/// erasure; a statement makes the edited versions of each key it touches the
/// key's whole history.
#[derive(Debug, Default)]
pub struct Scd2Dml {
    keys: BTreeMap<i32, KeyState>,
    tracked: [bool; 2],
}

impl Scd2Dml {
    pub fn new(tracked: [bool; 2]) -> Self {
        Self {
            keys: BTreeMap::new(),
            tracked,
        }
    }

    /// Apply one update of a flow.
    pub fn apply(&mut self, update: &[Event]) {
        for e in update {
            let key = self.keys.entry(e.id).or_default();
            let erased = key.erased_through.is_some_and(|t| e.seq <= t)
                || key.erased_at.contains(&e.seq)
                || key.events.get(&e.seq).is_some_and(|(_, dml)| *dml);
            if !erased {
                key.events.entry(e.seq).or_insert((*e, false));
            }
        }
    }

    /// The versions of key `id`, by start.
    fn versions_of(&self, id: i32) -> Vec<Version> {
        let Some(key) = self.keys.get(&id) else {
            return vec![];
        };
        let events: Vec<Event> = key.events.values().map(|(e, _)| *e).collect();
        let mut versions = history(&events, Partial::None, self.tracked);
        versions.sort_by_key(|v| v.3);
        versions
    }

    /// Every version, sorted.
    pub fn versions(&self) -> Vec<Version> {
        let mut out: Vec<Version> = self
            .keys
            .keys()
            .flat_map(|id| self.versions_of(*id))
            .collect();
        out.sort();
        out
    }

    /// Apply a statement and return its SQL; `None` when it would touch no
    /// version or leave overlapping ones (not issued).
    pub fn dml(&mut self, op: Dml) -> Option<String> {
        let sql = |v: Option<i32>| v.map_or("NULL".to_string(), |v| v.to_string());
        let (id, mut versions) = match op {
            Dml::DeleteKey(id)
            | Dml::DeleteVersion(id, _)
            | Dml::Update(id, _, _)
            | Dml::Close(id, _)
            | Dml::Insert(id, ..) => (id, self.versions_of(id)),
        };
        let statement = match op {
            Dml::DeleteKey(_) => {
                if versions.is_empty() {
                    return None;
                }
                versions.clear();
                format!("DELETE FROM t WHERE id = {id}")
            }
            Dml::DeleteVersion(_, n) => {
                if versions.is_empty() {
                    return None;
                }
                let v = versions.remove(n % versions.len());
                format!("DELETE FROM t WHERE id = {id} AND __start_at = {}", v.3)
            }
            Dml::Update(_, n, a) => {
                if versions.is_empty() {
                    return None;
                }
                let n = n % versions.len();
                versions[n].1 = a;
                format!(
                    "UPDATE t SET a = {} WHERE id = {id} AND __start_at = {}",
                    sql(a),
                    versions[n].3
                )
            }
            Dml::Close(_, end) => {
                let current = versions.iter_mut().find(|v| v.4.is_none())?;
                if end <= current.3 {
                    return None;
                }
                current.4 = Some(end);
                format!("UPDATE t SET __end_at = {end} WHERE id = {id} AND __end_at IS NULL")
            }
            Dml::Insert(_, row, start, end) => {
                versions.push((id, row[0], row[1], start, end));
                versions.sort_by_key(|v| v.3);
                format!(
                    "INSERT INTO t VALUES ({id}, {}, {}, {start}, {})",
                    sql(row[0]),
                    sql(row[1]),
                    sql(end)
                )
            }
        };
        // valid: each version ends after it starts and before the next starts
        for (i, v) in versions.iter().enumerate() {
            if v.4.is_some_and(|e| e <= v.3) {
                return None;
            }
            if let Some(next) = versions.get(i + 1) {
                if v.4.is_none_or(|e| e > next.3) {
                    return None;
                }
            }
        }
        let key = self.keys.entry(id).or_default();
        if versions.is_empty() {
            let greatest = key
                .events
                .keys()
                .chain(key.erased_at.iter())
                .chain(key.erased_through.iter())
                .copied()
                .max();
            *key = KeyState {
                erased_through: greatest,
                ..KeyState::default()
            };
            return Some(statement);
        }
        // each version an event at its start, closed at its end unless the
        // next version starts there
        let mut events = BTreeMap::new();
        let event = |seq: i32, kind: Kind, values: Row| Event {
            id,
            seq,
            st: 0,
            kind,
            values,
            writes: None,
        };
        for (i, v) in versions.iter().enumerate() {
            events.insert(v.3, (event(v.3, Kind::Upsert, [v.1, v.2]), true));
            if let Some(end) = v.4 {
                if versions.get(i + 1).is_none_or(|next| next.3 != end) {
                    events.insert(end, (event(end, Kind::Delete, [None, None]), true));
                }
            }
        }
        for seq in key.events.keys() {
            if !events.contains_key(seq) {
                key.erased_at.insert(*seq);
            }
        }
        key.erased_at.retain(|seq| !events.contains_key(seq));
        key.events = events;
        Some(statement)
    }
}
