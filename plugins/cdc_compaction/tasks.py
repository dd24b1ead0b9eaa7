"""The steps of one compaction run, as plain functions.

The DAG wraps each of them in a task; the in-process conformance runner calls them
in the same order.  Each step is idempotent and safe to retry:

* ``plan`` records the exact input files, so a retry reads the same input;
* ``compact`` writes a new version directory beside the live one (never over it);
* ``validate`` checks that version before anything is published;
* ``publish`` creates the commit record (the one atomic decision), then moves the
  metastore location and the pointer; a retry rolls forward, never applies twice;
* ``archive`` copies, verifies, then deletes -- only files of a committed version;
* ``refresh_view`` registers pending increments and keeps the views current.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

from cdc_compaction import sql, views
from cdc_compaction.engine import Engine
from cdc_compaction.exceptions import (
    ArchiveError,
    BadInputError,
    CommitLogError,
    CompactionError,
    ConcurrentCommitError,
    PlanError,
    PublishValidationError,
    SchemaChangeError,
    StorageRootMismatchError,
)
from cdc_compaction.identifiers import normalize_hive_type
from cdc_compaction.inputs import check_file, hive_widening, parquet_footer
from cdc_compaction.job.faults import fault_point
from cdc_compaction.lake import (
    DATA_DIR,
    EMPTY_VERSION,
    LAYOUT,
    TOMBSTONES_DIR,
    Commit,
    Lake,
    PlannedFile,
    TableLease,
    deployment_id,
    version_dir_of,
)
from cdc_compaction.landing import (
    Ignored,
    as_dicts,
    classify_increment,
    increment_hour,
    landing_report_path,
    markers,
    scan_landing,
    view_report_path,
)
from cdc_compaction.metastore import Metastore, connect
from cdc_compaction.modes import mode_of
from cdc_compaction.quarantine import Quarantine
from cdc_compaction.registry import TableConfig
from cdc_compaction.settings import MetastoreEndpoint
from cdc_compaction.storage import Storage, is_data_file

log = logging.getLogger(__name__)

META_COLUMNS = ["_cdc_increment", "_cdc_file", "_cdc_pos", "_cdc_ingested_at"]
STATS_FILE = "_cdc_stats.json"
#: The hidden partition column of a partitioned base table (the job's ``PARTITION_COLUMN``).
PARTITION_COLUMN = "_cdc_partition"
#: ``v<seq>-<plan>`` or, since every compaction attempt writes its own directory, ``v<seq>-<plan>-<attempt>``.
_VERSION = re.compile(r"^v(\d{8})-([0-9a-z]+(?:-[0-9a-z]+)?)$")


@dataclass
class Runtime:
    """Everything a step needs: the table, its lake, the metastore and a Spark engine."""

    cfg: TableConfig
    lake: Lake
    metastore: MetastoreEndpoint
    engine: Engine

    @property
    def names(self) -> dict[str, str]:
        return sql.table_names(self.cfg)


def utcnow() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------- helpers
def increment_dirs(rt: Runtime) -> dict[str, str]:
    """Increment name -> directory, for every increment directory of the landing area.

    Other entries of the landing directory are left out here; ``plan`` reports them
    (see :func:`pending_files`).
    """
    return scan_landing(rt.cfg, rt.lake.storage, rt.lake.layout.incremental)[0]


def _read_json(rt: Runtime, path: str) -> dict[str, Any]:
    return json.loads(rt.lake.storage.read_text(path))


def load_plan(rt: Runtime, plan_path: str) -> dict[str, Any]:
    if not plan_path or not rt.lake.storage.exists(plan_path):
        raise PlanError(f"{rt.cfg.qualified_name}: plan file {plan_path!r} does not exist; clear the run's plan task")
    return _read_json(rt, plan_path)


def version_seq(location: str | None) -> int | None:
    """The commit sequence number of the version a base location lies in (None for other locations).

    Takes a version directory, its ``data``/``tombstones`` or a partition directory in them.
    """
    m = _VERSION.match(posixpath.basename(version_dir_of(location or "")))
    return int(m.group(1)) if m else None


def _sync_base_location(rt: Runtime, ms: Metastore, commit: Commit) -> None:
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


def check_storage_root(rt: Runtime, ms: Metastore) -> None:
    """Refuse a ``storage_root`` that changed under a live table without its data moving along.

    The metastore names the live version (the table's location, or its partitions'); if
    that lies under another root, the registry's root must hold the same commit (the whole
    tree was copied there).  Otherwise the next run would publish a near-empty base.
    """
    cfg, lay = rt.cfg, rt.lake.layout
    db, base = cfg.database, rt.names["base_table"]
    location = ms.table_location(db, base)
    if location is None:
        return
    shown = list(ms.partitions(db, base).values()) if cfg.partition_by is not None else [location]
    for loc in shown:
        version_dir = version_dir_of(loc)
        seq = version_seq(version_dir)
        if not seq or posixpath.dirname(version_dir) == lay.base:
            continue
        here = rt.lake.read_commit(seq)
        if here is not None and here.version == posixpath.basename(version_dir):
            continue  # the whole tree moved: follow it
        raise StorageRootMismatchError(
            f"{cfg.qualified_name}: field 'storage_root' is {cfg.storage_root} ({lay.root}), but the metastore "
            f"serves {base} from {loc} (commit {seq}), and {lay.commits} has no record of that commit. Nothing "
            f"was changed. Put storage_root back, or move the data: copy the whole old table root (base/, "
            f"_cdc/, incremental/, archive/, quarantine/) to {lay.root}, then run again"
        )


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
            "(see README, 'Partitioned tables')"
        )


def lease_owner(run_id: str) -> str:
    """Who holds a table's lease during a run: this deployment and the Airflow run."""
    return f"{deployment_id()}/{run_id}"


def take_lease(rt: Runtime, owner: str, now: datetime | None = None) -> None:
    """Take or renew the table's lease for ``owner`` (see :class:`cdc_compaction.lake.TableLease`)."""
    TableLease(rt.lake).acquire(owner, rt.cfg.lease_timeout, now or utcnow())


# ---------------------------------------------------------------------- ensure tables
def _check_columns(rt: Runtime, table: str, existing: list[Any], extra: list[str]) -> tuple[list[Any], dict[str, str]]:
    """Registry columns missing from ``table`` and columns to widen (name -> new type).

    Refuse drops, renames and any type change that is not a widening.
    """
    registry = {c.name.lower(): c for c in rt.cfg.columns}
    have = {c.name.lower(): c for c in existing if c.name.lower() not in extra}
    gone = [c for c in have if c not in registry]
    if gone:
        raise SchemaChangeError(
            f"{rt.cfg.qualified_name}: table {table} has columns {gone} that the registry no longer lists. "
            "Dropping or renaming columns is not automatic: add them back to the registry, or migrate the "
            "table by hand (see README, 'Changing a schema')"
        )
    widen: dict[str, str] = {}
    for name, col in have.items():
        old, new = normalize_hive_type(col.type), normalize_hive_type(registry[name].type)
        if old == new:
            continue
        if not hive_widening(old, new):
            raise SchemaChangeError(
                f"{rt.cfg.qualified_name}: column {col.name!r} is {old} in table {table}, but the registry says "
                f"{new}. Changing a live column's type is only widening (int -> bigint, float -> double, "
                "decimal(p,s) -> a decimal holding every value of it, varchar/char -> string): put the type "
                "back, or migrate the table by hand (see README, 'Changing a schema')"
            )
        widen[col.name] = new
    return [c for name, c in registry.items() if name not in have], widen


def ensure_tables(rt: Runtime) -> dict[str, Any]:
    """Create the database and the base / incremental / compactor tables; add new columns."""
    cfg, lay, st = rt.cfg, rt.lake.layout, rt.lake.storage
    db, names = cfg.database, rt.names
    fingerprint = sql.schema_fingerprint(cfg)
    for d in (lay.data_dir(EMPTY_VERSION), str(lay.tombstones_dir(EMPTY_VERSION)), lay.incremental, lay.staging):
        st.makedirs(d)
    statements: list[str] = []
    with connect(rt.metastore) as ms:
        check_storage_root(rt, ms)
        latest = rt.lake.latest_commit()
        live = rt.lake.data_location(latest)
        tables = {
            names[role]: ms.get_table(db, names[role])
            for role in ("base_table", "tombstones_table", "incremental_table", "compactor_table")
        }
        widened: dict[str, dict[str, str]] = {}
        base_t = tables[names["base_table"]]
        want_keys = [PARTITION_COLUMN] if cfg.partition_by is not None else []
        if base_t is not None and [k.lower() for k in base_t.partition_keys] != want_keys:
            raise SchemaChangeError(
                f"{cfg.qualified_name}: table {names['base_table']} is partitioned by {base_t.partition_keys}, but "
                f"field 'partition_by' asks for {want_keys or 'no partitions'}. Changing partition_by is not "
                "automatic: put it back, or reload the table under a new storage_root and table name "
                "(see README, 'Partitioned tables')"
            )
        if any(t is None for t in tables.values()):
            # A partitioned base table stays at base/: its partitions point into the version directories.
            statements += sql.create_statements(
                cfg,
                base_location=lay.base if cfg.partition_by is not None else live,
                tombstones_location=rt.lake.tombstones_location(latest),
                incremental_location=lay.incremental,
                compactor_location=lay.staging,
            )
        for name, t in tables.items():
            if t is None or (t.parameters or {}).get("cdc.fingerprint") == fingerprint:
                continue
            extra = META_COLUMNS if name != names["incremental_table"] else ["_cdc_increment"]
            if name == names["tombstones_table"]:
                extra = [*META_COLUMNS, PARTITION_COLUMN]
            missing, widen = _check_columns(rt, name, list(t.sd.cols), extra)
            widened[name] = widen
            if missing:
                statements.append(sql.add_columns_statement(cfg, name, missing))
            statements.append(sql.set_fingerprint_statement(cfg, name))
        for name, widen in widened.items():
            if widen:
                # Spark SQL cannot change a column's type; the metastore can (Spark's schema too).
                log.warning("%s: widening %s of %s", cfg.qualified_name, widen, name)
                ms.widen_columns(db, name, widen)
        # Stale Spark views go in the same submission: one JVM for all DDL of a run, not two.
        stale = views.stale(rt, ms)
        statements += views.spark_statements(rt, stale)
        if statements:
            log.info("%s: running %d DDL statements", cfg.qualified_name, len(statements))
            rt.engine.run_sql(cfg, statements)
        # Hive and Trino views go straight to the metastore (after the tables they read exist).
        views.put_other_views(rt, ms, stale)
        # The registry's storage root is the truth: follow it if it moved.
        inc_table = names["incremental_table"]
        if tables[inc_table] is not None and ms.table_location(db, inc_table) != lay.incremental:
            log.warning("%s: incremental table moves to %s", cfg.qualified_name, lay.incremental)
            ms.set_location(db, inc_table, lay.incremental)
            ms.drop_partitions(db, inc_table, list(ms.partitions(db, inc_table)))
    # Moving the base table to the live version is left to plan, which holds the lease.
    return {"ddl_statements": len(statements), "live_version": latest.version}


# ------------------------------------------------------------------------------ plan
def _plan_id(cfg: TableConfig, owner: str, seq: int) -> str:
    return hashlib.sha1(f"{cfg.qualified_name}|{owner}|{seq}".encode()).hexdigest()[:12]


@dataclass
class Pending:
    """What the landing area holds for a run: input to take, and everything it does not take yet."""

    #: Files of complete increments, not yet compacted, whose footers pass :func:`check_file`.
    files: list[PlannedFile] = field(default_factory=list)
    #: Files of complete increments that ``check_file`` refuses, with the reason.
    bad: list[tuple[PlannedFile, str]] = field(default_factory=list)
    #: Increments the view may show (registered as partitions of ``<t>_incremental``).
    dirs: dict[str, str] = field(default_factory=dict)
    #: Increments kept out of the view: a file the plan would refuse, or one Spark would read but no plan takes.
    held_back: list[dict[str, str]] = field(default_factory=list)
    #: Increments not complete yet, with the reason (current hour, no marker, not settled, a writer's temporaries).
    waiting: list[dict[str, str]] = field(default_factory=list)
    #: Waiting increments that have not changed for ``increments.alert_after`` (temporaries or no marker):
    #: they may wait forever, so they are reported and alerted about like ignored entries.
    stalled: list[dict[str, str]] = field(default_factory=list)
    #: Landed files and directories a run never takes, with the reason and what to do.
    ignored: list[Ignored] = field(default_factory=list)
    #: The readable data files of the increments in ``dirs`` (waiting ones too), minus excluded ones:
    #: what the views show besides the base.
    view_files: list[PlannedFile] = field(default_factory=list)


def pending_files(rt: Runtime, now: datetime, exclude: set[str]) -> Pending:
    """Complete increments' files not yet compacted, split into good and bad (with the reason).

    Every data file of every increment is checked with :func:`check_file` (footers only),
    waiting increments included: an increment holding a file the plan would refuse is kept
    out of the view, so that one unreadable file cannot break every query of it.
    """
    cfg, st = rt.cfg, rt.lake.storage
    inc = cfg.increments
    out = Pending()
    dirs, out.ignored = scan_landing(cfg, st, rt.lake.layout.incremental)
    for name, path in sorted(dirs.items()):
        listing = classify_increment(cfg, name, path, st.list_dir(path))
        out.ignored += listing.ignored
        data = listing.data
        hour = increment_hour(cfg, name)
        waits = fix = None
        if listing.in_progress:
            # A writer is still at work (or died): taking the increment now could miss its files,
            # and archive must never delete them (README, "Crash safety").
            waits = "holds a writer's temporaries " + ", ".join(sorted(e.name for e in listing.in_progress))
            fix = "if no writer is still at work, they were left by one that died: remove them"
        elif inc.wait_for_hour_end and hour is not None and hour + timedelta(hours=1) > now:
            waits = "is the current hour; it waits until the hour ends"
        elif inc.completion == "marker" and not listing.markers:
            waits = f"has no {inc.marker_file} marker yet"
            fix = f"check the sink; if the increment is complete, create {inc.marker_file} in it"
        elif data and inc.settle_seconds and max(e.mtime for e in data) > now.timestamp() - inc.settle_seconds:
            waits = f"changed within {inc.settle_seconds}s; waiting for it to settle"
        if waits is not None:
            log.info("%s: %s %s; not complete, not planned yet", cfg.qualified_name, path, waits)
            out.waiting.append({"increment": name, "path": path, "reason": waits})
            since = _waiting_since(hour, listing)
            if fix is not None and since is not None and now - since >= inc.alert_after:
                out.stalled.append(
                    {
                        "increment": name,
                        "path": path,
                        "waiting_since": since.isoformat(),
                        "reason": f"{waits}, unchanged since {since:%Y-%m-%d %H:%M} UTC (longer than "
                        f"increments.alert_after, {inc.alert_after}); it is not compacted until it is complete: "
                        f"{fix}",
                    }
                )
        refused = list(listing.unplanned_but_readable())
        shown: list[PlannedFile] = []
        for e in data:
            if f"{name}/{e.name}" in exclude:
                continue
            check = check_file(cfg, e.path, rt.lake.storage, e.size)
            f = PlannedFile(
                increment=name,
                name=e.name,
                path=e.path,
                size=e.size,
                rows=check.rows,
                ignored_columns=tuple(check.ignored_columns),
                missing_columns=tuple(check.missing_columns),
                newest_event=check.newest_event.isoformat() if check.newest_event else "",
            )
            if check.problem is not None:
                refused.append((e.path, check.problem))
                if waits is None:
                    out.bad.append((f, check.problem))
                continue
            shown.append(f)
            if waits is not None:
                continue
            if check.ignored_columns or check.missing_columns:
                log.warning(
                    "%s: %s: columns %s are not in the registry and are ignored; registry columns %s are "
                    "missing and read as NULL",
                    cfg.qualified_name,
                    e.path,
                    check.ignored_columns,
                    check.missing_columns,
                )
            out.files.append(f)
        if refused:
            out.held_back += [{"increment": name, "path": p, "reason": r} for p, r in refused]
        else:
            out.dirs[name] = path
            out.view_files += shown
    return out


def _waiting_since(hour: datetime | None, listing: Any) -> datetime | None:
    """Since when an increment has waited: the end of its hour or its last change, whichever is later."""
    entries = [*listing.data, *listing.markers, *listing.checksums, *listing.in_progress]
    times = [datetime.fromtimestamp(max(mtimes), UTC)] if (mtimes := [e.mtime for e in entries if e.mtime]) else []
    if hour is not None:
        times.append(hour + timedelta(hours=1))
    return max(times) if times else None


def report_landing(
    rt: Runtime,
    pending: Pending,
    on_ignored: Callable[[list[dict[str, Any]]], None] | None = None,
    on_stalled: Callable[[list[dict[str, Any]]], None] | None = None,
) -> None:
    """Log every landed entry the run does not take, record them, and alert about new ones.

    ``_cdc/landing.json`` holds the last plan's view of the landing area (ignored entries,
    waiting, stalled and held-back increments), also when nothing was planned.  ``on_ignored``
    is called with the ignored entries not alerted about before, ``on_stalled`` likewise with
    the stalled increments; an alert that cannot be delivered is logged and tried again by
    the next run, it never fails the plan.
    """
    cfg, st = rt.cfg, rt.lake.storage
    path = landing_report_path(rt.lake.layout.control)
    for i in pending.ignored:
        log.warning("%s: %s is not compacted: %s", cfg.qualified_name, i.path, i.reason)
    for s in pending.stalled:
        log.warning("%s: increment %s %s", cfg.qualified_name, s["path"], s["reason"])
    try:
        previous = json.loads(st.read_text(path))
        alerted = {(a["path"], a["reason"]) for a in previous.get("alerted", [])}
        alerted_stalled = {str(p) for p in previous.get("alerted_stalled", [])}
    except Exception:  # noqa: BLE001 - no report yet, or a torn one: alert about everything
        alerted, alerted_stalled = set(), set()
    # Once per increment (its reason names the time, so it is not the key); one that completed is forgotten.
    alerted_stalled &= {s["path"] for s in pending.stalled}
    new_stalled = [s for s in pending.stalled if s["path"] not in alerted_stalled]
    if new_stalled and on_stalled is not None:
        try:
            on_stalled(new_stalled)
            alerted_stalled |= {s["path"] for s in new_stalled}
        except Exception:  # an undeliverable alert must not stop the compaction
            log.exception(
                "%s: could not send the alert about %d stalled increments; the next run tries again",
                cfg.qualified_name,
                len(new_stalled),
            )
    now_ignored = {(i.path, i.reason) for i in pending.ignored}
    alerted &= now_ignored  # an entry that went and came back is new again
    new = [i.to_dict() for i in pending.ignored if (i.path, i.reason) not in alerted]
    if new and on_ignored is not None:
        try:
            on_ignored(new)
            alerted |= {(i["path"], i["reason"]) for i in new}
        except Exception:  # an undeliverable alert must not stop the compaction
            log.exception(
                "%s: could not send the alert about %d ignored landing entries; the next run tries again",
                cfg.qualified_name,
                len(new),
            )
    doc = {
        "table": cfg.qualified_name,
        "checked_at": utcnow().isoformat(),
        "ignored_landing": as_dicts(pending.ignored),
        "waiting_increments": pending.waiting,
        "stalled_increments": pending.stalled,
        "held_back_from_view": pending.held_back,
        "alerted": [{"path": p, "reason": r} for p, r in sorted(alerted)],
        "alerted_stalled": sorted(alerted_stalled),
    }
    st.write_text(path, json.dumps(doc, indent=1, sort_keys=True))


def sync_view_partitions(rt: Runtime, ms: Metastore, pending: Pending, drop_gone: bool = False) -> dict[str, list[str]]:
    """Register the increments the view may show; drop held-back ones (and, with ``drop_gone``, vanished ones)."""
    cfg, table = rt.cfg, rt.names["incremental_table"]
    held = {h["increment"] for h in pending.held_back}
    registered = ms.partitions(cfg.database, table)
    drop = sorted(v for v in registered if v in held or (drop_gone and v not in pending.dirs))
    dropped = ms.drop_partitions(cfg.database, table, drop)
    added = ms.add_partitions(cfg.database, table, pending.dirs)
    if pending.held_back:
        log.warning(
            "%s: increments %s are kept out of %s until fixed: %s. Replace or remove each file named (or let "
            "on_bad_file: quarantine set it aside); the rest of the view is unaffected",
            cfg.qualified_name,
            sorted(held),
            rt.names["view_name"],
            "; ".join(f"{h['path']}: {h['reason']}" for h in pending.held_back),
        )
    return {"added": added, "dropped": dropped}


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
    target = rt.cfg.spark.target_file_mb * 2**20
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
) -> str:
    """Record the exact input of this run; return the plan file path, or '' if nothing is pending.

    ``on_quarantined`` is called with the bad files set aside (``on_bad_file: quarantine``),
    ``on_ignored`` with landed entries the run will never take and ``on_stalled`` with
    increments waiting longer than ``increments.alert_after``, each only with those not
    alerted about yet (see :func:`report_landing`; their failure is only logged).
    """
    now = now or utcnow()
    cfg, lake = rt.cfg, rt.lake
    from cdc_compaction.deployment import register as register_deployment

    owner = lease_owner(run_id)
    # Before anything else: one run per table at a time, across deployments sharing the lake, and
    # never two deployments under one name (their leases would not keep each other out).
    register_deployment(lake)
    take_lease(rt, owner, now)
    try:
        return _plan_under_lease(rt, run_id, owner, now, on_quarantined, on_ignored, on_stalled)
    except Exception:
        # A plan that failed before recording its input has nothing in flight: let other runs go.
        try:
            if not lake.storage.exists(lake.layout.plan_path(_plan_id(cfg, owner, lake.latest_commit().seq + 1))):
                TableLease(lake).release(owner)
        except Exception:  # the plan's own error is the one to report; the lease then expires
            log.exception("%s: could not give the lease back after the failed plan", cfg.qualified_name)
        raise


def _plan_under_lease(
    rt: Runtime,
    run_id: str,
    owner: str,
    now: datetime,
    on_quarantined: Callable[[list[dict[str, Any]]], None] | None,
    on_ignored: Callable[[list[dict[str, Any]]], None] | None = None,
    on_stalled: Callable[[list[dict[str, Any]]], None] | None = None,
) -> str:
    cfg, lake = rt.cfg, rt.lake
    with connect(rt.metastore) as ms:
        check_storage_root(rt, ms)
        latest = lake.latest_commit()
        _check_partitioning(rt, latest)
        # Roll forward whatever a crashed earlier run left half-done.
        _sync_base_location(rt, ms, latest)
        if not lake.is_archived(latest.seq):
            log.info("%s: finishing the archive of commit %d first", cfg.qualified_name, latest.seq)
            archive_commit(rt, ms, latest)
        seq = latest.seq + 1
        plan_id = _plan_id(cfg, owner, seq)
        path = lake.layout.plan_path(plan_id)
        if lake.storage.exists(path):
            log.info("%s: reusing plan %s of this run (retry)", cfg.qualified_name, plan_id)
            return path
        committed = {f"{f['increment']}/{f['name']}" for f in latest.files}
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
        # The mode's own entries (cdc: primary_key, order_by; keyless: order_by, data and before columns).
        "mode": cfg.mode,
        **mode_of(cfg).plan_fields(cfg, latest.stats),
        "schema_ddl": sql.spark_schema_ddl(cfg),
        "rule": rule.to_dict(),
        "planned_at": now.isoformat(),
        **output_sizing(rt, latest, files),
    }
    part = sql.partition_sql(cfg)
    if part is not None:
        # The job reads and rewrites only the partitions the increments touch (README, "Partitioned tables").
        doc["partition_by"] = part.to_dict()
        doc["base_partitions"] = latest.partitions or {}
    lake.storage.write_text(path, json.dumps(doc, indent=1, sort_keys=True))
    fault_point("plan.after_plan_written", cfg.qualified_name)
    log.info(
        "%s: planned %s: %d files from %d increments on top of %s",
        cfg.qualified_name,
        plan_id,
        len(files),
        len(doc["increments"]),
        latest.version,
    )
    return path


# -------------------------------------------------------------------------- validate
_ARROW_TYPES = {
    "tinyint": "int8",
    "smallint": "int16",
    "int": "int32",
    "bigint": "int64",
    "float": "float",
    "double": "double",
    "string": "string",
    "boolean": "bool",
    "date": "date32[day]",
    "binary": "binary",
}


def _arrow_type_ok(hive_type: str, arrow_type: str) -> bool:
    if hive_type in _ARROW_TYPES:
        return _ARROW_TYPES[hive_type] == arrow_type
    if hive_type == "timestamp":
        return arrow_type.startswith("timestamp")
    if hive_type.startswith("decimal"):
        return arrow_type.startswith("decimal")
    if hive_type.startswith(("varchar", "char")):
        return arrow_type == "string"
    return False


def _footer(storage: Storage, path: str) -> tuple[int, Any]:
    meta = parquet_footer(storage, path)
    return meta.num_rows, meta.schema.to_arrow_schema()


_PARTITION_DIR = f"{PARTITION_COLUMN}="


def _partition_dir_value(name: str) -> str | None:
    """The value of a partition directory Spark's ``partitionBy`` wrote (``_cdc_partition=a%3Ab`` -> ``a:b``)."""
    return unquote(name[len(_PARTITION_DIR) :]) if name.startswith(_PARTITION_DIR) else None


def _output_files(storage: Storage, out: str) -> tuple[dict[str, int], list[str]]:
    """A layout-2 version directory's files: (data files by ``data/…``/``tombstones/…`` name, anything else).

    Partition directories' files are named ``data/<dir>/<file>``.  Anything else inside
    ``data/`` or ``tombstones/`` (a ``_SUCCESS`` marker, ``.crc`` checksums, a stray
    directory) is returned apart: a reader's glob of the location would pick it up.
    """
    files: dict[str, int] = {}
    other: list[str] = []

    def walk(path: str, rel: str, partitions: bool) -> None:
        for e in storage.list_dir(path):
            name = f"{rel}/{e.name}"
            if not e.is_dir and is_data_file(e.name):
                files[name] = e.size
            elif e.is_dir and partitions and _partition_dir_value(e.name) is not None:
                walk(e.path, name, False)
            else:
                other.append(name + ("/" if e.is_dir else ""))

    walk(posixpath.join(out, DATA_DIR), DATA_DIR, True)
    walk(posixpath.join(out, TOMBSTONES_DIR), TOMBSTONES_DIR, False)
    return files, other


def _partition_problems(p: dict[str, Any], stats: dict[str, Any], parent: Commit | None, out: str) -> list[str]:
    """A partitioned compaction's own checks: it read whole partitions and wrote only touched ones."""
    problems = []
    touched = set(stats.get("partitions_touched", []))
    parent_map = p.get("base_partitions") or {}
    parent_rows = sum(int(((parent.partition_rows if parent else None) or {}).get(v, 0)) for v in touched)
    # Layout 2 keeps a partitioned table's tombstones apart, and the job ranks all of them.
    if parent is not None and parent.layout >= 2:
        parent_rows += int(parent.stats.get("output_tombstones", 0))
    if stats["base_rows"] != parent_rows:
        problems.append(
            f"the job read {stats['base_rows']} base rows from the {len(touched & set(parent_map))} partitions it "
            f"touched and the tombstones, but they hold {parent_rows} in version {p['parent_version']}"
        )
    if int(p.get("base_layout", 1)) < 2 and not set(parent_map) <= touched:
        problems.append(
            f"the live version has layout 1 (tombstones inside its partitions), so every partition must be "
            f"rewritten once, but {sorted(set(parent_map) - touched)} were not"
        )
    written = stats.get("partitions", {})
    if not set(written) <= touched:
        problems.append(f"the job wrote partitions {sorted(set(written) - touched)} it did not report as touched")
    data = posixpath.join(out.rstrip("/"), DATA_DIR)
    outside = sorted(v for v, loc in written.items() if posixpath.dirname(loc.rstrip("/")) != data)
    if outside:
        problems.append(f"partitions {outside} were reported outside the new version's data directory {data}")
    if stats.get("partitions_reused") != len(set(parent_map) - touched):
        problems.append(
            f"the job reports {stats.get('partitions_reused')} reused partitions, "
            f"the plan leaves {len(set(parent_map) - touched)} untouched"
        )
    return problems


def attempts(rt: Runtime, p: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(version, stats) of every finished attempt at plan ``p``, oldest first.

    Every run of the compaction job writes its own ``<version>-<attempt>`` directory; an
    attempt has finished when its stats file is there (the job writes it last).
    """
    found = []
    for e in rt.lake.storage.list_dir(rt.lake.layout.base):
        if not e.is_dir or not (e.name == p["version"] or e.name.startswith(p["version"] + "-")):
            continue
        stats_path = posixpath.join(e.path, STATS_FILE)
        if not rt.lake.storage.exists(stats_path):
            continue  # killed or still running: not an attempt to publish
        try:
            stats = _read_json(rt, stats_path)
        except ValueError:
            log.warning("%s: unreadable %s is skipped", rt.cfg.qualified_name, stats_path)
            continue
        if stats.get("plan_id") == p["plan_id"]:
            found.append((e.name, stats))
    return sorted(found, key=lambda a: (str(a[1].get("finished_at", "")), a[0]))


def _locations(rt: Runtime, version: str) -> dict[str, str]:
    lay = rt.lake.layout
    return {
        "version": version,
        "output_location": lay.version_dir(version),
        "quarantine_location": lay.quarantine_dir(version),
    }


def _committed(rt: Runtime, p: dict[str, Any]) -> Commit | None:
    """The commit of plan ``p`` if it was committed; raise if another plan took its number."""
    commit = rt.lake.read_commit(p["seq"])
    if commit is not None and commit.plan_id != p["plan_id"]:
        raise ConcurrentCommitError(
            f"{rt.cfg.qualified_name}: commit {commit.seq} was taken by plan {commit.plan_id} "
            f"(run {commit.run_id}); this run's plan {p['plan_id']} is stale and nothing of it is published. "
            "Nothing was changed: re-run the DAG"
        )
    return commit


def validate(rt: Runtime, plan_path: str) -> dict[str, Any]:
    """Check the newest attempt at the plan before it may be published; raise :class:`PublishValidationError`.

    Records which attempt passed (publish commits exactly that one). A plan that was
    committed already is not validated again: its commit's stats are returned.
    """
    cfg, lake = rt.cfg, rt.lake
    p = load_plan(rt, plan_path)
    done = _committed(rt, p)
    if done is not None:
        log.info(
            "%s: plan %s is committed already as %s; nothing to validate",
            cfg.qualified_name,
            p["plan_id"],
            done.version,
        )
        return {**done.stats, **_locations(rt, done.version), "already_committed": True}
    tried = attempts(rt, p)
    if not tried:
        raise CompactionError(
            f"{cfg.qualified_name}: no attempt of the compaction job finished plan {p['plan_id']} (no "
            f"{STATS_FILE} in any {p['output_location']}-<attempt> directory). Clear the compact task to run it again"
        )
    version, stats = tried[-1]
    out = lake.layout.version_dir(version)
    problems: list[str] = []
    if stats.get("plan_id") != p["plan_id"]:
        problems.append(f"stats belong to plan {stats.get('plan_id')}, not {p['plan_id']}")
    if stats.get("layout") != LAYOUT:
        problems.append(f"the job wrote layout {stats.get('layout', 1)}, this version of the package expects {LAYOUT}")
    # The counts the table mode's rule must add up to (keys, sides, rows in and out).
    problems += mode_of(cfg).count_problems(stats)
    # The job must have read the whole previous base (partitioned: all of each partition it
    # touched) and every planned file.
    parent = lake.read_commit(p["parent_seq"])
    if p.get("partition_by"):
        problems += _partition_problems(p, stats, parent, out)
    else:
        parent_rows = int(parent.stats.get("output_rows", 0)) if parent is not None else 0
        if stats["base_rows"] != parent_rows:
            problems.append(
                f"the job read {stats['base_rows']} base rows, but version {p['parent_version']} has {parent_rows}"
            )
    # Row counts the plan read from the footers: a file changed after planning shows up here.
    planned_rows = sum(int(f["rows"]) for f in p["files"])
    if planned_rows != stats["increment_rows"]:
        problems.append(f"the job read {stats['increment_rows']} increment rows, the planned files held {planned_rows}")
    # What is on storage must be what the job reported, with the expected schema, and nothing else
    # where readers glob: the data and tombstones directories hold Parquet data files only.
    on_disk, other = _output_files(lake.storage, out)
    if other:
        problems.append(f"{out} holds files that are not data files where readers read: {sorted(other)}")
    reported = {f["name"]: f["size"] for f in stats["output_files"]}
    if on_disk != reported:
        problems.append(
            f"output files differ from the job's report: on storage {sorted(on_disk)}, reported {sorted(reported)}"
        )
    footer_rows = {DATA_DIR: 0, TOMBSTONES_DIR: 0}
    footer_rows_by_partition: dict[str, int] = {}
    want = [(c.name, c.type) for c in cfg.columns] + [
        ("_cdc_increment", "string"),
        ("_cdc_file", "string"),
        ("_cdc_pos", "bigint"),
        ("_cdc_ingested_at", "timestamp"),
    ]
    # Tombstones keep their partition as a column; data files have it in their directory name.
    want_tomb = want + ([(PARTITION_COLUMN, "string")] if p.get("partition_by") else [])
    for name in sorted(on_disk):
        rows, schema = _footer(lake.storage, posixpath.join(out, name))
        kind, _, rest = name.partition("/")
        footer_rows[kind] += rows
        if kind == DATA_DIR and "/" in rest:
            value = _partition_dir_value(rest.split("/", 1)[0]) or ""
            footer_rows_by_partition[value] = footer_rows_by_partition.get(value, 0) + rows
        expect = want_tomb if kind == TOMBSTONES_DIR else want
        got = [(f.name, str(f.type)) for f in schema]
        if [n for n, _ in got] != [n for n, _ in expect] or not all(
            _arrow_type_ok(h, a) for (_, h), (_, a) in zip(expect, got, strict=True)
        ):
            problems.append(f"{name} has schema {got}, expected {expect}")
            break
    if footer_rows[DATA_DIR] != stats["output_visible_rows"]:
        problems.append(
            f"Parquet footers of {DATA_DIR}/ hold {footer_rows[DATA_DIR]} rows, "
            f"the job reported {stats['output_visible_rows']} visible rows"
        )
    if footer_rows[TOMBSTONES_DIR] != stats["output_tombstones"]:
        problems.append(
            f"Parquet footers of {TOMBSTONES_DIR}/ hold {footer_rows[TOMBSTONES_DIR]} rows, "
            f"the job reported {stats['output_tombstones']} tombstones"
        )
    if p.get("partition_by") and footer_rows_by_partition != stats.get("partition_rows"):
        problems.append(
            f"rows per partition in the Parquet footers {footer_rows_by_partition} differ from the job's "
            f"report {stats.get('partition_rows')}"
        )
    if problems:
        raise PublishValidationError(
            f"{cfg.qualified_name}: version {version} failed validation and was not published: "
            + "; ".join(problems)
            + ". Nothing changed for readers; inspect the version directory and the compact task log, "
            "then clear the compact task (a new attempt writes a new directory)"
        )
    with connect(rt.metastore) as ms:
        # Let people inspect the staged output through the compactor table.
        ms.set_location(cfg.database, rt.names["compactor_table"], posixpath.join(out, DATA_DIR))
    marker = {"plan_id": p["plan_id"], "seq": p["seq"], "version": version, "validated_at": utcnow().isoformat()}
    lake.storage.write_text(lake.layout.validated_path(p["plan_id"]), json.dumps(marker, indent=1, sort_keys=True))
    log.info("%s: version %s validated (%d rows)", cfg.qualified_name, version, stats["output_rows"])
    return {**{k: v for k, v in stats.items() if k != "output_files"}, **_locations(rt, version)}


# --------------------------------------------------------------------------- publish
def publish(rt: Runtime, plan_path: str, now: datetime | None = None) -> dict[str, Any]:
    """Commit the validated version and make it live; safe to retry at any point."""
    cfg, lake = rt.cfg, rt.lake
    p = load_plan(rt, plan_path)
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
        version = _read_json(rt, marker_path)["version"]
        stats = _read_json(rt, posixpath.join(lake.layout.version_dir(version), STATS_FILE))
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
        )
        if p.get("partition_by"):
            commit.partitions, commit.partition_rows = next_partitions(latest, stats)
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
        _sync_base_location(rt, ms, live)
        fault_point("publish.after_pointer", cfg.qualified_name)
        # The views stop reading the increments the base now holds (before archive deletes them):
        # every engine, DuckDB too, then reads each event once.
        committed = {f"{f['increment']}/{f['name']}" for f in live.files}
        shown = views.sync(rt, ms, pending_files(rt, utcnow(), committed), live, drop_gone=True)
    Quarantine(lake).record_rows(existing.version, existing.seq, existing.stats)
    removed = cleanup_versions(rt, existing.seq)
    return {
        "seq": existing.seq,
        "version": existing.version,
        "removed_versions": removed,
        "freshness": {"base": existing.freshness or {}, "view": shown["freshness"]},
    }


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


def cleanup_versions(rt: Runtime, live_seq: int) -> list[str]:
    """Delete base versions beyond ``keep_versions`` and stale uncommitted ones."""
    lake = rt.lake
    kept = [c for s in range(max(0, live_seq - rt.cfg.keep_versions + 1), live_seq + 1) if (c := lake.read_commit(s))]
    keep = {c.version for c in kept}
    # Partitioned tables reuse untouched partitions by reference: an older version's directory
    # stays as long as a kept commit names one of its partitions, with only those partitions.
    # (layout 1: base/<v>/_cdc_partition=x; layout 2: base/<v>/data/_cdc_partition=x).
    referenced = {loc.rstrip("/") for c in kept for loc in (c.partitions or {}).values()}
    by_reference = {
        posixpath.basename(version_dir_of(loc))
        for loc in referenced
        if posixpath.dirname(version_dir_of(loc)) == lake.layout.base
    } - keep
    removed = []
    for e in lake.storage.list_dir(lake.layout.base):
        m = _VERSION.match(e.name)
        if e.is_dir and e.name in by_reference:
            version_dir = lake.layout.version_dir(e.name)
            # Only the referenced partitions stay; its tombstones belong to no kept commit.
            for parent in (version_dir, posixpath.join(version_dir, DATA_DIR)):
                for sub in lake.storage.list_dir(parent):
                    path = posixpath.join(parent, sub.name)
                    unreferenced = _partition_dir_value(sub.name) is not None and path not in referenced
                    if sub.is_dir and (unreferenced or (parent == version_dir and sub.name == TOMBSTONES_DIR)):
                        lake.storage.delete_tree(path)
                        removed.append(f"{e.name}/{path[len(version_dir) + 1 :]}")
            continue
        # The empty genesis version stays: ensure_tables points new tables at it.
        if not e.is_dir or e.name in keep or e.name == EMPTY_VERSION or m is None:
            continue
        seq = int(m.group(1))
        # Versions of a later seq may belong to a run in flight: leave them alone.
        if seq <= live_seq:
            lake.storage.delete_tree(e.path)
            removed.append(e.name)
            fault_point("cleanup.after_first_delete", rt.cfg.qualified_name)
    # Quarantined rows of a committed version are kept until re-ingested; those of a
    # version that never became live were never refused for real: the rows are still pending.
    for e in lake.storage.list_dir(posixpath.dirname(lake.layout.quarantine_dir(EMPTY_VERSION))):
        m = _VERSION.match(e.name)
        if e.is_dir and m is not None and int(m.group(1)) <= live_seq:
            commit = lake.read_commit(int(m.group(1)))
            if commit is None or commit.version != e.name:
                lake.storage.delete_tree(e.path)
    sweep_temporaries(rt, [lake.layout.control, lake.layout.plans, lake.layout.commits])
    for e in lake.storage.list_dir(lake.layout.plans):
        try:
            doc = _read_json(rt, e.path)
        except Exception:  # noqa: BLE001 - a torn plan file from a crash is garbage too
            lake.storage.delete(e.path)
            continue
        if int(doc.get("seq", 0)) <= live_seq - rt.cfg.keep_versions:
            lake.storage.delete(e.path)
    if removed:
        log.info("%s: removed old versions %s", rt.cfg.qualified_name, removed)
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


# --------------------------------------------------------------------------- archive
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
    for f in commit.files:
        src = f["path"]
        dst = posixpath.join(lake.layout.archive, f"c{commit.seq:08d}", f["increment"], f["name"])
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
    st.write_text(lake.layout.archived_marker(commit.seq), json.dumps({"seq": commit.seq, "files": len(commit.files)}))
    log.info(
        "%s: archived %d files of commit %d; dropped partitions %s", cfg.qualified_name, moved, commit.seq, emptied
    )
    return {"archived_files": moved, "dropped_partitions": emptied}


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
        # The marker stays too: it may be what makes the files that remain complete.
        log.info(
            "%s: %s keeps %s, which commit %d did not take; the increment stays pending",
            cfg.qualified_name,
            d,
            sorted(e.name for e in others),
            commit.seq,
        )
        return False
    for e in done:
        st.delete(e.path)
    # Not emptied if something landed meanwhile: it stays, and so does its partition.
    return st.remove_dir_if_empty(d) or not st.exists(d)


def archive(rt: Runtime, plan_path: str) -> dict[str, Any]:
    """Archive the increments of this run's commit (or of any commit not yet archived)."""
    p = load_plan(rt, plan_path)
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


# ---------------------------------------------------------------------- refresh view
def refresh_pending(rt: Runtime, now: datetime | None = None) -> dict[str, Any]:
    """The view refresher's step: show newly landed increments in the views, between compactions.

    Registers them, rewrites the DuckDB views and records freshness -- metadata calls only, no
    Spark.  While a run holds the table's lease it does nothing: that run registers what it
    leaves pending when it ends, and staying out of its way keeps the two from undoing each
    other's registrations.
    """
    now = now or utcnow()
    held = TableLease(rt.lake).current()
    if held is not None and not held.released and not held.expired(now):
        log.info("%s: a run holds the table (%s); it refreshes the views itself", rt.cfg.qualified_name, held.owner)
        return {"skipped": f"a run holds the table: {held.describe()}"}
    latest = rt.lake.latest_commit()
    committed = {f"{f['increment']}/{f['name']}" for f in latest.files}
    pending = pending_files(rt, now, committed)
    pending.dirs = {k: v for k, v in pending.dirs.items() if rt.lake.storage.list_dir(v)}
    with connect(rt.metastore) as ms:
        shown = views.sync(rt, ms, pending, latest, drop_gone=True)
    if pending.held_back:
        shown["held_back"] = pending.held_back
    return shown


def refresh_view(rt: Runtime, force: bool = False) -> dict[str, Any]:
    """Show readers what the landing area holds now: register pending increments, rewrite the
    DuckDB views, record freshness, and (re)create the views if they changed.

    An increment holding a file the plan would refuse (:func:`check_file`) or one Spark
    would read but no plan takes is held back: not registered (dropped if it was), listed
    in the result, the log and ``_cdc/view_held_back.json``.  The view keeps answering
    with every other increment.  The view refresher DAG runs this every few minutes.
    """
    cfg = rt.cfg
    latest = rt.lake.latest_commit()
    committed = {f"{f['increment']}/{f['name']}" for f in latest.files}
    pending = pending_files(rt, utcnow(), committed)
    # Empty directories (an archived increment being removed) have nothing to show.
    pending.dirs = {k: v for k, v in pending.dirs.items() if rt.lake.storage.list_dir(v)}
    with connect(rt.metastore) as ms:
        shown = views.sync(rt, ms, pending, latest, drop_gone=True)
        stale = views.stale(rt, ms)
        rt.lake.storage.write_text(
            view_report_path(rt.lake.layout.control),
            json.dumps(
                {"table": cfg.qualified_name, "checked_at": utcnow().isoformat(), "held_back": pending.held_back},
                indent=1,
                sort_keys=True,
            ),
        )
        fault_point("refresh_view.after_partitions", cfg.qualified_name)
        if force:
            stale = views.dialects.metastore_views(cfg)
        if stale:
            views.recreate(rt, ms, stale)
    result: dict[str, Any] = {
        "partitions_added": shown["partitions_added"],
        "partitions_dropped": shown["partitions_dropped"],
        "views_recreated": sorted(v.name for v in stale),
        "duckdb_views": shown["duckdb_views"],
        "freshness": shown["freshness"],
    }
    if pending.held_back:
        result["held_back"] = pending.held_back
    return result
