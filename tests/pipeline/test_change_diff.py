"""The change diff between two versions (``pipeline/changes.py``) against a reference written from the
contract alone, and the memory it holds (issue 38: nothing that grows with the table in one process).

The contract (README, "Change feed"; ``docs/data.md``): rows of the two versions paired by the primary
key, a NULL key part equal to a NULL key part; ``insert`` (the newer row), ``delete`` (the older row),
``update_before`` + ``update_after`` when any column differs, NULL equal to NULL and NaN equal to NaN; a
column one side lacks is NULL there; rows sorted by key, NULL key parts first, ``update_before`` before
``update_after``; a key held twice by one version is refused, naming the key.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import student_doc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_compaction.core.exceptions import TimeTravelError
from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.registry import parse_table
from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.pipeline.changes import VersionDiff, diff_tables, write_feed

KEY = ["k1", "k2"]
BEFORE = pa.schema([("k1", pa.int64()), ("k2", pa.string()), ("v", pa.float64()), ("w", pa.string())])
#: The newer version gained column x (a schema change): NULL in the older one.
AFTER = pa.schema([*BEFORE, pa.field("x", pa.int32())])

keys = st.tuples(st.one_of(st.none(), st.integers(-3, 3)), st.one_of(st.none(), st.sampled_from(["a", "b", "é"])))
values = st.fixed_dictionaries(
    {
        "v": st.one_of(st.none(), st.just(math.nan), st.sampled_from([0.0, -1.5, 2.0])),
        "w": st.one_of(st.none(), st.sampled_from(["p", "q"])),
        "x": st.one_of(st.none(), st.integers(0, 2)),
    }
)
version = st.dictionaries(keys, values, max_size=12)


def _rows(state: dict[tuple[Any, ...], dict[str, Any]], schema: pa.Schema) -> pa.Table:
    rows = [{"k1": k[0], "k2": k[1], **{c: v[c] for c in v if c in schema.names}} for k, v in state.items()]
    return pa.Table.from_pylist(rows, schema=schema)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _expected(before: pa.Table, after: pa.Table) -> list[tuple[str, dict[str, Any]]]:
    """The contract's change, from the rows alone."""
    cols = list(dict.fromkeys([*after.column_names, *before.column_names]))
    b = {tuple(r[c] for c in KEY): r for r in before.to_pylist()}
    a = {tuple(r[c] for c in KEY): r for r in after.to_pylist()}

    def order(k: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple((v is not None, v if v is not None else 0) for v in k)

    out: list[tuple[str, dict[str, Any]]] = []
    for k in sorted(set(a) | set(b), key=order):
        old = {c: b[k].get(c) for c in cols} if k in b else None
        new = {c: a[k].get(c) for c in cols} if k in a else None
        if old is None:
            out.append(("insert", new))
        elif new is None:
            out.append(("delete", old))
        elif not all(_same(old[c], new[c]) for c in cols):
            out += [("update_before", old), ("update_after", new)]
    return out


def _comparable(rows: list[tuple[str, dict[str, Any]]]) -> list[tuple[Any, ...]]:
    # NaN != NaN in Python: compare it as a marker.
    def norm(v: Any) -> Any:
        return "NaN" if isinstance(v, float) and math.isnan(v) else v

    return [(kind, tuple(sorted((c, norm(v)) for c, v in r.items()))) for kind, r in rows]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=version, after=version, grown=st.booleans(), narrow=st.booleans(), bucket_rows=st.sampled_from([None, 1, 3])
)
def test_the_diff_is_the_contracts_change_of_random_versions(before, after, grown, narrow, bucket_rows) -> None:
    """``narrow``: the older version's k1 is a 32-bit integer (the newer widened it); ``bucket_rows``: the
    versions are paired a bucket of keys at a time above that many rows (a 20M-row version's path)."""
    schema = pa.schema([pa.field("k1", pa.int32()), *list(BEFORE)[1:]]) if narrow else BEFORE
    old, new = _rows(before, schema), _rows(after, AFTER if grown else BEFORE)
    with pytest.MonkeyPatch.context() as mp:
        if bucket_rows is not None:
            mp.setattr(VersionDiff, "BUCKET_ROWS", bucket_rows)
        got = diff_tables(KEY, old, new)
    assert got.column_names[-1] == "_change_type"
    rows = [(r.pop("_change_type"), r) for r in got.to_pylist()]
    assert _comparable(rows) == _comparable(_expected(old, new))


def test_a_version_holding_a_key_twice_is_refused_naming_the_key() -> None:
    twice = pa.Table.from_pylist([{"k1": None, "k2": "a", "v": 1.0, "w": None}] * 2, schema=BEFORE)
    with pytest.raises(TimeTravelError, match=r"the newer version holds key \{'k1': None, 'k2': 'a'\} twice"):
        diff_tables(KEY, _rows({}, BEFORE), twice)


# ------------------------------------------------------------------------------------ memory
PEAK_SCRIPT = """
import json, resource, sys
import pyarrow as pa
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import parse_table
from cdc_compaction.operations.travel import change_batches
from cdc_compaction.pipeline.changes import write_feed
lake = Lake(parse_table(json.loads(sys.argv[1])))
assert write_feed(lake, lake.read_commit(2))
with change_batches(lake, 1, 2) as (schema, batches):  # what `changes --from 1 --to 2` streams
    changed = sum(b.num_rows for b in batches)
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(json.dumps({"peak": pa.default_memory_pool().max_memory(), "rss_mb": rss_mb, "changed": changed}))
"""


def _version(lake: Lake, seq: int, files: int, per_file: int, changed: int) -> int:
    """Version ``seq``: ``files`` files of ``per_file`` rows; ids below ``changed`` get a new name in 2."""
    version = f"v{seq:08d}-p{seq}-a1"
    data = Path(lake.layout.data_dir(version))
    data.mkdir(parents=True)
    Path(lake.layout.tombstones_dir(version)).mkdir(parents=True)
    pad = "x" * 200
    for f in range(files):
        ids = range(f * per_file, (f + 1) * per_file)
        names = [f"n{i}{'-new' if seq == 2 and i < changed else ''}{pad}" for i in ids]
        table = pa.table(
            {"id": pa.array(ids, pa.int32()), "full_name": names, "op": ["u"] * per_file, "ts_ms": [1] * per_file}
        )
        # Compressed (Arrow decompresses into its own memory: what a reader holds is counted), small row groups.
        pq.write_table(table, data / f"part-{f}.parquet", row_group_size=10_000)
    commit = Commit(
        seq=seq,
        version=version,
        plan_id=f"p{seq}",
        run_id="test",
        parent_seq=seq - 1,
        files=[],
        increments=[],
        stats={"output_visible_rows": files * per_file},
        committed_at=f"2026-11-2{seq}T10:00:00+00:00",
    )
    assert lake.try_commit(commit)
    return pq.read_table(data / "part-0.parquet").nbytes


#: Rows changed between the two versions of the memory tests (ids below it get a new name).
CHANGED = 3_000


def _diff_two_versions_in_a_fresh_process(tmp_path: Path, script: str) -> tuple[dict[str, Any], pa.Table, int]:
    """Two versions of eight files of 30,000 rows; ``script`` (a fresh process) diffs them and prints JSON.

    Returns what it printed, commit 2's feed file and one file's rows' Arrow size."""
    doc = student_doc(tmp_path / "lake", "people", keep_versions=3)
    lake = Lake(parse_table(doc))
    file_bytes = _version(lake, 1, 8, 30_000, CHANGED)
    _version(lake, 2, 8, 30_000, CHANGED)
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(doc)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return got, pq.read_table(Path(lake.layout.root) / "changes" / "c00000002.parquet"), file_bytes


def test_the_feed_of_two_versions_holds_a_batch_at_a_time_not_the_versions(tmp_path: Path) -> None:
    """``write_feed`` (the fallback feed of a rollback's or an erase's commit) and ``changes --from 1 --to 2``
    diff two versions of eight files each: Arrow's peak allocation in a fresh process stays below two
    files' rows (DuckDB pairs the rows on disk under its own memory limit, a batch goes in or out at a
    time), where pairing both versions in Python held them all."""
    got, feed, file_bytes = _diff_two_versions_in_a_fresh_process(tmp_path, PEAK_SCRIPT)
    assert feed.num_rows == got["changed"] == 2 * CHANGED
    assert feed.column("_change_type").to_pylist()[:2] == ["update_before", "update_after"]
    # One file's rows ~6.8 MB here (three row groups), a version's ~54 MB. Pairing both versions' rows
    # as Python dicts peaked at 112 MB of Arrow (679 MB RSS); the diff in DuckDB at 7.5 MB of Arrow (its
    # resident memory: the next test).
    assert got["peak"] < 2 * file_bytes, (got, file_bytes)


RSS_SCRIPT = """
import json, sys
from pathlib import Path
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import parse_table
from cdc_compaction.operations.travel import change_batches
from cdc_compaction.pipeline.changes import write_feed

def hwm_mb():  # this process's own high-water mark (bench/scale_task.py measures tasks the same way)
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024

import duckdb, pyarrow.parquet  # noqa: F401 - the imports' own memory is no part of the diff's

lake = Lake(parse_table(json.loads(sys.argv[1])))
imports = hwm_mb()
assert write_feed(lake, lake.read_commit(2))
with change_batches(lake, 1, 2) as (schema, batches):  # what `changes --from 1 --to 2` streams
    changed = sum(b.num_rows for b in batches)
print(json.dumps({"imports_mb": imports, "peak_mb": hwm_mb(), "changed": changed}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux's")
def test_the_diff_s_resident_memory_is_duckdb_s_limit_not_the_rows_copied_through_arrow(tmp_path: Path) -> None:
    """The feed's fallback and ``changes`` load each version's files with DuckDB's own Parquet reader:
    the process's resident peak above its imports stays near DuckDB's memory limit (issue 38 item 2).

    Copying the rows in as Arrow record batches cost far more resident memory than Arrow or DuckDB
    counted (both allocators keep what they freed): ``changes`` peaked at 448 MB in ``bench/scale_day.py``
    at 2M rows, 128 MB of it the imports."""
    got, feed, _ = _diff_two_versions_in_a_fresh_process(tmp_path, RSS_SCRIPT)
    assert feed.num_rows == got["changed"] == 2 * CHANGED
    # Above the imports (95 MB): 159 MB here with DuckDB reading the files (its 128 MB limit and what its
    # allocator keeps), 232 MB when the rows went in as Arrow record batches. Bound: halfway.
    assert got["peak_mb"] - got["imports_mb"] < 195, got


# ------------------------------------------------------------------------------------- on S3
@pytest.mark.s3
def test_versions_on_s3_are_diffed_through_the_lakes_storage(aws_default: str) -> None:
    """A lake on moto's S3: each file's batches come through ``lake.storage`` into the diff, for the
    commit's feed file (written back to S3) and for ``changes`` over a range."""
    import io
    import uuid

    from cdc_compaction.core.storage.s3 import S3Storage
    from cdc_compaction.operations.travel import change_feed

    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    S3Storage().client.create_bucket(Bucket=bucket)
    doc = {**student_doc(Path("/unused"), "people"), "storage_root": f"s3a://{bucket}/lake/people", "keep_versions": 3}
    lake = Lake(parse_table(doc))
    states = [{1: "ann", 2: "bob", 3: "cid"}, {1: "ann", 2: "bobby", 4: "dan"}, {1: "ann", 2: "bob", 4: "dan"}]
    for seq, names in enumerate(states, start=1):
        version = f"v{seq:08d}-p{seq}-a1"
        ids = sorted(names)
        buf = io.BytesIO()
        table = {"id": pa.array(ids, pa.int32()), "full_name": [names[i] for i in ids], "_cdc_file": ["f"] * len(ids)}
        pq.write_table(pa.table(table), buf)
        lake.storage.write_bytes(posixpath.join(lake.layout.data_dir(version), "part-0.parquet"), buf.getvalue())
        commit = Commit(
            seq=seq,
            version=version,
            plan_id=f"p{seq}",
            run_id="test",
            parent_seq=seq - 1,
            files=[],
            increments=[],
            stats={"output_visible_rows": len(ids)},
            committed_at=f"2026-11-2{seq}T10:00:00+00:00",
        )
        assert lake.try_commit(commit)
    assert write_feed(lake, lake.read_commit(2))
    with lake.storage.open_read(f"s3a://{bucket}/lake/people/changes/c00000002.parquet") as fh:
        feed = pq.read_table(fh)
    assert [(r["id"], r["_change_type"], r["full_name"], r["_commit_seq"]) for r in feed.to_pylist()] == [
        (2, "update_before", "bob", 2),
        (2, "update_after", "bobby", 2),
        (3, "delete", "cid", 2),
        (4, "insert", "dan", 2),
    ]
    # 1 -> 3: bob's two updates net to none; cid deleted by 2, dan inserted by 2.
    net = change_feed(lake, 1, 3)
    assert [(r["id"], r["_change_type"], r["_commit_version"]) for r in net.to_pylist()] == [
        (3, "delete", 2),
        (4, "insert", 2),
    ]


# ------------------------------------------------------------------- keyless: a multiset difference
#: A keyless table's rows are a multiset (docs/concepts.md, "keyless"): a commit's change is one ``delete``
#: per copy removed and one ``insert`` per copy added; rows equal column by column (NULL equal to NULL, NaN
#: equal to NaN) are copies of one row. Tiny domains, so copies and NULLs collide.
MULTI = pa.schema([("name", pa.string()), ("n", pa.int64()), ("v", pa.float64())])
multirow = st.tuples(
    st.one_of(st.none(), st.sampled_from(["a", "b"])),
    st.one_of(st.none(), st.integers(0, 1)),
    st.one_of(st.none(), st.just(math.nan), st.just(1.5)),
)
multiset = st.lists(multirow, max_size=10)


def _norm(v: Any) -> Any:
    return "NaN" if isinstance(v, float) and math.isnan(v) else v


def _multiset_change(before: list[tuple], after: list[tuple]) -> list[tuple[str, tuple]]:
    """The contract's change of a multiset, from the rows alone: a copy count per distinct row, the surplus
    of the newer version inserted, of the older one deleted."""
    from collections import Counter

    old = Counter(tuple(_norm(v) for v in r) for r in before)
    new = Counter(tuple(_norm(v) for v in r) for r in after)
    out = [("insert", r) for r, n in (new - old).items() for _ in range(n)]
    out += [("delete", r) for r, n in (old - new).items() for _ in range(n)]
    return sorted(out, key=repr)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=multiset, after=multiset)
def test_the_keyless_diff_is_the_multiset_difference(before, after) -> None:
    old = pa.Table.from_pylist([dict(zip(MULTI.names, r, strict=True)) for r in before], schema=MULTI)
    new = pa.Table.from_pylist([dict(zip(MULTI.names, r, strict=True)) for r in after], schema=MULTI)
    got = diff_tables(None, old, new)
    assert got.column_names == [*MULTI.names, "_change_type"]
    rows = [(r.pop("_change_type"), tuple(_norm(v) for v in r.values())) for r in got.to_pylist()]
    assert sorted(rows, key=repr) == _multiset_change(before, after)
    # No update pairs: a copy has no identity to pair an old one with a new one by.
    assert not ({"update_before", "update_after"} & {k for k, _ in rows})


def test_an_int96_and_an_int64_timestamp_of_one_instant_are_no_change_in_any_time_zone(tmp_path: Path) -> None:
    """An older version's INT96 value (pyarrow: naive nanoseconds, UTC) and a newer one's INT64 microseconds
    adjusted to UTC (docs/formats.md#int96-timestamps) are the same instant: no change on a host in New York,
    as Arrow tables and as the versions' files DuckDB reads."""
    code = (
        "import datetime as dt, pyarrow as pa\n"
        "from cdc_compaction.pipeline.changes import diff_tables\n"
        "at = dt.datetime(2026, 11, 22, 1, 2, 3, 456789)\n"
        "old = pa.table({'k': [1], 't': pa.array([at], pa.timestamp('ns'))})\n"
        "new = pa.table({'k': [1], 't': pa.array([at.replace(tzinfo=dt.UTC)], pa.timestamp('us', tz='UTC'))})\n"
        "print(diff_tables(['k'], old, new).num_rows)\n"
        # The same two as files, as a version's are read (DuckDB's Parquet reader): INT96, and INT64 in UTC.
        "import pyarrow.parquet as pq\n"
        "from cdc_compaction.pipeline.changes import VersionDiff\n"
        "pq.write_table(old, 'old.parquet', use_deprecated_int96_timestamps=True)\n"
        "pq.write_table(new, 'new.parquet')\n"
        "with VersionDiff('t', ['k']) as d:\n"
        "    d.load_files('before', ['old.parquet'], list, 'old')\n"
        "    d.load_files('after', ['new.parquet'], list, 'new')\n"
        "    print(d.count(d.changes_sql('before', 'after', [])))\n"
    )
    env = {**os.environ, "TZ": "America/New_York", "PYTHONPATH": str(PROJECT_ROOT / "plugins")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.split() == ["0", "0"]


def test_a_row_group_larger_than_the_memory_limit_is_read_column_by_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark file's row group is up to 128 MB, as large as the diff's memory limit: DuckDB's prefetch read
    the whole row group into one buffer and failed ("could not allocate block of size 128.5 MiB", ``changes``
    at 5M rows). Scaled down here: one row group of about 40 MB under a 32 MB limit."""
    import numpy as np

    from cdc_compaction.pipeline.changes import VersionDiff

    rows = 250_000
    rng = np.random.default_rng(7)
    strings = {f"s{i}": pa.array([b.hex() for b in np.frombuffer(rng.bytes(16 * rows), dtype="S16")]) for i in range(5)}
    table = pa.table({"id": pa.array(np.arange(rows)), **strings})
    path = tmp_path / "one_row_group.parquet"
    pq.write_table(table, path, row_group_size=rows, compression="snappy")
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    assert path.stat().st_size > 36 << 20
    monkeypatch.setattr(VersionDiff, "MEMORY_LIMIT", "32MB")
    with VersionDiff("t", ["id"]) as diff:
        diff.load_files("v", [str(path)], lambda names: list(names), "version 1")
        (n, distinct) = diff._con.execute("SELECT count(*), count(DISTINCT s4) FROM v").fetchone()
    assert (n, distinct) == (rows, len(set(strings["s4"].to_pylist())))
