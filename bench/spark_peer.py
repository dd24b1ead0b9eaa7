"""The Spark peers: delta-spark MERGE (the pinned Spark) and Iceberg MERGE INTO (Spark 4.1), each in two variants.

What a Spark shop would run instead of the compaction: the base is a Delta table (loaded by
``--mode prepare`` before any timing, as a table that already exists), and the increment is
MERGEd into it with Delta Lake's own ``MERGE INTO``. The rule is the delta-rs peer's
(``bench/peer.py``, ``run_delta``) and so the compaction's (``../shared/conformance/README.md``):
refused events (null key, null ordering value, unknown op) are left out; each key's winner
among the events (greatest by the ordering columns, then increment, file, row position: a MERGE
takes one source row per key) updates its row when it ranks above it, a newer delete that is older
than the tombstone cutoff deletes the row, a new key is inserted, and the base's own expired
tombstones are deleted. A delete winner otherwise stays as a tombstone row, as in ours, so the
checksum (``peer.checksum``, over all columns with the ``_cdc_`` provenance) must equal ours.

Variants (``--variant``): ``delta_cow`` (``delta.enableDeletionVectors=false``: MERGE rewrites the
files it touches) and ``delta_dv`` (``delta.enableDeletionVectors=true``: MERGE marks replaced rows
in deletion vectors and writes only the new ones; readers pay for it, so its runs also time one
full read of the table after the MERGE); ``iceberg_cow`` and ``iceberg_mor`` (Iceberg's ``write.merge.mode``,
``write.update.mode`` and ``write.delete.mode`` all ``copy-on-write``, or all ``merge-on-read``: MERGE writes
position delete files and readers apply them, so ``iceberg_mor`` times one full read too).

Iceberg's Spark runtime is built for Spark 4.1 and older only (``iceberg-spark-runtime-4.1_2.13`` 1.12.0, jars.lock's
``iceberg-spark`` group), so its variants run on the second, reading-only Spark 4.1.4 (``make iceberg-spark``,
``cdc_compaction.devtools.iceberg_spark.spark_home``), not on the pinned 4.2: ours / Iceberg mixes two Spark versions.
Their table lives in a Hadoop catalog (``bench_ice``, ``type=hadoop``, no catalog service) whose warehouse is
``--table``; one table per variant. An Iceberg table cannot be copied as a directory (its metadata holds absolute
paths), so a "fresh copy" of it is the table set back to its base snapshot (``set_current_snapshot``, untimed).

Modes, each one spark-submit with the compaction's own command line plus Delta's jars and conf
(``bench/compaction.py`` builds it, :func:`submit_extra`):

* ``prepare``: write the base (visible rows and tombstones, with the ``_cdc_`` columns) as a Delta
  table per variant: ``--table DIR`` for ``delta_cow``, ``--dv-table DIR`` for ``delta_dv``;
* ``cold``: MERGE into ``--table`` (a fresh copy of the prepared one) and, for ``delta_dv``, read it
  whole; the runner measures the process, JVM start included, as it measures ours' spark-submit;
* ``warm``: in one JVM, an untimed warm-up then ``--repeats`` timed MERGEs (+ read), each into a fresh
  copy of ``--table``; writes each run's seconds to ``--timings`` and the last result's rows, and
  those of ``--cold-table``, as plain Parquet (``--export``, ``--cold-export``) for the checksum.
  ``--ours`` (ours' output) is read whole after each run too: ours' side of "once a read is counted".

    spark-submit --jars <delta jars> --conf ... bench/spark_peer.py --mode cold --variant delta_cow \\
        --spec <peer_spec.json> --table <dir>
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DELTA_VARIANTS = ("delta_cow", "delta_dv")
ICEBERG_VARIANTS = ("iceberg_cow", "iceberg_mor")
VARIANTS = DELTA_VARIANTS + ICEBERG_VARIANTS
#: The variants whose MERGE leaves work to the readers: their runs also time one full read after it.
READ_AFTER = ("delta_dv", "iceberg_mor")
#: Spark conf that turns Delta Lake on in a session (its SQL extension and catalog), as Delta's docs say.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
#: The jars.lock group that holds delta-spark and delta-storage.
JAR_GROUP = "delta-spark"
#: Spark conf that turns Iceberg's SQL (MERGE INTO, its procedures) on; the catalog is set in the session.
ICEBERG_CONF = {"spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"}
#: The Iceberg tables' Hadoop catalog (its warehouse: ``--table``) and namespace.
ICEBERG_CATALOG = "bench_ice"
ICEBERG_NAMESPACE = "bench"
#: Each Iceberg variant's write mode, for MERGE, UPDATE and DELETE alike.
ICEBERG_MODES = {"iceberg_cow": "copy-on-write", "iceberg_mor": "merge-on-read"}
META_DDL = "`_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint, `_cdc_ingested_at` timestamp"
META = ["_cdc_increment", "_cdc_file", "_cdc_pos", "_cdc_ingested_at"]


def bq(name: str) -> str:
    """A Spark SQL identifier in backticks."""
    return "`" + name.replace("`", "``") + "`"


def slit(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def submit_extra(jars: list[str], conf: dict[str, str] | None = None) -> list[str]:
    """spark-submit options that add a table format to the compaction's command line (jars, extension, catalog).

    ``conf``: Delta Lake's (the default) or ``ICEBERG_CONF``.
    """
    extra = ["--jars", ",".join(jars)]
    for key, value in (DELTA_CONF if conf is None else conf).items():
        extra += ["--conf", f"{key}={value}"]
    return extra


def iceberg_env(spark_home: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` for Spark 4.1.4's spark-submit at ``spark_home``: its own home and, first on the path, its own pyspark.

    Without them its launcher would find the pinned Spark (4.2) and the driver would import that pyspark.
    """
    site = str(Path(spark_home).parent)
    return {
        **env,
        "SPARK_HOME": spark_home,
        "PYTHONPATH": os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p),
    }


def with_extra(command: list[str], application: str, extra: list[str]) -> list[str]:
    """``command`` (a spark-submit line running ``application``) with ``extra`` options before the application.

    A ``--jars`` already there (the registry's jars) is merged with ``extra``'s: spark-submit keeps the last one.
    """
    cmd = list(command)
    extra = list(extra)
    if "--jars" in cmd and "--jars" in extra:
        i, j = cmd.index("--jars"), extra.index("--jars")
        cmd[i + 1] = ",".join([cmd[i + 1], extra[j + 1]])
        del extra[j : j + 2]
    at = cmd.index(application)
    return cmd[:at] + extra + cmd[at:]


def _ddl(spec: dict[str, Any]) -> str:
    return ", ".join(f"{bq(c['name'])} {c['type']}" for c in spec["columns"])


def _base_files(spec: dict[str, Any]) -> list[str]:
    """The base version's directories: its visible rows and its tombstones (as the floor and ours read them)."""
    return [d for d in (spec["base_location"], spec.get("base_tombstones_location")) if d]


def _names(spec: dict[str, Any]) -> list[str]:
    return [c["name"] for c in spec["columns"]] + META


def is_iceberg(variant: str) -> bool:
    return variant in ICEBERG_VARIANTS


def iceberg_table(variant: str) -> str:
    """The Iceberg variant's table in the session's Hadoop catalog."""
    return f"{ICEBERG_CATALOG}.{ICEBERG_NAMESPACE}.{variant}"


def use_iceberg_warehouse(spark: Any, warehouse: str) -> None:
    """Open the Hadoop catalog ``bench_ice`` at ``warehouse`` in this session (before its first use)."""
    prefix = f"spark.sql.catalog.{ICEBERG_CATALOG}"
    spark.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set(f"{prefix}.type", "hadoop")
    spark.conf.set(f"{prefix}.warehouse", warehouse)
    # A MERGE after set_current_snapshot sees the table as it is now, not as an earlier statement cached it.
    spark.conf.set(f"{prefix}.cache-enabled", "false")


def target(variant: str, table: str) -> str:
    """The SQL name of the variant's table: Delta's by its path, Iceberg's in the catalog."""
    return iceberg_table(variant) if is_iceberg(variant) else f"delta.{bq(table)}"


def load(spark: Any, variant: str, table: str) -> Any:
    """The variant's table as a DataFrame (its current version)."""
    return spark.table(iceberg_table(variant)) if is_iceberg(variant) else spark.read.format("delta").load(table)


def prepare(spark: Any, spec: dict[str, Any], tables: dict[str, str]) -> None:
    """Load the base into a table per variant (``tables``: variant -> Delta directory or Iceberg warehouse), untimed."""
    base = spark.read.schema(f"{_ddl(spec)}, {META_DDL}").parquet(*_base_files(spec))
    base = base.select(*[bq(n) for n in _names(spec)]).cache()
    try:
        for variant, table in tables.items():
            if is_iceberg(variant):
                mode = ICEBERG_MODES[variant]
                writer = base.writeTo(iceberg_table(variant)).using("iceberg").tableProperty("format-version", "2")
                for op in ("merge", "update", "delete"):
                    writer = writer.tableProperty(f"write.{op}.mode", mode)
                writer.createOrReplace()
                continue
            shutil.rmtree(table, ignore_errors=True)
            dv = "true" if variant == "delta_dv" else "false"
            base.write.format("delta").option("delta.enableDeletionVectors", dv).save(table)
    finally:
        base.unpersist()


def iceberg_base_snapshot(spark: Any, variant: str) -> int:
    """The snapshot ``prepare`` wrote: the table's first."""
    rows = spark.sql(f"SELECT snapshot_id FROM {iceberg_table(variant)}.snapshots ORDER BY committed_at LIMIT 1")
    return int(rows.collect()[0][0])


def reset_iceberg(spark: Any, variant: str, snapshot_id: int) -> None:
    """The Iceberg table back at its base snapshot: its "fresh copy" (the MERGE's input is the base again)."""
    spark.sql(
        f"CALL {ICEBERG_CATALOG}.system.set_current_snapshot("
        f"table => {slit(ICEBERG_NAMESPACE + '.' + variant)}, snapshot_id => {int(snapshot_id)})"
    )


def events(spark: Any, spec: dict[str, Any]) -> Any:
    """The valid events with their provenance, each key's winner among them only (a MERGE takes one per key)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    raw = spark.read.schema(_ddl(spec)).parquet(*spec["files"])
    rows = raw.select(
        *[F.col(bq(c["name"])) for c in spec["columns"]],
        F.element_at(F.split(F.col("_metadata.file_path"), "/"), -2).alias("_cdc_increment"),
        F.col("_metadata.file_name").alias("_cdc_file"),
        F.col("_metadata.row_index").alias("_cdc_pos"),
        F.lit(spec["ingested_at"]).cast("timestamp").alias("_cdc_ingested_at"),
    )
    valid = F.col(bq(spec["op_column"])).isin(list(spec["op_codes"].values()))
    for c in spec["primary_key"] + spec["order_by"]:
        valid = valid & F.col(bq(c)).isNotNull()
    order = [*spec["order_by"], "_cdc_increment", "_cdc_file", "_cdc_pos"]
    rank = Window.partitionBy(*[F.col(bq(c)) for c in spec["primary_key"]]).orderBy(
        *[F.col(bq(c)).desc() for c in order]
    )
    return (
        rows.filter(valid)
        .withColumn("_peer_rank", F.row_number().over(rank))
        .filter("_peer_rank = 1")
        .drop("_peer_rank")
    )


def _newer(names: list[str]) -> str:
    """SQL: the source row ``s`` ranks above the target row ``t`` by ``names`` in turn (all NOT NULL)."""
    first, rest = bq(names[0]), names[1:]
    if not rest:
        return f"s.{first} > t.{first}"
    return f"(s.{first} > t.{first} OR (s.{first} = t.{first} AND {_newer(rest)}))"


def _expired(spec: dict[str, Any], alias: str) -> str:
    """SQL: a delete older than the tombstone cutoff (``alias``: the table alias with its dot, or none)."""
    cutoff = spec.get("tombstone_cutoff")
    if not cutoff:
        return "FALSE"
    at = datetime.fromisoformat(cutoff).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    op, delete = bq(spec["op_column"]), slit(spec["op_codes"]["delete"])
    return f"({alias}{op} = {delete} AND {alias}_cdc_ingested_at < TIMESTAMP {slit(at)})"


def merge_sql(spec: dict[str, Any], target: str, source: str) -> list[str]:
    """The statements that MERGE the view ``source`` into the table named ``target`` (the delta-rs peer's rule).

    The same for Delta and Iceberg: both take ``UPDATE SET *`` and ``INSERT *`` by column name.
    """
    on = " AND ".join(f"t.{bq(c)} = s.{bq(c)}" for c in spec["primary_key"])
    newer = _newer([*spec["order_by"], "_cdc_increment", "_cdc_file", "_cdc_pos"])
    statements = [
        f"MERGE INTO {target} AS t USING {source} AS s ON {on} "
        f"WHEN MATCHED AND {newer} AND {_expired(spec, 's.')} THEN DELETE "
        f"WHEN MATCHED AND {newer} THEN UPDATE SET * "
        f"WHEN NOT MATCHED AND NOT {_expired(spec, 's.')} THEN INSERT *"
    ]
    if spec.get("tombstone_cutoff"):
        # The base's own tombstones that expired (no event touched them): deleted like the others drop them.
        statements.append(f"DELETE FROM {target} WHERE {_expired(spec, '')}")
    return statements


def merge(spark: Any, spec: dict[str, Any], variant: str, table: str) -> None:
    """MERGE the increment into the variant's table (``table``: Delta's directory; Iceberg's warehouse)."""
    events(spark, spec).createOrReplaceTempView("cdc_peer_events")
    for statement in merge_sql(spec, target(variant, table), "cdc_peer_events"):
        spark.sql(statement)


def full_read(frame: Any) -> None:
    """Read every row and column of ``frame``: the sum of a hash of each whole row, so no column is pruned.

    Not Spark's no-op sink: delta-spark 4.4 refuses it on a table with deletion vectors ("Cannot work
    with a non-pinned table snapshot of the TahoeFileIndex"). Ours' output is read the same way.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    frame.select(F.bit_xor(F.xxhash64(*[F.col(bq(c)) for c in frame.columns]))).collect()


def export(spark: Any, spec: dict[str, Any], variant: str, table: str, out: str) -> None:
    """The variant's table's current rows as plain Parquet under ``out`` (what ``peer.checksum`` reads)."""
    load(spark, variant, table).select(*[bq(n) for n in _names(spec)]).write.mode("overwrite").parquet(out)


def fresh_copy(source: str, dest: str) -> str:
    """A copy of the Delta table ``source`` at ``dest``: data files hard-linked (Delta never rewrites one), the log
    copied (a checkpoint pointer may be rewritten in place)."""
    shutil.rmtree(dest, ignore_errors=True)

    def link_or_copy(src: str, dst: str) -> None:
        if "_delta_log" in Path(src).parts:
            shutil.copy2(src, dst)
            return
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, dest, copy_function=link_or_copy)
    return dest


def one_run(spark: Any, spec: dict[str, Any], variant: str, table: str, ours: str | None) -> dict[str, float]:
    """MERGE into ``table``, then (deletion vectors, merge-on-read) read it whole; then (``ours``: comma-separated
    directories) read ours' output whole. Returns each phase's seconds and ``wall_s``, the peer's own (MERGE and its
    read)."""
    times: dict[str, float] = {}
    t = time.perf_counter()
    merge(spark, spec, variant, table)
    times["merge_s"] = time.perf_counter() - t
    if variant in READ_AFTER:
        t = time.perf_counter()
        full_read(load(spark, variant, table))
        times["read_s"] = time.perf_counter() - t
    times["wall_s"] = sum(times.values())
    if ours:
        t = time.perf_counter()
        full_read(spark.read.parquet(*ours.split(",")))
        times["ours_read_s"] = time.perf_counter() - t
    return {k: round(v, 3) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="delta-spark or Iceberg MERGE of the benchmark's increment.")
    parser.add_argument("--mode", choices=["prepare", "cold", "warm"], required=True)
    parser.add_argument("--variant", choices=VARIANTS, default="delta_cow")
    parser.add_argument("--spec", required=True)
    parser.add_argument(
        "--table", required=True, help="the Delta table (prepare: the copy-on-write one), or Iceberg's warehouse"
    )
    parser.add_argument("--dv-table", help="prepare: the deletion-vector table")
    parser.add_argument("--iceberg", help="prepare: these Iceberg variants' tables in the warehouse --table instead")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", help="warm: where each run's copy of --table goes")
    parser.add_argument("--timings", help="cold/warm: write the runs' seconds here (JSON)")
    parser.add_argument("--export", help="warm: the last run's rows as Parquet")
    parser.add_argument("--cold-table", help="warm: the cold run's table, exported to --cold-export")
    parser.add_argument("--cold-export")
    parser.add_argument("--ours", help="warm: ours' output directories (comma-separated), read whole after each run")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    iceberg = bool(args.iceberg) if args.mode == "prepare" else is_iceberg(args.variant)
    if iceberg:
        use_iceberg_warehouse(spark, args.table)
    try:
        if args.mode == "prepare":
            if args.iceberg:
                tables = {v: args.table for v in args.iceberg.split(",") if v}
            else:
                tables = {"delta_cow": args.table, **({"delta_dv": args.dv_table} if args.dv_table else {})}
            prepare(spark, spec, tables)
            return 0
        if args.mode == "cold":
            times = one_run(spark, spec, args.variant, args.table, None)
            if args.timings:
                Path(args.timings).write_text(json.dumps(times))
            return 0
        if args.cold_table and args.cold_export:
            # First: an Iceberg cold run's result is its table's current snapshot, which the runs below set back.
            export(spark, spec, args.variant, args.cold_table, args.cold_export)
        work = Path(args.work or Path(args.table).parent / f"{args.variant}_warm")
        ours = args.ours or None
        base_snapshot = iceberg_base_snapshot(spark, args.variant) if iceberg else 0

        def fresh(name: str) -> str:
            # Delta: a copy of the directory; Iceberg: the one table back at its base snapshot.
            if iceberg:
                reset_iceberg(spark, args.variant, base_snapshot)
                return args.table
            return fresh_copy(args.table, str(work / name))

        if args.repeats > 0:
            # The warm-up: this JVM's first MERGE (JIT, the format's classes and metadata code), not timed.
            one_run(spark, spec, args.variant, fresh("warmup"), ours)
            shutil.rmtree(work / "warmup", ignore_errors=True)
        runs = []
        last = ""
        for i in range(args.repeats):
            table = fresh(f"run{i}")
            runs.append(one_run(spark, spec, args.variant, table, ours))
            if last and not iceberg:
                shutil.rmtree(last, ignore_errors=True)
            last = table
        if args.export and last:
            export(spark, spec, args.variant, last, args.export)
        if args.timings:
            Path(args.timings).write_text(json.dumps(runs))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
