"""``registry discover``: registry entries for every table of a landing root, for review.

A landing root holds one directory per table, laid out as a registry entry's ``storage_root``
expects (``<root>/<table>/<increments.directory>/<prefix><hour>/*.parquet``).  For each table
this module infers what the registry needs and writes one ``<database>.<table>.yaml`` whose
comments say where every inferred value came from and what the reviewer must check:

* **columns**: the union of the Parquet footers of the landed files (never the data), Arrow
  types mapped to the narrowest Hive type Spark reads them as (:func:`cdc_compaction.core.hive_types.readable_as`,
  the rule the plan applies to every landed file); with no Parquet landed yet, an Avro value schema
  (``*.avsc`` in the table's directory, as a schema registry serves it).  A Debezium envelope
  (``before``/``after``/``op``/``source``) becomes the columns ExtractNewRecordState writes;
* **primary_key**: a ``--key`` hint, else the fields of a Debezium key schema ``<name>-key.avsc``;
* **source** (the registry's presets fill op column, codes and order): ``--source``, else
  recognized by the presets' column signatures where exactly one matches;
* **order_by**: an ``--order-by`` hint, else the preset's, else a generic ``ts_ms`` (flagged).

What cannot be inferred is written as a value that fails validation with a message naming
what to add (``primary_key: [ADD_THE_KEY_COLUMNS]`` is "not among the columns [...]"), and the
file's header says so: the file is there to finish, never silently usable.  A file that exists
is never overwritten without ``force``.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.exceptions import IdentifierError, RegistryError
from cdc_compaction.core.hive_types import decimal_parts, hive_widening, logical_type, physical_types, readable_as
from cdc_compaction.core.identifiers import check_identifier
from cdc_compaction.core.landing import is_in_progress
from cdc_compaction.core.printable import printable
from cdc_compaction.core.registry import (
    REGISTRY_SUFFIXES,
    SOURCES,
    Increments,
    load_database_defaults,
    parse_entry,
    source_defaults,
)
from cdc_compaction.core.settings import resolve_storage_root
from cdc_compaction.core.storage import Storage, is_data_file, storage_for
from cdc_compaction.integrations.pgcatalog import PgTable

log = logging.getLogger(__name__)

#: Values written where discovery found nothing: each fails validation naming what to add.
MISSING_KEY = "ADD_THE_KEY_COLUMNS"
MISSING_ORDER = "ADD_THE_ORDERING_COLUMNS"
#: The comment of a ``__commit_lsn`` / ``__row`` column that the job derives from a flattened record (job/decode.py).
COMMIT_LSN_ORIGIN = (
    "derived by the job from the record's __sequence (ExtractNewRecordState add.fields=sequence; the first LSN "
    "of source.sequence): the commit position, which a killed Connect worker's re-sent events keep"
)
ROW_ORIGIN = (
    "derived by the job: 0 for a change, the Kafka offset for a snapshot row (from the sink's file name or "
    "__kafka_offset): tells the rows of one snapshot apart"
)
MISSING_OP = "ADD_THE_OP_COLUMN"
#: The origin of a source taken from the database's defaults file (which the table file then leaves out).
DEFAULTS_SOURCE = "from the database's _database.yaml (not repeated here)"

#: Hive types tried for a Parquet column, narrowest first: the first one Spark reads it as wins.
_HIVE_CANDIDATES = ("tinyint", "smallint", "int", "bigint", "float", "double", "boolean", "date", "timestamp")
_HIVE_CANDIDATES += ("binary", "string")

#: The presets' column signatures: which columns make a landing unmistakably that tool's.
SIGNATURES: dict[str, tuple[tuple[str, ...], ...]] = {
    "debezium": (("__op", "__lsn"), ("__op", "__file", "__pos")),
    "dms": (("Op", "AR_H_CHANGE_SEQ"),),
    "wal2json": (("kind", "lsn"),),
}

_AVRO_PRIMITIVES = {
    "boolean": "boolean",
    "int": "int",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "bytes": "binary",
    "string": "string",
    "enum": "string",
    "fixed": "binary",
}
_AVRO_LOGICAL = {
    "date": "date",
    "timestamp-millis": "timestamp",
    "timestamp-micros": "timestamp",
    "local-timestamp-millis": "timestamp",
    "local-timestamp-micros": "timestamp",
    "time-millis": "int",
    "time-micros": "bigint",
    "uuid": "string",
}


@dataclass
class Column:
    """One inferred column: its Hive type (or why there is none) and where it came from."""

    name: str
    type: str
    origin: str
    comment: str = ""
    problem: str | None = None
    #: The files disagree on its type: the reviewer writes it (the placeholder says which files say what).
    types_differ: bool = False
    #: Each landed file's type of it as Spark reads it (Arrow, logical), to hold a catalog's type against.
    arrow_types: list[str] = field(default_factory=list)


@dataclass
class Discovered:
    """What discovery found for one table directory."""

    table: str
    directory: str
    storage_root: str
    columns: list[Column] = field(default_factory=list)
    columns_origin: str = ""
    key: list[str] | None = None
    key_origin: str = ""
    order_by: list[str] | None = None
    order_origin: str = ""
    source: str = "generic"
    source_origin: str = ""
    op_column: str | None = None
    #: ``keyless`` when the table has no key (the catalog says so, or the files carry before-images).
    mode: str = "cdc"
    before_prefix: str | None = None
    #: keyless: the commit-time column that is the event's, not the row's (guessed: ``ts_ms``).
    event_time: dict[str, str] | None = None
    #: With no key found and no sign of keylessness: the two ways to finish the file, for its comment.
    key_choice: list[str] = field(default_factory=list)
    #: What the source preset fills in for this table's columns (registry._source_defaults).
    preset: dict[str, Any] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)
    todo: list[str] = field(default_factory=list)
    #: The registry's ``format`` and ``envelope`` when known (a schema registry's subjects: Avro records as they are).
    format: str | None = None
    envelope: str | None = None
    format_origin: str = ""


@dataclass
class Options:
    """``registry discover``'s options (README, "Onboarding a database")."""

    landing_root: str
    database: str
    out: Path
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    keys: dict[str, list[str]] = field(default_factory=dict)
    order_by: dict[str, list[str]] = field(default_factory=dict)
    source: str | None = None
    force: bool = False
    conn_id: str = "aws_default"
    max_files: int = 500
    #: A PostgreSQL catalog to read keys and types from (libpq DSN, or an Airflow connection id), and its schema.
    postgres_dsn: str | None = None
    postgres_conn_id: str | None = None
    postgres_schema: str = "public"
    #: A schema registry's Confluent-compatible API: the tables are its ``<topic>-value`` subjects, not directories.
    schema_registry: str | None = None


@dataclass
class Report:
    """The summary: tables found, files written (ready or to finish), tables skipped and why."""

    found: list[str] = field(default_factory=list)
    written: list[tuple[str, Path]] = field(default_factory=list)
    unfinished: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"found {len(self.found)} table directories: {', '.join(self.found) or '-'}"]
        for table, path in self.written:
            problems = self.unfinished.get(table)
            if problems:
                out.append(f"WROTE {path} -- NEEDS EDITS before it validates: {'; '.join(problems)}")
            else:
                out.append(f"WROTE {path} (validates; review its comments)")
        out += [f"SKIP  {table}: {why}" for table, why in self.skipped]
        ready = len(self.written) - len(self.unfinished)
        counts = f"{ready} valid, {len(self.unfinished)} to finish"
        out.append(f"{len(self.written)} written ({counts}), {len(self.skipped)} skipped")
        return out


def parse_hints(values: list[str], option: str) -> dict[str, list[str]]:
    """``table=col1,col2`` hints as a mapping; raise ValueError naming the bad one."""
    out: dict[str, list[str]] = {}
    for v in values:
        table, sep, cols = v.partition("=")
        names = [c.strip() for c in cols.split(",") if c.strip()]
        if not sep or not table.strip() or not names:
            raise ValueError(f"{option} {v!r}: write it as table=col1,col2")
        out[table.strip()] = names
    return out


# -- types ----------------------------------------------------------------------------


def hive_type_of_arrow(arrow: Any, physical: str | None = None) -> str | None:
    """The narrowest Hive type Spark reads a Parquet column of this Arrow type as; None if none."""
    logical = logical_type(arrow, physical)
    dec = decimal_parts(logical) if logical.startswith("decimal") else None
    if dec is not None:
        return f"decimal({dec[0]},{dec[1]})" if dec[0] <= 38 else None
    return next((t for t in _HIVE_CANDIDATES if readable_as(t, logical)), None)


def hive_type_of_avro(schema: Any, named: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(Hive type or None, note) of an Avro field type; a union with null is its other branch."""
    named = named if named is not None else {}
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            return None, f"a union of {branches} has no single Hive type"
        return hive_type_of_avro(branches[0], named)
    if isinstance(schema, str):
        if schema in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[schema], ""
        if schema in named:
            return named[schema], ""
        return None, f"Avro type {schema!r} has no Hive column type"
    if not isinstance(schema, dict):
        return None, f"{schema!r} is not an Avro type"
    logical = schema.get("logicalType")
    kind = schema.get("type")
    if logical == "decimal":
        precision, scale = int(schema.get("precision", 0)), int(schema.get("scale", 0))
        if not 1 <= precision <= 38:
            return None, f"decimal precision {precision} is outside Hive's 1-38"
        return f"decimal({precision},{scale})", ""
    if logical in _AVRO_LOGICAL:
        note = "a time of day, kept as its integer count" if logical.startswith("time-") else ""
        return _AVRO_LOGICAL[logical], note
    if kind in ("enum", "fixed"):
        if isinstance(schema.get("name"), str):
            named[schema["name"]] = _AVRO_PRIMITIVES[kind]
        return _AVRO_PRIMITIVES[kind], ""
    if kind in ("record", "array", "map"):
        return None, f"a nested {kind} has no flat Hive column (flatten it when landing)"
    connect = schema.get("connect.name")
    hive, note = hive_type_of_avro(kind, named)
    if connect and hive is not None:
        note = f"Kafka Connect type {connect}: kept as {hive}; CHECK whether it should be declared otherwise"
    return hive, note


def _widen(a: str, b: str) -> str | None:
    if a == b:
        return a
    if hive_widening(a, b):
        return b
    if hive_widening(b, a):
        return a
    return None


# -- reading a table directory --------------------------------------------------------


def _data_files(storage: Storage, landing: str) -> list[str]:
    """The data files of every increment directory under ``landing``, sorted (oldest increment first)."""
    files: list[str] = []
    try:
        increments = storage.list_dir(landing)
    except Exception:  # noqa: BLE001 - a table without a landing directory yet has no files
        return []
    for inc in sorted(increments, key=lambda e: e.name):
        if not inc.is_dir or is_in_progress(inc.name, True):
            continue
        for e in sorted(storage.list_dir(inc.path), key=lambda e: e.name):
            if not e.is_dir and is_data_file(e.name) and not is_in_progress(e.name, False):
                files.append(e.path)
    return files


_NULLS_ONLY = "only NULLs in every file read (Arrow type null): no type to infer; write the source's type"


def columns_from_parquet(storage: Storage, files: list[str], shown: str) -> tuple[list[Column], list[str]]:
    """The union of the files' footers as columns (first-seen order), and the files that could not be read."""
    import pyarrow.parquet as pq

    cols: dict[str, Column] = {}
    lower: dict[str, str] = {}
    unreadable: list[str] = []
    #: Column -> each Hive type the files give it -> where ("<arrow type> in <file>"), to find disagreements.
    seen: dict[str, dict[str, list[str]]] = {}
    for f in files:
        try:
            with storage.open_read(f) as fh:
                meta = pq.read_metadata(fh)
            schema = meta.schema.to_arrow_schema()
        except Exception as exc:  # noqa: BLE001 - an unreadable file is reported, the others still count
            unreadable.append(f"{f} ({type(exc).__name__})")
            continue
        physical = physical_types(meta)
        rel = f[len(shown) :].lstrip("/") if f.startswith(shown) else f
        for a in schema:
            hive = hive_type_of_arrow(a.type, physical.get(a.name))
            known = lower.get(a.name.lower())
            # A column a writer saw only NULLs in has Arrow type null: it fits any type another file shows.
            nulls = str(a.type) == "null"
            if known is None:
                lower[a.name.lower()] = a.name
                problem = None if hive else f"Arrow type {a.type} has no Hive type Spark reads it as"
                problem = _NULLS_ONLY if nulls else problem
                cols[a.name] = Column(a.name, hive or "", f"{a.type} in {rel}", problem=problem)
                continue
            col = cols[known]
            if nulls and known == a.name:
                continue
            if col.problem == _NULLS_ONLY and known == a.name:
                col.origin, col.problem = f"{a.type} in {rel}", None if hive else f"{a.type} in {rel} has no Hive type"
                col.type = hive or ""
            elif known != a.name:
                col.problem = f"named {known!r} and {a.name!r} in different files (Spark compares names ignoring case)"
            elif hive is None and col.problem is None:
                col.problem = f"{a.type} in {rel} has no Hive type Spark reads it as"
        for a in schema:
            if str(a.type) != "null" and lower.get(a.name.lower()) == a.name:
                hive = hive_type_of_arrow(a.type, physical.get(a.name)) or str(a.type)
                seen.setdefault(a.name, {}).setdefault(hive, []).append(f"{a.type} in {rel}")
                cols[a.name].arrow_types.append(logical_type(a.type, physical.get(a.name)))
    for name, by_type in seen.items():
        col = cols[name]
        if len(by_type) > 1 and col.problem is None:
            _types_differ(col, by_type)
    return list(cols.values()), unreadable


def _types_differ(col: Column, by_type: dict[str, list[str]]) -> None:
    """Mark ``col`` as typed differently by the files (Hive type -> "<arrow type> in <file>", first seen first).

    A type that reads them all may exist (int32 and int64: bigint), but which one the source means is
    the reviewer's call: the source's type changed, or two writers disagree. The placeholder fails
    validation, the comment names the files and their types.
    """
    said = "; ".join(
        ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "") for where in by_type.values()
    )
    types = list(by_type)
    wider: str | None = types[0]
    for t in types[1:]:
        wider = _widen(wider, t) if wider is not None else None
    hint = f"{wider} reads every one of them" if wider is not None else "no Hive type reads them all"
    col.type, col.types_differ, col.origin = "", True, f"types differ: {said}"
    col.problem = (
        f"the files disagree on its type ({said}); {hint}: CHECK the source column's type and write it as the type"
    )


def _named_records(schema: Any, out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every record an Avro schema defines, by name and full name (a later field may refer to one by name)."""
    out = {} if out is None else out
    if isinstance(schema, list):
        for branch in schema:
            _named_records(branch, out)
    elif isinstance(schema, dict):
        if schema.get("type") == "record" and isinstance(schema.get("name"), str):
            out[schema["name"]] = schema
            if isinstance(schema.get("namespace"), str):
                out[f"{schema['namespace']}.{schema['name']}"] = schema
        for f in schema.get("fields", []) if isinstance(schema.get("fields"), list) else []:
            if isinstance(f, dict):
                _named_records(f.get("type"), out)
    return out


def _record_fields(schema: Any, named: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        schema = branches[0] if len(branches) == 1 else None
    if isinstance(schema, str) and named:
        schema = named.get(schema)
    if isinstance(schema, dict) and schema.get("type") == "record" and isinstance(schema.get("fields"), list):
        return [f for f in schema["fields"] if isinstance(f, dict)]
    return None


def _avro_columns(fields: list[dict[str, Any]], origin: str) -> list[Column]:
    named: dict[str, str] = {}
    out = []
    for f in fields:
        hive, note = hive_type_of_avro(f.get("type"), named)
        doc = " ".join(str(f.get("doc", "")).split())[:256]
        out.append(
            Column(
                str(f.get("name")),
                hive or "",
                f"{json.dumps(f.get('type'))[:80]} in {origin}" + (f"; {note}" if note and hive else ""),
                comment=doc,
                problem=None if hive else note,
            )
        )
    return out


def columns_from_avro(schema: Any, origin: str) -> tuple[list[Column], list[str] | None, list[str]]:
    """(columns, ordering columns, notes) of an Avro value schema; the ordering columns are None
    unless it is a Debezium envelope.

    A Debezium envelope becomes what its ExtractNewRecordState flattening writes with
    ``add.fields=op,source.ts_ms`` plus ``lsn`` (Postgres) or ``file,pos,row`` (MySQL) and
    ``delete.handling.mode=rewrite``: the ``after`` record's fields, then ``__op``, the
    position columns, ``__source_ts_ms`` and ``__deleted``.
    """
    fields = _record_fields(schema)
    if fields is None:
        return [], None, [f"{origin} is not an Avro record schema"]
    names = {f.get("name") for f in fields}
    after = next((f for f in fields if f.get("name") == "after"), None)
    if not ({"before", "after", "op", "source"} <= names and after is not None):
        return _avro_columns(fields, origin), None, []
    value = _record_fields(after.get("type"), _named_records(schema))
    if value is None:
        return [], None, [f"{origin}: the envelope's 'after' is not a record"]
    source = next((f for f in fields if f.get("name") == "source"), {})
    source_fields = {f.get("name") for f in (_record_fields(source.get("type")) or [])}
    cols = _avro_columns(value, f"{origin} (after)")
    smt = "added by ExtractNewRecordState"
    cols.append(Column("__op", "string", f"{smt} (add.fields=op)"))
    order: list[str] = []  # empty, not None: an envelope, whose source has no position Debezium adds
    if "lsn" in source_fields:
        cols.append(Column("__lsn", "bigint", f"{smt} (add.fields=lsn; source.lsn)"))
        order = ["__lsn"]
        if "sequence" in source_fields:
            # The commit position a killed Connect worker's re-sent events keep (docs/debezium.md): the job
            # derives it from the record's __sequence (add.fields=sequence), which the registry leaves out.
            cols.append(Column("__commit_lsn", "bigint", COMMIT_LSN_ORIGIN))
            order = ["__commit_lsn", "__lsn"]
    elif {"file", "pos"} <= source_fields:
        cols.append(Column("__file", "string", f"{smt} (add.fields=file; source.file)"))
        cols.append(Column("__pos", "bigint", f"{smt} (add.fields=pos; source.pos)"))
        cols.append(Column("__row", "int", f"{smt} (add.fields=row; source.row)"))
        order = ["__file", "__pos", "__row"]
    if "ts_ms" in source_fields:
        cols.append(Column("__source_ts_ms", "bigint", f"{smt} (add.fields=source.ts_ms)"))
    cols.append(Column("__deleted", "string", f"{smt} (delete.handling.mode=rewrite)"))
    position = "lsn,sequence" if "__commit_lsn" in {c.name for c in cols} else "lsn"
    notes = [
        f"{origin} is a Debezium envelope: the columns assume the sink flattens it with ExtractNewRecordState "
        f"(add.fields=op,source.ts_ms and {position} or file,pos,row; delete.handling.mode=rewrite); CHECK the "
        "connector's configuration writes exactly these"
    ]
    return cols, order, notes


def key_from_avro(schema: Any) -> list[str] | None:
    """The primary key a key schema names (its record's fields, in order); None if it names none."""
    fields = _record_fields(schema)
    if not fields:
        return None
    return [str(f.get("name")) for f in fields]


def _avro_files(storage: Storage, directory: str) -> tuple[list[str], list[str]]:
    """(key schemas, value schemas) among a table directory's ``.avsc`` files."""
    try:
        entries = storage.list_dir(directory)
    except Exception:  # noqa: BLE001 - listed just before; gone is the same as empty
        return [], []
    avsc = sorted(e.path for e in entries if not e.is_dir and e.name.endswith(".avsc"))
    keys = [p for p in avsc if p.endswith("-key.avsc")]
    values = [p for p in avsc if p not in keys]
    # A schema registry's subjects are <topic>-value and <topic>-key: prefer the -value file.
    values.sort(key=lambda p: not p.endswith("-value.avsc"))
    return keys, values


def _load_avsc(storage: Storage, path: str) -> Any:
    return json.loads(storage.read_text(path))


# -- keys and keyless tables ---------------------------------------------------------

#: What a before-image column's prefix says (``_before_``, ``old_``, ``prev_``...), stripped of '_'.
_BEFORE_WORDS = ("before", "old", "prev", "previous")
#: Columns of a keyless landing that have no before-image: the op, the order, an event time.
_UNPAIRED_CONTROLS = 3


def before_image_prefix(names: list[str]) -> str | None:
    """The prefix of the files' before-image columns (``_before_`` of ``_before_name`` beside ``name``), or None.

    Taken only when the prefix says so (before, old, prev) and every column but at most the
    op, order and event-time columns has its before-image: a keyless table's landing shape.
    """
    pairs: dict[str, set[str]] = {}
    for b in names:
        for n in names:
            if len(b) > len(n) and b.lower().endswith(n.lower()):
                p = b[: len(b) - len(n)]
                if re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$", p) and p.lower().strip("_") in _BEFORE_WORDS:
                    pairs.setdefault(p, set()).add(n.lower())
    for p, paired in sorted(pairs.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        plain = {n.lower() for n in names if not n.lower().startswith(p.lower())}
        if len(plain - paired) <= _UNPAIRED_CONTROLS:
            return p
    return None


def apply_catalog(d: Discovered, pg: PgTable) -> None:
    """Lay the source catalog's column types over what the files showed (or list its columns if none landed).

    The catalog's type wins where every landed file reads as it (``char(3)`` over a landed string,
    ``bigint`` over files that disagree between int32 and int64); where a file does not, the column
    gets a placeholder naming both.
    """
    where = f"PostgreSQL {pg.qualified_name}"
    if not d.columns:
        d.columns = [
            Column(
                c.name,
                c.hive or "",
                f"{c.pg_type} in {where}" + (f" ({c.note})" if c.note and c.hive else ""),
                problem=None if c.hive else c.note,
            )
            for c in pg.columns
        ]
        d.columns_origin = f"the catalog of {where} (nothing landed yet)"
        d.checks.append("nothing landed yet: add the columns the sink writes besides the table's (op, order, ...)")
        return
    by_name = {c.name.lower(): c for c in pg.columns}
    landed = {c.name.lower() for c in d.columns}
    for col in d.columns:
        pc = by_name.get(col.name.lower())
        if pc is None or (col.problem is not None and not col.types_differ and col.problem != _NULLS_ONLY):
            continue
        if pc.hive is None:
            d.checks.append(f"column {col.name!r} is {pc.pg_type} in {where}: {pc.note}; the files' type is kept")
            continue
        unread = sorted({t for t in col.arrow_types if not readable_as(pc.hive, t)})
        landed_as = ", ".join(sorted(set(col.arrow_types))) or "no file"
        if unread:
            col.type, col.types_differ = "", True
            col.problem = (
                f"{where} declares it {pc.pg_type} ({pc.hive}) but the files hold {', '.join(unread)}, which "
                f"Spark does not read as {pc.hive}: CHECK how the sink converts it and write the type"
            )
            col.origin = f"{pc.pg_type} in {where}; landed as {landed_as}"
            continue
        col.type, col.problem, col.types_differ = pc.hive, None, False
        col.origin = f"{pc.pg_type} in {where}" + (f" ({pc.note})" if pc.note else "") + f"; landed as {landed_as}"
    missing = [c.name for c in pg.columns if c.name.lower() not in landed]
    if missing:
        d.checks.append(f"columns of {where} no landed file has: {missing} (not replicated, or none changed yet)")


def _key_from_catalog(d: Discovered, pg: PgTable) -> None:
    """The key the catalog gives (primary key, else the replica identity index), or ``mode: keyless``."""
    where = f"PostgreSQL {pg.qualified_name}"
    ri = pg.replica_identity
    if pg.primary_key:
        d.key, d.key_origin = list(pg.primary_key), f"the primary key of {where}"
        if ri == "FULL":
            d.checks.append(
                f"{where} has REPLICA IDENTITY FULL: its updates and deletes log the whole old row (more WAL "
                "than the key needs)"
            )
        elif ri == "NOTHING":
            d.checks.append(
                f"{where} has REPLICA IDENTITY NOTHING: its deletes carry no key, so they cannot be applied; "
                f"run ALTER TABLE {pg.qualified_name} REPLICA IDENTITY DEFAULT"
            )
        return
    if pg.identity_index:
        d.key = list(pg.identity_index)
        d.key_origin = (
            f"the REPLICA IDENTITY index of {where} (it has no primary key; a unique index of NOT NULL columns)"
        )
        return
    d.mode = "keyless"
    d.before_prefix = before_image_prefix([c.name for c in d.columns])
    d.key_origin = f"{where} has no primary key (REPLICA IDENTITY {ri}): its rows are a multiset, mode: keyless"
    if ri == "FULL":
        d.checks.append(
            f"{where} has REPLICA IDENTITY FULL: its updates and deletes log the whole old row, the before-image "
            "a keyless table needs"
        )
    else:
        d.checks.append(
            f"{where} has no primary key and REPLICA IDENTITY {ri}: PostgreSQL logs no old row for its updates and "
            f"deletes, which a keyless table needs: run ALTER TABLE {pg.qualified_name} REPLICA IDENTITY FULL"
        )
    if d.before_prefix is None:
        d.todo.append(
            "mode: keyless needs a before-image column _before_X for every data column X (the old row of an update "
            "or delete): land them (REPLICA IDENTITY FULL, and a sink that writes the before values) or name "
            "their prefix with before_prefix"
        )


def _column_names(d: Discovered) -> set[str]:
    """The discovered columns' names; each column without a type becomes a to-do naming its problem."""
    d.todo += [f"column {c.name!r}: {c.problem}" for c in d.columns if c.problem]
    return {c.name for c in d.columns}


def _check_op_column(d: Discovered, names: set[str]) -> None:
    """A to-do (and the placeholder op column) when the preset's op column is not among the columns."""
    op = d.preset.get("op_column", "op")
    if op not in names:
        d.op_column = MISSING_OP
        d.todo.append(f"op_column: no column {op!r} (the {d.source} op column); name the column holding the op code")


def recognize_source(columns: set[str]) -> tuple[str, str]:
    """(source, why) from the presets' column signatures: a preset only when exactly one matches."""
    matches = {
        source: sig for source, sigs in SIGNATURES.items() for sig in sigs if set(sig) <= columns
    }  # at most one signature per source is recorded, which is enough to name it
    if len(matches) == 1:
        (source, sig), *_ = matches.items()
        return source, f"recognized from the columns {', '.join(sig)}"
    if len(matches) > 1:
        return "generic", (
            f"the columns match several presets ({', '.join(sorted(matches))}); CHECK and pass --source to pick one"
        )
    return "generic", "no preset's column signature matches (generic: op column 'op', codes c r u d)"


def discover_table(
    storage: Storage,
    opts: Options,
    table: str,
    directory: str,
    storage_root: str,
    increments_dir: str = "incremental",
    default_source: str | None = None,
    catalog: Callable[[str], PgTable | None] | None = None,
) -> Discovered:
    """Infer one table's entry from its directory (its increments under ``increments_dir``).

    ``default_source`` is the database defaults' ``source``: used (and not written) when
    ``--source`` is not given, so the table file does not override it.  ``catalog`` looks the
    table up in the source database (PostgreSQL): its key, types and replica identity win over
    what the files suggest (:func:`apply_catalog`).
    """
    d = Discovered(table, directory, storage_root)
    landing = storage.join(directory, increments_dir)
    files = _data_files(storage, landing)
    if len(files) > opts.max_files:
        d.checks.append(f"read the newest {opts.max_files} of {len(files)} landed files' footers (--max-files)")
        files = files[-opts.max_files :]
    key_files, value_files = _avro_files(storage, directory)
    avro_order: list[str] | None = None
    if files:
        d.columns, unreadable = columns_from_parquet(storage, files, landing)
        d.columns_origin = f"the union of the Parquet footers of {len(files) - len(unreadable)} landed files"
        if unreadable:
            d.checks.append(f"could not read {len(unreadable)} files: {', '.join(unreadable[:5])}")
        if value_files:
            d.checks.append(f"the Avro value schema {Path(value_files[0]).name} was not used: the landed files win")
    elif value_files:
        name = Path(value_files[0]).name
        if len(value_files) > 1:
            d.checks.append(f"several value schemas {[Path(p).name for p in value_files]}: used {name}")
        try:
            d.columns, avro_order, notes = columns_from_avro(_load_avsc(storage, value_files[0]), name)
        except (ValueError, OSError) as exc:
            d.todo.append(f"the value schema {name} is not readable JSON ({exc})")
            notes = []
        d.columns_origin = f"the Avro value schema {name} (no Parquet file has landed yet)"
        d.checks += notes
    pg = catalog(table) if catalog is not None else None
    if catalog is not None and pg is None:
        d.checks.append(
            f"no table {opts.postgres_schema}.{table} in the PostgreSQL catalog: key and types from the files"
        )
    if pg is not None:
        apply_catalog(d, pg)
    names = _column_names(d)
    # The key.
    if table in opts.keys:
        d.key, d.key_origin = opts.keys[table], "from --key"
    elif pg is not None:
        _key_from_catalog(d, pg)
    elif key_files:
        name = Path(key_files[0]).name
        try:
            d.key = key_from_avro(_load_avsc(storage, key_files[0]))
        except (ValueError, OSError):
            d.key = None
        d.key_origin = f"the fields of the key schema {name}" if d.key else f"not found: {name} names no record fields"
    prefix = before_image_prefix([c.name for c in d.columns]) if d.key is None and d.mode == "cdc" else None
    if prefix is not None:
        d.mode, d.before_prefix = "keyless", prefix
        d.key_origin = (
            f"none found, and the files carry before-images ({prefix}<column>): a table without a key, "
            "compacted as a multiset (mode: keyless). CHECK the source table has no key; if it has one, "
            "set mode: cdc and primary_key instead"
        )
    if d.key is None and d.mode == "cdc":
        d.key_origin = d.key_origin or "not found: no --key hint, no <name>-key.avsc and no catalog"
        d.todo.append(
            f"primary_key: no key found; replace {MISSING_KEY} with the key columns (or pass --key), or, if the "
            "source table has no key, make it mode: keyless (see the comment at primary_key)"
        )
        d.key_choice = [
            f"if the source table has a key: replace {MISSING_KEY} with its columns (or pass --key);",
            "if it has none: replace this line with `mode: keyless`; a keyless table needs, for every data column",
            "X, a before-image column _before_X (before_prefix) holding X before an update or delete (PostgreSQL:",
            "REPLICA IDENTITY FULL), an op column and an order_by that is the log's sequence (an LSN, not a time).",
        ]
    if d.mode == "keyless" and "__commit_lsn" in names and "__row" not in names and avro_order is not None:
        # A keyless table's events are told apart by [__lsn, __row]: the rows of a snapshot share one LSN.
        d.columns.append(Column("__row", "bigint", ROW_ORIGIN))
        names.add("__row")
    # The source preset and the op column.
    if opts.source is not None:
        d.source, d.source_origin = opts.source, "from --source"
    elif default_source is not None:
        d.source, d.source_origin = default_source, DEFAULTS_SOURCE
    else:
        d.source, d.source_origin = recognize_source(names)
        if avro_order is not None and d.source == "generic":
            d.source, d.source_origin = "debezium", "the value schema is a Debezium envelope"
    preset = source_defaults(d.source, d.mode, names)
    d.preset = preset
    _check_op_column(d, names)
    lowered = {n.lower() for n in names}
    if d.source == "debezium" and files and "__sequence" in lowered and "__commit_lsn" not in lowered:
        # Parquet is read as it lands, never decoded: the position must be in the file (docs/debezium.md).
        d.checks.append(
            "the landed Parquet files carry __sequence but no __commit_lsn: the job reads Parquet as it is and "
            "derives nothing, so the order falls back to "
            f"{preset.get('order_by')}; a killed Connect worker re-sends events under new Kafka offsets. Have the "
            "sink write __commit_lsn (the first LSN of __sequence, a number; a keyless table also __row) and "
            f"declare them (see {doc_ref('debezium', 'a-killed-connect-worker')})"
        )
    # The order.
    if table in opts.order_by:
        d.order_by, d.order_origin = opts.order_by[table], "from --order-by"
    elif "order_by" in preset:
        d.order_origin = f"filled by the {d.source} preset: {preset['order_by']}"
    elif d.source == "generic" and "ts_ms" in names:
        d.order_by = ["ts_ms"]
        d.order_origin = "guessed from the column name ts_ms; CHECK it orders the source's changes"
        d.checks.append("order_by [ts_ms] is a time: two changes in one millisecond tie; a log position is safer")
    else:
        d.order_origin = "not found"
        d.todo.append(f"order_by: no ordering column found; replace {MISSING_ORDER} (or pass --order-by)")
    # A keyless table's columns are the row's unless declared otherwise: a commit time is the event's.
    order = d.order_by or preset.get("order_by") or []
    if d.mode == "keyless" and "event_time" not in preset and "ts_ms" in names and "ts_ms" not in order:
        prefix = (d.before_prefix or "_before_").lower()
        if f"{prefix}ts_ms" not in {n.lower() for n in names}:
            d.event_time = {"column": "ts_ms", "unit": "ms"}
    return d


# -- writing --------------------------------------------------------------------------


def _flow(value: Any) -> str:
    """``value`` as one line of YAML (quoted where YAML needs it).

    A string with a line break (a source's type name, a problem naming it) would be written as a
    quoted scalar over several lines: valid, but no longer one line per key. Double quotes escape it
    (``\\n``) instead.
    """
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
    text = text.removesuffix("\n...")  # a plain scalar's document-end marker
    if "\n" in text:
        text = yaml.safe_dump(value, default_flow_style=True, default_style='"', sort_keys=False, width=10_000)
        text = text.strip().removesuffix("\n...")
    return text


def _comment(line: str) -> str:
    """``line`` as one comment line: what it quotes from the source (a type, a column, a path) may hold
    line breaks (YAML's include U+0085, U+2028 and U+2029) or other control characters, escaped here
    so that no piece of it becomes a key of the file."""
    return printable(line)


def render(d: Discovered, database: str, when: datetime) -> str:
    """The YAML text of one discovered table: values with comments saying where each came from."""
    lines = [
        f"# Written by `cdc-compaction registry discover` on {when:%Y-%m-%d %H:%M} UTC",
        f"# from {d.directory}. Review it before committing: each value says where it came from;",
        "# every CHECK is yours to confirm. Defaults of this database's _database.yaml apply under it.",
    ]
    if d.todo:
        lines.append("# NEEDS EDITS: this file does not validate until you fix:")
        lines += [f"#   - {t}" for t in d.todo]
    lines += [f"# CHECK: {c}" for c in d.checks]
    lines += [
        f"database: {_flow(database)}",
        f"table: {_flow(d.table)}",
        "# storage_root: the table's directory under the landing root.",
        f"storage_root: {_flow(d.storage_root)}",
        f"# source: {d.source_origin}.",
    ]
    lines.append(f"# source: {d.source}" if d.source_origin == DEFAULTS_SOURCE else f"source: {_flow(d.source)}")
    filled = {k: v for k, v in d.preset.items() if not (k == "order_by" and d.order_by is not None)}
    if filled:
        shown = ", ".join(f"{k}: {_flow(v)}" for k, v in filled.items())
        lines.append(f"#   the {d.source} preset fills in {shown}; CHECK the sink writes these.")
    if d.format is not None:
        lines.append(f"# format, envelope: {d.format_origin}.")
        lines.append(f"format: {_flow(d.format)}")
        lines.append(f"envelope: {_flow(d.envelope or 'flattened')}")
    if d.op_column is not None:
        lines.append(f"op_column: {d.op_column}")
    if d.mode == "keyless":
        lines.append(f"# mode: {d.key_origin}.")
        lines.append("mode: keyless")
        if d.before_prefix is not None and d.before_prefix != "_before_":
            lines.append(f"before_prefix: {_flow(d.before_prefix)}")
    else:
        lines.append(f"# primary_key: {d.key_origin}. CHECK: unique per row of the source table.")
        lines += [f"#   {line}" for line in d.key_choice]
        lines.append(f"primary_key: {_flow(d.key or [MISSING_KEY])}")
    if d.order_by is not None or d.order_origin == "not found":
        lines.append(f"# order_by: {d.order_origin}.")
        lines.append(f"order_by: {_flow(d.order_by or [MISSING_ORDER])}")
    else:
        lines.append(f"# order_by: {d.order_origin}.")
    if d.event_time is not None:
        lines.append(
            "# event_time: guessed from the column name ts_ms (a commit time in ms, the event's, not the row's: "
            "it has no before-image). CHECK it."
        )
        lines.append(f"event_time: {_flow(d.event_time)}")
    lines.append(f"# columns: {d.columns_origin}; each line's comment is the type it was read from.")
    lines.append("columns:")
    for c in d.columns:
        placeholder = "TYPES DIFFER" if c.types_differ else "UNSUPPORTED"
        spec: dict[str, Any] = {"name": c.name, "type": c.type or f"{placeholder}: {c.problem}"}
        if c.comment:
            spec["comment"] = c.comment
        lines.append(f"  - {_flow(spec)}  # {_comment(' '.join(c.origin.split()))}")
    # Every comment is built from source names: one line each, whatever they hold.
    lines = [_comment(line) if line.startswith("#") else line for line in lines]
    return "\n".join(lines) + "\n"


def _selected(table: str, opts: Options) -> str | None:
    """Why ``table`` is left out by the include/exclude patterns, or None if it is taken."""
    if opts.include and not any(fnmatch.fnmatchcase(table, p) for p in opts.include):
        return f"matches no --include pattern {opts.include}"
    hit = next((p for p in opts.exclude if fnmatch.fnmatchcase(table, p)), None)
    return f"matches --exclude pattern {hit!r}" if hit else None


def discover(opts: Options, now: datetime | None = None) -> Report:
    """Write a registry entry for every table directory of ``opts.landing_root``; return the summary."""
    check_identifier(opts.database, "--database")
    if opts.source is not None and opts.source not in SOURCES:
        raise ValueError(f"--source {opts.source!r}: use one of {', '.join(SOURCES)}")
    when = now or datetime.now(UTC)
    root = opts.landing_root.rstrip("/")
    if opts.schema_registry is not None:
        return discover_registry(opts, root, when)
    resolved = resolve_storage_root(root)
    storage = storage_for(resolved, opts.conn_id)
    if "://" not in resolved and not Path(resolved).is_dir():
        raise ValueError(f"landing root {root!r} ({resolved}) is not a directory")
    report = Report()
    entries = sorted((e for e in storage.list_dir(resolved) if e.is_dir), key=lambda e: e.name)
    defaults = load_database_defaults(opts.out)
    hinted = set(opts.keys) | set(opts.order_by)
    # The database's defaults may move the landing area (increments.directory): look where the DAG will.
    own = defaults.get(opts.database)
    inc = own.values.get("increments") if own is not None and own.error is None else None
    increments_dir = inc.get("directory", Increments().directory) if isinstance(inc, dict) else Increments().directory
    default_source = own.values.get("source") if own is not None and own.error is None else None
    catalog: Callable[[str], PgTable | None] | None = None
    conn = None
    if opts.postgres_dsn is not None or opts.postgres_conn_id is not None:
        from cdc_compaction.integrations import pgcatalog

        check_identifier(opts.postgres_schema, "--postgres-schema")
        conn = pgcatalog.connect(opts.postgres_dsn, opts.postgres_conn_id)
        catalog = functools.partial(pgcatalog.read_table, conn, opts.postgres_schema)
    try:
        _discover_entries(opts, report, entries, storage, root, when, defaults, increments_dir, default_source, catalog)
    finally:
        if conn is not None:
            conn.close()
    for t in sorted(hinted - set(report.found)):
        report.skipped.append((t, "a --key/--order-by hint names a table directory the landing root does not have"))
    return report


def _write_entry(opts: Options, report: Report, d: Discovered, path: Path, defaults: Any, when: datetime) -> None:
    """Write ``d``'s entry to ``path``, validated by the registry's model first (its problems go to the report)."""
    text = render(d, opts.database, when)
    try:
        parse_entry(path, text, defaults)
    except RegistryError as exc:
        report.unfinished[d.table] = exc.problems
    opts.out.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    log.info("wrote %s", path)
    report.written.append((d.table, path))


def _discover_entries(
    opts: Options,
    report: Report,
    entries: list[Any],
    storage: Storage,
    root: str,
    when: datetime,
    defaults: Any,
    increments_dir: str,
    default_source: str | None,
    catalog: Callable[[str], PgTable | None] | None,
) -> None:
    for e in entries:
        if e.name.startswith(("_", ".")):
            continue  # the landing's own metadata, never a table
        report.found.append(e.name)
        why = _selected(e.name, opts)
        if why:
            report.skipped.append((e.name, why))
            continue
        try:
            check_identifier(e.name, "table directory")
        except IdentifierError as exc:
            report.skipped.append((e.name, f"{exc}; rename the directory or register it by hand"))
            continue
        existing = [opts.out / f"{opts.database}.{e.name}{s}" for s in REGISTRY_SUFFIXES]
        present = next((p for p in existing if p.exists()), None)
        if present is not None and not opts.force:
            report.skipped.append((e.name, f"{present} exists (pass --force to overwrite it)"))
            continue
        d = discover_table(storage, opts, e.name, e.path, f"{root}/{e.name}", increments_dir, default_source, catalog)
        if not d.columns:
            report.skipped.append((e.name, "no landed Parquet file and no Avro value schema (.avsc): nothing to read"))
            continue
        _write_entry(opts, report, d, present or existing[0], defaults, when)


# -- from a schema registry's subjects ---------------------------------------------------

#: The subjects' suffixes (Confluent's TopicNameStrategy, which Debezium's converters use).
VALUE_SUFFIX, KEY_SUFFIX = "-value", "-key"
#: The source positions of a Debezium PostgreSQL envelope the job derives (docs/debezium.md, "A killed Connect worker").
ENVELOPE_ORIGIN = "derived by the job from the envelope's source block"


def envelope_columns(value: Any, subject: str, keyed: bool) -> tuple[list[Column], list[str]] | None:
    """(columns, notes) of a ``envelope: debezium`` entry from a Debezium envelope's Avro schema; None if not one.

    The ``after`` record's fields, then ``__op``; for PostgreSQL (``source.lsn``) ``__lsn`` and, where
    ``source`` has ``sequence``, ``__commit_lsn`` (the preset orders by them); a keyless table adds the
    before-images ``_before_<column>`` and ``__row`` (its snapshot rows' identity).
    """
    fields = _record_fields(value)
    names = {f.get("name") for f in fields or []}
    if fields is None or not {"before", "after", "op", "source"} <= names:
        return None
    named = _named_records(value)
    after = next(f for f in fields if f.get("name") == "after")
    data = _record_fields(after.get("type"), named)
    if data is None:
        return [], [f"subject {subject}: the envelope's 'after' is not a record"]
    source = next(f for f in fields if f.get("name") == "source")
    source_fields = {f.get("name") for f in (_record_fields(source.get("type"), named) or [])}
    cols = _avro_columns(data, f"subject {subject} (after)")
    if not keyed:
        cols += [
            Column(f"_before_{c.name}", c.type, f"the before-image of {c.name} (envelope before)", problem=c.problem)
            for c in list(cols)
        ]
    cols.append(Column("__op", "string", "the envelope's op"))
    if "lsn" in source_fields:
        if "sequence" in source_fields:
            cols.append(Column("__commit_lsn", "bigint", f"{ENVELOPE_ORIGIN} (the first LSN of source.sequence)"))
        cols.append(Column("__lsn", "bigint", f"{ENVELOPE_ORIGIN} (source.lsn)"))
        if not keyed:
            cols.append(Column("__row", "bigint", ROW_ORIGIN))
    notes = [] if "lsn" in source_fields else [f"subject {subject}: the source block has no lsn (not PostgreSQL)"]
    return cols, notes


def discover_subject(
    opts: Options, table: str, storage_root: str, subject: str, value: Any, key: Any | None
) -> Discovered:
    """One table's entry from its ``<topic>-value`` schema (and ``<topic>-key``, the key), as Avro records land."""
    d = Discovered(table, f"the schema registry {opts.schema_registry}, subject {subject}", storage_root)
    d.format = "avro"
    key_fields = key_from_avro(key) if key is not None else None
    keyed = bool(key_fields) or table in opts.keys
    envelope = envelope_columns(value, subject, keyed)
    if envelope is not None:
        d.columns, notes = envelope
        d.envelope = "debezium"
        d.format_origin = f"the value schema of {subject} is a Debezium envelope (before, after, source, op)"
        d.checks += notes
    else:
        fields = _record_fields(value)
        if fields is None:
            d.todo.append(f"subject {subject} is not an Avro record schema; register this table by hand")
            return d
        d.columns = _avro_columns(fields, f"subject {subject}")
        d.envelope = "flattened"
        d.format_origin = f"the value schema of {subject} is a flat record (ExtractNewRecordState)"
    d.columns_origin = f"the latest value schema of subject {subject}"
    names = _column_names(d)
    if table in opts.keys:
        d.key, d.key_origin = opts.keys[table], "from --key"
    elif key_fields:
        d.key, d.key_origin = key_fields, f"the fields of the key subject {subject.removesuffix(VALUE_SUFFIX)}-key"
    elif d.envelope == "debezium":
        d.mode = "keyless"
        d.key_origin = (
            f"no key subject {subject.removesuffix(VALUE_SUFFIX)}-key: Debezium writes no key for a table without "
            "a primary key, so it is compacted as a multiset (mode: keyless); CHECK the table has REPLICA IDENTITY "
            "FULL (the before-images) and no key"
        )
    else:
        d.key_origin = f"not found: no key subject {subject.removesuffix(VALUE_SUFFIX)}-key and no --key"
        d.todo.append(f"primary_key: no key found; replace {MISSING_KEY} with the key columns (or pass --key)")
    if opts.source is not None:
        d.source, d.source_origin = opts.source, "from --source"
    elif d.envelope == "debezium":
        d.source, d.source_origin = "debezium", "the value schema is a Debezium envelope"
    else:
        d.source, d.source_origin = recognize_source(names)
    d.preset = source_defaults(d.source, d.mode, names)
    _check_op_column(d, names)
    if table in opts.order_by:
        d.order_by, d.order_origin = opts.order_by[table], "from --order-by"
    elif "order_by" in d.preset:
        d.order_origin = f"filled by the {d.source} preset: {d.preset['order_by']}"
    else:
        d.order_origin = "not found"
        d.todo.append(f"order_by: no ordering column found; replace {MISSING_ORDER} (or pass --order-by)")
    return d


def discover_registry(opts: Options, root: str, when: datetime) -> Report:
    """Write an entry for every ``<topic>-value`` subject of ``opts.schema_registry``: the table is the topic's last
    part (``<prefix>.<schema>.<table>``), its storage root ``<landing root>/<table>``."""
    from cdc_compaction.integrations.schema_registry import ConfluentRegistry, SchemaRegistryError

    assert opts.schema_registry is not None
    registry = ConfluentRegistry(opts.schema_registry)
    subjects = registry.subjects()  # an unreachable registry raises, naming the URL and what to check
    report = Report()
    defaults = load_database_defaults(opts.out)
    taken: dict[str, str] = {}
    for subject in sorted(s for s in subjects if s.endswith(VALUE_SUFFIX)):
        topic = subject.removesuffix(VALUE_SUFFIX)
        table = topic.rsplit(".", 1)[-1]
        report.found.append(table)
        why = _selected(table, opts)
        if why:
            report.skipped.append((table, why))
            continue
        if table in taken:
            report.skipped.append(
                (table, f"subject {subject}: the table name is {taken[table]}'s too; use --include to pick one")
            )
            continue
        try:
            check_identifier(table, f"the table of subject {subject}")
        except IdentifierError as exc:
            report.skipped.append((table, f"{exc}; register it by hand"))
            continue
        existing = [opts.out / f"{opts.database}.{table}{s}" for s in REGISTRY_SUFFIXES]
        present = next((p for p in existing if p.exists()), None)
        if present is not None and not opts.force:
            report.skipped.append((table, f"{present} exists (pass --force to overwrite it)"))
            continue
        try:
            _, value = registry.latest(subject)
            key_subject = f"{topic}{KEY_SUFFIX}"
            key = registry.latest(key_subject)[1] if key_subject in subjects else None
        except SchemaRegistryError as exc:
            report.skipped.append((table, f"subject {subject}: {exc}"))
            continue
        taken[table] = subject
        d = discover_subject(opts, table, f"{root}/{table}", subject, value, key)
        if not d.columns:
            report.skipped.append((table, f"subject {subject}: {'; '.join(d.todo) or 'no columns'}"))
            continue
        _write_entry(opts, report, d, present or existing[0], defaults, when)
    for t in sorted((set(opts.keys) | set(opts.order_by)) - set(report.found)):
        report.skipped.append((t, f"a --key/--order-by hint names a table no subject of {opts.schema_registry} has"))
    return report
