"""Commands over one table's lake (``cdc_compaction.cli.lake``): ``index verify|rebuild``'s refusals."""

from __future__ import annotations

from pathlib import Path

import yaml

from .helpers import cli


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
    registry = tmp_path / "registry"  # beside the lake: a root inside the registry directory is refused
    registry.mkdir()
    (registry / "web.orders.yaml").write_text(yaml.safe_dump(table))
    for action in ("verify", "rebuild"):
        proc = cli("index", action, "web.orders", "--registry-dir", str(registry))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert f"index {action}: web.orders: has no partition_by, so it has no key index" in proc.stderr
    assert not (tmp_path / "lake").exists() or not list((tmp_path / "lake").rglob("*.parquet")), "nothing written"
