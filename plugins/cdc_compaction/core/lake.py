"""The lake layout of one table and its commit protocol.

Layout under a table's storage root::

    incremental/increment_YYYYMMDDHH/*.parquet   change files, as the CDC sink lands them
    base/v00000007-<plan>-<attempt>/             base versions, one directory per attempt of
                                                 the compaction (never written twice); the live
                                                 one is named by the latest commit record
    base/v00000007-<plan>-<attempt>/data/        its visible rows: Parquet data files only (the
                                                 base table's location; partitioned tables: one
                                                 cdc_partition=<v>/ directory per partition,
                                                 _cdc_partition=<v>/ before issue 37)
    base/v00000007-<plan>-<attempt>/tombstones/  its tombstones (delete winners within retention)
    base/v00000007-<plan>-<attempt>/_cdc_stats.json   what the job counted (validate checks it)
    base/v00000009-rb<N>-<token>/                a rollback's version: version N's files copied
                                                 (travel.py; README, "Time travel and rollback")
    archive/c00000007/increment_.../             increments after they were compacted
    changes/c00000007.parquet                    commit 7's change from its parent (<t>_changes;
                                                 pipeline/changes.py)
    quarantine/rows/v00000007-<plan>/            rows refused by that compaction, with reasons
    quarantine/rows/v00000007-<plan>/_manifest.json   counts by reason and file; re-ingest status
    quarantine/files/<plan>/increment_.../x.parquet   whole files refused by a plan (on_bad_file: quarantine)
    quarantine/files/<plan>/_manifest.json            each file's reason; re-ingest status
    _cdc/plans/<plan>.json                       exact inputs of a run (retries reuse it)
    _cdc/plans/<plan>.validated.json             the attempt of that plan that passed validation
    _cdc/commits/00000007.json                   commit records: the source of truth
    _cdc/commits/00000007.archived               archive of that commit finished
    _cdc/owner.json                              the table owning this root (core/ownership.py)
    _cdc/pointer.json                            live version, for readers without a metastore
                                                 (compare-and-swap, only ever moves forward)
    _cdc/lease/00000042.json                     who compacts the table right now, until when
    _cdc/lease/00000042.released                 that lease was given back (or broken)

The commit record, created with create-if-absent, is the single atomic decision of
a run.  The metastore location and the pointer are derived from it and repaired by
the next run if a crash came between them ("roll forward").

The lease serializes runs of one table across schedulers, manual triggers and
Airflow deployments sharing the lake: a numbered lease file is taken with
create-if-absent, so of two runs taking over the same (free or expired) lease
exactly one wins.  The commit record stays the final guard: even a run that lost
its lease cannot publish over another run's commit.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from cdc_compaction.core.exceptions import CommitLogError, ConcurrentRunError, PreconditionFailedError, StorageError
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.settings import resolve_storage_root
from cdc_compaction.core.storage import Storage, storage_for
from cdc_compaction.job.contract import DATA_DIR, INDEX_DIR, LAYOUT, TOMBSTONES_DIR, partition_dir_value

log = logging.getLogger(__name__)

EMPTY_VERSION = "v00000000-empty"


def version_dir_of(location: str) -> str:
    """The version directory a location of the base lies in: the directory itself (layout 1),
    its ``data``/``tombstones`` (layout 2), its key index (``index``, or ``index-<token>`` as
    ``index rebuild`` writes it), or a partition directory inside any of them."""
    loc = location.rstrip("/")
    if partition_dir_value(posixpath.basename(loc)) is not None:
        loc = posixpath.dirname(loc)
    name = posixpath.basename(loc)
    if name in (DATA_DIR, TOMBSTONES_DIR, INDEX_DIR) or name.startswith(f"{INDEX_DIR}-"):
        loc = posixpath.dirname(loc)
    return loc


#: The top-level areas of a table's root besides its landing directory (``increments.directory``):
#: what a path of a record is recognised by when the root it names is not this one (:meth:`Layout.abs`).
_ROOT_AREAS: tuple[str, ...] = ("base", "archive", "quarantine", "_cdc", "changes", "rebuild", "iceberg")


def _is_absolute(path: str) -> bool:
    return path.startswith("/") or "://" in path


def _lake_relative(path: str, areas: tuple[str, ...]) -> str | None:
    """The part of an absolute ``path`` from the lake area it lies in (``base/v.../data``), or None.

    The rightmost area wins: the old root may itself contain a directory called ``base`` or
    ``archive``, while nothing below an area is named like an area (version directories are
    ``v<seq>-...``, partitions ``cdc_partition=<escaped value>``).  A ``base`` match must be the
    base itself or followed by a version directory (``v`` and digits), to skip a root's own ``base``.
    """
    best: tuple[int, str] | None = None
    for area in areas:
        probe = "/" + area.strip("/")
        start = len(path)
        while (at := path.rfind(probe, 0, start)) >= 0:
            start = at
            rest = path[at + 1 :]
            end = at + len(probe)
            if end != len(path) and path[end] != "/":
                continue  # a longer name that starts like the area
            if area == "base" and end != len(path):
                following = path[end + 1 :].split("/", 1)[0]
                if not (following.startswith("v") and following[1:9].isdigit()) and not following.startswith("_"):
                    continue
            if best is None or at > best[0]:
                best = (at, rest)
            break
    return best[1] if best is not None else None


@dataclass(frozen=True)
class Layout:
    """Absolute paths of one table's lake areas."""

    root: str
    incremental: str
    base: str
    archive: str
    quarantine: str
    control: str

    @classmethod
    def for_table(cls, cfg: TableConfig) -> Layout:
        root = resolve_storage_root(cfg.storage_root)
        j = posixpath.join
        return cls(
            root=root,
            incremental=j(root, cfg.increments.directory),
            base=j(root, "base"),
            archive=j(root, "archive"),
            quarantine=j(root, "quarantine"),
            control=j(root, "_cdc"),
        )

    @property
    def plans(self) -> str:
        return posixpath.join(self.control, "plans")

    @property
    def commits(self) -> str:
        return posixpath.join(self.control, "commits")

    @property
    def pointer(self) -> str:
        return posixpath.join(self.control, "pointer.json")

    @property
    def owner(self) -> str:
        """The ownership marker: which table owns this root (core/ownership.py)."""
        return posixpath.join(self.control, "owner.json")

    @property
    def staging(self) -> str:
        """Where the compactor table points before anything was compacted."""
        return posixpath.join(self.control, "staging-empty")

    def version_dir(self, version: str) -> str:
        return posixpath.join(self.base, version)

    def data_dir(self, version: str, layout: int = LAYOUT) -> str:
        """Where a version's visible rows are: the base table's location."""
        return posixpath.join(self.base, version, DATA_DIR) if layout >= 2 else self.version_dir(version)

    def tombstones_dir(self, version: str, layout: int = LAYOUT) -> str | None:
        """Where a version's tombstones are (layout 1: among the data, so None)."""
        return posixpath.join(self.base, version, TOMBSTONES_DIR) if layout >= 2 else None

    def quarantine_dir(self, version: str) -> str:
        """Rows refused by the compaction that made ``version``."""
        return posixpath.join(self.quarantine, "rows", version)

    def quarantined_files_dir(self, plan_id: str) -> str:
        """Whole files refused by the plan ``plan_id``."""
        return posixpath.join(self.quarantine, "files", plan_id)

    def commit_path(self, seq: int) -> str:
        return posixpath.join(self.commits, f"{seq:08d}.json")

    def archived_marker(self, seq: int) -> str:
        return posixpath.join(self.commits, f"{seq:08d}.archived")

    def plan_path(self, plan_id: str) -> str:
        return posixpath.join(self.plans, f"{plan_id}.json")

    def validated_path(self, plan_id: str) -> str:
        """Which attempt at plan ``plan_id`` passed validation (what publish commits)."""
        return posixpath.join(self.plans, f"{plan_id}.validated.json")

    @property
    def leases(self) -> str:
        return posixpath.join(self.control, "lease")

    def lease_path(self, n: int) -> str:
        return posixpath.join(self.leases, f"{n:08d}.json")

    def lease_released(self, n: int) -> str:
        return posixpath.join(self.leases, f"{n:08d}.released")

    # -- relocation: records name files relative to the root (docs/data.md, "Copying or restoring a lake")
    @property
    def areas(self) -> tuple[str, ...]:
        """The top-level areas of the root, relative (``base``, the landing directory, ``archive`` ...):
        how a path of a record written under another root is recognised (:meth:`abs`)."""
        landing = posixpath.relpath(self.incremental, self.root)
        return (landing, *_ROOT_AREAS)

    def rel(self, path: str) -> str:
        """``path`` as records name it: relative to the root when it lies under the root, else as is.

        A path of a record written under another root (a copied or moved lake) is first mapped to
        this root (:meth:`abs`), so a rewritten record never keeps the old root."""
        path = self.abs(path)
        root = self.root.rstrip("/")
        if path == root:
            return "."
        if path.startswith(root + "/"):
            return path[len(root) + 1 :]
        return path

    def abs(self, path: str) -> str:
        """The absolute path of a path a record names, under *this* root.

        * relative (what records written since relocation name): joined onto the root;
        * absolute under this root: as it is;
        * absolute under another root (a record written before the lake was copied, restored or
          moved, when records named absolute paths): the part from the lake area it lies in
          (``base/...``, ``incremental/...``, ``archive/...``) is taken under this root;
        * anything else (no lake area in it): as it is.
        """
        if not path:
            return path
        root = self.root.rstrip("/")
        if not _is_absolute(path):
            return root if path == "." else posixpath.join(root, path)
        if path == root or path.startswith(root + "/"):
            return path
        rel = _lake_relative(path, self.areas)
        return posixpath.join(root, rel) if rel is not None else path


@dataclass(frozen=True)
class PlannedFile:
    """One change file a plan takes as input."""

    increment: str
    name: str
    path: str
    size: int
    rows: int = 0
    ignored_columns: tuple[str, ...] = ()
    missing_columns: tuple[str, ...] = ()
    #: The newest source event time in the file (ISO, from its footer's statistics), or "".
    newest_event: str = ""
    #: Which landing of the file this is (``FileInfo.token``): a file landed again under the same name
    #: is another input (docs, "Re-landing increments"); "" in records written before it existed.
    landed: str = ""

    @property
    def rel(self) -> str:
        return f"{self.increment}/{self.name}"

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "increment": self.increment,
            "name": self.name,
            "path": self.path,
            "size": self.size,
            "rows": self.rows,
        }
        if self.ignored_columns:
            doc["ignored_columns"] = list(self.ignored_columns)
        if self.missing_columns:
            doc["missing_columns"] = list(self.missing_columns)
        if self.newest_event:
            doc["newest_event"] = self.newest_event
        if self.landed:
            doc["landed"] = self.landed
        return doc


@dataclass
class Commit:
    """A commit record: which version became live and which increments it contains."""

    seq: int
    version: str
    plan_id: str
    run_id: str
    parent_seq: int
    files: list[dict[str, Any]]
    increments: list[str]
    stats: dict[str, Any] = field(default_factory=dict)
    committed_at: str = ""
    #: Partitioned tables only (registry partition_by): the version's partitions as
    #: {value: location} and their row counts.  Untouched partitions keep the location of
    #: the version that last rewrote them (reused by reference), so one version can name
    #: directories of older versions.
    partitions: dict[str, str] | None = None
    partition_rows: dict[str, int] | None = None
    #: Partitioned tables: the key index {value: index directory} (README, "Key index"). Like the data, an
    #: untouched partition keeps the index of the version that wrote it; a partition missing here has none.
    index: dict[str, str] | None = None
    #: 2: the version keeps its visible rows in ``data/`` and its tombstones in ``tombstones/``;
    #: 1 (records written before the field existed): every row in the version directory itself.
    layout: int = LAYOUT
    #: The newest increment and source event time the base holds after this commit (README, "Readers").
    freshness: dict[str, str] | None = None
    #: The table mode's own entries (``TableMode.commit_outputs``: what only that mode's outputs need,
    #: read back by the mode alone); absent for modes without any. Records written before the field
    #: existed kept them at the top level: :data:`LEGACY_OUTPUT_FIELDS`.
    outputs: dict[str, Any] | None = None
    #: The columns the version was written with (registry + what the source added or widened,
    #: ``schema_changes: evolve``) and the plan's schema changes (README, "Schema changes").
    schema: dict[str, Any] | None = None
    #: What the compaction did and how fresh the table was when it committed (``metrics.commit_metrics``;
    #: README, "Metrics and SLOs"); absent in records from before metrics existed.
    metrics: dict[str, Any] | None = None
    #: Rollback commits only (``cdc-compaction rollback``): the commit whose data this one
    #: publishes again, as {"to_seq", "to_version", "by"} (README, "Time travel and rollback").
    rollback: dict[str, Any] | None = None

    def to_json(self) -> str:
        doc = asdict(self)
        # Unpartitioned tables (and those of modes without outputs of their own) keep the record format they had.
        for key in ("partitions", "partition_rows", "index", "freshness", "outputs", "schema", "metrics", "rollback"):
            if doc[key] is None:
                del doc[key]
        return json.dumps(doc, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Commit:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError(f"a commit record is a JSON object, not {type(doc).__name__}")
        doc.setdefault("layout", 1)  # a record from before layout 2
        # A record from before ``outputs``: the mode's entries were top-level fields; read them into it.
        legacy = {key: doc.pop(key) for key in LEGACY_OUTPUT_FIELDS if key in doc}
        legacy = {key: value for key, value in legacy.items() if value is not None}
        if legacy:
            doc["outputs"] = {**legacy, **(doc.get("outputs") or {})}
        return cls(**doc)


#: Top-level fields of commit records written before :attr:`Commit.outputs` existed that belong in it
#: (read into ``outputs`` under the same key, as the mode that wrote them still reads them). Frozen:
#: new entries of a mode go into ``outputs`` only. ``history``: the ``snapshot`` mode's partitions.
LEGACY_OUTPUT_FIELDS: tuple[str, ...] = ("history",)


def _map_paths(commit: Commit, to: Callable[[str], str], layout: Layout) -> Commit:
    """``commit`` with every path it names passed through ``to`` (:meth:`Layout.abs` or :meth:`Layout.rel`):
    the partition map, the key index, the taken files' paths and the mode's output locations."""

    def paths(doc: dict[str, str] | None) -> dict[str, str] | None:
        return None if doc is None else {k: to(v) if isinstance(v, str) else v for k, v in doc.items()}

    def output(value: Any) -> Any:
        # A mode's {value: location} map (snapshot: its history partitions); other entries are not paths.
        if (
            isinstance(value, dict)
            and value
            and all(isinstance(v, str) and _is_path(v, layout) for v in value.values())
        ):
            return {k: to(v) for k, v in value.items()}
        return value

    return replace(
        commit,
        partitions=paths(commit.partitions),
        index=paths(commit.index),
        files=[{**f, "path": to(f["path"])} if isinstance(f.get("path"), str) else f for f in commit.files],
        outputs=None if commit.outputs is None else {k: output(v) for k, v in commit.outputs.items()},
    )


def _is_path(value: str, layout: Layout) -> bool:
    """A location a record names: absolute, or relative starting with one of the root's areas."""
    return _is_absolute(value) or any(value == a or value.startswith(a + "/") for a in layout.areas)


def resolved(layout: Layout, commit: Commit) -> Commit:
    """``commit`` with every path absolute under ``layout``'s root (what every reader of a record uses)."""
    return _map_paths(commit, layout.abs, layout)


def portable(layout: Layout, commit: Commit) -> Commit:
    """``commit`` with every path relative to the root (what a record on storage names)."""
    return _map_paths(commit, layout.rel, layout)


GENESIS = Commit(seq=0, version=EMPTY_VERSION, plan_id="", run_id="", parent_seq=-1, files=[], increments=[])


class Lake:
    """One table's lake: layout plus storage, with the commit-protocol primitives."""

    def __init__(self, cfg: TableConfig, storage: Storage | None = None) -> None:
        self.cfg = cfg
        self.layout = Layout.for_table(cfg)
        self.storage = storage or storage_for(self.layout.root, cfg.storage_conn_id)

    # -- commits -------------------------------------------------------------------
    def read_commit(self, seq: int) -> Commit | None:
        if seq == 0:
            return GENESIS
        path = self.layout.commit_path(seq)
        if not self.storage.exists(path):
            return None
        text = self.storage.read_text(path)  # an I/O error here may heal: it stays a StorageError
        try:
            commit = Commit.from_json(text)
            if commit.seq != seq:
                raise ValueError(f"it names commit {commit.seq!r}")
            # Records name files relative to the root (older ones absolutely, maybe under another root).
            commit = resolved(self.layout, commit)
        except (ValueError, TypeError) as exc:
            # Permanent: retrying reads the same bytes. A person must restore the record.
            raise CommitLogError(
                f"commit record {path} of {self.cfg.qualified_name} is unreadable ({exc}); "
                "restore it from the archive or backups before running again"
            ) from exc
        return commit

    def read_pointer(self) -> dict[str, Any] | None:
        """The pointer file, or None if there is none; raise :class:`StorageError` if it is unreadable."""
        if not self.storage.exists(self.layout.pointer):
            return None
        text = self.storage.read_text(self.layout.pointer)
        try:
            doc = json.loads(text)
            int(doc["seq"])
        except (ValueError, TypeError, KeyError) as exc:
            raise StorageError(
                f"pointer {self.layout.pointer} of {self.cfg.qualified_name} is unreadable ({exc!r}); it is derived "
                "from the commit records, so the next run rewrites it (readers without a metastore wait until then)"
            ) from exc
        return doc

    def latest_commit(self) -> Commit:
        """The newest commit: start at the pointer and roll forward over newer records.

        The commit records are the truth; the pointer only says where to start looking.  A
        pointer naming a record that does not exist means the log lost its newest records
        (removed, restored from an old backup): that is refused, never read as a rollback.
        """
        try:
            pointer = self.read_pointer()
        except StorageError:
            # Derived data: start from the records themselves (the pointer is rewritten on publish).
            log.exception("%s: ignoring the unreadable pointer", self.cfg.qualified_name)
            pointer = None
        seq = int(pointer["seq"]) if pointer else 0
        commit = self.read_commit(seq)
        if commit is None:
            seqs = self.commit_seqs()
            raise CommitLogError(
                f"{self.cfg.qualified_name}: the pointer {self.layout.pointer} names commit {seq} "
                f"({pointer.get('version') if pointer else '?'}), but its record {self.layout.commit_path(seq)} "
                f"does not exist (records found: {seqs[-5:] or 'none'}). The commit log lost records that readers "
                "were shown; nothing was changed. Restore the missing commit records (backups, object versioning) "
                "before running again; do not delete the pointer to get past this, it would roll the table back"
            )
        while True:
            nxt = self.read_commit(commit.seq + 1)
            if nxt is None:
                return commit
            commit = nxt

    def commit_seqs(self) -> list[int]:
        return sorted(
            int(f.name[:-5])
            for f in self.storage.list_dir(self.layout.commits)
            if f.name.endswith(".json") and f.name[:-5].isdigit()
        )

    def try_commit(self, commit: Commit) -> bool:
        """Create the commit record; False if a record with that seq exists already."""
        try:
            # Relative paths: a copied or restored lake reads its own files (docs/data.md).
            self.storage.create_exclusive(self.layout.commit_path(commit.seq), portable(self.layout, commit).to_json())
            return True
        except PreconditionFailedError:
            return False

    def data_location(self, commit: Commit) -> str:
        """The base table's location for ``commit``: exactly its visible rows (layout 1: tombstones too)."""
        return self.layout.data_dir(commit.version, commit.layout)

    def tombstones_location(self, commit: Commit) -> str:
        """The tombstones table's location for ``commit``; for layout 1 an empty directory
        (its tombstones are in the data, which the views rank and hide as before)."""
        return self.layout.tombstones_dir(commit.version, commit.layout) or str(
            self.layout.tombstones_dir(EMPTY_VERSION)
        )

    def advance_pointer(self, commit: Commit) -> bool:
        """Move the pointer to ``commit`` by compare-and-swap; never backwards. True if it moved."""
        doc = {
            "table": self.cfg.qualified_name,
            "seq": commit.seq,
            "version": commit.version,
            "layout": commit.layout,
            # A reader without a metastore reads exactly this: the visible rows, data files only.
            "location": self.data_location(commit),
            "tombstones": self.tombstones_location(commit),
            "committed_at": commit.committed_at,
        }
        if commit.partitions is not None:
            # A partitioned version is its partitions, wherever they live: readers need the map.
            doc["partitions"] = commit.partitions
        while True:
            text, token = self.storage.read_versioned(self.layout.pointer)
            if text is not None and _pointer_seq(text) > commit.seq:
                return False
            if text is not None and _pointer_seq(text) == commit.seq and _pointer_location(text) == doc["location"]:
                # Same commit, same place. (A pointer copied from another root names that root's files:
                # rewritten for this one, same commit.)
                return False
            try:
                self.storage.write_if_match(self.layout.pointer, json.dumps(doc, indent=1, sort_keys=True), token)
                return True
            except PreconditionFailedError:
                continue  # someone else moved it meanwhile: look again

    def is_archived(self, seq: int) -> bool:
        return seq == 0 or self.storage.exists(self.layout.archived_marker(seq))

    def live_location(self) -> str:
        """The live version's visible rows (what the base table reads)."""
        return self.data_location(self.latest_commit())


def _pointer_location(text: str) -> str | None:
    try:
        return str(json.loads(text)["location"])
    except (ValueError, TypeError, KeyError):
        return None


def _pointer_seq(text: str) -> int:
    """The sequence a pointer names; -1 for an unreadable one, so publishing rewrites it."""
    try:
        return int(json.loads(text)["seq"])
    except (ValueError, TypeError, KeyError):
        return -1


# ------------------------------------------------------------------------- the lease
# Who holds a lease is a string the caller makes (pipeline.runtime.lease_owner: the deployment
# id and the run id): this module does not import cdc_compaction.core.deployment, which uses Lake in its types.
@dataclass(frozen=True)
class Lease:
    """One numbered lease file: who holds the table, since and until when."""

    n: int
    owner: str
    acquired_at: str
    expires_at: str
    released: bool = False

    def expired(self, now: datetime) -> bool:
        return datetime.fromisoformat(self.expires_at) <= now

    def describe(self) -> str:
        return f"lease {self.n} of {self.owner}, taken {self.acquired_at}, expires {self.expires_at}"


class TableLease:
    """The lease of one table (see the module docstring)."""

    KEEP = 20  # old lease files kept for the record

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.layout = lake.layout
        self.storage = lake.storage

    def current(self) -> Lease | None:
        numbers = sorted(
            int(e.name[:-5])
            for e in self.storage.list_dir(self.layout.leases)
            if e.name.endswith(".json") and e.name[:-5].isdigit()
        )
        if not numbers:
            return None
        n = numbers[-1]
        path = self.layout.lease_path(n)
        released = self.storage.exists(self.layout.lease_released(n))
        try:
            doc = json.loads(self.storage.read_text(path))
            datetime.fromisoformat(doc["expires_at"])
            return Lease(n, str(doc["owner"]), str(doc["acquired_at"]), str(doc["expires_at"]), released)
        except (ValueError, TypeError, KeyError) as exc:
            # Whoever wrote it may still be running: an unreadable lease is held until broken.
            log.error("%s: lease file %s is unreadable (%r)", self.lake.cfg.qualified_name, path, exc)
            return Lease(
                n,
                f"<unreadable lease file {path}: {exc!r}>",
                "?",
                datetime.max.replace(tzinfo=UTC).isoformat(),
                released,
            )

    def acquire(self, owner: str, ttl: timedelta, now: datetime) -> Lease:
        """Take (or renew) the lease for ``owner``; raise :class:`ConcurrentRunError` if someone else holds it."""
        held = self.current()
        if held is not None and not held.released and held.owner != owner and not held.expired(now):
            raise ConcurrentRunError(
                f"{self.lake.cfg.qualified_name} is being compacted by another run ({held.describe()}). "
                "This run changed nothing; it can run again once that run finishes. If that run is dead and "
                "will not be retried, wait for the lease to expire or break it with "
                f"`cdc-compaction lease break {self.lake.cfg.qualified_name}`"
            )
        n = (held.n + 1) if held is not None else 1
        lease = Lease(n, owner, now.isoformat(), (now + ttl).isoformat())
        try:
            self.storage.create_exclusive(self.layout.lease_path(n), json.dumps(asdict(lease), indent=1))
        except PreconditionFailedError as exc:
            winner = self.current()
            raise ConcurrentRunError(
                f"{self.lake.cfg.qualified_name}: another run took the lease at the same moment "
                f"({winner.describe() if winner else 'lease ' + str(n)}). This run changed nothing; run it again "
                "after that run finishes"
            ) from exc
        self._forget_old(n)
        return lease

    def holds(self, owner: str, now: datetime) -> bool:
        held = self.current()
        return held is not None and held.owner == owner and not held.released and not held.expired(now)

    def release(self, owner: str) -> bool:
        """Give the lease back if ``owner`` holds it. True if it was released here."""
        held = self.current()
        if held is None or held.owner != owner or held.released:
            return False
        self.storage.write_text(self.layout.lease_released(held.n), json.dumps({"released_by": owner}))
        return True

    def break_(self, by: str) -> Lease | None:
        """Release whatever lease is held (an operator's decision that its run is dead)."""
        held = self.current()
        if held is None or held.released:
            return None
        self.storage.write_text(self.layout.lease_released(held.n), json.dumps({"broken_by": by}))
        return held

    def _forget_old(self, n: int) -> None:
        for e in self.storage.list_dir(self.layout.leases):
            stem = e.name.split(".")[0]
            if stem.isdigit() and int(stem) <= n - self.KEEP:
                self.storage.delete(e.path)


def kept_seqs(live_seq: int, keep_versions: int) -> range:
    """The commits whose versions ``keep_versions`` keeps: the live one and those just before it."""
    return range(max(0, live_seq - keep_versions + 1), live_seq + 1)
