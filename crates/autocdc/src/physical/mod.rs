//! Physical operators of an update and the planner hooks that create them.

mod adaptive;
mod auto_cdc_exec;
mod codec;
pub mod commit_exec;
mod conflict_rule;
mod expectations_exec;
mod key_exchange;
pub(crate) mod one_shot;
mod planner;
mod rejects_exec;
mod snapshot_diff_exec;
mod sorted_conflicts;
mod staged_events_exec;
mod target_rows_exec;
mod write_exec;

pub use auto_cdc_exec::AutoCdcExec;
pub use codec::{CdcPhysicalCodec, StoreResolver};
pub use commit_exec::CdcCommitExec;
pub use expectations_exec::ExpectationsExec;
pub use planner::{CdcExtensionPlanner, CdcQueryPlanner};
pub use rejects_exec::RejectsExec;
pub use snapshot_diff_exec::SnapshotDiffExec;
pub use staged_events_exec::StagedEventsExec;
pub use target_rows_exec::{TargetRowsExec, TargetRowsTable};
pub use write_exec::CdcWriteExec;
