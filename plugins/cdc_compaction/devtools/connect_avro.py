"""Kafka Connect's JSON schemas as Avro schemas, and their JSON values as Avro datums.

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
