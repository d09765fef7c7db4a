-- Updates large enough that a cluster reads several stored files per bucket
-- (plain Parquet reads): SCD 1, SCD 2 and BITEMPORAL flows over 200 000
-- events of 5 000 keys, and a snapshot flow over 20 000 rows, three updates
-- each. Each query prints one row: the count and a fingerprint (md5 of the
-- rows in order) of a target or of its change feed (a snapshot flow's
-- times are its updates' clock: its rows are compared without them).
-- `{dir}` is replaced by a folder of the test's (unused here).
CREATE TABLE feed (id BIGINT, v VARCHAR, op VARCHAR, seq BIGINT) AS
  SELECT value % 5000 AS id, 'v' || CAST(value AS VARCHAR) AS v,
         CASE WHEN value % 97 = 0 THEN 'D' ELSE 'U' END AS op, (value * 7919) % 200003 AS seq
  FROM generate_series(1, 200000);
CREATE TABLE snap (id BIGINT, v VARCHAR) AS
  SELECT value AS id, 's' || CAST(value % 7 AS VARCHAR) AS v FROM generate_series(1, 20000);

CREATE STREAMING TABLE t1;
CREATE FLOW f1 AS AUTO CDC INTO t1 FROM feed KEYS (id) APPLY AS DELETE WHEN op = 'D'
  SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 1;
CREATE STREAMING TABLE t2;
CREATE FLOW f2 AS AUTO CDC INTO t2 FROM feed KEYS (id) APPLY AS DELETE WHEN op = 'D'
  SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2;
CREATE STREAMING TABLE tb;
CREATE FLOW fb AS AUTO CDC INTO tb FROM (SELECT *, seq * 2 AS st FROM feed) KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq SYSTEM SEQUENCE BY st
  COLUMNS * EXCEPT (op, seq, st) STORED AS BITEMPORAL;
CREATE STREAMING TABLE tn;
CREATE FLOW fn AS AUTO CDC INTO tn FROM SNAPSHOT (SELECT * FROM snap) KEYS (id) STORED AS SCD TYPE 2;

-- update 2: 2 001 keys again, 1 000 of them new
INSERT INTO feed SELECT value AS id, 'n' AS v, 'U' AS op, 300000 + value AS seq
  FROM generate_series(4000, 6000);
CREATE OR REPLACE TABLE snap (id BIGINT, v VARCHAR) AS
  SELECT value AS id, 's' || CAST(value % 5 AS VARCHAR) AS v FROM generate_series(500, 21000);
REFRESH STREAMING TABLE t1;
REFRESH STREAMING TABLE t2;
REFRESH STREAMING TABLE tb;
REFRESH STREAMING TABLE tn;

-- update 3: deletes of every third key, late events, new values
INSERT INTO feed SELECT value % 6000 AS id, 'm' || CAST(value AS VARCHAR) AS v,
    CASE WHEN value % 3 = 0 THEN 'D' ELSE 'U' END AS op,
    CASE WHEN value % 11 = 0 THEN value ELSE 310000 + value END AS seq
  FROM generate_series(1, 12000);
CREATE OR REPLACE TABLE snap (id BIGINT, v VARCHAR) AS
  SELECT value AS id, 's' || CAST(value % 3 AS VARCHAR) AS v FROM generate_series(1, 19000);
REFRESH STREAMING TABLE t1;
REFRESH STREAMING TABLE t2;
REFRESH STREAMING TABLE tb;
REFRESH STREAMING TABLE tn;

SELECT count(*), md5(string_agg(concat_ws('|', id, v), ',' ORDER BY id)) FROM t1;
SELECT count(*), md5(string_agg(concat_ws('|', id, v, __START_AT, __END_AT), ','
  ORDER BY id, __START_AT)) FROM t2;
SELECT count(*), md5(string_agg(concat_ws('|', id, v, __START_AT, __END_AT, __SYSTEM_START_AT,
  __SYSTEM_END_AT), ',' ORDER BY id, __START_AT, __SYSTEM_START_AT)) FROM tb;
SELECT count(*), md5(string_agg(concat_ws('|', id, v, __END_AT IS NULL), ','
  ORDER BY id, v, __END_AT IS NULL)) FROM tn;
SELECT count(*), md5(string_agg(concat_ws('|', id, v, _change_type, _commit_version), ','
  ORDER BY _commit_version, id, _change_type)) FROM table_changes('t1', 0);
SELECT count(*), md5(string_agg(concat_ws('|', id, v, __START_AT, __END_AT, _change_type,
  _commit_version), ',' ORDER BY _commit_version, id, __START_AT, _change_type, __END_AT))
  FROM table_changes('t2', 0);
SELECT count(*), md5(string_agg(concat_ws('|', id, v, _change_type, _commit_version), ','
  ORDER BY _commit_version, id, _change_type, v)) FROM table_changes('tn', 0);
SELECT count(*), md5(string_agg(concat_ws('|', id, v, __START_AT, __END_AT, __SYSTEM_START_AT,
  __SYSTEM_END_AT, _change_type, _commit_version), ',' ORDER BY _commit_version, id, __START_AT,
  __SYSTEM_START_AT, _change_type, __END_AT, __SYSTEM_END_AT)) FROM table_changes('tb', 0);
