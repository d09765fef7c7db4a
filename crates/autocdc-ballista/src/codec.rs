//! The physical codec every process of a cluster uses: Ballista's own
//! (shuffles, its operators) composed with ours (`AutoCdcExec`,
//! `SnapshotDiffExec`, `CdcWriteExec`, `StoredFilesExec`).
//!
//! The order is part of the wire format (a node is tagged with the position
//! of the codec that encoded it): client, scheduler and executors must use
//! this same function.

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion_autocdc::physical::CdcPhysicalCodec;
use datafusion_proto::physical_plan::{ComposedPhysicalExtensionCodec, PhysicalExtensionCodec};

/// Ballista's physical codec, then [`CdcPhysicalCodec`].
pub fn physical_codec() -> Arc<dyn PhysicalExtensionCodec> {
    Arc::new(ComposedPhysicalExtensionCodec::new(vec![
        Arc::new(BallistaPhysicalExtensionCodec::default()),
        Arc::new(CdcPhysicalCodec::new()),
    ]))
}
