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
Timestamps are compared as the files hold them; run DuckDB with ``SET TimeZone = 'UTC'``
to see them as Spark does.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Sequence
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


def duck_type(hive_type: str) -> str:
    return exp.DataType.build(hive_type, dialect="hive").sql(dialect="duckdb")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _file_list(paths: Sequence[str]) -> str:
    return "[" + ", ".join(_lit(p) for p in paths) + "]"


def _empty(columns: list[tuple[str, str]]) -> str:
    cols = ", ".join(f"CAST(NULL AS {duck_type(t)}) AS {_q(n)}" for n, t in columns)
    return f"SELECT {cols} WHERE FALSE"


def _stored(cfg: TableConfig, files: Sequence[str]) -> str:
    """A live version's rows (written by the job, so in the registry's types): columns and provenance."""
    from cdc_compaction.core.mode import mode_of

    # The mode's own output columns (snapshot: operation, eff_start_date, the hashes) follow the registry's.
    columns = [(c.name, c.type) for c in cfg.columns] + mode_of(cfg).output_columns(cfg) + META
    if not files:
        return _empty(columns)
    cols = ", ".join(_q(n) for n, _ in columns)
    rows = f"read_parquet({_file_list(files)}, union_by_name = true)"
    hidden = [(n, t) for n, t in mode_of(cfg).output_columns(cfg) if cfg.mode == "cdc"]
    if hidden:
        # A cdc table's bookkeeping of left-out values (registry unchanged) is missing from files written
        # before it existed (or before the option was set): NULL there, as Spark reads them.
        rows = f"(SELECT * FROM {rows} UNION ALL BY NAME {_empty(hidden)})"
    return f"SELECT {cols} FROM {rows}"


def _pending(cfg: TableConfig, files: Sequence[str], missing: set[str]) -> str:
    """The pending events, in the registry's types, with their increment, file name and row position."""
    columns = [(c.name, c.type) for c in cfg.columns]
    extra = [("_cdc_increment", "string"), ("_cdc_src_file", "string"), ("_cdc_src_pos", "bigint")]
    if not files:
        return _empty(columns + extra)
    cols = [f"CAST({'NULL' if n in missing else _q(n)} AS {duck_type(t)}) AS {_q(n)}" for n, t in columns]
    cols += [
        'regexp_extract("_cdc_path", \'([^/]+)/[^/]+$\', 1) AS "_cdc_increment"',
        'parse_filename("_cdc_path") AS "_cdc_src_file"',
        'file_row_number AS "_cdc_src_pos"',
    ]
    return (
        f"SELECT {', '.join(cols)} FROM read_parquet({_file_list(files)}, filename = '_cdc_path', union_by_name = true)"
    )


def _subquery(text: str, alias: str) -> exp.Expression:
    return exp.Subquery(
        this=sqlglot.parse_one(text, read="duckdb"), alias=exp.TableAlias(this=exp.to_identifier(alias))
    )


def sources(cfg: TableConfig, files: Files) -> dict[str, exp.Expression]:
    return {
        dialects.BASE: _subquery(_stored(cfg, files.data), "base"),
        dialects.TOMBSTONES: _subquery(_stored(cfg, files.tombstones), "tombstones"),
        dialects.INCREMENTAL: _subquery(_pending(cfg, files.pending, files.missing_columns), "incremental"),
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
    base = f"SELECT {base_cols} FROM ({_stored(cfg, files.data)})"
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
