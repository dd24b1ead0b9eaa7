"""``mode: cdc``: change events of a keyed table, the latest event per key wins (the default mode).

The rule is ``../shared/conformance/README.md``; its SQL is ``include/sql/modes/cdc/_rule.sql.j2``,
applied by the Spark job (``cdc_compaction.job.compact``) and by every view.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import Field, field_validator

from cdc_compaction.core.lake import Commit
from cdc_compaction.core.mode import ColumnUse, TableContext, TableMode
from cdc_compaction.core.registry import (
    _TEXT_TYPES,
    EventTable,
    TableConfig,
    _check_ident_list,
    _check_op_and_order,
    _Strict,
)
from cdc_compaction.job.contract import FRESH_EXTRA_COLUMNS, FRESH_VIEW, PROVENANCE, UNCHANGED_PREFIX
from cdc_compaction.modes.base import nan_columns

#: Columns that hold a position in the source's log (Debezium's ``lsn`` of Postgres, ``__lsn`` when
#: ExtractNewRecordState adds it, MySQL's binlog ``pos``, SQL Server's ``change_lsn`` / ``commit_lsn``).
_LOG_POSITION = re.compile(r"^(?:__)?(?:source_)?(?:lsn|change_lsn|commit_lsn|pos|scn|commit_scn)$", re.IGNORECASE)
#: Columns that hold a time: Debezium's ``ts_ms`` (and ``__source_ts_ms`` …), or any timestamp.
_TIME_NAME = re.compile(r"(?:^|_)ts(?:_ms|_us|_ns)?$", re.IGNORECASE)


class Unchanged(_Strict):
    """Columns a change event may leave out (``mode: cdc``): the key's previous value is kept.

    Debezium cannot read a Postgres TOAST column that an update did not change and sends the
    placeholder ``__debezium_unavailable_value`` instead (``marker: placeholder``); some sources
    send NULL for a column they did not capture (``marker: "null"``: NULL then always means
    unchanged, so such a column cannot be set to NULL).
    """

    #: The columns an event may leave out.
    columns: list[str] = Field(min_length=1)
    #: How a left-out value is sent: the placeholder text, or NULL.
    marker: Literal["placeholder", "null"] = "placeholder"
    #: The placeholder text (Debezium's for an unavailable TOAST value).
    placeholder: str = "__debezium_unavailable_value"

    @field_validator("columns")
    @classmethod
    def _cols(cls, v: list[str]) -> list[str]:
        return _check_ident_list(v, "unchanged")

    @field_validator("placeholder")
    @classmethod
    def _placeholder(cls, v: str) -> str:
        if not v or len(v) > 256 or any(ch in v for ch in "\n\r\x00"):
            raise ValueError("the placeholder is one line of 1-256 characters")
        return v


class CdcTable(EventTable):
    """``mode: cdc``: change events of a keyed table; the latest event per key wins.

    The contract is ``../shared/conformance/README.md``: ordering columns, then increment, file
    and row break ties; a delete's winner is kept as a tombstone.
    """

    mode: Literal["cdc"] = "cdc"
    #: The key columns: the latest event per key wins.
    primary_key: list[str] = Field(min_length=1)
    #: Key columns that may be NULL (a unique key over nullable columns, Debezium's
    #: ``message.key.columns`` on a table without a primary key): NULL then equals NULL as a key value.
    nullable_key: list[str] = Field(default_factory=list)
    #: Columns a change event may leave out (partial rows): the key's previous value is kept.
    unchanged: Unchanged | None = None
    #: Columns holding the key before the change, one per primary_key column (seed 002's
    #: oldKeyValues, wal2json's oldkeys, Debezium's before-image of the key): an update whose old
    #: key differs retires the old key; a delete names the key it deletes there.
    old_key: list[str] = Field(default_factory=list)
    #: A column that marks a delete (Debezium's ``__deleted`` under ``delete.handling.mode=rewrite``):
    #: ``true`` makes the event a delete, whatever its op code says.
    deleted_column: str | None = None
    #: A NULL op: refused (``null_op``), or a full-load row (``read``: AWS DMS writes its full-load
    #: files without ``Op``); such a row may also have NULL ``order_by`` values: it orders before every event.
    missing_op: Literal["refuse", "read"] = "refuse"
    #: How an ``order_by`` column compares when not as its values: ``binlog_file`` compares a MySQL
    #: binlog file name by the number it ends in.
    order_as: dict[str, Literal["binlog_file"]] = Field(default_factory=dict)

    @field_validator("primary_key", "nullable_key", "old_key")
    @classmethod
    def _ident_list(cls, v: list[str], info: Any) -> list[str]:
        return _check_ident_list(v, str(info.field_name))

    def _check_mode(self, names: list[str], types: dict[str, str]) -> None:
        _check_op_and_order(names, types, self.op_column, self.order_by, self.primary_key)
        self._check_source(types)
        outside = [c for c in self.nullable_key if c not in self.primary_key]
        if outside:
            raise ValueError(f"nullable_key: {outside} are not primary_key columns {self.primary_key}")
        if self.old_key:
            if len(self.old_key) != len(self.primary_key):
                raise ValueError(
                    f"old_key: {self.old_key} must name one column per primary_key column {self.primary_key}, in order"
                )
            for old, key in zip(self.old_key, self.primary_key, strict=True):
                if old not in types:
                    raise ValueError(f"old_key: column {old!r} is not among the columns {names}")
                if old in self.primary_key or old in self.order_by or old == self.op_column:
                    raise ValueError(f"old_key: column {old!r} is a key, ordering or op column itself")
                if types[old] != types[key]:
                    raise ValueError(f"old_key: column {old!r} has type {types[old]} but {key!r} has {types[key]}")
        if self.deleted_column is not None:
            d = self.deleted_column
            if d not in types:
                raise ValueError(f"deleted_column: column {d!r} is not among the columns {names}")
            if d in self.primary_key or d in self.order_by or d == self.op_column or d in self.old_key:
                raise ValueError(f"deleted_column: column {d!r} is a key, ordering, op or old-key column itself")
            if types[d] not in ("string", "boolean"):
                raise ValueError(
                    f"deleted_column: column {d!r} has type {types[d]}; it needs string ('true') or boolean"
                )
        for c, how in self.order_as.items():
            if c not in self.order_by:
                raise ValueError(f"order_as: {c!r} is not an order_by column {self.order_by}")
            if types[c] not in _TEXT_TYPES and not types[c].startswith(_TEXT_TYPES):
                raise ValueError(f"order_as: {how} compares a text column, but {c!r} has type {types[c]}")
        if self.unchanged is not None:
            for c in self.unchanged.columns:
                if c not in types:
                    raise ValueError(f"unchanged: column {c!r} is not among the columns {names}")
                if c in self.primary_key or c in self.order_by or c == self.op_column:
                    raise ValueError(f"unchanged: column {c!r} is a key, ordering or op column: never left out")
                if self.unchanged.marker == "placeholder" and not types[c].startswith(_TEXT_TYPES):
                    raise ValueError(
                        f"unchanged: column {c!r} has type {types[c]}, which cannot hold the placeholder "
                        f"{self.unchanged.placeholder!r}; use marker: null for it, or list only text columns"
                    )

    @property
    def control_columns(self) -> list[str]:
        return [self.op_column, *self.old_key, *([self.deleted_column] if self.deleted_column else [])]

    @property
    def required_key(self) -> list[str]:
        """The key columns a change event must not leave NULL (the others are ``nullable_key``)."""
        return [c for c in self.primary_key if c not in self.nullable_key]

    @property
    def value_columns(self) -> list[str]:
        return [c.name for c in self.columns if c.name not in self.primary_key]


@dataclass(frozen=True)
class CdcContext(TableContext):
    """What the cdc templates see as ``t``."""

    primary_key: list[str]
    #: Key columns a change event must not leave NULL (primary_key less nullable_key).
    required_key: list[str]
    #: The key before the change, one column per primary_key column (registry ``old_key``); empty if none.
    old_key: list[str]
    #: (old key column, key column, may it be NULL) for each key column, when there is an old key.
    old_key_pairs: list[tuple[str, str, bool]]
    order_by: list[str]
    #: order_by columns of a floating-point type: NaN is refused there (Spark sorts it above +inf).
    nan_order_by: list[str]
    op_column: str
    op_codes: Any
    op_codes_all: list[str]
    #: Columns an event may leave out (registry ``unchanged``): their value is the key's previous one.
    unchanged_columns: list[str]
    #: How a left-out value arrives: ``placeholder`` (this text) or ``null``.
    unchanged_marker: str
    unchanged_placeholder: str
    #: Per left-out column, the hidden base columns remembering where its value came from
    #: (:func:`bookkeeping`): a row's value filled from an earlier event is re-filled when an event
    #: arriving later lies between that event and the row's own.
    unchanged_from: list[dict[str, Any]]
    #: (name, Hive type, comment) of those columns, as the base and tombstones tables declare them.
    mode_columns: list[tuple[str, str, str]]
    #: Source conventions (registry ``deleted_column``, ``missing_op``, ``order_as``; README, "Source presets").
    deleted_column: str | None = None
    deleted_is_boolean: bool = False
    missing_op: str = "refuse"
    order_as: Any = None


class CdcMode(TableMode):
    """The Airflow side of ``mode: cdc``."""

    name = "cdc"
    has_change_feed = True
    model = CdcTable
    summary = "keyed change events"

    @staticmethod
    def _cfg(cfg: TableConfig) -> CdcTable:
        return cast(CdcTable, cfg)

    def rule_context(self, cfg: TableConfig, fingerprint: str) -> CdcContext:
        c = self._cfg(cfg)
        codes = c.op_codes
        return CdcContext(
            **self.common_context(c, fingerprint),
            primary_key=list(c.primary_key),
            required_key=c.required_key,
            old_key=list(c.old_key),
            old_key_pairs=[(o, k, k in c.nullable_key) for o, k in zip(c.old_key, c.primary_key, strict=True)]
            if c.old_key
            else [],
            order_by=list(c.order_by),
            nan_order_by=nan_columns(c, list(c.order_by)),
            op_column=c.op_column,
            op_codes=codes,
            op_codes_all=[codes.create, codes.read, codes.update, codes.delete],
            unchanged_columns=list(c.unchanged.columns) if c.unchanged else [],
            unchanged_marker=c.unchanged.marker if c.unchanged else "placeholder",
            unchanged_placeholder=c.unchanged.placeholder if c.unchanged else "",
            unchanged_from=bookkeeping(c),
            mode_columns=[(n, t, why) for n, t, why in bookkeeping_columns(c)],
            deleted_column=c.deleted_column,
            deleted_is_boolean=c.deleted_column is not None
            and {col.name: col.type for col in c.columns}[c.deleted_column] == "boolean",
            missing_op=c.missing_op,
            order_as=dict(c.order_as),
        )

    def fingerprint_doc(self, cfg: TableConfig) -> dict[str, Any]:
        c = self._cfg(cfg)
        # The keys and values of the fingerprint before modes existed: a cdc table keeps its fingerprint.
        doc: dict[str, Any] = {
            "primary_key": c.primary_key,
            "order_by": c.order_by,
            "op_column": c.op_column,
            "op_codes": c.op_codes.model_dump(),
        }
        # Only when set, so that a table keeps the fingerprint it had before the option existed.
        if c.nullable_key:
            doc["nullable_key"] = c.nullable_key
        if c.unchanged is not None:
            doc["unchanged"] = c.unchanged.model_dump()
            # The base's hidden columns of left-out values: a table made before them gets them (and
            # views that read them) on its next run, as for any change of its fingerprint.
            doc["unchanged_bookkeeping"] = [n for n, _, _ in bookkeeping_columns(c)]
        if c.old_key:
            doc["old_key"] = c.old_key
        if c.deleted_column:
            doc["deleted_column"] = c.deleted_column
        if c.missing_op != "refuse":
            doc["missing_op"] = c.missing_op
        if c.order_as:
            doc["order_as"] = dict(sorted(c.order_as.items()))
        return doc

    def rule_sql(self, cfg: TableConfig) -> dict[str, str]:
        from cdc_compaction.core import sql

        m, t = self.macros(), sql.context(cfg)
        rule: dict[str, Any] = {
            "reject_reason": str(m.reject_reason(t)).strip(),
            "rank": str(m.rank(t)).strip(),
            "is_delete": str(m.is_delete(t)).strip(),
        }
        if t.old_key:
            # Key changes (registry old_key): the job keys its accepted events with the statement the
            # views apply to pending ones, over the temporary view it registers.
            extra = ", ".join(f"`{c}`" for c in FRESH_EXTRA_COLUMNS)
            rule["keyed_events"] = str(m.keyed_events(t, extra, f"`{FRESH_VIEW}`", "TRUE")).strip()
        # Partial rows: each left-out column's value as a window over the key's events (see _rule.sql.j2).
        for col, book in zip(t.unchanged_columns, t.unchanged_from, strict=True):
            rule[f"fill:{col}"] = str(m.filled(t, col)).strip()
            # Where the value came from, remembered in hidden columns (bookkeeping); the base row
            # read back as the event it was (its left-out value left out again), and the event
            # the value came from, replayed (see _rule.sql.j2).
            rule[f"{UNCHANGED_PREFIX}{col}"] = {
                "left": [book["left"], str(m.is_unchanged(t, col)).strip()],
                "book": {name: str(m.fill_from(t, col, part)).strip() for part, name in book["parts"]},
                "as_event": str(m.as_event(t, col)).strip(),
                "source_where": str(m.has_source(t, col)).strip(),
                "source": {o: str(m.source_value(t, col, o)).strip() for o in book["source_columns"]},
                **({"carried": str(m.carried(t, col)).strip()} if t.old_key else {}),
            }
        if t.unchanged_columns:
            # The hidden columns the job writes after the registry's (validate expects them there).
            rule["unchanged_columns"] = [[n, kind] for n, kind, _ in bookkeeping_columns(self._cfg(cfg))]
        return rule

    def output_columns(self, cfg: TableConfig) -> list[tuple[str, str]]:
        return [(n, t) for n, t, _ in bookkeeping_columns(self._cfg(cfg))]

    def plan_fields(self, cfg: TableConfig, parent: Commit) -> dict[str, Any]:
        c = self._cfg(cfg)
        return {"primary_key": list(c.primary_key), "order_by": list(c.order_by)}

    def count_problems(self, stats: Mapping[str, Any]) -> list[str]:
        problems = []
        if stats["duplicate_keys"]:
            problems.append(f"{stats['duplicate_keys']} keys appear more than once in the output (tombstones included)")
        if stats.get("misplaced_rows", 0):
            problems.append(
                f"{stats['misplaced_rows']} rows are on the wrong side: deletes among the visible rows or "
                "upserts among the tombstones"
            )
        # A key change (registry old_key) is ranked twice: the old key's retirement and the new key's upsert.
        retired = int(stats.get("retired_keys", 0))
        expected = (
            stats["base_rows"]
            + stats["increment_rows"]
            - stats["rejected_rows"]
            + retired
            - stats["superseded_rows"]
            - stats["expired_tombstones"]
        )
        if expected != stats["output_rows"]:
            problems.append(
                f"row counts do not reconcile: base {stats['base_rows']} + increments {stats['increment_rows']} "
                f"- rejected {stats['rejected_rows']} + retired old keys {retired} "
                f"- superseded {stats['superseded_rows']} "
                f"- expired tombstones {stats['expired_tombstones']} = {expected}, "
                f"but the output has {stats['output_rows']}"
            )
        return problems

    def warnings(self, cfg: TableConfig) -> list[str]:
        c = self._cfg(cfg)
        types = {col.name: col.type for col in c.columns}
        first = c.order_by[0]
        positions = [col.name for col in c.columns if _LOG_POSITION.match(col.name)]
        if positions and first not in positions and (_TIME_NAME.search(first) or types[first] == "timestamp"):
            return [
                f"{c.qualified_name}: order_by starts with {first!r}, a time, though the table has the log position "
                f"{positions[0]!r}. Debezium's initial snapshot stamps each row with the time it was read, later "
                "than changes committed while the snapshot ran, so a stale snapshot copy can win (a deleted row "
                f"stays, an old value comes back). Order by the log position: order_by: [{positions[0]}]"
            ]
        return []

    def column_roles(self, cfg: TableConfig) -> dict[str, list[str]]:
        c = self._cfg(cfg)
        roles: dict[str, list[str]] = {}
        for col in c.columns:
            role = []
            if col.name in c.primary_key:
                role.append("key, may be NULL" if col.name in c.nullable_key else "key")
            if col.name in c.order_by:
                role.append(f"order {c.order_by.index(col.name) + 1}")
            if col.name == c.op_column:
                role.append("op")
            if col.name in c.old_key:
                role.append(f"old key of {c.primary_key[c.old_key.index(col.name)]}")
            if c.unchanged is not None and col.name in c.unchanged.columns:
                role.append("may be left out")
            if col.name == c.deleted_column:
                role.append("delete marker")
            roles[col.name] = role
        return roles

    def lineage_influences(self, cfg: TableConfig) -> list[ColumnUse]:
        c = self._cfg(cfg)
        return [
            *(ColumnUse(k, "INDIRECT", "WINDOW", "events ranked per key") for k in c.primary_key),
            *(ColumnUse(k, "INDIRECT", "SORT", "the event order") for k in c.order_by),
            ColumnUse(c.op_column, "INDIRECT", "FILTER", "deletes remove rows"),
            *([ColumnUse(c.deleted_column, "INDIRECT", "FILTER", "delete marker")] if c.deleted_column else []),
            *(ColumnUse(k, "INDIRECT", "FILTER", "a key change deletes the old key") for k in c.old_key),
        ]

    def doc_lines(self, cfg: TableConfig) -> list[str]:
        c = self._cfg(cfg)
        codes = c.op_codes
        return [
            "* **Mode:** `cdc` (the latest event per key wins; a delete's winner is kept as a tombstone)",
            "* **Primary key:** "
            + ", ".join(f"`{k}`" + (" (may be NULL)" if k in c.nullable_key else "") for k in c.primary_key),
            "* **Event order:** "
            + ", ".join(f"`{k}`" + (f" (as a {c.order_as[k]})" if k in c.order_as else "") for k in c.order_by)
            + ", then increment, file, row position",
            f"* **Op codes:** create `{codes.create}`, read `{codes.read}`, "
            f"update `{codes.update}`, delete `{codes.delete}`"
            + (f" (source preset `{c.source}`)" if c.source != "generic" else ""),
            *([f"* **Deletes:** also rows whose `{c.deleted_column}` is true"] if c.deleted_column else []),
            *(
                ["* **Full-load rows:** a missing op is a read; such a row orders before every event"]
                if c.missing_op == "read"
                else []
            ),
            *(
                [
                    "* **Key changes:** an update whose "
                    + ", ".join(f"`{x}`" for x in c.old_key)
                    + " differ from the key deletes that old key; a delete with them set deletes that key"
                ]
                if c.old_key
                else []
            ),
            *(
                [
                    "* **Left-out values:** "
                    + ", ".join(f"`{x}`" for x in c.unchanged.columns)
                    + (
                        f" arrive as `{c.unchanged.placeholder}`"
                        if c.unchanged.marker == "placeholder"
                        else " arrive as NULL"
                    )
                    + " and keep the key's previous value"
                ]
                if c.unchanged
                else []
            ),
        ]


def bookkeeping(c: CdcTable) -> list[dict[str, Any]]:
    """Per left-out column (registry ``unchanged``): the hidden base columns saying where its value came from.

    ``left``: the row's own event left the column out, so its value was filled from an earlier
    event; ``parts``: (what the rule orders by, hidden column) for that event's place in the
    order (the ``order_by`` values, then increment, file and row: all NULL when no event ever
    carried a value). Named by the column's position among the registry's columns (a name
    may be up to 128 characters already). ``source_columns``: the columns of a replayed source event.
    """
    if c.unchanged is None:
        return []
    found = []
    for name in c.unchanged.columns:
        k = c.column_names.index(name) + 1
        parts = [(o, f"_cdc_from_{k}_o{j}") for j, o in enumerate(c.order_by, 1)]
        parts += [(p, f"_cdc_from_{k}_{p.removeprefix('_cdc_')}") for p in PROVENANCE]
        found.append(
            {
                "column": name,
                "left": f"_cdc_left_{k}",
                "parts": parts,
                "source_columns": [*c.order_by, *PROVENANCE, *c.unchanged.columns, c.op_column],
            }
        )
    return found


def bookkeeping_columns(c: CdcTable) -> list[tuple[str, str, str]]:
    """(name, Hive type, comment) of :func:`bookkeeping`'s hidden columns, in the order the job writes them."""
    types = {col.name: col.type for col in c.columns}
    types |= {"_cdc_increment": "string", "_cdc_file": "string", "_cdc_pos": "bigint"}
    cols = []
    for book in bookkeeping(c):
        col = book["column"]
        cols.append((book["left"], "boolean", f"true: the event left {col} out; its value is an earlier event's"))
        cols += [(name, types[part], f"{part} of the event {col} was last set by") for part, name in book["parts"]]
    return cols


#: This module's mode (found by :func:`cdc_compaction.core.mode.table_modes`).
MODE = CdcMode()
