use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

async fn run(s: &CdcSession, sql: &str) -> String {
    let df = s.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let b = df.collect().await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    pretty_format_batches(&b).unwrap().to_string()
}

#[tokio::test]
async fn spec_example_scd1() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    run(&s, "CREATE TABLE users_cdf (userId INT, name TEXT, city TEXT, operation TEXT, sequenceNum INT) AS VALUES
        (124,'Raul','Oaxaca','INSERT',1), (123,'Isabel','Monterrey','INSERT',1),
        (125,'Mercedes','Tijuana','INSERT',2), (126,'Lily','Cancun','INSERT',2),
        (123,NULL,NULL,'DELETE',6), (125,'Mercedes','Guadalajara','UPDATE',6),
        (125,'Mercedes','Mexicali','UPDATE',5), (123,'Isabel','Chihuahua','UPDATE',5)").await;
    run(&s, "CREATE STREAMING TABLE target").await;
    let out = run(&s, "CREATE FLOW f AS AUTO CDC INTO target FROM users_cdf KEYS (userId) APPLY AS DELETE WHEN operation = 'DELETE' SEQUENCE BY sequenceNum COLUMNS * EXCEPT (operation, sequenceNum)").await;
    println!("{out}");
    let out = run(&s, "SELECT * FROM target ORDER BY userid").await;
    println!("{out}");
    let out = run(&s, "REFRESH STREAMING TABLE target").await;
    println!("{out}");
    let out = run(&s, "SELECT * FROM target ORDER BY userid").await;
    println!("{out}");
    let out = run(&s, "EXPLAIN REFRESH STREAMING TABLE target").await;
    println!("{out}");
    assert!(out.contains("AutoCdcExec"));
}
