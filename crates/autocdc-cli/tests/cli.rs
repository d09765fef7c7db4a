//! End-to-end tests of the `autocdc` binary.

use std::process::{Command, Output};

/// Runs the binary with a warehouse inside a fresh temporary directory.
fn autocdc(args: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let warehouse = dir.path().join("warehouse");
    let output = Command::new(env!("CARGO_BIN_EXE_autocdc"))
        .arg("--warehouse")
        .arg(&warehouse)
        .args(args)
        .output()
        .expect("run autocdc");
    (output, dir)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `autocdc --warehouse <warehouse> run -q --format csv -f <defs> <extra>`.
fn run_defs(warehouse: &std::path::Path, defs: &std::path::Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_autocdc"))
        .arg("--warehouse")
        .arg(warehouse)
        .args(["run", "-q", "--format", "csv", "-f"])
        .arg(defs)
        .args(extra)
        .output()
        .expect("run autocdc")
}

#[test]
fn command_prints_result_table() {
    let (output, dir) = autocdc(&["-c", "SELECT 1 AS x"]);
    let text = stdout(&output);
    assert!(
        output.status.success(),
        "stdout:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("| x |"), "{text}");
    assert!(text.contains("| 1 |"), "{text}");
    assert!(text.contains("1 row(s) fetched."), "{text}");
    assert!(dir.path().join("warehouse").is_dir(), "warehouse created");
}

#[test]
fn file_runs_statements_in_order() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let script = dir.path().join("script.sql");
    std::fs::write(
        &script,
        "-- a table; then a query\nCREATE TABLE t AS VALUES (41);\nSELECT column1 + 1 AS answer FROM t;\n",
    )
    .expect("write script");
    let script = script.to_str().expect("utf-8 path");

    let (output, _warehouse) = autocdc(&["-f", script]);
    let text = stdout(&output);
    assert!(
        output.status.success(),
        "stdout:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("0 row(s) fetched."), "{text}");
    assert!(text.contains("answer"), "{text}");
    assert!(text.contains("42"), "{text}");
}

/// A script's comments are the dialect's: after `SET … dialect = 'mysql'`
/// a `#` starts one (a `;` in it ends no statement), and a `/* */`
/// comment left open is an error, not the end of the script.
#[test]
fn script_comments_are_read_as_the_dialect_reads_them() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let script = dir.path().join("script.sql");
    std::fs::write(
        &script,
        "SET datafusion.sql_parser.dialect = 'mysql';\n\
         CREATE TABLE t AS SELECT 1 AS id;\n\
         SELECT count(*) AS n FROM t # off for now; DROP TABLE t\n;\n\
         SELECT count(*) AS still FROM t;\n",
    )
    .expect("write script");
    let (output, _warehouse) = autocdc(&["--format", "csv", "-f", script.to_str().expect("utf-8")]);
    let text = stdout(&output);
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("still\n1"), "{text}");

    std::fs::write(&script, "SELECT 1 AS one;\nSELECT 2 /* not closed\n").expect("write script");
    let (output, _warehouse) = autocdc(&["-f", script.to_str().expect("utf-8")]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("a /* */ comment that is not closed"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A script that starts with a byte order mark (as some editors write
/// UTF-8) runs: the mark was taken for the start of a statement.
#[test]
fn a_script_with_a_byte_order_mark_runs() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let script = dir.path().join("bom.sql");
    std::fs::write(&script, "\u{feff}SELECT 41 + 1 AS answer;\n").expect("write script");
    let script = script.to_str().expect("utf-8 path");
    let (output, _warehouse) = autocdc(&["-q", "--format", "csv", "-f", script]);
    assert!(
        output.status.success(),
        "stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout(&output), "answer\n42\n");
}

/// A warehouse whose path or tables have letters outside ASCII or a `#` is
/// updated as any other (an update of a table holding rows read its files
/// at a path encoded twice: "not found"); a `%`, which Delta readers take
/// for an escape, is refused before anything is created.
#[test]
fn warehouse_paths_and_table_names_beyond_ascii_are_updated() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let run = |warehouse: &std::path::Path, sql: &str| {
        Command::new(env!("CARGO_BIN_EXE_autocdc"))
            .arg("--warehouse")
            .arg(warehouse)
            .args(["-q", "--format", "csv", "-c", sql])
            .output()
            .expect("run autocdc")
    };
    let script = "CREATE TABLE feed (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1), (2, 'b', 1); \
        CREATE STREAMING TABLE \"tü#\"; \
        CREATE FLOW f1 AS AUTO CDC INTO \"tü#\" FROM feed KEYS (id) SEQUENCE BY seq; \
        CREATE TABLE feed2 (id INT, v TEXT, seq INT) AS VALUES (1, 'c', 2); \
        CREATE FLOW f2 AS AUTO CDC INTO \"tü#\" FROM feed2 KEYS (id) SEQUENCE BY seq; \
        SELECT id, v FROM \"tü#\" ORDER BY id";
    let output = run(&dir.path().join("wü#h"), script);
    assert!(
        output.status.success(),
        "stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout(&output).ends_with("id,v\n1,c\n2,b\n"),
        "{}",
        stdout(&output)
    );

    for (folder, c) in [("p%20x", '%'), ("b\\s", '\\'), ("c]x", ']')] {
        let refused = dir.path().join(folder);
        let output = run(&refused, "SELECT 1");
        let error = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            !output.status.success() && error.contains(&format!("has a '{c}' in its path")),
            "{error}"
        );
        assert!(!refused.exists());
    }
    // (a relative folder inside one: refused by its absolute path)
    let inside = dir.path().join("q%y");
    std::fs::create_dir_all(&inside).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_autocdc"))
        .current_dir(&inside)
        .args(["--warehouse", "rel", "-q", "-c", "SELECT 1"])
        .output()
        .expect("run autocdc");
    assert!(!output.status.success() && !inside.join("rel").exists());
    for name in ["a%20b", "t[", "t|"] {
        let output = run(
            &dir.path().join("plain"),
            &format!("CREATE STREAMING TABLE \"{name}\""),
        );
        let error = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            error.contains("contain no '.', '/', control characters"),
            "{error}"
        );
        assert!(!dir.path().join("plain").join("public").join(name).exists());
    }
    // a folder made by hand whose name holds one is not read as a table
    let by_hand = dir.path().join("plain").join("public").join("h%20x");
    std::fs::create_dir_all(by_hand.join("_delta_log")).unwrap();
    let output = run(&dir.path().join("plain"), "SHOW TABLES");
    assert!(output.status.success());
    assert!(!stdout(&output).contains("h%20x"), "{}", stdout(&output));
}

#[test]
fn failing_statement_stops_with_error() {
    let (output, _dir) = autocdc(&["-c", "SELECT * FROM missing_table; SELECT 'unreached'"]);
    assert!(!output.status.success());
    assert!(!stdout(&output).contains("unreached"));
    assert!(String::from_utf8_lossy(&output.stderr).contains("Error"));
}

#[test]
fn missing_script_is_an_error() {
    let (output, dir) = autocdc(&["-f", "/nonexistent/script.sql"]);
    drop(dir);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read"));
}

/// A warehouse path that is a file is refused, naming it; the file stays.
#[test]
fn a_warehouse_that_is_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wh");
    std::fs::write(&file, "keep").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_autocdc"))
        .arg("--warehouse")
        .arg(&file)
        .args(["-c", "SELECT 1"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is a file, not a folder"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}

#[test]
fn a_command_before_run_is_refused_not_ignored() {
    let (output, dir) = autocdc(&["-c", "CREATE STREAMING TABLE lost", "run"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("`-c` cannot be used with `run`"),
        "{stderr}"
    );
    assert!(!dir.path().join("warehouse").exists(), "nothing opened");
}

/// Streaming tables appear in `information_schema` (`SHOW TABLES`,
/// `SHOW COLUMNS`), `SHOW TBLPROPERTIES` lists a table's properties (not our
/// bookkeeping), and `--format csv` with `-q` prints bare CSV.
#[test]
fn show_tables_and_properties_print_as_csv() {
    let (output, _warehouse) = autocdc(&[
        "--format",
        "csv",
        "-q",
        "-c",
        "CREATE TABLE src (id INT, v TEXT, seq INT) AS VALUES (1, 'a', 1);
         CREATE STREAMING TABLE t TBLPROPERTIES ('autocdc.buckets' = '4', 'owner' = 'ops');
         CREATE FLOW f AS AUTO CDC INTO t FROM src KEYS (id) SEQUENCE BY seq;
         SELECT table_schema, table_name, table_type FROM information_schema.tables
           WHERE table_name IN ('t', 'src') ORDER BY table_name;
         SHOW COLUMNS FROM t;
         SHOW TBLPROPERTIES t;
         SHOW TBLPROPERTIES t ('owner');
         SHOW TBLPROPERTIES t (delta.enableChangeDataFeed);
         SHOW TBLPROPERTIES t ('nope');",
    ]);
    let text = stdout(&output);
    assert!(
        output.status.success(),
        "stdout:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!text.contains("row(s) fetched"), "{text}");
    for expected in [
        // information_schema.tables
        "table_schema,table_name,table_type\npublic,src,BASE TABLE\npublic,t,BASE TABLE\n",
        // SHOW COLUMNS: the user columns only
        ",t,id,",
        // SHOW TBLPROPERTIES: sorted, no flow definition or checkpoint
        "key,value\nautocdc.buckets,4\ndelta.enableChangeDataFeed,true\ndelta.enableDeletionVectors,true\nowner,ops\n",
        "key,value\nowner,ops\n",
        "key,value\ndelta.enableChangeDataFeed,true\n",
        "key,value\nnope,Table t does not have property: nope\n",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    assert!(!text.contains("autocdc.flow"), "{text}");
    // statements without a result print nothing
    assert!(text.starts_with("flow,num_upserted_rows"), "{text}");
    assert!(!text.contains(",t,__cdc_"), "{text}");
}

/// `--maxrows` bounds a result table and says how many rows it hid;
/// `--format nd-json` prints one object per row.
#[test]
fn maxrows_and_json_formats() {
    let (output, _warehouse) = autocdc(&[
        "--maxrows",
        "2",
        "-c",
        "SELECT * FROM generate_series(1, 5)",
    ]);
    let text = stdout(&output);
    assert!(
        text.contains("5 row(s) fetched (2 shown, --maxrows)."),
        "{text}"
    );
    assert!(!text.contains("| 3 "), "{text}");
    let (output, _warehouse) = autocdc(&[
        "--format",
        "nd-json",
        "-q",
        "-c",
        "SELECT value AS n FROM generate_series(1, 2)",
    ]);
    assert_eq!(stdout(&output), "{\"n\":1}\n{\"n\":2}\n");
}

/// The SQL reference's example of each statement (`docs/sql.md`) runs as
/// written (on small stand-ins for the quickstart's tables).
#[test]
fn sql_reference_statement_examples_run() {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/sql.md"),
    )
    .expect("docs/sql.md");
    let start = readme
        .find("One example of each")
        .expect("the SQL reference's statement examples");
    let block = &readme[start..];
    let open = block.find("```sql").expect("an sql block") + "```sql".len();
    let close = open + block[open..].find("```").expect("the block's end");
    let script = format!(
        "CREATE TABLE users_cdf (userId INT, name TEXT, city TEXT, operation TEXT, sequenceNum INT) AS VALUES
           (124, 'Raul', 'Oaxaca', 'INSERT', 1), (123, 'Isabel', 'Monterrey', 'INSERT', 1),
           (125, 'Mercedes', 'Tijuana', 'INSERT', 2), (123, NULL, NULL, 'DELETE', 6);
         CREATE TABLE products_snapshot (id INT, price INT) AS VALUES (1, 10), (2, 20);
         {}",
        &block[open..close]
    );
    let (output, _warehouse) = autocdc(&["-q", "-c", &script]);
    assert!(
        output.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&output),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Width of the widest line, in characters.
fn widest(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

/// The quickstart runs and a person reads its output at a glance: no line
/// is wider than 120 columns; it ends with the target's change feed.
#[test]
fn quickstart_output_fits_120_columns() {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart.sql");
    let (output, _dir) = autocdc(&["-f", &script.to_string_lossy()]);
    let text = stdout(&output);
    assert!(
        output.status.success(),
        "stdout:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(widest(&text) <= 120, "{} columns:\n{text}", widest(&text));
    assert!(
        text.contains("| 126    | Lily     | Merida      |"),
        "{text}"
    );
    assert!(text.contains("update_postimage"), "{text}");
}

/// `EXPLAIN` draws plans as trees, as datafusion-cli does, within 120
/// columns; `EXPLAIN FORMAT indent` and `SET datafusion.explain.format`
/// indent them.
#[test]
fn explain_draws_trees_and_indents_on_request() {
    let setup = "CREATE TABLE feed (id INT, v TEXT, op TEXT, seq INT) AS VALUES (1, 'a', 'U', 1);
         CREATE STREAMING TABLE t;
         CREATE FLOW f AS AUTO CDC INTO t FROM feed KEYS (id) APPLY AS DELETE WHEN op = 'D'
           SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2;";
    for (explain, tree) in [
        ("EXPLAIN REFRESH STREAMING TABLE t", true),
        ("EXPLAIN SELECT * FROM t", true),
        ("EXPLAIN FORMAT indent REFRESH STREAMING TABLE t", false),
        (
            "SET datafusion.explain.format = 'indent'; EXPLAIN REFRESH STREAMING TABLE t",
            false,
        ),
    ] {
        let (output, _dir) = autocdc(&["-q", "-c", &format!("{setup} {explain}")]);
        let text = stdout(&output);
        assert!(
            output.status.success(),
            "{explain}\nstdout:\n{text}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(text.contains('┌'), tree, "{explain}:\n{text}");
        if tree {
            assert!(
                widest(&text) <= 120,
                "{explain}: {} columns:\n{text}",
                widest(&text)
            );
        } else if explain.contains("REFRESH") {
            assert!(text.contains("AutoCdcExec: flow=f"), "{explain}:\n{text}");
        }
    }
}

/// A snapshot version not newer than the last processed one is skipped, and
/// the CLI says so on stderr; the run goes on.
#[test]
fn a_skipped_snapshot_version_prints_a_warning() {
    let script = "CREATE TABLE snaps (v BIGINT, id INT) AS VALUES (10, 1);
        CREATE STREAMING TABLE u;
        CREATE FLOW g AS AUTO CDC INTO u FROM SNAPSHOT (SELECT id FROM snaps)
          WITH VERSION (SELECT CASE WHEN (SELECT count(*) FROM last_snapshot_version()) = 0
            THEN CAST(10 AS BIGINT) ELSE CAST(5 AS BIGINT) END AS v)
          KEYS (id);
        SELECT count(*) AS n FROM u;";
    let (output, _dir) = autocdc(&["-q", "--format", "csv", "-c", script]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "warning: flow 'g': snapshot version 5 skipped: not newer than the last processed version 10"
        ),
        "{stderr}"
    );
    assert!(stdout(&output).ends_with("n\n1\n"), "{}", stdout(&output));
}

/// The README's SQL example runs as written and shows the change feed.
#[test]
fn readme_sql_example_runs() {
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
    )
    .expect("README.md");
    let section = &readme[readme.find("## SQL").expect("the README's SQL section")..];
    let open = section.find("```sql").expect("an sql block") + "```sql".len();
    let close = open + section[open..].find("```").expect("the block's end");
    let (output, _dir) = autocdc(&["-q", "--format", "csv", "-c", &section[open..close]]);
    let text = stdout(&output);
    assert!(
        output.status.success(),
        "stdout:\n{text}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("124,Raul,Oaxaca"), "{text}");
    assert!(text.contains("_change_type"), "{text}");
}

/// `autocdc run -f defs.sql`: the definitions apply once (a second run
/// leaves them alone), then every table updates in dependency order; a
/// failing table fails the run and skips its readers.
#[test]
fn run_applies_definitions_and_updates_the_pipeline() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let source = dir.path().join("events");
    std::fs::create_dir_all(&source).expect("a source folder");
    let write = |name: &str, rows: &str| {
        std::fs::write(source.join(name), format!("id,v,seq\n{rows}")).expect("a file")
    };
    write("1.csv", "1,a,1\n2,b,1\n");
    let defs = dir.path().join("defs.sql");
    std::fs::write(
        &defs,
        format!(
            "CREATE EXTERNAL TABLE events (id INT, v TEXT, seq INT) STORED AS CSV LOCATION '{}/' \
               OPTIONS ('format.has_header' 'true');
             CREATE OR REFRESH STREAMING TABLE bronze FLOW AUTO CDC FROM events KEYS (id)
               SEQUENCE BY seq COLUMNS (id, v);
             CREATE OR REFRESH STREAMING TABLE silver FLOW AUTO CDC
               FROM (SELECT * FROM STREAM(bronze) WITH (readChangeFeed = true)
                     WHERE _change_type <> 'update_preimage')
               KEYS (id) APPLY AS DELETE WHEN _change_type = 'delete'
               SEQUENCE BY _commit_version COLUMNS (id, v) STORED AS SCD TYPE 2;",
            source.display()
        ),
    )
    .expect("definitions");
    let warehouse = dir.path().join("warehouse");
    let run = |extra: &[&str]| run_defs(&warehouse, &defs, extra);
    // (definitions apply in file order: a flow's upstream tables first)
    let first = run(&[]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    write("2.csv", "1,a2,2\n3,c,2\n");
    let second = run(&[]);
    let out = stdout(&second);
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(
        out,
        "table,status,num_upserted_rows,num_deleted_rows,message\n\
         bronze,updated,2,0,\n\
         silver,updated,3,0,\n"
    );
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.is_empty(), "{stderr}");
    let query = |sql: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_autocdc"))
            .arg("--warehouse")
            .arg(&warehouse)
            .args(["-q", "--format", "csv", "-c", sql])
            .output()
            .expect("run autocdc");
        stdout(&out)
    };
    assert_eq!(
        query("SELECT id, v, __END_AT IS NULL AS current FROM silver ORDER BY id, __START_AT"),
        "id,v,current\n1,a,false\n1,a2,true\n2,b,true\n3,c,true\n"
    );
    // the event log says when the newest file of the update landed
    assert_eq!(
        query(
            "SELECT newest_input_at IS NOT NULL AS known, latency_ms >= 0 AS after \
             FROM event_log('bronze') ORDER BY commit_version DESC LIMIT 1"
        ),
        "known,after\ntrue,true\n"
    );

    // a bad row fails bronze and skips silver; the run fails
    write("3.csv", "4,d,3\n,nokey,3\n");
    let failed = run(&[]);
    assert!(!failed.status.success());
    let out = stdout(&failed);
    assert!(out.contains("bronze,failed,0,0,"), "{out}");
    assert!(
        out.contains("silver,skipped,0,0,upstream 'bronze' failed"),
        "{out}"
    );
}

/// `autocdc run` applies what changed in its definitions, and keeps going
/// past one that fails:
/// * a table's new expectation applies (it was reported `unchanged` and
///   ignored), a changed property is an error naming it, and a table created
///   without columns may be declared with its own columns;
/// * `CREATE SCHEMA` of a schema that exists is left alone (the second run
///   failed on it);
/// * a new table whose first update fails is reported (`definition
///   failed`) while the other tables still update, and the run exits non-zero
///   (the run stopped at it, updating nothing).
#[test]
fn run_applies_changed_definitions_and_goes_on_past_a_failing_one() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let source = dir.path().join("events");
    std::fs::create_dir_all(&source).expect("a source folder");
    let write = |name: &str, rows: &str| {
        std::fs::write(source.join(name), format!("id,v,seq\n{rows}")).expect("a file")
    };
    write("1.csv", "1,a,1\n2,b,1\n");
    let warehouse = dir.path().join("warehouse");
    let defs = dir.path().join("defs.sql");
    let run = |bronze: &str, extra: &str| {
        std::fs::write(
            &defs,
            format!(
                "CREATE SCHEMA s;
                 CREATE EXTERNAL TABLE events (id INT, v TEXT, seq INT) STORED AS CSV \
                   LOCATION '{}/' OPTIONS ('format.has_header' 'true');
                 CREATE OR REFRESH STREAMING TABLE s.bronze {bronze};
                 CREATE FLOW bf AS AUTO CDC INTO s.bronze FROM events KEYS (id) \
                   SEQUENCE BY seq COLUMNS (id, v);
                 {extra}",
                source.display()
            ),
        )
        .expect("definitions");
        run_defs(&warehouse, &defs, &[])
    };
    let first = run("", "");
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );

    // the table's own columns, and an expectation: it applies
    write("2.csv", "3,c,2\n9,z,2\n");
    let declared = "(id INT, v STRING, CONSTRAINT small EXPECT (id < 5) ON VIOLATION DROP ROW)";
    let second = run(declared, "");
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(
        stdout(&second),
        "table,status,num_upserted_rows,num_deleted_rows,message\ns.bronze,updated,1,0,\n"
    );

    // a property the table does not have: refused, naming it
    let third = run("TBLPROPERTIES ('autocdc.buckets' = '4')", "");
    assert!(!third.status.success());
    let stderr = String::from_utf8_lossy(&third.stderr);
    assert!(
        stderr.contains("definition failed: CREATE OR REFRESH STREAMING TABLE s.bronze")
            && stderr.contains("autocdc.buckets = '4'"),
        "{stderr}"
    );

    // a new table whose first update fails: the others still update
    write("3.csv", "4,d,3\n");
    let bad = "CREATE STREAMING TABLE s.bad FLOW AUTO CDC \
               FROM (SELECT * FROM VALUES (CAST(NULL AS INT), 'x', 1) AS t(id, v, seq)) \
               KEYS (id) SEQUENCE BY seq;";
    let fourth = run(declared, bad);
    assert!(!fourth.status.success());
    let stderr = String::from_utf8_lossy(&fourth.stderr);
    assert!(
        stderr.contains("definition failed: CREATE STREAMING TABLE s.bad")
            && stderr.contains("KEYS column 'id' is NULL"),
        "{stderr}"
    );
    assert_eq!(
        stdout(&fourth),
        "table,status,num_upserted_rows,num_deleted_rows,message\ns.bronze,updated,1,0,\n"
    );

    // the same flow spelled otherwise is the same flow
    let respelled = std::fs::read_to_string(&defs)
        .expect("definitions")
        .replace("FROM events KEYS (id)", "from EVENTS keys (ID)")
        .replace(
            "SEQUENCE BY seq COLUMNS (id, v)",
            "sequence by SEQ columns ( Id,V )",
        )
        .replace(bad, "");
    std::fs::write(&defs, respelled).expect("definitions");
    let again = run_defs(&warehouse, &defs, &[]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // a flow no longer in the files still runs: the run says so
    let renamed = std::fs::read_to_string(&defs)
        .expect("definitions")
        .replace("CREATE FLOW bf AS", "CREATE FLOW bf2 AS");
    std::fs::write(&defs, renamed).expect("definitions");
    let fifth = run_defs(&warehouse, &defs, &[]);
    let stderr = String::from_utf8_lossy(&fifth.stderr);
    assert!(
        stderr.contains(
            "flow 'bf' of 's.bronze' is not in the definitions and still runs (DROP FLOW bf removes it)"
        ),
        "{stderr}"
    );
}

/// `autocdc run --continuous`: files landing in a folder source over a few
/// seconds reach the targets; SIGTERM ends the run with exit code 0; a run
/// killed mid-cycle (SIGKILL) leaves nothing half-applied: the next run
/// brings every table to what it should hold, each change appended once.
#[test]
fn a_continuous_run_follows_its_sources_and_stops_cleanly() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().expect("temporary directory");
    let source = dir.path().join("events");
    std::fs::create_dir_all(&source).expect("a source folder");
    let write = |n: usize| {
        let rows: String = (0..20)
            .map(|i| format!("{},v{n}_{i},{n}\n", (n * 7 + i) % 50))
            .collect();
        // written whole, then renamed: a reader never sees half a file
        let tmp = dir.path().join(format!("{n}.tmp"));
        std::fs::write(&tmp, format!("id,v,seq\n{rows}")).expect("a file");
        std::fs::rename(&tmp, source.join(format!("{n:03}.csv"))).expect("landed");
    };
    let defs = dir.path().join("defs.sql");
    std::fs::write(
        &defs,
        format!(
            "CREATE EXTERNAL TABLE events (id INT, v TEXT, seq INT) STORED AS CSV LOCATION '{}/' \
               OPTIONS ('format.has_header' 'true');
             CREATE OR REFRESH STREAMING TABLE bronze FLOW AUTO CDC FROM events KEYS (id)
               SEQUENCE BY seq COLUMNS (id, v);
             CREATE OR REFRESH STREAMING TABLE feed AS
               SELECT id, v, _change_type AS change_type, _commit_version AS commit_version
               FROM STREAM(bronze) WITH (readChangeFeed = true);",
            source.display()
        ),
    )
    .expect("definitions");
    let warehouse = dir.path().join("warehouse");
    let start_run = |log: &str| {
        Command::new(env!("CARGO_BIN_EXE_autocdc"))
            .arg("--warehouse")
            .arg(&warehouse)
            .args(["run", "--continuous", "--trigger-interval", "200ms", "-f"])
            .arg(&defs)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join(log)).expect("a log"))
            .spawn()
            .expect("autocdc run starts")
    };
    let query = |sql: &str| -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_autocdc"))
            .arg("--warehouse")
            .arg(&warehouse)
            .args(["-q", "--format", "csv", "-c", sql])
            .output()
            .expect("a query");
        stdout(&out)
    };
    // what the targets should hold after files 1..=n: the last value of each key
    let expected_bronze = |n: usize| {
        let mut last = std::collections::BTreeMap::new();
        for f in 1..=n {
            for i in 0..20 {
                last.insert((f * 7 + i) % 50, format!("v{f}_{i}"));
            }
        }
        let rows: String = last.iter().map(|(k, v)| format!("{k},{v}\n")).collect();
        format!("id,v\n{rows}")
    };
    let wait_for = |n: usize| {
        let started = Instant::now();
        loop {
            let got = query("SELECT id, v FROM bronze ORDER BY id");
            if got == expected_bronze(n) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "bronze never reached files 1..={n}:\n{got}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // the feed holds every change of bronze once
    let feed_is_exact = || {
        let sql = "SELECT id, v, _change_type, _commit_version FROM table_changes('bronze', 0) \
                   ORDER BY _commit_version, id, _change_type";
        let feed = "SELECT id, v, change_type AS _change_type, commit_version AS _commit_version \
                    FROM feed ORDER BY _commit_version, id, _change_type";
        assert_eq!(query(feed), query(sql));
    };

    // a run has its handlers once it reports its first cycle
    let started = |log: &str| {
        let begun = Instant::now();
        while !std::fs::read_to_string(dir.path().join(log))
            .unwrap_or_default()
            .contains("cycle 1")
        {
            assert!(
                begun.elapsed() < Duration::from_secs(90),
                "{log}: no first cycle"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    write(1);
    let mut run = start_run("run1.log");
    for n in 2..=5 {
        std::thread::sleep(Duration::from_millis(400));
        write(n);
    }
    wait_for(5);
    let pid = run.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = run.wait().expect("the run ends");
    let log = std::fs::read_to_string(dir.path().join("run1.log")).unwrap_or_default();
    assert!(status.success(), "{status:?}\n{log}");
    assert!(
        log.contains("cycle 1:") && log.ends_with("stopped\n"),
        "{log}"
    );
    feed_is_exact();

    // SIGKILL in the middle of its cycles, then a new run recovers
    for n in 6..=9 {
        write(n);
    }
    let mut run = start_run("run2.log");
    std::thread::sleep(Duration::from_millis(700));
    run.kill().expect("SIGKILL");
    let _ = run.wait();
    let mut run = start_run("run3.log");
    wait_for(9);
    // bronze may have reached file 9 before run 3 began: signal it once it runs
    started("run3.log");
    let pid = run.id().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(run.wait().expect("the run ends").success());
    feed_is_exact();
}

/// `autocdc run --continuous` with a table that keeps failing: each cycle
/// says why, and the cycles back off (they ran again at once, spinning).
#[test]
fn a_continuous_run_backs_off_from_a_failing_table() {
    use std::time::Duration;
    let dir = tempfile::tempdir().expect("temporary directory");
    let source = dir.path().join("events");
    std::fs::create_dir_all(&source).expect("a source folder");
    std::fs::write(source.join("1.csv"), "id,v,seq\n1,a,1\n").expect("a file");
    let defs = dir.path().join("defs.sql");
    std::fs::write(
        &defs,
        format!(
            "CREATE EXTERNAL TABLE events (id INT, v TEXT, seq INT) STORED AS CSV LOCATION '{}/' \
               OPTIONS ('format.has_header' 'true');
             CREATE OR REFRESH STREAMING TABLE bronze FLOW AUTO CDC FROM events KEYS (id)
               SEQUENCE BY seq COLUMNS (id, v);
             CREATE OR REFRESH STREAMING TABLE silver AS SELECT id, v FROM STREAM(bronze);",
            source.display()
        ),
    )
    .expect("definitions");
    let log = dir.path().join("run.log");
    let mut run = Command::new(env!("CARGO_BIN_EXE_autocdc"))
        .arg("--warehouse")
        .arg(dir.path().join("warehouse"))
        .args(["run", "--continuous", "--trigger-interval", "100ms", "-f"])
        .arg(&defs)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("a log"))
        .spawn()
        .expect("autocdc run starts");
    let begun = std::time::Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("cycle 1")
    {
        assert!(begun.elapsed() < Duration::from_secs(90), "no first cycle");
        std::thread::sleep(Duration::from_millis(100));
    }
    // an update of bronze's row: silver's append-only stream fails on it
    std::fs::write(source.join("2.csv"), "id,v,seq\n1,b,2\n").expect("a file");
    std::thread::sleep(Duration::from_secs(4));
    let pid = run.id().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    run.wait().expect("the run ends");
    let text = std::fs::read_to_string(&log).expect("the log");
    assert!(
        text.contains("  silver failed: ") && text.contains("append-only"),
        "{text}"
    );
    // 100 ms doubling: about 6 cycles in 4 s (at once, hundreds)
    let failing = text
        .lines()
        .filter(|l| l.ends_with("silver failed"))
        .count();
    assert!((1..=12).contains(&failing), "{failing} cycles:\n{text}");
}

#[test]
fn file_urls_name_the_folder_they_say() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let spaced = dir.path().join("my wh");
    let plain = dir.path().join("lh");
    // `file://localhost/abs` and `%20` for a space are that folder (the
    // first went to ./localhost/abs, the second failed as "already exists")
    for (url, folder) in [
        (
            format!("file://localhost{}", plain.display()),
            plain.clone(),
        ),
        (
            format!("file://{}", spaced.display()).replace(' ', "%20"),
            spaced.clone(),
        ),
    ] {
        for round in 0..2 {
            let output = Command::new(env!("CARGO_BIN_EXE_autocdc"))
                .current_dir(dir.path())
                .args(["--warehouse", &url, "-q", "--format", "csv", "-c"])
                .arg(match round {
                    0 => "CREATE STREAMING TABLE t; CREATE FLOW f AS INSERT INTO ONCE t BY NAME SELECT 1 AS id",
                    _ => "SELECT * FROM t",
                })
                .output()
                .expect("run autocdc");
            assert!(
                output.status.success(),
                "{url}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            if round == 1 {
                assert_eq!(stdout(&output), "id\n1\n", "{url}");
            }
        }
        assert!(folder.join("public").join("t").is_dir(), "{url}");
    }
    assert!(!dir.path().join("localhost").exists());
    // a host that is not this machine, or no `//` (`file:wh` would be
    // `/wh`), is refused, naming the form to write
    for url in ["file://elsewhere/wh", "file:relwh"] {
        let output = Command::new(env!("CARGO_BIN_EXE_autocdc"))
            .current_dir(dir.path())
            .args(["--warehouse", url, "-c", "SELECT 1"])
            .output()
            .expect("run autocdc");
        assert!(!output.status.success());
        assert!(
            String::from_utf8_lossy(&output.stderr)
                .contains("is not a local file URL: write file:///absolute/path"),
            "{url}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn csv_prints_nested_columns_and_full_refresh_names_fold_like_sql() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let warehouse = dir.path().join("wh");
    let defs = dir.path().join("defs.sql");
    std::fs::write(
        &defs,
        "CREATE OR REFRESH STREAMING TABLE Users;\n\
         CREATE FLOW f AS AUTO CDC INTO Users FROM (SELECT 1 AS id, 'a' AS v, 1 AS a, 2 AS b) \
         KEYS (id) SEQUENCE BY STRUCT(a, b) COLUMNS (id, v) STORED AS SCD TYPE 2;\n",
    )
    .expect("write defs");
    assert!(run_defs(&warehouse, &defs, &[]).status.success());
    // `Users` is `users`, as `REFRESH PIPELINE FULL (Users)` reads it
    let output = run_defs(&warehouse, &defs, &["--full-refresh", "Users"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // a STRUCT sequence makes __start_at a struct: CSV prints it as text
    let output = Command::new(env!("CARGO_BIN_EXE_autocdc"))
        .arg("--warehouse")
        .arg(&warehouse)
        .args(["-q", "--format", "csv", "-c", "SELECT * FROM users"])
        .output()
        .expect("run autocdc");
    assert_eq!(
        stdout(&output),
        "id,v,__start_at,__end_at\n1,a,\"{a: 1, b: 2}\",\n",
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn quit_inside_an_open_string_is_part_of_it() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut child = Command::new(env!("CARGO_BIN_EXE_autocdc"))
        .arg("--warehouse")
        .arg(dir.path().join("wh"))
        .args(["-q", "--format", "csv"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run autocdc");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"SELECT length('one\n\\q\nthree') AS n;\n\\q\nSELECT 2;\n")
        .expect("write stdin");
    let output = child.wait_with_output().expect("wait");
    assert!(output.status.success());
    assert_eq!(stdout(&output), "n\n12\n");
}
