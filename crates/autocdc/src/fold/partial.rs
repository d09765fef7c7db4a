//! Partial updates: `IGNORE NULL UPDATES [ON ...]` and
//! `COLUMNS TO UPDATE`.
//!
//! An upsert under a partial-update option writes only some target columns;
//! the others keep the value of the key's current row (NULL when the key has
//! no live row). [`Merger`] rewrites a batch of sorted events so that every
//! upsert row holds the *merged* row it leaves behind, after which the SCD 1
//! and SCD 2 folds apply unchanged:
//!
//! ```text
//!  events of one key (sorted)            per column: the row that last wrote it
//!  ┌─────┬──────┬──────┬────────┐        ┌─────┬──────┬──────┐
//!  │ @1  │ a=1  │ b=1  │ upsert │  ───►  │ @1  │ a@1  │ b@1  │  a=1 b=1
//!  │ @2  │ NULL │ b=2  │ upsert │        │ @2  │ a@1  │ b@2  │  a=1 b=2
//!  │ @3  │ —    │ —    │ delete │        │ @3  │ (reset)     │
//!  │ @4  │ NULL │ b=4  │ upsert │        │ @4  │ NULL │ b@4  │  a=NULL b=4
//!  └─────┴──────┴──────┴────────┘        └─────┴──────┴──────┘
//! ```
//!
//! The merge computes, for each column, the index of the row whose value each
//! merged row takes, then builds the columns with one `take` each. Under
//! `IGNORE NULL UPDATES` a STRUCT column is merged field by field the same
//! way (a NULL field keeps the field's value, recursively; a NULL struct
//! keeps the whole struct).
//!
//! Two chains are folded: a *history* (SCD 2: all events of the key, the
//! chain starts empty; a version read back passes through unchanged, its
//! event being stored raw beside it) and the *latest* row (SCD 1: the stored row is the base;
//! late events and events at or below the truncate watermark are dropped whole).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    make_comparator, Array, ArrayRef, AsArray, RecordBatch, StringArray, StructArray, UInt32Array,
};
use arrow::compute::{cast, concat_batches, take, SortOptions};
use arrow::datatypes::{DataType, Int8Type, SchemaRef};
use arrow::row::{RowConverter, Rows};
use datafusion::common::{DataFusionError, Result};

use super::columns::{all_nullable, EventLayout, Kind, Origin};
use super::errors::{conflict_error, format_key};
use super::kernel::{FoldKernel, GroupCarry};
use super::rows::{row_converter, to_rows};
use super::scd1::{FoldCounts, Scd1Fold};

/// Which partial-update option a flow uses.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, serde::Serialize, serde::Deserialize)]
pub enum PartialUpdates {
    /// `IGNORE NULL UPDATES`: a NULL in one of these target columns keeps the
    /// current value.
    IgnoreNulls(Vec<usize>),
    /// `COLUMNS TO UPDATE`: each event lists the columns it writes
    /// ([`EventLayout::update_list`]).
    ColumnsToUpdate,
}

/// How a key's events chain (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub enum Chain<'a> {
    /// SCD 2: every event, from an empty row.
    History,
    /// SCD 1: from the stored row; drops late events and events at or below
    /// the truncate watermark.
    Latest {
        /// Truncate watermark, if any: new events at or below it are dropped.
        watermark: Option<arrow::row::Row<'a>>,
        /// The greatest TRUNCATE of this update: the stored row goes when at
        /// or below it (see `FoldKernel::observe_stored_watermark`).
        truncated_through: Option<arrow::row::Row<'a>>,
    },
}

/// Rewrites sorted event batches into merged rows (see the module docs).
#[derive(Debug)]
pub struct Merger {
    flow: String,
    layout: EventLayout,
    /// `None`: every upsert writes every column (whole rows).
    mode: Option<PartialUpdates>,
    /// `ignore[c]`: column `c` keeps its value on NULL (IGNORE NULL UPDATES).
    ignore: Vec<bool>,
    /// Target column of a name in a `COLUMNS TO UPDATE` list.
    names: HashMap<String, usize>,
}

impl Merger {
    /// A merger for events of `layout`.
    pub fn new(flow: &str, layout: EventLayout, mode: PartialUpdates) -> Self {
        let n = layout.num_target();
        let mut ignore = vec![false; n];
        if let PartialUpdates::IgnoreNulls(columns) = &mode {
            for &c in columns {
                if c < n && !layout.key_indices.contains(&c) {
                    ignore[c] = true;
                }
            }
        }
        let mut names = HashMap::with_capacity(n * 2);
        for (i, name) in layout.target_columns.iter().enumerate() {
            names.entry(name.to_ascii_lowercase()).or_insert(i);
        }
        for (i, name) in layout.target_columns.iter().enumerate() {
            names.insert(name.clone(), i);
        }
        Self {
            flow: flow.to_string(),
            layout,
            mode: Some(mode),
            ignore,
            names,
        }
    }

    /// A merger of whole rows: every upsert writes every column (what
    /// per-column sequencing sees of a flow without partial updates).
    pub(crate) fn whole_rows(flow: &str, layout: EventLayout) -> Self {
        Self {
            mode: None,
            ..Self::new(flow, layout, PartialUpdates::IgnoreNulls(Vec::new()))
        }
    }

    /// The events' layout.
    pub(crate) fn layout(&self) -> &EventLayout {
        &self.layout
    }

    /// The flow's name (for messages).
    pub(crate) fn flow(&self) -> &str {
        &self.flow
    }

    /// Which target columns each of rows `[0, end)` writes, row-major
    /// (`end × num_target`). Key columns are always written; under
    /// per-column sequencing a row that writes a column of a
    /// [`SequenceGroup`](super::columns::SequenceGroup) writes all of them.
    pub(crate) fn writes(&self, batch: &RecordBatch, end: usize) -> Result<Vec<bool>> {
        let mut writes = self.column_writes(batch, end)?;
        let n = self.layout.num_target();
        for group in self
            .layout
            .sequence_groups
            .iter()
            .filter(|g| g.members.len() > 1)
        {
            for row in writes.chunks_exact_mut(n) {
                if group.members.iter().any(|&c| row[c]) {
                    for &c in &group.members {
                        row[c] = true;
                    }
                }
            }
        }
        Ok(writes)
    }

    fn column_writes(&self, batch: &RecordBatch, end: usize) -> Result<Vec<bool>> {
        let n = self.layout.num_target();
        let mut writes = vec![true; end * n];
        match &self.mode {
            None => {}
            Some(PartialUpdates::IgnoreNulls(_)) => {
                for c in (0..n).filter(|&c| self.ignore[c]) {
                    let column = batch.column(c);
                    if column.null_count() == 0 {
                        continue;
                    }
                    for i in 0..end {
                        writes[i * n + c] = column.is_valid(i);
                    }
                }
            }
            Some(PartialUpdates::ColumnsToUpdate) => {
                let Some(index) = self.layout.update_list() else {
                    return Err(DataFusionError::Internal(
                        "COLUMNS TO UPDATE without its list column".into(),
                    ));
                };
                let lists = batch.column(index).as_list::<i32>();
                let values = cast(lists.values().as_ref(), &DataType::Utf8)?;
                let values: &StringArray = values.as_string::<i32>();
                let offsets = lists.value_offsets();
                let kinds = batch.column(self.layout.kind()).as_primitive::<Int8Type>();
                for i in 0..end {
                    if lists.is_null(i) || kinds.value(i) != Kind::Upsert as i8 {
                        continue;
                    }
                    let row = &mut writes[i * n..(i + 1) * n];
                    for (c, w) in row.iter_mut().enumerate() {
                        *w = self.layout.key_indices.contains(&c);
                    }
                    for j in offsets[i] as usize..offsets[i + 1] as usize {
                        let name = values.is_valid(j).then(|| values.value(j));
                        let column = name.and_then(|name| {
                            self.names
                                .get(name)
                                .or_else(|| self.names.get(&name.to_ascii_lowercase()))
                        });
                        match column {
                            Some(&c) => row[c] = true,
                            None => return Err(self.unknown_column(batch, i, name)),
                        }
                    }
                }
            }
        }
        Ok(writes)
    }

    fn unknown_column(
        &self,
        batch: &RecordBatch,
        row: usize,
        name: Option<&str>,
    ) -> DataFusionError {
        let name = name.map_or_else(|| "NULL".to_string(), |n| format!("'{n}'"));
        DataFusionError::Execution(format!(
            "flow '{}': COLUMNS TO UPDATE: {name} is not a target column (columns: {}), in the event for key ({}) at SEQUENCE BY value {}; nothing was committed",
            self.flow,
            self.layout.target_columns.join(", "),
            format_key(&self.layout.target_columns, &self.layout.key_indices, batch, row),
            datafusion::common::ScalarValue::try_from_array(batch.column(self.layout.seq()), row)
                .map(|s| s.to_string())
                .unwrap_or_default(),
        ))
    }

    /// Rows `[0, end)` of `batch` (whole key groups, sorted by `(keys, seq,
    /// origin)`) with every upsert's target columns replaced by its merged
    /// row. Two new events of one key at equal sequence must be equal (raw)
    /// or the update fails with a conflict.
    pub fn merge(
        &self,
        batch: &RecordBatch,
        end: usize,
        keys: &Rows,
        seqs: &Rows,
        chain: Chain<'_>,
    ) -> Result<RecordBatch> {
        let n = self.layout.num_target();
        let writes = self.writes(batch, end)?;
        let kinds = batch.column(self.layout.kind()).as_primitive::<Int8Type>();
        let origins = batch
            .column(self.layout.origin())
            .as_primitive::<Int8Type>();
        let mut sources: Vec<Vec<Option<u32>>> = (0..n).map(|_| Vec::with_capacity(end)).collect();
        // per column, the row whose value the key's current row holds
        let mut current: Vec<Option<u32>> = vec![None; n];
        let mut live = false;
        let mut stored_seq: Option<usize> = None;
        // per row: `None` passes its own values on, `Some(live)` is an
        // upsert (whether the key had a live row before it)
        let mut steps: Vec<Option<bool>> = Vec::with_capacity(end);
        for i in 0..end {
            if i == 0 || keys.row(i) != keys.row(i - 1) {
                live = false;
                stored_seq = None;
            } else if origins.value(i) == Origin::New as i8
                && origins.value(i - 1) == Origin::New as i8
                && seqs.row(i) == seqs.row(i - 1)
                && !self.same_event(batch, i - 1, i)?
            {
                return Err(conflict_error(&self.flow, &self.layout, batch, i, false));
            }
            let stored = origins.value(i) == Origin::Stored as i8;
            let applies = match chain {
                // a version read back holds the values an earlier update
                // merged, which a late event may have made stale; its event
                // is stored raw beside it, and that is what the chain takes
                Chain::History => origins.value(i) != Origin::Implied as i8,
                Chain::Latest {
                    watermark,
                    truncated_through,
                } => {
                    let truncated = if stored {
                        truncated_through.is_some_and(|w| seqs.row(i) <= w)
                    } else {
                        watermark.is_some_and(|w| seqs.row(i) <= w)
                    };
                    if stored {
                        // the stored row is the base (unless truncated away)
                        stored_seq = Some(i);
                        live = false;
                        current.fill(None);
                        !truncated
                    } else {
                        let late = stored_seq.is_some_and(|s| seqs.row(i) <= seqs.row(s));
                        !truncated && !late
                    }
                }
            };
            if !applies || kinds.value(i) != Kind::Upsert as i8 {
                if applies {
                    // a DELETE: an upsert after it starts from nothing
                    live = false;
                    current.fill(None);
                }
                for s in sources.iter_mut() {
                    s.push(Some(i as u32));
                }
                steps.push(None);
                continue;
            }
            steps.push(Some(live));
            let row_writes = &writes[i * n..(i + 1) * n];
            for (c, s) in sources.iter_mut().enumerate() {
                if row_writes[c] || !live {
                    current[c] = row_writes[c].then_some(i as u32);
                }
                s.push(current[c]);
            }
            live = true;
        }
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
        for (c, s) in sources.into_iter().enumerate() {
            let column = batch.column(c);
            let merged = take(column.as_ref(), &UInt32Array::from(s), None)?;
            // IGNORE NULL UPDATES reaches into structs: a NULL field keeps
            // the field's value (a NULL struct keeps the whole struct)
            let merged = match column.as_struct_opt() {
                Some(structs) if self.ignore[c] => {
                    let written: Vec<bool> = (0..end).map(|i| writes[i * n + c]).collect();
                    merge_struct_fields(structs, &merged, &steps, &written)?
                }
                _ => merged,
            };
            columns.push(merged);
        }
        for column in &batch.columns()[n..] {
            columns.push(column.slice(0, end));
        }
        // unwritten columns of a new key are NULL, even in NOT NULL sources
        Ok(RecordBatch::try_new(
            all_nullable(&batch.schema()),
            columns,
        )?)
    }

    /// Same kind and raw value in every column the flow reads.
    pub(crate) fn same_event(&self, batch: &RecordBatch, a: usize, b: usize) -> Result<bool> {
        let columns = (0..self.layout.num_target())
            .chain([self.layout.kind()])
            .chain(self.layout.update_list());
        for c in columns {
            let column = batch.column(c);
            let cmp = make_comparator(column.as_ref(), column.as_ref(), SortOptions::default())?;
            if cmp(a, b) != Ordering::Equal {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The row each row of a column takes its value from, for a column written
/// where `written` holds, over the chain `steps` (see [`Merger::merge`]).
fn column_sources(steps: &[Option<bool>], written: &[bool]) -> Vec<Option<u32>> {
    let mut current = None;
    steps
        .iter()
        .zip(written)
        .enumerate()
        .map(|(i, (step, &w))| match step {
            None => Some(i as u32),
            Some(live) => {
                if w || !live {
                    current = w.then_some(i as u32);
                }
                current
            }
        })
        .collect()
}

/// `merged` (a struct column already merged as a whole) with each field
/// merged on its own: a field takes its value from the last row that wrote
/// the struct with that field not NULL, recursively.
fn merge_struct_fields(
    column: &StructArray,
    merged: &ArrayRef,
    steps: &[Option<bool>],
    written: &[bool],
) -> Result<ArrayRef> {
    let fields = column
        .columns()
        .iter()
        .map(|field| {
            let field_written: Vec<bool> = written
                .iter()
                .enumerate()
                .map(|(i, &w)| w && field.is_valid(i))
                .collect();
            let sources = UInt32Array::from(column_sources(steps, &field_written));
            let value = take(field.as_ref(), &sources, None)?;
            match field.as_struct_opt() {
                Some(inner) => merge_struct_fields(inner, &value, steps, &field_written),
                None => Ok(value),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(StructArray::try_new(
        column.fields().clone(),
        fields,
        merged.nulls().cloned(),
    )?))
}

/// SCD 1 fold with partial updates: merges whole key groups, then folds the
/// merged rows with [`Scd1Fold`]. A key group spanning batches is carried
/// over as a slice of its rows.
#[derive(Debug)]
pub struct MergingScd1Fold {
    merger: Merger,
    inner: Scd1Fold,
    key_converter: RowConverter,
    seq_converter: RowConverter,
    carry: GroupCarry,
}

impl MergingScd1Fold {
    /// Wrap `inner` (built for the same input) with the merge of `mode`.
    pub fn try_new(
        flow: &str,
        layout: EventLayout,
        mode: PartialUpdates,
        input_schema: &SchemaRef,
        inner: Scd1Fold,
    ) -> Result<Self> {
        Ok(Self {
            key_converter: row_converter(input_schema, &layout.key_indices)?,
            seq_converter: row_converter(input_schema, &[layout.seq()])?,
            carry: GroupCarry::try_new(input_schema, &layout.key_indices)?,
            merger: Merger::new(flow, layout, mode),
            inner,
        })
    }

    fn merge_and_fold(&mut self, batch: &RecordBatch, end: usize) -> Result<Option<RecordBatch>> {
        if end == 0 {
            return Ok(None);
        }
        let layout = &self.merger.layout;
        let keys = to_rows(&self.key_converter, batch, &layout.key_indices)?;
        let seqs = to_rows(&self.seq_converter, batch, &[layout.seq()])?;
        let (watermark, truncated_through) = self.inner.watermark_rows();
        let chain = Chain::Latest {
            watermark: watermark.map(|w| w.row()),
            truncated_through: truncated_through.map(|w| w.row()),
        };
        let merged = self.merger.merge(batch, end, &keys, &seqs, chain)?;
        self.inner.push(&merged)
    }
}

impl FoldKernel for MergingScd1Fold {
    fn observe_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        self.inner.observe_watermark(sequences)
    }

    fn observe_stored_watermark(&mut self, sequences: &ArrayRef) -> Result<()> {
        self.inner.observe_stored_watermark(sequences)
    }

    fn watermark_value(&self) -> Option<&ArrayRef> {
        self.inner.watermark_value()
    }

    fn push(&mut self, batch: &RecordBatch) -> Result<Option<RecordBatch>> {
        if batch.num_rows() == 0 {
            return Ok(None);
        }
        super::errors::check_event_nulls(&self.merger.flow, &self.merger.layout, batch)?;
        let (input, whole) = self.carry.push(batch)?;
        self.merge_and_fold(&input, whole)
    }

    fn expect_whole_groups(&mut self) {
        self.carry.whole_groups();
    }

    fn finish_all(&mut self) -> Result<Option<RecordBatch>> {
        let mut parts = Vec::with_capacity(2);
        if let Some(carry) = self.carry.finish() {
            parts.extend(self.merge_and_fold(&carry, carry.num_rows())?);
        }
        parts.extend(self.inner.finish_all()?);
        match parts.len() {
            0 => Ok(None),
            _ => Ok(Some(concat_batches(self.inner.output_schema(), &parts)?)),
        }
    }

    fn counts(&self) -> FoldCounts {
        self.inner.counts()
    }

    fn output_schema(&self) -> &SchemaRef {
        self.inner.output_schema()
    }
}

#[cfg(test)]
mod tests;
