"""``rebuild``: the archived increments replayed through the real job equal the live table (issue 14, section 4).

Three Spark tests on the session's Spark and metastore: a history of several real compactions
(updates, a delete, a late stale update) rebuilt whole and ``--since`` an increment, with a
crash after the first replayed commit in between, then published as a new commit that the
next compaction builds on; an archived file tampered with, which
the verification must name by key; and a rollback in the history, which the replay must
honour.  The expected rows come from the events written here.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import compact_once, visible_names

from cdc_compaction.core.exceptions import RebuildError
from cdc_compaction.core.lake import TableLease
from cdc_compaction.devtools.conformance import land
from cdc_compaction.job import faults
from cdc_compaction.job.faults import InjectedFaultError
from cdc_compaction.pipeline.rebuild import archived_path, rebuild, rebuild_root
from cdc_compaction.pipeline.tables import ensure_tables

from .helpers import student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

#: Four compactions: inserts, an update and a delete, a late (older) update of the deleted key, a re-insert.
HISTORY = [
    ("increment_2026112200", student_rows((1, "Ann", "c", 10), (2, "Bob", "c", 10), (3, "Cy", "c", 10))),
    ("increment_2026112201", student_rows((1, "Ann B", "u", 20), (2, None, "d", 20))),
    ("increment_2026112202", student_rows((2, "Bob late", "u", 15), (4, "Di", "c", 30))),
    ("increment_2026112203", student_rows((3, "Cy C", "u", 40), (5, "Ed", "c", 40))),
]
#: What the events above leave visible: key 2's delete (ts 20) beats the late update (ts 15).
EXPECTED = {1: "Ann B", 3: "Cy C", 4: "Di", 5: "Ed"}


def _history(rt) -> None:
    ensure_tables(rt)
    for n, (increment, rows) in enumerate(HISTORY):
        land(rt.cfg, increment, [rows])
        assert compact_once(rt, f"run-{n}")


def test_rebuild_equals_live_and_survives_a_crash(make_cfg, runtime, spark, monkeypatch) -> None:
    rt = runtime(make_cfg(keep_versions=2))
    _history(rt)
    assert visible_names(spark, rt.cfg) == EXPECTED
    live = rt.lake.latest_commit()

    # A crash after the first replayed commit: live untouched, the lease given back.
    monkeypatch.setenv(faults.ENV, "rebuild.after_first_step=raise")
    with pytest.raises(InjectedFaultError):
        rebuild(rt)
    monkeypatch.delenv(faults.ENV)
    assert rt.lake.latest_commit().seq == live.seq and rt.lake.latest_commit().version == live.version
    assert visible_names(spark, rt.cfg) == EXPECTED
    assert TableLease(rt.lake).current().released

    report = rebuild(rt)
    assert report.equal, report.lines()
    assert report.replayed == [1, 2, 3, 4] and report.start_seq == 0
    # Visible rows plus key 2's tombstone (within retention).
    assert (report.live_rows, report.rebuilt_rows) == (len(EXPECTED) + 1, len(EXPECTED) + 1)
    # The crashed rebuild's directory was swept; only this one's is left.
    assert [p.name for p in _dirs(rebuild_root(rt.lake))] == [report.rebuild_id]
    assert rt.lake.latest_commit().version == live.version

    # --since: starts at the newest kept version before the increment (keep_versions=2: commit 3).
    since = rebuild(rt, since="increment_2026112203")
    assert since.equal and since.start_seq == 3 and since.replayed == [4]

    # --publish: the rebuild becomes commit 5 on top of 4; readers, pointer and the next run follow.
    published = rebuild(rt, publish=True)
    assert published.equal and published.published_seq == live.seq + 1
    now = rt.lake.latest_commit()
    assert (now.seq, now.parent_seq, now.files) == (live.seq + 1, live.seq, [])
    assert now.version.startswith(f"v{live.seq + 1:08d}-rb{published.rebuild_id}")
    assert rt.lake.read_pointer()["version"] == now.version
    assert visible_names(spark, rt.cfg) == EXPECTED
    # Only the replay's last version stays in base/ (cleanup took the intermediate ones).
    assert [p.name for p in _dirs(rt.lake.layout.base) if p.name.startswith(f"v{now.seq:08d}")] == [now.version]
    land(rt.cfg, "increment_2026112204", [student_rows((6, "Flo", "c", 50))])
    assert compact_once(rt, "run-after-rebuild")
    assert visible_names(spark, rt.cfg) == {**EXPECTED, 6: "Flo"}


def test_tampered_archive_is_named_by_key(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    _history(rt)
    third = rt.lake.read_commit(3)
    f = third.files[0]
    path = archived_path(rt.lake, third, f)
    table = pq.read_table(path)
    rows = table.to_pylist()
    # Key 4's insert now says "Dee": the one row that differs.
    rows = [{**r, "full_name": "Dee"} if r["id"] == 4 else r for r in rows]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)

    report = rebuild(rt)
    assert not report.equal
    assert report.only_live == [{"id": 4, "_tombstone": False}]
    assert report.only_rebuilt == [{"id": 4, "_tombstone": False}]
    assert (report.only_live_count, report.only_rebuilt_count) == (1, 1)
    text = "\n".join(report.lines())
    assert "DIFFERENT" in text and "'id': 4" in text
    assert visible_names(spark, rt.cfg) == EXPECTED
    # A different rebuild is not published without --force; live stays as it was.
    live = rt.lake.latest_commit()
    with pytest.raises(RebuildError, match=r"differs from the live commit 4 \(1 rows only live, 1 only rebuilt\)"):
        rebuild(rt, publish=True)
    assert rt.lake.latest_commit().version == live.version
    assert TableLease(rt.lake).current().released


def _fold(batches: list[list[dict]]) -> tuple[dict[int, str], set[int]]:
    """(visible id -> full_name, tombstoned ids) after the batches: per key the event with the
    greatest ts_ms wins, a delete hides the key (the registry rule, written out here)."""
    last: dict[int, dict] = {}
    for rows in batches:
        for r in rows:
            if r["id"] not in last or r["ts_ms"] > last[r["id"]]["ts_ms"]:
                last[r["id"]] = r
    visible = {k: r["full_name"] for k, r in last.items() if r["op"] != "d"}
    return visible, {k for k, r in last.items() if r["op"] == "d"}


def test_rebuild_honours_a_rollback(make_cfg, runtime, spark) -> None:
    """Compact x3, roll back to 1, compact once more: the replay continues from its own state as of 1."""
    from cdc_compaction.operations.travel import rollback

    rt = runtime(make_cfg(keep_versions=5))
    ensure_tables(rt)
    for n, (increment, rows) in enumerate(HISTORY[:3]):
        land(rt.cfg, increment, [rows])
        assert compact_once(rt, f"run-{n}")
    assert rollback(rt.cfg, 1, rt.metastore, by="test").seq == 4
    land(rt.cfg, HISTORY[3][0], [HISTORY[3][1]])
    assert compact_once(rt, "run-after-rollback")
    # The live table is the first increment, then the fourth: commits 2 and 3 were rolled back.
    visible, tombstones = _fold([HISTORY[0][1], HISTORY[3][1]])
    assert visible == {1: "Ann", 2: "Bob", 3: "Cy C", 5: "Ed"} and not tombstones
    assert visible_names(spark, rt.cfg) == visible
    # A replay of the increments alone would end elsewhere (key 2 deleted, key 4 present).
    assert _fold([rows for _, rows in HISTORY])[0] != visible

    report = rebuild(rt)
    assert report.equal, report.lines()
    assert (report.replayed, report.rolled_back, report.skipped) == ([1, 2, 3, 5], {4: 1}, [])
    assert (report.live_rows, report.rebuilt_rows) == (len(visible) + len(tombstones),) * 2
    assert "commit 4 rolls back to 1: continued from the replay as of commit 1" in report.lines()
    assert rt.lake.latest_commit().seq == 5


def _dirs(path: str) -> list:
    from pathlib import Path

    return sorted(p for p in Path(path).iterdir() if p.is_dir())
