"""The refusals of the Spark-with-Iceberg reader, without a JVM: what is missing and what to run.

The reads themselves run against a real Spark 4.1 Connect server in
tests/integrations/test_iceberg_spark_reader.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools import iceberg_spark


def test_a_missing_second_spark_names_the_make_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_ICEBERG_SPARK", str(tmp_path / "nothing"))
    with pytest.raises(iceberg_spark.IcebergSparkError, match=r"make iceberg-spark.*requirements-iceberg-spark"):
        iceberg_spark.spark_home()


def test_a_catalog_on_an_object_store_is_refused_by_name() -> None:
    with pytest.raises(iceberg_spark.IcebergSparkError, match=r"s3://b/t/iceberg/metadata/catalog.db.*local"):
        iceberg_spark.catalog_conf("cdc_db", "s3://b/t/iceberg/metadata/catalog.db", "s3://b/t/iceberg")


def test_the_catalog_is_the_projects_sqlite_file_under_its_name() -> None:
    got = iceberg_spark.catalog_conf("cdc_db", "/lake/t/iceberg/metadata/catalog.db", "file:///lake/t/iceberg")
    assert got["spark.sql.catalog.cdc_db"] == "org.apache.iceberg.spark.SparkCatalog"
    assert got["spark.sql.catalog.cdc_db.type"] == "jdbc"
    assert got["spark.sql.catalog.cdc_db.uri"] == "jdbc:sqlite:/lake/t/iceberg/metadata/catalog.db"


def test_spark_reads_with_a_connect_url_and_only_spark() -> None:
    with pytest.raises(ValueError, match="Spark Connect"):
        conf.IcebergReader("spark")
    with pytest.raises(ValueError, match="Spark Connect"):
        conf.IcebergReader("pyiceberg", connect_url="sc://127.0.0.1:1")
    assert conf.IcebergReader("spark", connect_url="sc://127.0.0.1:1").name == "iceberg/spark"
