"""Unit tests of SQL rendering: identifiers, literals, DDL, the compaction rule and the views.

Pure string checks on the rendered templates of ``include/sql``: no SparkSession, no
metastore.  The rule under test is the one of ``shared/conformance/README.md``: the
winner per key is the greatest (order_by values, increment, file, row position);
rows with a null key, a null ordering value or an unknown op code are refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlglot
from conftest import STUDENT_COLUMNS

from cdc_compaction.core.dialects import view_statements
from cdc_compaction.core.exceptions import IdentifierError
from cdc_compaction.core.identifiers import check_identifier, normalize_hive_type, quote
from cdc_compaction.core.registry import Column, TableConfig, load_table, parse_table
from cdc_compaction.core.sql import (
    add_columns_statement,
    create_statements,
    rule_sql,
    schema_fingerprint,
    set_fingerprint_statement,
    spark_schema_ddl,
    sql_literal,
    table_names,
)

SHIPPED_REGISTRY = Path(__file__).resolve().parents[2] / "include" / "registry"
META_COLUMNS = [
    ("_cdc_increment", "string"),
    ("_cdc_file", "string"),
    ("_cdc_pos", "bigint"),
    ("_cdc_ingested_at", "timestamp"),
]
LOCATIONS = {
    "base_location": "/lake/shop/orders/base/v0001/data",
    "tombstones_location": "/lake/shop/orders/base/v0001/tombstones",
    "incremental_location": "/lake/shop/orders/incremental",
    "compactor_location": "/lake/shop/orders/compactor",
}


# -- helpers -------------------------------------------------------------------------


def norm(sql: str) -> str:
    """Collapse every run of whitespace to one space."""
    return " ".join(sql.split())


def unquote_literal(literal: str) -> str:
    """Decode a single-quoted, backslash-escaped SQL literal; fail on anything malformed."""
    assert len(literal) >= 2, literal
    assert literal[0] == "'" and literal[-1] == "'", literal
    out: list[str] = []
    i = 1
    while i < len(literal) - 1:
        ch = literal[i]
        if ch == "\\":
            assert literal[i + 1] in "\\'", f"unexpected escape in {literal!r}"
            out.append(literal[i + 1])
            i += 2
            continue
        assert ch != "'", f"unescaped quote inside {literal!r}"
        out.append(ch)
        i += 1
    assert i == len(literal) - 1, f"the closing quote of {literal!r} is escaped"
    return "".join(out)


_LITERAL = r"'(?:[^'\\]|\\.)*'"


def literal_after(keyword: str, sql: str) -> str:
    """The decoded string literal that follows ``keyword`` in ``sql``."""
    m = re.search(re.escape(keyword) + r"\s+(" + _LITERAL + ")", sql)
    assert m, f"no literal after {keyword!r} in:\n{sql}"
    return unquote_literal(m.group(1))


def column_definitions(ddl: str) -> list[str]:
    """The lines of a CREATE TABLE's column list, stripped."""
    body = ddl.split("(\n", 1)[1].split("\n)", 1)[0]
    return [line.strip().rstrip(",") for line in body.splitlines() if line.strip()]


def doc(**overrides: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "database": "tests",
        "table": "student",
        "columns": [dict(c) for c in STUDENT_COLUMNS],
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": "/lake/tests/student",
    }
    d.update(overrides)
    return d


def cfg_of(**overrides: Any) -> TableConfig:
    return parse_table(doc(**overrides))


@pytest.fixture(scope="module")
def orders() -> TableConfig:
    return load_table(SHIPPED_REGISTRY, "shop.orders")


@pytest.fixture(scope="module")
def student() -> TableConfig:
    return load_table(SHIPPED_REGISTRY, "school.student")


@pytest.fixture(scope="module")
def orders_ddl(orders: TableConfig) -> list[str]:
    return create_statements(orders, **LOCATIONS)


# -- identifiers and literals --------------------------------------------------------


@pytest.mark.parametrize("name", ["id", "order", "timestamp", "_private", "A1_b2", "x" * 128])
def test_quote_backquotes_valid_identifiers(name: str) -> None:
    assert check_identifier(name) == name
    assert quote(name) == f"`{name}`"


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("x; DROP TABLE y", id="statement"),
        pytest.param("x` ; DROP TABLE y; --", id="backtick-breakout"),
        pytest.param("a`b", id="backtick"),
        pytest.param("a'b", id="single-quote"),
        pytest.param('a"b', id="double-quote"),
        pytest.param("a b", id="space"),
        pytest.param("a.b", id="dot"),
        pytest.param("a-b", id="dash"),
        pytest.param("a\nb", id="newline"),
        pytest.param("a\x00", id="nul"),
        pytest.param("1abc", id="leading-digit"),
        pytest.param("", id="empty"),
        pytest.param("x" * 129, id="129-chars"),
        pytest.param("é", id="non-ascii"),
        pytest.param("a/*c*/", id="comment"),
    ],
)
def test_identifiers_refuse_injection(name: str) -> None:
    with pytest.raises(IdentifierError, match="is not a valid identifier"):
        check_identifier(name, "column name")
    with pytest.raises(IdentifierError):
        quote(name)


def test_check_identifier_refuses_non_strings() -> None:
    with pytest.raises(IdentifierError):
        check_identifier(5)  # type: ignore[arg-type]


def test_identifier_error_names_what_was_checked() -> None:
    with pytest.raises(IdentifierError, match=r"^database 'a b' is not a valid identifier"):
        check_identifier("a b", "database")


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("INT", "int"),
        ("integer", "int"),
        (" BigInt ", "bigint"),
        ("Decimal( 12 , 2 )", "decimal(12,2)"),
        ("decimal", "decimal"),
        ("VARCHAR(20)", "varchar(20)"),
        ("char(3)", "char(3)"),
        ("timestamp", "timestamp"),
    ],
)
def test_normalize_hive_type(given: str, canonical: str) -> None:
    assert normalize_hive_type(given) == canonical


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("varchar2", "unknown Hive type"),
        ("map<string,int>", "unknown Hive type"),
        ("array<int>", "unknown Hive type"),
        ("int; DROP TABLE y", "unknown Hive type"),
        ("decimal(5,7)", "scale is larger than its precision"),
        ("", "unknown Hive type"),
    ],
)
def test_normalize_hive_type_refuses(given: str, message: str) -> None:
    with pytest.raises(IdentifierError, match=re.escape(message)):
        normalize_hive_type(given)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("plain", "'plain'", id="plain"),
        pytest.param("it's", "'it\\'s'", id="quote"),
        pytest.param("C:\\temp", "'C:\\\\temp'", id="backslash"),
        pytest.param("\\'", "'\\\\\\''", id="backslash-then-quote"),
        pytest.param("x\\", "'x\\\\'", id="trailing-backslash"),
        pytest.param("", "''", id="empty"),
        pytest.param(42, "'42'", id="int"),
    ],
)
def test_sql_literal_escapes(value: object, expected: str) -> None:
    assert sql_literal(value) == expected


@pytest.mark.parametrize(
    "value",
    ["it's", "''", "\\", "\\\\'", "x'; DROP TABLE y; --", "a\\'b\\", "naïve “quotes”", "tab\there"],
)
def test_sql_literal_round_trips(value: str) -> None:
    assert unquote_literal(sql_literal(value)) == value


def test_sql_literal_refuses_nul() -> None:
    with pytest.raises(ValueError, match="NUL"):
        sql_literal("a\x00b")


# -- names, schema string ------------------------------------------------------------


def test_table_names(orders: TableConfig) -> None:
    assert table_names(orders) == {
        "base_table": "orders_base",
        "tombstones_table": "orders_tombstones",
        "incremental_table": "orders_incremental",
        "compactor_table": "orders_compactor",
        "view_name": "orders_view",
        "rejects_view": "orders_pending_rejects",
    }


def test_spark_schema_ddl_quotes_every_column(orders: TableConfig) -> None:
    assert spark_schema_ddl(orders) == (
        "`tenant` string, `order_no` bigint, `amount` decimal(12,2), `status` string, "
        "`timestamp` timestamp, `order` int, `op` string, `ts_ms` bigint, `lsn` bigint"
    )


# -- CREATE statements ---------------------------------------------------------------


def test_create_database(orders_ddl: list[str]) -> None:
    assert len(orders_ddl) == 5
    assert orders_ddl[0].startswith("CREATE DATABASE IF NOT EXISTS `shop`")


@pytest.mark.parametrize(
    ("index", "table", "role", "location_key", "with_meta"),
    [
        pytest.param(1, "orders_base", "base", "base_location", True, id="base"),
        pytest.param(2, "orders_tombstones", "tombstones", "tombstones_location", True, id="tombstones"),
        pytest.param(3, "orders_incremental", "incremental", "incremental_location", False, id="incremental"),
        pytest.param(4, "orders_compactor", "compactor", "compactor_location", True, id="compactor"),
    ],
)
def test_create_table(
    orders: TableConfig,
    orders_ddl: list[str],
    index: int,
    table: str,
    role: str,
    location_key: str,
    with_meta: bool,
) -> None:
    ddl = orders_ddl[index]
    assert ddl.startswith(f"CREATE TABLE IF NOT EXISTS `shop`.`{table}` (\n")
    assert "\nUSING parquet\n" in ddl
    assert literal_after("LOCATION", ddl) == LOCATIONS[location_key]
    assert f"LOCATION '{LOCATIONS[location_key]}'" in ddl
    assert f"'cdc.fingerprint' = '{schema_fingerprint(orders)}'" in ddl
    assert f"'cdc.role' = '{role}'" in ddl
    assert "'cdc.managed_by' = 'cdc_compaction'" in ddl

    defs = column_definitions(ddl)
    # Every column definition starts with a backquoted name, reserved words included.
    for d in defs:
        assert re.match(r"^`[A-Za-z_][A-Za-z0-9_]*` \S", d), d
    names = [d.split("`")[1] for d in defs]
    meta = [n for n, _ in META_COLUMNS] if with_meta else ["_cdc_increment"]
    assert names == orders.column_names + meta
    for c in orders.columns:
        assert any(d.startswith(f"`{c.name}` {c.type}") for d in defs), c
    assert "`order` int COMMENT 'a reserved word as a column name'" in defs
    assert "`timestamp` timestamp COMMENT 'business time of the order'" in defs
    assert "`amount` decimal(12,2)" in defs

    if with_meta:
        for name, type_ in META_COLUMNS:
            assert any(d.startswith(f"`{name}` {type_}") for d in defs), name
        assert "PARTITIONED BY" not in ddl
    else:
        assert "\nPARTITIONED BY (`_cdc_increment`)\n" in ddl
        assert any(d.startswith("`_cdc_increment` string") for d in defs)
        assert "_cdc_file" not in ddl
        assert "_cdc_pos" not in ddl


def test_location_is_a_literal_even_with_quotes(orders: TableConfig) -> None:
    hostile = "/lake/x'; DROP TABLE y; --"
    ddl = create_statements(
        orders,
        base_location=hostile,
        tombstones_location="/lake/t",
        incremental_location="/lake/i",
        compactor_location="/lake/c\\d",
    )
    assert literal_after("LOCATION", ddl[1]) == hostile
    assert "LOCATION '/lake/x\\'; DROP TABLE y; --'" in ddl[1]
    assert literal_after("LOCATION", ddl[4]) == "/lake/c\\d"


def test_column_comment_with_a_quote_is_escaped() -> None:
    cfg = cfg_of(
        columns=[
            {"name": "id", "type": "int", "comment": "the customer's id"},
            {"name": "full_name", "type": "string", "comment": "C:\\names"},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "bigint"},
        ]
    )
    base = create_statements(cfg, **LOCATIONS)[1]
    assert "`id` int COMMENT 'the customer\\'s id'," in base
    assert "`full_name` string COMMENT 'C:\\\\names'," in base
    assert literal_after("`id` int COMMENT", base) == "the customer's id"
    assert literal_after("`full_name` string COMMENT", base) == "C:\\names"
    # No column without a comment gets an empty COMMENT clause.
    assert "`op` string," in base
    assert "COMMENT ''" not in base


def test_table_comment_is_a_literal(orders_ddl: list[str]) -> None:
    assert literal_after(")\nUSING parquet\nCOMMENT", orders_ddl[1]).startswith("Compacted state of shop.orders")


def test_add_columns_statement(orders: TableConfig) -> None:
    new = [Column(name="note", type="string", comment="it's new"), Column(name="group", type="int")]
    sql = add_columns_statement(orders, "orders_base", new)
    assert (
        sql == "ALTER TABLE `shop`.`orders_base` ADD COLUMNS (\n  `note` string COMMENT 'it\\'s new',\n  `group` int\n)"
    )


def test_add_columns_statement_refuses_a_bad_table_name(orders: TableConfig) -> None:
    with pytest.raises(IdentifierError):
        add_columns_statement(orders, "orders_base; DROP TABLE x", [Column(name="a", type="int")])


def test_set_fingerprint_statement(orders: TableConfig) -> None:
    fp = schema_fingerprint(orders)
    assert set_fingerprint_statement(orders, "orders_view", "VIEW") == (
        f"ALTER VIEW `shop`.`orders_view` SET TBLPROPERTIES ('cdc.fingerprint' = '{fp}')"
    )
    assert set_fingerprint_statement(orders, "orders_base").startswith("ALTER TABLE `shop`.`orders_base` SET")


# -- the compaction rule -------------------------------------------------------------


def _two_column_order(orders: TableConfig) -> TableConfig:
    """The shipped orders table ordered by two columns (it orders by lsn alone)."""
    return parse_table({**orders.model_dump(), "order_by": ["ts_ms", "lsn"]})


def test_rank_orders_by_the_rule(orders: TableConfig) -> None:
    assert norm(rule_sql(_two_column_order(orders)).rank) == (
        "row_number() OVER ( PARTITION BY `tenant`, `order_no` "
        "ORDER BY `ts_ms` DESC, `lsn` DESC, `_cdc_increment` DESC, `_cdc_file` DESC, `_cdc_pos` DESC )"
    )


def test_rank_with_reserved_words_as_key_and_order() -> None:
    cfg = cfg_of(
        columns=[
            {"name": "order", "type": "int"},
            {"name": "timestamp", "type": "timestamp"},
            {"name": "op", "type": "string"},
        ],
        primary_key=["order"],
        order_by=["timestamp"],
    )
    rule = rule_sql(cfg)
    assert "PARTITION BY `order` ORDER BY `timestamp` DESC, `_cdc_increment` DESC" in norm(rule.rank)
    assert "WHEN `order` IS NULL THEN 'null_key:order'" in norm(rule.reject_reason)
    assert "WHEN `timestamp` IS NULL THEN 'null_order_by:timestamp'" in norm(rule.reject_reason)


def test_reject_reason(orders: TableConfig) -> None:
    reason = norm(rule_sql(_two_column_order(orders)).reject_reason)
    assert reason.startswith("CASE WHEN")
    assert reason.endswith("ELSE NULL END")
    clauses = [
        "WHEN `tenant` IS NULL THEN 'null_key:tenant'",
        "WHEN `order_no` IS NULL THEN 'null_key:order_no'",
        "WHEN `ts_ms` IS NULL THEN 'null_order_by:ts_ms'",
        "WHEN `lsn` IS NULL THEN 'null_order_by:lsn'",
        "WHEN `op` NOT IN ('c', 'r', 'u', 'd') THEN 'unknown_op'",
    ]
    positions = [reason.find(c) for c in clauses]
    assert all(p >= 0 for p in positions), (clauses, reason)
    assert positions == sorted(positions), "keys, then ordering columns, then the op code"
    # A null op code is refused too (NULL NOT IN (...) is not true, so it needs its own branch).
    assert "WHEN `op` IS NULL THEN" in reason
    # Value columns are never a reason to refuse a row.
    for name in ("amount", "status", "timestamp", "order"):
        assert f"`{name}` IS NULL" not in reason


def test_is_delete(student: TableConfig) -> None:
    assert rule_sql(student).is_delete == "(`op` = 'd')"
    assert set(rule_sql(student).to_dict()) == {"reject_reason", "rank", "is_delete"}


def test_custom_op_codes_and_op_column() -> None:
    cfg = cfg_of(
        columns=[
            {"name": "id", "type": "int"},
            {"name": "change_type", "type": "string"},
            {"name": "ts_ms", "type": "bigint"},
        ],
        op_column="change_type",
        op_codes={"create": "I", "update": "U", "delete": "D", "read": "R"},
    )
    rule = rule_sql(cfg)
    reason = norm(rule.reject_reason)
    assert "WHEN `change_type` NOT IN ('I', 'R', 'U', 'D') THEN 'unknown_op'" in reason
    assert "'c'" not in reason and "'d'" not in reason
    assert "`op`" not in reason
    assert rule.is_delete == "(`change_type` = 'D')"
    view = norm(view_statements(cfg)[0])
    assert "NOT ( `change_type` = 'D' )" in view
    assert "('I', 'R', 'U', 'D')" in view


# -- views ---------------------------------------------------------------------------


def _tree(text: str) -> sqlglot.exp.Expression:
    return sqlglot.parse_one(text, read="spark")


def _has_subtree(tree: sqlglot.exp.Expression, part: str) -> bool:
    """``part`` (Spark SQL) appears in ``tree`` as a whole subtree, whatever the formatting."""
    want = _tree(part)
    return any(node == want for node in tree.walk())


@pytest.mark.parametrize("table", ["school.student", "shop.orders"])
def test_view_uses_the_same_rule(table: str) -> None:
    """The job's rule expressions are subtrees of the views: the same rule, whatever the rendering."""
    cfg = load_table(SHIPPED_REGISTRY, table)
    rule = rule_sql(cfg)
    view, rejects = (_tree(s.split("\nAS\n", 1)[1]) for s in view_statements(cfg))

    assert _has_subtree(view, rule.rank)
    assert _has_subtree(view, rule.reject_reason)
    assert _has_subtree(view, rule.is_delete)
    assert _has_subtree(rejects, rule.reject_reason)
    where = view.args["where"].this
    assert where == _tree(f"SELECT 1 WHERE `_cdc_rank` = 1 AND NOT {rule.is_delete}").args["where"].this
    assert rejects.args["where"].this == _tree("SELECT 1 WHERE `_cdc_reject_reason` IS NOT NULL").args["where"].this


def test_view_reads_base_tombstones_and_pending_increments(orders: TableConfig) -> None:
    text = view_statements(orders)[0]
    assert text.startswith("CREATE OR REPLACE VIEW `shop`.`orders_view`\nCOMMENT 'Current state of shop.orders")
    assert f"'cdc.fingerprint' = '{schema_fingerprint(orders)}'" in text
    view = _tree(text.split("\nAS\n", 1)[1])
    cols = [c.name for c in orders.columns]
    assert [e.alias_or_name for e in view.expressions] == cols
    sources = sorted(t.name for t in view.find_all(sqlglot.exp.Table))
    assert sources == ["orders_base", "orders_incremental", "orders_tombstones"]
    union = [s for s in view.find_all(sqlglot.exp.Select) if isinstance(s.args["from_"].this, sqlglot.exp.Table)]
    prov = {tuple(e.alias_or_name for e in s.expressions[len(cols) :]) for s in union}
    assert prov == {("_cdc_increment", "_cdc_file", "_cdc_pos")}
    # Pending events get their file name and row from Spark's hidden _metadata column.
    pending = next(s for s in union if s.args["from_"].this.name == "orders_incremental")
    assert pending.expressions[len(cols) + 1] == _tree("SELECT _metadata.file_name AS `_cdc_file`").expressions[0]
    assert pending.expressions[len(cols) + 2] == _tree("SELECT _metadata.row_index AS `_cdc_pos`").expressions[0]
    # The reject filter applies to pending increments only; the base and tombstones hold accepted events.
    assert norm(text).count("'unknown_op'") == 1


def test_rejects_view(orders: TableConfig) -> None:
    text = view_statements(orders)[1]
    assert text.startswith("CREATE OR REPLACE VIEW `shop`.`orders_pending_rejects`")
    rejects = _tree(text.split("\nAS\n", 1)[1])
    assert [t.name for t in rejects.find_all(sqlglot.exp.Table)] == ["orders_incremental"]
    assert [e.alias_or_name for e in rejects.expressions] == [
        *orders.column_names,
        "_cdc_increment",
        "_cdc_file",
        "_cdc_pos",
        "_cdc_reject_reason",
    ]


# -- schema fingerprint --------------------------------------------------------------


def test_fingerprint_is_stable_and_short() -> None:
    a, b = schema_fingerprint(cfg_of()), schema_fingerprint(cfg_of())
    assert a == b
    assert re.fullmatch(r"[0-9a-f]{16}", a)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"schedule": "@daily"}, id="schedule"),
        pytest.param({"schedule": None}, id="no-schedule"),
        pytest.param({"retries": 7}, id="retries"),
        pytest.param({"tombstone_retention": "14d"}, id="tombstone_retention"),
        pytest.param({"description": "other words"}, id="description"),
        pytest.param({"storage_root": "/elsewhere"}, id="storage_root"),
    ],
)
def test_fingerprint_ignores_operational_settings(overrides: dict[str, Any]) -> None:
    assert schema_fingerprint(cfg_of(**overrides)) == schema_fingerprint(cfg_of())


def _with_added_column() -> dict[str, Any]:
    d = doc()
    d["columns"].append({"name": "email", "type": "string"})
    return {"columns": d["columns"]}


def _with_changed_type() -> dict[str, Any]:
    d = doc()
    d["columns"][3]["type"] = "int"
    return {"columns": d["columns"]}


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(_with_added_column(), id="column-added"),
        pytest.param(_with_changed_type(), id="column-type"),
        pytest.param({"order_by": ["ts_ms", "full_name"]}, id="order_by"),
        pytest.param({"primary_key": ["id", "full_name"]}, id="primary_key"),
        pytest.param({"op_codes": {"delete": "x"}}, id="op_codes"),
        pytest.param({"partition_by": {"column": "full_name"}}, id="partition_by"),
    ],
)
def test_fingerprint_follows_the_schema(overrides: dict[str, Any]) -> None:
    assert schema_fingerprint(cfg_of(**overrides)) != schema_fingerprint(cfg_of())


# -- partitioned tables (registry partition_by) -----------------------------------------


def test_unpartitioned_tables_render_no_partition_sql(student: TableConfig) -> None:
    from cdc_compaction.core.sql import partition_sql

    assert partition_sql(student) is None
    base = create_statements(student, **LOCATIONS)[1]
    assert "_cdc_partition" not in base and "PARTITIONED BY" not in base


def test_partitioned_base_table_has_the_hidden_partition_column() -> None:
    cfg = cfg_of(partition_by={"column": "full_name"})
    base, tombstones, incremental, compactor = create_statements(cfg, **LOCATIONS)[1:]
    assert column_definitions(base)[-1].startswith("`_cdc_partition` string COMMENT")
    assert "\nPARTITIONED BY (`_cdc_partition`)\nCOMMENT" in base
    # The tombstones keep the partition as a plain column (they are one unpartitioned set).
    assert column_definitions(tombstones)[-1].startswith("`_cdc_partition` string COMMENT")
    assert "PARTITIONED BY" not in tombstones
    # Only the base table is partitioned this way; the views keep selecting the registry columns.
    assert "_cdc_partition" not in incremental + compactor
    for view in view_statements(cfg):
        assert "_cdc_partition" not in view
    same = [v.replace(schema_fingerprint(cfg), schema_fingerprint(cfg_of())) for v in view_statements(cfg)]
    assert same == view_statements(cfg_of()), "only the fingerprint differs"


def _identity_partition(col: str) -> str:
    """The identity partition value as docs/partitioned.md ("Partition directory names") spells it: NULL and ''
    are the placeholder; printable ASCII without '~' or edge spaces (and not spelt like the placeholder) keeps
    its capitals with each run of small letters as ~CAPITALS~; anything else is ~~ and its UTF-8 bytes in hex."""
    v = f"CAST({col} AS STRING)"
    return (
        f"CASE WHEN {v} IS NULL OR {v} = '' THEN '__null__' "
        f"WHEN upper({v}) <> '__NULL__' AND {v} RLIKE '^[!-}}]([ -}}]*[!-}}])?$' "
        f"THEN upper(regexp_replace({v}, '([a-z]+)', '~$1~')) "
        f"ELSE concat('~~', hex(encode({v}, 'UTF-8'))) END"
    )


@pytest.mark.parametrize(
    ("column", "transform", "expected"),
    [
        ("full_name", "identity", _identity_partition("`full_name`")),
        ("order", "identity", _identity_partition("`order`")),
        ("at", "day", "COALESCE(date_format(`at`, 'yyyy-MM-dd'), '__null__')"),
        ("at", "month", "COALESCE(date_format(`at`, 'yyyy-MM'), '__null__')"),
        ("at", "year", "COALESCE(date_format(`at`, 'yyyy'), '__null__')"),
    ],
)
def test_partition_value_is_rendered_from_the_rule_template(column: str, transform: str, expected: str) -> None:
    from cdc_compaction.core.sql import partition_sql

    columns = [*STUDENT_COLUMNS, {"name": "order", "type": "int"}, {"name": "at", "type": "timestamp"}]
    cfg = cfg_of(columns=[dict(c) for c in columns], partition_by={"column": column, "transform": transform})
    part = partition_sql(cfg)
    assert part is not None
    assert part.to_dict() == {"column": column, "transform": transform, "value": expected}


def test_nan_is_refused_only_in_floating_point_order_by_columns(make_cfg) -> None:
    cfg = make_cfg(
        columns=[
            {"name": "id", "type": "int"},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "bigint"},
            {"name": "v", "type": "double"},
            {"name": "w", "type": "FLOAT"},
            {"name": "x", "type": "double"},
        ],
        order_by=["ts_ms", "v", "w"],
    )
    reason = rule_sql(cfg).reject_reason
    assert "isnan(`v`) THEN 'nan_order_by:v'" in reason
    assert "isnan(`w`) THEN 'nan_order_by:w'" in reason
    assert "isnan(`ts_ms`)" not in reason and "isnan(`x`)" not in reason
    # NULL first: isnan(NULL) is false anyway, but the reason must say NULL.
    assert reason.index("null_order_by:v") < reason.index("nan_order_by:v")
