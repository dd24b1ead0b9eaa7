"""Checking a landed change file before it may be compacted: readable, and a schema that fits.

The plan task reads every pending file's Parquet footer (never the data) and applies
the registry's drift policy, so a bad file stops or is set aside *before* Spark runs:

* unreadable (zero bytes, truncated, not Parquet)            -> bad file
* a registry column missing from the file                     -> accepted, read as NULL
* a column type the reader widens safely (int -> bigint, float -> double, decimal(5,2) ->
  decimal(10,2), timestamp in ms/us)                          -> accepted
* any other type (string where the registry says int)         -> bad file
* a column the registry does not list                         -> ``on_extra_columns``: fail | ignore

Bad files are handled per ``on_bad_file``: ``fail`` (default: the run stops before
anything changes and names every file and reason) or ``quarantine`` (the file is moved
to the table's quarantine with its reason, the run goes on, the owners are alerted).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cdc_compaction.exceptions import StorageError
from cdc_compaction.registry import TableConfig
from cdc_compaction.storage import LocalStorage, Storage

_INTS = ["int8", "int16", "int32", "int64"]
_UINTS = ["uint8", "uint16", "uint32"]
# Arrow types Spark's Parquet reader turns into each Hive type without loss (checked
# against Spark 4.2's vectorized and row readers, see tests/test_inputs.py).
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


def _decimal(t: str) -> tuple[int, int] | None:
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
    want, got = _decimal(hive_type), _decimal(arrow_type)
    if want is not None and got is not None:
        (p, s), (fp, fs) = want, got
        return fs <= s and fp - fs <= p - s
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


def arrow_schema(cfg: TableConfig) -> Any:
    """The registry columns as an Arrow schema."""
    import pyarrow as pa

    return pa.schema([(c.name, arrow_type(c.type)) for c in cfg.columns])


@dataclass
class FileCheck:
    """What the footer of one landed file says."""

    rows: int = 0
    problem: str | None = None
    ignored_columns: list[str] = field(default_factory=list)
    missing_columns: list[str] = field(default_factory=list)


def parquet_footer(storage: Storage, path: str) -> Any:
    """The Parquet metadata of one file, read from its end only (ranged reads on S3)."""
    import pyarrow.parquet as pq

    with storage.open_read(path) as fh:
        return pq.read_metadata(fh)


def check_file(cfg: TableConfig, path: str, storage: Storage | None = None, size: int | None = None) -> FileCheck:
    """Read one file's footer and judge it against the registry (never raises for bad data)."""
    storage = storage or LocalStorage()
    try:
        meta = parquet_footer(storage, path)
        schema = meta.schema.to_arrow_schema()
    except StorageError:
        raise  # the store is unreachable or refuses us: that is not the file's fault
    except Exception as exc:  # noqa: BLE001 - every reader error means the same: the file is unreadable
        if size is None:
            size = storage.size(path) if storage.exists(path) else -1
        reason = "empty file (0 bytes)" if size == 0 else f"not readable as Parquet ({type(exc).__name__}: {exc})"
        return FileCheck(problem=reason)
    found: dict[str, Any] = {f.name.lower(): f for f in schema}
    check = FileCheck(rows=meta.num_rows)
    wrong = []
    for col in cfg.columns:
        f = found.pop(col.name.lower(), None)
        if f is None:
            check.missing_columns.append(col.name)
        elif not readable_as(col.type, str(f.type)):
            wrong.append(f"column {col.name!r} is {f.type} in the file but {col.type} in the registry")
    check.ignored_columns = sorted(f.name for f in found.values())
    if wrong:
        check.problem = "incompatible schema: " + "; ".join(wrong)
    elif check.ignored_columns and cfg.on_extra_columns == "fail":
        check.problem = (
            f"columns {check.ignored_columns} are not in the registry (add them to the registry's columns, "
            "or set on_extra_columns: ignore)"
        )
    return check
