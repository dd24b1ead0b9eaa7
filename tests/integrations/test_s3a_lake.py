"""Spark's own S3: a compaction whose job reads and writes ``s3a://`` through Hadoop's S3A, on moto's server.

Unlike ``test_s3_lake.py`` (whose ``MirrorEngine`` runs the job on a local copy), nothing here is
copied: the session (the ``spark`` fixture, started with the S3A jars of ``make jars``) is pointed
at the lake's store by the engine, from the Airflow connection ``aws_default`` (defined in the
environment, aimed at moto's server on loopback), and the job reads the increments and the base,
and writes the new version, through ``s3a://``.  The commit protocol (lease, commit record,
pointer) runs through boto3 against the same server.

The catalog is moto's Glue, registered by ``test_s3_lake.register_in_glue`` as Spark's DDL would
(the Thrift metastore with S3A, Spark's own DDL and the views: ``test_s3a_metastore.py``, docs/cloud.md).
Every compacted base is read back twice and compared with the scenario file's expectation: through
Spark (``s3a://``) and through boto3/pyarrow.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import race

from cdc_compaction.core import sql
from cdc_compaction.core.exceptions import PreconditionFailedError
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.storage.s3 import S3Storage
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.pipeline.runtime import Runtime

from .test_s3_lake import GLUE, SHARED, GlueReader, S3Runner, _on_s3

# Over a minute (64 s here: S3A against moto's server); test_s3_lake.py covers the protocol quicker.
pytestmark = [pytest.mark.s3, pytest.mark.spark, pytest.mark.extended]


class S3ARunner(S3Runner):
    """The DAG's task functions with the real in-process engine (no mirror): the job's I/O is S3A's."""

    def runtime(self, cfg: TableConfig) -> Runtime:
        rt = conf.InProcessRunner.runtime(self, cfg)
        engine = rt.engine

        def no_ddl(cfg: TableConfig, statements: list[str]) -> None:
            raise AssertionError(f"{cfg.qualified_name}: no Spark DDL expected on the Glue fixture: {statements}")

        engine.run_sql = no_ddl  # type: ignore[method-assign]
        return dataclasses.replace(rt, metastore=GLUE)


class SparkS3AReader(GlueReader):
    """The base as Spark reads it: Glue's location, read through ``s3a://`` by the session."""

    name = "spark-s3a"

    def __init__(self, glue: Any, spark: Any) -> None:
        super().__init__(glue)
        self.spark = spark

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        name = sql.table_names(cfg)["base_table"]
        location = self.glue.get_table(DatabaseName=cfg.database, Name=name)["Table"]["StorageDescriptor"]["Location"]
        assert location.startswith("s3a://"), location
        if not GlueReader.visible_base(self, cfg):
            return []  # an empty version has no file for Spark to infer a schema from
        cols = [c.name for c in cfg.columns]
        return [r.asDict() for r in self.spark.read.parquet(location).select(*cols).collect()]


class BotoReader(GlueReader):
    name = "boto3"


@pytest.fixture
def bucket(aws_default: str) -> str:
    name = f"lake-{uuid.uuid4().hex[:12]}"
    S3Storage().client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def glue(aws_default: str) -> Any:
    import boto3

    return boto3.client(
        "glue", endpoint_url=aws_default, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
    )


def _on_s3a(bucket: str) -> Any:
    on_s3 = _on_s3(conf.registry_doc, bucket)

    def doc(*args: Any, **kwargs: Any) -> dict[str, Any]:
        d = on_s3(*args, **kwargs)
        d["storage_root"] = "s3a://" + d["storage_root"][len("s3://") :]
        return d

    return doc


def test_spark_reads_and_writes_the_lake_through_s3a(
    spark: Any, glue: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scn = conf.Scenario.load(SHARED / "late_update_for_deleted_key.json")
    on_s3a = _on_s3a(bucket)
    cfg = parse_table(on_s3a(scn, tmp_path, "_s3a"))
    monkeypatch.setattr(conf, "registry_doc", on_s3a)
    runner = S3ARunner(spark, glue, tmp_path / "work")
    readers = [SparkS3AReader(glue, spark), BotoReader(glue)]
    result = conf.run_scenario(scn, runner, readers, tmp_path, suffix="_s3a")  # type: ignore[arg-type]
    assert result.ok, "\n".join(result.failures)

    # The version was written by Spark into the bucket: its data files are S3 objects under the
    # published location, which is the one Glue names.
    lake = Lake(cfg)
    latest = lake.latest_commit()
    location = lake.data_location(latest)
    assert location.startswith(f"s3a://{bucket}/")
    keys = [
        o["Key"]
        for o in S3Storage().client.list_objects_v2(Bucket=bucket, Prefix=location.split("/", 3)[3].rstrip("/") + "/")[
            "Contents"
        ]
    ]
    assert keys and all(k.endswith(".parquet") for k in keys), keys
    assert (lake.read_pointer() or {}).get("version") == latest.version

    # The commit protocol's conditional writes hold on the endpoint Spark wrote to: the newest
    # commit record cannot be written again with other bytes, and of 4 writers racing for the
    # next one exactly one wins.
    with pytest.raises(PreconditionFailedError):
        lake.storage.create_exclusive(lake.layout.commit_path(latest.seq), "{}")
    won, lost, other = race(4, lambda i: lake.storage.create_exclusive(lake.layout.commit_path(latest.seq + 1), str(i)))
    assert (len(won), len(lost), other) == (1, 3, [])
