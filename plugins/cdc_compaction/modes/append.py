"""``mode: append``: an insert-only event or log table; every event becomes one row, once.

The contract is ``tests/scenarios/README.md`` ("The append mode"); the rule is
``include/sql/modes/append/_rule.sql.j2``, applied by the job (``cdc_compaction.job.modes.append``)
and by every view. An event is known by its event id (registry ``event_id``): one whose id the table
holds already (``replayed``) or that repeats an earlier pending copy (``superseded``) is not appended
again, and both are counted. A version's ``data/`` holds every row with its provenance (increment,
file, row) and when it was compacted; its ``tombstones/`` is empty: nothing is ever deleted.

The registry class, :class:`~cdc_compaction.registry.AppendTable`, lives in ``registry.py``: the
table union there cannot import this package, which imports ``registry``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from cdc_compaction.lake import Commit
from cdc_compaction.modes.base import TableContext, TableMode
from cdc_compaction.registry import AppendTable, TableConfig

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
        from cdc_compaction import sql

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
