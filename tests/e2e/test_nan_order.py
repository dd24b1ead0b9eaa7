"""NaN in a floating-point ``order_by`` column: refused like NULL, never a permanent winner.

Spark sorts NaN above every number, so one NaN event used to win over every later event
of its key, forever.  The contract orders events by their ordering values; NaN has no
place in that order, so the event is refused with its own reason (``nan_order_by:<col>``),
counted and kept in quarantine, and the view and ``<t>_pending_rejects`` say the same.

The expectations below are written out by hand from the contract, not computed by the
project's rule.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from conftest import compact_once

from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.quarantine import Quarantine
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

COLUMNS = [
    {"name": "id", "type": "int"},
    {"name": "full_name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "version", "type": "double"},
]


def _rows(*items: tuple[int, str | None, str, float | None]) -> list[dict[str, Any]]:
    return [{"id": i, "full_name": n, "op": op, "version": v} for i, n, op, v in items]


def _select(spark: Any, cfg: Any, kind: str, where: str = "") -> list[Any]:
    names = table_names(cfg)
    for table in ("base_table", "incremental_table"):
        # The view reads these: drop this session's cached file listings of them.
        spark.catalog.refreshTable(f"`{cfg.database}`.`{names[table]}`")
    name = f"`{cfg.database}`.`{names[kind]}`"
    return spark.sql(f"SELECT * FROM {name} {where}").collect()


@pytest.mark.parametrize("order_type", ["double", "float"])
def test_a_nan_ordering_value_is_refused_and_never_wins(make_cfg, runtime, spark, order_type) -> None:
    columns = [dict(c, type=order_type) if c["name"] == "version" else c for c in COLUMNS]
    rt = runtime(make_cfg(columns=columns, order_by=["version"]))
    cfg = rt.cfg
    ensure_tables(rt)
    land(cfg, "increment_2026112200", [_rows((1, "Ann", "c", 1.0), (2, "Ben", "c", 1.0))])
    compact_once(rt, "run-1")
    # A NaN update of key 1, then a real later update of it; key 2 gets only a NaN delete.
    land(cfg, "increment_2026112201", [_rows((1, "NaN-Ann", "u", math.nan), (2, None, "d", math.nan))])
    land(cfg, "increment_2026112202", [_rows((1, "Anna", "u", 2.0))])

    # Pending: the view shows what a compaction would produce now, the rejects view why.
    refresh_view(rt)
    view = {r["id"]: r["full_name"] for r in _select(spark, cfg, "view_name")}
    assert view == {1: "Anna", 2: "Ben"}
    rejects = sorted((r["id"], r["_cdc_reject_reason"]) for r in _select(spark, cfg, "rejects_view"))
    assert rejects == [(1, "nan_order_by:version"), (2, "nan_order_by:version")]

    compact_once(rt, "run-2")
    base = {r["id"]: r["full_name"] for r in _select(spark, cfg, "base_table", "WHERE op <> 'd'")}
    assert base == {1: "Anna", 2: "Ben"}
    commit = rt.lake.latest_commit()
    assert commit.stats["rejected_rows"] == 2
    assert commit.stats["rejected_by_reason"] == {"nan_order_by:version": 2}
    # Kept, not dropped: the quarantine lists both rows with their reason.
    entries = [e for e in Quarantine(rt.lake).entries() if e.kind == "rows"]
    assert [(e.count, e.reasons) for e in entries] == [(2, {"nan_order_by:version": 2})]

    # A later real event of key 1 still wins: nothing is frozen.
    land(cfg, "increment_2026112203", [_rows((1, "Anna B", "u", 3.0))])
    compact_once(rt, "run-3")
    base = {r["id"]: r["full_name"] for r in _select(spark, cfg, "base_table", "WHERE op <> 'd'")}
    assert base == {1: "Anna B", 2: "Ben"}
