"""Tables written before tombstones moved out of the base (layout 1) need no manual step.

Layout 1 kept a version's tombstones among its rows, in the version directory itself (for
a partitioned table, inside each partition), and had no ``<t>_tombstones`` table.  The
next compaction after an upgrade writes layout 2; until then the views still hide what
the old base's tombstones delete.  Each test builds a table with this release, rewrites
its live version into layout 1 exactly as the old release left it (files, commit record,
pointer, metastore), then lets this release run on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import compact_once

from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import land
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

REGION_COLUMNS = [
    {"name": "id", "type": "int"},
    {"name": "region", "type": "string"},
    {"name": "full_name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
]


def _rows(*rows: tuple[Any, ...], regional: bool = False) -> list[dict[str, Any]]:
    names = ["id", "region", "full_name", "op", "ts_ms"] if regional else ["id", "full_name", "op", "ts_ms"]
    return [dict(zip(names, r, strict=True)) for r in rows]


def downgrade_to_layout_1(rt: Runtime) -> None:
    """Rewrite the live (only) version as the release before layout 2 left it."""
    lake, cfg = rt.lake, rt.cfg
    commit = lake.latest_commit()
    vdir = Path(lake.layout.version_dir(commit.version))
    tombs = [pq.read_table(p) for p in sorted((vdir / "tombstones").glob("*.parquet"))]
    doc = json.loads(Path(lake.layout.commit_path(commit.seq)).read_text())
    doc.pop("layout")
    doc.pop("freshness", None)
    if cfg.partition_by is None:
        for f in (vdir / "data").glob("*.parquet"):
            f.rename(vdir / f.name)
        for i, t in enumerate(tombs):
            pq.write_table(t, vdir / f"part-tomb-{i}.parquet", use_deprecated_int96_timestamps=True)
        location = str(vdir)
    else:
        parts, rows = {}, {}
        for d in sorted((vdir / "data").iterdir()):
            # Layout 1 predates issue 37: its partition directories were named _cdc_partition=<v>.
            d.rename(vdir / f"_cdc_partition={d.name.split('=', 1)[1]}")
        for t in tombs:
            for value in set(t.column("_cdc_partition").to_pylist()):
                part = t.filter(pc.equal(t["_cdc_partition"], value)).drop_columns(["_cdc_partition"])
                target = vdir / f"_cdc_partition={value}"
                target.mkdir(exist_ok=True)
                pq.write_table(part, target / "part-tomb.parquet", use_deprecated_int96_timestamps=True)
        for d in sorted(vdir.iterdir()):
            if d.name.startswith("_cdc_partition="):
                value = d.name.split("=", 1)[1]
                parts[value] = str(d)
                rows[value] = sum(pq.read_metadata(f).num_rows for f in d.glob("*.parquet"))
        doc["partitions"], doc["partition_rows"] = parts, rows
        location = lake.layout.base
    shutil.rmtree(vdir / "data")
    shutil.rmtree(vdir / "tombstones")
    Path(lake.layout.commit_path(commit.seq)).write_text(json.dumps(doc))
    pointer = {"table": cfg.qualified_name, "seq": commit.seq, "version": commit.version, "location": str(vdir)}
    if cfg.partition_by is not None:
        pointer["partitions"] = doc["partitions"]
    Path(lake.layout.pointer).write_text(json.dumps(pointer))
    names = table_names(cfg)
    with connect(rt.metastore) as ms:
        if cfg.partition_by is None:
            ms.set_location(cfg.database, names["base_table"], location)
        else:
            ms.set_partitions(cfg.database, names["base_table"], doc["partitions"])
        # The old release had no tombstones table, and its views read the base alone.
        ms._c.drop_table(cfg.database, names["tombstones_table"], False)
        for view in (names["view_name"], names["rejects_view"]):
            ms._c.drop_table(cfg.database, view, False)


def _read(spark: Any, cfg: Any, role: str) -> list[tuple[Any, ...]]:
    name = f"`{cfg.database}`.`{table_names(cfg)[role]}`"
    spark.catalog.refreshTable(name)
    return sorted(tuple(r) for r in spark.sql(f"SELECT id, full_name, op FROM {name}").collect())


@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "partitioned"])
def test_a_layout_1_table_moves_to_layout_2_with_its_next_compaction(
    make_cfg: Any, runtime: Any, spark: Any, partitioned: bool
) -> None:
    over = {"columns": REGION_COLUMNS, "partition_by": {"column": "region"}} if partitioned else {}
    rt = runtime(make_cfg(**over))
    cfg = rt.cfg
    ensure_tables(rt)
    first = [(1, "EU", "Ann", "c", 1), (2, "EU", "Bob", "c", 1), (3, "US", "Cy", "c", 1), (2, "EU", None, "d", 2)]
    if not partitioned:
        first = [(i, n, o, t) for i, _, n, o, t in first]
    land(cfg, "increment_2026112200", [_rows(*first, regional=partitioned)])
    compact_once(rt, "run-1")
    downgrade_to_layout_1(rt)
    old = rt.lake.latest_commit()
    assert old.layout == 1

    # The old layout as readers met it: Bob's tombstone among the base's rows.
    assert (2, None, "d") in _read(spark, cfg, "base_table")
    # The upgraded release's first task recreates what is missing; the view hides the old tombstone.
    ensure_tables(rt)
    refresh_view(rt)
    assert _read(spark, cfg, "view_name") == [(1, "Ann", "c"), (3, "Cy", "c")]

    # A late event older than Bob's delete must not bring him back; Ann changes.
    later = [(2, "EU", "Bob again, too late", "u", 1), (1, "EU", "Anna", "u", 3)]
    if not partitioned:
        later = [(i, n, o, t) for i, _, n, o, t in later]
    land(cfg, "increment_2026112201", [_rows(*later, regional=partitioned)])
    compact_once(rt, "run-2")
    refresh_view(rt)
    new = rt.lake.latest_commit()
    assert (new.seq, new.layout) == (2, 2)
    assert new.stats["base_rows"] == 3, "the whole old version was read, its tombstone included"

    # Layout 2: the base table holds the visible rows only, the tombstone has its own table.
    assert _read(spark, cfg, "base_table") == [(1, "Anna", "u"), (3, "Cy", "c")]
    assert _read(spark, cfg, "tombstones_table") == [(2, None, "d")]
    assert _read(spark, cfg, "view_name") == [(1, "Anna", "u"), (3, "Cy", "c")]
    locations = list((new.partitions or {}).values()) or [rt.lake.data_location(new)]
    with duckdb.connect() as con:
        got = con.execute(
            "SELECT id, full_name FROM read_parquet(?) ORDER BY id", [[f"{loc}/*.parquet" for loc in locations]]
        ).fetchall()
    assert got == [(1, "Anna"), (3, "Cy")]
    if partitioned:
        # Every partition was rewritten once (layout 1 kept tombstones inside them): none is reused.
        assert new.stats["partitions_reused"] == 0
        assert all("/data/cdc_partition=" in loc for loc in new.partitions.values())


def test_a_snapshot_tables_history_named_at_the_top_level_of_its_commit_records_keeps_working(
    make_snapshot_cfg, runtime, spark
) -> None:
    """Records written before ``outputs`` kept a snapshot table's history partitions in a top-level ``history``.

    This release reads them as before: publish registers those partitions, retention keeps the
    old version that holds one, and the next plan applies only dates after the last one recorded.
    """
    from conftest import snapshot_state

    from cdc_compaction.pipeline.publish import sync_base_location
    from cdc_compaction.pipeline.retention import cleanup_versions

    rt = runtime(make_snapshot_cfg(keep_versions=1))
    cfg, lake = rt.cfg, rt.lake
    ensure_tables(rt)
    land(cfg, "increment_2026112200", [[{"id": 1, "full_name": "Ann"}, {"id": 2, "full_name": "Bob"}]])
    compact_once(rt, "run-1")
    land(cfg, "increment_2026112300", [[{"id": 2, "full_name": "Bobby"}, {"id": 3, "full_name": "Cy"}]])
    compact_once(rt, "run-2")
    v1 = lake.read_commit(1).version
    # Both records as the release before outputs wrote them: no outputs, the partitions at the top level.
    for seq in (1, 2):
        path = Path(lake.layout.commit_path(seq))
        doc = json.loads(path.read_text())
        # ... and with absolute locations, as every record was written before records named them relative to the root.
        doc["history"] = {d: str(Path(lake.layout.root) / loc) for d, loc in doc.pop("outputs")["history"].items()}
        path.write_text(json.dumps(doc))
    assert sorted(doc["history"]) == ["2026-11-22", "2026-11-23"]
    day1 = Path(doc["history"]["2026-11-22"])
    assert day1.parent.parent == Path(lake.layout.version_dir(v1)), "the first date stays in the version that wrote it"
    # Retention reads the record's partitions: v1 stays (for its one history partition), with keep_versions 1.
    cleanup_versions(rt, 2)
    assert day1.is_dir() and any(day1.glob("*.parquet"))
    # Publish reads them too: the history's partitions, lost from the metastore, are registered again.
    history = f"{cfg.table}_history"
    with connect(rt.metastore) as ms:
        ms.drop_partitions(cfg.database, history, list(ms.partitions(cfg.database, history)))
        assert ms.partitions(cfg.database, history) == {}
        sync_base_location(rt, ms, lake.latest_commit())
    day2 = {(1, "Ann", "D"), (2, "Bobby", "U"), (3, "Cy", "I")}
    current, dates = snapshot_state(spark, cfg)
    assert {d: set(rows) for d, rows in dates.items()} == {
        "2026-11-22": {(1, "Ann", "I"), (2, "Bob", "I")},
        "2026-11-23": day2,
    }
    # The next plan starts after the last date the old record names: 2026-11-23 again is a replay.
    land(cfg, "increment_2026112312", [[{"id": 9, "full_name": "Zed"}]])
    land(cfg, "increment_2026112400", [[{"id": 3, "full_name": "Cyd"}]])
    plan_doc = json.loads(Path(compact_once(rt, "run-3")).read_text())
    assert plan_doc["last_applied"] == "2026-11-23"
    commit = lake.latest_commit()
    assert commit.seq == 3 and commit.stats["replayed"] == 1
    # The new record names every partition so far, in its outputs (nothing at the top level any more).
    doc = json.loads(Path(lake.layout.commit_path(3)).read_text())
    assert "history" not in doc and sorted(doc["outputs"]["history"]) == ["2026-11-22", "2026-11-23", "2026-11-24"]
    current, dates = snapshot_state(spark, cfg)
    assert current == {3: ("Cyd", "U", "2026-11-24")}
    assert {d: set(rows) for d, rows in dates.items()} == {
        "2026-11-22": {(1, "Ann", "I"), (2, "Bob", "I")},
        "2026-11-23": day2,
        "2026-11-24": {(2, "Bobby", "D"), (3, "Cyd", "U")},
    }
