"""Trino reads the lake as its users do: the base table and the Trino views through the Hive metastore, Delta
and Iceberg.

One real Trino server (jars.lock's ``trino`` group, on a Java 24+ JDK) for the module, its ``hive``
catalog on the tests' Thrift metastore and its ``delta`` catalog with the Delta tables registered by
location. The compaction runs in this worker's Spark session as everywhere else; after each
compaction Trino's plain ``SELECT`` of ``hive.<db>.<base>`` must read exactly the shared conformance
scenario's expectation, unpartitioned and partitioned by the day of a timestamp column (Trino reads the
partitions the metastore lists, each at the live version's location), and the Delta table must read
it too, at the live version and at every kept one (``FOR VERSION AS OF``). The table also publishes
Trino views (``views.metastore: [spark, trino]``): at each ``check_view`` step Trino runs
``<t>_view_trino`` and ``<t>_pending_rejects_trino`` and must read the scenario's rows and count.
The Iceberg table is read through the project's own catalog, the SQLite ``catalog.db``, as Trino's JDBC
catalog (one Trino catalog added per lake), live and at every kept snapshot (``FOR VERSION AS OF``).
The values come back through Trino's JSON protocol: the first test checks each type's conversion
against literals Trino computes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import with_timestamp

from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools.local_services import LocalMetastore
from cdc_compaction.devtools.trino import TrinoServer

# make test-extended: Trino's start alone takes 30-50 s on the shared cores, the module about two minutes, and
# the base it reads is the one the Spark, DuckDB and delta-spark readers of make test read already.
pytestmark = [pytest.mark.spark, pytest.mark.metastore, pytest.mark.extended]

SHARED = PROJECT_ROOT.parent / "shared" / "conformance"
APPEND = Path(__file__).resolve().parents[1] / "scenarios" / "append"


@pytest.fixture(scope="module")
def trino(metastore: LocalMetastore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrinoServer]:
    """A Trino server on the session's metastore, under its own home; stopped by its PID."""
    with TrinoServer(tmp_path_factory.mktemp("trino"), metastore.uri) as server:
        yield server


def test_trino_values_come_back_as_the_python_values_of_the_other_readers(trino: TrinoServer) -> None:
    (row,) = trino.query(
        "SELECT TIMESTAMP '2026-11-02 10:00:00.123456' AS ts, DATE '2026-11-02' AS d, DECIMAL '12.50' AS dec, "
        "CAST(7 AS INTEGER) AS i, CAST(1.5 AS DOUBLE) AS f, nan() AS nan, X'0001' AS bin, true AS b, 'x' AS s, "
        "TIMESTAMP '2026-11-02 10:00:00.5 UTC' AS tz, CAST(NULL AS BIGINT) AS n"
    )
    nan = row.pop("nan")
    assert math.isnan(nan)
    assert row == {
        "ts": datetime(2026, 11, 2, 10, 0, 0, 123456),
        "d": date(2026, 11, 2),
        "dec": Decimal("12.50"),
        "i": 7,
        "f": 1.5,
        "bin": b"\x00\x01",
        "b": True,
        "s": "x",
        "tz": datetime(2026, 11, 2, 10, 0, 0, 500000, tzinfo=UTC),
        "n": None,
    }


def _with_timestamp(path: Path, out: Path) -> conf.Scenario:
    doc = json.loads(path.read_text())
    with_timestamp(doc)
    out.write_text(json.dumps(doc))
    return conf.Scenario.load(out)


CASES = [
    pytest.param(SHARED / "primary_key_change.json", False, id="unpartitioned-primary_key_change"),
    pytest.param(SHARED / "delete_then_reinsert.json", True, id="by_day-delete_then_reinsert"),
    # A decimal(10,2) column, and an append table's base.
    pytest.param(APPEND / "insert_only.json", False, id="append-insert_only"),
]


@pytest.mark.parametrize(("path", "by_day"), CASES)
def test_trino_reads_the_base_the_trino_views_and_the_delta_table(
    path: Path, by_day: bool, trino: TrinoServer, inprocess: conf.InProcessRunner, tmp_path: Path
) -> None:
    scn = _with_timestamp(path, tmp_path / path.name) if by_day else conf.Scenario.load(path)
    part = {"column": "changed_at", "transform": "day"} if by_day else None
    readers: list[Any] = [conf.TrinoReader(trino, views=True), conf.DeltaReader("trino", trino=trino)]
    result = conf.run_scenario(
        scn,
        inprocess,
        readers,
        tmp_path / "lake",
        suffix="_trino",
        partition_by=part,
        formats=["delta"],
        views_metastore=["spark", "trino"],
    )
    assert result.ok, "\n".join(result.failures)


def _with_microsecond_timestamp(path: Path, out: Path) -> conf.Scenario:
    """The scenario with ``changed_at`` (:func:`with_timestamp`) given a microsecond fraction of its own per row
    (``ts_ms`` microseconds past .123000): Trino's Iceberg timestamps are ``timestamp(6)``, and the files hold
    them as Spark's INT96, so a reader that rounds to milliseconds, or misreads INT96's nanoseconds, differs."""
    doc = json.loads(path.read_text())
    with_timestamp(doc)
    for step in doc["steps"]:
        ((kind, body),) = step.items()
        for rows in body["files"] if kind == "land" else [body.get("expect", [])]:
            for row in rows:
                if row.get("changed_at") is not None:
                    row["changed_at"] = row["changed_at"].replace("Z", f".{123000 + row['ts_ms']:06d}Z")
    out.write_text(json.dumps(doc))
    return conf.Scenario.load(out)


ICEBERG_CASES = [
    pytest.param(SHARED / "primary_key_change.json", False, id="unpartitioned-primary_key_change"),
    pytest.param(SHARED / "delete_then_reinsert.json", True, id="by_day-delete_then_reinsert"),
]


@pytest.mark.parametrize(("path", "by_day"), ICEBERG_CASES)
def test_trino_reads_the_iceberg_table_at_every_kept_snapshot_through_its_sqlite_catalog(
    path: Path, by_day: bool, trino: TrinoServer, inprocess: conf.InProcessRunner, tmp_path: Path
) -> None:
    """Trino's Iceberg connector opens the project's own catalog (Trino's JDBC catalog on the SQLite file the
    publish writes), reads the live snapshot and every kept one (``FOR VERSION AS OF``, found by ``cdc.commit_seq``
    in ``$snapshots``), and leaves the catalog file as it was (the reader checks its bytes around each query).
    The partitioned case's timestamps carry microseconds."""
    scn = _with_microsecond_timestamp(path, tmp_path / path.name) if by_day else conf.Scenario.load(path)
    part = {"column": "changed_at", "transform": "day"} if by_day else None
    result = conf.run_scenario(
        scn,
        inprocess,
        [conf.IcebergReader("trino", trino=trino)],
        tmp_path / "lake",
        suffix="_ti",
        partition_by=part,
        formats=["iceberg"],
    )
    assert result.ok, "\n".join(result.failures)


def test_the_trino_views_serve_a_catalog_that_reads_timestamps_to_the_microsecond(
    trino: TrinoServer, inprocess: conf.InProcessRunner, tmp_path: Path
) -> None:
    """A Trino catalog with ``hive.timestamp-precision=MICROSECONDS`` (the server's ``hive_us``) reads the base and
    the Trino views to the microsecond. The views declare ``timestamp(6)``: a declared ``timestamp(3)`` is refused
    there as stale (``timestamp(6) ... cannot be coerced to timestamp(3)``); the millisecond catalog's reads in
    the tests above coerce its ``timestamp(3)`` to it."""
    path = SHARED / "delete_then_reinsert.json"
    scn = _with_microsecond_timestamp(path, tmp_path / path.name)
    scn.table["views"] = {"trino_catalog": "hive_us"}
    result = conf.run_scenario(
        scn,
        inprocess,
        [conf.TrinoReader(trino, views=True, catalog="hive_us")],
        tmp_path / "lake",
        suffix="_us",
        partition_by={"column": "changed_at", "transform": "day"},
        views_metastore=["spark", "trino"],
    )
    assert result.ok, "\n".join(result.failures)
