"""The table's views for DuckDB: a ``.sql`` script or views in a ``.duckdb`` database file.

DuckDB has no metastore, so its views name the files they read: the live version's data
and tombstone files and the pending increments' files, exactly the increments the
metastore's ``<t>_incremental`` shows.  They are rewritten whenever that set changes:
when a run plans and publishes, by ``refresh_view`` and by the view refresher (README,
"Readers").  A publish rewrites them before its increments are archived, so the files a
DuckDB view names exist until the next rewrite.

The script holds, for ``<db>.<t>``::

    CREATE SCHEMA IF NOT EXISTS "<db>";
    CREATE OR REPLACE VIEW "<db>"."<t>_base"            -- the live version's visible rows
    CREATE OR REPLACE VIEW "<db>"."<t>_view"            -- base + pending increments, by the rule
    CREATE OR REPLACE VIEW "<db>"."<t>_pending_rejects" -- pending events compaction will refuse

Run it in a DuckDB session (``duckdb -c ".read <file>"``) or open the database file.

A ``timestamp`` column is an instant (Spark's ``timestamp``) and every view shows it as
``TIMESTAMP WITH TIME ZONE``, displayed in the session's ``TimeZone``, whatever the files hold:
INT64 adjusted to UTC (what the job writes by default) reads as that already, and a column
stored without a zone (Spark's INT96: older versions, ``parquet_timestamps: int96``, landed
files) is read as UTC, as Spark reads it. DuckDB alone would cast a zone-less column to the
zone-aware type of another file through the session's zone (a version mixing INT96 and INT64
files would shift its INT96 values by the zone's offset), so the files are read in groups of
equal zone-less columns (:attr:`Files.zone_less`, from their footers, read by :func:`write`),
each converted on its own.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp

from cdc_compaction.core import dialects, sql
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.settings import resolve_storage_root

log = logging.getLogger(__name__)

META = [("_cdc_increment", "string"), ("_cdc_file", "string"), ("_cdc_pos", "bigint")]


@dataclass
class Files:
    """What a DuckDB view reads: the live version's files and the pending increments' files."""

    data: list[str] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)
    #: Pending files the view shows, and the registry columns none of them has (read as NULL).
    pending: list[str] = field(default_factory=list)
    missing_columns: set[str] = field(default_factory=set)
    #: The live version keeps its tombstones among its data (layout 1): hide them in <t>_base.
    tombstones_in_data: bool = False
    commit: int = 0
    #: File -> its ``timestamp`` columns stored without a zone (INT96, or INT64 not adjusted to UTC).
    #: None: not read yet (:func:`write` reads the footers); a file missing from it has none.
    zone_less: dict[str, frozenset[str]] | None = None


def _is_timestamp(hive_type: str) -> bool:
    return hive_type.lower().replace(" ", "") == "timestamp"


def duck_type(hive_type: str) -> str:
    """The DuckDB type of a registry type; a ``timestamp`` is an instant (see the module docstring)."""
    if _is_timestamp(hive_type):
        return "TIMESTAMPTZ"
    return exp.DataType.build(hive_type, dialect="hive").sql(dialect="duckdb")


def timestamp_columns(cfg: TableConfig) -> set[str]:
    """The ``timestamp`` columns the views read from files: the registry's and the mode's outputs'."""
    from cdc_compaction.core.mode import mode_of

    every = [(c.name, c.type) for c in cfg.columns] + mode_of(cfg).output_columns(cfg)
    return {n for n, t in every if _is_timestamp(t)}


def zone_less_columns(footer: Any, columns: set[str]) -> frozenset[str]:
    """Of ``columns``, those a Parquet footer stores without a zone: INT96, or INT64 with
    ``isAdjustedToUTC=false`` (Arrow reads both as a timestamp without a time zone)."""
    import pyarrow as pa

    schema = footer.schema.to_arrow_schema()
    return frozenset(
        f.name for f in schema if f.name in columns and pa.types.is_timestamp(f.type) and f.type.tz is None
    )


def read_zones(cfg: TableConfig, files: Files, storage: Any) -> Files:
    """``files`` with :attr:`Files.zone_less` read from every file's footer (none when the table has no
    ``timestamp`` column: nothing to read)."""
    import dataclasses

    from cdc_compaction.core.inputs import parquet_footer

    columns = timestamp_columns(cfg)
    zones: dict[str, frozenset[str]] = {}
    if columns:
        for path in [*files.data, *files.tombstones, *files.pending]:
            found = zone_less_columns(parquet_footer(storage, path), columns)
            if found:
                zones[path] = found
    return dataclasses.replace(files, zone_less=zones)


def _by_zones(
    files: Sequence[str], zone_less: dict[str, frozenset[str]] | None
) -> list[tuple[frozenset[str], list[str]]]:
    """``files`` grouped by their zone-less columns, in the order of their first file."""
    groups: dict[frozenset[str], list[str]] = {}
    for f in files:
        groups.setdefault((zone_less or {}).get(f, frozenset()), []).append(f)
    return list(groups.items())


def _instant(name: str, zone_less: frozenset[str]) -> str:
    """A timestamp column as an instant: a zone-less value is UTC's wall clock (as Spark reads INT96)."""
    if name in zone_less:
        return f"timezone('UTC', CAST({_q(name)} AS TIMESTAMP))"
    return f"CAST({_q(name)} AS TIMESTAMPTZ)"


def _read(
    files: Sequence[str],
    zone_less: dict[str, frozenset[str]] | None,
    columns: list[tuple[str, str]],
    select: Callable[[frozenset[str]], str],
    options: str = "",
    lacking: Sequence[tuple[str, str]] = (),
) -> str:
    """``SELECT <select(zone-less columns)> FROM read_parquet(...)`` over each group of files of equal
    zone-less columns, the groups joined by name.

    Each group's files are joined by name with an empty relation of the columns some may lack
    (``lacking``; every column when there is more than one group, as a column only another group's
    files hold must read as NULL), zone-less columns typed without a zone there, so that no value is
    cast through the session's zone."""
    groups = _by_zones(files, zone_less)
    parts = []
    for naive, group in groups:
        rows = f"read_parquet({_file_list(group)}{options}, union_by_name = true)"
        pad = columns if len(groups) > 1 else list(lacking)
        if pad:
            rows = f"(SELECT * FROM {rows} UNION ALL BY NAME {_empty(pad, naive)})"
        parts.append(f"SELECT {select(naive)} FROM {rows}")
    return parts[0] if len(parts) == 1 else "SELECT * FROM (" + " UNION ALL BY NAME ".join(parts) + ")"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _file_list(paths: Sequence[str]) -> str:
    return "[" + ", ".join(_lit(p) for p in paths) + "]"


def _empty(columns: Sequence[tuple[str, str]], zone_less: frozenset[str] = frozenset()) -> str:
    """No rows, in ``columns``' types (those in ``zone_less`` as a TIMESTAMP without a zone)."""
    cols = ", ".join(f"CAST(NULL AS {'TIMESTAMP' if n in zone_less else duck_type(t)}) AS {_q(n)}" for n, t in columns)
    return f"SELECT {cols} WHERE FALSE"


def _stored(cfg: TableConfig, files: Sequence[str], zone_less: dict[str, frozenset[str]] | None = None) -> str:
    """A live version's rows (written by the job, so in the registry's types): columns and provenance."""
    from cdc_compaction.core.mode import mode_of

    # The mode's own output columns (snapshot: operation, eff_start_date, the hashes) follow the registry's.
    columns = [(c.name, c.type) for c in cfg.columns] + mode_of(cfg).output_columns(cfg) + META
    if not files:
        return _empty(columns)
    hidden = [(n, t) for n, t in mode_of(cfg).output_columns(cfg) if cfg.mode == "cdc"]

    def select(naive: frozenset[str]) -> str:
        return ", ".join(f"{_instant(n, naive)} AS {_q(n)}" if _is_timestamp(t) else _q(n) for n, t in columns)

    # A cdc table's bookkeeping of left-out values (registry unchanged) is missing from files written
    # before it existed (or before the option was set): NULL there, as Spark reads them.
    return _read(files, zone_less, columns, select, lacking=hidden)


def _pending(
    cfg: TableConfig, files: Sequence[str], missing: set[str], zone_less: dict[str, frozenset[str]] | None = None
) -> str:
    """The pending events, in the registry's types, with their increment, file name and row position."""
    columns = [(c.name, c.type) for c in cfg.columns]
    extra = [("_cdc_increment", "string"), ("_cdc_src_file", "string"), ("_cdc_src_pos", "bigint")]
    if not files:
        return _empty(columns + extra)

    def select(naive: frozenset[str]) -> str:
        cols = [
            f"CAST(NULL AS {duck_type(t)})"
            if n in missing
            else _instant(n, naive)
            if _is_timestamp(t)
            else f"CAST({_q(n)} AS {duck_type(t)})"
            for n, t in columns
        ]
        cols = [f"{c} AS {_q(n)}" for c, (n, _) in zip(cols, columns, strict=True)]
        cols += [
            'regexp_extract("_cdc_path", \'([^/]+)/[^/]+$\', 1) AS "_cdc_increment"',
            'parse_filename("_cdc_path") AS "_cdc_src_file"',
            'file_row_number AS "_cdc_src_pos"',
        ]
        return ", ".join(cols)

    # file_row_number as a column of its own: a group joined by name with an empty relation keeps it.
    present = [(n, t) for n, t in columns if n not in missing]
    return _read(files, zone_less, present, select, options=", filename = '_cdc_path', file_row_number = true")


def _subquery(text: str, alias: str) -> exp.Expression:
    return exp.Subquery(
        this=sqlglot.parse_one(text, read="duckdb"), alias=exp.TableAlias(this=exp.to_identifier(alias))
    )


def sources(cfg: TableConfig, files: Files) -> dict[str, exp.Expression]:
    return {
        dialects.BASE: _subquery(_stored(cfg, files.data, files.zone_less), "base"),
        dialects.TOMBSTONES: _subquery(_stored(cfg, files.tombstones, files.zone_less), "tombstones"),
        dialects.INCREMENTAL: _subquery(
            _pending(cfg, files.pending, files.missing_columns, files.zone_less), "incremental"
        ),
    }


def script(cfg: TableConfig, files: Files, now: datetime | None = None) -> str:
    """The DuckDB statements that (re)create the table's views, as one script."""
    from cdc_compaction.core.mode import mode_of

    names = sql.table_names(cfg)
    db = _q(cfg.database)
    src = sources(cfg, files)
    # A snapshot table's current table shows each key's operation and eff_start_date too.
    shown = [*cfg.column_names, *(n for n, _ in mode_of(cfg).output_columns(cfg) if not n.startswith("_cdc_"))]
    base_cols = ", ".join(_q(c) for c in shown)
    base = f"SELECT {base_cols} FROM ({_stored(cfg, files.data, files.zone_less)})"
    if files.tombstones_in_data:
        is_delete = sqlglot.transpile(sql.rule_sql(cfg).is_delete, read="spark", write="duckdb")[0]
        base += f" WHERE NOT ({is_delete})"
    stamp = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    statements = [
        f"-- DuckDB views of {cfg.qualified_name}, written by cdc-compaction at {stamp} (commit {files.commit}).",
        "-- Rewritten whenever the live version or the pending increments change; do not edit.",
        f"CREATE SCHEMA IF NOT EXISTS {db};",
        f"CREATE OR REPLACE VIEW {db}.{_q(names['base_table'])} AS\n{base};",
        f"CREATE OR REPLACE VIEW {db}.{_q(names['view_name'])} AS\n{dialects.query(cfg, 'view', 'duckdb', src)};",
        f"CREATE OR REPLACE VIEW {db}.{_q(names['rejects_view'])} AS\n{dialects.query(cfg, 'rejects', 'duckdb', src)};",
    ]
    return "\n".join(statements) + "\n"


def target(cfg: TableConfig) -> str | None:
    """Where the registry wants the DuckDB views: a resolved path or URI (None: not wanted)."""
    path = cfg.views.duckdb
    if path is None:
        return None
    return path if path.startswith(("s3://", "s3a://")) else resolve_storage_root(path)


def write(cfg: TableConfig, files: Files, storage: Any) -> str | None:
    """Write the views where ``views.duckdb`` says; return the target (None when none is set).

    A ``.sql`` script is replaced atomically through ``storage`` (the lake's), or through the
    storage of its own path when it lies elsewhere (a local script of an S3 lake, or the reverse);
    a ``.duckdb`` database file gets the statements in one transaction.
    """
    from cdc_compaction.core.storage import S3_SCHEMES, storage_for

    where = target(cfg)
    if where is None:
        return None
    if files.zone_less is None:
        files = read_zones(cfg, files, storage)  # the lake's files, through the lake's storage
    text = script(cfg, files)
    if where.startswith(S3_SCHEMES) != cfg.storage_root.startswith(S3_SCHEMES):
        storage = storage_for(where, cfg.storage_conn_id)
    if where.endswith(".sql"):
        storage.makedirs(posixpath.dirname(where))
        storage.write_text(where, text)
    else:
        import duckdb  # the Airflow side's only DuckDB use

        Path(where).parent.mkdir(parents=True, exist_ok=True)
        with duckdb.connect(where) as con:
            con.execute("BEGIN TRANSACTION")
            con.execute(text)
            con.execute("COMMIT")
    log.info("%s: DuckDB views written to %s", cfg.qualified_name, where)
    return where
