"""DAG integrity at scale: a 500-table registry through Airflow's real DagBag.

Uses the varied registry of ``bench/parse_dags.py`` (different columns, keys, schedules,
alerts, Spark settings). Speed is measured by that benchmark, never asserted here.
"""

from __future__ import annotations

import gc
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from cdc_compaction.airflow import factory
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


def _collections() -> int:
    return sum(s["collections"] for s in gc.get_stats())


@pytest.mark.parametrize("enabled", [True, False])
def test_the_parse_pauses_the_garbage_collector_and_leaves_it_as_it_found_it(
    big_registry: Path, monkeypatch: pytest.MonkeyPatch, enabled: bool
) -> None:
    """No collection while the 500 tables' DAGs are built (the collector walked the growing heap every few
    hundred allocations: a third of the parse's CPU, for no garbage); afterwards it is on or off as it was."""
    monkeypatch.setenv("CDC_REGISTRY_DIR", str(big_registry))
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        gc.collect()  # from an empty youngest generation: none is due before the build starts
        before = _collections()
        namespace: dict[str, object] = {}
        dags = factory.load_dags(namespace)
        # At most the one that catches up when the collector is back on (unpaused: hundreds).
        assert _collections() - before <= (1 if enabled else 0), "the collector ran while the DAGs were built"
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert len(dags) == TABLES + 2 and set(namespace) == set(dags)


def test_the_collector_is_back_on_when_the_build_fails() -> None:
    was = gc.isenabled()
    gc.enable()
    try:
        with pytest.raises(RuntimeError, match="a table's surprise"), factory.gc_paused():
            assert not gc.isenabled()
            raise RuntimeError("a table's surprise")
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
