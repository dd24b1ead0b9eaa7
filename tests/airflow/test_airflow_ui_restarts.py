"""Day two of ``make airflow-ui``: the local UI keeps its state across restarts, and a shell's commands reach it.

The real command, started three times on one project (its default home ``<project>/.airflow``,
its own persistent PostgreSQL), as a terminal would, each time stopped by SIGINT to its process
group.  The first time a run is triggered and finishes, the deployment identity Variable is
recorded, and the DAG is paused and resumed from the shell.  The next two starts must not need a
migration and must still show the run, the pause flag and the identity.  The operations commands
run as subprocesses with no ``AIRFLOW_HOME`` nor database in their environment: they find the
UI by the project alone, as ``status`` does.  A last start whose port is taken fails with the
api-server's own last log lines.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import student_doc

from cdc_compaction.devtools.local_services import LocalPostgres, free_port

REPO = Path(__file__).resolve().parents[2]
TABLE, DAG = "tests.idle", "cdc__tests__idle"
#: The deployment identity (core/deployment.py): an Airflow Variable of the metadata database.
IDENTITY = "cdc_compaction_deployment_id"

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


class Ui:
    """One ``cdc-compaction airflow-ui`` process group, stopped by its PID."""

    def __init__(self, env: dict[str, str], port: int, metastore_port: int, pg_port: int, log: Path) -> None:
        cmd = [sys.executable, "-m", "cdc_compaction", "airflow-ui", "--port", str(port), "--no-connect"]
        cmd += ["--metastore", f"thrift://127.0.0.1:{metastore_port}", "--postgres-port", str(pg_port)]
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.base = f"http://127.0.0.1:{port}"

    def wait(self, what: str, check: Any, timeout_s: float = 300) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{what}: the command exited:\n{self.log.read_text()[-4000:]}"
            got = check()
            if got:
                return got
            time.sleep(1)
        pytest.fail(f"{what}: not within {timeout_s:.0f} s:\n{self.log.read_text()[-4000:]}")

    def token(self, home: Path) -> str:
        self.wait("the UI's message", lambda: "Airflow UI on" in self.log.read_text())
        password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        body = {"username": "admin", "password": password}
        status, doc = _request(f"{self.base}/auth/token", method="POST", body=body)
        assert status == 201, doc
        return str(doc["access_token"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the command stops what it started
        assert self.proc.wait(timeout=90) == 0, self.log.read_text()[-4000:]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc_compaction", *args], env=env, capture_output=True, text=True, check=False
    )


def test_the_local_ui_keeps_runs_pause_flags_and_identity_across_restarts(tmp_path: Path) -> None:
    started = time.monotonic()
    project, registry, shell_home = tmp_path / "project", tmp_path / "registry", tmp_path / "home"
    for d in (project, registry, shell_home):
        d.mkdir()
    for part in ("dags", "plugins", "include"):  # a project like a clone; its .airflow is this test's own
        (project / part).symlink_to(REPO / part)
    (registry / f"{TABLE}.yaml").write_text(yaml.safe_dump(student_doc(tmp_path / "lake", "idle", enabled=False)))
    home = project / ".airflow"
    base_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__")) and k != "CDC_METASTORE_URI"
    }
    base_env.update({"PYTHONPATH": str(REPO / "plugins"), "CDC_PROJECT_ROOT": str(project)})
    base_env["CDC_REGISTRY_DIR"] = str(registry)
    # The shell of an operator: no AIRFLOW_HOME, no database URL, and no ~/airflow of this machine's.
    shell = {**base_env, "HOME": str(shell_home)}
    port, metastore_port, pg_port = free_port(), free_port(), free_port()
    pg = LocalPostgres(home / "postgres", port=pg_port, persistent=True)
    uis: list[Ui] = []
    starts: list[float] = []
    try:
        t = time.monotonic()
        ui = Ui(base_env, port, metastore_port, pg_port, tmp_path / "ui-1.log")
        uis.append(ui)
        token = ui.token(home)
        starts.append(time.monotonic() - t)
        ui.wait("the DAG parsed", lambda: _request(f"{ui.base}/api/v2/dags/{DAG}", token)[0] == 200)

        # resume from the shell, then a run through REST (a disabled table's: every task skips).
        res = _cli(shell, "resume", TABLE)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"{DAG} is now active" in res.stdout, res.stdout
        status, doc = _request(f"{ui.base}/api/v2/dags/{DAG}/dagRuns", token, "POST", {"logical_date": None})
        assert status == 200, doc
        run_id = doc["dag_run_id"]

        def run_state() -> Any:
            st, d = _request(f"{ui.base}/api/v2/dags/{DAG}/dagRuns/{run_id}", token)
            return d["state"] if st == 200 and d["state"] in ("success", "failed") else None

        assert ui.wait("the run", run_state, 600) == "success"
        # The deployment identity, as the first task that takes a lease creates it (core/deployment.py).
        status, doc = _request(f"{ui.base}/api/v2/variables", token, "POST", {"key": IDENTITY, "value": "a1b2c3"})
        assert status in (200, 201), doc

        res = _cli(shell, "pause", TABLE)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"{DAG} is now paused" in res.stdout, res.stdout
        res = _cli(shell, "status", TABLE, "--json")
        assert res.returncode == 0, res.stderr
        (row,) = json.loads(res.stdout)
        assert row["paused"] is True and row["last_run"]["run_id"] == run_id, row
        res = _cli(shell, "doctor", TABLE)
        spark = [line for line in res.stdout.splitlines() if ": spark:" in line]
        assert spark and spark[0].startswith("OK"), res.stdout + res.stderr  # spark_default: the UI's own
        assert "isn't defined" not in res.stdout, res.stdout
        # ... and its metastore (the UI's --metastore, recorded for shells: here one nothing listens on).
        metastore = [line for line in res.stdout.splitlines() if ": metastore:" in line]
        assert metastore and f"127.0.0.1:{metastore_port}" in res.stdout, res.stdout
        ui.stop()

        for n in (2, 3):
            t = time.monotonic()
            ui = Ui(base_env, port, metastore_port, pg_port, tmp_path / f"ui-{n}.log")
            uis.append(ui)
            token = ui.token(home)
            starts.append(time.monotonic() - t)
            status, doc = _request(f"{ui.base}/api/v2/dags/{DAG}/dagRuns", token)
            assert status == 200, doc
            assert [(r["dag_run_id"], r["state"]) for r in doc["dag_runs"]] == [(run_id, "success")], doc
            status, doc = _request(f"{ui.base}/api/v2/dags/{DAG}", token)
            assert status == 200 and doc["is_paused"] is True, doc
            status, doc = _request(f"{ui.base}/api/v2/variables/{IDENTITY}", token)
            assert status == 200 and doc["value"] == "a1b2c3", doc
            res = _cli(shell, "status", TABLE, "--json")
            (row,) = json.loads(res.stdout)
            assert row["paused"] is True and row["last_run"]["run_id"] == run_id, row
            ui.stop()
        migrations = [p.name for p in (home / "components").glob("*.log") if "migration required" in p.read_text()]
        assert migrations == [], migrations

        # A start that fails says why: the api-server's port is taken (listening, never answering).
        t = time.monotonic()
        with socket.socket() as taken:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the last api-server's TIME_WAIT
            taken.bind(("127.0.0.1", port))
            taken.listen()
            ui = Ui(base_env, port, metastore_port, pg_port, tmp_path / "ui-4.log")
            uis.append(ui)
            assert ui.proc.wait(timeout=300) == 1
        out = ui.log.read_text()
        assert "api-server" in out and "last lines of" in out, out
        assert "address already in use" in out.lower(), out
        starts.append(time.monotonic() - t)

        # The reset: the data this home owns goes; the next start would begin anew.
        data = pg.data_dir()
        assert data is not None and (data / "PG_VERSION").exists()
        res = _cli(base_env, "airflow-ui", "--reset-database", "--postgres-port", str(pg_port))
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"deleted {data}" in res.stdout or f"deleted {data.parent}" in res.stdout, res.stdout
        assert not data.exists() and pg.data_dir() is None
    finally:
        for u in uis:
            if u.proc.poll() is None:
                os.killpg(u.proc.pid, signal.SIGINT)
                u.proc.wait(timeout=90)
        pg.destroy()  # the persistent data this test made (as root: outside pytest's directory)
    took = ", ".join(f"{s:.0f}s" for s in starts)
    print(f"starts (the last one failing): {took}; total {time.monotonic() - started:.0f}s")
