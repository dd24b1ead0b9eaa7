"""Freshness objectives (registry ``slo:``): how fresh a table's base was over a window, and alerts.

A table's *freshness lag* at a moment is how old the newest source data its base holds is:
``now - data time``, where the data time of a commit is the newest source event time it
recorded (``Commit.freshness['event_time']``), or, for tables without an event time column,
the end of the hour of the newest increment it compacted.  Between commits the base holds
what the last commit made live, so the lag grows by the clock until the next commit.

:func:`evaluate` is a pure function of the registry entry, the commit history (as
:class:`FreshnessPoint`) and the clock: the fraction of the window (from the first commit
on, if the table is younger) during which the lag was within ``slo.freshness``.  A source
that stops writing makes the lag grow too: freshness is measured against the clock.

:func:`check` reads the history from the commit records, evaluates it and alerts through
:mod:`cdc_compaction.integrations.notifications` once when the compliance falls below ``slo.target``
and once when it recovers; ``_cdc/slo.json`` remembers which state was last alerted, and
the points of the window's commit records (records are never rewritten, so each is read once).
``publish`` and the view refresher call it as a side channel: a failure is logged and
counted, never fatal (README, "Metrics and SLOs").
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.landing import increment_hour
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.sidechannel import count_failure

log = logging.getLogger(__name__)

#: How long one increment's data spans: its name is the hour it starts.
INCREMENT_SPAN = timedelta(hours=1)
#: The file in the table's ``_cdc/`` that remembers the last alerted SLO state.
STATE_FILE = "slo.json"


def parse_time(value: str | None) -> datetime | None:
    """An ISO timestamp as an aware UTC datetime (naive ones are UTC); None for "" or None."""
    if not value:
        return None
    t = datetime.fromisoformat(value)
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def increment_end(cfg: TableConfig, name: str | None) -> datetime | None:
    """When the increment ``name`` (``increment_YYYYMMDDHH``) ends: its data is complete up to then."""
    hour = increment_hour(cfg, name) if name else None
    return hour + INCREMENT_SPAN if hour is not None else None


def data_time(cfg: TableConfig, freshness: Mapping[str, str] | None) -> datetime | None:
    """The newest source data a commit's base holds: its event time, else its newest increment's end."""
    f = freshness or {}
    return parse_time(f.get("event_time")) or increment_end(cfg, f.get("increment"))


@dataclass(frozen=True)
class FreshnessPoint:
    """From ``at`` on (until the next point) the base held source data up to ``data_time``."""

    at: datetime
    data_time: datetime | None


def point_of(cfg: TableConfig, commit: Commit) -> FreshnessPoint | None:
    """The freshness a commit made live, when it was committed (None for genesis or an undated record)."""
    at = parse_time(commit.committed_at)
    return FreshnessPoint(at, data_time(cfg, commit.freshness)) if at is not None and commit.seq > 0 else None


def history(
    cfg: TableConfig, lake: Lake, since: datetime, known: Mapping[int, FreshnessPoint] | None = None
) -> list[FreshnessPoint]:
    """The freshness points from the commit records: every one after ``since``, plus the last before it.

    Reads the records newest first and stops at the first one committed at or before ``since``
    (what the base held when the window began).  ``known`` are points of records read before, by
    seq: a commit record is never rewritten, so they are not read again.
    """
    return sorted(_points(cfg, lake, since, known or {}).values(), key=lambda p: p.at)


def _points(
    cfg: TableConfig, lake: Lake, since: datetime, known: Mapping[int, FreshnessPoint]
) -> dict[int, FreshnessPoint]:
    points: dict[int, FreshnessPoint] = {}
    for seq in reversed(lake.commit_seqs()):
        point = known.get(seq)
        if point is None:
            commit = lake.read_commit(seq)
            point = point_of(cfg, commit) if commit is not None else None
        if point is None:
            continue
        points[seq] = point
        if point.at <= since:
            break
    return points


def _dump_points(points: Mapping[int, FreshnessPoint]) -> dict[str, list[str | None]]:
    return {str(seq): [p.at.isoformat(), p.data_time.isoformat() if p.data_time else None] for seq, p in points.items()}


def _load_points(doc: Any) -> dict[int, FreshnessPoint]:
    """The points cached in the state file; whatever is malformed is read again from the records."""
    out: dict[int, FreshnessPoint] = {}
    for seq, value in (doc or {}).items() if isinstance(doc, dict) else ():
        try:
            at = parse_time(value[0])
            if at is not None:
                out[int(seq)] = FreshnessPoint(at, parse_time(value[1]))
        except (TypeError, ValueError, IndexError):
            continue
    return out


@dataclass(frozen=True)
class SloStatus:
    """How a table did against its freshness objective at ``now`` (seconds; None where unknown)."""

    table: str
    now: str
    #: The lag now (``now - data time`` of the live commit); None before the first commit.
    lag_seconds: float | None
    #: The registry's objective; all None for a table without ``slo:``.
    freshness_seconds: float | None
    target: float | None
    window_seconds: float | None
    #: The part of the window measured (from the first commit on) and the part of it within the bound.
    measured_seconds: float
    compliant_seconds: float
    #: compliant / measured; None when nothing was measured.
    compliance: float | None
    #: The lag now is within ``slo.freshness``.
    within: bool | None
    #: compliance < target.
    breached: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sec(d: timedelta) -> float:
    return d.total_seconds()


def evaluate(cfg: TableConfig, points: Iterable[FreshnessPoint], now: datetime) -> SloStatus:
    """The table's freshness against ``cfg.slo`` over the window ending at ``now`` (a pure function).

    Each point holds from its ``at`` until the next point's (the last until ``now``); during it
    the lag is within the bound until ``data_time + slo.freshness``.  Time before the first
    point is not measured: a new table is not in breach for the days before it existed.
    """
    pts = sorted((p for p in points if p.at <= now), key=lambda p: p.at)
    live = pts[-1] if pts else None
    lag = _sec(now - live.data_time) if live is not None and live.data_time is not None else None
    slo = cfg.slo
    if slo is None:
        return SloStatus(cfg.qualified_name, now.isoformat(), lag, None, None, None, 0.0, 0.0, None, None, False)
    start = now - slo.window
    measured = compliant = timedelta(0)
    for i, p in enumerate(pts):
        lo = max(p.at, start)
        hi = pts[i + 1].at if i + 1 < len(pts) else now
        if hi <= lo:
            continue
        measured += hi - lo
        if p.data_time is not None:
            # Within the bound from lo until the data gets older than slo.freshness.
            compliant += max(timedelta(0), min(hi, p.data_time + slo.freshness) - lo)
    compliance = compliant / measured if measured > timedelta(0) else None
    within = lag is not None and lag <= _sec(slo.freshness) if live is not None else None
    return SloStatus(
        table=cfg.qualified_name,
        now=now.isoformat(),
        lag_seconds=lag,
        freshness_seconds=_sec(slo.freshness),
        target=slo.target,
        window_seconds=_sec(slo.window),
        measured_seconds=_sec(measured),
        compliant_seconds=_sec(compliant),
        compliance=compliance,
        within=within,
        breached=compliance is not None and compliance < slo.target,
    )


def status(cfg: TableConfig, lake: Lake, now: datetime) -> SloStatus:
    """:func:`evaluate` over the table's commit records (using the points ``_cdc/slo.json`` caches)."""
    window = cfg.slo.window if cfg.slo is not None else timedelta(0)
    known = _load_points(read_state(lake).get("points"))
    return evaluate(cfg, history(cfg, lake, now - window, known), now)


def state_path(lake: Lake) -> str:
    return posixpath.join(lake.layout.control, STATE_FILE)


def read_state(lake: Lake) -> dict[str, Any]:
    """The last alerted state (``{"breached": bool, "since": iso}``); empty if none or unreadable."""
    path = state_path(lake)
    try:
        if lake.storage.exists(path):
            doc = json.loads(lake.storage.read_text(path))
            return doc if isinstance(doc, dict) else {}
    except ValueError:
        log.warning("%s: %s is unreadable; it is rewritten", lake.cfg.qualified_name, path, exc_info=True)
    return {}


def check(cfg: TableConfig, lake: Lake, now: datetime) -> dict[str, Any]:
    """Evaluate the table's SLO and alert once per change: when it breaches, and when it recovers.

    Returns the status (and ``alerted``: "breached", "recovered" or None).  A table without
    ``slo:`` is not evaluated.
    """
    if cfg.slo is None:
        return {"table": cfg.qualified_name, "slo": None, "alerted": None}
    state = read_state(lake)
    known = _load_points(state.get("points"))
    points = _points(cfg, lake, now - cfg.slo.window, known)
    st = evaluate(cfg, points.values(), now)
    was = bool(state.get("breached", False))
    alerted: str | None = None
    if st.breached != was:
        from cdc_compaction.integrations.notifications import AlertChannels, alert_slo

        alerted = "breached" if st.breached else "recovered"
        # Every channel of the registry's alerts: (e-mail, Slack, SNS), each failing on its own.
        channels = AlertChannels.of(cfg.alerts)
        alert_slo(cfg.qualified_name, cfg.alerts.emails, cfg.alerts.smtp_conn_id, st.to_dict(), st.breached, channels)
        state = {"breached": st.breached, "since": now.isoformat(), "status": st.to_dict()}
    # Written after the alert (a crash between them alerts again rather than never), and only when
    # something changed: the view refresher checks every few minutes, mostly with no new commit.
    if alerted is not None or set(points) != set(known):
        state["points"] = _dump_points(points)
        lake.storage.write_text(state_path(lake), json.dumps(state, indent=1, sort_keys=True))
    return {**st.to_dict(), "alerted": alerted}


#: SLO checks that failed in this process, by table (also counted in Airflow's metrics).
CHECK_FAILURES: dict[str, int] = {}


def check_quietly(cfg: TableConfig, lake: Lake, now: datetime) -> dict[str, Any]:
    """:func:`check` as a side channel: a failure is logged and counted, and the caller goes on."""
    try:
        return check(cfg, lake, now)
    except Exception:
        log.exception("%s: could not check the freshness SLO; the task goes on", cfg.qualified_name)
        tags = {"database": cfg.database, "table": cfg.table}
        count_failure(CHECK_FAILURES, cfg.qualified_name, "cdc_compaction.slo_check_failed", tags)
        return {"table": cfg.qualified_name, "error": "the SLO check failed (see the task log)"}
