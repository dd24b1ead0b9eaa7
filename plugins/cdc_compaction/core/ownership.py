"""Which table owns a storage root, and deleting only what a table owns (docs, "Deleting a table").

A table owns its root through a marker, ``<root>/_cdc/owner.json``, written with create-if-absent
by the run that creates its tables (``pipeline.tables.ensure_tables``; an existing lake is adopted
by its next run). It names the table, its registry file, the deployment and when.

* **Claiming** (:func:`claim`) refuses, changing nothing, when the marker names another table, when
  a directory above the root holds another table's marker (the root is nested in that table's),
  and, before creating the marker, when the root's subtree holds another table's marker.
* **Destroying** goes file by file through :func:`remove_files`: it deletes only the regular files
  a caller's rule accepts (the rule says which paths the table's records and layout name), never
  follows a symbolic link, never descends into a directory that holds another table's marker, and
  removes only directories it emptied itself. Everything else stays and is listed.

No table's data is ever found by detection (scanning for registry files or ``_cdc`` directories):
what is not named as the table's own stays.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cdc_compaction.core.exceptions import OwnershipError, PreconditionFailedError, StorageError
from cdc_compaction.core.storage import LocalStorage, Storage

if TYPE_CHECKING:
    from cdc_compaction.core.lake import Lake

log = logging.getLogger(__name__)

CONTROL_DIR = "_cdc"
MARKER_NAME = "owner.json"


def marker_path(root: str) -> str:
    """Where the ownership marker of the table at ``root`` lives."""
    return posixpath.join(root.rstrip("/"), CONTROL_DIR, MARKER_NAME)


@dataclass(frozen=True)
class Owner:
    """What an ownership marker says."""

    path: str
    table: str
    registry_file: str
    deployment: str
    created_at: str

    def describe(self) -> str:
        return (
            f"{self.table} (marker {self.path}, registry file {self.registry_file or '?'}, "
            f"deployment {self.deployment or '?'}, since {self.created_at or '?'})"
        )


def _kind(storage: Storage, path: str) -> str | None:
    """``file``, ``dir``, ``link``, ``other`` (FIFO, socket, device) or None if absent; links not followed."""
    if isinstance(storage, LocalStorage):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot stat {path}: {exc}") from exc
        if stat.S_ISLNK(mode):
            return "link"
        if stat.S_ISDIR(mode):
            return "dir"
        return "file" if stat.S_ISREG(mode) else "other"
    if not storage.exists(path):
        return None
    return "file" if _s3_object_exists(storage, path) else "dir"


def _s3_object_exists(storage: Storage, path: str) -> bool:
    parent, name = posixpath.split(path.rstrip("/"))
    return any(e.name == name and not e.is_dir for e in storage.list_dir(parent))


def read_owner(storage: Storage, root: str) -> Owner | None:
    """The marker of ``root``, or None if there is none.

    Raise :class:`OwnershipError` for a marker that is not a regular file (a link, a FIFO: never
    opened) or cannot be read: whose root it is is unknown, so nothing may be claimed or deleted.
    """
    path = marker_path(root)
    kind = _kind(storage, path)
    if kind is None:
        return None
    what = "fix or remove it by hand once you know whose root this is"
    if kind != "file":
        raise OwnershipError(f"the ownership marker {path} is not a regular file ({kind}); nothing was changed: {what}")
    try:
        doc = json.loads(storage.read_text(path))
        return Owner(
            path,
            str(doc["table"]),
            str(doc.get("registry_file", "")),
            str(doc.get("deployment", "")),
            str(doc.get("created_at", "")),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise OwnershipError(
            f"the ownership marker {path} is unreadable ({exc!r}); nothing was changed: {what}"
        ) from exc


def ancestors(root: str) -> list[str]:
    """The directories above ``root``, nearest first (for S3 up to the bucket)."""
    root = root.rstrip("/")
    scheme = ""
    if "://" in root:
        scheme, _, rest = root.partition("://")
        bucket, _, key = rest.partition("/")
        top, parts = f"{scheme}://{bucket}", [p for p in key.split("/") if p]
        return [posixpath.join(top, *parts[:i]) if i else top for i in range(len(parts) - 1, -1, -1)]
    out, d = [], posixpath.dirname(root)
    while d:  # a relative path ends in "" (nothing above it to ask)
        out.append(d)
        if d == "/":
            break
        d = posixpath.dirname(d)
    return out


def owner_above(storage: Storage, root: str) -> Owner | None:
    """The marker of a table whose root holds ``root`` (the nearest one), or None."""
    for d in ancestors(root):
        owner = read_owner(storage, d)
        if owner is not None:
            return owner
    return None


@dataclass(frozen=True)
class Entry:
    """One entry met by :func:`walk`."""

    path: str
    kind: str  # file | dir | link | other


def _list(storage: Storage, path: str) -> list[Entry]:
    if isinstance(storage, LocalStorage):
        try:
            with os.scandir(path) as it:
                items = sorted(it, key=lambda e: e.name)
                out = []
                for e in items:
                    if e.is_symlink():
                        out.append(Entry(e.path, "link"))
                    elif e.is_dir(follow_symlinks=False):
                        out.append(Entry(e.path, "dir"))
                    elif e.is_file(follow_symlinks=False):
                        out.append(Entry(e.path, "file"))
                    else:
                        out.append(Entry(e.path, "other"))
                return out
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"cannot list {path}: {exc}") from exc
    return [Entry(e.path.rstrip("/"), "dir" if e.is_dir else "file") for e in storage.list_dir(path)]


def foreign_owner(storage: Storage, directory: str, table: str) -> Owner | None:
    """The marker of another table at ``directory`` (a root of its own), or None."""
    owner = read_owner(storage, directory)
    return owner if owner is not None and owner.table != table else None


def _marked(storage: Storage, directory: str, entries: list[Entry], table: str) -> Owner | None:
    """Another table's marker at ``directory`` (whose listing is ``entries``): looked for only where a
    ``_cdc`` directory is, so a walk costs no extra request per directory on S3."""
    if not any(e.kind == "dir" and posixpath.basename(e.path) == CONTROL_DIR for e in entries):
        return None
    return foreign_owner(storage, directory, table)


def walk(storage: Storage, top: str, table: str) -> Iterator[tuple[Entry, Owner | None]]:
    """Every entry under ``top``, links not followed; a directory holding another table's marker is
    yielded with that marker and not entered."""
    pending = [top.rstrip("/")]
    while pending:
        for e in _list(storage, pending.pop()):
            if e.kind == "dir":
                theirs = _marked(storage, e.path, _list(storage, e.path), table)
                yield e, theirs
                if theirs is None:
                    pending.append(e.path)
            else:
                yield e, None


def owned_subtree_markers(storage: Storage, root: str, table: str) -> list[Owner]:
    """Markers of other tables anywhere under ``root`` (links not followed)."""
    return [theirs for _, theirs in walk(storage, root, table) if theirs is not None]


def _registry_file(table: str) -> str:
    from cdc_compaction.core.settings import registry_dir

    d = registry_dir()
    for ext in (".yaml", ".yml"):
        if (d / f"{table}{ext}").exists():
            return str(d / f"{table}{ext}")
    return ""


def claim(lake: Lake, registry_file: str | None = None, now: datetime | None = None) -> bool:
    """Make sure ``lake``'s table owns its root: write the marker if there is none. True if written now.

    Raise :class:`OwnershipError`, changing nothing, when the root is another table's (its marker,
    or a marker above the root), or when creating the marker for a root whose subtree holds another
    table's marker.
    """
    from cdc_compaction.core.deployment import deployment_id

    table, root, storage = lake.cfg.qualified_name, lake.layout.root, lake.storage
    mine = read_owner(storage, root)
    if mine is not None and mine.table != table:
        raise OwnershipError(
            f"{table}: its storage_root {root} belongs to table {mine.describe()}. Nothing was changed. Give "
            f"{table} a storage_root of its own (field 'storage_root' of its registry file), or, if {mine.table} "
            f"is gone for good and its data may go, delete it with `cdc-compaction delete {mine.table} --drop-data` "
            "(or remove its files and marker by hand)"
        )
    above = owner_above(storage, root)
    if above is not None:
        raise OwnershipError(
            f"{table}: its storage_root {root} lies inside the root of table {above.describe()}. Nothing was "
            f"changed. Give {table} a storage_root outside every other table's root"
        )
    if mine is not None:
        return False
    inside = owned_subtree_markers(storage, root, table)
    if inside:
        raise OwnershipError(
            f"{table}: its storage_root {root} holds the root of table {inside[0].describe()}"
            + (f" (and {len(inside) - 1} more)" if len(inside) > 1 else "")
            + f". Nothing was changed. Give {table} a storage_root that holds no other table's root"
        )
    doc = {
        "table": table,
        "registry_file": registry_file if registry_file is not None else _registry_file(table),
        "deployment": deployment_id(),
        "created_at": (now or datetime.now(UTC)).isoformat(),
    }
    try:
        storage.create_exclusive(marker_path(root), json.dumps(doc, indent=1, sort_keys=True))
    except PreconditionFailedError:
        return claim(lake, registry_file, now)  # someone wrote one meanwhile: check whose
    log.info("%s: owns its storage root %s from now on (marker %s)", table, root, marker_path(root))
    return True


def require_owner(lake: Lake, what: str) -> Owner:
    """The table's marker, before ``what`` destroys anything; :class:`OwnershipError` if the table does
    not own its root (no marker, another table's, or a marker above the root)."""
    table, root, storage = lake.cfg.qualified_name, lake.layout.root, lake.storage
    mine = read_owner(storage, root)
    if mine is None:
        raise OwnershipError(
            f"{table}: refusing {what}: its storage_root {root} has no ownership marker ({marker_path(root)}), so "
            "which files there are the table's is not established. Nothing was changed. Run the table's DAG once "
            "(its create-tables task adopts the root), then try again; or remove the data by hand"
        )
    if mine.table != table:
        raise OwnershipError(
            f"{table}: refusing {what}: its storage_root {root} belongs to table {mine.describe()}. Nothing was "
            f"changed. Delete {table} without --drop-data; the data there is {mine.table}'s"
        )
    above = owner_above(storage, root)
    if above is not None:
        raise OwnershipError(
            f"{table}: refusing {what}: its storage_root {root} lies inside the root of table {above.describe()}. "
            "Nothing was changed. Remove the table's files by hand"
        )
    return mine


@dataclass
class Removal:
    """What :func:`remove_files` deleted and what it left (with why)."""

    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def extend(self, other: Removal) -> None:
        self.removed += other.removed
        self.kept += other.kept


def remove_files(lake: Lake, top: str, accept: Callable[[str], bool], *, dry_run: bool = False) -> Removal:
    """Delete the regular files under ``top`` that ``accept`` (a path -> bool rule) names as the table's.

    Links are never followed nor deleted, FIFOs and other special files never opened, and a
    directory holding another table's marker is not entered; all of those stay and are listed in
    :attr:`Removal.kept`, as are the files ``accept`` does not name. Directories emptied here are
    removed (only those: an empty directory found empty stays). ``dry_run``: only say what would go.
    """
    storage = lake.storage
    out = Removal()
    # ``accept`` is asked about files, and about directories found empty (path + "/"; removed only if it names them).
    top = top.rstrip("/")
    kind = _kind(storage, top)
    if kind is None:
        return out
    if kind != "dir":
        if kind == "file" and accept(top):
            if not dry_run:
                storage.delete(top)
            out.removed.append(top)
        else:
            out.kept.append(f"{top} ({_why(kind)})")
        return out
    _remove_in(lake, top, accept, out, dry_run)
    return out


def _why(kind: str) -> str:
    return {"link": "a symbolic link, never followed", "other": "not a regular file"}.get(
        kind, "not named by the table's records"
    )


def _remove_in(lake: Lake, d: str, accept: Callable[[str], bool], out: Removal, dry_run: bool) -> bool:
    """Remove what is the table's in ``d``; True if ``d`` was emptied here (and removed)."""
    storage, table = lake.storage, lake.cfg.qualified_name
    entries = _list(storage, d)
    theirs = _marked(storage, d, entries, table) if d != lake.layout.root.rstrip("/") else None
    if theirs is not None:
        out.kept.append(f"{d} (the root of table {theirs.table})")
        return False
    if not entries:
        # An empty directory stays unless the rule names it (the layout's own, e.g. the empty genesis version).
        return accept(d + "/") and (dry_run or storage.remove_dir_if_empty(d))
    gone = 0
    for e in entries:
        if e.kind == "dir":
            if _remove_in(lake, e.path, accept, out, dry_run):
                gone += 1
        elif e.kind == "file" and accept(e.path):
            if not dry_run:
                storage.delete(e.path)
            out.removed.append(e.path)
            gone += 1
        else:
            out.kept.append(f"{e.path} ({_why(e.kind)})")
    if gone == len(entries):
        # Everything in it was the table's and is gone: the directory was the table's too.
        return dry_run or storage.remove_dir_if_empty(d)
    return False
