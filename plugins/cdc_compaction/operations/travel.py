"""Time travel over a table's kept versions: list them, diff two of them (the change feed), roll back.

Every commit names a whole version of the table (lake.py), and ``keep_versions`` keeps the
newest of them on storage, so their visible rows can be read back without Spark (pyarrow).

* :func:`kept_versions` -- the versions a reader may still read, newest last.
* :func:`change_batches` / :func:`change_feed` -- the net changes between two kept versions, by a
  key-based diff of their visible rows (``pipeline.changes.VersionDiff``: in an on-disk DuckDB
  database under a memory limit, streamed out as record batches, so no version is held in this
  process): ``insert`` / ``update_before`` + ``update_after`` / ``delete`` rows, each with the
  commit (``_commit_version``) that last changed that key in the range.  ``mode: keyless``: the
  multiset difference (``insert`` / ``delete`` per copy; a row is named by all its data columns).
  ``mode: snapshot``: by key over the registry's columns (``operation``, ``eff_start_date`` left out).
  Append tables have none.
* :func:`rollback` -- publish an older kept version's rows as a NEW commit: history only moves
  forward, no file a commit references is written again (its data files are copied into a new
  version directory; a partitioned table's partitions are referenced where they are), under the
  table lease, through the same publish path as a compaction (``sync_base_location``).  The
  increments compacted after that version stay in ``archive/``: the rollback takes their changes
  out of the table, and they come back only if re-landed (README, "Time travel and rollback").
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cdc_compaction.core.exceptions import ConcurrentCommitError, TimeTravelError
from cdc_compaction.core.keyindex import live_index
from cdc_compaction.core.lake import Commit, Lake, TableLease, kept_seqs
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.storage.base import is_data_file
from cdc_compaction.job.contract import CHANGE_TYPE, COMMIT_VERSION
from cdc_compaction.job.faults import fault_point
from cdc_compaction.pipeline.changes import VersionDiff, shared_dirs

if TYPE_CHECKING:
    from cdc_compaction.core.settings import MetastoreEndpoint

log = logging.getLogger(__name__)

#: Change types in the order a key's rows are listed.
CHANGE_TYPES = ("delete", "update_before", "update_after", "insert")
#: Columns the job adds to the data files (provenance, partition): not part of a row's value.


@dataclass(frozen=True)
class VersionInfo:
    """One kept version: its commit, when it was made, its visible rows and where they are."""

    seq: int
    version: str
    committed_at: str
    rows: int | None
    location: str
    live: bool
    rollback_of: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "commit": self.seq,
            "version": self.version,
            "committed_at": self.committed_at,
            "rows": self.rows,
            "location": self.location,
            "live": self.live,
            "rollback_of": self.rollback_of,
        }

    def line(self) -> str:
        rows = "?" if self.rows is None else str(self.rows)
        note = " (live)" if self.live else ""
        if self.rollback_of is not None:
            note += f" (rollback to {self.rollback_of})"
        return f"{self.seq:>6}  {self.committed_at or '-':<32}  {rows:>10}  {self.version}  {self.location}{note}"


def rows_of(commit: Commit) -> int | None:
    """The visible rows of ``commit``'s version as its record counts them (``versions``, the tables page)."""
    if commit.seq == 0:
        return 0
    if commit.partition_rows is not None:
        return sum(commit.partition_rows.values())
    n = (commit.stats or {}).get("output_visible_rows")
    return None if n is None else int(n)


def version_rows_now(lake: Lake, commit: Commit) -> int | None:
    """The visible rows ``commit``'s kept version holds now, from its files' footers (no row is read).

    Not the record's count alone: an erase rewrites every kept version's files (the erased rows
    leave history too) and leaves their records as they were. A layout-1 version (tombstones among
    its rows) or one whose files are gone is counted by its record.
    """
    if commit.seq == 0:
        return 0
    if commit.layout < 2:
        return rows_of(commit)
    locations = list(commit.partitions.values()) if commit.partitions is not None else [lake.data_location(commit)]
    try:
        if not all(lake.storage.exists(loc) for loc in locations):
            return rows_of(commit)
        return sum(_footer_rows(lake, loc) for loc in locations)
    except OSError:
        return rows_of(commit)


def kept_versions(lake: Lake) -> list[VersionInfo]:
    """The versions ``keep_versions`` keeps (the live one last); commit 0 is the empty table."""
    latest = lake.latest_commit()
    out = []
    for seq in kept_seqs(latest.seq, lake.cfg.keep_versions):
        commit = lake.read_commit(seq)
        if commit is None:
            continue  # a record lost to a restore: nothing to read there
        location = lake.layout.base if commit.partitions is not None else lake.data_location(commit)
        out.append(
            VersionInfo(
                seq=commit.seq,
                version=commit.version,
                committed_at=commit.committed_at,
                rows=version_rows_now(lake, commit),
                location=location,
                live=seq == latest.seq,
                rollback_of=(commit.rollback or {}).get("to_seq"),
            )
        )
    return out


def kept_commit(lake: Lake, seq: int, latest: Commit | None = None) -> Commit:
    """Commit ``seq`` if its version is kept; otherwise refuse, naming the versions that are."""
    latest = latest or lake.latest_commit()
    kept = kept_seqs(latest.seq, lake.cfg.keep_versions)
    commit = lake.read_commit(seq) if seq in kept else None
    if commit is None:
        raise TimeTravelError(
            f"{lake.cfg.qualified_name}: version {seq} is not kept (kept: {kept.start}..{kept.stop - 1}, "
            f"keep_versions: {lake.cfg.keep_versions}, live: {latest.seq}); its files may be gone. Pick a kept "
            "version (`cdc-compaction versions`), or raise keep_versions in the registry for the future"
        )
    return commit


def _key_of(cfg: TableConfig) -> list[str] | None:
    """What pairs the rows of two versions (None: a multiset, keyless); refuse a mode without a feed."""
    from cdc_compaction.core.mode import mode_of

    mode = mode_of(cfg)
    if not mode.has_change_feed:
        kept_in = mode.changes_kept_in(cfg)
        raise TimeTravelError(
            f"{cfg.qualified_name}: a mode: {cfg.mode} table has no change feed. Read whole versions instead "
            "(`versions` names their locations)" + (f"; {kept_in} holds every change already" if kept_in else "")
        )
    return mode.feed_key(cfg)


@contextmanager
def change_batches(lake: Lake, from_seq: int, to_seq: int) -> Iterator[tuple[Any, Iterator[Any]]]:
    """The net changes from kept version ``from_seq`` to ``to_seq``: (Arrow schema, record batches).

    Every row of the newer (insert, update_after) or older (delete, update_before) version with
    ``_change_type`` and ``_commit_version``: the last commit in (from, to] that changed that key.
    The net change is the diff of the two versions themselves; which commit last changed each key
    comes from the diffs of the consecutive kept versions in between, keys only.  Each version is
    read by DuckDB from its Parquet files into the diff's on-disk database and dropped once its pair is
    diffed (``from_seq``'s, the previous and the current one at most), and the batches stream out
    of it: read them inside the ``with``.
    """
    import pyarrow as pa

    cfg = lake.cfg
    key = _key_of(cfg)
    if from_seq > to_seq:
        raise TimeTravelError(
            f"{cfg.qualified_name}: --from {from_seq} is after --to {to_seq}; the change feed runs forward "
            "(swap them for the changes that undo the range)"
        )
    latest = lake.latest_commit()
    commits = [kept_commit(lake, s, latest) for s in range(from_seq, to_seq + 1)]
    # Partitions every version of the range holds as they were change in none of its diffs: left out.
    skip = shared_dirs(lake, *commits)
    with VersionDiff(cfg.qualified_name, key) as d:

        def load(name: str, c: Commit) -> None:
            d.load_version(name, lake, c, f"version {c.seq} ({c.version})", skip)

        multiset = key is None
        kj = ", ".join(f"k{j}" for j in range(len(key or ())))
        load("v_from", commits[0])
        prev = "v_from"
        pairs: list[tuple[str, str, int]] = []
        # One commit's change (a range of one step, what a downstream of each commit asks): every key of the
        # net change was changed by that commit, so the per-step key diffs (another whole pairing) are skipped.
        one_step = len(commits) == 2
        for i, c in enumerate(commits[1:], start=1):
            cur = f"v_{i}"
            load(cur, c)
            if one_step:
                prev = cur
                continue
            if multiset:
                # A row has no key to name it by: it is named by every column, known once all are loaded.
                pairs.append((prev, cur, c.seq))
            else:
                changed = f"SELECT DISTINCT {kj}, {c.seq} AS seq FROM ({d.changes_sql(prev, cur, [])})"
                d.run(f"INSERT INTO last_change {changed}" if i > 1 else f"CREATE TABLE last_change AS {changed}")
                d.drop_gathered()  # the step's change is in last_change now
                if prev != "v_from":
                    d.run(f"DROP TABLE IF EXISTS {prev}")
            prev = cur
        types = d.union(prev, "v_from")
        if multiset:
            # keyless: the data columns (the op, position and before-image columns are empty in every copy).
            from cdc_compaction.pipeline.changes import feed_registry_columns

            keep = {c.name.lower() for c in feed_registry_columns(cfg)}
            types = {low: t for low, t in types.items() if low in keep}
        columns = list(types)
        if multiset:
            kj = ", ".join(f"k{j}" for j in range(len(columns)))
            for i, (older, newer, seq) in enumerate(pairs):
                changed = f"SELECT DISTINCT {kj}, {seq} AS seq FROM ({d.changes_sql(older, newer, columns)})"
                d.run(f"INSERT INTO last_change {changed}" if i else f"CREATE TABLE last_change AS {changed}")
                d.drop_gathered()
        schema = pa.schema(
            [
                *(pa.field(n, t) for n, t, _ in types.values()),
                pa.field(CHANGE_TYPE, pa.string()),
                pa.field(COMMIT_VERSION, pa.int64()),
            ]
        )
        cols = ", ".join([*(f"n.c{i}" for i in range(len(columns))), "n.kind"])
        net = f"({d.changes_sql('v_from', prev, columns)}) n"
        if len(commits) == 1:  # a version against itself: no change
            sql = f"SELECT {cols}, CAST(NULL AS BIGINT) FROM {net} WHERE false"
        elif one_step:
            sql = f"SELECT {cols}, CAST({commits[1].seq} AS BIGINT) FROM {net} ORDER BY {d.order_by('n.')}"
        else:
            on = " AND ".join(
                f"n.k{j} IS NOT DISTINCT FROM l.k{j}" for j in range(len(columns) if multiset else len(key or ()))
            )
            sql = (
                f"SELECT {cols}, CAST(l.seq AS BIGINT) FROM {net} LEFT JOIN "
                f"(SELECT {kj}, max(seq) AS seq FROM last_change GROUP BY ALL) l ON {on} ORDER BY {d.order_by('n.')}"
            )
        yield schema, d.execute(sql, schema)


def change_feed(lake: Lake, from_seq: int, to_seq: int) -> Any:
    """:func:`change_batches` as one pyarrow Table (the change's rows, not the versions', in memory)."""
    import pyarrow as pa

    with change_batches(lake, from_seq, to_seq) as (schema, batches):
        return pa.Table.from_batches(list(batches), schema=schema)


def render_table(table: Any) -> str:
    """A change feed (or any small Arrow table) as aligned text columns, for the terminal."""
    names = table.column_names
    rows = [["NULL" if v is None else str(v) for v in r.values()] for r in table.to_pylist()]
    widths = [max([len(n), *(len(r[i]) for r in rows)]) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


# ------------------------------------------------------------------------------ rollback
@dataclass(frozen=True)
class RollbackResult:
    """What a rollback published: the new commit, the version whose rows it holds, files copied."""

    seq: int
    version: str
    to_seq: int
    copied_files: int
    resumed: bool

    def line(self) -> str:
        how = "finished the interrupted rollback" if self.resumed else f"copied {self.copied_files} files"
        return f"commit {self.seq} ({self.version}) publishes version {self.to_seq}'s rows; {how}"


class _NoEngine:
    """A rollback runs no Spark: any attempt to is a bug, said plainly."""

    def run_sql(self, cfg: TableConfig, statements: list[str]) -> None:
        raise TimeTravelError(f"{cfg.qualified_name}: rollback runs no Spark SQL ({statements[:1]})")


def _copy_tree(lake: Lake, src: str, dst: str) -> int:
    n = 0
    for e in lake.storage.list_dir(src):
        target = posixpath.join(dst, e.name)
        if e.is_dir:
            n += _copy_tree(lake, e.path, target)
        elif is_data_file(e.name):
            lake.storage.copy(e.path, target)
            n += 1
    return n


def _footer_rows(lake: Lake, directory: str) -> int:
    """Rows of the data files under ``directory``, from their Parquet footers (no row is read)."""
    import pyarrow.parquet as pq

    from cdc_compaction.pipeline.changes import data_files

    total = 0
    for path in data_files(lake, directory):
        with lake.storage.open_read(path) as f:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


def _rollback_counts(lake: Lake, target: Commit) -> tuple[dict[str, Any], dict[str, int] | None]:
    """The new commit's stats and partition rows: what describes version N's rows (the next plan and
    validate read its row counts and partitioning), without N's run counts -- the rollback read no
    increment and refused no row, and N's refused rows stay N's quarantine entry (no second entry).

    The row counts are those of N's files now, from their footers, not N's record: an erase since
    rewrote N's files (every version's) and left N's record as it was, so the copied counts would
    disagree with what the rollback publishes (``versions``, the tables page, the next validate).
    """
    stats = {k: v for k, v in (target.stats or {}).items() if not k.startswith("rejected")}
    if target.partitions is not None:
        partition_rows = {v: _footer_rows(lake, loc) for v, loc in target.partitions.items()}
        visible = sum(partition_rows.values())
    else:
        partition_rows, visible = target.partition_rows, _footer_rows(lake, lake.data_location(target))
    stats.update(increment_rows=0, rejected_rows=0, output_visible_rows=visible)
    if "output_tombstones" in stats:
        stats["output_rows"] = visible + int(stats["output_tombstones"] or 0)
    return stats, partition_rows


def rollback(
    cfg: TableConfig, to_seq: int, metastore: MetastoreEndpoint, by: str, now: datetime | None = None
) -> RollbackResult:
    """Publish kept version ``to_seq``'s rows as a new commit, under the table lease (module docstring).

    Crash-safe as a compaction is: before the commit record nothing is visible (a half-copied
    version directory is an uncommitted attempt, which retention deletes); after it, running the
    rollback again -- or the table's next run -- finishes the publish (roll forward).
    """
    from cdc_compaction.core.mode import mode_of
    from cdc_compaction.integrations.metastore import connect
    from cdc_compaction.pipeline import views
    from cdc_compaction.pipeline.archive import archive_commit
    from cdc_compaction.pipeline.pending import pending_files
    from cdc_compaction.pipeline.publish import sync_base_location
    from cdc_compaction.pipeline.runtime import Runtime, take_lease, utcnow

    refusal = mode_of(cfg).rollback_refusal(cfg)
    if refusal:
        raise TimeTravelError(
            f"{cfg.qualified_name}: {refusal}, so its versions are not rolled back. Nothing was changed"
        )
    lake = Lake(cfg)
    rt = Runtime(cfg=cfg, lake=lake, metastore=metastore, engine=_NoEngine())
    now = now or utcnow()
    token = uuid.uuid4().hex[:8]
    owner = f"rollback:{by}:{token}"
    take_lease(rt, owner, now)
    try:
        latest = lake.latest_commit()
        resumed = bool(latest.rollback and latest.rollback.get("to_seq") == to_seq)
        copied = 0
        if resumed:
            # This very rollback committed before it crashed (or the metastore is behind): finish it.
            commit = latest
        else:
            if to_seq == latest.seq:
                raise TimeTravelError(
                    f"{cfg.qualified_name}: version {to_seq} is the live version already. Nothing was changed"
                )
            target = kept_commit(lake, to_seq, latest)
            if to_seq == 0 or target.layout < 2:
                raise TimeTravelError(
                    f"{cfg.qualified_name}: version {to_seq} ({target.version}) "
                    + ("is the empty table" if to_seq == 0 else "has layout 1 (tombstones among its rows)")
                    + "; rollback publishes a compacted layout-2 version only. Nothing was changed"
                )
            if not lake.is_archived(latest.seq):
                raise TimeTravelError(
                    f"{cfg.qualified_name}: commit {latest.seq} is not archived yet (its run is unfinished). Nothing "
                    "was changed: let the table's DAG finish (or run `step archive`), then roll back"
                )
            seq = latest.seq + 1
            version = f"v{seq:08d}-rb{to_seq}-{token}"
            new_data = lake.layout.data_dir(version, target.layout)
            if target.partitions is None:
                copied += _copy_tree(lake, lake.data_location(target), new_data)
            else:
                lake.storage.makedirs(new_data)  # the partitions stay where they are, referenced
            old_tombs = lake.layout.tombstones_dir(target.version, target.layout)
            new_tombs = lake.layout.tombstones_dir(version, target.layout)
            if old_tombs and new_tombs:
                lake.storage.makedirs(new_tombs)
                copied += _copy_tree(lake, old_tombs, new_tombs)
            fault_point("rollback.after_copy", cfg.qualified_name)
            stats, partition_rows = _rollback_counts(lake, target)
            commit = Commit(
                seq=seq,
                version=version,
                plan_id=f"rollback-{token}",
                run_id=owner,
                parent_seq=latest.seq,
                files=[],
                increments=[],
                stats=stats,
                committed_at=now.isoformat(),
                layout=target.layout,
                partitions=target.partitions,
                partition_rows=partition_rows,
                index=live_index(lake, target) if target.partitions is not None else None,
                freshness=target.freshness,
                schema=target.schema,
                rollback={"to_seq": to_seq, "to_version": target.version, "by": by},
            )
            if not lake.try_commit(commit):
                raise ConcurrentCommitError(
                    f"{cfg.qualified_name}: commit {seq} was taken by another run while rolling back; nothing of "
                    f"the rollback was published ({version} is left for retention). Run the rollback again"
                )
            log.info("%s: commit %d rolls back to version %d (%s)", cfg.qualified_name, seq, to_seq, version)
            fault_point("rollback.after_commit_record", cfg.qualified_name)
        with connect(rt.metastore) as ms:
            sync_base_location(rt, ms, lake.latest_commit())
            fault_point("rollback.after_metastore_swap", cfg.qualified_name)
            # The views show the pending increments over the rolled-back base, as after any publish.
            views.sync(rt, ms, pending_files(rt, utcnow(), set()), commit, drop_gone=True)
            archive_commit(rt, ms, commit)  # nothing to move: marks the commit finished for the next plan
        # A rollback is a new Delta/Iceberg commit too (derived: logged and counted, never raises).
        from cdc_compaction.pipeline.formats import sync_formats

        sync_formats(rt, commit.seq)
        return RollbackResult(commit.seq, commit.version, to_seq, copied, resumed)
    finally:
        TableLease(lake).release(owner)
