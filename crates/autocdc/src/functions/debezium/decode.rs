//! Decoding Debezium change events (JSON Lines) into Arrow record batches.
//!
//! A Debezium connector writes one change event per line. A line is either
//! the full Kafka Connect envelope `{"schema": {...}, "payload": {...}}`, the
//! payload alone (converter with `schemas.enable=false`), or a tombstone (an
//! empty line, the literal `null`, or an envelope whose `payload` is null).
//! The payload carries `before`, `after`, `source`, `op` and `ts_ms`.
//!
//! [`DebeziumLayout::infer`] reads a few sample files once: it derives the
//! row columns (from the Connect schema when events carry one, else from the
//! JSON values) and how events are ordered. [`DebeziumLayout::decode`] then
//! turns whole files into batches with `arrow::json` (vectorised; no
//! per-event `serde_json::Value`), followed by a few column kernels for the
//! Debezium conventions arrow does not know (base64 bytes and decimals,
//! nested values kept as JSON text). Rows keep file order.
//!
//! # Rows
//!
//! | `op`               | row columns         | `_before`           |
//! |--------------------|---------------------|---------------------|
//! | `c`, `r` (snapshot)| `after`             | `before` (NULL)     |
//! | `u`                | `after`             | `before` when sent  |
//! | `d`                | `before` (old row or its key) | `before`  |
//! | `t` (truncate)     | all NULL            | NULL                |
//! | `m` (message)      | skipped             |                     |
//! | tombstone          | skipped             |                     |
//!
//! # Sequence (`_seq`)
//!
//! | `source.connector` | [`SequenceKind`] | `_seq`                                   |
//! |--------------------|------------------|------------------------------------------|
//! | `postgresql`       | `PostgresLsn`    | Int64 `source.lsn`                       |
//! | `mysql`, `mariadb` | `MySqlBinlog`    | Struct{file: Utf8, pos: Int64, row: Int32} from `source.file/pos/row` |
//! | `sqlserver`        | `SqlServerLsn`   | Struct{commit_lsn: Utf8, change_lsn: Utf8, event_serial_no: Int64} from `source` |
//! | other              | `TimestampMs`    | Int64 `source.ts_ms`, else the event's `ts_ms` |
//!
//! SQL Server's LSNs are fixed-width hexadecimal text (`00000027:00000758:0003`),
//! so they order as text: by transaction commit, then change, then the
//! event's number within the change (an update's two rows). A snapshot read
//! has neither `change_lsn` nor `event_serial_no` (Debezium sends NULL):
//! they read `''` and `0`, first among the events of its commit LSN; an
//! event without `commit_lsn` has a NULL `_seq`.
//!
//! The connector alone decides: a flow's events are ordered alike in every
//! update, whatever one update's samples hold. A missing sequence value
//! (a PostgreSQL event without `source.lsn`) decodes as a NULL `_seq`,
//! which a flow reports as a NULL sequence (SPEC §2.2) rather than order
//! the event by another measure.
//!
//! # Types (Connect schema → Arrow)
//!
//! | Connect type / logical name                                   | Arrow                          |
//! |---------------------------------------------------------------|--------------------------------|
//! | `int8`, `int16`, `int32`, `int64`                             | Int8, Int16, Int32, Int64      |
//! | `float32`, `float64`                                          | Float32, Float64               |
//! | `boolean`, `string`                                           | Boolean, Utf8                  |
//! | `bytes` (base64 text)                                         | Binary                         |
//! | `io.debezium.time.Date`, `org.apache.kafka.connect.data.Date` (days) | Date32                  |
//! | `io.debezium.time.Time`, `org.apache.kafka.connect.data.Time` (ms)   | Time32(ms)              |
//! | `io.debezium.time.MicroTime` / `NanoTime`                     | Time64(µs) / Time64(ns)        |
//! | `io.debezium.time.Timestamp`, `org.apache.kafka.connect.data.Timestamp` (ms) | Timestamp(ms)   |
//! | `io.debezium.time.MicroTimestamp` / `NanoTimestamp`           | Timestamp(µs) / Timestamp(ns)  |
//! | `io.debezium.time.ZonedTimestamp` (ISO-8601 with offset)      | Timestamp(µs, "UTC")           |
//! | `org.apache.kafka.connect.data.Decimal` (base64 unscaled)     | Decimal128(precision or 38, scale) |
//! | other logical names                                           | their base type's mapping      |
//! | `struct`, `array`, `map`                                      | Utf8 (JSON text)               |
//!
//! Without a schema the values decide: integers → Int64, fractions → Float64,
//! strings → Utf8, booleans → Boolean, objects and arrays → Utf8 JSON text,
//! strings mixed with numbers or booleans → Utf8 (the others read as text),
//! only nulls → Utf8. A column whose values are mostly objects or arrays is
//! nested, else scalar: the values of the other sort fail their events (or
//! are rejects) rather than decide the type of the rest. A flow's events take
//! its target's types: a column the target holds as text stays text
//! (numbers and booleans read as text), any other typed column keeps its
//! type, and values that do not decode into it fail their events
//! ([`DebeziumLayout::infer_known`]). All row columns are nullable.
//!
//! When sample files disagree on a column's type, integers widen
//! (int8 < int16 < int32 < int64), integers meet floats at Float64, and
//! decimals of one scale take the larger precision: one layout decodes
//! every file. A date become a timestamp, or a timestamp or time of day
//! counted in a finer unit, takes the finer type, and the files are then
//! decoded each with a layout of its own (their numbers count days, or
//! milliseconds, or microseconds), cast to it. Any other change (a
//! decimal's scale, text become a number, a type changed within one file)
//! is an error.

use std::fmt::Display;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryBuilder, BooleanArray, Decimal128Builder, RecordBatch, StringArray,
    StringBuilder, StructArray,
};
use arrow::buffer::NullBuffer;
use arrow::compute::kernels::zip::zip;
use arrow::compute::{filter, is_not_null, nullif};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use arrow::json::writer::{make_encoder, EncoderOptions};
use arrow::json::ReaderBuilder;
use base64::Engine;
use datafusion::common::{DataFusionError, Result};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::known_columns::{KnownColumns, ReadsNumbers, RowProblem};

/// Name of the column holding the event's `op` (`c`, `u`, `d`, `r`, `t`).
pub(crate) const OP_COL: &str = "_op";
/// Name of the column holding the event's position in its source's log.
pub(crate) const SEQ_COL: &str = "_seq";
/// Name of the struct column holding the event's `before` row.
pub(crate) const BEFORE_COL: &str = "_before";
/// Most events in one decoded batch.
const MAX_BATCH_ROWS: usize = 1 << 20;

/// A line [`DebeziumLayout::decode_lenient`] left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnreadableLine {
    /// 1-based line number in its file.
    pub line: usize,
    /// Why it could not be decoded (names the file and line).
    pub reason: String,
    /// The line as written.
    pub text: String,
}

/// How the events of one source are ordered (see module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SequenceKind {
    PostgresLsn,
    MySqlBinlog,
    SqlServerLsn,
    TimestampMs,
}

/// The row layout and ordering of one Debezium source, inferred from samples.
#[derive(Debug, Clone)]
pub(crate) struct DebeziumLayout {
    columns: Vec<RowColumn>,
    sequence: SequenceKind,
    /// Whether numbers and booleans may be read into Utf8 columns (only
    /// for schema-less events whose samples mixed strings and other values).
    coerce_primitive: bool,
    schema: SchemaRef,
    /// Raw JSON schema of `{"schema": ..., "payload": {...}}` lines.
    wrapped_raw: SchemaRef,
    /// Raw JSON schema of payload-only lines.
    bare_raw: SchemaRef,
    /// The row columns, to find events with others.
    known: KnownColumns,
    /// Why a truncate event (`op` `t`) cannot be read, when it cannot
    /// (a flow whose target keeps history).
    truncates_refused: Option<Arc<str>>,
}

/// One row column: its output type and how it is read from JSON.
#[derive(Debug, Clone, PartialEq)]
struct RowColumn {
    name: String,
    /// Type in the output batches.
    out: DataType,
    /// Type `arrow::json` decodes the value into.
    raw: DataType,
    conv: Conv,
}

/// The step from the raw decoded array to the output column.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Conv {
    /// `arrow::json` decodes straight into the output type.
    Direct,
    /// Base64 text → Binary.
    Base64Bytes,
    /// Base64 big-endian two's complement unscaled value → Decimal128.
    Base64Decimal,
    /// A nested value (struct, list, map) → its JSON text.
    JsonText,
    /// A date or time whose encoding changed between files (a date become
    /// a timestamp, a timestamp's unit): each file is decoded with a
    /// layout of its own, then cast to `out` ([`DebeziumLayout::decode`]).
    ByFile,
}

impl RowColumn {
    fn direct(name: &str, ty: DataType) -> Self {
        Self {
            name: name.to_string(),
            out: ty.clone(),
            raw: ty,
            conv: Conv::Direct,
        }
    }
}

const DEBEZIUM_TIME: &str = "io.debezium.time.";
const CONNECT_DATA: &str = "org.apache.kafka.connect.data.";

impl DebeziumLayout {
    /// Infer the layout from sample events: `(file name, file bytes)` pairs
    /// (the caller passes the first few files or first ~1 MiB of them).
    /// Error (naming the file) when no event is found.
    #[cfg(test)]
    pub(crate) fn infer(samples: &[(&str, &[u8])]) -> Result<Self> {
        Self::infer_known_or_fail(samples, &Schema::empty())
    }

    /// [`Self::infer_known`], but an error (naming the files) when no
    /// event is found.
    pub(crate) fn infer_known_or_fail(samples: &[(&str, &[u8])], known: &Schema) -> Result<Self> {
        Self::infer_known(samples, known)?.ok_or_else(|| {
            let files: Vec<String> = samples.iter().map(|(f, _)| format!("'{f}'")).collect();
            DataFusionError::Execution(format!(
                "debezium: no change event with a row found in {}",
                if files.is_empty() {
                    "the (empty) sample".to_string()
                } else {
                    files.join(", ")
                }
            ))
        })
    }

    /// The layout of `samples` (see [`Self::infer`]), or `None` when no
    /// event in them has a row (only tombstones, messages or truncates):
    /// their columns are unknown. For events whose columns were read before
    /// as `known` (a flow's target), a schema-less column whose samples hold
    /// only nulls takes its known type instead of Utf8, and numbers or
    /// booleans of a column known as text are read as text: otherwise an
    /// update whose new events happen to leave a column NULL (or the first
    /// one, then later values) would change the column's type.
    pub(crate) fn infer_known(samples: &[(&str, &[u8])], known: &Schema) -> Result<Option<Self>> {
        let mut inference = Inference::default();
        for (file, bytes) in samples {
            inference.add_file(file, bytes)?;
        }
        inference.finish(known)
    }

    /// Output schema: the row columns (in the order of the `after`/`before`
    /// struct), then `_op` (Utf8, not null), `_seq` (see module docs),
    /// `_before` (Struct of the row columns, nullable).
    pub(crate) fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// This layout, but a truncate event fails its file (or is an
    /// unreadable line, see [`Self::decode_lenient`]) for `reason`.
    pub(crate) fn refusing_truncates(mut self, reason: impl Into<Arc<str>>) -> Self {
        self.truncates_refused = Some(reason.into());
        self
    }

    /// How the events are ordered, i.e. what `_seq` holds.
    pub(crate) fn sequence(&self) -> SequenceKind {
        self.sequence
    }

    /// Decode one file's events into batches of at most `batch_rows` rows,
    /// in file order, tombstones and `m` events skipped.
    pub(crate) fn decode(
        &self,
        file: &str,
        bytes: &[u8],
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        if let Some(own) = self.own_layout(file, bytes)? {
            return own
                .decode(file, bytes, batch_rows)?
                .into_iter()
                .map(|batch| self.conform(batch))
                .collect();
        }
        self.decode_lines(file, event_lines(bytes), batch_rows)
    }

    /// For a layout with columns decoded file by file ([`Conv::ByFile`]),
    /// the layout of `file`'s own events, inferred from its head and tail
    /// as the source's is from its files' (lines that do not parse left
    /// to the decoder); `None` for any other layout, or when the file has
    /// no row (its events decode alike in either).
    fn own_layout(&self, file: &str, bytes: &[u8]) -> Result<Option<DebeziumLayout>> {
        if !self.columns.iter().any(|c| c.conv == Conv::ByFile) {
            return Ok(None);
        }
        const HEAD: usize = 1 << 20;
        const TAIL: usize = 256 << 10;
        let tail = match bytes.len() > HEAD + TAIL {
            true => {
                let from = bytes.len() - TAIL;
                let line =
                    memchr::memchr(b'\n', &bytes[from..]).map_or(bytes.len(), |i| from + i + 1);
                &bytes[line..]
            }
            false => &[][..],
        };
        let mut inference = Inference::default();
        for (no, line) in
            event_lines(&bytes[..bytes.len().min(HEAD + TAIL)]).chain(event_lines(tail))
        {
            if let Ok(object) = parse_object(file, no, line) {
                inference.add_event(file, no, line, object)?;
            }
        }
        let Some(mut own) = inference.finish(&Schema::empty())? else {
            return Ok(None);
        };
        if let Some(column) = own.columns.iter().find(|c| c.conv == Conv::ByFile) {
            return Err(file_error(
                file,
                format!(
                    "column '{}' changes its type within the file (to {}); read files \
                     whose events have one type each",
                    column.name, column.out
                ),
            ));
        }
        own.truncates_refused = self.truncates_refused.clone();
        Ok(Some(own))
    }

    /// A batch decoded with a file's own layout ([`Self::own_layout`]) in
    /// this layout's schema: each row column cast to its type here (exact:
    /// the types only count more finely), a column the file lacks NULL.
    fn conform(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let rows = batch.num_rows();
        let fit = |array: Option<&ArrayRef>, column: &RowColumn| -> Result<ArrayRef> {
            Ok(match array {
                Some(array) => arrow::compute::cast(array, &column.out)?,
                None => arrow::array::new_null_array(&column.out, rows),
            })
        };
        let own = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| {
                DataFusionError::Internal(format!("debezium: no column '{name}' decoded"))
            })
        };
        let before = as_struct(own(BEFORE_COL)?, BEFORE_COL)?;
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.columns.len() + 3);
        let mut before_columns: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for column in &self.columns {
            columns.push(fit(batch.column_by_name(&column.name), column)?);
            before_columns.push(fit(before.column_by_name(&column.name), column)?);
        }
        columns.push(Arc::clone(own(OP_COL)?));
        columns.push(Arc::clone(own(SEQ_COL)?));
        columns.push(Arc::new(StructArray::try_new(
            self.row_fields(),
            before_columns,
            before.nulls().cloned(),
        )?));
        Ok(RecordBatch::try_new(self.schema(), columns)?)
    }

    /// [`Self::decode`], but a line that cannot be decoded is left out and
    /// returned — its number, why, and its text — instead of failing the
    /// file (a flow whose target takes rejects). Only a file with such a
    /// line pays for deciding line by line.
    pub(crate) fn decode_lenient(
        &self,
        file: &str,
        bytes: &[u8],
        batch_rows: usize,
    ) -> Result<(Vec<RecordBatch>, Vec<UnreadableLine>)> {
        if let Some(own) = self.own_layout(file, bytes)? {
            let (batches, bad) = own.decode_lenient(file, bytes, batch_rows)?;
            let batches = batches
                .into_iter()
                .map(|batch| self.conform(batch))
                .collect::<Result<_>>()?;
            return Ok((batches, bad));
        }
        if let Ok(batches) = self.decode(file, bytes, batch_rows) {
            return Ok((batches, Vec::new()));
        }
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for (no, line) in event_lines(bytes) {
            match self.decode_lines(file, std::iter::once((no, line)), 1) {
                Ok(_) => good.push((no, line)),
                Err(e) => bad.push(UnreadableLine {
                    line: no,
                    // (the message alone: no "Execution error: " before it)
                    reason: match e {
                        DataFusionError::Execution(message) => message,
                        other => other.strip_backtrace(),
                    },
                    text: String::from_utf8_lossy(line).into_owned(),
                }),
            }
        }
        let batches = self.decode_lines(file, good.into_iter(), batch_rows)?;
        Ok((batches, bad))
    }

    /// Decode the numbered `lines` of `file` (see [`Self::decode`]).
    fn decode_lines<'a>(
        &self,
        file: &str,
        lines: impl Iterator<Item = (usize, &'a [u8])>,
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        // (at most a million lines a batch, whatever batch size the session
        // asks for: buffers are sized by it)
        let batch_rows = batch_rows.clamp(1, MAX_BATCH_ROWS);
        let mut lines = lines.peekable();
        let Some(&(first_no, first)) = lines.peek() else {
            return Ok(vec![]);
        };
        let wrapped = is_wrapped(file, first_no, first)?;
        let raw = if wrapped {
            &self.wrapped_raw
        } else {
            &self.bare_raw
        };
        let mut decoder = self.raw_decoder(raw, batch_rows)?;
        let mut pending: Vec<(usize, &[u8])> = Vec::with_capacity(batch_rows);
        let mut out = vec![];
        for (no, line) in lines {
            if !wrapped && is_envelope_tombstone(line) {
                continue;
            }
            self.check_columns(file, no, line)?;
            feed_line(&mut decoder, file, no, line)?;
            pending.push((no, line));
            if pending.len() == batch_rows {
                self.flush(&mut decoder, raw, wrapped, file, &pending, &mut out)?;
                pending.clear();
            }
        }
        if !pending.is_empty() {
            self.flush(&mut decoder, raw, wrapped, file, &pending, &mut out)?;
        }
        Ok(out)
    }

    /// Error when the event at `line` has a row column the layout lacks
    /// (decoding would leave its values out), or a fraction for a column
    /// read as a whole number (decoding would cut it off).
    fn check_columns(&self, file: &str, no: usize, line: &[u8]) -> Result<()> {
        match self.known.check(line) {
            None => Ok(()),
            Some(RowProblem::Unknown(column)) => {
                let columns: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
                Err(line_error(
                    file,
                    no,
                    format!(
                        "the event has column '{column}', which is not among the columns \
                         ({}) of the samples of the files' first and last events; decoding \
                         it would lose the column's values",
                        columns.join(", ")
                    ),
                ))
            }
            Some(RowProblem::OutOfRange(i, value)) => Err(self.value_error(
                file,
                no,
                i,
                &value,
                "which is past the type's range; reading it would make it infinite",
            )),
            Some(RowProblem::OutOfBounds(i, value)) => Err(self.value_error(
                file,
                no,
                i,
                &value,
                match self.columns[i].raw {
                    DataType::Timestamp(..) => {
                        "which is past what a timestamp kept to the microsecond holds \
                         (Debezium's infinity, say)"
                    }
                    _ => "which is no time of day (from midnight to before the next)",
                },
            )),
            Some(RowProblem::Fraction(i, value)) => Err(self.value_error(
                file,
                no,
                i,
                &value,
                "which is not a whole number it can hold exactly (a fraction, or more \
                 digits than a double holds); reading it would change it",
            )),
        }
    }

    /// The error of an event at `line` giving the row column at `column`
    /// the `value` (as written) it cannot read: `why`.
    fn value_error(
        &self,
        file: &str,
        line: usize,
        column: usize,
        value: &str,
        why: &str,
    ) -> DataFusionError {
        let column = &self.columns[column];
        line_error(
            file,
            line,
            format!(
                "column '{}' is {} and the event gives it {value}, {why}",
                column.name, column.out
            ),
        )
    }

    fn raw_decoder(
        &self,
        raw: &SchemaRef,
        batch_rows: usize,
    ) -> Result<arrow::json::reader::Decoder> {
        Ok(ReaderBuilder::new(Arc::clone(raw))
            .with_batch_size(batch_rows)
            .with_coerce_primitive(self.coerce_primitive)
            .build_decoder()?)
    }

    /// Turn the decoder's buffered lines (`pending`) into an output batch.
    fn flush(
        &self,
        decoder: &mut arrow::json::reader::Decoder,
        raw: &SchemaRef,
        wrapped: bool,
        file: &str,
        pending: &[(usize, &[u8])],
        out: &mut Vec<RecordBatch>,
    ) -> Result<()> {
        let batch = match decoder.flush() {
            Ok(Some(batch)) => batch,
            Ok(None) => return Ok(()),
            Err(e) => return Err(self.locate_error(raw, file, pending, e)),
        };
        let lines: Vec<usize> = pending.iter().map(|(no, _)| *no).collect();
        if let Some(batch) = self.convert(batch, wrapped, file, &lines)? {
            out.push(batch);
        }
        Ok(())
    }

    /// Slow path after a failed batch: decode the lines one by one to name
    /// the first one arrow rejects.
    fn locate_error(
        &self,
        raw: &SchemaRef,
        file: &str,
        pending: &[(usize, &[u8])],
        batch_error: arrow::error::ArrowError,
    ) -> DataFusionError {
        for (no, line) in pending {
            let result = self.raw_decoder(raw, 1).and_then(|mut decoder| {
                decoder.decode(line)?;
                decoder.flush()?;
                Ok(())
            });
            if let Err(e) = result {
                return line_error(file, *no, format!("invalid event: {e}"));
            }
        }
        let first = pending.first().map_or(0, |(no, _)| *no);
        let last = pending.last().map_or(0, |(no, _)| *no);
        DataFusionError::Execution(format!(
            "debezium: file '{file}' lines {first}-{last}: invalid events: {batch_error}"
        ))
    }

    /// The output batch for one raw batch; `None` when every event was
    /// skipped. `lines[i]` is the line number of raw row `i`.
    fn convert(
        &self,
        raw: RecordBatch,
        wrapped: bool,
        file: &str,
        lines: &[usize],
    ) -> Result<Option<RecordBatch>> {
        let payload = if wrapped {
            check_wrapped_lines(&raw, file, lines)?;
            struct_field(&StructArray::from(raw), "payload")?.clone()
        } else {
            StructArray::from(raw)
        };
        let ops = classify_ops(&payload, file, lines, self.truncates_refused.as_deref())?;
        if ops.kept.is_empty() {
            return Ok(None);
        }
        let keep = BooleanArray::from(ops.keep);
        let payload = as_struct(&filter(&payload, &keep)?, "payload")?.clone();
        let lines = ops.kept;
        let after = struct_field(&payload, "after")?;
        let before = struct_field(&payload, "before")?;
        let is_delete =
            BooleanArray::from(ops.kinds.iter().map(|k| *k == b'd').collect::<Vec<_>>());
        let row_nulls = row_null_mask(&ops.kinds, after, before);

        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.columns.len() + 3);
        let mut before_columns: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for (i, column) in self.columns.iter().enumerate() {
            let after_col = convert_column(after.column(i), column, file, &lines)?;
            let before_col = convert_column(before.column(i), column, file, &lines)?;
            let row = zip(&is_delete, &before_col, &after_col)?;
            columns.push(match &row_nulls {
                Some(mask) => nullif(&row, mask)?,
                None => row,
            });
            before_columns.push(before_col);
        }
        columns.push(field(&payload, "op")?.clone());
        columns.push(self.sequence_column(&payload)?);
        columns.push(Arc::new(StructArray::try_new(
            self.row_fields(),
            before_columns,
            before.nulls().cloned(),
        )?));
        Ok(Some(RecordBatch::try_new(self.schema(), columns)?))
    }

    fn row_fields(&self) -> Fields {
        row_fields(&self.columns)
    }

    /// `_seq` for the kept events (see module docs).
    fn sequence_column(&self, payload: &StructArray) -> Result<ArrayRef> {
        let source = struct_field(payload, "source")?;
        match self.sequence {
            SequenceKind::PostgresLsn => Ok(field(source, "lsn")?.clone()),
            SequenceKind::MySqlBinlog => {
                let parts = [
                    field(source, "file")?.clone(),
                    field(source, "pos")?.clone(),
                    field(source, "row")?.clone(),
                ];
                let valid: Vec<bool> = (0..source.len())
                    .map(|i| source.is_valid(i) && parts.iter().all(|p| p.is_valid(i)))
                    .collect();
                Ok(Arc::new(StructArray::try_new(
                    binlog_fields(),
                    parts.to_vec(),
                    Some(NullBuffer::from(valid)),
                )?))
            }
            SequenceKind::SqlServerLsn => {
                // (a snapshot read has neither a change LSN nor a serial
                // number: '' and 0, first among its commit LSN's events —
                // a NULL field would make the whole sequence NULL)
                let least = |column: &ArrayRef, least: ArrayRef| -> Result<ArrayRef> {
                    let typed = arrow::compute::cast(column, least.data_type())?;
                    let least = arrow::array::Scalar::new(least);
                    Ok(zip(&is_not_null(&typed)?, &typed, &least)?)
                };
                let parts = [
                    field(source, "commit_lsn")?.clone(),
                    least(
                        field(source, "change_lsn")?,
                        Arc::new(arrow::array::StringArray::from(vec![""])),
                    )?,
                    least(
                        field(source, "event_serial_no")?,
                        Arc::new(arrow::array::Int64Array::from(vec![0])),
                    )?,
                ];
                let valid: Vec<bool> = (0..source.len())
                    .map(|i| source.is_valid(i) && parts[0].is_valid(i))
                    .collect();
                Ok(Arc::new(StructArray::try_new(
                    sql_server_fields(),
                    parts.to_vec(),
                    Some(NullBuffer::from(valid)),
                )?))
            }
            SequenceKind::TimestampMs => {
                let source_ts = field(source, "ts_ms")?;
                let event_ts = field(payload, "ts_ms")?;
                Ok(zip(&is_not_null(source_ts)?, source_ts, event_ts)?)
            }
        }
    }
}

/// Lines that may hold an event, 1-based, trimmed; blank lines and the
/// literal `null` (Kafka tombstones) are dropped here.
fn event_lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    bytes
        .split(|b| *b == b'\n')
        .enumerate()
        .map(|(i, line)| (i + 1, line.trim_ascii()))
        .filter(|(_, line)| !line.is_empty() && *line != b"null")
}

fn line_error(file: &str, line: usize, msg: impl Display) -> DataFusionError {
    DataFusionError::Execution(format!("debezium: file '{file}' line {line}: {msg}"))
}

fn file_error(file: &str, msg: impl Display) -> DataFusionError {
    DataFusionError::Execution(format!("debezium: file '{file}': {msg}"))
}

/// At most 80 characters of a line, for error messages.
fn snippet(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    match text.char_indices().nth(80) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.into_owned(),
    }
}

/// Parse one line as a JSON object (inference and envelope detection only).
fn parse_object(file: &str, no: usize, line: &[u8]) -> Result<Map<String, Value>> {
    match serde_json::from_slice::<Value>(line) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(line_error(
            file,
            no,
            format!("expected a JSON object: {}", snippet(line)),
        )),
        Err(e) => Err(line_error(file, no, format!("invalid JSON: {e}"))),
    }
}

/// Whether a file's events carry the `{"schema", "payload"}` envelope,
/// judged from its first event.
fn is_wrapped(file: &str, no: usize, first: &[u8]) -> Result<bool> {
    let object = parse_object(file, no, first)?;
    Ok(object.contains_key("payload") && !object.contains_key("op"))
}

/// Whether `line`, in a file of payload-only events, is a tombstone in the
/// envelope (`{"schema": null, "payload": null}`): a sink may write its
/// tombstones so whatever the converter wrote its events as.
fn is_envelope_tombstone(line: &[u8]) -> bool {
    memchr::memmem::find(line, b"\"payload\"").is_some()
        && serde_json::from_slice::<Map<String, Value>>(line).is_ok_and(|object| {
            !object.contains_key("op") && object.get("payload").is_some_and(Value::is_null)
        })
}

/// Hand one line to the decoder, insisting on exactly one JSON object.
fn feed_line(
    decoder: &mut arrow::json::reader::Decoder,
    file: &str,
    no: usize,
    line: &[u8],
) -> Result<()> {
    if line.first() != Some(&b'{') {
        return Err(line_error(
            file,
            no,
            format!("expected a JSON object: {}", snippet(line)),
        ));
    }
    let before = decoder.len();
    let consumed = decoder.decode(line).map_err(|e| {
        let reason = match serde_json::from_slice::<IgnoredAny>(line) {
            Err(json) => json.to_string(),
            Ok(_) => e.to_string(),
        };
        line_error(file, no, format!("invalid JSON: {reason}"))
    })?;
    if decoder.has_partial_record() {
        let reason = serde_json::from_slice::<IgnoredAny>(line)
            .err()
            .map_or_else(|| "incomplete JSON value".to_string(), |e| e.to_string());
        return Err(line_error(file, no, format!("invalid JSON: {reason}")));
    }
    if consumed != line.len() || decoder.len() != before + 1 {
        return Err(line_error(
            file,
            no,
            "invalid JSON: expected exactly one JSON object on the line",
        ));
    }
    Ok(())
}

/// In a file whose first event has the envelope, a payload-only event would
/// otherwise read as a tombstone: reject it.
fn check_wrapped_lines(raw: &RecordBatch, file: &str, lines: &[usize]) -> Result<()> {
    let (Some(payload), Some(op)) = (raw.column_by_name("payload"), raw.column_by_name("op"))
    else {
        return Err(DataFusionError::Internal(
            "debezium: raw envelope batch lacks payload/op".into(),
        ));
    };
    for (i, no) in lines.iter().enumerate() {
        if payload.is_null(i) && op.is_valid(i) {
            return Err(line_error(
                file,
                *no,
                "event without the schema/payload envelope in a file whose first event has it",
            ));
        }
    }
    Ok(())
}

/// The events kept from one raw batch.
struct Ops {
    /// Per raw row: whether it is kept.
    keep: Vec<bool>,
    /// Per kept row: its `op` as a byte (`c`, `u`, `d`, `r`, `t`).
    kinds: Vec<u8>,
    /// Per kept row: its line number.
    kept: Vec<usize>,
}

/// Check every `op` and choose the rows to keep (no tombstones, no `m`).
fn classify_ops(
    payload: &StructArray,
    file: &str,
    lines: &[usize],
    truncates_refused: Option<&str>,
) -> Result<Ops> {
    let op = field(payload, "op")?;
    let op = op
        .as_any()
        .downcast_ref::<StringArray>()
        .ok_or_else(|| DataFusionError::Internal("debezium: op is not Utf8".into()))?;
    let mut ops = Ops {
        keep: Vec::with_capacity(lines.len()),
        kinds: Vec::with_capacity(lines.len()),
        kept: Vec::with_capacity(lines.len()),
    };
    for (i, no) in lines.iter().enumerate() {
        if payload.is_null(i) {
            ops.keep.push(false);
            continue;
        }
        if op.is_null(i) {
            return Err(line_error(file, *no, "event has no 'op'"));
        }
        let kind = match op.value(i) {
            "c" => b'c',
            "u" => b'u',
            "d" => b'd',
            "r" => b'r',
            "t" => match truncates_refused {
                None => b't',
                Some(reason) => return Err(line_error(file, *no, reason)),
            },
            "m" => {
                ops.keep.push(false);
                continue;
            }
            other => {
                return Err(line_error(
                    file,
                    *no,
                    format!("unknown op '{other}' (expected c, u, d, r, t or m)"),
                ))
            }
        };
        ops.keep.push(true);
        ops.kinds.push(kind);
        ops.kept.push(*no);
    }
    Ok(ops)
}

/// Rows whose row columns are NULL: truncates, and events whose chosen
/// struct (`before` for deletes, else `after`) is NULL. `None` when none.
fn row_null_mask(kinds: &[u8], after: &StructArray, before: &StructArray) -> Option<BooleanArray> {
    let mask: Vec<bool> = kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| match kind {
            b't' => true,
            b'd' => before.is_null(i),
            _ => after.is_null(i),
        })
        .collect();
    mask.iter().any(|m| *m).then(|| BooleanArray::from(mask))
}

/// The raw decoded values of one row column → the output column.
fn convert_column(
    raw: &ArrayRef,
    column: &RowColumn,
    file: &str,
    lines: &[usize],
) -> Result<ArrayRef> {
    match column.conv {
        Conv::Direct => Ok(Arc::clone(raw)),
        Conv::Base64Bytes => base64_bytes(raw, column, file, lines),
        Conv::Base64Decimal => base64_decimal(raw, column, file, lines),
        Conv::JsonText => json_text(raw),
        Conv::ByFile => Err(DataFusionError::Internal(format!(
            "debezium: column '{}' is decoded file by file",
            column.name
        ))),
    }
}

fn as_strings<'a>(raw: &'a ArrayRef, column: &RowColumn) -> Result<&'a StringArray> {
    raw.as_any().downcast_ref::<StringArray>().ok_or_else(|| {
        DataFusionError::Internal(format!(
            "debezium: column '{}' not read as Utf8",
            column.name
        ))
    })
}

fn value_error(
    file: &str,
    line: usize,
    column: &RowColumn,
    value: &str,
    what: impl Display,
) -> DataFusionError {
    line_error(
        file,
        line,
        format!(
            "column '{}': {what}: '{}'",
            column.name,
            snippet(value.as_bytes())
        ),
    )
}

fn base64_bytes(
    raw: &ArrayRef,
    column: &RowColumn,
    file: &str,
    lines: &[usize],
) -> Result<ArrayRef> {
    let text = as_strings(raw, column)?;
    let mut builder = BinaryBuilder::with_capacity(text.len(), text.values().len());
    let mut buf = Vec::new();
    for (i, value) in text.iter().enumerate() {
        match value {
            None => builder.append_null(),
            Some(value) => {
                buf.clear();
                base64::engine::general_purpose::STANDARD
                    .decode_vec(value, &mut buf)
                    .map_err(|e| {
                        value_error(
                            file,
                            lines[i],
                            column,
                            value,
                            format!("invalid base64 ({e})"),
                        )
                    })?;
                builder.append_value(&buf);
            }
        }
    }
    Ok(Arc::new(builder.finish()))
}

fn base64_decimal(
    raw: &ArrayRef,
    column: &RowColumn,
    file: &str,
    lines: &[usize],
) -> Result<ArrayRef> {
    let DataType::Decimal128(precision, scale) = column.out else {
        return Err(DataFusionError::Internal(format!(
            "debezium: column '{}' is not Decimal128",
            column.name
        )));
    };
    let text = as_strings(raw, column)?;
    let limit = 10u128.pow(u32::from(precision));
    let mut builder =
        Decimal128Builder::with_capacity(text.len()).with_precision_and_scale(precision, scale)?;
    let mut buf = Vec::new();
    for (i, value) in text.iter().enumerate() {
        let Some(value) = value else {
            builder.append_null();
            continue;
        };
        buf.clear();
        base64::engine::general_purpose::STANDARD
            .decode_vec(value, &mut buf)
            .map_err(|e| {
                value_error(
                    file,
                    lines[i],
                    column,
                    value,
                    format!("invalid base64 ({e})"),
                )
            })?;
        let unscaled = twos_complement_i128(&buf)
            .filter(|v| v.unsigned_abs() < limit)
            .ok_or_else(|| {
                value_error(
                    file,
                    lines[i],
                    column,
                    value,
                    format!("decimal does not fit Decimal128({precision}, {scale})"),
                )
            })?;
        builder.append_value(unscaled);
    }
    Ok(Arc::new(builder.finish()))
}

/// A big-endian two's complement integer (Kafka Connect's Decimal); `None`
/// when it does not fit 128 bits.
fn twos_complement_i128(bytes: &[u8]) -> Option<i128> {
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let fill = if negative { 0xFF } else { 0x00 };
    let cut = bytes.len().saturating_sub(16);
    let (extra, tail) = bytes.split_at(cut);
    if extra.iter().any(|b| *b != fill) {
        return None;
    }
    if !extra.is_empty() && tail.first().is_some_and(|b| (b & 0x80 != 0) != negative) {
        return None;
    }
    let mut buf = [fill; 16];
    buf[16 - tail.len()..].copy_from_slice(tail);
    Some(i128::from_be_bytes(buf))
}

/// Render each nested value as JSON text.
fn json_text(raw: &ArrayRef) -> Result<ArrayRef> {
    let options = EncoderOptions::default().with_explicit_nulls(true);
    let field = Arc::new(Field::new("value", raw.data_type().clone(), true));
    let mut encoder = make_encoder(&field, raw.as_ref(), &options)?;
    let mut builder = StringBuilder::with_capacity(raw.len(), raw.len() * 16);
    let mut buf = Vec::new();
    for i in 0..raw.len() {
        if raw.is_null(i) {
            builder.append_null();
            continue;
        }
        buf.clear();
        encoder.encode(i, &mut buf);
        let text = std::str::from_utf8(&buf)
            .map_err(|e| DataFusionError::Internal(format!("debezium: JSON text: {e}")))?;
        builder.append_value(text);
    }
    Ok(Arc::new(builder.finish()))
}

fn field<'a>(array: &'a StructArray, name: &str) -> Result<&'a ArrayRef> {
    array
        .column_by_name(name)
        .ok_or_else(|| DataFusionError::Internal(format!("debezium: raw batch lacks '{name}'")))
}

fn as_struct<'a>(array: &'a ArrayRef, name: &str) -> Result<&'a StructArray> {
    array
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or_else(|| DataFusionError::Internal(format!("debezium: '{name}' is not a struct")))
}

fn struct_field<'a>(array: &'a StructArray, name: &str) -> Result<&'a StructArray> {
    as_struct(field(array, name)?, name)
}

fn row_fields(columns: &[RowColumn]) -> Fields {
    columns
        .iter()
        .map(|c| Field::new(&c.name, c.out.clone(), true))
        .collect()
}

fn binlog_fields() -> Fields {
    Fields::from(vec![
        Field::new("file", DataType::Utf8, true),
        Field::new("pos", DataType::Int64, true),
        Field::new("row", DataType::Int32, true),
    ])
}

/// `_seq` of SQL Server events (see the module docs).
fn sql_server_fields() -> Fields {
    Fields::from(vec![
        Field::new("commit_lsn", DataType::Utf8, true),
        Field::new("change_lsn", DataType::Utf8, true),
        Field::new("event_serial_no", DataType::Int64, true),
    ])
}

/// What [`DebeziumLayout::infer`] gathers over the sample events.
#[derive(Default)]
struct Inference {
    events: usize,
    /// Columns from Connect schemas, in first-seen order.
    schema_columns: Vec<RowColumn>,
    /// Whether any sampled event carried a Connect schema.
    has_schema: bool,
    /// Columns from values (schema-less events), in first-seen order.
    value_columns: Vec<(String, SeenValues)>,
    /// The first connector seen and its file.
    connector: Option<(String, String)>,
}

/// The JSON kinds seen for one column of schema-less events.
#[derive(Debug, Clone)]
enum ValueKind {
    Null,
    Bool,
    Int,
    Float,
    Str,
    /// Strings mixed with numbers or booleans: Utf8, coercing the others.
    Mixed,
    /// Objects or arrays: a few samples to infer their Arrow type from.
    Nested(Vec<Value>),
}

/// At most this many nested sample values are kept per column.
const NESTED_SAMPLES: usize = 64;

/// The values seen for one column of schema-less events.
#[derive(Debug)]
struct SeenValues {
    /// The kind of its scalar values (`Null` when none).
    scalar: ValueKind,
    /// How many non-null scalar values were seen.
    scalars: usize,
    /// Objects and arrays seen, at most [`NESTED_SAMPLES`] kept.
    nested: Vec<Value>,
    nesteds: usize,
}

impl SeenValues {
    fn new() -> Self {
        Self {
            scalar: ValueKind::Null,
            scalars: 0,
            nested: Vec::new(),
            nesteds: 0,
        }
    }

    fn add(&mut self, value: &Value) {
        let kind = match value {
            Value::Null => return,
            Value::Array(_) | Value::Object(_) => {
                self.nesteds += 1;
                if self.nested.len() < NESTED_SAMPLES {
                    self.nested.push(value.clone());
                }
                return;
            }
            Value::Bool(_) => ValueKind::Bool,
            Value::Number(n) if n.is_i64() || n.is_u64() => ValueKind::Int,
            Value::Number(_) => ValueKind::Float,
            Value::String(_) => ValueKind::Str,
        };
        self.scalars += 1;
        self.scalar = merge_kinds(std::mem::replace(&mut self.scalar, ValueKind::Null), kind);
    }

    /// The column's kind: nested when most of its values are objects or
    /// arrays, else that of its scalars. The values of the other sort do
    /// not decode (their events fail, or are rejects): one stray value does
    /// not decide the type of every other event.
    fn kind(self) -> ValueKind {
        match self.nesteds > self.scalars {
            true => ValueKind::Nested(self.nested),
            false => self.scalar,
        }
    }
}

impl Inference {
    fn add_file(&mut self, file: &str, bytes: &[u8]) -> Result<()> {
        let truncated = !bytes.ends_with(b"\n");
        let last = bytes.split(|b| *b == b'\n').count();
        for (no, line) in event_lines(bytes) {
            let object = match parse_object(file, no, line) {
                Ok(object) => object,
                // the sample may end inside an event
                Err(_) if truncated && no == last => break,
                Err(e) => return Err(e),
            };
            self.add_event(file, no, line, object)?;
        }
        Ok(())
    }

    fn add_event(
        &mut self,
        file: &str,
        no: usize,
        line: &[u8],
        mut object: Map<String, Value>,
    ) -> Result<()> {
        let wrapped = object.contains_key("payload") && !object.contains_key("op");
        let (payload, schema) = if wrapped {
            match object.remove("payload") {
                Some(Value::Object(payload)) => (payload, object.remove("schema")),
                Some(Value::Null) | None => return Ok(()),
                Some(_) => return Err(line_error(file, no, "'payload' is not a JSON object")),
            }
        } else {
            (object, None)
        };
        if payload.get("op").and_then(Value::as_str) == Some("m") {
            return Ok(());
        }
        self.events += 1;
        self.add_source(file, &payload)?;
        match schema.as_ref().and_then(row_schema) {
            Some(fields) => {
                self.has_schema = true;
                for f in fields {
                    self.add_schema_field(file, f)?;
                }
            }
            None => self.add_values(file, no, line, wrapped, &payload)?,
        }
        Ok(())
    }

    /// Track the connector (it decides the sequence: one for every update
    /// of a flow, whatever its samples hold).
    fn add_source(&mut self, file: &str, payload: &Map<String, Value>) -> Result<()> {
        let source = payload.get("source").and_then(Value::as_object);
        let get = |key: &str| source.and_then(|s| s.get(key));
        if let Some(connector) = get("connector").and_then(Value::as_str) {
            match &self.connector {
                None => self.connector = Some((connector.to_string(), file.to_string())),
                Some((seen, seen_file)) if seen != connector => {
                    return Err(DataFusionError::Execution(format!(
                        "debezium: sample events come from different connectors: \
                         '{seen}' (file '{seen_file}') and '{connector}' (file '{file}')"
                    )))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn add_schema_field(&mut self, file: &str, spec: &Value) -> Result<()> {
        let column = connect_column(file, spec)?;
        match self
            .schema_columns
            .iter_mut()
            .find(|c| c.name == column.name)
        {
            None => self.schema_columns.push(column),
            Some(seen) => *seen = widen(file, seen, column)?,
        }
        Ok(())
    }

    /// Infer columns from the `after`/`before` values of a schema-less event.
    fn add_values(
        &mut self,
        file: &str,
        no: usize,
        line: &[u8],
        wrapped: bool,
        payload: &Map<String, Value>,
    ) -> Result<()> {
        // serde_json's maps are sorted: read the key order separately
        let keys: EventKeys = serde_json::from_slice(line)
            .map_err(|e| line_error(file, no, format!("'before'/'after' must be objects: {e}")))?;
        let keys = if wrapped {
            keys.payload.unwrap_or_default()
        } else {
            keys.row
        };
        for (part, names) in [("after", keys.after), ("before", keys.before)] {
            let Some(Value::Object(row)) = payload.get(part) else {
                continue;
            };
            for name in names.unwrap_or_default().0 {
                let value = row.get(&name).unwrap_or(&Value::Null);
                match self.value_columns.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, seen)) => seen.add(value),
                    None => {
                        let mut seen = SeenValues::new();
                        seen.add(value);
                        self.value_columns.push((name, seen));
                    }
                }
            }
        }
        Ok(())
    }

    fn finish(self, known: &Schema) -> Result<Option<DebeziumLayout>> {
        if self.events == 0 {
            return Ok(None);
        }
        let sequence = match self.connector.as_ref().map(|(c, _)| c.as_str()) {
            Some("postgresql") => SequenceKind::PostgresLsn,
            Some("mysql" | "mariadb") => SequenceKind::MySqlBinlog,
            Some("sqlserver") => SequenceKind::SqlServerLsn,
            _ => SequenceKind::TimestampMs,
        };
        let (columns, coerce_primitive) = if self.has_schema {
            (self.schema_columns, false)
        } else {
            let mut mixed = false;
            let mut columns = Vec::with_capacity(self.value_columns.len());
            for (name, seen) in self.value_columns {
                let known = known.field_with_name(&name).ok().map(|f| f.data_type());
                let kind = match (seen.kind(), known.and_then(known_kind)) {
                    (kind, None) => kind,
                    // (a column read as text takes numbers and booleans as
                    // text, nested values as JSON text)
                    (ValueKind::Null | ValueKind::Str, Some(ValueKind::Str)) => ValueKind::Str,
                    (ValueKind::Bool | ValueKind::Int | ValueKind::Float, Some(ValueKind::Str)) => {
                        ValueKind::Mixed
                    }
                    (kind @ (ValueKind::Mixed | ValueKind::Nested(_)), Some(ValueKind::Str)) => {
                        kind
                    }
                    // a typed column keeps its type: values that do not
                    // decode into it fail their events (or are rejects)
                    (_, Some(known)) => known,
                };
                mixed |= matches!(kind, ValueKind::Mixed);
                columns.push(value_column(&name, kind)?);
            }
            (columns, mixed)
        };
        if columns.is_empty() {
            return Ok(None);
        }
        if let Some(taken) = columns
            .iter()
            .find(|c| [OP_COL, SEQ_COL, BEFORE_COL].contains(&c.name.as_str()))
        {
            return Err(DataFusionError::Execution(format!(
                "debezium: the events' rows have a column '{}', a name debezium() gives \
                 a column of its own ({OP_COL}, {SEQ_COL}, {BEFORE_COL}); its values \
                 cannot be read as a row column",
                taken.name
            )));
        }
        Ok(Some(DebeziumLayout::new(
            columns,
            sequence,
            coerce_primitive,
        )))
    }
}

impl DebeziumLayout {
    fn new(columns: Vec<RowColumn>, sequence: SequenceKind, coerce_primitive: bool) -> Self {
        let rows = row_fields(&columns);
        let seq_type = match sequence {
            SequenceKind::MySqlBinlog => DataType::Struct(binlog_fields()),
            SequenceKind::SqlServerLsn => DataType::Struct(sql_server_fields()),
            SequenceKind::PostgresLsn | SequenceKind::TimestampMs => DataType::Int64,
        };
        let mut fields: Vec<Field> = rows.iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(OP_COL, DataType::Utf8, false));
        fields.push(Field::new(SEQ_COL, seq_type, true));
        fields.push(Field::new(BEFORE_COL, DataType::Struct(rows), true));

        let payload = raw_payload_fields(&columns, sequence);
        let wrapped = Schema::new(vec![
            Field::new("payload", DataType::Struct(payload.clone()), true),
            // only to catch payload-only events among enveloped ones
            Field::new("op", DataType::Utf8, true),
        ]);
        let known = KnownColumns::new(
            columns
                .iter()
                .map(|c| (c.name.as_str(), reads_numbers(&c.raw))),
        );
        Self {
            columns,
            sequence,
            coerce_primitive,
            known,
            truncates_refused: None,
            schema: Arc::new(Schema::new(fields)),
            wrapped_raw: Arc::new(wrapped),
            bare_raw: Arc::new(Schema::new(payload)),
        }
    }
}

/// How `arrow::json` reads a number into `raw`: as a whole number (an
/// integer, or a date, time, duration or timestamp count), cutting off any
/// fraction; as a float, reading a number past its range as infinity; or
/// otherwise.
fn reads_numbers(raw: &DataType) -> ReadsNumbers {
    /// A day's count of each unit.
    const DAY: [(TimeUnit, i64); 4] = [
        (TimeUnit::Second, 86_400),
        (TimeUnit::Millisecond, 86_400_000),
        (TimeUnit::Microsecond, 86_400_000_000),
        (TimeUnit::Nanosecond, 86_400_000_000_000),
    ];
    let per_day = |unit: &TimeUnit| DAY.iter().find(|(u, _)| u == unit).map_or(1, |(_, n)| *n);
    match raw {
        DataType::Float64 => ReadsNumbers::Double,
        DataType::Float32 | DataType::Float16 => ReadsNumbers::Single,
        // a time of day: from midnight to before the next
        DataType::Time32(unit) | DataType::Time64(unit) => {
            ReadsNumbers::Within(0, per_day(unit) - 1)
        }
        // a count of seconds or milliseconds that a flow keeps in
        // microseconds (Delta's timestamps): one past that overflows
        DataType::Timestamp(unit @ (TimeUnit::Second | TimeUnit::Millisecond), _) => {
            let scale = per_day(&TimeUnit::Microsecond) / per_day(unit);
            ReadsNumbers::Within(i64::MIN / scale, i64::MAX / scale)
        }
        DataType::Date32 | DataType::Date64 | DataType::Duration(_) | DataType::Timestamp(..) => {
            ReadsNumbers::Whole
        }
        raw if raw.is_integer() => ReadsNumbers::Whole,
        _ => ReadsNumbers::Other,
    }
}

/// The payload fields `arrow::json` reads; everything else is skipped.
fn raw_payload_fields(columns: &[RowColumn], sequence: SequenceKind) -> Fields {
    let row: Fields = columns
        .iter()
        .map(|c| Field::new(&c.name, c.raw.clone(), true))
        .collect();
    let mut source = match sequence {
        SequenceKind::PostgresLsn => vec![Field::new("lsn", DataType::Int64, true)],
        SequenceKind::MySqlBinlog => binlog_fields().iter().map(|f| f.as_ref().clone()).collect(),
        SequenceKind::SqlServerLsn => sql_server_fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect(),
        SequenceKind::TimestampMs => vec![],
    };
    source.push(Field::new("ts_ms", DataType::Int64, true));
    Fields::from(vec![
        Field::new("before", DataType::Struct(row.clone()), true),
        Field::new("after", DataType::Struct(row), true),
        Field::new("source", DataType::Struct(Fields::from(source)), true),
        Field::new("op", DataType::Utf8, true),
        Field::new("ts_ms", DataType::Int64, true),
    ])
}

/// The `fields` of the row struct (`after`, else `before`) in a Connect
/// envelope schema.
fn row_schema(schema: &Value) -> Option<&Vec<Value>> {
    let fields = schema.get("fields")?.as_array()?;
    ["after", "before"].iter().find_map(|part| {
        fields
            .iter()
            .find(|f| f.get("field").and_then(Value::as_str) == Some(part))
            .and_then(|f| f.get("fields"))
            .and_then(Value::as_array)
    })
}

/// A Connect schema parameter (given as a string or a number).
fn parameter(spec: &Value, key: &str) -> Option<i64> {
    match spec.get("parameters")?.get(key)? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// The row column described by one Connect field schema.
fn connect_column(file: &str, spec: &Value) -> Result<RowColumn> {
    let name = spec
        .get("field")
        .and_then(Value::as_str)
        .ok_or_else(|| file_error(file, format!("schema field without a name: {spec}")))?;
    let base = spec.get("type").and_then(Value::as_str).unwrap_or_default();
    let logical = spec.get("name").and_then(Value::as_str).unwrap_or_default();
    let time = logical
        .strip_prefix(DEBEZIUM_TIME)
        .or_else(|| logical.strip_prefix(CONNECT_DATA));
    let temporal = match (time, base) {
        (Some("Date"), "int32") => Some(DataType::Date32),
        (Some("Time"), "int32") => Some(DataType::Time32(TimeUnit::Millisecond)),
        (Some("MicroTime"), "int64") => Some(DataType::Time64(TimeUnit::Microsecond)),
        (Some("NanoTime"), "int64") => Some(DataType::Time64(TimeUnit::Nanosecond)),
        (Some("Timestamp"), "int64") => Some(DataType::Timestamp(TimeUnit::Millisecond, None)),
        (Some("MicroTimestamp"), "int64") => Some(DataType::Timestamp(TimeUnit::Microsecond, None)),
        (Some("NanoTimestamp"), "int64") => Some(DataType::Timestamp(TimeUnit::Nanosecond, None)),
        (Some("ZonedTimestamp"), "string") if logical.starts_with(DEBEZIUM_TIME) => Some(
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        ),
        _ => None,
    };
    if let Some(ty) = temporal {
        return Ok(RowColumn::direct(name, ty));
    }
    if logical == "org.apache.kafka.connect.data.Decimal" && base == "bytes" {
        return decimal_column(file, name, spec);
    }
    let direct = match base {
        "int8" => DataType::Int8,
        "int16" => DataType::Int16,
        "int32" => DataType::Int32,
        "int64" => DataType::Int64,
        "float32" => DataType::Float32,
        "float64" => DataType::Float64,
        "boolean" => DataType::Boolean,
        "string" => DataType::Utf8,
        "bytes" => {
            return Ok(RowColumn {
                name: name.to_string(),
                out: DataType::Binary,
                raw: DataType::Utf8,
                conv: Conv::Base64Bytes,
            })
        }
        "struct" | "array" | "map" => {
            return Ok(RowColumn {
                name: name.to_string(),
                out: DataType::Utf8,
                raw: nested_raw_type(file, name, spec)?,
                conv: Conv::JsonText,
            })
        }
        other => {
            return Err(file_error(
                file,
                format!("column '{name}': unsupported Connect type '{other}'"),
            ))
        }
    };
    Ok(RowColumn::direct(name, direct))
}

fn decimal_column(file: &str, name: &str, spec: &Value) -> Result<RowColumn> {
    let scale = parameter(spec, "scale").unwrap_or(0);
    let precision = parameter(spec, "connect.decimal.precision").unwrap_or(38);
    let (Ok(precision), Ok(scale)) = (u8::try_from(precision), i8::try_from(scale)) else {
        return Err(file_error(
            file,
            format!("column '{name}': bad decimal precision/scale"),
        ));
    };
    if !(1..=38).contains(&precision) || scale < 0 || scale as u8 > precision {
        return Err(file_error(
            file,
            format!(
                "column '{name}': decimal({precision}, {scale}) does not fit Decimal128; \
                 use decimal.handling.mode=string or double"
            ),
        ));
    }
    Ok(RowColumn {
        name: name.to_string(),
        out: DataType::Decimal128(precision, scale),
        raw: DataType::Utf8,
        conv: Conv::Base64Decimal,
    })
}

/// The Arrow type `arrow::json` reads a nested Connect value into (to
/// re-encode it as JSON text): numbers stay numbers, bytes stay base64 text.
fn nested_raw_type(file: &str, name: &str, spec: &Value) -> Result<DataType> {
    let base = spec.get("type").and_then(Value::as_str).unwrap_or_default();
    let unsupported = || {
        file_error(
            file,
            format!("column '{name}': unsupported nested schema {spec}"),
        )
    };
    Ok(match base {
        "int8" | "int16" | "int32" | "int64" => DataType::Int64,
        "float32" | "float64" => DataType::Float64,
        "boolean" => DataType::Boolean,
        "string" | "bytes" => DataType::Utf8,
        "struct" => {
            let fields = spec
                .get("fields")
                .and_then(Value::as_array)
                .ok_or_else(unsupported)?;
            let fields = fields
                .iter()
                .map(|f| {
                    let child = f
                        .get("field")
                        .and_then(Value::as_str)
                        .ok_or_else(unsupported)?;
                    Ok(Field::new(child, nested_raw_type(file, name, f)?, true))
                })
                .collect::<Result<Vec<_>>>()?;
            DataType::Struct(Fields::from(fields))
        }
        "array" => {
            let items = spec.get("items").ok_or_else(unsupported)?;
            DataType::new_list(nested_raw_type(file, name, items)?, true)
        }
        "map" => {
            let keys = spec.get("keys").ok_or_else(unsupported)?;
            let values = spec.get("values").ok_or_else(unsupported)?;
            if keys.get("type").and_then(Value::as_str) != Some("string") {
                return Err(unsupported());
            }
            let entries = Fields::from(vec![
                Field::new("key", DataType::Utf8, false),
                Field::new("value", nested_raw_type(file, name, values)?, true),
            ]);
            DataType::Map(
                Arc::new(Field::new("entries", DataType::Struct(entries), false)),
                false,
            )
        }
        _ => return Err(unsupported()),
    })
}

fn int_rank(ty: &DataType) -> Option<u8> {
    match ty {
        DataType::Int8 => Some(1),
        DataType::Int16 => Some(2),
        DataType::Int32 => Some(3),
        DataType::Int64 => Some(4),
        _ => None,
    }
}

/// The common column of two sample files' versions of one column.
fn widen(file: &str, seen: &RowColumn, new: RowColumn) -> Result<RowColumn> {
    if seen.out == new.out && seen.conv == new.conv {
        return Ok(seen.clone());
    }
    let numeric =
        |t: &DataType| int_rank(t).is_some() || matches!(t, DataType::Float32 | DataType::Float64);
    if seen.conv == Conv::Direct && new.conv == Conv::Direct {
        if let (Some(a), Some(b)) = (int_rank(&seen.out), int_rank(&new.out)) {
            return Ok(if a >= b { seen.clone() } else { new });
        }
        if numeric(&seen.out) && numeric(&new.out) {
            return Ok(RowColumn::direct(&new.name, DataType::Float64));
        }
    }
    // a date become a timestamp, or a finer unit: the values of each file
    // read in its own encoding, then cast to the wider type
    let by_file = seen.conv == Conv::ByFile || new.conv == Conv::ByFile;
    let wider = match by_file && seen.out == new.out {
        true => Some(new.out.clone()),
        false => wider_time(&seen.out, &new.out),
    };
    if let Some(wider) = wider {
        return Ok(RowColumn {
            name: new.name,
            out: wider.clone(),
            raw: wider,
            conv: Conv::ByFile,
        });
    }
    // a decimal's unscaled value reads alike at any precision: the wider
    // one holds both (another scale would read it another way)
    if let (
        Conv::Base64Decimal,
        Conv::Base64Decimal,
        DataType::Decimal128(p1, s1),
        DataType::Decimal128(p2, s2),
    ) = (seen.conv, new.conv, &seen.out, &new.out)
    {
        if s1 == s2 {
            return Ok(if p1 >= p2 { seen.clone() } else { new });
        }
    }
    Err(file_error(
        file,
        format!(
            "column '{}' has type {} in an earlier sample and {} here",
            new.name, seen.out, new.out
        ),
    ))
}

/// The type holding the values of both date/time types `a` and `b`
/// exactly, when they differ only in how finely they count: a date and a
/// timestamp (midnight), two units of a timestamp or of a time of day.
fn wider_time(a: &DataType, b: &DataType) -> Option<DataType> {
    use DataType::{Date32, Time32, Time64, Timestamp};
    let finer = |x: TimeUnit, y: TimeUnit| {
        let rank = |u: &TimeUnit| match u {
            TimeUnit::Second => 0,
            TimeUnit::Millisecond => 1,
            TimeUnit::Microsecond => 2,
            TimeUnit::Nanosecond => 3,
        };
        if rank(&x) >= rank(&y) {
            x
        } else {
            y
        }
    };
    match (a, b) {
        _ if a == b => None,
        (Date32, Timestamp(unit, zone)) | (Timestamp(unit, zone), Date32) => {
            Some(Timestamp(*unit, zone.clone()))
        }
        (Timestamp(x, zx), Timestamp(y, zy)) if zx == zy => {
            Some(Timestamp(finer(*x, *y), zx.clone()))
        }
        (Time32(x) | Time64(x), Time32(y) | Time64(y)) => match finer(*x, *y) {
            unit @ (TimeUnit::Second | TimeUnit::Millisecond) => Some(Time32(unit)),
            unit => Some(Time64(unit)),
        },
        _ => None,
    }
}

/// Two kinds of scalar values of one column.
fn merge_kinds(seen: ValueKind, new: ValueKind) -> ValueKind {
    use ValueKind::*;
    match (seen, new) {
        (Null, k) | (k, Null) => k,
        (Int, Float) | (Float, Int) => Float,
        (a, b) if std::mem::discriminant(&a) == std::mem::discriminant(&b) => a,
        _ => Mixed,
    }
}

/// The kind of values a column of type `ty` read before holds (`None`:
/// one schema-less events do not decode into, e.g. a nested column).
fn known_kind(ty: &DataType) -> Option<ValueKind> {
    match ty {
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 => Some(ValueKind::Str),
        DataType::Boolean => Some(ValueKind::Bool),
        ty if ty.is_integer() => Some(ValueKind::Int),
        ty if ty.is_floating() => Some(ValueKind::Float),
        _ => None,
    }
}

fn value_column(name: &str, kind: ValueKind) -> Result<RowColumn> {
    let ty = match kind {
        ValueKind::Null | ValueKind::Str | ValueKind::Mixed => DataType::Utf8,
        ValueKind::Bool => DataType::Boolean,
        ValueKind::Int => DataType::Int64,
        ValueKind::Float => DataType::Float64,
        ValueKind::Nested(samples) => {
            let wrapped = samples.into_iter().map(|v| {
                let mut object = Map::new();
                object.insert("value".to_string(), v);
                Ok(Value::Object(object))
            });
            let schema = arrow::json::reader::infer_json_schema_from_iterator(wrapped)?;
            let raw = schema
                .field_with_name("value")
                .map(|f| f.data_type().clone())
                .unwrap_or(DataType::Utf8);
            return Ok(RowColumn {
                name: name.to_string(),
                out: DataType::Utf8,
                raw,
                conv: Conv::JsonText,
            });
        }
    };
    Ok(RowColumn::direct(name, ty))
}

/// Keys of a JSON object in document order (serde_json's maps are sorted).
#[derive(Debug, Default)]
struct KeyOrder(Vec<String>);

impl<'de> Deserialize<'de> for KeyOrder {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_any(KeyOrderVisitor)
    }
}

struct KeyOrderVisitor;

impl<'de> Visitor<'de> for KeyOrderVisitor {
    type Value = KeyOrder;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object or null")
    }

    fn visit_unit<E>(self) -> std::result::Result<KeyOrder, E> {
        Ok(KeyOrder::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<KeyOrder, A::Error> {
        let mut keys = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            map.next_value::<IgnoredAny>()?;
            keys.push(key);
        }
        Ok(KeyOrder(keys))
    }
}

/// Key order of the row objects of one payload.
#[derive(Debug, Default, Deserialize)]
struct RowKeys {
    before: Option<KeyOrder>,
    after: Option<KeyOrder>,
}

/// Key order of the row objects of one event, with or without envelope.
#[derive(Debug, Deserialize)]
struct EventKeys {
    payload: Option<RowKeys>,
    #[serde(flatten)]
    row: RowKeys,
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{
        AsArray, BinaryArray, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array,
        Time32MillisecondArray, Time64MicrosecondArray, Time64NanosecondArray,
        TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    };
    use serde_json::json;

    fn pg_source(lsn: i64, ts_ms: i64) -> Value {
        json!({"version": "2.5.0.Final", "connector": "postgresql", "name": "PostgreSQL_server",
               "ts_ms": ts_ms, "snapshot": "false", "db": "postgres", "sequence": "[\"24023119\",\"24023128\"]",
               "schema": "inventory", "table": "customers", "txId": 555, "lsn": lsn, "xmin": null})
    }

    fn mysql_source(file: &str, pos: i64, row: i64) -> Value {
        json!({"version": "2.5.0.Final", "connector": "mysql", "name": "mysql-server-1",
               "ts_ms": 1465581029000i64, "snapshot": "false", "db": "inventory", "table": "customers",
               "server_id": 223344, "gtid": null, "file": file, "pos": pos, "row": row,
               "thread": 7, "query": null})
    }

    fn payload(op: &str, before: Value, after: Value, source: Value) -> Value {
        json!({"before": before, "after": after, "source": source, "op": op,
               "ts_ms": 1559033904863i64, "transaction": null})
    }

    fn field_schema(ty: &str, name: &str, logical: Option<&str>) -> Value {
        let mut f = json!({"type": ty, "optional": true, "field": name});
        if let Some(logical) = logical {
            f["name"] = json!(logical);
            f["version"] = json!(1);
        }
        f
    }

    /// A full Connect envelope with the row schema `row` for `payload`.
    fn envelope(row: &[Value], payload: Value) -> String {
        let value = json!({"type": "struct", "fields": row, "optional": true,
                           "name": "PostgreSQL_server.inventory.customers.Value"});
        let mut before = value.clone();
        before["field"] = json!("before");
        let mut after = value;
        after["field"] = json!("after");
        let source = json!({"type": "struct", "optional": false, "field": "source",
            "name": "io.debezium.connector.postgresql.Source", "fields": [
                {"type": "string", "optional": false, "field": "version"},
                {"type": "string", "optional": false, "field": "connector"},
                {"type": "int64", "optional": true, "field": "lsn"}]});
        json!({"schema": {"type": "struct", "optional": false,
                          "name": "PostgreSQL_server.inventory.customers.Envelope",
                          "fields": [before, after, source,
                                     {"type": "string", "optional": false, "field": "op"},
                                     {"type": "int64", "optional": true, "field": "ts_ms"}]},
               "payload": payload})
        .to_string()
    }

    fn id_name_schema() -> Vec<Value> {
        vec![
            json!({"type": "int32", "optional": false, "field": "id"}),
            field_schema("string", "name", None),
        ]
    }

    fn lines(lines: &[String]) -> Vec<u8> {
        let mut text = lines.join("\n");
        text.push('\n');
        text.into_bytes()
    }

    fn layout_of(file: &str, bytes: &[u8]) -> DebeziumLayout {
        DebeziumLayout::infer(&[(file, bytes)]).unwrap()
    }

    fn decode_all(file: &str, bytes: &[u8]) -> RecordBatch {
        let layout = layout_of(file, bytes);
        let batches = layout.decode(file, bytes, 1024).unwrap();
        assert_eq!(batches.len(), 1);
        batches.into_iter().next().unwrap()
    }

    fn col<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> &'a T {
        batch
            .column_by_name(name)
            .unwrap()
            .as_any()
            .downcast_ref::<T>()
            .unwrap()
    }

    fn strings(array: &ArrayRef) -> Vec<Option<String>> {
        array
            .as_string::<i32>()
            .iter()
            .map(|v| v.map(str::to_string))
            .collect()
    }

    fn err_of(result: Result<impl std::fmt::Debug>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn connect_types_map_to_arrow_types() {
        let schema = vec![
            json!({"type": "int32", "optional": false, "field": "id"}),
            field_schema("int32", "d", Some("io.debezium.time.Date")),
            field_schema("int32", "t", Some("org.apache.kafka.connect.data.Time")),
            field_schema("int64", "mt", Some("io.debezium.time.MicroTime")),
            field_schema("int64", "nt", Some("io.debezium.time.NanoTime")),
            field_schema("int64", "ts", Some("io.debezium.time.Timestamp")),
            field_schema("int64", "mts", Some("io.debezium.time.MicroTimestamp")),
            field_schema("int64", "nts", Some("io.debezium.time.NanoTimestamp")),
            field_schema("string", "zts", Some("io.debezium.time.ZonedTimestamp")),
            json!({"type": "bytes", "optional": true, "field": "price",
                   "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
                   "parameters": {"scale": "2", "connect.decimal.precision": "10"}}),
            field_schema("string", "price_text", None),
            field_schema("float64", "price_double", None),
            field_schema("bytes", "data", None),
            field_schema("string", "doc", Some("io.debezium.data.Json")),
            json!({"type": "struct", "optional": true, "field": "location",
                   "name": "io.debezium.data.geometry.Point", "fields": [
                       {"type": "float64", "optional": false, "field": "x"},
                       {"type": "float64", "optional": false, "field": "y"},
                       {"type": "bytes", "optional": true, "field": "wkb"},
                       {"type": "int32", "optional": true, "field": "srid"}]}),
        ];
        let row1 = json!({"id": 1, "d": 19724, "t": 3_723_004, "mt": 3_723_004_005i64,
            "nt": 3_723_004_005_006i64, "ts": 1_704_164_645_123i64, "mts": 1_704_164_645_123_456i64,
            "nts": 1_704_164_645_123_456_789i64, "zts": "2024-01-02T03:04:05.123456Z",
            "price": "MDk=", "price_text": "123.45", "price_double": 123.45, "data": "AQL/",
            "doc": "{\"a\":1}", "location": {"x": 1.5, "y": -2.0, "wkb": "AQ==", "srid": null}});
        let row2 = json!({"id": 2, "zts": "2024-01-02T03:04:05.5+02:00", "price": "z8c=",
            "price_text": "-123.45", "price_double": -123.45});
        let bytes = lines(&[
            envelope(&schema, payload("c", Value::Null, row1, pg_source(100, 1))),
            envelope(&schema, payload("r", Value::Null, row2, pg_source(101, 2))),
        ]);
        let batch = decode_all("types.json", &bytes);
        let s = batch.schema();
        let ty = |name: &str| s.field_with_name(name).unwrap().data_type().clone();
        assert_eq!(ty("id"), DataType::Int32);
        assert_eq!(ty("price"), DataType::Decimal128(10, 2));
        assert_eq!(
            ty("zts"),
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
        assert_eq!(ty("price_text"), DataType::Utf8);
        assert_eq!(ty("price_double"), DataType::Float64);
        assert_eq!(ty("location"), DataType::Utf8);

        assert_eq!(col::<Int32Array>(&batch, "id").values(), &[1, 2]);
        assert_eq!(col::<Date32Array>(&batch, "d").value(0), 19724);
        assert!(col::<Date32Array>(&batch, "d").is_null(1));
        assert_eq!(
            col::<Time32MillisecondArray>(&batch, "t").value(0),
            3_723_004
        );
        assert_eq!(
            col::<Time64MicrosecondArray>(&batch, "mt").value(0),
            3_723_004_005
        );
        assert_eq!(
            col::<Time64NanosecondArray>(&batch, "nt").value(0),
            3_723_004_005_006
        );
        assert_eq!(
            col::<TimestampMillisecondArray>(&batch, "ts").value(0),
            1_704_164_645_123
        );
        assert_eq!(
            col::<TimestampMicrosecondArray>(&batch, "mts").value(0),
            1_704_164_645_123_456
        );
        assert_eq!(
            col::<TimestampNanosecondArray>(&batch, "nts").value(0),
            1_704_164_645_123_456_789
        );
        let zts = col::<TimestampMicrosecondArray>(&batch, "zts");
        assert_eq!(zts.value(0), 1_704_164_645_123_456);
        assert_eq!(zts.value(1), 1_704_157_445_500_000);
        let price = col::<Decimal128Array>(&batch, "price");
        assert_eq!(price.value(0), 12345);
        assert_eq!(price.value(1), -12345);
        assert_eq!(price.value_as_string(1), "-123.45");
        assert_eq!(
            strings(batch.column_by_name("price_text").unwrap()),
            vec![Some("123.45".into()), Some("-123.45".into())]
        );
        assert_eq!(
            col::<Float64Array>(&batch, "price_double").values(),
            &[123.45, -123.45]
        );
        let data = col::<BinaryArray>(&batch, "data");
        assert_eq!(data.value(0), &[1u8, 2, 255]);
        assert!(data.is_null(1));
        assert_eq!(
            strings(batch.column_by_name("doc").unwrap())[0].as_deref(),
            Some("{\"a\":1}")
        );
        assert_eq!(
            strings(batch.column_by_name("location").unwrap()),
            vec![
                Some(r#"{"x":1.5,"y":-2.0,"wkb":"AQ==","srid":null}"#.into()),
                None
            ]
        );
        assert_eq!(
            strings(batch.column_by_name(OP_COL).unwrap()),
            vec![Some("c".into()), Some("r".into())]
        );
    }

    #[test]
    fn a_row_column_named_like_an_event_column_is_refused() {
        for taken in [OP_COL, SEQ_COL, BEFORE_COL] {
            let event = payload(
                "c",
                Value::Null,
                json!({"id": 1, taken: 2}),
                pg_source(1, 1),
            );
            let bytes = lines(&[event.to_string()]);
            let err = DebeziumLayout::infer(&[("rows.json", &bytes)])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("the events' rows have a column '{taken}'")),
                "{err}"
            );
        }
    }

    #[test]
    fn payload_only_events_infer_types_from_values() {
        // written by hand: `json!` would sort the keys
        let source = pg_source(10, 1).to_string();
        let first = format!(
            r#"{{"before":null,"after":{{"id":1,"name":"Anne","score":1.5,"active":true,"address":{{"city":"Oslo","zip":150}},"tags":["a","b"],"note":null}},"source":{source},"op":"c","ts_ms":1559033904863}}"#
        );
        let source = pg_source(11, 2).to_string();
        let second = format!(
            r#"{{"before":null,"after":{{"id":2,"name":"Bob","score":2,"active":false,"address":null,"tags":[],"note":null}},"source":{source},"op":"c","ts_ms":1559033904863}}"#
        );
        let bytes = lines(&[first, second]);
        let batch = decode_all("bare.json", &bytes);
        let s = batch.schema();
        let names: Vec<&str> = s.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "id", "name", "score", "active", "address", "tags", "note", OP_COL, SEQ_COL,
                BEFORE_COL
            ]
        );
        let types: Vec<&DataType> = s.fields().iter().take(7).map(|f| f.data_type()).collect();
        assert_eq!(
            types,
            [
                &DataType::Int64,
                &DataType::Utf8,
                &DataType::Float64,
                &DataType::Boolean,
                &DataType::Utf8,
                &DataType::Utf8,
                &DataType::Utf8
            ]
        );
        assert_eq!(col::<Int64Array>(&batch, "id").values(), &[1, 2]);
        assert_eq!(col::<Float64Array>(&batch, "score").values(), &[1.5, 2.0]);
        assert_eq!(
            strings(batch.column_by_name("address").unwrap())[0].as_deref(),
            Some(r#"{"city":"Oslo","zip":150}"#)
        );
        assert_eq!(
            strings(batch.column_by_name("tags").unwrap()),
            vec![Some(r#"["a","b"]"#.into()), Some("[]".into())]
        );
        assert_eq!(batch.column_by_name("note").unwrap().null_count(), 2);
        assert_eq!(col::<Int64Array>(&batch, SEQ_COL).values(), &[10, 11]);
    }

    #[test]
    fn tombstones_and_messages_are_skipped() {
        let schema = id_name_schema();
        let row = |id: i64| json!({"id": id, "name": format!("n{id}")});
        let message = json!({"op": "m", "ts_ms": 1, "source": pg_source(7, 1),
                             "message": {"prefix": "p", "content": "AQ=="}});
        let bytes = lines(&[
            envelope(&schema, payload("c", Value::Null, row(1), pg_source(1, 1))),
            String::new(),
            "null".into(),
            "   ".into(),
            json!({"schema": null, "payload": null}).to_string(),
            envelope(&schema, message),
            envelope(&schema, payload("c", Value::Null, row(2), pg_source(2, 1))),
        ]);
        let batch = decode_all("tomb.json", &bytes);
        assert_eq!(col::<Int32Array>(&batch, "id").values(), &[1, 2]);
        // a file of tombstones only
        let layout = layout_of("tomb.json", &bytes);
        assert!(layout
            .decode("empty.json", b"\nnull\n\n", 10)
            .unwrap()
            .is_empty());
        // payload-only events, their tombstones in the envelope
        let bare = lines(&[
            payload(
                "c",
                Value::Null,
                json!({"id": 1, "name": "a"}),
                pg_source(1, 1),
            )
            .to_string(),
            json!({"schema": null, "payload": null}).to_string(),
            json!({"payload": null}).to_string(),
            payload(
                "c",
                Value::Null,
                json!({"id": 2, "name": "b"}),
                pg_source(2, 1),
            )
            .to_string(),
        ]);
        let batch = decode_all("bare.json", &bare);
        assert_eq!(col::<Int64Array>(&batch, "id").values(), &[1, 2]);
    }

    #[test]
    fn rows_follow_op_deletes_take_before_truncates_are_null() {
        let schema = id_name_schema();
        let bytes = lines(&[
            envelope(
                &schema,
                payload(
                    "c",
                    Value::Null,
                    json!({"id": 1, "name": "a"}),
                    pg_source(1, 1),
                ),
            ),
            envelope(
                &schema,
                payload(
                    "u",
                    json!({"id": 1, "name": "a"}),
                    json!({"id": 1, "name": "b"}),
                    pg_source(2, 1),
                ),
            ),
            envelope(
                &schema,
                payload(
                    "d",
                    json!({"id": 1, "name": null}),
                    Value::Null,
                    pg_source(3, 1),
                ),
            ),
            envelope(
                &schema,
                payload("t", Value::Null, Value::Null, pg_source(4, 1)),
            ),
        ]);
        let batch = decode_all("ops.json", &bytes);
        let id = col::<Int32Array>(&batch, "id");
        assert_eq!(
            id.iter().collect::<Vec<_>>(),
            vec![Some(1), Some(1), Some(1), None]
        );
        assert_eq!(
            strings(batch.column_by_name("name").unwrap()),
            vec![Some("a".into()), Some("b".into()), None, None]
        );
        assert_eq!(
            strings(batch.column_by_name(OP_COL).unwrap()),
            ["c", "u", "d", "t"].map(|s| Some(s.to_string())).to_vec()
        );
        let before = col::<StructArray>(&batch, BEFORE_COL);
        assert_eq!(before.len(), 4);
        assert_eq!(
            (0..4).map(|i| before.is_valid(i)).collect::<Vec<_>>(),
            vec![false, true, true, false]
        );
        let before_name = before.column_by_name("name").unwrap();
        assert_eq!(before_name.as_string::<i32>().value(1), "a");
        let before_id = before
            .column_by_name("id")
            .unwrap()
            .as_primitive::<arrow::datatypes::Int32Type>();
        assert_eq!(before_id.value(2), 1);
        assert_eq!(col::<Int64Array>(&batch, SEQ_COL).values(), &[1, 2, 3, 4]);
    }

    #[test]
    fn postgres_events_sequence_by_lsn() {
        let schema = id_name_schema();
        let bytes = lines(&[envelope(
            &schema,
            payload(
                "c",
                Value::Null,
                json!({"id": 1, "name": "a"}),
                pg_source(24023128, 1),
            ),
        )]);
        let layout = layout_of("pg.json", &bytes);
        assert_eq!(layout.sequence(), SequenceKind::PostgresLsn);
        assert_eq!(
            layout
                .schema()
                .field_with_name(SEQ_COL)
                .unwrap()
                .data_type(),
            &DataType::Int64
        );
        let batch = &layout.decode("pg.json", &bytes, 8).unwrap()[0];
        assert_eq!(col::<Int64Array>(batch, SEQ_COL).values(), &[24023128]);
    }

    #[test]
    fn sql_server_events_sequence_by_commit_then_change_lsn() {
        let source = |commit: Option<&str>, change: Option<&str>, serial: Option<i64>| {
            json!({"version": "2.5.0.Final", "connector": "sqlserver", "name": "ss",
                   "ts_ms": 1700000005000i64, "snapshot": "false", "db": "shop",
                   "schema": "dbo", "table": "customers", "change_lsn": change,
                   "commit_lsn": commit, "event_serial_no": serial})
        };
        let row = |qty: i64| json!({"id": 1, "qty": qty});
        let lines = [
            // a snapshot read: no change LSN
            payload(
                "r",
                Value::Null,
                row(1),
                source(Some("00000025:00000d98:0003"), None, None),
            ),
            // two updates of one transaction: one commit LSN and ts_ms
            payload(
                "u",
                row(1),
                row(2),
                source(
                    Some("00000026:00000010:0009"),
                    Some("00000026:00000010:0002"),
                    Some(1),
                ),
            ),
            payload(
                "u",
                row(2),
                row(3),
                source(
                    Some("00000026:00000010:0009"),
                    Some("00000026:00000010:0004"),
                    Some(2),
                ),
            ),
            payload("u", row(3), row(4), source(None, None, None)),
        ];
        let bytes = lines
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        let layout = layout_of("ss.json", bytes.as_bytes());
        assert_eq!(layout.sequence(), SequenceKind::SqlServerLsn);
        let batch = &layout.decode("ss.json", bytes.as_bytes(), 100).unwrap()[0];
        let seq = col::<StructArray>(batch, SEQ_COL);
        assert_eq!(seq.fields(), &sql_server_fields());
        // ordered as the events happened, in the row format the folds use
        let converter = arrow::row::RowConverter::new(vec![arrow::row::SortField::new(
            DataType::Struct(sql_server_fields()),
        )])
        .unwrap();
        let rows = converter
            .convert_columns(&[Arc::new(seq.clone()) as ArrayRef])
            .unwrap();
        assert!(rows.row(0) < rows.row(1) && rows.row(1) < rows.row(2));
        assert!(seq.is_valid(0), "a snapshot read has a sequence");
        // whose every field is one (a NULL field would be a NULL sequence)
        assert!(seq.columns().iter().all(|c| c.is_valid(0)));
        assert!(seq.is_null(3), "no commit LSN: a NULL sequence");
    }

    #[test]
    fn mysql_events_sequence_by_binlog_position() {
        let row = |id: i64| json!({"id": id, "first_name": "Anne"});
        let bytes = lines(&[
            payload(
                "c",
                Value::Null,
                row(1004),
                mysql_source("mysql-bin.000003", 484, 0),
            )
            .to_string(),
            payload(
                "u",
                row(1004),
                row(1004),
                mysql_source("mysql-bin.000003", 805, 1),
            )
            .to_string(),
            payload("d", row(1004), Value::Null, {
                let mut s = mysql_source("mysql-bin.000004", 154, 0);
                s["pos"] = Value::Null;
                s
            })
            .to_string(),
        ]);
        // the sample ends inside the third event (the one without pos),
        // as a sample of the first bytes of a file may
        let cut = bytes.len() - 40;
        let layout = DebeziumLayout::infer(&[("mysql.json", &bytes[..cut])]).unwrap();
        assert_eq!(layout.sequence(), SequenceKind::MySqlBinlog);
        let batch = &layout.decode("mysql.json", &bytes, 100).unwrap()[0];
        let seq = col::<StructArray>(batch, SEQ_COL);
        assert_eq!(seq.fields(), &binlog_fields());
        let file = seq.column_by_name("file").unwrap().as_string::<i32>();
        let pos = seq
            .column_by_name("pos")
            .unwrap()
            .as_primitive::<arrow::datatypes::Int64Type>();
        let row = seq
            .column_by_name("row")
            .unwrap()
            .as_any()
            .downcast_ref::<Int32Array>()
            .unwrap();
        assert_eq!(
            (file.value(0), pos.value(0), row.value(0)),
            ("mysql-bin.000003", 484, 0)
        );
        assert_eq!(
            (file.value(1), pos.value(1), row.value(1)),
            ("mysql-bin.000003", 805, 1)
        );
        assert!(seq.is_valid(1));
        assert!(seq.is_null(2), "a missing pos makes _seq NULL");
    }

    #[test]
    fn other_connectors_sequence_by_timestamp() {
        let source = json!({"version": "2.5.0.Final", "connector": "oracle", "name": "server1",
                            "ts_ms": 1559729468470i64, "db": "testDB", "schema": "dbo", "table": "customers"});
        let mut no_ts = source.clone();
        no_ts["ts_ms"] = Value::Null;
        let bytes = lines(&[
            payload("c", Value::Null, json!({"id": 1}), source).to_string(),
            payload("c", Value::Null, json!({"id": 2}), no_ts).to_string(),
            payload("c", Value::Null, json!({"id": 3}), Value::Null).to_string(),
        ]);
        let layout = layout_of("ora.json", &bytes);
        assert_eq!(layout.sequence(), SequenceKind::TimestampMs);
        let batch = &layout.decode("ora.json", &bytes, 100).unwrap()[0];
        assert_eq!(
            col::<Int64Array>(batch, SEQ_COL).values(),
            &[1559729468470, 1559033904863, 1559033904863]
        );
    }

    /// The connector decides the sequence, not what a sample holds: a
    /// PostgreSQL event without an LSN has a NULL `_seq` (an error to a
    /// flow), never a timestamp that would order it among LSNs.
    #[test]
    fn a_postgres_event_without_lsn_has_no_sequence() {
        let mut pg = pg_source(1, 5);
        pg["lsn"] = Value::Null;
        let bytes = lines(&[
            payload("c", Value::Null, json!({"id": 1}), pg).to_string(),
            payload("c", Value::Null, json!({"id": 2}), pg_source(30, 6)).to_string(),
        ]);
        let layout = layout_of("pg.json", &bytes);
        assert_eq!(layout.sequence(), SequenceKind::PostgresLsn);
        let batch = &layout.decode("pg.json", &bytes, 100).unwrap()[0];
        let seq = col::<Int64Array>(batch, SEQ_COL);
        assert!(seq.is_null(0));
        assert_eq!(seq.value(1), 30);
    }

    /// Samples without any row image (tombstones, messages, truncates)
    /// leave the columns unknown: no layout, so that the reader can take
    /// one from files read before.
    #[test]
    fn samples_without_a_row_have_no_layout() {
        let truncate = json!({"op": "t", "ts_ms": 1, "source": pg_source(20, 1),
                              "before": null, "after": null});
        let message = json!({"op": "m", "ts_ms": 1, "source": pg_source(21, 1),
                             "message": {"prefix": "p", "content": "aGk="}});
        let bytes = lines(&[
            "null".to_string(),
            truncate.to_string(),
            message.to_string(),
        ]);
        assert!(
            DebeziumLayout::infer_known(&[("t.json", &bytes)], &Schema::empty())
                .unwrap()
                .is_none()
        );
        let err = err_of(DebeziumLayout::infer(&[("t.json", &bytes)]));
        assert!(
            err.contains("no change event with a row found in 't.json'"),
            "{err}"
        );
    }

    #[test]
    fn mixed_connectors_are_an_error() {
        let pg = lines(&[payload("c", Value::Null, json!({"id": 1}), pg_source(1, 1)).to_string()]);
        let my = lines(&[payload(
            "c",
            Value::Null,
            json!({"id": 1}),
            mysql_source("b.000001", 4, 0),
        )
        .to_string()]);
        let err = err_of(DebeziumLayout::infer(&[("a.json", &pg), ("b.json", &my)]));
        assert!(err.contains("'postgresql' (file 'a.json')"), "{err}");
        assert!(err.contains("'mysql' (file 'b.json')"), "{err}");
    }

    #[test]
    fn no_event_is_an_error() {
        let err = err_of(DebeziumLayout::infer(&[("empty.json", b"\nnull\n")]));
        assert!(
            err.contains("no change event with a row found in 'empty.json'"),
            "{err}"
        );
    }

    #[test]
    fn schemas_of_sample_files_are_united() {
        let old = id_name_schema();
        let mut new = vec![
            json!({"type": "int64", "optional": false, "field": "id"}),
            field_schema("string", "name", None),
            field_schema("string", "email", None),
        ];
        let f1 = lines(&[envelope(
            &old,
            payload(
                "c",
                Value::Null,
                json!({"id": 1, "name": "a"}),
                pg_source(1, 1),
            ),
        )]);
        let f2 = lines(&[envelope(
            &new,
            payload(
                "c",
                Value::Null,
                json!({"id": 2, "name": "b", "email": "b@x"}),
                pg_source(2, 1),
            ),
        )]);
        let layout = DebeziumLayout::infer(&[("f1.json", &f1), ("f2.json", &f2)]).unwrap();
        let s = layout.schema();
        let names: Vec<&str> = s.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "name", "email", OP_COL, SEQ_COL, BEFORE_COL]);
        assert_eq!(s.field(0).data_type(), &DataType::Int64);
        let b1 = &layout.decode("f1.json", &f1, 10).unwrap()[0];
        assert_eq!(col::<Int64Array>(b1, "id").values(), &[1]);
        assert!(b1.column_by_name("email").unwrap().is_null(0));
        let b2 = &layout.decode("f2.json", &f2, 10).unwrap()[0];
        assert_eq!(
            strings(b2.column_by_name("email").unwrap()),
            vec![Some("b@x".into())]
        );

        // a real type change is an error naming the column, types and file
        new[1] = field_schema("boolean", "name", None);
        let f3 = lines(&[envelope(
            &new,
            payload(
                "c",
                Value::Null,
                json!({"id": 3, "name": true}),
                pg_source(3, 1),
            ),
        )]);
        let err = err_of(DebeziumLayout::infer(&[("f1.json", &f1), ("f3.json", &f3)]));
        assert!(err.contains("'f3.json'") && err.contains("'name'"), "{err}");
        assert!(err.contains("Utf8") && err.contains("Boolean"), "{err}");
    }

    #[test]
    fn a_date_become_a_timestamp_reads_each_file_in_its_own_encoding() {
        let event = |ty: &str, logical: &str, id: i64, d: i64| {
            let fields = [
                json!({"type": "int64", "optional": false, "field": "id"}),
                field_schema(ty, "d", Some(logical)),
            ];
            let after = json!({"id": id, "d": d});
            envelope(&fields, payload("c", Value::Null, after, pg_source(id, 1)))
        };
        // 2024-01-02 as days, then as milliseconds and as microseconds
        let f1 = lines(&[event("int32", "io.debezium.time.Date", 1, 19724)]);
        let f2 = lines(&[event(
            "int64",
            "io.debezium.time.Timestamp",
            2,
            1_704_153_600_500,
        )]);
        let f3 = lines(&[event(
            "int64",
            "io.debezium.time.MicroTimestamp",
            3,
            1_704_153_600_000_007,
        )]);
        let files = [
            ("f1.json", &f1[..]),
            ("f2.json", &f2[..]),
            ("f3.json", &f3[..]),
        ];
        let layout = DebeziumLayout::infer(&files).unwrap();
        let micros = DataType::Timestamp(TimeUnit::Microsecond, None);
        assert_eq!(layout.schema().field(1).data_type(), &micros);
        let values: Vec<i64> = files
            .iter()
            .map(|(name, bytes)| {
                let batches = layout.decode(name, bytes, 10).unwrap();
                let d = batches[0].column_by_name("d").unwrap();
                assert_eq!(d.data_type(), &micros);
                d.as_primitive::<arrow::datatypes::TimestampMicrosecondType>()
                    .value(0)
            })
            .collect();
        assert_eq!(
            values,
            [
                1_704_153_600_000_000,
                1_704_153_600_500_000,
                1_704_153_600_000_007
            ]
        );
        // the other layouts decode as before
        let (batches, bad) = layout.decode_lenient("f1.json", &f1, 10).unwrap();
        assert!(bad.is_empty());
        assert_eq!(batches[0].schema(), layout.schema());
        // a file whose events change the type is an error naming it
        let mixed = [f1.clone(), f3.clone()].concat();
        let err = err_of(layout.decode("mixed.json", &mixed, 10));
        assert!(
            err.contains("'mixed.json'") && err.contains("column 'd' changes its type"),
            "{err}"
        );
    }

    #[test]
    fn decimals_of_one_scale_widen_to_the_larger_precision() {
        let decimal = |precision: &str, scale: &str| {
            json!({"type": "bytes", "optional": true, "field": "price",
                   "name": "org.apache.kafka.connect.data.Decimal",
                   "parameters": {"scale": scale, "connect.decimal.precision": precision}})
        };
        let file = |precision: &str, scale: &str, id: i64, price: &str| {
            let id_field = json!({"type": "int64", "optional": false, "field": "id"});
            let after = json!({"id": id, "price": price});
            let event = payload("c", Value::Null, after, pg_source(id, 1));
            lines(&[envelope(&[id_field, decimal(precision, scale)], event)])
        };
        // 1.23 and 12345678.90 (unscaled 123 and 1234567890)
        let f1 = file("5", "2", 1, "ew==");
        let f2 = file("10", "2", 2, "SZYC0g==");
        let layout = DebeziumLayout::infer(&[("f1.json", &f1), ("f2.json", &f2)]).unwrap();
        assert_eq!(
            layout.schema().field(1).data_type(),
            &DataType::Decimal128(10, 2)
        );
        let b1 = &layout.decode("f1.json", &f1, 10).unwrap()[0];
        let b2 = &layout.decode("f2.json", &f2, 10).unwrap()[0];
        assert_eq!(col::<Decimal128Array>(b1, "price").value(0), 123);
        assert_eq!(col::<Decimal128Array>(b2, "price").value(0), 1234567890);
        // another scale reads the unscaled values otherwise: an error
        let f3 = file("10", "3", 3, "ew==");
        let err = err_of(DebeziumLayout::infer(&[("f1.json", &f1), ("f3.json", &f3)]));
        assert!(err.contains("'price' has type Decimal128(5, 2)"), "{err}");
    }

    #[test]
    fn malformed_json_names_file_and_line() {
        let good = payload("c", Value::Null, json!({"id": 1}), pg_source(1, 1)).to_string();
        let bytes = lines(&[
            good.clone(),
            good.clone(),
            "{\"op\": \"c\", \"after\": {\"id\": 3".into(),
            good.clone(),
        ]);
        let layout = layout_of("cdc/part-3.json", &lines(std::slice::from_ref(&good)));
        let err = err_of(layout.decode("cdc/part-3.json", &bytes, 100));
        assert!(
            err.contains("file 'cdc/part-3.json' line 3: invalid JSON"),
            "{err}"
        );

        let bytes = lines(&[
            payload("c", Value::Null, json!({"id": 1}), pg_source(1, 1)).to_string(),
            "[1, 2]".into(),
        ]);
        let err = err_of(layout.decode("x.json", &bytes, 100));
        assert!(
            err.contains("file 'x.json' line 2: expected a JSON object"),
            "{err}"
        );
    }

    #[test]
    fn wrong_value_type_names_the_line() {
        let ev =
            |id: Value| payload("c", Value::Null, json!({"id": id}), pg_source(1, 1)).to_string();
        let bytes = lines(&[
            ev(json!(1)),
            ev(json!(2)),
            ev(json!(3)),
            ev(json!({"x": 1})),
        ]);
        let layout = layout_of("t.json", &lines(&[ev(json!(1))]));
        let err = err_of(layout.decode("t.json", &bytes, 100));
        assert!(err.contains("file 't.json' line 4: invalid event"), "{err}");
    }

    #[test]
    fn a_fraction_in_an_integer_column_is_an_error_not_cut_off() {
        let ev = |id: Value, qty: Value| {
            payload(
                "c",
                Value::Null,
                json!({"id": id, "qty": qty}),
                pg_source(1, 1),
            )
            .to_string()
        };
        let layout = layout_of("t.json", &lines(&[ev(json!(1), json!(5))]));
        let err = err_of(layout.decode("t.json", &lines(&[ev(json!(2), json!(1.5))]), 100));
        assert!(
            err.contains("file 't.json' line 1: column 'qty' is Int64 and the event gives it 1.5, which is not a whole number"),
            "{err}"
        );
        let err = err_of(layout.decode("t.json", &lines(&[ev(json!("2.7"), json!(1))]), 100));
        assert!(err.contains("column 'id' is Int64"), "{err}");
        // whole numbers written as fractions are those numbers
        let whole = lines(&[ev(json!(1), json!(5)), ev(json!(2.0), json!(1e1))]);
        let batches = layout.decode("t.json", &whole, 100).unwrap();
        let batch = &batches[0];
        assert_eq!(col::<Int64Array>(batch, "id").values(), &[1, 2]);
        assert_eq!(col::<Int64Array>(batch, "qty").values(), &[5, 10]);
    }

    #[test]
    fn a_time_past_a_day_or_a_timestamp_past_microseconds_is_an_error() {
        let schema = vec![
            json!({"type": "int32", "optional": false, "field": "id"}),
            field_schema("int64", "mt", Some("io.debezium.time.MicroTime")),
            field_schema("int64", "ts", Some("io.debezium.time.Timestamp")),
        ];
        let ev = |id: i64, mt: i64, ts: i64| {
            envelope(
                &schema,
                payload(
                    "c",
                    Value::Null,
                    json!({"id": id, "mt": mt, "ts": ts}),
                    pg_source(1, 1),
                ),
            )
        };
        let fine = lines(&[ev(1, 0, 0), ev(2, 86_399_999_999, -1_000)]);
        let layout = layout_of("t.json", &fine);
        assert_eq!(
            layout.decode("t.json", &fine, 100).unwrap()[0].num_rows(),
            2
        );
        // PostgreSQL's TIME '24:00:00', and Debezium's infinity
        let err = err_of(layout.decode("t.json", &lines(&[ev(3, 86_400_000_000, 0)]), 100));
        assert!(
            err.contains("line 1: column 'mt' is Time64(µs) and the event gives it 86400000000, which is no time of day"),
            "{err}"
        );
        let err = err_of(layout.decode("t.json", &lines(&[ev(3, -5, 0)]), 100));
        assert!(
            err.contains("gives it -5, which is no time of day"),
            "{err}"
        );
        let err = err_of(layout.decode("t.json", &lines(&[ev(3, 1, i64::MAX)]), 100));
        assert!(
            err.contains("column 'ts' is Timestamp(ms) and the event gives it 9223372036854775807, which is past what a timestamp kept to the microsecond holds"),
            "{err}"
        );
    }

    #[test]
    fn a_number_past_a_float_columns_range_is_an_error_not_infinity() {
        let ev = |x: &str| {
            format!(
                r#"{{"before":null,"after":{{"id":1,"x":{x}}},"op":"c","source":{{"connector":"postgresql","lsn":1}}}}"#
            )
        };
        let layout = layout_of("t.json", &lines(&[ev("1.5")]));
        let err = err_of(layout.decode("t.json", &lines(&[ev("2.5"), ev("1e400")]), 100));
        assert!(
            err.contains("file 't.json' line 2: column 'x' is Float64 and the event gives it 1e400, which is past the type's range"),
            "{err}"
        );
        let (batches, bad) = layout
            .decode_lenient(
                "t.json",
                &lines(&[ev("2.5"), ev("-1e309"), ev("1e308")]),
                100,
            )
            .unwrap();
        assert_eq!(bad.iter().map(|b| b.line).collect::<Vec<_>>(), [2]);
        let values: Vec<f64> = batches
            .iter()
            .flat_map(|b| col::<Float64Array>(b, "x").values().to_vec())
            .collect();
        assert_eq!(values, [2.5, 1e308]);
    }

    #[test]
    fn unknown_op_is_an_error() {
        let bytes = lines(&[
            payload("c", Value::Null, json!({"id": 1}), pg_source(1, 1)).to_string(),
            payload("x", Value::Null, json!({"id": 2}), pg_source(2, 1)).to_string(),
        ]);
        let layout = layout_of("ops.json", &bytes);
        let err = err_of(layout.decode("ops.json", &bytes, 100));
        assert!(
            err.contains("file 'ops.json' line 2: unknown op 'x'"),
            "{err}"
        );
    }

    #[test]
    fn bad_base64_and_oversized_decimals_are_errors() {
        let schema = vec![
            json!({"type": "int32", "optional": false, "field": "id"}),
            json!({"type": "bytes", "optional": true, "field": "price",
                   "name": "org.apache.kafka.connect.data.Decimal",
                   "parameters": {"scale": "2", "connect.decimal.precision": "5"}}),
        ];
        let ev = |price: &str| {
            envelope(
                &schema,
                payload(
                    "c",
                    Value::Null,
                    json!({"id": 1, "price": price}),
                    pg_source(1, 1),
                ),
            )
        };
        let bytes = lines(&[ev("MDk="), ev("not base64!")]);
        let layout = layout_of("dec.json", &bytes);
        let err = err_of(layout.decode("dec.json", &bytes, 100));
        assert!(
            err.contains("file 'dec.json' line 2: column 'price': invalid base64"),
            "{err}"
        );
        assert!(err.contains("'not base64!'"), "{err}");
        // 123456 needs 6 digits
        let bytes = lines(&[ev("AeJA")]);
        let err = err_of(layout.decode("dec.json", &bytes, 100));
        assert!(
            err.contains("line 1: column 'price': decimal does not fit Decimal128(5, 2)"),
            "{err}"
        );
    }

    #[test]
    fn payload_only_event_in_an_enveloped_file_is_an_error() {
        let schema = id_name_schema();
        let bytes = lines(&[
            envelope(
                &schema,
                payload(
                    "c",
                    Value::Null,
                    json!({"id": 1, "name": "a"}),
                    pg_source(1, 1),
                ),
            ),
            payload(
                "c",
                Value::Null,
                json!({"id": 2, "name": "b"}),
                pg_source(2, 1),
            )
            .to_string(),
        ]);
        let layout = layout_of("mix.json", &bytes);
        let err = err_of(layout.decode("mix.json", &bytes, 100));
        assert!(
            err.contains("line 2: event without the schema/payload envelope"),
            "{err}"
        );
    }

    #[test]
    fn batches_hold_at_most_batch_rows() {
        let bytes = lines(
            &(1..=5)
                .map(|i| payload("c", Value::Null, json!({"id": i}), pg_source(i, 1)).to_string())
                .collect::<Vec<_>>(),
        );
        let layout = layout_of("b.json", &bytes);
        let batches = layout.decode("b.json", &bytes, 2).unwrap();
        let sizes: Vec<usize> = batches.iter().map(|b| b.num_rows()).collect();
        assert_eq!(sizes, [2, 2, 1]);
        let ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| col::<Int64Array>(b, "id").values().to_vec())
            .collect();
        assert_eq!(ids, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn twos_complement_values() {
        assert_eq!(twos_complement_i128(&[]), Some(0));
        assert_eq!(twos_complement_i128(&[0x30, 0x39]), Some(12345));
        assert_eq!(twos_complement_i128(&[0xCF, 0xC7]), Some(-12345));
        assert_eq!(twos_complement_i128(&[0xFF]), Some(-1));
        let mut wide = vec![0xFF; 17];
        wide[16] = 0xFE;
        assert_eq!(twos_complement_i128(&wide), Some(-2));
        assert_eq!(twos_complement_i128(&[1; 17]), None);
    }
}
