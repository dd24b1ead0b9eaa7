"""PySpark compaction job's entry point: base + planned increments -> a new base version.

Part of the job package (``cdc_compaction.job``), which spark-submit ships to the cluster:
it imports nothing of the Airflow side.  Everything it needs arrives in the plan file
written by the DAG's ``plan`` task (:class:`~cdc_compaction.job.contract.Plan`), including
the compaction rule as SQL expressions rendered from ``include/sql/_rule.sql.j2`` -- the
same macros the view uses.  ``include/spark_jobs/compact.py`` is its entry script:

    spark-submit --py-files cdc_compaction_job-<hash>.zip include/spark_jobs/compact.py \\
        --plan /lake/t/_cdc/plans/<id>.json

This module holds what every table mode shares -- reading the plan, the already-committed and
skip checks, the permanent-error record -- and dispatches by the plan's mode to
``job/modes/<mode>.py``'s ``run_<mode>`` (found by name: a new mode's module needs no edit
here).  The modes import :mod:`.common` and :mod:`.contract`, never this module.  The cdc
mode's transformations are re-exported below for the callers that import them from here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql import SparkSession

from cdc_compaction.job import modes as job_modes
from cdc_compaction.job.common import (
    PermanentJobError,
    as_plan,
    attempt_locations,
    new_attempt,
    no_bookkeeping_files,
    read_small,
    rejected,
    set_job_description,
    with_provenance,
    write_text,
)
from cdc_compaction.job.common import observed as _observed
from cdc_compaction.job.contract import (
    DEFAULT_PARQUET_TIMESTAMPS,
    META_COLUMNS,
    META_DDL,
    OUTPUT_TIMESTAMP_TYPE_CONF,
    PARQUET_TIMESTAMP_TYPES,
    PARTITION_DDL,
    PERMANENT_EXIT_CODE,
    STATS_FILE,
    PermanentErrorRecord,
    Plan,
    permanent_error_path,
)
from cdc_compaction.job.faults import fault_point
from cdc_compaction.job.modes.cdc import (
    DRIVER_RANGES_MAX,
    KEY_RANGE_SPLIT_MAX,
    MAX_KEY_RANGES,
    accepted,
    assign_partitions,
    broadcast_decisions,
    choose_merge_path,
    classify,
    duplicate_key_groups,
    duplicate_keys,
    event_key_summary,
    event_partitions,
    expired_tombstone,
    fill_and_rank,
    index_frame,
    key_join,
    key_range_filter,
    key_ranges,
    key_sources,
    keyed_events,
    new_base,
    order_items,
    partition_dir_value,
    partitions_of_keys,
    ranges_between,
    rank_tally_columns,
    rank_touched_keys,
    ranked,
    read_base,
    read_partitions,
    sorts_before,
    stored_events,
    touched_partitions,
    winning_events,
    with_fills,
    with_rank_flags,
    write_index,
    written_tally_columns,
)

#: What callers (tests, the local engine, rebuild) import from here: the shared pieces and the
#: cdc mode's transformations, which live in :mod:`.common` and :mod:`.modes.cdc`.
__all__ = [
    "DRIVER_RANGES_MAX",
    "KEY_RANGE_SPLIT_MAX",
    "MAX_KEY_RANGES",
    "META_COLUMNS",
    "META_DDL",
    "PARTITION_DDL",
    "STATS_FILE",
    "PermanentJobError",
    "_observed",
    "accepted",
    "as_plan",
    "assign_partitions",
    "attempt_locations",
    "broadcast_decisions",
    "choose_merge_path",
    "classify",
    "committed_already",
    "duplicate_key_groups",
    "duplicate_keys",
    "event_key_summary",
    "event_partitions",
    "expired_tombstone",
    "fault_point",
    "fill_and_rank",
    "index_frame",
    "key_join",
    "key_range_filter",
    "key_ranges",
    "key_sources",
    "keyed_events",
    "main",
    "mode_names",
    "mode_runner",
    "new_attempt",
    "new_base",
    "order_items",
    "output_timestamp_type",
    "partition_dir_value",
    "partitions_of_keys",
    "ranges_between",
    "rank_tally_columns",
    "rank_touched_keys",
    "ranked",
    "read_base",
    "read_partitions",
    "rejected",
    "run",
    "sorts_before",
    "stored_events",
    "touched_partitions",
    "winning_events",
    "with_fills",
    "with_provenance",
    "with_rank_flags",
    "write_index",
    "written_tally_columns",
]

log = logging.getLogger(__name__)

#: The function each mode module defines: ``run_<mode>(spark, plan, attempt) -> stats``.
RUNNER_PREFIX = "run_"


def mode_names() -> list[str]:
    """The table modes this job package compacts: one module each, ``job/modes/<mode>.py``.

    Listed from the package itself (a directory or the job package's zip alike), so a mode is
    added by adding its module.
    """
    return sorted(m.name for m in pkgutil.iter_modules(job_modes.__path__) if not m.name.startswith("_"))


def mode_runner(plan: Plan) -> Callable[[SparkSession, Plan, str | None], dict[str, Any]]:
    """``run_<mode>`` of the plan's table mode, imported by name from ``job/modes/<mode>.py``.

    The name is checked against the modules there first, so that a plan's mode never imports
    anything else; a mode this job package lacks is an error no re-run heals.
    """
    mode = plan.table_mode
    known = mode_names()
    if mode not in known:
        raise PermanentJobError(
            f"{plan.table}: plan {plan.plan_id} names table mode {mode!r}, but this job package has no module "
            f"job/modes/{mode}.py (it knows {', '.join(known)}). Deploy a job package that has the mode "
            "(cdc-compaction job-package), or fix the table's mode in the registry and plan again"
        )
    module = importlib.import_module(f"{job_modes.__name__}.{mode}")
    runner = getattr(module, f"{RUNNER_PREFIX}{mode}", None)
    if not callable(runner):
        raise PermanentJobError(
            f"{plan.table}: job/modes/{mode}.py defines no {RUNNER_PREFIX}{mode}(spark, plan, attempt), "
            f"so plan {plan.plan_id} cannot be compacted. Add that function to the mode's module"
        )
    return runner


def committed_already(spark: SparkSession, plan: Plan | Mapping[str, Any]) -> bool:
    """True if ``plan`` was committed already: there is nothing left to compute.

    Raises if another plan took the plan's commit number: the plan is stale.
    """
    p = as_plan(plan)
    path = p.commit_path
    text = read_small(spark, path) if path else None
    if text is None:
        return False
    owner = json.loads(text).get("plan_id")
    if owner != p.plan_id:
        raise PermanentJobError(
            f"{p.table}: commit {p.seq} was made by plan {owner}, so plan {p.plan_id} is stale; "
            "nothing was written. Clear the run's plan task to plan again"
        )
    return True


def run(spark: SparkSession, plan: Plan | Mapping[str, Any], attempt: str | None = None) -> dict[str, Any]:
    """Compact according to ``plan`` into the attempt's own directory; write its stats; return them.

    The directory gets ``data/`` (the visible rows) and ``tombstones/`` (the delete winners
    within their retention) and, last, the stats file.  If the plan was committed already,
    nothing is written and ``{"already_committed": True}`` is returned: re-running a
    finished run's compaction is a no-op.  The stats are returned as written
    (:meth:`JobStats.to_dict <cdc_compaction.job.contract.JobStats.to_dict>`).
    """
    plan = as_plan(plan)
    if plan.compaction is not None and not plan.compaction.get("compact", True):
        # The plan only refreshes the views (compaction.policy): its increments stay pending, nothing is written.
        log.info("%s: plan %s does not compact: %s", plan.table, plan.plan_id, plan.compaction.get("reason"))
        return {"skipped": str(plan.compaction.get("reason"))}
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    # Every Parquet file this job writes (versions, tombstones, key index, change feed, quarantine) takes
    # its timestamp type from the session: set here, it holds under spark-submit, Spark Connect and a shared
    # in-process session alike, whatever conf the session came with.
    spark.conf.set(OUTPUT_TIMESTAMP_TYPE_CONF, output_timestamp_type(plan))
    # Every cached frame (the ranking, the winners, few events) in as many partitions as adaptive
    # execution chooses, not spark.sql.shuffle.partitions: 200 near-empty tasks to build a cache and
    # 200 to read it were most of a touched-only partitioned compaction's time.
    spark.conf.set("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning", "true")
    if committed_already(spark, plan):
        log.info("%s: plan %s is committed already; nothing to do", plan.table, plan.plan_id)
        return {"plan_id": plan.plan_id, "table": plan.table, "already_committed": True}
    no_bookkeeping_files(spark)
    return mode_runner(plan)(spark, plan, attempt)


def output_timestamp_type(plan: Plan) -> str:
    """Spark's ``spark.sql.parquet.outputTimestampType`` for the plan's ``parquet_timestamps``."""
    name = plan.parquet_timestamps or DEFAULT_PARQUET_TIMESTAMPS
    if name not in PARQUET_TIMESTAMP_TYPES:
        raise PermanentJobError(
            f"{plan.table}: plan {plan.plan_id} asks for parquet_timestamps {name!r}, which this job package does "
            f"not write (it knows {', '.join(PARQUET_TIMESTAMP_TYPES)}). Fix the table's parquet_timestamps in the "
            "registry and plan again, or deploy a job package that knows it (cdc-compaction job-package)"
        )
    return PARQUET_TIMESTAMP_TYPES[name]


def _read_plan(spark: SparkSession, path: str) -> dict[str, Any]:
    text = "\n".join(r.value for r in spark.read.text(path, wholetext=True).collect())
    return json.loads(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compact CDC increments into a new base version.")
    parser.add_argument("--plan", required=True, help="plan file written by the DAG's plan task")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # No appName here: it would override spark-submit --name (cdc-compact-<db>.<table>),
    # which is how the cluster manager's UI tells the tables' compactions apart.
    spark = SparkSession.builder.getOrCreate()
    try:
        plan = Plan.from_dict(_read_plan(spark, args.plan))
        set_job_description(spark, f"cdc compaction of {plan.table} ({plan.plan_id})")
        stats = run(spark, plan, attempt=new_attempt())
        print(json.dumps({"cdc_compaction_stats": {k: v for k, v in stats.items() if k != "output_files"}}))
    except PermanentJobError as exc:
        log.error("permanent error, retrying cannot help: %s", exc)
        marker = PermanentErrorRecord(plan_id=plan.plan_id, seq=plan.seq, table=plan.table, error=str(exc))
        write_text(spark, permanent_error_path(args.plan), json.dumps(marker.to_dict()))
        return PERMANENT_EXIT_CODE
    finally:
        spark.stop()
    return 0
