"""The ``archive`` step: move a committed version's input files out of the landing area.

Copy, verify, delete -- only files of a committed version, and only what belonged to
them; then drop the emptied increments' partitions and give the table's lease back.
``plan`` calls :func:`archive_commit` first for a commit a crashed run left unarchived.
"""

from __future__ import annotations

import json
import logging
import posixpath
from datetime import timedelta
from typing import Any

from cdc_compaction.core.exceptions import ArchiveError
from cdc_compaction.core.lake import Commit, TableLease
from cdc_compaction.core.landing import is_data, markers
from cdc_compaction.integrations.metastore import Metastore, connect
from cdc_compaction.job.faults import fault_point
from cdc_compaction.pipeline.quarantine import Quarantine
from cdc_compaction.pipeline.retention import sweep_temporaries
from cdc_compaction.pipeline.runtime import Runtime, load_plan, not_compacting

log = logging.getLogger(__name__)


def archive_commit(rt: Runtime, ms: Metastore, commit: Commit) -> dict[str, Any]:
    """Move a committed version's input files to the archive: copy, verify, delete."""
    lake, st, cfg = rt.lake, rt.lake.storage, rt.cfg
    if commit.seq == 0 or lake.is_archived(commit.seq):
        return {"archived_files": 0}
    # A publish that died after its commit record never wrote the refused rows' manifest:
    # the next run's plan (which archives first) repairs it, so the quarantine lists them.
    Quarantine(lake).record_rows(commit.version, commit.seq, commit.stats)
    moved = 0
    table = cfg.qualified_name
    replaced = []
    listings: dict[str, dict[str, Any]] = {}
    for f in commit.files:
        src = f["path"]
        dst = posixpath.join(lake.layout.archive, f"c{commit.seq:08d}", f["increment"], f["name"])
        if _landed_again(st, listings, f):
            # Not the file the commit took: one landed again under its name (docs, "Re-landing increments").
            # It is the next run's input; only the commit's own landing of a file is archived and deleted.
            replaced.append(src)
            log.warning(
                "%s: %s was landed again after commit %d took it; the new landing stays pending (the next run "
                "compacts it)%s",
                table,
                src,
                commit.seq,
                "" if st.exists(dst) else f"; the committed bytes were replaced before {dst} was archived",
            )
            continue
        if st.exists(src):
            if not (st.exists(dst) and st.size(dst) == f["size"]):
                st.copy(src, dst)
                fault_point("archive.after_first_copy", table)
            if st.size(dst) != f["size"]:
                raise ArchiveError(
                    f"{cfg.qualified_name}: archived copy {dst} has {st.size(dst)} bytes, expected {f['size']}; "
                    f"the source {src} was kept. Check the archive storage and re-run"
                )
            st.delete(src)
            moved += 1
            fault_point("archive.after_first_delete", table)
        elif not (st.exists(dst) and st.size(dst) == f["size"]):
            raise ArchiveError(
                f"{cfg.qualified_name}: {src} of commit {commit.seq} is neither in the landing area nor archived "
                f"at {dst}. It was compacted, so the table is complete, but the archive is missing it; restore it "
                "from the source or remove it from the commit record to continue"
            )
    emptied = [inc for inc in commit.increments if _clear_increment(rt, commit, inc)]
    ms.drop_partitions(cfg.database, rt.names["incremental_table"], emptied)
    # A copy killed half-way leaves a hidden temporary beside its target: not an archived file.
    sweep_temporaries(
        rt,
        [posixpath.join(lake.layout.archive, f"c{commit.seq:08d}", inc) for inc in commit.increments],
        older_than=timedelta(0),
    )
    fault_point("archive.before_marker", table)
    marker: dict[str, Any] = {"seq": commit.seq, "files": len(commit.files)}
    if replaced:
        marker["landed_again"] = replaced
    st.write_text(lake.layout.archived_marker(commit.seq), json.dumps(marker))
    log.info(
        "%s: archived %d files of commit %d; dropped partitions %s", cfg.qualified_name, moved, commit.seq, emptied
    )
    return {"archived_files": moved, "dropped_partitions": emptied}


def _landed_again(st: Any, listings: dict[str, dict[str, Any]], f: dict[str, Any]) -> bool:
    """Whether the landing area holds another landing of commit file ``f`` than the one it took.

    Told by the storage's token (``landed`` in the record; records without it cannot tell: False).
    ``listings`` caches one listing per increment directory.
    """
    if not f.get("landed"):
        return False
    d = posixpath.dirname(f["path"])
    if d not in listings:
        listings[d] = {e.name: e for e in st.list_dir(d) if not e.is_dir}
    e = listings[d].get(posixpath.basename(f["path"]))
    return e is not None and bool(e.token) and (e.token, e.size) != (f["landed"], int(f["size"]))


def _clear_increment(rt: Runtime, commit: Commit, inc: str) -> bool:
    """After its planned files were archived: remove what belonged to them, and the directory if empty.

    Only three kinds of files are deleted here, by name, from one listing: checksums of the
    commit's files (``.<file>.crc``, ``<file>.crc``) and, when nothing else is left, the
    completion marker.  A writer's temporaries, files that landed after the plan (even
    between two listings) and anything unknown stay, and so does the directory.
    """
    st, cfg = rt.lake.storage, rt.cfg
    d = posixpath.join(rt.lake.layout.incremental, inc)
    planned = {f["name"] for f in commit.files if f["increment"] == inc}
    sums = {n for p in planned for n in (f".{p}.crc", f"{p}.crc")}
    entries = st.list_dir(d)
    checksums = [e for e in entries if not e.is_dir and e.name in sums]
    done = [e for e in entries if not e.is_dir and e.name in markers(cfg)]
    others = [e for e in entries if e not in checksums and e not in done]
    for e in checksums:
        st.delete(e.path)
    if others:
        # The marker stays too: it may be what makes the files that remain complete.  Data (by the
        # plan's own rule, whatever the name) is what the next run takes; the rest waits for a person.
        log.info(
            "%s: %s keeps %s, which commit %d did not take (data the next run takes: %s); the increment stays pending",
            cfg.qualified_name,
            d,
            sorted(e.name for e in others),
            commit.seq,
            sorted(e.name for e in others if not e.is_dir and is_data(cfg, e.name)),
        )
        return False
    for e in done:
        st.delete(e.path)
    # Not emptied if something landed meanwhile: it stays, and so does its partition.
    return st.remove_dir_if_empty(d) or not st.exists(d)


def archive(rt: Runtime, plan_path: str) -> dict[str, Any]:
    """Archive the increments of this run's commit (or of any commit not yet archived)."""
    p = load_plan(rt, plan_path)
    skipped = not_compacting(rt, p, "archive")
    if skipped is not None:
        return skipped
    commit = rt.lake.read_commit(p["seq"])
    if commit is None or commit.plan_id != p["plan_id"]:
        raise ArchiveError(
            f"{rt.cfg.qualified_name}: plan {p['plan_id']} was never committed, so its increments stay pending. "
            "Nothing is lost; the next run compacts them"
        )
    with connect(rt.metastore) as ms:
        result = archive_commit(rt, ms, commit)
    # The run's last write to the lake: the next run may start now.
    TableLease(rt.lake).release(p["owner"])
    return result
