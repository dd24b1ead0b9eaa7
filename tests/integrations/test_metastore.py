"""Metastore choices: the Thrift metastore at any URI, and the AWS Glue Data Catalog (moto's Glue API on loopback)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from cdc_compaction.core.registry import parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.devtools.local_services import free_port
from cdc_compaction.integrations.engine import GLUE_CLIENT_FACTORY, hive_conf
from cdc_compaction.integrations.metastore import GlueMetastore, Metastore, connect


def _conn(host: str | None = None, port: int | None = None, extra: dict[str, Any] | None = None) -> Any:
    return SimpleNamespace(host=host, port=port, extra_dejson=extra or {})


def test_the_connection_selects_the_catalog() -> None:
    thrift = MetastoreEndpoint.from_connection(_conn("hms.internal", 9083))
    assert (thrift.kind, thrift.uri) == ("thrift", "thrift://hms.internal:9083")
    glue = MetastoreEndpoint.from_connection(_conn(extra={"catalog": "glue", "catalog_id": "123456789012"}))
    assert (glue.kind, glue.uri, glue.aws_conn_id) == ("glue", "glue://123456789012", "aws_default")
    assert MetastoreEndpoint.parse("glue://") == MetastoreEndpoint(kind="glue")
    assert MetastoreEndpoint.parse("thrift://10.0.0.7:9084") == MetastoreEndpoint("10.0.0.7", 9084)
    # The CLI's --metastore takes either form.
    assert MetastoreEndpoint.parse("10.0.0.7:9084") == MetastoreEndpoint("10.0.0.7", 9084)


def test_spark_is_attached_to_the_same_catalog() -> None:
    assert hive_conf(MetastoreEndpoint("hms", 9083), "/w")["spark.hadoop.hive.metastore.uris"] == "thrift://hms:9083"
    glue = hive_conf(MetastoreEndpoint(kind="glue", catalog_id="123456789012"), "s3://w/")
    assert glue["spark.hadoop.hive.metastore.client.factory.class"] == GLUE_CLIENT_FACTORY
    assert glue["spark.hadoop.hive.metastore.glue.catalogid"] == "123456789012"
    assert "spark.hadoop.hive.metastore.uris" not in glue


@pytest.mark.parametrize(
    ("host", "port", "hosts", "expected_port"),
    [
        ("hms.internal", 9083, ("hms.internal",), 9083),
        ("hms.internal", None, ("hms.internal",), 9083),  # Hive's default port
        ("thrift://hms.internal:9084", None, ("hms.internal",), 9084),
        ("thrift://hms.internal:9084", 9084, ("hms.internal",), 9084),
        ("hms.internal:9084/", None, ("hms.internal",), 9084),
        ("h1,h2", 9085, ("h1", "h2"), 9085),
        ("thrift://h1:9083, thrift://h2:9083", None, ("h1", "h2"), 9083),
        ("h1:9086,h2", None, ("h1", "h2"), 9086),
    ],
)
def test_a_connection_host_in_any_usual_form_gives_bare_hosts_and_one_port(
    host: str, port: int | None, hosts: tuple[str, ...], expected_port: int
) -> None:
    """A host typed as a URI once became ``thrift://thrift://h:9083:9083``; every form now gives bare names."""
    ep = MetastoreEndpoint.from_connection(_conn(host, port))
    assert (ep.hosts, ep.port) == (hosts, expected_port)
    expected_uri = ",".join(f"thrift://{h}:{expected_port}" for h in hosts)
    assert ep.uri == expected_uri
    # What Spark is given (hive.metastore.uris takes a comma-separated list: the same failover order).
    assert hive_conf(ep, "/w")["spark.hadoop.hive.metastore.uris"] == expected_uri
    # The URI form reads back to the same endpoint ($CDC_METASTORE_URI).
    assert (MetastoreEndpoint.parse(ep.uri).hosts, MetastoreEndpoint.parse(ep.uri).port) == (hosts, expected_port)


@pytest.mark.parametrize(
    ("host", "port", "why"),
    [
        ("thrift://h1:9083,thrift://h2:9084", None, r"names the ports \[9083, 9084\]"),
        ("thrift://h1:9084", 9083, r"names the ports \[9083, 9084\]"),
        ("http://hms:9083", None, r"scheme 'http'"),
        ("hms:thrift", None, r"no numeric port"),
    ],
)
def test_a_connection_host_that_names_no_single_metastore_port_is_refused(
    host: str, port: int | None, why: str
) -> None:
    from cdc_compaction.core.exceptions import MetastoreError

    conn = SimpleNamespace(conn_id="metastore_default", host=host, port=port, extra_dejson={})
    with pytest.raises(MetastoreError, match=why) as err:
        MetastoreEndpoint.from_connection(conn)
    assert "'metastore_default'" in str(err.value) and host in str(err.value)


@pytest.mark.metastore
def test_the_metastore_of_an_airflow_connection_is_reached_through_the_hive_provider_hook(
    metastore: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The connection's host is written as a URI, as people do; HiveMetastoreHook opens the client."""
    import json

    from airflow.sdk import BaseHook

    from cdc_compaction.integrations.metastore import MetastoreView

    conn = {"conn_type": "hive_metastore", "host": f"thrift://{metastore.host}:{metastore.port}"}
    monkeypatch.setenv("AIRFLOW_CONN_METASTORE_THROUGH_HOOK", json.dumps(conn))
    ep = MetastoreEndpoint.from_connection(BaseHook.get_connection("metastore_through_hook"))
    assert ep == MetastoreEndpoint(metastore.host, metastore.port, conn_id="metastore_through_hook")
    name = f"hook_view_{uuid.uuid4().hex[:8]}"
    view = MetastoreView("default", name, [("id", "bigint")], "SELECT 1 AS id", "SELECT 1 AS id", {"k": "v"})
    with connect(ep, timeout_s=12) as ms:
        ms.put_view(view)
        assert ms.table_property("default", name, "k") == "v"
        # The hook builds its socket without a timeout; connect gives it one (a hung metastore fails the call).
        assert ms._c._oprot.trans._TBufferedTransport__trans.handle.gettimeout() == 12
    # The hook logs (through Airflow's structlog, to stdout) each host it tries, as bare host:port.
    out = capsys.readouterr().out
    assert f"Connected to {metastore.host}:{metastore.port}" in out, out
    # The same metastore, reached without the hook, holds what went through it.
    with connect(MetastoreEndpoint(metastore.host, metastore.port)) as plain:
        assert plain.column_names("default", name) == ["id"]

    # Failover: the metastore listens on 127.0.0.1 only, so 127.0.0.2 (loopback too) refuses on its port;
    # the hook tries the hosts in the written order, and so does the plain socket (the CLI's path).
    two = {"conn_type": "hive_metastore", "host": f"127.0.0.2,{metastore.host}", "port": metastore.port}
    monkeypatch.setenv("AIRFLOW_CONN_METASTORE_TWO_HOSTS", json.dumps(two))
    two_ep = MetastoreEndpoint.from_connection(BaseHook.get_connection("metastore_two_hosts"))
    assert two_ep.uri == f"thrift://127.0.0.2:{metastore.port},thrift://{metastore.host}:{metastore.port}"
    with connect(two_ep) as ms:
        assert ms.column_names("default", name) == ["id"]
    out = capsys.readouterr().out
    assert f"Could not connect to 127.0.0.2:{metastore.port}" in out, out
    assert f"Connected to {metastore.host}:{metastore.port}" in out, out
    with connect(MetastoreEndpoint.parse(two_ep.uri)) as plain:
        assert plain.column_names("default", name) == ["id"]

    # A dead port: the hook finds no host; the refusal names the connection and what to do.
    from cdc_compaction.core.exceptions import MetastoreError

    dead = {"conn_type": "hive_metastore", "host": metastore.host, "port": free_port()}
    monkeypatch.setenv("AIRFLOW_CONN_METASTORE_DEAD", json.dumps(dead))
    dead_ep = MetastoreEndpoint.from_connection(BaseHook.get_connection("metastore_dead"))
    with (
        pytest.raises(MetastoreError, match=r"Airflow connection 'metastore_dead'.*fix the connection"),
        connect(dead_ep, timeout_s=2),
    ):
        pass


@pytest.mark.metastore
def test_an_external_thrift_metastore_by_uri(endpoint: MetastoreEndpoint) -> None:
    """The session's metastore is a separate process on its own port: reached only through its URI."""
    parsed = MetastoreEndpoint.parse(endpoint.uri)
    with connect(parsed) as ms:
        assert isinstance(ms, Metastore)
        assert ms.get_table("default", "no_such_table") is None
    from cdc_compaction.core.exceptions import MetastoreError

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
        from cdc_compaction.core.exceptions import MetastoreError

        with pytest.raises(MetastoreError, match="does not exist in the Glue Data Catalog"):
            ms.set_location(db, "nope", "s3://x/y")


@pytest.mark.metastore
def test_thrift_partitions_are_added_and_moved_in_place(endpoint: MetastoreEndpoint, tmp_path: Any) -> None:
    """What a partitioned base table's publish does: add new partitions, move others in one call, never drop."""
    from hmsclient.genthrift.hive_metastore import ttypes

    db = f"parts_{uuid.uuid4().hex[:8]}"
    with connect(endpoint) as ms:
        client = ms._c
        client.create_database(ttypes.Database(name=db, locationUri=f"file:{tmp_path}/{db}", parameters={}))
        serde = ttypes.SerDeInfo(
            serializationLib="org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe",
            parameters={"path": f"file:{tmp_path}/base"},
        )
        sd = ttypes.StorageDescriptor(
            cols=[ttypes.FieldSchema("id", "int", ""), ttypes.FieldSchema("op", "string", "")],
            location=f"file:{tmp_path}/base",
            inputFormat="org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat",
            outputFormat="org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat",
            serdeInfo=serde,
            parameters={},
        )
        client.create_table(
            ttypes.Table(
                tableName="t_base",
                dbName=db,
                sd=sd,
                partitionKeys=[ttypes.FieldSchema("_cdc_partition", "string", "")],
                tableType="EXTERNAL_TABLE",
                parameters={"EXTERNAL": "TRUE"},
            )
        )
        assert ms.partition_keys(db, "t_base") == ["_cdc_partition"]
        assert ms.partition_keys(db, "nope") is None
        v1 = {v: f"{tmp_path}/base/v00000001-a/_cdc_partition={v}" for v in ("APAC", "EU", "US")}
        assert ms.set_partitions(db, "t_base", v1) == {"added": ["APAC", "EU", "US"], "moved": []}
        assert ms.set_partitions(db, "t_base", v1) == {"added": [], "moved": []}, "idempotent"
        # Commit 2 rewrote EU and US and added LATAM; APAC is reused by reference.
        v2 = {**v1, **{v: f"{tmp_path}/base/v00000002-b/_cdc_partition={v}" for v in ("EU", "LATAM", "US")}}
        assert ms.set_partitions(db, "t_base", v2) == {"added": ["LATAM"], "moved": ["EU", "US"]}
        assert ms.partitions(db, "t_base") == v2
        raw = {p.values[0]: p for p in client.get_partitions(db, "t_base", -1)}
        assert "path" not in (raw["LATAM"].sd.serdeInfo.parameters or {}), "Spark's path option stays on the table"
        assert raw["EU"].sd.cols == raw["APAC"].sd.cols == sd.cols
        # Dropping is the caller's last step (vanished partitions), and never touches data.
        assert ms.drop_partitions(db, "t_base", ["US", "nope"]) == ["US"]
        assert sorted(ms.partitions(db, "t_base")) == ["APAC", "EU", "LATAM"]
        from cdc_compaction.core.exceptions import MetastoreError

        with pytest.raises(MetastoreError, match="does not exist; run ensure_tables first"):
            ms.set_partitions(db, "nope", v1)


@pytest.mark.s3
def test_glue_partitions_are_added_and_moved_in_place(glue: Any) -> None:
    db = glue.db
    with connect(MetastoreEndpoint(kind="glue")) as ms:
        assert ms.partition_keys(db, "orders_incremental") == ["_cdc_increment"]
        assert ms.partition_keys(db, "orders_base") == []
        base = "s3://lake/shop/orders/base"
        v1 = {f"p{i:03d}": f"{base}/v00000001-a/_cdc_partition=p{i:03d}" for i in range(130)}
        result = ms.set_partitions(db, "orders_incremental", v1)
        assert len(result["added"]) == 130 and result["moved"] == []
        # 110 partitions rewritten by commit 2: moved in batches of Glue's limit (100 per BatchUpdatePartition).
        v2 = {**v1, **{f"p{i:03d}": f"{base}/v00000002-b/_cdc_partition=p{i:03d}" for i in range(110)}}
        v2["new"] = f"{base}/v00000002-b/_cdc_partition=new"
        result = ms.set_partitions(db, "orders_incremental", v2)
        assert result["added"] == ["new"] and len(result["moved"]) == 110
        assert ms.partitions(db, "orders_incremental") == v2
        raw = glue.client.get_partition(DatabaseName=db, TableName="orders_incremental", PartitionValues=["p000"])
        assert raw["Partition"]["StorageDescriptor"]["Location"] == v2["p000"]
        assert ms.set_partitions(db, "orders_incremental", v2) == {"added": [], "moved": []}


def _views_of(db: str) -> list[Any]:
    from cdc_compaction.core import dialects
    from cdc_compaction.pipeline import views

    cfg = parse_table(
        {
            "database": db,
            "table": "orders",
            "columns": [
                {"name": "id", "type": "int"},
                {"name": "op", "type": "string"},
                {"name": "ts", "type": "bigint"},
            ],
            "primary_key": ["id"],
            "order_by": ["ts"],
            "storage_root": "s3://lake/shop/orders",
            "views": {"metastore": ["spark", "hive", "trino"], "trino_catalog": "awsdatacatalog"},
        }
    )
    made = []

    class Recorder:
        def put_view(self, view: Any) -> None:
            made.append(view)

    rt = SimpleNamespace(cfg=cfg)
    views.put_other_views(rt, Recorder(), dialects.metastore_views(cfg))  # type: ignore[arg-type]
    return made


@pytest.mark.s3
def test_glue_holds_hive_and_athena_views(glue: Any) -> None:
    """Athena reads views from Glue in Trino's encoding; Hive views keep HiveQL. Both through UpdateTable too."""
    from cdc_compaction.core import dialects

    made = _views_of(glue.db)
    assert [v.name for v in made] == [
        "orders_view_hive",
        "orders_pending_rejects_hive",
        "orders_view_trino",
        "orders_pending_rejects_trino",
    ]
    with connect(MetastoreEndpoint(kind="glue")) as ms:
        for v in made:
            ms.put_view(v)
            ms.put_view(v)  # again: replaced, not duplicated
        ms.set_properties(glue.db, "orders_view_trino", {"cdc.freshness.view.increment": "increment_2026112210"})
        from cdc_compaction.core.exceptions import MetastoreError

        with pytest.raises(MetastoreError, match="is a table, not a view"):
            ms.put_view(type(made[0])(**{**made[0].__dict__, "name": "orders_base"}))
    trino = glue.client.get_table(DatabaseName=glue.db, Name="orders_view_trino")["Table"]
    assert trino["TableType"] == "VIRTUAL_VIEW" and trino["Parameters"]["presto_view"] == "true"
    assert trino["Parameters"]["cdc.freshness.view.increment"] == "increment_2026112210"
    doc = dialects.decode_trino_view_text(trino["ViewOriginalText"])
    assert doc["catalog"] == "awsdatacatalog" and doc["schema"] == glue.db
    assert trino["ViewExpandedText"] == "/* Presto View */"
    hive = glue.client.get_table(DatabaseName=glue.db, Name="orders_view_hive")["Table"]
    assert "INPUT__FILE__NAME" in hive["ViewOriginalText"] and hive["ViewOriginalText"] == hive["ViewExpandedText"]
    assert [c["Name"] for c in hive["StorageDescriptor"]["Columns"]] == ["id", "op", "ts"]


@pytest.mark.metastore
def test_the_thrift_metastore_holds_hive_and_trino_views(endpoint: MetastoreEndpoint, spark: Any) -> None:
    """The local Hive 2.3 metastore stores both kinds as VIRTUAL_VIEW; Spark lists them beside its own."""
    db = f"views_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE DATABASE `{db}`")
    made = _views_of(db)
    with connect(endpoint) as ms:
        for v in made:
            ms.put_view(v)
        ms.put_view(made[0])
        t = ms.get_table(db, "orders_view_trino")
        assert t.tableType == "VIRTUAL_VIEW" and t.parameters["presto_view"] == "true"
        assert t.viewOriginalText.startswith("/* Presto View: ")
        h = ms.get_table(db, "orders_view_hive")
        assert h.viewExpandedText == made[0].expanded_text and [c.name for c in h.sd.cols] == ["id", "op", "ts"]
    listed = {r["viewName"] for r in spark.sql(f"SHOW VIEWS IN `{db}`").collect()}
    assert {v.name for v in made} <= listed


def test_the_unreachable_metastore_error_names_a_make_target_that_exists(tmp_path: Any) -> None:
    """The fix it names must run: every ``make X`` in the message is a target of the Makefile."""
    import re
    from pathlib import Path

    from cdc_compaction.core.exceptions import MetastoreError

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.MULTILINE))
    with pytest.raises(MetastoreError) as err, connect(MetastoreEndpoint("127.0.0.1", free_port()), timeout_s=2):
        pass
    named = re.findall(r"make ([a-z][a-z-]*)", str(err.value))
    assert named, str(err.value)
    assert set(named) <= targets, (named, str(err.value))
