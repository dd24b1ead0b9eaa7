"""Every published version as a Delta table: a Delta log at ``base/_delta_log`` over the base's own files.

Layout and why (docs/formats.md, "Delta and Iceberg")::

    base/_delta_log/00000000000000000007.json              Delta version 7 = lake commit 7
    base/_delta_log/00000000000000000005.checkpoint.parquet   the oldest kept version's full state
    base/_delta_log/_last_checkpoint                       where readers start
    base/v00000007-<plan>-<attempt>/data/part-*.parquet    the data files, named relative to base/

* **The table root is ``base/``.**  A Delta add action names a file relative to the table root;
  absolute URIs are legal in the protocol but delta-rs' and polars' readers join them onto the
  root (they read ``<root>/file:/...``), and relative paths keep working when the whole storage
  root is copied elsewhere.  Every data file lies under ``base/``, so ``base/`` is the root.
* **Delta version N is lake commit N.**  Each lake commit is one Delta commit (``commitInfo`` carries
  ``cdc.commit_seq`` = N as well): ``VERSION AS OF N`` in any engine reads what ``travel`` calls
  version N.  The commit file is created with create-if-absent (the protocol's mutual exclusion),
  so an entry is never written twice, and whatever is missing up to the live commit is appended by
  the next sync.  A log that starts after version 0 (formats enabled on a table with history,
  older versions expired) starts with a checkpoint of its first version, as after Delta's own log
  cleanup.
* **Commit times.**  Each commit file gets its lake commit's time as its modification time (and its
  ``commitInfo.timestamp``): readers travel by timestamp through it, so a late sync or an erase's
  rewrite keeps each version's time (local storage; S3 sets an object's time itself).
* **Only visible rows.**  A commit removes the files of the previous version it no longer has and
  adds the new version's files (a partitioned table's untouched partitions stay as they are);
  tombstones (``tombstones/``), key indexes and stats files are never named.  Each add carries
  ``numRecords``, ``nullCount`` and (for integer, string, date and boolean columns) exact
  ``minValues``/``maxValues`` from the Parquet footer: no float (NaN), timestamp (millisecond
  truncation) or decimal bounds, which a reader could skip files on wrongly -- except on the
  partition column (next point).
* **Partitioned tables are unpartitioned for Delta**, and readers skip files by the real column's
  statistics.  ``_cdc_partition`` (the directory's name, with encoded values like ``~VIP~``) is no
  column of the Delta table: the files do not hold it, and a reader filters by the column itself.
  Nor is that column a Delta partition column: a Delta reader takes a partition column's values from
  ``partitionValues``, not the file, and the lake keeps NULL and '' in one ``__null__`` directory ('' would
  read back as NULL); and day/month/year of a timestamp as generated columns depend on the reader's
  time zone.  Each file of a partitioned version holds one partition's rows, so exact bounds of the
  partition column (:func:`_partition_column_stats`) let readers skip every other partition's files:
  from the footer, or from that column's values when the footer has none (Spark's INT96
  timestamps); timestamps floored (min) and ceiled (max) to the millisecond, Delta's precision.
  A log written before, partitioned by ``_cdc_partition``, is written anew by the next sync
  (:func:`_directory_partitioned`), every kept version with it, so time travel reads each version in
  the same form.
* **Retention.**  Before retention deletes a version's files (:func:`expire`), the oldest kept
  version gets a checkpoint and every older commit file and checkpoint is deleted: a reader asking
  for an expired version gets "version not found", never a missing data file.  Time travel reaches
  exactly the kept versions.
* **Erase** rewrites files in place; :func:`regenerate` then rewrites the whole log from the kept
  commits (sizes and bounds from the rewritten files), so no erased value stays in the log.  It marks
  the log while it runs (:data:`REGENERATING`): a rewrite killed midway is redone by the next sync.
* **Schema.**  A commit's ``metaData`` adds the columns its version added and keeps every column the
  log had (a rollback's record has the older version's columns: :func:`_kept_columns`).
* **Read-only for engines.**  The lake writes this log; an engine must not write to the table or
  VACUUM it (``base/`` holds files the log does not name: tombstones, in-flight attempts).  The
  log sets ``delta.deletedFileRetentionDuration`` to 100 years so that a VACUUM run by mistake
  (without RETAIN) deletes nothing.

The log is written with the lake's own storage (local or S3, with the table's connection), in plain
JSON and one Parquet checkpoint per expiry, following the Delta protocol (reader 1, writer 2): the
``deltalake`` package writes a log of its own files only (its writers take no existing files with
their own statistics into a commit numbered as we need), so it serves as a reader in the tests.
"""

from __future__ import annotations

import io
import json
import logging
import posixpath
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from cdc_compaction.core.exceptions import FormatError, PreconditionFailedError
from cdc_compaction.core.storage.base import is_data_file
from cdc_compaction.job.contract import PARTITION_COLUMN
from cdc_compaction.job.faults import fault_point
from cdc_compaction.pipeline.owned import remove_format_metadata

if TYPE_CHECKING:
    from cdc_compaction.core.lake import Commit, Lake
    from cdc_compaction.core.registry import TableConfig
    from cdc_compaction.pipeline.runtime import Runtime

log = logging.getLogger(__name__)

LOG_DIR = "_delta_log"
LAST_CHECKPOINT = "_last_checkpoint"
#: Present while :func:`regenerate` rewrites the log (hidden: no Delta reader lists it).  A rewrite that
#: died midway (a killed erase) leaves commit files with the sizes and bounds of files since rewritten:
#: the next :func:`sync` sees the marker and writes the whole log anew before anything else.
REGENERATING = ".cdc_regenerating"
#: The commitInfo key (and table property prefix) naming the lake commit a Delta version is.
SEQ_KEY = "cdc.commit_seq"
PROTOCOL = {"minReaderVersion": 1, "minWriterVersion": 2}
#: Hive type -> Delta primitive type.
_TYPES = {
    "tinyint": "byte",
    "smallint": "short",
    "int": "integer",
    "integer": "integer",
    "bigint": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "boolean": "boolean",
    "date": "date",
    "timestamp": "timestamp",
    "binary": "binary",
}
#: Delta types whose Parquet min/max are written as bounds (exact, and compared as readers compare).
_BOUNDED = {"byte", "short", "integer", "long", "string", "date", "boolean"}
_META_COLUMNS = (
    ("_cdc_increment", "string"),
    ("_cdc_file", "string"),
    ("_cdc_pos", "bigint"),
    ("_cdc_ingested_at", "timestamp"),
)
#: A crashed write's hidden temporary of one of the log's own files (the storage writes
#: ``.<name>.<random>.tmp`` beside ``<name>`` and renames it): ``.00000000000000000003.json.abcd.tmp``.
_TEMPORARY = re.compile(r"^\.(\d{20}\.json|\d{20}\.checkpoint\.parquet|_last_checkpoint)\..*\.tmp$")


# ------------------------------------------------------------------------------ where
def table_root(lake: Lake) -> str:
    """The Delta table's root (its location for engines): ``base/``, under which every data file lies."""
    return lake.layout.base


def metadata_root(lake: Lake) -> str:
    """``base/_delta_log``: the log, all of this format's files (derived)."""
    return posixpath.join(table_root(lake), LOG_DIR)


def commit_path(lake: Lake, version: int) -> str:
    return posixpath.join(metadata_root(lake), f"{version:020d}.json")


def checkpoint_path(lake: Lake, version: int) -> str:
    return posixpath.join(metadata_root(lake), f"{version:020d}.checkpoint.parquet")


# ------------------------------------------------------------------------------ schema
def delta_type(hive_type: str) -> str:
    """The Delta type of a Hive column type (varchar/char read as string)."""
    t = hive_type.strip().lower()
    if t in _TYPES:
        return _TYPES[t]
    if t.startswith("decimal"):
        return "decimal(10,0)" if t == "decimal" else t.replace(" ", "")
    if t.startswith(("varchar", "char")):
        return "string"
    raise FormatError(f"column type {hive_type!r} has no Delta type here; remove 'delta' from the table's formats")


def table_columns(cfg: TableConfig, commit: Commit) -> list[tuple[str, str]]:
    """The Delta table's columns as ``commit`` was written (name, Hive type): registry, mode's, ``_cdc_*``.

    The base table's columns stored in its files: not ``_cdc_partition``, which only the directory names
    carry (module docstring, "Partitioned tables")."""
    from cdc_compaction.core import sql

    own = (commit.schema or {}).get("columns")
    cols = [(c["name"], c["type"]) for c in own] if own else [(c.name, c.type) for c in cfg.columns]
    cols += [(n, t) for n, t, _ in getattr(sql.context(cfg), "mode_columns", [])]
    cols += list(_META_COLUMNS)
    return cols


def metadata_action(cfg: TableConfig, commit: Commit, table_id: str, created_ms: int) -> dict[str, Any]:
    fields = [
        {"name": n, "type": delta_type(t), "nullable": True, "metadata": {}} for n, t in table_columns(cfg, commit)
    ]
    return {
        "metaData": {
            "id": table_id,
            "name": cfg.table,
            "description": f"{cfg.qualified_name}: the lake's published versions (cdc_compaction; read-only)",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps({"type": "struct", "fields": fields}, separators=(",", ":")),
            "partitionColumns": [],  # always: a partitioned table is skipped by its column's stats (docstring)
            "configuration": {
                # A VACUUM run by mistake without RETAIN deletes nothing (module docstring).
                "delta.deletedFileRetentionDuration": "interval 36500 days",
                "cdc.managed_by": "cdc_compaction",
                "cdc.table": cfg.qualified_name,
            },
            "createdTime": created_ms,
        }
    }


# ------------------------------------------------------------------------------ files and stats
@dataclass(frozen=True)
class DataFile:
    rel: str  # relative to the table root, not URI-encoded
    path: str
    size: int
    mtime_ms: int


def _walk(lake: Lake, directory: str) -> list[Any]:
    out = []
    for e in lake.storage.list_dir(directory):
        if e.is_dir:
            if is_data_file(e.name):
                out += _walk(lake, e.path)
        elif is_data_file(e.name):
            out.append(e)
    return out


def version_files(lake: Lake, commit: Commit) -> list[DataFile]:
    """The data files of ``commit``'s visible rows (never its tombstones)."""
    if commit.seq == 0:
        return []
    if commit.layout < 2:
        raise FormatError(
            f"{lake.cfg.qualified_name}: commit {commit.seq} ({commit.version}) has layout 1 (tombstones among its "
            "rows): it is no table of visible rows. The next compaction writes layout 2"
        )
    if commit.partitions is not None:
        where = [loc for _, loc in sorted(commit.partitions.items())]
    else:
        where = [lake.data_location(commit)]
    root = table_root(lake).rstrip("/") + "/"
    out = []
    for loc in where:
        if not lake.storage.exists(loc):
            raise FormatError(
                f"{lake.cfg.qualified_name}: commit {commit.seq}'s data {loc} is not on storage; it cannot be "
                "described (retention deleted it, or it was moved)"
            )
        for e in _walk(lake, loc):
            if not e.path.startswith(root):
                raise FormatError(
                    f"{lake.cfg.qualified_name}: commit {commit.seq}'s file {e.path} lies outside {root}: a Delta "
                    "table names files under its root only"
                )
            out.append(DataFile(e.path[len(root) :], e.path, e.size, int(e.mtime * 1000)))
    return sorted(out, key=lambda f: f.rel)


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _footer_bounds(meta: Any, i: int, bounded: bool, raw: bool = False) -> tuple[int | None, Any, Any, bool]:
    """Column ``i``'s null count and, if ``bounded``, its min and max over every row group, from the footer.

    Returns ``(nulls, lo, hi, exact)``: ``nulls`` None if a row group has no null count; ``exact`` False if
    a row group with values has no min/max or only inexact (truncated) ones.  ``raw``: the physical values
    (an INT64 timestamp's integer in its unit) instead of pyarrow's conversion."""
    nulls: int | None = 0
    lo, hi, exact = None, None, bounded
    for rg in range(meta.num_row_groups):
        st = meta.row_group(rg).column(i).statistics
        if st is None or not st.has_null_count:
            return None, None, None, False
        nulls = (nulls or 0) + st.null_count
        if not exact:
            continue
        if not st.has_min_max:
            if st.null_count == meta.row_group(rg).num_rows:
                continue  # all null: no bound to take
            exact = False
            continue
        if not (getattr(st, "is_min_value_exact", True) and getattr(st, "is_max_value_exact", True)):
            exact = False
            continue
        mn, mx = (st.min_raw, st.max_raw) if raw else (st.min, st.max)
        lo = mn if lo is None or mn < lo else lo
        hi = mx if hi is None or mx > hi else hi
    return nulls, lo, hi, exact


#: A timestamp unit's ticks per millisecond (Delta's timestamp statistics are milliseconds).
_PER_MS = {"ms": 1, "us": 1000, "ns": 1_000_000}


def _timestamp_text(ms: int) -> str | None:
    """Epoch milliseconds as Delta writes a timestamp statistic (UTC, ``2026-11-22T10:00:00.123Z``); None if
    out of the range a reader can parse (then no bound is written: never a wrong one)."""
    from datetime import UTC, timedelta

    try:
        t = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    except OverflowError:
        return None
    # isoformat pads the year to four digits (strftime's %Y does not on glibc for years before 1000).
    return t.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def _partition_column_stats(pf: Any, i: int, name: str, delta_kind: str) -> tuple[int | None, Any, Any]:
    """Exact ``(nullCount, min, max)`` of the partition column (JSON-ready), for a reader to skip files by.

    Each file of a partitioned version holds one partition's rows, so the bounds are tight.  From the
    footer when it has exact ones; else (Spark's INT96 timestamps: no min/max in the footer, whose order
    Parquet leaves undefined; a truncated string statistic) from the column's values, reading that column
    only.  Timestamps: min floored and max ceiled to the millisecond (Delta's statistics are milliseconds,
    so a bound truncated toward the value would let a reader skip a file holding a matching row).
    Decimals get no bounds (their JSON numbers are not exact for readers); ``(None, None, None)`` leaves the
    column without stats."""
    import pyarrow as pa
    import pyarrow.compute as pc

    meta = pf.metadata
    if delta_kind == "timestamp":
        kind = pf.schema_arrow.field(name).type
        if not pa.types.is_timestamp(kind) or kind.unit not in _PER_MS:
            return None, None, None
        per_ms = _PER_MS[kind.unit]
        nulls, lo, hi, exact = None, None, None, False
        if meta.schema.column(i).physical_type == "INT64":
            nulls, lo, hi, exact = _footer_bounds(meta, i, True, raw=True)
        if nulls is None or not exact or (lo is None and nulls < meta.num_rows):
            values = pf.read(columns=[name]).column(name).cast(pa.int64())
            nulls = values.null_count
            bounds = pc.min_max(values).as_py()
            lo, hi = bounds["min"], bounds["max"]
        if lo is None or hi is None:
            return nulls, None, None
        return nulls, _timestamp_text(lo // per_ms), _timestamp_text(-(-hi // per_ms))
    nulls, lo, hi, exact = _footer_bounds(meta, i, delta_kind in _BOUNDED)
    if delta_kind not in _BOUNDED:
        return nulls, None, None
    if nulls is None or not exact or (lo is None and nulls < meta.num_rows):
        values = pf.read(columns=[name]).column(name)
        nulls = values.null_count
        bounds = pc.min_max(values).as_py()
        lo, hi = bounds["min"], bounds["max"]
    return nulls, None if lo is None else _json_value(lo), None if hi is None else _json_value(hi)


def file_stats(lake: Lake, f: DataFile, types: dict[str, str]) -> dict[str, Any]:
    """``numRecords``, ``nullCount`` and exact bounds of one file, from its Parquet footer.

    The partition column (``partition_by.column``) always gets exact bounds, from its values when the
    footer has none (:func:`_partition_column_stats`)."""
    import pyarrow.parquet as pq

    part = lake.cfg.partition_by.column if lake.cfg.partition_by is not None else None
    with lake.storage.open_read(f.path) as fh:
        # INT96 read as microseconds (Spark's precision): nanoseconds would overflow outside 1677-2262.
        pf = pq.ParquetFile(fh, coerce_int96_timestamp_unit="us")
        meta = pf.metadata
        stats: dict[str, Any] = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
        for i in range(meta.num_columns):
            name = meta.schema.column(i).path
            if "." in name or name not in types:
                continue
            if name == part:
                nulls, lo, hi = _partition_column_stats(pf, i, name, types[name])
            else:
                nulls, lo, hi, exact = _footer_bounds(meta, i, types[name] in _BOUNDED)
                lo, hi = (_json_value(lo), _json_value(hi)) if exact else (None, None)
            if nulls is not None:
                stats["nullCount"][name] = nulls
            if lo is not None and hi is not None:
                stats["minValues"][name] = lo
                stats["maxValues"][name] = hi
    return stats


def _uri(rel: str) -> str:
    """The add action's path: a relative URI (percent-encoded, as the protocol says)."""
    return quote(rel, safe="/=-_.~")


def add_action(lake: Lake, f: DataFile, types: dict[str, str]) -> dict[str, Any]:
    return {
        "add": {
            "path": _uri(f.rel),
            "partitionValues": {},
            "size": f.size,
            "modificationTime": f.mtime_ms,
            "dataChange": True,
            "stats": json.dumps(file_stats(lake, f, types), separators=(",", ":")),
        }
    }


def remove_action(add: dict[str, Any], when_ms: int) -> dict[str, Any]:
    return {
        "remove": {
            "path": add["path"],
            "deletionTimestamp": when_ms,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": add.get("partitionValues") or {},
            "size": add.get("size"),
        }
    }


# ------------------------------------------------------------------------------ reading the log back
@dataclass
class LogState:
    """The replayed log: its versions, and the table at ``version`` (files by path, metadata)."""

    json_versions: list[int] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    version: int | None = None
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None


def _listing(lake: Lake) -> tuple[list[int], list[int]]:
    jsons, cps = [], []
    for e in lake.storage.list_dir(metadata_root(lake)):
        stem = e.name.split(".")[0]
        if e.is_dir or not stem.isdigit() or len(stem) != 20:
            continue
        if e.name.endswith(".checkpoint.parquet"):
            cps.append(int(stem))
        elif e.name == f"{stem}.json":
            jsons.append(int(stem))
    return sorted(jsons), sorted(cps)


def _apply(state: LogState, action: dict[str, Any]) -> None:
    if action.get("add"):
        state.files[action["add"]["path"]] = action["add"]
    elif action.get("remove"):
        state.files.pop(action["remove"]["path"], None)
    elif action.get("metaData"):
        state.metadata = action["metaData"]


def _read_checkpoint(lake: Lake, version: int, state: LogState) -> None:
    import pyarrow.parquet as pq

    with lake.storage.open_read(checkpoint_path(lake, version)) as fh:
        rows = pq.read_table(fh).to_pylist()
    for row in rows:
        if row.get("add"):
            add = dict(row["add"])
            add["partitionValues"] = dict(add.get("partitionValues") or [])
            state.files[add["path"]] = add
        elif row.get("metaData"):
            md = dict(row["metaData"])
            md["configuration"] = dict(md.get("configuration") or [])
            md["format"] = {"provider": md["format"]["provider"], "options": dict(md["format"].get("options") or [])}
            state.metadata = md


def read_log(lake: Lake, upto: int | None = None) -> LogState:
    """Replay the log (from its newest checkpoint at or before ``upto``) to the newest version or ``upto``.

    :class:`FormatError` if the log has a hole (a version neither a commit file nor covered by a checkpoint).
    """
    jsons, cps = _listing(lake)
    state = LogState(json_versions=jsons, checkpoints=cps)
    cps_usable = [c for c in cps if upto is None or c <= upto]
    start = -1
    if cps_usable:
        start = cps_usable[-1]
        _read_checkpoint(lake, start, state)
        state.version = start
    elif jsons and jsons[0] != 0:
        raise FormatError(
            f"{lake.cfg.qualified_name}: the Delta log {metadata_root(lake)} starts at version {jsons[0]} without a "
            "checkpoint"
        )
    for v in jsons:
        if v <= start or (upto is not None and v > upto):
            continue
        if state.version is not None and v != state.version + 1:
            raise FormatError(
                f"{lake.cfg.qualified_name}: the Delta log {metadata_root(lake)} lacks version {state.version + 1}"
            )
        for line in lake.storage.read_text(commit_path(lake, v)).splitlines():
            if line.strip():
                _apply(state, json.loads(line))
        state.version = v
    return state


def commit_seqs(lake: Lake) -> dict[int, int]:
    """Delta version -> the lake commit seq its commitInfo carries, for every commit file of the log."""
    out = {}
    for v in _listing(lake)[0]:
        for line in lake.storage.read_text(commit_path(lake, v)).splitlines():
            doc = json.loads(line) if line.strip() else {}
            if "commitInfo" in doc:
                out[v] = int(doc["commitInfo"][SEQ_KEY])
    return out


# ------------------------------------------------------------------------------ writing
def _ms(iso: str) -> int:
    if not iso:
        return 0
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def commit_info(commit: Commit, operation: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "timestamp": _ms(commit.committed_at),
        "operation": operation,
        "operationParameters": {"mode": "Overwrite"},
        "engineInfo": "cdc_compaction",
        "isBlindAppend": False,
        SEQ_KEY: commit.seq,
        "cdc.version": commit.version,
        "cdc.plan_id": commit.plan_id,
    }
    if commit.rollback:
        info["cdc.rollback_to"] = commit.rollback.get("to_seq")
    return {"commitInfo": info}


def _operation(commit: Commit) -> str:
    if commit.rollback:
        return "RESTORE"
    if commit.plan_id.startswith("erase-"):
        return "DELETE"
    return "WRITE" if commit.seq else "CREATE TABLE"


def _types(cfg: TableConfig, commit: Commit) -> dict[str, str]:
    return {n: delta_type(t) for n, t in table_columns(cfg, commit)}


def _lines(actions: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)


def _checkpoint_bytes(state_meta: dict[str, Any], adds: list[dict[str, Any]]) -> bytes:
    """A single-part checkpoint (protocol, metaData, every add) as the protocol's Parquet schema has it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    smap = pa.map_(pa.string(), pa.string())
    schema = pa.schema(
        [
            ("txn", pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])),
            (
                "add",
                pa.struct(
                    [
                        ("path", pa.string()),
                        ("partitionValues", smap),
                        ("size", pa.int64()),
                        ("modificationTime", pa.int64()),
                        ("dataChange", pa.bool_()),
                        ("stats", pa.string()),
                        ("tags", smap),
                    ]
                ),
            ),
            (
                "remove",
                pa.struct(
                    [
                        ("path", pa.string()),
                        ("deletionTimestamp", pa.int64()),
                        ("dataChange", pa.bool_()),
                        ("extendedFileMetadata", pa.bool_()),
                        ("partitionValues", smap),
                        ("size", pa.int64()),
                    ]
                ),
            ),
            (
                "metaData",
                pa.struct(
                    [
                        ("id", pa.string()),
                        ("name", pa.string()),
                        ("description", pa.string()),
                        ("format", pa.struct([("provider", pa.string()), ("options", smap)])),
                        ("schemaString", pa.string()),
                        ("partitionColumns", pa.list_(pa.string())),
                        ("configuration", smap),
                        ("createdTime", pa.int64()),
                    ]
                ),
            ),
            ("protocol", pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32())])),
        ]
    )
    md = dict(state_meta)
    md["format"] = {"provider": md["format"]["provider"], "options": list((md["format"].get("options") or {}).items())}
    md["configuration"] = list((md.get("configuration") or {}).items())
    rows: list[dict[str, Any]] = [{"protocol": PROTOCOL}, {"metaData": md}]
    for a in adds:
        rows.append(
            {
                "add": {
                    "path": a["path"],
                    "partitionValues": list((a.get("partitionValues") or {}).items()),
                    "size": a["size"],
                    "modificationTime": a["modificationTime"],
                    "dataChange": False,  # a checkpoint reconciles: no data changed by it
                    "stats": a.get("stats"),
                    "tags": None,
                }
            }
        )
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), buf)
    return buf.getvalue()


def _write_checkpoint(lake: Lake, version: int, state: LogState) -> None:
    """Checkpoint ``version`` (the table as ``state`` holds it), then point ``_last_checkpoint`` at it if newer."""
    assert state.metadata is not None
    adds = [state.files[p] for p in sorted(state.files)]
    lake.storage.write_bytes(checkpoint_path(lake, version), _checkpoint_bytes(state.metadata, adds))
    last = posixpath.join(metadata_root(lake), LAST_CHECKPOINT)
    current = -1
    if lake.storage.exists(last):
        try:
            current = int(json.loads(lake.storage.read_text(last))["version"])
        except (ValueError, KeyError, TypeError):
            current = -1
    if version >= current:
        lake.storage.write_text(last, json.dumps({"version": version, "size": len(adds) + 2}))


def _fix_last_checkpoint(lake: Lake) -> None:
    """Point ``_last_checkpoint`` at the newest checkpoint left, or remove it if none is (readers trust it)."""
    last = posixpath.join(metadata_root(lake), LAST_CHECKPOINT)
    cps = _listing(lake)[1]
    if not cps:
        if lake.storage.exists(last):
            lake.storage.delete(last)
        return
    import pyarrow.parquet as pq

    with lake.storage.open_read(checkpoint_path(lake, cps[-1])) as fh:
        rows = pq.ParquetFile(fh).metadata.num_rows
    lake.storage.write_text(last, json.dumps({"version": cps[-1], "size": rows}))


def _write(lake: Lake, version: int, text: str, overwrite: bool, committed_ms: int) -> bool:
    """Write commit file ``version``; False if it exists already (create-if-absent: never twice).

    The file gets the lake commit's time as its modification time: without in-commit timestamps that
    is the version's timestamp for Delta readers (``TIMESTAMP AS OF``, delta-rs ``load_as_version``),
    so a sync that comes late, or an erase's rewrite of the whole log, must not re-stamp it.  S3 sets
    an object's time itself (``set_mtime`` returns False there: docs/formats.md)."""
    path = commit_path(lake, version)
    if overwrite:
        lake.storage.write_text(path, text)
    else:
        try:
            lake.storage.create_exclusive(path, text)
        except PreconditionFailedError:
            return False
    if committed_ms > 0:
        lake.storage.set_mtime(path, committed_ms / 1000)
    return True


def _start(rt: Runtime, lake: Lake, commit: Commit, overwrite: bool) -> LogState:
    """Begin the log at ``commit``: its full state as Delta version ``commit.seq`` (a checkpoint if not 0).

    The checkpoint is written before the commit file, so a reader never replays this first commit
    (which holds no removes) on top of whatever older log it replaced.
    """
    cfg = rt.cfg
    md = metadata_action(cfg, commit, str(uuid.uuid4()), _ms(commit.committed_at))
    types = _types(cfg, commit)
    adds = [add_action(lake, f, types) for f in version_files(lake, commit)]
    state = LogState(version=commit.seq, metadata=md["metaData"], files={a["add"]["path"]: a["add"] for a in adds})
    lake.storage.makedirs(metadata_root(lake))
    if commit.seq > 0:
        _write_checkpoint(lake, commit.seq, state)
    fault_point("formats.before_delta_commit", cfg.qualified_name)
    _write(
        lake,
        commit.seq,
        _lines([commit_info(commit, _operation(commit)), {"protocol": PROTOCOL}, md, *adds]),
        overwrite,
        _ms(commit.committed_at),
    )
    return state


def _kept_columns(old: str | None, new: str) -> str:
    """``new``'s schema with every column of ``old`` it lacks put back, each after the column it followed.

    A rollback's record has the columns of the version it restores, which may predate a column
    ``schema_changes: evolve`` added since; the lake's table keeps that column (null in the restored
    rows), and so does the Delta schema: a metaData that dropped it would have the next commit add it
    back, and a reader of the rollback's version would see another table than the lake's."""
    if not old:
        return new
    before, after = json.loads(old)["fields"], json.loads(new)
    fields = list(after["fields"])
    names = {f["name"] for f in fields}
    at = 0
    for f in before:
        if f["name"] in names:
            at = next(i for i, g in enumerate(fields) if g["name"] == f["name"]) + 1
            continue
        fields.insert(at, f)
        names.add(f["name"])
        at += 1
    after["fields"] = fields
    return json.dumps(after, separators=(",", ":"))


def _append(rt: Runtime, lake: Lake, commit: Commit, state: LogState, overwrite: bool) -> bool:
    """Delta version ``commit.seq`` on top of ``state`` (version ``commit.seq - 1``): removes, adds, schema."""
    cfg = rt.cfg
    assert state.metadata is not None
    types = _types(cfg, commit)
    files = version_files(lake, commit)
    wanted = {_uri(f.rel): f for f in files}
    when = _ms(commit.committed_at)
    actions: list[dict[str, Any]] = [commit_info(commit, _operation(commit))]
    md = metadata_action(cfg, commit, state.metadata["id"], state.metadata.get("createdTime") or when)
    md["metaData"]["schemaString"] = _kept_columns(state.metadata.get("schemaString"), md["metaData"]["schemaString"])
    if (md["metaData"]["schemaString"], md["metaData"]["partitionColumns"]) != (
        state.metadata.get("schemaString"),
        list(state.metadata.get("partitionColumns") or []),
    ):
        actions.append(md)  # an added column (schema_changes: evolve): readers see the new schema
        state.metadata = md["metaData"]
    for path in sorted(set(state.files) - set(wanted)):
        actions.append(remove_action(state.files.pop(path), when))
    for path in sorted(set(wanted) - set(state.files)):
        add = add_action(lake, wanted[path], types)
        actions.append(add)
        state.files[path] = add["add"]
    fault_point("formats.before_delta_commit", cfg.qualified_name)
    written = _write(lake, commit.seq, _lines(actions), overwrite, when)
    state.version = commit.seq
    return written


def _delete_before(lake: Lake, version: int) -> list[str]:
    """Delete every commit file and checkpoint older than ``version``, oldest first."""
    jsons, cps = _listing(lake)
    gone = []
    for v in sorted({*(j for j in jsons if j < version), *(c for c in cps if c < version)}):
        for path in (commit_path(lake, v), checkpoint_path(lake, v)):
            if lake.storage.exists(path):
                lake.storage.delete(path)
                gone.append(posixpath.basename(path))
    return gone


def _directory_partitioned(metadata: dict[str, Any]) -> bool:
    """Does the log's table take ``_cdc_partition`` as a column (the partitioning of logs written before)?"""
    if metadata.get("partitionColumns"):
        return True
    try:
        fields = json.loads(metadata.get("schemaString") or "{}").get("fields") or []
    except ValueError:
        return True  # unreadable: written anew
    return any(f.get("name") == PARTITION_COLUMN for f in fields)


def sync(rt: Runtime, lake: Lake, kept: list[Commit]) -> dict[str, Any]:
    """One Delta version per kept lake commit up to the live one: append what is missing (module docstring)."""
    done: dict[str, Any] = {"written": [], "started_at": None, "version": None}
    live = kept[-1].seq
    if lake.storage.exists(posixpath.join(metadata_root(lake), REGENERATING)):
        log.warning(
            "%s: the Delta log's last rewrite (after an erase) did not finish; it is written anew from the kept "
            "commits before anything is appended",
            lake.cfg.qualified_name,
        )
        regenerate(rt, lake, kept)
        return {"written": [c.seq for c in kept], "regenerated": True, "version": live}
    try:
        state = read_log(lake)
    except FormatError as exc:
        log.warning("%s: %s; the log is written anew from the kept commits", lake.cfg.qualified_name, exc)
        state = LogState()
    if state.metadata is not None and _directory_partitioned(state.metadata):
        # Written before the table was unpartitioned for Delta (issue 37): every kept version is rewritten, so
        # time travel reads each one in the new form (a metaData action now would change only later ones).
        log.warning(
            "%s: the Delta log is partitioned by %s (written by an older release); it is written anew from the "
            "kept commits, unpartitioned, with the partition column's statistics",
            lake.cfg.qualified_name,
            PARTITION_COLUMN,
        )
        regenerate(rt, lake, kept)
        return {"written": [c.seq for c in kept], "regenerated": True, "version": live}
    if state.version is not None and state.version > live:
        # The log is ahead of the lake (a table dropped and started again at the same root): the lake is the truth.
        log.warning(
            "%s: the Delta log is at version %d, past the live commit %d; it is written anew",
            lake.cfg.qualified_name,
            state.version,
            live,
        )
        regenerate(rt, lake, kept)
        return {"written": [c.seq for c in kept], "regenerated": True, "version": live}
    for commit in kept:
        if state.version is not None and commit.seq <= state.version:
            continue
        if state.version is None or commit.seq != state.version + 1:
            # An empty log, or a hole (syncs that failed while versions expired): start at this commit.
            state = _start(rt, lake, commit, overwrite=False)
            _delete_before(lake, commit.seq)
            done["started_at"] = commit.seq
            done["written"].append(commit.seq)
            continue
        if _append(rt, lake, commit, state, overwrite=False):
            done["written"].append(commit.seq)
        else:
            state = read_log(lake)  # another sync wrote it meanwhile: go on from what the log holds
    done["version"] = state.version
    if done["written"]:
        log.info(
            "%s: Delta log versions %s written at %s", lake.cfg.qualified_name, done["written"], metadata_root(lake)
        )
    return done


def expire(rt: Runtime, lake: Lake, keep_seqs: set[int]) -> None:
    """Checkpoint the oldest kept version and delete every older log entry, before retention deletes files."""
    if not keep_seqs or not lake.storage.exists(metadata_root(lake)):
        return
    oldest = min(keep_seqs)
    jsons, cps = _listing(lake)
    if not any(v < oldest for v in (*jsons, *cps)):
        return
    if max((*jsons, *cps), default=-1) < oldest:
        # The log names only versions about to go (its syncs failed since): drop it; the next sync starts it anew.
        remove_format_metadata(lake, metadata_root(lake))
        return
    if oldest not in cps:
        state = read_log(lake, upto=oldest)
        if state.version != oldest:
            raise FormatError(f"{lake.cfg.qualified_name}: the Delta log has no version {oldest} to checkpoint")
        _write_checkpoint(lake, oldest, state)
    gone = _delete_before(lake, oldest)
    _fix_last_checkpoint(lake)
    log.info("%s: Delta log entries of expired versions removed: %s", lake.cfg.qualified_name, gone)


def is_temporary(name: str) -> bool:
    """A crashed write's hidden temporary of a log file (:data:`_TEMPORARY`): the log's own, never read by readers."""
    return bool(_TEMPORARY.match(name))


def delete_temporaries(lake: Lake) -> list[str]:
    """Delete the crashed writes' temporaries in ``_delta_log`` (they may hold an erased value in their stats).

    Only the log's own files by their naming pattern (:func:`is_temporary`), only in this table's log."""
    if not lake.storage.exists(metadata_root(lake)):
        return []
    gone = []
    for e in lake.storage.list_dir(metadata_root(lake)):
        if not e.is_dir and is_temporary(e.name):
            lake.storage.delete(e.path)
            gone.append(e.name)
    if gone:
        log.info("%s: deleted crashed Delta log temporaries %s", lake.cfg.qualified_name, gone)
    return gone


def regenerate(rt: Runtime, lake: Lake, kept: list[Commit]) -> None:
    """Write the log anew from the kept commits (after an erase rewrote files), then drop every other entry
    and every crashed write's temporary (:func:`delete_temporaries`)."""
    delete_temporaries(lake)
    if not kept:
        if lake.storage.exists(metadata_root(lake)):
            remove_format_metadata(lake, metadata_root(lake))
        return
    marker = posixpath.join(metadata_root(lake), REGENERATING)
    lake.storage.makedirs(metadata_root(lake))
    lake.storage.write_text(marker, json.dumps({"from_seq": kept[0].seq, "to_seq": kept[-1].seq}))
    state = _start(rt, lake, kept[0], overwrite=True)
    for commit in kept[1:]:
        _append(rt, lake, commit, state, overwrite=True)
    _delete_before(lake, kept[0].seq)
    jsons, cps = _listing(lake)
    for v in (*jsons, *cps):
        if v > kept[-1].seq:
            for path in (commit_path(lake, v), checkpoint_path(lake, v)):
                if lake.storage.exists(path):
                    lake.storage.delete(path)
    # An older checkpoint of kept[0]'s version was overwritten above; a stale one of a later version would
    # still hold the old sizes and bounds.
    for v in cps:
        if kept[0].seq < v <= kept[-1].seq:
            lake.storage.delete(checkpoint_path(lake, v))
    _fix_last_checkpoint(lake)
    lake.storage.delete(marker)  # last: every entry of the log is now the rewritten files'
    log.info("%s: Delta log regenerated from commits %d..%d", lake.cfg.qualified_name, kept[0].seq, kept[-1].seq)


def version_of_seq(lake: Lake, seq: int) -> int | None:
    """The Delta version carrying lake commit ``seq`` (it is ``seq``; None if the log does not hold it)."""
    return next((v for v, s in commit_seqs(lake).items() if s == seq), None)
