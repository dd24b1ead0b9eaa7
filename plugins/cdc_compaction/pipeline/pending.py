"""What the landing area holds for a run: the files a plan may take, and everything it does not take yet.

:func:`pending_files` lists every increment (through :mod:`cdc_compaction.core.landing`, which
classifies the entries) and checks every data file's footer, so that ``plan``, ``publish``
and the view refreshes agree on which increments are complete, waiting, stalled or held
back from the views.  :func:`report_landing` records and alerts about what a run does not
take (README, "Bad input and the quarantine").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from cdc_compaction.core import policy
from cdc_compaction.core.inputs import check_file
from cdc_compaction.core.lake import Commit, Lake, PlannedFile
from cdc_compaction.core.landing import (
    Ignored,
    IncrementListing,
    as_dicts,
    classify_increment,
    increment_hour,
    landing_report_path,
    scan_landing,
)
from cdc_compaction.core.registry import Increments, TableConfig
from cdc_compaction.core.schema import dropped_columns
from cdc_compaction.pipeline.runtime import Runtime, utcnow

log = logging.getLogger(__name__)


def increment_dirs(rt: Runtime) -> dict[str, str]:
    """Increment name -> directory, for every increment directory of the landing area.

    Other entries of the landing directory are left out here; ``plan`` reports them
    (see :func:`pending_files`).
    """
    return scan_landing(rt.cfg, rt.lake.storage, rt.lake.layout.incremental)[0]


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
    #: What the planned files' columns change (``schema_changes``), in file order: the plan applies
    #: and records them (:mod:`cdc_compaction.core.schema`).
    changes: list[Any] = field(default_factory=list)


def landing_key(increment: str, name: str, size: int, token: str) -> str:
    """One landing of one file: its increment, name, size and the storage's token (``FileInfo.token``)."""
    return f"{increment}/{name}@{size}@{token}"


def taken(files: Iterable[Mapping[str, Any]]) -> set[str]:
    """The landed files a commit took (its ``files``), as :func:`pending_files` excludes them.

    A file is the one a commit took only if it is still that landing of it: same name, size and
    storage token (``landed``).  A file landed again under that name -- copied back from the archive
    as docs/data.md says, or new content -- is another input, which the next plan takes and the
    views show.  Records written before ``landed`` existed name files by ``increment/name`` alone.
    """
    out = set()
    for f in files:
        if f.get("landed"):
            out.add(landing_key(f["increment"], f["name"], int(f["size"]), f["landed"]))
        else:
            out.add(f"{f['increment']}/{f['name']}")
    return out


def in_place(lake: Lake, commit: Commit) -> set[str]:
    """The landed files ``commit`` took that may still be in the landing area: :func:`taken` of its files
    until its archive is done, none after.

    The archive moves every file the commit took (and leaves a file landed again in its place), so once
    its marker is written whatever lies in the landing area was landed since: new input, even a file
    moved back from the archive (same inode, mtime and size). Before that, a committed file keeps its
    storage token through a chmod or a hard link (the token holds no status-change time), so an
    operator's permission fix is not a second delivery.
    """
    return set() if lake.is_archived(commit.seq) else taken(commit.files)


def pending_files(rt: Runtime, now: datetime, exclude: set[str]) -> Pending:
    """Complete increments' files not yet compacted, split into good and bad (with the reason).

    ``exclude`` holds the landed files compacted already (:func:`taken` of the live commit's files):
    such a file, still in place because its archive is not done, is neither planned nor shown again.

    Every data file of every increment is checked with :func:`check_file` (footers only),
    waiting increments included: an increment holding a file the plan would refuse is kept
    out of the view, so that one unreadable file cannot break every query of it.
    """
    cfg, st = rt.cfg, rt.lake.storage
    inc = cfg.increments
    out = Pending()
    dropped = dropped_columns(cfg, st) if cfg.schema_policy == "evolve" else frozenset()
    dirs, out.ignored = scan_landing(cfg, st, rt.lake.layout.incremental)
    for name, path in sorted(dirs.items()):
        listing = classify_increment(cfg, name, path, st.list_dir(path))
        out.ignored += listing.ignored
        data = listing.data
        hour = increment_hour(cfg, name)
        waits, fix = why_waiting(inc, listing, hour, now) or (None, None)
        if waits is not None:
            log.info("%s: %s %s; not complete, not planned yet", cfg.qualified_name, path, waits)
            out.waiting.append({"increment": name, "path": path, "reason": waits})
            since = _waiting_since(hour, listing)
            if is_stalled(fix, since, now, inc.alert_after):
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
            if f"{name}/{e.name}" in exclude or landing_key(name, e.name, e.size, e.token) in exclude:
                continue
            check = check_file(cfg, e.path, rt.lake.storage, e.size, dropped)
            f = PlannedFile(
                increment=name,
                name=e.name,
                path=e.path,
                size=e.size,
                rows=check.rows,
                ignored_columns=tuple(check.ignored_columns),
                missing_columns=tuple(check.missing_columns),
                newest_event=check.newest_event.isoformat() if check.newest_event else "",
                landed=e.token,
            )
            if check.problem is not None:
                refused.append((e.path, check.problem))
                if waits is None:
                    out.bad.append((f, check.problem))
                continue
            shown.append(f)
            if cfg.format != "parquet" or cfg.envelope != "flattened":
                # The views read pending increments as flattened Parquet tables; these rows are seen once compacted.
                refused.append(
                    (e.path, f"format {cfg.format}, envelope {cfg.envelope}: the views show these rows once compacted")
                )
            if any(c.change == "widened" for c in check.changes):
                # A type wider than the tables' (schema_changes: evolve) breaks every read of the view until
                # a run widens the tables: the increment stays out of the view until then, not out of the plan.
                refused.append(
                    (e.path, "a column wider than the tables' (schema_changes: evolve); shown once a run widened them")
                )
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
            out.changes += check.changes
        if refused:
            out.held_back += [{"increment": name, "path": p, "reason": r} for p, r in refused]
        else:
            out.dirs[name] = path
            out.view_files += shown
    return out


def why_waiting(
    inc: Increments, listing: IncrementListing, hour: datetime | None, now: datetime
) -> tuple[str, str | None] | None:
    """Why an increment is not complete at ``now``, and what fixes that; None if a run may take it.

    Decided from its listing alone, first match wins: a writer's temporaries in it; the current
    hour (``wait_for_hour_end``); no marker (``completion: marker``); a data file changed within
    ``settle_seconds``.  The fix is None where the wait ends by itself (the hour, the settling).
    """
    data = listing.data
    if listing.in_progress:
        # A writer is still at work (or died): taking the increment now could miss its files,
        # and archive must never delete them (README, "Crash safety").
        waits = "holds a writer's temporaries " + ", ".join(sorted(e.name for e in listing.in_progress))
        return waits, "if no writer is still at work, they were left by one that died: remove them"
    if inc.wait_for_hour_end and hour is not None and hour + timedelta(hours=1) > now:
        return "is the current hour; it waits until the hour ends", None
    if inc.completion == "marker" and not listing.markers:
        return (
            f"has no {inc.marker_file} marker yet",
            f"check the sink; if the increment is complete, create {inc.marker_file} in it",
        )
    if data and inc.settle_seconds and max(e.mtime for e in data) > now.timestamp() - inc.settle_seconds:
        return f"changed within {inc.settle_seconds}s; waiting for it to settle", None
    return None


def is_stalled(fix: str | None, since: datetime | None, now: datetime, alert_after: timedelta) -> bool:
    """A waiting increment is stalled (reported, alerted) once it waited ``alert_after`` since ``since``.

    Only one whose wait does not end by itself (it has a ``fix``): temporaries, a missing marker.
    """
    return fix is not None and since is not None and now - since >= alert_after


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


def pending_load(cfg: TableConfig, latest: Commit, files: list[PlannedFile]) -> policy.PendingLoad:
    """What the policy weighs: the live version's rows (its commit record), the pending files' rows
    (their footers, read by :func:`pending_files`) and the oldest pending increment's hour."""
    hours = [h for h in (increment_hour(cfg, f.increment) for f in files) if h is not None]
    return policy.PendingLoad(
        base_rows=int(latest.stats.get("output_rows", 0)),
        pending_rows=sum(f.rows for f in files),
        pending_files=len(files),
        oldest_pending=min(hours, default=None),
    )
