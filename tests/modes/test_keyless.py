"""The keyless table mode: its scenarios, its reference model, its rule SQL and its Spark job, held against each other.

(a) every scenario of ``tests/scenarios/keyless/`` against the reference model (pure Python): the
    scenarios and the model, written separately from one contract, agree;
(b) every scenario through the real pipeline is ``tests/modes/test_scenarios.py`` (the job, validate,
    publish and the views, read by Spark and DuckDB);
(c) random event streams (tiny value domain, so equal rows collide; before-images mostly taken
    from the source's rows; random increments, files, replays and compaction points): Spark
    against the model;
(d) the model itself against examples computed by hand, and its own properties.

Budget: ``make test`` runs a few derandomized examples of (c); ``CDC_FUZZ_EXAMPLES=N`` (the variable
``make fuzz`` sets for ``tests/e2e/test_generative.py``) runs N fresh ones.  Each generative test prints
how many examples it ran and what they exercised.
"""

from __future__ import annotations

import functools
import json
import math
import types
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from models.keyless_model import (
    NAN,
    Event,
    KeylessModel,
    KeylessTable,
    Outcome,
    canonical,
    file_name,
    mismatches,
    multiset,
    run_scenario,
)

from cdc_compaction.core.templates import _env
from cdc_compaction.job.modes import keyless as job

from . import streams as streams_base

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios" / "keyless"
TEMPLATE = "modes/keyless/_rule.sql.j2"
PROVENANCE_DDL = "`_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint"
FLOAT_TYPES = ("float", "double")


def load_scenarios() -> list[tuple[str, dict[str, Any]]]:
    docs = [(p.stem, json.loads(p.read_text())) for p in sorted(SCENARIO_DIR.glob("*.json"))]
    assert len(docs) >= 8, f"expected the keyless scenarios in {SCENARIO_DIR}"
    return docs


SCENARIOS = load_scenarios()
SCENARIO_IDS = [name for name, _ in SCENARIOS]


# -------------------------------------------------------------- the rendered rule
def context(table: KeylessTable) -> types.SimpleNamespace:
    """What the template sees as ``t`` (the product will build it from the registry)."""
    codes = types.SimpleNamespace(create="c", read="r", update="u", delete="d")
    return types.SimpleNamespace(
        data_columns=table.data_columns,
        before_columns=table.before_columns,
        # The delivery position: order_by then event_id (README, "Idempotency: the watermark").
        order_by=list(table.position),
        event_id=list(table.event_id),
        nan_order_by=[c for c in table.position if table.types[c].lower() in FLOAT_TYPES],
        op_column=table.op_column,
        op_codes=codes,
        op_codes_all=[codes.create, codes.read, codes.update, codes.delete],
    )


def macros() -> Any:
    return _env().get_template(TEMPLATE).make_module({})


@functools.lru_cache(maxsize=32)
def rule_for(table: KeylessTable) -> dict[str, str]:
    """The rule as the job gets it: rendered over the job's relation names."""
    m, t, r = macros(), context(table), job.rule_arguments()
    return {
        "reject_reason": str(m.reject_reason(t)).strip(),
        "event_fates": str(m.event_fates(t, r["events"], r["watermark"])).strip(),
        "event_counts": str(m.event_counts(t, r["fates"])).strip(),
        "new_watermark": str(m.new_watermark(t, r["fates"])).strip(),
        "value_counts": str(m.value_counts(t, r["base"], r["fates"])).strip(),
        "copies": str(m.copies(t, r["counts"])).strip(),
    }


VIEW_BASE, VIEW_INCREMENTAL, VIEW_WATERMARK = "_t_keyless_base", "_t_keyless_incremental", "_t_keyless_watermark"


@functools.lru_cache(maxsize=32)
def view_sql(table: KeylessTable) -> tuple[str, str]:
    """(the view's query, the pending-rejects count) over the raw pending increments, as a view would read them."""
    m, t = macros(), context(table)
    reason = str(m.reject_reason(t)).strip()
    valid = f"(SELECT * FROM `{VIEW_INCREMENTAL}` WHERE ({reason}) IS NULL)"
    query = str(m.new_state(t, f"`{VIEW_BASE}`", valid, f"`{VIEW_WATERMARK}`")).strip()
    return query, f"SELECT COUNT(*) AS n FROM `{VIEW_INCREMENTAL}` WHERE ({reason}) IS NOT NULL"


# ------------------------------------------------------------ the Spark side
def _spark_value(value: Any, hive_type: str) -> Any:
    if value is not None and hive_type.lower() in FLOAT_TYPES:
        return float(value)  # JSON's 1 is an int; Spark's DoubleType will not take one
    return value


class SparkKeyless:
    """One keyless table on the Spark side: committed rows and watermark, pending events."""

    def __init__(self, spark: Any, table: KeylessTable) -> None:
        self.spark, self.table = spark, table
        self.rows: list[tuple[Any, ...]] = []
        self.watermark: list[Any] | None = None
        self.pending: list[Event] = []
        types_ = table.types
        self.data_ddl = ", ".join(f"`{c}` {types_[c]}" for c in table.data_columns)
        self.events_ddl = ", ".join(f"`{n}` {t}" for n, t in table.columns) + ", " + PROVENANCE_DDL

    def land(self, increment: str, files: Sequence[Sequence[dict[str, Any]]]) -> None:
        for i, rows in enumerate(files):
            self.pending += [Event(dict(r), increment, file_name(i), pos) for pos, r in enumerate(rows)]

    def base(self) -> Any:
        return self.spark.createDataFrame(self.rows, self.data_ddl)

    def events(self) -> Any:
        cols = self.table.columns
        rows = [(*(_spark_value(e.row.get(n), t) for n, t in cols), e.increment, e.file, e.pos) for e in self.pending]
        return self.spark.createDataFrame(rows, self.events_ddl)

    def compact(self) -> dict[str, Any]:
        """One compaction, committed the way the pipeline will: the rows written, the watermark recorded."""
        out, stats = job.compact_keyless(
            self.spark, self.base(), self.events(), rule_for(self.table), self.table.position, self.watermark
        )
        self.rows = [tuple(r) for r in out.collect()]
        self.watermark, self.pending = stats["new_watermark"], []
        return stats

    def view(self) -> tuple[list[tuple[Any, ...]], int]:
        """(the view's rows, rejected_pending): base + pending increments, not committed."""
        query, rejects = view_sql(self.table)
        frames = {
            VIEW_BASE: self.base(),
            VIEW_INCREMENTAL: self.events(),
            VIEW_WATERMARK: job.watermark_frame(self.spark, self.events(), self.table.position, self.watermark),
        }
        try:
            for name, df in frames.items():
                df.createOrReplaceTempView(name)
            rows = [tuple(r) for r in self.spark.sql(query).collect()]
            rejected = int(self.spark.sql(rejects).first()["n"])
        finally:
            for name in frames:
                self.spark.catalog.dropTempView(name)
        return rows, rejected


def stats_counts(stats: dict[str, Any]) -> dict[str, int]:
    """The job's counts under the model's (and the scenario format's) names."""
    return {
        "rejected": stats["rejected_rows"],
        "replayed": stats["replayed_rows"],
        "superseded": stats["superseded_rows"],
        "applied": stats["applied_rows"],
        "unmatched_removals": stats["unmatched_removals"],
    }


def outcome_counts(o: Outcome) -> dict[str, int]:
    return {
        "rejected": o.rejected,
        "replayed": o.replayed,
        "superseded": o.superseded,
        "applied": o.applied,
        "unmatched_removals": o.unmatched_removals,
    }


def compare_compaction(where: str, stats: dict[str, Any], rows: list[tuple[Any, ...]], o: Outcome) -> list[str]:
    """How the job's compaction differs from the model's (rows as multisets, every count, the watermark)."""
    out = []
    if multiset(rows) != o.multiset:
        out.append(f"{where}: Spark rows {dict(multiset(rows))} != model {dict(o.multiset)}")
    if stats_counts(stats) != outcome_counts(o):
        out.append(f"{where}: Spark counts {stats_counts(stats)} != model {outcome_counts(o)}")
    spark_wm = None if stats["new_watermark"] is None else canonical(stats["new_watermark"])
    model_wm = None if o.watermark is None else canonical(o.watermark)
    if spark_wm != model_wm:
        out.append(f"{where}: Spark watermark {spark_wm} != model {model_wm}")
    if stats["output_rows"] != len(rows):
        out.append(f"{where}: output_rows {stats['output_rows']} but {len(rows)} rows")
    if dict(stats["rejected_by_reason"]) != dict(o.rejected_by_reason):
        out.append(f"{where}: rejected_by_reason {stats['rejected_by_reason']} != model {dict(o.rejected_by_reason)}")
    return out


def compare_view(where: str, rows: list[tuple[Any, ...]], rejected: int, o: Outcome) -> list[str]:
    out = []
    if multiset(rows) != o.multiset:
        out.append(f"{where}: view rows {dict(multiset(rows))} != model {dict(o.multiset)}")
    if rejected != o.rejected:
        out.append(f"{where}: view rejected_pending {rejected} != model {o.rejected}")
    return out


# ------------------------------------------------- (a) the scenarios against the model
@pytest.mark.parametrize("name,doc", SCENARIOS, ids=SCENARIO_IDS)
def test_scenario_agrees_with_the_model(name: str, doc: dict[str, Any]) -> None:
    table = KeylessTable.from_doc(doc["table"])
    assert doc["name"] == name and doc["about"]
    results = run_scenario(doc)
    assert results and results[-1].kind == "compact", "a scenario ends with a compaction"
    problems = []
    for r in results:
        if r.kind == "compact":
            assert "rejected" in r.expected, f"step {r.index}: compact must expect rejected"
        problems += mismatches(table, r, r.outcome.rows, outcome_counts(r.outcome))
    assert not problems, "\n".join(problems)


def test_engine_specific_sql_stays_in_copies() -> None:
    """Everything but ``copies`` is plain joins, windows and aggregates (it is to be translated to other engines)."""
    t = shape_table("binlog")
    rule = rule_for(t)
    for key, text in rule.items():
        found = [w for w in ("LATERAL VIEW", "explode(", "sequence(") if w in text]
        assert bool(found) == (key == "copies"), f"{key}: {found}"
    # The view's query inlines the same macros: copies once, over the counts over the fates.
    query, _ = view_sql(t)
    assert query.count("LATERAL VIEW") == 1 and query.count("row_number()") == 1


# ---------------------------------------------- (b) the scenarios through Spark
# tests/modes/test_scenarios.py runs every scenario through the real pipeline (the job, validate,
# publish and the views in Spark and DuckDB); the random streams below hold the job against the model.


DATA_VALUES = (("a", 1), ("a", None), ("b", 1), (None, None))  # tiny: equal rows and NULLs collide often
#: order_by shapes: (columns, the order_by values of sequence number n, in that order).
SHAPES: dict[str, tuple[tuple[tuple[str, str], ...], Callable[[int], tuple[Any, ...]]]] = {
    "lsn": ((("lsn", "bigint"),), lambda n: (n,)),
    # Binlog-like: file number, then position within the file (4 events per file).
    "binlog": ((("file_no", "int"), ("pos", "bigint")), lambda n: (n // 4, (n % 4) * 10)),
    "ts": ((("ts", "double"),), lambda n: (n * 0.5,)),
}


def shape_table(shape: str) -> KeylessTable:
    ob, _ = SHAPES[shape]
    cols = (("name", "string"), ("n", "int"), ("op", "string"), *ob, ("_before_name", "string"), ("_before_n", "int"))
    return KeylessTable(cols, "op", tuple(c for c, _ in ob))


class Stream(streams_base.Stream):
    """A shape and its actions, its files named as the model names them."""

    def file_name(self, i: int) -> str:
        return file_name(i)

    def header(self) -> str:
        return f"shape {self.shape}: order_by {shape_table(self.shape).order_by}"


@st.composite
def streams(draw: st.DrawFn, collisions: bool = True, defects: bool = True, max_events: int = 14) -> Stream:
    """A source log replicated through increments, with the mishaps the contract allows for."""
    shape = draw(st.sampled_from(sorted(SHAPES)))
    ob_cols, seq_values = SHAPES[shape]
    ob = [c for c, _ in ob_cols]
    source: list[tuple[Any, Any]] = []  # the source table, so that most before-images exist
    events: list[dict[str, Any]] = []
    n = 0
    for _ in range(draw(st.integers(1, max_events))):
        op = draw(st.sampled_from("crud"))
        # Mostly a row the source holds; sometimes any value (a removal that may find no copy).
        from_source = source and draw(st.integers(0, 2)) > 0
        before = draw(st.sampled_from(source)) if from_source else draw(st.sampled_from(DATA_VALUES))
        # An update that rewrites a row with the same values is not rare in real logs.
        same = op == "u" and draw(st.integers(0, 2)) == 0
        after = before if same else draw(st.sampled_from(DATA_VALUES))
        # A sequence value shared with the previous event: one log position delivered as two events.
        if not (collisions and events and draw(st.integers(0, 9)) == 0):
            n += 1
        row: dict[str, Any] = {"op": op, **dict(zip(ob, seq_values(n), strict=True))}
        if op != "d":
            row["name"], row["n"] = after
        if op in "ud":
            row["_before_name"], row["_before_n"] = before
        defect = draw(st.integers(0, 24)) if defects else 99
        if defect == 0:
            row["op"] = None
        elif defect == 1:
            row["op"] = "x"
        elif defect == 2:
            row[ob[-1]] = None
        elif defect == 3:
            row[ob[0]] = math.nan if shape == "ts" else None
        else:
            if op in "ud" and before in source:
                source.remove(before)
            if op != "d":
                source.append(after)
        events.append(row)

    increments = [inc for inc in streams_base.cuts(draw, events, 4) if inc]
    actions: list[tuple[Any, ...]] = []
    landed: list[list[list[dict[str, Any]]]] = []
    pending = False

    def land(files: list[list[dict[str, Any]]]) -> None:
        nonlocal pending
        actions.append(("land", f"increment_{2026112200 + len(landed)}", files))
        landed.append(files)
        pending = True

    for inc in increments:
        # Files in any order, rows in a file in any order: only order_by may decide.
        land(streams_base.cuts(draw, draw(st.permutations(inc)), 3))
        if draw(st.integers(0, 3)) == 0:
            actions.append(("view",))
        if draw(st.booleans()):
            actions.append(("compact",))
            pending = False
        if draw(st.integers(0, 2)) == 0:
            # At-least-once delivery: an increment landed already (compacted or not) arrives again.
            land(draw(st.sampled_from(landed)))
    if pending:
        actions += [("view",), ("compact",)]
    return Stream(shape, actions)


def play_model(stream: Stream) -> tuple[KeylessModel, list[Outcome]]:
    model = KeylessModel(shape_table(stream.shape))
    outs = []
    for a in stream.actions:
        if a[0] == "land":
            model.land(a[1], a[2])
        else:
            outs.append(model.view() if a[0] == "view" else model.compact())
    return model, outs


def run_examples(request: pytest.FixtureRequest, capsys: Any, body: Callable[[], None], counts: Counter[str]) -> None:
    try:
        body()
    finally:
        with capsys.disabled():
            seen = ", ".join(f"{n} {k}" for k, n in counts.items() if k not in ("examples", "compactions"))
            print(f"\n{request.node.name}: {counts['examples']} examples, {counts['compactions']} compactions; {seen}")


@pytest.mark.spark
@pytest.mark.metastore
def test_random_streams_spark_matches_the_model(spark: Any, request: pytest.FixtureRequest, capsys: Any) -> None:
    """Random streams, increments, replays and compaction points: the job and the view follow the model."""
    counts: Counter[str] = Counter()

    @fuzz_settings(test_examples=12)
    @given(stream=streams())
    def body(stream: Stream) -> None:
        counts["examples"] += 1
        table = shape_table(stream.shape)
        model, side = KeylessModel(table), SparkKeyless(spark, table)
        problems: list[str] = []
        for i, a in enumerate(stream.actions):
            if a[0] == "land":
                model.land(a[1], a[2])
                side.land(a[1], a[2])
            elif a[0] == "view":
                rows, rejected = side.view()
                problems += compare_view(f"action {i}", rows, rejected, model.view())
            else:
                counts["compactions"] += 1
                stats = side.compact()
                problems += compare_compaction(f"action {i}", stats, side.rows, model.compact())
                # What the examples exercised, for the summary line.
                for k in ("rejected_rows", "replayed_rows", "superseded_rows", "unmatched_removals"):
                    counts[k] += stats[k]
            assert not problems, "\n".join(problems)

    run_examples(request, capsys, body, counts)


# -------------------------------------------------------- (d) the model itself
SEED = KeylessTable(
    (
        ("name", "string"),
        ("op", "string"),
        ("binlog_file", "int"),
        ("binlog_pos", "bigint"),
        ("_before_name", "string"),
    ),
    "op",
    ("binlog_file", "binlog_pos"),
)


def test_model_seed_003_by_hand() -> None:
    """Seed 003's customers table by hand: three inserts, two updates of one copy each, two back, two deletes."""
    m = KeylessModel(SEED)

    def ev(op: str, pos: int, name: str | None = None, before: str | None = None, file: int = 3) -> dict[str, Any]:
        return {"name": name, "op": op, "binlog_file": file, "binlog_pos": pos, "_before_name": before}

    m.land("increment_2026112200", [[ev("c", 10, "alice"), ev("c", 20, "alice"), ev("c", 30, "Bob")]])
    # Two equal rows stay two rows.
    assert m.view().multiset == Counter({("alice",): 2, ("Bob",): 1})
    out = m.compact()
    assert (out.applied, out.unmatched_removals, out.watermark) == (3, 0, (3, 30))
    # Each update finds one copy of alice: one changes, the other is still there.
    m.land("increment_2026112201", [[ev("u", 40, "Alyce", "alice")]])
    assert m.view().multiset == Counter({("Alyce",): 1, ("alice",): 1, ("Bob",): 1})
    m.land("increment_2026112202", [[ev("u", 50, "Alyce", "alice")]])
    assert m.compact().multiset == Counter({("Alyce",): 2, ("Bob",): 1})
    # The binlog rotates: (4, 5) comes after (3, 60) although 5 < 60.
    m.land("increment_2026112203", [[ev("u", 5, "Alice", "Alyce", file=4), ev("u", 60, "Alice", "Alyce")]])
    assert m.view().multiset == Counter({("Alice",): 2, ("Bob",): 1})
    m.land("increment_2026112204", [[ev("d", 7, "Alice", "Alice", file=4), ev("d", 9, None, "Alice", file=4)]])
    out = m.compact()
    assert out.multiset == Counter({("Bob",): 1})
    assert (out.applied, out.unmatched_removals, out.watermark) == (4, 0, (4, 9))


def test_model_replays_superseded_and_unmatched() -> None:
    t = shape_table("lsn")

    def ev(op: str, lsn: int | None, after: tuple[Any, Any] = (None, None), before: tuple[Any, Any] = (None, None)):
        return {
            "op": op,
            "lsn": lsn,
            "name": after[0],
            "n": after[1],
            "_before_name": before[0],
            "_before_n": before[1],
        }

    m = KeylessModel(t)
    m.land("increment_2026112200", [[ev("c", 1, ("a", 1)), ev("c", 2, ("a", 1)), ev("d", 3, before=("b", 1))]])
    out = m.compact()
    # The delete of b finds no copy: counted, nothing changes; the watermark is the greatest lsn applied.
    assert (out.multiset, out.unmatched_removals, out.watermark) == (Counter({("a", 1): 2}), 1, (3,))
    # Redelivery of lsn 2..3 plus one new event, and the new event delivered twice in one run.
    m.land("increment_2026112201", [[ev("c", 2, ("a", 1)), ev("d", 3, before=("b", 1)), ev("d", 4, before=("a", 1))]])
    m.land("increment_2026112202", [[ev("d", 4, before=("a", 1))]])
    out = m.compact()
    assert (out.replayed, out.superseded, out.applied, out.unmatched_removals) == (2, 1, 1, 0)
    assert out.multiset == Counter({("a", 1): 1}) and out.watermark == (4,)
    # Nothing applied (a replay only): the watermark stays.
    m.land("increment_2026112203", [[ev("c", 1, ("z", 9))]])
    out = m.compact()
    assert (out.replayed, out.applied, out.watermark) == (1, 0, (4,))
    # NULL equals NULL; an update whose before equals its after is a no-op on an existing copy.
    m.land("increment_2026112204", [[ev("c", 5, (None, None)), ev("u", 6, (None, None), (None, None))]])
    assert m.compact().multiset == Counter({("a", 1): 1, (None, None): 1})


def test_model_refuses_in_the_readmes_order() -> None:
    t = shape_table("binlog")
    m = KeylessModel(t)
    assert m.reject_reason({"op": None, "file_no": None, "pos": 1}) == "null_order_by:file_no"
    assert m.reject_reason({"op": "x", "file_no": 1, "pos": None}) == "null_order_by:pos"
    assert m.reject_reason({"op": None, "file_no": 1, "pos": 1}) == "null_op"
    assert m.reject_reason({"op": "U", "file_no": 1, "pos": 1}) == "unknown_op"
    assert m.reject_reason({"op": "u", "file_no": 1, "pos": 1}) is None
    f = KeylessModel(shape_table("ts"))
    assert f.reject_reason({"op": "c", "ts": math.nan}) == "nan_order_by:ts"
    # event_id columns after the order_by ones, under their own reason.
    cols = (("v", "int"), ("op", "string"), ("commit", "bigint"), ("row", "bigint"), ("_before_v", "int"))
    e = KeylessModel(KeylessTable(cols, "op", ("commit",), event_id=("row",)))
    assert e.reject_reason({"op": "c", "commit": None, "row": None}) == "null_order_by:commit"
    assert e.reject_reason({"op": "c", "commit": 1, "row": None}) == "null_event_id:row"
    # NaN inside data columns is a value like any other, equal to itself.
    assert canonical([math.nan, None]) == (NAN, None)
    assert multiset([(math.nan,), (math.nan,)]) == Counter({(NAN,): 2})


def test_model_table_shape_is_checked() -> None:
    with pytest.raises(ValueError, match="before columns"):
        KeylessTable((("name", "string"), ("op", "string"), ("lsn", "bigint")), "op", ("lsn",))
    with pytest.raises(ValueError, match="before columns"):
        KeylessTable(
            (("name", "string"), ("op", "string"), ("lsn", "bigint"), ("_before_name", "string"), ("_before_x", "int")),
            "op",
            ("lsn",),
        )
    t = KeylessTable((("v", "int"), ("op", "string"), ("seq", "bigint"), ("old_v", "int")), "op", ("seq",), "old_")
    assert (t.data_columns, t.before_columns) == (["v"], ["old_v"])


def test_model_compaction_points_do_not_matter(request: pytest.FixtureRequest, capsys: Any) -> None:
    """Delivered in sequence order (replays allowed, no two events sharing a sequence value), compacting
    after every increment, once at the end, or at the stream's random points gives the same table."""
    counts: Counter[str] = Counter()

    @fuzz_settings(test_examples=300)
    @given(stream=streams(collisions=False))
    def body(stream: Stream) -> None:
        counts["examples"] += 1
        model, _ = play_model(stream)
        lands = [a for a in stream.actions if a[0] == "land"]
        every = KeylessModel(shape_table(stream.shape))
        once = KeylessModel(shape_table(stream.shape))
        for a in lands:
            every.land(a[1], a[2])
            o = every.compact()
            counts["replayed_rows"] += o.replayed
            counts["superseded_rows"] += o.superseded
            once.land(a[1], a[2])
        once.compact()
        assert model.rows == every.rows == once.rows
        assert model.watermark == every.watermark == once.watermark
        counts["compactions"] += sum(1 for a in stream.actions if a[0] == "compact")

    run_examples(request, capsys, body, counts)


# ---------------------------------------------------------- NaN on the Spark side
@pytest.mark.spark
@pytest.mark.metastore
def test_nan_on_spark(spark: Any) -> None:
    """Scenario files cannot hold NaN: a NaN order_by value is refused, a NaN data value matches NaN."""
    t = KeylessTable(
        (("x", "double"), ("op", "string"), ("ts", "double"), ("_before_x", "double")),
        "op",
        ("ts",),
    )
    files = [
        [
            {"x": math.nan, "op": "c", "ts": 1.0},
            {"x": math.nan, "op": "c", "ts": 2.0},
            {"x": 1.0, "op": "c", "ts": math.nan},
            {"op": "d", "ts": 3.0, "_before_x": math.nan},
        ]
    ]
    model, side = KeylessModel(t), SparkKeyless(spark, t)
    model.land("increment_2026112200", files)
    side.land("increment_2026112200", files)
    rows, rejected = side.view()
    assert not compare_view("view", rows, rejected, model.view())
    stats = side.compact()
    out = model.compact()
    assert not compare_compaction("compact", stats, side.rows, out)
    assert stats["rejected_by_reason"] == {"nan_order_by:ts": 1}
    assert out.multiset == Counter({(NAN,): 1}) and out.unmatched_removals == 0
