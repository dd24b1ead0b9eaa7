"""The key index of partitioned tables (README, "Key index"): where a version's index is, and its audit.

The compaction job writes, beside every partition it rewrites, that partition's key columns
sorted by key (``<version>/index/cdc_partition=<v>/``); the commit record maps each partition
to its index (``Commit.index``), and an untouched partition keeps the index of the version that
wrote it, as it keeps its data.  The next compaction reads the index, pruned to the key range
of its events, instead of every partition's key columns.

``cdc-compaction index verify|rebuild DB.TABLE`` checks and rewrites the live
version's index with pyarrow and DuckDB, no Spark, a batch of keys at a time (:class:`_Keys`).
A rebuild never writes anything a commit references:
it writes a new directory ``<live version>/index-<token>/`` and then, as its one atomic step, the
side file ``_cdc/index/c<seq>.json`` naming it for that commit.  A crash before the side file
leaves an unreferenced directory and the old index in use; :func:`live_index` is what every
reader of the index (plan, publish, retention, rollback) asks.
"""

from __future__ import annotations

import json
import logging
import posixpath
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cdc_compaction.core.exceptions import KeyIndexError
from cdc_compaction.core.lake import Commit, Lake, TableLease
from cdc_compaction.core.storage import is_data_file
from cdc_compaction.job.contract import (
    INDEX_DIR,
    OLD_PARTITION_DIR_PREFIX,
    PARTITION_COLUMN,
    PARTITION_DIR_PREFIX,
    partition_dir_value,
)

log = logging.getLogger(__name__)

#: Rows per row group of a rebuilt index file (the job's index aims at the same, by bytes).
REBUILD_ROW_GROUP_ROWS = 32_768


def side_path(lake: Lake, seq: int) -> str:
    """The side file that names a rebuilt index of commit ``seq``."""
    return posixpath.join(lake.layout.control, INDEX_DIR, f"c{seq:08d}.json")


def live_index(lake: Lake, commit: Commit) -> dict[str, str]:
    """``commit``'s key index {value: index directory}: a rebuilt one if ``index rebuild`` wrote one, else its own.

    Only partitions of the commit's map; a partition missing from the result has no index (its
    key columns are read instead).
    """
    index = commit.index or {}
    path = side_path(lake, commit.seq)
    if commit.partitions is not None and lake.storage.exists(path):
        doc = json.loads(lake.storage.read_text(path))
        if doc.get("version") == commit.version:  # a side file of another table's history is ignored
            index = doc.get("index") or {}
    # Side files name directories relative to the root (older ones absolutely): resolved here, like records.
    return {v: lake.layout.abs(index[v]) for v in sorted(commit.partitions or {}) if v in index}


def _files(lake: Lake, location: str) -> list[str]:
    if not lake.storage.exists(location):
        return []
    return sorted(e.path for e in lake.storage.list_dir(location) if not e.is_dir and is_data_file(e.name))


def _instant(field: Any) -> Any:
    """``field`` with a timestamp type as microseconds in UTC (an instant, as Spark's TimestampType is)."""
    import pyarrow as pa

    return field.with_type(pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(field.type) else field


def _quoted(names: list[str]) -> str:
    return ", ".join('"' + c.replace('"', '""') + '"' for c in names)


class _Keys:
    """Key columns in a DuckDB database on local disk: a partition's data and index, and every partition's.

    ``verify_index`` compares each partition's index with its data's keys and asks which keys are in
    two partitions (a grouping over every key of the table); ``rebuild_index`` sorts each partition's
    keys. The files are read a row group batch at a time into DuckDB, which sorts, compares and groups
    within its memory limit and spills past it, so this process holds a batch of keys, never a
    partition's or the table's (issue 38: nothing that grows with the table in one process's memory).
    NULL key values are equal to each other here, as in SQL's GROUP BY and EXCEPT ALL.

    Timestamp key columns are held as instants (microseconds, UTC) whatever the file holds: Spark's
    INT96 (older versions, ``parquet_timestamps: int96``), which Arrow reads as naive nanoseconds, or
    INT64 microseconds adjusted to UTC. Left to DuckDB, a naive and an adjusted column would meet
    through a cast in the session's time zone (the process's), and the same key would differ by the
    zone's offset; a rebuilt index is written in the table's ``parquet_timestamps``, as the job writes it.
    """

    MEMORY_LIMIT = "128MB"
    #: Keys read from a file (and handed to DuckDB) at a time.
    BATCH_ROWS = 65_536

    def __init__(self, pk: list[str], parquet_timestamps: str = "micros") -> None:
        import tempfile

        import duckdb

        self._pk = pk
        self._int96 = parquet_timestamps == "int96"
        self._dir = tempfile.TemporaryDirectory(prefix="cdc-key-index-")
        self._con = duckdb.connect(posixpath.join(self._dir.name, "keys.duckdb"))
        self._con.execute(f"SET memory_limit = '{self.MEMORY_LIMIT}'")
        self._con.execute("SET temp_directory = ?", [posixpath.join(self._dir.name, "spill")])
        # One thread: the sort and the set operations stay within the limit without a buffer per core.
        self._con.execute("SET threads = 1")
        # Instants compare and convert the same in every zone (see the class docstring).
        self._con.execute("SET TimeZone = 'UTC'")
        self._every = False
        #: The Arrow schema of the key columns of the last file :meth:`load` read.
        self.schema: Any = None

    def __enter__(self) -> _Keys:
        return self

    def __exit__(self, *exc: object) -> None:
        self._con.close()
        self._dir.cleanup()

    @property
    def local_dir(self) -> str:
        """A local scratch directory that goes with this store."""
        return self._dir.name

    def load(self, name: str, lake: Lake, files: list[str]) -> int | None:
        """Table ``name`` anew from the key columns of ``files``; its rows, or None without a file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._con.execute(f"DROP TABLE IF EXISTS {name}")
        rows: int | None = None
        for f in files:
            with lake.storage.open_read(f) as fh:
                # INT96 in microseconds: Spark's precision, and no overflow of nanoseconds past 2262.
                pf = pq.ParquetFile(fh, coerce_int96_timestamp_unit="us")
                self.schema = pa.schema([_instant(pf.schema_arrow.field(c)) for c in self._pk])
                if rows is None:
                    # Created from the first file's key types (empty files too); later files' are cast to them.
                    self._insert(name, self.schema.empty_table(), create=True)
                    rows = 0
                for batch in pf.iter_batches(batch_size=self.BATCH_ROWS, columns=self._pk):
                    # A naive timestamp (INT96) is Spark's UTC instant: Arrow's cast to UTC keeps its value.
                    self._insert(name, pa.Table.from_batches([batch]).cast(self.schema), create=False)
                    rows += batch.num_rows
        return rows

    def _insert(self, name: str, batch: Any, create: bool) -> None:
        self._con.register("batch", batch)
        try:
            if create:
                self._con.execute(f"CREATE TABLE {name} AS SELECT {_quoted(self._pk)} FROM batch")
            else:
                self._con.execute(f"INSERT INTO {name} SELECT {_quoted(self._pk)} FROM batch")
        finally:
            self._con.unregister("batch")

    def differing(self, a: str, b: str) -> int:
        """Keys in one table and not the other, counted with their repeats (EXCEPT ALL both ways)."""
        cols = _quoted(self._pk)
        (n,) = self._con.execute(
            f"SELECT (SELECT count(*) FROM (SELECT {cols} FROM {a} EXCEPT ALL SELECT {cols} FROM {b})) "
            f"+ (SELECT count(*) FROM (SELECT {cols} FROM {b} EXCEPT ALL SELECT {cols} FROM {a}))"
        ).fetchone()
        return int(n)

    def tag(self, name: str, value: str) -> None:
        """Add table ``name``'s keys, tagged with partition ``value``, to every partition's keys."""
        cols = _quoted(self._pk)
        if self._every:
            self._con.execute(f"INSERT INTO every_key SELECT {cols}, ? FROM {name}", [value])
        else:
            self._con.execute(
                f"CREATE TABLE every_key AS SELECT {cols}, ?::VARCHAR AS {PARTITION_COLUMN} FROM {name}", [value]
            )
            self._every = True

    def in_two_partitions(self) -> tuple[int, list[dict[str, Any]]]:
        """How many keys are in more than one partition, and up to three of them."""
        if not self._every:
            return 0, []
        cols = _quoted(self._pk)
        twice = f"SELECT {cols} FROM every_key GROUP BY {cols} HAVING count(DISTINCT {PARTITION_COLUMN}) > 1"
        (found,) = self._con.execute(f"SELECT count(*) FROM ({twice})").fetchone()
        cur = self._con.execute(f"{twice} ORDER BY ALL LIMIT 3")
        names = [d[0] for d in cur.description]
        examples = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        return int(found), examples

    def write_sorted(self, name: str, path: str, row_group_rows: int) -> None:
        """Table ``name`` sorted by key (ascending, NULL last) to the local Parquet file ``path``, a row group at
        a time, in the key types of the files it was read from (timestamps in the table's ``parquet_timestamps``)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        order = ", ".join(f"{_quoted([c])} ASC NULLS LAST" for c in self._pk)
        # A relation's reader streams (a DB-API result's would copy every row first).
        reader = self._con.sql(f"SELECT {_quoted(self._pk)} FROM {name} ORDER BY {order}").to_arrow_reader(
            row_group_rows
        )
        # Timestamps as the job writes them for the table: INT64 microseconds adjusted to UTC, or INT96.
        with pq.ParquetWriter(
            path, self.schema, compression="snappy", use_deprecated_int96_timestamps=self._int96
        ) as writer:
            for batch in reader:
                writer.write_table(pa.Table.from_batches([batch]).cast(self.schema), row_group_size=row_group_rows)


@dataclass(frozen=True)
class IndexReport:
    """What ``index verify`` found: partitions checked, index rows, and one line per problem."""

    table: str
    seq: int
    partitions: int
    rows: int
    problems: tuple[str, ...]

    def line(self) -> str:
        state = "ok" if not self.problems else f"{len(self.problems)} problems"
        return f"key index of commit {self.seq}: {self.partitions} partitions, {self.rows} keys: {state}"


def verify_index(lake: Lake, commit: Commit | None = None) -> IndexReport:
    """Check the key index of ``commit`` (the live one by default) against its data, every partition.

    Each partition must have an index, its files must exist and hold exactly the keys of the
    partition's data files, and no key may be in two partitions' indexes (a partition without
    an index counts with its data's keys). Reads the key columns
    of every partition: an audit, not something a run does.
    """
    cfg = lake.cfg
    commit = commit or lake.latest_commit()
    if commit.partitions is None or cfg.partition_by is None:
        raise KeyIndexError(
            f"{cfg.qualified_name}: has no partition_by, so it has no key index (commit {commit.seq}). "
            "Nothing to verify"
        )

    pk = list(cfg.primary_key)
    fix = f"run `cdc-compaction index rebuild {cfg.qualified_name}`"
    index = live_index(lake, commit)
    problems: list[str] = []
    rows = 0
    with _Keys(pk) as keys:
        for value, data_loc in sorted(commit.partitions.items()):
            loc = index.get(value)
            if loc is None:
                # Its data's keys stand in for the index: a key must still be in one partition only.
                if keys.load("data_keys", lake, _files(lake, data_loc)) is not None:
                    keys.tag("data_keys", value)
                problems.append(
                    f"{cfg.qualified_name}: partition {value!r} ({data_loc}) has no key index in commit "
                    f"{commit.seq} (written before the key index, or rewritten by erase): compactions scan its "
                    f"keys; {fix}"
                )
                continue
            files = _files(lake, loc)
            if not files:
                problems.append(
                    f"{cfg.qualified_name}: partition {value!r}: its key index {loc} holds no Parquet file; {fix}"
                )
                continue
            try:
                got = keys.load("index_keys", lake, files) or 0
            except Exception as exc:  # noqa: BLE001 - any unreadable file is this problem, named
                problems.append(
                    f"{cfg.qualified_name}: partition {value!r}: key index files {files} are unreadable ({exc}); {fix}"
                )
                continue
            want = keys.load("data_keys", lake, _files(lake, data_loc))
            rows += got
            if want is None or keys.differing("index_keys", "data_keys"):
                problems.append(
                    f"{cfg.qualified_name}: partition {value!r}: key index {files} holds {got} keys that differ "
                    f"from the {want or 0} keys of its data {data_loc}; {fix}"
                )
            keys.tag("index_keys", value)
        found, examples = keys.in_two_partitions()
    if found:
        problems.append(
            f"{cfg.qualified_name}: {found} keys are in the key index of two partitions, e.g. "
            f"{examples}; {fix} (and check the data: a key lives in one partition)"
        )
    return IndexReport(cfg.qualified_name, commit.seq, len(commit.partitions), rows, tuple(problems))


@dataclass(frozen=True)
class RebuildResult:
    """What ``index rebuild`` wrote: the commit, the new index directory, partitions and keys."""

    seq: int
    location: str
    partitions: int
    rows: int

    def line(self) -> str:
        return (
            f"rebuilt the key index of commit {self.seq}: {self.partitions} partitions, "
            f"{self.rows} keys in {self.location}"
        )


def rebuild_index(lake: Lake, by: str, now: datetime) -> RebuildResult:
    """Write the live version's key index anew from its data, under the table lease (module docstring).

    Every partition's key columns are read, sorted and written to ``<live version>/index-<token>/``;
    then the side file names the new index for the live commit (one atomic write). A compaction
    that commits later builds on it like on any index.
    """
    cfg = lake.cfg
    if cfg.partition_by is None:
        raise KeyIndexError(f"{cfg.qualified_name}: has no partition_by, so it has no key index. Nothing was changed")
    token = uuid.uuid4().hex[:8]
    owner = f"index-rebuild:{by}:{token}"
    lease = TableLease(lake)
    lease.acquire(owner, cfg.lease_timeout, now)
    try:
        commit = lake.latest_commit()
        if commit.partitions is None:
            raise KeyIndexError(
                f"{cfg.qualified_name}: commit {commit.seq} has no partition map (nothing compacted yet). "
                "Nothing was changed"
            )
        pk = list(cfg.primary_key)
        where = posixpath.join(lake.layout.version_dir(commit.version), f"{INDEX_DIR}-{token}")
        index: dict[str, str] = {}
        rows = 0
        with _Keys(pk, cfg.parquet_timestamps) as keys:
            for value, data_loc in sorted(commit.partitions.items()):
                name = posixpath.basename(data_loc.rstrip("/"))
                if partition_dir_value(name) is None:
                    raise KeyIndexError(
                        f"{cfg.qualified_name}: partition {value!r} lives at {data_loc}, not in a "
                        f"{PARTITION_DIR_PREFIX}<value> (or, written before, {OLD_PARTITION_DIR_PREFIX}<value>) "
                        "directory; the key index cannot name it. Nothing was changed"
                    )
                n = keys.load("data_keys", lake, _files(lake, data_loc))
                if n is None:
                    continue  # an empty partition has no keys to index
                local = posixpath.join(keys.local_dir, "index.parquet")
                keys.write_sorted("data_keys", local, REBUILD_ROW_GROUP_ROWS)
                out = posixpath.join(where, name)
                lake.storage.makedirs(out)
                lake.storage.upload(local, posixpath.join(out, "part-00000-rebuilt.snappy.parquet"))
                index[value] = out
                rows += n
        doc = {
            "seq": commit.seq,
            "version": commit.version,
            # Relative to the root, as commit records name files: a copied lake reads its own index.
            "index": {v: lake.layout.rel(d) for v, d in index.items()},
            "rebuilt_at": now.isoformat(),
            "by": by,
        }
        # The one step that makes the new index the live one (atomic replace of a small file).
        lake.storage.makedirs(posixpath.dirname(side_path(lake, commit.seq)))
        lake.storage.write_text(side_path(lake, commit.seq), json.dumps(doc, indent=1, sort_keys=True))
        log.info("%s: rebuilt the key index of commit %d in %s", cfg.qualified_name, commit.seq, where)
        return RebuildResult(commit.seq, where, len(index), rows)
    finally:
        lease.release(owner)
