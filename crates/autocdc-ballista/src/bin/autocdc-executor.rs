//! `autocdc-executor`: a Ballista executor for datafusion-autocdc updates.

use clap::Parser;

use autocdc_ballista::process::{run_executor, ExecutorOptions};
use autocdc_ballista::DEFAULT_SCHEDULER_PORT;

/// A Ballista executor that runs datafusion-autocdc updates. Several can
/// run on one host with distinct ports and work folders.
#[derive(Debug, Parser)]
#[command(name = "autocdc-executor", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_host: String,
    /// Arrow Flight port (results and shuffle files are fetched from it).
    #[arg(long, default_value_t = 50051)]
    bind_port: u16,
    /// gRPC port (tasks pushed by the scheduler).
    #[arg(long, default_value_t = 50052)]
    bind_grpc_port: u16,
    /// Host name the scheduler and other executors are told to use (default: the bind host).
    #[arg(long)]
    external_host: Option<String>,
    /// The scheduler's host.
    #[arg(long, default_value = "127.0.0.1")]
    scheduler_host: String,
    /// The scheduler's port.
    #[arg(long, default_value_t = DEFAULT_SCHEDULER_PORT)]
    scheduler_port: u16,
    /// Tasks run at once (default: the machine's cores).
    #[arg(long)]
    concurrent_tasks: Option<usize>,
    /// Folder for shuffle files (default: a new temporary folder).
    #[arg(long)]
    work_dir: Option<String>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let options = ExecutorOptions {
        external_host: Some(args.external_host.unwrap_or_else(|| args.bind_host.clone())),
        bind_host: args.bind_host,
        bind_port: args.bind_port,
        bind_grpc_port: args.bind_grpc_port,
        scheduler_host: args.scheduler_host,
        scheduler_port: args.scheduler_port,
        concurrent_tasks: args
            .concurrent_tasks
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        work_dir: args.work_dir,
    };
    eprintln!(
        "autocdc-executor: flight {}:{}, scheduler {}:{}",
        options.bind_host, options.bind_port, options.scheduler_host, options.scheduler_port
    );
    if let Err(e) = run_executor(options).await {
        eprintln!("autocdc-executor: {e}");
        std::process::exit(1);
    }
}
