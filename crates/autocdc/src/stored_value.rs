//! A sequence or snapshot version value as table-property text, and back:
//! the last snapshot version a flow applied and the snapshot watermark are
//! kept as properties of the target's state store.
//!
//! | the value's type                        | its text                          |
//! |-----------------------------------------|-----------------------------------|
//! | one Arrow casts to and from text (numbers, decimals, strings, dates, timestamps) | that cast (`42`, `2024-01-01T00:00:00`) |
//! | a STRUCT (or another nested type)       | its JSON object, as `arrow::json` writes and reads it (`{"major":1,"minor":2}`) |

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{DataFusionError, Result, ScalarValue};

/// The column name of the one-row batch a nested value is written as.
const VALUE: &str = "v";

/// `value` as text (see the module docs).
pub(crate) fn to_text(value: &ScalarValue) -> Result<String> {
    if value.data_type().is_nested() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            VALUE,
            value.data_type(),
            true,
        )]));
        let batch = RecordBatch::try_new(schema, vec![value.to_array()?])?;
        let mut writer = arrow::json::ArrayWriter::new(Vec::new());
        writer.write(&batch)?;
        writer.finish()?;
        // `[{"v":…}]` (`[{}]` for NULL): the object as written, fields in
        // their order
        let rows = String::from_utf8(writer.into_inner())
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let object = rows
            .strip_prefix(&format!("[{{\"{VALUE}\":"))
            .and_then(|rest| rest.strip_suffix("}]"));
        return Ok(object.unwrap_or("null").to_string());
    }
    match value.cast_to(&DataType::Utf8)? {
        ScalarValue::Utf8(Some(text)) => Ok(text),
        other => Err(DataFusionError::Internal(format!(
            "cannot store version {other} as text"
        ))),
    }
}

/// The value of type `data_type` that [`to_text`] wrote as `text`.
pub(crate) fn from_text(text: &str, data_type: &DataType) -> Result<ScalarValue> {
    if !data_type.is_nested() {
        return ScalarValue::try_from_string(text.to_string(), data_type);
    }
    let schema = Arc::new(Schema::new(vec![Field::new(
        VALUE,
        data_type.clone(),
        true,
    )]));
    let line = format!("{{\"{VALUE}\":{text}}}");
    let mut reader = arrow::json::ReaderBuilder::new(schema).build(line.as_bytes())?;
    match reader.next() {
        Some(batch) => ScalarValue::try_from_array(batch?.column(0), 0),
        None => Err(DataFusionError::Execution(format!(
            "'{text}' is not a {data_type} value"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Fields, TimeUnit};

    fn round_trip(value: ScalarValue) {
        let text = to_text(&value).unwrap();
        assert_eq!(
            from_text(&text, &value.data_type()).unwrap(),
            value,
            "{text}"
        );
    }

    #[test]
    fn each_row_of_the_table() {
        round_trip(ScalarValue::Int64(Some(42)));
        round_trip(ScalarValue::Utf8(Some("v1, \"quoted\"".into())));
        round_trip(ScalarValue::Decimal128(Some(12345), 10, 2));
        round_trip(ScalarValue::TimestampMicrosecond(
            Some(1_700_000_000_123_456),
            None,
        ));
        round_trip(ScalarValue::Date32(Some(19_000)));
        assert_eq!(to_text(&ScalarValue::Int32(Some(7))).unwrap(), "7");
        let fields = Fields::from(vec![
            Field::new("major", DataType::Int32, true),
            Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("tag", DataType::Utf8, true),
        ]);
        let value = ScalarValue::Struct(Arc::new(
            arrow::array::StructArray::try_new(
                fields,
                vec![
                    Arc::new(arrow::array::Int32Array::from(vec![Some(1)])),
                    Arc::new(arrow::array::TimestampMicrosecondArray::from(vec![Some(
                        1_700_000_000_000_001,
                    )])),
                    Arc::new(arrow::array::StringArray::from(vec![Some("a\"b")])),
                ],
                None,
            )
            .unwrap(),
        ));
        assert!(to_text(&value).unwrap().starts_with("{\"major\":1,"));
        round_trip(value);
    }
}
