"""Peer engines doing the compaction's dedup on the same files: DuckDB, optionally Polars.

Same rule as the compaction job (see ../shared/conformance/README.md): refused rows
(null key, null ordering value, unknown op) are left out; of the base rows plus the
remaining events, each key keeps the greatest by its ordering columns, then the
increment name, the file name and the row position in the file; a delete winner stays
as a tombstone unless it is older than the tombstone cutoff. New rows are stamped with
the plan's ``ingested_at``, so the output can be compared with the compaction's row
for row, all columns included.

    python bench/peer.py --engine duckdb --spec <spec.json> --out <dir>

The spec is written by the benchmark runner from the plan and the registry entry:
``columns`` ([{name, type}]), ``primary_key``, ``order_by``, ``op_column``, ``op_codes``
({create, read, update, delete}), ``base_location``, ``files`` (paths), ``ingested_at``,
``tombstone_cutoff``, ``threads``, ``memory_limit_mb``, ``target_file_mb``.

``checksum`` (used by the runner) hashes a Parquet output order-independently with DuckDB.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

META = ["_cdc_increment", "_cdc_file", "_cdc_pos", "_cdc_ingested_at"]
_DUCK_TYPES = {
    "tinyint": "TINYINT",
    "smallint": "SMALLINT",
    "int": "INTEGER",
    "bigint": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "string": "VARCHAR",
    "boolean": "BOOLEAN",
    "timestamp": "TIMESTAMP",
    "date": "DATE",
}


def q(name: str) -> str:
    """A quoted SQL identifier (DuckDB)."""
    return '"' + name.replace('"', '""') + '"'


def lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _naive_utc(iso: str) -> str:
    """An ISO timestamp as naive UTC text (DuckDB TIMESTAMP literal)."""
    dt = datetime.fromisoformat(iso)
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC)
    return dt.replace(tzinfo=None).isoformat(sep=" ")


def duckdb_sql(spec: dict[str, Any], out: str) -> list[str]:
    """The statements that compact ``spec`` into Parquet files under ``out``."""
    cols = spec["columns"]
    typed = [f"CAST({q(c['name'])} AS {_DUCK_TYPES[c['type']]}) AS {q(c['name'])}" for c in cols]
    files = ", ".join(lit(f) for f in spec["files"])
    op = q(spec["op_column"])
    codes = ", ".join(lit(v) for v in spec["op_codes"].values())
    valid = " AND ".join(
        [f"{q(c)} IS NOT NULL" for c in spec["primary_key"] + spec["order_by"]] + [f"{op} IN ({codes})"]
    )
    base = (
        f"SELECT {', '.join(typed)}, _cdc_increment, _cdc_file, CAST(_cdc_pos AS BIGINT) AS _cdc_pos, "
        f"CAST(_cdc_ingested_at AS TIMESTAMP) AS _cdc_ingested_at "
        f"FROM read_parquet({lit(spec['base_location'].rstrip('/') + '/*.parquet')})"
    )
    events = (
        f"SELECT {', '.join(typed)}, str_split(filename, '/')[-2] AS _cdc_increment, "
        f"str_split(filename, '/')[-1] AS _cdc_file, CAST(file_row_number AS BIGINT) AS _cdc_pos, "
        f"TIMESTAMP {lit(_naive_utc(spec['ingested_at']))} AS _cdc_ingested_at "
        f"FROM read_parquet([{files}], filename = true, file_row_number = true) WHERE {valid}"
    )
    order = ", ".join(
        [f"{q(c)} DESC" for c in spec["order_by"]] + ["_cdc_increment DESC", "_cdc_file DESC", "_cdc_pos DESC"]
    )
    keys = ", ".join(q(c) for c in spec["primary_key"])
    names = ", ".join(q(c["name"]) for c in cols) + ", " + ", ".join(META)
    expired = "FALSE"
    if spec.get("tombstone_cutoff"):
        cutoff = _naive_utc(spec["tombstone_cutoff"])
        expired = f"({op} = {lit(spec['op_codes']['delete'])} AND _cdc_ingested_at < TIMESTAMP {lit(cutoff)})"
    select = (
        f"SELECT {names} FROM ({base} UNION ALL {events}) "
        f"QUALIFY row_number() OVER (PARTITION BY {keys} ORDER BY {order}) = 1 AND NOT {expired}"
    )
    return [
        "SET TimeZone = 'UTC'",
        f"SET threads = {int(spec.get('threads', 2))}",
        f"SET memory_limit = '{int(spec.get('memory_limit_mb', 2048))}MB'",
        "SET preserve_insertion_order = false",
        f"COPY ({select}) TO {lit(out)} (FORMAT parquet, COMPRESSION snappy, "
        f"FILE_SIZE_BYTES '{int(spec.get('target_file_mb', 128))}MB')",
    ]


def run_duckdb(spec: dict[str, Any], out: str) -> None:
    import duckdb

    con = duckdb.connect()
    try:
        for stmt in duckdb_sql(spec, out):
            con.execute(stmt)
    finally:
        con.close()


def run_polars(spec: dict[str, Any], out: str) -> None:
    """The same rule in Polars' lazy API: sort by key and rule order, keep each key's first row."""
    import polars as pl

    cols = [c["name"] for c in spec["columns"]]
    types = {"bigint": pl.Int64, "int": pl.Int32, "string": pl.String, "double": pl.Float64, "boolean": pl.Boolean}
    casts = [
        pl.col(c["name"]).cast(pl.Datetime("us"))
        if c["type"] == "timestamp"
        else pl.col(c["name"]).cast(types[c["type"]])
        for c in spec["columns"]
    ]
    ingested = datetime.fromisoformat(_naive_utc(spec["ingested_at"]))
    op, codes = spec["op_column"], list(spec["op_codes"].values())
    valid = pl.col(op).is_in(codes)
    for c in spec["primary_key"] + spec["order_by"]:
        valid = valid & pl.col(c).is_not_null()
    frames = [
        pl.scan_parquet(spec["base_location"].rstrip("/") + "/*.parquet").select(
            *casts,
            pl.col("_cdc_increment"),
            pl.col("_cdc_file"),
            pl.col("_cdc_pos").cast(pl.Int64),
            pl.col("_cdc_ingested_at").cast(pl.Datetime("us")),
        )
    ]
    for f in spec["files"]:
        p = Path(f)
        frames.append(
            pl.scan_parquet(f)
            .with_row_index("_cdc_pos")
            .filter(valid)
            .select(
                *casts,
                pl.lit(p.parent.name).alias("_cdc_increment"),
                pl.lit(p.name).alias("_cdc_file"),
                pl.col("_cdc_pos").cast(pl.Int64),
                pl.lit(ingested).cast(pl.Datetime("us")).alias("_cdc_ingested_at"),
            )
        )
    order = [*spec["order_by"], "_cdc_increment", "_cdc_file", "_cdc_pos"]
    result = (
        pl.concat(frames)
        .sort([*spec["primary_key"], *order], descending=[False] * len(spec["primary_key"]) + [True] * len(order))
        .unique(subset=spec["primary_key"], keep="first", maintain_order=True)
    )
    if spec.get("tombstone_cutoff"):
        cutoff = datetime.fromisoformat(_naive_utc(spec["tombstone_cutoff"]))
        result = result.filter(
            ~((pl.col(op) == spec["op_codes"]["delete"]) & (pl.col("_cdc_ingested_at") < pl.lit(cutoff)))
        )
    df = result.select(*cols, *META).collect()
    Path(out).mkdir(parents=True, exist_ok=True)
    rows_per_file = max(1, int(df.height * spec.get("target_file_mb", 128) * 2**20 / max(df.estimated_size(), 1)))
    for i, start in enumerate(range(0, max(df.height, 1), rows_per_file)):
        df.slice(start, rows_per_file).write_parquet(f"{out}/part-{i:05d}.parquet", compression="snappy")


def checksum(directory: str, columns: list[dict[str, str]], op_column: str, delete_code: str) -> dict[str, Any]:
    """Order-independent fingerprint of a Parquet output: row counts and sums of row hashes.

    Timestamps are compared as microseconds since the epoch, so Spark's INT96 and DuckDB's
    TIMESTAMP agree; ``visible`` leaves the tombstones out.
    """
    import duckdb

    def norm(name: str, kind: str) -> str:
        return f"epoch_us(CAST({q(name)} AS TIMESTAMP))" if kind == "timestamp" else q(name)

    exprs = [norm(c["name"], c["type"]) for c in columns] + [
        "_cdc_increment",
        "_cdc_file",
        "CAST(_cdc_pos AS BIGINT)",
        "epoch_us(CAST(_cdc_ingested_at AS TIMESTAMP))",
    ]
    h = f"CAST(hash({', '.join(exprs)}) AS HUGEINT)"
    dead = f"{q(op_column)} = {lit(delete_code)}"
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        row = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE {dead}), CAST(sum({h}) AS VARCHAR), "
            f"CAST(coalesce(sum({h}) FILTER (WHERE NOT {dead}), 0) AS VARCHAR) "
            f"FROM read_parquet({lit(directory.rstrip('/') + '/*.parquet')})"
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return {"rows": row[0], "tombstones": row[1], "hash_all": row[2], "hash_visible": row[3]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a peer engine's dedup on the benchmark's files.")
    parser.add_argument("--engine", choices=["duckdb", "polars"], required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
    shutil.rmtree(args.out, ignore_errors=True)
    {"duckdb": run_duckdb, "polars": run_polars}[args.engine](spec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
