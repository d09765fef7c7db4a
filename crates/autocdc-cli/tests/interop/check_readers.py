"""Read streaming tables the way other tools do and compare with ours.

Usage: check_readers.py WAREHOUSE EXPORTS TABLE...

For each TABLE (in schema `public`), EXPORTS holds what `autocdc` itself
returned: `TABLE.parquet` (`SELECT *`) and `TABLE_changes.parquet`
(`table_changes(TABLE, 0)` without its commit timestamp). The table at
WAREHOUSE/public/TABLE is read with Polars (`read_delta`), delta-rs
(`QueryBuilder`) and delta-rs' change data feed (`load_cdf`); each must give
exactly our columns and rows. Tables named `plain_*` were made without
deletion vectors: their protocol must not ask readers for them, and delta-rs'
pyarrow reader (`to_pyarrow_table`, which refuses them) must read them too.
A TABLE written `name@V` is read at version V with Polars and delta-rs;
EXPORTS holds our rows then as `name@V.parquet`.
Prints one line per check; exits 1 on a difference.
"""

import sys

import polars as pl
from deltalake import DeltaTable, QueryBuilder


def canonical(df: pl.DataFrame) -> pl.DataFrame:
    """Rows in a fixed order, with types made comparable (views, widths)."""
    cast = {}
    for name, dtype in df.schema.items():
        if dtype in (pl.Utf8, pl.String) or str(dtype).startswith("String"):
            cast[name] = pl.Utf8
        elif dtype.is_integer():
            cast[name] = pl.Int64
    df = df.cast(cast)
    return df.sort(df.columns, nulls_last=True)


def same(label: str, ours: pl.DataFrame, theirs: pl.DataFrame) -> bool:
    if ours.columns != theirs.columns:
        print(f"DIFFERENT {label}: columns {theirs.columns}, ours {ours.columns}")
        return False
    a, b = canonical(ours), canonical(theirs)
    if not a.equals(b):
        print(f"DIFFERENT {label}:\n ours\n{a}\n theirs\n{b}")
        return False
    print(f"same {label}: {len(a)} rows, columns {a.columns}")
    return True


def main() -> int:
    warehouse, exports, tables = sys.argv[1], sys.argv[2], sys.argv[3:]
    ok = True
    for table in tables:
        if "@" in table:
            name, version = table.split("@")
            path = f"{warehouse}/public/{name}"
            ours = pl.read_parquet(f"{exports}/{table}.parquet")
            ok &= same(f"{table} / polars read_delta", ours, pl.read_delta(path, version=int(version)))
            dt = DeltaTable(path, version=int(version))
            result = QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all()
            ok &= same(f"{table} / delta-rs QueryBuilder", ours, pl.DataFrame(result))
            continue
        path = f"{warehouse}/public/{table}"
        ours = pl.read_parquet(f"{exports}/{table}.parquet")
        ok &= same(f"{table} / polars read_delta", ours, pl.read_delta(path))
        dt = DeltaTable(path)
        result = QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all()
        ok &= same(f"{table} / delta-rs QueryBuilder", ours, pl.DataFrame(result))
        if table.startswith("plain_"):
            features = dt.protocol().reader_features or []
            if "deletionVectors" in features:
                print(f"DIFFERENT {table}: reader features {features}")
                ok = False
            else:
                arrow = dt.to_pyarrow_table()
                ok &= same(f"{table} / delta-rs to_pyarrow_table", ours, pl.DataFrame(arrow))
        changes = pl.read_parquet(f"{exports}/{table}_changes.parquet")
        cdf = pl.DataFrame(dt.load_cdf(starting_version=0).read_all())
        cdf = cdf.drop("_commit_timestamp").with_columns(pl.col("_commit_version").cast(pl.Int64))
        ok &= same(f"{table} / delta-rs load_cdf", changes, cdf)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
