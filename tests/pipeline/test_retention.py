"""Retention after a publish: old versions go, ``keep_versions`` stay.

On real storage, metastore and Spark (moved here from ``tests/test_tasks.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compact_once, visible_names

from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.tables import ensure_tables

from .helpers import student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def test_old_versions_are_cleaned_up(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg(keep_versions=2))
    ensure_tables(rt)
    for hour in range(4):
        land(rt.cfg, f"increment_20261122{hour:02d}", [student_rows((1, f"v{hour}", "u", hour))])
        compact_once(rt, f"run-{hour}")
    versions = sorted(p.name for p in Path(rt.lake.layout.base).iterdir() if p.name.startswith("v0000000"))
    live = rt.lake.latest_commit()
    assert live.seq == 4
    # The empty genesis directory and the last two versions remain.
    assert [v.split("-")[0] for v in versions] == ["v00000000", "v00000003", "v00000004"]
    assert visible_names(spark, rt.cfg) == {1: "v3"}
