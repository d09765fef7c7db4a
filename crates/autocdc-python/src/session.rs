//! `CdcSession`: a warehouse, its streaming tables and flows, from Python.

use std::future::Future;
use std::sync::Arc;

use datafusion::catalog::TableFunctionArgs;
use datafusion::common::{ScalarValue, TableReference};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{lit, Expr};
use datafusion::prelude::DataFrame;
use datafusion_autocdc::api::{RestoreTo, UpdateMetrics};
use datafusion_autocdc::session::SnapshotFunction;
use datafusion_autocdc::table::TableName;
use datafusion_autocdc::{AutoCdcConfig, CdcSession, ScdType};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::arrow_io::read_stream;
use crate::engine_error;
use crate::provider::{OwnSessionScan, PyTableProvider};
use crate::result::QueryResult;
use crate::shared_runtime::SharedRuntime;
use crate::table_function::PyTableFunction;
use crate::version::{self, Version};

/// A session on a warehouse: a folder, `file://`, `memory://` or an object
/// store URL. It owns the tokio runtime its calls run on; every call
/// releases the GIL while the engine works.
#[pyclass(name = "CdcSession", module = "datafusion_autocdc", frozen)]
pub(crate) struct PyCdcSession {
    session: Arc<CdcSession>,
    runtime: Arc<SharedRuntime>,
    interrupt: Interrupt,
}

impl PyCdcSession {
    /// `provider` for a foreign session: scans planned and run here.
    fn foreign(&self, provider: Arc<dyn datafusion::catalog::TableProvider>) -> PyTableProvider {
        let scan = OwnSessionScan::new(
            provider,
            self.session.context().state(),
            Arc::clone(&self.runtime),
        );
        PyTableProvider::new(Arc::new(scan), Arc::clone(&self.runtime))
    }

    /// The table our table function `function` returns for `args`, for a
    /// foreign session.
    fn function_provider(&self, function: &str, args: &[Expr]) -> PyResult<PyTableProvider> {
        let ctx = self.session.context();
        let function = ctx.table_function(function).map_err(engine_error)?;
        let state = ctx.state();
        let provider = function
            .create_table_provider_with_args(TableFunctionArgs::new(args, &state))
            .map_err(engine_error)?;
        Ok(self.foreign(provider))
    }

    /// The rows of the frame `frame` returns, collected on the session's
    /// runtime with the GIL released.
    fn collect<F>(
        &self,
        py: Python<'_>,
        frame: impl FnOnce(Arc<CdcSession>) -> F + Send,
    ) -> PyResult<QueryResult>
    where
        F: Future<Output = datafusion::error::Result<DataFrame>> + Send,
    {
        let (schema, batches) = self.run(py, move |s| async move {
            let frame = frame(s).await?;
            let schema = Arc::new(frame.schema().as_arrow().clone());
            Ok((schema, frame.collect().await?))
        })?;
        Ok(QueryResult::new(schema, batches))
    }

    /// Run `work` on the session's runtime with the GIL released.
    fn run<T, F>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(Arc<CdcSession>) -> F + Send,
    ) -> PyResult<T>
    where
        F: Future<Output = datafusion::error::Result<T>> + Send,
        T: Send,
    {
        // a snapshot callback (`next_snapshot_and_version`) runs inside a
        // session's runtime, which cannot be entered again
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(PyRuntimeError::new_err(
                "a CdcSession cannot be called from inside a snapshot callback \
                 (next_snapshot_and_version): return the snapshot and let the flow run \
                 (a datafusion-python DataFrame may read other data there)",
            ));
        }
        let session = Arc::clone(&self.session);
        let runtime = Arc::clone(&self.runtime);
        let result = py.detach(move || runtime.block_on(work(session)));
        // (a call that reports a failed flow as a result, not an error —
        // `update_pipeline` — raises the interrupt too)
        match self.interrupt.take() {
            Some(interrupt) => Err(interrupt),
            None => result.map_err(engine_error),
        }
    }
}

/// `stored_as_scd_type`: 1, 2, "1", "2" or "BITEMPORAL".
fn scd_type(value: &Bound<'_, PyAny>) -> PyResult<ScdType> {
    // (a bool is an int to Python: True is no storage type)
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "stored_as_scd_type: expected 1, 2 or \"BITEMPORAL\", got {}",
            value.repr()?
        )));
    }
    if value.is_instance_of::<pyo3::types::PyInt>() && value.extract::<i64>().is_err() {
        return Err(PyValueError::new_err(format!(
            "stored_as_scd_type: expected 1, 2 or \"BITEMPORAL\", got {}",
            value.repr()?
        )));
    }
    if let Ok(n) = value.extract::<i64>() {
        return match n {
            1 => Ok(ScdType::Type1),
            2 => Ok(ScdType::Type2),
            _ => Err(PyValueError::new_err(format!(
                "stored_as_scd_type: expected 1, 2 or \"BITEMPORAL\", got {n}"
            ))),
        };
    }
    let Ok(text) = value.extract::<String>() else {
        return Err(PyTypeError::new_err(format!(
            "stored_as_scd_type: expected 1, 2 or \"BITEMPORAL\", got a {}",
            value.get_type().name()?
        )));
    };
    match text.trim().to_ascii_uppercase().as_str() {
        "1" => Ok(ScdType::Type1),
        "2" => Ok(ScdType::Type2),
        "BITEMPORAL" => Ok(ScdType::Bitemporal),
        _ => Err(PyValueError::new_err(format!(
            "stored_as_scd_type: expected 1, 2 or \"BITEMPORAL\", got '{text}'"
        ))),
    }
}

/// A run's metrics as a dict (the columns of the SQL statements' result).
fn metrics_dict<'py>(py: Python<'py>, m: &UpdateMetrics) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("flow", &m.flow)?;
    d.set_item("num_upserted_rows", m.num_upserted_rows)?;
    d.set_item("num_deleted_rows", m.num_deleted_rows)?;
    d.set_item("num_input_rows", m.num_input_rows)?;
    d.set_item("num_late_rows_dropped", m.num_late_rows_dropped)?;
    d.set_item("commit_version", m.commit_version)?;
    Ok(d)
}

/// Call a Python `next_snapshot_and_version(latest_version)`: its snapshot
/// as a DataFrame of `ctx`, and its version; `None` when it has no newer one.
fn next_snapshot(
    function: &Py<PyAny>,
    ctx: &datafusion::prelude::SessionContext,
    interrupt: &Interrupt,
    latest: Option<Version>,
) -> datafusion::error::Result<Option<(datafusion::prelude::DataFrame, Version)>> {
    let failed = |e: PyErr| {
        let message = format!("next_snapshot_and_version: {e}");
        interrupt.keep(e);
        datafusion::error::DataFusionError::Execution(message)
    };
    let snapshot = Python::attach(|py| -> PyResult<Option<_>> {
        let latest = latest.map(|v| version::to_python(py, &v)).transpose()?;
        let out = function.call1(py, (latest,))?;
        if out.is_none(py) {
            return Ok(None);
        }
        let (data, version): (Bound<'_, PyAny>, Bound<'_, PyAny>) = out
            .extract(py)
            .map_err(|_| PyTypeError::new_err("must return (data, version) or None"))?;
        Ok(Some((
            read_stream(&data, "next_snapshot_and_version")?,
            version::to_version(&version)?,
        )))
    })
    .map_err(failed)?;
    let Some(((schema, batches), version)) = snapshot else {
        return Ok(None);
    };
    let table = MemTable::try_new(schema, vec![batches])?;
    Ok(Some((ctx.read_table(Arc::new(table))?, version)))
}

/// A `BaseException` that is no `Exception` (`KeyboardInterrupt`,
/// `SystemExit`) raised by a snapshot callback of a session: the flow fails
/// as for any error, and the session's call that ran it raises this one as
/// it is, instead of an `AutoCdcError`, so Ctrl-C and `sys.exit` keep their
/// meaning. One per session: another session's calls never see it.
#[derive(Clone, Default)]
struct Interrupt(Arc<std::sync::Mutex<Option<PyErr>>>);

impl Interrupt {
    fn keep(&self, e: PyErr) {
        let interrupt = Python::attach(|py| !e.is_instance_of::<pyo3::exceptions::PyException>(py));
        if interrupt {
            if let Ok(mut slot) = self.0.lock() {
                *slot = Some(e);
            }
        }
    }

    fn take(&self) -> Option<PyErr> {
        self.0.lock().ok()?.take()
    }
}

/// A Python `next_snapshot_and_version` as the session's snapshot function.
fn snapshot_function(
    function: Py<PyAny>,
    ctx: datafusion::prelude::SessionContext,
    interrupt: Interrupt,
) -> SnapshotFunction {
    Arc::new(move |latest: Option<ScalarValue>| {
        let latest = latest.map(Version::try_from).transpose()?;
        Ok(next_snapshot(&function, &ctx, &interrupt, latest)?
            .map(|(frame, version)| (frame, version.into())))
    })
}

/// A table name as SQL reads one: `Users` is `users`, `'"Users"'` keeps
/// its case, `s.t` is schema `s`'s table `t`, and a name that is not one
/// (`"Src Tbl"`) is that table — the Python API names tables as `sql` does.
/// A quoted part holding a `.` (`'"we.ird"'`) is refused, as SQL refuses
/// it, rather than read as two parts.
fn sql_name(name: &str) -> datafusion::common::Result<String> {
    let parts = TableReference::from(name).to_vec();
    if let Some(part) = parts.iter().find(|part| part.contains('.')) {
        return Err(datafusion::common::DataFusionError::Plan(format!(
            "invalid streaming table name '{name}': name parts must contain no '.' ('{part}')"
        )));
    }
    Ok(parts.join("."))
}

/// `builder` with `set` applied when a Python argument was given.
fn with<B, T>(builder: B, value: Option<T>, set: impl FnOnce(B, T) -> B) -> B {
    match value {
        Some(v) => set(builder, v),
        None => builder,
    }
}

/// The expectations `{name: condition}` of an `expect_all*` parameter
/// `parameter`, in its order.
fn expectations(
    parameter: &str,
    dict: Option<Bound<'_, PyDict>>,
) -> PyResult<Vec<(String, String)>> {
    let Some(dict) = dict else {
        return Ok(Vec::new());
    };
    dict.iter()
        .map(
            |(name, condition)| match (name.extract(), condition.extract()) {
                (Ok(name), Ok(condition)) => Ok((name, condition)),
                _ => Err(PyTypeError::new_err(format!(
                    "{parameter}: expected {{name: condition}} with text for both, got {{{}: {}}}",
                    name.repr()?,
                    condition.repr()?
                ))),
            },
        )
        .collect()
}

/// `table_properties`: a dict `{key: value}` or a list of `(key, value)`
/// pairs, text both.
fn properties_of(value: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    if let Ok(dict) = value.cast::<PyDict>() {
        return dict
            .iter()
            .map(|(k, v)| match (k.extract(), v.extract()) {
                (Ok(k), Ok(v)) => Ok((k, v)),
                _ => Err(PyTypeError::new_err(format!(
                    "table_properties: expected text keys and values, got {{{}: {}}}",
                    k.repr()?,
                    v.repr()?
                ))),
            })
            .collect();
    }
    value.extract::<Vec<(String, String)>>().map_err(|_| {
        PyTypeError::new_err(
            "table_properties: expected a dict {key: value} or a list of (key, value) pairs, text both",
        )
    })
}

fn metrics_list<'py>(py: Python<'py>, runs: &[UpdateMetrics]) -> PyResult<Bound<'py, PyList>> {
    let dicts = runs
        .iter()
        .map(|m| metrics_dict(py, m))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, dicts)
}

#[pymethods]
impl PyCdcSession {
    #[new]
    #[pyo3(signature = (warehouse = "./warehouse"))]
    fn new(py: Python<'_>, warehouse: &str) -> PyResult<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| PyValueError::new_err(format!("CdcSession: no tokio runtime: {e}")))?;
        let runtime = SharedRuntime::new(runtime);
        let mut config = AutoCdcConfig::new(warehouse);
        // (`information_schema` on, as in the CLI: `SHOW TABLES`, `SHOW
        // autocdc.<setting>`)
        config.session_config = config.session_config.with_information_schema(true);
        let open = || runtime.block_on(CdcSession::open(config));
        // (inside a runtime, a snapshot callback of another session's say,
        // this thread cannot block on one: a thread of its own does)
        let session = py
            .detach(|| match tokio::runtime::Handle::try_current() {
                Ok(_) => std::thread::scope(|scope| {
                    scope.spawn(open).join().unwrap_or_else(|_| {
                        Err(datafusion::error::DataFusionError::Execution(
                            "CdcSession: opening the warehouse panicked".into(),
                        ))
                    })
                }),
                Err(_) => open(),
            })
            .map_err(engine_error)?;
        Ok(Self {
            session: Arc::new(session),
            runtime: Arc::new(runtime),
            interrupt: Interrupt::default(),
        })
    }

    /// Run one SQL statement (AUTO CDC statements included); returns its rows.
    fn sql(&self, py: Python<'_>, query: String) -> PyResult<QueryResult> {
        let (schema, batches) = self.run(py, move |s| async move {
            let frame = s.sql(&query).await?;
            let schema = Arc::new(frame.schema().as_arrow().clone());
            Ok((schema, frame.collect().await?))
        })?;
        Ok(QueryResult::new(schema, batches))
    }

    /// Register Arrow data (anything with `__arrow_c_stream__`) as a table
    /// named `name`, replacing one of that name.
    fn register(&self, py: Python<'_>, name: String, data: &Bound<'_, PyAny>) -> PyResult<()> {
        if name.trim().is_empty() {
            return Err(PyValueError::new_err(
                "register: name must not be empty (it is how SQL names the table)",
            ));
        }
        let (schema, batches) = read_stream(data, &format!("register('{name}')"))?;
        let table = MemTable::try_new(schema, vec![batches]).map_err(engine_error)?;
        // the name as the context takes it (folded unless quoted)
        let reference = TableReference::from(name.as_str());
        let parts: Vec<String> = reference.to_vec();
        if let Ok(streaming) = TableName::from_parts(&parts) {
            let exists = self.run(py, move |s| async move {
                s.warehouse().exists(&streaming).await
            })?;
            if exists {
                return Err(PyValueError::new_err(format!(
                    "register('{name}'): '{}' is a streaming table: data registered under its \
                     name would only hide it in this session; register it under another name \
                     (or DROP STREAMING TABLE it first)",
                    TableName::from_parts(&parts)
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                )));
            }
        }
        self.run(py, move |s| async move {
            let ctx = s.context();
            ctx.deregister_table(name.as_str())?;
            ctx.register_table(name.as_str(), Arc::new(table))?;
            Ok(())
        })
    }

    /// Declare a streaming table (kept if it exists). `schema`: its columns
    /// as SQL (`"id BIGINT, name STRING"`); without it the first flow's.
    /// `expect_all` / `expect_all_or_drop` / `expect_all_or_fail`: its
    /// expectations, `{name: condition}` (failing rows kept and counted,
    /// dropped, or failing the update).
    #[pyo3(signature = (
        name, *, schema = None, comment = None, table_properties = None,
        expect_all = None, expect_all_or_drop = None, expect_all_or_fail = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn create_streaming_table(
        &self,
        py: Python<'_>,
        name: String,
        schema: Option<String>,
        comment: Option<String>,
        table_properties: Option<&Bound<'_, PyAny>>,
        expect_all: Option<Bound<'_, PyDict>>,
        expect_all_or_drop: Option<Bound<'_, PyDict>>,
        expect_all_or_fail: Option<Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let expect_all = expectations("expect_all", expect_all)?;
        let expect_all_or_drop = expectations("expect_all_or_drop", expect_all_or_drop)?;
        let expect_all_or_fail = expectations("expect_all_or_fail", expect_all_or_fail)?;
        let properties = match table_properties {
            None => Vec::new(),
            Some(p) => properties_of(p)?,
        };
        self.run(py, move |s| async move {
            let mut builder = s
                .create_streaming_table(&sql_name(&name)?)
                .table_properties(properties)
                .expect_all(expect_all)
                .expect_all_or_drop(expect_all_or_drop)
                .expect_all_or_fail(expect_all_or_fail);
            if let Some(schema) = schema {
                builder = builder.schema(schema);
            }
            if let Some(comment) = comment {
                builder = builder.comment(comment);
            }
            builder.await
        })
    }

    /// Create an AUTO CDC flow and run its first update; returns its metrics.
    /// Parameters as in the reference's `create_auto_cdc_flow`.
    #[pyo3(signature = (
        *, target, source, keys, sequence_by = None, apply_as_deletes = None,
        apply_as_truncates = None, column_list = None, except_column_list = None,
        stored_as_scd_type = None, track_history_column_list = None,
        track_history_except_column_list = None, ignore_null_updates = false,
        ignore_null_updates_column_list = None, ignore_null_updates_except_column_list = None,
        columns_to_update = None, system_sequence_by = None, name = None, once = false,
        previous_keys = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn create_auto_cdc_flow<'py>(
        &self,
        py: Python<'py>,
        target: String,
        source: String,
        keys: &Bound<'py, PyAny>,
        sequence_by: Option<&Bound<'py, PyAny>>,
        apply_as_deletes: Option<String>,
        apply_as_truncates: Option<String>,
        column_list: Option<Vec<String>>,
        except_column_list: Option<Vec<String>>,
        stored_as_scd_type: Option<&Bound<'py, PyAny>>,
        track_history_column_list: Option<Vec<String>>,
        track_history_except_column_list: Option<Vec<String>>,
        ignore_null_updates: bool,
        ignore_null_updates_column_list: Option<Vec<String>>,
        ignore_null_updates_except_column_list: Option<Vec<String>>,
        columns_to_update: Option<String>,
        system_sequence_by: Option<String>,
        name: Option<String>,
        once: bool,
        previous_keys: Option<Vec<String>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let keys = key_list(keys, "create_auto_cdc_flow")?;
        // (None: derived from a change source, else the flow says it is required)
        let sequence: Option<Result<String, Vec<String>>> = match sequence_by {
            None => None,
            Some(s) if s.extract::<String>().is_ok() => Some(Ok(s.extract::<String>()?)),
            Some(s) if s.extract::<Vec<String>>().is_ok() => {
                let columns = s.extract::<Vec<String>>()?;
                if columns.is_empty() {
                    return Err(PyValueError::new_err(
                        "create_auto_cdc_flow: sequence_by must name at least one column",
                    ));
                }
                Some(Err(columns))
            }
            Some(_) => {
                return Err(PyTypeError::new_err(
                    "create_auto_cdc_flow: sequence_by must be a column name or a list of them (a STRUCT sequence)",
                ))
            }
        };
        let scd = stored_as_scd_type.map(scd_type).transpose()?;
        for (pair, both) in [
            (
                "column_list or except_column_list",
                column_list.is_some() && except_column_list.is_some(),
            ),
            (
                "track_history_column_list or track_history_except_column_list",
                track_history_column_list.is_some() && track_history_except_column_list.is_some(),
            ),
            (
                "ignore_null_updates_column_list or ignore_null_updates_except_column_list",
                ignore_null_updates_column_list.is_some()
                    && ignore_null_updates_except_column_list.is_some(),
            ),
        ] {
            if both {
                return Err(PyValueError::new_err(format!(
                    "create_auto_cdc_flow: give {pair}, not both"
                )));
            }
        }
        if name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return Err(PyValueError::new_err(
                "create_auto_cdc_flow: name must not be empty",
            ));
        }
        let metrics = self.run(py, move |s| async move {
            let flow = s
                .create_auto_cdc_flow(&sql_name(&target)?, &source)
                .keys(keys);
            let flow = match sequence {
                Some(Ok(column)) => flow.sequence_by(column),
                Some(Err(columns)) => flow.sequence_by_struct(columns),
                None => flow,
            };
            let flow = with(flow, previous_keys, |f, v| f.previous_keys(v));
            let flow = with(flow, name, |f, v| f.name(v));
            let flow = with(flow, apply_as_deletes, |f, v| f.apply_as_deletes(v));
            let flow = with(flow, apply_as_truncates, |f, v| f.apply_as_truncates(v));
            let flow = with(flow, column_list, |f, v| f.column_list(v));
            let flow = with(flow, except_column_list, |f, v| f.except_column_list(v));
            let flow = with(flow, scd, |f, v| f.stored_as_scd_type(v));
            let flow = with(flow, track_history_column_list, |f, v| {
                f.track_history_column_list(v)
            });
            let flow = with(flow, track_history_except_column_list, |f, v| {
                f.track_history_except_column_list(v)
            });
            let flow = flow.ignore_null_updates(ignore_null_updates);
            let flow = with(flow, ignore_null_updates_column_list, |f, v| {
                f.ignore_null_updates_column_list(v)
            });
            let flow = with(flow, ignore_null_updates_except_column_list, |f, v| {
                f.ignore_null_updates_except_column_list(v)
            });
            let flow = with(flow, columns_to_update, |f, v| f.columns_to_update(v));
            let flow = with(flow, system_sequence_by, |f, v| f.system_sequence_by(v));
            flow.once(once).await
        })?;
        metrics_dict(py, &metrics)
    }

    /// Create an AUTO CDC FROM SNAPSHOT flow and process every available
    /// snapshot; returns one metrics dict per snapshot. `source` is a table
    /// name (read whole at each update: periodic snapshots) or a function
    /// `next_snapshot_and_version(latest_version)` returning `(data,
    /// version)` — data with `__arrow_c_stream__`; the version an integer,
    /// string, date, timestamp or any ordered value pyarrow types, the same
    /// type at every call — or `None` when there is no newer snapshot.
    #[pyo3(signature = (
        *, target, source, keys, stored_as_scd_type = None,
        track_history_column_list = None, track_history_except_column_list = None,
        name = None, once = false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn create_auto_cdc_from_snapshot_flow<'py>(
        &self,
        py: Python<'py>,
        target: String,
        source: &Bound<'py, PyAny>,
        keys: &Bound<'py, PyAny>,
        stored_as_scd_type: Option<&Bound<'py, PyAny>>,
        track_history_column_list: Option<Vec<String>>,
        track_history_except_column_list: Option<Vec<String>>,
        name: Option<String>,
        once: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let keys = key_list(keys, "create_auto_cdc_from_snapshot_flow")?;
        let source: Result<String, Py<PyAny>> = if let Ok(table) = source.extract::<String>() {
            Ok(table)
        } else if source.is_callable() {
            Err(source.clone().unbind())
        } else {
            return Err(PyTypeError::new_err(
                "create_auto_cdc_from_snapshot_flow: source must be a table name or a \
                 function next_snapshot_and_version(latest_version)",
            ));
        };
        if track_history_column_list.is_some() && track_history_except_column_list.is_some() {
            return Err(PyValueError::new_err(
                "create_auto_cdc_from_snapshot_flow: give track_history_column_list or \
                 track_history_except_column_list, not both",
            ));
        }
        if name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            return Err(PyValueError::new_err(
                "create_auto_cdc_from_snapshot_flow: name must not be empty",
            ));
        }
        let scd = stored_as_scd_type.map(scd_type).transpose()?;
        if scd == Some(ScdType::Bitemporal) {
            return Err(PyValueError::new_err(
                "create_auto_cdc_from_snapshot_flow: stored_as_scd_type must be 1 or 2",
            ));
        }
        let interrupt = self.interrupt.clone();
        let runs = self.run(py, move |s| async move {
            let flow = s
                .create_auto_cdc_from_snapshot_flow(&sql_name(&target)?)
                .keys(keys);
            let flow = match source {
                Ok(table) => flow.source(&table),
                Err(function) => {
                    let ctx = s.context().clone();
                    flow.next_snapshot_and_version(move |latest: Option<Version>| {
                        next_snapshot(&function, &ctx, &interrupt, latest)
                    })
                }
            };
            let flow = with(flow, name, |f, v| f.name(v));
            let flow = with(flow, scd, |f, v| f.stored_as_scd_type(v));
            let flow = with(flow, track_history_column_list, |f, v| {
                f.track_history_column_list(v)
            });
            let flow = with(flow, track_history_except_column_list, |f, v| {
                f.track_history_except_column_list(v)
            });
            flow.once(once).await
        })?;
        metrics_list(py, &runs)
    }

    /// Register the function `next_snapshot_and_version` a snapshot flow of
    /// `target` (named `name`, by default the target's) reads: a function
    /// lives in the process that registered it, so a new process registers
    /// it again before the flow runs.
    #[pyo3(signature = (target, function, *, name = None))]
    fn register_snapshot_function(
        &self,
        py: Python<'_>,
        target: String,
        function: &Bound<'_, PyAny>,
        name: Option<String>,
    ) -> PyResult<()> {
        if !function.is_callable() {
            return Err(PyTypeError::new_err(format!(
                "register_snapshot_function('{target}'): function must be callable \
                 (next_snapshot_and_version(latest_version)), got {}",
                function.repr()?
            )));
        }
        let function = function.clone().unbind();
        let interrupt = self.interrupt.clone();
        self.run(py, move |s| async move {
            let table = TableName::parse(&sql_name(&target)?)?;
            let flows = s.snapshot_function_flows(&table).await?;
            let name = name.unwrap_or_else(|| table.table.clone());
            if !flows.contains(&name) {
                return Err(datafusion::error::DataFusionError::Plan(format!(
                    "register_snapshot_function('{target}'): '{table}' has no snapshot flow \
                     '{name}' that reads a function (those it has: {})",
                    match flows.is_empty() {
                        true => "none".to_string(),
                        false => flows.join(", "),
                    }
                )));
            }
            let function = snapshot_function(function, s.context().clone(), interrupt);
            s.register_snapshot_function(&table, &name, function);
            Ok(())
        })
    }

    /// Update every streaming table of the warehouse (of `schema`) once,
    /// each after the tables it reads (`REFRESH PIPELINE`). `full_refresh`:
    /// `True` (every table from scratch) or a list of tables (those and
    /// their readers). Returns `{"update_id", "tables": [{"table", "status",
    /// "runs", "message"}]}`, tables in the order they ran; a table whose
    /// upstream failed is `"skipped"`.
    #[pyo3(signature = (*, schema = None, full_refresh = None))]
    fn update_pipeline<'py>(
        &self,
        py: Python<'py>,
        schema: Option<String>,
        full_refresh: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        enum Full {
            None,
            All,
            Tables(Vec<String>),
        }
        let full = match full_refresh {
            None => Full::None,
            Some(v) => match v.extract::<bool>() {
                Ok(true) => Full::All,
                Ok(false) => Full::None,
                Err(_) => Full::Tables(v.extract::<Vec<String>>().map_err(|_| {
                    PyTypeError::new_err(
                        "update_pipeline: full_refresh is True or a list of table names",
                    )
                })?),
            },
        };
        let update = self.run(py, move |s| async move {
            let mut update = s.update_pipeline();
            if let Some(schema) = schema {
                update = update.schema(schema);
            }
            let update = match full {
                Full::None => update,
                Full::All => update.full_refresh_all(),
                Full::Tables(tables) => update.full_refresh(
                    tables
                        .iter()
                        .map(|t| sql_name(t))
                        .collect::<datafusion::common::Result<Vec<_>>>()?,
                )?,
            };
            update.await
        })?;
        let tables = PyList::empty(py);
        for t in &update.tables {
            let entry = PyDict::new(py);
            entry.set_item("table", t.table.to_string())?;
            entry.set_item("status", t.status.name())?;
            entry.set_item("runs", metrics_list(py, &t.runs)?)?;
            entry.set_item("message", t.message.as_deref())?;
            tables.append(entry)?;
        }
        let result = PyDict::new(py);
        result.set_item("update_id", &update.update_id)?;
        result.set_item("tables", tables)?;
        Ok(result)
    }

    /// Create an append flow (the reference's `@dp.append_flow`) and run it
    /// once; returns its metrics. `source`: a streaming table whose new rows
    /// each run appends (with `once`, any table or registered data, appended
    /// whole); or `query`: the rows as SQL. `once`: append when created and
    /// on a full refresh only.
    #[pyo3(signature = (*, target, source = None, query = None, once = false, name = None))]
    fn create_append_flow<'py>(
        &self,
        py: Python<'py>,
        target: String,
        source: Option<String>,
        query: Option<String>,
        once: bool,
        name: Option<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let flow_source = match (source, query) {
            (Some(table), None) => Ok(table),
            (None, Some(sql)) => Err(sql),
            _ => {
                return Err(PyValueError::new_err(
                    "create_append_flow: give source (a table) or query (SQL), one of them",
                ))
            }
        };
        let metrics = self.run(py, move |s| async move {
            let flow = s.create_append_flow(&sql_name(&target)?).once(once);
            let flow = match flow_source {
                Ok(table) => flow.source(table),
                Err(sql) => flow.query(sql),
            };
            with(flow, name, |f, v| f.name(v)).await
        })?;
        metrics_dict(py, &metrics)
    }

    /// The streaming table `name` for a datafusion-python `SessionContext`
    /// (`ctx.register_table("t", s.table_provider("t"))`), read there as
    /// `sql` reads it.
    fn table_provider(&self, name: &str) -> PyResult<PyTableProvider> {
        let parsed = sql_name(name)
            .and_then(|name| TableName::parse(&name))
            .map_err(engine_error)?;
        let table = self.session.streaming_table(&parsed).ok_or_else(|| {
            PyValueError::new_err(format!(
                "table_provider('{name}'): no streaming table of that name in this session"
            ))
        })?;
        Ok(self.foreign(table))
    }

    /// The rows of the query `query`, in our SQL (`FROM AUTO CDC (…) …`,
    /// `FROM SNAPSHOTS (…) …`, our table functions, the session's tables),
    /// as a table for a datafusion-python `SessionContext`:
    /// `ctx.register_table("t", s.query_provider("SELECT … FROM AUTO CDC (…) …"))`.
    /// Planned now (a bad clause fails here, named as in `sql`); each scan
    /// there runs it here. Only a query: a statement (DDL, DML, `REFRESH`)
    /// is refused, as it would run now.
    fn query_provider(&self, py: Python<'_>, query: String) -> PyResult<PyTableProvider> {
        let view = self.run(py, move |s| async move {
            Ok(s.query(&query).await?.into_view())
        })?;
        Ok(self.foreign(view))
    }

    /// Our table function `name` (`table_changes`, `table_as_of`,
    /// `event_log`, `stream`) for a datafusion-python `SessionContext`:
    /// `ctx.register_udtf(datafusion.udtf(s.table_function(n), n))`; calls
    /// there return what they return in `sql`.
    fn table_function(&self, name: &str) -> PyResult<PyTableFunction> {
        let ctx = self.session.context();
        let function = ctx.table_function(name).map_err(|_| {
            PyValueError::new_err(format!(
                "table_function('{name}'): no table function of that name in this session"
            ))
        })?;
        Ok(PyTableFunction::new(
            function,
            ctx.state(),
            Arc::clone(&self.runtime),
        ))
    }

    /// The change data feed of the streaming table `name` from version
    /// `from_version` (to `to_version`, inclusive) for a datafusion-python
    /// `SessionContext`: what `table_changes(name, from[, to])` returns.
    #[pyo3(signature = (name, from_version, to_version = None))]
    fn table_changes_provider(
        &self,
        name: &str,
        from_version: i64,
        to_version: Option<i64>,
    ) -> PyResult<PyTableProvider> {
        let mut args = vec![lit(name.to_string()), lit(from_version)];
        args.extend(to_version.map(lit));
        self.function_provider("table_changes", &args)
    }

    /// The streaming table `name` as of commit `version` for a
    /// datafusion-python `SessionContext`: what `table_as_of(name, version)`
    /// returns.
    fn table_as_of_provider(&self, name: &str, version: i64) -> PyResult<PyTableProvider> {
        self.function_provider("table_as_of", &[lit(name.to_string()), lit(version)])
    }

    /// `scd2_as_of(name, business_time)`: the versions of an SCD 2 target
    /// valid at `business_time` (an int, a datetime, ... typed like the
    /// sequence), one row per key.
    fn scd2_as_of(
        &self,
        py: Python<'_>,
        name: String,
        business_time: &Bound<'_, PyAny>,
    ) -> PyResult<QueryResult> {
        let at = version::to_scalar(business_time, "business time", "scd2_as_of")?;
        self.collect(py, move |s| async move { s.scd2_as_of(&name, at).await })
    }

    /// `bitemporal_as_of(name, business_time, system_time=None)`: what a
    /// BITEMPORAL target recorded at `system_time` (None: now) about
    /// `business_time`, one row per key.
    #[pyo3(signature = (name, business_time, system_time = None))]
    fn bitemporal_as_of(
        &self,
        py: Python<'_>,
        name: String,
        business_time: &Bound<'_, PyAny>,
        system_time: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<QueryResult> {
        const CALL: &str = "bitemporal_as_of";
        let at = version::to_scalar(business_time, "business time", CALL)?;
        let seen = system_time
            .map(|s| version::to_scalar(s, "system time", CALL))
            .transpose()?;
        self.collect(py, move |s| async move {
            s.bitemporal_as_of(&name, at, seen).await
        })
    }

    /// `table_as_of(name, at)`: the streaming table as of a commit version
    /// (an int) or a commit time (a datetime).
    fn table_as_of(
        &self,
        py: Python<'_>,
        name: String,
        at: &Bound<'_, PyAny>,
    ) -> PyResult<QueryResult> {
        let at = version::to_scalar(at, "commit version or time", "table_as_of")?;
        self.collect(py, move |s| async move { s.table_as_of(&name, at).await })
    }

    /// `RESTORE STREAMING TABLE name TO VERSION AS OF version` (or `TIMESTAMP
    /// AS OF timestamp`, a string or a datetime): the table, its state and
    /// its flows' checkpoints back to that version as one new commit; returns
    /// what it did as a dict.
    #[pyo3(signature = (name, *, version = None, timestamp = None))]
    fn restore<'py>(
        &self,
        py: Python<'py>,
        name: String,
        version: Option<&Bound<'py, PyAny>>,
        timestamp: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let to = match (version, timestamp) {
            (Some(version), None) => {
                // (any int out of range is a ValueError, not an OverflowError)
                if !version.is_instance_of::<pyo3::types::PyInt>()
                    || version.is_instance_of::<pyo3::types::PyBool>()
                {
                    return Err(PyTypeError::new_err(format!(
                        "restore: version must be an int (got {})",
                        version
                            .get_type()
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default()
                    )));
                }
                RestoreTo::Version(version.extract::<u64>().map_err(|_| {
                    PyValueError::new_err(format!(
                        "restore: version must be a commit version (0 or more), not {version}"
                    ))
                })?)
            }
            (None, Some(ts)) => RestoreTo::Timestamp(match ts.extract::<String>() {
                Ok(text) => text,
                Err(_) if ts.hasattr("isoformat")? => ts.call_method0("isoformat")?.extract()?,
                Err(_) => {
                    return Err(PyTypeError::new_err(format!(
                        "restore: timestamp must be a string or a datetime (got {})",
                        ts.get_type()
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default()
                    )))
                }
            }),
            _ => {
                return Err(PyTypeError::new_err(
                    "restore(name, version=…) or restore(name, timestamp=…): exactly one of them",
                ))
            }
        };
        let m = self.run(py, move |s| async move {
            s.restore_streaming_table(&sql_name(&name)?, to).await
        })?;
        let d = PyDict::new(py);
        d.set_item("restored_version", m.restored_version)?;
        d.set_item("commit_version", m.commit_version)?;
        d.set_item("num_upserted_rows", m.num_upserted_rows)?;
        d.set_item("num_deleted_rows", m.num_deleted_rows)?;
        d.set_item("num_removed_files", m.num_removed_files)?;
        d.set_item("num_restored_files", m.num_restored_files)?;
        Ok(d)
    }

    /// Run every flow of `target` again (`full`: from scratch); returns one
    /// metrics dict per flow run.
    #[pyo3(signature = (target, *, full = false))]
    fn refresh<'py>(
        &self,
        py: Python<'py>,
        target: String,
        full: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let runs = self.run(py, move |s| async move {
            s.refresh_streaming_table(&sql_name(&target)?, full).await
        })?;
        metrics_list(py, &runs)
    }
}

/// The `keys` argument of `function`: a list of at least one column name
/// (a lone string is refused, not read as its characters).
fn key_list(keys: &Bound<'_, PyAny>, function: &str) -> PyResult<Vec<String>> {
    if keys.extract::<String>().is_ok() {
        return Err(PyTypeError::new_err(format!(
            "{function}: keys must be a list of column names, e.g. [\"id\"]"
        )));
    }
    let keys: Vec<String> = keys.extract().map_err(|_| {
        PyTypeError::new_err(format!("{function}: keys must be a list of column names"))
    })?;
    if keys.is_empty() {
        return Err(PyValueError::new_err(format!(
            "{function}: keys must name at least one column"
        )));
    }
    Ok(keys)
}
