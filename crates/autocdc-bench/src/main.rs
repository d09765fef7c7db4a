//! `autocdc-datagen`: writes benchmark data as Parquet.
//!
//! ```text
//! autocdc-datagen events --out events.parquet [--events N] [--keys K] ...
//! autocdc-datagen snapshots --out-dir DIR [--rows N] [--changed F] ...
//! autocdc-datagen debezium --out-dir DIR [--events N] [--keys K] [--files F] ...
//! ```
//!
//! `events` writes one change feed (see [`EventsConfig`]); `snapshots` writes
//! `DIR/snapshot_1.parquet` and `DIR/snapshot_2.parquet` (see
//! [`SnapshotsConfig`]); `debezium` writes Debezium JSON change events as
//! `DIR/part-00000.json` ... (see [`DebeziumConfig`]). Each prints a one-line
//! summary of what it wrote.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use autocdc_bench::{
    write_debezium, write_events, write_snapshots, DebeziumConfig, EventsConfig, SnapshotsConfig,
    ValueColumns, DEFAULT_BATCH_ROWS, DEFAULT_ROW_GROUP_ROWS,
};
use clap::{Args, Parser, Subcommand};

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "autocdc-datagen",
    version,
    about = "Writes CDC event streams and snapshot pairs as Parquet, and Debezium JSON \
             change events, for benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A change feed: id, seq, op ('U' / 'D') and value columns.
    Events(EventsArgs),
    /// Two snapshots of a table, the second with rows changed, deleted and inserted.
    Snapshots(SnapshotsArgs),
    /// Debezium JSON change events (PostgreSQL connector), JSON Lines in F files.
    Debezium(DebeziumArgs),
}

/// Options of both generators.
#[derive(Debug, Args)]
struct Common {
    /// BIGINT value columns (i1, i2, ...).
    #[arg(long, default_value_t = 2)]
    int_columns: usize,
    /// STRING value columns (s1, s2, ...).
    #[arg(long, default_value_t = 2)]
    string_columns: usize,
    /// DOUBLE value columns (d1, ...).
    #[arg(long, default_value_t = 1)]
    double_columns: usize,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Rows per Parquet row group.
    #[arg(long, default_value_t = DEFAULT_ROW_GROUP_ROWS)]
    row_group_rows: usize,
    /// Rows per Arrow batch handed to the writer.
    #[arg(long, default_value_t = DEFAULT_BATCH_ROWS)]
    batch_rows: usize,
}

impl Common {
    fn columns(&self) -> ValueColumns {
        ValueColumns {
            ints: self.int_columns,
            strings: self.string_columns,
            doubles: self.double_columns,
        }
    }
}

#[derive(Debug, Args)]
struct EventsArgs {
    /// Output Parquet file.
    #[arg(long)]
    out: PathBuf,
    /// Rows written, replays included.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Keys, drawn uniformly from 0..KEYS.
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// Share of events that are deletes.
    #[arg(long, default_value_t = 0.05)]
    delete_fraction: f64,
    /// Share of events written late (out of order).
    #[arg(long, default_value_t = 0.05)]
    late_fraction: f64,
    /// How many rows after its place a late event may come [default: KEYS, about
    /// the distance between two events of one key].
    #[arg(long)]
    max_delay: Option<u64>,
    /// Share of rows that replay (duplicate) a recent row.
    #[arg(long, default_value_t = 0.01)]
    replay_fraction: f64,
    /// How many recent rows a replay picks from.
    #[arg(long, default_value_t = 65_536)]
    replay_window: usize,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct SnapshotsArgs {
    /// Output folder (created if missing) for snapshot_1.parquet and snapshot_2.parquet.
    #[arg(long)]
    out_dir: PathBuf,
    /// Rows of the first snapshot.
    #[arg(long, default_value_t = 2_000_000)]
    rows: u64,
    /// Share of rows changed in the second snapshot.
    #[arg(long, default_value_t = 0.01)]
    changed_fraction: f64,
    /// Share of rows deleted in the second snapshot.
    #[arg(long, default_value_t = 0.005)]
    deleted_fraction: f64,
    /// Rows inserted in the second snapshot, as a share of ROWS.
    #[arg(long, default_value_t = 0.005)]
    inserted_fraction: f64,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct DebeziumArgs {
    /// Output folder (created if missing; part-*.json files in it are replaced).
    #[arg(long)]
    out_dir: PathBuf,
    /// Change events after the snapshot (which reads KEYS / 2 keys).
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Keys 0..KEYS (column id).
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// Files part-00000.json ...: contiguous chunks of the history, named in a
    /// shuffled order.
    #[arg(long, default_value_t = 16)]
    files: usize,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Write the payload alone, not {"schema": ..., "payload": ...}.
    #[arg(long)]
    no_schema: bool,
    /// Share of change events that change a live key's primary key to a free one.
    #[arg(long, default_value_t = 0.0)]
    key_changes: f64,
    /// Share of change events that delete a live key.
    #[arg(long, default_value_t = 0.05)]
    deletes: f64,
    /// Share of change events that create a key not live (the rest are updates).
    #[arg(long, default_value_t = 0.05)]
    creates: f64,
    /// Write a tombstone line (`null`) after each delete.
    #[arg(long)]
    tombstones: bool,
}

fn main() -> ExitCode {
    let started = Instant::now();
    let result = match Cli::parse().command {
        Command::Events(args) => events(args),
        Command::Snapshots(args) => snapshots(args),
        Command::Debezium(args) => debezium(args),
    };
    match result {
        Ok(summary) => {
            println!("{summary} in {:.1} s", started.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("Error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Creates `path` for writing, naming it in the error.
fn create(path: &Path) -> Result<File, String> {
    File::create(path).map_err(|error| format!("cannot create {}: {error}", path.display()))
}

fn events(args: EventsArgs) -> Result<String, String> {
    let config = EventsConfig {
        events: args.events,
        keys: args.keys,
        delete_fraction: args.delete_fraction,
        late_fraction: args.late_fraction,
        max_delay: args.max_delay.unwrap_or(args.keys.max(1)),
        replay_fraction: args.replay_fraction,
        replay_window: args.replay_window,
        columns: args.common.columns(),
        seed: args.common.seed,
        batch_rows: args.common.batch_rows,
        row_group_rows: args.common.row_group_rows,
    };
    config.validate().map_err(|error| error.to_string())?;
    let file = create(&args.out)?;
    let s = write_events(&config, file)
        .map_err(|error| format!("writing {}: {error}", args.out.display()))?;
    Ok(format!(
        "{}: {} rows ({} fresh events of which {} deletes and {} late, {} replays; \
         at most {} late events held)",
        args.out.display(),
        s.rows,
        s.fresh,
        s.deletes,
        s.late,
        s.replays,
        s.max_pending
    ))
}

fn snapshots(args: SnapshotsArgs) -> Result<String, String> {
    let config = SnapshotsConfig {
        rows: args.rows,
        changed_fraction: args.changed_fraction,
        deleted_fraction: args.deleted_fraction,
        inserted_fraction: args.inserted_fraction,
        columns: args.common.columns(),
        seed: args.common.seed,
        batch_rows: args.common.batch_rows,
        row_group_rows: args.common.row_group_rows,
    };
    config.validate().map_err(|error| error.to_string())?;
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|error| format!("cannot create {}: {error}", args.out_dir.display()))?;
    let first_path = args.out_dir.join("snapshot_1.parquet");
    let second_path = args.out_dir.join("snapshot_2.parquet");
    let s = write_snapshots(&config, create(&first_path)?, create(&second_path)?)
        .map_err(|error| format!("writing {}: {error}", args.out_dir.display()))?;
    Ok(format!(
        "{}: {} rows, {}: {} rows ({} changed, {} deleted, {} inserted)",
        first_path.display(),
        s.first_rows,
        second_path.display(),
        s.second_rows,
        s.changed,
        s.deleted,
        s.inserted
    ))
}

fn debezium(args: DebeziumArgs) -> Result<String, String> {
    let config = DebeziumConfig {
        events: args.events,
        keys: args.keys,
        files: args.files,
        with_schema: !args.no_schema,
        delete_fraction: args.deletes,
        key_change_fraction: args.key_changes,
        create_fraction: args.creates,
        tombstones: args.tombstones,
        seed: args.seed,
    };
    config.validate().map_err(|error| error.to_string())?;
    let s = write_debezium(&config, &args.out_dir)
        .map_err(|error| format!("writing {}: {error}", args.out_dir.display()))?;
    Ok(format!(
        "{}: {} lines in {} files, {:.1} MB ({} snapshot reads, {} creates, {} updates, \
         {} key changes, {} deletes, {} tombstones; {} keys live at the end)",
        args.out_dir.display(),
        s.lines,
        s.files,
        s.bytes as f64 / 1e6,
        s.reads,
        s.creates,
        s.updates,
        s.key_changes,
        s.deletes,
        s.tombstones,
        s.live_keys
    ))
}
