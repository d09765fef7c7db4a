-- Three updates of an SCD 1 flow (deletes, a truncate, late events), an
-- SCD 2 flow and a snapshot flow, with their targets and change feeds.
-- `{dir}` is replaced by a folder of the test's.
SET datafusion.execution.target_partitions = 4;
CREATE EXTERNAL TABLE changes (id INT, name VARCHAR, city VARCHAR, op VARCHAR, seq INT)
  STORED AS PARQUET LOCATION '{dir}/changes/';
CREATE VIEW changes_without_truncates AS SELECT * FROM changes WHERE op <> 'TRUNCATE';
INSERT INTO changes VALUES
  (1, 'Ann', 'Oslo', 'INSERT', 1), (2, 'Bob', 'Rome', 'INSERT', 1),
  (3, 'Cy', 'Lima', 'INSERT', 2), (4, 'Di', 'Kyiv', 'INSERT', 2), (4, 'Di', 'Riga', 'UPDATE', 1);
CREATE TABLE snap (id INT, name VARCHAR) AS VALUES (1, 'a'), (2, 'b'), (3, 'c');

CREATE STREAMING TABLE s1;
CREATE FLOW s1_flow AS AUTO CDC INTO s1 FROM changes KEYS (id)
  APPLY AS DELETE WHEN op = 'DELETE' APPLY AS TRUNCATE WHEN op = 'TRUNCATE'
  SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 1;
CREATE STREAMING TABLE s2;
CREATE FLOW s2_flow AS AUTO CDC INTO s2 FROM changes_without_truncates KEYS (id)
  APPLY AS DELETE WHEN op = 'DELETE'
  SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2;
CREATE STREAMING TABLE sn;
CREATE FLOW sn_flow AS AUTO CDC INTO sn FROM SNAPSHOT (SELECT * FROM snap) KEYS (id) STORED AS SCD TYPE 1;

-- update 2: an update, a delete, a late event, a new key
INSERT INTO changes VALUES
  (2, 'Bob', 'Paris', 'UPDATE', 3), (3, NULL, NULL, 'DELETE', 3),
  (1, 'Ann', 'Late', 'UPDATE', 0), (5, 'Ed', 'Nice', 'INSERT', 3);
CREATE OR REPLACE TABLE snap (id INT, name VARCHAR) AS VALUES (1, 'a'), (2, 'b2'), (4, 'd');
REFRESH STREAMING TABLE s1;
REFRESH STREAMING TABLE s2;
REFRESH STREAMING TABLE sn;

-- update 3: a truncate (SCD 1), then newer events
INSERT INTO changes VALUES
  (0, NULL, NULL, 'TRUNCATE', 4), (4, 'Di', 'Kyiv', 'UPDATE', 5), (6, 'Flo', 'Bern', 'INSERT', 5);
CREATE OR REPLACE TABLE snap (id INT, name VARCHAR) AS VALUES (2, 'b3'), (4, 'd'), (5, 'e');
REFRESH STREAMING TABLE s1;
REFRESH STREAMING TABLE s2;
REFRESH STREAMING TABLE sn;

-- DML: SCD 1 statements (their writes run on the client), an SCD 2 one
UPDATE s1 SET city = 'Bergen' WHERE id = 4;
DELETE FROM s1 WHERE id = 6;
MERGE INTO s1 USING (SELECT 7 AS id, 'Gus' AS name, 'Graz' AS city) AS n ON s1.id = n.id
  WHEN NOT MATCHED THEN INSERT (id, name, city) VALUES (n.id, n.name, n.city);
UPDATE s2 SET city = 'Turin' WHERE id = 2 AND __END_AT IS NULL;

SELECT * FROM s1 ORDER BY id;
SELECT id, name, city, __START_AT, __END_AT FROM s2 ORDER BY id, __START_AT;
SELECT * FROM sn ORDER BY id;
SELECT id, name, city, _change_type, _commit_version FROM table_changes('s1', 0)
  ORDER BY _commit_version, id, _change_type;
SELECT id, name, city, __START_AT, _change_type, _commit_version FROM table_changes('s2', 0)
  ORDER BY _commit_version, id, __START_AT, _change_type;
SELECT id, name, _change_type, _commit_version FROM table_changes('sn', 0)
  ORDER BY _commit_version, id, _change_type;

-- AUTO CDC in queries: the relation (SCD 2) and its change feed
SELECT * FROM AUTO CDC (SELECT * FROM changes_without_truncates) KEYS (id)
  APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)
  STORED AS SCD TYPE 2 ORDER BY id, __START_AT;
SELECT * FROM AUTO CDC (SELECT * FROM changes) KEYS (id)
  APPLY AS DELETE WHEN op = 'DELETE' APPLY AS TRUNCATE WHEN op = 'TRUNCATE'
  SEQUENCE BY seq COLUMNS * EXCEPT (op, seq) WITH CHANGES ORDER BY id, _change_type;

-- snapshots in a query, the key fixed by a filter: the window under the
-- diff sorts by the key too (a stage after a shuffle knows no constants)
SET datafusion.execution.target_partitions = 4;
CREATE TABLE snaps (v INT, id INT, a TEXT) AS VALUES (1, 1, 'x'), (1, 2, 'y'), (2, 1, 'z');
SELECT * FROM SNAPSHOTS (SELECT * FROM snaps) VERSION BY v KEYS (id)
  STORED AS SCD TYPE 2 AS r WHERE id = 2;
SELECT * FROM SNAPSHOTS (SELECT * FROM snaps) VERSION BY v KEYS (id) WITH CHANGES AS r
  WHERE id = 1 ORDER BY _change_type;
