"""Every table mode's own scenarios (``tests/scenarios/<mode>/``) through the real pipeline.

As ``tests/devtools/test_conformance.py`` runs the shared cdc scenarios: the task functions in order in
this process (one SparkSession), read back by Spark through the metastore and by DuckDB
through the files and its views; cdc scenarios also on a partitioned table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import merge_path_cases, merge_paths_taken

from cdc_compaction.devtools import conformance as conf

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"
CDC = sorted((SCENARIO_DIR / "cdc").glob("*.json"))
KEYLESS = sorted((SCENARIO_DIR / "keyless").glob("*.json"))
#: Partitioned too: the options whose keys need finding across partitions (a NULL key, a retired key),
#: and partial rows filled anew by late events (the full ranking of the touched partitions).
CDC_PARTITIONED = [p for p in CDC if p.stem in ("nullable_key", "old_key_chain", "unchanged_late_event")]
#: Through the pipeline: seed 003's example and the scenarios of the watermark, deliveries, NULLs,
#: missing history and refusals, and of a source delivering in commit order (a snapshot's rows at one
#: LSN, a transaction spanning a compaction); tests/modes/test_keyless.py holds the model to all.
KEYLESS_PIPELINE = [
    p
    for p in KEYLESS
    if p.stem
    in (
        "seed_003_alice_alice_bob",
        "replayed_increment_after_compaction",
        "duplicate_delivery_within_one_run",
        "null_values_match_null_safely",
        "removal_without_copy_is_counted",
        "rejected_rows",
        "snapshot_rows_share_one_lsn",
        "transaction_spanning_a_compaction",
    )
]


#: Every snapshot scenario, through the pipeline: the current table (<t>_base, through the metastore
#: and by DuckDB from the pointer's location), every history partition (<t>_history, through the
#: metastore) and the mode's counts.
SNAPSHOT = sorted((SCENARIO_DIR / "snapshot").glob("*.json"))


def test_the_mode_scenarios_are_there() -> None:
    assert {p.stem for p in CDC} >= {
        "nullable_key",
        "unchanged_placeholder",
        "unchanged_null",
        "unchanged_late_event",
        "unchanged_old_key",
        "old_key_chain",
        "old_key_seed002",
        "old_key_late_event",
        "debezium_rewrite_deletes",
        "mysql_binlog_order",
        "dms_full_load_then_changes",
        "wal2json_kinds",
        "options_combined",
    }
    assert len(KEYLESS) >= 8 and len(KEYLESS_PIPELINE) == 8 and len(CDC_PARTITIONED) == 3
    assert len(SNAPSHOT) >= 12
    assert {p.stem for p in KEYLESS_PIPELINE} >= KEYLESS_IN_MAKE_TEST
    assert {p.stem for p in SNAPSHOT} >= SNAPSHOT_IN_MAKE_TEST and {p.stem for p in CDC} >= IN_THE_FEED_TESTS


def _partial_rows(path: Path) -> bool:
    """A table with partial rows (``unchanged``) always takes the window, whatever path is forced."""
    return bool(json.loads(path.read_text())["table"].get("unchanged"))


#: make test runs these three, down the same merge paths, in tests/modes/test_change_feed_job.py with the
#: change feed on (the same expectations, and the feed's): here they run in make test-extended only.
IN_THE_FEED_TESTS = {"old_key_chain", "nullable_key", "unchanged_late_event"}


def _cdc_cases() -> list[Any]:
    cases = merge_path_cases(CDC, lambda p: p.stem, _partial_rows)
    return [
        pytest.param(*c.values, id=c.id, marks=(*c.marks, pytest.mark.extended))
        if c.values[0].stem in IN_THE_FEED_TESTS
        else c
        for c in cases
    ]


@pytest.mark.parametrize(("path", "merge_path"), _cdc_cases(), indirect=["merge_path"])
def test_cdc_scenario(
    path: Path, inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path, merge_path: str
) -> None:
    """Down each merge path of the job (one in make test, see ``merge_path_cases``); partial rows (registry
    ``unchanged``) always take the window."""
    scn = conf.Scenario.load(path)
    result = conf.run_scenario(scn, inprocess, readers, tmp_path / "lake", suffix=f"_m_{merge_path[0]}")
    assert result.ok, "\n".join(result.failures)
    taken = merge_paths_taken(tmp_path / "lake")
    assert taken and set(taken) == {"window" if scn.table.get("unchanged") else merge_path}, taken


@pytest.mark.parametrize("path", CDC_PARTITIONED, ids=[p.stem for p in CDC_PARTITIONED])
def test_cdc_scenario_partitioned(path: Path, inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path) -> None:
    """Partitioned by the name-like column: keys move between partitions as it changes."""
    scn = conf.Scenario.load(path)
    column = next(c["name"] for c in scn.table["columns"] if c["name"] in ("name", "status"))
    part = {"column": column, "transform": "identity"}
    result = conf.run_scenario(scn, inprocess, readers, tmp_path / "lake", suffix="_mp", partition_by=part)
    assert result.ok, "\n".join(result.failures)


#: In make test: seed 003 (also a DAG run), a replay after a compaction, refused rows and a transaction across
#: compactions; the other four in make test-extended (tests/modes/test_keyless.py runs every keyless scenario
#: through the job against the model in make test: what the pipeline adds, publish and views, is the same).
KEYLESS_IN_MAKE_TEST = {
    "seed_003_alice_alice_bob",
    "replayed_increment_after_compaction",
    "rejected_rows",
    "transaction_spanning_a_compaction",
}


def _in_make_test(paths: list[Path], names: set[str]) -> list[Any]:
    return [p if p.stem in names else pytest.param(p, id=p.stem, marks=pytest.mark.extended) for p in paths]


@pytest.mark.parametrize("path", _in_make_test(KEYLESS_PIPELINE, KEYLESS_IN_MAKE_TEST), ids=lambda p: p.stem)
def test_keyless_scenario(path: Path, inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path) -> None:
    result = conf.run_scenario(conf.Scenario.load(path), inprocess, readers, tmp_path / "lake", suffix="_k")
    assert result.ok, "\n".join(result.failures)


#: In make test: a replay, two snapshots pending, a refusal, a delta snapshot and a business date from a column;
#: the others in make test-extended (tests/modes/test_snapshot.py runs every snapshot scenario through the
#: job against the model in make test, and update_nochange_delete_insert runs as a DAG run below).
SNAPSHOT_IN_MAKE_TEST = {
    "replayed_snapshot",
    "two_snapshots_pending",
    "duplicate_key_refused",
    "delta_not_supplied",
    "business_date_from_column",
}


@pytest.mark.parametrize("path", _in_make_test(SNAPSHOT, SNAPSHOT_IN_MAKE_TEST), ids=lambda p: p.stem)
def test_snapshot_scenario(path: Path, inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path) -> None:
    result = conf.run_scenario(conf.Scenario.load(path), inprocess, readers, tmp_path / "lake", suffix="_s")
    assert result.ok, "\n".join(result.failures)


#: Every cdc option on one table (its rule statements travel in the plan file), a keyless table and a
#: snapshot table (its history published by the DAG's tasks) as real DAG runs; the rest run in-process
#: above, through the same task functions.
DAG_SCENARIOS = [
    SCENARIO_DIR / "cdc" / "options_combined.json",
    SCENARIO_DIR / "keyless" / "seed_003_alice_alice_bob.json",
    SCENARIO_DIR / "snapshot" / "update_nochange_delete_insert.json",
]


@pytest.mark.dag
@pytest.mark.parametrize(
    "path",
    # The cdc table's DAG runs repeat tests/devtools/test_conformance.py's (make test); its options run
    # in-process above through the same task functions, and through the DAG in make test-extended.
    [pytest.param(p, marks=pytest.mark.extended) if p.parent.name == "cdc" else p for p in DAG_SCENARIOS],
    ids=[p.stem for p in DAG_SCENARIOS],
)
def test_scenario_dag(path: Path, dag_runner: Any, readers: Any) -> None:
    work: Path = dag_runner.work
    scn = conf.Scenario.load(path)
    # Each table's runs send the job to the worker's warm Spark Connect server (engine: spark_connect);
    # a cdc table's runs spark-submit in tests/e2e/test_postgres_truth.py and the newcomer's test.
    result = conf.run_scenario(scn, dag_runner, readers, work / "lake", registry_dir=work / "registry", suffix="_dag")
    assert result.ok, "\n".join(result.failures)
    runs = [t for t in dag_runner.timings if t["dag_id"].endswith(scn.table_name + "_dag")]
    assert runs and all(t["state"] == "success" for t in runs)
