"""Avro object container files (the Avro specification, "Object Container Files"), read in pure Python.

The job reads the Avro files a Kafka Connect sink lands (each record a Kafka record value as
Confluent's or Apicurio's AvroConverter turned it into Avro) without spark-avro or fastavro: the
job package runs on a cluster that has neither, and a landed hourly file is decoded by one task
(:mod:`.decode`).  Codecs ``null`` and ``deflate`` (the ones the standard library reads); another
codec is named in the error, and the plan task refuses such a file before the job runs.

Values are returned as the binary encoding holds them: ``int``/``long`` as int, ``bytes`` and
``fixed`` as bytes, records as dicts; logical types (``decimal``, ``date``, ``timestamp-micros``,
Kafka Connect's ``connect.name``) are left to the caller, which reads them from the schema
(:func:`field_semantics`).  Standard library only.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Iterator
from typing import Any

MAGIC = b"Obj\x01"
SYNC_SIZE = 16
CODECS = ("null", "deflate")


class AvroError(ValueError):
    """The bytes are not an Avro container file this reader can read (the message says why)."""


class _Reader:
    """The binary decoding of one block's bytes (zig-zag varints, lengths, IEEE floats)."""

    def __init__(self, data: bytes) -> None:
        self.buf = io.BytesIO(data)

    def read(self, n: int) -> bytes:
        got = self.buf.read(n)
        if len(got) != n:
            raise AvroError(f"truncated: wanted {n} bytes, found {len(got)}")
        return got

    def long(self) -> int:
        shift, result = 0, 0
        while True:
            b = self.buf.read(1)
            if not b:
                raise AvroError("truncated varint")
            byte = b[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 70:
                raise AvroError("varint longer than 10 bytes")
        return (result >> 1) ^ -(result & 1)

    def at_end(self) -> bool:
        pos = self.buf.tell()
        if self.buf.read(1):
            self.buf.seek(pos)
            return False
        return True


class Schema:
    """A parsed writer schema: named types resolved, so decoding needs no lookups by name."""

    def __init__(self, text: str) -> None:
        try:
            self.root = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AvroError(f"the header's avro.schema is not JSON ({exc})") from exc
        self.named: dict[str, Any] = {}
        self._collect(self.root, None)

    def _collect(self, s: Any, namespace: str | None) -> None:
        if isinstance(s, list):
            for branch in s:
                self._collect(branch, namespace)
            return
        if not isinstance(s, dict):
            return
        kind = s.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            name = str(s.get("name", ""))
            ns = s.get("namespace", namespace)
            full = name if "." in name or not ns else f"{ns}.{name}"
            self.named[full] = s
            self.named.setdefault(name, s)
            if kind in ("record", "error"):
                for f in s.get("fields", []):
                    self._collect(f.get("type"), ns)
        elif kind == "array":
            self._collect(s.get("items"), namespace)
        elif kind == "map":
            self._collect(s.get("values"), namespace)
        elif isinstance(kind, dict | list):
            self._collect(kind, namespace)

    def resolve(self, s: Any) -> Any:
        """A type reference by name as its definition; anything else as it is."""
        if isinstance(s, str) and s in self.named:
            return self.named[s]
        if isinstance(s, dict) and isinstance(s.get("type"), str) and s["type"] in self.named:
            return self.named[s["type"]]
        return s

    def decode(self, r: _Reader, s: Any) -> Any:
        s = self.resolve(s)
        if isinstance(s, list):  # a union: the branch's index, then its value
            idx = r.long()
            if not 0 <= idx < len(s):
                raise AvroError(f"union branch {idx} of {len(s)}")
            return self.decode(r, s[idx])
        kind = s.get("type") if isinstance(s, dict) else s
        if isinstance(kind, dict | list):
            return self.decode(r, kind)
        if kind == "null":
            return None
        if kind == "boolean":
            return r.read(1) != b"\x00"
        if kind in ("int", "long"):
            return r.long()
        if kind == "float":
            return struct.unpack("<f", r.read(4))[0]
        if kind == "double":
            return struct.unpack("<d", r.read(8))[0]
        if kind == "bytes":
            return r.read(r.long())
        if kind == "string":
            return r.read(r.long()).decode("utf-8")
        if kind == "fixed":
            return r.read(int(s["size"]))
        if kind == "enum":
            return s["symbols"][r.long()]
        if kind in ("record", "error"):
            return {f["name"]: self.decode(r, f["type"]) for f in s["fields"]}
        if kind == "array":
            out: list[Any] = []
            for _ in self._blocks(r):
                out.append(self.decode(r, s["items"]))
            return out
        if kind == "map":
            m: dict[str, Any] = {}
            for _ in self._blocks(r):
                key = r.read(r.long()).decode("utf-8")
                m[key] = self.decode(r, s["values"])
            return m
        raise AvroError(f"unknown Avro type {kind!r}")

    @staticmethod
    def _blocks(r: _Reader) -> Iterator[None]:
        """Array and map items come in blocks: a count (negative: followed by the block's byte size), 0 ends."""
        while True:
            n = r.long()
            if n == 0:
                return
            if n < 0:
                r.long()
                n = -n
            for _ in range(n):
                yield None


def header(data: bytes) -> tuple[dict[str, bytes], bytes, int]:
    """(metadata, sync marker, offset of the first block) of a container file; raises :class:`AvroError`."""
    if data[:4] != MAGIC:
        raise AvroError("not an Avro container file (no Obj\\x01 magic at its start)")
    r = _Reader(data)
    r.read(4)
    meta: dict[str, bytes] = {}
    for _ in Schema._blocks(r):
        key = r.read(r.long()).decode("utf-8")
        meta[key] = r.read(r.long())
    sync = r.read(SYNC_SIZE)
    if "avro.schema" not in meta:
        raise AvroError("the header holds no avro.schema")
    codec = meta.get("avro.codec", b"null").decode("utf-8") or "null"
    if codec not in CODECS:
        raise AvroError(
            f"codec {codec!r} is not read here (only {', '.join(CODECS)}): set the sink's Avro codec to deflate or null"
        )
    return meta, sync, r.buf.tell()


def count_records(data: bytes) -> int:
    """Records in a container file, from its block headers only (no record is decoded)."""
    _, sync, offset = header(data)
    r = _Reader(data)
    r.buf.seek(offset)
    total = 0
    while not r.at_end():
        n, size = r.long(), r.long()
        r.read(size)
        if r.read(SYNC_SIZE) != sync:
            raise AvroError(f"block after record {total}: sync marker does not match the header's")
        total += n
    return total


def read(data: bytes) -> tuple[Any, Iterator[Any]]:
    """(writer schema as JSON, the records in file order) of a container file."""
    meta, sync, offset = header(data)
    schema = Schema(meta["avro.schema"].decode("utf-8"))
    codec = meta.get("avro.codec", b"null").decode("utf-8") or "null"

    def records() -> Iterator[Any]:
        r = _Reader(data)
        r.buf.seek(offset)
        while not r.at_end():
            n, size = r.long(), r.long()
            block = r.read(size)
            if r.read(SYNC_SIZE) != sync:
                raise AvroError("sync marker does not match the header's (corrupt block)")
            if codec == "deflate":
                block = zlib.decompress(block, -15)
            br = _Reader(block)
            for _ in range(n):
                yield schema.decode(br, schema.root)

    return schema, records()
