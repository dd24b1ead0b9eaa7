"""Every published version as an Iceberg snapshot over the same files (``cdc_compaction.pipeline.formats.iceberg``).

Real lakes made by the real pipeline (the task functions in-process, the compaction job in the
session's Spark); the Iceberg table is read back by two engines that know nothing of the
project -- pyiceberg's scan and ``polars.scan_iceberg`` -- and compared with what the contract
says the base holds: the scenario's expected rows, or the live version's Parquet files read
plainly (the tombstones are in a directory of their own and must never be read).
"""

from __future__ import annotations

import io
import json
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.settings import PROJECT_ROOT, MetastoreEndpoint
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools.local_services import Hive4Metastore, free_port
from cdc_compaction.pipeline.formats import iceberg
from cdc_compaction.pipeline.retention import kept_seqs
from cdc_compaction.pipeline.runtime import Runtime

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


SCENARIOS = PROJECT_ROOT.parent / "shared" / "conformance"
#: (scenario, partitioned): updates, a delete and a re-insert over two runs; a late event against a tombstone
#: over three runs, partitioned (keys move between partitions, untouched ones are reused by reference).
CHOSEN = [("delete_then_reinsert", False), ("late_update_for_deleted_key", True)]


def kept(lake: Lake) -> list[Commit]:
    live = lake.latest_commit().seq
    return [c for s in kept_seqs(live, lake.cfg.keep_versions) if s > 0 and (c := lake.read_commit(s))]


def iceberg_rows(table: Any, columns: list[str], snapshot_id: int | None = None) -> list[dict[str, Any]]:
    scan = table.scan(snapshot_id=snapshot_id) if snapshot_id is not None else table.scan()
    return scan.to_arrow().select(columns).to_pylist()


def polars_rows(table: Any, columns: list[str]) -> list[dict[str, Any]]:
    return pl.scan_iceberg(table).select(columns).collect().to_dicts()


def version_rows(lake: Lake, commit: Commit, columns: list[str]) -> list[dict[str, Any]]:
    """The visible rows of ``commit`` read from its data files alone, as a reader without Iceberg would."""
    dirs = list(commit.partitions.values()) if commit.partitions is not None else [lake.data_location(commit)]
    tables = []
    for d in dirs:
        files = sorted(str(p) for p in Path(d).glob("*.parquet"))
        if files:
            tables.append(ds.dataset(files, format="parquet").to_table(columns=columns))
    return pa.concat_tables(tables, promote_options="permissive").to_pylist() if tables else []


class IcebergReader:
    """A scenario reader: after each compaction, sync the Iceberg table and read it with pyiceberg and polars."""

    name = "iceberg"
    reads_views = False

    def __init__(self, runner: conf.InProcessRunner) -> None:
        self.runner = runner
        self.failures: list[str] = []

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        rt = self.runner.runtime(cfg)
        commits = kept(rt.lake)
        if not commits:
            return []
        result = iceberg.sync(rt, rt.lake, commits)
        assert result["at"] == rt.lake.latest_commit().seq, result
        table = iceberg._catalog(rt, rt.lake).load_table(iceberg.identifier(cfg))
        assert iceberg.synced_seqs(table) == [c.seq for c in commits if c.seq >= commits[0].seq]
        if cfg.partition_by is not None:
            # The registry's partition_by as Iceberg's own spec: engines prune by it.
            (field,) = table.spec().fields
            assert (field.name, str(field.transform)) == (cfg.partition_by.column, "identity"), table.spec()
        columns = conf.shown_columns(cfg)
        got = iceberg_rows(table, columns)
        types = conf.compared_types(cfg)
        for other, rows in (
            ("polars.scan_iceberg", polars_rows(table, columns)),
            ("the live version's files", version_rows(rt.lake, rt.lake.latest_commit(), columns)),
        ):
            diff = conf.diff_rows(rows, got, types)
            if diff:
                self.failures.append(f"pyiceberg and {other} differ:\n" + "\n".join(diff))
        return got


@pytest.mark.parametrize(("name", "partitioned"), CHOSEN, ids=[f"{n}{'-partitioned' * p}" for n, p in CHOSEN])
def test_scenarios_read_through_iceberg(
    name: str, partitioned: bool, inprocess: conf.InProcessRunner, tmp_path: Path
) -> None:
    scn = conf.Scenario.load(SCENARIOS / f"{name}.json")
    part = None
    if partitioned:
        skip = {*scn.table["primary_key"], scn.table.get("op_column", "op"), *scn.table["order_by"]}
        column = next(c["name"] for c in scn.table["columns"] if c["name"] not in skip)
        part = {"column": column, "transform": "identity"}
    reader = IcebergReader(inprocess)
    result = conf.run_scenario(
        scn,
        inprocess,
        [reader],
        tmp_path / "lake",
        suffix="_ibp" if partitioned else "_ib",
        partition_by=part,
        formats=["iceberg"],
    )
    assert result.ok and not reader.failures, "\n".join(result.failures + reader.failures)


# ------------------------------------------------------------------ one lake through its life
MARKER = "ZQXMARKERQZX"


def _land(cfg: TableConfig, increment: str, table: pa.Table) -> None:
    target = Path(Lake(cfg).layout.incremental) / increment
    target.mkdir(parents=True)
    pq.write_table(table, target / "part-00000.parquet")


def _students(*rows: tuple[int, str, str, int], email: bool = False) -> pa.Table:
    cols: dict[str, Any] = {
        "id": pa.array([r[0] for r in rows], pa.int32()),
        "full_name": pa.array([r[1] for r in rows], pa.string()),
        "op": pa.array([r[2] for r in rows], pa.string()),
        "ts_ms": pa.array([r[3] for r in rows], pa.int64()),
    }
    if email:
        cols["email"] = pa.array([f"{r[1]}@example.com" for r in rows], pa.string())
    return pa.table(cols)


def _avro_payload(data: bytes) -> bytes:
    """An Avro container file's records, decompressed (its blocks may be deflated): what a byte search must see."""
    buf = io.BytesIO(data)

    def long() -> int:
        shift = result = 0
        while True:
            b = buf.read(1)[0]
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return (result >> 1) ^ -(result & 1)

    def raw() -> bytes:
        return buf.read(long())

    assert buf.read(4) == b"Obj\x01", "not an Avro container file"
    meta: dict[str, bytes] = {}
    while (n := long()) != 0:
        if n < 0:
            n, _ = -n, long()
        for _ in range(n):
            key = raw().decode()
            meta[key] = raw()
    codec = meta.get("avro.codec", b"null").decode()
    buf.read(16)
    out = [data[: buf.tell()]]
    while buf.tell() < len(data):
        long()  # records in the block
        block = raw()
        if codec == "deflate":
            block = zlib.decompress(block, -15)
        elif codec != "null":
            raise AssertionError(f"codec {codec} not decoded by this test")
        out.append(block)
        buf.read(16)
    return b"".join(out)


def metadata_bytes(lake: Lake) -> dict[str, bytes]:
    """Every file under the Iceberg table's root, Avro files decoded."""
    out = {}
    for p in Path(iceberg.table_root(lake)).rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            out[str(p)] = _avro_payload(data) if p.suffix == ".avro" else data
    return out


def test_sync_is_idempotent_heals_a_crash_expires_travels_regenerates_and_evolves(
    make_cfg: Callable[..., TableConfig], runtime: Callable[[TableConfig], Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import compact_once

    from cdc_compaction.job.faults import ENV
    from cdc_compaction.operations.erase import erase
    from cdc_compaction.pipeline.tables import ensure_tables

    # The table lists iceberg: the framework keeps (and would otherwise drop) <root>/iceberg on every publish.
    cfg = make_cfg(keep_versions=2, schema_changes="evolve", formats=["iceberg"])
    rt = runtime(cfg)
    ensure_tables(rt)
    lake = rt.lake
    cols = ["id", "full_name", "op", "ts_ms"]
    crash = f"formats.before_iceberg_commit@{cfg.qualified_name}=raise"

    # A crash between the lake commit and the Iceberg commit, in both publishes: nothing synced commit 1 or 2.
    monkeypatch.setenv(ENV, crash)
    _land(cfg, "increment_2026112200", _students((1, "Alice", "c", 0), (2, "Bob", "c", 0), (7, MARKER, "c", 0)))
    compact_once(rt, "r1")
    _land(cfg, "increment_2026112201", _students((1, "Angela", "u", 1), (2, "Bob", "d", 2)))
    compact_once(rt, "r2")
    monkeypatch.delenv(ENV)
    first = iceberg.sync(rt, lake, kept(lake))
    assert first["synced"] == [1, 2] and first["at"] == 2
    table = iceberg._catalog(rt, lake).load_table(iceberg.identifier(cfg))
    assert iceberg.synced_seqs(table) == [1, 2] and len(table.snapshots()) == 2
    # Idempotent: again, nothing new.
    again = iceberg.sync(rt, lake, kept(lake))
    table = iceberg._catalog(rt, lake).load_table(iceberg.identifier(cfg))
    assert again["synced"] == [] and again["at"] == 2 and len(table.snapshots()) == 2

    # Time travel to commit 1: Bob (deleted by commit 2) and Alice are there.
    expected_1 = version_rows(lake, lake.read_commit(1), cols)
    snap1 = iceberg.snapshot_for_seq(table, 1)
    assert snap1 is not None
    assert sorted(iceberg_rows(table, cols, snap1.snapshot_id), key=str) == sorted(expected_1, key=str)
    assert {r["full_name"] for r in expected_1} == {"Alice", "Bob", MARKER}
    live = sorted(iceberg_rows(table, cols), key=str)
    assert live == sorted(version_rows(lake, lake.read_commit(2), cols), key=str)
    assert all(r["op"] != "d" for r in live)  # no tombstone appears

    # The marker is in the manifests' bounds now: the erase check below can fail.
    assert any(MARKER.encode() in b for b in metadata_bytes(lake).values())

    # Commit 3 with a column the source added (schema_changes: evolve).
    _land(cfg, "increment_2026112202", _students((3, "Carol", "c", 3), email=True))
    rt = runtime(cfg)
    monkeypatch.setenv(ENV, crash)  # its publish's sync crashes too: the call below writes the snapshot
    compact_once(rt, "r3")
    monkeypatch.delenv(ENV)
    rt = runtime(cfg)  # the evolved columns
    done = iceberg.sync(rt, lake, kept(lake))
    assert done["synced"] == [3]
    table = iceberg._catalog(rt, lake).load_table(iceberg.identifier(cfg))
    assert table.schema().find_field("email") is not None
    rows = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert rows[3]["email"] == "Carol@example.com" and rows[1]["email"] is None
    assert sorted(rows) == sorted(r["id"] for r in version_rows(lake, lake.latest_commit(), ["id"]))

    # Expire what keep_versions (2) no longer keeps: commit 1's snapshot; every kept snapshot's files exist.
    keep = set(kept_seqs(3, cfg.keep_versions))
    iceberg.expire(rt, lake, keep)
    table = iceberg._catalog(rt, lake).load_table(iceberg.identifier(cfg))
    assert iceberg.synced_seqs(table) == [2, 3]
    for snap in table.snapshots():
        for task in table.scan(snapshot_id=snap.snapshot_id).plan_files():
            assert Path(iceberg._strip(task.file.file_path)).exists(), task.file.file_path
    referenced = {iceberg._strip(s.manifest_list) for s in table.snapshots()}
    assert all(
        str(p) in referenced or not p.name.startswith("snap-") for p in Path(iceberg.metadata_dir(lake)).glob("*.avro")
    ), "an expired snapshot's manifest list stayed"

    # Erase the marker row (live in every kept version) and regenerate the metadata.
    erase(cfg, "id = 7", actor="test")
    rt = runtime(cfg)
    iceberg.regenerate(rt, lake, kept(lake))
    table = iceberg._catalog(rt, lake).load_table(iceberg.identifier(cfg))
    assert iceberg.synced_seqs(table) == [c.seq for c in kept(lake)]
    leaks = [p for p, b in metadata_bytes(lake).items() if MARKER.encode() in b]
    assert not leaks, f"erased value still in Iceberg metadata: {leaks}"
    assert 7 not in {r["id"] for r in table.scan().to_arrow().to_pylist()}
    # Time travel by commit still works after the ids changed.
    for c in kept(lake):
        snap = iceberg.snapshot_for_seq(table, c.seq)
        assert snap is not None
        assert sorted(iceberg_rows(table, ["id", "full_name"], snap.snapshot_id), key=str) == sorted(
            version_rows(lake, c, ["id", "full_name"]), key=str
        )
    assert iceberg.is_metadata_path(lake, table.metadata_location)
    assert not iceberg.is_metadata_path(lake, lake.data_location(lake.latest_commit()))

    # The Hive catalog on the project's own Hive 2.3 metastore: it has no transaction support, so pyiceberg's
    # commit lock is refused; sync says so, naming the table, the metastore and what to do.
    monkeypatch.setenv(iceberg.CATALOG_ENV, "hive")
    with pytest.raises(iceberg.IcebergFormatError) as err:
        iceberg.sync(rt, lake, kept(lake))
    assert rt.metastore.uri in str(err.value) and f"{cfg.table}_iceberg" in str(err.value)
    assert f"{iceberg.CATALOG_ENV}=sql" in str(err.value)
    # Glue names files on S3: a local lake is refused by name, and a catalog nobody knows too.
    monkeypatch.setenv(iceberg.CATALOG_ENV, "glue")
    with pytest.raises(iceberg.IcebergFormatError, match=rf"{cfg.qualified_name}: .*=glue .* is local; set .*=sql"):
        iceberg.sync(rt, lake, kept(lake))
    monkeypatch.setenv(iceberg.CATALOG_ENV, "nessie")
    with pytest.raises(iceberg.IcebergFormatError, match="not a known Iceberg catalog"):
        iceberg.sync(rt, lake, kept(lake))


# ------------------------------------------------------------------ the hive catalog on a metastore with transactions
@pytest.fixture(scope="module")
def hive4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hive4Metastore]:
    """A Hive 4 metastore with transactions (jars.lock's hive4-metastore), stopped by this fixture."""
    home = tmp_path_factory.mktemp("hive4")
    ms = Hive4Metastore(home, port=free_port(), warehouse=home / "warehouse")
    ms.start()
    try:
        yield ms
    finally:
        ms.stop()


def _snapshot_of(table: Any, seq: int) -> Any:
    """The snapshot whose summary names lake commit ``seq`` (docs/formats.md: ``cdc.commit_seq``)."""
    found = [
        s for s in table.snapshots() if s.summary and s.summary.additional_properties.get("cdc.commit_seq") == str(seq)
    ]
    assert len(found) == 1, f"{len(found)} snapshots carry commit {seq}"
    return found[0]


@pytest.mark.extended
def test_the_hive_catalog_commits_through_a_hive4_metastore_with_transactions(
    make_cfg: Callable[..., TableConfig],
    runtime: Callable[[TableConfig], Runtime],
    hive4: Hive4Metastore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CDC_ICEBERG_CATALOG=hive on a metastore that serves lock(): every kept commit gets its snapshot, read back
    through a HiveCatalog of the test's own; two syncs at once write one snapshot; a sync with nothing new adds none."""
    from conftest import compact_once
    from pyiceberg.catalog.hive import HiveCatalog
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    from cdc_compaction.pipeline.tables import ensure_tables

    # The base tables live in the session's Hive 2.3 metastore; only the Iceberg sync runs against Hive 4.
    cfg = make_cfg(keep_versions=2)
    rt = runtime(cfg)
    ensure_tables(rt)
    lake = rt.lake
    _land(cfg, "increment_2026112200", _students((1, "Alice", "c", 0), (2, "Bob", "c", 0), (3, "Carol", "c", 0)))
    compact_once(rt, "r1")
    _land(cfg, "increment_2026112201", _students((1, "Angela", "u", 1), (2, "Bob", "d", 2)))
    compact_once(rt, "r2")
    _land(cfg, "increment_2026112202", _students((4, "Dan", "c", 3), (3, "Cora", "u", 3)))
    compact_once(rt, "r3")
    # Every compaction comes first: a publish of a table without formats: [iceberg] drops <root>/iceberg.
    monkeypatch.setenv(iceberg.CATALOG_ENV, "hive")
    rt4 = replace(rt, metastore=MetastoreEndpoint(hive4.host, hive4.port))

    cols = ["id", "full_name", "op", "ts_ms"]

    def check(seqs: list[int]) -> None:
        table = HiveCatalog("test", uri=hive4.uri).load_table(f"{cfg.database}.{cfg.table}_iceberg")
        assert len(table.snapshots()) == len(seqs)
        for seq in seqs:
            snap = _snapshot_of(table, seq)
            got = table.scan(snapshot_id=snap.snapshot_id).to_arrow().select(cols).to_pylist()
            assert sorted(got, key=str) == sorted(version_rows(lake, lake.read_commit(seq), cols), key=str)

    # The first sync creates <db>.<t>_iceberg in Hive 4 with kept commit 2 (keep_versions 2: commits 2 and 3).
    first = kept(lake)
    assert [c.seq for c in first] == [2, 3]
    done = iceberg.sync(rt4, lake, first[:1])
    assert done["synced"] == [2] and done["at"] == 2
    check([2])

    # Two syncs of commit 3 at once: the metastore lock serializes their commits, and the one that comes second
    # either finds the snapshot there or is refused by pyiceberg: its commit names the table it started from
    # (CommitFailedException), and its retry finds the other's files already added (ValidationException).
    results: list[Any] = []

    def one() -> None:
        try:
            results.append(iceberg.sync(rt4, lake, first)["synced"])
        except (CommitFailedException, ValidationException) as exc:
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 2 and [3] in results, results
    check([2, 3])
    # A sync with nothing new is a no-op.
    again = iceberg.sync(rt4, lake, kept(lake))
    assert again["synced"] == [] and again["at"] == 3
    check([2, 3])


# ------------------------------------------------------------------ through the framework and the real steps
def iceberg_table(rt: Runtime) -> Any:
    return iceberg._catalog(rt, rt.lake).load_table(iceberg.identifier(rt.cfg))


def iceberg_pairs(rt: Runtime, seq: int | None = None, columns: tuple[str, ...] = ("id", "full_name")) -> list[tuple]:
    """The rows as pyiceberg reads them (at lake commit ``seq``); polars must agree on the live snapshot."""
    table = iceberg_table(rt)
    snapshot_id = None
    if seq is not None:
        snap = iceberg.snapshot_for_seq(table, seq)
        assert snap is not None, f"no snapshot carries commit {seq}: {iceberg.synced_seqs(table)}"
        snapshot_id = snap.snapshot_id
    got = sorted(tuple(r[c] for c in columns) for r in iceberg_rows(table, list(columns), snapshot_id))
    if seq is None:
        other = sorted(tuple(r[c] for c in columns) for r in polars_rows(table, list(columns)))
        assert got == other, f"pyiceberg and polars.scan_iceberg disagree: {got} != {other}"
    return got


def test_crash_before_the_iceberg_commit_then_rollback_erase_and_an_added_column(
    make_cfg: Callable[..., TableConfig], runtime: Callable[[TableConfig], Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both formats on one table, through publish, rollback and erase (the framework's calls): a crash at the
    Iceberg commit loses nothing and holds Delta back in nothing; re-runs write one snapshot per commit."""
    from conftest import compact_once

    from cdc_compaction.job.faults import ENV
    from cdc_compaction.operations.erase import erase
    from cdc_compaction.operations.travel import rollback
    from cdc_compaction.pipeline import formats
    from cdc_compaction.pipeline.archive import archive
    from cdc_compaction.pipeline.formats import delta
    from cdc_compaction.pipeline.plan import plan
    from cdc_compaction.pipeline.publish import publish
    from cdc_compaction.pipeline.tables import ensure_tables
    from cdc_compaction.pipeline.validate import validate
    from pipeline.test_formats_delta import STUDENT, land_rows, log_text, rows_of

    cfg = make_cfg(formats=["delta", "iceberg"], keep_versions=3, schema_changes="evolve")
    rt = runtime(cfg)
    ensure_tables(rt)
    lake = rt.lake
    droot = delta.table_root(lake)
    land_rows(
        cfg,
        "increment_2026112200",
        [
            {"id": 1, "full_name": "ann", "op": "c", "ts_ms": 1},
            {"id": 2, "full_name": "bob", "op": "c", "ts_ms": 1},
            {"id": 3, "full_name": "cid", "op": "c", "ts_ms": 1},
        ],
        STUDENT,
    )
    compact_once(rt, "r1")
    assert iceberg_pairs(rt) == [(1, "ann"), (2, "bob"), (3, "cid")]
    assert iceberg.synced_seqs(iceberg_table(rt)) == [1]

    # Crash between the lake's commit and the Iceberg commit: the publish (and the Delta commit) happen all the same.
    land_rows(
        cfg,
        "increment_2026112201",
        [
            {"id": 2, "full_name": "bobby", "op": "u", "ts_ms": 2},
            {"id": 3, "full_name": "cid", "op": "d", "ts_ms": 2},
        ],
        STUDENT,
    )
    path = plan(rt, "r2")
    rt.engine.compact(json.loads(lake.storage.read_text(path)))
    validate(rt, path)
    monkeypatch.setenv(ENV, f"formats.before_iceberg_commit@{cfg.qualified_name}=raise")
    before = formats.FAILURES[cfg.qualified_name]
    published = publish(rt, path)
    assert published["seq"] == 2 and lake.latest_commit().seq == 2
    assert "injected fault at formats.before_iceberg_commit" in published["formats"]["failed"]["iceberg"]
    assert list(published["formats"]["failed"]) == ["iceberg"] and published["formats"]["delta"]["written"] == [2]
    assert formats.FAILURES[cfg.qualified_name] == before + 1
    assert iceberg.synced_seqs(iceberg_table(rt)) == [1], "no snapshot of commit 2 yet"
    assert iceberg_pairs(rt) == [(1, "ann"), (2, "bob"), (3, "cid")], "readers see commit 1 whole"
    monkeypatch.delenv(ENV)
    # A re-run of publish (Airflow's retry) writes the missing snapshot, once; another re-run writes nothing.
    again = publish(rt, path)
    assert again["formats"]["failed"] == {} and again["formats"]["iceberg"]["synced"] == [2]
    assert publish(rt, path)["formats"]["iceberg"]["synced"] == []
    archive(rt, path)
    table = iceberg_table(rt)
    assert iceberg.synced_seqs(table) == [1, 2] and len(table.snapshots()) == 2
    assert iceberg_pairs(rt) == [(1, "ann"), (2, "bobby")]
    assert iceberg_pairs(rt, 1) == [(1, "ann"), (2, "bob"), (3, "cid")]
    assert rows_of(droot) == [(1, "ann"), (2, "bobby")]

    # An added column (schema_changes: evolve): the schema grows, older rows read it as null.
    land_rows(
        cfg,
        "increment_2026112202",
        [{"id": 4, "full_name": "dan", "op": "c", "ts_ms": 3, "email": "dan@example.com"}],
        {**STUDENT, "email": pa.string()},
    )
    compact_once(rt, "r3")
    assert iceberg_table(rt).schema().find_field("email") is not None
    assert iceberg_pairs(rt, columns=("id", "full_name", "email")) == [
        (1, "ann", None),
        (2, "bobby", None),
        (4, "dan", "dan@example.com"),
    ]
    assert iceberg_pairs(rt, 2) == [(1, "ann"), (2, "bobby")]

    # A rollback is a new snapshot carrying its own commit number.
    rollback(cfg, 2, rt.metastore, by="test")
    assert lake.latest_commit().seq == 4
    assert iceberg.synced_seqs(iceberg_table(rt)) == [1, 2, 3, 4]
    assert iceberg_pairs(rt) == [(1, "ann"), (2, "bobby")]
    assert iceberg_pairs(rt, 3) == [(1, "ann"), (2, "bobby"), (4, "dan")]

    # Erase: the walker leaves <root>/iceberg to the regeneration, which keeps no erased value in any file there.
    land_rows(cfg, "increment_2026112203", [{"id": 5, "full_name": MARKER, "op": "c", "ts_ms": 5}], STUDENT)
    compact_once(rt, "r5")
    assert (5, MARKER) in iceberg_pairs(rt)
    assert any(MARKER.encode() in b for b in metadata_bytes(lake).values()), "a bound of commit 5's file"
    assert formats.is_metadata_path(lake, iceberg.table_root(lake))
    assert formats.is_metadata_path(lake, iceberg_table(rt).metadata_location.removeprefix("file://"))
    erase(cfg, "id = 5", actor="test")
    live = lake.latest_commit()
    assert live.plan_id.startswith("erase-") and live.seq == 6
    table = iceberg_table(rt)
    assert iceberg.synced_seqs(table) == [4, 5, 6], "the kept commits (keep_versions: 3)"
    leaks = [p for p, b in metadata_bytes(lake).items() if MARKER.encode() in b]
    assert not leaks, f"erased value still in Iceberg metadata: {leaks}"
    assert MARKER not in log_text(lake)
    for seq in (5, 6):
        assert iceberg_pairs(rt, seq) == [(1, "ann"), (2, "bobby")]
    assert iceberg_pairs(rt) == [(1, "ann"), (2, "bobby")]
    # The next publish appends after the regenerated snapshots; still one per commit.
    land_rows(cfg, "increment_2026112204", [{"id": 6, "full_name": "fay", "op": "c", "ts_ms": 6}], STUDENT)
    compact_once(rt, "r7")
    table = iceberg_table(rt)
    assert iceberg.synced_seqs(table) == [5, 6, 7] and len(table.snapshots()) == 3
    assert iceberg_pairs(rt) == [(1, "ann"), (2, "bobby"), (6, "fay")]
    assert rows_of(droot) == [(1, "ann"), (2, "bobby"), (6, "fay")]


def test_the_conformance_iceberg_readers_see_a_wrong_expectation_now_and_in_time_travel(
    inprocess: conf.InProcessRunner, tmp_path: Path
) -> None:
    """The Iceberg readers of the conformance runs can fail: a wrong expectation after commit 1 is a row diff
    there, and again at every later compaction when they travel back to commit 1's snapshot."""
    doc = json.loads((SCENARIOS / "late_update_for_deleted_key.json").read_text())
    first = next(s for s in doc["steps"] if "compact" in s)["compact"]
    first["expect"][0]["full_name"] = "Mallory"
    path = tmp_path / "late_update_for_deleted_key.json"
    path.write_text(json.dumps(doc))
    readers = [conf.IcebergReader("pyiceberg"), conf.IcebergReader("polars")]
    result = conf.run_scenario(
        conf.Scenario.load(path), inprocess, readers, tmp_path / "lake", suffix="_ineg", formats=["iceberg"]
    )
    text = "\n".join(result.failures)
    for engine in ("pyiceberg", "polars"):
        assert f"step 2 compact (iceberg/{engine}): base rows differ" in text
        for step in (2, 4, 7):
            assert f"step {step} compact (iceberg/{engine}): Iceberg snapshot of commit 1 differs" in text
    assert text.count("missing:    full_name='Mallory'") == 8
    # Without formats the Iceberg readers do not apply: the same run has nothing for them to check.
    plain = conf.run_scenario(conf.Scenario.load(path), inprocess, readers, tmp_path / "lake2", suffix="_ineg2")
    assert plain.ok, plain.failures


# ------------------------------------------------------------------ hand-laid versions (no Spark)
def test_snapshots_keep_their_commit_time_and_the_version_hint_names_the_current_metadata(
    make_cfg: Callable[..., TableConfig],
) -> None:
    """Issue 37, defects 2 and 4: a snapshot's ``timestamp-ms`` is its lake commit's time, after a late sync
    and after the regeneration an erase runs; ``metadata/version-hint.text`` lets a reader without the
    catalog (pyiceberg's StaticTable, DuckDB's ``iceberg_scan``) open the current metadata."""
    from pyiceberg.table import StaticTable

    from cdc_compaction.core.ownership import claim
    from cdc_compaction.pipeline import formats
    from pipeline.test_formats_delta import STATES, committed_ms, write_version

    cfg = make_cfg(formats=["iceberg"], keep_versions=4)
    lake = Lake(cfg)
    claim(lake)
    for seq, names in enumerate(STATES[:4], start=1):
        write_version(lake, seq, names)
    rt = formats.runtime_for(cfg, lake)
    assert formats.sync_formats(rt, 4)["failed"] == {}  # late: days after the commits

    def check() -> None:
        table = StaticTable.from_metadata(str(iceberg.table_root(lake)))  # through version-hint.text
        by_seq = {int(s.summary[iceberg.SEQ_PROPERTY]): s for s in table.snapshots()}
        assert {seq: s.timestamp_ms for seq, s in by_seq.items()} == {seq: committed_ms(seq) for seq in range(1, 5)}
        for seq in range(1, 5):
            snap = table.snapshot_as_of_timestamp(committed_ms(seq) + 12 * 3600 * 1000)
            assert snap is not None and snap.snapshot_id == by_seq[seq].snapshot_id
            rows = table.scan(snapshot_id=snap.snapshot_id).to_arrow().select(["id", "full_name"]).to_pylist()
            assert {r["id"]: r["full_name"] for r in rows} == STATES[seq - 1]
        assert table.current_snapshot().snapshot_id == by_seq[4].snapshot_id
        # Java readers refuse metadata whose logs run backward (by more than a minute): they run forward.
        times = [e.timestamp_ms for e in table.metadata.metadata_log] + [table.metadata.last_updated_ms]
        assert times == sorted(times)

    check()
    formats.regenerate_formats(rt)  # what an erase does after rewriting files
    check()


def test_an_erase_whose_iceberg_rebuild_fails_exits_non_zero_and_verify_reads_the_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37, defect 1 for Iceberg: ``CDC_FAULTS='formats.before_iceberg_commit@<t>=raise' erase`` exits
    non-zero naming the table and the metadata; ``--verify`` fails while a manifest (Avro, deflated) still
    holds the erased value as a bound; the same erase run again finishes, and pyiceberg reads every kept
    snapshot without it."""
    import shutil

    from pyiceberg.table import StaticTable

    from cdc_compaction.cli.main import main
    from cdc_compaction.job.faults import ENV
    from pipeline.test_formats_delta import STATES, _erase_table

    cfg, lake, args = _erase_table(tmp_path, fmt="iceberg")
    meta = Path(iceberg.metadata_dir(lake))
    saved = tmp_path / "saved"
    shutil.copytree(meta, saved)
    manifests = [p for p in saved.glob("*.avro") if b"robert" in _avro_payload(p.read_bytes())]
    assert manifests, "a manifest holds the bound 'robert': the test can see it"

    monkeypatch.setenv(ENV, f"formats.before_iceberg_commit@{cfg.qualified_name}=raise")
    assert main([*args, "--yes"]) != 0
    err = capsys.readouterr().err
    assert cfg.qualified_name in err and "iceberg" in err and "run the same erase again" in err
    monkeypatch.delenv(ENV)
    meta.mkdir(parents=True, exist_ok=True)
    shutil.copy(manifests[0], meta / manifests[0].name)  # a manifest the failure left behind
    assert main([*args, "--verify"]) == 1
    capsys.readouterr()
    (meta / manifests[0].name).unlink()

    assert main([*args, "--yes"]) == 0
    assert main([*args, "--verify"]) == 0
    capsys.readouterr()
    table = StaticTable.from_metadata(str(iceberg.table_root(lake)))
    by_seq = {int(s.summary[iceberg.SEQ_PROPERTY]): s.snapshot_id for s in table.snapshots()}
    assert sorted(by_seq) == [4, 5], "the erase is commit 5: versions 4 and 5 are kept"
    want = {i: n for i, n in STATES[3].items() if n != "robert"}
    for seq in (4, 5):
        rows = table.scan(snapshot_id=by_seq[seq]).to_arrow().select(["id", "full_name"]).to_pylist()
        assert {r["id"]: r["full_name"] for r in rows} == want
