"""The Parquet type of the timestamps the job writes (registry ``parquet_timestamps``, docs/formats.md).

New files carry INT64 microseconds adjusted to UTC (``micros``, the default), or Spark's legacy INT96
(``int96``, for Hive before 4.0); a live version whose reused partitions still hold INT96 reads the same
through Spark and DuckDB, and an erase keeps each file's own type. Expectations come from the footers
and from the rows landed, never from the job.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from conftest import compact_once

from cdc_compaction.core.names import table_names
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.devtools.conformance import land
from cdc_compaction.operations.erase import erase
from cdc_compaction.pipeline.tables import ensure_tables

TS_COLUMNS = [
    {"name": "id", "type": "int"},
    {"name": "full_name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
    {"name": "updated_at", "type": "timestamp"},
]
#: Microsecond-precision instants: a reader that rounds to milliseconds, or shifts by a zone, differs.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
AT = {i: datetime(2026, 11, 22, i, 2, 3, 100_000 + i * 1_001, tzinfo=UTC) for i in range(1, 6)}


def row(i: int, name: str, op: str, ts: int, at: datetime | None = None) -> dict[str, Any]:
    return {"id": i, "full_name": name, "op": op, "ts_ms": ts, "updated_at": (at or AT[i]).isoformat()}


def written_files(root: Path) -> list[Path]:
    """Every Parquet file of the table but the landed ones (and their archived copies)."""
    return [p for p in root.rglob("*.parquet") if not {"incremental", "archive"} & set(p.relative_to(root).parts)]


def timestamp_types(path: Path) -> dict[str, tuple[str, str]]:
    """Timestamp columns of a file -> (physical type, logical type as text)."""
    schema = pq.read_metadata(path).schema
    out = {}
    for i in range(len(schema)):
        col = schema.column(i)
        if col.physical_type == "INT96" or "Timestamp" in str(col.logical_type):
            out[col.path] = (col.physical_type, str(col.logical_type))
    return out


def is_micros(types: tuple[str, str]) -> bool:
    physical, logical = types
    return physical == "INT64" and "isAdjustedToUTC=true" in logical and "timeUnit=microseconds" in logical


def spark_rows(spark: Any, cfg: TableConfig) -> dict[int, datetime]:
    name = f"`{cfg.database}`.`{table_names(cfg)['base_table']}`"
    spark.catalog.refreshTable(name)
    # The session is UTC (the job sets it): the naive datetimes PySpark returns are UTC.
    return {
        r["id"]: r["updated_at"].replace(tzinfo=UTC) for r in spark.sql(f"SELECT id, updated_at FROM {name}").collect()
    }


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def iceberg_rows(root: str) -> dict[int, datetime]:
    """The Iceberg table's current snapshot, read by pyiceberg (through ``version-hint.text``)."""
    from pyiceberg.table import StaticTable

    rows = StaticTable.from_metadata(f"{root}/iceberg").scan(selected_fields=("id", "updated_at")).to_arrow()
    return {r["id"]: _utc(r["updated_at"]) for r in rows.to_pylist()}


def iceberg_bounds(root: str) -> dict[str, tuple[datetime, datetime] | None]:
    """Partition value -> the (lower, upper) bounds of ``updated_at`` over its data files (None: none given)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(f"{root}/iceberg")
    field = table.schema().find_field("updated_at")
    out: dict[str, Any] = {}
    for task in table.scan().plan_files():
        df = task.file
        value = df.partition[0]
        lo, hi = df.lower_bounds.get(field.field_id), df.upper_bounds.get(field.field_id)
        if lo is None or hi is None:
            out[value] = None
            continue
        got = [EPOCH + timedelta(microseconds=from_bytes(field.field_type, b)) for b in (lo, hi)]
        old = out.get(value)
        out[value] = (min(got[0], old[0]), max(got[1], old[1])) if old else (got[0], got[1])
    return out


@pytest.mark.spark
@pytest.mark.metastore
@pytest.mark.parametrize("setting", ["micros", "int96"])
def test_every_file_the_job_writes_has_the_registrys_timestamp_type(
    setting: str, make_cfg: Callable[..., TableConfig], runtime: Any, spark: Any
) -> None:
    """Version data, tombstones, the change feed (the job's and its published copy) and the quarantine."""
    rt = runtime(make_cfg(columns=TS_COLUMNS, change_feed=True, parquet_timestamps=setting))
    ensure_tables(rt)
    refused = {"id": None, "full_name": "nobody", "op": "c", "ts_ms": 1, "updated_at": AT[4].isoformat()}
    land(
        rt.cfg, "increment_2026112200", [[row(1, "Ann", "c", 1), row(2, "Ben", "c", 1), row(2, "Ben", "d", 2), refused]]
    )
    compact_once(rt, "r1")
    files = written_files(Path(rt.lake.layout.root))
    kinds = {p.relative_to(rt.lake.layout.root).parts[0] for p in files}
    assert {"base", "quarantine"} <= kinds and any("tombstones" in p.parts for p in files)
    assert any("changes" in p.parts for p in files), files
    for p in files:
        types = timestamp_types(p)
        assert "_cdc_ingested_at" in types or "tombstones" not in p.parts
        for column, t in types.items():
            assert is_micros(t) if setting == "micros" else t[0] == "INT96", (p, column, t)
    assert spark_rows(spark, rt.cfg) == {1: AT[1]}


@pytest.mark.spark
@pytest.mark.metastore
def test_a_version_reusing_int96_partitions_reads_the_same_and_erases(
    make_cfg: Callable[..., TableConfig], runtime: Any, spark: Any, tmp_path: Path
) -> None:
    """Partition alpha keeps the INT96 files of the first version; beta is rewritten in INT64 by the second."""
    views = str(tmp_path / "views.duckdb")
    doc = {
        "columns": TS_COLUMNS,
        "partition_by": {"column": "full_name"},
        "views": {"duckdb": views},
        "formats": ["iceberg"],
    }
    old = make_cfg(parquet_timestamps="int96", **doc)
    rt = runtime(old)
    ensure_tables(rt)
    land(old, "increment_2026112200", [[row(1, "alpha", "c", 1), row(5, "alpha", "c", 1), row(2, "beta", "c", 1)]])
    compact_once(rt, "r1")
    rt = runtime(make_cfg(table=old.table, **doc))  # the registry now says micros (the default)
    assert rt.cfg.parquet_timestamps == "micros"
    land(rt.cfg, "increment_2026112201", [[row(3, "beta", "c", 2), row(4, "beta", "c", 2)]])
    compact_once(rt, "r2")
    live = rt.lake.latest_commit()
    kinds = {}
    names = {}  # the partition directory (its name is an encoding of the value) -> the value its rows hold
    for location in (live.partitions or {}).values():
        files = list(Path(location).glob("*.parquet"))
        names[location] = pq.read_table(files[0], columns=["full_name"]).column(0)[0].as_py()
        types = [t for p in files for t in timestamp_types(p).values()]
        kinds[names[location]] = {"INT96" if t[0] == "INT96" else "micros" if is_micros(t) else str(t) for t in types}
    assert kinds == {"alpha": {"INT96"}, "beta": {"micros"}}
    assert spark_rows(spark, rt.cfg) == AT

    def duck(zone: str) -> dict[int, datetime]:
        with duckdb.connect(views, read_only=True) as con:
            con.execute(f"SET TimeZone = '{zone}'")
            got = con.execute(f'SELECT id, updated_at FROM "tests"."{rt.cfg.table}_base"').fetchall()
        return {i: at if at.tzinfo else at.replace(tzinfo=UTC) for i, at in got}

    assert duck("UTC") == AT
    # Another zone shows the same instants (DuckDB alone would read alpha's INT96 in the session's zone).
    assert duck("America/New_York") == AT
    assert iceberg_rows(rt.lake.layout.root) == AT
    # Iceberg bounds of the INT64 files (beta: ids 2-4) are their exact microseconds; INT96 gets none.
    bounds = iceberg_bounds(rt.lake.layout.root)
    assert bounds == {"alpha": None, "beta": (AT[2], AT[4])}

    erase(rt.cfg, "id IN (1, 3)", actor="test", metastore=rt.metastore)
    left = {i: AT[i] for i in (2, 4, 5)}
    assert spark_rows(spark, rt.cfg) == left
    assert iceberg_rows(rt.lake.layout.root) == left
    for location, value in names.items():
        for p in Path(location).glob("*.parquet"):  # rewritten by the erase, each in its own type
            types = list(timestamp_types(p).values())
            assert all(t[0] == "INT96" if value == "alpha" else is_micros(t) for t in types), (p, types)
