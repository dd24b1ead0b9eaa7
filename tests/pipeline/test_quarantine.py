"""Quarantine that people can use: manifests with reasons, and re-ingesting after a fix (the CLI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import PROJECT_ROOT, compact_once, student_doc, visible_names

from cdc_compaction.cli.main import main
from cdc_compaction.core.exceptions import QuarantineError
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.devtools.conformance import land
from cdc_compaction.integrations.engine import SessionEngine
from cdc_compaction.job import faults
from cdc_compaction.job.faults import InjectedFaultError
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.quarantine import Quarantine
from cdc_compaction.pipeline.runtime import Runtime, load_plan
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import validate

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


@pytest.fixture
def table(tmp_path: Path, spark: Any, endpoint: MetastoreEndpoint) -> Callable[..., Runtime]:
    """A table with its registry file on disk, so the CLI finds it like an operator would."""

    def _make(name: str, **overrides: Any) -> Runtime:
        doc = student_doc(tmp_path / "lake", name, **overrides)
        registry = tmp_path / "registry"
        registry.mkdir(exist_ok=True)
        (registry / f"tests.{name}.yaml").write_text(yaml.safe_dump(doc))
        cfg = parse_table(doc)
        return Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=SessionEngine(spark))

    return _make


def _cli(rt: Runtime, tmp_path: Path, *args: str) -> int:
    return main([args[0], args[1], rt.cfg.qualified_name, *args[2:], "--registry-dir", str(tmp_path / "registry")])


def test_refused_rows_have_a_manifest_and_come_back_after_a_registry_fix(
    table, tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    rt = table("q_rows")
    ensure_tables(rt)
    rows = [
        {"id": 1, "full_name": "Alice", "op": "c", "ts_ms": 1},
        {"id": 2, "full_name": "Bob", "op": "U", "ts_ms": 2},  # an op code the registry does not know yet
        {"id": None, "full_name": "nobody", "op": "c", "ts_ms": 3},
        {"id": 3, "full_name": "Carol", "op": "c", "ts_ms": None},
    ]
    land(rt.cfg, "increment_2026112200", [rows])
    assert compact_once(rt, "r1")
    stats = rt.lake.latest_commit().stats
    assert stats["rejected_rows"] == 3 and stats["rejected_by_file"] == {"increment_2026112200/part-00000.parquet": 3}
    assert visible_names(spark, rt.cfg) == {1: "Alice"}

    (entry,) = Quarantine(rt.lake).entries()
    version = rt.lake.latest_commit().version
    assert entry.id == f"rows/{version}" and entry.count == 3 and entry.reingested_at is None
    manifest = json.loads((Path(entry.path) / "_manifest.json").read_text())
    assert manifest["rows"] == 3 and manifest["commit"] == 1 and sum(manifest["by_reason"].values()) == 3
    kept = pq.read_table(entry.path).to_pylist()
    assert {r["full_name"] for r in kept} == {"Bob", "nobody", "Carol"}
    assert all(r["_cdc_reject_reason"] and r["_cdc_increment"] == "increment_2026112200" for r in kept)

    assert _cli(rt, tmp_path, "quarantine", "list") == 0
    listing = capsys.readouterr().out
    assert entry.id in listing and "waiting" in listing and "1 quarantine entries" in listing

    # The fix: the source's op code 'U' is an update, and the rows with nulls get corrected by hand.
    fixed_doc = yaml.safe_load((tmp_path / "registry" / "tests.q_rows.yaml").read_text())
    fixed_doc["op_codes"] = {"update": "U"}
    (tmp_path / "registry" / "tests.q_rows.yaml").write_text(yaml.safe_dump(fixed_doc))
    corrected = pa.Table.from_pylist(
        [{**r, "id": 4 if r["id"] is None else r["id"], "ts_ms": r["ts_ms"] or 3} for r in kept]
    )
    pq.write_table(corrected, tmp_path / "corrected.parquet")
    assert _cli(rt, tmp_path, "quarantine", "reingest", entry.id, "--from", str(tmp_path / "corrected.parquet")) == 0
    assert "re-ingested" in capsys.readouterr().out
    landed = sorted((Path(rt.lake.layout.incremental) / "increment_2026112200").iterdir())
    assert [p.name for p in landed] == [f"reingest-{landed[0].name.split('-')[1]}-00000.parquet"]

    fixed = Runtime(
        cfg=parse_table(fixed_doc),
        lake=Lake(parse_table(fixed_doc)),
        metastore=rt.metastore,
        engine=rt.engine,
    )
    assert compact_once(fixed, "r2")
    assert fixed.lake.latest_commit().stats["rejected_rows"] == 0
    assert visible_names(spark, fixed.cfg) == {1: "Alice", 2: "Bob", 3: "Carol", 4: "nobody"}
    (again,) = Quarantine(fixed.lake).entries()
    assert again.reingested_at is not None
    with pytest.raises(QuarantineError, match="was re-ingested at"):
        Quarantine(fixed.lake).reingest(entry.id)


def test_quarantined_files_come_back_after_the_source_fixed_them(table, tmp_path: Path, spark: Any) -> None:
    rt = table("q_files", on_bad_file="quarantine")
    ensure_tables(rt)
    (good,) = land(rt.cfg, "increment_2026112200", [[{"id": 1, "full_name": "Alice", "op": "c", "ts_ms": 1}]])
    broken = Path(good).with_name("part-00001.parquet")
    broken.write_bytes(Path(good).read_bytes()[:-30])  # truncated by the sink
    compact_once(rt, "r1")
    (entry,) = Quarantine(rt.lake).entries()
    assert entry.kind == "files" and "not readable as Parquet" in json.dumps(
        json.loads((Path(entry.path) / "_manifest.json").read_text())
    )
    # Re-ingesting the broken copy as it is would only be refused again; the source resends it fixed.
    fixes = tmp_path / "fixes" / "increment_2026112200"
    fixes.mkdir(parents=True)
    pq.write_table(
        pa.table({"id": pa.array([2], pa.int32()), "full_name": ["Bob"], "op": ["c"], "ts_ms": pa.array([1])}),
        fixes / "part-00001.parquet",
    )
    with pytest.raises(QuarantineError, match="does not exist"):
        Quarantine(rt.lake).reingest(entry.id, source=str(tmp_path / "elsewhere"))
    assert _cli(rt, tmp_path, "quarantine", "reingest", entry.id, "--from", str(tmp_path / "fixes")) == 0
    assert broken.exists(), "back under its own name"
    compact_once(rt, "r2")
    assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob"}
    assert Quarantine(rt.lake).entries()[0].reingested_at is not None


def test_unknown_entry_is_a_clear_error(table) -> None:
    rt = table("q_none")
    with pytest.raises(QuarantineError, match=r"has no quarantine entry 'rows/v9'.*quarantine list"):
        Quarantine(rt.lake).reingest("rows/v9")


def _refused_rows_entry(rt: Runtime) -> str:
    """One compaction that refuses a row (unknown op code): the id of its quarantine entry."""
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [[{"id": 1, "full_name": "Alice", "op": "X", "ts_ms": 1}]])
    assert compact_once(rt, "r1")
    (entry,) = Quarantine(rt.lake).entries()
    return entry.id


@pytest.mark.parametrize(
    "target",
    [
        pytest.param("increment_2026112200/../../base/{live}", id="dot-dot-into-the-live-version"),
        pytest.param("../base", id="parent"),
        pytest.param("increment_202611229", id="not-zero-padded"),
        pytest.param("hourly_2026112200", id="other-layout"),
    ],
)
def test_reingest_refuses_targets_outside_the_increments(
    table, tmp_path: Path, spark: Any, target: str, request: pytest.FixtureRequest
) -> None:
    # One table per case: the metastore outlives the case's lake, and a table whose storage root moved is refused.
    rt = table("q_target_" + request.node.callspec.id.replace("-", "_"))
    entry_id = _refused_rows_entry(rt)
    kept = pq.read_table(Path(rt.lake.layout.quarantine) / entry_id).to_pylist()
    target = target.format(live=rt.lake.latest_commit().version)
    bad = pa.Table.from_pylist([{**r, "op": "c", "_cdc_increment": target} for r in kept])
    pq.write_table(bad, tmp_path / "bad.parquet")
    before = sorted(str(p) for p in Path(rt.lake.layout.root).rglob("*"))
    with pytest.raises(QuarantineError, match=r"is not an increment name of the layout .*Nothing was landed"):
        Quarantine(rt.lake).reingest(entry_id, source=str(tmp_path / "bad.parquet"))
    after = sorted(str(p) for p in Path(rt.lake.layout.root).rglob("*"))
    assert after == before, "nothing was written anywhere (least of all into the live version)"
    assert Quarantine(rt.lake).entries()[0].reingested_at is None
    assert visible_names(spark, rt.cfg) == {}


def _reingest_killed_after_the_first_file(rt: Runtime, tmp_path: Path, entry_id: str, source: Path) -> None:
    """``quarantine reingest`` in its own process, SIGKILLed at the fault point after the first file."""
    env = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT / "plugins"),
        faults.ENV: f"quarantine.after_first_reingested_file@{rt.cfg.qualified_name}=kill",
    }
    cmd = [sys.executable, "-m", "cdc_compaction", "quarantine", "reingest", rt.cfg.qualified_name, entry_id]
    cmd += ["--from", str(source), "--registry-dir", str(tmp_path / "registry")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr


@pytest.mark.parametrize("runs_in_between", [False, True], ids=["retried-at-once", "compacted-and-archived-first"])
def test_a_killed_reingest_is_finished_by_running_it_again(
    table, tmp_path: Path, spark: Any, runs_in_between: bool
) -> None:
    rt = table(f"q_resume_{int(runs_in_between)}", on_bad_file="quarantine")
    ensure_tables(rt)
    (good,) = land(rt.cfg, "increment_2026112200", [[{"id": 1, "full_name": "Alice", "op": "c", "ts_ms": 1}]])
    for n in (1, 2):
        Path(good).with_name(f"part-0000{n}.parquet").write_bytes(Path(good).read_bytes()[: -10 * n])
    compact_once(rt, "r1")
    (entry,) = Quarantine(rt.lake).entries()
    assert entry.count == 2
    fixes = tmp_path / "fixes" / "increment_2026112200"
    fixes.mkdir(parents=True)
    for n, name in ((1, "Bob"), (2, "Carol")):
        pq.write_table(
            pa.table({"id": pa.array([n + 1], pa.int32()), "full_name": [name], "op": ["c"], "ts_ms": pa.array([1])}),
            fixes / f"part-0000{n}.parquet",
        )
    _reingest_killed_after_the_first_file(rt, tmp_path, entry.id, tmp_path / "fixes")
    landed = Path(rt.lake.layout.incremental) / "increment_2026112200"
    assert sorted(p.name for p in landed.iterdir()) == ["part-00001.parquet"], "killed after the first file"
    assert Quarantine(rt.lake).entries()[0].reingested_at is None
    if runs_in_between:
        # The first file is taken by a run (r2) and archived by the next one (r3) before the retry.
        assert compact_once(rt, "r2")
        compact_once(rt, "r3")
        assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob"}
        assert not (landed / "part-00001.parquet").exists()
    # Finishing it with another source would land other files: refused, nothing landed.
    with pytest.raises(QuarantineError, match=r"interrupted re-ingest started at .*\(--from .*fixes\) to finish it"):
        Quarantine(rt.lake).reingest(entry.id)
    written = Quarantine(rt.lake).reingest(entry.id, source=str(tmp_path / "fixes"))
    assert sorted(Path(p).name for p in written) == ["part-00001.parquet", "part-00002.parquet"]
    assert Quarantine(rt.lake).entries()[0].reingested_at is not None
    # Every fixed row was landed exactly once: in the landing area or, compacted already, in the archive.
    copies = [
        p
        for where in (rt.lake.layout.incremental, rt.lake.layout.archive)
        for p in Path(where).rglob("part-0000[12].parquet")
    ]
    ids = sorted(i for p in copies for i in pq.read_table(p).column("id").to_pylist())
    assert ids == [2, 3], copies
    compact_once(rt, "r4")
    assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob", 3: "Carol"}


def test_rows_refused_by_a_publish_that_crashed_after_its_commit_record_are_listed(
    table, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rt = table("q_crash")
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [[{"id": 1, "full_name": "Alice", "op": "X", "ts_ms": 1}]])
    path = plan(rt, "r1")
    rt.engine.compact(load_plan(rt, path))  # type: ignore[attr-defined]
    validate(rt, path)
    monkeypatch.setenv(faults.ENV, f"publish.after_commit_record@{rt.cfg.qualified_name}=raise")
    with pytest.raises(InjectedFaultError, match=r"publish\.after_commit_record"):
        publish(rt, path)
    monkeypatch.delenv(faults.ENV)
    version = rt.lake.latest_commit().version
    manifest = Path(rt.lake.layout.quarantine_dir(version)) / "_manifest.json"
    assert not manifest.exists(), "the crash came before the manifest"
    # Committed: the row was refused for real, so the quarantine lists it -- before any retry.
    (entry,) = Quarantine(rt.lake).entries()
    assert entry.id == f"rows/{version}" and entry.count == 1
    assert entry.reasons == {"unknown_op": 1} and entry.reingested_at is None
    capsys.readouterr()
    assert _cli(rt, tmp_path, "quarantine", "list") == 0
    out = capsys.readouterr().out
    assert f"rows/{version}" in out and '{"unknown_op": 1}' in out and "1 quarantine entries" in out, out
    assert not manifest.exists(), "listing writes nothing"
    # It can be re-ingested as it is listed (the manifest is written then), and compacts after a fix.
    fixed = pa.Table.from_pylist([{**r, "op": "c"} for r in pq.read_table(manifest.parent).to_pylist()])
    pq.write_table(fixed, tmp_path / "fixed.parquet")
    assert len(Quarantine(rt.lake).reingest(entry.id, source=str(tmp_path / "fixed.parquet"))) == 1
    assert json.loads(manifest.read_text())["reingested_at"]
    publish(rt, path)  # the retry of the crashed task, then the rest of the run
    archive(rt, path)
    (entry,) = Quarantine(rt.lake).entries()
    assert entry.reingested_at is not None, "the retry keeps the re-ingested manifest"
    assert compact_once(rt, "r2")
    assert visible_names(spark, rt.cfg) == {1: "Alice"}
