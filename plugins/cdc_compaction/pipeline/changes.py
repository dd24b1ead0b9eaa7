"""The ``<t>_changes`` table: each commit's net change as a Parquet file any engine reads.

The compaction job computes a commit's change in the same pass as its version (plan
``change_feed``; ``job/modes/cdc.py`` ``feed_rows``: each touched key's stored row against its
winner) and writes it beside the version, ``<version>/changes/``, counted in its stats.  After a
``mode: cdc`` table's publish, :func:`sync_changes` copies that file to ``changes/c<seq>.parquet``
under the table's root (:func:`copy_feed`: a storage copy, no row read here).  A commit without a
job-written feed -- a rollback's, an erase's, one from before the job wrote feeds, the catch-up of
a missing file -- falls back to :func:`write_feed`: the change between the commit and its parent
(``travel.diff_rows`` on their visible rows: ``insert`` / ``update_before`` + ``update_after`` /
``delete``; ``_commit_version`` and ``_commit_seq`` = the commit), read into this task's memory.
``<t>_changes`` is an external Hive Parquet
table at ``changes/`` (created through the metastore API, no JVM), not partitioned: Spark, Hive
and Trino read it as it is, with no partition to register and no metastore setting needed
(a Thrift metastore refuses Spark's pushed-down filters on an int partition column unless
``hive.metastore.integral.jdo.pushdown`` is on); Parquet statistics skip the other commits' files.
So ``SELECT * FROM db.<t>_changes WHERE _commit_seq > N`` is the change feed since commit N, one
file per commit -- what ``changes --from N --to M`` nets over a range, commit by commit.

Why these choices (README, "Change feed"):

* Derived data.  A failure here is logged and counted (:data:`FEED_FAILURES`), never fails the
  publish of the data commit: every file is re-creatable from the kept versions, and the
  next publish writes whatever is missing (a rollback's or an erase's commit too).
* Idempotent.  A commit's file is written once (atomic write of a complete file) and never
  again; a retry or the catch-up finds it and only registers it.
* Retention follows ``keep_versions``: a file exists for the commits whose versions are kept,
  and goes when its version does -- so the whole feed can always be rebuilt from what is kept.
"""

from __future__ import annotations

import collections
import io
import logging
import math
import posixpath
import re
from typing import Any

from cdc_compaction.core.exceptions import TimeTravelError
from cdc_compaction.core.lake import Commit, Lake, kept_seqs
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.storage.base import is_data_file
from cdc_compaction.integrations.metastore import Metastore

# The columns of <t>_changes after the registry's (SEQ_COLUMN: the commit whose file holds a row): the
# job's contract names them, as the job writes the feed too.
from cdc_compaction.job.contract import CHANGE_TYPE, COMMIT_VERSION, SEQ_COLUMN
from cdc_compaction.pipeline.runtime import Runtime

log = logging.getLogger(__name__)

#: Failures to write or register the feed, by table: a side channel's failures are counted, not raised.
FEED_FAILURES: collections.Counter[str] = collections.Counter()
_FILE_NAME = re.compile(r"c(\d{8})\.parquet")


def changes_table(cfg: TableConfig) -> str:
    """The name of a cdc table's change-feed table, ``<t>_changes``."""
    return f"{cfg.table}_changes"


def feed_root(lake: Lake) -> str:
    """``<root>/changes``: the table's location; one ``c<seq>.parquet`` per commit in it."""
    return posixpath.join(lake.layout.root, "changes")


def feed_path(lake: Lake, seq: int) -> str:
    return posixpath.join(feed_root(lake), f"c{seq:08d}.parquet")


def feed_columns(cfg: TableConfig) -> list[tuple[str, str]]:
    """``<t>_changes``'s data columns (name, Hive type): the registry's, then the change's two."""
    return [(c.name, c.type) for c in cfg.columns] + [
        (CHANGE_TYPE, "string"),
        (COMMIT_VERSION, "bigint"),
        (SEQ_COLUMN, "int"),
    ]


def feed_table(cfg: TableConfig, before: Any, after: Any, seq: int) -> Any:
    """The net change from ``before`` to ``after`` (pyarrow tables of visible rows) as commit ``seq``'s file.

    No I/O.  Columns are the registry's (in its order; one neither side has is left out, so a
    reader gets NULL, as for any column a file lacks), then ``_change_type``, ``_commit_version``
    (= ``seq``, int64, as ``changes`` prints it) and ``_commit_seq`` (= ``seq``, int32).  Rows in
    ``travel.diff_rows``' order.
    """
    import pyarrow as pa

    key = list(cfg.primary_key)  # type: ignore[attr-defined]
    types: dict[str, Any] = {}
    for t in (after, before):
        for f in t.schema:
            types.setdefault(f.name.lower(), (f.name, f.type))
    fields = [pa.field(*types[c.name.lower()]) for c in cfg.columns if c.name.lower() in types]
    schema = pa.schema(
        [
            *fields,
            pa.field(CHANGE_TYPE, pa.string()),
            pa.field(COMMIT_VERSION, pa.int64()),
            pa.field(SEQ_COLUMN, pa.int32()),
        ]
    )
    rows = [
        {**{f.name: r.get(f.name) for f in fields}, CHANGE_TYPE: kind, COMMIT_VERSION: seq, SEQ_COLUMN: seq}
        for kind, r in diff_rows(key, before.to_pylist(), after.to_pylist())
    ]
    return pa.Table.from_pylist(rows, schema=schema)


def _version_present(lake: Lake, commit: Commit) -> bool:
    """Are ``commit``'s data files still on storage?  A version retention deleted reads as empty,
    which would turn its rows into inserts: never diff against one."""
    if commit.seq == 0:
        return True
    if commit.partitions is not None:
        return all(lake.storage.exists(loc) for loc in commit.partitions.values())
    return lake.storage.exists(lake.data_location(commit))


def write_feed(lake: Lake, commit: Commit) -> bool:
    """Write ``commit``'s file if it is not there yet; True if it is there now.

    Refuses (TimeTravelError, saying what to do) when the parent's or the commit's version is
    gone from storage: the change cannot be computed any more.
    """
    import pyarrow.parquet as pq

    path = feed_path(lake, commit.seq)
    if lake.storage.exists(path):
        return True  # written once, never again: readers may hold it
    parent = lake.read_commit(commit.parent_seq)
    for c, what in ((parent, "parent"), (commit, "own")):
        if c is None or not _version_present(lake, c):
            raise TimeTravelError(
                f"{lake.cfg.qualified_name}: commit {commit.seq}'s {what} version "
                f"({commit.parent_seq if what == 'parent' else commit.seq}) is no longer on storage, so its "
                f"change ({path}) cannot be computed. Nothing is missing from the table; read the whole version, "
                "or raise keep_versions for the commits to come"
            )
    assert parent is not None
    table = feed_table(lake.cfg, version_rows(lake, parent), version_rows(lake, commit), commit.seq)
    buf = io.BytesIO()
    # Microsecond timestamps: Spark and Hive read no nanosecond Parquet timestamps (pyarrow reads INT96 as ns).
    pq.write_table(table, buf, coerce_timestamps="us", allow_truncated_timestamps=True)
    lake.storage.makedirs(feed_root(lake))
    # Atomic (hidden temporary, then rename; one PUT on S3): a reader never sees half a file.
    lake.storage.write_bytes(path, buf.getvalue())
    log.info("%s: change feed of commit %d: %d rows at %s", lake.cfg.qualified_name, commit.seq, table.num_rows, path)
    return True


def job_feed(lake: Lake, commit: Commit) -> str | None:
    """Where the compaction job wrote ``commit``'s change (its stats' ``change_feed``), or None.

    Only the job's own feed of this very commit: a rollback or an erase commits an older
    version's stats again, whose feed is another commit's change.
    """
    feed = (commit.stats or {}).get("change_feed")
    if not isinstance(feed, dict) or feed.get("seq") != commit.seq or not feed.get("file"):
        return None
    return posixpath.join(lake.layout.version_dir(commit.version), str(feed["file"]))


def copy_feed(lake: Lake, commit: Commit, source: str) -> bool:
    """Copy the job's feed file of ``commit`` (``source``) to ``changes/c<seq>.parquet``; no row is read.

    As :func:`write_feed`: written once (the storage's copy is atomic: a complete file or none),
    never again; True if it is there now.
    """
    path = feed_path(lake, commit.seq)
    if lake.storage.exists(path):
        return True  # written once, never again: readers may hold it
    lake.storage.makedirs(feed_root(lake))
    lake.storage.copy(source, path)
    log.info(
        "%s: change feed of commit %d: the job's %s copied to %s", lake.cfg.qualified_name, commit.seq, source, path
    )
    return True


def feed_plan(live_seq: int, keep_versions: int, present: set[int]) -> tuple[list[int], list[int]]:
    """Which commits' files to write and which to delete, with ``present`` on storage; no I/O.

    Written: every kept commit after the empty table (commit 0 changes nothing) whose parent is
    kept too, and the live one (its parent goes only after this publish).  The oldest kept commit's
    parent is gone: its file is there from its own publish, or cannot be made any more.
    Dropped: those of commits no longer kept (their versions are gone, so the feed could not be
    rebuilt: whatever remains can always be).
    """
    kept = kept_seqs(live_seq, keep_versions)
    write = [s for s in kept if s >= 1 and s not in present and (s - 1 in kept or s == live_seq)]
    drop = sorted(s for s in present if s < kept.start)
    return write, drop


def _present(lake: Lake) -> set[int]:
    out = set()
    for e in lake.storage.list_dir(feed_root(lake)):
        m = _FILE_NAME.fullmatch(e.name)
        if m is not None and not e.is_dir:
            out.add(int(m.group(1)))
    return out


def ensure_changes_table(rt: Runtime, ms: Metastore) -> None:
    """Create ``<t>_changes`` (external Hive Parquet table at ``changes/``) or bring it to the registry's columns."""
    cfg = rt.cfg
    ms.put_external_table(
        cfg.database,
        changes_table(cfg),
        feed_columns(cfg),
        feed_root(rt.lake),
        {
            "cdc.managed_by": "cdc_compaction",
            "cdc.role": "changes",
            "comment": f"Change feed of {cfg.qualified_name}: each commit's net change, one file per commit",
        },
    )


def sync_changes(rt: Runtime, ms: Metastore, live_seq: int) -> dict[str, Any]:
    """Write the missing files of ``<t>_changes``, delete expired ones.  Never raises.

    Called by ``publish`` before retention deletes the parent's version.  Returns what it did
    (the publish result reports it): ``written``, ``dropped``, ``failed`` (commit -> reason).
    """
    cfg, lake = rt.cfg, rt.lake
    done: dict[str, Any] = {"written": [], "dropped": [], "failed": {}}
    if cfg.mode != "cdc" or not cfg.change_feed:
        # Off unless the registry asks (change_feed: true): the job writes the feed, and the fallback pairs
        # rows of both versions in this task's memory. Keyless tables have no key to pair rows by;
        # snapshot tables have <t>_history.
        return done
    # The files and the table are independent: files written while the metastore refuses the
    # table are there for it when a later publish creates it.
    try:
        write, drop = feed_plan(live_seq, cfg.keep_versions, _present(lake))
        for seq in write:
            commit = lake.read_commit(seq)
            try:
                if commit is None:
                    raise TimeTravelError(f"{cfg.qualified_name}: commit record {seq} is missing")
                source = job_feed(lake, commit)
                if source is not None:
                    copy_feed(lake, commit, source)
                else:
                    # No feed from the job (a rollback, an erase, a commit from before it wrote one).
                    write_feed(lake, commit)
                done["written"].append(seq)
            except Exception as exc:  # noqa: BLE001 - derived data: the next publish tries again
                log.warning("%s: no change feed for commit %d: %s", cfg.qualified_name, seq, exc)
                FEED_FAILURES[cfg.qualified_name] += 1
                done["failed"][str(seq)] = str(exc)
        for seq in drop:
            lake.storage.delete(feed_path(lake, seq))
            done["dropped"].append(seq)
    except Exception as exc:  # a side channel never fails the data commit
        log.exception("%s: change feed files not brought up to date; the next publish retries", cfg.qualified_name)
        FEED_FAILURES[cfg.qualified_name] += 1
        done["failed"]["files"] = str(exc)
    try:
        ensure_changes_table(rt, ms)
    except Exception as exc:  # a side channel never fails the data commit
        log.exception(
            "%s: table %s not created or updated; the next publish retries", cfg.qualified_name, changes_table(cfg)
        )
        FEED_FAILURES[cfg.qualified_name] += 1
        done["failed"]["table"] = str(exc)
    return done


#: The prefix of the package's own columns, which a version's visible rows leave out.
INTERNAL_PREFIX = "_cdc_"


# ----------------------------------------------------------------------------- reading
def data_files(lake: Lake, directory: str) -> list[str]:
    """Every data file under ``directory`` (partition subdirectories too), sorted."""
    files = []
    for e in lake.storage.list_dir(directory):
        if e.is_dir:
            files += data_files(lake, e.path)
        elif is_data_file(e.name):
            files.append(e.path)
    return sorted(files)


def version_rows(lake: Lake, commit: Commit) -> Any:
    """The visible rows of ``commit`` as a pyarrow Table of the table's own columns (no ``_cdc_*``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if commit.seq == 0:
        return pa.table({})
    if commit.layout < 2:
        raise TimeTravelError(
            f"{lake.cfg.qualified_name}: version {commit.seq} ({commit.version}) has layout 1 (tombstones among "
            "its rows), which time travel does not read. Diff or roll back to a version written since layout 2"
        )
    dirs = list((commit.partitions or {}).values()) if commit.partitions is not None else [lake.data_location(commit)]
    tables = []
    for d in dirs:
        for f in data_files(lake, d):
            with lake.storage.open_read(f) as fh:
                t = pq.read_table(fh)
            tables.append(t.select([c for c in t.column_names if not c.startswith(INTERNAL_PREFIX)]))
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")


# ------------------------------------------------------------------------------ the diff
def _same(a: Any, b: Any) -> bool:
    # NaN is one value here, as the compaction orders it (README, "NaN"): not a change of a row.
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _keyed(rows: list[dict[str, Any]], key: list[str], what: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        k = tuple(r.get(c) for c in key)
        if k in out:
            raise TimeTravelError(f"{what} holds key {dict(zip(key, k, strict=True))} twice; run `validate` on it")
        out[k] = r
    return out


def diff_rows(
    key: list[str], before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """The net changes from ``before`` to ``after`` (rows as dicts), paired by ``key``; no I/O.

    A column one side lacks (added by a schema change) is NULL there.  Sorted by key, and
    within a key ``update_before`` before ``update_after``.
    """
    b, a = _keyed(before, key, "the older version"), _keyed(after, key, "the newer version")
    columns = list(dict.fromkeys([*(c for r in after[:1] for c in r), *(c for r in before[:1] for c in r)]))
    out: list[tuple[str, dict[str, Any]]] = []
    for k in sorted(set(b) | set(a), key=_sort_key):
        old, new = b.get(k), a.get(k)
        if old is None and new is not None:
            out.append(("insert", new))
        elif new is None and old is not None:
            out.append(("delete", old))
        elif old is not None and new is not None and not all(_same(old.get(c), new.get(c)) for c in columns):
            out += [("update_before", old), ("update_after", new)]
    return out


def _sort_key(k: tuple[Any, ...]) -> tuple[Any, ...]:
    # NULL key parts (nullable_key) first, and values of mixed types still comparable.
    return tuple((v is not None, str(type(v)), v if v is not None else 0) for v in k)
