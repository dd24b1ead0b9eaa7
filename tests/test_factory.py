"""The DAG factory's task callables: which errors fail a task at once, which are retried."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import student_doc

from cdc_compaction import exceptions as exc
from cdc_compaction import factory
from cdc_compaction.pipeline import order
from cdc_compaction.registry import parse_table

PERMANENT = [
    exc.BadInputError("t: part-0.parquet is truncated"),
    exc.PlanError("t: plan file missing"),
    exc.SchemaChangeError("t: column dropped"),
    exc.PublishValidationError("t: counts do not reconcile"),
    exc.ConcurrentCommitError("t: commit 3 was taken"),
    exc.CommitLogError("t: record 3 missing"),
    exc.StorageRootMismatchError("t: storage_root moved"),
    exc.DeploymentConflictError("t: deployment id 'blue' is already used by another Airflow deployment"),
]
TRANSIENT = [
    exc.StorageError("t: S3 answered 503"),
    exc.MetastoreError("t: metastore unreachable"),
    exc.ConcurrentRunError("t: lease held"),
    exc.ArchiveError("t: archived copy has 0 bytes"),
    OSError("connection reset"),
]


def _dag(tmp_path: Any) -> Any:
    return factory.build_dag(parse_table(student_doc(tmp_path / "lake")))


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("task_id", ["plan", "validate", "publish", "archive", "refresh_view", "ensure_tables"])
def test_errors_no_retry_can_heal_fail_the_task_at_once(tmp_path, monkeypatch, task_id, error) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    def broken(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(factory, "_runtime", lambda cfg: None)
    monkeypatch.setattr(order.step(task_id).target, broken)
    task = _dag(tmp_path).get_task(task_id)
    kwargs = {"run_id": "r"} if task_id == "plan" else ({} if task_id == "ensure_tables" else {"plan_path": "/p"})
    with pytest.raises(AirflowFailException, match=type(error).__name__) as raised:
        task.python_callable(**kwargs)
    assert raised.value.__cause__ is error, "the original error stays attached for the log"


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda e: type(e).__name__)
def test_errors_that_may_heal_are_left_to_airflows_retries(tmp_path, monkeypatch, error) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(factory, "_runtime", lambda cfg: None)
    monkeypatch.setattr(order.step("publish").target, broken)
    with pytest.raises(type(error)):
        _dag(tmp_path).get_task("publish").python_callable(plan_path="/p")


def test_a_snapshot_table_gets_its_dag_and_docs(tmp_path) -> None:
    """mode: snapshot builds the same DAG as every mode; its docs name its key, snapshots and outputs."""
    doc = student_doc(tmp_path / "lake", "accounts", mode="snapshot", columns=[{"name": "id", "type": "int"}])
    del doc["order_by"]
    cfg = parse_table({**doc, "columns": [*doc["columns"], {"name": "as_of", "type": "date"}]})
    dag = factory.build_dag(cfg)
    assert [t.task_id for t in dag.tasks] == [
        t.task_id for t in factory.build_dag(parse_table(student_doc(tmp_path / "lake"))).tasks
    ]
    docs = factory.doc_md(cfg)
    assert "`snapshot`" in docs and "accounts_history" in docs and "no view over pending snapshots yet" in docs
