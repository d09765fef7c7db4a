//! `autocdc-scheduler`: a Ballista scheduler for datafusion-autocdc updates.

use clap::Parser;

use autocdc_ballista::process::{run_scheduler, SchedulerOptions};
use autocdc_ballista::DEFAULT_SCHEDULER_PORT;

/// A Ballista scheduler that plans datafusion-autocdc updates.
#[derive(Debug, Parser)]
#[command(name = "autocdc-scheduler", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_host: String,
    /// Port to listen on (gRPC: clients and executors).
    #[arg(long, default_value_t = DEFAULT_SCHEDULER_PORT)]
    bind_port: u16,
    /// Host name executors and clients are told to use (default: the bind host).
    #[arg(long)]
    external_host: Option<String>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let options = SchedulerOptions {
        external_host: args.external_host.unwrap_or_else(|| args.bind_host.clone()),
        bind_host: args.bind_host,
        bind_port: args.bind_port,
    };
    eprintln!(
        "autocdc-scheduler: listening on {}:{}",
        options.bind_host, options.bind_port
    );
    if let Err(e) = run_scheduler(options).await {
        eprintln!("autocdc-scheduler: {e}");
        std::process::exit(1);
    }
}
