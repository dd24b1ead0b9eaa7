"""The decoder of landed records (job/decode.py), record by record, without Spark.

Every expected value here is written by hand from Debezium's documented shapes (the PostgreSQL
connector's data change events, its ``decimal.handling.mode`` and ``time.precision.mode``,
Kafka Connect's JsonConverter with and without ``schemas.enable``, tombstones, heartbeats and
transaction metadata): 123.45 as precise bytes is the unscaled 12345 = 0x3039, base64 ``MDk=``;
-123.45 is 0xCFC7, ``z8c=``; 1700000000 s after the epoch is 2023-11-14 22:13:20 UTC, day 19675.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import fastavro
import pytest

from cdc_compaction.job import avro_container
from cdc_compaction.job.decode import Decoded, Spec, decode_file

TS = datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC)
TS_MS = datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
DAY = date(2023, 11, 14)


def lines(*records: Any) -> bytes:
    return ("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n").encode()


def decoded(content: bytes, spec: Spec, name: str = "pg.public.t+0+100.json") -> list[Decoded]:
    return list(decode_file(content, name, spec))


# ------------------------------------------------------------------ logical types, schema in the file
TYPES = (
    ("id", "int"),
    ("amount", "decimal(10,2)"),
    ("neg", "decimal(10,2)"),
    ("vs", "decimal(10,3)"),
    ("d", "date"),
    ("t_ms", "string"),
    ("t_us", "string"),
    ("t_ns", "string"),
    ("ts_ms", "timestamp"),
    ("ts_us", "timestamp"),
    ("ts_ns", "timestamp"),
    ("tz", "timestamp"),
    ("ztime", "string"),
    ("cd", "date"),
    ("ct", "string"),
    ("cts", "timestamp"),
    ("note", "string"),
)


def field(name: str, kind: str, semantic: str | None = None, **params: str) -> dict[str, Any]:
    f: dict[str, Any] = {"field": name, "type": kind, "optional": True}
    if semantic:
        f["name"] = semantic
        f["version"] = 1
    if params:
        f["parameters"] = params
    return f


VALUE_FIELDS = [
    field("id", "int32"),
    field("amount", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2", **{"connect.decimal.precision": "10"}),
    field("neg", "bytes", "org.apache.kafka.connect.data.Decimal", scale="2"),
    {
        "field": "vs",
        "type": "struct",
        "name": "io.debezium.data.VariableScaleDecimal",
        "optional": True,
        "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}],
    },
    field("d", "int32", "io.debezium.time.Date"),
    field("t_ms", "int32", "io.debezium.time.Time"),
    field("t_us", "int64", "io.debezium.time.MicroTime"),
    field("t_ns", "int64", "io.debezium.time.NanoTime"),
    field("ts_ms", "int64", "io.debezium.time.Timestamp"),
    field("ts_us", "int64", "io.debezium.time.MicroTimestamp"),
    field("ts_ns", "int64", "io.debezium.time.NanoTimestamp"),
    field("tz", "string", "io.debezium.time.ZonedTimestamp"),
    field("ztime", "string", "io.debezium.time.ZonedTime"),
    field("cd", "int32", "org.apache.kafka.connect.data.Date"),
    field("ct", "int32", "org.apache.kafka.connect.data.Time"),
    field("cts", "int64", "org.apache.kafka.connect.data.Timestamp"),
    field("note", "string"),
]
#: One row as the PostgreSQL connector writes it (12:34:56.123456 is 45296123456 us after midnight).
VALUE = {
    "id": 1,
    "amount": "MDk=",
    "neg": "z8c=",
    "vs": {"scale": 3, "value": "MDk="},
    "d": 19675,
    "t_ms": 45296123,
    "t_us": 45296123456,
    "t_ns": 45296123456789,
    "ts_ms": 1700000000123,
    "ts_us": 1700000000123456,
    "ts_ns": 1700000000123456789,
    "tz": "2023-11-14T22:13:20.123456Z",
    "ztime": "12:34:56.123456Z",
    "cd": 19675,
    "ct": 45296123,
    "cts": 1700000000123,
    "note": "__debezium_unavailable_value",
}
EXPECTED = {
    "id": 1,
    "amount": Decimal("123.45"),
    "neg": Decimal("-123.45"),
    "vs": Decimal("12.345"),
    "d": DAY,
    "t_ms": "12:34:56.123000",
    "t_us": "12:34:56.123456",
    "t_ns": "12:34:56.123456",
    "ts_ms": TS_MS,
    "ts_us": TS,
    "ts_ns": TS,
    "tz": TS,
    "ztime": "12:34:56.123456Z",
    "cd": DAY,
    "ct": "12:34:56.123000",
    "cts": TS_MS,
    # The TOAST placeholder passes as it is: the registry's `unchanged` option fills it.
    "note": "__debezium_unavailable_value",
}


def test_every_logical_type_from_a_json_schema_flattened() -> None:
    schema = {"type": "struct", "name": "pg.public.t.Value", "optional": False, "fields": VALUE_FIELDS}
    got = decoded(lines({"schema": schema, "payload": VALUE}), Spec(format="json", columns=TYPES))
    assert [(d.pos, d.row, d.reason, d.skip) for d in got] == [(1, EXPECTED, None, None)]


# ------------------------------------------------------------------ the modes, no schema in the file
SCHEMALESS = (("id", "int"), ("amount", "decimal(10,2)"), ("neg", "decimal(10,2)"), ("d", "date"), ("ts", "timestamp"))


@pytest.mark.parametrize(
    ("decimal_handling", "amount", "neg"),
    [("precise", "MDk=", "z8c="), ("double", 123.45, -123.45), ("string", "123.45", "-123.45")],
)
@pytest.mark.parametrize(
    ("time_precision", "ts", "expected_ts"),
    [
        ("adaptive", 1700000000123456, TS),
        ("adaptive_time_microseconds", 1700000000123456, TS),
        ("connect", 1700000000123, TS_MS),
    ],
)
def test_every_mode_without_a_schema(
    decimal_handling: str, amount: Any, neg: Any, time_precision: str, ts: int, expected_ts: datetime
) -> None:
    spec = Spec(format="json", decimal_handling=decimal_handling, time_precision=time_precision, columns=SCHEMALESS)
    got = decoded(lines({"id": 7, "amount": amount, "neg": neg, "d": 19675, "ts": ts}), spec)
    assert got[0].reason is None
    assert got[0].row == {"id": 7, "amount": Decimal("123.45"), "neg": Decimal("-123.45"), "d": DAY, "ts": expected_ts}


# ------------------------------------------------------------------ the envelope
ENV_COLUMNS = (
    ("id", "int"),
    ("name", "string"),
    ("__op", "string"),
    ("__lsn", "bigint"),
    ("__source_ts_ms", "bigint"),
    ("__txid", "bigint"),
    ("__snapshot", "string"),
    ("__deleted", "string"),
    ("__kafka_offset", "bigint"),
)


def envelope(op: str, before: Any, after: Any, lsn: int, snapshot: str = "false") -> dict[str, Any]:
    return {
        "before": before,
        "after": after,
        "source": {
            "version": "3.6.0.Final",
            "connector": "postgresql",
            "name": "pg",
            "ts_ms": 1700000000000 + lsn,
            "snapshot": snapshot,
            "db": "app",
            "schema": "public",
            "table": "t",
            "txId": 700 + lsn,
            "lsn": lsn,
            "xmin": None,
        },
        "op": op,
        "ts_ms": 1700000000500 + lsn,
        "transaction": None,
    }


def row(id_: int, name: str, op: str, lsn: int, deleted: str, offset: int, snapshot: str = "false") -> dict[str, Any]:
    return {
        "id": id_,
        "name": name,
        "__op": op,
        "__lsn": lsn,
        "__source_ts_ms": 1700000000000 + lsn,
        "__txid": 700 + lsn,
        "__snapshot": snapshot,
        "__deleted": deleted,
        "__kafka_offset": offset,
    }


def test_envelope_ops_key_change_and_records_that_are_not_rows() -> None:
    content = lines(
        {"status": "BEGIN", "id": "571", "event_count": None, "data_collections": None, "ts_ms": 1},
        envelope("r", None, {"id": 1, "name": "a"}, 10, snapshot="last"),
        envelope("c", None, {"id": 2, "name": "b"}, 20),
        envelope("u", {"id": 2, "name": "b"}, {"id": 2, "name": "B"}, 30),
        # A primary-key change: a delete of the old key, its tombstone, a create of the new key.
        envelope("d", {"id": 1, "name": "a"}, None, 40),
        "null",
        envelope("c", None, {"id": 9, "name": "a"}, 40),
        {"ts_ms": 1700000009999},
        {
            "status": "END",
            "id": "571",
            "event_count": 4,
            "data_collections": [{"data_collection": "public.t", "event_count": 4}],
            "ts_ms": 2,
        },
        '{"before": null, "after": {"id": 3',
        envelope("c", None, {"id": "three", "name": "c"}, 50),
    )
    got = decoded(content, Spec(format="json", envelope="debezium", columns=ENV_COLUMNS))
    assert [(d.pos, d.skip) for d in got if d.skip] == [
        (1, "transaction"),
        (6, "tombstone"),
        (8, "heartbeat"),
        (9, "transaction"),
    ]
    assert [(d.pos, d.row) for d in got if d.row] == [
        (2, row(1, "a", "r", 10, "false", 101, snapshot="last")),
        (3, row(2, "b", "c", 20, "false", 102)),
        (4, row(2, "B", "u", 30, "false", 103)),
        (5, row(1, "a", "d", 40, "true", 104)),
        (7, row(9, "a", "c", 40, "false", 106)),
    ]
    reasons = [(d.pos, d.reason) for d in got if d.reason]
    assert [p for p, _ in reasons] == [10, 11]
    assert reasons[0][1].startswith("undecodable record: not JSON")
    assert reasons[1][1] == "undecodable record: column 'id' (int): a str where int was expected"


def test_a_value_that_does_not_fit_is_refused_with_the_column() -> None:
    spec = Spec(format="json", decimal_handling="string", columns=(("id", "int"), ("amount", "decimal(5,2)")))
    got = decoded(lines({"id": 1, "amount": "1234.5"}, {"id": 2, "amount": "1.234"}, {"id": 3, "amount": "99.5"}), spec)
    assert [d.reason for d in got] == [
        "undecodable record: column 'amount' (decimal(5,2)): has more than 5 digits: does not fit decimal(5,2)",
        "undecodable record: column 'amount' (decimal(5,2)): has more than 2 decimal places: does not fit decimal(5,2)",
        None,
    ]
    assert got[2].row == {"id": 3, "amount": Decimal("99.50")}


def test_a_delete_without_a_before_image_is_refused() -> None:
    got = decoded(lines(envelope("d", None, None, 5)), Spec(format="json", envelope="debezium", columns=ENV_COLUMNS))
    assert got[0].reason == (
        "undecodable record: op 'd' without a 'before' image "
        "(set the table's REPLICA IDENTITY so deletes carry the key)"
    )


# ------------------------------------------------------------------ Avro, as AvroConverter writes the envelope
def avro_envelope_schema() -> dict[str, Any]:
    value = {
        "type": "record",
        "name": "Value",
        "namespace": "pg.public.t",
        "fields": [
            {"name": "id", "type": "int"},
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
                "name": "ts",
                "type": [
                    "null",
                    {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"},
                ],
                "default": None,
            },
            {
                "name": "d",
                "type": ["null", {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}],
                "default": None,
            },
        ],
        "connect.name": "pg.public.t.Value",
    }
    source = {
        "type": "record",
        "name": "Source",
        "namespace": "io.debezium.connector.postgresql",
        "fields": [
            {"name": "ts_ms", "type": "long"},
            {"name": "snapshot", "type": ["null", "string"], "default": None},
            {"name": "txId", "type": ["null", "long"], "default": None},
            {"name": "lsn", "type": ["null", "long"], "default": None},
        ],
    }
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": "pg.public.t",
        "fields": [
            {"name": "before", "type": ["null", value], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "source", "type": source},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": None},
        ],
        "connect.name": "pg.public.t.Envelope",
    }


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_avro_envelope_with_logical_types(codec: str) -> None:
    source = {"ts_ms": 1700000000000, "snapshot": "false", "txId": 7, "lsn": 33}
    value = {"id": 4, "amount": Decimal("-123.45"), "ts": 1700000000123456, "d": 19675}
    records = [
        {"before": None, "after": value, "source": source, "op": "c", "ts_ms": 1},
        {"before": value, "after": None, "source": {**source, "lsn": 34}, "op": "d", "ts_ms": 2},
    ]
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(avro_envelope_schema()), records, codec=codec)
    columns = (
        ("id", "int"),
        ("amount", "decimal(10,2)"),
        ("ts", "timestamp"),
        ("d", "date"),
        ("__op", "string"),
        ("__lsn", "bigint"),
        ("__deleted", "string"),
        ("__kafka_partition", "int"),
        ("__kafka_offset", "bigint"),
    )
    # connect mode would read a bare long as milliseconds: the schema's MicroTimestamp must win.
    spec = Spec(format="avro", envelope="debezium", time_precision="connect", columns=columns)
    got = decoded(buf.getvalue(), spec, name="pg.public.t+2+500.avro")
    same = {"id": 4, "amount": Decimal("-123.45"), "ts": TS, "d": DAY, "__kafka_partition": 2}
    assert [(d.pos, d.row) for d in got] == [
        (0, {**same, "__op": "c", "__lsn": 33, "__deleted": "false", "__kafka_offset": 500}),
        (1, {**same, "__op": "d", "__lsn": 34, "__deleted": "true", "__kafka_offset": 501}),
    ]
    assert avro_container.count_records(buf.getvalue()) == 2


def test_avro_header_problems_are_named() -> None:
    with pytest.raises(avro_container.AvroError, match="no Obj"):
        avro_container.count_records(b"PAR1....")
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema({"type": "record", "name": "r", "fields": []}), [{}], codec="bzip2")
    with pytest.raises(avro_container.AvroError, match="codec 'bzip2' is not read here"):
        avro_container.count_records(buf.getvalue())


def test_a_keyless_tables_before_image_columns_come_from_the_envelopes_before() -> None:
    spec = Spec(
        format="json",
        envelope="debezium",
        columns=(("v", "int"), ("_before_v", "int"), ("__op", "string")),
        before=(("_before_v", "v"),),
    )
    got = decoded(
        lines(envelope("u", {"v": 1}, {"v": 2}, 5), envelope("c", None, {"v": 3}, 6), envelope("d", {"v": 3}, None, 7)),
        spec,
    )
    assert [d.row for d in got] == [
        {"v": 2, "_before_v": 1, "__op": "u"},
        {"v": 3, "_before_v": None, "__op": "c"},
        {"v": 3, "_before_v": 3, "__op": "d"},
    ]


def test_mysql_binlog_position_and_truncate_and_message_events() -> None:
    columns = (("id", "int"), ("__op", "string"), ("__file", "string"), ("__pos", "bigint"), ("__row", "int"))
    mysql = {
        "before": None,
        "after": {"id": 5},
        "source": {"connector": "mysql", "file": "mysql-bin.000003", "pos": 154, "row": 1, "ts_ms": 1},
        "op": "c",
        "ts_ms": 2,
    }
    truncate = {"before": None, "after": None, "source": {"connector": "postgresql", "lsn": 9}, "op": "t", "ts_ms": 3}
    message = {"op": "m", "ts_ms": 4, "source": {}, "message": {"prefix": "p", "content": "aGk="}}
    got = decoded(lines(mysql, truncate, message), Spec(format="json", envelope="debezium", columns=columns))
    assert [(d.row, d.skip) for d in got] == [
        ({"id": 5, "__op": "c", "__file": "mysql-bin.000003", "__pos": 154, "__row": 1}, None),
        (None, "truncate"),
        (None, "message"),
    ]


# ------------------------------------------------------------------ the PostgreSQL source position
#: source.sequence as Debezium 3.6's PostgreSQL connector writes it: ["<lastCommitLsn>", "<lsn>"], the
#: first null until the connector has delivered a commit since it started without a committed position.
POSITION = (("id", "int"), ("__op", "string"), ("__commit_lsn", "bigint"), ("__lsn", "bigint"), ("__row", "bigint"))


def _pg(op: str, lsn: int, last_commit: str | None, snapshot: str = "false") -> dict[str, Any]:
    source = {"lsn": lsn, "sequence": json.dumps([last_commit, str(lsn)]), "snapshot": snapshot, "txId": 7}
    image = {"id": lsn % 100}
    return {"before": image if op == "d" else None, "after": None if op == "d" else image, "source": source, "op": op}


def test_the_commit_position_and_row_come_from_the_source_not_the_kafka_offset() -> None:
    spec = Spec(format="json", envelope="debezium", columns=POSITION)
    content = lines(
        _pg("r", 900, None, "first"),  # a snapshot's rows: one LSN, null commit, their offsets as ordinal
        _pg("r", 900, None, "last"),
        _pg("c", 900, None),  # the first transaction streamed: no commit delivered before it
        _pg("c", 1040, "1000"),
        _pg("d", 960, "1100"),  # began before the previous transaction and committed after it
    )
    got = [(d.row["__commit_lsn"], d.row["__lsn"], d.row["__row"]) for d in decoded(content, spec)]  # type: ignore[index]
    assert got == [(0, 900, 100), (0, 900, 101), (900, 900, 0), (1000, 1040, 0), (1100, 960, 0)]
    # The same records re-sent under other offsets: the changes' positions are the same.
    again = [d.row for d in decoded(content, spec, name="pg.public.t+0+555.json")]
    assert [r["__commit_lsn"] for r in again] == [g[0] for g in got]  # type: ignore[index]
    assert [r["__row"] for r in again][2:] == [0, 0, 0]  # type: ignore[index]


def test_a_flattened_record_derives_its_position_from_its_sequence() -> None:
    """ExtractNewRecordState with add.fields=op,lsn,sequence, as JSON: the row carries __sequence, not __commit_lsn."""
    spec = Spec(format="json", envelope="flattened", columns=POSITION)
    content = lines(
        {"id": 1, "__op": "r", "__lsn": 900, "__sequence": '[null,"900"]'},
        {"id": 2, "__op": "u", "__lsn": 1040, "__sequence": '["1000","1040"]'},
        {"id": 3, "__op": "c", "__lsn": 1041},  # the sink did not keep source.sequence
        {"id": 4, "__op": "c", "__lsn": 1042, "__sequence": "[1"},
    )
    d = decoded(content, spec, name="pg.public.t+0+7.json")
    assert [(x.row or {}).get("__commit_lsn") for x in d[:2]] == [0, 1000]
    assert [(x.row or {}).get("__row") for x in d[:2]] == [7, 0]
    assert d[2].row is None and "__sequence" in (d[2].reason or "") and "add.fields=sequence" in (d[2].reason or "")
    assert d[3].row is None and "not a JSON array" in (d[3].reason or "")
