"""A small lake for the ``status`` command and the UI page, built without Spark.

Commit records, the pointer, archive markers, the lease and the quarantine are written
through :mod:`cdc_compaction.core.lake` and :mod:`cdc_compaction.pipeline.quarantine` -- the very APIs a
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

from cdc_compaction.core.lake import Commit, Lake, TableLease
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.quarantine import Quarantine

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


#: A table whose runs fail (its metastore does not answer) and a registry file that does not validate.
FAILING: dict[str, Any] = {
    "table": "shop.badfit",
    "dag_id": "cdc__shop__badfit",
    "first_task": "ensure_tables",
    "broken_file": "shop.broken.yaml",
    "broken_dag_id": "cdc__shop__broken",
    "broken_task": "registry_error",
}


def add_failing_entries(root: Path, registry: Path) -> None:
    """Register :data:`FAILING`'s table (no retries) and write its invalid registry file."""
    doc = student_doc(root, "badfit", retries=0)
    doc["database"] = "shop"
    registry.mkdir(parents=True, exist_ok=True)
    (registry / "shop.badfit.yaml").write_text(yaml.safe_dump(doc))
    # No columns and no key: the registry refuses it, and its DAG fails with the error.
    (registry / FAILING["broken_file"]).write_text("database: shop\ntable: broken\n")


def run_failing_dags(env: dict[str, str]) -> None:
    """Run both DAGs of :data:`FAILING` once with ``airflow dags test`` (real runs, recorded as failed).

    ``env`` is an :func:`cdc_compaction.devtools.devenv.airflow_env` whose metastore does not answer, so
    the table's first task fails at once.
    """
    import subprocess
    import sys

    airflow = str(Path(sys.executable).parent / "airflow")
    for dag_id in (FAILING["dag_id"], FAILING["broken_dag_id"]):
        proc = subprocess.run([airflow, "dags", "test", dag_id], env=env, capture_output=True, text=True, check=False)
        assert proc.returncode != 0 and "failed" in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]


def airflow_with_failed_runs(tmp: Path) -> tuple[Path, dict[str, str]]:
    """A registry (the sample, :data:`FAILING`'s table and file) and a real Airflow DB after one run of each.

    The DAGs are serialized, the failing table's DAG is unpaused, and both failing DAGs ran once
    (``airflow dags test``): Airflow itself records the runs, their states and try numbers.
    Returns the registry directory and the Airflow environment (SQLite under ``tmp/airflow``).
    """
    import subprocess
    import sys

    from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db
    from cdc_compaction.devtools.local_services import free_port

    registry = tmp / "registry"
    build_sample_lake(tmp / "lake", registry)
    add_failing_entries(tmp / "lake", registry)
    # A metastore port nothing listens on: the failing table's first task fails at once.
    env = airflow_env(tmp / "airflow", f"thrift://127.0.0.1:{free_port()}", registry_dir=registry)
    ensure_airflow_db(env)
    airflow = str(Path(sys.executable).parent / "airflow")
    for cmd in (["dags", "reserialize"], ["dags", "unpause", FAILING["dag_id"]]):
        proc = subprocess.run([airflow, *cmd], env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_failing_dags(env)
    return registry, env
