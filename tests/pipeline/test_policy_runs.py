"""``compaction.policy: threshold`` over real runs: runs that only refresh the view, then one that compacts.

On the session's Spark and metastore.  The expected view is a reference model of the cdc
rule written here (per key the event with the greatest ``ts_ms`` wins; ``op = 'd'`` removes
the key), not the package's SQL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdc_compaction.core.lake import TableLease
from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline import order
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.tables import ensure_tables

from .helpers import student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

INCREMENTS: list[tuple[str, list[tuple[int, str | None, str, int]]]] = [
    ("increment_2026112200", [(1, "Alice", "c", 1), (2, "Bob", "c", 1), (3, "Carol", "c", 1)]),
    ("increment_2026112201", [(1, "Alicia", "u", 2), (2, None, "d", 2), (4, "Dan", "c", 2)]),
    ("increment_2026112202", [(4, "Daniel", "u", 3), (5, "Eve", "c", 3), (3, "Caroline", "u", 3)]),
    ("increment_2026112203", [(2, "Bobby", "c", 4), (5, None, "d", 4), (6, "Fay", "c", 4)]),
]


def reference(events: list[tuple[int, str | None, str, int]]) -> dict[int, str | None]:
    """The cdc rule on ``events``: the latest (ts_ms) event per id; a delete removes the id."""
    latest: dict[int, tuple[int, str | None, str]] = {}
    for i, name, op, ts in events:
        if i not in latest or ts > latest[i][0]:
            latest[i] = (ts, name, op)
    return {i: name for i, (_, name, op) in latest.items() if op != "d"}


def test_threshold_runs_refresh_the_view_until_a_threshold_is_reached(make_cfg: Any, runtime: Any, spark: Any) -> None:
    # Only the file count decides here: the third pending file reaches it.
    rt = runtime(
        make_cfg(
            compaction={"policy": "threshold", "pending_files": 3, "pending_rows_ratio": None, "pending_age": None}
        )
    )
    cfg, names, lake = rt.cfg, table_names(rt.cfg), rt.lake
    ensure_tables(rt)

    def view() -> dict[int, str | None]:
        for t in ("base_table", "incremental_table"):
            spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
        return {
            r["id"]: r["full_name"]
            for r in spark.sql(f"SELECT * FROM `{cfg.database}`.`{names['view_name']}`").collect()
        }

    def run(run_id: str, force: bool = False) -> tuple[str, list[Any]]:
        path = plan(rt, run_id, force=force)
        return path, [s.call(rt, path, run_id) for s in order.after(order.PLAN)]

    def landing() -> set[str]:
        return (
            {p.name for p in Path(lake.layout.incremental).iterdir()}
            if Path(lake.layout.incremental).exists()
            else set()
        )

    seen: list[tuple[int, str | None, str, int]] = []
    # Run 0, forced: the base (a threshold policy with one pending file would not compact yet).
    name, events = INCREMENTS[0]
    land(cfg, name, [student_rows(*events)])
    seen += events
    path, _ = run("run-0", force=True)
    decision = json.loads(Path(path).read_text())["compaction"]
    assert decision["compact"] is True and decision["forced"] is True
    base = lake.latest_commit()
    assert base.seq == 1 and view() == reference(seen)

    # Runs 1 and 2: one, then two files pending (< 3): the views show them, the base stays.
    for n, run_id in ((1, "run-1"), (2, "run-2")):
        name, events = INCREMENTS[n]
        land(cfg, name, [student_rows(*events)])
        seen += events
        path, results = run(run_id)
        doc = json.loads(Path(path).read_text())
        assert doc["compaction"]["compact"] is False
        assert f"pending_files {n}/3" in doc["compaction"]["reason"]
        # compact, validate, publish, archive skip; refresh_view ran.
        assert [("skipped" in r) for r in results] == [True, True, True, True, False], results
        assert lake.latest_commit().version == base.version
        assert landing() == {i for i, _ in INCREMENTS[1 : n + 1]}  # still pending, nothing archived
        assert view() == reference(seen)
        # The lease is free: the next run (or the view refresher) may start.
        held = TableLease(lake).current()
        assert held is None or held.released
        # Re-running any of the run's tasks, plan included, is harmless.
        assert plan(rt, run_id) == path
        assert all("skipped" in s.call(rt, path, run_id) for s in order.between(order.COMPACT, "archive"))
        order.step("refresh_view").call(rt, path, run_id)
        assert lake.latest_commit().version == base.version and view() == reference(seen)
        held = TableLease(lake).current()
        assert held is None or held.released

    # Run 3: the third pending file reaches pending_files: one commit takes every pending increment.
    name, events = INCREMENTS[3]
    land(cfg, name, [student_rows(*events)])
    seen += events
    path, results = run("run-3")
    doc = json.loads(Path(path).read_text())
    assert doc["compaction"]["compact"] is True and "pending_files 3/3" in doc["compaction"]["reason"]
    latest = lake.latest_commit()
    assert latest.seq == base.seq + 1 and latest.parent_seq == base.seq
    assert sorted(latest.increments) == [i for i, _ in INCREMENTS[1:]]
    assert landing() == set()  # archived
    assert view() == reference(seen)
    for t in ("base_table",):
        spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
    base_rows = spark.sql(f"SELECT id, full_name FROM `{cfg.database}`.`{names['base_table']}`").collect()
    assert {r["id"]: r["full_name"] for r in base_rows} == reference(seen)
    # Re-running its tasks is harmless too.
    for s in order.after(order.PLAN):
        s.call(rt, path, "run-3")
    assert lake.latest_commit().seq == latest.seq and view() == reference(seen)
