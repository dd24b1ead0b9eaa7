"""Peer engines doing the compaction's dedup on the same files: DuckDB, Polars, delta-rs.

Same rule as the compaction job (see ../shared/conformance/README.md): refused rows
(null key, null ordering value, unknown op) are left out; of the base rows plus the
remaining events, each key keeps the greatest by its ordering columns, then the
increment name, the file name and the row position in the file; a delete winner stays
as a tombstone unless it is older than the tombstone cutoff. New rows are stamped with
the plan's ``ingested_at``, so the output can be compared with the compaction's row
for row, all columns included.

    python bench/peer.py --engine duckdb --spec <spec.json> --out <dir>

delta-rs (``deltalake``) works the way a Delta Lake user would: the base is a Delta table
(made by :func:`prepare_delta` before the timed run, as a table that already exists), and the
run MERGEs the events into it -- a newer event updates its key's row, an expired delete
deletes it, a new key is inserted -- then deletes the expired tombstones and vacuums the
files the MERGE replaced, so ``<out>/*.parquet`` holds exactly the table's rows.

The spec is written by the benchmark runner from the plan and the registry entry:
``columns`` ([{name, type}]), ``primary_key``, ``order_by``, ``op_column``, ``op_codes``
({create, read, update, delete}), ``base_location`` (and ``base_tombstones_location``: the base's
tombstones live beside its visible rows), ``files`` (paths), ``ingested_at``,
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


def parquet_files(*directories: str | None) -> list[str]:
    """The Parquet data files of ``directories`` (a version directory: of its ``data/`` and ``tombstones/``)."""
    found: list[str] = []
    for d in directories:
        if not d:
            continue
        parts = [Path(d, "data"), Path(d, "tombstones")] if Path(d, "data").is_dir() else [Path(d)]
        found += sorted(str(f) for part in parts for f in part.glob("*.parquet") if not f.name.startswith(("_", ".")))
    return found


def base_files(spec: dict[str, Any]) -> list[str]:
    """The base's files: its visible rows and its tombstones."""
    return parquet_files(spec["base_location"], spec.get("base_tombstones_location"))


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
        f"FROM read_parquet([{', '.join(lit(f) for f in base_files(spec))}])"
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
        pl.scan_parquet(base_files(spec)).select(
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


_ARROW_TYPES = {
    "tinyint": "int8",
    "smallint": "int16",
    "int": "int32",
    "bigint": "int64",
    "float": "float32",
    "double": "float64",
    "string": "string",
    "boolean": "bool_",
    "date": "date32",
}


def _arrow_schema(spec: dict[str, Any]) -> Any:
    """The registry columns and the ``_cdc_`` columns as Arrow types Delta Lake takes (timestamps in us, UTC)."""
    import pyarrow as pa

    def kind(t: str) -> Any:
        return pa.timestamp("us", tz="UTC") if t == "timestamp" else getattr(pa, _ARROW_TYPES[t])()

    fields = [(c["name"], kind(c["type"])) for c in spec["columns"]]
    fields += [("_cdc_increment", pa.string()), ("_cdc_file", pa.string()), ("_cdc_pos", pa.int64())]
    return pa.schema([*fields, ("_cdc_ingested_at", pa.timestamp("us", tz="UTC"))])


def _cast(table: Any, schema: Any) -> Any:
    """``table``'s columns of ``schema``, cast to it (Spark writes INT96 timestamps: nanoseconds in Arrow)."""
    import pyarrow as pa

    return pa.Table.from_arrays([table.column(f.name).cast(f.type) for f in schema], schema=schema)


def prepare_delta(spec: dict[str, Any], out: str) -> None:
    """Write the base as a Delta table at ``out``: the table a Delta Lake user would MERGE into."""
    import pyarrow.dataset as ds
    from deltalake import write_deltalake

    base = ds.dataset(base_files(spec), format="parquet").to_table()
    write_deltalake(out, _cast(base, _arrow_schema(spec)), mode="overwrite")


def _newer(names: list[str]) -> str:
    """SQL: the source row ``s`` ranks above the target row ``t`` by ``names`` in turn (all NOT NULL)."""
    first, rest = q(names[0]), names[1:]
    if not rest:
        return f"s.{first} > t.{first}"
    return f"(s.{first} > t.{first} OR (s.{first} = t.{first} AND {_newer(rest)}))"


def delta_events(spec: dict[str, Any]) -> Any:
    """The valid events with their provenance, each key's winner among them only (a MERGE takes one per key)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    schema = _arrow_schema(spec)
    ingested = datetime.fromisoformat(spec["ingested_at"]).astimezone(UTC)
    op, codes = spec["op_column"], list(spec["op_codes"].values())
    frames = []
    for f in spec["files"]:
        p = Path(f)
        t = pq.read_table(f, columns=[c["name"] for c in spec["columns"]])
        n = t.num_rows
        t = t.append_column("_cdc_increment", pa.array([p.parent.name] * n, pa.string()))
        t = t.append_column("_cdc_file", pa.array([p.name] * n, pa.string()))
        t = t.append_column("_cdc_pos", pa.array(np.arange(n, dtype=np.int64)))
        t = t.append_column("_cdc_ingested_at", pa.array([ingested] * n, pa.timestamp("us", tz="UTC")))
        valid = pc.is_in(t.column(op), value_set=pa.array(codes))
        for c in spec["primary_key"] + spec["order_by"]:
            valid = pc.and_(valid, pc.is_valid(t.column(c)))
        frames.append(_cast(t.filter(valid), schema))
    events = pa.concat_tables(frames)
    order = [*spec["order_by"], "_cdc_increment", "_cdc_file", "_cdc_pos"]
    events = events.sort_by([(c, "ascending") for c in spec["primary_key"]] + [(c, "descending") for c in order])
    # The first row of each key (keys are NOT NULL here) is its winner among the events.
    first = np.zeros(events.num_rows, dtype=bool)
    if events.num_rows:
        first[0] = True
        for c in spec["primary_key"]:
            v = events.column(c).to_numpy(zero_copy_only=False)
            first[1:] |= v[1:] != v[:-1]
    return events.filter(pa.array(first))


def run_delta(spec: dict[str, Any], out: str) -> None:
    """MERGE the events into the Delta table at ``out`` (made by :func:`prepare_delta` unless it exists)."""
    from deltalake import DeltaTable

    if not Path(out, "_delta_log").is_dir():
        prepare_delta(spec, out)
    dt = DeltaTable(out)
    op = q(spec["op_column"])
    delete = lit(spec["op_codes"]["delete"])
    cutoff = spec.get("tombstone_cutoff")

    def expired(a: str) -> str:
        """SQL: a delete older than the tombstone cutoff (``a``: the table alias with its dot, or none)."""
        if not cutoff:
            return "FALSE"
        at = datetime.fromisoformat(cutoff).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return f"({a}{op} = {delete} AND {a}_cdc_ingested_at < '{at}')"

    newer = _newer([*spec["order_by"], "_cdc_increment", "_cdc_file", "_cdc_pos"])
    on = " AND ".join(f"t.{q(c)} = s.{q(c)}" for c in spec["primary_key"])
    (
        dt.merge(delta_events(spec), predicate=on, source_alias="s", target_alias="t")
        .when_matched_delete(predicate=f"{newer} AND {expired('s.')}")
        .when_matched_update_all(predicate=newer)
        .when_not_matched_insert_all(predicate=f"NOT {expired('s.')}")
        .execute()
    )
    if cutoff:
        # The base's own tombstones that expired (no event touched them): deleted like the others drop them.
        dt.delete(expired(""))
    # Only the live files stay, so that a glob over <out>/*.parquet reads the table.
    dt.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)


def checksum(directory: str, columns: list[dict[str, str]], op_column: str, delete_code: str) -> dict[str, Any]:
    """Order-independent fingerprint of a Parquet output: row counts and sums of row hashes.

    Timestamps are compared as microseconds since the epoch, so Spark's INT96 and DuckDB's
    TIMESTAMP agree; ``visible`` leaves the tombstones out. A version directory's ``data/`` and
    ``tombstones/`` are read together (see :func:`parquet_files`).
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
            f"FROM read_parquet([{', '.join(lit(f) for f in parquet_files(directory))}])"
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return {"rows": row[0], "tombstones": row[1], "hash_all": row[2], "hash_visible": row[3]}


ENGINES = {"duckdb": run_duckdb, "polars": run_polars, "delta": run_delta}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a peer engine's dedup on the benchmark's files.")
    parser.add_argument("--engine", choices=list(ENGINES), required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
    if not (args.engine == "delta" and Path(args.out, "_delta_log").is_dir()):
        # delta MERGEs into the table prepare_delta made there; every other engine writes afresh.
        shutil.rmtree(args.out, ignore_errors=True)
    ENGINES[args.engine](spec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
