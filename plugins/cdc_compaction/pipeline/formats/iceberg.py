"""Every published version of a table as a snapshot of an Iceberg table ``<db>.<t>_iceberg``, over the same files.

The lake stays the truth: a version is an immutable directory of Parquet files made live by a
commit record (``lake.py``).  This module only *describes* those files to Iceberg readers -- no
row is copied or rewritten.  One Iceberg snapshot per lake commit, in commit order, each one
*replacing* the previous version's data files with the new version's (an ``overwrite`` snapshot
whose summary carries ``cdc.commit_seq`` = the commit's number), so:

* the current snapshot holds exactly the live version's visible rows (``data/``; tombstones
  live in ``tombstones/`` and are never added);
* time travel by commit number is a lookup of the snapshot whose summary names it
  (:func:`snapshot_for_seq`);
* a partitioned table (registry ``partition_by``) gets the Iceberg partition spec of the same
  transform on the same column (identity, day, month, year are all Iceberg transforms); each
  file's partition value is taken from its Parquet statistics, as Iceberg's own ``add_files``
  does, so it always agrees with the rows (the hidden ``_cdc_partition`` column is not part of
  the Iceberg table: it is not in the files, and the registry column it is made from is).

Where things are: the table's location is ``<root>/iceberg``; its metadata (``*.metadata.json``,
manifest lists and manifests, all written by pyiceberg) is under ``<root>/iceberg/metadata/``
(:func:`is_metadata_path`).  The catalog is a choice (``CDC_ICEBERG_CATALOG``):

* ``sql`` (default): a SQLite catalog file, ``<root>/iceberg/metadata/catalog.db`` -- no
  service needed; local storage roots only (SQLite cannot live on S3);
* ``glue``: AWS Glue (the catalog of S3 lakes, and Athena's), database ``<db>``, table
  ``<db>.<t>_iceberg``, through the Airflow connection of the lake's storage (its credentials,
  region and endpoint; pyiceberg's ``GlueCatalog``, which commits with Glue's table versions);
* ``hive``: the table's own Hive metastore (the Thrift endpoint of the runtime), table
  ``<db>.<t>_iceberg``.  pyiceberg takes a metastore lock (``lock()``) on every commit, which
  needs the metastore's transaction tables (made by Hive's schema tool); the project's own
  Hive 2.3 test metastore has none, see :func:`_commit`.  Tested on a Hive 4.0.0 metastore
  (``devtools.local_services.Hive4Metastore``); Hive 4.0.1 and newer removed the ``get_table``
  call pyiceberg 0.12 makes.

Each snapshot's ``timestamp-ms`` is its lake commit's time (:func:`_stamp`), so travel by timestamp
is right after a late sync or a regeneration; ``metadata/version-hint.text`` names the current
metadata file (:data:`VERSION_HINT`) for readers that open the table by its directory.

Derived data, like the change feed (``pipeline/changes.py``): every snapshot can be made again
from the kept versions, so the caller logs and counts a failure here and never fails a publish.
:func:`sync` is idempotent (a commit already described is never described again; a crash between
the lake commit and the Iceberg commit -- fault point ``formats.before_iceberg_commit`` -- is
healed by the next call), :func:`expire` drops the
snapshots of versions retention is about to delete (before it deletes them), and
:func:`regenerate` rebuilds all metadata after ``erase`` rewrote files under the same names, so
no manifest keeps column bounds (lower/upper values) of erased rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import posixpath
from typing import Any

from cdc_compaction.core.exceptions import CdcCompactionError
from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.job.faults import fault_point
from cdc_compaction.pipeline.runtime import Runtime

log = logging.getLogger(__name__)

FORMAT = "iceberg"
#: The snapshot summary property naming the lake commit a snapshot is.
SEQ_PROPERTY = "cdc.commit_seq"
#: ... and that commit's version directory (for people reading ``table.history()``).
VERSION_PROPERTY = "cdc.version"
#: Which catalog holds ``<db>.<t>_iceberg``: ``sql`` (default, SQLite under the table root), ``glue`` or ``hive``.
CATALOG_ENV = "CDC_ICEBERG_CATALOG"
CATALOGS = ("sql", "glue", "hive")
#: The Iceberg table's directory under the table's storage root (data files stay in ``base/``).
ROOT_DIR = "iceberg"
METADATA_DIR = "metadata"
SQLITE_FILE = "catalog.db"
#: Names the current metadata file for readers without the catalog (pyiceberg's ``StaticTable``, DuckDB's
#: ``iceberg_scan``, Hadoop tables): its stem, ``00003-<uuid>`` (both read ``<stem>.metadata.json``).
VERSION_HINT = "version-hint.text"
NAME_MAPPING = "schema.name-mapping.default"


class IcebergFormatError(CdcCompactionError):
    """The Iceberg description of a lake table cannot be written (derived data: the publish stands)."""


# ------------------------------------------------------------------ names and places
def table_name(cfg: TableConfig) -> str:
    """``<t>_iceberg``: the Iceberg table's name in the table's database."""
    return f"{cfg.table}_iceberg"


def identifier(cfg: TableConfig) -> tuple[str, str]:
    return (cfg.database, table_name(cfg))


def table_root(lake: Lake) -> str:
    """``<root>/iceberg``: the Iceberg table's location (pyiceberg writes nothing but metadata there)."""
    return posixpath.join(lake.layout.root, ROOT_DIR)


def metadata_dir(lake: Lake) -> str:
    return posixpath.join(table_root(lake), METADATA_DIR)


def metadata_root(lake: Lake) -> str:
    """The directory holding every file of this format (formats.TableFormat): the table's location."""
    return table_root(lake)


def _uri(path: str) -> str:
    """A storage path as engines read it in Iceberg metadata: ``file://`` for local paths, ``s3://`` for S3."""
    if path.startswith("s3a://"):
        return "s3://" + path[len("s3a://") :]
    if "://" in path:
        return path
    return "file://" + path


def _strip(path: str) -> str:
    for prefix in ("file://", "s3://", "s3a://"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


def is_metadata_path(lake: Lake, path: str) -> bool:
    """True for a file this format writes: anything under ``<root>/iceberg/`` (metadata, manifests, catalog)."""
    root = _strip(table_root(lake)).rstrip("/") + "/"
    return _strip(path).startswith(root)


def catalog_kind() -> str:
    """The configured catalog (``CDC_ICEBERG_CATALOG``), ``sql`` unless set."""
    kind = os.environ.get(CATALOG_ENV, "sql").strip().lower() or "sql"
    if kind not in CATALOGS:
        raise IcebergFormatError(f"{CATALOG_ENV}={kind!r} is not a known Iceberg catalog; set it to one of {CATALOGS}")
    return kind


def _io_properties(lake: Lake) -> dict[str, str]:
    """pyiceberg's FileIO properties for the lake's storage: an S3 lake's Airflow connection, nothing locally."""
    from cdc_compaction.core.storage.s3 import S3Storage

    return lake.storage.pyiceberg_properties() if isinstance(lake.storage, S3Storage) else {}


def _catalog(rt: Runtime, lake: Lake) -> Any:
    """The catalog holding ``<db>.<t>_iceberg`` (see the module docstring for the choice)."""
    kind = catalog_kind()
    name = f"cdc_{rt.cfg.database}"
    io = _io_properties(lake)
    if kind == "glue":
        from pyiceberg.catalog.glue import GlueCatalog

        from cdc_compaction.core.storage.s3 import S3Storage

        if not isinstance(lake.storage, S3Storage):
            raise IcebergFormatError(
                f"{rt.cfg.qualified_name}: {CATALOG_ENV}=glue names files on S3, but the storage root "
                f"{lake.layout.root} is local; set {CATALOG_ENV}=sql for local storage roots"
            )
        return GlueCatalog(name, client=lake.storage.aws_client("glue"), **io)
    if kind == "hive":
        from pyiceberg.catalog.hive import HiveCatalog

        if rt.metastore.kind != "thrift":
            raise IcebergFormatError(
                f"{rt.cfg.qualified_name}: {CATALOG_ENV}=hive needs a Thrift metastore, but the metastore is "
                f"{rt.metastore.uri}; set {CATALOG_ENV}=sql or point CDC_METASTORE_URI at a Thrift metastore"
            )
        # hive2-compatible: a Hive 2.x metastore refuses the Hive 3 fields pyiceberg sets otherwise.
        return HiveCatalog(name, uri=rt.metastore.uri, **{"hive.hive2-compatible": "true"}, **io)
    from pyiceberg.catalog.sql import SqlCatalog

    meta = metadata_dir(lake)
    if "://" in meta:
        raise IcebergFormatError(
            f"{rt.cfg.qualified_name}: the SQL Iceberg catalog is a SQLite file under the table root, and "
            f"{meta} is not on a local file system; set {CATALOG_ENV}=glue (or hive, the table's metastore) "
            "for S3 lakes"
        )
    lake.storage.makedirs(meta)
    return SqlCatalog(name, uri=f"sqlite:///{posixpath.join(meta, SQLITE_FILE)}", warehouse=_uri(table_root(lake)))


def _load(catalog: Any, cfg: TableConfig) -> Any | None:
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier(cfg))
    except NoSuchTableError:
        return None


def is_stale(lake: Lake, table: Any) -> bool:
    """Does the catalog's table describe another root (the lake was copied, restored or moved)?

    Iceberg metadata names every file by absolute URI, so metadata written under the old root
    names the old root's files (and its catalog entry the old root's metadata): read on the copy,
    it would show the old root's rows.  It is stale when its location or its metadata file is not
    under this table's ``<root>/iceberg``."""
    here = _strip(table_root(lake)).rstrip("/")
    location = _strip(str(table.location())).rstrip("/")
    metadata = _strip(str(table.metadata_location))
    return location != here or not metadata.startswith(here + "/")


def _load_current(rt: Runtime, catalog: Any, lake: Lake) -> Any | None:
    """The Iceberg table if it describes this root; a stale one (:func:`is_stale`) is dropped from the catalog
    and its copied metadata deleted here (never the other root's files), so the caller writes it anew."""
    table = _load(catalog, rt.cfg)
    if table is None or not is_stale(lake, table):
        return table
    log.warning(
        "%s: the Iceberg table %s describes %s, not %s (the lake was copied or moved): it is written anew",
        rt.cfg.qualified_name,
        ".".join(identifier(rt.cfg)),
        table.location(),
        table_root(lake),
    )
    catalog.drop_table(identifier(rt.cfg))  # the catalog entry only: no file of the other root is touched
    _delete_metadata_files(lake)
    return None


def _delete_metadata_files(lake: Lake) -> None:
    """Every file under ``metadata/`` but the SQL catalog (metadata.json, manifests, manifest lists)."""
    if not lake.storage.exists(metadata_dir(lake)):
        return
    for e in lake.storage.list_dir(metadata_dir(lake)):
        if not e.is_dir and not e.name.startswith(SQLITE_FILE):
            lake.storage.delete(e.path)


def _write_version_hint(lake: Lake, table: Any) -> None:
    """Point ``metadata/version-hint.text`` at ``table``'s current metadata file (:data:`VERSION_HINT`).

    Written after every commit, expiry and regeneration: a reader that opens the table by its
    directory finds the metadata the catalog holds, never an older one."""
    name = posixpath.basename(_strip(str(table.metadata_location)))
    stem = name[: -len(".metadata.json")] if name.endswith(".metadata.json") else name
    lake.storage.write_text(posixpath.join(metadata_dir(lake), VERSION_HINT), stem)


# ------------------------------------------------------------------ snapshots and commits
def snapshot_seq(snapshot: Any) -> int | None:
    """The lake commit a snapshot describes (its summary's ``cdc.commit_seq``), None for another writer's."""
    value = (snapshot.summary.additional_properties if snapshot.summary else {}).get(SEQ_PROPERTY)
    return int(value) if value is not None and str(value).isdigit() else None


def snapshot_for_seq(table: Any, seq: int) -> Any | None:
    """The snapshot of lake commit ``seq`` (time travel: ``table.scan(snapshot_id=...)``), None if expired."""
    for snap in table.snapshots():
        if snapshot_seq(snap) == seq:
            return snap
    return None


def synced_seqs(table: Any) -> list[int]:
    """The lake commits the table has a snapshot of, in order."""
    return sorted(s for snap in table.snapshots() if (s := snapshot_seq(snap)) is not None)


def _version_files(lake: Lake, commit: Commit) -> list[str]:
    """The Parquet data files of ``commit``'s visible rows (never its tombstones), as URIs, sorted."""
    if commit.layout < 2:
        raise IcebergFormatError(
            f"{lake.cfg.qualified_name}: commit {commit.seq} ({commit.version}) has layout 1, where the "
            "tombstones are among the visible rows: Iceberg readers would show deleted rows. Compact the table "
            "once more (the next version has layout 2) or `rebuild` it; its snapshots start there"
        )
    dirs = list(commit.partitions.values()) if commit.partitions is not None else [lake.data_location(commit)]
    files = []
    for d in dirs:
        for e in lake.storage.list_dir(d):
            # Spark's markers (_SUCCESS) and writers' hidden temporaries are not data.
            if not e.is_dir and e.name.endswith(".parquet") and not e.name.startswith(("_", ".")):
                files.append(_uri(e.path))
    return sorted(files)


def _arrow_schema_of(io: Any, uri: str) -> Any:
    import pyarrow.parquet as pq

    with io.new_input(uri).open() as stream:
        return pq.read_metadata(stream).schema.to_arrow_schema()


def _unified_arrow_schema(schemas: list[Any], current: Any = None) -> Any:
    """The files' Arrow schemas as one, every timestamp column of one type (docs/formats.md#int96-timestamps).

    Spark's INT96 files read as ``timestamp[ns]``, its INT64 microsecond ones (adjusted to UTC) as
    ``timestamp[us, tz=UTC]``, and a version reusing older partitions holds both, which Arrow cannot
    unify. The Iceberg specification allows no change between ``timestamp`` and ``timestamptz``, so a
    column keeps the type the table (``current``) has; a new column is ``timestamptz`` when a file holds
    it adjusted to UTC, else ``timestamp`` (INT96 files only, as tables made before INT64 were)."""
    import pyarrow as pa
    from pyiceberg.types import TimestampType, TimestamptzType

    zoned = {f.name.lower() for s in schemas for f in s if pa.types.is_timestamp(f.type) and f.type.tz is not None}
    for f in current.fields if current is not None else ():
        if isinstance(f.field_type, TimestamptzType):
            zoned.add(f.name.lower())
        elif isinstance(f.field_type, TimestampType):
            zoned.discard(f.name.lower())

    def one_type(schema: Any) -> Any:
        fields = [
            f.with_type(pa.timestamp("us", tz="UTC" if f.name.lower() in zoned else None))
            if pa.types.is_timestamp(f.type)
            else f
            for f in schema
        ]
        return pa.schema(fields, metadata=schema.metadata)

    return pa.unify_schemas([one_type(s) for s in schemas], promote_options="permissive")


def _iceberg_schema(arrow_schema: Any) -> Any:
    """An Iceberg schema for the files' Arrow schema: every column optional, nanoseconds (Spark's INT96) as micros."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
    from pyiceberg.schema import assign_fresh_schema_ids

    fields = [pa.field(f.name, f.type, nullable=True) for f in arrow_schema if not f.name.startswith("__")]
    return assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(pa.schema(fields), downcast_ns_timestamp_to_us=True))


def _partition_spec(cfg: TableConfig, schema: Any) -> Any:
    """The registry's ``partition_by`` as an Iceberg spec: the same transform on the same column."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform, IdentityTransform, MonthTransform, YearTransform

    part = cfg.partition_by
    if part is None:
        return UNPARTITIONED_PARTITION_SPEC
    transforms = {"identity": IdentityTransform, "day": DayTransform, "month": MonthTransform, "year": YearTransform}
    source = schema.find_field(part.column, case_sensitive=False)
    name = source.name if part.transform == "identity" else f"{source.name}_{part.transform}"
    return PartitionSpec(
        PartitionField(source_id=source.field_id, field_id=1000, transform=transforms[part.transform](), name=name)
    )


def _data_file(io: Any, metadata: Any, uri: str) -> Any:
    """Iceberg's description of one existing Parquet file (size, counts, bounds, partition): what
    pyiceberg's ``add_files`` makes, except that Spark's INT96 timestamps are accepted as microseconds."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import (
        MetricModeTypes,
        MetricsMode,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    input_file = io.new_input(uri)
    with input_file.open() as stream:
        footer = pq.read_metadata(stream)
    schema = metadata.schema()
    mapping = parquet_path_to_id_mapping(schema)
    plan = compute_statistics_plan(schema, metadata.properties)
    # Spark's INT96 timestamps have no usable min/max (Parquet leaves their order undefined): counts only.
    int96 = {
        mapping[col.path]
        for col in (footer.schema.column(i) for i in range(footer.num_columns))
        if col.physical_type == "INT96" and col.path in mapping
    }
    counts = MetricsMode(MetricModeTypes.COUNTS)
    plan = {fid: dataclasses.replace(c, mode=counts) if fid in int96 else c for fid, c in plan.items()}
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer, stats_columns=plan, parquet_column_mapping=mapping
    )
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=uri,
        file_format=FileFormat.PARQUET,
        partition=stats.partition(metadata.spec(), schema),
        file_size_in_bytes=len(input_file),
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **stats.to_serialized_dict(),
    )


def _current_files(metadata: Any, io: Any) -> dict[str, Any]:
    """The data files of the current snapshot, by path."""
    snap = metadata.current_snapshot()
    if snap is None:
        return {}
    return {
        entry.data_file.file_path: entry.data_file
        for manifest in snap.manifests(io)
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True)
    }


def _table_properties(cfg: TableConfig) -> dict[str, str]:
    return {
        "cdc.managed_by": "cdc_compaction",
        "cdc.source_table": cfg.qualified_name,
        "format-version": "2",
        # Old metadata.json files go with each commit: no metadata file outlives what retention keeps.
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": str(max(cfg.keep_versions, 1)),
    }


def _create(catalog: Any, lake: Lake, cfg: TableConfig, files: list[str], io_probe: Any) -> Any:
    """A transaction creating ``<db>.<t>_iceberg`` with the schema of the first version it describes.

    The first snapshot is committed in the same transaction (:func:`_fill`): the table's first
    metadata file already carries it, stamped with its commit's time, so no metadata file of the
    table says "updated now" before a snapshot of an earlier time (Iceberg readers check that the
    metadata log and the snapshot log run forward)."""

    from cdc_compaction.core.inputs import arrow_schema

    # An empty first version: the registry's columns.
    arrow = _unified_arrow_schema([_arrow_schema_of(io_probe, f) for f in files]) if files else arrow_schema(cfg)
    schema = _iceberg_schema(arrow)
    from pyiceberg.exceptions import NamespaceAlreadyExistsError

    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(cfg.database)
    return catalog.create_table_transaction(
        identifier(cfg),
        schema=schema,
        location=_uri(table_root(lake)),
        partition_spec=_partition_spec(cfg, schema),
        properties=_table_properties(cfg),
    )


def committed_ms(commit: Commit) -> int | None:
    """The lake commit's time (its record's ``committed_at``) in milliseconds, None if it has none."""
    from datetime import datetime

    if not commit.committed_at:
        return None
    return int(datetime.fromisoformat(commit.committed_at).timestamp() * 1000)


def _stamp(tx: Any, commit: Commit) -> None:
    """Give the snapshot ``tx`` adds its lake commit's time as ``timestamp-ms`` (pyiceberg stamps "now").

    Time travel by timestamp (Spark's and Trino's ``TIMESTAMP AS OF``, pyiceberg's
    ``snapshot_as_of_timestamp``) reads the snapshot log, whose entries take this time: a late sync,
    or the regeneration after an erase, keeps each version's time.  Never earlier than the metadata
    the transaction starts from (more than Iceberg's one-minute tolerance back fails Java readers'
    checks): a snapshot synced after an expiry that came later than its commit takes that time."""
    from pyiceberg.table.update import AddSnapshotUpdate

    ms = committed_ms(commit)
    if ms is None:
        return
    # pyiceberg's transactions keep their table (a create's: the staged one) and updates privately, and
    # take no snapshot time: these two fields are the only way in (pinned pyiceberg, tested).
    base = tx._table.metadata  # what the transaction starts from (a create's: no snapshot, no log)
    if base.snapshots or base.metadata_log:
        ms = max(ms, base.last_updated_ms)
    # The transaction's metadata is derived from its updates: replacing the update re-stamps both the
    # snapshot and the snapshot log entry its main branch update adds.
    tx._updates = tuple(
        AddSnapshotUpdate(snapshot=u.snapshot.model_copy(update={"timestamp_ms": ms}))
        if isinstance(u, AddSnapshotUpdate)
        else u
        for u in tx._updates
    )


def _fill(tx: Any, commit: Commit, files: list[str]) -> None:
    """One Iceberg commit in ``tx``: the snapshot of lake ``commit``, replacing the previous snapshot's
    files with its own, stamped with the commit's time (:func:`_stamp`)."""

    io = tx._table.io  # a create transaction's staged table has no other way to its FileIO
    if tx.table_metadata.name_mapping() is None:
        # The files have no Iceberg field ids: readers find columns by name (pyiceberg's add_files does this too).
        tx.set_properties(**{NAME_MAPPING: tx.table_metadata.schema().name_mapping.model_dump_json()})
    if files:
        arrow = _unified_arrow_schema([_arrow_schema_of(io, f) for f in files], tx.table_metadata.schema())
        new_schema = _iceberg_schema(arrow)
        current = {f.name.lower(): f.field_type for f in tx.table_metadata.schema().fields}
        # schema_changes: evolve -- a column the version added (or widened) joins the schema; nothing is dropped.
        if any(current.get(f.name.lower()) != f.field_type for f in new_schema.fields):
            with tx.update_schema(allow_incompatible_changes=False) as upd:
                upd.union_by_name(new_schema)
    before = _current_files(tx.table_metadata, io)
    wanted = set(files)
    added = [_data_file(io, tx.table_metadata, f) for f in files if f not in before]
    props = {SEQ_PROPERTY: str(commit.seq), VERSION_PROPERTY: commit.version}
    with tx.update_snapshot(snapshot_properties=props).overwrite() as ow:
        for path, data_file in before.items():
            if path not in wanted:
                ow.delete_data_file(data_file)
        for data_file in added:
            ow.append_data_file(data_file)
    _stamp(tx, commit)


def _commit(rt: Runtime, tx: Any, commit: Commit, files: list[str]) -> None:
    """:func:`_fill` ``tx`` (a table's transaction, or the create transaction) and commit it, with a
    metastore that cannot lock named for what it is."""
    from thrift.transport.TTransport import TTransportException

    # The crash window this module heals: the lake's commit stands, its snapshot is not written yet.
    fault_point("formats.before_iceberg_commit", rt.cfg.qualified_name)
    try:
        _fill(tx, commit, files)
        tx.commit_transaction()
    except TTransportException as exc:
        # pyiceberg's HiveCatalog takes a metastore lock (lock()) for every commit. A Hive 2.3 metastore
        # without transaction support (TxnHandler's JDBC pool, BoneCP by default, and its HIVE_LOCKS tables)
        # fails that call and closes the connection: the snapshot is not committed (nothing half-written).
        raise IcebergFormatError(
            f"{rt.cfg.qualified_name}: the Hive metastore {rt.metastore.uri} dropped the Iceberg commit of lake "
            f"commit {commit.seq} to {'.'.join(identifier(rt.cfg))} ({exc}). pyiceberg locks the table through "
            "the metastore's lock() call, which needs the metastore's transaction tables (TXNS, HIVE_LOCKS: "
            "made by Hive's schematool -initSchema/-upgradeSchema, not by datanucleus.schema.autoCreateAll); "
            "a metastore without them refuses every commit (Hive 4.0.0 with them was tested). "
            f"Enable it on the metastore, or set {CATALOG_ENV}=sql (local storage roots). The lake commit stands; "
            "the next sync adds the missing snapshots"
        ) from exc


def sync(rt: Runtime, lake: Lake, kept: list[Commit]) -> dict[str, Any]:
    """Give every kept commit up to the live one its snapshot, in order; idempotent.

    ``kept`` are the commits whose versions are on storage (the live one last).  Commits the
    table has a snapshot of, and older ones, are left alone (never described twice); a commit
    whose version retention already deleted cannot be described, so a new table starts at the
    oldest kept commit.
    """
    cfg = rt.cfg
    commits = sorted((c for c in kept if c.seq > 0), key=lambda c: c.seq)
    catalog = _catalog(rt, lake)
    table = _load_current(rt, catalog, lake)
    done = synced_seqs(table) if table is not None else []
    top = done[-1] if done else 0
    synced = []
    for commit in commits:
        if commit.seq <= top:
            continue
        files = _version_files(lake, commit)
        if table is None:
            from pyiceberg.io.pyarrow import PyArrowFileIO

            tx = _create(catalog, lake, cfg, files, PyArrowFileIO(_io_properties(lake)))
        else:
            tx = table.transaction()
        _commit(rt, tx, commit, files)
        table = catalog.load_table(identifier(cfg))
        synced.append(commit.seq)
        log.info("%s: Iceberg snapshot of commit %d (%d files)", cfg.qualified_name, commit.seq, len(files))
    if table is not None:
        _write_version_hint(lake, table)
    at = max([top, *synced]) if (top or synced) else None
    return {"format": FORMAT, "table": ".".join(identifier(cfg)), "synced": synced, "at": at}


def expire(rt: Runtime, lake: Lake, keep_seqs: set[int]) -> None:
    """Drop the snapshots of commits not in ``keep_seqs`` (before retention deletes their files),
    then the manifests and manifest lists no remaining snapshot needs."""
    catalog = _catalog(rt, lake)
    table = _load_current(rt, catalog, lake)
    if table is None:
        return
    current = table.current_snapshot()
    gone = [
        s.snapshot_id
        for s in table.snapshots()
        if snapshot_seq(s) not in keep_seqs and (current is None or s.snapshot_id != current.snapshot_id)
    ]
    if gone:
        table.maintenance.expire_snapshots().by_ids(gone).commit()
        table = catalog.load_table(identifier(rt.cfg))
        log.info("%s: expired %d Iceberg snapshots", rt.cfg.qualified_name, len(gone))
        _write_version_hint(lake, table)
    _sweep_metadata(lake, table)


def _sweep_metadata(lake: Lake, table: Any) -> list[str]:
    """Delete manifest (lists) of ``metadata/`` no snapshot references any more (expired snapshots',
    or a crashed commit's); metadata.json files go by ``write.metadata.delete-after-commit``."""
    io = table.io
    keep = set()
    for snap in table.snapshots():
        keep.add(_strip(snap.manifest_list))
        keep |= {_strip(m.manifest_path) for m in snap.manifests(io)}
    removed = []
    for e in lake.storage.list_dir(metadata_dir(lake)):
        if not e.is_dir and e.name.endswith(".avro") and _strip(e.path) not in keep:
            lake.storage.delete(e.path)
            removed.append(e.name)
    return removed


def regenerate(rt: Runtime, lake: Lake, kept: list[Commit]) -> None:
    """Write the Iceberg metadata again from the kept commits' files, as they are now.

    After ``erase`` rewrote files under their names, the old manifests' column bounds may still
    hold erased values: the table is dropped from the catalog, every file under ``metadata/``
    (old ``*.metadata.json``, manifests, manifest lists) deleted, and one snapshot per kept
    commit made again from the files' current footers.  Snapshot ids change; commit numbers
    (``cdc.commit_seq``) do not, so time travel by commit works as before.
    """
    catalog = _catalog(rt, lake)
    if _load(catalog, rt.cfg) is not None:
        catalog.drop_table(identifier(rt.cfg))
    _delete_metadata_files(lake)
    sync(rt, lake, kept)
