"""The deployment id: unique per Airflow deployment by default, and a shared one refused (issue 10 §1.2).

Two deployments share run ids (``scheduled__…``), so with one deployment id both would
hold a table's lease at once. The default id used to be a hash of ``sql_alchemy_conn``:
two deployments with the stock docker-compose URL (or the default SQLite path) shared it,
and nothing noticed an explicitly shared ``CDC_DEPLOYMENT_ID``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import student_doc

from cdc_compaction.core import deployment
from cdc_compaction.core.deployment import Identity
from cdc_compaction.core.exceptions import DeploymentConflictError, is_permanent
from cdc_compaction.core.lake import Lake, TableLease
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.devtools.devenv import airflow_env
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.runtime import Runtime


@pytest.fixture(autouse=True)
def _fresh_identity(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    identity = deployment.identity  # a test may replace it; the cached original is cleared either way
    monkeypatch.delenv(deployment.ENV, raising=False)
    identity.cache_clear()
    yield
    identity.cache_clear()


def _cfg(tmp_path: Path) -> TableConfig:
    return parse_table(student_doc(tmp_path / "lake", "shared"))


# ----------------------------------------------------------------------------- in-process
def test_outside_airflow_the_id_is_the_hosts_or_the_explicit_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not deployment.in_airflow_task()
    ident = deployment.identity()
    assert ident.deployment_id.startswith("local-") and ident.instance is None
    assert deployment.deployment_id() == ident.deployment_id, "one id per process"
    deployment.identity.cache_clear()
    monkeypatch.setenv(deployment.ENV, "blue")
    assert deployment.deployment_id() == "blue"


def test_a_deployment_registers_once_and_another_with_its_id_is_refused(tmp_path: Path) -> None:
    lake = Lake(_cfg(tmp_path))
    blue_a, blue_b = (
        Identity("blue", "aaaa1111", "CDC_DEPLOYMENT_ID"),
        Identity("blue", "bbbb2222", "CDC_DEPLOYMENT_ID"),
    )
    assert deployment.register(lake, blue_a) is True
    assert deployment.register(lake, blue_a) is False, "the same deployment again: nothing to do"
    with pytest.raises(DeploymentConflictError) as raised:
        deployment.register(lake, blue_b)
    message = str(raised.value)
    assert "'blue'" in message and "aaaa1111" in message and "bbbb2222" in message
    assert "CDC_DEPLOYMENT_ID" in message and deployment.registration_path(lake, "blue") in message
    assert is_permanent(raised.value)
    # Another id is another registration; outside Airflow (no instance) nothing is checked.
    assert deployment.register(lake, Identity("green", "bbbb2222", "CDC_DEPLOYMENT_ID")) is True
    assert deployment.register(lake, Identity("blue", None, "host")) is False
    odd = deployment.registration_path(lake, "eu/prod airflow")
    assert Path(odd).parent == Path(lake.layout.control, "deployments") and "/" not in Path(odd).name


def test_an_unreadable_registration_is_refused_with_what_to_do(tmp_path: Path) -> None:
    lake = Lake(_cfg(tmp_path))
    path = Path(deployment.registration_path(lake, "blue"))
    path.parent.mkdir(parents=True)
    path.write_text("{")
    with pytest.raises(DeploymentConflictError, match=r"unreadable .* delete the file"):
        deployment.register(lake, Identity("blue", "aaaa1111", "CDC_DEPLOYMENT_ID"))


def test_plan_refuses_a_shared_deployment_id_before_taking_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg(tmp_path)
    lake = Lake(cfg)
    deployment.register(lake, Identity("blue", "aaaa1111", "CDC_DEPLOYMENT_ID"))
    monkeypatch.setattr(deployment, "identity", lambda: Identity("blue", "bbbb2222", "CDC_DEPLOYMENT_ID"))
    # No metastore on port 9: the refusal comes before anything is read or written.
    rt = Runtime(cfg=cfg, lake=lake, metastore=MetastoreEndpoint("127.0.0.1", 9), engine=None)  # type: ignore[arg-type]
    with pytest.raises(DeploymentConflictError, match="already used by another Airflow deployment"):
        plan(rt, "scheduled__2026-11-22T10:00:00+00:00")
    assert TableLease(lake).current() is None, "no lease was taken"


# ------------------------------------------------------------- real Airflow task processes
PROBE_DAG = '''
"""Reports the deployment identity a real Airflow task process sees, and registers it in a table's lake."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG


def probe() -> None:
    from cdc_compaction.core import deployment
    from cdc_compaction.core.exceptions import DeploymentConflictError
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.registry import load_table

    ident = deployment.identity()
    out = {"id": ident.deployment_id, "instance": ident.instance, "source": ident.source}
    try:
        out["registered_now"] = deployment.register(Lake(load_table(os.environ["CDC_REGISTRY_DIR"], "tests.shared")))
    except DeploymentConflictError as exc:
        out["refused"] = str(exc)
    with open(os.environ["PROBE_OUT"], "a") as fh:
        fh.write(json.dumps(out) + "\\n")


with DAG("deployment_probe", schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC)):
    PythonOperator(task_id="probe", python_callable=probe, retries=0)
'''


class _Deployments:
    """Airflow deployments that all use ONE metadata-database URL (as two stock docker-compose stacks do).

    The URL names one SQLite file; each deployment's database is swapped into that place
    before it runs, so the URL string is identical while the databases differ.
    """

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.db = tmp_path / "metadata" / "airflow.db"
        self.db.parent.mkdir()
        self.out = tmp_path / "probe.jsonl"
        registry = tmp_path / "registry"
        registry.mkdir()
        (registry / "tests.shared.yaml").write_text(yaml.safe_dump(student_doc(tmp_path / "lake", "shared")))
        dags = tmp_path / "dags"
        dags.mkdir()
        (dags / "deployment_probe.py").write_text(PROBE_DAG)
        base = {k: v for k, v in os.environ.items() if k != deployment.ENV}
        self.env = airflow_env(
            tmp_path / "home",
            "thrift://127.0.0.1:9",
            registry_dir=registry,
            base=base,
            sql_alchemy_conn=f"sqlite:///{self.db}",
        )
        self.env.update({"AIRFLOW__CORE__DAGS_FOLDER": str(dags), "PROBE_OUT": str(self.out)})
        self.airflow = str(Path(sys.executable).parent / "airflow")
        self.current: str | None = None

    def create(self, name: str) -> None:
        """A new deployment: a fresh metadata database at the same URL."""
        self._park()
        self._airflow("db", "migrate")
        self.current = name

    def use(self, name: str) -> None:
        if self.current != name:
            self._park()
            shutil.move(self.root / f"{name}.db", self.db)
            self.current = name

    def probe(self, name: str, explicit_id: str | None = None) -> dict[str, Any]:
        """One task of deployment ``name`` in its own process: what identity it sees."""
        self.use(name)
        env = dict(self.env)
        if explicit_id is not None:
            env[deployment.ENV] = explicit_id
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        proc = self._airflow("dags", "test", "deployment_probe", env=env)
        new = self.out.read_text().splitlines()[len(lines) :]
        assert len(new) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        return json.loads(new[0])

    def _park(self) -> None:
        if self.current is not None and self.db.exists():
            shutil.move(self.db, self.root / f"{self.current}.db")
            self.current = None

    def _airflow(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.airflow, *args], env=env or self.env, capture_output=True, text=True, timeout=600, check=False
        )
        assert proc.returncode == 0, f"airflow {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc


@pytest.mark.dag
def test_deployments_with_one_metadata_db_url_get_their_own_ids_and_a_shared_explicit_id_is_refused(
    tmp_path: Path,
) -> None:
    deps = _Deployments(tmp_path)

    # Deployment A: its task processes (each `dags test` is a new one) agree on one id.
    deps.create("a")
    a1, a2 = deps.probe("a"), deps.probe("a")
    assert a1["source"] == "Airflow Variable cdc_compaction_deployment_id"
    assert a1["id"] == a2["id"] == f"airflow-{a1['instance']}" and a1["instance"]
    assert a1["registered_now"] is True and a2["registered_now"] is False

    # Deployment B, same sql_alchemy_conn URL, another database: another id, no conflict.
    deps.create("b")
    b1 = deps.probe("b")
    assert b1["id"] != a1["id"] and b1["instance"] != a1["instance"]
    assert b1["registered_now"] is True and "refused" not in b1

    # Both set CDC_DEPLOYMENT_ID=shared: the first one to run registers it, the other is refused.
    assert deps.probe("b", explicit_id="shared")["registered_now"] is True
    refused = deps.probe("a", explicit_id="shared")
    message = refused["refused"]
    assert "'shared'" in message and a1["instance"] in message and b1["instance"] in message
    assert "already used by another Airflow deployment" in message and "CDC_DEPLOYMENT_ID" in message
    assert refused["id"] == "shared" and refused["instance"] == a1["instance"]
