//! `event_log('target')`: one row per commit of a streaming table, from the
//! commit information of its log ([`crate::table::event`]):
//!
//! | column                   | type                   |                                          |
//! |--------------------------|------------------------|------------------------------------------|
//! | `commit_version`         | `BIGINT`               | the version `table_changes` names        |
//! | `commit_timestamp`       | `TIMESTAMP` (ms)       | when Delta readers see it: the time `TIMESTAMP AS OF` resolves by ([`crate::table::commit_times`]) |
//! | `operation`              | `VARCHAR`              | `CREATE FLOW`, `REFRESH`, `DELETE`, ...  |
//! | `flow`                   | `VARCHAR`              | NULL for DML and other commits           |
//! | `num_upserted_rows` …    | `BIGINT`               | NULL for commits without counts          |
//! | `duration_ms`            | `BIGINT`               | from planning to the commit              |
//! | `details`                | `VARCHAR`              | what a commit without data says (a skipped snapshot version), else NULL |
//! | `expectations`           | `VARCHAR`              | JSON: per expectation of the table, the rows `passed`, `failed`, `dropped`; NULL without |
//! | `update_id`              | `VARCHAR`              | the `REFRESH PIPELINE` update the commit belongs to, else NULL |
//! | `newest_input_at`        | `TIMESTAMP` (ms)       | when the newest input the run read arrived: a new file's modification time, an upstream commit's time; NULL when unknown |
//! | `latency_ms`             | `BIGINT`               | from `newest_input_at` to the commit |
//! | `num_rejected_rows`      | `BIGINT`               | events the run sent to `<t>__rejects` (a target with rejects on); NULL when none |

use std::sync::{Arc, LazyLock};

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Result, ScalarValue};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;

use super::TableRegistry;
use crate::metrics::run_count_fields;
use crate::table::event::{logged_commits, CommitEvent, LoggedCommit};
use crate::table::ScdTable;

static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let count = |name: &str| Field::new(name, DataType::Int64, true);
    let mut fields = vec![
        Field::new("commit_version", DataType::Int64, false),
        Field::new(
            "commit_timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        ),
        Field::new("operation", DataType::Utf8, true),
        Field::new("flow", DataType::Utf8, true),
    ];
    fields.extend(run_count_fields());
    fields.extend([
        count("duration_ms"),
        Field::new("details", DataType::Utf8, true),
        Field::new("expectations", DataType::Utf8, true),
        Field::new("update_id", DataType::Utf8, true),
        Field::new(
            "newest_input_at",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        ),
        Field::new("latency_ms", DataType::Int64, true),
        count("num_rejected_rows"),
    ]);
    Arc::new(Schema::new(fields))
});

/// The `event_log` table function.
#[derive(Debug)]
pub struct EventLogFunction {
    tables: TableRegistry,
}

impl EventLogFunction {
    /// A function over the session's streaming tables.
    pub fn new(tables: TableRegistry) -> Self {
        Self { tables }
    }
}

impl TableFunctionImpl for EventLogFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        let [Expr::Literal(ScalarValue::Utf8(Some(name)) | ScalarValue::Utf8View(Some(name)), _)] =
            args
        else {
            return plan_err!("event_log('target') takes a streaming table name as a string");
        };
        let table = super::lookup_table(&self.tables, "event_log", name)?;
        Ok(Arc::new(EventLog { table }))
    }
}

/// The event log of one table (read when scanned).
#[derive(Debug)]
struct EventLog {
    table: Arc<ScdTable>,
}

impl EventLog {
    async fn entries(&self) -> Result<Vec<LoggedCommit>> {
        self.table.refresh().await?;
        let delta = self.table.delta();
        let (mut entries, times) =
            futures::try_join!(logged_commits(&delta), self.table.commit_times())?;
        // the times Delta readers' time travel resolves by
        for entry in &mut entries {
            if let Some(&at) = times.get(&(entry.version as u64)) {
                entry.timestamp = Some(at);
            }
        }
        Ok(entries)
    }
}

/// The entry's event, if its commit has one.
fn event_of(entry: &LoggedCommit) -> Option<&CommitEvent> {
    entry.event.as_ref().map(|(event, _)| event)
}

fn batch(entries: &[LoggedCommit]) -> Result<RecordBatch> {
    let count = |f: fn(&CommitEvent) -> u64| -> ArrayRef {
        Arc::new(Int64Array::from_iter(entries.iter().map(|e| {
            e.event
                .as_ref()
                .filter(|(_, counted)| *counted)
                .map(|(event, _)| f(event) as i64)
        })))
    };
    Ok(RecordBatch::try_new(
        Arc::clone(&SCHEMA),
        vec![
            Arc::new(Int64Array::from_iter_values(
                entries.iter().map(|e| e.version),
            )),
            Arc::new(TimestampMillisecondArray::from_iter(
                entries.iter().map(|e| e.timestamp),
            )),
            Arc::new(StringArray::from_iter(
                entries
                    .iter()
                    .map(|e| event_of(e).map(|ev| ev.operation.as_str())),
            )),
            Arc::new(StringArray::from_iter(
                entries
                    .iter()
                    .map(|e| event_of(e).and_then(|ev| ev.flow.as_deref())),
            )),
            count(|e| e.upserted),
            count(|e| e.deleted),
            count(|e| e.input),
            count(|e| e.late),
            count(|e| e.duration_ms),
            Arc::new(StringArray::from_iter(
                entries
                    .iter()
                    .map(|e| event_of(e).and_then(|ev| ev.details.as_deref())),
            )),
            Arc::new(StringArray::from_iter(
                entries
                    .iter()
                    .map(|e| event_of(e).and_then(|ev| ev.expectations.as_deref())),
            )),
            Arc::new(StringArray::from_iter(
                entries
                    .iter()
                    .map(|e| event_of(e).and_then(|ev| ev.update_id.as_deref())),
            )),
            Arc::new(TimestampMillisecondArray::from_iter(
                entries
                    .iter()
                    .map(|e| event_of(e).and_then(|ev| ev.newest_input_ms)),
            )),
            Arc::new(Int64Array::from_iter(entries.iter().map(|e| {
                let arrived = event_of(e).and_then(|ev| ev.newest_input_ms)?;
                Some(e.timestamp? - arrived)
            }))),
            Arc::new(Int64Array::from_iter(entries.iter().map(|e| {
                event_of(e)
                    .filter(|ev| ev.rejects.is_some())
                    .map(|ev| ev.rejected as i64)
            }))),
        ],
    )?)
}

#[async_trait]
impl TableProvider for EventLog {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&SCHEMA)
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let batch = batch(&self.entries().await?)?;
        Ok(MemorySourceConfig::try_new_exec(
            &[vec![batch]],
            Arc::clone(&SCHEMA),
            projection.cloned(),
        )?)
    }
}
