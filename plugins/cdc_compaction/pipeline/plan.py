"""The ``plan`` step: take the table's lease, finish what a crashed run left, record the run's exact input.

The plan file names every input file (so a retry reads the same input), the version to
write and how to size its files; bad files are failed on or set aside per
``on_bad_file`` before anything is planned.  An empty result skips the rest of the run.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from cdc_compaction.core import policy, sql
from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.exceptions import BadInputError, CommitLogError, PlanError
from cdc_compaction.core.keyindex import live_index
from cdc_compaction.core.lake import Commit, Lake, PlannedFile, TableLease
from cdc_compaction.core.landing import as_dicts
from cdc_compaction.core.mode import mode_of
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.schema import Change, effective_config, evolve, load_state, save_state
from cdc_compaction.core.storage import is_data_file
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.job.faults import fault_point
from cdc_compaction.pipeline import metrics, views
from cdc_compaction.pipeline.archive import archive_commit
from cdc_compaction.pipeline.pending import in_place, pending_files, pending_load, report_landing
from cdc_compaction.pipeline.publish import sync_base_location
from cdc_compaction.pipeline.quarantine import Quarantine
from cdc_compaction.pipeline.runtime import Runtime, lease_owner, take_lease, utcnow
from cdc_compaction.pipeline.tables import check_storage_root

log = logging.getLogger(__name__)


def _plan_id(cfg: TableConfig, owner: str, seq: int) -> str:
    return hashlib.sha1(f"{cfg.qualified_name}|{owner}|{seq}".encode()).hexdigest()[:12]


def _partitioning(cfg: TableConfig) -> dict[str, str] | None:
    """The registry's partitioning as the job records it in its stats (None: unpartitioned)."""
    p = cfg.partition_by
    return {"column": p.column, "transform": p.transform} if p is not None else None


def _check_partitioning(rt: Runtime, latest: Commit) -> None:
    """Refuse to compact on top of a live version that was partitioned otherwise."""
    had, want = latest.stats.get("partition_by"), _partitioning(rt.cfg)
    if latest.seq > 0 and had != want:
        raise PlanError(
            f"{rt.cfg.qualified_name}: field 'partition_by' is {want} in the registry, but the live version "
            f"{latest.version} (commit {latest.seq}) was written with {had}. Changing partition_by is not "
            "automatic: put partition_by back, or reload the table under a new storage_root and table name "
            f"(see {doc_ref('partitioned', 'partitioned-tables')})"
        )


def set_aside_bad_files(rt: Runtime, plan_id: str, bad: list[tuple[PlannedFile, str]]) -> list[dict[str, Any]]:
    """Apply ``on_bad_file``: fail naming every file and reason, or move them to quarantine."""
    cfg = rt.cfg
    if not bad:
        return []
    listing = "; ".join(f"{f.path}: {reason}" for f, reason in bad)
    if cfg.on_bad_file == "fail":
        raise BadInputError(
            f"{cfg.qualified_name}: {len(bad)} landed file(s) cannot be compacted: {listing}. Nothing was "
            "compacted and nothing was moved. Fix the registry (new columns) or replace each file with a good "
            "copy, or move it out of the landing area (keep it for the source team); then clear the plan task. "
            "To set such files aside automatically, set on_bad_file: quarantine"
        )
    q = Quarantine(rt.lake)
    out = []
    for f, reason in bad:
        dst = q.set_aside_file(plan_id, f.increment, f.name, f.path, f.size, reason)
        out.append({"file": f.path, "quarantined_to": dst, "reason": reason})
    log.warning("%s: %d bad file(s) moved to quarantine: %s", cfg.qualified_name, len(bad), listing)
    return out


def input_fields(cfg: TableConfig) -> dict[str, str]:
    """The plan's keys for reading the landed files (registry ``format``, ``envelope`` and the
    connector's encodings); none for flattened Parquet, so such plans are as they always were."""
    if cfg.format == "parquet" and cfg.envelope == "flattened":
        return {}
    return {
        "input_format": cfg.format,
        "envelope": cfg.envelope,
        "decimal_handling": cfg.decimal_handling,
        "time_precision": cfg.time_precision,
    }


def summarise(changes: list[Change]) -> list[dict[str, Any]]:
    """One entry per (change, column): the first file showing it and how many files do."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for ch in changes:
        key = (ch.change, ch.column.lower())
        if key in out:
            out[key]["files"] += 1
        else:
            out[key] = {**ch.to_dict(), "files": 1}
    return list(out.values())


def follow_source(rt: Runtime, plan_id: str, changes: list[Change]) -> list[dict[str, Any]]:
    """Apply ``schema_changes: evolve`` to the tables; return what changed (or was ignored), for plan and alert.

    Added columns and widened types go into the lake's schema state first (a retry of this plan
    reads the same schema), then into the base, incremental and compactor tables and the views
    (``ensure_tables`` on the evolved columns); ``rt.cfg`` becomes the evolved table.  Columns
    the files lack are recorded as dropped once (they stay, NULL for new rows).  Under ``ignore``
    the ignored columns are reported; under ``fail`` nothing reaches here (they are bad files).
    """
    cfg, storage = rt.cfg, rt.lake.storage
    if cfg.schema_policy == "ignore":
        return summarise([c for c in changes if c.change == "ignored"])
    if cfg.schema_policy != "evolve":
        return []
    state = load_state(cfg, storage) or {}
    columns, applied = evolve(cfg.qualified_name, list(cfg.columns), changes)
    already = {d.lower() for d in state.get("dropped", [])}
    dropped = [c for c in changes if c.change == "dropped" and c.column.lower() not in already]
    counts = {(e["change"], e["column"].lower()): e["files"] for e in summarise(changes)}
    if applied or dropped:
        entries = [
            {**c.to_dict(), "files": counts.get((c.change, c.column.lower()), 1)}
            for c in [*applied, *summarise_dropped(dropped)]
        ]
        save_state(cfg, storage, columns, entries, plan_id)
    # This plan's changes as the state recorded them: the same on a retry that finds them applied.
    mine = [
        {k: v for k, v in h.items() if k != "plan_id"}
        for h in (load_state(cfg, storage) or {}).get("history", [])
        if h.get("plan_id") == plan_id
    ]
    if any(h["change"] in ("added", "widened") for h in mine):
        from cdc_compaction.pipeline.tables import ensure_tables

        log.warning("%s: the source changed its schema; applying %s", cfg.qualified_name, mine)
        rt.cfg = effective_config(cfg, storage)
        # Also on a retry (the state was saved, the DDL may not have run): unchanged tables cost no DDL.
        ensure_tables(rt)
    return mine


def summarise_dropped(changes: list[Change]) -> list[Change]:
    """The first file's change for each dropped column."""
    seen: dict[str, Change] = {}
    for ch in changes:
        seen.setdefault(ch.column.lower(), ch)
    return list(seen.values())


def output_sizing(rt: Runtime, latest: Commit, files: list[PlannedFile]) -> dict[str, int]:
    """How the job cuts its output into files of about ``spark.target_file_mb``.

    Estimated from the input: the live version's bytes and rows plus the planned files'.
    ``output_files`` is what the job coalesces to (no shuffle; fewer, fuller files), and
    ``max_records_per_file`` caps a file at twice the target's rows (no giant files).
    """
    base_bytes = sum(
        e.size for e in rt.lake.storage.list_dir(rt.lake.data_location(latest)) if not e.is_dir and is_data_file(e.name)
    )
    rows = int(latest.stats.get("output_rows", 0)) + sum(f.rows for f in files)
    size = base_bytes + sum(f.size for f in files)
    return sizing(size, rows, rt.cfg.spark.target_file_mb * 2**20)


def sizing(size: int, rows: int, target: int) -> dict[str, int]:
    """The output's cut for ``size`` input bytes holding ``rows`` rows, at ``target`` bytes a file.

    ``ceil(size / target)`` files, each capped at the rows that fit in twice the target at the
    input's bytes per row.  Without rows or bytes to go by: one file, no cap (0).
    """
    if not rows or not size:
        return {"output_files": 1, "max_records_per_file": 0}
    return {"output_files": max(1, -(-size // target)), "max_records_per_file": max(1, 2 * target * rows // size)}


def plan(
    rt: Runtime,
    run_id: str,
    now: datetime | None = None,
    on_quarantined: Callable[[list[dict[str, Any]]], None] | None = None,
    on_ignored: Callable[[list[dict[str, Any]]], None] | None = None,
    on_stalled: Callable[[list[dict[str, Any]]], None] | None = None,
    on_schema_changed: Callable[[list[dict[str, Any]]], None] | None = None,
    force: bool = False,
) -> str:
    """Record the exact input of this run; return the plan file path, or '' if nothing is pending.

    The plan records whether the run compacts (``compaction.policy``; ``force`` compacts regardless):
    a plan that does not compact makes the steps up to ``archive`` skip, ``refresh_view`` still runs.

    ``on_quarantined`` is called with the bad files set aside (``on_bad_file: quarantine``),
    ``on_ignored`` with landed entries the run will never take and ``on_stalled`` with
    increments waiting longer than ``increments.alert_after``, each only with those not
    alerted about yet (see :func:`report_landing`; their failure is only logged).
    ``on_schema_changed`` is called with the schema changes this plan applied (``schema_changes:
    evolve``) or columns it ignored (``ignore``), see :func:`follow_source`.
    """
    now = now or utcnow()
    cfg, lake = rt.cfg, rt.lake
    from cdc_compaction.core.deployment import register as register_deployment

    owner = lease_owner(run_id)
    # Before anything else: one run per table at a time, across deployments sharing the lake, and
    # never two deployments under one name (their leases would not keep each other out).
    register_deployment(lake)
    take_lease(rt, owner, now)
    try:
        return _plan_under_lease(
            rt, run_id, owner, now, on_quarantined, on_ignored, on_stalled, on_schema_changed, force
        )
    except Exception:
        # A plan that failed before recording its input has nothing in flight: let other runs go.
        try:
            if not lake.storage.exists(lake.layout.plan_path(_plan_id(cfg, owner, _next_seq(lake)))):
                TableLease(lake).release(owner)
        except Exception:  # the plan's own error is the one to report; the lease then expires
            log.exception("%s: could not give the lease back after the failed plan", cfg.qualified_name)
        raise


def _next_seq(lake: Lake) -> int:
    """The commit a plan of this run would be for, even when a damaged record makes the log unreadable.

    A plan refused for a damaged commit record recorded nothing, and must give its lease back: else
    the next run, once the record is restored, is refused for hours as if a live run held the table.
    The plan this run could have recorded is for the commit after every record there.
    """
    try:
        return lake.latest_commit().seq + 1
    except CommitLogError:
        return max(lake.commit_seqs(), default=0) + 1


def _plan_under_lease(
    rt: Runtime,
    run_id: str,
    owner: str,
    now: datetime,
    on_quarantined: Callable[[list[dict[str, Any]]], None] | None,
    on_ignored: Callable[[list[dict[str, Any]]], None] | None = None,
    on_stalled: Callable[[list[dict[str, Any]]], None] | None = None,
    on_schema_changed: Callable[[list[dict[str, Any]]], None] | None = None,
    force: bool = False,
) -> str:
    cfg, lake = rt.cfg, rt.lake
    with connect(rt.metastore) as ms:
        check_storage_root(rt, ms)
        latest = lake.latest_commit()
        _check_partitioning(rt, latest)
        # Roll forward whatever a crashed earlier run left half-done.
        sync_base_location(rt, ms, latest)
        if not lake.is_archived(latest.seq):
            log.info("%s: finishing the archive of commit %d first", cfg.qualified_name, latest.seq)
            archive_commit(rt, ms, latest)
        seq = latest.seq + 1
        plan_id = _plan_id(cfg, owner, seq)
        path = lake.layout.plan_path(plan_id)
        if lake.storage.exists(path):
            log.info("%s: reusing plan %s of this run (retry)", cfg.qualified_name, plan_id)
            if policy.deferred(json.loads(lake.storage.read_text(path))) is not None:
                # The plan compacts nothing: no step after it writes to the lake, so nothing holds the table.
                TableLease(lake).release(owner)
            return path
        committed = in_place(lake, latest)
        pending = pending_files(rt, now, committed)
        files = pending.files
        # Before a bad file can fail the plan: the view must keep answering without it.
        views.sync(rt, ms, pending, latest, drop_gone=False)
        report_landing(rt, pending, on_ignored, on_stalled)
        quarantined = set_aside_bad_files(rt, plan_id, pending.bad)
        if quarantined and on_quarantined is not None:
            on_quarantined(quarantined)
    if not files:
        log.info("%s: nothing to compact", cfg.qualified_name)
        TableLease(lake).release(owner)
        return ""
    schema_changes = follow_source(rt, plan_id, pending.changes)
    cfg = rt.cfg  # with the columns the source added or widened
    # Columns ignored by the parent commit too were alerted about then: say it once, not every run.
    before = {c["column"].lower() for c in (latest.schema or {}).get("changes", []) if c["change"] == "ignored"}
    news = [c for c in schema_changes if c["change"] != "ignored" or c["column"].lower() not in before]
    if news and on_schema_changed is not None:
        try:
            on_schema_changed(news)
        except Exception:  # a side channel never decides the data: the change is in the plan either way
            log.exception("%s: the schema change alert failed", cfg.qualified_name)
    decision = policy.decide(cfg.compaction, pending_load(cfg, latest, files), now, force=force)
    version = f"v{seq:08d}-{plan_id}"
    rule = sql.rule_sql(cfg)
    doc = {
        "plan_id": plan_id,
        "run_id": run_id,
        "owner": owner,
        "table": cfg.qualified_name,
        "seq": seq,
        "parent_seq": latest.seq,
        "parent_version": latest.version,
        "base_rows": int(latest.stats.get("output_rows", 0)),
        "version": version,
        # Layout 2 (README, "Crash safety"): the live visible rows and, apart, its tombstones;
        # a live version of layout 1 holds both in base_location.
        "base_layout": latest.layout,
        "base_location": lake.data_location(latest),
        "base_tombstones_location": lake.layout.tombstones_dir(latest.version, latest.layout),
        "base_tombstones": int(latest.stats.get("output_tombstones", 0)),
        # Each attempt of the job writes <output_location>-<attempt> (never into a committed version).
        "output_location": lake.layout.version_dir(version),
        "quarantine_location": lake.layout.quarantine_dir(version),
        # The job checks it first: a plan that was committed already is not compacted again.
        "commit_path": lake.layout.commit_path(seq),
        "files": [f.to_dict() for f in files],
        "quarantined_files": quarantined,
        # What the run saw but did not take (README, "Bad input and the quarantine").
        "ignored_landing": as_dicts(pending.ignored),
        "waiting_increments": pending.waiting,
        "stalled_increments": pending.stalled,
        "increments": sorted({f.increment for f in files}),
        "ingested_at": now.isoformat(),
        "tombstone_cutoff": (now - cfg.tombstone_retention).isoformat(),
        "column_names": cfg.column_names,
        # The effective (registry + evolved) columns this plan reads with, and what changed (README, "Schema changes").
        "columns": [{"name": c.name, "type": c.type} for c in cfg.columns],
        "schema_changes": schema_changes,
        # The mode's own entries (cdc: primary_key, order_by; keyless: order_by, data and before columns).
        "mode": cfg.mode,
        **mode_of(cfg).plan_fields(cfg, latest),
        **mode_of(cfg).plan_increments(cfg, sorted({f.increment for f in files})),
        "schema_ddl": sql.spark_schema_ddl(cfg),
        # How the job decodes the files (docs/concepts.md#input-formats); flattened Parquet plans read as before.
        **input_fields(cfg),
        # The Parquet type of the timestamps the job writes (docs/formats.md#int96-timestamps).
        "parquet_timestamps": cfg.parquet_timestamps,
        "rule": rule.to_dict(),
        "planned_at": now.isoformat(),
        **output_sizing(rt, latest, files),
        # Whether this run compacts (README, "Compaction policy"); if not, the steps up to archive skip.
        policy.PLAN_KEY: decision.to_dict(),
    }
    if mode_of(cfg).has_change_feed and cfg.change_feed:
        # The job writes the commit's change beside the version (README, "Change feed"): publish copies it.
        doc["change_feed"] = True
    part = sql.partition_sql(cfg)
    if part is not None:
        # The job reads and rewrites only the partitions the increments touch (README, "Partitioned tables").
        doc["partition_by"] = part.to_dict()
        doc["base_partitions"] = latest.partitions or {}
        # Where each base partition's keys are, so the job reads no partition's keys (README, "Key index").
        doc["base_index"] = live_index(lake, latest)
    lake.storage.write_text(path, json.dumps(doc, indent=1, sort_keys=True))
    fault_point("plan.after_plan_written", cfg.qualified_name)
    if not decision.compact:
        # The increments stay pending (registered in the views above); nothing is in flight.
        TableLease(lake).release(owner)
        log.info("%s: planned %s without compaction: %s", cfg.qualified_name, plan_id, decision.reason)
        metrics.count_skipped(cfg)
        return path
    log.info(
        "%s: planned %s: %d files from %d increments on top of %s",
        cfg.qualified_name,
        plan_id,
        len(files),
        len(doc["increments"]),
        latest.version,
    )
    return path
