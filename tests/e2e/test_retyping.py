"""Retyping a live column: a widening updates the metastore so every table and view stays readable.

``int -> bigint`` in the registry used to be accepted and to publish a base that neither
the base table nor the view could read any more (the metastore still said ``int``). A
widening is now applied to the base, incremental and compactor tables and the views are
re-created; any other change is a :class:`SchemaChangeError` that names the column.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import compact_once

from cdc_compaction.core.exceptions import SchemaChangeError
from cdc_compaction.core.hive_types import hive_widening
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import land
from cdc_compaction.integrations.metastore import _spark_schema_widened, connect
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def _columns(**types: str) -> list[dict[str, str]]:
    base = {"id": "int", "score": "int", "price": "decimal(5,2)", "ratio": "float", "op": "string", "ts_ms": "bigint"}
    return [{"name": n, "type": types.get(n, t)} for n, t in base.items()]


def _select(spark: Any, cfg: Any, kind: str) -> list[tuple[Any, ...]]:
    names = table_names(cfg)
    for t in ("base_table", "incremental_table", "compactor_table", "view_name"):
        spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
    rows = spark.sql(f"SELECT id, score, price, ratio FROM `{cfg.database}`.`{names[kind]}` WHERE op <> 'd'")
    return sorted(tuple(r) for r in rows.collect())


def test_a_widened_column_keeps_every_table_and_view_readable(make_cfg, runtime, spark, tmp_path) -> None:
    rt = runtime(make_cfg(columns=_columns(), order_by=["ts_ms"]))
    ensure_tables(rt)
    land(
        rt.cfg, "increment_2026112200", [[{"id": 1, "score": 7, "price": "1.25", "ratio": 0.5, "op": "c", "ts_ms": 1}]]
    )
    compact_once(rt, "run-1")

    wide = make_cfg(
        table=rt.cfg.table,
        columns=_columns(score="bigint", price="decimal(12,4)", ratio="double"),
        order_by=["ts_ms"],
    )
    rt = runtime(wide)
    ensure_tables(rt)
    with connect(rt.metastore) as ms:
        for kind in ("base_table", "incremental_table", "compactor_table"):
            cols = {c.name: c.type for c in ms.get_table(wide.database, rt.names[kind]).sd.cols}
            assert (cols["score"], cols["price"], cols["ratio"]) == ("bigint", "decimal(12,4)", "double"), kind
    # The live version (written with the old types) reads through the widened tables and view.
    assert _select(spark, wide, "base_table") == [(1, 7, Decimal("1.2500"), 0.5)]
    assert _select(spark, wide, "view_name") == [(1, 7, Decimal("1.2500"), 0.5)]
    # New files with the new types, next to pending ones with the old types.
    inc = Lake(wide).layout.incremental
    (d := tmp_path / "x").mkdir()
    pq.write_table(
        pa.table(
            {
                "id": pa.array([2], pa.int32()),
                "score": pa.array([2**40], pa.int64()),
                "price": pa.array([Decimal("12345678.1234")], pa.decimal128(12, 4)),
                "ratio": pa.array([0.25], pa.float64()),
                "op": pa.array(["c"]),
                "ts_ms": pa.array([2], pa.int64()),
            }
        ),
        d / "part-00000.parquet",
    )
    (target := Path(inc) / "increment_2026112201").mkdir(parents=True)
    (d / "part-00000.parquet").rename(target / "part-00000.parquet")
    refresh_view(rt)
    want = [(1, 7, Decimal("1.2500"), 0.5), (2, 2**40, Decimal("12345678.1234"), 0.25)]
    assert _select(spark, wide, "view_name") == want
    compact_once(rt, "run-2")
    assert _select(spark, wide, "base_table") == want
    assert _select(spark, wide, "view_name") == want


@pytest.mark.parametrize(
    ("change", "old", "new"),
    [
        ({"score": "smallint"}, "int", "smallint"),
        ({"score": "string"}, "int", "string"),
        ({"price": "decimal(5,3)"}, "decimal(5,2)", "decimal(5,3)"),
        ({"ratio": "int"}, "float", "int"),
    ],
    ids=["narrowing", "int-to-string", "decimal-losing-digits", "float-to-int"],
)
def test_any_other_type_change_is_refused_naming_the_column(make_cfg, runtime, change, old, new) -> None:
    rt = runtime(make_cfg(columns=_columns(), order_by=["ts_ms"]))
    ensure_tables(rt)
    changed = runtime(make_cfg(table=rt.cfg.table, columns=_columns(**change), order_by=["ts_ms"]))
    (col,) = change
    with pytest.raises(SchemaChangeError) as err:
        ensure_tables(changed)
    msg = str(err.value)
    assert f"column {col!r} is {old} in table" in msg and f"registry says {new}" in msg
    assert "only widening" in msg
    with connect(rt.metastore) as ms:
        cols = {c.name: c.type for c in ms.get_table(rt.cfg.database, rt.names["base_table"]).sd.cols}
    assert cols[col] == old, "nothing was changed"


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        ("int", "bigint", True),
        ("tinyint", "int", True),
        ("bigint", "int", False),
        ("int", "int", False),
        ("float", "double", True),
        ("int", "double", True),
        ("bigint", "double", False),
        ("double", "float", False),
        ("decimal(5,2)", "decimal(10,2)", True),
        ("decimal(5,2)", "decimal(7,4)", True),
        ("decimal(5,2)", "decimal(6,4)", False),
        ("decimal(5,2)", "decimal(5,3)", False),
        ("varchar(10)", "string", True),
        ("string", "varchar(10)", False),
        ("int", "string", False),
        ("date", "timestamp", False),
    ],
)
def test_which_type_changes_are_widenings(old: str, new: str, ok: bool) -> None:
    assert hive_widening(old, new) is ok


def test_sparks_schema_copy_is_retyped_whole_or_in_pieces() -> None:
    fields = [
        {"name": "ID", "type": "integer", "nullable": True, "metadata": {}},
        {"name": "v", "type": "string", "nullable": True, "metadata": {"__CHAR_VARCHAR_TYPE_STRING": "varchar(3)"}},
    ]
    text = json.dumps({"type": "struct", "fields": fields})
    whole = _spark_schema_widened({"spark.sql.sources.schema": text, "x": "1"}, {"id": "bigint", "v": "string"})
    got = json.loads(whole["spark.sql.sources.schema"])["fields"]
    assert [(f["name"], f["type"], f["metadata"]) for f in got] == [("ID", "long", {}), ("v", "string", {})]
    assert whole["x"] == "1"
    parts = {"spark.sql.sources.schema.numParts": "3"}
    for i in range(3):
        parts[f"spark.sql.sources.schema.part.{i}"] = text[i * 40 : (i + 1) * 40] if i < 2 else text[80:]
    pieces = _spark_schema_widened(parts, {"id": "decimal(12,4)"})
    joined = "".join(pieces[f"spark.sql.sources.schema.part.{i}"] for i in range(3))
    assert json.loads(joined)["fields"][0]["type"] == "decimal(12,4)"
    assert _spark_schema_widened({"a": "b"}, {"id": "bigint"}) == {"a": "b"}
