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

    assert delete(registry, f"tests.{a}", endpoint) == 0
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
