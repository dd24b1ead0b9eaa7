"""A client of a schema registry's Confluent-compatible REST API, and the Confluent wire format.

Kafka's Avro converters (Confluent's ``AvroConverter``, Apicurio's with ``apicurio.registry.as-confluent=true``)
write each record as the **Confluent wire format**: a magic byte ``0``, the schema's id as a 4-byte
big-endian integer, then the Avro binary encoding of the record under that schema.  The schema itself
is in the registry, under the subject ``<topic>-value`` (``<topic>-key`` for the key), and is read by
its id from ``GET /schemas/ids/<id>`` of the Confluent API (Apicurio Registry serves it at
``/apis/ccompat/v7``; its ids there are Apicurio's content ids, which the converter writes with
``apicurio.registry.use-id=contentId``).

Only the standard library speaks HTTP here: the registry is asked for a schema once per id.
"""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from cdc_compaction.core.exceptions import CdcCompactionError

#: The first byte of a Confluent wire-format record.
MAGIC = 0
#: Magic byte and schema id.
HEADER = 5


class SchemaRegistryError(CdcCompactionError):
    """The schema registry cannot be read, or a subject or record is not what it should be (named in the message)."""


class SchemaNotFoundError(SchemaRegistryError):
    """The registry has no such schema id or subject (404): a record naming it can never be decoded there."""


def split_wire(value: bytes) -> tuple[int, bytes]:
    """(schema id, Avro binary) of a Confluent wire-format record; a value that is not one raises, saying why."""
    if len(value) < HEADER:
        raise SchemaRegistryError(
            f"a {len(value)}-byte value is too short for the Confluent wire format (magic byte 0 and a 4-byte schema "
            "id before the Avro record)"
        )
    if value[0] != MAGIC:
        raise SchemaRegistryError(
            f"the value starts with byte {value[0]}, not the Confluent wire format's magic byte 0: it was not written "
            "by a registry-aware Avro converter (set the connector's value.converter to one, with "
            "apicurio.registry.as-confluent=true for Apicurio's)"
        )
    (schema_id,) = struct.unpack(">I", value[1:HEADER])
    return schema_id, value[HEADER:]


@dataclass
class ConfluentRegistry:
    """The Confluent-compatible API of a schema registry at ``url`` (e.g. ``http://host:8080/apis/ccompat/v7``)."""

    url: str
    timeout_s: float = 10.0
    #: Schemas by id, as fetched (a schema id never changes its schema).
    _by_id: dict[int, dict[str, Any] | list[Any] | str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")

    def _get(self, path: str, what: str) -> Any:
        req = urllib.request.Request(self.url + path, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # a registry the user names
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")[:500]
            error = SchemaNotFoundError if exc.code == 404 else SchemaRegistryError
            raise error(f"the schema registry {self.url} answered {exc.code} for {what} ({path}): {body}") from exc
        except (OSError, ValueError) as exc:
            raise SchemaRegistryError(
                f"the schema registry {self.url} could not be read for {what} ({path}): {exc}; check the URL (the "
                "Confluent-compatible API, e.g. http://host:8080/apis/ccompat/v7 for Apicurio) and that it runs"
            ) from exc

    def subjects(self) -> list[str]:
        """Every subject the registry holds."""
        return [str(s) for s in self._get("/subjects", "its subjects")]

    def latest(self, subject: str) -> tuple[int, Any]:
        """(id, parsed Avro schema) of ``subject``'s latest version."""
        doc = self._get(f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest", f"subject {subject}")
        kind = doc.get("schemaType", "AVRO")
        if kind != "AVRO":
            raise SchemaRegistryError(
                f"subject {subject} holds a {kind} schema, not Avro: only Avro subjects are read; write the topic "
                "with an Avro converter"
            )
        return int(doc["id"]), json.loads(doc["schema"])

    def schema(self, schema_id: int) -> Any:
        """The parsed Avro schema of id ``schema_id`` (fetched once)."""
        if schema_id not in self._by_id:
            doc = self._get(f"/schemas/ids/{schema_id}", f"schema id {schema_id}")
            kind = doc.get("schemaType", "AVRO")
            if kind != "AVRO":
                raise SchemaRegistryError(f"schema id {schema_id} is a {kind} schema, not Avro")
            self._by_id[schema_id] = json.loads(doc["schema"])
        return self._by_id[schema_id]
