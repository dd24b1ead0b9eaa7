"""The warm engine on an S3 lake: the job and the DDL in a Spark Connect server that reads and writes ``s3a://``.

The DAG's default engine is a long-lived Spark Connect server (``spark.engine: spark_connect``). For a
lake on S3 the server starts with the S3A jar group and the storage connection's (``aws_default``)
``fs.s3a.*`` settings, its credentials in the server's environment only (never its command line or a
file), so its own catalog work (the DDL's ``s3a://`` locations) and every session's reads and writes
reach the store. Here the store is moto's server on loopback, the catalog the session's Thrift
metastore (which takes ``s3a://`` locations, ``test_s3a_metastore.py``); a shared scenario runs
through :class:`ConnectEngine` and each compacted base is read back through the metastore by the
classic session and as plain files from the pointer, and compared with the scenario's expectation.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SHARED_CONFORMANCE

from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.storage.s3 import S3Storage
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools.local_services import LocalMetastore, SparkConnectServer
from cdc_compaction.integrations.engine import ConnectEngine, configure_s3a
from cdc_compaction.pipeline.runtime import Runtime

from . import test_s3a_metastore
from .test_s3a_metastore import s3a_registry_docs

#: A new bucket on moto's server (the fixture of test_s3a_metastore.py).
bucket = test_s3a_metastore.bucket

# Some minutes: a Connect server JVM with the SDK bundle, S3A against moto's server.
pytestmark = [pytest.mark.s3, pytest.mark.spark, pytest.mark.metastore, pytest.mark.extended]

SECRET = "testing-secret-key"  # aws_default's (tests/conftest.py): must reach no argv and no file


@pytest.fixture
def s3a_connect(metastore: LocalMetastore, aws_default: str, tmp_path: Path) -> Iterator[SparkConnectServer]:
    """A Spark Connect server on 127.0.0.1 for an S3 lake (the ``aws_default`` connection: moto), stopped by PID."""
    from conftest import free_port

    server = SparkConnectServer(
        home=tmp_path / "connect",
        metastore_uri=metastore.uri,
        warehouse_dir=str(metastore.home / "warehouse"),
        port=free_port(),
        master="local[2]",
        extra_conf={"spark.sql.shuffle.partitions": "4"},
    ).with_s3a("aws_default")
    server.start()
    try:
        yield server
    finally:
        server.stop()


class ConnectRunner(conf.InProcessRunner):
    """The DAG's task functions with the ``spark_connect`` engine: the job and the DDL in the server."""

    def __init__(self, spark: Any, endpoint: Any, url: str) -> None:
        super().__init__(spark, endpoint)
        self.url = url

    def runtime(self, cfg: TableConfig) -> Runtime:
        # The classic session only reads the base back (conf.Reader): pointed at the store as its engine would.
        configure_s3a(self.spark, cfg)
        return Runtime(cfg=cfg, lake=Lake(cfg), metastore=self.endpoint, engine=ConnectEngine(self.url, cfg))


class TableOnly(ConnectEngine):
    """A Connect engine whose sessions get no S3A settings of the table (what the server itself must know)."""

    @staticmethod
    def _configure(spark: Any, cfg: TableConfig | None) -> None:
        ConnectEngine._configure(spark, None)


def test_a_compaction_through_spark_connect_on_an_s3a_lake(
    s3a_connect: SparkConnectServer,
    spark: Any,
    endpoint: Any,
    bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_s3a = s3a_registry_docs(bucket, monkeypatch)
    scn = conf.Scenario.load(SHARED_CONFORMANCE / "late_update_for_deleted_key.json")
    runner = ConnectRunner(spark, endpoint, s3a_connect.url)
    readers: list[Any] = [conf.Reader(spark), conf.PointerFilesReader()]
    result = conf.run_scenario(scn, runner, readers, tmp_path, suffix="_sc")
    assert result.ok, "\n".join(result.failures)
    cfg = parse_table(on_s3a(scn, tmp_path, "_sc"))
    lake = Lake(cfg)
    location = lake.data_location(lake.latest_commit())
    assert location.startswith(f"s3a://{bucket}/"), location
    prefix = location.split("/", 3)[3].rstrip("/") + "/"
    keys = [o["Key"] for o in S3Storage().client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    assert keys and all(k.endswith(".parquet") for k in keys), keys

    # The server reaches the store with its own settings: a session given none reads a bucket no session
    # has touched (S3A file systems are cached per bucket in the server's JVM, with their first settings).
    other = f"lake-{uuid.uuid4().hex[:12]}"
    S3Storage().client.create_bucket(Bucket=other)
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": [1, 2, 3]}), buf)
    S3Storage().client.put_object(Bucket=other, Key="t/part-0.parquet", Body=buf.getvalue())
    with TableOnly(s3a_connect.url).session(None) as session:
        rows = sorted(r["id"] for r in session.read.parquet(f"s3a://{other}/t/").collect())
    assert rows == [1, 2, 3]

    # The credentials are in the server's environment only: not on its command line, not in a file of its home.
    pid = s3a_connect.pid()
    assert pid is not None
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    assert SECRET not in argv and "fs.s3a.secret.key" not in argv
    assert "fs.s3a.endpoint" in argv, "the endpoint is the server's own setting"
    assert SECRET in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    for root, _, names in os.walk(s3a_connect.home):
        for name in names:
            path = Path(root, name)
            if path.is_file() and path.stat().st_size < 50 * 2**20:
                assert SECRET.encode() not in path.read_bytes(), path
