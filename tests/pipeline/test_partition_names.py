"""Partition values that differ only in spaces, case or Unicode normalization stay apart (issue 35).

Hive's metastore (Derby's unique index on the partition name compares ``'vip'`` and ``'vip '``
as equal, as do MySQL's case-insensitive collations) and case- or normalization-insensitive file
systems must never see two partitions of one table as one: every publish of the table would fail.
A real partitioned compaction on the real metastore, read back through Spark and DuckDB.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import pytest
from conftest import compact_once

from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import DuckDBReader, Reader, land
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.pipeline.tables import ensure_tables

from .helpers import REGION_COLUMNS, region_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

NFC = unicodedata.normalize("NFC", "\u00e9")  # é, one code point
NFD = unicodedata.normalize("NFD", "\u00e9")  # e + combining acute accent
VALUES = {1: "vip", 2: "vip ", 3: "VIP", 4: " vip", 5: NFC, 6: NFD, 7: "Vip", 8: "eu"}


def _folded(name: str) -> str:
    """What a forgiving store compares: case, Unicode normalization and surrounding spaces ignored."""
    return unicodedata.normalize("NFKC", name).casefold().strip()


def _by_id(rows: list[dict[str, Any]]) -> dict[int, str]:
    return {r["id"]: r["region"] for r in rows}


def test_values_differing_in_spaces_case_or_normalization_publish_apart(make_cfg, runtime, spark, tmp_path) -> None:
    rt = runtime(
        make_cfg(
            columns=REGION_COLUMNS,
            partition_by={"column": "region"},
            views={"duckdb": str(tmp_path / "duck" / "views.sql")},
        )
    )
    cfg = rt.cfg
    ensure_tables(rt)
    land(cfg, "increment_2026112200", [region_rows(*((i, v, f"n{i}", "c", 1) for i, v in VALUES.items()))])
    assert compact_once(rt, "run-1")
    commit = rt.lake.latest_commit()
    assert commit.partitions is not None and len(commit.partitions) == len(VALUES)
    names = [Path(loc).name for loc in commit.partitions.values()]
    assert len({_folded(n) for n in names}) == len(VALUES), f"partition names collide on a forgiving store: {names}"
    with connect(rt.metastore) as ms:
        assert ms.partitions(cfg.database, table_names(cfg)["base_table"]) == commit.partitions
    spark_reader, duck = Reader(spark), DuckDBReader()
    assert _by_id(spark_reader.visible_base(cfg)) == VALUES
    assert _by_id(duck.visible_base(cfg)) == VALUES
    assert _by_id(spark_reader.view(cfg)) == VALUES
    assert _by_id(duck.view(cfg)) == VALUES
    # A second compaction rewrites every partition in place (each key's partition is found again).
    land(cfg, "increment_2026112201", [region_rows(*((i, v, f"m{i}", "u", 2) for i, v in VALUES.items()))])
    assert compact_once(rt, "run-2")
    after = rt.lake.latest_commit()
    assert sorted(after.partitions) == sorted(commit.partitions)
    assert after.partition_rows == dict.fromkeys(commit.partitions, 1)
    rows = spark_reader.visible_base(cfg)
    assert {r["id"]: (r["region"], r["full_name"]) for r in rows} == {i: (v, f"m{i}") for i, v in VALUES.items()}
    assert _by_id(duck.view(cfg)) == VALUES
