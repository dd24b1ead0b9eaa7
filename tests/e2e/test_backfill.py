"""The real scheduler: a backfill is serialized, and a SIGKILLed task is retried safely.

Starts Airflow's api-server, scheduler and dag-processor (LocalExecutor) on 127.0.0.1
once for the module, with a PostgreSQL metadata database of its own: the scheduler, its
task processes and this test's ``airflow backfill``/``dags`` CLI calls write to it at
the same time, which SQLite refuses ("database is locked").  Then it

* creates a three-hour backfill that allows three active runs at once, and checks
  that exactly one run compacted while the others found nothing pending;
* triggers a run of a table whose ``publish`` task process is SIGKILLed right after
  the commit record (a one-shot fault armed in the scheduler's environment), and
  checks that Airflow's retry finishes the run with the table right.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import STUDENT_COLUMNS

from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import parse_table
from cdc_compaction.devtools.conformance import land
from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db, metadata_rows
from cdc_compaction.devtools.local_services import LocalMetastore, free_port, port_open
from cdc_compaction.job import faults

pytestmark = [pytest.mark.dag, pytest.mark.metastore, pytest.mark.spark]

AIRFLOW = str(Path(sys.executable).parent / "airflow")
# Airflow insists on it for DAGs with depends_on_past tasks (plan has it).
REPROCESS = ["--reprocess-behavior", "failed"]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


KILLED_TABLE = "tests.killed"


@pytest.fixture(scope="module")
def airflow_cluster(
    metastore: LocalMetastore, airflow_pg_conn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, str], Path]]:
    tmp_path = tmp_path_factory.mktemp("airflow-cluster")
    registry = tmp_path / "registry"
    registry.mkdir()
    port = free_port()
    env = airflow_env(
        tmp_path / "airflow",
        metastore.uri,
        registry_dir=registry,
        warehouse_dir=metastore.home / "warehouse",
        sql_alchemy_conn=airflow_pg_conn,
    )
    env.update(
        {
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            # Every component must sign and check task tokens with the same secret.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            # A new registry file reaches the running DAG processor on its next parse of the DAG file.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__CORE__PARALLELISM": "4",
            # Task processes inherit this: publish of one table dies by SIGKILL, once.
            faults.ENV: f"publish.after_commit_record@{KILLED_TABLE}=kill",
            faults.ONCE_ENV: str(tmp_path / "faults-fired"),
        }
    )
    ensure_airflow_db(env)
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for component in (["api-server", "--port", str(port), "--host", "127.0.0.1"], ["scheduler"], ["dag-processor"]):
            out = open(logs / f"{component[0]}.log", "wb")  # noqa: SIM115 - closed with the process
            procs.append(
                subprocess.Popen(
                    [AIRFLOW, *component], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
        deadline = time.monotonic() + 180
        while not port_open("127.0.0.1", port):
            assert time.monotonic() < deadline, (logs / "api-server.log").read_text()[-3000:]
            assert all(p.poll() is None for p in procs), "an Airflow component exited; see " + str(logs)
            time.sleep(1)
        yield env, registry
    finally:
        _stop(procs)


def _wait_for_dag(env: dict[str, str], dag_id: str, timeout: float = 180.0) -> None:
    """Wait until the running DAG processor has written ``dag_id`` (active) to the metadata DB.

    Not ``airflow dags reserialize``: a second process serializing the same new DAG at the
    moment the DAG processor does makes one of them fail on the ``dag`` table's primary key
    (CI saw ``reserialize`` exit 1 so).  The DAG processor is what users run anyway.
    """
    conn = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    deadline = time.monotonic() + timeout
    while True:
        rows = metadata_rows(conn, "SELECT is_stale FROM dag WHERE dag_id = ?", (dag_id,))
        row = rows[0] if rows else None
        if row is not None and row[0] is False:
            return
        assert time.monotonic() < deadline, f"the DAG processor did not write {dag_id} within {timeout:.0f}s"
        time.sleep(1)


def _runs(env: dict[str, str], dag_id: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [AIRFLOW, "dags", "list-runs", dag_id, "-o", "json"], env=env, capture_output=True, text=True, check=True
    ).stdout
    # Airflow's log lines share stdout with the JSON: take the line that is the JSON list.
    for line in out.splitlines():
        if line.startswith("[{") or line.strip() == "[]":
            return json.loads(line)
    return []


#: make test-extended: the real scheduler's runs are in make test through the killed-task retry below and
#: tests/airflow/test_airflow_ui.py; this one adds a three-run backfill (some 3 minutes).
@pytest.mark.extended
def test_backfill_serializes_runs_and_compacts_everything_once(airflow_cluster, tmp_path: Path) -> None:
    env, registry = airflow_cluster
    doc = {
        "database": "tests",
        "table": "backfilled",
        "columns": [dict(c) for c in STUDENT_COLUMNS],
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": str(tmp_path / "lake" / "backfilled"),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "schedule": "@hourly",
        "start_date": "2026-11-01T00:00:00Z",
        "retries": 1,
        "retry_delay": "5s",
    }
    (registry / "tests.backfilled.yaml").write_text(yaml.safe_dump(doc))
    cfg = parse_table(doc)
    land(cfg, "increment_2026110100", [[{"id": 1, "full_name": "a", "op": "c", "ts_ms": 1}]])
    land(cfg, "increment_2026110101", [[{"id": 1, "full_name": "b", "op": "u", "ts_ms": 2}]])
    land(cfg, "increment_2026110102", [[{"id": 2, "full_name": "c", "op": "c", "ts_ms": 3}]])
    _wait_for_dag(env, cfg.dag_id)
    # Airflow starts no run of a paused DAG, backfill runs included.  Unpausing also lets
    # the scheduler add the latest scheduled run: it must queue behind, and find nothing.
    subprocess.run([AIRFLOW, "dags", "unpause", cfg.dag_id], env=env, check=True, capture_output=True)
    window = ["--from-date", "2026-11-01T00:00:00+00:00", "--to-date", "2026-11-01T02:00:00+00:00"]
    created = subprocess.run(
        [AIRFLOW, "backfill", "create", "--dag-id", cfg.dag_id, *window, "--max-active-runs", "3", *REPROCESS],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert created.returncode == 0, created.stdout[-3000:] + created.stderr[-3000:]
    deadline = time.monotonic() + 900
    while True:
        runs = _runs(env, cfg.dag_id)
        backfill = [r for r in runs if r["run_id"].startswith("backfill__")]
        if len(backfill) == 3 and all(r["state"] in ("success", "failed") for r in runs):
            break
        assert time.monotonic() < deadline, f"backfill did not finish: {runs}"
        time.sleep(5)
    assert all(r["state"] == "success" for r in runs), runs
    lake = Lake(cfg)
    commit = lake.latest_commit()
    assert commit.seq == 1, "one run compacted everything; the runs after it found nothing pending"
    assert commit.increments == ["increment_2026110100", "increment_2026110101", "increment_2026110102"]
    assert commit.stats["output_visible_rows"] == 2 and commit.stats["duplicate_keys"] == 0
    assert list(Path(lake.layout.incremental).glob("*/*.parquet")) == []


def test_a_task_killed_after_the_commit_record_is_retried_by_airflow(airflow_cluster, tmp_path: Path) -> None:
    env, registry = airflow_cluster
    database, table = KILLED_TABLE.split(".")
    doc = {
        "database": database,
        "table": table,
        "columns": [dict(c) for c in STUDENT_COLUMNS],
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": str(tmp_path / "lake" / table),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "schedule": None,
        "retries": 2,
        "retry_delay": "2s",
    }
    (registry / f"{KILLED_TABLE}.yaml").write_text(yaml.safe_dump(doc))
    cfg = parse_table(doc)
    land(cfg, "increment_2026112200", [[{"id": 1, "full_name": "a", "op": "c", "ts_ms": 1}]])
    land(cfg, "increment_2026112201", [[{"id": 1, "full_name": "b", "op": "u", "ts_ms": 2}]])
    _wait_for_dag(env, cfg.dag_id)
    subprocess.run([AIRFLOW, "dags", "unpause", cfg.dag_id], env=env, check=True, capture_output=True)
    subprocess.run([AIRFLOW, "dags", "trigger", cfg.dag_id], env=env, check=True, capture_output=True)
    deadline = time.monotonic() + 600
    while True:
        runs = _runs(env, cfg.dag_id)
        if runs and all(r["state"] in ("success", "failed") for r in runs):
            break
        assert time.monotonic() < deadline, f"the run did not finish: {runs}"
        time.sleep(3)
    fired = Path(env[faults.ONCE_ENV]) / f"publish.after_commit_record@{KILLED_TABLE}"
    assert fired.exists(), "the publish task process was not killed"
    assert [r["state"] for r in runs] == ["success"], runs
    lake = Lake(cfg)
    commit = lake.latest_commit()
    assert commit.seq == 1 and lake.read_pointer()["seq"] == 1 and lake.is_archived(1)
    assert commit.stats["output_visible_rows"] == 1 and commit.stats["duplicate_keys"] == 0
    assert list(Path(lake.layout.incremental).glob("*/*.parquet")) == []
    archived = sorted(
        p.relative_to(lake.layout.archive).as_posix() for p in Path(lake.layout.archive).rglob("*.parquet")
    )
    assert archived == [
        "c00000001/increment_2026112200/part-00000.parquet",
        "c00000001/increment_2026112201/part-00000.parquet",
    ]
