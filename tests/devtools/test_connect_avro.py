"""Connect schemas to Avro as Confluent's AvroData makes them (written from its documented mapping)."""

from __future__ import annotations

import base64
import io
import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from cdc_compaction.devtools.connect_avro import ConnectSchemaError, avro_datum, avro_schema

VALUE = {
    "type": "struct",
    "optional": True,
    "name": "cdc.public.t.Value",
    "field": "before",
    "fields": [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "int16", "optional": True, "field": "small"},
        {
            "type": "bytes",
            "optional": True,
            "name": "org.apache.kafka.connect.data.Decimal",
            "version": 1,
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
            "field": "price",
        },
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1, "field": "at"},
    ],
}
ENVELOPE = {
    "type": "struct",
    "optional": False,
    "name": "cdc.public.t.Envelope",
    "fields": [VALUE, {**VALUE, "field": "after"}, {"type": "string", "optional": False, "field": "op"}],
}


def test_the_envelope_becomes_named_records_with_nullable_unions() -> None:
    schema = avro_schema(ENVELOPE)
    assert (schema["type"], schema["namespace"], schema["name"]) == ("record", "cdc.public.t", "Envelope")
    before, after, op = schema["fields"]
    assert before["type"][0] == "null" and before["default"] is None
    value = before["type"][1]
    assert (value["namespace"], value["name"], value["connect.name"]) == ("cdc.public.t", "Value", "cdc.public.t.Value")
    # The second use of a record is a reference by its full name.
    assert after["type"] == ["null", "cdc.public.t.Value"]
    assert op == {"name": "op", "type": "string"}
    fields = {f["name"]: f["type"] for f in value["fields"]}
    assert fields["id"] == "int"
    assert fields["small"] == ["null", {"type": "int", "connect.type": "int16"}]
    price = fields["price"][1]
    assert (price["type"], price["logicalType"], price["precision"], price["scale"]) == ("bytes", "decimal", 10, 2)
    assert fields["at"] == ["null", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}]


def test_values_round_trip_through_an_avro_file() -> None:
    fastavro = pytest.importorskip("fastavro")
    unscaled = (1234).to_bytes(2, "big", signed=True)  # 12.34 at scale 2
    row = {"id": 1, "small": 7, "price": base64.b64encode(unscaled).decode(), "at": 1_700_000_000_000_000}
    payload = {"before": None, "after": row, "op": "c"}
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(avro_schema(ENVELOPE)), [avro_datum(ENVELOPE, payload)])
    buf.seek(0)
    (record,) = list(fastavro.reader(buf))
    assert record == {"before": None, "after": {**row, "price": Decimal("12.34")}, "op": "c"}


def test_a_map_with_other_than_string_keys_is_refused_with_its_path() -> None:
    schema = {
        "type": "struct",
        "name": "x.Value",
        "fields": [{"type": "map", "keys": {"type": "int32"}, "values": {"type": "string"}, "field": "m"}],
    }
    with pytest.raises(ConnectSchemaError, match=r"\$\.m: a map with int32 keys"):
        avro_schema(schema)


def test_parquet_columns_are_parquet_avros_and_values_round_trip(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cdc_compaction.devtools.connect_avro import arrow_schema, arrow_value

    logical = {
        "type": "struct",
        "name": "x.Value",
        "fields": [
            {"type": "int16", "optional": False, "field": "small"},
            {"type": "int32", "optional": True, "name": "org.apache.kafka.connect.data.Date", "field": "day"},
            {"type": "int64", "optional": True, "name": "org.apache.kafka.connect.data.Timestamp", "field": "at"},
            {"type": "array", "optional": True, "items": {"type": "string"}, "field": "tags"},
        ],
    }
    schema = arrow_schema({**ENVELOPE, "fields": [*ENVELOPE["fields"], {**logical, "optional": True, "field": "x"}]})
    value = schema.field("before").type
    assert value.field("small").type == pa.int32()  # Avro has no int16: parquet-avro writes INT32
    assert value.field("price").type == pa.decimal128(10, 2)
    x = schema.field("x").type
    assert (x.field("day").type, x.field("at").type) == (pa.date32(), pa.timestamp("ms", tz="UTC"))
    assert json.loads(schema.metadata[b"parquet.avro.schema"])["name"] == "Envelope"

    connect = {**ENVELOPE, "fields": [*ENVELOPE["fields"], {**logical, "optional": True, "field": "x"}]}
    payload = {
        "before": None,
        "after": {"id": 1, "small": 2, "price": base64.b64encode((-1234).to_bytes(2, "big", signed=True)).decode()},
        "op": "c",
        "x": {"small": 3, "day": 19_000, "at": 1_700_000_000_123, "tags": ["a"]},
    }
    path = tmp_path / "f.parquet"
    pq.write_table(pa.Table.from_pylist([arrow_value(connect, payload)], schema=schema), path)
    (row,) = pq.read_table(path).to_pylist()
    assert row["after"] == {"id": 1, "small": 2, "price": Decimal("-12.34"), "at": None}
    assert row["x"]["day"] == date(2022, 1, 8)
    assert row["x"]["at"] == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert row["x"]["tags"] == ["a"]
