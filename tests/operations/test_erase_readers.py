"""Readers stay whole after an erase (issue 39): every view dialect reads the erased table at once.

The DuckDB views name the files they read, so an erase that rewrites or removes a file -- an
erase that empties a partition removes its only file -- must write them anew before it returns.
Before, the DuckDB view failed with "No files found that match the pattern" until the next
publish, while the Spark view was right. Expected rows are the landed rows minus the erased ones,
written here by hand.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import compact_once
from pipeline.helpers import REGION_COLUMNS, region_rows

from cdc_compaction.devtools.conformance import DuckDBReader, Reader, land
from cdc_compaction.operations.erase import erase
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def _rows(rows: list[dict[str, Any]]) -> dict[int, tuple[str, str]]:
    return {r["id"]: (r["region"], r["full_name"]) for r in rows}


@pytest.mark.parametrize("partitioned", [True, False], ids=["partitioned", "unpartitioned"])
def test_every_view_dialect_reads_the_table_right_after_an_erase(
    make_cfg: Any, runtime: Any, spark: Any, tmp_path: Any, partitioned: bool
) -> None:
    extra: dict[str, Any] = {"partition_by": {"column": "region"}} if partitioned else {}
    rt = runtime(make_cfg(columns=REGION_COLUMNS, views={"duckdb": str(tmp_path / "duck" / "views.sql")}, **extra))
    cfg = rt.cfg
    ensure_tables(rt)
    land(cfg, "increment_2026112200", [region_rows((1, "eu", "ann", "c", 1), (2, "us", "bob", "c", 1))])
    assert compact_once(rt, "run-1")
    # A pending increment too: the views show it over the base, and the erase rewrites it.
    land(cfg, "increment_2026112201", [region_rows((3, "us", "cy", "c", 2), (4, "eu", "dee", "c", 2))])
    refresh_view(rt)  # the view refresher registers it, as its DAG task does

    erase(cfg, "region = 'us'", actor="test", metastore=rt.metastore)

    expected = {1: ("eu", "ann"), 4: ("eu", "dee")}
    spark_reader, duck = Reader(spark), DuckDBReader()
    assert _rows(spark_reader.view(cfg)) == expected
    assert _rows(duck.view(cfg)) == expected, "the DuckDB view reads the erased table"
    assert _rows(duck.visible_base(cfg)) == {1: ("eu", "ann")}
