"""A real distributed engine: DAG runs that submit to a Spark standalone cluster.

A master and one worker from the pyspark wheel run on 127.0.0.1; ``spark_default``
points at ``spark://127.0.0.1:<port>``.  A shared conformance scenario then runs end to
end through ``airflow dags test``, and the master's own status proves the compaction
applications ran on the cluster (not in ``local[*]``).  The test stops both daemons by
PID; the fixture stops them again if the test failed half-way.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_compaction.core.settings import PROJECT_ROOT, MetastoreEndpoint
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db
from cdc_compaction.devtools.local_services import LocalMetastore, SparkStandalone, free_port, pid_alive, port_open

#: A second engine setup (a standalone master and worker) for a scenario make test runs in-process and as
#: DAG runs: make test-extended.
pytestmark = [pytest.mark.dag, pytest.mark.metastore, pytest.mark.spark, pytest.mark.extended]

SCENARIO = PROJECT_ROOT.parent / "shared" / "conformance" / "update_latest_wins.json"
SUFFIX = "_cluster"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    sa = SparkStandalone(
        tmp_path_factory.mktemp("spark-standalone"),
        port=free_port(),
        webui_port=free_port(),
        worker_webui_port=free_port(),
        worker_cores=1,
        worker_memory="1g",
        executor_memory="512m",
        cores_max=1,
    )
    sa.start()
    try:
        yield sa
    finally:
        sa.stop()


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than 127.x, to prove the daemons do not listen there."""
    try:
        candidates = [a for a in socket.gethostbyname_ex(socket.gethostname())[2] if not a.startswith("127.")]
    except OSError:
        candidates = []
    if not candidates:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            candidates = [a for a in [s.getsockname()[0]] if not a.startswith("127.")]
    return candidates[0] if candidates else None


def _wait_for_completed(cluster: SparkStandalone, prefix: str, n: int, timeout_s: float = 30.0) -> dict[str, Any]:
    """The master's status once ``n`` apps named ``prefix…`` are completed (it marks them at driver exit)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = cluster.status()
        done = [a for a in status["completedapps"] if a["name"].startswith(prefix)]
        if len(done) >= n or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def test_scenario_runs_on_a_standalone_cluster(
    cluster: SparkStandalone,
    spark: Any,
    endpoint: MetastoreEndpoint,
    metastore: LocalMetastore,
    tmp_path: Path,
) -> None:
    master_pid, worker_pid = cluster.pid("master"), cluster.pid("worker")
    assert master_pid is not None and worker_pid is not None
    before = cluster.status()
    assert before["status"] == "ALIVE" and before["aliveworkers"] == 1
    assert before["url"] == cluster.master_url == f"spark://127.0.0.1:{cluster.port}"
    assert not before["completedapps"] and not before["activeapps"]
    other = _non_loopback_address()
    for port in (cluster.port, cluster.webui_port, cluster.worker_webui_port):
        assert port_open("127.0.0.1", port)
        assert other is None or not port_open(other, port), f"the cluster answers on {other}:{port}"

    env = airflow_env(
        tmp_path / "airflow",
        metastore.uri,
        registry_dir=tmp_path / "registry",
        spark_master=cluster.master_url,
        warehouse_dir=metastore.home / "warehouse",
    )
    # spark-submit's defaults: executors that fit the one-core, 1 GiB worker.
    env["SPARK_CONF_DIR"] = str(cluster.conf_dir)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    ensure_airflow_db(env)
    runner = conf.DagRunner(spark, endpoint, env)

    scn = conf.Scenario.load(SCENARIO)
    result = conf.run_scenario(scn, runner, conf.Reader(spark), tmp_path / "lake", tmp_path / "registry", SUFFIX)
    assert result.ok, "\n".join(result.failures)

    compactions = sum(1 for s in scn.steps if "compact" in s)
    assert len(runner.timings) == compactions
    for run in runner.timings:
        assert run["state"] == "success", run
        assert {t["task_id"]: t["state"] for t in run["tasks"]}["compact"] == "success", run

    # The master's own record: every compaction was an application of this cluster,
    # it got an executor (cores, memory) and finished.
    table = conf.DATABASE + "." + scn.table_name + SUFFIX
    status = _wait_for_completed(cluster, "cdc-compact-", compactions)
    (tmp_path / "master-status.json").write_text(json.dumps(status, indent=1))  # for a failed run's post-mortem
    apps = [a for a in status["completedapps"] if a["name"].startswith("cdc-compact-")]
    assert len(apps) == compactions, status["completedapps"]
    for app in apps:
        assert app["name"] == f"cdc-compact-{table}"
        assert app["state"] == "FINISHED", app
        assert app["cores"] == 1 and app["memoryperexecutor"] == 512, app
        assert app["duration"] > 0, app
        # ... and the worker's executor of that application ran the job's tasks.
        executor_log = cluster.home / "work" / app["id"] / "0" / "stderr"
        assert "Finished task" in executor_log.read_text(), f"no task ran on the executor: {executor_log}"
    assert not status["activeapps"], status["activeapps"]
    assert status["aliveworkers"] == 1 and status["workers"][0]["coresused"] == 0

    # Stop both daemons by PID; they and their ports are gone.
    assert cluster.stop() is True
    for pid in (master_pid, worker_pid):
        assert not pid_alive(pid)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert cluster.pid("master") is None and cluster.pid("worker") is None
    assert not port_open("127.0.0.1", cluster.port) and not port_open("127.0.0.1", cluster.webui_port)
