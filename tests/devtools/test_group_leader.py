"""GroupLeader's start: spawn a process group, wait for the service's own readiness check, fail with the log's tail.

The services are tiny Python processes (no JVM): what is tested is the loop HiveServer2 and Trino share.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from cdc_compaction.devtools.local_services import GroupLeader, ServiceError, pid_alive


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """``pid`` has exited: no such process, or a zombie its new parent (not this test) has yet to reap."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@dataclass
class _Toy(GroupLeader):
    """A service that runs ``code`` in Python and is ready when ``home/ready`` exists."""

    service: ClassVar[str] = "Toy"

    home: Path
    code: str
    pid: int | None = None

    @property
    def log_file(self) -> Path:
        return self.home / "toy.log"

    @property
    def pid_file(self) -> Path:
        return self.home / "toy.pid"

    def start(self, timeout_s: float = 10.0) -> int:
        proc = self.launch([sys.executable, "-c", self.code], self.home)
        return self.wait_ready(
            proc, (self.home / "ready").exists, timeout_s, waiting_for="write its ready file", poll_s=0.1
        )


def test_a_ready_service_runs_under_its_pid_file_and_stops_with_its_group(tmp_path: Path) -> None:
    # The service starts a child of its own: stopping the group stops it too.
    code = (
        "import pathlib, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "pathlib.Path('child.pid').write_text(str(child.pid))\n"
        "pathlib.Path('ready').touch()\n"
        "time.sleep(60)\n"
    )
    with _Toy(tmp_path, code) as toy:
        pid = toy.pid
        assert pid is not None and pid_alive(pid)
        assert toy.pid_file.read_text() == str(pid)
        assert os.getpgid(pid) == pid, "the service leads a process group of its own"
        child = int((tmp_path / "child.pid").read_text())
    assert toy.pid is None and not toy.pid_file.exists()
    assert not pid_alive(pid) and _gone(child)


def test_a_service_that_exits_while_starting_fails_at_once_with_its_code_and_log(tmp_path: Path) -> None:
    toy = _Toy(tmp_path, "import sys; print('bad setting: port', flush=True); sys.exit(3)")
    with pytest.raises(ServiceError) as err:
        toy.start(timeout_s=30.0)
    assert "Toy exited with code 3 while starting" in str(err.value)
    assert "bad setting: port" in str(err.value) and str(toy.log_file) in str(err.value)
    assert toy.pid is None and not toy.pid_file.exists()


def test_a_service_that_never_gets_ready_is_stopped_by_pid_and_named_with_its_log(tmp_path: Path) -> None:
    code = (
        "import os, pathlib, time\n"
        "pathlib.Path('me.pid').write_text(str(os.getpid()))\n"
        "print('still loading', flush=True)\n"
        "time.sleep(60)\n"
    )
    toy = _Toy(tmp_path, code)
    with pytest.raises(ServiceError) as err:
        toy.start(timeout_s=1.0)
    assert "Toy did not write its ready file within 1s" in str(err.value)
    assert "still loading" in str(err.value)
    assert not pid_alive(int((tmp_path / "me.pid").read_text())), "the timed-out service was stopped"
    assert toy.pid is None and not toy.pid_file.exists()
