"""The cdc mode's Airflow side: its lint warnings and how it reconciles the job's counts (no Spark)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import STUDENT_COLUMNS

from cdc_compaction.core.mode import mode_of
from cdc_compaction.core.registry import parse_table


def cdc(**overrides: Any) -> Any:
    doc = {
        "database": "tests",
        "table": "orders",
        "columns": [*STUDENT_COLUMNS, {"name": "lsn", "type": "bigint"}, {"name": "changed", "type": "timestamp"}],
        "primary_key": ["id"],
        "order_by": ["lsn"],
        "storage_root": "/lake/tests/orders",
        **overrides,
    }
    return parse_table(doc)


@pytest.mark.parametrize(
    ("order_by", "warned"),
    [
        (["lsn"], False),
        (["lsn", "ts_ms"], False),
        (["ts_ms", "lsn"], True),
        (["ts_ms"], True),  # the table has an lsn column, and does not order by it
        (["changed", "lsn"], True),  # a timestamp column, whatever its name
        (["id"], False),  # not a time: nothing to say
    ],
)
def test_a_time_before_the_log_position_is_warned_about(order_by: list[str], warned: bool) -> None:
    cfg = cdc(order_by=order_by)
    warnings = mode_of(cfg).warnings(cfg)
    assert bool(warnings) == warned, warnings
    if warned:
        assert warnings[0].startswith(f"tests.orders: order_by starts with {order_by[0]!r}")
        assert "order_by: [lsn]" in warnings[0]


def test_no_log_position_no_warning() -> None:
    cfg = parse_table(
        {
            "database": "tests",
            "table": "student",
            "columns": STUDENT_COLUMNS,
            "primary_key": ["id"],
            "order_by": ["ts_ms"],
            "storage_root": "/lake/tests/student",
        }
    )
    assert mode_of(cfg).warnings(cfg) == []


def _stats(**kw: int) -> dict[str, int]:
    # A run that read 10 base rows and 5 events, refused 1, and whose winners replaced 3 rows.
    base = {
        "base_rows": 10,
        "increment_rows": 5,
        "rejected_rows": 1,
        "superseded_rows": 3,
        "expired_tombstones": 0,
        "output_rows": 11,
        "duplicate_keys": 0,
        "misplaced_rows": 0,
    }
    return {**base, **kw}


def test_counts_that_add_up_pass() -> None:
    assert mode_of(cdc()).count_problems(_stats()) == []
    # An expired tombstone leaves the output, and is counted so.
    assert mode_of(cdc()).count_problems(_stats(expired_tombstones=2, output_rows=9)) == []


@pytest.mark.parametrize(
    ("stats", "fragment"),
    [
        (
            _stats(output_rows=12),
            "row counts do not reconcile: base 10 + increments 5 - rejected 1 + retired old keys 0 - superseded 3",
        ),
        (_stats(duplicate_keys=2), "2 keys appear more than once"),
        (_stats(misplaced_rows=1), "1 rows are on the wrong side"),
    ],
)
def test_counts_that_do_not_add_up_are_named(stats: dict[str, int], fragment: str) -> None:
    problems = mode_of(cdc()).count_problems(stats)
    assert len(problems) == 1 and fragment in problems[0], problems


def test_a_nullable_key_column_is_not_refused_when_null() -> None:
    from cdc_compaction.core.sql import rule_sql, schema_fingerprint

    plain = cdc(primary_key=["id", "full_name"])
    nullable = cdc(primary_key=["id", "full_name"], nullable_key=["full_name"])
    assert "'null_key:full_name'" in rule_sql(plain).reject_reason
    assert "'null_key:full_name'" not in rule_sql(nullable).reject_reason
    assert "'null_key:id'" in rule_sql(nullable).reject_reason  # the other key column still must not be NULL
    # Both rank by the whole key: a NULL is one key value.
    assert "PARTITION BY `id`, `full_name`" in rule_sql(nullable).rank
    # The option reshapes the views (the fingerprint), and a table without it keeps the one it had.
    assert schema_fingerprint(nullable) != schema_fingerprint(plain)
    assert schema_fingerprint(plain) == schema_fingerprint(cdc(primary_key=["id", "full_name"], nullable_key=[]))


def test_nullable_key_must_name_key_columns(tmp_path: Any) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"nullable_key: \['ts_ms'\] are not primary_key columns"):
        cdc(nullable_key=["ts_ms"])


@pytest.mark.parametrize(
    ("unchanged", "fragment"),
    [
        ({"columns": ["nope"]}, "unchanged: column 'nope' is not among the columns"),
        ({"columns": ["id"]}, "is a key, ordering or op column"),
        ({"columns": ["lsn"]}, "is a key, ordering or op column"),
        ({"columns": ["changed"]}, "cannot hold the placeholder"),  # a timestamp: Debezium's text cannot be there
        ({"columns": ["full_name"], "placeholder": ""}, "1-256 characters"),
    ],
)
def test_unchanged_columns_are_checked(unchanged: dict[str, Any], fragment: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=fragment):
        cdc(unchanged=unchanged)


def test_unchanged_columns_reach_the_rule_and_the_docs() -> None:
    from cdc_compaction.core.sql import rule_sql

    cfg = cdc(unchanged={"columns": ["full_name", "changed"], "marker": "null"})  # NULL works for any type
    rule = rule_sql(cfg)
    assert set(rule) == {
        "reject_reason",
        "rank",
        "is_delete",
        "fill:full_name",
        "fill:changed",
        "unchanged:full_name",
        "unchanged:changed",
        "unchanged_columns",
    }
    assert "last_value(`changed`) IGNORE NULLS OVER" in rule["fill:changed"]
    # Where each filled value came from is kept in hidden columns, declared by the mode (see the next test).
    hidden = [n for n, _ in rule["unchanged_columns"]]
    assert [n for n, _ in mode_of(cfg).output_columns(cfg)] == hidden
    assert all(n.startswith("_cdc_") for n in hidden)
    assert mode_of(cfg).column_roles(cfg)["full_name"] == ["may be left out"]
    assert any("keep the key's previous value" in line for line in mode_of(cfg).doc_lines(cfg))


def _with_old_key(**overrides: Any) -> Any:
    cols = [*STUDENT_COLUMNS, {"name": "_before_id", "type": "int"}, {"name": "lsn", "type": "bigint"}]
    return cdc(**{"columns": cols, "old_key": ["_before_id"], **overrides})


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"old_key": ["_before_id", "full_name"]}, "must name one column per primary_key column"),
        ({"old_key": ["nope"]}, "old_key: column 'nope' is not among the columns"),
        ({"old_key": ["full_name"]}, "has type string but 'id' has int"),
        ({"old_key": ["lsn"]}, "is a key, ordering or op column itself"),
    ],
)
def test_old_key_is_checked(overrides: dict[str, Any], fragment: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=fragment):
        _with_old_key(**overrides)


def test_old_key_reaches_the_rule() -> None:
    from cdc_compaction.core.sql import rule_sql

    cfg = _with_old_key()
    rule = rule_sql(cfg)
    assert "UNION ALL" in rule["keyed_events"] and "`_cdc_fresh_events`" in rule["keyed_events"]
    # A delete by old key is checked there, any other event on its key columns.
    assert "THEN 'null_key:_before_id'" in rule["reject_reason"]
    assert mode_of(cfg).column_roles(cfg)["_before_id"] == ["old key of id"]
    assert "deletes that old key" in " ".join(mode_of(cfg).doc_lines(cfg))
    assert "keyed_events" not in rule_sql(cdc())  # without old_key the rule has no key changes
