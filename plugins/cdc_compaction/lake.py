"""The lake layout of one table and its commit protocol.

Layout under a table's storage root::

    incremental/increment_YYYYMMDDHH/*.parquet   change files, as the CDC sink lands them
    base/v00000007-<plan>/                       base versions; the live one is named by
                                                 the latest commit record
    archive/c00000007/increment_.../             increments after they were compacted
    quarantine/v00000007-<plan>/                 rows refused by that compaction, with reasons
    _cdc/plans/<plan>.json                       exact inputs of a run (retries reuse it)
    _cdc/commits/00000007.json                   commit records: the source of truth
    _cdc/commits/00000007.archived               archive of that commit finished
    _cdc/pointer.json                            live version, for readers without a metastore

The commit record, created with create-if-absent, is the single atomic decision of
a run.  The metastore location and the pointer are derived from it and repaired by
the next run if a crash came between them ("roll forward").
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import asdict, dataclass, field
from typing import Any

from cdc_compaction.exceptions import PreconditionFailedError, StorageError
from cdc_compaction.registry import TableConfig
from cdc_compaction.settings import resolve_storage_root
from cdc_compaction.storage import Storage, storage_for

EMPTY_VERSION = "v00000000-empty"


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
    def staging(self) -> str:
        """Where the compactor table points before anything was compacted."""
        return posixpath.join(self.control, "staging-empty")

    def version_dir(self, version: str) -> str:
        return posixpath.join(self.base, version)

    def quarantine_dir(self, version: str) -> str:
        return posixpath.join(self.quarantine, version)

    def commit_path(self, seq: int) -> str:
        return posixpath.join(self.commits, f"{seq:08d}.json")

    def archived_marker(self, seq: int) -> str:
        return posixpath.join(self.commits, f"{seq:08d}.archived")

    def plan_path(self, plan_id: str) -> str:
        return posixpath.join(self.plans, f"{plan_id}.json")


@dataclass(frozen=True)
class PlannedFile:
    """One change file a plan takes as input."""

    increment: str
    name: str
    path: str
    size: int
    rows: int = 0

    @property
    def rel(self) -> str:
        return f"{self.increment}/{self.name}"


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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Commit:
        return cls(**json.loads(text))


GENESIS = Commit(seq=0, version=EMPTY_VERSION, plan_id="", run_id="", parent_seq=-1, files=[], increments=[])


class Lake:
    """One table's lake: layout plus storage, with the commit-protocol primitives."""

    def __init__(self, cfg: TableConfig, storage: Storage | None = None) -> None:
        self.cfg = cfg
        self.layout = Layout.for_table(cfg)
        self.storage = storage or storage_for(self.layout.root)

    # -- commits -------------------------------------------------------------------
    def read_commit(self, seq: int) -> Commit | None:
        if seq == 0:
            return GENESIS
        path = self.layout.commit_path(seq)
        if not self.storage.exists(path):
            return None
        try:
            return Commit.from_json(self.storage.read_text(path))
        except (ValueError, TypeError) as exc:
            raise StorageError(
                f"commit record {path} of {self.cfg.qualified_name} is unreadable ({exc}); "
                "restore it from the archive or backups before running again"
            ) from exc

    def read_pointer(self) -> dict[str, Any] | None:
        if not self.storage.exists(self.layout.pointer):
            return None
        return json.loads(self.storage.read_text(self.layout.pointer))

    def latest_commit(self) -> Commit:
        """The newest commit: start at the pointer and roll forward over newer records."""
        pointer = self.read_pointer()
        seq = int(pointer["seq"]) if pointer else 0
        commit = self.read_commit(seq)
        if commit is None:
            # The pointer names a record that is gone: fall back to a full listing.
            seqs = self.commit_seqs()
            seq = seqs[-1] if seqs else 0
            commit = self.read_commit(seq)
            assert commit is not None
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
            self.storage.create_exclusive(self.layout.commit_path(commit.seq), commit.to_json())
            return True
        except PreconditionFailedError:
            return False

    def write_pointer(self, commit: Commit) -> None:
        doc = {
            "table": self.cfg.qualified_name,
            "seq": commit.seq,
            "version": commit.version,
            "location": self.layout.version_dir(commit.version),
            "committed_at": commit.committed_at,
        }
        self.storage.write_text(self.layout.pointer, json.dumps(doc, indent=1, sort_keys=True))

    def is_archived(self, seq: int) -> bool:
        return seq == 0 or self.storage.exists(self.layout.archived_marker(seq))

    def live_location(self) -> str:
        return self.layout.version_dir(self.latest_commit().version)
