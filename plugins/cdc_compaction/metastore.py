"""Metadata operations through the Hive metastore's Thrift API.

Moving a table's location, registering and dropping partitions and reading table
properties need no SQL engine: doing them over Thrift costs milliseconds instead of
a Spark JVM start.  DDL that creates tables and views still goes through Spark SQL
(see :mod:`cdc_compaction.engine`), rendered from the templates.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cdc_compaction.exceptions import MetastoreError
from cdc_compaction.settings import MetastoreEndpoint

log = logging.getLogger(__name__)


def normalize_location(location: str | None) -> str | None:
    """``file:/x``, ``file:///x`` and ``/x/`` are the same place: ``/x``."""
    if location is None:
        return None
    if location.startswith("file://"):
        location = location[len("file://") :]
    elif location.startswith("file:"):
        location = location[len("file:") :]
    return location.rstrip("/") or "/"


def to_uri(location: str) -> str:
    """The metastore form of a lake path (absolute local paths become ``file:`` URIs)."""
    return f"file:{location}" if location.startswith("/") else location


class Metastore:
    """A thin, typed wrapper over an open Thrift connection."""

    def __init__(self, client: Any, endpoint: MetastoreEndpoint) -> None:
        self._c = client
        self.endpoint = endpoint
        from hmsclient.genthrift.hive_metastore import ttypes

        self._t = ttypes

    def get_table(self, db: str, name: str) -> Any | None:
        try:
            return self._c.get_table(db, name)
        except self._t.NoSuchObjectException:
            return None

    def table_location(self, db: str, name: str) -> str | None:
        t = self.get_table(db, name)
        return normalize_location(t.sd.location) if t is not None else None

    def table_property(self, db: str, name: str, key: str) -> str | None:
        t = self.get_table(db, name)
        return (t.parameters or {}).get(key) if t is not None else None

    def column_names(self, db: str, name: str) -> list[str] | None:
        t = self.get_table(db, name)
        return [c.name for c in t.sd.cols] if t is not None else None

    def set_location(self, db: str, name: str, location: str) -> None:
        """Point a table at ``location`` in one metastore call (the atomic swap)."""
        t = self.get_table(db, name)
        if t is None:
            raise MetastoreError(
                f"table {db}.{name} does not exist in the metastore at {self.endpoint.uri}; "
                "run the DAG's ensure_tables task first"
            )
        if normalize_location(t.sd.location) == normalize_location(location):
            return
        t.sd.location = to_uri(location)
        # Spark data source tables also keep their location as the 'path' serde option.
        params = t.sd.serdeInfo.parameters
        if params is not None and "path" in params:
            params["path"] = to_uri(location)
        try:
            self._c.alter_table(db, name, t)
        except self._t.TException as exc:  # pragma: no cover - network / server failure
            raise MetastoreError(f"cannot move {db}.{name} to {location}: {exc}") from exc
        log.info("metastore: %s.%s now at %s", db, name, location)

    def partitions(self, db: str, name: str) -> dict[str, str]:
        """Partition value -> location of a table partitioned by one column."""
        try:
            parts = self._c.get_partitions(db, name, -1)
        except self._t.NoSuchObjectException:
            return {}
        return {p.values[0]: normalize_location(p.sd.location) or "" for p in parts}

    def add_partitions(self, db: str, name: str, wanted: dict[str, str]) -> list[str]:
        """Register missing partitions (value -> location); returns the values added."""
        if not wanted:
            return []
        t = self.get_table(db, name)
        if t is None:
            raise MetastoreError(f"table {db}.{name} does not exist; run ensure_tables first")
        have = self.partitions(db, name)
        moved = [v for v, loc in wanted.items() if v in have and have[v] != normalize_location(loc)]
        # A partition registered at another location (the storage root moved) is re-registered.
        self.drop_partitions(db, name, moved)
        new = []
        for value, location in sorted(wanted.items()):
            if value in have and value not in moved:
                continue
            sd = copy.deepcopy(t.sd)
            sd.location = to_uri(location)
            if sd.serdeInfo.parameters and "path" in sd.serdeInfo.parameters:
                del sd.serdeInfo.parameters["path"]
            new.append(self._t.Partition(values=[value], dbName=db, tableName=name, sd=sd, parameters={}))
        if new:
            try:
                self._c.add_partitions(new)
            except self._t.AlreadyExistsException:
                # A concurrent registration won the race: fine, the partition is there.
                log.info("metastore: some partitions of %s.%s were registered concurrently", db, name)
        return [p.values[0] for p in new]

    def drop_partitions(self, db: str, name: str, values: list[str]) -> list[str]:
        """Drop partitions (metadata only; never the data); returns the values dropped."""
        dropped = []
        for v in values:
            try:
                self._c.drop_partition(db, name, [v], False)
                dropped.append(v)
            except self._t.NoSuchObjectException:
                continue
        return dropped


@contextmanager
def connect(endpoint: MetastoreEndpoint, timeout_s: float = 30.0) -> Iterator[Metastore]:
    """Open a Thrift connection to the metastore, with a socket timeout."""
    from hmsclient import hmsclient
    from thrift.protocol import TBinaryProtocol
    from thrift.transport import TSocket, TTransport

    sock = TSocket.TSocket(endpoint.host, endpoint.port)
    sock.setTimeout(int(timeout_s * 1000))
    transport = TTransport.TBufferedTransport(sock)
    client = hmsclient.HMSClient(iprot=TBinaryProtocol.TBinaryProtocol(transport))
    try:
        transport.open()
    except TTransport.TTransportException as exc:
        raise MetastoreError(
            f"cannot reach the Hive metastore at {endpoint.uri}: {exc}. Start it (make metastore) "
            "or fix the 'metastore_default' connection"
        ) from exc
    try:
        yield Metastore(client, endpoint)
    finally:
        transport.close()
