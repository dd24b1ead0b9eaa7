"""PostgreSQL is the oracle, through the real Debezium: its tables, not the project's code, say what the lake holds.

One :class:`~cdc_compaction.devtools.debezium.DebeziumStack` (PostgreSQL with ``pgoutput``, KRaft
Kafka, a distributed Connect worker with Debezium's PostgreSQL connector, ``JsonConverter`` with
``schemas.enable=true``) carries two tables' changes:

* ``students``: keyed, with a large text column ``bio`` stored out of line (``STORAGE EXTERNAL``: a
  TOAST value), which the workload's updates leave alone, so Debezium sends
  ``__debezium_unavailable_value`` for it (registry ``unchanged``); the workload changes keys too;
* ``students_keyless``: no key, ``REPLICA IDENTITY FULL``, exact duplicate rows (``mode: keyless``).

Their one topic each is landed by three consumer groups of our landing consumer, as JSON, Avro and
Parquet, into three lakes (``format`` json|avro|parquet, ``envelope: debezium``).  A second connector
on the same tables writes with Apicurio's ``AvroConverter`` in the Confluent wire format, its schemas
in the stack's schema registry (Apicurio Registry); a fourth group decodes those records with the
registry's writer schemas and lands them as Avro files of those schemas (``avro-registry``, a fourth
lake: eight registry entries).  Hour by hour (two hours, the snapshot landing with the first) the seeded workload
(tests/e2e/truth_workload.py, shared with the wal2json test) runs; the rows that existed before the
connector came arrive as its initial snapshot; a transaction inserts before a compaction and commits
after it; the Connect worker is restarted cleanly at the start of an hour (its offsets are committed
then), and killed (SIGKILL) and restarted in the middle of that hour's changes: offsets are committed
only every ``OFFSET_FLUSH_MS`` otherwise, so the restarted worker sends again, under new Kafka
offsets, every change since the clean restart (the test checks that it did, and prints how many);
``ALTER TABLE students ADD COLUMN nickname`` lands and follows ``schema_changes: evolve``.
After every hour each lake is compacted in process (the DAG's task functions in order) and its base
table, through Spark and DuckDB, and its views must equal ``SELECT *`` of the PostgreSQL table, as
multisets.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.schema import effective_config
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.core.storage import LocalStorage
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools import jars
from cdc_compaction.devtools.debezium import DebeziumStack, topic_of
from cdc_compaction.devtools.kafka_landing import LandingConsumer, Route
from cdc_compaction.devtools.local_services import LocalMetastore

from .truth_workload import (
    DATA_TYPES,
    DEBEZIUM_DDL,
    DEBEZIUM_FORMATS,
    DEBEZIUM_TABLES,
    KEYED,
    KEYED_REKEY_SET,
    KEYED_TYPES,
    KEYLESS,
    KINDS,
    REGISTRY_FORMAT,
    Workload,
    data_only,
    debezium_registry_doc,
    debezium_topic_prefix,
    landing_group,
    registry_format,
    snapshot,
)

pytest.importorskip("confluent_kafka", reason="confluent-kafka is pinned in requirements.txt (make install)")

#: Minutes of a whole stack and three formats: make test-extended (.ci/run runs it after make test); make test
#: has the stack's own test (tests/integrations/test_debezium_stack.py) and the wal2json truth.
pytestmark = [
    pytest.mark.extended,
    pytest.mark.debezium,
    pytest.mark.spark,
    pytest.mark.metastore,
    pytest.mark.skipif(
        not jars.is_current(jars.jars_dir()), reason="the jars of jars.lock are not cached: run `make jars`"
    ),
]

SEED = 20261128
FORMATS = DEBEZIUM_FORMATS
#: The workload runs in hours 1..HOURS; the connector's initial snapshot lands with hour 1 (first in
#: each topic). Every hour ends with a compaction of each lake.
HOURS = 2
TRANSACTIONS = 20
#: The long transaction inserts at the start of LONG_OPENS (before that hour's compaction) and commits
#: at the start of LONG_COMMITS; Connect restarts and the column is added in RESTART_AT / ALTER_AT.
LONG_OPENS, LONG_COMMITS = 1, 2
RESTART_AT = ALTER_AT = 2
#: The worker's offset.flush.interval.ms: longer than the test, so only the clean stop commits offsets and the
#: kill loses every offset since: the changes in between are all re-sent (at least once, as a crash does).
OFFSET_FLUSH_MS = 600_000
#: The row each hour ends with in each table: when the landing has it, it has the hour's changes.
MARK_IDS = 2000
PLACEHOLDER = "__debezium_unavailable_value"
WAIT_S = 120.0
INITIAL = {
    KEYED: [(i, f"initial-{i}", i % 13 or None) for i in range(1, 19)],
    KEYLESS: [(i % 12 + 1, f"initial-{i % 12 + 1}", None if i % 5 == 0 else 7) for i in range(18)],
}
LONG_ROWS = {
    KEYED: [(1001, "long-1", 1), (1002, "long-2", None), (1003, None, 3)],
    KEYLESS: [(1001, "long-1", 1), (1001, "long-1", 1), (1002, None, None)],
}


def images(path: Path) -> list[dict[str, Any]]:
    """The data change events of a landed file (to know what has landed, and what Debezium sent)."""
    if path.suffix == ".json":
        docs = [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        values = [d["payload"] if isinstance(d, dict) and set(d) == {"schema", "payload"} else d for d in docs]
    elif path.suffix == ".avro":
        from fastavro import reader

        with open(path, "rb") as f:
            values = list(reader(f))
    else:
        import pyarrow.parquet as pq

        values = pq.read_table(path).to_pylist()
    return [v for v in values if isinstance(v, dict) and v.get("op") in ("c", "u", "d", "r")]


def row_id(event: dict[str, Any]) -> Any:
    image = event["before"] if event["op"] == "d" else event["after"]
    return (image or {}).get("id")


def wait_until_sent(bootstrap_servers: str, topics: list[str], since: dict[str, int] | None = None) -> dict[str, int]:
    """The end offset of each topic's one partition, once every topic has grown past ``since`` and stopped growing.

    Without ``since``: the end offsets now.  With it: what the connector sent meanwhile is in Kafka, so a
    worker killed now has sent it (and has not committed its source offsets, which is the test's point).
    """
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "truth-probe"})
    try:
        deadline = time.monotonic() + WAIT_S
        last: dict[str, int] = {}
        while True:
            ends = {t: probe.get_watermark_offsets(TopicPartition(t, 0), timeout=10)[1] for t in topics}
            if since is None:
                return ends
            if ends == last and all(ends[t] > since[t] for t in topics):
                return ends
            assert time.monotonic() < deadline, f"the connector sent nothing new to {topics} in {WAIT_S:.0f}s"
            last = ends
            time.sleep(1.0)
    finally:
        probe.close()


def land_until_marked(consumer: LandingConsumer, topics: list[str], mark: int) -> list[dict[str, Any]]:
    """Land until every topic has delivered its mark row; the events landed, with their topic."""
    landed: list[dict[str, Any]] = []
    waiting = set(topics)
    deadline = time.monotonic() + WAIT_S
    while waiting:
        assert time.monotonic() < deadline, f"{consumer.group_id}: no mark {mark} from {waiting} in {WAIT_S:.0f}s"
        for path in consumer.land(idle_s=0.5):
            topic = path.name.rsplit("+", 2)[0]
            for event in images(path):
                landed.append({**event, "_topic": topic})
                if event["op"] != "d" and row_id(event) == mark:
                    waiting.discard(topic)
    return landed


@pytest.fixture
def stack(tmp_path: Path) -> Any:
    with DebeziumStack(
        tmp_path / "stack", schemas_enable=True, offset_flush_interval_ms=OFFSET_FLUSH_MS, schema_registry=True
    ) as s:
        yield s


def test_every_format_matches_postgres_after_every_hour(
    stack: DebeziumStack, spark: Any, endpoint: MetastoreEndpoint, metastore: LocalMetastore, tmp_path: Path
) -> None:
    started = time.monotonic()
    timings: Counter[str] = Counter()
    conn = stack.pg.connect(stack.database)
    long_conn = stack.pg.connect(stack.database)
    try:
        with conn.cursor() as cur:
            for statement in DEBEZIUM_DDL:
                cur.execute(statement)
            for table, rows in INITIAL.items():
                cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s)", rows)
        conn.commit()
        # The connector starts now: the rows above are its initial snapshot.
        stack.register(DEBEZIUM_TABLES)
        stack.register(
            DEBEZIUM_TABLES,
            name="cdc-postgres-registry",
            topic_prefix=debezium_topic_prefix(REGISTRY_FORMAT),
            slot="cdc_registry",
            avro_registry=True,
        )
        topics_of = {
            fmt: {t: topic_of(f"public.{t}", debezium_topic_prefix(fmt)) for t in (KEYED, KEYLESS)} for fmt in FORMATS
        }
        topics = topics_of["json"]
        every_topic = sorted({t for by_table in topics_of.values() for t in by_table.values()})

        registry = tmp_path / "registry"
        registry.mkdir()
        cfgs: dict[tuple[str, str], TableConfig] = {}
        runner = conf.InProcessRunner(spark, endpoint)
        for fmt in FORMATS:
            for table in (KEYED, KEYLESS):
                cfg = parse_table(debezium_registry_doc(fmt, table, tmp_path / f"lake_{fmt}"))
                cfgs[(fmt, table)] = cfg
                runner.setup(cfg)
        assert stack.registry is not None
        consumers = {
            fmt: LandingConsumer(
                stack.bootstrap_servers,
                [
                    Route.for_table(
                        cfgs[(fmt, t)],
                        topics_of[fmt][t],
                        registry_format(fmt),  # type: ignore[arg-type]
                        wire="confluent" if fmt == REGISTRY_FORMAT else "json",
                    )
                    for t in (KEYED, KEYLESS)
                ],
                group_id=landing_group(fmt),
                schema_registry=stack.registry.ccompat_url,
                rejects_dir=tmp_path / "rejects" / fmt,
            )
            for fmt in FORMATS
        }
        readers: list[Any] = [conf.Reader(spark), conf.DuckDBReader()]
        keyed = Workload(conn, random.Random(SEED), table=KEYED, rekey_set=KEYED_REKEY_SET)
        keyless = Workload(conn, random.Random(SEED + 1), duplicates=True, table=KEYLESS)
        timings["setup"] = time.monotonic() - started

        failures: list[str] = []
        landed: dict[str, list[dict[str, Any]]] = {fmt: [] for fmt in FORMATS}
        compacted_lsn = 0
        restarts = 0
        sent: dict[str, int] = {}
        for hour in range(1, HOURS + 1):
            t0 = time.monotonic()
            if hour == LONG_OPENS:
                with long_conn.cursor() as cur:
                    for table, rows in LONG_ROWS.items():
                        cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s)", rows)
            if hour == LONG_COMMITS:
                long_conn.commit()
            if hour == ALTER_AT:
                with conn.cursor() as cur:
                    cur.execute(f"ALTER TABLE {KEYED} ADD COLUMN nickname text")
                conn.commit()
            for i, part in enumerate((TRANSACTIONS // 2, TRANSACTIONS - TRANSACTIONS // 2)):
                if hour == RESTART_AT:
                    # First a clean stop (it commits the offsets: the snapshot and hour 1 are done), then,
                    # once the first half of the hour's changes is in Kafka, a crash: that half comes again.
                    if i == 1:
                        wait_until_sent(stack.bootstrap_servers, every_topic, sent)
                    stack.restart_connect(kill=i == 1)
                    restarts += 1
                    sent = wait_until_sent(stack.bootstrap_servers, every_topic)
                keyed.hour(part)
                keyless.hour(part)
            if hour >= ALTER_AT:
                with conn.cursor() as cur:
                    cur.execute(f"UPDATE {KEYED} SET nickname = 'nick-' || id WHERE id %% 3 = %s", (hour % 3,))
                conn.commit()
            mark = MARK_IDS + hour
            with conn.cursor() as cur:
                for table in (KEYED, KEYLESS):
                    cur.execute(f"INSERT INTO {table} VALUES (%s, 'mark', %s)", (mark, hour))
            conn.commit()
            keyed_columns = [*KEYED_TYPES, *(["nickname"] if hour >= ALTER_AT else [])]
            expected = {KEYED: snapshot(conn, KEYED, keyed_columns), KEYLESS: snapshot(conn, KEYLESS)}
            types = {
                KEYED: {**KEYED_TYPES, **({"nickname": "string"} if hour >= ALTER_AT else {})},
                KEYLESS: DATA_TYPES,
            }
            timings["workload"] += time.monotonic() - t0

            for fmt in FORMATS:
                t0 = time.monotonic()
                landed[fmt] += land_until_marked(consumers[fmt], list(topics_of[fmt].values()), mark)
                timings[f"land {fmt}"] += time.monotonic() - t0
                t0 = time.monotonic()
                for table in (KEYED, KEYLESS):
                    cfg = cfgs[(fmt, table)]
                    runner.compact(cfg)
                    # The columns the lake has now (the registry's, and what evolve added): only to read them.
                    shown = effective_config(cfg, LocalStorage())
                    for reader in readers:
                        for what, rows in (("base", reader.visible_base(shown)), ("view", reader.view(shown))):
                            diff = conf.diff_rows(expected[table], data_only(rows, types[table]), types[table])
                            if diff:
                                failures.append(
                                    f"hour {hour}, {fmt}, {table}: {reader.name} {what} differs from PostgreSQL\n"
                                    + "\n".join(diff[:20])
                                )
                timings[f"compact+check {fmt}"] += time.monotonic() - t0
            # Stop at the first hour that differs: the later hours would only repeat it, slowly.
            assert not failures, "\n".join(failures)
            if hour == LONG_OPENS:
                compacted_lsn = max(e["source"]["lsn"] for e in landed["json"])
        assert not failures, "\n".join(failures)

        # What the test meant to exercise happened, as Debezium's own records show (the JSON landing's).
        events = landed["json"]
        snapshot_reads = [e for e in events if e["op"] == "r"]
        assert len(snapshot_reads) == sum(len(r) for r in INITIAL.values())
        assert all(e["source"]["snapshot"] != "false" for e in snapshot_reads)
        late = [e for e in events if e["op"] == "c" and 1000 < row_id(e) < MARK_IDS]
        # Each change once by its position: the killed worker may have sent the long transaction again.
        late_changes = {(e["_topic"], e["source"]["lsn"]) for e in late}
        assert len(late_changes) == sum(len(r) for r in LONG_ROWS.values()), late
        assert all(e["source"]["lsn"] < compacted_lsn for e in late), "the long transaction's LSNs lie below"
        toast = [
            e for e in events if e["_topic"] == topics[KEYED] and e["op"] == "u" and e["after"]["bio"] == PLACEHOLDER
        ]
        assert len(toast) >= 10, "updates that left bio alone carried the placeholder"
        assert any("nickname" in (e["after"] or {}) for e in events), "the added column was delivered"
        rekeys = Counter(e["source"]["txId"] for e in events if e["op"] == "d") & Counter(
            e["source"]["txId"] for e in events if e["op"] == "c"
        )
        assert rekeys, "a key change: a delete and a create in one transaction"
        positions = Counter((e["_topic"], e["source"]["lsn"], e["op"], row_id(e)) for e in events if e["op"] != "r")
        redelivered = sum(n - 1 for n in positions.values())
        assert redelivered >= 10, "the killed worker sent the changes since its last offset commit again"
        assert restarts == 2 and keyed.rolled_back >= 2 and keyed.committed >= 30
        assert set(keyed.kinds) >= KINDS and keyless.kinds["duplicate"] >= 1, (keyed.kinds, keyless.kinds)
        assert len(expected[KEYLESS]) > len({r["id"] for r in expected[KEYLESS]}), "equal rows"
        # The registry variant decoded every record of the converter: nothing was kept aside.
        assert {fmt: dict(c.rejected) for fmt, c in consumers.items()} == {fmt: {} for fmt in FORMATS}
        registry_events = landed[REGISTRY_FORMAT]
        assert sum(e["op"] == "r" for e in registry_events) == len(snapshot_reads)
    finally:
        with contextlib.suppress(Exception):
            long_conn.rollback()
        long_conn.close()
        conn.close()
        for c in locals().get("consumers", {}).values():
            c.close()
    timings["total"] = time.monotonic() - started
    print(f"events landed per format: {len(events)}; re-delivered by the killed Connect worker: {redelivered}")
    print("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
