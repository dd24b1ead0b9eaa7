"""Run conformance scenarios (``../shared/conformance/*.json``) through the pipeline.

Two modes, same storage, metastore, SQL and views:

* ``inprocess``: the task functions in order inside this process, with one
  SparkSession for the DDL and the compaction job -- fast, for many scenarios;
* ``dag``: every ``compact`` step is a real ``airflow dags test`` run of the table's
  DAG (SparkSubmitOperator, spark-submit and all).

Either way the base table and the view are read back and compared, as multisets of
rows, with the scenario's expectations -- by every reader given: Spark SQL through the
metastore (:class:`Reader`), and DuckDB (:class:`DuckDBReader`), which reads the published
base location with a plain ``read_parquet`` glob and queries the DuckDB views the pipeline
wrote, as a DuckDB user does.  A table with ``formats`` is also read as a Delta table
(:class:`DeltaReader`: delta-rs, polars, Spark, DuckDB, Trino) and an Iceberg table (:class:`IcebergReader`:
pyiceberg, polars, DuckDB, Spark, Trino), now and at every kept commit.
"""

from __future__ import annotations

import glob
import json
import logging
import posixpath
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cdc_compaction.core import sql
from cdc_compaction.core.inputs import arrow_schema
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.devtools.devenv import last_run_timings
from cdc_compaction.integrations.engine import SessionEngine
from cdc_compaction.job.contract import EFF_START_DATE_COLUMN, OPERATION_COLUMN
from cdc_compaction.pipeline import order
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

if TYPE_CHECKING:
    from cdc_compaction.devtools.hive import HiveServer
    from cdc_compaction.devtools.trino import TrinoServer

log = logging.getLogger(__name__)

DATABASE = "conformance"


@dataclass
class Scenario:
    """One scenario file."""

    path: Path
    name: str
    about: str
    table: dict[str, Any]
    steps: list[dict[str, Any]]

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(Path(path), doc["name"], doc.get("about", ""), doc["table"], doc["steps"])

    @property
    def table_name(self) -> str:
        return "s_" + re.sub(r"[^a-z0-9_]", "_", self.name.lower())[:100]


@dataclass
class ScenarioResult:
    name: str
    ok: bool
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def registry_doc(
    scn: Scenario,
    lake_dir: Path,
    suffix: str = "",
    partition_by: dict[str, str] | None = None,
    formats: list[str] | None = None,
    views_metastore: list[str] | None = None,
) -> dict[str, Any]:
    """A registry entry for a scenario's table: compact whatever landed, at once.

    ``partition_by`` makes it a partitioned table (registry ``partition_by``): the same
    scenario must give the same rows. ``formats`` (registry ``formats``): the table is also a
    Delta and/or Iceberg table, which :class:`DeltaReader` and :class:`IcebergReader` read.
    ``views_metastore`` (registry ``views.metastore``): the dialects of its views in the metastore
    (``trino`` for :class:`TrinoReader`'s).
    """
    t = scn.table
    doc: dict[str, Any] = {
        "database": DATABASE,
        "table": scn.table_name + suffix,
        "description": scn.about,
        # The scenario's table as written: its mode and that mode's fields (primary_key, order_by …).
        **{k: v for k, v in t.items() if k != "columns"},
        "columns": t["columns"],
        "storage_root": str(lake_dir / (scn.table_name + suffix)),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "schedule": None,
        "retries": 1,
        "retry_delay": "5s",
        "owner": "conformance",
        "tags": ["conformance"],
        "spark": {"conf": {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}},
        # DuckDB readers (DuckDBReader) query the views the pipeline writes here.
        # The scenario's own views settings (trino_catalog, …) are kept.
        "views": {**t.get("views", {}), "duckdb": str(lake_dir / "_duckdb" / f"{scn.table_name}{suffix}.sql")},
    }
    if partition_by is not None:
        doc["partition_by"] = partition_by
    if formats:
        doc["formats"] = list(formats)
    if views_metastore:
        doc["views"]["metastore"] = list(views_metastore)
    return doc


# ------------------------------------------------------------------ landing files
def _arrow_value(value: Any, hive_type: str) -> Any:
    if value is None:
        return None
    if hive_type.startswith("decimal"):
        return Decimal(str(value))
    if hive_type == "date" and isinstance(value, str):
        return date.fromisoformat(value)
    if hive_type == "timestamp" and isinstance(value, str):
        ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return ts if ts.tzinfo else ts.replace(tzinfo=UTC)
    return value


def land(cfg: TableConfig, increment: str, files: list[Any]) -> list[str]:
    """Write each file of the increment as one Parquet file, as the CDC sink would.

    A file is a list of rows (every registry column), or ``{"columns": [...], "rows": [...]}``
    for a file that has only those columns (AWS DMS writes its full-load files without ``Op``).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    full = arrow_schema(cfg)
    lake = Lake(cfg)
    d = posixpath.join(lake.layout.incremental, increment)
    lake.storage.makedirs(d)
    written = []
    for i, spec in enumerate(files):
        rows, names = (spec["rows"], spec["columns"]) if isinstance(spec, dict) else (spec, cfg.column_names)
        schema = pa.schema([full.field(n) for n in names])
        cols = {c.name: [_arrow_value(r.get(c.name), c.type) for r in rows] for c in cfg.columns if c.name in names}
        table = pa.table({n: pa.array(v, type=schema.field(n).type) for n, v in cols.items()}, schema=schema)
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf)
        path = posixpath.join(d, f"part-{i:05d}.parquet")
        lake.storage.write_bytes(path, buf.getvalue().to_pybytes())  # the sink publishes whole files only
        written.append(path)
    return written


# -------------------------------------------------------------------- comparing
def _norm(value: Any, hive_type: str) -> Any:
    if value is None:
        return None
    if hive_type.startswith("decimal"):
        return Decimal(str(value)).normalize()
    if hive_type in {"double", "float"}:
        return float(value)
    if hive_type in {"tinyint", "smallint", "int", "bigint"}:
        return int(value)
    if hive_type == "date":
        return value.isoformat() if isinstance(value, date) else str(value)
    if hive_type == "timestamp":
        if isinstance(value, str):
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat()
    return value


def _row_key(row: dict[str, Any], types: dict[str, str]) -> tuple[Any, ...]:
    return tuple(sorted((k, repr(_norm(row.get(k), t))) for k, t in types.items()))


def diff_rows(expected: list[dict[str, Any]], actual: list[dict[str, Any]], types: dict[str, str]) -> list[str]:
    """Multiset difference of rows, as readable lines (empty when equal)."""
    e = Counter(_row_key(r, types) for r in expected)
    a = Counter(_row_key(r, types) for r in actual)
    lines = []
    for k in sorted((e - a).elements()):
        lines.append("  - missing:    " + ", ".join(f"{c}={v}" for c, v in k))
    for k in sorted((a - e).elements()):
        lines.append("  + unexpected: " + ", ".join(f"{c}={v}" for c, v in k))
    return lines


def shown_columns(cfg: TableConfig) -> list[str]:
    """The base table's columns a scenario's ``expect`` lists: the registry's (snapshot: and operation, date)."""
    if cfg.mode == "snapshot":
        return [*cfg.column_names, OPERATION_COLUMN, EFF_START_DATE_COLUMN]
    return list(cfg.column_names)


def compared_types(cfg: TableConfig) -> dict[str, str]:
    """Column -> Hive type of what a scenario's rows are compared on (the op column is not)."""
    if cfg.mode == "snapshot":
        return {**{c.name: c.type for c in cfg.columns}, OPERATION_COLUMN: "string", EFF_START_DATE_COLUMN: "date"}
    return {c.name: c.type for c in cfg.columns if c.name != getattr(cfg, "op_column", None)}


#: A snapshot compaction's counts a scenario's compact step lists, as the job's stats hold them.
SNAPSHOT_COUNTS = ("counts", "applied", "replayed", "rejected", "refused")


def snapshot_count_failures(body: dict[str, Any], stats: dict[str, Any] | None) -> list[str]:
    """Where a snapshot compaction's counts differ from a scenario's compact step (README of its scenarios)."""
    stats = stats or {}
    got = {
        "counts": {op: int(n) for op, n in (stats.get("counts") or dict.fromkeys("IUNDX", 0)).items()},
        "applied": [inc for inc, _ in stats.get("applied", [])],
        "replayed": int(stats.get("replayed", 0)),
        "rejected": {k: v for k, v in (stats.get("rejected") or {}).items() if v},
        "refused": {k: v for k, v in (stats.get("refused") or {}).items() if v},
    }
    return [
        f"{key} {got[key]}, expected {body[key]}" for key in SNAPSHOT_COUNTS if key in body and got[key] != body[key]
    ]


# ---------------------------------------------------------------------- runners
class PointerFilesReader:
    """Reads what a reader without a metastore reads, on any storage (an S3 lake too): the live version's
    location(s) from ``_cdc/pointer.json``, every data file there read plainly (pyarrow through the lake's
    storage).  The base must hold the visible rows and nothing else.  It reads no views."""

    name = "pointer-files"
    reads_views = False

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        from cdc_compaction.core.storage import is_data_file, read_parquet

        lake = Lake(cfg)
        pointer = lake.read_pointer()
        if pointer is None:
            return []
        rows: list[dict[str, Any]] = []
        for loc in list((pointer.get("partitions") or {}).values()) or [pointer["location"]]:
            # An empty version (or partition) has no file, and on S3 no directory either.
            if any(not e.is_dir and is_data_file(e.name) for e in lake.storage.list_dir(loc)):
                rows += read_parquet(lake.storage, loc).select(shown_columns(cfg)).to_pylist()
        return rows


class DuckDBReader:
    """Reads what a DuckDB user reads: the base location from the pointer, and the DuckDB views.

    The base is read with a plain ``read_parquet('<location>/*.parquet')`` of the live
    version's location (each partition's, for a partitioned table), as a reader without a
    metastore finds it in ``_cdc/pointer.json``: it must hold the visible rows and nothing
    else.  The views are the ones the pipeline wrote to ``views.duckdb``.
    """

    name = "duckdb"
    reads_views = True

    def _connect(self) -> Any:
        import duckdb

        con = duckdb.connect()
        con.execute("SET TimeZone = 'UTC'")
        return con

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        lake = Lake(cfg)
        pointer = lake.read_pointer()
        if pointer is None:
            return []
        locations = list((pointer.get("partitions") or {}).values()) or [pointer["location"]]
        globs = [posixpath.join(loc, "*.parquet") for loc in locations if glob.glob(posixpath.join(loc, "*.parquet"))]
        if not globs:
            return []
        cols = ", ".join(f'"{c}"' for c in shown_columns(cfg))
        with self._connect() as con:
            cur = con.execute(f"SELECT {cols} FROM read_parquet(?)", [globs])
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def _views(self, cfg: TableConfig, con: Any) -> None:
        path = cfg.views.duckdb
        if path is None:
            raise ValueError(f"{cfg.qualified_name} has no views.duckdb: nothing for DuckDB to read")
        con.execute(Path(path).read_text(encoding="utf-8"))

    def view(self, cfg: TableConfig) -> list[dict[str, Any]]:
        with self._connect() as con:
            self._views(cfg, con)
            cur = con.execute(f'SELECT * FROM "{cfg.database}"."{sql.table_names(cfg)["view_name"]}"')
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def pending_rejects(self, cfg: TableConfig) -> int:
        with self._connect() as con:
            self._views(cfg, con)
            row = con.execute(
                f'SELECT count(*) FROM "{cfg.database}"."{sql.table_names(cfg)["rejects_view"]}"'
            ).fetchone()
            return int(row[0])


class DuckDBS3Reader:
    """Reads what a DuckDB user of an S3 lake reads: the DuckDB views the pipeline wrote to ``views.duckdb``
    (an ``s3://`` script), run in DuckDB 1.4.4 with httpfs (:func:`~cdc_compaction.devtools.duckdb_formats.
    query_views`), the endpoint and credentials in ``secret`` (a ``CREATE SECRET``).  The base is the
    ``<t>_base`` view: the live version's files on S3 as the script names them."""

    name = "duckdb-s3"
    reads_views = True

    def __init__(self, secret: str) -> None:
        self.secret = secret

    def _query(self, cfg: TableConfig, query: str) -> list[dict[str, Any]]:
        from cdc_compaction.devtools import duckdb_formats

        if cfg.views.duckdb is None:
            raise ValueError(f"{cfg.qualified_name} has no views.duckdb: nothing for DuckDB to read")
        return duckdb_formats.query_views(cfg.views.duckdb, {"rows": query}, [self.secret])["rows"]

    def _name(self, cfg: TableConfig, which: str) -> str:
        return f'"{cfg.database}"."{sql.table_names(cfg)[which]}"'

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        cols = ", ".join(f'"{c}"' for c in shown_columns(cfg))
        return self._query(cfg, f"SELECT {cols} FROM {self._name(cfg, 'base_table')}")

    def view(self, cfg: TableConfig) -> list[dict[str, Any]]:
        return self._query(cfg, f"SELECT * FROM {self._name(cfg, 'view_name')}")

    def pending_rejects(self, cfg: TableConfig) -> int:
        (row,) = self._query(cfg, f"SELECT count(*) AS n FROM {self._name(cfg, 'rejects_view')}")
        return int(row["n"])


class TrinoReader:
    """Reads what a Trino user reads: the base table and the Trino views, in Trino's ``hive`` catalog.

    ``visible_base`` is a plain ``SELECT`` of ``hive.<db>.<base table>`` through a running
    :class:`~cdc_compaction.devtools.trino.TrinoServer` (the Hive connector on the same Thrift
    metastore, reading the files of the live version's location, or of each partition's): it must
    hold the visible rows and nothing else.  With ``views`` it reads the views the pipeline wrote in
    Trino's own encoding (registry ``views.metastore: [..., trino]``: ``<t>_view_trino`` and
    ``<t>_pending_rejects_trino``, or the plain names when ``trino`` comes first).  The Spark SQL
    views are not Trino's to read: Trino's Hive-view translation refuses their ``_metadata.file_name``.
    """

    name = "trino"

    def __init__(self, trino: TrinoServer, views: bool = False, catalog: str = "hive") -> None:
        self.trino = trino
        self.reads_views = views
        #: The Trino catalog read through (the server's ``hive``, or ``hive_us`` to the microsecond).
        self.catalog = catalog

    def _rows(self, cols: list[str] | None, table: str) -> list[dict[str, Any]]:
        quoted = "*" if cols is None else ", ".join(f'"{c}"' for c in cols)
        rows = self.trino.query(f"SELECT {quoted} FROM {self.catalog}.{table}")
        if cols is None:
            return rows
        # Trino names result columns in lower case: give the rows the registry's names back.
        return [dict(zip(cols, r.values(), strict=True)) for r in rows]

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        return self._rows(shown_columns(cfg), f'"{cfg.database}"."{sql.table_names(cfg)["base_table"]}"')

    def _view_name(self, cfg: TableConfig, kind: str) -> str:
        dialects = list(cfg.views.metastore)
        if "trino" not in dialects:
            raise ValueError(
                f"{cfg.qualified_name} has no Trino views: add trino to its registry views.metastore ({dialects})"
            )
        name = sql.table_names(cfg)[kind]
        return f'"{cfg.database}"."{name if dialects[0] == "trino" else name + "_trino"}"'

    def view(self, cfg: TableConfig) -> list[dict[str, Any]]:
        return self._rows(None, self._view_name(cfg, "view_name"))

    def pending_rejects(self, cfg: TableConfig) -> int:
        (row,) = self.trino.query(f"SELECT count(*) AS n FROM {self.catalog}.{self._view_name(cfg, 'rejects_view')}")
        return int(row["n"])


class HiveReader:
    """Reads what a Hive user reads, with Hive's own engine: the base table and the Hive views.

    A running :class:`~cdc_compaction.devtools.hive.HiveServer` (HiveServer2 4.0.1) has a metastore of its
    own, so before each read the table's three sources are registered there as the project's metastore
    holds them now (:meth:`~cdc_compaction.devtools.hive.HiveServer.mirror`: ``<t>_base`` at the live
    version's location, or each partition's, ``<t>_tombstones``, and ``<t>_incremental`` with every pending
    increment's partition), and the two Hive views are created there from the text the pipeline published
    in the project's metastore (registry ``views.metastore: [..., hive]``: ``<t>_view_hive`` and
    ``<t>_pending_rejects_hive``, or the plain names when ``hive`` comes first). Hive then compiles and runs
    that text itself. ``visible_base`` is a plain ``SELECT`` of the base there.
    """

    name = "hive"
    reads_views = True

    def __init__(self, hive: HiveServer, endpoint: MetastoreEndpoint) -> None:
        self.hive = hive
        self.endpoint = endpoint

    def _view_names(self, cfg: TableConfig) -> dict[str, str]:
        from cdc_compaction.core import dialects

        names = dialects.view_names(cfg)
        if "hive" not in names:
            raise ValueError(
                f"{cfg.qualified_name} has no Hive views: add hive to its registry views.metastore "
                f"({list(cfg.views.metastore)})"
            )
        return names["hive"]

    def _sync(self, cfg: TableConfig, views: bool) -> None:
        from cdc_compaction.integrations.metastore import connect

        names = sql.table_names(cfg)
        with connect(self.endpoint) as ms:
            for kind in ("base_table", "tombstones_table", "incremental_table"):
                table = ms.get_table(cfg.database, names[kind])
                if table is None:
                    raise ValueError(f"{cfg.database}.{names[kind]} is not in the project's metastore")
                parts = ms.partitions(cfg.database, names[kind]) if table.partitionKeys else {}
                self.hive.mirror(table, parts)
            texts = {}
            for name in self._view_names(cfg).values() if views else ():
                view = ms.get_table(cfg.database, name)
                if view is None or not view.viewOriginalText:
                    raise ValueError(f"{cfg.database}.{name} is not a view in the project's metastore")
                texts[name] = view.viewOriginalText
        for name, text in texts.items():
            self.hive.query(f"CREATE OR REPLACE VIEW `{cfg.database}`.`{name}` AS {text}")

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        self._sync(cfg, views=False)
        cols = ", ".join(f"`{c}`" for c in shown_columns(cfg))
        return self.hive.query(f"SELECT {cols} FROM `{cfg.database}`.`{sql.table_names(cfg)['base_table']}`")

    def view(self, cfg: TableConfig) -> list[dict[str, Any]]:
        self._sync(cfg, views=True)
        return self.hive.query(f"SELECT * FROM `{cfg.database}`.`{self._view_names(cfg)['view']}`")

    def pending_rejects(self, cfg: TableConfig) -> int:
        self._sync(cfg, views=True)
        (row,) = self.hive.query(f"SELECT count(*) AS n FROM `{cfg.database}`.`{self._view_names(cfg)['rejects']}`")
        return int(row["n"])


class _FormatReader:
    """What the Delta and Iceberg readers share: the engines they read with, which tables they read, and time travel.

    After each compaction the live commit's expected rows are recorded; every kept commit's entry in
    the format's log (found by ``cdc.commit_seq``) must read exactly what the scenario expected right
    after that commit.  A subclass says how to find that entry (:meth:`_entry`) and read it (:meth:`_read`).
    """

    reads_views = False
    #: The registry ``formats`` name, the engines it reads with, and how a failure names an entry.
    FORMAT = ""
    ENGINES: tuple[str, ...] = ()

    def __init__(self, engine: str) -> None:
        if engine not in self.ENGINES:
            raise ValueError(f"{type(self).__name__} reads with {' or '.join(self.ENGINES)}, not {engine!r}")
        self.engine = engine
        self.name = f"{self.FORMAT}/{engine}"
        #: Table -> {commit seq: the rows the scenario expected after it}.
        self._expected: dict[str, dict[int, list[dict[str, Any]]]] = {}
        #: (table, Delta root or Iceberg catalog file) pairs an engine with a catalog (Trino) has registered already.
        self._registered: set[tuple[str, str]] = set()

    @classmethod
    def applies(cls, cfg: TableConfig) -> bool:
        return cls.FORMAT in cfg.formats

    def _entry(self, cfg: TableConfig, lake: Lake, seq: int) -> tuple[Any, str] | str:
        """The log entry of commit ``seq`` and its name in a failure, or the failure when there is none."""
        raise NotImplementedError

    def _read(self, cfg: TableConfig, entry: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def time_travel_failures(self, cfg: TableConfig, step: int, expect: list[dict[str, Any]]) -> list[str]:
        """Record ``expect`` as the live commit's rows; every kept commit's entry must read its own."""
        from cdc_compaction.pipeline.retention import kept_seqs

        lake = Lake(cfg)
        live = lake.latest_commit().seq
        seen = self._expected.setdefault(cfg.qualified_name, {})
        if live > 0:
            seen[live] = expect
        failures = []
        for seq in kept_seqs(live, cfg.keep_versions):
            if seq not in seen:
                continue
            found = self._entry(cfg, lake, seq)
            if isinstance(found, str):
                failures.append(f"step {step} compact ({self.name}): {found}")
                continue
            entry, label = found
            diff = diff_rows(seen[seq], self._read(cfg, entry), compared_types(cfg))
            if diff:
                failures.append(f"step {step} compact ({self.name}): {label} differs\n" + "\n".join(diff))
        return failures


class DeltaReader(_FormatReader):
    """Reads the base as a Delta table (registry ``formats: [delta]``) with delta-rs, polars, Spark with
    delta-spark, Trino or DuckDB's delta extension (:mod:`~cdc_compaction.devtools.duckdb_formats`), as their
    users do.

    Only tables that list ``delta`` (:meth:`applies`). Time travel: the Delta version carrying each
    kept commit's seq (``cdc.commit_seq`` in its commitInfo). ``delta-spark`` reads through the Spark
    Connect server at ``connect_url``, started with delta-spark's jars, session extension and catalog (a
    running classic session cannot take them), by path and ``versionAsOf``: a session per read, as
    :class:`~cdc_compaction.integrations.engine.ConnectEngine` opens one beside this process's classic session.
    ``trino`` reads through the ``delta`` catalog of a :class:`~cdc_compaction.devtools.trino.TrinoServer`,
    where the table is registered by its location (``system.register_table``, as a Trino user adds a Delta
    table that another engine writes), at a version with ``FOR VERSION AS OF``.
    """

    FORMAT = "delta"
    ENGINES = ("delta-rs", "polars", "delta-spark", "trino", "duckdb")

    def __init__(self, engine: str, connect_url: str | None = None, trino: TrinoServer | None = None) -> None:
        super().__init__(engine)
        if (engine == "delta-spark") != (connect_url is not None):
            raise ValueError("a Spark Connect server's URL is what delta-spark reads with, and only it")
        if (engine == "trino") != (trino is not None):
            raise ValueError("a Trino server is what the trino engine reads with, and only it")
        self.connect_url = connect_url
        self.trino = trino

    def _trino_rows(self, cfg: TableConfig, root: str, cols: list[str], version: int | None) -> list[dict[str, Any]]:
        """The table at ``root`` through Trino's ``delta`` catalog, registered there once under a name of its root."""
        import hashlib

        from cdc_compaction.devtools.trino import TrinoQueryError

        assert self.trino is not None
        # One registration per lake: tests reuse table names in lakes of their own.
        name = f"{cfg.table}_{hashlib.sha1(root.encode()).hexdigest()[:10]}"
        if (cfg.qualified_name, root) not in self._registered:
            self.trino.query(f'CREATE SCHEMA IF NOT EXISTS delta."{cfg.database}"')
            location = root if "://" in root else f"file://{root}"
            try:
                self.trino.query(
                    f"CALL delta.system.register_table(schema_name => '{cfg.database}', table_name => '{name}', "
                    f"table_location => '{location}')"
                )
            except TrinoQueryError as exc:
                if "already exists" not in str(exc):
                    raise
            self._registered.add((cfg.qualified_name, root))
        at = "" if version is None else f" FOR VERSION AS OF {int(version)}"
        quoted = ", ".join(f'"{c}"' for c in cols)
        rows = self.trino.query(f'SELECT {quoted} FROM delta."{cfg.database}"."{name}"{at}')
        # Trino names result columns in lower case: give the rows the registry's names back.
        return [dict(zip(cols, r.values(), strict=True)) for r in rows]

    def _rows(self, cfg: TableConfig, version: int | None = None) -> list[dict[str, Any]]:
        from cdc_compaction.pipeline.formats import delta

        lake = Lake(cfg)
        if lake.latest_commit().seq == 0 and not lake.storage.exists(delta.metadata_root(lake)):
            return []  # nothing published yet: no Delta table either
        root, cols = delta.table_root(lake), shown_columns(cfg)
        if self.engine == "trino":
            return self._trino_rows(cfg, root, cols, version)
        if self.engine == "polars":
            import polars as pl

            return pl.read_delta(root, version=version, columns=cols).to_dicts()
        if self.engine == "delta-spark":
            from cdc_compaction.integrations.engine import ConnectEngine

            with ConnectEngine(str(self.connect_url)).session(None) as spark:
                reader = spark.read.format("delta")
                if version is not None:
                    reader = reader.option("versionAsOf", version)
                return [r.asDict() for r in reader.load(root).select(*[f"`{c}`" for c in cols]).collect()]
        if self.engine == "duckdb":
            from cdc_compaction.devtools import duckdb_formats

            return duckdb_formats.read("delta", root, cols, version)
        import deltalake

        return deltalake.DeltaTable(root, version=version).to_pyarrow_table(columns=cols).to_pylist()

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        return self._rows(cfg)

    def _entry(self, cfg: TableConfig, lake: Lake, seq: int) -> tuple[Any, str] | str:
        from cdc_compaction.pipeline.formats import delta

        version = delta.version_of_seq(lake, seq)
        if version is None:
            return f"no Delta version carries commit {seq}"
        return version, f"Delta version {version} (commit {seq})"

    def _read(self, cfg: TableConfig, entry: Any) -> list[dict[str, Any]]:
        return self._rows(cfg, entry)


class IcebergReader(_FormatReader):
    """Reads the base as an Iceberg table (registry ``formats: [iceberg]``) with pyiceberg, polars, DuckDB's
    iceberg extension (:mod:`~cdc_compaction.devtools.duckdb_formats`) or Spark with Iceberg's own runtime
    (:mod:`~cdc_compaction.devtools.iceberg_spark`), as their users do.

    Only tables that list ``iceberg`` (:meth:`applies`). The catalog is opened the way a user opens
    it (pyiceberg's ``SqlCatalog`` named ``cdc_<db>`` on ``<root>/iceberg/metadata/catalog.db``),
    not through the project. Time travel: the snapshot whose summary carries each kept commit's seq
    (``cdc.commit_seq``). ``spark`` reads through the Spark Connect server at ``connect_url`` (started
    with Iceberg's runtime, :func:`~cdc_compaction.devtools.iceberg_spark.server`): the same SQLite
    catalog opened by Iceberg's Java JdbcCatalog, the snapshots and their summaries from the table's
    ``snapshots`` metadata table, an older snapshot with ``VERSION AS OF``.  ``trino`` reads through a
    :class:`~cdc_compaction.devtools.trino.TrinoServer`'s Iceberg connector on that same SQLite catalog (Trino's
    JDBC catalog, added as a catalog of the server's per lake:
    :meth:`~cdc_compaction.devtools.trino.TrinoServer.add_iceberg_catalog`), the snapshots from
    ``"<t>$snapshots"``, an older one with ``FOR VERSION AS OF``; every Trino read must leave the catalog
    file's bytes as they were.
    """

    FORMAT = "iceberg"
    ENGINES = ("pyiceberg", "polars", "duckdb", "spark", "trino")

    def __init__(
        self,
        engine: str,
        connect_url: str | None = None,
        trino: TrinoServer | None = None,
        catalog: Callable[[TableConfig], Any] | None = None,
    ) -> None:
        super().__init__(engine)
        if (engine == "spark") != (connect_url is not None):
            raise ValueError("a Spark Connect server's URL (Iceberg's runtime) is what spark reads with, and only it")
        if (engine == "trino") != (trino is not None):
            raise ValueError("a Trino server is what the trino engine reads with, and only it")
        if catalog is not None and engine != "pyiceberg":
            raise ValueError("a catalog of the reader's own (e.g. Glue) is opened by pyiceberg only")
        self.connect_url = connect_url
        self.trino = trino
        #: Opens the table's catalog as its user does (``CDC_ICEBERG_CATALOG=glue``: a ``GlueCatalog``);
        #: default: the SQL catalog's SQLite file under the table root.
        self.catalog = catalog

    def _trino_table(self, cfg: TableConfig, suffix: str = "") -> str | None:
        """The table's quoted name in the Trino catalog on its lake's SQLite file (added once), ``suffix`` added
        to its last part (``$snapshots``: a metadata table); None before a publish."""
        import hashlib

        from cdc_compaction.pipeline.formats import iceberg

        assert self.trino is not None
        lake = Lake(cfg)
        db = posixpath.join(iceberg.metadata_dir(lake), iceberg.SQLITE_FILE)
        if "://" in db:
            raise AssertionError(
                f"{cfg.qualified_name}: the Iceberg catalog {db} is not a local file: Trino's JDBC catalog opens "
                "SQLite catalogs on local disk only; read lakes on object stores through their catalog service"
            )
        if not lake.storage.exists(db):
            return None
        # One Trino catalog per SQLite file: tests reuse table names in lakes of their own.
        name = f"iceberg_{hashlib.sha1(db.encode()).hexdigest()[:10]}"
        if (cfg.qualified_name, db) not in self._registered:
            self.trino.add_iceberg_catalog(name, db, f"cdc_{cfg.database}", f"file://{iceberg.table_root(lake)}")
            self._registered.add((cfg.qualified_name, db))
        return f'{name}."{cfg.database}"."{cfg.table}_iceberg{suffix}"'

    def _trino_query(self, cfg: TableConfig, statement: str) -> list[dict[str, Any]]:
        """Run ``statement`` on Trino; fail if it changed the catalog file (a reader's query must not write it)."""
        import hashlib

        from cdc_compaction.pipeline.formats import iceberg

        assert self.trino is not None
        db = Path(posixpath.join(iceberg.metadata_dir(Lake(cfg)), iceberg.SQLITE_FILE))
        before = hashlib.sha256(db.read_bytes()).hexdigest()
        rows = self.trino.query(statement)
        if hashlib.sha256(db.read_bytes()).hexdigest() != before:
            raise AssertionError(f"{cfg.qualified_name}: Trino's {statement!r} changed the Iceberg catalog {db}")
        return rows

    def _trino_rows(self, cfg: TableConfig, table: str, snapshot_id: int | None = None) -> list[dict[str, Any]]:
        cols = shown_columns(cfg)
        at = "" if snapshot_id is None else f" FOR VERSION AS OF {int(snapshot_id)}"
        quoted = ", ".join(f'"{c}"' for c in cols)
        rows = self._trino_query(cfg, f"SELECT {quoted} FROM {table}{at}")
        # Trino names result columns in lower case: give the rows the registry's names back.
        return [dict(zip(cols, r.values(), strict=True)) for r in rows]

    def _trino_entry(self, cfg: TableConfig, seq: int) -> tuple[Any, str] | str:
        table, snapshots = self._trino_table(cfg), self._trino_table(cfg, "$snapshots")
        if table is None:
            return f"no Iceberg catalog carries commit {seq}"
        snaps = self._trino_query(cfg, f"SELECT snapshot_id, summary FROM {snapshots}")
        ids = [int(r["snapshot_id"]) for r in snaps if (r["summary"] or {}).get("cdc.commit_seq") == str(seq)]
        if len(ids) != 1:
            return f"{len(ids)} Iceberg snapshots (Trino's {snapshots}) carry commit {seq}, not one"
        return (table, ids[0]), f"Iceberg snapshot {ids[0]} of commit {seq} (Trino)"

    @staticmethod
    def _spark_catalog(cfg: TableConfig) -> tuple[dict[str, str], str] | None:
        """The session settings of the table's catalog for Spark and the table's name there; None before a publish."""
        from cdc_compaction.devtools import iceberg_spark
        from cdc_compaction.pipeline.formats import iceberg

        lake = Lake(cfg)
        db = posixpath.join(iceberg.metadata_dir(lake), iceberg.SQLITE_FILE)
        if not lake.storage.exists(db):
            return None
        name = f"cdc_{cfg.database}"
        conf_ = iceberg_spark.catalog_conf(name, db, f"file://{iceberg.table_root(lake)}")
        return conf_, f"`{name}`.`{cfg.database}`.`{cfg.table}_iceberg`"

    def _spark_visible(self, cfg: TableConfig) -> list[dict[str, Any]]:
        from cdc_compaction.devtools import iceberg_spark

        found = self._spark_catalog(cfg)
        if found is None:
            if Lake(cfg).latest_commit().seq == 0:
                return []  # nothing published yet: no Iceberg table either
            raise AssertionError(f"{cfg.qualified_name}: published, but no Iceberg catalog for Spark to open")
        return iceberg_spark.read(str(self.connect_url), *found, shown_columns(cfg))

    def _spark_entry(self, cfg: TableConfig, seq: int) -> tuple[Any, str] | str:
        from cdc_compaction.devtools import iceberg_spark

        found = self._spark_catalog(cfg)
        if found is None:
            return f"no Iceberg catalog carries commit {seq}"
        snaps = iceberg_spark.snapshots(str(self.connect_url), *found)
        ids = [sid for sid, summary in snaps.items() if summary.get("cdc.commit_seq") == str(seq)]
        if len(ids) != 1:
            return f"{len(ids)} Iceberg snapshots (Spark's {found[1]}.snapshots) carry commit {seq}, not one"
        return (found, ids[0]), f"Iceberg snapshot {ids[0]} of commit {seq} (Spark)"

    def _table(self, cfg: TableConfig) -> Any | None:
        """The Iceberg table ``<db>.<t>_iceberg`` from its catalog (SQL unless the reader was given one); None
        before the first publish."""
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        from cdc_compaction.pipeline.formats import iceberg

        if self.catalog is not None:
            try:
                return self.catalog(cfg).load_table((cfg.database, f"{cfg.table}_iceberg"))
            except (NoSuchTableError, NoSuchNamespaceError):
                return None
        lake = Lake(cfg)
        db = posixpath.join(iceberg.metadata_dir(lake), iceberg.SQLITE_FILE)
        if not lake.storage.exists(db):
            return None
        # The catalog's name is part of its rows' key in SQLite: the project names it cdc_<db> (docs/formats.md).
        catalog = SqlCatalog(
            f"cdc_{cfg.database}", uri=f"sqlite:///{db}", warehouse=f"file://{iceberg.table_root(lake)}"
        )
        try:
            return catalog.load_table((cfg.database, f"{cfg.table}_iceberg"))
        except NoSuchTableError:
            return None

    @staticmethod
    def _snapshot_of(table: Any, seq: int) -> int | None:
        for snap in table.snapshots():
            props = snap.summary.additional_properties if snap.summary else {}
            if props.get("cdc.commit_seq") == str(seq):
                return int(snap.snapshot_id)
        return None

    def _rows(self, cfg: TableConfig, table: Any, snapshot_id: int | None = None) -> list[dict[str, Any]]:
        cols = shown_columns(cfg)
        if self.engine == "polars":
            import polars as pl

            return pl.scan_iceberg(table, snapshot_id=snapshot_id).select(cols).collect().to_dicts()
        if self.engine == "duckdb":
            from cdc_compaction.devtools import duckdb_formats

            # The live table as a DuckDB user opens it: the directory (version-hint.text); an older snapshot
            # from the metadata file the catalog names (no catalog of DuckDB's own).
            from cdc_compaction.pipeline.formats import iceberg

            if snapshot_id is None:
                return duckdb_formats.read("iceberg", iceberg.table_root(Lake(cfg)), cols)
            metadata = str(table.metadata_location).removeprefix("file://")
            return duckdb_formats.read("iceberg", metadata, cols, snapshot_id)
        return table.scan(snapshot_id=snapshot_id, selected_fields=tuple(cols)).to_arrow().select(cols).to_pylist()

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        if self.engine == "spark":
            return self._spark_visible(cfg)
        if self.engine == "trino":
            name = self._trino_table(cfg)
            if name is None:
                if Lake(cfg).latest_commit().seq == 0:
                    return []  # nothing published yet: no Iceberg table either
                raise AssertionError(f"{cfg.qualified_name}: published, but no Iceberg catalog for Trino to open")
            return self._trino_rows(cfg, name)
        table = self._table(cfg)
        if table is None:
            if Lake(cfg).latest_commit().seq == 0:
                return []  # nothing published yet: no Iceberg table either
            raise AssertionError(f"{cfg.qualified_name}: published, but no Iceberg table {cfg.table}_iceberg")
        return self._rows(cfg, table)

    def _entry(self, cfg: TableConfig, lake: Lake, seq: int) -> tuple[Any, str] | str:
        if self.engine == "spark":
            return self._spark_entry(cfg, seq)
        if self.engine == "trino":
            return self._trino_entry(cfg, seq)
        table = self._table(cfg)
        snapshot_id = None if table is None else self._snapshot_of(table, seq)
        if snapshot_id is None:
            return f"no Iceberg snapshot carries commit {seq}"
        return (table, snapshot_id), f"Iceberg snapshot of commit {seq}"

    def _read(self, cfg: TableConfig, entry: Any) -> list[dict[str, Any]]:
        if self.engine == "spark":
            from cdc_compaction.devtools import iceberg_spark

            (catalog, name), snapshot_id = entry
            return iceberg_spark.read(str(self.connect_url), catalog, name, shown_columns(cfg), snapshot_id)
        if self.engine == "trino":
            name, snapshot_id = entry
            return self._trino_rows(cfg, name, snapshot_id)
        table, snapshot_id = entry
        return self._rows(cfg, table, snapshot_id)


class Reader:
    """Reads the base table and the views back through the metastore with Spark SQL."""

    name = "spark"
    #: False for readers that cannot query the views; their ``check_view`` steps are skipped.
    reads_views = True

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def _refresh(self, cfg: TableConfig) -> None:
        names = sql.table_names(cfg)
        for t in ("base_table", "tombstones_table", "incremental_table"):
            self.spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")

    def _rows(self, query: str) -> list[dict[str, Any]]:
        return [r.asDict() for r in self.spark.sql(query).collect()]

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        """A plain ``SELECT`` of the base table: it holds the visible rows and nothing else."""
        self._refresh(cfg)
        names = sql.table_names(cfg)
        cols = ", ".join(f"`{c}`" for c in shown_columns(cfg))
        return self._rows(f"SELECT {cols} FROM `{cfg.database}`.`{names['base_table']}`")

    def history(self, cfg: TableConfig) -> dict[str, list[dict[str, Any]]]:
        """A snapshot table's ``<t>_history``: every registered partition (empty ones too), date -> rows."""
        from cdc_compaction.modes.snapshot import history_table

        name = f"`{cfg.database}`.`{history_table(cfg)}`"
        self.spark.catalog.refreshTable(name)
        out: dict[str, list[dict[str, Any]]] = {}
        for r in self.spark.sql(f"SHOW PARTITIONS {name}").collect():
            out[r[0].split("=", 1)[1]] = []
        cols = ", ".join(f"`{c}`" for c in shown_columns(cfg))
        for row in self._rows(f"SELECT {cols} FROM {name}"):
            out.setdefault(str(row[EFF_START_DATE_COLUMN]), []).append(row)
        return out

    def view(self, cfg: TableConfig) -> list[dict[str, Any]]:
        self._refresh(cfg)
        return self._rows(f"SELECT * FROM `{cfg.database}`.`{sql.table_names(cfg)['view_name']}`")

    def pending_rejects(self, cfg: TableConfig) -> int:
        self._refresh(cfg)
        return int(
            self.spark.sql(
                f"SELECT count(*) AS n FROM `{cfg.database}`.`{sql.table_names(cfg)['rejects_view']}`"
            ).first()["n"]
        )


class InProcessRunner:
    """Runs the DAG's task functions in order, in this process."""

    mode = "inprocess"

    def __init__(self, spark: Any, endpoint: MetastoreEndpoint) -> None:
        self.spark = spark
        self.endpoint = endpoint
        self.engine = SessionEngine(spark)

    def runtime(self, cfg: TableConfig) -> Runtime:
        # The table's own engine: a lake on S3 points the session at its store (S3A) first.
        engine = SessionEngine(self.spark, cfg)
        return Runtime(cfg=cfg, lake=Lake(cfg), metastore=self.endpoint, engine=engine)

    def setup(self, cfg: TableConfig) -> None:
        rt = self.runtime(cfg)
        ensure_tables(rt)
        refresh_view(rt)

    def compact(self, cfg: TableConfig) -> dict[str, Any] | None:
        """One whole run, the steps in ``order.ORDER``; the stats of the version it published (None: nothing to do)."""
        rt = self.runtime(cfg)
        run_id = f"inprocess__{uuid.uuid4().hex[:12]}"
        plan_path = ""
        compacted: dict[str, Any] | None = None
        for step in order.ORDER:
            if step.takes_plan and not plan_path:
                continue  # nothing planned: the steps on the plan are skipped, the views still refreshed
            result = step.call(rt, plan_path, run_id)
            if step.id == order.PLAN:
                plan_path = result
            elif step.id == order.COMPACT:
                compacted = result if isinstance(result, dict) else None
        if not plan_path or "skipped" in (compacted or {}):
            return None  # nothing planned, or a plan that only refreshed the views (compaction.policy)
        return dict(rt.lake.latest_commit().stats)


class DagRunner(InProcessRunner):
    """Runs every compaction as a real DAG run with ``airflow dags test``."""

    mode = "dag"

    def __init__(
        self, spark: Any, endpoint: MetastoreEndpoint, env: dict[str, str], registry_spark: dict[str, Any] | None = None
    ) -> None:
        super().__init__(spark, endpoint)
        self.env = env
        self.timings: list[dict[str, Any]] = []
        #: The ``spark`` section of the registry entries :func:`run_scenario` writes for this runner
        #: (None: the registry's default, spark-submit). ``{"engine": "spark_connect"}`` sends each
        #: run's job and DDL to the warm server that ``env``'s ``spark_connect_default`` names.
        self.registry_spark = registry_spark

    def compact(self, cfg: TableConfig) -> dict[str, Any] | None:
        rt = self.runtime(cfg)
        before = rt.lake.latest_commit().seq
        airflow = str(Path(sys.executable).parent / "airflow")
        proc = subprocess.run(
            [airflow, "dags", "test", cfg.dag_id],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
        # `airflow dags test` exits non-zero when the DAG run failed.
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
            raise RuntimeError(f"DAG run of {cfg.dag_id} failed (exit {proc.returncode}):\n{tail}")
        self.timings.append(
            last_run_timings(
                Path(self.env["AIRFLOW_HOME"]), cfg.dag_id, self.env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
            )
        )
        after = rt.lake.latest_commit()
        return dict(after.stats) if after.seq > before else None


#: Counts a scenario's compact step may expect besides ``rejected``, and the stats that hold them.
COUNTED = {"replayed": "replayed_rows", "superseded": "superseded_rows", "unmatched_removals": "unmatched_removals"}


def run_scenario(
    scn: Scenario,
    runner: InProcessRunner,
    reader: Reader | DuckDBReader | TrinoReader | HiveReader | list[Reader | DuckDBReader | TrinoReader | HiveReader],
    lake_dir: Path,
    registry_dir: Path | None = None,
    suffix: str = "",
    partition_by: dict[str, str] | None = None,
    formats: list[str] | None = None,
    views_metastore: list[str] | None = None,
) -> ScenarioResult:
    """Run one scenario; every failed check (of every reader) becomes a line of the result.

    Readers with an ``applies(cfg)`` (the Delta and Iceberg readers) check only the tables it accepts.
    """
    import time

    readers = reader if isinstance(reader, list) else [reader]

    start = time.monotonic()
    doc = registry_doc(scn, lake_dir, suffix, partition_by, formats, views_metastore)
    if getattr(runner, "registry_spark", None):
        doc["spark"] = dict(runner.registry_spark)  # type: ignore[attr-defined]
    if registry_dir is not None:
        registry_dir.mkdir(parents=True, exist_ok=True)
        (registry_dir / f"{DATABASE}.{doc['table']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = parse_table(doc)
    types = compared_types(cfg)
    op_column = getattr(cfg, "op_column", None)
    result = ScenarioResult(scn.name, True)
    readers = [r for r in readers if getattr(r, "applies", lambda _: True)(cfg)]
    try:
        runner.setup(cfg)
        for i, step in enumerate(scn.steps, 1):
            ((kind, body),) = step.items()
            if kind == "land":
                land(cfg, body["increment"], body["files"])
            elif kind == "check_view":
                refresh_view(runner.runtime(cfg))
                for r in readers:
                    if not r.reads_views:
                        continue
                    got = [{k: v for k, v in row.items() if k != op_column} for row in r.view(cfg)]
                    diff = diff_rows(body["expect"], got, types)
                    if diff:
                        result.failures.append(f"step {i} check_view ({r.name}): rows differ\n" + "\n".join(diff))
                    rej = r.pending_rejects(cfg)
                    if rej != body.get("rejected_pending", 0):
                        result.failures.append(
                            f"step {i} check_view ({r.name}): rejected_pending {rej}, "
                            f"expected {body.get('rejected_pending', 0)}"
                        )
            elif kind == "compact":
                stats = runner.compact(cfg)
                for r in readers:
                    diff = diff_rows(body["expect"], r.visible_base(cfg), types)
                    if diff:
                        result.failures.append(f"step {i} compact ({r.name}): base rows differ\n" + "\n".join(diff))
                    if isinstance(r, (DeltaReader, IcebergReader)):
                        result.failures += r.time_travel_failures(cfg, i, body["expect"])
                if cfg.mode == "snapshot":
                    # The history (every partition so far) and the mode's counts (tests/scenarios/snapshot/README.md).
                    for r in readers:
                        if "history" in body and hasattr(r, "history"):
                            result.failures += _history_failures(i, r.name, body["history"], r.history(cfg), types)
                    result.failures += [f"step {i} compact: {f}" for f in snapshot_count_failures(body, stats)]
                    continue
                rejected = int(stats["rejected_rows"]) if stats else 0
                if rejected != body.get("rejected", 0):
                    result.failures.append(f"step {i} compact: rejected {rejected}, expected {body.get('rejected', 0)}")
                # A mode's own counts, where the scenario gives them (keyless: tests/scenarios/README.md).
                for key, stat in COUNTED.items():
                    if key in body:
                        got = int((stats or {}).get(stat, 0))
                        if got != body[key]:
                            result.failures.append(f"step {i} compact: {key} {got}, expected {body[key]}")
            else:
                result.failures.append(f"step {i}: unknown step kind {kind!r}")
    except Exception as exc:
        log.exception("scenario %s crashed", scn.name)
        result.failures.append(f"crashed: {type(exc).__name__}: {exc}")
    result.ok = not result.failures
    result.seconds = time.monotonic() - start
    return result


def _history_failures(
    step: int, reader: str, expected: dict[str, list[dict[str, Any]]], got: dict[str, list[dict[str, Any]]], types: Any
) -> list[str]:
    failures = []
    if sorted(expected) != sorted(got):
        failures.append(
            f"step {step} compact ({reader}): history partitions {sorted(got)}, expected {sorted(expected)}"
        )
    for day in sorted(set(expected) & set(got)):
        diff = diff_rows(expected[day], got[day], types)
        if diff:
            failures.append(f"step {step} compact ({reader}): history {day} rows differ\n" + "\n".join(diff))
    return failures


def expand(patterns: list[str]) -> list[Path]:
    """Scenario files for glob patterns (or directories), sorted, without duplicates."""
    out: set[Path] = set()
    for p in patterns:
        path = Path(p)
        if path.is_dir():
            out.update(path.glob("*.json"))
        else:
            out.update(Path(x) for x in glob.glob(p, recursive=True))
    return sorted(out)
