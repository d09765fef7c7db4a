//! AUTO CDC FROM SNAPSHOT with the Rust closure API: full snapshots arrive as
//! CSV files `snapshot_<n>.csv`; a `next_snapshot_and_version` function picks
//! the next one after the last processed version, and the flow diffs each
//! against the target and keeps SCD type 2 history.
//!
//! ```text
//! cargo run -p datafusion-autocdc --example snapshot
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::csv::ReaderBuilder;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::print_batches;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{DataFrame, SessionContext};
use datafusion_autocdc::{AutoCdcConfig, CdcSession, ScdType};

/// The `snapshot_<n>.csv` files of `dir`, by version.
fn snapshot_files(dir: &Path) -> Result<Vec<(i64, PathBuf)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if let Some(n) = name
            .strip_prefix("snapshot_")
            .and_then(|n| n.strip_suffix(".csv"))
        {
            if let Ok(version) = n.parse::<i64>() {
                files.push((version, path));
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Read one snapshot file into a DataFrame.
fn read_snapshot(ctx: &SessionContext, path: &Path) -> Result<DataFrame> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("userId", DataType::Int64, false),
        Field::new("city", DataType::Utf8, true),
    ]));
    let reader = ReaderBuilder::new(Arc::clone(&schema))
        .with_header(true)
        .build(File::open(path)?)?;
    let batches = reader.collect::<std::result::Result<Vec<RecordBatch>, _>>()?;
    let batch = datafusion::arrow::compute::concat_batches(&schema, &batches)?;
    ctx.read_batch(batch)
}

/// Write the documented example snapshots into `dir`, then process them into
/// an SCD 2 target on `warehouse`; returns the target's rows.
pub async fn run(warehouse: &str, dir: &Path) -> Result<Vec<RecordBatch>> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("snapshot_1.csv"),
        "userId,city\n1,Oaxaca\n2,Monterrey\n3,Tijuana\n",
    )?;
    std::fs::write(
        dir.join("snapshot_2.csv"),
        "userId,city\n2,Carmel\n3,Los Angeles\n4,Death Valley\n6,Kings Canyon\n",
    )?;

    let session = CdcSession::open(AutoCdcConfig::new(warehouse)).await?;
    session.sql("DROP STREAMING TABLE IF EXISTS users").await?;
    session.create_streaming_table("users").await?;

    let ctx = session.context().clone();
    let dir = dir.to_path_buf();
    let metrics = session
        .create_auto_cdc_from_snapshot_flow("users")
        .keys(["userId"])
        .stored_as_scd_type(ScdType::Type2)
        .next_snapshot_and_version(move |last: Option<i64>| {
            let next = snapshot_files(&dir)?
                .into_iter()
                .find(|(v, _)| last.is_none_or(|l| *v > l));
            next.map(|(version, path)| {
                Ok::<_, DataFusionError>((read_snapshot(&ctx, &path)?, version))
            })
            .transpose()
        })
        .await?;
    for m in &metrics {
        println!("{m:?}");
    }
    session
        .sql("SELECT * FROM users ORDER BY \"userId\", __start_at")
        .await?
        .collect()
        .await
}

#[tokio::main]
async fn main() -> Result<()> {
    let rows = run("./warehouse", Path::new("./snapshots")).await?;
    print_batches(&rows)?;
    Ok(())
}
