"""The snapshot table mode: scenarios, reference model, rule SQL and Spark functions, held against each other.

(a) every scenario of ``tests/scenarios/snapshot/`` against the reference model (pure Python):
    the scenarios and the model, written separately from one contract, agree;
(b) every scenario through the Spark functions of ``cdc_compaction.job.modes.snapshot``, with the
    rule rendered from ``include/sql/modes/snapshot/_rule.sql.j2`` by the project's own Jinja
    environment (state carried between compactions as the pipeline will: the current table
    and the last applied date), compared with the scenario and with the model;
(c) seed 001's worked example at its proportions (a composite key of 5 columns, 10 value
    columns; day 2: 20 % of the keys deleted and as many new, 40 % updated, 40 % unchanged),
    its counts computed from how the data was made;
(d) random snapshot sequences over a tiny key/value domain (full and delta, dated by name or
    by column, replays, refusals): Spark against the model;
(e) the hash encoding: delimiter-safe, NULL-distinguishing, type-aware, session-independent,
    and exactly the text the contract documents.

Budget: ``make test`` runs a few derandomized examples of (d); ``CDC_FUZZ_EXAMPLES=N`` (as for
``tests/e2e/test_generative.py``, ``make fuzz``) runs N fresh ones.  (d) prints how many it ran.
"""

from __future__ import annotations

import hashlib
import json
import random
import types
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import FUZZ_EXAMPLES, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from models.snapshot_model import (
    Increment,
    Outcome,
    SnapshotTable,
    State,
    compact,
    increment_date,
    mismatches,
    multiset,
    run_scenario,
)
from pyspark.sql import functions as F  # noqa: N812 (the PySpark convention)

from cdc_compaction.core.templates import _env
from cdc_compaction.job.modes import snapshot as job

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios" / "snapshot"
TEMPLATE = "modes/snapshot/_rule.sql.j2"
PROVENANCE_DDL = "`_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint"


def load_scenarios() -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, json.loads(p.read_text())) for p in sorted(SCENARIO_DIR.glob("*.json"))]


SCENARIOS = load_scenarios()


# ------------------------------------------------------------- rendering the rule
def context(table: SnapshotTable) -> types.SimpleNamespace:
    """The template's ``t`` (its attributes are documented at the top of the template)."""
    return types.SimpleNamespace(
        primary_key=list(table.primary_key),
        value_columns=table.value_columns,
        column_types=dict(table.columns),
        delta=table.delta,
        business_date_column=table.business_date_column,
    )


def macros() -> Any:
    return _env().get_template(TEMPLATE).make_module({})


def rule_for(table: SnapshotTable) -> job.SnapshotRule:
    """The rule as the plan will carry it: every macro rendered for ``table``."""
    m, t = macros(), context(table)
    return job.SnapshotRule(
        columns=table.column_names,
        delta=table.delta,
        key_hash=str(m.key_hash(t)).strip(),
        row_hash=str(m.row_hash(t)).strip(),
        reject_reason=str(m.reject_reason(t)).strip(),
        operation=str(m.operation(t)).strip(),
        business_date=str(m.business_date(t)).strip() if table.business_date_column else None,
    )


# ------------------------------------------------------------ the Spark harness
def _spark_value(value: Any, hive_type: str) -> Any:
    """A JSON-like value as Spark's createDataFrame wants it for ``hive_type``."""
    if value is None:
        return None
    t = hive_type.lower()
    if t == "date":
        return date.fromisoformat(value) if isinstance(value, str) else value
    if t in ("double", "float"):
        return float(value)
    return value


def _json_value(value: Any) -> Any:
    """A collected Spark value as the model holds it."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, date):
        return value.isoformat()
    return value


def file_name(i: int) -> str:
    return f"part-{i:05d}.parquet"


def rows_frame(spark: Any, table: SnapshotTable, increments: Sequence[Increment]) -> Any:
    """The increments' rows as the job reads them: the table's columns and their provenance."""
    data = [
        (*[_spark_value(r.get(c), t) for c, t in table.columns], inc.name, file_name(i), pos)
        for inc in increments
        for i, f in enumerate(inc.files)
        for pos, r in enumerate(f)
    ]
    schema = ", ".join(f"`{c}` {t}" for c, t in table.columns) + ", " + PROVENANCE_DDL
    return spark.createDataFrame(data, schema)


def result_rows(df: Any, table: SnapshotTable, extra: Sequence[str] = ()) -> list[Any]:
    """Output rows (the table's columns, ``operation``, ``eff_start_date``) as the model holds them.

    With ``extra`` columns, each row comes as ``(*their values, row)``.
    """
    cols = [*table.column_names, job.OPERATION, job.EFF_START_DATE]
    out = []
    for r in df.select(*[f"`{c}`" for c in [*extra, *cols]]).collect():
        row = {c: _json_value(r[c]) for c in cols}
        out.append((*[r[c] for c in extra], row) if extra else row)
    return out


class SparkTable:
    """A snapshot table's state between Spark compactions: the current table and the history so far."""

    def __init__(self, spark: Any, table: SnapshotTable) -> None:
        self.spark, self.table, self.rule = spark, table, rule_for(table)
        self.current: Any = None
        #: The current table's rows after the last compaction, as the model holds them.
        self.current_rows: list[dict[str, Any]] = []
        self.last_applied: date | None = None
        self.history: dict[str, list[dict[str, Any]]] = {}

    def compact(self, pending: Sequence[Increment]) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any], str]]]:
        """One compaction over ``pending``: its report (the model's shape) and its quarantined rows."""
        rows = job.hashed(rows_frame(self.spark, self.table, pending), self.rule)
        result = job.apply_snapshots(
            self.current,
            rows,
            {inc.name: increment_date(inc.name) for inc in pending},
            self.rule,
            last_applied=self.last_applied,
        )
        self.current = result.current
        self.last_applied = result.last_applied(self.last_applied)
        for _, d in result.applied:
            assert d.isoformat() not in self.history, "a history partition is written once"
            self.history[d.isoformat()] = []
        # The current table and the new history rows in one job (a Spark job costs ~0.5 s on a busy machine).
        both = result.current.withColumn("_side", F.lit("current")).unionByName(
            result.history.withColumn("_side", F.lit("history"))
        )
        self.current_rows = []
        for side, r in result_rows(both, self.table, extra=["_side"]):
            if side == "current":
                self.current_rows.append(r)
            else:
                self.history[r[job.EFF_START_DATE]].append(r)
        report = {
            "counts": result.counts,
            "applied": [name for name, _ in result.applied],
            "replayed": result.replayed,
            "rejected": dict(sorted(result.rejected.items())),
            "refused": dict(sorted(result.refused.items())),
        }
        quarantine = [
            (
                r[job.INCREMENT],
                {c: _json_value(r[c]) for c in self.table.column_names},
                r[job.REJECT_REASON],
            )
            for r in result.refused_rows.collect()
        ]
        return report, quarantine


def quarantine_multiset(table: SnapshotTable, rows: Sequence[tuple[str, dict[str, Any], str]]) -> Counter[Any]:
    return Counter((inc, tuple(multiset([table.normalized(r)])), why) for inc, r, why in rows)


def check_against_model(
    spark_table: SparkTable, state: State, outcome: Outcome, report: dict[str, Any], quarantine: list[Any]
) -> list[str]:
    """How the Spark compaction differs from the model's (empty: it agrees)."""
    table = spark_table.table
    model_step = {"expect": state.current_rows(), "history": state.history_rows(), **outcome.report()}
    problems = mismatches(table, model_step, spark_table.current_rows, spark_table.history, report)
    if quarantine_multiset(table, quarantine) != quarantine_multiset(table, outcome.quarantine):
        problems.append(f"quarantine: model {outcome.quarantine}, spark {quarantine}")
    if spark_table.last_applied != state.last_applied:
        problems.append(f"last applied: model {state.last_applied}, spark {spark_table.last_applied}")
    return problems


# ==================================================================== (a) scenarios vs model
@pytest.mark.parametrize(("name", "doc"), SCENARIOS, ids=[n for n, _ in SCENARIOS])
def test_scenario_against_model(name: str, doc: dict[str, Any]) -> None:
    table = SnapshotTable.from_doc(doc["table"])
    results = run_scenario(doc)
    assert results, f"{name}: no compact step"
    for i, (expected, state, outcome) in enumerate(results):
        problems = mismatches(table, expected, state.current_rows(), state.history_rows(), outcome.report())
        assert not problems, f"{name}, compaction {i + 1}: " + "\n".join(problems)


def test_scenarios_cover_the_contract() -> None:
    """Every operation, refusal and path of the contract appears in some scenario."""
    seen: Counter[str] = Counter()
    for _, doc in SCENARIOS:
        table = doc["table"]
        seen["delta" if table.get("delta") else "full"] += 1
        seen["by_column" if "business_date" in table else "by_name"] += 1
        for step in doc["steps"]:
            if "compact" in step:
                c = step["compact"]
                seen.update(op for op, n in c["counts"].items() if n)
                seen.update(c["rejected"])
                seen.update(c["refused"])
                seen["replayed"] += c["replayed"]
                seen["several_applied"] += len(c["applied"]) > 1
    wanted = {"I", "U", "N", "D", "X", "delta", "full", "by_column", "by_name", "replayed", "several_applied"}
    wanted |= {"duplicate_key", "null_key:id", "empty_snapshot", "mixed_business_date", "null_business_date"}
    assert wanted <= set(seen), sorted(wanted - set(seen))
    assert len(SCENARIOS) >= 8


# ==================================================================== (b) scenarios through Spark
def scenario_steps(doc: dict[str, Any]) -> list[tuple[list[Increment], dict[str, Any]]]:
    """Each compact step with the increments pending at it."""
    out, pending = [], []
    for step in doc["steps"]:
        if "land" in step:
            land = step["land"]
            pending.append(Increment(land["increment"], tuple(tuple(f) for f in land["files"])))
        else:
            out.append((pending, step["compact"]))
            pending = []
    return out


@pytest.mark.parametrize(("name", "doc"), SCENARIOS, ids=[n for n, _ in SCENARIOS])
@pytest.mark.spark
@pytest.mark.metastore
def test_scenario_through_spark(spark: Any, name: str, doc: dict[str, Any]) -> None:
    table = SnapshotTable.from_doc(doc["table"])
    spark_table = SparkTable(spark, table)
    state = State()
    for i, (pending, expected) in enumerate(scenario_steps(doc)):
        report, quarantine = spark_table.compact(pending)
        outcome = compact(table, state, pending)
        where = f"{name}, compaction {i + 1}"
        problems = mismatches(table, expected, spark_table.current_rows, spark_table.history, report)
        assert not problems, f"{where} (against the scenario): " + "\n".join(problems)
        problems = check_against_model(spark_table, state, outcome, report, quarantine)
        assert not problems, f"{where} (against the model): " + "\n".join(problems)
    # The stored hashes are the ones the rule gives the stored values (computed once, kept as they were).
    rule = spark_table.rule
    wrong = spark_table.current.filter(
        f"{job.KEY_HASH} <> {rule.key_hash} OR {job.ROW_HASH} <> {rule.row_hash}".replace("\n", " ")
    ).count()
    assert wrong == 0


# ==================================================================== (c) seed 001's worked example
SEED_KEYS, SEED_VALUES = 5, 10


Rows = list[dict[str, Any]]


def seed_example_days(rows: int, rng: random.Random) -> tuple[Rows, Rows, dict[str, set[Any]]]:
    """Day 1 and day 2 of seed 001's example, and which day-1 keys were deleted, updated, kept; which are new.

    Keys: 5 random hex strings (uuid-like); values: 10 random integers.  Day 2: 20 % of the
    day-1 keys deleted and replaced by as many new keys, 40 % updated (one value changed),
    40 % unchanged.
    """

    def key() -> tuple[str, ...]:
        return tuple(f"{rng.getrandbits(64):016x}" for _ in range(SEED_KEYS))

    def row(k: tuple[str, ...], values: list[int]) -> dict[str, Any]:
        return {**{f"k{i}": k[i] for i in range(SEED_KEYS)}, **{f"v{i}": values[i] for i in range(SEED_VALUES)}}

    keys = [key() for _ in range(rows)]
    values = {k: [rng.randrange(1_000_000) for _ in range(SEED_VALUES)] for k in keys}
    day1 = [row(k, values[k]) for k in keys]
    order = list(keys)
    rng.shuffle(order)
    deleted, updated, kept = order[: rows // 5], order[rows // 5 : rows * 3 // 5], order[rows * 3 // 5 :]
    new = [key() for _ in deleted]
    day2: list[dict[str, Any]] = []
    for k in updated:
        changed = list(values[k])
        col = rng.randrange(SEED_VALUES)
        changed[col] += 1  # a real change: never the old value
        day2.append(row(k, changed))
    day2 += [row(k, values[k]) for k in kept]
    day2 += [row(k, [rng.randrange(1_000_000) for _ in range(SEED_VALUES)]) for k in new]
    rng.shuffle(day2)
    groups = {"deleted": set(deleted), "updated": set(updated), "kept": set(kept), "new": set(new)}
    return day1, day2, groups


@pytest.mark.spark
@pytest.mark.metastore
def test_seed_001_worked_example(spark: Any) -> None:
    rows = 2_000
    day1, day2, groups = seed_example_days(rows, random.Random(1))
    table = SnapshotTable(
        columns=(
            *[(f"k{i}", "string") for i in range(SEED_KEYS)],
            *[(f"v{i}", "bigint") for i in range(SEED_VALUES)],
        ),
        primary_key=tuple(f"k{i}" for i in range(SEED_KEYS)),
    )
    st_ = SparkTable(spark, table)
    report1, _ = st_.compact([Increment("increment_2026061800", (tuple(day1),))])
    assert report1["counts"] == {"I": rows, "U": 0, "N": 0, "D": 0, "X": 0}
    report2, quarantine = st_.compact([Increment("increment_2026061900", (tuple(day2),))])

    fifth = rows // 5
    assert len(day2) == rows
    # The seed's table: the current object by operation (I 20 %, U 40 %, N 40 % of day 2's rows).
    by_op = Counter(r[job.OPERATION] for r in st_.current_rows)
    assert by_op == {"I": fifth, "U": 2 * fifth, "N": 2 * fifth}
    assert report2["counts"] == {"I": fifth, "U": 2 * fifth, "N": 2 * fifth, "D": fifth, "X": 0}
    assert quarantine == [] and report2["rejected"] == {}

    # History: day 1 all inserts; day 2 the inserts, the updates and the deletes (with their last values).
    def key_of(r: dict[str, Any]) -> tuple[str, ...]:
        return tuple(r[f"k{i}"] for i in range(SEED_KEYS))

    assert Counter(r[job.OPERATION] for r in st_.history["2026-06-18"]) == {"I": rows}
    day2_history = st_.history["2026-06-19"]
    assert Counter(r[job.OPERATION] for r in day2_history) == {"I": fifth, "U": 2 * fifth, "D": fifth}
    by_key = {key_of(r): r for r in day2_history}
    assert {k for k, r in by_key.items() if r[job.OPERATION] == "D"} == groups["deleted"]
    assert {k for k, r in by_key.items() if r[job.OPERATION] == "U"} == groups["updated"]
    assert {k for k, r in by_key.items() if r[job.OPERATION] == "I"} == groups["new"]
    day1_by_key = {key_of(r): r for r in day1}
    assert all(
        {c: r[c] for c in table.column_names} == day1_by_key[k] for k, r in by_key.items() if r[job.OPERATION] == "D"
    )
    assert {r[job.EFF_START_DATE] for r in day2_history} == {"2026-06-19"}
    # N keeps the day-1 date, I and U take day 2's.
    assert {(r[job.OPERATION], r[job.EFF_START_DATE]) for r in st_.current_rows} == {
        ("N", "2026-06-18"),
        ("U", "2026-06-19"),
        ("I", "2026-06-19"),
    }


#: Keys ('a|b','c') and ('a','b|c') are both in the domain: a delimiter-joined hash would merge them.
K1, K2 = ["a", "a|b"], ["c", "b|c"]
VALUES = [None, "", "x"]
NUMBERS = [None, 0, 1]
DAY0 = date(2026, 11, 22)


def fuzz_table(delta: bool, by_column: bool) -> SnapshotTable:
    cols = [("k1", "string"), ("k2", "string"), ("v", "string"), ("n", "bigint")]
    if by_column:
        cols.append(("as_of", "date"))
    return SnapshotTable(tuple(cols), ("k1", "k2"), delta, "as_of" if by_column else None)


@st.composite
def snapshot_sequences(draw: st.DrawFn) -> tuple[SnapshotTable, list[list[Increment]]]:
    """A table (full or delta, dated by name or by column) and compactions of random increments.

    Increment names fall on 4 days, two hours each, in a random landing order, so same-day
    exports, late exports (replays) and several snapshots per compaction all happen.  Each
    export holds each of the 4 keys or not, with values from a tiny domain (so unchanged rows
    are common), one of them sometimes twice (a duplicate key), sometimes with rows of a NULL key part,
    sometimes none at all; its rows are spread over one or two files.  Dated by column, an export sometimes has one
    row of another date or of none.
    """
    table = fuzz_table(draw(st.booleans()), draw(st.booleans()))
    slots = [(day, hour) for day in range(4) for hour in (0, 7)]
    # At least three exports: with fewer, most examples would be first loads (all I).  They land
    # in name order, but sometimes one lands late (after the compaction of a later one: a replay).
    chosen = sorted(draw(st.lists(st.sampled_from(slots), min_size=3, max_size=6, unique=True)))
    if draw(st.booleans()):
        late = chosen.pop(draw(st.integers(0, len(chosen) - 2)))
        chosen.insert(draw(st.integers(chosen.index(max(chosen)), len(chosen))), late)
    keys = [(k1, k2) for k1 in K1 for k2 in K2]
    last: dict[tuple[str, str], tuple[Any, Any]] = {}
    increments = []
    for day, hour in chosen:
        d = DAY0 + timedelta(days=day)
        name = f"increment_{datetime(d.year, d.month, d.day, hour, tzinfo=UTC):%Y%m%d%H}"
        rows = []
        for k1, k2 in keys:
            for _ in range(draw(st.sampled_from([1, 0, 1, 1, 0, 1]))):
                # Often the key's values of the export landed before: an unchanged row.
                if (k1, k2) in last and draw(st.booleans()):
                    v, n = last[(k1, k2)]
                else:
                    v, n = draw(st.sampled_from(VALUES)), draw(st.sampled_from(NUMBERS))
                last[(k1, k2)] = (v, n)
                rows.append({"k1": k1, "k2": k2, "v": v, "n": n})
        if rows and draw(st.sampled_from([False, False, True])):
            # A second row of a key the export holds (mostly one the table holds too): a duplicate key.
            twin = dict(rows[draw(st.integers(0, len(rows) - 1))])
            if draw(st.booleans()):
                twin["v"] = draw(st.sampled_from(VALUES))
            rows.append(twin)
        for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
            k1 = draw(st.sampled_from([*K1, None]))
            rows.append({"k1": k1, "k2": None if k1 else draw(st.sampled_from([*K2, None])), "v": "x", "n": 0})
        if draw(st.sampled_from([False] * 4 + [True])):
            rows = [r for r in rows if r["k1"] is None or r["k2"] is None]  # an empty export (but for NULL keys)
        rows = draw(st.permutations(rows))
        if table.business_date_column:
            # Mostly the export's own day (or another day than its name's: the column decides).
            own = d if draw(st.booleans()) else DAY0 + timedelta(days=draw(st.integers(0, 3)))
            for r in rows:
                r["as_of"] = own.isoformat()
            anomaly = draw(st.sampled_from(["none"] * 6 + ["other", "null"]))
            if rows and anomaly != "none":
                rows[draw(st.integers(0, len(rows) - 1))]["as_of"] = (
                    None if anomaly == "null" else (own + timedelta(days=1)).isoformat()
                )
        cut = draw(st.integers(0, len(rows))) if draw(st.booleans()) else len(rows)
        files = (tuple(rows[:cut]), tuple(rows[cut:])) if cut < len(rows) else (tuple(rows),)
        increments.append(Increment(name, files))
    cuts = draw(st.lists(st.booleans(), min_size=len(increments), max_size=len(increments)))
    compactions: list[list[Increment]] = [[]]
    for inc, cut_here in zip(increments, cuts, strict=True):
        compactions[-1].append(inc)
        if cut_here:
            compactions.append([])
    return table, [c for c in compactions if c]


@pytest.mark.spark
@pytest.mark.metastore
def test_random_snapshot_sequences_spark_vs_model(spark: Any, capsys: Any, request: pytest.FixtureRequest) -> None:
    counts: Counter[str] = Counter()

    @fuzz_settings(test_examples=15)
    @given(snapshot_sequences())
    def body(example: tuple[SnapshotTable, list[list[Increment]]]) -> None:
        table, compactions = example
        counts["examples"] += 1
        spark_table, state = SparkTable(spark, table), State()
        for i, pending in enumerate(compactions):
            report, quarantine = spark_table.compact(pending)
            before = set(state.current)
            outcome = compact(table, state, pending)
            # A duplicate of a key the table holds, in a full snapshot: the key must stay (X), not go (D).
            counts["duplicate_of_current_key_in_full"] += sum(
                not table.delta and why == "duplicate_key" and table.key(r) in before
                for _, r, why in outcome.quarantine
            )
            counts["compactions"] += 1
            counts.update(f"op:{op}" for op, n in outcome.counts.items() for _ in range(n))
            counts.update(f"refused:{r}" for r, n in outcome.refused.items() for _ in range(n))
            counts["replayed"] += outcome.replayed
            problems = check_against_model(spark_table, state, outcome, report, quarantine)
            assert not problems, f"compaction {i + 1} of {compactions}: " + "\n".join(problems)

    try:
        body()
    finally:
        with capsys.disabled():
            print(f"\n{request.node.name}: {counts['examples']} examples; {dict(sorted(counts.items()))}")
    if FUZZ_EXAMPLES:
        return
    # The derandomized examples reach every operation and path (else the generator has gone stale).
    wanted = {"op:I", "op:U", "op:N", "op:D", "op:X", "replayed", "duplicate_of_current_key_in_full"}
    wanted |= {"refused:empty_snapshot", "refused:mixed_business_date"}
    assert wanted <= {k for k, n in counts.items() if n}, sorted(wanted - {k for k, n in counts.items() if n})


# ==================================================================== (e) the hash encoding
def documented_hash(texts: Sequence[str | None]) -> str:
    """The contract's hash, written from its words: '-' for NULL, else '<length>:<text>', concatenated, SHA-256."""
    return hashlib.sha256("".join("-" if t is None else f"{len(t)}:{t}" for t in texts).encode()).hexdigest()


def hash_sql(columns: dict[str, str]) -> str:
    """The rule's row hash over ``columns`` (name -> type), all of them value columns."""
    t = types.SimpleNamespace(
        primary_key=[], value_columns=list(columns), column_types=columns, delta=False, business_date_column=None
    )
    return str(macros().row_hash(t)).strip()


def spark_hashes(spark: Any, columns: dict[str, str], rows: list[tuple[Any, ...]]) -> list[str]:
    schema = ", ".join(f"`{c}` {t}" for c, t in columns.items())
    df = spark.createDataFrame(rows, schema)
    return [r[0] for r in df.selectExpr(f"{hash_sql(columns)} AS h").collect()]


STRING_PAIRS = [
    ("a|b", "c"),
    ("a", "b|c"),
    (None, ""),
    ("", None),
    ("", ""),
    (None, None),
    ("1:a", ""),
    ("", "1:a"),
    ("-", None),
    (None, "-"),
    ("0:", "-"),
]


@pytest.mark.spark
@pytest.mark.metastore
def test_hash_keeps_delimiters_and_nulls_apart(spark: Any) -> None:
    columns = {"a": "string", "b": "string"}
    hashes = spark_hashes(spark, columns, STRING_PAIRS)
    assert len(set(hashes)) == len(STRING_PAIRS), dict(zip(STRING_PAIRS, hashes, strict=True))
    # ... and each is exactly the documented text's SHA-256.
    assert hashes == [documented_hash(p) for p in STRING_PAIRS]
    assert spark_hashes(spark, {"a": "string"}, [(None,), ("",)]) == [documented_hash([None]), documented_hash([""])]
    # A table of key columns only: one row hash for every row.
    assert hash_sql({}) == "sha2('', 256)"


@pytest.mark.spark
@pytest.mark.metastore
def test_hash_is_type_aware(spark: Any) -> None:
    columns = {"i": "int", "d": "double", "m": "decimal(10,2)", "b": "boolean", "dt": "date", "bin": "binary"}
    rows = [
        (1, 1.5, Decimal("1.5"), True, date(2026, 11, 22), b"\xff\x00"),
        (None, float("nan"), None, False, None, b""),
        (None, float("nan"), None, False, None, None),
        (1, -0.0, Decimal("1.5"), True, date(2026, 11, 22), b"\xff\x00"),
        (1, 0.0, Decimal("1.5"), True, date(2026, 11, 22), b"\xff\x00"),
    ]
    hashes = spark_hashes(spark, columns, rows)
    assert hashes[0] == documented_hash(["1", "1.5", "1.50", "true", "2026-11-22", "FF00"])
    # NaN is one value (the same hash twice); an empty binary is not NULL; -0.0 is not 0.0.
    assert hashes[1] == documented_hash([None, "NaN", None, "false", None, ""])
    assert hashes[2] == documented_hash([None, "NaN", None, "false", None, None])
    assert hashes[3] != hashes[4]


@pytest.mark.spark
@pytest.mark.metastore
def test_timestamp_hash_does_not_depend_on_the_session_time_zone(spark: Any) -> None:
    instant = datetime(2026, 11, 22, 9, 30, 0, 123456, tzinfo=UTC)
    micros = str((instant - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1))
    before = spark.conf.get("spark.sql.session.timeZone")
    seen = []
    try:
        for zone in ("UTC", "America/Los_Angeles", "Asia/Kolkata"):
            spark.conf.set("spark.sql.session.timeZone", zone)
            seen += spark_hashes(spark, {"ts": "timestamp"}, [(instant,)])
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert seen == [documented_hash([micros])] * 3


def test_hash_encoding_is_written_once() -> None:
    """Key and row hash are the one ``hash_of`` macro over different columns; the text parses as SQL."""
    import sqlglot

    table = fuzz_table(delta=False, by_column=True)
    rule = rule_for(table)
    m, t = macros(), context(table)
    assert rule.key_hash == str(m.hash_of(t, ["k1", "k2"])).strip()
    assert rule.row_hash == str(m.hash_of(t, ["v", "n"])).strip()  # the business-date column is not compared
    assert "as_of" not in rule.row_hash
    for sql in (rule.key_hash, rule.row_hash, rule.reject_reason, rule.operation, rule.business_date):
        assert sql
        for dialect in ("spark", "hive"):
            assert sqlglot.transpile(sql, read="spark", write=dialect)
    delta_rule = rule_for(fuzz_table(delta=True, by_column=False))
    assert "TRUE THEN 'X'" in delta_rule.operation.replace("\n", " ")
    assert delta_rule.business_date is None


def test_documented_hash_examples() -> None:
    """The README's worked encodings, in pure Python."""
    assert documented_hash(["a|b", "c"]) == hashlib.sha256(b"3:a|b1:c").hexdigest()
    assert documented_hash(["a", "b|c"]) == hashlib.sha256(b"1:a3:b|c").hexdigest()
    assert documented_hash([None]) != documented_hash([""])
    assert len(documented_hash([])) == 64


def test_history_of_a_key_gives_its_versions() -> None:
    """eff_end is derivable: a key's history rows in date order, each version ending at the next date."""
    doc = next(d for n, d in SCENARIOS if n == "deleted_key_comes_back")
    _, state, _ = run_scenario(doc)[-1]
    versions: dict[Any, list[tuple[str, str]]] = defaultdict(list)
    for d, rows in state.history_rows().items():
        for r in rows:
            versions[r["id"]].append((d, r["operation"]))
    assert versions[1] == [("2026-11-22", "I"), ("2026-11-23", "D"), ("2026-11-24", "I")]
    assert versions[2] == [("2026-11-22", "I")]


# ------------------------------------------------------------- (f) the Airflow side (modes/snapshot.py)
def _registry_table(**overrides: Any) -> Any:
    from cdc_compaction.core.registry import parse_table

    doc = {
        "mode": "snapshot",
        "database": "tests",
        "table": "accounts",
        "columns": [{"name": "id", "type": "int"}, {"name": "v", "type": "string"}, {"name": "as_of", "type": "date"}],
        "primary_key": ["id"],
        "storage_root": "/lake/tests/accounts",
        **overrides,
    }
    return parse_table(doc)


def test_the_mode_hands_the_job_the_rule_it_reads() -> None:
    """The plan's rule is what SnapshotRule.from_dict reads, rendered as the Spark tests render it."""
    from cdc_compaction.core import sql
    from cdc_compaction.core.mode import mode_of

    cfg = _registry_table(business_date={"column": "as_of"}, delta=True)
    rule = sql.rule_sql(cfg).to_dict()
    assert job.SnapshotRule.from_dict(rule).to_dict() == rule
    model_table = SnapshotTable(
        columns=(("id", "int"), ("v", "string"), ("as_of", "date")),
        primary_key=("id",),
        delta=True,
        business_date_column="as_of",
    )
    assert rule == rule_for(model_table).to_dict()
    assert mode_of(cfg).name == "snapshot"


def test_plan_fields_carry_the_business_dates_and_the_last_applied_date() -> None:
    from cdc_compaction.core.lake import GENESIS, Commit
    from cdc_compaction.core.mode import mode_of

    cfg = _registry_table()
    mode = mode_of(cfg)
    assert mode.plan_fields(cfg, GENESIS) == {"primary_key": ["id"], "delta": False}
    dated = _registry_table(business_date={"column": "as_of"})
    assert mode.plan_fields(dated, GENESIS)["business_date_column"] == "as_of"
    parent = Commit(
        2, "v2", "p", "r", 1, [], [], outputs={"history": {"2026-11-22": "/a", "2026-11-24": "/b", "2026-11-23": "/c"}}
    )
    assert mode.plan_fields(cfg, parent)["last_applied"] == "2026-11-24"
    # The UTC date of the increment's hour: every hour of a day is that day.
    assert mode.plan_increments(cfg, ["increment_2026112200", "increment_2026112223", "increment_2026112301"]) == {
        "business_dates": {
            "increment_2026112200": "2026-11-22",
            "increment_2026112223": "2026-11-22",
            "increment_2026112301": "2026-11-23",
        }
    }


def _good_stats() -> dict[str, Any]:
    """Stats of a compaction over a 3-key table: day 2 (I 1, U 1, N 1, D 1 of 3 keys) applied, a replay, a refusal."""
    return {
        "mode": "snapshot",
        "base_rows": 3,
        "increment_rows": 7,
        "rejected_rows": 2,
        "rejected_by_reason": {"null_key:id": 2},
        "rejected_by_file": {"increment_2026112300/part-00000.parquet": 2},
        "output_rows": 3,
        "output_visible_rows": 3,
        "output_tombstones": 0,
        "duplicate_keys": 0,
        "misplaced_rows": 0,
        "counts": {"I": 1, "U": 1, "N": 1, "D": 1, "X": 0},
        "steps": [["increment_2026112300", "2026-11-23", {"I": 1, "U": 1, "N": 1, "D": 1, "X": 0}]],
        "applied": [["increment_2026112300", "2026-11-23"]],
        "replayed": 1,
        "rejected": {"null_key:id": 2},
        "refused": {"empty_snapshot": 1},
        "increments": {
            "increment_2026112200": "replayed",
            "increment_2026112300": "applied",
            "increment_2026112400": "refused:empty_snapshot",
        },
        "last_applied": "2026-11-22",
        "history": {"2026-11-23": {"location": "/v/history/eff_start_date=2026-11-23", "rows": 3}},
    }


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({}, None),
        ({"base_rows": 4}, "the current table had 4 keys, but U 1 + N 1 + D 1 + X 0 = 3 were classified"),
        (
            {"output_visible_rows": 4, "output_rows": 4},
            "the applied snapshots leave 3 keys, but the current table has 4",
        ),
        ({"history": {"2026-11-23": {"location": "/x", "rows": 2}}}, "history partition 2026-11-23 holds 2 rows"),
        ({"counts": {"I": 2, "U": 1, "N": 1, "D": 1, "X": 0}}, "are not the sum of each snapshot's"),
        ({"replayed": 0}, "3 increments, but 1 applied + 0 replayed"),
        ({"last_applied": "2026-11-23"}, "not after the last applied date 2026-11-23"),
        ({"rejected": {}}, "refused rows do not reconcile"),
        ({"rejected_by_file": {}}, "0 rows were quarantined, but 2 refused"),
        ({"duplicate_keys": 1}, "1 keys appear more than once"),
        ({"output_tombstones": 1}, "a snapshot table keeps none"),
        ({"mode": "keyless"}, "not of a snapshot compaction"),
    ],
)
def test_count_problems_holds_the_job_to_the_contract(change: dict[str, Any], fragment: str | None) -> None:
    from cdc_compaction.core.mode import mode_named

    problems = mode_named("snapshot").count_problems({**_good_stats(), **change})
    if fragment is None:
        assert problems == []
    else:
        assert any(fragment in p for p in problems), problems


def test_the_outputs_and_docs_of_a_snapshot_table() -> None:
    from cdc_compaction.core import sql
    from cdc_compaction.core.mode import mode_of

    cfg = _registry_table(business_date={"column": "as_of"})
    mode = mode_of(cfg)
    assert mode.view_columns(cfg) == [
        ("id", "int"),
        ("v", "string"),
        ("as_of", "date"),
        ("operation", "string"),
        ("eff_start_date", "date"),
    ]
    assert mode.column_roles(cfg) == {"id": ["key 1"], "v": ["compared"], "as_of": ["business date (not compared)"]}
    docs = "\n".join(mode.doc_lines(cfg))
    assert "accounts_history" in docs and "no view over pending snapshots yet" in docs
    base_ddl = sql.create_statements(
        cfg, base_location="/b", tombstones_location="/t", incremental_location="/i", compactor_location="/c"
    )[1]
    order = ["`as_of` date", "`operation` string", "`eff_start_date` date", "`_cdc_key_hash`", "`_cdc_increment`"]
    assert [base_ddl.index(c) for c in order] == sorted(base_ddl.index(c) for c in order)
    history = sql.render_mode("create_history.sql.j2", cfg, location="/lake/tests/accounts/base")
    assert "PARTITIONED BY (`eff_start_date`)" in history and "`eff_start_date` string" in history
    assert "`eff_start_date` date" not in history
