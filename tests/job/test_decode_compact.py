"""The same Debezium events landed in every form a deployment configures compact to one table.

Real runs of the cdc job (plan, compact, validate, publish, archive; no DAG) on the session's
Spark and the test metastore.  The events are encoded here by hand from Debezium's documented
shapes -- the envelope (``before``/``after``/``source``/``op``/``ts_ms``) as JsonConverter writes
it with and without ``schemas.enable``, as AvroConverter's Avro, as a Parquet sink's structs,
and flattened as ``ExtractNewRecordState`` (``delete.handling.mode=rewrite``,
``add.fields=op,lsn,source.ts_ms``) writes it -- never with the project's decoder; the expected
table is written by hand.
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import compact_once, fuzz_settings, student_doc
from hypothesis import given
from hypothesis import strategies as st

from cdc_compaction.core.exceptions import QuarantineError
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.core.sql import table_names
from cdc_compaction.integrations.engine import SessionEngine
from cdc_compaction.pipeline.quarantine import Quarantine
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

PLACEHOLDER = "__debezium_unavailable_value"
DATA = ("id", "full_name", "amount", "updated", "note")
COLUMNS = [
    {"name": "id", "type": "int"},
    {"name": "full_name", "type": "string"},
    {"name": "amount", "type": "decimal(10,2)"},
    {"name": "updated", "type": "timestamp"},
    {"name": "note", "type": "string"},
    {"name": "__op", "type": "string"},
    {"name": "__lsn", "type": "bigint"},
    {"name": "__source_ts_ms", "type": "bigint"},
    {"name": "__deleted", "type": "string"},
]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# ------------------------------------------------------------------ events, and their encodings
Event = dict[str, Any]  # {"op", "before", "after", "lsn"} or {"kind": tombstone|heartbeat|begin|end}


def micros(ts: datetime) -> int:
    return (ts - EPOCH) // timedelta(microseconds=1)


def precise(amount: Decimal) -> str:
    """Connect's Decimal in JSON: the unscaled value's big-endian two's-complement bytes, base64."""
    unscaled = int(amount.scaleb(2))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def json_value(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {**row, "amount": precise(row["amount"]), "updated": micros(row["updated"])}


def source(lsn: int) -> dict[str, Any]:
    return {
        "version": "3.6.0.Final",
        "connector": "postgresql",
        "name": "pg",
        "ts_ms": 1_700_000_000_000 + lsn,
        "snapshot": "false",
        "db": "app",
        "schema": "public",
        "table": "t",
        "txId": 500 + lsn,
        "lsn": lsn,
    }


VALUE_SCHEMA = {
    "type": "struct",
    "optional": True,
    "name": "pg.public.t.Value",
    "fields": [
        {"field": "id", "type": "int32", "optional": False},
        {"field": "full_name", "type": "string", "optional": True},
        {
            "field": "amount",
            "type": "bytes",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        },
        {
            "field": "updated",
            "type": "int64",
            "optional": True,
            "name": "io.debezium.time.MicroTimestamp",
            "version": 1,
        },
        {"field": "note", "type": "string", "optional": True},
    ],
}
ENVELOPE_SCHEMA = {
    "type": "struct",
    "optional": False,
    "name": "pg.public.t.Envelope",
    "version": 2,
    "fields": [
        {**VALUE_SCHEMA, "field": "before"},
        {**VALUE_SCHEMA, "field": "after"},
        {
            "type": "struct",
            "optional": False,
            "name": "io.debezium.connector.postgresql.Source",
            "field": "source",
            "fields": [
                {"field": k, "type": t, "optional": k not in ("ts_ms",)}
                for k, t in (
                    ("version", "string"),
                    ("connector", "string"),
                    ("name", "string"),
                    ("ts_ms", "int64"),
                    ("snapshot", "string"),
                    ("db", "string"),
                    ("schema", "string"),
                    ("table", "string"),
                    ("txId", "int64"),
                    ("lsn", "int64"),
                )
            ],
        },
        {"field": "op", "type": "string", "optional": False},
        {"field": "ts_ms", "type": "int64", "optional": True},
    ],
}


def json_lines(events: list[Event], schemas: bool) -> bytes:
    out: list[str] = []
    for e in events:
        kind = e.get("kind")
        if kind == "tombstone":
            out.append("null")
            continue
        if kind == "heartbeat":
            payload: Any = {"ts_ms": 1_700_000_099_000}
            schema: Any = {
                "type": "struct",
                "name": "io.debezium.connector.common.Heartbeat",
                "fields": [{"field": "ts_ms", "type": "int64"}],
            }
        elif kind in ("begin", "end"):
            payload = {
                "status": kind.upper(),
                "id": "571",
                "ts_ms": 1_700_000_000_000,
                "event_count": None if kind == "begin" else 3,
                "data_collections": None,
            }
            schema = {"type": "struct", "name": "io.debezium.connector.common.TransactionMetadataValue", "fields": []}
        elif kind == "bad":
            out.append('{"schema": {"type": "struct"}, "payload": {"op": "c", "after": {"id": ')
            continue
        else:
            payload = {
                "before": json_value(e["before"]),
                "after": json_value(e["after"]),
                "source": source(e["lsn"]),
                "op": e["op"],
                "ts_ms": 1_700_000_000_500 + e["lsn"],
            }
            schema = ENVELOPE_SCHEMA
        out.append(json.dumps({"schema": schema, "payload": payload} if schemas else payload))
    return ("\n".join(out) + "\n").encode()


AVRO_VALUE = {
    "type": "record",
    "name": "Value",
    "namespace": "pg.public.t",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "full_name", "type": ["null", "string"], "default": None},
        {
            "name": "amount",
            "type": [
                "null",
                {
                    "type": "bytes",
                    "scale": 2,
                    "precision": 10,
                    "connect.version": 1,
                    "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                    "connect.name": "org.apache.kafka.connect.data.Decimal",
                    "logicalType": "decimal",
                },
            ],
            "default": None,
        },
        {
            "name": "updated",
            "type": ["null", {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}],
            "default": None,
        },
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
    "connect.name": "pg.public.t.Value",
}
AVRO_ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "namespace": "pg.public.t",
    "fields": [
        {"name": "before", "type": ["null", AVRO_VALUE], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {
            "name": "source",
            "type": {
                "type": "record",
                "name": "Source",
                "namespace": "io.debezium.connector.postgresql",
                "fields": [
                    {"name": "ts_ms", "type": "long"},
                    {"name": "snapshot", "type": ["null", "string"], "default": None},
                    {"name": "txId", "type": ["null", "long"], "default": None},
                    {"name": "lsn", "type": ["null", "long"], "default": None},
                ],
            },
        },
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
    "connect.name": "pg.public.t.Envelope",
}


def avro_row(row: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if row is None else {**row, "updated": micros(row["updated"])}


def avro_file(events: list[Event]) -> bytes:
    """What an Avro sink writes: data change events only (it keeps no tombstones or other topics' records)."""
    records = [
        {
            "before": avro_row(e["before"]),
            "after": avro_row(e["after"]),
            "source": {k: source(e["lsn"])[k] for k in ("ts_ms", "snapshot", "txId", "lsn")},
            "op": e["op"],
            "ts_ms": 1_700_000_000_500 + e["lsn"],
        }
        for e in events
        if "op" in e
    ]
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(AVRO_ENVELOPE), records, codec="deflate")
    return buf.getvalue()


ROW_TYPE = pa.struct(
    [
        ("id", pa.int32()),
        ("full_name", pa.string()),
        ("amount", pa.decimal128(10, 2)),
        ("updated", pa.int64()),
        ("note", pa.string()),
    ]
)


def parquet_envelope(events: list[Event]) -> bytes:
    """A Parquet sink's envelope: structs, a decimal as Parquet's decimal, a MicroTimestamp as its int64."""
    rows = [e for e in events if "op" in e]
    table = pa.table(
        {
            "before": pa.array([avro_row(e["before"]) for e in rows], ROW_TYPE),
            "after": pa.array([avro_row(e["after"]) for e in rows], ROW_TYPE),
            "source": pa.array(
                [{"ts_ms": source(e["lsn"])["ts_ms"], "lsn": e["lsn"]} for e in rows],
                pa.struct([("ts_ms", pa.int64()), ("lsn", pa.int64())]),
            ),
            "op": pa.array([e["op"] for e in rows], pa.string()),
            "ts_ms": pa.array([1_700_000_000_500 + e["lsn"] for e in rows], pa.int64()),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def flattened_parquet(events: list[Event]) -> bytes:
    """ExtractNewRecordState: the after row (a delete's before row, __deleted true), with add.fields."""
    rows = []
    for e in events:
        if "op" not in e:
            continue
        image = e["before"] if e["op"] == "d" else e["after"]
        rows.append(
            {
                **image,
                "__op": e["op"],
                "__lsn": e["lsn"],
                "__source_ts_ms": 1_700_000_000_000 + e["lsn"],
                "__deleted": "true" if e["op"] == "d" else "false",
            }
        )
    types = {
        "id": pa.int32(),
        "full_name": pa.string(),
        "amount": pa.decimal128(10, 2),
        "updated": pa.timestamp("us", tz="UTC"),
        "note": pa.string(),
        "__op": pa.string(),
        "__lsn": pa.int64(),
        "__source_ts_ms": pa.int64(),
        "__deleted": pa.string(),
    }
    table = pa.table({n: pa.array([r[n] for r in rows], t) for n, t in types.items()})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def flattened_json(events: list[Event]) -> bytes:
    """ExtractNewRecordState's rows through JsonConverter, no schemas; tombstones kept (drop.tombstones=false)."""
    out = []
    for e in events:
        if e.get("kind") == "tombstone":
            out.append("null")
        elif "op" in e:
            image = json_value(e["before"] if e["op"] == "d" else e["after"])
            extra = {"__lsn": e["lsn"], "__source_ts_ms": 1_700_000_000_000 + e["lsn"]}
            deleted = "true" if e["op"] == "d" else "false"
            out.append(json.dumps({**image, "__op": e["op"], **extra, "__deleted": deleted}))
    return ("\n".join(out) + "\n").encode()


#: form -> (registry fields, encoder, file name)
FORMS: dict[str, tuple[dict[str, Any], Callable[[list[Event]], bytes], str]] = {
    "flattened-parquet": ({}, flattened_parquet, "part-00000.parquet"),
    "json-schemas": (
        {"format": "json", "envelope": "debezium"},
        lambda ev: json_lines(ev, True),
        "pg.public.t+0+0.json",
    ),
    "json-bare": ({"format": "json", "envelope": "debezium"}, lambda ev: json_lines(ev, False), "pg.public.t+0+0.json"),
    "json-flattened": ({"format": "json"}, flattened_json, "pg.public.t+0+0.json"),
    "avro": ({"format": "avro", "envelope": "debezium"}, avro_file, "pg.public.t+0+0.avro"),
    "parquet-envelope": ({"format": "parquet", "envelope": "debezium"}, parquet_envelope, "pg.public.t+0+0.parquet"),
}


@pytest.fixture
def make_table(tmp_path: Path, spark: Any, endpoint: MetastoreEndpoint) -> Callable[..., Runtime]:
    counter = {"n": 0}

    def _make(**fields: Any) -> Runtime:
        counter["n"] += 1
        name = f"dz_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**6}_{counter['n']}"
        doc = student_doc(tmp_path / "lake", name, columns=[dict(c) for c in COLUMNS], source="debezium", **fields)
        del doc["order_by"]  # the preset's: __lsn
        doc["unchanged"] = {"columns": ["note"]}
        cfg = parse_table(doc)
        rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=SessionEngine(spark))
        ensure_tables(rt)
        return rt

    return _make


def land(cfg: TableConfig, increment: str, name: str, content: bytes) -> None:
    target = Path(Lake(cfg).layout.incremental) / increment
    target.mkdir(parents=True, exist_ok=True)
    (target / name).write_bytes(content)


def table_rows(spark: Any, cfg: TableConfig) -> list[tuple[Any, ...]]:
    name = f"`{cfg.database}`.`{table_names(cfg)['base_table']}`"
    spark.catalog.refreshTable(name)
    return sorted(tuple(r[c] for c in DATA) for r in spark.sql(f"SELECT {', '.join(DATA)} FROM {name}").collect())


def stats_of(rt: Runtime) -> dict[str, Any]:
    commits = sorted(Path(rt.lake.layout.commits).glob("*.json"))
    return json.loads(commits[-1].read_text())


T1 = datetime(2026, 1, 1, 10, 0, 0, 123456, tzinfo=UTC)
T2 = datetime(2026, 1, 1, 11, 30, 0, 654321, tzinfo=UTC)


def r(id_: int, name: str, amount: str, at: datetime, note: str) -> dict[str, Any]:
    return {"id": id_, "full_name": name, "amount": Decimal(amount), "updated": at, "note": note}


#: A snapshot read, a create, an update with an unchanged TOAST column, a key change 1 -> 9 (delete of the
#: old key, its tombstone, create of the new one), and the records that are not rows.
EVENTS: list[Event] = [
    {"kind": "begin"},
    {"op": "r", "before": None, "after": r(1, "Ann", "10.50", T1, "n1"), "lsn": 10},
    {"op": "c", "before": None, "after": r(2, "Bob", "-3.25", T1, "long text"), "lsn": 20},
    {"op": "u", "before": None, "after": r(2, "Bobby", "-3.25", T2, PLACEHOLDER), "lsn": 30},
    {"op": "d", "before": r(1, "Ann", "10.50", T1, "n1"), "after": None, "lsn": 40},
    {"kind": "tombstone"},
    {"op": "c", "before": None, "after": r(9, "Ann", "10.50", T1, "n1"), "lsn": 41},
    {"kind": "heartbeat"},
    {"kind": "end"},
]
EXPECTED = [
    (2, "Bobby", Decimal("-3.25"), T2.replace(tzinfo=None), "long text"),
    (9, "Ann", Decimal("10.50"), T1.replace(tzinfo=None), "n1"),
]


@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_compacts_to_the_same_table(form: str, make_table: Callable[..., Runtime], spark: Any) -> None:
    fields, encode, name = FORMS[form]
    rt = make_table(**fields)
    land(rt.cfg, "increment_2026010110", name, encode(EVENTS))
    assert compact_once(rt, "r1")
    assert table_rows(spark, rt.cfg) == EXPECTED
    stats = stats_of(rt)["stats"]
    skipped = {"flattened-parquet": None, "avro": {}, "parquet-envelope": {}, "json-flattened": {"tombstone": 1}}.get(
        form, {"tombstone": 1, "heartbeat": 1, "transaction": 2}
    )
    assert stats.get("skipped_by_kind") == skipped
    assert stats["increment_rows"] == 5 and stats["rejected_rows"] == 0
    assert stats.get("skipped_records") == (None if skipped is None else sum(skipped.values()))


def test_a_malformed_line_is_quarantined_and_the_rest_compacts(make_table: Callable[..., Runtime], spark: Any) -> None:
    rt = make_table(format="json", envelope="debezium")
    events = [*EVENTS[:3], {"kind": "bad"}, *EVENTS[3:]]
    events.insert(5, {"op": "c", "before": None, "after": {**r(4, "Too", "1", T1, "x"), "id": "four"}, "lsn": 35})
    land(rt.cfg, "increment_2026010110", "pg.public.t+0+0.json", json_lines(events, True))
    assert compact_once(rt, "r1")
    assert table_rows(spark, rt.cfg) == EXPECTED
    stats = stats_of(rt)["stats"]
    assert stats["rejected_rows"] == 2
    assert stats["rejected_by_file"] == {"increment_2026010110/pg.public.t+0+0.json": 2}
    quarantine = spark.read.parquet(str(Path(rt.lake.layout.root) / "quarantine" / "rows" / "*"))
    got = sorted((q["_cdc_pos"], q["_cdc_reject_reason"]) for q in quarantine.collect())
    assert [pos for pos, _ in got] == [4, 6]
    assert got[0][1].startswith("undecodable record: not JSON")
    assert got[1][1] == "undecodable record: column 'id' (int): a str where int was expected"
    # Re-ingesting those rows would land Parquet in a JSON table: refused, saying what to do instead.
    entry = next(e for e in Quarantine(rt.lake).entries() if e.kind == "rows")
    with pytest.raises(QuarantineError, match=r"format json.*fix the records in the landed file"):
        Quarantine(rt.lake).reingest(entry.id)


# ------------------------------------------------------------------ random streams, three forms
KEYS = st.integers(min_value=1, max_value=4)


@st.composite
def streams(draw: Any) -> list[Event]:
    """A random change stream over a few keys, as the connector would emit it, with stray records."""
    state: dict[int, dict[str, Any]] = {}
    events: list[Event] = []
    lsn = 100
    for _ in range(draw(st.integers(min_value=1, max_value=12))):
        lsn += draw(st.integers(min_value=1, max_value=5))
        key = draw(KEYS)
        noise = draw(st.sampled_from([None, None, None, "heartbeat", "begin", "end"]))
        if noise:
            events.append({"kind": noise})
        cents = draw(st.integers(min_value=-(10**6), max_value=10**6))
        row = r(key, draw(st.sampled_from(["a", "b", "c"])), f"{Decimal(cents).scaleb(-2)}", T1, "t")
        if key in state and draw(st.booleans()):
            events.append({"op": "d", "before": state.pop(key), "after": None, "lsn": lsn})
            events.append({"kind": "tombstone"})
        else:
            events.append({"op": "u" if key in state else "c", "before": None, "after": row, "lsn": lsn})
            state[key] = row
    return events


@fuzz_settings(test_examples=2)
@given(events=streams())
def test_random_streams_compact_alike_in_three_forms(
    events: list[Event], make_table: Callable[..., Runtime], spark: Any
) -> None:
    results = {}
    for form in ("flattened-parquet", "json-schemas", "avro"):
        fields, encode, name = FORMS[form]
        rt = make_table(**fields)
        land(rt.cfg, "increment_2026010110", name, encode(events))
        compact_once(rt, "r1")
        results[form] = table_rows(spark, rt.cfg)
    assert results["json-schemas"] == results["flattened-parquet"] == results["avro"]


# ------------------------------------------------------------------ a keyless table from the envelope
def test_a_keyless_table_compacts_from_envelope_json(tmp_path: Path, spark: Any, endpoint: MetastoreEndpoint) -> None:
    """REPLICA IDENTITY FULL: updates and deletes carry the whole old row in ``before``, which the
    keyless table's ``_before_`` columns take; the Kafka offset (from the file name) orders."""
    name = f"dzk_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**6}"
    doc = {
        "database": "tests",
        "table": name,
        "mode": "keyless",
        "source": "debezium",
        "format": "json",
        "envelope": "debezium",
        "columns": [
            {"name": "v", "type": "int"},
            {"name": "label", "type": "string"},
            {"name": "_before_v", "type": "int"},
            {"name": "_before_label", "type": "string"},
            {"name": "__op", "type": "string"},
            {"name": "__kafka_offset", "type": "bigint"},
        ],
        "storage_root": str(tmp_path / "lake" / name),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "retries": 1,
    }
    cfg = parse_table(doc)
    assert cfg.order_by == ["__kafka_offset"]
    rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=SessionEngine(spark))
    ensure_tables(rt)

    def change(op: str, before: Any, after: Any) -> str:
        return json.dumps({"before": before, "after": after, "source": {"lsn": 1}, "op": op, "ts_ms": 1})

    a, b = {"v": 1, "label": "a"}, {"v": 1, "label": "b"}
    content = "\n".join(
        [change("c", None, a), change("c", None, a), "null", change("u", a, b), change("d", a, None), '{"ts_ms": 5}']
    )
    land(cfg, "increment_2026010110", "pg.public.k+0+40.json", (content + "\n").encode())
    assert compact_once(rt, "r1")
    base = f"`{cfg.database}`.`{table_names(cfg)['base_table']}`"
    spark.catalog.refreshTable(base)
    # Two copies of (1, a); the update turned one into (1, b); the delete took the other (1, a).
    assert sorted(tuple(r) for r in spark.sql(f"SELECT v, label FROM {base}").collect()) == [(1, "b")]
    stats = stats_of(rt)["stats"]
    assert (stats["increment_rows"], stats["skipped_by_kind"]) == (4, {"tombstone": 1, "heartbeat": 1})


# ------------------------------------------------------------------ a column added at the source
def _with_price(events: list[Event]) -> list[Event]:
    return [e if "op" not in e else {**e, "price": Decimal("12.34") if e["op"] != "d" else None} for e in events]


def json_lines_with_price(events: list[Event]) -> bytes:
    """``ALTER TABLE t ADD COLUMN price numeric(8, 2)``: JsonConverter's schema and payload carry ``price``."""
    price_field = {
        "field": "price",
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "8"},
    }
    value = {**VALUE_SCHEMA, "fields": [*VALUE_SCHEMA["fields"], price_field]}
    schema = {
        **ENVELOPE_SCHEMA,
        "fields": [
            {**value, "field": f["field"]} if f["field"] in ("before", "after") else f
            for f in ENVELOPE_SCHEMA["fields"]
        ],
    }
    out = []
    for line, e in zip(json_lines(events, True).decode().splitlines(), events, strict=True):
        doc = json.loads(line)
        if doc is not None and "price" in e and doc["payload"].get("op"):
            image = "before" if e["op"] == "d" else "after"
            doc["payload"][image]["price"] = None if e["price"] is None else precise(e["price"])
            doc["schema"] = schema
        out.append(json.dumps(doc))
    return ("\n".join(out) + "\n").encode()


def avro_file_with_price(events: list[Event]) -> bytes:
    """The same as AvroConverter's Avro: ``price`` is a nullable decimal(8,2) of the value record."""
    price = {
        "name": "price",
        "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 8, "scale": 2}],
        "default": None,
    }
    value = {**AVRO_VALUE, "fields": [*AVRO_VALUE["fields"], price]}
    envelope = {
        **AVRO_ENVELOPE,
        "fields": [{**f, "type": ["null", value]} if f["name"] == "before" else f for f in AVRO_ENVELOPE["fields"]],
    }
    records = [
        {
            "before": None if e["before"] is None else {**avro_row(e["before"]), "price": e["price"]},
            "after": None if e["after"] is None else {**avro_row(e["after"]), "price": e["price"]},
            "source": {k: source(e["lsn"])[k] for k in ("ts_ms", "snapshot", "txId", "lsn")},
            "op": e["op"],
            "ts_ms": 1_700_000_000_500 + e["lsn"],
        }
        for e in events
        if "op" in e
    ]
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(envelope), records)
    return buf.getvalue()


def parquet_envelope_with_price(events: list[Event]) -> bytes:
    """A Parquet sink's envelope whose row structs carry ``price`` as Parquet's decimal(8,2)."""
    rows = [e for e in events if "op" in e]
    row_type = pa.struct([*ROW_TYPE, pa.field("price", pa.decimal128(8, 2))])

    def image(row: dict[str, Any] | None, price: Any) -> dict[str, Any] | None:
        return None if row is None else {**avro_row(row), "price": price}

    table = pa.table(
        {
            "before": pa.array([image(e["before"], e["price"]) for e in rows], row_type),
            "after": pa.array([image(e["after"], e["price"]) for e in rows], row_type),
            "source": pa.array([{"lsn": e["lsn"]} for e in rows], pa.struct([("lsn", pa.int64())])),
            "op": pa.array([e["op"] for e in rows], pa.string()),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


ADDED_COLUMN_FORMS: dict[str, tuple[str, Callable[[list[Event]], bytes], str]] = {
    "json": ("json", json_lines_with_price, "pg.public.t+0+100.json"),
    "avro": ("avro", avro_file_with_price, "pg.public.t+0+100.avro"),
    "parquet-envelope": ("parquet", parquet_envelope_with_price, "pg.public.t+0+100.parquet"),
}


@pytest.mark.parametrize("form", list(ADDED_COLUMN_FORMS))
def test_a_column_added_at_the_source_follows_with_schema_changes_evolve(
    form: str, make_table: Callable[..., Runtime], spark: Any
) -> None:
    """The registry does not list ``price``; with ``schema_changes: evolve`` the table gains it from the
    records' own schema (Connect's, Avro's, Parquet's) and holds its values, the older rows NULL."""
    fmt, encode, name = ADDED_COLUMN_FORMS[form]
    rt = make_table(format=fmt, envelope="debezium", schema_changes="evolve")
    land(
        rt.cfg,
        "increment_2026010110",
        name.replace("+100.", "+0."),
        FORMS[form if form != "json" else "json-schemas"][1](EVENTS[:3]),
    )
    assert compact_once(rt, "r1")
    later = [{"op": "u", "before": None, "after": r(2, "Bo", "1.00", T2, "x"), "lsn": 50}]
    land(rt.cfg, "increment_2026010111", name, encode(_with_price(later)))
    assert compact_once(rt, "r2")
    base = f"`{rt.cfg.database}`.`{table_names(rt.cfg)['base_table']}`"
    spark.catalog.refreshTable(base)
    got = sorted(tuple(row) for row in spark.sql(f"SELECT id, full_name, price FROM {base}").collect())
    assert got == [(1, "Ann", None), (2, "Bo", Decimal("12.34"))]
