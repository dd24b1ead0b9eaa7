"""Helpers of the step tests in this package: change events, the in-process compact task, staged runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cdc_compaction.core.lake import Commit
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.validate import attempts, validate


def student_rows(*items: tuple[int, str | None, str, int]) -> list[dict[str, Any]]:
    return [{"id": i, "full_name": n, "op": op, "ts_ms": ts} for i, n, op, ts in items]


def run_job(rt: Runtime, path: str) -> None:
    """The compact task: the Spark job on the plan, in this process."""
    rt.engine.compact(json.loads(rt.lake.storage.read_text(path)))  # type: ignore[attr-defined]


def staged(rt: Runtime, run_id: str) -> str:
    """plan + compact + validate: a version ready to publish."""
    path = plan(rt, run_id)
    run_job(rt, path)
    validate(rt, path)
    return path


def commit_record_only(rt: Runtime, path: str) -> bool:
    """What a publish that dies right after its atomic step leaves: the commit record alone."""
    p = json.loads(Path(path).read_text())
    version, stats = attempts(rt, p)[-1]
    fields = ("seq", "plan_id", "run_id", "parent_seq", "files", "increments")
    return rt.lake.try_commit(Commit(**{f: p[f] for f in fields}, version=version, stats=stats))


REGION_COLUMNS = [
    {"name": "id", "type": "int"},
    {"name": "region", "type": "string"},
    {"name": "full_name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
]


def region_rows(*items: tuple[int, str | None, str | None, str, int]) -> list[dict[str, Any]]:
    return [{"id": i, "region": r, "full_name": n, "op": op, "ts_ms": ts} for i, r, n, op, ts in items]


def file_mtimes(directory: str) -> dict[str, int]:
    """Every file under ``directory``: path -> mtime (ns)."""
    return {str(p): p.stat().st_mtime_ns for p in Path(directory).rglob("*") if p.is_file()}
