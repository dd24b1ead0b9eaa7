"""The real Debezium source: PostgreSQL -> Debezium 3.6.1 in Kafka Connect -> Kafka 4.4 (KRaft) -> hourly JSON files.

One stack per module (PostgreSQL, Kafka, a distributed Connect worker with the Debezium PostgreSQL
connector, ``JsonConverter`` with ``schemas.enable=false``) and our landing consumer.  The
expectations are Debezium's documented envelope and the landing layout the docs describe
(docs/debezium.md), written here from those, not from the consumer's code.  The tests run in file
order (one module, one worker): snapshot and changes, a Connect restart, a consumer restart, Avro
from the JsonConverter's schemas, Avro in the Confluent wire format through the stack's schema
registry (Apicurio Registry 3.3.3, which starts beside Kafka and Connect) compacted by the job, and
``registry discover`` from its subjects, stop.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cdc_compaction.devtools import jars
from cdc_compaction.devtools.debezium import DebeziumStack, topic_of
from cdc_compaction.devtools.local_services import pid_alive

pytest.importorskip("confluent_kafka", reason="confluent-kafka is pinned in requirements.txt (make install)")

from cdc_compaction.devtools.kafka_landing import LandingConsumer, Route

pytestmark = [
    pytest.mark.debezium,
    pytest.mark.slow,
    pytest.mark.skipif(
        not jars.is_current(jars.jars_dir()), reason="the jars of jars.lock are not cached: run `make jars`"
    ),
]

TABLE = "public.accounts"
TOPIC = topic_of(TABLE)
#: <landing dir>/increment_<YYYYMMDDHH>/<topic>+<partition>+<first offset, 10 digits>.json
FILE = re.compile(r"^increment_(\d{10})/" + re.escape(TOPIC) + r"\+(\d+)\+(\d{10})\.json$")
WAIT_S = 120.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DebeziumStack]:
    started = time.monotonic()
    # With the schema registry: its JVM comes up while Kafka and Connect start (the registry's test below).
    s = DebeziumStack(tmp_path_factory.mktemp("debezium"), schema_registry=True)
    s.start()
    try:
        with s.pg.connect(s.database) as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance int)")
            # Whole before-images in updates and deletes (the default identity sends the key only).
            cur.execute("ALTER TABLE accounts REPLICA IDENTITY FULL")
            cur.execute("INSERT INTO accounts VALUES (1, 'ada', 100), (2, 'grace', 200), (3, 'alan', 300)")
        s.register([TABLE])
        print(f"stack up and connector RUNNING in {time.monotonic() - started:.1f}s")
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lake") / "incremental"


@pytest.fixture(scope="module")
def consumer(stack: DebeziumStack, landing: Path) -> Iterator[LandingConsumer]:
    c = LandingConsumer(stack.bootstrap_servers, [Route(TOPIC, landing)])
    yield c
    c.close()


def sql(stack: DebeziumStack, *statements: str) -> None:
    """Each statement in a transaction of its own."""
    for statement in statements:
        with stack.pg.connect(stack.database) as conn, conn.cursor() as cur:
            cur.execute(statement)


def landed(landing: Path) -> list[tuple[int, int, Any, Path]]:
    """(partition, offset, value, file) of every landed line, read from the files, in offset order."""
    out = []
    for path in sorted(landing.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(landing).as_posix()
        m = FILE.match(rel)
        assert m, f"{rel} is not in the hourly layout increment_<YYYYMMDDHH>/<topic>+<partition>+<offset>.json"
        first = int(m.group(3))
        for i, line in enumerate(path.read_bytes().splitlines()):
            out.append((int(m.group(2)), first + i, json.loads(line), path))
    return sorted(out, key=lambda r: (r[0], r[1]))


def events(rows: list[tuple[int, int, Any, Path]]) -> list[Any]:
    return [r[2] for r in rows]


def land_until(
    consumer: LandingConsumer, landing: Path, done: Callable[[list[Any]], bool]
) -> list[tuple[int, int, Any, Path]]:
    """Land rounds until ``done(events)`` holds, for at most WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        consumer.land(idle_s=0.5)
        rows = landed(landing)
        if done(events(rows)):
            return rows
        assert time.monotonic() < deadline, f"not landed within {WAIT_S:.0f}s; landed: {events(rows)}"


def op_of(events_: list[Any], op: str, key: int) -> list[dict[str, Any]]:
    """The events of ``op`` for row ``key`` (its after-image's id, or for a delete its before-image's)."""
    image = "before" if op == "d" else "after"
    return [e for e in events_ if e is not None and e["op"] == op and e[image]["id"] == key]


def assert_offsets_contiguous(rows: list[tuple[int, int, Any, Path]]) -> None:
    """Every offset of the partition from 0 on is landed exactly once: nothing lost, nothing doubled."""
    offsets = [o for p, o, _, _ in rows if p == 0]
    assert offsets == list(range(len(offsets))), offsets


def test_snapshot_and_changes_land_as_raw_envelopes_hour_by_hour(
    stack: DebeziumStack, consumer: LandingConsumer, landing: Path
) -> None:
    before_changes = datetime.now(UTC)
    sql(
        stack,
        "UPDATE accounts SET balance = 150 WHERE id = 1",
        "DELETE FROM accounts WHERE id = 2",
        "UPDATE accounts SET id = 30 WHERE id = 3",  # a primary-key change
        "INSERT INTO accounts VALUES (4, 'edsger', 400)",
    )
    rows = land_until(consumer, landing, lambda ev: bool(op_of(ev, "c", 4)))
    ev = events(rows)
    assert_offsets_contiguous(rows)

    # The connector's own snapshot: one read per row that existed when it started, marked as a snapshot.
    reads = [e for e in ev if e is not None and e["op"] == "r"]
    assert sorted(e["after"]["id"] for e in reads) == [1, 2, 3]
    assert all(e["before"] is None and e["source"]["snapshot"] not in (None, "false") for e in reads)
    assert reads[-1]["source"]["snapshot"] in ("last", "last_in_data_collection")
    assert ev.index(reads[-1]) < min(ev.index(e) for e in ev if e is not None and e["op"] != "r")

    changes = [e for e in ev if e is not None and e["op"] != "r"]
    for e in changes:
        assert set(e) >= {"before", "after", "source", "op", "ts_ms"}
        src = e["source"]
        assert src["snapshot"] == "false" and src["connector"] == "postgresql" and src["version"] == "3.6.1.Final"
        assert (src["db"], src["schema"], src["table"]) == (stack.database, "public", "accounts")
        assert isinstance(src["lsn"], int) and isinstance(src["txId"], int) and isinstance(e["ts_ms"], int)
    # Each statement was its own transaction, committed in this order: LSNs and transaction ids grow.
    assert [e["source"]["lsn"] for e in changes] == sorted(e["source"]["lsn"] for e in changes)

    (update,) = op_of(ev, "u", 1)
    assert update["before"] == {"id": 1, "owner": "ada", "balance": 100}
    assert update["after"] == {"id": 1, "owner": "ada", "balance": 150}

    (delete,) = op_of(ev, "d", 2)
    assert delete["before"] == {"id": 2, "owner": "grace", "balance": 200} and delete["after"] is None
    assert ev[ev.index(delete) + 1] is None, "a delete is followed by its tombstone, landed as the line null"

    # The key change: a delete of the old key (with its tombstone), then a create of the new one, one transaction.
    (old,) = op_of(ev, "d", 3)
    (new,) = op_of(ev, "c", 30)
    assert ev[ev.index(old) + 1] is None and ev.index(new) == ev.index(old) + 2
    assert new["after"] == {"id": 30, "owner": "alan", "balance": 300}
    assert old["source"]["txId"] == new["source"]["txId"]

    (insert,) = op_of(ev, "c", 4)
    assert insert["before"] is None and insert["after"] == {"id": 4, "owner": "edsger", "balance": 400}
    assert len(ev) == 3 + 1 + 2 + 3 + 1  # r r r, u, d + tombstone, d + tombstone + c, c

    # The hourly layout: the hour of a file is its records' Kafka time, the hour they were produced.
    hours = {datetime.strptime(FILE.match(p.relative_to(landing).as_posix()).group(1), "%Y%m%d%H") for *_, p in rows}
    now = datetime.now(UTC).replace(tzinfo=None)
    assert all(before_changes.replace(tzinfo=None, minute=0, second=0, microsecond=0) <= h <= now for h in hours)
    assert not [p for p in landing.rglob(".*")], "no temporary file is left once a round has landed"


def test_a_connect_restart_resumes_from_its_offsets_and_loses_nothing(
    stack: DebeziumStack, consumer: LandingConsumer, landing: Path
) -> None:
    first = events(landed(landing))
    connect_pid = stack.connect.pid
    assert connect_pid is not None
    stack.connect.stop()
    assert not pid_alive(connect_pid)
    # Changes made while Connect is down are in the slot; the restarted connector sends them.
    sql(stack, "INSERT INTO accounts VALUES (5, 'barbara', 500)", "UPDATE accounts SET balance = 450 WHERE id = 4")
    started = time.monotonic()
    stack.restart_connect()
    print(f"Connect restarted and RUNNING in {time.monotonic() - started:.1f}s")
    assert stack.connect.pid != connect_pid
    sql(stack, "INSERT INTO accounts VALUES (6, 'donald', 600)")
    rows = land_until(consumer, landing, lambda ev: bool(op_of(ev, "c", 6)))
    ev = events(rows)
    assert_offsets_contiguous(rows)
    assert ev[: len(first)] == first, "what was landed stays as it was"
    assert len(op_of(ev, "c", 5)) >= 1 and len(op_of(ev, "u", 4)) >= 1, "no change made while Connect was down is lost"
    # At least once: a re-delivered event is the same event again (same LSN), never a different one; no new snapshot.
    assert not [e for e in ev[len(first) :] if e is not None and e["op"] == "r"]
    later = [e for e in ev[len(first) :] if e is not None]
    assert {(e["op"], e["after"]["id"]) for e in later} >= {("c", 5), ("u", 4), ("c", 6)}


def test_a_new_consumer_resumes_after_the_committed_offsets(
    stack: DebeziumStack, consumer: LandingConsumer, landing: Path
) -> None:
    consumer.land(idle_s=0.5)  # land whatever is still there, and commit it
    files_before = sorted(landing.rglob("*.json"))
    consumer.close()
    sql(stack, "DELETE FROM accounts WHERE id = 1")
    with LandingConsumer(stack.bootstrap_servers, [Route(TOPIC, landing)]) as again:
        rows = land_until(again, landing, lambda ev: bool(op_of(ev, "d", 1)))
    new_files = sorted(set(landing.rglob("*.json")) - set(files_before))
    # The new consumer landed only what came after the committed offsets: the delete and its tombstone.
    assert [json.loads(line) is None for f in new_files for line in f.read_bytes().splitlines()] == [False, True]
    assert_offsets_contiguous(rows)


#: A landing consumer that dies (SIGKILL) after its files are renamed and before its offsets are committed.
_CRASHING_CONSUMER = """
import os, signal, sys
from pathlib import Path
from cdc_compaction.devtools.kafka_landing import LandingConsumer, Route

def die(paths):
    if paths:
        os.kill(os.getpid(), signal.SIGKILL)

consumer = LandingConsumer(sys.argv[1], [Route(sys.argv[2], Path(sys.argv[3]))], sys.argv[4])
while True:
    consumer.land(idle_s=0.5, after_rename=die)
"""


def test_a_consumer_killed_before_its_commit_lands_the_same_records_again(stack: DebeziumStack, tmp_path: Path) -> None:
    import subprocess
    import sys

    landing = tmp_path / "incremental"
    args = [stack.bootstrap_servers, TOPIC, str(landing), "cdc-landing-crash"]
    crashed = subprocess.run(
        [sys.executable, "-c", _CRASHING_CONSUMER, *args], timeout=WAIT_S, capture_output=True, text=True
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    before_crash = {p.relative_to(landing): p.read_bytes() for p in landing.rglob("*.json")}
    assert before_crash, "the killed consumer had renamed its files"
    # The killed consumer committed nothing: a new one in its group lands the same records again,
    # into files of the same names (the first offset names them), and nothing is lost.
    # The group gives the dead member's partition to the new one after its session timeout (10 s).
    relanded: set[Path] = set()
    deadline = time.monotonic() + WAIT_S
    with LandingConsumer(stack.bootstrap_servers, [Route(TOPIC, landing)], "cdc-landing-crash") as again:
        while not relanded >= set(before_crash):
            assert time.monotonic() < deadline, f"not landed again within {WAIT_S:.0f}s: {relanded}"
            relanded |= {p.relative_to(landing) for p in again.land(idle_s=1.0)}
    after = {p.relative_to(landing): p.read_bytes() for p in landing.rglob("*.json")}
    assert all(after[name].startswith(content) for name, content in before_crash.items())
    assert_offsets_contiguous(landed(landing))
    assert not [p for p in landing.rglob(".*")]


def avro_landed(landing: Path, topic: str) -> list[tuple[int, dict[str, Any], list[dict[str, Any]]]]:
    """(first offset, the file's Avro schema, its records) of every landed Avro file, in offset order."""
    from fastavro import reader

    pattern = re.compile(r"^increment_(\d{10})/" + re.escape(topic) + r"\+0\+(\d{10})\.avro$")
    out = []
    for path in sorted(p for p in landing.rglob("*") if p.is_file()):
        m = pattern.match(path.relative_to(landing).as_posix())
        assert m, f"{path} is not in the hourly layout increment_<YYYYMMDDHH>/<topic>+0+<offset>.avro"
        with open(path, "rb") as f:
            avro = reader(f)
            out.append((int(m.group(2)), avro.writer_schema, list(avro)))
    return sorted(out, key=lambda r: r[0])


def test_a_connector_with_schemas_lands_avro_and_parquet_files_a_new_schema_a_new_file(
    stack: DebeziumStack, tmp_path: Path
) -> None:
    from decimal import Decimal

    pytest.importorskip("fastavro", reason="fastavro is pinned in requirements.txt (make install)")
    with stack.pg.connect(stack.database) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, owner, balance FROM accounts ORDER BY id")
        rows_now = [dict(zip(("id", "owner", "balance"), r, strict=True)) for r in cur.fetchall()]
    topic = topic_of(TABLE, "cdcavro")
    stack.register([TABLE], name="cdc-postgres-avro", topic_prefix="cdcavro", slot="cdc_avro", schemas_enable=True)
    sql(
        stack,
        "ALTER TABLE accounts ADD COLUMN price numeric(10, 2)",
        "UPDATE accounts SET price = 12.34 WHERE id = 4",
        "DELETE FROM accounts WHERE id = 5",
    )
    landing = tmp_path / "incremental"
    deadline = time.monotonic() + WAIT_S
    with LandingConsumer(stack.bootstrap_servers, [Route(topic, landing, format="avro")], "cdc-landing-avro") as c:
        while True:
            c.land(idle_s=0.5)
            files = avro_landed(landing, topic)
            records = [r for _, _, recs in files for r in recs]
            if any(r["op"] == "d" for r in records):
                break
            assert time.monotonic() < deadline, f"not landed within {WAIT_S:.0f}s: {records}"
        # Every offset, the skipped tombstone's too, was committed: the group has nothing left to land.
        assert c.land(idle_s=2.0) == []

    # The snapshot: the table as it was when the connector started, one read per row.
    reads = [r for r in records if r["op"] == "r"]
    assert sorted((r["after"] for r in reads), key=lambda a: a["id"]) == rows_now
    assert all(r["source"]["snapshot"] != "false" for r in reads)
    # The column added at the source: a new schema, so a new file; Connect's Decimal is Avro's decimal.
    (update,) = [r for r in records if r["op"] == "u"]
    assert update["after"]["id"] == 4 and update["after"]["price"] == Decimal("12.34")
    (delete,) = [r for r in records if r["op"] == "d"]
    assert delete["before"]["id"] == 5 and delete["after"] is None
    assert len(records) == len(reads) + 2, "the tombstone after the delete is not an Avro record"
    first_schema, last_schema = files[0][1], files[-1][1]
    assert len(files) >= 2 and first_schema != last_schema
    assert first_schema["name"] == "cdcavro.public.accounts.Envelope"

    def value_fields(schema: dict[str, Any]) -> dict[str, Any]:
        before = next(f for f in schema["fields"] if f["name"] == "before")
        return {f["name"]: f["type"] for f in before["type"][1]["fields"]}

    assert "price" not in value_fields(first_schema)
    price = value_fields(last_schema)["price"]
    assert price[0] == "null" and price[1]["logicalType"] == "decimal"
    assert (price[1]["precision"], price[1]["scale"]) == (10, 2)
    assert all(isinstance(r["source"]["lsn"], int) and isinstance(r["ts_ms"], int) for r in records)

    # The same topic as Parquet (another consumer group): the same records, columns as parquet-avro writes them.
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet_landing = tmp_path / "parquet" / "incremental"
    deadline = time.monotonic() + WAIT_S
    pattern = re.compile(r"^increment_\d{10}/" + re.escape(topic) + r"\+0\+(\d{10})\.parquet$")
    route = Route(topic, parquet_landing, format="parquet")
    with LandingConsumer(stack.bootstrap_servers, [route], "cdc-landing-parquet") as c:
        while True:
            c.land(idle_s=0.5)
            paths = sorted(
                (p for p in parquet_landing.rglob("*") if p.is_file()),
                key=lambda p: int(pattern.match(p.relative_to(parquet_landing).as_posix()).group(1)),
            )
            tables = [pq.read_table(p) for p in paths]
            if sum(t.num_rows for t in tables) >= len(records):
                break
            assert time.monotonic() < deadline, f"not landed as Parquet within {WAIT_S:.0f}s"
    assert [r for t in tables for r in t.to_pylist()] == records
    assert len(tables) == len(files) and b"parquet.avro.schema" in tables[0].schema.metadata
    after = tables[-1].schema.field("after").type
    assert after.field("price").type == pa.decimal128(10, 2) and after.field("balance").type == pa.int32()


def _ccompat(stack: DebeziumStack, path: str) -> Any:
    """A GET of the registry's Confluent-compatible API."""
    import urllib.request

    assert stack.registry is not None
    with urllib.request.urlopen(stack.registry.ccompat_url + path, timeout=10) as resp:
        return json.loads(resp.read())


def test_avro_through_the_schema_registry_lands_as_the_writer_schema_and_compacts_to_postgres(
    stack: DebeziumStack, spark: Any, endpoint: Any, tmp_path: Path
) -> None:
    """Apicurio's AvroConverter writes the Confluent wire format; the landing consumer decodes it with the registry's
    schema, lands Avro files of that schema, keeps undecodable records aside; the job compacts them to the table."""
    import struct
    from decimal import Decimal

    import yaml
    from confluent_kafka import Consumer, Producer
    from fastavro import reader

    from cdc_compaction.core.registry import parse_table
    from cdc_compaction.devtools import conformance as conf

    started = time.monotonic()
    sql(stack, "ALTER TABLE accounts ADD COLUMN IF NOT EXISTS price numeric(10, 2)")
    topic = topic_of(TABLE, "cdcreg")
    stack.register(
        [TABLE], name="cdc-postgres-registry", topic_prefix="cdcreg", slot="cdc_registry", avro_registry=True
    )
    sql(
        stack,
        "UPDATE accounts SET balance = balance + 1, price = 7.25 WHERE id = 4",
        "INSERT INTO accounts VALUES (7, 'frances', 700, 0.05)",
        "DELETE FROM accounts WHERE id = 6",
    )
    # The bytes on the topic are the Confluent wire format (magic byte 0, a 4-byte id), the id one of the registry's.
    probe = Consumer(
        {"bootstrap.servers": stack.bootstrap_servers, "group.id": "registry-probe", "auto.offset.reset": "earliest"}
    )
    probe.subscribe([topic])
    raw: list[Any] = []
    deadline = time.monotonic() + WAIT_S
    while not raw and time.monotonic() < deadline:  # the topic may not exist yet: an error message, not a record
        raw = [m for m in probe.consume(num_messages=1, timeout=1.0) if m.error() is None]
    probe.close()
    assert raw and raw[0].value()[0] == 0
    registered = json.loads(_ccompat(stack, f"/schemas/ids/{struct.unpack('>I', raw[0].value()[1:5])[0]}")["schema"])
    assert registered["name"] == "Envelope" and registered["namespace"] == "cdcreg.public.accounts"
    assert {f"{topic}-value", f"{topic}-key"} <= set(_ccompat(stack, "/subjects"))

    # Two records no converter wrote: JSON, and the wire format naming a schema id the registry does not have.
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    producer.produce(topic, value=b'{"op": "c"}')
    producer.produce(topic, value=b"\x00" + struct.pack(">I", 999_999) + b"\x02")
    producer.flush(10)
    del producer  # no client left polling a broker the fixture stops
    sql(stack, "INSERT INTO accounts VALUES (8, 'mark', 0, NULL)")

    doc = conf.registry_doc(
        conf.Scenario(
            path=tmp_path / "unused.json",
            name="dbz_accounts_registry",
            about="accounts through Apicurio's AvroConverter, landed as Avro",
            table={
                "primary_key": ["id"],
                "columns": [
                    {"name": "id", "type": "int"},
                    {"name": "owner", "type": "string"},
                    {"name": "balance", "type": "int"},
                    {"name": "price", "type": "decimal(10,2)"},
                    {"name": "__op", "type": "string"},
                    {"name": "__lsn", "type": "bigint"},
                ],
            },
            steps=[],
        ),
        tmp_path / "lake",
    )
    cfg = parse_table({**doc, "source": "debezium", "format": "avro", "envelope": "debezium"})
    rejects = tmp_path / "rejects"
    route = Route.for_table(cfg, topic, "avro", wire="confluent")
    landed_records: list[dict[str, Any]] = []
    deadline = time.monotonic() + WAIT_S
    with LandingConsumer(
        stack.bootstrap_servers,
        [route],
        "cdc-landing-registry",
        schema_registry=stack.registry.ccompat_url if stack.registry else None,
        rejects_dir=rejects,
    ) as c:
        while not any(r["op"] == "c" and r["after"]["id"] == 8 for r in landed_records):
            assert time.monotonic() < deadline, f"not landed within {WAIT_S:.0f}s: {landed_records}"
            for path in c.land(idle_s=0.5):
                with open(path, "rb") as f:
                    avro = reader(f)
                    # The file's schema is the registry's writer schema, not one made from the record.
                    assert (avro.writer_schema["name"], [x["name"] for x in avro.writer_schema["fields"]]) == (
                        "cdcreg.public.accounts.Envelope",
                        [x["name"] for x in registered["fields"]],
                    )
                    landed_records += list(avro)
        assert dict(c.rejected) == {topic: 2}
    # Kept in offset order, each beside its reason: the JSON record first, then the unknown id.
    reasons = [p.read_text() for p in sorted(rejects.glob("*.reason"))]
    assert "magic byte 0" in reasons[0] and "schema id 999999 is not in the registry" in reasons[1], reasons
    assert [p.read_bytes()[:1] for p in sorted(rejects.glob("*.bin"))] == [b"{", b"\x00"]
    (update,) = [r for r in landed_records if r["op"] == "u" and r["after"]["id"] == 4]
    assert update["after"]["price"] == Decimal("7.25")

    landed_at = time.monotonic()
    runner = conf.InProcessRunner(spark, endpoint)
    runner.setup(cfg)
    runner.compact(cfg)
    with stack.pg.connect(stack.database) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, owner, balance, price FROM accounts")
        expected = sorted(cur.fetchall())
    lake = sorted((r["id"], r["owner"], r["balance"], r["price"]) for r in conf.Reader(spark).visible_base(cfg))
    assert lake == expected
    compacted_at = time.monotonic()

    # registry discover from the subjects the converter registered: the envelope, the key subject's key.
    from cdc_compaction.operations.discover import Options, discover

    out = tmp_path / "registry"
    report = discover(
        Options(
            landing_root=str(tmp_path / "landing"),
            database="cdc",
            out=out,
            include=["accounts"],
            schema_registry=stack.registry.ccompat_url if stack.registry else None,
        )
    )
    assert [t for t, _ in report.written] == ["accounts"] and report.unfinished == {}, report.lines()
    entry = parse_table(yaml.safe_load((out / "cdc.accounts.yaml").read_text()))
    assert (entry.source, entry.format, entry.envelope, entry.mode) == ("debezium", "avro", "debezium", "cdc")
    assert entry.primary_key == ["id"] and entry.storage_root == str(tmp_path / "landing" / "accounts")
    assert {c.name: c.type for c in entry.columns} == {
        **{"id": "int", "owner": "string", "balance": "int", "price": "decimal(10,2)"},
        **{"__op": "string", "__commit_lsn": "bigint", "__lsn": "bigint"},
    }
    print(
        f"registry connector and landing {landed_at - started:.1f}s, compaction and check "
        f"{compacted_at - landed_at:.1f}s, discover {time.monotonic() - compacted_at:.1f}s"
    )


def test_stop_leaves_no_process_running(stack: DebeziumStack) -> None:
    import psutil

    pids = stack.pids()
    assert len(pids) == 4  # Connect, Kafka, the schema registry, PostgreSQL's postmaster
    tree = {p.pid for pid in pids for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]}
    # Every port the stack opens is on 127.0.0.1: none on every interface (Quarkus's management interface
    # defaults to 0.0.0.0:9000, which also collides with a second registry on the machine).
    listening = [
        (pid, c.laddr) for pid in tree for c in psutil.Process(pid).net_connections("inet") if c.status == "LISTEN"
    ]
    assert {pid for pid, _ in listening} == set(pids), listening  # each of the four listens, none of their children
    wide = [(pid, a) for pid, a in listening if a.ip in ("0.0.0.0", "::")]
    assert wide == [], f"listening on every interface: {wide}"
    started = time.monotonic()
    stack.stop()
    print(f"stack stopped in {time.monotonic() - started:.1f}s")
    assert not [pid for pid in tree if pid_alive(pid)], "every process the stack started, and their children, ended"
    assert stack.pids() == []


def test_a_failed_start_raises_with_the_log_and_stops_what_it_started(tmp_path: Path) -> None:
    import socket

    import psutil

    from cdc_compaction.devtools.local_services import ServiceError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        s = DebeziumStack(tmp_path / "stack", kafka_port=taken.getsockname()[1])
        ours = {p.pid for p in psutil.Process().children(recursive=True)}
        with pytest.raises(ServiceError, match=r"(?s)kafka exited during start; the last lines of .*kafka\.log:\n.*"):
            s.start()
    assert s.pids() == []
    assert not [p for p in psutil.Process().children(recursive=True) if p.pid not in ours and p.is_running()]
    assert "Address already in use" in (tmp_path / "stack" / "kafka" / "kafka.log").read_text()
