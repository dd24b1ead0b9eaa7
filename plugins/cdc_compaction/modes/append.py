"""``mode: append``: an insert-only event or log table; every event becomes one row, once.

The contract is ``tests/scenarios/append/README.md``; the rule is
``include/sql/modes/append/_rule.sql.j2``, applied by the job (``cdc_compaction.job.modes.append``)
and by every view. An event is known by its event id (registry ``event_id``): one whose id the table
holds already (``replayed``) or that repeats an earlier pending copy (``superseded``) is not appended
again, and both are counted. A version's ``data/`` holds every row with its provenance (increment,
file, row) and when it was compacted; its ``tombstones/`` is empty: nothing is ever deleted.

Everything of the mode is here, in its job module and in its templates: the registry finds this
module's ``MODE`` (:func:`cdc_compaction.core.mode.table_modes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import Field, field_validator

from cdc_compaction.core.lake import Commit
from cdc_compaction.core.mode import ColumnUse, TableContext, TableMode
from cdc_compaction.core.registry import OpCodes, TableConfig, _check_ident_list, check_identifier

#: Types an append table's event_id may not have: no stable equality (NaN, rounding) or no grouping.
_APPEND_EVENT_ID_REFUSED = ("float", "double", "binary")


class AppendTable(TableConfig):
    """``mode: append``: an insert-only event or log table; every event becomes one row, once.

    Re-deliveries are recognised by the event id (``event_id``): an event whose id is already in the
    table, or repeated among the pending increments, is kept once (the first copy compacted) and
    counted. No tombstones, no deletes; an op column is optional, and when declared only its insert
    codes are taken (the contract: ``tests/scenarios/append/README.md``).
    """

    mode: Literal["append"]
    #: The columns identifying one event (a message id, a Kafka topic/partition/offset, a log line's
    #: file and offset): equal values are one event delivered again. Never NULL (a NULL id is refused).
    event_id: list[str] = Field(min_length=1)
    #: The op column, if the source sends one: only its create and read codes are taken, an update or
    #: delete is refused (an append table has no row to change). Unset: every event is an insert.
    op_column: str | None = None
    #: The op column's codes (Debezium's c r u d by default).
    op_codes: OpCodes = Field(default_factory=OpCodes)

    @field_validator("event_id")
    @classmethod
    def _append_event_id(cls, v: list[str], info: Any) -> list[str]:
        return _check_ident_list(v, str(info.field_name))

    @field_validator("op_column")
    @classmethod
    def _append_op(cls, v: str | None, info: Any) -> str | None:
        return v if v is None else check_identifier(v, info.field_name)

    def _check_mode(self, names: list[str], types: dict[str, str]) -> None:
        where = f"append table {self.database}.{self.table}"
        missing = [c for c in self.event_id if c not in types]
        if missing:
            raise ValueError(f"event_id: {missing} not among the columns {names} ({where})")
        for c in self.event_id:
            kind = types[c]
            if kind in _APPEND_EVENT_ID_REFUSED or kind.startswith(("array", "map", "struct")):
                raise ValueError(
                    f"event_id: column {c!r} has type {kind}, which cannot identify an event ({where}); "
                    "use integer, string, decimal, date or timestamp columns"
                )
        if self.op_column is not None:
            if self.op_column not in types:
                raise ValueError(f"op_column: {self.op_column!r} is not among the columns {names} ({where})")
            if self.op_column in self.event_id:
                raise ValueError(f"op_column: {self.op_column!r} must not be part of event_id ({where})")
            if types[self.op_column] != "string":
                raise ValueError(f"op_column: column {self.op_column!r} must have type string ({where})")
        if self.partition_by is not None:
            raise ValueError(f"partition_by: append tables are not partitioned (yet); remove partition_by ({where})")
        if self.change_feed:
            # Every commit only adds rows, each once: its change would be its appended rows, all inserts.
            raise ValueError(
                f"change_feed: an append table has no change feed ({where}): a commit only appends events, so "
                "its change is the rows it appended (the commit record counts them, appended_rows). Remove "
                "change_feed, or read <t>_base's rows by _cdc_ingested_at"
            )

    @property
    def control_columns(self) -> list[str]:
        return [self.op_column] if self.op_column else []


#: The temporary views the job registers, and so the relations its rule is rendered over (the views
#: render the same macros over the metastore's tables). They travel in the plan's rule, under
#: ``relation:<name>``, so that the job, which imports nothing of this side, registers the same names.
RELATIONS: dict[str, str] = {
    "base": "`_cdc_append_base`",
    "events": "`_cdc_append_events`",
    "fates": "`_cdc_append_fates`",
}
#: The statements of the rule in a plan, rendered from ``include/sql/modes/append/_rule.sql.j2``.
RULE_KEYS = ("reject_reason", "event_fates", "event_counts", "appended")
RELATION_PREFIX = "relation:"


@dataclass(frozen=True)
class AppendContext(TableContext):
    """What the append templates see as ``t``."""

    #: The columns identifying one event.
    event_id: list[str]
    #: The op column, or None: every event is an insert.
    op_column: str | None
    op_codes: Any


class AppendMode(TableMode):
    """The Airflow side of ``mode: append``."""

    name = "append"
    model = AppendTable
    summary = "insert-only events, each once by its event id"

    @staticmethod
    def _cfg(cfg: TableConfig) -> AppendTable:
        return cast(AppendTable, cfg)

    def rule_context(self, cfg: TableConfig, fingerprint: str) -> AppendContext:
        c = self._cfg(cfg)
        return AppendContext(
            **self.common_context(c, fingerprint),
            event_id=list(c.event_id),
            op_column=c.op_column,
            op_codes=c.op_codes,
        )

    def fingerprint_doc(self, cfg: TableConfig) -> dict[str, Any]:
        c = self._cfg(cfg)
        doc: dict[str, Any] = {"event_id": c.event_id}
        if c.op_column is not None:
            doc["op_column"] = c.op_column
            doc["op_codes"] = c.op_codes.model_dump()
        return doc

    def rule_sql(self, cfg: TableConfig) -> dict[str, str]:
        from cdc_compaction.core import sql

        m, t, r = self.macros(), sql.context(cfg), RELATIONS
        return {
            "reject_reason": str(m.reject_reason(t)).strip(),
            "event_fates": str(m.event_fates(t, r["events"], r["base"])).strip(),
            "event_counts": str(m.event_counts(t, r["fates"])).strip(),
            "appended": str(m.appended(t, r["fates"])).strip(),
            # The event id, for the job's own check that no id is written twice.
            "event_id": ",".join(self._cfg(cfg).event_id),
            **{f"{RELATION_PREFIX}{k}": v for k, v in r.items()},
        }

    def plan_fields(self, cfg: TableConfig, parent: Commit) -> dict[str, Any]:
        # No key and no order: the event id (in the rule) is what the job dedupes by.
        return {"primary_key": []}

    def count_problems(self, stats: Mapping[str, Any]) -> list[str]:
        problems = []
        valid = stats["increment_rows"] - stats["rejected_rows"]
        fated = stats["replayed_rows"] + stats["superseded_rows"] + stats["appended_rows"]
        if fated != valid:
            problems.append(
                f"event counts do not reconcile: {valid} valid events, but replayed {stats['replayed_rows']} "
                f"+ superseded {stats['superseded_rows']} + appended {stats['appended_rows']} = {fated}"
            )
        rows = stats["base_rows"] + stats["appended_rows"]
        if rows != stats["output_visible_rows"]:
            problems.append(
                f"row counts do not reconcile: base {stats['base_rows']} + appended {stats['appended_rows']} = {rows}, "
                f"but the output has {stats['output_visible_rows']} rows"
            )
        if stats["output_tombstones"] != 0:
            problems.append(f"the output holds {stats['output_tombstones']} tombstones; an append table has none")
        if stats["duplicate_keys"] != 0:
            problems.append(f"{stats['duplicate_keys']} event ids occur more than once in the output")
        return problems

    def lineage_influences(self, cfg: TableConfig) -> list[ColumnUse]:
        c = cast(AppendTable, cfg)
        return [
            *(ColumnUse(k, "INDIRECT", "WINDOW", "re-deliveries of one event id are kept once") for k in c.event_id),
            *([ColumnUse(c.op_column, "INDIRECT", "FILTER", "only inserts are taken")] if c.op_column else []),
        ]

    def column_roles(self, cfg: TableConfig) -> dict[str, list[str]]:
        c = self._cfg(cfg)
        roles: dict[str, list[str]] = {col.name: [] for col in c.columns}
        for i, col in enumerate(c.event_id, 1):
            roles[col].append(f"event id {i}")
        if c.op_column is not None:
            roles[c.op_column].append("op")
        return roles

    def doc_lines(self, cfg: TableConfig) -> list[str]:
        c = self._cfg(cfg)
        codes = c.op_codes
        ops = (
            f"* **Op codes:** create `{codes.create}` and read `{codes.read}` are appended; update `{codes.update}` "
            f"and delete `{codes.delete}` are refused (`{c.op_column}`)"
            if c.op_column
            else "* **Op codes:** none (every event is an insert)"
        )
        return [
            "* **Mode:** `append` (insert-only: every event becomes a row; no updates, deletes or tombstones)",
            "* **Event id:** "
            + ", ".join(f"`{k}`" for k in c.event_id)
            + " (an id already compacted, or repeated among the pending increments, is kept once: the first "
            "copy by increment, file, row; the others are counted as replayed or superseded)",
            ops,
        ]


#: This module's mode (found by :func:`cdc_compaction.core.mode.table_modes`).
MODE = AppendMode()
