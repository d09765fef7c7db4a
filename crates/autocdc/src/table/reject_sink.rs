//! The events a flow run rejects, from the operators that find them to the
//! file its commit names ([`super::rejects`] delivers it).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, Field, Int8Type, Schema, SchemaRef};
use arrow::json::writer::{LineDelimited, WriterBuilder};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::{DataFusionError, Result};
use deltalake_core::parquet::arrow::ArrowWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use super::meta::MetadataChange;
use crate::fold::columns::{Kind, INTERNAL_PREFIX, KIND_COL, SEQ_COL, SYSTEM_SEQ_COL};

/// The target's state-store property naming its last rejects file.
pub(crate) const PENDING_PROPERTY: &str = "autocdc.rejects.pending";
/// The folder of rejects files not yet delivered, in the state folder.
const PENDING_FOLDER: &str = "_rejects";
/// The pending file's columns: those of the rejects table but
/// `commit_version`, which is known only once the commit is made.
pub(crate) const PENDING_COLUMNS: [&str; 6] =
    ["flow", "reason", "key", "sequence", "change", "row"];

/// The rows of a pending file: every column but `commit_version`.
pub(crate) fn pending_schema() -> SchemaRef {
    Arc::new(Schema::new(
        PENDING_COLUMNS
            .iter()
            .map(|name| Field::new(*name, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ))
}

/// Source lines a scan could not read (a malformed Debezium event), kept
/// for the rejects of the run that read them: line as written, by reason.
/// The reason names file and line, so a line read twice in one run (an SCD
/// 1 flow's source is also read for its truncates) is kept once.
#[derive(Debug, Default)]
pub struct UnreadableLines {
    lines: Mutex<BTreeMap<String, String>>,
}

impl UnreadableLines {
    /// Keep one line (once, however often it is read).
    pub fn push(&self, reason: String, text: String) -> Result<()> {
        self.lines
            .lock()
            .map_err(|_| DataFusionError::Internal("the unreadable lines are poisoned".into()))?
            .entry(reason)
            .or_insert(text);
        Ok(())
    }

    fn taken(&self) -> Result<Vec<(String, String)>> {
        Ok(self
            .lines
            .lock()
            .map_err(|_| DataFusionError::Internal("the unreadable lines are poisoned".into()))?
            .iter()
            .map(|(reason, text)| (reason.clone(), text.clone()))
            .collect())
    }
}

/// The events one flow run rejects, collected by the operators that find
/// them (`RejectsExec`, `ExpectationsExec`) for the run's commit, and the
/// lines its source scan could not read.
#[derive(Debug)]
pub struct RejectSink {
    flow: String,
    keys: Vec<String>,
    batches: Mutex<Vec<RecordBatch>>,
    unreadable: Option<Arc<UnreadableLines>>,
}

impl RejectSink {
    /// A sink for the events of `flow`, whose key columns are `keys` (none
    /// for an append flow).
    pub fn new(flow: String, keys: Vec<String>) -> Self {
        Self {
            flow,
            keys,
            batches: Mutex::new(Vec::new()),
            unreadable: None,
        }
    }

    /// Also reject the lines the run's source scan could not read (reason
    /// as given, the line as `row`; key, sequence and change NULL).
    pub fn with_unreadable(mut self, lines: Option<Arc<UnreadableLines>>) -> Self {
        self.unreadable = lines;
        self
    }

    /// The flow whose events it collects.
    pub fn flow(&self) -> &str {
        &self.flow
    }

    /// The flow's key columns.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// Reject the rows of `events` (target columns, then `__cdc_*`) where
    /// `selected` is true, for `reason`.
    pub fn reject(
        &self,
        events: &RecordBatch,
        selected: &BooleanArray,
        reason: &str,
    ) -> Result<()> {
        if selected.true_count() == 0 {
            return Ok(());
        }
        let rows = filter_record_batch(events, selected)?;
        let n = rows.num_rows();
        let schema = rows.schema();
        let options = FormatOptions::default().with_null("NULL");
        let text = |name: &str| -> Result<Option<Vec<String>>> {
            let Ok(index) = schema.index_of(name) else {
                return Ok(None);
            };
            let formatter = ArrayFormatter::try_new(rows.column(index).as_ref(), &options)?;
            Ok(Some(
                (0..n).map(|i| formatter.value(i).to_string()).collect(),
            ))
        };
        let key: ArrayRef = if self.keys.is_empty() {
            Arc::new(StringArray::new_null(n))
        } else {
            let mut parts: Vec<Vec<String>> = vec![Vec::new(); n];
            for name in &self.keys {
                if let Some(values) = text(name)? {
                    for (row, value) in values.into_iter().enumerate() {
                        parts[row].push(format!("{name}={value}"));
                    }
                }
            }
            Arc::new(StringArray::from_iter_values(
                parts.iter().map(|p| p.join(", ")),
            ))
        };
        let sequence: ArrayRef = match (text(SEQ_COL)?, text(SYSTEM_SEQ_COL)?) {
            // (BITEMPORAL: events that differ in their system sequence alone
            // are two events, a correction and what it corrects)
            // (the formatter shows a NULL as `NULL`)
            (values, Some(system)) => {
                let values = values.unwrap_or_else(|| vec!["NULL".to_string(); n]);
                Arc::new(StringArray::from_iter_values(
                    values
                        .iter()
                        .zip(&system)
                        .map(|(v, s)| format!("{v} (system {s})")),
                ))
            }
            (Some(values), None) => {
                let seq = rows.column(schema.index_of(SEQ_COL)?);
                Arc::new(StringArray::from_iter(
                    values
                        .into_iter()
                        .enumerate()
                        .map(|(i, v)| seq.is_valid(i).then_some(v)),
                ))
            }
            (None, None) => Arc::new(StringArray::new_null(n)),
        };
        let change: ArrayRef = match schema.index_of(KIND_COL) {
            Ok(index) => Arc::new(StringArray::from_iter(
                rows.column(index)
                    .as_primitive_opt::<Int8Type>()
                    .into_iter()
                    .flat_map(|kinds| kinds.iter())
                    .map(|k| k.and_then(Kind::from_code).map(Kind::name)),
            )),
            Err(_) => Arc::new(StringArray::new_null(n)),
        };
        let user: Vec<usize> = (0..schema.fields().len())
            .filter(|&i| !schema.field(i).name().starts_with(INTERNAL_PREFIX))
            .collect();
        let row: ArrayRef = Arc::new(StringArray::from_iter_values(json_rows(
            &rows.project(&user)?,
        )?));
        let batch = RecordBatch::try_new(
            pending_schema(),
            vec![
                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    self.flow.as_str(),
                    n,
                ))),
                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    reason, n,
                ))),
                key,
                sequence,
                change,
                row,
            ],
        )?;
        self.batches
            .lock()
            .map_err(|_| DataFusionError::Internal("the rejects sink is poisoned".into()))?
            .push(batch);
        Ok(())
    }

    /// How many events it holds.
    pub fn rows(&self) -> usize {
        self.batches()
            .map(|b| b.iter().map(RecordBatch::num_rows).sum())
            .unwrap_or(0)
    }

    fn batches(&self) -> Result<Vec<RecordBatch>> {
        let mut batches = self
            .batches
            .lock()
            .map_err(|_| DataFusionError::Internal("the rejects sink is poisoned".into()))?
            .clone();
        let lines = match &self.unreadable {
            Some(lines) => lines.taken()?,
            None => Vec::new(),
        };
        if !lines.is_empty() {
            let n = lines.len();
            batches.push(RecordBatch::try_new(
                pending_schema(),
                vec![
                    Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                        self.flow.as_str(),
                        n,
                    ))),
                    Arc::new(StringArray::from_iter_values(
                        lines.iter().map(|(reason, _)| reason.as_str()),
                    )),
                    Arc::new(StringArray::new_null(n)),
                    Arc::new(StringArray::new_null(n)),
                    Arc::new(StringArray::new_null(n)),
                    Arc::new(StringArray::from_iter_values(
                        lines.iter().map(|(_, text)| text.as_str()),
                    )),
                ],
            )?);
        }
        Ok(batches)
    }
}

/// Each row of `batch` as a JSON object, NULLs included.
fn json_rows(batch: &RecordBatch) -> Result<Vec<String>> {
    let mut buffer = Vec::new();
    {
        let mut writer = WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, LineDelimited>(&mut buffer);
        writer.write(batch)?;
        writer.finish()?;
    }
    let text = String::from_utf8(buffer).map_err(|e| DataFusionError::External(Box::new(e)))?;
    let rows: Vec<String> = text.lines().map(str::to_string).collect();
    if rows.len() != batch.num_rows() {
        return Err(DataFusionError::Internal(format!(
            "rejects: {} JSON rows for {} events",
            rows.len(),
            batch.num_rows()
        )));
    }
    Ok(rows)
}

/// A rejects file written for a commit, not yet delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PendingRejects {
    /// Names the delivery.
    pub id: String,
    /// The file, relative to the target's state store.
    pub path: String,
    /// Its rows.
    pub rows: usize,
    /// Whether its update read its sources again from the start (a full
    /// refresh): an append flow's rows rejected before are rejected again.
    #[serde(default)]
    pub read_again: bool,
    /// When it read again only what came after a `RESTORE` to this target
    /// version: only the rows delivered by later commits are read again.
    #[serde(default)]
    pub read_again_after: Option<i64>,
}

impl PendingRejects {
    /// The state-store property recording it.
    pub(crate) fn property(&self) -> Result<MetadataChange> {
        Ok(MetadataChange::Set(
            PENDING_PROPERTY.to_string(),
            serde_json::to_string(self).map_err(|e| DataFusionError::External(Box::new(e)))?,
        ))
    }

    pub(crate) fn read(properties: &HashMap<String, String>) -> Option<Self> {
        serde_json::from_str(properties.get(PENDING_PROPERTY)?).ok()
    }
}

/// Write what `sink` holds into one Parquet file of the target's state
/// store (not committed); `None` when it holds nothing. `read_again`: see
/// [`PendingRejects::read_again`] and [`PendingRejects::read_again_after`]
/// (`Some(None)`: everything is read again).
pub(crate) async fn write_pending(
    store: &Arc<dyn ObjectStore>,
    sink: &RejectSink,
    read_again: Option<Option<i64>>,
) -> Result<Option<PendingRejects>> {
    let batches = sink.batches()?;
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    if rows == 0 {
        return Ok(None);
    }
    let mut buffer = Vec::new();
    {
        let mut writer = ArrowWriter::try_new(&mut buffer, pending_schema(), None)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        for batch in &batches {
            writer
                .write(batch)
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
        writer
            .close()
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
    }
    let id = uuid::Uuid::new_v4().to_string();
    let path = format!("{PENDING_FOLDER}/{id}.parquet");
    store
        .put(&Path::from(path.as_str()), PutPayload::from(buffer))
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    Ok(Some(PendingRejects {
        id,
        path,
        rows,
        read_again: read_again.is_some(),
        read_again_after: read_again.flatten(),
    }))
}
