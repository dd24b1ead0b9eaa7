"""A PostgreSQL table's columns, key and replica identity, read from its catalog for ``registry discover``.

The landed files say what the sink wrote; the source's catalog says what the table is: its
primary key (``pg_index.indisprimary``), the exact column types (``char(3)``, ``numeric(12,2)``,
``timestamptz``) and its ``REPLICA IDENTITY`` (what old values PostgreSQL logs for updates and
deletes: a table without a key can be compacted as ``mode: keyless`` only if the log carries
the whole old row, ``REPLICA IDENTITY FULL``).  Read with psycopg2 (the project's PostgreSQL
driver) from a libpq DSN or an Airflow connection; nothing is written.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from typing import Any

from cdc_compaction.core.credentials import mask_credentials
from cdc_compaction.core.exceptions import CdcCompactionError

#: pg_class.relreplident: what the WAL carries of a row before an update or delete.
REPLICA_IDENTITY = {"d": "DEFAULT", "n": "NOTHING", "f": "FULL", "i": "USING INDEX"}

_SIMPLE = {
    "smallint": "smallint",
    "integer": "int",
    "bigint": "bigint",
    "real": "float",
    "double precision": "double",
    "boolean": "boolean",
    "text": "string",
    "character varying": "string",
    "uuid": "string",
    "json": "string",
    "jsonb": "string",
    "xml": "string",
    "citext": "string",
    "date": "date",
    "bytea": "binary",
}
_TIMESTAMP = re.compile(r"^timestamp(?:\(\d\))? (with|without) time zone$")
_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")
_CHAR = re.compile(r"^(character|character varying)\((\d+)\)$")
#: Hive's limits: char(1-255), varchar(1-65535), decimal precision 1-38.
_MAX_CHAR, _MAX_VARCHAR, _MAX_PRECISION = 255, 65535, 38


class CatalogError(CdcCompactionError):
    """The PostgreSQL catalog could not be read (connection, permissions)."""


@dataclass(frozen=True)
class PgColumn:
    """One column: its PostgreSQL type (``format_type``), the Hive type it maps to (or None) and a note."""

    name: str
    pg_type: str
    hive: str | None
    note: str = ""
    not_null: bool = False


@dataclass
class PgTable:
    """What the catalog says about one table."""

    schema: str
    name: str
    columns: list[PgColumn] = field(default_factory=list)
    primary_key: list[str] = field(default_factory=list)
    #: DEFAULT, NOTHING, FULL or USING INDEX, and that index's columns (a unique key of NOT NULL columns).
    replica_identity: str = "DEFAULT"
    identity_index: list[str] = field(default_factory=list)

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"


def hive_type_of_pg(pg_type: str) -> tuple[str | None, str]:
    """(the Hive type a PostgreSQL column of ``pg_type`` is declared as, or None; a note for the reviewer)."""
    t = pg_type.strip().lower()
    if t in _SIMPLE:
        note = "unbounded text" if t == "character varying" else ""
        return _SIMPLE[t], note
    m = _TIMESTAMP.match(t)
    if m:
        if m.group(1) == "with":
            return "timestamp", "timestamptz: an instant, kept in UTC (Spark's session time zone)"
        return "timestamp", "timestamp without time zone: kept as written (read as UTC)"
    m = _NUMERIC.match(t)
    if m:
        p, s = int(m.group(1)), int(m.group(2))
        if p > _MAX_PRECISION:
            return None, f"{pg_type}: precision above Hive's {_MAX_PRECISION}; land it as a string or narrow it"
        return f"decimal({p},{s})", ""
    if t == "numeric":
        return None, "numeric without precision holds any value: write a decimal(p,s) that holds the source's values"
    m = _CHAR.match(t)
    if m:
        n = int(m.group(2))
        if m.group(1) == "character":
            if n <= _MAX_CHAR:
                return f"char({n})", "blank-padded to its length, as PostgreSQL sends it"
            return f"varchar({n})", f"character({n}) is longer than Hive's char({_MAX_CHAR}): kept as varchar({n})"
        if n <= _MAX_VARCHAR:
            return f"varchar({n})", ""
        return "string", f"character varying({n}) is longer than Hive's varchar({_MAX_VARCHAR})"
    return None, f"PostgreSQL type {pg_type} has no Hive type here: write the type the sink lands it as"


def connect(dsn: str | None = None, conn_id: str | None = None) -> Any:
    """A psycopg2 connection from a libpq ``dsn`` or the Airflow connection ``conn_id`` (read only).

    A connection error names the DSN (or the connection) and libpq's reason, never a password: not
    the DSN's (``postgresql://u:pw@h/db``, ``password=pw``, ``?password=pw``), not the connection's,
    not ``$PGPASSWORD``'s, even where libpq quotes a piece of a DSN it cannot read.
    """
    import psycopg2

    secrets = _passwords(dsn or "")
    try:
        if dsn is not None:
            conn = psycopg2.connect(dsn)
        elif conn_id is not None:
            from airflow.sdk import BaseHook

            c = BaseHook.get_connection(conn_id)
            secrets += [c.password] if c.password else []
            conn = psycopg2.connect(
                host=c.host, port=c.port or 5432, user=c.login, password=c.password, dbname=c.schema or "postgres"
            )
        else:
            raise CatalogError("give a PostgreSQL DSN (--postgres-dsn) or an Airflow connection (--postgres-conn-id)")
    except psycopg2.Error as exc:
        where = f"the DSN {_hidden(dsn, secrets)!r}" if dsn is not None else f"the Airflow connection {conn_id!r}"
        reason = _hidden(str(exc).strip(), secrets)
        raise CatalogError(f"cannot connect to PostgreSQL through {where}: {reason}") from None
    conn.set_session(readonly=True, autocommit=True)
    return conn


def _passwords(dsn: str) -> list[str]:
    """Every password ``dsn`` (and ``$PGPASSWORD``) may hold, as written and as libpq reads it.

    As written too: a DSN libpq cannot parse is not parsed here either, and its error may quote a
    piece of it (``missing "=" after "cret"`` of ``password=se cret``), so the text after ``password=``
    up to the next ``key=`` counts, word by word.
    """
    from urllib.parse import unquote

    import psycopg2
    from psycopg2.extensions import parse_dsn

    found = [os.environ.get("PGPASSWORD", "")]
    with contextlib.suppress(psycopg2.Error):  # unparsable: the raw forms below
        found.append(parse_dsn(dsn).get("password", "") if dsn else "")
    for m in re.finditer(r"password\s*=\s*(.*?)(?=\s+\w+\s*=|&|$)", dsn, flags=re.IGNORECASE):
        raw = m.group(1).strip()
        found += [raw, raw.strip("'\""), *raw.strip("'\"").split()]
    for m in re.finditer(r"://[^:/?#\s]*:([^\s/?#]*)@", dsn):
        found += [m.group(1), unquote(m.group(1))]
    # Long enough not to mask ordinary words of the message; shorter ones are masked by their place.
    return [f for f in found if len(f) >= 3]


def _hidden(text: str | None, secrets: list[str]) -> str:
    """``text`` with every credential masked: by its place (:func:`mask_credentials`), then every password known."""
    out = mask_credentials(text or "")
    for secret in sorted(set(secrets), key=len, reverse=True):
        out = out.replace(secret, "******")
    return out


_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
FROM pg_attribute a
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
# The primary key's and the replica identity index's columns, in the index's order.
_INDEX = """
SELECT a.attname
FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[])
WHERE i.indrelid = %s AND {which}
ORDER BY array_position(i.indkey::int2[], a.attnum)
"""


def read_table(conn: Any, schema: str, table: str) -> PgTable | None:
    """The catalog's view of ``schema.table`` (a table, partitioned table or view); None if there is none."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            (schema, table),
        )
        found = cur.fetchone()
        if found is None:
            return None
        oid, replident = found
        out = PgTable(schema, table, replica_identity=REPLICA_IDENTITY.get(str(replident), str(replident)))
        cur.execute(_COLUMNS, (oid,))
        for name, pg_type, not_null in cur.fetchall():
            hive, note = hive_type_of_pg(pg_type)
            out.columns.append(PgColumn(name, pg_type, hive, note, bool(not_null)))
        cur.execute(_INDEX.format(which="i.indisprimary"), (oid,))
        out.primary_key = [r[0] for r in cur.fetchall()]
        if out.replica_identity == "USING INDEX":
            cur.execute(_INDEX.format(which="i.indisreplident"), (oid,))
            out.identity_index = [r[0] for r in cur.fetchall()]
    return out
