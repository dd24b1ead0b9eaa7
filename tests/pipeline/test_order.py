"""The step order is written once (``pipeline.order``): the DAG and the in-process runner follow it."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import student_doc

from cdc_compaction.core.registry import load_registry, parse_table
from cdc_compaction.core.settings import (
    ERASE_DAG_ID,
    PROJECT_ROOT,
    VIEW_REFRESH_DAG_ID,
    MetastoreEndpoint,
    registry_dir,
)
from cdc_compaction.devtools.conformance import InProcessRunner
from cdc_compaction.pipeline import order


def _dagbag(registry: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The project's DAG file parsed by Airflow's real DagBag, over ``registry``."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("CDC_REGISTRY_DIR", str(registry))
    bag = DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
    assert bag.import_errors == {}
    return bag


def _chain(dag: Any) -> list[str]:
    """The DAG's tasks in dependency order; asserts each is a direct downstream of the one before."""
    tasks = [t.task_id for t in dag.topological_sort()]
    for up, down in itertools.pairwise(tasks):
        assert down in dag.get_task(up).downstream_task_ids, f"{up} -> {down} missing in {dag.dag_id}"
    return tasks


def test_the_parsed_dags_run_the_steps_in_the_order(monkeypatch: pytest.MonkeyPatch) -> None:
    bag = _dagbag(registry_dir(), monkeypatch)
    tables = [e.config.dag_id for e in load_registry(registry_dir()) if e.config is not None]
    assert tables and sorted(bag.dag_ids) == sorted([*tables, VIEW_REFRESH_DAG_ID, ERASE_DAG_ID])
    for dag_id in tables:
        dag = bag.dags[dag_id]
        assert _chain(dag) == list(order.STEP_IDS)
        plan = dag.get_task(order.PLAN)
        assert plan.downstream_task_ids == {s.id for s in order.after(order.PLAN)}
        for step in order.ORDER:
            if step.id != order.COMPACT:  # the Spark job's task documents itself (factory._compact_tasks)
                assert dag.get_task(step.id).doc_md == step.doc, step.id


def test_an_emr_table_runs_the_compaction_as_two_tasks_in_the_same_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emr = {"job_flow_id": "j-PLACEHOLDER1", "application": "s3://lake-code/cdc/compact.py"}
    doc = student_doc(tmp_path / "lake", spark={"engine": "emr", "emr": emr})
    (tmp_path / "registry").mkdir()
    (tmp_path / "registry" / "tests.student.yaml").write_text(yaml.safe_dump(doc))
    dag = _dagbag(tmp_path / "registry", monkeypatch).dags["cdc__tests__student"]
    i = order.STEP_IDS.index(order.COMPACT)
    assert _chain(dag) == [*order.STEP_IDS[:i], "compact_submit", *order.STEP_IDS[i:]]
    # Every task after plan hangs off plan directly, the sensor included (not its submit: that follows plan anyway).
    assert dag.get_task(order.PLAN).downstream_task_ids == {"compact_submit", *(s.id for s in order.after(order.PLAN))}


def test_the_dags_task_callables_run_the_steps_functions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Python task calls the function its step names (looked up when it runs, so a replacement is seen)."""
    from cdc_compaction.airflow import factory

    called: list[str] = []

    def recorder(step_id: str) -> Any:
        return lambda *args, **kwargs: called.append(step_id) or {}

    for step in order.ORDER:
        monkeypatch.setattr(step.target, recorder(step.id))
    monkeypatch.setattr(factory, "_runtime", lambda cfg: None)
    cfg = parse_table(student_doc(tmp_path / "lake", alerts={"on_rejected_rows": False}))
    dag = factory.build_dag(cfg)
    for step in order.ORDER:
        if step.id == order.PLAN:
            dag.get_task(step.id).python_callable(run_id="r")
        elif step.id == order.ORDER[0].id:
            dag.get_task(step.id).python_callable()
        elif step.id != order.COMPACT:  # a Spark job, no Python callable
            dag.get_task(step.id).python_callable(plan_path="/p")
    assert called == [s.id for s in order.ORDER if s.id != order.COMPACT]


@pytest.mark.parametrize("planned", [True, False], ids=["planned", "nothing-pending"])
def test_the_in_process_runner_calls_the_steps_in_the_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planned: bool
) -> None:
    called: list[tuple[str, tuple[Any, ...]]] = []

    def recorder(step: order.Step) -> Any:
        def run(rt: Any, *args: Any, **kwargs: Any) -> Any:
            called.append((step.id, args or tuple(kwargs)))
            return ("/lake/_cdc/plans/p.json" if planned else "") if step.id == order.PLAN else {}

        return run

    for step in order.ORDER:
        monkeypatch.setattr(step.target, recorder(step))
    cfg = parse_table(student_doc(tmp_path / "lake"))
    result = InProcessRunner(None, MetastoreEndpoint("127.0.0.1", 9)).compact(cfg)
    if planned:
        assert [s for s, _ in called] == list(order.STEP_IDS)
        assert result == {}, "the stats of the (here empty) latest commit"
    else:
        # The steps on the plan are skipped; the views are still refreshed.
        assert [s for s, _ in called] == [s.id for s in order.ORDER if not s.takes_plan]
        assert result is None
    for step_id, args in called:
        if order.step(step_id).takes_plan:
            assert args == ("/lake/_cdc/plans/p.json",), step_id
        elif step_id == order.PLAN:
            assert args == ("run_id",)
        else:
            assert args == (), step_id


def test_the_order_names_real_functions() -> None:
    assert order.STEP_IDS == ("ensure_tables", "plan", "compact", "validate", "publish", "archive", "refresh_view")
    for step in order.ORDER:
        assert callable(step.function()), step.target
        assert step.function().__name__ == step.id
    assert [s.id for s in order.between("validate", "archive")] == ["validate", "publish", "archive"]
    assert [s.id for s in order.after("archive")] == ["refresh_view"]
    with pytest.raises(KeyError, match="no step 'nope'; the steps are ensure_tables, plan"):
        order.step("nope")
