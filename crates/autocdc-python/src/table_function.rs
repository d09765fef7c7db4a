//! `TableFunction`: one of our table functions (`table_changes`,
//! `table_as_of`, `event_log`, `stream`) handed to another DataFusion
//! through DataFusion's FFI (`__datafusion_table_function__`), so that
//!
//! ```python
//! ctx.register_udtf(datafusion.udtf(s.table_function("table_changes"), "table_changes"))
//! ctx.sql("SELECT * FROM table_changes('target', 1)")
//! ```
//!
//! returns there what `s.sql` returns for the same call. The call is made
//! in the `CdcSession` that owns the tables (the foreign session knows none
//! of them); the table it returns is read as `s.table_provider(...)` is
//! (planned here, run on the session's runtime).

use std::ffi::CStr;
use std::sync::Arc;

use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::execution::session_state::SessionState;
use datafusion_ffi::udtf::FFI_TableFunction;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::provider::{foreign_codec, OwnSessionScan};
use crate::shared_runtime::SharedRuntime;

const FUNCTION: &CStr = c"datafusion_table_function";

/// `function` of the owning session, called with the owning session's
/// state whatever session calls it.
#[derive(Debug)]
struct OwnSessionFunction {
    function: Arc<datafusion::catalog::TableFunction>,
    state: SessionState,
    runtime: Arc<SharedRuntime>,
}

impl TableFunctionImpl for OwnSessionFunction {
    fn call_with_args(
        &self,
        args: TableFunctionArgs,
    ) -> datafusion::error::Result<Arc<dyn TableProvider>> {
        let own = TableFunctionArgs::new(args.exprs(), &self.state);
        let table = self.function.create_table_provider_with_args(own)?;
        Ok(Arc::new(OwnSessionScan::new(
            table,
            self.state.clone(),
            Arc::clone(&self.runtime),
        )))
    }
}

/// A table function of a `CdcSession` for a foreign DataFusion session.
#[pyclass(name = "TableFunction", module = "datafusion_autocdc", frozen)]
pub(crate) struct PyTableFunction {
    function: Arc<OwnSessionFunction>,
    runtime: Arc<SharedRuntime>,
}

impl PyTableFunction {
    pub(crate) fn new(
        function: Arc<datafusion::catalog::TableFunction>,
        state: SessionState,
        runtime: Arc<SharedRuntime>,
    ) -> Self {
        let function = Arc::new(OwnSessionFunction {
            function,
            state,
            runtime: Arc::clone(&runtime),
        });
        Self { function, runtime }
    }
}

#[pymethods]
impl PyTableFunction {
    /// The name the function has in the `CdcSession`.
    #[getter]
    fn name(&self) -> &str {
        self.function.function.name()
    }

    /// The FFI table function, with the logical codec of the calling
    /// `session`.
    fn __datafusion_table_function__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = foreign_codec(&session, "__datafusion_table_function__")?;
        let function = FFI_TableFunction::new_with_ffi_codec(
            Arc::clone(&self.function) as Arc<dyn TableFunctionImpl>,
            Some(self.runtime.handle().clone()),
            codec,
        );
        PyCapsule::new_with_value(py, function, FUNCTION)
    }
}
