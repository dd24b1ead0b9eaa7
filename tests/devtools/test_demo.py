"""``make demo``'s registry copy: the demo's tables with the chosen ``spark.engine``, the rest as written.

The demo's DAG runs read this copy (``CDC_REGISTRY_DIR``), so the engine the demo prints is the
one the tasks run.  Expectations come from the registry files themselves.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cdc_compaction.core import settings
from cdc_compaction.core.registry import load_table
from cdc_compaction.devtools import demo


@pytest.mark.parametrize("engine", ["spark_connect", "spark_submit"])
def test_demo_registry_sets_the_engine_and_keeps_everything_else(engine: str, tmp_path: Path) -> None:
    target = demo.demo_registry(engine, tmp_path / "registry")
    assert sorted(p.name for p in target.iterdir()) == sorted(f"{t}.yaml" for t in demo.TABLES)
    for name in demo.TABLES:
        original = yaml.safe_load((settings.registry_dir() / f"{name}.yaml").read_text())
        copy = yaml.safe_load((target / f"{name}.yaml").read_text())
        assert copy == {**original, "spark": {**original.get("spark", {}), "engine": engine}}
        cfg = load_table(target, name)
        assert cfg.spark.engine == engine
        # README, spark.engine: spark_connect's connection defaults to spark_connect_default.
        assert cfg.spark.conn_id == ("spark_connect_default" if engine == "spark_connect" else "spark_default")


def test_demo_registry_replaces_an_older_copy(tmp_path: Path) -> None:
    target = tmp_path / "registry"
    target.mkdir()
    (target / "stale.table.yaml").write_text("database: stale\n")
    demo.demo_registry("spark_connect", target)
    assert not (target / "stale.table.yaml").exists()
