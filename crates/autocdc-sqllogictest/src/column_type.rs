//! Column type letters used in `query` records.

use datafusion::arrow::datatypes::{DataType, Fields};
use sqllogictest::ColumnType;

/// The type of a result column, as written in the type string of a `query` record
/// (for example the `IT` in `query IT`).
///
/// The letters follow DataFusion's sqllogictest conventions:
///
/// | letter | meaning                                      |
/// |--------|----------------------------------------------|
/// | `B`    | boolean                                      |
/// | `D`    | date or time of day (no time zone)           |
/// | `I`    | signed or unsigned integer                   |
/// | `P`    | timestamp (with or without time zone)        |
/// | `R`    | floating point number or decimal             |
/// | `T`    | string, and every other type                 |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CdcColumnType {
    /// `B`: boolean.
    Boolean,
    /// `D`: date or time of day.
    DateTime,
    /// `I`: integer.
    Integer,
    /// `R`: floating point or decimal.
    Float,
    /// `T`: text and any other type (lists, structs, binary, intervals, ...).
    Text,
    /// `P`: timestamp.
    Timestamp,
}

impl CdcColumnType {
    /// The column type used to report an Arrow data type.
    pub fn from_data_type(data_type: &DataType) -> Self {
        match data_type {
            DataType::Boolean => Self::Boolean,
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64 => Self::Integer,
            DataType::Float16
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal32(_, _)
            | DataType::Decimal64(_, _)
            | DataType::Decimal128(_, _)
            | DataType::Decimal256(_, _) => Self::Float,
            DataType::Date32 | DataType::Date64 | DataType::Time32(_) | DataType::Time64(_) => {
                Self::DateTime
            }
            DataType::Timestamp(_, _) => Self::Timestamp,
            _ => Self::Text,
        }
    }
}

impl ColumnType for CdcColumnType {
    fn from_char(value: char) -> Option<Self> {
        match value {
            'B' => Some(Self::Boolean),
            'D' => Some(Self::DateTime),
            'I' => Some(Self::Integer),
            'P' => Some(Self::Timestamp),
            'R' => Some(Self::Float),
            'T' => Some(Self::Text),
            _ => None,
        }
    }

    fn to_char(&self) -> char {
        match self {
            Self::Boolean => 'B',
            Self::DateTime => 'D',
            Self::Integer => 'I',
            Self::Timestamp => 'P',
            Self::Float => 'R',
            Self::Text => 'T',
        }
    }
}

/// The column types reported for a result schema.
pub fn column_types(fields: &Fields) -> Vec<CdcColumnType> {
    fields
        .iter()
        .map(|field| CdcColumnType::from_data_type(field.data_type()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::TimeUnit;

    #[test]
    fn letters_round_trip() {
        for letter in ['B', 'D', 'I', 'P', 'R', 'T'] {
            let ty = CdcColumnType::from_char(letter).expect("known letter");
            assert_eq!(ty.to_char(), letter);
        }
        assert_eq!(CdcColumnType::from_char('?'), None);
    }

    #[test]
    fn arrow_types_map_to_letters() {
        let cases = [
            (DataType::UInt8, 'I'),
            (DataType::Int64, 'I'),
            (DataType::Float64, 'R'),
            (DataType::Decimal128(10, 2), 'R'),
            (DataType::Utf8View, 'T'),
            (DataType::Boolean, 'B'),
            (DataType::Date32, 'D'),
            (DataType::Time64(TimeUnit::Nanosecond), 'D'),
            (DataType::Timestamp(TimeUnit::Microsecond, None), 'P'),
            (DataType::Binary, 'T'),
            (DataType::Null, 'T'),
        ];
        for (data_type, letter) in cases {
            assert_eq!(
                CdcColumnType::from_data_type(&data_type).to_char(),
                letter,
                "{data_type}"
            );
        }
    }
}
