"""Checking a landed change file before it may be compacted: readable, and a schema that fits.

The plan task reads every pending file's Parquet footer (never the data) and applies
the registry's drift policy, so a bad file stops or is set aside *before* Spark runs:

* unreadable (zero bytes, truncated, not Parquet)            -> bad file
* a registry column missing from the file                     -> accepted, read as NULL
* a column type the reader widens safely (int -> bigint, float -> double, decimal(5,2) ->
  decimal(10,2), timestamp in ms/us)                          -> accepted
* dictionary-encoded columns, INT96 timestamps (Spark reads them) -> accepted
* any other type (string where the registry says int, INT64 ns timestamps) -> bad file
* two columns whose names differ only by case                 -> bad file (Spark cannot read it)
* a partition value too long for a directory name (identity partitioning) -> bad file
* a column the registry does not list, or a wider type         -> ``schema_changes``: fail | evolve | ignore
  (:mod:`cdc_compaction.core.schema`)

Bad files are handled per ``on_bad_file``: ``fail`` (default: the run stops before
anything changes and names every file and reason) or ``quarantine`` (the file is moved
to the table's quarantine with its reason, the run goes on, the owners are alerted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from cdc_compaction.core.exceptions import StorageError
from cdc_compaction.core.hive_types import arrow_type, logical_type, physical_types
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.storage import LocalStorage, Storage
from cdc_compaction.job.contract import PARTITION_DIR_PREFIX, partition_value


def arrow_schema(cfg: TableConfig) -> Any:
    """The registry columns as an Arrow schema."""
    import pyarrow as pa

    return pa.schema([(c.name, arrow_type(c.type)) for c in cfg.columns])


@dataclass
class FileCheck:
    """What the footer of one landed file says."""

    rows: int = 0
    problem: str | None = None
    ignored_columns: list[str] = field(default_factory=list)
    missing_columns: list[str] = field(default_factory=list)
    #: The newest source event time in the file (registry event_time), from the footer's statistics.
    newest_event: datetime | None = None
    #: What the file's columns change (``schema_changes``; :func:`cdc_compaction.core.schema.judge`).
    changes: list[Any] = field(default_factory=list)


#: How the reason of a file that could not be read at all starts (no Parquet footer, empty): its content,
#: not the registry, is at fault, so the fix is to re-land or quarantine it, never to change the columns.
UNREADABLE_REASONS = ("empty file (0 bytes)", "not readable as Parquet")


def is_unreadable(reason: str) -> bool:
    """True if ``reason`` (a :class:`FileCheck` problem) says the file is no readable Parquet file."""
    return reason.startswith(UNREADABLE_REASONS)


def parquet_footer(storage: Storage, path: str) -> Any:
    """The Parquet metadata of one file, read from its end only (ranged reads on S3)."""
    import pyarrow.parquet as pq

    with storage.open_read(path) as fh:
        return pq.read_metadata(fh)


def check_file(
    cfg: TableConfig,
    path: str,
    storage: Storage | None = None,
    size: int | None = None,
    dropped: frozenset[str] = frozenset(),
) -> FileCheck:
    """Read one file's footer and judge it against the registry (never raises for bad data).

    ``dropped``: columns the source dropped earlier (``schema_changes: evolve``; :func:`.schema.judge`).
    """
    storage = storage or LocalStorage()
    if cfg.format != "parquet":
        return check_record_file(cfg, path, storage, size, dropped)
    try:
        meta = parquet_footer(storage, path)
        schema = meta.schema.to_arrow_schema()
    except StorageError:
        raise  # the store is unreachable or refuses us: that is not the file's fault
    except Exception as exc:  # noqa: BLE001 - every reader error means the same: the file is unreadable
        if size is None:
            size = storage.size(path) if storage.exists(path) else -1
        empty, unreadable = UNREADABLE_REASONS
        reason = empty if size == 0 else f"{unreadable} ({type(exc).__name__}: {exc})"
        return FileCheck(problem=reason)
    check = FileCheck(rows=meta.num_rows)
    if cfg.envelope != "flattened":
        # Envelope columns (before, after, source, ...): the job maps them to the registry's; the
        # row structs say which data columns the source has now (schema_changes).
        from cdc_compaction.job.record_schema import parquet_envelope_columns

        return judge_record_columns(cfg, check, parquet_envelope_columns(schema), path, dropped)
    # Spark resolves Parquet columns case-insensitively: two columns differing only by case
    # make every read of the file fail ("Found duplicate field(s)"), deep in the job.
    by_lower: dict[str, list[str]] = {}
    for f in schema:
        by_lower.setdefault(f.name.lower(), []).append(f.name)
    clashes = sorted(names for names in by_lower.values() if len(names) > 1)
    if clashes:
        check.problem = "columns that differ only by case (Spark cannot tell them apart): " + "; ".join(
            " and ".join(repr(n) for n in names) for names in clashes
        )
        return check
    physical = physical_types(meta)
    from cdc_compaction.core.schema import judge

    seen = {f.name: logical_type(f.type, physical.get(f.name)) for f in schema}
    verdict = judge(cfg.schema_policy, [(c.name, c.type) for c in cfg.columns], seen, path, dropped)
    check.missing_columns, check.ignored_columns, check.changes = verdict.missing, verdict.ignored, verdict.changes
    check.problem = verdict.problem
    if check.problem is None:
        check.problem = _partition_value_problem(cfg, storage, path, found_names={f.name for f in schema})
    if check.problem is None:
        check.newest_event = newest_event_time(cfg, meta)
    return check


def derived_columns(cfg: TableConfig) -> set[str]:
    """The registry columns (lower case) the decoder fills from elsewhere than the record's data columns.

    The Kafka position (``__kafka_topic``/``__kafka_partition``/``__kafka_offset``: the file name);
    with ``source: debezium`` the PostgreSQL position ``__commit_lsn``/``__row`` (from ``source.sequence``
    or a flattened JSON or Avro record's ``__sequence``: :func:`cdc_compaction.job.decode.source_position`); with
    ``envelope: debezium`` also every ``__<field>`` (``add.fields``: the envelope and its
    ``source``) and a keyless table's before-image columns (the envelope's ``before``).
    """
    derived = {"__kafka_topic", "__kafka_partition", "__kafka_offset"}
    if getattr(cfg, "source", None) == "debezium":
        # The PostgreSQL source position, derived from source.sequence/lsn where a record lacks it; a
        # flattened record's sequence (add.fields=sequence) is what it is derived from, not a new column.
        derived |= {"__commit_lsn", "__row", "__sequence", "__source_sequence"}
    if cfg.envelope == "debezium":
        derived |= {c.name.lower() for c in cfg.columns if c.name.startswith("__")}
        derived |= {c.lower() for c in getattr(cfg, "before_columns", None) or []}
    return derived


def judge_record_columns(
    cfg: TableConfig, check: FileCheck, file_columns: Mapping[str, str | None], path: str, dropped: frozenset[str]
) -> FileCheck:
    """Judge the data columns a decoded file's records carry (their schema's) against the registry's.

    Only what the source added or dropped is judged: a registry column the records carry is decoded
    into the registry's type by the job (a Debezium ``MicroTimestamp`` is an int64 in the file, a
    timestamp in the table), so its type here is no widening and no conflict.  A file whose records
    carry no schema and no values (all tombstones) tells nothing and is not judged; a column of bare
    JSON null in every record (type None) is carried, but is added only once a value types it.
    """
    if not file_columns:
        return check
    from cdc_compaction.core.schema import judge

    derived = derived_columns(cfg)
    registry = [(c.name, c.type) for c in cfg.columns if c.name.lower() not in derived]
    listed = {n.lower() for n, _ in registry} | derived
    carried = {n.lower() for n in file_columns}
    new = {n: t for n, t in file_columns.items() if n.lower() not in listed and t is not None}
    missing = [(n, t) for n, t in registry if n.lower() not in carried]
    verdict = judge(cfg.schema_policy, missing, new, path, dropped)
    check.missing_columns, check.ignored_columns, check.changes = verdict.missing, verdict.ignored, verdict.changes
    check.problem = verdict.problem
    return check


def check_record_file(
    cfg: TableConfig,
    path: str,
    storage: Storage,
    size: int | None = None,
    dropped: frozenset[str] = frozenset(),
) -> FileCheck:
    """A JSON Lines or Avro file (registry ``format``): readable, how many records it holds, and its columns.

    JSON: every non-empty line is a record (the first must be a JSON value; a bad line further on
    is the job's to quarantine, with its line). Avro: the container header (magic, schema, codec)
    and the block headers' record counts, no record decoded. A file that fails is a bad file,
    handled per ``on_bad_file`` like an unreadable Parquet file.  The data columns the records'
    schema carries (each line's Connect schema, the Avro schema) are judged per ``schema_changes``
    (:func:`judge_record_columns`): a column added at the source follows ``evolve`` as in Parquet.
    """
    import json

    from cdc_compaction.job import avro_container
    from cdc_compaction.job.record_schema import avro_columns, json_columns

    try:
        with storage.open_read(path) as fh:
            data = fh.read()
    except StorageError:
        raise
    except OSError as exc:
        return FileCheck(problem=f"not readable ({type(exc).__name__}: {exc})")
    if not data:
        return FileCheck(problem="empty file (0 bytes)")
    if cfg.format == "avro":
        try:
            check = FileCheck(rows=avro_container.count_records(data))
            meta, _, _ = avro_container.header(data)
            schema = avro_container.Schema(meta["avro.schema"].decode("utf-8"))
        except (avro_container.AvroError, UnicodeDecodeError) as exc:
            return FileCheck(problem=f"not readable as an Avro container file ({exc})")
        return judge_record_columns(cfg, check, avro_columns(schema, cfg.envelope), path, dropped)
    lines = [line for line in data.split(b"\n") if line.strip()]
    try:
        json.loads(lines[0])
    except (ValueError, IndexError) as exc:
        return FileCheck(
            problem=f"not JSON Lines (line 1: {type(exc).__name__}: {str(exc)[:80]}); the table's format is json: "
            "one Kafka record value per line as Kafka Connect's JsonConverter writes it"
        )
    return judge_record_columns(cfg, FileCheck(rows=len(lines)), json_columns(lines, cfg.envelope), path, dropped)


_UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def event_time_value(value: Any, unit: str | None) -> datetime | None:
    """A footer statistic of the event time column as an aware UTC datetime."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if unit is not None and isinstance(value, int):
        return datetime.fromtimestamp(value / _UNITS[unit], tz=UTC)
    return None


def newest_event_time(cfg: TableConfig, meta: Any) -> datetime | None:
    """The largest value of the registry's event time column in a file, from the row groups' statistics.

    None when the table has no event time column, or the writer kept no statistics.
    """
    spec = cfg.event_time_column
    if spec is None:
        return None
    column, unit = spec
    names = [meta.schema.column(i).name.lower() for i in range(meta.num_columns)]
    if column.lower() not in names:
        return None
    idx = names.index(column.lower())
    newest: datetime | None = None
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(idx).statistics
        if stats is None or not stats.has_min_max:
            continue
        value = event_time_value(stats.max, unit)
        if value is not None and (newest is None or value > newest):
            newest = value
    return newest


#: The longest file name most file systems (and S3 key components in practice) take.
MAX_NAME_BYTES = 255
# Characters Spark escapes (as %XX) in a partition directory name (ExternalCatalogUtils.escapePathName).
_SPARK_ESCAPED = {chr(c) for c in range(0x01, 0x20)} | set("\"#%'*/:=?\\\x7f{[]^")


def partition_dir_name(value: str) -> str:
    """The directory name the job's ``partitionBy`` gives a ``_cdc_partition`` value (``cdc_partition=<escaped>``)."""
    return PARTITION_DIR_PREFIX + "".join(f"%{ord(ch):02X}" if ch in _SPARK_ESCAPED else ch for ch in value)


def _partition_value_problem(cfg: TableConfig, storage: Storage, path: str, found_names: set[str]) -> str | None:
    """A row whose partition value cannot be a directory name (only an identity of a string can be that long)."""
    part = cfg.partition_by
    if part is None or part.transform != "identity":
        return None
    kind = next(c.type for c in cfg.columns if c.name == part.column).lower()
    column = next((n for n in found_names if n.lower() == part.column.lower()), None)
    if column is None or not kind.startswith(("string", "varchar", "char")):
        return None  # numbers, dates and timestamps print short; a missing column is NULL
    import pyarrow.parquet as pq

    with storage.open_read(path) as fh:
        values = pq.read_table(fh, columns=[column]).column(0).to_pylist()
    for row, value in enumerate(values):
        if value is None:
            continue
        size = len(partition_dir_name(partition_value(str(value))).encode("utf-8"))
        if size > MAX_NAME_BYTES:
            return (
                f"row {row}: the partition value of {part.column!r} ({str(value)[:40]!r}…, {len(str(value))} "
                f"characters) makes a partition directory name of {size} bytes, over the {MAX_NAME_BYTES} a file "
                f"name may have. Partition by a shorter column (or a day/month/year of a timestamp), or fix the row"
            )
    return None
