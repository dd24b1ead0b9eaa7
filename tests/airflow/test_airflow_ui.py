"""``make airflow-ui``: Airflow on PostgreSQL that runs DAGs triggered through REST, and stops everything fast.

Runs the real command (api-server, then scheduler, DAG processor, triggerer) in a process group of
its own, as a terminal would, on a PostgreSQL database of the session's server and a metastore
port nothing listens on (the DAGs here need none).  A disabled table's DAG is triggered through the
REST API and its run succeeds (every task skips); a table whose metastore does not answer fails its
first task, and ``status`` shows that task and the first line of its error from the task log.  No
process of the command listens on every interface (Airflow's log servers are not started).  Then
the group gets SIGINT as from Ctrl-C: every process it started is gone within the command's bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from conftest import student_doc
from status_helpers import FAILING, add_failing_entries

from cdc_compaction.devtools.local_services import STOP_WITHIN_S, free_port

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
IDLE_DAG = "cdc__tests__idle"

pytestmark = [pytest.mark.dag, pytest.mark.slow]


def _request(url: str, token: str | None = None, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method=method), timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tree(pid: int, seen: dict[int, psutil.Process]) -> list[psutil.Process]:
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for p in procs:
        seen.setdefault(p.pid, p)
    return procs


def _wait(what: str, check: Any, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 300) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        got = check()
        if got:
            return got
        time.sleep(2)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def test_airflow_ui_runs_rest_triggered_runs_on_postgres_and_stops_everything(
    airflow_pg_conn: str, tmp_path: Path
) -> None:
    port = free_port()
    registry, home = tmp_path / "registry", tmp_path / "airflow"
    registry.mkdir()
    idle = student_doc(tmp_path / "lake", "idle", enabled=False)  # a run whose every task skips: no Spark
    (registry / "tests.idle.yaml").write_text(yaml.safe_dump(idle))
    add_failing_entries(tmp_path / "lake", registry)
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins"), "CDC_REGISTRY_DIR": str(registry)}
    cmd = [sys.executable, "-m", "cdc_compaction", "airflow-ui", "--port", str(port), "--no-connect"]
    cmd += ["--metastore", f"thrift://127.0.0.1:{free_port()}", "--airflow-home", str(home)]
    cmd += ["--sql-alchemy-conn", airflow_pg_conn]
    log = tmp_path / "airflow-ui.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    seen: dict[int, psutil.Process] = {}
    base = f"http://127.0.0.1:{port}"
    try:

        def components() -> bool:
            names = set()
            for p in _tree(proc.pid, seen):
                try:
                    # "airflow scheduler ..." or, retitled by the component itself, "airflow api_server -- ..."
                    words = " ".join(p.cmdline()).replace("_", "-").split()
                except psutil.Error:
                    continue
                names |= {c for c in COMPONENTS if c in words and any(w.endswith("airflow") for w in words)}
            return names == set(COMPONENTS)

        _wait("all four components", components, proc, log)
        passwords = home / "simple_auth_manager_passwords.json.generated"
        _wait("the generated password", passwords.exists, proc, log)
        password = json.loads(passwords.read_text())["admin"]
        status, doc = _request(f"{base}/auth/token", method="POST", body={"username": "admin", "password": password})
        assert status == 201, doc
        token = doc["access_token"]
        runs = {}
        for dag_id in (IDLE_DAG, FAILING["dag_id"]):
            _wait(f"{dag_id} parsed", lambda d=dag_id: _request(f"{base}/api/v2/dags/{d}", token)[0] == 200, proc, log)
            status, doc = _request(f"{base}/api/v2/dags/{dag_id}", token, "PATCH", {"is_paused": False})
            assert status == 200, doc
            status, doc = _request(f"{base}/api/v2/dags/{dag_id}/dagRuns", token, "POST", {"logical_date": None})
            assert status == 200, doc  # SQLite answered these with "Database error" next to the scheduler
            runs[dag_id] = doc["dag_run_id"]

        def state(dag_id: str) -> Any:
            status, doc = _request(f"{base}/api/v2/dags/{dag_id}/dagRuns/{runs[dag_id]}", token)
            return doc["state"] if status == 200 and doc["state"] in ("success", "failed") else None

        assert _wait("the idle run", lambda: state(IDLE_DAG), proc, log, 600) == "success"
        assert _wait("the failing run", lambda: state(FAILING["dag_id"]), proc, log, 600) == "failed"

        # The failure is in sight: status reads the run from the metadata DB and the error from the task log.
        # AIRFLOW_HOME alone: the command wrote its database into the home's airflow.cfg for such shells.
        af = {k: v for k, v in env.items() if k != "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"}
        af["AIRFLOW_HOME"] = str(home)
        st = subprocess.run(
            [sys.executable, "-m", "cdc_compaction", "status", FAILING["table"], "--json"],
            env=af,
            capture_output=True,
            text=True,
            check=False,
        )
        (row,) = json.loads(st.stdout)
        last = row["last_run"]
        assert (last["state"], last["failed_task"], last["try_number"]) == ("failed", FAILING["first_task"], 1), row
        assert last["error"].startswith("MetastoreError: cannot reach the Hive metastore"), last

        listening = []
        for p in _tree(proc.pid, seen):
            try:
                conns = p.net_connections(kind="inet")
            except psutil.Error:
                continue
            listening += [(p.pid, c.laddr) for c in conns if c.status == psutil.CONN_LISTEN]
        assert listening, "the api-server listens"
        wide = [(pid, a) for pid, a in listening if a.ip in ("0.0.0.0", "::")]
        assert wide == [], f"listening on every interface: {wide}"

        _tree(proc.pid, seen)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the foreground process group
        asked = time.monotonic()
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        took = time.monotonic() - asked
        survivors = [(p.pid, p.cmdline()) for p in seen.values() if _alive(p)]
        assert survivors == [], survivors
        # A correctness bound of the command (its contract), not a performance figure.
        assert took < STOP_WITHIN_S, f"stopping took {took:.1f} s"
        assert _request(f"{base}/api/v2/monitor/health")[0] == 0, "the api-server still answers"
    finally:
        for p in [*seen.values(), *([psutil.Process(proc.pid)] if proc.poll() is None else [])]:
            if _alive(p):
                p.kill()
        proc.wait(timeout=30)
