"""DAG integrity at scale: a 500-table registry through Airflow's real DagBag.

Uses the varied registry of ``bench/parse_dags.py`` (different columns, keys, schedules,
alerts, Spark settings). Speed is measured by that benchmark, never asserted here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from cdc_compaction.core.registry import load_registry
from cdc_compaction.core.settings import ERASE_DAG_ID, PROJECT_ROOT, VIEW_REFRESH_DAG_ID

DAGS = PROJECT_ROOT / "dags"
TABLES = 500


def _bench() -> ModuleType:
    path = PROJECT_ROOT / "bench" / "parse_dags.py"
    spec = importlib.util.spec_from_file_location("bench_parse_dags", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def big_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("registry-500")
    _bench().write_registry(work / "registry", TABLES, work / "lake")
    return work / "registry"


def test_500_tables_give_500_dags_without_import_errors(big_registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("CDC_REGISTRY_DIR", str(big_registry))
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    entries = load_registry(big_registry)
    assert len(entries) == TABLES and all(e.error is None for e in entries)
    assert sorted(bag.dag_ids) == sorted([VIEW_REFRESH_DAG_ID, ERASE_DAG_ID, *(e.dag_id for e in entries)])
    assert all(
        len(dag.tasks) == 7 for dag_id, dag in bag.dags.items() if dag_id not in (VIEW_REFRESH_DAG_ID, ERASE_DAG_ID)
    )
    # The registry is varied: cron, preset and manual-only schedules all made it through.
    schedules = {e.config.schedule for e in entries if e.config is not None}
    assert {None, "@hourly", "*/15 * * * *"} <= schedules


def test_a_task_process_builds_only_its_own_dag(big_registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Airflow's parsing context (set when a task runs) limits the parse to that task's DAG."""
    from airflow.dag_processing.dagbag import DagBag

    wanted = load_registry(big_registry)[123].dag_id
    monkeypatch.setenv("CDC_REGISTRY_DIR", str(big_registry))
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", wanted)
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert bag.dag_ids == [wanted]
