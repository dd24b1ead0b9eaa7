"""After ``CDC_TEST_DEADLINE``, tests not yet started are skipped and counted (``devtools.pytest_deadline``).

Each test runs pytest on a small test file, as ``.ci/run`` runs the extended tier: a test that fails before
the deadline keeps its failure, a test running when the deadline passes finishes and tears its fixture
down, and the tests after it are skipped with the deadline's reason and counted in the run's last lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cdc_compaction.devtools.pytest_deadline import DeadlineError, deadline_from_env

pytestmark = pytest.mark.slow

INNER = """
import os, time
from pathlib import Path
import pytest

STATE = Path(os.environ["DEADLINE_STATE"])
DEADLINE = int(os.environ.get("CDC_TEST_DEADLINE") or 0)

@pytest.fixture
def marker():
    yield
    (STATE / "torn-down").write_text("")

def test_0_fails_before_the_deadline():
    assert 1 == 2

def test_1_runs_across_the_deadline(marker):
    (STATE / "started-1").write_text(str(time.time()))
    while time.time() < DEADLINE + 1:
        time.sleep(0.2)
    (STATE / "finished-1").write_text(str(time.time()))

def test_2_after_the_deadline():
    (STATE / "ran-2").write_text("")

def test_3_after_the_deadline():
    (STATE / "ran-3").write_text("")
"""

PLUGIN = os.environ.get("DEADLINE_PLUGIN_UNDER_TEST", "cdc_compaction.devtools.pytest_deadline")


def _start(tmp_path: Path, name: str, deadline: str, workers: int) -> tuple[subprocess.Popen[str], Path]:
    where = tmp_path / name
    state = where / "state"
    state.mkdir(parents=True)
    (where / "test_inner.py").write_text(INNER)
    env = {**os.environ, "CDC_TEST_DEADLINE": deadline, "DEADLINE_STATE": str(state)}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", PLUGIN, "-rs", "test_inner.py"]
    cmd += ["-n", str(workers), "--dist", "loadfile"] if workers else ["-p", "no:xdist"]
    # The inner file's directory is the rootdir: the project's tests/conftest.py is not loaded.
    proc = subprocess.Popen(cmd, cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, state


def test_tests_after_the_deadline_are_skipped_and_counted_and_none_is_cut_short(tmp_path: Path) -> None:
    # Far enough ahead that pytest starts (and its workers) before it, on a loaded machine too.
    deadline = int(time.time()) + 25
    runs = {n: _start(tmp_path, f"w{n}", str(deadline), n) for n in (0, 2)}
    for workers, (proc, state) in runs.items():
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 1, (workers, out)  # the failure before the deadline still fails the run
        assert re.search(r"1 failed, 1 passed, 2 skipped", out), (workers, out)
        assert float((state / "started-1").read_text()) < deadline, (workers, out)
        assert float((state / "finished-1").read_text()) >= deadline + 1, (workers, out)
        assert (state / "torn-down").exists(), (workers, out)
        assert not (state / "ran-2").exists() and not (state / "ran-3").exists(), (workers, out)
        assert "not run: the deadline (CDC_TEST_DEADLINE) passed at" in out, (workers, out)
        assert "2 test(s) not run: CDC_TEST_DEADLINE passed at" in out, (workers, out)


def test_without_a_deadline_every_test_runs(tmp_path: Path) -> None:
    proc, state = _start(tmp_path, "none", "", 0)
    # The spanning test would wait for a deadline of 0: it returns at once.
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and re.search(r"1 failed, 3 passed", out), out
    assert (state / "ran-2").exists() and (state / "ran-3").exists()
    assert "not run" not in out


def test_a_malformed_deadline_stops_the_run_before_any_test(tmp_path: Path) -> None:
    proc, state = _start(tmp_path, "bad", "in an hour", 0)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 4, out  # pytest's usage error
    assert "CDC_TEST_DEADLINE='in an hour' is not a whole number of seconds since the epoch" in out
    assert not list(state.iterdir())


def test_deadline_from_env() -> None:
    assert deadline_from_env({}) is None
    assert deadline_from_env({"CDC_TEST_DEADLINE": " "}) is None
    assert deadline_from_env({"CDC_TEST_DEADLINE": "1796000000"}) == 1796000000.0
    with pytest.raises(DeadlineError, match=r"set it to e\.g\."):
        deadline_from_env({"CDC_TEST_DEADLINE": "12.5"})
