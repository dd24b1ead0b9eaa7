"""Measuring one job: wall time, CPU time and peak memory of its whole process tree.

A job is a child process (``spark-submit`` and the JVM and Python processes it starts,
or a peer engine's script), or a call this process makes into a long-lived server (the
warm Spark Connect runs: ``run_in_server``). While it runs, a thread sums the resident set size of the
process and all its descendants every 100 ms and keeps the maximum. CPU time comes from
``getrusage(RUSAGE_CHILDREN)`` around the wait, which covers every descendant its parent
waited for (the JVM waits for the Python driver).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class JobResult:
    """What one measured job cost."""

    name: str
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    returncode: int
    log_file: str

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


class TreeSampler(threading.Thread):
    """Samples the RSS of a process tree until stopped; ``peak`` is the largest sum seen (bytes)."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self.samples = 0
        self._stop_event = threading.Event()

    def _tree_rss(self) -> int:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue  # exited between the listing and the reading
        return total

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, self._tree_rss())
            self.samples += 1
            self._stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def run_measured(
    name: str, cmd: list[str], log_file: Path, env: dict[str, str] | None = None, timeout_s: float = 1800
) -> JobResult:
    """Run ``cmd`` to completion, measuring it; its output goes to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with open(log_file, "wb") as out:
        # A session of its own, so a timeout stops the whole tree (by its process group).
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.error("%s exceeded %.0f s; stopping process group %d", name, timeout_s, proc.pid)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
        except BaseException:
            # Interrupted (Ctrl-C, or a SIGTERM the benchmark turns into SystemExit): the job runs in a
            # session of its own, which neither signal reaches, so stop its process group here.
            log.error("%s interrupted; stopping process group %d", name, proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
        finally:
            sampler.stop()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = JobResult(name, wall, cpu, sampler.peak / 2**20, rc, str(log_file))
    log.info("%s: %.1f s wall, %.1f s CPU, peak %.0f MB, exit %d", name, wall, cpu, result.peak_rss_mb, rc)
    return result


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process and its live descendants (0 if it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue  # exited between the listing and the reading
        total += t.user + t.system
    return total


def run_in_server(name: str, call: Callable[[], T], server_pid: int, log_file: str) -> tuple[JobResult, T]:
    """Run ``call`` (a job this process drives in a long-lived server, e.g. over Spark Connect), measuring it.

    Wall time is the call's. CPU time is this process's (the client) plus the server's process
    tree's during the call; peak memory is the server tree's largest RSS during the call (the
    whole server's, heap held from earlier jobs included: not comparable with a spark-submit
    job's). An exception propagates: a failed job fails the benchmark, as a non-zero exit does.
    """
    before_self = resource.getrusage(resource.RUSAGE_SELF)
    before_server = tree_cpu_s(server_pid)
    sampler = TreeSampler(server_pid)
    sampler.start()
    start = time.monotonic()
    try:
        value = call()
    finally:
        wall = time.monotonic() - start
        sampler.stop()
    after_self = resource.getrusage(resource.RUSAGE_SELF)
    client = (after_self.ru_utime - before_self.ru_utime) + (after_self.ru_stime - before_self.ru_stime)
    cpu = client + max(0.0, tree_cpu_s(server_pid) - before_server)
    result = JobResult(name, wall, cpu, sampler.peak / 2**20, 0, log_file)
    log.info("%s: %.1f s wall, %.1f s CPU (client + server), server peak %.0f MB", name, wall, cpu, result.peak_rss_mb)
    return result, value


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self) -> Stopwatch:
        self._start = time.monotonic()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self._start


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While the block runs, a SIGTERM (a timeout, a stopped CI job, ``kill``) unwinds like Ctrl-C.

    Python's default for SIGTERM ends the process at once, so no ``finally`` runs: the metastore, the
    Spark Connect server and a running compaction (a session of its own, see :func:`run_measured`) would
    be left behind. Raised as ``SystemExit(128 + 15)`` instead, the benchmark's ``finally`` blocks stop them
    and it exits with the shell's code for a process ended by SIGTERM.
    """

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_logging() -> None:
    """The benchmarks' log format, on stderr (their one-line summaries go to stdout)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)


def write_result(path: str | os.PathLike[str], result: dict[str, Any]) -> Path:
    """Write one benchmark's result as JSON (creating its directory); return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return out
