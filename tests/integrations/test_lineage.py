"""OpenLineage facets of a compaction run (``cdc_compaction.integrations.lineage``), checked against the registry.

Every expected dataset, column and count below is written from the registry entry and the
commit in the test itself (README, "Lineage (OpenLineage)"), never from the module under test.
The real emission through the provider's file transport is checked by
``tests/devtools/test_conformance.py::test_scenario_dag`` (``late_update_for_deleted_key``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from openlineage.client.serde import Serde

from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.registry import parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.integrations import lineage
from cdc_compaction.pipeline.runtime import Runtime

HIVE = MetastoreEndpoint("metastore.example", 9083)
INCREMENTS = ["increment_2026112200", "increment_2026112201"]
FILES = [
    {"increment": "increment_2026112200", "name": "a.parquet", "path": "x", "size": 100, "rows": 3},
    {"increment": "increment_2026112200", "name": "b.parquet", "path": "x", "size": 50, "rows": 2},
    {"increment": "increment_2026112201", "name": "a.parquet", "path": "x", "size": 70, "rows": 4},
]
STATS = {
    "increment_rows": 9,
    "rejected_rows": 1,
    "output_rows": 6,
    "output_visible_rows": 5,
    "output_tombstones": 1,
    "superseded_rows": 2,
}


def cdc_doc(root: Path, **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "database": "school",
        "table": "students",
        "columns": [
            {"name": "id", "type": "int", "comment": "student number"},
            {"name": "full_name", "type": "string"},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "bigint"},
        ],
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": str(root),
    }
    doc.update(overrides)
    return doc


def commit(**overrides: Any) -> Commit:
    fields: dict[str, Any] = {
        "seq": 4,
        "version": "v00000004-abc-1",
        "plan_id": "abc",
        "run_id": "manual__1",
        "parent_seq": 3,
        "files": FILES,
        "increments": INCREMENTS,
        "stats": STATS,
    }
    fields.update(overrides)
    return Commit(**fields)


def as_json(obj: Any) -> Any:
    return json.loads(Serde.to_json(obj))


def columns_of(schema: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(f["name"], f["type"], f["ordinal_position"]) for f in schema["fields"]]


def lineage_fields(facet: dict[str, Any]) -> dict[str, set[tuple[str, str, str, str, str]]]:
    """Output column -> {(input namespace, input name, input column, type, subtype)}."""
    return {
        out: {
            (i["namespace"], i["name"], i["field"], t["type"], t["subtype"])
            for i in f["inputFields"]
            for t in i["transformations"]
        }
        for out, f in facet["fields"].items()
    }


def test_a_cdc_run_reads_each_increment_and_writes_the_base_table_column_by_column(tmp_path: Path) -> None:
    root = tmp_path / "lake" / "students"
    cfg = parse_table(cdc_doc(root))
    got = lineage.operator_lineage(cfg, HIVE, commit(), [{"name": "data/p0.parquet", "size": 640}])

    incs = [("file", f"{root}/incremental/{inc}") for inc in INCREMENTS]
    inputs = [as_json(i) for i in got.inputs]
    assert [(i["namespace"], i["name"]) for i in inputs] == incs
    registry_schema = [("id", "int", 1), ("full_name", "string", 2), ("op", "string", 3), ("ts_ms", "bigint", 4)]
    for i in inputs:
        assert columns_of(i["facets"]["schema"]) == registry_schema
    # increment_..00: files a (3 rows, 100 B) and b (2 rows, 50 B); ..01: one file of 4 rows, 70 B.
    assert [{k: i["inputFacets"]["inputStatistics"][k] for k in ("rowCount", "size", "fileCount")} for i in inputs] == [
        {"rowCount": 5, "size": 150, "fileCount": 2},
        {"rowCount": 4, "size": 70, "fileCount": 1},
    ]

    (out,) = [as_json(o) for o in got.outputs]
    assert (out["namespace"], out["name"]) == ("hive://metastore.example:9083", "school.students_base")
    assert columns_of(out["facets"]["schema"]) == [
        *registry_schema,
        ("_cdc_increment", "string", 5),
        ("_cdc_file", "string", 6),
        ("_cdc_pos", "bigint", 7),
        ("_cdc_ingested_at", "timestamp", 8),
    ]
    assert out["facets"]["schema"]["fields"][0]["description"] == "student number"
    columns = out["facets"]["columnLineage"]
    # Registry columns are the winning event's values; the metadata columns come from no column.
    assert lineage_fields(columns) == {
        c: {(ns, name, c, "DIRECT", "IDENTITY") for ns, name in incs} for c in ("id", "full_name", "op", "ts_ms")
    }
    influences = {(i["field"], t["subtype"]) for i in columns["dataset"] for t in i["transformations"]}
    assert influences == {("id", "WINDOW"), ("ts_ms", "SORT"), ("op", "FILTER")}
    assert {(i["namespace"], i["name"]) for i in columns["dataset"]} == set(incs)
    stats = out["outputFacets"]["outputStatistics"]
    assert (stats["rowCount"], stats["size"], stats["fileCount"]) == (5, 640, 1)

    run = as_json(got.run_facets[lineage.RUN_FACET])
    assert {k: v for k, v in run.items() if not k.startswith("_")} == {
        "seq": 4,
        "version": "v00000004-abc-1",
        "planId": "abc",
        "increments": 2,
        "eventsIn": 9,
        "eventsRejected": 1,
        "eventsOut": 6,
        "visibleRows": 5,
        "tombstones": 1,
    }


def test_delete_markers_and_key_changes_decide_rows_and_a_partition_column_is_derived(tmp_path: Path) -> None:
    doc = cdc_doc(tmp_path / "t", partition_by={"column": "changed_at", "transform": "day"})
    doc["columns"] += [
        {"name": "old_id", "type": "int"},
        {"name": "gone", "type": "boolean"},
        {"name": "changed_at", "type": "timestamp"},
    ]
    doc.update(old_key=["old_id"], deleted_column="gone")
    cfg = parse_table(doc)
    out = as_json(lineage.operator_lineage(cfg, HIVE, commit(increments=INCREMENTS[:1], files=FILES[:1])).outputs[0])
    inc = ("file", f"{tmp_path}/t/incremental/{INCREMENTS[0]}")
    assert columns_of(out["facets"]["schema"])[-1] == ("_cdc_partition", "string", 12)
    fields = lineage_fields(out["facets"]["columnLineage"])
    assert fields["_cdc_partition"] == {(*inc, "changed_at", "DIRECT", "TRANSFORMATION")}
    assert fields["gone"] == {(*inc, "gone", "DIRECT", "IDENTITY")}
    influences = {
        (i["field"], t["subtype"]) for i in out["facets"]["columnLineage"]["dataset"] for t in i["transformations"]
    }
    assert influences == {
        ("id", "WINDOW"),
        ("ts_ms", "SORT"),
        ("op", "FILTER"),
        ("gone", "FILTER"),
        ("old_id", "FILTER"),
    }
    # Without output files (the stats file unreadable) only the row count is known.
    stats = out["outputFacets"]["outputStatistics"]
    assert stats["rowCount"] == 5 and "size" not in stats and "fileCount" not in stats


def test_a_snapshot_table_derives_its_operation_and_hashes_from_the_key_and_compared_columns() -> None:
    cfg = parse_table(
        {
            "mode": "snapshot",
            "database": "bank",
            "table": "accounts",
            "columns": [
                {"name": "bank", "type": "string"},
                {"name": "id", "type": "int"},
                {"name": "balance", "type": "decimal(12,2)"},
                {"name": "as_of", "type": "date"},
            ],
            "primary_key": ["bank", "id"],
            "business_date": {"column": "as_of"},
            "storage_root": "s3a://lake-bucket/bank/accounts/",
        }
    )
    history = {"2026-11-22": {"location": "s3a://x/h1", "rows": 3}, "2026-11-23": {"location": "s3a://x/h2", "rows": 2}}
    got = lineage.operator_lineage(
        cfg, HIVE, commit(increments=INCREMENTS[1:], files=FILES[2:], stats={**STATS, "history": history})
    )
    inc = ("s3://lake-bucket", f"bank/accounts/incremental/{INCREMENTS[1]}")
    assert [(i.namespace, i.name) for i in got.inputs] == [inc]
    out, hist = (as_json(o) for o in got.outputs)
    # The history table: the net changes, partitioned by the business date as a string, 3 + 2 rows written.
    assert (hist["namespace"], hist["name"]) == ("hive://metastore.example:9083", "bank.accounts_history")
    assert [(n, t) for n, t, _ in columns_of(hist["facets"]["schema"])] == [
        ("bank", "string"),
        ("id", "int"),
        ("balance", "decimal(12,2)"),
        ("as_of", "date"),
        ("operation", "string"),
        ("_cdc_key_hash", "string"),
        ("_cdc_row_hash", "string"),
        ("_cdc_increment", "string"),
        ("_cdc_file", "string"),
        ("_cdc_pos", "bigint"),
        ("_cdc_ingested_at", "timestamp"),
        ("eff_start_date", "string"),
    ]
    assert hist["outputFacets"]["outputStatistics"]["rowCount"] == 5
    assert lineage_fields(hist["facets"]["columnLineage"])["_cdc_row_hash"] == {
        (*inc, "balance", "DIRECT", "TRANSFORMATION")
    }
    assert [(n, t) for n, t, _ in columns_of(out["facets"]["schema"])][4:8] == [
        ("operation", "string"),
        ("eff_start_date", "date"),
        ("_cdc_key_hash", "string"),
        ("_cdc_row_hash", "string"),
    ]
    fields = lineage_fields(out["facets"]["columnLineage"])
    derived = {(*inc, c, "DIRECT", "TRANSFORMATION") for c in ("bank", "id", "balance")}
    assert fields["operation"] == derived
    assert fields["eff_start_date"] == {(*inc, "as_of", "DIRECT", "TRANSFORMATION")}
    assert fields["_cdc_key_hash"] == {(*inc, c, "DIRECT", "TRANSFORMATION") for c in ("bank", "id")}
    assert fields["_cdc_row_hash"] == {(*inc, "balance", "DIRECT", "TRANSFORMATION")}
    hashes = out["facets"]["columnLineage"]["fields"]["_cdc_key_hash"]["inputFields"]
    assert all(t["masking"] for i in hashes for t in i["transformations"]), "a hash masks the key"
    influences = {
        (i["field"], t["subtype"]) for i in out["facets"]["columnLineage"]["dataset"] for t in i["transformations"]
    }
    assert influences == {("bank", "JOIN"), ("id", "JOIN"), ("as_of", "SORT")}


def test_a_keyless_table_is_decided_by_its_order_op_and_before_images() -> None:
    cfg = parse_table(
        {
            "mode": "keyless",
            "database": "web",
            "table": "visits",
            "columns": [
                {"name": "name", "type": "string"},
                {"name": "_before_name", "type": "string"},
                {"name": "op", "type": "string"},
                {"name": "lsn", "type": "bigint"},
            ],
            "order_by": ["lsn"],
            "storage_root": "/lake/web/visits",
        }
    )
    out = as_json(lineage.operator_lineage(cfg, HIVE, commit()).outputs[0])
    assert set(out["facets"]["columnLineage"]["fields"]) == {"name", "_before_name", "op", "lsn"}
    influences = {
        (i["field"], t["subtype"]) for i in out["facets"]["columnLineage"]["dataset"] for t in i["transformations"]
    }
    assert influences == {("lsn", "SORT"), ("op", "FILTER"), ("_before_name", "FILTER")}


@pytest.mark.parametrize(
    ("endpoint", "region", "expected"),
    [
        (MetastoreEndpoint("10.1.2.3", 9999), None, ("hive://10.1.2.3:9999", "db.t_base")),
        (
            MetastoreEndpoint(kind="glue", catalog_id="123456789012"),
            "eu-west-1",
            ("arn:aws:glue:eu-west-1:123456789012", "table/db/t_base"),
        ),
        # Glue without a region or account cannot be named the ARN way: the catalog URI still names the table.
        (MetastoreEndpoint(kind="glue"), "eu-west-1", ("glue://default", "db.t_base")),
    ],
    ids=["hive", "glue-arn", "glue-no-account"],
)
def test_table_dataset_naming(endpoint: MetastoreEndpoint, region: str | None, expected: tuple[str, str]) -> None:
    assert lineage.table_dataset(endpoint, "db", "t_base", region) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("s3://bucket/a/b/", ("s3://bucket", "a/b")),
        ("s3a://bucket/a/b", ("s3://bucket", "a/b")),
        ("/lake/a/b", ("file", "/lake/a/b")),
        ("file:///lake/a", ("file", "/lake/a")),
    ],
)
def test_storage_dataset_naming(path: str, expected: tuple[str, str]) -> None:
    assert lineage.storage_dataset(path) == expected


def test_publish_lineage_reads_the_commit_and_never_raises(tmp_path: Path) -> None:
    cfg = parse_table(cdc_doc(tmp_path / "lake"))
    lake = Lake(cfg)
    rt = Runtime(cfg=cfg, lake=lake, metastore=HIVE, engine=None)  # type: ignore[arg-type]
    assert lake.try_commit(commit(seq=1, parent_seq=0))
    version_dir = Path(lake.layout.version_dir("v00000004-abc-1"))
    version_dir.mkdir(parents=True)
    (version_dir / "_cdc_stats.json").write_text(
        json.dumps(
            {"output_files": [{"name": "data/a.parquet", "size": 10}, {"name": "tombstones/t.parquet", "size": 3}]}
        )
    )
    got = lineage.publish_lineage(rt, {"seq": 1, "version": "v00000004-abc-1"})
    out = as_json(got.outputs[0])
    assert (out["namespace"], out["name"]) == ("hive://metastore.example:9083", "school.students_base")
    # Only data files are the table's: tombstones/ is another table.
    assert (out["outputFacets"]["outputStatistics"]["size"], out["outputFacets"]["outputStatistics"]["fileCount"]) == (
        10,
        1,
    )
    assert len(got.inputs) == 2

    before = lineage.LINEAGE_FAILURES[cfg.qualified_name]
    for result in ({"seq": 2}, None, {"version": "x"}):  # a commit that does not exist; no result at all
        empty = lineage.publish_lineage(rt, result)
        assert (empty.inputs, empty.outputs, empty.run_facets) == ([], [], {})
    assert lineage.LINEAGE_FAILURES[cfg.qualified_name] == before + 3


def test_the_publish_operator_builds_facets_only_when_openlineage_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a transport the provider is off and no facets are built (no lake reads on every run);
    a builder that fails leaves the task's result as it was."""
    from cdc_compaction.airflow.factory import LineagePythonOperator

    def run() -> tuple[Any, list[Any]]:
        built: list[Any] = []
        op = LineagePythonOperator(
            task_id="publish", python_callable=lambda: {"seq": 7}, lineage_builder=lambda r: built.append(r) or "facets"
        )
        assert op.execute({}) == {"seq": 7}
        return op.get_openlineage_facets_on_complete(None), built

    # The provider caches its settings, except under pytest (PYTEST_VERSION): the environment is read each time.
    for key in [k for k in os.environ if "OPENLINEAGE" in k]:
        monkeypatch.delenv(key)
    assert run() == (None, [])
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", json.dumps({"type": "console"}))
    assert run() == ("facets", [{"seq": 7}])

    def broken(result: Any) -> Any:
        raise RuntimeError("lineage back end down")

    op = LineagePythonOperator(task_id="publish", python_callable=lambda: {"seq": 8}, lineage_builder=broken)
    assert op.execute({}) == {"seq": 8}
    assert op.get_openlineage_facets_on_complete(None) is None


def _plan(root: Path, parent_seq: int) -> dict[str, Any]:
    """A plan document with the fields the compact task's lineage reads (pipeline.plan writes them)."""
    landing = root / "incremental"
    files = [
        {**f, "path": str(landing / f["increment"] / f["name"])}
        for f in FILES  # increment_..00: a (3 rows, 100 B) and b (2, 50); ..01: a (4, 70)
    ]
    return {
        "table": "school.students",
        "seq": parent_seq + 1,
        "parent_seq": parent_seq,
        "base_location": str(root / "base" / "v00000003-old-1" / "data"),
        "output_location": str(root / "base" / "v00000004-abc-1"),
        "files": files,
        "increments": INCREMENTS,
        "columns": [{"name": "id", "type": "int"}, {"name": "full_name", "type": "string"}],
    }


def test_the_compact_task_reports_the_planned_increments_in_and_the_new_version_out(tmp_path: Path) -> None:
    """compact's OpenLineage facets, from the plan its --plan names: each increment directory and the live
    version in, the version directory it writes out."""
    from cdc_compaction.airflow import factory

    cfg = parse_table(cdc_doc(tmp_path / "lake"))
    op = factory.build_dag(cfg).get_task("compact")
    plan_file = tmp_path / "plan.json"
    plan = _plan(tmp_path / "lake", parent_seq=3)
    plan_file.write_text(json.dumps(plan))
    op.application_args = ["--plan", str(plan_file)]  # as Airflow renders the plan-path XCom
    got = op.get_openlineage_facets_on_complete(None)
    inputs = {(i.namespace, i.name): as_json(i) for i in got.inputs}
    inc = [str(tmp_path / "lake" / "incremental" / name) for name in INCREMENTS]
    base = str(tmp_path / "lake" / "base" / "v00000003-old-1" / "data")
    assert sorted(inputs) == sorted([("file", inc[0]), ("file", inc[1]), ("file", base)])
    stats = inputs[("file", inc[0])]["inputFacets"]["inputStatistics"]
    assert (stats["rowCount"], stats["size"], stats["fileCount"]) == (5, 150, 2)
    assert columns_of(inputs[("file", inc[1])]["facets"]["schema"])[:2] == [
        ("id", "int", 1),
        ("full_name", "string", 2),
    ]
    ((out),) = [as_json(o) for o in got.outputs]
    assert (out["namespace"], out["name"]) == ("file", plan["output_location"])

    first = _plan(tmp_path / "lake", parent_seq=0)  # the first compaction: no live version to read
    plan_file.write_text(json.dumps(first))
    assert sorted(i.name for i in op.get_openlineage_facets_on_complete(None).inputs) == sorted(inc)

    before = lineage.LINEAGE_FAILURES["school.students"]
    plan_file.unlink()
    empty = op.get_openlineage_facets_on_complete(None)
    assert (empty.inputs, empty.outputs) == ([], []), "an unreadable plan: no facets, the task stands"
    assert lineage.LINEAGE_FAILURES["school.students"] == before + 1


def test_the_run_facet_names_a_json_schema_the_plugin_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """_schemaURL is an https URL (the spec's rule), under Airflow's address, of a schema the facet satisfies."""
    import jsonschema
    from fastapi.testclient import TestClient

    from cdc_compaction.airflow.ui import create_app

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/")
    facet = as_json(lineage.run_facet(commit()))
    url = facet["_schemaURL"]
    assert url.startswith("https://airflow.example.com/cdc/") and url.endswith("#/$defs/CdcCompactionRunFacet"), url
    path, _, pointer = url.removeprefix("https://airflow.example.com").partition("#")
    # The page app mounted at /cdc (the plugin) serves it without a session: consumers fetch it.
    served = TestClient(create_app(lambda: lambda ids: set()), root_path="/cdc").get(path)
    assert served.status_code == 200
    schema = served.json()
    own = schema["$defs"]["CdcCompactionRunFacet"]["allOf"][1]  # [0] is the spec's RunFacet (_producer, _schemaURL)
    assert pointer == "/$defs/CdcCompactionRunFacet"
    jsonschema.validate(facet, own)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**facet, "eventsIn": -1}, own)
