"""The landing area as a run sees it: which names are increments, and what each entry is.

A CDC sink lands files in ``<storage_root>/<directory>/<prefix><hour>/``.  Everything
else it may leave there is classified here, once, so that ``plan``, ``archive``,
``refresh_view`` and the quarantine's re-ingest agree on it (README, "Bad input and the
quarantine"):

* **data**: a file the plan reads (Spark's and Hive's rule: no leading ``_`` or ``.``,
  not a checksum) -- unless it is a writer's temporary (below);
* **markers**: the increment's completion marker (``marker_file``, and ``_SUCCESS``);
* **checksums**: ``*.crc`` files (Hadoop writes ``.<file>.crc`` beside ``<file>``);
* **in progress**: a writer's temporaries -- hidden files other than checksums, ``*.tmp``,
  ``*.inprogress``, ``*._COPYING_`` ..., and hidden or ``_`` directories such as
  ``_temporary``.  An increment holding one is not complete: the plan does not take it;
* **ignored**: anything a run will never take (a subdirectory of an increment, a ``_``
  file other than a marker, a file directly under the landing directory, a directory whose
  name is not an increment name).  It is reported, never silently skipped.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.storage import FileInfo, Storage, is_data_file

#: Name endings of files a writer is still writing (Flink, Hadoop ``put``, Kafka Connect, rsync ...).
IN_PROGRESS_SUFFIXES = (
    ".inprogress",
    ".in-progress",
    ".tmp",
    ".temp",
    ".partial",
    ".pending",
    ".copying",
    "._copying_",
)


def increment_hour(cfg: TableConfig, name: str) -> datetime | None:
    """The hour an increment directory stands for, or None if the name is not an increment name.

    The name must round-trip exactly (``prefix + hour.strftime(time_format)``): ``strptime``
    also accepts ``increment_202611229`` (no zero padding) for 09:00, and such a name would
    break the lexical order of increments that the tie-break rule relies on.
    """
    inc = cfg.increments
    if not name.startswith(inc.prefix):
        return None
    try:
        hour = datetime.strptime(name[len(inc.prefix) :], inc.time_format).replace(tzinfo=UTC)
    except ValueError:
        return None
    return hour if inc.prefix + hour.strftime(inc.time_format) == name else None


def layout_example(cfg: TableConfig) -> str:
    """An increment name of this table's layout, for messages."""
    return cfg.increments.prefix + datetime(2026, 11, 22, 9, tzinfo=UTC).strftime(cfg.increments.time_format)


def markers(cfg: TableConfig) -> set[str]:
    """File names that mark an increment complete (not data, never in progress)."""
    return {cfg.increments.marker_file, "_SUCCESS"}


def is_in_progress(name: str, is_dir: bool) -> bool:
    """True for a writer's temporary: hidden entries (checksums aside), ``_`` directories, ``*.tmp`` & co."""
    if is_dir:
        return name.startswith(("_", "."))
    if name.endswith(".crc"):
        return False
    return name.startswith(".") or name.lower().endswith(IN_PROGRESS_SUFFIXES)


def is_data(cfg: TableConfig, name: str) -> bool:
    """Whether a file of an increment is data: the one rule ``plan`` reads increments by.

    Decided by name, never by suffix: a sink may land Parquet as ``events.json`` or without any
    suffix, and the plan reads it.  Not data: hidden and ``_`` names and checksums (Spark's and
    Hive's rule, :func:`~cdc_compaction.core.storage.is_data_file`), a writer's temporaries
    (:func:`is_in_progress`) and the completion markers.  ``plan`` and ``rebuild`` (through
    :func:`classify_increment`, which ``pipeline.pending.pending_files`` lists increments with),
    ``archive``, the quarantine's re-ingest and ``erase`` all decide with this function, so none of
    them can skip a file another one reads.
    """
    return is_data_file(name) and not is_in_progress(name, is_dir=False) and name not in markers(cfg)


@dataclass(frozen=True)
class Ignored:
    """A landed file or directory a run will not take, and why."""

    path: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass
class IncrementListing:
    """One increment directory's entries, by kind."""

    name: str
    path: str
    data: list[FileInfo] = field(default_factory=list)
    markers: list[FileInfo] = field(default_factory=list)
    checksums: list[FileInfo] = field(default_factory=list)
    in_progress: list[FileInfo] = field(default_factory=list)
    ignored: list[Ignored] = field(default_factory=list)
    subdirs: list[FileInfo] = field(default_factory=list)

    def unplanned_but_readable(self) -> list[tuple[str, str]]:
        """Entries Spark's reader of the partition would read although no plan takes them.

        Spark skips names starting with ``_`` or ``.`` but reads ``x.parquet.tmp`` and the
        files of plain subdirectories: a view over this increment would not show what a
        compaction would produce.
        """
        out = [
            (e.path, "a writer's temporary file that Spark would read as data")
            for e in self.in_progress
            if not e.name.startswith(("_", "."))
        ]
        out += [(e.path, "a subdirectory whose files Spark would read but no plan takes") for e in self.subdirs]
        return out


def classify_increment(cfg: TableConfig, name: str, path: str, entries: list[FileInfo]) -> IncrementListing:
    """Sort one increment directory's listing into data, markers, checksums, temporaries, ignored."""
    out = IncrementListing(name, path)
    done = markers(cfg)
    for e in entries:
        if is_in_progress(e.name, e.is_dir):
            out.in_progress.append(e)
        elif e.is_dir:
            out.subdirs.append(e)
            out.ignored.append(
                Ignored(
                    e.path,
                    "a subdirectory of an increment: files in it are never compacted; move them up into "
                    f"{path} (or into an increment of their own) if they are change files, else remove it",
                )
            )
        elif e.name in done:
            out.markers.append(e)
        elif e.name.endswith(".crc"):
            out.checksums.append(e)
        elif e.name.startswith("_"):
            out.ignored.append(
                Ignored(
                    e.path,
                    "not a data file (names starting with '_' are metadata) and not the completion marker "
                    f"{cfg.increments.marker_file!r}; rename it if it holds change events, else remove it",
                )
            )
        elif is_data(cfg, e.name):
            out.data.append(e)
        else:  # unreachable while the branches above mirror is_data; kept so a new rule cannot drop a file
            out.ignored.append(Ignored(e.path, "not a data file of the increment; rename or remove it"))
    return out


def scan_landing(cfg: TableConfig, storage: Storage, incremental: str) -> tuple[dict[str, str], list[Ignored]]:
    """Increment name -> directory, and every other entry of the landing directory with the reason."""
    dirs: dict[str, str] = {}
    ignored: list[Ignored] = []
    inc = cfg.increments
    for e in storage.list_dir(incremental):
        if e.is_dir and increment_hour(cfg, e.name) is not None:
            dirs[e.name] = e.path
        elif e.is_dir:
            ignored.append(
                Ignored(
                    e.path,
                    f"directory name does not match the increment layout {inc.prefix}{inc.time_format} exactly "
                    f"(e.g. {layout_example(cfg)}, zero-padded); its files are never compacted: rename it, or "
                    "move its files into the increment of their hour",
                )
            )
        else:
            ignored.append(
                Ignored(
                    e.path,
                    f"a file directly under {incremental}, not in an increment directory; it is never "
                    f"compacted: move it into the increment of its hour (e.g. {layout_example(cfg)}/)",
                )
            )
    return dirs, ignored


def landing_report_path(control: str) -> str:
    """Where the last plan wrote what it saw in the landing area but did not take."""
    return posixpath.join(control, "landing.json")


def view_report_path(control: str) -> str:
    """Where the last ``refresh_view`` listed the increments it kept out of the view."""
    return posixpath.join(control, "view_held_back.json")


def as_dicts(items: list[Ignored]) -> list[dict[str, Any]]:
    return [i.to_dict() for i in items]
