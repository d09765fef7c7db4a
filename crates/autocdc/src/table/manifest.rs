//! The manifest: what `CdcWriteExec` tells `CdcCommitExec`, as rows.
//!
//! The writer sends the files it wrote and what the fold did as a small
//! Arrow batch, so the commit needs nothing but its input: it walks no plan
//! and holds no handle on the operators below it, and the rows can travel
//! between processes like any other.
//!
//! | `entry`   | `action`                   | count columns, `truncated`  |
//! |-----------|----------------------------|-----------------------------|
//! | `add`     | a data file (Delta `Add`)  | NULL                        |
//! | `cdc`     | a change data feed file    | NULL                        |
//! | `retire`  | a `remove`, or an `add` with a deletion vector, of a stored file | NULL |
//! | `summary` | NULL                       | what the fold did; one row  |
//!
//! (`retire` entries come from a DML statement's rows operator, which
//! finds the stored rows it replaces; a flow update's commit finds its own.)
//!
//! `action` is the Delta action in its log (JSON) form. Summaries are
//! summed: a commit may gather the manifests of several writers. Writers
//! of one fold partition each (a cluster's tasks) each write the truncate
//! watermark row they carry: the first such file read is kept, the others
//! stay unreferenced (vacuum removes them).

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, AsArray, BooleanArray, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::{DataFusionError, Result};
use deltalake_core::kernel::{Action, Add};

use super::bucket::{BUCKET_COL, WATERMARK_BUCKET};
use super::commit::{Retired, WrittenFiles};
use crate::fold::count;
use crate::fold::FoldCounts;

const ENTRY: &str = "entry";
const ACTION: &str = "action";
const TRUNCATED: &str = "truncated";
const ADD: &str = "add";
const CDC: &str = "cdc";
const RETIRE: &str = "retire";
const SUMMARY: &str = "summary";

/// The count columns of a summary, in [`FoldCounts`] field order.
const COUNTS: [&str; 7] = [
    count::INPUT_ROWS,
    count::UPSERTED,
    count::DELETED,
    count::TOMBSTONES,
    count::LATE,
    count::DUPLICATES,
    count::EVENTS_ADDED,
];

static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let mut fields = vec![
        Field::new(ENTRY, DataType::Utf8, false),
        Field::new(ACTION, DataType::Utf8, true),
    ];
    fields.extend(
        COUNTS
            .iter()
            .map(|c| Field::new(*c, DataType::UInt64, true)),
    );
    fields.push(Field::new(TRUNCATED, DataType::Boolean, true));
    Arc::new(Schema::new(fields))
});

/// Schema of a manifest.
pub fn manifest_schema() -> SchemaRef {
    Arc::clone(&SCHEMA)
}

fn counts_array(counts: &FoldCounts) -> [usize; 7] {
    [
        counts.input_rows,
        counts.upserted,
        counts.deleted,
        counts.tombstones,
        counts.late,
        counts.duplicates,
        counts.events_added,
    ]
}

/// The manifest of one writer: a row per written file, one per action
/// retiring stored rows, and its summary.
pub fn encode(
    written: &WrittenFiles,
    retired: &Retired,
    counts: &FoldCounts,
    truncated: bool,
) -> Result<RecordBatch> {
    let files = written.adds.len() + written.change_files.len() + retired.0.len();
    let mut entries = Vec::with_capacity(files + 1);
    let mut actions = Vec::with_capacity(files + 1);
    let tagged = written
        .adds
        .iter()
        .map(|a| (ADD, a))
        .chain(written.change_files.iter().map(|a| (CDC, a)));
    for (entry, add) in tagged {
        entries.push(entry);
        actions.push(Some(serde_json::to_string(add).map_err(|e| {
            DataFusionError::Internal(format!("manifest: cannot encode {}: {e}", add.path))
        })?));
    }
    for action in &retired.0 {
        entries.push(RETIRE);
        actions.push(Some(serde_json::to_string(action).map_err(|e| {
            DataFusionError::Internal(format!("manifest: cannot encode a retire action: {e}"))
        })?));
    }
    entries.push(SUMMARY);
    actions.push(None);
    let summary_only = |value: u64| -> UInt64Array {
        (0..=files).map(|i| (i == files).then_some(value)).collect()
    };
    let mut columns: Vec<Arc<dyn Array>> = vec![
        Arc::new(StringArray::from(entries)),
        Arc::new(StringArray::from(actions)),
    ];
    for value in counts_array(counts) {
        columns.push(Arc::new(summary_only(value as u64)));
    }
    columns.push(Arc::new(
        (0..=files)
            .map(|i| (i == files).then_some(truncated))
            .collect::<BooleanArray>(),
    ));
    Ok(RecordBatch::try_new(manifest_schema(), columns)?)
}

/// Everything the manifests of one update say, gathered.
#[derive(Debug, Default)]
pub struct Manifest {
    /// The files written.
    pub written: WrittenFiles,
    /// The stored rows retired (a DML statement's).
    pub retired: Retired,
    /// What the fold did, summed over writers.
    pub counts: FoldCounts,
    /// Whether the target has a truncate watermark (new or stored).
    pub truncated: bool,
    /// Summaries read: one per writer.
    pub writers: usize,
    /// Whether a watermark file was kept.
    watermark_file: bool,
}

/// The bucket partition value of a watermark file.
static WATERMARK_TEXT: LazyLock<String> = LazyLock::new(|| WATERMARK_BUCKET.to_string());

impl Manifest {
    /// Add the rows of one manifest batch.
    pub fn read(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.schema().fields() != manifest_schema().fields() {
            return Err(DataFusionError::Internal(format!(
                "manifest: unexpected schema {}",
                batch.schema()
            )));
        }
        let entries = batch.column(0).as_string::<i32>();
        let actions = batch.column(1).as_string::<i32>();
        let count = |c: usize, row: usize| -> usize {
            batch.column(2 + c).as_primitive::<UInt64Type>().value(row) as usize
        };
        let truncated = batch.column(2 + COUNTS.len()).as_boolean();
        for row in 0..batch.num_rows() {
            match entries.value(row) {
                entry @ (ADD | CDC) => {
                    let add: Add = serde_json::from_str(actions.value(row)).map_err(|e| {
                        DataFusionError::Internal(format!("manifest: bad {entry} entry: {e}"))
                    })?;
                    let watermark = add
                        .partition_values
                        .get(BUCKET_COL)
                        .is_some_and(|b| b.as_deref() == Some(WATERMARK_TEXT.as_str()));
                    match entry {
                        ADD if watermark && self.watermark_file => {}
                        ADD => {
                            self.watermark_file |= watermark;
                            self.written.adds.push(add)
                        }
                        _ => self.written.change_files.push(add),
                    }
                }
                RETIRE => {
                    let action: Action = serde_json::from_str(actions.value(row)).map_err(|e| {
                        DataFusionError::Internal(format!("manifest: bad retire entry: {e}"))
                    })?;
                    self.retired.0.push(action);
                }
                SUMMARY => {
                    let c = &mut self.counts;
                    c.input_rows += count(0, row);
                    c.upserted += count(1, row);
                    c.deleted += count(2, row);
                    c.tombstones += count(3, row);
                    c.late += count(4, row);
                    c.duplicates += count(5, row);
                    c.events_added += count(6, row);
                    self.truncated |= truncated.value(row);
                    self.writers += 1;
                }
                other => {
                    return Err(DataFusionError::Internal(format!(
                        "manifest: unknown entry '{other}'"
                    )))
                }
            }
        }
        Ok(())
    }

    /// Whether the update changes the stored state (and so commits files).
    pub fn changed(&self) -> bool {
        self.counts.changed_state() || self.truncated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(path: &str, size: i64) -> Add {
        Add {
            path: path.into(),
            partition_values: [("__cdc_bucket".to_string(), Some("3".to_string()))]
                .into_iter()
                .collect(),
            size,
            modification_time: 7,
            data_change: true,
            stats: Some("{\"numRecords\":2}".into()),
            ..Default::default()
        }
    }

    /// Files and counts survive the round trip; summaries of two writers add up.
    #[test]
    fn manifests_round_trip_and_sum() -> Result<()> {
        let written = WrittenFiles {
            adds: vec![
                add("__cdc_bucket=3/a.parquet", 10),
                add("__cdc_bucket=3/b.parquet", 11),
            ],
            change_files: vec![add("_change_data/__cdc_bucket=3/c.parquet", 12)],
        };
        let counts = FoldCounts {
            input_rows: 5,
            upserted: 3,
            deleted: 1,
            tombstones: 1,
            late: 1,
            duplicates: 0,
            events_added: 0,
        };
        let first = encode(&written, &Retired::default(), &counts, false)?;
        assert_eq!(first.num_rows(), 4);
        let second = encode(
            &WrittenFiles::default(),
            &Retired::default(),
            &FoldCounts::default(),
            true,
        )?;
        let mut manifest = Manifest::default();
        manifest.read(&first)?;
        manifest.read(&second)?;
        assert_eq!(manifest.written.adds, written.adds);
        assert_eq!(manifest.written.change_files, written.change_files);
        assert_eq!(manifest.counts.input_rows, 5);
        assert_eq!(manifest.counts.upserted, 3);
        assert_eq!(manifest.counts.late, 1);
        assert!(manifest.truncated);
        assert_eq!(manifest.writers, 2);
        assert!(manifest.changed());
        Ok(())
    }

    /// The actions retiring a statement's stored rows survive the round
    /// trip as they are, apart from the files written.
    #[test]
    fn retired_rows_round_trip() -> Result<()> {
        let file = add("__cdc_bucket=3/a.parquet", 10);
        let remove = deltalake_core::kernel::Remove {
            path: file.path.clone(),
            deletion_timestamp: Some(7),
            data_change: true,
            ..Default::default()
        };
        let retired = Retired(vec![
            Action::Remove(remove.clone()),
            Action::Add(file.clone()),
        ]);
        let written = WrittenFiles {
            adds: vec![add("__cdc_bucket=3/b.parquet", 11)],
            change_files: Vec::new(),
        };
        let mut manifest = Manifest::default();
        manifest.read(&encode(&written, &retired, &FoldCounts::default(), false)?)?;
        assert_eq!(manifest.written.adds, written.adds);
        assert_eq!(
            manifest.retired.0,
            vec![Action::Remove(remove), Action::Add(file)]
        );
        assert_eq!(manifest.retired.files(), 1);
        Ok(())
    }

    /// A summary of a fold that changed nothing, without a watermark, commits no files.
    #[test]
    fn an_unchanged_update_is_seen_as_such() -> Result<()> {
        let counts = FoldCounts {
            input_rows: 4,
            late: 4,
            ..Default::default()
        };
        let mut manifest = Manifest::default();
        manifest.read(&encode(
            &WrittenFiles::default(),
            &Retired::default(),
            &counts,
            false,
        )?)?;
        assert!(!manifest.changed());
        Ok(())
    }
}
