"""The contract between the Airflow side and the Spark job: shared names and file formats.

Everything both sides must agree on is defined here once: the hidden columns of the base
table, the layout of a version directory, the job's exit status for an error no retry can
heal, and the three JSON files that pass between them --

* the plan (``_cdc/plans/<plan>.json``), written by the DAG's ``plan`` task, read by the job
  and by ``validate``/``publish``/``archive``: :class:`Plan`;
* the job's stats (``<version>/_cdc_stats.json``), which ``validate`` checks: :class:`JobStats`;
* the permanent-error record beside a plan (``<plan>.permanent_error.json``): :class:`PermanentErrorRecord`.

The dataclasses describe the files as they are on disk, key for key, so that existing
lakes and in-flight plans are read as before: ``from_dict(doc).to_dict() == doc`` for
what today's code writes, keys the class does not know are kept in ``extra`` (and
written back), and an optional key keeps the default its readers always gave it.

Pure standard library, no pyspark: the DAG's modules import it at parse time.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote

# ------------------------------------------------------------------ base table columns
#: The columns the compaction adds to every registry column, in this order.
META_COLUMNS: tuple[str, ...] = ("_cdc_increment", "_cdc_file", "_cdc_pos", "_cdc_ingested_at")
META_DDL = "`_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint, `_cdc_ingested_at` timestamp"
#: Where an event came from (increment, file name, row position): the last tie-breakers of the rule.
PROVENANCE: tuple[str, ...] = ("_cdc_increment", "_cdc_file", "_cdc_pos")
PROVENANCE_DDL = "`_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint"
#: The hidden partition column of a partitioned base table (registry ``partition_by``): its name in
#: the metastore, in the tombstones' files and in every DataFrame of the job.
PARTITION_COLUMN = "_cdc_partition"
PARTITION_DDL = f"`{PARTITION_COLUMN}` string"
#: The name the column has in the partition directories the job writes (``cdc_partition=<escaped
#: value>``): Hadoop's ``FileInputFormat`` -- Hive's reader -- skips every path whose name starts with
#: ``_``, so a directory named after :data:`PARTITION_COLUMN` reads as empty through Hive (issue 37).
#: The metastore registers each partition at its location, so the column keeps its name there.
#: A reserved column name (the registry refuses it), so Spark's partition discovery meets no clash.
PARTITION_DIR_COLUMN = "cdc_partition"
PARTITION_DIR_PREFIX = f"{PARTITION_DIR_COLUMN}="
#: The prefix of the partition directories of versions written before: read as before, never renamed.
OLD_PARTITION_DIR_PREFIX = f"{PARTITION_COLUMN}="


def partition_dir_column(name: str) -> str | None:
    """The column a partition directory's name stands for (``cdc_partition`` or, written before, ``_cdc_partition``)."""
    for prefix in (PARTITION_DIR_PREFIX, OLD_PARTITION_DIR_PREFIX):
        if name.startswith(prefix):
            return prefix[:-1]
    return None


def partition_dir_value(name: str) -> str | None:
    """The (un-escaped) value of a partition directory Spark's ``partitionBy`` wrote, else None.

    ``cdc_partition=a%3Ab`` -> ``a:b``, and likewise ``_cdc_partition=a%3Ab``, the name of versions
    written before (:data:`OLD_PARTITION_DIR_PREFIX`).  Every reader of directory names goes through here.
    """
    column = partition_dir_column(name)
    return None if column is None else unquote(name[len(column) + 1 :])


#: The NULL (and empty string) partition of ``partition_by``: Hive's default partition reads back as NULL.
NULL_PARTITION = "__null__"


def _plain(value: str) -> bool:
    """Printable ASCII without ``~``, no space at either end: kept as it is (capitals marked)."""
    return all(" " <= ch <= "}" for ch in value) and value[0] != " " and value[-1] != " "


def partition_value(value: str | None) -> str:
    """The ``_cdc_partition`` value of an identity partition (``include/sql/_partition.sql.j2`` in Python).

    Printable ASCII without ``~`` and without a space at either end keeps its capitals, each run of
    small letters is written in capitals between two ``~`` (``'EU'`` -> ``EU``, ``'vip'`` -> ``~VIP~``);
    anything else is ``~~`` and the hex of its UTF-8 bytes (``'vip '`` -> ``~~76697020``).  No two
    values give names that a store comparing loosely (case, trailing spaces, Unicode normalization)
    takes for one (docs/partitioned.md, "Partition directory names"); :func:`partition_value_text`
    reads a name back exactly.
    """
    if value is None or value == "":
        return NULL_PARTITION
    if _plain(value) and value.upper() != NULL_PARTITION.upper():  # a value spelt like the sentinel: hex
        return re.sub("([a-z]+)", r"~\1~", value).upper()
    return "~~" + value.encode("utf-8").hex().upper()


def partition_value_text(encoded: str) -> str:
    """The value an identity partition's ``_cdc_partition`` stands for (the inverse of :func:`partition_value`).

    A partition written before the encoding existed has its value as it was: one without ``~`` (or
    not of the encoding's form) reads back as it is.  ``__null__`` is returned as is.
    """
    if encoded.startswith("~~"):
        try:
            return bytes.fromhex(encoded[2:]).decode("utf-8")
        except ValueError:
            return encoded
    parts = encoded.split("~")
    if len(parts) % 2 == 0 or any(p != p.upper() for p in parts):
        return encoded
    # Between two ~ the run of small letters, outside them the value as it is.
    return "".join(p.lower() if i % 2 else p for i, p in enumerate(parts))


# ------------------------------------------------------------------ version directories
#: A version directory holds ``data/`` (the visible rows: the base table's location, Parquet data
#: files and nothing else), ``tombstones/`` (the delete winners kept for tombstone_retention, read
#: by the next compaction and the views) and the stats file beside them.  Layout 1, the layout
#: before tombstones moved out, kept every row and the stats in the version directory itself.
DATA_DIR = "data"
TOMBSTONES_DIR = "tombstones"
STATS_FILE = "_cdc_stats.json"
#: Tables with ``change_feed`` on (cdc, keyless, snapshot): the commit's change beside the version, one
#: Parquet file (README, "Change feed"); ``publish`` copies it to the table's ``changes/c<seq>.parquet``.
CHANGES_DIR = "changes"
#: The change types of a feed row (:data:`CHANGE_TYPE`), as the job counts them in its stats.
FEED_CHANGE_TYPES = ("insert", "delete", "update_before", "update_after")
#: The feed's own columns after the registry's: the change type (string), the commit as ``changes``
#: prints it (bigint) and the commit whose file holds the row (int); both are the commit's seq.
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
SEQ_COLUMN = "_commit_seq"
LAYOUT = 2
#: Partitioned tables: the key index beside the data, ``index/cdc_partition=<v>/`` -- each rewritten
#: partition's key columns, sorted by key in small row groups, so that a compaction finds where a key
#: lives by reading the index (pruned by key range) instead of every partition's key columns.
INDEX_DIR = "index"
#: Bytes per Parquet row group of an index file: small, so that a key-range filter skips most of them
#: (about 32k bigint keys each) while a footer stays a few hundred bytes per group.
INDEX_ROW_GROUP_BYTES = 256 * 1024

# ------------------------------------------------------------------ job settings
#: Up to this many accepted events, only the keys they touch are ranked and the base rows of the
#: other keys are copied as they are (no shuffle of the base); above it, every row is ranked.
#: A plan's ``key_lookup_max_events`` overrides it.
KEY_LOOKUP_MAX_EVENTS = 2_000_000
#: Up to this many accepted events (and no more than the base's rows), the cdc merge ranks the events
#: alone and streams the base past their winners, broadcast (``merge_path`` ``broadcast``): no
#: shuffle of base rows.  Each event's keys, ordering values and provenance go to every task, so
#: this bounds the broadcast (about 100 bytes an event).  A plan's ``broadcast_merge_max_events``
#: overrides it.
BROADCAST_MERGE_MAX_EVENTS = 500_000
#: How the cdc job merged the events into the base (the stats' ``merge_path``): ``broadcast``
#: (events ranked alone, the base streamed past their winners) or ``window`` (base rows and events
#: ranked together, of the touched keys or of every key).
MERGE_PATHS = ("broadcast", "window")
#: The Parquet codec of the job's output unless the plan names another (``compression``).
DEFAULT_COMPRESSION = "snappy"
#: Spark's setting of the Parquet type its writes give timestamps; the job sets it from the plan's
#: ``parquet_timestamps`` (registry ``parquet_timestamps``) on its session, so every file it writes has it.
OUTPUT_TIMESTAMP_TYPE_CONF = "spark.sql.parquet.outputTimestampType"
#: ``parquet_timestamps`` -> Spark's type: INT64 microseconds (the default, the Iceberg specification's
#: type) or INT96 (Spark's own default, for readers that read no INT64 timestamps: Hive before 4.0).
PARQUET_TIMESTAMP_TYPES = {"micros": "TIMESTAMP_MICROS", "int96": "INT96"}
DEFAULT_PARQUET_TIMESTAMPS = "micros"

# ------------------------------------------------------------------ permanent errors
#: spark-submit's exit status after an error no re-run of the job can heal (a stale plan): the
#: DAG's compact task then fails at once instead of going through its retries.
PERMANENT_EXIT_CODE = 65
#: The job also records that error beside the plan, ``<plan>.permanent_error.json``, for engines
#: whose exit status does not reach Airflow (EMR steps, cluster deploy mode).
PERMANENT_ERROR_SUFFIX = ".permanent_error.json"


def permanent_error_path(plan_path: str) -> str:
    """Where the compaction job records a permanent error of the plan ``plan_path``."""
    return plan_path.removesuffix(".json") + PERMANENT_ERROR_SUFFIX


class ContractError(ValueError):
    """A plan, stats or error file that does not have the shape of the contract (a key missing)."""


# ------------------------------------------------------------------ (de)serialisation
# Field metadata: "load" converts the JSON value of a key (not called for null); "omit" leaves
# a key out of to_dict() while it is None -- for keys today's writers leave out, so that a file
# is written back as it was read.
T = TypeVar("T")


def _meta(*, load: Callable[[Any], Any] | None = None, omit: bool = True) -> dict[str, Any]:
    return {"load": load, "omit": omit}


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value)


def _json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


def _dump(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if f.name == "extra":
            continue
        value = getattr(obj, f.name)
        if value is None and f.metadata.get("omit"):
            continue
        out[f.name] = _json(value)
    out.update(getattr(obj, "extra", {}))
    return out


def _load(cls: type[T], doc: Mapping[str, Any], what: str) -> T:
    if not isinstance(doc, Mapping):
        raise ContractError(f"{what} must be a JSON object, not {type(doc).__name__}")
    known = [f for f in dataclasses.fields(cls) if f.name != "extra"]
    missing = [
        f.name
        for f in known
        if f.name not in doc and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ContractError(f"{what} lacks {', '.join(missing)}")
    kwargs: dict[str, Any] = {}
    for f in known:
        if f.name in doc:
            value, load = doc[f.name], f.metadata.get("load")
            kwargs[f.name] = load(value) if load is not None and value is not None else value
    names = {f.name for f in known}
    if any(f.name == "extra" for f in dataclasses.fields(cls)):
        kwargs["extra"] = {k: v for k, v in doc.items() if k not in names}
    return cls(**kwargs)


# ------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class Rule:
    """The ``cdc`` mode's rule as Spark SQL expressions, rendered from ``include/sql/modes/cdc/_rule.sql.j2``.

    A plan's ``rule`` is this for a cdc table (``Plan.mode`` absent or ``cdc``); other modes hand
    their job module a rule of their own shape (see :data:`KEYLESS_RULE_KEYS`).
    """

    #: NULL for a valid event, else why it is refused.
    reject_reason: str
    #: ``row_number()`` of an event among its key's events; 1 wins.
    rank: str
    #: True for a delete.
    is_delete: str
    #: Key changes (registry ``old_key``): a statement over :data:`FRESH_VIEW` (the accepted events)
    #: keying them as the rule ranks them -- a delete by old key under that key, a key change once
    #: more as a delete of its old key.
    keyed_events: str | None = field(default=None, metadata=_meta(omit=True))
    #: Partial rows (registry ``unchanged``): ``fill:<column>`` -> the column's value at each event
    #: (a window over the key's events), kept here under those keys.
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fills(self) -> dict[str, str]:
        """Left-out column -> the window expression giving its value at each event."""
        return {k.removeprefix(FILL_PREFIX): v for k, v in sorted(self.extra.items()) if k.startswith(FILL_PREFIX)}

    @property
    def unchanged(self) -> dict[str, dict[str, Any]]:
        """Left-out column -> how its value's source is remembered and replayed (``unchanged:<column>``).

        ``book``: hidden column -> window expression (where the value at each event came from);
        ``as_event``: a base row's value as its event had it; ``source_where`` / ``source``: which
        base rows replay the event their value came from, and that event's columns; ``carried``
        (registry ``old_key``): the value a key change takes from its old key.  Empty for a plan
        written before these existed: the job then fills as it did.
        """
        return {
            k.removeprefix(UNCHANGED_PREFIX): v
            for k, v in sorted(self.extra.items())
            if k.startswith(UNCHANGED_PREFIX) and isinstance(v, dict)
        }

    @property
    def bookkeeping(self) -> list[tuple[str, str]]:
        """(name, type) of the hidden columns :attr:`unchanged` keeps, in the order the base holds them."""
        return [(str(n), str(t)) for n, t in self.extra.get("unchanged_columns") or []]

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Rule:
        return _load(cls, doc, "the plan's rule")


#: The key prefix of a partial-row column's fill expression in a cdc rule.
FILL_PREFIX = "fill:"
#: The key prefix of a partial-row column's bookkeeping in a cdc rule (:attr:`Rule.unchanged`).
UNCHANGED_PREFIX = "unchanged:"
#: The temporary view of a cdc compaction's accepted events that ``Rule.keyed_events`` reads.
FRESH_VIEW = "_cdc_fresh_events"
#: The columns an accepted event carries after the registry's: provenance and when it was compacted.
FRESH_EXTRA_COLUMNS = (*("_cdc_increment", "_cdc_file", "_cdc_pos"), "_cdc_ingested_at")

#: The temporary views the keyless job registers, and so the relations its rule is rendered over
#: (the views render the same macros over the metastore's tables).
KEYLESS_RELATIONS: dict[str, str] = {
    "base": "`_cdc_keyless_base`",
    "events": "`_cdc_keyless_events`",
    "watermark": "`_cdc_keyless_watermark`",
    "fates": "`_cdc_keyless_fates`",
    "counts": "`_cdc_keyless_counts`",
}
#: The statements of a keyless rule, rendered from ``include/sql/modes/keyless/_rule.sql.j2``.
KEYLESS_RULE_KEYS = ("reject_reason", "event_fates", "event_counts", "new_watermark", "value_counts", "copies")


#: The ``snapshot`` mode's own columns in its outputs (the current table and the history), after the
#: registry's columns and before the metadata columns: each key's operation, the business date its
#: values start at, and the two hashes its comparison joins on (tests/scenarios/snapshot/README.md).
OPERATION_COLUMN = "operation"
EFF_START_DATE_COLUMN = "eff_start_date"
KEY_HASH_COLUMN = "_cdc_key_hash"
ROW_HASH_COLUMN = "_cdc_row_hash"
SNAPSHOT_COLUMNS: tuple[tuple[str, str], ...] = (
    (OPERATION_COLUMN, "string"),
    (EFF_START_DATE_COLUMN, "date"),
    (KEY_HASH_COLUMN, "string"),
    (ROW_HASH_COLUMN, "string"),
)
#: A snapshot version's history partitions: ``<version>/history/eff_start_date=YYYY-MM-DD/``, one per
#: business date the version applied (each written once, by the version that applied its date).
HISTORY_DIR = "history"
HISTORY_DIR_PREFIX = f"{EFF_START_DATE_COLUMN}="


@dataclass(frozen=True)
class PartitionSpec:
    """A partitioned table's partitioning (registry ``partition_by``) as the plan hands it to the job."""

    column: str
    transform: str
    #: The partition value of an event as a Spark SQL expression (NULL values get a sentinel).
    value: str

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> PartitionSpec:
        return _load(cls, doc, "the plan's partition_by")


@dataclass(frozen=True)
class PlanFile:
    """One change file a plan takes as input (the Airflow side's ``lake.PlannedFile`` on disk)."""

    increment: str
    name: str
    path: str
    size: int
    #: Rows in the file, from its footer (``validate`` holds the job's count against their sum).
    rows: int = 0
    #: Left out of to_dict() when empty, as the plan task writes them.
    ignored_columns: tuple[str, ...] = field(default=(), metadata=_meta(load=_strs))
    missing_columns: tuple[str, ...] = field(default=(), metadata=_meta(load=_strs))
    #: The newest source event time in the file (ISO, from its footer's statistics), or "".
    newest_event: str = ""
    #: Which landing of the file the plan took (the Airflow side's ``FileInfo.token``), or "".
    landed: str = ""

    def to_dict(self) -> dict[str, Any]:
        doc = _dump(self)
        for key in ("ignored_columns", "missing_columns", "newest_event", "landed"):
            if not doc[key]:
                del doc[key]
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> PlanFile:
        return _load(cls, doc, "a planned file")


def _files(value: Any) -> tuple[PlanFile, ...]:
    return tuple(PlanFile.from_dict(f) for f in value)


def _dicts(value: Any) -> tuple[dict[str, Any], ...]:
    return tuple(dict(v) for v in value)


@dataclass(frozen=True)
class Plan:
    """A plan file: the exact input of one run and everything the job needs to compact it.

    Required are the keys the job or the Airflow side read unconditionally; the others keep
    the defaults their readers gave them (``None`` where a reader falls back on something
    else, documented per field).  Keys this class does not know are kept in ``extra``.
    """

    plan_id: str
    run_id: str
    #: The lease owner that made the plan (``lease_owner(run_id)``).
    owner: str
    #: ``database.table``.
    table: str
    #: The commit number this plan would make, and the one it was made on.
    seq: int
    parent_seq: int
    parent_version: str
    #: ``v<seq>-<plan_id>``: every attempt of the job writes ``<output_location>-<attempt>``.
    version: str
    output_location: str
    quarantine_location: str
    #: The live version's visible rows (layout 1: tombstones too).
    base_location: str
    files: tuple[PlanFile, ...] = field(metadata=_meta(load=_files))
    increments: tuple[str, ...] = field(metadata=_meta(load=_strs))
    #: When the events are compacted (ISO time), stamped as ``_cdc_ingested_at``.
    ingested_at: str
    #: The registry's columns in order, its key, and its schema as Spark DDL.
    column_names: tuple[str, ...] = field(metadata=_meta(load=_strs))
    primary_key: tuple[str, ...] = field(metadata=_meta(load=_strs))
    schema_ddl: str
    #: The table mode's rule as SQL (for cdc a :class:`Rule`: see :attr:`cdc_rule`).
    rule: dict[str, Any]
    #: The registry's order_by; the job ranks by every column when it is absent.
    order_by: tuple[str, ...] | None = field(default=None, metadata=_meta(load=_strs))
    #: Rows of the live version; the job's key lookup takes it as unbounded when absent.
    base_rows: int | None = field(default=None, metadata=_meta())
    #: The live version's layout: 1 for plans made before layout 2 existed.
    base_layout: int = field(default=1, metadata=_meta(omit=False))
    #: Its tombstones; null for a layout-1 base (they are among its data), written as such.
    base_tombstones_location: str | None = field(default=None, metadata=_meta(omit=False))
    base_tombstones: int | None = field(default=None, metadata=_meta())
    #: The commit record this plan would create: the job checks it first (a committed plan is a no-op).
    commit_path: str | None = field(default=None, metadata=_meta())
    #: Delete winners compacted before this time (ISO) expire; none expire when absent.
    tombstone_cutoff: str | None = field(default=None, metadata=_meta())
    planned_at: str | None = field(default=None, metadata=_meta())
    #: What the run saw but did not take (reports for people; the job ignores them).
    quarantined_files: tuple[dict[str, Any], ...] | None = field(default=None, metadata=_meta(load=_dicts))
    ignored_landing: tuple[dict[str, Any], ...] | None = field(default=None, metadata=_meta(load=_dicts))
    waiting_increments: tuple[dict[str, Any], ...] | None = field(default=None, metadata=_meta(load=_dicts))
    stalled_increments: tuple[dict[str, Any], ...] | None = field(default=None, metadata=_meta(load=_dicts))
    #: Output sizing (``pipeline.plan.output_sizing``): coalesce to this many files, cap a file at this many rows.
    output_files: int | None = field(default=None, metadata=_meta())
    max_records_per_file: int | None = field(default=None, metadata=_meta())
    #: Partitioned tables only: the partitioning and the live version's partitions {value: location}.
    partition_by: PartitionSpec | None = field(default=None, metadata=_meta(load=PartitionSpec.from_dict))
    base_partitions: dict[str, str] | None = field(default=None, metadata=_meta())
    #: Partitioned tables: the live version's key index {value: index directory}; a partition missing
    #: here (a version written before the index, or after an erase) has its key columns read instead.
    base_index: dict[str, str] | None = field(default=None, metadata=_meta())
    #: The table mode (registry ``mode``); absent in plans of cdc tables made before modes existed.
    mode: str | None = field(default=None, metadata=_meta(omit=True))
    #: The columns the version is written with ({name, type}): the registry's plus what the source added
    #: or widened (``schema_changes: evolve``); ``column_names`` and ``schema_ddl`` say the same for the job.
    #: Absent in plans made before schema changes were followed.
    columns: tuple[dict[str, Any], ...] | None = field(default=None, metadata=_meta(load=_dicts))
    #: What this plan changed in the table's schema (a report for people and the commit; the job ignores it).
    schema_changes: tuple[dict[str, Any], ...] | None = field(default=None, metadata=_meta(load=_dicts))
    #: keyless: the row's columns and their before-image columns, aligned.
    data_columns: tuple[str, ...] | None = field(default=None, metadata=_meta(load=_strs, omit=True))
    before_columns: tuple[str, ...] | None = field(default=None, metadata=_meta(load=_strs, omit=True))
    #: snapshot: full (False) or delta (True) snapshots; each pending increment's business date from
    #: its name (ISO; used unless ``business_date_column``); the greatest business date applied so far
    #: (ISO, the parent's greatest history partition; None before the first).
    delta: bool | None = field(default=None, metadata=_meta(omit=True))
    business_date_column: str | None = field(default=None, metadata=_meta(omit=True))
    business_dates: dict[str, str] | None = field(default=None, metadata=_meta(omit=True))
    last_applied: str | None = field(default=None, metadata=_meta(omit=True))
    #: Overrides of the job's defaults (:data:`KEY_LOOKUP_MAX_EVENTS`, :data:`DEFAULT_COMPRESSION`);
    #: the plan task does not write them.
    key_lookup_max_events: int | None = field(default=None, metadata=_meta())
    #: Overrides :data:`BROADCAST_MERGE_MAX_EVENTS`; and forces a merge path (one of :data:`MERGE_PATHS`)
    #: where the table allows it (tests; the job's ``CDC_COMPACTION_MERGE_PATH`` is the same for a run).
    broadcast_merge_max_events: int | None = field(default=None, metadata=_meta())
    merge_path: str | None = field(default=None, metadata=_meta())
    compression: str | None = field(default=None, metadata=_meta())
    #: Tables with registry ``change_feed: true`` (cdc, keyless, snapshot): the job writes the commit's change
    #: (``seq``) to :data:`CHANGES_DIR` in the same pass as the version. Absent (off) in older plans.
    change_feed: bool | None = field(default=None, metadata=_meta())
    #: How the job writes timestamps (a key of :data:`PARQUET_TIMESTAMP_TYPES`); absent: micros.
    parquet_timestamps: str | None = field(default=None, metadata=_meta())
    #: Whether the run compacts (``compaction.policy``; README, "Compaction policy"): ``compact``,
    #: ``policy``, ``reason``, ``forced``, ``thresholds``. ``compact: false``: the job writes nothing.
    compaction: dict[str, Any] | None = field(default=None, metadata=_meta())
    #: How the landed files are written and what each record holds (registry ``format``, ``envelope``;
    #: docs/concepts.md#input-formats), and how Debezium encoded decimals and times where a file carries no schema
    #: (``decimal_handling``, ``time_precision``). Absent in plans made before them: flattened Parquet.
    input_format: str | None = field(default=None, metadata=_meta(omit=True))
    envelope: str | None = field(default=None, metadata=_meta(omit=True))
    decimal_handling: str | None = field(default=None, metadata=_meta(omit=True))
    time_precision: str | None = field(default=None, metadata=_meta(omit=True))
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @property
    def table_mode(self) -> str:
        return self.mode or "cdc"

    @property
    def cdc_rule(self) -> Rule:
        """The rule of a cdc table's plan, typed."""
        return Rule.from_dict(self.rule)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Plan:
        plan_id = doc.get("plan_id", "?") if isinstance(doc, Mapping) else "?"
        return _load(cls, doc, f"plan {plan_id}")


# ------------------------------------------------------------------ the job's stats
@dataclass(frozen=True)
class OutputFile:
    """A data file of the version the job wrote: ``data/...`` or ``tombstones/...``, and its bytes."""

    name: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> OutputFile:
        return _load(cls, doc, "an output file")


def _output_files(value: Any) -> tuple[OutputFile, ...]:
    return tuple(OutputFile.from_dict(f) for f in value)


@dataclass(frozen=True)
class JobStats:
    """``_cdc_stats.json``: what the job read, refused, kept and wrote; ``validate`` checks it.

    Written last, so its presence marks a finished attempt.  Keys that stats of earlier
    versions of the job lack are optional: ``layout`` (1 then), ``attempt``,
    ``rejected_by_file`` and ``misplaced_rows`` (not counted then).
    """

    plan_id: str
    table: str
    #: Base rows the compaction ranked (the parent version's rows: validate holds them against it).
    base_rows: int
    #: Rows of the planned files, and those refused (by reason; by ``<increment>/<file>``).
    increment_rows: int
    rejected_rows: int
    rejected_by_reason: dict[str, int]
    #: Events that lost to a newer one of their key, and tombstones dropped past their retention.
    superseded_rows: int
    expired_tombstones: int
    #: Rows written: visible ones plus tombstones.
    output_rows: int
    output_tombstones: int
    output_visible_rows: int
    #: Keys found more than once in the output (must be 0).
    duplicate_keys: int
    output_files: tuple[OutputFile, ...] = field(metadata=_meta(load=_output_files))
    finished_at: str
    attempt: str = ""
    layout: int = 1
    rejected_by_file: dict[str, int] = field(default_factory=dict)
    #: Deletes among the visible rows plus upserts among the tombstones (must be 0).
    misplaced_rows: int | None = field(default=None, metadata=_meta())
    #: Partitioned tables only: rows per written partition, the partitioning, the written
    #: partitions {value: directory}, which were touched, and how many rewritten / reused.
    partition_rows: dict[str, int] | None = field(default=None, metadata=_meta())
    partition_by: dict[str, str] | None = field(default=None, metadata=_meta())
    partitions: dict[str, str] | None = field(default=None, metadata=_meta())
    partitions_touched: tuple[str, ...] | None = field(default=None, metadata=_meta(load=_strs))
    partitions_rewritten: int | None = field(default=None, metadata=_meta())
    partitions_reused: int | None = field(default=None, metadata=_meta())
    #: Partitioned tables: the key index of each written partition {value: index directory}, its rows
    #: per partition, the index rows whose key is not in their partition's data or the reverse (must be
    #: 0), and how the base keys were found (``index`` or ``scan``, with the partitions read each way).
    index: dict[str, str] | None = field(default=None, metadata=_meta())
    index_rows: dict[str, int] | None = field(default=None, metadata=_meta())
    index_mismatches: int | None = field(default=None, metadata=_meta())
    key_lookup: dict[str, Any] | None = field(default=None, metadata=_meta())
    #: cdc tables: keys whose winner tied with the runner-up on ``order_by`` (file and row order
    #: decided), and events ranked below their key's base row (late); absent from older jobs' stats.
    tied_winners: int | None = field(default=None, metadata=_meta())
    late_events: int | None = field(default=None, metadata=_meta())
    #: cdc tables: how the events were merged into the base (one of :data:`MERGE_PATHS`); absent
    #: from older jobs' stats.
    merge_path: str | None = field(default=None, metadata=_meta())
    #: Records read but never compacted as rows -- Kafka tombstones, heartbeats, transaction metadata,
    #: truncate and message events (``job/decode.py``) -- in all and by kind; absent where none can occur
    #: (flattened Parquet) and from older jobs' stats. ``validate`` holds increment_rows plus these
    #: against the planned files' records.
    skipped_records: int | None = field(default=None, metadata=_meta())
    skipped_by_kind: dict[str, int] | None = field(default=None, metadata=_meta())
    #: Tables with the plan's ``change_feed`` (cdc, keyless, snapshot): the feed the job wrote -- ``file``
    #: (``changes/<name>``, one file), ``seq`` (the commit it is the change of) and ``rows`` by change type
    #: (:data:`FEED_CHANGE_TYPES`).
    change_feed: dict[str, Any] | None = field(default=None, metadata=_meta())
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> JobStats:
        return _load(cls, doc, f"the stats file ({STATS_FILE})")


# ------------------------------------------------------------------ the permanent-error record
@dataclass(frozen=True)
class PermanentErrorRecord:
    """``<plan>.permanent_error.json``: why the job can never compact this plan (read leniently: every key optional)."""

    plan_id: str = ""
    seq: int | None = None
    table: str = ""
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> PermanentErrorRecord:
        return _load(cls, doc, f"the permanent-error record ({PERMANENT_ERROR_SUFFIX})")
