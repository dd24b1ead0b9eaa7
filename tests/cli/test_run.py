"""Running a table's pipeline by hand (``cdc_compaction.cli.run``): ``rebuild``'s refusals."""

from __future__ import annotations

from pathlib import Path

import yaml

from .helpers import cli


def test_rebuild_refuses_before_spark_starts(tmp_path: Path) -> None:
    """``rebuild``: --verify-only and --publish exclude each other; a keyless table is refused naming its field."""
    proc = cli("rebuild", "web.visits", "--verify-only", "--publish")
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
    registry = tmp_path / "registry"  # beside the lake: a root inside the registry directory is refused
    registry.mkdir()
    (registry / "web.visits.yaml").write_text(yaml.safe_dump(keyless))
    proc = cli("rebuild", "web.visits", "--registry-dir", str(registry))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rebuild: web.visits: field 'mode' is 'keyless'; rebuild replays cdc tables only" in proc.stderr
    proc = cli("rebuild", "web.nope", "--registry-dir", str(registry))
    assert proc.returncode == 1 and "no valid registry entry for table web.nope" in proc.stderr
