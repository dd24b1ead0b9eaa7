"""The ``publish`` step: commit the validated version, then make it live.

The commit record is the one atomic decision (create-if-absent); after it the metastore
location (or partition map) of the base table, then the tombstones table, then the partitions
of the mode's own tables (``TableMode.extra_tables``: a snapshot table's history), then the
pointer roll forward to the newest commit --
idempotent, never backwards, so a retry or the next run's ``plan`` finishes what a crash
left (README, "Crash safety").
:func:`check_storage_root` refuses a storage root that moved without its data.
"""

from __future__ import annotations

import logging
import posixpath
from datetime import datetime
from typing import Any

from cdc_compaction.core.exceptions import (
    CommitLogError,
    ConcurrentCommitError,
    PublishValidationError,
)
from cdc_compaction.core.keyindex import live_index
from cdc_compaction.core.lake import Commit, version_dir_of
from cdc_compaction.core.mode import mode_named, mode_of
from cdc_compaction.integrations.metastore import Metastore, connect
from cdc_compaction.job.contract import STATS_FILE
from cdc_compaction.job.faults import fault_point
from cdc_compaction.pipeline import changes, formats, metrics, slo, views
from cdc_compaction.pipeline.pending import in_place, pending_files
from cdc_compaction.pipeline.quarantine import Quarantine
from cdc_compaction.pipeline.retention import cleanup_versions
from cdc_compaction.pipeline.runtime import (
    Runtime,
    load_plan,
    not_compacting,
    read_json,
    take_lease,
    utcnow,
    version_seq,
)

log = logging.getLogger(__name__)


def sync_base_location(rt: Runtime, ms: Metastore, commit: Commit) -> None:
    """Roll the metastore and the pointer forward to ``commit`` (idempotent, never backwards)."""
    if rt.cfg.partition_by is not None:
        _sync_base_partitions(rt, ms, commit)
        return
    db, base = rt.cfg.database, rt.names["base_table"]
    target = rt.lake.data_location(commit)
    current = ms.table_location(db, base)
    if current is not None:
        seq = version_seq(current)
        # A slow retry of an older commit must not move readers back to an older version.
        if seq is not None and seq > commit.seq and posixpath.dirname(version_dir_of(current)) == rt.lake.layout.base:
            _check_log_reaches(rt, seq, current)
            log.warning(
                "%s: base is at %s, newer than commit %d; left alone", rt.cfg.qualified_name, current, commit.seq
            )
        else:
            ms.set_location(db, base, target)
            fault_point("publish.after_metastore_swap", rt.cfg.qualified_name)
            _sync_tombstones(rt, ms, commit)
    # After the base: a reader of a mode's table (the history) never sees what the current table does not hold yet.
    _sync_extra_tables(rt, ms, commit)
    # No pointer is needed before the first commit; after it, it only ever moves forward.
    if commit.seq > 0:
        rt.lake.advance_pointer(commit)


def _sync_tombstones(rt: Runtime, ms: Metastore, commit: Commit) -> None:
    """Move the tombstones table to ``commit``'s tombstones, after the base moved (never before).

    In that order every moment shows readers of the view a correct state: the new visible rows
    with the old tombstones still hide what the commit deleted, and the commit's increments
    stay registered until they are archived (README, "Crash safety").
    """
    db, tomb = rt.cfg.database, rt.names["tombstones_table"]
    if ms.get_table(db, tomb) is None:
        return  # created by ensure_tables, at the live tombstones
    current = ms.table_location(db, tomb)
    seq = version_seq(current)
    if seq is not None and seq > commit.seq and posixpath.dirname(version_dir_of(current or "")) == rt.lake.layout.base:
        return  # newer already: never backwards
    ms.set_location(db, tomb, rt.lake.tombstones_location(commit))


def _sync_extra_tables(rt: Runtime, ms: Metastore, commit: Commit) -> None:
    """Register the partitions ``commit``'s outputs name in the mode's own tables (idempotent).

    A snapshot table's ``<t>_history``: partitions are added (or moved, when the storage root
    moved), never dropped: a date's partition stays where the version that applied it wrote it,
    and every later commit names it at that same location, so a slow retry of an older commit
    registers nothing a newer one lacks.
    """
    for x in mode_of(rt.cfg).extra_tables(rt.cfg):
        partitions = (commit.outputs or {}).get(x.partitions_key) if x.partitions_key else None
        if not partitions:
            continue
        if ms.get_table(rt.cfg.database, x.name) is None:
            continue  # created by ensure_tables; the next publish or plan registers the partitions
        changed = ms.set_partitions(rt.cfg.database, x.name, partitions)
        if changed["added"] or changed["moved"]:
            log.info("%s: %s partitions %s", rt.cfg.qualified_name, x.name, changed)


def _sync_base_partitions(rt: Runtime, ms: Metastore, commit: Commit) -> None:
    """The partitioned form of the swap: register ``commit``'s partition map (idempotent, never backwards).

    The table stays at ``base/``; its partitions point into version directories.  Partitions
    are added and moved first (a Thrift metastore moves them all in one ``alter_partitions``
    call), vanished ones are dropped last: a reader of the base table never misses a row, and
    a key that changed partition may show twice only until the moves are done.  The view is
    consistent throughout (README, "Partitioned tables").
    """
    cfg, lay = rt.cfg, rt.lake.layout
    db, base = cfg.database, rt.names["base_table"]
    registered = ms.partitions(db, base)
    seqs = [version_seq(loc) or 0 for loc in registered.values() if loc.startswith(lay.base + "/")]
    if max(seqs, default=0) > commit.seq:
        _check_log_reaches(rt, max(seqs), f"the partitions of {base}")
        # A slow retry of an older commit must not move readers back to an older version.
        log.warning("%s: base partitions come from a commit newer than %d; left alone", cfg.qualified_name, commit.seq)
    else:
        if ms.table_location(db, base) != lay.base:
            ms.set_location(db, base, lay.base)  # the storage root moved (or a table from before partitioning)
        wanted = commit.partitions or {}
        ms.set_partitions(db, base, wanted)
        ms.drop_partitions(db, base, sorted(set(registered) - set(wanted)))
        fault_point("publish.after_metastore_swap", cfg.qualified_name)
        _sync_tombstones(rt, ms, commit)
    if commit.seq > 0:
        rt.lake.advance_pointer(commit)


def _check_log_reaches(rt: Runtime, seq: int, shown: str) -> None:
    """Readers were shown commit ``seq`` (the metastore names it): its record must exist.

    Otherwise the commit log lost its newest records, and going on would publish on top
    of an older version and clean up the newer one: a silent rollback.
    """
    if rt.lake.read_commit(seq) is None:
        raise CommitLogError(
            f"{rt.cfg.qualified_name}: the metastore shows readers commit {seq} ({shown}), but the commit record "
            f"{rt.lake.layout.commit_path(seq)} does not exist: the commit log lost records. Nothing was changed. "
            "Restore the missing commit records (backups, object versioning) before running again"
        )


def publish(rt: Runtime, plan_path: str, now: datetime | None = None) -> dict[str, Any]:
    """Commit the validated version and make it live; safe to retry at any point."""
    cfg, lake = rt.cfg, rt.lake
    p = load_plan(rt, plan_path)
    skipped = not_compacting(rt, p, "publish")
    if skipped is not None:
        return skipped
    existing = lake.read_commit(p["seq"])
    if existing is None:
        # Renew the lease: a run that lost it (expired, taken over) must not commit.
        take_lease(rt, p["owner"], now)
        fault_point("publish.before_commit_record", cfg.qualified_name)
        latest = lake.latest_commit()
        if latest.seq != p["parent_seq"]:
            raise ConcurrentCommitError(
                f"{cfg.qualified_name}: plan {p['plan_id']} was made on commit {p['parent_seq']} but the table is "
                f"at commit {latest.seq} now; another run published first. Nothing was changed: re-run the DAG"
            )
        marker_path = lake.layout.validated_path(p["plan_id"])
        if not lake.storage.exists(marker_path):
            raise PublishValidationError(
                f"{cfg.qualified_name}: no attempt at plan {p['plan_id']} has passed validation ({marker_path} is "
                "missing). Nothing was published: clear the validate task (and compact, if it failed)"
            )
        marker = read_json(rt, marker_path)
        version = marker["version"]
        stats = read_json(rt, posixpath.join(lake.layout.version_dir(version), STATS_FILE))
        commit = Commit(
            seq=p["seq"],
            version=version,
            plan_id=p["plan_id"],
            run_id=p["run_id"],
            parent_seq=p["parent_seq"],
            files=p["files"],
            increments=p["increments"],
            stats={k: v for k, v in stats.items() if k != "output_files"},
            committed_at=(now or utcnow()).isoformat(),
            layout=int(stats["layout"]),
            freshness=views.commit_freshness(latest, p["increments"], p["files"]),
            # Plans made before the field existed have no columns to record.
            schema={"columns": p["columns"], "changes": p.get("schema_changes", [])} if "columns" in p else None,
        )
        if p.get("partition_by"):
            commit.partitions, commit.partition_rows = next_partitions(latest, stats)
            commit.index = next_index(live_index(lake, latest), stats, commit.partitions)
        # The mode's own entries (snapshot: its history partitions so far), from the job's stats.
        commit.outputs = mode_named(p.get("mode")).commit_outputs(cfg, latest, stats)
        commit.metrics = _commit_metrics(rt, commit, p, marker)
        # The one atomic decision: create-if-absent of the commit record.
        if lake.try_commit(commit):
            log.info("%s: committed %s as commit %d", cfg.qualified_name, commit.version, commit.seq)
            fault_point("publish.after_commit_record", cfg.qualified_name)
        existing = lake.read_commit(commit.seq)
    assert existing is not None
    if existing.plan_id != p["plan_id"]:
        raise ConcurrentCommitError(
            f"{cfg.qualified_name}: commit {existing.seq} was taken by plan {existing.plan_id} "
            f"(run {existing.run_id}); this run's plan {p['plan_id']} is discarded. "
            "Nothing was changed: re-run the DAG"
        )
    with connect(rt.metastore) as ms:
        # Roll forward to the newest commit: normally this one, after a slow retry a later one.
        live = lake.latest_commit()
        sync_base_location(rt, ms, live)
        fault_point("publish.after_pointer", cfg.qualified_name)
        # The views stop reading the increments the base now holds (before archive deletes them):
        # every engine, DuckDB too, then reads each event once.
        committed = in_place(rt.lake, live)
        shown = views.sync(rt, ms, pending_files(rt, utcnow(), committed), live, drop_gone=True)
        # Before retention deletes the parent's version: the feed is computed from both (never raises).
        feed = changes.sync_changes(rt, ms, live.seq)
    # Delta/Iceberg metadata over the new version, before retention expires the old (derived: never raises).
    table_formats = formats.sync_formats(rt, live.seq)
    Quarantine(lake).record_rows(existing.version, existing.seq, existing.stats)
    removed = cleanup_versions(rt, existing.seq)
    st = existing.stats or {}
    return {
        "seq": existing.seq,
        "parent_seq": existing.parent_seq,
        "version": existing.version,
        "removed_versions": removed,
        "schema_changes": (existing.schema or {}).get("changes", []),
        "freshness": {"base": existing.freshness or {}, "view": shown["freshness"]},
        # The job's counts for this commit (its stats file), for the asset event and the task's XCom.
        "rows": {
            "base_in": st.get("base_rows"),
            "increments_in": st.get("increment_rows"),
            "rejected": st.get("rejected_rows"),
            "out": st.get("output_visible_rows"),
            "tombstones_out": st.get("output_tombstones"),
            # JSON/Avro input: tombstones, heartbeats, transaction records read and skipped
            # (docs/concepts.md#input-formats).
            **({"skipped": st["skipped_records"]} if "skipped_records" in st else {}),
        },
        "metrics": existing.metrics or {},
        "changes": feed,
        "formats": table_formats,
        "slo": observe(rt, existing, now),
    }


def asset_event_extra(table: str, published: dict[str, Any]) -> dict[str, Any]:
    """The ``extra`` of the base asset's event: what a downstream DAG scheduled on it may read.

    Flat keys and JSON values (Airflow stores the extra as JSON): the registry table, the commit
    number and version this run published, rows in (the parent version's rows and the change
    events read, of which ``rows_rejected`` were refused) and out (visible rows, tombstones),
    and what the base holds at the newest (``freshness``: increment and source event time).
    ``from_version``/``to_version`` are the commit range this run made (parent -> new): a downstream
    reads exactly what changed with ``cdc-compaction changes --from F --to T`` (README,
    "Change feed").
    """
    rows = published.get("rows") or {}
    return {
        "table": table,
        "commit": published["seq"],
        "version": published["version"],
        "from_version": published.get("parent_seq", published["seq"] - 1),
        "to_version": published["seq"],
        "base_rows_in": rows.get("base_in"),
        "rows_in": rows.get("increments_in"),
        "rows_rejected": rows.get("rejected"),
        "rows_out": rows.get("out"),
        "tombstones_out": rows.get("tombstones_out"),
        "freshness": dict((published.get("freshness") or {}).get("base") or {}),
    }


def _commit_metrics(rt: Runtime, commit: Commit, plan: dict[str, Any], marker: dict[str, Any]) -> dict[str, Any] | None:
    """The commit's numbers (``metrics.commit_metrics``), or None if they cannot be had: never fatal."""
    try:
        waiting = [str(w.get("increment", "")) for w in plan.get("waiting_increments") or []]
        return metrics.commit_metrics(
            rt.cfg, commit, planned_at=plan.get("planned_at"), validated_at=marker.get("validated_at"), landed=waiting
        )
    except Exception:
        log.exception(
            "%s: could not compute the metrics of commit %d; committing without", rt.cfg.qualified_name, commit.seq
        )
        metrics.EMIT_FAILURES[rt.cfg.qualified_name] += 1
        return None


def observe(rt: Runtime, commit: Commit, now: datetime | None = None) -> dict[str, Any]:
    """After a publish: check the table's SLO (alerting once per breach) and emit the commit's metrics.

    Side channels: whatever fails is logged and counted, and publishing goes on.
    """
    result = slo.check_quietly(rt.cfg, rt.lake, now or utcnow())
    # A retry of a publish emits the commit's counts again: counters over-count rather than miss one.
    metrics.emit(rt.cfg, commit.metrics or {}, result)
    return result


def next_partitions(parent: Commit, stats: dict[str, Any]) -> tuple[dict[str, str], dict[str, int]]:
    """The new version's partitions: rewritten ones in its own directory, untouched ones where they were.

    A touched partition the job wrote nothing for (every row moved away or expired) is gone.
    """
    touched = set(stats["partitions_touched"])
    parts = {v: loc for v, loc in (parent.partitions or {}).items() if v not in touched}
    rows = {v: n for v, n in (parent.partition_rows or {}).items() if v not in touched}
    parts.update(stats["partitions"])
    rows.update(stats["partition_rows"])
    return dict(sorted(parts.items())), dict(sorted(rows.items()))


def next_index(parent: dict[str, str], stats: dict[str, Any], partitions: dict[str, str]) -> dict[str, str] | None:
    """The new version's key index: rewritten partitions' in its own directory, untouched ones' where they were.

    ``parent`` is the live version's index (:func:`~cdc_compaction.core.keyindex.live_index`).
    Like the data, an untouched partition keeps the index of the version that wrote it. A
    partition without one (the parent's had none) stays without: the job reads its key columns.
    None when the job wrote no index (a job from before the key index).
    """
    if stats.get("index") is None:
        return None
    touched = set(stats["partitions_touched"])
    index = {v: loc for v, loc in parent.items() if v not in touched and v in partitions}
    index.update(stats["index"])
    return dict(sorted(index.items()))
