"""What a compaction did and how fresh the table is, as numbers: in the commit record and Airflow's metrics.

:func:`commit_metrics` computes a commit's numbers when ``publish`` makes it (``Commit.metrics``):
the job's counts (events in and out, rejected, superseded, tombstones, ties broken by file/row
order, late events), how old the newest source data is (freshness lag) and how long ago the
newest increment landed (landing lag), and how long each step took, from the times the plan,
the job, validate and publish recorded.  :func:`emit` sends them to Airflow's metrics
(``Stats``: StatsD, Datadog or OpenTelemetry, as ``[metrics]`` configures it) with the tags
``database`` and ``table``.  Metrics are a side channel: a failure to emit is logged and
counted, never fatal (README, "Metrics and SLOs").

:func:`table_metrics` is what other code (the ``status`` command) shows for one table: its
latest commit's numbers and the freshness against its SLO now.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.sidechannel import count_failure
from cdc_compaction.pipeline.slo import data_time, increment_end, parse_time, status

log = logging.getLogger(__name__)

#: Every metric's name starts with this.
PREFIX = "cdc_compaction"
#: The job's numbers: ``Commit.metrics`` key -> the job's stats key it comes from.
COUNTS: dict[str, str] = {
    "events_in": "increment_rows",
    "events_out": "output_rows",
    "visible_rows": "output_visible_rows",
    "rejected": "rejected_rows",
    "superseded": "superseded_rows",
    "tombstones": "output_tombstones",
    "expired_tombstones": "expired_tombstones",
    "ties": "tied_winners",
    "late_events": "late_events",
}
#: Of :data:`COUNTS`, the levels: how many rows the table holds after the commit, not how many the
#: commit handled.  Gauges: a StatsD counter would add each commit's total to the last one's
#: (a sum of table sizes, meaningless), and rates of them would read as rows per second.
LEVELS = ("events_out", "visible_rows", "tombstones")
#: Gauges: the lags, in seconds.
LAGS = ("freshness_lag_seconds", "landing_lag_seconds")
#: The steps whose durations a commit records: each from the previous one's recorded time.
STEPS = ("compact", "validate", "publish")
#: Metrics that could not be emitted in this process, by table.
EMIT_FAILURES: Counter[str] = Counter()
EMIT_FAILED_METRIC = f"{PREFIX}.metrics_emit_failed"


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    return (later - earlier).total_seconds() if later is not None and earlier is not None else None


def commit_metrics(
    cfg: TableConfig,
    commit: Commit,
    *,
    planned_at: str | None,
    validated_at: str | None,
    landed: list[str] | None = None,
) -> dict[str, Any]:
    """A commit's numbers (``Commit.metrics``), at its ``committed_at``.

    ``landed`` are the increments that had landed and were not compacted yet when it was made
    (with the commit's own, the newest of them gives the landing lag).  Counts the job did not
    report (stats of an older job) are left out, never 0.
    """
    now = parse_time(commit.committed_at)
    stats = commit.stats or {}
    counts = {name: int(stats[key]) for name, key in COUNTS.items() if stats.get(key) is not None}
    newest_landed = max([*commit.increments, *(landed or [])], default="")
    landed_end = increment_end(cfg, newest_landed)
    lags = {
        # An increment of the current hour ends in the future: it has landed no later than now.
        "freshness_lag_seconds": _seconds(now, data_time(cfg, commit.freshness)),
        "landing_lag_seconds": max(0.0, _seconds(now, landed_end) or 0.0) if landed_end else None,
    }
    times = [parse_time(planned_at), parse_time(str(stats.get("finished_at", ""))), parse_time(validated_at), now]
    steps = {step: _seconds(times[i + 1], times[i]) for i, step in enumerate(STEPS)}
    return {
        **counts,
        **{k: v for k, v in lags.items() if v is not None},
        "newest_landed_increment": newest_landed,
        "step_seconds": {k: v for k, v in steps.items() if v is not None},
    }


def tags(cfg: TableConfig) -> dict[str, str]:
    return {"database": cfg.database, "table": cfg.table}


def emit(cfg: TableConfig, metrics: Mapping[str, Any], slo: Mapping[str, Any] | None = None) -> bool:
    """Send a commit's numbers (and the SLO status) to Airflow's metrics; True if all went out.

    What the commit handled (events in, rejected, ...) are counters (``cdc_compaction.<name>``);
    what the table holds after it (:data:`LEVELS`), the lags and the SLO compliance are gauges;
    step durations timers (``cdc_compaction.step_duration`` tagged ``step``). Never raises.
    """
    try:
        from airflow.sdk.observability.stats import Stats

        t = tags(cfg)
        for name in COUNTS:
            if metrics.get(name) is None:
                continue
            if name in LEVELS:
                Stats.gauge(f"{PREFIX}.{name}", float(metrics[name]), tags=t)
            else:
                Stats.incr(f"{PREFIX}.{name}", count=int(metrics[name]), tags=t)
        for name in LAGS:
            if metrics.get(name) is not None:
                Stats.gauge(f"{PREFIX}.{name}", float(metrics[name]), tags=t)
        for step, seconds in (metrics.get("step_seconds") or {}).items():
            Stats.timing(f"{PREFIX}.step_duration", timedelta(seconds=float(seconds)), tags={**t, "step": step})
        if slo is not None and slo.get("compliance") is not None:
            Stats.gauge(f"{PREFIX}.slo_compliance", float(slo["compliance"]), tags=t)
            Stats.gauge(f"{PREFIX}.slo_breached", 1.0 if slo.get("breached") else 0.0, tags=t)
        return True
    except Exception:
        log.exception("%s: could not emit the metrics %s; publishing goes on", cfg.qualified_name, dict(metrics))
        count_failure(EMIT_FAILURES, cfg.qualified_name, EMIT_FAILED_METRIC, tags(cfg))
        return False


#: Counter of runs whose plan did not compact (``compaction.policy: threshold``; README, "Compaction policy").
SKIPPED_METRIC = f"{PREFIX}.compactions_skipped"


def count_skipped(cfg: TableConfig) -> bool:
    """Count a run that planned no compaction (``cdc_compaction.compactions_skipped``); never raises."""
    try:
        from airflow.sdk.observability.stats import Stats

        Stats.incr(SKIPPED_METRIC, tags=tags(cfg))
        return True
    except Exception:  # a side channel: the plan stands whatever the metrics back end does
        log.exception("%s: could not count the skipped compaction; the run goes on", cfg.qualified_name)
        count_failure(EMIT_FAILURES, cfg.qualified_name, EMIT_FAILED_METRIC, tags(cfg))
        return False


def table_metrics(cfg: TableConfig, lake: Lake | None = None, now: datetime | None = None) -> dict[str, Any]:
    """One table's numbers for people (the ``status`` command): its latest commit's and its SLO's now.

    ``{"table", "commit", "committed_at", "metrics": Commit.metrics or {}, "freshness": Commit.freshness
    or {}, "slo": slo.SloStatus as a dict}``; reads the commit records, nothing else.
    """
    from cdc_compaction.pipeline.runtime import utcnow

    lake = lake or Lake(cfg)
    now = now or utcnow()
    latest = lake.latest_commit()
    return {
        "table": cfg.qualified_name,
        "commit": latest.seq,
        "committed_at": latest.committed_at,
        "metrics": latest.metrics or {},
        "freshness": latest.freshness or {},
        "slo": status(cfg, lake, now).to_dict(),
    }
