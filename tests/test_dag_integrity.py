"""DAG integrity over Airflow's real DagBag: the shipped registry and broken ones."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cdc_compaction.registry import load_registry
from cdc_compaction.settings import PROJECT_ROOT, registry_dir

DAGS = PROJECT_ROOT / "dags"
TASK_ORDER = ["ensure_tables", "plan", "compact", "validate", "publish", "archive", "refresh_view"]


def _dagbag(registry: Path | None = None, monkeypatch: pytest.MonkeyPatch | None = None):
    from airflow.dag_processing.dagbag import DagBag

    if registry is not None and monkeypatch is not None:
        monkeypatch.setenv("CDC_REGISTRY_DIR", str(registry))
    return DagBag(dag_folder=str(DAGS))


@pytest.fixture(scope="module")
def dagbag():
    return _dagbag()


def test_no_import_errors_and_one_dag_per_table(dagbag) -> None:
    assert dagbag.import_errors == {}
    entries = load_registry(registry_dir())
    assert entries, "the shipped registry is not empty"
    assert sorted(dagbag.dag_ids) == sorted(e.config.dag_id for e in entries if e.config)


def test_dag_settings(dagbag) -> None:
    for entry in load_registry(registry_dir()):
        cfg = entry.config
        assert cfg is not None
        dag = dagbag.dags[cfg.dag_id]
        assert dag.max_active_runs == 1
        assert dag.catchup is False
        assert dag.start_date is not None and dag.start_date == cfg.start_date
        assert {"cdc", f"database:{cfg.database}", f"table:{cfg.table}", f"owner:{cfg.owner}"} <= set(dag.tags)
        assert cfg.qualified_name in dag.doc_md and all(c.name in dag.doc_md for c in cfg.columns)
        for t in dag.tasks:
            assert t.owner == cfg.owner
            assert t.retries >= 1 and t.retries == cfg.retries
            assert t.retry_exponential_backoff
            assert t.on_failure_callback, f"{t.task_id} has no failure alert"


def test_task_chain_and_operators(dagbag) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    for dag in dagbag.dags.values():
        assert {t.task_id for t in dag.tasks} == set(TASK_ORDER)
        for up, down in itertools.pairwise(TASK_ORDER):
            assert down in dag.get_task(up).downstream_task_ids, f"{up} -> {down} missing in {dag.dag_id}"
        # A DAG with a cycle cannot be sorted; this raises if it has one.
        assert next(t.task_id for t in dag.topological_sort()) == "ensure_tables"
        compact = dag.get_task("compact")
        assert isinstance(compact, SparkSubmitOperator)
        assert compact.application.endswith("include/spark_jobs/compact.py")
        assert Path(compact.application).is_file()
        assert compact._conn_id == "spark_default"
        assert "ti.xcom_pull(task_ids='plan')" in " ".join(compact.application_args)
        plan = dag.get_task("plan")
        # The next run's plan waits for this run's whole critical section (backfill-safe).
        assert plan.depends_on_past and plan.wait_for_downstream
        assert plan.downstream_task_ids == set(TASK_ORDER[2:])
        outlets = dag.get_task("publish").outlets
        assert len(outlets) == 1 and outlets[0].name.endswith("_base")


def _write(dirpath: Path, name: str, doc: dict) -> None:
    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / name).write_text(yaml.safe_dump(doc))


def test_a_bad_registry_file_breaks_only_its_own_dag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = yaml.safe_load((registry_dir() / "school.student.yaml").read_text())
    _write(tmp_path, "school.student.yaml", good)
    _write(tmp_path, "school.teacher.yaml", {**good, "table": "teacher", "order_by": ["no_such_column"]})
    _write(tmp_path, "school.course.yaml", {**good, "table": "course", "database": "school; DROP TABLE x"})
    bag = _dagbag(tmp_path, monkeypatch)
    assert sorted(bag.dag_ids) == ["cdc__school__student"]
    assert len(bag.import_errors) == 1
    (message,) = bag.import_errors.values()
    assert "school.teacher.yaml" in message and "order_by" in message and "no_such_column" in message
    assert "school.course.yaml" in message and "field 'database'" in message


def test_dag_file_parses_without_heavy_imports(tmp_path: Path) -> None:
    """Parsing must not import Spark, boto3 or the metastore client, nor touch the network."""
    code = (
        "import sys, json\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "heavy = sorted(m for m in ('pyspark', 'boto3', 'hmsclient', 'thrift', 'pyarrow') if m in sys.modules)\n"
        "print(json.dumps({'dags': len(bag.dags), 'errors': len(bag.import_errors), 'heavy': heavy}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"dags": len(load_registry(registry_dir())), "errors": 0, "heavy": []}
