"""Every published version as a Delta table (docs/formats.md): ``formats: [delta]``.

The first tests lay versions out by hand (Parquet files and commit records, as publish lays them
out) and read the Delta log back with real readers -- delta-rs (``deltalake``) and polars -- comparing
with the rows the test wrote. The pipeline tests run the real steps (Spark, the session metastore):
a crash between the lake's commit and the Delta commit, an erase, an added column and a rollback.
Expected rows come from what the tests landed, never from the project's code.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import deltalake
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.ownership import claim
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.pipeline import formats
from cdc_compaction.pipeline.formats import delta
from cdc_compaction.pipeline.retention import cleanup_versions
from cdc_compaction.pipeline.runtime import Runtime

#: Versions of a student table (id -> full_name), as compactions might leave them.
STATES: list[dict[int, str]] = [
    {1: "ann", 2: "bob", 3: "cid", 4: "dan"},
    {1: "ann", 2: "bobby", 4: "dan", 5: "eve"},
    {1: "ann", 2: "robert", 3: "cid", 4: "dan", 5: "eve", 6: "fay"},
    {2: "robert", 6: "fay", 7: "gus"},
    {2: "rob", 6: "fay", 7: "gus", 8: "hal"},
]


def write_version(
    lake: Lake,
    seq: int,
    names: dict[int, str],
    partitioned: bool = False,
    email: bool = False,
    rollback_to: int | None = None,
) -> Commit:
    """Lay out version ``seq`` as publish does (``data/``, ``tombstones/``) and commit it.

    ``email``: the version has the column ``email`` (``<name>@x``) that ``schema_changes: evolve`` added;
    its record names its columns then, as publish writes them.  ``rollback_to``: the record is a rollback's."""
    version = f"v{seq:08d}-p{seq}-a1"
    data = Path(lake.layout.data_dir(version))
    ids = sorted(names)
    cols = {
        "id": pa.array(ids, pa.int32()),
        "full_name": pa.array([names[i] for i in ids]),
        "op": pa.array(["u"] * len(ids)),
        "ts_ms": pa.array([seq * 100 + i for i in ids], pa.int64()),
    }
    schema = None
    if email:
        cols["email"] = pa.array([f"{names[i]}@x" for i in ids])
        types = {"id": "int", "full_name": "string", "op": "string", "ts_ms": "bigint", "email": "string"}
        schema = {"columns": [{"name": n, "type": t} for n, t in types.items()], "changes": []}
    table = pa.table(cols)
    partitions = None
    if partitioned:
        partitions = {}
        for parity in ("even", "odd"):
            d = data / f"_cdc_partition={parity}"
            d.mkdir(parents=True)
            keep = pa.array([(i % 2 == 0) == (parity == "even") for i in ids])
            pq.write_table(table.filter(keep), d / "part-0.parquet")
            partitions[parity] = str(d)
    else:
        data.mkdir(parents=True)
        pq.write_table(table, data / "part-0.parquet")
    tombs = Path(str(lake.layout.tombstones_dir(version)))
    tombs.mkdir(parents=True)
    # A tombstone file: a deleted key's row, which no Delta reader may see.
    pq.write_table(pa.table({"id": pa.array([99], pa.int32()), "full_name": ["deleted"]}), tombs / "part-0.parquet")
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
        schema=schema,
        rollback=None if rollback_to is None else {"to_seq": rollback_to, "by": "test"},
    )
    assert lake.try_commit(commit)
    return commit


def rt_of(cfg: TableConfig, lake: Lake) -> Runtime:
    return formats.runtime_for(cfg, lake)


def delta_rows(root: str, version: int | None = None) -> dict[int, str]:
    """id -> full_name as delta-rs reads the table (at ``version``), each id once."""
    dt = deltalake.DeltaTable(root, version=version)
    rows = dt.to_pyarrow_table(columns=["id", "full_name"]).to_pylist()
    out = {r["id"]: r["full_name"] for r in rows}
    assert len(out) == len(rows), f"an id twice in {root}@{version}: {rows}"
    return out


def polars_rows(root: str, version: int | None = None) -> dict[int, str]:
    df = pl.read_delta(root, version=version).select("id", "full_name")
    out = dict(zip(df["id"].to_list(), df["full_name"].to_list(), strict=True))
    assert len(out) == df.height
    return out


def sync_up_to(cfg: TableConfig, lake: Lake, live: int) -> dict[str, Any]:
    return formats.sync_formats(rt_of(cfg, lake), live)


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
def test_one_delta_version_per_commit_readable_by_delta_rs_and_polars(make_cfg: Any, partitioned: bool) -> None:
    extra = {"partition_by": {"column": "id", "transform": "identity"}} if partitioned else {}
    cfg = make_cfg(formats=["delta"], keep_versions=10, **extra)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    root = delta.table_root(lake)
    for seq, names in enumerate(STATES[:3], start=1):
        write_version(lake, seq, names, partitioned)
        result = sync_up_to(cfg, lake, seq)
        assert result["failed"] == {}, result
        assert result["delta"]["written"] == ([0, 1] if seq == 1 else [seq])
        assert delta_rows(root) == names
        assert polars_rows(root) == names
    # Time travel: Delta version N is lake commit N, and its commitInfo says so.
    for seq, names in enumerate(STATES[:3], start=1):
        assert delta_rows(root, seq) == names
        assert polars_rows(root, seq) == names
    assert delta_rows(root, 0) == {}
    assert delta.commit_seqs(lake) == {0: 0, 1: 1, 2: 2, 3: 3}
    history = {h["version"]: h for h in deltalake.DeltaTable(root).history()}
    assert {v: h["cdc.commit_seq"] for v, h in history.items()} == {0: 0, 1: 1, 2: 2, 3: 3}
    # Idempotent: a second sync writes nothing.
    before = sorted(os.listdir(delta.metadata_root(lake)))
    again = sync_up_to(cfg, lake, 3)
    assert again["delta"]["written"] == []
    assert sorted(os.listdir(delta.metadata_root(lake))) == before
    # Only visible rows: no tombstone file is named, and stats are the footers'.
    dt = deltalake.DeltaTable(root)
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    assert all("/data/" in a["path"] and "tombstones" not in a["path"] for a in adds)
    assert sum(a["num_records"] for a in adds) == len(STATES[2])
    assert min(a["min.id"] for a in adds) == min(STATES[2]) and max(a["max.id"] for a in adds) == max(STATES[2])
    if partitioned:
        # Unpartitioned for Delta: readers skip files by the real column's stats, never by _cdc_partition.
        assert dt.metadata().partition_columns == []
        assert "_cdc_partition" not in [f.name for f in dt.schema().fields]
        for a in adds:
            ids = pq.read_table(os.path.join(root, a["path"]), columns=["id"])["id"].to_pylist()
            assert (a["min.id"], a["max.id"], a["null_count.id"]) == (min(ids), max(ids), 0), a["path"]


def test_missing_entries_are_appended_and_a_late_start_begins_with_a_checkpoint(make_cfg: Any) -> None:
    """Formats enabled on a table with history (or syncs that failed): the log holds the kept commits only."""
    cfg = make_cfg(formats=["delta"], keep_versions=2)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    root = delta.table_root(lake)
    for seq, names in enumerate(STATES[:4], start=1):
        write_version(lake, seq, names)
    result = sync_up_to(cfg, lake, 4)
    assert result["delta"]["written"] == [3, 4] and result["delta"]["started_at"] == 3
    assert delta_rows(root) == STATES[3]
    assert delta_rows(root, 3) == STATES[2]
    assert polars_rows(root, 3) == STATES[2]
    with pytest.raises(Exception, match=r"(?i)version|log segment|not found"):
        deltalake.DeltaTable(root, version=2)


def test_retention_expires_old_versions_from_the_log_before_deleting_their_files(make_cfg: Any) -> None:
    cfg = make_cfg(formats=["delta"], keep_versions=2)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    root = delta.table_root(lake)
    rt = rt_of(cfg, lake)
    for seq, names in enumerate(STATES, start=1):
        write_version(lake, seq, names)
        assert sync_up_to(cfg, lake, seq)["failed"] == {}
        cleanup_versions(rt, seq)
        # Every version the log still reaches is whole on storage and reads as written.
        jsons, cps = delta._listing(lake)
        oldest = min((*jsons, *cps))
        assert oldest == max(0, seq - 1) or (seq == 1 and oldest == 0)
        for v in range(max(1, seq - 1), seq + 1):
            assert delta_rows(root, v) == STATES[v - 1]
            assert polars_rows(root, v) == STATES[v - 1]
    assert delta_rows(root) == STATES[-1]
    for gone in range(1, len(STATES) - 1):
        assert not Path(lake.layout.version_dir(f"v{gone:08d}-p{gone}-a1")).exists()
        with pytest.raises(Exception, match=r"(?i)version|log segment|not found"):
            deltalake.DeltaTable(root, version=gone)


def test_a_failed_expiry_keeps_the_old_versions_files(make_cfg: Any) -> None:
    """If the format cannot stop naming an old version, retention keeps its files this time."""
    cfg = make_cfg(formats=["delta"], keep_versions=1)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    rt = rt_of(cfg, lake)
    write_version(lake, 1, STATES[0])
    sync_up_to(cfg, lake, 1)
    write_version(lake, 2, STATES[1])
    sync_up_to(cfg, lake, 2)
    # A log that cannot be replayed up to the oldest kept version: version 2's entry made unreadable.
    Path(delta.commit_path(lake, 2)).write_text("{not json\n")
    before = formats.FAILURES[cfg.qualified_name]
    assert cleanup_versions(rt, 2) == []
    assert formats.FAILURES[cfg.qualified_name] == before + 1
    assert Path(lake.layout.version_dir("v00000001-p1-a1")).exists()


def test_regenerate_after_a_file_is_rewritten_keeps_no_old_bound(make_cfg: Any) -> None:
    """An erase rewrites files in place: the regenerated log has the new sizes and no erased value."""
    cfg = make_cfg(formats=["delta"], keep_versions=3)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    root = delta.table_root(lake)
    for seq, names in enumerate(STATES[:3], start=1):
        write_version(lake, seq, names)
    sync_up_to(cfg, lake, 3)
    # Erase id 6 ("fay") and id 1 ("ann") by hand from every kept version's file, as erase does.
    for seq in (1, 2, 3):
        f = Path(lake.layout.data_dir(f"v{seq:08d}-p{seq}-a1")) / "part-0.parquet"
        t = pq.read_table(f)
        pq.write_table(t.filter(pa.array([i not in (1, 6) for i in t["id"].to_pylist()])), f)
    formats.regenerate_formats(rt_of(cfg, lake))
    for seq in (1, 2, 3):
        want = {i: n for i, n in STATES[seq - 1].items() if i not in (1, 6)}
        assert delta_rows(root, seq) == want
        assert polars_rows(root, seq) == want
    text = "".join(p.read_text() for p in Path(delta.metadata_root(lake)).glob("*.json"))
    assert "ann" not in text and "fay" not in text
    assert json.loads(text.splitlines()[0])  # parsable


def test_is_metadata_path_names_the_log_only(make_cfg: Any) -> None:
    cfg = make_cfg(formats=["delta"])
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    assert formats.is_metadata_path(lake, delta.metadata_root(lake))
    assert formats.is_metadata_path(lake, delta.commit_path(lake, 7))
    assert not formats.is_metadata_path(lake, lake.layout.data_dir("v00000001-p1-a1") + "/part-0.parquet")
    assert not formats.is_metadata_path(lake, lake.layout.base + "/_delta_logs/x")


def test_a_table_without_formats_writes_no_log(make_cfg: Any) -> None:
    cfg = make_cfg()
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    write_version(lake, 1, STATES[0])
    assert sync_up_to(cfg, lake, 1) == {"failed": {}}
    assert not Path(delta.metadata_root(lake)).exists()


def test_a_format_taken_out_of_the_registry_leaves_no_stale_log(make_cfg: Any) -> None:
    """Nothing keeps an unlisted format's log current: it is deleted, not left showing an old version."""
    cfg = make_cfg(formats=["delta"], keep_versions=5)
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    write_version(lake, 1, STATES[0])
    sync_up_to(cfg, lake, 1)
    assert delta_rows(delta.table_root(lake)) == STATES[0]
    plain = cfg.model_copy(update={"formats": []})
    write_version(lake, 2, STATES[1])
    assert sync_up_to(plain, lake, 2) == {"failed": {}, "dropped": ["delta"]}
    assert not Path(delta.metadata_root(lake)).exists()
    # Listed again: the log starts anew from the kept commits.
    assert sync_up_to(cfg, lake, 2)["delta"]["written"] == [0, 1, 2]
    assert delta_rows(delta.table_root(lake)) == STATES[1]


def test_a_format_that_fails_is_counted_and_never_raises(make_cfg: Any) -> None:
    cfg = make_cfg(formats=["delta"])
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    write_version(lake, 1, STATES[0])
    shutil.rmtree(lake.layout.data_dir("v00000001-p1-a1"))  # the version's data is gone
    before = formats.FAILURES[cfg.qualified_name]
    result = sync_up_to(cfg, lake, 1)
    assert "not on storage" in result["failed"]["delta"]
    assert formats.FAILURES[cfg.qualified_name] == before + 1


# ------------------------------------------------------------------------------ the registry
def test_formats_default_to_none_come_from_the_databases_defaults_and_are_named_once(tmp_path: Path) -> None:
    import yaml
    from conftest import student_doc

    from cdc_compaction.core.registry import load_registry

    lake, registry = tmp_path / "lake", tmp_path / "registry"  # the lake beside the registry, never inside it
    registry.mkdir()
    (registry / "tests").mkdir()
    (registry / "tests" / "_database.yaml").write_text(yaml.safe_dump({"formats": ["delta"]}))
    docs = {
        "tests.plain.yaml": student_doc(lake, "plain"),
        "tests.own.yaml": student_doc(lake, "own", formats=["iceberg", "delta"]),
        "tests.off.yaml": student_doc(lake, "off", formats=[]),
        "tests.twice.yaml": student_doc(lake, "twice", formats=["delta", "delta"]),
        "tests.bad.yaml": student_doc(lake, "bad", formats=["hudi"]),
    }
    for name, doc in docs.items():
        (registry / name).write_text(yaml.safe_dump(doc))
    entries = {e.path.name: e for e in load_registry(registry)}
    assert entries["tests.plain.yaml"].config.formats == ["delta"]  # the database's default
    assert entries["tests.own.yaml"].config.formats == ["iceberg", "delta"]
    assert entries["tests.off.yaml"].config.formats == []
    assert "delta listed twice" in str(entries["tests.twice.yaml"].error)
    assert "field 'formats.0': Input should be 'delta' or 'iceberg'" in str(entries["tests.bad.yaml"].error)
    (registry / "tests" / "_database.yaml").unlink()
    assert {e.path.name: e.config.formats for e in load_registry(registry) if e.config}["tests.plain.yaml"] == []


# ------------------------------------------------------------------------------ through the real steps
def land_rows(cfg: TableConfig, increment: str, rows: list[dict[str, Any]], types: dict[str, pa.DataType]) -> None:
    """One change file in ``increment``, as the replicator lands it."""
    target = Path(Lake(cfg).layout.incremental) / increment
    target.mkdir(parents=True)
    cols = {name: pa.array([r.get(name) for r in rows], t) for name, t in types.items()}
    pq.write_table(pa.table(cols), target / "part-00000.parquet")


STUDENT = {"id": pa.int32(), "full_name": pa.string(), "op": pa.string(), "ts_ms": pa.int64()}


def rows_of(root: str, version: int | None = None, columns: tuple[str, ...] = ("id", "full_name")) -> list[tuple]:
    """Both readers must agree; rows as sorted tuples."""
    a = sorted(
        tuple(r[c] for c in columns) for r in deltalake.DeltaTable(root, version=version).to_pyarrow_table().to_pylist()
    )
    b = sorted(tuple(r[c] for c in columns) for r in pl.read_delta(root, version=version).to_dicts())
    assert a == b, f"delta-rs and polars disagree at version {version}: {a} != {b}"
    return a


def log_text(lake: Lake) -> str:
    """Everything the Delta log holds, as text: commit files, and each checkpoint's values."""
    parts = []
    for p in sorted(Path(delta.metadata_root(lake)).iterdir()):
        if p.name.endswith(".parquet"):
            parts.append(json.dumps(pq.read_table(p).to_pylist(), default=str))
        else:
            parts.append(p.read_text())
    return "\n".join(parts)


@pytest.mark.spark
@pytest.mark.metastore
def test_crash_before_the_delta_commit_then_rollback_erase_and_an_added_column(
    make_cfg: Any, runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import compact_once, finish_run

    from cdc_compaction.job.faults import ENV
    from cdc_compaction.operations.erase import erase
    from cdc_compaction.operations.travel import rollback
    from cdc_compaction.pipeline.plan import plan
    from cdc_compaction.pipeline.publish import publish
    from cdc_compaction.pipeline.tables import ensure_tables

    cfg = make_cfg(formats=["delta"], keep_versions=3, schema_changes="evolve")
    rt = runtime(cfg)
    ensure_tables(rt)
    lake = rt.lake
    root = delta.table_root(lake)
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
    assert rows_of(root) == [(1, "ann"), (2, "bob"), (3, "cid")]

    # Crash between the lake's commit and the Delta commit: the publish has happened all the same.
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
    from cdc_compaction.pipeline.validate import validate

    validate(rt, path)
    monkeypatch.setenv(ENV, f"formats.before_delta_commit@{cfg.qualified_name}=raise")
    before = formats.FAILURES[cfg.qualified_name]
    published = publish(rt, path)
    assert published["seq"] == 2 and lake.latest_commit().seq == 2
    assert "injected fault at formats.before_delta_commit" in published["formats"]["failed"]["delta"]
    assert formats.FAILURES[cfg.qualified_name] == before + 1
    assert delta.commit_seqs(lake) == {0: 0, 1: 1}, "no Delta commit 2 yet"
    assert rows_of(root) == [(1, "ann"), (2, "bob"), (3, "cid")], "readers see commit 1 whole"
    monkeypatch.delenv(ENV)
    # A re-run of publish (Airflow's retry) re-derives it, once; another re-run writes nothing.
    again = publish(rt, path)
    assert again["formats"] == {"failed": {}, "delta": {"written": [2], "started_at": None, "version": 2}}
    assert publish(rt, path)["formats"]["delta"]["written"] == []
    from cdc_compaction.pipeline.archive import archive

    archive(rt, path)
    assert delta.commit_seqs(lake) == {0: 0, 1: 1, 2: 2}
    assert rows_of(root) == [(1, "ann"), (2, "bobby")]
    assert rows_of(root, 1) == [(1, "ann"), (2, "bob"), (3, "cid")]

    # An added column (schema_changes: evolve): a metaData action, readers see the new column.
    land_rows(
        cfg,
        "increment_2026112202",
        [
            {"id": 4, "full_name": "dan", "op": "c", "ts_ms": 3, "email": "dan@example.com"},
        ],
        {**STUDENT, "email": pa.string()},
    )
    compact_once(rt, "r3")
    schema = deltalake.DeltaTable(root).schema()
    assert "email" in [f.name for f in schema.fields]
    assert rows_of(root, columns=("id", "full_name", "email")) == [
        (1, "ann", None),
        (2, "bobby", None),
        (4, "dan", "dan@example.com"),
    ]
    assert "email" not in [f.name for f in deltalake.DeltaTable(root, version=2).schema().fields]

    # A rollback is a new Delta commit carrying its own seq.
    rollback(cfg, 2, rt.metastore, by="test")
    # Commit 3's publish expired commit 0 (keep_versions: 3); a rollback deletes no version itself.
    assert delta.commit_seqs(lake) == {1: 1, 2: 2, 3: 3, 4: 4}
    assert rows_of(root) == [(1, "ann"), (2, "bobby")]
    assert [h.get("operation") for h in deltalake.DeltaTable(root).history(1)] == ["RESTORE"]

    # Erase: its commit is a Delta commit, and no erased value is left anywhere in the log.
    land_rows(cfg, "increment_2026112203", [{"id": 5, "full_name": "zelda-erased", "op": "c", "ts_ms": 5}], STUDENT)
    compact_once(rt, "r5")
    assert (5, "zelda-erased") in rows_of(root)
    assert "zelda-erased" in log_text(lake)  # a bound of commit 5's file: the test can see it
    erase(cfg, "id = 5", actor="test")
    live = lake.latest_commit()
    assert live.plan_id.startswith("erase-") and live.seq == 6
    assert sorted(delta.commit_seqs(lake)) == [4, 5, 6], "the kept commits (keep_versions: 3)"
    assert "zelda-erased" not in log_text(lake)
    for v in (5, 6):
        assert rows_of(root, v) == [(1, "ann"), (2, "bobby")]
    # The next publish appends after the regenerated log; still one version per commit.
    land_rows(cfg, "increment_2026112204", [{"id": 6, "full_name": "fay", "op": "c", "ts_ms": 6}], STUDENT)
    compact_once(rt, "r7")
    assert delta.commit_seqs(lake) == {v: v for v in (5, 6, 7)}
    assert rows_of(root) == [(1, "ann"), (2, "bobby"), (6, "fay")]
    _ = finish_run  # the steps above are finish_run's, split to crash between them


@pytest.mark.spark
@pytest.mark.metastore
def test_the_conformance_delta_readers_see_a_wrong_expectation_now_and_in_time_travel(
    inprocess: Any, tmp_path: Path
) -> None:
    """The Delta readers of the conformance runs can fail: a wrong expectation after commit 1 is a row diff
    there, and again at every later compaction when they travel back to commit 1."""
    from cdc_compaction.core.settings import PROJECT_ROOT
    from cdc_compaction.devtools import conformance as conf

    doc = json.loads((PROJECT_ROOT.parent / "shared" / "conformance" / "late_update_for_deleted_key.json").read_text())
    first = next(s for s in doc["steps"] if "compact" in s)["compact"]
    first["expect"][0]["full_name"] = "Mallory"
    path = tmp_path / "late_update_for_deleted_key.json"
    path.write_text(json.dumps(doc))
    readers = [conf.DeltaReader("delta-rs"), conf.DeltaReader("polars")]
    result = conf.run_scenario(
        conf.Scenario.load(path), inprocess, readers, tmp_path / "lake", suffix="_dneg", formats=["delta"]
    )
    text = "\n".join(result.failures)
    assert "step 2 compact (delta/delta-rs): base rows differ" in text
    assert "step 2 compact (delta/polars): base rows differ" in text
    # Version 1 read as of itself (step 2: VERSION AS OF the live commit) and from the later compactions.
    for step in (2, 4, 7):
        for engine in ("delta-rs", "polars"):
            assert f"step {step} compact (delta/{engine}): Delta version 1 (commit 1) differs" in text
    assert text.count("missing:    full_name='Mallory'") == 8
    # Without formats the Delta readers do not apply: the same run has nothing for them to check.
    plain = conf.run_scenario(conf.Scenario.load(path), inprocess, readers, tmp_path / "lake2", suffix="_dneg2")
    assert plain.ok, plain.failures


# ------------------------------------------------------------------------------ erase (hand-laid versions)
def _erase_table(tmp_path: Path, keep_versions: int = 2, fmt: str = "delta") -> tuple[TableConfig, Lake, list[str]]:
    """A ``formats: [<fmt>]`` table in a registry directory, versions 1-4 of :data:`STATES` archived and
    synced; the CLI's erase arguments for it.  ``robert`` is the bound (max) of versions 3 and 4, the kept ones."""
    import yaml
    from conftest import student_doc

    from cdc_compaction.core.registry import parse_table

    doc = student_doc(tmp_path / "lake", "people", formats=[fmt], keep_versions=keep_versions)
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "tests.people.yaml").write_text(yaml.safe_dump(doc))
    cfg = parse_table(doc)
    lake = Lake(cfg)
    claim(lake)
    for seq, names in enumerate(STATES[:4], start=1):
        write_version(lake, seq, names)
        lake.storage.write_text(lake.layout.archived_marker(seq), "")  # its run finished
    assert sync_up_to(cfg, lake, 4)["failed"] == {}
    return cfg, lake, ["erase", "tests.people", "--registry-dir", str(registry), "--where", "full_name = 'robert'"]


def test_an_erase_whose_delta_rebuild_fails_exits_non_zero_verify_reads_the_log_and_a_rerun_repairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37, defect 1: the reproduction ``CDC_FAULTS='formats.before_delta_commit@<t>=raise' erase``."""
    from cdc_compaction.cli.main import main
    from cdc_compaction.job.faults import ENV

    cfg, lake, args = _erase_table(tmp_path)
    log_dir = Path(delta.metadata_root(lake))
    saved = tmp_path / "saved_log"
    shutil.copytree(log_dir, saved)
    checkpoint = saved / f"{3:020d}.checkpoint.parquet"
    assert "robert" in json.dumps(pq.read_table(checkpoint).to_pylist()), "a bound there: the test can see it"

    monkeypatch.setenv(ENV, f"formats.before_delta_commit@{cfg.qualified_name}=raise")
    assert main([*args, "--yes"]) != 0
    err = capsys.readouterr().err
    assert cfg.qualified_name in err and "_delta_log" in err and "run the same erase again" in err
    monkeypatch.delenv(ENV)

    # Whatever is left of the log, --verify searches it: a checkpoint holding the value fails it, and so does
    # a commit file.
    log_dir.mkdir(parents=True, exist_ok=True)
    for p in saved.glob("*.checkpoint.parquet"):
        shutil.copy(p, log_dir / p.name)
    assert main([*args, "--verify"]) == 1
    capsys.readouterr()
    for p in log_dir.iterdir():
        p.unlink()
    shutil.copy(saved / f"{4:020d}.json", log_dir / f"{4:020d}.json")
    assert main([*args, "--verify"]) == 1
    capsys.readouterr()
    shutil.rmtree(log_dir)

    # The same erase run again finishes: the log is rebuilt, readable at every kept version, sizes true.
    assert main([*args, "--yes"]) == 0
    capsys.readouterr()
    assert main([*args, "--verify"]) == 0
    root = delta.table_root(lake)
    want = [{i: n for i, n in s.items() if n != "robert"} for s in STATES[:4]]
    assert lake.commit_seqs() == [1, 2, 3, 4, 5], "the erase is commit 5: versions 4 and 5 are kept"
    assert delta_rows(root, 4) == want[3] and polars_rows(root, 4) == want[3]
    assert delta_rows(root, 5) == want[3] and polars_rows(root, 5) == want[3], "the erase's own version"
    assert "robert" not in log_text(lake)
    for add in pa.table(deltalake.DeltaTable(root).get_add_actions(flatten=True)).to_pylist():
        assert add["size_bytes"] == os.path.getsize(os.path.join(root, add["path"])), add["path"]


# ------------------------------------------------------------------------------ time travel by timestamp
def committed_ms(seq: int) -> int:
    """When :func:`write_version` says version ``seq`` was committed (its record's ``committed_at``), in ms."""
    from datetime import UTC, datetime

    return int(datetime(2026, 11, 20 + seq, 10, 0, tzinfo=UTC).timestamp() * 1000)


def test_timestamp_travel_finds_each_version_by_its_commit_time_after_a_late_sync_and_a_regenerate(
    make_cfg: Any,
) -> None:
    """Issue 37, defect 2: readers travel by a commit file's time (delta-rs: its modification time, the
    protocol's timestamp without in-commit timestamps); a sync that comes late, or the rewrite of the whole
    log after an erase, must not re-stamp a version with the time it was written."""
    from datetime import UTC, datetime, timedelta

    cfg = make_cfg(formats=["delta"], keep_versions=4)
    lake = Lake(cfg)
    claim(lake)
    root = delta.table_root(lake)
    for seq, names in enumerate(STATES[:4], start=1):
        write_version(lake, seq, names)
    assert sync_up_to(cfg, lake, 4)["failed"] == {}  # late: days after the commits

    def check() -> None:
        for seq in range(1, 5):
            at = datetime.fromtimestamp(committed_ms(seq) / 1000, UTC)
            for when in (at, at + timedelta(hours=12)):
                dt = deltalake.DeltaTable(root)
                dt.load_as_version(when)
                assert dt.version() == seq, f"as of {when}: version {dt.version()}, not {seq}"
                assert delta_rows(root, dt.version()) == STATES[seq - 1]
            assert pl.read_delta(root, version=at).select("id", "full_name").height == len(STATES[seq - 1])
        history = {h["version"]: h["timestamp"] for h in deltalake.DeltaTable(root).history()}
        assert {v: history[v] for v in range(1, 5)} == {v: committed_ms(v) for v in range(1, 5)}

    check()
    formats.regenerate_formats(rt_of(cfg, lake))  # what an erase does after rewriting files
    check()


# ------------------------------------------------------------------------------ rollback and the schema
def test_a_rollback_past_an_added_column_keeps_the_column_in_the_delta_schema(make_cfg: Any) -> None:
    """Issue 37, defect 3: version 2 added ``email``; version 3 rolls back to version 1's rows (its record has
    version 1's columns).  The Delta schema keeps ``email`` (null in the rolled-back rows), as the lake's
    table does: no version's metaData drops a column for the next commit to add back."""
    cfg = make_cfg(formats=["delta"], keep_versions=5, schema_changes="evolve")
    lake = Lake(cfg)
    claim(lake)
    root = delta.table_root(lake)
    write_version(lake, 1, STATES[0])
    write_version(lake, 2, STATES[1], email=True)
    assert sync_up_to(cfg, lake, 2)["failed"] == {}
    write_version(lake, 3, STATES[0], rollback_to=1)
    assert sync_up_to(cfg, lake, 3)["failed"] == {}
    write_version(lake, 4, STATES[2], email=True)
    assert sync_up_to(cfg, lake, 4)["failed"] == {}
    names = {v: [f.name for f in deltalake.DeltaTable(root, version=v).schema().fields] for v in (1, 2, 3, 4)}
    assert "email" not in names[1]
    assert all("email" in names[v] for v in (2, 3, 4)), names
    assert names[3] == names[2] == names[4], "the rollback neither drops nor moves a column"
    for engine in ("delta-rs", "polars"):
        if engine == "delta-rs":
            rows = deltalake.DeltaTable(root, version=3).to_pyarrow_table(columns=["id", "email"]).to_pylist()
        else:
            rows = pl.read_delta(root, version=3).select("id", "email").to_dicts()
        assert sorted((r["id"], r["email"]) for r in rows) == [(i, None) for i in sorted(STATES[0])], engine
    rows = deltalake.DeltaTable(root, version=4).to_pyarrow_table(columns=["id", "email"]).to_pylist()
    assert sorted((r["id"], r["email"]) for r in rows) == [(i, f"{n}@x") for i, n in sorted(STATES[2].items())]


def test_an_expired_version_fails_in_readers_as_the_docs_say(make_cfg: Any) -> None:
    """Issue 37, defect 4: docs/formats.md quotes what delta-rs and polars say for a version retention expired
    (the log has no commit file for it any more), and that a version never written says something else."""
    from cdc_compaction.core.settings import PROJECT_ROOT

    cfg = make_cfg(formats=["delta"], keep_versions=2)
    lake = Lake(cfg)
    claim(lake)
    root = delta.table_root(lake)
    for seq, names in enumerate(STATES[:4], start=1):
        write_version(lake, seq, names)
    sync_up_to(cfg, lake, 4)
    docs = " ".join((PROJECT_ROOT / "docs" / "formats.md").read_text().split())
    with pytest.raises(Exception, match="No files in log segment"):
        deltalake.DeltaTable(root, version=2)
    with pytest.raises(Exception, match="No files in log segment"):
        pl.read_delta(root, version=2)
    assert '"No files in log segment"' in docs
    with pytest.raises(Exception, match="LogSegment end version 4 not the same as the specified end version 9"):
        deltalake.DeltaTable(root, version=9)
    assert '"LogSegment end version <newest> not the same as the specified end version <N>"' in docs


def test_a_regeneration_that_crashed_midway_is_finished_by_the_next_sync(
    make_cfg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37, defect 1: an erase's log rewrite that dies after its first file (a kill: nothing deletes the
    log) leaves commit files with the old sizes and bounds; the next publish's sync must write the log anew,
    not append to it (a stale size reads as "Parquet magic bytes not found in footer")."""
    from cdc_compaction.job.faults import ENV, InjectedFaultError

    cfg = make_cfg(formats=["delta"], keep_versions=3)
    lake = Lake(cfg)
    claim(lake)
    root = delta.table_root(lake)
    for seq, names in enumerate(STATES[:3], start=1):
        write_version(lake, seq, names)
    sync_up_to(cfg, lake, 3)
    # Erase id 2 ("bob", "bobby", "robert") by hand from every version's file, as erase does in place.
    for seq in (1, 2, 3):
        f = Path(lake.layout.data_dir(f"v{seq:08d}-p{seq}-a1")) / "part-0.parquet"
        t = pq.read_table(f)
        pq.write_table(t.filter(pa.array([i != 2 for i in t["id"].to_pylist()])), f)
    kept = formats.kept_commits(lake, 3, cfg.keep_versions)
    monkeypatch.setenv(ENV, f"formats.before_delta_commit@{cfg.qualified_name}=raise")
    with pytest.raises(InjectedFaultError):
        delta.regenerate(rt_of(cfg, lake), lake, kept)  # dies where a kill would: nothing cleans up after it
    monkeypatch.delenv(ENV)
    write_version(lake, 4, {i: n for i, n in STATES[3].items() if i != 2})  # the next compaction
    assert sync_up_to(cfg, lake, 4)["failed"] == {}
    for seq in (2, 3, 4):  # the kept versions (keep_versions: 3)
        want = {i: n for i, n in STATES[seq - 1].items() if i != 2}
        assert delta_rows(root, seq) == want
        assert polars_rows(root, seq) == want
    assert not any(n in log_text(lake) for n in ("bobby", "robert"))
    for add in pa.table(deltalake.DeltaTable(root).get_add_actions(flatten=True)).to_pylist():
        assert add["size_bytes"] == os.path.getsize(os.path.join(root, add["path"])), add["path"]


# ------------------------------------------------------------------------------ partitioned: stats, not partitions
def _old_partitioned_log(lake: Lake, root: str, versions: int) -> None:
    """The log as it was written before issue 37 item 4: ``_cdc_partition`` the Delta partition column (in the
    schema, each add's ``partitionValues``), one commit per version replacing the previous version's files."""
    schema = {
        "type": "struct",
        "fields": [
            {"name": n, "type": t, "nullable": True, "metadata": {}}
            for n, t in (("id", "integer"), ("full_name", "string"), ("_cdc_partition", "string"))
        ],
    }
    meta = {
        "id": "old-table",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(schema),
        "partitionColumns": ["_cdc_partition"],
        "configuration": {},
        "createdTime": committed_ms(1),
    }
    log_dir = Path(delta.metadata_root(lake))
    log_dir.mkdir(parents=True)
    previous: list[dict[str, Any]] = []
    for v in range(versions + 1):
        adds = []
        if v:
            for f in sorted(Path(lake.layout.data_dir(f"v{v:08d}-p{v}-a1")).rglob("*.parquet")):
                part = f.parent.name.split("=", 1)[1]
                rel = os.path.relpath(f, root)
                adds.append(
                    {
                        "path": rel,
                        "partitionValues": {"_cdc_partition": part},
                        "size": f.stat().st_size,
                        "modificationTime": committed_ms(v),
                        "dataChange": True,
                    }
                )
        actions: list[dict[str, Any]] = [{"commitInfo": {"timestamp": committed_ms(max(v, 1)), "cdc.commit_seq": v}}]
        if v == 0:
            actions += [{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, {"metaData": meta}]
        actions += [{"remove": {"path": a["path"], "dataChange": True, "deletionTimestamp": 0}} for a in previous]
        actions += [{"add": a} for a in adds]
        (log_dir / f"{v:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
        previous = adds


def test_an_old_partitioned_log_is_written_anew_by_the_next_sync_and_reads_the_same_at_every_version(
    make_cfg: Any,
) -> None:
    """Issue 37 item 4 (c): a log whose partition column is ``_cdc_partition`` (written before) is regenerated
    unpartitioned, with the real column's stats, and every kept version reads as before."""
    cfg = make_cfg(formats=["delta"], keep_versions=5, partition_by={"column": "id", "transform": "identity"})
    lake = Lake(cfg)
    claim(lake)
    root = delta.table_root(lake)
    for seq, names in enumerate(STATES[:3], start=1):
        write_version(lake, seq, names, partitioned=True)
    _old_partitioned_log(lake, root, 3)
    assert deltalake.DeltaTable(root, version=2).metadata().partition_columns == ["_cdc_partition"]
    write_version(lake, 4, STATES[3], partitioned=True)
    assert sync_up_to(cfg, lake, 4)["failed"] == {}
    for v in range(0, 5):
        dt = deltalake.DeltaTable(root, version=v)
        assert dt.metadata().partition_columns == [], v
        assert "_cdc_partition" not in [f.name for f in dt.schema().fields], v
        assert delta_rows(root, v) == (STATES[v - 1] if v else {})
        assert polars_rows(root, v) == (STATES[v - 1] if v else {})
        adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        assert all(a["min.id"] is not None for a in adds), "every add has the real column's stats"
    assert delta.commit_seqs(lake) == {v: v for v in range(5)}


def _ts(text: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(text)


def _naive_utc(v: Any) -> Any:
    """A timestamp (datetime or pandas') as a naive UTC datetime, so delta-rs' and pyarrow's compare; else ``v``."""
    from datetime import UTC

    if not hasattr(v, "isoformat") or not hasattr(v, "hour"):
        return v
    t = _ts(str(v))
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo else t


def _floor_ms(t: Any) -> Any:
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def _ceil_ms(t: Any) -> Any:
    from datetime import timedelta

    return _floor_ms(t) + (timedelta(milliseconds=1) if t.microsecond % 1000 else timedelta(0))


#: id, region, changed_at: NULL and '' share the lake's ``__null__`` partition (one file), as do a day's rows.
SKIP_ROWS = [
    (1, "DE", "2026-11-01T10:00:00.000500+00:00"),
    (2, "DE", "2026-11-01T10:00:00.000200+00:00"),
    (3, "vip", "2026-11-02T00:00:00+00:00"),
    (4, "", None),
    (5, None, None),
]
#: (partition_by, [(Delta predicate, Spark predicate, which rows match)]).
SKIP_CASES = {
    "region": (
        {"column": "region", "transform": "identity"},
        [
            ("region = 'DE'", "region = 'DE'", lambda r: r[1] == "DE"),
            ("region = ''", "region = ''", lambda r: r[1] == ""),
            ("region IS NULL", "region IS NULL", lambda r: r[1] is None),
        ],
    ),
    "changed_at_day": (
        {"column": "changed_at", "transform": "day"},
        [
            # Above the file's millisecond-truncated max (10:00:00.000) but below its true max (.000500).
            (
                "changed_at > '2026-11-01T10:00:00.000400Z'",
                "changed_at > TIMESTAMP '2026-11-01 10:00:00.000400'",
                lambda r: (
                    r[2] is not None and _naive_utc(_ts(r[2])) > _naive_utc(_ts("2026-11-01T10:00:00.000400+00:00"))
                ),
            ),
            ("changed_at IS NULL", "changed_at IS NULL", lambda r: r[2] is None),
        ],
    ),
}


@pytest.mark.spark
@pytest.mark.metastore
@pytest.mark.parametrize("case", sorted(SKIP_CASES))
def test_a_partitioned_tables_delta_readers_skip_files_by_the_real_column(
    case: str, make_cfg: Any, runtime: Any, spark: Any
) -> None:
    """Issue 37 item 4 (a, b): the Delta table is unpartitioned and each add carries exact stats of the real
    partition column (timestamps: min floored and max ceiled to the millisecond; the job writes INT96), so a
    reader filtering by that column reads only the files holding matches, and sees the Hive base's rows:
    '' as '', NULL as NULL."""
    from conftest import compact_once

    from cdc_compaction.core.names import table_names
    from cdc_compaction.pipeline.tables import ensure_tables
    from pipeline.helpers import REGION_COLUMNS

    part, predicates = SKIP_CASES[case]
    columns = [*REGION_COLUMNS, {"name": "changed_at", "type": "timestamp"}]
    cfg = make_cfg(formats=["delta"], columns=columns, partition_by=part)
    rt = runtime(cfg)
    ensure_tables(rt)
    rows = [{"id": i, "region": r, "full_name": "x", "op": "c", "ts_ms": 1, "changed_at": c} for i, r, c in SKIP_ROWS]
    for row in rows:
        row["changed_at"] = None if row["changed_at"] is None else _ts(row["changed_at"])
    types = {"id": pa.int32(), "region": pa.string(), "full_name": pa.string(), "op": pa.string()}
    land_rows(
        cfg, "increment_2026112200", rows, {**types, "ts_ms": pa.int64(), "changed_at": pa.timestamp("us", "UTC")}
    )
    compact_once(rt, "r1")

    root = delta.table_root(Lake(cfg))
    dt = deltalake.DeltaTable(root)
    assert dt.metadata().partition_columns == []
    assert "_cdc_partition" not in [f.name for f in dt.schema().fields]
    col = part["column"]
    in_file: dict[str, list[tuple[Any, ...]]] = {}
    for a in pa.table(dt.get_add_actions(flatten=True)).to_pylist():
        path = os.path.join(root, a["path"])
        t = pq.read_table(path, columns=["id", "region", "changed_at"]).to_pylist()
        in_file[path] = [(r["id"], r["region"], r["changed_at"] and r["changed_at"].isoformat()) for r in t]
        values = [r[col] for r in t if r[col] is not None]
        assert a[f"null_count.{col}"] == len(t) - len(values), path
        if not values:
            continue
        lo, hi = min(values), max(values)
        if col == "changed_at":  # Delta's timestamp stats are milliseconds: the bounds widen, never narrow
            lo, hi = _floor_ms(lo), _ceil_ms(hi)
        assert (_naive_utc(a[f"min.{col}"]), _naive_utc(a[f"max.{col}"])) == (_naive_utc(lo), _naive_utc(hi)), path

    base = f"`{cfg.database}`.`{table_names(cfg)['base_table']}`"
    for delta_pred, spark_pred, match in predicates:
        read = set(dt.file_uris(file_pruning_predicate=delta_pred))
        assert read == {p for p, rs in in_file.items() if any(map(match, rs))}, delta_pred
        got = dt.to_pyarrow_dataset(file_pruning_predicate=delta_pred).to_table(columns=["id", "region", "changed_at"])
        seen = sorted(
            (r["id"], r["region"])
            for r in got.to_pylist()
            if match((r["id"], r["region"], r["changed_at"] and r["changed_at"].isoformat()))
        )
        want = sorted(
            (r["id"], r["region"]) for r in spark.sql(f"SELECT id, region FROM {base} WHERE {spark_pred}").collect()
        )
        assert seen == want and want, delta_pred


def test_timestamp_partition_bounds_are_the_footers_or_the_values_widened_to_the_millisecond(make_cfg: Any) -> None:
    """Issue 37 item 4 (a): a timestamp partition column's bounds, whatever its Parquet type: INT64 (the footer
    has min/max) and INT96 (Spark's default: no usable min/max, the values are read); all-NULL: a null count."""
    from datetime import UTC, datetime

    columns = [
        {"name": "id", "type": "int"},
        {"name": "changed_at", "type": "timestamp"},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": "bigint"},
    ]
    cfg = make_cfg(formats=["delta"], columns=columns, partition_by={"column": "changed_at", "transform": "day"})
    lake = Lake(cfg)
    claim(lake)
    version = "v00000001-p1-a1"
    data = Path(lake.layout.data_dir(version))
    days = {  # partition -> (its timestamps, INT96?)
        "2026-11-01": ([datetime(2026, 11, 1, 9, 0, 0, 1500, UTC), datetime(2026, 11, 1, 9, 0, 0, 7999, UTC)], False),
        "2026-11-02": (
            [datetime(2026, 11, 2, 0, 0, 0, 999, UTC), None, datetime(2026, 11, 2, 3, 0, 0, 2001, UTC)],
            True,
        ),
        "__null__": ([None, None], True),
    }
    partitions, n = {}, 0
    for day, (stamps, int96) in days.items():
        d = data / f"_cdc_partition={day}"
        d.mkdir(parents=True)
        table = pa.table(
            {
                "id": pa.array(range(n, n + len(stamps)), pa.int32()),
                "changed_at": pa.array(stamps, pa.timestamp("us", "UTC")),
                "op": ["c"] * len(stamps),
                "ts_ms": pa.array([1] * len(stamps), pa.int64()),
            }
        )
        pq.write_table(table, d / "part-0.parquet", use_deprecated_int96_timestamps=int96)
        partitions[day], n = str(d), n + len(stamps)
    Path(lake.layout.tombstones_dir(version)).mkdir(parents=True)
    assert lake.try_commit(
        Commit(seq=1, version=version, plan_id="p1", run_id="test", parent_seq=0, files=[], increments=[],
               stats={"output_visible_rows": n}, committed_at="2026-11-21T10:00:00+00:00", partitions=partitions,
               partition_rows={p: 0 for p in partitions})
    )  # fmt: skip
    assert sync_up_to(cfg, lake, 1)["failed"] == {}
    dt = deltalake.DeltaTable(delta.table_root(lake))
    got = {a["path"].split("=")[1].split("/")[0]: a for a in pa.table(dt.get_add_actions(flatten=True)).to_pylist()}
    for day, (stamps, _) in days.items():
        values = [t for t in stamps if t is not None]
        a = got[day]
        assert a["null_count.changed_at"] == len(stamps) - len(values), day
        if not values:
            assert a["min.changed_at"] is None and a["max.changed_at"] is None, day
            continue
        want = (_naive_utc(_floor_ms(min(values))), _naive_utc(_ceil_ms(max(values))))
        assert (_naive_utc(a["min.changed_at"]), _naive_utc(a["max.changed_at"])) == want, day
