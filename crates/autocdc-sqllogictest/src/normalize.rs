//! Rendering of query results as sqllogictest text, and the comparison of that text
//! with the expected results of a test file.
//!
//! The rules follow DataFusion's own sqllogictest engine so that test files written
//! for DataFusion read the same here:
//!
//! * a NULL value is shown as `NULL`, an empty string as `(empty)`;
//! * booleans are `true` / `false`;
//! * floats and decimals are rounded to 12 decimal places and trailing zeros are
//!   dropped (`1.0` is shown as `1`, `0.1 + 0.2` as `0.3`); NaN and infinities are
//!   `NaN`, `Infinity` and `-Infinity`;
//! * trailing newlines of strings are removed;
//! * a multi-line value in the last column (such as an `EXPLAIN` plan) is spread over
//!   several rows, one per line, each prefixed with its line number (`01)`) and with
//!   leading spaces replaced by `-` (sqllogictest ignores leading whitespace);
//! * the path of the workspace root is replaced by `WORKSPACE_ROOT`;
//! * every other type uses DataFusion's default Arrow display format.

use std::path::Path;
use std::str::FromStr;
use std::sync::OnceLock;

use bigdecimal::BigDecimal;
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float16Type, Float32Type, Float64Type};
use datafusion::arrow::util::display::ArrayFormatter;
use datafusion::common::format::DEFAULT_FORMAT_OPTIONS;
use datafusion::error::Result;
use sqllogictest::Normalizer;

/// How a NULL value is shown.
pub const NULL_TEXT: &str = "NULL";

/// How an empty string is shown (so that it can be told apart from a missing value).
pub const EMPTY_TEXT: &str = "(empty)";

/// Marker in expected results that matches any text.
pub const IGNORE_MARKER: &str = "<slt:ignore>";

/// Number of decimal places floats and decimals are rounded to.
const DECIMAL_PLACES: i64 = 12;

/// Renders record batches as sqllogictest rows (one `Vec<String>` per row, one string
/// per column), applying the rules described in the [module docs](self).
pub fn convert_batches(batches: &[RecordBatch]) -> Result<Vec<Vec<String>>> {
    let mut rows = Vec::new();
    for batch in batches {
        for row in convert_batch(batch)? {
            rows.extend(split_multiline_row(row).map(replace_workspace_root));
        }
    }
    Ok(rows)
}

/// Renders one cell of `array` (see the [module docs](self) for the rules).
pub fn cell_to_string(array: &dyn Array, row: usize) -> Result<String> {
    let is_null = array
        .logical_nulls()
        .is_some_and(|nulls| nulls.is_null(row));
    if is_null {
        return Ok(NULL_TEXT.to_string());
    }
    valid_cell_to_string(array, row)
}

/// Renders every row of one batch, column by column.
fn convert_batch(batch: &RecordBatch) -> Result<Vec<Vec<String>>> {
    let mut rows: Vec<Vec<String>> = (0..batch.num_rows())
        .map(|_| Vec::with_capacity(batch.num_columns()))
        .collect();
    for column in batch.columns() {
        // Computed once per column: logical nulls of dictionaries etc. are not free.
        let nulls = column.logical_nulls();
        for (index, row) in rows.iter_mut().enumerate() {
            let text = if nulls.as_ref().is_some_and(|n| n.is_null(index)) {
                NULL_TEXT.to_string()
            } else {
                valid_cell_to_string(column.as_ref(), index)?
            };
            row.push(text);
        }
    }
    Ok(rows)
}

/// Renders a cell known to hold a value.
fn valid_cell_to_string(array: &dyn Array, row: usize) -> Result<String> {
    let text = match array.data_type() {
        DataType::Null => NULL_TEXT.to_string(),
        DataType::Boolean => array.as_boolean().value(row).to_string(),
        DataType::Float16 => {
            let value = array.as_primitive::<Float16Type>().value(row);
            float_text(
                value.is_nan(),
                value.is_infinite(),
                value.is_sign_negative(),
                || value.to_string(),
            )
        }
        DataType::Float32 => {
            let value = array.as_primitive::<Float32Type>().value(row);
            float_text(
                value.is_nan(),
                value.is_infinite(),
                value.is_sign_negative(),
                || value.to_string(),
            )
        }
        DataType::Float64 => {
            let value = array.as_primitive::<Float64Type>().value(row);
            float_text(
                value.is_nan(),
                value.is_infinite(),
                value.is_sign_negative(),
                || value.to_string(),
            )
        }
        DataType::Decimal32(_, _)
        | DataType::Decimal64(_, _)
        | DataType::Decimal128(_, _)
        | DataType::Decimal256(_, _) => decimal_text(&default_display(array, row)?),
        DataType::Utf8 => string_text(array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => string_text(array.as_string::<i64>().value(row)),
        DataType::Utf8View => string_text(array.as_string_view().value(row)),
        _ => default_display(array, row)?,
    };
    Ok(text)
}

/// DataFusion's default display of one value.
fn default_display(array: &dyn Array, row: usize) -> Result<String> {
    let formatter = ArrayFormatter::try_new(array, &DEFAULT_FORMAT_OPTIONS)?;
    Ok(formatter.value(row).to_string())
}

/// Text of a float: special values by name, finite values via [`decimal_text`] of
/// their shortest round-trip representation (`display`).
fn float_text(
    is_nan: bool,
    is_infinite: bool,
    is_negative: bool,
    display: impl FnOnce() -> String,
) -> String {
    if is_nan {
        // The sign of NaN depends on the platform, so it is never shown.
        "NaN".to_string()
    } else if is_infinite && is_negative {
        "-Infinity".to_string()
    } else if is_infinite {
        "Infinity".to_string()
    } else {
        decimal_text(&display())
    }
}

/// Rounds a decimal number written in plain text to [`DECIMAL_PLACES`] places and
/// drops trailing zeros. Text that is not a number is returned unchanged.
fn decimal_text(text: &str) -> String {
    match BigDecimal::from_str(text) {
        Ok(value) => value.round(DECIMAL_PLACES).normalized().to_string(),
        Err(_) => text.to_string(),
    }
}

/// Text of a string value.
fn string_text(value: &str) -> String {
    if value.is_empty() {
        EMPTY_TEXT.to_string()
    } else {
        value.trim_end_matches('\n').to_string()
    }
}

/// Spreads a multi-line last cell over several rows: the row itself without that
/// cell, then one single-cell row per line, numbered from `01)`, with leading spaces
/// turned into `-` so that indentation survives whitespace normalization.
fn split_multiline_row(mut row: Vec<String>) -> Box<dyn Iterator<Item = Vec<String>>> {
    let multiline = row.last().is_some_and(|cell| cell.contains('\n'));
    if !multiline {
        return Box::new(std::iter::once(row));
    }
    let cell = row.pop().unwrap_or_default();
    let lines: Vec<Vec<String>> = cell
        .split('\n')
        .enumerate()
        .map(|(index, line)| {
            let content = line.trim_start();
            let indent = "-".repeat(line.len() - content.len());
            vec![format!("{:02}){indent}{content}", index + 1)]
        })
        .collect();
    Box::new(std::iter::once(row).chain(lines))
}

/// Replaces the workspace root path with `WORKSPACE_ROOT` in every cell.
fn replace_workspace_root(mut row: Vec<String>) -> Vec<String> {
    let root = workspace_root();
    if root.is_empty() {
        return row;
    }
    for cell in &mut row {
        if cell.contains(root) {
            *cell = cell.replace(root, "WORKSPACE_ROOT");
        }
    }
    row
}

/// The workspace root directory (two levels above this crate), with `/` separators.
fn workspace_root() -> &'static str {
    static ROOT: OnceLock<String> = OnceLock::new();
    ROOT.get_or_init(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .and_then(Path::parent)
            .map(|root| root.to_string_lossy().replace('\\', "/"))
            .unwrap_or_default()
    })
}

/// Normalizes a line of expected results: trailing whitespace is ignored (a test
/// that cares about trailing whitespace can add a column to the right of it).
#[allow(clippy::ptr_arg)] // the signature is fixed by `sqllogictest::Normalizer`
pub fn value_normalizer(line: &String) -> String {
    line.trim_end().to_string()
}

/// Compares actual rows with the expected lines of a `query` record.
///
/// The cells of an actual row are joined with single spaces and trailing whitespace is
/// removed; expected lines go through `normalizer`. When the expected results contain
/// [`IGNORE_MARKER`], the pieces between markers must appear in the actual output in
/// order, and the first piece must start the output.
pub fn value_validator(
    normalizer: Normalizer,
    actual: &[Vec<String>],
    expected: &[String],
) -> bool {
    let expected: Vec<String> = expected.iter().map(normalizer).collect();
    let actual: Vec<String> = actual
        .iter()
        .map(|row| row.join(" ").trim_end().to_string())
        .collect();

    if !expected.iter().any(|line| line.contains(IGNORE_MARKER)) {
        return actual == expected;
    }

    let expected = expected.join("\n");
    let actual = actual.join("\n");
    let mut position = 0;
    for (index, piece) in expected.split(IGNORE_MARKER).enumerate() {
        if piece.is_empty() {
            continue;
        }
        match actual[position..].find(piece) {
            Some(offset) if index > 0 || offset == 0 => position += offset + piece.len(),
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{
        ArrayRef, BooleanArray, Decimal128Array, Float32Array, Float64Array, Int32Array, NullArray,
        StringArray, StringViewArray,
    };
    use std::sync::Arc;

    fn cells(array: ArrayRef) -> Vec<String> {
        (0..array.len())
            .map(|row| cell_to_string(array.as_ref(), row).expect("renders"))
            .collect()
    }

    #[test]
    fn floats_are_rounded_and_trimmed() {
        let array = Arc::new(Float64Array::from(vec![
            Some(1.0),
            Some(0.1 + 0.2),
            Some(-2.5),
            Some(f64::NAN),
            Some(f64::NEG_INFINITY),
            Some(f64::INFINITY),
            None,
            Some(1e-13),
        ]));
        assert_eq!(
            cells(array),
            [
                "1",
                "0.3",
                "-2.5",
                "NaN",
                "-Infinity",
                "Infinity",
                "NULL",
                "0"
            ]
        );
        let array = Arc::new(Float32Array::from(vec![0.1_f32]));
        assert_eq!(cells(array), ["0.1"]);
    }

    #[test]
    fn decimals_drop_trailing_zeros() {
        let array = Decimal128Array::from(vec![12_300, -5])
            .with_precision_and_scale(10, 3)
            .expect("valid decimal");
        assert_eq!(cells(Arc::new(array)), ["12.3", "-0.005"]);
    }

    #[test]
    fn strings_booleans_and_nulls() {
        let array = Arc::new(StringArray::from(vec![Some("a\n"), Some(""), None]));
        assert_eq!(cells(array), ["a", "(empty)", "NULL"]);
        let array = Arc::new(StringViewArray::from(vec![Some(""), Some("x")]));
        assert_eq!(cells(array), ["(empty)", "x"]);
        let array = Arc::new(BooleanArray::from(vec![Some(true), Some(false), None]));
        assert_eq!(cells(array), ["true", "false", "NULL"]);
        assert_eq!(cells(Arc::new(NullArray::new(1))), ["NULL"]);
        assert_eq!(cells(Arc::new(Int32Array::from(vec![-7]))), ["-7"]);
    }

    #[test]
    fn multiline_last_cell_is_spread_over_rows() {
        let rows: Vec<_> = split_multiline_row(vec![
            "plan".to_string(),
            "Projection: a\n  TableScan: t".to_string(),
        ])
        .collect();
        assert_eq!(
            rows,
            vec![
                vec!["plan".to_string()],
                vec!["01)Projection: a".to_string()],
                vec!["02)--TableScan: t".to_string()],
            ]
        );
    }

    #[test]
    fn validator_joins_cells_and_ignores_trailing_space() {
        let actual = vec![vec!["1".to_string(), "a ".to_string()]];
        assert!(value_validator(
            value_normalizer,
            &actual,
            &["1 a   ".to_string()]
        ));
        assert!(!value_validator(
            value_normalizer,
            &actual,
            &["1  a".to_string()]
        ));
    }

    #[test]
    fn validator_supports_ignore_marker() {
        let actual = vec![vec![
            "foo".to_string(),
            "bar".to_string(),
            "baz".to_string(),
        ]];
        let check =
            |expected: &str| value_validator(value_normalizer, &actual, &[expected.to_string()]);
        assert!(check("foo <slt:ignore> baz"));
        assert!(check("<slt:ignore> baz"));
        assert!(!check("bar <slt:ignore>"));
    }
}
