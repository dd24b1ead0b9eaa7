"""The ``refresh_view`` step: partitions, views recreated only when changed, held-back increments.

On real storage, metastore and Spark (moved here from ``tests/test_tasks.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import compact_once

from cdc_compaction.core.exceptions import (
    PlanError,
)
from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

from .helpers import student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def test_refresh_view_only_recreates_changed_views(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)  # creates the views too
    submissions: list[list[str]] = []
    engine = rt.engine

    class Counting:
        def run_sql(self, cfg: Any, statements: list[str]) -> None:
            submissions.append(statements)
            engine.run_sql(cfg, statements)

    rt.engine = Counting()
    assert refresh_view(rt)["views_recreated"] == []
    assert submissions == [], "nothing changed: no Spark submission"
    names = table_names(rt.cfg)
    assert refresh_view(rt, force=True)["views_recreated"] == sorted([names["view_name"], names["rejects_view"]])
    assert len(submissions) == 1
    land(rt.cfg, "increment_2026112200", [student_rows((1, "a", "c", 1))])
    result = refresh_view(rt)
    assert (result["partitions_added"], result["partitions_dropped"], result["views_recreated"]) == (
        ["increment_2026112200"],
        [],
        [],
    )
    assert len(submissions) == 1, "registering an increment needs no Spark"


def test_one_unreadable_pending_file_does_not_break_the_views(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    cfg, names = rt.cfg, table_names(rt.cfg)
    ensure_tables(rt)
    land(cfg, "increment_2026112200", [student_rows((1, "Alice", "c", 1))])
    compact_once(rt, "run-1")
    land(cfg, "increment_2026112201", [student_rows((2, "Bob", "c", 1), (None, "no key", "c", 1))])  # type: ignore[arg-type]
    (good,) = land(cfg, "increment_2026112202", [student_rows((3, "Carol", "c", 1))])
    assert refresh_view(rt)["partitions_added"] == ["increment_2026112201", "increment_2026112202"]
    truncated = Path(good).with_name("part-00001.parquet")
    truncated.write_bytes(Path(good).read_bytes()[:-20])

    def query() -> tuple[dict[int, str], list[str]]:
        for t in ("base_table", "incremental_table"):
            spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
        view = spark.sql(f"SELECT * FROM `{cfg.database}`.`{names['view_name']}`").collect()
        rejects = spark.sql(f"SELECT * FROM `{cfg.database}`.`{names['rejects_view']}`").collect()
        return {r["id"]: r["full_name"] for r in view}, [r["_cdc_reject_reason"] for r in rejects]

    # The plan refuses the file (on_bad_file: fail) -- and first takes its increment out of the view.
    with pytest.raises(PlanError, match=r"part-00001\.parquet"):
        plan(rt, "run-2")
    assert query() == ({1: "Alice", 2: "Bob"}, ["null_key:id"])
    result = refresh_view(rt)
    assert [(h["increment"], Path(h["path"]).name) for h in result["held_back"]] == [
        ("increment_2026112202", "part-00001.parquet")
    ]
    assert "not readable as Parquet" in result["held_back"][0]["reason"]
    sidecar = json.loads(Path(rt.lake.layout.control, "view_held_back.json").read_text())
    assert sidecar["held_back"] == result["held_back"]
    assert query() == ({1: "Alice", 2: "Bob"}, ["null_key:id"])
    truncated.unlink()  # fixed: the increment comes back
    assert refresh_view(rt)["partitions_added"] == ["increment_2026112202"]
    assert query()[0] == {1: "Alice", 2: "Bob", 3: "Carol"}
