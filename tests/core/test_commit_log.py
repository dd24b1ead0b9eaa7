"""The commit log, the pointer, the lease and the storage root when something outside tampered with them.

Each case used to end in a silent rollback, a near-empty base or a raw ``JSONDecodeError``;
now each stops with an error that names the file and what to do, or heals what is
derived data (the pointer).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import compact_once, student_doc, visible_names

from cdc_compaction.core.exceptions import CommitLogError, ConcurrentRunError, StorageError, StorageRootMismatchError
from cdc_compaction.core.lake import TableLease
from cdc_compaction.core.registry import parse_table
from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.runtime import Runtime, utcnow
from cdc_compaction.pipeline.tables import ensure_tables

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def _rows(*items: tuple[int, str | None, str, int]) -> list[dict[str, Any]]:
    return [{"id": i, "full_name": n, "op": op, "ts_ms": ts} for i, n, op, ts in items]


def _two_commits(make_cfg: Any, runtime: Any, **overrides: Any) -> Runtime:
    rt = runtime(make_cfg(**overrides))
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1), (2, "Bob", "c", 1))])
    compact_once(rt, "run-1")
    land(rt.cfg, "increment_2026112201", [_rows((1, "Alicia", "u", 2), (3, "Cy", "c", 2))])
    compact_once(rt, "run-2")
    return rt


@pytest.mark.parametrize("pointer", ["kept", "removed too"])
def test_a_removed_latest_commit_record_is_refused_not_rolled_back(make_cfg, runtime, spark, pointer) -> None:
    rt = _two_commits(make_cfg, runtime)
    live = rt.lake.live_location()
    Path(rt.lake.layout.commit_path(2)).unlink()
    if pointer == "removed too":
        Path(rt.lake.layout.pointer).unlink()  # only the metastore still tells
    land(rt.cfg, "increment_2026112202", [_rows((4, "Di", "c", 3))])
    with pytest.raises(CommitLogError, match="commit 2") as err:
        compact_once(rt, "run-3")
    assert "Restore the missing commit records" in str(err.value)
    assert Path(live).is_dir(), "the newer version was not cleaned up"
    assert visible_names(spark, rt.cfg) == {1: "Alicia", 2: "Bob", 3: "Cy"}


#: Damaged commit records: cut off, empty, JSON of the wrong shape.
DAMAGED_RECORDS = ['{"seq": 2, "vers', "", "null", "[]", '{"seq": 2}']


def test_a_truncated_commit_record_is_refused_at_once(make_cfg, runtime, monkeypatch) -> None:
    """Retrying reads the same bytes: a damaged record is a permanent error, the task fails at once.

    Each damage in turn on one table, each met by another run: the refused plan recorded nothing, so it
    gives its lease back, and the next run meets the damage, not a lease held for hours by a dead run
    (after the record is restored, the next hour's run must not need a ``lease break``).  Then the last
    damage through the DAG's own plan callable.
    """
    from airflow.sdk.exceptions import AirflowFailException

    from cdc_compaction.airflow import factory
    from cdc_compaction.core.exceptions import is_permanent

    rt = _two_commits(make_cfg, runtime)
    for content in DAMAGED_RECORDS:
        Path(rt.lake.layout.commit_path(2)).write_text(content)
        with pytest.raises(CommitLogError, match=r"00000002.json .* is unreadable") as err:
            plan(rt, f"run-3-{len(content)}")
        assert is_permanent(err.value), content
        held = TableLease(rt.lake).current()
        assert held is None or held.released, f"{content!r}: the refused plan kept its lease {held}"
    # Through the DAG's own plan callable: no retry, the owner is alerted now.
    monkeypatch.setattr(factory, "_runtime", lambda cfg: rt)
    plan_task = factory.build_dag(rt.cfg).get_task("plan")
    with pytest.raises(AirflowFailException, match="CommitLogError"):
        plan_task.python_callable(run_id="run-3")


def test_a_commit_record_of_another_number_is_refused(make_cfg, runtime) -> None:
    rt = _two_commits(make_cfg, runtime)
    Path(rt.lake.layout.commit_path(2)).write_text(Path(rt.lake.layout.commit_path(1)).read_text())
    with pytest.raises(CommitLogError, match=r"00000002.json .*\(it names commit 1\)"):
        plan(rt, "run-3")


def test_a_corrupt_pointer_is_rebuilt_from_the_commit_records(make_cfg, runtime, spark) -> None:
    """Each damage in turn on one table: the pointer is refused and the latest commit found from the
    records without writing anything; then the next compaction publishes over the last damage."""
    rt = _two_commits(make_cfg, runtime)
    for content in ["", "{", "null", '{"seq": "two"}', "[]"]:
        Path(rt.lake.layout.pointer).write_text(content)
        with pytest.raises(StorageError, match=r"pointer .* is unreadable"):
            rt.lake.read_pointer()
        assert rt.lake.latest_commit().seq == 2, content
        assert Path(rt.lake.layout.pointer).read_text() == content, "reading rewrote the pointer"
    land(rt.cfg, "increment_2026112202", [_rows((4, "Di", "c", 3))])
    compact_once(rt, "run-3")
    assert rt.lake.read_pointer()["seq"] == 3  # type: ignore[index]
    assert visible_names(spark, rt.cfg) == {1: "Alicia", 2: "Bob", 3: "Cy", 4: "Di"}


def _cli(registry: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins"), "CDC_REGISTRY_DIR": str(registry)}
    return subprocess.run([sys.executable, "-m", "cdc_compaction", *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize(
    "content", ["", "{not json", '{"owner": "x"}', '{"owner": "x", "acquired_at": 1, "expires_at": "soon"}']
)
def test_a_corrupt_lease_is_held_until_broken_and_lease_break_works(make_cfg, runtime, tmp_path, content) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1))])
    TableLease(rt.lake).acquire("someone/run", rt.cfg.lease_timeout, utcnow())
    Path(rt.lake.layout.lease_path(1)).write_text(content)
    with pytest.raises(ConcurrentRunError, match=r"unreadable lease file .*00000001.json") as err:
        plan(rt, "run-1")
    assert "lease break" in str(err.value)
    registry = tmp_path / "registry"
    registry.mkdir()
    doc = rt.cfg.model_dump(mode="json", exclude_defaults=True)
    (registry / f"{rt.cfg.qualified_name}.yaml").write_text(yaml.safe_dump(doc))
    shown = _cli(registry, "lease", "show", rt.cfg.qualified_name)
    assert shown.returncode == 0 and "unreadable lease file" in shown.stdout, shown.stdout + shown.stderr
    broke = _cli(registry, "lease", "break", rt.cfg.qualified_name)
    assert broke.returncode == 0 and "broke lease 1" in broke.stdout, broke.stdout + broke.stderr
    assert plan(rt, "run-1") != ""


def _moved(rt: Runtime, new_root: Path) -> Runtime:
    doc = student_doc(new_root.parent, rt.cfg.table, database=rt.cfg.database)
    doc["storage_root"] = str(new_root)
    return Runtime(
        cfg=parse_table(doc),
        lake=type(rt.lake)(parse_table(doc)),
        metastore=rt.metastore,
        engine=rt.engine,
    )


def test_a_storage_root_changed_without_the_data_is_refused(make_cfg, runtime, spark, tmp_path) -> None:
    rt = _two_commits(make_cfg, runtime)
    moved = _moved(rt, tmp_path / "elsewhere" / rt.cfg.table)
    land(moved.cfg, "increment_2026112202", [_rows((4, "Di", "c", 3))])
    for step in (lambda: ensure_tables(moved), lambda: plan(moved, "run-3")):
        with pytest.raises(StorageRootMismatchError, match="has no record of that commit") as err:
            step()
        assert "field 'storage_root'" in str(err.value) and rt.lake.live_location() in str(err.value)
    assert visible_names(spark, rt.cfg) == {1: "Alicia", 2: "Bob", 3: "Cy"}


def test_a_storage_root_moved_with_its_data_is_followed(make_cfg, runtime, spark, tmp_path) -> None:
    rt = _two_commits(make_cfg, runtime)
    new_root = tmp_path / "elsewhere" / rt.cfg.table
    shutil.copytree(rt.lake.layout.root, new_root)
    moved = _moved(rt, new_root)
    ensure_tables(moved)
    land(moved.cfg, "increment_2026112202", [_rows((4, "Di", "c", 3))])
    compact_once(moved, "run-3")
    assert moved.lake.live_location().startswith(str(new_root))
    assert visible_names(spark, moved.cfg) == {1: "Alicia", 2: "Bob", 3: "Cy", 4: "Di"}
