"""The ``keyless`` table mode's compaction, Spark side (the contract: ``tests/scenarios/README.md``).

A keyless table is a multiset of rows.  Every compaction folds the pending events onto it, one
copy at a time in the order the source delivers, and records a watermark (the greatest delivery
position applied) so that re-delivered events are recognised as replays.  The plan's
``order_by`` is that position: the registry's ``order_by`` then its ``event_id``, which together
identify one event (the Airflow side, ``cdc_compaction.modes.keyless``, puts them there).

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

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql.types import StructField, StructType

from cdc_compaction.job import common, decode
from cdc_compaction.job import files as job_files
from cdc_compaction.job.contract import (
    CHANGE_TYPE,
    CHANGES_DIR,
    COMMIT_VERSION,
    DATA_DIR,
    KEYLESS_RELATIONS,
    KEYLESS_RULE_KEYS,
    LAYOUT,
    META_COLUMNS,
    META_DDL,
    SEQ_COLUMN,
    STATS_FILE,
    TOMBSTONES_DIR,
    JobStats,
    OutputFile,
    Plan,
)
from cdc_compaction.job.faults import fault_point

log = logging.getLogger("cdc_compaction.compact.keyless")

#: The temporary views the rendered rule reads (the contract's relations, unquoted).
RELATIONS = dict(KEYLESS_RELATIONS)
BASE_VIEW, EVENTS_VIEW, WATERMARK_VIEW, FATES_VIEW, COUNTS_VIEW = (
    RELATIONS[k].strip("`") for k in ("base", "events", "watermark", "fates", "counts")
)
RULE_KEYS = KEYLESS_RULE_KEYS
REJECT_REASON = "_cdc_reject_reason"


def rule_arguments() -> dict[str, str]:
    """The relation arguments to render the rule macros with (a copy of :data:`RELATIONS`)."""
    return dict(RELATIONS)


def classify(events: DataFrame, reject_reason_sql: str) -> DataFrame:
    """Add ``_cdc_reject_reason``: NULL for a valid event, else why it is refused (an undecodable record first)."""
    return decode.classify(events, reject_reason_sql)


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
    """Fold ``events`` onto ``base``: (the new base rows, the counts of this compaction); see :func:`fold`."""
    rows, stats, _ = fold(spark, base, events, rule, order_by, watermark)
    return rows, stats


def fold(
    spark: SparkSession,
    base: DataFrame,
    events: DataFrame,
    rule: Mapping[str, str],
    order_by: Sequence[str],
    watermark: Sequence[Any] | None,
) -> tuple[DataFrame, dict[str, Any], DataFrame]:
    """Fold ``events`` onto ``base``: (the new base rows, the counts of this compaction, every row value's
    copies before and after: the data columns, ``_cdc_base_count`` and ``_cdc_count``; :func:`feed_rows`).

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
    views are dropped before returning: a classic session resolved them into the plans when it
    analysed the SQL.  Over Spark Connect a ``spark.sql`` DataFrame is its SQL text, analysed
    again whenever it runs, so there the counts view the returned rows read stays until the
    caller has written them: drop it then (``run_keyless`` does; closing the session drops it too).
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
    done = False
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
        done = True
    finally:
        keep = {COUNTS_VIEW} if done and job_files.is_connect(spark) else set()
        for name in views:
            if name not in keep:
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
    return rows, stats, counts


def feed_rows(counts: DataFrame, data_cols: Sequence[str], seq: int) -> DataFrame:
    """Commit ``seq``'s change as ``<t>_changes`` rows: the multiset difference of the two versions.

    ``counts`` holds every row value of the base and the events once (grouped over the data
    columns, so NULL equals NULL) with its copies before (``_cdc_base_count``) and after
    (``_cdc_count``) this compaction: exactly what the new version is expanded from.  A value with
    more copies after gets one ``insert`` row per copy added, one with fewer one ``delete`` row per
    copy removed; no update pairs (a copy has no identity to pair it by).  A removal that found no
    copy (``unmatched_removals``) removed nothing and is no change, and an update's before- and
    after-image of one value cancel out, as they do in the versions.  Columns: the data columns,
    ``_change_type``, ``_commit_version`` (bigint) and ``_commit_seq`` (int), both ``seq``.
    """
    delta = F.col("_cdc_count") - F.col("_cdc_base_count")
    changed = counts.filter(delta != 0)
    return changed.select(
        *[F.col(f"`{c}`") for c in data_cols],
        F.when(delta > 0, F.lit("insert")).otherwise(F.lit("delete")).alias(CHANGE_TYPE),
        F.explode(F.sequence(F.lit(1).cast("bigint"), F.abs(delta).cast("bigint"))).alias("_cdc_copy"),
    ).select(
        *[F.col(f"`{c}`") for c in data_cols],
        F.col(CHANGE_TYPE),
        F.lit(seq).cast("bigint").alias(COMMIT_VERSION),
        F.lit(seq).cast("int").alias(SEQ_COLUMN),
    )


def _json_value(value: Any) -> Any:
    """A watermark value as JSON (for the stats, which people read; the next run reads the data)."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def run_keyless(spark: SparkSession, plan: Plan, attempt: str | None) -> dict[str, Any]:
    """The keyless compaction of ``plan`` into the attempt's own directory (called by ``compact.run``).

    ``data/`` gets the copies (the data columns; the op, order_by and before-image columns are NULL,
    the metadata columns say when they were compacted), ``tombstones/`` one row holding the new
    watermark in its order_by columns (none before anything was applied). Like the cdc job it
    re-reads what it wrote and counts it for ``validate``, and writes the stats file last.
    """

    columns = list(plan.column_names)
    order_by = list(plan.order_by or ())
    data_cols = list(plan.data_columns or ())
    rule = plan.rule
    ingested_at = common.parse_ts(plan.ingested_at)
    out, quarantine = common.attempt_locations(plan, attempt)
    data_out, tomb_out = f"{out}/{DATA_DIR}", f"{out}/{TOMBSTONES_DIR}"
    write_mode = "error" if attempt else "overwrite"  # "error": errorifexists, the spelling Spark Connect knows too
    schema = f"{plan.schema_ddl}, {META_DDL}"
    log.info("compacting keyless %s (plan %s): %d files", plan.table, plan.plan_id, len(plan.files))

    base_all = job_files.read_version(spark, schema, plan.base_location, plan.base_rows).select(
        *[F.col(f"`{c}`") for c in data_cols]
    )
    tomb_loc = plan.base_tombstones_location
    marks = (
        job_files.read_version(spark, schema, tomb_loc, plan.base_tombstones)
        if tomb_loc
        else spark.createDataFrame([], schema)
    )
    mark_rows = marks.select(*[F.col(f"`{c}`") for c in order_by]).collect()
    if len(mark_rows) > 1:
        raise RuntimeError(f"{plan.table}: {len(mark_rows)} watermark rows in {tomb_loc}; a keyless version holds one")
    watermark = [mark_rows[0][c] for c in order_by] if mark_rows else None

    # The planned files in whatever form they landed (registry format/envelope; job/decode.py).
    read = decode.read_events(spark, plan, columns)
    events = read.frame
    classified = classify(events, rule["reject_reason"])
    # The first pass over the events reads them all: the decoder's skipped records are counted on it.
    by_file = decode.rejected_by_file(classified)
    skipped = read.skipped()
    bad = common.rejected(classified, plan.plan_id)
    if by_file:
        bad.write.mode(write_mode).parquet(quarantine)

    base_copies = base_all.count()
    rows, counts, value_counts = fold(spark, base_all, events, rule, order_by, watermark)
    stamp = F.lit(ingested_at).cast("timestamp")
    plain = [c for c in columns if c not in data_cols]
    types = dict(events.dtypes)

    def typed_null(c: str) -> Any:
        return F.lit(None).cast(types[c]).alias(c)

    # Every registry column, then the metadata: the schema validate expects and readers see in <t>_base.
    out_cols = [*columns, *META_COLUMNS]
    copies = rows.select(
        *[F.col(f"`{c}`") for c in data_cols],
        *[typed_null(c) for c in plain],
        *[F.lit(None).cast("string").alias(c) for c in ("_cdc_increment", "_cdc_file")],
        F.lit(None).cast("bigint").alias("_cdc_pos"),
        stamp.alias("_cdc_ingested_at"),
    ).select(*[F.col(f"`{c}`") for c in out_cols])
    if plan.output_files:
        copies = copies.coalesce(int(plan.output_files))
    compression = plan.compression or "snappy"
    change_feed: dict[str, Any] | None = None
    try:
        copies.write.mode(write_mode).option("compression", compression).parquet(data_out)
        if plan.change_feed:
            # registry change_feed: the commit's change from the counts the new version is expanded from
            # (checkpointed: no second read of the base or the events), one file beside the version.
            feed = feed_rows(value_counts, data_cols, int(plan.seq))
            change_feed = common.write_feed(spark, feed, plan, out, write_mode)
    finally:
        # The copies are written: the counts view they read over Spark Connect can go (see compact_keyless).
        spark.catalog.dropTempView(COUNTS_VIEW)
    new_mark = counts["new_watermark"]
    mark_schema = StructType([StructField(c, events.schema[c].dataType, True) for c in order_by])
    mark_df = spark.createDataFrame([tuple(new_mark)] if new_mark is not None else [], mark_schema)
    mark_out = mark_df.select(
        *[F.col(f"`{c}`") if c in order_by else typed_null(c) for c in columns],
        *[F.lit(None).cast("string").alias(c) for c in ("_cdc_increment", "_cdc_file")],
        F.lit(None).cast("bigint").alias("_cdc_pos"),
        stamp.alias("_cdc_ingested_at"),
    )
    mark_out.coalesce(1).write.mode(write_mode).option("compression", compression).parquet(tomb_out)

    # Re-read what landed on storage: these counts gate publishing (validate).
    data_rows = spark.read.schema(schema).parquet(data_out).count()
    tomb_rows = spark.read.schema(schema).parquet(tomb_out).count()
    output_files = common.data_files(spark, data_out, DATA_DIR) + common.data_files(spark, tomb_out, TOMBSTONES_DIR)
    if change_feed is not None:
        output_files += common.data_files(spark, f"{out}/{CHANGES_DIR}", CHANGES_DIR)
    stats = JobStats(
        plan_id=plan.plan_id,
        table=plan.table,
        attempt=attempt or "",
        layout=LAYOUT,
        base_rows=base_copies + len(mark_rows),
        increment_rows=counts["increment_rows"],
        rejected_rows=counts["rejected_rows"],
        rejected_by_reason=counts["rejected_by_reason"],
        rejected_by_file=by_file,
        superseded_rows=counts["superseded_rows"],
        expired_tombstones=0,
        output_rows=data_rows + tomb_rows,
        output_tombstones=tomb_rows,
        output_visible_rows=data_rows,
        misplaced_rows=0,
        duplicate_keys=0,
        output_files=tuple(OutputFile(f["name"], f["size"]) for f in output_files),
        finished_at=datetime.now(UTC).isoformat(),
        **decode.skipped_stats(plan, skipped),
        change_feed=change_feed,
        extra={
            "mode": "keyless",
            "base_copies": base_copies,
            "base_watermarks": len(mark_rows),
            "replayed_rows": counts["replayed_rows"],
            "applied_rows": counts["applied_rows"],
            "additions": counts["additions"],
            "removals": counts["removals"],
            "unmatched_removals": counts["unmatched_removals"],
            "watermark": None if watermark is None else [_json_value(v) for v in watermark],
            "new_watermark": None if new_mark is None else [_json_value(v) for v in new_mark],
        },
    ).to_dict()
    fault_point("compact.before_stats", plan.table)
    common.write_text(spark, f"{out.rstrip('/')}/{STATS_FILE}", json.dumps(stats, indent=1, sort_keys=True))
    log.info("compacted keyless %s: %s", plan.table, {k: v for k, v in stats.items() if k != "output_files"})
    return stats
