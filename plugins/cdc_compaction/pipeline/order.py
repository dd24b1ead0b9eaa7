"""THE order of a compaction run's steps, written down once, as data.

The DAG factory creates and chains one table's tasks from :data:`ORDER`; the in-process
conformance runner calls the steps in it; the CLI's ``step`` command offers them; the
benchmark times them.  Nobody else writes the order down.

A step names its function by dotted path and looks it up only when it runs
(:meth:`Step.function`): the DAG file reads this module at parse time, which must not
import Spark, pyarrow or the metastore client (``test_dag_file_parses_without_heavy_imports``),
and a test that replaces a step's function in its module is seen by every caller.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Step:
    """One step of a run: its task id, its function, how it is called, and its one-line doc."""

    #: The task id in the table's DAG, and the step's name everywhere else (CLI, benchmark keys).
    id: str
    #: ``package.module.function`` of the step, called with the :class:`~.runtime.Runtime` first.
    target: str
    #: True if the function's second argument is the plan path (the file ``plan`` returned).
    takes_plan: bool
    #: One line on what the step does (the task's ``doc_md``).
    doc: str

    @property
    def module(self) -> str:
        return self.target.rpartition(".")[0]

    @property
    def name(self) -> str:
        return self.target.rpartition(".")[2]

    def function(self) -> Callable[..., Any]:
        """The step's function, looked up in its module now (imports it on first use)."""
        return getattr(importlib.import_module(self.module), self.name)

    def call(self, rt: Any, plan_path: str = "", run_id: str = "") -> Any:
        """Run the step as the in-process callers do: ``plan`` for ``run_id``, the others on ``plan_path``.

        A step that does not take the plan path is called on the runtime alone.  The DAG's
        task callables call :meth:`function` themselves: they add the alerts (``factory.build_dag``).
        """
        if self.id == PLAN:
            return self.function()(rt, run_id=run_id)
        return self.function()(rt, plan_path) if self.takes_plan else self.function()(rt)


#: The step that records the run's input and returns the plan path; an empty path ends the run.
PLAN = "plan"
#: The step the DAG runs as a Spark job (``factory._compact_tasks``), not as a Python callable.
COMPACT = "compact"

ORDER: tuple[Step, ...] = (
    Step(
        "ensure_tables",
        "cdc_compaction.pipeline.tables.ensure_tables",
        False,
        "Create the database and the base / incremental / compactor tables; add new columns.",
    ),
    Step(
        PLAN,
        "cdc_compaction.pipeline.plan.plan",
        False,
        "Record the exact input files; an empty result skips the rest of the run.",
    ),
    Step(
        COMPACT,
        "cdc_compaction.pipeline.compact.compact",
        True,
        "Run the compaction job on the planned files; writes a new version directory.",
    ),
    Step(
        "validate",
        "cdc_compaction.pipeline.validate.validate",
        True,
        "Check the new version (keys, counts, schema) before anything is published.",
    ),
    Step(
        "publish",
        "cdc_compaction.pipeline.publish.publish",
        True,
        "Commit the version and swap the base table's location (atomic).",
    ),
    Step(
        "archive",
        "cdc_compaction.pipeline.archive.archive",
        True,
        "Move compacted increments to the archive (copy, verify, delete).",
    ),
    Step(
        "refresh_view",
        "cdc_compaction.pipeline.views.refresh_view",
        False,
        "Register pending increments and keep the deduplicating views current.",
    ),
)

#: The task ids in order: ``ensure_tables``, ``plan``, ``compact`` ... ``refresh_view``.
STEP_IDS: tuple[str, ...] = tuple(s.id for s in ORDER)


def step(step_id: str) -> Step:
    """The step called ``step_id``; KeyError names the steps there are."""
    for s in ORDER:
        if s.id == step_id:
            return s
    raise KeyError(f"no step {step_id!r}; the steps are {', '.join(STEP_IDS)}")


def after(step_id: str) -> tuple[Step, ...]:
    """The steps that come after ``step_id``, in order."""
    return ORDER[STEP_IDS.index(step(step_id).id) + 1 :]


def between(first: str, last: str) -> tuple[Step, ...]:
    """The steps from ``first`` to ``last``, both included, in order."""
    return ORDER[STEP_IDS.index(step(first).id) : STEP_IDS.index(step(last).id) + 1]
