"""Erase by predicate (README, "Erasing personal data"): predicate validation, conformance, crashes.

The lake is written with pyarrow through the lake's own commit API (no Spark): two versions, archived
and pending increments, quarantined rows and a quarantined file.  Every file's rows are kept in
``Sample.files``; the expected content after an erase is computed here from those rows and a plain
Python version of the predicate, never from the erase module.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import compact_once, first_version, student_doc, visible_names

from cdc_compaction.core.exceptions import ConcurrentRunError, EraseError, ErasePredicateError, is_permanent
from cdc_compaction.core.lake import Commit, Lake, TableLease
from cdc_compaction.core.ownership import claim
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.devtools.conformance import land
from cdc_compaction.job.faults import InjectedFaultError
from cdc_compaction.operations.erase import erase, finish_unfinished, parse_predicate, preview
from cdc_compaction.pipeline.quarantine import Quarantine
from cdc_compaction.pipeline.tables import ensure_tables

SCHEMA = pa.schema([("id", pa.int32()), ("full_name", pa.string()), ("op", pa.string()), ("ts_ms", pa.int64())])

WHERE = "id IN (3, 7) OR full_name = 'n9'"


def erased(row: dict[str, Any]) -> bool:
    """WHERE, written in Python."""
    return row["id"] in (3, 7) or row["full_name"] == "n9"


def row(i: int, op: str = "c") -> dict[str, Any]:
    return {"id": i, "full_name": f"n{i}", "op": op, "ts_ms": 1000 + i}


@dataclass
class Sample:
    cfg: TableConfig
    lake: Lake
    #: every Parquet file written, its location (as the README names them) and its rows
    files: dict[str, tuple[str, list[dict[str, Any]]]]


def _write(path: str, rows: list[dict[str, Any]], schema: pa.Schema = SCHEMA) -> None:
    os.makedirs(posixpath.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def build(root: Path) -> Sample:
    cfg = parse_table(student_doc(root, "people"))
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    files: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    versions = {1: "v00000001-plan1-a", 2: "v00000002-plan2-a"}
    contents = {
        1: {"data/part-0.parquet": [row(1), row(2), row(3)], "tombstones/part-0.parquet": [row(4, "d")]},
        2: {
            "data/part-0.parquet": [row(1), row(2), row(3), row(5)],
            "data/part-1.parquet": [row(6), row(7)],
            "tombstones/part-0.parquet": [row(4, "d")],
        },
    }
    archived = {1: [row(1), row(2), row(3), row(4, "d")], 2: [row(5), row(6), row(7)]}
    increments = {1: "increment_2026112200", 2: "increment_2026112201"}
    for seq, version in versions.items():
        for rel, rows in contents[seq].items():
            path = posixpath.join(lake.layout.version_dir(version), rel)
            _write(path, rows)
            files[path] = ("live" if seq == 2 else "versions", rows)
        arch = posixpath.join(lake.layout.archive, f"c{seq:08d}", increments[seq], "f0.parquet")
        _write(arch, archived[seq])
        files[arch] = ("archive", archived[seq])
        commit = Commit(
            seq=seq,
            version=version,
            plan_id=f"plan{seq}",
            run_id=f"run{seq}",
            parent_seq=seq - 1,
            files=[],
            increments=[increments[seq]],
            stats={"output_visible_rows": sum(len(r) for k, r in contents[seq].items() if k.startswith("data"))},
            committed_at=f"2026-11-22T0{seq}:10:00+00:00",
        )
        assert lake.try_commit(commit)
        lake.advance_pointer(commit)
        lake.storage.write_text(lake.layout.archived_marker(seq), "")
    pending = [[row(3), row(8)], [row(9)]]
    for path, rows in zip(land(cfg, "increment_2026112202", pending), pending, strict=True):
        files[path] = ("pending", rows)
    # Rows a compaction refused (with the reason column quarantine adds) and a whole refused file.
    qrows = [dict(row(7), _cdc_reject_reason="op: not one of c/u/d/r")]
    qpath = posixpath.join(lake.layout.quarantine_dir(versions[2]), "part-0.parquet")
    _write(qpath, qrows, SCHEMA.append(pa.field("_cdc_reject_reason", pa.string())))
    files[qpath] = ("quarantine", qrows)
    bad = land(cfg, "increment_2026112203", [[row(3), row(10)]])[0]
    moved = Quarantine(lake).set_aside_file(
        "p-0003-bad", "increment_2026112203", Path(bad).name, bad, Path(bad).stat().st_size, "test"
    )
    files[moved] = ("quarantine", [row(3), row(10)])
    return Sample(cfg, lake, files)


def read_rows(path: str) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def all_parquet(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and ".parquet" in p.name)


def assert_erased(sample: Sample, root: Path) -> None:
    """Every file holds its rows minus the erased ones; the live version is the erase version; nothing else."""
    lake = sample.lake
    for path, (_, rows) in sample.files.items():
        assert read_rows(path) == [r for r in rows if not erased(r)], path
    live = lake.latest_commit()
    assert live.seq == 3 and live.parent_seq == 2 and live.stats["kind"] == "erase"
    pointer = json.loads(Path(lake.layout.pointer).read_text())
    assert pointer["seq"] == 3 and pointer["location"] == lake.data_location(live)
    visible = sorted((r for p in all_parquet(Path(pointer["location"])) for r in read_rows(str(p))), key=str)
    expected = [r for r in (row(1), row(2), row(3), row(5), row(6), row(7)) if not erased(r)]
    assert visible == sorted(expected, key=str)
    assert read_rows(str(Path(pointer["tombstones"]) / "part-0.parquet")) == [row(4, "d")]
    # No hidden rewrite, journal or copy was left behind; no file anywhere holds an erased row.
    written = set(sample.files) | {str(p) for p in all_parquet(Path(lake.layout.version_dir(live.version)))}
    assert {str(p) for p in all_parquet(root)} == written
    assert not [r for p in all_parquet(root) for r in read_rows(str(p)) if erased(r)]
    # Every erase finished: only audit records and decision markers remain, no journal.
    control = Path(lake.layout.control, "erase")
    assert all(p.name.endswith((".audit.json", ".committed")) for p in control.iterdir())
    held = TableLease(lake).current()
    assert held is None or held.released


# ------------------------------------------------------------------------- predicates
TABLE = pa.Table.from_pylist(
    [row(1), row(2), {"id": 3, "full_name": None, "op": "u", "ts_ms": 5}, row(40)], schema=SCHEMA
)


@pytest.mark.parametrize(
    ("where", "expect"),
    [
        ("id = 2", lambda r: r["id"] == 2),
        ("ID in (1, 40)", lambda r: r["id"] in (1, 40)),
        ("full_name IS NULL", lambda r: r["full_name"] is None),
        ("NOT full_name IS NULL AND id BETWEEN 2 AND 40", lambda r: r["full_name"] is not None and 2 <= r["id"] <= 40),
        ("full_name <> 'n1'", lambda r: r["full_name"] is not None and r["full_name"] != "n1"),
        ("(id >= 40 OR ts_ms < 1002) AND op = 'c'", lambda r: (r["id"] >= 40 or r["ts_ms"] < 1002) and r["op"] == "c"),
        ("ts_ms > id", lambda r: r["ts_ms"] > r["id"]),
        ("id > -1 AND NOT (full_name = 'n2')", lambda r: r["full_name"] is not None and r["full_name"] != "n2"),
    ],
)
def test_predicate_selects_what_sql_would(make_cfg: Callable[..., TableConfig], where: str, expect: Any) -> None:
    # SQL's rule: a row whose predicate is NULL (full_name NULL compared to a string) is not erased.
    pred = parse_predicate(make_cfg(), where)
    import pyarrow.compute as pc

    got = TABLE.filter(pc.coalesce(pred.expression, False)).to_pylist()
    assert got == [r for r in TABLE.to_pylist() if expect(r)]


@pytest.mark.parametrize(
    ("where", "named"),
    [
        ("id = 1; DROP TABLE tests.people", "exactly one expression"),
        ("email = 'a@b'", "'email' is not a column"),
        ("lower(full_name) = 'n1'", "LOWER(full_name)"),
        ("id IN (SELECT id FROM other)", "only <column> IN (<literals>)"),
        ("1 = 1", "compares no column"),
        ("id = abs(ts_ms)", "'ABS(ts_ms)' is not a literal"),
        ("id * 1000 < ts_ms", "'id * 1000' is not a literal"),
        ("id = 'seven'", "is not a int (column id)"),
        ("t.id = 1", "qualified column"),
        ("", "empty"),
        ("id = 1 OR", "does not parse"),
        ("full_name LIKE 'n%'", "(Like) is not allowed"),
    ],
)
def test_predicate_refusals_name_the_token(make_cfg: Callable[..., TableConfig], where: str, named: str) -> None:
    cfg = make_cfg()
    with pytest.raises(ErasePredicateError) as err:
        parse_predicate(cfg, where)
    assert named in str(err.value) and cfg.qualified_name in str(err.value)
    assert "registry columns (id, full_name, op, ts_ms)" in str(err.value)
    assert is_permanent(err.value)  # a DAG task's retry cannot heal it


# ------------------------------------------------------------------------- conformance
def test_erase_removes_rows_everywhere_and_audits(tmp_path: Path) -> None:
    sample = build(tmp_path / "lake")
    before = {p: Path(p).read_bytes() for p in sample.files}
    shown = preview(sample.cfg, WHERE)
    assert {p: Path(p).read_bytes() for p in sample.files} == before  # a preview changes nothing
    expected_rows = {
        loc: 0 for loc in ("live", "versions", "pending", "archive", "quarantine", "changes", "rebuild", "other")
    }
    for loc, rows in sample.files.values():
        expected_rows[loc] += sum(1 for r in rows if erased(r))
    assert shown["rows"] == expected_rows

    audit = erase(sample.cfg, WHERE, actor="dpo@example.com")

    assert_erased(sample, tmp_path / "lake")
    assert audit["rows_removed"] == expected_rows
    assert sorted(audit["files_rewritten"]) == sorted(
        p for p, (_, rows) in sample.files.items() if any(erased(r) for r in rows)
    )
    # The predicate without its literals (the audit keeps no erased value), tied to the request by its hash.
    assert audit["actor"] == "dpo@example.com" and audit["commit_seq"] == 3
    assert audit["predicate"] == "id IN (?, ?) OR full_name = ?"
    assert audit["predicate_sha256"] == hashlib.sha256(WHERE.encode()).hexdigest()
    assert audit["os_user"]  # who ran it, beside who asked
    assert audit["verified"]["matching_files"] == {} and audit["verified"]["files_checked"] >= len(sample.files)
    stored = Path(sample.lake.layout.control, "erase", f"{audit['erase_id']}.audit.json").read_text()
    assert json.loads(stored) == audit
    # The audit names no erased value beyond the predicate's own text.
    for value in ("n3", "n7", "1003", "1007"):
        assert value not in stored

    # A second erase finds nothing: no new commit, an audit of zeros.
    again = erase(sample.cfg, WHERE, actor="dpo@example.com")
    assert again["rows_removed"] == dict.fromkeys(expected_rows, 0) and again["commit_seq"] is None
    assert sample.lake.latest_commit().seq == 3


def test_erase_waits_for_a_running_compaction(tmp_path: Path) -> None:
    sample = build(tmp_path / "lake")

    TableLease(sample.lake).acquire("airflow/run-1", timedelta(hours=1), datetime.now(UTC))
    before = {p: Path(p).read_bytes() for p in sample.files}
    with pytest.raises(ConcurrentRunError, match=r"tests\.people is being compacted"):
        erase(sample.cfg, WHERE)
    assert {p: Path(p).read_bytes() for p in sample.files} == before


# ------------------------------------------------------------------------- crashes
RAISE_POINTS = [
    "erase.after_first_rewrite",
    "erase.before_commit",
    "erase.after_commit_record",
    "erase.after_first_swap",
    "erase.before_audit",
]


@pytest.mark.parametrize("point", RAISE_POINTS)
def test_erase_crash_then_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    sample = build(tmp_path / "lake")
    monkeypatch.setenv("CDC_FAULTS", f"{point}=raise")
    with pytest.raises(InjectedFaultError):
        erase(sample.cfg, WHERE)
    monkeypatch.delenv("CDC_FAULTS")
    erase(sample.cfg, WHERE)
    assert_erased(sample, tmp_path / "lake")
    assert sample.lake.commit_seqs() == [1, 2, 3]  # one erase commit, whichever attempt made it


KILL_SCRIPT = """
import json, sys
from cdc_compaction.operations.erase import erase
from cdc_compaction.core.registry import parse_table
erase(parse_table(json.loads(sys.argv[1])), sys.argv[2], actor="killed")
"""


@pytest.mark.parametrize("point", ["erase.after_first_rewrite", "erase.after_commit_record", "erase.after_first_swap"])
def test_erase_killed_then_rerun(tmp_path: Path, point: str) -> None:
    sample = build(tmp_path / "lake")
    doc = student_doc(tmp_path / "lake", "people")
    env = dict(os.environ, CDC_FAULTS=f"{point}=kill")
    done = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, json.dumps(doc), WHERE], env=env, capture_output=True, check=False
    )
    assert done.returncode == -9, done.stderr.decode()
    # The killed erase still holds the lease, as a killed compaction does: an operator breaks it.
    with pytest.raises(ConcurrentRunError):
        erase(sample.cfg, WHERE)
    assert TableLease(sample.lake).break_(by="test") is not None
    erase(sample.cfg, WHERE)
    assert_erased(sample, tmp_path / "lake")
    assert sample.lake.commit_seqs() == [1, 2, 3]


def test_erase_refuses_while_the_live_commit_is_not_archived(tmp_path: Path) -> None:
    sample = build(tmp_path / "lake")
    Path(sample.lake.layout.archived_marker(2)).unlink()  # as if the run died between publish and archive
    before = {p: Path(p).read_bytes() for p in sample.files}
    with pytest.raises(EraseError, match=r"commit 2 \(v00000002-plan2-a\) is not archived yet.*Nothing was erased"):
        erase(sample.cfg, WHERE)
    assert {p: Path(p).read_bytes() for p in sample.files} == before
    assert sample.lake.commit_seqs() == [1, 2]
    held = TableLease(sample.lake).current()
    assert held is not None and held.released  # given back: the refusal does not block the next run


# ------------------------------------------------------------------------- with the real compaction
@pytest.mark.spark
@pytest.mark.metastore
def test_erase_between_real_compactions(make_cfg: Callable[..., TableConfig], runtime: Any, spark: Any) -> None:
    """Spark writes the versions; the erase commit sits between two runs; the next run builds on it."""
    rt = runtime(make_cfg(change_feed=True))
    ensure_tables(rt)

    def rows(*items: tuple[int, str, str, int]) -> list[dict[str, Any]]:
        return [{"id": i, "full_name": n, "op": op, "ts_ms": ts} for i, n, op, ts in items]

    land(rt.cfg, "increment_2026112200", [rows((1, "Alice", "c", 1), (2, "Bob", "c", 1), (3, "Carol", "c", 1))])
    compact_once(rt, "run-1")
    land(rt.cfg, "increment_2026112201", [rows((3, "Caroline", "u", 2), (4, "Dan", "c", 2))])
    compact_once(rt, "run-2")
    land(rt.cfg, "increment_2026112202", [rows((3, "Caro", "u", 3), (5, "Eve", "c", 3))])  # pending

    audit = erase(rt.cfg, "id = 3", actor="test")
    assert audit["commit_seq"] == 3 and audit["rows_removed"]["pending"] == 1 and audit["rows_removed"]["live"] == 1
    # <t>_changes: commit 1 inserted Carol, commit 2 updated her (update_before + update_after); each
    # commit's feed is twice on storage: as the job wrote it in its version, and as publish copied it.
    assert audit["rows_removed"]["changes"] == 2 * 3
    # Readers of the metastore still read version 2's location, whose files were rewritten in place.
    assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob", 4: "Dan"}
    compact_once(rt, "run-3")
    commit = rt.lake.latest_commit()
    assert commit.seq == 4 and commit.parent_seq == 3
    assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob", 4: "Dan", 5: "Eve"}
    root = Path(rt.lake.layout.root)
    assert not [r for p in all_parquet(root) for r in read_rows(str(p)) if r.get("id") == 3]
    # The erase commit's change (written by run-3's publish) diffs erased versions: no Carol there either;
    # commit 1's file went with its version (keep_versions 3: commits 2..4 are kept).
    assert sorted(p.name for p in (root / "changes").iterdir()) == [f"c{s:08d}.parquet" for s in (2, 3, 4)]

    # Issue 14: neither a rebuild from the archives nor a rollback to a version from before the
    # erase brings the erased rows back (the archives and the kept versions were erased too).
    from cdc_compaction.operations.travel import rollback
    from cdc_compaction.pipeline.rebuild import rebuild

    report = rebuild(rt)
    assert report.equal and report.rebuilt_rows == 4, report
    # The erase commit took no files: not run through the job (its archives were erased in place).
    assert (report.replayed, report.skipped) == ([1, 2, 4], [3])
    rebuilt = all_parquet(Path(report.location))
    assert rebuilt and not [r for p in rebuilt for r in read_rows(str(p)) if r.get("id") == 3]
    rollback(rt.cfg, 2, rt.metastore, by="test")
    assert rt.lake.latest_commit().seq == 5
    assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob", 4: "Dan"}, "version 2, as the erase left it"
    assert not [r for p in all_parquet(root) for r in read_rows(str(p)) if r.get("id") == 3]


def test_cli_preview_erase_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cdc_compaction.cli.main import main

    sample = build(tmp_path / "lake")
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "tests.people.yaml").write_text(yaml.safe_dump(student_doc(tmp_path / "lake", "people")))
    base = ["erase", "tests.people", "--registry-dir", str(registry), "--where", WHERE]

    assert main(base) == 0  # without --yes: a preview
    assert json.loads(capsys.readouterr().out.split("\nnothing was changed")[0])["rows"]["archive"] == 2
    assert sample.lake.commit_seqs() == [1, 2]
    assert main([*base, "--verify"]) == 1
    assert "files still hold rows matching" in capsys.readouterr().err

    assert main([*base, "--yes", "--actor", "dpo"]) == 0
    assert json.loads(capsys.readouterr().out)["actor"] == "dpo"
    assert main([*base, "--verify"]) == 0
    capsys.readouterr()

    # A writer outside the pipeline lands an erased person again: verification says where.
    late = land(sample.cfg, "increment_2026112204", [[row(7)]])[0]
    assert main([*base, "--verify"]) == 1
    assert late in json.loads(capsys.readouterr().out)["matching"]

    assert main(["erase", "tests.people", "--registry-dir", str(registry), "--where", "id = (SELECT 1)", "--yes"]) == 1
    assert main(["erase", "tests.people", "--registry-dir", str(registry), "--where", "nope = 1", "--yes"]) == 1
    err = capsys.readouterr().err
    assert "erase refused or failed" in err and "'nope' is not a column of the registry" in err


def test_a_committed_erase_whose_rewrites_were_lost_still_erases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash after the decision, then the hidden rewrites vanish: the roll-forward filters the originals."""
    sample = build(tmp_path / "lake")
    monkeypatch.setenv("CDC_FAULTS", "erase.after_commit_record=raise")
    with pytest.raises(InjectedFaultError):
        erase(sample.cfg, WHERE)
    monkeypatch.delenv("CDC_FAULTS")
    hidden = [p for p in all_parquet(tmp_path / "lake") if p.name.startswith(".") and ".erase-" in p.name]
    assert hidden
    for p in hidden:
        p.unlink()
    # The roll-forward alone (what the next erase does first), not a new scan, must finish the job.
    assert len(finish_unfinished(sample.lake)) == 1
    assert_erased(sample, tmp_path / "lake")


def test_files_without_suffix_are_erased_and_unreadable_ones_named(tmp_path: Path) -> None:
    sample = build(tmp_path / "lake")
    # A sink that lands Parquet without the suffix; a refused file that is not Parquet at all.
    bare = posixpath.join(sample.lake.layout.incremental, "increment_2026112202", "part-00009")
    _write(bare, [row(7), row(11)])
    broken = Path(sample.lake.layout.quarantined_files_dir("p-0009-bad"), "increment_2026112202", "x.parquet")
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"PAR1 truncated by the sink")

    audit = erase(sample.cfg, WHERE, actor="test")

    assert read_rows(bare) == [row(11)]
    assert bare in audit["files_rewritten"]
    assert audit["unreadable_files"] == [str(broken)] == audit["verified"]["unreadable_files"]
    assert broken.read_bytes() == b"PAR1 truncated by the sink"  # not ours to delete: a person decides


def test_partitioned_version_reusing_an_older_partition(tmp_path: Path) -> None:
    """Commit 2 rewrote partition b and reuses partition a of version 1 by reference: the erase version holds both."""
    cfg = parse_table(student_doc(tmp_path / "lake", "parts", partition_by={"column": "full_name"}))
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    v1, v2 = "v00000001-plan1-a", "v00000002-plan2-a"

    def part(version: str, value: str) -> str:
        return posixpath.join(lake.layout.data_dir(version), f"_cdc_partition={value}")

    def named(i: int, name: str) -> dict[str, Any]:
        return dict(row(i), full_name=name)

    _write(posixpath.join(part(v1, "a"), "part-0.parquet"), [named(1, "a"), named(3, "a")])
    _write(posixpath.join(part(v1, "b"), "part-0.parquet"), [named(2, "b")])
    _write(posixpath.join(part(v2, "b"), "part-0.parquet"), [named(2, "b"), named(7, "b")])
    for seq, version, partitions in (
        (1, v1, {"a": part(v1, "a"), "b": part(v1, "b")}),
        (2, v2, {"a": part(v1, "a"), "b": part(v2, "b")}),
    ):
        commit = Commit(
            seq=seq,
            version=version,
            plan_id=f"plan{seq}",
            run_id="r",
            parent_seq=seq - 1,
            files=[],
            increments=[],
            stats={"output_rows": 4, "output_visible_rows": 4, "output_tombstones": 0},
            partitions=partitions,
            partition_rows={"a": 2, "b": 1 if seq == 1 else 2},
        )
        assert lake.try_commit(commit)
        lake.advance_pointer(commit)
        lake.storage.write_text(lake.layout.archived_marker(seq), "")

    audit = erase(cfg, "id IN (3, 7)", actor="test")

    assert audit["rows_removed"]["live"] == 2 and audit["rows_removed"]["versions"] == 0
    live = lake.latest_commit()
    v3 = live.version
    assert live.seq == 3 and live.partitions == {"a": part(v3, "a"), "b": part(v3, "b")}
    assert live.partition_rows == {"a": 1, "b": 1} and live.stats["output_visible_rows"] == 2
    assert json.loads(Path(lake.layout.pointer).read_text())["partitions"] == live.partitions
    assert read_rows(posixpath.join(part(v3, "a"), "part-0.parquet")) == [named(1, "a")]
    assert read_rows(posixpath.join(part(v3, "b"), "part-0.parquet")) == [named(2, "b")]
    # The versions a rollback could bring back hold no erased row either.
    assert read_rows(posixpath.join(part(v1, "a"), "part-0.parquet")) == [named(1, "a")]
    assert read_rows(posixpath.join(part(v2, "b"), "part-0.parquet")) == [named(2, "b")]
    assert read_rows(posixpath.join(part(v1, "b"), "part-0.parquet")) == [named(2, "b")]


def test_an_erase_that_outlived_its_lease_does_not_commit(tmp_path: Path) -> None:
    sample = build(tmp_path / "lake")
    before = {p: Path(p).read_bytes() for p in sample.files}
    # Started two hours ago: its one-hour lease ran out before the decision.
    with pytest.raises(ConcurrentRunError, match=r"lost the table's lease .* Nothing was erased"):
        erase(sample.cfg, WHERE, now=datetime.now(UTC) - timedelta(hours=2))
    assert {p: Path(p).read_bytes() for p in sample.files} == before
    assert sample.lake.commit_seqs() == [1, 2]
    erase(sample.cfg, WHERE)  # discards what the first one left, then erases
    assert_erased(sample, tmp_path / "lake")


def test_literals_take_the_column_type(make_cfg: Callable[..., TableConfig]) -> None:
    from datetime import date

    import pyarrow.compute as pc

    cfg = make_cfg(
        columns=[
            {"name": "id", "type": "int"},
            {"name": "born", "type": "date"},
            {"name": "seen", "type": "timestamp"},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "bigint"},
        ]
    )
    t = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int32()),
            "born": pa.array([date(1990, 1, 2), date(1990, 1, 3), None], pa.date32()),
            "seen": pa.array(
                [datetime(2026, 1, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 13, tzinfo=UTC), None],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    cases = {
        "born = '1990-01-02'": [1],
        "(born) <> ('1990-01-02')": [2],
        "seen BETWEEN '2026-01-01 00:00:00' AND '2026-01-01 12:00:00'": [1],
        "born IN ('1990-01-03', '2000-01-01') OR seen IS NULL": [2, 3],
    }
    for where, ids in cases.items():
        pred = parse_predicate(cfg, where)
        assert t.filter(pc.coalesce(pred.expression, False)).column("id").to_pylist() == ids, where
    with pytest.raises(ErasePredicateError, match=r"literal 'yesterday' is not a date \(column born\)"):
        parse_predicate(cfg, "born = 'yesterday'")


def test_roll_forward_does_not_land_again_a_file_archived_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample = build(tmp_path / "lake")
    monkeypatch.setenv("CDC_FAULTS", "erase.after_commit_record=raise")
    with pytest.raises(InjectedFaultError):
        erase(sample.cfg, WHERE)
    monkeypatch.delenv("CDC_FAULTS")
    # Meanwhile a run compacted and archived the pending increment (its files left the landing area).
    pending = [p for p, (loc, _) in sample.files.items() if loc == "pending"]
    moved = Path(sample.lake.layout.archive, "c00000004", "increment_2026112202")
    moved.mkdir(parents=True)
    for p in pending:
        Path(p).rename(moved / Path(p).name)
    erase(sample.cfg, WHERE)
    assert not any(Path(p).exists() for p in pending)  # not landed again
    assert not list(Path(sample.lake.layout.incremental, "increment_2026112202").iterdir())  # no rewrite left
    # The archived copies were scanned where they are now.
    assert [r for p in sorted(moved.iterdir()) for r in read_rows(str(p))] == [row(8)]


@pytest.mark.s3
def test_erase_on_s3(aws_default: str, tmp_path: Path) -> None:
    """The same protocol through S3Storage (moto): prefixes as directories, copies as the swap."""
    import io
    import uuid

    from cdc_compaction.core.storage.s3 import S3Storage

    s3 = S3Storage()
    bucket = f"lake-{uuid.uuid4().hex[:16]}"
    s3.client.create_bucket(Bucket=bucket)
    cfg = parse_table(student_doc(tmp_path, "people", storage_root=f"s3://{bucket}/lake/people"))
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root

    def put(path: str, rows: list[dict[str, Any]]) -> str:
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), buf)
        lake.storage.write_bytes(path, buf.getvalue())
        return path

    def get(path: str) -> list[dict[str, Any]]:
        with lake.storage.open_read(path) as fh:
            return pq.read_table(fh).to_pylist()

    version = "v00000001-plan1-a"
    files = {
        put(posixpath.join(lake.layout.data_dir(version), "part-0.parquet"), [row(1), row(3)]): [row(1)],
        put(posixpath.join(lake.layout.tombstones_dir(version) or "", "part-0.parquet"), [row(4, "d")]): [row(4, "d")],
        put(posixpath.join(lake.layout.incremental, "increment_2026112202", "p.parquet"), [row(3), row(8)]): [row(8)],
        put(posixpath.join(lake.layout.archive, "c00000001", "increment_2026112200", "f.parquet"), [row(3)]): [],
    }
    first_version(lake, version, {"output_rows": 3, "output_visible_rows": 2, "output_tombstones": 1})

    audit = erase(cfg, "id = 3", actor="test")

    assert audit["rows_removed"] == {
        "live": 1,
        "versions": 0,
        "pending": 1,
        "archive": 1,
        "quarantine": 0,
        "changes": 0,
        "rebuild": 0,
        "other": 0,
    }
    for path, rows in files.items():
        assert get(path) == rows, path
    live = lake.latest_commit()
    assert live.seq == 2 and live.stats["kind"] == "erase"
    assert get(posixpath.join(lake.data_location(live), "part-0.parquet")) == [row(1)]
    keys = [o["Key"] for o in s3.client.list_objects_v2(Bucket=bucket, Prefix="lake/people/")["Contents"]]
    assert not [k for k in keys if ".erase-" in k or k.endswith(f"{audit['erase_id']}.json")]


# ------------------------------------------------------------------------- keyless tables
def keyless_cfg(root: Path) -> TableConfig:
    return parse_table(
        {
            "mode": "keyless",
            "database": "tests",
            "table": "visits",
            "columns": [
                {"name": "name", "type": "string"},
                {"name": "visits", "type": "int"},
                {"name": "_before_name", "type": "string"},
                {"name": "_before_visits", "type": "int"},
                {"name": "op", "type": "string"},
                {"name": "lsn", "type": "bigint"},
            ],
            "order_by": ["lsn"],
            "storage_root": str(root / "visits"),
            "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        }
    )


KEYLESS = pa.schema(
    [
        ("name", pa.string()),
        ("visits", pa.int32()),
        ("_before_name", pa.string()),
        ("_before_visits", pa.int32()),
        ("op", pa.string()),
        ("lsn", pa.int64()),
    ]
)


def visit(name: str | None, before: str | None, op: str | None, lsn: int) -> dict[str, Any]:
    return {
        "name": name,
        "visits": 1 if name else None,
        "_before_name": before,
        "_before_visits": 1 if before else None,
        "op": op,
        "lsn": lsn,
    }


def test_keyless_erase_checks_before_images_and_keeps_the_watermark(tmp_path: Path) -> None:
    cfg = keyless_cfg(tmp_path / "lake")
    lake = Lake(cfg)
    claim(lake)  # as create-tables does: the table owns its root
    version = "v00000001-plan1-a"
    data = posixpath.join(lake.layout.data_dir(version), "part-0.parquet")
    watermark = posixpath.join(lake.layout.tombstones_dir(version) or "", "part-0.parquet")
    # The data holds copies (op and sequence empty); the tombstones file only the watermark (lsn 3).
    # Copies written with the data columns only (the check must not need the other columns).
    copies = pa.schema([KEYLESS.field("name"), KEYLESS.field("visits")])
    _write(data, [{"name": "Al", "visits": 1}, {"name": "Bob", "visits": 1}], copies)
    _write(watermark, [visit(None, None, None, 3)], KEYLESS)
    events = [visit("Bob", None, "c", 4), visit("Rob", "Bob", "u", 5), visit("Al", "Al", "u", 6)]
    pending = land(cfg, "increment_2026112202", [events])[0]
    first_version(lake, version, {"output_rows": 3, "output_visible_rows": 2, "output_tombstones": 1}, increments=[])

    # "name IS NULL" would match the watermark row too: it is no row of the table and stays.
    audit = erase(cfg, "name = 'Bob' OR name IS NULL", actor="test")

    assert audit["rows_removed"] == {
        "live": 1,
        "versions": 0,
        "pending": 2,
        "archive": 0,
        "quarantine": 0,
        "changes": 0,
        "rebuild": 0,
        "other": 0,
    }
    assert read_rows(data) == [{"name": "Al", "visits": 1}]
    # The update from Bob's row carried Bob in its before-image: erased with the insert.
    assert [r["lsn"] for r in read_rows(pending)] == [6]
    live = lake.latest_commit()
    assert read_rows(str(Path(lake.tombstones_location(live)) / "part-0.parquet")) == [visit(None, None, None, 3)]
    assert read_rows(watermark) == [visit(None, None, None, 3)]


def test_files_of_another_type_are_compared_as_the_registry_types(tmp_path: Path) -> None:
    """A file refused for its schema (id as strings) is still searched; one whose values do not convert is named."""
    sample = build(tmp_path / "lake")
    as_text = pa.schema([("id", pa.string()), ("full_name", pa.string()), ("op", pa.string()), ("ts_ms", pa.string())])
    refused = posixpath.join(sample.lake.layout.quarantined_files_dir("p-0009"), "increment_2026112202", "a.parquet")
    text_rows = [
        {"id": "3", "full_name": "n3", "op": "c", "ts_ms": "x"},
        {"id": "12", "full_name": "n12", "op": "c", "ts_ms": "y"},
    ]
    _write(refused, text_rows, as_text)
    garbled = posixpath.join(sample.lake.layout.quarantined_files_dir("p-0009"), "increment_2026112202", "b.parquet")
    _write(garbled, [{"id": "seven", "full_name": "n7", "op": "c", "ts_ms": "z"}], as_text)

    audit = erase(sample.cfg, WHERE, actor="test")

    assert read_rows(refused) == text_rows[1:]  # kept as the file had it: strings
    assert audit["unreadable_files"] == [garbled] and read_rows(garbled)[0]["id"] == "seven"


@pytest.mark.parametrize("point", ["erase.before_commit", "erase.after_first_swap"])
def test_erase_outside_the_live_version_crash_then_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """Only a pending file matches: no erase commit, the marker alone decides."""
    sample = build(tmp_path / "lake")
    monkeypatch.setenv("CDC_FAULTS", f"{point}=raise")
    with pytest.raises(InjectedFaultError):
        erase(sample.cfg, "full_name = 'n9'")
    monkeypatch.delenv("CDC_FAULTS")
    audits = [erase(sample.cfg, "full_name = 'n9'")]
    audits += [json.loads(p.read_text()) for p in Path(sample.lake.layout.control, "erase").glob("*.audit.json")]
    for path, (_, rows) in sample.files.items():
        assert read_rows(path) == [r for r in rows if r["full_name"] != "n9"], path
    assert sample.lake.commit_seqs() == [1, 2]
    assert all(a["commit_seq"] is None for a in audits)
    assert not [p for p in all_parquet(tmp_path / "lake") if p.name.startswith(".")]


#: Runs an erase in a fresh process and prints its peak: Arrow's pool's, and with a third argument ``python`` (slower)
#: Python's allocations too (tracemalloc): a Python file object's reads (``Storage.open_read``) are Python bytes that
#: Arrow's pool never counts. Python's peak is taken above what stays allocated at the end (the modules the erase
#: imports, some 40 MB).
PEAK_SCRIPT = """
import json, sys, tracemalloc
import pyarrow as pa
from cdc_compaction.operations.erase import erase
from cdc_compaction.core.registry import parse_table
if sys.argv[3:] == ["python"]:
    tracemalloc.start()
audit = erase(parse_table(json.loads(sys.argv[1])), sys.argv[2], actor="peak")
end, top = tracemalloc.get_traced_memory()
arrow, python = pa.default_memory_pool().max_memory(), top - end
print(json.dumps({"peak": arrow + python, "arrow": arrow, "python": python, "removed": audit["rows_removed"]["live"]}))
"""


def test_erase_holds_a_batch_at_a_time_not_the_version(tmp_path: Path) -> None:
    """The erase reads, filters and writes each file a batch at a time, and never keeps the live
    version's rows: Arrow's peak allocation in a fresh process stays below two files' rows, while the
    live version holds eight such files (issue 38: nothing that grows with the table in one process)."""
    cfg = parse_table(student_doc(tmp_path / "lake", "people"))
    lake = Lake(cfg)
    claim(lake)
    files, groups, per_group = 8, 4, 20_000
    pad = "x" * 200
    version = "v00000001-plan1-a"
    n = 0
    for f in range(files):
        rows = [{"id": n + i, "full_name": f"n{n + i}{pad}", "op": "c", "ts_ms": 1} for i in range(groups * per_group)]
        n += len(rows)
        path = posixpath.join(lake.layout.version_dir(version), "data", f"part-{f}.parquet")
        os.makedirs(posixpath.dirname(path), exist_ok=True)
        # Uncompressed: the bytes on disk are the rows' size, so no file is small in memory either.
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, row_group_size=per_group, compression="none")
    file_bytes = Path(path).stat().st_size
    first_version(lake, version, {"output_visible_rows": n})
    doc = student_doc(tmp_path / "lake", "people")
    gone = list(range(0, n, 7919))  # in every file and most row groups
    done = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, json.dumps(doc), f"id IN ({', '.join(str(i) for i in gone)})"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["removed"] == len(gone)
    # One file is ~17 MB here, a row group ~4 MB; the version ~140 MB. The erase that held every live
    # file's rows peaked at 240 MB; reading, filtering and writing a batch takes ~19 MB.
    assert got["peak"] < 2 * file_bytes, (got, file_bytes)
    assert sorted(r["id"] for r in _rows_of(lake)) == sorted(set(range(n)) - set(gone))


def test_erase_holds_a_batch_not_a_row_group(tmp_path: Path) -> None:
    """Spark writes row groups of up to 128 MB of Parquet, several times that in Arrow: the erase reads,
    filters and writes a file of one such row group a batch at a time, to local disk, so its Arrow peak
    stays far below the row group's size (bench/scale_day.py: 1.2 GB at 2M rows when it held row groups)."""
    cfg = parse_table(student_doc(tmp_path / "lake", "people"))
    lake = Lake(cfg)
    claim(lake)
    n = 800_000
    version = "v00000001-plan1-a"
    path = posixpath.join(lake.layout.version_dir(version), "data", "part-0.parquet")
    os.makedirs(posixpath.dirname(path), exist_ok=True)
    ids = pa.array(range(n), pa.int32())
    names = pc.binary_join_element_wise("n", pc.cast(ids, pa.string()), "x" * 200, "")
    table = pa.table([ids, names, pa.array(["c"] * n), pa.array([1] * n, pa.int64())], schema=SCHEMA)
    # One row group, uncompressed: the row group's bytes are its rows' size.
    pq.write_table(table, path, row_group_size=n, compression="none")
    assert pq.ParquetFile(path).num_row_groups == 1
    file_bytes = Path(path).stat().st_size
    first_version(lake, version, {"output_visible_rows": n})
    gone = list(range(0, n, 7919))
    done = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, json.dumps(student_doc(tmp_path / "lake", "people")),
         f"id IN ({', '.join(str(i) for i in gone)})", "python"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["removed"] == len(gone)
    # The row group is ~170 MB; a batch ~4 MB of rows, and reading, filtering and writing one (Parquet's
    # dictionary and page buffers included) peaks near 20 MB of Arrow whatever the row group, and a few MB of
    # Python. Holding the row group peaked at 378 MB of Arrow here, twice the file's size; pyarrow's default
    # pre-buffering, which read the row group's column chunks whole (as Python bytes), at 172 MB of Python.
    assert got["peak"] < file_bytes / 2, (got, file_bytes)
    live = pq.read_table(lake.live_location(), columns=["id"]).column("id").to_pylist()
    assert sorted(live) == sorted(set(range(n)) - set(gone))


def _rows_of(lake: Lake) -> list[dict[str, Any]]:
    live = lake.latest_commit()
    assert live is not None and live.seq == 2
    data = Path(lake.data_location(live))
    return [r for p in sorted(data.glob("*.parquet")) for r in pq.read_table(p, columns=["id"]).to_pylist()]
