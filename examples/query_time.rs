//! AUTO CDC at query time: the SCD 2 history of a change feed, asked in a
//! query — as a SQL relation and through the DataFrame method — with no
//! streaming table, nothing stored.
//!
//! ```text
//! cargo run -p datafusion-autocdc --example query_time
//! ```

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::print_batches;
use datafusion::error::Result;
use datafusion::prelude::col;
use datafusion_autocdc::sql::{parse_cdc_statement, CdcStatement};
use datafusion_autocdc::{AutoCdcConfig, AutoCdcDataFrame, CdcSession};

/// What the two ways answered.
pub struct Answers {
    /// The SQL relation: each user's cities over time.
    pub history: Vec<RecordBatch>,
    /// The DataFrame method: the users living in their city now.
    pub current: Vec<RecordBatch>,
}

/// Ask both questions of a small change feed.
pub async fn run() -> Result<Answers> {
    let session = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    session
        .sql(
            "CREATE TABLE users_cdf (userId INT, city TEXT, operation TEXT, sequenceNum INT) AS VALUES
               (124, 'Oaxaca', 'INSERT', 1), (125, 'Tijuana', 'INSERT', 2),
               (125, 'Mexicali', 'UPDATE', 5), (125, 'Guadalajara', 'UPDATE', 6),
               (124, NULL, 'DELETE', 7)",
        )
        .await?
        .collect()
        .await?;

    // SQL: the fold is a relation like any other
    let history = session
        .sql(
            "SELECT userId, city, __START_AT AS since, __END_AT AS until
             FROM AUTO CDC (SELECT * FROM users_cdf) KEYS (userId)
               APPLY AS DELETE WHEN operation = 'DELETE' SEQUENCE BY sequenceNum
               COLUMNS * EXCEPT (operation, sequenceNum) STORED AS SCD TYPE 2 AS h
             ORDER BY userId, since",
        )
        .await?
        .collect()
        .await?;

    // Rust: any DataFrame of events, composed further
    let flow = "CREATE FLOW users AS AUTO CDC INTO users FROM users_cdf KEYS (userId)
                APPLY AS DELETE WHEN operation = 'DELETE' SEQUENCE BY sequenceNum
                COLUMNS * EXCEPT (operation, sequenceNum) STORED AS SCD TYPE 2";
    let Some(CdcStatement::CreateFlow(spec)) = parse_cdc_statement(flow, "generic", true)? else {
        unreachable!("a flow definition")
    };
    let current = session
        .context()
        .table("users_cdf")
        .await?
        .auto_cdc(&spec)?
        .filter(col("__end_at").is_null())? // (unquoted names fold to lower case)
        .select_columns(&["userid", "city"])?
        .collect()
        .await?;
    Ok(Answers { history, current })
}

#[tokio::main]
async fn main() -> Result<()> {
    let answers = run().await?;
    print_batches(&answers.history)?;
    print_batches(&answers.current)?;
    Ok(())
}
