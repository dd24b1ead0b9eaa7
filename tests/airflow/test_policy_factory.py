"""A table's DAG under ``compaction.policy`` (README, "Compaction policy"), without running a DAG.

A plan that does not compact makes ``compact`` ... ``archive`` skip (AirflowSkipException, as
``enabled: false`` tasks do) and ``refresh_view`` still runs (trigger rule ``none_failed``);
the run param ``compact: force`` reaches the plan step.  Plan files are real files on local storage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSkipException
from conftest import student_doc

from cdc_compaction.airflow import factory
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.pipeline import order
from cdc_compaction.pipeline.runtime import Runtime

THRESHOLD = {"policy": "threshold", "pending_files": 3}


def _cfg(tmp_path: Path) -> Any:
    return parse_table(student_doc(tmp_path / "lake", compaction=THRESHOLD))


def _plan_file(tmp_path: Path, compact: bool) -> str:
    """A plan record as ``plan`` writes its decision (only the keys the skipping reads)."""
    path = tmp_path / "plan.json"
    reason = "threshold reached: pending_files 3/3" if compact else "no threshold reached (pending_files 1/3)"
    doc = {"table": "tests.student", "plan_id": "abc", "compaction": {"compact": compact, "reason": reason}}
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_dag_offers_compact_force_and_refreshes_the_view_after_skipped_steps(tmp_path: Path) -> None:
    dag = factory.build_dag(_cfg(tmp_path))
    param = dag.params.get_param("compact")
    assert param.value == "auto" and param.schema["enum"] == ["auto", "force"]
    rules = {t.task_id: getattr(t.trigger_rule, "value", t.trigger_rule) for t in dag.tasks}
    assert rules["refresh_view"] == "none_failed"
    assert {rules[s] for s in ("validate", "publish", "archive", "compact")} == {"all_success"}


@pytest.mark.parametrize(("conf", "want"), [(None, "auto"), ({"compact": "force"}, "force")])
def test_every_task_of_a_run_sees_the_compact_param(tmp_path: Path, conf: dict | None, want: str) -> None:
    """The param is set on the built DAG (cheaper to parse); a task's context still has it, as Airflow builds it."""
    from airflow.sdk.definitions.param import process_params

    dag = factory.build_dag(_cfg(tmp_path))
    dag.params.validate()  # the default satisfies its own schema (Airflow skips this for params set late)
    for task in dag.tasks:
        assert process_params(dag, task, conf, suppress_exception=False)["compact"] == want, task.task_id


def test_a_run_with_an_unknown_compact_value_is_refused(tmp_path: Path) -> None:
    from airflow.sdk.definitions.param import process_params
    from airflow.sdk.exceptions import ParamValidationError

    dag = factory.build_dag(_cfg(tmp_path))
    with pytest.raises(ParamValidationError, match="forse"):
        process_params(dag, dag.get_task("plan"), {"compact": "forse"}, suppress_exception=False)


@pytest.mark.parametrize(("params", "force"), [({"compact": "force"}, True), ({"compact": "auto"}, False), ({}, False)])
def test_the_plan_task_passes_the_force_param(tmp_path: Path, monkeypatch: Any, params: dict, force: bool) -> None:
    seen: dict[str, Any] = {}

    def plan(rt: Any, **kwargs: Any) -> str:
        seen.update(kwargs)
        return ""

    monkeypatch.setattr(factory, "_runtime", lambda cfg: None)
    monkeypatch.setattr(order.step("plan").target, plan)
    factory.build_dag(_cfg(tmp_path)).get_task("plan").python_callable(run_id="r", params=params)
    assert seen["force"] is force


@pytest.mark.parametrize("task_id", ["validate", "publish", "archive"])
def test_the_steps_after_a_plan_that_does_not_compact_skip(tmp_path: Path, monkeypatch: Any, task_id: str) -> None:
    cfg = _cfg(tmp_path)
    # A real runtime on local storage; the metastore is never reached: the steps stop at the plan's decision.
    rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=MetastoreEndpoint("127.0.0.1", 1), engine=None)  # type: ignore[arg-type]
    monkeypatch.setattr(factory, "_runtime", lambda c: rt)
    task = factory.build_dag(cfg).get_task(task_id)
    with pytest.raises(AirflowSkipException, match=r"tests.student: plan abc does not compact: no threshold reached"):
        task.python_callable(plan_path=_plan_file(tmp_path, compact=False))


def test_the_compact_task_skips_before_submitting_a_plan_that_does_not_compact(tmp_path: Path) -> None:
    task = factory.build_dag(_cfg(tmp_path)).get_task("compact")
    task.application_args = ["--plan", _plan_file(tmp_path, compact=False)]
    with pytest.raises(AirflowSkipException, match="does not compact"):
        task.execute({})
    # A plan that compacts, or one that cannot be read here, is left to the job.
    assert factory.skip_unless_compacting(_plan_file(tmp_path, compact=True), "aws_default") is None
    assert factory.skip_unless_compacting(str(tmp_path / "missing.json"), "aws_default") is None


def test_the_cli_forces_only_the_plan_step(tmp_path: Path, capsys: Any) -> None:
    import yaml

    from cdc_compaction.cli.main import main

    registry = tmp_path / "registry"
    registry.mkdir()
    doc = student_doc(tmp_path / "lake", compaction=THRESHOLD)
    (registry / "tests.student.yaml").write_text(yaml.safe_dump(doc))
    code = main(["step", "validate", "tests.student", "--force", "--plan", "/p", "--registry-dir", str(registry)])
    assert code == 2 and "--force applies to the plan step only" in capsys.readouterr().err


def test_the_in_process_runner_reports_no_commit_for_a_plan_that_does_not_compact(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from cdc_compaction.devtools.conformance import InProcessRunner

    called: list[str] = []

    def recorder(step: order.Step) -> Any:
        def run(rt: Any, *args: Any, **kwargs: Any) -> Any:
            called.append(step.id)
            if step.id == order.PLAN:
                return "/lake/_cdc/plans/p.json"
            return {"skipped": "no threshold reached"} if step.takes_plan else {}

        return run

    for step in order.ORDER:
        monkeypatch.setattr(step.target, recorder(step))
    result = InProcessRunner(None, MetastoreEndpoint("127.0.0.1", 9)).compact(_cfg(tmp_path))
    assert result is None and called == list(order.STEP_IDS), "every step ran; the views were refreshed"
