"""What ``validate`` refuses to publish, decided from counts alone (README, "What a DAG run does").

"No duplicate keys, and row counts reconcile (base + increments - rejected - superseded
- expired tombstones = output). The job must have read the whole previous version and
every planned file (checked against the Parquet footers) ... no delete may be among the
visible rows."  Pure: the job's stats, the plan and the parent's commit record, by hand.
"""

from __future__ import annotations

from typing import Any

from cdc_compaction.core.lake import Commit
from cdc_compaction.job.contract import LAYOUT
from cdc_compaction.modes.snapshot import history_problems
from cdc_compaction.pipeline.validate import count_problems, footer_problems

OUT = "/lake/t/base/v00000002-abc-1"


def _plan(**overrides: Any) -> dict[str, Any]:
    plan = {
        "plan_id": "abc",
        "parent_version": "v00000001-xyz",
        # Two planned files whose footers held 3 and 2 rows.
        "files": [{"rows": 3}, {"rows": 2}],
    }
    return {**plan, **overrides}


def _parent(rows: int = 10) -> Commit:
    return Commit(1, "v00000001-xyz", "xyz", "run-1", 0, [], [], stats={"output_rows": rows})


def _stats(**overrides: Any) -> dict[str, Any]:
    """A consistent report: 10 base rows + 5 new - 1 rejected - 2 superseded - 1 expired = 11."""
    stats = {
        "plan_id": "abc",
        "layout": LAYOUT,
        "duplicate_keys": 0,
        "misplaced_rows": 0,
        "base_rows": 10,
        "increment_rows": 5,
        "rejected_rows": 1,
        "superseded_rows": 2,
        "expired_tombstones": 1,
        "output_rows": 11,
        "output_visible_rows": 9,
        "output_tombstones": 2,
    }
    return {**stats, **overrides}


def test_a_consistent_report_has_no_problem() -> None:
    assert count_problems(_plan(), _stats(), _parent(), OUT) == []
    assert footer_problems(_plan(), _stats(), {"data": 9, "tombstones": 2}, {}) == []


def test_the_row_arithmetic_must_reconcile() -> None:
    (problem,) = count_problems(_plan(), _stats(output_rows=12), _parent(), OUT)
    assert "do not reconcile" in problem and "= 11" in problem and "12" in problem
    # Every term counts: one more superseded row is one row fewer in the output.
    assert count_problems(_plan(), _stats(superseded_rows=3, output_rows=10), _parent(), OUT) == []


def test_the_whole_parent_version_must_have_been_read() -> None:
    (problem,) = count_problems(_plan(), _stats(), _parent(rows=12), OUT)
    assert "read 10 base rows" in problem and "v00000001-xyz has 12" in problem
    # The very first compaction has no parent: it must have read nothing.
    problems = count_problems(_plan(), _stats(), None, OUT)
    assert problems == ["the job read 10 base rows, but version v00000001-xyz has 0"]


def test_every_planned_file_must_have_been_read_as_the_plan_counted_it() -> None:
    """A file rewritten after planning holds other rows than its footer said when planned."""
    plan = _plan(files=[{"rows": 3}, {"rows": 3}])
    (problem,) = count_problems(plan, _stats(), _parent(), OUT)
    assert "read 5 increment rows, the planned files held 6" in problem


def test_duplicate_keys_deletes_among_visible_rows_and_another_plans_stats_are_refused() -> None:
    assert "2 keys appear more than once" in count_problems(_plan(), _stats(duplicate_keys=2), _parent(), OUT)[0]
    assert "deletes among the visible rows" in count_problems(_plan(), _stats(misplaced_rows=1), _parent(), OUT)[0]
    assert "belong to plan other" in count_problems(_plan(), _stats(plan_id="other"), _parent(), OUT)[0]
    assert "layout 1" in count_problems(_plan(), _stats(layout=1), _parent(), OUT)[0]


def test_every_problem_is_reported_not_only_the_first() -> None:
    problems = count_problems(_plan(), _stats(duplicate_keys=1, output_rows=0), _parent(rows=3), OUT)
    assert len(problems) == 3


def test_the_footers_of_what_was_written_must_hold_what_the_job_reported() -> None:
    problems = footer_problems(_plan(), _stats(), {"data": 8, "tombstones": 3}, {})
    assert len(problems) == 2
    assert "data/ hold 8 rows" in problems[0] and "9 visible rows" in problems[0]
    assert "tombstones/ hold 3 rows" in problems[1] and "2 tombstones" in problems[1]


def test_a_partitioned_table_counts_per_partition() -> None:
    plan = _plan(partition_by={"column": "region"})
    stats = _stats(partition_rows={"EU": 5, "US": 4})
    assert footer_problems(plan, stats, {"data": 9, "tombstones": 2}, {"EU": 5, "US": 4}) == []
    (problem,) = footer_problems(plan, stats, {"data": 9, "tombstones": 2}, {"EU": 4, "US": 5})
    assert "rows per partition" in problem
    # Unpartitioned tables have no partitions to count.
    assert footer_problems(_plan(), stats, {"data": 9, "tombstones": 2}, {"EU": 1}) == []


def test_history_partitions_must_be_the_attempts_own_and_hold_the_rows_reported() -> None:
    """Snapshot tables: each applied date's partition in this attempt's history/, its footers' rows as reported."""
    out = "/lake/t/base/v00000002-p-a1"
    where = f"{out}/history/eff_start_date="
    stats = {"history": {"2026-11-22": {"location": f"{where}2026-11-22", "rows": 3}}}
    assert history_problems(stats, out, {"2026-11-22": 3}) == []
    empty = {"history": {"2026-11-23": {"location": f"{where}2026-11-23", "rows": 0}}}
    assert history_problems(empty, out, {"2026-11-23": 0}) == [], "an applied date that changed nothing"
    (problem,) = history_problems(stats, out, {"2026-11-22": 2})
    assert "differ from the job's report" in problem
    assert any("have no Parquet file" in p for p in history_problems(empty, out, {}))
    elsewhere = {
        "history": {"2026-11-22": {"location": "/lake/t/base/v00000001-o/history/eff_start_date=2026-11-22", "rows": 3}}
    }
    assert any("outside the new version's" in p for p in history_problems(elsewhere, out, {"2026-11-22": 3}))
    assert any("differ" in p for p in history_problems(stats, out, {"2026-11-22": 3, "2026-11-24": 1}))
