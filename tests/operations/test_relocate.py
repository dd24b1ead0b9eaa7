"""A lake copied or restored to another root works as itself (docs/data.md, "Copying or restoring a lake").

Commit records name files relative to the table's root, old records that named them absolutely
are read under the root they are found in, the Delta log names files relative to ``base/``, and
Iceberg metadata (absolute URIs by its spec) written under another root is written anew. An erase
on a copy removes the erased value from everything under the copy's root (format metadata and a
crashed Delta write's temporary included) and never reports success while a format still holds it.

The lakes here are laid out by hand as publish lays them out (Parquet files and commit records), so
no Spark runs; the formats are read back with delta-rs (``deltalake``) and pyiceberg, and every file
under the roots is searched by this file's own search (``test_erase_bytes.search`` plus the Avro
blocks decoded), never the erase module's scanner. Expected rows come from what the tests wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import STUDENT_COLUMNS, student_doc
from pipeline.test_formats_iceberg import _avro_payload

from cdc_compaction.core.exceptions import EraseError
from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.ownership import claim
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.operations.erase import erase, parse_predicate, verify
from cdc_compaction.pipeline import formats
from operations.test_erase_bytes import search

#: The erased person's name: nowhere else in the lake.
MARK = "Qz9RelocatedMarkW2"
WHERE = f"full_name = '{MARK}'"
#: Versions (id -> (full_name, region)); partitioned by ``region`` (identity), so erasing MARK empties no partition.
STATES: list[dict[int, tuple[str, str]]] = [
    {1: ("ann", "north"), 2: ("bob", "north"), 7: (MARK, "north")},
    {1: ("ann", "south"), 2: ("bob", "north"), 7: (MARK, "south"), 3: ("cid", "north")},
    {1: ("ann", "south"), 2: ("bobby", "south"), 7: (MARK, "south"), 3: ("cid", "north"), 4: ("dan", "north")},
]
PARTITIONED = {"partition_by": {"column": "region", "transform": "identity"}}


def cfg_at(root: Path, table: str, **overrides: Any) -> TableConfig:
    """The student table with a ``region`` column, under ``root``."""
    columns = [dict(c) for c in STUDENT_COLUMNS] + [{"name": "region", "type": "string"}]
    return parse_table(student_doc(root, table, columns=columns, **overrides))


def write_version(lake: Lake, seq: int, rows: dict[int, tuple[str, str]], absolute: bool = False) -> Commit:
    """Lay out version ``seq`` as publish does (one ``_cdc_partition=<op>`` directory per op) and commit it.

    ``absolute``: write the record as records were written before relocation (every path absolute),
    by hand, from the old record format."""
    version = f"v{seq:08d}-p{seq}-a1"
    data = Path(lake.layout.data_dir(version))
    ids = sorted(rows)
    partitions: dict[str, str] = {}
    index: dict[str, str] = {}
    for op in sorted({rows[i][1] for i in ids}):  # op: the partition value (the region)
        mine = [i for i in ids if rows[i][1] == op]
        d = data / f"_cdc_partition={op}"
        d.mkdir(parents=True)
        table = pa.table(
            {
                "id": pa.array(mine, pa.int32()),
                "full_name": pa.array([rows[i][0] for i in mine]),
                "op": pa.array(["u"] * len(mine)),
                "ts_ms": pa.array([seq * 100 + i for i in mine], pa.int64()),
                "region": pa.array([op] * len(mine)),
            }
        )
        pq.write_table(table, d / "part-0.parquet")
        partitions[op] = str(d)
        ix = Path(lake.layout.version_dir(version)) / "index" / f"_cdc_partition={op}"
        ix.mkdir(parents=True)
        pq.write_table(table.select(["id"]), ix / "part-0.parquet")
        index[op] = str(ix)
    Path(str(lake.layout.tombstones_dir(version))).mkdir(parents=True)
    inc = f"increment_202611220{seq}"
    landed = os.path.join(lake.layout.incremental, inc, "part-0.parquet")
    commit = Commit(
        seq=seq,
        version=version,
        plan_id=f"p{seq}",
        run_id="test",
        parent_seq=seq - 1,
        files=[{"increment": inc, "name": "part-0.parquet", "path": landed, "size": 1, "rows": 1}],
        increments=[inc],
        stats={"output_visible_rows": len(ids)},
        committed_at=f"2026-11-2{seq}T10:00:00+00:00",
        partitions=partitions,
        partition_rows={op: sum(1 for i in ids if rows[i][1] == op) for op in partitions},
        index=index,
    )
    if absolute:
        doc = {
            "seq": seq,
            "version": version,
            "plan_id": commit.plan_id,
            "run_id": "test",
            "parent_seq": seq - 1,
            "files": commit.files,
            "increments": commit.increments,
            "stats": commit.stats,
            "committed_at": commit.committed_at,
            "partitions": partitions,
            "partition_rows": commit.partition_rows,
            "index": index,
            "layout": 2,
        }
        Path(lake.layout.commits).mkdir(parents=True, exist_ok=True)
        Path(lake.layout.commit_path(seq)).write_text(json.dumps(doc, indent=1, sort_keys=True))
    else:
        assert lake.try_commit(commit)
    # Its run finished (an erase refuses a live commit that is not archived yet).
    Path(lake.layout.archived_marker(seq)).write_text("")
    return commit


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` and its content's SHA-256: the original root must stay exactly this."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def avro_hits(root: Path, marker: str) -> list[str]:
    """Iceberg manifests and manifest lists whose decoded (decompressed) blocks hold the marker."""
    return [str(p) for p in root.rglob("*.avro") if p.is_file() and marker.encode() in _avro_payload(p.read_bytes())]


def delta_pairs(root: str, version: int) -> list[tuple[int, str]]:
    dt = deltalake.DeltaTable(root, version=version)
    return sorted((r["id"], r["full_name"]) for r in dt.to_pyarrow_table(columns=["id", "full_name"]).to_pylist())


def iceberg_table(cfg: TableConfig, lake: Lake) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    from cdc_compaction.pipeline.formats import iceberg

    meta = Path(lake.layout.root) / "iceberg" / "metadata" / "catalog.db"
    catalog = SqlCatalog(f"cdc_{cfg.database}", uri=f"sqlite:///{meta}", warehouse=f"file://{lake.layout.root}")
    return catalog.load_table((cfg.database, iceberg.table_name(cfg)))


def iceberg_pairs(table: Any, seq: int) -> tuple[list[tuple[int, str]], list[str]]:
    """The rows of the snapshot carrying lake commit ``seq`` and the data files it names."""
    snap = next(
        s for s in table.snapshots() if (s.summary.additional_properties or {}).get("cdc.commit_seq") == str(seq)
    )
    scan = table.scan(snapshot_id=snap.snapshot_id)
    rows = sorted((r["id"], r["full_name"]) for r in scan.to_arrow().select(["id", "full_name"]).to_pylist())
    return rows, [t.file.file_path for t in scan.plan_files()]


def expected(seq: int, erased: bool) -> list[tuple[int, str]]:
    return sorted((i, name) for i, (name, _) in STATES[seq - 1].items() if not (erased and name == MARK))


def make_lake(tmp_path: Path, table: str, absolute_upto: int = 0, **overrides: Any) -> tuple[TableConfig, Lake]:
    """A partitioned lake with both formats and every state of :data:`STATES` published and synced."""
    cfg = cfg_at(tmp_path / "first", table, formats=["delta", "iceberg"], keep_versions=5, **PARTITIONED, **overrides)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    for seq, rows in enumerate(STATES, start=1):
        write_version(lake, seq, rows, absolute=seq <= absolute_upto)
        done = formats.sync_formats(formats.runtime_for(cfg, lake), seq)
        assert done["failed"] == {}, done
    return cfg, lake


def copy_of(tmp_path: Path, cfg: TableConfig) -> tuple[TableConfig, Lake]:
    """``cp -a`` of the whole table root to another root, and a registry entry pointing at the copy."""
    src = Path(Lake(cfg).layout.root)
    shutil.copytree(src, tmp_path / "copy" / cfg.table, symlinks=True)
    copied = cfg_at(
        tmp_path / "copy", cfg.table, formats=list(cfg.formats), keep_versions=cfg.keep_versions, **PARTITIONED
    )
    return copied, Lake(copied)


# ------------------------------------------------------------------------- records
def test_records_name_files_relative_and_old_absolute_records_are_read_under_the_root_they_are_in(
    tmp_path: Path,
) -> None:
    cfg = cfg_at(tmp_path / "first", "rec", **PARTITIONED)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    # Commit 1 as the old code wrote it (absolute paths), commit 2 by today's code.
    write_version(lake, 1, STATES[0], absolute=True)
    write_version(lake, 2, STATES[1])
    doc = json.loads(Path(lake.layout.commit_path(2)).read_text())
    named = [*doc["partitions"].values(), *doc["index"].values(), *(f["path"] for f in doc["files"])]
    assert all(not p.startswith("/") for p in named), f"a new record names an absolute path: {named}"
    assert doc["partitions"]["north"] == "base/v00000002-p2-a1/data/_cdc_partition=north"
    assert doc["files"][0]["path"] == "incremental/increment_2026112202/part-0.parquet"
    # Read back, every path is absolute under the root (the old record's as it was).
    for seq in (1, 2):
        commit = lake.read_commit(seq)
        assert commit is not None
        for p in [*commit.partitions.values(), *commit.index.values(), commit.files[0]["path"]]:
            assert p.startswith(lake.layout.root + "/"), p

    # Moved: both records name the copy's files, never the old root's.
    _, moved = copy_of(tmp_path, cfg)
    old_root = lake.layout.root
    for seq in (1, 2):
        commit = moved.read_commit(seq)
        assert commit is not None
        for p in [*commit.partitions.values(), *commit.index.values(), commit.files[0]["path"]]:
            assert p.startswith(moved.layout.root + "/") and not p.startswith(old_root + "/"), p
        assert commit.partitions == {
            op: os.path.join(moved.layout.root, f"base/v{seq:08d}-p{seq}-a1/data/_cdc_partition={op}")
            for op in commit.partitions
        }
    # The next commit on the copy names its files relative to the copy's root.
    write_version(moved, 3, STATES[2])
    doc = json.loads(Path(moved.layout.commit_path(3)).read_text())
    assert doc["partitions"] == {r: f"base/v00000003-p3-a1/data/_cdc_partition={r}" for r in ("north", "south")}
    # A root that itself holds a directory named like an area ("base") still maps by the table's area.
    assert moved.layout.abs("/old/base/lake/t/base/v00000001-p1-a1/data") == os.path.join(
        moved.layout.root, "base/v00000001-p1-a1/data"
    )
    assert moved.layout.rel(moved.layout.abs("archive/c00000001")) == "archive/c00000001"


def test_the_pointer_of_a_copied_lake_follows_its_root(tmp_path: Path) -> None:
    cfg = cfg_at(tmp_path / "first", "ptr", **PARTITIONED)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    lake.advance_pointer(write_version(lake, 1, STATES[0]))
    _, moved = copy_of(tmp_path, cfg)
    live = moved.latest_commit()
    assert moved.advance_pointer(live), "the copied pointer names the old root: rewritten for this one"
    pointer = json.loads(Path(moved.layout.pointer).read_text())
    assert pointer["seq"] == 1 and pointer["location"].startswith(moved.layout.root + "/")
    assert all(p.startswith(moved.layout.root + "/") for p in pointer["partitions"].values())
    assert not moved.advance_pointer(live), "in place already: nothing to do"


def test_a_plan_made_under_the_old_root_is_refused_on_the_copy_until_committed(tmp_path: Path) -> None:
    from cdc_compaction.core.exceptions import PlanError
    from cdc_compaction.pipeline.runtime import load_plan

    cfg = cfg_at(tmp_path / "first", "pl", **PARTITIONED)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    write_version(lake, 1, STATES[0])
    plan = {"plan_id": "p2", "seq": 2, "output_location": lake.layout.version_dir("v00000002-p2")}
    Path(lake.layout.plans).mkdir(parents=True)
    Path(lake.layout.plan_path("p2")).write_text(json.dumps(plan))
    copied, moved = copy_of(tmp_path, cfg)
    rt = formats.runtime_for(copied, moved)
    with pytest.raises(PlanError) as err:
        load_plan(rt, moved.layout.plan_path("p2"))
    assert copied.qualified_name in str(err.value) and lake.layout.root in str(err.value)
    assert "clear the run's plan task" in str(err.value)
    # Under its own root it is read as it is; once committed, the steps after publish read it on the copy too.
    assert load_plan(formats.runtime_for(cfg, lake), lake.layout.plan_path("p2"))["seq"] == 2
    write_version(moved, 2, STATES[1])
    assert load_plan(rt, moved.layout.plan_path("p2"))["plan_id"] == "p2"


# ------------------------------------------------------------------------- a copied lake, both formats
@pytest.mark.parametrize("absolute_upto", [0, 3], ids=["relative-records", "old-absolute-records"])
def test_erase_verify_and_time_travel_on_a_copy_with_both_formats(tmp_path: Path, absolute_upto: int) -> None:
    from cdc_compaction.pipeline.formats import delta

    cfg, lake = make_lake(tmp_path, "cp", absolute_upto=absolute_upto)
    original = Path(lake.layout.root)
    before = tree_digest(original)
    copied, moved = copy_of(tmp_path, cfg)
    root = Path(moved.layout.root)
    assert search(root, MARK), "the copy holds the value before the erase"

    audit = erase(copied, WHERE, actor="test")
    assert audit["verified"]["matching_files"] == {} and audit["verified"]["naming_files"] == 0
    found = verify(moved, parse_predicate(copied, WHERE))
    assert found["matching"] == {} and found["naming"] == [], found

    # Nothing under the copy holds the value: path names, Parquet cells and statistics, raw bytes, Avro blocks.
    assert search(root, MARK) == []
    assert avro_hits(root, MARK) == []
    # Every kept version, read by delta-rs and pyiceberg on the copy: its rows without the erased one, its
    # files the copy's.
    live = moved.latest_commit().seq
    assert live == 4
    table = iceberg_table(copied, moved)
    for seq in range(1, live + 1):
        want = expected(min(seq, 3), erased=True)
        assert delta_pairs(delta.table_root(moved), seq) == want, seq
        rows, files = iceberg_pairs(table, seq)
        assert rows == want, seq
        assert files and all(f.startswith(f"file://{root}/") for f in files), files
    assert str(table.location()).removeprefix("file://") == str(root / "iceberg")
    # The original root is untouched, byte for byte.
    assert tree_digest(original) == before


def test_a_failed_format_rebuild_fails_the_erase_and_the_next_erase_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdc_compaction.job.faults import ENV

    cfg, lake = make_lake(tmp_path, "ft")
    monkeypatch.setenv(ENV, f"formats.before_delta_commit@{cfg.qualified_name}=raise")
    with pytest.raises(EraseError) as err:
        erase(cfg, WHERE, actor="test")
    text = str(err.value)
    assert cfg.qualified_name in text and "delta" in text and "_delta_log" in text and "run the same erase" in text
    # What the failed format held is gone with it: no copy of the value stays under the root but the
    # unfinished erase's journal (it keeps the predicate until the erase finishes: docs/data.md).
    journal = os.path.join(lake.layout.root, "_cdc", "erase")
    assert [h for h in search(Path(lake.layout.root), MARK) if not h.startswith(journal + "/")] == []
    assert not Path(lake.layout.root, "base", "_delta_log").exists()
    monkeypatch.delenv(ENV)
    erase(cfg, WHERE, actor="test")
    assert search(Path(lake.layout.root), MARK) == [] and avro_hits(Path(lake.layout.root), MARK) == []
    from cdc_compaction.pipeline.formats import delta

    assert delta_pairs(delta.table_root(lake), lake.latest_commit().seq) == expected(3, erased=True)


def test_an_erase_that_crashed_before_the_copy_finishes_on_the_copy_and_never_touches_the_original(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdc_compaction.job.faults import ENV, InjectedFaultError

    cfg, lake = make_lake(tmp_path, "jr")
    monkeypatch.setenv(ENV, f"erase.after_commit_record@{cfg.qualified_name}=raise")
    with pytest.raises(InjectedFaultError):
        erase(cfg, WHERE, actor="test")
    monkeypatch.delenv(ENV)
    journals = list(Path(lake.layout.root, "_cdc", "erase").glob("e*.json"))
    assert journals and str(lake.layout.root) in journals[0].read_text(), "the journal names the original's files"
    before = tree_digest(Path(lake.layout.root))
    # The lease of the crashed erase went with its process: released here as `lease break` would.
    copied, moved = copy_of(tmp_path, cfg)
    from cdc_compaction.core.lake import TableLease

    TableLease(moved).break_("test")
    erase(copied, WHERE, actor="test")
    root = Path(moved.layout.root)
    assert search(root, MARK) == [] and avro_hits(root, MARK) == []
    assert tree_digest(Path(lake.layout.root)) == before, "the copy's roll-forward touched the original"


def test_a_crashed_delta_temporary_holding_the_value_is_removed_and_verify_reads_format_files(
    tmp_path: Path,
) -> None:
    from cdc_compaction.pipeline.formats import delta

    cfg, lake = make_lake(tmp_path, "tmpf")
    log_dir = Path(delta.metadata_root(lake))
    # A crashed Delta commit: its hidden temporary, with the value in an add's stats.
    planted = log_dir / ".00000000000000000003.json.abcd.tmp"
    stats = {"numRecords": 1, "minValues": {"full_name": MARK}, "maxValues": {"full_name": MARK}}
    planted.write_text(json.dumps({"add": {"path": "x.parquet", "stats": json.dumps(stats)}}) + "\n")
    pred = parse_predicate(cfg, WHERE)
    found = verify(lake, pred)
    assert str(planted) in found["naming"], "verify reads the format's hidden temporaries"
    # The Delta log and the Iceberg manifests name the value before the erase: verify reports them.
    assert any(p.startswith(str(log_dir)) and p.endswith(".json") for p in found["naming"]), found["naming"]
    assert any("/iceberg/metadata/" in p and p.endswith(".avro") for p in found["naming"]), found["naming"]

    erase(cfg, WHERE, actor="test")
    assert not planted.exists()
    assert verify(lake, pred)["naming"] == []
    assert search(Path(lake.layout.root), MARK) == []
    # Only the log's own temporaries go: another hidden file in the log that is not one stays (and is named).
    other = log_dir / ".notes.tmp"
    other.write_text(MARK)
    assert str(other) in verify(lake, pred)["naming"]
    assert delta.is_temporary(planted.name) and not delta.is_temporary(other.name)


def test_a_copys_stale_iceberg_metadata_is_written_anew_for_its_root(tmp_path: Path) -> None:
    """A copy's Iceberg metadata names the original root's files: the first sync on the copy writes it anew."""
    from cdc_compaction.pipeline.formats import iceberg

    cfg, lake = make_lake(tmp_path, "ice")
    before = tree_digest(Path(lake.layout.root))
    copied, moved = copy_of(tmp_path, cfg)
    rt = formats.runtime_for(copied, moved)
    catalog = iceberg._catalog(rt, moved)
    assert iceberg.is_stale(moved, iceberg._load(catalog, copied)), "the copied catalog names the old root"
    done = formats.sync_formats(rt)
    assert done["failed"] == {}, done
    table = iceberg_table(copied, moved)
    assert not iceberg.is_stale(moved, table)
    for seq in (1, 2, 3):
        rows, files = iceberg_pairs(table, seq)
        assert rows == expected(seq, erased=False)
        assert all(f.startswith(f"file://{moved.layout.root}/") for f in files), files
    assert tree_digest(Path(lake.layout.root)) == before


# ------------------------------------------------------------------------- the real pipeline on a copy
REGIONAL = {"id": pa.int32(), "full_name": pa.string(), "op": pa.string(), "ts_ms": pa.int64(), "region": pa.string()}


def _land(cfg: TableConfig, increment: str, rows: list[tuple[int, str, str, int, str]]) -> None:
    target = Path(Lake(cfg).layout.incremental) / increment
    target.mkdir(parents=True)
    cols = {name: pa.array([r[i] for r in rows], t) for i, (name, t) in enumerate(REGIONAL.items())}
    pq.write_table(pa.table(cols), target / "part-00000.parquet")


def _version_pairs(commit: Commit) -> list[tuple[int, str]]:
    """A kept version's visible rows, read from the files its record names (as `versions` tells a reader)."""
    out = []
    for loc in (commit.partitions or {}).values():
        for f in sorted(Path(loc).glob("*.parquet")):
            out += [(r["id"], r["full_name"]) for r in pq.read_table(f, columns=["id", "full_name"]).to_pylist()]
    return sorted(out)


@pytest.mark.spark
@pytest.mark.metastore
def test_a_copied_lake_compacts_erases_and_travels_as_itself_through_the_real_steps(
    tmp_path: Path, runtime: Any, spark: Any
) -> None:
    """Compact on the original, ``cp -a`` the root, point the registry at the copy, compact a new increment
    there, erase a person there, verify, travel to every kept version (delta-rs, pyiceberg, the records):
    the copy holds the value nowhere, and the original root is untouched."""
    from conftest import compact_once, visible_names

    from cdc_compaction.operations.travel import kept_commit
    from cdc_compaction.pipeline.formats import delta
    from cdc_compaction.pipeline.tables import ensure_tables

    table = f"reloc_{os.getpid()}"
    extra = {"formats": ["delta", "iceberg"], "keep_versions": 4, **PARTITIONED}
    cfg = cfg_at(tmp_path / "first", table, **extra)
    rt = runtime(cfg)
    ensure_tables(rt)
    _land(
        cfg,
        "increment_2026112200",
        [(1, "ann", "c", 1, "north"), (2, "bob", "c", 1, "south"), (7, MARK, "c", 1, "west")],
    )
    compact_once(rt, "r1")
    _land(cfg, "increment_2026112201", [(2, "bobby", "u", 2, "south"), (3, "cid", "c", 2, "north")])
    compact_once(rt, "r2")
    original = Path(rt.lake.layout.root)
    before = tree_digest(original)

    shutil.copytree(original, tmp_path / "copy" / table, symlinks=True)
    copied = cfg_at(tmp_path / "copy", table, **extra)
    crt = runtime(copied)
    lake = crt.lake
    root = Path(lake.layout.root)
    ensure_tables(crt)  # check_storage_root follows the moved tree; the metastore is moved on by the plan
    _land(copied, "increment_2026112202", [(4, "dan", "c", 3, "north"), (1, "ann", "d", 3, "north")])
    compact_once(crt, "r3")
    live = lake.latest_commit()
    assert live.seq == 3
    assert all(loc.startswith(f"{root}/") for loc in live.partitions.values()), live.partitions
    assert visible_names(spark, copied) == {2: "bobby", 3: "cid", 4: "dan", 7: MARK}
    doc = json.loads(Path(lake.layout.commit_path(3)).read_text())
    assert all(not p.startswith("/") for p in doc["partitions"].values()), doc["partitions"]

    erase(copied, WHERE, actor="test", metastore=crt.metastore)
    found = verify(lake, parse_predicate(copied, WHERE))
    assert found["matching"] == {} and found["naming"] == [], found
    assert search(root, MARK) == [] and avro_hits(root, MARK) == []
    # The erased person's partition is gone from the metastore too (the next plan moves the base on).
    assert visible_names(spark, copied) == {2: "bobby", 3: "cid", 4: "dan"}

    # Every kept version on the copy, by its record, by delta-rs and by pyiceberg: without the erased row.
    want = {
        1: [(1, "ann"), (2, "bob")],
        2: [(1, "ann"), (2, "bobby"), (3, "cid")],
        3: [(2, "bobby"), (3, "cid"), (4, "dan")],
        4: [(2, "bobby"), (3, "cid"), (4, "dan")],
    }
    assert lake.latest_commit().seq == 4
    itable = iceberg_table(copied, lake)
    for seq, rows in want.items():
        commit = kept_commit(lake, seq)
        assert _version_pairs(commit) == rows, seq
        assert delta_pairs(delta.table_root(lake), seq) == rows, seq
        got, files = iceberg_pairs(itable, seq)
        assert got == rows and all(f.startswith(f"file://{root}/") for f in files), (seq, files)
    assert tree_digest(original) == before, "the original root changed"
