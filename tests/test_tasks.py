"""The run's steps and their transaction guarantees, on real storage, metastore and Spark."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import STUDENT_COLUMNS, compact_once, visible_names

from cdc_compaction.conformance import land
from cdc_compaction.exceptions import (
    ArchiveError,
    ConcurrentCommitError,
    ConcurrentRunError,
    PlanError,
    PublishValidationError,
    SchemaChangeError,
)
from cdc_compaction.lake import Commit, TableLease
from cdc_compaction.landing import increment_hour
from cdc_compaction.metastore import connect
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.runtime import Runtime, lease_owner
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import attempts, validate
from cdc_compaction.pipeline.views import refresh_view
from cdc_compaction.sql import table_names

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def _rows(*items: tuple[int, str | None, str, int]) -> list[dict[str, Any]]:
    return [{"id": i, "full_name": n, "op": op, "ts_ms": ts} for i, n, op, ts in items]


def _run_job(rt: Runtime, path: str) -> None:
    """The compact task: the Spark job on the plan, in this process."""
    rt.engine.compact(json.loads(rt.lake.storage.read_text(path)))  # type: ignore[attr-defined]


def _staged(rt: Runtime, run_id: str) -> str:
    """plan + compact + validate: a version ready to publish."""
    path = plan(rt, run_id)
    _run_job(rt, path)
    validate(rt, path)
    return path


def _commit_record_only(rt: Runtime, path: str) -> bool:
    """What a publish that dies right after its atomic step leaves: the commit record alone."""
    p = json.loads(Path(path).read_text())
    version, stats = attempts(rt, p)[-1]
    fields = ("seq", "plan_id", "run_id", "parent_seq", "files", "increments")
    return rt.lake.try_commit(Commit(**{f: p[f] for f in fields}, version=version, stats=stats))


def test_plan_is_empty_without_increments_and_reused_on_retry(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    assert plan(rt, "run-1") == ""
    land(rt.cfg, "increment_2026112200", [_rows((1, "a", "c", 1))])
    first = plan(rt, "run-2")
    # A new file landing before the retry must not change the retried plan's input.
    land(rt.cfg, "increment_2026112201", [_rows((2, "b", "c", 1))])
    again = plan(rt, "run-2")
    assert first == again
    doc = json.loads(Path(first).read_text())
    assert [f["increment"] for f in doc["files"]] == ["increment_2026112200"]
    # Another run may not plan while run-2 holds the table's lease...
    with pytest.raises(ConcurrentRunError, match="being compacted by another run"):
        plan(rt, "run-3")
    # ...until an operator breaks it (run-2 is dead); then it plans everything pending.
    TableLease(rt.lake).break_("test")
    other = json.loads(Path(plan(rt, "run-3")).read_text())
    assert [f["increment"] for f in other["files"]] == ["increment_2026112200", "increment_2026112201"]


def test_incomplete_increments_wait(make_cfg, runtime) -> None:
    now = datetime(2026, 11, 22, 10, 30, tzinfo=UTC)
    rt = runtime(make_cfg(increments={"settle_seconds": 600, "wait_for_hour_end": True}))
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112210", [_rows((1, "current hour", "c", 1))])
    land(rt.cfg, "increment_2026112208", [_rows((2, "settled", "c", 1))])
    land(rt.cfg, "increment_2026112209", [_rows((3, "just written", "c", 1))])
    inc = Path(rt.lake.layout.incremental)
    old = now.timestamp() - 3600
    for f in (inc / "increment_2026112208").iterdir():
        os.utime(f, (old, old))
    for f in (inc / "increment_2026112209").iterdir():
        os.utime(f, (now.timestamp() - 5, now.timestamp() - 5))
    doc = json.loads(Path(plan(rt, "r", now=now)).read_text())
    assert doc["increments"] == ["increment_2026112208"]

    marker = runtime(make_cfg(increments={"completion": "marker", "settle_seconds": 0, "wait_for_hour_end": False}))
    ensure_tables(marker)
    land(marker.cfg, "increment_2026112200", [_rows((1, "a", "c", 1))])
    land(marker.cfg, "increment_2026112201", [_rows((2, "b", "c", 1))])
    (Path(marker.lake.layout.incremental) / "increment_2026112201" / "_SUCCESS").write_text("")
    doc = json.loads(Path(plan(marker, "r")).read_text())
    assert doc["increments"] == ["increment_2026112201"]
    assert {f["name"] for f in doc["files"]} == {"part-00000.parquet"}, "markers are not data"


def test_full_run_publishes_archives_and_is_idempotent(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1), (2, "Bob", "c", 1))])
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
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1))])
    compact_once(rt, "run-1")
    land(rt.cfg, "increment_2026112201", [_rows((1, "Alicia", "u", 2))])
    path = _staged(rt, "run-2")
    assert _commit_record_only(rt, path)
    # The crash: neither the metastore nor the pointer moved.
    assert visible_names(spark, rt.cfg) == {1: "Alice"}
    assert rt.lake.read_pointer()["seq"] == 1  # type: ignore[index]
    assert publish(rt, path)["seq"] == 2
    assert visible_names(spark, rt.cfg) == {1: "Alicia"}
    assert rt.lake.read_pointer()["seq"] == 2  # type: ignore[index]


def test_next_plan_rolls_forward_a_crashed_publish_and_archive(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1))])
    assert _commit_record_only(rt, _staged(rt, "run-1"))
    # The run died after the commit record and was never retried: its lease blocks other runs...
    with pytest.raises(ConcurrentRunError):
        plan(rt, "run-2")
    # ...until it expires; then the next run's plan repairs everything.
    later = datetime.now(UTC) + rt.cfg.lease_timeout + timedelta(minutes=1)
    assert plan(rt, "run-2", now=later) == ""
    assert visible_names(spark, rt.cfg) == {1: "Alice"}
    assert rt.lake.is_archived(1)
    assert not (Path(rt.lake.layout.incremental) / "increment_2026112200").exists()


def test_a_second_run_is_refused_by_the_lease_and_changes_nothing(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1))])
    a = plan(rt, "scheduled")
    plans_before = sorted(os.listdir(rt.lake.layout.plans))
    with pytest.raises(ConcurrentRunError, match="/scheduled"):
        plan(rt, "manual")
    assert sorted(os.listdir(rt.lake.layout.plans)) == plans_before, "the refused run wrote nothing"
    _run_job(rt, a)
    validate(rt, a)
    publish(rt, a)
    archive(rt, a)  # releases the lease
    assert plan(rt, "manual") == ""
    assert visible_names(spark, rt.cfg) == {1: "Alice"}


def test_a_run_that_lost_its_lease_cannot_publish(make_cfg, runtime, spark) -> None:
    """A stuck run whose lease expired meets the lease, then the commit record's compare-and-swap."""
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1))])
    a = plan(rt, "scheduled")
    later = datetime.now(UTC) + rt.cfg.lease_timeout + timedelta(minutes=1)
    b = plan(rt, "manual", now=later)  # a looks dead: its lease expired, b takes over
    assert a != b
    for p in (a, b):
        _run_job(rt, p)
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
    land(rt.cfg, "increment_2026112201", [_rows((2, "Bob", "c", 1))])
    compact_once(rt, "next")
    assert not [v for v in losers if (Path(rt.lake.layout.base) / v).exists()]
    assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob"}


def test_validation_refuses_tampered_output(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1), (2, "Bob", "c", 1))])
    path = plan(rt, "run-1")
    _run_job(rt, path)
    out = Path(rt.lake.layout.version_dir(attempts(rt, json.loads(Path(path).read_text()))[-1][0]))
    stats_file = out / "_cdc_stats.json"
    stats = json.loads(stats_file.read_text())
    stats_file.write_text(json.dumps({**stats, "output_rows": 3}))
    with pytest.raises(PublishValidationError, match="do not reconcile"):
        validate(rt, path)
    stats_file.write_text(json.dumps(stats))
    # Where readers glob, only data files: a marker or a checksum file there is refused.
    for junk in ("data/_SUCCESS", "data/.part-0.parquet.crc", "tombstones/_committed_1"):
        (out / junk).write_text("")
        with pytest.raises(PublishValidationError, match="not data files where readers read"):
            validate(rt, path)
        (out / junk).unlink()
    for f in out.glob("data/*.parquet"):
        f.unlink()
    with pytest.raises(PublishValidationError, match="output files differ"):
        validate(rt, path)
    assert rt.lake.latest_commit().seq == 0, "nothing was published"
    assert visible_names(spark, rt.cfg) == {}


def test_validation_refuses_input_changed_after_planning(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1))])
    path = plan(rt, "run-1")
    # The sink rewrote the file after the plan recorded it: the job reads two rows, not one.
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1), (2, "Bob", "c", 1))])
    _run_job(rt, path)
    with pytest.raises(PublishValidationError, match="read 2 increment rows, the planned files held 1"):
        validate(rt, path)


def test_archive_survives_half_done_state_and_refuses_lost_files(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "a", "c", 1)), _rows((2, "b", "c", 1))])
    path = _staged(rt, "run-1")
    publish(rt, path)
    inc = Path(rt.lake.layout.incremental) / "increment_2026112200"
    arch = Path(rt.lake.layout.archive) / "c00000001" / "increment_2026112200"
    # Half-archived: the first file copied and deleted, the second copied only.
    arch.mkdir(parents=True)
    (arch / "part-00000.parquet").write_bytes((inc / "part-00000.parquet").read_bytes())
    (inc / "part-00000.parquet").unlink()
    (arch / "part-00001.parquet").write_bytes((inc / "part-00001.parquet").read_bytes())
    result = archive(rt, path)
    assert result["archived_files"] == 1
    assert sorted(p.name for p in arch.iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert not inc.exists()

    rt2 = runtime(make_cfg())
    ensure_tables(rt2)
    land(rt2.cfg, "increment_2026112200", [_rows((1, "a", "c", 1))])
    path2 = _staged(rt2, "run-1")
    publish(rt2, path2)
    (Path(rt2.lake.layout.incremental) / "increment_2026112200" / "part-00000.parquet").unlink()
    with pytest.raises(ArchiveError, match="neither in the landing area nor archived"):
        archive(rt2, path2)


def test_old_versions_are_cleaned_up(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg(keep_versions=2))
    ensure_tables(rt)
    for hour in range(4):
        land(rt.cfg, f"increment_20261122{hour:02d}", [_rows((1, f"v{hour}", "u", hour))])
        compact_once(rt, f"run-{hour}")
    versions = sorted(p.name for p in Path(rt.lake.layout.base).iterdir() if p.name.startswith("v0000000"))
    live = rt.lake.latest_commit()
    assert live.seq == 4
    # The empty genesis directory and the last two versions remain.
    assert [v.split("-")[0] for v in versions] == ["v00000000", "v00000003", "v00000004"]
    assert visible_names(spark, rt.cfg) == {1: "v3"}


def test_tombstones_expire_after_retention(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg(tombstone_retention="1d"))
    ensure_tables(rt)
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    land(rt.cfg, "increment_2026110100", [_rows((1, "a", "c", 1), (2, "b", "c", 1))])
    compact_once(rt, "r1", now=t0)
    land(rt.cfg, "increment_2026110101", [_rows((2, None, "d", 2))])
    compact_once(rt, "r2", now=t0 + timedelta(hours=1))
    assert rt.lake.latest_commit().stats["output_tombstones"] == 1
    land(rt.cfg, "increment_2026110300", [_rows((3, "c", "c", 3))])
    compact_once(rt, "r3", now=t0 + timedelta(days=3))
    stats = rt.lake.latest_commit().stats
    assert stats["expired_tombstones"] == 1 and stats["output_tombstones"] == 0
    assert visible_names(spark, rt.cfg) == {1: "a", 3: "c"}


def test_ensure_tables_adds_new_columns_and_refuses_dropped_ones(make_cfg, runtime, spark, tmp_path) -> None:
    cfg = make_cfg()
    rt = runtime(cfg)
    first = ensure_tables(rt)
    assert first["ddl_statements"] >= 4
    assert ensure_tables(rt)["ddl_statements"] == 0, "unchanged registry: no DDL, no JVM"
    land(cfg, "increment_2026112200", [_rows((1, "a", "c", 1))])
    compact_once(rt, "r1")
    grown = cfg.model_copy(update={"columns": [*cfg.columns, cfg.columns[1].model_copy(update={"name": "email"})]})
    rt2 = runtime(grown)
    # ADD COLUMNS + fingerprint on four tables (base, tombstones, incremental, compactor), and both
    # views recreated in the same submission.
    assert ensure_tables(rt2)["ddl_statements"] == 10
    base = f"`{cfg.database}`.`{table_names(cfg)['base_table']}`"
    spark.catalog.refreshTable(base)
    assert "email" in spark.table(base).columns
    land(grown, "increment_2026112201", [[{"id": 2, "full_name": "b", "email": "b@x", "op": "c", "ts_ms": 2}]])
    compact_once(rt2, "r2")
    spark.catalog.refreshTable(base)
    got = {r["id"]: r["email"] for r in spark.sql(f"SELECT id, email FROM {base}").collect()}
    assert got == {1: None, 2: "b@x"}
    shrunk = cfg.model_copy(update={"columns": [c for c in cfg.columns if c.name != "full_name"]})
    with pytest.raises(SchemaChangeError, match="full_name"):
        ensure_tables(runtime(shrunk))


def test_column_comments_reach_the_metastore_verbatim(make_cfg, runtime, spark) -> None:
    """Registry text is data: Spark SQL must not substitute ``${...}`` inside the DDL's comments.

    Spark substitutes ``${env:HOME}``, ``${spark.app.name}``, ``${hivevar:x}`` anywhere in a
    statement, string literals included, unless ``spark.sql.variable.substitute`` is false. The
    session is switched to Spark's default (on) first: ``run_sql.py`` must turn it off itself,
    whatever session it is given.
    """
    comments = {"id": "${env:HOME}", "full_name": "${spark.app.name} and ${hivevar:x}", "op": "{{ 7*7 }}"}
    cfg = make_cfg(columns=[{**c, "comment": comments.get(c["name"], "")} for c in STUDENT_COLUMNS])
    rt = runtime(cfg)
    spark.conf.set("spark.sql.variable.substitute", "true")
    try:
        ensure_tables(rt)
    finally:
        spark.conf.set("spark.sql.variable.substitute", "false")
    with connect(rt.metastore) as ms:
        for name in ("base_table", "incremental_table", "compactor_table"):
            table = ms.get_table(cfg.database, table_names(cfg)[name])
            got = {c.name: c.comment for c in table.sd.cols if c.name in comments}
            assert got == comments, name


def test_refresh_view_only_recreates_changed_views(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)  # creates the views too
    submissions: list[list[str]] = []
    engine = rt.engine

    class Counting:
        def run_sql(self, cfg: Any, statements: list[str]) -> None:
            submissions.append(statements)
            engine.run_sql(cfg, statements)

    rt.engine = Counting()
    assert refresh_view(rt)["views_recreated"] == []
    assert submissions == [], "nothing changed: no Spark submission"
    names = table_names(rt.cfg)
    assert refresh_view(rt, force=True)["views_recreated"] == sorted([names["view_name"], names["rejects_view"]])
    assert len(submissions) == 1
    land(rt.cfg, "increment_2026112200", [_rows((1, "a", "c", 1))])
    result = refresh_view(rt)
    assert (result["partitions_added"], result["partitions_dropped"], result["views_recreated"]) == (
        ["increment_2026112200"],
        [],
        [],
    )
    assert len(submissions) == 1, "registering an increment needs no Spark"


def test_reserved_word_columns_work_end_to_end(make_cfg, runtime, spark) -> None:
    """Columns named timestamp, order and group, a composite key and two ordering columns."""
    cfg = make_cfg(
        columns=[
            {"name": "group", "type": "string"},
            {"name": "order", "type": "int"},
            {"name": "timestamp", "type": "timestamp"},
            {"name": "select", "type": "decimal(10,2)"},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "bigint"},
            {"name": "lsn", "type": "bigint"},
        ],
        primary_key=["group", "order"],
        order_by=["ts_ms", "lsn"],
    )
    rt = runtime(cfg)
    ensure_tables(rt)

    def ev(group: str, order: int, select: str, op: str, ts: int, lsn: int) -> dict[str, Any]:
        return {"group": group, "order": order, "timestamp": "2026-11-22T10:00:00Z", "select": select} | {
            "op": op,
            "ts_ms": ts,
            "lsn": lsn,
        }

    land(
        cfg,
        "increment_2026112200",
        [[ev("a", 1, "1.00", "c", 1, 1), ev("a", 1, "2.00", "u", 2, 5), ev("a", 1, "3.00", "u", 2, 4)]],
    )
    land(
        cfg,
        "increment_2026112201",
        [[ev("b", 1, "9.00", "c", 1, 1), ev("b", 2, "8.00", "c", 1, 1), ev("b", 2, "0", "d", 2, 1)]],
    )
    refresh_view(rt)
    names = table_names(cfg)
    view = f"`{cfg.database}`.`{names['view_name']}`"
    for t in ("base_table", "incremental_table"):
        spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
    query = f"SELECT `group`, `order`, CAST(`select` AS STRING) AS s FROM {view} ORDER BY `group`, `order`"
    expected = [("a", 1, "2.00"), ("b", 1, "9.00")]
    assert [tuple(r) for r in spark.sql(query).collect()] == expected
    compact_once(rt, "run-1")
    base = f"`{cfg.database}`.`{names['base_table']}`"
    spark.catalog.refreshTable(base)
    got = spark.sql(f"SELECT `group`, `order`, CAST(`select` AS STRING) FROM {base} WHERE op <> 'd' ORDER BY 1, 2")
    assert [tuple(r) for r in got.collect()] == expected
    assert str(spark.sql(f"SELECT `timestamp` FROM {base} LIMIT 1").first()[0]) == "2026-11-22 10:00:00"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(b"", "empty file", id="zero-byte"),
        pytest.param(b"this is not parquet at all", "ArrowInvalid", id="garbage"),
        pytest.param(None, "ArrowInvalid", id="truncated"),
    ],
)
def test_unreadable_landed_files_are_refused_by_name(make_cfg, runtime, content: bytes | None, reason: str) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    (good,) = land(rt.cfg, "increment_2026112200", [_rows((1, "a", "c", 1))])
    bad = Path(rt.lake.layout.incremental) / "increment_2026112200" / "part-00001.parquet"
    bad.write_bytes(content if content is not None else Path(good).read_bytes()[:-20])
    (Path(good).parent / "_SUCCESS").write_text("")  # markers are not data and never refused
    (Path(good).parent / ".part-00000.parquet.crc").write_text("x")
    with pytest.raises(PlanError) as err:
        plan(rt, "run-1")
    assert str(bad) in str(err.value) and reason in str(err.value)
    assert rt.cfg.qualified_name in str(err.value) and "Nothing was compacted" in str(err.value)
    assert rt.lake.latest_commit().seq == 0 and Path(good).exists() and bad.exists()
    bad.unlink()
    assert plan(rt, "run-2"), "with the bad file moved away, the rest compacts"


# ------------------------------------------------------------------ partitioned tables
REGION_COLUMNS = [
    {"name": "id", "type": "int"},
    {"name": "region", "type": "string"},
    {"name": "full_name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
]


def _regional(*items: tuple[int, str | None, str | None, str, int]) -> list[dict[str, Any]]:
    return [{"id": i, "region": r, "full_name": n, "op": op, "ts_ms": ts} for i, r, n, op, ts in items]


def _files(directory: str) -> dict[str, int]:
    """Every file under ``directory``: path -> mtime (ns)."""
    return {str(p): p.stat().st_mtime_ns for p in Path(directory).rglob("*") if p.is_file()}


def test_partitioned_compaction_reuses_untouched_partitions_by_reference(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg(columns=REGION_COLUMNS, partition_by={"column": "region"}, keep_versions=1))
    cfg, lay = rt.cfg, rt.lake.layout
    db, base_table = cfg.database, table_names(cfg)["base_table"]
    ensure_tables(rt)
    land(
        cfg,
        "increment_2026112200",
        [
            _regional(
                (1, "EU", "Ann", "c", 1),
                (2, "EU", "Ben", "c", 1),
                (3, "US", "Cy", "c", 1),
                (4, "US", "Di", "c", 1),
                (5, "APAC", "Ed", "c", 1),
                (6, "APAC", "Fi", "c", 1),
            )
        ],
    )
    compact_once(rt, "run-1")
    c1 = rt.lake.latest_commit()
    v1 = lay.version_dir(c1.version)
    assert sorted(c1.partitions) == ["APAC", "EU", "US"]
    assert all(loc.startswith(v1 + "/data/_cdc_partition=") for loc in c1.partitions.values())
    assert c1.partition_rows == {"APAC": 2, "EU": 2, "US": 2}
    apac_files = _files(c1.partitions["APAC"])
    assert apac_files

    # A key-only delete (id 1: EU, found through its key) and a key moving from US to LATAM (id 3).
    land(cfg, "increment_2026112201", [_regional((1, None, None, "d", 2), (3, "LATAM", "Cy", "u", 2))])
    compact_once(rt, "run-2")
    c2 = rt.lake.latest_commit()
    v2 = lay.version_dir(c2.version)
    assert (c2.stats["partitions_rewritten"], c2.stats["partitions_reused"]) == (3, 1)
    assert c2.stats["base_rows"] == 4, "only EU and US were read"
    # APAC is reused by reference: same directory, same files, untouched.
    assert c2.partitions["APAC"] == c1.partitions["APAC"]
    assert _files(c2.partitions["APAC"]) == apac_files
    assert {p: loc.startswith(v2 + "/") for p, loc in c2.partitions.items()} == {
        "APAC": False,
        "EU": True,
        "LATAM": True,
        "US": True,
    }
    assert sorted(p.name for p in (Path(v2) / "data").iterdir() if p.is_dir()) == [
        "_cdc_partition=EU",
        "_cdc_partition=LATAM",
        "_cdc_partition=US",
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
    # keep_versions=1: v1 stays for its APAC partition only; its rewritten partitions and tombstones are gone.
    assert sorted(p.name for p in Path(v1).iterdir() if p.is_dir()) == ["data"]
    assert sorted(p.name for p in (Path(v1) / "data").iterdir() if p.is_dir()) == ["_cdc_partition=APAC"]

    # The last US key moves to EU: US is touched, ends empty and disappears from the table.
    land(cfg, "increment_2026112202", [_regional((4, "EU", "Di", "u", 3))])
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
    assert sorted(p.name for p in (Path(v2) / "data").iterdir() if p.is_dir()) == ["_cdc_partition=LATAM"]
    assert not (Path(v2) / "tombstones").exists()


def test_partitioning_cannot_change_under_a_table(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg(columns=REGION_COLUMNS, partition_by={"column": "region"}))
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_regional((1, "EU", "Ann", "c", 1))])
    compact_once(rt, "run-1")
    land(rt.cfg, "increment_2026112201", [_regional((2, "US", "Bob", "c", 2))])
    other = rt.cfg.model_copy(update={"partition_by": rt.cfg.partition_by.model_copy(update={"column": "full_name"})})
    with pytest.raises(PlanError, match=r"'partition_by' is .*full_name.* in the registry, but the live .*'region'"):
        plan(runtime(other), "run-2")
    assert not TableLease(rt.lake).holds(lease_owner("run-2"), datetime.now(UTC)), (
        "the refused plan gave the lease back"
    )
    with pytest.raises(SchemaChangeError, match="field 'partition_by' asks for no partitions"):
        ensure_tables(runtime(rt.cfg.model_copy(update={"partition_by": None})))
    assert compact_once(rt, "run-2"), "the registry as it was still compacts"
    assert visible_names(spark, rt.cfg) == {1: "Ann", 2: "Bob"}


# ------------------------------------------------------------------ the landing area
def test_archive_deletes_only_the_files_it_archived(make_cfg, runtime, monkeypatch) -> None:
    """A writer's temporaries and files landing during archive stay; checksums of archived files go."""
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "a", "c", 1))])
    land(rt.cfg, "increment_2026112201", [_rows((2, "b", "c", 1))])
    inc0 = Path(rt.lake.layout.incremental) / "increment_2026112200"
    inc1 = Path(rt.lake.layout.incremental) / "increment_2026112201"
    # A checksum beside the file (not Hadoop's hidden .x.crc: the local reader would verify it).
    (inc0 / "part-00000.parquet.crc").write_bytes(b"crc")
    path = _staged(rt, "run-1")
    publish(rt, path)
    # After the plan: a writer starts a file in increment 00 (hidden), and one lands in 01 while
    # archive lists the directory (between what used to be its two listings).
    (inc0 / ".part-00001.parquet.inprogress").write_bytes(b"half a file")
    real_list_dir = rt.lake.storage.list_dir
    landed_late: list[Path] = []

    def list_dir(d: str) -> list[Any]:
        out = real_list_dir(d)
        if Path(d) == inc1 and not landed_late:
            landed_late.append(inc1 / "part-00009.parquet")
            landed_late[0].write_bytes(b"landed during archive")
        return out

    monkeypatch.setattr(rt.lake.storage, "list_dir", list_dir)
    result = archive(rt, path)
    monkeypatch.undo()
    assert result["archived_files"] == 2
    assert sorted(p.name for p in inc0.iterdir()) == [".part-00001.parquet.inprogress"], "the checksum went along"
    assert sorted(p.name for p in inc1.iterdir()) == ["part-00009.parquet"], "a file archive never copied stays"
    assert result["dropped_partitions"] == []
    arch = Path(rt.lake.layout.archive) / "c00000001"
    assert sorted(str(p.relative_to(arch)) for p in arch.rglob("*") if p.is_file()) == [
        "increment_2026112200/part-00000.parquet",
        "increment_2026112201/part-00000.parquet",
    ]


def test_increments_with_a_writers_temporaries_wait(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    inc = Path(rt.lake.layout.incremental)
    land(rt.cfg, "increment_2026112200", [_rows((1, "hidden temp", "c", 1))])
    (inc / "increment_2026112200" / ".part-00001.parquet.inprogress").write_bytes(b"x")
    land(rt.cfg, "increment_2026112201", [_rows((2, "temporary dir", "c", 1))])
    (inc / "increment_2026112201" / "_temporary" / "0").mkdir(parents=True)
    land(rt.cfg, "increment_2026112202", [_rows((3, "tmp file", "c", 1))])
    (inc / "increment_2026112202" / "part-00001.parquet.tmp").write_bytes(b"x")
    land(rt.cfg, "increment_2026112203", [_rows((4, "complete", "c", 1))])
    (inc / "increment_2026112203" / "part-00000.parquet.crc").write_bytes(b"crc")  # checksums are no temporaries
    doc = json.loads(Path(plan(rt, "run-1")).read_text())
    assert doc["increments"] == ["increment_2026112203"]
    waiting = {w["increment"]: w["reason"] for w in doc["waiting_increments"]}
    assert sorted(waiting) == ["increment_2026112200", "increment_2026112201", "increment_2026112202"]
    assert ".part-00001.parquet.inprogress" in waiting["increment_2026112200"]
    assert "_temporary" in waiting["increment_2026112201"]


def test_an_increment_waiting_longer_than_alert_after_is_reported_and_alerted_once(make_cfg, runtime, caplog) -> None:
    """Abandoned temporaries or a marker that never came: past alert_after, WARNING + one alert + the reports."""
    from conftest import finish_run

    increments = {"settle_seconds": 0, "wait_for_hour_end": False, "completion": "marker", "alert_after": "6h"}
    rt = runtime(make_cfg(increments=increments))
    assert rt.cfg.increments.alert_after == timedelta(hours=6)
    ensure_tables(rt)
    inc = Path(rt.lake.layout.incremental)

    def complete(name: str, *rows: tuple[int, str | None, str, int]) -> None:
        land(rt.cfg, name, [_rows(*rows)])
        (inc / name / "_SUCCESS").write_bytes(b"")

    complete("increment_2026112200", (1, "done", "c", 1))
    land(rt.cfg, "increment_2026112201", [_rows((2, "no marker", "c", 1))])
    complete("increment_2026112202", (3, "dead writer", "c", 1))
    (inc / "increment_2026112202" / ".part-00001.parquet.inprogress").write_bytes(b"x")
    (inc / "increment_2026112202" / "_temporary" / "0").mkdir(parents=True)
    now = datetime.now(UTC)
    alerts: list[list[dict[str, Any]]] = []

    # Just landed: waiting, not stalled.
    path = plan(rt, "run-1", now=now, on_stalled=alerts.append)
    assert json.loads(Path(path).read_text())["stalled_increments"] == [] and alerts == []
    finish_run(rt, path, now=now)

    # Seven hours on, nothing changed: both are reported (plan file, landing.json, WARNING) and alerted once.
    complete("increment_2026112203", (4, "new", "c", 1))
    caplog.set_level("WARNING", logger="cdc_compaction.pipeline.pending")
    later = now + timedelta(hours=7)
    path = plan(rt, "run-2", now=later, on_stalled=alerts.append)
    doc = json.loads(Path(path).read_text())
    assert doc["increments"] == ["increment_2026112203"]
    stalled = {s["increment"]: s["reason"] for s in doc["stalled_increments"]}
    assert sorted(stalled) == ["increment_2026112201", "increment_2026112202"]
    assert "no _SUCCESS marker" in stalled["increment_2026112201"] and "alert_after" in stalled["increment_2026112201"]
    assert ".part-00001.parquet.inprogress" in stalled["increment_2026112202"]
    assert "_temporary" in stalled["increment_2026112202"] and "remove them" in stalled["increment_2026112202"]
    for name in stalled:
        assert any(
            r.levelname == "WARNING" and str(inc / name) in r.getMessage() and "alert_after" in r.getMessage()
            for r in caplog.records
        ), name
    assert [sorted(a["increment"] for a in batch) for batch in alerts] == [sorted(stalled)]
    report = json.loads(Path(rt.lake.layout.control, "landing.json").read_text())
    assert sorted(s["increment"] for s in report["stalled_increments"]) == sorted(stalled)
    finish_run(rt, path, now=later)

    # Still stalled an hour later: reported again, not alerted again.
    assert plan(rt, "run-3", now=later + timedelta(hours=1), on_stalled=alerts.append) == ""
    report = json.loads(Path(rt.lake.layout.control, "landing.json").read_text())
    assert len(report["stalled_increments"]) == 2 and len(alerts) == 1

    # The marker comes: that increment is compacted; the other stays stalled and is not alerted again.
    (inc / "increment_2026112201" / "_SUCCESS").write_bytes(b"")
    path = plan(rt, "run-4", now=later + timedelta(hours=2), on_stalled=alerts.append)
    doc = json.loads(Path(path).read_text())
    assert doc["increments"] == ["increment_2026112201"]
    assert [s["increment"] for s in doc["stalled_increments"]] == ["increment_2026112202"] and len(alerts) == 1


def test_validate_and_publish_succeed_when_the_alert_cannot_be_delivered(make_cfg, runtime, spark, monkeypatch) -> None:
    """Issue 10 §2.17 as reported: alerts.emails set, no smtp_default connection, refused rows to alert about.

    The DAG's own validate and publish callables (factory.build_dag) on a really staged version:
    both succeed and the version is published; the failed delivery is logged and counted.
    """
    from airflow.sdk.observability.stats import Stats

    from cdc_compaction import factory, notifications

    monkeypatch.delenv("AIRFLOW_CONN_SMTP_DEFAULT", raising=False)
    rt = runtime(make_cfg(alerts={"emails": ["owner@example.org"]}, retries=3))
    assert rt.cfg.alerts.smtp_conn_id == "smtp_default" and rt.cfg.alerts.on_rejected_rows
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1), (2, "Bob", "c", 1), (3, "refused", "x", 1))])
    path = plan(rt, "run-1")
    _run_job(rt, path)
    counted: list[tuple[str, dict[str, str]]] = []
    monkeypatch.setattr(Stats, "incr", lambda name, *a, tags=None, **kw: counted.append((name, tags or {})))
    monkeypatch.setattr(factory, "_runtime", lambda cfg: rt)
    before = notifications.DELIVERY_FAILURES[rt.cfg.qualified_name]
    dag = factory.build_dag(rt.cfg)
    # On the module's logger itself: looking up the connection makes Airflow reconfigure the root logger.
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger(notifications.__name__).addHandler(handler)
    try:
        stats = dag.get_task("validate").python_callable(plan_path=path)
        published = dag.get_task("publish").python_callable(plan_path=path)
    finally:
        logging.getLogger(notifications.__name__).removeHandler(handler)

    assert stats["rejected_rows"] == 1
    assert published["version"] == rt.lake.latest_commit().version == stats["version"]
    assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob"}
    failed = [r for r in records if "could not deliver the alert" in r.getMessage()]
    assert (
        len(failed) == 1
        and "smtp_default" in failed[0].getMessage()
        and "1 change events refused" in (failed[0].getMessage())
    )
    assert failed[0].exc_info is not None and "connection is not found" in str(failed[0].exc_info[1])
    assert notifications.DELIVERY_FAILURES[rt.cfg.qualified_name] == before + 1
    assert counted == [(notifications.DELIVERY_FAILED_METRIC, {"table": rt.cfg.qualified_name})]


def test_landing_entries_a_run_does_not_take_are_reported(make_cfg, runtime, caplog) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    inc = Path(rt.lake.layout.incremental)
    (good,) = land(rt.cfg, "increment_2026112200", [_rows((1, "a", "c", 1))])
    (inc / "increment_2026112200" / "late").mkdir()
    (inc / "increment_2026112200" / "late" / "part-00000.parquet").write_bytes(Path(good).read_bytes())
    (inc / "stray.parquet").write_bytes(Path(good).read_bytes())
    land(rt.cfg, "increment_202611229", [_rows((2, "not zero-padded", "c", 1))])
    land(rt.cfg, "hourly_2026112201", [_rows((3, "other layout", "c", 1))])
    assert increment_hour(rt.cfg, "increment_202611229") is None
    assert increment_hour(rt.cfg, "increment_2026112209") == datetime(2026, 11, 22, 9, tzinfo=UTC)
    alerts: list[list[dict[str, Any]]] = []

    def undeliverable(entries: list[dict[str, Any]]) -> None:
        alerts.append(entries)
        raise ConnectionRefusedError("smtp is down")

    caplog.set_level("WARNING", logger="cdc_compaction.pipeline.pending")
    path = plan(rt, "run-1", on_ignored=undeliverable)
    doc = json.loads(Path(path).read_text())
    assert doc["increments"] == ["increment_2026112200"]
    assert [f["name"] for f in doc["files"]] == ["part-00000.parquet"]
    ignored = {Path(i["path"]).relative_to(inc).as_posix(): i["reason"] for i in doc["ignored_landing"]}
    assert sorted(ignored) == ["hourly_2026112201", "increment_2026112200/late", "increment_202611229", "stray.parquet"]
    assert "subdirectory" in ignored["increment_2026112200/late"]
    assert "zero-padded" in ignored["increment_202611229"]
    assert "not in an increment directory" in ignored["stray.parquet"]
    for p in ignored:
        assert any(str(inc / p) in r.getMessage() and r.levelname == "WARNING" for r in caplog.records), p
    assert "could not send the alert" in caplog.text, "an undeliverable alert is logged, the plan goes on"
    assert len(alerts) == 1 and len(alerts[0]) == 4
    report = json.loads(Path(rt.lake.layout.control, "landing.json").read_text())
    assert len(report["ignored_landing"]) == 4
    # The retry of the alert: the next plan tries again (it was never delivered), then stops repeating it.
    from conftest import finish_run

    finish_run(rt, path)
    delivered: list[list[dict[str, Any]]] = []
    assert plan(rt, "run-2", on_ignored=delivered.append) == ""
    assert plan(rt, "run-3", on_ignored=delivered.append) == ""
    assert [len(d) for d in delivered] == [4]


def test_one_unreadable_pending_file_does_not_break_the_views(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    cfg, names = rt.cfg, table_names(rt.cfg)
    ensure_tables(rt)
    land(cfg, "increment_2026112200", [_rows((1, "Alice", "c", 1))])
    compact_once(rt, "run-1")
    land(cfg, "increment_2026112201", [_rows((2, "Bob", "c", 1), (None, "no key", "c", 1))])  # type: ignore[arg-type]
    (good,) = land(cfg, "increment_2026112202", [_rows((3, "Carol", "c", 1))])
    assert refresh_view(rt)["partitions_added"] == ["increment_2026112201", "increment_2026112202"]
    truncated = Path(good).with_name("part-00001.parquet")
    truncated.write_bytes(Path(good).read_bytes()[:-20])

    def query() -> tuple[dict[int, str], list[str]]:
        for t in ("base_table", "incremental_table"):
            spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
        view = spark.sql(f"SELECT * FROM `{cfg.database}`.`{names['view_name']}`").collect()
        rejects = spark.sql(f"SELECT * FROM `{cfg.database}`.`{names['rejects_view']}`").collect()
        return {r["id"]: r["full_name"] for r in view}, [r["_cdc_reject_reason"] for r in rejects]

    # The plan refuses the file (on_bad_file: fail) -- and first takes its increment out of the view.
    with pytest.raises(PlanError, match=r"part-00001\.parquet"):
        plan(rt, "run-2")
    assert query() == ({1: "Alice", 2: "Bob"}, ["null_key:id"])
    result = refresh_view(rt)
    assert [(h["increment"], Path(h["path"]).name) for h in result["held_back"]] == [
        ("increment_2026112202", "part-00001.parquet")
    ]
    assert "not readable as Parquet" in result["held_back"][0]["reason"]
    sidecar = json.loads(Path(rt.lake.layout.control, "view_held_back.json").read_text())
    assert sidecar["held_back"] == result["held_back"]
    assert query() == ({1: "Alice", 2: "Bob"}, ["null_key:id"])
    truncated.unlink()  # fixed: the increment comes back
    assert refresh_view(rt)["partitions_added"] == ["increment_2026112202"]
    assert query()[0] == {1: "Alice", 2: "Bob", 3: "Carol"}
