"""The compaction policy's decision (README, "Compaction policy"): pure functions, no Spark.

The expected decisions are written from the README's rule -- under ``threshold`` a run compacts
when ANY set threshold is reached (pending rows / base rows >= ratio, pending files >= files,
now - oldest pending hour >= age), ``always`` always compacts, ``force`` always compacts --
not computed with the package's own function.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from cdc_compaction.core.policy import PendingLoad, decide, deferred
from cdc_compaction.core.registry import Compaction

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
THRESHOLD = {"policy": "threshold", "pending_rows_ratio": 0.2, "pending_files": 48, "pending_age": "6h"}


def load(base: int, rows: int, files: int, age_h: float | None) -> PendingLoad:
    oldest = None if age_h is None else NOW - timedelta(hours=age_h)
    return PendingLoad(base_rows=base, pending_rows=rows, pending_files=files, oldest_pending=oldest)


@pytest.mark.parametrize(
    ("policy", "pending", "force", "compacts", "reason_has"),
    [
        # always: today's behaviour, whatever is pending.
        ({}, load(1000, 1, 1, 0), False, True, "policy always"),
        ({"policy": "always"}, load(0, 0, 1, None), False, True, "policy always"),
        # threshold, nothing reached: 100/1000 = 0.1 < 0.2, 3 < 48 files, 2h < 6h.
        (THRESHOLD, load(1000, 100, 3, 2), False, False, "no threshold reached"),
        # each threshold alone, exactly at its limit (reached means >=).
        (THRESHOLD, load(1000, 200, 3, 2), False, True, "pending_rows_ratio"),
        (THRESHOLD, load(1000, 10, 48, 2), False, True, "pending_files 48/48"),
        (THRESHOLD, load(1000, 10, 3, 6), False, True, "pending_age 6h00m/6h"),
        # just below every limit.
        (THRESHOLD, load(1000, 199, 47, 5.99), False, False, "no threshold reached"),
        # an empty base: any pending row reaches the ratio (the first load compacts).
        (THRESHOLD, load(0, 5, 1, 0), False, True, "no base rows yet"),
        # a threshold set to null is not checked.
        ({**THRESHOLD, "pending_rows_ratio": None}, load(1, 500, 3, 2), False, False, "no threshold reached"),
        ({**THRESHOLD, "pending_age": None}, load(1000, 1, 1, 500), False, False, "no threshold reached"),
        # undated increments: the age cannot be reached.
        (THRESHOLD, load(1000, 1, 1, None), False, False, "pending_age unknown"),
        # force: compacts whatever the thresholds say.
        (THRESHOLD, load(1000, 1, 1, 0), True, True, "forced"),
    ],
)
def test_the_decision_follows_the_readme_rule(
    policy: dict[str, Any], pending: PendingLoad, force: bool, compacts: bool, reason_has: str
) -> None:
    d = decide(Compaction(**policy), pending, NOW, force=force)
    assert d.compact is compacts
    assert reason_has in d.reason
    assert d.forced is force
    doc = d.to_dict()
    assert doc["compact"] is compacts and doc["reason"] == d.reason
    # The plan record keeps it; a plan that does not compact says why, naming the table and plan.
    why = deferred({"table": "db.t", "plan_id": "p1", "compaction": doc})
    assert (why is None) is compacts
    if why is not None:
        assert why.startswith("db.t: plan p1 does not compact: no threshold reached")


def test_the_thresholds_measured_are_the_ones_set() -> None:
    d = decide(Compaction(**THRESHOLD), load(1000, 100, 12, 3), NOW)
    by_name = {t["threshold"]: t for t in d.to_dict()["thresholds"]}
    assert by_name == {
        "pending_rows_ratio": {
            "threshold": "pending_rows_ratio",
            "value": 0.1,
            "limit": 0.2,
            "reached": False,
            "progress": 0.5,
        },
        "pending_files": {
            "threshold": "pending_files",
            "value": 12.0,
            "limit": 48.0,
            "reached": False,
            "progress": 0.25,
        },
        "pending_age": {
            "threshold": "pending_age",
            "value": 3 * 3600.0,
            "limit": 6 * 3600.0,
            "reached": False,
            "progress": 0.5,
        },
    }


def test_a_plan_written_before_the_policy_compacts() -> None:
    assert deferred({"table": "db.t", "plan_id": "p"}) is None


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"pending_rows_ratio": 0}, "pending_rows_ratio"),
        ({"pending_rows_ratio": -0.5}, "pending_rows_ratio"),
        ({"pending_rows_ratio": float("inf")}, "pending_rows_ratio"),
        ({"pending_files": 0}, "pending_files"),
        ({"pending_age": "0h"}, "pending_age"),
        ({"pending_age": "soon"}, "pending_age"),
        ({"policy": "sometimes"}, "policy"),
        ({"policy": "threshold", "pending_rows_ratio": None, "pending_files": None, "pending_age": None}, "never"),
        ({"threshold": 3}, "threshold"),
    ],
)
def test_bad_policies_are_refused_naming_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        Compaction(**values)
    assert field in str(err.value)


ratios = st.one_of(st.none(), st.floats(min_value=0.001, max_value=10))
counts = st.one_of(st.none(), st.integers(min_value=1, max_value=500))
ages = st.one_of(st.none(), st.integers(min_value=1, max_value=48 * 3600))


@given(
    ratio=ratios,
    files_limit=counts,
    age_limit=ages,
    base=st.integers(min_value=0, max_value=10**7),
    rows=st.integers(min_value=0, max_value=10**7),
    files=st.integers(min_value=1, max_value=1000),
    age_s=st.one_of(st.none(), st.integers(min_value=0, max_value=72 * 3600)),
    force=st.booleans(),
)
def test_threshold_compacts_exactly_when_a_threshold_is_reached_or_forced(
    ratio: float | None,
    files_limit: int | None,
    age_limit: int | None,
    base: int,
    rows: int,
    files: int,
    age_s: int | None,
    force: bool,
) -> None:
    if ratio is None and files_limit is None and age_limit is None:
        ratio = 0.2  # the registry refuses a threshold policy with no threshold
    policy = Compaction(policy="threshold", pending_rows_ratio=ratio, pending_files=files_limit, pending_age=age_limit)
    oldest = None if age_s is None else NOW - timedelta(seconds=age_s)
    crossed = (
        (ratio is not None and (rows / base >= ratio if base else rows > 0))
        or (files_limit is not None and files >= files_limit)
        or (age_limit is not None and age_s is not None and age_s >= age_limit)
    )
    d = decide(policy, PendingLoad(base, rows, files, oldest), NOW, force=force)
    # Never skips when a threshold is crossed or the run forces; never compacts otherwise.
    assert d.compact is bool(crossed or force)


def test_a_registry_file_with_a_bad_policy_is_refused_naming_file_table_and_field(tmp_path: Path) -> None:
    from tests.core.test_registry import good_doc, refusal, snapshot_doc, write_yaml

    err = refusal(write_yaml(tmp_path, "tests.student.yaml", good_doc(compaction={"pending_files": 0})))
    assert err.table == "tests.student" and "tests.student.yaml" in str(err)
    assert any("compaction.pending_files" in p for p in err.problems), err.problems
    doc = snapshot_doc(compaction={"policy": "threshold"})
    err = refusal(write_yaml(tmp_path, f"{doc['database']}.{doc['table']}.yaml", doc))
    assert any("compaction.policy: a snapshot table compacts every export" in p for p in err.problems), err.problems
    # Unset: always, today's behaviour.
    from cdc_compaction.core.registry import parse_table

    assert parse_table(good_doc()).compaction.policy == "always"


def test_status_shows_the_policy_and_how_close_each_threshold_is(tmp_path: Path) -> None:
    from conftest import student_doc

    from cdc_compaction.core.registry import parse_table
    from cdc_compaction.devtools.conformance import land
    from cdc_compaction.operations.status import table_status

    policy = {"policy": "threshold", "pending_files": 3, "pending_rows_ratio": 0.5, "pending_age": "48h"}
    cfg = parse_table(student_doc(tmp_path / "lake", compaction=policy))
    row = {"id": 1, "full_name": "A", "op": "c", "ts_ms": 1}
    land(cfg, "increment_2026112200", [[row, {**row, "id": 2}]])
    land(cfg, "increment_2026112203", [[row]])
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    st = table_status(cfg, now)
    by_name = {t["threshold"]: t for t in st.compaction["thresholds"]}
    # Two files of three; the oldest increment's hour (00:00) is 12h of 48h ago; no base rows yet.
    assert (by_name["pending_files"]["value"], by_name["pending_files"]["progress"]) == (2.0, round(2 / 3, 4))
    assert (by_name["pending_age"]["value"], by_name["pending_age"]["progress"]) == (12 * 3600.0, 0.25)
    assert by_name["pending_rows_ratio"]["value"] is None and by_name["pending_rows_ratio"]["reached"] is True
    assert st.compaction["compact"] is True
    assert "compaction threshold DUE (pending_rows_ratio no base rows yet/0.5, pending_files 2/3, " in st.line()
    assert "pending_age 12h00m/48h00m)" in st.line()
    # Unset: always, and nothing is measured.
    plain = table_status(parse_table(student_doc(tmp_path / "lake2")), now)
    assert plain.compaction == {"policy": "always"} and "compaction always" in plain.line()
