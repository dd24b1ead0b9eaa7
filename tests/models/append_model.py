"""Reference model of the ``append`` table mode, from ``tests/scenarios/append/README.md`` alone.

The table is a list of rows (every column), at most one per event id.  A compaction refuses
the invalid events, then walks the valid pending events in (increment, file, row) order: an
event whose id the table holds is a replay, one whose id an earlier pending event had is
superseded, any other is appended.  Nothing here imports the project: it is the oracle the
scenarios, the SQL, the views and the Spark job are held against, written for obviousness.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CREATE, READ, UPDATE, DELETE = "c", "r", "u", "d"
#: Types the contract refuses for an event id.
REFUSED_ID_TYPES = ("float", "double", "binary")

Row = tuple[Any, ...]


def multiset(rows: Iterable[Sequence[Any]]) -> Counter[Row]:
    """Rows (tuples in column order) as a multiset, for comparisons."""
    return Counter(tuple(r) for r in rows)


@dataclass(frozen=True)
class AppendTable:
    """An append table's registry shape: columns (name, Hive type), event_id, the optional op column."""

    columns: tuple[tuple[str, str], ...]
    event_id: tuple[str, ...]
    op_column: str | None = None

    def __post_init__(self) -> None:
        names = [n for n, _ in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate column names in {names}")
        if not self.event_id:
            raise ValueError("event_id needs at least one column")
        for c in self.event_id:
            if c not in names:
                raise ValueError(f"event_id: {c!r} is not a column")
            kind = self.types[c].lower()
            if kind in REFUSED_ID_TYPES or kind.startswith(("array", "map", "struct")):
                raise ValueError(f"event_id: {c!r} has type {kind}, which cannot identify an event")
        if self.op_column is not None and (self.op_column not in names or self.op_column in self.event_id):
            raise ValueError(f"op_column: {self.op_column!r} must be a column outside event_id")

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> AppendTable:
        """From a scenario's ``table`` object."""
        if doc.get("mode") != "append":
            raise ValueError(f"not an append table: mode {doc.get('mode')!r}")
        for absent in ("primary_key", "order_by", "partition_by"):
            if doc.get(absent):
                raise ValueError(f"an append table has no {absent}")
        return cls(
            columns=tuple((c["name"], c["type"]) for c in doc["columns"]),
            event_id=tuple(doc["event_id"]),
            op_column=doc.get("op_column"),
        )

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.columns]

    @property
    def types(self) -> dict[str, str]:
        return dict(self.columns)


@dataclass(frozen=True)
class Event:
    """One landed row and where it lives: increment name, file name, row position in the file."""

    row: Mapping[str, Any]
    increment: str
    file: str
    pos: int


@dataclass
class Outcome:
    """What one compaction (or the view, which is a compaction not committed) produces."""

    rows: list[Row]  # every column, in column order
    rejected: int = 0
    rejected_by_reason: Counter[str] = field(default_factory=Counter)
    replayed: int = 0
    superseded: int = 0
    appended: int = 0

    @property
    def multiset(self) -> Counter[Row]:
        return multiset(self.rows)

    def counts(self) -> dict[str, int]:
        return {
            "rejected": self.rejected,
            "replayed": self.replayed,
            "superseded": self.superseded,
            "appended": self.appended,
        }


def file_name(index: int) -> str:
    """The name the scenario format gives the index-th file of an increment."""
    return f"part-{index:05d}.parquet"


class AppendModel:
    """The committed rows of one append table and its pending events."""

    def __init__(self, table: AppendTable) -> None:
        self.table = table
        self.rows: list[Row] = []
        self.pending: list[Event] = []

    def land(self, increment: str, files: Sequence[Sequence[Mapping[str, Any]]]) -> None:
        """Land an increment: the i-th list is the file ``part-<i>.parquet``, rows at positions 0, 1, ..."""
        for i, rows in enumerate(files):
            self.pending += [Event(dict(row), increment, file_name(i), pos) for pos, row in enumerate(rows)]

    def reject_reason(self, row: Mapping[str, Any]) -> str | None:
        """Why the contract refuses an event (checked in the README's order), or None."""
        for c in self.table.event_id:
            if row.get(c) is None:
                return f"null_event_id:{c}"
        if self.table.op_column is None:
            return None
        op = row.get(self.table.op_column)
        if op is None:
            return "null_op"
        if op == UPDATE:
            return "not_an_insert:update"
        if op == DELETE:
            return "not_an_insert:delete"
        if op not in (CREATE, READ):
            return "unknown_op"
        return None

    def _id(self, values: Mapping[str, Any]) -> Row:
        return tuple(values[c] for c in self.table.event_id)

    def fold(self, events: Sequence[Event]) -> Outcome:
        """The outcome of compacting ``events`` onto the committed rows (which are not changed)."""
        out = Outcome(rows=list(self.rows))
        names = self.table.names
        seen = {self._id(dict(zip(names, r, strict=True))) for r in self.rows}
        in_base = set(seen)
        valid = []
        for e in events:
            reason = self.reject_reason(e.row)
            if reason is None:
                valid.append(e)
            else:
                out.rejected += 1
                out.rejected_by_reason[reason] += 1
        for e in sorted(valid, key=lambda e: (e.increment, e.file, e.pos)):
            key = self._id(e.row)
            if key in in_base:
                out.replayed += 1
            elif key in seen:
                out.superseded += 1
            else:
                seen.add(key)
                out.appended += 1
                out.rows.append(tuple(e.row.get(c) for c in names))
        return out

    def view(self) -> Outcome:
        """What the view shows now: a compaction of the pending events, not committed."""
        return self.fold(self.pending)

    def compact(self) -> Outcome:
        """Compact the pending events and commit them: the new rows, nothing pending."""
        out = self.fold(self.pending)
        self.rows, self.pending = list(out.rows), []
        return out


# ------------------------------------------------------------------ scenarios
@dataclass
class StepResult:
    """The model's answer to one ``check_view`` or ``compact`` step of a scenario."""

    index: int
    kind: str
    expected: Mapping[str, Any]
    outcome: Outcome


def run_scenario(doc: Mapping[str, Any]) -> list[StepResult]:
    """Play a scenario through the model; one result per ``check_view``/``compact`` step."""
    model = AppendModel(AppendTable.from_doc(doc["table"]))
    results = []
    for i, step in enumerate(doc["steps"]):
        (kind, body), *rest = step.items()
        if rest:
            raise ValueError(f"step {i} has more than one kind: {list(step)}")
        if kind == "land":
            model.land(body["increment"], body["files"])
        elif kind == "check_view":
            results.append(StepResult(i, kind, body, model.view()))
        elif kind == "compact":
            results.append(StepResult(i, kind, body, model.compact()))
        else:
            raise ValueError(f"step {i}: unknown step kind {kind!r}")
    return results


def compared(table: AppendTable) -> list[str]:
    """The columns a scenario's rows are compared on: every column but the op column."""
    return [n for n in table.names if n != table.op_column]


def expected_multiset(table: AppendTable, expect: Sequence[Mapping[str, Any]]) -> Counter[Row]:
    """A step's ``expect`` rows as a multiset over :func:`compared` (a column left out is NULL)."""
    cols = compared(table)
    for row in expect:
        unknown = set(row) - set(table.names)
        if unknown:
            raise ValueError(f"expected row {row} names columns {sorted(unknown)} the table does not have")
    return multiset(tuple(row.get(c) for c in cols) for row in expect)


def project(table: AppendTable, rows: Iterable[Sequence[Any]]) -> Counter[Row]:
    """Full rows (every column, in column order) as a multiset over :func:`compared`."""
    idx = [table.names.index(c) for c in compared(table)]
    return multiset(tuple(r[i] for i in idx) for r in rows)


#: ``compact`` step keys -> :meth:`Outcome.counts` keys (``rejected`` is always given, the others optionally).
COUNT_KEYS = {"rejected": "rejected", "replayed": "replayed", "superseded": "superseded"}


def mismatches(
    table: AppendTable, result: StepResult, rows: Iterable[Sequence[Any]], counts: Mapping[str, int]
) -> list[str]:
    """How ``rows``/``counts`` (from the model, or from another side) differ from what the step expects."""
    out = []
    want = expected_multiset(table, result.expected["expect"])
    got = project(table, rows)
    if got != want:
        out.append(f"step {result.index} ({result.kind}): rows {dict(got)} != expected {dict(want)}")
    keys = {"rejected_pending": "rejected"} if result.kind == "check_view" else COUNT_KEYS
    for key, attr in keys.items():
        if key in result.expected and counts.get(attr) != result.expected[key]:
            out.append(
                f"step {result.index} ({result.kind}): {key} {counts.get(attr)} != expected {result.expected[key]}"
            )
    return out
