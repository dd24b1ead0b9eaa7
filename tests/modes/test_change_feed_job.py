"""The change feed written by the compaction job (README, "Change feed"; issue 38 item 1).

For a ``mode: cdc`` table with ``change_feed: true`` the job writes each commit's net change
beside the new version (``<version>/changes/``, counted in its stats), and ``publish`` copies
that one file to ``changes/c<seq>.parquet`` without reading a row.  The expectation here is a
small diff written in this file from the scenario's expected rows before and after each
compaction -- never the project's diff.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from conftest import merge_path_cases, merge_paths_taken

from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import parse_table
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.pipeline import order

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios" / "cdc"
#: Key changes and a delete by old key (old_key_chain), NULL key parts (nullable_key), partial rows
#: filled anew by a late event (unchanged_late_event), all options together (options_combined).
FEED_SCENARIOS = [SCENARIO_DIR / f"{n}.json" for n in ("old_key_chain", "nullable_key", "unchanged_late_event")]
EXTENDED_SCENARIOS = [SCENARIO_DIR / "options_combined.json"]


def _partial_rows(path: Path) -> bool:
    return bool(json.loads(path.read_text())["table"].get("unchanged"))


def reference_feed(key: list[str], before: list[dict], after: list[dict]) -> list[tuple[str, tuple]]:
    """The net change between two lists of visible rows, by the contract: paired by key (NULL a value),
    insert / delete / update_before + update_after where any compared column differs."""
    cols = sorted({c for r in [*before, *after] for c in r})
    old = {tuple(r.get(c) for c in key): r for r in before}
    new = {tuple(r.get(c) for c in key): r for r in after}
    out: list[tuple[str, tuple]] = []
    for k in set(old) | set(new):
        o, n = old.get(k), new.get(k)
        row = lambda r: tuple(r.get(c) for c in cols)  # noqa: E731 - one line
        if o is None:
            out.append(("insert", row(n)))
        elif n is None:
            out.append(("delete", row(o)))
        elif row(o) != row(n):
            out += [("update_before", row(o)), ("update_after", row(n))]
    return sorted(out, key=repr)


def _committed_steps(scn: conf.Scenario) -> list[list[dict]]:
    """The expected visible rows after each compaction that committed (one that found nothing landed does not)."""
    out, landed = [], False
    for step in scn.steps:
        ((kind, body),) = step.items()
        if kind == "land":
            landed = True
        elif kind == "compact" and landed:
            out.append(body["expect"])
            landed = False
    return out


def _got_feed(table: Any, cols: list[str]) -> list[tuple[str, tuple]]:
    """The feed's rows on the columns the scenario's rows name.  An update that changed only a column
    they leave out (the op column) shows as an equal pair there: dropped, as the expectation cannot see it."""
    rows = [(r["_change_type"], tuple(r[c] for c in cols)) for r in table.to_pylist()]
    befores = Counter(v for t, v in rows if t == "update_before")
    afters = Counter(v for t, v in rows if t == "update_after")
    same = befores & afters
    return sorted(((t, v) for t, v in rows if not (t.startswith("update_") and same[v] > 0)), key=repr), same


def _check_feed(scn: conf.Scenario, lake_dir: Path, suffix: str, partition_by: dict | None = None) -> None:
    cfg = parse_table(conf.registry_doc(scn, lake_dir, suffix, partition_by))
    lake = Lake(cfg)
    afters = _committed_steps(scn)
    assert lake.latest_commit().seq == len(afters)
    key = list(cfg.primary_key)
    before: list[dict] = []
    for seq, after in enumerate(afters, 1):
        commit = lake.read_commit(seq)
        feed = commit.stats.get("change_feed")
        assert feed, f"commit {seq}: the job wrote no change feed (stats {sorted(commit.stats)})"
        job_file = Path(lake.layout.version_dir(commit.version)) / feed["file"]
        published = Path(lake.layout.root) / "changes" / f"c{seq:08d}.parquet"
        # publish copied the job's file, byte for byte
        assert published.read_bytes() == job_file.read_bytes()
        table = pq.read_table(published)
        assert table.column_names == [*cfg.column_names, "_change_type", "_commit_version", "_commit_seq"]
        assert set(table.column("_commit_seq").to_pylist()) <= {seq}
        assert set(table.column("_commit_version").to_pylist()) <= {seq}
        assert str(table.schema.field("_commit_version").type) == "int64"
        assert str(table.schema.field("_commit_seq").type) == "int32"
        counts = Counter(table.column("_change_type").to_pylist())
        assert {k: v for k, v in feed["rows"].items() if v} == dict(counts), (seq, feed, counts)
        # Equal rows are no change: no update pair is the same row twice (over every registry column).
        full = [(r.pop("_change_type"), tuple(r.values())) for r in table.to_pylist()]
        twice = Counter(v for t, v in full if t == "update_before") & Counter(v for t, v in full if t == "update_after")
        assert not twice, f"commit {seq}: updates that change nothing {twice}"
        cols = sorted({c for r in [*before, *after] for c in r})
        got, _ = _got_feed(table, cols)
        assert got == reference_feed(key, before, after), f"commit {seq}"
        before = after


def _feed_on(path: Path) -> conf.Scenario:
    scn = conf.Scenario.load(path)
    scn.table["change_feed"] = True
    scn.table["keep_versions"] = 20
    return scn


@pytest.mark.parametrize(
    ("path", "merge_path"),
    merge_path_cases(FEED_SCENARIOS, lambda p: p.stem, _partial_rows)
    + [
        pytest.param(p, m, id=f"{m}-{p.stem}", marks=pytest.mark.extended)
        for p in EXTENDED_SCENARIOS
        for m in ("window",)
    ],
    indirect=["merge_path"],
)
def test_the_job_writes_each_commits_feed(
    path: Path, inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path, merge_path: str
) -> None:
    """Down each merge path (the first compaction of the window ranks every key, later ones the touched keys)."""
    scn = _feed_on(path)
    suffix = f"_f_{merge_path[0]}"
    result = conf.run_scenario(scn, inprocess, readers, tmp_path / "lake", suffix=suffix)
    assert result.ok, "\n".join(result.failures)
    assert set(merge_paths_taken(tmp_path / "lake")) == {"window" if scn.table.get("unchanged") else merge_path}
    _check_feed(scn, tmp_path / "lake", suffix)


def _one_feed_and_one_tombstone_file_each(lake_dir: Path) -> Counter:
    """Assert that no commit's stats name more than one feed file or one tombstone file; count them."""
    written: Counter = Counter()
    for stats in lake_dir.rglob("_cdc_stats.json"):
        names = [f["name"] for f in json.loads(stats.read_text()).get("output_files", [])]
        for kind in ("tombstones/", "changes/"):
            mine = [n for n in names if n.startswith(kind)]
            assert len(mine) <= 1, (stats, names)
            written[kind] += len(mine)
    return written


@pytest.mark.parametrize("merge_path", ["window"], indirect=True)
def test_a_table_of_several_files_still_gets_one_feed_and_one_tombstone_file(
    inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path, merge_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table sized at more than one output file: the window path filters its winners in parallel and
    shuffles only the rows written into the feed's and the tombstones' one file each (a 50M-row load
    scanned every winner in one task before); the feed is still the contract's."""
    from cdc_compaction.pipeline import plan as plan_module

    three = {"output_files": 3, "max_records_per_file": 0}
    monkeypatch.setattr(plan_module, "sizing", lambda size, rows, target: three)
    scn = _feed_on(SCENARIO_DIR / "old_key_chain.json")
    result = conf.run_scenario(scn, inprocess, readers, tmp_path / "lake", suffix="_f3")
    assert result.ok, "\n".join(result.failures)
    assert "window" in merge_paths_taken(tmp_path / "lake")
    _check_feed(scn, tmp_path / "lake", "_f3")
    _one_feed_and_one_tombstone_file_each(tmp_path / "lake")
    plan_files = (tmp_path / "lake").rglob("_cdc/plans/*.json")
    plans = [json.loads(p.read_text()) for p in plan_files if p.name.count(".") == 1]  # not *.validated.json
    assert plans and all(p.get("output_files") == 3 for p in plans), "not the case meant: a table of several files"


@pytest.mark.parametrize("merge_path", ["broadcast", "window"], indirect=True)
def test_many_events_build_the_feed_and_tombstones_in_parallel_into_one_file_each(
    inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path, merge_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above ``ONE_FILE_SHUFFLE_MIN_EVENTS`` the change rows and the tombstones are built where the winners
    are cached and shuffled to the one task that writes each (a 5M x 10 % feed spent 17 s reading every
    cached winner in that task): still one file of each per commit, the contract's rows, down each path."""
    from cdc_compaction.job.modes import cdc as cdc_job

    monkeypatch.setattr(cdc_job, "ONE_FILE_SHUFFLE_MIN_EVENTS", 0)
    scn = _feed_on(SCENARIO_DIR / "old_key_chain.json")
    suffix = f"_fp_{merge_path[0]}"
    result = conf.run_scenario(scn, inprocess, readers, tmp_path / "lake", suffix=suffix)
    assert result.ok, "\n".join(result.failures)
    assert set(merge_paths_taken(tmp_path / "lake")) == {merge_path}
    _check_feed(scn, tmp_path / "lake", suffix)
    written = _one_feed_and_one_tombstone_file_each(tmp_path / "lake")
    assert written["changes/"] >= 2 and written["tombstones/"] >= 2, f"not the case meant: {written}"


def test_the_job_writes_the_feed_of_a_partitioned_table(
    inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path
) -> None:
    """Keys move between partitions as their name changes, and an old key is retired in another partition."""
    scn = _feed_on(SCENARIO_DIR / "old_key_chain.json")
    part = {"column": "name", "transform": "identity"}
    result = conf.run_scenario(scn, inprocess, readers, tmp_path / "lake", suffix="_fp", partition_by=part)
    assert result.ok, "\n".join(result.failures)
    _check_feed(scn, tmp_path / "lake", "_fp", part)


def test_publish_reads_no_row_data_for_a_job_written_feed(inprocess: conf.InProcessRunner, tmp_path: Path) -> None:
    """The parent version's data files are garbage by the time publish runs: the feed is there all the same."""
    scn = _feed_on(SCENARIO_DIR / "old_key_chain.json")
    doc = conf.registry_doc(scn, tmp_path / "lake", f"_nr_{uuid.uuid4().hex[:6]}")
    cfg = parse_table(doc)
    inprocess.setup(cfg)
    lands = [s["land"] for s in scn.steps if "land" in s]
    conf.land(cfg, lands[0]["increment"], lands[0]["files"])
    inprocess.compact(cfg)
    conf.land(cfg, lands[1]["increment"], lands[1]["files"])
    rt = inprocess.runtime(cfg)
    lake = rt.lake
    parent = lake.latest_commit()
    plan_path, run_id = "", "inprocess__nr"
    for step in order.ORDER:
        if step.takes_plan and not plan_path:
            continue
        if step.id == "publish":
            for f in Path(lake.data_location(parent)).rglob("*.parquet"):
                f.write_bytes(b"not parquet")
        result = step.call(rt, plan_path, run_id)
        if step.id == order.PLAN:
            plan_path = result
    assert lake.latest_commit().seq == 2
    feed = pq.read_table(Path(lake.layout.root) / "changes" / "c00000002.parquet")
    assert sorted(feed.column("_change_type").to_pylist()) == ["insert"]
    assert feed.column("id").to_pylist() == [3]


def test_the_jobs_feed_in_a_version_is_the_tables_own(tmp_path: Path) -> None:
    """Retention and ``delete --drop-data`` remove what the table owns: the job's feed in a version too."""
    from cdc_compaction.pipeline.owned import is_version_part

    scn = _feed_on(SCENARIO_DIR / "old_key_chain.json")
    lake = Lake(parse_table(conf.registry_doc(scn, tmp_path / "lake", "_own")))
    assert is_version_part(lake, "changes/")
    assert is_version_part(lake, "changes/part-00000-0b1c2d3e-c000.snappy.parquet")
    assert not is_version_part(lake, "changes/notes.txt")


@pytest.mark.extended
@pytest.mark.parametrize("merge_path", ["broadcast", "window"], indirect=True)
def test_an_expired_tombstone_is_no_change(
    inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path, merge_path: str
) -> None:
    """Tombstones kept one second: the delete's expires at the next compaction, which changes no visible row
    (its only event is late): an empty feed."""
    scn = _feed_on(SCENARIO_DIR / "nullable_key.json")
    scn.table["tombstone_retention"] = "1s"
    # The third increment no longer brings the deleted key back: only a late update of another key.
    scn.steps[6]["land"]["files"] = [[{"tenant": None, "order_no": 1, "status": "stale", "op": "u", "lsn": 3}]]
    for step in scn.steps[7:]:
        body = next(iter(step.values()))
        body["expect"] = [r for r in body["expect"] if r["order_no"] != 2]
    suffix = f"_fx_{merge_path[0]}"
    result = conf.run_scenario(scn, inprocess, readers, tmp_path / "lake", suffix=suffix)
    assert result.ok, "\n".join(result.failures)
    lake = Lake(parse_table(conf.registry_doc(scn, tmp_path / "lake", suffix)))
    assert int(lake.read_commit(3).stats["expired_tombstones"]) == 1
    assert lake.read_commit(3).stats["change_feed"]["rows"] == dict.fromkeys(
        ("insert", "delete", "update_before", "update_after"), 0
    )
    _check_feed(scn, tmp_path / "lake", suffix)


def test_the_touched_keys_ranking_stays_narrow_with_the_feed(spark: Any) -> None:
    """The feed takes each key's stored row along as one column (``_cdc_old``): the ranking of the touched
    keys shuffles the stored rows' keys, order and provenance and that column, not their every column
    (issue 38 item 1: the feed's price over a compaction without it). The events are whole: their
    winners are written from the ranking."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from cdc_compaction.job.modes import cdc

    ddl = "id bigint, note string, lsn bigint, _cdc_increment string, _cdc_file string, _cdc_pos bigint"
    base = spark.createDataFrame([(1, "stored", 1, "i0", "f0", 0), (2, "other", 1, "i0", "f0", 1)], ddl)
    fresh = spark.createDataFrame([(1, "event", 2, "i1", "f1", 0)], ddl)
    base = base.withColumn("_cdc_old", F.struct("id", "note", "lsn"))
    fresh = fresh.withColumn("_cdc_old", F.lit(None).cast(base.schema["_cdc_old"].dataType))
    rank = "row_number() OVER (PARTITION BY id ORDER BY lsn DESC, _cdc_increment DESC, _cdc_pos DESC)"
    ranks = cdc.rank_touched_keys(base, fresh, ["id"], ["lsn"], rank)
    got = {(r["_cdc_src"], r["_cdc_rank"], r["_cdc_old"] and r["_cdc_old"]["note"], r["note"]) for r in ranks.collect()}
    assert got == {(1, 1, None, "event"), (0, 2, "stored", None)}


def test_the_touched_keys_ranking_reads_the_stored_rows_narrow_and_the_events_whole(spark: Any, tmp_path: Path) -> None:
    """Without the feed the base's Parquet scan reads keys, order and provenance only; the winning event
    comes out of the ranking whole (its winner is written from there, no join back to the events)."""
    from cdc_compaction.job.modes import cdc

    ddl = "id bigint, note string, lsn bigint, _cdc_increment string, _cdc_file string, _cdc_pos bigint"
    spark.createDataFrame([(1, "stored", 1, "i0", "f0", 0), (2, "other", 1, "i0", "f0", 1)], ddl).write.parquet(
        str(tmp_path / "base")
    )
    base = spark.read.schema(ddl).parquet(str(tmp_path / "base"))
    fresh = spark.createDataFrame([(1, "event", 2, "i1", "f1", 0), (1, "older", 0, "i1", "f1", 1)], ddl)
    rank = "row_number() OVER (PARTITION BY id ORDER BY lsn DESC, _cdc_increment DESC, _cdc_pos DESC)"
    ranks = cdc.rank_touched_keys(base, fresh, ["id"], ["lsn"], rank)
    got = {(r["_cdc_src"], r["_cdc_rank"], r["note"]) for r in ranks.collect()}
    assert got == {(1, 1, "event"), (0, 2, None), (1, 3, "older")}
    plan = spark.sparkContext._jvm.PythonSQLUtils.explainString(ranks._jdf.queryExecution(), "simple")
    scans = [line for line in plan.splitlines() if "FileScan parquet" in line]
    # The base is the only Parquet scan (an adaptive plan may show it twice: as planned and as run).
    assert scans and all("ReadSchema: struct<id:bigint,lsn:bigint,_cdc_increment" in s for s in scans), plan
    assert not [s for s in scans if "note" in s], scans
