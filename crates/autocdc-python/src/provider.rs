//! `TableProvider`: a streaming table handed to another DataFusion
//! (datafusion-python's `SessionContext.register_table`) through DataFusion's
//! FFI (`__datafusion_table_provider__`), read there as `s.sql` reads it.
//!
//! A scan plans in the `CdcSession` that owns the table, not in the foreign
//! session: planning a streaming table's read builds plans over our own
//! table providers, which the foreign side could not decode.

use std::ffi::CStr;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::DataFusionError;
use datafusion::execution::session_state::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::table_provider::FFI_TableProvider;
use futures::StreamExt;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::shared_runtime::SharedRuntime;

const PROVIDER: &CStr = c"datafusion_table_provider";
const CODEC: &CStr = c"datafusion_logical_extension_codec";

/// A table whose scans are planned in `state` (the owning session's) on
/// `runtime` (the owning session's: the foreign side polls with its own
/// tokio, which our object stores cannot use), whatever session asks.
#[derive(Debug)]
pub(crate) struct OwnSessionScan {
    table: Arc<dyn TableProvider>,
    state: SessionState,
    runtime: Arc<SharedRuntime>,
}

impl OwnSessionScan {
    pub(crate) fn new(
        table: Arc<dyn TableProvider>,
        state: SessionState,
        runtime: Arc<SharedRuntime>,
    ) -> Self {
        Self {
            table,
            state,
            runtime,
        }
    }
}

#[async_trait]
impl TableProvider for OwnSessionScan {
    fn schema(&self) -> SchemaRef {
        self.table.schema()
    }

    fn table_type(&self) -> TableType {
        self.table.table_type()
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let (table, state) = (Arc::clone(&self.table), self.state.clone());
        let (projection, filters) = (projection.cloned(), filters.to_vec());
        let task_ctx = state.task_ctx();
        let plan = self
            .runtime
            .handle()
            .spawn(async move {
                table
                    .scan(&state, projection.as_ref(), &filters, limit)
                    .await
            })
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))??;
        Ok(Arc::new(OwnRuntimeExec {
            properties: Arc::clone(plan.properties()),
            inner: plan,
            task_ctx,
            runtime: Arc::clone(&self.runtime),
        }))
    }
}

/// Runs `inner` (a plan of the owning session) on the owning session's
/// runtime and task context, handing its batches to whoever polls.
#[derive(Debug)]
struct OwnRuntimeExec {
    inner: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    task_ctx: Arc<TaskContext>,
    runtime: Arc<SharedRuntime>,
}

impl DisplayAs for OwnRuntimeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "StreamingTableScan: {}", self.inner.name())
    }
}

impl ExecutionPlan for OwnRuntimeExec {
    fn name(&self) -> &str {
        "OwnRuntimeExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }
    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }
    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let _entered = self.runtime.handle().enter();
        let mut stream = self.inner.execute(partition, Arc::clone(&self.task_ctx))?;
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        self.runtime.handle().spawn(async move {
            while let Some(batch) = stream.next().await {
                if tx.send(batch).await.is_err() {
                    break;
                }
            }
        });
        let batches = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|batch| (batch, rx))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.inner.schema(),
            batches,
        )))
    }
}

/// The logical extension codec of a foreign `session` (a datafusion-python
/// `SessionContext`, or the codec capsule itself), for the FFI object
/// `method` returns.
pub(crate) fn foreign_codec(
    session: &Bound<'_, PyAny>,
    method: &str,
) -> PyResult<FFI_LogicalExtensionCodec> {
    let codec = if session.hasattr("__datafusion_logical_extension_codec__")? {
        session.call_method0("__datafusion_logical_extension_codec__")?
    } else {
        session.clone()
    };
    let codec = codec.cast::<PyCapsule>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "{method}: the session has no logical extension codec"
        ))
    })?;
    let pointer = codec.pointer_checked(Some(CODEC))?;
    // SAFETY: a capsule named `datafusion_logical_extension_codec` holds an
    // FFI_LogicalExtensionCodec (DataFusion's FFI); it is cloned, the
    // capsule keeps its own
    Ok(unsafe { pointer.cast::<FFI_LogicalExtensionCodec>().as_ref() }.clone())
}

/// A streaming table for a foreign DataFusion session; its scans run on the
/// `CdcSession`'s runtime.
#[pyclass(name = "TableProvider", module = "datafusion_autocdc", frozen)]
pub(crate) struct PyTableProvider {
    provider: Arc<dyn TableProvider>,
    runtime: Arc<SharedRuntime>,
}

impl PyTableProvider {
    pub(crate) fn new(provider: Arc<dyn TableProvider>, runtime: Arc<SharedRuntime>) -> Self {
        Self { provider, runtime }
    }
}

#[pymethods]
impl PyTableProvider {
    /// The FFI provider, with the logical codec of the calling `session`.
    fn __datafusion_table_provider__<'py>(
        &self,
        py: Python<'py>,
        session: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = foreign_codec(&session, "__datafusion_table_provider__")?;
        let provider = FFI_TableProvider::new_with_ffi_codec(
            Arc::clone(&self.provider),
            false,
            Some(self.runtime.handle().clone()),
            codec,
        );
        PyCapsule::new_with_value(py, provider, PROVIDER)
    }
}
