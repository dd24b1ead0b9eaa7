"""The ``plan`` step: the lease, the exact input of a run, roll-forward of a crashed run, bad input.

On real storage, metastore and Spark (moved here from ``tests/test_tasks.py``).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import compact_once, visible_names

from cdc_compaction.core.exceptions import (
    ConcurrentRunError,
    PlanError,
    SchemaChangeError,
)
from cdc_compaction.core.lake import TableLease
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.runtime import lease_owner
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import validate

from .helpers import REGION_COLUMNS, commit_record_only, region_rows, run_job, staged, student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def test_plan_is_empty_without_increments_and_reused_on_retry(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    assert plan(rt, "run-1") == ""
    land(rt.cfg, "increment_2026112200", [student_rows((1, "a", "c", 1))])
    first = plan(rt, "run-2")
    # A new file landing before the retry must not change the retried plan's input.
    land(rt.cfg, "increment_2026112201", [student_rows((2, "b", "c", 1))])
    again = plan(rt, "run-2")
    assert first == again
    doc = json.loads(Path(first).read_text())
    assert [f["increment"] for f in doc["files"]] == ["increment_2026112200"]
    # Another run may not plan while run-2 holds the table's lease...
    with pytest.raises(ConcurrentRunError, match="being compacted by another run"):
        plan(rt, "run-3")
    # ...until an operator breaks it (run-2 is dead); then it plans everything pending.
    TableLease(rt.lake).break_("test")
    other = json.loads(Path(plan(rt, "run-3")).read_text())
    assert [f["increment"] for f in other["files"]] == ["increment_2026112200", "increment_2026112201"]


def test_next_plan_rolls_forward_a_crashed_publish_and_archive(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [student_rows((1, "Alice", "c", 1))])
    assert commit_record_only(rt, staged(rt, "run-1"))
    # The run died after the commit record and was never retried: its lease blocks other runs...
    with pytest.raises(ConcurrentRunError):
        plan(rt, "run-2")
    # ...until it expires; then the next run's plan repairs everything.
    later = datetime.now(UTC) + rt.cfg.lease_timeout + timedelta(minutes=1)
    assert plan(rt, "run-2", now=later) == ""
    assert visible_names(spark, rt.cfg) == {1: "Alice"}
    assert rt.lake.is_archived(1)
    assert not (Path(rt.lake.layout.incremental) / "increment_2026112200").exists()


def test_a_second_run_is_refused_by_the_lease_and_changes_nothing(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [student_rows((1, "Alice", "c", 1))])
    a = plan(rt, "scheduled")
    plans_before = sorted(os.listdir(rt.lake.layout.plans))
    with pytest.raises(ConcurrentRunError, match="/scheduled"):
        plan(rt, "manual")
    assert sorted(os.listdir(rt.lake.layout.plans)) == plans_before, "the refused run wrote nothing"
    run_job(rt, a)
    validate(rt, a)
    publish(rt, a)
    archive(rt, a)  # releases the lease
    assert plan(rt, "manual") == ""
    assert visible_names(spark, rt.cfg) == {1: "Alice"}


def test_tombstones_expire_after_retention(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg(tombstone_retention="1d"))
    ensure_tables(rt)
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    land(rt.cfg, "increment_2026110100", [student_rows((1, "a", "c", 1), (2, "b", "c", 1))])
    compact_once(rt, "r1", now=t0)
    land(rt.cfg, "increment_2026110101", [student_rows((2, None, "d", 2))])
    compact_once(rt, "r2", now=t0 + timedelta(hours=1))
    assert rt.lake.latest_commit().stats["output_tombstones"] == 1
    land(rt.cfg, "increment_2026110300", [student_rows((3, "c", "c", 3))])
    compact_once(rt, "r3", now=t0 + timedelta(days=3))
    stats = rt.lake.latest_commit().stats
    assert stats["expired_tombstones"] == 1 and stats["output_tombstones"] == 0
    assert visible_names(spark, rt.cfg) == {1: "a", 3: "c"}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(b"", "empty file", id="zero-byte"),
        pytest.param(b"this is not parquet at all", "ArrowInvalid", id="garbage"),
        pytest.param(None, "ArrowInvalid", id="truncated"),
    ],
)
def test_unreadable_landed_files_are_refused_by_name(make_cfg, runtime, content: bytes | None, reason: str) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    (good,) = land(rt.cfg, "increment_2026112200", [student_rows((1, "a", "c", 1))])
    bad = Path(rt.lake.layout.incremental) / "increment_2026112200" / "part-00001.parquet"
    bad.write_bytes(content if content is not None else Path(good).read_bytes()[:-20])
    (Path(good).parent / "_SUCCESS").write_text("")  # markers are not data and never refused
    (Path(good).parent / ".part-00000.parquet.crc").write_text("x")
    with pytest.raises(PlanError) as err:
        plan(rt, "run-1")
    assert str(bad) in str(err.value) and reason in str(err.value)
    assert rt.cfg.qualified_name in str(err.value) and "Nothing was compacted" in str(err.value)
    assert rt.lake.latest_commit().seq == 0 and Path(good).exists() and bad.exists()
    bad.unlink()
    assert plan(rt, "run-2"), "with the bad file moved away, the rest compacts"


def test_partitioning_cannot_change_under_a_table(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg(columns=REGION_COLUMNS, partition_by={"column": "region"}))
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [region_rows((1, "EU", "Ann", "c", 1))])
    compact_once(rt, "run-1")
    land(rt.cfg, "increment_2026112201", [region_rows((2, "US", "Bob", "c", 2))])
    other = rt.cfg.model_copy(update={"partition_by": rt.cfg.partition_by.model_copy(update={"column": "full_name"})})
    with pytest.raises(PlanError, match=r"'partition_by' is .*full_name.* in the registry, but the live .*'region'"):
        plan(runtime(other), "run-2")
    assert not TableLease(rt.lake).holds(lease_owner("run-2"), datetime.now(UTC)), (
        "the refused plan gave the lease back"
    )
    with pytest.raises(SchemaChangeError, match="field 'partition_by' asks for no partitions"):
        ensure_tables(runtime(rt.cfg.model_copy(update={"partition_by": None})))
    assert compact_once(rt, "run-2"), "the registry as it was still compacts"
    assert visible_names(spark, rt.cfg) == {1: "Ann", 2: "Bob"}
