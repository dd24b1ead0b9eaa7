"""Reference model of the ``keyless`` table mode, from ``tests/scenarios/README.md`` alone.

The table is a multiset of data-column tuples plus a watermark.  An event's position is its
``order_by`` values then its ``event_id`` values: its identity, and where the source delivered
it.  A compaction is a plain sequential fold: refuse the invalid events, set the replays (at or
below the watermark) aside, keep the last delivery of each position, then apply the events one
at a time in order, removing and adding single copies.  Nothing here imports the project: it
is the oracle the scenarios, the SQL and the Spark job are held against, so it is written
for obviousness, not speed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CREATE, READ, UPDATE, DELETE = "c", "r", "u", "d"
OP_CODES = (CREATE, READ, UPDATE, DELETE)
ADDS = (CREATE, READ, UPDATE)
REMOVES = (UPDATE, DELETE)
FLOAT_TYPES = ("float", "double")
DEFAULT_BEFORE_PREFIX = "_before_"


class _NaN:
    """Stands for NaN inside multiset keys: NaN equals NaN for the contract (as in SQL grouping), not in Python."""

    _instance: _NaN | None = None

    def __new__(cls) -> _NaN:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NaN"


NAN = _NaN()

Row = tuple[Any, ...]


def canonical(values: Iterable[Any]) -> Row:
    """A row as a hashable multiset key: NULL stays None (None == None), NaN becomes ``NAN``."""
    return tuple(NAN if isinstance(v, float) and math.isnan(v) else v for v in values)


def multiset(rows: Iterable[Sequence[Any]]) -> Counter[Row]:
    """Rows (tuples in data-column order) as a multiset, for comparisons."""
    return Counter(canonical(r) for r in rows)


@dataclass(frozen=True)
class KeylessTable:
    """A keyless table's registry shape: columns (name, Hive type), op column, order_by, before prefix, event_id."""

    columns: tuple[tuple[str, str], ...]
    op_column: str
    order_by: tuple[str, ...]
    before_prefix: str = DEFAULT_BEFORE_PREFIX
    event_id: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [n for n, _ in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate column names in {names}")
        for c in (self.op_column, *self.position):
            if c not in names:
                raise ValueError(f"{c!r} is not a column")
        if not self.order_by:
            raise ValueError("order_by needs at least one column")
        if not self.data_columns:
            raise ValueError("a keyless table needs at least one data column")
        befores = {n for n in names if n.startswith(self.before_prefix)}
        wanted = {self.before_prefix + c for c in self.data_columns}
        if befores != wanted:
            raise ValueError(f"before columns {sorted(befores)} do not match the data columns (want {sorted(wanted)})")

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> KeylessTable:
        """From a scenario's ``table`` object."""
        if doc.get("mode") != "keyless":
            raise ValueError(f"not a keyless table: mode {doc.get('mode')!r}")
        if doc.get("primary_key"):
            raise ValueError("a keyless table has no primary_key")
        return cls(
            columns=tuple((c["name"], c["type"]) for c in doc["columns"]),
            op_column=doc["op_column"],
            order_by=tuple(doc["order_by"]),
            before_prefix=doc.get("before_prefix", DEFAULT_BEFORE_PREFIX),
            event_id=tuple(doc.get("event_id", ())),
        )

    @property
    def position(self) -> tuple[str, ...]:
        """The columns of an event's position: order_by, then event_id."""
        return (*self.order_by, *self.event_id)

    @property
    def types(self) -> dict[str, str]:
        return dict(self.columns)

    @property
    def data_columns(self) -> list[str]:
        """Every column except the op column, the position columns and the before columns, in column order."""
        skip = {self.op_column, *self.position}
        return [n for n, _ in self.columns if n not in skip and not n.startswith(self.before_prefix)]

    @property
    def before_columns(self) -> list[str]:
        """The before column of each data column, aligned with ``data_columns``."""
        return [self.before_prefix + c for c in self.data_columns]


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

    rows: list[Row]  # data columns, in data-column order; NaN as float('nan')
    watermark: tuple[Any, ...] | None
    rejected: int = 0
    rejected_by_reason: Counter[str] = field(default_factory=Counter)
    replayed: int = 0
    superseded: int = 0
    applied: int = 0
    unmatched_removals: int = 0

    @property
    def multiset(self) -> Counter[Row]:
        return multiset(self.rows)


def file_name(index: int) -> str:
    """The name the scenario format gives the index-th file of an increment."""
    return f"part-{index:05d}.parquet"


class KeylessModel:
    """The committed state of one keyless table (multiset + watermark) and its pending events."""

    def __init__(self, table: KeylessTable) -> None:
        self.table = table
        self.rows: Counter[Row] = Counter()  # canonical keys
        self.watermark: tuple[Any, ...] | None = None
        self.pending: list[Event] = []

    # --------------------------------------------------------------- inputs
    def land(self, increment: str, files: Sequence[Sequence[Mapping[str, Any]]]) -> list[Event]:
        """Land an increment: the i-th list is the file ``part-<i>.parquet``, rows at positions 0, 1, ..."""
        landed = [
            Event(dict(row), increment, file_name(i), pos)
            for i, rows in enumerate(files)
            for pos, row in enumerate(rows)
        ]
        self.pending.extend(landed)
        return landed

    def reject_reason(self, row: Mapping[str, Any]) -> str | None:
        """Why the contract refuses an event (checked in the README's order), or None."""
        types = self.table.types

        def field(c: str) -> str:
            return "event_id" if c in self.table.event_id else "order_by"

        for c in self.table.position:
            if row.get(c) is None:
                return f"null_{field(c)}:{c}"
        for c in self.table.position:
            v = row.get(c)
            if types[c].lower() in FLOAT_TYPES and isinstance(v, float) and math.isnan(v):
                return f"nan_{field(c)}:{c}"
        op = row.get(self.table.op_column)
        if op is None:
            return "null_op"
        if op not in OP_CODES:
            return "unknown_op"
        return None

    # --------------------------------------------------------------- the fold
    def _seq(self, e: Event) -> tuple[Any, ...]:
        return tuple(e.row[c] for c in self.table.position)

    def _after(self, e: Event) -> Row:
        return canonical(e.row.get(c) for c in self.table.data_columns)

    def _before(self, e: Event) -> Row:
        return canonical(e.row.get(c) for c in self.table.before_columns)

    def fold(self, events: Sequence[Event]) -> tuple[Counter[Row], Outcome]:
        """The state and outcome of compacting ``events`` onto the committed state (which is not changed)."""
        out = Outcome(rows=[], watermark=self.watermark)
        valid = []
        for e in events:
            reason = self.reject_reason(e.row)
            if reason is None:
                valid.append(e)
            else:
                out.rejected += 1
                out.rejected_by_reason[reason] += 1
        fresh = []
        for e in valid:
            if self.watermark is not None and self._seq(e) <= self.watermark:
                out.replayed += 1
            else:
                fresh.append(e)
        fresh.sort(key=lambda e: (self._seq(e), e.increment, e.file, e.pos))
        # Equal positions: one event delivered more than once; its last delivery applies.
        applied = [e for i, e in enumerate(fresh) if i + 1 == len(fresh) or self._seq(fresh[i + 1]) != self._seq(e)]
        out.superseded = len(fresh) - len(applied)
        out.applied = len(applied)

        state = Counter(self.rows)
        for e in applied:
            op = e.row[self.table.op_column]
            if op in REMOVES:
                before = self._before(e)
                if state[before] > 0:
                    state[before] -= 1
                else:
                    out.unmatched_removals += 1
            if op in ADDS:
                state[self._after(e)] += 1
        state = +state  # drop the zero counts
        if applied:
            out.watermark = self._seq(applied[-1])  # the greatest: sorted, and all above the old watermark
        out.rows = [tuple(math.nan if v is NAN else v for v in key) for key in sorted(state.elements(), key=repr)]
        return state, out

    def view(self) -> Outcome:
        """What the view shows now: a compaction of the pending events, not committed."""
        return self.fold(self.pending)[1]

    def compact(self) -> Outcome:
        """Compact the pending events and commit: new rows, new watermark, nothing pending."""
        state, out = self.fold(self.pending)
        self.rows, self.watermark, self.pending = state, out.watermark, []
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
    model = KeylessModel(KeylessTable.from_doc(doc["table"]))
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


def expected_multiset(table: KeylessTable, expect: Sequence[Mapping[str, Any]]) -> Counter[Row]:
    """A step's ``expect`` rows as a multiset; each must name exactly the data columns."""
    data = table.data_columns
    for row in expect:
        if sorted(row) != sorted(data):
            raise ValueError(f"expected row {row} must hold exactly the data columns {data}")
    return multiset(tuple(row[c] for c in data) for row in expect)


#: ``compact`` step keys -> Outcome attributes (``rejected`` is always given, the others optionally).
COUNT_KEYS = {
    "rejected": "rejected",
    "replayed": "replayed",
    "superseded": "superseded",
    "unmatched_removals": "unmatched_removals",
}


def mismatches(
    table: KeylessTable, result: StepResult, rows: Iterable[Sequence[Any]], counts: Mapping[str, int]
) -> list[str]:
    """How ``rows``/``counts`` (from the model, or from the Spark side) differ from what the step expects."""
    out = []
    want = expected_multiset(table, result.expected["expect"])
    got = multiset(rows)
    if got != want:
        out.append(f"step {result.index} ({result.kind}): rows {dict(got)} != expected {dict(want)}")
    keys = {"rejected_pending": "rejected"} if result.kind == "check_view" else COUNT_KEYS
    for key, attr in keys.items():
        if key in result.expected and counts.get(attr) != result.expected[key]:
            out.append(
                f"step {result.index} ({result.kind}): {key} {counts.get(attr)} != expected {result.expected[key]}"
            )
    return out
