"""Erase selects exactly what SQL selects: a differential test against DuckDB and Spark SQL.

``erase --where`` promises SQL's semantics ("as in SQL, a row whose predicate is NULL is not
erased"). Here rows of every registry type (NULLs, NaN, -0.0, unicode, blank-padded CHAR) and
predicates of the whole accepted grammar (comparisons, AND/OR/NOT, [NOT] IN with NULLs in the list,
IS [NOT] NULL, [NOT] BETWEEN) are generated; the rows the erase keeps (``erase._split``, the function
the erase, its preview and its verification use) are compared with what DuckDB keeps for
``DELETE ... WHERE <predicate>`` (``NOT COALESCE(p, FALSE)``) on the same rows, and for CHAR(n)
columns (DuckDB has no CHAR semantics) with what Spark SQL keeps. Expectations never come from
the project's evaluator.

A predicate the project refuses is accepted only with one of the documented reasons (forms on which
the engines disagree); a predicate DuckDB rejects must be refused by the project too.

``make test`` runs a bounded, derandomized number of examples (``CDC_FUZZ_EXAMPLES`` unset);
``make fuzz`` sets ``CDC_FUZZ_EXAMPLES`` and draws fresh ones.
"""

from __future__ import annotations

import functools
import math
import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import FUZZ_EXAMPLES, first_version, fuzz_settings, student_doc
from hypothesis import event, given, settings
from hypothesis import strategies as st

from cdc_compaction.core.exceptions import ErasePredicateError
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.ownership import claim
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.devtools.conformance import land
from cdc_compaction.operations.erase import _split, erase, parse_predicate, preview

# ------------------------------------------------------------------------- the table
#: One column per registry type (name, registry type, Arrow type as the lake stores it).
TYPES: list[tuple[str, str, pa.DataType]] = [
    ("ti", "tinyint", pa.int8()),
    ("si", "smallint", pa.int16()),
    ("i", "int", pa.int32()),
    ("bi", "bigint", pa.int64()),
    ("f", "float", pa.float32()),
    ("d", "double", pa.float64()),
    ("dec", "decimal(10,2)", pa.decimal128(10, 2)),
    ("s", "string", pa.string()),
    ("c", "char(6)", pa.string()),
    ("vc", "varchar(8)", pa.string()),
    ("b", "boolean", pa.bool_()),
    ("dt", "date", pa.date32()),
    ("ts", "timestamp", pa.timestamp("us", tz="UTC")),
]
KIND = {name: hive for name, hive, _ in TYPES}
CHAR_WIDTH = 6


def typed_cfg(root: Path, table: str = "typed") -> TableConfig:
    columns = [{"name": "id", "type": "int"}, {"name": "op", "type": "string"}, {"name": "ts_ms", "type": "bigint"}]
    columns += [{"name": n, "type": h} for n, h, _ in TYPES]
    return parse_table(student_doc(root, table, columns=columns))


def family(name: str) -> str:
    hive = KIND[name]
    if hive in ("tinyint", "smallint", "int", "bigint"):
        return "int"
    if hive.startswith("decimal"):
        return "decimal"
    if hive.startswith("char"):
        return "char"
    if hive in ("string",) or hive.startswith("varchar"):
        return "string"
    return hive


INT_RANGE = {"ti": 7, "si": 15, "i": 31, "bi": 63}
SAFE_TEXT = st.characters(exclude_categories=("Cs", "Cc"))
POOL_TEXT = ["", "a", "A", "Alice", "Bob", "é", "日本", " a", "a ", "ab", "Zz", "\u00a0", "O'Brien", "'", "''", "a'"]


def ints(name: str) -> st.SearchStrategy[int]:
    bits = INT_RANGE[name]
    lo, hi = -(2**bits), 2**bits - 1
    return st.one_of(st.integers(-3, 3), st.sampled_from([lo, hi, 100, -100]), st.integers(lo, hi))


def f32(x: float) -> float:
    import struct

    return struct.unpack("<f", struct.pack("<f", x))[0]


FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 0.5, 1.0, -1.5, 3.0, math.nan, math.inf, -math.inf, 0.25]),
    st.floats(width=32, allow_nan=True),
)
DOUBLES = st.one_of(
    st.sampled_from([0.0, -0.0, 0.1, 0.5, 1.0, -1.5, 3.0, 1e308, math.nan, math.inf, -math.inf]),
    st.floats(allow_nan=True),
)
DECIMALS = st.one_of(
    st.sampled_from([Decimal("0.00"), Decimal("0.12"), Decimal("1.00"), Decimal("-2.50"), Decimal("99999999.99")]),
    st.integers(-(10**10) + 1, 10**10 - 1).map(lambda n: Decimal(n).scaleb(-2)),
)
TEXTS = st.one_of(st.sampled_from(POOL_TEXT), st.text(SAFE_TEXT, max_size=6))
DATES = st.one_of(st.sampled_from([date(2026, 1, 1), date(1999, 12, 31)]), st.dates(date(1900, 1, 1), date(2100, 1, 1)))
TIMESTAMPS = st.one_of(
    st.sampled_from([datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 12, 30, 0, 5, tzinfo=UTC)]),
    st.datetimes(datetime(1970, 1, 2), datetime(2100, 1, 1)).map(lambda t: t.replace(tzinfo=UTC)),
)


@functools.cache
def values(name: str) -> st.SearchStrategy[Any]:
    """A value of column ``name`` as the lake stores it (CHAR arrives blank-padded to its width)."""
    fam = family(name)
    if fam == "int":
        return ints(name)
    if name == "f":
        return FLOATS.map(f32)
    if name == "d":
        return DOUBLES
    if fam == "decimal":
        return DECIMALS
    if name == "c":
        return TEXTS.map(lambda t: t[:CHAR_WIDTH].ljust(CHAR_WIDTH))
    if name == "vc":
        return TEXTS
    if fam == "string":
        return TEXTS
    if fam == "boolean":
        return st.booleans()
    if fam == "date":
        return DATES
    return TIMESTAMPS


@st.composite
def rows(draw: st.DrawFn, min_size: int = 1, max_size: int = 12) -> pa.Table:
    n = draw(st.integers(min_size, max_size))
    cols: dict[str, pa.Array] = {"__rn": pa.array(range(n), pa.int64())}
    for name, _, arrow in TYPES:
        cols[name] = pa.array(draw(st.lists(st.none() | values(name), min_size=n, max_size=n)), arrow)
    return pa.table(cols)


# ------------------------------------------------------------------------- predicates
@dataclass(frozen=True)
class Sql:
    """One predicate rendered for Spark SQL (Hive's backslash string escapes), for DuckDB (SQL's
    ``''``) and as the project is given it (either: each string literal picks one)."""

    hive: str
    duck: str
    project: str


def both(text: str) -> Sql:
    return Sql(text, text, text)


def join(*parts: Sql | str) -> Sql:
    def render(form: str) -> str:
        return "".join(p if isinstance(p, str) else getattr(p, form) for p in parts)

    return Sql(render("hive"), render("duck"), render("project"))


def string_lit(text: str, sql_escape: bool = False) -> Sql:
    """``text`` quoted for Spark SQL (backslash escapes) and for DuckDB (``''``); the project gets
    the Spark SQL form, or (``sql_escape``) the very text DuckDB reads. A backslash is an escape in
    Spark SQL and Hive, plain text in DuckDB: a text holding one goes to the project Spark's way."""
    hive = "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    sql = "'" + text.replace("'", "''") + "'"
    return Sql(hive, sql, sql if sql_escape and "\\" not in text else hive)


def number_text(v: Any, form: str) -> str:
    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, int):
        return str(v)
    text = repr(float(v))
    if form == "double" and "e" not in text:
        text += "e0"  # an exponent makes it a double literal in both engines
    return text


@st.composite
def literal(draw: st.DrawFn, name: str, in_list: bool = False) -> Sql:
    """A literal for column ``name``: mostly a value of its type (so rows match), sometimes another
    numeric kind (decimal against an integer, a double, an out-of-range integer) or NULL."""
    if draw(st.integers(0, 9)) == 0:
        return both("NULL")
    fam = family(name)
    if fam in ("int", "decimal", "float", "double"):
        v = draw(values(name))
        if isinstance(v, float) and not math.isfinite(v):
            if in_list:
                v = draw(st.sampled_from([0.5, -1.0]))
            else:
                return both({"nan": "'NaN'", "inf": "'Infinity'", "-inf": "'-Infinity'"}[repr(v)])
        form = draw(st.sampled_from(["same", "same", "same", "decimal", "double", "int", "quoted"]))
        if form == "decimal":
            v = Decimal(draw(st.integers(-100000, 100000))).scaleb(-draw(st.integers(0, 3)))
        elif form == "int":
            v = draw(st.integers(-(2**64), 2**64) | st.integers(-300, 300))
        elif form == "double":
            v = float(v)
        elif form == "quoted" and not in_list:
            return both(f"'{number_text(v, form)}'")  # '3' against an int column: read as the column's type
        return both(number_text(v, form))
    if fam == "boolean":
        return both(draw(st.sampled_from(["TRUE", "FALSE"])))
    if fam == "date":
        return both(f"'{draw(DATES).isoformat()}'")
    if fam == "timestamp":
        t = draw(TIMESTAMPS)
        return both(f"'{t.strftime('%Y-%m-%d %H:%M:%S') + (f'.{t.microsecond:06d}' if t.microsecond else '')}'")
    text = draw(TEXTS)
    if fam == "char" and draw(st.booleans()):
        text = text.rstrip(" ")  # the unpadded spelling a user writes
    return string_lit(text, sql_escape=draw(st.booleans()))


#: Pairs of columns SQL compares without a type question the project refuses.
COLUMN_PAIRS = [
    ("i", "bi"),
    ("ti", "si"),
    ("d", "f"),
    ("i", "d"),
    ("dec", "i"),
    ("dec", "dec"),
    ("s", "vc"),
    ("dt", "dt"),
    ("ts", "ts"),
    ("b", "b"),
    ("f", "f"),
]
OPS = ["=", "<>", "!=", "<", "<=", ">", ">="]


@st.composite
def atom(draw: st.DrawFn, names: list[str]) -> Sql:
    name = draw(st.sampled_from(names))
    form = draw(st.sampled_from(["cmp", "cmp", "cmp_rev", "cols", "is", "in", "in", "between"]))
    if form == "cols":
        pairs = [p for p in COLUMN_PAIRS if p[0] in names and p[1] in names]
        if pairs:
            a, b = draw(st.sampled_from(pairs))
            return both(f"{a} {draw(st.sampled_from(OPS))} {b}")
        form = "cmp"
    if form == "cmp":
        return join(name, f" {draw(st.sampled_from(OPS))} ", draw(literal(name)))
    if form == "cmp_rev":
        return join(draw(literal(name)), f" {draw(st.sampled_from(OPS))} ", name)
    if form == "is":
        return both(f"{name} IS {draw(st.sampled_from(['', 'NOT ']))}NULL")
    if form == "in":
        items = draw(st.lists(literal(name, in_list=True), min_size=1, max_size=4))
        listed = join(*[x for i, item in enumerate(items) for x in ((", " if i else ""), item)])
        return join(name, draw(st.sampled_from([" IN (", " NOT IN ("])), listed, ")")
    return join(
        name, draw(st.sampled_from([" BETWEEN ", " NOT BETWEEN "])), draw(literal(name)), " AND ", draw(literal(name))
    )


def predicates(names: list[str]) -> st.SearchStrategy[Sql]:
    return st.recursive(
        atom(names),
        lambda inner: st.one_of(
            inner.map(lambda p: join("NOT (", p, ")")),
            inner.map(lambda p: join("NOT ", p)),
            st.tuples(inner, inner).map(lambda ab: join("(", ab[0], ") AND (", ab[1], ")")),
            st.tuples(inner, inner).map(lambda ab: join("(", ab[0], ") OR (", ab[1], ")")),
        ),
        max_leaves=4,
    )


#: The documented refusals: forms on which the SQL engines disagree, or values that cannot be typed.
REFUSALS = re.compile(
    "|".join(
        [
            r"is not exactly a 32-bit float",
            r"more digits than a double holds",
            r"out of range",
            r"more than 38 decimal digits",
            r"is not a \w+ \(column",  # a literal that does not read as the column's type
            r"a quoted value in the IN list",
            r"Spark SQL compares BETWEEN on a CHAR column",
            r"with a NULL in the list Spark SQL compares CHAR",
            r"write the value as a decimal",
        ]
    )
)


def project_keeps(cfg: TableConfig, where: str, table: pa.Table) -> list[int] | None:
    """The row numbers the erase keeps (``None``: refused, with a documented reason)."""
    try:
        pred = parse_predicate(cfg, where)
    except ErasePredicateError as exc:
        assert REFUSALS.search(str(exc)), f"undocumented refusal of {where!r}: {exc}"
        event(f"refused: {REFUSALS.search(str(exc)).group(0)}")  # type: ignore[union-attr]
        return None
    kept, _ = _split(cfg, pred, table)
    return kept.column("__rn").to_pylist()


@functools.cache
def duck() -> duckdb.DuckDBPyConnection:
    """One in-memory DuckDB for the module (a connection per example costs more than the example)."""
    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")  # a timestamp literal without an offset is UTC, as in the lake
    return con


def duck_keeps(con: duckdb.DuckDBPyConnection, where: str, table: pa.Table) -> list[int] | None:
    """The row numbers ``DELETE FROM t WHERE <where>`` keeps in DuckDB (``None``: DuckDB rejects it)."""
    con.register("t", table)
    try:
        got = con.execute(f"SELECT __rn FROM t WHERE NOT COALESCE(({where}), FALSE) ORDER BY __rn").fetchall()
    except duckdb.Error:
        return None
    finally:
        con.unregister("t")
    return [r[0] for r in got]


NON_CHAR = [n for n, _, _ in TYPES if n != "c"]


@fuzz_settings(test_examples=200)
@given(table=rows(), where=predicates(NON_CHAR))
def test_erase_selects_what_duckdb_selects(table: pa.Table, where: Sql) -> None:
    cfg = typed_cfg(Path("/nonexistent-lake"))
    expected = duck_keeps(duck(), where.duck, table)
    got = project_keeps(cfg, where.project, table)
    if expected is None:
        # DuckDB rejects it (a value that is not of the column's type): the project must refuse too.
        assert got is None, f"DuckDB rejects {where.duck!r}, the project evaluated it"
        return
    if got is not None:
        event("evaluated")
        assert got == expected, f"{where.project!r}: erase keeps rows {got}, SQL keeps {expected}\n{table.to_pylist()}"


# ------------------------------------------------------------------------- CHAR against Spark SQL
STRINGY = ["c", "vc", "s"]


#: Spark runs 20 predicates per example in one query: a few examples, even under ``make fuzz``.
SPARK_EXAMPLES = min(int(FUZZ_EXAMPLES), 30) if FUZZ_EXAMPLES else 6


@pytest.mark.spark
@pytest.mark.metastore  # the session fixture's SparkSession uses the local metastore
@settings(fuzz_settings(test_examples=6), max_examples=SPARK_EXAMPLES)
@given(table=rows(min_size=4, max_size=10), wheres=st.lists(predicates(STRINGY), min_size=20, max_size=20))
def test_char_varchar_string_select_what_spark_sql_selects(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, table: pa.Table, wheres: list[Sql]
) -> None:
    """CHAR(n) compares blank-padded in Spark SQL (DuckDB has no CHAR): 20 predicates, one query."""
    cfg = typed_cfg(Path("/nonexistent-lake"))
    path = tmp_path_factory.mktemp("chars") / uuid.uuid4().hex
    path.mkdir()
    pq.write_table(table.select(["__rn", *STRINGY]), str(path / "part-0.parquet"))
    view = f"erase_chars_{uuid.uuid4().hex[:8]}"
    spark.sql(
        f"CREATE TEMPORARY VIEW {view} (__rn BIGINT, c CHAR({CHAR_WIDTH}), vc VARCHAR(8), s STRING) "
        f"USING parquet OPTIONS (path '{path}')"
    )
    try:
        selects = ", ".join(f"COALESCE(({w.hive}), FALSE) AS p{i}" for i, w in enumerate(wheres))
        result = spark.sql(f"SELECT __rn, {selects} FROM {view} ORDER BY __rn").collect()
    finally:
        spark.catalog.dropTempView(view)
    for i, w in enumerate(wheres):
        expected = [r["__rn"] for r in result if not r[f"p{i}"]]
        got = project_keeps(cfg, w.hive, table)
        if got is not None:
            assert got == expected, f"{w.hive!r}: erase keeps rows {got}, Spark SQL keeps {expected}"


# ------------------------------------------------------------------------- regressions on a real lake
NAMES = pa.schema([("id", pa.int32()), ("name", pa.string()), ("op", pa.string()), ("ts_ms", pa.int64())])
ROWS = [
    {"id": 1, "name": "Alice", "op": "c", "ts_ms": 1},
    {"id": 2, "name": "Bob", "op": "c", "ts_ms": 2},
    {"id": 3, "name": None, "op": "c", "ts_ms": 3},
]


def small_lake(root: Path, name_type: str, rows_: list[dict[str, Any]]) -> tuple[TableConfig, list[str]]:
    """A table whose live version, archive and pending increment each hold ``rows_``; the files."""
    columns = [
        {"name": "id", "type": "int"},
        {"name": "name", "type": name_type},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": "bigint"},
    ]
    cfg = parse_table(student_doc(root, "people", columns=columns))
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    version = "v00000001-plan1-a"
    files = []
    for path in (
        posixpath.join(lake.layout.version_dir(version), "data", "part-0.parquet"),
        posixpath.join(lake.layout.archive, "c00000001", "increment_2026112200", "f0.parquet"),
    ):
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows_, schema=NAMES), path)
        files.append(path)
    first_version(lake, version, {"output_visible_rows": len(rows_)})
    files += land(cfg, "increment_2026112201", [rows_])
    return cfg, files


def ids_left(cfg: TableConfig, files: list[str]) -> dict[str, list[int]]:
    """The ids every file of the table holds now (the live version's under its current name)."""
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    live = lake.latest_commit()
    out = {}
    for p in files:
        if "/base/" in p:
            p = posixpath.join(lake.layout.version_dir(live.version), "data", "part-0.parquet")
        out[posixpath.relpath(p, lake.layout.root).split("/")[0]] = sorted(pq.read_table(p).column("id").to_pylist())
    return out


def duck_ids_kept(where: str, rows_: list[dict[str, Any]]) -> list[int]:
    con = duck()
    con.register("people", pa.Table.from_pylist(rows_, schema=NAMES))
    try:
        got = con.execute(f"SELECT id FROM people WHERE NOT COALESCE(({where}), FALSE) ORDER BY id").fetchall()
    finally:
        con.unregister("people")
    return [r[0] for r in got]


@pytest.mark.parametrize(
    ("where", "kept"),
    [
        # SQL: NULL NOT IN ('Bob') is NULL, so row 3 stays; pyarrow's is_in said FALSE, NOT made it TRUE.
        ("name NOT IN ('Bob')", [2, 3]),
        # SQL: NULL IN ('Alice', NULL) is NULL; pyarrow's is_in matched NULL with NULL.
        ("name IN ('Alice', NULL)", [2, 3]),
        # SQL: id IN (NULL) is NULL for every row, and so is its NOT: nothing is erased (main erased everything).
        ("NOT id IN (NULL)", [1, 2, 3]),
    ],
)
def test_erase_in_lists_with_nulls_follow_sql(tmp_path: Path, where: str, kept: list[int]) -> None:
    assert duck_ids_kept(where, ROWS) == kept, "the expectation is what DuckDB keeps"
    cfg, files = small_lake(tmp_path / "lake", "string", ROWS)
    erase(cfg, where, actor="dpo")
    assert ids_left(cfg, files) == {"base": kept, "archive": kept, "incremental": kept}


def test_erase_compares_char_columns_blank_padded(tmp_path: Path) -> None:
    """A CHAR(10) value arrives as 'Alice     ': SQL (Spark, ANSI) pads, so name = 'Alice' matches it."""
    padded = [dict(r, name=r["name"].ljust(10) if r["name"] else None) for r in ROWS]
    cfg, files = small_lake(tmp_path / "lake", "char(10)", padded)
    assert preview(cfg, "name = 'Alice'")["rows"]["live"] == 1
    audit = erase(cfg, "name = 'Alice'", actor="dpo")
    assert audit["rows_removed"]["live"] == 1 and not audit["verified"]["matching_files"]
    assert ids_left(cfg, files) == {"base": [2, 3], "archive": [2, 3], "incremental": [2, 3]}


def test_refused_forms_name_the_form_and_a_rewrite(tmp_path: Path) -> None:
    cfg = typed_cfg(tmp_path / "lake")
    cases = {
        "c BETWEEN 'a' AND 'b'": "write <column> >= <low> AND <column> <= <high>",
        "c IN ('a', NULL)": "leave the NULL out",
        "f = 0.1": "compare with a value a FLOAT holds exactly",
        "d IN (1, 'NaN')": "d IN (...) OR d = 'NaN'",
        "i BETWEEN SYMMETRIC 1 AND 2": "(x BETWEEN a AND b) OR (x BETWEEN b AND a)",
        "s = 5": "quote the value",
        "i = TRUE": "compare a boolean column with TRUE/FALSE",
        "c = s": "compare each column with a literal",
        "i = 1.5e": "is not a number literal",
    }
    for where, rewrite in cases.items():
        with pytest.raises(ErasePredicateError) as err:
            parse_predicate(cfg, where)
        assert rewrite in str(err.value) and cfg.qualified_name in str(err.value), (where, str(err.value))


def test_decimal_literals_compare_exactly(tmp_path: Path) -> None:
    """0.123 is not 0.12 (main rounded the literal to the column's scale and erased the 0.12 row)."""
    cfg = typed_cfg(tmp_path / "lake")
    table = pa.table({"__rn": [0, 1], "dec": pa.array([Decimal("0.12"), Decimal("0.13")], pa.decimal128(10, 2))})
    for where in ("dec = 0.123", "dec < 0.125", "dec IN (0.123, 0.13)", "i < 2.5"):
        table_i = table.append_column("i", pa.array([2, 3], pa.int32()))
        assert project_keeps(cfg, where, table_i) == duck_keeps(duck(), where, table_i), where


def test_nan_orders_as_the_sql_engines_order_it(tmp_path: Path) -> None:
    cfg = typed_cfg(tmp_path / "lake")
    table = pa.table({"__rn": [0, 1, 2, 3], "d": [math.nan, -0.0, 1e308, None]})
    for where in ("d = 'NaN'", "d > 1e308", "d >= 0", "d = 0", "d <> d", "d IN (0.0, 1.0)", "NOT d < 'NaN'"):
        assert project_keeps(cfg, where, table) == duck_keeps(duck(), where, table), where


# ------------------------------------------------------------------------- SQL's '' escape
#: Names a doubled quote can be read as: O'Brien (SQL, DuckDB), OBrien (Spark SQL's adjacent literals).
QUOTED = ["O'Brien", "OBrien", "O", "Brien", "'", "''", "O''Brien", "it's", "", None]


@pytest.mark.parametrize(
    "where",
    [
        "s = 'O''Brien'",
        "s <> 'O''Brien'",
        "s IN ('O''Brien', '''')",
        "s NOT IN ('it''s', '''''')",
        "s = ''''''",
        "s = ''",
        "s >= 'O''' AND s < 'O'''''",
        "NOT s = 'it''s' OR s = 'O''Brien'",
        "s BETWEEN '''' AND 'O''Brien'",
    ],
)
def test_sql_doubled_quotes_select_what_duckdb_selects(where: str) -> None:
    """SQL's own escape, which DuckDB accepts: the project reads 'O''Brien' as O'Brien, as DuckDB does."""
    cfg = typed_cfg(Path("/nonexistent-lake"))
    table = pa.table({"__rn": pa.array(range(len(QUOTED)), pa.int64()), "s": pa.array(QUOTED, pa.string())})
    expected = duck_keeps(duck(), where, table)
    assert expected is not None, f"DuckDB rejects {where!r}"
    assert project_keeps(cfg, where, table) == expected, where


QUOTY_TEXT = st.text(st.sampled_from("'''ab \"é;-") | SAFE_TEXT.filter(lambda c: c != "\\"), max_size=8)


@fuzz_settings(test_examples=150)
@given(texts=st.lists(QUOTY_TEXT, min_size=1, max_size=6), picks=st.lists(st.integers(0, 5), min_size=1, max_size=3))
def test_random_strings_with_doubled_quotes_select_what_duckdb_selects(texts: list[str], picks: list[int]) -> None:
    """Random strings with quotes, written with SQL's '' escape, select exactly DuckDB's rows."""
    cfg = typed_cfg(Path("/nonexistent-lake"))
    values = [*texts, None]
    table = pa.table({"__rn": pa.array(range(len(values)), pa.int64()), "s": pa.array(values, pa.string())})
    wanted = [texts[i % len(texts)] for i in picks]
    quoted = ["'" + t.replace("'", "''") + "'" for t in wanted]
    for where in (f"s = {quoted[0]}", f"s IN ({', '.join(quoted)})", f"s <> {quoted[-1]}", f"s < {quoted[0]}"):
        expected = duck_keeps(duck(), where, table)
        assert expected is not None, f"DuckDB rejects {where!r}"
        # Built from the inputs too: '=' keeps exactly the rows whose text is not the one written.
        if where.startswith("s = "):
            assert expected == [i for i, v in enumerate(values) if v is None or v != wanted[0]]
        assert project_keeps(cfg, where, table) == expected, where


def test_erase_with_a_doubled_quote_erases_o_brien(tmp_path: Path) -> None:
    rows_ = [
        *ROWS,
        {"id": 4, "name": "O'Brien", "op": "c", "ts_ms": 4},
        {"id": 5, "name": "OBrien", "op": "c", "ts_ms": 5},
    ]
    where = "name = 'O''Brien'"
    assert duck_ids_kept(where, rows_) == [1, 2, 3, 5], "the expectation is what DuckDB keeps"
    cfg, files = small_lake(tmp_path / "lake", "string", rows_)
    audit = erase(cfg, where, actor="dpo")
    assert audit["rows_removed"]["live"] == 1 and not audit["verified"]["matching_files"]
    assert ids_left(cfg, files) == {"base": [1, 2, 3, 5], "archive": [1, 2, 3, 5], "incremental": [1, 2, 3, 5]}


def test_an_unterminated_string_is_refused_naming_the_predicate(tmp_path: Path) -> None:
    cfg = typed_cfg(tmp_path / "lake")
    for where in ("s = 'O''Brien", "s = 'abc"):
        with pytest.raises(ErasePredicateError) as err:
            parse_predicate(cfg, where)
        assert "does not parse" in str(err.value) and cfg.qualified_name in str(err.value), str(err.value)
