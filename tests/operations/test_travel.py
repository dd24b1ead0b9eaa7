"""Time travel: ``versions``, the change feed (``changes``) and ``rollback`` (README, "Change feed",
"Time travel and rollback").

The change-feed tests write versions by hand (Parquet files and commit records, as publish
lays them out) and compute the expected changes in the test from the rows they wrote. The
rollback test runs the real steps on the session metastore and Spark, crashes the rollback at
each of its fault points and checks that a re-run finishes it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import compact_once, student_doc, visible_names

from cdc_compaction.cli.main import main
from cdc_compaction.core.exceptions import ConcurrentRunError, TimeTravelError
from cdc_compaction.core.lake import Commit, Lake, TableLease
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.core.sql import table_names
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.job.faults import ENV, InjectedFaultError
from cdc_compaction.operations.travel import change_feed, kept_versions, rollback
from cdc_compaction.pipeline.changes import (
    FEED_FAILURES,
    diff_rows,
    feed_plan,
    feed_table,
    sync_changes,
    write_feed,
)
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables

# ---------------------------------------------------------------------------------- helpers
#: Three versions of a student table (id -> full_name), as three compactions might leave them.
STATES: list[dict[int, str]] = [
    {1: "ann", 2: "bob", 3: "cid", 4: "dan"},
    {1: "ann", 2: "bobby", 4: "dan", 5: "eve"},  # 2 updated, 3 deleted, 5 inserted
    {1: "ann", 2: "robert", 3: "cid", 4: "dan", 5: "eve", 6: "fay"},  # 2 again, 3 back, 6 new
]


def _write_version(
    lake: Lake, seq: int, names: dict[int, str], partitioned: bool = False, kept: dict[str, str] | None = None
) -> Commit:
    """Lay out version ``seq`` as publish does (data/, tombstones/), with the job's provenance columns.

    ``kept``: partitions this version keeps as an earlier one wrote them (partition -> that directory), as a
    compaction keeps the partitions its events do not touch; their rows are not written again."""
    version = f"v{seq:08d}-p{seq}-a1"
    data = Path(lake.layout.data_dir(version))
    ids = sorted(names)
    table = pa.table(
        {
            "id": pa.array(ids, pa.int32()),
            "full_name": pa.array([names[i] for i in ids]),
            "op": pa.array(["u"] * len(ids)),
            # A row's ordering value follows its content: an unchanged row is the same row in every version.
            "ts_ms": pa.array([zlib.crc32(names[i].encode()) for i in ids], pa.int64()),
            # Provenance differs in every version: not a change of the row.
            "_cdc_file": pa.array([f"file-{seq}"] * len(ids)),
        }
    )
    partitions = None
    if partitioned:
        partitions = {}
        for parity in ("even", "odd"):
            if parity in (kept or {}):
                partitions[parity] = (kept or {})[parity]
                continue
            d = data / f"_cdc_partition={parity}"
            d.mkdir(parents=True)
            keep = pa.array([(i % 2 == 0) == (parity == "even") for i in ids])
            pq.write_table(table.filter(keep), d / "part-0.parquet")
            partitions[parity] = str(d)
    else:
        data.mkdir(parents=True)
        pq.write_table(table, data / "part-0.parquet")
    Path(str(lake.layout.tombstones_dir(version))).mkdir(parents=True)
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
        partitions=partitions,
        partition_rows=None if partitions is None else {p: 0 for p in partitions},
    )
    assert lake.try_commit(commit)
    return commit


def _lake_with_states(cfg: TableConfig, partitioned: bool = False) -> Lake:
    lake = Lake(cfg)
    for seq, names in enumerate(STATES, start=1):
        _write_version(lake, seq, names, partitioned)
    return lake


def _expected_feed(frm: int, to: int, states: list[dict[int, str]] = STATES) -> list[tuple[int, str, str | None, int]]:
    """(id, change type, full_name, commit) from ``states`` alone: net change, the last commit that touched the id."""
    before, after = states[frm - 1] if frm else {}, states[to - 1]
    last: dict[int, int] = {}
    for seq in range(frm + 1, to + 1):
        prev, cur = states[seq - 2] if seq >= 2 else {}, states[seq - 1]
        for i in set(prev) | set(cur):
            if prev.get(i) != cur.get(i):
                last[i] = seq
    out = []
    for i in sorted(set(before) | set(after)):
        if i not in before:
            out.append((i, "insert", after[i], last[i]))
        elif i not in after:
            out.append((i, "delete", before[i], last[i]))
        elif before[i] != after[i]:
            out += [(i, "update_before", before[i], last[i]), (i, "update_after", after[i], last[i])]
    return out


def _got(feed: pa.Table) -> list[tuple[int, str, str | None, int]]:
    return [(r["id"], r["_change_type"], r["full_name"], r["_commit_version"]) for r in feed.to_pylist()]


# ------------------------------------------------------------------------------- diff / feed
def test_diff_rows_pairs_rows_by_key_and_ignores_unchanged_ones() -> None:
    before = [{"k": 1, "v": 1.0}, {"k": 2, "v": float("nan")}, {"k": None, "v": 3.0}, {"k": 4, "v": 4.0}]
    after = [{"k": 1, "v": 1.5}, {"k": 2, "v": float("nan")}, {"k": None, "v": 3.0}, {"k": 5, "v": 5.0}]
    got = [(kind, r["k"], r["v"]) for kind, r in diff_rows(["k"], before, after)]
    # NaN equals NaN and a NULL key equals a NULL key (nullable_key): keys 2 and None did not change.
    assert got == [("update_before", 1, 1.0), ("update_after", 1, 1.5), ("delete", 4, 4.0), ("insert", 5, 5.0)]
    assert not any(isinstance(v, float) and math.isnan(v) for _, _, v in got)


def test_diff_rows_refuses_a_version_with_a_duplicate_key() -> None:
    with pytest.raises(TimeTravelError, match="holds key"):
        diff_rows(["k"], [{"k": 1}, {"k": 1}], [])


@pytest.mark.parametrize("bucket_rows", [None, 1, 2], ids=["whole", "bucket-of-1", "buckets-of-2"])
@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "partitioned"])
@pytest.mark.parametrize(("frm", "to"), [(1, 2), (2, 3), (1, 3), (3, 3)])
def test_change_feed_is_the_net_change_with_the_commit_that_made_it(
    make_cfg, monkeypatch, partitioned, frm, to, bucket_rows
) -> None:
    """``bucket_rows``: versions paired a bucket of keys at a time above that many rows (a 20M-row table's path)."""
    if bucket_rows is not None:
        from cdc_compaction.pipeline.changes import VersionDiff

        monkeypatch.setattr(VersionDiff, "BUCKET_ROWS", bucket_rows)
    lake = _lake_with_states(make_cfg(keep_versions=5), partitioned)
    feed = change_feed(lake, frm, to)
    assert _got(feed) == _expected_feed(frm, to)
    assert feed.schema.field("_commit_version").type == pa.int64()
    assert "_cdc_file" not in feed.column_names, "provenance is not part of a row"


def test_a_range_keeps_only_the_change_it_is_reading(make_cfg, monkeypatch) -> None:
    """Paired in buckets, each step of a range gathers its change in a table: dropped once counted, so the diff's
    database holds the net change's table alone when the output streams, however long the range."""
    from cdc_compaction.pipeline.changes import VersionDiff

    monkeypatch.setattr(VersionDiff, "BUCKET_ROWS", 1)
    seen: list[list[str]] = []
    execute = VersionDiff.execute

    def spy(self: VersionDiff, sql: str, schema: pa.Schema):  # type: ignore[no-untyped-def]
        seen.append([t for t in self.table_names() if t.startswith("cdc_changes")])
        return execute(self, sql, schema)

    monkeypatch.setattr(VersionDiff, "execute", spy)
    lake = _lake_with_states(make_cfg(keep_versions=5))
    assert _got(change_feed(lake, 1, 3)) == _expected_feed(1, 3)
    assert len(seen) == 1 and len(seen[0]) == 1, seen  # two steps' changes dropped, the net change's kept


#: Versions of a partitioned table (by id parity) where each commit rewrites one partition and keeps the other.
KEEPING: list[dict[int, str]] = [
    {1: "ann", 2: "bob", 3: "cid", 4: "dan"},
    {1: "al", 2: "bob", 4: "dan", 5: "eve"},  # odd rewritten: 1 updated, 3 deleted, 5 inserted; even kept
    {1: "al", 2: "bo", 4: "dan", 5: "eve", 6: "fay"},  # even rewritten: 2 updated, 6 inserted; odd kept
]


def test_a_diff_leaves_out_the_partitions_its_versions_share_and_is_the_same_change(make_cfg, monkeypatch) -> None:
    """A compaction keeps the partitions it does not touch (the same directory in both versions): the diffs of
    changes, the per-commit feed and status read only the rewritten ones, and the change is the same (20M rows
    in 100 partitions: the whole versions did not fit DuckDB's memory limit, bench/scale_day.py)."""
    from cdc_compaction.pipeline import changes

    lake = Lake(make_cfg(keep_versions=5))
    c1 = _write_version(lake, 1, KEEPING[0], partitioned=True)
    c2 = _write_version(lake, 2, KEEPING[1], partitioned=True, kept={"even": c1.partitions["even"]})
    _write_version(lake, 3, KEEPING[2], partitioned=True, kept={"odd": c2.partitions["odd"]})
    listed: list[str] = []
    real = changes.data_files

    def spy(lake_: Lake, d: str) -> list[str]:
        listed.append(d)
        return real(lake_, d)

    monkeypatch.setattr(changes, "data_files", spy)
    # 1 -> 2 shares the even partition, 2 -> 3 the odd one, 1 -> 3 none: each diff reads the others.
    for frm, to, shared in ((1, 2, c1.partitions["even"]), (2, 3, c2.partitions["odd"]), (1, 3, None)):
        listed.clear()
        assert _got(change_feed(lake, frm, to)) == _expected_feed(frm, to, KEEPING)
        assert listed and (shared is None or shared not in listed), (frm, to, listed)
    for seq in (2, 3):
        listed.clear()
        assert write_feed(lake, lake.read_commit(seq))
        assert _got(_read_feed(lake, seq)) == [(i, k, n, seq) for i, k, n, _ in _expected_feed(seq - 1, seq, KEEPING)]
        assert len(listed) == 2, listed  # the one rewritten partition, in the parent and in the commit


def test_change_feed_from_the_empty_table_is_every_row_inserted(make_cfg) -> None:
    lake = _lake_with_states(make_cfg(keep_versions=5))
    assert _got(change_feed(lake, 0, 1)) == [(i, "insert", n, 1) for i, n in sorted(STATES[0].items())]


def test_change_feed_refuses_versions_not_kept_a_backward_range_and_modes_without_one(make_cfg, tmp_path) -> None:
    lake = _lake_with_states(make_cfg(keep_versions=2))  # live 3: versions 2 and 3 are kept
    with pytest.raises(TimeTravelError, match=r"version 1 is not kept \(kept: 2\.\.3, keep_versions: 2, live: 3\)"):
        change_feed(lake, 1, 3)
    with pytest.raises(TimeTravelError, match="--from 3 is after --to 2"):
        change_feed(lake, 3, 2)
    # An append table only appends: no change feed (docs/data.md#change-feed).
    clicks = parse_table(
        {
            "mode": "append",
            "database": "web",
            "table": "clicks",
            "columns": [{"name": "message_id", "type": "string"}],
            "event_id": ["message_id"],
            "storage_root": str(tmp_path / "clicks"),
        }
    )
    with pytest.raises(TimeTravelError, match=r"web\.clicks: a mode: append table has no change feed"):
        change_feed(Lake(clicks), 0, 0)


def test_a_snapshot_tables_versions_are_not_rolled_back(make_snapshot_cfg, endpoint) -> None:
    """Its <t>_history only grows: the refusal names the table and why, before the lake is touched."""
    snap = make_snapshot_cfg()
    with pytest.raises(TimeTravelError, match=r"_history only grows.*not rolled back\. Nothing was changed") as err:
        rollback(snap, 1, endpoint, by="tester")
    assert str(err.value).startswith(f"{snap.qualified_name}: ")
    assert Lake(snap).read_commit(1) is None, "nothing was committed"


# ------------------------------------------------------------------- <t>_changes (per commit)
def _read_feed(lake: Lake, seq: int) -> pa.Table:
    return pq.read_table(Path(lake.layout.root) / "changes" / f"c{seq:08d}.parquet")


def test_feed_table_holds_the_commits_change_in_registry_columns(make_cfg) -> None:
    cfg = make_cfg()
    before, after = (
        pa.table(
            {"id": pa.array(sorted(s), pa.int32()), "full_name": [s[i] for i in sorted(s)], "_cdc_file": ["f"] * len(s)}
        )
        for s in STATES[:2]
    )
    feed = feed_table(cfg, before, after, 7)
    # Registry columns the versions have (op and ts_ms they lack are left out: NULL to a reader), then the two.
    assert feed.column_names == ["id", "full_name", "_change_type", "_commit_version", "_commit_seq"]
    assert feed.column("_commit_seq").to_pylist() == [7] * feed.num_rows
    assert _got(feed) == [(i, kind, name, 7) for i, kind, name, _ in _expected_feed(1, 2)]


@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "partitioned"])
def test_write_feed_writes_each_commits_change_once_and_refuses_a_gone_parent(make_cfg, partitioned) -> None:
    lake = _lake_with_states(make_cfg(keep_versions=5), partitioned)
    for seq in (1, 2, 3):
        assert write_feed(lake, lake.read_commit(seq))
        got = _read_feed(lake, seq)
        # One commit's change: the net change from its parent, every row made by that commit.
        assert _got(got) == [(i, kind, name, seq) for i, kind, name, _ in _expected_feed(seq - 1, seq)]
        assert got.column_names == ["id", "full_name", "op", "ts_ms", "_change_type", "_commit_version", "_commit_seq"]
    path = Path(lake.layout.root) / "changes" / "c00000002.parquet"
    inode = path.stat().st_ino
    assert write_feed(lake, lake.read_commit(2)) and path.stat().st_ino == inode, (
        "a written partition is never rewritten"
    )
    # The parent's version is gone: an empty read would turn its rows into inserts, so it refuses.
    path.unlink()
    shutil.rmtree(lake.layout.version_dir(lake.read_commit(1).version))
    with pytest.raises(TimeTravelError, match=r"commit 2's parent version \(1\) is no longer on storage"):
        write_feed(lake, lake.read_commit(2))
    assert not path.exists()


@pytest.mark.metastore
def test_sync_changes_never_fails_the_publish_and_counts_what_failed(make_cfg, endpoint) -> None:
    # A database the metastore does not have: the table cannot be created; the files still can.
    cfg = make_cfg(keep_versions=5, database=f"nodb_{os.getpid()}", change_feed=True)
    lake = _lake_with_states(cfg)
    shutil.rmtree(lake.layout.version_dir(lake.read_commit(1).version))  # commits 1 and 2 cannot be diffed
    rt = Runtime(cfg=cfg, lake=lake, metastore=endpoint, engine=None)
    before = FEED_FAILURES[cfg.qualified_name]
    with connect(endpoint) as ms:
        done = sync_changes(rt, ms, 3)
    assert done["written"] == [3] and done["dropped"] == []
    assert sorted(done["failed"]) == ["1", "2", "table"]
    assert "no longer on storage" in done["failed"]["1"] and cfg.database in done["failed"]["table"]
    assert FEED_FAILURES[cfg.qualified_name] == before + 3, "each failure is counted"
    assert _got(_read_feed(lake, 3)) == [(i, kind, name, 3) for i, kind, name, _ in _expected_feed(2, 3)]


@pytest.mark.parametrize(
    ("live", "keep", "present", "write", "drop"),
    [
        (5, 3, {1, 2, 3}, [4, 5], [1, 2]),  # kept 3..5: 4 and 5 missing, 1 and 2 expired
        (5, 3, set(), [4, 5], []),  # 3's parent (2) is gone: its change cannot be made any more
        (4, 1, {3}, [4], [3]),  # keep_versions 1: the live commit, before its parent goes
        (1, 3, set(), [1], []),  # the first commit: its parent is the empty table
        (2, 3, {1, 2}, [], []),  # a retry: nothing to do
    ],
)
def test_feed_plan_follows_keep_versions(live, keep, present, write, drop) -> None:
    assert feed_plan(live, keep, present) == (write, drop)


# ---------------------------------------------------------------------------------------- CLI
def _registry(tmp_path: Path, doc: dict[str, Any]) -> Path:
    d = tmp_path / "registry"
    d.mkdir(exist_ok=True)
    (d / f"{doc['database']}.{doc['table']}.yaml").write_text(yaml.safe_dump(doc))
    return d


def test_versions_and_changes_commands(tmp_path, capsys) -> None:
    doc = student_doc(tmp_path / "lake", "cli", keep_versions=3)
    reg = str(_registry(tmp_path, doc))
    _lake_with_states(parse_table(doc))

    assert main(["versions", "tests.cli", "--registry-dir", reg, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(v["commit"], v["rows"], v["live"]) for v in listed] == [
        (i, len(s), i == 3) for i, s in enumerate(STATES, start=1)
    ]
    assert listed[0]["location"].endswith("/base/v00000001-p1-a1/data")

    assert main(["changes", "tests.cli", "--registry-dir", reg, "--from", "1", "--to", "3", "--format", "json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["id"], r["_change_type"], r["full_name"], r["_commit_version"]) for r in lines] == _expected_feed(1, 3)

    out = tmp_path / "feed.parquet"
    assert (
        main(
            [
                "changes",
                "tests.cli",
                "--registry-dir",
                reg,
                "--from",
                "1",
                "--to",
                "3",
                "--format",
                "parquet",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert _got(pq.read_table(out)) == _expected_feed(1, 3)

    assert main(["changes", "tests.cli", "--registry-dir", reg, "--from", "0", "--to", "3"]) == 1
    assert "version 0 is not kept" in capsys.readouterr().err

    # rollback asks first (no terminal here: refused), and refuses a version not kept before asking.
    assert main(["rollback", "tests.cli", "--to", "2", "--registry-dir", reg]) == 1
    assert "nothing was changed; add --yes" in capsys.readouterr().err
    assert main(["rollback", "tests.cli", "--to", "0", "--registry-dir", reg, "--yes"]) == 1
    assert "version 0 is not kept" in capsys.readouterr().err
    assert Lake(parse_table(doc)).latest_commit().seq == 3


# ----------------------------------------------------------------------------------- rollback
def _land(cfg: TableConfig, increment: str, rows: list[tuple[int, str, str, int]]) -> None:
    target = Path(Lake(cfg).layout.incremental) / increment
    target.mkdir(parents=True)
    ids, names, ops, ts = zip(*rows, strict=True)
    pq.write_table(
        pa.table(
            {
                "id": pa.array(ids, pa.int32()),
                "full_name": pa.array(names),
                "op": pa.array(ops),
                "ts_ms": pa.array(ts, pa.int64()),
            }
        ),
        target / "part-00000.parquet",
    )


def _checksums(directory: str) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(directory).rglob("*"))
        if p.is_file()
    }


def _base_location(endpoint: Any, cfg: TableConfig) -> str:
    with connect(endpoint) as ms:
        return str(ms.table_location(cfg.database, table_names(cfg)["base_table"]))


@pytest.mark.spark
@pytest.mark.metastore
def test_rollback_publishes_an_old_version_as_a_new_commit_and_survives_crashes(
    tmp_path, runtime, spark, endpoint, monkeypatch
) -> None:
    doc = student_doc(
        tmp_path / "lake", f"rb_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**6}", keep_versions=4, change_feed=True
    )
    reg = _registry(tmp_path, doc)
    cfg = parse_table(doc)
    rt = runtime(cfg)
    ensure_tables(rt)
    lake = rt.lake
    _land(cfg, "increment_2026112200", [(1, "ann", "c", 1), (2, "bob", "c", 1), (3, "cid", "c", 1)])
    compact_once(rt, "r1")
    _land(cfg, "increment_2026112201", [(2, "bobby", "u", 2), (3, "cid", "d", 2), (4, "dan", "c", 2)])
    compact_once(rt, "r2")
    v1, v2 = lake.read_commit(1), lake.read_commit(2)
    assert v1 is not None and v2 is not None
    v1_files = _checksums(lake.layout.version_dir(v1.version))
    assert visible_names(spark, cfg) == {1: "ann", 2: "bobby", 4: "dan"}
    # <t>_changes: each publish wrote its commit's change, read through Spark SQL (a Hive Parquet table).
    landed = {1: ("ann", "c", 1), 2: ("bob", "c", 1), 3: ("cid", "c", 1)}
    second = {2: ("bobby", "u", 2), 4: ("dan", "c", 2)}
    expected = [(1, i, "insert", *landed[i], 1) for i in sorted(landed)]
    expected += [
        (2, 2, "update_before", *landed[2], 2),
        (2, 2, "update_after", *second[2], 2),
        (2, 3, "delete", *landed[3], 2),
        (2, 4, "insert", *second[4], 2),
    ]
    changes = f"`{cfg.database}`.`{cfg.table}_changes`"
    order = "CASE _change_type WHEN 'update_before' THEN 0 WHEN 'update_after' THEN 1 ELSE 2 END"
    query = f"SELECT _commit_seq, id, _change_type, full_name, op, ts_ms, _commit_version FROM {changes}"
    spark.catalog.refreshTable(changes)
    got = [tuple(r) for r in spark.sql(f"{query} ORDER BY _commit_seq, id, {order}").collect()]
    assert got == expected
    since_1 = spark.sql(f"{query} WHERE _commit_seq > 1 ORDER BY id, {order}").collect()
    assert [tuple(r) for r in since_1] == [e for e in expected if e[0] > 1], "the change feed since commit 1"

    # Crash right after the copy: nothing is published, the table is as it was.
    monkeypatch.setenv(ENV, f"rollback.after_copy@{cfg.qualified_name}=raise")
    with pytest.raises(InjectedFaultError):
        rollback(cfg, 1, endpoint, by="test")
    assert lake.latest_commit().seq == 2 and _base_location(endpoint, cfg) == lake.data_location(v2)
    # Crash after the commit record: the decision is made, readers are not moved yet.
    monkeypatch.setenv(ENV, f"rollback.after_commit_record@{cfg.qualified_name}=raise")
    with pytest.raises(InjectedFaultError):
        rollback(cfg, 1, endpoint, by="test")
    rb = lake.latest_commit()
    assert (rb.seq, rb.parent_seq, rb.rollback and rb.rollback["to_seq"]) == (3, 2, 1)
    assert _base_location(endpoint, cfg) == lake.data_location(v2)
    # It describes version 1's rows, and claims no run counts of its own (no second quarantine entry).
    assert rb.stats["output_visible_rows"] == v1.stats["output_visible_rows"] == 3
    assert (rb.stats["rejected_rows"], rb.stats["increment_rows"], rb.files) == (0, 0, [])
    # Crash after the metastore moved: running it again finishes it (pointer, views, archived marker).
    monkeypatch.setenv(ENV, f"rollback.after_metastore_swap@{cfg.qualified_name}=raise")
    with pytest.raises(InjectedFaultError):
        rollback(cfg, 1, endpoint, by="test")
    assert _base_location(endpoint, cfg) == lake.data_location(rb)
    monkeypatch.delenv(ENV)
    done = rollback(cfg, 1, endpoint, by="test")
    assert (done.seq, done.resumed) == (3, True)
    assert lake.latest_commit().seq == 3, "a re-run finishes the rollback: it does not commit twice"
    assert lake.read_pointer()["seq"] == 3 and lake.is_archived(3)
    assert visible_names(spark, cfg) == {1: "ann", 2: "bob", 3: "cid"}, "readers see version 1's rows"
    assert _checksums(lake.layout.version_dir(v1.version)) == v1_files, "version 1's files were not written"
    assert TableLease(lake).current().released, "the lease is given back"

    # The change feed over the rollback undoes commit 2, made by commit 3.
    feed = change_feed(lake, 2, 3)
    assert _got(feed) == [
        (2, "update_before", "bobby", 3),
        (2, "update_after", "bob", 3),
        (3, "insert", "cid", 3),
        (4, "delete", "dan", 3),
    ]
    assert [v.rollback_of for v in kept_versions(lake)] == [None, None, None, 1]

    # A killed rollback holds the lease: the next one is refused until it is broken, then goes on.
    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT / "plugins"),
        ENV: f"rollback.after_commit_record@{cfg.qualified_name}=kill",
    }
    cli = [sys.executable, "-m", "cdc_compaction", "rollback", cfg.qualified_name, "--to", "2", "--yes"]
    cli += ["--registry-dir", str(reg), "--metastore", endpoint.uri]
    killed = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert killed.returncode < 0, killed.stderr
    with pytest.raises(ConcurrentRunError, match="lease break"):
        rollback(cfg, 2, endpoint, by="test")
    assert main(["lease", "break", cfg.qualified_name, "--registry-dir", str(reg)]) == 0
    env.pop(ENV)
    proc = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "finished the interrupted rollback" in proc.stdout
    assert visible_names(spark, cfg) == {1: "ann", 2: "bobby", 4: "dan"}

    # History moves forward from the rollback: the next compaction builds on it.
    _land(cfg, "increment_2026112202", [(5, "eve", "c", 3)])
    compact_once(rt, "r3")
    assert lake.latest_commit().seq == 5
    assert visible_names(spark, cfg) == {1: "ann", 2: "bobby", 4: "dan", 5: "eve"}
    # This publish wrote the rollbacks' changes too (3 and 4), and deleted commit 1's: its version is gone.
    spark.catalog.refreshTable(changes)
    seqs = [r[0] for r in spark.sql(f"SELECT DISTINCT _commit_seq FROM {changes} ORDER BY 1").collect()]
    assert seqs == [2, 3, 4, 5]
    undo = spark.sql(f"SELECT id, _change_type, full_name FROM {changes} WHERE _commit_seq = 3 ORDER BY id, {order}")
    assert [tuple(r) for r in undo.collect()] == [
        (2, "update_before", "bobby"),
        (2, "update_after", "bob"),
        (3, "insert", "cid"),
        (4, "delete", "dan"),
    ]
    new = spark.sql(f"SELECT id, _change_type, full_name, _commit_version FROM {changes} WHERE _commit_seq > 4")
    assert [tuple(r) for r in new.collect()] == [(5, "insert", "eve", 5)]

    with pytest.raises(TimeTravelError, match=r"version 1 is not kept \(kept: 2\.\.5"):
        rollback(cfg, 1, endpoint, by="test")

    # The increments compacted after the version rolled back to stay archived; re-landing one
    # from the archive (README, "Time travel and rollback") brings its changes back.
    rollback(cfg, 3, endpoint, by="test")
    assert visible_names(spark, cfg) == {1: "ann", 2: "bob", 3: "cid"}
    archived = Path(lake.layout.archive) / "c00000005" / "increment_2026112202"
    assert [p.name for p in archived.iterdir()] == ["part-00000.parquet"]
    assert not any(Path(lake.layout.incremental).iterdir()), "nothing went back to the landing area"
    shutil.copytree(archived, Path(lake.layout.incremental) / "increment_2026112202")
    compact_once(rt, "r4")
    assert visible_names(spark, cfg) == {1: "ann", 2: "bob", 3: "cid", 5: "eve"}


def test_the_feed_is_written_only_when_the_registry_asks(make_cfg) -> None:
    """change_feed defaults to off: a publish then neither reads the versions nor touches the metastore."""
    from types import SimpleNamespace

    cfg = make_cfg()
    assert cfg.change_feed is False
    # No lake and no metastore: an off feed must not reach for either.
    assert sync_changes(SimpleNamespace(cfg=cfg, lake=None), None, 2) == {"written": [], "dropped": [], "failed": {}}
