"""The command line: ``cdc-compaction registry validate`` (``make lint-registry``)."""

from __future__ import annotations

from pathlib import Path

import yaml

from cdc_compaction.core.settings import registry_dir

from .helpers import cli


def test_the_shipped_registry_is_valid() -> None:
    proc = cli("registry", "validate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK    school.student.yaml: school.student -> DAG cdc__school__student" in proc.stdout
    assert "0 invalid of 2 registry files" in proc.stdout
    assert "WARN" not in proc.stdout, proc.stdout


def test_a_time_first_order_on_a_logged_source_is_warned_about(tmp_path: Path) -> None:
    orders = yaml.safe_load((registry_dir() / "shop.orders.yaml").read_text())
    (tmp_path / "shop.orders.yaml").write_text(yaml.safe_dump({**orders, "order_by": ["ts_ms", "lsn"]}))
    proc = cli("registry", "validate", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a warning, not an error
    assert "WARN  shop.orders: order_by starts with 'ts_ms', a time" in proc.stdout
    assert "order_by: [lsn]" in proc.stdout


def test_an_invalid_entry_fails_with_file_and_field(tmp_path: Path) -> None:
    good = yaml.safe_load((registry_dir() / "school.student.yaml").read_text())
    (tmp_path / "school.student.yaml").write_text(yaml.safe_dump(good))
    (tmp_path / "school.bad.yaml").write_text(yaml.safe_dump({**good, "table": "bad", "primary_key": ["nope"]}))
    proc = cli("registry", "validate", "--dir", str(tmp_path))
    assert proc.returncode == 1
    assert "ERROR school.bad.yaml:" in proc.stdout
    assert "field 'primary_key': ['nope'] not among the columns" in proc.stdout
    assert "1 invalid of 2 registry files" in proc.stdout


def test_an_empty_registry_is_an_error(tmp_path: Path) -> None:
    proc = cli("registry", "validate", "--dir", str(tmp_path))
    assert proc.returncode == 1 and "no registry files" in proc.stderr


def _entry(directory: Path, name: str, root: str) -> Path:
    good = yaml.safe_load((registry_dir() / "school.student.yaml").read_text())
    database, table = name.split(".")
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**good, "database": database, "table": table, "storage_root": root}))
    return path


def test_a_root_in_a_system_directory_fails_naming_file_line_and_field(tmp_path: Path) -> None:
    reg = tmp_path / "registry"
    reg.mkdir()
    _entry(reg, "school.student", str(tmp_path / "lake" / "student"))
    bad = _entry(reg, "school.docs", "file:///usr/share/doc/")
    proc = cli("registry", "validate", "--dir", str(reg))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ERROR school.docs.yaml:" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if str(bad) in x)
    assert "field 'storage_root'" in line and "/usr" in line, proc.stdout
    assert "1 invalid of 2 registry files" in proc.stdout


def test_a_fifo_and_a_directory_named_like_entries_fail(tmp_path: Path) -> None:
    import os

    reg = tmp_path / "registry"
    reg.mkdir()
    _entry(reg, "school.student", str(tmp_path / "lake" / "student"))
    os.mkfifo(reg / "school.fifo.yaml")
    (reg / "school.dir.yaml").mkdir()
    proc = cli("registry", "validate", "--dir", str(reg))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "OK    school.student.yaml" in proc.stdout
    assert "ERROR school.fifo.yaml:" in proc.stdout and "is a FIFO" in proc.stdout, proc.stdout
    assert "ERROR school.dir.yaml:" in proc.stdout and "is a directory" in proc.stdout, proc.stdout
    assert "2 invalid of 3 registry files" in proc.stdout
