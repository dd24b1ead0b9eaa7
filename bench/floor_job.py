"""The benchmark's floor: read base + increments and write them back as Parquet, no dedup.

It reads the plan file the compaction reads, the same way (the base version with the
registry schema plus the ``_cdc_`` columns, the planned files with their provenance from
``_metadata``), and writes every row to ``--out`` with the plan's compression and output
file sizing. No classification, no ranking, no counting, no re-read: whatever the
compaction costs on top of this is the price of the rule and its checks.

    spark-submit bench/floor_job.py --plan <plan.json> --out <dir>

``floor`` is the same work on a session the caller holds: ``bench/compaction.py`` runs it in a
Spark Connect server's session too (the warm floor), where ``spark.sparkContext`` does not exist.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

META_DDL = "`_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint, `_cdc_ingested_at` timestamp"
META_COLUMNS = ["_cdc_increment", "_cdc_file", "_cdc_pos", "_cdc_ingested_at"]


def is_connect(spark: SparkSession) -> bool:
    """True for a Spark Connect session (no ``sparkContext``: phases are named by tags there)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def name_phase(spark: SparkSession, description: str, tag: str) -> None:
    """Name the Spark jobs that follow, so that the Spark UI and the event log tell the floor's phases apart.

    Classic session: the job description (``setJobDescription``). Spark Connect has no
    ``sparkContext``: the session's operation tag instead (the Spark UI lists a job's tags;
    tags may not contain commas), replacing the previous phase's.
    """
    if is_connect(spark):
        spark.clearTags()
        spark.addTag(tag)
    else:
        spark.sparkContext.setJobDescription(description)


def floor(spark: SparkSession, plan: dict[str, Any], out: str) -> None:
    """Read the plan's base and planned files as the compaction does and write every row to ``out``."""
    table = plan.get("table", "?")
    name_phase(spark, f"cdc bench floor of {table}: read base + increments", "cdc-bench-floor-read")
    columns: list[str] = plan["column_names"]
    # The base's visible rows and its tombstones (a version keeps them in directories of their own).
    locations = [plan["base_location"]]
    if plan.get("base_tombstones_location"):
        locations.append(plan["base_tombstones_location"])
    base = spark.read.schema(f"{plan['schema_ddl']}, {META_DDL}").parquet(*locations)
    base = base.select(*[F.col(f"`{c}`") for c in columns + META_COLUMNS])
    raw = spark.read.schema(plan["schema_ddl"]).parquet(*[f["path"] for f in plan["files"]])
    increments = raw.select(
        *[F.col(f"`{c}`") for c in columns],
        F.element_at(F.split(F.col("_metadata.file_path"), "/"), -2).alias("_cdc_increment"),
        F.col("_metadata.file_name").alias("_cdc_file"),
        F.col("_metadata.row_index").alias("_cdc_pos"),
        F.lit(plan["ingested_at"]).cast("timestamp").alias("_cdc_ingested_at"),
    )
    result = base.unionByName(increments)
    if plan.get("output_files"):
        result = result.coalesce(int(plan["output_files"]))
    writer = result.write.mode("overwrite").option("compression", plan.get("compression", "snappy"))
    if plan.get("max_records_per_file"):
        writer = writer.option("maxRecordsPerFile", int(plan["max_records_per_file"]))
    # The reads are lazy: the write is the one action, so its jobs carry this phase's name.
    name_phase(spark, f"cdc bench floor of {table}: write every row to {out}", "cdc-bench-floor-write")
    writer.parquet(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Read base + planned increments and write them back, no dedup.")
    parser.add_argument("--plan", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    plan = json.loads(Path(args.plan).read_text(encoding="utf-8"))
    spark = SparkSession.builder.getOrCreate()
    try:
        floor(spark, plan, args.out)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
