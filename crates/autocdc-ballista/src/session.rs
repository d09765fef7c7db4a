//! A [`CdcSession`] whose updates run on a Ballista cluster.

use std::sync::{Arc, OnceLock};

use ballista_core::extension::SessionConfigExt;
use datafusion::common::Result;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

use crate::cluster::{scheduler_url, start_standalone, Cluster, Standalone};
use crate::codec::physical_codec;
use crate::distributed_write::DistributeWrites;

/// Task slots of each executor of a standalone cluster.
pub const STANDALONE_VCORES: usize = 2;

/// A session running its updates on a cluster.
#[derive(Debug)]
pub struct ClusterSession {
    /// The session: statements, tables, flows as everywhere.
    pub session: CdcSession,
    /// The scheduler's gRPC endpoint.
    pub scheduler: String,
    /// The in-process cluster, when it is one.
    pub standalone: Option<Standalone>,
}

/// Open a session on `config`'s warehouse whose updates run on `cluster`:
/// the client plans each update and commits it; the reads of its sources
/// and stored rows, the fold and the writing of files run on the
/// executors, which must reach the warehouse (a `memory://` warehouse only
/// in a standalone cluster, which shares this process's stores).
pub async fn open_session(config: AutoCdcConfig, cluster: &Cluster) -> Result<ClusterSession> {
    let scheduler = Arc::new(OnceLock::new());
    let session_config = config
        .session_config
        .clone()
        .upgrade_for_ballista()
        .with_ballista_physical_extension_codec(physical_codec())
        // stage shapes as planned here: the write runs one task per fold
        // partition
        .with_ballista_adaptive_query_planner(false)
        .with_ballista_coalesce_enabled(false);
    let config = config
        .with_session_config(session_config)
        .with_physical_optimizer_rule(Arc::new(DistributeWrites::new(Arc::clone(&scheduler))));
    let session = CdcSession::open(config).await?;
    session
        .sql("SET autocdc.plain_parquet_reads = true")
        .await?
        .collect()
        .await?;
    // the stages exchange rows between processes (shuffles), not batches
    session
        .sql("SET autocdc.key_exchange = false")
        .await?
        .collect()
        .await?;
    let (url, standalone) = match cluster {
        Cluster::Remote(url) => (scheduler_url(url)?, None),
        Cluster::Standalone { executors } => {
            let cluster =
                start_standalone(&session.context().state(), *executors, STANDALONE_VCORES).await?;
            (cluster.scheduler.clone(), Some(cluster))
        }
    };
    let _ = scheduler.set(url.clone());
    Ok(ClusterSession {
        session,
        scheduler: url,
        standalone,
    })
}
