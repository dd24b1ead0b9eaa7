"""The retention policy for archives, quarantine and audit records (README, "Retention"; issue 14, section 5).

"Archived increments and re-ingested quarantine entries stay for ``archive_retention``; an
archive a kept version still needs for a rebuild stays regardless; a quarantine entry still
waiting for its re-ingest and everything under ``_cdc/audit/`` are never deleted."  Fast: a
real lake on local storage with commit records, archives and manifests written by hand; no Spark.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.ownership import claim
from cdc_compaction.pipeline.rebuild import replay_start
from cdc_compaction.pipeline.retention import expirable_archives, expire_archives
from cdc_compaction.pipeline.runtime import Runtime

NOW = datetime(2026, 11, 26, 12, tzinfo=UTC)
OLD = (NOW - timedelta(days=30)).isoformat()
RECENT = (NOW - timedelta(days=1)).isoformat()


def test_nothing_expires_without_a_retention() -> None:
    assert expirable_archives([(1, OLD), (2, OLD)], oldest_kept_seq=2, retention=None, now=NOW) == []


def test_only_archives_older_than_the_retention_and_held_by_the_oldest_kept_version_expire() -> None:
    archived = [(1, OLD), (2, RECENT), (3, OLD), (4, OLD), (5, OLD)]
    # Commit 4 is the oldest kept version: it holds commits 1-4; 5's archive is needed to rebuild from it.
    assert expirable_archives(archived, oldest_kept_seq=4, retention=timedelta(days=7), now=NOW) == [1, 3, 4]
    # A record without a commit time (unreadable age) is kept.
    assert expirable_archives([(1, "")], oldest_kept_seq=4, retention=timedelta(days=7), now=NOW) == []


def _write(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _manifest(path: Path, created_at: str, reingested_at: str | None) -> None:
    kind = path.parent.name
    doc = {"kind": kind, "created_at": created_at, "reingested_at": reingested_at}
    # The two manifests' shapes, as quarantine.py writes them.
    doc.update({"rows": 1, "by_reason": {"bad": 1}} if kind == "rows" else {"files": [{"reason": "bad: x"}]})
    _write(path / "_manifest.json", json.dumps(doc))
    _write(path / "part-0.parquet")


def test_expire_archives_keeps_what_a_kept_version_waiting_quarantine_or_an_audit_needs(make_cfg) -> None:
    cfg = make_cfg(keep_versions=2, archive_retention="7d")
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    root = Path(lake.layout.root)
    commits = []
    for seq in (1, 2, 3, 4):
        inc = f"increment_202611220{seq}"
        version = f"v{seq:08d}-p{seq}"
        files = [{"increment": inc, "name": "f.parquet", "path": f"{lake.layout.incremental}/{inc}/f.parquet"}]
        commit = Commit(seq, version, f"p{seq}", f"run-{seq}", seq - 1, files, [inc], committed_at=OLD, layout=2)
        assert lake.try_commit(commit)
        commits.append(commit)
        _write(root / "archive" / f"c{seq:08d}" / inc / "f.parquet")
        _write(Path(lake.layout.archived_marker(seq)), "{}")
    for seq in (3, 4):  # keep_versions: 2 -- the versions of commits 3 and 4 exist
        (root / "base" / f"v{seq:08d}-p{seq}" / "data").mkdir(parents=True)
    _manifest(root / "quarantine" / "rows" / "v00000001-p1", OLD, OLD)  # re-ingested long ago
    _manifest(root / "quarantine" / "rows" / "v00000002-p2", OLD, None)  # still waiting
    _manifest(root / "quarantine" / "files" / "p3", OLD, RECENT)  # re-ingested yesterday
    _write(root / "_cdc" / "audit" / "erase-1.json", "{}")

    rt = Runtime(cfg=cfg, lake=lake, metastore=None, engine=None)  # type: ignore[arg-type]
    removed = expire_archives(rt, live_seq=4, now=NOW)

    assert sorted(removed) == [
        "archive/c00000001",
        "archive/c00000002",
        "archive/c00000003",
        "quarantine/rows/v00000001-p1",
    ]
    assert sorted(p.name for p in (root / "archive").iterdir()) == ["c00000004"]
    assert (root / "quarantine" / "rows" / "v00000002-p2" / "part-0.parquet").exists()
    assert (root / "quarantine" / "files" / "p3" / "part-0.parquet").exists()
    assert (root / "_cdc" / "audit" / "erase-1.json").exists()
    # The archived markers stay: the commits were archived, their files are not pending.
    assert all(lake.is_archived(s) for s in (1, 2, 3, 4))

    # A rebuild now starts at the oldest kept version that holds the expired archives.
    start, todo = replay_start(lake, commits, None)
    assert (start.seq, [c.seq for c in todo]) == (3, [4])


def test_without_archive_retention_nothing_is_deleted(make_cfg) -> None:
    cfg = make_cfg(keep_versions=1)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    root = Path(lake.layout.root)
    _write(root / "archive" / "c00000001" / "increment_2026112201" / "f.parquet")
    _manifest(root / "quarantine" / "rows" / "v00000001-p1", OLD, OLD)
    rt = Runtime(cfg=cfg, lake=lake, metastore=None, engine=None)  # type: ignore[arg-type]
    assert expire_archives(rt, live_seq=5, now=NOW) == []
    assert (root / "archive" / "c00000001" / "increment_2026112201" / "f.parquet").exists()
    assert (root / "quarantine" / "rows" / "v00000001-p1" / "part-0.parquet").exists()
