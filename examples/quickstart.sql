-- Quickstart: the documented AUTO CDC example on a local warehouse.
-- Run it with: cargo run -p autocdc-cli --bin autocdc -- -f examples/quickstart.sql

-- A change feed. Any table, view or query DataFusion can read works as a source:
-- CSV/Parquet files via CREATE EXTERNAL TABLE, Delta tables, other streaming tables.
CREATE OR REPLACE TABLE users_cdf (userId INT, name TEXT, city TEXT, operation TEXT, sequenceNum INT) AS VALUES
  (124, 'Raul', 'Oaxaca', 'INSERT', 1),
  (123, 'Isabel', 'Monterrey', 'INSERT', 1),
  (125, 'Mercedes', 'Tijuana', 'INSERT', 2),
  (126, 'Lily', 'Cancun', 'INSERT', 2),
  (123, NULL, NULL, 'DELETE', 6),
  (125, 'Mercedes', 'Guadalajara', 'UPDATE', 6),
  (125, 'Mercedes', 'Mexicali', 'UPDATE', 5),
  (123, 'Isabel', 'Chihuahua', 'UPDATE', 5);

-- Start from a clean target so the script can be run again.
DROP STREAMING TABLE IF EXISTS users;

CREATE OR REFRESH STREAMING TABLE users;

-- Creating a flow runs its first update; the result row holds its metrics.
CREATE FLOW users_flow AS AUTO CDC INTO users
FROM users_cdf
KEYS (userId)
APPLY AS DELETE WHEN operation = 'DELETE'
SEQUENCE BY sequenceNum
COLUMNS * EXCEPT (operation, sequenceNum)
STORED AS SCD TYPE 1;

SELECT * FROM users ORDER BY userid;

-- New changes arrive, one of them late (sequence 4 < 6): REFRESH applies the rest.
INSERT INTO users_cdf VALUES (126, 'Lily', 'Merida', 'UPDATE', 7), (125, 'Mercedes', 'Late', 'UPDATE', 4);

REFRESH STREAMING TABLE users;

SELECT * FROM users ORDER BY userid;

-- The target's change data feed: what each update changed.
SELECT userid, name, city, _change_type, _commit_version
FROM table_changes('users', 0) ORDER BY _commit_version, userid, _change_type DESC;

-- The next update's plan, drawn as a tree (EXPLAIN FORMAT indent … indents it):
-- EXPLAIN REFRESH STREAMING TABLE users;
