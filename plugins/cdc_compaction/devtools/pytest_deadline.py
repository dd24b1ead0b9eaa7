"""A pytest plugin: after a deadline, tests not yet started are skipped and counted; none is cut short.

``.ci/run`` gives the extended tier (``make test-extended``) whatever time CI has left after ``make
test``.  CI ends a job at a fixed time, and a killed job reports nothing: not the tests that passed, not
one that failed.  With ``CDC_TEST_DEADLINE`` set (seconds since the epoch, a whole number), each test
that would start at or after it is skipped instead, so the tests that ran keep their verdicts, a running
test finishes and tears its fixtures down, and the run ends with a line naming how many tests it did not
run and when the deadline was.  Unset or empty, the plugin does nothing.

Installed from ``tests/conftest.py`` (``pytest_plugins``); with pytest-xdist each worker skips by the
same clock and the controller counts the skips in its summary.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import Any

import pytest

ENV = "CDC_TEST_DEADLINE"
#: The start of every skip reason the plugin gives: the summary counts the skips by it.
REASON = "not run: the deadline"


class DeadlineError(ValueError):
    """``CDC_TEST_DEADLINE`` is set to something that is not a whole number of seconds since the epoch."""


def deadline_from_env(environ: dict[str, str] | None = None) -> float | None:
    """The deadline ``CDC_TEST_DEADLINE`` sets (seconds since the epoch), or None when it is unset or empty."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return None
    try:
        return float(int(raw))
    except ValueError:
        raise DeadlineError(
            f"{ENV}={raw!r} is not a whole number of seconds since the epoch: set it to e.g. "
            f"$(( $(date +%s) + 1800 )) for 30 minutes from now, or unset it"
        ) from None


def _shown(deadline: float) -> str:
    return datetime.fromtimestamp(deadline, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pytest_configure(config: Any) -> None:
    """Read the deadline once, refusing a malformed one before any test runs."""
    try:
        config._cdc_deadline = deadline_from_env()
    except DeadlineError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test that would start at or after the deadline (before any of its fixtures is set up)."""
    deadline = getattr(item.config, "_cdc_deadline", None)
    if deadline is not None and time.time() >= deadline:
        pytest.skip(f"{REASON} ({ENV}) passed at {_shown(deadline)}; run it with make test-extended")


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """Say how many tests the deadline left unrun (in the controller, which has every worker's reports)."""
    unrun = [
        r
        for r in terminalreporter.stats.get("skipped", [])
        if isinstance(getattr(r, "longrepr", None), tuple) and REASON in str(r.longrepr[2])
    ]
    if unrun:
        deadline = getattr(config, "_cdc_deadline", None)
        when = _shown(deadline) if deadline is not None else "its deadline"
        terminalreporter.write_line(
            f"{len(unrun)} test(s) not run: {ENV} passed at {when} "
            "(the tests that ran keep their verdicts; make test-extended runs them all)",
            yellow=True,
            bold=True,
        )
