"""``cdc-compaction delete``: against the real metastore and a local lake.

The objects expected gone are spelled out here from the README's naming (``<t>_base``,
``<t>_tombstones``, ``<t>_incremental``, ``<t>_compactor``, ``<t>_view``,
``<t>_pending_rejects``), not taken from the code under test.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import student_doc

from cdc_compaction.cli.main import main
from cdc_compaction.core.lake import Lake, TableLease
from cdc_compaction.core.registry import parse_table
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.pipeline.tables import ensure_tables

SUFFIXES = ("_base", "_tombstones", "_incremental", "_compactor", "_view", "_pending_rejects")


def _table(tmp_path: Path, runtime: Any, name: str) -> tuple[Any, Path]:
    """A table with its tables and views created by ensure_tables, and its registry file."""
    doc = student_doc(tmp_path / "lake", name)
    registry = tmp_path / "registry"
    registry.mkdir(exist_ok=True)
    (registry / f"tests.{name}.yaml").write_text(yaml.safe_dump(doc))
    cfg = parse_table(doc)
    ensure_tables(runtime(cfg))
    return cfg, registry


def _present(endpoint: Any, table: str) -> list[str]:
    with connect(endpoint) as ms:
        return [s for s in SUFFIXES if ms.get_table("tests", table + s) is not None]


@pytest.mark.spark
@pytest.mark.metastore
def test_delete_refuses_while_leased_then_drops_the_metastore_objects_and_keeps_the_data(
    tmp_path: Path, runtime: Any, endpoint: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"del_{os.getpid()}"
    cfg, registry = _table(tmp_path, runtime, name)
    assert _present(endpoint, name) == list(SUFFIXES), "ensure_tables made every object"
    root = Path(Lake(cfg).layout.root)
    args = ["delete", f"tests.{name}", "--registry-dir", str(registry), "--metastore", endpoint.uri]

    lease = TableLease(Lake(cfg))
    lease.acquire("deploy/run-7", timedelta(hours=1), datetime.now(UTC))
    assert main([*args, "--yes"]) == 1
    err = capsys.readouterr().err
    assert f"tests.{name}: refusing to delete while a run holds the table" in err
    assert "deploy/run-7" in err and f"lease break tests.{name}" in err
    assert _present(endpoint, name) == list(SUFFIXES) and (registry / f"tests.{name}.yaml").exists()

    lease.release("deploy/run-7")
    assert main(args) == 1, "without --yes (and no terminal to ask on) nothing is deleted"
    out, err = capsys.readouterr()
    assert f"drop tests.{name}_base from the metastore" in out and "add --yes" in err
    assert _present(endpoint, name) == list(SUFFIXES)

    assert main([*args, "--yes"]) == 0
    out = capsys.readouterr().out
    assert _present(endpoint, name) == []
    assert not (registry / f"tests.{name}.yaml").exists()
    moved = [p.name for p in registry.iterdir()]
    assert len(moved) == 1 and moved[0].startswith(f"tests.{name}.yaml.deleted-"), moved
    assert root.is_dir() and any(root.iterdir()), "the lake is kept without --drop-data"
    assert f"kept the table's lake {root}" in out and "remove the file from your repository" in out


@pytest.mark.spark
@pytest.mark.metastore
def test_delete_with_drop_data_removes_the_lake_it_owns(
    tmp_path: Path, runtime: Any, endpoint: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"deldata_{os.getpid()}"
    cfg, registry = _table(tmp_path, runtime, name)
    root = Path(Lake(cfg).layout.root)
    assert root.is_dir()
    args = ["delete", f"tests.{name}", "--registry-dir", str(registry), "--metastore", endpoint.uri]
    assert main([*args, "--yes", "--drop-data"]) == 0
    assert _present(endpoint, name) == [] and not root.exists()
    out = capsys.readouterr().out
    assert f"of the table's lake {root} that its records name" in out and "left " not in out


def test_delete_of_a_table_the_registry_does_not_know_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["delete", "tests.nope", "--registry-dir", str(tmp_path), "--yes"]) == 1
    assert "no valid registry entry for table tests.nope" in capsys.readouterr().err


@pytest.mark.s3
def test_glue_drop_table_removes_the_entry_only(aws_default: str) -> None:
    """delete on a Glue catalog: the table's entry goes, a second drop finds nothing (and says so)."""
    import boto3

    from cdc_compaction.core.settings import MetastoreEndpoint

    glue = boto3.client(
        "glue",
        endpoint_url=aws_default,
        region_name="us-east-1",
        aws_access_key_id="testing-access-key",
        aws_secret_access_key="testing-secret-key",
    )
    glue.create_database(DatabaseInput={"Name": "opsdb"})
    glue.create_table(DatabaseName="opsdb", TableInput={"Name": "t_base", "StorageDescriptor": {"Columns": []}})
    with connect(MetastoreEndpoint(kind="glue")) as ms:
        assert ms.drop_table("opsdb", "t_base") is True
        assert ms.get_table("opsdb", "t_base") is None
        assert ms.drop_table("opsdb", "t_base") is False


def test_drop_data_refuses_a_root_the_table_does_not_own_whatever_the_registry_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Table a never ran (no ownership marker); sub_b landed inside its root, its registry file unreadable:
    nothing is read but a's own marker, and without it nothing changes (docs, "Deleting a table")."""
    from cdc_compaction.devtools.conformance import land

    registry = tmp_path / "registry"
    registry.mkdir()
    a = student_doc(tmp_path / "lake", "a")
    (registry / "tests.a.yaml").write_text(yaml.safe_dump(a))
    b = student_doc(tmp_path / "lake", "sub_b", storage_root=str(tmp_path / "lake" / "a" / "sub_b"))
    landed = land(parse_table(b), "increment_2026112200", [[{"id": 1, "full_name": "x", "op": "c", "ts_ms": 1}]])
    (registry / "tests.sub_b.yaml").write_text("storage_root: [unclosed\n")
    args = ["delete", "tests.a", "--registry-dir", str(registry), "--metastore", "127.0.0.1:1", "--yes", "--drop-data"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "tests.a: refusing --drop-data" in err and "has no ownership marker" in err and "Nothing was changed" in err
    assert all(Path(p).is_file() for p in landed) and (registry / "tests.a.yaml").exists()
