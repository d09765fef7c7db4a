//! Other Delta readers read our streaming tables as we do: flows run through
//! the `autocdc` binary, then Polars (`read_delta`), delta-rs
//! (`QueryBuilder`) and delta-rs' change data feed (`load_cdf`) read each
//! table at its path and must return exactly the columns and rows of our
//! `SELECT *` and `table_changes` (`interop/check_readers.py`).
//!
//! A table whose schema evolved (a column added, one widened) is also read
//! at its older versions, with the columns it had then.
//!
//! Tables made with `SET autocdc.deletion_vectors = false` have no deletion
//! vectors, so delta-rs' pyarrow reader (`to_pyarrow_table`) reads them too.
//!
//! The readers run in a Python virtual environment created on first use
//! under the cargo target's temporary folder (`AUTOCDC_INTEROP_VENV` to put
//! it elsewhere), with `deltalake` and `polars` from the package registry.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../autocdc-python/tests/support/venv.rs"]
mod venv;
use venv::run;

/// The reader versions the test was written against.
const PACKAGES: [&str; 3] = ["deltalake==1.6.6", "polars==2.1.0", "pyarrow==26.0.1"];

/// The flows: SCD 1 with deletes, late events, a replay and a truncate;
/// SCD 2 with `TRACK HISTORY`; BITEMPORAL with a correction; SCD 1 without
/// deletion vectors; SCD 1 in LZ4 and in Snappy files
/// (`autocdc.compression`); a snapshot flow.
const FLOWS: &str = "
CREATE TABLE src1 (id INT, v TEXT, op TEXT, seq INT) AS VALUES
  (1, 'a', 'U', 1), (2, 'b', 'U', 1), (3, 'c', 'U', 1), (4, 'd', 'U', 1), (2, NULL, 'D', 2);
CREATE STREAMING TABLE scd1;
CREATE FLOW f1 AS AUTO CDC INTO scd1 FROM src1 KEYS (id)
  APPLY AS DELETE WHEN op = 'D' APPLY AS TRUNCATE WHEN op = 'T'
  SEQUENCE BY seq COLUMNS * EXCEPT (op);
INSERT INTO src1 VALUES (1, 'late', 'U', 0), (3, 'c', 'U', 1), (1, 'a2', 'U', 5), (5, 'e', 'U', 5);
REFRESH STREAMING TABLE scd1;
INSERT INTO src1 VALUES (NULL, NULL, 'T', 6), (6, 'f', 'U', 7);
REFRESH STREAMING TABLE scd1;

CREATE TABLE src2 (id INT, name TEXT, city TEXT, op TEXT, seq INT) AS VALUES
  (1, 'ann', 'rome', 'U', 1), (1, 'ann', 'paris', 'U', 2), (1, 'anne', 'paris', 'U', 3),
  (2, 'bob', 'oslo', 'U', 1), (2, NULL, NULL, 'D', 4);
CREATE STREAMING TABLE scd2;
CREATE FLOW f2 AS AUTO CDC INTO scd2 FROM src2 KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op)
  STORED AS SCD TYPE 2 TRACK HISTORY ON (city);
INSERT INTO src2 VALUES (1, 'anne', 'berlin', 'U', 5), (3, 'cy', 'lima', 'U', 2);
REFRESH STREAMING TABLE scd2;

CREATE TABLE ev (id INT, v TEXT, bt INT, st INT, op TEXT) AS VALUES
  (1, 'a', 10, 100, 'U'), (1, 'b', 20, 200, 'U'), (2, 'x', 10, 150, 'U');
CREATE STREAMING TABLE bitemporal;
CREATE FLOW f3 AS AUTO CDC INTO bitemporal FROM ev KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY bt SYSTEM SEQUENCE BY st
  COLUMNS * EXCEPT (bt, st, op) STORED AS BITEMPORAL;
INSERT INTO ev VALUES (1, 'b-fixed', 20, 300, 'U');
REFRESH STREAMING TABLE bitemporal;

SET autocdc.deletion_vectors = false;
CREATE TABLE src5 (id INT, v TEXT, op TEXT, seq INT) AS VALUES
  (1, 'a', 'U', 1), (2, 'b', 'U', 1), (3, 'c', 'U', 1), (9, NULL, 'D', 1);
CREATE STREAMING TABLE plain_scd1;
CREATE FLOW f5 AS AUTO CDC INTO plain_scd1 FROM src5 KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op);
INSERT INTO src5 VALUES (1, 'a2', 'U', 2), (2, NULL, 'D', 2), (4, 'd', 'U', 2);
REFRESH STREAMING TABLE plain_scd1;
SET autocdc.deletion_vectors = true;

CREATE TABLE src6 (id INT, a INT, seq INT) AS VALUES (1, 10, 1), (2, 20, 1);
CREATE STREAMING TABLE evolved;
CREATE FLOW f6 AS AUTO CDC INTO evolved FROM src6 KEYS (id) SEQUENCE BY seq COLUMNS * EXCEPT (seq);
CREATE OR REPLACE TABLE src6 (id INT, a INT, b TEXT, seq INT) AS VALUES (1, 11, 'x', 2);
REFRESH STREAMING TABLE evolved;
CREATE OR REPLACE TABLE src6 (id INT, a BIGINT, seq INT) AS VALUES (2, 5000000000, 3);
REFRESH STREAMING TABLE evolved;

CREATE TABLE src7 (id INT, v TEXT, op TEXT, seq INT) AS VALUES
  (1, 'a', 'U', 1), (2, 'b', 'U', 1), (3, 'c', 'U', 1);
CREATE STREAMING TABLE lz4_scd1 TBLPROPERTIES ('autocdc.compression' = 'lz4');
CREATE FLOW f7 AS AUTO CDC INTO lz4_scd1 FROM src7 KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op);
INSERT INTO src7 VALUES (1, 'a2', 'U', 2), (2, NULL, 'D', 2), (4, 'd', 'U', 2);
REFRESH STREAMING TABLE lz4_scd1;
CREATE STREAMING TABLE snappy_scd1 TBLPROPERTIES ('autocdc.compression' = 'snappy');
CREATE FLOW f8 AS AUTO CDC INTO snappy_scd1 FROM src7 KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op);
INSERT INTO src7 VALUES (3, 'c3', 'U', 3);
REFRESH STREAMING TABLE snappy_scd1;

CREATE TABLE snap (id INT, v TEXT) AS VALUES (1, 'a'), (2, 'b'), (3, 'c');
CREATE STREAMING TABLE snapped;
CREATE FLOW f4 AS AUTO CDC INTO snapped FROM SNAPSHOT (SELECT * FROM snap) KEYS (id);
CREATE OR REPLACE TABLE snap (id INT, v TEXT) AS VALUES (1, 'a'), (2, 'B'), (4, 'd');
REFRESH STREAMING TABLE snapped;
";

const TABLES: [&str; 8] = [
    "scd1",
    "scd2",
    "bitemporal",
    "snapped",
    "evolved",
    "lz4_scd1",
    "snappy_scd1",
    "plain_scd1",
];

/// Older versions of a table whose schema evolved since (SPEC §2.9), read
/// at that version with its columns then: `(table, version, our query)`.
const VERSIONS: [(&str, u64, &str); 2] = [
    ("evolved", 1, "SELECT id, a FROM table_as_of('evolved', 1)"),
    ("evolved", 2, "SELECT * FROM table_as_of('evolved', 2)"),
];

/// Tables created with `autocdc.deletion_vectors = false`, also read with
/// delta-rs' pyarrow reader (which does not read deletion vectors).
const PLAIN_TABLES: usize = 1;

/// The Python of a virtual environment holding the readers (created if missing).
fn readers_python() -> PathBuf {
    venv::venv_python(
        "AUTOCDC_INTEROP_VENV",
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("interop-venv"),
        "deltalake, polars, pyarrow",
        &PACKAGES,
    )
}

#[test]
fn delta_readers_see_exactly_our_rows_and_changes() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let warehouse = dir.path().join("warehouse");
    let exports = dir.path().join("exports");
    std::fs::create_dir_all(&exports).expect("exports folder");
    let mut script = FLOWS.to_string();
    for table in TABLES {
        let out = exports.join(format!("{table}.parquet"));
        let changes = exports.join(format!("{table}_changes.parquet"));
        script.push_str(&format!(
            "COPY (SELECT * FROM {table}) TO '{}' STORED AS PARQUET;\n\
             COPY (SELECT * EXCEPT (_commit_timestamp) FROM table_changes('{table}', 0)) TO '{}' STORED AS PARQUET;\n",
            out.display(),
            changes.display()
        ));
    }
    for (table, version, query) in VERSIONS {
        let out = exports.join(format!("{table}@{version}.parquet"));
        script.push_str(&format!(
            "COPY ({query}) TO '{}' STORED AS PARQUET;\n",
            out.display()
        ));
    }
    let script_file = dir.path().join("flows.sql");
    std::fs::write(&script_file, script).expect("script");
    run(
        Command::new(env!("CARGO_BIN_EXE_autocdc"))
            .arg("--warehouse")
            .arg(&warehouse)
            .arg("-f")
            .arg(&script_file),
        "autocdc -f flows.sql",
    );
    let checker = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/check_readers.py");
    let report = run(
        Command::new(readers_python())
            .arg(checker)
            .arg(&warehouse)
            .arg(&exports)
            .args(TABLES)
            .args(VERSIONS.iter().map(|(t, v, _)| format!("{t}@{v}"))),
        "check_readers.py",
    );
    // every table read three ways, the plain ones four, older versions two
    assert_eq!(
        report.matches("same ").count(),
        3 * TABLES.len() + PLAIN_TABLES + 2 * VERSIONS.len(),
        "{report}"
    );
}
