"""``mode: keyless``: change events of a table without a key; its rows are a multiset.

The contract is ``tests/scenarios/README.md`` ("The keyless mode"); the rule is
``include/sql/modes/keyless/_rule.sql.j2``, applied by the job (``cdc_compaction.job.modes.keyless``)
and by every view. A version's ``data/`` holds the copies (the data columns; the op, sequence and
before-image columns are empty there), its ``tombstones/`` one row: the watermark, the greatest
delivery position (``order_by`` then ``event_id``) applied so far, which the next compaction and
the views read to recognise replays. The rule and the job see the position as their ``order_by``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from cdc_compaction.job.contract import KEYLESS_RELATIONS, TOMBSTONES_DIR
from cdc_compaction.lake import Commit
from cdc_compaction.modes.base import ColumnUse, TableContext, TableMode, nan_columns
from cdc_compaction.registry import KeylessTable, TableConfig


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
        from cdc_compaction import sql

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
