//! Debezium change events as a table and as a flow source.
//!
//! ```text
//!  debezium('path')  ─► list *.json under path ─► sample ─► DebeziumLayout (decode.rs)
//!                                                              │
//!  DebeziumTable ◄────────── files + layout ───────────────────┘
//!       │ scan
//!       ▼
//!  DebeziumExec: per partition, its files: GET ─► decode ─► [moved keys] ─► batches
//! ```
//!
//! `SELECT … FROM debezium('path')` reads every file (one event per row, see
//! [`decode`]). A flow `FROM debezium('folder/')` reads only the files it
//! has not read yet (its checkpoint, like a folder source's) and gets its
//! clauses from the envelope unless it writes them
//! ([`crate::spec::FlowSpec::with_source_defaults`]); knowing the flow's
//! keys, its scan also turns each primary-key change (an update whose
//! `before` key differs from its `after` key) into a DELETE event of the old
//! key beside the update ([`moved_keys`]).

pub(crate) mod decode;
mod exec;
mod files;
mod known_columns;
mod moved_keys;
mod table;

pub(crate) use exec::FileNames;
pub(crate) use files::{list_event_files, readable_end, EventFile};
pub use table::DebeziumFunction;
pub(crate) use table::{DebeziumTable, FlowUse};
