//! `autocdc_raise(message)`: fails the query with the first non-NULL
//! `message` it meets, else `true`: a data error found by a plan (a check
//! written as columns) rather than by a kernel, reported where the rows
//! are read:
//!
//! ```text
//! Filter: autocdc_raise(CASE WHEN <bad row> THEN '<error naming it>' END)
//! ```
//!
//! It is volatile, so that no optimizer folds or drops it, and the Ballista
//! codec ships it by name ([`crate::physical::codec`]).

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, AsArray, BooleanArray};
use arrow::datatypes::DataType;
use datafusion::common::{exec_err, Result, ScalarValue};
use datafusion::functions::core::expr_fn::{coalesce, get_field};
use datafusion::functions::string::expr_fn::concat;
use datafusion::logical_expr::{
    cast, lit, ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

/// The function's name (also its codec key).
pub const RAISE: &str = "autocdc_raise";

/// See the module docs.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RaiseFunction {
    signature: Signature,
}

impl RaiseFunction {
    fn new() -> Self {
        Self {
            signature: Signature::exact(vec![DataType::Utf8], Volatility::Volatile),
        }
    }
}

static UDF: LazyLock<Arc<ScalarUDF>> =
    LazyLock::new(|| Arc::new(ScalarUDF::from(RaiseFunction::new())));

/// The function.
pub fn raise_udf() -> Arc<ScalarUDF> {
    Arc::clone(&UDF)
}

/// `autocdc_raise(message)`: a predicate that keeps every row, or fails
/// with the first non-NULL `message` (Utf8).
pub fn raise_if(message: Expr) -> Expr {
    raise_udf().call(vec![message])
}

/// `value` (of type `data_type`) as text for a message: a STRUCT as
/// `{a: 1, b: x}` (Arrow casts none to text), NULL as `NULL`, others as
/// cast.
pub fn text_of(value: Expr, data_type: &DataType) -> Expr {
    let text = match data_type {
        DataType::Struct(fields) => {
            let mut parts = vec![lit("{")];
            for (i, field) in fields.iter().enumerate() {
                let separator = if i == 0 { "" } else { ", " };
                parts.push(lit(format!("{separator}{}: ", field.name())));
                let member = get_field(value.clone(), field.name().as_str());
                parts.push(text_of(member, field.data_type()));
            }
            parts.push(lit("}"));
            concat(parts)
        }
        _ => cast(value.clone(), DataType::Utf8),
    };
    coalesce(vec![text, lit("NULL")])
}

impl ScalarUDFImpl for RaiseFunction {
    fn name(&self) -> &str {
        RAISE
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [message] = args.args.as_slice() else {
            return exec_err!("{RAISE} takes one argument");
        };
        match message {
            ColumnarValue::Scalar(ScalarValue::Utf8(Some(message))) => exec_err!("{message}"),
            ColumnarValue::Scalar(_) => Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true)))),
            ColumnarValue::Array(messages) => {
                let messages = messages.as_string::<i32>();
                if let Some(message) = messages.iter().flatten().next() {
                    return exec_err!("{message}");
                }
                Ok(ColumnarValue::Array(Arc::new(BooleanArray::from(vec![
                    true;
                    messages.len()
                ]))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;
    use arrow::datatypes::Field;

    fn invoke(messages: StringArray) -> Result<ColumnarValue> {
        let n = messages.len();
        raise_udf().invoke_with_args(ScalarFunctionArgs {
            args: vec![ColumnarValue::Array(Arc::new(messages))],
            arg_fields: vec![Arc::new(Field::new("m", DataType::Utf8, true))],
            number_rows: n,
            return_field: Arc::new(Field::new("r", DataType::Boolean, false)),
            config_options: Arc::default(),
        })
    }

    #[test]
    fn keeps_rows_without_a_message_and_fails_at_the_first() {
        let kept = invoke(StringArray::from(vec![None::<&str>, None])).expect("no message");
        let ColumnarValue::Array(kept) = kept else {
            panic!("an array")
        };
        assert_eq!(kept.len(), 2);
        assert!(kept.as_boolean().iter().all(|b| b == Some(true)));
        let err = invoke(StringArray::from(vec![
            None,
            Some("bad row 2"),
            Some("bad row 3"),
        ]))
        .expect_err("a message");
        assert!(err.to_string().contains("bad row 2"), "{err}");
    }
}
