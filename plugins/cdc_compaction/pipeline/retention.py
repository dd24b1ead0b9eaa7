"""Which files of a table's lake may go: old base versions, stale attempts, old plans, writers' temporaries,
expired archives and re-ingested quarantine entries (README, "Retention").

``publish`` calls :func:`cleanup_versions` after a commit; ``archive`` sweeps the
temporaries a killed copy left.  Nothing a kept commit names, nothing of a run that may
still be in flight, and the empty genesis version are ever deleted; nor is an archive a
kept version needs to be rebuilt from, a quarantine entry still waiting for its re-ingest,
or anything under ``_cdc/audit/`` (erase audit records stay for good).
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from cdc_compaction.core.keyindex import live_index
from cdc_compaction.core.lake import EMPTY_VERSION, Commit, version_dir_of
from cdc_compaction.core.lake import kept_seqs as kept_seqs  # retention.kept_seqs for callers
from cdc_compaction.core.mode import mode_of
from cdc_compaction.job.contract import DATA_DIR, INDEX_DIR, TOMBSTONES_DIR, partition_dir_value
from cdc_compaction.job.faults import fault_point
from cdc_compaction.pipeline.owned import remove_named_files, remove_quarantine_entry, remove_version_files
from cdc_compaction.pipeline.quarantine import Quarantine
from cdc_compaction.pipeline.runtime import VERSION_NAME, Runtime, read_json, utcnow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionVerdict:
    """What :func:`cleanup_versions` does to the directories of ``base/``, decided from names alone."""

    #: Version directories deleted whole.
    delete: frozenset[str]
    #: Older version directories that stay only for partitions (base, or a mode's output) a kept commit names
    #: (the rest of each goes).
    by_reference: frozenset[str]
    #: The partition locations the kept commits name: what stays of a ``by_reference`` directory.
    referenced: frozenset[str]


def decide_versions(
    entries: list[tuple[str, bool]], kept: list[Commit], live_seq: int, base: str, outputs: Iterable[str] = ()
) -> VersionVerdict:
    """Which of ``base/``'s entries (name, is a directory) go, with the commits ``kept`` and ``live_seq`` live.

    ``outputs``: the locations the kept commits' mode outputs name (``TableMode.referenced_locations``:
    partition directories ``<version>/<output dir>/<partition>``).
    No I/O.  Deleted: version directories of a commit number up to the live one that no kept
    commit names -- older versions, and attempts or versions of plans that never committed.
    """
    keep = {c.version for c in kept}
    # Partitioned tables reuse untouched partitions by reference: an older version's directory
    # stays as long as a kept commit names one of its partitions, with only those partitions.
    # (layout 1: base/<v>/_cdc_partition=x; layout 2: base/<v>/data/cdc_partition=x, or _cdc_partition=x
    # in versions written before issue 37).
    referenced = {loc.rstrip("/") for c in kept for loc in (c.partitions or {}).values()}
    # Their key index likewise (README, "Key index"): base/<v>/index[-<token>]/cdc_partition=x.
    referenced |= {loc.rstrip("/") for c in kept for loc in (c.index or {}).values()}
    by_reference = {
        posixpath.basename(version_dir_of(loc)) for loc in referenced if posixpath.dirname(version_dir_of(loc)) == base
    } - keep
    # A mode's own outputs (snapshot: every history partition so far, base/<v>/history/eff_start_date=d),
    # each in the version that wrote it, which stays for them.
    named = {loc.rstrip("/") for loc in outputs}
    for loc in named:
        version_dir = posixpath.dirname(posixpath.dirname(loc))
        if posixpath.dirname(version_dir) == base and posixpath.basename(version_dir) not in keep:
            by_reference.add(posixpath.basename(version_dir))
    referenced |= named
    delete = set()
    for name, is_dir in entries:
        m = VERSION_NAME.match(name)
        # The empty genesis version stays: ensure_tables points new tables at it.
        if not is_dir or name in by_reference or name in keep or name == EMPTY_VERSION or m is None:
            continue
        # Versions of a later seq may belong to a run in flight: leave them alone.
        if int(m.group(1)) <= live_seq:
            delete.add(name)
    return VersionVerdict(frozenset(delete), frozenset(by_reference), frozenset(referenced))


def cleanup_versions(rt: Runtime, live_seq: int) -> list[str]:
    """Delete base versions beyond ``keep_versions`` and stale uncommitted ones."""
    lake = rt.lake
    from cdc_compaction.pipeline.formats import expire_formats

    if not expire_formats(rt, set(kept_seqs(live_seq, rt.cfg.keep_versions))):
        # A Delta/Iceberg reader may still open an old version through the format's metadata: its files
        # stay until the format stops naming them (the next publish retries; the failure is counted).
        log.warning("%s: old versions kept this time: a table format still names them", rt.cfg.qualified_name)
        return []
    kept = [c for s in kept_seqs(live_seq, rt.cfg.keep_versions) if (c := lake.read_commit(s))]
    # Each with the key index it has now: a rebuilt one names other directories (keyindex.live_index).
    kept = [dataclasses.replace(c, index=live_index(lake, c)) if c.partitions is not None else c for c in kept]
    entries = lake.storage.list_dir(lake.layout.base)
    mode = mode_of(rt.cfg)
    outputs = [loc for c in kept for loc in mode.referenced_locations(rt.cfg, c)]
    verdict = decide_versions([(e.name, e.is_dir) for e in entries], kept, live_seq, lake.layout.base, outputs)
    referenced, by_reference = verdict.referenced, verdict.by_reference
    removed = []
    for e in entries:
        if e.is_dir and e.name in by_reference:
            version_dir = lake.layout.version_dir(e.name)
            removed += _keep_only_outputs(rt, version_dir, referenced, [d.name for d in mode.output_dirs(rt.cfg)])
            # Only the referenced partitions stay; its tombstones belong to no kept commit.
            indexes = [
                posixpath.join(version_dir, sub.name)
                for sub in lake.storage.list_dir(version_dir)
                if sub.is_dir and (sub.name == INDEX_DIR or sub.name.startswith(f"{INDEX_DIR}-"))
            ]
            for parent in (version_dir, posixpath.join(version_dir, DATA_DIR), *indexes):
                for sub in lake.storage.list_dir(parent):
                    path = posixpath.join(parent, sub.name)
                    unreferenced = partition_dir_value(sub.name) is not None and path not in referenced
                    if sub.is_dir and (unreferenced or (parent == version_dir and sub.name == TOMBSTONES_DIR)):
                        remove_version_files(lake, path)
                        removed.append(f"{e.name}/{path[len(version_dir) + 1 :]}")
            continue
        if e.is_dir and e.name in verdict.delete:
            # File by file, what the job writes there: anything else put in it stays (core/ownership.py).
            remove_version_files(lake, e.path)
            removed.append(e.name)
            fault_point("cleanup.after_first_delete", rt.cfg.qualified_name)
    # Quarantined rows of a committed version are kept until re-ingested; those of a
    # version that never became live were never refused for real: the rows are still pending.
    for e in lake.storage.list_dir(posixpath.dirname(lake.layout.quarantine_dir(EMPTY_VERSION))):
        m = VERSION_NAME.match(e.name)
        if e.is_dir and m is not None and int(m.group(1)) <= live_seq:
            commit = lake.read_commit(int(m.group(1)))
            if commit is None or commit.version != e.name:
                remove_quarantine_entry(lake, e.path)
    sweep_temporaries(rt, [lake.layout.control, lake.layout.plans, lake.layout.commits])
    removed += expire_archives(rt, live_seq)
    for e in lake.storage.list_dir(lake.layout.plans):
        try:
            doc = read_json(rt, e.path)
        except Exception:  # noqa: BLE001 - a torn plan file from a crash is garbage too
            lake.storage.delete(e.path)
            continue
        if int(doc.get("seq", 0)) <= live_seq - rt.cfg.keep_versions:
            lake.storage.delete(e.path)
    if removed:
        log.info("%s: removed old versions %s", rt.cfg.qualified_name, removed)
    return removed


def expirable_archives(
    archived: list[tuple[int, str]], oldest_kept_seq: int, retention: timedelta | None, now: datetime
) -> list[int]:
    """Which commits' archives (seq, committed_at) may go: none without ``retention``.

    No I/O.  Only a commit the oldest kept version already holds (seq up to it): ``rebuild
    --since`` starts from that version and replays only the archives after it, which stay.
    And only once the commit is older than ``retention``.
    """
    if retention is None:
        return []
    cutoff = now - retention
    return sorted(
        seq
        for seq, committed_at in archived
        if 0 < seq <= oldest_kept_seq and committed_at and datetime.fromisoformat(committed_at) < cutoff
    )


def expire_archives(rt: Runtime, live_seq: int, now: datetime | None = None) -> list[str]:
    """Delete archives and re-ingested quarantine entries past ``archive_retention`` (README, "Retention")."""
    cfg, lake = rt.cfg, rt.lake
    retention = cfg.archive_retention
    if retention is None:
        return []
    now = now or utcnow()
    oldest_kept = kept_seqs(live_seq, cfg.keep_versions).start
    archived = []
    for e in lake.storage.list_dir(lake.layout.archive):
        m = ARCHIVE_NAME.match(e.name)
        # Only finished archives (the marker): a half-archived commit still has files in landing.
        if e.is_dir and m is not None and lake.is_archived(int(m.group(1))):
            commit = lake.read_commit(int(m.group(1)))
            archived.append((int(m.group(1)), commit.committed_at if commit else ""))
    removed = []
    for seq in expirable_archives(archived, oldest_kept, retention, now):
        # Exactly the archived copies its commit record names (and the directories that empties).
        commit = lake.read_commit(seq)
        d = posixpath.join(lake.layout.archive, f"c{seq:08d}")
        remove_named_files(
            lake, d, {posixpath.join(d, f["increment"], f["name"]) for f in (commit.files if commit else [])}
        )
        removed.append(f"archive/c{seq:08d}")
    # A re-ingested entry's events were landed again (and are compacted and archived from there):
    # its copy is an archive like the others. One still waiting is the only copy: it stays.
    cutoff = now - retention
    for entry in Quarantine(lake).entries():
        if entry.reingested_at and datetime.fromisoformat(entry.reingested_at) < cutoff:
            remove_quarantine_entry(lake, entry.path)
            removed.append(f"quarantine/{entry.id}")
    if removed:
        log.info("%s: past archive_retention (%s): removed %s", cfg.qualified_name, retention, removed)
    return removed


#: ``archive/c<seq>``: one commit's archived increments.
ARCHIVE_NAME = re.compile(r"^c(\d{8})$")


def _keep_only_outputs(rt: Runtime, version_dir: str, referenced: frozenset[str], dirs: list[str]) -> list[str]:
    """Of an old version kept for partitions of the mode's output ``dirs`` (snapshot: its history partitions):
    drop their other partitions, and its current table unless a kept commit names part of it.

    A version directory without any of ``dirs`` (every version of a mode without outputs of its
    own) is left to the caller as it was.
    """
    storage = rt.lake.storage
    listed = {e.name for e in storage.list_dir(version_dir)} if dirs else set()
    present = [d for d in dirs if d in listed or storage.exists(posixpath.join(version_dir, d))]
    if not present:
        return []
    removed = []
    for name in present:
        out_dir = posixpath.join(version_dir, name)
        for sub in storage.list_dir(out_dir):
            path = posixpath.join(out_dir, sub.name)
            if sub.is_dir and path not in referenced:
                remove_version_files(rt.lake, path)
                removed.append(f"{posixpath.basename(version_dir)}/{name}/{sub.name}")
    data = posixpath.join(version_dir, DATA_DIR)
    if not any(loc == data or loc.startswith(data + "/") for loc in referenced):
        for sub in storage.list_dir(version_dir):
            if sub.is_dir and sub.name == DATA_DIR:
                remove_version_files(rt.lake, data)
                removed.append(f"{posixpath.basename(version_dir)}/{DATA_DIR}")
    return removed


def sweep_temporaries(rt: Runtime, dirs: list[str], older_than: timedelta = timedelta(hours=1)) -> int:
    """Delete temporary files a killed writer left behind (hidden ``*.tmp`` / ``*.copying``)."""
    cutoff = utcnow().timestamp() - older_than.total_seconds()
    n = 0
    for d in dirs:
        for e in rt.lake.storage.list_dir(d):
            if not e.is_dir and e.name.startswith(".") and e.name.endswith((".tmp", ".copying")) and e.mtime < cutoff:
                rt.lake.storage.delete(e.path)
                n += 1
    return n
