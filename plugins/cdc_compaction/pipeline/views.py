"""Keeping what readers query current: the views in each dialect, the pending partitions, freshness.

A table's readers see three things besides the base table: the views (``<t>_view``,
``<t>_pending_rejects``, in the metastore in every dialect ``views.metastore`` lists, and
for DuckDB in ``views.duckdb``), the increments registered under ``<t>_incremental`` that
those views read, and how fresh each is.  :func:`sync` brings all of them to what the
landing area holds now; ``plan``, ``publish`` and the two steps here call it:
:func:`refresh_view` (the run's last step) and :func:`refresh_pending` (the view
refresher DAG's step, between runs) (README, "Readers").

Freshness is recorded as table properties (``cdc.freshness.*``) of ``<t>_base`` and of
every ``<t>_view``, and in ``_cdc/freshness.json``:

* ``base``: the newest increment and source event time a commit took, the commit and when;
* ``view``: the newest increment the views show and the newest source event time in it,
  and when that was checked.

Event times come from the Parquet footers' statistics of the registry's event time
column (``event_time``, else ``ts_ms``, else the first timestamp of ``order_by``).
"""

from __future__ import annotations

import json
import logging
import posixpath
from datetime import UTC, datetime
from typing import Any

from cdc_compaction.core import dialects, duckdb_views
from cdc_compaction.core.dialects import ViewDef
from cdc_compaction.core.lake import Commit, PlannedFile, TableLease
from cdc_compaction.core.landing import view_report_path
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.sidechannel import count_failure
from cdc_compaction.core.storage import is_data_file
from cdc_compaction.integrations.metastore import Metastore, MetastoreView, connect
from cdc_compaction.job.faults import fault_point
from cdc_compaction.pipeline.pending import Pending, in_place, pending_files
from cdc_compaction.pipeline.runtime import Runtime, utcnow

log = logging.getLogger(__name__)

#: Side channels that failed (DuckDB views, freshness properties): counted, never fatal.
FAILURES: dict[str, int] = {}


def _count_failure(what: str, table: str) -> None:
    count_failure(FAILURES, what, f"cdc_compaction.{what}_failed", {"table": table})


def stale(rt: Runtime, ms: Metastore) -> list[ViewDef]:
    """The metastore views that are missing, of another dialect, or made from another registry schema."""
    out = []
    for view in dialects.metastore_views(rt.cfg):
        t = ms.get_table(view.database, view.name)
        params = (t.parameters or {}) if t is not None else {}
        if (
            params.get("cdc.fingerprint") != view.properties["cdc.fingerprint"]
            or params.get("cdc.dialect", "spark") != view.dialect
        ):
            out.append(view)
    return out


def spark_statements(rt: Runtime, views: list[ViewDef]) -> list[str]:
    """The Spark views among ``views`` as DDL for the Spark engine (one submission with other DDL)."""
    return [dialects.spark_statement(rt.cfg, v) for v in views if v.dialect == "spark"]


def put_other_views(rt: Runtime, ms: Metastore, views: list[ViewDef]) -> list[str]:
    """Create the Hive and Trino views among ``views`` through the metastore API (no engine needed)."""
    done = []
    for v in views:
        if v.dialect == "spark":
            continue
        if v.dialect == "hive":
            mv = MetastoreView(
                database=v.database,
                name=v.name,
                columns=v.columns,
                original_text=v.query,
                expanded_text=v.query,
                parameters={**v.properties, "comment": v.comment},
            )
        else:
            mv = MetastoreView(
                database=v.database,
                name=v.name,
                # Trino keeps a view's columns in its own text; the metastore gets a placeholder column.
                columns=[("dummy", "string")],
                original_text=dialects.trino_view_text(v, rt.cfg.views.trino_catalog),
                expanded_text=dialects.PRESTO_VIEW_EXPANDED,
                parameters={**v.properties, "presto_view": "true", "comment": "Presto View"},
            )
        ms.put_view(mv)
        done.append(v.name)
    return done


def recreate(rt: Runtime, ms: Metastore, views: list[ViewDef]) -> None:
    """Create ``views``: the Spark ones with one Spark submission, the others through the metastore."""
    statements = spark_statements(rt, views)
    if statements:
        rt.engine.run_sql(rt.cfg, statements)
    put_other_views(rt, ms, views)


def _iso(value: datetime | None) -> str:
    return value.astimezone(UTC).isoformat() if value is not None else ""


def newest(*values: str | None) -> str:
    """The greatest of ISO timestamps or increment names (empty ones ignored)."""
    return max((v for v in values if v), default="")


def commit_freshness(parent: Commit | None, increments: list[str], files: list[dict[str, Any]]) -> dict[str, str]:
    """What a commit makes the base hold at the newest: the parent's, or what its files bring."""
    before = (parent.freshness if parent is not None else None) or {}
    return {
        "increment": newest(before.get("increment"), *increments),
        "event_time": newest(before.get("event_time"), *(f.get("newest_event", "") for f in files)),
    }


def base_properties(commit: Commit) -> dict[str, str]:
    f = commit.freshness or {}
    return {
        "cdc.freshness.base.commit": str(commit.seq),
        "cdc.freshness.base.committed_at": commit.committed_at,
        "cdc.freshness.base.increment": f.get("increment", ""),
        "cdc.freshness.base.event_time": f.get("event_time", ""),
    }


def view_freshness(commit: Commit, pending: Pending, now: datetime) -> dict[str, str]:
    base = commit.freshness or {}
    shown = [f for f in pending.view_files]
    return {
        "increment": newest(base.get("increment"), *pending.dirs),
        "event_time": newest(base.get("event_time"), *(f.newest_event for f in shown)),
        "checked_at": now.astimezone(UTC).isoformat(),
    }


def freshness_path(rt: Runtime) -> str:
    return posixpath.join(rt.lake.layout.control, "freshness.json")


def record_freshness(rt: Runtime, ms: Metastore, commit: Commit, view: dict[str, str] | None) -> dict[str, Any]:
    """Write freshness where readers look: table properties and ``_cdc/freshness.json``."""
    cfg = rt.cfg
    doc: dict[str, Any] = {"table": cfg.qualified_name, "base": {**(commit.freshness or {}), "commit": commit.seq}}
    props = {"base": base_properties(commit)}
    if view is not None:
        doc["view"] = view
        props["view"] = {f"cdc.freshness.view.{k}": v for k, v in view.items()}
    try:
        ms.set_properties(cfg.database, rt.names["base_table"], props["base"])
        if "view" in props:
            for names in dialects.view_names(cfg).values():
                if ms.get_table(cfg.database, names["view"]) is not None:
                    ms.set_properties(cfg.database, names["view"], props["view"])
        old = {}
        if rt.lake.storage.exists(freshness_path(rt)):
            try:
                old = json.loads(rt.lake.storage.read_text(freshness_path(rt)))
            except ValueError:
                old = {}
        rt.lake.storage.write_text(freshness_path(rt), json.dumps({**old, **doc}, indent=1, sort_keys=True))
    except Exception:
        log.exception("%s: could not record freshness %s", cfg.qualified_name, doc)
        _count_failure("freshness", cfg.qualified_name)
    return doc


def duckdb_files(rt: Runtime, commit: Commit, pending: Pending) -> duckdb_views.Files:
    """The files the DuckDB views read: the live version's and the pending increments' shown ones."""
    st, lake = rt.lake.storage, rt.lake
    locations = list((commit.partitions or {}).values()) or [lake.data_location(commit)]
    data = sorted(e.path for loc in locations for e in st.list_dir(loc) if not e.is_dir and is_data_file(e.name))
    tomb_dir = lake.layout.tombstones_dir(commit.version, commit.layout)
    tombs = sorted(e.path for e in st.list_dir(tomb_dir) if not e.is_dir and is_data_file(e.name)) if tomb_dir else []
    files = sorted(pending.view_files, key=lambda f: f.path)
    columns = {c.name for c in rt.cfg.columns}
    missing = set.intersection(*(set(f.missing_columns) for f in files)) if files else set()
    return duckdb_views.Files(
        data=data,
        tombstones=tombs,
        pending=[f.path for f in files],
        missing_columns=missing & columns,
        tombstones_in_data=commit.layout < 2,
        commit=commit.seq,
    )


def write_duckdb(rt: Runtime, commit: Commit, pending: Pending) -> str | None:
    """(Re)write the DuckDB views; a failure is logged and counted, never raised."""
    if rt.cfg.views.duckdb is None:
        return None
    try:
        return duckdb_views.write(rt.cfg, duckdb_files(rt, commit, pending), rt.lake.storage)
    except Exception:
        log.exception(
            "%s: could not write the DuckDB views to %s; they keep their previous definition until the next refresh",
            rt.cfg.qualified_name,
            rt.cfg.views.duckdb,
        )
        _count_failure("duckdb_views", rt.cfg.qualified_name)
        return None


def sync(rt: Runtime, ms: Metastore, pending: Pending, commit: Commit, drop_gone: bool) -> dict[str, Any]:
    """Make every view show ``pending`` over ``commit``: partitions, DuckDB views, freshness."""
    synced = sync_view_partitions(rt, ms, pending, drop_gone=drop_gone)
    duck = write_duckdb(rt, commit, pending)
    fresh = record_freshness(rt, ms, commit, view_freshness(commit, pending, utcnow()))
    return {
        "partitions_added": synced["added"],
        "partitions_dropped": synced["dropped"],
        "duckdb_views": duck,
        "freshness": fresh.get("view", {}),
    }


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
    committed = in_place(rt.lake, latest)
    pending = pending_files(rt, now, committed)
    pending.dirs = {k: v for k, v in pending.dirs.items() if rt.lake.storage.list_dir(v)}
    with connect(rt.metastore) as ms:
        shown = sync(rt, ms, pending, latest, drop_gone=True)
    if pending.held_back:
        shown["held_back"] = pending.held_back
    if rt.cfg.compaction.policy == "threshold":
        shown["compaction"] = _compaction_due(rt, latest, pending, now)
    # Between runs too: a table whose runs stopped publishing breaches its SLO without a publish to see it.
    if rt.cfg.slo is not None:
        from cdc_compaction.pipeline import slo

        shown["slo"] = slo.check_quietly(rt.cfg, rt.lake, now)
    return shown


def _compaction_due(rt: Runtime, latest: Commit, pending: Pending, now: datetime) -> dict[str, Any]:
    """The ``compaction.policy`` decision over what the refresher just showed (docs, "Compaction policy").

    Under ``threshold`` the views carry the pending increments until a threshold is reached; the
    refresher sees them grow every few minutes, so it measures them as ``plan`` does (the same
    files, footers and live version) and says when the table's compaction is due: in its result
    and in a warning that names the table, what is pending and the run that compacts it (the DAG's
    next scheduled one; a DAG without a schedule must be triggered), instead of leaving readers to
    pay the growing merge unannounced.  It never compacts itself (no Spark, no lease, no run
    started): the table's own run does, whenever it starts.  Not due: nothing is logged.
    """
    from cdc_compaction.core.policy import decide
    from cdc_compaction.pipeline.pending import pending_load

    decision = decide(rt.cfg.compaction, pending_load(rt.cfg, latest, pending.files), now)
    out = decision.to_dict()
    if not pending.files:  # a run would find an empty plan and stop there (as status says it)
        out.update(compact=False, reason="nothing pending")
    elif decision.compact:
        log.warning(
            "%s: compaction is due (%s): %s; %s",
            rt.cfg.qualified_name,
            decision.reason,
            pending_summary(pending.files),
            who_compacts(rt.cfg),
        )
    return out


def pending_summary(files: list[PlannedFile]) -> str:
    """What waits to be compacted, for people: ``2 pending files in 2 increments (first ... last), 3 rows``."""
    increments = sorted({f.increment for f in files})
    span = increments[0] if len(increments) == 1 else f"{increments[0]} ... {increments[-1]}"
    return (
        f"{len(files)} pending file{'s' if len(files) != 1 else ''} in {len(increments)} "
        f"increment{'s' if len(increments) != 1 else ''} ({span}), {sum(f.rows for f in files)} rows"
    )


def who_compacts(cfg: TableConfig) -> str:
    """Which run compacts a due table: the DAG's next scheduled one, or (no schedule) one somebody triggers.

    The refresher never starts a run itself (no Spark, no lease, no Airflow API): it only says so.
    """
    # The same test as the DAG's own schedule (factory.build_dag); a disabled table is not refreshed at all.
    if cfg.retired or cfg.schedule is None:
        why = "the table is retired" if cfg.retired else "its registry schedule is null"
        return (
            f"DAG {cfg.dag_id} has no schedule ({why}), so no run compacts them on its own: "
            f"trigger DAG {cfg.dag_id} to compact them (this refresh starts no run)"
        )
    return (
        f"the next scheduled run of DAG {cfg.dag_id} ({cfg.schedule}) compacts them (this refresh starts no run; "
        "trigger the DAG to compact at once)"
    )


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
    committed = in_place(rt.lake, latest)
    pending = pending_files(rt, utcnow(), committed)
    # Empty directories (an archived increment being removed) have nothing to show.
    pending.dirs = {k: v for k, v in pending.dirs.items() if rt.lake.storage.list_dir(v)}
    with connect(rt.metastore) as ms:
        shown = sync(rt, ms, pending, latest, drop_gone=True)
        outdated = stale(rt, ms)
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
            outdated = dialects.metastore_views(cfg)
        if outdated:
            recreate(rt, ms, outdated)
    result: dict[str, Any] = {
        "partitions_added": shown["partitions_added"],
        "partitions_dropped": shown["partitions_dropped"],
        "views_recreated": sorted(v.name for v in outdated),
        "duckdb_views": shown["duckdb_views"],
        "freshness": shown["freshness"],
    }
    if pending.held_back:
        result["held_back"] = pending.held_back
    return result
