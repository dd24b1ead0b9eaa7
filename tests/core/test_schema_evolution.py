"""Schema changes that follow the source (``schema_changes: evolve``), through the real steps.

The source adds a column and widens another; later it drops one; later still the table is
retired. Each time the metastore, the rows read through the base table and the view, and
the commit record must say what the source did -- with the registry never edited.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import finish_run

from cdc_compaction.airflow import factory
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.sql import table_names
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

REGISTRY = [
    {"name": "id", "type": "int"},
    {"name": "score", "type": "int"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
]


def _land(cfg: Any, increment: str, columns: dict[str, pa.Array]) -> None:
    """Write one change file into an increment, as the replicator would (its own column types)."""
    target = Path(Lake(cfg).layout.incremental) / increment
    target.mkdir(parents=True)
    pq.write_table(pa.table(columns), target / "part-00000.parquet")


def _rows(spark: Any, cfg: Any, kind: str, columns: str = "id, score, email") -> list[tuple[Any, ...]]:
    names = table_names(cfg)
    # Spark caches a table's files: the view reads the base, the tombstones and the incremental table.
    for t in ("base_table", "tombstones_table", "incremental_table", "compactor_table", "view_name"):
        spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
    name = f"`{cfg.database}`.`{names[kind]}`"
    return sorted(tuple(r) for r in spark.sql(f"SELECT {columns} FROM {name} WHERE op <> 'd'").collect())


def _metastore_columns(rt: Any, kind: str) -> dict[str, str]:
    with connect(rt.metastore) as ms:
        return {c.name: c.type for c in ms.get_table(rt.cfg.database, rt.names[kind]).sd.cols}


def test_added_widened_and_dropped_columns_follow_the_source(make_cfg, runtime, spark) -> None:
    cfg = make_cfg(columns=REGISTRY, order_by=["ts_ms"], schema_changes="evolve")
    rt = runtime(cfg)
    ensure_tables(rt)
    i32, i64 = pa.int32(), pa.int64()
    _land(
        cfg,
        "increment_2026112200",
        {
            "id": pa.array([1], i32),
            "score": pa.array([7], i32),
            "op": pa.array(["c"]),
            "ts_ms": pa.array([1], i64),
        },
    )
    finish_run(rt, plan(rt, "run-1"))

    # The source adds `email` and widens `score` to bigint; the registry is not edited.
    _land(
        cfg,
        "increment_2026112201",
        {
            "id": pa.array([1, 2], i32),
            "score": pa.array([2**40, 5], i64),
            "op": pa.array(["u", "c"]),
            "ts_ms": pa.array([2, 2], i64),
            "email": pa.array(["a@x.io", "b@x.io"]),
        },
    )
    rt = runtime(cfg)
    # Between runs the views keep answering: the file of the wider type is held back until a run widens.
    held = refresh_view(rt)
    assert [h["increment"] for h in held.get("held_back", [])] == ["increment_2026112201"]
    assert _rows(spark, cfg, "view_name", "id, score") == [(1, 7)]
    alerted: list[dict[str, Any]] = []
    path = plan(rt, "run-2", on_schema_changed=alerted.extend)
    finish_run(rt, path)
    landed = str(Path(Lake(cfg).layout.incremental) / "increment_2026112201" / "part-00000.parquet")
    changed = [
        {"change": "added", "column": "email", "new": "string", "file": landed, "files": 1},
        {"change": "widened", "column": "score", "old": "int", "new": "bigint", "file": landed, "files": 1},
    ]
    assert sorted(alerted, key=lambda c: c["column"]) == changed
    for kind in ("base_table", "incremental_table", "compactor_table"):
        cols = _metastore_columns(rt, kind)
        assert (cols["score"], cols["email"]) == ("bigint", "string"), kind
    want = [(1, 2**40, "a@x.io"), (2, 5, "b@x.io")]
    assert _rows(spark, cfg, "base_table") == want
    assert _rows(spark, cfg, "view_name") == want
    commit = Lake(cfg).latest_commit()
    assert commit.schema is not None
    assert [(c["name"], c["type"]) for c in commit.schema["columns"]] == [
        ("id", "int"),
        ("score", "bigint"),
        ("op", "string"),
        ("ts_ms", "bigint"),
        ("email", "string"),
    ]
    assert sorted(commit.schema["changes"], key=lambda c: c["column"]) == changed
    # The plan recorded the columns it read with; publish (idempotent, here a retry) reports the changes.
    doc = json.loads(Path(path).read_text())
    assert doc["columns"] == commit.schema["columns"]
    assert sorted(doc["schema_changes"], key=lambda c: c["column"]) == changed
    assert sorted(publish(rt, path)["schema_changes"], key=lambda c: c["column"]) == changed
    # A runtime made from the unedited registry (every DAG task makes one) sees the evolved table.
    again = runtime(cfg)
    assert "email" in again.cfg.column_names
    assert ensure_tables(again)["ddl_statements"] == 0

    # The source drops `score`: kept in every table, NULL for the new row, recorded once.
    _land(
        cfg,
        "increment_2026112202",
        {"id": pa.array([3], i32), "op": pa.array(["c"]), "ts_ms": pa.array([3], i64), "email": pa.array(["c@x"])},
    )
    rt = runtime(cfg)
    alerted.clear()
    finish_run(rt, plan(rt, "run-3", on_schema_changed=alerted.extend))
    dropped = str(Path(Lake(cfg).layout.incremental) / "increment_2026112202" / "part-00000.parquet")
    assert alerted == [{"change": "dropped", "column": "score", "old": "bigint", "file": dropped, "files": 1}]
    assert _metastore_columns(rt, "base_table")["score"] == "bigint"
    want.append((3, None, "c@x"))
    assert _rows(spark, cfg, "base_table") == want
    assert _rows(spark, cfg, "view_name") == want
    assert Lake(cfg).latest_commit().schema["changes"] == alerted  # type: ignore[index]

    # Later the source adds `phone`: `score` stays missing, which is no news now (and no half of a rename).
    _land(
        cfg,
        "increment_2026112203",
        {
            "id": pa.array([4], i32),
            "op": pa.array(["c"]),
            "ts_ms": pa.array([4], i64),
            "email": pa.array(["d@x"]),
            "phone": pa.array(["555"]),
        },
    )
    rt = runtime(cfg)
    alerted.clear()
    finish_run(rt, plan(rt, "run-4", on_schema_changed=alerted.extend))
    assert [(c["change"], c["column"]) for c in alerted] == [("added", "phone")]
    assert _metastore_columns(rt, "base_table")["phone"] == "string"
    phones = [(1, 2**40, None), (2, 5, None), (3, None, None), (4, None, "555")]
    assert _rows(spark, cfg, "view_name", "id, score, phone") == phones
    want.append((4, None, "d@x"))

    # The source table is dropped: the owner sets retired: true. No schedule; the data stays readable.
    retired = make_cfg(table=cfg.table, columns=REGISTRY, order_by=["ts_ms"], schema_changes="evolve", retired=True)
    assert factory.build_dag(retired).schedule is None
    rt = runtime(retired)
    ensure_tables(rt)
    assert plan(rt, "run-5") == "", "nothing landed: a manual run of a retired table drains and stops"
    assert _rows(spark, retired, "view_name") == want
    assert _rows(spark, retired, "base_table") == want


BAD_NAMES = ["bad name", "x-y"]


def test_a_new_column_that_cannot_be_named_quarantines_its_file_and_the_others_compact(
    make_cfg, runtime, spark
) -> None:
    """``evolve`` adds the source's new columns; one whose name is no identifier refuses only its own file."""
    cfg = make_cfg(columns=REGISTRY, order_by=["ts_ms"], schema_changes="evolve", on_bad_file="quarantine")
    rt = runtime(cfg)
    ensure_tables(rt)
    i32, i64 = pa.int32(), pa.int64()
    row = {"id": pa.array([1], i32), "score": pa.array([7], i32), "op": pa.array(["c"]), "ts_ms": pa.array([1], i64)}
    _land(cfg, "increment_2026112200", {**row, "email": pa.array(["a@x.io"])})
    for i, name in enumerate(BAD_NAMES, start=1):
        _land(cfg, f"increment_202611220{i}", {**row, "id": pa.array([10 + i], i32), name: pa.array(["v"])})
    quarantined: list[dict[str, Any]] = []
    path = plan(rt, "run-1", on_quarantined=quarantined.extend)
    assert path, "the good file is planned"
    finish_run(rt, path)
    landing = Path(Lake(cfg).layout.incremental)
    assert sorted(q["file"] for q in quarantined) == [
        str(landing / f"increment_202611220{i}" / "part-00000.parquet") for i in (1, 2)
    ]
    for q, name in zip(sorted(quarantined, key=lambda q: q["file"]), BAD_NAMES, strict=True):
        assert q["reason"].startswith("incompatible schema: new columns that cannot be table columns")
        assert f"column {name!r} is not a valid identifier" in q["reason"]
        assert "schema_changes: ignore" in q["reason"]
        assert Path(q["quarantined_to"]).exists()
    # The good file compacted, with the column it added; nothing of the refused files reached the tables.
    assert _rows(spark, cfg, "base_table", "id, score, email") == [(1, 7, "a@x.io")]
    columns = {c for c in _metastore_columns(rt, "base_table") if not c.startswith("_cdc_")}
    assert columns == {"id", "score", "op", "ts_ms", "email"}


def test_a_new_column_that_cannot_be_named_fails_the_plan_naming_table_file_and_column(make_cfg, runtime) -> None:
    from cdc_compaction.core.exceptions import BadInputError

    cfg = make_cfg(columns=REGISTRY, order_by=["ts_ms"], schema_changes="evolve")
    rt = runtime(cfg)
    ensure_tables(rt)
    i32, i64 = pa.int32(), pa.int64()
    cols = {"id": pa.array([1], i32), "score": pa.array([7], i32), "op": pa.array(["c"]), "ts_ms": pa.array([1], i64)}
    _land(cfg, "increment_2026112200", {**cols, "x-y": pa.array([1], i32)})
    with pytest.raises(BadInputError) as err:
        plan(rt, "run-1")
    text = str(err.value)
    landed = str(Path(Lake(cfg).layout.incremental) / "increment_2026112200" / "part-00000.parquet")
    assert cfg.qualified_name in text and landed in text
    assert "column 'x-y' is not a valid identifier" in text and "on_bad_file: quarantine" in text
