"""The append table mode: its scenarios, its reference model, its views in every dialect and its Spark job.

(a) every scenario of ``tests/scenarios/append/`` against the reference model (pure Python): the
    scenarios and the model, written separately from one contract, agree;
(b) every scenario through the real pipeline (the job, validate, publish, the views read by Spark
    through the metastore and by DuckDB), and one as a real DAG run, are in
    ``tests/modes/test_scenarios.py``;
(c) random event streams (a tiny id domain, so re-deliveries collide within an increment, across
    increments and with the base; NULL ids, update/delete/unknown ops; random increments, files,
    re-landed increments and compaction points): the Spark job, the Spark SQL view and the DuckDB
    view (both rendered for their dialect, executed over real Parquet files) against the model, and
    compacting after every increment == once == the model;
(d) the registry's refusals, the Hive rendering through Hive's own parser, Trino's and DuckDB's
    renderings parsed, and the model against examples computed by hand.

Budget: ``make test`` runs a few derandomized examples of (c) on Spark; ``CDC_FUZZ_EXAMPLES=N`` runs N
fresh ones.  Each generative test prints how many examples it ran and what they exercised.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot
from conftest import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from models.append_model import AppendModel, AppendTable, Outcome, file_name, mismatches, multiset, run_scenario
from pydantic import ValidationError

from cdc_compaction.core import dialects, duckdb_views, sql
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.job.modes import append as job

from . import streams as streams_base

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios" / "append"
PROVENANCE_DDL = "`_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint"


def load_scenarios() -> list[tuple[str, dict[str, Any]]]:
    docs = [(p.stem, json.loads(p.read_text())) for p in sorted(SCENARIO_DIR.glob("*.json"))]
    assert len(docs) >= 7, f"expected the append scenarios in {SCENARIO_DIR}"
    return docs


SCENARIOS = load_scenarios()
SCENARIO_IDS = [name for name, _ in SCENARIOS]


# ------------------------------------------------- (a) the scenarios against the model
@pytest.mark.parametrize("name,doc", SCENARIOS, ids=SCENARIO_IDS)
def test_scenario_agrees_with_the_model(name: str, doc: dict[str, Any]) -> None:
    table = AppendTable.from_doc(doc["table"])
    assert doc["name"] == name and doc["about"]
    results = run_scenario(doc)
    assert results and results[-1].kind == "compact", "a scenario ends with a compaction"
    problems = []
    for r in results:
        if r.kind == "compact":
            assert "rejected" in r.expected, f"step {r.index}: compact must expect rejected"
        problems += mismatches(table, r, r.outcome.rows, r.outcome.counts())
    assert not problems, "\n".join(problems)


def test_the_scenarios_cover_the_brief() -> None:
    assert set(SCENARIO_IDS) >= {
        "insert_only",
        "redelivery_within_one_increment",
        "redelivery_across_increments",
        "redelivery_after_compaction",
        "null_event_id_rejected",
        "op_codes_refused",
        "no_pending",
    }


# ------------------------------------------------------------ the table under test
def registry_table(table: AppendTable, root: Path, name: str = "events") -> TableConfig:
    """The registry entry of the model's table shape (the project's side: rule, views, job)."""
    doc: dict[str, Any] = {
        "mode": "append",
        "database": "fuzz",
        "table": name,
        "columns": [{"name": n, "type": t} for n, t in table.columns],
        "event_id": list(table.event_id),
        "storage_root": str(root / "lake"),
        "views": {"metastore": ["spark", "hive", "trino"], "duckdb": str(root / "views.sql")},
    }
    if table.op_column is not None:
        doc["op_column"] = table.op_column
    return parse_table(doc)


_ARROW = {"bigint": pa.int64(), "int": pa.int32(), "string": pa.string()}


def _arrow_schema(table: AppendTable, extra: Sequence[tuple[str, pa.DataType]] = ()) -> pa.Schema:
    return pa.schema([(n, _ARROW[t]) for n, t in table.columns] + list(extra))


STORED_EXTRA = (
    ("_cdc_increment", pa.string()),
    ("_cdc_file", pa.string()),
    ("_cdc_pos", pa.int64()),
    ("_cdc_ingested_at", pa.timestamp("us")),
)


@dataclass(frozen=True)
class Event:
    row: dict[str, Any]
    increment: str
    file: str
    pos: int


class SparkAppend:
    """One append table on the project's side: committed rows (Spark job), pending events as Parquet files.

    The job (``compact_append``) is driven directly with DataFrames; the views are the rendered
    ``<t>_view``/``<t>_pending_rejects`` queries of two dialects, executed by Spark SQL over temporary
    views of real Parquet files, and by DuckDB over the same kind of files, as ``duckdb_views`` names them.
    """

    def __init__(self, spark: Any, table: AppendTable, root: Path, rule: dict[str, Any], cfg: TableConfig) -> None:
        self.spark, self.table, self.root, self.rule, self.cfg = spark, table, root, rule, cfg
        self.rows: list[tuple[Any, ...]] = []
        self.pending: list[Event] = []
        self.landed: list[tuple[str, list[list[dict[str, Any]]]]] = []
        self.ddl = ", ".join(f"`{n}` {t}" for n, t in table.columns)
        self.generation = 0

    def land(self, increment: str, files: Sequence[Sequence[dict[str, Any]]]) -> None:
        self.landed.append((increment, [list(f) for f in files]))
        for i, rows in enumerate(files):
            self.pending += [Event(dict(r), increment, file_name(i), pos) for pos, r in enumerate(rows)]

    def compact(self) -> dict[str, Any]:
        names = self.table.names
        base = self.spark.createDataFrame(self.rows, self.ddl)
        events = self.spark.createDataFrame(
            [(*(e.row.get(n) for n in names), e.increment, e.file, e.pos) for e in self.pending],
            f"{self.ddl}, {PROVENANCE_DDL}",
        )
        appended, stats = job.compact_append(self.spark, base, events, self.rule)
        self.rows += [tuple(r[n] for n in names) for r in appended.collect()]
        self.pending, self.landed = [], []
        return stats

    # ---------------------------------------------------------- the views, on files
    def _write_files(self) -> tuple[list[str], list[str], str, list[str]]:
        """(DuckDB's pending files, the base's files, Spark's pending root, Spark's pending files)."""
        self.generation += 1
        here = self.root / f"g{self.generation}"
        schema = _arrow_schema(self.table)
        duck, spark_files = [], []
        for inc, files in self.landed:
            for i, rows in enumerate(files):
                tbl = pa.Table.from_pylist([{n: r.get(n) for n in self.table.names} for r in rows], schema=schema)
                # DuckDB: <increment>/<file>, as the landing area holds them.
                d = here / "incremental" / inc / file_name(i)
                d.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(tbl, d)
                duck.append(str(d))
                # Spark: a partition directory per increment, as the metastore's <t>_incremental reads them.
                s = here / "spark_incremental" / f"_cdc_increment={inc}" / file_name(i)
                s.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(tbl, s)
                spark_files.append(str(s))
        base_rows = [{**dict(zip(self.table.names, r, strict=True))} for r in self.rows]
        base_file = here / "base" / "part-00000.parquet"
        base_file.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(base_rows, schema=_arrow_schema(self.table, STORED_EXTRA)), base_file)
        return duck, [str(base_file)], str(here / "spark_incremental"), spark_files

    def views(self) -> dict[str, tuple[list[tuple[Any, ...]], int]]:
        """dialect -> (the view's rows, the pending rejects' count): base + pending, not committed."""
        duck_files, base_files, spark_root, spark_files = self._write_files()
        out = {}
        files = duckdb_views.Files(data=base_files, pending=duck_files)
        names = sql.table_names(self.cfg)
        with duckdb.connect() as con:
            con.execute(duckdb_views.script(self.cfg, files))
            cols = ", ".join(f'"{n}"' for n in self.table.names)
            rows = con.execute(f'SELECT {cols} FROM "fuzz"."{names["view_name"]}"').fetchall()
            (rejects,) = con.execute(f'SELECT count(*) FROM "fuzz"."{names["rejects_view"]}"').fetchone()
        out["duckdb"] = ([tuple(r) for r in rows], int(rejects))

        # Spark: path queries (parquet.`<dir>`), which expose the files' _metadata as the metastore's tables do.
        def files_of(path: str) -> sqlglot.exp.Table:
            return sqlglot.exp.Table(
                this=sqlglot.exp.to_identifier(path, quoted=True), db=sqlglot.exp.to_identifier("parquet")
            )

        base_dir = str(Path(base_files[0]).parent)
        src = {
            dialects.BASE: files_of(base_dir),
            dialects.TOMBSTONES: files_of(base_dir),
            dialects.INCREMENTAL: files_of(spark_root),
        }
        view = dialects.query(self.cfg, "view", "spark", src)
        rejects_q = dialects.query(self.cfg, "rejects", "spark", src)
        assert spark_files, "a view point follows a landing"
        rows = [tuple(r) for r in self.spark.sql(view).collect()]
        rejects = self.spark.sql(f"SELECT count(*) AS n FROM ({rejects_q}) r").first()["n"]
        out["spark"] = (rows, int(rejects))
        return out


def stats_counts(stats: dict[str, Any]) -> dict[str, int]:
    """The job's counts under the model's names."""
    return {
        "rejected": stats["rejected_rows"],
        "replayed": stats["replayed_rows"],
        "superseded": stats["superseded_rows"],
        "appended": stats["appended_rows"],
    }


def compare_compaction(where: str, stats: dict[str, Any], rows: list[tuple[Any, ...]], o: Outcome) -> list[str]:
    out = []
    if multiset(rows) != o.multiset:
        out.append(f"{where}: Spark rows {dict(multiset(rows))} != model {dict(o.multiset)}")
    if stats_counts(stats) != o.counts():
        out.append(f"{where}: Spark counts {stats_counts(stats)} != model {o.counts()}")
    if dict(stats["rejected_by_reason"]) != dict(o.rejected_by_reason):
        out.append(f"{where}: rejected_by_reason {stats['rejected_by_reason']} != model {dict(o.rejected_by_reason)}")
    return out


def compare_views(where: str, views: dict[str, tuple[list[tuple[Any, ...]], int]], o: Outcome) -> list[str]:
    out = []
    for dialect, (rows, rejected) in views.items():
        if multiset(rows) != o.multiset:
            out.append(f"{where} ({dialect}): view rows {dict(multiset(rows))} != model {dict(o.multiset)}")
        if rejected != o.rejected:
            out.append(f"{where} ({dialect}): pending rejects {rejected} != model {o.rejected}")
    return out


# ---------------------------------------------------------------- random streams
#: Table shapes: a single bigint id; a composite (source, offset) id with an op column.
SHAPES: dict[str, AppendTable] = {
    "single": AppendTable((("id", "bigint"), ("v", "string")), ("id",)),
    "composite_op": AppendTable(
        (("src", "string"), ("off", "bigint"), ("v", "string"), ("op", "string")), ("src", "off"), "op"
    ),
}
PAYLOADS = ("a", "b", None)


class Stream(streams_base.Stream):
    """A shape and its actions, its files named as the model names them."""

    def file_name(self, i: int) -> str:
        return file_name(i)


@st.composite
def streams(draw: st.DrawFn, max_events: int = 14) -> Stream:
    """An event log delivered at least once through increments, with the defects the contract refuses."""
    shape = draw(st.sampled_from(sorted(SHAPES)))
    table = SHAPES[shape]
    events: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, max_events))):
        # A tiny id domain: the same id comes back often (a re-delivery, maybe with another payload).
        n = draw(st.integers(0, 5))
        row: dict[str, Any] = {"v": draw(st.sampled_from(PAYLOADS))}
        if shape == "single":
            row["id"] = n
        else:
            row["src"], row["off"] = ("s" + str(n % 2), n // 2)
            row["op"] = draw(st.sampled_from(["c", "c", "c", "r", "u", "d", "x", None]))
        if draw(st.integers(0, 9)) == 0:
            row[draw(st.sampled_from(table.event_id))] = None  # a NULL event id: refused
        events.append(row)

    increments = [inc for inc in streams_base.cuts(draw, events, 4) if inc]
    actions: list[tuple[Any, ...]] = []
    landed: list[list[list[dict[str, Any]]]] = []

    def land(files: list[list[dict[str, Any]]]) -> None:
        actions.append(("land", f"increment_{2026112200 + len(landed)}", files))
        landed.append(files)

    pending = False
    for inc in increments:
        # Files in any order, rows in a file in any order.
        land(streams_base.cuts(draw, draw(st.permutations(inc)), 3))
        pending = True
        if draw(st.integers(0, 3)) == 0:
            actions.append(("view",))
        if draw(st.booleans()):
            actions.append(("compact",))
            pending = False
        if draw(st.integers(0, 2)) == 0:
            # At-least-once delivery: an increment landed already (compacted or not) arrives again.
            land(draw(st.sampled_from(landed)))
            pending = True
    if pending:
        actions += [("view",), ("compact",)]
    return Stream(shape, actions)


def run_examples(request: pytest.FixtureRequest, capsys: Any, body: Callable[[], None], counts: Counter[str]) -> None:
    try:
        body()
    finally:
        with capsys.disabled():
            seen = ", ".join(f"{n} {k}" for k, n in counts.items() if k not in ("examples", "compactions"))
            print(f"\n{request.node.name}: {counts['examples']} examples, {counts['compactions']} compactions; {seen}")


def test_model_compaction_points_do_not_matter(request: pytest.FixtureRequest, capsys: Any) -> None:
    """Compacting after every increment, once at the end, or at the stream's random points: the same table."""
    counts: Counter[str] = Counter()

    @fuzz_settings(test_examples=300)
    @given(stream=streams())
    def body(stream: Stream) -> None:
        counts["examples"] += 1
        table = SHAPES[stream.shape]
        at_points, every, once = AppendModel(table), AppendModel(table), AppendModel(table)
        for a in stream.actions:
            if a[0] == "land":
                for m in (at_points, every, once):
                    m.land(a[1], a[2])
                o = every.compact()
                counts["replayed"] += o.replayed
                counts["superseded"] += o.superseded
                counts["rejected"] += o.rejected
            elif a[0] == "compact":
                counts["compactions"] += 1
                at_points.compact()
        once.compact()
        assert multiset(at_points.rows) == multiset(every.rows) == multiset(once.rows)
        # No event id twice, whatever the deliveries.
        ids = [tuple(r[table.names.index(c)] for c in table.event_id) for r in once.rows]
        assert len(ids) == len(set(ids))

    run_examples(request, capsys, body, counts)


@pytest.mark.spark
@pytest.mark.metastore
def test_random_streams_spark_and_views_match_the_model(
    spark: Any, tmp_path: Path, request: pytest.FixtureRequest, capsys: Any
) -> None:
    """Random streams: the job at the stream's compaction points and once at the end, and the Spark SQL and
    DuckDB views at its view points, all equal the model."""
    counts: Counter[str] = Counter()
    setups: dict[str, tuple[TableConfig, dict[str, Any]]] = {}
    for shape, table in SHAPES.items():
        cfg = registry_table(table, tmp_path / shape)
        setups[shape] = (cfg, dict(sql.rule_sql(cfg)))

    @fuzz_settings(test_examples=8)
    @given(stream=streams())
    def body(stream: Stream) -> None:
        counts["examples"] += 1
        table = SHAPES[stream.shape]
        cfg, rule = setups[stream.shape]
        root = tmp_path / f"ex{counts['examples']}"
        model, side = AppendModel(table), SparkAppend(spark, table, root, rule, cfg)
        once, once_side = AppendModel(table), SparkAppend(spark, table, root / "once", rule, cfg)
        problems: list[str] = []
        for i, a in enumerate(stream.actions):
            if a[0] == "land":
                for m in (model, side, once, once_side):
                    m.land(a[1], a[2])
            elif a[0] == "view":
                counts["views"] += 1
                problems += compare_views(f"action {i}", side.views(), model.view())
            else:
                counts["compactions"] += 1
                stats = side.compact()
                problems += compare_compaction(f"action {i}", stats, side.rows, model.compact())
                for k in ("rejected_rows", "replayed_rows", "superseded_rows"):
                    counts[k] += stats[k]
            assert not problems, "\n".join(problems)
        stats = once_side.compact()
        problems += compare_compaction("once at the end", stats, once_side.rows, once.compact())
        if multiset(once_side.rows) != multiset(side.rows):
            problems.append(f"once {sorted(once_side.rows, key=repr)} != at the points {sorted(side.rows, key=repr)}")
        assert not problems, "\n".join(problems)

    run_examples(request, capsys, body, counts)


# ------------------------------------------------------------ (d) the registry
def _doc(**fields: Any) -> dict[str, Any]:
    return {
        "mode": "append",
        "database": "web",
        "table": "clicks",
        "columns": [
            {"name": "id", "type": "bigint"},
            {"name": "score", "type": "double"},
            {"name": "op", "type": "string"},
            {"name": "n", "type": "int"},
            {"name": "day", "type": "date"},
        ],
        "event_id": ["id"],
        "storage_root": "/lake/web/clicks",
        **fields,
    }


def test_registry_takes_an_append_table() -> None:
    cfg = parse_table(_doc())
    assert cfg.mode == "append" and cfg.event_id == ["id"] and cfg.op_column is None
    assert cfg.control_columns == []
    assert parse_table(_doc(op_column="op")).control_columns == ["op"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"event_id": []}, "event_id"),
        ({"event_id": ["nope"]}, r"event_id: \['nope'\] not among the columns"),
        ({"event_id": ["score"]}, "event_id: column 'score' has type double, which cannot identify an event"),
        ({"op_column": "missing"}, "op_column: 'missing' is not among the columns"),
        ({"op_column": "n"}, "op_column: column 'n' must have type string"),
        ({"op_column": "id"}, "op_column: 'id' must not be part of event_id"),
        ({"partition_by": {"column": "day"}}, "partition_by: append tables are not partitioned"),
        ({"order_by": ["id"]}, "order_by"),
        ({"primary_key": ["id"]}, "primary_key"),
    ],
)
def test_registry_refusals_name_the_field(fields: dict[str, Any], message: str) -> None:
    doc = _doc(**fields)
    with pytest.raises(ValidationError, match=message):
        parse_table(doc)


def test_registry_needs_an_event_id() -> None:
    doc = _doc()
    del doc["event_id"]
    with pytest.raises(ValidationError, match="event_id"):
        parse_table(doc)


# ------------------------------------------------------- (d) every dialect's rendering
@pytest.mark.spark
def test_hive_views_parse_with_hives_own_parser_and_other_dialects_parse(spark: Any, tmp_path: Path) -> None:
    """Hive 2.3's parser (from the pyspark wheel) takes both views; Trino's and DuckDB's renderings parse."""
    for table in SHAPES.values():
        cfg = registry_table(table, tmp_path)
        driver = spark._jvm.org.apache.hadoop.hive.ql.parse.ParseDriver()
        for kind in ("view", "rejects"):
            text = dialects.query(cfg, kind, "hive", dialects.metastore_sources(cfg))
            assert "TOK_QUERY" in driver.parse(text).dump(), text
            for dialect in ("trino", "duckdb"):
                sqlglot.parse_one(dialects.query(cfg, kind, dialect, dialects.metastore_sources(cfg)), read=dialect)
        views = {v.name: v for v in dialects.metastore_views(cfg)}
        assert set(views) == {
            "events_view",
            "events_pending_rejects",
            "events_view_hive",
            "events_pending_rejects_hive",
            "events_view_trino",
            "events_pending_rejects_trino",
        }
        assert [n for n, _ in dialects.view_columns(cfg, "view")] == table.names


def test_the_rule_travels_with_its_relations() -> None:
    """The plan's rule names the relations it was rendered over; the job registers exactly those."""
    cfg = registry_table(SHAPES["composite_op"], Path("/tmp/append-rule"))
    rule = dict(sql.rule_sql(cfg))
    names = job.relations(rule)
    assert set(names) == {"base", "events", "fates"}
    assert f"FROM `{names['events']}`" in rule["event_fates"] and f"FROM `{names['base']}`" in rule["event_fates"]
    assert job.event_id_of(rule) == ["src", "off"]
    with pytest.raises(ValueError, match="lacks"):
        job.relations({k: v for k, v in rule.items() if k != "relation:fates"})


# ------------------------------------------------------- (d) the model by hand
def test_model_by_hand() -> None:
    t = AppendTable((("id", "bigint"), ("v", "string"), ("op", "string")), ("id",), "op")
    m = AppendModel(t)
    assert m.reject_reason({"id": None, "op": None}) == "null_event_id:id"
    assert m.reject_reason({"id": 1, "op": None}) == "null_op"
    assert m.reject_reason({"id": 1, "op": "u"}) == "not_an_insert:update"
    assert m.reject_reason({"id": 1, "op": "d"}) == "not_an_insert:delete"
    assert m.reject_reason({"id": 1, "op": "U"}) == "unknown_op"
    assert m.reject_reason({"id": 1, "op": "r"}) is None
    m.land("increment_2026112201", [[{"id": 1, "v": "late name", "op": "c"}]])
    m.land("increment_2026112200", [[{"id": 1, "v": "x", "op": "c"}], [{"id": 1, "v": "y", "op": "c"}]])
    out = m.compact()
    assert (out.rows, out.superseded, out.appended) == ([(1, "x", "c")], 2, 1)
    m.land("increment_2026112202", [[{"id": 1, "v": "z", "op": "c"}, {"id": 2, "v": None, "op": "c"}]])
    out = m.compact()
    assert (out.rows, out.replayed, out.appended) == ([(1, "x", "c"), (2, None, "c")], 1, 1)
    with pytest.raises(ValueError, match="cannot identify"):
        AppendTable((("id", "double"),), ("id",))


def test_lineage_names_the_event_id_as_what_decides_the_rows() -> None:
    """OpenLineage's column lineage: the event id and the op column decide which events become rows."""
    from cdc_compaction.integrations import lineage

    cfg = parse_table(_doc(op_column="op"))
    influences = {col: t.subtype for col, t in lineage.dataset_influences(cfg)}
    assert influences == {"id": "WINDOW", "op": "FILTER"}
    assert {col for col, _ in lineage.dataset_influences(parse_table(_doc()))} == {"id"}


GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.mark.parametrize(("dialect", "kind"), [(d, k) for d in ("hive", "trino") for k in ("view", "rejects")])
def test_renderings_are_pinned(dialect: str, kind: str) -> None:
    """What cannot run here (Hive, Trino) is pinned: a change to it must be looked at (CDC_UPDATE_GOLDEN=1 rewrites)."""
    cfg = registry_table(SHAPES["composite_op"], Path("/lake/append-golden"))
    text = dialects.query(cfg, kind, dialect, dialects.metastore_sources(cfg)) + "\n"
    path = GOLDEN / f"append.events.{kind}.{dialect}.sql"
    if os.environ.get("CDC_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs from the rendering; CDC_UPDATE_GOLDEN=1 to accept it"


# ------------------------------------------------------------------ the real pipeline and a real DAG run
SCENARIO_FILES = sorted(SCENARIO_DIR.glob("*.json"))


@pytest.mark.spark
@pytest.mark.metastore
@pytest.mark.parametrize("path", SCENARIO_FILES, ids=[p.stem for p in SCENARIO_FILES])
def test_append_scenario(path: Path, inprocess: Any, readers: Any, tmp_path: Path) -> None:
    """Every append scenario through the pipeline's task functions, read by Spark (metastore) and DuckDB."""
    from cdc_compaction.devtools import conformance as conf

    result = conf.run_scenario(conf.Scenario.load(path), inprocess, readers, tmp_path / "lake", suffix="_a")
    assert result.ok, "\n".join(result.failures)


@pytest.mark.dag
@pytest.mark.spark
@pytest.mark.metastore
def test_an_append_table_through_a_real_dag_run(dag_runner: Any, readers: Any) -> None:
    """A re-delivery after a compaction, as real Airflow DAG runs (the job in the test worker's warm
    Spark Connect server)."""
    from cdc_compaction.devtools import conformance as conf

    work: Path = dag_runner.work
    scn = conf.Scenario.load(SCENARIO_DIR / "redelivery_after_compaction.json")
    result = conf.run_scenario(scn, dag_runner, readers, work / "lake", registry_dir=work / "registry", suffix="_dag")
    assert result.ok, "\n".join(result.failures)
    runs = [t for t in dag_runner.timings if t["dag_id"].endswith(scn.table_name + "_dag")]
    assert runs and all(t["state"] == "success" for t in runs)
