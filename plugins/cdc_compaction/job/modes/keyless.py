"""The ``keyless`` table mode's compaction, Spark side (the contract: ``tests/scenarios/README.md``).

A keyless table is a multiset of rows.  Every compaction folds the pending events onto it, one
copy at a time in the source log's order, and records a watermark (the greatest ``order_by``
value applied) so that re-delivered events are recognised as replays.

The rule itself is SQL rendered from ``include/sql/modes/keyless/_rule.sql.j2`` (the same
macros the view is rendered from) and handed in as ``rule``, as the ``cdc`` job gets its rule
from the plan.  The macros are rendered over relations of fixed names, which this module fills
with temporary views: render them with :data:`RELATIONS` (see :func:`rule_arguments`)::

    r = rule_arguments()
    rule = {
        "reject_reason": m.reject_reason(t),
        "event_fates": m.event_fates(t, r["events"], r["watermark"]),
        "event_counts": m.event_counts(t, r["fates"]),
        "new_watermark": m.new_watermark(t, r["fates"]),
        "value_counts": m.value_counts(t, r["base"], r["fates"]),
        "copies": m.copies(t, r["counts"]),
    }

Shipped to the cluster with the job: imports only the standard library and PySpark, never
Airflow or the rest of ``cdc_compaction``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.types import StructField, StructType

log = logging.getLogger("cdc_compaction.compact.keyless")

#: The temporary views the rendered rule reads; names no registry column or table can take.
BASE_VIEW = "_cdc_keyless_base"
EVENTS_VIEW = "_cdc_keyless_events"
WATERMARK_VIEW = "_cdc_keyless_watermark"
FATES_VIEW = "_cdc_keyless_fates"
COUNTS_VIEW = "_cdc_keyless_counts"
#: What the rule macros' relation arguments must be for this module.
RELATIONS = {
    "base": f"`{BASE_VIEW}`",
    "events": f"`{EVENTS_VIEW}`",
    "watermark": f"`{WATERMARK_VIEW}`",
    "fates": f"`{FATES_VIEW}`",
    "counts": f"`{COUNTS_VIEW}`",
}
RULE_KEYS = ("reject_reason", "event_fates", "event_counts", "new_watermark", "value_counts", "copies")
REJECT_REASON = "_cdc_reject_reason"


def rule_arguments() -> dict[str, str]:
    """The relation arguments to render the rule macros with (a copy of :data:`RELATIONS`)."""
    return dict(RELATIONS)


def classify(events: DataFrame, reject_reason_sql: str) -> DataFrame:
    """Add ``_cdc_reject_reason``: NULL for a valid event, else why it is refused."""
    return events.withColumn(REJECT_REASON, F.expr(reject_reason_sql))


def watermark_frame(
    spark: SparkSession, events: DataFrame, order_by: Sequence[str], watermark: Sequence[Any] | None
) -> DataFrame:
    """The watermark as the one-row relation the rule reads: the order_by columns, all NULL when None.

    Typed like the events' order_by columns, so the comparisons compare like with like.
    """
    schema = StructType([StructField(c, events.schema[c].dataType, nullable=True) for c in order_by])
    if watermark is not None and len(watermark) != len(order_by):
        raise ValueError(f"watermark {list(watermark)} does not match order_by {list(order_by)}")
    row = tuple(watermark) if watermark is not None else (None,) * len(order_by)
    return spark.createDataFrame([row], schema)


def compact_keyless(
    spark: SparkSession,
    base: DataFrame,
    events: DataFrame,
    rule: Mapping[str, str],
    order_by: Sequence[str],
    watermark: Sequence[Any] | None,
) -> tuple[DataFrame, dict[str, Any]]:
    """Fold ``events`` onto ``base``: (the new base rows, the counts of this compaction).

    ``base`` holds the data columns only; ``events`` every registry column plus the provenance
    columns ``_cdc_increment``, ``_cdc_file``, ``_cdc_pos`` (refused events included: they are
    counted here; write them to quarantine with :func:`classify`).  ``watermark`` is the one the
    last commit recorded (order_by values, None before the first); the counts carry the one to
    record with this commit, ``new_watermark``.

    Two intermediate results are materialised, because several steps read each: every event's
    fate (events-sized) and every distinct row value's new count (one row per value of base and
    events).  They are local checkpoints: kept by the executors, dropped by Spark's cleaner
    once unreferenced, and not recomputed if an executor is lost -- the job fails and its
    retry starts over (each attempt writes a directory of its own).  So the base is shuffled
    once, and the returned rows are expanded from the checkpointed counts.

    Two invariants are checked on the counts: every valid event has exactly one fate, and the
    rows balance (output = base + additions - removals + unmatched removals).  The temporary
    views are dropped before returning: Spark resolved them into the plans when it analysed the SQL.
    """
    missing = [k for k in RULE_KEYS if k not in rule]
    if missing:
        raise ValueError(f"the keyless rule lacks {missing}")
    classified = classify(events, rule["reject_reason"])
    by_reason = {r[REJECT_REASON]: int(r["count"]) for r in classified.groupBy(REJECT_REASON).count().collect()}
    valid_rows = by_reason.pop(None, 0)
    views = {
        BASE_VIEW: base,
        EVENTS_VIEW: classified.filter(F.col(REJECT_REASON).isNull()).drop(REJECT_REASON),
        WATERMARK_VIEW: watermark_frame(spark, events, order_by, watermark),
    }
    try:
        for name, df in views.items():
            df.createOrReplaceTempView(name)
        fates = spark.sql(rule["event_fates"]).localCheckpoint(eager=True)
        fates.createOrReplaceTempView(FATES_VIEW)
        views[FATES_VIEW] = fates
        tally = spark.sql(rule["event_counts"]).first()
        top = spark.sql(rule["new_watermark"]).first()
        counts = spark.sql(rule["value_counts"]).localCheckpoint(eager=True)
        counts.createOrReplaceTempView(COUNTS_VIEW)
        views[COUNTS_VIEW] = counts
        rows = spark.sql(rule["copies"])
        totals = counts.agg(
            F.coalesce(F.sum("_cdc_base_count"), F.lit(0)).alias("base_rows"),
            F.coalesce(F.sum("_cdc_count"), F.lit(0)).alias("output_rows"),
            F.coalesce(F.sum("_cdc_unmatched"), F.lit(0)).alias("unmatched_removals"),
        ).first()
    finally:
        for name in views:
            spark.catalog.dropTempView(name)

    old = list(watermark) if watermark is not None else None
    stats: dict[str, Any] = {
        "increment_rows": valid_rows + sum(by_reason.values()),
        "rejected_rows": sum(by_reason.values()),
        "rejected_by_reason": dict(sorted(by_reason.items())),
        "replayed_rows": int(tally["replayed_rows"]),
        "superseded_rows": int(tally["superseded_rows"]),
        "applied_rows": int(tally["applied_rows"]),
        "additions": int(tally["additions"]),
        "removals": int(tally["removals"]),
        "unmatched_removals": int(totals["unmatched_removals"]),
        "base_rows": int(totals["base_rows"]),
        "output_rows": int(totals["output_rows"]),
        "watermark": old,
        # Nothing applied: the watermark stays where the last commit left it.
        "new_watermark": [top[c] for c in order_by] if top is not None else old,
    }
    fated = stats["replayed_rows"] + stats["superseded_rows"] + stats["applied_rows"]
    if fated != valid_rows or int(tally["events"]) != valid_rows:
        raise RuntimeError(f"keyless compaction: {valid_rows} valid events but {fated} fates: {stats}")
    balance = stats["base_rows"] + stats["additions"] - stats["removals"] + stats["unmatched_removals"]
    if balance != stats["output_rows"]:
        raise RuntimeError(f"keyless compaction: the rows do not balance ({balance} != output_rows): {stats}")
    log.info("keyless compaction: %s", stats)
    return rows, stats
