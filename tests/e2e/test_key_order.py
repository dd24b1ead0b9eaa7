"""Key order differs from column order: every compaction path keeps the registry's column order.

A table whose ``primary_key`` lists its columns in another order than ``columns`` (or
whose key is the last column) compacted once and then never again: the job's key-lookup
path wrote the key columns first and ``validate`` refused the version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from conftest import compact_once, merge_path_cases

from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.tables import ensure_tables

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

COLUMNS = [
    {"name": "id", "type": "int"},
    {"name": "full_name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
    {"name": "region", "type": "string"},
]


def _rows(*items: tuple[int, str, str | None, str, int]) -> list[dict[str, Any]]:
    return [{"id": i, "region": r, "full_name": n, "op": op, "ts_ms": ts} for i, r, n, op, ts in items]


def _visible(spark: Any, cfg: Any) -> dict[tuple[str, int], str]:
    name = f"`{cfg.database}`.`{table_names(cfg)['base_table']}`"
    spark.catalog.refreshTable(name)
    rows = spark.sql(f"SELECT region, id, full_name FROM {name} WHERE op <> 'd'").collect()
    return {(r["region"], r["id"]): r["full_name"] for r in rows}


KEY_REVERSED = {"primary_key": ["region", "id"]}
PARTITIONED = {"primary_key": ["region", "id"], "partition_by": {"column": "region"}}


@pytest.mark.parametrize(
    ("overrides", "merge_path"),
    merge_path_cases(
        [KEY_REVERSED, PARTITIONED],
        lambda o: "partitioned" if "partition_by" in o else "key-reversed",
        lambda o: "partition_by" in o,
    ),
    indirect=["merge_path"],
)
def test_key_in_another_order_than_the_columns_keeps_compacting(
    make_cfg, runtime, spark, overrides, merge_path
) -> None:
    rt = runtime(make_cfg(columns=COLUMNS, **overrides))
    ensure_tables(rt)
    land(
        rt.cfg,
        "increment_2026112200",
        [_rows((1, "EU", "Ann", "c", 1), (2, "EU", "Ben", "c", 1), (1, "US", "Cy", "c", 1))],
    )
    compact_once(rt, "run-1")
    # Small increments after a first load take the key-lookup path of the job.
    land(rt.cfg, "increment_2026112201", [_rows((1, "EU", "Anna", "u", 2))])
    compact_once(rt, "run-2")
    land(rt.cfg, "increment_2026112202", [_rows((2, "EU", None, "d", 3), (3, "US", "Di", "c", 3))])
    compact_once(rt, "run-3")
    assert rt.lake.latest_commit().seq == 3
    # Each merge path of the job (forced); a partitioned table always takes the window.
    assert rt.lake.latest_commit().stats["merge_path"] == ("window" if "partition_by" in overrides else merge_path)
    assert _visible(spark, rt.cfg) == {("EU", 1): "Anna", ("US", 1): "Cy", ("US", 3): "Di"}
    # Every data file of the live version has the registry's column order.
    want = [c["name"] for c in COLUMNS] + ["_cdc_increment", "_cdc_file", "_cdc_pos", "_cdc_ingested_at"]
    live = rt.lake.latest_commit()
    # (the visible rows, or each partition of them, and the tombstones beside them)
    locations = list((live.partitions or {}).values()) or [rt.lake.data_location(live)]
    locations.append(rt.lake.tombstones_location(live))
    files = [str(p) for loc in locations for p in Path(loc).glob("*.parquet")]
    assert len(files) >= len(locations)
    for f in files:
        assert pq.read_schema(f).names[: len(want)] == want, f
