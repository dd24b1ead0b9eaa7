"""Spark with Iceberg's own runtime reads the Iceberg metadata the publish writes, at every kept version.

The other Iceberg readers are pyiceberg, polars (through pyiceberg) and DuckDB; a Spark shop reads the
table with ``iceberg-spark-runtime`` through a catalog. Here that catalog is the one the publish
writes, pyiceberg's SQLite ``SqlCatalog``, opened by Iceberg's Java ``JdbcCatalog``: the test proves the
catalog file is readable by Iceberg's Java side too, not only the metadata files. The runtime is built
for Spark 4.1 (none for 4.2 is published), so a Spark Connect server of a second Spark, pyspark 4.1.4
(``make iceberg-spark``), is started with the runtime's pinned jars (jars.lock's ``iceberg-spark``
group); the compaction itself runs in this worker's own Spark session as everywhere else. The
scenarios' expectations are the shared conformance files', checked right after each compaction and
again at every kept snapshot afterwards (found by ``cdc.commit_seq`` in Spark's ``snapshots``
metadata table, read with ``VERSION AS OF``): an unpartitioned table, and one partitioned by the day
of a timestamp column, whose Iceberg partition spec and timestamps Spark must read as the Hive base does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import with_timestamp

from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools import iceberg_spark
from cdc_compaction.devtools.local_services import LocalMetastore, free_port

# make test-extended: a second Spark's server start and a scenario take about a minute; pyiceberg, polars and
# DuckDB's iceberg extension read the same snapshots in make test (test_formats_iceberg.py,
# test_duckdb_format_readers.py).
pytestmark = [pytest.mark.spark, pytest.mark.metastore, pytest.mark.extended]

SHARED = PROJECT_ROOT.parent / "shared" / "conformance"


@pytest.fixture(scope="module")
def iceberg_spark_url(metastore: LocalMetastore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a Spark 4.1 Connect server with Iceberg's runtime (jars, extensions); stopped by its PID."""
    server = iceberg_spark.server(
        tmp_path_factory.mktemp("iceberg_spark"), metastore.uri, str(metastore.home / "warehouse"), free_port()
    )
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def _with_timestamp(path: Path, out: Path) -> conf.Scenario:
    doc = json.loads(path.read_text())
    with_timestamp(doc)
    out.write_text(json.dumps(doc))
    return conf.Scenario.load(out)


CASES = [
    pytest.param("primary_key_change", None, id="unpartitioned-primary_key_change"),
    pytest.param("delete_then_reinsert", "day", id="by_day-delete_then_reinsert"),
]


@pytest.mark.parametrize(("name", "by_day"), CASES)
def test_iceberg_spark_reads_every_kept_version(
    name: str, by_day: str | None, iceberg_spark_url: str, inprocess: conf.InProcessRunner, spark: Any, tmp_path: Path
) -> None:
    path = SHARED / f"{name}.json"
    scn = _with_timestamp(path, tmp_path / path.name) if by_day else conf.Scenario.load(path)
    part = {"column": "changed_at", "transform": "day"} if by_day else None
    readers: list[Any] = [conf.Reader(spark), conf.IcebergReader("spark", connect_url=iceberg_spark_url)]
    result = conf.run_scenario(
        scn, inprocess, readers, tmp_path / "lake", suffix="_is", partition_by=part, formats=["iceberg"]
    )
    assert result.ok, "\n".join(result.failures)
