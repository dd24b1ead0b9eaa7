"""The ``cdc`` table mode's compaction, Spark side: base + planned increments -> a new base version.

The entry point (:mod:`cdc_compaction.job.compact`) calls :func:`run_cdc` for a plan of a cdc
table (``Plan.mode`` absent or ``cdc``).  The rule arrives in the plan as SQL expressions
rendered from ``include/sql/_rule.sql.j2`` -- the same macros the view uses.  This module
imports the shared pieces (:mod:`..common`) and the contract, never the entry point.

The functions above ``run_cdc`` are pure ``DataFrame -> DataFrame`` transformations.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import operator
import os
import posixpath
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql import types as T  # noqa: N812 - the PySpark convention

from cdc_compaction.job import decode, files
from cdc_compaction.job.common import (
    PermanentJobError,
    as_plan,
    attempt_locations,
    data_files,
    feed_tally_columns,
    list_on_driver,
    observed,
    parse_ts,
    rejected,
    set_job_description,
    write_text,
)
from cdc_compaction.job.contract import (
    BROADCAST_MERGE_MAX_EVENTS,
    CHANGE_TYPE,
    CHANGES_DIR,
    COMMIT_VERSION,
    DATA_DIR,
    DEFAULT_COMPRESSION,
    FEED_CHANGE_TYPES,
    FRESH_VIEW,
    INDEX_DIR,
    INDEX_ROW_GROUP_BYTES,
    KEY_LOOKUP_MAX_EVENTS,
    LAYOUT,
    MERGE_PATHS,
    META_COLUMNS,
    META_DDL,
    PARTITION_COLUMN,
    PARTITION_DDL,
    PARTITION_DIR_COLUMN,
    PROVENANCE,
    SEQ_COLUMN,
    STATS_FILE,
    TOMBSTONES_DIR,
    JobStats,
    OutputFile,
    Plan,
    partition_dir_column,
    partition_dir_value,
)
from cdc_compaction.job.faults import fault_point

# The entry point's logger name, kept: bench/job_profile.py times the job by its compacting/compacted lines.
log = logging.getLogger("cdc_compaction.job.compact")


def classify(events: DataFrame, reject_reason_sql: str) -> DataFrame:
    """Add ``_cdc_reject_reason``: NULL for a valid event, else why it is refused."""
    return events.withColumn("_cdc_reject_reason", F.expr(reject_reason_sql))


def accepted(classified: DataFrame, ingested_at: datetime) -> DataFrame:
    """The valid events, stamped with the time they were first compacted."""
    return (
        classified.filter(F.col("_cdc_reject_reason").isNull())
        .drop("_cdc_reject_reason")
        .withColumn("_cdc_ingested_at", F.lit(ingested_at).cast("timestamp"))
    )


def ranked(events: DataFrame, rank_sql: str) -> DataFrame:
    """Rank every event of a key; rank 1 is the winner under the compaction rule."""
    return events.withColumn("_cdc_rank", F.expr(rank_sql))


def expired_tombstone(is_delete_sql: str, cutoff: datetime | None) -> Column:
    """True for a delete winner older than the tombstone retention."""
    if cutoff is None:
        return F.lit(False)
    return F.expr(is_delete_sql) & (F.col("_cdc_ingested_at") < F.lit(cutoff).cast("timestamp"))


def new_base(ranked_events: DataFrame, is_delete_sql: str, cutoff: datetime | None) -> DataFrame:
    """Keep each key's winner (tombstones too, until they expire)."""
    return ranked_events.filter((F.col("_cdc_rank") == 1) & ~expired_tombstone(is_delete_sql, cutoff)).drop("_cdc_rank")


def key_join(left: DataFrame, right: DataFrame, pk: list[str], how: str, broadcast: bool = False) -> DataFrame:
    """``left`` semi- or anti-joined with ``right`` on the key, NULL equal to NULL.

    A key column may hold NULL as a value (registry ``nullable_key``); an equi-join would never
    match it. Where the rule refuses NULL keys this is the plain key join.
    """
    keys = right.select(*[F.col(f"`{c}`").alias(f"_cdc_k{i}") for i, c in enumerate(pk)])
    cond = functools.reduce(operator.and_, [F.col(f"`{c}`").eqNullSafe(F.col(f"_cdc_k{i}")) for i, c in enumerate(pk)])
    return left.join(F.broadcast(keys) if broadcast else keys, cond, how)


def with_fills(
    events: DataFrame, fills: Mapping[str, str], unchanged: Mapping[str, Mapping[str, Any]] | None = None
) -> DataFrame:
    """Each left-out column (registry ``unchanged``) replaced by its value at that event: the rule's window.

    With ``unchanged`` (the rule's bookkeeping, :attr:`~cdc_compaction.job.contract.Rule.unchanged`)
    first the values key changes carry over from their old key, then, from the values as the
    events sent them, the hidden columns saying whether each was left out and where its value
    came from; the fills last (they replace the values the others read).
    """
    unchanged = unchanged or {}
    for column, spec in unchanged.items():
        if "carried" in spec:
            events = events.withColumn(column, F.expr(spec["carried"]))
    for spec in unchanged.values():
        left, is_left = spec["left"]
        events = events.withColumn(left, F.expr(is_left))
        for name, expression in spec["book"].items():
            events = events.withColumn(name, F.expr(expression))
    for column, expression in fills.items():
        events = events.withColumn(column, F.expr(expression))
    return events


def stored_events(base: DataFrame, unchanged: Mapping[str, Mapping[str, Any]]) -> DataFrame:
    """Stored rows (``_cdc_src`` 0) as the events they were, with the events their filled values came from.

    A value filled from an earlier event is left out again (the rule's ``as_event``) and that
    event is replayed (``_cdc_src`` 2) at its place in the order, carrying that one value: a
    late event between the two fills the row anew, as one compaction of every event would. The
    replayed events take part in the fills only (:func:`fill_and_rank`); they never win.
    """
    rows = base.withColumn("_cdc_src", F.lit(0))
    if not unchanged:
        return rows
    sources = []
    for spec in unchanged.values():
        replayed = {c: F.expr(e).alias(c) for c, e in spec["source"].items()}
        sources.append(
            rows.where(F.expr(spec["source_where"]))
            .select(*[replayed.get(c, F.col(f"`{c}`")) for c in rows.columns])
            .withColumn("_cdc_src", F.lit(2))
        )
    for column, spec in unchanged.items():
        rows = rows.withColumn(column, F.expr(spec["as_event"]))
    for replay in sources:
        rows = rows.unionByName(replay)
    return rows


def fill_and_rank(
    events: DataFrame, rank_sql: str, fills: Mapping[str, str], unchanged: Mapping[str, Mapping[str, Any]]
) -> DataFrame:
    """Fill the left-out columns over every event (replayed ones included), then rank the real ones."""
    return ranked(with_fills(events, fills, unchanged).filter(F.col("_cdc_src") < 2), rank_sql)


def rank_touched_keys(
    base: DataFrame,
    fresh: DataFrame,
    pk: list[str],
    order_by: list[str],
    rank_sql: str,
    fills: Mapping[str, str] | None = None,
    unchanged: Mapping[str, Mapping[str, Any]] | None = None,
) -> DataFrame:
    """``ranked`` over the events of the keys ``fresh`` touches only: their base rows and every event.

    Events whole (``_cdc_src`` 1): a winning event is written from here, so the events are read
    and shuffled once, not once more to join the winners back to them.  Base rows (``_cdc_src``
    0) narrow on purpose -- keys, ordering columns, provenance, the left-out columns to fill, the
    change feed's stored row (:data:`OLD_ROW`), every other column NULL: the base's other
    columns are never read here.  With the bookkeeping of left-out columns (``unchanged``) base
    rows whole too: a base row that still wins may be filled anew, and is written from here.
    """
    fills, unchanged = fills or {}, unchanged or {}
    # The change feed (OLD_ROW on the base) takes the stored row along as one column.
    old_row = [OLD_ROW] if OLD_ROW in base.columns else []
    names = list(base.columns) if unchanged else [*pk, *order_by, *PROVENANCE, *fills, *old_row]
    cols = [F.col(f"`{c}`") for c in dict.fromkeys(names)]
    keys = fresh.select(*[F.col(f"`{c}`") for c in pk]).distinct()
    touched = stored_events(key_join(base.select(*cols), keys, pk, "left_semi", broadcast=True), unchanged)
    padding = [F.lit(None).cast(base.schema[c].dataType).alias(c) for c in fresh.columns if c not in touched.columns]
    events = touched.select("*", *padding).unionByName(fresh.withColumn("_cdc_src", F.lit(1)))
    return fill_and_rank(events, rank_sql, fills, unchanged)


def winning_events(fresh: DataFrame, won: DataFrame, pk: list[str], broadcast: bool = False) -> DataFrame:
    """The events of ``fresh`` that ``won`` (the winners of :func:`broadcast_decisions`) names.

    An event is named by its provenance and key: a key change (registry ``old_key``) is two
    rows of one event, its old key's retirement and its new key's upsert.  Where both have
    :data:`OLD_ROW` (the change feed) the winner's replaces the event's NULL: the feed's pairs
    come out of this join, not out of a join of their own.  ``broadcast``: ``won`` is broadcast
    (it is one row per key of a broadcast merge): with the stored rows along it outgrows Spark's
    own broadcast threshold, and a shuffle of both sides would cost more than the version's write.
    """
    # The key's stored row rides along (one winner per key and provenance, so inner is the semi-join).
    carried = {OLD_ROW: "_cdc_wold"} if OLD_ROW in won.columns and OLD_ROW in fresh.columns else {}
    w = won.select(
        *[F.col(c).alias(f"_cdc_w{c}") for c in PROVENANCE],
        *[F.col(f"`{c}`").alias(f"_cdc_k{i}") for i, c in enumerate(pk)],
        *[F.col(c).alias(a) for c, a in carried.items()],
    )
    cond = functools.reduce(
        operator.and_,
        [F.col(c) == F.col(f"_cdc_w{c}") for c in PROVENANCE]
        + [F.col(f"`{c}`").eqNullSafe(F.col(f"_cdc_k{i}")) for i, c in enumerate(pk)],
    )
    if broadcast:
        w = F.broadcast(w)
    if not carried:
        return fresh.join(w, cond, "left_semi")
    taken = {c: F.col(a).alias(c) for c, a in carried.items()}
    return fresh.join(w, cond, "inner").select(*[taken.get(c, F.col(f"`{c}`")) for c in fresh.columns])


# ------------------------------------------------------------- the broadcast merge
#: ``ORDER BY`` items of the rule's rank: ``<expression> ASC|DESC [NULLS FIRST|LAST]``.
_ORDER_ITEM = re.compile(r"^(?P<expr>.+?)\s+(?P<dir>ASC|DESC)(?:\s+NULLS\s+(?P<nulls>FIRST|LAST))?$", re.I | re.S)


def _split_top_level(text: str) -> list[str]:
    """``text`` cut at its commas outside parentheses, quotes and backticks."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'`\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def order_items(rank_sql: str) -> list[tuple[str, bool, bool]] | None:
    """The rule's order as its rank (:func:`ranked`) sorts: (expression, descending, NULLs first) per item.

    Parsed from the rank's own ``ORDER BY`` so that the pairwise comparison of the broadcast
    merge (:func:`sorts_before`) is the rank's order by construction, every part of it: the
    ``order_by`` values as compared (``order_as``), where NULLs sort, then increment, file and
    row position.  None when the rank is not ``row_number() OVER (... ORDER BY ...)`` as
    expected: the job then takes the window path, which evaluates the rank as it is.
    """
    at = rank_sql.upper().rfind("ORDER BY")
    end = rank_sql.rstrip().rfind(")")
    if at < 0 or end < at:
        return None
    items = []
    for part in _split_top_level(rank_sql[at + len("ORDER BY") : end]):
        m = _ORDER_ITEM.match(part.strip())
        if m is None:
            return None
        desc = m["dir"].upper() == "DESC"
        # Spark's default: NULLs first ascending, last descending.
        nulls_first = (m["nulls"] or ("LAST" if desc else "FIRST")).upper() == "FIRST"
        items.append((m["expr"].strip(), desc, nulls_first))
    return items or None


def sorts_before(a: list[Column], b: list[Column], items: list[tuple[str, bool, bool]]) -> Column:
    """True where the row whose order values are ``a`` ranks before (wins over) the one with ``b``.

    ``a[i]``, ``b[i]``: item ``i`` of :func:`order_items` evaluated on each row. Lexicographic,
    each item descending or ascending with its NULLs first or last, exactly as the rank sorts;
    never NULL (equal rows: False).
    """
    result: Column = F.lit(False)
    for (_, desc, nulls_first), x, y in reversed(list(zip(items, a, b, strict=True))):
        by_null = (x.isNull() & y.isNotNull()) if nulls_first else (x.isNotNull() & y.isNull())
        by_value = (x > y) if desc else (x < y)
        before = by_null | F.coalesce(by_value, F.lit(False))
        result = before | (x.eqNullSafe(y) & result)
    return result


def broadcast_decisions(
    base: DataFrame,
    fresh: DataFrame,
    pk: list[str],
    order_by: list[str],
    rank_sql: str,
    items: list[tuple[str, bool, bool]],
) -> DataFrame:
    """One row per key of ``fresh``: its winning event, whether that beats the key's stored row, and counts.

    The events are ranked alone (a shuffle of the events, not of the base).  The stored rows of
    their keys are found by streaming ``base`` (visible rows and tombstones) past the events'
    keys, broadcast, reading only the key, order and provenance columns; they are one per key at
    most, so they are broadcast back to the ranked events.  Every event is compared with its
    key's stored row by :func:`sorts_before` -- the rank's own order -- which gives what ranking
    both together gives (:func:`rank_touched_keys`, :func:`with_rank_flags`):

    * ``_cdc_wins``: the winning event beats the stored row (or there is none): the stored row
      is superseded and the event written; else the stored row stays and every event is late;
    * ``_cdc_events``, ``_cdc_late_n``: the key's events, and those ranking below its stored row;
    * ``_cdc_tied_n`` 1 when the key's runner-up has the winner's ``order_by`` values (file and
      row order decided): the second event, or the stored row when it ranks first or second.

    Columns: the key (as named in ``pk``), the winning event's provenance (:data:`PROVENANCE`),
    ``_cdc_has_base``, ``_cdc_wins`` and the counts.
    """
    keys = _keys(pk)
    ev = ranked(
        fresh.select(*keys, *[F.col(f"`{c}`") for c in dict.fromkeys([*order_by, *PROVENANCE]) if c not in pk]),
        rank_sql,
    )
    ev = ev.select(
        *keys,
        F.col("_cdc_rank"),
        *[F.col(c) for c in PROVENANCE],
        *[F.expr(e).alias(f"_cdc_o{i}") for i, (e, _, _) in enumerate(items)],
        *[F.col(f"`{c}`").alias(f"_cdc_v{j}") for j, c in enumerate(order_by)],
    )
    # With the change feed (OLD_ROW on the base) the stored rows travel whole, in the same scan.
    old_row = [F.col(OLD_ROW)] if OLD_ROW in base.columns else []
    narrow = base.select(*[F.col(f"`{c}`") for c in dict.fromkeys([*pk, *order_by, *PROVENANCE])], *old_row)
    stored = key_join(narrow, fresh.select(*keys).distinct(), pk, "left_semi", broadcast=True).select(
        *[F.col(f"`{c}`").alias(f"_cdc_k{i}") for i, c in enumerate(pk)],
        *[F.expr(e).alias(f"_cdc_b{i}") for i, (e, _, _) in enumerate(items)],
        *[F.col(f"`{c}`").alias(f"_cdc_bv{j}") for j, c in enumerate(order_by)],
        F.lit(True).alias("_cdc_has_base"),
        *old_row,
    )
    cond = functools.reduce(operator.and_, [F.col(f"`{c}`").eqNullSafe(F.col(f"_cdc_k{i}")) for i, c in enumerate(pk)])
    both = ev.join(F.broadcast(stored), cond, "left")
    has_base = F.col("_cdc_has_base").isNotNull()
    before = sorts_before(
        [F.col(f"_cdc_o{i}") for i in range(len(items))], [F.col(f"_cdc_b{i}") for i in range(len(items))], items
    )
    both = both.withColumn("_cdc_before", ~has_base | before)
    first, second = F.col("_cdc_rank") == 1, F.col("_cdc_rank") == 2
    per_key = both.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("_cdc_events"),
        F.max(has_base).alias("_cdc_has_base"),
        F.sum(F.when(has_base & F.col("_cdc_before"), 1).otherwise(0)).alias("_cdc_before_n"),
        F.sum(F.when(has_base & ~F.col("_cdc_before"), 1).otherwise(0)).alias("_cdc_late_n"),
        F.max(F.col("_cdc_rank")).alias("_cdc_max_rank"),
        *[F.max(F.when(first, F.col(c))).alias(c) for c in PROVENANCE],
        *[F.max(F.when(first, F.col(f"_cdc_v{j}"))).alias(f"_cdc_w1_{j}") for j in range(len(order_by))],
        *[F.max(F.when(second, F.col(f"_cdc_v{j}"))).alias(f"_cdc_w2_{j}") for j in range(len(order_by))],
        *[F.max(F.col(f"_cdc_bv{j}")).alias(f"_cdc_bv{j}") for j in range(len(order_by))],
        # One stored row per key: every event of the key carries the same one.
        *[F.first(c, ignorenulls=True).alias(OLD_ROW) for c in old_row],
    )

    def same(x: str, y: str) -> Column:
        return functools.reduce(
            operator.and_, [F.col(f"{x}{j}").eqNullSafe(F.col(f"{y}{j}")) for j in range(len(order_by))], F.lit(True)
        )

    # The events ranking before the stored row are the key's first ones (one order), so the winner
    # beats it when any does; the stored row then ranks (events before it) + 1.
    wins = ~F.col("_cdc_has_base") | (F.col("_cdc_before_n") >= 1)
    runner_up_is_event = ~F.col("_cdc_has_base") | (F.col("_cdc_before_n") >= 2)
    tied = F.when(runner_up_is_event, (F.col("_cdc_max_rank") >= 2) & same("_cdc_w1_", "_cdc_w2_")).otherwise(
        same("_cdc_w1_", "_cdc_bv")
    )
    return per_key.select(
        *keys,
        *[F.col(c) for c in PROVENANCE],
        F.coalesce(F.col("_cdc_has_base"), F.lit(False)).alias("_cdc_has_base"),
        wins.alias("_cdc_wins"),
        F.col("_cdc_events"),
        F.col("_cdc_late_n"),
        F.when(tied, 1).otherwise(0).alias("_cdc_tied_n"),
        *[F.col(OLD_ROW) for _ in old_row],
    )


#: A test hook: the merge path (one of :data:`MERGE_PATHS`) for every compaction this process runs
#: whose plan names none -- the conformance suites run their scenarios down each path.
MERGE_PATH_ENV = "CDC_COMPACTION_MERGE_PATH"


def choose_merge_path(plan: Plan, events: int) -> str:
    """``broadcast`` or ``window``: how :func:`run_cdc` merges ``events`` accepted events into the base.

    Broadcast (:func:`broadcast_decisions`) when the events are few -- at most the plan's
    ``broadcast_merge_max_events`` (default :data:`BROADCAST_MERGE_MAX_EVENTS`) and at most the
    base's rows -- or when forced (the plan's ``merge_path``, else :data:`MERGE_PATH_ENV`).  Never,
    even forced, for what a pairwise comparison with one stored row cannot do cheaply:

    * left-out columns (registry ``unchanged``): a value is filled by a window over every event of
      its key, the stored row's replayed sources included, and a late event may fill a stored row
      anew -- the ranking of whole rows does that (:func:`rank_touched_keys`);
    * partitioned tables: a key-only delete goes to the partition its key is in, which the window
      over the key's rows of every touched partition finds (:func:`assign_partitions`); and only
      the touched partitions are read and rewritten there anyway;
    * a rank that is not ``row_number() OVER (... ORDER BY ...)`` (:func:`order_items`).

    Key changes (registry ``old_key``) can: the rule keys them first (:func:`keyed_events`), and
    the retirement of an old key is one more event under that key.
    """
    forced = plan.merge_path or os.environ.get(MERGE_PATH_ENV) or None
    if forced is not None and forced not in MERGE_PATHS:
        source = "its merge_path" if plan.merge_path else f"${MERGE_PATH_ENV}"
        raise PermanentJobError(
            f"{plan.table}: plan {plan.plan_id} asks for merge path {forced!r} ({source}), which is none of "
            f"{', '.join(MERGE_PATHS)}; nothing was written. Unset it or name one of those"
        )
    rule = plan.cdc_rule
    if plan.partition_by is not None or rule.fills or rule.unchanged or order_items(rule.rank) is None:
        return "window"
    if forced is not None:
        return forced
    most = BROADCAST_MERGE_MAX_EVENTS if plan.broadcast_merge_max_events is None else plan.broadcast_merge_max_events
    base_rows = most if plan.base_rows is None else plan.base_rows
    return "broadcast" if events <= min(int(most), int(base_rows)) else "window"


def describe(spark: SparkSession, plan: Plan, phase: str) -> None:
    """Name the Spark jobs of a phase of the compaction (the UI and a profile show it per stage)."""
    set_job_description(spark, f"cdc compaction of {plan.table}: {phase}")


def keyed_events(spark: SparkSession, fresh: DataFrame, keyed_sql: str) -> DataFrame:
    """The accepted events keyed as the rule ranks them (registry ``old_key``): the rule's ``keyed_events``.

    A delete by old key moves to that key; a key change adds a delete of its old key. The
    statement is the one every view applies, over a temporary view of the events.
    """
    fresh.createOrReplaceTempView(FRESH_VIEW)
    if files.is_connect(spark):
        # Over Spark Connect the statement is its SQL text, analysed again each time it runs: the view
        # stays with the job's own session (the engine opens one per attempt and closes it, views and all).
        return spark.sql(keyed_sql)
    try:
        return spark.sql(keyed_sql)
    finally:
        # A classic session's plan keeps what it read: the view can go once Spark has analysed the statement.
        spark.catalog.dropTempView(FRESH_VIEW)


# ------------------------------------------------------------- partitioned tables
def _keys(pk: list[str]) -> list[Column]:
    return [F.col(f"`{c}`") for c in pk]


def event_partitions(events: DataFrame, partition_column: str, partition_sql: str) -> DataFrame:
    """The partitions (``_cdc_partition``) that events with a partition value of their own go to."""
    return (
        events.filter(F.col(f"`{partition_column}`").isNotNull())
        .select(F.expr(partition_sql).alias(PARTITION_COLUMN))
        .distinct()
    )


def partitions_of_keys(base_keys: DataFrame, events: DataFrame, pk: list[str], broadcast: bool = False) -> DataFrame:
    """The partitions of base rows whose key is among ``events``' keys.

    ``base_keys`` needs only the key columns and ``_cdc_partition``.  This is how an event that
    does not carry the partition column (a key-only delete), or whose key moves to another
    partition, finds the partition its key lives in now. ``broadcast``: the events are few
    (as the key lookup's): their keys go to every task, the base keys are not shuffled.
    """
    keys = events.select(*_keys(pk)).distinct()
    return key_join(base_keys, keys, pk, "left_semi", broadcast=broadcast).select(PARTITION_COLUMN).distinct()


def touched_partitions(
    base_keys: DataFrame,
    events: DataFrame,
    pk: list[str],
    partition_column: str,
    partition_sql: str,
    known_keys: DataFrame | None = None,
    broadcast: bool = False,
    own_partitions: bool = True,
) -> DataFrame:
    """Every data partition a compaction of ``events`` may change: where they go, and where their keys are.

    An event without a partition value whose key is not known (``known_keys``: the base's
    keys, tombstones included; ``base_keys`` when not given) goes to the NULL sentinel
    partition, so that one is touched too. ``broadcast``: see :func:`partitions_of_keys`.
    ``own_partitions`` False: leave out the partitions the events name themselves
    (:func:`event_partitions`), because the caller has them already (:func:`event_key_summary`).
    """
    known = base_keys if known_keys is None else known_keys
    orphans = events.filter(F.col(f"`{partition_column}`").isNull())
    # The orphans' known keys first (the index on the streamed side, the orphans' keys built), then the
    # orphans without one: the whole index is never a join's build side. Anti-joined with the index
    # directly, adaptive execution broadcast the index's keys by their compressed shuffle size and
    # ran out of memory building them (20M scattered keys, bench/partitioned.py).
    found = key_join(known.select(*_keys(pk)), orphans.select(*_keys(pk)).distinct(), pk, "left_semi", broadcast)
    unplaced = key_join(orphans, found, pk, "left_anti", broadcast).select(
        F.expr(partition_sql).alias(PARTITION_COLUMN)
    )
    found_parts = partitions_of_keys(base_keys, events, pk, broadcast).unionByName(unplaced)
    if own_partitions:
        found_parts = event_partitions(events, partition_column, partition_sql).unionByName(found_parts)
    return found_parts.distinct()


#: Up to this many events, their distinct first-key values go to the driver, which cuts the key ranges
#: itself (:func:`event_key_summary`): one small Spark job that also finds the events' own partitions.
DRIVER_RANGES_MAX = 200_000


def event_key_summary(
    events: DataFrame, pk: list[str], partition_column: str, partition_sql: str, rows: int | None
) -> tuple[Column | None, list[str]] | None:
    """The key-range filter of :func:`key_range_filter` and the events' own partitions, in one Spark job.

    For up to :data:`DRIVER_RANGES_MAX` events (``rows``) with a first key column of a type in
    ``_RANGE_TYPES``: the distinct first-key values and the partitions the events name
    (:func:`event_partitions`) are collected together, and the driver cuts the values into
    ranges at the widest gaps (:func:`key_ranges`; strings: one range). None when that does
    not apply: the caller computes both in Spark as before.
    """
    first = pk[0]
    kind = events.schema[first].dataType
    if rows is None or rows > DRIVER_RANGES_MAX or not isinstance(kind, _RANGE_TYPES):
        return None
    col = F.col(f"`{first}`")
    keys = events.select(F.lit(0).alias("_cdc_what"), col.alias("_cdc_k"), F.lit(None).cast("string").alias("_cdc_p"))
    parts = event_partitions(events, partition_column, partition_sql).select(
        F.lit(1).alias("_cdc_what"), F.lit(None).cast(kind).alias("_cdc_k"), F.col(PARTITION_COLUMN).alias("_cdc_p")
    )
    got = keys.unionByName(parts).distinct().collect()
    own = sorted({r["_cdc_p"] for r in got if r["_cdc_what"] == 1})
    return _cut_on_driver(col, kind, [r["_cdc_k"] for r in got if r["_cdc_what"] == 0]), own


def _cut_on_driver(col: Column, kind: T.DataType, keys: list[Any]) -> Column | None:
    """The key-range filter over the distinct first-key values ``keys`` (None among them: a NULL key), cut here."""
    values = sorted(k for k in keys if k is not None)
    # Strings have no width between them to cut at: one range, [min, max], as key_range_filter does.
    span = [(values[0], values[-1])] if values else []
    ranges = span if isinstance(kind, T.StringType) else key_ranges(values)
    conds = [col.between(F.lit(lo), F.lit(hi)) for lo, hi in ranges]
    if any(k is None for k in keys):
        conds.append(col.isNull())
    return functools.reduce(operator.or_, conds) if conds else None


def assign_partitions(ranked_events: DataFrame, pk: list[str], partition_column: str, partition_sql: str) -> DataFrame:
    """Set ``_cdc_partition`` of every event to the partition it is written to if it wins.

    Base rows carry their partition, increment events carry NULL.  An event with a partition
    value goes to that partition; one without (a key-only delete) stays where its key was in
    the base, so that a delete does not move its key; a key never seen goes to the NULL
    sentinel ``partition_sql`` yields.
    """
    in_base = F.max(F.col(PARTITION_COLUMN)).over(Window.partitionBy(*_keys(pk)))
    missing = F.col(f"`{partition_column}`").isNull() & in_base.isNotNull()
    return ranked_events.withColumn(PARTITION_COLUMN, F.when(missing, in_base).otherwise(F.expr(partition_sql)))


def read_partitions(spark: SparkSession, schema_ddl: str, partitions: dict[str, str]) -> DataFrame:
    """The rows of the given partitions ({value: location}), with ``_cdc_partition``.

    Partitions live in the version directory that last rewrote them, so they are read in one
    scan per version directory, and Spark's partition discovery supplies the value (it
    un-escapes the directory names; the schema keeps the values strings) under the directories'
    column name: ``cdc_partition``, or ``_cdc_partition`` in versions written before, renamed.
    """
    schema = f"{schema_ddl}, {PARTITION_DDL}"
    if not partitions:
        return spark.createDataFrame([], schema)
    by_parent: dict[tuple[str, str], list[str]] = {}
    odd: dict[str, str] = {}
    for value, location in sorted(partitions.items()):
        loc = location.rstrip("/")
        name = posixpath.basename(loc)
        column = partition_dir_column(name)
        if column is not None and partition_dir_value(name) == value:
            by_parent.setdefault((posixpath.dirname(loc), column), []).append(loc)
        else:
            odd[value] = loc  # registered somewhere else (by hand): read it on its own
    frames = [
        spark.read.schema(f"{schema_ddl}, `{column}` string")
        .option("basePath", parent)
        .parquet(*locs)
        .withColumnRenamed(column, PARTITION_COLUMN)
        for (parent, column), locs in by_parent.items()
    ]
    frames += [
        spark.read.schema(schema_ddl).parquet(loc).withColumn(PARTITION_COLUMN, F.lit(value))
        for value, loc in odd.items()
    ]
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


#: Key types whose min/max round-trip exactly through a Python literal, so a key-range filter on them
#: is safe to push down (floats are left out: NaN orders last in Spark; timestamps: driver time zones).
_RANGE_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.StringType, T.DateType)


#: Up to this many events, the key-range filter is cut into up to :data:`MAX_KEY_RANGES` ranges at the widest
#: gaps between their keys (updates of old ids and inserts of new ones are two narrow ranges, not one wide one).
KEY_RANGE_SPLIT_MAX = 2_000_000
MAX_KEY_RANGES = 16


def ranges_between(lo: Any, hi: Any, gaps: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """``[lo, hi]`` without the open gaps ``(a, b)`` between neighbouring keys: the ranges left."""
    out, start = [], lo
    for a, b in sorted(gaps):
        out.append((start, a))
        start = b
    return [*out, (start, hi)]


def key_ranges(keys: list[Any], max_ranges: int = MAX_KEY_RANGES) -> list[tuple[Any, Any]]:
    """Sorted, distinct ``keys`` (integers or dates) as at most ``max_ranges`` ranges covering them all.

    Cut at the ``max_ranges - 1`` widest gaps between neighbours: of all ways to cover the keys
    with that many ranges, the one that covers the fewest values in between. (The job computes the
    same gaps in Spark: :func:`key_range_filter`.)
    """
    if not keys:
        return []
    pairs = sorted(itertools.pairwise(keys), key=lambda p: p[1] - p[0], reverse=True)
    return ranges_between(keys[0], keys[-1], pairs[: max_ranges - 1])


def key_range_filter(events: DataFrame, pk: list[str], rows: int | None = None) -> Column | None:
    """A filter on the first key column that every base key equal to one of ``events``' keys passes.

    ``lo <= k <= hi`` over the events' first key column -- for integer and date keys of up to
    :data:`KEY_RANGE_SPLIT_MAX` events, cut at the widest gaps into up to :data:`MAX_KEY_RANGES`
    ranges (:func:`key_ranges`) -- ``OR k IS NULL`` if an event has a NULL there (registry
    ``nullable_key``). Pushed down to Parquet, it skips the row groups of the sorted key index
    (README, "Key index") whose min/max lie outside: changed keys that cluster (ids growing with
    time) read a few row groups, scattered ones read the whole, narrow, index. Spark applies the
    filter to the rows too, so it is exact whatever the pruning. None: no filter (a key type
    whose literal may not round-trip, or no events).

    ``rows``: the number of ``events`` if the caller knows it already (counted as they were
    written or read). Up to :data:`DRIVER_RANGES_MAX`, their distinct values are collected and
    the ranges cut on the driver; above, when it allows a split, the range and the gaps are one
    Spark job, not two.
    """
    first = pk[0]
    kind = events.schema[first].dataType
    if not isinstance(kind, _RANGE_TYPES):
        return None
    col = F.col(f"`{first}`")
    if rows == 0:
        return None
    if rows is not None and rows <= DRIVER_RANGES_MAX:
        # Known to be few: their distinct values in one small job (two stages), the ranges cut here.
        return _cut_on_driver(col, kind, [r[0] for r in events.select(col).distinct().collect()])
    summary = events.agg(
        F.min(col).alias("lo"), F.max(col).alias("hi"), F.count(F.lit(1)).alias("n"), F.count(col).alias("c")
    )
    splits = not isinstance(kind, T.StringType)
    top: list[Any] | None = None
    if splits and rows is not None and rows <= KEY_RANGE_SPLIT_MAX:
        # Known to be few: the summary and the gaps in one job (a row each, told apart by _cdc_gap NULL).
        both = _widest_gaps(events, col, kind).unionByName(
            summary.select(
                F.col("lo").alias("_cdc_a"),
                F.col("hi").alias("_cdc_b"),
                F.lit(None).cast("long").alias("_cdc_gap"),
                "n",
                "c",
            ),
            allowMissingColumns=True,
        )
        got = both.collect()
        row = next((r for r in got if r["_cdc_gap"] is None), None)
        top = [r for r in got if r["_cdc_gap"] is not None]
        if row is not None:
            row = {"lo": row["_cdc_a"], "hi": row["_cdc_b"], "n": row["n"], "c": row["c"]}
    else:
        row = summary.first()
    if row is None or int(row["n"]) == 0:
        return None
    ranges = [(row["lo"], row["hi"])] if row["lo"] is not None else []
    if ranges and splits and int(row["n"]) <= KEY_RANGE_SPLIT_MAX:
        if top is None:
            top = _widest_gaps(events, col, kind).collect()
        ranges = ranges_between(row["lo"], row["hi"], [(r["_cdc_a"], r["_cdc_b"]) for r in top])
    conds = [col.between(F.lit(lo), F.lit(hi)) for lo, hi in ranges]
    if int(row["c"]) < int(row["n"]):
        conds.append(col.isNull())
    return functools.reduce(operator.or_, conds)


def _widest_gaps(events: DataFrame, col: Column, kind: T.DataType) -> DataFrame:
    """The :data:`MAX_KEY_RANGES` - 1 widest gaps (``_cdc_a``, ``_cdc_b``, ``_cdc_gap``) between neighbouring
    distinct non-NULL values of ``col``, computed where the keys are (one sort)."""
    keys = events.select(col.alias("_cdc_b")).where(F.col("_cdc_b").isNotNull()).distinct()
    keys = keys.withColumn("_cdc_a", F.lag("_cdc_b").over(Window.orderBy("_cdc_b"))).where(F.col("_cdc_a").isNotNull())
    gap = F.datediff("_cdc_b", "_cdc_a") if isinstance(kind, T.DateType) else F.col("_cdc_b") - F.col("_cdc_a")
    return (
        keys.withColumn("_cdc_gap", gap.cast("long"))
        .orderBy(F.desc("_cdc_gap"))
        .limit(MAX_KEY_RANGES - 1)
        .select("_cdc_a", "_cdc_b", "_cdc_gap")
    )


def key_sources(base_map: Mapping[str, str], index: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Where to read each base partition's keys: its index if it has one, else its data; and those without.

    A partition without an index (a version written before the index existed, or one an erase
    rewrote) is read as before -- its key columns -- so a missing index is slower, never wrong.
    """
    sources = {v: index.get(v) or loc for v, loc in base_map.items()}
    return sources, sorted(v for v in base_map if not index.get(v))


def index_frame(written: DataFrame, pk: list[str]) -> DataFrame:
    """The key index of written partitions: key columns and ``_cdc_partition``, sorted by key per partition.

    One task per partition value (a file per partition); the sort within partitions is by
    ``_cdc_partition`` first, which is the order ``partitionBy`` needs, so the write keeps it.
    """
    return (
        written.select(*_keys(pk), F.col(PARTITION_COLUMN))
        .repartition(F.col(PARTITION_COLUMN))
        .sortWithinPartitions(F.col(PARTITION_COLUMN), *_keys(pk))
    )


def written_tally_columns(is_delete: Column, tombstones: bool) -> list[Column]:
    """Rows and misplaced rows of one output, as aggregates to observe (``DataFrame.observe``) as it is written.

    ``misplaced`` counts deletes among the visible rows (``tombstones`` False) or upserts among the
    tombstones (True); a NULL ``is_delete`` is neither.  Observed on the DataFrame the writer
    consumes, the counts are of exactly the rows written, without reading the output back.
    """
    wrong = ~is_delete if tombstones else is_delete
    return [
        F.count(F.lit(1)).alias("rows"),
        F.coalesce(F.sum(F.when(wrong, 1).otherwise(0)), F.lit(0)).alias("misplaced"),
    ]


def duplicate_keys(
    written_keys: DataFrame, pk: list[str], touched_keys: DataFrame | None = None, touched_distinct: bool = False
) -> int:
    """Keys found more than once in ``written_keys`` (the key columns of the visible rows and tombstones).

    With ``touched_keys`` only those keys are checked (a broadcast join first, so only they
    are grouped): the keys this compaction ranked.  That is enough by induction: the parent
    version's keys were unique (checked when it was committed), its untouched rows are copied as
    they are, and a copied row read twice would not reconcile with the parent's row count
    (validate holds ``base_rows`` against it).  NULL key parts equal NULL, as in the rule.
    ``touched_distinct``: see :func:`duplicate_key_groups`.
    """
    return duplicate_key_groups(written_keys, pk, touched_keys, touched_distinct).count()


def duplicate_key_groups(
    written_keys: DataFrame, pk: list[str], touched_keys: DataFrame | None = None, touched_distinct: bool = False
) -> DataFrame:
    """The keys :func:`duplicate_keys` counts, one row each, to count together with other checks in one job.

    ``touched_distinct``: the caller vouches that ``touched_keys`` holds each key once (the merge's
    one row per key). The written keys are then matched by a broadcast left join and a flag, which
    Spark keeps above the union of the visible rows and tombstones: one broadcast of the touched
    keys, where a semi-join is pushed into each side of the union and builds it twice (a Spark
    job each). Each written row matches one touched key at most, so the rows kept are the
    semi-join's.
    """
    keys = written_keys.select(*_keys(pk))
    if touched_keys is not None and touched_distinct:
        flagged = touched_keys.select(
            *[F.col(f"`{c}`").alias(f"_cdc_k{i}") for i, c in enumerate(pk)], F.lit(True).alias("_cdc_touched")
        )
        cond = functools.reduce(
            operator.and_, [F.col(f"`{c}`").eqNullSafe(F.col(f"_cdc_k{i}")) for i, c in enumerate(pk)]
        )
        keys = keys.join(F.broadcast(flagged), cond, "left").where(F.col("_cdc_touched")).select(*_keys(pk))
    elif touched_keys is not None:
        keys = key_join(keys, touched_keys, pk, "left_semi", broadcast=True)
    return keys.groupBy(*_keys(pk)).count().filter(F.col("count") > 1).select(*_keys(pk))


def with_rank_flags(ranked_events: DataFrame, pk: list[str], order_by: list[str]) -> DataFrame:
    """Flag how each key's ranking went, for the stats (``tied_winners``, ``late_events``).

    ``_cdc_tied`` is 1 on a key's runner-up (rank 2) when its ``order_by`` values equal the
    winner's: the rule's last resort, file and row order, decided the winner.  ``_cdc_late``
    is 1 on an event (``_cdc_src`` 1) ranked below its key's base row: it arrived after a newer
    change of its key had been compacted already.  Needs ``_cdc_src`` and ``_cdc_rank``.
    """
    by_key = Window.partitionBy(*_keys(pk))
    in_order = by_key.orderBy(F.col("_cdc_rank"))
    same = functools.reduce(
        operator.and_, [F.col(f"`{c}`").eqNullSafe(F.lag(F.col(f"`{c}`")).over(in_order)) for c in order_by]
    )
    base_rank = F.min(F.when(F.col("_cdc_src") == 0, F.col("_cdc_rank"))).over(by_key)
    return ranked_events.withColumn("_cdc_tied", F.when((F.col("_cdc_rank") == 2) & same, 1).otherwise(0)).withColumn(
        "_cdc_late", F.when((F.col("_cdc_src") == 1) & (F.col("_cdc_rank") > base_rank), 1).otherwise(0)
    )


# ------------------------------------------------------------- the change feed
#: The stored row a key had before this compaction (registry ``change_feed``): a struct of the registry's
#: columns on the base's visible rows, NULL on its tombstones and on events; carried to the key's winner.
OLD_ROW = "_cdc_old"

#: Above this many accepted events the tombstones' and the change feed's rows are filtered and built in
#: parallel, then shuffled to the task that writes each one file (:func:`run_cdc`); at or below it the task
#: that writes reads the cached winners itself, which saves a stage.
ONE_FILE_SHUFFLE_MIN_EVENTS = 100_000


def with_old_row(
    base_data: DataFrame, base_tomb: DataFrame, columns: list[str], is_delete: Column
) -> tuple[DataFrame, DataFrame]:
    """The base's visible rows with :data:`OLD_ROW` (their registry columns as stored), its tombstones with NULL.

    A tombstone is no visible row: a key whose stored row is one had no row before this commit
    (``is_delete`` tells them apart where a layout-1 version keeps them among the data). The
    struct is taken before anything rewrites a stored row (partial rows are left out again and
    filled anew by :func:`stored_events`): it is the row readers saw.
    """
    row = F.struct(*[F.col(f"`{c}`") for c in columns])
    data = base_data.withColumn(OLD_ROW, F.when(F.coalesce(~is_delete, F.lit(False)), row))
    return data, base_tomb.withColumn(OLD_ROW, F.lit(None).cast(data.schema[OLD_ROW].dataType))


def old_row_type(spark: SparkSession, base_schema: str, columns: list[str]) -> T.DataType:
    """The type of :data:`OLD_ROW` over a base of ``base_schema`` (no Spark job: an empty frame's schema)."""
    empty = spark.createDataFrame([], base_schema)
    return empty.select(F.struct(*[F.col(f"`{c}`") for c in columns]).alias(OLD_ROW)).schema[OLD_ROW].dataType


def without_old_row(events: DataFrame, old_type: T.DataType) -> DataFrame:
    """``events`` with a NULL :data:`OLD_ROW` (``old_type``): an event is no stored row."""
    return events.withColumn(OLD_ROW, F.lit(None).cast(old_type))


def carry_old_row(
    ranked_rows: DataFrame, pk: list[str], stored_row: tuple[list[str], Column] | None = None
) -> DataFrame:
    """Every ranked row of a key with the key's stored visible row (:data:`OLD_ROW`; one per key at most).

    Over the key, as the rank is: no shuffle of its own where it follows the ranking.  ``stored_row``
    ``(columns, is_delete)``: the rows carry no :data:`OLD_ROW` (:func:`with_old_row`); it is taken
    here from the key's stored row (``_cdc_src`` 0) that is no delete, after the shuffle -- so the
    ranking's shuffle carries each stored row once, not twice (the feed's cost on the window path,
    which shuffles the whole table).  Only where nothing rewrites a stored row on its way through
    the ranking (:func:`late_old_row`).
    """
    by_key = Window.partitionBy(*_keys(pk))
    old = F.col(OLD_ROW)
    if stored_row is not None:
        columns, is_delete = stored_row
        visible = (F.col("_cdc_src") == 0) & F.coalesce(~is_delete, F.lit(False))
        old = F.when(visible, F.struct(*[F.col(f"`{c}`") for c in columns]))
    return ranked_rows.withColumn(OLD_ROW, F.first(old, ignorenulls=True).over(by_key))


def late_old_row(fills: Mapping[str, str], unchanged: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether a stored row reaches the ranking's window as readers saw it, so :func:`carry_old_row` may
    take it there: not when left-out columns (registry ``unchanged``) are filled, which rewrites it."""
    return not fills and not unchanged


def feed_rows(pairs: DataFrame, columns: list[str], new_visible: Column, seq: int) -> DataFrame:
    """The net change of every key in ``pairs`` as ``<t>_changes`` rows of commit ``seq``.

    ``pairs``: one row per key holding its new row (the registry's ``columns``; visible where
    ``new_visible``) and its old one (:data:`OLD_ROW`, NULL if the key had no visible row).
    ``insert`` (no old, new visible), ``delete`` (old, no new), ``update_before`` and
    ``update_after`` (both, differing in any column; NULL equals NULL, as do two NaN); equal rows
    give nothing. Columns: the registry's in its order, ``_change_type``, ``_commit_version``
    (bigint) and ``_commit_seq`` (int), both ``seq``.
    """
    old = F.col(OLD_ROW)
    has_old = old.isNotNull()
    same = functools.reduce(operator.and_, [F.col(f"`{c}`").eqNullSafe(old.getField(c)) for c in columns], F.lit(True))
    kinds = (
        F.when(~has_old & new_visible, F.array(F.lit("insert")))
        .when(has_old & ~new_visible, F.array(F.lit("delete")))
        .when(has_old & new_visible & ~same, F.array(F.lit("update_before"), F.lit("update_after")))
    )
    exploded = pairs.select(*[F.col(f"`{c}`") for c in columns], old, F.explode(kinds).alias(CHANGE_TYPE))
    from_old = F.col(CHANGE_TYPE).isin("delete", "update_before")
    return exploded.select(
        *[F.when(from_old, old.getField(c)).otherwise(F.col(f"`{c}`")).alias(c) for c in columns],
        F.col(CHANGE_TYPE),
        F.lit(seq).cast("bigint").alias(COMMIT_VERSION),
        F.lit(seq).cast("int").alias(SEQ_COLUMN),
    )


def _sourced(base: DataFrame, events: DataFrame, unchanged: Mapping[str, Mapping[str, Any]] | None = None) -> DataFrame:
    """Base rows (``_cdc_src`` 0) and events (1) together, as :func:`with_rank_flags` needs them.

    With ``unchanged``, base rows as :func:`stored_events` gives them (replayed events: 2).
    """
    return stored_events(base, unchanged or {}).unionByName(events.withColumn("_cdc_src", F.lit(1)))


def rank_tally_columns() -> list[Column]:
    """The sums of :func:`with_rank_flags`' flags, as the stats name them."""
    return [
        F.coalesce(F.sum("_cdc_tied"), F.lit(0)).alias("tied_winners"),
        F.coalesce(F.sum("_cdc_late"), F.lit(0)).alias("late_events"),
    ]


def read_partitioned(spark: SparkSession, schema_ddl: str, path: str) -> DataFrame:
    """What the job wrote partitioned under ``path`` (``cdc_partition=<v>`` directories), with ``_cdc_partition``.

    Spark's partition discovery names the column after the directories: read as ``cdc_partition``
    and renamed, or the schema's ``_cdc_partition`` would match no directory and read back NULL.
    """
    return (
        spark.read.schema(f"{schema_ddl}, `{PARTITION_DIR_COLUMN}` string")
        .parquet(path)
        .withColumnRenamed(PARTITION_DIR_COLUMN, PARTITION_COLUMN)
    )


def _written_partitions(files: list[dict[str, Any]], data_dir: str, rel: str = DATA_DIR) -> dict[str, str]:
    """Partition value -> directory of every partition the job wrote under ``data_dir`` (files named ``<rel>/…``)."""
    dirs = {f["name"].split("/")[1] for f in files if f["name"].startswith(f"{rel}/") and f["name"].count("/") > 1}
    return {value: f"{data_dir.rstrip('/')}/{d}" for d in sorted(dirs) if (value := partition_dir_value(d)) is not None}


def write_index(
    spark: SparkSession, written: DataFrame, pk: list[str], index_out: str, mode: str, compression: str
) -> dict[str, Any]:
    """Write the key index of the partitions in ``written`` (as re-read from storage) and check it.

    Returns ``index_rows`` (rows per partition, read back), ``partition_rows`` (the data's rows per
    partition, read back: counted by the same Spark job) and ``index_mismatches``: keys (with
    their partition) not once in the index and once in the data (must be 0).
    """
    # Directories named cdc_partition=<v>, as the data's (PARTITION_DIR_COLUMN: Hive skips names with a leading _).
    (
        index_frame(written, pk)
        .withColumnRenamed(PARTITION_COLUMN, PARTITION_DIR_COLUMN)
        .write.mode(mode)
        .option("compression", compression)
        .option("parquet.block.size", INDEX_ROW_GROUP_BYTES)
        .partitionBy(PARTITION_DIR_COLUMN)
        .parquet(index_out)
    )
    key_ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in written.schema if f.name in pk)
    back = read_partitioned(spark, key_ddl, index_out)
    # One Spark job: per key and partition, how often it is in the index and in the data (1 and 1).
    where = [*_keys(pk), F.col(PARTITION_COLUMN)]
    both = back.select(*where, F.lit(1).alias("_cdc_i"), F.lit(0).alias("_cdc_d")).unionByName(
        written.select(*where, F.lit(0).alias("_cdc_i"), F.lit(1).alias("_cdc_d"))
    )
    per_key = both.groupBy(*where).agg(F.sum("_cdc_i").alias("_cdc_i"), F.sum("_cdc_d").alias("_cdc_d"))
    per_partition = (
        per_key.groupBy(PARTITION_COLUMN)
        .agg(
            F.sum("_cdc_i").alias("rows"),
            F.sum("_cdc_d").alias("data_rows"),
            F.sum(F.when(F.col("_cdc_i") != F.col("_cdc_d"), 1).otherwise(0)).alias("bad"),
        )
        .collect()
    )
    rows = {r[PARTITION_COLUMN]: int(r["rows"]) for r in sorted(per_partition) if int(r["rows"])}
    data_rows = {r[PARTITION_COLUMN]: int(r["data_rows"]) for r in sorted(per_partition) if int(r["data_rows"])}
    mismatches = sum(int(r["bad"]) for r in per_partition)
    return {"index_rows": rows, "partition_rows": data_rows, "index_mismatches": int(mismatches)}


def read_base(
    spark: SparkSession, plan: Plan, schema: str, columns: list[str], is_delete_sql: str
) -> tuple[DataFrame, DataFrame]:
    """(visible rows, tombstones) of the live version of an unpartitioned table.

    A version of layout 1 (written before tombstones moved out of the data directory)
    holds both in one directory: they are told apart by the rule's ``is_delete``.
    ``columns``: the registry's and the mode's hidden ones (a version written before these
    existed reads NULL there).
    """
    cols = [F.col(f"`{c}`") for c in [*columns, *META_COLUMNS]]
    data = files.read_version(spark, schema, plan.base_location, plan.base_rows).select(*cols)
    tomb_loc = plan.base_tombstones_location
    if tomb_loc:
        return data, files.read_version(spark, schema, tomb_loc, plan.base_tombstones).select(*cols)
    return data.filter(~F.expr(is_delete_sql)), data.filter(F.expr(is_delete_sql))


def run_cdc(spark: SparkSession, plan: Plan | Mapping[str, Any], attempt: str | None = None) -> dict[str, Any]:
    """The cdc compaction of ``plan`` into the attempt's own directory (called by ``compact.run``).

    The directory gets ``data/`` (the visible rows) and ``tombstones/`` (the delete winners
    within their retention) and, last, the stats file; the stats are returned as written
    (:meth:`JobStats.to_dict <cdc_compaction.job.contract.JobStats.to_dict>`).
    """
    plan = as_plan(plan)
    # Lists, not the plan's tuples: PySpark's join takes a list of key columns.
    columns = list(plan.column_names)
    rule = plan.cdc_rule
    is_delete = F.expr(rule.is_delete)
    pk = list(plan.primary_key)
    ingested_at = parse_ts(plan.ingested_at)
    cutoff = parse_ts(plan.tombstone_cutoff)
    out, quarantine = attempt_locations(plan, attempt)
    data_out, tomb_out = f"{out}/{DATA_DIR}", f"{out}/{TOMBSTONES_DIR}"
    mode = "error" if attempt else "overwrite"  # "error": errorifexists, the spelling Spark Connect knows too
    # Partitioned tables (registry partition_by): only the data partitions the increments touch
    # are read and rewritten; the plan lists the live version's partitions as {value: location}.
    part = plan.partition_by
    base_map: dict[str, str] = plan.base_partitions or {}
    # Hidden bookkeeping of left-out columns (registry unchanged) after the registry's columns.
    book = rule.bookkeeping
    stored = [*columns, *(n for n, _ in book)]
    book_ddl = "".join(f", `{n}` {kind}" for n, kind in book)
    base_schema = f"{plan.schema_ddl}{book_ddl}, {META_DDL}"
    unchanged = rule.unchanged
    # A live version of layout 1 keeps its tombstones inside its data (partitions): read it all once.
    old_layout = int(plan.base_layout) < LAYOUT
    touched: list[str] = []
    # registry change_feed: the commit's net change is written beside the version, from the merge itself.
    feed_on = bool(plan.change_feed)
    log.info("compacting %s (plan %s): %d files", plan.table, plan.plan_id, len(plan.files))

    if part is None:
        base_data, base_tomb = read_base(spark, plan, base_schema, stored, rule.is_delete)
        # As read: the window path takes the feed's stored rows after its shuffle (carry_old_row).
        stored_data, stored_tomb = base_data, base_tomb
        if feed_on:
            base_data, base_tomb = with_old_row(base_data, base_tomb, columns, is_delete)
    else:
        # Key columns only: finding the keys' partitions must not read whole rows. From the key index
        # where the live version has one (README, "Key index"), else from the partitions' key columns.
        key_map, unindexed = key_sources(base_map, plan.base_index or {})
        # A directory per partition: listed by the driver where the storage allows (no listing job).
        listed = list_on_driver(spark, [*key_map.values(), *base_map.values()])
        base_keys = read_partitions(spark, base_schema, key_map).select(*_keys(pk), F.col(PARTITION_COLUMN))
        every_base_key = base_keys
        key_lookup: dict[str, Any] = {
            "indexed_partitions": len(base_map) - len(unindexed),
            "scanned_partitions": len(unindexed),
            "key_range": False,
            "listed_on_driver": listed,
        }
        tomb_loc = plan.base_tombstones_location
        tomb_cols = [F.col(f"`{c}`") for c in [*stored, *META_COLUMNS, PARTITION_COLUMN]]
        if tomb_loc and not old_layout:
            base_tomb = spark.read.schema(f"{base_schema}, {PARTITION_DDL}").parquet(tomb_loc).select(*tomb_cols)
        else:
            base_tomb = spark.createDataFrame([], f"{base_schema}, {PARTITION_DDL}")

    # The planned files in whatever form they landed (registry format/envelope; job/decode.py).
    # Not cached: re-reading the planned files (only the columns each use needs) is cheaper than
    # building an in-memory copy of every event, which a large increment spills anyway.
    events = decode.read_events(spark, plan, columns)
    classified = decode.classify(events.frame, rule.reject_reason)
    cached: list[DataFrame] = []
    # Counts the tombstones that expire as they are written.
    obs_tomb = Observation("cdc_compaction_tombstones")
    # Counts ties and late events as the full ranking runs (the key lookup counts them on its cache).
    obs_ranks = Observation("cdc_compaction_ranks")
    # Count the rows written and the misplaced ones as they are written: no re-read of the output.
    obs_data = Observation("cdc_compaction_written_data")
    obs_written_tomb = Observation("cdc_compaction_written_tombstones")
    # The keys the key lookup ranked: the only ones that can occur twice (see duplicate_keys).
    touched_keys: DataFrame | None = None
    rank_tallies: dict[str, int] = {}
    try:
        # One pass over the events counts them all and the refused ones by reason and file (NULL: accepted).
        describe(spark, plan, "read and classify the events")
        counts = classified.groupBy("_cdc_reject_reason", "_cdc_increment", "_cdc_file").count().collect()
        increment_rows = sum(int(r["count"]) for r in counts)
        reasons: dict[str, int] = {}
        by_file: dict[str, int] = {}
        for r in counts:
            if r["_cdc_reject_reason"] is None:
                continue
            reasons[r["_cdc_reject_reason"]] = reasons.get(r["_cdc_reject_reason"], 0) + int(r["count"])
            where = f"{r['_cdc_increment']}/{r['_cdc_file']}"
            by_file[where] = by_file.get(where, 0) + int(r["count"])
        rejected_rows = sum(reasons.values())
        # Tombstones, heartbeats, transaction records: counted by the read above, never compacted.
        skipped = events.skipped()
        if rejected_rows:
            describe(spark, plan, "quarantine the refused events")
            rejected(classified, plan.plan_id).write.mode(mode).parquet(quarantine)
        fresh = accepted(classified, ingested_at)
        retired_keys = 0
        if rule.keyed_events:
            # Key changes (registry old_key): deletes by old key under that key, and each key change
            # once more as a delete of its old key -- the rule's keyed_events, as the views apply it.
            fresh = keyed_events(spark, fresh, rule.keyed_events)
            # The rows keying added (one per key change): ranked like events, so counted like them.
            describe(spark, plan, "key the events (old_key)")
            retired_keys = fresh.count() - (increment_rows - rejected_rows)
        fills = rule.fills
        if book:
            # Events carry no bookkeeping of their own: the fills compute it (with_fills).
            fresh = fresh.select("*", *[F.lit(None).cast(kind).alias(n) for n, kind in book])
        if feed_on:
            # An event is no stored row: its key's (if any) reaches it through the ranking (carry_old_row).
            fresh = without_old_row(fresh, old_row_type(spark, base_schema, columns))
        # The change feed: each touched key's new row (registry columns) and its old one (OLD_ROW).
        pairs: DataFrame | None = None

        # Few events (the usual hourly run): rank only the keys they touch; see rank_touched_keys.
        # Not when the events outnumber the base (a first load): one ranking of every row is cheaper then.
        lookup_max = int(KEY_LOOKUP_MAX_EVENTS if plan.key_lookup_max_events is None else plan.key_lookup_max_events)
        base_rows = lookup_max if plan.base_rows is None else plan.base_rows
        lookup = part is None and increment_rows - rejected_rows <= min(lookup_max, base_rows)
        merge_path = choose_merge_path(plan, increment_rows - rejected_rows + retired_keys)
        lookup = lookup or merge_path == "broadcast"
        lookup_superseded = 0
        base_read: int | None = None
        order_by = list(plan.order_by or columns)
        if merge_path == "broadcast":
            # Events ranked alone, the base streamed past their winners (broadcast_decisions): no base row is
            # shuffled. No fills here (choose_merge_path), so the winners are the events as they came.
            describe(spark, plan, "merge (broadcast): rank the events, compare with their keys' stored rows")
            decisions = broadcast_decisions(
                base_data.unionByName(base_tomb), fresh, pk, order_by, rule.rank, order_items(rule.rank) or []
            ).persist()
            cached.append(decisions)
            wins, has_base = F.col("_cdc_wins"), F.col("_cdc_has_base")
            tally = decisions.agg(
                # Superseded: every event but a winning one, and each stored row a winner beat.
                F.coalesce(
                    F.sum(
                        F.col("_cdc_events") - F.when(wins, 1).otherwise(0) + F.when(wins & has_base, 1).otherwise(0)
                    ),
                    F.lit(0),
                ).alias("s"),
                F.coalesce(F.sum("_cdc_tied_n"), F.lit(0)).alias("tied_winners"),
                F.coalesce(F.sum("_cdc_late_n"), F.lit(0)).alias("late_events"),
            ).first()
            lookup_superseded = int(tally["s"])
            touched_keys = decisions.select(*_keys(pk))
            rank_tallies = {"tied_winners": int(tally["tied_winners"]), "late_events": int(tally["late_events"])}
            losers = decisions.filter(wins & has_base).select(*_keys(pk))
            # With the change feed each winner takes its key's stored row (OLD_ROW) from the decisions.
            fresh_winners = winning_events(fresh, decisions.filter(wins), pk, broadcast=feed_on).persist()
            cached.append(fresh_winners)
            if feed_on:
                # A key whose stored row stays is unchanged (no fills here): only winning events change a key.
                pairs = fresh_winners
            describe(spark, plan, "merge (broadcast): write the base and tombstones")
            visible = key_join(base_data, losers, pk, "left_anti", broadcast=True).unionByName(
                fresh_winners.filter(~is_delete)
            )
            deleted = key_join(base_tomb, losers, pk, "left_anti", broadcast=True).unionByName(
                fresh_winners.filter(is_delete)
            )
            visible = visible.withColumn("_cdc_rank", F.lit(1))
            deleted = deleted.withColumn("_cdc_rank", F.lit(1))
        elif lookup:
            describe(spark, plan, "merge (window, touched keys): rank the events with their keys' stored rows")
            touched_ranks = rank_touched_keys(
                base_data.unionByName(base_tomb), fresh, pk, order_by, rule.rank, fills, unchanged
            )
            if feed_on:
                # Each ranked row learns its key's stored row, over the key as the rank (no shuffle of its own).
                touched_ranks = carry_old_row(touched_ranks, pk)
                # Kept only where it is read (the key's winner, the feed's pair): the cache held every ranked
                # row's copy, 328 MB against 22 MB without the feed at 5M x 10 %, squeezing the base's write.
                rank1 = F.col("_cdc_rank") == 1
                touched_ranks = touched_ranks.withColumn(OLD_ROW, F.when(rank1, F.col(OLD_ROW)))
            touched_ranks = touched_ranks.persist()
            cached.append(touched_ranks)
            # One pass over the cached ranking: the losers, and how the keys' rankings went.
            tally = (
                with_rank_flags(touched_ranks, pk, order_by)
                .agg(F.coalesce(F.sum(F.when(F.col("_cdc_rank") > 1, 1)), F.lit(0)).alias("s"), *rank_tally_columns())
                .first()
            )
            lookup_superseded = int(tally["s"])
            if feed_on and unchanged:
                # Whole rows were ranked (rank_touched_keys): the winner is the key's new row, filled anew
                # where a late event did so (a stored row that still wins may change).
                pairs = touched_ranks.filter(F.col("_cdc_rank") == 1)
            # One rank-1 row per key (row_number): the touched keys, each once, without a shuffle of their own.
            touched_keys = touched_ranks.filter(F.col("_cdc_rank") == 1).select(*_keys(pk))
            rank_tallies = {"tied_winners": int(tally["tied_winners"]), "late_events": int(tally["late_events"])}
            src, rank = F.col("_cdc_src"), F.col("_cdc_rank")
            # The winners are written from the cached ranking (events whole there): no join back to the events.
            if unchanged:
                # Whole rows were ranked: a base row that still wins is written from the ranking too,
                # if a value of it was filled (a late event may have filled it anew).
                lefts = [F.coalesce(F.col(f"`{spec['left'][0]}`"), F.lit(False)) for spec in unchanged.values()]
                refilled = functools.reduce(operator.or_, lefts)
                rewritten = (src == 1) | refilled
                losers = touched_ranks.filter((src == 0) & ((rank > 1) | refilled)).select(*_keys(pk))
                fresh_winners = touched_ranks.filter((rank == 1) & rewritten).select(*base_data.columns)
            else:
                losers = touched_ranks.filter((src == 0) & (rank > 1)).select(*_keys(pk))
                fresh_winners = touched_ranks.filter((src == 1) & (rank == 1)).select(*base_data.columns)
                if feed_on:
                    # A stored row that still wins is unchanged (nothing refills it): only winning events
                    # change a key, and each took its key's stored row along (carry_old_row).
                    pairs = fresh_winners
            # The base is read once per output and never shuffled: untouched keys pass as they are.
            visible = key_join(base_data, losers, pk, "left_anti", broadcast=True).unionByName(
                fresh_winners.filter(~is_delete)
            )
            deleted = key_join(base_tomb, losers, pk, "left_anti", broadcast=True).unionByName(
                fresh_winners.filter(is_delete)
            )
            # Everything the ranking did not count is a winner: counted on the writes below.
            visible = visible.withColumn("_cdc_rank", F.lit(1))
            deleted = deleted.withColumn("_cdc_rank", F.lit(1))
        else:
            # The feed's stored rows taken after the ranking's shuffle, not carried through it (carry_old_row).
            late = feed_on and late_old_row(fills, unchanged)
            if late:
                fresh = fresh.drop(OLD_ROW)
            if part is None:
                base_all = (stored_data if late else base_data).unionByName(stored_tomb if late else base_tomb)
                ranked_events = fill_and_rank(_sourced(base_all, fresh, unchanged), rule.rank, fills, unchanged)
            else:
                fresh_rows = increment_rows - rejected_rows + retired_keys
                # As few events as the key lookup takes: their keys are broadcast, the index is not shuffled.
                few = fresh_rows <= lookup_max
                if few:
                    # Read five times before the writes (key ranges, three queries of touched_partitions, the
                    # ranking): few events are cached on the first, rather than read and classified each time.
                    fresh = fresh.persist()
                    cached.append(fresh)
                fresh_p = fresh.withColumn(PARTITION_COLUMN, F.lit(None).cast("string"))
                # Only base keys in the events' key range can be theirs: the sorted index skips the rest.
                # Few events: the ranges and the partitions they name in one small job, cut on the driver.
                describe(spark, plan, "find the events' key ranges and partitions")
                summary = event_key_summary(fresh, pk, part.column, part.value, fresh_rows) if base_map else None
                own: list[str] | None = None
                if summary is not None:
                    key_filter, own = summary
                else:
                    key_filter = key_range_filter(fresh, pk, fresh_rows) if base_map else None
                if key_filter is not None:
                    base_keys = base_keys.filter(key_filter)
                    key_lookup["key_range"] = True
                known = base_keys.unionByName(base_tomb.select(*_keys(pk), F.col(PARTITION_COLUMN)))
                describe(spark, plan, "find the touched partitions")
                found = touched_partitions(
                    base_keys, fresh, pk, part.column, part.value, known, few, own_partitions=own is None
                ).collect()
                touched = sorted({r[PARTITION_COLUMN] for r in found} | set(own or ()))
                if old_layout:
                    # Layout 1 keeps tombstones inside the partitions: rewrite every one once, tombstones out.
                    touched = sorted(set(touched) | set(base_map))
                base = read_partitions(spark, base_schema, {v: base_map[v] for v in touched if v in base_map})
                base = base.select(*[F.col(f"`{c}`") for c in [*stored, *META_COLUMNS, PARTITION_COLUMN]])
                if feed_on and not late:
                    # Touched partitions are read whole: a key's stored row is there wherever it moves to.
                    base, base_tomb = with_old_row(base, base_tomb, columns, is_delete)
                base_all = base.unionByName(base_tomb)
                ranked_events = assign_partitions(
                    fill_and_rank(_sourced(base_all, fresh_p, unchanged), rule.rank, fills, unchanged),
                    pk,
                    part.column,
                    part.value,
                )
            # The base rows this compaction ranks (validate holds them against the parent version's rows),
            # counted as the ranking reads them: every stored row (_cdc_src 0) passes the window before the
            # winners are kept, so the count is of exactly the rows read, without a Spark job of its own.
            base_tally = [F.count_if(F.col("_cdc_src") == 0).alias("base_read")]
            if feed_on:
                # Each key's winner learns the key's stored row, over the key as the rank (no shuffle of its own).
                ranked_events = carry_old_row(ranked_events, pk, (columns, is_delete) if late else None)
            # How the keys' rankings went: counted as the winners are first computed (no pass of its own).
            ranked_events = with_rank_flags(ranked_events, pk, list(plan.order_by or columns)).observe(
                obs_ranks, *rank_tally_columns(), *base_tally
            )
            # Both outputs come from one ranking: keep the winners rather than rank every row twice.
            winners = ranked_events.filter(F.col("_cdc_rank") == 1).persist()
            cached.append(winners)
            visible, deleted = winners.filter(~is_delete), winners.filter(is_delete)
            if feed_on:
                pairs = winners

        # Always the registry's column order: joins put the key columns first, and validate (and
        # every reader of the base table) expects the registry's order.
        out_columns = [*stored, *META_COLUMNS, *([PARTITION_COLUMN] if part is not None else [])]
        visible = visible.select(*[F.col(f"`{c}`") for c in out_columns])
        expired = expired_tombstone(rule.is_delete, cutoff)
        deleted = deleted.observe(
            obs_tomb, F.coalesce(F.sum(F.when(expired, 1).otherwise(0)), F.lit(0)).alias("expired_tombstones")
        )
        deleted = deleted.filter(~expired).select(*[F.col(f"`{c}`") for c in out_columns])
        if part is not None:
            # One task per partition value, so one file per partition (split at max_records_per_file)
            # rather than one per task and partition; output_files is sized for a whole-table rewrite.
            # The directories are named cdc_partition=<v> (PARTITION_DIR_COLUMN): Hive skips names with a
            # leading _, and the metastore registers each partition at its location, so the names may differ.
            visible = visible.withColumnRenamed(PARTITION_COLUMN, PARTITION_DIR_COLUMN)
            visible = visible.repartition(F.col(PARTITION_DIR_COLUMN))
        elif plan.output_files:
            # Files of about the registry's target size (see pipeline.plan.output_sizing): merge, never shuffle.
            visible = visible.coalesce(int(plan.output_files))
        # Observed last, in the stage that writes (an action): each task's count is taken once.
        visible = visible.observe(obs_data, *written_tally_columns(is_delete, tombstones=False))
        # errorifexists: an attempt's directory is new; finding one there means something is wrong.
        compression = DEFAULT_COMPRESSION if plan.compression is None else plan.compression
        writer = visible.write.mode(mode).option("compression", compression)
        if plan.max_records_per_file:
            writer = writer.option("maxRecordsPerFile", int(plan.max_records_per_file))
        if part is not None:
            writer = writer.partitionBy(PARTITION_DIR_COLUMN)
        describe(spark, plan, f"merge ({merge_path}) and write the base")
        writer.parquet(data_out)
        fault_point("compact.after_data", plan.table)

        # The tombstones and the change feed are one file each. coalesce(1) reads in the task that writes,
        # which on the window path is a scan of every winner of the whole table: a 50M-row load spent 1,061 s
        # in that one task (docs/benchmarks.md, "At scale"), and at 5M x 10 % (610,006 events) the feed's
        # change rows took 17 s there. So where the winners are many -- every key's with more than one output
        # file, or the touched keys' of many events -- they are filtered (and the feed's rows built) in
        # parallel and only the rows written go to one task (a shuffle); where they are few, coalesce saves
        # the shuffle's stage.
        many = increment_rows - rejected_rows + retired_keys > ONE_FILE_SHUFFLE_MIN_EVENTS

        def one_file(df: DataFrame) -> DataFrame:
            every_key = not lookup and (plan.output_files or 1) > 1
            return df.repartition(1) if every_key or many else df.coalesce(1)

        # Tombstones stay one small unpartitioned set (with their partition as a column).
        deleted = one_file(deleted).observe(obs_written_tomb, *written_tally_columns(is_delete, tombstones=True))
        describe(spark, plan, f"merge ({merge_path}) and write the tombstones")
        deleted.write.mode(mode).option("compression", compression).parquet(tomb_out)
        feed_rows_by_type: dict[str, int] | None = None
        if pairs is not None:
            # One file (one_file), from what the merge kept (cached): no scan of the base of its own.
            # Visible as written: a winner that is no delete (an expired tombstone is a delete too).
            obs_feed = Observation("cdc_compaction_feed")
            new_visible = F.coalesce(~is_delete, F.lit(False))
            feed = one_file(feed_rows(pairs, columns, new_visible, int(plan.seq)))
            describe(spark, plan, f"merge ({merge_path}) and write the change feed")
            feed.observe(obs_feed, *feed_tally_columns()).write.mode(mode).option("compression", compression).parquet(
                f"{out}/{CHANGES_DIR}"
            )
            feed_rows_by_type = {k: observed(obs_feed, k) for k in FEED_CHANGE_TYPES}
        expired_count = observed(obs_tomb, "expired_tombstones")
        if not lookup:
            rank_tallies = {k: observed(obs_ranks, k) for k in ("tied_winners", "late_events")}
            base_read = observed(obs_ranks, "base_read")
        data_rows, data_misplaced = observed(obs_data, "rows"), observed(obs_data, "misplaced")
        tomb_rows, tomb_misplaced = observed(obs_written_tomb, "rows"), observed(obs_written_tomb, "misplaced")

        # Keys found twice gate publishing (see validate): checked on what landed on storage, key
        # columns only, and with the key lookup only the keys it ranked (before its cache goes).
        partitioned: dict[str, Any] = {}
        out_schema = f"{base_schema}, {PARTITION_DDL}" if part is not None else base_schema
        written_tomb = spark.read.schema(out_schema).parquet(tomb_out)
        written = (
            read_partitioned(spark, base_schema, data_out)
            if part is not None
            else spark.read.schema(base_schema).parquet(data_out)
        )
        all_keys = written.select(*_keys(pk)).unionByName(written_tomb.select(*_keys(pk)))
        if part is None:
            describe(spark, plan, "check the written keys")
            # The touched keys are one row per key (the decisions' grouping, or the ranking's rank-1 rows).
            dup_keys = duplicate_keys(all_keys, pk, touched_keys, touched_distinct=True)
    finally:
        for df in cached:
            df.unpersist()

    output_files = data_files(spark, data_out, DATA_DIR) + data_files(spark, tomb_out, TOMBSTONES_DIR)
    change_feed: dict[str, Any] | None = None
    if feed_rows_by_type is not None:
        feed_files = data_files(spark, f"{out}/{CHANGES_DIR}", CHANGES_DIR)
        if len(feed_files) != 1:
            raise RuntimeError(
                f"{plan.table}: the change feed of commit {plan.seq} must be one file in {out}/{CHANGES_DIR}, "
                f"Spark wrote {[f['name'] for f in feed_files]}"
            )
        output_files += feed_files
        change_feed = {"file": feed_files[0]["name"], "seq": int(plan.seq), "rows": feed_rows_by_type}
    if part is not None:
        # A key must not survive both in a rewritten partition (or the tombstones) and in one reused as it is.
        # Only reused keys in the written keys' range can be such a key: the index skips the rest. Counted
        # in one Spark job with the keys found twice among the written ones (a semi-join, not a grouping,
        # for the reused keys: scattered keys put the whole index in range).
        found_twice = duplicate_key_groups(all_keys, pk)
        if set(base_map) - set(touched):
            reused_keys = every_base_key.filter(~F.col(PARTITION_COLUMN).isin(touched))
            written_range = key_range_filter(all_keys, pk, data_rows + tomb_rows)
            if written_range is not None:
                reused_keys = reused_keys.filter(written_range)
            in_both = key_join(reused_keys, all_keys, pk, "left_semi").select(*_keys(pk))
            found_twice = found_twice.unionByName(in_both)
        describe(spark, plan, "check the written keys")
        dup_keys = found_twice.count()
        written_map = _written_partitions(output_files, data_out)
        index_out = f"{out}/{INDEX_DIR}"
        # Also the rows per written partition (the index check reads the data's keys anyway):
        # validate holds these against the Parquet footers of each partition directory.
        describe(spark, plan, "write and check the key index")
        partitioned.update(write_index(spark, written, pk, index_out, mode, compression))
        output_files += data_files(spark, index_out, INDEX_DIR)
        partitioned["index"] = _written_partitions(output_files, index_out, INDEX_DIR)
        partitioned["key_lookup"] = key_lookup
        if sorted(written_map) != sorted(partitioned["partition_rows"]):
            raise RuntimeError(
                f"{plan.table}: partition directories {sorted(written_map)} in {data_out} do not match the "
                f"partitions of the rows read back {sorted(partitioned['partition_rows'])}"
            )
        partitioned.update(
            {
                "partition_by": {"column": part.column, "transform": part.transform},
                "partitions": written_map,
                "partitions_touched": tuple(touched),
                "partitions_rewritten": len(written_map),
                "partitions_reused": len(set(base_map) - set(touched)),
            }
        )
    output_rows = data_rows + tomb_rows
    # The events ranked: the accepted ones, and the old keys that key changes retire (registry old_key).
    accepted_rows = increment_rows - rejected_rows + retired_keys
    # Every ranked event is a winner (written, or an expired tombstone) or superseded; the key lookup
    # counted its losers while ranking, the full ranking counted the base rows it read. validate
    # holds base_rows against the parent version's rows and increment_rows against the planned files.
    winners_count = output_rows + expired_count
    superseded = lookup_superseded if lookup else int(base_read or 0) + accepted_rows - winners_count
    events_total = winners_count + superseded
    stats = JobStats(
        plan_id=plan.plan_id,
        table=plan.table,
        attempt=attempt or "",
        layout=LAYOUT,
        base_rows=base_read if base_read is not None else events_total - accepted_rows,
        increment_rows=increment_rows,
        rejected_rows=rejected_rows,
        rejected_by_reason=reasons,
        rejected_by_file=by_file,
        superseded_rows=superseded,
        expired_tombstones=expired_count,
        output_rows=output_rows,
        output_tombstones=tomb_rows,
        output_visible_rows=data_rows,
        # Deletes among the visible rows, or upserts among the tombstones: must be 0.
        misplaced_rows=data_misplaced + tomb_misplaced,
        duplicate_keys=int(dup_keys),
        output_files=tuple(OutputFile(f["name"], f["size"]) for f in output_files),
        finished_at=datetime.now(UTC).isoformat(),
        **partitioned,
        tied_winners=rank_tallies.get("tied_winners"),
        late_events=rank_tallies.get("late_events"),
        merge_path=merge_path,
        change_feed=change_feed,
        **decode.skipped_stats(plan, skipped),
        # Only when there were any, so that stats of tables without old_key read as before.
        extra={"retired_keys": retired_keys} if retired_keys else {},
    ).to_dict()
    fault_point("compact.before_stats", plan.table)
    describe(spark, plan, "write the stats")
    write_text(spark, f"{out.rstrip('/')}/{STATS_FILE}", json.dumps(stats, indent=1, sort_keys=True))
    set_job_description(spark, None)
    log.info("compacted %s: %s", plan.table, {k: v for k, v in stats.items() if k != "output_files"})
    return stats
