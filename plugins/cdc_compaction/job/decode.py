"""Reading the landed change files, in the forms a Debezium deployment lands them (docs/concepts.md#input-formats).

Every table mode reads its increments through :func:`read_events`.  Flattened Parquet (what the
source presets always took) is read by Spark as before.  The other forms are decoded here, one
file per task, into the same rows:

* ``format``: ``parquet``, ``json`` (JSON Lines: one Kafka record value per line as Kafka Connect's
  JsonConverter wrote it -- ``{"schema": ..., "payload": ...}`` with ``schemas.enable``, else the bare
  payload; a Kafka tombstone is the line ``null``) or ``avro`` (Avro container files);
* ``envelope``: ``flattened`` (each record is the row, as ``ExtractNewRecordState`` writes it) or
  ``debezium`` (Debezium's envelope: ``before``, ``after``, ``source``, ``op``, ``ts_ms``,
  ``transaction``), mapped to the row ``ExtractNewRecordState`` with ``delete.handling.mode=rewrite``
  and ``add.fields`` would give: ``after`` (``before`` for a delete, with ``__deleted`` ``true``),
  ``__op``, ``__ts_ms``, ``__<source field>`` (``__lsn``, ``__txId``, ``__snapshot``, ``__file``, ...),
  ``__source_<field>``, ``__transaction_<field>`` and ``__kafka_topic``/``__kafka_partition``/
  ``__kafka_offset`` from a sink's ``<topic>+<partition>+<first offset>`` file name.

Debezium's logical types are decoded from the record's schema where the file carries one (JSON
with schemas, Avro), else from the registry's type and its ``decimal_handling`` /
``time_precision`` (the connector's ``decimal.handling.mode`` / ``time.precision.mode``).  Kafka
tombstones, heartbeats, transaction-metadata records (BEGIN/END) and truncate/message events are
counted by kind and skipped; a record that cannot be decoded into the registry's columns becomes
a row with the reason in ``_cdc_decode_reason``, which the modes put first among the reasons a row
is refused (:func:`classify`), so it goes to quarantine with its file and line (``_cdc_pos``: the
line number for JSON, the record's index for Avro and Parquet) and the other records compact.

Standard library, PySpark and pyarrow only, like the rest of the job package.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from cdc_compaction.job import avro_container
from cdc_compaction.job.contract import Plan
from cdc_compaction.job.record_schema import (
    AVRO_LOGICAL,
    CONNECT_DECIMAL,
    DATE_DAYS,
    TIME_UNITS,
    TIMESTAMP_UNITS,
)

#: The registry's ``format`` and ``envelope`` values (and their defaults, for plans that name none).
FORMATS = ("parquet", "json", "avro")
ENVELOPES = ("flattened", "debezium")
DECIMAL_HANDLING = ("precise", "double", "string")
TIME_PRECISION = ("adaptive", "adaptive_time_microseconds", "connect")

#: What is counted and skipped, never compacted (the stats' ``skipped_by_kind``).
SKIP_KINDS = ("tombstone", "heartbeat", "transaction", "truncate", "message")
#: The decoder's own columns after the registry's and the provenance.
DECODE_REASON = "_cdc_decode_reason"
SKIP_COLUMN = "_cdc_skip"
#: Debezium's operation codes of data change events (create, update, delete, read = snapshot).
DATA_OPS = ("c", "u", "d", "r")
#: Rows per Arrow batch a decoding task hands back to Spark.
BATCH_ROWS = 4096

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DAY = date(1970, 1, 1)
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_INT_RANGES = {
    "tinyint": 2**7,
    "smallint": 2**15,
    "int": 2**31,
    "bigint": 2**63,
}
#: The PostgreSQL source position the decoder derives where a record does not carry the column itself
#: (:func:`source_position`): the commit position and the ordinal among the events at one LSN. Flattened
#: Parquet is read by Spark as it is (:attr:`Spec.spark_reads_it`): there the sink must write them.
POSITION_COLUMNS = ("__commit_lsn", "__row")
HEARTBEAT_SCHEMA = "io.debezium.connector.common.Heartbeat"
TRANSACTION_SCHEMA = "io.debezium.connector.common.TransactionMetadataValue"


class DecodeError(ValueError):
    """A record that does not fit the registry's columns: the message is the quarantine's reason."""


@dataclass(frozen=True)
class Semantic:
    """What a field's schema says about its value: Connect's semantic type name and a decimal's scale."""

    name: str | None = None
    scale: int | None = None


@dataclass(frozen=True)
class Spec:
    """What decoding a table's files needs: the plan's input settings and the registry's columns.

    ``columns``: (name, Spark type as ``DataType.simpleString()``: ``bigint``, ``decimal(10,2)``, ...).
    """

    format: str = "parquet"
    envelope: str = "flattened"
    decimal_handling: str = "precise"
    time_precision: str = "adaptive"
    columns: tuple[tuple[str, str], ...] = ()
    #: keyless tables: (before-image column, its data column), from the envelope's ``before``.
    before: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of_plan(cls, plan: Plan, columns: Sequence[tuple[str, str]]) -> Spec:
        return cls(
            format=plan.input_format or "parquet",
            envelope=plan.envelope or "flattened",
            decimal_handling=plan.decimal_handling or "precise",
            time_precision=plan.time_precision or "adaptive",
            columns=tuple(columns),
            before=tuple(zip(plan.before_columns or (), plan.data_columns or (), strict=False)),
        )

    @property
    def spark_reads_it(self) -> bool:
        """Flattened Parquet: Spark reads it as it always did (no Python decoding, nothing derived)."""
        return self.format == "parquet" and self.envelope == "flattened"


@dataclass
class Decoded:
    """One record of a file: its position, and its row, or why it is skipped or refused."""

    pos: int
    row: dict[str, Any] | None = None
    reason: str | None = None
    skip: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ values
def _unscaled(raw: Any) -> int:
    """A Connect Decimal's unscaled value: big-endian two's-complement bytes (base64 text in JSON)."""
    if isinstance(raw, str):
        try:
            raw = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise DecodeError("not base64 (decimal.handling.mode=precise writes a decimal as base64 bytes)") from exc
    if not isinstance(raw, bytes | bytearray):
        raise DecodeError(f"a {type(raw).__name__} where precise decimal bytes were expected")
    return int.from_bytes(raw, "big", signed=True)


def _to_decimal(value: Any, sem: Semantic, spec: Spec, precision: int, scale: int) -> Decimal:
    if isinstance(value, dict) and "value" in value and "scale" in value:  # VariableScaleDecimal
        number = Decimal(_unscaled(value["value"])).scaleb(-int(value["scale"]))
    elif isinstance(value, Decimal):
        number = value
    elif isinstance(value, bool):
        raise DecodeError("a boolean where a decimal was expected")
    elif isinstance(value, int | float):
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    elif isinstance(value, bytes | bytearray) or (
        isinstance(value, str)
        and (sem.name == CONNECT_DECIMAL or (sem.name is None and spec.decimal_handling == "precise"))
    ):
        number = Decimal(_unscaled(value)).scaleb(-(scale if sem.scale is None else sem.scale))
    elif isinstance(value, str):
        try:
            number = Decimal(value)
        except InvalidOperation as exc:
            raise DecodeError("not a decimal number") from exc
    else:
        raise DecodeError(f"a {type(value).__name__} where a decimal was expected")
    if not number.is_finite():
        raise DecodeError(f"{number} does not fit decimal({precision},{scale})")
    try:
        fitted = number.quantize(Decimal(1).scaleb(-scale))
    except InvalidOperation as exc:
        raise DecodeError(f"does not fit decimal({precision},{scale})") from exc
    if fitted != number:
        raise DecodeError(f"has more than {scale} decimal places: does not fit decimal({precision},{scale})")
    if len(fitted.as_tuple().digits) > precision and fitted != 0:
        raise DecodeError(f"has more than {precision} digits: does not fit decimal({precision},{scale})")
    return fitted


def _scaled(value: int, unit: int) -> int:
    """Microseconds from a count of ``unit`` (1000: ms; 1: us; -1000: ns, truncated toward the past)."""
    return value * unit if unit > 0 else value // -unit


def _parse_iso(value: str) -> datetime:
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    # Python before 3.11 took at most 6 fraction digits; Debezium writes up to 9 (nanoseconds): cut them.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise DecodeError("not an ISO-8601 timestamp") from exc
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _timestamp_unit(sem: Semantic, spec: Spec) -> int:
    """Microseconds per unit of an integer timestamp: the schema's semantic type, else the registry's mode."""
    if sem.name in TIMESTAMP_UNITS:
        return TIMESTAMP_UNITS[sem.name]
    # No schema: adaptive modes write MicroTimestamp for TIMESTAMP(4-6) (PostgreSQL's default precision,
    # 6), connect mode Kafka Connect's Timestamp in milliseconds.
    return 1_000 if spec.time_precision == "connect" else 1


def _to_timestamp(value: Any, sem: Semantic, spec: Spec) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, bool):
        raise DecodeError("a boolean where a timestamp was expected")
    if isinstance(value, int):
        try:
            return _EPOCH + timedelta(microseconds=_scaled(value, _timestamp_unit(sem, spec)))
        except OverflowError as exc:
            raise DecodeError("out of the timestamp range") from exc
    if isinstance(value, str):
        return _parse_iso(value)
    raise DecodeError(f"a {type(value).__name__} where a timestamp was expected")


def _to_date(value: Any, sem: Semantic) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, bool):
        raise DecodeError("a boolean where a date was expected")
    if isinstance(value, int):
        try:
            if sem.name in TIMESTAMP_UNITS:  # a timestamp into a date column: its UTC day
                return (_EPOCH + timedelta(microseconds=_scaled(value, TIMESTAMP_UNITS[sem.name]))).date()
            return _EPOCH_DAY + timedelta(days=value)  # io.debezium.time.Date, Connect Date: days since the epoch
        except OverflowError as exc:
            raise DecodeError("out of the date range") from exc
    if isinstance(value, str):
        try:
            return date.fromisoformat(value.strip()[:10])
        except ValueError as exc:
            raise DecodeError("not an ISO-8601 date") from exc
    raise DecodeError(f"a {type(value).__name__} where a date was expected")


def _time_text(value: int, unit: int) -> str:
    micros = _scaled(value, unit)
    if not 0 <= micros < 86_400_000_000:
        raise DecodeError("not a time of day")
    t = (datetime.min + timedelta(microseconds=micros)).time()
    return time(t.hour, t.minute, t.second, t.microsecond).isoformat()


def _to_text(value: Any, sem: Semantic, spec: Spec) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and sem.name in TIME_UNITS:
        return _time_text(value, TIME_UNITS[sem.name])
    if isinstance(value, int) and sem.name in TIMESTAMP_UNITS:
        return _to_timestamp(value, sem, spec).isoformat().replace("+00:00", "Z")
    if isinstance(value, int) and sem.name in DATE_DAYS:
        return _to_date(value, sem).isoformat()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    return json.dumps(value, sort_keys=True, default=str)


def convert(value: Any, kind: str, sem: Semantic, spec: Spec) -> Any:
    """``value`` as the registry's column type ``kind`` (a Spark simple string); raises :class:`DecodeError`."""
    if value is None:
        return None
    m = _DECIMAL.match(kind)
    if m:
        return _to_decimal(value, sem, spec, int(m.group(1)), int(m.group(2)))
    if kind in _INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise DecodeError(f"a {type(value).__name__} where {kind} was expected")
        bound = _INT_RANGES[kind]
        if not -bound <= value < bound:
            raise DecodeError(f"{value} does not fit {kind}")
        return value
    if kind in ("double", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
            if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
                return float(value)
            raise DecodeError(f"a {type(value).__name__} where {kind} was expected")
        return float(value)
    if kind == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise DecodeError(f"a {type(value).__name__} where a boolean was expected")
    if kind in ("timestamp", "timestamp_ntz"):
        stamp = _to_timestamp(value, sem, spec)
        return stamp.replace(tzinfo=None) if kind == "timestamp_ntz" else stamp
    if kind == "date":
        return _to_date(value, sem)
    if kind == "string":
        return _to_text(value, sem, spec)
    if kind == "binary":
        if isinstance(value, bytes | bytearray):
            return bytes(value)
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise DecodeError("not base64 (JsonConverter writes bytes as base64)") from exc
        raise DecodeError(f"a {type(value).__name__} where binary was expected")
    return value  # arrays, maps, structs: as the record holds them


# ------------------------------------------------------------------ schemas
def connect_semantics(schema: Any) -> dict[str, Semantic]:
    """Field name -> :class:`Semantic` of a Kafka Connect struct schema (JsonConverter's ``schema``)."""
    out: dict[str, Semantic] = {}
    for f in (schema or {}).get("fields") or []:
        params = f.get("parameters") or {}
        scale = params.get("scale")
        out[str(f.get("field"))] = Semantic(f.get("name"), int(scale) if scale is not None else None)
    return out


def _avro_type(t: Any, schema: avro_container.Schema) -> Any:
    t = schema.resolve(t)
    if isinstance(t, list):
        branches = [b for b in t if b != "null"]
        return schema.resolve(branches[0]) if len(branches) == 1 else None
    return t


def avro_semantics(record_type: Any, schema: avro_container.Schema) -> dict[str, Semantic]:
    """Field name -> :class:`Semantic` of an Avro record schema (``connect.name``, ``logicalType``, scale)."""
    out: dict[str, Semantic] = {}
    t = _avro_type(record_type, schema)
    if not isinstance(t, dict):
        return out
    for f in t.get("fields") or []:
        ft = _avro_type(f.get("type"), schema)
        if not isinstance(ft, dict):
            out[str(f["name"])] = Semantic()
            continue
        name = ft.get("connect.name") or AVRO_LOGICAL.get(str(ft.get("logicalType")))
        scale = ft.get("scale", (ft.get("connect.parameters") or {}).get("scale"))
        out[str(f["name"])] = Semantic(name, int(scale) if scale is not None else None)
    return out


def _avro_field(record_type: Any, name: str, schema: avro_container.Schema) -> Any:
    """The type of field ``name`` of an Avro record type (None if it has none)."""
    t = _avro_type(record_type, schema)
    fields = t.get("fields") or [] if isinstance(t, dict) else []
    return next((f.get("type") for f in fields if f.get("name") == name), None)


def _connect_field(schema: Any, name: str) -> Any:
    return next((f for f in (schema or {}).get("fields") or [] if f.get("field") == name), None)


# ------------------------------------------------------------------ records
@dataclass
class _Kafka:
    """Where a sink's file name says its records came from: ``<topic>+<partition>+<first offset>.<ext>``."""

    topic: str | None = None
    partition: int | None = None
    first_offset: int | None = None

    @classmethod
    def of(cls, file_name: str) -> _Kafka:
        parts = file_name.rsplit(".", 1)[0].rsplit("+", 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            return cls(parts[0], int(parts[1]), int(parts[2]))
        return cls()


def _skip_kind(payload: Any, schema_name: str | None) -> str | None:
    """Which kind of record that is not a row change ``payload`` is, if any."""
    if payload is None:
        return "tombstone"
    if schema_name == HEARTBEAT_SCHEMA or (schema_name or "").endswith(".Heartbeat"):
        return "heartbeat"
    if schema_name == TRANSACTION_SCHEMA:
        return "transaction"
    if isinstance(payload, dict):
        keys = set(payload)
        if keys == {"ts_ms"}:
            return "heartbeat"
        if payload.get("status") in ("BEGIN", "END") and "id" in keys and "op" not in keys:
            return "transaction"
    return None


def _lsn(value: Any) -> int | None:
    """An LSN as Debezium writes it (a number, or its decimal text in ``source.sequence``); None if absent."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise DecodeError(f"LSN {value!r} is not a number") from None


def source_position(name: str, sequence: Any, lsn: Any, op: Any, kafka_offset: int | None) -> int | None:
    """``__commit_lsn`` or ``__row`` of a Debezium PostgreSQL event, from what survives a re-delivery.

    A Connect worker that is killed re-sends what it sent since its last offset commit, under new
    Kafka offsets but with the same ``source`` block.  ``source.sequence`` is the JSON text
    ``["<lastCommitLsn>", "<lsn>"]``: the end LSN of the last commit the connector delivered before
    this event's transaction (the same for every event of a transaction, never decreasing in the
    order the connector delivers, which is commit order) and the change's own LSN.

    * ``__commit_lsn``: that first LSN; where it is null (the connector has delivered no commit since
      it started without a committed position): 0 for a snapshot read (op ``r``: before everything
      streamed), else the change's own LSN (the first transaction streamed: below its commit's end,
      which the next transaction carries).
    * ``__row``: 0 for a change; for a snapshot read (every row of a snapshot carries one LSN) its
      Kafka offset, which numbers the snapshot's rows in order (None without one: the row is refused
      with ``null_event_id:__row``). A snapshot is re-sent only by a snapshot run again, at a new LSN.
    """
    if name == "__row":
        return kafka_offset if op == "r" else 0
    first = None
    if sequence is not None:
        try:
            pair = json.loads(sequence) if isinstance(sequence, str) else sequence
        except json.JSONDecodeError:
            raise DecodeError(f"source.sequence {sequence!r} is not a JSON array") from None
        if not isinstance(pair, list) or len(pair) != 2:
            raise DecodeError(f"source.sequence {sequence!r} is not a JSON array of two LSNs")
        first = _lsn(pair[0])
        lsn = lsn if lsn is not None else pair[1]
    if first is not None:
        return first
    return 0 if op == "r" else _lsn(lsn)


def _flattened_position(name: str, data: Mapping[str, Any], kafka: _Kafka, index: int) -> int | None:
    """:func:`source_position` of a flattened JSON or Avro record (``add.fields=op,lsn,sequence``, the Kafka offset)."""
    lower = {k.lower(): v for k, v in data.items()}
    offset = lower.get("__kafka_offset")
    if offset is None and kafka.first_offset is not None:
        offset = kafka.first_offset + index
    if "__sequence" not in lower and "__source_sequence" not in lower and name == "__commit_lsn":
        raise DecodeError(
            "the record has no __sequence (ExtractNewRecordState add.fields=sequence): __commit_lsn cannot be derived"
        )
    sequence = lower.get("__sequence", lower.get("__source_sequence"))
    return source_position(name, sequence, lower.get("__lsn"), lower.get("__op"), offset)


def _meta_value(name: str, env: Mapping[str, Any], kafka: _Kafka, index: int) -> tuple[bool, Any]:
    """(found, value) of an ``add.fields`` column ``__<...>`` from the envelope, its source, or the file name."""
    field_name = name[2:]
    lower = field_name.lower()
    source = env.get("source") if isinstance(env.get("source"), dict) else {}
    txn = env.get("transaction") if isinstance(env.get("transaction"), dict) else {}
    if lower == "deleted":
        return True, "true" if env.get("op") == "d" else "false"
    if lower == "kafka_topic":
        return True, kafka.topic
    if lower == "kafka_partition":
        return True, kafka.partition
    if lower == "kafka_offset":
        return True, None if kafka.first_offset is None else kafka.first_offset + index
    for prefix, struct in (("source_", source), ("transaction_", txn)):
        if lower.startswith(prefix):
            rest = lower[len(prefix) :]
            hit = next((k for k in struct if k.lower() == rest), None)
            return (True, struct[hit]) if hit is not None else (False, None)
    if lower in ("op", "ts_ms", "ts_us", "ts_ns"):
        return True, env.get(lower)
    hit = next((k for k in source if k.lower() == lower), None)
    if hit is not None:
        return True, source[hit]
    if name.lower() in POSITION_COLUMNS:
        # Not a field of the source block (MySQL's has a row): the PostgreSQL position, derived.
        offset = None if kafka.first_offset is None else kafka.first_offset + index
        return True, source_position(name.lower(), source.get("sequence"), source.get("lsn"), env.get("op"), offset)
    top = next((k for k in env if k.lower() == lower and k not in ("before", "after", "source", "transaction")), None)
    return (True, env[top]) if top is not None else (False, None)


def record_row(
    payload: Any,
    spec: Spec,
    semantics: Mapping[str, Semantic],
    kafka: _Kafka,
    index: int,
) -> dict[str, Any]:
    """The registry row of one record (an envelope or a flattened row); raises :class:`DecodeError`."""
    if not isinstance(payload, dict):
        raise DecodeError(f"a JSON {type(payload).__name__}, not a record")
    if spec.envelope == "debezium":
        op = payload.get("op")
        if op not in DATA_OPS:
            raise DecodeError(f"envelope op {op!r} is none of {', '.join(DATA_OPS)}")
        data = payload.get("before" if op == "d" else "after")
        if not isinstance(data, dict):
            side = "before" if op == "d" else "after"
            hint = " (set the table's REPLICA IDENTITY so deletes carry the key)" if op == "d" else ""
            raise DecodeError(f"op {op!r} without a {side!r} image{hint}")
        env: Mapping[str, Any] = payload
    else:
        data, env = payload, {}
    row: dict[str, Any] = {}
    before_of = dict(spec.before) if spec.envelope == "debezium" else {}
    before = payload.get("before") if before_of else None
    for name, kind in spec.columns:
        if name in before_of:
            # A keyless table's before-image column: the envelope's before image (REPLICA IDENTITY FULL).
            source_name = before_of[name]
            value = before.get(source_name) if isinstance(before, dict) else None
            sem = semantics.get(source_name, Semantic())
        elif name in data:
            value, sem = data[name], semantics.get(name, Semantic())
        elif spec.envelope == "debezium" and name.startswith("__"):
            _, value = _meta_value(name, env, kafka, index)
            sem = Semantic()
        elif name.lower() in {k.lower() for k in data}:
            hit = next(k for k in data if k.lower() == name.lower())
            value, sem = data[hit], semantics.get(hit, Semantic())
        elif name.lower() in ("__kafka_topic", "__kafka_partition", "__kafka_offset"):
            _, value = _meta_value(name, env, kafka, index)
            sem = Semantic()
        elif name.lower() in POSITION_COLUMNS:
            # A flattened record that does not carry its position: derived from what it does carry.
            value, sem = _flattened_position(name.lower(), data, kafka, index), Semantic()
        else:
            value, sem = None, Semantic()
        try:
            row[name] = convert(value, kind, sem, spec)
        except DecodeError as exc:
            raise DecodeError(f"column {name!r} ({kind}): {exc}") from None
    return row


def _json_records(content: bytes) -> Iterator[tuple[int, Any, Any, str | None]]:
    """(line number, payload, Connect schema or None, problem) of each non-empty line."""
    for number, raw in enumerate(content.split(b"\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            yield number, None, None, f"not JSON ({exc.__class__.__name__}: {str(exc)[:80]})"
            continue
        if isinstance(value, dict) and set(value) == {"schema", "payload"}:
            yield number, value["payload"], value["schema"], None
        else:
            yield number, value, None, None


def decode_file(content: bytes, file_name: str, spec: Spec) -> Iterator[Decoded]:
    """Every record of one landed file, decoded per ``spec`` (see the module's docstring)."""
    kafka = _Kafka.of(file_name)
    if spec.format == "json":
        index = 0
        for number, payload, schema, problem in _json_records(content):
            here = index
            index += 1
            if problem is not None:
                yield Decoded(number, reason=f"undecodable record: {problem}")
                continue
            yield _one(number, here, payload, schema, spec, kafka, _connect_semantics_of(schema, payload, spec))
    elif spec.format == "avro":
        try:
            schema, records = avro_container.read(content)
        except avro_container.AvroError as exc:
            raise DecodeError(f"{file_name}: {exc}") from exc
        root = schema.root
        name = _avro_name(root, schema)
        if spec.envelope == "debezium":
            sems = {**avro_semantics(_avro_field(root, "before", schema), schema)}
            sems.update(avro_semantics(_avro_field(root, "after", schema), schema))
        else:
            sems = avro_semantics(root, schema)
        for i, record in enumerate(records):
            yield _one(i, i, record, {"name": name}, spec, kafka, sems)
    elif spec.format == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(content))
        for i, record in enumerate(table.to_pylist()):
            yield _one(i, i, record, None, spec, kafka, {})
    else:
        raise DecodeError(f"unknown format {spec.format!r} (one of {', '.join(FORMATS)})")


def _avro_name(root: Any, schema: avro_container.Schema) -> str | None:
    t = _avro_type(root, schema)
    if not isinstance(t, dict):
        return None
    return t.get("connect.name") or (f"{t['namespace']}.{t['name']}" if t.get("namespace") else t.get("name"))


def _connect_semantics_of(schema: Any, payload: Any, spec: Spec) -> dict[str, Semantic]:
    if not isinstance(schema, dict):
        return {}
    if spec.envelope != "debezium":
        return connect_semantics(schema)
    sems: dict[str, Semantic] = {}
    for side in ("before", "after"):
        sems.update(connect_semantics(_connect_field(schema, side)))
    return sems


def _one(
    pos: int,
    index: int,
    payload: Any,
    schema: Any,
    spec: Spec,
    kafka: _Kafka,
    semantics: Mapping[str, Semantic],
) -> Decoded:
    name = schema.get("name") if isinstance(schema, dict) else None
    skip = _skip_kind(payload, name)
    if skip is None and spec.envelope == "debezium" and isinstance(payload, dict):
        op = payload.get("op")
        if op == "t":
            skip = "truncate"
        elif op == "m":
            skip = "message"
    if skip is not None:
        return Decoded(pos, skip=skip)
    try:
        return Decoded(pos, row=record_row(payload, spec, semantics, kafka, index))
    except DecodeError as exc:
        return Decoded(pos, reason=f"undecodable record: {exc}")


# ------------------------------------------------------------------ Spark
def _decoder(spec: Spec, arrow_schema: Any) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The mapInArrow function: binaryFile rows (content, path, name) -> the decoded rows as Arrow batches."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        def flush(rows: list[dict[str, Any]]) -> Any:
            return pa.RecordBatch.from_pylist(rows, schema=arrow_schema)

        for batch in batches:
            cols = batch.to_pydict()
            for content, path, fname in zip(cols["content"], cols["path"], cols["name"], strict=True):
                increment = path.rstrip("/").split("/")[-2]
                empty = dict.fromkeys((n for n, _ in spec.columns), None)
                rows: list[dict[str, Any]] = []
                for d in decode_file(content, fname, spec):
                    rows.append(
                        {
                            **(d.row if d.row is not None else empty),
                            "_cdc_increment": increment,
                            "_cdc_file": fname,
                            "_cdc_pos": d.pos,
                            DECODE_REASON: d.reason,
                            SKIP_COLUMN: d.skip,
                        }
                    )
                    if len(rows) >= BATCH_ROWS:
                        yield flush(rows)
                        rows = []
                if rows:
                    yield flush(rows)

    return run


@dataclass
class Events:
    """The planned files' records as rows: registry columns, provenance and (decoded forms) ``_cdc_decode_reason``.

    ``skipped()`` counts the records skipped by kind, observed on the first action over ``frame``: make
    that one read every record (a grouped count, :func:`rejected_by_file`), not a filtered part of them.
    """

    frame: Any
    skipped: Callable[[], dict[str, int]]


def read_events(spark: Any, plan: Plan, columns: Sequence[str]) -> Events:
    """The planned increments' events, whatever form they landed in (registry ``format``/``envelope``).

    Flattened Parquet is read by Spark directly, the rows' position being the file's row index;
    every other form is decoded by :func:`decode_file`, one file per task.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
    from pyspark.sql.pandas.types import to_arrow_schema

    from cdc_compaction.job.common import observed, with_provenance

    schema = spark.createDataFrame([], plan.schema_ddl).schema
    spec = Spec.of_plan(plan, [(f.name, f.dataType.simpleString()) for f in schema.fields])
    paths = [f.path for f in plan.files]
    if spec.spark_reads_it:
        raw = spark.read.schema(plan.schema_ddl).parquet(*paths)
        # No _cdc_decode_reason: the rows are exactly what the modes always read (classify takes either).
        return Events(with_provenance(raw, list(columns)), lambda: {})
    out_ddl = f"{plan.schema_ddl}, `_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint, "
    out_ddl += f"`{DECODE_REASON}` string, `{SKIP_COLUMN}` string"
    out_schema = spark.createDataFrame([], out_ddl).schema
    # Timestamps as instants (UTC): Spark takes an Arrow timestamp with a zone as the instant it is.
    arrow_schema = to_arrow_schema(out_schema, timezone="UTC")
    files = spark.read.format("binaryFile").load(paths)
    files = files.select(
        "content", F.col("_metadata.file_path").alias("path"), F.col("_metadata.file_name").alias("name")
    )
    decoded = files.mapInArrow(_decoder(spec, arrow_schema), out_schema)
    obs = Observation("cdc_compaction_skipped")
    skip = F.col(SKIP_COLUMN)
    decoded = decoded.observe(obs, *[F.sum(F.when(skip == k, 1).otherwise(0)).alias(k) for k in SKIP_KINDS])
    frame = decoded.filter(skip.isNull()).select(
        *[F.col(f"`{c}`") for c in columns], "_cdc_increment", "_cdc_file", "_cdc_pos", DECODE_REASON
    )
    return Events(frame, lambda: {k: n for k in SKIP_KINDS if (n := observed(obs, k))})


def classify(events: Any, reject_reason_sql: str) -> Any:
    """``_cdc_reject_reason``: the decoder's reason first (where ``events`` has one), else the mode's rule.

    ``_cdc_decode_reason`` is dropped: the classified rows have the columns they always had.
    """
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    reason = F.expr(reject_reason_sql)
    if DECODE_REASON not in events.columns:
        return events.withColumn("_cdc_reject_reason", reason)
    return events.withColumn("_cdc_reject_reason", F.coalesce(F.col(DECODE_REASON), reason)).drop(DECODE_REASON)


def rejected_by_file(classified: Any) -> dict[str, int]:
    """Refused rows by ``<increment>/<file>``, counted in one pass over every record of ``classified``.

    Every record: :meth:`Events.skipped` is observed on the first action over the events, and an
    action that reads only some (a filter for the refused rows first) would leave the skipped uncounted.
    """
    by_file: dict[str, int] = {}
    for r in classified.groupBy("_cdc_reject_reason", "_cdc_increment", "_cdc_file").count().collect():
        if r["_cdc_reject_reason"] is not None:
            where = f"{r['_cdc_increment']}/{r['_cdc_file']}"
            by_file[where] = by_file.get(where, 0) + int(r["count"])
    return by_file


def skipped_stats(plan: Plan, skipped: Mapping[str, int]) -> dict[str, Any]:
    """The stats' ``skipped_records`` and ``skipped_by_kind``; none for flattened Parquet (nothing is skipped)."""
    if Spec.of_plan(plan, []).spark_reads_it:
        return {}
    return {"skipped_records": sum(skipped.values()), "skipped_by_kind": dict(skipped)}
