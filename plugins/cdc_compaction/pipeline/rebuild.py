"""``rebuild``: recompute a table from its archived increments and check it equals the live version.

The archive keeps every compacted change file (``archive/c<seq>/<increment>/<file>``) and
each commit record names the files it took, so the table's history can be replayed: one
compaction per commit, in commit order (which is increment order), through the same Spark
job and rule the DAG runs, starting from the empty table -- or, with ``--since``, from the
newest kept version whose increments all come before it.  The versions are written under
``rebuild/<id>/`` beside ``base/``, never into it: the live version, the commit log, the
pointer and the metastore are not touched.  The result is compared row for row with the live
version's visible rows and tombstones (registry columns; the bookkeeping columns such as
``_cdc_ingested_at`` differ by construction), and the difference is reported by key.

Commits that took no files are not replayed through the job: a rollback commit (``travel``;
``rollback`` = {to_seq, ...}) makes the replay continue from the replayed state as of the
commit it rolls back to -- the live table after it holds that version's rows, so a replay of
increments alone would keep the changes the rollback took out; an erase commit (``plan_id``
``erase-<id>``, ``stats.kind`` ``erase``) needs nothing, because the erase rewrote the archived
files in place, so the replay never reads an erased row; a published rebuild is the replay itself.

The rebuild holds the table's lease throughout, so no compaction archives or commits
meanwhile.  A crash leaves only a ``rebuild/<id>/`` directory, which the next rebuild
deletes before it starts.
"""

from __future__ import annotations

import json
import logging
import posixpath
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cdc_compaction.core import sql
from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.exceptions import ConcurrentCommitError, RebuildError
from cdc_compaction.core.lake import GENESIS, Commit, Lake, TableLease, kept_seqs
from cdc_compaction.core.mode import mode_of
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.job.contract import DATA_DIR, LAYOUT, STATS_FILE, TOMBSTONES_DIR
from cdc_compaction.job.faults import fault_point
from cdc_compaction.pipeline import views
from cdc_compaction.pipeline.archive import archive_commit
from cdc_compaction.pipeline.owned import remove_job_files
from cdc_compaction.pipeline.pending import pending_files
from cdc_compaction.pipeline.plan import sizing
from cdc_compaction.pipeline.publish import next_partitions, sync_base_location
from cdc_compaction.pipeline.retention import cleanup_versions
from cdc_compaction.pipeline.runtime import Runtime, lease_owner, take_lease, utcnow

log = logging.getLogger(__name__)

#: The directory under the table's storage root that rebuilds write into (never ``base/``).
REBUILD_DIR = "rebuild"
#: How many differing keys a report lists per side (the counts are always whole).
MAX_KEYS_SHOWN = 20


def rebuild_root(lake: Lake) -> str:
    """``<storage root>/rebuild``: every rebuild's versions, one ``<id>/`` each."""
    return posixpath.join(lake.layout.root, REBUILD_DIR)


def check_rebuildable(cfg: TableConfig) -> None:
    """Refuse a table the replay does not support (before any work: the CLI calls it before Spark starts)."""
    if cfg.mode != "cdc":
        raise RebuildError(
            f"{cfg.qualified_name}: field 'mode' is {cfg.mode!r}; rebuild replays cdc tables only "
            f"({doc_ref('data', 'rebuild-and-replay')}). Nothing was changed"
        )


def replay_start(lake: Lake, commits: list[Commit], since: str | None) -> tuple[Commit, list[Commit]]:
    """(the version to start from, the commits to replay on it, in order) for ``since``.

    Without ``since``: the empty genesis version and every commit -- unless retention removed
    the archives of the oldest commits (``archive_retention``): then the oldest kept version
    that holds them all.  With ``since``: the newest commit whose increments all come before it
    and whose version is still kept (its directory exists), and the commits after it; the
    genesis version if no such commit is kept.
    """
    # Kept by keep_versions (an older version directory may stay only for partitions a kept commit
    # references: it is not a whole version to start from).
    live_seq = commits[-1].seq if commits else 0
    window = kept_seqs(live_seq, lake.cfg.keep_versions)
    kept = [c for c in commits if c.seq in window and lake.storage.exists(lake.data_location(c))]
    if since is None:
        expired = [c.seq for c in commits if archive_expired(lake, c)]
        if not expired:
            return GENESIS, list(commits)
        start = next((c for c in kept if c.seq >= max(expired)), None)
        if start is None:
            raise RebuildError(
                f"{lake.cfg.qualified_name}: the archives of commits {expired} are gone (archive_retention) and no "
                "kept version holds them, so the table cannot be replayed. Nothing was changed"
            )
        return start, [c for c in commits if c.seq > start.seq]
    for c in reversed(kept):
        if all(inc < since for inc in c.increments):
            return c, [x for x in commits if x.seq > c.seq]
    return GENESIS, list(commits)


def archive_expired(lake: Lake, commit: Commit) -> bool:
    """True if ``commit``'s archive was finished and later removed by retention (``archive_retention``)."""
    return (
        bool(commit.files)
        and lake.is_archived(commit.seq)
        and not lake.storage.exists(posixpath.join(lake.layout.archive, f"c{commit.seq:08d}"))
    )


def archived_path(lake: Lake, commit: Commit, f: dict[str, Any]) -> str:
    """Where a commit's file is archived (``archive.archive_commit`` writes it there)."""
    return posixpath.join(lake.layout.archive, f"c{commit.seq:08d}", f["increment"], f["name"])


@dataclass
class RebuildReport:
    """What a rebuild did and whether its result equals the live version."""

    table: str
    rebuild_id: str
    live_seq: int
    start_seq: int
    replayed: list[int]
    location: str
    #: Rollback commits met by the replay, as {commit: the commit whose replayed state it continued from}.
    rolled_back: dict[int, int] = field(default_factory=dict)
    #: Commits that took no files and changed nothing a replay must redo (erase, published rebuild).
    skipped: list[int] = field(default_factory=list)
    equal: bool = False
    #: The commit that made the rebuilt version live (``--publish``), else None.
    published_seq: int | None = None
    #: Rows in each side; tombstones compared only when the live version keeps them apart (layout 2).
    live_rows: int = 0
    rebuilt_rows: int = 0
    #: The differing rows' keys, per side (at most MAX_KEYS_SHOWN each), and how many there are.
    only_live: list[dict[str, Any]] = field(default_factory=list)
    only_rebuilt: list[dict[str, Any]] = field(default_factory=list)
    only_live_count: int = 0
    only_rebuilt_count: int = 0

    def lines(self) -> list[str]:
        """The report for people: what was replayed, then the verdict and the keys that differ."""
        out = [
            f"{self.table}: rebuilt from commit {self.start_seq} by replaying commits "
            f"{self.replayed or 'none'} into {self.location}",
            *[
                f"commit {r} rolls back to {to}: continued from the replay as of commit {to}"
                for r, to in self.rolled_back.items()
            ],
            *(
                [f"commits {self.skipped} took no files (erase, published rebuild): nothing to replay"]
                if self.skipped
                else []
            ),
            f"live version (commit {self.live_seq}): {self.live_rows} rows; rebuilt: {self.rebuilt_rows} rows",
        ]
        if self.equal:
            out.append("EQUAL: the rebuilt table equals the live version row for row (tombstones included)")
            out += self._published()
            return out
        out.append(
            f"DIFFERENT: {self.only_live_count} row(s) only in the live version, {self.only_rebuilt_count} only in "
            "the rebuild. Check the archive (a changed or missing file) and the registry (a changed rule) "
            "before trusting either"
        )
        out += [f"  only live:    {k}" for k in self.only_live]
        out += [f"  only rebuilt: {k}" for k in self.only_rebuilt]
        return out + self._published()

    def _published(self) -> list[str]:
        if self.published_seq is None:
            return ["not published (verify only; --publish makes it a new commit)"]
        return [f"published as commit {self.published_seq}: readers now see the rebuilt version"]


def _replay_plan(
    rt: Runtime, parent: dict[str, Any], commit: Commit, out_root: str, plans_kept: dict[str, Any]
) -> dict[str, Any]:
    """The job's plan that replays ``commit``'s files on ``parent`` (a replayed or kept version)."""
    cfg, lake = rt.cfg, rt.lake
    files = []
    for f in commit.files:
        src = archived_path(lake, commit, f)
        if not lake.storage.exists(src):
            # A commit whose archive step has not run yet still has its files in the landing area.
            if not lake.storage.exists(f["path"]):
                raise RebuildError(
                    f"{cfg.qualified_name}: file {f['increment']}/{f['name']} of commit {commit.seq} is neither "
                    f"archived at {src} nor in the landing area at {f['path']}, so the table cannot be replayed "
                    "past it. Restore the file into the archive (from the source or backups); nothing was changed"
                )
            src = f["path"]
        files.append({**f, "path": src})
    # The original plan's clock when it is still kept (retention drops old plans): the same
    # tombstones expire.  Otherwise the commit's time, which is seconds after its plan's.
    ingested_at = plans_kept.get("ingested_at") or commit.committed_at or utcnow().isoformat()
    cutoff = (
        plans_kept.get("tombstone_cutoff")
        or (datetime.fromisoformat(ingested_at) - cfg.tombstone_retention).isoformat()
    )
    version = f"v{commit.seq:08d}-{commit.plan_id}"
    increments = sorted({f["increment"] for f in files})
    doc: dict[str, Any] = {
        "plan_id": commit.plan_id,
        "run_id": f"rebuild-{commit.seq}",
        "owner": parent["owner"],
        "table": cfg.qualified_name,
        "seq": commit.seq,
        "parent_seq": parent["seq"],
        "parent_version": parent["version"],
        "base_rows": parent["rows"],
        "version": version,
        "base_layout": parent["layout"],
        "base_location": parent["data"],
        "base_tombstones_location": parent["tombstones"],
        "base_tombstones": parent["tombstone_rows"],
        "output_location": posixpath.join(out_root, version),
        "quarantine_location": posixpath.join(out_root, "quarantine", version),
        # No commit path: the job must not take the replay for the already committed original.
        "files": files,
        "increments": increments,
        "ingested_at": ingested_at,
        "tombstone_cutoff": cutoff,
        "column_names": cfg.column_names,
        "columns": [{"name": c.name, "type": c.type} for c in cfg.columns],
        "mode": cfg.mode,
        **mode_of(cfg).plan_fields(cfg, parent["commit"]),
        **mode_of(cfg).plan_increments(cfg, increments),
        "schema_ddl": sql.spark_schema_ddl(cfg),
        "parquet_timestamps": cfg.parquet_timestamps,
        "rule": sql.rule_sql(cfg).to_dict(),
        **sizing(sum(f["size"] for f in files), sum(f.get("rows", 0) for f in files), cfg.spark.target_file_mb * 2**20),
    }
    part = sql.partition_sql(cfg)
    if part is not None:
        doc["partition_by"] = part.to_dict()
        doc["base_partitions"] = parent["partitions"] or {}
    return doc


def _kept_plan(rt: Runtime, commit: Commit) -> dict[str, Any]:
    """The original plan file of ``commit`` if retention has not removed it yet ({} otherwise)."""
    path = rt.lake.layout.plan_path(commit.plan_id)
    if not rt.lake.storage.exists(path):
        return {}
    try:
        return json.loads(rt.lake.storage.read_text(path))
    except ValueError:  # a torn plan file from a crash: fall back on the commit's time
        return {}


def _parent_of(lake: Lake, commit: Commit, owner: str) -> dict[str, Any]:
    """A kept version as the starting point of a replay."""
    return {
        "owner": owner,
        "seq": commit.seq,
        "version": commit.version,
        "commit": commit,
        "rows": int(commit.stats.get("output_rows", 0)),
        "tombstone_rows": int(commit.stats.get("output_tombstones", 0)),
        "layout": commit.layout,
        "data": lake.data_location(commit),
        "tombstones": lake.layout.tombstones_dir(commit.version, commit.layout),
        "partitions": commit.partitions,
        "partition_rows": commit.partition_rows,
    }


def rolled_back_state(lake: Lake, commit: Commit, states: dict[int, dict[str, Any]], owner: str) -> dict[str, Any]:
    """The replayed state a rollback ``commit`` continues from: the replay as of the commit it rolls back to.

    That state keeps its own files (each replayed version has its own directory), so nothing is
    copied.  When the replay started after that commit (``--since``, expired archives), the
    rollback commit's own kept version stands in, as a kept version does for the start.
    """
    to_seq = int(commit.rollback["to_seq"])  # type: ignore[index]
    if to_seq in states:
        return {**states[to_seq], "seq": commit.seq, "commit": commit}
    if lake.storage.exists(lake.data_location(commit)):
        return _parent_of(lake, commit, owner)
    raise RebuildError(
        f"{lake.cfg.qualified_name}: commit {commit.seq} rolls back to version {to_seq}, which this replay did not "
        f"rebuild (it started after it) and whose rollback version {commit.version} is no longer kept, so the "
        "replay cannot continue past it. Rebuild without --since (from the empty table); nothing was changed"
    )


def rebuild(
    rt: Runtime, since: str | None = None, publish: bool = False, force: bool = False, now: datetime | None = None
) -> RebuildReport:
    """Replay the table's archived increments into ``rebuild/<id>/`` and compare the result with the live version.

    Without ``publish`` nothing the table's readers see changes.  With it the replay is written
    into ``base/`` as versions of the next commit number and, if it equals the live version (or
    ``force``), committed as a new commit on top of the live one (:func:`_publish`).  Raises
    :class:`RebuildError` if a file to replay is gone or a different rebuild is to be published
    without ``force``, :class:`~cdc_compaction.core.exceptions.ConcurrentRunError` if a run holds the lease.
    """
    cfg, lake = rt.cfg, rt.lake
    check_rebuildable(cfg)
    rebuild_id = uuid.uuid4().hex[:12]
    owner = lease_owner(f"rebuild-{rebuild_id}")
    take_lease(rt, owner, now or utcnow())
    try:
        # Whatever an earlier (crashed) rebuild left is debris: nothing refers to it.
        for e in lake.storage.list_dir(rebuild_root(lake)):
            remove_job_files(lake, e.path)  # the job's files only: anything else put there stays
        live = lake.latest_commit()
        if live.seq == 0:
            raise RebuildError(f"{cfg.qualified_name}: nothing was committed yet, so there is nothing to rebuild")
        commits = [c for s in range(1, live.seq + 1) if (c := lake.read_commit(s)) is not None]
        if len(commits) != live.seq:
            missing = sorted(set(range(1, live.seq + 1)) - {c.seq for c in commits})
            raise RebuildError(
                f"{cfg.qualified_name}: commit records {missing} are missing from {lake.layout.commits}, so the "
                "files they took are unknown and the history cannot be replayed. Restore the records (backups, "
                "object versioning); nothing was changed"
            )
        start, todo = replay_start(lake, commits, since)
        out_root = posixpath.join(rebuild_root(lake), rebuild_id)
        parent = _parent_of(lake, start, owner)
        # The replayed state after each commit, by commit number: what a rollback commit returns to.
        states: dict[int, dict[str, Any]] = {start.seq: parent}
        replayed: list[int] = []
        rolled_back: dict[int, int] = {}
        skipped: list[int] = []
        for i, commit in enumerate(todo):
            if commit.rollback:
                parent = rolled_back_state(lake, commit, states, owner)
                states[commit.seq] = parent
                rolled_back[commit.seq] = int(commit.rollback["to_seq"])
                log.info(
                    "%s: rebuild %s: commit %d rolls back to %d; continuing from the replay as of commit %d",
                    cfg.qualified_name, rebuild_id, commit.seq, rolled_back[commit.seq], rolled_back[commit.seq],
                )  # fmt: skip
                continue
            if not commit.files:
                # An erase (archives erased in place) or a published rebuild: the live version after it
                # holds the parent's rows, so running the job on no input would only expire tombstones
                # on a clock the original never applied.
                states[commit.seq] = parent = {**parent, "seq": commit.seq, "commit": commit}
                skipped.append(commit.seq)
                continue
            doc = _replay_plan(rt, parent, commit, out_root, _kept_plan(rt, commit))
            if publish:
                # Versions of the next commit number in base/: retention leaves them alone until that
                # commit exists, and afterwards keeps exactly what the new commit references (partitions).
                doc["version"] = f"v{live.seq + 1:08d}-rb{rebuild_id}s{i}"
                doc["output_location"] = lake.layout.version_dir(doc["version"])
            stats = rt.engine.compact(doc)  # type: ignore[attr-defined]
            out = f"{doc['output_location']}-{stats['attempt']}" if stats.get("attempt") else doc["output_location"]
            partitions, partition_rows = (None, None)
            if doc.get("partition_by"):
                synthetic = Commit(0, "", "", "", -1, [], [], partitions=parent["partitions"] or {})
                synthetic.partition_rows = parent["partition_rows"] or {}
                partitions, partition_rows = next_partitions(synthetic, stats)
            parent = {
                "owner": owner,
                "seq": commit.seq,
                "version": posixpath.basename(out),
                "commit": commit,
                "rows": int(stats["output_rows"]),
                "tombstone_rows": int(stats["output_tombstones"]),
                "layout": LAYOUT,
                "data": posixpath.join(out, DATA_DIR),
                "tombstones": posixpath.join(out, TOMBSTONES_DIR),
                "partitions": partitions,
                "partition_rows": partition_rows,
                "written": True,
            }
            states[commit.seq] = parent
            replayed.append(commit.seq)
            log.info("%s: rebuild %s replayed commit %d into %s", cfg.qualified_name, rebuild_id, commit.seq, out)
            if len(replayed) == 1:
                fault_point("rebuild.after_first_step", cfg.qualified_name)
        report = RebuildReport(
            table=cfg.qualified_name,
            rebuild_id=rebuild_id,
            live_seq=live.seq,
            start_seq=start.seq,
            replayed=replayed,
            location=parent["data"],
            rolled_back=rolled_back,
            skipped=skipped,
        )
        _compare(rt, live, parent, report)
        if publish:
            if not parent.get("written"):
                # A kept version (the start, or a rollback's own copy) is not this rebuild's output.
                raise RebuildError(
                    f"{cfg.qualified_name}: the replay wrote no version of its own (it ends on kept version "
                    f"{parent['version']}: {report.lines()[0]}), so there is nothing to publish. Rebuild with an "
                    "earlier --since or none; `rollback` publishes a kept version. Nothing was changed"
                )
            _publish(rt, live, parent, report, force, now or utcnow())
    finally:
        TableLease(lake).release(owner)
    log.info("%s: rebuild %s: %s", cfg.qualified_name, rebuild_id, "equal" if report.equal else "DIFFERENT")
    return report


def _compare(rt: Runtime, live: Commit, rebuilt: dict[str, Any], report: RebuildReport) -> None:
    """Fill ``report`` with the row-for-row comparison of the live version and the rebuilt one."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from cdc_compaction.job.compact import read_partitions

    spark = rt.engine.spark  # type: ignore[attr-defined]
    cfg = rt.cfg
    schema = sql.spark_schema_ddl(cfg)
    cols = [F.col(f"`{c}`") for c in cfg.column_names]
    is_delete = sql.rule_sql(cfg).is_delete

    def side(data: str, tombstones: str | None, partitions: dict[str, str] | None, layout: int) -> Any:
        rows = (
            read_partitions(spark, schema, partitions)
            if partitions is not None
            else spark.read.schema(schema).parquet(data)
        )
        rows = rows.select(*cols).withColumn("_tombstone", F.lit(False))
        if layout < 2:
            # Layout 1 keeps tombstones among the rows: the rule tells them apart.
            rows = rows.withColumn("_tombstone", F.expr(is_delete))
        elif tombstones and _exists(rt, tombstones):
            rows = rows.unionByName(
                spark.read.schema(schema).parquet(tombstones).select(*cols).withColumn("_tombstone", F.lit(True))
            )
        return rows

    live_df = side(
        rt.lake.data_location(live),
        rt.lake.layout.tombstones_dir(live.version, live.layout),
        live.partitions,
        live.layout,
    )
    new_df = side(rebuilt["data"], rebuilt["tombstones"], rebuilt["partitions"], LAYOUT)
    if live.seq == 0 and not _exists(rt, rt.lake.data_location(live)):
        live_df = new_df.limit(0)
    only_live, only_new = live_df.exceptAll(new_df), new_df.exceptAll(live_df)
    key = [*mode_of(cfg).plan_fields(cfg, live)["primary_key"], "_tombstone"]
    report.live_rows, report.rebuilt_rows = live_df.count(), new_df.count()
    report.only_live_count, report.only_rebuilt_count = only_live.count(), only_new.count()
    report.only_live = [r.asDict() for r in only_live.select(*key).orderBy(*key).limit(MAX_KEYS_SHOWN).collect()]
    report.only_rebuilt = [r.asDict() for r in only_new.select(*key).orderBy(*key).limit(MAX_KEYS_SHOWN).collect()]
    report.equal = report.only_live_count == 0 and report.only_rebuilt_count == 0


def _exists(rt: Runtime, path: str) -> bool:
    return rt.lake.storage.exists(path)


def _publish(
    rt: Runtime, live: Commit, rebuilt: dict[str, Any], report: RebuildReport, force: bool, now: datetime
) -> None:
    """Commit the rebuilt version on top of ``live`` and make it live, as ``publish`` does for a run.

    History only moves forward: commit ``live.seq + 1`` takes no new input (``files`` empty), so
    archive and the next plan have nothing to move; the rows its replay refused were refused
    (and quarantined) by the original commits already, so it records none.
    """

    cfg, lake = rt.cfg, rt.lake
    if not report.equal and not force:
        raise RebuildError(
            f"{cfg.qualified_name}: the rebuilt version differs from the live commit {live.seq} "
            f"({report.only_live_count} rows only live, {report.only_rebuilt_count} only rebuilt), so it was not "
            "published. Find which side is wrong (`rebuild` lists the keys); publish the rebuild anyway with --force"
        )
    take_lease(rt, rebuilt["owner"], now)  # renewed: a rebuild that lost its lease must not commit
    if lake.latest_commit().seq != live.seq:
        raise ConcurrentCommitError(
            f"{cfg.qualified_name}: the table moved past commit {live.seq} during the rebuild; nothing was "
            "published. Run the rebuild again"
        )
    stats = read_stats(rt, rebuilt["data"])
    stats.update(rejected_rows=0, rejected_by_reason={}, rejected_by_file={})
    stats["rebuild"] = {"id": report.rebuild_id, "from_seq": report.start_seq, "replayed": report.replayed}
    commit = Commit(
        seq=live.seq + 1,
        version=rebuilt["version"],
        plan_id=f"rb{report.rebuild_id}",
        run_id=f"rebuild-{report.rebuild_id}",
        parent_seq=live.seq,
        files=[],
        increments=[],
        stats=stats,
        committed_at=now.isoformat(),
        layout=LAYOUT,
        partitions=rebuilt["partitions"],
        partition_rows=rebuilt["partition_rows"],
        freshness=live.freshness,
        schema=live.schema,
    )
    with connect(rt.metastore) as ms:
        # The live commit's files leave the landing area first, as the next plan would do.
        if not lake.is_archived(live.seq):
            archive_commit(rt, ms, live)
        if not lake.try_commit(commit):
            raise ConcurrentCommitError(
                f"{cfg.qualified_name}: commit {commit.seq} was taken by another run during the rebuild; "
                "nothing was published. Run the rebuild again"
            )
        lake.storage.write_text(lake.layout.archived_marker(commit.seq), json.dumps({"seq": commit.seq, "files": 0}))
        sync_base_location(rt, ms, commit)
        views.sync(rt, ms, pending_files(rt, utcnow(), set()), commit, drop_gone=True)
    report.published_seq = commit.seq
    from cdc_compaction.pipeline.formats import sync_formats

    sync_formats(rt, commit.seq)  # derived: logged and counted, never raises
    cleanup_versions(rt, commit.seq)
    log.info("%s: rebuild %s published as commit %d", cfg.qualified_name, report.rebuild_id, commit.seq)


def read_stats(rt: Runtime, data_dir: str) -> dict[str, Any]:
    """The job's stats of a replayed version (beside its ``data/``), without the file list."""
    text = rt.lake.storage.read_text(posixpath.join(posixpath.dirname(data_dir), STATS_FILE))
    return {k: v for k, v in json.loads(text).items() if k != "output_files"}
