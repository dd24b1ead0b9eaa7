"""Erase by predicate: remove every row matching a predicate from everywhere a table keeps rows (GDPR).

Where rows live (the *locations* of an erase)::

    live        the live version's files (data, tombstones, partitions)
    versions    every other directory under base/ (kept versions a rollback could bring back)
    pending     the landing area (increments not compacted yet)
    archive     archived increments (what a replay or rebuild reads)
    quarantine  refused rows and files
    changes     the change feed's partitions (``<t>_changes``, pipeline/changes.py)
    rebuild     a rebuild's replay (``rebuild/<id>/``, left by ``rebuild`` without ``--publish``)
    other       anything else under the table's storage root that holds rows

Everything under the storage root is walked, and nothing is skipped by its name (:func:`inventory`):
a file is Parquet when its bytes say so (a sink may land Parquet as ``events.json``), landed data is
what the plan reads (:func:`cdc_compaction.core.landing.is_data`, the one rule), hidden and nested files
count too.  A non-empty file that is neither Parquet nor a JSON record of the lake may hold rows the
erase cannot filter: the erase refuses, naming it, before it changes anything.

Partition values (``partition_by``): a value whose every row is erased (over every version, rebuild
and location) vanishes -- its ``cdc_partition=<value>`` directories (``_cdc_partition=<value>`` in versions
written before issue 37; data, tombstones, key index; kept versions and rebuilds) are deleted, the base
table's metastore partition is dropped, and every
bookkeeping record naming it (commit records, plans, ``pointer.json``, ``_cdc_stats.json``,
manifests) is rewritten without it (:func:`scrub`).  A value some kept row still holds stays.

The protocol, serialized with compactions by the table lease (:class:`lake.TableLease`):

1. Refuse while the live commit is not archived (its run is unfinished); roll forward (or discard)
   an earlier erase that did not finish (its journal says which).
2. Scan every file of every location with the predicate (pyarrow.compute, no Spark); refuse files
   it cannot filter (see above).
3. Write the journal ``_cdc/erase/<id>.json``: each matching file and the hidden name
   (``.<name>.erase-<id>``) its filtered rewrite gets beside it.  Readers skip hidden names.
4. Write the rewrites; when the live version holds matching rows, also a new version
   directory ``base/v<seq+1>-erase-<id>-a/`` with the live files, filtered.
5. The atomic decision: the erase commit record (``plan_id`` ``erase-<id>``, ``stats.kind`` ``erase``)
   when the live version changed, then the marker ``_cdc/erase/<id>.committed``.  Before it, a crash
   leaves only hidden files and an unreferenced directory, which the next erase discards.
6. After it: the pointer moves to the erase version; each rewrite replaces its original (an atomic
   copy over the same name: plans, manifests and archives name files by name, and the versions they
   belong to are no longer live -- the one documented exception to "never written again"), and the
   hidden rewrite is deleted; the emptied partitions are dropped (metastore first, then their
   directories) and the records naming them rewritten -- commit records included, the same documented
   exception.  Re-running the erase redoes whatever a crash left undone.
7. The audit record ``_cdc/erase/<id>.audit.json`` (who, when, the predicate with its literals replaced
   by ``?`` and its SHA-256, rows removed per location, files rewritten -- never a row's values), then
   :func:`verify` re-reads every file and proves that nothing matches: decoded Parquet rows, and every
   path name, record and other file for the erased partition values and the predicate's identifying
   literals (:func:`identifying_literals`).  The journal keeps the predicate (and the dropped values)
   until the erase finished; it is deleted then.

A table mode may add columns the predicate is checked on too (``TableMode.erase_images``; keyless
tables: an event's before-image) and version subdirectories never rewritten (``TableMode.erase_keeps``;
keyless tables: a version's watermark, its tombstones file).
"""

from __future__ import annotations

import functools
import getpass
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from cdc_compaction.core.exceptions import ConcurrentCommitError, ConcurrentRunError, EraseError, ErasePredicateError
from cdc_compaction.core.hive_types import arrow_type, decimal_parts
from cdc_compaction.core.lake import Commit, Lake, TableLease
from cdc_compaction.core.mode import mode_of
from cdc_compaction.core.ownership import require_owner
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.core.storage.base import FileInfo
from cdc_compaction.job.contract import CHANGES_DIR, INDEX_DIR, partition_dir_value, partition_value
from cdc_compaction.job.faults import fault_point
from cdc_compaction.pipeline.owned import remove_job_files, remove_version_files

log = logging.getLogger(__name__)

LOCATIONS = ("live", "versions", "pending", "archive", "quarantine", "changes", "rebuild", "other")
#: How long an erase holds the table's lease; a crashed erase blocks compactions at most this long.
LEASE_TTL = timedelta(hours=1)


# ------------------------------------------------------------------------- the predicate
@dataclass(frozen=True)
class Predicate:
    """A validated erase predicate: its text, the registry columns it names and its Arrow expression."""

    text: str
    columns: tuple[str, ...]
    #: pyarrow.compute.Expression with SQL's three-valued result: TRUE where a row is to be erased,
    #: FALSE or NULL (unknown) where it is kept.
    expression: Any


#: sqlglot's comparison node -> the operator's name in :func:`_sql_compare`.
_COMPARISONS = {"EQ": "eq", "NEQ": "ne", "GT": "gt", "GTE": "ge", "LT": "lt", "LTE": "le"}
#: The operator with its operands swapped (``5 < x`` is ``x > 5``).
_FLIPPED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
#: A numeric literal as Spark SQL and DuckDB read it: an integer, a decimal (with a point) or a
#: double (with an exponent).  Hive's suffixed forms (1L, 1.5BD) parse as casts and are refused.
_NUMBER = re.compile(r"^(?:\d+\.?\d*|\.\d+)(?P<exp>[eE][+-]?\d+)?$")
_INT_BITS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}
_CHAR = re.compile(r"^char\((\d+)\)$")


@functools.cache
def _predicate_dialect() -> Any:
    """The dialect erase predicates are read in: Hive's (backslash escapes, as Spark SQL), plus
    SQL's own escape of a quote, a doubled ``''`` inside a string, read as DuckDB reads it.

    Plain Hive and Spark SQL read ``'O''Brien'`` as two adjacent literals, ``'O'`` and ``'Brien'``
    (OBrien); SQL and DuckDB read one, O'Brien, which is what a person who writes it means.
    """
    from sqlglot.dialects.hive import Hive

    class ErasePredicate(Hive):
        class Tokenizer(Hive.Tokenizer):
            STRING_ESCAPES = ["\\", "'"]

    return ErasePredicate


def _parse_predicate_sql(text: str) -> list[Any]:
    """``text`` parsed as the erase predicate's SQL (raises sqlglot's ParseError, also for what does
    not even tokenize, such as an unterminated string)."""
    import sqlglot

    try:
        return sqlglot.parse(text, read=_predicate_dialect())
    except sqlglot.errors.TokenError as exc:
        raise sqlglot.errors.ParseError(str(exc).replace("Error tokenizing", "cannot read", 1)) from exc


@dataclass(frozen=True)
class _Lit:
    """A literal of the predicate as SQL types it: ``null``, ``string``, ``bool``, ``int``,
    ``decimal`` (a number with a point: exact) or ``double`` (a number with an exponent)."""

    kind: str
    value: Any
    sql: str


def _family(hive_type: str) -> str:
    """The comparison rules a registry type follows (see ``column_vs_literal`` in :func:`parse_predicate`)."""
    t = hive_type.lower()
    if t in _INT_BITS:
        return "int"
    if t in ("float", "double"):
        return t
    if t.startswith("decimal"):
        return "decimal"
    if _CHAR.match(t):
        return "char"
    if t == "string" or t.startswith("varchar"):
        return "string"
    return t  # boolean, date, timestamp, binary


def _null_bool() -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.scalar(pa.scalar(None, pa.bool_()))


def _sql_compare(op: str, lhs: Any, rhs: Any, nan_aware: bool = False) -> Any:
    """``lhs <op> rhs`` with SQL's NULL rule (NULL when either side is NULL) and, for floating
    point (``nan_aware``), the order DuckDB and Spark SQL use: NaN equals NaN and is greater than
    every other value, -0.0 equals 0.0.  Arrow's comparisons follow IEEE (NaN compares false)."""
    import pyarrow.compute as pc

    if op == "gt":
        return _sql_compare("lt", rhs, lhs, nan_aware)
    if op == "ge":
        return _sql_compare("le", rhs, lhs, nan_aware)
    if not nan_aware:
        return {"eq": lhs == rhs, "ne": lhs != rhs, "lt": lhs < rhs, "le": lhs <= rhs}[op]
    # Kleene AND/OR keep NULL where an operand is NULL: is_nan(NULL) is NULL.
    eq = (lhs == rhs) | (pc.is_nan(lhs) & pc.is_nan(rhs))
    lt = (lhs < rhs) | (~pc.is_nan(lhs) & pc.is_nan(rhs))
    return {"eq": eq, "ne": ~eq, "lt": lt, "le": lt | eq}[op]


def _float32_exact(value: float) -> bool:
    """Whether ``value`` is exactly a 32-bit float (DuckDB compares FLOAT columns in 32 bits,
    Spark SQL in 64: they agree only on such values)."""
    import struct

    try:
        return struct.unpack("<f", struct.pack("<f", value))[0] == value or value != value
    except OverflowError:
        return False


def parse_predicate(cfg: TableConfig, text: str) -> Predicate:
    """Parse ``text`` as a boolean expression over ``cfg``'s registry columns; refuse anything else.

    Allowed: column names of the registry, number/string/boolean literals, NULL, comparisons,
    AND/OR/NOT, IN (literals), IS [NOT] NULL, BETWEEN and parentheses.  Anything else (functions,
    subqueries, several statements, unknown columns) is refused naming the offending token: the text
    is never passed to an SQL engine, so it cannot inject anything.

    The expression selects what Spark SQL and DuckDB select for ``DELETE ... WHERE <text>``:
    three-valued logic (a comparison with NULL is NULL, ``x IN (1, NULL)`` is NULL unless x is 1,
    NOT NULL is NULL; only TRUE erases), the SQL engines' NaN order, exact decimal comparisons and
    CHAR(n)'s blank padding.  A form on which the engines disagree is refused with a rewrite.
    """
    import sqlglot
    from sqlglot import exp

    table = cfg.qualified_name

    def refuse(why: str) -> ErasePredicateError:
        return ErasePredicateError(
            f"{table}: erase --where {text!r}: {why}. Write a boolean expression over the registry columns "
            f"({', '.join(cfg.column_names)}) with literals, comparisons, AND/OR/NOT, IN, IS NULL, BETWEEN"
        )

    if not text.strip():
        raise refuse("the predicate is empty (to erase a whole table, delete it)")
    try:
        statements = _parse_predicate_sql(text)
    except sqlglot.errors.ParseError as exc:
        raise refuse(f"it does not parse ({str(exc).splitlines()[0]})") from exc
    if len(statements) != 1 or statements[0] is None:
        raise refuse("it is not exactly one expression")
    tree = statements[0]
    by_lower = {c.name.lower(): c for c in cfg.columns}
    used: list[str] = []
    #: Column substitutions of the current pass (keyless tables: data column -> its before-image).
    swap: dict[str, Any] = {}

    def lookup(node: exp.Expression) -> Any:
        """The registry column a column reference names (Hive names are case-insensitive)."""
        if node.table:
            raise refuse(f"qualified column {node.sql()!r} (name the column alone)")
        col = by_lower.get(node.name.lower())
        if col is None:
            raise refuse(f"{node.name!r} is not a column of the registry")
        return col

    def column(node: exp.Expression) -> Any:
        col = lookup(node)
        col = swap.get(col.name, col)
        used.append(col.name)
        return col

    def unparen(node: exp.Expression) -> exp.Expression:
        while isinstance(node, exp.Paren):
            node = node.this
        return node

    def literal(node: exp.Expression) -> _Lit:
        """A literal as SQL types it (the column it meets decides how it compares)."""
        from decimal import Decimal

        node = unparen(node)
        sign = ""
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            sign, node = "-", node.this
        if isinstance(node, exp.Literal) and node.is_string and not sign:
            return _Lit("string", node.this, node.sql())
        if isinstance(node, exp.Literal):
            m = _NUMBER.match(node.this)
            if not m:
                raise refuse(f"{sign}{node.this} is not a number literal (write digits, a point, an exponent)")
            t = sign + node.this
            if m.group("exp"):
                return _Lit("double", float(t), t)
            if "." in t:
                return _Lit("decimal", Decimal(t), t)
            return _Lit("int", int(t), t)
        if isinstance(node, exp.Boolean):
            return _Lit("bool", bool(node.this), node.sql())
        if isinstance(node, exp.Null):
            return _Lit("null", None, "NULL")
        raise refuse(f"{node.sql()!r} is not a literal")

    def cast_literal(lit: _Lit, col: Any, target: Any) -> Any:
        """A string literal read as the column's type ('2026-01-01' against a date column)."""
        import pyarrow as pa

        try:
            return pa.scalar(lit.value).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OverflowError) as exc:
            if isinstance(lit.value, str) and pa.types.is_timestamp(target) and target.tz is not None:
                # A timestamp without an offset is UTC, as the tables store timestamps.
                try:
                    return pa.scalar(lit.value).cast(pa.timestamp(target.unit)).cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
                    pass
            raise refuse(f"literal {lit.sql} is not a {col.type} (column {col.name})") from exc

    def decimal_operands(f: Any, col: Any, value: Any, scale: int, int_digits: int) -> tuple[Any, Any]:
        """Column and value as one decimal type holding both exactly (SQL compares decimals exactly)."""
        import pyarrow as pa

        p, s = decimal_parts(col.type.lower()) or (19, 0)  # an integer column: up to 19 digits
        scale = max(s, scale)
        if p - s + scale > 38 or max(int_digits, 1) + scale > 38:
            raise refuse(
                f"{value} against column {col.name} ({col.type}) needs more than 38 decimal digits; "
                "write the value with fewer digits"
            )
        wide = pa.decimal128(38, scale)
        return f.cast(wide), pa.scalar(value, wide)

    def column_vs_literal(op: str, col: Any, lit: _Lit) -> tuple[str, Any, Any, bool] | None:
        """How SQL compares ``col <op> lit``: (a key naming the column's transformation, the
        column's operand, the literal's operand, NaN-aware); None when the literal is NULL."""
        from decimal import Decimal

        import pyarrow as pa
        import pyarrow.compute as pc

        if lit.kind == "null":
            return None
        fam = _family(col.type)
        f = pc.field(col.name)
        target = arrow_type(col.type.lower())
        about = f"literal {lit.sql} against column {col.name} ({col.type})"
        if lit.kind == "bool" and fam != "boolean":
            raise refuse(f"{about}: compare a boolean column with TRUE/FALSE, other columns with their own values")
        if lit.kind in ("int", "decimal", "double") and fam not in ("int", "float", "double", "decimal"):
            raise refuse(f"{about}: a number against a {col.type} column; quote the value ('{lit.sql}')")
        if fam == "int":
            if lit.kind == "string":
                return "native", f, cast_literal(lit, col, target), False
            if lit.kind == "double":
                # SQL compares an integer with a double as doubles (exactly what DuckDB and Spark do).
                if lit.value in (float("inf"), float("-inf")):
                    raise refuse(f"{about}: the number is out of range")
                return "double", f.cast(pa.float64(), safe=False), pa.scalar(lit.value, pa.float64()), False
            value = lit.value
            if lit.kind == "decimal" and value != value.to_integral_value():
                scale = -value.as_tuple().exponent
                return ("decimal", *decimal_operands(f, col, value, scale, len(str(abs(int(value))))), False)
            value = int(value)
            bits = _INT_BITS[col.type.lower()]
            if -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
                return "native", f, pa.scalar(value, target), False
            if -(2**63) <= value < 2**63:
                return "int64", f.cast(pa.int64()), pa.scalar(value, pa.int64()), False
            return ("decimal", *decimal_operands(f, col, Decimal(value), 0, len(str(abs(value)))), False)
        if fam in ("float", "double"):
            if lit.kind == "string":
                value = cast_literal(lit, col, pa.float64()).as_py()
            elif lit.kind == "decimal":
                digits = lit.value.as_tuple()
                unscaled = int("".join(map(str, digits.digits)) or "0")
                if unscaled >= 2**53 or -digits.exponent > 22:
                    # DuckDB converts such a decimal to a double in more than one rounding step.
                    raise refuse(f"{about}: more digits than a double holds; write it with an exponent (1.5e-30)")
                value = float(lit.value)
            elif lit.kind == "int" and not -(2**63) <= lit.value < 2**63:
                raise refuse(f"{about}: the integer is out of range; write it with an exponent (1e20)")
            else:
                value = float(lit.value)
            if value in (float("inf"), float("-inf")) and lit.kind != "string":
                raise refuse(f"{about}: the number is out of range")
            if fam == "float" and not _float32_exact(value):
                raise refuse(
                    f"{about}: the value is not exactly a 32-bit float, and DuckDB and Spark SQL compare a FLOAT "
                    "column with it differently; compare with a value a FLOAT holds exactly (0.5, 0.25, 1e3), "
                    "or give the column the type double"
                )
            return "native", f, pa.scalar(value, target), True
        if fam == "decimal":
            if lit.kind == "string":
                return "native", f, cast_literal(lit, col, target), False
            if lit.kind == "double":
                if (decimal_parts(col.type.lower()) or (0, 0))[0] > 15:
                    raise refuse(f"{about}: write the value as a decimal (1.5, not 1.5e0) for a column this precise")
                return "double", f.cast(pa.float64()), pa.scalar(lit.value, pa.float64()), False
            value = Decimal(lit.value)
            scale = max(0, -value.as_tuple().exponent)
            return ("decimal", *decimal_operands(f, col, value, scale, len(str(abs(int(value))))), False)
        if fam == "char":
            if lit.kind != "string":
                raise refuse(f"{about}: compare a char column with a quoted string")
            return ("char", *_char_operands(f, col.type, lit.value), False)
        if fam == "string":
            if lit.kind != "string":
                raise refuse(f"{about}: compare a string column with a quoted string")
            return "native", f, pa.scalar(lit.value, target), False
        # boolean, date, timestamp, binary: a literal of the column's type or a string that reads as one.
        if lit.kind == "bool":
            return "native", f, pa.scalar(lit.value, pa.bool_()), False
        return "native", f, cast_literal(lit, col, target), False

    def column_vs_column(op: str, a: Any, b: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        fa, fb = _family(a.type), _family(b.type)
        la, lb = pc.field(a.name), pc.field(b.name)
        pair = {fa, fb}
        if fa == fb and fa in ("int", "string", "boolean", "date", "timestamp", "binary"):
            return _sql_compare(op, la, lb)
        if pair <= {"float", "double"}:
            if fa != fb:
                la, lb = la.cast(pa.float64()), lb.cast(pa.float64())
            return _sql_compare(op, la, lb, nan_aware=True)
        if pair == {"int", "double"}:
            la, lb = (la.cast(pa.float64(), safe=False) if x == "int" else y for x, y in ((fa, la), (fb, lb)))
            return _sql_compare(op, la, lb, nan_aware=True)
        if pair <= {"decimal", "int"}:
            parts = [decimal_parts(c.type.lower()) or (19, 0) for c in (a, b)]
            scale = max(s for _, s in parts)
            if any(p - s + scale > 38 for p, s in parts):
                raise refuse(f"columns {a.name} ({a.type}) and {b.name} ({b.type}) need more than 38 decimal digits")
            wide = pa.decimal128(38, scale)
            return _sql_compare(op, la.cast(wide), lb.cast(wide))
        raise refuse(
            f"comparing column {a.name} ({a.type}) with column {b.name} ({b.type}): the SQL engines convert "
            "these types differently (or pad CHAR); compare each column with a literal"
        )

    def compare(op: str, left: exp.Expression, right: exp.Expression, node: exp.Expression) -> Any:
        left, right = unparen(left), unparen(right)
        if not isinstance(left, exp.Column) and not isinstance(right, exp.Column):
            raise refuse(f"{node.sql()!r} compares no column")
        if isinstance(left, exp.Column) and isinstance(right, exp.Column):
            return column_vs_column(op, column(left), column(right))
        if not isinstance(left, exp.Column):
            left, right, op = right, left, _FLIPPED[op]
        col = column(left)
        ops = column_vs_literal(op, col, literal(right))
        if ops is None:
            return _null_bool()  # a comparison with NULL is NULL, whatever the row holds
        _, lhs, rhs, nan_aware = ops
        import pyarrow.compute as pc

        return _sql_compare(op, lhs, pc.scalar(rhs), nan_aware)

    def in_list(node: exp.In) -> Any:
        """``x IN (v1, ...)`` as SQL defines it: ``x = v1 OR x = v2 ...`` (TRUE on a match; else NULL
        when x or a value is NULL; else FALSE), evaluated with one set lookup per kind of value."""
        import pyarrow as pa
        import pyarrow.compute as pc

        col = column(unparen(node.this))
        lits = [literal(v) for v in node.expressions]
        has_null = any(lit.kind == "null" for lit in lits)
        if has_null and _family(col.type) == "char":
            raise refuse(
                f"{node.sql()!r}: with a NULL in the list Spark SQL compares CHAR column {col.name} without "
                "padding; leave the NULL out (x IN (..., NULL) is never TRUE for a row x IN (...) is not; "
                "x NOT IN (..., NULL) is never TRUE, so it erases nothing)"
            )
        fam = _family(col.type)
        if fam in ("int", "float", "double", "decimal"):
            if any(lit.kind == "string" for lit in lits):
                raise refuse(
                    f"{node.sql()!r}: a quoted value in the IN list of number column {col.name} makes the SQL "
                    "engines compare the list as text; write the numbers unquoted (for NaN: "
                    f"{col.name} IN (...) OR {col.name} = 'NaN')"
                )
            if any(lit.kind == "double" for lit in lits):
                # SQL gives the list one type: with a double in it, every value compares as a double.
                lits = [_Lit("double", float(lit.value), lit.sql) if lit.kind != "null" else lit for lit in lits]
        groups: dict[str, tuple[Any, list[Any], bool]] = {}
        for lit in lits:
            ops = column_vs_literal("eq", col, lit)
            if ops is None:
                continue
            key, lhs, rhs, nan_aware = ops
            # One group per transformation of the column: a decimal's scale and a CHAR's padded
            # width differ with the literal.
            key = f"{key}|{rhs.type}|{len(rhs.as_py()) if key == 'char' else ''}"
            groups.setdefault(key, (lhs, [], nan_aware))[1].append(rhs)
        matched: Any = pc.scalar(False)
        for lhs, values, nan_aware in groups.values():
            if nan_aware:
                for v in values:  # NaN and -0.0 need the SQL equality, not the set's bit equality
                    matched = matched | _sql_compare("eq", lhs, pc.scalar(v), nan_aware=True)
            else:
                matched = matched | pc.is_in(lhs, value_set=pa.array([v.as_py() for v in values], values[0].type))
        # is_in says FALSE for a NULL x: SQL says NULL.
        result = pc.if_else(pc.field(col.name).is_valid(), matched, _null_bool())
        return result | _null_bool() if has_null else result

    def build(node: exp.Expression) -> Any:
        kind = type(node).__name__
        if isinstance(node, exp.Paren):
            return build(node.this)
        if isinstance(node, exp.And):
            return build(node.this) & build(node.expression)  # and_kleene: SQL's AND
        if isinstance(node, exp.Or):
            return build(node.this) | build(node.expression)  # or_kleene: SQL's OR
        if isinstance(node, exp.Not):
            return ~build(node.this)  # NOT NULL is NULL
        if kind in _COMPARISONS:
            return compare(_COMPARISONS[kind], node.this, node.expression, node)
        if isinstance(node, exp.Is):
            if not isinstance(unparen(node.this), exp.Column) or not isinstance(node.expression, exp.Null):
                raise refuse(
                    f"{node.sql()!r}: only <column> IS [NOT] NULL is allowed (for IS TRUE/FALSE write <column> = TRUE "
                    "AND <column> IS NOT NULL)"
                )
            import pyarrow.compute as pc

            return pc.field(column(unparen(node.this)).name).is_null()
        if isinstance(node, exp.In):
            if not isinstance(unparen(node.this), exp.Column) or node.args.get("query") or not node.expressions:
                raise refuse(f"{node.sql()!r}: only <column> IN (<literals>) is allowed")
            return in_list(node)
        if isinstance(node, exp.Between):
            if not isinstance(unparen(node.this), exp.Column):
                raise refuse(f"{node.sql()!r}: only <column> BETWEEN <literal> AND <literal> is allowed")
            if node.args.get("symmetric"):
                raise refuse(
                    f"{node.sql()!r}: BETWEEN SYMMETRIC is not Spark SQL; "
                    "write (x BETWEEN a AND b) OR (x BETWEEN b AND a)"
                )
            if _family(lookup(unparen(node.this)).type) == "char":
                raise refuse(
                    f"{node.sql()!r}: Spark SQL compares BETWEEN on a CHAR column without its blank padding (unlike "
                    "=, <, >); write <column> >= <low> AND <column> <= <high>"
                )
            low = compare("ge", node.this, node.args["low"], node)
            return low & compare("le", node.this, node.args["high"], node)
        raise refuse(f"{node.sql()!r} ({kind}) is not allowed")

    expression = build(tree)
    if not used:
        raise refuse("it names no column")
    images = mode_of(cfg).erase_images(cfg)
    if images:
        # A keyless event carries the row's old values in its before-image columns: an update from
        # the erased person's row holds their data there, so the predicate is checked on both images.
        names = {c.name: c for c in cfg.columns}
        swap.update({d: names[b] for d, b in images.items()})
        import pyarrow.compute as pc

        # Only where there is a before-image (updates, deletes): copies and inserts leave it empty,
        # and "x IS NULL" must not match every one of them through it.
        before = list(images.values())
        has_before = pc.field(before[0]).is_valid()
        for b in before[1:]:
            has_before = has_before | pc.field(b).is_valid()
        expression = expression | (has_before & build(tree))
        used.extend(before)  # read as NULL from files without them (a version's copies)
    return Predicate(text=text, columns=tuple(dict.fromkeys(used)), expression=expression)


def _char_operands(field: Any, hive_type: str, value: str) -> tuple[Any, Any]:
    """A CHAR(n) column and a string as Spark SQL compares them: the column blank-padded to n
    (read-side padding), both padded to the longer of n and the literal's length (the column cut
    to that length when the literal is longer than n, as Spark's rpad does)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    m = _CHAR.match(hive_type.lower())
    n = int(m.group(1)) if m else 0
    width = max(n, len(value))
    padded = pc.utf8_rpad(field, width=n, padding=" ")
    if width > n:
        padded = pc.utf8_rpad(pc.utf8_slice_codeunits(padded, start=0, stop=width), width=width, padding=" ")
    return padded, pa.scalar(value.ljust(width), pa.string())


# ------------------------------------------------------------------------- files
@dataclass(frozen=True)
class Located:
    """One Parquet file of the lake and the location it belongs to."""

    location: str
    path: str
    size: int = 0


#: The first bytes of every Parquet file: a file is Parquet by its content, whatever its name says.
PARQUET_MAGIC = b"PAR1"
#: Areas whose files are rows by the plan's own rule (:func:`cdc_compaction.core.landing.is_data`) or byte
#: copies of them (refused files): one that no Parquet reader reads is named in the audit ("unreadable").
_ROW_AREAS = ("pending", "archive", "quarantine")


@dataclass
class Inventory:
    """Everything under a table's storage root, sorted by what an erase does with it."""

    #: Files that hold rows (Parquet by content, or landed data by the plan's rule), with their location.
    rows: list[Located]
    #: JSON documents outside the landing and archive areas: the lake's bookkeeping (commit records,
    #: plans, the pointer, stats, manifests, audits). No rows, but they may name partition values.
    records: list[Located]
    #: Non-empty files that are none of the above: they may hold rows no erase can filter.
    unhandled: list[Located]
    #: Every directory (its path names are searched too).
    dirs: list[str]
    #: The table formats' metadata files (``base/_delta_log``, ``iceberg/``), their crashed writes'
    #: temporaries included: listed only for the verification (``hidden``), which searches their
    #: decoded bytes; an erase regenerates them rather than filtering them.
    metadata: list[Located] = field(default_factory=list)


def _location(lake: Lake, path: str, live: list[str]) -> str:
    """The location (see :data:`LOCATIONS`) of a file by where it lies under the root."""
    from cdc_compaction.pipeline.rebuild import rebuild_root

    def under(root: str) -> bool:
        return path.startswith(root.rstrip("/") + "/")

    rel = posixpath.relpath(path, lake.layout.base).split("/") if under(lake.layout.base) else []
    if len(rel) > 2 and rel[1] == CHANGES_DIR:
        # A version's changes/: the job's change feed of that commit (registry change_feed), which publish
        # copies to changes/c<seq>.parquet -- rows of the feed, wherever they lie, not of the version.
        return "changes"
    if any(under(r) for r in live):
        return "live"
    areas = (
        ("versions", lake.layout.base),
        ("pending", lake.layout.incremental),
        ("archive", lake.layout.archive),
        ("quarantine", lake.layout.quarantine),
        # <t>_changes's partitions (pipeline/changes.py) hold rows of the versions they diff.
        ("changes", posixpath.join(lake.layout.root, "changes")),
        # A rebuild's replay (``rebuild --verify-only`` leaves it for inspection): rows of every version.
        ("rebuild", rebuild_root(lake)),
    )
    return next((location for location, root in areas if under(root)), "other")


def is_erase_temporary(name: str) -> bool:
    """An erase's hidden rewrite (:func:`temp_name`)."""
    return name.startswith(".") and ".erase-e" in name


def _head(lake: Lake, path: str, n: int = 4) -> bytes:
    with lake.storage.open_read(path) as fh:
        return bytes(fh.read(n))


def _json_doc(lake: Lake, f: FileInfo) -> tuple[bool, Any]:
    """(True, the document) when the file is one JSON document (by content: a lease's ``.released``
    is JSON too), else (False, None)."""
    if not f.name.endswith(".json") and _head(lake, f.path, 1) not in (b"{", b"["):
        return False, None
    try:
        return True, json.loads(lake.storage.read_text(f.path))
    except (ValueError, UnicodeDecodeError):
        return False, None


def _is_marker(lake: Lake, f: FileInfo) -> bool:
    """The lake's own files that are neither rows nor JSON: checksums and the erase's decision markers."""
    from cdc_compaction.core.landing import markers

    if f.name.endswith(".crc") or f.name in markers(lake.cfg):
        return True
    return f.path.startswith(erase_dir(lake).rstrip("/") + "/") and f.name.endswith(".committed")


def inventory(lake: Lake, commit: Commit, hidden: bool = False) -> Inventory:
    """Walk everything under the table's storage root and sort every file (see :class:`Inventory`).

    Nothing is skipped by its name: a file is Parquet when its bytes say so (a sink may land Parquet
    as ``events.json``, hidden, or in a subdirectory), and landed data by the plan's rule
    (:func:`cdc_compaction.core.landing.is_data`) holds rows even when no reader can read it.  Only an
    erase's own hidden rewrites are left out, unless ``hidden``.  A listing error propagates: an
    erase that cannot see an area must not report it clean.
    """
    from cdc_compaction.core.landing import is_data
    from cdc_compaction.pipeline import formats

    live = live_roots(lake, commit)
    out = Inventory([], [], [], [])
    journals = erase_dir(lake).rstrip("/") + "/"

    def visit(d: str) -> None:
        for e in sorted(lake.storage.list_dir(d), key=lambda e: e.name):
            if e.is_dir:
                if formats.is_metadata_path(lake, e.path):
                    # A table format's metadata (base/_delta_log, iceberg/): derived, regenerated after the
                    # commit; the verification (hidden) still reads every file of it.
                    if hidden:
                        out.dirs.append(e.path)
                        out.metadata += _all_files(lake, e.path)
                    continue
                out.dirs.append(e.path)
                visit(e.path)
                continue
            if is_erase_temporary(e.name) and not hidden:
                continue
            location = _location(lake, e.path, live)
            item = Located(location, e.path, e.size)
            if e.size and _head(lake, e.path) == PARQUET_MAGIC:
                out.rows.append(item)
            elif location in _ROW_AREAS and (is_data(lake.cfg, e.name) or location == "quarantine"):
                is_json, _ = _json_doc(lake, e) if location == "quarantine" else (False, None)
                if is_json:
                    out.records.append(item)  # a quarantine manifest
                elif e.size:
                    out.rows.append(item)  # named as unreadable (it is not Parquet)
            elif not e.size or _is_marker(lake, e):
                continue
            elif e.path.startswith(journals) and e.name.endswith(".json") and not e.name.endswith(".audit.json"):
                continue  # an erase's journal: it names the predicate until that erase finished (deleted then)
            elif _json_doc(lake, e)[0]:
                out.records.append(item)
            else:
                out.unhandled.append(item)

    visit(lake.layout.root)
    return out


def _all_files(lake: Lake, directory: str) -> list[Located]:
    """Every file under ``directory``, hidden ones included (a format's metadata, for the verification)."""
    out = []
    for e in sorted(lake.storage.list_dir(directory), key=lambda e: e.name):
        if e.is_dir:
            out += _all_files(lake, e.path)
        else:
            out.append(Located("formats", e.path, e.size))
    return out


def live_roots(lake: Lake, commit: Commit) -> list[str]:
    """The directories holding the live version's rows: its version directory and its partitions."""
    roots = [lake.layout.version_dir(commit.version)] if commit.seq else []
    for loc in (commit.partitions or {}).values():
        if not any(loc.startswith(r.rstrip("/") + "/") for r in roots):
            roots.append(loc)
    return roots


def lake_files(lake: Lake, commit: Commit, hidden: bool = False) -> list[Located]:
    """Every file of the table that holds rows, each with its location (see :func:`inventory`)."""
    found = inventory(lake, commit, hidden)
    # The live version's files first: the erase version is written from them.
    return sorted(found.rows, key=lambda f: f.location != "live")


def _read(lake: Lake, path: str) -> Any:
    import pyarrow.parquet as pq

    with lake.storage.open_read(path) as fh:
        return pq.read_table(fh)


def _try_read(lake: Lake, path: str) -> Any | None:
    """The file's rows, or None when it is not readable Parquet (a refused file, a writer's partial
    temporary). Storage errors propagate: they may heal, and an erase must not skip a file it could read."""
    import pyarrow as pa

    try:
        return _read(lake, path)
    except pa.ArrowException as exc:
        log.warning("%s: %s is not readable Parquet (%s); listed as unreadable", lake.cfg.qualified_name, path, exc)
        return None


class _UnevaluableError(Exception):
    """A file whose columns cannot be read as the registry's types (a file refused for its schema)."""


def _with_columns(cfg: TableConfig, table: Any, columns: tuple[str, ...]) -> Any:
    """``table`` with every predicate column as its registry type: NULL where a file lacks it (a
    tombstone file), cast where a file has another type (INT96 timestamps; a quarantined file's
    ``'3'`` for an int). Raise :class:`_UnevaluableError` when a value does not convert."""
    import pyarrow as pa

    types = {c.name: arrow_type(c.type) for c in cfg.columns}
    for name in columns:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, type=types[name]))
        elif table.schema.field(name).type != types[name]:
            i = table.column_names.index(name)
            try:
                table = table.set_column(i, name, table.column(i).cast(types[name]))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise _UnevaluableError(f"column {name} ({table.schema.field(name).type}): {exc}") from exc
    return table


def is_bookkeeping_file(lake: Lake, path: str) -> bool:
    """A file of a version's subdirectory the table's mode keeps its bookkeeping in, no row of the table
    (``TableMode.erase_keeps``; keyless: the tombstones file, whose one row is the watermark). Erasing
    it would break the next compaction (keyless: replays applied again)."""
    keeps = mode_of(lake.cfg).erase_keeps(lake.cfg)
    return (
        bool(keeps)
        and path.startswith(lake.layout.base.rstrip("/") + "/")
        and any(d in keeps for d in posixpath.relpath(path, lake.layout.base).split("/")[1:-1])
    )


def _filter(lake: Lake, pred: Predicate, path: str, table: Any) -> tuple[Any, int] | None:
    """The rows of the file ``path`` to keep and how many it holds that match; None when its
    columns cannot be compared with the predicate (logged; the caller names the file)."""
    if is_bookkeeping_file(lake, path):
        return table, 0
    try:
        return _split(lake.cfg, pred, table)
    except _UnevaluableError as exc:
        log.warning("%s: cannot evaluate the erase predicate on %s (%s)", lake.cfg.qualified_name, path, exc)
        return None


class _FileChangedError(Exception):
    """A file that read as Parquet of the registry's types a moment ago no longer does."""


def _count(lake: Lake, pred: Predicate, path: str) -> tuple[int, int] | None:
    """(rows kept, rows matching) of the file ``path``, read a batch at a time (:func:`_batches`); None when
    it is not readable Parquet or its columns cannot be compared with the predicate (logged; the caller names it).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    kept = matched = 0
    try:
        with lake.storage.open_read(path) as fh:
            for batch in _batches(pq.ParquetFile(fh, buffer_size=READ_BUFFER, pre_buffer=False)):
                split = _filter(lake, pred, path, batch)
                if split is None:
                    return None
                kept, matched = kept + split[0].num_rows, matched + split[1]
    except pa.ArrowException as exc:
        log.warning("%s: %s is not readable Parquet (%s); listed as unreadable", lake.cfg.qualified_name, path, exc)
        return None
    return kept, matched


#: Bytes of rows (Parquet's uncompressed size) an erase holds at a time, and at most this many rows. Not a row
#: group: Spark writes row groups of up to 128 MB of Parquet, which Arrow holds as several times that (1.2 GB for
#: a 2M-row table in bench/scale_day.py when the erase held row groups).
ERASE_BATCH_BYTES = 4 << 20
ERASE_BATCH_ROWS = 65_536
#: Bytes of a column chunk read at a time (Arrow's buffered stream): unbuffered, Arrow reads whole column chunks.
#: Every ``ParquetFile`` of the erase also passes ``pre_buffer=False``: pyarrow's default pre-buffering reads each
#: row group's column chunks whole, before its first batch, ignoring the buffer (Python bytes through a Python file
#: object, which Arrow's pool never counts: 172 MB for a file of one 170 MB row group, 417 MB above the imports at
#: one 114 MB file of bench/datagen.py's columns).
READ_BUFFER = 1 << 20


def _batch_rows(pf: Any) -> int:
    """Rows per batch for the file: about :data:`ERASE_BATCH_BYTES` of its rows, by its own average row size."""
    md = pf.metadata
    size = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    per_row = size / md.num_rows if md.num_rows else 1.0
    return max(1024, min(ERASE_BATCH_ROWS, int(ERASE_BATCH_BYTES / max(per_row, 1.0))))


def _batches(pf: Any) -> Any:
    """The file's rows as tables of :func:`_batch_rows`, read page by page: an erase holds one batch's rows,
    whatever the size of the table, its files or their row groups (nothing that grows with the table in one
    process). The rewrite writes each batch as a row group of its own."""
    import pyarrow as pa

    for batch in pf.iter_batches(batch_size=_batch_rows(pf), use_threads=False):
        yield pa.Table.from_batches([batch])


def _filtered_file(lake: Lake, pred: Predicate, path: str, local: str) -> tuple[int, int]:
    """Write the file ``path`` without the rows ``pred`` matches to the local file ``local``; (rows kept, matching).

    Read and written a batch at a time (the kept rows in the file's own schema and timestamp encoding,
    :func:`_write_options`), to local disk, not memory. Raises :class:`_FileChangedError` when the file no
    longer reads as it did when the erase was planned.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    options = _write_options(lake, path)
    kept = matched = 0
    try:
        with lake.storage.open_read(path) as fh:
            pf = pq.ParquetFile(fh, buffer_size=READ_BUFFER, pre_buffer=False)
            with pq.ParquetWriter(local, pf.schema_arrow, **options) as writer:
                for batch in _batches(pf):
                    split = _filter(lake, pred, path, batch)
                    if split is None:
                        raise _FileChangedError(path)
                    if split[0].num_rows:
                        writer.write_table(split[0])
                    kept, matched = kept + split[0].num_rows, matched + split[1]
    except pa.ArrowException as exc:
        raise _FileChangedError(f"{path}: {exc}") from exc
    return kept, matched


def _write_filtered(lake: Lake, pred: Predicate, path: str, target: str) -> tuple[int, int]:
    """Write ``path`` without the rows ``pred`` matches to ``target`` (streamed through a local file and
    :meth:`Storage.upload`: atomic locally, one object on S3); (rows kept, rows matching). A file that
    changed since it was counted refuses the erase (EraseError)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cdc-erase-") as scratch:
        local = os.path.join(scratch, "rewrite.parquet")
        try:
            kept, matched = _filtered_file(lake, pred, path, local)
        except _FileChangedError as exc:
            raise EraseError(
                f"{lake.cfg.qualified_name}: {path} changed during the erase ({exc}); nothing was erased, run it again"
            ) from exc
        lake.storage.upload(local, target)
    return kept, matched


def _split(cfg: TableConfig, pred: Predicate, table: Any) -> tuple[Any, int]:
    """The rows of ``table`` to keep and how many match the predicate."""
    import pyarrow.compute as pc

    if not table.num_rows:
        return table, 0
    import pyarrow as pa

    probe = _with_columns(cfg, table.select([n for n in table.column_names if n in pred.columns]), pred.columns)
    probe = probe.append_column("__erase_row", pa.array(range(table.num_rows), type=pa.int64()))
    try:
        # NOT COALESCE(p, false): a row whose predicate is NULL (unknown) is kept, as SQL's DELETE would.
        keep = probe.filter(pc.invert(pc.coalesce(pred.expression, False))).column("__erase_row")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _UnevaluableError(str(exc)) from exc
    # The kept rows exactly as the file had them (its own types and columns).
    return table.take(keep), table.num_rows - len(keep)


def scan(lake: Lake, pred: Predicate, hidden: bool = False) -> dict[str, Any]:
    """Matching rows per location and file, and the non-empty files no Parquet reader can read."""
    rows = dict.fromkeys(LOCATIONS, 0)
    matching: dict[str, int] = {}
    unreadable: list[str] = []
    found = inventory(lake, lake.latest_commit(), hidden)
    files = found.rows
    for f in files:
        counted = _count(lake, pred, f.path)
        if counted is None:
            if f.size:
                unreadable.append(f.path)
            continue
        n = counted[1]
        if n:
            rows[f.location] += n
            matching[f.path] = n
    return {
        "files_checked": len(files) + len(found.records) + len(found.unhandled) + len(found.metadata),
        "rows": rows,
        "matching": matching,
        "unreadable": unreadable,
        "unhandled": sorted(f.path for f in found.unhandled),
        "inventory": found,
    }


def _write_options(lake: Lake, path: str) -> dict[str, Any]:
    """How to write a rewrite of ``path`` so that its readers read it as they read the original.

    Older versions (and ``parquet_timestamps: int96``) hold INT96 timestamps; Arrow reads them as
    nanoseconds and would write INT64 nanoseconds back, which Spark refuses. So a file with INT96
    columns is rewritten with INT96. INT64 microseconds adjusted to UTC (what the job writes by
    default) read as ``timestamp[us, tz=UTC]`` and are written back as they were.
    """
    import pyarrow.parquet as pq

    with lake.storage.open_read(path) as fh:
        schema = pq.ParquetFile(fh).schema
        int96 = any(schema.column(i).physical_type == "INT96" for i in range(len(schema)))
    return {"use_deprecated_int96_timestamps": True} if int96 else {}


# ------------------------------------------------------------------------- partition values
def _partition_of(path: str) -> tuple[str, str, bool] | None:
    """(the partition directory, its value, whether it is a key index's) of a file in one, else None."""
    parts = path.split("/")
    for i in range(len(parts) - 2, -1, -1):
        value = partition_dir_value(parts[i])
        if value is not None:
            above = parts[i - 1] if i else ""
            is_index = above == INDEX_DIR or above.startswith(f"{INDEX_DIR}-")
            return "/".join(parts[: i + 1]), value, is_index
    return None


def _component_value(name: str) -> str | None:
    """The value a path component names: a partition directory's (un-escaped) value, else None."""
    return partition_dir_value(name)


def _names_any(text: str, tokens: frozenset[str]) -> bool:
    """Whether a string (a JSON key or value, a path) is an erased value or names one as a path component."""
    if text in tokens:
        return True
    return any(c in tokens or _component_value(c) in tokens for c in text.split("/"))


def scrub(doc: Any, values: frozenset[str]) -> Any:
    """``doc`` (a bookkeeping JSON document) without anything that names an erased partition value.

    A map entry goes when its key or its (string) value names one (``partitions``, ``partition_rows``,
    ``index``); a list item when it is such a string, or an object that names one anywhere (an
    ``output_files`` entry).  Only values whose every row was erased are passed here.
    """

    def names(x: Any) -> bool:
        if isinstance(x, str):
            return _names_any(x, values)
        if isinstance(x, dict):
            return any(names(k) or names(v) for k, v in x.items())
        if isinstance(x, list):
            return any(names(v) for v in x)
        return False

    if isinstance(doc, dict):
        return {
            k: scrub(v, values)
            for k, v in doc.items()
            if not _names_any(k, values) and not (isinstance(v, str) and names(v))
        }
    if isinstance(doc, list):
        return [scrub(v, values) for v in doc if not (isinstance(v, str | dict) and names(v))]
    return doc


def identifying_literals(text: str) -> frozenset[str]:
    """The string literals whose rows the predicate erases whatever else they hold (see :func:`identifying`)."""
    return frozenset(lit for _, lit in identifying(text))


def identifying(text: str) -> frozenset[tuple[str, str]]:
    """(column, string literal) pairs whose rows the predicate erases whatever else they hold.

    ``name = 'x'`` and ``name IN ('x', ...)`` as the predicate or as one of its top-level OR terms:
    every row with that value is erased, so the value must not remain anywhere (a partition
    directory, a bookkeeping record).  Literals under AND, NOT or other comparisons may legitimately
    remain (rows of other people hold them) and are not returned.
    """
    import sqlglot
    from sqlglot import exp

    try:
        (tree,) = _parse_predicate_sql(text)
    except (sqlglot.errors.ParseError, ValueError):
        return frozenset()
    out: set[tuple[str, str]] = set()

    def strings(nodes: list[Any]) -> list[str]:
        return [n.this for n in nodes if isinstance(n, exp.Literal) and n.is_string]

    def visit(node: Any) -> None:
        if isinstance(node, exp.Paren):
            visit(node.this)
        elif isinstance(node, exp.Or):
            visit(node.this)
            visit(node.expression)
        elif isinstance(node, exp.EQ):
            col = next((n for n in (node.this, node.expression) if isinstance(n, exp.Column)), None)
            if col is not None:
                out.update((col.name.lower(), lit) for lit in strings([node.this, node.expression]))
        elif isinstance(node, exp.In) and isinstance(node.this, exp.Column) and not node.args.get("query"):
            out.update((node.this.name.lower(), lit) for lit in strings(list(node.expressions)))

    visit(tree)
    return frozenset(out)


def redacted(text: str) -> str:
    """The predicate with every literal replaced by ``?``: what an audit keeps (it must not hold the
    erased values it proves gone). Its SHA-256 (``predicate_sha256``) ties it to the request."""
    import sqlglot
    from sqlglot import exp

    try:
        (tree,) = _parse_predicate_sql(text)
    except (sqlglot.errors.ParseError, ValueError):
        return "<redacted>"
    if tree is None:
        return "<redacted>"
    return str(tree.transform(lambda n: exp.Placeholder() if isinstance(n, exp.Literal) else n).sql(dialect="hive"))


def _records_naming(lake: Lake, found: Inventory, tokens: frozenset[str]) -> list[str]:
    """Path names under the root and bookkeeping records that name a token; non-Parquet row files
    (unreadable, unhandled) whose raw bytes hold one."""
    hits: list[str] = []
    root = lake.layout.root.rstrip("/") + "/"
    for path in [*found.dirs, *(f.path for f in (*found.rows, *found.records, *found.unhandled, *found.metadata))]:
        if _names_any(path[len(root) :] if path.startswith(root) else path, tokens):
            hits.append(path)
    for f in found.records:
        ok, doc = _json_doc(lake, FileInfo(f.path, posixpath.basename(f.path), False, f.size, 0.0))
        if ok and _json_names(doc, tokens) and f.path not in hits:
            hits.append(f.path)
    raw = [t.encode("utf-8") for t in tokens]
    for f in (*found.rows, *found.unhandled):
        if f.path in hits or (f.size and _head(lake, f.path) == PARQUET_MAGIC):
            continue
        with lake.storage.open_read(f.path) as fh:
            data = fh.read()
        if any(t in data for t in raw):
            hits.append(f.path)
    for f in found.metadata:
        if f.path not in hits and f.size and _metadata_names(lake, f.path, tokens):
            hits.append(f.path)
    return sorted(hits)


#: Iceberg truncates string bounds in its manifests to this many characters (pyiceberg's default metrics).
_ICEBERG_BOUND_CHARS = 16


def _metadata_names(lake: Lake, path: str, tokens: frozenset[str]) -> bool:
    """Whether a format's metadata file holds an erased value, searched in what its bytes decode to:
    an Avro manifest's blocks decompressed, a Parquet checkpoint's rows, JSON lines with their
    escapes undone, and the raw bytes (a temporary, the SQL catalog).  An Avro bound is truncated
    (:data:`_ICEBERG_BOUND_CHARS`): a longer value is searched for by that prefix there."""
    with lake.storage.open_read(path) as fh:
        data = bytes(fh.read())
    blobs = [data]
    prefixes = False
    if data[:4] == b"Obj\x01":
        try:
            blobs.append(avro_payload(data))
            prefixes = True
        except (ValueError, IndexError, zlib.error):
            pass  # not a readable container: its raw bytes are searched
    elif data[:4] == PARQUET_MAGIC:
        table = _try_read(lake, path)
        if table is not None:
            blobs.append(json.dumps(table.to_pylist(), ensure_ascii=False, default=str).encode("utf-8"))
    else:
        text = data.decode("utf-8", errors="replace")
        for line in text.splitlines():
            try:
                blobs.append(json.dumps(json.loads(line), ensure_ascii=False).encode("utf-8"))
            except ValueError:
                continue
    for token in tokens:
        probes = [token.encode("utf-8")]
        if prefixes and len(token) > _ICEBERG_BOUND_CHARS:
            probes.append(token[:_ICEBERG_BOUND_CHARS].encode("utf-8"))
        if any(p in blob for p in probes for blob in blobs):
            return True
    return False


def avro_payload(data: bytes) -> bytes:
    """An Avro object container file's header and records, every block decompressed (``null`` and
    ``deflate``, what pyiceberg writes): the bytes a search for a value must see.  ValueError otherwise."""
    buf = io.BytesIO(data)

    def long() -> int:
        shift = result = 0
        while True:
            byte = buf.read(1)
            if not byte:
                raise ValueError("truncated Avro file")
            result |= (byte[0] & 0x7F) << shift
            shift += 7
            if not byte[0] & 0x80:
                return (result >> 1) ^ -(result & 1)

    def raw() -> bytes:
        return buf.read(long())

    if buf.read(4) != b"Obj\x01":
        raise ValueError("not an Avro container file")
    meta: dict[str, bytes] = {}
    while (n := long()) != 0:
        if n < 0:
            n, _ = -n, long()
        for _ in range(n):
            key = raw().decode("utf-8", errors="replace")
            meta[key] = raw()
    codec = meta.get("avro.codec", b"null").decode("utf-8", errors="replace")
    buf.read(16)
    out = [data[: buf.tell()]]
    while buf.tell() < len(data):
        long()  # the block's record count
        block = raw()
        if codec == "deflate":
            block = zlib.decompress(block, -15)
        elif codec != "null":
            raise ValueError(f"Avro codec {codec} is not decoded here")
        out.append(block)
        buf.read(16)
    return b"".join(out)


def _json_names(doc: Any, tokens: frozenset[str]) -> bool:
    if isinstance(doc, str):
        return _names_any(doc, tokens)
    if isinstance(doc, dict):
        return any(_names_any(k, tokens) or _json_names(v, tokens) for k, v in doc.items())
    if isinstance(doc, list):
        return any(_json_names(v, tokens) for v in doc)
    return False


# ------------------------------------------------------------------------- the journal
def erase_dir(lake: Lake) -> str:
    return posixpath.join(lake.layout.control, "erase")


def _journal_path(lake: Lake, erase_id: str) -> str:
    return posixpath.join(erase_dir(lake), f"{erase_id}.json")


def _committed_path(lake: Lake, erase_id: str) -> str:
    return posixpath.join(erase_dir(lake), f"{erase_id}.committed")


def audit_path(lake: Lake, erase_id: str) -> str:
    return posixpath.join(erase_dir(lake), f"{erase_id}.audit.json")


def temp_name(path: str, erase_id: str) -> str:
    """The hidden name a file's filtered rewrite gets beside it (readers skip hidden names)."""
    return posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.erase-{erase_id}")


def _is_committed(lake: Lake, journal: dict[str, Any]) -> bool:
    if lake.storage.exists(_committed_path(lake, journal["erase_id"])):
        return True
    seq = journal.get("commit_seq")
    if seq is None:
        return False
    commit = lake.read_commit(int(seq))
    return commit is not None and commit.plan_id == f"erase-{journal['erase_id']}"


# ------------------------------------------------------------------------- the erase
def erase(
    cfg: TableConfig,
    where: str,
    actor: str | None = None,
    now: datetime | None = None,
    lake: Lake | None = None,
    metastore: MetastoreEndpoint | None = None,
) -> dict[str, Any]:
    """Erase every row matching ``where`` from every location; return the audit record (verified).

    ``metastore``: where the base table's partitions are registered (partitioned tables; default
    ``$CDC_METASTORE_URI``): a partition whose every row was erased is dropped there too.

    The step a DAG or trigger calls; the CLI ``erase`` calls it too.  Raise
    :class:`ErasePredicateError` for a refused predicate (nothing was read),
    :class:`ConcurrentRunError` if a compaction holds the lease (nothing was changed) and
    :class:`EraseError` if the verification still finds a matching row.
    """
    pred = parse_predicate(cfg, where)
    lake = lake or Lake(cfg)
    actor = actor or _os_user()
    now = now or datetime.now(UTC)
    erase_id = f"e{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    owner = f"erase:{actor}:{erase_id}"
    # Destroy by ownership: an erase rewrites and removes files under the root, so the root must be
    # the table's (its marker) before anything is read for rewriting or changed.
    require_owner(lake, "erase")
    lease = TableLease(lake)
    lease.acquire(owner, LEASE_TTL, now)
    try:
        finish_unfinished(lake, metastore)
        audit, dropped = _erase(lake, pred, erase_id, actor, now, owner, metastore)
        _rewrite_readers(cfg, lake, metastore)
    finally:
        lease.release(owner)
    problems = verify(lake, pred, dropped)
    audit["verified"] = {
        "files_checked": problems["files_checked"],
        "matching_files": problems["matching"],
        "unreadable_files": problems["unreadable"],
        # Paths and records that still name an erased value (counted, never listed by value).
        "naming_files": len(problems["naming"]),
    }
    lake.storage.write_text(audit_path(lake, erase_id), json.dumps(audit, indent=1, sort_keys=True))
    if problems["naming"]:
        from cdc_compaction.pipeline import formats

        held = [p for p in problems["naming"] if formats.is_metadata_path(lake, p)]
        by_format = (
            f" ({len(held)} of them table-format metadata, {cfg.formats or 'no formats listed'}: {held[:5]}; it is "
            "derived, so deleting that format's directory is safe: the next publish writes it anew)"
            if held
            else ""
        )
        raise EraseError(
            f"{cfg.qualified_name}: erase {erase_id} finished, but {len(problems['naming'])} path names or records "
            f"under {lake.layout.root} still name an erased value: {problems['naming'][:10]}{by_format} (audit "
            f"{audit_path(lake, erase_id)}). Run the erase again; if they remain, remove or rename them by hand"
        )
    if problems["matching"]:
        raise EraseError(
            f"{cfg.qualified_name}: erase {erase_id} ({where!r}) finished, but verification found matching rows "
            f"in {problems['matching']} (audit {audit_path(lake, erase_id)}). Run the erase again; if rows "
            "remain, a writer outside the pipeline is landing them"
        )
    return audit


def _rewrite_readers(cfg: TableConfig, lake: Lake, metastore: MetastoreEndpoint | None) -> None:
    """Write the DuckDB views anew over what the erase left, before it returns.

    They name files, and the erase rewrote or removed some (an erase that empties a partition removes
    its only file), so the old script would fail ("No files found") until the next publish. The Spark,
    Hive and Trino views read locations and metastore partitions, which the erase keeps right itself.
    A failure is logged and counted by :func:`views.write_duckdb`, as after a publish: the erase stands.
    """
    if cfg.views.duckdb is None:
        return
    from cdc_compaction.core.settings import metastore_from_env
    from cdc_compaction.pipeline import views
    from cdc_compaction.pipeline.pending import pending_files
    from cdc_compaction.pipeline.runtime import Runtime, utcnow

    endpoint = metastore or metastore_from_env()
    rt = Runtime(cfg=cfg, lake=lake, metastore=endpoint, engine=None)  # type: ignore[arg-type]  # no Spark here
    views.write_duckdb(rt, lake.latest_commit(), pending_files(rt, utcnow(), set()))


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER", "unknown")


def _erase(
    lake: Lake,
    pred: Predicate,
    erase_id: str,
    actor: str,
    now: datetime,
    owner: str,
    metastore: MetastoreEndpoint | None = None,
) -> tuple[dict[str, Any], frozenset[str]]:
    """Erase; return the audit and the partition values it removed (for :func:`verify`; never stored)."""
    cfg = lake.cfg
    table = cfg.qualified_name
    live = lake.latest_commit()
    if not lake.is_archived(live.seq):
        # Its increments are still in the landing area and named by its record only: an erase commit
        # on top would hide from the next plan that they are compacted already.
        raise EraseError(
            f"{table}: commit {live.seq} ({live.version}) is not archived yet, so its run has not finished "
            f"(or crashed). Nothing was erased: let the table's DAG run (its next plan finishes the archive) "
            "and run the erase again"
        )
    found = inventory(lake, live)
    if found.unhandled:
        # Neither Parquet nor a record of the lake: it may hold rows this erase cannot filter, and
        # skipping it would report the table clean while it still holds them.
        raise EraseError(
            f"{table}: {len(found.unhandled)} file(s) under {lake.layout.root} are neither Parquet nor JSON records "
            f"of the lake, so the erase cannot tell whether they hold rows of the predicate: "
            f"{[f.path for f in found.unhandled][:10]}. Nothing was erased: convert them to Parquet, move them out "
            "of the table's storage root or delete them, and run the erase again"
        )
    removed = dict.fromkeys(LOCATIONS, 0)
    entries: list[dict[str, Any]] = []
    # Every live file goes into the erase version, filtered again as it is written (one at a time, never
    # the whole version in memory).
    new_files: list[str] = []
    unreadable: list[str] = []
    # Rows kept and erased per partition value, over every version, rebuild and location (key indexes
    # aside: they hold keys only): a value whose every row is erased must vanish from every name.
    part_kept: dict[str, int] = {}
    part_erased: dict[str, int] = {}
    for f in sorted(found.rows, key=lambda f: f.location != "live"):
        split = _count(lake, pred, f.path)
        if split is None:
            if f.location == "live":
                raise EraseError(
                    f"{table}: {f.path} of the live version {live.version} is not readable Parquet of the registry's "
                    "types. Nothing was erased: restore the file (or run the table's DAG after fixing it) and run "
                    "the erase again"
                )
            if f.size:
                unreadable.append(f.path)
            continue
        kept, n = split
        if f.location == "live":
            new_files.append(f.path)
        part = _partition_of(f.path)
        if part is not None and not part[2]:
            part_kept[part[1]] = part_kept.get(part[1], 0) + kept
            part_erased[part[1]] = part_erased.get(part[1], 0) + n
        if n:
            removed[f.location] += n
            entries.append({"location": f.location, "path": f.path, "temp": temp_name(f.path, erase_id), "rows": n})
    dropped = frozenset(v for v, n in part_erased.items() if n and not part_kept.get(v))
    partitioning = cfg.partition_by
    if partitioning is not None and partitioning.transform == "identity":
        # A value the predicate names for the partition column, with no row left anywhere, must not stay
        # in records either -- also when its directories are gone already (retention, an earlier erase).
        # Its partition's name is the value encoded (job.contract.partition_value), or the value itself in
        # partitions written before the encoding (docs/partitioned.md, "Partition directory names").
        dropped |= {
            name
            for col, lit in identifying(pred.text)
            if col == partitioning.column.lower()
            for name in (lit, partition_value(lit))
            if not part_kept.get(name)
        }
    # Every directory named by such a value (data, tombstones, key index; kept versions, rebuilds) goes
    # whole: its files hold no row any more, and its name is the erased value.
    drop_dirs = sorted(
        d for d in found.dirs if _component_value(posixpath.basename(d)) in dropped and _partition_of(d + "/x")
    )
    entries = [e for e in entries if not any(e["path"].startswith(d + "/") for d in drop_dirs)]
    live_changed = removed["live"] > 0
    seq = live.seq + 1 if live_changed else None
    version = f"v{live.seq + 1:08d}-erase-{erase_id}-a" if live_changed else None
    journal = {
        "erase_id": erase_id,
        "table": table,
        "actor": actor,
        "os_user": _os_user(),  # who ran it, beside who asked (--actor)
        "started_at": now.isoformat(),
        "predicate": pred.text,
        "parent_seq": live.seq,
        "commit_seq": seq,
        "version": version,
        "entries": entries,
        "rows_removed": removed,
        # Files no reader can read (refused, truncated): not erased, so named for a person to handle.
        "unreadable_files": unreadable,
        # Partitions whose every row was erased: their directories go, their values leave the metastore
        # and every record. The values are kept here only until the erase finished (this file is deleted).
        "drop_dirs": drop_dirs,
        "drop_values": sorted(dropped),
    }
    lake.storage.write_text(_journal_path(lake, erase_id), json.dumps(journal, indent=1, sort_keys=True))
    # Hidden rewrites beside every matching file (the originals stay untouched until the decision).
    for i, e in enumerate(entries):
        _write_filtered(lake, pred, e["path"], e["temp"])
        if i == 0:
            fault_point("erase.after_first_rewrite", table)
    commit = None
    if live_changed and version is not None and seq is not None:
        commit = _write_erase_version(
            lake, live, new_files, pred, seq, version, erase_id, actor, now, removed["live"], dropped
        )
    fault_point("erase.before_commit", table)
    lease = TableLease(lake)
    if not lease.holds(owner, datetime.now(UTC)):
        # As publish does: an erase that outlived its lease may overlap a compaction; it must not decide.
        held = lease.current()
        raise ConcurrentRunError(
            f"{table}: erase {erase_id} lost the table's lease ({held.describe() if held else 'no lease'}) before "
            "its commit, so a compaction may have started. Nothing was erased; run the erase again (the lease "
            f"lasts {LEASE_TTL})"
        )
    if commit is not None:
        if not lake.try_commit(commit):
            raise ConcurrentCommitError(
                f"{table}: erase {erase_id} could not record commit {seq}: another run committed it first although "
                "the erase held the lease. Nothing was erased; run the erase again"
            )
        fault_point("erase.after_commit_record", table)
    lake.storage.write_text(_committed_path(lake, erase_id), now.isoformat())
    return _roll_forward(lake, journal, metastore), dropped


def _write_erase_version(
    lake: Lake,
    live: Commit,
    new_files: list[str],
    pred: Predicate,
    seq: int,
    version: str,
    erase_id: str,
    actor: str,
    now: datetime,
    rows_removed: int,
    dropped: frozenset[str] = frozenset(),
) -> Commit:
    """Write the erase version (the live files, filtered, under a new name) and return its commit record.

    A partition in ``dropped`` (every row erased) is left out: no directory, no entry in the record."""
    old_dir = lake.layout.version_dir(live.version)
    new_dir = lake.layout.version_dir(version)
    data_dir = lake.layout.data_dir(version, live.layout)
    partitions: dict[str, str] | None = None
    if live.partitions is not None:
        # Every partition moves into the erase version: none of them is written again in place.
        partitions = {
            value: posixpath.join(data_dir, posixpath.basename(loc))
            for value, loc in live.partitions.items()
            if value not in dropped
        }
    visible = total = 0
    partition_rows: dict[str, int] = {}
    data_root = lake.data_location(live).rstrip("/") + "/"
    feed_dir = posixpath.join(old_dir, CHANGES_DIR, "")
    for path in new_files:
        part = _partition_of(path)
        if part is not None and (part[1] in dropped or part[2]):
            # The erase version has no key index (its record names none: the next compaction reads
            # the partitions' keys), so the live index is not copied -- nor counted as its rows.
            continue
        if path.startswith(feed_dir):
            # The live commit's change feed (registry change_feed) is that commit's, not the erase's: it
            # stays (erased) in the live version; the erase commit's own is the diff publish makes.
            continue
        target = posixpath.join(new_dir, posixpath.relpath(path, old_dir))
        in_partition = None
        for value, loc in (live.partitions or {}).items():
            if partitions is not None and path.startswith(loc.rstrip("/") + "/"):
                target = posixpath.join(partitions[value], posixpath.relpath(path, loc))
                in_partition = value
                break
        lake.storage.makedirs(posixpath.dirname(target))
        kept, _ = _write_filtered(lake, pred, path, target)
        if in_partition is not None:
            partition_rows[in_partition] = partition_rows.get(in_partition, 0) + kept
        total += kept
        if target.startswith(posixpath.join(data_dir, "")) or path.startswith(data_root):
            visible += kept
    # Readers and the next compaction open these even when they hold no file.
    lake.storage.makedirs(data_dir)
    tomb = lake.layout.tombstones_dir(version, live.layout)
    if tomb is not None:
        lake.storage.makedirs(tomb)
    # The live stats name the live partitions (touched, written, files): not the dropped ones.
    stats = scrub(dict(live.stats), dropped) if dropped else dict(live.stats)
    # The counts the next compaction's validation checks its base read against.
    stats.update(
        {
            "kind": "erase",
            "erase_id": erase_id,
            "rows_erased": rows_removed,
            "output_rows": total,
            "output_visible_rows": visible,
            "output_tombstones": total - visible if live.layout >= 2 else live.stats.get("output_tombstones", 0),
        }
    )
    return Commit(
        seq=seq,
        version=version,
        plan_id=f"erase-{erase_id}",
        run_id=f"erase:{actor}",
        parent_seq=live.seq,
        files=[],
        increments=[],
        stats=stats,
        committed_at=now.isoformat(),
        partitions=partitions,
        partition_rows=(
            {v: partition_rows.get(v, 0) for v in partitions} if partitions is not None else live.partition_rows
        ),
        layout=live.layout,
        freshness=live.freshness,
        outputs=live.outputs,
        schema=live.schema,
    )


def _journal_here(lake: Lake, journal: dict[str, Any]) -> dict[str, Any]:
    """``journal`` with its paths under this root: a journal copied with the lake from another root (an
    erase that crashed before the copy) must finish on the copy's files, never touch the original's."""
    to = lake.layout.abs
    return {
        **journal,
        "entries": [{**e, "path": to(e["path"]), "temp": to(e["temp"])} for e in journal.get("entries", [])],
        "drop_dirs": [to(d) for d in journal.get("drop_dirs", [])],
    }


def _roll_forward(lake: Lake, journal: dict[str, Any], metastore: MetastoreEndpoint | None = None) -> dict[str, Any]:
    """After the decision: publish the pointer, replace each original by its rewrite, drop the emptied
    partitions (metastore, directories, records), write the audit. Every step may be redone."""
    journal = _journal_here(lake, journal)
    table = lake.cfg.qualified_name
    seq = journal.get("commit_seq")
    if seq is not None:
        commit = lake.read_commit(int(seq))
        if commit is None:
            raise EraseError(f"{table}: erase {journal['erase_id']} lost its commit record {seq}; restore it")
        lake.advance_pointer(commit)
        # Nothing to archive: an erase version takes no increments.
        lake.storage.write_text(lake.layout.archived_marker(int(seq)), "")
    values = frozenset(journal.get("drop_values", []))
    if values and lake.cfg.partition_by is not None:
        # Readers of the metastore first: a partition is gone there before its directory goes.
        _drop_metastore_partitions(lake, values, metastore)
    rewritten = []
    pred: Predicate | None = None
    for i, e in enumerate(journal["entries"]):
        if lake.storage.exists(e["temp"]):
            # An original that is gone was moved meanwhile (a pending file archived by a run that came
            # after a crash): landing it again would compact it twice; its new place is scanned anew.
            if lake.storage.exists(e["path"]):
                lake.storage.copy(e["temp"], e["path"])  # atomic: the old content or the filtered one
            lake.storage.delete(e["temp"])
            if i == 0:
                fault_point("erase.after_first_swap", table)
        elif lake.storage.exists(e["path"]):
            # The rewrite is gone (swapped already, or removed by hand): filter the original itself
            # if it still matches, so a lost temporary can never leave an erased row behind.
            pred = pred or parse_predicate(lake.cfg, journal["predicate"])
            counted = _count(lake, pred, e["path"])
            if counted is not None and counted[1]:
                _write_filtered(lake, pred, e["path"], e["path"])
        rewritten.append(e["path"])
    for d in journal.get("drop_dirs", []):
        # File by file, what the job wrote there: anything else put in such a directory stays.
        if d.startswith(lake.layout.base.rstrip("/") + "/"):
            remove_version_files(lake, d)
        else:
            remove_job_files(lake, d)
    if values:
        _scrub_records(lake, values)
    # Files were rewritten in place: a table format's metadata (sizes, column bounds) is derived, so it is
    # written anew from the kept commits rather than filtered (formats.is_metadata_path). Never raises.
    _regenerate_formats_or_fail(lake, journal["erase_id"])
    fault_point("erase.before_audit", table)
    audit = {
        "erase_id": journal["erase_id"],
        "table": table,
        "actor": journal["actor"],
        "os_user": journal.get("os_user"),
        "started_at": journal["started_at"],
        "finished_at": datetime.now(UTC).isoformat(),
        # Never the literals: the audit must not keep the values it proves erased.
        "predicate": redacted(journal["predicate"]),
        "predicate_sha256": hashlib.sha256(journal["predicate"].encode("utf-8")).hexdigest(),
        "rows_removed": journal["rows_removed"],
        "files_rewritten": rewritten,
        "partitions_removed": len(values),
        "directories_removed": len(journal.get("drop_dirs", [])),
        "unreadable_files": journal.get("unreadable_files", []),
        "commit_seq": seq,
        "version": journal.get("version"),
    }
    lake.storage.write_text(audit_path(lake, journal["erase_id"]), json.dumps(audit, indent=1, sort_keys=True))
    lake.storage.delete(_journal_path(lake, journal["erase_id"]))
    return audit


def _regenerate_formats_or_fail(lake: Lake, erase_id: str) -> None:
    """Regenerate the table formats' metadata; raise :class:`EraseError` if any format could not be.

    A format whose regeneration failed may still hold an erased value (a column bound, a checkpoint's
    statistics), so its metadata is deleted (derived data: the next publish writes it anew from the kept
    commits) and the erase fails, naming the table, the format, the metadata and what to do.  The
    journal stays: running the erase again redoes this step (the roll-forward).
    """
    from cdc_compaction.pipeline import formats

    done = formats.regenerate_formats(formats.runtime_for(lake.cfg, lake))
    failed = dict(done.get("failed") or {})
    if not failed:
        return
    problems = []
    for name, reason in sorted(failed.items()):
        fmt = formats.load(name) if name in formats.FORMATS else None
        where = fmt.metadata_root(lake) if fmt is not None else lake.layout.commits
        removed = ""
        if fmt is not None:
            try:
                if lake.storage.exists(where):
                    lake.storage.delete_tree(where)
                removed = " (deleted, so it holds no erased value; the next publish writes it anew)"
            except Exception as exc:  # noqa: BLE001 - reported with the failure below
                removed = f" (could not be deleted either: {exc}; it may still hold the erased value)"
        problems.append(f"{name} metadata {where}{removed}: {reason}")
    raise EraseError(
        f"{lake.cfg.qualified_name}: erase {erase_id} rewrote the data, but the table formats' metadata could "
        f"not be regenerated: {'; '.join(problems)}. The erase is not finished: fix the cause and run the same "
        "erase again (it finishes this step), then `erase --verify`"
    )


def _drop_metastore_partitions(lake: Lake, values: frozenset[str], metastore: MetastoreEndpoint | None) -> None:
    """Drop the base table's partitions of ``values`` (every row erased) from the metastore."""
    from cdc_compaction.core.settings import metastore_from_env
    from cdc_compaction.core.sql import table_names
    from cdc_compaction.integrations.metastore import connect

    cfg = lake.cfg
    with connect(metastore or metastore_from_env()) as ms:
        base = table_names(cfg)["base_table"]
        gone = sorted(set(ms.partitions(cfg.database, base)) & values)
        if gone:
            ms.drop_partitions(cfg.database, base, gone)
            log.info("%s: dropped %d erased partitions from the metastore", cfg.qualified_name, len(gone))


def _scrub_records(lake: Lake, values: frozenset[str]) -> None:
    """Rewrite every bookkeeping record under the root that names an erased partition value.

    Commit records included: with the data files they describe, they are the documented exception
    to "never written again" (module docstring). Each is replaced atomically (``write_text``); a
    crash in between is redone by the roll-forward.
    """
    found = inventory(lake, lake.latest_commit(), hidden=True)
    for f in found.records:
        ok, doc = _json_doc(lake, FileInfo(f.path, posixpath.basename(f.path), False, f.size, 0.0))
        if not ok or not _json_names(doc, values):
            continue
        # Sorted keys, indented: the form Commit.to_json and the pointer are written in.
        lake.storage.write_text(f.path, json.dumps(scrub(doc, values), indent=1, sort_keys=True))


def finish_unfinished(lake: Lake, metastore: MetastoreEndpoint | None = None) -> list[str]:
    """Roll forward every committed erase a crash interrupted; discard the uncommitted ones. Their ids."""
    done = []
    for f in lake.storage.list_dir(erase_dir(lake)):
        if not f.name.endswith(".json") or f.name.endswith(".audit.json"):
            continue
        journal = _journal_here(lake, json.loads(lake.storage.read_text(f.path)))
        if _is_committed(lake, journal):
            log.warning("%s: finishing erase %s a crash interrupted", lake.cfg.qualified_name, journal["erase_id"])
            _roll_forward(lake, journal, metastore)
        else:
            log.warning(
                "%s: discarding erase %s (it crashed before its commit)", lake.cfg.qualified_name, journal["erase_id"]
            )
            for e in journal["entries"]:
                if lake.storage.exists(e["temp"]):
                    lake.storage.delete(e["temp"])
            if journal.get("version"):
                remove_version_files(lake, lake.layout.version_dir(journal["version"]))
            lake.storage.delete(f.path)
        done.append(journal["erase_id"])
    return done


def verify(lake: Lake, pred: Predicate, values: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Re-read every file under the table's root (hidden ones too): the Parquet files that still match
    (decoded rows), and the path names, records and other files that still name an erased value.

    The erased values searched for: ``values`` (what an erase just removed) and the predicate's
    :func:`identifying_literals`. ``naming`` lists the paths of what names one (never the value).
    """
    found = scan(lake, pred, hidden=True)
    tokens = frozenset(values) | identifying_literals(pred.text)
    naming = _records_naming(lake, found["inventory"], tokens) if tokens else []
    return {
        "files_checked": found["files_checked"],
        "matching": found["matching"],
        "unreadable": found["unreadable"],
        "unhandled": found["unhandled"],
        "naming": naming,
    }


def preview(cfg: TableConfig, where: str, lake: Lake | None = None) -> dict[str, Any]:
    """What an erase would remove (rows per location, matching files), changing nothing."""
    pred = parse_predicate(cfg, where)
    lake = lake or Lake(cfg)
    found = scan(lake, pred)
    return {
        "table": cfg.qualified_name,
        "predicate": where,
        "rows": found["rows"],
        "files": sorted(found["matching"]),
        "unreadable": found["unreadable"],
        # Neither Parquet nor a record of the lake: an erase refuses until they are handled.
        "unhandled": found["unhandled"],
    }
