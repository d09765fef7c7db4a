//! Incremental sources: a flow reading a streaming table (Delta) reads only
//! the versions committed since its checkpoint, and a flow reading a Parquet
//! folder only the files it has not read; the checkpoint commits with the
//! data. Asserted through the update metrics (`num_input_rows`).

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion_autocdc::{AutoCdcConfig, CdcSession};

async fn collect(s: &CdcSession, sql: &str) -> Vec<RecordBatch> {
    s.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `num_input_rows` of the first result row of a CREATE FLOW / REFRESH.
async fn input_rows(s: &CdcSession, sql: &str) -> i64 {
    let batches = collect(s, sql).await;
    let batch = &batches[0];
    let column = batch
        .column(batch.schema().index_of("num_input_rows").unwrap())
        .as_primitive::<Int64Type>();
    column.value(0)
}

/// A session on the warehouse `wh` under `dir`.
async fn open(dir: &std::path::Path) -> CdcSession {
    CdcSession::open(AutoCdcConfig::new(dir.join("wh").to_str().unwrap()))
        .await
        .unwrap()
}

/// `CREATE EXTERNAL TABLE name (columns) STORED AS CSV` over the folder
/// `folder` (files with a header line).
async fn csv_folder(s: &CdcSession, name: &str, columns: &str, folder: &std::path::Path) {
    collect(
        s,
        &format!(
            "CREATE EXTERNAL TABLE {name} ({columns}) STORED AS CSV LOCATION '{}/' \
             OPTIONS ('format.has_header' 'true')",
            folder.display()
        ),
    )
    .await;
}

async fn rows(s: &CdcSession, sql: &str) -> Vec<String> {
    let text = pretty_format_batches(&collect(s, sql).await)
        .unwrap()
        .to_string();
    text.lines()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

#[tokio::test]
async fn parquet_folder_source_reads_only_new_files() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events");
    std::fs::create_dir_all(&events).unwrap();
    let s = open(dir.path()).await;
    let write = |name: &str, values: &str| {
        format!(
            "COPY (SELECT CAST(column1 AS INT) AS id, column2 AS v, CAST(column3 AS INT) AS seq FROM (VALUES {values})) TO '{}' STORED AS PARQUET",
            events.join(name).display()
        )
    };
    collect(
        &s,
        &write("part-1.parquet", "(1, 'a', 1), (2, 'b', 1), (3, 'c', 1)"),
    )
    .await;
    collect(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE events STORED AS PARQUET LOCATION '{}/'",
            events.display()
        ),
    )
    .await;
    collect(&s, "CREATE STREAMING TABLE t").await;
    let flow = "CREATE FLOW f AS AUTO CDC INTO t FROM events KEYS (id) SEQUENCE BY seq";
    assert_eq!(input_rows(&s, flow).await, 3);

    collect(&s, &write("part-2.parquet", "(1, 'a2', 2), (4, 'd', 1)")).await;
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE t").await, 2);
    assert_eq!(
        rows(&s, "SELECT id, v, seq FROM t ORDER BY id").await,
        [
            "| 1 | a2 | 2 |",
            "| 2 | b | 1 |",
            "| 3 | c | 1 |",
            "| 4 | d | 1 |"
        ]
    );
    // nothing new: nothing read
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE t").await, 0);

    // a new process continues from the committed checkpoint
    let again = open(dir.path()).await;
    collect(
        &again,
        &format!(
            "CREATE EXTERNAL TABLE events STORED AS PARQUET LOCATION '{}/'",
            events.display()
        ),
    )
    .await;
    collect(&again, &write("part-3.parquet", "(2, NULL, 5)")).await;
    assert_eq!(input_rows(&again, "REFRESH STREAMING TABLE t").await, 1);
    assert_eq!(
        rows(&again, "SELECT id, v, seq FROM t ORDER BY id").await,
        [
            "| 1 | a2 | 2 |",
            "| 2 | | 5 |",
            "| 3 | c | 1 |",
            "| 4 | d | 1 |"
        ]
    );
    // a full refresh reads everything again
    assert_eq!(
        input_rows(&again, "REFRESH STREAMING TABLE t FULL").await,
        6
    );
    assert_eq!(
        rows(&again, "SELECT id, v, seq FROM t ORDER BY id").await,
        [
            "| 1 | a2 | 2 |",
            "| 2 | | 5 |",
            "| 3 | c | 1 |",
            "| 4 | d | 1 |"
        ]
    );
}

/// Every file of the folder is read once, whatever its name (`%`, `?`,
/// `#` are percent-encoded in a store's locations); files in sub-folders,
/// which the table's own scans leave out (a job's `_temporary/`), are not
/// read until they are the table's.
#[tokio::test]
async fn folder_files_of_any_name_are_read_once_and_sub_folders_not() {
    let dir = tempfile::tempdir().unwrap();
    let land = dir.path().join("land");
    std::fs::create_dir_all(land.join("_temporary/0")).unwrap();
    let names = [
        "plain.csv",
        "x%41.csv",
        "r?1.csv",
        "s#1.csv",
        "sp ace é.csv",
        "b\\s.csv",
    ];
    for (i, name) in names.iter().enumerate() {
        std::fs::write(land.join(name), format!("id,v\n{},{name}\n", i + 1)).unwrap();
    }
    std::fs::write(land.join("_temporary/0/part-0.csv"), "id,v\n8,spark\n").unwrap();
    let s = open(dir.path()).await;
    csv_folder(&s, "land", "id INT, v VARCHAR", &land).await;
    let create = "CREATE STREAMING TABLE t AS SELECT * FROM STREAM land";
    assert_eq!(input_rows(&s, create).await, 6);
    collect(&s, "CREATE STREAMING TABLE u").await;
    let flow = "CREATE FLOW fu AS AUTO CDC INTO u FROM land KEYS (id) SEQUENCE BY id";
    assert_eq!(input_rows(&s, flow).await, 6);
    let expected = [
        "| 1 | plain.csv |",
        "| 2 | x%41.csv |",
        "| 3 | r?1.csv |",
        "| 4 | s#1.csv |",
        "| 5 | sp ace é.csv |",
        "| 6 | b\\s.csv |",
    ];
    assert_eq!(rows(&s, "SELECT * FROM t ORDER BY id").await, expected);
    assert_eq!(rows(&s, "SELECT * FROM u ORDER BY id").await, expected);
    // the job's commit moves its file into the folder: read then, once
    std::fs::rename(
        land.join("_temporary/0/part-0.csv"),
        land.join("part-0.csv"),
    )
    .unwrap();
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE t").await, 1);
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE t").await, 0);
    assert_eq!(
        rows(&s, "SELECT count(*), count(DISTINCT id) FROM t").await,
        ["| 7 | 7 |"]
    );
}

#[tokio::test]
async fn streaming_table_source_reads_only_new_versions() {
    let s = CdcSession::open(AutoCdcConfig::in_memory()).await.unwrap();
    collect(
        &s,
        "CREATE TABLE raw (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1), (3, 'c', 1)",
    )
    .await;
    collect(&s, "CREATE STREAMING TABLE bronze").await;
    collect(
        &s,
        "CREATE FLOW to_bronze AS AUTO CDC INTO bronze FROM raw KEYS (id) SEQUENCE BY seq",
    )
    .await;
    collect(&s, "CREATE STREAMING TABLE silver").await;
    let flow = "CREATE FLOW to_silver AS AUTO CDC INTO silver FROM bronze KEYS (id) SEQUENCE BY seq STORED AS SCD TYPE 2";
    assert_eq!(input_rows(&s, flow).await, 3);

    // bronze changes one key and adds one: silver reads those two rows only
    collect(&s, "INSERT INTO raw VALUES (1, 'a2', 2), (4, 'd', 1)").await;
    collect(&s, "REFRESH STREAMING TABLE bronze").await;
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE silver").await, 2);
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE silver").await, 0);
    assert_eq!(
        rows(
            &s,
            "SELECT id, v, __start_at, __end_at FROM silver ORDER BY id, __start_at"
        )
        .await,
        [
            "| 1 | a | 1 | 2 |",
            "| 1 | a2 | 2 | |",
            "| 2 | b | 1 | |",
            "| 3 | c | 1 | |",
            "| 4 | d | 1 | |"
        ]
    );
}

/// A listing table over a single file (not a folder) is read, and read once.
#[tokio::test]
async fn single_file_source_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.parquet");
    let s = open(dir.path()).await;
    collect(
        &s,
        &format!(
            "COPY (SELECT CAST(column1 AS INT) AS id, column2 AS v, CAST(column3 AS INT) AS seq FROM (VALUES (1, 'a', 1), (2, 'b', 1))) TO '{}' STORED AS PARQUET",
            file.display()
        ),
    )
    .await;
    collect(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE events STORED AS PARQUET LOCATION '{}'",
            file.display()
        ),
    )
    .await;
    collect(&s, "CREATE STREAMING TABLE t").await;
    let flow = "CREATE FLOW f AS AUTO CDC INTO t FROM events KEYS (id) SEQUENCE BY seq";
    assert_eq!(input_rows(&s, flow).await, 2);
    assert_eq!(
        rows(&s, "SELECT id, v FROM t ORDER BY id").await,
        ["| 1 | a |", "| 2 | b |"]
    );
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE t").await, 0);
}

/// Flows read what another process committed to their streaming-table
/// source since their last run, and read it once: an AUTO CDC flow `FROM`
/// the table and an append flow reading it as a `STREAM` alike. (Each flow
/// reads the version its checkpoint records, though looking the source up
/// brings it to its latest version.)
#[tokio::test(flavor = "multi_thread")]
async fn flows_read_what_another_process_committed_to_their_source_once() {
    let store = std::sync::Arc::new(object_store::memory::InMemory::new());
    let s = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone()))
        .await
        .unwrap();
    for sql in [
        "CREATE TABLE raw (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1)",
        "CREATE STREAMING TABLE bronze",
        "CREATE FLOW to_bronze AS AUTO CDC INTO bronze FROM raw KEYS (id) SEQUENCE BY seq",
        "CREATE STREAMING TABLE silver",
        "CREATE FLOW to_silver AS AUTO CDC INTO silver FROM bronze KEYS (id) SEQUENCE BY seq \
         STORED AS SCD TYPE 2",
        "CREATE STREAMING TABLE log AS SELECT id, upper(v) AS v FROM STREAM bronze",
    ] {
        collect(&s, sql).await;
    }
    // another process appends to bronze
    let other = CdcSession::open(AutoCdcConfig::in_memory_on(store.clone()))
        .await
        .unwrap();
    collect(&other, "INSERT INTO bronze VALUES (3, 'c', 1), (4, 'd', 1)").await;

    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE silver").await, 2);
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE log").await, 2);
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE silver").await, 0);
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE log").await, 0);
    let expected = ["| 1 | A |", "| 2 | B |", "| 3 | C |", "| 4 | D |"];
    assert_eq!(
        rows(&s, "SELECT id, v FROM log ORDER BY id").await,
        expected
    );
    assert_eq!(
        rows(&s, "SELECT id, upper(v) FROM silver ORDER BY id").await,
        expected
    );
    // and the other process sees what these flows committed
    assert_eq!(
        rows(&other, "SELECT id, v FROM log ORDER BY id").await,
        expected
    );
}

/// A folder table read whole (a flow's plain `FROM`, a snapshot) shows the
/// files the folder holds now, in a session that read it before: DataFusion
/// keeps folder listings for the life of a session unless told otherwise,
/// and then a long-lived session (Python, a continuous pipeline) never saw
/// a new file.
#[tokio::test]
async fn a_folder_read_whole_shows_files_added_since_the_session_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("csv");
    std::fs::create_dir_all(&events).unwrap();
    std::fs::write(events.join("1.csv"), "id,v,seq\n1,a,1\n").unwrap();
    let s = open(dir.path()).await;
    csv_folder(&s, "src", "id INT, v STRING, seq INT", &events).await;
    collect(&s, "CREATE STREAMING TABLE t").await;
    collect(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq",
    )
    .await;
    assert_eq!(rows(&s, "SELECT count(*) FROM src").await, ["| 1 |"]);
    std::fs::write(events.join("2.csv"), "id,v,seq\n2,b,1\n").unwrap();
    assert_eq!(rows(&s, "SELECT count(*) FROM src").await, ["| 2 |"]);
    collect(&s, "REFRESH STREAMING TABLE t").await;
    assert_eq!(
        rows(&s, "SELECT id, v FROM t ORDER BY id").await,
        ["| 1 | a |", "| 2 | b |"]
    );
}

/// A folder's file read once is not read again when it leaves the folder
/// and comes back (its row was appended twice: the checkpoint held the
/// latest listing only); an empty file, created and not yet written, is
/// read once it has been written (it was taken as read, its rows lost).
#[tokio::test]
async fn folder_files_are_read_once_whether_they_move_away_and_back_or_start_empty() {
    let dir = tempfile::tempdir().unwrap();
    let land = dir.path().join("land");
    std::fs::create_dir_all(&land).unwrap();
    std::fs::write(land.join("f1.csv"), "id,v\n1,a\n").unwrap();
    let s = open(dir.path()).await;
    csv_folder(&s, "land", "id INT, v VARCHAR", &land).await;
    let create = "CREATE STREAMING TABLE t AS SELECT * FROM STREAM land";
    assert_eq!(input_rows(&s, create).await, 1);
    collect(&s, "CREATE STREAMING TABLE u").await;
    let flow = "CREATE FLOW fu AS AUTO CDC INTO u FROM land KEYS (id) SEQUENCE BY id";
    assert_eq!(input_rows(&s, flow).await, 1);

    // away while a new file comes, then back
    std::fs::rename(land.join("f1.csv"), dir.path().join("f1.away")).unwrap();
    std::fs::write(land.join("f2.csv"), "id,v\n2,b\n").unwrap();
    // (created, not written yet)
    std::fs::write(land.join("f3.csv"), "").unwrap();
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE t").await, 1);
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE u").await, 1);
    std::fs::rename(dir.path().join("f1.away"), land.join("f1.csv")).unwrap();
    std::fs::write(land.join("f3.csv"), "id,v\n3,c\n").unwrap();
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE t").await, 1);
    assert_eq!(input_rows(&s, "REFRESH STREAMING TABLE u").await, 1);
    for table in ["t", "u"] {
        assert_eq!(
            rows(
                &s,
                &format!("SELECT id, v, count(*) FROM {table} GROUP BY id, v ORDER BY id")
            )
            .await,
            ["| 1 | a | 1 |", "| 2 | b | 1 |", "| 3 | c | 1 |"],
            "{table}"
        );
    }
}

/// A Parquet source whose float column holds one number and NaN is read as
/// it is: DataFusion 55 took the column for a constant from its footer
/// statistics (which leave NaN out) and read the number twice, in a plain
/// `SELECT` and into the target.
#[tokio::test]
async fn nan_in_a_parquet_source_is_read_as_nan() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events");
    std::fs::create_dir_all(&events).unwrap();
    let s = open(dir.path()).await;
    collect(
        &s,
        &format!(
            "COPY (SELECT CAST(column1 AS INT) AS id, CAST(column2 AS DOUBLE) AS x FROM (VALUES (1, 0.1), (2, 'NaN'))) TO '{}' STORED AS PARQUET",
            events.join("part-1.parquet").display()
        ),
    )
    .await;
    collect(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE events STORED AS PARQUET LOCATION '{}/'",
            events.display()
        ),
    )
    .await;
    let expected = ["| 1 | 0.1 |", "| 2 | NaN |"];
    assert_eq!(rows(&s, "SELECT * FROM events ORDER BY id").await, expected);
    collect(&s, "CREATE STREAMING TABLE t").await;
    collect(
        &s,
        "CREATE FLOW f AS AUTO CDC INTO t FROM events KEYS (id) SEQUENCE BY id",
    )
    .await;
    assert_eq!(rows(&s, "SELECT * FROM t ORDER BY id").await, expected);
}

/// A new file of a folder that cannot be read fails the update naming the
/// file (DataFusion's readers name none: in a folder of many files the
/// user could not tell which to fix), whether the folder is the flow's
/// source or a stream of its query; nothing is committed, and once the
/// file is fixed each file is read once.
#[tokio::test]
async fn a_folder_file_that_cannot_be_read_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let land = dir.path().join("land");
    std::fs::create_dir_all(&land).unwrap();
    std::fs::write(land.join("f1.csv"), "id,v\n1,a\n").unwrap();
    let s = open(dir.path()).await;
    csv_folder(&s, "land", "id INT, v VARCHAR", &land).await;
    collect(&s, "CREATE STREAMING TABLE t AS SELECT * FROM STREAM land").await;
    collect(&s, "CREATE STREAMING TABLE u").await;
    collect(
        &s,
        "CREATE FLOW fu AS AUTO CDC INTO u FROM land KEYS (id) SEQUENCE BY id",
    )
    .await;
    std::fs::write(land.join("f2.csv"), "id,v\n2,b\n").unwrap();
    std::fs::write(land.join("f3.csv"), "id,v\n3,c\nxx,d\n").unwrap();
    std::fs::write(land.join("f4.csv"), "id,v\n4,d\n").unwrap();
    let bad = format!(
        "file:///{}/f3.csv",
        land.display().to_string().trim_start_matches('/')
    );
    for (table, flow) in [("t", "t"), ("u", "fu")] {
        let e = match s.sql(&format!("REFRESH STREAMING TABLE {table}")).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{table}: no error"),
        };
        assert!(
            e.contains(&format!(
                "flow '{flow}': the update of '{table}' failed reading file '{bad}' of 'land'; nothing was committed"
            )) && e.contains("'xx'"),
            "{e}"
        );
    }
    std::fs::write(land.join("f3.csv"), "id,v\n3,c\n").unwrap();
    for table in ["t", "u"] {
        collect(&s, &format!("REFRESH STREAMING TABLE {table}")).await;
        assert_eq!(
            rows(
                &s,
                &format!("SELECT id, count(*) FROM {table} GROUP BY id ORDER BY id")
            )
            .await,
            ["| 1 | 1 |", "| 2 | 1 |", "| 3 | 1 |", "| 4 | 1 |"],
            "{table}"
        );
    }

    // a failure of the query, not of a file, blames no file (one whose
    // column the query leaves out does not read, alone, as the query does)
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("a.csv"), "id,v\n1,10\n").unwrap();
    csv_folder(&s, "other", "id INT, v INT", &other).await;
    collect(
        &s,
        "CREATE STREAMING TABLE c AS SELECT id, 10 / (id - 5) AS r FROM STREAM other",
    )
    .await;
    std::fs::write(other.join("b.csv"), "id,v\n2,abc\n").unwrap();
    std::fs::write(other.join("c.csv"), "id,v\n5,1\n").unwrap();
    let e = match s.sql("REFRESH STREAMING TABLE c").await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("no error"),
    };
    assert!(
        e.contains("Divide by zero") && !e.contains("reading file"),
        "{e}"
    );
}
