"""``mode: keyless``: change events of a table without a key; its rows are a multiset.

The contract is ``tests/scenarios/README.md`` ("The keyless mode"); the rule is
``include/sql/modes/keyless/_rule.sql.j2``, applied by the job (``cdc_compaction.job.modes.keyless``)
and by every view. A version's ``data/`` holds the copies (the data columns; the op, sequence and
before-image columns are empty there), its ``tombstones/`` one row: the watermark, the greatest
delivery position (``order_by`` then ``event_id``) applied so far, which the next compaction and
the views read to recognise replays. The rule and the job see the position as their ``order_by``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import Field, field_validator

from cdc_compaction.core.identifiers import RESERVED_PREFIX
from cdc_compaction.core.lake import Commit
from cdc_compaction.core.mode import ColumnUse, TableContext, TableMode
from cdc_compaction.core.registry import (
    EventTable,
    TableConfig,
    _check_ident_list,
    _check_op_and_order,
)
from cdc_compaction.job.contract import KEYLESS_RELATIONS, TOMBSTONES_DIR
from cdc_compaction.modes.base import nan_columns

#: Per preset, for ``mode: keyless``: (the columns a delivery position needs one of, the change-LSN
#: column that is no delivery position, the column telling apart the snapshot rows sharing one LSN).
#: README of tests/scenarios, "What each source must provide".
_KEYLESS_SOURCE_NEEDS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "debezium": (("__commit_lsn", "__kafka_offset"), "__lsn", "__row"),
    "wal2json": (("commit_lsn",), "lsn", "lsn_row"),
}


class KeylessTable(EventTable):
    """``mode: keyless``: change events of a table without a key; its rows are a multiset.

    Inserts add a copy of the row, updates and deletes carry the full before-image (columns
    ``<before_prefix><column>``) and change exactly one copy equal to it. ``order_by`` is the
    source log's sequence: events apply in its order, and events at or below the last commit's
    watermark are replays (docs/concepts.md#table-modes).
    """

    mode: Literal["keyless"]
    #: Prefix of the columns holding a row's values before an update or delete.
    before_prefix: str = "_before_"
    #: Columns telling apart the events that share one ``order_by`` value (the change LSN and the row
    #: ordinal among a snapshot's rows, which share one LSN), compared after ``order_by`` and rising in
    #: delivery order among them. ``order_by`` + ``event_id`` identify one event: equal values are one
    #: event delivered again. Empty: ``order_by`` alone is unique per event. Source presets fill it in.
    event_id: list[str] = Field(default_factory=list)

    @field_validator("event_id")
    @classmethod
    def _event_id(cls, v: list[str], info: Any) -> list[str]:
        return _check_ident_list(v, str(info.field_name))

    @property
    def ordering_columns(self) -> list[str]:
        return self.position

    @property
    def position(self) -> list[str]:
        """``order_by`` then ``event_id``: an event's identity and its delivery position, compared left to right."""
        return [*self.order_by, *self.event_id]

    def _check_keyless_source(self) -> None:
        """Refuse a preset's ordering that would lose rows: a change LSN as delivery order, or no snapshot ordinal."""
        needs = _KEYLESS_SOURCE_NEEDS.get(self.source)
        if needs is None:
            return  # generic and dms: order_by + event_id are the entry's promise (unique, in delivery order)
        delivery, change_lsn, ordinal = needs
        where = f"keyless table {self.database}.{self.table} (source: {self.source})"
        if self.order_by[0] == change_lsn:
            raise ValueError(
                f"order_by: {self.order_by} starts with {change_lsn!r}, each change's own LSN, but PostgreSQL "
                f"delivers changes in commit order: a transaction committed after a compaction would have its "
                f"changes dropped as replays ({where}). Land the transaction's commit position as "
                f"{' or '.join(repr(c) for c in delivery)} and order by it, with event_id: [{change_lsn}, {ordinal}]"
            )
        if ordinal not in self.position and "__kafka_offset" not in self.position:
            raise ValueError(
                f"event_id: {self.event_id} has no {ordinal!r}, but {self.source} stamps every snapshot row with one "
                f"LSN: the snapshot's rows would be taken for one row delivered again ({where}). Land each event's "
                f"ordinal among the events at its LSN as {ordinal!r} (the snapshot's row number, 0 for a change) and "
                f"add it to event_id"
            )

    @field_validator("before_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$", v):
            raise ValueError(f"{v!r} must be 1-32 letters, digits or '_', not starting with a digit")
        if v.lower().startswith(RESERVED_PREFIX):
            raise ValueError(f"must not start with {RESERVED_PREFIX!r} (reserved for the package)")
        return v

    def _check_mode(self, names: list[str], types: dict[str, str]) -> None:
        missing = [c for c in self.event_id if c not in types]
        if missing:
            raise ValueError(f"event_id: {missing} not among the columns {names}")
        _check_op_and_order(names, types, self.op_column, self.position, [])
        self._check_source(types)
        both = [c for c in self.event_id if c in self.order_by]
        if both or len(set(self.event_id)) != len(self.event_id):
            raise ValueError(f"event_id: {self.event_id} repeats a column or an order_by column {self.order_by}")
        self._check_keyless_source()
        if self.partition_by is not None:
            raise ValueError("partition_by: keyless tables are not partitioned (yet); remove partition_by")
        data = self.data_columns
        if not data:
            raise ValueError(f"columns: a keyless table needs data columns besides {self.control_columns}")
        lower = {n.lower(): n for n in names}
        for col in data:
            before = f"{self.before_prefix}{col}"
            found = lower.get(before.lower())
            if found is None:
                raise ValueError(
                    f"columns: {col!r} has no before-image column {before!r} (updates and deletes of a keyless "
                    "table carry the whole old row; name the columns with before_prefix). If it describes the "
                    "event rather than the row (a commit time, an LSN), declare it as event_time or put it in "
                    "order_by or event_id"
                )
            if types[found] != types[col]:
                raise ValueError(f"columns: {found!r} has type {types[found]} but {col!r} has {types[col]}")

    @property
    def before_columns(self) -> list[str]:
        """The before-image column of each data column, in the data columns' order."""
        by_lower = {c.name.lower(): c.name for c in self.columns}
        return [by_lower[f"{self.before_prefix}{c}".lower()] for c in self.data_columns]

    @property
    def data_columns(self) -> list[str]:
        """The row's own columns: what the table holds (no op, sequence, event time or before-image columns)."""
        skip = {self.op_column.lower(), *(c.lower() for c in self.position)}
        if self.event_time is not None:
            skip.add(self.event_time.column.lower())
        prefix = self.before_prefix.lower()
        return [c.name for c in self.columns if c.name.lower() not in skip and not c.name.lower().startswith(prefix)]

    @property
    def control_columns(self) -> list[str]:
        prefix = self.before_prefix.lower()
        return [self.op_column, *(c.name for c in self.columns if c.name.lower().startswith(prefix))]


@dataclass(frozen=True)
class KeylessContext(TableContext):
    """What the keyless templates see as ``t``."""

    #: The row's own columns: what the table holds.
    data_columns: list[str]
    #: The before-image column of each data column, aligned with data_columns.
    before_columns: list[str]
    #: The delivery position: the registry's order_by, then its event_id (the event's identity).
    order_by: list[str]
    #: The event_id columns among them (refused with their own reason when NULL).
    event_id: list[str]
    nan_order_by: list[str]
    op_column: str
    op_codes: Any
    op_codes_all: list[str]


class KeylessMode(TableMode):
    """The Airflow side of ``mode: keyless``."""

    name = "keyless"
    has_change_feed = True
    model = KeylessTable
    summary = "change events without a key"

    @staticmethod
    def _cfg(cfg: TableConfig) -> KeylessTable:
        return cast(KeylessTable, cfg)

    def rule_context(self, cfg: TableConfig, fingerprint: str) -> KeylessContext:
        c = self._cfg(cfg)
        codes = c.op_codes
        return KeylessContext(
            **self.common_context(c, fingerprint),
            data_columns=c.data_columns,
            before_columns=c.before_columns,
            order_by=c.position,
            event_id=list(c.event_id),
            nan_order_by=nan_columns(c, c.position),
            op_column=c.op_column,
            op_codes=codes,
            op_codes_all=[codes.create, codes.read, codes.update, codes.delete],
        )

    def feed_key(self, cfg: TableConfig) -> list[str] | None:
        return None  # a multiset: copies have no identity to pair them by

    def feed_columns(self, cfg: TableConfig) -> list[str]:
        return list(self._cfg(cfg).data_columns)

    def fingerprint_doc(self, cfg: TableConfig) -> dict[str, Any]:
        c = self._cfg(cfg)
        doc = {
            "order_by": c.order_by,
            "op_column": c.op_column,
            "op_codes": c.op_codes.model_dump(),
            "before_prefix": c.before_prefix,
        }
        if c.event_id:  # only then: the rule of a table without event_id is unchanged, so is its fingerprint
            doc["event_id"] = c.event_id
        return doc

    def rule_sql(self, cfg: TableConfig) -> dict[str, str]:
        from cdc_compaction.core import sql

        m, t, r = self.macros(), sql.context(cfg), KEYLESS_RELATIONS
        # Rendered over the temporary views the job registers (job.modes.keyless), as the views
        # render the same macros over the metastore's tables.
        return {
            "reject_reason": str(m.reject_reason(t)).strip(),
            "event_fates": str(m.event_fates(t, r["events"], r["watermark"])).strip(),
            "event_counts": str(m.event_counts(t, r["fates"])).strip(),
            "new_watermark": str(m.new_watermark(t, r["fates"])).strip(),
            "value_counts": str(m.value_counts(t, r["base"], r["fates"])).strip(),
            "copies": str(m.copies(t, r["counts"])).strip(),
        }

    def plan_fields(self, cfg: TableConfig, parent: Commit) -> dict[str, Any]:
        c = self._cfg(cfg)
        return {
            # No key: the contract's primary_key is empty for a keyless plan.
            "primary_key": [],
            # The job orders, dedupes and keeps its watermark by the whole delivery position.
            "order_by": c.position,
            "data_columns": c.data_columns,
            "before_columns": c.before_columns,
        }

    def count_problems(self, stats: Mapping[str, Any]) -> list[str]:
        problems = []
        valid = stats["increment_rows"] - stats["rejected_rows"]
        fated = stats["replayed_rows"] + stats["superseded_rows"] + stats["applied_rows"]
        if fated != valid:
            problems.append(
                f"event counts do not reconcile: {valid} valid events, but replayed {stats['replayed_rows']} "
                f"+ superseded {stats['superseded_rows']} + applied {stats['applied_rows']} = {fated}"
            )
        copies = stats["base_copies"] + stats["additions"] - stats["removals"] + stats["unmatched_removals"]
        if copies != stats["output_visible_rows"]:
            problems.append(
                f"row counts do not reconcile: base {stats['base_copies']} + additions {stats['additions']} "
                f"- removals {stats['removals']} + unmatched removals {stats['unmatched_removals']} = {copies}, "
                f"but the output has {stats['output_visible_rows']} rows"
            )
        if stats["base_rows"] != stats["base_copies"] + stats["base_watermarks"]:
            problems.append(
                f"the job read {stats['base_rows']} base rows but counted {stats['base_copies']} copies and "
                f"{stats['base_watermarks']} watermark rows"
            )
        want_watermark = 0 if stats.get("new_watermark") is None else 1
        if stats["output_tombstones"] != want_watermark:
            problems.append(
                f"the output holds {stats['output_tombstones']} watermark rows, expected {want_watermark} "
                f"(new watermark {stats.get('new_watermark')})"
            )
        return problems

    def column_roles(self, cfg: TableConfig) -> dict[str, list[str]]:
        c = self._cfg(cfg)
        roles: dict[str, list[str]] = {col.name: [] for col in c.columns}
        for i, col in enumerate(c.order_by, 1):
            roles[col].append(f"order {i}")
        for i, col in enumerate(c.event_id, 1):
            roles[col].append(f"event id {i}")
        roles[c.op_column].append("op")
        for data, before in zip(c.data_columns, c.before_columns, strict=True):
            roles[data].append("row")
            roles[before].append(f"before-image of {data}")
        return roles

    def lineage_influences(self, cfg: TableConfig) -> list[ColumnUse]:
        c = self._cfg(cfg)
        return [
            *(ColumnUse(k, "INDIRECT", "SORT", "the event order and identity") for k in c.position),
            ColumnUse(c.op_column, "INDIRECT", "FILTER", "deletes remove rows"),
            *(
                ColumnUse(b, "INDIRECT", "FILTER", "an update or delete removes one copy equal to its before-image")
                for b in c.before_columns
            ),
        ]

    def doc_lines(self, cfg: TableConfig) -> list[str]:
        c = self._cfg(cfg)
        codes = c.op_codes
        return [
            "* **Mode:** `keyless` (no key: rows are a multiset; an update or delete changes one copy equal "
            "to its before-image)",
            "* **Rows:** " + ", ".join(f"`{x}`" for x in c.data_columns),
            "* **Log order:** "
            + ", ".join(f"`{k}`" for k in c.order_by)
            + (", event id " + ", ".join(f"`{k}`" for k in c.event_id) if c.event_id else "")
            + ", then increment, file, row position; events at or below the last commit's watermark are replays, "
            "events of one position are one event delivered again",
            f"* **Op codes:** create `{codes.create}`, read `{codes.read}`, "
            f"update `{codes.update}`, delete `{codes.delete}`",
        ]

    def erase_images(self, cfg: TableConfig) -> dict[str, str]:
        c = self._cfg(cfg)
        return dict(zip(c.data_columns, c.before_columns, strict=True))

    def erase_keeps(self, cfg: TableConfig) -> tuple[str, ...]:
        # A version's tombstones file holds one row: the watermark (the greatest position applied).
        # Erasing it would let the next compaction apply replays again.
        return (TOMBSTONES_DIR,)

    def view_columns(self, cfg: TableConfig) -> list[tuple[str, str]]:
        c = self._cfg(cfg)
        types = {col.name: col.type for col in c.columns}
        return [(name, types[name]) for name in c.data_columns]


#: This module's mode (found by :func:`cdc_compaction.core.mode.table_modes`).
MODE = KeylessMode()
