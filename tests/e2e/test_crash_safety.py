"""Fault injection: a crash at every step boundary loses no event and applies none twice.

Each case runs the shared scenario ``late_update_for_deleted_key`` (three compactions:
insert, delete, then a late older update that must not resurrect the key) and crashes
the *second* run at one fault point (:mod:`cdc_compaction.job.faults`), either

* ``raise``: the step raises there, in this process, or
* ``kill``: the step runs in its own process (``cdc-compaction step`` -- what
  an Airflow task runs) or as a real ``spark-submit``, which is SIGKILLed there.

While the crash's debris is still there, readers must see the old table or the new one,
never a mix -- through the metastore, the pointer file and the view.  Then the failed
step is retried (what Airflow's retry or "clear" does) and the run goes on; the third
run follows.  Every run must match the scenario's oracle, and at the end:

* no key twice in the base;
* every landed file archived exactly once and gone from the landing area, with no
  half-archived copies or temporaries;
* no leaked version directory, quarantine or ``_temporary`` left by the crash;
* the lease given back, pointer and metastore at the last commit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_compaction.core import sql
from cdc_compaction.core.lake import EMPTY_VERSION, Lake, TableLease
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.settings import PROJECT_ROOT, SPARK_JOBS_DIR, MetastoreEndpoint
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.integrations.engine import SessionEngine, compaction_conf, job_package
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.job import faults
from cdc_compaction.job.faults import InjectedFaultError
from cdc_compaction.pipeline import order
from cdc_compaction.pipeline.plan import plan as run_plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import validate
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

SCENARIO = PROJECT_ROOT.parent / "shared" / "conformance" / "late_update_for_deleted_key.json"
CRASHING_RUN = 2
STEPS = list(order.STEP_IDS)

# (fault point, the task it crashes): every boundary of the commit protocol.
CRASH_POINTS = [
    ("plan.after_plan_written", "plan"),
    ("compact.before_stats", "compact"),  # the job's output is written, its stats are not
    ("publish.before_commit_record", "publish"),  # output complete and validated, not published
    ("publish.after_commit_record", "publish"),  # committed, metastore not swapped yet
    ("publish.after_metastore_swap", "publish"),  # swapped, pointer not written yet
    ("publish.after_pointer", "publish"),  # all done, but publish reports an error: unknown commit state
    ("cleanup.after_first_delete", "publish"),  # old-version cleanup half done
    ("archive.after_first_copy", "archive"),  # one file copied, none deleted
    ("archive.after_first_delete", "archive"),  # some copied and deleted, others not
    ("archive.before_marker", "archive"),  # all moved, the commit not marked archived
    ("refresh_view.after_partitions", "refresh_view"),  # partitions synced, views not refreshed
]


#: Fault points outside a DAG run, crashed by their own tests (test_quarantine.py, pipeline/test_rebuild.py,
#: test_travel.py, test_erase.py, test_spark_connect.py).
OTHER_POINTS = [
    "quarantine.after_first_reingested_file",
    "rebuild.after_first_step",
    "rollback.after_copy",
    "rollback.after_commit_record",
    "rollback.after_metastore_swap",
    "erase.after_first_rewrite",
    "erase.before_commit",
    "erase.after_commit_record",
    "erase.after_first_swap",
    "erase.before_audit",
    "formats.before_delta_commit",  # tests/pipeline/test_formats_delta.py
    "formats.before_iceberg_commit",  # tests/pipeline/test_formats_iceberg.py
    "compact.after_data",  # tests/integrations/test_spark_connect.py: the Connect server killed mid-job
]


def test_every_fault_point_is_tested() -> None:
    assert [p for p, _ in CRASH_POINTS] + OTHER_POINTS == list(faults.POINTS)


def test_the_spark_job_arms_its_fault_points_through_the_one_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job ships with ``cdc_compaction.job.faults`` in its package: one parser for both sides."""
    from cdc_compaction.job import compact as job

    assert job.fault_point is faults.fault_point
    monkeypatch.setenv(faults.ENV, "compact.before_stats@db.t=raise, other=kill")
    with pytest.raises(InjectedFaultError, match=r"injected fault at compact\.before_stats"):
        job.fault_point("compact.before_stats", "db.t")
    job.fault_point("compact.before_stats", "db.other")  # another table: inert
    monkeypatch.setenv(faults.ONCE_ENV, str(PROJECT_ROOT / ".run" / f"once-{os.getpid()}-{time.time_ns()}"))
    with pytest.raises(InjectedFaultError):
        faults.fault_point("compact.before_stats", "db.t")
    faults.fault_point("compact.before_stats", "db.t")  # once: the retry passes


# ----------------------------------------------------------------------------- harness
class CrashRun:
    """One scenario run through the task functions, with a crash injected into one run."""

    def __init__(
        self,
        spark: Any,
        endpoint: MetastoreEndpoint,
        metastore: Any,
        tmp: Path,
        suffix: str,
        scenario: Path = SCENARIO,
        partition_by: dict[str, str] | None = None,
    ) -> None:
        self.spark = spark
        self.endpoint = endpoint
        self.warehouse = str(metastore.warehouse)
        self.scn = conf.Scenario.load(scenario)
        self.compactions = sum(1 for step in self.scn.steps if "compact" in step)
        doc = conf.registry_doc(self.scn, tmp / "lake", suffix, partition_by)
        doc["keep_versions"] = 1  # so that the crashing run's publish has an old version to clean up
        self.registry = tmp / "registry"
        self.registry.mkdir()
        (self.registry / f"{doc['database']}.{doc['table']}.yaml").write_text(yaml.safe_dump(doc))
        self.cfg = parse_table(doc)
        self.rt = Runtime(cfg=self.cfg, lake=Lake(self.cfg), metastore=endpoint, engine=SessionEngine(spark))
        self.reader = conf.Reader(spark)
        self.types = {c.name: c.type for c in self.cfg.columns if c.name != self.cfg.op_column}
        self.landed: list[str] = []
        self.window_checks = 0

    # -- reading --------------------------------------------------------------------
    def rows_differ(self, expect: list[dict[str, Any]], got: list[dict[str, Any]]) -> list[str]:
        return conf.diff_rows(expect, [{k: v for k, v in r.items() if k in self.types} for r in got], self.types)

    def pointer_rows(self) -> list[dict[str, Any]] | None:
        pointer = self.rt.lake.read_pointer()
        if pointer is None:
            return None
        # A partitioned version is its partition map, wherever the partitions live. A plain read of
        # the locations: they hold the visible rows and nothing else.
        locations = list(pointer["partitions"].values()) if "partitions" in pointer else [pointer["location"]]
        if not locations:
            return []
        df = self.spark.read.schema(sql.spark_schema_ddl(self.cfg)).parquet(*locations)
        return [r.asDict() for r in df.collect()]

    def assert_old_or_new(self, old: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
        """What readers see while the crash's debris is still there."""
        base = self.reader.visible_base(self.cfg)
        assert not self.rows_differ(old, base) or not self.rows_differ(new, base), f"base is a mix: {base}"
        pointer = self.pointer_rows()
        if pointer is not None:
            assert not self.rows_differ(old, pointer) or not self.rows_differ(new, pointer), f"pointer: {pointer}"
        # The view dedups base + pending increments: it shows the new state throughout.
        view = self.reader.view(self.cfg)
        assert not self.rows_differ(new, view), f"view: {view}"
        self.window_checks += 1

    # -- running --------------------------------------------------------------------
    def step(self, name: str, run_id: str, plan_path: str) -> Any:
        return order.step(name).call(self.rt, plan_path, run_id)

    def step_in_subprocess(self, name: str, run_id: str, plan_path: str, fault: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins"), faults.ENV: fault}
        if name == "compact":
            # As on a cluster: the job comes from the job package (--py-files) alone, not from plugins/.
            del env["PYTHONPATH"]
            cmd = spark_submit_cmd(self.cfg, plan_path)
        else:
            cmd = [sys.executable, "-m", "cdc_compaction", "step", name, self.cfg.qualified_name]
            cmd += ["--registry-dir", str(self.registry), "--run-id", run_id, "--plan", plan_path]
            cmd += ["--metastore", f"{self.endpoint.host}:{self.endpoint.port}", "--warehouse", self.warehouse]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)

    def one_run(self, run_id: str, crash: tuple[str, str, str] | None = None, old: Any = None, new: Any = None) -> str:
        """ensure_tables ... refresh_view; with ``crash`` = (point, task, raise|kill) one task crashes first."""
        plan_path = ""
        for name in STEPS:
            if order.step(name).takes_plan and not plan_path:
                continue  # plan found nothing: the DAG skips the rest
            if crash is not None and crash[1] == name:
                point, _, mode = crash
                self.crash(name, run_id, plan_path, point, mode)
                self.assert_old_or_new(old, new)
                # Airflow retries the task (or a person clears it): same run, same plan.
            result = self.step(name, run_id, plan_path)
            if name == "plan":
                plan_path = result
        return plan_path

    def crash(self, name: str, run_id: str, plan_path: str, point: str, mode: str) -> None:
        fault = f"{point}@{self.cfg.qualified_name}={mode}"
        if mode == "kill":
            proc = self.step_in_subprocess(name, run_id, plan_path, fault)
            out = proc.stdout + proc.stderr
            if name == "compact":
                # The job's driver was SIGKILLed; spark-submit reports the failure.
                assert proc.returncode != 0 and f"fault injection: kill at {point}" in out, out[-3000:]
            else:
                assert proc.returncode == -signal.SIGKILL, out[-3000:]
            return
        os.environ[faults.ENV] = fault
        try:
            with pytest.raises((InjectedFaultError, RuntimeError), match=f"injected fault at {point}"):
                self.step(name, run_id, plan_path)
        finally:
            del os.environ[faults.ENV]

    def run(self, crash: tuple[str, str, str] | None = None) -> None:
        ensure_tables(self.rt)
        refresh_view(self.rt)
        previous: list[dict[str, Any]] = []
        n = 0
        for step in self.scn.steps:
            ((kind, body),) = step.items()
            if kind == "land":
                # Each increment gets a second, identical file: a duplicate delivery, which by
                # the rule changes nothing -- and gives archiving two files to be halfway through.
                files = [*body["files"], body["files"][0]]
                self.landed += [
                    str(Path(p).relative_to(self.rt.lake.layout.incremental))
                    for p in conf.land(self.cfg, body["increment"], files)
                ]
            elif kind == "check_view":
                refresh_view(self.rt)
                assert not self.rows_differ(body["expect"], self.reader.view(self.cfg))
            elif kind == "compact":
                n += 1
                armed = crash if n == CRASHING_RUN else None
                self.one_run(f"run-{n}", armed, old=previous, new=body["expect"])
                base = self.reader.visible_base(self.cfg)
                assert not self.rows_differ(body["expect"], base), f"run {n}: {base}"
                previous = body["expect"]

    # -- the invariants after recovery ------------------------------------------------
    def assert_clean(self) -> None:
        lake, lay = self.rt.lake, self.rt.lake.layout
        latest = lake.latest_commit()
        base_name = f"`{self.cfg.database}`.`{sql.table_names(self.cfg)['base_table']}`"
        self.spark.catalog.refreshTable(base_name)
        key = list(getattr(self.cfg, "primary_key", []))
        if key:  # a keyless table's rows are a multiset: equal copies are its content
            cols = ", ".join(f"`{c}`" for c in key)
            keys = Counter(tuple(r) for r in self.spark.sql(f"SELECT {cols} FROM {base_name}").collect())
            assert all(c == 1 for c in keys.values()), f"duplicate keys in the base: {keys}"
        # Every landed file: archived exactly once, no longer pending.
        archived = Counter(
            str(p.relative_to(p.parents[1]))
            for p in Path(lay.archive).rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )
        assert archived == Counter(self.landed), f"archive {archived} != landed {self.landed}"
        assert not [p for p in Path(lay.incremental).rglob("*") if p.is_file()], "files left pending"
        leftovers = [p for p in Path(lay.root).rglob("*") if p.name == "_temporary" or p.name.endswith(".copying")]
        assert not leftovers, leftovers
        # No leaked versions: the live one (keep_versions = 1) and the empty genesis, plus, when
        # partitioned, the versions holding partitions the live one reuses (only those partitions).
        # (a partition lives at base/<version>/data/cdc_partition=<v>)
        live = {latest.version} | {Path(loc).parents[1].name for loc in (latest.partitions or {}).values()}
        assert sorted(os.listdir(lay.base)) == sorted([*live, EMPTY_VERSION])
        rows_q = Path(lay.quarantine) / "rows"
        assert not rows_q.exists() or not os.listdir(rows_q), "quarantine of a version never committed"
        assert lake.read_pointer()["seq"] == latest.seq == self.compactions
        base_table = sql.table_names(self.cfg)["base_table"]
        tomb_table = sql.table_names(self.cfg)["tombstones_table"]
        with connect(self.endpoint) as ms:
            loc = ms.table_location(self.cfg.database, base_table)
            partitions = ms.partitions(self.cfg.database, base_table)
            tomb_loc = ms.table_location(self.cfg.database, tomb_table)
        assert tomb_loc == lake.tombstones_location(latest), "the tombstones follow the base"
        if self.cfg.partition_by is None:
            assert loc == lake.data_location(latest)
        else:
            assert loc == lay.base and partitions == latest.partitions
            assert lake.read_pointer()["partitions"] == latest.partitions
            kept = {str(p) for v in live for p in Path(lay.version_dir(v), "data").glob("cdc_partition=*")}
            assert kept == set(latest.partitions.values()), "partitions no commit names are gone"
        held = TableLease(lake).current()
        assert held is None or held.released, held
        for seq in range(1, latest.seq + 1):
            assert lake.is_archived(seq)


@pytest.fixture
def crash_run(request: pytest.FixtureRequest, spark: Any, endpoint: MetastoreEndpoint, metastore: Any, tmp_path: Path):
    suffix = "_x" + format(abs(hash(request.node.name)) % 10**8, "08d")
    run = CrashRun(spark, endpoint, metastore, tmp_path, suffix)
    yield run


#: Killed (SIGKILL of the task's process) as well as raised at: where a dead process leaves what an
#: exception does not -- a lease nobody releases, a job's output without its stats, a commit record
#: without the swap, an archive half moved. At the others a kill and a raise leave the same state.
KILL_POINTS = {
    "plan.after_plan_written",
    "compact.before_stats",
    "publish.after_commit_record",
    "archive.after_first_delete",
}
CRASHES = [(p, t, "raise") for p, t in CRASH_POINTS] + [(p, t, "kill") for p, t in CRASH_POINTS if p in KILL_POINTS]


@pytest.mark.parametrize(("point", "task", "mode"), CRASHES, ids=[f"{p}-{m}" for p, _, m in CRASHES])
def test_crash_then_retry(crash_run: CrashRun, point: str, task: str, mode: str) -> None:
    crash_run.run(crash=(point, task, mode))
    assert crash_run.window_checks == 1
    crash_run.assert_clean()


# ---------------------------------------------------------------- partitioned tables
# delete_then_reinsert partitioned by full_name: the crashing (second) run moves both keys to
# new partitions (Alice -> Angela, Bob -> Carol), so its publish adds two partitions and drops two.
PARTITIONED_SCENARIO = PROJECT_ROOT.parent / "shared" / "conformance" / "delete_then_reinsert.json"
PARTITIONED_POINTS = [
    ("publish.before_commit_record", "publish"),
    ("publish.after_commit_record", "publish"),
    ("publish.after_metastore_swap", "publish"),
    ("publish.after_pointer", "publish"),
]


#: The partitions of Alice, Angela, Bob and Carol, named as docs/partitioned.md encodes identity values.
PARTITION_NAMES = ["A~LICE~", "A~NGELA~", "B~OB~", "C~AROL~"]


@pytest.fixture
def partitioned_run(request: pytest.FixtureRequest, spark: Any, endpoint: MetastoreEndpoint, metastore: Any, tmp_path):
    suffix = "_p" + format(abs(hash(request.node.name)) % 10**8, "08d")
    part = {"column": "full_name", "transform": "identity"}
    return CrashRun(spark, endpoint, metastore, tmp_path, suffix, PARTITIONED_SCENARIO, part)


@pytest.mark.parametrize(("point", "task"), PARTITIONED_POINTS, ids=[p for p, _ in PARTITIONED_POINTS])
def test_partitioned_publish_crash_then_retry(partitioned_run: CrashRun, point: str, task: str) -> None:
    partitioned_run.run(crash=(point, task, "raise"))
    assert partitioned_run.window_checks == 1
    partitioned_run.assert_clean()
    stats = partitioned_run.rt.lake.latest_commit().stats
    # Partitions by their directory names (docs/partitioned.md: small letters between ~, in capitals).
    assert stats["partitions_touched"] == PARTITION_NAMES


def test_partitioned_publish_interrupted_between_moves_and_drops(
    partitioned_run: CrashRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partitions are added and moved, the vanished ones not dropped yet: no key is missing."""
    from cdc_compaction.core.exceptions import MetastoreError
    from cdc_compaction.integrations.metastore import Metastore

    run = partitioned_run
    steps = run.scn.steps
    ensure_tables(run.rt)
    refresh_view(run.rt)
    incremental = Path(run.rt.lake.layout.incremental)
    for i in (0, 2):
        landed = conf.land(run.cfg, steps[i]["land"]["increment"], steps[i]["land"]["files"])
        run.landed += [str(Path(p).relative_to(incremental)) for p in landed]
        if i == 0:
            run.one_run("run-1")
    old, new = steps[1]["compact"]["expect"], steps[4]["compact"]["expect"]
    plan_path = run_plan(run.rt, "run-2")
    run.step("compact", "run-2", plan_path)
    validate(run.rt, plan_path)

    def dying_drop(self: Metastore, db: str, name: str, values: list[str]) -> list[str]:
        if values:
            raise MetastoreError(f"metastore went away before dropping {values}")
        return []

    with monkeypatch.context() as m:
        m.setattr(Metastore, "drop_partitions", dying_drop)
        with pytest.raises(MetastoreError, match="went away"):
            publish(run.rt, plan_path)
    base_table = sql.table_names(run.cfg)["base_table"]
    with connect(run.endpoint) as ms:
        assert sorted(ms.partitions(run.cfg.database, base_table)) == PARTITION_NAMES
    # A reader of the base table sees every key, the moved ones twice; the view sees the new table.
    base = run.reader.visible_base(run.cfg)
    assert Counter(r["id"] for r in base) == {1: 2, 2: 2}
    assert not run.rows_differ(old + new, base)
    assert not run.rows_differ(new, run.reader.view(run.cfg))
    # The retry rolls forward: the vanished partitions go, the table is the new one.
    publish(run.rt, plan_path)
    for name in ("archive", "refresh_view"):
        run.step(name, "run-2", plan_path)
    assert not run.rows_differ(new, run.reader.visible_base(run.cfg))
    run.assert_clean()


def spark_submit_cmd(cfg: TableConfig, plan_path: str) -> list[str]:
    """The compact task's spark-submit command line (what SparkSubmitOperator runs)."""
    import pyspark

    cmd = [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--master", "local[1]"]
    for k, v in {**compaction_conf(cfg), "spark.driver.memory": "512m"}.items():
        cmd += ["--conf", f"{k}={v}"]
    return [*cmd, "--py-files", job_package(), str(SPARK_JOBS_DIR / "compact.py"), "--plan", plan_path]


def _kill_when(proc: subprocess.Popen, where: Path, pattern: str, timeout: float = 300) -> bool:
    """SIGKILL the process group of ``proc`` as soon as ``where`` holds a match of ``pattern``; False if never."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if next(where.glob(pattern), None) is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.005)
    return False


@pytest.fixture
def killable() -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:  # stop what the test started, whatever happened
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_spark_submit_killed_while_writing_the_output(crash_run: CrashRun, killable: list[subprocess.Popen]) -> None:
    """SIGKILL of the whole spark-submit process group while Spark's committer has files in flight."""
    run = crash_run
    ensure_tables(run.rt)
    rows = [{"id": i, "full_name": f"n{i}", "op": "c", "ts_ms": i} for i in range(20000)]
    conf.land(run.cfg, "increment_2026112200", [rows[:10000], rows[10000:]])
    plan_path = run_plan(run.rt, "run-1")
    plan = json.loads(Path(plan_path).read_text())
    # Many small output files keep the write going long enough to be caught in the middle.
    plan["max_records_per_file"] = 50
    Path(plan_path).write_text(json.dumps(plan))
    out = Path(plan["output_location"])  # the job writes <out>-<attempt>/
    proc = subprocess.Popen(
        spark_submit_cmd(run.cfg, plan_path),
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    killable.append(proc)
    assert _kill_when(proc, out.parent, f"{out.name}-*/data/_temporary"), (
        "the job finished before it could be killed mid-write"
    )
    assert proc.returncode == -signal.SIGKILL
    # Debris: a half-written version without stats. validate refuses it; readers see the old (empty) table.
    with pytest.raises(Exception, match="no attempt of the compaction job finished"):
        validate(run.rt, plan_path)
    assert run.reader.visible_base(run.cfg) == []
    # The retried compact task writes a new attempt beside the debris (which publish's cleanup removes).
    run.step("compact", "run-1", plan_path)
    for name in ("validate", "publish", "archive", "refresh_view"):
        run.step(name, "run-1", plan_path)
    assert len(run.reader.visible_base(run.cfg)) == 20000
    assert not [p for p in Path(run.rt.lake.layout.root).rglob("_temporary")]
    stats = run.rt.lake.latest_commit().stats
    assert stats["output_rows"] == 20000 and stats["duplicate_keys"] == 0


# ---------------------------------------------------------------- the other table modes and cdc options
# The commit protocol is the same for every mode; what differs is the job and validate's checks.
# Each crashes in its second run at the boundaries where a mode's output is written, published and
# archived: a keyless table (its watermark row among the tombstones) and a cdc table with key
# changes (old_key) and partial rows (unchanged).
MODE_SCENARIOS = {
    "keyless": PROJECT_ROOT / "tests" / "scenarios" / "keyless" / "seed_003_alice_alice_bob.json",
    "old_key": PROJECT_ROOT / "tests" / "scenarios" / "cdc" / "old_key_chain.json",
    "unchanged": PROJECT_ROOT / "tests" / "scenarios" / "cdc" / "unchanged_placeholder.json",
}
MODE_POINTS = [
    ("compact.before_stats", "compact"),
    ("publish.after_commit_record", "publish"),
    ("archive.after_first_delete", "archive"),
]
#: The keyless table at every point above; the cdc options change the job only: crashed where it writes.
MODE_CASES = [("keyless", point, task) for point, task in MODE_POINTS] + [
    (mode, *MODE_POINTS[0]) for mode in ("old_key", "unchanged")
]


@pytest.mark.parametrize(("mode", "point", "task"), MODE_CASES, ids=[f"{m}-{p}" for m, p, _ in MODE_CASES])
def test_every_mode_crashes_then_retries(
    request: pytest.FixtureRequest,
    spark: Any,
    endpoint: MetastoreEndpoint,
    metastore: Any,
    tmp_path: Path,
    mode: str,
    point: str,
    task: str,
) -> None:
    suffix = "_m" + format(abs(hash(request.node.name)) % 10**8, "08d")
    run = CrashRun(spark, endpoint, metastore, tmp_path, suffix, MODE_SCENARIOS[mode])
    run.run(crash=(point, task, "raise"))
    assert run.window_checks == 1
    run.assert_clean()


SNAPSHOT_POINTS = [("compact.before_stats", "compact"), ("publish.after_metastore_swap", "publish")]


@pytest.mark.parametrize(("point", "task"), SNAPSHOT_POINTS, ids=[p for p, _ in SNAPSHOT_POINTS])
def test_snapshot_mode_crashes_then_retries(make_snapshot_cfg, runtime, spark, point: str, task: str) -> None:
    """mode: snapshot, crashed after the job wrote its current table and history partition (no stats yet), or
    after publish committed and swapped the base but before it registered the history partition.

    The crashed attempt is never published; the retry publishes exactly once, and the history holds
    each business date once (a crashed attempt's partition is cleaned up, never registered). With
    keep_versions 1, the first version stays only for its history partition.
    """
    from conftest import compact_once, snapshot_state

    from cdc_compaction.core.exceptions import CompactionError
    from cdc_compaction.modes.snapshot import history_of

    rt = runtime(make_snapshot_cfg(keep_versions=1))
    ensure_tables(rt)
    refresh_view(rt)
    conf.land(rt.cfg, "increment_2026112200", [[{"id": 1, "full_name": "Ann"}, {"id": 2, "full_name": "Bob"}]])
    compact_once(rt, "run-1")
    day1 = snapshot_state(spark, rt.cfg)
    base_table = f"`{rt.cfg.database}`.`{sql.table_names(rt.cfg)['base_table']}`"

    def ingested() -> dict[int, Any]:
        spark.catalog.refreshTable(base_table)
        return {
            r["id"]: r["_cdc_ingested_at"]
            for r in spark.sql(f"SELECT id, _cdc_ingested_at FROM {base_table}").collect()
        }

    first_stamps = ingested()
    rows = [{"id": 1, "full_name": "Ann"}, {"id": 2, "full_name": "Bobby"}, {"id": 3, "full_name": "Cy"}]
    conf.land(rt.cfg, "increment_2026112300", [rows])
    path = run_plan(rt, "run-2")
    steps = ["compact", "validate", "publish", "archive", "refresh_view"]
    for name in steps[: steps.index(task)]:
        order.step(name).call(rt, path, "run-2")
    os.environ[faults.ENV] = f"{point}@{rt.cfg.qualified_name}=raise"
    try:
        with pytest.raises((InjectedFaultError, RuntimeError), match="injected fault at " + re.escape(point)):
            order.step(task).call(rt, path, "run-2")
    finally:
        del os.environ[faults.ENV]
    base = Path(rt.lake.layout.base)
    new_current = {1: ("Ann", "N", "2026-11-22"), 2: ("Bobby", "U", "2026-11-23"), 3: ("Cy", "I", "2026-11-23")}
    if task == "compact":
        assert [p.name for p in base.glob("v00000002-*/history/eff_start_date=*")] == ["eff_start_date=2026-11-23"]
        with pytest.raises(CompactionError, match="no attempt of the compaction job finished"):
            validate(rt, path)
        assert snapshot_state(spark, rt.cfg) == day1, "readers see the published version only"
    else:
        # Committed and swapped: the current table is new, the history not registered yet (the next
        # publish or plan rolls it forward).
        assert rt.lake.latest_commit().seq == 2
        current, history = snapshot_state(spark, rt.cfg)
        assert current == new_current and history == day1[1]
    for name in steps[steps.index(task) :]:
        order.step(name).call(rt, path, "run-2")
    commit = rt.lake.latest_commit()
    assert commit.seq == 2 and rt.lake.read_commit(3) is None
    assert sorted(history_of(commit)) == ["2026-11-22", "2026-11-23"]
    assert snapshot_state(spark, rt.cfg) == (
        new_current,
        {"2026-11-22": [(1, "Ann", "I"), (2, "Bob", "I")], "2026-11-23": [(2, "Bobby", "U"), (3, "Cy", "I")]},
    )
    stamps = ingested()
    assert stamps[1] == first_stamps[1], "an unchanged row (N) keeps when its values were compacted"
    assert stamps[2] > first_stamps[2] and stamps[3] == stamps[2]
    # Each date once on storage: a crashed attempt went with publish's cleanup; version 1 keeps only its history.
    on_disk = sorted(str(p.relative_to(base)).split("/", 1)[1] for p in base.glob("v0000000[12]-*/history/*"))
    assert on_disk == ["history/eff_start_date=2026-11-22", "history/eff_start_date=2026-11-23"]
    first = rt.lake.read_commit(1)
    assert first is not None and not (base / first.version / "data").exists(), "its current table went"
