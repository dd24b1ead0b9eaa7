"""Old lakes' partitions (named by the value as it was, before issue 35's encoding) are still read.

A version written before the encoding has ``_cdc_partition=vip`` (and ``=vip%20`` could never be
published).  The job must read such partitions; one that a compaction touches is rewritten whole
under the name the encoding gives its value, and untouched ones stay where they are.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cdc_compaction.core.sql import partition_sql
from cdc_compaction.job import compact as job

from .test_compact import (
    INC1,
    PC,
    MakeCfg,
    assert_reconciles,
    ev,
    land_region,
    make_plan,
    partition_dirs,
    region_cfg,
    with_partition,
)


def test_a_partition_named_by_the_old_rule_is_read_and_its_keys_move_when_updated(
    spark: Any, make_cfg: MakeCfg, tmp_path: Path
) -> None:
    cfg = region_cfg(make_cfg)
    versions = tmp_path / "base"
    # Version 1 as the old naming wrote it: the partition is the value itself, 'vip' and 'Gold'.
    old = with_partition(
        spark,
        cfg,
        [
            ev(cfg, id=1, region="vip", full_name="Ann", op="c", ts_ms=1),
            ev(cfg, id=2, region="vip", full_name="Bob", op="c", ts_ms=1),
            ev(cfg, id=3, region="Gold", full_name="Cy", op="c", ts_ms=1),
        ],
        ["vip", "vip", "Gold"],
    )
    old.write.partitionBy(PC).parquet(str(versions / "v1" / "data"))
    old.limit(0).write.parquet(str(versions / "v1" / "tombstones"))  # no tombstones
    map1 = {v: str(d) for v, d in partition_dirs(versions / "v1").items()}
    assert sorted(Path(p).name for p in map1.values()) == ["_cdc_partition=Gold", "_cdc_partition=vip"]

    second = land_region(
        tmp_path / "incremental",
        INC1,
        [{"id": 1, "region": "vip", "full_name": "Ann B", "op": "u", "ts_ms": 2}],
    )
    plan = make_plan(
        cfg,
        "p2",
        base=versions / "v1",
        files=[second],
        out=versions / "v2",
        quarantine=tmp_path / "q",
        ingested_at=datetime(2026, 11, 22, 2, tzinfo=UTC),
    )
    plan["partition_by"] = partition_sql(cfg).to_dict()
    plan["base_partitions"] = map1
    stats = job.run(spark, plan)
    assert_reconciles(stats)
    live = {**map1, **stats["partitions"]}
    live = {v: loc for v, loc in live.items() if v in stats["partition_rows"] or v not in stats["partitions_touched"]}
    rows = [r for loc in live.values() for r in spark.read.parquet(loc).collect()]
    assert sorted((r["id"], r["region"], r["full_name"]) for r in rows) == [
        (1, "vip", "Ann B"),
        (2, "vip", "Bob"),
        (3, "Gold", "Cy"),
    ]
    # The touched old partition is rewritten whole under the value's encoded name, its other key too.
    shown = {k: stats[k] for k in ("partitions", "partition_rows", "partitions_touched")}
    assert "vip" in stats["partitions_touched"] and "vip" not in stats["partition_rows"], shown
    (renamed,) = stats["partition_rows"]
    assert stats["partition_rows"][renamed] == 2 and renamed.lower() != "vip", shown
    # Gold, untouched, is reused by reference: its old directory stays the partition's.
    assert "Gold" not in stats["partitions_touched"] and live["Gold"] == map1["Gold"]
    # The rewritten one is named as the job names directories since issue 37, without the leading _.
    assert Path(stats["partitions"][renamed]).name == f"cdc_partition={renamed}"
    assert Path(stats["index"][renamed]).name == f"cdc_partition={renamed}"
