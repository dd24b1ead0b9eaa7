"""Generative differential tests: random tables and CDC event streams against a reference model.

The reference model below is written from the contract alone
(``../shared/conformance/README.md``): every event ever seen, with its increment,
file and row position; the winner per key is the greatest of (``order_by`` values,
increment name, file name, row position); a winning delete hides the key and stays
as a tombstone; rows with a null key column, a null (or NaN) ordering value or an op
code outside ``c r u d`` are refused, kept in quarantine with a reason and counted.
Nothing here imports the project's rule, SQL, templates, job or conformance
expectations to compute what a table should hold.  Only the *landing* helper
(``conformance.land``: rows -> Parquet file) is reused.

What runs is the real thing: the task functions (``ensure_tables``, ``plan``, the
Spark job, ``validate``, ``publish``, ``archive``, ``refresh_view``) on the shared
SparkSession and Thrift metastore.  After every step the base table (visible rows and
tombstones), the view ``<t>_view``, ``<t>_pending_rejects``, the run's stats and its
quarantine are compared with the model.

Budget: ``make test`` runs a few derandomized examples per test
(``CDC_FUZZ_EXAMPLES`` unset); ``make fuzz`` sets ``CDC_FUZZ_EXAMPLES`` (default 300)
and lets hypothesis pick fresh seeds.  Each test prints how many examples it ran.
"""

from __future__ import annotations

import glob
import itertools
import math
import os
import posixpath
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import fuzz_settings, merge_paths
from hypothesis import example, given
from hypothesis import strategies as st

from cdc_compaction.core.lake import Lake, TableLease
from cdc_compaction.core.registry import parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.devtools.conformance import land
from cdc_compaction.integrations.engine import SessionEngine
from cdc_compaction.job import faults
from cdc_compaction.job.faults import InjectedFaultError
from cdc_compaction.pipeline import order
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


# -------------------------------------------------------------------- the model
OP_CODES = ("c", "r", "u", "d")
DELETE = "d"


@dataclass(frozen=True)
class TableSpec:
    """A random table: columns in their registry order, key and ordering columns in their own order."""

    columns: tuple[tuple[str, str], ...]  # (name, hive type), op column included
    primary_key: tuple[str, ...]
    order_by: tuple[str, ...]
    op_column: str
    #: Source conventions (README, "Source presets"): a delete-marker column, full-load rows
    #: (a NULL op is a read and may lack its order), an order column holding binlog file names.
    deleted: str | None = None
    load_rows: bool = False
    binlog: str | None = None

    @property
    def types(self) -> dict[str, str]:
        return dict(self.columns)

    @property
    def data_columns(self) -> list[str]:
        """Every column except the op column: what a visible row holds."""
        return [n for n, _ in self.columns if n != self.op_column]


@dataclass(frozen=True)
class Event:
    """One landed row and where it lives."""

    row: tuple[tuple[str, Any], ...]
    increment: str
    file: str
    pos: int

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.row)


def defects(spec: TableSpec, row: dict[str, Any]) -> set[str]:
    """Why the contract refuses a row (empty: it is valid), in the README's reason names.

    A NaN ordering value is refused like NULL (``nan_order_by:<col>``): it has no place
    in the event order.  A null op code is outside the codes, so either name fits it.
    """
    out: set[str] = set()
    load_row = spec.load_rows and row.get(spec.op_column) is None
    for k in spec.primary_key:
        if row.get(k) is None:
            out.add(f"null_key:{k}")
    for c in spec.order_by:
        v = row.get(c)
        if v is None:
            if not load_row:  # a full-load row may lack its order
                out.add(f"null_order_by:{c}")
        elif isinstance(v, float) and math.isnan(v):
            out.add(f"nan_order_by:{c}")
        elif c == spec.binlog and not BINLOG_NAME.search(v):
            out.add(f"bad_order_by:{c}")
    op = row.get(spec.op_column)
    if op is None and not spec.load_rows:
        out |= {"null_op", "unknown_op"}
    elif effective_op(spec, row) not in OP_CODES:
        out.add("unknown_op")
    return out


#: A binlog file name ends in its number, at most 18 digits (it must fit a BIGINT).
BINLOG_NAME = re.compile(r"(?:^|[^0-9])([0-9]{1,18})$")


def effective_op(spec: TableSpec, row: dict[str, Any]) -> Any:
    """The op an event stands for: a delete when marked deleted, a read for a full-load row, else its code."""
    if spec.deleted is not None:
        mark = row.get(spec.deleted)
        if mark is True or (isinstance(mark, str) and mark.lower() == "true"):
            return DELETE
    op = row.get(spec.op_column)
    return "r" if op is None and spec.load_rows else op


def event_order(spec: TableSpec, e: Event) -> tuple[Any, ...]:
    """The contract's order, compared left to right: order_by values, increment, file, row position.

    Numbers compare as numbers (so -0.0 ties with 0.0), strings by code point (the
    same order as their UTF-8 bytes), timestamps as instants, binlog file names by their
    number; a missing value (a full-load row's) before every value.
    """
    v = e.values

    def key(c: str) -> tuple[Any, ...]:
        if v[c] is None:
            return (0,)
        if c == spec.binlog:
            found = BINLOG_NAME.search(v[c])
            assert found is not None, v[c]  # refused otherwise
            return (1, int(found.group(1)))
        return (1, v[c])

    return (*(key(c) for c in spec.order_by), e.increment, e.file, e.pos)


@dataclass
class Model:
    """Every event ever seen; the table is each key's winner among the valid ones."""

    spec: TableSpec
    events: list[Event] = field(default_factory=list)

    def valid(self, events: list[Event] | None = None) -> list[Event]:
        return [e for e in (self.events if events is None else events) if not defects(self.spec, e.values)]

    def rejected(self, events: list[Event]) -> list[Event]:
        return [e for e in events if defects(self.spec, e.values)]

    def winners(self, events: list[Event]) -> dict[tuple[Any, ...], Event]:
        best: dict[tuple[Any, ...], Event] = {}
        for e in self.valid(events):
            key = tuple(e.values[k] for k in self.spec.primary_key)
            if key not in best or event_order(self.spec, e) > event_order(self.spec, best[key]):
                best[key] = e
        return best

    def state(self, events: list[Event]) -> tuple[list[Event], list[Event]]:
        """(visible winners, tombstones) over these events."""
        w = list(self.winners(events).values())
        deleted = [effective_op(self.spec, e.values) == DELETE for e in w]
        return [e for e, d in zip(w, deleted, strict=True) if not d], [e for e, d in zip(w, deleted, strict=True) if d]


# ----------------------------------------------------------------- strategies
# Names: reserved words, mixed case, ordinary ones.  Hive names are case-insensitive,
# so a table never gets two names that differ only by case.
NAMES = ["id", "group", "order", "select", "timestamp", "Id2", "userName", "Amount", "lsn", "TS_ms", "Region", "key"]
OP_NAMES = ["op", "Op", "__op", "kind"]
KEY_TYPES = ["int", "bigint", "string"]
ORDER_TYPES = ["int", "bigint", "double", "string", "timestamp"]
OTHER_TYPES = ["string", "int", "double", "timestamp", "boolean"]

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
# Small domains, so that keys collide and ordering values tie at every level.
KEY_VALUES: dict[str, list[Any]] = {"int": [1, 2, 3], "bigint": [1, 5_000_000_000, -7], "string": ["a", "A", ""]}
ORDER_VALUES: dict[str, list[Any]] = {
    "int": [1, 2, 3],
    "bigint": [1, 2, 4_000_000_000],
    "double": [1.0, 2.5, 0.0, -0.0, -1.0, math.inf, -math.inf, math.nan],
    "string": ["b", "a", "ab", "B", "é"],
    "timestamp": [T0, T0 + timedelta(microseconds=1), T0 - timedelta(days=3), datetime(1970, 1, 1, tzinfo=UTC)],
}
OTHER_VALUES: dict[str, list[Any]] = {
    "string": ["x", "y", "Ω", ""],
    "int": [7, 8, -1],
    "double": [0.5, -2.0],
    "timestamp": [T0, T0 + timedelta(hours=5)],
    "boolean": [True, False],
}
OPS = ["c", "u", "d", "r", "c", "u", "d", None, "x", "U"]
DELETED_NAMES = ["__deleted", "is_deleted", "Deleted"]
DELETED_VALUES: dict[str, list[Any]] = {"string": ["false", "true", "TRUE", "yes"], "boolean": [False, True]}
#: Binlog file names, the smallest first: a rollover past six digits, names without a number, a
#: number too long for a BIGINT.
BINLOG_VALUES = [
    "mysql-bin.000009",
    "mysql-bin.000010",
    "mysql-bin.999999",
    "mysql-bin.1000000",
    "bin",
    "b.1" + "0" * 18,
]


def order_values(spec: TableSpec, c: str) -> list[Any]:
    return BINLOG_VALUES if c == spec.binlog else ORDER_VALUES[spec.types[c]]


@st.composite
def tables(draw: st.DrawFn) -> TableSpec:
    n_key = draw(st.integers(1, 3))
    n_order = draw(st.integers(1, 2))
    n_other = draw(st.integers(0, 2))
    names = draw(st.permutations(NAMES))[: n_key + n_order + n_other]
    op_column = draw(st.sampled_from(OP_NAMES))
    keys, orders, others = names[:n_key], names[n_key : n_key + n_order], names[n_key + n_order :]
    cols = [(n, draw(st.sampled_from(KEY_TYPES))) for n in keys]
    cols += [(n, draw(st.sampled_from(ORDER_TYPES))) for n in orders]
    cols += [(n, draw(st.sampled_from(OTHER_TYPES))) for n in others]
    cols.append((op_column, "string"))
    deleted = None
    if draw(st.integers(0, 2)) == 0:
        deleted = draw(st.sampled_from(DELETED_NAMES))
        cols.append((deleted, draw(st.sampled_from(sorted(DELETED_VALUES)))))
    text_orders = [n for n, t in cols if n in orders and t == "string"]
    binlog = draw(st.sampled_from(text_orders)) if text_orders and draw(st.booleans()) else None
    columns = tuple(draw(st.permutations(cols)))
    primary_key = tuple(draw(st.permutations(keys)))
    order_by = tuple(draw(st.permutations(orders)))
    return TableSpec(columns, primary_key, order_by, op_column, deleted, draw(st.booleans()), binlog)


def pick(draw: st.DrawFn, values: list[Any], null_one_in: int = 0) -> Any:
    """One of ``values``, or None about once in ``null_one_in`` draws (shrinks towards non-null, first values)."""
    if null_one_in and draw(st.integers(0, null_one_in - 1)) == null_one_in - 1:
        return None
    return draw(st.sampled_from(values))


@dataclass
class Scenario:
    """A table and its steps: ("land", increment, files) / ("compact", crash or None)."""

    spec: TableSpec
    steps: list[tuple[Any, ...]]
    keep_versions: int

    def __repr__(self) -> str:  # hypothesis prints this for a failing example
        lines = [f"table: columns={list(self.spec.columns)} primary_key={list(self.spec.primary_key)}"]
        lines.append(f"       order_by={list(self.spec.order_by)} op_column={self.spec.op_column!r}")
        lines.append(
            f"       deleted={self.spec.deleted!r} load_rows={self.spec.load_rows} binlog={self.spec.binlog!r}"
        )
        lines.append(f"keep_versions={self.keep_versions}")
        for s in self.steps:
            if s[0] == "land":
                lines.append(f"land {s[1]}:")
                for i, rows in enumerate(s[2]):
                    lines.append(f"  part-{i:05d}: {rows}")
            else:
                lines.append(f"compact crash={s[1]}")
        return "\n".join(lines)


#: (fault point, the task it fires in) for ``raise`` crashes inside a compaction run.
CRASH_POINTS = [
    ("plan.after_plan_written", "plan"),
    ("compact.before_stats", "compact"),
    ("publish.before_commit_record", "publish"),
    ("publish.after_commit_record", "publish"),
    ("publish.after_metastore_swap", "publish"),
    ("publish.after_pointer", "publish"),
    ("cleanup.after_first_delete", "publish"),
    ("archive.after_first_copy", "archive"),
    ("archive.after_first_delete", "archive"),
    ("archive.before_marker", "archive"),
    ("refresh_view.after_partitions", "refresh_view"),
]


@st.composite
def scenarios(draw: st.DrawFn, crashes: bool = False) -> Scenario:
    spec = draw(tables())
    types = spec.types
    others = [n for n in spec.data_columns if n not in spec.primary_key and n not in spec.order_by]
    history: list[dict[str, Any]] = []

    def key_of(row: dict[str, Any]) -> dict[str, Any]:
        return {k: row[k] for k in spec.primary_key}

    def fresh() -> dict[str, Any]:
        row = {k: pick(draw, KEY_VALUES[types[k]], 12) for k in spec.primary_key}
        row |= {c: pick(draw, order_values(spec, c), 12) for c in spec.order_by}
        row |= {
            c: pick(draw, DELETED_VALUES[types[c]] if c == spec.deleted else OTHER_VALUES[types[c]], 4) for c in others
        }
        row[spec.op_column] = draw(st.sampled_from(OPS))
        return row

    def next_row() -> dict[str, Any]:
        kind = draw(st.sampled_from(["fresh", "fresh", "redeliver", "late", "key_only_delete"]))
        if kind == "fresh" or not history:
            return fresh()
        old = draw(st.sampled_from(history))
        if kind == "redeliver":  # an exact duplicate of an event already landed
            return dict(old)
        row = fresh() | key_of(old)
        if kind == "late":  # the same key, with the smallest ordering values: older than most
            row |= {c: smallest(spec, c) for c in spec.order_by}
            return row
        # A key-only delete: only key + op + ordering columns are non-null.
        return row | {c: None for c in others} | {spec.op_column: DELETE}

    def smallest(spec: TableSpec, c: str) -> Any:
        if c == spec.binlog:
            return BINLOG_VALUES[0]
        return min(v for v in order_values(spec, c) if v == v)  # v == v: not NaN

    # Distinct increments, landing in random order: a late increment may sort before compacted ones.
    hours = draw(st.lists(st.integers(0, 47), min_size=1, max_size=4, unique=True))
    steps: list[tuple[Any, ...]] = []
    if draw(st.booleans()):
        steps.append(("compact", None))  # a run with nothing pending
    for h in hours:
        name = (datetime(2026, 11, 20, tzinfo=UTC) + timedelta(hours=h)).strftime("increment_%Y%m%d%H")
        files = []
        for _ in range(draw(st.integers(1, 3))):
            rows = [next_row() for _ in range(draw(st.integers(0, 4)))]
            history.extend(rows)
            files.append(rows)
        steps.append(("land", name, files))
        if draw(st.booleans()):
            steps.append(("compact", None))
    if crashes:
        runs = [i for i, s in enumerate(steps) if s[0] == "compact"]
        if not runs:
            steps.append(("compact", None))
            runs = [len(steps) - 1]
        at = draw(st.sampled_from(runs))
        point, task = draw(st.sampled_from(CRASH_POINTS))
        recovery = draw(st.sampled_from(["retry_task", "new_run"]))
        steps[at] = ("compact", (point, task, recovery))
    return Scenario(spec, steps, keep_versions=draw(st.sampled_from([1, 3])))


# ---------------------------------------------------------------- comparing rows
def norm(value: Any, hive_type: str) -> Any:
    """A comparable, printable form: timestamps as UTC microseconds, floats by repr (NaN == NaN, -0.0 != 0.0)."""
    if value is None:
        return None
    if hive_type == "timestamp":
        if isinstance(value, datetime):
            return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        return int(value)
    if hive_type == "double":
        return repr(float(value))
    if hive_type in ("int", "bigint"):
        return int(value)
    return value


def select_exprs(spec: TableSpec, names: list[str]) -> list[str]:
    """Columns by name; timestamps as microseconds, so no Python time zone gets involved."""
    types = spec.types
    return [f"unix_micros(`{n}`) AS `{n}`" if types.get(n) == "timestamp" else f"`{n}`" for n in names]


def select_list(spec: TableSpec, names: list[str]) -> str:
    return ", ".join(select_exprs(spec, names))


def as_tuple(spec: TableSpec, row: dict[str, Any], names: list[str]) -> tuple[Any, ...]:
    types = spec.types
    return tuple(norm(row[n], types.get(n, "string")) for n in names)


def diff(what: str, expect: Counter, got: Counter, names: list[str]) -> list[str]:
    if expect == got:
        return []
    lines = [f"{what} differ (columns {names}):"]
    lines += [f"  - missing:    {r}" for r in sorted((expect - got).elements(), key=repr)]
    lines += [f"  + unexpected: {r}" for r in sorted((got - expect).elements(), key=repr)]
    return lines


# ---------------------------------------------------------------------- harness
_COUNTER = itertools.count(1)


class Harness:
    """One random table through the real task functions, checked against the model after every step."""

    def __init__(self, spark: Any, endpoint: MetastoreEndpoint, root: Path, scn: Scenario) -> None:
        self.spark = spark
        self.scn = scn
        self.spec = scn.spec
        n = next(_COUNTER)
        name = f"g{os.getpid()}_{n}"
        doc = {
            "database": "fuzz",
            "table": name,
            "columns": [{"name": c, "type": t} for c, t in self.spec.columns],
            "primary_key": list(self.spec.primary_key),
            "order_by": list(self.spec.order_by),
            "op_column": self.spec.op_column,
            **({"deleted_column": self.spec.deleted} if self.spec.deleted else {}),
            **({"missing_op": "read"} if self.spec.load_rows else {}),
            **({"order_as": {self.spec.binlog: "binlog_file"}} if self.spec.binlog else {}),
            "storage_root": str(root / name),
            "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
            "schedule": None,
            "retries": 1,
            # Tombstones never expire here: the contract's retention is out of this test's scope.
            "tombstone_retention": "36500d",
            "keep_versions": scn.keep_versions,
            "spark": {"conf": {"spark.sql.shuffle.partitions": "2"}},
            # DuckDB's views are checked against the model too (check_view).
            "views": {"duckdb": str(root / "_duckdb" / f"{name}.sql")},
        }
        self.cfg = parse_table(doc)
        self.rt = Runtime(cfg=self.cfg, lake=Lake(self.cfg), metastore=endpoint, engine=SessionEngine(spark))
        self.model = Model(self.spec)
        self.pending: list[Event] = []
        self.compacted: list[Event] = []
        self.failures: list[str] = []
        self.crashes_fired = 0
        self.runs = 0
        self.pending_files: list[tuple[str, str]] = []
        self.compacted_files: list[tuple[str, str]] = []

    # -- reading ----------------------------------------------------------------------
    def fq(self, suffix: str) -> str:
        return f"`{self.cfg.database}`.`{self.cfg.table}_{suffix}`"

    def query(self, sql: str) -> list[dict[str, Any]]:
        return [r.asDict() for r in self.spark.sql(sql).collect()]

    def refresh(self) -> None:
        for s in ("base", "tombstones", "incremental"):
            self.spark.catalog.refreshTable(self.fq(s))

    def duckdb(self, query: str, names: list[str]) -> list[dict[str, Any]]:
        """``query`` in DuckDB after running the views script the pipeline wrote (timestamps as micros)."""
        import duckdb

        types = self.spec.types
        cols = ", ".join(f'epoch_us("{n}") AS "{n}"' if types.get(n) == "timestamp" else f'"{n}"' for n in names)
        with duckdb.connect() as con:
            con.execute("SET TimeZone = 'UTC'")
            con.execute(Path(str(self.cfg.views.duckdb)).read_text(encoding="utf-8"))
            cur = con.execute(query.format(cols=cols))
            got = [d[0] for d in cur.description]
            return [dict(zip(got, r, strict=True)) for r in cur.fetchall()]

    def counter(self, rows: list[dict[str, Any]] | list[Event], names: list[str]) -> Counter:
        return Counter(as_tuple(self.spec, r.values if isinstance(r, Event) else r, names) for r in rows)

    # -- checks -----------------------------------------------------------------------
    def check(self, where: str, problems: list[str]) -> None:
        self.failures += [f"{where}: {p}" for p in problems]

    def check_view(self, where: str) -> None:
        names = self.spec.data_columns
        visible, _ = self.model.state(self.compacted + self.pending)
        got = self.query(f"SELECT {select_list(self.spec, names)} FROM {self.fq('view')}")
        self.check(where, diff("view rows", self.counter(visible, names), self.counter(got, names), names))
        want = len(self.model.rejected(self.pending))
        n = self.query(f"SELECT count(*) AS n FROM {self.fq('pending_rejects')}")[0]["n"]
        if n != want:
            self.check(where, [f"pending_rejects {n}, model {want}"])
        # The same view in DuckDB, over the files (rendered from the same rule by another dialect).
        db, t = self.cfg.database, self.cfg.table
        got = self.duckdb(f'SELECT {{cols}} FROM "{db}"."{t}_view"', names)
        self.check(where, diff("DuckDB view rows", self.counter(visible, names), self.counter(got, names), names))
        n = self.duckdb(f'SELECT count(*) AS n FROM "{db}"."{t}_pending_rejects"', [])[0]["n"]
        if n != want:
            self.check(where, [f"DuckDB pending_rejects {n}, model {want}"])

    def check_base(self, where: str) -> None:
        names = self.spec.data_columns
        op = self.spec.op_column
        visible, tombstones = self.model.state(self.compacted)
        cols = select_list(self.spec, [*names, op])
        # The base table holds the visible rows and nothing else; the tombstones have a table of their own.
        got_visible = self.query(f"SELECT {cols}, `_cdc_increment`, `_cdc_file` FROM {self.fq('base')}")
        got_tomb = self.query(f"SELECT {cols}, `_cdc_increment`, `_cdc_file` FROM {self.fq('tombstones')}")
        rows = got_visible + got_tomb
        # A reader without a metastore: DuckDB globbing the location the pointer names sees the same rows.
        pointer = self.rt.lake.read_pointer()
        if pointer is not None:
            pattern = posixpath.join(pointer["location"], "*.parquet")
            got = self.duckdb(f"SELECT {{cols}} FROM read_parquet('{pattern}')", names) if glob.glob(pattern) else []
            self.check(where, diff("DuckDB base glob", self.counter(visible, names), self.counter(got, names), names))
        self.check(where, diff("base rows", self.counter(visible, names), self.counter(got_visible, names), names))
        self.check(where, diff("tombstones", self.counter(tombstones, names), self.counter(got_tomb, names), names))
        # Where each winner came from: which of two identical events won is invisible in the rows.
        prov = ["_cdc_increment", "_cdc_file"]
        want = Counter((e.increment, e.file) for e in visible + tombstones)
        self.check(where, diff("winners' provenance", want, Counter(tuple(r[p] for p in prov) for r in rows), prov))

    def check_commits(self, where: str) -> None:
        """Every compacted file in exactly one commit; each commit's refused rows counted and quarantined."""
        lake = self.rt.lake
        seen: Counter = Counter()
        names = [*self.spec.data_columns, self.spec.op_column]
        for seq in lake.commit_seqs():
            commit = lake.read_commit(seq)
            if commit is None or seq == 0:
                continue
            files = {(f["increment"], f["name"]) for f in commit.files}
            seen.update(files)
            events = [e for e in self.compacted if (e.increment, e.file) in files]
            refused = self.model.rejected(events)
            stats = commit.stats
            if int(stats.get("rejected_rows", -1)) != len(refused):
                self.check(where, [f"commit {seq}: rejected_rows {stats.get('rejected_rows')}, model {len(refused)}"])
            reasons = stats.get("rejected_by_reason", {})
            if sum(reasons.values()) != len(refused):
                self.check(where, [f"commit {seq}: rejected_by_reason {reasons} does not add up to {len(refused)}"])
            qdir = lake.layout.quarantine_dir(commit.version)
            got: list[dict[str, Any]] = []
            if os.path.isdir(qdir) and any(p.suffix == ".parquet" for p in Path(qdir).rglob("*")):
                df = self.spark.read.parquet(qdir)
                got = [
                    r.asDict() for r in df.selectExpr(*select_exprs(self.spec, names), "_cdc_reject_reason").collect()
                ]
            self.check(
                where,
                [
                    f"commit {seq}: {x}"
                    for x in diff("quarantined rows", self.counter(refused, names), self.counter(got, names), names)
                ],
            )
            for r in got:
                if r["_cdc_reject_reason"] not in defects(self.spec, r):
                    self.check(where, [f"commit {seq}: reason {r['_cdc_reject_reason']!r} for {r}"])
        twice = sorted(f for f, c in seen.items() if c > 1)
        if twice:
            self.check(where, [f"files in more than one commit: {twice}"])
        if set(seen) != set(self.compacted_files):
            self.check(where, [f"committed files {sorted(seen)} != compacted {sorted(self.compacted_files)}"])

    # -- steps ------------------------------------------------------------------------
    def setup(self) -> None:
        ensure_tables(self.rt)
        refresh_view(self.rt)

    def land(self, increment: str, files: list[list[dict[str, Any]]]) -> None:
        for path in land(self.cfg, increment, files):
            self.pending_files.append((increment, posixpath.basename(path)))
        for i, rows in enumerate(files):
            for pos, row in enumerate(rows):
                ev = Event(
                    tuple((c, row.get(c)) for c, _ in self.spec.columns), increment, f"part-{i:05d}.parquet", pos
                )
                self.pending.append(ev)
                self.model.events.append(ev)

    def task(self, name: str, run_id: str, plan_path: str) -> str:
        result = order.step(name).call(self.rt, plan_path, run_id)
        return result if name == order.PLAN else plan_path

    def one_run(self, run_id: str, crash: tuple[str, str, str] | None) -> None:
        """plan ... refresh_view, as the DAG runs them; a crash fires once, then the operator recovers."""
        plan_path = ""
        for name in [s.id for s in order.between(order.PLAN, order.STEP_IDS[-1])]:
            if order.step(name).takes_plan and not plan_path:
                continue  # nothing pending: the DAG skips to the end
            if crash is not None and crash[1] == name:
                point, _, recovery = crash
                crash = None
                os.environ[faults.ENV] = f"{point}@{self.cfg.qualified_name}=raise"
                fired = False
                try:
                    plan_path = self.task(name, run_id, plan_path)
                except (InjectedFaultError, RuntimeError) as exc:
                    if "injected fault at" not in str(exc):
                        raise
                    fired = True
                finally:
                    # Disarmed before any recovery: the crash fires once.
                    del os.environ[faults.ENV]
                if fired:
                    self.crashes_fired += 1
                    if recovery == "new_run":
                        # The operator gives up on the failed run: breaks its lease, starts another.
                        TableLease(self.rt.lake).break_("fuzz operator")
                        return self.one_run(run_id + "-again", None)
                    plan_path = self.task(name, run_id, plan_path)  # clear the task: Airflow's retry
                continue
            plan_path = self.task(name, run_id, plan_path)
        return None

    def compact(self, crash: tuple[str, str, str] | None) -> None:
        self.runs += 1
        self.one_run(f"run-{self.runs}", crash)
        self.compacted += self.pending
        self.compacted_files += self.pending_files
        self.pending, self.pending_files = [], []

    def run(self) -> None:
        self.setup()
        for i, step in enumerate(self.scn.steps, 1):
            if step[0] == "land":
                self.land(step[1], step[2])
                refresh_view(self.rt)
                self.refresh()
                self.check_view(f"step {i} (land {step[1]})")
            else:
                self.compact(step[1])
                self.refresh()
                where = f"step {i} (compact)"
                self.check_base(where)
                self.check_view(where)
                self.check_commits(where)
            if self.failures:
                return


# ------------------------------------------------------------------------- tests
def run_examples(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture, body: Callable[[], None], counts: dict[str, int]
) -> None:
    try:
        body()
    finally:
        with capsys.disabled():
            print(f"\n{request.node.name}: {counts['examples']} examples, {counts['crashes']} crashes fired")


def check_scenario(spark: Any, endpoint: MetastoreEndpoint, root: Path, scn: Scenario, counts: dict[str, int]) -> None:
    h = Harness(spark, endpoint, root, scn)
    counts["examples"] += 1
    try:
        h.run()
    finally:
        counts["crashes"] += h.crashes_fired
        os.environ.pop(faults.ENV, None)
    assert not h.failures, "\n".join(h.failures)


@pytest.mark.parametrize("merge_path", merge_paths(keep="window"), indirect=True)
def test_events_match_the_model(
    spark: Any,
    endpoint: MetastoreEndpoint,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: Any,
    merge_path: str,
) -> None:
    """Random tables and event streams, compacted at random points; base, view and rejects follow the model.

    Down each merge path of the job (``merge_path``: forced where the table allows it)."""
    counts = {"examples": 0, "crashes": 0}

    @fuzz_settings(test_examples=8)
    @given(scn=scenarios())
    def body(scn: Scenario) -> None:
        check_scenario(spark, endpoint, tmp_path, scn, counts)

    run_examples(request, capsys, body, counts)


@pytest.mark.parametrize("merge_path", merge_paths(keep="broadcast"), indirect=True)
def test_crash_and_recovery_match_the_model(
    spark: Any,
    endpoint: MetastoreEndpoint,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: Any,
    merge_path: str,
) -> None:
    """The same, with one run crashed at a fault point and recovered by a task retry or a new run (each merge path)."""
    counts = {"examples": 0, "crashes": 0}

    @fuzz_settings(test_examples=6)
    @given(scn=scenarios(crashes=True))
    def body(scn: Scenario) -> None:
        check_scenario(spark, endpoint, tmp_path, scn, counts)

    run_examples(request, capsys, body, counts)


# -------------------------------------------------------------- the model itself
def test_the_model_follows_the_contract() -> None:
    """Hand-checked cases of the model (pure Python), so a model bug is not mistaken for a project bug."""
    spec = TableSpec((("ts", "int"), ("id", "int"), ("v", "string"), ("op", "string")), ("id",), ("ts",), "op")

    def ev(row: dict[str, Any], inc: str, file: str = "part-00000.parquet", pos: int = 0) -> Event:
        return Event(tuple((c, row.get(c)) for c, _ in spec.columns), inc, file, pos)

    m = Model(spec)
    a = ev({"id": 1, "ts": 2, "v": "a", "op": "c"}, "increment_2026112201")
    late = ev({"id": 1, "ts": 1, "v": "late", "op": "u"}, "increment_2026112209")
    tie_later_file = ev({"id": 1, "ts": 2, "v": "b", "op": "u"}, "increment_2026112201", "part-00001.parquet")
    tie_earlier_inc = ev({"id": 1, "ts": 2, "v": "c", "op": "u"}, "increment_2026112200", "part-00009.parquet", 9)
    assert m.winners([a, late, tie_later_file, tie_earlier_inc])[(1,)] is tie_later_file
    dele = ev({"id": 1, "ts": 3, "op": "d"}, "increment_2026112200")
    assert m.state([a, dele, late]) == ([], [dele])
    bad = [
        ev({"id": None, "ts": 9, "op": "c"}, "increment_2026112201"),
        ev({"id": 1, "ts": None, "op": "c"}, "increment_2026112201"),
        ev({"id": 1, "ts": 9, "op": "x"}, "increment_2026112201"),
        ev({"id": 1, "ts": 9, "op": None}, "increment_2026112201"),
    ]
    assert m.rejected([a, *bad]) == bad and m.winners([a, *bad])[(1,)] is a
    nan_spec = TableSpec((("id", "int"), ("f", "double"), ("op", "string")), ("id",), ("f",), "op")
    assert defects(nan_spec, {"id": 1, "f": math.nan, "op": "c"}) == {"nan_order_by:f"}
    # -0.0 ties with 0.0: the later position wins.
    x = Event((("id", 1), ("f", -0.0), ("op", "c")), "increment_2026112201", "part-00000.parquet", 1)
    y = Event((("id", 1), ("f", 0.0), ("op", "c")), "increment_2026112201", "part-00000.parquet", 0)
    assert Model(nan_spec).winners([x, y])[(1,)] is x


def test_the_model_follows_the_source_conventions() -> None:
    """Hand-checked cases of the model's delete marker, full-load rows and binlog order (README, "Source presets")."""
    cols = (("id", "int"), ("f", "string"), ("v", "string"), ("gone", "string"), ("op", "string"))
    spec = TableSpec(cols, ("id",), ("f",), "op", deleted="gone", load_rows=True, binlog="f")

    def ev(row: dict[str, Any], pos: int) -> Event:
        return Event(tuple((c, row.get(c)) for c, _ in cols), "increment_2026112201", "part-00000.parquet", pos)

    m = Model(spec)
    # The file number, not the text: mysql-bin.1000000 follows mysql-bin.999999.
    old = ev({"id": 1, "f": "mysql-bin.999999", "v": "old", "op": "c"}, 1)
    new = ev({"id": 1, "f": "mysql-bin.1000000", "v": "new", "op": "u"}, 0)
    assert m.winners([old, new])[(1,)] is new
    # A full-load row (no op, no order) is a read older than every event, even later in the file.
    load = ev({"id": 1, "v": "load"}, 9)
    assert defects(spec, load.values) == set() and m.winners([load, old])[(1,)] is old
    assert m.state([load]) == ([load], [])
    # The marker makes a delete of any code, even an unknown one; other marker values do not.
    marked = ev({"id": 1, "f": "mysql-bin.1000001", "op": "x", "gone": "TRUE"}, 0)
    assert defects(spec, marked.values) == set() and m.state([new, marked]) == ([], [marked])
    kept = ev({"id": 1, "f": "mysql-bin.1000001", "op": "u", "gone": "yes"}, 0)
    assert m.state([new, kept]) == ([kept], [])
    # A name without a number, or with one too long for a BIGINT, is refused; so is a change without order.
    assert defects(spec, {"id": 1, "f": "bin", "op": "c"}) == {"bad_order_by:f"}
    assert defects(spec, {"id": 1, "f": "b.1" + "0" * 18, "op": "c"}) == {"bad_order_by:f"}
    assert defects(spec, {"id": 1, "f": None, "op": "c"}) == {"null_order_by:f"}


# ------------------------------------------- partial rows (registry unchanged), compacted at any time
#: Debezium's placeholder for a Postgres TOAST value an update did not change.
PLACEHOLDER = "__debezium_unavailable_value"


def partial_state(events: list[dict[str, Any]], marker: str) -> list[dict[str, Any]]:
    """The model of a table whose ``bio`` may be left out (README, registry ``unchanged``).

    ``events``: every event landed so far, each with its increment, file and row position.
    Per key, the winner is the greatest (lsn, increment, file, row); a winning delete hides the
    key.  Its ``bio`` is its own, unless the event left it out (the placeholder; NULL under
    ``marker: "null"``): then the ``bio`` of the latest event of the key before it, in that
    order, that carried one; NULL if none did.  Nothing here depends on when compactions ran.
    """

    def left_out(e: dict[str, Any]) -> bool:
        return e["bio"] is None if marker == "null" else e["bio"] == PLACEHOLDER

    def place(e: dict[str, Any]) -> tuple[Any, ...]:
        return (e["lsn"], e["_increment"], e["_file"], e["_pos"])

    rows = []
    for key in sorted({e["id"] for e in events}):
        history = sorted((e for e in events if e["id"] == key), key=place)
        winner = history[-1]
        if winner["op"] == "d":
            continue
        carried = [e for e in history if not left_out(e)]
        bio = winner["bio"] if not left_out(winner) else (carried[-1]["bio"] if carried else None)
        rows.append({"id": key, "bio": bio, "name": winner["name"], "lsn": winner["lsn"]})
    return rows


@dataclass
class PartialStream:
    """Increments of events on a table with a left-out column, in landing order."""

    marker: str
    increments: list[tuple[str, list[list[dict[str, Any]]]]]

    def events(self, upto: int) -> list[dict[str, Any]]:
        """The first ``upto`` increments' events, each with its increment, file and row position."""
        out = []
        for name, files in self.increments[:upto]:
            for f, rows in enumerate(files):
                for pos, row in enumerate(rows):
                    out.append(row | {"_increment": name, "_file": f"part-{f:05d}.parquet", "_pos": pos})
        return out

    def table(self) -> dict[str, Any]:
        unchanged: dict[str, Any] = {"columns": ["bio"], "marker": self.marker}
        columns = [("id", "int"), ("bio", "string"), ("name", "string"), ("op", "string"), ("lsn", "bigint")]
        return {
            "primary_key": ["id"],
            "order_by": ["lsn"],
            "op_column": "op",
            "unchanged": unchanged,
            "columns": [{"name": n, "type": t} for n, t in columns],
        }


@st.composite
def partial_streams(draw: st.DrawFn) -> PartialStream:
    """Few keys and few LSNs, so that events of a key arrive late (older than one compacted) and tie."""
    marker = draw(st.sampled_from(["placeholder", "placeholder", "null"]))
    left = None if marker == "null" else PLACEHOLDER
    bios = ["A", "B", left, left] + ([None] if marker == "placeholder" else [])
    hours = draw(st.lists(st.integers(0, 47), min_size=2, max_size=4, unique=True))
    increments = []
    for h in hours:
        name = (datetime(2026, 11, 20, tzinfo=UTC) + timedelta(hours=h)).strftime("increment_%Y%m%d%H")
        files = []
        for _ in range(draw(st.integers(1, 2))):
            rows = [
                {
                    "id": draw(st.integers(1, 3)),
                    "bio": draw(st.sampled_from(bios)),
                    "name": draw(st.sampled_from(["x", "y", "z"])),
                    "op": draw(st.sampled_from(["c", "u", "u", "u", "d"])),
                    "lsn": draw(st.integers(1, 9)),
                }
                for _ in range(draw(st.integers(1, 4)))
            ]
            files.append(rows)
        increments.append((name, files))
    return PartialStream(marker, increments)


def partial_scenario(stream: PartialStream, name: str, every: bool) -> Any:
    """The stream as a conformance scenario: compacted after every increment, or once after all of them.

    Before each compaction the view (base + pending) must show the model, and after it the base.
    """
    from cdc_compaction.devtools.conformance import Scenario

    steps: list[dict[str, Any]] = []
    n = len(stream.increments)
    for i, (increment, files) in enumerate(stream.increments, 1):
        steps.append({"land": {"increment": increment, "files": files}})
        if every or i == n:
            expect = partial_state(stream.events(i), stream.marker)
            steps.append({"check_view": {"expect": expect, "rejected_pending": 0}})
            steps.append({"compact": {"expect": expect, "rejected": 0}})
    return Scenario(Path(name), name, "generated", stream.table(), steps)


def test_partial_rows_do_not_depend_on_when_compactions_run(
    inprocess: Any, tmp_path: Path, request: pytest.FixtureRequest, capsys: Any
) -> None:
    """Random streams with left-out values and late events: compacting after every increment and compacting
    once give the model's table (and the views over pending events too), in Spark and DuckDB."""
    from cdc_compaction.devtools import conformance as conf

    counts = {"examples": 0, "crashes": 0}
    readers = [conf.Reader(inprocess.spark), conf.DuckDBReader()]

    def row(key: int, bio: Any, lsn: int, op: str = "u") -> dict[str, Any]:
        return {"id": key, "bio": bio, "name": f"n{lsn}", "op": op, "lsn": lsn}

    # The brief's case: key 1 filled at lsn 10 from lsn 5, then an update at lsn 7 arrives late.
    late = PartialStream(
        "placeholder",
        [
            ("increment_2026112000", [[row(1, "A", 5, "c"), row(1, PLACEHOLDER, 10), row(2, PLACEHOLDER, 4)]]),
            ("increment_2026112001", [[row(1, "B", 7), row(2, "C", 2)]]),
        ],
    )
    # The same under marker "null", the late event in an increment that sorts first.
    late_null = PartialStream(
        "null",
        [
            ("increment_2026112005", [[row(1, "A", 5, "c"), row(1, None, 10)]]),
            ("increment_2026112001", [[row(1, "B", 7)], [row(1, None, 8)]]),
        ],
    )

    @fuzz_settings(test_examples=3)
    @given(stream=partial_streams())
    @example(stream=late)
    @example(stream=late_null)
    def body(stream: PartialStream) -> None:
        counts["examples"] += 1
        failures = []
        for every in (True, False):
            name = f"partial_{next(_COUNTER)}_{'every' if every else 'once'}"
            result = conf.run_scenario(partial_scenario(stream, name, every), inprocess, readers, tmp_path / "lake")
            failures += [f"{name}: {f}" for f in result.failures]
        assert not failures, f"{stream}\n" + "\n".join(failures)

    run_examples(request, capsys, body, counts)


def test_the_partial_row_model_fills_from_the_latest_earlier_value() -> None:
    """The model itself, on the brief's example: a late event between the fill's source and the placeholder."""

    def ev(bio: Any, lsn: int, inc: str, op: str = "u") -> dict[str, Any]:
        return {"id": 1, "bio": bio, "name": "n", "op": op, "lsn": lsn, "_increment": inc, "_file": "f", "_pos": 0}

    a = [ev("A", 5, "i0", "c"), ev(PLACEHOLDER, 10, "i0")]
    assert partial_state(a, "placeholder")[0]["bio"] == "A"
    assert partial_state([*a, ev("B", 7, "i1")], "placeholder")[0]["bio"] == "B"
    assert partial_state([*a, ev("B", 3, "i1")], "placeholder")[0]["bio"] == "A"
    assert partial_state([ev(None, 2, "i0"), ev(PLACEHOLDER, 4, "i0")], "placeholder")[0]["bio"] is None
    assert partial_state([ev("A", 2, "i0"), ev(None, 4, "i0")], "null")[0]["bio"] == "A"
    assert partial_state([*a, ev("B", 11, "i1", "d")], "placeholder") == []
