"""Reference model of the ``snapshot`` table mode, from ``tests/scenarios/snapshot/README.md`` alone.

The state is a dict from key to (row, operation, eff_start_date), the history as a dict
from business date to rows, and the last applied date.  A compaction walks the pending
increments in name order and decides each one in plain Python: its business date, replay
or not, its refused rows, then the classification of every key.  Values are compared as
values (never hashed): the contract says the hashes are one-to-one on values, so the
model needs none, and a job whose hashes collide or differ where values do not is caught
by disagreeing with it.  Nothing here imports the project; it is written for obviousness,
not speed.

Rows are JSON-like dicts, as in the scenario files: ``date`` columns and ``eff_start_date``
are ISO date strings.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

INSERT, UPDATE, NO_CHANGE, DELETE, NOT_SUPPLIED = "I", "U", "N", "D", "X"
OPERATIONS = (INSERT, UPDATE, NO_CHANGE, DELETE, NOT_SUPPLIED)
#: The default increment layout: ``increment_YYYYMMDDHH``, an hour in UTC.
INCREMENT_PREFIX = "increment_"
INCREMENT_TIME_FORMAT = "%Y%m%d%H"
FLOAT_TYPES = ("float", "double")

Row = dict[str, Any]
#: A value as compared: NULL is one value, every NaN is one value, -0.0 is not 0.0 (as the hashes see them).
Canonical = tuple[Any, ...]


def canonical(value: Any) -> Canonical:
    """A value as the contract compares it (the hash's canonical text, without the text)."""
    if value is None:
        return ("null",)
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else value.hex())
    return ("value", type(value).__name__ if isinstance(value, bool) else "", value)


@dataclass(frozen=True)
class SnapshotTable:
    """A snapshot table's registry shape."""

    columns: tuple[tuple[str, str], ...]
    primary_key: tuple[str, ...]
    delta: bool = False
    business_date_column: str | None = None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> SnapshotTable:
        """From a scenario's ``table`` (the registry's shape)."""
        if doc.get("mode") != "snapshot":
            raise ValueError(f"not a snapshot table: mode {doc.get('mode')!r}")
        bd = doc.get("business_date")
        return cls(
            columns=tuple((c["name"], c["type"]) for c in doc["columns"]),
            primary_key=tuple(doc["primary_key"]),
            delta=bool(doc.get("delta", False)),
            business_date_column=None if bd is None else bd["column"],
        )

    @property
    def column_names(self) -> list[str]:
        return [name for name, _ in self.columns]

    @property
    def value_columns(self) -> list[str]:
        """The compared columns: neither key nor business date."""
        return [c for c in self.column_names if c not in self.primary_key and c != self.business_date_column]

    def key(self, row: Row) -> Canonical:
        return tuple(canonical(row.get(c)) for c in self.primary_key)

    def values(self, row: Row) -> Canonical:
        return tuple(canonical(row.get(c)) for c in self.value_columns)

    def full_row(self, row: Row) -> Row:
        """Every column of the table, each value as its column's type holds it.

        A column a file lacks is NULL (as when reading with the table's schema); a number in
        a ``double`` column is a float (JSON writes ``2.0`` as ``2``).
        """
        types = dict(self.columns)
        return {c: _typed(row.get(c), types[c]) for c in self.column_names}

    def normalized(self, row: Mapping[str, Any]) -> Row:
        """A result row (every column plus ``operation`` and ``eff_start_date``) in the model's form."""
        types = dict(self.columns)
        return {k: _typed(v, types[k]) if k in types else v for k, v in row.items()}


@dataclass(frozen=True)
class Increment:
    """One increment: its name and its files, each a list of rows (together, one snapshot)."""

    name: str
    files: tuple[tuple[Row, ...], ...]

    @property
    def rows(self) -> list[Row]:
        return [r for f in self.files for r in f]


@dataclass(frozen=True)
class Current:
    """A key's row in the current table."""

    row: Row
    operation: str
    eff_start_date: date


@dataclass
class State:
    """The current table, the history (date -> rows) and what follows from it: the last applied date."""

    current: dict[Canonical, Current] = field(default_factory=dict)
    history: dict[date, list[Row]] = field(default_factory=dict)

    @property
    def last_applied(self) -> date | None:
        return max(self.history, default=None)

    def current_rows(self) -> list[Row]:
        return [_with_op(c.row, c.operation, c.eff_start_date) for c in self.current.values()]

    def history_rows(self) -> dict[str, list[Row]]:
        return {d.isoformat(): list(rows) for d, rows in sorted(self.history.items())}


@dataclass
class Outcome:
    """What one compaction reports."""

    counts: Counter[str] = field(default_factory=Counter)
    applied: list[str] = field(default_factory=list)
    replayed: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    #: Every quarantined row: (increment, row, reason).
    quarantine: list[tuple[str, Row, str]] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        """In the scenario files' shape."""
        return {
            "counts": {op: self.counts[op] for op in OPERATIONS},
            "applied": list(self.applied),
            "replayed": self.replayed,
            "rejected": {k: v for k, v in sorted(self.rejected.items()) if v},
            "refused": {k: v for k, v in sorted(self.refused.items()) if v},
        }


def _typed(value: Any, hive_type: str) -> Any:
    if value is None:
        return None
    t = hive_type.lower()
    if t in FLOAT_TYPES:
        return float(value)
    if t == "date":
        return _as_date(value).isoformat()
    return value


def _with_op(row: Row, operation: str, eff_start_date: date) -> Row:
    return {**row, "operation": operation, "eff_start_date": eff_start_date.isoformat()}


def _as_date(value: Any) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    return date.fromisoformat(str(value))


def increment_date(name: str) -> date | None:
    """The calendar date of the hour an increment's name stands for, or None for another name."""
    if not name.startswith(INCREMENT_PREFIX):
        return None
    try:
        return datetime.strptime(name[len(INCREMENT_PREFIX) :], INCREMENT_TIME_FORMAT).date()
    except ValueError:
        return None


def business_date(table: SnapshotTable, inc: Increment) -> tuple[date | None, str | None]:
    """(the increment's business date, None) or (None, why the whole increment is refused)."""
    if table.business_date_column is None:
        d = increment_date(inc.name)
        if d is None:
            raise ValueError(f"{inc.name!r} is not an increment name")
        return d, None
    rows = inc.rows
    if not rows:
        return None, "no_business_date"
    values = [r.get(table.business_date_column) for r in rows]
    if any(v is None for v in values):
        return None, "null_business_date"
    dates = {_as_date(v) for v in values}
    if len(dates) > 1:
        return None, "mixed_business_date"
    return dates.pop(), None


def row_reasons(table: SnapshotTable, rows: Sequence[Row]) -> list[str | None]:
    """Why each row of one snapshot is refused (NULL key first, then duplicate key), or None."""
    reasons: list[str | None] = []
    for r in rows:
        null = next((c for c in table.primary_key if r.get(c) is None), None)
        reasons.append(None if null is None else f"null_key:{null}")
    keys = Counter(table.key(r) for r, why in zip(rows, reasons, strict=True) if why is None)
    return [
        "duplicate_key" if why is None and keys[table.key(r)] > 1 else why for r, why in zip(rows, reasons, strict=True)
    ]


def apply_snapshot(
    table: SnapshotTable, state: State, rows: Sequence[Row], withheld: set[Canonical], d: date
) -> Counter[str]:
    """Apply one snapshot's accepted ``rows`` (unique keys) with business date ``d``; return its counts.

    ``withheld`` are the keys whose rows were refused as duplicates: not supplied.
    """
    counts: Counter[str] = Counter()
    snapshot = {table.key(r): table.full_row(r) for r in rows}
    current: dict[Canonical, Current] = {}
    changes: list[Row] = []
    for k, row in snapshot.items():
        old = state.current.get(k)
        if old is None or table.values(old.row) != table.values(row):
            op = INSERT if old is None else UPDATE
            current[k] = Current(row, op, d)
            changes.append(_with_op(row, op, d))
        else:
            op = NO_CHANGE
            current[k] = Current(old.row, op, old.eff_start_date)
        counts[op] += 1
    for k, old in state.current.items():
        if k in snapshot:
            continue
        if table.delta or k in withheld:
            current[k] = Current(old.row, NOT_SUPPLIED, old.eff_start_date)
            counts[NOT_SUPPLIED] += 1
        else:
            changes.append(_with_op(old.row, DELETE, d))
            counts[DELETE] += 1
    state.current = current
    state.history[d] = changes
    return counts


def compact(table: SnapshotTable, state: State, pending: Iterable[Increment]) -> Outcome:
    """One compaction: every pending increment, in name order, against ``state`` (changed in place)."""
    out = Outcome()
    for inc in sorted(pending, key=lambda i: i.name):
        d, refusal = business_date(table, inc)
        last = state.last_applied
        if d is not None and last is not None and d <= last:
            out.replayed += 1
            continue
        rows = [table.full_row(r) for r in inc.rows]
        reasons = row_reasons(table, rows)
        accepted = [r for r, why in zip(rows, reasons, strict=True) if why is None]
        if refusal is None and not table.delta and not accepted:
            refusal = "empty_snapshot"
        for r, why in zip(rows, reasons, strict=True):
            reason = why or refusal
            if reason is not None:
                out.rejected[reason] += 1
                out.quarantine.append((inc.name, r, reason))
        if refusal is not None:
            out.refused[refusal] += 1
            continue
        assert d is not None
        withheld = {table.key(r) for r, why in zip(rows, reasons, strict=True) if why == "duplicate_key"}
        out.counts.update(apply_snapshot(table, state, accepted, withheld, d))
        out.applied.append(inc.name)
    return out


# ------------------------------------------------------------------ scenario files
def canonical_row(row: Mapping[str, Any]) -> tuple[tuple[str, Canonical], ...]:
    return tuple(sorted((k, canonical(v)) for k, v in row.items()))


def multiset(rows: Iterable[Mapping[str, Any]]) -> Counter[tuple[tuple[str, Canonical], ...]]:
    """Rows as a multiset, for comparisons."""
    return Counter(canonical_row(r) for r in rows)


def mismatches(
    table: SnapshotTable,
    expected: Mapping[str, Any],
    current: Sequence[Row],
    history: Mapping[str, Sequence[Row]],
    report: Mapping[str, Any],
) -> list[str]:
    """How a compaction's result differs from a scenario's ``compact`` step (empty: it matches).

    ``current`` and ``history`` are result rows (every column, ``operation``, ``eff_start_date``);
    ``report`` is in :meth:`Outcome.report`'s shape.  Only the report keys the step lists are compared.
    """

    def rows(rs: Iterable[Mapping[str, Any]]) -> Counter[tuple[tuple[str, Canonical], ...]]:
        return multiset(table.normalized(r) for r in rs)

    problems: list[str] = []
    if rows(expected["expect"]) != rows(current):
        problems.append(f"current table: expected {expected['expect']}, got {list(current)}")
    want = {d: rows(rs) for d, rs in expected["history"].items()}
    got = {d: rows(rs) for d, rs in history.items()}
    if want != got:
        problems.append(f"history: expected {expected['history']}, got {dict(history)}")
    for k in ("counts", "applied", "replayed", "rejected", "refused"):
        if k in expected and expected[k] != report[k]:
            problems.append(f"{k}: expected {expected[k]}, got {report[k]}")
    return problems


def run_scenario(doc: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], State, Outcome]]:
    """Every ``compact`` step of a scenario through the model: (the step, the state after it, its outcome)."""
    table = SnapshotTable.from_doc(doc["table"])
    state = State()
    pending: list[Increment] = []
    results: list[tuple[Mapping[str, Any], State, Outcome]] = []
    for step in doc["steps"]:
        if "land" in step:
            land = step["land"]
            pending.append(Increment(land["increment"], tuple(tuple(f) for f in land["files"])))
        elif "compact" in step:
            outcome = compact(table, state, pending)
            pending = []
            snapshot = State(dict(state.current), {d: list(r) for d, r in state.history.items()})
            results.append((step["compact"], snapshot, outcome))
        else:
            raise ValueError(f"unknown step {sorted(step)}")
    return results
