"""Our landing consumer: Kafka topics to hourly increment directories, as a user's file sink lands them.

No open-source Kafka Connect sink on Maven Central writes local files or S3 objects in an hourly
directory layout (Confluent's S3 sink is under the Confluent Community License and not on Maven
Central; Aiven's and Lenses' S3 sinks and the Camel file connector are not served there either),
so the Debezium stack lands through this small consumer (``confluent-kafka``), which keeps what
such a sink keeps:

* one directory per table and hour: ``<landing dir>/<prefix><hour>/`` (the registry's
  ``increments``: ``directory``, ``prefix``, ``time_format``); the hour is the record's Kafka
  timestamp in UTC (the S3 sink's ``TimeBasedPartitioner`` with ``timestamp.extractor=Record``);
* one JSON value per line, the bytes exactly as the ``JsonConverter`` produced them; a Kafka
  tombstone (a null value, after a delete) is the line ``null``;
* the Kafka partition and offset in the file name, as the S3 sink names its objects:
  ``<topic>+<partition>+<first offset, 10 digits>.json``.  The lines of a file are the records of
  consecutive offsets (a gap starts a new file), so line ``i`` (from 0) holds offset ``first + i``;
* each file is written under a hidden temporary name (``.<name>.tmp``, which the planner counts as
  a writer's temporary: :mod:`cdc_compaction.core.landing`) and renamed when complete, so a run
  never sees half a file;
* Kafka offsets are committed only after the files that hold them are renamed: at least once.  A
  consumer that dies before its commit lands the same records again, under the same names (the
  first offset is the same), never loses one.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cdc_compaction.core.exceptions import CdcCompactionError
from cdc_compaction.core.registry import TableConfig

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

    @classmethod
    def for_table(cls, cfg: TableConfig, topic: str) -> Route:
        """The route of ``topic`` into ``cfg``'s landing area (a local ``storage_root``)."""
        if "://" in cfg.storage_root:
            raise LandingError(
                f"table {cfg.database}.{cfg.table}: storage_root {cfg.storage_root} is not a local directory; "
                "the landing consumer writes local files only"
            )
        inc = cfg.increments
        return cls(topic, Path(cfg.storage_root) / inc.directory, inc.prefix, inc.time_format)

    def increment(self, timestamp_ms: int) -> str:
        """The increment directory name of a record with this Kafka timestamp."""
        hour = datetime.fromtimestamp(timestamp_ms / 1000, UTC).replace(minute=0, second=0, microsecond=0)
        return self.prefix + hour.strftime(self.time_format)


def file_name(topic: str, partition: int, first_offset: int) -> str:
    """``<topic>+<partition>+<first offset>.json``: where the file's records come from."""
    return f"{topic}+{partition}+{first_offset:0{OFFSET_WIDTH}d}.json"


def parse_file_name(name: str) -> tuple[str, int, int]:
    """(topic, partition, first offset) of a landed file's name."""
    stem = name.removesuffix(".json")
    topic, partition, offset = stem.rsplit("+", 2)
    return topic, int(partition), int(offset)


@dataclass
class _Batch:
    route: Route
    increment: str
    partition: int
    first: int
    lines: list[bytes]

    @property
    def next_offset(self) -> int:
        return self.first + len(self.lines)


def _line(topic: str, partition: int, offset: int, value: bytes | None) -> bytes:
    if value is None:
        return b"null"
    if b"\n" in value or b"\r" in value:
        raise LandingError(
            f"{topic} partition {partition} offset {offset}: the value holds a line break, so it cannot be one line "
            "of JSON; land this topic with the JsonConverter (it writes compact JSON)"
        )
    return value


def write_atomically(path: Path, lines: Iterable[bytes]) -> None:
    """Write ``lines`` to ``.<name>.tmp`` beside ``path``, flush it to disk, then rename it to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        for line in lines:
            f.write(line + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class LandingConsumer:
    """A Kafka consumer (group ``group_id``) that lands ``routes``' topics; :meth:`land` does one round."""

    def __init__(self, bootstrap_servers: str, routes: list[Route], group_id: str = "cdc-landing") -> None:
        from confluent_kafka import Consumer

        self.routes = {r.topic: r for r in routes}
        self.group_id = group_id
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": group_id,
                # Offsets are committed by land(), after the rename: never before a record is on disk.
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 2000,
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

    def land(self, max_records: int = 100_000, idle_s: float = 1.0) -> list[Path]:
        """Land what the topics hold now; return the files written (renamed into place), then commit."""
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, TopicPartition

        batches: list[_Batch] = []
        current: dict[tuple[str, int, str], _Batch] = {}
        ends: dict[tuple[str, int], int] = {}
        for msg in self._poll(max_records, idle_s):
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            route = self.routes[topic]
            kind, ts = msg.timestamp()
            if kind == TIMESTAMP_NOT_AVAILABLE:
                ts = int(datetime.now(UTC).timestamp() * 1000)
            increment = route.increment(ts)
            key = (topic, partition, increment)
            batch = current.get(key)
            if batch is None or batch.next_offset != offset:  # a gap in the offsets starts a new file
                batch = _Batch(route, increment, partition, offset, [])
                current[key] = batch
                batches.append(batch)
            batch.lines.append(_line(topic, partition, offset, msg.value()))
            ends[(topic, partition)] = max(ends.get((topic, partition), -1), offset + 1)
        written = []
        for b in batches:
            path = b.route.landing_dir / b.increment / file_name(b.route.topic, b.partition, b.first)
            write_atomically(path, b.lines)
            written.append(path)
        if ends:
            counts: dict[str, int] = defaultdict(int)
            for b in batches:
                counts[b.route.topic] += len(b.lines)
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(ends.items())], asynchronous=False
            )
            log.info("landed %s in %d files; committed offsets %s", dict(counts), len(written), ends)
        return written

    def close(self) -> None:
        """Leave the group (offsets stay committed where :meth:`land` put them)."""
        self._consumer.close()

    def __enter__(self) -> LandingConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
