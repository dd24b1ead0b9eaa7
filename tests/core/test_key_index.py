"""``index verify`` and ``index rebuild`` on a real lake directory, no Spark (README, "Key index").

The version is written by hand with pyarrow (data partitions and index files as the job lays
them out), so each kind of damage can be made exactly: a partition without an index, an index
directory gone, an index whose keys differ from its data, a key in two partitions. Expected
keys come from the rows written here, never from the project's code.
"""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_compaction.core.exceptions import ConcurrentRunError
from cdc_compaction.core.keyindex import live_index, rebuild_index, side_path, verify_index
from cdc_compaction.core.lake import Commit, Lake, TableLease

REGIONS = {"EU": [3, 1, 2], "US": [10, 11]}
VERSION = "v00000001-p1-a1"


def _version(lake: Lake, index: dict[str, list[int]] | None, prefix: str = "_cdc_partition=") -> Commit:
    """Commit 1 with the data of REGIONS and an index holding ``index`` (partition -> keys).

    ``prefix``: the partition directories' names, ``cdc_partition=`` as versions are written since
    issue 37, or ``_cdc_partition=`` as before.
    """
    vdir = Path(lake.layout.version_dir(VERSION))
    parts = {}
    for region, ids in REGIONS.items():
        d = vdir / "data" / f"{prefix}{region}"
        d.mkdir(parents=True)
        pq.write_table(
            pa.table({"id": pa.array(ids, pa.int32()), "full_name": [f"n{i}" for i in ids]}), d / "part-0.parquet"
        )
        parts[region] = str(d)
    locs = {}
    for region, ids in (index or {}).items():
        d = vdir / "index" / f"{prefix}{region}"
        d.mkdir(parents=True)
        pq.write_table(pa.table({"id": pa.array(sorted(ids), pa.int32())}), d / "part-0.parquet")
        locs[region] = str(d)
    commit = Commit(1, VERSION, "p1", "r1", 0, [], [], partitions=parts, partition_rows={}, index=locs)
    assert lake.try_commit(commit)
    return commit


@pytest.fixture
def lake(make_cfg: Any) -> Lake:
    cfg = make_cfg(
        columns=[{"name": "id", "type": "int"}, {"name": "region", "type": "string"}, *_rest()],
        partition_by={"column": "region"},
    )
    return Lake(cfg)


def _rest() -> list[dict[str, str]]:
    return [
        {"name": "full_name", "type": "string"},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": "bigint"},
    ]


def test_a_whole_index_verifies(lake: Lake) -> None:
    _version(lake, {"EU": [1, 2, 3], "US": [10, 11]})
    report = verify_index(lake)
    assert (report.partitions, report.rows, report.problems) == (2, 5, ())


def test_each_kind_of_damage_is_named_with_table_partition_file_and_fix(lake: Lake) -> None:
    # US has no index; EU's lost key 3 and holds key 10, which is US's: in two partitions.
    commit = _version(lake, {"EU": [1, 2, 10]})
    problems = verify_index(lake).problems
    table, fix = lake.cfg.qualified_name, f"index rebuild {lake.cfg.qualified_name}"
    assert len(problems) == 3, problems
    assert all(table in p and fix in p for p in problems)
    unindexed = next(p for p in problems if "'US'" in p)
    assert "has no key index" in unindexed and commit.partitions["US"] in unindexed
    differ = next(p for p in problems if "'EU'" in p)
    assert f"{commit.index['EU']}/part-0.parquet" in differ and "3 keys that differ from the 3 keys" in differ
    assert "1 keys are in the key index of two partitions" in next(p for p in problems if "two partitions" in p)
    # An index directory a commit names that is gone.
    Path(commit.index["EU"], "part-0.parquet").unlink()
    assert any("'EU'" in p and "holds no Parquet file" in p for p in verify_index(lake).problems)


@pytest.mark.parametrize("prefix", ["cdc_partition=", "_cdc_partition="], ids=["new", "old"])
def test_rebuild_writes_beside_never_over_and_names_the_new_index_in_a_side_file(lake: Lake, prefix: str) -> None:
    commit = _version(lake, {"EU": [1, 2]}, prefix)  # damaged: EU lost key 3, US has none
    record = Path(lake.layout.commit_path(1)).read_text()
    old_eu = Path(commit.index["EU"], "part-0.parquet").read_bytes()
    result = rebuild_index(lake, by="test", now=datetime.now(UTC))
    assert (result.seq, result.partitions, result.rows) == (1, 2, 5)
    assert verify_index(lake).problems == ()
    index = live_index(lake, lake.latest_commit())
    assert sorted(index) == ["EU", "US"] and all(loc.startswith(result.location + "/") for loc in index.values())
    assert sorted(Path(loc).name for loc in index.values()) == [f"{prefix}EU", f"{prefix}US"], "named as the data"
    for region, ids in REGIONS.items():
        keys = pq.read_table(next(Path(index[region]).glob("*.parquet"))).column("id").to_pylist()
        assert keys == sorted(ids)
    # Nothing a commit references was written again: the record and the old index are as they were.
    assert Path(lake.layout.commit_path(1)).read_text() == record
    assert Path(commit.index["EU"], "part-0.parquet").read_bytes() == old_eu
    assert json.loads(Path(side_path(lake, 1)).read_text())["version"] == VERSION
    assert TableLease(lake).current().released, "the lease is given back"


def test_rebuild_waits_for_no_one_it_refuses_while_a_run_holds_the_lease(lake: Lake) -> None:
    _version(lake, {"EU": [1, 2, 3], "US": [10, 11]})
    TableLease(lake).acquire("a-run", lake.cfg.lease_timeout, datetime.now(UTC))
    with pytest.raises(ConcurrentRunError, match=lake.cfg.qualified_name):
        rebuild_index(lake, by="test", now=datetime.now(UTC))
    assert not Path(side_path(lake, 1)).exists()


PEAK_SCRIPT = """
import json, resource, sys
from cdc_compaction.core.keyindex import verify_index
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import parse_table
import pyarrow as pa
report = verify_index(Lake(parse_table(json.loads(sys.argv[1]))))
print(json.dumps({"problems": list(report.problems), "rows": report.rows,
                  "arrow_peak": pa.default_memory_pool().max_memory(),
                  "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def test_verify_holds_one_partitions_keys_not_the_tables(tmp_path: Path) -> None:
    """The check for keys in two partitions groups every key of the table: it spills to disk (DuckDB)
    rather than holding them all. 4M keys in 8 partitions: Arrow's peak ~24 MB, where holding every key
    tagged with its partition took 540 MB (issue 38: nothing that grows with the table in one process)."""
    import json
    import subprocess
    import sys

    root = tmp_path / "lake"
    doc = {
        "database": "tests",
        "table": "wide",
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "columns": [{"name": "id", "type": "bigint"}, {"name": "region", "type": "string"}, *_rest()],
        "partition_by": {"column": "region"},
        "storage_root": str(root),
    }
    from cdc_compaction.core.registry import parse_table

    lake = Lake(parse_table(doc))
    vdir, n = Path(lake.layout.version_dir(VERSION)), 500_000
    parts, locs = {}, {}
    for p in range(8):
        ids = pa.table({"id": pa.array(range(p * n, (p + 1) * n), pa.int64())})
        for kind, where in (("data", parts), ("index", locs)):
            d = vdir / kind / f"_cdc_partition=P{p}"
            d.mkdir(parents=True)
            pq.write_table(ids, d / "part-0.parquet")
            where[f"P{p}"] = str(d)
    # One key in two partitions: found, and named.
    pq.write_table(pa.table({"id": pa.array([n], pa.int64())}), Path(parts["P0"], "part-1.parquet"))
    pq.write_table(pa.table({"id": pa.array([n], pa.int64())}), Path(locs["P0"], "part-1.parquet"))
    assert lake.try_commit(Commit(1, VERSION, "p1", "r1", 0, [], [], partitions=parts, partition_rows={}, index=locs))
    done = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, json.dumps(doc)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["rows"] == 8 * n + 1
    assert got["problems"] == [
        f"tests.wide: 1 keys are in the key index of two partitions, e.g. [{{'id': {n}}}]; run `cdc-compaction "
        "index rebuild tests.wide` (and check the data: a key lives in one partition)"
    ]
    # The rows this process holds are Arrow's (one partition's keys, sorted, against its index's): ~24 MB
    # here, where holding every key tagged with its partition took 540 MB. DuckDB's own memory is held to
    # its limit (128 MB, then it spills). The process's peak RSS (~360 MB alone, 1 GB once in a loaded
    # make test run, unexplained) is not asserted: it varies with what the machine does.
    assert got["arrow_peak"] < 100 * 2**20, got


ONE_PARTITION_SCRIPT = """
import json, sys
from datetime import UTC, datetime
from cdc_compaction.core.keyindex import rebuild_index, verify_index
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import parse_table
import pyarrow as pa
lake = Lake(parse_table(json.loads(sys.argv[1])))
pool = pa.default_memory_pool()
if sys.argv[2] == "verify":
    report = verify_index(lake)
    out = {"problems": list(report.problems), "rows": report.rows}
else:
    result = rebuild_index(lake, by="test", now=datetime.now(UTC))
    out = {"rows": result.rows, "partitions": result.partitions}
out["arrow_peak"] = pool.max_memory()
print(json.dumps(out))
"""


def test_verify_and_rebuild_hold_a_batch_of_a_partitions_keys_not_the_partition(tmp_path: Path) -> None:
    """One large partition: verify compares its index with its data, and rebuild sorts its keys, in DuckDB
    (memory limit, spilling), reading the files a batch at a time. 1.2M string keys in one partition:
    holding them (read, sorted, cast) took Arrow 94 MB; a batch at a time takes ~6 MB (issue 38: nothing
    that grows with the table in one process)."""
    import subprocess
    import sys

    root = tmp_path / "lake"
    doc = {
        "database": "tests",
        "table": "big_partition",
        "primary_key": ["code"],
        "order_by": ["ts_ms"],
        "columns": [{"name": "code", "type": "string"}, {"name": "region", "type": "string"}, *_rest()],
        "partition_by": {"column": "region"},
        "storage_root": str(root),
    }
    from cdc_compaction.core.registry import parse_table

    lake = Lake(parse_table(doc))
    vdir, n = Path(lake.layout.version_dir(VERSION)), 1_200_000
    # Written out of order, in row groups of 100k, and in two files: the index must come out sorted.
    codes = [f"k{(i * 7919) % n:09d}" for i in range(n)]
    small = ["a1", "a0", None]
    parts, locs = {}, {}
    for value, keys in (("BIG", codes), ("SMALL", small)):
        d = vdir / "data" / f"_cdc_partition={value}"
        d.mkdir(parents=True)
        half = len(keys) // 2
        for i, chunk in enumerate((keys[:half], keys[half:])):
            pq.write_table(
                pa.table({"code": pa.array(chunk, pa.string())}), d / f"part-{i}.parquet", row_group_size=100_000
            )
        parts[value] = str(d)
    # BIG's index is its keys sorted but one; SMALL's is right (NULL last, as the job's and pyarrow's sort put it).
    for value, keys in (("BIG", sorted(codes)[1:]), ("SMALL", ["a0", "a1", None])):
        d = vdir / "index" / f"_cdc_partition={value}"
        d.mkdir(parents=True)
        pq.write_table(pa.table({"code": pa.array(keys, pa.string())}), d / "part-0.parquet", row_group_size=100_000)
        locs[value] = str(d)
    del codes
    assert lake.try_commit(Commit(1, VERSION, "p1", "r1", 0, [], [], partitions=parts, partition_rows={}, index=locs))

    def run(what: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", ONE_PARTITION_SCRIPT, json.dumps(doc), what],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    got = run("verify")
    assert got["rows"] == n - 1 + 3
    assert len(got["problems"]) == 1 and "partition 'BIG'" in got["problems"][0], got["problems"]
    assert f"holds {n - 1} keys that differ from the {n} keys of its data" in got["problems"][0]
    assert got["arrow_peak"] < 30 * 2**20, got
    got = run("rebuild")
    assert (got["rows"], got["partitions"]) == (n + 3, 2)
    assert got["arrow_peak"] < 30 * 2**20, got
    index = live_index(lake, lake.latest_commit())
    for value, want in (("BIG", None), ("SMALL", ["a0", "a1", None])):
        files = sorted(Path(index[value]).glob("*.parquet"))
        keys = pa.concat_tables([pq.read_table(f) for f in files]).column("code").to_pylist()
        if want is None:
            assert len(keys) == n and keys[0] == "k000000000" and keys[-1] == f"k{n - 1:09d}"
            assert all(a < b for a, b in itertools.pairwise(keys)), "the rebuilt index is sorted"
        else:
            assert keys == want
    assert run("verify")["problems"] == []


# Microsecond instants (Spark's precision): a rebuild that rounds, or shifts by a zone, differs.
AT = [datetime(2026, 11, 22, h, 2, 3, 100_001 * h, tzinfo=UTC) for h in range(1, 6)]


def _footer_timestamp(path: Path, column: str) -> str:
    """``INT96``, ``micros`` (INT64 microseconds adjusted to UTC) or what else the footer says of ``column``."""
    schema = pq.read_metadata(path).schema
    col = next(schema.column(i) for i in range(len(schema)) if schema.column(i).path == column)
    logical = str(col.logical_type)
    if col.physical_type == "INT96":
        return "INT96"
    if col.physical_type == "INT64" and "isAdjustedToUTC=true" in logical and "timeUnit=microseconds" in logical:
        return "micros"
    return f"{col.physical_type} {logical}"


@pytest.mark.parametrize("setting", ["micros", "int96"])
def test_rebuild_writes_timestamp_keys_as_the_job_does_from_int96_and_int64_files(
    setting: str, make_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key with a timestamp, in a version whose partition EU holds Spark's INT96 files (older versions)
    and US INT64 microseconds: the rebuilt index is in the type the job writes for the table (registry
    ``parquet_timestamps``), holds every key's instant, and verifies, in a process whose zone is not UTC."""
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    cfg = make_cfg(
        columns=[
            {"name": "id", "type": "int"},
            {"name": "at", "type": "timestamp"},
            {"name": "region", "type": "string"},
            *_rest(),
        ],
        primary_key=["id", "at"],
        partition_by={"column": "region"},
        parquet_timestamps=setting,
    )
    lake = Lake(cfg)
    vdir = Path(lake.layout.version_dir(VERSION))
    keys = {"EU": [(3, AT[2]), (1, AT[0]), (1, AT[1])], "US": [(10, AT[4]), (11, AT[3])]}
    parts = {}
    for region, rows in keys.items():
        d = vdir / "data" / f"_cdc_partition={region}"
        d.mkdir(parents=True)
        table = pa.table(
            {
                "id": pa.array([i for i, _ in rows], pa.int32()),
                "at": pa.array([t for _, t in rows], pa.timestamp("us", tz="UTC")),
                "full_name": [f"n{i}" for i, _ in rows],
            }
        )
        pq.write_table(table, d / "part-0.parquet", use_deprecated_int96_timestamps=region == "EU")
        parts[region] = str(d)
    assert _footer_timestamp(Path(parts["EU"], "part-0.parquet"), "at") == "INT96"
    assert _footer_timestamp(Path(parts["US"], "part-0.parquet"), "at") == "micros"
    assert lake.try_commit(Commit(1, VERSION, "p1", "r1", 0, [], [], partitions=parts, partition_rows={}, index={}))
    try:
        rebuild_index(lake, by="test", now=datetime.now(UTC))
        index = live_index(lake, lake.latest_commit())
        want = "INT96" if setting == "int96" else "micros"
        for region, rows in keys.items():
            (f,) = Path(index[region]).glob("*.parquet")
            assert _footer_timestamp(f, "at") == want, (region, f)
            got = pq.read_table(f, coerce_int96_timestamp_unit="us").to_pylist()
            instants = [(r["id"], r["at"] if r["at"].tzinfo else r["at"].replace(tzinfo=UTC)) for r in got]
            assert instants == sorted(rows), region
        assert verify_index(lake).problems == ()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
