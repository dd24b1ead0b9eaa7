"""The schema-change policy (registry ``schema_changes``) as pure functions: what a file means, what evolves.

Fast: no Spark, no metastore. The expected verdicts are written out from the README's
table of changes (an added column, a widening, a drop, a rename, a retype), not computed.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import student_doc

from cdc_compaction.airflow import factory
from cdc_compaction.core.exceptions import SchemaChangeError
from cdc_compaction.core.registry import Column, parse_table
from cdc_compaction.core.schema import Change, evolve, hive_type_of, judge, overlay

COLUMNS = [("id", "int"), ("score", "int"), ("price", "decimal(5,2)"), ("name", "string")]
SAME = {"id": "int32", "score": "int32", "price": "decimal128(5, 2)", "name": "string"}


def _judge(policy: str, **file_types: str | None) -> Any:
    cols = {**SAME, **file_types}
    return judge(policy, COLUMNS, {n: t for n, t in cols.items() if t is not None}, "inc/f.parquet")


def _changes(verdict: Any) -> list[tuple[str, str, str, str]]:
    return [(c.change, c.column, c.old, c.new) for c in verdict.changes]


def test_an_unchanged_file_is_no_change_under_any_policy() -> None:
    for policy in ("evolve", "fail", "ignore"):
        v = _judge(policy)
        assert (v.problem, v.changes, v.ignored, v.missing) == (None, [], [], []), policy


def test_evolve_adds_a_new_column_with_its_hive_type() -> None:
    v = _judge("evolve", email="large_string", born="date32[day]")
    assert v.problem is None
    assert _changes(v) == [("added", "born", "", "date"), ("added", "email", "", "string")]
    assert {c.file for c in v.changes} == {"inc/f.parquet"}


@pytest.mark.parametrize(
    ("column", "arrow", "new"),
    [("score", "int64", "bigint"), ("price", "decimal128(12, 4)", "decimal(12,4)"), ("id", "double", "double")],
)
def test_evolve_widens_a_type_the_old_files_still_read_as(column: str, arrow: str, new: str) -> None:
    v = _judge("evolve", **{column: arrow})
    old = dict(COLUMNS)[column]
    assert v.problem is None and _changes(v) == [("widened", column, old, new)]


@pytest.mark.parametrize(
    ("column", "arrow"),
    [("score", "string"), ("price", "decimal128(5, 3)"), ("id", "int16"), ("name", "int32")],
    ids=["int-to-string", "decimal-losing-digits", "narrowing-is-read-fine", "string-to-int"],
)
def test_evolve_refuses_a_retype_naming_column_and_both_types(column: str, arrow: str) -> None:
    v = _judge("evolve", **{column: arrow})
    if arrow == "int16":  # a narrower integer in the file reads as the table's int: nothing changes
        assert v.problem is None and v.changes == []
        return
    old = dict(COLUMNS)[column]
    assert v.problem is not None and v.problem.startswith("incompatible schema: ")
    assert f"column {column!r} is {arrow} in the file but {old} in the registry" in v.problem
    assert "Only widenings follow the source" in v.problem and "docs/data.md#changing-a-schema" in v.problem


def test_evolve_records_a_dropped_column_and_refuses_a_likely_rename() -> None:
    v = _judge("evolve", name=None)
    assert v.problem is None and v.missing == ["name"]
    assert _changes(v) == [("dropped", "name", "string", "")]
    renamed = _judge("evolve", name=None, full_name="string")
    assert renamed.changes == [] and renamed.problem is not None
    assert renamed.problem.startswith("possible rename: ")
    assert "['name'] are missing" in renamed.problem and "['full_name'] are new" in renamed.problem
    assert "add the new column(s) to the registry" in renamed.problem


def test_a_column_dropped_earlier_is_no_news_and_no_half_of_a_rename() -> None:
    cols = {**SAME, "email": "string"}
    del cols["name"]
    v = judge("evolve", COLUMNS, cols, "inc/g.parquet", dropped=frozenset({"name"}))
    assert v.problem is None and v.missing == ["name"]
    assert _changes(v) == [("added", "email", "", "string")]
    again = judge("evolve", COLUMNS, {k: t for k, t in SAME.items() if k != "name"}, "g", dropped=frozenset({"name"}))
    assert (again.problem, again.changes) == (None, [])


def test_evolve_refuses_a_new_column_without_a_hive_type() -> None:
    v = _judge("evolve", tags="list<element: string>")
    assert v.problem is not None and "column 'tags' is list<element: string>" in v.problem


def test_fail_refuses_new_columns_and_widenings_but_reads_a_missing_column_as_null() -> None:
    extra = _judge("fail", email="string")
    assert extra.problem is not None and "columns ['email'] are not in the registry" in extra.problem
    assert "schema_changes: evolve" in extra.problem
    wider = _judge("fail", score="int64")
    assert wider.problem is not None and "column 'score' is int64 in the file but int in the registry" in wider.problem
    assert "a widening to bigint: set schema_changes: evolve" in wider.problem
    missing = _judge("fail", name=None)
    assert (missing.problem, missing.missing, missing.changes) == (None, ["name"], [])


def test_ignore_drops_new_columns_counted_and_reads_missing_ones_as_null() -> None:
    v = _judge("ignore", email="string", name=None)
    assert v.problem is None and v.ignored == ["email"] and v.missing == ["name"]
    assert _changes(v) == [("ignored", "email", "", "string")]
    assert _judge("ignore", score="int64").problem is not None, "a type it cannot read is still refused"


@pytest.mark.parametrize(
    ("arrow", "hive"),
    [
        ("int8", "tinyint"),
        ("int64", "bigint"),
        ("uint32", "bigint"),
        ("uint64", None),
        ("timestamp[us, tz=UTC]", "timestamp"),
        ("timestamp[ns]", None),
        ("decimal128(20, 3)", "decimal(20,3)"),
        ("struct<a: int32>", None),
    ],
)
def test_the_hive_type_a_new_column_gets(arrow: str, hive: str | None) -> None:
    assert hive_type_of(arrow) == hive


def test_evolve_applies_changes_in_file_order_and_merges_types() -> None:
    cols = [Column(name="id", type="int", comment="key"), Column(name="score", type="int")]
    changes = [
        Change("added", "email", "", "string", "a"),
        Change("widened", "score", "int", "bigint", "a"),
        Change("added", "n", "", "int", "a"),
        Change("added", "n", "", "bigint", "b"),  # wider in a later file: added as the wider type
        Change("dropped", "gone", "string", "", "b"),
        Change("widened", "score", "int", "int", "c"),  # narrower than applied: fits
    ]
    out, applied = evolve("db.t", cols, changes)
    assert [(c.name, c.type, c.comment) for c in out] == [
        ("id", "int", "key"),
        ("score", "bigint", ""),
        ("email", "string", ""),
        ("n", "bigint", ""),
    ]
    assert [(c.change, c.column, c.old, c.new, c.file) for c in applied] == [
        ("added", "email", "", "string", "a"),
        ("widened", "score", "int", "bigint", "a"),
        ("added", "n", "", "bigint", "a"),
    ]
    with pytest.raises(SchemaChangeError, match=r"column 'n' is int in one landed file and string in c"):
        evolve("db.t", cols, [Change("added", "n", "", "int", "a"), Change("added", "n", "", "string", "c")])


def test_the_lake_state_is_laid_over_the_registry(tmp_path) -> None:
    cfg = parse_table(student_doc(tmp_path / "lake", schema_changes="evolve"))
    assert overlay(cfg, None) is cfg
    state = {"columns": [{"name": "id", "type": "bigint"}, {"name": "email", "type": "string"}], "history": []}
    got = overlay(cfg, state)
    assert [(c.name, c.type) for c in got.columns] == [
        ("id", "bigint"),
        ("full_name", "string"),
        ("op", "string"),
        ("ts_ms", "bigint"),
        ("email", "string"),
    ]
    # The owner widened id beyond the evolved type since: the registry's type wins.
    wider = parse_table(student_doc(tmp_path / "lake", schema_changes="evolve", columns=[
        {"name": "id", "type": "double"}, {"name": "full_name", "type": "string"},
        {"name": "op", "type": "string"}, {"name": "ts_ms", "type": "bigint"},
    ]))  # fmt: skip
    assert overlay(wider, state).columns[0].type == "double"


def test_schema_changes_defaults_to_fail_and_the_older_field_still_means_ignore(tmp_path) -> None:
    root = tmp_path / "lake"
    assert parse_table(student_doc(root)).schema_policy == "fail"
    assert parse_table(student_doc(root, on_extra_columns="ignore")).schema_policy == "ignore"
    explicit = parse_table(student_doc(root, on_extra_columns="ignore", schema_changes="evolve"))
    assert explicit.schema_policy == "evolve"
    with pytest.raises(ValueError, match="schema_changes"):
        parse_table(student_doc(root, schema_changes="follow"))


def test_a_retired_table_has_no_schedule_and_starts_paused(tmp_path) -> None:
    live = factory.build_dag(parse_table(student_doc(tmp_path / "lake")))
    assert live.schedule == "@hourly"
    dag = factory.build_dag(parse_table(student_doc(tmp_path / "lake", retired=True)))
    assert dag.schedule is None and type(dag.timetable).__name__ == "NullTimetable"
    assert dag.is_paused_upon_creation is True and "retired" in dag.tags
    assert [t.task_id for t in dag.tasks] == [t.task_id for t in live.tasks], "a manual run still drains"
