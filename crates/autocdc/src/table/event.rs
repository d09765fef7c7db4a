//! The event log: what each commit to a streaming table did, kept in the
//! commit's Delta commit information, where `event_log('t')` reads it back
//! and any Delta tool's history shows it.
//!
//! | commit info field               | holds                                         |
//! |---------------------------------|-----------------------------------------------|
//! | `operation`                     | [`Operation`]: `CREATE FLOW`, `REFRESH`, ...  |
//! | `operationParameters.flow`      | the flow that ran (absent for DML)            |
//! | `operationParameters.details`   | what a commit without data says (a skipped snapshot version) |
//! | `operationParameters.expectations` | the run's expectation counts (JSON)        |
//! | `operationParameters.updateId`  | the pipeline update the commit belongs to     |
//! | `operationParameters.newestInputAt` | when the newest input it read arrived (ms) |
//! | `operationMetrics.numUpsertedRows` … `durationMs` | the run's counts, as strings (as Spark writes them) |
//!
//! The state store's commit carries it, and the published table's commit of
//! the same version copies it ([`super::published`]).

use std::collections::HashMap;
use std::future::Future;
use std::time::Instant;

use std::sync::Arc;

use datafusion::common::Result;
use deltalake_core::kernel::{Action, CommitInfo};
use deltalake_core::logstore::get_actions;
use deltalake_core::DeltaTable;
use futures::{StreamExt, TryStreamExt};
use serde_json::Value;

use super::delta_err;

tokio::task_local! {
    /// The pipeline update the running statement belongs to.
    static UPDATE_ID: String;
}

/// Run `work` as part of the pipeline update `id`: the commits it makes
/// say so in the event log.
pub async fn in_pipeline_update<F: Future>(id: String, work: F) -> F::Output {
    UPDATE_ID.scope(id, work).await
}

/// The pipeline update the running statement belongs to, if any.
pub fn current_update_id() -> Option<String> {
    UPDATE_ID.try_with(Clone::clone).ok()
}

/// What a commit did to a streaming table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// The first run of a flow, by `CREATE FLOW` (or the Rust builder).
    CreateFlow,
    /// A run of a flow by `REFRESH STREAMING TABLE`.
    Refresh,
    /// `REFRESH ... FULL`: the run of a flow that clears the table and
    /// fills it again, or the clear alone (before its flows run again).
    FullRefresh,
    /// DML.
    Insert,
    /// DML.
    Update,
    /// DML.
    Delete,
    /// DML.
    Merge,
    /// A snapshot flow met a version not newer than its last: nothing of
    /// it was applied (the commit holds only its event).
    SnapshotSkipped,
    /// Rejected events of a target's update appended to its `<t>__rejects`.
    Rejects,
    /// `RESTORE STREAMING TABLE`.
    Restore,
    /// `DROP FLOW`: the flow's definition and checkpoints leave its target.
    DropFlow,
}

impl Operation {
    /// The operation of a flow run: its first (`register`) or a later one.
    pub fn flow_run(register: bool) -> Self {
        if register {
            Self::CreateFlow
        } else {
            Self::Refresh
        }
    }

    /// Its name in the commit information and the event log.
    pub fn name(self) -> &'static str {
        match self {
            Self::CreateFlow => "CREATE FLOW",
            Self::Refresh => "REFRESH",
            Self::FullRefresh => "REFRESH FULL",
            Self::Insert => "INSERT",
            Self::Update => "UPDATE",
            Self::Delete => "DELETE",
            Self::Merge => "MERGE",
            Self::SnapshotSkipped => "SNAPSHOT SKIPPED",
            Self::Rejects => "REJECTS",
            Self::Restore => "RESTORE",
            Self::DropFlow => "DROP FLOW",
        }
    }

    /// Whether a flow runs in it (DML names none, nor a clear alone).
    pub fn runs_flow(self) -> bool {
        matches!(
            self,
            Self::CreateFlow | Self::Refresh | Self::FullRefresh | Self::SnapshotSkipped
        )
    }
}

/// One commit's entry of the event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitEvent {
    /// What ran (a Delta operation name for commits not made by a flow or DML).
    pub operation: String,
    /// The flow that ran.
    pub flow: Option<String>,
    /// Target rows inserted or updated.
    pub upserted: u64,
    /// Target rows deleted.
    pub deleted: u64,
    /// Source events read.
    pub input: u64,
    /// Source events dropped as late.
    pub late: u64,
    /// From planning to the commit.
    pub duration_ms: u64,
    /// What a commit without data says (why a snapshot version was skipped).
    pub details: Option<String>,
    /// The target's expectations on the run's rows: a JSON array of
    /// `{"name", "passed", "failed", "dropped"}`.
    pub expectations: Option<String>,
    /// The pipeline update it belongs to.
    pub update_id: Option<String>,
    /// When the newest of what the run read arrived (ms since the epoch):
    /// a new file's modification time or an upstream commit's time.
    pub newest_input_ms: Option<i64>,
    /// The rejects file the commit recorded (`super::rejects`).
    pub rejects: Option<String>,
    /// Events the run rejected.
    pub rejected: u64,
    /// The version a `RESTORE` brought the table back to (Delta's
    /// `operationParameters.version`).
    pub restored_version: Option<u64>,
}

/// The metric names, in [`CommitEvent`] order.
const METRICS: [&str; 5] = [
    "numUpsertedRows",
    "numDeletedRows",
    "numInputRows",
    "numLateRowsDropped",
    "durationMs",
];

/// The count of rejected events (commits that rejected some).
const REJECTED_METRIC: &str = "numRejectedRows";

impl CommitEvent {
    /// The entry of a commit of `operation` started at `started`.
    pub fn new(operation: Operation, flow: Option<&str>, started: Instant) -> Self {
        Self {
            operation: operation.name().to_string(),
            flow: flow.filter(|_| operation.runs_flow()).map(str::to_string),
            upserted: 0,
            deleted: 0,
            input: 0,
            late: 0,
            duration_ms: started.elapsed().as_millis() as u64,
            details: None,
            expectations: None,
            update_id: current_update_id(),
            newest_input_ms: None,
            rejects: None,
            rejected: 0,
            restored_version: None,
        }
    }

    /// The same entry saying `details`.
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = Some(details.into());
        self
    }

    /// The commit information action carrying it (committed first).
    pub fn action(&self) -> Action {
        let mut parameters = HashMap::new();
        if let Some(flow) = &self.flow {
            parameters.insert("flow".to_string(), Value::String(flow.clone()));
        }
        if let Some(details) = &self.details {
            parameters.insert("details".to_string(), Value::String(details.clone()));
        }
        if let Some(at) = self.newest_input_ms {
            parameters.insert("newestInputAt".to_string(), Value::String(at.to_string()));
        }
        if let Some(update_id) = &self.update_id {
            parameters.insert("updateId".to_string(), Value::String(update_id.clone()));
        }
        if let Some(rejects) = &self.rejects {
            parameters.insert("rejects".to_string(), Value::String(rejects.clone()));
        }
        if let Some(version) = self.restored_version {
            parameters.insert("version".to_string(), Value::String(version.to_string()));
        }
        if let Some(expectations) = &self.expectations {
            parameters.insert(
                "expectations".to_string(),
                Value::String(expectations.clone()),
            );
        }
        let values = [
            self.upserted,
            self.deleted,
            self.input,
            self.late,
            self.duration_ms,
        ];
        let mut metrics: serde_json::Map<String, Value> = METRICS
            .iter()
            .zip(values)
            .map(|(name, value)| (name.to_string(), Value::String(value.to_string())))
            .collect();
        if self.rejects.is_some() {
            metrics.insert(
                REJECTED_METRIC.to_string(),
                Value::String(self.rejected.to_string()),
            );
        }
        Action::CommitInfo(CommitInfo {
            timestamp: Some(chrono::Utc::now().timestamp_millis()),
            operation: Some(self.operation.clone()),
            operation_parameters: Some(parameters),
            engine_info: Some(concat!("datafusion-autocdc/", env!("CARGO_PKG_VERSION")).into()),
            info: [("operationMetrics".to_string(), Value::Object(metrics))].into(),
            ..Default::default()
        })
    }

    /// The entry a commit's information holds; `None` when it has no
    /// operation. Commits made by others (the table's creation) give their
    /// operation and no counts.
    pub fn read(info: &CommitInfo) -> Option<(Self, bool)> {
        let operation = info.operation.clone()?;
        let parameter = |name: &str| {
            info.operation_parameters
                .as_ref()
                .and_then(|p| p.get(name))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let flow = parameter("flow");
        let details = parameter("details");
        let expectations = parameter("expectations");
        let update_id = parameter("updateId");
        let newest_input_ms = parameter("newestInputAt").and_then(|at| at.parse().ok());
        let rejects = parameter("rejects");
        let restored_version = parameter("version").and_then(|v| v.parse().ok());
        let metrics = info.info.get("operationMetrics").and_then(Value::as_object);
        let metric = |name: &str| -> Option<u64> {
            let value = metrics?.get(name)?;
            value
                .as_u64()
                .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
        };
        let counted = METRICS[..4].iter().all(|m| metric(m).is_some());
        Some((
            Self {
                operation,
                flow,
                upserted: metric(METRICS[0]).unwrap_or(0),
                deleted: metric(METRICS[1]).unwrap_or(0),
                input: metric(METRICS[2]).unwrap_or(0),
                late: metric(METRICS[3]).unwrap_or(0),
                duration_ms: metric(METRICS[4]).unwrap_or(0),
                details,
                expectations,
                update_id,
                newest_input_ms,
                rejects,
                rejected: metric(REJECTED_METRIC).unwrap_or(0),
                restored_version,
            },
            counted,
        ))
    }
}

/// The commit time of `version` of `table` (milliseconds since the epoch),
/// from its commit information.
pub(crate) async fn commit_time_ms(
    table: &deltalake_core::DeltaTable,
    version: u64,
) -> datafusion::common::Result<Option<i64>> {
    let Some(bytes) = table
        .log_store()
        .read_commit_entry(version)
        .await
        .map_err(super::delta_err)?
    else {
        return Ok(None);
    };
    Ok(deltalake_core::logstore::get_actions(version, &bytes)
        .map_err(super::delta_err)?
        .into_iter()
        .find_map(|action| match action {
            Action::CommitInfo(info) => info.in_commit_timestamp.or(info.timestamp),
            _ => None,
        }))
}

/// The version each `RESTORE` among `versions` of `table` brought it back
/// to, by the restore's version (entries cleaned from the log are left out).
pub(crate) async fn restores(
    table: &DeltaTable,
    versions: std::ops::RangeInclusive<u64>,
) -> Result<Vec<(u64, u64)>> {
    Ok(commit_infos(table, versions)
        .await?
        .into_iter()
        .filter_map(|(version, info)| {
            let (event, _) = CommitEvent::read(&info?)?;
            let to = event
                .restored_version
                .filter(|_| event.operation == Operation::Restore.name())?;
            Some((version, to))
        })
        .collect())
}

/// The commit information of each of `versions` of `table` whose log entry
/// is still kept (`None`: the entry has none), oldest first.
async fn commit_infos(
    table: &DeltaTable,
    versions: std::ops::RangeInclusive<u64>,
) -> Result<Vec<(u64, Option<CommitInfo>)>> {
    let log_store = table.log_store();
    futures::stream::iter(versions)
        .map(|version| {
            let log_store = Arc::clone(&log_store);
            async move {
                let Some(bytes) = log_store
                    .read_commit_entry(version)
                    .await
                    .map_err(delta_err)?
                else {
                    return Ok(None);
                };
                let info = get_actions(version, &bytes)
                    .map_err(delta_err)?
                    .into_iter()
                    .find_map(|action| match action {
                        Action::CommitInfo(info) => Some(info),
                        _ => None,
                    });
                Ok(Some((version, info)))
            }
        })
        .buffered(CONCURRENT_READS)
        .try_filter_map(|entry| async move { Ok(entry) })
        .try_collect()
        .await
}

/// Commit entries read at once.
const CONCURRENT_READS: usize = 16;

/// One commit of a table's log, as the event log shows it.
pub(crate) struct LoggedCommit {
    pub version: i64,
    /// The commit's time (ms), in-commit or file time.
    pub timestamp: Option<i64>,
    /// Its event, and whether its counts are the run's.
    pub event: Option<(CommitEvent, bool)>,
}

/// Every commit still in `delta`'s log, oldest first (versions whose entry
/// was cleaned up are left out).
pub(crate) async fn logged_commits(delta: &DeltaTable) -> Result<Vec<LoggedCommit>> {
    let Some(latest) = delta.version() else {
        return Ok(vec![]);
    };
    Ok(commit_infos(delta, 0..=latest)
        .await?
        .into_iter()
        .map(|(version, info)| LoggedCommit {
            version: version as i64,
            timestamp: info
                .as_ref()
                .and_then(|i| i.in_commit_timestamp.or(i.timestamp)),
            event: info.as_ref().and_then(CommitEvent::read),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_back_from_its_commit_info() {
        let mut event = CommitEvent::new(Operation::Refresh, Some("f"), Instant::now());
        event.upserted = 3;
        event.late = 1;
        let Action::CommitInfo(info) = event.action() else {
            panic!("not a commit info")
        };
        assert_eq!(info.operation.as_deref(), Some("REFRESH"));
        let json = serde_json::to_string(&info).unwrap();
        assert!(
            json.contains("\"operationMetrics\":{") && json.contains("\"numUpsertedRows\":\"3\""),
            "{json}"
        );
        let parsed: CommitInfo = serde_json::from_str(&json).unwrap();
        assert_eq!(CommitEvent::read(&parsed), Some((event, true)));
        // a skip says why
        let skip = CommitEvent::new(Operation::SnapshotSkipped, Some("f"), Instant::now())
            .with_details("snapshot version 5 skipped");
        let Action::CommitInfo(info) = skip.action() else {
            panic!("not a commit info")
        };
        assert_eq!(CommitEvent::read(&info), Some((skip, true)));
        // DML names no flow
        let dml = CommitEvent::new(Operation::Delete, Some("f"), Instant::now());
        assert_eq!(dml.flow, None);
        // a commit of another writer: its operation, no counts
        let other = CommitInfo {
            operation: Some("CREATE TABLE".into()),
            ..Default::default()
        };
        let (event, counted) = CommitEvent::read(&other).unwrap();
        assert_eq!((event.operation.as_str(), counted), ("CREATE TABLE", false));
    }
}
