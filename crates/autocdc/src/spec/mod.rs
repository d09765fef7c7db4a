//! Flow definitions: what the SQL front end and the Rust builder produce, and
//! what is persisted with the target table.
//!
//! A [`FlowSpec`] is plain data (serialisable, no DataFusion objects): clause
//! expressions and source queries are kept as SQL text together with the SQL
//! dialect they were written in, so a new process can re-plan the flow
//! exactly. [`resolve`] validates a spec against the source and target schemas
//! and produces a [`ResolvedFlow`].

pub mod expectations;
pub mod resolve;
pub mod sequence_groups;
pub mod shared_target;

use serde::{Deserialize, Serialize};

pub use crate::fold::ScdType;

/// Where a flow reads its change events from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FlowSource {
    /// A table (or view) name, possibly qualified: `schema.table`.
    Table(String),
    /// A SQL query, written in the flow's dialect.
    Query(String),
    /// `FROM SNAPSHOT (query) [WITH VERSION (query)]`: full
    /// snapshots diffed by key. Without a version query the version is the
    /// update's time (periodic snapshots).
    Snapshot {
        /// The snapshot query (may use `current_snapshot_version()`).
        query: String,
        /// The next version to process (may use `last_snapshot_version()`).
        version_query: Option<String>,
    },
    /// Snapshots produced by a Rust function registered with the session
    /// (`next_snapshot_and_version`); it must be registered again in a new
    /// process.
    SnapshotFunction,
    /// `FROM debezium('path')`: Debezium change events in JSON files, read
    /// incrementally (files not read yet), primary-key changes included.
    Debezium {
        /// The file or folder, as written.
        path: String,
    },
}

impl FlowSource {
    /// Whether the flow reads snapshots rather than change events.
    pub fn is_snapshot(&self) -> bool {
        matches!(self, Self::Snapshot { .. } | Self::SnapshotFunction)
    }
}

/// The `SEQUENCE BY` clause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SequenceBy {
    /// One column.
    Column(String),
    /// `STRUCT(c1, c2, ...)`: ordered field by field, left to right.
    Struct(Vec<String>),
    /// Any other orderable expression (SQL text).
    Expr(String),
}

/// A column selection: everything, a list, or everything except a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ColumnSelection {
    /// `*` (the default).
    #[default]
    All,
    /// `(c1, c2, ...)`.
    Only(Vec<String>),
    /// `* EXCEPT (c1, c2, ...)`.
    Except(Vec<String>),
}

impl ColumnSelection {
    /// The columns this selection names, if any.
    pub fn named(&self) -> &[String] {
        match self {
            Self::All => &[],
            Self::Only(c) | Self::Except(c) => c,
        }
    }
}

/// A persistent AUTO CDC flow definition (`CREATE FLOW ... AS AUTO CDC INTO`,
/// `create_auto_cdc_flow`). Field names follow the Python API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowSpec {
    /// Flow name, unique per target.
    pub name: String,
    /// Target streaming table (normalised, possibly qualified).
    pub target: String,
    /// Change feed source.
    pub source: FlowSource,
    /// Key columns.
    pub keys: Vec<String>,
    /// Event ordering.
    pub sequence_by: Option<SequenceBy>,
    /// `APPLY AS DELETE WHEN` condition (SQL text).
    pub apply_as_deletes: Option<String>,
    /// `APPLY AS TRUNCATE WHEN` condition (SQL text).
    pub apply_as_truncates: Option<String>,
    /// `COLUMNS` selection (`column_list` / `except_column_list`).
    pub columns: ColumnSelection,
    /// `STORED AS`.
    pub stored_as_scd_type: ScdType,
    /// `ONCE`: run only at creation and on a full refresh.
    pub once: bool,
    /// `IGNORE NULL UPDATES [ON ...]`.
    pub ignore_null_updates: Option<ColumnSelection>,
    /// `TRACK HISTORY ON ...` (SCD 2).
    pub track_history: Option<ColumnSelection>,
    /// `SYSTEM SEQUENCE BY`: system time of a BITEMPORAL target.
    pub system_sequence_by: Option<String>,
    /// `COLUMNS TO UPDATE`: the `List<Utf8>` column naming the columns each
    /// upsert writes.
    pub columns_to_update: Option<String>,
    /// SQL dialect the texts above are written in (DataFusion dialect name).
    pub dialect: String,
    /// How a streaming table source is read (SPEC §4.3).
    #[serde(default)]
    pub stream: StreamRead,
    /// `WITH (startingVersion = n)`: a new stream (no checkpoint yet) reads
    /// the commits from version `n` on, instead of the table's current
    /// snapshot first (SPEC §4.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_version: Option<u64>,
    /// An append flow (`INSERT INTO t BY NAME query`, `CREATE STREAMING
    /// TABLE t AS query`): each run appends the rows its query yields from
    /// the new data of its streams; no keys, no sequence (SPEC §4.4).
    #[serde(default)]
    pub append: bool,
    /// `PREVIOUS KEYS (e1, ...)` (SQL texts, one per key column): an upsert
    /// whose previous key differs from its key moved the row — its previous
    /// key is deleted at the same sequence (a primary-key change).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_keys: Vec<String>,
    /// A change-feed flow whose clauses were derived
    /// ([`Self::with_source_defaults`]): its source's `update_preimage`
    /// rows are left out (the post-image of the same commit replaces them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub post_images_only: bool,
}

/// `selection` without the columns `envelope` (`*` and `* EXCEPT` lists;
/// a list of columns stays as written).
fn leave_out(selection: ColumnSelection, envelope: &[&str]) -> ColumnSelection {
    match selection {
        ColumnSelection::All => {
            ColumnSelection::Except(envelope.iter().map(|c| c.to_string()).collect())
        }
        ColumnSelection::Except(mut list) => {
            for c in envelope {
                if !list.iter().any(|l| l.eq_ignore_ascii_case(c)) {
                    list.push(c.to_string());
                }
            }
            ColumnSelection::Except(list)
        }
        only => only,
    }
}

/// How a flow reads a streaming table it names as its source.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum StreamRead {
    /// `FROM t`: the rows each new commit inserted or updated (their
    /// post-images).
    #[default]
    Rows,
    /// `FROM STREAM t`: append-only, the rows each new commit added; a
    /// commit that updated or deleted rows fails the update.
    AppendOnly,
    /// `FROM STREAM t WITH (skipChangeCommits = true)`: as
    /// [`Self::AppendOnly`], commits that updated or deleted rows skipped.
    SkipChangeCommits,
    /// `FROM STREAM t WITH (readChangeFeed = true)`: the change feed of each
    /// new commit (`_change_type`, `_commit_version`, `_commit_timestamp`).
    ChangeFeed,
}

impl StreamRead {
    /// The source clause as written.
    pub fn describe(self, table: &str) -> String {
        match self {
            Self::Rows => table.to_string(),
            Self::AppendOnly => format!("STREAM {table}"),
            Self::SkipChangeCommits => format!("STREAM {table} WITH (skipChangeCommits = true)"),
            Self::ChangeFeed => format!("STREAM {table} WITH (readChangeFeed = true)"),
        }
    }
}

impl FlowSpec {
    /// A flow with only the required parts set; the rest takes the defaults.
    pub fn new(name: impl Into<String>, target: impl Into<String>, source: FlowSource) -> Self {
        Self {
            name: name.into(),
            target: target.into(),
            source,
            keys: vec![],
            sequence_by: None,
            apply_as_deletes: None,
            apply_as_truncates: None,
            columns: ColumnSelection::All,
            stored_as_scd_type: ScdType::Type1,
            once: false,
            ignore_null_updates: None,
            track_history: None,
            system_sequence_by: None,
            columns_to_update: None,
            dialect: "generic".to_string(),
            stream: StreamRead::Rows,
            starting_version: None,
            append: false,
            previous_keys: vec![],
            post_images_only: false,
        }
    }

    /// Fill in what a change source implies and the flow did not write
    /// (written clauses win):
    ///
    /// | source                                   | derived                                      |
    /// |------------------------------------------|----------------------------------------------|
    /// | `debezium(…)`                            | `APPLY AS DELETE WHEN _op = 'd'`, `APPLY AS TRUNCATE WHEN _op = 't'` (SCD 1), `SEQUENCE BY _seq`, `_op`, `_seq`, `_before` left out of `COLUMNS *` / `* EXCEPT` |
    /// | `STREAM t WITH (readChangeFeed = true)`, without `APPLY AS DELETE` or `SEQUENCE BY` | `APPLY AS DELETE WHEN _change_type = 'delete'`, `SEQUENCE BY _commit_version`, `update_preimage` rows left out, `_change_type`, `_commit_version`, `_commit_timestamp` left out of `COLUMNS *` / `* EXCEPT` |
    pub fn with_source_defaults(mut self) -> Self {
        let change_feed = matches!(self.source, FlowSource::Table(_))
            && self.stream == StreamRead::ChangeFeed
            && !self.append
            && (self.apply_as_deletes.is_none() || self.sequence_by.is_none());
        if change_feed {
            self.apply_as_deletes
                .get_or_insert_with(|| "_change_type = 'delete'".to_string());
            self.sequence_by
                .get_or_insert_with(|| SequenceBy::Column("_commit_version".to_string()));
            self.post_images_only = true;
            self.columns = leave_out(
                std::mem::take(&mut self.columns),
                &["_change_type", "_commit_version", "_commit_timestamp"],
            );
        }
        if let FlowSource::Debezium { .. } = self.source {
            self.apply_as_deletes
                .get_or_insert_with(|| "_op = 'd'".to_string());
            if self.stored_as_scd_type == ScdType::Type1 {
                self.apply_as_truncates
                    .get_or_insert_with(|| "_op = 't'".to_string());
            }
            self.sequence_by
                .get_or_insert_with(|| SequenceBy::Column("_seq".to_string()));
            self.columns = leave_out(
                std::mem::take(&mut self.columns),
                &["_op", "_seq", "_before"],
            );
        }
        self
    }

    /// An append flow of `query` (in `dialect`) into `target`.
    pub fn append(
        name: impl Into<String>,
        target: impl Into<String>,
        query: String,
        dialect: String,
    ) -> Self {
        let mut spec = Self::new(name, target, FlowSource::Query(query));
        spec.append = true;
        spec.dialect = dialect;
        spec
    }
}
