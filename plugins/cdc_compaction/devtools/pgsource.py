"""PostgreSQL as a CDC source: wal2json changes to Debezium-flattened Parquet increments.

What Debezium's PostgreSQL connector with the ``ExtractNewRecordState`` transform
(``delete.handling.mode=rewrite``) would land, without Kafka: a logical replication
slot with the ``wal2json`` plugin (format version 2: one JSON document per row change)
is read with ``pg_logical_slot_get_changes``, and every change becomes one row of the
registry's columns plus

* the op column: ``c`` insert, ``u`` update, ``d`` delete;
* ``ts_ms``: the transaction's commit time in milliseconds (Debezium's ``source.ts_ms``);
* ``lsn``: the change's own WAL position as a bigint (Debezium's ``source.lsn``).  Every
  change of a transaction has its own, increasing LSN (several updates of one row in
  one transaction included), so ``order_by: [lsn]`` orders a key's events exactly as
  PostgreSQL applied them.
* ``commit_lsn`` (where the table has the column): the LSN of the transaction's commit.  The
  slot delivers whole transactions in commit order, so a transaction that began early and
  committed late has change LSNs below those already delivered: the commit LSN, not the
  change LSN, is the position in delivery order (what a keyless table's watermark needs).
* ``lsn_row`` (where the table has the column): the event's ordinal among the events at its
  LSN: 0 for a change, the row number for the rows of an initial snapshot
  (:func:`snapshot_changes`), which all carry one LSN, the slot's consistent point, as
  Debezium stamps them.

An update that changes the primary key becomes a delete of the old key followed by a
create of the new key, both at the update's LSN, as Debezium emits it.  A delete
carries the key columns (from the replica identity) and nulls elsewhere.

The same changes can also be landed as a source that carries the old key lands them
(:func:`old_key_rows`, for ``old_key`` tables) or, for a table without a primary key under
``REPLICA IDENTITY FULL``, with whole before-images (:func:`keyless_rows`, ``mode: keyless``).

The PostgreSQL demo (``make demo SOURCE=postgres``) and ``tests/e2e/test_postgres_truth.py``
land their changes through this module.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from cdc_compaction.core.exceptions import CdcCompactionError
from cdc_compaction.core.registry import TableConfig

log = logging.getLogger(__name__)

PLUGIN = "wal2json"
#: pg_logical_slot_get_changes options: one document per change, each with its LSN and commit time.
#: The transaction's B(egin) document carries its commit LSN (the one the C(ommit) document carries too).
_OPTIONS = ("format-version", "2", "include-lsn", "1", "include-timestamp", "1", "include-transaction", "1")
#: R: a row of an initial snapshot (:func:`snapshot_changes`), Debezium's op r.
_OPS = {"I": "c", "U": "u", "D": "d", "R": "r"}


class SourceError(CdcCompactionError):
    """A change from the source cannot be turned into a CDC event."""


def lsn_to_int(lsn: str) -> int:
    """``'16/B374D848'`` -> 0x16B374D848: PostgreSQL's 64-bit WAL position (hi/lo 32-bit halves)."""
    hi, _, lo = lsn.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


@dataclass(frozen=True)
class Change:
    """One row change of a wal2json (format version 2) document."""

    action: str  # I, U, D, or R (a snapshot row)
    table: str  # schema.table
    lsn: int
    commit_ms: int
    columns: dict[str, Any]  # the new row (I, U, R); empty for D
    identity: dict[str, Any]  # the old key (U, D); empty for I and R
    #: The transaction's commit LSN (a snapshot row: the slot's consistent point, as its lsn).
    commit_lsn: int = 0
    #: The ordinal among the events at ``lsn``: 0 for a change, the row number in a snapshot.
    row: int = 0

    @classmethod
    def parse(cls, doc: str, commit_lsn: int = 0) -> Change:
        # Numerics arrive as JSON numbers: keep them exact, as the source has them.
        d = json.loads(doc, parse_float=Decimal)
        commit = datetime.fromisoformat(d["timestamp"])
        return cls(
            action=d["action"],
            table=f"{d['schema']}.{d['table']}",
            lsn=lsn_to_int(d["lsn"]),
            commit_ms=int(commit.timestamp() * 1000),
            columns={c["name"]: c.get("value") for c in d.get("columns", [])},
            identity={c["name"]: c.get("value") for c in d.get("identity", [])},
            commit_lsn=commit_lsn,
        )


def create_slot(conn: Any, slot: str) -> int:
    """Create a logical replication slot with wal2json; changes committed after this are kept for it.

    Returns the slot's consistent point: every transaction committed after it is delivered, none before.
    """
    with conn.cursor() as cur:
        cur.execute("SELECT lsn FROM pg_create_logical_replication_slot(%s, %s)", (slot, PLUGIN))
        (lsn,) = cur.fetchone()
    conn.commit()
    return lsn_to_int(lsn)


def snapshot_changes(conn: Any, table: str, consistent_point: int, commit_ms: int = 0) -> list[Change]:
    """The initial snapshot of ``table`` as Debezium sends it: one read (op r) per row, all at one LSN.

    Every row carries the slot's ``consistent_point`` as its LSN and commit LSN, and its row
    number as ``row``: nothing else tells two equal rows of a table without a key apart.  The
    rows are the table as it is now, so the caller takes the snapshot before anything changes
    the table after :func:`create_slot` (Debezium reads in the slot's exported snapshot instead).
    """
    from psycopg2 import sql as pgsql

    schema, _, name = table.rpartition(".")
    with conn.cursor() as cur:
        cur.execute(pgsql.SQL("SELECT * FROM {}").format(pgsql.Identifier(schema or "public", name)))
        names = [d[0] for d in cur.description]
        rows = cur.fetchall()
    conn.commit()
    return [
        Change("R", table, consistent_point, commit_ms, dict(zip(names, r, strict=True)), {}, consistent_point, i)
        for i, r in enumerate(rows)
    ]


def drop_slot(conn: Any, slot: str) -> None:
    """Drop the slot (a forgotten slot keeps WAL forever)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    conn.commit()


def read_changes(conn: Any, slot: str, table: str | None = None) -> list[Change]:
    """Consume every change committed since the last read, in commit order; only ``table`` if given."""
    options = list(_OPTIONS)
    if table is not None:
        options += ["add-tables", table]
    placeholders = ", ".join(["%s"] * len(options))
    with conn.cursor() as cur:
        cur.execute(f"SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, {placeholders})", (slot, *options))
        docs = [row[0] for row in cur.fetchall()]
    conn.commit()  # consuming is part of this transaction: make it stick
    changes, commit_lsn = [], 0
    for d in docs:
        head = json.loads(d, parse_float=Decimal)
        if head["action"] == "B":
            commit_lsn = lsn_to_int(head["lsn"])  # the B document's lsn is its transaction's commit LSN
        elif head["action"] in ("I", "U", "D"):  # not C, T (truncate) or M (message)
            changes.append(Change.parse(d, commit_lsn))
    log.info("read %d changes from slot %s", len(changes), slot)
    return changes


#: The position columns written where the table has them (see the module's docstring).
COMMIT_LSN, LSN_ROW = "commit_lsn", "lsn_row"


def _position(cfg: TableConfig, ch: Change, ts_column: str, lsn_column: str, row: int | None = None) -> dict[str, Any]:
    """An event's op-independent source columns: commit time, LSN, and commit LSN and ordinal where declared."""
    out: dict[str, Any] = {ts_column: ch.commit_ms, lsn_column: ch.lsn}
    names = set(cfg.column_names)
    if COMMIT_LSN in names:
        out[COMMIT_LSN] = ch.commit_lsn
    if LSN_ROW in names:
        out[LSN_ROW] = ch.row if row is None else row
    return out


def debezium_rows(
    cfg: TableConfig, changes: list[Change], ts_column: str = "ts_ms", lsn_column: str = "lsn"
) -> list[dict[str, Any]]:
    """The flattened events Debezium would write for ``changes``, in order, with the registry's columns."""
    skip = (cfg.op_column, ts_column, lsn_column, COMMIT_LSN, LSN_ROW)
    data_columns = [c for c in cfg.column_names if c not in skip]
    key = list(cfg.primary_key)
    rows: list[dict[str, Any]] = []

    def event(values: dict[str, Any], op: str, ch: Change, row: int | None = None) -> dict[str, Any]:
        out = {c: values.get(c) for c in data_columns}
        out.update({cfg.op_column: op, **_position(cfg, ch, ts_column, lsn_column, row)})
        return out

    for ch in changes:
        if ch.action in ("I", "R"):
            rows.append(event(ch.columns, _OPS[ch.action], ch))
        elif ch.action == "D":
            if not all(k in ch.identity for k in key):
                raise SourceError(f"delete at lsn {ch.lsn} of {ch.table} lacks key columns {key}: {ch.identity}")
            rows.append(event({k: ch.identity[k] for k in key}, "d", ch))
        else:
            old = {k: ch.identity[k] for k in key if k in ch.identity}
            if len(old) == len(key) and any(old[k] != ch.columns.get(k) for k in key):
                # The key changed: the old key is gone, the new one is created (Debezium: d, then c).
                rows.append(event(old, "d", ch))
                rows.append(event(ch.columns, "c", ch, row=1))  # two events at one LSN: the second is row 1
            else:
                rows.append(event(ch.columns, "u", ch))
    return rows


def old_key_rows(
    cfg: TableConfig, changes: list[Change], ts_column: str = "ts_ms", lsn_column: str = "lsn"
) -> list[dict[str, Any]]:
    """The events of ``changes`` as a source that carries the old key lands them (registry ``old_key``).

    As wal2json gives them (seed 002's oldKeyValues): an update names the key it had before in the
    old-key columns when the key changed (the replica identity is sent then), a delete names its key
    only there and has no column values. One event per change: key changes are not split.
    """
    key, old = list(cfg.primary_key), list(cfg.old_key)
    skip = (cfg.op_column, ts_column, lsn_column, COMMIT_LSN, LSN_ROW, *old)
    data_columns = [c for c in cfg.column_names if c not in skip]
    rows: list[dict[str, Any]] = []
    for ch in changes:
        values = ch.columns if ch.action != "D" else {}
        row = {c: values.get(c) for c in data_columns}
        before = {k: ch.identity[k] for k in key if k in ch.identity}
        if ch.action == "D" and len(before) != len(key):
            raise SourceError(f"delete at lsn {ch.lsn} of {ch.table} lacks key columns {key}: {ch.identity}")
        row.update({o: before.get(k) for o, k in zip(old, key, strict=True)})
        row.update({cfg.op_column: _OPS[ch.action], **_position(cfg, ch, ts_column, lsn_column)})
        rows.append(row)
    return rows


def keyless_rows(
    cfg: TableConfig, changes: list[Change], ts_column: str = "ts_ms", lsn_column: str = "lsn"
) -> list[dict[str, Any]]:
    """The events of ``changes`` for a table without a key (``mode: keyless``, ``REPLICA IDENTITY FULL``).

    An update carries the whole old row (wal2json's identity under REPLICA IDENTITY FULL) in the
    before-image columns and the new row in the data columns; a delete only the old row. Such a
    table's events need ``commit_lsn`` and ``lsn_row`` to be told apart and ordered as delivered
    (the registry's ``wal2json`` preset orders by them).
    """
    data, before = list(cfg.data_columns), list(cfg.before_columns)
    rows: list[dict[str, Any]] = []
    for ch in changes:
        if ch.action in ("U", "D") and not all(c in ch.identity for c in data):
            raise SourceError(
                f"{ch.action} at lsn {ch.lsn} of {ch.table} lacks the old row ({sorted(ch.identity)}): a table "
                "without a key needs REPLICA IDENTITY FULL"
            )
        values = ch.columns if ch.action != "D" else {}
        row: dict[str, Any] = {c: values.get(c) for c in data}
        row.update({b: ch.identity.get(c) for c, b in zip(data, before, strict=True)})
        row.update({cfg.op_column: _OPS[ch.action], **_position(cfg, ch, ts_column, lsn_column)})
        rows.append(row)
    return rows


#: How each source shape turns wal2json changes into landed events.
SHAPES = {"debezium": debezium_rows, "old_key": old_key_rows, "keyless": keyless_rows}


def land_changes(
    cfg: TableConfig, increment: str, changes: list[Change], shape: str = "debezium", **names: str
) -> list[str]:
    """Write ``changes`` as one Parquet file of ``increment`` in the table's landing area."""
    from cdc_compaction.devtools.conformance import land

    return land(cfg, increment, [SHAPES[shape](cfg, changes, **names)])
