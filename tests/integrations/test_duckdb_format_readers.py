"""DuckDB's own delta and iceberg extensions read the Delta log and the Iceberg snapshots the publish writes.

A DuckDB user reads the Delta table with ``ATTACH '<root>' (TYPE delta, VERSION n)`` and the Iceberg
table with ``iceberg_scan('<metadata.json>', snapshot_from_id => id)``; the extensions exist for DuckDB
1.4.4 only, a second DuckDB installed for reading (``make duckdb-readers``, see
``cdc_compaction.devtools.duckdb_formats``). The scenarios' expectations are the shared conformance
files', checked right after each compaction and again at every kept version afterwards: an
unpartitioned table, and one partitioned by the day of a timestamp column.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import with_timestamp

from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools import duckdb_formats

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

SHARED = PROJECT_ROOT.parent / "shared" / "conformance"


def _scenario(name: str, by_day: bool, tmp_path: Path) -> conf.Scenario:
    path = SHARED / f"{name}.json"
    if not by_day:
        return conf.Scenario.load(path)
    doc = json.loads(path.read_text())
    with_timestamp(doc)
    out = tmp_path / path.name
    out.write_text(json.dumps(doc))
    return conf.Scenario.load(out)


CASES = [
    # The unpartitioned table is the simpler read of the same logs (make test-extended).
    pytest.param("primary_key_change", False, id="unpartitioned-primary_key_change", marks=pytest.mark.extended),
    pytest.param("delete_then_reinsert", True, id="by_day-delete_then_reinsert"),
]


@pytest.mark.parametrize(("name", "by_day"), CASES)
def test_duckdb_reads_delta_and_iceberg_at_every_kept_version(
    name: str, by_day: bool, inprocess: conf.InProcessRunner, spark: Any, tmp_path: Path
) -> None:
    scn = _scenario(name, by_day, tmp_path)
    part = {"column": "changed_at", "transform": "day"} if by_day else None
    readers: list[Any] = [conf.Reader(spark), conf.DeltaReader("duckdb"), conf.IcebergReader("duckdb")]
    result = conf.run_scenario(
        scn, inprocess, readers, tmp_path / "lake", suffix="_dd", partition_by=part, formats=["delta", "iceberg"]
    )
    assert result.ok, "\n".join(result.failures)


def test_the_reading_duckdb_is_the_pinned_one_and_a_missing_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert all(Path(e).is_file() for e in duckdb_formats.extensions("iceberg"))
    monkeypatch.setenv("CDC_DUCKDB_READERS", str(tmp_path / "nowhere"))
    with pytest.raises(duckdb_formats.DuckDBReadersError, match="make duckdb-readers"):
        duckdb_formats.read("delta", str(tmp_path), ["id"])
