//! The scheduler and executor processes: Ballista's, with our codec and
//! session options (what the `autocdc-scheduler` and `autocdc-executor`
//! binaries run).

use std::net::SocketAddr;
use std::sync::Arc;

use ballista_core::extension::SessionConfigExt;
use ballista_core::ids::new_instance_id;
use ballista_core::ConfigProducer;
use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::common::{DataFusionError, Result};
use datafusion::prelude::SessionConfig;
use datafusion_autocdc::config::with_autocdc_options;

use crate::codec::physical_codec;
use crate::task_count::{CountingEngine, TaskCounts};

/// Session configuration of every process: Ballista's, our codec, the
/// `autocdc.*` options (a job carries the client's settings of them).
pub fn config_producer() -> ConfigProducer {
    Arc::new(|| {
        with_autocdc_options(
            SessionConfig::new_with_ballista()
                .with_ballista_physical_extension_codec(physical_codec()),
        )
    })
}

fn ballista_err(e: ballista_core::error::BallistaError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Where a scheduler listens.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    pub bind_host: String,
    pub bind_port: u16,
    /// The host executors and clients are told to use for it.
    pub external_host: String,
}

/// Run a scheduler until the process ends.
pub async fn run_scheduler(options: SchedulerOptions) -> Result<()> {
    let address: SocketAddr = format!("{}:{}", options.bind_host, options.bind_port)
        .parse()
        .map_err(|e| DataFusionError::Configuration(format!("scheduler address: {e}")))?;
    let config = SchedulerConfig {
        bind_host: options.bind_host,
        bind_port: options.bind_port,
        external_host: options.external_host,
        override_physical_codec: Some(physical_codec()),
        ..SchedulerConfig::default()
    }
    .with_override_config_producer(config_producer());
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(ballista_err)?;
    start_server(cluster, address, Arc::new(config))
        .await
        .map_err(ballista_err)
}

/// Where an executor listens and which scheduler it serves.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    pub bind_host: String,
    /// Arrow Flight port (results and shuffles are fetched from it).
    pub bind_port: u16,
    /// gRPC port (tasks pushed by the scheduler).
    pub bind_grpc_port: u16,
    /// The host the scheduler and other executors are told to use.
    pub external_host: Option<String>,
    pub scheduler_host: String,
    pub scheduler_port: u16,
    /// Tasks run at once.
    pub concurrent_tasks: usize,
    /// Where shuffle files go (a temporary folder when `None`).
    pub work_dir: Option<String>,
}

/// Run an executor until the process ends; each task it is given is
/// written to stderr (`autocdc-executor <id>: task <job>/<stage>/<task>`).
pub async fn run_executor(options: ExecutorOptions) -> Result<()> {
    let id = new_instance_id();
    let engine = CountingEngine::new(id.clone(), TaskCounts::default(), true);
    let config = ExecutorProcessConfig {
        executor_id: id,
        bind_host: options.bind_host,
        external_host: options.external_host,
        port: options.bind_port,
        grpc_port: options.bind_grpc_port,
        scheduler_host: options.scheduler_host,
        scheduler_port: options.scheduler_port,
        vcores: options.concurrent_tasks.max(1),
        work_dir: options.work_dir,
        override_physical_codec: Some(physical_codec()),
        override_config_producer: Some(config_producer()),
        override_execution_engine: Some(Arc::new(engine)),
        ..ExecutorProcessConfig::default()
    };
    start_executor_process(Arc::new(config))
        .await
        .map_err(ballista_err)
}
