"""Open table formats: every published version is also a Delta (and an Iceberg) table, over the same files.

A table lists them in the registry (``formats: [delta, iceberg]``, or for a whole database in its
``_database.yaml``).  Each format writes only metadata -- a log or manifests that name the base's
Parquet files where they are (``base/v<...>/data/``); no data file is copied or rewritten, and the
tombstones are never named (only the visible rows are the table).

Like the change feed (``pipeline/changes.py``) the metadata is derived data:

* written after the lake's commit record (``publish``, a rollback, an erase, a rebuild's publish
  call :func:`sync_formats`), and re-derived by the next call if missing -- a crash between the
  lake's commit and the format's (fault points ``formats.before_delta_commit``,
  ``formats.before_iceberg_commit``) loses nothing;
* a failure is logged and counted (:data:`FAILURES`, Airflow metric
  ``cdc_compaction.format_sync_failed``), reported in the publish's result (``formats``) and never
  fails the publish of the data commit;
* retention calls :func:`expire_formats` *before* it deletes a version's files: no metadata a
  reader can open names a deleted file (if that fails, retention keeps the files this time);
* an erase rewrites files in place, so after its commit :func:`regenerate_formats` rebuilds the
  metadata from the kept commits (no statistic keeps an erased value);
* a format the table stops listing is not kept current, so the next sync deletes its metadata
  (listed again, it starts anew from the kept commits).

The interface every format module implements (:class:`TableFormat`; ``formats/delta.py`` is one)::

    def sync(rt: Runtime, lake: Lake, kept: list[Commit]) -> dict[str, Any]
        # Idempotent: make the format's log hold exactly one entry per lake commit, in seq order, up to
        # the live commit (the last of ``kept``), each entry carrying the lake commit's seq (Delta: the
        # commitInfo's "cdc.commit_seq"; Iceberg: the snapshot summary property "cdc.commit_seq").
        # Append what is missing; never write an entry twice.  ``kept`` are the commits whose versions
        # retention keeps (oldest first): the only ones whose files are all still on storage.
        # Returns what it did (JSON-able), e.g. {"written": [seqs], "version": N}.
    def expire(rt: Runtime, lake: Lake, keep_seqs: set[int]) -> None
        # Stop referencing the versions not in keep_seqs, before retention deletes their files.
    def regenerate(rt: Runtime, lake: Lake, kept: list[Commit]) -> None
        # Rebuild the metadata from the kept commits (after an erase rewrote files: statistics and
        # bounds must not keep erased values).
    def metadata_root(lake: Lake) -> str
        # The directory holding all of the format's files (derived: erase regenerates it, never filters it).

Only ``rt.cfg`` (the effective config: registry columns plus what ``schema_changes: evolve`` added)
and ``rt.lake`` are used: callers without a Spark session or a metastore (erase) pass a
:func:`runtime_for` runtime.  Modules are loaded lazily (:data:`FORMATS`, importlib): a table
without formats imports none of them.
"""

from __future__ import annotations

import collections
import importlib
import logging
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from cdc_compaction.core.exceptions import FormatError
from cdc_compaction.core.sidechannel import count_failure
from cdc_compaction.job.contract import LAYOUT
from cdc_compaction.pipeline.owned import remove_format_metadata

if TYPE_CHECKING:
    from types import ModuleType

    from cdc_compaction.core.lake import Commit, Lake
    from cdc_compaction.core.registry import TableConfig
    from cdc_compaction.pipeline.runtime import Runtime

log = logging.getLogger(__name__)

#: Format name (as the registry's ``formats`` lists it) -> the module implementing :class:`TableFormat`.
FORMATS: dict[str, str] = {
    "delta": "cdc_compaction.pipeline.formats.delta",
    "iceberg": "cdc_compaction.pipeline.formats.iceberg",
}
#: Failures to write or expire a format's metadata, by table: counted, never raised.
FAILURES: collections.Counter[str] = collections.Counter()
FAILED_METRIC = "cdc_compaction.format_sync_failed"


@runtime_checkable
class TableFormat(Protocol):
    """What a format module provides (module docstring): functions, so a module object satisfies it."""

    def sync(self, rt: Runtime, lake: Lake, kept: list[Commit]) -> dict[str, Any]: ...

    def expire(self, rt: Runtime, lake: Lake, keep_seqs: set[int]) -> None: ...

    def regenerate(self, rt: Runtime, lake: Lake, kept: list[Commit]) -> None: ...

    def metadata_root(self, lake: Lake) -> str: ...


def load(name: str) -> TableFormat:
    """The module of format ``name`` (imported on first use); :class:`FormatError` if there is none."""
    path = FORMATS.get(name)
    if path is None:
        raise FormatError(f"unknown table format {name!r}: the registry's formats take {sorted(FORMATS)}")
    try:
        module: ModuleType = importlib.import_module(path)
    except ImportError as exc:
        raise FormatError(
            f"table format {name!r} cannot be loaded ({path}: {exc}); install the project's requirements "
            "(`make install`) or remove it from the table's formats"
        ) from exc
    if not isinstance(module, TableFormat):
        raise FormatError(f"table format {name!r}: {path} lacks sync, expire, regenerate or metadata_root")
    return module  # type: ignore[return-value]


def _count(cfg: TableConfig, name: str) -> None:
    count_failure(FAILURES, cfg.qualified_name, FAILED_METRIC, {"table": cfg.qualified_name, "format": name})


def kept_commits(lake: Lake, live_seq: int, keep_versions: int) -> list[Commit]:
    """The commits whose versions retention keeps with ``live_seq`` live, oldest first.

    A gap (a record missing) ends the list before it: a format's log has no hole, so it
    starts after the gap.  Versions of layout 1 (tombstones among the rows) are no table of
    visible rows: a format starts after the newest of them.
    """
    from cdc_compaction.core.lake import kept_seqs

    out: list[Commit] = []
    for seq in kept_seqs(live_seq, keep_versions):
        commit = lake.read_commit(seq)
        if commit is None or (commit.seq > 0 and commit.layout < 2):
            out = []
            continue
        out.append(commit)
    return out


def sync_formats(rt: Runtime, live_seq: int | None = None) -> dict[str, Any]:
    """Bring every format the table lists up to the live commit.  Never raises.

    Called after the lake's commit record and the metastore swap: by ``publish`` right after the
    change feed, and by rollback, erase and a rebuild's publish.  Returns ``{format: what it did}``
    and ``failed`` (format -> reason), which the publish result reports.
    """
    cfg, lake = rt.cfg, rt.lake
    done: dict[str, Any] = {"failed": {}}
    _drop_unlisted(rt, done)
    if not cfg.formats:
        return done
    try:
        live = lake.latest_commit().seq if live_seq is None else live_seq
        kept = kept_commits(lake, live, cfg.keep_versions)
    except Exception as exc:
        log.exception("%s: table formats not synced: the commit log could not be read", cfg.qualified_name)
        for name in cfg.formats:
            _count(cfg, name)
            done["failed"][name] = str(exc)
        return done
    for name in cfg.formats:
        try:
            if not kept:
                raise FormatError(
                    f"{cfg.qualified_name}: no kept commit of layout {LAYOUT} to describe as {name}; "
                    "the next compaction's publish writes it"
                )
            done[name] = load(name).sync(rt, lake, kept)
        except Exception as exc:  # noqa: BLE001 - a side channel never fails the data commit
            log.warning(
                "%s: %s metadata not brought up to date; the next publish retries: %s", cfg.qualified_name, name, exc
            )
            _count(cfg, name)
            done["failed"][name] = str(exc)
    return done


def _drop_unlisted(rt: Runtime, done: dict[str, Any]) -> None:
    """Delete the metadata of a format the table no longer lists: nothing keeps it current any more, so
    a reader would see an old version as the table (and files retention deletes).  Never raises."""
    for name in FORMATS:
        if name in rt.cfg.formats:
            continue
        try:
            fmt = _loadable(name)
            if fmt is not None and rt.lake.storage.exists(fmt.metadata_root(rt.lake)):
                remove_format_metadata(rt.lake, fmt.metadata_root(rt.lake))
                log.info("%s: %s is no longer in formats: its metadata was deleted", rt.cfg.qualified_name, name)
                done.setdefault("dropped", []).append(name)
        except Exception as exc:
            log.exception("%s: the metadata of %s (no longer in formats) was not deleted", rt.cfg.qualified_name, name)
            _count(rt.cfg, name)
            done["failed"][name] = str(exc)


def expire_formats(rt: Runtime, keep_seqs: set[int]) -> bool:
    """Make every format stop naming versions outside ``keep_seqs``; True if all did.  Never raises.

    Retention calls it before deleting version files, and deletes none when it returns False:
    a reader of a format's older snapshot must never find a file gone (the next publish retries).
    """
    cfg, ok = rt.cfg, True
    for name in cfg.formats:
        try:
            load(name).expire(rt, rt.lake, keep_seqs)
        except Exception:
            log.exception(
                "%s: %s metadata still names versions outside %s; old versions are kept until it succeeds",
                cfg.qualified_name,
                name,
                sorted(keep_seqs),
            )
            _count(cfg, name)
            ok = False
    return ok


def regenerate_formats(rt: Runtime) -> dict[str, Any]:
    """Rebuild every listed format's metadata from the kept commits; delete unlisted formats' leftovers.

    After an erase: files were rewritten in place, so sizes and statistics change and the old
    metadata may hold erased values.  A format the table no longer lists is not maintained, so
    its leftover directory (which may hold erased values too) is deleted.  Never raises.
    """
    cfg, lake = rt.cfg, rt.lake
    done: dict[str, Any] = {"regenerated": [], "deleted": [], "failed": {}}
    try:
        kept = kept_commits(lake, lake.latest_commit().seq, cfg.keep_versions)
    except Exception as exc:
        log.exception("%s: table formats not regenerated: the commit log could not be read", cfg.qualified_name)
        for name in cfg.formats:
            _count(cfg, name)
        done["failed"]["log"] = str(exc)
        return done
    for name in FORMATS:
        try:
            fmt = _loadable(name)
            if fmt is None:
                continue
            if name in cfg.formats:
                fmt.regenerate(rt, lake, kept)
                done["regenerated"].append(name)
            elif lake.storage.exists(fmt.metadata_root(lake)):
                remove_format_metadata(lake, fmt.metadata_root(lake))
                done["deleted"].append(name)
        except Exception as exc:
            log.exception(
                "%s: %s metadata not regenerated (the caller decides: an erase fails and deletes it)",
                cfg.qualified_name,
                name,
            )
            _count(cfg, name)
            done["failed"][name] = str(exc)
    return done


def _loadable(name: str) -> TableFormat | None:
    """Format ``name``'s module, or None while it is not implemented (not importable)."""
    try:
        return load(name)
    except FormatError:
        return None


def is_metadata_path(lake: Lake, path: str) -> bool:
    """Is ``path`` (a file or directory under the table's root) a format's metadata?

    Erase's walker asks this: such files are derived, so erase regenerates them
    (:func:`regenerate_formats`, after its commit) instead of filtering rows in them.
    """
    p = path.rstrip("/")
    for name in FORMATS:
        fmt = _loadable(name)
        if fmt is None:
            continue
        root = fmt.metadata_root(lake).rstrip("/")
        if p == root or p.startswith(root + "/"):
            return True
    return False


class _NoSpark:
    """Formats run no Spark: a runtime made by :func:`runtime_for` refuses any attempt, said plainly."""

    def run_sql(self, cfg: TableConfig, statements: list[str]) -> None:
        raise FormatError(f"{cfg.qualified_name}: table formats run no Spark SQL ({statements[:1]})")


def runtime_for(cfg: TableConfig, lake: Lake) -> Runtime:
    """A runtime for callers that have none (erase): the formats use its config and lake only."""
    from cdc_compaction.core.settings import metastore_from_env
    from cdc_compaction.pipeline.runtime import Runtime

    return Runtime(cfg=cfg, lake=lake, metastore=metastore_from_env(), engine=_NoSpark())  # type: ignore[arg-type]
