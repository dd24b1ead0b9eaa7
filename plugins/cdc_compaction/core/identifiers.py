"""SQL identifiers and Hive types: validation and quoting.

Every name that reaches SQL goes through :func:`check_identifier` when the registry
is loaded and through :func:`quote` when SQL is rendered, so reserved words such as
``timestamp`` or ``order`` work and nothing from a registry file can inject SQL.
"""

from __future__ import annotations

import re

from cdc_compaction.core.exceptions import IdentifierError
from cdc_compaction.job.contract import PARTITION_DIR_COLUMN

# Hive and Spark accept more, but this set is portable across Hive, Spark, Trino,
# Athena and Glue, and it can never carry quotes, backticks, dots or whitespace.
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

#: Column names starting with this prefix are reserved for the package's own
#: bookkeeping columns (event provenance in the base table).
RESERVED_PREFIX = "_cdc_"


def reserved_name_problem(name: str) -> str | None:
    """Why ``name`` (any case) is reserved for the package besides :data:`RESERVED_PREFIX`; None if it is not.

    ``cdc_partition`` names a partitioned table's directories (``cdc_partition=<value>``): a column of
    that name would meet the value Spark's partition discovery takes from them when the job reads a
    partition back.  Reserved for every table, so turning ``partition_by`` on later never meets it.
    """
    if name.lower() == PARTITION_DIR_COLUMN:
        return (
            f"{name!r} is reserved for the package: partitioned tables name their directories "
            f"{PARTITION_DIR_COLUMN}=<value>, which Spark reads back as a column of that name"
        )
    return None


_PRIMITIVE_TYPES = {
    "tinyint",
    "smallint",
    "int",
    "integer",
    "bigint",
    "float",
    "double",
    "string",
    "boolean",
    "date",
    "timestamp",
    "binary",
}
_PARAM_TYPES = re.compile(
    r"^(?:decimal\((?P<p>\d{1,2}),(?P<s>\d{1,2})\)|decimal|varchar\((?P<v>\d{1,5})\)|char\((?P<c>\d{1,3})\))$"
)
# Hive's limits: decimal precision 1-38, varchar 1-65535, char 1-255.
_LIMITS = {"p": (1, 38), "v": (1, 65535), "c": (1, 255)}


def check_identifier(name: str, what: str = "identifier") -> str:
    """Return ``name`` unchanged if it is a safe identifier, else raise :class:`IdentifierError`."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise IdentifierError(
            f"{what} {name!r} is not a valid identifier: use letters, digits and underscores, "
            "starting with a letter or underscore, at most 128 characters"
        )
    return name


def quote(name: str) -> str:
    """Backquote an identifier that has passed :func:`check_identifier`."""
    check_identifier(name)
    return f"`{name}`"


def normalize_hive_type(type_name: str) -> str:
    """Return the canonical lower-case spelling of a supported Hive type or raise."""
    if not isinstance(type_name, str):
        raise IdentifierError(f"type {type_name!r} is not a string")
    t = re.sub(r"\s+", "", type_name.strip().lower())
    if t == "integer":
        return "int"
    if t in _PRIMITIVE_TYPES:
        return t
    m = _PARAM_TYPES.match(t)
    if m:
        for group, (lo, hi) in _LIMITS.items():
            if m.group(group) is not None and not lo <= int(m.group(group)) <= hi:
                raise IdentifierError(f"type {type_name!r}: the length or precision must be between {lo} and {hi}")
        if m.group("p") is not None and int(m.group("s")) > int(m.group("p")):
            raise IdentifierError(f"type {type_name!r}: decimal scale is larger than its precision")
        return t
    raise IdentifierError(
        f"unknown Hive type {type_name!r}: supported are "
        + ", ".join(sorted(_PRIMITIVE_TYPES - {"integer"}))
        + ", decimal(p,s), varchar(n), char(n)"
    )
