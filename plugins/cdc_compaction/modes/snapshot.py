"""``mode: snapshot``: every increment is one export of the table; comparing exports finds the changes.

The contract is ``tests/scenarios/snapshot/README.md``; the rule is
``include/sql/modes/snapshot/_rule.sql.j2`` (hashes, refusals, each key's operation), applied by
the job (``cdc_compaction.job.modes.snapshot``). A version's ``data/`` is the current table (every
key's latest row with its ``operation`` and ``eff_start_date``: the base table), and every
business date it applied gets a history partition, ``history/eff_start_date=<date>/``, which the
commit records (``outputs.history``; records from before ``outputs``: top-level ``history``) and
``<t>_history`` registers: the mode's extra table (:meth:`SnapshotMode.extra_tables`). There is no
view over pending snapshots yet: ``<t>_view`` shows the current table as published.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any, Literal, cast

from pydantic import Field, field_validator

from cdc_compaction.core.exceptions import PublishValidationError
from cdc_compaction.core.lake import Commit
from cdc_compaction.core.landing import increment_hour
from cdc_compaction.core.mode import ColumnUse, ExtraTable, OutputDir, TableContext, TableMode
from cdc_compaction.core.registry import (
    TableConfig,
    _check_ident_list,
    _Strict,
    check_identifier,
)
from cdc_compaction.job.contract import (
    EFF_START_DATE_COLUMN,
    HISTORY_DIR,
    HISTORY_DIR_PREFIX,
    META_COLUMNS,
    OPERATION_COLUMN,
    SNAPSHOT_COLUMNS,
)

#: The keys of each applied snapshot's counts: inserted, updated, no change, deleted, not supplied.
OPERATIONS = ("I", "U", "N", "D", "X")

_COMMENTS = {
    OPERATION_COLUMN: "the key's operation in the last applied snapshot: I, U, N or X",
    EFF_START_DATE_COLUMN: "business date the row's values start at",
    "_cdc_key_hash": "SHA-256 of the key columns (the comparison joins on it)",
    "_cdc_row_hash": "SHA-256 of the compared columns (equal: no change)",
}


class BusinessDate(_Strict):
    """Where a snapshot's business date comes from when not from its increment's name (``mode: snapshot``)."""

    #: The date column holding an export's business date.
    column: str

    @field_validator("column")
    @classmethod
    def _column(cls, v: str) -> str:
        return check_identifier(v, "business_date column")


#: The columns a snapshot table's outputs add after the registry's (job.contract.SNAPSHOT_COLUMNS):
#: a registry column of that name would clash with them.
_SNAPSHOT_OUTPUT_COLUMNS = ("operation", "eff_start_date")


class SnapshotTable(TableConfig):
    """``mode: snapshot``: every increment is one export of the table (or of its changed rows).

    Comparing each export with the current table by hashes finds each key's operation (I, U, N,
    D, X); the outputs are the current table and a history of net changes, one partition per
    business date (the contract: ``tests/scenarios/snapshot/README.md``). No ``order_by``, no op
    column: exports apply in the order of their business dates.
    """

    mode: Literal["snapshot"]
    #: The key columns the exports are compared by.
    primary_key: list[str] = Field(min_length=1)
    #: False: every increment is a full export (a key it lacks is deleted). True: the changed rows only.
    delta: bool = False
    #: None: the business date of an increment is the UTC date of its name's hour.
    business_date: BusinessDate | None = None

    @field_validator("primary_key")
    @classmethod
    def _key(cls, v: list[str], info: Any) -> list[str]:
        return _check_ident_list(v, str(info.field_name))

    def _check_mode(self, names: list[str], types: dict[str, str]) -> None:
        lower = {n.lower(): n for n in names}
        for own in _SNAPSHOT_OUTPUT_COLUMNS:
            if own in lower:
                raise ValueError(
                    f"columns: {lower[own]!r} is reserved for the package: a snapshot table's outputs add the "
                    f"columns {list(_SNAPSHOT_OUTPUT_COLUMNS)}; rename the column"
                )
        missing = [c for c in self.primary_key if c not in types]
        if missing:
            raise ValueError(f"primary_key: {missing} not among the columns {names}")
        if self.partition_by is not None:
            raise ValueError("partition_by: snapshot tables are not partitioned (yet); remove partition_by")
        if self.compaction.policy != "always":
            raise ValueError(
                "compaction.policy: a snapshot table compacts every export (its history is made by the "
                "compaction); remove compaction or set policy: always"
            )
        if self.business_date is not None:
            col = self.business_date.column
            if col not in types:
                raise ValueError(f"business_date: column {col!r} is not among the columns {names}")
            if types[col] != "date":
                raise ValueError(f"business_date: column {col!r} has type {types[col]}; it must have type date")
            if col in self.primary_key:
                raise ValueError(
                    f"business_date: column {col!r} is a primary_key column; the business date is not part of a key"
                )

    @property
    def business_date_column(self) -> str | None:
        return self.business_date.column if self.business_date is not None else None

    @property
    def value_columns(self) -> list[str]:
        """The compared columns, in registry order: neither key columns nor the business-date column."""
        skip = {*self.primary_key, *([self.business_date_column] if self.business_date_column else [])}
        return [c.name for c in self.columns if c.name not in skip]


@dataclass(frozen=True)
class SnapshotContext(TableContext):
    """What the snapshot templates see as ``t`` (the rule's attributes are documented in its header)."""

    primary_key: list[str]
    #: The compared columns: neither key columns nor the business-date column.
    value_columns: list[str]
    column_types: dict[str, str]
    delta: bool
    business_date_column: str | None
    #: (name, Hive type, comment) of the columns the outputs add after the registry's (the DDL's column list).
    mode_columns: list[tuple[str, str, str]]
    #: ``<t>_history``: the net changes, one partition per business date.
    history_table: str
    #: The rule's reject reason reads the key hash: the pending-rejects query computes it first.
    hash_key_for_rejects: bool = True


def history_table(cfg: TableConfig) -> str:
    """The name of a snapshot table's history table, ``<t>_history``."""
    return f"{cfg.table}_history"


#: The key of the commit's outputs (``Commit.outputs``) holding the history partitions.
HISTORY_KEY = "history"
#: The types of the metadata columns every output file ends with (``include/sql/modes/snapshot/create_history.sql.j2``).
_META_TYPES = {"_cdc_increment": "string", "_cdc_file": "string", "_cdc_pos": "bigint", "_cdc_ingested_at": "timestamp"}


def history_of(commit: Commit) -> dict[str, str]:
    """Every history partition a commit names, {business date: location} (empty before the first)."""
    return dict((commit.outputs or {}).get(HISTORY_KEY) or {})


def last_applied(parent: Commit) -> str | None:
    """The greatest business date applied so far (ISO): the parent commit's greatest history partition."""
    return max(history_of(parent), default=None)


def next_history(parent: Commit, stats: Mapping[str, Any]) -> dict[str, str]:
    """The new commit's history partitions: the parent's, plus the dates this version applied.

    A date the parent has is never taken again (the job applies only dates after the last one,
    and validate holds it to that): a partition a commit references is never written again.
    """
    parts = history_of(parent)
    for day, written in (stats.get("history") or {}).items():
        if day in parts:
            raise PublishValidationError(
                f"{parent.seq}: history partition {day} exists already at {parts[day]}; the new version wrote "
                f"{written['location']} again. Nothing was published"
            )
        parts[day] = written["location"]
    return dict(sorted(parts.items()))


def history_problems(stats: Mapping[str, Any], out: str, footer_rows_by_date: Mapping[str, int]) -> list[str]:
    """A snapshot compaction's history partitions: in this attempt's ``history/``, holding the rows reported."""
    problems = []
    reported = stats.get("history") or {}
    where = posixpath.join(out.rstrip("/"), HISTORY_DIR)
    outside = sorted(
        d for d, h in reported.items() if h.get("location", "").rstrip("/") != f"{where}/{HISTORY_DIR_PREFIX}{d}"
    )
    if outside:
        problems.append(f"history partitions {outside} were reported outside the new version's {where}")
    rows = {d: int(h.get("rows", -1)) for d, h in reported.items()}
    if rows != {d: footer_rows_by_date.get(d, 0) for d in rows} or not set(footer_rows_by_date) <= set(rows):
        problems.append(
            f"rows per history partition in the Parquet footers {dict(footer_rows_by_date)} differ from the job's "
            f"report {rows}"
        )
    missing = sorted(d for d in rows if d not in footer_rows_by_date)
    if missing:
        problems.append(f"history partitions {missing} have no Parquet file (an applied date has one, maybe empty)")
    return problems


class SnapshotMode(TableMode):
    """The Airflow side of ``mode: snapshot``."""

    name = "snapshot"
    has_change_feed = True
    model = SnapshotTable
    summary = "full extracts"

    @staticmethod
    def _cfg(cfg: TableConfig) -> SnapshotTable:
        return cast(SnapshotTable, cfg)

    def rule_context(self, cfg: TableConfig, fingerprint: str) -> SnapshotContext:
        c = self._cfg(cfg)
        return SnapshotContext(
            **self.common_context(c, fingerprint),
            primary_key=list(c.primary_key),
            value_columns=c.value_columns,
            column_types={col.name: col.type for col in c.columns},
            delta=c.delta,
            business_date_column=c.business_date_column,
            mode_columns=[(n, t, _COMMENTS[n]) for n, t in SNAPSHOT_COLUMNS],
            history_table=history_table(c),
        )

    def fingerprint_doc(self, cfg: TableConfig) -> dict[str, Any]:
        c = self._cfg(cfg)
        return {"primary_key": c.primary_key, "delta": c.delta, "business_date": c.business_date_column}

    def rule_sql(self, cfg: TableConfig) -> dict[str, Any]:
        """The rule as the job's ``SnapshotRule.from_dict`` reads it (the table's shape and the rendered macros)."""
        from cdc_compaction.core import sql

        c = self._cfg(cfg)
        m, t = self.macros(), sql.context(cfg)
        return {
            "columns": c.column_names,
            "delta": c.delta,
            "key_hash": str(m.key_hash(t)).strip(),
            "row_hash": str(m.row_hash(t)).strip(),
            "reject_reason": str(m.reject_reason(t)).strip(),
            "operation": str(m.operation(t)).strip(),
            "business_date": str(m.business_date(t)).strip() if c.business_date_column else None,
        }

    @staticmethod
    def business_date_of(cfg: TableConfig, increment: str) -> date | None:
        """An increment's business date from its name: the UTC date of its hour (None: not an increment name)."""
        hour = increment_hour(cfg, increment)
        return hour.date() if hour is not None else None

    def plan_fields(self, cfg: TableConfig, parent: Commit) -> dict[str, Any]:
        c = self._cfg(cfg)
        fields: dict[str, Any] = {"primary_key": list(c.primary_key), "delta": c.delta}
        # Left out when None, as job.contract.Plan writes them back (the plan round-trips key for key).
        if c.business_date_column:
            fields["business_date_column"] = c.business_date_column
        if (last := last_applied(parent)) is not None:
            fields["last_applied"] = last
        return fields

    def plan_increments(self, cfg: TableConfig, increments: list[str]) -> dict[str, Any]:
        """The plan's entries that depend on its increments: each one's business date from its name."""
        dates = {i: self.business_date_of(cfg, i) for i in increments}
        return {"business_dates": {i: d.isoformat() for i, d in sorted(dates.items()) if d is not None}}

    def count_problems(self, stats: Mapping[str, Any]) -> list[str]:
        """The contract's invariants over the job's counts (README of the scenarios, "Counts of a compaction").

        Each applied snapshot classifies every key once: the current keys before it are its U, N, D
        and X keys; after it, its I, U, N and X keys. Chained from the parent's rows, the last must be
        the rows written; each history partition holds that date's I, U and D rows; every increment
        is applied, replayed or refused, once.
        """
        problems: list[str] = []
        if stats.get("mode") != "snapshot":
            return [f"the stats are of mode {stats.get('mode')!r}, not of a snapshot compaction"]
        if stats["duplicate_keys"]:
            problems.append(f"{stats['duplicate_keys']} keys appear more than once in the current table")
        if stats.get("misplaced_rows", 0):
            problems.append(f"{stats['misplaced_rows']} rows of the current table have no I, U, N or X operation")
        if stats["output_tombstones"]:
            problems.append(f"the output holds {stats['output_tombstones']} tombstones; a snapshot table keeps none")
        rows = int(stats["base_rows"])
        totals = dict.fromkeys(OPERATIONS, 0)
        history = stats.get("history") or {}
        last = stats.get("last_applied")
        for increment, day, counts in stats.get("steps", []):
            n = {op: int(counts.get(op, 0)) for op in OPERATIONS}
            examined = n["U"] + n["N"] + n["D"] + n["X"]
            if examined != rows:
                problems.append(
                    f"{increment} ({day}): the current table had {rows} keys, but U {n['U']} + N {n['N']} "
                    f"+ D {n['D']} + X {n['X']} = {examined} were classified"
                )
            rows = n["I"] + n["U"] + n["N"] + n["X"]
            changes = n["I"] + n["U"] + n["D"]
            written = (history.get(day) or {}).get("rows")
            if written != changes:
                problems.append(
                    f"history partition {day} holds {written} rows, but {increment} made I {n['I']} + U {n['U']} "
                    f"+ D {n['D']} = {changes} changes"
                )
            if last is not None and day <= last:
                problems.append(f"{increment} was applied at {day}, not after the last applied date {last}")
            last = day
            for op in OPERATIONS:
                totals[op] += n[op]
        if rows != stats["output_visible_rows"]:
            problems.append(
                f"row counts do not reconcile: the applied snapshots leave {rows} keys, "
                f"but the current table has {stats['output_visible_rows']} rows"
            )
        if totals != {op: int(stats.get("counts", {}).get(op, 0)) for op in OPERATIONS}:
            problems.append(f"the counts {stats.get('counts')} are not the sum of each snapshot's {totals}")
        applied = [day for _, day in stats.get("applied", [])]
        if sorted(history) != sorted(applied) or len(set(applied)) != len(applied):
            problems.append(f"history partitions {sorted(history)} are not the applied dates {applied}, each once")
        fates = stats.get("increments", {})
        tally = len(applied) + int(stats.get("replayed", 0)) + sum(stats.get("refused", {}).values())
        if tally != len(fates):
            problems.append(
                f"{len(fates)} increments, but {len(applied)} applied + {stats.get('replayed')} replayed "
                f"+ refused {stats.get('refused')} = {tally}"
            )
        if stats.get("rejected", {}) != stats["rejected_by_reason"] or stats["rejected_rows"] != sum(
            stats["rejected_by_reason"].values()
        ):
            problems.append(
                f"refused rows do not reconcile: {stats['rejected_rows']} rows, by reason "
                f"{stats['rejected_by_reason']}, counted {stats.get('rejected')}"
            )
        if sum(stats.get("rejected_by_file", {}).values()) != stats["rejected_rows"]:
            problems.append(
                f"{sum(stats.get('rejected_by_file', {}).values())} rows were quarantined, "
                f"but {stats['rejected_rows']} refused"
            )
        return problems

    def column_roles(self, cfg: TableConfig) -> dict[str, list[str]]:
        c = self._cfg(cfg)
        roles: dict[str, list[str]] = {col.name: [] for col in c.columns}
        for i, col in enumerate(c.primary_key, 1):
            roles[col].append(f"key {i}")
        if c.business_date_column:
            roles[c.business_date_column].append("business date (not compared)")
        for col in c.value_columns:
            roles[col].append("compared")
        return roles

    def lineage_columns(self, cfg: TableConfig) -> dict[str, list[ColumnUse]]:
        c = self._cfg(cfg)
        key, values, day = list(c.primary_key), list(c.value_columns), c.business_date_column
        compared = "I/U/N/D/X: the export compared with the current table"
        out = {OPERATION_COLUMN: [ColumnUse(col, "DIRECT", "TRANSFORMATION", compared) for col in [*key, *values]]}
        if day:
            out[EFF_START_DATE_COLUMN] = [
                ColumnUse(day, "DIRECT", "TRANSFORMATION", "the business date the values start at")
            ]
        out["_cdc_key_hash"] = [ColumnUse(k, "DIRECT", "TRANSFORMATION", "hash of the key", masking=True) for k in key]
        out["_cdc_row_hash"] = [
            ColumnUse(v, "DIRECT", "TRANSFORMATION", "hash of the values", masking=True) for v in values
        ]
        return out

    def lineage_influences(self, cfg: TableConfig) -> list[ColumnUse]:
        c = self._cfg(cfg)
        return [
            *(ColumnUse(k, "INDIRECT", "JOIN", "exports joined to the current table by key") for k in c.primary_key),
            *(
                [ColumnUse(c.business_date_column, "INDIRECT", "SORT", "exports apply in date order")]
                if c.business_date_column
                else []
            ),
        ]

    def doc_lines(self, cfg: TableConfig) -> list[str]:
        c = self._cfg(cfg)
        dated = (
            f"the column `{c.business_date_column}` (one date per increment)"
            if c.business_date_column
            else "the UTC date of the increment's name"
        )
        kind = (
            "delta (only changed rows; a key not supplied keeps its row, `X`)"
            if c.delta
            else "full (a key not supplied is deleted, `D`)"
        )
        return [
            "* **Mode:** `snapshot` (every increment is one export of the table, compared with the current "
            "table by hashes: I, U, N, D, X)",
            "* **Primary key:** " + ", ".join(f"`{k}`" for k in c.primary_key),
            f"* **Snapshots:** {kind}; business date from {dated}; a date not after the last applied one is a replay",
            f"* **Outputs:** `{c.table}_base` (the current table, with `operation` and `eff_start_date`) and "
            f"`{c.table}_history` (net changes, one partition per business date)",
            f"* **Views:** `{c.table}_view` shows the current table as published: no view over pending snapshots yet",
        ]

    def output_columns(self, cfg: TableConfig) -> list[tuple[str, str]]:
        return list(SNAPSHOT_COLUMNS)

    # -- the history: <version>/history/eff_start_date=<date>/, the commit's outputs, <t>_history ------------
    def extra_tables(self, cfg: TableConfig) -> list[ExtraTable]:
        columns = [(c.name, c.type, c.comment) for c in cfg.columns]
        columns += [(n, t, "") for n, t in SNAPSHOT_COLUMNS if n != EFF_START_DATE_COLUMN]
        columns += [(n, _META_TYPES[n], "") for n in META_COLUMNS]
        columns.append((EFF_START_DATE_COLUMN, "string", ""))  # its partition column, a string
        return [
            ExtraTable(
                name=history_table(cfg),
                template=self.template("create_history.sql.j2"),
                columns=tuple(columns),
                partitions_key=HISTORY_KEY,
            )
        ]

    def output_dirs(self, cfg: TableConfig) -> list[OutputDir]:
        return [OutputDir(HISTORY_DIR, EFF_START_DATE_COLUMN)]

    def commit_outputs(self, cfg: TableConfig, parent: Commit, stats: Mapping[str, Any]) -> dict[str, Any] | None:
        return {HISTORY_KEY: next_history(parent, stats)}

    def validate_outputs(
        self, cfg: TableConfig, stats: Mapping[str, Any], out: str, footer_rows: Mapping[str, Mapping[str, int]]
    ) -> list[str]:
        return history_problems(stats, out, footer_rows.get(HISTORY_DIR, {}))

    def referenced_locations(self, cfg: TableConfig, commit: Commit) -> list[str]:
        # Every commit names all history partitions so far, each in the version that applied its date.
        return list(history_of(commit).values())

    def changes_kept_in(self, cfg: TableConfig) -> str | None:
        return "a snapshot table's <t>_history"

    def rollback_refusal(self, cfg: TableConfig) -> str | None:
        # Rolling the current table back would leave history partitions of dates it no longer holds.
        return "a mode: snapshot table's <t>_history only grows (a date applied stays applied)"

    def extra_rows(self, cfg: TableConfig, commit: Commit) -> dict[str, int]:
        written = (commit.stats.get("history") or {}).values()
        return {history_table(cfg): sum(int(d.get("rows", 0)) for d in written)}

    def view_columns(self, cfg: TableConfig) -> list[tuple[str, str]]:
        types = dict(SNAPSHOT_COLUMNS)
        return [
            *[(col.name, col.type) for col in cfg.columns],
            (OPERATION_COLUMN, types[OPERATION_COLUMN]),
            (EFF_START_DATE_COLUMN, types[EFF_START_DATE_COLUMN]),
        ]


#: This module's mode (found by :func:`cdc_compaction.core.mode.table_modes`).
MODE = SnapshotMode()
