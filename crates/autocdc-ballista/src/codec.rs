//! The physical codec every process of a cluster uses: ours (`AutoCdcExec`,
//! `SnapshotDiffExec`, `CdcWriteExec`, `StoredFilesExec`, and our scalar
//! functions) composed with Ballista's own (shuffles, its operators).
//!
//! The order is part of the wire format (a node is tagged with the position
//! of the codec that encoded it): client, scheduler and executors must use
//! this same function. Ours comes first: a scalar function is looked up by
//! name where it is decoded only when the first codec encodes it as
//! nothing, which ours does for every function but its own (which it ships
//! by name).

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion_autocdc::physical::CdcPhysicalCodec;
use datafusion_proto::physical_plan::{ComposedPhysicalExtensionCodec, PhysicalExtensionCodec};

/// [`CdcPhysicalCodec`], then Ballista's physical codec.
pub fn physical_codec() -> Arc<dyn PhysicalExtensionCodec> {
    Arc::new(ComposedPhysicalExtensionCodec::new(vec![
        Arc::new(CdcPhysicalCodec::new()),
        Arc::new(BallistaPhysicalExtensionCodec::default()),
    ]))
}
