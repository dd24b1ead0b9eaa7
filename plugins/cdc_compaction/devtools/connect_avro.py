"""Kafka Connect's JSON schemas as Avro (and Parquet) schemas, and their JSON values as Avro datums.

What a Kafka Connect file sink with an Avro format does with a record (Confluent's ``AvroData``,
which the S3 sink's ``AvroFormat`` uses), for the records the ``JsonConverter`` writes with
``schemas.enable=true`` (``{"schema": ..., "payload": ...}``):

* a ``struct`` is an Avro ``record`` named by the Connect schema's name (``cdc.public.accounts.Value``:
  namespace ``cdc.public.accounts``, name ``Value``); a record met a second time is referred to by
  its full name, as Avro requires (the envelope's ``before`` and ``after``);
* an optional schema is the union ``["null", T]`` with the default ``null``;
* ``int8``/``int16``/``int32`` are ``int`` (``connect.type`` keeps which), ``int64`` is ``long``,
  ``float32``/``float64`` are ``float``/``double``, ``bytes`` is ``bytes``;
* Connect's logical types get Avro's: ``Decimal`` is ``bytes`` with ``logicalType: decimal`` (its
  ``scale`` parameter; the precision from ``connect.decimal.precision``, else 64, as ``AvroData``),
  ``Date`` ``int``/``date``, ``Time`` ``int``/``time-millis``, ``Timestamp`` ``long``/``timestamp-millis``;
* every named schema keeps its name as ``connect.name`` (Debezium's semantic types, such as
  ``io.debezium.time.MicroTimestamp``, are plain ``long``/``int`` with that name), and ``parameters``
  as ``connect.parameters``.

:func:`arrow_schema` and :func:`arrow_value` give the Parquet form the S3 sink's ``ParquetFormat``
writes, which goes through that Avro schema (parquet-avro).

Values: the JSON converter writes ``bytes`` (and so ``Decimal``) as base64 strings; they become bytes,
the unscaled two's-complement big-endian integer that Avro's decimal holds too.
"""

from __future__ import annotations

import base64
from typing import Any

from cdc_compaction.core.exceptions import CdcCompactionError

_PRIMITIVES = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "float32": "float",
    "float64": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_LOGICAL = {
    "org.apache.kafka.connect.data.Date": "date",
    "org.apache.kafka.connect.data.Time": "time-millis",
    "org.apache.kafka.connect.data.Timestamp": "timestamp-millis",
}


class ConnectSchemaError(CdcCompactionError):
    """A Connect schema that has no Avro form here (named in the message with its path)."""


def avro_schema(connect: dict[str, Any]) -> Any:
    """The Avro schema of a Connect schema (the ``schema`` of a ``schemas.enable=true`` record)."""
    return _schema(connect, set(), "$")


def _schema(connect: dict[str, Any], defined: set[str], path: str) -> Any:
    kind = connect.get("type")
    name = connect.get("name")
    if kind == "struct":
        full = name or "ConnectDefault"
        if full in defined:
            base: Any = full
        else:
            defined.add(full)
            namespace, _, short = full.rpartition(".")
            fields = []
            for f in connect.get("fields", []):
                field: dict[str, Any] = {"name": f["field"], "type": _schema(f, defined, f"{path}.{f['field']}")}
                if f.get("optional"):
                    field["default"] = None
                fields.append(field)
            base = {"type": "record", "name": short, "fields": fields}
            if namespace:
                base["namespace"] = namespace
            if name:
                base["connect.name"] = name
    elif kind == "array":
        base = {"type": "array", "items": _schema(connect["items"], defined, f"{path}[]")}
    elif kind == "map":
        if connect["keys"].get("type") != "string":
            raise ConnectSchemaError(f"{path}: a map with {connect['keys'].get('type')} keys has no Avro form here")
        base = {"type": "map", "values": _schema(connect["values"], defined, f"{path}{{}}")}
    elif kind in _PRIMITIVES:
        base = {"type": _PRIMITIVES[kind]}
        if kind in ("int8", "int16"):
            base["connect.type"] = kind
        params = connect.get("parameters") or {}
        if name == _DECIMAL:
            base.update(
                logicalType="decimal",
                precision=int(params.get("connect.decimal.precision", 64)),
                scale=int(params.get("scale", 0)),
            )
        elif name in _LOGICAL:
            base["logicalType"] = _LOGICAL[name]
        if name:
            base["connect.name"] = name
        if params:
            base["connect.parameters"] = params
        if len(base) == 1:
            base = base["type"]
    else:
        raise ConnectSchemaError(f"{path}: the Connect type {kind!r} has no Avro form here")
    return ["null", base] if connect.get("optional") else base


def avro_datum(connect: dict[str, Any], value: Any) -> Any:
    """The Avro datum of a JSON value of this Connect schema (base64 strings of bytes decoded)."""
    if value is None:
        return None
    kind = connect.get("type")
    if kind == "struct":
        return {f["field"]: avro_datum(f, value.get(f["field"])) for f in connect.get("fields", [])}
    if kind == "array":
        return [avro_datum(connect["items"], v) for v in value]
    if kind == "map":
        return {k: avro_datum(connect["values"], v) for k, v in value.items()}
    if kind == "bytes":
        return base64.b64decode(value)
    return value


#: What the S3 sink's ``ParquetFormat`` writes: parquet-avro's file of the record's Avro schema, which it
#: also keeps in the footer under this key.
PARQUET_AVRO_SCHEMA = "parquet.avro.schema"


def arrow_schema(connect: dict[str, Any]) -> Any:
    """The Arrow schema of a top-level Connect ``struct``: Parquet's columns as parquet-avro writes them.

    Through Avro, as the S3 sink's ``ParquetFormat`` goes: ``int8``/``int16`` are ``int32`` (Avro
    ``int``), ``Decimal`` is ``decimal128(precision, scale)``, ``Date``/``Time``/``Timestamp`` are
    ``date32``/``time32[ms]``/``timestamp[ms, UTC]``.  The Avro schema is kept in the footer's metadata
    under ``parquet.avro.schema``.
    """
    import json

    import pyarrow as pa

    if connect.get("type") != "struct":
        raise ConnectSchemaError(f"$: a Parquet file's records are structs, not {connect.get('type')!r}")
    fields = [
        pa.field(f["field"], _arrow_type(f, f"$.{f['field']}"), nullable=bool(f.get("optional")))
        for f in connect["fields"]
    ]
    return pa.schema(fields, metadata={PARQUET_AVRO_SCHEMA: json.dumps(avro_schema(connect))})


def _arrow_type(connect: dict[str, Any], path: str) -> Any:
    import pyarrow as pa

    kind, name = connect.get("type"), connect.get("name")
    params = connect.get("parameters") or {}
    if kind == "struct":
        return pa.struct(
            [
                pa.field(f["field"], _arrow_type(f, f"{path}.{f['field']}"), nullable=bool(f.get("optional")))
                for f in connect.get("fields", [])
            ]
        )
    if kind == "array":
        return pa.list_(_arrow_type(connect["items"], f"{path}[]"))
    if kind == "map":
        if connect["keys"].get("type") != "string":
            raise ConnectSchemaError(f"{path}: a map with {connect['keys'].get('type')} keys has no Parquet form here")
        return pa.map_(pa.string(), _arrow_type(connect["values"], f"{path}{{}}"))
    if name == _DECIMAL:
        return pa.decimal128(int(params.get("connect.decimal.precision", 38)), int(params.get("scale", 0)))
    logical = {
        "org.apache.kafka.connect.data.Date": pa.date32(),
        "org.apache.kafka.connect.data.Time": pa.time32("ms"),
        "org.apache.kafka.connect.data.Timestamp": pa.timestamp("ms", tz="UTC"),
    }
    if name in logical:
        return logical[name]
    types = {
        "int8": pa.int32(),
        "int16": pa.int32(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float32": pa.float32(),
        "float64": pa.float64(),
        "boolean": pa.bool_(),
        "string": pa.string(),
        "bytes": pa.binary(),
    }
    if kind not in types:
        raise ConnectSchemaError(f"{path}: the Connect type {kind!r} has no Parquet form here")
    return types[kind]


def arrow_value(connect: dict[str, Any], value: Any) -> Any:
    """A JSON value of this Connect schema as pyarrow takes it for :func:`arrow_schema`'s types."""
    from datetime import UTC, date, datetime, timedelta
    from decimal import Decimal

    if value is None:
        return None
    kind, name = connect.get("type"), connect.get("name")
    if kind == "struct":
        return {f["field"]: arrow_value(f, value.get(f["field"])) for f in connect.get("fields", [])}
    if kind == "array":
        return [arrow_value(connect["items"], v) for v in value]
    if kind == "map":
        return [(k, arrow_value(connect["values"], v)) for k, v in value.items()]
    if name == _DECIMAL:
        unscaled = int.from_bytes(base64.b64decode(value), "big", signed=True)
        return Decimal(unscaled).scaleb(-int((connect.get("parameters") or {}).get("scale", 0)))
    if name == "org.apache.kafka.connect.data.Date":
        return date(1970, 1, 1) + timedelta(days=value)
    if name == "org.apache.kafka.connect.data.Time":
        return (datetime(1970, 1, 1) + timedelta(milliseconds=value)).time()
    if name == "org.apache.kafka.connect.data.Timestamp":
        return datetime.fromtimestamp(value / 1000, UTC)
    if kind == "bytes":
        return base64.b64decode(value)
    return value
