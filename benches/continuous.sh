#!/usr/bin/env bash
# Continuous mode latency (benches/README.md, "Continuous mode"): an SCD 1
# target of KEYS keys reading a Parquet folder is kept up to date by
# `autocdc run --continuous` while small files land in the folder at RATE
# events per second (FILES files per second) for SECONDS seconds. Prints, per
# landed file, the latency from its landing (its modification time) to the
# commit of the update that applied it — median, p90, p99 and max — and the
# CPU time the engine spent per event while files landed.
#
#   benches/continuous.sh [--keys K] [--rate R] [--files F] [--seconds S]
#                         [--interval 200ms] [--set 'SET autocdc.x = y'] [--no-build]
#
# Defaults: 2 000 000 keys, 1 000 events/s as 10 files/s, 60 s, 200ms.
# Environment: AUTOCDC_BENCH_DIR (scratch, default /tmp/autocdc-compare),
# CARGO_TARGET_DIR, AUTOCDC_PROFILE (default release; `debug` tries the
# script on the dev build with --no-build).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
KEYS=2000000
RATE=1000
FILES=10
SECONDS_=60
INTERVAL=200ms
BUILD=1
SETTINGS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --keys) KEYS=$2; shift ;;
        --rate) RATE=$2; shift ;;
        --files) FILES=$2; shift ;;
        --seconds) SECONDS_=$2; shift ;;
        --interval) INTERVAL=$2; shift ;;
        --set) SETTINGS+="$2;"$'\n'; shift ;;
        --no-build) BUILD=0 ;;
        -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

WORK=${AUTOCDC_BENCH_DIR:-/tmp/autocdc-compare}/continuous
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
PROFILE=${AUTOCDC_PROFILE:-release}
AUTOCDC=$TARGET/$PROFILE/autocdc
DATAGEN=$TARGET/$PROFILE/autocdc-datagen
if [ "$BUILD" = 1 ]; then
    (cd "$REPO" && cargo build --release -p autocdc-cli -p autocdc-bench)
fi

EVENTS=$((RATE * SECONDS_))
PER_FILE=$((RATE / FILES))
NFILES=$((FILES * SECONDS_))
DATA=$WORK/data-$KEYS-$EVENTS-$PER_FILE
mkdir -p "$DATA"
if [ ! -f "$DATA/load.parquet" ] || [ ! -d "$DATA/stage" ]; then
    rm -rf "$DATA/stage"
    # the load: one event per key
    "$DATAGEN" events --out "$DATA/load.parquet" --events "$KEYS" --keys "$KEYS" \
        --seed 42 --delete-fraction 0 --late-fraction 0 --replay-fraction 0
    # the stream: later sequences, random keys, split into small files
    # (no Arrow schema in the files, as in the load, so the folder's schemas merge)
    "$DATAGEN" events --out "$DATA/stream-raw.parquet" --events "$EVENTS" --keys "$KEYS" \
        --seed 4242 --replay-fraction 0 --late-fraction 0
    "$AUTOCDC" --warehouse "$DATA/scratch" -q -c "SET datafusion.execution.parquet.skip_arrow_metadata = true;
        CREATE EXTERNAL TABLE raw STORED AS PARQUET LOCATION '$DATA/stream-raw.parquet';
        COPY (SELECT id, seq + $KEYS AS seq, op, i1, i2, s1, s2, d1,
                CAST((row_number() OVER (ORDER BY seq)) - 1 AS BIGINT) / $PER_FILE AS part FROM raw)
        TO '$DATA/stage/' STORED AS PARQUET PARTITIONED BY (part)" >/dev/null
    rm -rf "$DATA/scratch"
fi

rm -rf "$WORK/run"
mkdir -p "$WORK/run/feed" "$WORK/run/stage"
cp "$DATA/load.parquet" "$WORK/run/feed/0-load.parquet"
cp -r "$DATA/stage/." "$WORK/run/stage/"
cat >"$WORK/run/defs.sql" <<EOF
$SETTINGS
CREATE EXTERNAL TABLE events STORED AS PARQUET LOCATION '$WORK/run/feed/';
CREATE STREAMING TABLE t;
CREATE FLOW f AS AUTO CDC INTO t FROM events KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op) STORED AS SCD TYPE 1;
EOF
WH=$WORK/run/wh
# the load, in a run of its own
start=$(date +%s.%N)
"$AUTOCDC" --warehouse "$WH" run -q -f "$WORK/run/defs.sql" >/dev/null
echo "load of $KEYS keys: $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s" >&2

# the continuous run, and the files landing while it runs
"$AUTOCDC" --warehouse "$WH" run -q -f "$WORK/run/defs.sql" --continuous \
    --trigger-interval "$INTERVAL" 2>"$WORK/run/cycles.log" >/dev/null &
engine=$!
sleep 3
cpu() { awk '{ print $14 + $15 }' "/proc/$engine/stat"; }
cpu_before=$(cpu)
python3 "$REPO/benches/land_files.py" "$WORK/run/stage" "$WORK/run/feed" "$FILES" "$NFILES" \
    >"$WORK/run/landed.csv"
cpu_after=$(cpu)
# the last files' update, then a clean stop
sleep 5
kill -TERM "$engine"
wait "$engine"

"$AUTOCDC" --warehouse "$WH" --format csv -q -c "SELECT CAST(commit_timestamp AS BIGINT) AS committed,
    CAST(newest_input_at AS BIGINT) AS newest FROM event_log('t')
    WHERE newest_input_at IS NOT NULL ORDER BY commit_version" >"$WORK/run/commits.csv"
python3 - "$WORK/run/landed.csv" "$WORK/run/commits.csv" "$EVENTS" \
    "$((cpu_after - cpu_before))" "$(getconf CLK_TCK)" "$KEYS" "$RATE" "$FILES" "$INTERVAL" <<'EOF'
import csv, statistics, sys

landed_csv, commits_csv, events, ticks, hz, keys, rate, files, interval = sys.argv[1:]
landed = [int(r["landed_ms"]) for r in csv.DictReader(open(landed_csv))]
commits = [(int(r["newest"]), int(r["committed"])) for r in csv.DictReader(open(commits_csv))]
latencies, missing = [], 0
for at in landed:
    # the first update whose newest input is this file or a later one applied it
    done = next((c for n, c in commits if n >= at), None)
    if done is None:
        missing += 1
    else:
        latencies.append(done - at)
latencies.sort()
q = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))]
cpu_us = int(ticks) / int(hz) * 1e6 / int(events)
print(f"| keys | events/s | files/s | trigger | files | updates | median ms | p90 ms | p99 ms | max ms | CPU µs/event |")
print(f"|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
print(f"| {int(keys):,} | {rate} | {files} | {interval} | {len(landed)} | {len(commits)} | "
      f"{statistics.median(latencies):.0f} | {q(0.90)} | {q(0.99)} | {latencies[-1]} | {cpu_us:.0f} |")
if missing:
    print(f"{missing} file(s) landed but were not applied before the stop", file=sys.stderr)
    sys.exit(1)
EOF
