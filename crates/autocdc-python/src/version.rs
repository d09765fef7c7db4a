//! Snapshot versions across the Python boundary: what a
//! `next_snapshot_and_version` function returns as its version, and the
//! last processed version it is called with.
//!
//! | Python                          | engine (`ScalarValue`)            |
//! |---------------------------------|-----------------------------------|
//! | `int`                           | `Int64`                           |
//! | anything pyarrow types (`str`, `float`, `datetime`, `date`, `Decimal`, ...) | that Arrow type, read back with pyarrow's `as_py()` |
//! | `bool`, `None`                  | refused: not an ordered version   |
//!
//! Integers need no Arrow library; other versions go through pyarrow
//! (`pa.table({"version": [v]})`), so every type it knows keeps its exact
//! Arrow type (time zones, decimal scale) and comes back as it went in.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema};
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};

use crate::arrow_io::read_stream;
use crate::result::QueryResult;

/// A snapshot version of a Python snapshot function.
#[derive(Debug, Clone)]
pub(crate) struct Version(pub(crate) ScalarValue);

impl From<Version> for ScalarValue {
    fn from(v: Version) -> Self {
        v.0
    }
}

impl TryFrom<ScalarValue> for Version {
    type Error = DataFusionError;
    fn try_from(v: ScalarValue) -> Result<Self, Self::Error> {
        Ok(Self(v))
    }
}

/// The version a snapshot function returned.
pub(crate) fn to_version(value: &Bound<'_, PyAny>) -> PyResult<Version> {
    to_scalar(value, "version", "next_snapshot_and_version").map(Version)
}

/// An ordered Python value (a version, a point of time) as the engine's
/// value; `what` names it in errors, `context` names the call.
pub(crate) fn to_scalar(
    value: &Bound<'_, PyAny>,
    what: &str,
    context: &str,
) -> PyResult<ScalarValue> {
    if value.is_none() || value.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{context}: the {what} must be an integer, a string, a date, a timestamp or \
             another ordered value, got {}",
            value.repr()?
        )));
    }
    if value.is_instance_of::<PyInt>() {
        let n = value.extract::<i64>().map_err(|_| {
            PyValueError::new_err(format!(
                "{context}: the {what} {value} does not fit in 64 bits"
            ))
        })?;
        return Ok(ScalarValue::Int64(Some(n)));
    }
    let py = value.py();
    let columns = PyDict::new(py);
    columns.set_item("value", vec![value])?;
    let table = py
        .import("pyarrow")
        .map_err(|e| {
            PyTypeError::new_err(format!(
                "{context}: a {what} that is not an integer needs pyarrow to be read ({e})"
            ))
        })?
        .call_method1("table", (columns,))?;
    let (_, batches) = read_stream(&table, context)?;
    let batch = batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .ok_or_else(|| PyValueError::new_err(format!("{context}: the {what} is empty")))?;
    ScalarValue::try_from_array(batch.column(0), 0).map_err(crate::engine_error)
}

/// The last processed version, for the snapshot function.
pub(crate) fn to_python<'py>(py: Python<'py>, version: &Version) -> PyResult<Bound<'py, PyAny>> {
    let v = &version.0;
    if let (true, Ok(ScalarValue::Int64(Some(n)))) = (
        v.data_type().is_integer(),
        v.cast_to(&arrow::datatypes::DataType::Int64),
    ) {
        return Ok(n.into_pyobject(py)?.into_any());
    }
    let array = v.to_array().map_err(crate::engine_error)?;
    let schema = Arc::new(Schema::new(vec![Field::new(
        "version",
        array.data_type().clone(),
        true,
    )]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![array])
        .map_err(crate::engine_error_arrow)?;
    let rows = Bound::new(py, QueryResult::new(schema, vec![batch]))?;
    py.import("pyarrow")?
        .call_method1("table", (rows,))?
        .call_method1("column", (0,))?
        .get_item(0)?
        .call_method0("as_py")
}
