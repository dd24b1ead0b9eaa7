"""The Thrift metastore and the DDL engines take ``s3a://`` locations on moto's server.

Spark's DDL of a lake on S3 (``CREATE TABLE ... LOCATION 's3a://...'``, a partition's location)
is checked by the metastore with its own file system, so the local Hive 2.3 metastore (the
``metastore`` fixture) carries the S3A jars and the ``aws_default`` connection's settings; the
session (:class:`SessionEngine`) and a ``spark-submit`` of the DDL (:class:`SparkSubmitEngine`, the
DAG's publish on the registry's default engine) both reach it.  The statements are the test's own.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import student_doc

from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.core.storage.s3 import S3Storage
from cdc_compaction.devtools.local_services import LocalMetastore
from cdc_compaction.integrations.engine import SessionEngine, SparkSubmitEngine

pytestmark = [pytest.mark.s3, pytest.mark.spark, pytest.mark.metastore]


@pytest.fixture
def bucket(aws_default: str) -> str:
    name = f"lake-{uuid.uuid4().hex[:12]}"
    S3Storage().client.create_bucket(Bucket=name)
    return name


def _cfg(bucket: str, tmp_path: Path) -> TableConfig:
    table = f"t_{uuid.uuid4().hex[:8]}"
    doc = student_doc(tmp_path, table, database="s3a_ddl")
    doc["storage_root"] = f"s3a://{bucket}/lake/{table}"
    return parse_table(doc)


def _ddl(cfg: TableConfig) -> tuple[str, list[str]]:
    root = cfg.storage_root
    name = f"`{cfg.database}`.`{cfg.table}`"
    return name, [
        f"CREATE DATABASE IF NOT EXISTS `{cfg.database}`",
        f"CREATE TABLE {name} (id INT, full_name STRING, day STRING) USING parquet PARTITIONED BY (day) "
        f"LOCATION '{root}/data'",
        f"ALTER TABLE {name} ADD PARTITION (day='2026-11-29') LOCATION '{root}/data/v1/day=2026-11-29'",
        f"CREATE OR REPLACE VIEW `{cfg.database}`.`{cfg.table}_view` AS SELECT id, full_name, day FROM {name}",
    ]


def _locations(spark: Any, name: str) -> set[str]:
    """The table's and its partition's locations, as the metastore records them."""
    rows = spark.sql(f"DESCRIBE FORMATTED {name} PARTITION (day='2026-11-29')").collect()
    return {r["data_type"] for r in rows if r["col_name"] == "Location"}


def test_the_session_creates_tables_and_partitions_on_s3a(spark: Any, bucket: str, tmp_path: Path) -> None:
    cfg = _cfg(bucket, tmp_path)
    name, statements = _ddl(cfg)
    SessionEngine(spark, cfg).run_sql(cfg, statements)
    assert _locations(spark, name) == {f"{cfg.storage_root}/data", f"{cfg.storage_root}/data/v1/day=2026-11-29"}
    spark.sql(f"INSERT INTO {name} PARTITION (day='2026-11-29') VALUES (1, 'a')")
    rows = spark.sql(f"SELECT id, full_name, day FROM `{cfg.database}`.`{cfg.table}_view`").collect()
    assert [tuple(r) for r in rows] == [(1, "a", "2026-11-29")]
    keys = S3Storage().client.list_objects_v2(Bucket=bucket, Prefix=f"lake/{cfg.table}/data/v1/day=2026-11-29/")
    assert [o["Key"] for o in keys.get("Contents", []) if o["Key"].endswith(".parquet")], keys


# About a minute (a spark-submit JVM with the SDK bundle); the DAG's publish on S3A runs it again in the
# PostgreSQL-truth test on S3A (tests/e2e/test_postgres_truth.py, extended too).
@pytest.mark.extended
def test_spark_submit_ddl_reaches_s3a(
    spark: Any, endpoint: MetastoreEndpoint, metastore: LocalMetastore, bucket: str, tmp_path: Path
) -> None:
    """The DAG's DDL in its own ``spark-submit`` (registry default engine) gets the S3A jars and settings."""
    cfg = _cfg(bucket, tmp_path)
    name, statements = _ddl(cfg)
    SparkSubmitEngine(endpoint, str(metastore.home / "warehouse")).run_sql(cfg, statements)
    assert _locations(spark, name) == {f"{cfg.storage_root}/data", f"{cfg.storage_root}/data/v1/day=2026-11-29"}
