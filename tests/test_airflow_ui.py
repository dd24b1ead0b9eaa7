"""``make airflow-ui``: Ctrl-C stops every process the command started, and only those.

Runs the real command (Airflow standalone: API server, scheduler, DAG processor, triggerer) in a
process group of its own, as a terminal would, against the session's metastore (no JVM of its own),
waits until the API server answers on 127.0.0.1, then sends the group SIGINT as Ctrl-C does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from cdc_compaction.local_services import LocalMetastore

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")

pytestmark = [pytest.mark.metastore, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # an HTTP answer, whatever its status
    except OSError:
        return False


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_ctrl_c_stops_everything_airflow_ui_started(metastore: LocalMetastore, tmp_path: Path) -> None:
    port = _free_port()
    (tmp_path / "registry").mkdir()  # no tables: the DAG processor has little to parse
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins"), "CDC_REGISTRY_DIR": str(tmp_path / "registry")}
    cmd = [sys.executable, "-m", "cdc_compaction", "airflow-ui", "--port", str(port), "--metastore", metastore.uri]
    # No Spark Connect server: one more JVM here would only cost time (connect start|stop is its own command).
    cmd += ["--airflow-home", str(tmp_path / "airflow"), "--no-connect"]
    log = tmp_path / "airflow-ui.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 300
        components: set[str] = set()
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            for p in psutil.Process(proc.pid).children(recursive=True):
                seen.setdefault(p.pid, p)
                try:
                    args = p.cmdline()
                except psutil.Error:
                    continue
                components |= {c for c in COMPONENTS if len(args) > 2 and args[2] == c and "airflow" in args[1]}
            if components == set(COMPONENTS) and _answers(port):
                break
            time.sleep(1)
        else:
            pytest.fail(f"not up after 300 s (components {sorted(components)}):\n{log.read_text()[-3000:]}")

        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the foreground process group
        assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
        survivors = [(p.pid, p.cmdline()) for p in seen.values() if _alive(p)]
        assert survivors == [], survivors
        assert not _answers(port)
        # The metastore was running before: the command leaves it alone.
        assert metastore.pid() is not None
    finally:
        for p in [*seen.values(), psutil.Process(proc.pid) if proc.poll() is None else None]:
            if p is not None and _alive(p):
                p.kill()
        proc.wait(timeout=30)
