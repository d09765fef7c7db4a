#!/usr/bin/env bash
# Incremental cost of an SCD 1 update (benches/README.md, "Incremental cost"):
# load EVENTS events over KEYS keys into a fresh local Delta target, then, in a
# new process, refresh it with CHANGE new events (later sequences, random keys)
# added to the source folder as a second file. The flow's Parquet-folder
# source reads only that new file. Prints both times, the ratio, and what the
# update did to the data files: new files written, old files kept with a
# deletion vector (their superseded rows marked, nothing rewritten), old files
# removed (rewritten), out of the table's total.
#
#   benches/incremental.sh [--events N] [--keys K] [--change C] [--reps R]
#                          [--compression zstd|lz4|snappy] [--no-build]
#
# Defaults: 10 000 000 events, 2 000 000 keys, 100 000 changed events, 3 reps,
# the target's default codec ('autocdc.compression').
# Environment: AUTOCDC_BENCH_DIR (scratch, default /tmp/autocdc-compare),
# CARGO_TARGET_DIR.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
EVENTS=10000000
KEYS=2000000
CHANGE=100000
REPS=3
COMPRESSION=
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --events) EVENTS=$2; shift ;;
        --keys) KEYS=$2; shift ;;
        --change) CHANGE=$2; shift ;;
        --reps) REPS=$2; shift ;;
        --compression) COMPRESSION=$2; shift ;;
        --no-build) BUILD=0 ;;
        -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

WORK=${AUTOCDC_BENCH_DIR:-/tmp/autocdc-compare}/incremental
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
AUTOCDC=$TARGET/release/autocdc
DATAGEN=$TARGET/release/autocdc-datagen
if [ "$BUILD" = 1 ]; then
    (cd "$REPO" && cargo build --release -p autocdc-cli -p autocdc-bench)
fi
command -v /usr/bin/time >/dev/null || { apt-get install -y time >/dev/null; }

DATA=$WORK/data-$EVENTS-$KEYS-$CHANGE
mkdir -p "$DATA"
if [ ! -f "$DATA/load.parquet" ] || [ ! -f "$DATA/change.parquet" ]; then
    "$DATAGEN" events --out "$DATA/load.parquet" --events "$EVENTS" --keys "$KEYS" --seed 42
    # the change: fresh events whose sequences follow the load's
    "$DATAGEN" events --out "$DATA/change-raw.parquet" --events "$CHANGE" --keys "$KEYS" \
        --seed 4242 --replay-fraction 0 --late-fraction 0
    # (no Arrow schema in the file: its strings would be typed Utf8View, the
    # load's Utf8, and the folder's schema would not merge)
    "$AUTOCDC" --warehouse "$DATA/scratch" -c "SET datafusion.execution.parquet.skip_arrow_metadata = true;
        CREATE EXTERNAL TABLE raw STORED AS PARQUET
        LOCATION '$DATA/change-raw.parquet'; COPY (SELECT id, seq + $EVENTS AS seq, op,
        i1, i2, s1, s2, d1 FROM raw) TO '$DATA/change.parquet' STORED AS PARQUET" >/dev/null
fi

properties=""
if [ -n "$COMPRESSION" ]; then
    properties=" TBLPROPERTIES ('autocdc.compression' = '$COMPRESSION')"
fi
flow="CREATE STREAMING TABLE t$properties;
CREATE FLOW f AS AUTO CDC INTO t FROM events KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op) STORED AS SCD TYPE 1"

# seconds of a command (wall), its output in $WORK/last.out
timed() {
    /usr/bin/time -f "%e %M" -o "$WORK/time" "$@" >"$WORK/last.out" 2>&1 || {
        cat "$WORK/last.out" >&2
        exit 1
    }
    read -r seconds rss <"$WORK/time"
    echo "$seconds $rss"
}

printf '| rep | load s | update s | update / load | data files: new / kept with a deletion vector / removed / total before | update peak RSS MB |\n|---|---:|---:|---:|---:|---:|\n'
for rep in $(seq 1 "$REPS"); do
    rm -rf "$WORK/src" "$WORK/wh"
    mkdir -p "$WORK/src"
    ln -s "$DATA/load.parquet" "$WORK/src/1-load.parquet"
    events="CREATE EXTERNAL TABLE events STORED AS PARQUET LOCATION '$WORK/src/'"
    read -r load _ < <(timed "$AUTOCDC" --warehouse "$WORK/wh" -c "$events; $flow")
    total=$(find "$WORK/wh" -path '*_change_data*' -prune -o -name '*.parquet' -print | wc -l)
    ln -s "$DATA/change.parquet" "$WORK/src/2-change.parquet"
    read -r update rss < <(timed "$AUTOCDC" --warehouse "$WORK/wh" -c "$events;
        EXPLAIN ANALYZE REFRESH STREAMING TABLE t")
    written=$(grep -o 'num_files_written=[0-9]*' "$WORK/last.out" | head -1 | cut -d= -f2)
    # the update's commit to the state store: files re-added with a
    # deletion vector, files removed
    commit=$(ls "$WORK/wh/public/t/_autocdc/state/_delta_log/"*.json | sort | tail -1)
    vectors=$(grep -c '"deletionVector":{' "$commit" || true)
    removed=$(( $(grep -c '"remove":' "$commit" || true) - vectors ))
    input=$(grep -o 'num_input_rows=[0-9.]* *[KM]*' "$WORK/last.out" | head -1)
    ratio=$(awk -v u="$update" -v l="$load" 'BEGIN { printf "%.2f", u / l }')
    printf '| %s | %s | %s | %s | %s / %s / %s / %s | %s |\n' "$rep" "$load" "$update" "$ratio" \
        "$written" "$vectors" "$removed" "$total" "$((rss / 1024))"
    echo "rep $rep: update read $input" >&2
done
