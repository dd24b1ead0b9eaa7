"""Where each table stands: live version, last commit, freshness, pending hours, quarantine, lease, paused.

Everything comes from what the runs leave behind -- the registry, the commit records, the
landing area, the quarantine manifests and the lease files -- plus Airflow's ``dag.is_paused``
when a metadata database is reachable ("unknown" otherwise).  Nothing here writes: the
``status`` command and the Airflow UI page (``cdc_compaction.airflow_plugin``) only read, so they
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

from cdc_compaction import settings
from cdc_compaction.exceptions import CdcCompactionError
from cdc_compaction.lake import Commit, Lake, TableLease
from cdc_compaction.landing import increment_hour, scan_landing
from cdc_compaction.quarantine import Quarantine
from cdc_compaction.registry import TableConfig

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


@dataclass
class CommitSummary:
    """One commit record as people read it."""

    seq: int
    version: str
    committed_at: str
    #: Visible rows of the version (the job's ``output_visible_rows``), None if not recorded.
    rows: int | None
    #: Change rows the commit compacted.
    increment_rows: int | None
    increments: list[str]
    event_time: str
    increment: str
    #: committed_at minus the newest source event time it holds: the freshness the commit gave.
    lag_seconds: float | None

    @classmethod
    def of(cls, commit: Commit) -> CommitSummary:
        f = commit.freshness or {}
        stats = commit.stats or {}
        committed, event = parse_time(commit.committed_at), parse_time(f.get("event_time"))
        rows = stats.get("output_visible_rows", stats.get("output_rows"))
        return cls(
            seq=commit.seq,
            version=commit.version,
            committed_at=commit.committed_at,
            rows=int(rows) if rows is not None else None,
            increment_rows=int(stats["increment_rows"]) if "increment_rows" in stats else None,
            increments=list(commit.increments),
            event_time=f.get("event_time", ""),
            increment=f.get("increment", ""),
            lag_seconds=(committed - event).total_seconds() if committed and event else None,
        )


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
    #: ``compaction.policy`` and, under ``threshold``, each threshold against what is pending now
    #: (``policy.Decision.to_dict``: value, limit, reached, progress; README, "Compaction policy").
    compaction: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def paused_text(self) -> str:
        return "unknown" if self.paused is None else ("paused" if self.paused else "enabled")

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
        if self.error:
            return f"{self.table:<28} ERROR {self.error}"
        c = self.last_commit
        commit = (
            f"commit {c.seq} {c.committed_at[:19]} rows {c.rows if c.rows is not None else '?'}"
            if c is not None and c.seq
            else "no commit"
        )
        return (
            f"{self.table:<28} {self.live_version:<34} {commit:<40} fresh {self.freshness_text:<24} "
            f"pending {len(self.pending)}h  compaction {self.compaction_text}  "
            f"quarantine {self.quarantine_waiting} waiting  lease {self.lease}  {self.paused_text}"
        )

    @property
    def compaction_text(self) -> str:
        """``always``, or ``threshold`` with each threshold as value/limit (``pending_files 12/48``)."""
        from cdc_compaction.policy import Measure, describe

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


def table_status(cfg: TableConfig, now: datetime, paused: dict[str, bool] | None = None) -> TableStatus:
    """Read one table's status; a lake that cannot be read gives a status with ``error`` set."""
    st = TableStatus(table=cfg.qualified_name, dag_id=cfg.dag_id)
    if paused is not None:
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
            from cdc_compaction.slo import status as slo_status

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
    from cdc_compaction.pipeline.pending import pending_files
    from cdc_compaction.pipeline.plan import pending_load
    from cdc_compaction.pipeline.runtime import Runtime
    from cdc_compaction.policy import decide
    from cdc_compaction.settings import MetastoreEndpoint

    # Listing and footers only: the runtime's metastore and engine are never used here.
    rt = Runtime(cfg=cfg, lake=lake, metastore=MetastoreEndpoint(), engine=None)  # type: ignore[arg-type]
    pending = pending_files(rt, now, {f"{f['increment']}/{f['name']}" for f in latest.files})
    decision = decide(rt.cfg.compaction, pending_load(rt.cfg, latest, pending.files), now)
    out = decision.to_dict()
    if not pending.files:
        out["reason"] = "nothing pending"
    return out


def commit_history(cfg: TableConfig, limit: int = 200) -> list[CommitSummary]:
    """The newest ``limit`` commits of a table, oldest first."""
    lake = Lake(cfg)
    out = []
    for seq in lake.commit_seqs()[-limit:]:
        commit = lake.read_commit(seq)
        if commit is not None:
            out.append(CommitSummary.of(commit))
    return out


def metadata_conn() -> str:
    """The SQLAlchemy URL of Airflow's metadata database, found without importing Airflow.

    ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``; else ``[database] sql_alchemy_conn`` of
    ``$AIRFLOW_HOME/airflow.cfg`` (``~/airflow``), or that home's SQLite default; else the
    embedded default's ``.airflow/airflow.db`` (``make airflow-ui``); else "" (unknown).
    Importing Airflow's configuration would write an ``airflow.cfg`` where none is: a
    read-only command must not.
    """
    conn = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    if conn:
        return conn
    home = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser()
    cfg_file = home / "airflow.cfg"
    if cfg_file.exists():
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(cfg_file)
        except configparser.Error as exc:
            log.info("%s is unreadable (%s): paused flags are unknown", cfg_file, exc)
            return ""
        return parser.get("database", "sql_alchemy_conn", fallback="") or f"sqlite:///{home}/airflow.db"
    local = settings.PROJECT_ROOT / ".airflow" / "airflow.db"
    return f"sqlite:///{local}" if local.exists() else ""


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
    """The status of every table in ``configs``, with Airflow's paused flags when reachable."""
    now = now or datetime.now(UTC)
    paused = airflow_paused(conn)
    return [table_status(cfg, now, paused) for cfg in configs]


def to_json(items: list[TableStatus]) -> str:
    return json.dumps([s.to_dict() for s in items], indent=1, sort_keys=True)
