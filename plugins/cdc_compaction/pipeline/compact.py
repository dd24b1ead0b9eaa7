"""The ``compact`` step in this process: hand the plan to the runtime's engine.

In a DAG the step is a Spark job of its own (``spark-submit`` or an EMR step, built by
``factory._compact_tasks``); the in-process runner, the CLI and the tests run the same job
in their SparkSession through :class:`~cdc_compaction.integrations.engine.SessionEngine`.
"""

from __future__ import annotations

from typing import Any

from cdc_compaction.pipeline.runtime import Runtime, load_plan, not_compacting


def compact(rt: Runtime, plan_path: str) -> dict[str, Any]:
    """Run the compaction job on the plan ``plan_path`` with the runtime's engine; return the job's stats.

    A plan that decided not to compact (``compaction.policy``) runs no job: ``{"skipped": reason}``.
    """
    p = load_plan(rt, plan_path)
    return not_compacting(rt, p, "compact") or rt.engine.compact(p)  # type: ignore[attr-defined]
