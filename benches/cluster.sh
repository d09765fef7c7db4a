#!/usr/bin/env bash
# The 10 M-event SCD 1 flow (benches/compare.sh's `scd1`) run three ways by
# the release `autocdc` CLI on the same Parquet: locally; on a standalone
# Ballista cluster inside the CLI (`--ballista standalone`, two executors);
# on a scheduler and two executors started as processes on 127.0.0.1
# (`--ballista df://127.0.0.1:PORT`, one task slot each). Reports median wall and CPU time (the
# CLI's, and for processes the executors' too) and checks that the three
# targets hold the same rows. See benches/README.md.
#
#   benches/cluster.sh [--reps N] [--no-build]
#
# Environment: AUTOCDC_BENCH_DIR (data and scratch, default
# /tmp/autocdc-compare; the events of benches/compare.sh 10m are reused),
# CARGO_TARGET_DIR.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
REPS=3
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS=$2; shift ;;
        --no-build) BUILD=0 ;;
        -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
WORK=${AUTOCDC_BENCH_DIR:-/tmp/autocdc-compare}
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
BIN=$TARGET/release
DATA=$WORK/data/10m
RUN=$WORK/cluster
log() { echo "cluster.sh: $*" >&2; }

if [ "$BUILD" = 1 ]; then
    cargo build --release -p autocdc-cli -p autocdc-ballista -p autocdc-bench >&2
fi
mkdir -p "$DATA" "$RUN"
if [ ! -f "$DATA/events.parquet" ]; then
    log "generating 10 M events over 2 M keys"
    "$BIN/autocdc-datagen" events --out "$DATA/events.parquet" --events 10000000 \
        --keys 2000000 --delete-fraction 0.05 --late-fraction 0.05 --seed 42 >&2
fi
cat > "$RUN/scd1.sql" <<SQL
CREATE EXTERNAL TABLE events STORED AS PARQUET LOCATION '$DATA/events.parquet';
CREATE STREAMING TABLE t;
CREATE FLOW f AS AUTO CDC INTO t FROM events KEYS (id)
  APPLY AS DELETE WHEN op = 'D' SEQUENCE BY seq COLUMNS * EXCEPT (op) STORED AS SCD TYPE 1;
SQL
cat > "$RUN/check.sql" <<SQL
SELECT count(*) AS rows, sum(id) AS ids, sum(seq) AS seqs, sum(i1) AS i1 FROM t;
SQL

PIDS=()
stop_cluster() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}
trap stop_cluster EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 600); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; log "port $1 never opened"; exit 1; }
cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

start_processes() {
    SCHED_PORT=$(free_port)
    "$BIN/autocdc-scheduler" --bind-port "$SCHED_PORT" 2>"$RUN/scheduler.log" &
    PIDS+=($!)
    wait_port "$SCHED_PORT"
    EXECUTORS=()
    for i in 1 2; do
        local flight grpc
        flight=$(free_port); grpc=$(free_port)
        mkdir -p "$RUN/work$i"
        "$BIN/autocdc-executor" --bind-port "$flight" --bind-grpc-port "$grpc" \
            --scheduler-port "$SCHED_PORT" --concurrent-tasks 1 --work-dir "$RUN/work$i" \
            2>"$RUN/executor$i.log" &
        PIDS+=($!)
        EXECUTORS+=($!)
        wait_port "$flight"
    done
    sleep 2
}

# run MODE REP: one load into a fresh warehouse; prints "wall cpu rss check"
run() {
    local mode=$1 wh=$RUN/wh-$1 extra=() clk
    rm -rf "$wh"
    case "$mode" in
        standalone) extra=(--ballista standalone) ;;
        processes) extra=(--ballista "df://127.0.0.1:$SCHED_PORT") ;;
    esac
    clk=$(getconf CLK_TCK)
    local before=0
    if [ "$mode" = processes ]; then
        for pid in "${EXECUTORS[@]}"; do before=$((before + $(cpu_of "$pid"))); done
    fi
    /usr/bin/time -f '%e %M %U %S' -o "$RUN/time.txt" \
        "$BIN/autocdc" -q --warehouse "$wh" "${extra[@]}" -f "$RUN/scd1.sql" >"$RUN/out.log" 2>&1 \
        || { cat "$RUN/out.log" >&2; exit 1; }
    local after=0
    if [ "$mode" = processes ]; then
        for pid in "${EXECUTORS[@]}"; do after=$((after + $(cpu_of "$pid"))); done
    fi
    local check
    check=$("$BIN/autocdc" -q --format csv --warehouse "$wh" -f "$RUN/check.sql" | tail -1)
    read -r wall rss user sys <"$RUN/time.txt"
    awk -v w="$wall" -v u="$user" -v s="$sys" -v r="$rss" -v e=$((after - before)) -v k="$clk" -v c="$check" \
        'BEGIN { printf "%.2f %.2f %.0f %s\n", w, u + s + e / k, r / 1024, c }'
}

start_processes
declare -A WALL CPU RSS CHECK
for mode in local standalone processes; do
    for rep in $(seq "$REPS"); do
        read -r wall cpu rss check < <(run "$mode")
        log "$mode rep $rep: ${wall}s wall, ${cpu} CPU-s, ${rss} MB, $check"
        WALL[$mode]+="$wall "; CPU[$mode]+="$cpu "; RSS[$mode]="$rss"; CHECK[$mode]=$check
    done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| run | wall (median of $REPS) | CPU-s (median) | client peak RSS | rows, sum(id), sum(seq), sum(i1) |"
echo "|---|---|---|---|---|"
for mode in local standalone processes; do
    echo "| $mode | $(echo "${WALL[$mode]}" | median) s | $(echo "${CPU[$mode]}" | median) | ${RSS[$mode]} MB | ${CHECK[$mode]} |"
done
if [ "${CHECK[local]}" != "${CHECK[standalone]}" ] || [ "${CHECK[local]}" != "${CHECK[processes]}" ]; then
    log "the targets differ"; exit 1
fi
tasks1=$(grep -c ': task ' "$RUN/executor1.log" || true)
tasks2=$(grep -c ': task ' "$RUN/executor2.log" || true)
echo
echo "tasks by executor process: $tasks1, $tasks2"
