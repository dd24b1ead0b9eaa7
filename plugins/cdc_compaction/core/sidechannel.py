"""Counting a side channel's failure (an alert, a metric, lineage, a view refresh) without deciding data.

Every side channel that fails is logged by its caller and counted twice: in a per-process counter
the caller owns (tests and the CLI read it) and in Airflow's metrics (``cdc_compaction.<what>_failed``).
Counting must not fail the task either, so :func:`count_failure` never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping

log = logging.getLogger(__name__)


def count_failure(counter: MutableMapping[str, int], key: str, metric: str, tags: Mapping[str, str]) -> None:
    """Add one to ``counter[key]`` and to Airflow's counter ``metric`` with ``tags``; never raises."""
    counter[key] = counter.get(key, 0) + 1
    try:
        from airflow.sdk.observability.stats import Stats

        Stats.incr(metric, tags=dict(tags))
    except Exception:  # a metrics back end that fails must not fail the task either
        log.warning("could not count %s in Airflow's metrics", metric, exc_info=True)
