"""Hive column types against the Arrow/Parquet types of landed files: the type rules, written once.

Which Arrow type Spark's Parquet reader turns into each Hive type without loss
(:func:`readable_as`), which Hive type changes are safe widenings (:func:`hive_widening`),
the Arrow type a Hive column is written as (:func:`arrow_type`), and how a file column's type
looks to Spark (:func:`logical_type`, from the footer's Arrow and physical types). The plan's
file check (:mod:`cdc_compaction.core.inputs`), the schema-change policy (:mod:`cdc_compaction.core.schema`),
``registry discover`` and the table DDL all ask these; none of them imports the others for it.
"""

from __future__ import annotations

import re
from typing import Any

_INTS = ["int8", "int16", "int32", "int64"]
_UINTS = ["uint8", "uint16", "uint32"]
# Arrow types Spark's Parquet reader turns into each Hive type without loss (checked
# against Spark 4.2's vectorized and row readers, see tests/core/test_inputs.py).
_READABLE_AS: dict[str, list[str]] = {
    "tinyint": ["int8"],
    "smallint": ["int8", "int16"],
    "int": ["int8", "int16", "int32"],
    "bigint": [*_INTS, *_UINTS],
    "float": ["float"],
    "double": ["float", "double", "int8", "int16", "int32"],
    "boolean": ["bool"],
    "date": ["date32[day]"],
    "binary": ["binary", "large_binary"],
    "string": ["string", "large_string"],
}
_DECIMAL = re.compile(r"^decimal(?:\((\d+),\s*(\d+)\))?$")


def decimal_parts(t: str) -> tuple[int, int] | None:
    m = _DECIMAL.match(t.replace("decimal128", "decimal").replace("decimal256", "decimal"))
    if not m:
        return None
    return (int(m.group(1)), int(m.group(2))) if m.group(1) else (10, 0)


def readable_as(hive_type: str, arrow_type: str) -> bool:
    """True if a Parquet column of ``arrow_type`` reads as ``hive_type`` without loss."""
    hive_type = hive_type.lower()
    if hive_type in _READABLE_AS:
        return arrow_type in _READABLE_AS[hive_type]
    if hive_type.startswith(("varchar", "char")):
        return arrow_type in ("string", "large_string")
    if hive_type == "timestamp":
        # Spark reads millis and micros; nanosecond timestamps it refuses.
        return arrow_type.startswith(("timestamp[ms", "timestamp[us"))
    want, got = decimal_parts(hive_type), decimal_parts(arrow_type)
    if want is not None and got is not None:
        (p, s), (fp, fs) = want, got
        return fs <= s and fp - fs <= p - s
    return False


_INT_RANK = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4}


def hive_widening(old: str, new: str) -> bool:
    """True if a live column of Hive type ``old`` may become ``new``: every old value and file still reads.

    The same widenings Spark's Parquet reader applies to files written with the old type
    (see :func:`readable_as`): a longer integer, float -> double, an integer up to int ->
    double, a decimal holding every value of the old one, varchar/char -> string.
    """
    old, new = old.lower(), new.lower()
    if old in _INT_RANK and new in _INT_RANK:
        return _INT_RANK[new] > _INT_RANK[old]
    if new == "double":
        return old == "float" or _INT_RANK.get(old, 9) <= _INT_RANK["int"]
    if new == "string":
        return old.startswith(("varchar", "char"))
    want, got = decimal_parts(new), decimal_parts(old)
    if old.startswith("decimal") and new.startswith("decimal") and want is not None and got is not None:
        (p, s), (fp, fs) = want, got
        return (p, s) != (fp, fs) and fs <= s and fp - fs <= p - s
    return False


def arrow_type(hive_type: str) -> Any:
    """The Arrow type a Hive column is written as (what Spark writes and reads back)."""
    import pyarrow as pa

    simple = {
        "tinyint": pa.int8(),
        "smallint": pa.int16(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "string": pa.string(),
        "boolean": pa.bool_(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "binary": pa.binary(),
    }
    if hive_type in simple:
        return simple[hive_type]
    m = re.match(r"decimal\((\d+),(\d+)\)", hive_type)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    if hive_type == "decimal":
        return pa.decimal128(10, 0)
    return pa.string()  # varchar / char


def physical_types(meta: Any) -> dict[str, str]:
    """Top-level column name -> Parquet physical type (``INT96``, ``INT64``, …) of one footer."""
    out: dict[str, str] = {}
    for i in range(meta.num_columns):
        col = meta.schema.column(i)
        if "." not in col.path:
            out[col.path] = col.physical_type
    return out


def logical_type(arrow: Any, physical: str | None) -> str:
    """The Arrow type of a file column as Spark's reader sees it, for :func:`readable_as`.

    A dictionary-encoded column (pyarrow keeps ``dictionary<values=string,…>`` in the
    file's Arrow schema) is its value type to Spark. An INT96 timestamp, which Arrow reads
    as nanoseconds, is what Spark itself writes for ``timestamp`` columns and reads as
    microseconds; a true INT64 nanosecond timestamp Spark refuses, so it stays ``ns``.
    """
    import pyarrow as pa

    if pa.types.is_dictionary(arrow):
        arrow = arrow.value_type
    if physical == "INT96" and pa.types.is_timestamp(arrow):
        return "timestamp[us]"
    return str(arrow)


#: Other systems' names of a type (PostgreSQL, MySQL, SQL Server, Oracle, Snowflake, Arrow, Java), with the
#: Hive type that holds every value of it. Keys are lower case with single spaces.
_OTHER_SYSTEMS: dict[str, str] = {
    # integers: the Hive integer at least as wide
    "int8": "bigint",  # PostgreSQL's 8-byte integer (Arrow's int8 is 1 byte: bigint holds that too)
    "int4": "int",
    "int2": "smallint",
    "int64": "bigint",
    "int32": "int",
    "int16": "smallint",
    "long": "bigint",
    "short": "smallint",
    "byte": "tinyint",
    "serial": "int",
    "serial4": "int",
    "smallserial": "smallint",
    "serial2": "smallint",
    "bigserial": "bigint",
    "serial8": "bigint",
    "mediumint": "int",
    "tinyint unsigned": "smallint",
    "smallint unsigned": "int",
    "mediumint unsigned": "int",
    "int unsigned": "bigint",
    "integer unsigned": "bigint",
    "bigint unsigned": "decimal(20,0)",
    "hugeint": "decimal(38,0)",
    # exact numbers: the precision and scale are the source's
    "numeric": "decimal(p,s)",
    "number": "decimal(p,s)",
    "dec": "decimal(p,s)",
    "money": "decimal(19,4)",
    "smallmoney": "decimal(10,4)",
    # floating point
    "float8": "double",
    "float64": "double",
    "double precision": "double",
    "binary_double": "double",
    "float4": "float",
    "float32": "float",
    "real": "float",
    "binary_float": "float",
    # text, and what has no Hive type of its own
    "text": "string",
    "str": "string",
    "varchar": "string",
    "character varying": "string",
    "nvarchar": "string",
    "varchar2": "string",
    "nvarchar2": "string",
    "citext": "string",
    "tinytext": "string",
    "mediumtext": "string",
    "longtext": "string",
    "clob": "string",
    "nclob": "string",
    "uuid": "string",
    "uniqueidentifier": "string",
    "json": "string",
    "jsonb": "string",
    "xml": "string",
    "enum": "string",
    "inet": "string",
    "cidr": "string",
    "interval": "string",
    "time": "string",
    "timetz": "string",
    "time with time zone": "string",
    "time without time zone": "string",
    # truth values
    "bool": "boolean",
    "bit": "boolean",
    # points in time: Spark's timestamp is an instant (UTC), which holds a zoned or a local one
    "datetime": "timestamp",
    "datetime2": "timestamp",
    "smalldatetime": "timestamp",
    "datetimeoffset": "timestamp",
    "timestamptz": "timestamp",
    "timestamp with time zone": "timestamp",
    "timestamp without time zone": "timestamp",
    "timestamp with local time zone": "timestamp",
    "timestamp_tz": "timestamp",
    "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp",
    "instant": "timestamp",
    # bytes
    "bytea": "binary",
    "bytes": "binary",
    "blob": "binary",
    "tinyblob": "binary",
    "mediumblob": "binary",
    "longblob": "binary",
    "varbinary": "binary",
    "image": "binary",
    "raw": "binary",
}
#: ``name(n)`` / ``name(p,s)`` of other systems: the name's family and the Hive type built from the numbers.
_PARAMETERIZED = re.compile(r"^(?P<name>[a-z_][a-z0-9_ ]*?)\s*\((?P<a>\d+)(?:,(?P<b>\d+))?\)(?P<rest>[a-z ]*)$")


def hive_type_for(written: str) -> str | None:
    """The Hive type that holds every value of what another system calls ``written``, or None if it is none known.

    ``numeric(12,2)`` -> ``decimal(12,2)``, ``int8`` -> ``bigint``, ``character varying(40)`` ->
    ``varchar(40)``, ``timestamp(3) with time zone`` -> ``timestamp``, ``int(11)`` (a display width) ->
    ``int``. A suggestion for an author's did-you-mean, never applied silently: the author knows the source.
    """
    text = re.sub(r"\s*([(),])\s*", r"\1", re.sub(r"\s+", " ", written.strip().lower()))
    if text in _OTHER_SYSTEMS:
        return _OTHER_SYSTEMS[text]
    m = _PARAMETERIZED.match(text)
    if m is None:
        return None
    name, a, b, rest = m.group("name").strip(), int(m.group("a")), m.group("b"), m.group("rest").strip()
    family = f"{name} {rest}".strip()
    if name in ("numeric", "number", "decimal", "dec"):
        scale = int(b) if b is not None else 0
        return f"decimal({a},{scale})" if 1 <= a <= 38 and scale <= a else "string"
    if name in ("character varying", "varchar", "nvarchar", "varchar2", "nvarchar2"):
        return f"varchar({a})" if 1 <= a <= 65535 else "string"
    if name in ("character", "char", "nchar", "bpchar"):
        return f"char({a})" if 1 <= a <= 255 else "string"
    if name == "float" and b is None:
        return "float" if a <= 24 else "double"  # the mantissa's bits, as SQL Server and PostgreSQL read it
    if name == "bit" and a == 1:
        return "boolean"
    if name in ("tinyint", "smallint", "int", "integer", "bigint", "mediumint") and b is None:
        return hive_type_for(family) or ("int" if name == "integer" else name)  # MySQL's display width
    if name in ("timestamp", "datetime", "datetime2", "datetimeoffset", "time", "timestamptz", "timetz"):
        return hive_type_for(family) or hive_type_for(name) or "timestamp"  # fractional-second digits
    if name in ("binary", "varbinary", "raw", "bit varying", "varbit"):
        return "binary"
    return None
