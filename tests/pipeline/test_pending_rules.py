"""When an increment is complete enough for a run to take (README, "Registry fields": ``increments.*``).

Pure decisions of :mod:`cdc_compaction.pipeline.pending`: no storage, no Spark, no metastore.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cdc_compaction.core.landing import IncrementListing
from cdc_compaction.core.registry import Increments
from cdc_compaction.core.storage import FileInfo
from cdc_compaction.pipeline.pending import is_stalled, why_waiting

HOUR = datetime(2026, 11, 22, 9, tzinfo=UTC)  # increment_2026112209
LONG_AFTER = HOUR + timedelta(days=1)


def _file(name: str, changed: datetime) -> FileInfo:
    return FileInfo(f"/landing/increment_2026112209/{name}", name, False, 100, changed.timestamp())


def _listing(
    data: tuple[FileInfo, ...] | list[FileInfo] = (),
    markers: tuple[FileInfo, ...] | list[FileInfo] = (),
    in_progress: tuple[FileInfo, ...] | list[FileInfo] = (),
) -> IncrementListing:
    return IncrementListing(
        "increment_2026112209",
        "/landing/increment_2026112209",
        data=list(data),
        markers=list(markers),
        in_progress=list(in_progress),
    )


def _complete(inc: Increments, listing: IncrementListing, now: datetime) -> bool:
    return why_waiting(inc, listing, HOUR, now) is None


SETTLED = [_file("part-0.parquet", HOUR + timedelta(minutes=30))]


def test_a_settled_increment_of_a_past_hour_is_complete() -> None:
    assert _complete(Increments(), _listing(SETTLED), LONG_AFTER)


def test_the_current_hour_waits_for_its_end_unless_told_not_to() -> None:
    during = HOUR + timedelta(minutes=59)
    files = [_file("part-0.parquet", HOUR)]
    waits = why_waiting(Increments(), _listing(files), HOUR, during)
    assert waits is not None and "current hour" in waits[0]
    assert waits[1] is None, "it ends by itself: nothing to fix"
    assert _complete(Increments(wait_for_hour_end=False), _listing(files), during)
    # The hour is over: it no longer waits for it (the files settled long ago).
    assert _complete(Increments(), _listing(files), HOUR + timedelta(hours=1))


def test_settle_mode_waits_until_no_data_file_changed_for_settle_seconds() -> None:
    inc = Increments(settle_seconds=120)
    now = LONG_AFTER
    fresh = [*SETTLED, _file("part-1.parquet", now - timedelta(seconds=119))]
    waits = why_waiting(inc, _listing(fresh), HOUR, now)
    assert waits is not None and "120s" in waits[0] and waits[1] is None
    old = [*SETTLED, _file("part-1.parquet", now - timedelta(seconds=121))]
    assert _complete(inc, _listing(old), now)
    assert _complete(Increments(settle_seconds=0), _listing(fresh), now), "settle_seconds 0: no settling"


def test_marker_mode_waits_for_the_marker_file() -> None:
    inc = Increments(completion="marker", settle_seconds=0)
    waits = why_waiting(inc, _listing(SETTLED), HOUR, LONG_AFTER)
    assert waits is not None and "_SUCCESS" in waits[0]
    assert waits[1] is not None and "create _SUCCESS" in waits[1], "a marker that never comes needs a person"
    assert _complete(inc, _listing(SETTLED, markers=[_file("_SUCCESS", HOUR)]), LONG_AFTER)
    # Settle mode does not look for a marker.
    assert _complete(Increments(settle_seconds=0), _listing(SETTLED), LONG_AFTER)


def test_a_writers_temporaries_keep_an_increment_waiting_whatever_else_holds() -> None:
    temp = _file(".part-1.parquet.inprogress", HOUR)
    for inc in (Increments(), Increments(completion="marker"), Increments(wait_for_hour_end=False, settle_seconds=0)):
        listing = _listing(SETTLED, markers=[_file("_SUCCESS", HOUR)], in_progress=[temp])
        waits = why_waiting(inc, listing, HOUR, LONG_AFTER)
        assert waits is not None and ".part-1.parquet.inprogress" in waits[0]
        assert waits[1] is not None and "remove them" in waits[1]


@pytest.mark.parametrize(
    ("fix", "waited", "stalled"),
    [
        pytest.param("remove them", timedelta(hours=6), True, id="temporaries-at-alert_after"),
        pytest.param("create _SUCCESS", timedelta(hours=7), True, id="marker-past-alert_after"),
        pytest.param("remove them", timedelta(hours=5, minutes=59), False, id="not-yet"),
        pytest.param(None, timedelta(days=3), False, id="waits-that-end-by-themselves-never-stall"),
    ],
)
def test_only_waits_a_person_must_end_stall_and_only_after_alert_after(
    fix: str | None, waited: timedelta, stalled: bool
) -> None:
    since = HOUR + timedelta(hours=1)
    assert is_stalled(fix, since, since + waited, timedelta(hours=6)) is stalled


def test_nothing_to_date_the_wait_by_is_never_stalled() -> None:
    assert not is_stalled("remove them", None, LONG_AFTER, timedelta(0))
