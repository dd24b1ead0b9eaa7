"""PySpark compaction job: base + planned increments -> a new base version.

Self-contained on purpose (it is shipped to the cluster by spark-submit): it imports
nothing from the Airflow package.  Everything it needs arrives in the plan file
written by the DAG's ``plan`` task, including the compaction rule as SQL expressions
rendered from ``include/sql/_rule.sql.j2`` -- the same macros the view uses.

    spark-submit include/spark_jobs/compact.py --plan /lake/t/_cdc/plans/<id>.json

The functions above ``run`` are pure ``DataFrame -> DataFrame`` transformations.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import posixpath
import signal
import sys
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F

log = logging.getLogger("cdc_compaction.compact")


class PermanentJobError(Exception):
    """An error no re-run of the job can heal (a stale plan): ``main`` exits with :data:`PERMANENT_EXIT_CODE`."""


#: spark-submit's exit status after a :class:`PermanentJobError` (the DAG's compact task then fails at
#: once); the error is also written beside the plan as ``<plan>.permanent_error.json`` for engines
#: whose exit status does not reach Airflow (EMR steps, cluster deploy mode).
PERMANENT_EXIT_CODE = 65

META_COLUMNS = ["_cdc_increment", "_cdc_file", "_cdc_pos", "_cdc_ingested_at"]
META_DDL = "`_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint, `_cdc_ingested_at` timestamp"
STATS_FILE = "_cdc_stats.json"
#: Up to this many accepted events, only the keys they touch are ranked and the base rows of the
#: other keys are copied as they are (no shuffle of the base); above it, every row is ranked.
KEY_LOOKUP_MAX_EVENTS = 2_000_000
PROVENANCE = ["_cdc_increment", "_cdc_file", "_cdc_pos"]
#: The hidden partition column of a partitioned base table (registry ``partition_by``).
PARTITION_COLUMN = "_cdc_partition"
PARTITION_DDL = f"`{PARTITION_COLUMN}` string"


def with_provenance(raw: DataFrame, columns: list[str]) -> DataFrame:
    """Registry columns plus where each event came from: increment, file name, row position.

    ``raw`` must expose Spark's hidden ``_metadata`` column (a file-based read).
    """
    return raw.select(
        *[F.col(f"`{c}`") for c in columns],
        F.element_at(F.split(F.col("_metadata.file_path"), "/"), -2).alias("_cdc_increment"),
        F.col("_metadata.file_name").alias("_cdc_file"),
        F.col("_metadata.row_index").alias("_cdc_pos"),
    )


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


def rejected(classified: DataFrame, plan_id: str) -> DataFrame:
    """The refused events with their reason, as they go to quarantine."""
    return classified.filter(F.col("_cdc_reject_reason").isNotNull()).withColumn("_cdc_plan_id", F.lit(plan_id))


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


def rank_touched_keys(
    base: DataFrame, fresh: DataFrame, pk: list[str], order_by: list[str], rank_sql: str
) -> DataFrame:
    """``ranked`` over the events of the keys ``fresh`` touches only: their base rows and every event.

    Narrow on purpose (keys, ordering columns, provenance, and ``_cdc_src``: 0 for a base row,
    1 for an event): only these rows are shuffled and sorted, not the whole table.
    """
    cols = [F.col(f"`{c}`") for c in dict.fromkeys([*pk, *order_by, *PROVENANCE])]
    keys = fresh.select(*[F.col(f"`{c}`") for c in pk]).distinct()
    touched = base.select(*cols).join(F.broadcast(keys), on=pk, how="left_semi").withColumn("_cdc_src", F.lit(0))
    events = touched.unionByName(fresh.select(*cols).withColumn("_cdc_src", F.lit(1)))
    return ranked(events, rank_sql)


def winners_by_key_lookup(base: DataFrame, fresh: DataFrame, touched_ranks: DataFrame, pk: list[str]) -> DataFrame:
    """Every key's winner, ``_cdc_rank`` 1 (the input of ``new_base``), given ``rank_touched_keys``.

    The base rows of untouched keys pass as they are, the touched keys' base rows that lost
    are left out (a broadcast anti-join on the key), and the winning events join them. The
    base is read once and never shuffled.
    """
    src, rank = F.col("_cdc_src"), F.col("_cdc_rank")
    losers = touched_ranks.filter((src == 0) & (rank > 1)).select(*[F.col(f"`{c}`") for c in pk])
    won = touched_ranks.filter((src == 1) & (rank == 1)).select(*PROVENANCE)
    kept = base.join(F.broadcast(losers), on=pk, how="left_anti")
    return kept.unionByName(fresh.join(won, on=PROVENANCE, how="left_semi")).withColumn("_cdc_rank", F.lit(1))


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


def partitions_of_keys(base_keys: DataFrame, events: DataFrame, pk: list[str]) -> DataFrame:
    """The partitions of base rows whose key is among ``events``' keys.

    ``base_keys`` needs only the key columns and ``_cdc_partition``.  This is how an event that
    does not carry the partition column (a key-only delete), or whose key moves to another
    partition, finds the partition its key lives in now.
    """
    keys = events.select(*_keys(pk)).distinct()
    return base_keys.join(keys, on=pk, how="left_semi").select(PARTITION_COLUMN).distinct()


def touched_partitions(
    base_keys: DataFrame, events: DataFrame, pk: list[str], partition_column: str, partition_sql: str
) -> DataFrame:
    """Every partition a compaction of ``events`` may change: where they go, and where their keys are.

    An event without a partition value whose key is not in the base (a delete of a key never
    seen) goes to the NULL sentinel partition, so that one is touched too.
    """
    unplaced = (
        events.filter(F.col(f"`{partition_column}`").isNull())
        .join(base_keys.select(*_keys(pk)), on=pk, how="left_anti")
        .select(F.expr(partition_sql).alias(PARTITION_COLUMN))
    )
    return (
        event_partitions(events, partition_column, partition_sql)
        .unionByName(partitions_of_keys(base_keys, events, pk))
        .unionByName(unplaced)
        .distinct()
    )


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


def partition_dir_value(name: str) -> str | None:
    """The partition value of a directory Spark's ``partitionBy`` wrote, e.g. ``_cdc_partition=a%3Ab``."""
    prefix = f"{PARTITION_COLUMN}="
    return unquote(name[len(prefix) :]) if name.startswith(prefix) else None


def read_partitions(spark: SparkSession, schema_ddl: str, partitions: dict[str, str]) -> DataFrame:
    """The rows of the given partitions ({value: location}), with ``_cdc_partition``.

    Partitions live in the version directory that last rewrote them, so they are read in one
    scan per version directory, and Spark's partition discovery supplies ``_cdc_partition``
    (it un-escapes the directory names; the schema keeps the values strings).
    """
    schema = f"{schema_ddl}, {PARTITION_DDL}"
    if not partitions:
        return spark.createDataFrame([], schema)
    by_parent: dict[str, list[str]] = {}
    odd: dict[str, str] = {}
    for value, location in sorted(partitions.items()):
        loc = location.rstrip("/")
        if partition_dir_value(posixpath.basename(loc)) == value:
            by_parent.setdefault(posixpath.dirname(loc), []).append(loc)
        else:
            odd[value] = loc  # registered somewhere else (by hand): read it on its own
    frames = [spark.read.schema(schema).option("basePath", parent).parquet(*locs) for parent, locs in by_parent.items()]
    frames += [
        spark.read.schema(schema_ddl).parquet(loc).withColumn(PARTITION_COLUMN, F.lit(value))
        for value, loc in odd.items()
    ]
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def fault_point(name: str, table: str) -> None:
    """Crash here if ``CDC_FAULTS`` arms this point (crash tests; inert otherwise).

    A copy of ``cdc_compaction.faults`` (same syntax), because this job ships without
    the package; ``tests/test_crash_safety.py`` checks the two agree.
    """
    spec = os.environ.get("CDC_FAULTS", "")
    for item in filter(None, spec.split(",")):
        target, _, action = item.strip().partition("=")
        point, _, only = target.partition("@")
        if point != name or (only and only != table) or action not in ("raise", "kill"):
            continue
        once = os.environ.get("CDC_FAULTS_ONCE_DIR")
        if once:
            os.makedirs(once, exist_ok=True)
            try:
                os.close(os.open(os.path.join(once, f"{name}@{table}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        log.error("fault injection: %s at %s (%s)", action, name, table)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected fault at {name} for {table} (CDC_FAULTS is set)")


def _ts(value: str | None) -> datetime | None:
    # Keep the time zone: PySpark reads a naive datetime literal as driver-local time.
    return datetime.fromisoformat(value).astimezone(UTC) if value else None


def _write_text(spark: SparkSession, path: str, text: str) -> None:
    """Write a small file through Hadoop's FileSystem, so any Spark-readable URI works."""
    fs, p = _fs(spark, path)
    out = fs.create(p, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()


def _list_output(spark: SparkSession, path: str, prefix: str = "") -> list[dict[str, Any]]:
    """Data files under ``path``, by name; those of partition directories as ``<dir>/<file>``."""
    jvm = spark._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    fs = p.getFileSystem(spark._jsc.hadoopConfiguration())
    files = []
    for st in fs.listStatus(p):
        name = st.getPath().getName()
        if st.isFile() and not name.startswith(("_", ".")):
            files.append({"name": prefix + name, "size": int(st.getLen())})
        elif st.isDirectory() and not prefix and partition_dir_value(name) is not None:
            files += _list_output(spark, f"{path.rstrip('/')}/{name}", prefix=f"{name}/")
    return sorted(files, key=lambda f: f["name"])


def _written_partitions(files: list[dict[str, Any]], out: str) -> dict[str, str]:
    """Partition value -> directory of every partition the job wrote (from the listed files)."""
    dirs = {f["name"].split("/", 1)[0] for f in files if "/" in f["name"]}
    return {value: f"{out.rstrip('/')}/{d}" for d in sorted(dirs) if (value := partition_dir_value(d)) is not None}


def new_attempt() -> str:
    """A fresh, unique attempt token: every run of the job writes a directory of its own."""
    return "a" + uuid.uuid4().hex[:10]


def attempt_locations(plan: dict[str, Any], attempt: str | None) -> tuple[str, str]:
    """(output, quarantine) directories of one attempt at ``plan``: ``<version>-<attempt>``.

    A re-run of the compaction (a cleared task, a retry, a second deployment) never writes
    into a directory another attempt wrote, least of all the one a commit made live.
    Without an attempt (tests driving ``run`` directly) the plan's locations are used as-is.
    """
    out, quarantine = plan["output_location"].rstrip("/"), plan["quarantine_location"].rstrip("/")
    return (f"{out}-{attempt}", f"{quarantine}-{attempt}") if attempt else (out, quarantine)


def _fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    return p.getFileSystem(spark._jsc.hadoopConfiguration()), p


def _read_small(spark: SparkSession, path: str) -> str | None:
    """A small file's text through Hadoop's FileSystem, or None if it does not exist."""
    fs, p = _fs(spark, path)
    if not fs.exists(p):
        return None
    stream = fs.open(p)
    try:
        reader = spark._jvm.java.io.BufferedReader(spark._jvm.java.io.InputStreamReader(stream, "UTF-8"))
        lines = []
        while (line := reader.readLine()) is not None:
            lines.append(line)
        return "\n".join(lines)
    finally:
        stream.close()


def committed_already(spark: SparkSession, plan: dict[str, Any]) -> bool:
    """True if ``plan`` was committed already: there is nothing left to compute.

    Raises if another plan took the plan's commit number: the plan is stale.
    """
    path = plan.get("commit_path")
    text = _read_small(spark, path) if path else None
    if text is None:
        return False
    owner = json.loads(text).get("plan_id")
    if owner != plan["plan_id"]:
        raise PermanentJobError(
            f"{plan['table']}: commit {plan['seq']} was made by plan {owner}, so plan {plan['plan_id']} is stale; "
            "nothing was written. Clear the run's plan task to plan again"
        )
    return True


def run(spark: SparkSession, plan: dict[str, Any], attempt: str | None = None) -> dict[str, Any]:
    """Compact according to ``plan`` into the attempt's own directory; write its stats; return them.

    If the plan was committed already, nothing is written and ``{"already_committed": True}``
    is returned: re-running a finished run's compaction is a no-op.
    """
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    if committed_already(spark, plan):
        log.info("%s: plan %s is committed already; nothing to do", plan["table"], plan["plan_id"])
        return {"plan_id": plan["plan_id"], "table": plan["table"], "already_committed": True}
    columns: list[str] = plan["column_names"]
    rule: dict[str, str] = plan["rule"]
    pk: list[str] = plan["primary_key"]
    ingested_at = _ts(plan["ingested_at"])
    cutoff = _ts(plan.get("tombstone_cutoff"))
    out, quarantine = attempt_locations(plan, attempt)
    # Partitioned tables (registry partition_by): only the partitions the increments touch are
    # read and rewritten; the plan lists the live version's partitions as {value: location}.
    part: dict[str, str] | None = plan.get("partition_by")
    base_map: dict[str, str] = plan.get("base_partitions") or {}
    base_schema = f"{plan['schema_ddl']}, {META_DDL}"
    touched: list[str] = []
    log.info("compacting %s (plan %s): %d files", plan["table"], plan["plan_id"], len(plan["files"]))

    if part is None:
        base = spark.read.schema(base_schema).parquet(plan["base_location"])
        base = base.select(*[F.col(f"`{c}`") for c in columns + META_COLUMNS])
    else:
        # Key columns only: finding the keys' partitions must not read whole rows.
        base_keys = read_partitions(spark, base_schema, base_map).select(*_keys(pk), F.col(PARTITION_COLUMN))

    paths = [f["path"] for f in plan["files"]]
    raw = spark.read.schema(plan["schema_ddl"]).parquet(*paths)
    # Not cached: re-reading the planned files (only the columns each use needs) is cheaper than
    # building an in-memory copy of every event, which a large increment spills anyway.
    classified = classify(with_provenance(raw, columns), rule["reject_reason"])
    touched_ranks: DataFrame | None = None
    try:
        totals = classified.agg(F.count(F.lit(1)).alias("rows"), F.count("_cdc_reject_reason").alias("bad")).first()
        increment_rows, rejected_rows = int(totals["rows"]), int(totals["bad"])
        bad = rejected(classified, plan["plan_id"])
        if rejected_rows:
            bad.write.mode("errorifexists" if attempt else "overwrite").parquet(quarantine)
            counts = bad.groupBy("_cdc_reject_reason", "_cdc_increment", "_cdc_file").count().collect()
            reasons: dict[str, int] = {}
            by_file: dict[str, int] = {}
            for r in counts:
                reasons[r["_cdc_reject_reason"]] = reasons.get(r["_cdc_reject_reason"], 0) + r["count"]
                where = f"{r['_cdc_increment']}/{r['_cdc_file']}"
                by_file[where] = by_file.get(where, 0) + r["count"]
        else:
            reasons, by_file = {}, {}

        # Few events (the usual hourly run): rank only the keys they touch; see rank_touched_keys.
        # Not when the events outnumber the base (a first load): one ranking of every row is cheaper then.
        lookup_max = int(plan.get("key_lookup_max_events", KEY_LOOKUP_MAX_EVENTS))
        lookup = part is None and increment_rows - rejected_rows <= min(lookup_max, plan.get("base_rows", lookup_max))
        if lookup:
            fresh = accepted(classified, ingested_at)
            order_by = plan.get("order_by") or columns
            # Cached (it is read three times) in as many partitions as adaptive execution chooses, not 200.
            spark.conf.set("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning", "true")
            touched_ranks = rank_touched_keys(base, fresh, pk, order_by, rule["rank"]).persist()
            lookup_superseded = touched_ranks.filter(F.col("_cdc_rank") > 1).count()
            ranked_events = winners_by_key_lookup(base, fresh, touched_ranks, pk)
        elif part is None:
            events = base.unionByName(accepted(classified, ingested_at))
            ranked_events = ranked(events, rule["rank"])
        else:
            fresh = accepted(classified, ingested_at)
            found = touched_partitions(base_keys, fresh, pk, part["column"], part["value"]).collect()
            touched = sorted(r[PARTITION_COLUMN] for r in found)
            base = read_partitions(spark, base_schema, {v: base_map[v] for v in touched if v in base_map})
            base = base.select(*[F.col(f"`{c}`") for c in [*columns, *META_COLUMNS, PARTITION_COLUMN]])
            events = base.unionByName(fresh.withColumn(PARTITION_COLUMN, F.lit(None).cast("string")))
            ranked_events = assign_partitions(ranked(events, rule["rank"]), pk, part["column"], part["value"])
        obs = Observation("cdc_compaction")
        is_winner = F.col("_cdc_rank") == 1
        observed = ranked_events.observe(
            obs,
            F.count(F.lit(1)).alias("events"),
            F.coalesce(F.sum(F.when(~is_winner, 1).otherwise(0)), F.lit(0)).alias("superseded"),
            F.coalesce(
                F.sum(F.when(is_winner & expired_tombstone(rule["is_delete"], cutoff), 1).otherwise(0)), F.lit(0)
            ).alias("expired_tombstones"),
        )
        # Always the registry's column order: the key-lookup path's joins put the key columns
        # first, and validate (and every reader of the base table) expects the registry's order.
        out_columns = [*columns, *META_COLUMNS, *([PARTITION_COLUMN] if part is not None else [])]
        result = new_base(observed, rule["is_delete"], cutoff).select(*[F.col(f"`{c}`") for c in out_columns])
        if part is not None:
            # One task per partition value, so one file per partition (split at max_records_per_file)
            # rather than one per task and partition; output_files is sized for a whole-table rewrite.
            result = result.repartition(F.col(PARTITION_COLUMN))
        elif plan.get("output_files"):
            # Files of about the registry's target size (see tasks.output_sizing): merge, never shuffle.
            result = result.coalesce(int(plan["output_files"]))
        # errorifexists: an attempt's directory is new; finding one there means something is wrong.
        writer = result.write.mode("errorifexists" if attempt else "overwrite").option(
            "compression", plan.get("compression", "snappy")
        )
        if plan.get("max_records_per_file"):
            writer = writer.option("maxRecordsPerFile", int(plan["max_records_per_file"]))
        if part is not None:
            writer = writer.partitionBy(PARTITION_COLUMN)
        writer.parquet(out)
        metrics = obs.get
        if lookup:
            # The observation saw the winners only; the ranking of the touched keys counted the rest.
            metrics = {**metrics, "events": int(metrics["events"]) + lookup_superseded, "superseded": lookup_superseded}
    finally:
        if touched_ranks is not None:
            touched_ranks.unpersist()

    # Re-read what landed on storage: these checks gate publishing (see validate).
    tallies = [
        F.count(F.lit(1)).alias("rows"),
        F.coalesce(F.sum(F.when(F.expr(rule["is_delete"]), 1).otherwise(0)), F.lit(0)).alias("tombstones"),
    ]
    partitioned: dict[str, Any] = {}
    if part is None:
        written = spark.read.schema(base_schema).parquet(out)
        check = written.agg(*tallies).first()
    else:
        written = spark.read.schema(f"{base_schema}, {PARTITION_DDL}").parquet(out)
        per_partition = {r[PARTITION_COLUMN]: r for r in written.groupBy(PARTITION_COLUMN).agg(*tallies).collect()}
        check = {k: sum(int(r[k]) for r in per_partition.values()) for k in ("rows", "tombstones")}
        partitioned["partition_rows"] = {v: int(r["rows"]) for v, r in sorted(per_partition.items())}
    duplicate_keys = written.groupBy(*_keys(pk)).count().filter(F.col("count") > 1).count()
    output_files = _list_output(spark, out)
    if part is not None:
        # A key must not survive both in a rewritten partition and in one reused as it is.
        if partitioned["partition_rows"]:
            reused_keys = base_keys.filter(~F.col(PARTITION_COLUMN).isin(touched))
            duplicate_keys += reused_keys.join(written.select(*_keys(pk)), on=pk, how="left_semi").count()
        written_map = _written_partitions(output_files, out)
        if sorted(written_map) != sorted(partitioned["partition_rows"]):
            raise RuntimeError(
                f"{plan['table']}: partition directories {sorted(written_map)} in {out} do not match the "
                f"partitions of the rows read back {sorted(partitioned['partition_rows'])}"
            )
        partitioned.update(
            {
                "partition_by": {"column": part["column"], "transform": part["transform"]},
                "partitions": written_map,
                "partitions_touched": touched,
                "partitions_rewritten": len(written_map),
                "partitions_reused": len(set(base_map) - set(touched)),
            }
        )
    events_total = int(metrics["events"])
    stats = {
        "plan_id": plan["plan_id"],
        "table": plan["table"],
        "attempt": attempt or "",
        "base_rows": events_total - (increment_rows - rejected_rows),
        "increment_rows": increment_rows,
        "rejected_rows": rejected_rows,
        "rejected_by_reason": reasons,
        "rejected_by_file": by_file,
        "superseded_rows": int(metrics["superseded"]),
        "expired_tombstones": int(metrics["expired_tombstones"]),
        "output_rows": int(check["rows"]),
        "output_tombstones": int(check["tombstones"]),
        "output_visible_rows": int(check["rows"]) - int(check["tombstones"]),
        "duplicate_keys": int(duplicate_keys),
        "output_files": output_files,
        "finished_at": datetime.now(UTC).isoformat(),
        **partitioned,
    }
    fault_point("compact.before_stats", plan["table"])
    _write_text(spark, f"{out.rstrip('/')}/{STATS_FILE}", json.dumps(stats, indent=1, sort_keys=True))
    log.info("compacted %s: %s", plan["table"], {k: v for k, v in stats.items() if k != "output_files"})
    return stats


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
        plan = _read_plan(spark, args.plan)
        spark.sparkContext.setJobDescription(f"cdc compaction of {plan['table']} ({plan['plan_id']})")
        stats = run(spark, plan, attempt=new_attempt())
        print(json.dumps({"cdc_compaction_stats": {k: v for k, v in stats.items() if k != "output_files"}}))
    except PermanentJobError as exc:
        log.error("permanent error, retrying cannot help: %s", exc)
        marker = {"plan_id": plan["plan_id"], "seq": plan["seq"], "table": plan["table"], "error": str(exc)}
        _write_text(spark, args.plan.removesuffix(".json") + ".permanent_error.json", json.dumps(marker))
        return PERMANENT_EXIT_CODE
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
