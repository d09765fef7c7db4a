//! Arrow data across the Python boundary through the Arrow PyCapsule
//! interface (`__arrow_c_stream__`), so any Arrow library (pyarrow, Polars,
//! pandas through pyarrow, DuckDB) can hand data in and read results out
//! without this module linking any of them.

use std::ffi::CStr;

use arrow::array::{RecordBatch, RecordBatchIterator, RecordBatchReader};
use arrow::datatypes::SchemaRef;
use arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// The capsule name of an Arrow C stream.
const STREAM: &CStr = c"arrow_array_stream";

/// The batches of a Python object implementing `__arrow_c_stream__`.
pub(crate) fn read_stream(
    data: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<(SchemaRef, Vec<RecordBatch>)> {
    if !data.hasattr("__arrow_c_stream__")? {
        return Err(PyTypeError::new_err(format!(
            "{what}: expected Arrow data (an object with __arrow_c_stream__: a pyarrow \
             Table or RecordBatchReader, a Polars DataFrame, ...), got {}",
            data.get_type().name()?
        )));
    }
    let capsule = data.call_method0("__arrow_c_stream__")?;
    let capsule = capsule.cast::<PyCapsule>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}: __arrow_c_stream__ did not return a capsule"
        ))
    })?;
    let pointer = capsule.pointer_checked(Some(STREAM))?;
    // SAFETY: a capsule named `arrow_array_stream` holds an
    // FFI_ArrowArrayStream (the Arrow PyCapsule interface); `from_raw` moves
    // it out and marks the capsule's copy released
    let stream = unsafe { FFI_ArrowArrayStream::from_raw(pointer.as_ptr().cast()) };
    let reader = ArrowArrayStreamReader::try_new(stream).map_err(crate::engine_error_arrow)?;
    let schema = reader.schema();
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(crate::engine_error_arrow)?;
    Ok((schema, batches))
}

/// `batches` as an Arrow C stream capsule.
pub(crate) fn stream_capsule<'py>(
    py: Python<'py>,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let reader = RecordBatchIterator::new(batches.into_iter().map(Ok), schema);
    let stream = FFI_ArrowArrayStream::new(Box::new(reader));
    PyCapsule::new_with_value(py, stream, STREAM)
}
