"""Every task of every run is re-entrant, in any order: nothing a commit references is written again.

Clearing ``compact`` (or ``validate``, ``publish``, ``archive``) of a run that already
published is the most common operator action in the Airflow UI.  A second compaction
of an already-published plan used to write into the live version directory: killed
mid-write, a 300,000-row base became 0 rows.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import compact_once, snapshot_state, visible_names

from cdc_compaction.core.exceptions import ConcurrentCommitError
from cdc_compaction.core.lake import Commit
from cdc_compaction.devtools.conformance import land
from cdc_compaction.job.contract import Plan
from cdc_compaction.job.faults import ENV as FAULTS_ENV
from cdc_compaction.pipeline import order
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.plan import plan as run_plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import validate

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def _rows(*items: tuple[int, str | None, str, int]) -> list[dict[str, Any]]:
    return [{"id": i, "full_name": n, "op": op, "ts_ms": ts} for i, n, op, ts in items]


def _tree(root: str) -> dict[str, str]:
    """Every file under ``root`` with a hash of its content (what readers of that directory get)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in Path(root).rglob("*")
        if p.is_file()
    }


def _step(rt: Runtime, name: str, plan_path: str, run_id: str) -> Any:
    """One task of the DAG, as its callable runs it."""
    return order.step(name).call(rt, plan_path, run_id)


def _published(make_cfg: Any, runtime: Any) -> tuple[Runtime, str, dict[str, str]]:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1), (2, "Bob", "c", 1))])
    compact_once(rt, "run-1")
    land(rt.cfg, "increment_2026112201", [_rows((1, "Alicia", "u", 2), (3, "Cy", "c", 2), (9, None, "x", 2))])
    path = compact_once(rt, "run-2")
    return rt, path, _tree(rt.lake.live_location())


STEPS = ["compact", "validate", "publish", "archive", "refresh_view", "plan"]


@pytest.mark.parametrize("order", [list(o) for o in itertools.islice(itertools.permutations(STEPS), 0, None, 179)])
def test_rerunning_the_steps_of_a_published_run_in_any_order_changes_nothing(make_cfg, runtime, spark, order) -> None:
    rt, path, live_files = _published(make_cfg, runtime)
    live, commit = rt.lake.live_location(), rt.lake.latest_commit()
    for name in order + order:
        _step(rt, name, path, "run-2")
    assert rt.lake.latest_commit() == commit
    assert rt.lake.live_location() == live
    assert _tree(live) == live_files, "a published version directory was written again"
    assert visible_names(spark, rt.cfg) == {1: "Alicia", 2: "Bob", 3: "Cy"}


def test_compaction_of_a_published_plan_writes_nothing(make_cfg, runtime) -> None:
    rt, path, _ = _published(make_cfg, runtime)
    base = Path(rt.lake.layout.base)
    before = sorted(p.name for p in base.iterdir())
    assert _step(rt, "compact", path, "run-2") == {
        "plan_id": json.loads(Path(path).read_text())["plan_id"],
        "table": rt.cfg.qualified_name,
        "already_committed": True,
    }
    assert sorted(p.name for p in base.iterdir()) == before, "no new directory either"
    assert validate(rt, path)["already_committed"] is True


def test_a_second_attempt_killed_mid_write_never_touches_the_validated_one(
    make_cfg, runtime, spark, monkeypatch
) -> None:
    """compact, validate, then compact again and kill it: publish commits the validated attempt, whole."""
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows(*[(i, f"n{i}", "c", 1) for i in range(50)])])
    path = run_plan(rt, "run-1")
    _step(rt, "compact", path, "run-1")
    first = validate(rt, path)
    first_files = _tree(first["output_location"])
    monkeypatch.setenv(FAULTS_ENV, "compact.before_stats=raise")
    with pytest.raises(RuntimeError, match="injected fault"):
        _step(rt, "compact", path, "run-1")
    monkeypatch.delenv(FAULTS_ENV)
    # The killed attempt wrote a directory of its own, beside the validated one.
    attempts = sorted(p.name for p in Path(rt.lake.layout.base).iterdir() if p.name.startswith("v00000001-"))
    assert len(attempts) == 2
    assert publish(rt, path)["version"] == first["version"]
    assert _tree(first["output_location"]) == first_files
    archive(rt, path)
    assert len(visible_names(spark, rt.cfg)) == 50
    # The unfinished attempt is garbage: the next publish's cleanup removes it.
    land(rt.cfg, "increment_2026112201", [_rows((50, "x", "c", 2))])
    compact_once(rt, "run-2")
    assert [a for a in attempts if (Path(rt.lake.layout.base) / a).exists()] == [first["version"]]


def test_two_attempts_of_one_plan_publish_exactly_one(make_cfg, runtime, spark) -> None:
    """Two deployments (or a cleared task) ran the same plan twice: one attempt is committed, once."""
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1))])
    path = run_plan(rt, "run-1")
    assert run_plan(rt, "run-1") == path, "the same run id reuses the plan"
    for _ in range(2):
        _step(rt, "compact", path, "run-1")
        validate(rt, path)
    published = [publish(rt, path), publish(rt, path)]
    same = ("seq", "version")
    assert {k: published[0][k] for k in same} == {k: published[1][k] for k in same}
    assert published[0]["freshness"]["base"] == published[1]["freshness"]["base"]
    assert rt.lake.latest_commit().seq == 1
    archive(rt, path)
    assert visible_names(spark, rt.cfg) == {1: "Alice"}


def test_a_stale_plan_is_not_compacted(make_cfg, runtime) -> None:
    """A plan whose commit number another plan took: its compaction refuses and writes nothing."""
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1))])
    path = run_plan(rt, "run-1")
    plan = json.loads(Path(path).read_text())
    other = Commit(
        seq=1,
        version="v00000001-0000other000",
        plan_id="0000other000",
        run_id="x",
        parent_seq=0,
        files=[],
        increments=[],
    )
    assert rt.lake.try_commit(other)
    with pytest.raises(Exception, match="is stale"):
        rt.engine.compact(plan)  # type: ignore[attr-defined]
    assert not [p for p in Path(rt.lake.layout.base).iterdir() if p.name.startswith("v00000001-")]
    with pytest.raises(ConcurrentCommitError, match="stale"):
        validate(rt, path)


def _stale_plan(rt: Runtime) -> str:
    """A plan whose commit number another plan took meanwhile (what a second deployment or a re-plan leaves)."""
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1))])
    path = run_plan(rt, "run-1")
    other = Commit(
        seq=1,
        version="v00000001-0000other000",
        plan_id="0000other000",
        run_id="x",
        parent_seq=0,
        files=[],
        increments=[],
    )
    assert rt.lake.try_commit(other)
    return path


def _compact_task(rt: Runtime, plan_path: str) -> Any:
    """The DAG's real compact task (spark-submit through SparkSubmitHook), its plan argument rendered."""
    from cdc_compaction.airflow.factory import build_dag

    task = build_dag(rt.cfg).get_task("compact")
    task.application_args = ["--plan", plan_path]
    return task


def test_a_stale_plan_fails_the_compact_task_at_once(make_cfg, runtime) -> None:
    """spark-submit of a stale plan exits with the job's permanent-error status: no retries, nothing written."""
    from airflow.sdk.exceptions import AirflowFailException

    from cdc_compaction.airflow.factory import PERMANENT_EXIT_CODE, permanent_error_path
    from cdc_compaction.job import contract

    rt = runtime(make_cfg(retries=3))
    path = _stale_plan(rt)
    task = _compact_task(rt, path)
    with pytest.raises(AirflowFailException, match="is stale") as raised:
        task.execute({})
    assert task._hook._submit_sp.returncode == PERMANENT_EXIT_CODE == contract.PERMANENT_EXIT_CODE
    # The job ran from the job package the task built (spark-submit --py-files), not from plugins/.
    assert Path(task._hook._py_files).name.startswith("cdc_compaction_job-") and Path(task._hook._py_files).is_file()
    assert "Error code is: 65" in str(raised.value.__cause__), "SparkSubmitHook's own error stays attached"
    assert (
        json.loads(Path(permanent_error_path(path)).read_text())["plan_id"]
        == json.loads(Path(path).read_text())["plan_id"]
    )
    assert not [p for p in Path(rt.lake.layout.base).iterdir() if p.name.startswith("v00000001-")]


def test_a_compaction_that_may_heal_is_left_to_the_retries(make_cfg, runtime, tmp_path) -> None:
    """Any other failure of the job (here: the plan file cannot be read) is retried as before."""
    from airflow.sdk.exceptions import AirflowFailException

    rt = runtime(make_cfg())
    task = _compact_task(rt, str(tmp_path / "missing-plan.json"))
    with pytest.raises(Exception, match="Error code is: 1") as raised:
        task.execute({})
    assert not isinstance(raised.value, AirflowFailException)


def test_a_published_snapshot_run_is_reentrant(make_snapshot_cfg, runtime, spark) -> None:
    """mode: snapshot: publishing the same commit again changes nothing, compacting its plan again writes nothing."""
    from cdc_compaction.integrations.metastore import connect
    from cdc_compaction.modes.snapshot import history_of, history_table

    rt = runtime(make_snapshot_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [[{"id": 1, "full_name": "Ann"}, {"id": 2, "full_name": "Bob"}]])
    compact_once(rt, "run-1")
    land(rt.cfg, "increment_2026112300", [[{"id": 2, "full_name": "Bobby"}, {"id": 3, "full_name": "Cy"}]])
    path = compact_once(rt, "run-2")
    commit = rt.lake.latest_commit()
    assert sorted(history_of(commit)) == ["2026-11-22", "2026-11-23"]
    doc = json.loads(Path(path).read_text())
    plan = Plan.from_dict(doc)
    assert plan.to_dict() == doc and plan.extra == {}, "the snapshot plan round-trips key for key"
    assert (plan.last_applied, plan.business_dates) == ("2026-11-22", {"increment_2026112300": "2026-11-23"})
    state = snapshot_state(spark, rt.cfg)
    assert state == (
        {2: ("Bobby", "U", "2026-11-23"), 3: ("Cy", "I", "2026-11-23")},
        {
            "2026-11-22": [(1, "Ann", "I"), (2, "Bob", "I")],
            "2026-11-23": [(1, "Ann", "D"), (2, "Bobby", "U"), (3, "Cy", "I")],
        },
    )
    trees = {loc: _tree(loc) for loc in [rt.lake.live_location(), *history_of(commit).values()]}
    base = Path(rt.lake.layout.base)
    before = sorted(p.name for p in base.iterdir())

    def registered() -> dict[str, str]:
        with connect(rt.metastore) as ms:
            return ms.partitions(rt.cfg.database, history_table(rt.cfg))

    partitions = registered()
    assert sorted(partitions) == ["2026-11-22", "2026-11-23"]
    assert _step(rt, "compact", path, "run-2")["already_committed"] is True
    assert sorted(p.name for p in base.iterdir()) == before, "compacting a published plan writes nothing"
    for _ in range(2):
        publish(rt, path)
    assert rt.lake.latest_commit() == commit
    assert registered() == partitions
    assert snapshot_state(spark, rt.cfg) == state
    assert {loc: _tree(loc) for loc in trees} == trees, "a published version or history partition was written again"
    assert sorted(p.name for p in base.iterdir()) == before
