"""Metastore choices: the Thrift metastore at any URI, and the AWS Glue Data Catalog (moto's Glue API on loopback)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from cdc_compaction.engine import GLUE_CLIENT_FACTORY, hive_conf
from cdc_compaction.local_services import free_port
from cdc_compaction.metastore import GlueMetastore, Metastore, connect
from cdc_compaction.settings import MetastoreEndpoint


def _conn(host: str | None = None, port: int | None = None, extra: dict[str, Any] | None = None) -> Any:
    return SimpleNamespace(host=host, port=port, extra_dejson=extra or {})


def test_the_connection_selects_the_catalog() -> None:
    thrift = MetastoreEndpoint.from_connection(_conn("hms.internal", 9083))
    assert (thrift.kind, thrift.uri) == ("thrift", "thrift://hms.internal:9083")
    glue = MetastoreEndpoint.from_connection(_conn(extra={"catalog": "glue", "catalog_id": "123456789012"}))
    assert (glue.kind, glue.uri, glue.aws_conn_id) == ("glue", "glue://123456789012", "aws_default")
    assert MetastoreEndpoint.parse("glue://") == MetastoreEndpoint(kind="glue")
    assert MetastoreEndpoint.parse("thrift://10.0.0.7:9084") == MetastoreEndpoint("10.0.0.7", 9084)


def test_spark_is_attached_to_the_same_catalog() -> None:
    assert hive_conf(MetastoreEndpoint("hms", 9083), "/w")["spark.hadoop.hive.metastore.uris"] == "thrift://hms:9083"
    glue = hive_conf(MetastoreEndpoint(kind="glue", catalog_id="123456789012"), "s3://w/")
    assert glue["spark.hadoop.hive.metastore.client.factory.class"] == GLUE_CLIENT_FACTORY
    assert glue["spark.hadoop.hive.metastore.glue.catalogid"] == "123456789012"
    assert "spark.hadoop.hive.metastore.uris" not in glue


@pytest.mark.metastore
def test_an_external_thrift_metastore_by_uri(endpoint: MetastoreEndpoint) -> None:
    """The session's metastore is a separate process on its own port: reached only through its URI."""
    parsed = MetastoreEndpoint.parse(endpoint.uri)
    with connect(parsed) as ms:
        assert isinstance(ms, Metastore)
        assert ms.get_table("default", "no_such_table") is None
    from cdc_compaction.exceptions import MetastoreError

    with (
        pytest.raises(MetastoreError, match=r"cannot reach the Hive metastore at thrift://127\.0\.0\.1:"),
        connect(MetastoreEndpoint("127.0.0.1", free_port()), timeout_s=2),
    ):
        pass


@pytest.fixture
def glue(aws_default: str) -> Any:
    """A Glue database with two tables in moto, and aws_default pointing at it."""
    import boto3

    client = boto3.client(
        "glue",
        endpoint_url=aws_default,
        region_name="us-east-1",
        aws_access_key_id="t",
        aws_secret_access_key="t",
    )
    db = f"shop_{uuid.uuid4().hex[:8]}"
    columns = [{"Name": "id", "Type": "int"}, {"Name": "op", "Type": "string"}]
    serde = {"SerializationLibrary": "org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe"}
    client.create_database(DatabaseInput={"Name": db})
    client.create_table(
        DatabaseName=db,
        TableInput={
            "Name": "orders_base",
            "StorageDescriptor": {
                "Columns": columns,
                "Location": "s3://lake/shop/orders/base/v00000001-a",
                "SerdeInfo": {**serde, "Parameters": {"path": "s3://lake/shop/orders/base/v00000001-a"}},
            },
            "Parameters": {"cdc.fingerprint": "f1", "EXTERNAL": "TRUE"},
            "TableType": "EXTERNAL_TABLE",
        },
    )
    client.create_table(
        DatabaseName=db,
        TableInput={
            "Name": "orders_incremental",
            "StorageDescriptor": {"Columns": columns, "Location": "s3://lake/shop/orders/incremental"},
            "PartitionKeys": [{"Name": "_cdc_increment", "Type": "string"}],
        },
    )
    return SimpleNamespace(client=client, db=db)


@pytest.mark.s3
def test_glue_catalog_operations(glue: Any) -> None:
    db = glue.db
    with connect(MetastoreEndpoint(kind="glue")) as ms:
        assert isinstance(ms, GlueMetastore)
        assert ms.get_table(db, "nope") is None
        assert ms.table_property(db, "orders_base", "cdc.fingerprint") == "f1"
        assert ms.column_names(db, "orders_base") == ["id", "op"]
        # The swap: location and Spark's 'path' serde option move together, in one UpdateTable.
        ms.set_location(db, "orders_base", "s3://lake/shop/orders/base/v00000002-b")
        raw = glue.client.get_table(DatabaseName=db, Name="orders_base")["Table"]
        assert raw["StorageDescriptor"]["Location"] == "s3://lake/shop/orders/base/v00000002-b"
        assert raw["StorageDescriptor"]["SerdeInfo"]["Parameters"]["path"] == "s3://lake/shop/orders/base/v00000002-b"
        assert raw["Parameters"]["cdc.fingerprint"] == "f1" and raw["TableType"] == "EXTERNAL_TABLE"
        assert ms.table_location(db, "orders_base") == "s3://lake/shop/orders/base/v00000002-b"
        # Partitions: in batches past Glue's per-call limits (100 create, 25 delete).
        wanted = {
            f"increment_2026{i:06d}": f"s3://lake/shop/orders/incremental/increment_2026{i:06d}" for i in range(130)
        }
        assert len(ms.add_partitions(db, "orders_incremental", wanted)) == 130
        assert ms.add_partitions(db, "orders_incremental", wanted) == [], "idempotent"
        assert ms.partitions(db, "orders_incremental") == wanted
        # A partition that moved (the storage root changed) is re-registered at its new place.
        moved = {"increment_2026000000": "s3://other/increment_2026000000"}
        assert ms.add_partitions(db, "orders_incremental", moved) == ["increment_2026000000"]
        assert ms.partitions(db, "orders_incremental")["increment_2026000000"] == "s3://other/increment_2026000000"
        gone = [*sorted(wanted)[:40], "increment_never"]
        assert ms.drop_partitions(db, "orders_incremental", gone) == sorted(wanted)[:40]
        assert len(ms.partitions(db, "orders_incremental")) == 90
        from cdc_compaction.exceptions import MetastoreError

        with pytest.raises(MetastoreError, match="does not exist in the Glue Data Catalog"):
            ms.set_location(db, "nope", "s3://x/y")
