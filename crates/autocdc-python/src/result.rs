//! `QueryResult`: the rows of a statement, readable by any Arrow library.

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::util::pretty::pretty_format_batches;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// The result of `CdcSession.sql(...)`: collected rows. Implements the Arrow
/// PyCapsule interface (`pyarrow.table(result)`, `polars.DataFrame(result)`).
#[pyclass(name = "QueryResult", module = "datafusion_autocdc", frozen)]
pub(crate) struct QueryResult {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
}

impl QueryResult {
    pub(crate) fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Self { schema, batches }
    }
}

#[pymethods]
impl QueryResult {
    /// The rows as an Arrow C stream (`requested_schema` is not supported
    /// and must be None).
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        if requested_schema.is_some_and(|s| !s.is_none()) {
            return Err(pyo3::exceptions::PyNotImplementedError::new_err(
                "QueryResult.__arrow_c_stream__: requested_schema is not supported",
            ));
        }
        crate::arrow_io::stream_capsule(py, self.schema.clone(), self.batches.clone())
    }

    /// Number of rows.
    #[getter]
    fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }

    /// Column names, in order.
    #[getter]
    fn column_names(&self) -> Vec<String> {
        self.schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// The rows as a `pyarrow.Table` (needs pyarrow).
    fn to_arrow_table<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py().import("pyarrow")?.call_method1("table", (slf,))
    }

    /// The rows as a `pandas.DataFrame` (needs pyarrow and pandas).
    fn to_pandas<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        Self::to_arrow_table(slf)?.call_method0("to_pandas")
    }

    /// Print the rows as a table, as the CLI does.
    fn show(&self) -> PyResult<()> {
        println!("{}", self.__str__()?);
        Ok(())
    }

    fn __str__(&self) -> PyResult<String> {
        pretty_format_batches(&self.batches)
            .map(|t| t.to_string())
            .map_err(crate::engine_error_arrow)
    }

    fn __len__(&self) -> usize {
        self.num_rows()
    }
}
