"""Where each table stands: live version, last commit, freshness, pending hours, quarantine, lease, paused.

Everything comes from what the runs leave behind -- the registry, the commit records, the
landing area, the quarantine manifests and the lease files -- plus Airflow's ``dag.is_paused``
when a metadata database is reachable ("unknown" otherwise).  Nothing here writes: the
``status`` command and the Airflow UI page (``cdc_compaction.airflow.plugin``) only read, so they
are safe to run next to any run.

Freshness is ``now`` minus the newest source event time the live base holds (the commit
record's ``freshness.event_time``); when the source carries no event time, minus the end of
the newest increment hour compacted.  When a table's config has an ``slo`` attribute its
bound is shown beside it (see :func:`slo_bound` for the forms it understands).
"""

from __future__ import annotations

import configparser
import json
import logging
import os
import sqlite3
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cdc_compaction.core.exceptions import CdcCompactionError
from cdc_compaction.core.lake import Commit, Lake, TableLease, kept_seqs
from cdc_compaction.core.landing import increment_hour, scan_landing
from cdc_compaction.core.printable import printable
from cdc_compaction.core.registry import RegistryEntry, TableConfig
from cdc_compaction.operations.travel import rows_of, version_rows_now
from cdc_compaction.pipeline.quarantine import Quarantine

log = logging.getLogger(__name__)

#: How far back :func:`pending_increments` looks for commits whose increments are not archived yet.
_UNARCHIVED_LOOKBACK = 50
#: Errors reading one table's lake: reported on that table's line, the other tables still shown.
READ_ERRORS = (CdcCompactionError, OSError, ValueError, KeyError, TypeError)


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def format_age(seconds: float | None) -> str:
    """``3d4h``, ``2h05m``, ``7m``: short enough for one line per table."""
    if seconds is None:
        return "-"
    s = int(max(seconds, 0))
    d, rest = divmod(s, 86400)
    h, rest = divmod(rest, 3600)
    m = rest // 60
    if d:
        return f"{d}d{h}h"
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m"


def slo_bound(cfg: TableConfig) -> timedelta | None:
    """The freshness bound of the table's ``slo`` (README, "Metrics and SLOs"), or None without one."""
    return cfg.slo.freshness if cfg.slo is not None else None


#: The tables page computes a commit's change rows (when no ``<t>_changes`` file holds them) only
#: when its version and its parent's hold at most this many rows together: the pairing reads both
#: (through DuckDB on disk, in bounded memory, but in time a page load should not wait for).
CHANGE_ROWS_LIMIT = 200_000


@dataclass
class CommitSummary:
    """One commit record as people read it."""

    seq: int
    version: str
    committed_at: str
    #: Visible rows of the version, as ``versions`` counts them (its files' footers while it is kept,
    #: else its record); None if not recorded.
    rows: int | None
    #: Change rows the commit's run read from the landing area (0 for an erase, a rollback, a rebuild).
    increment_rows: int | None
    increments: list[str]
    event_time: str
    increment: str
    #: committed_at minus the newest source event time it holds: the freshness the commit gave.
    lag_seconds: float | None
    #: Rows of the commit's net change (``changes --from <parent> --to <seq>``); None if unknown.
    change_rows: int | None = None
    #: What made the commit when no run did: "erase: 1 row erased", "rollback to 3", "rebuild".
    note: str = ""

    @classmethod
    def of(cls, commit: Commit, change_rows: int | None = None, rows: int | None = None) -> CommitSummary:
        """``rows``: the version's rows counted now (``travel.version_rows_now``); default its record's."""
        f = commit.freshness or {}
        stats = commit.stats or {}
        committed, event = parse_time(commit.committed_at), parse_time(f.get("event_time"))
        # An erase's record keeps its parent's run counts; a rollback's or a rebuild's read no increment.
        landed = (
            0
            if stats.get("kind") == "erase" or commit.rollback or "rebuild" in stats
            else int(stats["increment_rows"])
            if "increment_rows" in stats
            else None
        )
        return cls(
            seq=commit.seq,
            version=commit.version,
            committed_at=commit.committed_at,
            rows=rows_of(commit) if rows is None else rows,
            increment_rows=landed,
            increments=list(commit.increments),
            event_time=f.get("event_time", ""),
            increment=f.get("increment", ""),
            lag_seconds=(committed - event).total_seconds() if committed and event else None,
            change_rows=change_rows,
            note=_note(commit),
        )


def _note(commit: Commit) -> str:
    stats = commit.stats or {}
    if stats.get("kind") == "erase":
        n = int(stats.get("rows_erased", 0))
        return f"erase: {n} row{'s' if n != 1 else ''} erased"
    if commit.rollback:
        return f"rollback to {commit.rollback.get('to_seq')}"
    if "rebuild" in stats:
        return "rebuild"
    return ""


def change_rows(lake: Lake, commit: Commit, kept: range) -> int | None:
    """Rows of ``commit``'s net change: its ``<t>_changes`` file's count, else paired from the kept
    versions as ``changes`` pairs them (when they are small enough, :data:`CHANGE_ROWS_LIMIT`); None
    when neither can say (a table without a primary key, a version retention deleted, a big one)."""
    from cdc_compaction.core.mode import mode_of

    if not mode_of(lake.cfg).has_change_feed or commit.seq == 0:
        return None
    from cdc_compaction.pipeline.changes import VersionDiff, feed_key, feed_path

    path = feed_path(lake, commit.seq)
    if lake.storage.exists(path):
        import pyarrow.parquet as pq

        with lake.storage.open_read(path) as f:
            return int(pq.ParquetFile(f).metadata.num_rows)
    parent = lake.read_commit(commit.parent_seq) if commit.parent_seq in kept else None
    if parent is None or commit.seq not in kept or commit.layout < 2 or (parent.seq and parent.layout < 2):
        return None
    sizes = [version_rows_now(lake, parent), version_rows_now(lake, commit)]
    if any(n is None for n in sizes) or sum(n or 0 for n in sizes) > CHANGE_ROWS_LIMIT:
        return None
    try:
        with VersionDiff(lake.cfg.qualified_name, feed_key(lake.cfg)) as d:
            d.load_parent_and_commit(lake, parent, commit)
            return d.count(d.changes_sql("before", "after", []))
    except (OSError, CdcCompactionError):  # a version retention deleted meanwhile: unknown, as not kept
        return None


@dataclass
class RunSummary:
    """A DAG's latest run as Airflow's metadata DB records it, with the task that failed in it."""

    run_id: str
    #: Airflow's DagRun state: queued, running, success, failed.
    state: str
    #: When it ended (else started, else is due), ISO UTC.
    when: str
    #: The task that failed (or waits for a retry) in it, "" if none.
    failed_task: str = ""
    #: That task's try number (Airflow counts from 1).
    try_number: int | None = None
    #: The first line of that task's error, from its task log; "" when the log is not on this machine.
    error: str = ""

    @property
    def text(self) -> str:
        out = f"{self.state} {self.when[:16].replace('T', ' ')}"
        if self.failed_task:
            out += f" {self.failed_task} try {self.try_number}"
            out += f": {self.error}" if self.error else " (error in the task log)"
        return out


@dataclass
class TableStatus:
    """One table's line of ``status``."""

    table: str
    dag_id: str
    live_version: str = ""
    last_commit: CommitSummary | None = None
    #: What freshness is measured from: "event_time", "increment" (no event times), or "" (nothing compacted).
    freshness_basis: str = ""
    freshness_seconds: float | None = None
    slo_seconds: float | None = None
    #: "ok", "late", or "" without an SLO (or without anything compacted).
    slo_state: str = ""
    #: The fraction of the SLO's window within the bound (``slo.status``, from the commit history) and its target.
    slo_compliance: float | None = None
    slo_target: float | None = None
    pending: list[str] = field(default_factory=list)
    quarantine_waiting: int = 0
    quarantine_entries: int = 0
    lease: str = "free"
    #: Airflow's paused flag; None when no metadata database was reachable or the DAG is not in it.
    paused: bool | None = None
    #: The DAG's latest run in Airflow's metadata DB (None: no run, or no metadata DB reachable).
    last_run: RunSummary | None = None
    #: When Airflow creates the DAG's next scheduled run (ISO, UTC); "" when none is scheduled or unknown.
    next_run: str = ""
    #: ``compaction.policy`` and, under ``threshold``, each threshold against what is pending now
    #: (``policy.Decision.to_dict``: value, limit, reached, progress; README, "Compaction policy").
    compaction: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def paused_text(self) -> str:
        # "active" (not "enabled"): registry ``enabled: false`` is another thing, and an unpaused DAG
        # of a disabled table is still shown as active here, as Airflow shows it.
        return "unknown" if self.paused is None else ("paused" if self.paused else "active")

    @property
    def freshness_label(self) -> str:
        """``fresh``/``stale`` against the SLO; ``age`` without one (nothing says what stale would be)."""
        return {"ok": "fresh", "late": "stale"}.get(self.slo_state, "age")

    @property
    def freshness_phrase(self) -> str:
        """``stale 3h17m slo 1h00m LATE ...``; ``never compacted`` alone (no verdict on nothing)."""
        if self.freshness_seconds is None:
            return self.freshness_text
        return f"{self.freshness_label} {self.freshness_text}"

    @property
    def last_run_text(self) -> str:
        return self.last_run.text if self.last_run is not None else "no run"

    @property
    def next_run_text(self) -> str:
        if self.paused is None:  # no metadata DB, or the DAG is not in it
            return "unknown"
        if self.paused:
            return "none (paused)"
        return f"{self.next_run[:16].replace('T', ' ')} UTC" if self.next_run else "none scheduled"

    @property
    def freshness_text(self) -> str:
        if self.freshness_seconds is None:
            return "never compacted"
        text = format_age(self.freshness_seconds)
        if self.freshness_basis == "increment":
            text += " (by increment)"
        if self.slo_seconds is not None:
            text += f" slo {format_age(self.slo_seconds)} {self.slo_state.upper()}"
        if self.slo_compliance is not None and self.slo_target is not None:
            text += f" {100 * self.slo_compliance:.1f}%/{100 * self.slo_target:g}%"
        return text

    def line(self) -> str:
        """The table's line of ``status``; what it holds from logs, the lake or the registry is shown, never
        obeyed by the terminal (control characters escaped)."""
        return printable(self._line())

    def _line(self) -> str:
        if self.error:
            return f"{self.table:<28} ERROR {self.error}  last run {self.last_run_text}"
        c = self.last_commit
        commit = (
            f"commit {c.seq} {c.committed_at[:19]} rows {c.rows if c.rows is not None else '?'}"
            if c is not None and c.seq
            else "no commit"
        )
        return (
            f"{self.table:<28} {self.live_version:<34} {commit:<40} {self.freshness_phrase:<30} "
            f"pending {len(self.pending)}h  compaction {self.compaction_text}  "
            f"quarantine {self.quarantine_waiting} waiting  lease {self.lease}  "
            f"last run {self.last_run_text}  next run {self.next_run_text}  {self.paused_text}"
        )

    @property
    def compaction_text(self) -> str:
        """``always``, or ``threshold`` with each threshold as value/limit (``pending_files 12/48``)."""
        from cdc_compaction.core.policy import Measure, describe

        c = self.compaction
        if not c.get("thresholds"):
            return str(c.get("policy", "?"))
        measures = [Measure(t["threshold"], t["value"], t["limit"], t["reached"]) for t in c["thresholds"]]
        due = " DUE" if any(m.reached for m in measures) else ""
        return f"{c['policy']}{due} (" + ", ".join(describe(m) for m in measures) + ")"


def pending_increments(cfg: TableConfig, lake: Lake, latest: Commit) -> list[str]:
    """Increments in the landing area that no commit holds yet (sorted).

    An increment stays in the landing area from its commit until ``archive`` moves it, so the
    increments of the commits not archived yet are left out: they are compacted, not pending.
    """
    landed, _ignored = scan_landing(cfg, lake.storage, lake.layout.incremental)
    committed: set[str] = set()
    commit: Commit | None = latest
    for _ in range(_UNARCHIVED_LOOKBACK):
        if commit is None or commit.seq == 0 or lake.is_archived(commit.seq):
            break
        committed.update(commit.increments)
        commit = lake.read_commit(commit.parent_seq)
    return sorted(set(landed) - committed)


def _freshness(cfg: TableConfig, commit: Commit, now: datetime) -> tuple[str, float | None]:
    f = commit.freshness or {}
    event = parse_time(f.get("event_time"))
    if event is not None:
        return "event_time", (now - event).total_seconds()
    # Without event times the newest increment compacted still bounds it: its hour has ended.
    newest = f.get("increment") or max(commit.increments, default="")
    hour = increment_hour(cfg, newest) if newest else None
    if hour is not None:
        return "increment", (now - (hour + timedelta(hours=1))).total_seconds()
    return "", None


def table_status(
    cfg: TableConfig, now: datetime, paused: dict[str, bool] | None = None, airflow: AirflowView | None = None
) -> TableStatus:
    """Read one table's status; a lake that cannot be read gives a status with ``error`` set.

    ``airflow`` (:func:`read_airflow`) adds the paused flag, the last run and the next one;
    ``paused`` alone the flag.
    """
    st = TableStatus(table=cfg.qualified_name, dag_id=cfg.dag_id)
    if airflow is not None:
        airflow.fill(st)
    elif paused is not None:
        st.paused = paused.get(cfg.dag_id)
    bound = slo_bound(cfg)
    st.slo_seconds = bound.total_seconds() if bound is not None else None
    try:
        lake = Lake(cfg)
        latest = lake.latest_commit()
        st.live_version = latest.version
        st.last_commit = CommitSummary.of(latest)
        if latest.seq:
            st.freshness_basis, st.freshness_seconds = _freshness(cfg, latest, now)
        if st.slo_seconds is not None and st.freshness_seconds is not None:
            st.slo_state = "ok" if st.freshness_seconds <= st.slo_seconds else "late"
        if cfg.slo is not None and latest.seq:
            from cdc_compaction.pipeline.slo import status as slo_status

            compliance = slo_status(cfg, lake, now)
            st.slo_compliance, st.slo_target = compliance.compliance, compliance.target
        st.pending = pending_increments(cfg, lake, latest)
        st.compaction = compaction_status(cfg, lake, latest, now)
        entries = Quarantine(lake).entries()
        st.quarantine_entries = len(entries)
        st.quarantine_waiting = sum(1 for e in entries if not e.reingested_at)
        held = TableLease(lake).current()
        if held is not None and not held.released and not held.expired(now):
            st.lease = f"held by {held.owner} until {held.expires_at[:19]}"
    except READ_ERRORS as exc:
        # One unreadable lake must not hide the other tables: the line says what and where.
        log.warning("%s: status unreadable: %s", cfg.qualified_name, exc)
        st.error = f"{type(exc).__name__}: {exc}"
    return st


def compaction_status(cfg: TableConfig, lake: Lake, latest: Commit, now: datetime) -> dict[str, Any]:
    """The table's ``compaction.policy`` and, under ``threshold``, how close each threshold is now.

    Measured as ``plan`` measures it (the pending files' footers, the live version's rows), so the
    next run compacts exactly when a threshold here is reached.
    """
    if cfg.compaction.policy != "threshold":
        return {"policy": cfg.compaction.policy}
    from cdc_compaction.core.policy import decide
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.pipeline.pending import in_place, pending_files, pending_load
    from cdc_compaction.pipeline.runtime import Runtime

    # Listing and footers only: the runtime's metastore and engine are never used here.
    rt = Runtime(cfg=cfg, lake=lake, metastore=MetastoreEndpoint(), engine=None)  # type: ignore[arg-type]
    pending = pending_files(rt, now, in_place(lake, latest))
    decision = decide(rt.cfg.compaction, pending_load(rt.cfg, latest, pending.files), now)
    out = decision.to_dict()
    if not pending.files:
        out["reason"] = "nothing pending"
    return out


def commit_history(cfg: TableConfig, limit: int = 200) -> list[CommitSummary]:
    """The newest ``limit`` commits of a table, oldest first."""
    lake = Lake(cfg)
    out = []
    seqs = lake.commit_seqs()[-limit:]
    kept = kept_seqs(seqs[-1], cfg.keep_versions) if seqs else range(0)
    for seq in seqs:
        commit = lake.read_commit(seq)
        if commit is not None:
            rows = version_rows_now(lake, commit) if seq in kept else None
            out.append(CommitSummary.of(commit, change_rows(lake, commit, kept), rows))
    return out


def metadata_conn() -> str:
    """The SQLAlchemy URL of Airflow's metadata database, found without importing Airflow; "" (unknown).

    The database of :func:`~cdc_compaction.operations.airflow_home.find_airflow`: the one every
    operations command uses (``$AIRFLOW_HOME``, ``~/airflow``, else this project's local UI).
    """
    from cdc_compaction.operations.airflow_home import find_airflow

    return find_airflow().conn


def airflow_paused(conn: str | None = None) -> dict[str, bool] | None:
    """dag_id -> is_paused from Airflow's metadata database; None when it is not reachable.

    Read-only: a SQLite file that does not exist is not created (it is "unknown", not empty).
    """
    conn = metadata_conn() if conn is None else conn
    query = "SELECT dag_id, is_paused FROM dag"
    try:
        if conn.startswith("sqlite:///"):
            path = conn.removeprefix("sqlite:///")
            if not os.path.exists(path):
                return None
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                rows = db.execute(query).fetchall()
        elif conn.startswith("postgresql"):
            rows = _postgres_rows(conn, query)
        else:
            return None
    except (sqlite3.Error, CdcCompactionError, OSError) as exc:
        log.info("Airflow's metadata database is not reachable (%s): paused flags are unknown", exc)
        return None
    return {str(d): bool(p) for d, p in rows}


@dataclass
class AirflowView:
    """What Airflow's metadata DB says about the DAGs: paused flags, latest runs, next runs (by dag_id)."""

    paused: dict[str, bool] = field(default_factory=dict)
    runs: dict[str, RunSummary] = field(default_factory=dict)
    next_runs: dict[str, str] = field(default_factory=dict)

    def fill(self, st: TableStatus) -> None:
        st.paused = self.paused.get(st.dag_id)
        st.last_run = self.runs.get(st.dag_id)
        st.next_run = self.next_runs.get(st.dag_id, "")


# The latest run of each DAG (the highest id: runs are numbered as they are created), and the
# task instances of those runs that failed or wait for a retry.  Plain SQL on Airflow's own
# tables (airflow.models.DagRun, TaskInstance): the same text runs on SQLite and PostgreSQL, and
# without importing Airflow (seconds, and it would write an airflow.cfg where none is).
_LATEST_RUNS = "SELECT MAX(id) FROM dag_run GROUP BY dag_id"
_RUNS_QUERY = f"SELECT dag_id, run_id, state, start_date, end_date, run_after FROM dag_run WHERE id IN ({_LATEST_RUNS})"
_FAILED_TASKS_QUERY = (
    "SELECT ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number, ti.state, ti.end_date "
    "FROM task_instance ti JOIN dag_run r ON r.dag_id = ti.dag_id AND r.run_id = ti.run_id "
    f"WHERE r.id IN ({_LATEST_RUNS}) AND ti.state IN ('failed', 'up_for_retry') ORDER BY ti.end_date"
)


def _iso(value: Any) -> str:
    """A metadata DB timestamp (a datetime from PostgreSQL, text from SQLite) as ISO UTC; "" for NULL."""
    if value is None:
        return ""
    t = value if isinstance(value, datetime) else parse_time(str(value).replace(" ", "T", 1))
    return t.astimezone(UTC).isoformat() if t is not None else str(value)


def read_metadata(conn: str, query: str) -> list[tuple[Any, ...]] | None:
    """Rows of ``query`` on the metadata DB; None when it is not there (a missing SQLite file is not created)."""
    if conn.startswith("sqlite:///"):
        path = conn.removeprefix("sqlite:///")
        if not os.path.exists(path):
            return None
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return db.execute(query).fetchall()
    if conn.startswith("postgresql"):
        return _postgres_rows(conn, query)
    return None


def read_airflow(conn: str | None = None, log_folder: str | None = None) -> AirflowView | None:
    """Paused flags, each DAG's latest run (with its failed task and error) and next run; None if unreachable.

    The error's first line comes from the failed try's task log under ``log_folder``
    (:func:`task_log_folder`): Airflow 3 keeps a task's exception in its log only, not in the DB.
    """
    conn = metadata_conn() if conn is None else conn
    try:
        dags = read_metadata(conn, "SELECT dag_id, is_paused FROM dag")
    except (sqlite3.Error, CdcCompactionError, OSError) as exc:
        log.info("Airflow's metadata database is not reachable (%s): paused flags and runs are unknown", exc)
        return None
    if dags is None:
        return None
    view = AirflowView(paused={str(d): bool(p) for d, p in dags})
    try:
        # Apart from the paused flags: a database without these (another Airflow version) still gives those.
        next_runs = read_metadata(conn, "SELECT dag_id, next_dagrun_create_after FROM dag") or []
        runs = read_metadata(conn, _RUNS_QUERY) or []
        failed = read_metadata(conn, _FAILED_TASKS_QUERY) or []
    except (sqlite3.Error, CdcCompactionError, OSError) as exc:
        log.info("Airflow's metadata database has no runs to read (%s): last and next runs are unknown", exc)
        return view
    for dag_id, next_after in next_runs:
        if next_after is not None:
            view.next_runs[str(dag_id)] = _iso(next_after)
    for dag_id, run_id, state, start, end, run_after in runs:
        when = _iso(end) or _iso(start) or _iso(run_after)
        view.runs[str(dag_id)] = RunSummary(run_id=str(run_id), state=str(state), when=when)
    folder = log_folder if log_folder is not None else task_log_folder()
    for dag_id, run_id, task_id, map_index, try_number, _state, _end in failed:
        run = view.runs.get(str(dag_id))
        if run is None or run.failed_task:  # the first task that failed is the cause; later ones follow it
            continue
        run.failed_task, run.try_number = str(task_id), int(try_number)
        path = task_log_path(folder, str(dag_id), str(run_id), str(task_id), int(map_index), int(try_number))
        run.error = first_error_line(path)
    return view


def task_log_folder() -> str:
    """Where task logs are: ``[logging] base_log_folder`` (env, else ``airflow.cfg``), else the home's ``logs``
    (the home of :func:`~cdc_compaction.operations.airflow_home.find_airflow`)."""
    folder = os.environ.get("AIRFLOW__LOGGING__BASE_LOG_FOLDER", "")
    if folder:
        return folder
    from cdc_compaction.operations.airflow_home import find_airflow

    home = find_airflow().home
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(home / "airflow.cfg")
    except configparser.Error as exc:
        log.info("%s is unreadable (%s): task logs are looked for under %s", home / "airflow.cfg", exc, home / "logs")
    return parser.get("logging", "base_log_folder", fallback="") or str(home / "logs")


def task_log_path(folder: str, dag_id: str, run_id: str, task_id: str, map_index: int, try_number: int) -> Path:
    """The task log file of one try, by Airflow's default ``[logging] log_filename_template``."""
    mapped = f"map_index={map_index}/" if map_index >= 0 else ""
    return Path(
        folder, f"dag_id={dag_id}", f"run_id={run_id}", f"task_id={task_id}", f"{mapped}attempt={try_number}.log"
    )


def first_error_line(path: Path) -> str:
    """The first line of the exception a task log records (Airflow 3's JSON log lines), "" if none is there,
    with its control characters escaped (:func:`~cdc_compaction.core.printable.printable`).

    The task runner logs "Task failed with exception" with ``error_detail``, a list of the
    exception chain (``exc_type``, ``exc_value``; structlog's, the raised one first); an error line without it
    gives its ``event``.
    """
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    found = ""
    for raw in lines:
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("level") not in ("error", "critical"):
            continue
        detail = rec.get("error_detail")
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            exc = detail[0]
            # Split at newlines only: a carriage return inside the first line is shown (escaped), not a cut.
            value = str(exc.get("exc_value", "")).strip().split("\n", 1)[0].rstrip("\r")
            found = f"{exc.get('exc_type', 'Error')}: {value}".rstrip(": ")
        elif not found:
            found = str(rec.get("event", "")).strip().split("\n", 1)[0].rstrip("\r")
    # Whatever raised wrote it: shown as text, never obeyed by the terminal status prints it on.
    return printable(found)


def registry_error_status(entry: RegistryEntry, view: AirflowView | None) -> TableStatus:
    """An invalid registry file as a status: its error, and its error DAG's paused flag and runs."""
    err = entry.error
    # Located (file:line:column, as `registry validate` prints them), the file named without its directory.
    prefix = f"{entry.path.parent}/"
    problems = "; ".join(p.removeprefix(prefix) for p in err.lines()) if err is not None else "(unknown error)"
    st = TableStatus(table=entry.path.name, dag_id=entry.dag_id, error=f"invalid registry entry: {problems}")
    if view is not None:
        view.fill(st)
    return st


def _postgres_rows(conn: str, query: str) -> list[tuple[Any, ...]]:
    import psycopg2

    try:
        # libpq takes the URL without SQLAlchemy's "+driver"; a dead server must not hang the status.
        pg = psycopg2.connect(conn.split("?")[0].replace("+psycopg2", "", 1), connect_timeout=3)
        try:
            with pg.cursor() as cur:
                cur.execute(query)
                return list(cur.fetchall())
        finally:
            pg.close()
    except psycopg2.Error as exc:
        raise CdcCompactionError(str(exc).strip()) from exc


def statuses(configs: list[TableConfig], now: datetime | None = None, conn: str | None = None) -> list[TableStatus]:
    """The status of every table in ``configs``, with Airflow's paused flags and runs when reachable."""
    now = now or datetime.now(UTC)
    view = read_airflow(conn)
    return [table_status(cfg, now, airflow=view) for cfg in configs]


def to_json(items: list[TableStatus]) -> str:
    return json.dumps([s.to_dict() for s in items], indent=1, sort_keys=True)
