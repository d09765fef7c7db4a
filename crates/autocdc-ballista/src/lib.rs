//! Runs datafusion-autocdc updates on an Apache DataFusion Ballista cluster.
//!
//! ```text
//!  client (CdcSession)                        executors
//!  plan update ─► CdcCommitExec               ┌─ stage: scans (sources, stored
//!                   DistributedWriteExec ─────┤    rows as plain Parquet) ─► shuffle by key
//!                     (plan bytes) ──► scheduler
//!                                             └─ stage: AutoCdcExec ─► CdcWriteExec
//!  commit ◄── manifests (one per partition) ◄──── files straight to the warehouse
//! ```
//!
//! * [`open_session`]: a [`CdcSession`](datafusion_autocdc::CdcSession) on a
//!   cluster ([`Cluster::Remote`] `df://HOST:PORT`, or
//!   [`Cluster::Standalone`] in this process). Statements are the same as
//!   everywhere; every update's writing part runs on the cluster.
//! * [`physical_codec`]: the codec of every process (Ballista's + ours).
//! * The binaries `autocdc-scheduler` and `autocdc-executor`: Ballista's
//!   scheduler and executor with that codec and our session options.
//!
//! What runs where: the client reads nothing but what planning needs (the
//! events of a small update, which travel in the plan; the key probe of a
//! small update) and makes the one commit. Plans that cannot travel (a
//! source only the client can read) run on the client, and `EXPLAIN` says
//! so on their `DistributedWriteExec`.

mod cluster;
mod codec;
mod distributed_write;
pub mod process;
mod session;
mod task_count;
mod window_sorts;

pub use cluster::{scheduler_url, start_standalone, Cluster, Standalone, DEFAULT_SCHEDULER_PORT};
pub use codec::physical_codec;
pub use distributed_write::{DistributeWrites, DistributedWriteExec};
pub use session::{open_session, ClusterSession, STANDALONE_VCORES};
pub use task_count::TaskCounts;
