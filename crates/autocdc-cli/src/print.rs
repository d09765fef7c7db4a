//! How the shell prints a statement's result: `--format`, `--maxrows`,
//! `--quiet`.
//!
//! | format    | output                                              |
//! |-----------|-----------------------------------------------------|
//! | `table`   | a boxed table (at most `--maxrows` rows shown)      |
//! | `csv`     | comma-separated values with a header line           |
//! | `tsv`     | tab-separated values with a header line             |
//! | `json`    | one JSON array of row objects                       |
//! | `nd-json` | one JSON object per line                            |
//!
//! Unless `--quiet`, the rows fetched and the elapsed time follow.

use std::io::Write;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::{DataFusionError, Result};

/// Output format of results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Csv,
    Tsv,
    Json,
    NdJson,
}

/// How many rows a table shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxRows {
    /// Every row.
    Unlimited,
    /// At most this many.
    Limited(usize),
}

impl FromStr for MaxRows {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s.eq_ignore_ascii_case("inf") || s.eq_ignore_ascii_case("none") {
            return Ok(Self::Unlimited);
        }
        s.parse::<usize>()
            .map(Self::Limited)
            .map_err(|_| format!("'{s}' is neither a number of rows nor 'inf'"))
    }
}

/// Printing options of the shell.
#[derive(Debug, Clone, Copy)]
pub struct PrintOptions {
    pub format: Format,
    pub max_rows: MaxRows,
    pub quiet: bool,
}

/// At most `max` rows of `batches`, sliced without copying.
fn first_rows(batches: &[RecordBatch], max: usize) -> Vec<RecordBatch> {
    let mut left = max;
    let mut out = Vec::new();
    for batch in batches {
        if left == 0 {
            break;
        }
        let take = batch.num_rows().min(left);
        out.push(batch.slice(0, take));
        left -= take;
    }
    out
}

/// `batch` with each nested column (a struct, a list, a map: CSV has no
/// form for them) as text, as the table format shows it (`{a: 1, b: x}`,
/// `[1, 2]`); other columns as they are.
fn nested_as_text(batch: &RecordBatch) -> Result<RecordBatch> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| f.data_type().is_nested())
    {
        return Ok(batch.clone());
    }
    let options = FormatOptions::default();
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if !field.data_type().is_nested() {
            fields.push(Arc::clone(field));
            columns.push(Arc::clone(column));
            continue;
        }
        let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
        let text: StringArray = (0..column.len())
            .map(|row| {
                column
                    .is_valid(row)
                    .then(|| formatter.value(row).to_string())
            })
            .collect();
        fields.push(Arc::new(Field::new(field.name(), DataType::Utf8, true)));
        columns.push(Arc::new(text));
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

fn io_err(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

impl PrintOptions {
    /// Print a result (nothing for a statement without columns), then, unless quiet, the row count and elapsed time.
    pub fn print(
        &self,
        out: &mut impl Write,
        schema: &SchemaRef,
        batches: &[RecordBatch],
        elapsed: Duration,
    ) -> Result<()> {
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let empty = [RecordBatch::new_empty(Arc::clone(schema))];
        let batches = if batches.is_empty() {
            &empty[..]
        } else {
            batches
        };
        let mut shown = rows;
        match self.format {
            // a statement without a result (CREATE ...)
            _ if schema.fields().is_empty() => {}
            Format::Table => {
                let table = match self.max_rows {
                    MaxRows::Limited(max) if max < rows => {
                        shown = max;
                        let mut first = first_rows(batches, max);
                        if first.is_empty() {
                            first.push(RecordBatch::new_empty(Arc::clone(schema)));
                        }
                        pretty_format_batches(&first)?
                    }
                    _ => pretty_format_batches(batches)?,
                };
                writeln!(out, "{table}")?;
            }
            Format::Csv | Format::Tsv => {
                let delimiter = if self.format == Format::Csv {
                    b','
                } else {
                    b'\t'
                };
                let mut writer = arrow_csv::WriterBuilder::new()
                    .with_header(true)
                    .with_delimiter(delimiter)
                    .build(&mut *out);
                for batch in batches {
                    writer.write(&nested_as_text(batch)?)?;
                }
            }
            Format::Json => {
                let mut writer = arrow_json::ArrayWriter::new(&mut *out);
                for batch in batches {
                    writer.write(batch)?;
                }
                writer.finish()?;
                writeln!(out)?;
            }
            Format::NdJson => {
                let mut writer = arrow_json::LineDelimitedWriter::new(&mut *out);
                for batch in batches {
                    writer.write(batch)?;
                }
                writer.finish()?;
            }
        }
        if !self.quiet {
            let elapsed = elapsed.as_secs_f64();
            if shown < rows {
                writeln!(
                    out,
                    "{rows} row(s) fetched ({shown} shown, --maxrows). Elapsed {elapsed:.3} seconds."
                )?;
            } else {
                writeln!(out, "{rows} row(s) fetched. Elapsed {elapsed:.3} seconds.")?;
            }
            writeln!(out)?;
        }
        out.flush().map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, StructArray};

    fn sample() -> (SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int32Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec![Some("a"), None, Some("c,d")])),
            ],
        )
        .unwrap();
        (schema, vec![batch.slice(0, 2), batch.slice(2, 1)])
    }

    fn printed(format: Format, max_rows: MaxRows, quiet: bool) -> String {
        let (schema, batches) = sample();
        let mut out = Vec::new();
        PrintOptions {
            format,
            max_rows,
            quiet,
        }
        .print(&mut out, &schema, &batches, Duration::from_millis(5))
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_format_prints_every_row() {
        assert_eq!(
            printed(Format::Csv, MaxRows::Unlimited, true),
            "id,v\n1,a\n2,\n3,\"c,d\"\n"
        );
        assert_eq!(
            printed(Format::Tsv, MaxRows::Unlimited, true),
            "id\tv\n1\ta\n2\t\n3\tc,d\n"
        );
        assert_eq!(
            printed(Format::Json, MaxRows::Unlimited, true),
            "[{\"id\":1,\"v\":\"a\"},{\"id\":2},{\"id\":3,\"v\":\"c,d\"}]\n"
        );
        assert_eq!(
            printed(Format::NdJson, MaxRows::Unlimited, true),
            "{\"id\":1,\"v\":\"a\"}\n{\"id\":2}\n{\"id\":3,\"v\":\"c,d\"}\n"
        );
    }

    #[test]
    fn csv_and_tsv_print_nested_columns_as_text() {
        let point = StructArray::from(vec![
            (
                Arc::new(Field::new("ts", DataType::Int32, true)),
                Arc::new(Int32Array::from(vec![Some(1), None])) as ArrayRef,
            ),
            (
                Arc::new(Field::new("sub", DataType::Utf8, true)),
                Arc::new(StringArray::from(vec![Some("a"), Some("b")])) as ArrayRef,
            ),
        ]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("at", point.data_type().clone(), true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int32Array::from(vec![1, 2])), Arc::new(point)],
        )
        .unwrap();
        let options = PrintOptions {
            format: Format::Csv,
            max_rows: MaxRows::Unlimited,
            quiet: true,
        };
        let mut out = Vec::new();
        options
            .print(&mut out, &schema, &[batch], Duration::ZERO)
            .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "id,at\n1,\"{ts: 1, sub: a}\"\n2,\"{ts: , sub: b}\"\n"
        );
    }

    #[test]
    fn a_table_shows_at_most_maxrows_and_says_so() {
        let table = printed(Format::Table, MaxRows::Limited(1), false);
        assert!(table.contains("| 1  | a |"), "{table}");
        assert!(!table.contains("| 2 "), "{table}");
        assert!(
            table.contains("3 row(s) fetched (1 shown, --maxrows). Elapsed 0.005 seconds."),
            "{table}"
        );
        let all = printed(Format::Table, MaxRows::Unlimited, false);
        assert!(all.contains("| 3  | c,d |"), "{all}");
        assert!(all.contains("3 row(s) fetched. Elapsed"), "{all}");
        assert!(!printed(Format::Table, MaxRows::Unlimited, true).contains("fetched"));
    }

    #[test]
    fn maxrows_takes_a_number_or_inf() {
        assert_eq!("10".parse::<MaxRows>(), Ok(MaxRows::Limited(10)));
        assert_eq!("inf".parse::<MaxRows>(), Ok(MaxRows::Unlimited));
        assert!("ten".parse::<MaxRows>().is_err());
    }
}
