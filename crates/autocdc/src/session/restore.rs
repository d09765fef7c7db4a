//! `RESTORE [STREAMING] TABLE t [TO] {VERSION AS OF n | TIMESTAMP AS OF 'ts'}`
//! (SPEC §4.9): the published table, the state store and every flow's
//! source checkpoint as they were at version `n`, as one new commit
//! ([`crate::table::restore`]); the next update re-reads each source from
//! its restored checkpoint.
//!
//! Refused, with nothing changed:
//!
//! | case                                                   | why                                              |
//! |--------------------------------------------------------|--------------------------------------------------|
//! | `n` is not an older version of the table               | nothing to restore                               |
//! | `n` is older than the tombstone retention              | tombstones, files and source data older than it may be gone |
//! | a flow reads its source whole at every update (an in-memory table, a query without streams) | its source cannot go back: what the restore undoes would return |
//!
//! Snapshot flows go back to the last snapshot version they had processed
//! at `n`: a snapshot function is called with that version again (a
//! function that cannot offer the versions after it offers none, and the
//! table stays as restored until it does); periodic snapshots diff the next
//! snapshot against the restored rows. `ONCE` flows do not run again.

use std::time::Instant;

use arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::{DataFusionError, Result, ScalarValue};

use crate::metrics::RestoreMetrics;
use crate::pipeline::source::{in_from_clause, plan_changes};
use crate::sql::RestoreTo;
use crate::table::event::{CommitEvent, Operation};
use crate::table::restore::restore;
use crate::table::TableName;

use super::CdcSession;

impl CdcSession {
    /// `RESTORE STREAMING TABLE name TO …`: the table back to the version
    /// `to` names (see the module docs).
    pub async fn restore_streaming_table(
        &self,
        name: &str,
        to: RestoreTo,
    ) -> Result<RestoreMetrics> {
        self.restore_table(&TableName::parse(name)?, &to).await
    }

    pub(crate) async fn restore_table(
        &self,
        name: &TableName,
        to: &RestoreTo,
    ) -> Result<RestoreMetrics> {
        let started = Instant::now();
        self.refuse_on_rejects_table(&format!("RESTORE of '{name}'"), name)
            .await?;
        let table = self.table(name).await?;
        table.refresh().await?;
        let refuse = |why: String| {
            Err(DataFusionError::Plan(format!(
                "RESTORE of '{name}': {why}; nothing was changed"
            )))
        };
        let latest = table.delta().version().unwrap_or(0) as u64;
        let version = match to {
            RestoreTo::Version(version) => *version,
            RestoreTo::Timestamp(ts) => {
                let ms = match ScalarValue::Utf8(Some(ts.clone()))
                    .cast_to(&DataType::Timestamp(TimeUnit::Millisecond, None))
                {
                    Ok(ScalarValue::TimestampMillisecond(Some(ms), _)) => ms,
                    _ => return refuse(format!("TIMESTAMP AS OF '{ts}' is not a timestamp")),
                };
                match table.version_at(ms).await? {
                    Some(version) => version,
                    None => return refuse(format!("the table was created after '{ts}'")),
                }
            }
        };
        if version > latest {
            return refuse(format!("its versions are 0 to {latest}, not {version}"));
        }
        if version == latest {
            return refuse(format!("version {version} is its current version"));
        }
        let meta = table.meta();
        let retention_ms = meta.tombstone_retention_secs.saturating_mul(1000);
        let now_ms = self.clock.now().timestamp_millis();
        match table.commit_time(version).await? {
            Some(at) if now_ms.saturating_sub(at) <= retention_ms => {}
            Some(_) => {
                return refuse(format!(
                    "version {version} is older than the table's tombstone retention ({} s, \
                     'pipelines.cdc.tombstoneGCThresholdInSeconds'): what it needs may be gone",
                    meta.tombstone_retention_secs
                ))
            }
            None => {
                return refuse(format!(
                    "the log entry of version {version} is no longer kept"
                ))
            }
        }
        // a flow reads its source whole when planning its next read yields
        // no checkpoint (one without a checkpoint now, after a RESTORE to a
        // version before it, still reads a stream)
        let state = self.ctx.state();
        let mut whole = None;
        for flow in meta
            .flows
            .values()
            .filter(|f| !f.once && !f.source.is_snapshot())
        {
            let read = plan_changes(&state, flow, &meta)
                .await
                .map_err(|e| in_from_clause(&flow.name, e))?;
            if read.checkpoint.is_none() {
                whole = Some(flow);
                break;
            }
        }
        if let Some(flow) = whole {
            return refuse(format!(
                "flow '{}' reads its source whole at every update (an in-memory table or a \
                 query without streams), so its source cannot go back to version {version}: \
                 read a streaming table, a stream or a file folder to restore",
                flow.name
            ));
        }
        let keys = crate::table::restore::target_keys(&table);
        let event = CommitEvent::new(Operation::Restore, None, started)
            .with_details(format!("restored version {version}"));
        let restored = restore(&self.ctx.state(), &table, version, keys.as_deref(), event).await?;
        Ok(RestoreMetrics {
            restored_version: version,
            commit_version: restored.version,
            num_upserted_rows: restored.inserted + restored.updated,
            num_deleted_rows: restored.deleted,
            num_removed_files: restored.files_removed,
            num_restored_files: restored.files_added,
        })
    }
}
