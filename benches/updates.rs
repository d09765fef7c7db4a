//! Update benchmarks: wall-clock time of AUTO CDC updates on generated data,
//! on an in-memory warehouse (so storage I/O is the object store's, not the
//! disk's).
//!
//! ```text
//! cargo bench -p datafusion-autocdc --bench updates [-- ROWS]
//! ```
//! Prints one line per scenario: rows, seconds, rows per second.

use std::time::Instant;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::error::Result;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};
use std::sync::Arc;

/// `rows` change events over `keys` keys, sequence = row number + offset.
fn feed(rows: usize, keys: usize, offset: i64, tag: &str) -> Result<Vec<RecordBatch>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, false),
        Field::new("seq", DataType::Int64, false),
    ]));
    let mut batches = Vec::new();
    let chunk = 64 * 1024;
    let mut start = 0;
    while start < rows {
        let end = (start + chunk).min(rows);
        let ids: Int64Array = (start..end).map(|i| ((i * 7919) % keys) as i64).collect();
        let vs: StringArray = (start..end)
            .map(|i| Some(format!("{tag}{}", i % 1000)))
            .collect();
        let seqs: Int64Array = (start..end).map(|i| i as i64 + offset).collect();
        batches.push(RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(ids), Arc::new(vs), Arc::new(seqs)],
        )?);
        start = end;
    }
    Ok(batches)
}

async fn timed(session: &CdcSession, label: &str, rows: usize, sql: &str) -> Result<()> {
    let start = Instant::now();
    session.sql(sql).await?.collect().await?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{label:<48} {rows:>10} rows {secs:>8.3} s {:>12.0} rows/s",
        rows as f64 / secs
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let rows: usize = std::env::args()
        .filter_map(|a| a.parse().ok())
        .next()
        .unwrap_or(1_000_000);
    let session = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    let ctx = session.context();

    // SCD 1: initial load of `rows` distinct keys, then 1% changes
    ctx.register_batch(
        "initial",
        datafusion::arrow::compute::concat_batches(
            &feed(1, 1, 0, "a")?[0].schema(),
            &feed(rows, rows, 0, "a")?,
        )?,
    )?;
    session
        .sql("CREATE STREAMING TABLE scd1 TBLPROPERTIES ('autocdc.buckets' = '64')")
        .await?;
    timed(
        &session,
        "scd1: initial load",
        rows,
        "CREATE FLOW f AS AUTO CDC INTO scd1 FROM initial KEYS (id) SEQUENCE BY seq",
    )
    .await?;
    let changes = rows / 100;
    ctx.deregister_table("initial")?;
    let delta = feed(changes, rows, rows as i64, "b")?;
    ctx.register_batch(
        "initial",
        datafusion::arrow::compute::concat_batches(&delta[0].schema(), &delta)?,
    )?;
    timed(
        &session,
        "scd1: 1% changed keys",
        changes,
        "REFRESH STREAMING TABLE scd1",
    )
    .await?;

    // SCD 2: history of `rows` events over rows/10 keys
    let events = feed(rows, rows / 10, 0, "c")?;
    ctx.register_batch(
        "history",
        datafusion::arrow::compute::concat_batches(&events[0].schema(), &events)?,
    )?;
    session
        .sql("CREATE STREAMING TABLE scd2 TBLPROPERTIES ('autocdc.buckets' = '64')")
        .await?;
    timed(&session, "scd2: initial history", rows, "CREATE FLOW f AS AUTO CDC INTO scd2 FROM history KEYS (id) SEQUENCE BY seq STORED AS SCD TYPE 2").await?;
    // Snapshots: a first snapshot of `rows` keys, then one with 1% changed,
    // 0.5% deleted and 0.5% new keys (the diff reads both in full)
    let snapshot = |changed: usize, version: i64| -> Result<RecordBatch> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, false),
        ]));
        let start = changed / 2;
        let ids: Int64Array = (start..rows + start).map(|i| i as i64).collect();
        let vs: StringArray = (start..rows + start)
            .map(|i| {
                Some(if i < changed {
                    format!("new{version}")
                } else {
                    format!("v{i}")
                })
            })
            .collect();
        Ok(RecordBatch::try_new(
            schema,
            vec![Arc::new(ids), Arc::new(vs)],
        )?)
    };
    ctx.register_batch("snap", snapshot(0, 1)?)?;
    session
        .sql("CREATE STREAMING TABLE snap_target TBLPROPERTIES ('autocdc.buckets' = '64')")
        .await?;
    timed(
        &session,
        "snapshot: first snapshot",
        rows,
        "CREATE FLOW f AS AUTO CDC INTO snap_target FROM SNAPSHOT (SELECT * FROM snap) KEYS (id)",
    )
    .await?;
    ctx.deregister_table("snap")?;
    ctx.register_batch("snap", snapshot(rows / 100, 2)?)?;
    timed(
        &session,
        "snapshot: diff of two 1% apart",
        rows,
        "REFRESH STREAMING TABLE snap_target",
    )
    .await?;
    Ok(())
}
