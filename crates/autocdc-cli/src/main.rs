//! `autocdc`: an interactive SQL shell for `datafusion-autocdc`.
//!
//! ```text
//! autocdc [--warehouse URL] [--ballista df://HOST:PORT|standalone]
//!         [-c SQL]... [-f FILE]... [--format F] [--maxrows N] [-q]
//! autocdc run [-f DEFS.sql]... [--full-refresh all|t1,t2]
//!             [--continuous [--trigger-interval 5s]] [options as above]
//! ```
//!
//! * `run` updates the pipeline once: the statements of the `-f` files are
//!   its definitions, applied idempotently (tables and flows that exist as
//!   defined are left alone, see `CdcSession::define`), then every
//!   streaming table is updated in dependency order (`REFRESH PIPELINE`) and
//!   its result printed; the exit code is non-zero if a table failed. With
//!   `--continuous` it goes on: each cycle updates the tables with something
//!   new to read (see `CdcSession::update_pipeline`'s `only_changed`: flows
//!   reading their sources whole run in a plain `run` only), prints a
//!   progress line to stderr, and sleeps the interval when nothing was new; a failed cycle is
//!   reported and retried after a growing pause; SIGINT or SIGTERM ends it
//!   after the running update, with exit code 0;
//! * `--ballista` runs every update of the session on an Apache DataFusion
//!   Ballista cluster: `df://HOST:PORT` reaches a running `autocdc-scheduler`,
//!   `standalone` starts a scheduler and two executors in this process (it
//!   prints the tasks each executor ran to stderr at exit);
//! * `-c SQL` runs the statements of a command string;
//! * `-f FILE` runs the statements of a SQL script;
//! * without either, statements are read from standard input: a statement runs once a
//!   line ends it with `;`; `\q` or end of input quits.
//!
//! Statements are separated by `;` outside quotes and comments (see [`split`]).
//! With `-c` / `-f`, the first failing statement stops the run with a non-zero exit
//! code; in the interactive shell errors are printed and the shell carries on.
//! Results are printed as tables (or CSV, TSV, JSON, newline-delimited JSON:
//! `--format`), followed by the row count and the elapsed time (not with
//! `-q`); see [`print`]. `information_schema` is on, as in `datafusion-cli`:
//! `SHOW TABLES`, `SHOW COLUMNS FROM t`, `DESCRIBE t`; and `EXPLAIN` draws
//! plans as trees, as there (`EXPLAIN FORMAT indent …` indents them).

mod print;
mod progress;
mod split;
mod warnings;

use std::io::{self, BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use autocdc_ballista::{open_session, Cluster};
use clap::Parser;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::format::ExplainFormat;
use datafusion::error::{DataFusionError, Result};
use datafusion_autocdc::session::Defined;
use datafusion_autocdc::{AutoCdcConfig, CdcSession, PipelineUpdate, TableStatus, TableUpdate};

use crate::print::{Format, MaxRows, PrintOptions};
use crate::progress::Progress;
use crate::split::{script_statements_in, split_statements_in};

/// Prompt for the first line of a statement.
const PROMPT: &str = "autocdc> ";
/// Prompt for the following lines of a statement.
const CONTINUATION_PROMPT: &str = "     -> ";
/// The shell command that quits the interactive shell.
const QUIT_COMMAND: &str = "\\q";

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "autocdc",
    version,
    about = "SQL shell for DataFusion with AUTO CDC flows"
)]
struct Args {
    /// Run the statements of a SQL script, then exit (may be repeated).
    #[arg(short = 'f', long = "file", value_name = "FILE", global = true)]
    files: Vec<PathBuf>,

    /// Run the statements of a command string, then exit (may be repeated; runs
    /// before any `-f` script).
    #[arg(short = 'c', long = "command", value_name = "SQL")]
    commands: Vec<String>,

    /// Warehouse location: a local folder (created if missing), a `file:///...`
    /// URL, or `memory://` (a warehouse that lives as long as the process).
    #[arg(long, value_name = "URL", default_value = "./warehouse", global = true)]
    warehouse: String,

    /// Run updates on a Ballista cluster: `df://HOST:PORT` (a running
    /// `autocdc-scheduler`) or `standalone` (one started in this process).
    #[arg(long, value_name = "CLUSTER", global = true)]
    ballista: Option<String>,

    /// Output format of results.
    #[arg(long, value_enum, default_value_t = Format::Table, global = true)]
    format: Format,

    /// Rows a result table shows at most (`inf`: all).
    #[arg(long, value_name = "N", default_value = "inf", global = true)]
    maxrows: MaxRows,

    /// Print results only: no row count and elapsed time.
    #[arg(short, long, global = true)]
    quiet: bool,

    #[command(subcommand)]
    command: Option<Subcommand>,
}

/// What to do instead of running statements.
#[derive(Debug, clap::Subcommand)]
enum Subcommand {
    /// Apply the definitions of the `-f` files idempotently, then update
    /// every streaming table once in dependency order.
    Run {
        /// Tables to update from scratch (and every table reading them), or
        /// `all`.
        #[arg(long, value_name = "all|T1,T2")]
        full_refresh: Option<String>,
        /// Keep updating until SIGINT / SIGTERM.
        #[arg(long)]
        continuous: bool,
        /// Pause of a continuous run when nothing was new (`200ms`, `5s`, `1m`).
        #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration)]
        trigger_interval: std::time::Duration,
    },
}

/// The shell: a session and how it prints results.
struct Shell {
    session: CdcSession,
    print: PrintOptions,
}

impl Shell {
    /// Whether the session's dialect now reads `#` as a comment (scripts
    /// are split as it reads them).
    fn hash_comments(&self) -> bool {
        let state = self.session.context().state();
        split::hash_comments(state.config().options().sql_parser.dialect.as_ref())
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if matches!(args.command, Some(Subcommand::Run { .. })) && !args.commands.is_empty() {
        // (clap takes `-c` before the subcommand; `run` reads only `-f`)
        eprintln!(
            "error: `-c` cannot be used with `run`, which applies the definitions of its `-f` files"
        );
        return ExitCode::from(2);
    }

    if let Err(error) = create_local_warehouse(&args.warehouse) {
        eprintln!("Error: cannot create warehouse {}: {error}", args.warehouse);
        return ExitCode::FAILURE;
    }
    warnings::show();
    let mut config = AutoCdcConfig::new(args.warehouse.as_str());
    config.session_config = config.session_config.with_information_schema(true);
    // plans print as boxes, as in datafusion-cli (`SET datafusion.explain.format
    // = 'indent'` or `EXPLAIN FORMAT indent …` prints them indented)
    config.session_config.options_mut().explain.format = ExplainFormat::Tree;
    let opened = match &args.ballista {
        None => CdcSession::open(config).await.map(|s| (s, None)),
        Some(cluster) => match Cluster::parse(cluster) {
            Ok(cluster) => open_session(config, &cluster)
                .await
                .map(|c| (c.session, c.standalone)),
            Err(error) => Err(error),
        },
    };
    let (session, standalone) = match opened {
        Ok(opened) => opened,
        Err(error) => {
            eprintln!("Error: cannot open warehouse {}: {error}", args.warehouse);
            return ExitCode::FAILURE;
        }
    };
    let code = run(args, session).await;
    if let Some(cluster) = standalone {
        let tasks: Vec<String> = cluster
            .tasks
            .snapshot()
            .into_iter()
            .map(|(executor, n)| format!("{executor}={n}"))
            .collect();
        eprintln!(
            "ballista standalone: tasks by executor: {}",
            tasks.join(", ")
        );
    }
    code
}

/// Run the commands and scripts of `args` (or the interactive shell) in `session`.
async fn run(args: Args, session: CdcSession) -> ExitCode {
    let shell = Shell {
        session,
        print: PrintOptions {
            format: args.format,
            max_rows: args.maxrows,
            quiet: args.quiet,
        },
    };
    if let Some(Subcommand::Run {
        full_refresh,
        continuous,
        trigger_interval,
    }) = &args.command
    {
        let run = if *continuous {
            run_continuously(
                &shell,
                &args.files,
                full_refresh.as_deref(),
                *trigger_interval,
            )
            .await
        } else {
            run_pipeline(&shell, &args.files, full_refresh.as_deref()).await
        };
        return match run {
            Ok(code) => code,
            Err(error) => {
                eprintln!("Error: {error}");
                ExitCode::FAILURE
            }
        };
    }
    if args.commands.is_empty() && args.files.is_empty() {
        return interactive(&shell).await;
    }
    for command in &args.commands {
        if let Err(error) = run_script(&shell, command).await {
            eprintln!("Error: {error}");
            return ExitCode::FAILURE;
        }
    }
    for file in &args.files {
        if let Err(error) = run_file(&shell, file).await {
            eprintln!("Error: {error}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Creates the warehouse folder when `warehouse` is a local path (a
/// `file:` URL's folder is created when the warehouse opens: its path is
/// the URL's, decoded).
fn create_local_warehouse(warehouse: &str) -> io::Result<()> {
    match warehouse.starts_with("file:") || warehouse.contains("://") {
        true => Ok(()),
        false if warehouse.is_empty() => Ok(()),
        // (refused when the warehouse opens, before anything is created)
        false
            if std::path::absolute(warehouse).is_ok_and(|path| {
                datafusion_autocdc::table::refused_in_path(&path.to_string_lossy()).is_some()
            }) =>
        {
            Ok(())
        }
        // (a file there is refused when the warehouse opens, naming it)
        false if std::path::Path::new(warehouse).is_file() => Ok(()),
        false => std::fs::create_dir_all(warehouse),
    }
}

/// A table name given on the command line as SQL reads it: each part
/// folded to lower case unless double-quoted (`Users` is `users`, as in
/// `REFRESH PIPELINE FULL (Users)`; `"Users"` is `Users`).
fn sql_name(name: &str) -> String {
    name.trim()
        .split('.')
        .map(
            |part| match part.strip_prefix('"').and_then(|p| p.strip_suffix('"')) {
                Some(quoted) => quoted.to_string(),
                None => part.to_lowercase(),
            },
        )
        .collect::<Vec<_>>()
        .join(".")
}

/// `--trigger-interval`: `200ms`, `5s`, `1m` (a bare number: seconds).
fn duration(text: &str) -> std::result::Result<std::time::Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (200ms, 5s, 1m)"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("'{text}': the unit is ms, s or m")),
    };
    std::time::Duration::try_from_secs_f64(seconds).map_err(|e| format!("'{text}': {e}"))
}

/// Apply the definitions of `files` (see [`CdcSession::define`]); returns
/// the statements that failed, each reported on stderr. A failed definition
/// (a new table whose first update fails, say) is a table that failed: the
/// others still apply and update.
async fn apply_definitions(shell: &Shell, files: &[PathBuf]) -> Result<Vec<String>> {
    let mut statements = Vec::new();
    for path in files {
        let script = read_script(path)?;
        statements.extend(script_statements_in(&script, shell.hash_comments()));
    }
    // the tables the files define, and their flows
    let mut tables = std::collections::BTreeSet::new();
    let mut flows = std::collections::BTreeSet::new();
    for statement in &statements {
        if let Ok((table, flow)) = shell.session.defined_by(statement) {
            tables.extend(table);
            flows.extend(flow);
        }
    }
    let failed = apply_statements(shell, statements).await;
    // a flow taken out of the files still runs: say so
    for (table, flow) in shell.session.flows_besides(&tables, &flows).await? {
        eprintln!(
            "flow '{flow}' of '{table}' is not in the definitions and still runs \
             (DROP FLOW {flow} removes it)"
        );
    }
    Ok(failed)
}

/// Apply `statements` in order; returns those that failed.
async fn apply_statements(shell: &Shell, statements: Vec<String>) -> Vec<String> {
    let mut failed = Vec::new();
    for statement in statements {
        match shell.session.define(&statement).await {
            Ok(Defined::Unchanged(what)) if !shell.print.quiet => {
                eprintln!("{what}: unchanged");
            }
            Ok(_) => {}
            Err(error) => {
                eprintln!("definition failed: {}: {error}", statement_head(&statement));
                failed.push(statement);
            }
        }
    }
    failed
}

/// The first words of a statement, to name it.
fn statement_head(statement: &str) -> String {
    let words: Vec<&str> = statement.split_whitespace().take(6).collect();
    let head = words.join(" ");
    match statement.split_whitespace().count() > words.len() {
        true => format!("{head} …"),
        false => head,
    }
}

/// One pipeline update of `session`.
async fn update_once(
    session: &CdcSession,
    full_refresh: Option<&str>,
    only_changed: bool,
) -> Result<PipelineUpdate> {
    let mut update = session.update_pipeline().only_changed(only_changed);
    match full_refresh {
        None => {}
        Some(all) if all.trim().eq_ignore_ascii_case("all") => update = update.full_refresh_all(),
        Some(tables) => update = update.full_refresh(tables.split(',').map(sql_name))?,
    }
    update.await
}

/// `autocdc run`: apply the definitions of `files`, then one pipeline update;
/// a failure exit code when a table failed or was skipped.
async fn run_pipeline(
    shell: &Shell,
    files: &[PathBuf],
    full_refresh: Option<&str>,
) -> Result<ExitCode> {
    let failed = apply_definitions(shell, files).await?;
    let start = Instant::now();
    let update = update_once(&shell.session, full_refresh, false).await?;
    let result = pipeline_batch(&update)?;
    shell.print.print(
        &mut io::stdout().lock(),
        &result.schema(),
        std::slice::from_ref(&result),
        start.elapsed(),
    )?;
    let ok = failed.is_empty()
        && update
            .tables
            .iter()
            .all(|t| t.status == TableStatus::Updated);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `autocdc run --continuous`: the definitions, then pipeline updates until
/// SIGINT or SIGTERM (see the module docs).
async fn run_continuously(
    shell: &Shell,
    files: &[PathBuf],
    full_refresh: Option<&str>,
    interval: std::time::Duration,
) -> Result<ExitCode> {
    // the handlers are installed before any work, so a signal that arrives
    // while the definitions run stops the run instead of killing the process
    let signals = StopSignals::install()?;
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (stop, stopping) = (Arc::clone(&stop), Arc::clone(&stopping));
        tokio::spawn(async move {
            signals.received().await;
            stopping.store(true, std::sync::atomic::Ordering::SeqCst);
            stop.notify_one();
        });
    }
    let mut failed_definitions = apply_definitions(shell, files).await?;
    let mut backoff = interval;
    for cycle in 1u64.. {
        let start = Instant::now();
        // definitions that failed are tried again every cycle
        if cycle > 1 && !failed_definitions.is_empty() {
            failed_definitions = apply_statements(shell, failed_definitions).await;
        }
        let definitions_failing = !failed_definitions.is_empty();
        // every cycle updates what has something new to read; the first
        // also what --full-refresh names, from scratch
        let first = cycle == 1;
        let full = if first { full_refresh } else { None };
        let pause = match update_once(&shell.session, full, true).await {
            Ok(update) => {
                let updated: Vec<&TableUpdate> = update
                    .tables
                    .iter()
                    .filter(|t| t.status != TableStatus::Unchanged)
                    .collect();
                if !updated.is_empty() || first {
                    let rows: i64 = updated
                        .iter()
                        .flat_map(|t| &t.runs)
                        .map(|r| r.num_upserted_rows + r.num_deleted_rows)
                        .sum();
                    let failed: Vec<String> = updated
                        .iter()
                        .filter(|t| !matches!(t.status, TableStatus::Updated))
                        .map(|t| format!("{} {}", t.table, t.status.name()))
                        .collect();
                    eprintln!(
                        "cycle {cycle}: {} table(s) updated, {rows} row(s) changed, {} ms{}",
                        updated.len() - failed.len(),
                        start.elapsed().as_millis(),
                        if failed.is_empty() {
                            String::new()
                        } else {
                            format!("; {}", failed.join(", "))
                        }
                    );
                    // why each failed or was skipped
                    for table in updated
                        .iter()
                        .filter(|t| !matches!(t.status, TableStatus::Updated))
                    {
                        if let Some(message) = &table.message {
                            eprintln!("  {} {}: {message}", table.table, table.status.name());
                        }
                    }
                }
                let progressed = updated
                    .iter()
                    .any(|t| matches!(t.status, TableStatus::Updated));
                if progressed || (updated.is_empty() && !definitions_failing) {
                    backoff = interval;
                }
                match (progressed, updated.is_empty() && !definitions_failing) {
                    // go again at once while there is work
                    (true, _) => std::time::Duration::ZERO,
                    (false, true) => interval,
                    // only failures: retried after a pause that doubles
                    // (at once, a table that keeps failing would spin)
                    (false, false) => {
                        let pause = backoff;
                        backoff = (backoff * 2).min(std::time::Duration::from_secs(60));
                        pause
                    }
                }
            }
            Err(error) => {
                eprintln!("cycle {cycle} failed: {error}; retrying in {backoff:?}");
                let pause = backoff;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(60));
                pause
            }
        };
        if stopping.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.notified() => break,
        }
    }
    eprintln!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// SIGINT and SIGTERM handlers, installed when created.
struct StopSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Resolves at the first SIGINT or SIGTERM.
    async fn received(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        {
            let _ = &mut self;
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// One row per table of `update`.
fn pipeline_batch(update: &PipelineUpdate) -> Result<RecordBatch> {
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(vec![
        Field::new("table", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("num_upserted_rows", DataType::Int64, false),
        Field::new("num_deleted_rows", DataType::Int64, false),
        Field::new("message", DataType::Utf8, true),
    ]));
    let tables = &update.tables;
    let sum = |f: fn(&datafusion_autocdc::api::UpdateMetrics) -> i64| {
        Int64Array::from_iter_values(tables.iter().map(|t| t.runs.iter().map(f).sum::<i64>()))
    };
    Ok(RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(
                tables.iter().map(|t| t.table.to_string()),
            )),
            Arc::new(StringArray::from_iter_values(
                tables.iter().map(|t| t.status.name()),
            )),
            Arc::new(sum(|r| r.num_upserted_rows)),
            Arc::new(sum(|r| r.num_deleted_rows)),
            Arc::new(StringArray::from_iter(
                tables.iter().map(|t| t.message.as_deref()),
            )),
        ],
    )?)
}

/// Runs the statements of the SQL script at `path`, stopping at the first error.
async fn run_file(shell: &Shell, path: &Path) -> Result<()> {
    let script = read_script(path)?;
    run_script(shell, &script).await
}

/// The text of the script at `path`, without the byte order mark some
/// editors write first (the parser would take it for a statement).
fn read_script(path: &Path) -> Result<String> {
    let script = std::fs::read_to_string(path).map_err(|error| {
        DataFusionError::Execution(format!("cannot read {}: {error}", path.display()))
    })?;
    Ok(match script.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => script,
    })
}

/// Runs the statements of `script` in order, stopping at the first error;
/// each next statement is found as the session's dialect then reads the
/// text (a `SET` of the dialect changes what a comment is).
async fn run_script(shell: &Shell, script: &str) -> Result<()> {
    let mut rest = script;
    loop {
        let split = split_statements_in(rest, shell.hash_comments());
        let (Some(statement), Some(&end)) = (split.statements.first(), split.ends.first()) else {
            if split.open_comment {
                return Err(DataFusionError::Plan(
                    "the script ends inside a /* */ comment that is not closed".into(),
                ));
            }
            if let Some(last) = split.pending.filter(|sql| !sql.is_empty()) {
                run_statement(shell, &last).await?;
            }
            return Ok(());
        };
        run_statement(shell, statement).await?;
        rest = &rest[end..];
    }
}

/// Reads statements from standard input and runs them until `\q` or end of input.
async fn interactive(shell: &Shell) -> ExitCode {
    let stdin = io::stdin();
    let show_prompt = stdin.is_terminal();
    let mut buffer = String::new();
    let mut line = String::new();
    loop {
        if show_prompt {
            let prompt = if buffer.is_empty() {
                PROMPT
            } else {
                CONTINUATION_PROMPT
            };
            print!("{prompt}");
            // A prompt that cannot be shown is not worth stopping for.
            let _ = io::stdout().flush();
        }
        line.clear();
        match stdin.lock().read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                eprintln!("Error: cannot read input: {error}");
                return ExitCode::FAILURE;
            }
        }
        // (inside an open string, `\q` is part of it)
        if line.trim() == QUIT_COMMAND && !split_statements_in(&buffer, shell.hash_comments()).open
        {
            return ExitCode::SUCCESS;
        }

        buffer.push_str(&line);
        let split = split_statements_in(&buffer, shell.hash_comments());
        for statement in &split.statements {
            if let Err(error) = run_statement(shell, statement).await {
                eprintln!("Error: {error}");
            }
        }
        if split.pending.is_some() {
            // The next statement goes on on the next line: keep its text verbatim.
            buffer.drain(..split.rest);
        } else {
            buffer.clear();
        }
    }

    // End of input: run what is left even without its `;`.
    if show_prompt {
        println!();
    }
    if let Some(statement) = split_statements_in(&buffer, shell.hash_comments()).pending {
        if let Err(error) = run_statement(shell, &statement).await {
            eprintln!("Error: {error}");
        }
    }
    ExitCode::SUCCESS
}

/// Runs one statement and prints its result.
async fn run_statement(shell: &Shell, sql: &str) -> Result<()> {
    let start = Instant::now();
    let progress = Progress::start(start);
    let result = execute(&shell.session, sql).await;
    progress.finish().await;
    let (schema, batches) = result?;
    shell
        .print
        .print(&mut io::stdout().lock(), &schema, &batches, start.elapsed())
}

/// Runs `sql` and collects its result.
async fn execute(session: &CdcSession, sql: &str) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let frame = session.sql(sql).await?;
    let schema = Arc::clone(frame.schema().inner());
    let batches = frame.collect().await?;
    Ok((schema, batches))
}
