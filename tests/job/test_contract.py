"""The job package's contract: a leaf package, and plan and stats files that round-trip as written.

``cdc_compaction/job`` ships to the cluster on its own (see test_bundle.py), so it may import
only the standard library, pyspark and itself; ``contract.py`` is imported at DAG-parse
time, so not even pyspark.  The plan and the stats are the files the two sides exchange:
:class:`Plan` and :class:`JobStats` must read what the ``plan`` step and the job write and
write it back key for key.
"""

from __future__ import annotations

import ast
import json
import posixpath
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdc_compaction.devtools.conformance import land
from cdc_compaction.job import contract
from cdc_compaction.job.contract import ContractError, JobStats, Plan, PlanFile
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.plan import plan as run_plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import validate

JOB_DIR = Path(contract.__file__).parent
REGION_COLUMNS = [
    {"name": "id", "type": "int"},
    {"name": "region", "type": "string"},
    {"name": "full_name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
]


# ------------------------------------------------------------------ a leaf package
def _imports(code: str, package: str) -> list[str]:
    """Every module ``code`` (a module of ``package``) imports, anywhere (functions too), as an absolute name."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # ``from cdc_compaction import sql`` imports the module cdc_compaction.core.sql.
            found += [f"{module}.{a.name}" if module == "cdc_compaction" else module for a in node.names]
    return found


def _package_of(path: Path) -> str:
    return ".".join(("cdc_compaction", *path.relative_to(JOB_DIR.parent).parts[:-1]))


def _allowed(module: str, *, pyspark: bool, pyarrow: bool = False) -> bool:
    top = module.split(".")[0]
    if top == "cdc_compaction":
        return module == "cdc_compaction.job" or module.startswith("cdc_compaction.job.")
    return top in sys.stdlib_module_names or (pyspark and top == "pyspark") or (pyarrow and top == "pyarrow")


def test_the_job_package_imports_only_the_standard_library_pyspark_and_itself() -> None:
    modules = sorted(JOB_DIR.rglob("*.py"))
    assert {p.name for p in modules} >= {
        "__init__.py",
        "contract.py",
        "faults.py",
        "bundle.py",
        "compact.py",
        "run_sql.py",
    }
    bad = {
        str(p.relative_to(JOB_DIR)): [
            m
            for m in _imports(p.read_text(encoding="utf-8"), _package_of(p))
            # files.py: pyarrow.fs for the Spark Connect engine (a dependency of pyspark's Connect client);
            # decode.py: the Arrow batches of mapInArrow and a Parquet envelope's file (pyspark's own pyarrow).
            if not _allowed(m, pyspark=p.name != "contract.py", pyarrow=p.name in ("files.py", "decode.py"))
        ]
        for p in modules
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_import_check_sees_what_it_must_refuse() -> None:
    """The check above is only as good as _imports: it must see every kind of import statement."""
    code = (
        "import airflow.sdk\nfrom cdc_compaction import tasks\nfrom ..exceptions import X\n"
        "def f():\n    from cdc_compaction.job import faults\n    from . import contract\n    import pyspark.sql\n"
    )
    got = _imports(code, _package_of(JOB_DIR / "compact.py"))
    assert got == [
        "airflow.sdk",
        "cdc_compaction.tasks",
        "cdc_compaction.exceptions",
        "cdc_compaction.job",
        "cdc_compaction.job",
        "pyspark.sql",
    ]
    assert [m for m in got if not _allowed(m, pyspark=True)] == [
        "airflow.sdk",
        "cdc_compaction.tasks",
        "cdc_compaction.exceptions",
    ]
    assert not _allowed("pyspark.sql", pyspark=False), "contract.py may not import pyspark"


def _job_modules_imported(path: Path) -> set[str]:
    """The job modules ``path`` imports anywhere, ``from cdc_compaction.job import compact`` as ``...job.compact``."""
    package = _package_of(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            found |= {module, *(f"{module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("cdc_compaction.job.")}


def test_no_job_module_imports_the_entry_point_and_no_mode_imports_another() -> None:
    """``compact.py`` dispatches to ``job/modes/<mode>.py``; a mode imports the shared modules, never the
    entry point (late imports count: they were an import cycle) and never another mode."""
    entry = "cdc_compaction.job.compact"
    modes = {p.stem for p in (JOB_DIR / "modes").glob("*.py") if p.stem != "__init__"}
    assert {"cdc", "keyless", "snapshot"} <= modes
    bad = {}
    for p in sorted(JOB_DIR.rglob("*.py")):
        if p.name == "compact.py" and p.parent == JOB_DIR:
            continue
        got = _job_modules_imported(p)
        a_mode = p.parent.name == "modes"
        wrong = sorted(m for m in got if m == entry or (a_mode and m.startswith("cdc_compaction.job.modes.")))
        if wrong:
            bad[str(p.relative_to(JOB_DIR))] = wrong
    assert bad == {}


def test_the_contract_loads_without_pyspark() -> None:
    """What the DAG file imports at parse time: the contract must not pull in Spark."""
    code = "import sys, cdc_compaction.job.contract; print(sorted(m for m in sys.modules if m.startswith('pyspark')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------ the formats, without Spark
def _minimal_plan() -> dict[str, Any]:
    return {
        "plan_id": "p1",
        "run_id": "r",
        "owner": "o",
        "table": "db.t",
        "seq": 2,
        "parent_seq": 1,
        "parent_version": "v00000001-p0",
        "version": "v00000002-p1",
        "output_location": "/lake/base/v00000002-p1",
        "quarantine_location": "/lake/q/rows/v00000002-p1",
        "base_location": "/lake/base/v00000001-p0",
        "files": [{"increment": "i", "name": "f.parquet", "path": "/lake/in/i/f.parquet", "size": 10, "rows": 2}],
        "increments": ["i"],
        "ingested_at": "2026-11-22T00:00:00+00:00",
        "column_names": ["id"],
        "primary_key": ["id"],
        "schema_ddl": "`id` int",
        "rule": {"reject_reason": "NULL", "rank": "1", "is_delete": "false"},
    }


def test_a_plan_missing_a_required_key_is_refused_by_name() -> None:
    doc = _minimal_plan()
    del doc["schema_ddl"], doc["rule"]
    with pytest.raises(ContractError, match=r"plan p1 lacks schema_ddl, rule"):
        Plan.from_dict(doc)
    # The rule's shape is the table mode's: a cdc plan's rule is checked when the cdc job reads it.
    plan = Plan.from_dict({**_minimal_plan(), "rule": {"reject_reason": "NULL", "rank": "1"}})
    with pytest.raises(ContractError, match="the plan's rule lacks is_delete"):
        _ = plan.cdc_rule


def test_optional_keys_keep_their_defaults_and_unknown_keys_survive() -> None:
    """A plan of an older (or newer) writer reads as its readers always read it, and is written back as it was."""
    doc = {**_minimal_plan(), "written_by_a_newer_version": {"x": 1}}
    plan = Plan.from_dict(doc)
    assert plan.base_layout == 1, "plans made before layout 2 described a layout-1 base"
    assert (plan.partition_by, plan.base_partitions, plan.tombstone_cutoff, plan.order_by) == (None, None, None, None)
    assert plan.key_lookup_max_events is None and plan.compression is None
    assert plan.files == (PlanFile("i", "f.parquet", "/lake/in/i/f.parquet", 10, rows=2),)
    assert plan.extra == {"written_by_a_newer_version": {"x": 1}}
    # Written back: the defaults that readers assume appear (base_layout 1, no tombstones location), nothing else.
    assert plan.to_dict() == {**doc, "base_layout": 1, "base_tombstones_location": None}
    assert Plan.from_dict(plan.to_dict()) == plan


def test_stats_of_an_earlier_job_read_with_the_defaults() -> None:
    old = {
        "plan_id": "p",
        "table": "db.t",
        "base_rows": 1,
        "increment_rows": 2,
        "rejected_rows": 0,
        "rejected_by_reason": {},
        "superseded_rows": 1,
        "expired_tombstones": 0,
        "output_rows": 2,
        "output_tombstones": 0,
        "output_visible_rows": 2,
        "duplicate_keys": 0,
        "output_files": [{"name": "part-0.parquet", "size": 9}],
        "finished_at": "2026-11-22T00:00:00+00:00",
    }
    stats = JobStats.from_dict(old)
    assert (stats.layout, stats.attempt, stats.rejected_by_file, stats.misplaced_rows) == (1, "", {}, None)
    assert stats.output_files[0].size == 9
    with pytest.raises(ContractError, match="lacks output_files"):
        JobStats.from_dict({k: v for k, v in old.items() if k != "output_files"})


def test_the_permanent_error_record_round_trips() -> None:
    doc = {"plan_id": "p", "seq": 3, "table": "db.t", "error": "stale"}
    record = contract.PermanentErrorRecord.from_dict(doc)
    assert record.error == "stale" and record.to_dict() == doc
    assert contract.PermanentErrorRecord.from_dict({}).error == ""
    assert contract.permanent_error_path("/l/_cdc/plans/p.json") == "/l/_cdc/plans/p" + contract.PERMANENT_ERROR_SUFFIX


# ------------------------------------------------------------------ real files of the plan step and the job
def _run_and_round_trip(rt: Runtime, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Plan and compact one run; check both files round-trip; finish the run. Returns (plan, stats) as on disk."""
    path = run_plan(rt, run_id)
    assert path, "something was landed: there is a plan"
    doc = json.loads(rt.lake.storage.read_text(path))
    plan = Plan.from_dict(doc)
    assert plan.to_dict() == doc, "the plan must be written back key for key"
    assert plan.extra == {}, f"keys the plan step writes but Plan does not describe: {sorted(plan.extra)}"
    result = rt.engine.compact(doc)  # type: ignore[attr-defined]
    stats_path = posixpath.join(f"{doc['output_location']}-{result['attempt']}", contract.STATS_FILE)
    on_disk = json.loads(rt.lake.storage.read_text(stats_path))
    stats = JobStats.from_dict(on_disk)
    assert stats.to_dict() == on_disk == result
    assert stats.extra == {}, f"keys the job writes but JobStats does not describe: {sorted(stats.extra)}"
    assert stats.layout == contract.LAYOUT and stats.plan_id == plan.plan_id
    validate(rt, path)
    publish(rt, path)
    archive(rt, path)
    return doc, on_disk


@pytest.mark.spark
@pytest.mark.metastore
def test_real_plans_and_stats_round_trip(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    rows = [{"id": 1, "full_name": "Ann", "op": "c", "ts_ms": 1}, {"id": 2, "full_name": "Bob", "op": "c", "ts_ms": 1}]
    land(rt.cfg, "increment_2026112200", [rows])
    first, _ = _run_and_round_trip(rt, "run-1")
    assert first["base_tombstones_location"] is not None, "a layout-2 empty base: its tombstones directory"
    land(rt.cfg, "increment_2026112201", [[{"id": 2, "full_name": None, "op": "d", "ts_ms": 2}]])
    second, stats = _run_and_round_trip(rt, "run-2")
    assert second["base_rows"] == 2 and "partition_by" not in second
    assert stats["output_tombstones"] == 1 and "partitions" not in stats


@pytest.mark.spark
@pytest.mark.metastore
def test_real_plans_and_stats_of_a_partitioned_table_round_trip(make_cfg, runtime) -> None:
    rt = runtime(make_cfg(columns=REGION_COLUMNS, partition_by={"column": "region"}))
    ensure_tables(rt)
    rows = [
        {"id": 1, "region": "EU", "full_name": "Ann", "op": "c", "ts_ms": 1},
        {"id": 2, "region": "US", "full_name": "Bob", "op": "c", "ts_ms": 1},
    ]
    land(rt.cfg, "increment_2026112200", [rows])
    _run_and_round_trip(rt, "run-1")
    land(rt.cfg, "increment_2026112201", [[{"id": 1, "region": "EU", "full_name": "Ann B", "op": "u", "ts_ms": 2}]])
    plan, stats = _run_and_round_trip(rt, "run-2")
    assert Plan.from_dict(plan).partition_by is not None and sorted(plan["base_partitions"]) == ["EU", "US"]
    assert JobStats.from_dict(stats).partitions_touched == ("EU",) and stats["partitions_reused"] == 1


def test_the_contracts_names_are_defined_once() -> None:
    """No module of the package assigns a name of the contract again (the job's names are not mirrored)."""
    import ast

    from cdc_compaction.job import contract

    shared = {n for n in dir(contract) if n.isupper() and not n.startswith("_")}
    package = Path(contract.__file__).resolve().parents[1]
    again: list[str] = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "contract.py" and path.parent.name == "job":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            again += [
                f"{path.relative_to(package)}: {t.id}" for t in targets if isinstance(t, ast.Name) and t.id in shared
            ]
    assert again == [], "define these in cdc_compaction.job.contract only (import them from there)"
