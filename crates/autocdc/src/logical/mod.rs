//! Logical plan nodes of an update, in plan order:
//!
//! ```text
//!  CdcCommit    one atomic Delta commit of the written files, the flow's
//!     │         metadata and its checkpoint; returns the run's metrics row
//!  CdcWrite     the new state into data and change files; their manifest
//!     │
//!  AutoCdc      sequencing and folding of change events into the new state
//!     │
//!  [Expectations]  (targets with expectations) the events checked
//!     │
//!  [SnapshotDiff]  (snapshot flows) the change events between two snapshots
//! ```

mod auto_cdc;
mod commit;
mod expectations;
mod key_filters;
mod rejects;
mod snapshot_diff;
mod staged_events;
mod write;

pub use auto_cdc::AutoCdcNode;
pub use commit::{CdcCommitNode, UPDATE_RESULT_COLUMNS};
pub use expectations::ExpectationsNode;
pub use key_filters::PushKeyFilters;
pub use rejects::RejectsNode;
pub use snapshot_diff::SnapshotDiffNode;
pub use staged_events::{StagedEventsNode, StagedRole};
pub use write::{CdcWriteNode, WriteRequest};
