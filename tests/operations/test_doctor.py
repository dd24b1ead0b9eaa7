"""``cdc-compaction doctor``: real metastore, real local and S3 (moto) storage, a real SMTP server.

Every fault is a real one: a closed port, a storage root under a regular file, a landed
file whose column type the registry does not allow.  Expected verdicts are written from
the doctor's contract (README, "Doctor"): a FAIL line naming the table and the check,
then a ``fix:`` line, and exit 1.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import student_doc

from cdc_compaction.cli.main import main
from cdc_compaction.core.registry import parse_table
from cdc_compaction.devtools.local_services import free_port
from cdc_compaction.operations import doctor

GOOD = {
    "id": pa.array([1], pa.int32()),
    "full_name": pa.array(["a"]),
    "op": pa.array(["c"]),
    "ts_ms": pa.array([1], pa.int64()),
}


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd API
        self.messages.append(envelope)
        return "250 OK"


@pytest.fixture
def smtp(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Inbox]:
    """aiosmtpd on loopback, reached through the Airflow connection ``smtp_doctor``."""
    from aiosmtpd.controller import Controller

    inbox, port = _Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    conn = {
        "conn_type": "smtp",
        "host": "127.0.0.1",
        "port": port,
        "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "airflow@example.org", "timeout": 10},
    }
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DOCTOR", json.dumps(conn))
    try:
        yield inbox
    finally:
        controller.stop()


def _register(registry: Path, doc: dict[str, Any]) -> None:
    registry.mkdir(parents=True, exist_ok=True)
    (registry / f"{doc['database']}.{doc['table']}.yaml").write_text(yaml.safe_dump(doc))


def _land(root: Path, columns: dict[str, Any]) -> Path:
    path = root / "incremental" / "increment_2026112200" / "part-0.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def _verdicts(out: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(table, check) -> (OK|FAIL line, its fix line or '') of the doctor's output."""
    lines = out.splitlines()
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for i, line in enumerate(lines):
        if line.startswith(("OK  ", "FAIL")):
            subject, check = line[5:].split(": ", 2)[:2]
            nxt = lines[i + 1] if i + 1 < len(lines) and lines[i + 1].strip().startswith("fix:") else ""
            found[(subject, check)] = (line, nxt)
    return found


@pytest.mark.metastore
def test_doctor_of_a_healthy_table_is_all_ok(
    tmp_path: Path, metastore: Any, smtp: _Inbox, capsys: pytest.CaptureFixture[str]
) -> None:
    registry, lake = tmp_path / "registry", tmp_path / "lake"
    doc = student_doc(lake, "doc_ok", alerts={"emails": ["owner@example.org"], "smtp_conn_id": "smtp_doctor"})
    _register(registry, doc)
    _land(lake / "doc_ok", GOOD)

    code = main(["doctor", "tests.doc_ok", "--registry-dir", str(registry), "--metastore", metastore.uri])
    out = capsys.readouterr().out
    assert code == 0, out
    verdicts = _verdicts(out)
    checks = ["registry", "metastore", "storage", "smtp", "spark", "landed"]
    assert sorted(verdicts) == sorted(("tests.doc_ok", c) for c in checks), out
    assert all(line.startswith("OK  ") for line, _ in verdicts.values()), out
    assert "1 pending files" in verdicts[("tests.doc_ok", "landed")][0]
    assert smtp.messages == [], "the SMTP check sends no mail"
    # The probe is deleted, and so is the _cdc directory it made for it (the first run makes it).
    assert not (lake / "doc_ok" / "_cdc").exists(), "the lake is left as doctor found it"
    assert f"all {len(checks)} checks OK" in out


def test_doctor_names_every_fault_and_its_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    registry, lake = tmp_path / "registry", tmp_path / "lake"
    closed = free_port()  # nothing listens there
    blocker = tmp_path / "a-file"
    blocker.write_text("a regular file, so nothing can be created under it")
    monkeypatch.setenv(
        "AIRFLOW_CONN_SMTP_CLOSED", json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": closed})
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CLOSED", json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1", "port": closed})
    )
    _register(registry, {**student_doc(lake, "unwritable"), "storage_root": str(blocker / "unwritable")})
    _register(registry, student_doc(lake, "wrong_type"))
    _land(lake / "wrong_type", {**GOOD, "full_name": pa.array([7], pa.int64())})
    _register(
        registry, student_doc(lake, "no_smtp", alerts={"emails": ["o@example.org"], "smtp_conn_id": "smtp_closed"})
    )
    _register(registry, student_doc(lake, "no_spark", spark={"conn_id": "spark_closed"}))

    code = main(["doctor", "--registry-dir", str(registry), "--metastore", f"thrift://127.0.0.1:{closed}"])
    out = capsys.readouterr().out
    assert code == 1, out
    v = _verdicts(out)

    def failed(table: str, check: str, *fragments: str) -> None:
        line, fix = v[(f"tests.{table}", check)]
        assert line.startswith("FAIL"), out
        for f in fragments:
            assert f in line + fix, (f, line, fix)

    for table in ("unwritable", "wrong_type", "no_smtp", "no_spark"):
        failed(table, "metastore", f"thrift://127.0.0.1:{closed}", "fix: start the metastore", "make metastore-start")
    failed("unwritable", "storage", "fix: make", str(blocker / "unwritable"), "a directory")
    failed(
        "wrong_type",
        "landed",
        "part-0.parquet",
        "column 'full_name' is int64 in the file but string in the registry",
        "fix: land corrected files",
    )
    failed(
        "no_smtp", "smtp", f"127.0.0.1:{closed}", "Connection refused", "fix: start the SMTP server", "'smtp_closed'"
    )
    failed("no_spark", "spark", f"spark://127.0.0.1:{closed}", "fix: start the Spark master", "'spark_closed'")
    # What is not broken says so: a good lake, a table without alerts, local[*].
    for table, check in [("wrong_type", "storage"), ("wrong_type", "smtp"), ("wrong_type", "spark")]:
        assert v[(f"tests.{table}", check)][0].startswith("OK  "), out
    assert v[("tests.no_spark", "landed")][0].startswith("OK  "), "nothing landed: nothing to refuse"


def test_doctor_refuses_an_unknown_table_and_a_broken_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    registry = tmp_path / "registry"
    bad = student_doc(tmp_path / "lake", "bad")
    bad["primary_key"] = ["nope"]
    _register(registry, bad)
    assert main(["doctor", "tests.bad", "tests.gone", "--registry-dir", str(registry)]) == 1
    v = _verdicts(capsys.readouterr().out)
    assert v[("tests.bad", "registry")][0].startswith("FAIL") and "nope" in v[("tests.bad", "registry")][0]
    assert "registry validate" in v[("tests.bad", "registry")][1]
    assert "no registry file for tests.gone" in v[("tests.gone", "registry")][0]
    assert "registry discover" in v[("tests.gone", "registry")][1]


@pytest.mark.s3
def test_doctor_probes_s3_storage_through_the_connection(tmp_path: Path, aws_default: str) -> None:
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=aws_default,
        region_name="us-east-1",
        aws_access_key_id="testing-access-key",
        aws_secret_access_key="testing-secret-key",
    )
    s3.create_bucket(Bucket="doctor-lake")
    cfg = parse_table({**student_doc(tmp_path, "s3t"), "storage_root": "s3://doctor-lake/lake/tests/s3t"})
    check = doctor.check_storage(cfg)
    assert check.ok, check.line()
    assert s3.list_objects_v2(Bucket="doctor-lake").get("KeyCount", 0) == 0, "the probe is deleted"
    assert doctor.check_landed(cfg, doctor.MetastoreEndpoint()).ok

    missing = parse_table({**student_doc(tmp_path, "s3m"), "storage_root": "s3://no-such-bucket-x/lake/s3m"})
    check = doctor.check_storage(missing)
    assert not check.ok and "s3:PutObject" in check.fix and "'aws_default'" in check.fix, check.line()


def test_the_dags_doctor_task_stops_the_run_before_its_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """doctor: true adds one task before ensure_tables; metastore/storage FAIL fails it, SMTP only logs."""
    from cdc_compaction.airflow import factory
    from cdc_compaction.core.exceptions import CompactionError
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.pipeline.order import STEP_IDS
    from cdc_compaction.pipeline.runtime import Runtime

    closed = free_port()
    monkeypatch.setenv(
        "AIRFLOW_CONN_SMTP_CLOSED", json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": closed})
    )
    alerts = {"emails": ["o@example.org"], "smtp_conn_id": "smtp_closed"}
    cfg = parse_table(student_doc(tmp_path / "lake", doctor=True, alerts=alerts))
    plain = factory.build_dag(parse_table(student_doc(tmp_path / "lake")))
    dag = factory.build_dag(cfg)
    assert sorted(t.task_id for t in dag.tasks) == sorted(["doctor", *STEP_IDS])
    assert [t.task_id for t in plain.tasks if t.task_id == "doctor"] == [], "off by default"
    doctor_task = dag.get_task("doctor")
    assert doctor_task.downstream_task_ids == {STEP_IDS[0]} and not doctor_task.upstream_task_ids

    endpoint = MetastoreEndpoint("127.0.0.1", closed)
    monkeypatch.setattr(factory, "_runtime", lambda c: Runtime(cfg=c, lake=Lake(c), metastore=endpoint, engine=None))
    # A handler of our own: Airflow (re)configures logging on first use of its hooks, dropping caplog's.
    warned: list[str] = []
    keep = logging.Handler(logging.WARNING)
    keep.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("cdc_compaction.operations.doctor").addHandler(keep)
    try:
        with pytest.raises(CompactionError, match=r"tests\.student: the doctor task .*metastore.*fix: start the"):
            doctor_task.python_callable()
    finally:
        logging.getLogger("cdc_compaction.operations.doctor").removeHandler(keep)
    assert any(f"SMTP server 127.0.0.1:{closed}" in m and "the run goes on" in m for m in warned), warned


@pytest.mark.metastore
def test_the_dags_doctor_task_passes_when_metastore_and_storage_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metastore: Any
) -> None:
    from cdc_compaction.airflow import factory
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.pipeline.runtime import Runtime

    cfg = parse_table(student_doc(tmp_path / "lake", doctor=True))
    endpoint = MetastoreEndpoint.parse(metastore.uri)
    monkeypatch.setattr(factory, "_runtime", lambda c: Runtime(cfg=c, lake=Lake(c), metastore=endpoint, engine=None))
    result = factory.build_dag(cfg).get_task("doctor").python_callable()
    assert set(result) == {"metastore", "storage", "smtp"} and "answers" in result["metastore"], result


@pytest.mark.s3
def test_doctor_asks_glue_and_emr_through_the_aws_connection(tmp_path: Path, aws_default: str) -> None:
    """Glue answers a read of the table; an EMR cluster counts while it can run a step, not once terminated."""
    import boto3

    from cdc_compaction.core.settings import MetastoreEndpoint

    emr = boto3.client(
        "emr",
        endpoint_url=aws_default,
        region_name="us-east-1",
        aws_access_key_id="testing-access-key",
        aws_secret_access_key="testing-secret-key",
    )
    cluster = emr.run_job_flow(
        Name="cdc-doctor",
        ReleaseLabel="emr-7.1.0",
        Instances={"InstanceCount": 1, "MasterInstanceType": "m5.xlarge", "KeepJobFlowAliveWhenNoSteps": True},
        JobFlowRole="EMR_EC2_DefaultRole",
        ServiceRole="EMR_DefaultRole",
    )["JobFlowId"]
    spark = {"engine": "emr", "emr": {"job_flow_id": cluster, "application": "s3://jobs/cdc/compact.py"}}
    cfg = parse_table(student_doc(tmp_path / "lake", "on_emr", spark=spark))

    glue = doctor.check_metastore(cfg, MetastoreEndpoint(kind="glue"))
    assert glue.ok and "glue://default answers" in glue.detail, glue.line()
    up = doctor.check_spark(cfg)
    assert up.ok and cluster in up.detail, up.line()

    emr.terminate_job_flows(JobFlowIds=[cluster])
    down = doctor.check_spark(cfg)
    assert not down.ok and f"EMR cluster {cluster} is TERMINAT" in down.detail, down.line()
    assert "spark.emr.job_flow_id" in down.fix


def test_doctor_reaches_the_spark_connect_server_of_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark_connect: the server of the connection accepts a TCP connection (a listening socket), else the fix."""
    import socket

    cfg = parse_table(student_doc(tmp_path / "lake", "on_connect", spark={"engine": "spark_connect"}))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        conn = {"conn_type": "spark_connect", "host": "127.0.0.1", "port": port}
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", json.dumps(conn))
        up = doctor.check_spark(cfg)
        assert up.ok and f"127.0.0.1:{port} accepts connections" in up.detail, up.line()
    down = doctor.check_spark(cfg)
    assert not down.ok and "does not accept connections" in down.detail, down.line()
    assert "make connect-start" in down.fix and "spark_connect_default" in down.fix


def _doctor_cli(registry: Path, cwd: Path, env: dict[str, str], prelude: str = "") -> Any:
    """``python -m cdc_compaction doctor`` in a process of its own (its own logging setup), from ``cwd``."""
    import os
    import subprocess
    import sys

    plugins = str(Path(__file__).resolve().parents[2] / "plugins")
    code = f"{prelude}\nimport sys\nfrom cdc_compaction.cli.main import main\nsys.exit(main(sys.argv[1:]))"
    closed = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "CDC_"))}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "doctor",
            "--registry-dir",
            str(registry),
            "--metastore",
            f"thrift://127.0.0.1:{closed}",
        ],
        cwd=cwd,
        env={**base, "PYTHONPATH": plugins, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_doctor_hints_match_the_cause_and_its_output_is_only_its_lines(tmp_path: Path) -> None:
    """An undefined connection is to be defined, not "start the Spark master"; the clients' own error logs and
    tracebacks stay out of the report (CDC_LOG_LEVEL=DEBUG shows them)."""
    registry = tmp_path / "registry"
    _register(registry, student_doc(tmp_path / "lake", "no_conn", spark={"conn_id": "spark_nowhere"}))
    proc = _doctor_cli(registry, tmp_path, {"AIRFLOW_HOME": str(tmp_path / "airflow")})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line, fix = _verdicts(proc.stdout)[("tests.no_conn", "spark")]
    assert line.startswith("FAIL") and "spark_nowhere" in line, proc.stdout
    assert "define the Airflow connection 'spark_nowhere'" in fix and "AIRFLOW_CONN_SPARK_NOWHERE" in fix, fix
    assert "start the Spark master" not in fix, fix
    # The metastore does not answer: its FAIL line says so, and nothing else is printed about it.
    assert _verdicts(proc.stdout)[("tests.no_conn", "metastore")][0].startswith("FAIL")
    assert "Traceback" not in proc.stdout + proc.stderr and "Could not connect" not in proc.stderr, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(("OK  ", "FAIL")), "the report starts with its first check"
    loud = _doctor_cli(registry, tmp_path, {"AIRFLOW_HOME": str(tmp_path / "airflow"), "CDC_LOG_LEVEL": "DEBUG"})
    assert "Could not connect" in loud.stderr, "at DEBUG the clients' own messages are there"


def test_doctor_without_airflow_says_to_install_it(tmp_path: Path) -> None:
    """Where Airflow cannot be imported, the checks that read its connections say so: no "start the master"."""
    registry = tmp_path / "registry"
    _register(registry, student_doc(tmp_path / "lake", "no_airflow", spark={"conn_id": "spark_closed"}))
    # Python's own way to make an import fail as if the package were not installed.
    proc = _doctor_cli(registry, tmp_path, {}, prelude="import sys\nsys.modules['airflow'] = None")
    line, fix = _verdicts(proc.stdout)[("tests.no_airflow", "spark")]
    assert line.startswith("FAIL") and "ModuleNotFoundError" in line, proc.stdout + proc.stderr
    assert "'airflow' is missing" in fix and "start the Spark master" not in fix, fix


def test_doctor_writes_nothing_outside_the_lake_and_leaves_no_probe_folders(tmp_path: Path) -> None:
    """A relative storage root (hanging off $CDC_LAKE_BASE), doctor run from another directory: the probe is
    written under the table's root, and every directory it made for it is gone afterwards."""
    registry, base, cwd = tmp_path / "registry", tmp_path / "lakes", tmp_path / "cwd"
    base.mkdir()
    cwd.mkdir()
    _register(registry, {**student_doc(tmp_path, "relative"), "storage_root": "shop/relative"})
    proc = _doctor_cli(registry, cwd, {"CDC_LAKE_BASE": str(base), "AIRFLOW_HOME": str(tmp_path / "airflow")})
    line, _ = _verdicts(proc.stdout)[("tests.relative", "storage")]
    assert line.startswith("OK") and str(base / "shop" / "relative" / "_cdc") in line, proc.stdout + proc.stderr
    assert list(cwd.iterdir()) == [], "doctor wrote into the current directory"
    assert list(base.iterdir()) == [], "doctor left the directories it made for its probe"


def test_a_file_that_is_not_parquet_is_called_unreadable_not_a_schema_change(tmp_path: Path) -> None:
    """A CSV landed under a Parquet name: re-land or quarantine it; the registry's columns are not the fault."""
    cfg = parse_table(student_doc(tmp_path / "lake", "not_parquet"))
    landed = tmp_path / "lake" / "not_parquet" / "incremental" / "increment_2026112200" / "part-0.parquet"
    landed.parent.mkdir(parents=True)
    landed.write_text("id,full_name,op,ts_ms\n1,a,c,1\n")
    check = doctor.check_landed(cfg, doctor.MetastoreEndpoint())
    assert not check.ok, check.line()
    assert "part-0.parquet" in check.detail and "not readable as Parquet" in check.detail, check.line()
    assert "column" not in check.fix, check.line()
    for step in ("re-land", "on_bad_file: quarantine", "docs/data.md#bad-input-and-the-quarantine"):
        assert step in check.fix, (step, check.line())

    # A file that is Parquet but does not fit the columns keeps its schema advice.
    pq.write_table(pa.table({**GOOD, "full_name": pa.array([7], pa.int64())}), landed)
    check = doctor.check_landed(cfg, doctor.MetastoreEndpoint())
    assert not check.ok and "registry's columns" in check.fix and "docs/data.md#changing-a-schema" in check.fix
