//! Names and codes of the hidden bookkeeping columns shared by the operators
//! and the Delta storage layout.

/// Sequence of the last applied event of a stored row (typed like SEQUENCE BY).
pub const SEQ_COL: &str = "__cdc_seq";
/// Row/event kind, see [`Kind`].
pub const KIND_COL: &str = "__cdc_kind";
/// Stored row kind of a hidden UPSERT event kept in an SCD 2 history.
pub const STORED_UPSERT_EVENT: i8 = 3;
/// Stored row kind of a hidden DELETE event kept in an SCD 2 history.
pub const STORED_DELETE_EVENT: i8 = 4;
/// Stored row kind of an UPSERT event written by a DML statement into an
/// SCD 2 history: a new event of its key at its sequence is a replay of what
/// the statement corrected, and dropped.
pub const STORED_DML_UPSERT_EVENT: i8 = 5;
/// Stored row kind of a DELETE event written by a DML statement (see
/// [`STORED_DML_UPSERT_EVENT`]).
pub const STORED_DML_DELETE_EVENT: i8 = 6;
/// Stored row kind of an erasure mark: a DML statement removed its key's
/// event at this sequence; a new event of the key at it is dropped.
pub const STORED_ERASED_AT: i8 = 7;
/// Stored row kind of a key's erasure mark: a DML statement deleted every
/// version of the key; a new event of the key at or before this sequence is
/// dropped. Marks expire with the tombstone retention.
pub const STORED_ERASED_THROUGH: i8 = 8;
/// Fold output row kind: a change data feed row, inserted visible row.
pub const CHANGE_INSERT: i8 = 10;
/// Change data feed row: the visible row before an update.
pub const CHANGE_PREIMAGE: i8 = 11;
/// Change data feed row: the visible row after an update.
pub const CHANGE_POSTIMAGE: i8 = 12;
/// Change data feed row: a deleted visible row.
pub const CHANGE_DELETE: i8 = 13;

/// The Delta `_change_type` of a change kind.
pub fn change_type_name(kind: i8) -> Option<&'static str> {
    match kind {
        CHANGE_INSERT => Some("insert"),
        CHANGE_PREIMAGE => Some("update_preimage"),
        CHANGE_POSTIMAGE => Some("update_postimage"),
        CHANGE_DELETE => Some("delete"),
        _ => None,
    }
}

/// SCD 2 / BITEMPORAL business-time columns.
pub const START_AT_COL: &str = "__start_at";
/// See [`START_AT_COL`].
pub const END_AT_COL: &str = "__end_at";

/// Commit time (UTC µs, by the session clock) of the update that wrote a
/// stored row; tombstones expire by it (retention).
pub const WRITTEN_AT_COL: &str = "__cdc_written_at";
/// Where an event comes from during an update, see [`Origin`] (never stored).
pub const ORIGIN_COL: &str = "__cdc_origin";
/// System sequence of a BITEMPORAL event (typed like SYSTEM SEQUENCE BY);
/// stored with the hidden events of a BITEMPORAL history.
pub const SYSTEM_SEQ_COL: &str = "__cdc_system_seq";
/// The `COLUMNS TO UPDATE` list of an event; stored with the hidden events of
/// an SCD 2 history, never a target column.
pub const UPDATE_LIST_COL: &str = "__cdc_columns_to_update";
/// BITEMPORAL system-time columns.
pub const SYSTEM_START_AT_COL: &str = "__system_start_at";
/// See [`SYSTEM_START_AT_COL`].
pub const SYSTEM_END_AT_COL: &str = "__system_end_at";
/// Prefix reserved for hidden bookkeeping columns.
pub const INTERNAL_PREFIX: &str = "__cdc_";

/// Kind of an event, and of the stored row it leaves behind.
///
/// Stored rows use the same codes: an applied UPSERT leaves a live row, an
/// applied DELETE a tombstone, TRUNCATEs leave a single watermark row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum Kind {
    /// UPSERT event / live row.
    Upsert = 0,
    /// DELETE event / tombstone.
    Delete = 1,
    /// TRUNCATE event / truncate watermark row.
    Truncate = 2,
}

impl Kind {
    /// Decode a stored code.
    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            0 => Some(Self::Upsert),
            1 => Some(Self::Delete),
            2 => Some(Self::Truncate),
            _ => None,
        }
    }

    /// Human-readable name used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Upsert => "UPSERT",
            Self::Delete => "DELETE",
            Self::Truncate => "TRUNCATE",
        }
    }
}

/// Origin of an event in an update: state already stored in the target, or a
/// new event read from the flow's source. At equal sequence the stored state
/// sorts first and wins (SCD 1 keeps no events, so a new event at a stored
/// sequence is late or a replay).
///
/// SCD 2 and BITEMPORAL histories also hold what DML statements wrote
/// ([`Origin::StoredByDml`]: events and erasure marks), and a DML statement's
/// update brings the edited histories of its keys ([`Origin::Dml`]), which
/// replace the stored ones.
///
/// An SCD 2 version also stands for the event it was last given, which is
/// then not stored again as a hidden event ([`Origin::Implied`]). The codes
/// are never stored: only their order matters (the sort order of events of
/// one key and sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i8)]
pub enum Origin {
    /// Event or erasure mark written by a DML statement, read back (sorts
    /// before a new event of equal sequence, which it drops).
    StoredByDml = -1,
    /// Row read back from the target.
    Stored = 0,
    /// The event an SCD 2 version implies, read back from the version: its
    /// values, `__cdc_seq` and `__cdc_written_at`. It sorts after stored
    /// events of its sequence, and one of them there is the event itself
    /// (stored hidden by an older writer, or with raw values the version
    /// does not hold: partial updates, DML), which it then yields to.
    Implied = 1,
    /// Event read from the source in this update.
    New = 2,
    /// Event of a DML statement's edited history: the key's history becomes
    /// exactly the versions these events fold into.
    Dml = 3,
}

/// Stored rows of an SCD 1 fold: the event columns but `__cdc_origin` and
/// what follows it, every field nullable.
pub fn scd1_output_schema(
    layout: &EventLayout,
    input: &arrow::datatypes::Schema,
) -> datafusion::common::Result<arrow::datatypes::SchemaRef> {
    Ok(all_nullable(
        &input.project(&(0..layout.origin()).collect::<Vec<_>>())?,
    ))
}

/// `schema` with every field nullable: stored state mixes live rows with
/// tombstones and the keyless watermark row.
pub fn all_nullable(schema: &arrow::datatypes::Schema) -> arrow::datatypes::SchemaRef {
    std::sync::Arc::new(arrow::datatypes::Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
        schema.metadata().clone(),
    ))
}

/// Prefix of the state column that keeps a sequence group's sequence
/// (per-column sequencing, SCD 1): `__cdc_seq_<group>`.
pub const GROUP_SEQ_PREFIX: &str = "__cdc_seq_";

/// Columns that share one sequence under per-column sequencing
/// (`autocdc.sequencePerColumn`): a named group of
/// `autocdc.sequenceGroups`, or one non-key column on its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, serde::Serialize, serde::Deserialize)]
pub struct SequenceGroup {
    /// The group's name (the column's name for a column on its own).
    pub name: String,
    /// Its target columns (indices into the target columns).
    pub members: Vec<usize>,
}

impl SequenceGroup {
    /// Name of the state column keeping the group's sequence.
    pub fn state_column(&self) -> String {
        format!("{GROUP_SEQ_PREFIX}{}", self.name)
    }
}

/// Column positions of an event batch: `[target columns..., __cdc_seq,
/// __cdc_kind, __cdc_written_at, __cdc_origin]`, followed by
/// `__cdc_system_seq` (BITEMPORAL) and `__cdc_columns_to_update` (COLUMNS TO
/// UPDATE) when the flow has them, and by one sequence per
/// [`SequenceGroup`] when the fold keeps them (SCD 1 with per-column
/// sequencing).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct EventLayout {
    /// Names of the target (user) columns, in order.
    pub target_columns: Vec<String>,
    /// Indices of the key columns among the target columns.
    pub key_indices: Vec<usize>,
    /// Events carry a system sequence (BITEMPORAL).
    pub system_seq: bool,
    /// Events carry a `COLUMNS TO UPDATE` list.
    pub update_list: bool,
    /// Per-column sequencing: the groups of non-key columns that are
    /// sequenced apart (empty: whole rows are sequenced).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sequence_groups: Vec<SequenceGroup>,
    /// Batches carry each group's sequence (the SCD 1 state keeps them).
    #[serde(default)]
    pub group_sequences: bool,
}

impl EventLayout {
    /// Number of target columns.
    pub fn num_target(&self) -> usize {
        self.target_columns.len()
    }
    /// Index of the sequence column.
    pub fn seq(&self) -> usize {
        self.num_target()
    }
    /// Index of the kind column.
    pub fn kind(&self) -> usize {
        self.num_target() + 1
    }
    /// Index of the written-at column.
    pub fn written_at(&self) -> usize {
        self.num_target() + 2
    }
    /// Index of the origin column.
    pub fn origin(&self) -> usize {
        self.num_target() + 3
    }
    /// Index of the system sequence column (BITEMPORAL).
    pub fn system_seq(&self) -> Option<usize> {
        self.system_seq.then(|| self.origin() + 1)
    }
    /// Index of the `COLUMNS TO UPDATE` list column.
    pub fn update_list(&self) -> Option<usize> {
        self.update_list
            .then(|| self.origin() + 1 + usize::from(self.system_seq))
    }
    /// Index of the sequence of group `g` (when batches carry them).
    pub fn group_seq(&self, g: usize) -> Option<usize> {
        self.group_sequences.then(|| {
            self.origin() + 1 + usize::from(self.system_seq) + usize::from(self.update_list) + g
        })
    }
    /// Number of columns of an event batch.
    pub fn num_columns(&self) -> usize {
        let groups = if self.group_sequences {
            self.sequence_groups.len()
        } else {
            0
        };
        self.origin() + 1 + usize::from(self.system_seq) + usize::from(self.update_list) + groups
    }
}
