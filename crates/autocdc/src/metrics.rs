//! What statements report: a flow run's metrics row ([`UpdateMetrics`],
//! the row `CREATE FLOW` / `REFRESH` return) and a pipeline update's
//! tables ([`PipelineUpdate`]), a restore ([`RestoreMetrics`]).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::common::{DataFusionError, Result};

use crate::table::TableName;

pub use crate::fold::count;
pub(crate) use crate::fold::count::run_count_fields;

/// What one flow run did (the row `CREATE FLOW` / `REFRESH` return).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateMetrics {
    /// Flow name.
    pub flow: String,
    /// Target rows inserted or updated.
    pub num_upserted_rows: i64,
    /// Target rows deleted.
    pub num_deleted_rows: i64,
    /// Change events read.
    pub num_input_rows: i64,
    /// Events dropped as late or replayed.
    pub num_late_rows_dropped: i64,
    /// Delta version committed.
    pub commit_version: Option<i64>,
}

impl UpdateMetrics {
    /// Decode the result rows of an update statement (columns found by
    /// name, see `crate::logical::UPDATE_RESULT_COLUMNS`).
    pub fn from_batch(batch: &RecordBatch) -> Result<Vec<Self>> {
        let column = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| {
                DataFusionError::Internal(format!("update result without column '{name}'"))
            })
        };
        let flows = column("flow")?
            .as_string_opt::<i32>()
            .ok_or_else(|| DataFusionError::Internal("update result: 'flow' is not text".into()))?;
        let counts = |name: &str| -> Result<&arrow::array::Int64Array> {
            column(name)?
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| {
                    DataFusionError::Internal(format!("update result: '{name}' is not BIGINT"))
                })
        };
        let upserted = counts(count::UPSERTED)?;
        let deleted = counts(count::DELETED)?;
        let input = counts(count::INPUT_ROWS)?;
        let late = counts(count::LATE)?;
        let version = counts("commit_version")?;
        let value =
            |a: &arrow::array::Int64Array, row: usize| (!a.is_null(row)).then(|| a.value(row));
        Ok((0..batch.num_rows())
            .map(|r| Self {
                flow: flows.value(r).to_string(),
                num_upserted_rows: value(upserted, r).unwrap_or(0),
                num_deleted_rows: value(deleted, r).unwrap_or(0),
                num_input_rows: value(input, r).unwrap_or(0),
                num_late_rows_dropped: value(late, r).unwrap_or(0),
                commit_version: value(version, r),
            })
            .collect())
    }

    /// Decode the result batches of update statements.
    pub fn from_batches(batches: &[RecordBatch]) -> Result<Vec<Self>> {
        let mut all = Vec::new();
        for batch in batches {
            all.extend(Self::from_batch(batch)?);
        }
        Ok(all)
    }
}

/// What a pipeline update did to one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableStatus {
    /// Its flows ran.
    Updated,
    /// Its refresh failed (nothing of it committed).
    Failed,
    /// Not run: a table it reads was not updated.
    Skipped,
    /// Not run: nothing new to read (updates of what changed only).
    Unchanged,
}

impl TableStatus {
    /// As `REFRESH PIPELINE` prints it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Updated => "updated",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::Unchanged => "unchanged",
        }
    }
}

/// One table of a pipeline update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableUpdate {
    /// The table.
    pub table: TableName,
    /// What happened to it.
    pub status: TableStatus,
    /// Its flow runs (when updated).
    pub runs: Vec<UpdateMetrics>,
    /// Why it failed or was skipped.
    pub message: Option<String>,
}

/// What one pipeline update did: every table, in the order they ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineUpdate {
    /// Tags every commit of the update in the event log (`update_id`).
    pub update_id: String,
    /// The tables, in dependency order.
    pub tables: Vec<TableUpdate>,
}

/// What a `RESTORE` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreMetrics {
    /// The version restored.
    pub restored_version: u64,
    /// The commit the restore made.
    pub commit_version: i64,
    /// Rows it inserted or changed back.
    pub num_upserted_rows: u64,
    /// Rows it deleted.
    pub num_deleted_rows: u64,
    /// Data files removed from the table.
    pub num_removed_files: usize,
    /// Data files of the restored version added back.
    pub num_restored_files: usize,
}

impl RestoreMetrics {
    /// The statement's result row.
    pub fn to_batch(&self) -> Result<RecordBatch> {
        let schema = Arc::new(Schema::new(
            [
                "restored_version",
                "commit_version",
                count::UPSERTED,
                count::DELETED,
                "num_removed_files",
                "num_restored_files",
            ]
            .map(|n| Field::new(n, DataType::Int64, false))
            .to_vec(),
        ));
        let values = [
            self.restored_version as i64,
            self.commit_version,
            self.num_upserted_rows as i64,
            self.num_deleted_rows as i64,
            self.num_removed_files as i64,
            self.num_restored_files as i64,
        ];
        Ok(RecordBatch::try_new(
            schema,
            values
                .iter()
                .map(|v| Arc::new(Int64Array::from(vec![*v])) as ArrayRef)
                .collect(),
        )?)
    }
}
