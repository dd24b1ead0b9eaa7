"""A pytest plugin: a SIGTERM unwinds the test session like Ctrl-C, so fixtures stop what they started.

Python's default for SIGTERM ends the process at once: no fixture's teardown runs, and the servers the
session fixtures started (PostgreSQL, the metastore, Kafka, Spark Connect), each in a process group of
its own so that stopping one never reaches the test run, keep running after a stopped CI job, a
``timeout`` or a ``kill`` of the run's process group.  Raised as :class:`KeyboardInterrupt` instead,
pytest stops the session and tears its fixtures down, stopping each server by its PID.  Not
:class:`SystemExit`: pytest counts that as a failure of the running test and goes on to the next.

Installed from ``tests/conftest.py`` (``pytest_plugins``); in every pytest-xdist worker too, where
the session runs in the worker's main thread.  A second SIGTERM during the unwinding is ignored: the
teardown is what stops the servers, and a caller that will not wait sends SIGKILL.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

_previous: Any = None


def _unwind(signum: int, frame: FrameType | None) -> None:
    # Once: the unwinding itself must not be cut short by the next SIGTERM.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM): stopping the test session and its fixtures' servers")


def pytest_configure(config: Any) -> None:
    """Turn SIGTERM into :class:`KeyboardInterrupt` for the session (main thread only: Python's rule)."""
    global _previous
    if threading.current_thread() is threading.main_thread():
        _previous = signal.signal(signal.SIGTERM, _unwind)


def pytest_unconfigure(config: Any) -> None:
    """Put back the handler the session found."""
    global _previous
    if _previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _previous)
        _previous = None
