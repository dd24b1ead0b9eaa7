"""The ``snapshot`` table mode's Spark side: snapshots in, current table and history partitions out.

The contract is ``tests/scenarios/snapshot/README.md``.  Every increment is one export of
the table (``delta: false``) or of its changed rows (``delta: true``); comparing it with the
current table by hashes tells each key's operation (I, U, N, D, X).

Like the cdc job, this module imports nothing from the Airflow package: the rule arrives as
SQL expressions rendered from ``include/sql/modes/snapshot/_rule.sql.j2`` (a
:class:`SnapshotRule`, which travels in the plan as a dict).  The functions are pure
``DataFrame -> DataFrame`` transformations except :func:`increment_facts` and
:func:`apply_snapshots`, which run the few actions a compaction needs: one to learn what each
increment holds, then one per applied snapshot to count its operations (each also fills a
local checkpoint: the hashed rows, every key's outcome).

Columns of the outputs (the current table and every history partition alike): the table's
columns, ``operation``, ``eff_start_date``, ``_cdc_key_hash``, ``_cdc_row_hash`` and the
provenance of the row's values (``_cdc_increment``, ``_cdc_file``, ``_cdc_pos``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)

from cdc_compaction.job import common
from cdc_compaction.job import files as job_files
from cdc_compaction.job.contract import (
    CHANGE_TYPE,
    CHANGES_DIR,
    COMMIT_VERSION,
    DATA_DIR,
    EFF_START_DATE_COLUMN,
    HISTORY_DIR,
    HISTORY_DIR_PREFIX,
    KEY_HASH_COLUMN,
    LAYOUT,
    META_COLUMNS,
    META_DDL,
    OPERATION_COLUMN,
    PROVENANCE,
    ROW_HASH_COLUMN,
    SEQ_COLUMN,
    SNAPSHOT_COLUMNS,
    STATS_FILE,
    TOMBSTONES_DIR,
    JobStats,
    OutputFile,
    Plan,
)
from cdc_compaction.job.faults import fault_point

log = logging.getLogger("cdc_compaction.compact.snapshot")

INSERT, UPDATE, NO_CHANGE, DELETE, NOT_SUPPLIED = "I", "U", "N", "D", "X"
OPERATIONS = (INSERT, UPDATE, NO_CHANGE, DELETE, NOT_SUPPLIED)

# The output columns' names are the contract's (the Airflow side declares the tables with them).
OPERATION = OPERATION_COLUMN
EFF_START_DATE = EFF_START_DATE_COLUMN
KEY_HASH = KEY_HASH_COLUMN
ROW_HASH = ROW_HASH_COLUMN
REJECT_REASON = "_cdc_reject_reason"
#: A row's business date, when the table is dated by a column (NULL otherwise).
BUSINESS_DATE = "_cdc_business_date"
INCREMENT = "_cdc_increment"
#: When a row's values were compacted: the last metadata column (the contract's).
INGESTED_AT = META_COLUMNS[-1]

# The columns the operation rule reads (see the template's header).
OLD_ROW_HASH = "_cdc_old_row_hash"
NEW_ROW_HASH = "_cdc_new_row_hash"
WITHHELD = "_cdc_withheld"
NEW_OPERATION = "_cdc_operation"

DUPLICATE_KEY = "duplicate_key"
EMPTY_SNAPSHOT = "empty_snapshot"
NO_BUSINESS_DATE = "no_business_date"
NULL_BUSINESS_DATE = "null_business_date"
MIXED_BUSINESS_DATE = "mixed_business_date"

#: Up to this many rows, the hash side of a join is broadcast (two 64-character hashes and a
#: flag a row: about 40 MB at the limit), so the other side, with the rows' payload, is not shuffled.
BROADCAST_MAX_ROWS = 250_000


@dataclass(frozen=True)
class SnapshotRule:
    """The mode's rule as SQL expressions rendered from ``modes/snapshot/_rule.sql.j2``, and the table's shape."""

    #: The table's columns, in registry order.
    columns: list[str]
    delta: bool
    key_hash: str
    row_hash: str
    reject_reason: str
    operation: str
    #: The row's business date; None when snapshots are dated by their increment's name.
    business_date: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns),
            "delta": self.delta,
            "key_hash": self.key_hash,
            "row_hash": self.row_hash,
            "reject_reason": self.reject_reason,
            "operation": self.operation,
            "business_date": self.business_date,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SnapshotRule:
        return cls(
            columns=list(d["columns"]),
            delta=bool(d["delta"]),
            key_hash=d["key_hash"],
            row_hash=d["row_hash"],
            reject_reason=d["reject_reason"],
            operation=d["operation"],
            business_date=d.get("business_date"),
        )

    @property
    def output_columns(self) -> list[str]:
        """The columns of the current table and of the history, in order."""
        return [*self.columns, OPERATION, EFF_START_DATE, KEY_HASH, ROW_HASH, *PROVENANCE]


def _c(name: str) -> Column:
    return F.col(f"`{name}`")


# ------------------------------------------------------------------ row level
def hashed(rows: DataFrame, rule: SnapshotRule) -> DataFrame:
    """The snapshot rows (the table's columns and provenance) with their hashes, business date and reject reason.

    The hashes are computed here, once, and travel with the row from then on.  The reject
    reason needs the key hash (a duplicate key is one key hash held by several rows of one
    increment), so it comes last.
    """
    bd = F.expr(rule.business_date) if rule.business_date else F.lit(None).cast("date")
    return (
        rows.withColumn(KEY_HASH, F.expr(rule.key_hash))
        .withColumn(ROW_HASH, F.expr(rule.row_hash))
        .withColumn(BUSINESS_DATE, bd)
        .withColumn(REJECT_REASON, F.expr(rule.reject_reason))
    )


# ------------------------------------------------------------- increment level
@dataclass(frozen=True)
class IncrementFacts:
    """What one increment holds, as far as deciding its fate needs."""

    rows: int = 0
    #: Rows refused for a reason of their own (NULL key, duplicate key), by reason.
    reasons: Mapping[str, int] = field(default_factory=dict)
    #: The distinct non-NULL business dates of its rows (dated by a column only).
    dates: tuple[date, ...] = ()
    #: Rows whose business date is NULL (dated by a column only).
    null_dates: int = 0

    @property
    def accepted(self) -> int:
        return self.rows - sum(self.reasons.values())


def increment_facts(hashed_rows: DataFrame) -> dict[str, IncrementFacts]:
    """Every increment's :class:`IncrementFacts`, in one pass over the hashed rows.

    An increment without rows is absent (its facts are the defaults: no rows).
    """
    null_date = F.when(_c(BUSINESS_DATE).isNull(), 1).otherwise(0)
    groups = (
        hashed_rows.groupBy(INCREMENT, REJECT_REASON)
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.collect_set(BUSINESS_DATE).alias("dates"),
            F.sum(null_date).alias("null_dates"),
        )
        .collect()
    )
    rows: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = {}
    dates: dict[str, set[date]] = {}
    nulls: Counter[str] = Counter()
    for g in groups:
        name = g[INCREMENT]
        rows[name] += g["rows"]
        reasons.setdefault(name, Counter())
        if g[REJECT_REASON] is not None:
            reasons[name][g[REJECT_REASON]] += g["rows"]
        dates.setdefault(name, set()).update(g["dates"])
        nulls[name] += g["null_dates"]
    return {
        name: IncrementFacts(rows[name], dict(reasons[name]), tuple(sorted(dates[name])), nulls[name]) for name in rows
    }


@dataclass(frozen=True)
class Decision:
    """What becomes of one increment: ``apply`` (at ``business_date``), ``replay`` or ``refuse`` (for ``reason``)."""

    increment: str
    verdict: str
    business_date: date | None = None
    reason: str | None = None


def decide(
    increments: Mapping[str, date | None],
    facts: Mapping[str, IncrementFacts],
    *,
    dated_by_column: bool,
    delta: bool,
    last_applied: date | None,
) -> list[Decision]:
    """Every pending increment's fate, in increment order (plain Python over the facts: no Spark).

    ``increments`` maps each pending increment to the date of its name (ignored when the
    table is dated by a column).  The date is found (or the increment refused) first, since
    a replay is only recognised by its date; a replay is not examined further.
    """
    decisions: list[Decision] = []
    for name in sorted(increments):
        f = facts.get(name, IncrementFacts())
        if dated_by_column:
            if f.rows == 0:
                decisions.append(Decision(name, "refuse", reason=NO_BUSINESS_DATE))
                continue
            if f.null_dates:
                decisions.append(Decision(name, "refuse", reason=NULL_BUSINESS_DATE))
                continue
            if len(f.dates) > 1:
                decisions.append(Decision(name, "refuse", reason=MIXED_BUSINESS_DATE))
                continue
            d: date | None = f.dates[0]
        else:
            d = increments[name]
            if d is None:
                raise ValueError(f"increment {name}: no business date given (the table is dated by increment name)")
        if last_applied is not None and d <= last_applied:
            decisions.append(Decision(name, "replay", d))
        elif not delta and f.accepted == 0:
            # A full snapshot with nothing in it would delete every key: far likelier a failed export.
            decisions.append(Decision(name, "refuse", d, EMPTY_SNAPSHOT))
        else:
            decisions.append(Decision(name, "apply", d))
            last_applied = d
    return decisions


# ------------------------------------------------------------- snapshot level
def empty_current(hashed_rows: DataFrame, rule: SnapshotRule) -> DataFrame:
    """A current table without rows, of the right schema (the state before the first snapshot)."""
    return hashed_rows.where(F.lit(False)).select(
        *[_c(c) for c in rule.columns],
        F.lit(None).cast("string").alias(OPERATION),
        F.lit(None).cast("date").alias(EFF_START_DATE),
        _c(KEY_HASH),
        _c(ROW_HASH),
        *[_c(c) for c in PROVENANCE],
    )


def _maybe_broadcast(df: DataFrame, small: bool) -> DataFrame:
    return F.broadcast(df) if small else df


def classify(
    current: DataFrame,
    accepted: DataFrame,
    withheld_keys: DataFrame,
    operation_sql: str,
    *,
    broadcast_snapshot: bool = False,
    broadcast_current: bool = False,
) -> tuple[DataFrame, DataFrame]:
    """Each key's operation (``_cdc_operation``), seen from both sides; only hashes are joined.

    Returns ``(from_current, from_snapshot)``: the current rows, each with its key's operation
    (N, U, D or X), joined with the snapshot's hashes; and the snapshot's accepted rows
    (unique keys), each with its key's operation (I, U or N), joined with the current table's
    hashes.  ``withheld_keys`` (``_cdc_key_hash``) are the keys whose snapshot rows were all
    refused as duplicates: they count as not supplied.  ``broadcast_snapshot`` /
    ``broadcast_current`` broadcast that side's hashes (when it is small).
    """
    snapshot_hashes = accepted.select(
        _c(KEY_HASH), _c(ROW_HASH).alias(NEW_ROW_HASH), F.lit(False).alias(WITHHELD)
    ).unionByName(
        withheld_keys.select(_c(KEY_HASH), F.lit(None).cast("string").alias(NEW_ROW_HASH), F.lit(True).alias(WITHHELD))
    )
    current_hashes = current.select(_c(KEY_HASH), _c(ROW_HASH).alias(OLD_ROW_HASH))
    from_current = (
        current.join(_maybe_broadcast(snapshot_hashes, broadcast_snapshot), on=KEY_HASH, how="left")
        .withColumn(OLD_ROW_HASH, _c(ROW_HASH))
        .withColumn(WITHHELD, F.coalesce(_c(WITHHELD), F.lit(False)))
        .withColumn(NEW_OPERATION, F.expr(operation_sql))
        .drop(OLD_ROW_HASH, NEW_ROW_HASH, WITHHELD)
    )
    from_snapshot = (
        accepted.join(_maybe_broadcast(current_hashes, broadcast_current), on=KEY_HASH, how="left")
        .withColumn(NEW_ROW_HASH, _c(ROW_HASH))
        .withColumn(WITHHELD, F.lit(False))
        .withColumn(NEW_OPERATION, F.expr(operation_sql))
        .drop(OLD_ROW_HASH, NEW_ROW_HASH, WITHHELD)
    )
    return from_current, from_snapshot


def _as_output(df: DataFrame, rule: SnapshotRule, eff_start_date: date | None) -> DataFrame:
    """``df`` with its ``_cdc_operation`` as ``operation`` (and ``eff_start_date`` set, if given), in output order."""
    eff = _c(EFF_START_DATE) if eff_start_date is None else F.lit(eff_start_date)
    cols = {OPERATION: _c(NEW_OPERATION), EFF_START_DATE: eff}
    return df.select(*[cols[c].alias(c) if c in cols else _c(c) for c in rule.output_columns])


def _ops(*ops: str) -> Column:
    return _c(NEW_OPERATION).isin(*ops)


def keyed_outcome(from_current: DataFrame, from_snapshot: DataFrame, rule: SnapshotRule, d: date) -> DataFrame:
    """Every key once, in output columns, after the snapshot dated ``d``.

    I and U: the snapshot's row, dated ``d``; N and X: the current row as it was (its
    ``eff_start_date`` too), only its operation changes; D: the current row (its last values),
    dated ``d``.  The new current table and history partition ``d`` are both parts of it
    (:func:`next_current`, :func:`history_rows`).
    """
    changed = _as_output(from_snapshot.filter(_ops(INSERT, UPDATE)), rule, d)
    kept = _as_output(from_current.filter(_ops(NO_CHANGE, NOT_SUPPLIED)), rule, None)
    deleted = _as_output(from_current.filter(_ops(DELETE)), rule, d)
    return changed.unionByName(kept).unionByName(deleted)


def next_current(keyed: DataFrame) -> DataFrame:
    """The current table: every key of :func:`keyed_outcome` but the deleted ones."""
    return keyed.filter(_c(OPERATION) != DELETE)


def history_rows(keyed: DataFrame) -> DataFrame:
    """The history partition of the snapshot's date: the changes of :func:`keyed_outcome` (I, U, D)."""
    return keyed.filter(_c(OPERATION).isin(INSERT, UPDATE, DELETE))


# ------------------------------------------------------------------ compaction
def _local_checkpoint(df: DataFrame) -> DataFrame:
    # Each snapshot's current table is the next one's input, read twice (rows and hashes): without
    # cutting the lineage here, the plan of the n-th snapshot would hold 2^n copies of the first.
    # The hashed rows are read by every step: materialized, their hashes are computed once.
    # Not eager: the lineage is cut at once, and the next action (the facts, the counts) fills the
    # checkpoint while it computes, instead of a job of its own.
    return df.localCheckpoint(eager=False)


@dataclass
class Compaction:
    """What :func:`apply_snapshots` produced and counted."""

    #: The current table after the last applied snapshot (materialized).
    current: DataFrame
    #: The rows of every history partition the compaction wrote (``eff_start_date`` is the partition).
    history: DataFrame
    #: Every quarantined row, with ``_cdc_reject_reason``.
    refused_rows: DataFrame
    decisions: list[Decision]
    #: Keys by operation, summed over the applied snapshots.
    counts: dict[str, int]
    #: Refused rows by reason.
    rejected: dict[str, int]
    #: Refused increments by reason.
    refused: dict[str, int]
    #: Each applied snapshot's keys by operation, in order: (increment, business date, counts).
    steps: list[tuple[str, date, dict[str, int]]] = field(default_factory=list)

    @property
    def applied(self) -> list[tuple[str, date]]:
        """The applied increments and their business dates, in order (each has a history partition, maybe empty)."""
        return [(d.increment, d.business_date) for d in self.decisions if d.verdict == "apply" and d.business_date]

    @property
    def replayed(self) -> int:
        return sum(d.verdict == "replay" for d in self.decisions)

    def last_applied(self, before: date | None) -> date | None:
        """The last applied date after this compaction, given the one before it."""
        return max([d for _, d in self.applied], default=before)


def _reason_of_increment(refusals: Mapping[str, str]) -> Column:
    """The reason of the refused increment a row belongs to, NULL for the others."""
    reason: Column = F.lit(None).cast("string")
    for name, why in refusals.items():
        reason = F.when(_c(INCREMENT) == name, F.lit(why)).otherwise(reason)
    return reason


def apply_snapshots(
    current: DataFrame | None,
    hashed_rows: DataFrame,
    increments: Mapping[str, date | None],
    rule: SnapshotRule,
    *,
    last_applied: date | None,
    current_rows: int | None = None,
    materialize: Callable[[DataFrame], DataFrame] = _local_checkpoint,
    broadcast_max_rows: int = BROADCAST_MAX_ROWS,
) -> Compaction:
    """One compaction: every pending increment of ``hashed_rows`` (from :func:`hashed`), in increment order.

    ``current`` is the current table (None before the first snapshot), ``last_applied`` the
    greatest business date applied so far (its greatest history partition), ``increments``
    the pending increments with the dates of their names.  ``materialize`` turns the hashed
    rows, then each snapshot's :func:`keyed_outcome` (the next current table and history
    partition) into frames read cheaply and without their lineage (by default a local
    checkpoint; a job may write them out and read them back); ``current_rows`` is ``current``'s row count, if
    known (else it is counted, to choose what to broadcast).
    """
    hashed_rows = materialize(hashed_rows)
    facts = increment_facts(hashed_rows)
    decisions = decide(
        increments, facts, dated_by_column=rule.business_date is not None, delta=rule.delta, last_applied=last_applied
    )
    rejected: Counter[str] = Counter()
    refusals = {d.increment: d.reason for d in decisions if d.verdict == "refuse" and d.reason}
    for d in decisions:
        if d.verdict == "replay":
            continue  # not examined: its rows were seen when its date was applied, or they are stale
        f = facts.get(d.increment, IncrementFacts())
        rejected.update(f.reasons)
        if d.verdict == "refuse" and d.reason and f.accepted:
            rejected[d.reason] += f.accepted
    examined = [d.increment for d in decisions if d.verdict != "replay"]
    refused_rows = (
        hashed_rows.filter(_c(INCREMENT).isin(examined))
        .withColumn(REJECT_REASON, F.coalesce(_c(REJECT_REASON), _reason_of_increment(refusals)))
        .filter(_c(REJECT_REASON).isNotNull())
    )

    if current is None:
        current, current_rows = empty_current(hashed_rows, rule), 0
    elif current_rows is None:
        current_rows = current.count()
    counts: Counter[str] = Counter()
    steps: list[tuple[str, date, dict[str, int]]] = []
    history: list[DataFrame] = []
    for d in decisions:
        if d.verdict != "apply" or d.business_date is None:
            continue
        f = facts.get(d.increment, IncrementFacts())
        rows = hashed_rows.filter(_c(INCREMENT) == d.increment)
        accepted = rows.filter(_c(REJECT_REASON).isNull())
        withheld = rows.filter(_c(REJECT_REASON) == DUPLICATE_KEY).select(KEY_HASH).distinct()
        from_current, from_snapshot = classify(
            current,
            accepted,
            withheld,
            rule.operation,
            broadcast_snapshot=f.accepted + f.reasons.get(DUPLICATE_KEY, 0) <= broadcast_max_rows,
            broadcast_current=current_rows <= broadcast_max_rows,
        )
        keyed = materialize(keyed_outcome(from_current, from_snapshot, rule, d.business_date))
        current = next_current(keyed)
        history.append(history_rows(keyed))
        step = dict(keyed.groupBy(OPERATION).count().collect())
        counts.update(step)
        steps.append((d.increment, d.business_date, {op: int(step.get(op, 0)) for op in OPERATIONS}))
        current_rows = sum(n for op, n in step.items() if op != DELETE)
    empty_history = empty_current(hashed_rows, rule)
    return Compaction(
        current=current,
        history=functools.reduce(DataFrame.unionByName, history, empty_history),
        refused_rows=refused_rows,
        decisions=decisions,
        counts={op: counts[op] for op in OPERATIONS},
        rejected=dict(rejected),
        refused=dict(Counter(refusals.values())),
        steps=steps,
    )


# ------------------------------------------------------------------ the job
def _decisions_by_increment(decisions: list[Decision]) -> dict[str, str]:
    """Every increment's fate as one word for the stats: ``applied``, ``replayed`` or ``refused:<reason>``."""
    words = {"apply": "applied", "replay": "replayed"}
    return {d.increment: words.get(d.verdict, f"refused:{d.reason}") for d in decisions}


def feed_rows(before: DataFrame, after: DataFrame, columns: list[str], seq: int) -> DataFrame:
    """Commit ``seq``'s change as ``<t>_changes`` rows: the parent's current table (``before``) against the
    new one (``after``), paired by key (``_cdc_key_hash``, one row per key in each).

    Over the registry's ``columns`` only: ``operation`` and ``eff_start_date`` are the mode's bookkeeping
    (they change with an export that leaves a row's values as they are).  ``insert`` (a key only the new
    table holds), ``delete`` (only the old one; its last values), ``update_before`` and ``update_after``
    (both, any column distinct: NULL equals NULL, NaN equals NaN, NULL is not ''); equal rows give nothing.
    Several exports applied in one compaction net out here, as the two versions do.  Columns: ``columns``,
    ``_change_type``, ``_commit_version`` (bigint) and ``_commit_seq`` (int), both ``seq``.
    """
    old, new = F.col("_cdc_old"), F.col("_cdc_new")
    pairs = before.select(_c(KEY_HASH).alias("_cdc_k"), F.struct(*[_c(c) for c in columns]).alias("_cdc_old")).join(
        after.select(_c(KEY_HASH).alias("_cdc_k"), F.struct(*[_c(c) for c in columns]).alias("_cdc_new")),
        "_cdc_k",
        "full_outer",
    )
    same = functools.reduce(
        lambda a, b: a & b, [old.getField(c).eqNullSafe(new.getField(c)) for c in columns], F.lit(True)
    )
    kinds = (
        F.when(old.isNull(), F.array(F.lit("insert")))
        .when(new.isNull(), F.array(F.lit("delete")))
        .when(~same, F.array(F.lit("update_before"), F.lit("update_after")))
    )
    exploded = pairs.select(old, new, F.explode(kinds).alias(CHANGE_TYPE))
    from_old = F.col(CHANGE_TYPE).isin("delete", "update_before")
    return exploded.select(
        *[F.when(from_old, old.getField(c)).otherwise(new.getField(c)).alias(c) for c in columns],
        F.col(CHANGE_TYPE),
        F.lit(seq).cast("bigint").alias(COMMIT_VERSION),
        F.lit(seq).cast("int").alias(SEQ_COLUMN),
    )


def run_snapshot(spark: SparkSession, plan: Plan, attempt: str | None) -> dict[str, Any]:
    """The snapshot compaction of ``plan`` into the attempt's own directory (called by ``compact.run``).

    Reads the parent version's current table (its ``data/``) and the planned increments, applies
    every pending snapshot (:func:`apply_snapshots`) and writes, each with ``errorifexists`` into
    this attempt's new directory: ``data/`` (the current table), ``history/eff_start_date=<d>/`` for
    every applied business date (an empty Parquet file when the snapshot changed nothing: the
    partition records that the date was applied), ``tombstones/`` (empty: the mode keeps none, but
    the tombstones table of every version points there) and the refused rows to the quarantine.
    Then it re-reads what it wrote and writes the stats file last, as the other modes do.
    """

    columns = list(plan.column_names)
    # _cdc_ingested_at travels with each row as if it were a column of the table (the hashes and
    # the comparison never read it): a row that keeps its values (N, X) keeps when they were compacted.
    rule = dataclasses.replace(SnapshotRule.from_dict(plan.rule), columns=[*columns, INGESTED_AT])
    ingested_at = common.parse_ts(plan.ingested_at)
    out, quarantine = common.attempt_locations(plan, attempt)
    data_out, tomb_out, hist_out = f"{out}/{DATA_DIR}", f"{out}/{TOMBSTONES_DIR}", f"{out}/{HISTORY_DIR}"
    write_mode = "error" if attempt else "overwrite"  # "error": errorifexists, the spelling Spark Connect knows too
    compression = plan.compression or "snappy"
    extra_ddl = ", ".join(f"`{name}` {kind}" for name, kind in SNAPSHOT_COLUMNS)
    schema = f"{plan.schema_ddl}, {extra_ddl}, {META_DDL}"
    log.info("compacting snapshot %s (plan %s): %d files", plan.table, plan.plan_id, len(plan.files))

    # The parent's current table, as the rule's functions hold it.
    parent = job_files.read_version(spark, schema, plan.base_location, plan.base_rows)
    base_rows = parent.count()
    current = parent.select(*[_c(c) for c in rule.output_columns]) if base_rows else None

    raw = spark.read.schema(plan.schema_ddl).parquet(*[f.path for f in plan.files])
    increment_rows = raw.count()
    stamp = F.lit(ingested_at).cast("timestamp")
    rows = hashed(common.with_provenance(raw, columns).withColumn(INGESTED_AT, stamp), rule)
    names = plan.business_dates or {}
    increments = {i: date.fromisoformat(names[i]) if names.get(i) else None for i in plan.increments}
    before = date.fromisoformat(plan.last_applied) if plan.last_applied else None
    comp = apply_snapshots(current, rows, increments, rule, last_applied=before, current_rows=base_rows)

    # Refused rows go to quarantine as the other modes' do: the registry's columns, provenance, reason, plan.
    bad = comp.refused_rows.select(
        *[_c(c) for c in [*columns, *PROVENANCE, REJECT_REASON]], F.lit(plan.plan_id).alias("_cdc_plan_id")
    )
    by_file = {
        f"{r[INCREMENT]}/{r['_cdc_file']}": int(r["count"])
        for r in bad.groupBy(INCREMENT, "_cdc_file").count().collect()
    }
    if by_file:
        bad.write.mode(write_mode).parquet(quarantine)

    # In the order of the tables' DDL: the registry's columns, the mode's, then the metadata.
    out_cols = [*columns, OPERATION, EFF_START_DATE, KEY_HASH, ROW_HASH, *PROVENANCE, INGESTED_AT]
    current_out = comp.current.select(*[_c(c) for c in out_cols])
    if plan.output_files:
        current_out = current_out.coalesce(int(plan.output_files))
    writer = current_out.write.mode(write_mode).option("compression", compression)
    if plan.max_records_per_file:
        writer = writer.option("maxRecordsPerFile", int(plan.max_records_per_file))
    writer.parquet(data_out)
    change_feed: dict[str, Any] | None = None
    if plan.change_feed:
        # registry change_feed: the commit's change, the parent's current table against the new one by key.
        change_feed = common.write_feed(
            spark, feed_rows(parent, comp.current, columns, int(plan.seq)), plan, out, write_mode
        )

    # One directory per applied date, written on its own: a date whose snapshot changed nothing
    # still gets one (empty) file, which Spark's partitionBy would not write.
    # Every history row is a change this compaction made: stamped with its time (a D row's values are older).
    hist_cols = [c for c in out_cols if c not in (EFF_START_DATE, INGESTED_AT)]
    written_dates: dict[str, str] = {}
    for _increment, d in comp.applied:
        where = f"{hist_out}/{HISTORY_DIR_PREFIX}{d.isoformat()}"
        part = comp.history.filter(_c(EFF_START_DATE) == F.lit(d)).select(
            *[_c(c) for c in hist_cols], stamp.alias(INGESTED_AT)
        )
        part.coalesce(1).write.mode(write_mode).option("compression", compression).parquet(where)
        written_dates[d.isoformat()] = where
    # No tombstones in this mode; the directory holds one empty file of the current table's schema.
    comp.current.where(F.lit(False)).select(*[_c(c) for c in out_cols]).coalesce(1).write.mode(write_mode).option(
        "compression", compression
    ).parquet(tomb_out)

    # Re-read what landed on storage: these counts gate publishing (validate).
    written = spark.read.schema(schema).parquet(data_out)
    tally = written.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count_distinct(_c(KEY_HASH)).alias("keys"),
        F.sum(F.when(~F.coalesce(_c(OPERATION).isin(INSERT, UPDATE, NO_CHANGE, NOT_SUPPLIED), F.lit(False)), 1)).alias(
            "misplaced"
        ),
    ).first()
    data_rows = int(tally["rows"])
    tomb_rows = spark.read.schema(schema).parquet(tomb_out).count()
    hist_extra = ", ".join(f"`{name}` {kind}" for name, kind in SNAPSHOT_COLUMNS if name != EFF_START_DATE)
    hist_schema = f"{plan.schema_ddl}, {hist_extra}, {META_DDL}"
    history = {
        d: {"location": loc, "rows": spark.read.schema(hist_schema).parquet(loc).count()}
        for d, loc in written_dates.items()
    }
    output_files = common.data_files(spark, data_out, DATA_DIR) + common.data_files(spark, tomb_out, TOMBSTONES_DIR)
    for d, loc in written_dates.items():
        output_files += common.data_files(spark, loc, f"{HISTORY_DIR}/{HISTORY_DIR_PREFIX}{d}")
    if change_feed is not None:
        output_files += common.data_files(spark, f"{out}/{CHANGES_DIR}", CHANGES_DIR)
    after = comp.last_applied(before)
    stats = JobStats(
        plan_id=plan.plan_id,
        table=plan.table,
        attempt=attempt or "",
        layout=LAYOUT,
        base_rows=base_rows,
        increment_rows=increment_rows,
        rejected_rows=sum(comp.rejected.values()),
        rejected_by_reason=dict(sorted(comp.rejected.items())),
        rejected_by_file=by_file,
        superseded_rows=0,
        expired_tombstones=0,
        output_rows=data_rows + tomb_rows,
        output_tombstones=tomb_rows,
        output_visible_rows=data_rows,
        misplaced_rows=int(tally["misplaced"] or 0),
        duplicate_keys=data_rows - int(tally["keys"]),
        output_files=tuple(OutputFile(f["name"], f["size"]) for f in sorted(output_files, key=lambda f: f["name"])),
        finished_at=datetime.now(UTC).isoformat(),
        change_feed=change_feed,
        extra={
            "mode": "snapshot",
            "counts": comp.counts,
            "applied": [[inc, d.isoformat()] for inc, d in comp.applied],
            "steps": [[inc, d.isoformat(), counts] for inc, d, counts in comp.steps],
            "replayed": comp.replayed,
            "rejected": dict(sorted(comp.rejected.items())),
            "refused": dict(sorted(comp.refused.items())),
            "increments": _decisions_by_increment(comp.decisions),
            "last_applied": before.isoformat() if before else None,
            "new_last_applied": after.isoformat() if after else None,
            "history": history,
        },
    ).to_dict()
    fault_point("compact.before_stats", plan.table)
    common.write_text(spark, f"{out.rstrip('/')}/{STATS_FILE}", json.dumps(stats, indent=1, sort_keys=True))
    log.info("compacted snapshot %s: %s", plan.table, {k: v for k, v in stats.items() if k != "output_files"})
    return stats
