"""Which base versions a publish may delete (README: ``keep_versions``, "Crash safety", "Partitioned tables").

"Base versions kept for rollback (the live one included)"; "version directories ... of
plans that never committed ... are removed by a later publish"; "a version directory stays
as long as a kept commit's map names one of its partitions (only those partitions)".
Pure: directory names and commit records, by hand.
"""

from __future__ import annotations

from cdc_compaction.core.lake import EMPTY_VERSION, Commit
from cdc_compaction.pipeline.retention import decide_versions, kept_seqs

BASE = "/lake/t/base"


def _commit(seq: int, version: str, partitions: dict[str, str] | None = None) -> Commit:
    return Commit(seq, version, version.split("-")[1], f"run-{seq}", seq - 1, [], [], partitions=partitions)


def test_keep_versions_counts_the_live_commit() -> None:
    assert list(kept_seqs(5, 3)) == [3, 4, 5]
    assert list(kept_seqs(5, 1)) == [5]
    assert list(kept_seqs(1, 3)) == [0, 1], "never before the genesis commit"


def test_older_versions_go_kept_ones_stay() -> None:
    kept = [_commit(3, "v00000003-c"), _commit(4, "v00000004-d")]
    names = ["v00000001-a", "v00000002-b", "v00000003-c", "v00000004-d"]
    verdict = decide_versions([(n, True) for n in names], kept, 4, BASE)
    assert verdict.delete == {"v00000001-a", "v00000002-b"}
    assert not verdict.by_reference


def test_the_genesis_version_and_anything_that_is_not_a_version_stay() -> None:
    entries = [(EMPTY_VERSION, True), ("notes", True), ("v00000001-a", False), ("_tmp", True)]
    assert decide_versions(entries, [_commit(4, "v00000004-d")], 4, BASE).delete == set()


def test_attempts_of_plans_that_never_committed_go_unless_a_run_may_still_be_writing_them() -> None:
    kept = [_commit(4, "v00000004-d-2")]
    entries = [
        ("v00000004-d-1", True),  # the failed first attempt of the live commit's plan
        ("v00000004-d-2", True),  # the attempt that was committed
        ("v00000003-lost-1", True),  # a plan that lost its commit number to another
        ("v00000005-e-1", True),  # the next run, in flight
    ]
    assert decide_versions(entries, kept, 4, BASE).delete == {"v00000004-d-1", "v00000003-lost-1"}


def test_an_old_version_stays_for_the_partitions_a_kept_commit_still_names() -> None:
    v1, v2 = f"{BASE}/v00000001-a", f"{BASE}/v00000002-b"
    live = _commit(2, "v00000002-b", {"APAC": f"{v1}/data/_cdc_partition=APAC/", "EU": f"{v2}/data/_cdc_partition=EU"})
    verdict = decide_versions([("v00000001-a", True), ("v00000002-b", True)], [live], 2, BASE)
    assert verdict.delete == set() and verdict.by_reference == {"v00000001-a"}
    assert f"{v1}/data/_cdc_partition=APAC" in verdict.referenced, "what stays of it"
    # Once no kept commit names it, it goes like any other old version.
    later = _commit(3, "v00000003-c", {"APAC": f"{BASE}/v00000003-c/data/_cdc_partition=APAC"})
    entries = [("v00000001-a", True), ("v00000002-b", True), ("v00000003-c", True)]
    assert decide_versions(entries, [later], 3, BASE).delete == {"v00000001-a", "v00000002-b"}


def test_partitions_outside_this_tables_base_protect_nothing_here() -> None:
    live = _commit(2, "v00000002-b", {"EU": "/elsewhere/base/v00000001-a/data/_cdc_partition=EU"})
    verdict = decide_versions([("v00000001-a", True)], [live], 2, BASE)
    assert verdict.delete == {"v00000001-a"} and not verdict.by_reference


def test_an_old_snapshot_version_stays_for_its_history_partitions() -> None:
    """Snapshot tables: every commit names all history partitions, each in the version that applied its date."""
    v1, v2 = f"{BASE}/v00000001-a", f"{BASE}/v00000002-b"
    live = Commit(2, "v00000002-b", "b", "run-2", 1, [], [])
    history = [f"{v1}/history/eff_start_date=2026-11-22", f"{v2}/history/eff_start_date=2026-11-23"]
    entries = [("v00000001-a", True), ("v00000002-b", True), ("v00000001-x", True)]
    verdict = decide_versions(entries, [live], 2, BASE, outputs=history)
    assert verdict.by_reference == {"v00000001-a"} and verdict.delete == {"v00000001-x"}
    assert f"{v1}/history/eff_start_date=2026-11-22" in verdict.referenced, "what stays of it"
