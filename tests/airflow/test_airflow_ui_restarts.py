"""Day two of ``make airflow-ui`` (issue 39, item 7): the local UI keeps its state across restarts, a
shell's commands reach it, and the readers and the CDC tables page stay right after an erase and a rollback.

The real command, started three times on one project (its default home ``<project>/.airflow``,
its own persistent PostgreSQL), as a terminal would, each time stopped by SIGINT to its process
group.  Its table is partitioned by region and its DAG runs the job in the session's warm Spark
Connect server, on the session's metastore.

1. First start: the DAG is resumed from the shell; two landed increments become two commits through
   two runs triggered over REST (whose first lease created the deployment identity); the DAG is paused
   from the shell (``status`` and ``doctor`` see the UI's runs and connections).
2. Second start: no migration; the runs, the pause flag and the identity are still there.  From the
   shell, ``erase --where "region = 'us'" --yes`` empties the partition ``us``; the DuckDB view
   script is read with DuckDB and the CDC tables page over HTTP; then ``rollback --to 1``.
3. Third start: the same runs, flag and identity; ``versions``, the DuckDB views and the page still
   show the rollback's rows and every commit's numbers.

The operations commands run as subprocesses with no ``AIRFLOW_HOME``, database nor metastore in
their environment: they find the UI by the project alone, as ``status`` does.  Expected rows come
from the landed events by the contract's rule (the latest ``ts_ms`` per key; ``d`` deletes), written
here.  A last start whose port is taken fails with the api-server's own last log lines.
"""

from __future__ import annotations

import json
import os
import re
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
from conftest import OVER_CONNECT, student_doc
from pipeline.helpers import REGION_COLUMNS, region_rows

from cdc_compaction.core.registry import parse_table
from cdc_compaction.devtools.conformance import land
from cdc_compaction.devtools.local_services import LocalPostgres, free_port

REPO = Path(__file__).resolve().parents[2]
TABLE, DAG = "tests.regions", "cdc__tests__regions"
#: The landed events of the two runs: (id, region, full_name, op, ts_ms).
EVENTS = (
    [(1, "eu", "ann", "c", 1), (2, "us", "bob", "c", 1), (3, "us", "cy", "c", 1)],
    [(1, "eu", "ann b", "u", 2), (2, "us", None, "d", 2), (4, "us", "dee", "c", 2), (5, "apac", "eve", "c", 2)],
)
ERASED = "us"
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
        t = time.monotonic()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the command stops what it started
        assert self.proc.wait(timeout=90) == 0, self.log.read_text()[-4000:]
        SPENT["stop"] = SPENT.get("stop", 0.0) + time.monotonic() - t


#: Seconds spent per kind of step (shell command, run, stop, page), printed at the end.
SPENT: dict[str, float] = {}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    t = time.monotonic()
    try:
        return subprocess.run(
            [sys.executable, "-m", "cdc_compaction", *args], env=env, capture_output=True, text=True, check=False
        )
    finally:
        SPENT[args[0]] = SPENT.get(args[0], 0.0) + time.monotonic() - t


def _expected(runs: int) -> dict[int, tuple[str, str]]:
    """The visible rows after the first ``runs`` increments, by the contract: per key the event of the
    latest ``ts_ms``; a ``d`` event leaves no row.  id -> (region, full_name)."""
    latest: dict[int, tuple[str, str | None, str, int]] = {}
    for events in EVENTS[:runs]:
        for key, region, name, op, ts in events:
            if key not in latest or ts >= latest[key][3]:
                latest[key] = (region, name, op, ts)
    return {k: (r, str(n)) for k, (r, n, op, _) in latest.items() if op != "d"}


def _erased(rows: dict[int, tuple[str, str]]) -> dict[int, tuple[str, str]]:
    """``rows`` without the erased partition: the erase takes it out of every kept version."""
    return {k: v for k, v in rows.items() if v[0] != ERASED}


def _duckdb(script: Path) -> dict[str, dict[int, tuple[str, str]]]:
    """The DuckDB views a user reads: the script run in a fresh DuckDB, then ``<t>_base`` and ``<t>_view``."""
    import duckdb

    db, table = TABLE.split(".")
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.execute(script.read_text())
        return {
            view: {
                i: (r, n)
                for i, r, n in con.execute(f'SELECT id, region, full_name FROM "{db}"."{table}_{view}"').fetchall()
            }
            for view in ("base", "view")
        }


def _page(url: str, token: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _commits(text: str) -> dict[int, tuple[str, str]]:
    """seq -> (rows, the increments or the note) of the table page's commits."""
    body = text.split('<table id="commits">')[1]
    head = re.findall(r"<th>([^<]+)</th>", body.split("</thead>")[0])
    out = {}
    for seq, row in re.findall(r'<tr data-seq="(\d+)">(.*?)</tr>', body):
        cells = dict(zip(head, re.findall(r"<td[^>]*>([^<]*)</td>", row), strict=True))
        out[int(seq)] = (cells["rows"], cells["increments"])
    return out


def _versions(env: dict[str, str]) -> dict[int, int]:
    """``cdc-compaction versions --json`` of a shell: commit -> rows."""
    res = _cli(env, "versions", TABLE, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    return {v["commit"]: v["rows"] for v in json.loads(res.stdout[res.stdout.index("[") :])}


def test_day_two_restarts_pause_erase_rollback_and_the_page(tmp_path: Path, metastore: Any, warm_connect: Any) -> None:
    started = time.monotonic()
    project, registry, shell_home = tmp_path / "project", tmp_path / "registry", tmp_path / "home"
    for d in (project, registry, shell_home):
        d.mkdir()
    for part in ("dags", "plugins", "include"):  # a project like a clone; its .airflow is this test's own
        (project / part).symlink_to(REPO / part)
    duck = tmp_path / "duck" / "regions.sql"
    doc = student_doc(tmp_path / "lake", "regions", columns=REGION_COLUMNS, partition_by={"column": "region"})
    # Manual runs only (no scheduled run beside the test's), the job in the warm server, DuckDB views.
    doc.update(schedule=None, spark=OVER_CONNECT, views={"duckdb": str(duck)}, keep_versions=5)
    (registry / f"{TABLE}.yaml").write_text(yaml.safe_dump(doc))
    cfg = parse_table(doc)
    home = project / ".airflow"
    base_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__")) and k != "CDC_METASTORE_URI"
    }
    base_env.update({"PYTHONPATH": str(REPO / "plugins"), "CDC_PROJECT_ROOT": str(project)})
    base_env["CDC_REGISTRY_DIR"] = str(registry)
    # The shell of an operator: no AIRFLOW_HOME, no database URL, no metastore, and no ~/airflow of this machine's.
    shell = {**base_env, "HOME": str(shell_home)}
    # The UI's tasks reach the warm Spark Connect server (its spark_connect_default connection).
    base_env["CDC_CONNECT_PORT"] = str(warm_connect.port)
    port, pg_port = free_port(), free_port()
    metastore_port = metastore.port
    pg = LocalPostgres(home / "postgres", port=pg_port, persistent=True)
    uis: list[Ui] = []
    starts: list[float] = []
    run_ids: list[str] = []
    identity = ""

    def check_kept_state(ui: Ui, token: str) -> None:
        """What every start shows again: the runs, the pause flag, the identity; and status from the shell."""
        status, doc = _request(f"{ui.base}/api/v2/dags/{DAG}/dagRuns", token)
        assert status == 200, doc
        assert sorted((r["dag_run_id"], r["state"]) for r in doc["dag_runs"]) == sorted(
            (r, "success") for r in run_ids
        ), doc
        status, doc = _request(f"{ui.base}/api/v2/dags/{DAG}", token)
        assert status == 200 and doc["is_paused"] is True, doc
        status, doc = _request(f"{ui.base}/api/v2/variables/{IDENTITY}", token)
        assert status == 200 and doc["value"] == identity, doc
        res = _cli(shell, "status", TABLE, "--json")
        (row,) = json.loads(res.stdout)
        assert row["paused"] is True and row["last_run"]["run_id"] == run_ids[-1], row

    def check_readers(expected: dict[int, tuple[str, str]], versions: dict[int, int], ui: Ui, token: str) -> str:
        """The DuckDB views, ``versions`` and the table page agree with ``expected`` (the live rows)."""
        assert _duckdb(duck) == {"base": expected, "view": expected}, "the DuckDB views read the live rows"
        assert _versions(shell) == versions
        t = time.monotonic()
        status, text = _page(f"{ui.base}/cdc/table/{TABLE}", token)
        assert status == 200, text
        SPENT["page"] = SPENT.get("page", 0.0) + time.monotonic() - t
        shown = _commits(text)
        assert {seq: int(rows) for seq, (rows, _) in shown.items() if seq} == {
            seq: n for seq, n in versions.items() if seq
        }, "the page's rows are what versions prints"
        # ... and its live version and last commit are what status prints.
        res = _cli(shell, "status", TABLE, "--json")
        (row,) = json.loads(res.stdout)
        last = row["last_commit"]
        assert (last["seq"], last["rows"]) == (max(versions), versions[max(versions)]), row
        assert f"Live version {row['live_version']}." in text and last["version"] == row["live_version"], row
        assert shown[last["seq"]][1] == last["note"], (shown, row)
        status, index = _page(f"{ui.base}/cdc/", token)
        assert status == 200, index
        shown_last = f"{last['seq']} at {last['committed_at'][:19]} ({last['rows']} rows)"
        assert shown_last in index, f"the tables page's last commit of {TABLE}: {shown_last}\n{index}"
        return text

    try:
        t = time.monotonic()
        ui = Ui(base_env, port, metastore_port, pg_port, tmp_path / "ui-1.log")
        uis.append(ui)
        token = ui.token(home)
        starts.append(time.monotonic() - t)
        t = time.monotonic()
        ui.wait("the DAG parsed", lambda: _request(f"{ui.base}/api/v2/dags/{DAG}", token)[0] == 200)
        SPENT["parse"] = time.monotonic() - t

        # resume from the shell, then two runs through REST, each compacting one landed increment.
        res = _cli(shell, "resume", TABLE)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"{DAG} is now active" in res.stdout, res.stdout
        for n, events in enumerate(EVENTS):
            land(cfg, f"increment_20261122{n:02d}", [region_rows(*events)])
            status, doc = _request(f"{ui.base}/api/v2/dags/{DAG}/dagRuns", token, "POST", {"logical_date": None})
            assert status == 200, doc
            run_id = doc["dag_run_id"]
            run_ids.append(run_id)

            def run_state(run_id: str = run_id) -> Any:
                st, d = _request(f"{ui.base}/api/v2/dags/{DAG}/dagRuns/{run_id}", token)
                return d["state"] if st == 200 and d["state"] in ("success", "failed") else None

            t = time.monotonic()
            assert ui.wait(f"run {n + 1}", run_state, 600) == "success"
            SPENT[f"run {n + 1}"] = time.monotonic() - t
        v2 = _expected(2)
        assert _duckdb(duck) == {"base": v2, "view": v2}
        # The deployment identity: the first task that took a lease created it (core/deployment.py).
        status, doc = _request(f"{ui.base}/api/v2/variables/{IDENTITY}", token)
        assert status == 200 and doc["value"], doc
        identity = doc["value"]

        res = _cli(shell, "pause", TABLE)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"{DAG} is now paused" in res.stdout, res.stdout
        res = _cli(shell, "status", TABLE, "--json")
        assert res.returncode == 0, res.stderr
        (row,) = json.loads(res.stdout)
        assert row["paused"] is True and row["last_run"]["run_id"] == run_ids[-1], row
        res = _cli(shell, "doctor", TABLE)
        spark = [line for line in res.stdout.splitlines() if ": spark:" in line]
        assert spark and spark[0].startswith("OK"), res.stdout + res.stderr  # the UI's own Spark connection
        assert "isn't defined" not in res.stdout, res.stdout
        # ... and its metastore (the UI's --metastore, recorded for shells).
        metastore_lines = [line for line in res.stdout.splitlines() if ": metastore:" in line]
        assert metastore_lines and f"127.0.0.1:{metastore_port}" in res.stdout, res.stdout
        ui.stop()

        for n in (2, 3):
            t = time.monotonic()
            ui = Ui(base_env, port, metastore_port, pg_port, tmp_path / f"ui-{n}.log")
            uis.append(ui)
            token = ui.token(home)
            starts.append(time.monotonic() - t)
            check_kept_state(ui, token)
            if n == 2:
                # Day two: the partition us goes (every kept version too), then back to the first version.
                res = _cli(shell, "erase", TABLE, "--where", f"region = '{ERASED}'", "--yes")
                assert res.returncode == 0, res.stdout + res.stderr
                live = _erased(v2)
                kept = {0: 0, 1: len(_erased(_expected(1))), 2: len(live), 3: len(live)}
                text = check_readers(live, kept, ui, token)
                # The page's note is the erase's own count of rows taken out of the live version's files
                # (the audit it printed): the erased visible rows, and the tombstone of a deleted us key.
                audit = json.loads(res.stdout[res.stdout.index("{") :])
                erased = audit["rows_removed"]["live"]
                assert erased >= len(v2) - len(live), audit
                assert _commits(text)[3][1] == f"erase: {erased} rows erased", text
                res = _cli(shell, "rollback", TABLE, "--to", "1", "--yes")
                assert res.returncode == 0, res.stdout + res.stderr
            # After the rollback, and again after a restart: the first version's rows, less the erased ones.
            v1 = _erased(_expected(1))
            kept = {0: 0, 1: len(v1), 2: len(_erased(v2)), 3: len(_erased(v2)), 4: len(v1)}
            text = check_readers(v1, kept, ui, token)
            assert _commits(text)[4][1] == "rollback to 1", text
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
    spent = ", ".join(f"{k} {v:.0f}s" for k, v in SPENT.items())
    print(f"starts (the last one failing): {took}; {spent}; total {time.monotonic() - started:.0f}s")
