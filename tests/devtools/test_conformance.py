"""The shared conformance scenarios, through the real pipeline.

Every scenario of ../shared/conformance runs in-process (the task functions in order,
one SparkSession); a representative handful also run as real DAG runs
(``airflow dags test``: SparkSubmitOperator, spark-submit and all).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import merge_path_cases, merge_paths_taken, with_timestamp

from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools.local_services import LocalMetastore

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

SHARED_CONFORMANCE = PROJECT_ROOT.parent / "shared" / "conformance"

SCENARIOS = sorted(SHARED_CONFORMANCE.glob("*.json"))
# One per behaviour that matters most in a real DAG run: tombstones against late
# events over three runs, refused rows, several and empty files, a no-op run that
# short-circuits, and composite keys.
#: As real DAG runs (a minute each): a late event against a tombstone across runs, the quarantine,
#: and a run with nothing to do. The others' paths through the task functions are the same; they
#: run in-process below (several files and composite keys also as the modes' DAG runs do).
DAG_HANDFUL = [
    "null_key_rejected",
    "no_pending_increments",
    "late_update_for_deleted_key",
]
#: make test runs the first two as DAG runs; the late update (three runs, some 2-3 minutes) runs in
#: make test-extended, and in-process in make test like every scenario.
DAG_EXTENDED = {"late_update_for_deleted_key"}
#: Scenarios whose events never move a key to another value of the partition column (refusals,
#: planning, inserts only): on a partitioned table they take the path the others take, so only
#: the rest run partitioned too.
NOT_PARTITION_SENSITIVE = {
    "insert_only",
    "null_key_rejected",
    "unknown_op_rejected",
    "no_pending_increments",
    "snapshot_reads_are_upserts",
    "several_files_per_increment",
    "delete_of_unknown_key",
}
PARTITIONED = [p for p in SCENARIOS if p.stem not in NOT_PARTITION_SENSITIVE]
#: The partitioned runs in make test: a key that moves to another partition, a delete and a re-insert
#: there, a late event against a tombstone and a composite key; the others' partitioned runs (the same
#: paths with other event orders, 10-35 s each) are in make test-extended, in-process in make test.
PARTITIONED_IN_MAKE_TEST = {
    "primary_key_change",
    "delete_then_reinsert",
    "late_update_for_deleted_key",
    "composite_key",
}


def extended_unless(names: set[str], values: list[Any], name: Callable[[Any], str]) -> list[Any]:
    """``values`` for a parametrize: those whose name is in ``names`` run in make test, the rest extended."""
    return [v if name(v) in names else pytest.param(v, marks=pytest.mark.extended, id=name(v)) for v in values]


def test_the_shared_scenarios_are_there() -> None:
    assert len(SCENARIOS) >= 19, f"expected the shared scenarios in {SHARED_CONFORMANCE}"
    assert set(DAG_HANDFUL) <= {p.stem for p in SCENARIOS}
    assert {p.stem for p in SCENARIOS} >= NOT_PARTITION_SENSITIVE and len(PARTITIONED) >= 12
    assert {p.stem for p in PARTITIONED} >= PARTITIONED_IN_MAKE_TEST


Readers = list[conf.Reader | conf.DuckDBReader]


@pytest.fixture(scope="module")
def reader(spark: Any) -> list[conf.Reader | conf.DuckDBReader]:
    """Every expectation is checked by Spark through the metastore and by DuckDB through the files; the base of
    a table with ``formats: [delta]`` also by delta-rs and polars through its Delta log (and its time travel), and
    with ``iceberg`` by pyiceberg and polars through its Iceberg snapshots (and theirs)."""
    return [
        conf.Reader(spark),
        conf.DuckDBReader(),
        conf.DeltaReader("delta-rs"),
        conf.DeltaReader("polars"),
        conf.IcebergReader("pyiceberg"),
        conf.IcebergReader("polars"),
    ]


#: The in-process runs (unpartitioned, and partitioned by a column) are also Iceberg tables; the day-partitioned
#: runs and all DAG runs but one stay Delta only, to keep the suite's time in check.
BOTH_FORMATS = ["delta", "iceberg"]


def _partial_rows(path: Path) -> bool:
    """A table with partial rows (``unchanged``) always takes the window, whatever path is forced."""
    return bool(json.loads(path.read_text())["table"].get("unchanged"))


@pytest.mark.parametrize(
    ("path", "merge_path"), merge_path_cases(SCENARIOS, lambda p: p.stem, _partial_rows), indirect=["merge_path"]
)
def test_scenario_inprocess(
    path: Path, inprocess: conf.InProcessRunner, reader: Readers, tmp_path: Path, merge_path: str
) -> None:
    """Down each merge path of the job (the broadcast of the events' winners, the window over base and events):
    one in make test, alternating between the scenarios, the other in make test-extended."""
    scn = conf.Scenario.load(path)
    # One table per merge path: the metastore outlives the test, and the other path's table is live there.
    result = conf.run_scenario(
        scn, inprocess, reader, tmp_path / "lake", suffix=f"_ip_{merge_path[0]}", formats=BOTH_FORMATS
    )
    assert result.ok, "\n".join(result.failures)
    taken = merge_paths_taken(tmp_path / "lake")
    assert taken and set(taken) == {"window" if scn.table.get("unchanged") else merge_path}, taken


def partition_column(scn: conf.Scenario) -> str:
    """A non-key, non-op column to partition a scenario's table by (as it is: identity)."""
    t = scn.table
    skip = {*t["primary_key"], t.get("op_column", "op"), *t["order_by"]}
    usable = [c["name"] for c in t["columns"] if c["name"] not in skip and c["type"] in ("string", "int", "bigint")]
    return (usable or list(t["order_by"]))[0]


@pytest.mark.parametrize(
    "path", extended_unless(PARTITIONED_IN_MAKE_TEST, PARTITIONED, lambda p: p.stem), ids=lambda p: p.stem
)
def test_scenario_inprocess_partitioned(
    path: Path, inprocess: conf.InProcessRunner, reader: Readers, tmp_path: Path
) -> None:
    """Every scenario again on a partitioned table: keys move between partitions as the column changes,
    key-only deletes find their key's partition, and the rows must be the same."""
    scn = conf.Scenario.load(path)
    part = {"column": partition_column(scn), "transform": "identity"}
    result = conf.run_scenario(
        scn, inprocess, reader, tmp_path / "lake", suffix="_pi", partition_by=part, formats=BOTH_FORMATS
    )
    assert result.ok, "\n".join(result.failures)


DAY_SCENARIOS = ["late_update_for_deleted_key", "delete_then_reinsert", "primary_key_change", "update_latest_wins"]


@pytest.mark.parametrize("name", extended_unless({"delete_then_reinsert"}, DAY_SCENARIOS, str))
def test_scenario_inprocess_partitioned_by_day(
    name: str, inprocess: conf.InProcessRunner, reader: Readers, tmp_path: Path
) -> None:
    """Partitioned by the day of a timestamp column (no shared scenario has one: it is derived from ts_ms)."""
    scn = _tampered(SHARED_CONFORMANCE / f"{name}.json", tmp_path, with_timestamp)
    part = {"column": "changed_at", "transform": "day"}
    result = conf.run_scenario(
        scn, inprocess, reader, tmp_path / "lake", suffix="_pd", partition_by=part, formats=["delta"]
    )
    assert result.ok, "\n".join(result.failures)


def _tampered(path: Path, tmp_path: Path, change: Any) -> conf.Scenario:
    doc = json.loads(path.read_text())
    change(doc)
    out = tmp_path / path.name
    out.write_text(json.dumps(doc))
    return conf.Scenario.load(out)


def test_a_wrong_expectation_fails_with_a_row_diff(
    inprocess: conf.InProcessRunner, reader: Readers, tmp_path: Path
) -> None:
    def change(doc: dict[str, Any]) -> None:
        step = next(s for s in doc["steps"] if "compact" in s)
        step["compact"]["expect"][0]["full_name"] = "Mallory"

    scn = _tampered(SHARED_CONFORMANCE / "update_latest_wins.json", tmp_path, change)
    result = conf.run_scenario(scn, inprocess, reader, tmp_path / "lake", suffix="_neg1")
    assert not result.ok
    text = "\n".join(result.failures)
    # Both readers see the difference: Spark through the metastore, DuckDB through the base location.
    assert "compact (spark): base rows differ" in text and "compact (duckdb): base rows differ" in text
    assert text.count("missing:    full_name='Mallory'") == 2 and text.count("unexpected: full_name='Angela'") == 2


def test_a_wrong_rejected_count_fails(inprocess: conf.InProcessRunner, reader: Readers, tmp_path: Path) -> None:
    def change(doc: dict[str, Any]) -> None:
        for s in doc["steps"]:
            if "compact" in s:
                s["compact"]["rejected"] = 0
            if "check_view" in s:
                s["check_view"]["rejected_pending"] = 5

    scn = _tampered(SHARED_CONFORMANCE / "null_key_rejected.json", tmp_path, change)
    result = conf.run_scenario(scn, inprocess, reader, tmp_path / "lake", suffix="_neg2")
    assert sorted(f.split(": ", 1)[1] for f in result.failures) == [
        "rejected 1, expected 0",
        "rejected_pending 1, expected 5",
        "rejected_pending 1, expected 5",
    ]
    assert sum("check_view (duckdb)" in f for f in result.failures) == 1


def test_cli_runs_scenarios_from_any_directory_and_exits_nonzero_on_mismatch(tmp_path: Path) -> None:
    """`make conformance` is this command: one line per scenario, exit 1 on any FAIL."""
    scenarios = tmp_path / "elsewhere"
    scenarios.mkdir()
    good = json.loads((SHARED_CONFORMANCE / "insert_only.json").read_text())
    bad = copy.deepcopy(good)
    bad["name"] = "insert_only_wrong"
    bad["steps"][-1]["compact"]["expect"].pop()
    (scenarios / "a.json").write_text(json.dumps(good))
    (scenarios / "b.json").write_text(json.dumps(bad))
    command = ["-m", "cdc_compaction", "conformance", "--mode", "inprocess", "--work-dir", str(tmp_path / "w")]
    proc = subprocess.run(
        [sys.executable, *command, str(scenarios / "*.json")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins")},
        timeout=600,
        check=False,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith(("PASS", "FAIL"))]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert lines[0].startswith("PASS insert_only ") and lines[1].startswith("FAIL insert_only_wrong ")
    assert "unexpected: full_name='Bob'" in proc.stdout
    assert "1 passed, 1 failed" in proc.stdout
    assert not LocalMetastore(tmp_path / "w" / "metastore").pid(), "the CLI stops the metastore it started"


#: The DAG runs that also send OpenLineage events (the provider's file transport), checked against the scenario.
LINEAGE_SCENARIOS = ("late_update_for_deleted_key", "null_key_rejected")


#: The formats of each DAG run's table: one real DAG run writes both (its publish task syncs them), the others Delta.
DAG_FORMATS = {name: (BOTH_FORMATS if i == 0 else ["delta"]) for i, name in enumerate(DAG_HANDFUL)}


@pytest.mark.dag
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.extended) if n in DAG_EXTENDED else n for n in DAG_HANDFUL]
)
def test_scenario_dag(name: str, dag_runner: conf.DagRunner, reader: Readers) -> None:
    work: Path = dag_runner.work  # type: ignore[attr-defined]
    scn = conf.Scenario.load(SHARED_CONFORMANCE / f"{name}.json")
    events = work / f"openlineage_{name}.jsonl"
    if name in LINEAGE_SCENARIOS:
        transport = {"type": "file", "log_file_path": str(events), "append": True}
        dag_runner.env["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(transport)
    try:
        result = conf.run_scenario(
            scn,
            dag_runner,
            reader,
            work / "lake",
            registry_dir=work / "registry",
            suffix="_dag",
            formats=DAG_FORMATS[name],
        )
    finally:
        dag_runner.env.pop("AIRFLOW__OPENLINEAGE__TRANSPORT", None)
    assert result.ok, "\n".join(result.failures)
    if name in LINEAGE_SCENARIOS:
        check_lineage_events(scn, work / "lake" / (scn.table_name + "_dag"), events, dag_runner.env)
    runs = [t for t in dag_runner.timings if t["dag_id"].endswith(scn.table_name + "_dag")]
    assert runs and all(t["state"] == "success" for t in runs)
    tasks = {x["task_id"]: x["state"] for x in runs[0]["tasks"]}
    assert tasks["compact"] == "success", "the first run compacted in the warm Spark Connect server"
    if name == "no_pending_increments":
        assert {x["task_id"]: x["state"] for x in runs[-1]["tasks"]}["compact"] == "skipped"
    _assert_asset_events_describe_the_commits(dag_runner, runs[0]["dag_id"], work)


def _assert_asset_events_describe_the_commits(dag_runner: conf.DagRunner, dag_id: str, work: Path) -> None:
    """Each publish recorded one event of the base asset; its extra restates that commit's record."""
    import yaml

    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.registry import parse_table
    from cdc_compaction.devtools.devenv import metadata_rows

    env = dag_runner.env
    db = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") or f"sqlite:///{env['AIRFLOW_HOME']}/airflow.db"
    rows = metadata_rows(
        db,
        "SELECT e.extra, a.name FROM asset_event e JOIN asset a ON a.id = e.asset_id "
        "WHERE e.source_dag_id = ? AND e.source_task_id = 'publish' ORDER BY e.id",
        (dag_id,),
    )
    (registry_file,) = [
        p for p in (work / "registry").glob("*.yaml") if parse_table(yaml.safe_load(p.read_text())).dag_id == dag_id
    ]
    cfg = parse_table(yaml.safe_load(registry_file.read_text()))
    lake = Lake(cfg)
    commits = [c for seq in range(1, lake.latest_commit().seq + 1) if (c := lake.read_commit(seq)) is not None]
    assert commits and len(rows) == len(commits), f"{len(rows)} asset events for {len(commits)} commits"
    for (extra, asset_name), commit in zip(rows, commits, strict=True):
        assert asset_name.startswith(f"{cfg.database}.") and asset_name.endswith("_base")
        st = commit.stats
        got = extra if isinstance(extra, dict) else json.loads(extra)  # PostgreSQL's driver decodes JSON itself
        assert got == {
            "table": cfg.qualified_name,
            "commit": commit.seq,
            "version": commit.version,
            # The range `changes --from --to` reads: the commit record's parent, then this commit.
            "from_version": commit.parent_seq,
            "to_version": commit.seq,
            "base_rows_in": st["base_rows"],
            "rows_in": st["increment_rows"],
            "rows_rejected": st["rejected_rows"],
            "rows_out": st["output_visible_rows"],
            "tombstones_out": st["output_tombstones"],
            "freshness": commit.freshness,
        }


def check_lineage_events(scn: conf.Scenario, root: Path, events: Path, env: dict[str, str]) -> None:
    """Each compaction's ``publish`` sent one COMPLETE event: the increments landed since the previous
    compaction into the base table, column by column, with the scenario's counts (README, "Lineage (OpenLineage)")."""
    sent = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    table = scn.table_name + "_dag"
    publishes = [
        e for e in sent if e["eventType"] == "COMPLETE" and e["job"]["name"] == f"cdc__{conf.DATABASE}__{table}.publish"
    ]
    metastore = json.loads(env["AIRFLOW_CONN_METASTORE_DEFAULT"])
    columns = [c["name"] for c in scn.table["columns"]]
    landed: list[tuple[str, int]] = []  # (increment, events) since the last compaction
    compactions = []
    for step in scn.steps:
        ((kind, body),) = step.items()
        if kind == "land":
            landed.append((body["increment"], sum(len(rows) for rows in body["files"])))
        elif kind == "compact":
            compactions.append((landed, body))
            landed = []
    assert len(publishes) == len(compactions), [e["job"]["name"] for e in sent]
    for event, (increments, expect) in zip(publishes, compactions, strict=True):
        inputs = {(i["namespace"], i["name"]) for i in event["inputs"]}
        assert inputs == {("file", f"{root.resolve()}/incremental/{inc}") for inc, _ in increments}
        (out,) = event["outputs"]
        assert out["namespace"] == f"hive://{metastore['host']}:{metastore['port']}"
        assert out["name"] == f"{conf.DATABASE}.{table}_base"
        schema = [f["name"] for f in out["facets"]["schema"]["fields"]]
        assert schema == [*columns, "_cdc_increment", "_cdc_file", "_cdc_pos", "_cdc_ingested_at"]
        lineage = out["facets"]["columnLineage"]["fields"]
        assert set(lineage) == set(columns)
        for column, f in lineage.items():
            assert {(i["namespace"], i["name"], i["field"]) for i in f["inputFields"]} == {
                (ns, name, column) for ns, name in inputs
            }
        assert out["outputFacets"]["outputStatistics"]["rowCount"] == len(expect["expect"])
        run = event["run"]["facets"]["cdcCompaction"]
        assert run["eventsIn"] == sum(n for _, n in increments)
        assert run["eventsRejected"] == expect.get("rejected", 0)
        assert run["increments"] == len(increments)
