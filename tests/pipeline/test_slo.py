"""Freshness SLOs: the registry's ``slo:``, compliance over the commit history, one alert per breach.

Expected compliance comes from a reference model written here: the window sampled in the middle
of every minute, each sample within the bound if the newest data the base held then is at most
``slo.freshness`` old (the histories are on whole minutes, so the sampling is exact).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from integrations.test_notifications import _Inbox, smtp  # noqa: F401 - the SMTP server fixture
from pydantic import ValidationError

from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.pipeline.slo import (
    CHECK_FAILURES,
    FreshnessPoint,
    check,
    check_quietly,
    evaluate,
    history,
    state_path,
)

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
SLO = {"freshness": "90m", "target": 0.9, "window": "1d"}


def reference_compliance(points: list[tuple[datetime, datetime | None]], bound: timedelta, start: datetime) -> Any:
    """The fraction of sampled minutes (from the first commit, within the window) the data was fresh enough."""
    measured = fresh = 0
    first = min(at for at, _ in points)
    t = max(start, first) + timedelta(seconds=30)
    while t < NOW:
        held = [d for at, d in sorted(points, key=lambda p: p[0]) if at <= t]
        measured += 1
        if held[-1] is not None and t - held[-1] <= bound:
            fresh += 1
        t += timedelta(minutes=1)
    return fresh / measured if measured else None


def random_history(rng: random.Random) -> list[tuple[datetime, datetime | None]]:
    """Commits at random whole minutes over the last two days, each holding data some minutes old."""
    ats = sorted({NOW - timedelta(minutes=rng.randrange(1, 48 * 60)) for _ in range(rng.randrange(1, 12))})
    return [(at, None if rng.random() < 0.1 else at - timedelta(minutes=rng.randrange(0, 180))) for at in ats]


@pytest.mark.parametrize("seed", range(12))
def test_compliance_matches_the_reference_model(make_cfg: Callable[..., TableConfig], seed: int) -> None:
    cfg = make_cfg(slo=SLO)
    rng = random.Random(seed)
    points = random_history(rng)
    got = evaluate(cfg, [FreshnessPoint(at, d) for at, d in points], NOW)
    expected = reference_compliance(points, timedelta(minutes=90), NOW - timedelta(days=1))
    assert got.compliance == pytest.approx(expected, abs=1e-9)
    assert got.breached == (expected < 0.9)
    live = max(points)[1]
    assert got.lag_seconds == (None if live is None else (NOW - live).total_seconds())
    assert got.within == (live is not None and NOW - live <= timedelta(minutes=90))


def test_a_table_fresh_until_it_stopped_is_measured_from_its_first_commit(make_cfg: Callable[..., TableConfig]) -> None:
    cfg = make_cfg(slo=SLO)
    # Committed 10 h ago with data 30 min old: fresh for 60 more minutes, then stale for 9 h.
    st = evaluate(cfg, [FreshnessPoint(NOW - timedelta(hours=10), NOW - timedelta(hours=10, minutes=30))], NOW)
    assert (st.measured_seconds, st.compliant_seconds) == (10 * 3600, 3600)
    assert st.compliance == pytest.approx(0.1)
    assert st.breached and st.within is False
    assert st.lag_seconds == (10 * 60 + 30) * 60


def test_without_slo_only_the_lag_is_reported(make_cfg: Callable[..., TableConfig]) -> None:
    cfg = make_cfg()
    st = evaluate(cfg, [FreshnessPoint(NOW - timedelta(hours=1), NOW - timedelta(hours=2))], NOW)
    assert (st.compliance, st.breached, st.target, st.lag_seconds) == (None, False, None, 7200)
    assert evaluate(make_cfg(slo=SLO), [], NOW).compliance is None  # nothing committed: nothing measured


def test_registry_slo_is_validated(make_cfg: Callable[..., TableConfig]) -> None:
    cfg = make_cfg(slo={"freshness": "90m"})
    assert cfg.slo is not None
    assert (cfg.slo.freshness, cfg.slo.target, cfg.slo.window) == (timedelta(minutes=90), 0.99, timedelta(days=7))
    for bad, words in [
        ({"freshness": "2d", "window": "1d"}, "must be at least slo.freshness"),
        ({"freshness": "90m", "target": 1.5}, "less than or equal to 1"),
        ({"freshness": 0}, "longer than 0"),
        ({"freshness": "90m", "typo": 1}, "Extra inputs"),
    ]:
        with pytest.raises(ValidationError, match=words):
            make_cfg(slo=bad)


def _commit(lake: Lake, seq: int, at: datetime, event_time: str = "", increment: str = "") -> None:
    freshness = {"event_time": event_time, "increment": increment}
    commit = Commit(seq, f"v{seq:08d}-p{seq}", f"p{seq}", "r", seq - 1, [], [], committed_at=at.isoformat())
    commit.freshness = freshness
    assert lake.try_commit(commit)


def test_history_falls_back_on_the_increment_hour_and_stops_before_the_window(
    make_cfg: Callable[..., TableConfig],
) -> None:
    cfg = make_cfg(slo=SLO)
    lake = Lake(cfg)
    _commit(lake, 1, NOW - timedelta(days=3), "2026-11-23T11:00:00+00:00")
    _commit(lake, 2, NOW - timedelta(days=2), "2026-11-24T11:00:00")  # naive: UTC
    _commit(lake, 3, NOW - timedelta(hours=5), increment="increment_2026112605")  # no event time column
    points = history(cfg, lake, NOW - timedelta(days=1))
    assert points == [
        FreshnessPoint(NOW - timedelta(days=2), datetime(2026, 11, 24, 11, tzinfo=UTC)),
        # The hour 05:00-06:00: its data is complete up to 06:00.
        FreshnessPoint(NOW - timedelta(hours=5), datetime(2026, 11, 26, 6, tzinfo=UTC)),
    ]


def test_a_breach_is_alerted_once_and_its_recovery_once(smtp: _Inbox, make_cfg: Callable[..., TableConfig]) -> None:  # noqa: F811
    cfg = make_cfg(
        slo={"freshness": "90m", "target": 0.5, "window": "10h"},
        alerts={"emails": ["owner@example.org"], "smtp_conn_id": "smtp_alerts"},
    )
    lake = Lake(cfg)
    _commit(lake, 1, NOW - timedelta(hours=10), (NOW - timedelta(hours=10)).isoformat())
    # Fresh for 1.5 h of 10: breached.
    first = check(cfg, lake, NOW)
    assert first["alerted"] == "breached" and first["breached"]
    assert check(cfg, lake, NOW + timedelta(minutes=5))["alerted"] is None  # the same breach: no second mail
    assert len(smtp.messages) == 1
    rcpt, msg = smtp.messages[0]
    assert rcpt == ["owner@example.org"]
    assert msg["Subject"] == f"[cdc-compaction] {cfg.qualified_name}: freshness SLO breached (15.00%)"
    # Caught up, and hourly commits of fresh data after: 8.5 h later only 1 h 40 min of the 10 h window was stale.
    _commit(lake, 2, NOW + timedelta(minutes=10), (NOW + timedelta(minutes=10)).isoformat())
    for h in range(1, 9):
        _commit(lake, 2 + h, NOW + timedelta(hours=h), (NOW + timedelta(hours=h)).isoformat())
    later = check(cfg, lake, NOW + timedelta(hours=8, minutes=30))
    assert later["alerted"] == "recovered" and not later["breached"]
    assert len(smtp.messages) == 2
    assert "freshness SLO met again" in smtp.messages[1][1]["Subject"]


def test_each_commit_record_is_read_once_then_the_state_file_serves_it(make_cfg: Callable[..., TableConfig]) -> None:
    cfg = make_cfg(slo=SLO)
    lake = Lake(cfg)
    _commit(lake, 1, NOW - timedelta(hours=3), (NOW - timedelta(hours=4)).isoformat())
    _commit(lake, 2, NOW - timedelta(hours=2), (NOW - timedelta(hours=2)).isoformat())
    first = check(cfg, lake, NOW)
    # A record read once is not read again: even one damaged since (records are never rewritten).
    Path(lake.layout.commit_path(1)).write_text("{damaged")
    again = check(cfg, lake, NOW)
    assert {k: again[k] for k in ("compliance", "lag_seconds")} == {k: first[k] for k in ("compliance", "lag_seconds")}
    # 3 h measured: the 1 h-old data of commit 1 stays fresh for 30 min, commit 2's for 90 of its 120 min.
    assert first["compliance"] == pytest.approx(2 / 3)


def test_a_failing_check_is_logged_and_counted_never_raised(
    make_cfg: Callable[..., TableConfig], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_cfg(slo=SLO)
    lake = Lake(cfg)
    _commit(lake, 1, NOW - timedelta(hours=3), NOW.isoformat())
    Path(state_path(lake)).mkdir(parents=True)  # the state file cannot be read
    before = CHECK_FAILURES.get(cfg.qualified_name, 0)
    got = check_quietly(cfg, lake, NOW)
    assert "the SLO check failed" in got["error"]
    assert CHECK_FAILURES[cfg.qualified_name] == before + 1
    assert "could not check the freshness SLO" in caplog.text
