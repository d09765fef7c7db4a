//! Value columns: their layout, and their values derived from one 64-bit seed
//! per row, so a row's values cost 8 bytes until they are written and a
//! replayed event repeats them exactly.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Builder, Int64Builder, StringBuilder};
use arrow::datatypes::{DataType, Field};

use crate::rng::mix64;

/// Distinct values of the first string column (a low-cardinality "name").
const NAME_CARDINALITY: u64 = 50_000;

/// Ints are drawn from `0..INT_RANGE`.
const INT_RANGE: u64 = 1_000_000_000;

/// How many value columns of each type a generated table has. They are named
/// `i1, i2, ...` (BIGINT), `s1, s2, ...` (STRING: `s1` a name out of 50 000 such
/// as `name-01234`, the others 16 hex digits) and `d1, ...` (DOUBLE), in that
/// order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueColumns {
    /// Number of BIGINT columns.
    pub ints: usize,
    /// Number of STRING columns.
    pub strings: usize,
    /// Number of DOUBLE columns.
    pub doubles: usize,
}

impl Default for ValueColumns {
    /// `i1, i2, s1, s2, d1`.
    fn default() -> Self {
        Self {
            ints: 2,
            strings: 2,
            doubles: 1,
        }
    }
}

impl ValueColumns {
    /// The column names, in schema order.
    pub fn names(&self) -> Vec<String> {
        let ints = (1..=self.ints).map(|i| format!("i{i}"));
        let strings = (1..=self.strings).map(|i| format!("s{i}"));
        let doubles = (1..=self.doubles).map(|i| format!("d{i}"));
        ints.chain(strings).chain(doubles).collect()
    }

    /// The Arrow fields, in schema order.
    pub(crate) fn fields(&self, nullable: bool) -> Vec<Field> {
        let types = std::iter::repeat_n(DataType::Int64, self.ints)
            .chain(std::iter::repeat_n(DataType::Utf8, self.strings))
            .chain(std::iter::repeat_n(DataType::Float64, self.doubles));
        self.names()
            .into_iter()
            .zip(types)
            .map(|(name, data_type)| Field::new(name, data_type, nullable))
            .collect()
    }
}

/// Builders of the value columns of one batch.
pub(crate) struct ValueBuilders {
    ints: Vec<Int64Builder>,
    strings: Vec<StringBuilder>,
    doubles: Vec<Float64Builder>,
}

impl ValueBuilders {
    /// Empty builders for `columns`, sized for `capacity` rows.
    pub(crate) fn new(columns: &ValueColumns, capacity: usize) -> Self {
        Self {
            ints: (0..columns.ints)
                .map(|_| Int64Builder::with_capacity(capacity))
                .collect(),
            strings: (0..columns.strings)
                .map(|_| StringBuilder::with_capacity(capacity, capacity * 16))
                .collect(),
            doubles: (0..columns.doubles)
                .map(|_| Float64Builder::with_capacity(capacity))
                .collect(),
        }
    }

    /// Appends the values derived from `seed`: column `c` gets a function of
    /// `mix64(seed ^ salt(c))`, so distinct seeds give unrelated rows.
    pub(crate) fn append(&mut self, seed: u64) {
        let mut column = 0u64;
        let mut next = || {
            column += 1;
            mix64(seed ^ mix64(column.wrapping_mul(0x2545_f491_4f6c_dd1d)))
        };
        for builder in &mut self.ints {
            builder.append_value((next() % INT_RANGE) as i64);
        }
        let mut text = [0u8; 16];
        for (index, builder) in self.strings.iter_mut().enumerate() {
            let bits = next();
            let value = if index == 0 {
                name(bits % NAME_CARDINALITY, &mut text)
            } else {
                hex(bits, &mut text)
            };
            builder.append_value(value);
        }
        for builder in &mut self.doubles {
            builder.append_value((next() >> 11) as f64 / (1u64 << 53) as f64 * 1_000_000.0);
        }
    }

    /// Appends a row of NULLs (the values of a delete event).
    pub(crate) fn append_nulls(&mut self) {
        self.ints.iter_mut().for_each(Int64Builder::append_null);
        self.strings.iter_mut().for_each(StringBuilder::append_null);
        self.doubles
            .iter_mut()
            .for_each(Float64Builder::append_null);
    }

    /// The finished columns, in schema order; the builders start over empty.
    pub(crate) fn finish(&mut self) -> Vec<ArrayRef> {
        let ints = self
            .ints
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef);
        let strings = self
            .strings
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef);
        let doubles = self
            .doubles
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef);
        ints.chain(strings).chain(doubles).collect()
    }
}

/// `bits` as 16 lower-case hex digits.
fn hex(bits: u64, out: &mut [u8; 16]) -> &str {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = DIGITS[((bits >> (60 - 4 * i)) & 0xf) as usize];
    }
    ascii(out)
}

/// `name-` followed by `number` as 5 decimal digits (`number` < 100 000).
fn name(number: u64, out: &mut [u8; 16]) -> &str {
    out[..5].copy_from_slice(b"name-");
    let mut rest = number;
    for byte in out[5..10].iter_mut().rev() {
        *byte = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    ascii(&out[..10])
}

/// The ASCII digits written by [`hex`] and [`name`] as text.
fn ascii(bytes: &[u8]) -> &str {
    // Only ASCII digits, letters and '-' are ever written.
    std::str::from_utf8(bytes).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, AsArray};

    #[test]
    fn names_follow_the_layout() {
        assert_eq!(
            ValueColumns::default().names(),
            ["i1", "i2", "s1", "s2", "d1"]
        );
        let none = ValueColumns {
            ints: 0,
            strings: 0,
            doubles: 0,
        };
        assert!(none.names().is_empty());
    }

    #[test]
    fn values_are_a_function_of_the_seed() {
        let mut builders = ValueBuilders::new(&ValueColumns::default(), 4);
        builders.append(42);
        builders.append(42);
        builders.append(43);
        builders.append_nulls();
        let columns = builders.finish();
        assert_eq!(columns.len(), 5);
        let s1 = columns[2].as_string::<i32>();
        let s2 = columns[3].as_string::<i32>();
        assert_eq!(s1.value(0), s1.value(1));
        assert!(s1.value(0).starts_with("name-") && s1.value(0).len() == 10);
        assert_eq!(s2.value(0).len(), 16);
        assert_ne!(s2.value(0), s2.value(2));
        assert!(columns.iter().all(|c| c.is_null(3) && c.null_count() == 1));
    }
}
