"""Schema changes that follow the source (registry ``schema_changes: evolve | fail | ignore``).

A replicator (Debezium, Flink CDC) writes the source table's current columns into each
landed file. When the source adds a column or widens a type, the files change before
anyone edits the registry. :func:`judge` compares one file's columns with the table's
effective columns and says, per policy, what that file means:

* ``evolve`` -- a new column is *added*, a type the reader widens safely (int -> bigint,
  float -> double, decimal precision up) is *widened*, a registry column the file lacks is
  *dropped* (kept in the tables, NULL for new rows, recorded); a type that is no widening,
  or a file that both lacks a column and brings a new one (a rename, as far as a footer
  can tell), is refused naming the column, the old and new type and what to do.
* ``fail`` -- a new column or another type is refused (a bad file: with the default
  ``on_bad_file: fail`` the run stops at once); a missing column reads as NULL.
* ``ignore`` -- new columns are dropped (counted, recorded per file), missing ones read as
  NULL; a type the reader cannot read is still refused.

What ``evolve`` applied is kept in the lake (``_cdc/schema.json``, :func:`save_state`) and
laid over the registry by every step's runtime (:func:`effective_config`): the registry
stays the owner's text, the lake remembers what the source did, and a re-run reads the
same schema.  The plan records the effective columns and the changes; the commit copies them.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.exceptions import IdentifierError
from cdc_compaction.core.hive_types import hive_widening, readable_as
from cdc_compaction.core.identifiers import RESERVED_PREFIX, check_identifier, reserved_name_problem
from cdc_compaction.core.registry import Column, TableConfig

#: Where the evolved schema of a table is kept, under the lake's control directory.
STATE_FILE = "schema.json"

_SIMPLE = {
    "int8": "tinyint",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "uint8": "smallint",
    "uint16": "int",
    "uint32": "bigint",
    "float": "float",
    "halffloat": "float",
    "double": "double",
    "bool": "boolean",
    "string": "string",
    "large_string": "string",
    "binary": "binary",
    "large_binary": "binary",
    "date32[day]": "date",
}
_ARROW_DECIMAL = re.compile(r"^decimal(?:128|256)?\((\d+),\s*(\d+)\)$")


def hive_type_of(arrow_type: str) -> str | None:
    """The Hive type a Parquet column of ``arrow_type`` becomes when added to a table; None: no safe one.

    Nested types, unsigned 64-bit integers and nanosecond timestamps have no type Spark reads
    them as without loss, so they are never added automatically.
    """
    if arrow_type in _SIMPLE:
        return _SIMPLE[arrow_type]
    if arrow_type.startswith(("timestamp[ms", "timestamp[us")):
        return "timestamp"
    m = _ARROW_DECIMAL.match(arrow_type)
    if m and int(m.group(1)) <= 38:
        return f"decimal({m.group(1)},{m.group(2)})"
    return None


def column_name_problem(name: str) -> str | None:
    """Why a column the source added cannot become a table column under ``name``; None if it can.

    The registry's own rule for column names (:class:`cdc_compaction.core.registry.Column`): an identifier
    every engine reading the tables accepts, and not the package's reserved prefix.
    """
    try:
        check_identifier(name, "column name")
    except IdentifierError:
        return "is not a valid identifier (letters, digits and underscores, starting with a letter or underscore)"
    if name.lower().startswith(RESERVED_PREFIX):
        return f"starts with {RESERVED_PREFIX!r}, reserved for the package's own columns"
    if reserved_name_problem(name) is not None:
        return "is reserved for the package (the name of a partitioned table's directories, cdc_partition=<value>)"
    return None


@dataclass(frozen=True)
class Change:
    """One schema change a file shows: ``added``, ``widened``, ``dropped`` or ``ignored``."""

    change: str
    column: str
    old: str = ""
    new: str = ""
    file: str = ""

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v}


@dataclass
class Judgement:
    """What one file's columns mean under a policy: the changes it brings, or why it is refused."""

    changes: list[Change] = field(default_factory=list)
    problem: str | None = None
    ignored: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def judge(
    policy: str,
    columns: list[tuple[str, str]],
    file_columns: dict[str, str],
    path: str,
    dropped: frozenset[str] = frozenset(),
) -> Judgement:
    """Judge a file's ``file_columns`` (name -> Arrow type, as Spark reads it) against ``columns`` (name, Hive type).

    ``dropped`` (lower-case names) are columns an earlier run recorded as dropped: their absence is
    no news, neither a drop to record again nor half of a rename.

    Pure: no I/O. ``path`` names the file in the changes; a refusal is one line whose first words say
    what kind it is (the plan's error adds the table and file; quarantine groups by those words).
    """

    out = Judgement()
    found = {n.lower(): (n, t) for n, t in file_columns.items()}
    wrong: list[str] = []
    for name, hive in columns:
        hit = found.pop(name.lower(), None)
        if hit is None:
            out.missing.append(name)
            continue
        arrow = hit[1]
        if readable_as(hive, arrow):
            continue
        new = hive_type_of(arrow)
        if policy == "evolve" and new is not None and hive_widening(hive, new):
            out.changes.append(Change("widened", name, hive, new, path))
        else:
            # The refusal's first words group it (quarantine reasons): keep them as they always were.
            line = f"column {name!r} is {arrow} in the file but {hive} in the registry"
            if new is not None and hive_widening(hive, new):
                line += f" (a widening to {new}: set schema_changes: evolve to follow it, or widen the registry)"
            wrong.append(line)
    extra = sorted(found.values())
    if wrong:
        out.problem = "incompatible schema: " + "; ".join(wrong)
        if policy == "evolve":
            out.problem += (
                ". Only widenings follow the source (int -> bigint, float -> double, decimal precision up): "
                "put the source column back, or edit the registry and migrate the table by hand "
                f"({doc_ref('data', 'changing-a-schema')})"
            )
        return out
    if policy == "ignore":
        out.ignored = [n for n, _ in extra]
        out.changes += [Change("ignored", n, "", t, path) for n, t in extra]
        return out
    if policy == "fail":
        if extra:
            out.ignored = [n for n, _ in extra]
            out.problem = (
                f"columns {out.ignored} are not in the registry (add them to the registry's columns, set "
                "schema_changes: evolve to follow the source, or drop them with schema_changes: ignore -- "
                "formerly on_extra_columns: ignore)"
            )
        return out
    # evolve
    unknown = [(n, t) for n, t in extra if hive_type_of(t) is None]
    if unknown:
        out.problem = "incompatible schema: new columns without a Hive type to add them as: " + "; ".join(
            f"column {n!r} is {t}" for n, t in unknown
        )
        out.problem += ". To go on: add them to the registry with a type Spark reads them as, or fix the file"
        return out
    misnamed = [(n, why) for n, _ in extra if (why := column_name_problem(n)) is not None]
    if misnamed:
        # Checked here, per file: a table column of that name could never be declared, and refusing the
        # file (quarantine, or the plan's error naming it) keeps the other files' compaction going.
        out.problem = "incompatible schema: new columns that cannot be table columns: " + "; ".join(
            f"column {n!r} {why}" for n, why in misnamed
        )
        out.problem += (
            ". To go on: have the source or the sink write it under a valid name (a rename transform), or set "
            "schema_changes: ignore to leave out columns the registry does not list"
        )
        return out
    gone = [n for n in out.missing if n.lower() not in dropped]
    if extra and gone:
        # A footer cannot tell a rename from a drop plus an add; guessing wrong would split a column's history.
        out.problem = (
            f"possible rename: column(s) {gone} are missing and {[n for n, _ in extra]} are new: a rename? "
            "Renames do not follow the source. To go on: if it is no rename, add the new column(s) to the "
            "registry's columns (the missing ones then read as NULL); if it is one, migrate the table by hand "
            f"({doc_ref('data', 'changing-a-schema')})"
        )
        return out
    out.changes += [Change("added", n, "", hive_type_of(t) or "", path) for n, t in extra]
    out.changes += [Change("dropped", n, dict(columns)[n], "", path) for n in gone]
    return out


def evolve(table: str, columns: list[Column], changes: list[Change]) -> tuple[list[Column], list[Change]]:
    """The columns after applying the files' ``added`` and ``widened`` changes, and the changes applied.

    Deterministic: changes are taken in the order given (the plan's file order); a column two
    files add with different types gets the type holding both, and one no type holds is refused.
    """
    from cdc_compaction.core.exceptions import SchemaChangeError

    orig = {c.name: c.type for c in columns}
    types = dict(orig)
    order = [c.name for c in columns]
    applied: dict[str, Change] = {}
    for ch in changes:
        if ch.change not in ("added", "widened"):
            continue
        have = types.get(ch.column)
        if have is None:
            types[ch.column] = ch.new
            order.append(ch.column)
            applied[ch.column] = ch
        elif have == ch.new or hive_widening(ch.new, have):
            continue  # this type fits in what is there already
        elif hive_widening(have, ch.new):
            types[ch.column] = ch.new
            if ch.column in orig:
                applied[ch.column] = Change("widened", ch.column, orig[ch.column], ch.new, ch.file)
            else:  # added by an earlier file of this plan, wider in a later one: added as the wider type
                applied[ch.column] = Change("added", ch.column, "", ch.new, applied[ch.column].file)
        else:
            raise SchemaChangeError(
                f"{table}: column {ch.column!r} is {have} in one landed file and {ch.new} in {ch.file}; no type "
                "holds both. To go on: put the column in the registry with the type it should have, or fix the file"
            )
    by_name = {c.name: c for c in columns}
    out = [
        by_name[n].model_copy(update={"type": types[n]}) if n in by_name else Column(name=n, type=types[n])
        for n in order
    ]
    return out, list(applied.values())


def state_path(cfg: TableConfig) -> str:
    from cdc_compaction.core.lake import Layout

    return posixpath.join(Layout.for_table(cfg).control, STATE_FILE)


def dropped_columns(cfg: TableConfig, storage: Any) -> frozenset[str]:
    """The columns (lower case) earlier runs recorded as dropped by the source."""
    return frozenset(c.lower() for c in (load_state(cfg, storage) or {}).get("dropped", []))


def load_state(cfg: TableConfig, storage: Any) -> dict[str, Any] | None:
    """The evolved schema kept in the lake, or None (nothing evolved yet)."""
    path = state_path(cfg)
    if not storage.exists(path):
        return None
    return json.loads(storage.read_text(path))


def save_state(
    cfg: TableConfig, storage: Any, columns: list[Column], entries: list[dict[str, Any]], plan_id: str
) -> None:
    """Record the evolved columns (and append the plan's change ``entries`` to their history) in the lake."""
    old = load_state(cfg, storage) or {"history": []}
    doc = {
        "columns": [{"name": c.name, "type": c.type} for c in columns],
        "dropped": sorted(set(old.get("dropped", [])) | {e["column"] for e in entries if e["change"] == "dropped"}),
        "history": [*old.get("history", []), *({**e, "plan_id": plan_id} for e in entries)],
    }
    storage.write_text(state_path(cfg), json.dumps(doc, indent=1, sort_keys=True))


def overlay(cfg: TableConfig, state: dict[str, Any] | None) -> TableConfig:
    """The registry ``cfg`` with the evolved columns of ``state`` laid over it.

    The registry's columns keep their order and comments; a type the source widened beyond the
    registry's is the source's; columns only the source has follow, in the order they came.
    A registry type wider than the evolved one wins (the owner widened it since).
    """

    if not state:
        return cfg
    evolved = {c["name"].lower(): c for c in state.get("columns", [])}
    cols: list[Column] = []
    for c in cfg.columns:
        e = evolved.pop(c.name.lower(), None)
        cols.append(c.model_copy(update={"type": e["type"]}) if e and hive_widening(c.type, e["type"]) else c)
    cols += [Column(name=e["name"], type=e["type"]) for e in evolved.values()]
    if cols == list(cfg.columns):
        return cfg
    return cfg.model_copy(update={"columns": cols})


def effective_config(cfg: TableConfig, storage: Any) -> TableConfig:
    """The registry ``cfg`` as the lake's evolved schema extends it (see :func:`overlay`)."""
    return overlay(cfg, load_state(cfg, storage))
