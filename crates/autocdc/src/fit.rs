//! `autocdc_fit(value, like, before, after)`: `value` cast to the type of
//! `like` (a typed NULL), or a failure naming the first value that type
//! cannot hold — `before`, the value, `after` — where Arrow's cast error
//! would name neither the column nor the statement.
//!
//! A value does not fit when it is out of the type's range, when a decimal
//! of fewer digits would round it or an integer cut its fraction off, when
//! a narrower float would overflow it to an infinity it was not, or (text)
//! when it does not read as the type. NULL stays NULL.
//!
//! It is volatile, as [`crate::raise`] is: no optimizer folds a literal's
//! cast (and fails with Arrow's error) before the statement runs, or splits
//! its argument into a common subexpression that a DML hook cannot read.
//! The Ballista codec ships it by name ([`crate::physical::codec`]).

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Decimal128Array};
use arrow::compute::kernels::cast::{cast_with_options, CastOptions};
use arrow::compute::kernels::cmp::distinct;
use arrow::datatypes::{ArrowPrimitiveType, DataType, Float16Type, Float32Type, Float64Type};
use arrow::datatypes::{Field, FieldRef};
use datafusion::common::{exec_err, internal_err, Result, ScalarValue};
use datafusion::logical_expr::{
    lit, ColumnarValue, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};

/// The function's name (also its codec key).
pub const FIT: &str = "autocdc_fit";

/// See the module docs.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct FitFunction {
    signature: Signature,
}

static UDF: LazyLock<Arc<ScalarUDF>> = LazyLock::new(|| {
    Arc::new(ScalarUDF::from(FitFunction {
        signature: Signature::any(4, Volatility::Volatile),
    }))
});

/// The function.
pub fn fit_udf() -> Arc<ScalarUDF> {
    Arc::clone(&UDF)
}

/// `value` as `to`, failing with `before`, the value and `after` for a
/// value `to` cannot hold.
pub fn fit(value: Expr, to: &DataType, before: String, after: String) -> Result<Expr> {
    let like = lit(ScalarValue::try_from(to)?);
    Ok(fit_udf().call(vec![value, like, lit(before), lit(after)]))
}

/// `value` as `to`, or `None` if `to` cannot hold it (see the module docs).
pub fn fit_scalar(value: &ScalarValue, to: &DataType) -> Result<Option<ScalarValue>> {
    if value.is_null() {
        return Ok(Some(ScalarValue::try_from(to)?));
    }
    // (a nested value's fields and elements: a strict cast, which fails
    // where a value does not fit rather than making it NULL)
    if to.is_nested() {
        return Ok(value.cast_to(to).ok());
    }
    let values = value.to_array()?;
    let kept = fit_cast(&values, to)?;
    if misfits(&values, &kept)?.value(0) {
        return Ok(None);
    }
    ScalarValue::try_from_array(&kept, 0).map(Some)
}

fn is_decimal(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Decimal32(..)
            | DataType::Decimal64(..)
            | DataType::Decimal128(..)
            | DataType::Decimal256(..)
    )
}

/// A cast that gives NULL for a value the type cannot hold.
const SAFE: CastOptions<'static> = CastOptions {
    safe: true,
    format_options: arrow::util::display::FormatOptions::new(),
};

/// `values` cast to `to`, NULL where `to` cannot hold a value: Arrow's
/// cast, but floats to a decimal of at most 38 digits and a scale of at
/// least 0 by [`float_as_decimal`]: Arrow multiplies by 10^scale in
/// floating point, which is off at a high scale (303.125 at scale 18 is
/// 303.124999999999967232 to it, and the check then refused the value).
fn fit_cast(values: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    let (precision, scale) = match to {
        DataType::Decimal32(p, s) | DataType::Decimal64(p, s) | DataType::Decimal128(p, s)
            if values.data_type().is_floating() && *s >= 0 =>
        {
            (*p, *s)
        }
        _ => return Ok(cast_with_options(values, to, &SAFE)?),
    };
    // (each float as its own width writes it: a FLOAT's 0.1 is 0.1)
    let mut text = String::new();
    let exact: Decimal128Array = match values.data_type() {
        DataType::Float64 => values
            .as_primitive::<Float64Type>()
            .iter()
            .map(|v| v.and_then(|v| float_as_decimal(v, v.is_finite(), scale, &mut text)))
            .collect(),
        DataType::Float16 => values
            .as_primitive::<Float16Type>()
            .iter()
            .map(|v| {
                let v = v.and_then(shortest_half)?;
                float_as_decimal(v, v.is_finite(), scale, &mut text)
            })
            .collect(),
        _ => cast_with_options(values, &DataType::Float32, &SAFE)?
            .as_primitive::<Float32Type>()
            .iter()
            .map(|v| v.and_then(|v| float_as_decimal(v, v.is_finite(), scale, &mut text)))
            .collect(),
    };
    // (NULL where the digits do not fit the precision; Arrow's check
    // returns the array in its default type: the type again after it)
    let exact = exact
        .null_if_overflow_precision(precision)
        .with_precision_and_scale(precision, scale)?;
    Ok(cast_with_options(&exact, to, &SAFE)?)
}

/// The shortest decimal (as a double) that reads back as the half-precision
/// float `v` (0.1 for its 0.0999755859375), `None` for an infinity or NaN:
/// Rust writes no half floats, so the digits are tried one more at a time.
fn shortest_half(v: <Float16Type as ArrowPrimitiveType>::Native) -> Option<f64> {
    if !v.is_finite() {
        return None;
    }
    let wide = v.to_f32();
    (1..=6).find_map(|digits| {
        let text = format!("{:.*e}", digits - 1, wide);
        let read: f32 = text.parse().ok()?;
        (<Float16Type as ArrowPrimitiveType>::Native::from_f32(read) == v)
            .then(|| text.parse::<f64>().ok())
            .flatten()
    })
}

/// The unscaled value at scale `scale` of the shortest decimal that reads
/// back as `v` (Rust's writing of a float: `0.1` is 0.1, not the binary
/// value's 0.1000000000000000055…), when it has at most `scale` fraction
/// digits; else `None` (no decimal of that scale stands for `v`: 1.005 at
/// scale 2). `text` is scratch space.
fn float_as_decimal(
    v: impl std::fmt::Display,
    finite: bool,
    scale: i8,
    text: &mut String,
) -> Option<i128> {
    use std::fmt::Write;
    if !finite {
        return None;
    }
    text.clear();
    // (never an exponent: `1e20` is written out)
    write!(text, "{v}").ok()?;
    let fraction_digits = text.split_once('.').map_or(0, |(_, f)| f.len());
    let more = i32::from(scale) - i32::try_from(fraction_digits).ok()?;
    let mut unscaled: i128 = 0;
    for digit in text.bytes().filter(u8::is_ascii_digit) {
        unscaled = unscaled
            .checked_mul(10)?
            .checked_add(i128::from(digit - b'0'))?;
    }
    let unscaled = unscaled.checked_mul(10i128.checked_pow(u32::try_from(more).ok()?)?)?;
    Some(if text.starts_with('-') {
        -unscaled
    } else {
        unscaled
    })
}

/// Which of `values` (of their own type) do not fit `kept`, their cast to
/// another type (see the module docs).
fn misfits(values: &ArrayRef, kept: &ArrayRef) -> Result<BooleanArray> {
    let from = values.data_type();
    let text = matches!(
        from,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    );
    let lost = match kept.data_type() {
        // text for a decimal: read at a scale finer than any decimal's, it
        // must be the value kept (`'1.005'` is no DECIMAL(5, 2))
        to if text && is_decimal(to) => {
            let fine = DataType::Decimal256(76, 38);
            let read = cast_with_options(values, &fine, &SAFE)?;
            let kept_fine = cast_with_options(kept, &fine, &SAFE)?;
            Some(distinct(&read, &kept_fine)?)
        }
        // a decimal of fewer digits rounds, an integer cuts a fraction off:
        // the value changes (text is read, not compared)
        // (a float into a decimal `fit_cast` converted exactly: NULL
        // where it would round)
        DataType::Decimal32(_, s) | DataType::Decimal64(_, s) | DataType::Decimal128(_, s)
            if from.is_floating() && *s >= 0 =>
        {
            None
        }
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..)
            if from.is_numeric() =>
        {
            let back = cast_with_options(kept, values.data_type(), &CastOptions::default())?;
            Some(distinct(&back, values)?)
        }
        to if to.is_integer() && (from.is_floating() || is_decimal(from)) => {
            let back = cast_with_options(kept, values.data_type(), &CastOptions::default())?;
            Some(distinct(&back, values)?)
        }
        // a narrower float overflows to an infinity the value was not
        // (a number, or text read as one: `'1e39'`)
        DataType::Float16 | DataType::Float32 if from.is_floating() || text => {
            let wide = |a: &ArrayRef| cast_with_options(a, &DataType::Float64, &SAFE);
            let (was, now) = (wide(values)?, wide(kept)?);
            let (was, now) = (
                was.as_primitive::<Float64Type>(),
                now.as_primitive::<Float64Type>(),
            );
            Some(
                was.values()
                    .iter()
                    .zip(now.values().iter())
                    .map(|(was, now)| Some(now.is_infinite() && !was.is_infinite()))
                    .collect(),
            )
        }
        _ => None,
    };
    // (-0.0 is 0: a zero loses nothing, whatever its sign)
    let zeros = match from.is_floating() {
        true => {
            let wide = cast_with_options(values, &DataType::Float64, &CastOptions::default())?;
            Some(wide.as_primitive::<Float64Type>().values().to_vec())
        }
        false => None,
    };
    let is_zero = |i: usize| zeros.as_ref().is_some_and(|z| z[i] == 0.0);
    Ok((0..values.len())
        .map(|i| {
            let changed = lost.as_ref().is_some_and(|lost| lost.value(i)) && !is_zero(i);
            Some(values.is_valid(i) && (kept.is_null(i) || changed))
        })
        .collect())
}

impl ScalarUDFImpl for FitFunction {
    fn name(&self) -> &str {
        FIT
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args {
            [_, like, _, _] => Ok(like.clone()),
            _ => internal_err!("{FIT} takes four arguments"),
        }
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        match args.arg_fields {
            [value, like, _, _] => Ok(Arc::new(Field::new(
                FIT,
                like.data_type().clone(),
                value.is_nullable(),
            ))),
            _ => internal_err!("{FIT} takes four arguments"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [value, _, before, after] = args.args.as_slice() else {
            return internal_err!("{FIT} takes four arguments");
        };
        let to = args.return_field.data_type();
        let values = value.to_array(args.number_rows)?;
        let kept = fit_cast(&values, to)?;
        let misfits = misfits(&values, &kept)?;
        if let Some(row) = misfits.iter().position(|m| m == Some(true)) {
            fn text(c: &ColumnarValue) -> &str {
                match c {
                    ColumnarValue::Scalar(ScalarValue::Utf8(Some(s))) => s.as_str(),
                    _ => "",
                }
            }
            // (a float as Rust writes it short: `1e300`, not 301 digits)
            let value = match ScalarValue::try_from_array(&values, row)? {
                ScalarValue::Float64(Some(f)) => format!("{f:?}"),
                ScalarValue::Float32(Some(f)) => format!("{f:?}"),
                other => other.to_string(),
            };
            return exec_err!("{}{value}{}", text(before), text(after));
        }
        Ok(match value {
            ColumnarValue::Scalar(_) => {
                ColumnarValue::Scalar(ScalarValue::try_from_array(&kept, 0)?)
            }
            ColumnarValue::Array(_) => ColumnarValue::Array(kept),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Decimal128Array, Float64Array, Int64Array};

    fn invoke(values: ArrayRef, to: DataType) -> Result<ArrayRef> {
        let n = values.len();
        let text = |s: &str| ColumnarValue::Scalar(ScalarValue::Utf8(Some(s.into())));
        let result = fit_udf().invoke_with_args(ScalarFunctionArgs {
            arg_fields: vec![
                Arc::new(Field::new("v", values.data_type().clone(), true)),
                Arc::new(Field::new("like", to.clone(), true)),
                Arc::new(Field::new("b", DataType::Utf8, true)),
                Arc::new(Field::new("a", DataType::Utf8, true)),
            ],
            args: vec![
                ColumnarValue::Array(values),
                ColumnarValue::Scalar(ScalarValue::try_from(&to)?),
                text("column 'v' has the value "),
                text(", too much"),
            ],
            number_rows: n,
            return_field: Arc::new(Field::new("r", to, true)),
            config_options: Arc::default(),
        })?;
        result.to_array(n)
    }

    #[test]
    fn values_that_fit_are_cast_and_nulls_stay() {
        let kept = invoke(
            Arc::new(Int64Array::from(vec![Some(1), None, Some(-128)])),
            DataType::Int8,
        )
        .expect("fits");
        assert_eq!(kept.data_type(), &DataType::Int8);
        assert_eq!(kept.null_count(), 1);
    }

    #[test]
    fn the_first_value_out_of_range_is_named() {
        let err = invoke(
            Arc::new(Int64Array::from(vec![Some(1), Some(300), Some(400)])),
            DataType::Int8,
        )
        .expect_err("300 does not fit");
        assert!(
            err.to_string()
                .contains("column 'v' has the value 300, too much"),
            "{err}"
        );
    }

    #[test]
    fn a_decimal_that_would_round_and_a_float_that_would_overflow_do_not_fit() {
        let decimals = Decimal128Array::from(vec![125])
            .with_precision_and_scale(5, 2)
            .expect("decimal");
        let err = invoke(Arc::new(decimals), DataType::Decimal128(5, 1)).expect_err("rounds");
        assert!(err.to_string().contains("has the value 1.25"), "{err}");
        let err = invoke(Arc::new(Float64Array::from(vec![1e300])), DataType::Float32)
            .expect_err("overflows");
        assert!(err.to_string().contains("has the value 1e300"), "{err}");
        invoke(
            Arc::new(Float64Array::from(vec![f64::INFINITY])),
            DataType::Float32,
        )
        .expect("an infinity stays one");
        // -0.0 is 0 for an integer or a decimal; text is read exactly
        invoke(
            Arc::new(Float64Array::from(vec![-0.0, 2.0])),
            DataType::Int32,
        )
        .expect("whole");
        invoke(
            Arc::new(Float64Array::from(vec![-0.0])),
            DataType::Decimal128(5, 2),
        )
        .expect("zero");
        let err = invoke(
            Arc::new(arrow::array::StringArray::from(vec!["1.50", "1.005"])),
            DataType::Decimal128(5, 2),
        )
        .expect_err("rounds");
        assert!(err.to_string().contains("has the value 1.005"), "{err}");
    }

    /// Floats a decimal holds exactly are kept exactly at any scale (Arrow's
    /// cast multiplies in floating point: 303.125 at scale 18 came out
    /// 303.124999999999967232, and was refused); one that would round is
    /// refused, and so is one past the precision.
    #[test]
    fn floats_go_into_decimals_exactly() {
        let kept = invoke(
            Arc::new(Float64Array::from(vec![
                303.125,
                4.001,
                -123456.789,
                0.1,
                1e19,
                -0.0,
            ])),
            DataType::Decimal128(38, 18),
        )
        .expect("exact");
        let kept = kept.as_primitive::<arrow::datatypes::Decimal128Type>();
        assert_eq!(
            kept.values().to_vec(),
            vec![
                303_125_000_000_000_000_000,
                4_001_000_000_000_000_000,
                -123_456_789_000_000_000_000_000,
                100_000_000_000_000_000,
                10_000_000_000_000_000_000_000_000_000_000_000_000,
                0
            ]
        );
        // 38 digits at most: 1e20 needs 21 before the point at scale 18
        for (value, to) in [
            (1e20, DataType::Decimal128(38, 18)),
            (1.5, DataType::Decimal128(38, 38)),
            (1.5e38, DataType::Decimal128(38, 0)),
        ] {
            let err = invoke(Arc::new(Float64Array::from(vec![value])), to)
                .expect_err("past the precision");
            assert!(err.to_string().contains("has the value"), "{err}");
        }
        let err = invoke(
            Arc::new(Float64Array::from(vec![1.005])),
            DataType::Decimal128(5, 2),
        )
        .expect_err("rounds");
        assert!(err.to_string().contains("has the value 1.005"), "{err}");
        let err = invoke(
            Arc::new(Float64Array::from(vec![1e3])),
            DataType::Decimal128(5, 2),
        )
        .expect_err("past the precision");
        assert!(err.to_string().contains("has the value 1000.0"), "{err}");
        invoke(
            Arc::new(Float64Array::from(vec![999.75])),
            DataType::Decimal64(5, 2),
        )
        .expect("fits");
        // a half float's 0.1 is 0.1 too (as a FLOAT, 0.099975586)
        let half = cast_with_options(
            &(Arc::new(Float64Array::from(vec![0.1, 2.5])) as ArrayRef),
            &DataType::Float16,
            &SAFE,
        )
        .expect("half");
        let kept = invoke(half, DataType::Decimal128(5, 2)).expect("fits");
        let kept = kept.as_primitive::<arrow::datatypes::Decimal128Type>();
        assert_eq!(kept.values().to_vec(), vec![10, 250]);
        // a FLOAT's 0.1 is 0.1 (as a DOUBLE it is 0.10000000149011612)
        let kept = invoke(
            Arc::new(arrow::array::Float32Array::from(vec![0.1f32])),
            DataType::Decimal128(5, 2),
        )
        .expect("fits");
        let kept = kept.as_primitive::<arrow::datatypes::Decimal128Type>();
        assert_eq!(kept.value(0), 10);
    }
}
