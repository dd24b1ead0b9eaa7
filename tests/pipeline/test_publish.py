"""The ``publish`` step: the commit record, rolling forward, the lease, partition maps.

On real storage, metastore and Spark (moved here from ``tests/test_tasks.py``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import compact_once, visible_names

from cdc_compaction.core.exceptions import (
    ArchiveError,
    ConcurrentCommitError,
    ConcurrentRunError,
)
from cdc_compaction.core.keyindex import rebuild_index, verify_index
from cdc_compaction.core.lake import TableLease
from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import land
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import attempts, validate

from .helpers import REGION_COLUMNS, commit_record_only, file_mtimes, region_rows, run_job, staged, student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def test_full_run_publishes_archives_and_is_idempotent(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [student_rows((1, "Alice", "c", 1), (2, "Bob", "c", 1))])
    path = compact_once(rt, "run-1")
    assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob"}
    commit = rt.lake.latest_commit()
    assert commit.seq == 1 and commit.increments == ["increment_2026112200"]
    pointer = rt.lake.read_pointer()
    assert pointer is not None and pointer["version"] == commit.version
    with connect(rt.metastore) as ms:
        assert ms.table_location(rt.cfg.database, table_names(rt.cfg)["base_table"]) == pointer["location"]
        assert ms.partitions(rt.cfg.database, table_names(rt.cfg)["incremental_table"]) == {}
    archived = Path(rt.lake.layout.archive) / "c00000001" / "increment_2026112200" / "part-00000.parquet"
    assert archived.exists()
    assert not (Path(rt.lake.layout.incremental) / "increment_2026112200").exists()
    # Retrying publish and archive after success changes nothing and applies nothing twice.
    assert publish(rt, path)["seq"] == 1
    assert archive(rt, path)["archived_files"] == 0
    assert rt.lake.latest_commit().seq == 1
    assert plan(rt, "run-2") == ""


def test_publish_retry_after_unknown_commit_state(make_cfg, runtime, spark) -> None:
    """The commit record was written, then publish died: the retry rolls forward."""
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [student_rows((1, "Alice", "c", 1))])
    compact_once(rt, "run-1")
    land(rt.cfg, "increment_2026112201", [student_rows((1, "Alicia", "u", 2))])
    path = staged(rt, "run-2")
    assert commit_record_only(rt, path)
    # The crash: neither the metastore nor the pointer moved.
    assert visible_names(spark, rt.cfg) == {1: "Alice"}
    assert rt.lake.read_pointer()["seq"] == 1  # type: ignore[index]
    assert publish(rt, path)["seq"] == 2
    assert visible_names(spark, rt.cfg) == {1: "Alicia"}
    assert rt.lake.read_pointer()["seq"] == 2  # type: ignore[index]


def test_a_run_that_lost_its_lease_cannot_publish(make_cfg, runtime, spark) -> None:
    """A stuck run whose lease expired meets the lease, then the commit record's compare-and-swap."""
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [student_rows((1, "Alice", "c", 1))])
    a = plan(rt, "scheduled")
    later = datetime.now(UTC) + rt.cfg.lease_timeout + timedelta(minutes=1)
    b = plan(rt, "manual", now=later)  # a looks dead: its lease expired, b takes over
    assert a != b
    for p in (a, b):
        run_job(rt, p)
        validate(rt, p)
    # The loser's version directory is garbage, removed by a later publish's cleanup.
    losers = [v for v, _ in attempts(rt, json.loads(Path(a).read_text()))]
    assert losers
    with pytest.raises(ConcurrentRunError, match="/manual"):
        publish(rt, a)
    publish(rt, b, now=later)
    archive(rt, b)
    # Once b released the lease, a gets past it -- and the commit record still stops it.
    with pytest.raises(ConcurrentCommitError, match="commit 1 was taken by plan"):
        publish(rt, a)
    with pytest.raises(ArchiveError, match="never committed"):
        archive(rt, a)
    assert rt.lake.latest_commit().seq == 1
    assert visible_names(spark, rt.cfg) == {1: "Alice"}
    TableLease(rt.lake).break_("test")  # a never finishes: an operator gives its lease up
    land(rt.cfg, "increment_2026112201", [student_rows((2, "Bob", "c", 1))])
    compact_once(rt, "next")
    assert not [v for v in losers if (Path(rt.lake.layout.base) / v).exists()]
    assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob"}


def test_partitioned_compaction_reuses_untouched_partitions_by_reference(make_cfg, runtime, spark, monkeypatch) -> None:
    """A mixed lake too: version 1 is written as before issue 37 (``_cdc_partition=<v>`` directories), the
    later ones as since (``cdc_partition=<v>``); the reused old partition is compacted around, validated,
    kept by retention, indexed and read next to the new ones."""
    from cdc_compaction.job.modes import cdc as job_cdc

    rt = runtime(make_cfg(columns=REGION_COLUMNS, partition_by={"column": "region"}, keep_versions=1))
    cfg, lay = rt.cfg, rt.lake.layout
    db, base_table = cfg.database, table_names(cfg)["base_table"]
    ensure_tables(rt)
    land(
        cfg,
        "increment_2026112200",
        [
            region_rows(
                (1, "EU", "Ann", "c", 1),
                (2, "EU", "Ben", "c", 1),
                (3, "US", "Cy", "c", 1),
                (4, "US", "Di", "c", 1),
                (5, "APAC", "Ed", "c", 1),
                (6, "APAC", "Fi", "c", 1),
            )
        ],
    )
    # The job as it was before issue 37: its directories named after the metastore's column.
    with monkeypatch.context() as old_job:
        old_job.setattr(job_cdc, "PARTITION_DIR_COLUMN", "_cdc_partition")
        compact_once(rt, "run-1")
    c1 = rt.lake.latest_commit()
    v1 = lay.version_dir(c1.version)
    assert sorted(c1.partitions) == ["APAC", "EU", "US"]
    assert all(loc.startswith(v1 + "/data/_cdc_partition=") for loc in c1.partitions.values())
    assert all(loc.startswith(v1 + "/index/_cdc_partition=") for loc in c1.index.values())
    assert c1.partition_rows == {"APAC": 2, "EU": 2, "US": 2}
    apac_files = file_mtimes(c1.partitions["APAC"])
    assert apac_files

    # A key-only delete (id 1: EU, found through its key) and a key moving from US to LATAM (id 3).
    land(cfg, "increment_2026112201", [region_rows((1, None, None, "d", 2), (3, "LATAM", "Cy", "u", 2))])
    compact_once(rt, "run-2")
    c2 = rt.lake.latest_commit()
    v2 = lay.version_dir(c2.version)
    assert (c2.stats["partitions_rewritten"], c2.stats["partitions_reused"]) == (3, 1)
    assert c2.stats["base_rows"] == 4, "only EU and US were read"
    # APAC is reused by reference: same directory, same files, untouched.
    assert c2.partitions["APAC"] == c1.partitions["APAC"]
    assert file_mtimes(c2.partitions["APAC"]) == apac_files
    assert {p: loc.startswith(v2 + "/") for p, loc in c2.partitions.items()} == {
        "APAC": False,
        "EU": True,
        "LATAM": True,
        "US": True,
    }
    assert sorted(p.name for p in (Path(v2) / "data").iterdir() if p.is_dir()) == [
        "cdc_partition=EU",
        "cdc_partition=LATAM",
        "cdc_partition=US",
    ]
    # The partitions hold visible rows only: id 1's tombstone is among the tombstones, with its partition.
    assert c2.partition_rows == {"APAC": 2, "EU": 1, "LATAM": 1, "US": 1}
    tombstones = spark.read.parquet(str(Path(v2) / "tombstones")).collect()
    assert [(r["id"], r["op"], r["_cdc_partition"]) for r in tombstones] == [(1, "d", "EU")]
    # Readers: the metastore's partitions and the pointer name the same map.
    with connect(rt.metastore) as ms:
        assert ms.partitions(db, base_table) == c2.partitions
        assert ms.table_location(db, base_table) == lay.base
    assert rt.lake.read_pointer()["partitions"] == c2.partitions
    assert visible_names(spark, cfg) == {2: "Ben", 3: "Cy", 4: "Di", 5: "Ed", 6: "Fi"}
    # The compactor table shows what the last compaction wrote: the rewritten partitions.
    compactor = f"`{db}`.`{table_names(cfg)['compactor_table']}`"
    spark.catalog.refreshTable(compactor)
    assert sorted(r["id"] for r in spark.sql(f"SELECT id FROM {compactor}").collect()) == [2, 3, 4]
    # keep_versions=1: v1 stays for its APAC partition (and its key index) only; the rest is gone.
    assert sorted(p.name for p in Path(v1).iterdir() if p.is_dir()) == ["data", "index"]
    assert sorted(p.name for p in (Path(v1) / "data").iterdir() if p.is_dir()) == ["_cdc_partition=APAC"]
    assert sorted(p.name for p in (Path(v1) / "index").iterdir() if p.is_dir()) == ["_cdc_partition=APAC"]
    # The key index follows the data: the rewritten partitions' in v2, APAC's where v1 wrote it.
    assert c2.index == {
        "APAC": c1.index["APAC"],
        **{p: f"{v2}/index/cdc_partition={p}" for p in ("EU", "LATAM", "US")},
    }
    assert c2.stats["key_lookup"] == {
        "indexed_partitions": 3,
        "scanned_partitions": 0,
        "key_range": True,
        "listed_on_driver": True,
    }

    # The last US key moves to EU: US is touched, ends empty and disappears from the table.
    land(cfg, "increment_2026112202", [region_rows((4, "EU", "Di", "u", 3))])
    compact_once(rt, "run-3")
    c3 = rt.lake.latest_commit()
    assert sorted(c3.partitions) == ["APAC", "EU", "LATAM"]
    assert c3.partitions["LATAM"] == c2.partitions["LATAM"] and c3.partitions["APAC"] == c1.partitions["APAC"]
    assert c3.stats["partitions_touched"] == ["EU", "US"]
    with connect(rt.metastore) as ms:
        assert ms.partitions(db, base_table) == c3.partitions
    assert visible_names(spark, cfg) == {2: "Ben", 3: "Cy", 4: "Di", 5: "Ed", 6: "Fi"}
    versions = sorted(p.name.split("-")[0] for p in Path(lay.base).iterdir())
    assert versions == ["v00000000", "v00000001", "v00000002", "v00000003"], "v1 and v2 hold reused partitions"
    assert sorted(p.name for p in (Path(v2) / "data").iterdir() if p.is_dir()) == ["cdc_partition=LATAM"]
    assert sorted(p.name for p in (Path(v2) / "index").iterdir() if p.is_dir()) == ["cdc_partition=LATAM"]
    assert not (Path(v2) / "tombstones").exists()
    assert c3.index is not None and sorted(c3.index) == sorted(c3.partitions)
    assert verify_index(rt.lake).problems == ()

    # A corrupted index (EU's keys lost: key 2 would not be found by a key-only delete) is caught, named.
    eu_index = next(Path(c3.index["EU"]).glob("*.parquet"))
    pq.write_table(pq.read_table(eu_index).slice(0, 1), eu_index)
    report = verify_index(rt.lake)
    assert len(report.problems) == 1
    assert all(
        s in report.problems[0] for s in (cfg.qualified_name, "'EU'", str(eu_index), "index rebuild", "2 keys")
    ), report.problems
    # index rebuild writes a new index beside (never over) the referenced one; the next plan reads it.
    result = rebuild_index(rt.lake, by="test", now=datetime.now(UTC))
    assert (result.seq, result.partitions, result.rows) == (3, 3, 5)
    assert verify_index(rt.lake).problems == ()
    assert rt.lake.latest_commit().index == c3.index, "the commit record is never written again"
    land(cfg, "increment_2026112203", [region_rows((2, None, None, "d", 4))])  # key-only delete, via the index
    compact_once(rt, "run-4")
    c4 = rt.lake.latest_commit()
    assert c4.stats["partitions_touched"] == ["EU"] and c4.stats["key_lookup"]["indexed_partitions"] == 3
    assert c4.index["APAC"].startswith(result.location + "/") and verify_index(rt.lake).problems == ()
    assert c4.index["APAC"].endswith("/_cdc_partition=APAC"), "rebuilt under its data's (old) name"
    assert visible_names(spark, cfg) == {3: "Cy", 4: "Di", 5: "Ed", 6: "Fi"}


def test_next_history_adds_the_dates_a_version_applied_and_never_takes_one_again() -> None:
    from cdc_compaction.core.exceptions import PublishValidationError
    from cdc_compaction.core.lake import Commit
    from cdc_compaction.modes.snapshot import next_history

    parent = Commit(
        1, "v1", "a", "r1", 0, [], [], outputs={"history": {"2026-11-22": "/b/v1/history/eff_start_date=2026-11-22"}}
    )
    stats = {"history": {"2026-11-23": {"location": "/b/v2/history/eff_start_date=2026-11-23", "rows": 0}}}
    assert next_history(parent, stats) == {
        "2026-11-22": "/b/v1/history/eff_start_date=2026-11-22",
        "2026-11-23": "/b/v2/history/eff_start_date=2026-11-23",
    }
    assert next_history(Commit(0, "v0", "", "", -1, [], []), {"history": {}}) == {}
    again = {"history": {"2026-11-22": {"location": "/b/v2/history/eff_start_date=2026-11-22", "rows": 1}}}
    with pytest.raises(PublishValidationError, match="2026-11-22 exists already"):
        next_history(parent, again)
    # A record without mode outputs (every other mode's) is written as before: no key.
    assert "outputs" not in Commit(1, "v1", "a", "r1", 0, [], []).to_json()
