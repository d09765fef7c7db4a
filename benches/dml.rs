//! DML benchmark: what a statement that changes few rows of a large SCD 1
//! target costs, beside a flow update of as many keys.
//!
//! ```text
//! cargo bench -p datafusion-autocdc --bench dml [-- KEYS]
//! ```
//! Loads KEYS keys (2,000,000 by default) into an SCD 1 target on an
//! in-memory warehouse, then times, three times each (new keys every
//! time): a `REFRESH` of 100 changed keys, an `UPDATE` of 100 rows, a
//! `DELETE` of 100 rows, a `MERGE` updating 100 rows, an `UPDATE` of one
//! row, and the 100-row `UPDATE` again with
//! `autocdc.deletion_vector_max_fraction = 0` (a rewrite of the table).
//! Prints each median and its ratio to the refresh.

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::error::Result;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

/// Events for the keys `ids`, values tagged `tag`, at sequence `seq`.
fn events(ids: impl Iterator<Item = i64>, tag: &str, seq: i64) -> Result<RecordBatch> {
    let ids: Int64Array = ids.collect();
    let vs: StringArray = (0..ids.len()).map(|i| Some(format!("{tag}{i}"))).collect();
    let seqs = Int64Array::from(vec![seq; ids.len()]);
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Utf8, false),
            Field::new("seq", DataType::Int64, false),
        ])),
        vec![Arc::new(ids), Arc::new(vs), Arc::new(seqs)],
    )?)
}

async fn run(session: &CdcSession, sql: &str) -> Result<f64> {
    let start = Instant::now();
    session.sql(sql).await?.collect().await?;
    Ok(start.elapsed().as_secs_f64())
}

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

#[tokio::main]
async fn main() -> Result<()> {
    let keys: i64 = std::env::args()
        .filter_map(|a| a.parse().ok())
        .next()
        .unwrap_or(2_000_000);
    let session = CdcSession::open(AutoCdcConfig::in_memory()).await?;
    let ctx = session.context();
    ctx.register_batch("feed", events(0..keys, "v", 1)?)?;
    session.sql("CREATE STREAMING TABLE t").await?;
    let load = run(
        &session,
        "CREATE FLOW f AS AUTO CDC INTO t FROM feed KEYS (id) SEQUENCE BY seq",
    )
    .await?;
    println!("{:<40} {keys:>10} keys {load:>8.3} s", "load");

    // 100 keys at a time, spread over the table, new ones each round
    let hundred = |round: i64, part: i64| {
        (0..100).map(move |i| (i * 7919 + round * 100 + part * 1000) % keys)
    };
    let (mut refreshes, mut updates, mut deletes, mut rewrites) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut merges, mut one_row) = (Vec::new(), Vec::new());
    for round in 0..3 {
        ctx.deregister_table("feed")?;
        ctx.register_batch("feed", events(hundred(round, 0), "r", 2 + round)?)?;
        refreshes.push(run(&session, "REFRESH STREAMING TABLE t").await?);
        let list = |part| {
            hundred(round, part)
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        updates.push(
            run(
                &session,
                &format!("UPDATE t SET v = 'u' WHERE id IN ({})", list(1)),
            )
            .await?,
        );
        deletes.push(
            run(
                &session,
                &format!("DELETE FROM t WHERE id IN ({})", list(2)),
            )
            .await?,
        );
        ctx.deregister_table("changes")?;
        ctx.register_batch("changes", events(hundred(round, 4), "m", 0)?)?;
        merges.push(
            run(
                &session,
                "MERGE INTO t USING changes c ON t.id = c.id \
                 WHEN MATCHED THEN UPDATE SET v = c.v",
            )
            .await?,
        );
        let key = (round * 104_729 + 5) % keys;
        one_row.push(run(&session, &format!("UPDATE t SET v = 'o' WHERE id = {key}")).await?);
        // the same statement rewriting the table (what it did before
        // deletion vectors)
        run(&session, "SET autocdc.deletion_vector_max_fraction = 0").await?;
        let sql = format!("UPDATE t SET v = 'w' WHERE id IN ({})", list(3));
        rewrites.push(run(&session, &sql).await?);
        run(&session, "SET autocdc.deletion_vector_max_fraction = 0.1").await?;
    }
    let refresh = median(refreshes);
    for (label, time) in [
        ("REFRESH of 100 changed keys", refresh),
        ("UPDATE of 100 rows", median(updates)),
        ("DELETE of 100 rows", median(deletes)),
        ("MERGE of 100 rows", median(merges)),
        ("UPDATE of one row", median(one_row)),
        ("UPDATE of 100 rows, rewriting the table", median(rewrites)),
    ] {
        println!(
            "{label:<40} {keys:>10} keys {time:>8.3} s {:>6.2}x the refresh",
            time / refresh
        );
    }
    Ok(())
}
