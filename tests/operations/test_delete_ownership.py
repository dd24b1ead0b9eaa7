"""``delete --drop-data`` destroys by ownership, never by detection (issue 35).

Every case is one testers reported against the detection (``foreign_data``): each lost data that
was not the deleted table's. What "the table's" means is taken from the contract (docs,
"Deleting a table"): the root is the table's only through its marker ``_cdc/owner.json``, and only
the files its records name go. The expectations here are file lists taken with ``os.walk`` before
and after, not the project's ownership code.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import compact_once, student_doc

from cdc_compaction.cli.main import main
from cdc_compaction.core.exceptions import CdcCompactionError
from cdc_compaction.core.registry import parse_table
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.tables import ensure_tables

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def files_under(top: Path) -> set[str]:
    """Every non-directory entry under ``top`` (links not followed), as paths relative to it."""
    out = set()
    for d, dirs, names in os.walk(top):
        out.update(os.path.relpath(os.path.join(d, n), top) for n in names)
        out.update(os.path.relpath(os.path.join(d, n), top) for n in dirs if os.path.islink(os.path.join(d, n)))
    return out


def register(registry: Path, doc: dict[str, Any]) -> Any:
    registry.mkdir(parents=True, exist_ok=True)
    (registry / f"{doc['database']}.{doc['table']}.yaml").write_text(yaml.safe_dump(doc))
    return parse_table(doc)


def run_table(runtime: Any, cfg: Any, hours: int = 1) -> None:
    """The table's DAG as far as a commit and its archive: create-tables, then plan ... archive per hour."""
    rt = runtime(cfg)
    ensure_tables(rt)
    for h in range(hours):
        land(cfg, f"increment_20261122{h:02d}", [[{"id": h, "full_name": f"n{h}", "op": "c", "ts_ms": h + 1}]])
        compact_once(rt, f"r{h}")


def delete(registry: Path, table: str, endpoint: Any) -> int:
    """``cdc-compaction delete TABLE --drop-data --yes``: its exit code."""
    return main(["delete", table, "--registry-dir", str(registry), "--metastore", endpoint.uri, "--yes", "--drop-data"])


def name(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}"


def test_a_system_directory_as_storage_root_keeps_every_file_the_table_never_wrote(
    tmp_path: Path, runtime: Any, endpoint: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``storage_root: /usr/share/doc``: rmtree('/usr/share/doc') before; now only the table's own files go."""
    system = tmp_path / "usr" / "share" / "doc"
    (system / "bash").mkdir(parents=True)
    (system / "bash" / "README").write_text("bash docs")
    (system / "copyright").write_text("(c)")
    (system / "base").mkdir()
    (system / "base" / "notes.txt").write_text("a file where the table keeps its versions")
    (system / "_cdc").mkdir()
    (system / "_cdc" / "NOTES").write_text("a file in the control directory's place")
    theirs = files_under(system)
    registry = tmp_path / "registry"
    t = name("sysdoc")
    cfg = register(registry, student_doc(tmp_path, t, storage_root=str(system)))
    run_table(runtime, cfg, hours=2)
    assert len(files_under(system) - theirs) > 5, "the table wrote its lake there"
    ours = files_under(system)

    asked = ["delete", f"tests.{t}", "--registry-dir", str(registry), "--metastore", endpoint.uri, "--drop-data"]
    assert main(asked) == 1, "without --yes (and no terminal) the plan is shown, nothing changes"
    plan = capsys.readouterr().out
    assert f"leave {system / 'bash' / 'README'} (not named by the table's records)" in plan
    assert files_under(system) == ours

    assert delete(registry, f"tests.{t}", endpoint) == 0
    out = capsys.readouterr().out
    assert files_under(system) == theirs, "exactly the files the table never wrote are left"
    assert "bash/README (not named by the table's records)" in out, "what stays is listed"


def test_a_fifo_registry_file_of_a_nested_table_does_not_cost_its_landed_data(
    tmp_path: Path, runtime: Any, endpoint: Any
) -> None:
    registry = tmp_path / "registry"
    a, b = name("fa"), name("fb")
    cfg_a = register(registry, student_doc(tmp_path / "lake", a))
    run_table(runtime, cfg_a)
    nested = parse_table(student_doc(tmp_path / "lake", b, storage_root=str(tmp_path / "lake" / a / "sub_b")))
    landed = land(nested, "increment_2026112200", [[{"id": 1, "full_name": "x", "op": "c", "ts_ms": 1}]])
    os.mkfifo(registry / f"tests.{b}.yaml")

    assert delete(registry, f"tests.{a}", endpoint) == 0
    assert all(Path(p).is_file() for p in landed), "the nested table's landed data is untouched"
    assert (registry / f"tests.{b}.yaml").exists(), "the FIFO is where it was (never opened)"
    assert files_under(tmp_path / "lake" / a) == {f"sub_b/incremental/increment_2026112200/{Path(landed[0]).name}"}


def test_a_root_equal_to_the_registry_directory_keeps_the_other_registry_files(
    tmp_path: Path, runtime: Any, endpoint: Any
) -> None:
    registry = tmp_path / "registry"
    a, b = name("ra"), name("rb")
    register(registry, student_doc(tmp_path / "lake", b))
    cfg_a = register(registry, student_doc(tmp_path / "lake", a, storage_root=str(registry)))
    run_table(runtime, cfg_a)
    others = {f"tests.{b}.yaml"}
    # The first defence: the registry refuses a root equal to its own directory, so the command stops.
    assert delete(registry, f"tests.{a}", endpoint) == 1
    assert files_under(registry) >= others | {f"tests.{a}.yaml"}
    # The second, should an entry get past validation: deletion by ownership touches only the table's files.
    from cdc_compaction.operations.ops import delete_table

    delete_table(cfg_a, registry / f"tests.{a}.yaml", endpoint, drop_data=True)
    left = files_under(registry)
    assert others <= left, "the other table's registry file stays"
    assert {p for p in left if not p.startswith(f"tests.{a}.yaml.deleted-")} == others


def test_a_nested_table_registered_in_another_registry_directory_keeps_its_data(
    tmp_path: Path, runtime: Any, endpoint: Any
) -> None:
    reg1, reg2 = tmp_path / "reg1", tmp_path / "reg2"
    a, b = name("na"), name("nb")
    cfg_a = register(reg1, student_doc(tmp_path / "lake", a))
    run_table(runtime, cfg_a)
    cfg_b = register(reg2, student_doc(tmp_path / "lake", b, storage_root=str(tmp_path / "lake" / a / "b")))
    landed = land(cfg_b, "increment_2026112200", [[{"id": 1, "full_name": "x", "op": "c", "ts_ms": 1}]])
    with pytest.raises(CdcCompactionError, match=f"lies inside the root of table tests.{a}"):
        ensure_tables(runtime(cfg_b))  # a root nested in another table's is refused when its tables are created

    assert delete(reg1, f"tests.{a}", endpoint) == 0
    assert all(Path(p).is_file() for p in landed)
    assert files_under(tmp_path / "lake" / a) == {os.path.relpath(landed[0], tmp_path / "lake" / a)}


def test_a_root_without_marker_is_refused_until_a_run_adopts_it(
    tmp_path: Path, runtime: Any, endpoint: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lake made before the marker existed: refused, nothing changed; its next run adopts it."""
    registry = tmp_path / "registry"
    t = name("nomark")
    cfg = register(registry, student_doc(tmp_path / "lake", t))
    run_table(runtime, cfg)
    root = tmp_path / "lake" / t
    (root / "_cdc" / "owner.json").unlink(missing_ok=True)  # as a lake from before this change
    before = files_under(root)

    assert delete(registry, f"tests.{t}", endpoint) == 1
    err = capsys.readouterr().err
    assert f"tests.{t}" in err and "has no ownership marker" in err and "Run the table's DAG once" in err
    assert files_under(root) == before and (registry / f"tests.{t}.yaml").exists(), "nothing was changed"

    ensure_tables(runtime(cfg))  # the table's next run: create-tables adopts the root
    marker = json.loads((root / "_cdc" / "owner.json").read_text())
    assert marker["table"] == f"tests.{t}" and marker["deployment"] and marker["created_at"]
    assert delete(registry, f"tests.{t}", endpoint) == 0
    assert not root.exists(), "every file was the table's: the root is gone too"


def test_a_root_whose_marker_names_another_table_is_refused(
    tmp_path: Path, runtime: Any, endpoint: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = tmp_path / "registry"
    t = name("theirs")
    root = tmp_path / "lake" / t
    cfg = register(registry, student_doc(tmp_path / "lake", t))
    run_table(runtime, cfg)
    marker = root / "_cdc" / "owner.json"
    marker.write_text(json.dumps({"table": "other.owner", "registry_file": "/elsewhere/other.owner.yaml"}))
    before = files_under(root)

    with pytest.raises(CdcCompactionError, match=r"belongs to table other\.owner"):
        ensure_tables(runtime(cfg))
    assert delete(registry, f"tests.{t}", endpoint) == 1
    err = capsys.readouterr().err
    assert "belongs to table other.owner" in err and "/elsewhere/other.owner.yaml" in err
    assert files_under(root) == before and (registry / f"tests.{t}.yaml").exists(), "nothing was changed"


def test_erase_refuses_a_root_it_does_not_own_before_anything_changes(
    tmp_path: Path, runtime: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """An erase rewrites and removes files under the root: without the table's marker it changes nothing."""
    registry = tmp_path / "registry"
    t = name("erase_nomark")
    cfg = register(registry, student_doc(tmp_path / "lake", t))
    run_table(runtime, cfg)
    root = tmp_path / "lake" / t
    for marker in ({"table": "other.owner", "registry_file": "/elsewhere/other.owner.yaml"}, None):
        if marker is None:
            (root / "_cdc" / "owner.json").unlink()
        else:
            (root / "_cdc" / "owner.json").write_text(json.dumps(marker))
        before = files_under(root)
        rc = main(["erase", f"tests.{t}", "--registry-dir", str(registry), "--where", "id = 0", "--yes"])
        err = capsys.readouterr().err
        assert rc == 1 and f"tests.{t}" in err and "refusing erase" in err, err
        assert ("belongs to table other.owner" if marker else "has no ownership marker") in err
        assert files_under(root) == before, "nothing was changed"


def test_retention_deletes_only_what_the_job_wrote_in_an_old_version(
    tmp_path: Path, runtime: Any, endpoint: Any
) -> None:
    """An old version goes file by file: a foreign file, a link to a directory outside and another
    table's root put into it stay (before: delete_tree of the version directory)."""
    t = name("ret")
    cfg = parse_table(student_doc(tmp_path / "lake", t, keep_versions=1))
    run_table(runtime, cfg)
    version = next(p for p in (tmp_path / "lake" / t / "base").iterdir() if not p.name.endswith("-empty"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "part-00000.parquet").write_text("named like a job file, outside the root")
    (version / "_NOTES").write_text("put here by hand")
    (version / "data" / "_linked").symlink_to(outside)
    (version / "_other" / "_cdc").mkdir(parents=True)
    (version / "_other" / "_cdc" / "owner.json").write_text(json.dumps({"table": "other.table"}))
    (version / "_other" / "part-00000.parquet").write_text("another table's")
    theirs = {"_NOTES", "data/_linked", "_other/_cdc/owner.json", "_other/part-00000.parquet"}
    own = files_under(version) - theirs
    assert own, "the job wrote files there"

    land(cfg, "increment_2026112205", [[{"id": 5, "full_name": "y", "op": "c", "ts_ms": 9}]])
    compact_once(runtime(cfg), "r5")  # keep_versions=1: publish's retention deletes the older version
    assert files_under(version) == theirs
    assert files_under(outside) == {"part-00000.parquet"}


# ----------------------------------------------------------------------------- generative
#: Where a table's root may lie in a generated world: side by side under one parent, nested in
#: another's root (beside its areas, or inside its base/), or equal to a registry directory.
SLOTS = ("shared/p", "shared/q", "t", "t/inner", "t/base/inner", "reg1", "reg2/sub")
#: Where foreign things are dropped in a root (after its runs): every area of the layout.
AREAS = ("", "base", "LIVE/data", "LIVE", "archive", "ARCHIVED", "_cdc", "_cdc/commits", "incremental", "quarantine")
KINDS = ("file", "link_out", "link_in", "link_dir_out", "fifo", "marker_dir")


def snapshot(top: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``top`` (links not followed): kind, size, mtime and link target."""
    out: dict[str, tuple[Any, ...]] = {}
    for d, dirs, names in os.walk(top):
        for n in [*dirs, *names]:
            p = os.path.join(d, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, top)
            if os.path.islink(p):
                out[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                out[rel] = ("dir",)
            else:
                out[rel] = ("file" if os.path.isfile(p) else "other", st.st_size, st.st_mtime_ns)
    return out


def non_dirs(snap: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    return {k: v for k, v in snap.items() if v[0] != "dir"}


def _inside(rel: str, root: str) -> bool:
    return rel == root or rel.startswith(root + "/")


def test_delete_and_retention_touch_nothing_outside_the_tables_own_records(
    tmp_path: Path, runtime: Any, endpoint: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Random worlds of tables run through their real tasks, with foreign files, links, FIFOs and other
    tables' roots dropped in every area; then retention and ``delete --drop-data`` of every table.

    Checked by walking the world before and after: a table's own files (those its runs wrote, found
    by walking its root before anything foreign was dropped) go, and nothing else changes.
    """
    from conftest import fuzz_settings
    from hypothesis import example, given
    from hypothesis import strategies as s

    counter = iter(range(10**6))

    world_spec = s.fixed_dictionaries(
        {
            "tables": s.lists(
                s.tuples(s.sampled_from(SLOTS), s.sampled_from(("reg1", "reg2")), s.integers(1, 2), s.booleans()),
                min_size=2,
                max_size=3,
                unique_by=lambda t: t[0],
            ),
            "twice": s.booleans(),  # the first table is also registered in the other registry directory
            "drops": s.lists(
                s.tuples(s.integers(0, 2), s.sampled_from(AREAS), s.sampled_from(KINDS)), min_size=3, max_size=10
            ),
            "order": s.permutations(range(3)),
        }
    )

    @fuzz_settings(2)
    @given(spec=world_spec)
    # One rich world always: a table nested beside another's areas, a root equal to a registry directory,
    # a table in both registry directories, and something of every kind in every area.
    @example(
        spec={
            "tables": [("t", "reg2", 2, True), ("t/inner", "reg1", 1, False), ("reg1", "reg2", 1, True)],
            "twice": True,
            "drops": [(i % 3, area, KINDS[i % len(KINDS)]) for i, area in enumerate(AREAS * 2)],
            "order": [2, 1, 0],
        }
    )
    def check(spec: dict[str, Any]) -> None:
        world = tmp_path / f"w{next(counter)}"
        outside = world / "outside"
        (outside / "dir").mkdir(parents=True)
        (outside / "precious.txt").write_text("outside every root")
        (outside / "dir" / "part-00000.parquet").write_text("looks like a job file, outside every root")
        tables = []
        for i, (slot, reg, hours, _) in enumerate(spec["tables"]):
            t = f"g{os.getpid()}_{world.name}_{i}"
            doc = student_doc(world, t, storage_root=str(world / slot), keep_versions=1)
            cfg = register(world / reg, doc)
            if i == 0 and spec["twice"]:
                register(world / ("reg2" if reg == "reg1" else "reg1"), doc)
            tables.append({"name": f"tests.{t}", "cfg": cfg, "root": slot, "reg": world / reg, "hours": hours})
        for tb in tables:
            try:
                ensure_tables(runtime(tb["cfg"]))
                tb["owned"] = True
            except CdcCompactionError as exc:
                assert "Nothing was changed" in str(exc)  # nested in, or holding, another table's root
                tb["owned"] = False
        for tb, (_, _, hours, pending) in zip(tables, spec["tables"], strict=True):
            rt = runtime(tb["cfg"])
            for h in range(hours if tb["owned"] else 0):
                land(
                    tb["cfg"], f"increment_20261122{h:02d}", [[{"id": h, "full_name": "n", "op": "c", "ts_ms": h + 1}]]
                )
                compact_once(rt, f"r{h}")
            if pending or not tb["owned"]:
                land(tb["cfg"], "increment_2026112209", [[{"id": 9, "full_name": "p", "op": "c", "ts_ms": 99}]])
        # Each table's own files: what its runs wrote under its root, not under another root, not registry files.
        setup = non_dirs(snapshot(world))
        roots = [tb["root"] for tb in tables]
        for tb in tables:
            tb["own"] = {
                rel
                for rel in setup
                if _inside(rel, tb["root"])
                and not any(r != tb["root"] and _inside(r, tb["root"]) and _inside(rel, r) for r in roots)
                and not rel.endswith(".yaml")
            }
            assert tb["owned"] or not any(r.endswith("/_cdc/owner.json") for r in tb["own"])
        foreign = _drop(world, tables, spec["drops"], outside)

        # Retention: one more run of each owned table makes its live version old; keep_versions=1 deletes it.
        for tb in tables:
            if tb["owned"]:
                before = snapshot(world)
                land(tb["cfg"], "increment_2026112210", [[{"id": 10, "full_name": "r", "op": "c", "ts_ms": 100}]])
                compact_once(runtime(tb["cfg"]), "r10")
                after = snapshot(world)
                assert {k: after.get(k) for k in foreign} == {k: before.get(k) for k in foreign}, "foreign kept"
                for rel in set(before) | set(after):
                    if before.get(rel) != after.get(rel) and before.get(rel, ("dir",))[0] != "dir":
                        assert _inside(rel, tb["root"]) and rel not in foreign, rel
                        assert not any(r != tb["root"] and _inside(r, tb["root"]) and _inside(rel, r) for r in roots)
                own_now = {
                    rel
                    for rel in non_dirs(after)
                    if _inside(rel, tb["root"]) and rel not in foreign and rel not in non_dirs(before)
                }
                tb["own"] = (tb["own"] & set(after)) | own_now

        # Erase: rewrites the table's files that hold the row and records what it did; nothing else.
        for tb in tables:
            before = snapshot(world)
            capsys.readouterr()
            rc = main(["erase", tb["name"], "--registry-dir", str(tb["reg"]), "--where", "id = 10", "--yes"])
            after = snapshot(world)
            err = capsys.readouterr().err
            if not tb["owned"]:
                assert rc == 1 and after == before, "a root the table does not own: erase changes nothing"
                continue
            if rc == 1:
                # Files under the root that the erase cannot read may hold the value: it refuses, naming them,
                # and each one it names is something the world dropped there or another table's.
                changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
                # Nothing changes but the table's own lease record (taken and released around the check).
                assert all(_inside(k, f"{tb['root']}/_cdc/lease") for k in changed), changed
                tb["own"] |= {k for k in changed if k in after and after[k][0] != "dir"}
                named = re.findall(r"'(/[^']+)'", err.split("neither Parquet nor", 1)[-1].split("]", 1)[0])
                assert "neither Parquet nor" in err and named, err
                for path in named:
                    rel = os.path.relpath(path, world)
                    registry_file = (
                        rel.split("/", 1)[0] in ("reg1", "reg2") and ".yaml" in rel
                    )  # a root over a registry
                    assert (
                        registry_file
                        or any(_inside(rel, f) for f in foreign)
                        or any(r != tb["root"] and _inside(r, tb["root"]) and _inside(rel, r) for r in roots)
                    ), (rel, err)
                continue
            assert rc == 0, tb["name"]
            assert {k: after.get(k) for k in foreign} == {k: before.get(k) for k in foreign}, "foreign kept"
            for rel in set(before) | set(after):
                if before.get(rel) != after.get(rel) and before.get(rel, ("dir",))[0] != "dir":
                    assert _inside(rel, tb["root"]) and rel not in foreign, rel
                    assert not any(r != tb["root"] and _inside(r, tb["root"]) and _inside(rel, r) for r in roots), rel
            tb["own"] = (tb["own"] & set(after)) | {
                rel for rel in non_dirs(after) if _inside(rel, tb["root"]) and rel not in non_dirs(before)
            }

        for i in spec["order"]:
            if i >= len(tables):
                continue
            tb = tables[i]
            before = snapshot(world)
            rc = delete(tb["reg"], tb["name"], endpoint)
            after = snapshot(world)
            if not tb["owned"]:
                assert rc == 1 and after == before, "a root the table does not own: nothing changes"
                continue
            assert rc == 0
            moved = {k for k in set(after) - set(before) if ".yaml.deleted-" in k}
            reg_file = os.path.relpath(tb["reg"] / f"{tb['name']}.yaml", world)  # moved aside, as delete does
            expected = {k: v for k, v in non_dirs(before).items() if k not in tb["own"] and k != reg_file}
            got = {k: v for k, v in non_dirs(after).items() if k not in moved}
            assert got == expected, (sorted(set(got) ^ set(expected)), tb["root"])
            for rel in set(before) - set(after) - {reg_file}:
                assert _inside(rel, tb["root"]), f"{rel} went, outside the root {tb['root']}"

    check()


def _drop(world: Path, tables: list[dict[str, Any]], drops: list[tuple[int, str, str]], outside: Path) -> set[str]:
    """Put foreign things into the tables' areas; return their paths relative to ``world``."""
    foreign: set[str] = set()
    for n, (ti, area, kind) in enumerate(drops):
        tb = tables[ti % len(tables)]
        root = world / tb["root"]
        if not root.is_dir():
            continue
        sub = area
        if "LIVE" in sub:
            versions = sorted(p.name for p in (root / "base").glob("v0*") if not p.name.endswith("-empty"))
            if not versions:
                continue
            sub = sub.replace("LIVE", f"base/{versions[-1]}")
        if "ARCHIVED" in sub:
            archived = sorted((root / "archive").glob("c*/increment_*"))
            if not archived:
                continue
            sub = os.path.relpath(archived[0], root)
        d = root / sub
        d.mkdir(parents=True, exist_ok=True)
        # "_": a name Spark and the landing layout skip (a foreign file must not break the table's next run).
        target = d / f"_FOREIGN-{n}"
        if kind == "file":
            target.write_text("not the table's")
        elif kind == "link_out":
            target.symlink_to(outside / "precious.txt")
        elif kind == "link_dir_out":
            target.symlink_to(outside / "dir")
        elif kind == "link_in":
            inner = sorted(p for p in root.rglob("*.json") if p.is_file() and not p.is_symlink())
            target.symlink_to(inner[0] if inner else root)
        elif kind == "fifo":
            os.mkfifo(target)
        else:
            (target / "_cdc").mkdir(parents=True)
            (target / "_cdc" / "owner.json").write_text(json.dumps({"table": "other.table"}))
            (target / "part-00000.parquet").write_text("another table's data")
            foreign.update(
                os.path.relpath(p, world) for p in (target / "_cdc" / "owner.json", target / "part-00000.parquet")
            )
        foreign.add(os.path.relpath(target, world))
    for p in outside.rglob("*"):
        foreign.add(os.path.relpath(p, world))
    return foreign
