"""What the landing area holds for a run: complete, waiting and stalled increments, entries never taken.

On real storage, metastore and Spark (moved here from ``tests/test_tasks.py``).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cdc_compaction.core.landing import increment_hour
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.tables import ensure_tables

from .helpers import student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def test_incomplete_increments_wait(make_cfg, runtime) -> None:
    now = datetime(2026, 11, 22, 10, 30, tzinfo=UTC)
    rt = runtime(make_cfg(increments={"settle_seconds": 600, "wait_for_hour_end": True}))
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112210", [student_rows((1, "current hour", "c", 1))])
    land(rt.cfg, "increment_2026112208", [student_rows((2, "settled", "c", 1))])
    land(rt.cfg, "increment_2026112209", [student_rows((3, "just written", "c", 1))])
    inc = Path(rt.lake.layout.incremental)
    old = now.timestamp() - 3600
    for f in (inc / "increment_2026112208").iterdir():
        os.utime(f, (old, old))
    for f in (inc / "increment_2026112209").iterdir():
        os.utime(f, (now.timestamp() - 5, now.timestamp() - 5))
    doc = json.loads(Path(plan(rt, "r", now=now)).read_text())
    assert doc["increments"] == ["increment_2026112208"]

    marker = runtime(make_cfg(increments={"completion": "marker", "settle_seconds": 0, "wait_for_hour_end": False}))
    ensure_tables(marker)
    land(marker.cfg, "increment_2026112200", [student_rows((1, "a", "c", 1))])
    land(marker.cfg, "increment_2026112201", [student_rows((2, "b", "c", 1))])
    (Path(marker.lake.layout.incremental) / "increment_2026112201" / "_SUCCESS").write_text("")
    doc = json.loads(Path(plan(marker, "r")).read_text())
    assert doc["increments"] == ["increment_2026112201"]
    assert {f["name"] for f in doc["files"]} == {"part-00000.parquet"}, "markers are not data"


def test_increments_with_a_writers_temporaries_wait(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    inc = Path(rt.lake.layout.incremental)
    land(rt.cfg, "increment_2026112200", [student_rows((1, "hidden temp", "c", 1))])
    (inc / "increment_2026112200" / ".part-00001.parquet.inprogress").write_bytes(b"x")
    land(rt.cfg, "increment_2026112201", [student_rows((2, "temporary dir", "c", 1))])
    (inc / "increment_2026112201" / "_temporary" / "0").mkdir(parents=True)
    land(rt.cfg, "increment_2026112202", [student_rows((3, "tmp file", "c", 1))])
    (inc / "increment_2026112202" / "part-00001.parquet.tmp").write_bytes(b"x")
    land(rt.cfg, "increment_2026112203", [student_rows((4, "complete", "c", 1))])
    (inc / "increment_2026112203" / "part-00000.parquet.crc").write_bytes(b"crc")  # checksums are no temporaries
    doc = json.loads(Path(plan(rt, "run-1")).read_text())
    assert doc["increments"] == ["increment_2026112203"]
    waiting = {w["increment"]: w["reason"] for w in doc["waiting_increments"]}
    assert sorted(waiting) == ["increment_2026112200", "increment_2026112201", "increment_2026112202"]
    assert ".part-00001.parquet.inprogress" in waiting["increment_2026112200"]
    assert "_temporary" in waiting["increment_2026112201"]


def test_an_increment_waiting_longer_than_alert_after_is_reported_and_alerted_once(make_cfg, runtime, caplog) -> None:
    """Abandoned temporaries or a marker that never came: past alert_after, WARNING + one alert + the reports."""
    from conftest import finish_run

    increments = {"settle_seconds": 0, "wait_for_hour_end": False, "completion": "marker", "alert_after": "6h"}
    rt = runtime(make_cfg(increments=increments))
    assert rt.cfg.increments.alert_after == timedelta(hours=6)
    ensure_tables(rt)
    inc = Path(rt.lake.layout.incremental)

    def complete(name: str, *rows: tuple[int, str | None, str, int]) -> None:
        land(rt.cfg, name, [student_rows(*rows)])
        (inc / name / "_SUCCESS").write_bytes(b"")

    complete("increment_2026112200", (1, "done", "c", 1))
    land(rt.cfg, "increment_2026112201", [student_rows((2, "no marker", "c", 1))])
    complete("increment_2026112202", (3, "dead writer", "c", 1))
    (inc / "increment_2026112202" / ".part-00001.parquet.inprogress").write_bytes(b"x")
    (inc / "increment_2026112202" / "_temporary" / "0").mkdir(parents=True)
    now = datetime.now(UTC)
    alerts: list[list[dict[str, Any]]] = []

    # Just landed: waiting, not stalled.
    path = plan(rt, "run-1", now=now, on_stalled=alerts.append)
    assert json.loads(Path(path).read_text())["stalled_increments"] == [] and alerts == []
    finish_run(rt, path, now=now)

    # Seven hours on, nothing changed: both are reported (plan file, landing.json, WARNING) and alerted once.
    complete("increment_2026112203", (4, "new", "c", 1))
    caplog.set_level("WARNING", logger="cdc_compaction.pipeline.pending")
    later = now + timedelta(hours=7)
    path = plan(rt, "run-2", now=later, on_stalled=alerts.append)
    doc = json.loads(Path(path).read_text())
    assert doc["increments"] == ["increment_2026112203"]
    stalled = {s["increment"]: s["reason"] for s in doc["stalled_increments"]}
    assert sorted(stalled) == ["increment_2026112201", "increment_2026112202"]
    assert "no _SUCCESS marker" in stalled["increment_2026112201"] and "alert_after" in stalled["increment_2026112201"]
    assert ".part-00001.parquet.inprogress" in stalled["increment_2026112202"]
    assert "_temporary" in stalled["increment_2026112202"] and "remove them" in stalled["increment_2026112202"]
    for name in stalled:
        assert any(
            r.levelname == "WARNING" and str(inc / name) in r.getMessage() and "alert_after" in r.getMessage()
            for r in caplog.records
        ), name
    assert [sorted(a["increment"] for a in batch) for batch in alerts] == [sorted(stalled)]
    report = json.loads(Path(rt.lake.layout.control, "landing.json").read_text())
    assert sorted(s["increment"] for s in report["stalled_increments"]) == sorted(stalled)
    finish_run(rt, path, now=later)

    # Still stalled an hour later: reported again, not alerted again.
    assert plan(rt, "run-3", now=later + timedelta(hours=1), on_stalled=alerts.append) == ""
    report = json.loads(Path(rt.lake.layout.control, "landing.json").read_text())
    assert len(report["stalled_increments"]) == 2 and len(alerts) == 1

    # The marker comes: that increment is compacted; the other stays stalled and is not alerted again.
    (inc / "increment_2026112201" / "_SUCCESS").write_bytes(b"")
    path = plan(rt, "run-4", now=later + timedelta(hours=2), on_stalled=alerts.append)
    doc = json.loads(Path(path).read_text())
    assert doc["increments"] == ["increment_2026112201"]
    assert [s["increment"] for s in doc["stalled_increments"]] == ["increment_2026112202"] and len(alerts) == 1


def test_landing_entries_a_run_does_not_take_are_reported(make_cfg, runtime, caplog) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    inc = Path(rt.lake.layout.incremental)
    (good,) = land(rt.cfg, "increment_2026112200", [student_rows((1, "a", "c", 1))])
    (inc / "increment_2026112200" / "late").mkdir()
    (inc / "increment_2026112200" / "late" / "part-00000.parquet").write_bytes(Path(good).read_bytes())
    (inc / "stray.parquet").write_bytes(Path(good).read_bytes())
    land(rt.cfg, "increment_202611229", [student_rows((2, "not zero-padded", "c", 1))])
    land(rt.cfg, "hourly_2026112201", [student_rows((3, "other layout", "c", 1))])
    assert increment_hour(rt.cfg, "increment_202611229") is None
    assert increment_hour(rt.cfg, "increment_2026112209") == datetime(2026, 11, 22, 9, tzinfo=UTC)
    alerts: list[list[dict[str, Any]]] = []

    def undeliverable(entries: list[dict[str, Any]]) -> None:
        alerts.append(entries)
        raise ConnectionRefusedError("smtp is down")

    caplog.set_level("WARNING", logger="cdc_compaction.pipeline.pending")
    path = plan(rt, "run-1", on_ignored=undeliverable)
    doc = json.loads(Path(path).read_text())
    assert doc["increments"] == ["increment_2026112200"]
    assert [f["name"] for f in doc["files"]] == ["part-00000.parquet"]
    ignored = {Path(i["path"]).relative_to(inc).as_posix(): i["reason"] for i in doc["ignored_landing"]}
    assert sorted(ignored) == ["hourly_2026112201", "increment_2026112200/late", "increment_202611229", "stray.parquet"]
    assert "subdirectory" in ignored["increment_2026112200/late"]
    assert "zero-padded" in ignored["increment_202611229"]
    assert "not in an increment directory" in ignored["stray.parquet"]
    for p in ignored:
        assert any(str(inc / p) in r.getMessage() and r.levelname == "WARNING" for r in caplog.records), p
    assert "could not send the alert" in caplog.text, "an undeliverable alert is logged, the plan goes on"
    assert len(alerts) == 1 and len(alerts[0]) == 4
    report = json.loads(Path(rt.lake.layout.control, "landing.json").read_text())
    assert len(report["ignored_landing"]) == 4
    # The retry of the alert: the next plan tries again (it was never delivered), then stops repeating it.
    from conftest import finish_run

    finish_run(rt, path)
    delivered: list[list[dict[str, Any]]] = []
    assert plan(rt, "run-2", on_ignored=delivered.append) == ""
    assert plan(rt, "run-3", on_ignored=delivered.append) == ""
    assert [len(d) for d in delivered] == [4]
