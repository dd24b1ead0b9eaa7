"""Whether a run compacts: the ``compaction`` policy applied to what is pending (README, "Compaction policy").

The views merge the base with the pending increments at read time, so a run that only
registers new increments already shows them to readers.  Rewriting the base pays once the
pending data costs readers enough: under ``policy: threshold`` a run compacts when ANY set
threshold is reached -- pending rows per row of the live version, pending files, the age of
the oldest pending increment -- or when asked to (``force``).  ``plan`` decides once and
records the decision in the plan; ``status`` shows how close each threshold is.

Pure functions of numbers the plan already has: no storage, no metastore, no Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cdc_compaction.core.registry import Compaction

#: The names of the thresholds, in the order they are checked and shown.
THRESHOLDS: tuple[str, ...] = ("pending_rows_ratio", "pending_files", "pending_age")


@dataclass(frozen=True)
class PendingLoad:
    """What waits to be compacted, as the plan sees it."""

    #: The live version's rows (its commit record's ``output_rows``; 0 before the first commit).
    base_rows: int
    #: Rows in the pending files (their Parquet footers).
    pending_rows: int
    #: Complete, not yet compacted files.
    pending_files: int
    #: The hour the oldest pending increment stands for (None: none pending, or no hour in its name).
    oldest_pending: datetime | None


@dataclass(frozen=True)
class Measure:
    """One threshold against what is pending: its value, its limit, and whether it is reached."""

    name: str
    #: Pending rows per base row, pending files, or the oldest increment's age in seconds; None: not
    #: measurable (no base rows yet, no dated increment).
    value: float | None
    #: The registry's limit (seconds for the age).
    limit: float
    reached: bool

    @property
    def progress(self) -> float | None:
        """How far to the limit, 1.0 being the limit (None when the value is not measurable)."""
        return None if self.value is None else self.value / self.limit

    def to_dict(self) -> dict[str, Any]:
        return {
            "threshold": self.name,
            "value": self.value,
            "limit": self.limit,
            "reached": self.reached,
            "progress": None if self.progress is None else round(self.progress, 4),
        }


@dataclass(frozen=True)
class Decision:
    """The plan's decision: compact now or only refresh the views, and why."""

    compact: bool
    policy: str
    reason: str
    forced: bool = False
    measures: tuple[Measure, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "compact": self.compact,
            "policy": self.policy,
            "reason": self.reason,
            "forced": self.forced,
            "thresholds": [m.to_dict() for m in self.measures],
        }


def measure(policy: Compaction, load: PendingLoad, now: datetime) -> tuple[Measure, ...]:
    """Every threshold the policy sets, measured on ``load`` at ``now``."""
    out: list[Measure] = []
    if policy.pending_rows_ratio is not None:
        limit = float(policy.pending_rows_ratio)
        if load.base_rows > 0:
            ratio = load.pending_rows / load.base_rows
            out.append(Measure("pending_rows_ratio", ratio, limit, ratio >= limit))
        else:
            # No base rows yet: any pending row is infinitely many per base row -- the first load compacts.
            out.append(Measure("pending_rows_ratio", None, limit, load.pending_rows > 0))
    if policy.pending_files is not None:
        limit = float(policy.pending_files)
        out.append(Measure("pending_files", float(load.pending_files), limit, load.pending_files >= limit))
    if policy.pending_age is not None:
        limit = policy.pending_age.total_seconds()
        if load.oldest_pending is not None:
            age = (now - load.oldest_pending).total_seconds()
            out.append(Measure("pending_age", age, limit, age >= limit))
        else:
            out.append(Measure("pending_age", None, limit, False))
    return tuple(out)


def decide(policy: Compaction, load: PendingLoad, now: datetime, force: bool = False) -> Decision:
    """Compact now (True) or only register the pending increments in the views (False), with the reason.

    ``always`` compacts; ``threshold`` compacts when any threshold is reached; ``force`` compacts
    regardless.  Nothing pending is not decided here: ``plan`` ends the run before.
    """
    measures = measure(policy, load, now) if policy.policy == "threshold" else ()
    if force:
        return Decision(True, policy.policy, "compaction forced by the run (param compact: force)", True, measures)
    if policy.policy == "always":
        return Decision(True, policy.policy, "policy always: every run compacts what is pending", False, measures)
    reached = [m for m in measures if m.reached]
    if reached:
        why = "threshold reached: " + "; ".join(describe(m) for m in reached)
        return Decision(True, policy.policy, why, False, measures)
    return Decision(
        False,
        policy.policy,
        "no threshold reached (" + "; ".join(describe(m) for m in measures) + "): the pending increments stay "
        "pending and the views show them; a later run compacts them",
        False,
        measures,
    )


def describe(m: Measure) -> str:
    """One threshold for people: ``pending_files 12/48``, ``pending_age 2h05m/6h``."""
    if m.name == "pending_age":
        return f"pending_age {_hours(m.value)}/{_hours(m.limit)}"
    if m.name == "pending_rows_ratio":
        value = "no base rows yet" if m.value is None else f"{m.value:.3g}"
        return f"pending_rows_ratio {value}/{m.limit:g}"
    return f"{m.name} {m.value:g}/{m.limit:g}"


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


#: The plan record's key holding :meth:`Decision.to_dict`.
PLAN_KEY = "compaction"


def deferred(plan_doc: dict[str, Any]) -> str | None:
    """Why the plan ``plan_doc`` compacts nothing (its steps skip), or None if it compacts.

    A plan without the key (written before the policy existed) compacts, as it always did.
    """
    decision = plan_doc.get(PLAN_KEY) or {}
    if decision.get("compact", True):
        return None
    table, plan_id = plan_doc.get("table", "?"), plan_doc.get("plan_id", "?")
    return f"{table}: plan {plan_id} does not compact: {decision.get('reason')}"
