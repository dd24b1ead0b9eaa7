"""A small lake for the ``status`` command and the UI page, built without Spark.

Commit records, the pointer, archive markers, the lease and the quarantine are written
through :mod:`cdc_compaction.lake` and :mod:`cdc_compaction.quarantine` -- the very APIs a
run uses -- and change files are landed as the CDC sink would (:func:`conformance.land`).
The facts it sets are listed in :data:`SAMPLE`, so tests state their expectations from
them, not from the status code.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from conftest import student_doc

from cdc_compaction.conformance import land
from cdc_compaction.lake import Commit, Lake, TableLease
from cdc_compaction.quarantine import Quarantine
from cdc_compaction.registry import TableConfig, parse_table

#: "Now" of the sample: four hours after the first increment's hour began.
NOW = datetime(2026, 11, 22, 4, 0, tzinfo=UTC)

SAMPLE: dict[str, Any] = {
    "table": "tests.student",
    "dag_id": "cdc__tests__student",
    "commits": [
        # seq, increment, committed_at, newest event time, visible rows, change rows, archived
        (1, "increment_2026112200", "2026-11-22T01:10:00+00:00", "2026-11-22T00:50:00+00:00", 2, 2, True),
        (2, "increment_2026112201", "2026-11-22T02:20:00+00:00", "2026-11-22T01:55:00+00:00", 3, 4, False),
    ],
    # Commit 2 is not archived yet, so its increment is still landed; these two are not compacted.
    "pending": ["increment_2026112202", "increment_2026112203"],
    "quarantined_plan": "p-0003-bad",
    "lease_owner": "airflow-test/manual__3",
    "empty_table": "tests.fresh",
    # tests.student's freshness objective: 2h05m old at NOW, within 1 h for 75 of the 170 minutes since commit 1.
    "slo": {"freshness": "1h", "target": 0.99, "window": "1d"},
}


def _rows(*ids: int) -> list[dict[str, Any]]:
    return [{"id": i, "full_name": f"n{i}", "op": "c", "ts_ms": 1000 + i} for i in ids]


def version_of(seq: int) -> str:
    return f"v{seq:08d}-plan{seq}-a"


def _shifted(value: str, shift: timedelta) -> str:
    """An ISO time or increment name of :data:`SAMPLE`, moved by ``shift`` (whole hours for increments)."""
    if value.startswith("increment_"):
        hour = datetime.strptime(value[len("increment_") :], "%Y%m%d%H") + shift
        return f"increment_{hour:%Y%m%d%H}"
    return (datetime.fromisoformat(value) + shift).isoformat()


def build_sample_lake(root: Path, registry: Path | None = None, now: datetime = NOW) -> list[TableConfig]:
    """Write the lake of :data:`SAMPLE` under ``root`` (and its registry files into ``registry``).

    ``now`` (a whole hour) moves every time and increment of the sample by ``now - NOW``: a lake
    whose freshness is as in :data:`SAMPLE` when read at ``now``.
    """
    shift = now - NOW
    assert shift % timedelta(hours=1) == timedelta(0), "shift the sample by whole hours"

    def move(value: str) -> str:
        return _shifted(value, shift)

    docs = [student_doc(root, "student", slo=SAMPLE["slo"]), student_doc(root, "fresh")]
    configs = [parse_table(d) for d in docs]
    if registry is not None:
        registry.mkdir(parents=True, exist_ok=True)
        for d in docs:
            (registry / f"{d['database']}.{d['table']}.yaml").write_text(yaml.safe_dump(d))
    cfg = configs[0]
    lake = Lake(cfg)
    parent = 0
    for seq, increment0, committed0, event0, rows, change_rows, archived in SAMPLE["commits"]:
        increment, committed_at, event_time = move(increment0), move(committed0), move(event0)
        if not archived:
            land(cfg, increment, [_rows(seq, seq + 10)])  # still in the landing area until archive moves it
        commit = Commit(
            seq=seq,
            version=version_of(seq),
            plan_id=f"plan{seq}",
            run_id=f"run{seq}",
            parent_seq=parent,
            files=[],
            increments=[increment],
            stats={"output_visible_rows": rows, "increment_rows": change_rows},
            committed_at=committed_at,
            freshness={"increment": increment, "event_time": event_time},
        )
        assert lake.try_commit(commit)
        lake.advance_pointer(commit)
        if archived:
            lake.storage.write_text(lake.layout.archived_marker(seq), "")
        parent = seq
    pending = [move(i) for i in SAMPLE["pending"]]
    for increment in pending:
        land(cfg, increment, [_rows(7, 8)])
    # One refused file, set aside as a plan does with on_bad_file: quarantine.
    bad = land(cfg, pending[-1], [_rows(9), _rows(10)])[-1]
    Quarantine(lake).set_aside_file(
        SAMPLE["quarantined_plan"],
        pending[-1],
        Path(bad).name,
        bad,
        Path(bad).stat().st_size,
        "footer: column ts_ms has type string",
    )
    TableLease(lake).acquire(SAMPLE["lease_owner"], timedelta(hours=2), now - timedelta(minutes=5))
    return configs
