"""The ``spark_connect`` engine: the job and the DDL in a long-lived Spark Connect server.

One Connect server for the whole file (module fixture, on the session's metastore, stopped by
its PID).  Expectations come from a latest-per-key model written here, never from the job:
a compaction over Connect gives the rows the model gives, and the rows the classic session
gives; a server killed mid-job (SIGKILL by PID) fails the compaction as transient, nothing
live is touched, and the retry against the restarted server commits the right rows.  The
``keyless`` and ``snapshot`` modes over Connect are held against their reference models
(``tests/models``), fed a scenario file's increments.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import compact_once, connect_server_on, visible_names
from models import snapshot_model
from models.keyless_model import KeylessModel, KeylessTable, multiset

from cdc_compaction.core.exceptions import PermanentCompactionError, SparkConnectLostError
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.devtools import conformance
from cdc_compaction.devtools.local_services import LocalMetastore, SparkConnectServer, pid_alive
from cdc_compaction.integrations.engine import ConnectEngine, SessionEngine, connect_lost
from cdc_compaction.job import files as job_files
from cdc_compaction.job.contract import STATS_FILE
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.compact import compact
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import validate
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


@pytest.fixture(scope="module")
def connect_server(metastore: LocalMetastore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkConnectServer]:
    """One Spark Connect server on 127.0.0.1 for this file (its tests kill and restart it), on the session's
    metastore and warehouse."""
    yield from connect_server_on(metastore, tmp_path_factory.mktemp("connect"))


@pytest.mark.s3
def test_a_server_for_s3_lakes_has_the_connections_settings_and_its_credentials_in_its_environment_only(
    tmp_path: Path, aws_default: str
) -> None:
    """No JVM: what ``with_s3a`` starts the server with (the run on moto: test_s3a_connect.py, extended)."""
    server = SparkConnectServer(tmp_path, "thrift://127.0.0.1:9999", "/w", port=12345).with_s3a("aws_default")
    cmd = server.command()
    conf_ = dict(cmd[i + 1].split("=", 1) for i in range(len(cmd) - 1) if cmd[i] == "--conf")
    assert conf_["spark.hadoop.fs.s3a.endpoint"] == aws_default
    assert conf_["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf_["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    # tests/conftest.py's aws_default: its password is the secret key.
    assert not [a for a in cmd if "testing-secret-key" in a or "secret.key" in a or "access.key" in a], cmd
    env = server._env()
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("testing-access-key", "testing-secret-key")
    assert not list(tmp_path.iterdir()), "building the command writes nothing"


def connect_runtime(cfg: TableConfig, endpoint: MetastoreEndpoint, server: SparkConnectServer) -> Runtime:
    # One client retry: a lost server fails the call in well under a second here.
    return Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=ConnectEngine(server.url, cfg, client_retries=1))


# ------------------------------------------------------------------ the reference model
def model(increments: list[list[dict[str, Any]]]) -> dict[int, str]:
    """Visible rows (id -> full_name) after the increments: each key's latest event by ts_ms; a delete hides it."""
    latest: dict[int, dict[str, Any]] = {}
    for events in increments:
        for e in events:
            if e["id"] not in latest or e["ts_ms"] > latest[e["id"]]["ts_ms"]:
                latest[e["id"]] = e
    return {k: e["full_name"] for k, e in latest.items() if e["op"] != "d"}


def ev(i: int, name: str, op: str, ts: int) -> dict[str, Any]:
    return {"id": i, "full_name": name, "op": op, "ts_ms": ts}


INCREMENTS = [
    [ev(1, "ann", "c", 1), ev(2, "bob", "c", 1), ev(3, "cy", "c", 1), ev(4, "di", "c", 1)],
    # An update that moves key 2 to another full_name (another partition when partitioned), a delete,
    # a late update older than the live row (loses), a new key, a key deleted and re-created (latest wins).
    [
        ev(2, "zed", "u", 2),
        ev(3, "cy", "d", 2),
        ev(4, "old", "u", 0),
        ev(5, "eve", "c", 2),
        ev(1, "ann", "d", 3),
        ev(1, "ann2", "c", 4),
    ],
]


def run_once(rt: Runtime, increment: str, rows: list[dict[str, Any]], run_id: str) -> None:
    conformance.land(rt.cfg, increment, [rows])
    path = plan(rt, run_id)
    assert path, f"{run_id}: nothing planned"
    compact(rt, path)
    validate(rt, path)
    publish(rt, path)
    archive(rt, path)


@pytest.mark.slow
#: Partitioned over Connect repeats the unpartitioned run's checks with partition pruning (make test-extended);
#: the partitioned job itself runs in make test through the classic session.
@pytest.mark.parametrize(
    "partitioned",
    [False, pytest.param(True, marks=pytest.mark.extended)],
    ids=["unpartitioned", "partitioned"],
)
def test_connect_compaction_equals_the_model_and_the_classic_session(
    partitioned: bool,
    make_cfg: Any,
    spark: Any,
    endpoint: MetastoreEndpoint,
    connect_server: SparkConnectServer,
) -> None:
    extra = {"partition_by": {"column": "full_name"}} if partitioned else {}
    over_connect = make_cfg(spark={"engine": "spark_connect"}, **extra)
    classic = make_cfg(**extra)
    rt_connect = connect_runtime(over_connect, endpoint, connect_server)
    rt_classic = Runtime(cfg=classic, lake=Lake(classic), metastore=endpoint, engine=SessionEngine(spark))
    # The DDL over Connect: the database and tables land in the metastore the classic session reads.
    ensure_tables(rt_connect)
    ensure_tables(rt_classic)
    for n, rows in enumerate(INCREMENTS):
        for rt in (rt_connect, rt_classic):
            run_once(rt, f"increment_202611200{n}", rows, f"run{n}")
        expected = model(INCREMENTS[: n + 1])
        assert visible_names(spark, over_connect) == expected, f"after increment {n}"
        assert visible_names(spark, classic) == expected, f"after increment {n}"
    # Only data files in the live version (the server's .crc checksums and _SUCCESS were removed).
    live = Path(Lake(over_connect).live_location())
    names = [p.name for p in live.rglob("*") if p.is_file()]
    assert names and all(job_files.is_data_name(n) for n in names), names


def test_a_stale_plan_is_a_permanent_error(
    make_cfg: Any, endpoint: MetastoreEndpoint, connect_server: SparkConnectServer
) -> None:
    cfg = make_cfg(spark={"engine": "spark_connect"})
    rt = connect_runtime(cfg, endpoint, connect_server)
    ensure_tables(rt)
    run_once(rt, "increment_2026112000", INCREMENTS[0], "run0")
    conformance.land(cfg, "increment_2026112001", [INCREMENTS[1]])
    path = plan(rt, "run1")
    # Another plan took this plan's commit number: the job must refuse at once, whatever the retries.
    p = json.loads(rt.lake.storage.read_text(path))
    rt.lake.storage.write_text(p["commit_path"], json.dumps({"plan_id": "someone-else"}))
    with pytest.raises(PermanentCompactionError, match="stale"):
        compact(rt, path)


def test_server_killed_mid_job_then_restarted_commits_right_and_overwrites_nothing_live(
    make_cfg: Any,
    spark: Any,
    endpoint: MetastoreEndpoint,
    connect_server: SparkConnectServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = make_cfg(spark={"engine": "spark_connect"})
    rt = connect_runtime(cfg, endpoint, connect_server)
    ensure_tables(rt)
    run_once(rt, "increment_2026112000", INCREMENTS[0], "run0")
    live_before = rt.lake.live_location()
    files_before = {p: p.stat().st_size for p in Path(live_before).rglob("*") if p.is_file()}
    assert files_before

    conformance.land(cfg, "increment_2026112001", [INCREMENTS[1]])
    path = plan(rt, "run1")
    once = tmp_path / "faults"
    monkeypatch.setenv("CDC_FAULTS", f"compact.after_data@{cfg.qualified_name}=pause")
    monkeypatch.setenv("CDC_FAULTS_ONCE_DIR", str(once))
    reached = once / f"compact.after_data@{cfg.qualified_name}"
    failure: list[BaseException] = []

    def task() -> None:
        try:
            compact(rt, path)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    worker = threading.Thread(target=task)
    worker.start()
    try:
        # The job wrote its data and waits at the fault point: the server dies there, by SIGKILL.
        while not reached.exists() and worker.is_alive():
            worker.join(0.05)
        assert reached.exists(), f"the job never reached compact.after_data: {failure}"
        pid = connect_server.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        while pid_alive(pid):
            threading.Event().wait(0.05)
    finally:
        (once / f"compact.after_data@{cfg.qualified_name}.release").touch()
        worker.join(300)
    assert len(failure) == 1 and isinstance(failure[0], SparkConnectLostError), failure
    assert connect_lost(failure[0])
    # Nothing live changed: the same version, the same files, the rows of the first run.
    assert rt.lake.live_location() == live_before
    assert {p: p.stat().st_size for p in Path(live_before).rglob("*") if p.is_file()} == files_before
    assert visible_names(spark, cfg) == model(INCREMENTS[:1])

    connect_server.start()
    compact(rt, path)  # the task's retry: a new session, a new attempt directory
    validate(rt, path)
    publish(rt, path)
    archive(rt, path)
    assert rt.lake.live_location() != live_before
    assert visible_names(spark, cfg) == model(INCREMENTS[:2])
    # The retry committed its own attempt, with its stats; the crashed attempt has none (it never finished).
    live_version = Path(rt.lake.live_location()).parent
    assert (live_version / STATS_FILE).exists()
    versions = live_version.parent
    assert [d for d in versions.iterdir() if d.is_dir() and not (d / STATS_FILE).exists() and d.name != "v0"]


# ------------------------------------------------------------------ keyless and snapshot modes
SCENARIOS = Path(__file__).parent.parent / "scenarios"


def scenario_over_connect(name: str, lake_dir: Path) -> tuple[dict[str, Any], TableConfig]:
    """A scenario file (its table and steps) and a spark_connect table of that shape under ``lake_dir``."""
    scn = conformance.Scenario.load(SCENARIOS / f"{name}.json")
    doc = conformance.registry_doc(scn, lake_dir, suffix="_over_connect")
    # The server's driver memory is its own: only the session conf a run may set.
    doc["spark"] = {"engine": "spark_connect", "conf": {"spark.sql.shuffle.partitions": "2"}}
    return json.loads(scn.path.read_text()), parse_table(doc)


def test_keyless_over_connect_equals_the_model(
    tmp_path: Path, spark: Any, endpoint: MetastoreEndpoint, connect_server: SparkConnectServer
) -> None:
    # Updates matched by their before columns, then a connector restart's replayed increment.
    doc, cfg = scenario_over_connect("keyless/replayed_increment_after_compaction", tmp_path / "lake")
    rt = connect_runtime(cfg, endpoint, connect_server)
    ensure_tables(rt)
    table = KeylessTable.from_doc(doc["table"])
    model = KeylessModel(table)
    reader = conformance.Reader(spark)

    def data_rows(rows: list[dict[str, Any]]) -> Any:
        return multiset(tuple(r[c] for c in table.data_columns) for r in rows)

    compactions = 0
    # Up to the second compaction (the replays); the scenario's third repeats it, for time.
    for step in doc["steps"][:5]:
        ((kind, body),) = step.items()
        if kind == "land":
            conformance.land(cfg, body["increment"], body["files"])
            model.land(body["increment"], body["files"])
        elif kind == "check_view":
            refresh_view(rt)  # the view's DDL over Connect
            assert data_rows(reader.view(cfg)) == model.view().multiset, f"view before compaction {compactions + 1}"
        elif kind == "compact":
            compactions += 1
            want = model.compact()
            assert compact_once(rt, f"run{compactions}"), f"compaction {compactions}: nothing planned"
            assert data_rows(reader.visible_base(cfg)) == want.multiset, f"compaction {compactions}"
            stats = rt.lake.latest_commit().stats
            got = {k: int(stats.get(s, 0)) for k, s in (("rejected", "rejected_rows"), *conformance.COUNTED.items())}
            assert got == {k: getattr(want, k) for k in got}, f"compaction {compactions}: counts"
    assert compactions == 2 and model.watermark is not None


def test_snapshot_over_connect_equals_the_model(
    tmp_path: Path, spark: Any, endpoint: MetastoreEndpoint, connect_server: SparkConnectServer
) -> None:
    # A first load (all inserts), then a snapshot with an update, an unchanged row, a delete and an insert.
    doc, cfg = scenario_over_connect("snapshot/update_nochange_delete_insert", tmp_path / "lake")
    rt = connect_runtime(cfg, endpoint, connect_server)
    ensure_tables(rt)
    table = snapshot_model.SnapshotTable.from_doc(doc["table"])
    state = snapshot_model.State()
    pending: list[snapshot_model.Increment] = []
    reader = conformance.Reader(spark)

    def as_model(row: dict[str, Any]) -> dict[str, Any]:
        # The model holds dates (eff_start_date, date columns) as ISO strings.
        return {k: v.isoformat() if hasattr(v, "isoformat") and not isinstance(v, str) else v for k, v in row.items()}

    compactions = 0
    for step in doc["steps"]:
        ((kind, body),) = step.items()
        if kind == "land":
            conformance.land(cfg, body["increment"], body["files"])
            pending.append(snapshot_model.Increment(body["increment"], tuple(tuple(f) for f in body["files"])))
        elif kind == "compact":
            compactions += 1
            outcome = snapshot_model.compact(table, state, pending)
            pending = []
            assert compact_once(rt, f"run{compactions}"), f"compaction {compactions}: nothing planned"
            stats = rt.lake.latest_commit().stats
            report = {
                "counts": {op: int(n) for op, n in (stats.get("counts") or {}).items()},
                "applied": [inc for inc, *_ in stats.get("applied", [])],
                "replayed": int(stats.get("replayed", 0)),
                "rejected": {k: v for k, v in (stats.get("rejected") or {}).items() if v},
                "refused": {k: v for k, v in (stats.get("refused") or {}).items() if v},
            }
            current = [as_model(r) for r in reader.visible_base(cfg)]
            history = {d: [as_model(r) for r in rows] for d, rows in reader.history(cfg).items()}
            want = {"expect": state.current_rows(), "history": state.history_rows(), **outcome.report()}
            problems = snapshot_model.mismatches(table, want, current, history, report)
            assert not problems, f"compaction {compactions}: " + "\n".join(problems)
    assert compactions == 2 and state.last_applied is not None


class ConnectRunner(conformance.InProcessRunner):
    """The conformance runner's steps in this process, every Spark step over the module's Connect server."""

    mode = "connect"

    def __init__(self, spark: Any, endpoint: MetastoreEndpoint, server: SparkConnectServer) -> None:
        super().__init__(spark, endpoint)
        self.server = server

    def runtime(self, cfg: TableConfig) -> Runtime:
        return connect_runtime(cfg, self.endpoint, self.server)


def test_key_changes_over_connect_conform(
    tmp_path: Path, spark: Any, endpoint: MetastoreEndpoint, connect_server: SparkConnectServer
) -> None:
    # Key changes (registry old_key): the job ranks the rule's keyed events, a statement over a temporary view.
    scn = conformance.Scenario.load(SCENARIOS / "cdc/old_key_chain.json")
    runner = ConnectRunner(spark, endpoint, connect_server)
    result = conformance.run_scenario(scn, runner, [conformance.Reader(spark)], tmp_path / "lake", suffix="_oc")
    assert result.ok, "\n".join(result.failures)
