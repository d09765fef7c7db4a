//! Streaming tables in any DataFusion session: a `SessionContext::new()`
//! that never saw a `CdcSession` queries a target, its change feed and an
//! older version, with the warehouse registered as a catalog.
//!
//! ```text
//! cargo run -p datafusion-autocdc --example plain_session
//! ```

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::print_batches;
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use datafusion_autocdc::catalog::register_warehouse;
use datafusion_autocdc::table::Warehouse;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

/// What the plain session read.
pub struct Answers {
    /// `SELECT * FROM warehouse.public.users`.
    pub users: Vec<RecordBatch>,
    /// `table_changes('users', 0)`, without its timestamps.
    pub changes: Vec<RecordBatch>,
    /// `table_as_of('users', 1)`.
    pub first_version: Vec<RecordBatch>,
    /// A table created after the registration, found by name.
    pub later: Vec<RecordBatch>,
}

/// Run the flows with a `CdcSession` on `warehouse`, then read them from a
/// plain `SessionContext`.
pub async fn run(warehouse: &str) -> Result<Answers> {
    // the flows: written by a CdcSession (any process)
    let session = CdcSession::open(AutoCdcConfig::new(warehouse)).await?;
    for sql in [
        "CREATE OR REPLACE TABLE users_cdf (id INT, name TEXT, op TEXT, seq INT) AS VALUES
           (1, 'ann', 'U', 1), (2, 'bob', 'U', 1)",
        "CREATE STREAMING TABLE users",
        "CREATE FLOW users_flow AS AUTO CDC INTO users FROM users_cdf KEYS (id)
           APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)",
        "INSERT INTO users_cdf VALUES (1, 'anne', 'U', 2), (2, NULL, 'D', 2)",
        "REFRESH STREAMING TABLE users",
    ] {
        session.sql(sql).await?.collect().await?;
    }

    // a plain DataFusion session
    let ctx = SessionContext::new();
    register_warehouse(&ctx, "warehouse", Warehouse::open(warehouse)?).await?;
    let query = |sql: &'static str| {
        let ctx = ctx.clone();
        async move { ctx.sql(sql).await?.collect().await }
    };
    let users = query("SELECT * FROM warehouse.public.users ORDER BY id").await?;
    let changes = query(
        "SELECT id, name, _change_type, _commit_version FROM table_changes('users', 0)
         ORDER BY _commit_version, id, _change_type DESC",
    )
    .await?;
    let first_version = query("SELECT * FROM table_as_of('users', 1) ORDER BY id").await?;

    // a table created after the registration is found by its name
    for sql in [
        "CREATE STREAMING TABLE later",
        "CREATE FLOW later_flow AS AUTO CDC INTO later FROM users_cdf KEYS (id)
           SEQUENCE BY seq COLUMNS (id, name)",
    ] {
        session.sql(sql).await?.collect().await?;
    }
    let later = query("SELECT * FROM warehouse.public.later ORDER BY id").await?;
    Ok(Answers {
        users,
        changes,
        first_version,
        later,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let answers = run("./warehouse").await?;
    for (title, rows) in [
        ("users", &answers.users),
        ("table_changes('users', 0)", &answers.changes),
        ("table_as_of('users', 1)", &answers.first_version),
        ("later", &answers.later),
    ] {
        println!("{title}");
        print_batches(rows)?;
    }
    Ok(())
}
