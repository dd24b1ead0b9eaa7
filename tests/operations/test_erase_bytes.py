"""Erase leaves no byte of an erased value anywhere under the table's root (README, "Erasing personal data").

A unique marker string is put in the rows to be erased (and, for the partitioned table, it is
their partition value), compactions spread it into every place a table keeps data (versions, the
archive, the key index, the change feed, the quarantine, a rebuild's replay, hostile landing
files), the erase runs, and then everything under the root is searched -- with this file's own
search (``os.walk`` and pyarrow), never the erase module's scanner: path names, the decoded
cells and footer of every Parquet file (whatever its name), and the raw bytes of every other file.
The metastore's partition list is searched too.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import compact_once, student_doc

from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.ownership import claim
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.devtools.conformance import land
from cdc_compaction.operations.erase import erase, parse_predicate, verify
from cdc_compaction.pipeline.tables import ensure_tables

#: The erased person's name: it occurs nowhere else (not in any name, path or record of the lake).
MARK = "Zq7xErasedMarkerK4"
WHERE = f"full_name = '{MARK}'"
STUDENT = pa.schema([("id", pa.int32()), ("full_name", pa.string()), ("op", pa.string()), ("ts_ms", pa.int64())])


# ------------------------------------------------------------------------- the search (independent)
def _is_parquet(data: bytes) -> bool:
    return len(data) >= 12 and data[:4] == b"PAR1" and data[-4:] == b"PAR1"


def _parquet_hits(path: str, marker: str) -> list[str]:
    """Where a Parquet file holds the marker: decoded cells, footer metadata and column statistics."""
    f = pq.ParquetFile(path)  # the file alone: no partition columns from its path
    hits = []
    table = f.read()
    for name in table.column_names:
        if marker in name:
            hits.append(f"{path}: column name {name}")
        if any(marker in str(v) for v in table.column(name).to_pylist() if v is not None):
            hits.append(f"{path}: a value of column {name}")
    meta = f.metadata
    for k, v in (meta.metadata or {}).items():
        if marker.encode() in k or marker.encode() in v:
            hits.append(f"{path}: footer key-value metadata")
    for rg in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            stats = meta.row_group(rg).column(c).statistics
            if stats is not None and stats.has_min_max and marker in f"{stats.min!s}{stats.max!s}":
                hits.append(f"{path}: statistics of row group {rg}")
    return hits


def search(root: Path, marker: str) -> list[str]:
    """Every place under ``root`` that holds ``marker``: path names, Parquet content, raw bytes of the rest."""
    hits: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if marker in name:
                hits.append(f"{os.path.join(dirpath, name)}: path name")
        for name in filenames:
            path = os.path.join(dirpath, name)
            data = Path(path).read_bytes()
            if _is_parquet(data):
                hits += _parquet_hits(path, marker)
            elif marker.encode() in data:
                hits.append(f"{path}: raw bytes")
    return hits


def metastore_partitions(rt: Any) -> dict[str, str]:
    from cdc_compaction.core.sql import table_names
    from cdc_compaction.integrations.metastore import connect

    with connect(rt.metastore) as ms:
        return dict(ms.partitions(rt.cfg.database, table_names(rt.cfg)["base_table"]))


def _partition_holding(rt: Any, marker: str) -> str:
    """The live version's partition (its name in the commit record) whose rows hold ``marker``."""
    partitions = rt.lake.latest_commit().partitions or {}
    (name,) = [
        value
        for value, loc in partitions.items()
        if marker in pq.read_table(loc, columns=["full_name"]).column(0).to_pylist()
    ]
    return name


def write(path: str, rows: list[dict[str, Any]], schema: pa.Schema = STUDENT) -> None:
    os.makedirs(posixpath.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def rows(*items: tuple[int | None, str, str, int]) -> list[dict[str, Any]]:
    return [{"id": i, "full_name": n, "op": op, "ts_ms": ts} for i, n, op, ts in items]


# ------------------------------------------------------------------------- without Spark
def _committed_lake(root: Path) -> Lake:
    """A table with one (empty) committed, archived version: what an erase needs to run."""
    cfg = parse_table(student_doc(root, "people"))
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    version = "v00000001-plan1-a"
    write(posixpath.join(lake.layout.data_dir(version), "part-0.parquet"), rows((1, "Alice", "c", 1)))
    commit = Commit(1, version, "plan1", "run1", 0, [], ["increment_2026112200"], {"output_visible_rows": 1})
    assert lake.try_commit(commit)
    lake.advance_pointer(commit)
    lake.storage.write_text(lake.layout.archived_marker(1), "")
    return lake


def _erase_landed(tmp_path: Path, landed: dict[str, list[dict[str, Any]]]) -> None:
    """Write the files, erase WHERE, and check each file keeps exactly its other rows, and no byte of MARK remains."""
    lake = _committed_lake(tmp_path / "lake")
    for rel, content in landed.items():
        write(posixpath.join(lake.layout.root, rel), content)

    erase(lake.cfg, WHERE, actor="test")

    for rel, content in landed.items():
        kept = pq.ParquetFile(posixpath.join(lake.layout.root, rel)).read().to_pylist()
        assert kept == [r for r in content if r["full_name"] != MARK], rel
    assert search(tmp_path / "lake", MARK) == []


def test_parquet_named_events_json_is_erased(tmp_path: Path) -> None:
    """A sink's Parquet named ``events.json`` is data to the plan (its rule looks at no suffix): the erase
    must filter it too -- pending and archived -- or the next compaction brings the erased row back."""
    _erase_landed(
        tmp_path,
        {
            "incremental/increment_2026112201/events.json": rows((2, MARK, "c", 2), (3, "Bob", "c", 2)),
            "archive/c00000001/increment_2026112200/events.json": rows((7, MARK, "c", 1)),
        },
    )


def test_hidden_and_nested_landing_files_are_erased(tmp_path: Path) -> None:
    """Hidden (a writer's temporary) and nested landed files hold rows too, though no plan takes them yet."""
    _erase_landed(
        tmp_path,
        {
            "incremental/increment_2026112201/.hidden.parquet": rows((4, MARK, "c", 2)),
            "incremental/increment_2026112201/nested/deeper/part-0": rows((5, MARK, "c", 2), (6, "Carol", "c", 2)),
        },
    )


def test_a_rebuild_replay_left_behind_is_erased_and_verified(tmp_path: Path) -> None:
    """``rebuild --verify-only`` leaves its replay under ``rebuild/<id>/``: rows like any version's."""
    lake = _committed_lake(tmp_path / "lake")
    replay = posixpath.join(lake.layout.root, "rebuild", "abc123", "v00000001-plan1", "data", "part-0.parquet")
    write(replay, rows((1, "Alice", "c", 1), (2, MARK, "c", 1)))
    pred = parse_predicate(lake.cfg, WHERE)
    assert replay in verify(lake, pred)["matching"]  # --verify looks there

    audit = erase(lake.cfg, WHERE, actor="test")

    assert audit["rows_removed"]["rebuild"] == 1
    assert pq.ParquetFile(replay).read().to_pylist() == rows((1, "Alice", "c", 1))
    assert search(tmp_path / "lake", MARK) == []


def test_a_file_erase_cannot_read_is_refused_by_name(tmp_path: Path) -> None:
    """A non-empty file under the root that is neither Parquet nor a JSON record may hold rows: the erase
    refuses, naming it, and changes nothing; --verify reports it too."""
    from cdc_compaction.core.exceptions import EraseError

    lake = _committed_lake(tmp_path / "lake")
    stray = Path(lake.layout.root, "exports", "people.csv")
    stray.parent.mkdir(parents=True)
    stray.write_text(f"id,full_name\n2,{MARK}\n")
    pending = posixpath.join(lake.layout.incremental, "increment_2026112201", "p.parquet")
    write(pending, rows((2, MARK, "c", 2)))

    with pytest.raises(EraseError, match=r"people\.csv.*Nothing was erased"):
        erase(lake.cfg, WHERE, actor="test")
    assert pq.ParquetFile(pending).read().num_rows == 1
    found = verify(lake, parse_predicate(lake.cfg, WHERE))
    assert str(stray) in found["unhandled"] and str(stray) in found["naming"]


@pytest.mark.metastore
def test_a_partition_value_whose_rows_are_all_erased_vanishes(tmp_path: Path, endpoint: Any) -> None:
    """Identity-partitioned on the erased column: its partition directories (data and key index, live and
    kept versions) go, and so does every record naming it (commit records, plans, the pointer, stats); the
    values that keep rows stay.  A value only stale records name goes too.  A mixed lake: version 1's
    directories are named as before issue 37 (``_cdc_partition=<value>``), version 2's as since
    (``cdc_partition=<value>``)."""
    import json

    cfg = parse_table(
        student_doc(
            tmp_path / "lake",
            f"pp_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}",
            partition_by={"column": "full_name", "transform": "identity"},
        )
    )
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    v1, v2 = "v00000001-plan1-a", "v00000002-plan2-a"

    def pdir(version: str, value: str, kind: str = "data") -> str:
        prefix = "_cdc_partition=" if version == v1 else "cdc_partition="
        return posixpath.join(lake.layout.version_dir(version), kind, f"{prefix}{value}")

    content = {
        pdir(v1, "Alice"): rows((1, "Alice", "c", 1)),
        pdir(v1, MARK): rows((2, MARK, "c", 1)),
        pdir(v2, MARK): rows((2, MARK, "u", 2), (4, MARK, "c", 2)),
        pdir(v2, "Bob"): rows((3, "Bob", "c", 2)),
    }
    for d, r in content.items():
        write(posixpath.join(d, "part-0.parquet"), r)
    keys = pa.schema([("id", pa.int32())])
    for version, value, ids in ((v1, "Alice", [1]), (v1, MARK, [2]), (v2, MARK, [2, 4]), (v2, "Bob", [3])):
        write(posixpath.join(pdir(version, value, "index"), "part-0.parquet"), [{"id": i} for i in ids], keys)
    maps = {
        1: {"Alice": pdir(v1, "Alice"), MARK: pdir(v1, MARK)},
        2: {"Alice": pdir(v1, "Alice"), MARK: pdir(v2, MARK), "Bob": pdir(v2, "Bob")},
    }
    for seq, version in ((1, v1), (2, v2)):
        os.makedirs(lake.layout.tombstones_dir(version) or "", exist_ok=True)
        stats = {
            "output_rows": 3,
            "output_visible_rows": 3,
            "partitions": maps[seq],
            "partition_rows": dict.fromkeys(maps[seq], 1),
            "partitions_touched": sorted(maps[seq]),
            "output_files": [
                {"name": f"data/{posixpath.basename(pdir(version, v))}/part-0.parquet", "size": 1} for v in maps[seq]
            ],
        }
        Path(lake.layout.version_dir(version), "_cdc_stats.json").write_text(json.dumps(stats))
        commit = Commit(
            seq, version, f"plan{seq}", f"run{seq}", seq - 1, [], [f"increment_202611220{seq}"], stats,
            partitions=maps[seq], partition_rows=dict.fromkeys(maps[seq], 1),
            index={v: d.replace("/data/", "/index/") for v, d in maps[seq].items()},
        )  # fmt: skip
        assert lake.try_commit(commit)
        lake.advance_pointer(commit)
        lake.storage.write_text(lake.layout.archived_marker(seq), "")
        plan = {"plan_id": f"plan{seq}", "base_partitions": maps.get(seq - 1, {})}
        lake.storage.write_text(lake.layout.plan_path(f"plan{seq}"), json.dumps(plan))
    assert search(tmp_path / "lake", MARK)

    erase(cfg, WHERE, actor="test", metastore=endpoint)

    assert search(tmp_path / "lake", MARK) == []
    for value in ("Alice", "Bob"):  # they keep rows: their directories and names stay
        assert Path(maps[2][value], "part-0.parquet").exists()
    assert not Path(pdir(v1, MARK)).exists() and not Path(pdir(v1, MARK, "index")).exists()
    assert not Path(pdir(v2, MARK)).exists() and not Path(pdir(v2, MARK, "index")).exists()
    live = lake.latest_commit()
    assert live.seq == 3 and sorted(live.partitions or {}) == ["Alice", "Bob"]
    first = lake.read_commit(1)
    assert first is not None and first.partitions == {"Alice": pdir(v1, "Alice")} and first.seq == 1
    assert sorted(json.loads(Path(lake.layout.pointer).read_text())["partitions"]) == ["Alice", "Bob"]

    # A record naming the value with nothing left to erase (its directories are gone): it goes too.
    stale = lake.layout.plan_path("plan0")
    lake.storage.write_text(stale, json.dumps({"plan_id": "plan0", "base_partitions": {MARK: "/gone", "Bob": "/b"}}))
    erase(cfg, WHERE, actor="test", metastore=endpoint)
    assert search(tmp_path / "lake", MARK) == []
    assert json.loads(Path(stale).read_text()) == {"plan_id": "plan0", "base_partitions": {"Bob": "/b"}}


# ------------------------------------------------------------------------- with real compactions
def _hostile_landing(cfg: TableConfig, increment: str) -> None:
    """A complete increment with a Parquet file named events.json, and files no plan takes yet:
    a hidden one (the increment waits for it) in another increment, one in a nested directory."""
    land(cfg, increment, [rows((30, MARK, "c", 30))])
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    d = posixpath.join(lake.layout.incremental, increment)
    write(posixpath.join(d, "events.json"), rows((31, MARK, "c", 31), (32, "Dora", "c", 31)))
    write(posixpath.join(d, "nested", "part-0.parquet"), rows((33, MARK, "c", 33)))
    waiting = posixpath.join(lake.layout.incremental, "increment_2026112209")
    write(posixpath.join(waiting, ".part-0.parquet"), rows((34, MARK, "c", 34)))


@pytest.mark.spark
@pytest.mark.metastore
@pytest.mark.parametrize("partitioned", [False, True], ids=["keyed", "partitioned"])
def test_no_byte_of_an_erased_value_remains_cdc(
    make_cfg: Callable[..., TableConfig], runtime: Any, partitioned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keyed cdc tables (identity-partitioned on the erased column, or not) with the change feed, the
    quarantine (a refused row and a refused file), a rebuild's replay and hostile landing files."""
    from cdc_compaction.pipeline.rebuild import rebuild

    extra: dict[str, Any] = {"change_feed": True, "on_bad_file": "quarantine"}
    if partitioned:
        extra["partition_by"] = {"column": "full_name", "transform": "identity"}
    rt = runtime(make_cfg(**extra))
    ensure_tables(rt)
    root = Path(rt.lake.layout.root)

    land(rt.cfg, "increment_2026112200", [rows((1, "Alice", "c", 1), (2, MARK, "c", 1), (3, "Bob", "c", 1))])
    compact_once(rt, "run-1")
    # An update of the marked row, a new marked row, a refused row (no key) and a refused file.
    land(rt.cfg, "increment_2026112201", [rows((2, MARK, "u", 2), (4, MARK, "c", 2), (None, MARK, "c", 2))])
    bad = pa.schema([("id", pa.int32()), ("full_name", pa.string()), ("op", pa.string()), ("ts_ms", pa.string())])
    write(
        posixpath.join(rt.lake.layout.incremental, "increment_2026112201", "bad.parquet"),
        [{"id": 5, "full_name": MARK, "op": "c", "ts_ms": "late"}],
        bad,
    )
    _hostile_landing(rt.cfg, "increment_2026112202")
    compact_once(rt, "run-2")
    # Everything the hostile increment held that the plan reads was compacted (events.json too).
    assert rt.lake.latest_commit().seq == 2
    report = rebuild(rt)  # verify only: its replay stays under rebuild/<id>/
    assert report.published_seq is None
    land(rt.cfg, "increment_2026112203", [rows((6, MARK, "c", 6), (7, "Eve", "c", 6))])  # pending
    spread = search(root, MARK)
    for where in ("/base/", "/archive/", "/changes/", "/quarantine/rows/", "/quarantine/files/", "/rebuild/"):
        assert any(where in h for h in spread), (where, spread)
    named = ""
    if partitioned:
        # The partition's name encodes the value (docs/partitioned.md, "Partition directory names"): it
        # names the person as much as the value does. Found by the rows it holds, not by the encoding.
        named = _partition_holding(rt, MARK)
        spread_named = search(root, named)
        assert any("/index/cdc_partition=" in h for h in spread_named), spread_named
        assert named in metastore_partitions(rt), metastore_partitions(rt)

    if partitioned:
        # A crash after the decision, before the partitions were dropped: the next erase finishes it.
        from cdc_compaction.job.faults import InjectedFaultError

        monkeypatch.setenv("CDC_FAULTS", "erase.after_first_swap=raise")
        with pytest.raises(InjectedFaultError):
            erase(rt.cfg, WHERE, actor="test", metastore=rt.metastore)
        monkeypatch.delenv("CDC_FAULTS")
    erase(rt.cfg, WHERE, actor="test", metastore=rt.metastore)

    assert search(root, MARK) == []
    assert not named or search(root, named) == []
    assert not [v for v in metastore_partitions(rt) if MARK in v or (named and named in v)]
    # The next compaction builds on the erase and brings nothing back.
    compact_once(rt, "run-3")
    assert search(root, MARK) == []
    assert not named or search(root, named) == []


@pytest.mark.spark
@pytest.mark.metastore
def test_no_byte_of_an_erased_value_remains_keyless(tmp_path: Path, runtime: Any) -> None:
    """A keyless table: the erased value also sits in before-images of later events."""
    cfg = parse_table(
        {
            "mode": "keyless",
            "database": "tests",
            "table": f"kl_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}",
            "columns": [
                {"name": "full_name", "type": "string"},
                {"name": "visits", "type": "int"},
                {"name": "_before_full_name", "type": "string"},
                {"name": "_before_visits", "type": "int"},
                {"name": "op", "type": "string"},
                {"name": "lsn", "type": "bigint"},
            ],
            "order_by": ["lsn"],
            "change_feed": True,
            "storage_root": str(tmp_path / "lake" / "visits"),
            "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        }
    )
    rt = runtime(cfg)
    ensure_tables(rt)

    def event(name: str | None, before: str | None, op: str, lsn: int) -> dict[str, Any]:
        return {
            "full_name": name,
            "visits": 1 if name else None,
            "_before_full_name": before,
            "_before_visits": 1 if before else None,
            "op": op,
            "lsn": lsn,
        }

    land(cfg, "increment_2026112200", [[event(MARK, None, "c", 1), event("Al", None, "c", 2)]])
    compact_once(rt, "run-1")
    land(cfg, "increment_2026112201", [[event("Mo", MARK, "u", 3), event(MARK, None, "c", 4)]])
    compact_once(rt, "run-2")
    land(cfg, "increment_2026112202", [[event(MARK, None, "c", 5), event("Cy", None, "c", 6)]])
    root = Path(rt.lake.layout.root)
    assert any("/base/" in h for h in search(root, MARK)) and any("/archive/" in h for h in search(root, MARK))

    erase(cfg, WHERE, actor="test", metastore=rt.metastore)

    assert search(root, MARK) == []
    compact_once(rt, "run-3")
    assert search(root, MARK) == []


@pytest.mark.spark
@pytest.mark.metastore
def test_no_byte_of_an_erased_value_remains_snapshot(
    make_snapshot_cfg: Callable[..., TableConfig], runtime: Any
) -> None:
    """A snapshot table: the erased value is in the current table, the history and every snapshot."""
    rt = runtime(make_snapshot_cfg())
    ensure_tables(rt)

    def snap(*items: tuple[int, str]) -> list[dict[str, Any]]:
        return [{"id": i, "full_name": n} for i, n in items]

    land(rt.cfg, "increment_2026112200", [snap((1, "Alice"), (2, MARK))])
    compact_once(rt, "run-1")
    land(rt.cfg, "increment_2026112201", [snap((1, "Alice"), (2, MARK), (3, "Bob"))])
    compact_once(rt, "run-2")
    land(rt.cfg, "increment_2026112202", [snap((1, "Alice"), (2, MARK), (3, "Bob"), (4, "Cy"))])
    root = Path(rt.lake.layout.root)
    assert any("/base/" in h for h in search(root, MARK)) and any("/archive/" in h for h in search(root, MARK))

    erase(rt.cfg, WHERE, actor="test", metastore=rt.metastore)

    assert search(root, MARK) == []
    compact_once(rt, "run-3")
    assert search(root, MARK) == []
