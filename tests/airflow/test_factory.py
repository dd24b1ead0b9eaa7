"""The DAG factory's task callables: which errors fail a task at once, which are retried."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from conftest import student_doc

from cdc_compaction.airflow import factory
from cdc_compaction.core import exceptions as exc
from cdc_compaction.core.registry import parse_table
from cdc_compaction.pipeline import order

PERMANENT = [
    exc.BadInputError("t: part-0.parquet is truncated"),
    exc.PlanError("t: plan file missing"),
    exc.SchemaChangeError("t: column dropped"),
    exc.PublishValidationError("t: counts do not reconcile"),
    exc.ConcurrentCommitError("t: commit 3 was taken"),
    exc.CommitLogError("t: record 3 missing"),
    exc.StorageRootMismatchError("t: storage_root moved"),
    exc.DeploymentConflictError("t: deployment id 'blue' is already used by another Airflow deployment"),
    exc.OwnershipError("t: its storage_root /lake/t belongs to table other.t"),
]
TRANSIENT = [
    exc.StorageError("t: S3 answered 503"),
    exc.MetastoreError("t: metastore unreachable"),
    exc.ConcurrentRunError("t: lease held"),
    exc.ArchiveError("t: archived copy has 0 bytes"),
    OSError("connection reset"),
]


def _dag(tmp_path: Any) -> Any:
    return factory.build_dag(parse_table(student_doc(tmp_path / "lake")))


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("task_id", ["plan", "validate", "publish", "archive", "refresh_view", "ensure_tables"])
def test_errors_no_retry_can_heal_fail_the_task_at_once(tmp_path, monkeypatch, task_id, error) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    def broken(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(factory, "_runtime", lambda cfg: None)
    monkeypatch.setattr(order.step(task_id).target, broken)
    task = _dag(tmp_path).get_task(task_id)
    kwargs = {"run_id": "r"} if task_id == "plan" else ({} if task_id == "ensure_tables" else {"plan_path": "/p"})
    with pytest.raises(AirflowFailException, match=type(error).__name__) as raised:
        task.python_callable(**kwargs)
    assert raised.value.__cause__ is error, "the original error stays attached for the log"


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda e: type(e).__name__)
def test_errors_that_may_heal_are_left_to_airflows_retries(tmp_path, monkeypatch, error) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(factory, "_runtime", lambda cfg: None)
    monkeypatch.setattr(order.step("publish").target, broken)
    with pytest.raises(type(error)):
        _dag(tmp_path).get_task("publish").python_callable(plan_path="/p")


def test_a_snapshot_table_gets_its_dag_and_docs(tmp_path) -> None:
    """mode: snapshot builds the same DAG as every mode; its docs name its key, snapshots and outputs."""
    doc = student_doc(tmp_path / "lake", "accounts", mode="snapshot", columns=[{"name": "id", "type": "int"}])
    del doc["order_by"]
    cfg = parse_table({**doc, "columns": [*doc["columns"], {"name": "as_of", "type": "date"}]})
    dag = factory.build_dag(cfg)
    assert [t.task_id for t in dag.tasks] == [
        t.task_id for t in factory.build_dag(parse_table(student_doc(tmp_path / "lake"))).tasks
    ]
    docs = factory.doc_md(cfg)
    assert "`snapshot`" in docs and "accounts_history" in docs and "no view over pending snapshots yet" in docs


def test_a_disabled_table_keeps_an_idle_dag_whose_tasks_skip(tmp_path, monkeypatch) -> None:
    """enabled: false: the same tasks, no schedule, paused on creation, tagged; every step skips, runs nothing."""
    from airflow.sdk.exceptions import AirflowSkipException

    enabled = factory.build_dag(parse_table(student_doc(tmp_path / "lake")))
    cfg = parse_table(student_doc(tmp_path / "lake", enabled=False))
    dag = factory.build_dag(cfg)
    assert [t.task_id for t in dag.tasks] == [t.task_id for t in enabled.tasks], "the DAG stays whole and visible"
    assert dag.schedule is None and enabled.schedule == "@hourly"
    assert dag.is_paused_upon_creation is True and enabled.is_paused_upon_creation is None
    assert "disabled" in dag.tags and "disabled" not in enabled.tags

    ran: list[str] = []
    monkeypatch.setattr(factory, "_runtime", lambda cfg: ran.append("runtime"))
    for task_id in ["ensure_tables", "plan", "validate", "publish", "archive", "refresh_view"]:
        kwargs = {"run_id": "r"} if task_id == "plan" else ({} if task_id == "ensure_tables" else {"plan_path": "/p"})
        with pytest.raises(AirflowSkipException, match=r"tests\.student is disabled.*enabled: true"):
            dag.get_task(task_id).python_callable(**kwargs)
    assert ran == [], "a disabled table's task builds no runtime: it touches neither lake nor metastore"


def test_a_disabled_table_is_left_out_of_the_view_refresher(tmp_path) -> None:
    from cdc_compaction.core.registry import RegistryEntry
    from cdc_compaction.core.settings import ERASE_DAG_ID, VIEW_REFRESH_DAG_ID

    on = parse_table(student_doc(tmp_path / "lake", "on"))
    off = parse_table(student_doc(tmp_path / "lake", "off", enabled=False))
    dags = factory.build_dags([RegistryEntry(tmp_path / f"tests.{c.table}.yaml", c, None) for c in (on, off)])
    assert set(dags) == {on.dag_id, off.dag_id, VIEW_REFRESH_DAG_ID, ERASE_DAG_ID}
    refresh = dags[VIEW_REFRESH_DAG_ID].get_task("refresh__tests").python_callable
    assert [c.table for c in refresh.__defaults__[0]] == ["on"]


def test_the_base_assets_event_extra_names_the_commit_its_rows_and_the_bases_freshness() -> None:
    """What publish returned becomes the asset event's extra: JSON-serializable, the base's freshness only."""
    from cdc_compaction.pipeline.publish import asset_event_extra

    published = {
        "seq": 7,
        "parent_seq": 6,
        "version": "v00000007-20261122T100000-ab12",
        "removed_versions": ["v00000004-x"],
        "freshness": {
            "base": {"increment": "increment_2026112209", "event_time": "2026-11-22T09:59:00+00:00"},
            "view": {"increment": "increment_2026112210", "event_time": "", "checked_at": "2026-11-22T10:05:00+00:00"},
        },
        "rows": {"base_in": 100, "increments_in": 12, "rejected": 2, "out": 104, "tombstones_out": 3},
    }
    extra = asset_event_extra("school.student", published)
    assert extra == {
        "table": "school.student",
        "commit": 7,
        "version": "v00000007-20261122T100000-ab12",
        # The range a downstream reads with `changes --from 6 --to 7`.
        "from_version": 6,
        "to_version": 7,
        "base_rows_in": 100,
        "rows_in": 12,
        "rows_rejected": 2,
        "rows_out": 104,
        "tombstones_out": 3,
        "freshness": {"increment": "increment_2026112209", "event_time": "2026-11-22T09:59:00+00:00"},
    }
    assert json.loads(json.dumps(extra)) == extra, "Airflow stores the extra as JSON"


def test_the_publish_task_declares_the_base_asset_and_asks_for_its_outlet_events(tmp_path) -> None:
    """Airflow hands a callable ``outlet_events`` only if its signature names it (through fail_fast's wraps)."""
    import inspect

    from airflow.sdk.bases.decorator import KeywordParameters

    cfg = parse_table(student_doc(tmp_path / "lake"))
    task = factory.build_dag(cfg).get_task("publish")
    assert [o.uri for o in task.outlets] == [f"x-hive://metastore/{cfg.database}/{cfg.table}_base"]
    passed = KeywordParameters.determine(task.python_callable, [], {"outlet_events": "E", "ti": "T"}).unpacking()
    assert dict(passed) == {"outlet_events": "E"}
    assert "plan_path" in inspect.signature(task.python_callable).parameters


# ------------------------------------------------------------------------- the erase DAG
def _erase_dag(sample_cfg: Any, tmp_path: Any) -> Any:
    """The erase DAG the factory builds beside the per-table DAGs (a second table to fill the enum)."""
    from cdc_compaction.core.registry import RegistryEntry
    from cdc_compaction.core.settings import ERASE_DAG_ID

    other = parse_table(student_doc(tmp_path / "other", "other"))
    entries = [RegistryEntry(tmp_path / f"tests.{c.table}.yaml", c, None) for c in (sample_cfg, other)]
    dags = factory.build_dags(entries)
    assert {sample_cfg.dag_id, other.dag_id, ERASE_DAG_ID} <= set(dags)
    return dags[ERASE_DAG_ID]


def test_the_erase_dag_erases_with_the_params_of_its_trigger_form(tmp_path: Any) -> None:
    """Manual only; its form is table (enum), where, actor; its tasks validate, erase and verify, audit as XCom."""
    from pathlib import Path

    import pyarrow.parquet as pq
    from operations.test_erase import WHERE, build, erased

    sample = build(tmp_path / "lake")
    dag = _erase_dag(sample.cfg, tmp_path)
    assert dag.schedule is None and dag.max_active_runs == 1
    schema = {name: dag.params.get_param(name).schema for name in ("table", "where", "actor")}
    assert schema["table"]["enum"] == sorted([sample.cfg.qualified_name, "tests.other"])
    assert all(s["type"] == "string" for s in schema.values())
    assert [t.task_id for t in dag.topological_sort()] == ["validate_predicate", "erase"]
    for task in dag.tasks:
        # The params reach the callables from the context, not through a templated field.
        assert not task.op_args and not task.op_kwargs and task.templates_dict is None
    params = {"table": sample.cfg.qualified_name, "where": WHERE, "actor": "dpo@example.com"}
    # What Airflow checks when the form is submitted: a complete request passes, a table not in the list does not.
    import copy

    from airflow.sdk.exceptions import ParamValidationError

    form = copy.deepcopy(dag.params)
    form.update(params)
    assert form.validate() == params
    for bad in ({"table": "tests.nope"}, {"where": ""}, {"actor": None}):
        form = copy.deepcopy(dag.params)
        with pytest.raises(ParamValidationError):
            form.update({**params, **bad})
            form.validate()

    checked = dag.get_task("validate_predicate").python_callable(params=params)
    assert checked == {"table": sample.cfg.qualified_name, "predicate": WHERE, "columns": ["id", "full_name"]}

    audit = dag.get_task("erase").python_callable(params=params)
    expected = dict.fromkeys(("live", "versions", "pending", "archive", "quarantine", "changes", "rebuild", "other"), 0)
    for loc, rows in sample.files.values():
        expected[loc] += sum(1 for r in rows if erased(r))
    assert audit["rows_removed"] == expected and sum(expected.values()) > 0
    # The audit keeps the predicate without its literals (no erased value), tied to the request by its hash.
    assert audit["actor"] == "dpo@example.com" and audit["predicate"] == "id IN (?, ?) OR full_name = ?"
    assert audit["predicate_sha256"] == hashlib.sha256(WHERE.encode()).hexdigest()
    assert audit["verified"]["matching_files"] == {}
    xcom = json.dumps(audit)  # an XCom must serialize; it names no erased value
    assert not any(v in xcom for v in ("n3", "n7", "1003", "1007"))
    files = [p for p in (tmp_path / "lake").rglob("*") if p.is_file() and ".parquet" in p.name]
    assert files and not [r for p in files for r in pq.read_table(str(p)).to_pylist() if erased(r)]

    # A Jinja-looking value is data: recorded as given, matching no row (no name is literally that text).
    literal = "full_name = '{{ params.actor }}'"
    again = dag.get_task("erase").python_callable(params={**params, "where": literal})
    assert again["predicate_sha256"] == hashlib.sha256(literal.encode()).hexdigest()
    assert again["predicate"] == "full_name = ?" and sum(again["rows_removed"].values()) == 0
    assert Path(sample.lake.layout.control, "erase", f"{again['erase_id']}.audit.json").exists()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"where": "lower(full_name) = 'n1'"}, ["tests.people", "lower(full_name) = 'n1'", "LOWER(full_name)"]),
        ({"where": "email = 'a@b'"}, ["tests.people", "email = 'a@b'", "'email' is not a column"]),
        ({"table": "tests.nope"}, ["'tests.nope'", "not a table of the registry", "tests.other, tests.people"]),
        ({"actor": " "}, ["tests.people", "param 'actor'", "who asked"]),
    ],
)
def test_the_erase_dag_fails_at_once_on_a_refused_request(tmp_path: Any, change: dict, named: list[str]) -> None:
    """A refused predicate (or table, or actor) fails the first task at once, naming it; nothing is changed."""
    from pathlib import Path

    from airflow.sdk.exceptions import AirflowFailException
    from operations.test_erase import WHERE, build

    sample = build(tmp_path / "lake")
    before = {p: Path(p).read_bytes() for p in sample.files}
    dag = _erase_dag(sample.cfg, tmp_path)
    params = {"table": sample.cfg.qualified_name, "where": WHERE, "actor": "dpo@example.com", **change}
    for task_id in ("validate_predicate", "erase"):
        with pytest.raises(AirflowFailException) as raised:
            dag.get_task(task_id).python_callable(params=params)
        assert all(n in str(raised.value) for n in named), str(raised.value)
    assert dag.get_task("validate_predicate").retries == 0
    assert {p: Path(p).read_bytes() for p in sample.files} == before
    assert sample.lake.latest_commit().seq == 2


@pytest.mark.parametrize(
    ("retention", "said"), [("7d", "7 days"), ("36h", "1 day 12 hours"), ("90m", "1 hour 30 minutes"), ("1d", "1 day")]
)
def test_the_docs_list_the_tombstones_table_and_say_durations_as_people_do(tmp_path, retention, said) -> None:
    """The DAG docs name all four tables and the tombstone retention in words, not ``7 days, 0:00:00``."""
    cfg = parse_table(student_doc(tmp_path / "lake", tombstone_retention=retention))
    docs = factory.doc_md(cfg)
    assert f"**Tombstones kept for:** {said};" in docs, docs
    assert "0:00:00" not in docs and ":00" not in docs.split("Tombstones kept for:")[1].split(";")[0]
    tables = next(line for line in docs.splitlines() if line.startswith("* **Tables:**"))
    assert "`tests.student_tombstones`" in tables, tables
    for name in ("base", "incremental", "compactor"):
        assert f"`tests.student_{name}`" in tables, tables
