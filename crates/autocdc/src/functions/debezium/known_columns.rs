//! Does an event name a row column its source's layout does not have, give
//! an integer column a fraction, or a floating-point column a number out of
//! its range?
//!
//! A source's layout is inferred from samples of its files
//! ([`super::table`]); `arrow::json` leaves out any field its schema does
//! not name. A column added to the source table after the samples would
//! therefore vanish from the events without a word. And `arrow::json` reads
//! `1.5` (or `"1.5"`) into an integer column as `1`: a fraction in an event
//! the samples did not show would be cut off without a word, a key merged
//! with another; it reads `1e400` into a double column as infinity.
//! [`KnownColumns::check`] finds these in one event line before it is
//! decoded, without parsing the line: it looks for the `"before"` and
//! `"after"` keys and reads the key names of their objects, skipping the
//! values but those of integer columns that hold a `.`, `e` or `E`, and
//! those of floating-point columns that hold an exponent.
//!
//! | the line's `before` / `after`          | result                    |
//! |----------------------------------------|---------------------------|
//! | absent, `null`, not an object          | no problem                |
//! | an object whose keys are all columns   | no problem                |
//! | an object with another key             | [`RowProblem::Unknown`]: that key |
//! | an integer column's value with a fraction (`1.5`, `"2.7"`, `1e-3`), or written with `.` or an exponent past a double's precision (`9007199254740993.0`) | [`RowProblem::Fraction`] |
//! | an integer column's value written with `.` or an exponent, whole and within 2^53 (`1.0`, `1e3`) | no problem (read as that integer) |
//! | a floating-point column's value past its type's range (`1e400`; `1e39` for a FLOAT) | [`RowProblem::OutOfRange`] |
//! | a time column's value outside a day (`86400000000` µs), a second or millisecond timestamp's past what microseconds hold | [`RowProblem::OutOfBounds`] |
//! | malformed JSON                         | no problem (the decoder reports the line) |
//!
//! Debezium writes `before` first in the payload, so the first `"before"`
//! and `"after"` keys of a line are the payload's: the Connect schema that
//! may precede the payload names them only as values (`"field":"after"`),
//! which the search skips. Columns usually come in the layout's order; the
//! lookup tries the next expected column first.

use std::borrow::Cow;

use memchr::memmem::Finder;

/// The row columns of a layout, to check event lines against.
#[derive(Debug, Clone)]
pub(crate) struct KnownColumns {
    columns: Vec<Box<[u8]>>,
    /// How each column reads a number.
    numbers: Vec<ReadsNumbers>,
    before: Finder<'static>,
    after: Finder<'static>,
}

/// What [`KnownColumns::check`] found wrong with an event's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RowProblem<'l> {
    /// A key that is not a row column.
    Unknown(Cow<'l, str>),
    /// A value with a fraction for the integer column at this index (the
    /// value as written).
    Fraction(usize, Cow<'l, str>),
    /// A number past the range of the floating-point column at this index
    /// (the value as written).
    OutOfRange(usize, Cow<'l, str>),
    /// A whole number outside the bounds of the column at this index (a
    /// time of day past midnight, a timestamp a flow cannot keep to the
    /// microsecond; the value as written).
    OutOfBounds(usize, Cow<'l, str>),
}

/// How a column reads a JSON number, for [`KnownColumns::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadsNumbers {
    /// As a whole number (an integer, or a date, time or timestamp count):
    /// a fraction would be cut off.
    Whole,
    /// As a double: a number past its range would be infinity.
    Double,
    /// As a single-precision float: likewise.
    Single,
    /// As a whole number within these bounds (inclusive): a time of day, a
    /// count of a timestamp's unit.
    Within(i64, i64),
    /// Otherwise (text, booleans, nested values): left to the decoder.
    Other,
}

impl KnownColumns {
    /// The columns' names, each with how it reads a number.
    pub(crate) fn new<'a>(columns: impl IntoIterator<Item = (&'a str, ReadsNumbers)>) -> Self {
        let (columns, numbers) = columns
            .into_iter()
            .map(|(c, reads)| (c.as_bytes().to_vec().into_boxed_slice(), reads))
            .unzip();
        Self {
            columns,
            numbers,
            before: Finder::new(b"\"before\"").into_owned(),
            after: Finder::new(b"\"after\"").into_owned(),
        }
    }

    /// The first problem of the line's `before` or `after` object, if any
    /// (see the module docs).
    pub(crate) fn check<'l>(&self, line: &'l [u8]) -> Option<RowProblem<'l>> {
        // (`after` is searched for after `before`'s object, where it is)
        let mut from = 0;
        for finder in [&self.before, &self.after] {
            let found = object_after_key(line, from, finder)
                .or_else(|| object_after_key(line, 0, finder).filter(|_| from > 0));
            let Some(object) = found else {
                continue;
            };
            match self.unknown_in(&line[object..]) {
                Ok(end) => from = object + end,
                Err(Some(problem)) => return Some(problem),
                Err(None) => return None,
            }
        }
        None
    }

    /// The end of the object starting at `object[0] == b'{'` when all its
    /// keys are columns and its values fit them; else its first problem
    /// (`None`: malformed).
    fn unknown_in<'l>(&self, object: &'l [u8]) -> Result<usize, Option<RowProblem<'l>>> {
        let mut at = 1;
        let mut expected = 0;
        loop {
            at = skip_space(object, at);
            match object.get(at) {
                Some(b'}') => return Ok(at + 1),
                Some(b'"') => {}
                _ => return Err(None),
            }
            let end = string_end(object, at).ok_or(None)?;
            let raw = &object[at..end];
            let name = &raw[1..raw.len() - 1];
            let column = match self.position(name, expected) {
                Some(i) => i,
                None => return Err(Some(RowProblem::Unknown(key_text(raw)))),
            };
            expected = column + 1;
            at = skip_space(object, end);
            if object.get(at) != Some(&b':') {
                return Err(None);
            }
            let value = skip_space(object, at + 1);
            at = value_end(object, value).ok_or(None)?;
            let written = &object[value..at];
            match self.numbers[column] {
                ReadsNumbers::Whole => {
                    if let Some(fraction) = fraction(written) {
                        return Err(Some(RowProblem::Fraction(column, fraction)));
                    }
                }
                ReadsNumbers::Within(low, high) => {
                    if let Some(fraction) = fraction(written) {
                        return Err(Some(RowProblem::Fraction(column, fraction)));
                    }
                    if let Some(value) = out_of_bounds(written, low, high) {
                        return Err(Some(RowProblem::OutOfBounds(column, value)));
                    }
                }
                ReadsNumbers::Double | ReadsNumbers::Single => {
                    let single = self.numbers[column] == ReadsNumbers::Single;
                    if let Some(value) = out_of_range(written, single) {
                        return Err(Some(RowProblem::OutOfRange(column, value)));
                    }
                }
                ReadsNumbers::Other => {}
            }
            at = skip_space(object, at);
            match object.get(at) {
                Some(b',') => at += 1,
                Some(b'}') => return Ok(at + 1),
                _ => return Err(None),
            }
        }
    }

    /// The index of the column named `name` (raw JSON string contents),
    /// trying `expected` first.
    fn position(&self, name: &[u8], expected: usize) -> Option<usize> {
        if self.columns.get(expected).is_some_and(|c| **c == *name) {
            return Some(expected);
        }
        if let Some(i) = self.columns.iter().position(|c| **c == *name) {
            return Some(i);
        }
        // an escaped name: compare its decoded text
        if name.contains(&b'\\') {
            let quoted = [b"\"", name, b"\""].concat();
            let text: String = serde_json::from_slice(&quoted).ok()?;
            return self.columns.iter().position(|c| **c == *text.as_bytes());
        }
        None
    }
}

/// Where the object value of the first `"key"` (a key, not a value) of
/// `line` from `from` on starts, if that value is an object.
fn object_after_key(line: &[u8], mut from: usize, finder: &Finder<'_>) -> Option<usize> {
    while let Some(found) = finder.find(&line[from..]) {
        let end = from + found + finder.needle().len();
        let colon = skip_space(line, end);
        if line.get(colon) == Some(&b':') {
            let value = skip_space(line, colon + 1);
            return (line.get(value) == Some(&b'{')).then_some(value);
        }
        from = end;
    }
    None
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(|b| b.is_ascii_whitespace()) {
        at += 1;
    }
    at
}

/// The index just past the string starting at `bytes[at] == b'"'`.
fn string_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut i = at + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', bytes.get(i..)?)?;
        match bytes[i] {
            b'\\' => i += 2,
            _ => return Some(i + 1),
        }
    }
}

/// The index just past the JSON value starting at `at`.
fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes.get(at)? {
        b'"' => string_end(bytes, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match bytes.get(i)? {
                    b'"' => {
                        i = string_end(bytes, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        // a number, true, false or null: up to the next separator (spaces
        // before it are skipped after the value anyway)
        _ => {
            let rest = bytes.get(at..)?;
            Some(at + memchr::memchr3(b',', b'}', b']', rest).unwrap_or(rest.len()))
        }
    }
}

/// The value as written when it is a number (or a string of one) written
/// with `.` or an exponent that the decoder, which reads such a number as
/// a double, would not read exactly as a whole number: a fraction, or more
/// digits than a double holds (beyond 2^53). Other values are left to the
/// decoder.
fn fraction(value: &[u8]) -> Option<Cow<'_, str>> {
    /// The greatest magnitude up to which a double holds every whole number.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    let value = value.trim_ascii_end();
    memchr::memchr3(b'.', b'e', b'E', value)?;
    let number = match value {
        [b'"', inner @ .., b'"'] => inner,
        _ => value,
    };
    let text = std::str::from_utf8(number).ok()?;
    let parsed: f64 = text.parse().ok()?;
    // (judged on the digits as written where it can be: a double rounds
    // `1.00000000000000001` to 1 and `9007199254740993.0` to an even one)
    let exact = match text.split_once(['e', 'E']) {
        None => {
            let (whole, digits) = text.split_once('.').unwrap_or((text, ""));
            digits.bytes().all(|d| d == b'0')
                && whole
                    .parse::<i128>()
                    .is_ok_and(|w| w.unsigned_abs() <= EXACT as u128)
        }
        Some(_) => parsed.fract() == 0.0 && parsed.abs() < EXACT,
    };
    (!exact).then(|| String::from_utf8_lossy(value))
}

/// The value as written when it is a number (or a string of one) past the
/// range of a double (`single`: of a single-precision float), which the
/// decoder would read as infinity. Only a number with an exponent or of
/// more than 38 digits can be; others are not looked at.
fn out_of_range(value: &[u8], single: bool) -> Option<Cow<'_, str>> {
    let value = value.trim_ascii_end();
    if memchr::memchr2(b'e', b'E', value).is_none() && value.len() <= 38 {
        return None;
    }
    let number = match value {
        [b'"', inner @ .., b'"'] => inner,
        _ => value,
    };
    let text = std::str::from_utf8(number).ok()?;
    let inside = match single {
        true => text.parse::<f32>().ok()?.is_finite(),
        false => text.parse::<f64>().ok()?.is_finite(),
    };
    (!inside).then(|| String::from_utf8_lossy(value))
}

/// `value` (a JSON number, or one in a string) when it is a whole number
/// outside `low..=high`.
fn out_of_bounds(value: &[u8], low: i64, high: i64) -> Option<Cow<'_, str>> {
    let value = value.trim_ascii_end();
    let number = match value {
        [b'"', inner @ .., b'"'] => inner,
        _ => value,
    };
    let text = std::str::from_utf8(number).ok()?;
    let whole = match text.parse::<i128>() {
        Ok(whole) => whole,
        // (an exponent: `8.64e10`)
        Err(_) => text.parse::<f64>().ok()? as i128,
    };
    (whole < i128::from(low) || whole > i128::from(high)).then(|| String::from_utf8_lossy(value))
}

/// A raw JSON string (quotes included) as text.
fn key_text(raw: &[u8]) -> Cow<'_, str> {
    match serde_json::from_slice::<String>(raw) {
        Ok(text) => Cow::Owned(text),
        Err(_) => String::from_utf8_lossy(&raw[1..raw.len() - 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns() -> KnownColumns {
        KnownColumns::new([
            ("id", ReadsNumbers::Whole),
            ("name", ReadsNumbers::Other),
            ("a\"b", ReadsNumbers::Other),
            ("d", ReadsNumbers::Double),
            ("f", ReadsNumbers::Single),
        ])
    }

    fn unknown(line: &str) -> Option<String> {
        match columns().check(line.as_bytes()) {
            None => None,
            Some(RowProblem::Unknown(key)) => Some(key.into_owned()),
            Some(other) => panic!("{other:?}"),
        }
    }

    fn fraction_of(line: &str) -> Option<(usize, String)> {
        match columns().check(line.as_bytes()) {
            None => None,
            Some(RowProblem::Fraction(column, value)) => Some((column, value.into_owned())),
            Some(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn fractions_of_integer_columns() {
        assert_eq!(
            fraction_of(r#"{"before":null,"after":{"id":1.5,"name":"x"}}"#),
            Some((0, "1.5".into()))
        );
        assert_eq!(
            fraction_of(r#"{"before":{"id": -2.9 },"after":null}"#),
            Some((0, "-2.9".into()))
        );
        assert_eq!(
            fraction_of(r#"{"after":{"name":"x","id":"2.7"}}"#),
            Some((0, "\"2.7\"".into()))
        );
        assert_eq!(
            fraction_of(r#"{"after":{"id":1e-3}}"#),
            Some((0, "1e-3".into()))
        );
        // whole numbers however written, and other columns' fractions
        assert_eq!(fraction_of(r#"{"after":{"id":1.0,"name":"1.5"}}"#), None);
        assert_eq!(fraction_of(r#"{"after":{"id":1E3,"a\"b":2.5}}"#), None);
        assert_eq!(fraction_of(r#"{"after":{"id":12,"name":null}}"#), None);
        assert_eq!(fraction_of(r#"{"after":{"id":"x.y"}}"#), None);
        // past a double's precision, or a fraction it would round away
        assert_eq!(
            fraction_of(r#"{"after":{"id":9007199254740993.0}}"#),
            Some((0, "9007199254740993.0".into()))
        );
        assert_eq!(
            fraction_of(r#"{"after":{"id":1.00000000000000001}}"#),
            Some((0, "1.00000000000000001".into()))
        );
        assert_eq!(fraction_of(r#"{"after":{"id":9007199254740992.0}}"#), None);
    }

    #[test]
    fn numbers_past_a_float_columns_range() {
        let out_of_range = |line: &str| match columns().check(line.as_bytes()) {
            None => None,
            Some(RowProblem::OutOfRange(column, value)) => Some((column, value.into_owned())),
            Some(other) => panic!("{other:?}"),
        };
        assert_eq!(
            out_of_range(r#"{"after":{"id":1,"d":1e400}}"#),
            Some((3, "1e400".into()))
        );
        assert_eq!(
            out_of_range(r#"{"after":{"d":"-1E309"}}"#),
            Some((3, "\"-1E309\"".into()))
        );
        assert_eq!(
            out_of_range(r#"{"before":{"f":1e39},"after":null}"#),
            Some((4, "1e39".into()))
        );
        let digits = format!(r#"{{"after":{{"d":1{}}}}}"#, "0".repeat(309));
        assert_eq!(out_of_range(&digits).map(|(c, _)| c), Some(3));
        // within range, tiny (read as 0 or subnormal, as the source's
        // double would be), or in another column
        assert_eq!(out_of_range(r#"{"after":{"d":1e308,"f":3.4e38}}"#), None);
        assert_eq!(
            out_of_range(r#"{"after":{"d":1e-400,"name":"1e400"}}"#),
            None
        );
        assert_eq!(out_of_range(r#"{"after":{"d":1e39,"f":null}}"#), None);
    }

    #[test]
    fn known_columns_in_any_order_and_spacing() {
        assert_eq!(
            unknown(r#"{"before":null,"after":{"id":1,"name":"x"},"op":"c"}"#),
            None
        );
        assert_eq!(
            unknown(r#"{"before": {"name": "x", "id": 1}, "after": null}"#),
            None
        );
        assert_eq!(
            unknown(r#"{"after":{"a\"b":[1,{"z":2}],"id":{"nested":"}"}}}"#),
            None
        );
        assert_eq!(unknown(r#"{"op":"t","source":{"lsn":1}}"#), None);
        assert_eq!(
            unknown(r#"{"after":{"id":1 , "name":null },"before":{"id":1}}"#),
            None
        );
    }

    #[test]
    fn a_column_the_layout_lacks() {
        assert_eq!(
            unknown(r#"{"before":null,"after":{"id":1,"name":"x","added":true},"op":"c"}"#),
            Some("added".into())
        );
        assert_eq!(
            unknown(r#"{"before":{"id":1,"gone\u0041":2},"after":null,"op":"d"}"#),
            Some("goneA".into())
        );
        // `after` before `before`
        assert_eq!(
            unknown(r#"{"after":{"id":1,"x":2},"before":{"id":1}}"#),
            Some("x".into())
        );
    }

    #[test]
    fn the_schema_names_before_and_after_only_as_values() {
        let line = concat!(
            r#"{"schema":{"fields":[{"field":"before"},{"field":"after"}]},"#,
            r#""payload":{"before":null,"after":{"id":1,"new":2}}}"#
        );
        assert_eq!(unknown(line), Some("new".into()));
    }

    #[test]
    fn values_that_look_like_keys_are_skipped() {
        let line = r#"{"before":null,"after":{"name":"\"after\":{\"x\":1}","id":"a,b}"}}"#;
        assert_eq!(unknown(line), None);
    }

    #[test]
    fn malformed_lines_are_left_to_the_decoder() {
        assert_eq!(unknown(r#"{"after":{"id":1,"#), None);
        assert_eq!(unknown(r#"{"after":{"id" 1}}"#), None);
        assert_eq!(unknown(r#"{"after":{"id":"1"#), None);
    }
}
