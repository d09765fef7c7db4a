#!/usr/bin/env bash
# Side-by-side comparison: AUTO CDC flows of the release `autocdc` CLI against
# the same results computed by plain DataFusion SQL, DuckDB and Polars, each a
# whole process reading the same Parquet files. See benches/README.md.
#
#   benches/compare.sh [tiny|1m|10m] [--reps N] [--scenarios LIST] [--check] [--no-build]
#
#   tiny          20 k events / 4 k keys, 40 k-row snapshots (a smoke test)
#   1m (default)  1 M events / 200 k keys, 2 M-row snapshots
#   10m           10 M events / 2 M keys, 2 M-row snapshots
#   --reps N      repetitions of every measurement (default 3; tools alternate
#                 within each repetition; medians are reported)
#   --scenarios   comma-separated, from startup,scd1,scd2,snapshot,parallel,query,partial
#                 (default startup,scd1,scd2,snapshot; startup = the cost of
#                 starting each process; parallel = our SCD 1 on 1 core vs 2;
#                 query = SCD 1 and SCD 2 folded in a query, `SELECT count(*),
#                 sum(…) FROM AUTO CDC (…)`, against the peers' same aggregates:
#                 no target written by anyone; partial = our SCD 1 of partial
#                 events under IGNORE NULL UPDATES, with per-column sequencing
#                 and without)
#   --check       after timing, check that every tool computed the same result
#   --no-build    use the binaries already built
#
# Environment: AUTOCDC_BENCH_DIR (data and scratch, default /tmp/autocdc-compare),
# PEERS_VENV (Python venv with duckdb and polars, created if missing, default
# /tmp/peers-venv), CARGO_TARGET_DIR, SNAP_ROWS (snapshot rows, overrides the size's).
# Output: the markdown table on stdout, also saved as $AUTOCDC_BENCH_DIR/report-SIZE.md.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
SIZE=1m
REPS=3
SCENARIOS=startup,scd1,scd2,snapshot
CHECK=0
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        tiny | 1m | 10m) SIZE=$1 ;;
        --reps) REPS=$2; shift ;;
        --scenarios) SCENARIOS=$2; shift ;;
        --check) CHECK=1 ;;
        --no-build) BUILD=0 ;;
        -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$SIZE" in
    tiny) EVENTS=20000; KEYS=4000; DEFAULT_SNAP_ROWS=40000 ;;
    1m) EVENTS=1000000; KEYS=200000; DEFAULT_SNAP_ROWS=2000000 ;;
    10m) EVENTS=10000000; KEYS=2000000; DEFAULT_SNAP_ROWS=2000000 ;;
esac
SNAP_ROWS=${SNAP_ROWS:-$DEFAULT_SNAP_ROWS}
# the generator's default value columns
VALUES="i1, i2, s1, s2, d1"

WORK=${AUTOCDC_BENCH_DIR:-/tmp/autocdc-compare}
VENV=${PEERS_VENV:-/tmp/peers-venv}
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
AUTOCDC=$TARGET/release/autocdc
DATAGEN=$TARGET/release/autocdc-datagen
DATA=$WORK/data/$SIZE
RUN=$WORK/run
RESULTS=$WORK/results-$SIZE.tsv
PEERS=("$VENV/bin/python" "$REPO/benches/peers.py")
PEER_RUN=("${PEERS[@]}" run)

log() { echo "[compare] $*" >&2; }

# ---------------------------------------------------------------- setup

if [ "$BUILD" = 1 ]; then
    log "building the release CLI and generator"
    (cd "$REPO" && cargo build --release -p autocdc-cli -p autocdc-bench)
fi
for binary in "$AUTOCDC" "$DATAGEN"; do
    [ -x "$binary" ] || { echo "missing $binary (build without --no-build)" >&2; exit 1; }
done

if [ ! -x /usr/bin/time ]; then
    log "installing GNU time"
    apt-get install -y time >/dev/null || { apt-get update >/dev/null && apt-get install -y time >/dev/null; }
fi

if ! "$VENV/bin/python" -c 'import duckdb, polars' 2>/dev/null; then
    log "creating $VENV with duckdb and polars"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet duckdb polars
fi

mkdir -p "$DATA" "$RUN"
EVENTS_FILE=$DATA/events.parquet
SNAP1=$DATA/snapshot_1.parquet
SNAP2=$DATA/snapshot_2.parquet
if [ ! -f "$EVENTS_FILE" ]; then
    log "generating $EVENTS events over $KEYS keys"
    "$DATAGEN" events --out "$EVENTS_FILE.tmp" --events "$EVENTS" --keys "$KEYS" >&2
    mv "$EVENTS_FILE.tmp" "$EVENTS_FILE"
fi
if [ ! -f "$SNAP2" ] || [ "$(cat "$DATA/snapshot_rows" 2>/dev/null)" != "$SNAP_ROWS" ]; then
    log "generating two $SNAP_ROWS-row snapshots"
    "$DATAGEN" snapshots --out-dir "$DATA" --rows "$SNAP_ROWS" >&2
    echo "$SNAP_ROWS" >"$DATA/snapshot_rows"
fi
: >"$RESULTS"

# ---------------------------------------------------------------- measuring

# timed SCENARIO TOOL KIND REP CMD...: runs CMD under GNU time, appends
# "scenario tool kind rep wall_seconds maxrss_kib cpu_seconds" to the results
# (CPU = user + system, less sensitive than wall time to a busy machine); a
# failure stops the whole comparison with the command's output.
timed() {
    local scenario=$1 tool=$2 kind=$3 rep=$4
    shift 4
    local out=$RUN/output.log stats=$RUN/time.txt
    if ! /usr/bin/time -f '%e %M %U %S' -o "$stats" "$@" >"$out" 2>&1; then
        echo "FAILED: $scenario / $tool:" >&2
        tail -n 30 "$out" >&2
        exit 1
    fi
    local seconds rss user system cpu
    read -r seconds rss user system <"$stats"
    cpu=$(awk -v u="$user" -v s="$system" 'BEGIN { printf "%.2f", u + s }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" "$tool" "$kind" "$rep" "$seconds" "$rss" "$cpu" >>"$RESULTS"
    log "$scenario / $tool #$rep: ${seconds}s (CPU ${cpu}s), $((rss / 1024)) MB"
}

# fresh DIR: removes a warehouse folder before a run (untimed).
fresh() { rm -rf "$1"; }

events_table="CREATE EXTERNAL TABLE events STORED AS PARQUET LOCATION '$EVENTS_FILE'"
scd1_flow="CREATE STREAMING TABLE t;
CREATE FLOW f AS AUTO CDC INTO t FROM events KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq
  COLUMNS * EXCEPT (op) STORED AS SCD TYPE 1"
scd2_flow="CREATE STREAMING TABLE t;
CREATE FLOW f AS AUTO CDC INTO t FROM events KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq
  COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2"
df_scd1="COPY (SELECT id, seq, $VALUES FROM (
    SELECT *, row_number() OVER (PARTITION BY id ORDER BY seq DESC) AS rn FROM events)
  WHERE rn = 1 AND op <> 'D') TO '$RUN/df_scd1.parquet' STORED AS PARQUET"
df_floor="COPY (SELECT id, max(seq) AS seq FROM events GROUP BY id)
  TO '$RUN/df_floor.parquet' STORED AS PARQUET"
# (replays are exact copies: `__end_at IS DISTINCT FROM seq` keeps one of them)
df_scd2="COPY (SELECT id, $VALUES, seq AS __start_at, __end_at FROM (
    SELECT *, lead(seq) OVER (PARTITION BY id ORDER BY seq) AS __end_at FROM events)
  WHERE op <> 'D' AND __end_at IS DISTINCT FROM seq) TO '$RUN/df_scd2.parquet' STORED AS PARQUET"
snap_changed=""
for column in ${VALUES//,/}; do
    snap_changed+=" OR (o.$column IS DISTINCT FROM n.$column)"
done
df_snapdiff="CREATE EXTERNAL TABLE s1 STORED AS PARQUET LOCATION '$SNAP1';
CREATE EXTERNAL TABLE s2 STORED AS PARQUET LOCATION '$SNAP2';
COPY (SELECT coalesce(n.id, o.id) AS id, $(echo "$VALUES" | sed 's/\([a-z0-9]*\)/n.\1/g'),
    CASE WHEN o.id IS NULL THEN 'insert' WHEN n.id IS NULL THEN 'delete' ELSE 'update' END AS _change_type
  FROM s1 o FULL OUTER JOIN s2 n ON o.id = n.id
  WHERE o.id IS NULL OR n.id IS NULL$snap_changed) TO '$RUN/df_snapdiff.parquet' STORED AS PARQUET"
# AUTO CDC in a query: the fold's rows aggregated, nothing stored
query_scd1="COPY (SELECT count(*) AS n, CAST(sum(seq) AS BIGINT) AS s FROM AUTO CDC (SELECT * FROM events)
  KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op) AS t)
  TO '$RUN/ours_qscd1.parquet' STORED AS PARQUET"
query_scd2="COPY (SELECT count(*) AS n, CAST(sum(__start_at) AS BIGINT) AS s, CAST(sum(__end_at) AS BIGINT) AS e
  FROM AUTO CDC (SELECT * FROM events) KEYS (id) APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq
  COLUMNS * EXCEPT (op, seq) STORED AS SCD TYPE 2 AS t) TO '$RUN/ours_qscd2.parquet' STORED AS PARQUET"
# partial events: two services, each writing its own columns (even
# sequences the numbers, odd ones the strings), folded under IGNORE NULL UPDATES
partial_events="CREATE VIEW partial AS SELECT id, seq, op,
  CASE WHEN seq % 2 = 0 THEN i1 END AS i1, CASE WHEN seq % 2 = 0 THEN i2 END AS i2,
  CASE WHEN seq % 2 = 1 THEN s1 END AS s1, CASE WHEN seq % 2 = 1 THEN s2 END AS s2,
  CASE WHEN seq % 2 = 0 THEN d1 END AS d1 FROM events"
partial_flow() {
    echo "CREATE STREAMING TABLE t $1;
CREATE FLOW f AS AUTO CDC INTO t FROM partial KEYS (id) IGNORE NULL UPDATES
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op) STORED AS SCD TYPE 1"
}
snap_first="CREATE EXTERNAL TABLE snap STORED AS PARQUET LOCATION '$SNAP1';
CREATE STREAMING TABLE t;
CREATE FLOW f AS AUTO CDC INTO t FROM SNAPSHOT (SELECT * FROM snap) KEYS (id) STORED AS SCD TYPE 1"
snap_second="CREATE EXTERNAL TABLE snap STORED AS PARQUET LOCATION '$SNAP2';
REFRESH STREAMING TABLE t"

run_startup() {
    local rep=$1
    fresh "$RUN/wh-df"
    timed startup "autocdc (open a warehouse, SELECT 1)" info "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh-df" -c "SELECT 1"
    timed startup "python + import duckdb" info "$rep" "$VENV/bin/python" -c "import duckdb"
    timed startup "python + import polars" info "$rep" "$VENV/bin/python" -c "import polars"
}

run_scd1() {
    local rep=$1
    fresh "$RUN/wh"
    timed scd1 "ours (AUTO CDC flow, Delta target)" ours "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh" -c "$events_table; $scd1_flow"
    fresh "$RUN/wh-df"
    timed scd1 "DataFusion SQL (row_number)" peer "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh-df" -c "$events_table; $df_scd1"
    timed scd1 "DuckDB (QUALIFY seq = max(seq) OVER id)" peer "$rep" \
        "${PEER_RUN[@]}" duckdb scd1 --events "$EVENTS_FILE" --out "$RUN/duckdb_scd1.parquet"
    timed scd1 "Polars (seq == max(seq).over(id))" peer "$rep" \
        "${PEER_RUN[@]}" polars scd1 --events "$EVENTS_FILE" --out "$RUN/polars_scd1.parquet"
    timed scd1 "floor: DataFusion max(seq) GROUP BY id" floor "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh-df" -c "$events_table; $df_floor"
    timed scd1 "floor: DuckDB max(seq) GROUP BY id" floor "$rep" \
        "${PEER_RUN[@]}" duckdb floor --events "$EVENTS_FILE" --out "$RUN/duckdb_floor.parquet"
    timed scd1 "floor: Polars max(seq) GROUP BY id" floor "$rep" \
        "${PEER_RUN[@]}" polars floor --events "$EVENTS_FILE" --out "$RUN/polars_floor.parquet"
}

run_scd2() {
    local rep=$1
    fresh "$RUN/wh2"
    timed scd2 "ours (AUTO CDC flow, Delta target)" ours "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh2" -c "$events_table; $scd2_flow"
    fresh "$RUN/wh-df"
    timed scd2 "DataFusion SQL (lead)" peer "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh-df" -c "$events_table; $df_scd2"
    timed scd2 "DuckDB (lead)" peer "$rep" \
        "${PEER_RUN[@]}" duckdb scd2 --events "$EVENTS_FILE" --out "$RUN/duckdb_scd2.parquet"
    timed scd2 "Polars (sort + shift)" peer "$rep" \
        "${PEER_RUN[@]}" polars scd2 --events "$EVENTS_FILE" --out "$RUN/polars_scd2.parquet"
}

run_snapshot() {
    local rep=$1
    fresh "$RUN/wh3"
    # the first snapshot loads the target (timed for information); the second,
    # in a process of its own, is the diff that is compared
    timed snapshot "ours: first snapshot (load, not compared)" info "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh3" -c "$snap_first"
    timed snapshot "ours (second snapshot's update)" ours "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh3" -c "$snap_second"
    fresh "$RUN/wh-df"
    timed snapshot "DataFusion SQL (FULL OUTER JOIN)" peer "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh-df" -c "$df_snapdiff"
    timed snapshot "DuckDB (FULL OUTER JOIN)" peer "$rep" \
        "${PEER_RUN[@]}" duckdb snapdiff --snap1 "$SNAP1" --snap2 "$SNAP2" --out "$RUN/duckdb_snapdiff.parquet"
    timed snapshot "Polars (full join)" peer "$rep" \
        "${PEER_RUN[@]}" polars snapdiff --snap1 "$SNAP1" --snap2 "$SNAP2" --out "$RUN/polars_snapdiff.parquet"
}

run_parallel() {
    local rep=$1
    fresh "$RUN/wh-p"
    timed "parallel: scd1" "ours, 1 core (taskset -c 0, target_partitions 1)" ours "$rep" \
        taskset -c 0 "$AUTOCDC" --warehouse "$RUN/wh-p" \
        -c "SET datafusion.execution.target_partitions = 1; $events_table; $scd1_flow"
    fresh "$RUN/wh-p"
    timed "parallel: scd1" "ours, 2 cores (taskset -c 0,1, target_partitions 2)" ours "$rep" \
        taskset -c 0,1 "$AUTOCDC" --warehouse "$RUN/wh-p" \
        -c "SET datafusion.execution.target_partitions = 2; $events_table; $scd1_flow"
}

run_partial() {
    local rep=$1
    fresh "$RUN/wh-pw"
    timed partial "ours, whole-row sequencing" ours "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh-pw" -c "$events_table; $partial_events; $(partial_flow '')"
    fresh "$RUN/wh-pc"
    timed partial "ours, per-column sequencing" ours "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh-pc" -c "$events_table; $partial_events;
        $(partial_flow "TBLPROPERTIES ('autocdc.sequencePerColumn' = 'true')")"
}

run_query() {
    local rep=$1
    fresh "$RUN/wh-q"
    timed "query: scd1" "ours (SELECT … FROM AUTO CDC (…))" ours "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh-q" -c "$events_table; $query_scd1"
    timed "query: scd1" "DuckDB (QUALIFY seq = max(seq) OVER id)" peer "$rep" \
        "${PEER_RUN[@]}" duckdb qscd1 --events "$EVENTS_FILE" --out "$RUN/duckdb_qscd1.parquet"
    timed "query: scd1" "Polars (seq == max(seq).over(id))" peer "$rep" \
        "${PEER_RUN[@]}" polars qscd1 --events "$EVENTS_FILE" --out "$RUN/polars_qscd1.parquet"
    timed "query: scd2" "ours (SELECT … FROM AUTO CDC (…) STORED AS SCD TYPE 2)" ours "$rep" \
        "$AUTOCDC" --warehouse "$RUN/wh-q" -c "$events_table; $query_scd2"
    timed "query: scd2" "DuckDB (lead)" peer "$rep" \
        "${PEER_RUN[@]}" duckdb qscd2 --events "$EVENTS_FILE" --out "$RUN/duckdb_qscd2.parquet"
    timed "query: scd2" "Polars (sort + shift)" peer "$rep" \
        "${PEER_RUN[@]}" polars qscd2 --events "$EVENTS_FILE" --out "$RUN/polars_qscd2.parquet"
}

# check_results SCENARIO: exports our target and compares every tool's result
# with it (run after the scenario's last repetition); non-zero on a difference.
check_results() {
    local rc=0
    case "$1" in
        query)
            for task in qscd1 qscd2; do
                "${PEERS[@]}" check "$task" "$RUN/ours_$task.parquet" \
                    "$RUN/duckdb_$task.parquet" "$RUN/polars_$task.parquet" || rc=1
            done
            ;;
        scd1)
            "$AUTOCDC" --warehouse "$RUN/wh" -c "COPY (SELECT * FROM t) TO '$RUN/ours_scd1.parquet' STORED AS PARQUET" >/dev/null || rc=1
            "${PEERS[@]}" check scd1 "$RUN/ours_scd1.parquet" \
                "$RUN/df_scd1.parquet" "$RUN/duckdb_scd1.parquet" "$RUN/polars_scd1.parquet" || rc=1
            ;;
        scd2)
            "$AUTOCDC" --warehouse "$RUN/wh2" -c "COPY (SELECT * FROM t) TO '$RUN/ours_scd2.parquet' STORED AS PARQUET" >/dev/null || rc=1
            "${PEERS[@]}" check scd2 "$RUN/ours_scd2.parquet" \
                "$RUN/df_scd2.parquet" "$RUN/duckdb_scd2.parquet" "$RUN/polars_scd2.parquet" || rc=1
            ;;
        partial)
            # one update folds every event in sequence order: both agree
            for wh in pw pc; do
                "$AUTOCDC" --warehouse "$RUN/wh-$wh" -c "COPY (SELECT * FROM t) TO '$RUN/ours_partial_$wh.parquet' STORED AS PARQUET" >/dev/null || rc=1
            done
            local differ
            differ=$("$AUTOCDC" --warehouse "$RUN/wh-df" -q --format csv -c "
                CREATE EXTERNAL TABLE pw STORED AS PARQUET LOCATION '$RUN/ours_partial_pw.parquet';
                CREATE EXTERNAL TABLE pc STORED AS PARQUET LOCATION '$RUN/ours_partial_pc.parquet';
                SELECT (SELECT count(*) FROM (SELECT * FROM pw EXCEPT ALL SELECT * FROM pc))
                     + (SELECT count(*) FROM (SELECT * FROM pc EXCEPT ALL SELECT * FROM pw)) AS n" | tail -n 1)
            log "partial: rows that differ between the two targets: $differ"
            [ "$differ" = 0 ] || rc=1
            ;;
        snapshot)
            "$AUTOCDC" --warehouse "$RUN/wh3" -c "COPY (SELECT * FROM t) TO '$RUN/ours_snapshot.parquet' STORED AS PARQUET;
                COPY (SELECT id, _change_type, _commit_version FROM table_changes('t', 0))
                TO '$RUN/ours_snapdiff.parquet' STORED AS PARQUET" >/dev/null || rc=1
            # the target equals the second snapshot; its last commit's change feed is the diff
            "${PEERS[@]}" check snapshot "$SNAP2" "$RUN/ours_snapshot.parquet" || rc=1
            "${PEERS[@]}" check snapdiff "$RUN/ours_snapdiff.parquet" \
                "$RUN/df_snapdiff.parquet" "$RUN/duckdb_snapdiff.parquet" "$RUN/polars_snapdiff.parquet" || rc=1
            ;;
    esac
    return "$rc"
}

IFS=',' read -r -a scenario_list <<<"$SCENARIOS"
failed=0
for scenario in "${scenario_list[@]}"; do
    case "$scenario" in
        startup | scd1 | scd2 | snapshot | parallel | query | partial) ;;
        *) echo "unknown scenario: $scenario" >&2; exit 2 ;;
    esac
    for rep in $(seq 1 "$REPS"); do
        "run_$scenario" "$rep"
    done
    if [ "$CHECK" = 1 ]; then
        check_results "$scenario" || failed=1
    fi
done

report=$WORK/report-$SIZE.md
{
    echo "Size $SIZE: $EVENTS events over $KEYS keys, snapshots of $SNAP_ROWS rows;" \
        "$REPS repetitions; $(date -u +%Y-%m-%d); $(nproc) cores;" \
        "$("$VENV/bin/python" -c 'import duckdb, polars; print(f"DuckDB {duckdb.__version__}, Polars {polars.__version__}")');" \
        "commit $(git -C "$REPO" rev-parse --short HEAD)"
    echo
    "${PEERS[@]}" report "$RESULTS"
} >"$report"
cat "$report"
if [ "$failed" = 1 ]; then
    echo "some results differ (see the check lines above)" >&2
    exit 1
fi
