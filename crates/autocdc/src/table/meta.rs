//! What a streaming table knows about itself, kept in its Delta table
//! properties so that a table is self-describing: a new process pointed at the
//! same warehouse can read and `REFRESH` it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::common::{DataFusionError, Result};
use serde::{Deserialize, Serialize};

use crate::fold::columns::{
    INTERNAL_PREFIX, SEQ_COL, START_AT_COL, SYSTEM_START_AT_COL, UPDATE_LIST_COL,
};
use crate::spec::resolve::{TargetShape, RESERVED_COLUMNS};
use crate::spec::{FlowSpec, ScdType};
use crate::table::bucket::DEFAULT_BUCKETS;
use crate::table::properties::{
    full_refresh_pending_property, read_again_property, BUCKETS_PROPERTY, COMPRESSION_PROPERTY,
    FLOW_KEY_PREFIX, FULL_REFRESH_PENDING_PREFIX, SNAPSHOT_PROPERTY_PREFIX,
    SNAPSHOT_WATERMARK_PROPERTY, SOURCE_CHECKPOINT_PREFIX, TABLE_KEY, TOMBSTONE_GC_PROPERTY,
};
use crate::table::writer::FileCompression;

/// Default tombstone retention: two days.
pub const DEFAULT_TOMBSTONE_GC_SECS: i64 = 172_800;

/// How the table was declared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableDecl {
    /// Columns were declared by `CREATE STREAMING TABLE t (...)`.
    pub declared_columns: bool,
    /// Its `CONSTRAINT … EXPECT …` clauses, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expectations: Vec<crate::spec::expectations::Expectation>,
    /// Its `COMMENT` (also the Delta tables' description).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// Table-level metadata decoded from a Delta snapshot.
#[derive(Debug, Clone)]
pub struct TableMeta {
    /// Declaration.
    pub decl: TableDecl,
    /// User columns (storage types), empty until declared or set by a flow.
    pub user_schema: SchemaRef,
    /// Stored sequence type, once a flow has run.
    pub sequence_type: Option<DataType>,
    /// Storage type, once fixed by a flow or by declared SCD columns.
    pub stored_as: Option<ScdType>,
    /// Type of the `__start_at` / `__end_at` columns, if the table has them.
    pub start_at_type: Option<DataType>,
    /// Type of the `__system_start_at` / `__system_end_at` columns (BITEMPORAL).
    pub system_start_at_type: Option<DataType>,
    /// The table stores `COLUMNS TO UPDATE` lists with its events.
    pub update_list: bool,
    /// Flows writing this table, by name.
    pub flows: BTreeMap<String, FlowSpec>,
    /// All table properties.
    pub properties: HashMap<String, String>,
    /// Number of key buckets.
    pub buckets: i32,
    /// Codec of the files updates write (`autocdc.compression`).
    pub compression: FileCompression,
    /// Tombstone retention (`pipelines.cdc.tombstoneGCThresholdInSeconds`).
    pub tombstone_retention_secs: i64,
}

impl TableMeta {
    /// Position of the user column `name` (a flow's key as written in its
    /// statement: the exact name, else the one equal ignoring ASCII case).
    pub fn user_column(&self, name: &str) -> Option<usize> {
        let fields = self.user_schema.fields();
        fields.iter().position(|f| f.name() == name).or_else(|| {
            fields
                .iter()
                .position(|f| f.name().eq_ignore_ascii_case(name))
        })
    }

    /// Decode from the Delta table's arrow schema and configuration.
    pub fn decode(delta_schema: &Schema, configuration: &HashMap<String, String>) -> Result<Self> {
        let decl = match configuration.get(TABLE_KEY) {
            Some(json) => {
                serde_json::from_str(json).map_err(|e| DataFusionError::External(Box::new(e)))?
            }
            None => TableDecl::default(),
        };
        let user_fields: Vec<_> = delta_schema
            .fields()
            .iter()
            .filter(|f| {
                !f.name().starts_with(INTERNAL_PREFIX)
                    && !RESERVED_COLUMNS.contains(&f.name().as_str())
            })
            .cloned()
            .collect();
        let sequence_type = delta_schema
            .field_with_name(SEQ_COL)
            .ok()
            .map(|f| f.data_type().clone());
        let start_at_type = delta_schema
            .field_with_name(START_AT_COL)
            .ok()
            .map(|f| f.data_type().clone());
        let system_start_at_type = delta_schema
            .field_with_name(SYSTEM_START_AT_COL)
            .ok()
            .map(|f| f.data_type().clone());
        let stored_as = match (&system_start_at_type, &start_at_type, &sequence_type) {
            (Some(_), _, _) => Some(ScdType::Bitemporal),
            (None, Some(_), _) => Some(ScdType::Type2),
            (None, None, Some(_)) => Some(ScdType::Type1),
            (None, None, None) => None,
        };
        let mut flows = BTreeMap::new();
        for (k, v) in configuration {
            if let Some(name) = k.strip_prefix(FLOW_KEY_PREFIX) {
                let spec: FlowSpec = serde_json::from_str(v).map_err(|e| {
                    DataFusionError::Execution(format!("corrupt definition of flow '{name}': {e}"))
                })?;
                flows.insert(name.to_string(), spec);
            }
        }
        Ok(Self {
            decl,
            user_schema: Arc::new(Schema::new(user_fields)),
            sequence_type,
            stored_as,
            start_at_type,
            system_start_at_type,
            update_list: delta_schema.field_with_name(UPDATE_LIST_COL).is_ok(),
            flows,
            buckets: match configuration.get(BUCKETS_PROPERTY) {
                Some(value) => parse_buckets(value).map_err(DataFusionError::Plan)?,
                None => DEFAULT_BUCKETS,
            },
            compression: match configuration.get(COMPRESSION_PROPERTY) {
                Some(value) => parse_compression(value).map_err(DataFusionError::Plan)?,
                None => FileCompression::default(),
            },
            tombstone_retention_secs: match configuration.get(TOMBSTONE_GC_PROPERTY) {
                Some(value) => parse_tombstone_retention(value).map_err(DataFusionError::Plan)?,
                None => DEFAULT_TOMBSTONE_GC_SECS,
            },
            properties: configuration.clone(),
        })
    }

    /// The properties a full refresh forgets: what the flows read (their
    /// sources' checkpoints, every snapshot version), so that they read it
    /// all again, and the marks of an earlier full refresh that did not
    /// finish.
    pub const CLEARED_PREFIXES: [&'static str; 4] = [
        SOURCE_CHECKPOINT_PREFIX,
        SNAPSHOT_PROPERTY_PREFIX,
        SNAPSHOT_WATERMARK_PROPERTY,
        FULL_REFRESH_PENDING_PREFIX,
    ];

    /// The flows a full refresh cleared the table for and that have not
    /// committed since: a process that stopped mid-refresh left them (the
    /// next update of the table runs them, `ONCE` flows included).
    pub fn full_refresh_pending(&self) -> Vec<String> {
        self.properties
            .keys()
            .filter_map(|k| k.strip_prefix(FULL_REFRESH_PENDING_PREFIX))
            .map(str::to_string)
            .collect()
    }

    /// The marks a run of `flow` commits (this being the table as the run
    /// sees it): the run clearing the table for a full refresh marks every
    /// other flow as still to run; a run of a marked flow removes its mark.
    ///
    /// A run also removes the mark of its flow a restore left
    /// ([`Self::read_again_after_restore`]).
    ///
    /// | run                         | marks                          |
    /// |-----------------------------|--------------------------------|
    /// | clears the table (`FULL`)   | set for every other flow       |
    /// | of a marked flow            | its own removed                |
    /// | any other                   | none                           |
    pub fn full_refresh_marks(&self, flow: &str, clearing: bool) -> Vec<MetadataChange> {
        let restored = read_again_property(flow);
        let mut marks = match self.properties.contains_key(&restored) {
            true => vec![MetadataChange::Remove(vec![restored])],
            false => Vec::new(),
        };
        if clearing {
            marks.extend(self.marks_of_flows_but(Some(flow)));
            return marks;
        }
        let mark = full_refresh_pending_property(flow);
        if self.properties.contains_key(&mark) {
            marks.push(MetadataChange::Remove(vec![mark]));
        }
        marks
    }

    /// The version a restore rewound `flow` (an append flow) to, when it
    /// has not committed since: its run reads again the rows it read after
    /// that version.
    pub fn read_again_after_restore(&self, flow: &str) -> Option<i64> {
        self.properties
            .get(&read_again_property(flow))
            .and_then(|version| version.parse().ok())
    }

    /// The table as the update carrying a full refresh's clear sees it: no
    /// stored rows, nothing read (its columns, flows and other properties
    /// stay).
    pub fn cleared(mut self) -> Self {
        self.sequence_type = None;
        self.properties
            .retain(|key, _| !Self::CLEARED_PREFIXES.iter().any(|p| key.starts_with(p)));
        self
    }

    /// Marks setting every flow but `flow` as still to run in a full
    /// refresh (a clear of its own: `None`, every flow).
    pub fn marks_of_flows_but(&self, flow: Option<&str>) -> Vec<MetadataChange> {
        self.flows
            .keys()
            .filter(|f| Some(f.as_str()) != flow)
            .map(|f| MetadataChange::Set(full_refresh_pending_property(f), "true".to_string()))
            .collect()
    }

    /// What the target fixes for a new flow.
    pub fn shape(&self) -> TargetShape {
        TargetShape {
            columns: (!self.user_schema.fields().is_empty()).then(|| Arc::clone(&self.user_schema)),
            sequence_type: self.sequence_type.clone(),
            stored_as: self.stored_as,
            start_at_type: self.start_at_type.clone(),
            system_start_at_type: self.system_start_at_type.clone(),
            update_list: self.update_list,
            declared: self.decl.declared_columns,
        }
    }
}

/// The codec a value of `autocdc.compression` names, or what is wrong
/// with it.
pub fn parse_compression(value: &str) -> std::result::Result<FileCompression, String> {
    FileCompression::parse(value).ok_or_else(|| {
        let names: Vec<&str> = FileCompression::ALL.iter().map(|c| c.name()).collect();
        format!(
            "{COMPRESSION_PROPERTY} must be one of {}, got '{value}'",
            names.join(", ")
        )
    })
}

/// Most buckets a table may have: each is at least one file per update
/// that touches it.
pub const MAX_BUCKETS: i32 = 65_536;

/// The bucket count a value of `autocdc.buckets` names, or what is wrong
/// with it. (A stored row stays in its bucket: a value that cannot be read
/// is an error, never a default, or updates would miss stored rows.)
pub fn parse_buckets(value: &str) -> std::result::Result<i32, String> {
    value
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|b| (1..=MAX_BUCKETS).contains(b))
        .ok_or_else(|| {
            format!("{BUCKETS_PROPERTY} must be an integer from 1 to {MAX_BUCKETS}, got '{value}'")
        })
}

/// The tombstone retention a value of
/// `pipelines.cdc.tombstoneGCThresholdInSeconds` names, or what is wrong
/// with it.
pub fn parse_tombstone_retention(value: &str) -> std::result::Result<i64, String> {
    value
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|s| *s >= 0)
        .ok_or_else(|| {
            format!(
                "{TOMBSTONE_GC_PROPERTY} must be a whole number of seconds, 0 or more, got '{value}'"
            )
        })
}

/// A change of a table's metadata, made by the commit that carries it.
#[derive(Debug, Clone)]
pub enum MetadataChange {
    /// Set a table property.
    Set(String, String),
    /// Remove the table properties whose names start with one of these.
    RemovePrefixed(Vec<String>),
    /// Remove these table properties (those the table has).
    Remove(Vec<String>),
    /// Replace the table's schema.
    Schema(SchemaRef),
}

impl MetadataChange {
    /// Forget what the flows read ([`TableMeta::CLEARED_PREFIXES`]).
    pub fn forget_reads() -> Self {
        Self::RemovePrefixed(
            TableMeta::CLEARED_PREFIXES
                .iter()
                .map(|p| p.to_string())
                .collect(),
        )
    }
}
