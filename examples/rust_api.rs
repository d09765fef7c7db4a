//! The Rust API: create a streaming table and an AUTO CDC flow with the
//! parameters of the Python `create_auto_cdc_flow`, run an update and read the
//! result.
//!
//! ```text
//! cargo run -p datafusion-autocdc --example rust_api
//! ```

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::print_batches;
use datafusion::error::Result;
use datafusion_autocdc::api::UpdateMetrics;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

/// Run the example on `warehouse`; returns the first update's metrics and the
/// target's rows after the second update.
pub async fn run(warehouse: &str) -> Result<(UpdateMetrics, Vec<RecordBatch>)> {
    let session = CdcSession::open(AutoCdcConfig::new(warehouse)).await?;

    // A change feed: any table or query the session can plan.
    session
        .sql(
            "CREATE OR REPLACE TABLE users_cdf (userId INT, name TEXT, city TEXT, operation TEXT, sequenceNum INT) AS VALUES
               (124, 'Raul', 'Oaxaca', 'INSERT', 1), (123, 'Isabel', 'Monterrey', 'INSERT', 1),
               (125, 'Mercedes', 'Tijuana', 'INSERT', 2), (126, 'Lily', 'Cancun', 'INSERT', 2),
               (123, NULL, NULL, 'DELETE', 6), (125, 'Mercedes', 'Guadalajara', 'UPDATE', 6),
               (125, 'Mercedes', 'Mexicali', 'UPDATE', 5), (123, 'Isabel', 'Chihuahua', 'UPDATE', 5)",
        )
        .await?;

    session.sql("DROP STREAMING TABLE IF EXISTS users").await?;
    session.create_streaming_table("users").await?;
    let metrics = session
        .create_auto_cdc_flow("users", "users_cdf")
        .name("users_flow")
        .keys(["userId"])
        .sequence_by("sequenceNum")
        .apply_as_deletes("operation = 'DELETE'")
        .except_column_list(["operation", "sequenceNum"])
        .await?;

    // More changes arrive; a refresh applies them (late ones are dropped).
    session
        .sql("INSERT INTO users_cdf VALUES (126, 'Lily', 'Merida', 'UPDATE', 7), (124, 'Raul', 'Late', 'UPDATE', 0)")
        .await?
        .collect()
        .await?;
    session.refresh_streaming_table("users", false).await?;

    let rows = session
        .sql("SELECT * FROM users ORDER BY userid")
        .await?
        .collect()
        .await?;
    Ok((metrics, rows))
}

#[tokio::main]
async fn main() -> Result<()> {
    let (metrics, rows) = run("./warehouse").await?;
    println!("first update: {metrics:?}");
    print_batches(&rows)?;
    Ok(())
}
