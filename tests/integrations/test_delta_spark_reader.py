"""Spark with delta-spark reads the Delta log the publish writes, at every kept version.

The other Delta readers (delta-rs, polars) are Rust; a Spark shop reads the table with delta-spark,
by path (``spark.read.format("delta").load("<root>/base")``) and with ``versionAsOf``. A Spark Connect
server started with delta-spark's pinned jars (jars.lock's ``delta-spark`` group), its session
extension and its catalog is that reader; the compaction itself runs in this worker's own Spark
session as everywhere else. The scenarios' expectations are the shared conformance files', checked
right after each compaction and again at every kept version afterwards (``DeltaReader``'s time
travel): an unpartitioned table, and one partitioned by the day of a timestamp column, whose Delta
partition values and INT96 timestamps delta-spark must read as the Hive base does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import with_timestamp

from cdc_compaction.core.jarcache import group_jars
from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools.local_services import LocalMetastore, SparkConnectServer, free_port

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

SHARED = PROJECT_ROOT.parent / "shared" / "conformance"


@pytest.fixture(scope="module")
def delta_spark(metastore: LocalMetastore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a Spark Connect server with delta-spark (jars, extension, catalog); stopped by its PID."""
    server = SparkConnectServer(
        home=tmp_path_factory.mktemp("delta_spark"),
        metastore_uri=metastore.uri,
        warehouse_dir=str(metastore.home / "warehouse"),
        port=free_port(),
        master="local[2]",
        extra_conf={
            "spark.jars": ",".join(group_jars("delta-spark")),
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.sql.shuffle.partitions": "2",
        },
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
    # The unpartitioned table is the simpler read of the same log and the same time travel (make test-extended).
    pytest.param("primary_key_change", None, id="unpartitioned-primary_key_change", marks=pytest.mark.extended),
    # delta-spark's own server costs about a minute: make test reads the same logs with delta-rs and DuckDB's
    # delta extension (tests/pipeline/test_formats_delta.py, tests/integrations/test_duckdb_format_readers.py).
    pytest.param("delete_then_reinsert", "day", id="by_day-delete_then_reinsert", marks=pytest.mark.extended),
]


@pytest.mark.parametrize(("name", "by_day"), CASES)
def test_delta_spark_reads_every_kept_version(
    name: str, by_day: str | None, delta_spark: str, inprocess: conf.InProcessRunner, spark: Any, tmp_path: Path
) -> None:
    path = SHARED / f"{name}.json"
    scn = _with_timestamp(path, tmp_path / path.name) if by_day else conf.Scenario.load(path)
    part = {"column": "changed_at", "transform": "day"} if by_day else None
    readers: list[Any] = [conf.Reader(spark), conf.DeltaReader("delta-spark", delta_spark)]
    result = conf.run_scenario(
        scn, inprocess, readers, tmp_path / "lake", suffix="_ds", partition_by=part, formats=["delta"]
    )
    assert result.ok, "\n".join(result.failures)
