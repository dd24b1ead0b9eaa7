"""Re-landed increments (issue 35): a file landed again under a name a commit took is new input.

docs/data.md tells users to re-land archived increments by copying them back under their old
names.  Such a file -- same content or new -- must be compacted by the very next run, and the
views (Spark over the metastore, DuckDB over the files) must show what that run produces.  A
committed file still in place (its archive not done yet) is not taken twice.

On real storage, metastore and Spark, through the DAG's task functions.  The expectations
are written from the contract (/work/shared/conformance/README.md) alone.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import compact_once, finish_run

from cdc_compaction.devtools.conformance import DuckDBReader, Reader, land
from cdc_compaction.pipeline.pending import pending_files, taken
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.runtime import utcnow
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import validate
from cdc_compaction.pipeline.views import refresh_view

from .helpers import run_job, student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

INC = "increment_2026112200"


def _rows(rows: list[dict[str, Any]]) -> dict[int, tuple[str, int]]:
    return {r["id"]: (r["full_name"], r["ts_ms"]) for r in rows}


def _cfg(make_cfg: Any, tmp_path: Path) -> Any:
    return make_cfg(views={"duckdb": str(tmp_path / "duck" / "views.sql")})


def _views(spark: Any, cfg: Any) -> tuple[dict[int, tuple[str, int]], dict[int, tuple[str, int]]]:
    return _rows(Reader(spark).view(cfg)), _rows(DuckDBReader().view(cfg))


def _base(spark: Any, cfg: Any) -> dict[int, tuple[str, int]]:
    return _rows(Reader(spark).visible_base(cfg))


def _archived(rt: Any, seq: int) -> Path:
    return Path(rt.lake.layout.archive, f"c{seq:08d}", INC)


@pytest.mark.parametrize("how", ["copy2", "copy", "move"])
def test_a_copied_back_increment_is_compacted_by_the_next_run(make_cfg, runtime, spark, tmp_path, how) -> None:
    """docs/data.md's re-land: copy the archived increment back (mtime kept or not), or move it back (inode
    and mtime kept); the next plan takes it."""
    rt = runtime(_cfg(make_cfg, tmp_path))
    cfg = rt.cfg
    ensure_tables(rt)
    land(cfg, INC, [student_rows((1, "Ada", "c", 10), (2, "Bob", "c", 10))])
    assert compact_once(rt, "run-1")
    assert not Path(rt.lake.layout.incremental, INC).exists(), "archived"
    # The user re-lands increment 00 exactly as archived (identical content, same names) right after
    # the commit that took it, and a later increment lands beside it.
    copy = getattr(shutil, how)
    archived_files = sorted(_archived(rt, 1).iterdir())
    dst = Path(rt.lake.layout.incremental, INC)
    dst.mkdir(parents=True)
    for f in archived_files:
        copy(f, dst / f.name)
    land(cfg, "increment_2026112201", [student_rows((1, "Ada L.", "u", 20))])
    refresh_view(rt)
    expected = {1: ("Ada L.", 20), 2: ("Bob", 10)}  # the re-delivered events change nothing (idempotence)
    assert _views(spark, cfg) == (expected, expected)
    path = plan(rt, "run-2")
    assert path, "the re-landed increment is pending: the next plan takes it"
    doc = json.loads(Path(path).read_text())
    assert [(f["increment"], f["name"]) for f in doc["files"]] == [
        (INC, "part-00000.parquet"),
        ("increment_2026112201", "part-00000.parquet"),
    ]
    finish_run(rt, path)
    assert _base(spark, cfg) == expected
    assert not dst.exists(), "archived again"
    assert _views(spark, cfg) == (expected, expected)
    assert compact_once(rt, "run-3") == "", "nothing is taken twice"


def test_new_content_under_an_old_name_is_compacted_by_the_next_run(make_cfg, runtime, spark, tmp_path) -> None:
    rt = runtime(_cfg(make_cfg, tmp_path))
    cfg = rt.cfg
    ensure_tables(rt)
    land(cfg, INC, [student_rows((1, "Ada", "c", 10), (2, "Bob", "c", 10))])
    assert compact_once(rt, "run-1")
    # The sink lands the hour again, under the same file name, with other events.
    land(cfg, INC, [student_rows((2, "Bob B.", "u", 30), (3, "Cy", "c", 30))])
    refresh_view(rt)
    expected = {1: ("Ada", 10), 2: ("Bob B.", 30), 3: ("Cy", 30)}
    assert _views(spark, cfg) == (expected, expected)
    assert compact_once(rt, "run-2"), "the next plan takes the file"
    assert _base(spark, cfg) == expected
    assert _views(spark, cfg) == (expected, expected)


def test_a_committed_file_still_in_place_is_not_taken_twice(make_cfg, runtime, spark, tmp_path) -> None:
    """Between publish and archive the committed files are still in the landing area: they are not pending."""
    rt = runtime(_cfg(make_cfg, tmp_path))
    cfg = rt.cfg
    ensure_tables(rt)
    land(cfg, INC, [student_rows((1, "Ada", "c", 10))])
    path = plan(rt, "run-1")
    run_job(rt, path)
    validate(rt, path)
    publish(rt, path)  # no archive: the run stopped here
    assert Path(rt.lake.layout.incremental, INC, "part-00000.parquet").exists()
    refresh_view(rt)
    duck = DuckDBReader().view(cfg)
    assert _rows(duck) == {1: ("Ada", 10)}
    assert pending_files(rt, utcnow(), taken(rt.lake.latest_commit().files)).files == []
    # The next plan (once the stopped run's lease expired) finishes the archive first, then finds nothing.
    assert plan(rt, "run-2", now=utcnow() + timedelta(days=1)) == ""
    assert not Path(rt.lake.layout.incremental, INC).exists()
    assert _base(spark, cfg) == {1: ("Ada", 10)}


@pytest.mark.parametrize("touch", ["chmod", "hard_link"])
def test_a_committed_file_whose_permissions_or_links_change_is_not_taken_again(
    make_cfg, runtime, spark, tmp_path, touch
) -> None:
    """An operator's chmod, or a backup tool's hard link, of a committed file still in place changes its
    status-change time only: the same landing, not a new one (a keyless or append table would count
    its rows twice)."""
    rt = runtime(_cfg(make_cfg, tmp_path))
    cfg = rt.cfg
    ensure_tables(rt)
    land(cfg, INC, [student_rows((1, "Ada", "c", 10))])
    path = plan(rt, "run-1")
    run_job(rt, path)
    validate(rt, path)
    publish(rt, path)  # no archive yet: the file is still in the landing area
    landed = Path(rt.lake.layout.incremental, INC, "part-00000.parquet")
    if touch == "chmod":
        landed.chmod(0o600)
    else:
        os.link(landed, tmp_path / "backup-link.parquet")
    assert pending_files(rt, utcnow(), taken(rt.lake.latest_commit().files)).files == []


def test_a_file_landed_again_before_its_archive_is_not_archived_in_its_place(
    make_cfg, runtime, spark, tmp_path
) -> None:
    """Archive moves only the landing a commit took: new content under its name waits for the next run."""
    rt = runtime(_cfg(make_cfg, tmp_path))
    cfg = rt.cfg
    ensure_tables(rt)
    land(cfg, INC, [student_rows((1, "Ada", "c", 10), (2, "Bob", "c", 10))])
    path = plan(rt, "run-1")
    run_job(rt, path)
    validate(rt, path)
    publish(rt, path)  # the run stops before its archive
    land(cfg, INC, [student_rows((2, "Bob B.", "u", 30), (3, "Cy", "c", 30))])  # replaced in place
    refresh_view(rt)
    expected = {1: ("Ada", 10), 2: ("Bob B.", 30), 3: ("Cy", 30)}
    assert _views(spark, cfg) == (expected, expected)
    later = utcnow() + timedelta(days=1)  # the stopped run's lease has expired
    path = plan(rt, "run-2", now=later)
    assert path, "the replacement is the next run's input, not archived as commit 1's file"
    marker = json.loads(Path(rt.lake.layout.archived_marker(1)).read_text())
    assert [Path(p).name for p in marker["landed_again"]] == ["part-00000.parquet"]
    assert not _archived(rt, 1).joinpath("part-00000.parquet").exists()
    finish_run(rt, path, now=later)
    assert _base(spark, cfg) == expected
    assert _archived(rt, 2).joinpath("part-00000.parquet").exists()
    assert _views(spark, cfg) == (expected, expected)
