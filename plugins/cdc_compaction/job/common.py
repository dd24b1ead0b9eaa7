"""What every table mode's compaction shares (Spark side): the plan, where an attempt writes, small files.

The mode modules (``job/modes/<mode>.py``) and the entry point (:mod:`cdc_compaction.job.compact`)
import this module and :mod:`~cdc_compaction.job.contract`; nothing here imports a mode or the
entry point, so the job's imports form no cycle.  Standard library and PySpark only, like the
rest of the job package.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from cdc_compaction.job import files
from cdc_compaction.job.contract import CHANGE_TYPE, CHANGES_DIR, FEED_CHANGE_TYPES, Plan

log = logging.getLogger(__name__)


class PermanentJobError(Exception):
    """An error no re-run of the job can heal (a stale plan): ``main`` exits with :data:`PERMANENT_EXIT_CODE`.

    It is also recorded beside the plan (:func:`~cdc_compaction.job.contract.permanent_error_path`)
    for engines whose exit status does not reach Airflow (EMR steps, cluster deploy mode).
    """


def as_plan(plan: Plan | Mapping[str, Any]) -> Plan:
    """``plan`` as a :class:`Plan`: the plan file's JSON object is checked for the keys the contract requires."""
    return plan if isinstance(plan, Plan) else Plan.from_dict(plan)


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


def rejected(classified: DataFrame, plan_id: str) -> DataFrame:
    """The refused events with their reason, as they go to quarantine."""
    return classified.filter(F.col("_cdc_reject_reason").isNotNull()).withColumn("_cdc_plan_id", F.lit(plan_id))


def observed(obs: Observation, name: str) -> int:
    """An observed metric, or 0 when Spark reported none: adaptive execution drops the whole plan,
    observation included, when its input turned out empty (nothing observed means nothing counted)."""
    try:
        return int(obs.get[name])
    except Exception:  # noqa: BLE001 - Py4J's error for "no metrics" is a plain assertion
        log.info("no %s metrics reported (empty input); counted as 0", name)
        return 0


def feed_tally_columns() -> list[Column]:
    """A change feed's rows by change type (:data:`FEED_CHANGE_TYPES`), as aggregates to observe as it is
    written (the job's stats ``change_feed.rows``, which ``validate`` holds against the file)."""
    return [F.coalesce(F.sum(F.when(F.col(CHANGE_TYPE) == k, 1)), F.lit(0)).alias(k) for k in FEED_CHANGE_TYPES]


def write_feed(spark: SparkSession, feed: DataFrame, plan: Plan, out: str, write_mode: str) -> dict[str, Any]:
    """Write commit ``plan.seq``'s change feed rows (``feed``) as one Parquet file in ``<out>/changes``.

    Counted by change type as it is written (no second pass); returns the stats' ``change_feed``:
    ``file`` (``changes/<name>``), ``seq`` and ``rows`` by change type.  One file, so ``publish``
    copies it as ``changes/c<seq>.parquet`` without reading a row.
    """
    where = f"{out}/{CHANGES_DIR}"
    obs = Observation("cdc_compaction_feed")
    feed.coalesce(1).observe(obs, *feed_tally_columns()).write.mode(write_mode).option(
        "compression", plan.compression or "snappy"
    ).parquet(where)
    written = data_files(spark, where, CHANGES_DIR)
    if len(written) != 1:
        raise RuntimeError(
            f"{plan.table}: the change feed of commit {plan.seq} must be one file in {where}, "
            f"Spark wrote {[f['name'] for f in written]}"
        )
    return {"file": written[0]["name"], "seq": int(plan.seq), "rows": {k: observed(obs, k) for k in FEED_CHANGE_TYPES}}


def parse_ts(value: str | None) -> datetime | None:
    """An ISO time of the plan in UTC (None for none)."""
    # Keep the time zone: PySpark reads a naive datetime literal as driver-local time.
    return datetime.fromisoformat(value).astimezone(UTC) if value else None


def write_text(spark: SparkSession, path: str, text: str) -> None:
    """Write a small file (Hadoop's FileSystem in a classic session, pyarrow over Spark Connect)."""
    files.for_session(spark).write_text(path, text)


def data_files(spark: SparkSession, path: str, rel: str) -> list[dict[str, Any]]:
    """Data files under ``path`` as ``<rel>/<file>`` (partition directories as ``<rel>/<dir>/<file>``).

    Anything else there -- Spark's ``_SUCCESS``, a local file system's ``.crc`` checksums, a
    committer's markers -- is deleted: the directory is this attempt's own, not yet committed,
    and a reader's glob over it must find Parquet data files and nothing else.
    """
    return files.for_session(spark).data_files(path, rel)


def no_bookkeeping_files(spark: SparkSession) -> None:
    """Write only data files: no ``_SUCCESS`` marker, no summary files, no ``.crc`` beside local files.

    Readers that glob a location (DuckDB's ``read_parquet('<dir>/*')``) would pick them up.
    What a cluster (or a Spark Connect server) still writes is removed by :func:`data_files`.
    """
    files.for_session(spark).quiet_writes()


def new_attempt() -> str:
    """A fresh, unique attempt token: every run of the job writes a directory of its own."""
    return "a" + uuid.uuid4().hex[:10]


def attempt_locations(plan: Plan | Mapping[str, Any], attempt: str | None) -> tuple[str, str]:
    """(output, quarantine) directories of one attempt at ``plan``: ``<version>-<attempt>``.

    A re-run of the compaction (a cleared task, a retry, a second deployment) never writes
    into a directory another attempt wrote, least of all the one a commit made live.
    Without an attempt (tests driving ``run`` directly) the plan's locations are used as-is.
    """
    p = as_plan(plan)
    out, quarantine = p.output_location.rstrip("/"), p.quarantine_location.rstrip("/")
    return (f"{out}-{attempt}", f"{quarantine}-{attempt}") if attempt else (out, quarantine)


def read_small(spark: SparkSession, path: str) -> str | None:
    """A small file's text, or None if it does not exist."""
    return files.for_session(spark).read_text(path)


#: Storage whose directories the driver lists faster than a Spark job would (no round trip per request to
#: amortise over executors): a local or mounted file system, HDFS. Object stores keep Spark's parallel listing.
DRIVER_LISTED_SCHEMES = frozenset({"", "file", "hdfs", "viewfs"})

#: Up to this many directories in one read, the driver lists them itself (README, "Key index").
DRIVER_LISTING_MAX = 10_000

#: Spark's setting: from this many paths on, a read lists them in a Spark job of its own (default 32).
PARALLEL_LISTING_CONF = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def list_on_driver(spark: SparkSession, locations: list[str]) -> bool:
    """Let the driver list ``locations`` itself when the storage allows it; True if it will.

    Spark lists more than 32 paths of one read in a Spark job of its own (a stage of one task
    per path). A partitioned table's key index is a directory per partition, so reading 100 of
    them cost a job before any key was read. On storage in :data:`DRIVER_LISTED_SCHEMES` the
    driver lists up to :data:`DRIVER_LISTING_MAX` directories faster than that job starts.
    """
    schemes = {loc.split("://", 1)[0].lower() if "://" in loc else "" for loc in locations}
    if not locations or len(locations) > DRIVER_LISTING_MAX or not schemes <= DRIVER_LISTED_SCHEMES:
        return False
    spark.conf.set(PARALLEL_LISTING_CONF, str(DRIVER_LISTING_MAX))
    return True


def set_job_description(spark: SparkSession, text: str | None) -> None:
    """Name the Spark jobs that follow (the UI's and a profile's description of each stage); None clears it.

    A Spark Connect session has no SparkContext (``spark.sparkContext`` raises): there the
    phases go unnamed rather than the job failing.
    """
    if files.is_connect(spark):
        return
    try:
        spark.sparkContext.setJobDescription(text)  # type: ignore[arg-type] - None clears it
    except Exception:
        log.debug("cannot set the job description %r", text, exc_info=True)
