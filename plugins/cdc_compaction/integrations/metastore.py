"""Metadata operations on the table catalog: a Hive metastore over Thrift, or the AWS Glue Data Catalog.

Moving a table's location, registering and dropping partitions and reading table
properties need no SQL engine: doing them over the catalog's API costs milliseconds
instead of a Spark JVM start.  DDL that creates tables and views still goes through
Spark SQL (see :mod:`cdc_compaction.integrations.engine`), rendered from the templates.

:class:`Metastore` (Thrift) and :class:`GlueMetastore` offer the same methods;
:func:`connect` picks one from the endpoint's ``kind``.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.exceptions import MetastoreError
from cdc_compaction.core.settings import MetastoreEndpoint

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


# Spark's JSON names of the Hive types a column can be widened to.
_SPARK_JSON_TYPES = {"tinyint": "byte", "smallint": "short", "int": "integer", "bigint": "long"}
_SPARK_SCHEMA = "spark.sql.sources.schema"


def _spark_schema_widened(params: dict[str, str], types: dict[str, str]) -> dict[str, str]:
    """Table parameters with Spark's schema copy (one property or ``numParts`` pieces) retyped.

    Spark reads a data source table's schema from these properties, not from the Hive
    columns, so both must change together.
    """
    params = dict(params)
    if _SPARK_SCHEMA in params:
        text, parts = params[_SPARK_SCHEMA], None
    elif f"{_SPARK_SCHEMA}.numParts" in params:
        parts = int(params[f"{_SPARK_SCHEMA}.numParts"])
        text = "".join(params[f"{_SPARK_SCHEMA}.part.{i}"] for i in range(parts))
    else:
        return params
    schema = json.loads(text)
    lower = {k.lower(): v for k, v in types.items()}
    for field in schema.get("fields", []):
        new = lower.get(field["name"].lower())
        if new is None:
            continue
        field["type"] = _SPARK_JSON_TYPES.get(new, new)
        # A varchar/char column is a string with its declared type in the metadata.
        (field.get("metadata") or {}).pop("__CHAR_VARCHAR_TYPE_STRING", None)
    text = json.dumps(schema, separators=(",", ":"))
    if parts is None:
        params[_SPARK_SCHEMA] = text
    else:
        size = -(-len(text) // parts)
        for i in range(parts):
            params[f"{_SPARK_SCHEMA}.part.{i}"] = text[i * size : (i + 1) * size]
    return params


@dataclass(frozen=True)
class MetastoreView:
    """A view as the metastore stores it: Hive's own form, or Trino's (``presto_view``) encoding."""

    database: str
    name: str
    #: (name, Hive type); a Trino view stores one placeholder column, its real columns are in the text.
    columns: list[tuple[str, str]]
    original_text: str
    expanded_text: str
    parameters: dict[str, str]


class _Catalog(ABC):
    """What both catalogs share: reads built on ``get_table``, and which partitions to (re)register."""

    @abstractmethod
    def get_table(self, db: str, name: str) -> Any | None:
        """The table (with ``.parameters``, ``.sd.location``, ``.sd.cols``), or None."""

    @abstractmethod
    def partitions(self, db: str, name: str) -> dict[str, str]:
        """Partition value -> location of a table partitioned by one column."""

    @abstractmethod
    def drop_partitions(self, db: str, name: str, values: list[str]) -> list[str]:
        """Drop partitions (metadata only); returns the values dropped."""

    @abstractmethod
    def set_partitions(self, db: str, name: str, wanted: dict[str, str]) -> dict[str, list[str]]:
        """Register partitions (value -> location) exactly there: add missing ones, move others in place.

        Returns ``{"added": [...], "moved": [...]}``.  A partition at another location is altered,
        never dropped and re-added, so readers never miss it; nothing is dropped here.
        """

    @abstractmethod
    def widen_columns(self, db: str, name: str, types: dict[str, str]) -> None:
        """Give columns new (wider) Hive types: the table, its partitions and Spark's copy of the schema."""

    @abstractmethod
    def put_view(self, view: MetastoreView) -> None:
        """Create the view, or replace the one of that name (never a table of that name)."""

    @abstractmethod
    def set_properties(self, db: str, name: str, properties: dict[str, str]) -> None:
        """Set table properties of a table or view (others are kept)."""

    def put_external_table(
        self,
        db: str,
        name: str,
        columns: list[tuple[str, str]],
        location: str,
        parameters: dict[str, str],
    ) -> bool:
        """Create an external Parquet table (``Metastore`` implements it)."""
        raise MetastoreError(
            f"{db}.{name}: {type(self).__name__} cannot create tables through its API yet; "
            f"use a Thrift metastore for this table's <t>_changes ({doc_ref('data', 'the-t_changes-table')})"
        )

    def table_location(self, db: str, name: str) -> str | None:
        t = self.get_table(db, name)
        return normalize_location(t.sd.location) if t is not None else None

    def partition_keys(self, db: str, name: str) -> list[str] | None:
        """The table's partition columns ([] when unpartitioned), or None if there is no such table."""
        t = self.get_table(db, name)
        return list(t.partition_keys) if t is not None else None

    def _partition_changes(self, db: str, name: str, wanted: dict[str, str]) -> tuple[list[str], list[str]]:
        """(values to add, values to move) so that ``wanted`` is registered exactly."""
        have = self.partitions(db, name)
        new = [v for v in sorted(wanted) if v not in have]
        moved = [v for v in sorted(wanted) if v in have and have[v] != normalize_location(wanted[v])]
        return new, moved

    def table_property(self, db: str, name: str, key: str) -> str | None:
        t = self.get_table(db, name)
        return (t.parameters or {}).get(key) if t is not None else None

    def column_names(self, db: str, name: str) -> list[str] | None:
        t = self.get_table(db, name)
        return [c.name for c in t.sd.cols] if t is not None else None

    def _partitions_to_add(self, db: str, name: str, wanted: dict[str, str]) -> list[tuple[str, str]]:
        """(value, location) pairs to register; partitions registered elsewhere are dropped first.

        A partition at another location means the storage root moved: it is re-registered.
        """
        have = self.partitions(db, name)
        moved = [v for v, loc in wanted.items() if v in have and have[v] != normalize_location(loc)]
        self.drop_partitions(db, name, moved)
        return [(v, loc) for v, loc in sorted(wanted.items()) if v not in have or v in moved]


class Metastore(_Catalog):
    """A thin, typed wrapper over an open Thrift connection."""

    def __init__(self, client: Any, endpoint: MetastoreEndpoint) -> None:
        self._c = client
        self.endpoint = endpoint
        from hmsclient.genthrift.hive_metastore import ttypes

        self._t = ttypes

    def get_table(self, db: str, name: str) -> Any | None:
        try:
            t = self._c.get_table(db, name)
        except self._t.NoSuchObjectException:
            return None
        t.partition_keys = [k.name for k in t.partitionKeys or []]
        return t

    def drop_table(self, db: str, name: str) -> bool:
        """Drop a table or view from the catalog, never its files (``deleteData=False``); False if it was not there."""
        try:
            self._c.drop_table(db, name, False)
        except self._t.NoSuchObjectException:
            return False
        return True

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

    def widen_columns(self, db: str, name: str, types: dict[str, str]) -> None:
        t = self.get_table(db, name)
        if t is None:
            raise MetastoreError(f"table {db}.{name} does not exist in the metastore at {self.endpoint.uri}")
        lower = {k.lower(): v for k, v in types.items()}
        for col in t.sd.cols:
            col.type = lower.get(col.name.lower(), col.type)
        t.parameters = _spark_schema_widened(t.parameters or {}, types)
        try:
            # Cascade: the partitions' own column lists change too (Hive and Trino read those).
            self._c.alter_table_with_cascade(db, name, t, bool(t.partitionKeys))
        except self._t.TException as exc:
            raise MetastoreError(f"cannot change the column types of {db}.{name} to {types}: {exc}") from exc
        log.info("metastore: %s.%s columns now %s", db, name, types)

    def put_view(self, view: MetastoreView) -> None:
        t = self._t
        existing = self.get_table(view.database, view.name)
        if existing is not None and existing.tableType != "VIRTUAL_VIEW":
            raise MetastoreError(
                f"{view.database}.{view.name} is a table, not a view; drop or rename it so the view can be created"
            )
        sd = t.StorageDescriptor(
            cols=[t.FieldSchema(name=n, type=ty, comment=None) for n, ty in view.columns],
            location=None,
            inputFormat=None,
            outputFormat=None,
            compressed=False,
            numBuckets=-1,
            serdeInfo=t.SerDeInfo(name=None, serializationLib=None, parameters={}),
            bucketCols=[],
            sortCols=[],
            parameters={},
        )
        table = t.Table(
            tableName=view.name,
            dbName=view.database,
            owner="cdc_compaction",
            createTime=int(time.time()),
            lastAccessTime=0,
            retention=0,
            sd=sd,
            partitionKeys=[],
            parameters=dict(view.parameters),
            viewOriginalText=view.original_text,
            viewExpandedText=view.expanded_text,
            tableType="VIRTUAL_VIEW",
        )
        try:
            if existing is None:
                self._c.create_table(table)
            else:
                self._c.alter_table(view.database, view.name, table)
        except t.TException as exc:
            raise MetastoreError(f"cannot create view {view.database}.{view.name}: {exc}") from exc
        log.info("metastore: view %s.%s (%s)", view.database, view.name, view.parameters.get("cdc.dialect"))

    def put_external_table(
        self,
        db: str,
        name: str,
        columns: list[tuple[str, str]],
        location: str,
        parameters: dict[str, str],
    ) -> bool:
        """Create an external (unpartitioned) Hive Parquet table, or bring its columns and location
        to these; True if it changed anything.

        A plain Hive table (Parquet SerDe, no Spark data-source properties): Spark, Hive and Trino
        all read it.  Columns only ever change as the registry does (``ensure_tables`` refuses the rest).
        """
        t = self._t
        cols = [t.FieldSchema(name=n.lower(), type=ty, comment=None) for n, ty in columns]
        existing = self.get_table(db, name)
        if existing is not None:
            if existing.tableType == "VIRTUAL_VIEW":
                raise MetastoreError(f"{db}.{name} is a view, not a table; drop or rename it so the table can be made")
            have = [(c.name, c.type) for c in existing.sd.cols]
            same_loc = normalize_location(existing.sd.location) == normalize_location(location)
            if have == [(c.name, c.type) for c in cols] and same_loc:
                return False
            existing.sd.cols, existing.sd.location = cols, to_uri(location)
            try:
                self._c.alter_table(db, name, existing)
            except t.TException as exc:
                raise MetastoreError(f"cannot change the columns or location of {db}.{name}: {exc}") from exc
            log.info("metastore: %s.%s now has columns %s at %s", db, name, [c.name for c in cols], location)
            return True
        sd = t.StorageDescriptor(
            cols=cols,
            location=to_uri(location),
            inputFormat="org.apache.hadoop.hive.ql.io.parquet.MapredParquetInputFormat",
            outputFormat="org.apache.hadoop.hive.ql.io.parquet.MapredParquetOutputFormat",
            compressed=False,
            numBuckets=-1,
            serdeInfo=t.SerDeInfo(
                name=None,
                serializationLib="org.apache.hadoop.hive.ql.io.parquet.serde.ParquetHiveSerDe",
                parameters={"serialization.format": "1"},
            ),
            bucketCols=[],
            sortCols=[],
            parameters={},
        )
        table = t.Table(
            tableName=name,
            dbName=db,
            owner="cdc_compaction",
            createTime=int(time.time()),
            lastAccessTime=0,
            retention=0,
            sd=sd,
            partitionKeys=[],
            parameters={**parameters, "EXTERNAL": "TRUE"},
            tableType="EXTERNAL_TABLE",
        )
        try:
            self._c.create_table(table)
        except t.AlreadyExistsException:
            log.info("metastore: %s.%s was created concurrently", db, name)
            return False
        except t.TException as exc:
            raise MetastoreError(f"cannot create table {db}.{name}: {exc}") from exc
        log.info("metastore: created %s.%s at %s", db, name, location)
        return True

    def set_properties(self, db: str, name: str, properties: dict[str, str]) -> None:
        tbl = self.get_table(db, name)
        if tbl is None:
            raise MetastoreError(f"{db}.{name} does not exist in the metastore at {self.endpoint.uri}")
        if all((tbl.parameters or {}).get(k) == v for k, v in properties.items()):
            return
        tbl.parameters = {**(tbl.parameters or {}), **properties}
        try:
            self._c.alter_table(db, name, tbl)
        except self._t.TException as exc:
            raise MetastoreError(f"cannot set properties of {db}.{name}: {exc}") from exc

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
        new = []
        for value, location in self._partitions_to_add(db, name, wanted):
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

    def set_partitions(self, db: str, name: str, wanted: dict[str, str]) -> dict[str, list[str]]:
        new, moved = self._partition_changes(db, name, wanted)
        t = self.get_table(db, name) if new or moved else None
        if (new or moved) and t is None:
            raise MetastoreError(f"table {db}.{name} does not exist; run ensure_tables first")
        if new:
            parts = []
            for value in new:
                sd = copy.deepcopy(t.sd)
                sd.location = to_uri(wanted[value])
                if sd.serdeInfo.parameters and "path" in sd.serdeInfo.parameters:
                    del sd.serdeInfo.parameters["path"]
                parts.append(self._t.Partition(values=[value], dbName=db, tableName=name, sd=sd, parameters={}))
            try:
                self._c.add_partitions(parts)
            except self._t.AlreadyExistsException as exc:
                raise MetastoreError(
                    f"partitions of {db}.{name} were registered by someone else meanwhile ({exc}); "
                    "retry the task: it registers what is still missing"
                ) from exc
        if moved:
            current = {p.values[0]: p for p in self._c.get_partitions(db, name, -1) if p.values[0] in moved}
            for value in moved:
                current[value].sd.location = to_uri(wanted[value])
                # A rewritten partition has the table's columns now (ADD COLUMNS since it was added).
                current[value].sd.cols = copy.deepcopy(t.sd.cols)
            try:
                # One call, one metastore transaction: every moved partition switches at once.
                self._c.alter_partitions(db, name, [current[v] for v in moved])
            except self._t.TException as exc:  # pragma: no cover - network / server failure
                raise MetastoreError(f"cannot move partitions {moved} of {db}.{name}: {exc}; retry the task") from exc
        log.info("metastore: %s.%s partitions added %s, moved %s", db, name, new, moved)
        return {"added": new, "moved": moved}

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


class _GlueTable:
    """A Glue table seen through the attributes the tasks read from a Thrift table."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        sd = raw.get("StorageDescriptor", {})
        self.parameters: dict[str, str] = dict(raw.get("Parameters", {}))
        self.partition_keys = [k["Name"] for k in raw.get("PartitionKeys", [])]
        self.sd = SimpleNamespace(
            location=sd.get("Location"), cols=[SimpleNamespace(name=c["Name"]) for c in sd.get("Columns", [])]
        )


# Keys of GetTable's answer that UpdateTable's TableInput accepts.
_TABLE_INPUT_KEYS = (
    "Name",
    "Description",
    "Owner",
    "LastAccessTime",
    "LastAnalyzedTime",
    "Retention",
    "StorageDescriptor",
    "PartitionKeys",
    "ViewOriginalText",
    "ViewExpandedText",
    "TableType",
    "Parameters",
    "TargetTable",
)


class GlueMetastore(_Catalog):
    """The same operations on the AWS Glue Data Catalog, through the amazon provider's Glue hook.

    ``set_location`` passes the table's ``VersionId`` to ``UpdateTable``: Glue refuses the
    update if the table changed since it was read (optimistic concurrency), like the
    pointer's compare-and-swap.  Partitions go in batches of Glue's limits (100 to create,
    25 to delete per call).
    """

    def __init__(self, endpoint: MetastoreEndpoint) -> None:
        from airflow.providers.amazon.aws.hooks.glue_catalog import GlueCatalogHook

        self.endpoint = endpoint
        self._c = GlueCatalogHook(aws_conn_id=endpoint.aws_conn_id).get_conn()
        self._catalog = {"CatalogId": endpoint.catalog_id} if endpoint.catalog_id else {}

    def _raw(self, db: str, name: str) -> dict[str, Any] | None:
        try:
            return self._c.get_table(DatabaseName=db, Name=name, **self._catalog)["Table"]
        except self._c.exceptions.EntityNotFoundException:
            return None

    def get_table(self, db: str, name: str) -> _GlueTable | None:
        raw = self._raw(db, name)
        return _GlueTable(raw) if raw is not None else None

    def drop_table(self, db: str, name: str) -> bool:
        """Delete a table or view from the Glue catalog (Glue never deletes files); False if it was not there."""
        try:
            self._c.delete_table(DatabaseName=db, Name=name, **self._catalog)
        except self._c.exceptions.EntityNotFoundException:
            return False
        return True

    def set_location(self, db: str, name: str, location: str) -> None:
        """Point a table at ``location`` in one UpdateTable call (the atomic swap)."""
        raw = self._raw(db, name)
        if raw is None:
            raise MetastoreError(
                f"table {db}.{name} does not exist in the Glue Data Catalog {self.endpoint.uri}; "
                "run the DAG's ensure_tables task first"
            )
        sd = raw["StorageDescriptor"]
        if normalize_location(sd.get("Location")) == normalize_location(location):
            return
        table_input = {k: copy.deepcopy(raw[k]) for k in _TABLE_INPUT_KEYS if k in raw}
        table_input["StorageDescriptor"]["Location"] = to_uri(location)
        params = table_input["StorageDescriptor"].get("SerdeInfo", {}).get("Parameters")
        if params is not None and "path" in params:
            params["path"] = to_uri(location)
        version = {"VersionId": raw["VersionId"]} if raw.get("VersionId") else {}
        try:
            self._c.update_table(DatabaseName=db, TableInput=table_input, **version, **self._catalog)
        except self._c.exceptions.ConcurrentModificationException as exc:
            raise MetastoreError(
                f"{db}.{name} changed in Glue while it was being moved to {location}; nothing was changed. "
                "Retry the task: it reads the table again"
            ) from exc
        log.info("glue: %s.%s now at %s", db, name, location)

    def widen_columns(self, db: str, name: str, types: dict[str, str]) -> None:
        raw = self._raw(db, name)
        if raw is None:
            raise MetastoreError(f"table {db}.{name} does not exist in the Glue Data Catalog {self.endpoint.uri}")
        lower = {k.lower(): v for k, v in types.items()}
        table_input = {k: copy.deepcopy(raw[k]) for k in _TABLE_INPUT_KEYS if k in raw}
        for col in table_input["StorageDescriptor"].get("Columns", []):
            col["Type"] = lower.get(col["Name"].lower(), col["Type"])
        table_input["Parameters"] = _spark_schema_widened(table_input.get("Parameters", {}), types)
        version = {"VersionId": raw["VersionId"]} if raw.get("VersionId") else {}
        self._c.update_table(DatabaseName=db, TableInput=table_input, **version, **self._catalog)
        log.info("glue: %s.%s columns now %s", db, name, types)

    def put_view(self, view: MetastoreView) -> None:
        raw = self._raw(view.database, view.name)
        if raw is not None and raw.get("TableType") != "VIRTUAL_VIEW":
            raise MetastoreError(
                f"{view.database}.{view.name} is a table, not a view; drop or rename it so the view can be created"
            )
        table_input = {
            "Name": view.name,
            "TableType": "VIRTUAL_VIEW",
            "Owner": "cdc_compaction",
            "Parameters": dict(view.parameters),
            "ViewOriginalText": view.original_text,
            "ViewExpandedText": view.expanded_text,
            "PartitionKeys": [],
            "StorageDescriptor": {
                "Columns": [{"Name": n, "Type": t} for n, t in view.columns],
                "SerdeInfo": {},
            },
        }
        if raw is None:
            self._c.create_table(DatabaseName=view.database, TableInput=table_input, **self._catalog)
        else:
            self._c.update_table(DatabaseName=view.database, TableInput=table_input, **self._catalog)
        log.info("glue: view %s.%s (%s)", view.database, view.name, view.parameters.get("cdc.dialect"))

    def set_properties(self, db: str, name: str, properties: dict[str, str]) -> None:
        raw = self._raw(db, name)
        if raw is None:
            raise MetastoreError(f"{db}.{name} does not exist in the Glue Data Catalog {self.endpoint.uri}")
        if all(raw.get("Parameters", {}).get(k) == v for k, v in properties.items()):
            return
        table_input = {k: copy.deepcopy(raw[k]) for k in _TABLE_INPUT_KEYS if k in raw}
        table_input["Parameters"] = {**table_input.get("Parameters", {}), **properties}
        version = {"VersionId": raw["VersionId"]} if raw.get("VersionId") else {}
        self._c.update_table(DatabaseName=db, TableInput=table_input, **version, **self._catalog)

    def partitions(self, db: str, name: str) -> dict[str, str]:
        out: dict[str, str] = {}
        try:
            pages = self._c.get_paginator("get_partitions").paginate(DatabaseName=db, TableName=name, **self._catalog)
            for page in pages:
                for p in page["Partitions"]:
                    out[p["Values"][0]] = normalize_location(p["StorageDescriptor"].get("Location")) or ""
        except self._c.exceptions.EntityNotFoundException:
            return {}
        return out

    def add_partitions(self, db: str, name: str, wanted: dict[str, str]) -> list[str]:
        if not wanted:
            return []
        raw = self._raw(db, name)
        if raw is None:
            raise MetastoreError(f"table {db}.{name} does not exist in Glue; run ensure_tables first")
        new = []
        for value, location in self._partitions_to_add(db, name, wanted):
            sd = copy.deepcopy(raw["StorageDescriptor"])
            sd["Location"] = to_uri(location)
            sd.get("SerdeInfo", {}).get("Parameters", {}).pop("path", None)
            new.append({"Values": [value], "StorageDescriptor": sd})
        for i in range(0, len(new), 100):
            resp = self._c.batch_create_partition(
                DatabaseName=db, TableName=name, PartitionInputList=new[i : i + 100], **self._catalog
            )
            errors = [e for e in resp.get("Errors", []) if e["ErrorDetail"]["ErrorCode"] != "AlreadyExistsException"]
            if errors:
                raise MetastoreError(f"Glue refused partitions of {db}.{name}: {errors}")
        return [p["Values"][0] for p in new]

    def _partition_input(self, raw: dict[str, Any], value: str, location: str) -> dict[str, Any]:
        sd = copy.deepcopy(raw["StorageDescriptor"])
        sd["Location"] = to_uri(location)
        sd.get("SerdeInfo", {}).get("Parameters", {}).pop("path", None)
        return {"Values": [value], "StorageDescriptor": sd}

    def set_partitions(self, db: str, name: str, wanted: dict[str, str]) -> dict[str, list[str]]:
        """Glue's form: BatchCreatePartition, then BatchUpdatePartition (100 per call; not atomic across calls)."""
        new, moved = self._partition_changes(db, name, wanted)
        raw = self._raw(db, name) if new or moved else None
        if (new or moved) and raw is None:
            raise MetastoreError(f"table {db}.{name} does not exist in Glue; run ensure_tables first")
        for i in range(0, len(new), 100):
            resp = self._c.batch_create_partition(
                DatabaseName=db,
                TableName=name,
                PartitionInputList=[self._partition_input(raw, v, wanted[v]) for v in new[i : i + 100]],
                **self._catalog,
            )
            if resp.get("Errors"):
                raise MetastoreError(f"Glue refused partitions of {db}.{name}: {resp['Errors']}; retry the task")
        for i in range(0, len(moved), 100):
            entries = [
                {"PartitionValueList": [v], "PartitionInput": self._partition_input(raw, v, wanted[v])}
                for v in moved[i : i + 100]
            ]
            resp = self._c.batch_update_partition(DatabaseName=db, TableName=name, Entries=entries, **self._catalog)
            if resp.get("Errors"):
                raise MetastoreError(f"Glue could not move partitions of {db}.{name}: {resp['Errors']}; retry the task")
        log.info("glue: %s.%s partitions added %s, moved %s", db, name, new, moved)
        return {"added": new, "moved": moved}

    def drop_partitions(self, db: str, name: str, values: list[str]) -> list[str]:
        dropped = []
        for i in range(0, len(values), 25):
            batch = values[i : i + 25]
            resp = self._c.batch_delete_partition(
                DatabaseName=db, TableName=name, PartitionsToDelete=[{"Values": [v]} for v in batch], **self._catalog
            )
            errors = resp.get("Errors", [])
            failed = [e for e in errors if e["ErrorDetail"]["ErrorCode"] != "EntityNotFoundException"]
            if failed:
                raise MetastoreError(f"Glue could not drop partitions of {db}.{name}: {failed}; retry the task")
            missing = {e["PartitionValues"][0] for e in errors}
            dropped += [v for v in batch if v not in missing]
        return dropped


def _set_socket_timeout(transport: Any, timeout_ms: int) -> None:
    """Give the socket under a Thrift transport a timeout (the hook builds the transport without one).

    A metastore that accepts the connection but never answers would otherwise hold the task
    until Airflow's execution timeout. Buffered and SASL transports keep the socket in a
    private attribute; a transport of another shape is left as it is.
    """
    for _ in range(3):
        if hasattr(transport, "setTimeout"):
            transport.setTimeout(timeout_ms)
            return
        transport = getattr(transport, "_TBufferedTransport__trans", None) or getattr(transport, "_trans", None)
        if transport is None:
            return


def _hook_client(endpoint: MetastoreEndpoint) -> Any:
    """An (unopened) metastore client from the apache-hive provider's ``HiveMetastoreHook``.

    The hook reads the Airflow connection itself; it tries each comma-separated host on the
    connection's port and speaks SASL/Kerberos when the connection's extra asks for it. Its host
    field must be bare names, so the hook is handed the host list and port parsed from the same
    connection (``thrift://h:9083`` and ``h1,h2`` as the endpoint understood them).
    """
    from airflow.providers.apache.hive.hooks.hive import HiveMetastoreHook

    class _ParsedHostHook(HiveMetastoreHook):
        @classmethod
        def get_connection(cls, conn_id: str) -> Any:
            conn = copy.copy(super().get_connection(conn_id))
            conn.host, conn.port = ",".join(endpoint.hosts), endpoint.port
            return conn

    try:
        return _ParsedHostHook(metastore_conn_id=endpoint.conn_id or "metastore_default").get_conn()
    except Exception as exc:
        raise MetastoreError(
            f"cannot reach the Hive metastore at {endpoint.uri} (Airflow connection {endpoint.conn_id!r}): "
            f"{type(exc).__name__}: {exc}. Start it, or fix the connection's host/port (Admin > Connections)"
        ) from exc


def _socket_client(endpoint: MetastoreEndpoint, timeout_ms: int) -> Any:
    """An open metastore client on the first host that accepts a connection (no Airflow connection)."""
    from hmsclient import hmsclient
    from thrift.protocol import TBinaryProtocol
    from thrift.transport import TSocket, TTransport

    errors = []
    for host in endpoint.hosts:
        sock = TSocket.TSocket(host, endpoint.port)
        sock.setTimeout(timeout_ms)
        transport = TTransport.TBufferedTransport(sock)
        try:
            transport.open()
        except TTransport.TTransportException as exc:
            errors.append(f"{host}:{endpoint.port}: {exc}")
            continue
        return hmsclient.HMSClient(iprot=TBinaryProtocol.TBinaryProtocol(transport))
    raise MetastoreError(
        f"cannot reach the Hive metastore at {endpoint.uri}: {'; '.join(errors)}. "
        "Start it (locally: make metastore-start) or fix the 'metastore_default' connection"
    )


@contextmanager
def connect(endpoint: MetastoreEndpoint, timeout_s: float = 30.0) -> Iterator[Any]:
    """Open the table catalog: a Thrift connection (with a socket timeout), or a Glue client.

    An endpoint read from an Airflow connection goes through the provider's ``HiveMetastoreHook``;
    one from ``$CDC_METASTORE_URI`` (CLI, tests) through a plain socket.
    """
    if endpoint.kind == "glue":
        yield GlueMetastore(endpoint)
        return
    from thrift.transport import TTransport

    timeout_ms = int(timeout_s * 1000)
    if endpoint.conn_id:
        client = _hook_client(endpoint)
        _set_socket_timeout(client._oprot.trans, timeout_ms)
        try:
            client.open()
        except TTransport.TTransportException as exc:
            raise MetastoreError(
                f"cannot reach the Hive metastore at {endpoint.uri} (Airflow connection {endpoint.conn_id!r}): "
                f"{exc}. Start it, or fix the connection's host/port (Admin > Connections)"
            ) from exc
    else:
        client = _socket_client(endpoint, timeout_ms)
    try:
        yield Metastore(client, endpoint)
    finally:
        client.close()
