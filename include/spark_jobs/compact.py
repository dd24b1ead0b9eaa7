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
import signal
import sys
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

log = logging.getLogger("cdc_compaction.compact")

META_COLUMNS = ["_cdc_increment", "_cdc_file", "_cdc_pos", "_cdc_ingested_at"]
META_DDL = "`_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint, `_cdc_ingested_at` timestamp"
STATS_FILE = "_cdc_stats.json"


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
    jvm = spark._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    fs = p.getFileSystem(spark._jsc.hadoopConfiguration())
    out = fs.create(p, True)
    try:
        out.write(bytearray(text.encode("utf-8")))
    finally:
        out.close()


def _list_output(spark: SparkSession, path: str) -> list[dict[str, Any]]:
    jvm = spark._jvm
    p = jvm.org.apache.hadoop.fs.Path(path)
    fs = p.getFileSystem(spark._jsc.hadoopConfiguration())
    files = []
    for st in fs.listStatus(p):
        name = st.getPath().getName()
        if st.isFile() and not name.startswith(("_", ".")):
            files.append({"name": name, "size": int(st.getLen())})
    return sorted(files, key=lambda f: f["name"])


def run(spark: SparkSession, plan: dict[str, Any]) -> dict[str, Any]:
    """Compact according to ``plan``; write the new version and its stats; return the stats."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    columns: list[str] = plan["column_names"]
    rule: dict[str, str] = plan["rule"]
    pk: list[str] = plan["primary_key"]
    ingested_at = _ts(plan["ingested_at"])
    cutoff = _ts(plan.get("tombstone_cutoff"))
    out = plan["output_location"]

    base = spark.read.schema(f"{plan['schema_ddl']}, {META_DDL}").parquet(plan["base_location"])
    base = base.select(*[F.col(f"`{c}`") for c in columns + META_COLUMNS])

    paths = [f["path"] for f in plan["files"]]
    raw = spark.read.schema(plan["schema_ddl"]).parquet(*paths)
    classified = classify(with_provenance(raw, columns), rule["reject_reason"]).persist()
    try:
        increment_rows = classified.count()
        bad = rejected(classified, plan["plan_id"])
        rejected_rows = bad.count()
        if rejected_rows:
            bad.write.mode("overwrite").parquet(plan["quarantine_location"])
            counts = bad.groupBy("_cdc_reject_reason", "_cdc_increment", "_cdc_file").count().collect()
            reasons: dict[str, int] = {}
            by_file: dict[str, int] = {}
            for r in counts:
                reasons[r["_cdc_reject_reason"]] = reasons.get(r["_cdc_reject_reason"], 0) + r["count"]
                where = f"{r['_cdc_increment']}/{r['_cdc_file']}"
                by_file[where] = by_file.get(where, 0) + r["count"]
        else:
            reasons, by_file = {}, {}

        events = base.unionByName(accepted(classified, ingested_at))
        obs = Observation("cdc_compaction")
        is_winner = F.col("_cdc_rank") == 1
        observed = ranked(events, rule["rank"]).observe(
            obs,
            F.count(F.lit(1)).alias("events"),
            F.coalesce(F.sum(F.when(~is_winner, 1).otherwise(0)), F.lit(0)).alias("superseded"),
            F.coalesce(
                F.sum(F.when(is_winner & expired_tombstone(rule["is_delete"], cutoff), 1).otherwise(0)), F.lit(0)
            ).alias("expired_tombstones"),
        )
        result = new_base(observed, rule["is_delete"], cutoff)
        writer = result.write.mode("overwrite").option("compression", plan.get("compression", "snappy"))
        if plan.get("max_records_per_file"):
            writer = writer.option("maxRecordsPerFile", int(plan["max_records_per_file"]))
        writer.parquet(out)
        metrics = obs.get
    finally:
        classified.unpersist()

    # Re-read what landed on storage: these checks gate publishing (see validate).
    written = spark.read.schema(f"{plan['schema_ddl']}, {META_DDL}").parquet(out)
    check = written.agg(
        F.count(F.lit(1)).alias("rows"),
        F.coalesce(F.sum(F.when(F.expr(rule["is_delete"]), 1).otherwise(0)), F.lit(0)).alias("tombstones"),
    ).first()
    duplicate_keys = written.groupBy(*[F.col(f"`{c}`") for c in pk]).count().filter(F.col("count") > 1).count()
    events_total = int(metrics["events"])
    stats = {
        "plan_id": plan["plan_id"],
        "table": plan["table"],
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
        "output_files": _list_output(spark, out),
        "finished_at": datetime.now(UTC).isoformat(),
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
        stats = run(spark, plan)
        print(json.dumps({"cdc_compaction_stats": {k: v for k, v in stats.items() if k != "output_files"}}))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
