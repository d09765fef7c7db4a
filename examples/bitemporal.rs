//! A BITEMPORAL target with the Rust API (SPEC §2.5): business time
//! (`sequence_by`) × system time (`system_sequence_by`), loaded with the
//! SPEC's worked example — one update per arriving event, a late correction
//! included — then queried "as of" both times.
//!
//! ```text
//! cargo run -p datafusion-autocdc --example bitemporal
//! ```

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::print_batches;
use datafusion::error::Result;
use datafusion_autocdc::{AutoCdcConfig, CdcSession, ScdType};

/// The change feed, in arrival order: (id, data, business time, system time, op).
const EVENTS: [&str; 4] = [
    "('A', 'XFv1', TIMESTAMP '2024-06-01 10:01:00', TIMESTAMP '2024-06-01 10:05:00', 'INSERT')",
    "('A', 'XFv2', TIMESTAMP '2024-06-01 12:15:43', TIMESTAMP '2024-06-01 12:20:00', 'UPDATE')",
    "('A', 'XFv3', TIMESTAMP '2024-06-01 12:05:00', TIMESTAMP '2024-06-01 12:25:00', 'UPDATE')",
    "('A', NULL, TIMESTAMP '2024-06-01 12:30:00', TIMESTAMP '2024-06-01 12:30:00', 'DELETE')",
];

/// What `run` returns: the whole table, and two as-of answers.
pub struct Answers {
    /// Every row with its business and system intervals.
    pub table: Vec<RecordBatch>,
    /// What is true at business time 12:10, by today's knowledge.
    pub now: Vec<RecordBatch>,
    /// What was true at business time 12:10, as known at system time 12:22.
    pub as_known: Vec<RecordBatch>,
}

/// Run the example on `warehouse`.
pub async fn run(warehouse: &str) -> Result<Answers> {
    let session = CdcSession::open(AutoCdcConfig::new(warehouse)).await?;
    session
        .sql(
            "CREATE OR REPLACE TABLE changes (id TEXT, data TEXT, bt TIMESTAMP, st TIMESTAMP, op TEXT) AS \
             SELECT * FROM (VALUES ('', '', TIMESTAMP '2000-01-01', TIMESTAMP '2000-01-01', '')) WHERE false",
        )
        .await?;
    session
        .sql("DROP STREAMING TABLE IF EXISTS contracts")
        .await?;
    session.create_streaming_table("contracts").await?;

    for (i, event) in EVENTS.iter().enumerate() {
        session
            .sql(&format!("INSERT INTO changes VALUES {event}"))
            .await?
            .collect()
            .await?;
        if i == 0 {
            session
                .create_auto_cdc_flow("contracts", "changes")
                .name("contracts_flow")
                .keys(["id"])
                .sequence_by("bt")
                .system_sequence_by("st")
                .apply_as_deletes("op = 'DELETE'")
                .except_column_list(["bt", "st", "op"])
                .stored_as_scd_type(ScdType::Bitemporal)
                .await?;
        } else {
            session.refresh_streaming_table("contracts", false).await?;
        }
    }

    let session = &session;
    let query = |sql: String| async move { session.sql(&sql).await?.collect().await };
    let table =
        query("SELECT * FROM contracts ORDER BY __start_at, __system_start_at".to_string()).await?;
    // business time B, as of system time S (S = NULL: the newest belief)
    let as_of = |business: &str, system: Option<&str>| {
        let known = match system {
            Some(s) => format!(
                "__system_start_at <= TIMESTAMP '{s}' AND (__system_end_at IS NULL OR __system_end_at > TIMESTAMP '{s}')"
            ),
            None => "__system_end_at IS NULL".to_string(),
        };
        format!(
            "SELECT id, data FROM contracts WHERE {known} \
             AND __start_at <= TIMESTAMP '{business}' AND (__end_at IS NULL OR __end_at > TIMESTAMP '{business}')"
        )
    };
    let now = query(as_of("2024-06-01 12:10:00", None)).await?;
    let as_known = query(as_of("2024-06-01 12:10:00", Some("2024-06-01 12:22:00"))).await?;
    Ok(Answers {
        table,
        now,
        as_known,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let answers = run("./warehouse").await?;
    print_batches(&answers.table)?;
    println!("true at 12:10 by today's knowledge:");
    print_batches(&answers.now)?;
    println!("true at 12:10 as known at 12:22:");
    print_batches(&answers.as_known)?;
    Ok(())
}
