"""The Thrift metastore and the DDL engines take ``s3a://`` locations on moto's server.

Spark's DDL of a lake on S3 (``CREATE TABLE ... LOCATION 's3a://...'``, a partition's location)
is checked by the metastore with its own file system, so the local Hive 2.3 metastore (the
``metastore`` fixture) carries the S3A jars and the ``aws_default`` connection's settings; the
session (:class:`SessionEngine`) and a ``spark-submit`` of the DDL (:class:`SparkSubmitEngine`, the
DAG's publish on the registry's default engine) both reach it.  The statements are the test's own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED_CONFORMANCE, student_doc

from cdc_compaction.core import sql
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.core.storage.s3 import S3Storage
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools.local_services import LocalMetastore
from cdc_compaction.integrations.engine import SessionEngine, SparkSubmitEngine

pytestmark = [pytest.mark.s3, pytest.mark.spark, pytest.mark.metastore]


@pytest.fixture
def bucket(aws_default: str) -> str:
    name = f"lake-{uuid.uuid4().hex[:12]}"
    S3Storage().client.create_bucket(Bucket=name)
    return name


def s3a_registry_docs(bucket: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., dict[str, Any]]:
    """The conformance runs' registry entries (``conf.registry_doc``) with their lake in ``bucket`` through
    ``s3a://``, for the rest of the test; returned, to parse an entry again."""
    make_doc = conf.registry_doc

    def on_s3a(*args: Any, **kwargs: Any) -> dict[str, Any]:
        d = make_doc(*args, **kwargs)
        d["storage_root"] = f"s3a://{bucket}/lake/{d['table']}"
        return d

    monkeypatch.setattr(conf, "registry_doc", on_s3a)
    return on_s3a


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


#: The shared scenario of the formats' test: two compactions, a key deleted and inserted again, names that move
#: partitions (the table is partitioned by ``full_name``).
SCENARIO = SHARED_CONFORMANCE / "delete_then_reinsert.json"


# make test-extended: some minutes (S3A against moto, the DDL through the metastore on S3A, two formats).
@pytest.mark.extended
def test_a_partitioned_s3a_lake_with_both_formats_its_rollback_and_erase(
    spark: Any, endpoint: MetastoreEndpoint, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partitioned table on ``s3a://`` with Delta and Iceberg: the job (in the session) and its DDL (the
    session, through the Thrift metastore) on S3A; after each compaction the base through Spark's catalog, a
    plain read of the pointer's files, delta-rs and pyiceberg (the Iceberg table in moto's Glue,
    ``CDC_ICEBERG_CATALOG=glue``; its snapshots at every kept version) equal the scenario's rows.  Then a
    rollback to version 1 and an erase, each read back the same four ways."""
    import boto3
    from pyiceberg.catalog.glue import GlueCatalog

    from cdc_compaction.operations.erase import erase
    from cdc_compaction.operations.travel import rollback

    moto = S3Storage().client.meta.endpoint_url
    keys = {"AWS_ACCESS_KEY_ID": "testing-access-key", "AWS_SECRET_ACCESS_KEY": "testing-secret-key"}
    monkeypatch.setenv("CDC_ICEBERG_CATALOG", "glue")
    # delta-rs (object_store) reads S3 with the environment a user of the lake gives it.
    for k, v in {**keys, "AWS_ENDPOINT_URL": moto, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}.items():
        monkeypatch.setenv(k, v)
    glue = boto3.client("glue", endpoint_url=moto, region_name="us-east-1", **{k.lower(): v for k, v in keys.items()})
    s3_props = {
        "s3.endpoint": moto,
        "s3.access-key-id": keys["AWS_ACCESS_KEY_ID"],
        "s3.secret-access-key": keys["AWS_SECRET_ACCESS_KEY"],
        "s3.region": "us-east-1",
    }

    def open_glue(cfg: TableConfig) -> Any:
        return GlueCatalog(f"cdc_{cfg.database}", client=glue, **s3_props)

    on_s3a = s3a_registry_docs(bucket, monkeypatch)
    scn = conf.Scenario.load(SCENARIO)
    part, formats = {"column": "full_name", "transform": "identity"}, ["delta", "iceberg"]
    readers: list[Any] = [
        conf.Reader(spark),
        conf.PointerFilesReader(),
        conf.DeltaReader("delta-rs"),
        conf.IcebergReader("pyiceberg", catalog=open_glue),
    ]
    runner = conf.InProcessRunner(spark, endpoint)
    result = conf.run_scenario(scn, runner, readers, tmp_path, suffix="_pf", partition_by=part, formats=formats)
    assert result.ok, "\n".join(result.failures)
    cfg = parse_table(on_s3a(scn, tmp_path, "_pf", part, formats))
    assert cfg.storage_root.startswith("s3a://") and Lake(cfg).latest_commit().seq == 2

    def check(what: str, expected: list[dict[str, Any]]) -> None:
        failures = [
            f"{what} ({r.name}):\n" + "\n".join(d)
            for r in readers
            if (d := conf.diff_rows(expected, r.visible_base(cfg), conf.compared_types(cfg)))
        ]
        assert not failures, "\n".join(failures)

    # Version 1 again, published as commit 3: Alice and Bob in their partitions.
    rollback(cfg, 1, endpoint, by="test")
    assert Lake(cfg).latest_commit().seq == 3
    alice, bob = {"id": 1, "full_name": "Alice", "ts_ms": 0}, {"id": 2, "full_name": "Bob", "ts_ms": 0}
    check("after the rollback", [alice, bob])
    # Bob erased from every kept version: his partition holds no row any more.
    erase(cfg, "id = 2", actor="test", metastore=endpoint)
    check("after the erase", [alice])
    base = f"`{cfg.database}`.`{sql.table_names(cfg)['base_table']}`"
    partitions = {r[0] for r in spark.sql(f"SHOW PARTITIONS {base}").collect()}
    # The partition's name is its value encoded (docs/partitioned.md: small letters in capitals between ~).
    assert partitions == {"_cdc_partition=A~LICE~"}, partitions
