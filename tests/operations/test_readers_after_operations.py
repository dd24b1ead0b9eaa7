"""Readers stay whole after rollback, retention and rebuild (issue 39, item 3), as after an erase.

Each operation returns with every reader script it affects written anew: the DuckDB views
execute in a real DuckDB and show the rows the events written here leave visible (computed by
hand, never from the project's view SQL), every file the DuckDB script names exists and belongs
to the live version or to a pending increment, and the metastore's base table (which the Hive
and Trino views read) names the live version's locations only, all of which exist.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import compact_once
from pipeline.helpers import REGION_COLUMNS, region_rows

from cdc_compaction.core.lake import Lake
from cdc_compaction.core.names import table_names
from cdc_compaction.devtools.conformance import DuckDBReader, land
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.operations.travel import rollback
from cdc_compaction.pipeline.rebuild import rebuild
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

#: Two compactions: ann (eu) and bob (us); then bob deleted (us emptied) and cy (ap) inserted.
FIRST = region_rows((1, "eu", "ann", "c", 1), (2, "us", "bob", "c", 1))
SECOND = region_rows((2, "us", None, "d", 2), (3, "ap", "cy", "c", 2))
#: Landed after the second compaction and never compacted: the views show it over the base.
PENDING = region_rows((4, "eu", "dee", "c", 3))


def _rows(rows: list[dict[str, Any]]) -> dict[int, tuple[str, str]]:
    return {r["id"]: (r["region"], r["full_name"]) for r in rows}


def _named_files(script: str) -> list[str]:
    """Every Parquet path a DuckDB script names (quoted literals), read from its text."""
    return sorted(set(re.findall(r"'([^']+\.parquet)'", script)))


def _live_locations(cfg: Any) -> list[str]:
    """The live version's data locations, from the pointer the last commit wrote (what a reader finds)."""
    pointer = Lake(cfg).read_pointer()
    assert pointer is not None
    return sorted((pointer.get("partitions") or {}).values()) or [pointer["location"]]


def _live_tombstones(cfg: Any) -> str:
    pointer = Lake(cfg).read_pointer()
    assert pointer is not None and pointer["tombstones"]
    return str(pointer["tombstones"])


def _check_readers(rt: Any, expected_view: dict[int, tuple[str, str]]) -> None:
    cfg = rt.cfg
    duck = DuckDBReader()
    assert _rows(duck.view(cfg)) == expected_view, "the DuckDB view executes and shows base plus pending rows"
    live = _live_locations(cfg)
    allowed = [*live, _live_tombstones(cfg), Lake(cfg).layout.incremental]
    for path in _named_files(Path(cfg.views.duckdb).read_text(encoding="utf-8")):
        local = path.removeprefix("file:")
        assert os.path.exists(local), f"the DuckDB script names a file that does not exist: {path}"
        assert any(local.startswith(loc.removeprefix("file:") + "/") for loc in allowed), (
            f"the DuckDB script names {path}, neither the live version's ({allowed}) nor a pending increment's"
        )
    # The Hive and Trino views read the base table: it names the live version's locations, which exist.
    names = table_names(cfg)
    with connect(rt.metastore) as ms:
        parts = ms.partitions(cfg.database, names["base_table"])
    assert parts, "the partitioned base table has partitions"
    assert sorted(p.removeprefix("file:") for p in parts.values()) == sorted(
        loc.removeprefix("file:") for loc in live
    ), "the base table's partitions are the live version's"
    for loc in parts.values():
        assert os.path.isdir(loc.removeprefix("file:")), f"the base table names a missing location {loc}"


def _history(rt: Any) -> None:
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [FIRST])
    assert compact_once(rt, "run-1")
    land(rt.cfg, "increment_2026112201", [SECOND])
    assert compact_once(rt, "run-2")
    land(rt.cfg, "increment_2026112202", [PENDING])
    refresh_view(rt)


def _cfg(make_cfg: Any, tmp_path: Any, **extra: Any) -> Any:
    return make_cfg(
        columns=REGION_COLUMNS,
        partition_by={"column": "region"},
        views={"duckdb": str(tmp_path / "duck" / "views.sql"), "metastore": ["spark", "hive", "trino"]},
        **extra,
    )


def test_readers_right_after_rollback_retention_and_rebuild(
    make_cfg: Any, runtime: Any, tmp_path: Any, endpoint: Any
) -> None:
    """One history, three operations, the readers checked after each (one table: one Spark set-up)."""
    rt = runtime(_cfg(make_cfg, tmp_path, keep_versions=2))
    _history(rt)

    # A rollback to version 1: ann and bob again (us comes back from version 1's partition), dee pending.
    rollback(rt.cfg, 1, endpoint, by="test")
    expected = {1: ("eu", "ann"), 2: ("us", "bob"), 4: ("eu", "dee")}
    _check_readers(rt, expected)

    # A compaction whose retention (keep_versions: 2, commits 3 and 4) removes version 2's files.
    assert compact_once(rt, "run-3")
    assert not any(p.name.startswith("v00000002") for p in Path(Lake(rt.cfg).layout.base).iterdir())
    _check_readers(rt, expected)

    # A rebuild published as commit 5, over the same rows.
    assert rebuild(rt, publish=True).published_seq == 5
    _check_readers(rt, expected)
