"""DAG integrity over Airflow's real DagBag: the shipped registry and broken ones."""

from __future__ import annotations

import html
import itertools
import json
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from conftest import student_doc
from core.test_registry import HOSTILE_FILES

from cdc_compaction.core.registry import load_registry
from cdc_compaction.core.settings import ERASE_DAG_ID, PROJECT_ROOT, VIEW_REFRESH_DAG_ID, registry_dir
from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db
from cdc_compaction.integrations import notifications
from cdc_compaction.pipeline.order import STEP_IDS

DAGS = PROJECT_ROOT / "dags"
TASK_ORDER = list(STEP_IDS)
#: The DAG that keeps every table's views fresh between compactions (one per deployment).
REFRESHER = VIEW_REFRESH_DAG_ID
#: The manual-only erase DAG over every valid table (one per deployment).
ERASER = ERASE_DAG_ID


def _dagbag(registry: Path | None = None, monkeypatch: pytest.MonkeyPatch | None = None):
    from airflow.dag_processing.dagbag import DagBag

    if registry is not None and monkeypatch is not None:
        monkeypatch.setenv("CDC_REGISTRY_DIR", str(registry))
    return DagBag(dag_folder=str(DAGS))


@pytest.fixture(scope="module")
def dagbag():
    return _dagbag()


def test_no_import_errors_and_one_dag_per_table(dagbag) -> None:
    assert dagbag.import_errors == {}
    entries = load_registry(registry_dir())
    assert entries, "the shipped registry is not empty"
    assert sorted(dagbag.dag_ids) == sorted([REFRESHER, ERASER, *(e.config.dag_id for e in entries if e.config)])


def test_dag_settings(dagbag) -> None:
    for entry in load_registry(registry_dir()):
        cfg = entry.config
        assert cfg is not None
        dag = dagbag.dags[cfg.dag_id]
        assert dag.max_active_runs == 1
        assert dag.catchup is False
        assert dag.start_date is not None and dag.start_date == cfg.start_date
        assert {"cdc", f"database:{cfg.database}", f"table:{cfg.table}", f"owner:{cfg.owner}"} <= set(dag.tags)
        assert cfg.qualified_name in dag.doc_md and all(c.name in dag.doc_md for c in cfg.columns)
        for t in dag.tasks:
            assert t.owner == cfg.owner
            assert t.retries >= 1 and t.retries == cfg.retries
            assert t.retry_exponential_backoff
            assert t.on_failure_callback, f"{t.task_id} has no failure alert"


def test_task_chain_and_operators(dagbag) -> None:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    for dag_id, dag in dagbag.dags.items():
        if dag_id in (REFRESHER, ERASER):
            continue
        assert {t.task_id for t in dag.tasks} == set(TASK_ORDER)
        for up, down in itertools.pairwise(TASK_ORDER):
            assert down in dag.get_task(up).downstream_task_ids, f"{up} -> {down} missing in {dag.dag_id}"
        # A DAG with a cycle cannot be sorted; this raises if it has one.
        assert next(t.task_id for t in dag.topological_sort()) == "ensure_tables"
        compact = dag.get_task("compact")
        assert isinstance(compact, SparkSubmitOperator)
        assert compact.application.endswith("include/spark_jobs/compact.py")
        assert Path(compact.application).is_file()
        assert compact._conn_id == "spark_default"
        assert "ti.xcom_pull(task_ids='plan')" in " ".join(compact.application_args)
        plan = dag.get_task("plan")
        # The next run's plan waits for this run's whole critical section (backfill-safe).
        assert plan.depends_on_past and plan.wait_for_downstream
        assert plan.downstream_task_ids == set(TASK_ORDER[2:])
        outlets = dag.get_task("publish").outlets
        assert len(outlets) == 1 and outlets[0].name.endswith("_base")


def test_the_view_refresher_covers_every_table_by_database(dagbag) -> None:
    """One DAG keeps every table's views fresh: a task per database, on a short schedule, no Spark."""
    dag = dagbag.dags[REFRESHER]
    databases = {e.config.database for e in load_registry(registry_dir()) if e.config}
    assert {t.task_id for t in dag.tasks} == {f"refresh__{db}" for db in databases}
    assert dag.timetable.expression == "*/5 * * * *"
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert not any(type(t).__name__.startswith("Spark") for t in dag.tasks)


def _write(dirpath: Path, name: str, doc: dict) -> None:
    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / name).write_text(yaml.safe_dump(doc))


def test_a_disabled_table_keeps_its_dag_in_the_dag_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """enabled: false through the real DAG file: the DAG is there with every task, unscheduled and paused."""
    good = yaml.safe_load((registry_dir() / "school.student.yaml").read_text())
    _write(tmp_path, "school.student.yaml", good)
    _write(tmp_path, "school.teacher.yaml", {**good, "table": "teacher", "enabled": False, "storage_root": "t"})
    bag = _dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    teacher, student = bag.dags["cdc__school__teacher"], bag.dags["cdc__school__student"]
    assert [t.task_id for t in teacher.tasks] == [t.task_id for t in student.tasks]
    assert teacher.schedule is None and student.schedule == good.get("schedule", "@hourly")
    assert teacher.is_paused_upon_creation is True and "disabled" in teacher.tags


def test_a_bad_registry_file_breaks_only_its_own_dag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = yaml.safe_load((registry_dir() / "school.student.yaml").read_text())
    _write(tmp_path, "school.student.yaml", good)
    _write(tmp_path, "school.teacher.yaml", {**good, "table": "teacher", "order_by": ["no_such_column"]})
    _write(tmp_path, "school.course.yaml", {**good, "table": "course", "database": "school; DROP TABLE x"})
    bag = _dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == sorted(
        ["cdc__school__course", "cdc__school__student", "cdc__school__teacher", REFRESHER, ERASER]
    )
    # The view refresher covers the good tables only.
    assert [t.task_id for t in bag.dags[REFRESHER].tasks] == ["refresh__school"]
    assert {t.task_id for t in bag.dags["cdc__school__student"].tasks} == set(TASK_ORDER)
    teacher, course = bag.dags["cdc__school__teacher"], bag.dags["cdc__school__course"]
    assert "school.teacher.yaml" in teacher.doc_md and "order_by" in teacher.doc_md
    assert "no_such_column" in teacher.doc_md
    assert "school.course.yaml" in course.doc_md and "field 'database'" in course.doc_md
    # Each error DAG reports only its own file.
    assert "school.course.yaml" not in teacher.doc_md
    for dag in (teacher, course):
        assert dag.schedule is None or dag.timetable.summary == "None"
        assert [t.task_id for t in dag.tasks] == ["registry_error"]


@pytest.mark.parametrize(("content", "fragment"), HOSTILE_FILES)
def test_a_hostile_registry_file_hides_no_other_dag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, fragment: str
) -> None:
    good = yaml.safe_load((registry_dir() / "school.student.yaml").read_text())
    _write(tmp_path, "school.student.yaml", good)
    _write(tmp_path, "school.teacher.yaml", {**good, "table": "teacher", "storage_root": "./.lake/school/teacher"})
    (tmp_path / "tests.student.yaml").write_bytes(content)
    bag = _dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == sorted(
        ["cdc__school__student", "cdc__school__teacher", "cdc__tests__student", REFRESHER, ERASER]
    )
    assert fragment in bag.dags["cdc__tests__student"].doc_md


def test_a_bad_database_defaults_file_breaks_only_its_databases_dags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``<registry>/<db>/_database.yaml`` with an unknown key: that database's tables get error DAGs, no other."""
    reg = tmp_path / "registry"  # the lakes beside it: a root inside a registry directory is refused
    _write(reg, "tests.student.yaml", student_doc(tmp_path / "lake", "student"))
    _write(reg, "school.student.yaml", {**student_doc(tmp_path / "lake2", "student"), "database": "school"})
    _write(reg / "tests", "_database.yaml", {"owner": "tests-team", "retires": 2})
    _write(reg / "school", "_database.yaml", {"owner": "school-team"})
    bag = _dagbag(reg, monkeypatch)
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == sorted(["cdc__school__student", "cdc__tests__student", REFRESHER, ERASER])
    broken, good = bag.dags["cdc__tests__student"], bag.dags["cdc__school__student"]
    assert [t.task_id for t in broken.tasks] == ["registry_error"]
    assert "_database.yaml" in broken.doc_md and "retires" in broken.doc_md
    assert {t.task_id for t in good.tasks} == set(TASK_ORDER)
    assert good.owner == "school-team"


def test_a_registry_error_dag_fails_its_task_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    good = yaml.safe_load((registry_dir() / "school.student.yaml").read_text())
    good["primay_key"] = good.pop("primary_key")
    _write(tmp_path, "school.student.yaml", good)
    bag = _dagbag(tmp_path, monkeypatch)
    task = bag.dags["cdc__school__student"].get_task("registry_error")
    assert task.retries == 0
    with pytest.raises(AirflowFailException) as exc_info:
        task.python_callable()
    message = str(exc_info.value)
    assert "school.student.yaml" in message and "school.student" in message and "primay_key" in message


def test_a_task_process_parse_of_an_overlapping_table_gets_the_error_dag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's process parses the DAG file for its own DAG only: it must still refuse an overlapping root."""
    from airflow.sdk.exceptions import AirflowFailException

    _write(tmp_path / "registry", "tests.inner.yaml", student_doc(tmp_path / "lake" / "outer", "inner"))
    _write(tmp_path / "registry", "tests.outer.yaml", student_doc(tmp_path / "lake", "outer"))
    _write(tmp_path / "registry", "tests.other.yaml", student_doc(tmp_path / "lake", "other"))
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", "cdc__tests__inner")
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_TASK_ID", "plan")
    bag = _dagbag(tmp_path / "registry", monkeypatch)
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == ["cdc__tests__inner"], "only the task's own DAG is built"
    dag = bag.dags["cdc__tests__inner"]
    assert sorted(dag.task_ids) == ["registry_error"], "the same error DAG the DAG processor shows"
    with pytest.raises(AirflowFailException, match="overlaps storage_root") as raised:
        dag.get_task("registry_error").python_callable()
    assert "tests.outer.yaml" in str(raised.value)


def test_a_registry_error_is_logged_at_parse_time(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from cdc_compaction.airflow.factory import build_dags

    _write(tmp_path, "tests.bad.yaml", {"database": "tests", "table": "bad"})
    with caplog.at_level("ERROR", logger="cdc_compaction.airflow.factory"):
        build_dags(load_registry(tmp_path))
    assert any(r.levelname == "ERROR" and "tests.bad.yaml" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("file_name", "dag_id"),
    [
        pytest.param("my-db.my table.yaml", "cdc__my_db__my_table", id="unsafe-chars"),
        pytest.param("lonely.yml", "cdc__lonely", id="no-table-part"),
    ],
)
def test_a_badly_named_file_gets_a_sanitized_error_dag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_name: str, dag_id: str
) -> None:
    (tmp_path / file_name).write_text("- not a mapping\n")
    bag = _dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert bag.dag_ids == [dag_id]
    assert file_name in bag.dags[dag_id].doc_md


def test_bad_file_names_sanitizing_to_one_id_both_get_dags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a-b.c.yaml").write_text("- x\n")
    (tmp_path / "a_b.c.yaml").write_text("- x\n")
    bag = _dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert len(bag.dag_ids) == 2 and "cdc__a_b__c" in bag.dag_ids


TEMPLATE = "{{ 7*7 }}"
SECRET = "s3cret-smtp-password"
#: A registry value that tries to read a connection's password through the template context.
STEAL = "{{ conn.smtp_default.password }}"


class _TI:
    """Just enough of a task instance for the templates the DAG writes (the plan path and step id XComs)."""

    def xcom_pull(self, task_ids: str | None = None, **_: Any) -> Any:
        return {"plan": "/lake/plans/run-1.json", "compact_submit": ["s-123"]}[task_ids or ""]


def _context() -> dict[str, Any]:
    """A task's template context, reduced to what the DAG's own templates read, plus ``conn``.

    ``conn`` stands for Airflow's connection accessor: with it, a rendered registry value could
    read a password.
    """
    ti = _TI()
    conn = SimpleNamespace(smtp_default=SimpleNamespace(password=SECRET))
    return {"ti": ti, "task_instance": ti, "conn": conn, "ds": "2026-01-01", "run_id": "manual__1"}


def _templated_doc(tmp_path: Path, **spark: Any) -> dict[str, Any]:
    """A valid registry entry whose free-text values are Jinja expressions."""
    doc = student_doc(tmp_path / "lake", "templated")
    doc["spark"] = {
        "conf": {"spark.cdc.probe": TEMPLATE, "spark.cdc.steal": STEAL},
        "hadoop_conf": {"fs.cdc.probe": TEMPLATE},
        "driver_memory": TEMPLATE,
        "executor_memory": TEMPLATE,
        **spark,
    }
    doc["alerts"] = {
        "emails": ["{{conn.smtp_default.password}}@example.com"],
        "smtp_conn_id": TEMPLATE,
        "slack_conn_id": TEMPLATE,
        "slack_channel": STEAL,
    }
    doc["description"] = TEMPLATE
    doc["columns"] = [{**c, "comment": TEMPLATE} for c in doc["columns"]]
    return doc


def _build(tmp_path: Path, doc: dict[str, Any]) -> Any:
    from cdc_compaction.airflow.factory import build_dags

    _write(tmp_path / "registry", "tests.templated.yaml", doc)
    (dag,) = build_dags(load_registry(tmp_path / "registry"), view_refresher=False, eraser=False).values()
    return dag


def _render_all(dag: Any) -> None:
    """Render every task's templates the way a task run does, and check none came from the registry.

    ``RuntimeTaskInstance.render_templates`` calls exactly ``task.render_template_fields(context)``
    (with the DAG's Jinja environment); what a field holds afterwards is what the task uses.
    """
    for task in dag.tasks:
        task.render_template_fields(_context())
        for field in task.template_fields:
            rendered = str(getattr(task, field))
            assert "49" not in rendered and SECRET not in rendered, (task.task_id, field, rendered)


def test_registry_values_are_data_not_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = _templated_doc(tmp_path)
    dag = _build(tmp_path, doc)
    _render_all(dag)
    from cdc_compaction.airflow.factory import build_dags

    # The erase DAG over the same registry renders nothing of it either.
    _render_all(build_dags(load_registry(tmp_path / "registry"), view_refresher=False, tables=False)[ERASER])
    compact = dag.get_task("compact")
    # The DAG's own templates are rendered ...
    assert compact.application_args == ["--plan", "/lake/plans/run-1.json"]
    for task_id in ("validate", "publish", "archive", "refresh_view"):
        assert dag.get_task(task_id).op_kwargs == {"plan_path": "/lake/plans/run-1.json"}
    # ... the registry's values are passed on as written.
    assert compact.conf["spark.cdc.probe"] == TEMPLATE and compact.conf["spark.cdc.steal"] == STEAL
    assert compact.conf["spark.hadoop.fs.cdc.probe"] == TEMPLATE
    assert compact._driver_memory == TEMPLATE and compact._executor_memory == TEMPLATE
    # Documentation is shown, never rendered: the description and comments stay literal.
    assert dag.doc_md.count(TEMPLATE) == 1 + len(doc["columns"])

    # A failure alert, called as Airflow calls an on_failure_callback (render, then notify).
    sent: list[tuple[str, list[str], str, str]] = []
    monkeypatch.setattr(
        notifications, "send_email", lambda conn_id, to, subject, body, **_: sent.append((conn_id, to, subject, body))
    )
    posted: list[tuple[Any, str]] = []
    monkeypatch.setattr(notifications, "_slack", lambda channels, text: posted.append((channels, text)))
    for task in dag.tasks:
        (notifier,) = task.on_failure_callback
        notifier({**_context(), "exception": RuntimeError(TEMPLATE)})
    assert len(sent) == len(dag.tasks) == len(posted)
    for conn_id, to, subject, body in sent:
        assert conn_id == TEMPLATE and to == ["{{conn.smtp_default.password}}@example.com"]
        assert SECRET not in subject + body and "49" not in subject and TEMPLATE in html.unescape(body)
    for channels, text in posted:
        assert channels.slack_conn_id == TEMPLATE and channels.slack_channel == STEAL
        assert SECRET not in text and TEMPLATE in text


def test_emr_registry_values_are_data_not_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.providers.amazon.aws.operators.emr import EmrAddStepsOperator

    from cdc_compaction.airflow.factory import PLAN_PLACEHOLDER

    emr = {"job_flow_id": "j-ABC123", "application": "s3://code-bucket/jobs/compact.py", "aws_conn_id": STEAL}
    # A registry value equal to the plan placeholder is data too: only the argument after --plan is filled.
    doc = _templated_doc(tmp_path, engine="emr", emr=emr, executor_memory=PLAN_PLACEHOLDER)
    dag = _build(tmp_path, doc)
    _render_all(dag)
    submit, sensor = dag.get_task("compact_submit"), dag.get_task("compact")
    assert sensor.step_id == "s-123" and sensor.aws_conn_id == STEAL and submit.aws_conn_id == STEAL
    # What the step is sent with: the plan path in place, every registry value as written.
    monkeypatch.setattr(EmrAddStepsOperator, "execute", lambda self, context: self.steps)
    (step,) = submit.execute(_context())
    args = step["HadoopJarStep"]["Args"]
    assert args[-2:] == ["--plan", "/lake/plans/run-1.json"]
    assert f"spark.cdc.probe={TEMPLATE}" in args and f"spark.cdc.steal={STEAL}" in args
    assert f"spark.hadoop.fs.cdc.probe={TEMPLATE}" in args
    assert args[args.index("--driver-memory") + 1] == TEMPLATE
    assert args[args.index("--executor-memory") + 1] == PLAN_PLACEHOLDER


def test_dag_file_parses_without_heavy_imports(tmp_path: Path) -> None:
    """Parsing must not import Spark, boto3 or the metastore client, nor touch the network."""
    code = (
        "import sys, json\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "heavy = sorted(m for m in ('pyspark', 'boto3', 'hmsclient', 'thrift', 'pyarrow', 'sqlglot', 'duckdb')"
        " if m in sys.modules)\n"
        "print(json.dumps({'dags': len(bag.dags), 'errors': len(bag.import_errors), 'heavy': heavy}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # + the view refresher and the erase DAG
    assert result == {"dags": len(load_registry(registry_dir())) + 2, "errors": 0, "heavy": []}


def test_the_dag_processor_imports_the_parses_airflow_modules_once_before_it_forks() -> None:
    """Airflow's DAG processor imports the airflow modules a DAG file names in its own process, once, before it
    forks each parse ([dag_processor] parsing_pre_import_modules, on by default). The DAG file names every one
    the factory needs, so a parse imports no Airflow provider module itself (the Spark provider and the
    OpenLineage client it loads were about a quarter of a 500-table parse, in every parse)."""
    code = (
        "import sys, json, logging\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "from airflow.dag_processing.processor import _pre_import_airflow_modules\n"
        f"_pre_import_airflow_modules({str(DAGS / 'cdc_compaction_dags.py')!r}, logging.getLogger('processor'))\n"
        "before = set(sys.modules)\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "new = sorted(m for m in set(sys.modules) - before if m.startswith('airflow.providers.'))\n"
        "print(json.dumps({'dags': len(bag.dags), 'errors': len(bag.import_errors), 'new': new}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"dags": len(load_registry(registry_dir())) + 2, "errors": 0, "new": []}


# -- Airflow's real DAG processing: ``airflow dags reserialize`` into a metadata DB ------------

GOOD_TABLES = ("alpha", "beta", "gamma")


def _reserialize(tmp_path: Path, registry: Path) -> Path:
    """Run the real ``airflow dags reserialize`` on ``registry``; return the SQLite metadata DB it wrote."""
    home = tmp_path / "airflow"
    env = airflow_env(home, "thrift://127.0.0.1:9", registry_dir=registry, warehouse_dir=tmp_path / "warehouse")
    ensure_airflow_db(env)
    airflow = str(Path(sys.executable).parent / "airflow")
    proc = subprocess.run(
        [airflow, "dags", "reserialize"], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return home / "airflow.db"


def _db_state(db_path: Path) -> dict[str, Any]:
    """What the DAG processing wrote: DAG rows, import errors and each serialized DAG's doc_md."""
    with sqlite3.connect(db_path) as db:
        dags = {d: bool(stale) for d, stale in db.execute("SELECT dag_id, is_stale FROM dag")}
        # What the scheduler reads to create runs: no import error flag, and a next run to create.
        schedule = {
            d: {"has_import_errors": bool(err), "next_dagrun_create_after": after, "timetable": summary}
            for d, err, after, summary in db.execute(
                "SELECT dag_id, has_import_errors, next_dagrun_create_after, timetable_summary FROM dag"
            )
        }
        errors = [(f, st) for f, st in db.execute("SELECT filename, stacktrace FROM import_error")]
        docs: dict[str, str] = {}
        params: dict[str, Any] = {}
        for dag_id, data, compressed in db.execute("SELECT dag_id, data, data_compressed FROM serialized_dag"):
            doc = json.loads(data) if data is not None else json.loads(zlib.decompress(compressed))
            docs[dag_id] = doc["dag"].get("doc_md") or ""
            params[dag_id] = doc["dag"].get("params")
    return {"stale": dags, "import_errors": errors, "doc_md": docs, "schedule": schedule, "params": params}


def _enums(node: Any) -> list[list[Any]]:
    """Every ``enum`` list in a serialized structure (the trigger form's choices)."""
    if isinstance(node, dict):
        found = [node["enum"]] if isinstance(node.get("enum"), list) else []
        return found + [e for v in node.values() for e in _enums(v)]
    if isinstance(node, list):
        return [e for v in node for e in _enums(v)]
    return []


@pytest.fixture
def good_registry(tmp_path: Path) -> Path:
    registry = tmp_path / "registry"
    for table in GOOD_TABLES:
        _write(registry, f"tests.{table}.yaml", student_doc(tmp_path / "lake", table))
    return registry


@pytest.mark.dag
def test_reserialize_a_registry_typo_breaks_only_its_own_dag(tmp_path: Path, good_registry: Path) -> None:
    """One wrong field name: every other table's DAG stays active, the bad table gets an error DAG."""
    typo = student_doc(tmp_path / "lake", "typo")
    typo["primay_key"] = typo.pop("primary_key")
    _write(good_registry, "tests.typo.yaml", typo)
    _write(good_registry, "tests.idle.yaml", student_doc(tmp_path / "lake", "idle", enabled=False))

    db_path = _reserialize(tmp_path, good_registry)
    state = _db_state(db_path)

    assert state["import_errors"] == [], state["import_errors"]
    for table in GOOD_TABLES:
        dag_id = f"cdc__tests__{table}"
        assert state["stale"].get(dag_id) is False, state["stale"]
        # Schedulable: the scheduler has a next run to create for it (hourly), and no import error.
        sched = state["schedule"][dag_id]
        assert sched["has_import_errors"] is False and sched["next_dagrun_create_after"], sched
        assert sched["timetable"] == "0 * * * *", sched
    assert state["stale"].get("cdc__tests__typo") is False, state["stale"]
    # enabled: false: the DAG is there and active (not stale), but the scheduler has no run to create.
    idle = state["schedule"]["cdc__tests__idle"]
    assert state["stale"].get("cdc__tests__idle") is False and idle["next_dagrun_create_after"] is None, idle
    broken = state["schedule"]["cdc__tests__typo"]
    assert broken["has_import_errors"] is False and broken["next_dagrun_create_after"] is None, broken
    doc = state["doc_md"]["cdc__tests__typo"]
    assert "tests.typo.yaml" in doc and "primay_key" in doc and "primary_key" in doc
    # The erase DAG: active, manual only; its form offers every valid table (the disabled one too), not the typo.
    assert state["stale"].get(ERASER) is False and state["schedule"][ERASER]["next_dagrun_create_after"] is None
    assert _enums(state["params"][ERASER]) == [sorted(f"tests.{t}" for t in (*GOOD_TABLES, "idle"))]

    # Through the real CLI: a run of the broken table's DAG fails its one task with the registry error.
    env = airflow_env(
        tmp_path / "airflow", "thrift://127.0.0.1:9", registry_dir=good_registry, warehouse_dir=tmp_path / "warehouse"
    )
    airflow = str(Path(sys.executable).parent / "airflow")
    proc = subprocess.run(
        [airflow, "dags", "test", "cdc__tests__typo"], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "AirflowFailException: invalid registry entry" in out and "tests.typo.yaml" in out, out[-3000:]
    assert "primay_key" in out, out[-3000:]
    with sqlite3.connect(db_path) as db:
        tis = db.execute("SELECT task_id, state, try_number FROM task_instance WHERE dag_id = 'cdc__tests__typo'")
        assert list(tis) == [("registry_error", "failed", 1)], "failed at once, no retries"

    # pause / resume: Airflow's own flag in this metadata DB (DAGs start paused here: DAGS_ARE_PAUSED_AT_CREATION).
    def paused(dag_id: str) -> bool:
        with sqlite3.connect(db_path) as db:
            return bool(db.execute("SELECT is_paused FROM dag WHERE dag_id = ?", (dag_id,)).fetchone()[0])

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cdc_compaction", *args], env=env, capture_output=True, text=True, check=False
        )

    assert paused("cdc__tests__alpha") and paused("cdc__tests__beta")
    proc = cli("resume", "tests.alpha")
    assert proc.returncode == 0 and "cdc__tests__alpha is now active" in proc.stdout, proc.stdout + proc.stderr
    assert not paused("cdc__tests__alpha") and paused("cdc__tests__beta"), "only the named table's DAG"
    proc = cli("pause", "tests.alpha")
    assert proc.returncode == 0 and "cdc__tests__alpha is now paused" in proc.stdout, proc.stdout + proc.stderr
    assert paused("cdc__tests__alpha")
    assert "already paused" in cli("pause", "tests.alpha").stdout
    proc = cli("resume", "tests.nope")
    assert proc.returncode == 1 and "has no DAG cdc__tests__nope" in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.dag
def test_reserialize_hostile_registry_files_break_only_their_own_dags(tmp_path: Path, good_registry: Path) -> None:
    """Every hostile file at once (non-UTF-8, overflow, deep nesting, alias bombs, huge): good DAGs stay active."""
    hostile = {f"hostile.h{i}.yaml": p for i, p in enumerate(HOSTILE_FILES)}
    for name, param in hostile.items():
        (good_registry / name).write_bytes(param.values[0])

    state = _db_state(_reserialize(tmp_path, good_registry))

    assert state["import_errors"] == [], state["import_errors"]
    for table in GOOD_TABLES:
        assert state["stale"].get(f"cdc__tests__{table}") is False, state["stale"]
    for name, param in hostile.items():
        dag_id = "cdc__hostile__" + name.split(".")[1]
        assert state["stale"].get(dag_id) is False, (param.id, state["stale"])
        doc = state["doc_md"][dag_id]
        assert name in doc and param.values[1] in doc, (param.id, doc)


def test_the_erase_dag_is_in_the_dag_file_with_its_form(dagbag) -> None:
    """The real DAG file has the manual-only erase DAG; its form offers exactly the registry's tables."""
    dag = dagbag.dags[ERASER]
    tables = sorted(e.config.qualified_name for e in load_registry(registry_dir()) if e.config)
    assert dag.schedule is None and dag.max_active_runs == 1
    assert dag.params.get_param("table").schema["enum"] == tables
    assert {"where", "actor"} <= set(dag.params.keys())
    assert [t.task_id for t in dag.topological_sort()] == ["validate_predicate", "erase"]
    assert not any(type(t).__name__.startswith("Spark") for t in dag.tasks)


def test_a_task_process_of_the_erase_dag_builds_it_over_every_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An erase task's parse (parsing context cdc__erase) builds the erase DAG only, over the whole registry."""
    _write(tmp_path / "registry", "tests.one.yaml", student_doc(tmp_path / "lake", "one"))
    _write(tmp_path / "registry", "tests.two.yaml", student_doc(tmp_path / "lake2", "two"))
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_DAG_ID", ERASER)
    monkeypatch.setenv("_AIRFLOW_PARSING_CONTEXT_TASK_ID", "erase")
    bag = _dagbag(tmp_path / "registry", monkeypatch)
    assert bag.import_errors == {}
    assert bag.dag_ids == [ERASER], "the table DAGs are not built for an erase task"
    assert bag.dags[ERASER].params.get_param("table").schema["enum"] == ["tests.one", "tests.two"]
