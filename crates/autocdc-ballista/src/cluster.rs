//! Where updates run: a Ballista cluster reached at its scheduler, or one
//! started in this process (a scheduler and executors on loopback ports).

use std::path::Path;
use std::sync::Arc;

use arrow_flight::flight_service_server::FlightServiceServer;
use ballista_core::extension::SessionConfigExt;
use ballista_core::ids::new_instance_id;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::ExecutorRegistration;
use ballista_core::serde::scheduler::{
    ExecutorOperatingSystemSpecification, ExecutorSpecification,
};
use ballista_core::serde::BallistaCodec;
use ballista_core::utils::{create_grpc_server, GrpcServerConfig};
use ballista_core::{ConfigProducer, RuntimeProducer, BALLISTA_PROTOCOL_VERSION};
use ballista_executor::executor::Executor;
use ballista_executor::flight_service::BallistaFlightService;
use ballista_executor::metrics::LoggingMetricsCollector;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SessionState;
use tokio::net::TcpListener;
use url::Url;

use crate::task_count::{CountingEngine, TaskCounts};

/// Scheduler port when a `df://` URL names none (Ballista's default).
pub const DEFAULT_SCHEDULER_PORT: u16 = 50050;

/// The cluster a session runs its updates on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cluster {
    /// A running cluster: its scheduler's `df://HOST[:PORT]` URL.
    Remote(String),
    /// A scheduler and this many executors started in this process.
    Standalone { executors: usize },
}

impl Cluster {
    /// `standalone` (two executors) or a `df://HOST[:PORT]` URL.
    pub fn parse(text: &str) -> Result<Self> {
        if text == "standalone" {
            return Ok(Self::Standalone { executors: 2 });
        }
        scheduler_url(text)?;
        Ok(Self::Remote(text.to_string()))
    }
}

/// The gRPC endpoint (`http://host:port`) of the scheduler at `df://host[:port]`.
pub fn scheduler_url(text: &str) -> Result<String> {
    let refuse = |why: &str| {
        DataFusionError::Configuration(format!(
            "--ballista '{text}': {why}; expected 'standalone' or df://HOST[:PORT]"
        ))
    };
    let url = Url::parse(text).map_err(|e| refuse(&e.to_string()))?;
    if url.scheme() != "df" {
        return Err(refuse(&format!("scheme '{}'", url.scheme())));
    }
    let host = url.host_str().ok_or_else(|| refuse("no host"))?;
    let port = url.port().unwrap_or(DEFAULT_SCHEDULER_PORT);
    Ok(format!("http://{host}:{port}"))
}

/// A cluster started in this process (see [`start_standalone`]).
#[derive(Debug, Clone)]
pub struct Standalone {
    /// The scheduler's gRPC endpoint.
    pub scheduler: String,
    /// Tasks each executor ran.
    pub tasks: TaskCounts,
    /// The executors' work folders (shuffle files), removed with the last
    /// handle on the cluster.
    work_dirs: Vec<Arc<tempfile::TempDir>>,
}

impl Standalone {
    /// The executors' work folders (their shuffle files).
    pub fn work_dirs(&self) -> Vec<&Path> {
        self.work_dirs.iter().map(|d| d.path()).collect()
    }
}

/// Start a scheduler and `executors` executors in this process, each with
/// `vcores` task slots, planning and running with `state` (its config must
/// carry the cluster's codecs; its runtime, so its object stores, is
/// shared with the executors).
pub async fn start_standalone(
    state: &SessionState,
    executors: usize,
    vcores: usize,
) -> Result<Standalone> {
    let to_df = |e: ballista_core::error::BallistaError| DataFusionError::External(Box::new(e));
    let address = ballista_scheduler::standalone::new_standalone_scheduler_from_state(state)
        .await
        .map_err(to_df)?;
    let scheduler = format!("http://localhost:{}", address.port());
    let tasks = TaskCounts::default();
    let mut work_dirs = Vec::new();
    for _ in 0..executors.max(1) {
        let client = loop {
            match SchedulerGrpcClient::connect(scheduler.clone()).await {
                // (in one process a message is not bounded by a network: a
                // task whose plan holds an in-memory table of more than
                // tonic's default 4 MiB would never reach the executor,
                // and its job would wait for ever)
                Ok(client) => {
                    break client
                        .max_decoding_message_size(usize::MAX)
                        .max_encoding_message_size(usize::MAX)
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        };
        let work_dir = Arc::new(
            tempfile::Builder::new()
                .prefix("autocdc-executor-")
                .tempdir()?,
        );
        start_executor(client, state, vcores, tasks.clone(), &work_dir).await?;
        work_dirs.push(work_dir);
    }
    Ok(Standalone {
        scheduler,
        tasks,
        work_dirs,
    })
}

/// One in-process executor polling `scheduler` for tasks.
async fn start_executor(
    scheduler: SchedulerGrpcClient<tonic::transport::Channel>,
    state: &SessionState,
    vcores: usize,
    tasks: TaskCounts,
    work_dir: &tempfile::TempDir,
) -> Result<()> {
    let listener = TcpListener::bind("localhost:0").await?;
    let port = listener.local_addr()?.port();
    let id = new_instance_id();
    let registration = ExecutorRegistration {
        id: id.clone(),
        host: Some("localhost".to_string()),
        port: port as u32,
        grpc_port: 0,
        specification: Some(
            ExecutorSpecification::default()
                .with_vcores(vcores as u32)
                .into(),
        ),
        os_info: Some(ExecutorOperatingSystemSpecification::default().into()),
        ballista_protocol_version: BALLISTA_PROTOCOL_VERSION,
    };
    let config = state.config().clone().upgrade_for_ballista();
    let runtime = Arc::clone(state.runtime_env());
    let config_producer: ConfigProducer = Arc::new(move || config.clone());
    let runtime_producer: RuntimeProducer = Arc::new(move |_| Ok(Arc::clone(&runtime)));
    let work_dir = work_dir.path().to_string_lossy().to_string();
    let executor = Arc::new(Executor::new(
        registration,
        &work_dir,
        runtime_producer,
        config_producer,
        Arc::new(state.into()),
        Arc::new(LoggingMetricsCollector::default()),
        vcores,
        Arc::new(CountingEngine::new(id, tasks, false)),
    ));
    let max_message = state.config().ballista_grpc_client_max_message_size();
    let flight = FlightServiceServer::new(BallistaFlightService::new(work_dir))
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
    tokio::spawn(
        create_grpc_server(&GrpcServerConfig::default())
            .add_service(flight)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let codec: BallistaCodec = BallistaCodec::new(
        state.config().ballista_logical_extension_codec(),
        state.config().ballista_physical_extension_codec(),
    );
    tokio::spawn(ballista_executor::execution_loop::poll_loop(
        scheduler,
        executor,
        codec,
        None,
        None,
        ballista_executor::health::ExecutorHealth::new(),
    ));
    Ok(())
}
