//! Logical plan nodes of an update: [`AutoCdcNode`] (sequencing and folding of
//! change events into the new target state) and [`CdcCommitNode`] (one atomic
//! Delta commit of that state plus the flow checkpoint).

mod auto_cdc;
mod commit;
mod snapshot_diff;

pub use auto_cdc::AutoCdcNode;
pub use commit::{CdcCommitNode, UPDATE_RESULT_COLUMNS};
pub use snapshot_diff::SnapshotDiffNode;
