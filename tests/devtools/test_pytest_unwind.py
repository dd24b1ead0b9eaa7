"""A SIGTERM to a test run stops the servers its fixtures started (``cdc_compaction.devtools.pytest_unwind``).

Each test runs pytest on a small test file whose session fixture starts a process in a session of its own,
as the fixtures start PostgreSQL or the metastore, and stops it by PID in its teardown. While a test
runs, the run's whole process group gets SIGTERM, as ``kill -- -PGID`` or a CI job's stop sends it.
Without the plugin pytest dies at once and the process stays.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdc_compaction.devtools.local_services import pid_alive

pytestmark = pytest.mark.slow

PLUGIN = os.environ.get("UNWIND_PLUGIN_UNDER_TEST", "cdc_compaction.devtools.pytest_unwind")

INNER = """
import os, signal, subprocess, time
from pathlib import Path
import pytest

STATE = Path(os.environ["UNWIND_STATE"])

@pytest.fixture(scope="session")
def server():
    # Its own session, as the fixtures start their servers: the run's process group does not reach it.
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (STATE / f"server-{proc.pid}").write_text("")
    yield proc
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    (STATE / f"stopped-{proc.pid}").write_text("")

def test_a_long_one(server):
    (STATE / f"running-{os.getpid()}").write_text("")
    time.sleep(120)

def test_b_long_one(server):
    (STATE / f"running-{os.getpid()}").write_text("")
    time.sleep(120)
"""


def _wait_for(state: Path, prefix: str, count: int, timeout_s: float = 120) -> list[Path]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(state.glob(f"{prefix}-*"))
        if len(found) >= count:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no {count} {prefix} marker(s) in {state} after {timeout_s} s: {os.listdir(state)}")


@pytest.mark.parametrize("workers", [0, 2], ids=["one_process", "xdist_workers"])
def test_a_sigterm_to_the_run_stops_what_its_fixtures_started(tmp_path: Path, workers: int) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "test_inner.py").write_text(INNER)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN]
    argv += ["-n", str(workers), str(tmp_path / "test_inner.py")]
    run = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env={**os.environ, "UNWIND_STATE": str(state)},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    servers: list[int] = []
    try:
        expected = max(workers, 1)
        _wait_for(state, "running", expected)
        servers = [int(p.name.split("-")[1]) for p in _wait_for(state, "server", expected)]
        os.killpg(run.pid, signal.SIGTERM)
        out, _ = run.communicate(timeout=120)
        stopped = {int(p.name.split("-")[1]) for p in state.glob("stopped-*")}
        assert stopped == set(servers), out
        assert not [pid for pid in servers if pid_alive(pid)], out
        assert run.returncode != 0, out
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        for pid in servers:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
