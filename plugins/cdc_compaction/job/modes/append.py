"""The ``append`` table mode's compaction, Spark side (the contract: ``tests/scenarios/append/README.md``).

An append table is an insert-only event or log table.  Every compaction adds the pending valid
events to the base, once per event id: an event whose id the base holds already is ``replayed``,
one repeating an earlier pending copy (by increment, file, row) ``superseded``; neither is added
again, both are counted.  Nothing is ever removed, so a version's ``tombstones/`` is empty.

The rule is SQL rendered from ``include/sql/modes/append/_rule.sql.j2`` (the same macros every
view is rendered from) and handed in as the plan's ``rule``, with the names of the relations it
was rendered over (``relation:<name>``): this module registers its frames under those names.

Shipped to the cluster with the job: imports only the standard library and PySpark, never
Airflow or the rest of ``cdc_compaction``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from cdc_compaction.job import common, decode
from cdc_compaction.job import files as job_files
from cdc_compaction.job.contract import (
    DATA_DIR,
    LAYOUT,
    META_DDL,
    PROVENANCE,
    STATS_FILE,
    TOMBSTONES_DIR,
    JobStats,
    OutputFile,
    Plan,
)
from cdc_compaction.job.faults import fault_point

log = logging.getLogger("cdc_compaction.compact.append")

#: What the rule must hold: its statements, the event id and the relations it reads.
RULE_KEYS = ("reject_reason", "event_fates", "event_counts", "appended", "event_id")
RELATION_KEYS = ("base", "events", "fates")
RELATION_PREFIX = "relation:"
REJECT_REASON = "_cdc_reject_reason"


def relations(rule: Mapping[str, Any]) -> dict[str, str]:
    """The temporary view names the rule was rendered over (unquoted), by relation."""
    missing = [k for k in (*RULE_KEYS, *(RELATION_PREFIX + r for r in RELATION_KEYS)) if k not in rule]
    if missing:
        raise ValueError(f"the append rule lacks {missing}")
    return {r: str(rule[RELATION_PREFIX + r]).strip("`") for r in RELATION_KEYS}


def event_id_of(rule: Mapping[str, Any]) -> list[str]:
    return [c for c in str(rule["event_id"]).split(",") if c]


def classify(events: DataFrame, reject_reason_sql: str) -> DataFrame:
    """Add ``_cdc_reject_reason``: NULL for a valid event, else why it is refused (an undecodable record first)."""
    return decode.classify(events, reject_reason_sql)


def compact_append(
    spark: SparkSession, base: DataFrame, events: DataFrame, rule: Mapping[str, Any]
) -> tuple[DataFrame, dict[str, Any]]:
    """The events of this compaction to append to ``base``: (those rows, the counts).

    ``base`` holds at least the registry columns; ``events`` the registry columns plus
    ``_cdc_increment``, ``_cdc_file``, ``_cdc_pos`` (refused events included: they are counted
    here; write them to quarantine with :func:`classify`).  The returned rows have the registry
    columns and the provenance; the caller writes them after the base's rows.

    Every valid event's fate is materialised once (a local checkpoint: the counts and the rows
    both read it), so the base's event ids are shuffled once.  Checked here: every valid event
    has exactly one fate.  The temporary views are dropped before returning; the rows are read
    from the checkpoint, not from a view, so they stay readable over Spark Connect too.
    """
    names = relations(rule)
    classified = classify(events, rule["reject_reason"])
    by_reason = {r[REJECT_REASON]: int(r["count"]) for r in classified.groupBy(REJECT_REASON).count().collect()}
    valid_rows = by_reason.pop(None, 0)
    views = {
        names["base"]: base,
        names["events"]: classified.filter(F.col(REJECT_REASON).isNull()).drop(REJECT_REASON),
    }
    try:
        for name, df in views.items():
            df.createOrReplaceTempView(name)
        fates = spark.sql(rule["event_fates"]).localCheckpoint(eager=True)
        fates.createOrReplaceTempView(names["fates"])
        views[names["fates"]] = fates
        tally = spark.sql(rule["event_counts"]).first()
        columns = [c for c in events.columns if c not in (*PROVENANCE, decode.DECODE_REASON)]
        rows = fates.filter(F.col("_cdc_fate") == "appended").select(
            *[F.col(f"`{c}`") for c in (*columns, *PROVENANCE)]
        )
    finally:
        for name in views:
            spark.catalog.dropTempView(name)
    stats: dict[str, Any] = {
        "increment_rows": valid_rows + sum(by_reason.values()),
        "rejected_rows": sum(by_reason.values()),
        "rejected_by_reason": dict(sorted(by_reason.items())),
        "replayed_rows": int(tally["replayed_rows"]),
        "superseded_rows": int(tally["superseded_rows"]),
        "appended_rows": int(tally["appended_rows"]),
    }
    fated = stats["replayed_rows"] + stats["superseded_rows"] + stats["appended_rows"]
    if fated != valid_rows or int(tally["events"]) != valid_rows:
        raise RuntimeError(f"append compaction: {valid_rows} valid events but {fated} fates: {stats}")
    log.info("append compaction: %s", stats)
    return rows, stats


def duplicate_ids(rows: DataFrame, event_id: Sequence[str]) -> int:
    """Event ids held by more than one row of ``rows`` (0 in every version the job writes)."""
    return rows.groupBy(*[F.col(f"`{c}`") for c in event_id]).count().filter(F.col("count") > 1).count()


def run_append(spark: SparkSession, plan: Plan, attempt: str | None) -> dict[str, Any]:
    """The append compaction of ``plan`` into the attempt's own directory (``compact.run`` finds it by the plan's mode).

    ``data/`` gets the base's rows as they were (with their provenance and compaction time) and
    the appended events (with theirs, stamped now); ``tombstones/`` an empty file.  Like the other
    modes it re-reads what it wrote and counts it for ``validate``, and writes the stats file last.
    """

    columns = list(plan.column_names)
    rule = plan.rule
    event_id = event_id_of(rule)
    ingested_at = common.parse_ts(plan.ingested_at)
    out, quarantine = common.attempt_locations(plan, attempt)
    data_out, tomb_out = f"{out}/{DATA_DIR}", f"{out}/{TOMBSTONES_DIR}"
    write_mode = "error" if attempt else "overwrite"  # "error": errorifexists, the spelling Spark Connect knows too
    schema = f"{plan.schema_ddl}, {META_DDL}"
    log.info("compacting append %s (plan %s): %d files", plan.table, plan.plan_id, len(plan.files))

    base = job_files.read_version(spark, schema, plan.base_location, plan.base_rows)
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

    base_rows = base.count()
    appended, counts = compact_append(spark, base, events, rule)
    out_cols = [F.col(f"`{c}`") for c in base.columns]
    rows = base.select(*out_cols).unionByName(
        appended.withColumn("_cdc_ingested_at", F.lit(ingested_at).cast("timestamp")).select(*out_cols)
    )
    if plan.output_files:
        rows = rows.coalesce(int(plan.output_files))
    compression = plan.compression or "snappy"
    rows.write.mode(write_mode).option("compression", compression).parquet(data_out)
    # No tombstones ever: an empty file keeps the version's layout (validate and the readers list it).
    spark.createDataFrame([], base.schema).coalesce(1).write.mode(write_mode).option(
        "compression", compression
    ).parquet(tomb_out)

    # Re-read what landed on storage: these counts gate publishing (validate).
    written = spark.read.schema(schema).parquet(data_out)
    data_rows = written.count()
    tomb_rows = spark.read.schema(schema).parquet(tomb_out).count()
    dupes = duplicate_ids(written, event_id)
    output_files = common.data_files(spark, data_out, DATA_DIR) + common.data_files(spark, tomb_out, TOMBSTONES_DIR)
    stats = JobStats(
        plan_id=plan.plan_id,
        table=plan.table,
        attempt=attempt or "",
        layout=LAYOUT,
        base_rows=base_rows,
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
        duplicate_keys=dupes,
        output_files=tuple(OutputFile(f["name"], f["size"]) for f in output_files),
        finished_at=datetime.now(UTC).isoformat(),
        **decode.skipped_stats(plan, skipped),
        extra={
            "mode": "append",
            "event_id": event_id,
            "replayed_rows": counts["replayed_rows"],
            "appended_rows": counts["appended_rows"],
        },
    ).to_dict()
    fault_point("compact.before_stats", plan.table)
    common.write_text(spark, f"{out.rstrip('/')}/{STATS_FILE}", json.dumps(stats, indent=1, sort_keys=True))
    log.info("compacted append %s: %s", plan.table, {k: v for k, v in stats.items() if k != "output_files"})
    return stats
