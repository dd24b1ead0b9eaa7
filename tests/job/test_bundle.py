"""The job package: a deterministic zip that alone carries the job, built when a task runs, never at parse.

Every way the DAG runs Spark gets it: the compact task's spark-submit, the DDL's spark-submit
(``SparkSubmitEngine``) and the EMR step (``--py-files`` with its S3 URI).  That spark-submit
really runs the job from it is shown by tests/e2e/test_reentrancy.py (the DAG's compact task) and
tests/e2e/test_crash_safety.py (``compact.before_stats`` killed, spark-submit without plugins/).
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.job import bundle

EMR = {"job_flow_id": "j-ABC123", "application": "s3://code-bucket/cdc/compact.py"}


@pytest.fixture
def package_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where task runs build the job package in this test (empty at first)."""
    d = tmp_path / "job-package"
    monkeypatch.setenv("CDC_JOB_PACKAGE_DIR", str(d))
    return d


def test_the_same_source_gives_the_same_bytes_and_name(tmp_path: Path) -> None:
    first, second = bundle.build(tmp_path / "a"), bundle.build(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes() == bundle.build_bytes()
    assert first.name == second.name == bundle.file_name(first.read_bytes())
    assert first.name.startswith("cdc_compaction_job-") and first.suffix == ".zip"
    # Built again into the same directory: the file of that name is kept as it is.
    before = first.stat().st_mtime_ns
    assert bundle.build(tmp_path / "a") == first and first.stat().st_mtime_ns == before
    assert [p.name for p in (tmp_path / "a").iterdir()] == [first.name], "no temporary file left behind"


def test_entries_are_sorted_with_fixed_times_and_modes_and_only_the_job() -> None:
    with zipfile.ZipFile(io.BytesIO(bundle.build_bytes())) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    job_dir = bundle.PACKAGE_DIR / "job"
    expected = ["cdc_compaction/__init__.py"] + [
        f"cdc_compaction/job/{p.relative_to(job_dir).as_posix()}" for p in job_dir.rglob("*.py")
    ]
    assert names == sorted(names) == sorted(expected)
    assert {"cdc_compaction/job/compact.py", "cdc_compaction/job/contract.py"} <= set(names)
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {(i.external_attr >> 16) & 0o777 for i in infos} == {0o644}
    assert {i.compress_type for i in infos} == {zipfile.ZIP_STORED}


def test_another_source_gives_another_name(tmp_path: Path) -> None:
    copy = tmp_path / "cdc_compaction"
    shutil.copytree(bundle.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    same = bundle.build_bytes(copy)
    assert same == bundle.build_bytes(), "the bytes depend on the sources, not on where they are or when"
    with (copy / "job" / "contract.py").open("a", encoding="utf-8") as fh:
        fh.write("\n# changed\n")
    assert bundle.file_name(bundle.build_bytes(copy)) != bundle.file_name(same)


def test_a_new_package_prunes_superseded_ones_only_when_they_are_old(tmp_path: Path) -> None:
    out = tmp_path / "jobs"
    out.mkdir()
    day = 24 * 3600
    old = out / f"{bundle.PREFIX}00000000000000aa.zip"
    recent = out / f"{bundle.PREFIX}00000000000000bb.zip"
    other = out / "someone-elses.zip"
    for path, age in ((old, 3 * day), (recent, 3600), (other, 30 * day)):
        path.write_bytes(b"x")
        os.utime(path, (path.stat().st_atime, path.stat().st_mtime - age))
    built = bundle.build(out)
    # A job submitted an hour ago may still read its zip; three days ago, none can.
    assert sorted(p.name for p in out.iterdir()) == sorted([built.name, recent.name, other.name])
    # The current package itself is never pruned, however old its file.
    os.utime(built, (built.stat().st_atime, built.stat().st_mtime - 10 * day))
    assert bundle.prune(out, keep=built) == [] and built.is_file()
    assert bundle.prune(out, keep=built, now=recent.stat().st_mtime + 3 * day) == [recent]


def test_the_zip_alone_carries_the_job(tmp_path: Path) -> None:
    """A fresh interpreter with the zip and the venv's site-packages (pyspark), without plugins/, imports the job."""
    path = bundle.build(tmp_path / "pkg")
    code = (
        "import json, sys\n"
        "import cdc_compaction.job.compact as c, cdc_compaction.job.run_sql as r\n"
        "print(json.dumps({'compact': c.__file__, 'run_sql': r.__file__, 'main': callable(c.main),"
        " 'modes': c.mode_names(), 'plugins': [p for p in sys.path if p.rstrip('/').endswith('plugins')]}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(path)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["compact"] == f"{path}/cdc_compaction/job/compact.py"
    assert got["run_sql"] == f"{path}/cdc_compaction/job/run_sql.py"
    assert got["main"] is True and got["plugins"] == []
    # The entry point finds the modes it dispatches to inside the zip as in a directory.
    source = Path(__file__).resolve().parents[2] / "plugins" / "cdc_compaction" / "job" / "modes"
    assert got["modes"] == sorted(p.stem for p in source.glob("*.py") if p.stem != "__init__")
    assert {"cdc", "keyless", "snapshot", "append"} <= set(got["modes"])
    # ... and nothing else of the package is in it: the Airflow side stays behind.
    probe = subprocess.run(
        [sys.executable, "-c", "import cdc_compaction.tasks"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode != 0 and "No module named 'cdc_compaction.tasks'" in probe.stderr


def test_the_cli_builds_it_and_prints_its_path(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins")}
    proc = subprocess.run(
        [sys.executable, "-m", "cdc_compaction", "job-package", "--out", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    printed = Path(proc.stdout.strip())
    assert printed.parent == tmp_path and printed.read_bytes() == bundle.build_bytes()


# ------------------------------------------------------------------ spark-submit gets it, at run time only
def _py_files(cmd: list[str]) -> str:
    """The value of ``--py-files`` in a spark-submit command line."""
    return cmd[cmd.index("--py-files") + 1]


def test_the_compact_task_builds_it_when_it_runs_not_when_the_dag_is_parsed(
    make_cfg: Callable[..., TableConfig], package_dir: Path
) -> None:
    from cdc_compaction.airflow.factory import build_dag

    op = build_dag(make_cfg()).get_task("compact")
    assert not package_dir.exists(), "building the DAG must not build (or read) the job package"
    assert op.py_files is None
    op.application_args = ["--plan", "/lake/t/_cdc/plans/p.json"]
    hook = op._get_hook()  # what execute does first
    cmd = hook._build_spark_submit_command(op.application)
    zip_path = Path(_py_files(cmd))
    assert zip_path.parent == package_dir and zip_path.read_bytes() == bundle.build_bytes()
    assert cmd[-3:] == [op.application, "--plan", "/lake/t/_cdc/plans/p.json"]
    assert op.application == str(PROJECT_ROOT / "include" / "spark_jobs" / "compact.py")


def test_the_ddl_submission_ships_it(
    make_cfg: Callable[..., TableConfig], package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.integrations.engine import SparkSubmitEngine

    commands: list[list[str]] = []
    monkeypatch.setattr(
        SparkSubmitHook,
        "submit",
        lambda self, application: commands.append(self._build_spark_submit_command(application)),
    )
    SparkSubmitEngine(MetastoreEndpoint("127.0.0.1", 9083), "/tmp/warehouse").run_sql(make_cfg(), ["SELECT 1"])
    (cmd,) = commands
    assert Path(_py_files(cmd)).parent == package_dir
    assert cmd[-3].endswith("include/spark_jobs/run_sql.py")


# ------------------------------------------------------------------ EMR: --py-files with an S3 URI
def _emr_step_args(cfg: TableConfig, plan: str = "s3://lake/t/_cdc/plans/p.json") -> tuple[Any, list[str]]:
    from cdc_compaction.airflow.factory import build_dag

    submit = build_dag(cfg).get_task("compact_submit")
    submit.plan_path = plan  # what rendering the plan task's XCom gives
    return submit, submit.steps_with_plan()[0]["HadoopJarStep"]["Args"]


def test_emr_derives_the_zip_beside_the_application_when_the_task_runs(
    make_cfg: Callable[..., TableConfig], package_dir: Path
) -> None:
    from cdc_compaction.airflow.factory import PY_FILES_PLACEHOLDER

    submit, args = _emr_step_args(make_cfg(spark={"engine": "emr", "emr": EMR}))
    parsed = submit.steps[0]["HadoopJarStep"]["Args"]
    assert parsed[-5:-3] == ["--py-files", PY_FILES_PLACEHOLDER], "at parse time: a placeholder, no source read"
    name = bundle.file_name(bundle.build_bytes())
    assert args[-5:] == ["--py-files", f"s3://code-bucket/cdc/{name}", EMR["application"], "--plan", args[-1]]
    assert args[-1] == "s3://lake/t/_cdc/plans/p.json"
    assert not package_dir.exists(), "the EMR step only needs the zip's name; the user uploads the zip"


def test_emr_uses_the_registrys_zip_as_written_and_warns_when_it_is_not_this_source(
    make_cfg: Callable[..., TableConfig], caplog: pytest.LogCaptureFixture
) -> None:
    name = bundle.file_name(bundle.build_bytes())
    current = f"s3://other-bucket/jobs/{name}"
    with caplog.at_level(logging.WARNING, logger="cdc_compaction.integrations.engine"):
        _, args = _emr_step_args(make_cfg(spark={"engine": "emr", "emr": {**EMR, "py_files": current}}))
    assert args[-5:-3] == ["--py-files", current] and not caplog.records
    stale = "s3://other-bucket/jobs/cdc_compaction_job-0000000000000000.zip"
    with caplog.at_level(logging.WARNING, logger="cdc_compaction.integrations.engine"):
        _, args = _emr_step_args(make_cfg(spark={"engine": "emr", "emr": {**EMR, "py_files": stale}}))
    assert args[-5:-3] == ["--py-files", stale]
    assert [r.getMessage() for r in caplog.records if name in r.getMessage() and stale in r.getMessage()]


def test_emr_steps_outside_a_dag_name_the_zip_directly(make_cfg: Callable[..., TableConfig]) -> None:
    from cdc_compaction.integrations.engine import emr_steps

    (step,) = emr_steps(make_cfg(spark={"engine": "emr", "emr": EMR}), "s3://lake/p.json")
    args = step["HadoopJarStep"]["Args"]
    assert args[-5:-3] == ["--py-files", f"s3://code-bucket/cdc/{bundle.file_name(bundle.build_bytes())}"]


@pytest.mark.parametrize(
    "bad", ["/local/cdc_compaction_job.zip", "s3://b/x/../job.zip", "s3://code-bucket/cdc/job.tar.gz"]
)
def test_a_py_files_that_is_no_s3_zip_is_refused(make_cfg: Callable[..., TableConfig], bad: str) -> None:
    with pytest.raises(Exception, match="must be the s3:// URI of the deployed job package zip"):
        make_cfg(spark={"engine": "emr", "emr": {**EMR, "py_files": bad}})
