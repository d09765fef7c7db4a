#!/usr/bin/env python3
"""Peer implementations for benches/compare.sh: DuckDB and Polars, Parquet -> Parquet.

    peers.py run TOOL TASK --out OUT (--events FILE|DIR | --snap1 FILE --snap2 FILE)
    peers.py check TASK REFERENCE OTHER...
    peers.py report RESULTS.tsv

run     TOOL is duckdb or polars; TASK is one of
          scd1      latest row per key by seq, keys whose latest event is a delete dropped
                    (the fastest formulation measured for each engine)
          floor     SELECT id, max(seq) GROUP BY id (the least any SCD 1 must do)
          scd2      one row per upsert, __start_at = seq, __end_at = next seq of the key
                    (NULL for the last), deletes dropped; duplicate replays count once
          snapdiff  FULL OUTER JOIN of two snapshots on id: insert / update / delete rows
          qscd1     scd1's rows aggregated: count(*) AS n, sum(seq) AS s (nothing stored)
          qscd2     scd2's rows aggregated: count(*) AS n, sum(__start_at) AS s,
                    sum(__end_at) AS e
          dbz1      Debezium JSON change events (every *.json of the folder --events, as
                    `autocdc-datagen debezium` writes them, with or without the schema
                    envelope, tombstone lines `null` skipped) folded into an SCD 1 table:
                    ordered by source.lsn, the latest event per id kept, ids whose latest
                    event is a delete dropped; an update whose before.id differs from its
                    after.id also deletes before.id; amount decoded from base64 to
                    DECIMAL(12, 2), updated_at (µs) to TIMESTAMP, day (days) to DATE.
                    Output columns id, name, amount, updated_at, day
        Each is one query from the input file(s) to OUT; the process is what is timed,
        so only the engine the task needs is imported.
check   compares Parquet files as sets of rows on their common columns (for snapdiff:
        on (id, _change_type); a table_changes export is reduced to its last commit,
        update_postimage -> update, preimages dropped); exits 1 on a difference.
report  renders the timings collected by compare.sh as a markdown table.
"""

import argparse
import statistics
import sys


def value_columns(path):
    """The value columns of a generated file: every column but id, seq and op."""
    import duckdb

    names = [row[0] for row in duckdb.connect().execute(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()]
    return [n for n in names if n not in ("id", "seq", "op")]


# ---------------------------------------------------------------- DuckDB


def duckdb_run(task, args):
    import duckdb

    con = duckdb.connect()
    out = args.out
    if task in ("qscd1", "qscd2"):
        rows = duckdb_query(task[1:], args)
        sums = "CAST(sum(seq) AS BIGINT) AS s" if task == "qscd1" else (
            "CAST(sum(__start_at) AS BIGINT) AS s, CAST(sum(__end_at) AS BIGINT) AS e")
        con.execute(f"COPY (SELECT count(*) AS n, {sums} FROM ({rows})) TO '{out}' (FORMAT parquet)")
        return
    con.execute(f"COPY ({duckdb_query(task, args)}) TO '{out}' (FORMAT parquet)")


# ---------------------------------------------------------------- Debezium (dbz1)

DBZ_ROW = {"id": "BIGINT", "name": "VARCHAR", "amount": "VARCHAR", "updated_at": "BIGINT", "day": "INTEGER"}


def dbz_files(folder):
    """The *.json files of a Debezium folder, and whether their lines carry the
    schema envelope ({"schema": ..., "payload": ...}), judged by the first line."""
    import glob
    import os

    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not files:
        raise SystemExit(f"no *.json file in {folder}")
    enveloped = False
    for path in files:
        with open(path, "rb") as f:
            first = f.readline()
        if first.strip() and first.strip() != b"null":
            enveloped = first.lstrip().startswith(b'{"schema"')
            break
    return files, enveloped


def duckdb_dbz1_query(folder):
    """read_json with explicit columns (only the fields used; other keys are
    skipped by the parser), one scan; a tombstone line `null` is a row of NULLs."""
    import os

    _, enveloped = dbz_files(folder)
    row = "STRUCT(" + ", ".join(f"{k} {t}" for k, t in DBZ_ROW.items()) + ")"
    event = f"before {row}, after {row}, source STRUCT(lsn BIGINT), op VARCHAR"
    if enveloped:
        columns = f"{{payload: 'STRUCT({event})'}}"
        unpack = "payload.op AS op, payload.source.lsn AS lsn, payload.before AS before, payload.after AS after"
        present = "payload.op IS NOT NULL"
    else:
        columns = "{" + ", ".join(
            f"{name}: '{kind}'" for name, kind in
            (("before", row), ("after", row), ("source", "STRUCT(lsn BIGINT)"), ("op", "VARCHAR"))) + "}"
        unpack = "op, source.lsn AS lsn, before, after"
        present = "op IS NOT NULL"
    glob = os.path.join(folder, "*.json")
    # Kafka Connect Decimal: base64 of big-endian two's complement. DuckDB has no
    # blob-to-integer cast: the hex digits are read as an unsigned number, from
    # which 16^digits is taken when the sign bit is set.
    return f"""
        WITH ev AS (
            SELECT {unpack}
            FROM read_json('{glob}', format = 'newline_delimited', columns = {columns})
            WHERE {present}),
        changes AS (
            -- after is NULL exactly for a delete
            SELECT coalesce(after.id, before.id) AS id, lsn, after FROM ev
            UNION ALL
            -- a key change deletes the old key at the same lsn
            SELECT before.id AS id, lsn, NULL AS after FROM ev
            WHERE op = 'u' AND before.id <> after.id),
        latest AS (
            SELECT after FROM changes
            QUALIFY lsn = max(lsn) OVER (PARTITION BY id)),
        live AS (
            SELECT after.id AS id, after.name AS name, hex(from_base64(after.amount)) AS h,
                   after.updated_at AS updated_at, after.day AS day
            FROM latest WHERE after IS NOT NULL)
        SELECT id, name,
               CAST(CAST(('0x' || h)::BIGINT
                         - CASE WHEN h >= '8' THEN 1::BIGINT << (4 * length(h)) ELSE 0 END
                         AS DECIMAL(14, 0)) * 0.01 AS DECIMAL(12, 2)) AS amount,
               make_timestamp(updated_at) AS updated_at,
               CAST(DATE '1970-01-01' + day AS DATE) AS day
        FROM live"""


def polars_dbz1_frame(folder):
    """scan_ndjson with an explicit schema of the fields used (tombstone lines
    `null` read as NULL rows with ignore_errors), struct fields unpacked."""
    import decimal

    import polars as pl

    files, enveloped = dbz_files(folder)
    types = {"BIGINT": pl.Int64, "VARCHAR": pl.String, "INTEGER": pl.Int32}
    row = pl.Struct({k: types[t] for k, t in DBZ_ROW.items()})
    event = {"before": row, "after": row, "source": pl.Struct({"lsn": pl.Int64}), "op": pl.String}
    scan = pl.scan_ndjson(files, schema={"payload": pl.Struct(event)} if enveloped else event,
                          ignore_errors=True)
    if enveloped:
        scan = scan.select(pl.col("payload").struct.unnest())
    ev = scan.filter(pl.col("op").is_not_null()).select(
        "op", pl.col("source").struct.field("lsn").alias("lsn"), "before", "after")
    before_id = pl.col("before").struct.field("id")
    after_id = pl.col("after").struct.field("id")
    changes = pl.concat([
        # after is null exactly for a delete
        ev.select(pl.coalesce(after_id, before_id).alias("id"), "lsn", "after"),
        # a key change deletes the old key at the same lsn
        ev.filter((pl.col("op") == "u") & (before_id != after_id))
        .select(before_id.alias("id"), "lsn", pl.lit(None, dtype=row).alias("after")),
    ])
    hexed = pl.col("amount").str.decode("base64").bin.encode("hex")
    unsigned = hexed.str.to_integer(base=16)
    # Kafka Connect Decimal: big-endian two's complement of the unscaled value
    signed = pl.when(hexed.str.slice(0, 1) >= "8").then(
        unsigned - pl.lit(16, dtype=pl.Int64).pow(hexed.str.len_bytes())).otherwise(unsigned)
    return (
        changes.filter(pl.col("lsn") == pl.col("lsn").max().over("id"))
        .filter(pl.col("after").is_not_null())
        .select(pl.col("after").struct.unnest())
        .with_columns(
            (signed.cast(pl.Decimal(14, 0)) * pl.lit(decimal.Decimal("0.01"))).cast(pl.Decimal(12, 2)).alias("amount"),
            pl.col("updated_at").cast(pl.Datetime("us")),
            pl.col("day").cast(pl.Date),
        )
    )


def duckdb_query(task, args):
    """The DuckDB query of `task`."""
    if task == "dbz1":
        return duckdb_dbz1_query(args.events)
    if task == "scd1":
        # (faster here than `QUALIFY row_number() OVER (... ORDER BY seq DESC) = 1`
        # or arg_max; DISTINCT ON keeps one of a replayed event's copies)
        query = f"""
            SELECT DISTINCT ON (id) * EXCLUDE (op) FROM read_parquet('{args.events}')
            QUALIFY seq = max(seq) OVER (PARTITION BY id) AND op <> 'D'"""
    elif task == "floor":
        query = f"SELECT id, max(seq) AS seq FROM read_parquet('{args.events}') GROUP BY id"
    elif task == "scd2":
        # Replays are exact copies: of two equal sequences the first one's next
        # sequence is its own, so `__end_at IS DISTINCT FROM seq` keeps one copy.
        values = ", ".join(value_columns(args.events))
        query = f"""
            SELECT id, {values}, seq AS __start_at, __end_at FROM (
                SELECT *, lead(seq) OVER (PARTITION BY id ORDER BY seq) AS __end_at
                FROM read_parquet('{args.events}'))
            WHERE op <> 'D' AND __end_at IS DISTINCT FROM seq"""
    elif task == "snapdiff":
        values = value_columns(args.snap1)
        new = ", ".join(f"n.{c}" for c in values)
        changed = " OR ".join(f"(o.{c} IS DISTINCT FROM n.{c})" for c in values)
        query = f"""
            SELECT coalesce(n.id, o.id) AS id, {new},
                   CASE WHEN o.id IS NULL THEN 'insert'
                        WHEN n.id IS NULL THEN 'delete'
                        ELSE 'update' END AS _change_type
            FROM read_parquet('{args.snap1}') o
            FULL OUTER JOIN read_parquet('{args.snap2}') n ON o.id = n.id
            WHERE o.id IS NULL OR n.id IS NULL OR {changed}"""
    else:
        raise SystemExit(f"unknown task {task}")
    return query


# ---------------------------------------------------------------- Polars


def polars_run(task, args):
    import polars as pl

    if task in ("qscd1", "qscd2"):
        rows = polars_frame(task[1:], args)
        sums = [pl.col("seq").sum().alias("s")] if task == "qscd1" else [
            pl.col("__start_at").sum().alias("s"),
            pl.col("__end_at").sum().alias("e"),
        ]
        rows.select([pl.len().cast(pl.Int64).alias("n"), *sums]).collect().write_parquet(args.out)
        return
    polars_frame(task, args).sink_parquet(args.out)


def polars_frame(task, args):
    """The Polars lazy frame of `task`."""
    import polars as pl

    if task == "dbz1":
        return polars_dbz1_frame(args.events)
    if task == "scd1":
        # (faster here than sort + unique(keep="last") or group_by + last;
        # unique keeps one of a replayed event's copies)
        frame = (
            pl.scan_parquet(args.events)
            .filter(pl.col("seq") == pl.col("seq").max().over("id"))
            .unique(subset="id")
            .filter(pl.col("op") != "D")
            .drop("op")
        )
    elif task == "floor":
        frame = pl.scan_parquet(args.events).group_by("id").agg(pl.col("seq").max())
    elif task == "scd2":
        events = pl.scan_parquet(args.events)
        values = [c for c in events.collect_schema().names() if c not in ("id", "seq", "op")]
        # sorted by (id, seq): the next row's seq is the end when it has the same id
        end = (
            pl.when(pl.col("id").shift(-1) == pl.col("id"))
            .then(pl.col("seq").shift(-1))
            .otherwise(None)
        )
        frame = (
            events.sort(["id", "seq"])
            .with_columns(end.alias("__end_at"))
            .filter((pl.col("op") != "D") & pl.col("__end_at").ne_missing(pl.col("seq")))
            .select(["id", *values, pl.col("seq").alias("__start_at"), "__end_at"])
        )
    elif task == "snapdiff":
        old = pl.scan_parquet(args.snap1).with_columns(pl.lit(True).alias("_old"))
        new = pl.scan_parquet(args.snap2).with_columns(pl.lit(True).alias("_new"))
        values = [c for c in old.collect_schema().names() if c not in ("id", "_old")]
        changed = pl.any_horizontal([pl.col(c).ne_missing(pl.col(f"{c}_n")) for c in values])
        change_type = (
            pl.when(pl.col("_old").is_null())
            .then(pl.lit("insert"))
            .when(pl.col("_new").is_null())
            .then(pl.lit("delete"))
            .otherwise(pl.lit("update"))
        )
        frame = (
            old.join(new, on="id", how="full", coalesce=True, suffix="_n")
            .filter(pl.col("_old").is_null() | pl.col("_new").is_null() | changed)
            .select(["id", *[pl.col(f"{c}_n").alias(c) for c in values], change_type.alias("_change_type")])
        )
    else:
        raise SystemExit(f"unknown task {task}")
    return frame


# ---------------------------------------------------------------- check


def check(task, reference, others):
    import duckdb

    con = duckdb.connect()

    def relation(path):
        names = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()]
        if task == "snapdiff" and "_commit_version" in names:
            # a table_changes export: the last commit's net changes
            return (
                f"(SELECT id, CASE _change_type WHEN 'update_postimage' THEN 'update' "
                f"ELSE _change_type END AS _change_type FROM read_parquet('{path}') "
                f"WHERE _change_type <> 'update_preimage' AND _commit_version = "
                f"(SELECT max(_commit_version) FROM read_parquet('{path}')))",
                ["id", "_change_type"],
            )
        if task == "snapdiff":
            return f"(SELECT id, _change_type FROM read_parquet('{path}'))", ["id", "_change_type"]
        return f"read_parquet('{path}')", names

    ref_rel, ref_cols = relation(reference)
    ref_rows = con.execute(f"SELECT count(*) FROM {ref_rel}").fetchone()[0]
    failed = False
    for other in others:
        rel, cols = relation(other)
        common = [c for c in ref_cols if c in cols]
        extra = sorted(set(ref_cols) ^ set(cols))
        listed = ", ".join(f'"{c}"' for c in common)
        rows = con.execute(f"SELECT count(*) FROM {rel}").fetchone()[0]
        missing = con.execute(
            f"SELECT count(*) FROM (SELECT {listed} FROM {ref_rel} EXCEPT ALL SELECT {listed} FROM {rel})"
        ).fetchone()[0]
        surplus = con.execute(
            f"SELECT count(*) FROM (SELECT {listed} FROM {rel} EXCEPT ALL SELECT {listed} FROM {ref_rel})"
        ).fetchone()[0]
        ok = missing == 0 and surplus == 0
        failed |= not ok
        note = f" (columns not compared: {', '.join(extra)})" if extra else ""
        print(
            f"check {task}: {other}: {rows} rows vs {ref_rows} in {reference}: "
            f"{'OK' if ok else f'DIFFERENT ({missing} missing, {surplus} extra)'}{note}"
        )
    return 1 if failed else 0


# ---------------------------------------------------------------- report


def report(path):
    """results.tsv rows: scenario, tool, kind (ours|peer|floor|info), rep, wall seconds,
    max RSS KiB, CPU seconds (user + system). Reported: median wall and CPU seconds,
    the largest peak RSS of the runs; ratios of median wall times."""
    runs = {}
    order = []
    with open(path) as f:
        for line in f:
            scenario, tool, kind, _rep, seconds, rss, cpu = line.rstrip("\n").split("\t")
            key = (scenario, tool)
            if key not in runs:
                runs[key] = {"kind": kind, "secs": [], "rss": [], "cpu": []}
                order.append(key)
            runs[key]["secs"].append(float(seconds))
            runs[key]["rss"].append(int(rss))
            runs[key]["cpu"].append(float(cpu))

    def median(key):
        return statistics.median(runs[key]["secs"])

    print("| scenario | tool | median s | median CPU s | peak RSS MB | runs |")
    print("|---|---|---:|---:|---:|---:|")
    for key in order:
        r = runs[key]
        print(
            f"| {key[0]} | {key[1]} | {median(key):.2f} | {statistics.median(r['cpu']):.2f} "
            f"| {max(r['rss']) / 1024:.0f} | {len(r['secs'])} |"
        )
    print()
    scenarios = list(dict.fromkeys(s for s, _ in order))
    lines = []
    for scenario in scenarios:
        keys = [k for k in order if k[0] == scenario]
        ours = [k for k in keys if runs[k]["kind"] == "ours"]
        peers = [k for k in keys if runs[k]["kind"] == "peer"]
        floors = [k for k in keys if runs[k]["kind"] == "floor"]
        if scenario.startswith("parallel") and len(ours) == 2:
            one, two = ours
            lines.append(
                f"* {scenario}: {one[1]} {median(one):.2f} s, {two[1]} {median(two):.2f} s: "
                f"speed-up {median(one) / median(two):.2f}x"
            )
            continue
        if scenario.startswith("partial") and len(ours) == 2:
            whole, per_column = ours
            lines.append(
                f"* {scenario}: {per_column[1]} {median(per_column):.2f} s, {whole[1]} "
                f"{median(whole):.2f} s: per-column / whole-row = "
                f"{median(per_column) / median(whole):.2f}"
            )
            continue
        if not ours:
            continue
        mine = median(ours[0])
        if peers:
            best = min(peers, key=median)
            lines.append(
                f"* {scenario}: ours / fastest peer ({best[1]}) = {mine / median(best):.2f}"
            )
        if floors:
            best = min(floors, key=median)
            lines.append(f"* {scenario}: ours / floor ({best[1]}) = {mine / median(best):.2f}")
    print("\n".join(lines))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("tool", choices=["duckdb", "polars"])
    run.add_argument("task", choices=["scd1", "floor", "scd2", "snapdiff", "qscd1", "qscd2", "dbz1"])
    run.add_argument("--out", required=True)
    run.add_argument("--events")
    run.add_argument("--snap1")
    run.add_argument("--snap2")
    chk = sub.add_parser("check")
    chk.add_argument("task", choices=["scd1", "scd2", "snapdiff", "snapshot", "qscd1", "qscd2", "dbz1"])
    chk.add_argument("reference")
    chk.add_argument("others", nargs="+")
    rep = sub.add_parser("report")
    rep.add_argument("results")
    args = parser.parse_args()

    if args.command == "run":
        (duckdb_run if args.tool == "duckdb" else polars_run)(args.task, args)
        return 0
    if args.command == "check":
        return check(args.task, args.reference, args.others)
    return report(args.results)


if __name__ == "__main__":
    sys.exit(main())
