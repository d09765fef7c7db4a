//! A deliberately naive model of the AUTO CDC rules (the README's
//! Semantics) — per key, keep every event, sort,
//! fold — used by the differential property tests. It shares no code with the
//! engine: plain Rust collections, one event at a time, no Arrow.
//!
//! Events have a key `id`, two nullable value columns `a` and `b`, a sequence
//! `seq` (business time for BITEMPORAL), a system sequence `st` (BITEMPORAL
//! only) and, for `COLUMNS TO UPDATE`, the set of columns they write.

#![allow(dead_code)]

pub mod bitemporal;
pub mod scd1;
pub mod scd2;

/// Event kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Upsert,
    Delete,
    Truncate,
}

/// Values of the two non-key columns.
pub type Row = [Option<i32>; 2];

/// Names of the value columns, in order.
pub const COLUMNS: [&str; 2] = ["a", "b"];

/// One source row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    pub id: i32,
    pub seq: i32,
    /// System sequence (BITEMPORAL).
    pub st: i32,
    pub kind: Kind,
    pub values: Row,
    /// `COLUMNS TO UPDATE` list as a bit set over [`COLUMNS`]; `None` = NULL.
    pub writes: Option<u8>,
}

/// The flow's partial-update option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partial {
    None,
    /// IGNORE NULL UPDATES: `keep[c]` — column `c` keeps its value on NULL.
    IgnoreNulls {
        keep: [bool; 2],
    },
    ColumnsToUpdate,
}

impl Partial {
    /// The SQL clause(s) of the option: (before APPLY AS ..., at the end).
    pub fn clauses(self) -> (&'static str, &'static str) {
        match self {
            Partial::None => ("", ""),
            Partial::IgnoreNulls { keep: [true, true] } => ("IGNORE NULL UPDATES", ""),
            Partial::IgnoreNulls {
                keep: [true, false],
            } => ("IGNORE NULL UPDATES ON (a)", ""),
            Partial::IgnoreNulls {
                keep: [false, true],
            } => ("IGNORE NULL UPDATES ON * EXCEPT (a)", ""),
            Partial::IgnoreNulls {
                keep: [false, false],
            } => ("IGNORE NULL UPDATES ON * EXCEPT (a, b)", ""),
            Partial::ColumnsToUpdate => ("", "COLUMNS TO UPDATE cols"),
        }
    }

    /// Whether the upsert `e` writes column `c`.
    pub fn writes(self, e: &Event, c: usize) -> bool {
        match self {
            Partial::None => true,
            Partial::IgnoreNulls { keep } => !(keep[c] && e.values[c].is_none()),
            Partial::ColumnsToUpdate => e.writes.is_none_or(|w| w & (1 << c) != 0),
        }
    }

    /// The row an upsert leaves behind, given the key's live row (if any).
    pub fn merge(self, live: Option<Row>, e: &Event) -> Row {
        let mut row = [None; 2];
        for (c, value) in row.iter_mut().enumerate() {
            *value = if self.writes(e, c) {
                e.values[c]
            } else {
                live.and_then(|l| l[c])
            };
        }
        row
    }
}

/// How an upsert merges: the partial-update option, and whether
/// per-column sequencing groups `a` and `b` together (an upsert writing
/// either writes both, with its own values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Merge {
    pub partial: Partial,
    pub together: bool,
}

impl Merge {
    /// The row an upsert leaves behind, given the key's live row (if any).
    pub fn merge(self, live: Option<Row>, e: &Event) -> Row {
        if !self.together {
            return self.partial.merge(live, e);
        }
        if (0..2).any(|c| self.partial.writes(e, c)) {
            e.values
        } else {
            live.unwrap_or([None, None])
        }
    }
}

impl From<Partial> for Merge {
    fn from(partial: Partial) -> Self {
        Self {
            partial,
            together: false,
        }
    }
}

/// The source table of `events` as a SQL query.
pub fn source_sql(events: &[Event]) -> String {
    const EMPTY: &str =
        "SELECT CAST(NULL AS INT) AS id, CAST(NULL AS INT) AS a, CAST(NULL AS INT) AS b, \
         CAST(NULL AS TEXT) AS op, CAST(NULL AS INT) AS seq, CAST(NULL AS INT) AS st, \
         CAST(NULL AS VARCHAR[]) AS cols WHERE false";
    if events.is_empty() {
        return EMPTY.to_string();
    }
    let int = |v: Option<i32>| v.map_or("NULL".to_string(), |v| v.to_string());
    let rows: Vec<String> = events
        .iter()
        .map(|e| {
            let op = match e.kind {
                Kind::Upsert => "U",
                Kind::Delete => "D",
                Kind::Truncate => "T",
            };
            let id = if e.kind == Kind::Truncate {
                "NULL".to_string()
            } else {
                e.id.to_string()
            };
            let cols = match e.writes {
                None => "NULL".to_string(),
                Some(mask) => {
                    let names: Vec<String> = COLUMNS
                        .iter()
                        .enumerate()
                        .filter(|(c, _)| mask & (1 << c) != 0)
                        .map(|(_, n)| format!("'{n}'"))
                        .collect();
                    format!("make_array({})", names.join(", "))
                }
            };
            format!(
                "({id}, {}, {}, '{op}', {}, {}, {cols})",
                int(e.values[0]),
                int(e.values[1]),
                e.seq,
                e.st
            )
        })
        .collect();
    format!(
        "SELECT CAST(column1 AS INT) AS id, CAST(column2 AS INT) AS a, CAST(column3 AS INT) AS b, \
         column4 AS op, CAST(column5 AS INT) AS seq, CAST(column6 AS INT) AS st, \
         CAST(column7 AS VARCHAR[]) AS cols FROM (VALUES {})",
        rows.join(", ")
    )
}
