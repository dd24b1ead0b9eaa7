"""The command line: ``cdc-compaction registry validate`` (``make lint-registry``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from cdc_compaction.core.settings import PROJECT_ROOT, registry_dir


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins")}
    return subprocess.run(
        [sys.executable, "-m", "cdc_compaction", *args], capture_output=True, text=True, env=env, check=False
    )


def test_the_shipped_registry_is_valid() -> None:
    proc = _cli("registry", "validate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK    school.student.yaml: school.student -> DAG cdc__school__student" in proc.stdout
    assert "0 invalid of 2 registry files" in proc.stdout
    assert "WARN" not in proc.stdout, proc.stdout


def test_a_time_first_order_on_a_logged_source_is_warned_about(tmp_path: Path) -> None:
    orders = yaml.safe_load((registry_dir() / "shop.orders.yaml").read_text())
    (tmp_path / "shop.orders.yaml").write_text(yaml.safe_dump({**orders, "order_by": ["ts_ms", "lsn"]}))
    proc = _cli("registry", "validate", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a warning, not an error
    assert "WARN  shop.orders: order_by starts with 'ts_ms', a time" in proc.stdout
    assert "order_by: [lsn]" in proc.stdout


def test_an_invalid_entry_fails_with_file_and_field(tmp_path: Path) -> None:
    good = yaml.safe_load((registry_dir() / "school.student.yaml").read_text())
    (tmp_path / "school.student.yaml").write_text(yaml.safe_dump(good))
    (tmp_path / "school.bad.yaml").write_text(yaml.safe_dump({**good, "table": "bad", "primary_key": ["nope"]}))
    proc = _cli("registry", "validate", "--dir", str(tmp_path))
    assert proc.returncode == 1
    assert "ERROR school.bad.yaml:" in proc.stdout
    assert "field 'primary_key': ['nope'] not among the columns" in proc.stdout
    assert "1 invalid of 2 registry files" in proc.stdout


def test_an_empty_registry_is_an_error(tmp_path: Path) -> None:
    proc = _cli("registry", "validate", "--dir", str(tmp_path))
    assert proc.returncode == 1 and "no registry files" in proc.stderr


def test_postgres_check_finds_the_server_and_wal2json() -> None:
    """``make test`` runs this first: PostgreSQL with wal2json is a test requirement, not a skip."""
    proc = _cli("postgres", "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PostgreSQL server binaries in" in proc.stdout and "with wal2json" in proc.stdout


def test_rebuild_refuses_before_spark_starts(tmp_path: Path) -> None:
    """``rebuild``: --verify-only and --publish exclude each other; a keyless table is refused naming its field."""
    proc = _cli("rebuild", "web.visits", "--verify-only", "--publish")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr
    keyless = {
        "mode": "keyless",
        "database": "web",
        "table": "visits",
        "columns": [
            {"name": "name", "type": "string"},
            {"name": "_before_name", "type": "string"},
            {"name": "op", "type": "string"},
            {"name": "lsn", "type": "bigint"},
        ],
        "order_by": ["lsn"],
        "storage_root": str(tmp_path / "lake"),
    }
    (tmp_path / "web.visits.yaml").write_text(yaml.safe_dump(keyless))
    proc = _cli("rebuild", "web.visits", "--registry-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rebuild: web.visits: field 'mode' is 'keyless'; rebuild replays cdc tables only" in proc.stderr
    proc = _cli("rebuild", "web.nope", "--registry-dir", str(tmp_path))
    assert proc.returncode == 1 and "no valid registry entry for table web.nope" in proc.stderr


def test_index_commands_refuse_a_table_without_partition_by(tmp_path: Path) -> None:
    """``index verify|rebuild``: an unpartitioned table has no key index; the refusal names the table and why."""
    table = {
        "database": "web",
        "table": "orders",
        "columns": [
            {"name": "id", "type": "bigint"},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "bigint"},
        ],
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": str(tmp_path / "lake"),
    }
    (tmp_path / "web.orders.yaml").write_text(yaml.safe_dump(table))
    for action in ("verify", "rebuild"):
        proc = _cli("index", action, "web.orders", "--registry-dir", str(tmp_path))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"index {action}: web.orders: has no partition_by, so it has no key index" in proc.stderr
    assert not (tmp_path / "lake").exists() or not list((tmp_path / "lake").rglob("*.parquet")), "nothing written"
