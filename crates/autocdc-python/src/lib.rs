//! The Python module `datafusion_autocdc`: AUTO CDC flows from Python, the
//! way the reference pages write them (`create_auto_cdc_flow(...)`), on the
//! same engine as the SQL front end.
//!
//! ```text
//!  Python                         this module                  datafusion-autocdc
//!  CdcSession("./warehouse") ──► CdcSession (owns a tokio ──► CdcSession::open
//!                                 runtime; calls release
//!                                 the GIL while they run)
//!  s.register("src", data) ────► Arrow C stream in ─────────► a MemTable
//!  s.create_auto_cdc_flow(...) ─► keyword arguments ────────► AutoCdcFlowBuilder
//!  s.sql("SELECT ...") ────────► QueryResult ──────────────► __arrow_c_stream__ out
//! ```
//!
//! Engine errors raise `AutoCdcError` with the message the CLI prints;
//! wrong arguments raise `TypeError` / `ValueError` naming them.

use pyo3::prelude::*;

mod arrow_io;
mod provider;
mod result;
mod session;
mod shared_runtime;
mod table_function;
mod version;

pyo3::create_exception!(
    datafusion_autocdc,
    AutoCdcError,
    pyo3::exceptions::PyException,
    "An AUTO CDC statement or flow failed; the message names the flow, clause and value."
);

/// An engine error as a Python exception, with the CLI's message.
pub(crate) fn engine_error(e: datafusion::error::DataFusionError) -> PyErr {
    AutoCdcError::new_err(e.to_string())
}

/// An Arrow error as a Python exception.
pub(crate) fn engine_error_arrow(e: arrow::error::ArrowError) -> PyErr {
    AutoCdcError::new_err(e.to_string())
}

#[pymodule]
fn datafusion_autocdc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<session::PyCdcSession>()?;
    m.add_class::<result::QueryResult>()?;
    m.add_class::<provider::PyTableProvider>()?;
    m.add_class::<table_function::PyTableFunction>()?;
    m.add("AutoCdcError", m.py().get_type::<AutoCdcError>())?;
    Ok(())
}
