#!/usr/bin/env bash
# Debezium change feed into an SCD 1 table: the release `autocdc` CLI reading a
# folder of Debezium JSON change events (PostgreSQL connector shape, written by
# `autocdc-datagen debezium`: snapshot reads, creates, updates, deletes and
# primary-key changes, in files named out of history order) against DuckDB and
# Polars doing the same by hand (benches/peers.py, task dbz1). Each tool is a
# whole process reading the same files; medians of the repetitions.
#
#   benches/debezium.sh [--events N] [--keys K] [--key-changes F] [--files F]
#                       [--schema] [--reps N] [--peers-only] [--check] [--no-build]
#
#   --events N        change events after the snapshot (default 10 000 000)
#   --keys K          keys; the snapshot reads K / 2 of them (default 2 000 000)
#   --key-changes F   share of events that change a primary key (default 0.001)
#   --files F         JSON files (default 16)
#   --schema          lines with the JSON converter's schema envelope (about 7x
#                     the bytes: some 35 GB at the default size); default: payload only
#   --reps N          repetitions (default 3; tools alternate within each)
#   --peers-only      time DuckDB and Polars only
#   --check           after timing, check that every tool computed the same rows
#   --no-build        use the binaries already built
#
# Ours runs, on a fresh warehouse each time:
#   CREATE STREAMING TABLE t; CREATE FLOW f AS AUTO CDC INTO t
#     FROM debezium('<dir>/') KEYS (id) STORED AS SCD TYPE 1;
# When it fails, the table says "ours: failed (see log)" and the peers go on.
#
# Environment: AUTOCDC_BENCH_DIR (data and scratch, default /tmp/autocdc-debezium;
# the events are generated once per size), PEERS_VENV (Python venv with duckdb
# and polars, created if missing, default /tmp/peers-venv), CARGO_TARGET_DIR.
# Output: the markdown table on stdout, also saved as $AUTOCDC_BENCH_DIR/report-debezium.md.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
EVENTS=10000000
KEYS=2000000
KEY_CHANGES=0.001
FILES=16
SCHEMA=0
REPS=3
PEERS_ONLY=0
CHECK=0
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --events) EVENTS=$2; shift ;;
        --keys) KEYS=$2; shift ;;
        --key-changes) KEY_CHANGES=$2; shift ;;
        --files) FILES=$2; shift ;;
        --schema) SCHEMA=1 ;;
        --reps) REPS=$2; shift ;;
        --peers-only) PEERS_ONLY=1 ;;
        --check) CHECK=1 ;;
        --no-build) BUILD=0 ;;
        -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

WORK=${AUTOCDC_BENCH_DIR:-/tmp/autocdc-debezium}
VENV=${PEERS_VENV:-/tmp/peers-venv}
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
AUTOCDC=$TARGET/release/autocdc
DATAGEN=$TARGET/release/autocdc-datagen
NAME=e$EVENTS-k$KEYS-kc$KEY_CHANGES-f$FILES$([ "$SCHEMA" = 1 ] && echo -schema || true)
DATA=$WORK/data/$NAME
RUN=$WORK/run
RESULTS=$WORK/results-debezium.tsv
OURS_LOG=$RUN/ours.log
PEERS=("$VENV/bin/python" "$REPO/benches/peers.py")
PEER_RUN=("${PEERS[@]}" run)

log() { echo "[debezium] $*" >&2; }

# ---------------------------------------------------------------- setup

if [ "$BUILD" = 1 ]; then
    if [ "$PEERS_ONLY" = 1 ]; then
        log "building the release generator"
        (cd "$REPO" && cargo build --release -p autocdc-bench)
    else
        log "building the release CLI and generator"
        (cd "$REPO" && cargo build --release -p autocdc-cli -p autocdc-bench)
    fi
fi
binaries=("$DATAGEN")
[ "$PEERS_ONLY" = 1 ] || binaries+=("$AUTOCDC")
for binary in "${binaries[@]}"; do
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

mkdir -p "$RUN"
if [ ! -f "$DATA/.complete" ]; then
    log "generating $EVENTS Debezium events over $KEYS keys into $DATA"
    rm -rf "$DATA"
    schema_flag=()
    [ "$SCHEMA" = 1 ] || schema_flag=(--no-schema)
    "$DATAGEN" debezium --out-dir "$DATA" --events "$EVENTS" --keys "$KEYS" \
        --key-changes "$KEY_CHANGES" --files "$FILES" "${schema_flag[@]}" >&2
    touch "$DATA/.complete"
fi
: >"$RESULTS"

# ---------------------------------------------------------------- measuring

# timed TOOL KIND REP CMD...: runs CMD under GNU time and appends
# "scenario tool kind rep wall_seconds maxrss_kib cpu_seconds" to the results;
# returns non-zero (results untouched) when CMD fails, its output in $RUN/TOOL.log.
timed() {
    local tool=$1 kind=$2 rep=$3
    shift 3
    local out=$RUN/${tool%% *}.log stats=$RUN/time.txt
    if ! /usr/bin/time -f '%e %M %U %S' -o "$stats" "$@" >"$out" 2>&1; then
        log "dbz1 / $tool #$rep FAILED:"
        tail -n 5 "$out" | sed 's/^/    /' >&2
        return 1
    fi
    local seconds rss user system cpu
    read -r seconds rss user system <"$stats"
    cpu=$(awk -v u="$user" -v s="$system" 'BEGIN { printf "%.2f", u + s }')
    printf 'dbz1\t%s\t%s\t%s\t%s\t%s\t%s\n' "$tool" "$kind" "$rep" "$seconds" "$rss" "$cpu" >>"$RESULTS"
    log "dbz1 / $tool #$rep: ${seconds}s (CPU ${cpu}s), $((rss / 1024)) MB"
}

OURS_TOOL="ours (AUTO CDC flow from debezium(), Delta target)"
ours_flow="CREATE STREAMING TABLE t;
CREATE FLOW f AS AUTO CDC INTO t FROM debezium('$DATA/') KEYS (id) STORED AS SCD TYPE 1;"
ours_ok=1
[ "$PEERS_ONLY" = 1 ] && ours_ok=0

for rep in $(seq 1 "$REPS"); do
    if [ "$PEERS_ONLY" = 0 ] && [ "$ours_ok" = 1 ]; then
        rm -rf "$RUN/wh"
        if ! timed "$OURS_TOOL" ours "$rep" "$AUTOCDC" --warehouse "$RUN/wh" -c "$ours_flow"; then
            # (one failure is enough: the later repetitions time the peers only)
            ours_ok=failed
        fi
    fi
    timed "DuckDB (read_json + QUALIFY lsn = max(lsn) OVER id)" peer "$rep" \
        "${PEER_RUN[@]}" duckdb dbz1 --events "$DATA" --out "$RUN/duckdb_dbz1.parquet" || exit 1
    timed "Polars (scan_ndjson + lsn == max(lsn).over(id))" peer "$rep" \
        "${PEER_RUN[@]}" polars dbz1 --events "$DATA" --out "$RUN/polars_dbz1.parquet" || exit 1
done

failed=0
if [ "$CHECK" = 1 ]; then
    if [ "$ours_ok" = 1 ]; then
        # payload only, the events carry no types: our columns are the JSON
        # values (amount as base64 text, updated_at µs, day days), which the
        # export converts where SQL can (amount is not compared then)
        if [ "$SCHEMA" = 1 ]; then
            COLS="id, name, amount, updated_at, day"
        else
            COLS="id, name, amount AS amount_base64, to_timestamp_micros(updated_at) AS updated_at, CAST(day AS DATE) AS day"
        fi
        if "$AUTOCDC" --warehouse "$RUN/wh" -q -c "COPY (SELECT $COLS FROM t)
            TO '$RUN/ours_dbz1.parquet' STORED AS PARQUET" >/dev/null 2>"$RUN/export.log"; then
            "${PEERS[@]}" check dbz1 "$RUN/ours_dbz1.parquet" \
                "$RUN/duckdb_dbz1.parquet" "$RUN/polars_dbz1.parquet" || failed=1
        else
            log "cannot export our target (see $RUN/export.log)"
            failed=1
        fi
    else
        "${PEERS[@]}" check dbz1 "$RUN/duckdb_dbz1.parquet" "$RUN/polars_dbz1.parquet" || failed=1
    fi
fi

report=$WORK/report-debezium.md
{
    echo "Debezium JSON ($([ "$SCHEMA" = 1 ] && echo "schema envelope" || echo "payload only")):" \
        "$EVENTS change events over $KEYS keys (snapshot of $((KEYS / 2)))," \
        "key changes $KEY_CHANGES, $FILES files, $(du -sh "$DATA" | cut -f1);" \
        "$REPS repetitions; $(date -u +%Y-%m-%d); $(nproc) cores;" \
        "$("$VENV/bin/python" -c 'import duckdb, polars; print(f"DuckDB {duckdb.__version__}, Polars {polars.__version__}")');" \
        "commit $(git -C "$REPO" rev-parse --short HEAD)"
    echo
    "${PEERS[@]}" report "$RESULTS"
    case "$ours_ok" in
        0) echo "* ours: not run (--peers-only)" ;;
        failed) echo "* ours: failed (see log: $OURS_LOG)" ;;
    esac
} >"$report"
cat "$report"
if [ "$failed" = 1 ]; then
    echo "some results differ (see the check lines above)" >&2
    exit 1
fi
