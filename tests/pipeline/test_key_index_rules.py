"""The key index of partitioned tables, decided without Spark (README, "Key index").

"Like the data, an untouched partition keeps the index of the version that wrote it"; "a
partition without an index has its key columns read instead: slower, never wrong";
``validate`` refuses an attempt whose index does not cover, in its own ``index/``, exactly
the rows of each partition it wrote; retention keeps a reused partition's index with it.
Pure: stats, commit records and file listings, by hand.
"""

from __future__ import annotations

from typing import Any

from cdc_compaction.core.lake import Commit, version_dir_of
from cdc_compaction.job.compact import key_sources
from cdc_compaction.pipeline.publish import next_index
from cdc_compaction.pipeline.retention import decide_versions
from cdc_compaction.pipeline.validate import index_problems

BASE = "/lake/t/base"
OUT = f"{BASE}/v00000002-abc-a1"


def _stats(**overrides: Any) -> dict[str, Any]:
    """A consistent report: EU and US written, both indexed in the attempt's index/."""
    stats = {
        "partition_rows": {"EU": 5, "US": 4},
        "index": {"EU": f"{OUT}/index/_cdc_partition=EU", "US": f"{OUT}/index/_cdc_partition=US"},
        "index_rows": {"EU": 5, "US": 4},
        "index_mismatches": 0,
    }
    return {**stats, **overrides}


FILES = {"index/_cdc_partition=EU/part-0.parquet": 5, "index/_cdc_partition=US/part-0.parquet": 4}


def test_a_whole_and_exact_index_passes() -> None:
    assert index_problems(_stats(), OUT, FILES) == []


def test_a_partition_whose_index_rows_differ_from_its_data_is_named_with_its_files() -> None:
    files = {**FILES, "index/_cdc_partition=US/part-0.parquet": 3}
    (problem,) = index_problems(_stats(), OUT, files)
    assert "partition 'US'" in problem and "index/_cdc_partition=US/part-0.parquet" in problem
    assert "3 rows" in problem and "its data 4" in problem


def test_a_missing_index_a_stray_location_and_key_mismatches_are_refused() -> None:
    # US's index files are gone: its rows are missing, and it is named.
    (missing,) = index_problems(_stats(), OUT, {"index/_cdc_partition=EU/part-0.parquet": 5})
    assert "partition 'US'" in missing and "(no file)" in missing
    # An index reported elsewhere than the attempt's own index/, or not for every written partition.
    stray = _stats(index={"EU": f"{BASE}/v1/index/_cdc_partition=EU", "US": f"{OUT}/index/_cdc_partition=US"})
    assert any("outside the new version's" in p and "'EU'" in p for p in index_problems(stray, OUT, FILES))
    partial = _stats(index={"EU": f"{OUT}/index/_cdc_partition=EU"})
    assert any("covers partitions ['EU']" in p for p in index_problems(partial, OUT, FILES))
    assert any("2 keys differ" in p for p in index_problems(_stats(index_mismatches=2), OUT, FILES))


def test_a_job_from_before_the_index_wrote_none_and_is_not_held_to_one() -> None:
    old = {k: v for k, v in _stats().items() if not k.startswith("index")}
    assert index_problems(old, OUT, {}) == []
    assert index_problems(old, OUT, FILES) != [], "index files nobody reported are not left unexplained"


def test_untouched_partitions_keep_their_index_rewritten_ones_get_the_new_one() -> None:
    parent = {"APAC": f"{BASE}/v1/index/_cdc_partition=APAC", "EU": f"{BASE}/v1/index/_cdc_partition=EU"}
    stats = {"partitions_touched": ["EU", "US"], "index": {"EU": f"{OUT}/index/_cdc_partition=EU"}}
    # US emptied (touched, not written): gone from the map; LATAM has no index anywhere: stays without.
    partitions = {"APAC": "a", "EU": "e", "LATAM": "l"}
    assert next_index(parent, stats, partitions) == {"APAC": parent["APAC"], "EU": stats["index"]["EU"]}
    assert next_index(parent, {"partitions_touched": ["EU"]}, partitions) is None, "an old job: no index"


def test_partitions_without_an_index_are_read_from_their_data() -> None:
    base = {"APAC": "/d/APAC", "EU": "/d/EU", "US": "/d/US"}
    sources, unindexed = key_sources(base, {"EU": "/i/EU", "GONE": "/i/GONE"})
    assert sources == {"APAC": "/d/APAC", "EU": "/i/EU", "US": "/d/US"}
    assert unindexed == ["APAC", "US"]
    assert key_sources(base, {}) == (base, ["APAC", "EU", "US"]), "an index-less (older) version: scan all"


def test_a_reused_partitions_index_keeps_its_version_directory_for_it() -> None:
    v1 = f"{BASE}/v00000001-a"
    assert version_dir_of(f"{v1}/index/_cdc_partition=EU") == v1
    assert version_dir_of(f"{v1}/index-1a2b3c4d/_cdc_partition=EU/") == v1, "a rebuilt index"
    live = Commit(
        2,
        "v00000002-b",
        "b",
        "run-2",
        1,
        [],
        [],
        partitions={"EU": f"{BASE}/v00000002-b/data/_cdc_partition=EU"},
        index={"EU": f"{v1}/index-1a2b3c4d/_cdc_partition=EU"},
    )
    verdict = decide_versions([("v00000001-a", True), ("v00000002-b", True)], [live], 2, BASE)
    assert verdict.delete == set() and verdict.by_reference == {"v00000001-a"}
    assert f"{v1}/index-1a2b3c4d/_cdc_partition=EU" in verdict.referenced


def test_key_ranges_cover_every_key_cut_at_the_widest_gaps() -> None:
    from datetime import date

    from cdc_compaction.job.compact import key_ranges

    # Updates of old ids and inserts of new ones: two narrow ranges rather than one wide one.
    assert key_ranges([10, 11, 12, 9000, 9001], max_ranges=2) == [(10, 12), (9000, 9001)]
    assert key_ranges([1, 5, 6, 20, 21, 22], max_ranges=3) == [(1, 1), (5, 6), (20, 22)]
    assert key_ranges([1, 2, 3], max_ranges=16) == [(1, 1), (2, 2), (3, 3)]
    assert key_ranges([7], max_ranges=1) == [(7, 7)] and key_ranges([]) == []
    days = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 6, 1)]
    assert key_ranges(days, max_ranges=2) == [(days[0], days[1]), (days[2], days[2])]
    # Every key lies in a range, whatever the cut.
    keys = sorted({(i * 7919) % 1000 for i in range(300)})
    for n in (1, 2, 5, 16):
        got = key_ranges(keys, max_ranges=n)
        assert len(got) <= n and all(any(lo <= k <= hi for lo, hi in got) for k in keys)
