"""The data columns a decoded change file carries, with their types, read from the records' own schema.

Flattened Parquet has its footer, which the plan judges against the registry (``schema_changes``).
A JSON, Avro or envelope-Parquet file carries its columns elsewhere: in each line's Connect schema
(JsonConverter with ``schemas.enable``), in the container's Avro schema, in the Parquet footer's row
structs (and the ``parquet.avro.schema`` a parquet-avro writer keeps there).  :func:`data_columns`
reads them as Arrow type names (``int32``, ``decimal128(8, 2)``, ``timestamp[us, tz=UTC]``, ...), the
names the plan's judge already takes for a Parquet footer, so that a column the source added (an
``ALTER TABLE ... ADD COLUMN``) follows ``schema_changes: evolve`` for every format alike.

Each type is the one the decoder (:mod:`cdc_compaction.job.decode`) turns the value into: Debezium's
and Connect's semantic types decide (a ``MicroTimestamp`` is a timestamp, not its int64; a Connect
``Decimal`` a decimal of its precision and scale; a ``MicroTime`` text).  JSON without schemas has
only values: a column's type is the JSON type of its first non-null value (number: ``int64`` or
``double``); a column that is null in every record of the file says nothing yet.

Standard library only (the plan runs it without Spark; the job package's rule).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from cdc_compaction.job import avro_container

#: Kafka Connect's and Debezium's semantic type names (the ``name`` of a field's Connect schema).
CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
DATE_DAYS = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
TIME_UNITS = {
    "io.debezium.time.Time": 1_000,
    "org.apache.kafka.connect.data.Time": 1_000,
    "io.debezium.time.MicroTime": 1,
    "io.debezium.time.NanoTime": -1_000,  # negative: divide
}
TIMESTAMP_UNITS = {
    "io.debezium.time.Timestamp": 1_000,
    "org.apache.kafka.connect.data.Timestamp": 1_000,
    "io.debezium.time.MicroTimestamp": 1,
    "io.debezium.time.NanoTimestamp": -1_000,
}
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
ZONED_TIME = "io.debezium.time.ZonedTime"
#: Avro logical types as the Connect names they stand for (AvroConverter writes both where it can).
AVRO_LOGICAL = {
    "decimal": CONNECT_DECIMAL,
    "date": "org.apache.kafka.connect.data.Date",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "time-micros": "io.debezium.time.MicroTime",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "timestamp-micros": "io.debezium.time.MicroTimestamp",
}
#: Connect's primitive schema types (and Avro's) as Arrow type names.
_CONNECT_PRIMITIVES = {
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "float32": "float",
    "float64": "double",
    "boolean": "bool",
    "string": "string",
    "bytes": "binary",
}
_AVRO_PRIMITIVES = {
    "int": "int32",
    "long": "int64",
    "float": "float",
    "double": "double",
    "boolean": "bool",
    "string": "string",
    "bytes": "binary",
}
#: What a type without a safe Hive type is named (the judge refuses to add it, saying so).
NESTED = "struct"


def _semantic_type(name: str | None, precision: Any, scale: Any) -> str | None:
    """The Arrow type name a semantic (Connect or Debezium) type decodes to; None: not a semantic type."""
    if name == CONNECT_DECIMAL:
        return f"decimal128({int(precision) if precision is not None else 38}, {int(scale or 0)})"
    if name in DATE_DAYS:
        return "date32[day]"
    if name in TIMESTAMP_UNITS or name == ZONED_TIMESTAMP:
        return "timestamp[us, tz=UTC]"
    if name in TIME_UNITS or name == ZONED_TIME:
        return "string"  # the decoder writes a time of day as its ISO text
    if name == VARIABLE_DECIMAL:
        return NESTED  # scale varies per value: no one decimal type holds it
    return None


def connect_type(field: Mapping[str, Any]) -> str:
    """The Arrow type name of one field of a Connect struct schema (JsonConverter's ``schema``)."""
    params = field.get("parameters") or {}
    semantic = _semantic_type(field.get("name"), params.get("connect.decimal.precision"), params.get("scale"))
    if semantic is not None:
        return semantic
    return _CONNECT_PRIMITIVES.get(str(field.get("type")), NESTED)


def _connect_fields(schema: Any) -> dict[str, str]:
    return {str(f.get("field")): connect_type(f) for f in (schema or {}).get("fields") or [] if isinstance(f, dict)}


def _connect_struct(schema: Any, name: str) -> Any:
    return next((f for f in (schema or {}).get("fields") or [] if isinstance(f, dict) and f.get("field") == name), None)


def avro_type(t: Any, schema: avro_container.Schema) -> str:
    """The Arrow type name of an Avro field type (a nullable union's branch; Connect's names first)."""
    t = schema.resolve(t)
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        return avro_type(branches[0], schema) if len(branches) == 1 else NESTED
    if isinstance(t, str):
        return _AVRO_PRIMITIVES.get(t, NESTED)
    if not isinstance(t, dict):
        return NESTED
    params = t.get("connect.parameters") or {}
    name = t.get("connect.name") or AVRO_LOGICAL.get(str(t.get("logicalType")))
    semantic = _semantic_type(
        name, t.get("precision", params.get("connect.decimal.precision")), t.get("scale", params.get("scale"))
    )
    if semantic is not None:
        return semantic
    connect = t.get("connect.type")  # AvroData keeps int8/int16 as an Avro int with the Connect type
    if connect in ("int8", "int16"):
        return str(connect)
    return _AVRO_PRIMITIVES.get(str(t.get("type")), NESTED)


def _avro_record_fields(t: Any, schema: avro_container.Schema) -> dict[str, str] | None:
    t = schema.resolve(t)
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        t = schema.resolve(branches[0]) if len(branches) == 1 else None
    if not isinstance(t, dict) or t.get("type") not in ("record", "error"):
        return None
    return {str(f["name"]): avro_type(f.get("type"), schema) for f in t.get("fields") or []}


def avro_columns(schema: avro_container.Schema, envelope: str) -> dict[str, str]:
    """The data columns of an Avro writer schema: the root record's, or an envelope's ``before``/``after``."""
    if envelope != "debezium":
        return _avro_record_fields(schema.root, schema) or {}
    root = schema.resolve(schema.root)
    out: dict[str, str] = {}
    for f in root.get("fields") or [] if isinstance(root, dict) else []:
        if f.get("name") in ("before", "after"):
            out.update(_avro_record_fields(f.get("type"), schema) or {})
    return out


def _json_value_type(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    return NESTED


def json_columns(lines: Iterable[bytes], envelope: str) -> dict[str, str | None]:
    """The data columns of a JSON Lines file: every line's Connect schema, else its values' JSON types.

    None: a column of bare JSON that is null in every record (carried, of no type known yet).

    Lines that are not JSON, tombstones and records that are no row change (heartbeats, transaction
    markers) add nothing: the job counts, skips or quarantines those.
    """
    out: dict[str, str | None] = {}
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        try:
            doc = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(doc, dict) and set(doc) == {"schema", "payload"}:
            schema, payload = doc["schema"], doc["payload"]
            if not isinstance(payload, dict) or not isinstance(schema, dict):
                continue
            if envelope == "debezium":
                if "op" not in payload:
                    continue
                for side in ("before", "after"):
                    for name, kind in _connect_fields(_connect_struct(schema, side)).items():
                        out.setdefault(name, kind)
            else:
                for name, kind in _connect_fields(schema).items():
                    out.setdefault(name, kind)
            continue
        if not isinstance(doc, dict):
            continue
        images = [doc.get("before"), doc.get("after")] if envelope == "debezium" and "op" in doc else [doc]
        if envelope == "debezium" and "op" not in doc:
            images = []
        for image in images:
            for name, value in (image or {}).items() if isinstance(image, dict) else ():
                kind = _json_value_type(value)
                if out.get(name) is None:
                    out[name] = kind
    return out


def parquet_envelope_columns(arrow_schema: Any) -> dict[str, str]:
    """The data columns of an envelope Parquet file: its ``before``/``after`` structs.

    A parquet-avro writer (the S3 sink's ``ParquetFormat``) keeps the Avro schema in the footer
    (``parquet.avro.schema``): its Connect names type a ``MicroTimestamp`` as the timestamp it is.
    """
    meta = arrow_schema.metadata or {}
    if b"parquet.avro.schema" in meta:
        try:
            return avro_columns(avro_container.Schema(meta[b"parquet.avro.schema"].decode("utf-8")), "debezium")
        except (avro_container.AvroError, UnicodeDecodeError):
            pass  # fall back to the Parquet columns themselves
    out: dict[str, str] = {}
    for side in ("before", "after"):
        idx = arrow_schema.get_field_index(side)
        if idx < 0:
            continue
        struct = arrow_schema.field(idx).type
        for i in range(getattr(struct, "num_fields", 0)):
            f = struct.field(i)
            out.setdefault(f.name, str(f.type))
    return out
