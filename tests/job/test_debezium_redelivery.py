"""A killed Kafka Connect worker re-sends Debezium's records under new Kafka offsets: each event counts once.

A worker that dies without a clean shutdown resumes from its last committed source offset, and the
connector publishes again what it had sent since, as new Kafka records with new offsets.  The
records here are written by hand in the shapes a real Debezium 3.6 PostgreSQL connector sent them
(``JsonConverter`` without schemas; recorded from tests/e2e/test_debezium_truth.py's stack):

* ``source.sequence`` is the JSON text ``["<lastCommitLsn>", "<lsn>"]``: the end LSN of the commit the
  connector delivered before this event's transaction (``null`` until the connector has delivered
  one commit since it started with no committed position: the snapshot and the first transaction),
  and the change's own LSN;
* every row of the initial snapshot (op ``r``) carries one LSN, the first transaction's change may
  carry that same LSN too;
* a transaction open across another's commit is delivered after it, with its changes' LSNs below.

The expected tables are written from PostgreSQL's point of view (the rows the statements leave),
never from the project's code.  Real runs of the job on the session's Spark and test metastore.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import compact_once

from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.core.sql import table_names
from cdc_compaction.integrations.engine import SessionEngine
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

TOPIC = "cdc.public.k"
SNAPSHOT_LSN = 26360952


def event(op: str, before: Any, after: Any, lsn: int, last_commit: int | None, snapshot: str = "false") -> str:
    """One Debezium envelope as JsonConverter (schemas.enable=false) writes it."""
    source = {
        "connector": "postgresql",
        "snapshot": snapshot,
        "lsn": lsn,
        "sequence": json.dumps([None if last_commit is None else str(last_commit), str(lsn)]),
        "txId": 700 + (last_commit or 0) % 97,
    }
    return json.dumps({"before": before, "after": after, "source": source, "op": op, "ts_ms": 1})


def row(i: int, name: str) -> dict[str, Any]:
    return {"id": i, "name": name}


def full(i: int, name: str) -> dict[str, Any]:
    """A REPLICA IDENTITY FULL before image is the whole old row."""
    return row(i, name)


def land(cfg: Any, increment: str, first_offset: int, lines: list[str]) -> None:
    """A sink's file: ``<topic>+<partition>+<first offset>.json``, one record per line (consecutive offsets)."""
    target = Path(Lake(cfg).layout.incremental) / increment
    target.mkdir(parents=True, exist_ok=True)
    (target / f"{TOPIC}+0+{first_offset:010d}.json").write_text("\n".join(lines) + "\n")


def runtime(tmp_path: Path, spark: Any, endpoint: MetastoreEndpoint, keyless: bool) -> Runtime:
    name = f"dzr_{'kl' if keyless else 'k'}_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**6}"
    columns = [{"name": "id", "type": "int"}, {"name": "name", "type": "string"}]
    # The source position, which the decoder derives from source.sequence, source.lsn and the op (and,
    # for a snapshot's rows, which share one LSN, the Kafka offset of the file name as their ordinal).
    columns += [
        {"name": "__op", "type": "string"},
        {"name": "__commit_lsn", "type": "bigint"},
        {"name": "__lsn", "type": "bigint"},
    ]
    if keyless:
        columns += [{"name": "_before_id", "type": "int"}, {"name": "_before_name", "type": "string"}]
        columns += [{"name": "__row", "type": "bigint"}]
        fields: dict[str, Any] = {"mode": "keyless"}
    else:
        fields = {"primary_key": ["id"]}
        columns += [{"name": "__deleted", "type": "string"}]
    doc = {
        "database": "tests",
        "table": name,
        **fields,
        "source": "debezium",
        "format": "json",
        "envelope": "debezium",
        "columns": columns,
        "storage_root": str(tmp_path / "lake" / name),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "retries": 1,
    }
    cfg = parse_table(doc)
    # The preset's order: the commit position, then the change's LSN (and a snapshot row's ordinal).
    assert cfg.order_by + getattr(cfg, "event_id", []) == ["__commit_lsn", "__lsn", *(["__row"] if keyless else [])]
    rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=SessionEngine(spark))
    ensure_tables(rt)
    return rt


def rows(spark: Any, rt: Runtime) -> Counter[tuple[Any, ...]]:
    name = f"`{rt.cfg.database}`.`{table_names(rt.cfg)['base_table']}`"
    spark.catalog.refreshTable(name)
    return Counter(tuple(r) for r in spark.sql(f"SELECT id, name FROM {name}").collect())


S = SNAPSHOT_LSN
#: Delivered before the kill: the snapshot (two equal rows), the first transaction (at the snapshot's
#: LSN, no commit delivered before it), two inserts of one row, a transaction that began first and
#: committed later (its first change's LSN lies below the previous one's), an update of one copy.
BEFORE_KILL = [
    event("r", None, row(1, "a"), S, None, "first"),
    event("r", None, row(1, "a"), S, None, "true"),
    event("r", None, row(2, "b"), S, None, "last"),
    event("c", None, row(5, "first"), S, None),
    event("c", None, row(10, "x"), S + 288, S + 120),
    event("c", None, row(10, "x"), S + 352, S + 120),
    event("c", None, row(100, "early"), S + 216, S + 816),
    event("c", None, row(101, "late"), S + 816, S + 816),
    event("u", full(1, "a"), row(1, "y"), S + 960, S + 960),
]
#: After the restart: everything since the first insert of (10, x) again, then what is new.
AFTER_RESTART = [
    *BEFORE_KILL[4:],
    event("c", None, row(99, "after"), S + 1184, S + 1184),
    event("d", full(10, "x"), None, S + 1248, S + 1184),
]
#: PostgreSQL's table after the statements above (each applied once).
AFTER_FIRST = Counter([(1, "a"), (1, "y"), (2, "b"), (5, "first"), (10, "x"), (10, "x"), (100, "early"), (101, "late")])
AFTER_SECOND = AFTER_FIRST - Counter([(10, "x")]) + Counter([(99, "after")])


def test_redelivered_records_count_once_in_a_keyless_table(
    tmp_path: Path, spark: Any, endpoint: MetastoreEndpoint
) -> None:
    rt = runtime(tmp_path, spark, endpoint, keyless=True)
    land(rt.cfg, "increment_2026010110", 0, BEFORE_KILL)
    assert compact_once(rt, "r1")
    assert rows(spark, rt) == AFTER_FIRST
    # The re-sent records (new offsets from 20 on) land in the next hour, after a compaction; in the
    # same increment too (a second re-delivery, before the next compaction).
    land(rt.cfg, "increment_2026010111", 20, AFTER_RESTART)
    land(rt.cfg, "increment_2026010111", 40, AFTER_RESTART)
    assert compact_once(rt, "r2")
    assert rows(spark, rt) == AFTER_SECOND, rt.cfg.order_by


def test_redelivered_records_count_once_in_a_keyed_table(
    tmp_path: Path, spark: Any, endpoint: MetastoreEndpoint
) -> None:
    # A keyed table absorbed re-sent events before the source position too (same key, same __lsn): this
    # checks that the new order, [__commit_lsn, __lsn], does as well, a snapshot row first.
    rt = runtime(tmp_path, spark, endpoint, keyless=False)
    keyed = [
        event("r", None, row(1, "a"), S, None, "first"),
        event("r", None, row(2, "b"), S, None, "last"),
        event("c", None, row(5, "first"), S, None),
        event("c", None, row(100, "early"), S + 216, S + 816),
        event("u", row(1, "a"), row(1, "y"), S + 960, S + 960),
    ]
    land(rt.cfg, "increment_2026010110", 0, keyed)
    assert compact_once(rt, "r1")
    again = [*keyed[3:], event("d", row(2, "b"), None, S + 1248, S + 1184)]
    land(rt.cfg, "increment_2026010111", 20, again)
    land(rt.cfg, "increment_2026010111", 40, again)
    assert compact_once(rt, "r2")
    assert rows(spark, rt) == Counter([(1, "y"), (5, "first"), (100, "early")])
