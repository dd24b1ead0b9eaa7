"""The ``archive`` step: copy, verify, delete -- only what a commit took.

On real storage, metastore and Spark (moved here from ``tests/test_tasks.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc_compaction.core.exceptions import (
    ArchiveError,
)
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.tables import ensure_tables

from .helpers import staged, student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def test_archive_survives_half_done_state_and_refuses_lost_files(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [student_rows((1, "a", "c", 1)), student_rows((2, "b", "c", 1))])
    path = staged(rt, "run-1")
    publish(rt, path)
    inc = Path(rt.lake.layout.incremental) / "increment_2026112200"
    arch = Path(rt.lake.layout.archive) / "c00000001" / "increment_2026112200"
    # Half-archived: the first file copied and deleted, the second copied only.
    arch.mkdir(parents=True)
    (arch / "part-00000.parquet").write_bytes((inc / "part-00000.parquet").read_bytes())
    (inc / "part-00000.parquet").unlink()
    (arch / "part-00001.parquet").write_bytes((inc / "part-00001.parquet").read_bytes())
    result = archive(rt, path)
    assert result["archived_files"] == 1
    assert sorted(p.name for p in arch.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert not inc.exists()

    rt2 = runtime(make_cfg())
    ensure_tables(rt2)
    land(rt2.cfg, "increment_2026112200", [student_rows((1, "a", "c", 1))])
    path2 = staged(rt2, "run-1")
    publish(rt2, path2)
    (Path(rt2.lake.layout.incremental) / "increment_2026112200" / "part-00000.parquet").unlink()
    with pytest.raises(ArchiveError, match="neither in the landing area nor archived"):
        archive(rt2, path2)


def test_archive_deletes_only_the_files_it_archived(make_cfg, runtime, monkeypatch) -> None:
    """A writer's temporaries and files landing during archive stay; checksums of archived files go."""
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [student_rows((1, "a", "c", 1))])
    land(rt.cfg, "increment_2026112201", [student_rows((2, "b", "c", 1))])
    inc0 = Path(rt.lake.layout.incremental) / "increment_2026112200"
    inc1 = Path(rt.lake.layout.incremental) / "increment_2026112201"
    # A checksum beside the file (not Hadoop's hidden .x.crc: the local reader would verify it).
    (inc0 / "part-00000.parquet.crc").write_bytes(b"crc")
    path = staged(rt, "run-1")
    publish(rt, path)
    # After the plan: a writer starts a file in increment 00 (hidden), and one lands in 01 while
    # archive lists the directory (between what used to be its two listings).
    (inc0 / ".part-00001.parquet.inprogress").write_bytes(b"half a file")
    real_list_dir = rt.lake.storage.list_dir
    landed_late: list[Path] = []

    def list_dir(d: str) -> list[Any]:
        out = real_list_dir(d)
        if Path(d) == inc1 and not landed_late:
            landed_late.append(inc1 / "part-00009.parquet")
            landed_late[0].write_bytes(b"landed during archive")
        return out

    monkeypatch.setattr(rt.lake.storage, "list_dir", list_dir)
    result = archive(rt, path)
    monkeypatch.undo()
    assert result["archived_files"] == 2
    assert sorted(p.name for p in inc0.iterdir()) == [".part-00001.parquet.inprogress"], "the checksum went along"
    assert sorted(p.name for p in inc1.iterdir()) == ["part-00009.parquet"], "a file archive never copied stays"
    assert result["dropped_partitions"] == []
    arch = Path(rt.lake.layout.archive) / "c00000001"
    assert sorted(str(p.relative_to(arch)) for p in arch.rglob("*") if p.is_file()) == [
        "increment_2026112200/part-00000.parquet",
        "increment_2026112201/part-00000.parquet",
    ]
