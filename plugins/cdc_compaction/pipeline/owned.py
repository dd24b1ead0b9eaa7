"""Which files under a table's root its own records and layout name (docs, "Deleting a table").

:class:`OwnedFiles` is the rule ``cdc-compaction delete --drop-data`` deletes by, and retention,
archive expiry and the formats' metadata clean-up use its parts: a path is the table's only when

* its commit records name it: the versions they publish (and every attempt of the table's plans,
  ``v<seq>-<plan>-<attempt>``), with the files the job writes in a version (``part-*``, ``_SUCCESS``,
  ``_cdc_stats.json``, checksums) in the directories it writes (``data``, ``tombstones``, ``index*``,
  ``changes``, the mode's outputs, partition directories); the archived copies of each commit's files
  (``archive/c<seq>/<increment>/<name>``); each commit's change file (``changes/c<seq>.parquet``);
* its plans name it: quarantined rows of its versions (``quarantine/rows/<version>``), whole files a
  plan refused (``quarantine/files/<plan>``, as its manifest lists them);
* the landing layout names it: files directly in an increment directory (``core/landing.py``);
* it is a control file (``_cdc/``: ``*.json``, ``*.archived``, ``*.released``, ``*.committed``, the writers' hidden
  locks and temporaries) or a table format's metadata file (``base/_delta_log``, ``iceberg/``).

Anything else -- a file of another name, a symbolic link, a FIFO, a directory holding another
table's ownership marker -- is not the table's and stays (``core/ownership.py`` walks without
following links and never enters another table's root).
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from cdc_compaction.core.exceptions import CommitLogError, StorageError
from cdc_compaction.core.lake import EMPTY_VERSION, Lake
from cdc_compaction.core.landing import increment_hour
from cdc_compaction.core.mode import mode_of
from cdc_compaction.core.ownership import Removal, remove_files
from cdc_compaction.job.contract import CHANGES_DIR, DATA_DIR, INDEX_DIR, TOMBSTONES_DIR
from cdc_compaction.pipeline.runtime import VERSION_NAME

log = logging.getLogger(__name__)

#: Files the compaction job writes in a version directory (Spark's part files, its commit markers, the stats).
_JOB_FILE = re.compile(r"^(part-.+|_SUCCESS|_cdc_stats\.json)$")
#: Hidden files of this package's writers: checksums beside a file, atomic-write temporaries, lock files.
_HIDDEN = re.compile(r"^\..+\.(crc|tmp|copying|lock)$")
_CONTROL_FILE = re.compile(r"^[^.].*\.(json|archived|released|committed)$")
_DELTA_FILE = re.compile(r"^(\d{20}\.(json|checkpoint\.parquet)|_last_checkpoint)$")
_ICEBERG_FILE = re.compile(r"^[^.].*\.(json|avro|text)$")
DELTA_LOG = "_delta_log"
#: The working directory of Hadoop's FileOutputCommitter inside a directory the job writes.
_COMMITTER_DIR = "_temporary"
ICEBERG_DIR = "iceberg"


def _under(path: str, top: str) -> str | None:
    """``path`` relative to ``top`` ('' for ``top`` itself), or None if it is not inside it."""
    p, t = path.rstrip("/"), top.rstrip("/")
    if p == t:
        return ""
    return p[len(t) + 1 :] if p.startswith(t + "/") else None


def is_job_file(name: str) -> bool:
    """A file the compaction job writes in a version directory (or its checksum)."""
    return bool(_JOB_FILE.match(name) or (_HIDDEN.match(name) and name.endswith(".crc")))


def is_version_part(lake: Lake, rel: str) -> bool:
    """``rel`` (inside a version directory; a directory ends in "/") is where the job writes: its files
    (:func:`is_job_file`) in its directories (``data``, ``tombstones``, ``index*``, the mode's outputs,
    partition directories ``<column>=<value>``)."""
    outputs = {d.name for d in mode_of(lake.cfg).output_dirs(lake.cfg)}
    *dirs, name = rel.split("/")
    for d in dirs:
        if d == _COMMITTER_DIR:
            # Hadoop's output committer works in <output>/_temporary/<attempt>/...: everything in it is the
            # job's (a killed job leaves it behind, with task-attempt directories of the committer's naming).
            return True
        # CHANGES_DIR: a cdc table's change feed, written by the job beside the version (change_feed).
        if (
            d
            and d not in (DATA_DIR, TOMBSTONES_DIR, CHANGES_DIR, *outputs)
            and not d.startswith(INDEX_DIR)
            and "=" not in d
        ):
            return False
    return not name or is_job_file(name)


def is_format_file(lake: Lake, path: str) -> bool:
    """A table format's metadata file (a directory ends in "/"): ``base/_delta_log/*``, ``iceberg/metadata/*``."""
    is_dir = path.endswith("/")
    rel = _under(path, posixpath.join(lake.layout.base, DELTA_LOG))
    if rel is not None:
        return (is_dir and not rel) or ("/" not in rel and bool(_DELTA_FILE.match(rel) or _HIDDEN.match(rel)))
    rel = _under(path, posixpath.join(lake.layout.root, ICEBERG_DIR))
    if rel is not None:
        if is_dir:
            return rel in ("", "metadata")
        name = posixpath.basename(rel)
        return posixpath.dirname(rel) == "metadata" and bool(_ICEBERG_FILE.match(name) or _HIDDEN.match(name))
    return False


def is_control_file(lake: Lake, path: str, *, marker: bool = False) -> bool:
    """A control file under ``_cdc/`` (a directory, ending in "/": any); the ownership marker only with ``marker``."""
    rel = _under(path, lake.layout.control)
    if rel is None:
        return False
    if path.rstrip("/") == lake.layout.owner:
        return marker
    name = posixpath.basename(rel)
    return path.endswith("/") or bool(_CONTROL_FILE.match(name) or _HIDDEN.match(name))


@dataclass
class OwnedFiles:
    """The paths a table's records and layout name (module docstring), read once from its lake."""

    lake: Lake
    versions: set[str] = field(default_factory=set)
    plan_ids: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)
    #: Records that could not be read (what they name stays): for the report.
    unread: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, lake: Lake) -> OwnedFiles:
        own = cls(lake)
        lay, st = lake.layout, lake.storage
        own.versions.add(EMPTY_VERSION)
        for seq in lake.commit_seqs():
            try:
                commit = lake.read_commit(seq)
            except (CommitLogError, StorageError) as exc:
                own.unread.append(f"{lay.commit_path(seq)} ({exc})")
                continue
            if commit is None:
                continue
            own.versions.add(commit.version)
            own.plan_ids.add(commit.plan_id)
            archive = posixpath.join(lay.archive, f"c{seq:08d}")
            own.dirs.add(archive)
            for f in commit.files:
                own.dirs.add(posixpath.join(archive, f["increment"]))
                own.files.add(posixpath.join(archive, f["increment"], f["name"]))
            own.files.add(posixpath.join(lay.root, "changes", f"c{seq:08d}.parquet"))
        for e in st.list_dir(lay.plans):
            if e.is_dir or not e.name.endswith(".json") or e.name.endswith(".validated.json"):
                continue
            try:
                own.plan_ids.add(str(json.loads(st.read_text(e.path))["plan_id"]))
            except (ValueError, TypeError, KeyError, StorageError) as exc:
                own.unread.append(f"{e.path} ({exc!r})")
        own.plan_ids.discard("")
        for e in st.list_dir(posixpath.join(lay.quarantine, "files")):
            manifest = posixpath.join(e.path, "_manifest.json")
            if not e.is_dir or not st.exists(manifest):
                continue
            try:
                doc = json.loads(st.read_text(manifest))
                named = [posixpath.join(e.path, f["increment"], f["name"]) for f in doc["files"]]
            except (ValueError, TypeError, KeyError, StorageError) as exc:
                own.unread.append(f"{manifest} ({exc!r})")
                continue
            own.files.update([manifest, *named])
            own.dirs.add(e.path)
            own.dirs.update(posixpath.dirname(p) for p in named)
        own.dirs.update(
            [
                lay.base,
                lay.archive,
                lay.quarantine,
                posixpath.join(lay.quarantine, "rows"),
                posixpath.join(lay.quarantine, "files"),
                posixpath.join(lay.root, "changes"),
                lay.incremental,
            ]
        )
        return own

    def owns_version(self, name: str) -> bool:
        """A version directory name its records name: a committed version, or an attempt of one of its plans."""
        if name in self.versions:
            return True
        m = VERSION_NAME.match(name)
        return m is not None and m.group(2).split("-")[0] in self.plan_ids

    def __call__(self, path: str) -> bool:
        """Is ``path`` (a file; a directory found empty ends in "/") the table's? Never the ownership marker."""
        lay = self.lake.layout
        is_dir, bare = path.endswith("/"), path.rstrip("/")
        if (bare in self.files and not is_dir) or (bare in self.dirs and is_dir):
            return True
        if is_control_file(self.lake, path) or is_format_file(self.lake, path):
            return True
        for area in (lay.base, posixpath.join(lay.quarantine, "rows")):
            rel = _under(bare, area)
            if rel:
                version, _, inside = rel.partition("/")
                if not self.owns_version(version):
                    return False
                if not inside:
                    return is_dir
                return is_version_part(self.lake, inside + ("/" if is_dir else "")) or (
                    area != lay.base and inside == "_manifest.json"
                )
        rel = _under(bare, lay.incremental)
        if rel:
            increment, _, name = rel.partition("/")
            # The landing layout: files directly in an increment directory are the table's landed data.
            return increment_hour(self.lake.cfg, increment) is not None and "/" not in name and (is_dir != bool(name))
        return False


def remove_version_files(lake: Lake, path: str) -> Removal:
    """Delete what the job wrote at ``path``: a version directory of ``base/`` or a directory inside one
    (a partition, ``data``). Files of other names, links and other tables' roots stay (core/ownership.py)."""
    rel = _under(path, lake.layout.base) or ""
    version_dir = posixpath.join(lake.layout.base, rel.split("/")[0])

    def accept(p: str) -> bool:
        inside = _under(p, version_dir)
        return inside is not None and is_version_part(lake, inside + ("/" if p.endswith("/") else ""))

    return _logged(lake, remove_files(lake, path, accept))


def remove_named_files(lake: Lake, path: str, named: set[str], extra: Callable[[str], bool] | None = None) -> Removal:
    """Delete the files under ``path`` that a record names (``named``: full paths; ``extra``: a rule for the
    rest, e.g. the job's files of a quarantined-rows directory), and the directories that empties."""

    def accept(p: str) -> bool:
        return p.endswith("/") or p in named or (extra is not None and extra(p))

    return _logged(lake, remove_files(lake, path, accept))


def remove_quarantine_entry(lake: Lake, path: str) -> Removal:
    """Delete a quarantine entry's own files: its manifest, the files it names (``files/``), the job's
    files (``rows/``)."""
    manifest = posixpath.join(path, "_manifest.json")
    named = {manifest}
    try:
        doc = json.loads(lake.storage.read_text(manifest)) if lake.storage.exists(manifest) else {}
        named |= {posixpath.join(path, f["increment"], f["name"]) for f in doc.get("files", [])}
    except (ValueError, TypeError, KeyError, StorageError):
        log.warning("%s: %s is unreadable: only the job's files of %s go", lake.cfg.qualified_name, manifest, path)
    return remove_named_files(lake, path, named, lambda p: is_job_file(posixpath.basename(p)))


def _logged(lake: Lake, removal: Removal) -> Removal:
    if removal.kept:
        log.warning("%s: left what its records do not name: %s", lake.cfg.qualified_name, "; ".join(removal.kept[:20]))
    return removal


def remove_job_files(lake: Lake, path: str) -> Removal:
    """Delete the files the job writes (:func:`is_job_file`) under ``path`` (a rebuild's or an erase's
    directory outside ``base/``), and the directories that empties."""
    return remove_named_files(lake, path, set(), lambda p: is_job_file(posixpath.basename(p)))


def remove_format_metadata(lake: Lake, path: str) -> Removal:
    """Delete a table format's metadata files under ``path`` (its metadata root), nothing else there."""
    return _logged(lake, remove_files(lake, path, lambda p: is_format_file(lake, p)))
