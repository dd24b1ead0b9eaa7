"""Our landing consumer: Kafka topics to hourly increment directories, as a user's file sink lands them.

No open-source Kafka Connect sink on Maven Central writes local files or S3 objects in an hourly
directory layout (Confluent's S3 sink is under the Confluent Community License and not on Maven
Central; Aiven's and Lenses' S3 sinks and the Camel file connector are not served there either),
so the Debezium stack lands through this small consumer (``confluent-kafka``), which keeps what
such a sink keeps:

* one directory per table and hour: ``<landing dir>/<prefix><hour>/`` (the registry's
  ``increments``: ``directory``, ``prefix``, ``time_format``); the hour is the record's Kafka
  timestamp in UTC (the S3 sink's ``TimeBasedPartitioner`` with ``timestamp.extractor=Record``);
* ``format: json``: one JSON value per line, the bytes exactly as the ``JsonConverter`` produced them;
  a Kafka tombstone (a null value, after a delete) is the line ``null``.  File names
  ``<topic>+<partition>+<first offset, 10 digits>.json``, as the S3 sink names its objects; the
  lines of a file are the records of consecutive offsets (a gap starts a new file), so line ``i``
  (from 0) holds offset ``first + i``;
* ``format: avro``: Avro container files (``fastavro``), ``<topic>+<partition>+<first offset>.avro``,
  from the ``JsonConverter`` with ``schemas.enable=true``: the record's Connect schema becomes the
  file's Avro schema as Confluent's ``AvroData`` makes it (:mod:`cdc_compaction.devtools.connect_avro`),
  a new schema starts a new file (the S3 sink rotates so too), and tombstones are skipped and
  counted (an Avro file has no null record: the S3 sink's ``behavior.on.null.values=ignore``).  The
  records of a file are in offset order; a skipped tombstone leaves a gap;
* ``format: parquet``: Parquet files, ``<topic>+<partition>+<first offset>.parquet``, as the S3 sink's
  ``ParquetFormat`` writes them (through the same Avro schema, which the footer keeps under
  ``parquet.avro.schema``: :func:`cdc_compaction.devtools.connect_avro.arrow_schema`); schemas and
  tombstones as for Avro;
* ``wire: confluent`` (``format: avro``): records that a registry-aware Avro converter wrote in the
  Confluent wire format (magic byte 0, a 4-byte schema id, Avro binary; Apicurio's ``AvroConverter``
  with ``as-confluent``: :mod:`cdc_compaction.devtools.schema_registry`).  Each record's writer schema
  is fetched by its id from the schema registry's Confluent API (once per id), the record decoded with
  it, and the Avro file written **with that writer schema**, the registry's own, as the S3 sink's
  ``AvroFormat`` does; a new schema id starts a new file.  A record that cannot be decoded (not the
  wire format, an id the registry does not have, bytes that are not a record of that schema) is
  rejected: its bytes are kept in ``rejects_dir`` as ``<topic>+<partition>+<offset>.bin`` beside a
  ``.reason`` file saying why, it is counted (:attr:`LandingConsumer.rejected`), and the other records
  land; without a ``rejects_dir`` it stops the round, naming the record.  A registry that cannot be
  reached stops the round too (nothing is committed: the next round tries again);
* each file is written under a hidden temporary name (``.<name>.tmp``, which the planner counts as
  a writer's temporary: :mod:`cdc_compaction.core.landing`) and renamed when complete, so a run
  never sees half a file;
* Kafka offsets are committed only after the files that hold them are renamed: at least once.  A
  consumer that dies before its commit lands the same records again, under the same names (the
  first offset is the same), never loses one.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

from cdc_compaction.core.exceptions import CdcCompactionError
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.integrations.schema_registry import (
    ConfluentRegistry,
    SchemaNotFoundError,
    SchemaRegistryError,
    split_wire,
)

log = logging.getLogger(__name__)

#: Width of the zero-padded first offset in a file name (the S3 sink's ``filename.offset.zero.pad.width``).
OFFSET_WIDTH = 10


class LandingError(CdcCompactionError):
    """A record cannot be landed as a line of JSON, or the landing area cannot be written."""


@dataclass(frozen=True)
class Route:
    """Where one topic's records land: a table's landing directory and its increment names."""

    topic: str
    #: ``<storage_root>/<increments.directory>`` of the table.
    landing_dir: Path
    prefix: str = "increment_"
    time_format: str = "%Y%m%d%H"
    #: json: the converter's values as lines; avro, parquet: files of the records' schema (``schemas.enable=true``).
    format: Literal["json", "avro", "parquet"] = "json"
    #: How the topic's values are encoded: ``json`` (the JsonConverter) or ``confluent`` (the Confluent wire format
    #: of a registry-aware Avro converter; the consumer then needs the registry's URL, and lands ``format: avro``).
    wire: Literal["json", "confluent"] = "json"

    @classmethod
    def for_table(
        cls,
        cfg: TableConfig,
        topic: str,
        format: Literal["json", "avro", "parquet"] = "json",
        wire: Literal["json", "confluent"] = "json",
    ) -> Route:
        """The route of ``topic`` into ``cfg``'s landing area (a local ``storage_root``)."""
        if "://" in cfg.storage_root:
            raise LandingError(
                f"table {cfg.database}.{cfg.table}: storage_root {cfg.storage_root} is not a local directory; "
                "the landing consumer writes local files only"
            )
        inc = cfg.increments
        return cls(topic, Path(cfg.storage_root) / inc.directory, inc.prefix, inc.time_format, format, wire)

    def increment(self, timestamp_ms: int) -> str:
        """The increment directory name of a record with this Kafka timestamp."""
        hour = datetime.fromtimestamp(timestamp_ms / 1000, UTC).replace(minute=0, second=0, microsecond=0)
        return self.prefix + hour.strftime(self.time_format)


def file_name(topic: str, partition: int, first_offset: int, extension: str = "json") -> str:
    """``<topic>+<partition>+<first offset>.<extension>``: where the file's records come from."""
    return f"{topic}+{partition}+{first_offset:0{OFFSET_WIDTH}d}.{extension}"


def parse_file_name(name: str) -> tuple[str, int, int]:
    """(topic, partition, first offset) of a landed file's name."""
    stem = name.rsplit(".", 1)[0]
    topic, partition, offset = stem.rsplit("+", 2)
    return topic, int(partition), int(offset)


@dataclass
class _Batch:
    route: Route
    increment: str
    partition: int
    first: int
    #: The next offset a JSON file can take without a gap.
    next_offset: int
    #: JSON: the lines; Avro: the payloads of ``schema``.
    items: list[Any] = field(default_factory=list)
    #: The Connect schema of JSON-converted records, or ``("registry", id)`` for wire-format ones.
    schema: Any = None
    #: Wire format: the writer schema (the registry's, parsed) the file is written with.
    writer: Any = None


def _line(topic: str, partition: int, offset: int, value: bytes | None) -> bytes:
    if value is None:
        return b"null"
    if b"\n" in value or b"\r" in value:
        raise LandingError(
            f"{topic} partition {partition} offset {offset}: the value holds a line break, so it cannot be one line "
            "of JSON; land this topic with the JsonConverter (it writes compact JSON)"
        )
    return value


def _connect_record(topic: str, partition: int, offset: int, value: bytes) -> tuple[dict[str, Any], Any]:
    """(schema, payload) of a ``schemas.enable=true`` JsonConverter value, or a refusal saying what to set."""
    doc = json.loads(value)
    if not isinstance(doc, dict) or set(doc) != {"schema", "payload"}:
        raise LandingError(
            f"{topic} partition {partition} offset {offset}: Avro landing needs the Connect schema of each record; "
            "set the connector's value.converter.schemas.enable=true"
        )
    return doc["schema"], doc["payload"]


def write_atomically(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write with ``write`` to ``.<name>.tmp`` beside ``path``, flush it to disk, then rename it to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_lines(lines: list[bytes]) -> Callable[[IO[bytes]], None]:
    """A JSON file's writer: one value per line."""

    def write(f: IO[bytes]) -> None:
        for line in lines:
            f.write(line + b"\n")

    return write


def write_avro(schema: dict[str, Any], payloads: list[Any]) -> Callable[[IO[bytes]], None]:
    """An Avro container file's writer: the Connect schema's Avro form, the payloads as its records."""
    from fastavro import parse_schema, writer

    from cdc_compaction.devtools.connect_avro import avro_datum, avro_schema

    def write(f: IO[bytes]) -> None:
        writer(f, parse_schema(avro_schema(schema)), [avro_datum(schema, p) for p in payloads])

    return write


def write_registry_avro(writer_schema: Any, records: list[Any]) -> Callable[[IO[bytes]], None]:
    """An Avro container file's writer: the registry's writer schema as the file's, the decoded records as its own."""
    from fastavro import parse_schema, writer

    def write(f: IO[bytes]) -> None:
        writer(f, parse_schema(writer_schema), records)

    return write


def decode_wire(registry: ConfluentRegistry, value: bytes) -> tuple[int, Any, Any]:
    """(schema id, writer schema, record) of a Confluent wire-format value, decoded with the registry's schema.

    Raises :class:`~cdc_compaction.integrations.schema_registry.SchemaRegistryError` (a registry that
    cannot be read) or :class:`UndecodableRecordError` (this record can never be decoded), saying why.
    """
    import io

    from fastavro import parse_schema, schemaless_reader

    try:
        schema_id, body = split_wire(value)
    except SchemaRegistryError as exc:
        raise UndecodableRecordError(str(exc)) from exc
    try:
        writer_schema = registry.schema(schema_id)
    except SchemaNotFoundError as exc:
        raise UndecodableRecordError(f"schema id {schema_id} is not in the registry: {exc}") from exc
    buf = io.BytesIO(body)
    try:
        record = schemaless_reader(buf, parse_schema(writer_schema), None)
    except (EOFError, ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
        raise UndecodableRecordError(
            f"the {len(body)} bytes after the header are not an Avro record of schema id {schema_id}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if buf.tell() != len(body):
        raise UndecodableRecordError(
            f"schema id {schema_id} reads {buf.tell()} of the {len(body)} bytes after the header: the record was "
            "not written with that schema"
        )
    return schema_id, writer_schema, record


class UndecodableRecordError(LandingError):
    """A record that can never be decoded (not the wire format, an unknown schema id, not that schema's bytes)."""


def write_parquet(schema: dict[str, Any], payloads: list[Any]) -> Callable[[IO[bytes]], None]:
    """A Parquet file's writer: the columns parquet-avro writes for the Connect schema, the payloads as rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cdc_compaction.devtools.connect_avro import arrow_schema, arrow_value

    def write(f: IO[bytes]) -> None:
        table = pa.Table.from_pylist([arrow_value(schema, p) for p in payloads], schema=arrow_schema(schema))
        pq.write_table(table, f)

    return write


class LandingConsumer:
    """A Kafka consumer (group ``group_id``) that lands ``routes``' topics; :meth:`land` does one round."""

    def __init__(
        self,
        bootstrap_servers: str,
        routes: list[Route],
        group_id: str = "cdc-landing",
        *,
        schema_registry: str | None = None,
        rejects_dir: Path | None = None,
    ) -> None:
        """``schema_registry``: the Confluent API of the registry that ``wire: confluent`` routes need (e.g.
        Apicurio's ``http://host:port/apis/ccompat/v7``); ``rejects_dir``: where undecodable records are kept."""
        from confluent_kafka import Consumer

        self.routes = {r.topic: r for r in routes}
        self.group_id = group_id
        for r in routes:
            if r.wire == "confluent" and r.format != "avro":
                raise LandingError(
                    f"topic {r.topic}: the Confluent wire format lands as format avro (files of the registry's "
                    f"writer schema), not {r.format}; set the route's format to avro"
                )
            if r.wire == "confluent" and schema_registry is None:
                raise LandingError(
                    f"topic {r.topic}: its records are in the Confluent wire format, so their schemas are in a schema "
                    "registry: pass schema_registry (its Confluent API URL) to the landing consumer"
                )
        self.registry = ConfluentRegistry(schema_registry) if schema_registry else None
        self.rejects_dir = rejects_dir
        #: Records rejected by topic (undecodable; kept in rejects_dir), since this consumer started.
        self.rejected: dict[str, int] = defaultdict(int)
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": group_id,
                # Offsets are committed by land(), after the rename: never before a record is on disk.
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 2000,
                # A consumer that died leaves its partitions to the group's next member within 10 s
                # (Kafka's default: 45 s), and what it renamed without committing is landed again then.
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 1_000,
                # land() is called in rounds by its caller (a test compacts lakes between two rounds, minutes
                # under load): an hour between polls is not a stuck consumer. A dead one still leaves the group
                # after session.timeout.ms (its heartbeats stop); Kafka's default here is 5 minutes.
                "max.poll.interval.ms": 3_600_000,
                "client.id": f"cdc-landing-{os.getpid()}",
            }
        )
        self._consumer.subscribe(list(self.routes))

    def _poll(self, max_records: int, idle_s: float) -> list[Any]:
        """Messages until none came for ``idle_s`` or ``max_records`` were read."""
        from confluent_kafka import KafkaError

        messages: list[Any] = []
        while len(messages) < max_records:
            batch = self._consumer.consume(num_messages=min(1000, max_records - len(messages)), timeout=idle_s)
            if not batch:
                break
            for msg in batch:
                err = msg.error()
                if err is None:
                    messages.append(msg)
                elif err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    log.debug("topic not there yet: %s", err)  # the connector creates it with its first record
                else:
                    raise LandingError(f"consuming {sorted(self.routes)} failed: {err}")
        return messages

    def land(
        self,
        max_records: int = 100_000,
        idle_s: float = 1.0,
        after_rename: Callable[[list[Path]], None] | None = None,
    ) -> list[Path]:
        """Land what the topics hold now; return the files written (renamed into place), then commit.

        ``after_rename`` is called with the files once they are in place, before the offsets are
        committed (e.g. to write an increment's completion marker); if it raises, or the process
        dies there, nothing is committed and the records are landed again.
        """
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, TopicPartition

        batches: list[_Batch] = []
        current: dict[tuple[str, int, str], _Batch] = {}
        ends: dict[tuple[str, int], int] = {}
        tombstones: dict[str, int] = defaultdict(int)
        for msg in self._poll(max_records, idle_s):
            topic, partition, offset, value = msg.topic(), msg.partition(), msg.offset(), msg.value()
            ends[(topic, partition)] = max(ends.get((topic, partition), -1), offset + 1)
            route = self.routes[topic]
            kind, ts = msg.timestamp()
            if kind == TIMESTAMP_NOT_AVAILABLE:
                ts = int(datetime.now(UTC).timestamp() * 1000)
            increment = route.increment(ts)
            schema: dict[str, Any] | None = None
            if route.format == "json":
                item: Any = _line(topic, partition, offset, value)
            elif value is None:
                tombstones[topic] += 1  # an Avro or Parquet file has no null record: skipped, its offset committed
                continue
            elif route.wire == "confluent":
                assert self.registry is not None  # __init__ refuses a wire-format route without one
                try:
                    schema_id, writer_schema, item = decode_wire(self.registry, value)
                except UndecodableRecordError as exc:
                    self._reject(topic, partition, offset, value, str(exc))
                    continue
                except SchemaRegistryError as exc:
                    raise LandingError(
                        f"{topic} partition {partition} offset {offset}: {exc}; nothing of this round is committed"
                    ) from exc
                schema = ("registry", schema_id)
            else:
                schema, item = _connect_record(topic, partition, offset, value)
            key = (topic, partition, increment)
            batch = current.get(key)
            if (
                batch is None
                or (route.format == "json" and batch.next_offset != offset)  # a gap starts a new JSON file
                or batch.schema != schema  # a new schema starts a new Avro or Parquet file
            ):
                batch = _Batch(route, increment, partition, offset, offset, schema=schema)
                if route.wire == "confluent":
                    batch.writer = writer_schema
                current[key] = batch
                batches.append(batch)
            batch.items.append(item)
            batch.next_offset = offset + 1
        written = []
        for b in batches:
            name = file_name(b.route.topic, b.partition, b.first, b.route.format)
            path = b.route.landing_dir / b.increment / name
            if b.schema is None:
                write_atomically(path, write_lines(b.items))
            elif b.writer is not None:
                write_atomically(path, write_registry_avro(b.writer, b.items))
            elif b.route.format == "avro":
                write_atomically(path, write_avro(b.schema, b.items))
            else:
                write_atomically(path, write_parquet(b.schema, b.items))
            written.append(path)
        if after_rename is not None:
            after_rename(written)
        if ends:
            counts: dict[str, int] = defaultdict(int)
            for b in batches:
                counts[b.route.topic] += len(b.items)
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(ends.items())], asynchronous=False
            )
            log.info(
                "landed %s in %d files (tombstones skipped: %s); committed offsets %s",
                dict(counts),
                len(written),
                dict(tombstones),
                ends,
            )
        return written

    def _reject(self, topic: str, partition: int, offset: int, value: bytes, reason: str) -> None:
        """Keep an undecodable record and its reason in ``rejects_dir`` and count it; without one, refuse it."""
        where = f"{topic} partition {partition} offset {offset}"
        if self.rejects_dir is None:
            raise UndecodableRecordError(
                f"{where} cannot be decoded: {reason}. Give the landing consumer a rejects_dir to keep such records "
                "aside and land the others, or fix the producer's converter"
            )
        stem = file_name(topic, partition, offset, "bin")
        write_atomically(self.rejects_dir / stem, lambda f: f.write(value))
        write_atomically(self.rejects_dir / (stem + ".reason"), lambda f: f.write((reason + "\n").encode()))
        self.rejected[topic] += 1
        log.warning("%s rejected (kept in %s): %s", where, self.rejects_dir / stem, reason)

    def close(self) -> None:
        """Leave the group (offsets stay committed where :meth:`land` put them)."""
        self._consumer.close()

    def __enter__(self) -> LandingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
