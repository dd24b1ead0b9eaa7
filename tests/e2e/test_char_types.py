"""``char(n)`` and ``varchar(n)`` columns, end to end: landed, compacted in Spark, read through the tables and views.

A source's CHAR(n) arrives blank-padded to n characters (PostgreSQL's and Debezium's text of a
``bpchar``), VARCHAR(n) as written. The expected rows are those values as landed: the contract is that
compaction neither trims nor pads what the source sent, and that the Hive tables declare the types
the registry says (a reader of the metastore sees ``char(3)``, not ``string``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import compact_once

from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import land
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

COLUMNS = [
    {"name": "id", "type": "int"},
    {"name": "code", "type": "char(3)"},
    {"name": "label", "type": "varchar(10)"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
]


def _rows(spark: Any, cfg: Any, kind: str) -> list[tuple[Any, ...]]:
    names = table_names(cfg)
    for t in ("base_table", "tombstones_table", "incremental_table", "compactor_table", "view_name"):
        spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
    rows = spark.sql(f"SELECT id, code, label FROM `{cfg.database}`.`{names[kind]}` WHERE op <> 'd'").collect()
    return sorted(tuple(r) for r in rows)


def _duckdb_rows(cfg: Any) -> list[tuple[Any, ...]]:
    with duckdb.connect() as con:
        con.execute(Path(str(cfg.views.duckdb)).read_text())
        view = f'"{cfg.database}"."{cfg.table}_view"'
        return sorted(con.execute(f"SELECT id, code, label FROM {view} WHERE op <> 'd'").fetchall())


def test_char_and_varchar_columns_compact_and_read_back_as_landed(make_cfg, runtime, spark, tmp_path) -> None:
    duck = str(tmp_path / "duck" / "views.sql")
    rt = runtime(make_cfg(columns=COLUMNS, order_by=["ts_ms"], views={"duckdb": duck}))
    ensure_tables(rt)
    with connect(rt.metastore) as ms:
        for kind in ("base_table", "incremental_table", "compactor_table"):
            cols = {c.name: c.type for c in ms.get_table(rt.cfg.database, rt.names[kind]).sd.cols}
            assert (cols["code"], cols["label"]) == ("char(3)", "varchar(10)"), kind
    land(
        rt.cfg,
        "increment_2026112200",
        [
            [
                {"id": 1, "code": "ab ", "label": "first", "op": "c", "ts_ms": 1},
                {"id": 2, "code": "xyz", "label": "second", "op": "c", "ts_ms": 1},
                {"id": 3, "code": "q  ", "label": "gone", "op": "c", "ts_ms": 1},
            ]
        ],
    )
    compact_once(rt, "run-1")
    want = [(1, "ab ", "first"), (2, "xyz", "second"), (3, "q  ", "gone")]
    assert _rows(spark, rt.cfg, "base_table") == want
    assert _rows(spark, rt.cfg, "view_name") == want
    assert _duckdb_rows(rt.cfg) == want

    # Updates and a delete on top of the compacted base: the view shows them before the next compaction.
    land(
        rt.cfg,
        "increment_2026112201",
        [
            [
                {"id": 1, "code": "cd ", "label": "updated", "op": "u", "ts_ms": 2},
                {"id": 3, "code": "q  ", "label": "gone", "op": "d", "ts_ms": 2},
                {"id": 4, "code": "n  ", "label": None, "op": "c", "ts_ms": 2},
            ]
        ],
    )
    refresh_view(rt)
    want = [(1, "cd ", "updated"), (2, "xyz", "second"), (4, "n  ", None)]
    assert _rows(spark, rt.cfg, "view_name") == want
    assert _duckdb_rows(rt.cfg) == want
    compact_once(rt, "run-2")
    assert _rows(spark, rt.cfg, "base_table") == want
    assert _rows(spark, rt.cfg, "view_name") == want
    assert _duckdb_rows(rt.cfg) == want
