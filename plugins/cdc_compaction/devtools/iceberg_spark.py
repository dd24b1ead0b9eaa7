"""Spark with Iceberg's own runtime (``iceberg-spark-runtime``) reading the lake's Iceberg tables.

A Spark user reads an Iceberg table through a catalog: here the very catalog the publish writes
(pyiceberg's ``SqlCatalog`` in ``<root>/iceberg/metadata/catalog.db``, docs/formats.md), opened by
Iceberg's Java ``JdbcCatalog`` (``type=jdbc``, ``uri=jdbc:sqlite:<file>``) under its name ``cdc_<db>``:
the catalog's rows carry that name, and both sides lay the SQLite tables out alike (``iceberg_tables``
with ``iceberg_type``: Iceberg's schema version V1).  An older snapshot is read with
``VERSION AS OF <snapshot id>`` (Iceberg 1.12 refuses the ``snapshot-id`` read option on Spark 4.1), in
that snapshot's own schema: a column added since is not there (pyiceberg reads it as null).

Iceberg's Spark runtime is published for Spark 4.1 and older (``iceberg-spark-runtime-4.1_2.13``
1.12.0, jars.lock's ``iceberg-spark`` group); no build for Spark 4.2, the project's, is on Maven
Central.  So a second Spark, pyspark 4.1.4, is installed for reading only (``make iceberg-spark``:
``requirements-iceberg-spark.txt``, hash checked, into ``.venv/iceberg-spark``), and a Spark Connect
server is started from it (:func:`server`) with the runtime's jars.  The project's own pyspark-client
4.2 talks to that 4.1 server: reads are plain ``SELECT``s.  Each read opens a session of its own and
registers the catalog in it (catalogs are session settings), so a read sees the catalog as it is now.

Its one other user is the benchmark: ``bench/compaction.py --spark-peers iceberg_cow,iceberg_mor`` runs Iceberg's
``MERGE INTO`` with this Spark's spark-submit (:func:`spark_home`) on tables of its own (a Hadoop catalog in the run's
directory), never on the lake's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cdc_compaction.core.exceptions import CdcCompactionError
from cdc_compaction.core.jarcache import group_jars
from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.devtools.local_services import SparkConnectServer

#: The Spark the runtime is built for (requirements-iceberg-spark.txt) and the jars.lock group of the runtime.
SPARK_VERSION = "4.1.4"
JAR_GROUP = "iceberg-spark"
#: Where ``make iceberg-spark`` installs it; ``CDC_ICEBERG_SPARK`` points elsewhere.
DEFAULT_DIR = PROJECT_ROOT / ".venv" / "iceberg-spark"


class IcebergSparkError(CdcCompactionError):
    """The reading Spark is not installed, or the table cannot be read by it."""


def readers_dir() -> Path:
    return Path(os.environ.get("CDC_ICEBERG_SPARK") or DEFAULT_DIR)


def spark_home() -> Path:
    """The second Spark's home (its ``bin/spark-submit`` and ``jars/``); raise naming the fix if absent."""
    home = readers_dir() / "pyspark"
    core = home / "jars" / f"spark-core_2.13-{SPARK_VERSION}.jar"
    if not core.is_file():
        raise IcebergSparkError(
            f"Spark {SPARK_VERSION} for Iceberg's Spark runtime is not installed in {readers_dir()} ({core} is "
            "missing): run `make iceberg-spark` (requirements-iceberg-spark.txt)"
        )
    return home


def server(home: Path, metastore_uri: str, warehouse_dir: str, port: int) -> SparkConnectServer:
    """A Spark Connect server of the second Spark with Iceberg's runtime and SQL extensions (not started)."""
    return SparkConnectServer(
        home=home,
        metastore_uri=metastore_uri,
        warehouse_dir=warehouse_dir,
        port=port,
        master="local[2]",
        spark_home=spark_home(),
        extra_conf={
            "spark.jars": ",".join(group_jars(JAR_GROUP)),
            "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
            "spark.sql.shuffle.partitions": "2",
        },
    )


def catalog_conf(name: str, sqlite_file: str, warehouse: str) -> dict[str, str]:
    """The session settings that open the SQLite catalog ``sqlite_file`` as Iceberg's JdbcCatalog ``name``."""
    if "://" in sqlite_file:
        raise IcebergSparkError(
            f"the Iceberg catalog {sqlite_file} is not a local file: Spark's JdbcCatalog opens SQLite catalogs "
            "on local disk only; read tables on object stores through their catalog service"
        )
    prefix = f"spark.sql.catalog.{name}"
    return {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": "jdbc",
        f"{prefix}.uri": f"jdbc:sqlite:{sqlite_file}",
        # pyiceberg's layout (iceberg_type column): V1. With it the file stays as pyiceberg wrote it.
        f"{prefix}.jdbc.schema-version": "V1",
        f"{prefix}.warehouse": warehouse,
        # A read sees the catalog as it is now, not a table cached by an earlier statement.
        f"{prefix}.cache-enabled": "false",
    }


def read(
    connect_url: str,
    catalog: dict[str, str],
    table: str,
    columns: list[str],
    snapshot_id: int | None = None,
) -> list[dict[str, Any]]:
    """``columns`` of ``table`` (``<catalog>.<db>.<name>``) at ``snapshot_id`` (None: the current one)."""
    from cdc_compaction.integrations.engine import ConnectEngine

    with ConnectEngine(connect_url).session(None) as spark:
        for key, value in catalog.items():
            spark.conf.set(key, value)
        at = "" if snapshot_id is None else f" VERSION AS OF {int(snapshot_id)}"
        cols = ", ".join(f"`{c}`" for c in columns)
        return [r.asDict() for r in spark.sql(f"SELECT {cols} FROM {table}{at}").collect()]


def snapshots(connect_url: str, catalog: dict[str, str], table: str) -> dict[int, dict[str, str]]:
    """Every snapshot of ``table`` with its summary, from Iceberg's ``snapshots`` metadata table."""
    from cdc_compaction.integrations.engine import ConnectEngine

    with ConnectEngine(connect_url).session(None) as spark:
        for key, value in catalog.items():
            spark.conf.set(key, value)
        rows = spark.sql(f"SELECT snapshot_id, summary FROM {table}.snapshots").collect()
        return {int(r["snapshot_id"]): dict(r["summary"] or {}) for r in rows}
