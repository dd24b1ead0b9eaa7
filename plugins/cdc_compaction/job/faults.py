"""Named fault points ("failpoints") for crash testing, inert unless armed.

Every step boundary of the commit protocol calls :func:`fault_point` with a stable
name.  In production ``CDC_FAULTS`` is unset and the call is one environment lookup.
The crash-test suite arms a point to prove that a crash exactly there loses nothing
and applies nothing twice -- the way Iceberg, Delta and Hadoop's committers are tested::

    CDC_FAULTS="publish.after_commit_record=kill"          # SIGKILL this process there
    CDC_FAULTS="archive.after_first_delete@shop.orders=raise"   # only for that table
    CDC_FAULTS_ONCE_DIR=/tmp/x                             # fire each point once (then retries pass)
    CDC_FAULTS="compact.after_data=pause"                  # wait there until <ONCE_DIR>/<point>@<table>.release
                                                           # exists (a test crashes something else meanwhile)

One implementation for both sides: the Airflow tasks and the Spark job
(:mod:`cdc_compaction.job.compact`, which ships to the cluster in the job package) call
the same :func:`fault_point`, so it imports nothing outside ``cdc_compaction.job``.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

ENV = "CDC_FAULTS"
ONCE_ENV = "CDC_FAULTS_ONCE_DIR"
ACTIONS = ("raise", "kill", "pause")
#: How long a ``pause`` waits for its release file at most (then the run goes on).
PAUSE_MAX_S = 300.0


class InjectedFaultError(RuntimeError):
    """Raised at a fault point armed through ``CDC_FAULTS`` (crash tests only).

    Defined here, not among the package's exceptions, because the Spark job raises it too and
    ships without them; a RuntimeError, as the job's own copy of the parser raised before.
    """


#: Every fault point of the package, in the order a run passes them (the last, the order of their tests).
POINTS = (
    "plan.after_plan_written",
    "compact.before_stats",
    "publish.before_commit_record",
    "publish.after_commit_record",
    "publish.after_metastore_swap",
    "publish.after_pointer",
    "cleanup.after_first_delete",
    "archive.after_first_copy",
    "archive.after_first_delete",
    "archive.before_marker",
    "refresh_view.after_partitions",
    "quarantine.after_first_reingested_file",
    "rebuild.after_first_step",
    "rollback.after_copy",
    "rollback.after_commit_record",
    "rollback.after_metastore_swap",
    "erase.after_first_rewrite",
    "erase.before_commit",
    "erase.after_commit_record",
    "erase.after_first_swap",
    "erase.before_audit",
    "formats.before_delta_commit",
    "formats.before_iceberg_commit",
    "compact.after_data",  # crashed by the Spark Connect test (the server killed mid-job), not a DAG run
)


def armed(name: str, table: str = "") -> str | None:
    """The action armed for ``name`` (and this table), or None."""
    spec = os.environ.get(ENV, "")
    if not spec:
        return None
    for item in spec.split(","):
        target, _, action = item.strip().partition("=")
        point, _, only_table = target.partition("@")
        if point == name and (not only_table or only_table == table) and action in ACTIONS:
            return action
    return None


def _first_time(name: str, table: str) -> bool:
    once = os.environ.get(ONCE_ENV)
    if not once:
        return True
    os.makedirs(once, exist_ok=True)
    try:
        fd = os.open(os.path.join(once, f"{name}@{table or 'any'}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _pause(name: str, table: str) -> None:
    """Wait until the test that armed the point creates ``<ONCE_DIR>/<point>@<table>.release``.

    The fired-once marker (``<point>@<table>`` in ``CDC_FAULTS_ONCE_DIR``) tells that test the run
    is here: it can crash another process (the Spark Connect server) at exactly this step.
    """
    import time

    once = os.environ.get(ONCE_ENV) or "."
    release = os.path.join(once, f"{name}@{table or 'any'}.release")
    deadline = time.monotonic() + PAUSE_MAX_S
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)


def fault_point(name: str, table: str = "") -> None:
    """Crash here if a test armed this point: raise, or SIGKILL the current process."""
    action = armed(name, table)
    if action is None or not _first_time(name, table):
        return
    log.error("fault injection: %s at %s (%s)", action, name, table or "any table")
    if action == "pause":
        _pause(name, table)
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFaultError(f"injected fault at {name} for {table or 'any table'} (CDC_FAULTS is set)")
