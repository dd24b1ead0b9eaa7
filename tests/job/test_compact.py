"""The PySpark compaction job: its pure transformations and one end-to-end ``run``.

The rule fragments come from ``rule_sql(cfg)``, exactly as the DAG's plan task hands them
to the job, so these tests exercise the rule the job and the view share
(see shared/conformance/README.md for the rule itself).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import Observation
from pyspark.sql.functions import expr

from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.sql import rule_sql, spark_schema_ddl
from cdc_compaction.job import compact as job

pytestmark = pytest.mark.spark

INC0 = "increment_2026112200"
INC1 = "increment_2026112201"
INC2 = "increment_2026112202"
F0 = "part-00000.parquet"
F1 = "part-00001.parquet"
F9 = "part-00009.parquet"
T0 = datetime(2026, 11, 22, 0, 0)  # naive UTC, as the job's _ts() produces
PROVENANCE_DDL = "`_cdc_increment` string, `_cdc_file` string, `_cdc_pos` bigint"

STUDENT_COLUMNS: list[dict[str, str]] = [
    {"name": "id", "type": "int"},
    {"name": "full_name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
]
ARROW_TYPES: dict[str, pa.DataType] = {
    "int": pa.int32(),
    "bigint": pa.int64(),
    "string": pa.string(),
    "double": pa.float64(),
}

MakeCfg = Callable[..., TableConfig]


# ---------------------------------------------------------------------------- helpers
def lsn_cfg(make_cfg: MakeCfg) -> TableConfig:
    """The student table ordered by (ts_ms, lsn)."""
    return make_cfg(columns=[*STUDENT_COLUMNS, {"name": "lsn", "type": "bigint"}], order_by=["ts_ms", "lsn"])


def composite_cfg(make_cfg: MakeCfg) -> TableConfig:
    """The conformance suite's composite-key table: key (tenant, order_no)."""
    return make_cfg(
        columns=[
            {"name": "tenant", "type": "string"},
            {"name": "order_no", "type": "bigint"},
            {"name": "amount", "type": "double"},
            {"name": "status", "type": "string"},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "bigint"},
        ],
        primary_key=["tenant", "order_no"],
    )


def ev(
    cfg: TableConfig, *, inc: str = INC0, file: str = F0, pos: int = 0, at: datetime = T0, **values: Any
) -> tuple[Any, ...]:
    """One event as a tuple: registry columns (missing ones NULL), then the four _cdc_ columns."""
    unknown = set(values) - set(cfg.column_names)
    assert not unknown, f"not columns of the table: {unknown}"
    return (*(values.get(c) for c in cfg.column_names), inc, file, pos, at)


def raw_ev(cfg: TableConfig, *, inc: str = INC0, file: str = F0, pos: int = 0, **values: Any) -> tuple[Any, ...]:
    """An event as ``with_provenance`` yields it (no ``_cdc_ingested_at`` yet)."""
    return ev(cfg, inc=inc, file=file, pos=pos, **values)[:-1]


def events_df(spark: Any, cfg: TableConfig, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(rows, schema=f"{spark_schema_ddl(cfg)}, {job.META_DDL}")


def raw_df(spark: Any, cfg: TableConfig, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(rows, schema=f"{spark_schema_ddl(cfg)}, {PROVENANCE_DDL}")


def compact_events(
    spark: Any, cfg: TableConfig, rows: list[tuple[Any, ...]], cutoff: datetime | None = None
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """ranked + new_base over ``rows``: key tuple -> the surviving row as a dict."""
    rule = rule_sql(cfg)
    result = job.new_base(job.ranked(events_df(spark, cfg, rows), rule.rank), rule.is_delete, cutoff)
    assert result.columns == [*cfg.column_names, *job.META_COLUMNS]
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in result.collect():
        d = r.asDict()
        key = tuple(d[c] for c in cfg.primary_key)
        assert key not in out, f"key {key} survives twice"
        out[key] = d
    return out


def names_by_key(survivors: dict[tuple[Any, ...], dict[str, Any]], column: str = "full_name") -> dict[Any, Any]:
    return {k[0] if len(k) == 1 else k: v[column] for k, v in survivors.items()}


def write_parquet(
    root: Path,
    cfg: TableConfig,
    increment: str,
    name: str,
    rows: list[dict[str, Any]],
    row_group_size: int | None = None,
) -> dict[str, Any]:
    """Land one change file like Debezium's sink would; return its plan entry."""
    schema = pa.schema([(c.name, ARROW_TYPES[c.type]) for c in cfg.columns])
    path = root / increment / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=row_group_size)
    return {"increment": increment, "name": name, "path": str(path), "size": path.stat().st_size}


def make_plan(
    cfg: TableConfig,
    plan_id: str,
    *,
    base: Path,
    files: list[dict[str, Any]],
    out: Path,
    quarantine: Path,
    ingested_at: datetime,
    retention: timedelta = timedelta(days=7),
) -> dict[str, Any]:
    """A plan in the format pipeline.plan.plan() writes (the keys the job reads)."""
    return {
        "plan_id": plan_id,
        "run_id": "tests",
        "owner": "tests",
        "table": cfg.qualified_name,
        "seq": 1,
        "parent_seq": 0,
        "parent_version": "v00000000-empty",
        "version": f"v00000001-{plan_id}",
        "increments": sorted({f["increment"] for f in files}),
        "column_names": cfg.column_names,
        "primary_key": cfg.primary_key,
        "schema_ddl": spark_schema_ddl(cfg),
        "rule": rule_sql(cfg).to_dict(),
        # A version the job wrote (layout 2) keeps its tombstones apart; a bare directory is read as layout 1.
        **(
            {
                "base_layout": 2,
                "base_location": str(base / "data"),
                "base_tombstones_location": str(base / "tombstones"),
            }
            if (base / "data").is_dir()
            else {"base_location": str(base)}
        ),
        "files": files,
        "output_location": str(out),
        "quarantine_location": str(quarantine),
        "ingested_at": ingested_at.isoformat(),
        "tombstone_cutoff": (ingested_at - retention).isoformat(),
    }


def data_files_on_disk(directory: Path) -> list[dict[str, Any]]:
    """Every file under a version's data/ and tombstones/, named relative to the version directory."""
    return sorted(
        (
            {"name": str(p.relative_to(directory)), "size": p.stat().st_size}
            for sub in ("data", "tombstones")
            for p in (directory / sub).rglob("*")
            if p.is_file()
        ),
        key=lambda f: f["name"],
    )


def read_rows(directory: Path, sort_by: str = "id") -> list[dict[str, Any]]:
    """The Parquet rows Spark left in ``directory`` (pyarrow skips _ and . files)."""
    rows = pq.read_table(str(directory)).to_pylist()
    return sorted(rows, key=lambda r: (r[sort_by] is None, r[sort_by]))


def assert_reconciles(stats: dict[str, Any]) -> None:
    expected = (
        stats["base_rows"]
        + stats["increment_rows"]
        - stats["rejected_rows"]
        - stats["superseded_rows"]
        - stats["expired_tombstones"]
    )
    assert expected == stats["output_rows"], stats
    assert stats["output_visible_rows"] == stats["output_rows"] - stats["output_tombstones"]
    assert stats["duplicate_keys"] == 0


@pytest.fixture
def local_tz() -> Iterator[Callable[[str], None]]:
    """Switch this Python process's local time zone (the JVM keeps its own); restored afterwards."""
    old = os.environ.get("TZ")

    def _set(tz: str) -> None:
        os.environ["TZ"] = tz
        time.tzset()

    try:
        yield _set
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


# ------------------------------------------------------------------------- ranking
def test_greater_order_by_value_wins_regardless_of_provenance(spark: Any, make_cfg: MakeCfg) -> None:
    cfg = make_cfg()
    rule = rule_sql(cfg)
    rows = [
        # key 1: the greater ts_ms wins although the other event is later in every provenance field
        ev(cfg, id=1, full_name="ts200", op="u", ts_ms=200, inc=INC0, file=F0, pos=0),
        ev(cfg, id=1, full_name="ts100", op="u", ts_ms=100, inc=INC1, file=F9, pos=9),
        # key 2: numeric, not lexical, comparison of the ordering column
        ev(cfg, id=2, full_name="ts10", op="c", ts_ms=10, pos=1),
        ev(cfg, id=2, full_name="ts9", op="u", ts_ms=9, pos=2),
        # key 3: three events, ranked newest first
        ev(cfg, id=3, full_name="ts1", op="c", ts_ms=1, pos=3),
        ev(cfg, id=3, full_name="ts3", op="u", ts_ms=3, pos=4),
        ev(cfg, id=3, full_name="ts2", op="u", ts_ms=2, pos=5),
    ]
    ranks = {
        (r["id"], r["full_name"]): r["_cdc_rank"]
        for r in job.ranked(events_df(spark, cfg, rows), rule.rank).select("id", "full_name", "_cdc_rank").collect()
    }
    assert ranks == {
        (1, "ts200"): 1,
        (1, "ts100"): 2,
        (2, "ts10"): 1,
        (2, "ts9"): 2,
        (3, "ts3"): 1,
        (3, "ts2"): 2,
        (3, "ts1"): 3,
    }
    assert names_by_key(compact_events(spark, cfg, rows)) == {1: "ts200", 2: "ts10", 3: "ts3"}


def test_second_order_by_column_breaks_a_tie_of_the_first(spark: Any, make_cfg: MakeCfg) -> None:
    cfg = lsn_cfg(make_cfg)
    rows = [
        # key 1: equal ts_ms, greater lsn wins over a later increment/file/row
        ev(cfg, id=1, full_name="lsn7", op="u", ts_ms=5, lsn=7, inc=INC0, file=F0, pos=0),
        ev(cfg, id=1, full_name="lsn5", op="u", ts_ms=5, lsn=5, inc=INC1, file=F9, pos=9),
        # key 2: the first ordering column dominates the second
        ev(cfg, id=2, full_name="ts6-lsn1", op="u", ts_ms=6, lsn=1),
        ev(cfg, id=2, full_name="ts5-lsn99", op="u", ts_ms=5, lsn=99, inc=INC1),
    ]
    survivors = compact_events(spark, cfg, rows)
    assert names_by_key(survivors) == {1: "lsn7", 2: "ts6-lsn1"}
    assert survivors[(1,)]["lsn"] == 7


@pytest.mark.parametrize(
    ("winner", "loser"),
    [
        pytest.param((INC1, F0, 0), (INC0, F9, 9), id="later-increment-wins"),
        pytest.param((INC0, F1, 0), (INC0, F0, 5), id="later-file-wins"),
        pytest.param((INC0, F0, 10), (INC0, F0, 9), id="later-row-wins-numerically"),
    ],
)
def test_full_tie_is_broken_by_provenance(
    spark: Any, make_cfg: MakeCfg, winner: tuple[str, str, int], loser: tuple[str, str, int]
) -> None:
    cfg = make_cfg()
    rows = [
        # key 1: winner listed first; key 2: loser listed first (input order must not matter)
        ev(cfg, id=1, full_name="winner", op="u", ts_ms=100, inc=winner[0], file=winner[1], pos=winner[2]),
        ev(cfg, id=1, full_name="loser", op="u", ts_ms=100, inc=loser[0], file=loser[1], pos=loser[2]),
        ev(cfg, id=2, full_name="loser", op="c", ts_ms=100, inc=loser[0], file=loser[1], pos=loser[2]),
        ev(cfg, id=2, full_name="winner", op="c", ts_ms=100, inc=winner[0], file=winner[1], pos=winner[2]),
    ]
    survivors = compact_events(spark, cfg, rows)
    assert names_by_key(survivors) == {1: "winner", 2: "winner"}
    assert (survivors[(1,)]["_cdc_increment"], survivors[(1,)]["_cdc_file"], survivors[(1,)]["_cdc_pos"]) == winner


def test_delete_winner_stays_as_a_tombstone(spark: Any, make_cfg: MakeCfg) -> None:
    cfg = make_cfg()
    rows = [
        ev(cfg, id=1, full_name="Ann", op="c", ts_ms=1, pos=0),
        ev(cfg, id=1, full_name="Ann B", op="u", ts_ms=2, pos=1),
        ev(cfg, id=1, full_name=None, op="d", ts_ms=3, pos=2),
        # key 2: deleted, then created again: the re-insert wins
        ev(cfg, id=2, full_name=None, op="d", ts_ms=1, pos=3),
        ev(cfg, id=2, full_name="Bob again", op="c", ts_ms=2, pos=4),
        ev(cfg, id=3, full_name="Cy", op="r", ts_ms=1, pos=5),
    ]
    survivors = compact_events(spark, cfg, rows, cutoff=T0 - timedelta(days=7))
    assert {k[0]: (v["op"], v["ts_ms"], v["full_name"]) for k, v in survivors.items()} == {
        1: ("d", 3, None),
        2: ("c", 2, "Bob again"),
        3: ("r", 1, "Cy"),
    }


def test_older_event_does_not_resurrect_a_tombstone(spark: Any, make_cfg: MakeCfg) -> None:
    cfg = make_cfg()
    late = T0 + timedelta(hours=3)
    rows = [
        # the base holds a tombstone from an earlier compaction
        ev(cfg, id=1, full_name=None, op="d", ts_ms=300, inc=INC0, at=T0),
        # late deliveries in newer increments, but older in ts_ms
        ev(cfg, id=1, full_name="late update", op="u", ts_ms=200, inc=INC2, file=F9, pos=7, at=late),
        ev(cfg, id=1, full_name="late create", op="c", ts_ms=100, inc=INC2, file=F9, pos=8, at=late),
        ev(cfg, id=2, full_name="other key", op="c", ts_ms=1, inc=INC2, at=late),
    ]
    survivors = compact_events(spark, cfg, rows, cutoff=late - timedelta(days=7))
    assert {k[0]: (v["op"], v["ts_ms"], v["_cdc_increment"]) for k, v in survivors.items()} == {
        1: ("d", 300, INC0),
        2: ("c", 1, INC2),
    }


def test_expired_tombstones_are_dropped_and_fresh_ones_kept(spark: Any, make_cfg: MakeCfg) -> None:
    cfg = make_cfg()
    old, fresh = datetime(2026, 11, 1), datetime(2026, 11, 21)
    cutoff = datetime(2026, 11, 15)
    rows = [
        ev(cfg, id=1, op="d", ts_ms=5, at=old),  # expired tombstone
        ev(cfg, id=2, op="d", ts_ms=5, at=fresh),  # tombstone within retention
        ev(cfg, id=3, full_name="old upsert", op="u", ts_ms=5, at=old),  # upserts never expire
        # key 4: the expired tombstone goes, and its loser must not come back in its place
        ev(cfg, id=4, full_name="deleted long ago", op="c", ts_ms=1, at=old),
        ev(cfg, id=4, op="d", ts_ms=2, at=old),
    ]
    expiring = compact_events(spark, cfg, rows, cutoff=cutoff)
    assert {k[0]: v["op"] for k, v in expiring.items()} == {2: "d", 3: "u"}
    assert expiring[(3,)]["full_name"] == "old upsert"

    keep_all = compact_events(spark, cfg, rows, cutoff=None)
    assert {k[0]: v["op"] for k, v in keep_all.items()} == {1: "d", 2: "d", 3: "u", 4: "d"}


def test_composite_primary_key_partitions_by_all_key_columns(spark: Any, make_cfg: MakeCfg) -> None:
    cfg = composite_cfg(make_cfg)
    rows = [
        ev(cfg, tenant="a", order_no=1, amount=1.5, status="new", op="c", ts_ms=1, pos=0),
        ev(cfg, tenant="b", order_no=1, amount=2.5, status="new", op="c", ts_ms=1, pos=1),
        ev(cfg, tenant="a", order_no=1, amount=1.5, status="paid", op="u", ts_ms=2, pos=2),
        ev(cfg, tenant="a", order_no=2, amount=9.0, status="new", op="c", ts_ms=1, pos=3),
        ev(cfg, tenant="b", order_no=2, amount=4.0, status="new", op="c", ts_ms=3, pos=4),
        ev(cfg, tenant="b", order_no=2, op="d", ts_ms=4, pos=5),
    ]
    survivors = compact_events(spark, cfg, rows)
    assert {k: (v["status"], v["op"], v["ts_ms"]) for k, v in survivors.items()} == {
        ("a", 1): ("paid", "u", 2),
        ("b", 1): ("new", "c", 1),
        ("a", 2): ("new", "c", 1),
        ("b", 2): (None, "d", 4),
    }


# ------------------------------------------------------------------------ classify
def test_classify_gives_the_reason_of_each_refused_row(spark: Any, make_cfg: MakeCfg) -> None:
    cfg = make_cfg()
    rows = [
        raw_ev(cfg, id=1, full_name="ok-c", op="c", ts_ms=1),
        raw_ev(cfg, id=2, full_name="ok-r", op="r", ts_ms=1),
        raw_ev(cfg, id=3, full_name="ok-u", op="u", ts_ms=1),
        raw_ev(cfg, id=4, full_name="ok-d", op="d", ts_ms=1),
        raw_ev(cfg, id=None, full_name="no-key", op="c", ts_ms=1),
        raw_ev(cfg, id=5, full_name="no-ts", op="u", ts_ms=None),
        raw_ev(cfg, id=6, full_name="bad-op", op="x", ts_ms=1),
        raw_ev(cfg, id=7, full_name="no-op", op=None, ts_ms=1),
        raw_ev(cfg, id=8, full_name="upper-D", op="D", ts_ms=1),
        raw_ev(cfg, id=9, full_name="empty-op", op="", ts_ms=1),
        raw_ev(cfg, id=None, full_name="nothing", op=None, ts_ms=None),  # the key check comes first
    ]
    classified = job.classify(raw_df(spark, cfg, rows), rule_sql(cfg).reject_reason)
    assert classified.columns == [*cfg.column_names, "_cdc_increment", "_cdc_file", "_cdc_pos", "_cdc_reject_reason"]
    reasons = {r["full_name"]: r["_cdc_reject_reason"] for r in classified.collect()}
    assert reasons == {
        "ok-c": None,
        "ok-r": None,
        "ok-u": None,
        "ok-d": None,
        "no-key": "null_key:id",
        "no-ts": "null_order_by:ts_ms",
        "bad-op": "unknown_op",
        "no-op": "null_op",
        "upper-D": "unknown_op",
        "empty-op": "unknown_op",
        "nothing": "null_key:id",
    }


def test_classify_names_the_offending_column(spark: Any, make_cfg: MakeCfg) -> None:
    lsn = lsn_cfg(make_cfg)
    lsn_rows = [
        raw_ev(lsn, id=1, full_name="no-lsn", op="u", ts_ms=1, lsn=None),
        raw_ev(lsn, id=2, full_name="no-ts", op="u", ts_ms=None, lsn=None),
        raw_ev(lsn, id=3, full_name="ok", op="u", ts_ms=1, lsn=1),
    ]
    got = job.classify(raw_df(spark, lsn, lsn_rows), rule_sql(lsn).reject_reason).collect()
    assert {r["full_name"]: r["_cdc_reject_reason"] for r in got} == {
        "no-lsn": "null_order_by:lsn",
        "no-ts": "null_order_by:ts_ms",
        "ok": None,
    }

    comp = composite_cfg(make_cfg)
    comp_rows = [
        raw_ev(comp, tenant="a", order_no=None, status="no-order-no", op="c", ts_ms=1),
        raw_ev(comp, tenant=None, order_no=1, status="no-tenant", op="c", ts_ms=1),
        raw_ev(comp, tenant="a", order_no=1, status="ok", op="c", ts_ms=1),
    ]
    got = job.classify(raw_df(spark, comp, comp_rows), rule_sql(comp).reject_reason).collect()
    assert {r["status"]: r["_cdc_reject_reason"] for r in got} == {
        "no-order-no": "null_key:order_no",
        "no-tenant": "null_key:tenant",
        "ok": None,
    }


def test_accepted_and_rejected_split_classified_events(spark: Any, make_cfg: MakeCfg) -> None:
    cfg = make_cfg()
    rows = [
        raw_ev(cfg, id=1, full_name="good", op="c", ts_ms=1, inc=INC0, file=F0, pos=0),
        raw_ev(cfg, id=None, full_name="keyless", op="c", ts_ms=1, inc=INC0, file=F0, pos=1),
        raw_ev(cfg, id=2, full_name="gone", op="d", ts_ms=2, inc=INC1, file=F1, pos=0),
        raw_ev(cfg, id=3, full_name="weird", op="x", ts_ms=2, inc=INC1, file=F1, pos=1),
    ]
    classified = job.classify(raw_df(spark, cfg, rows), rule_sql(cfg).reject_reason)
    ingested_at = datetime(2026, 11, 22, 13, 45, 10)

    good = job.accepted(classified, ingested_at)
    assert good.columns == [*cfg.column_names, *job.META_COLUMNS]
    assert sorted(tuple(r) for r in good.collect()) == [
        (1, "good", "c", 1, INC0, F0, 0, ingested_at),
        (2, "gone", "d", 2, INC1, F1, 0, ingested_at),
    ]

    bad = job.rejected(classified, "plan-abc")
    assert bad.columns == [
        *cfg.column_names,
        "_cdc_increment",
        "_cdc_file",
        "_cdc_pos",
        "_cdc_reject_reason",
        "_cdc_plan_id",
    ]
    assert sorted(
        (r["full_name"], r["_cdc_reject_reason"], r["_cdc_plan_id"], r["_cdc_pos"]) for r in bad.collect()
    ) == [
        ("keyless", "null_key:id", "plan-abc", 1),
        ("weird", "unknown_op", "plan-abc", 1),
    ]


# ------------------------------------------------------------------ with_provenance
def test_with_provenance_reads_increment_file_and_row_position(spark: Any, make_cfg: MakeCfg, tmp_path: Path) -> None:
    cfg = make_cfg()
    landing = tmp_path / "landing"
    a = write_parquet(
        landing,
        cfg,
        INC0,
        F0,
        [{"id": i, "full_name": f"a{i}", "op": "c", "ts_ms": i} for i in range(5)],
        row_group_size=2,  # the position is within the file, not within a row group
    )
    b = write_parquet(
        landing, cfg, INC1, F1, [{"id": 10 + i, "full_name": f"b{i}", "op": "u", "ts_ms": i} for i in range(3)]
    )
    empty = write_parquet(landing, cfg, INC1, F9, [])

    raw = spark.read.schema(spark_schema_ddl(cfg)).parquet(a["path"], b["path"], empty["path"])
    events = job.with_provenance(raw, cfg.column_names)

    assert events.columns == [*cfg.column_names, "_cdc_increment", "_cdc_file", "_cdc_pos"]
    got = sorted((r["full_name"], r["_cdc_increment"], r["_cdc_file"], r["_cdc_pos"]) for r in events.collect())
    assert got == [
        ("a0", INC0, F0, 0),
        ("a1", INC0, F0, 1),
        ("a2", INC0, F0, 2),
        ("a3", INC0, F0, 3),
        ("a4", INC0, F0, 4),
        ("b0", INC1, F1, 0),
        ("b1", INC1, F1, 1),
        ("b2", INC1, F1, 2),
    ]


# ------------------------------------------------------------------------------ run
def test_run_end_to_end_then_on_top_of_its_own_output(spark: Any, make_cfg: MakeCfg, tmp_path: Path) -> None:
    cfg = make_cfg()
    landing, versions, quarantine = tmp_path / "incremental", tmp_path / "base", tmp_path / "quarantine"
    empty_base = versions / "v00000000"
    empty_base.mkdir(parents=True)

    # ---- first run: empty base + two increments, three refused rows
    files = [
        write_parquet(
            landing,
            cfg,
            INC0,
            F0,
            [
                {"id": 1, "full_name": "Ann", "op": "c", "ts_ms": 1},
                {"id": 2, "full_name": "Bob", "op": "c", "ts_ms": 1},
                {"id": 1, "full_name": "Ann B", "op": "u", "ts_ms": 2},
                {"id": None, "full_name": "keyless", "op": "c", "ts_ms": 1},
                {"id": 3, "full_name": "odd op", "op": "x", "ts_ms": 1},
            ],
        ),
        write_parquet(
            landing,
            cfg,
            INC1,
            F0,
            [
                {"id": 3, "full_name": "Cy", "op": "c", "ts_ms": 5},
                {"id": 2, "full_name": "Bob 2", "op": "u", "ts_ms": 3},
                {"id": 4, "full_name": "no time", "op": "c", "ts_ms": None},
            ],
        ),
    ]
    at1 = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
    out1 = versions / "v00000001"
    plan1 = make_plan(
        cfg, "plan-1", base=empty_base, files=files, out=out1, quarantine=quarantine / "v1", ingested_at=at1
    )

    stats1 = job.run(spark, plan1)

    assert {k: stats1[k] for k in stats1 if k not in ("output_files", "finished_at", "attempt")} == {
        "plan_id": "plan-1",
        "table": cfg.qualified_name,
        "base_rows": 0,
        "increment_rows": 8,
        "rejected_rows": 3,
        "rejected_by_reason": {"null_key:id": 1, "unknown_op": 1, "null_order_by:ts_ms": 1},
        "rejected_by_file": {f"{INC0}/{F0}": 2, f"{INC1}/{F0}": 1},
        "superseded_rows": 2,
        "expired_tombstones": 0,
        "output_rows": 3,
        "output_tombstones": 0,
        "output_visible_rows": 3,
        "misplaced_rows": 0,
        "duplicate_keys": 0,
        "layout": 2,
        # No key's winner tied with its runner-up on ts_ms; no base row to be late for.
        "tied_winners": 0,
        "late_events": 0,
        # Few events (the plan gives no base_rows): ranked alone, the base streamed past their winners.
        "merge_path": "broadcast",
    }
    assert_reconciles(stats1)

    rows1 = read_rows(out1)
    assert [(r["id"], r["full_name"], r["op"], r["ts_ms"]) for r in rows1] == [
        (1, "Ann B", "u", 2),
        (2, "Bob 2", "u", 3),
        (3, "Cy", "c", 5),
    ]
    assert list(rows1[0]) == [*cfg.column_names, *job.META_COLUMNS]
    assert [(r["_cdc_increment"], r["_cdc_file"], r["_cdc_pos"]) for r in rows1] == [
        (INC0, F0, 2),
        (INC1, F0, 1),
        (INC1, F0, 0),
    ]
    assert {r["_cdc_ingested_at"] for r in rows1} == {datetime(2026, 11, 22, 2, 0, tzinfo=UTC)}

    refused = read_rows(quarantine / "v1")
    assert [(r["full_name"], r["_cdc_reject_reason"], r["_cdc_plan_id"]) for r in refused] == [
        ("odd op", "unknown_op", "plan-1"),
        ("no time", "null_order_by:ts_ms", "plan-1"),
        ("keyless", "null_key:id", "plan-1"),
    ]
    assert [(r["_cdc_increment"], r["_cdc_pos"]) for r in refused] == [(INC0, 4), (INC1, 2), (INC0, 3)]

    stats_file = out1 / job.STATS_FILE
    assert json.loads(stats_file.read_text(encoding="utf-8")) == stats1
    assert stats1["output_files"] == data_files_on_disk(out1)
    assert stats1["output_files"], "no data file written"

    # ---- second run: the first output is the base; an update, a delete, a stale late event
    files2 = [
        write_parquet(
            landing,
            cfg,
            INC2,
            F0,
            [
                {"id": 1, "full_name": "Ann C", "op": "u", "ts_ms": 10},
                {"id": 2, "full_name": None, "op": "d", "ts_ms": 10},
                {"id": 3, "full_name": "stale Cy", "op": "u", "ts_ms": 4},
            ],
        )
    ]
    at2 = at1 + timedelta(hours=1)
    out2 = versions / "v00000002"
    plan2 = make_plan(cfg, "plan-2", base=out1, files=files2, out=out2, quarantine=quarantine / "v2", ingested_at=at2)

    stats2 = job.run(spark, plan2)

    assert (
        stats2["base_rows"],
        stats2["increment_rows"],
        stats2["rejected_rows"],
        stats2["rejected_by_reason"],
        stats2["rejected_by_file"],
        stats2["superseded_rows"],
        stats2["expired_tombstones"],
    ) == (3, 3, 0, {}, {}, 3, 0)
    assert (stats2["output_rows"], stats2["output_tombstones"], stats2["output_visible_rows"]) == (3, 1, 2)
    assert_reconciles(stats2)
    assert not (quarantine / "v2").exists()  # nothing refused, nothing quarantined

    rows2 = read_rows(out2)
    assert [(r["id"], r["full_name"], r["op"], r["ts_ms"], r["_cdc_increment"]) for r in rows2] == [
        (1, "Ann C", "u", 10, INC2),
        (2, None, "d", 10, INC2),
        (3, "Cy", "c", 5, INC1),
    ]
    # The data directory holds the visible rows only, as Parquet data files and nothing else; the
    # tombstone lives beside it.
    assert [(r["id"], r["op"]) for r in read_rows(out2 / "data")] == [(1, "u"), (3, "c")]
    assert [(r["id"], r["op"]) for r in read_rows(out2 / "tombstones")] == [(2, "d")]
    for sub in ("data", "tombstones"):
        names = [p.name for p in (out2 / sub).iterdir()]
        assert names and all(n.endswith(".parquet") and not n.startswith(("_", ".")) for n in names), names
    # a carried-over base row keeps the time it was first compacted
    assert {r["id"]: r["_cdc_ingested_at"] for r in rows2} == {
        1: datetime(2026, 11, 22, 3, 0, tzinfo=UTC),
        2: datetime(2026, 11, 22, 3, 0, tzinfo=UTC),
        3: datetime(2026, 11, 22, 2, 0, tzinfo=UTC),
    }
    assert stats2["output_files"] == data_files_on_disk(out2)
    assert json.loads((out2 / job.STATS_FILE).read_text(encoding="utf-8")) == stats2


def test_a_mode_without_a_module_is_refused_by_name_and_nothing_is_written(
    spark: Any, make_cfg: MakeCfg, tmp_path: Path
) -> None:
    """The entry point imports ``job/modes/<mode>.py`` by the plan's mode, checked against the modules there."""
    cfg = make_cfg(columns=STUDENT_COLUMNS)
    files = [write_parquet(tmp_path / "in", cfg, INC0, F0, [{"id": 1, "full_name": "a", "op": "c", "ts_ms": 1}])]
    (tmp_path / "v0").mkdir()
    plan = make_plan(
        cfg, "p1", base=tmp_path / "v0", files=files, out=tmp_path / "v1", quarantine=tmp_path / "q", ingested_at=T0
    )
    for mode in ("nosuch", "common", "__init__"):
        with pytest.raises(job.PermanentJobError, match=rf"table mode '{mode}'.*no module job/modes/{mode}.py") as err:
            job.run(spark, {**plan, "mode": mode})
        assert cfg.qualified_name in str(err.value) and "cdc, keyless, snapshot" in str(err.value)
    assert not (tmp_path / "v1").exists()


def test_run_drops_a_tombstone_once_its_retention_has_passed(spark: Any, make_cfg: MakeCfg, tmp_path: Path) -> None:
    cfg = make_cfg()
    landing, versions = tmp_path / "incremental", tmp_path / "base"
    empty_base = versions / "v0"
    empty_base.mkdir(parents=True)
    at1 = datetime(2026, 11, 1, 0, 0, tzinfo=UTC)
    first = [
        write_parquet(
            landing,
            cfg,
            INC0,
            F0,
            [
                {"id": 1, "full_name": "Ann", "op": "c", "ts_ms": 1},
                {"id": 1, "full_name": None, "op": "d", "ts_ms": 2},
                {"id": 2, "full_name": "Bob", "op": "c", "ts_ms": 1},
            ],
        )
    ]
    out1 = versions / "v1"
    stats1 = job.run(
        spark,
        make_plan(cfg, "p1", base=empty_base, files=first, out=out1, quarantine=tmp_path / "q1", ingested_at=at1),
    )
    assert (stats1["output_rows"], stats1["output_tombstones"], stats1["expired_tombstones"]) == (2, 1, 0)

    # three weeks later (retention 7 days) the tombstone of key 1 expires; a late stale create stays dead
    second = [write_parquet(landing, cfg, INC1, F0, [{"id": 3, "full_name": "Cy", "op": "c", "ts_ms": 1}])]
    out2 = versions / "v2"
    stats2 = job.run(
        spark,
        make_plan(
            cfg,
            "p2",
            base=out1,
            files=second,
            out=out2,
            quarantine=tmp_path / "q2",
            ingested_at=at1 + timedelta(days=21),
        ),
    )
    assert (stats2["base_rows"], stats2["increment_rows"], stats2["expired_tombstones"]) == (2, 1, 1)
    assert (stats2["output_rows"], stats2["output_tombstones"], stats2["output_visible_rows"]) == (2, 0, 2)
    assert_reconciles(stats2)
    assert [(r["id"], r["op"]) for r in read_rows(out2)] == [(2, "c"), (3, "c")]


def test_run_stamps_ingested_at_in_utc_whatever_the_driver_time_zone(
    spark: Any, make_cfg: MakeCfg, tmp_path: Path, local_tz: Callable[[str], None]
) -> None:
    cfg = make_cfg()
    empty_base = tmp_path / "base" / "v0"
    empty_base.mkdir(parents=True)
    files = [
        write_parquet(tmp_path / "incremental", cfg, INC0, F0, [{"id": 1, "full_name": "A", "op": "c", "ts_ms": 1}])
    ]
    out = tmp_path / "base" / "v1"
    plan = make_plan(
        cfg,
        "p-tz",
        base=empty_base,
        files=files,
        out=out,
        quarantine=tmp_path / "q",
        ingested_at=datetime(2026, 11, 22, 12, 0, tzinfo=UTC),
    )

    local_tz("Asia/Kolkata")  # UTC+05:30, no DST
    job.run(spark, plan)

    assert [r["_cdc_ingested_at"] for r in read_rows(out)] == [datetime(2026, 11, 22, 12, 0, tzinfo=UTC)]


# ------------------------------------------------------------------ partitioned tables
REGION_COLUMNS: list[dict[str, str]] = [
    {"name": "id", "type": "int"},
    {"name": "region", "type": "string"},
    {"name": "full_name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
]
REGION_SCHEMA = pa.schema([(c["name"], ARROW_TYPES[c["type"]]) for c in REGION_COLUMNS])
PC = "_cdc_partition"


def region_cfg(make_cfg: MakeCfg) -> TableConfig:
    """A student table partitioned by its region, as it is."""
    return make_cfg(columns=REGION_COLUMNS, partition_by={"column": "region"})


def with_partition(spark: Any, cfg: TableConfig, rows: list[tuple[Any, ...]], parts: list[str | None]) -> Any:
    """Events (``ev`` tuples) plus ``_cdc_partition``: a base row's partition, NULL for an increment event."""
    schema = f"{spark_schema_ddl(cfg)}, {job.META_DDL}, {job.PARTITION_DDL}"
    return spark.createDataFrame([(*r, p) for r, p in zip(rows, parts, strict=True)], schema=schema)


def test_partition_value_sql_names_the_partition_of_each_row(spark: Any, make_cfg: MakeCfg) -> None:
    from cdc_compaction.core.sql import partition_sql

    cfg = make_cfg(
        columns=[*REGION_COLUMNS, {"name": "at", "type": "timestamp"}, {"name": "day", "type": "date"}],
        partition_by={"column": "at", "transform": "day"},
    )
    df = spark.createDataFrame(
        [("EU", datetime(2026, 11, 22, 23, 59, tzinfo=UTC), datetime(2026, 1, 2).date()), ("", None, None)],
        "region string, at timestamp, day date",
    )
    got = {}
    for column, transform in [
        ("at", "day"),
        ("at", "month"),
        ("at", "year"),
        ("region", "identity"),
        ("day", "identity"),
    ]:
        c = cfg.model_copy(
            update={"partition_by": cfg.partition_by.model_copy(update={"column": column, "transform": transform})}
        )
        got[(column, transform)] = [r[0] for r in df.select(expr(partition_sql(c).value)).collect()]
    assert got == {
        ("at", "day"): ["2026-11-22", "__null__"],  # UTC, whatever the driver's zone
        ("at", "month"): ["2026-11", "__null__"],
        ("at", "year"): ["2026", "__null__"],
        ("region", "identity"): ["EU", "__null__"],  # '' would be Hive's default (NULL) partition
        ("day", "identity"): ["2026-01-02", "__null__"],
    }


@pytest.mark.parametrize("broadcast", [False, True], ids=["shuffled", "broadcast"])
def test_touched_partitions_are_where_events_go_and_where_their_keys_are(
    spark: Any, make_cfg: MakeCfg, broadcast: bool
) -> None:
    from cdc_compaction.core.sql import partition_sql

    cfg = region_cfg(make_cfg)
    value = partition_sql(cfg).value
    base_keys = spark.createDataFrame(
        [(1, "EU"), (2, "US"), (3, "APAC"), (4, "__null__")], f"id int, {job.PARTITION_DDL}"
    )
    events = events_df(
        spark,
        cfg,
        [
            ev(cfg, id=1, region=None, op="d", ts_ms=5),  # key-only delete: finds EU through its key
            ev(cfg, id=2, region="LATAM", full_name="moves", op="u", ts_ms=5),  # moves: US and LATAM
            ev(cfg, id=9, region="EU", full_name="new", op="c", ts_ms=5),  # a new key in EU
        ],
    )
    assert sorted(r[PC] for r in job.event_partitions(events, "region", value).collect()) == ["EU", "LATAM"]
    of_keys = job.partitions_of_keys(base_keys, events, ["id"], broadcast)
    assert sorted(r[PC] for r in of_keys.collect()) == ["EU", "US"]
    touched = job.touched_partitions(base_keys, events, ["id"], "region", value, broadcast=broadcast)
    assert sorted(r[PC] for r in touched.collect()) == ["EU", "LATAM", "US"]  # APAC and __null__ untouched

    # A key-only delete of a key the base does not have goes to the NULL sentinel partition.
    unknown = events.unionByName(events_df(spark, cfg, [ev(cfg, id=7, region=None, op="d", ts_ms=5)]))
    touched = job.touched_partitions(base_keys, unknown, ["id"], "region", value, broadcast=broadcast)
    assert sorted(r[PC] for r in touched.collect()) == ["EU", "LATAM", "US", "__null__"]


def _broadcast_inputs(plan: str) -> list[str]:
    """Each ``BroadcastExchange`` of a plan's tree string with what it builds from, down to the
    first join below it (a join's inputs are reduced by the join: only its output is built)."""
    lines = plan.splitlines()
    subtrees = []
    for i, line in enumerate(lines):
        if "BroadcastExchange" not in line:
            continue
        column = line.index("BroadcastExchange")
        below = []
        for child in lines[i + 1 :]:
            name = len(child) - len(child.lstrip(" :+-"))
            if name <= column or not child.strip() or "Join" in child:
                break
            below.append(child)
        subtrees.append("\n".join([line, *below]))
    return subtrees


def test_touched_partitions_never_broadcast_the_index(spark: Any, make_cfg: MakeCfg, tmp_path: Path) -> None:
    """Events without a partition value find their keys' partitions with the index streamed, never built.

    The 20M scattered table of bench/partitioned.py ran out of driver memory when adaptive
    execution broadcast all index keys (small by their compressed shuffle size). Here every join
    may broadcast (threshold 1 GB), so a plan that could build the index would.
    """
    from cdc_compaction.core.sql import partition_sql

    cfg = region_cfg(make_cfg)
    value = partition_sql(cfg).value
    index_dir = str(tmp_path / "index")
    rows = [(i, ["EU", "US", "APAC"][i % 3]) for i in range(300)]
    spark.createDataFrame(rows, f"id int, {job.PARTITION_DDL}").write.parquet(index_dir)
    index = spark.read.parquet(index_dir)
    events = events_df(
        spark,
        cfg,
        [
            ev(cfg, id=1, region=None, op="d", ts_ms=5),  # key-only delete of a known key (US)
            ev(cfg, id=1000, region=None, op="d", ts_ms=5),  # key-only delete of an unknown key
            ev(cfg, id=3, region="LATAM", full_name="moves", op="u", ts_ms=5),  # from EU to LATAM
        ],
    )
    saved = {k: spark.conf.get(k) for k in ("spark.sql.autoBroadcastJoinThreshold", "spark.sql.adaptive.enabled")}
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", str(1 << 30))
    spark.conf.set("spark.sql.adaptive.enabled", "true")
    try:
        touched = job.touched_partitions(index, events, ["id"], "region", value)
        assert sorted(r[PC] for r in touched.collect()) == ["EU", "LATAM", "US", "__null__"]  # not APAC
        jvm = spark.sparkContext._jvm
        plan = jvm.PythonSQLUtils.explainString(touched._jdf.queryExecution(), "simple")
    finally:
        for k, v in saved.items():
            spark.conf.set(k, v)
    # The index is the plan's only Parquet scan (the events are in memory).
    assert "isFinalPlan=true" in plan and "FileScan parquet" in plan, plan
    broadcasts = _broadcast_inputs(plan)
    assert broadcasts, plan  # small sides are broadcast: the check below looks at real broadcasts
    assert not [b for b in broadcasts if "FileScan parquet" in b], plan


def test_assign_partitions_sends_each_winner_to_its_partition(spark: Any, make_cfg: MakeCfg) -> None:
    from cdc_compaction.core.sql import partition_sql

    cfg = region_cfg(make_cfg)
    rule = rule_sql(cfg)
    rows = [
        ev(cfg, id=1, region="EU", full_name="Ann", op="c", ts_ms=1),  # base
        ev(cfg, id=1, region=None, op="d", ts_ms=2, inc=INC1),  # key-only delete: stays in EU
        ev(cfg, id=2, region="US", full_name="Bob", op="c", ts_ms=1),  # base
        ev(cfg, id=2, region="LATAM", full_name="Bob", op="u", ts_ms=2, inc=INC1),  # moves to LATAM
        ev(cfg, id=3, region="APAC", full_name="Cy", op="c", ts_ms=9),  # base, wins over a stale move
        ev(cfg, id=3, region="EU", full_name="stale", op="u", ts_ms=1, inc=INC1),
        ev(cfg, id=4, region=None, full_name="nowhere", op="c", ts_ms=1, inc=INC1),  # new key, no region
    ]
    parts = ["EU", None, "US", None, "APAC", None, None]
    assigned = job.assign_partitions(
        job.ranked(with_partition(spark, cfg, rows, parts), rule.rank), ["id"], "region", partition_sql(cfg).value
    )
    survivors = job.new_base(assigned, rule.is_delete, None)
    assert survivors.columns == [*cfg.column_names, *job.META_COLUMNS, PC]
    got = {r["id"]: (r["op"], r[PC]) for r in survivors.collect()}
    assert got == {1: ("d", "EU"), 2: ("u", "LATAM"), 3: ("c", "APAC"), 4: ("c", "__null__")}


def test_read_partitions_supplies_values_from_any_version_directory(
    spark: Any, make_cfg: MakeCfg, tmp_path: Path
) -> None:
    cfg = region_cfg(make_cfg)
    schema = f"{spark_schema_ddl(cfg)}, {job.META_DDL}"
    odd_values = ["007", "a/b:c=d%e", "EU"]  # leading zeros stay strings; escaped directory names
    for i, value in enumerate(odd_values):
        rows = with_partition(spark, cfg, [ev(cfg, id=i, region=value, op="c", ts_ms=1)], [value])
        # v0's directories as versions are written since issue 37 (cdc_partition=), v1's as before.
        name = "cdc_partition" if i % 2 == 0 else PC
        rows.withColumnRenamed(PC, name).write.partitionBy(name).mode("append").parquet(str(tmp_path / f"v{i % 2}"))
    locations = {}
    for v in ("v0", "v1"):
        for d in (tmp_path / v).iterdir():
            if d.is_dir():
                locations[job.partition_dir_value(d.name)] = str(d)
    assert sorted(locations) == sorted(odd_values)
    # A partition registered by hand at a directory of another name is read on its own.
    by_hand = tmp_path / "elsewhere"
    spark.createDataFrame([ev(cfg, id=9, region="X", op="c", ts_ms=1)], schema).write.parquet(str(by_hand))
    locations["X"] = str(by_hand)
    got = job.read_partitions(spark, schema, locations)
    assert sorted((r["id"], r[PC]) for r in got.collect()) == [(0, "007"), (1, "a/b:c=d%e"), (2, "EU"), (9, "X")]
    assert dict(got.dtypes)[PC] == "string"
    assert job.read_partitions(spark, schema, {}).count() == 0


def land_region(landing: Path, increment: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Land ``rows`` of the region table as one file of ``increment``: the plan's entry for it."""
    path = landing / increment / F0
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=REGION_SCHEMA), path)
    return {"increment": increment, "name": F0, "path": str(path), "size": path.stat().st_size}


def partition_dirs(version: Path) -> dict[str, Path]:
    """The partition directories of a version's visible rows (``<version>/data/cdc_partition=<v>``)."""
    return {job.partition_dir_value(d.name): d for d in (version / "data").iterdir() if d.is_dir()}


def test_run_partitioned_rewrites_only_touched_partitions(spark: Any, make_cfg: MakeCfg, tmp_path: Path) -> None:
    from cdc_compaction.core.sql import partition_sql

    cfg = region_cfg(make_cfg)
    landing, versions = tmp_path / "incremental", tmp_path / "base"
    (versions / "v0").mkdir(parents=True)
    at = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)

    def plan_of(plan_id: str, base: Path, files: list[dict[str, Any]], out: Path, partitions: dict[str, str]) -> Any:
        plan = make_plan(cfg, plan_id, base=base, files=files, out=out, quarantine=tmp_path / plan_id, ingested_at=at)
        plan["partition_by"] = partition_sql(cfg).to_dict()
        plan["base_partitions"] = partitions
        return plan

    def land(increment: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return land_region(landing, increment, rows)

    first = land(
        INC0,
        [
            {"id": 1, "region": "EU", "full_name": "Ann", "op": "c", "ts_ms": 1},
            {"id": 2, "region": "US", "full_name": "Bob", "op": "c", "ts_ms": 1},
            {"id": 3, "region": "APAC", "full_name": "Cy", "op": "c", "ts_ms": 1},
            {"id": 4, "region": "APAC", "full_name": "Di", "op": "c", "ts_ms": 1},
        ],
    )
    stats1 = job.run(spark, plan_of("p1", versions / "v0", [first], versions / "v1", {}))
    assert_reconciles(stats1)
    map1 = {v: str(d) for v, d in partition_dirs(versions / "v1").items()}
    assert stats1["partitions"] == map1 and sorted(map1) == ["APAC", "EU", "US"]
    # Named without a leading _ (issue 37: Hive's reader skips such paths), the key index's too.
    assert sorted(Path(d).name for d in map1.values()) == ["cdc_partition=APAC", "cdc_partition=EU", "cdc_partition=US"]
    assert {v: Path(d).name for v, d in stats1["index"].items()} == {v: f"cdc_partition={v}" for v in map1}
    assert stats1["partition_rows"] == {"APAC": 2, "EU": 1, "US": 1}
    assert (stats1["partitions_rewritten"], stats1["partitions_reused"]) == (3, 0)
    assert stats1["partitions_touched"] == ["APAC", "EU", "US"]
    assert stats1["partition_by"] == {"column": "region", "transform": "identity"}
    assert {"/".join(f["name"].split("/")[:2]) for f in stats1["output_files"] if f["name"].startswith("data/")} == {
        f"data/{d.name}" for d in (versions / "v1" / "data").iterdir() if d.is_dir()
    }

    # A key-only delete (EU, found through its key) and a key that moves from US to LATAM.
    second = land(
        INC1,
        [
            {"id": 1, "region": None, "full_name": None, "op": "d", "ts_ms": 2},
            {"id": 2, "region": "LATAM", "full_name": "Bob", "op": "u", "ts_ms": 2},
        ],
    )
    stats2 = job.run(spark, plan_of("p2", versions / "v1", [second], versions / "v2", map1))
    assert_reconciles(stats2)
    assert stats2["partitions_touched"] == ["EU", "LATAM", "US"]
    # APAC is neither read nor written; EU and US lost their only rows, so they are not written at all.
    assert stats2["base_rows"] == 2
    assert sorted(partition_dirs(versions / "v2")) == ["LATAM"]
    assert (stats2["partitions_rewritten"], stats2["partitions_reused"]) == (1, 1)
    assert stats2["partition_rows"] == {"LATAM": 1}
    # The tombstone is among the tombstones, with the partition its key was in.
    rows = read_rows(versions / "v2" / "tombstones")
    assert [(r["id"], r["op"], r[PC]) for r in rows] == [(1, "d", "EU")]

    # A key both in a reused partition and in a rewritten one (a base broken by hand) is a duplicate key.
    broken = tmp_path / "broken"
    key3_in_eu = [ev(cfg, id=3, region="EU", full_name="Cy", op="c", ts_ms=1)]
    with_partition(spark, cfg, key3_in_eu, ["EU"]).write.partitionBy(PC).parquet(str(broken))
    third = land(INC2, [{"id": 5, "region": "EU", "full_name": "Eve", "op": "c", "ts_ms": 5}])
    base3 = {"APAC": map1["APAC"], "EU": str(broken / f"{PC}=EU")}
    stats3 = job.run(spark, plan_of("p3", versions / "v2", [third], versions / "v3", base3))
    assert stats3["partitions_touched"] == ["EU"] and stats3["partitions_reused"] == 1
    assert stats3["duplicate_keys"] == 1


def test_key_lookup_and_full_ranking_write_the_same_version(spark: Any, make_cfg: MakeCfg, tmp_path: Path) -> None:
    """Few events rank only the keys they touch (the base is copied, not shuffled); many rank every row.

    ``key_lookup_max_events: 0`` forces the full ranking: both must write the same rows and stats.
    """
    cfg = lsn_cfg(make_cfg)
    landing, versions = tmp_path / "incremental", tmp_path / "base"
    (versions / "v0").mkdir(parents=True)
    initial = [{"id": i, "full_name": f"n{i}", "op": "r", "ts_ms": 10, "lsn": i} for i in range(1, 7)]
    initial.append({"id": 6, "full_name": None, "op": "d", "ts_ms": 20, "lsn": 0})
    files1 = [write_parquet(landing, cfg, INC0, F0, initial)]
    at1 = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
    kw = {"quarantine": tmp_path / "q", "ingested_at": at1}
    job.run(spark, make_plan(cfg, "p1", base=versions / "v0", files=files1, out=versions / "v1", **kw))
    files2 = [
        write_parquet(
            landing,
            cfg,
            INC1,
            F0,
            [
                {"id": 1, "full_name": "newer", "op": "u", "ts_ms": 30, "lsn": 0},
                {"id": 2, "full_name": "late", "op": "u", "ts_ms": 5, "lsn": 9},
                {"id": 3, "full_name": "tie, earlier file", "op": "u", "ts_ms": 30, "lsn": 1},
                {"id": 6, "full_name": "older than its delete", "op": "c", "ts_ms": 15, "lsn": 0},
                {"id": None, "full_name": "refused", "op": "c", "ts_ms": 30, "lsn": 0},
            ],
        ),
        write_parquet(
            landing,
            cfg,
            INC1,
            F1,
            [
                {"id": 3, "full_name": "tie, later file", "op": "u", "ts_ms": 30, "lsn": 1},
                {"id": 7, "full_name": "inserted", "op": "c", "ts_ms": 40, "lsn": 0},
                {"id": 7, "full_name": None, "op": "d", "ts_ms": 40, "lsn": 0},
                {"id": 4, "full_name": "second lsn wins", "op": "u", "ts_ms": 10, "lsn": 5},
            ],
        ),
    ]
    kw = {"quarantine": tmp_path / "q2", "ingested_at": at1 + timedelta(hours=1)}
    plan = make_plan(cfg, "p2", base=versions / "v1", files=files2, out=versions / "lookup", **kw)
    plan["order_by"] = cfg.order_by  # as the plan task writes it
    lookup = job.run(spark, {**plan, "merge_path": "window"})
    full = job.run(
        spark, {**plan, "output_location": str(versions / "full"), "key_lookup_max_events": 0, "merge_path": "window"}
    )
    # The events ranked alone, the base streamed past their winners: the few events' default path.
    broadcast = job.run(spark, {**plan, "output_location": str(versions / "broadcast")})
    assert (lookup["merge_path"], full["merge_path"], broadcast["merge_path"]) == ("window", "window", "broadcast")

    rows = read_rows(versions / "lookup")
    assert rows == read_rows(versions / "full") == read_rows(versions / "broadcast")
    assert [(r["id"], r["full_name"], r["op"]) for r in rows] == [
        (1, "newer", "u"),
        (2, "n2", "r"),
        (3, "tie, later file", "u"),
        (4, "second lsn wins", "u"),
        (5, "n5", "r"),
        (6, None, "d"),
        (7, None, "d"),
    ]
    ignore = ("output_files", "finished_at", "merge_path")
    assert {k: v for k, v in lookup.items() if k not in ignore} == {k: v for k, v in full.items() if k not in ignore}
    assert {k: v for k, v in lookup.items() if k not in ignore} == {
        k: v for k, v in broadcast.items() if k not in ignore
    }
    assert (lookup["base_rows"], lookup["superseded_rows"], lookup["rejected_rows"]) == (6, 7, 1)
    # Ties on (ts_ms, lsn) that file or row order decided: id 3 (two files), id 7 (insert and delete in
    # one file). Late, ranked below their key's base row: id 2 (ts 5 < 10) and id 6 (15 < its delete's 20).
    assert (lookup["tied_winners"], lookup["late_events"]) == (2, 2)
    assert_reconciles(lookup)
    # The counts observed as the outputs were written are the rows on storage (read here with pyarrow).
    for stats, out in ((lookup, "lookup"), (full, "full"), (broadcast, "broadcast")):
        data, tomb = (pq.read_table(str(versions / out / d)).num_rows for d in ("data", "tombstones"))
        assert (stats["output_visible_rows"], stats["output_tombstones"]) == (data, tomb) == (5, 2)
        assert stats["misplaced_rows"] == 0


# ------------------------------------------------------------ the broadcast merge's pairwise order
def test_the_rank_order_is_read_item_by_item_from_the_rule(make_cfg: MakeCfg) -> None:
    """The broadcast merge compares two rows by the rank's own ORDER BY: every item, its direction, its NULLs."""
    plain = job.order_items(rule_sql(lsn_cfg(make_cfg)).rank)
    provenance = [("`_cdc_increment`", True, False), ("`_cdc_file`", True, False), ("`_cdc_pos`", True, False)]
    # Descending, Spark's NULLs last (the rule refuses a NULL order value of an event anyway).
    assert plain == [("`ts_ms`", True, False), ("`lsn`", True, False), *provenance]
    binlog = make_cfg(
        columns=[*STUDENT_COLUMNS, {"name": "file", "type": "string"}],
        order_by=["file", "ts_ms"],
        order_as={"file": "binlog_file"},
        missing_op="read",
    )
    got = job.order_items(rule_sql(binlog).rank)
    assert got is not None and len(got) == 5 and got[2:] == provenance
    # A binlog file compares by the number it ends in (a comma inside the call, a parenthesis inside a quote).
    assert "regexp_extract(`file`" in got[0][0] and got[0][1:] == (True, False)
    assert got[1] == ("`ts_ms`", True, False)
    assert job.order_items("rank() OVER (PARTITION BY `id`)") is None


def test_sorts_before_is_the_order_a_sort_gives(spark: Any) -> None:
    """Every pair of rows of a grid (NULLs, ties on each item): a ranks before b exactly when a sort puts it first.

    The order is written here from the contract: greatest ``ts_ms``, then ``lsn`` (NULLs first, as
    full-load rows sort), then the later increment, file and row.
    """
    items = [
        ("`ts_ms`", True, False),
        ("`lsn`", True, True),
        ("`_cdc_increment`", True, False),
        ("`_cdc_file`", True, False),
        ("`_cdc_pos`", True, False),
    ]
    values = [None, 1, 2]
    grid = [
        (t, lsn, inc, f, pos) for t in values for lsn in values for inc in (INC0, INC1) for f in (F0,) for pos in (0, 1)
    ]
    rows = spark.createDataFrame(
        grid, "ts_ms bigint, lsn bigint, _cdc_increment string, _cdc_file string, _cdc_pos bigint"
    )
    order = "ts_ms DESC NULLS LAST, lsn DESC NULLS FIRST, _cdc_increment DESC, _cdc_file DESC, _cdc_pos DESC"
    placed = rows.withColumn("place", expr(f"row_number() OVER (ORDER BY {order})"))
    a = placed.select(*[placed[c].alias(f"a{i}") for i, c in enumerate(placed.columns)])
    b = placed.select(*[placed[c].alias(f"b{i}") for i, c in enumerate(placed.columns)])
    pairs = a.crossJoin(b)
    got = pairs.select(
        (pairs["a5"] < pairs["b5"]).alias("want"),
        job.sorts_before([pairs[f"a{i}"] for i in range(5)], [pairs[f"b{i}"] for i in range(5)], items).alias("got"),
    ).collect()
    assert len(got) == len(grid) ** 2
    assert [r for r in got if r["want"] != r["got"]] == []


# ------------------------------------------------------------ checks of the written output
_sides = st.lists(
    st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 3), st.sampled_from(["c", "u", "d", None])),
    max_size=12,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_sides, tombstones=_sides)
def test_written_tallies_count_rows_and_misplaced_rows_as_they_are_written(
    spark: Any, data: Any, tombstones: Any
) -> None:
    """The observed counts of a write see every row, and a misplaced one on either side (counted here in Python).

    A delete (op d) among the visible rows or a non-delete among the tombstones is misplaced (a
    NULL op is neither): such an output must not be published.
    """
    ddl, is_delete = "k1 string, k2 int, op string", expr("op = 'd'")
    got = {}
    for name, rows, tomb in (("data", data, False), ("tomb", tombstones, True)):
        obs = Observation(f"test_{name}")
        spark.createDataFrame(rows, ddl).observe(obs, *job.written_tally_columns(is_delete, tombstones=tomb)).collect()
        got[name] = (job._observed(obs, "rows"), job._observed(obs, "misplaced"))
    assert got == {
        "data": (len(data), sum(op == "d" for _, _, op in data)),
        "tomb": (len(tombstones), sum(op is not None and op != "d" for _, _, op in tombstones)),
    }


def test_key_index_is_written_sorted_and_the_next_compaction_finds_keys_through_it(
    spark: Any, make_cfg: MakeCfg, tmp_path: Path
) -> None:
    """The key index (README, "Key index") holds each written partition's keys, sorted; a compaction that
    reads it compacts exactly as one that scans the partitions' keys (an index-less, older version)."""
    from cdc_compaction.core.sql import partition_sql

    cfg = region_cfg(make_cfg)
    landing, versions = tmp_path / "incremental", tmp_path / "base"
    (versions / "v0").mkdir(parents=True)
    at = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)

    def land(increment: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return land_region(landing, increment, rows)

    def compact(
        plan_id: str, base: str, files: list[dict[str, Any]], out: str, parts: dict[str, str], index: Any
    ) -> Any:
        plan = make_plan(
            cfg,
            plan_id,
            base=versions / base,
            files=files,
            out=versions / out,
            quarantine=tmp_path / plan_id,
            ingested_at=at,
        )
        plan["partition_by"] = partition_sql(cfg).to_dict()
        plan["base_partitions"] = parts
        if index is not None:
            plan["base_index"] = index
        return job.run(spark, plan)

    # Keys grow with the region's block (ids clustered per partition, written in reverse order).
    regions = {"EU": range(1, 11), "US": range(11, 21), "APAC": range(21, 31)}
    initial = [
        {"id": i, "region": r, "full_name": f"n{i}", "op": "c", "ts_ms": 1} for r, ids in regions.items() for i in ids
    ][::-1]
    stats1 = compact("p1", "v0", [land(INC0, initial)], "v1", {}, None)
    assert stats1["index_mismatches"] == 0
    assert stats1["index_rows"] == stats1["partition_rows"] == {r: len(ids) for r, ids in regions.items()}
    assert stats1["index"] == {r: str(versions / "v1" / "index" / f"cdc_partition={r}") for r in regions}
    for region, loc in stats1["index"].items():
        files = sorted(Path(loc).glob("*.parquet"))
        assert len(files) == 1  # one file per partition
        keys = pq.read_table(files[0]).column("id").to_pylist()
        assert keys == sorted(regions[region])  # every key of the partition, in key order
        assert pq.read_table(files[0]).column_names == ["id"]
    assert {f["name"].split("/")[0] for f in stats1["output_files"]} == {"data", "index", "tombstones"}

    # A key-only delete (EU: found through its key), a move from US to a new partition, a new key.
    change = [
        {"id": 3, "region": None, "full_name": None, "op": "d", "ts_ms": 2},
        {"id": 12, "region": "LATAM", "full_name": "moved", "op": "u", "ts_ms": 2},
        {"id": 31, "region": "LATAM", "full_name": "new", "op": "c", "ts_ms": 2},
    ]
    files2 = [land(INC1, change)]
    indexed = compact("p2", "v1", files2, "v2i", stats1["partitions"], stats1["index"])
    scanned = compact("p2", "v1", files2, "v2s", stats1["partitions"], None)
    on_driver = {"key_range": True, "listed_on_driver": True}  # local storage: no listing job
    assert indexed["key_lookup"] == {"indexed_partitions": 3, "scanned_partitions": 0, **on_driver}
    assert scanned["key_lookup"] == {"indexed_partitions": 0, "scanned_partitions": 3, **on_driver}
    # Expected, from the events themselves: 3 deleted (its tombstone in EU), 12 moved, 31 new; APAC untouched.
    expected = {(r["id"], r["region"]) for r in initial if r["id"] not in (3, 12)} | {(12, "LATAM"), (31, "LATAM")}
    for stats, out in ((indexed, "v2i"), (scanned, "v2s")):
        assert_reconciles(stats)
        assert stats["partitions_touched"] == ["EU", "LATAM", "US"]
        assert stats["duplicate_keys"] == 0 and stats["index_mismatches"] == 0
        got = {(r["id"], v) for v, d in partition_dirs(versions / out).items() for r in read_rows(d)}
        reused = {(r["id"], "APAC") for r in pq.read_table(stats1["partitions"]["APAC"]).to_pylist()}
        assert got | reused == expected
        assert [(r["id"], r[PC]) for r in read_rows(versions / out / "tombstones")] == [(3, "EU")]
        assert stats["index_rows"] == stats["partition_rows"] == {"EU": 9, "LATAM": 2, "US": 9}


@pytest.mark.parametrize("known_rows", [False, True, "many"], ids=["counted", "known", "known-many"])
def test_key_range_filter_keeps_every_base_key_an_event_may_be(spark: Any, known_rows: bool | str) -> None:
    """The filter on the index is the events' [min, max] of the first key column, NULL kept when an event has it.

    The same whether the filter counts the events itself or is told their number: few (ranges cut
    on the driver) or more than ``DRIVER_RANGES_MAX`` (cut in Spark, one job).
    """
    extra = job.DRIVER_RANGES_MAX if known_rows == "many" else 0
    base = spark.createDataFrame([(k, "x") for k in [None, 1, 5, 6, 9, 12]], "id int, t string")
    ids = lambda df: sorted((r["id"] for r in df.collect()), key=lambda k: (k is not None, k))  # noqa: E731

    def kept(event_ids: list[int | None]) -> list[int | None]:
        events = spark.createDataFrame([(k, "e") for k in event_ids], "id int, t string")
        cond = job.key_range_filter(events, ["id", "t"], len(event_ids) + extra if known_rows else None)
        assert cond is not None
        return ids(base.filter(cond))

    assert kept([6, 9]) == [6, 9]
    assert kept([9, 5]) == [5, 9]  # integer keys: ranges cut at the gaps between them
    assert kept([1, 5, 6, 9, 12][::-1]) == [1, 5, 6, 9, 12]
    assert kept([6, None]) == [None, 6]  # nullable_key: a NULL key is a key
    assert kept([None]) == [None]
    empty = spark.createDataFrame([], "id int, t string")
    assert job.key_range_filter(empty, ["id"], 0 if known_rows is True else None) is None
    # Date keys: cut at the gap in days between them, like integers.
    days = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 3, 1)]
    calendar = spark.createDataFrame([(d,) for d in days], "id date")
    cond = job.key_range_filter(calendar.filter("id != DATE'2026-01-02'"), ["id"], 2 + extra if known_rows else None)
    assert sorted(r["id"] for r in calendar.filter(cond).collect()) == [days[0], days[2]]
    # String keys: one range, [min, max]; the join afterwards is exact.
    words = spark.createDataFrame([(w,) for w in ["ant", "bee", "cat", "dog"]], "id string")
    two = 2 + extra if known_rows else None
    cond = job.key_range_filter(spark.createDataFrame([("dog",), ("bee",)], "id string"), ["id"], two)
    assert sorted(r["id"] for r in words.filter(cond).collect()) == ["bee", "cat", "dog"]
    # Float keys are not range-filtered (NaN orders last in Spark): the whole, narrow, index is read.
    floats = spark.createDataFrame([(1.5,)], "id double")
    assert job.key_range_filter(floats, ["id"]) is None


def test_event_key_summary_cuts_ranges_on_the_driver_and_names_the_events_partitions(spark: Any) -> None:
    """Few events: one job gives the key ranges (cut on the driver) and the partitions the events name.

    The ranges keep what :func:`key_range_filter` keeps; more than ``DRIVER_RANGES_MAX`` events, or a
    key type whose literal may not round-trip, is left to the Spark path (None).
    """
    base = spark.createDataFrame([(k,) for k in [None, 1, 5, 6, 9, 12, 400]], "id int")
    value = "coalesce(region, '__null__')"

    def summary(rows: list[tuple[Any, ...]], kind: str = "id int, region string") -> Any:
        events = spark.createDataFrame(rows, kind)
        return job.event_key_summary(events, ["id"], "region", value, len(rows))

    cond, own = summary([(9, "EU"), (5, None), (6, "US"), (5, "EU")])
    assert own == ["EU", "US"]  # the events' own partitions; a key-only event names none
    assert sorted(r["id"] for r in base.filter(cond).collect()) == [5, 6, 9]
    cond, own = summary([(None, "EU"), (400, None)])
    assert own == ["EU"] and sorted((r["id"] for r in base.filter(cond).collect()), key=str) == [400, None]
    # Strings: one range [min, max]; dates cut at the gap in days.
    words = spark.createDataFrame([(w,) for w in ["ant", "bee", "cat", "dog"]], "id string")
    cond, _ = summary([("dog", "x"), ("bee", "x")], "id string, region string")
    assert sorted(r["id"] for r in words.filter(cond).collect()) == ["bee", "cat", "dog"]
    days = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 3, 1)]
    cond, _ = summary([(days[0], "x"), (days[2], "x")], "id date, region string")
    calendar = spark.createDataFrame([(d,) for d in days], "id date")
    assert sorted(r["id"] for r in calendar.filter(cond).collect()) == [days[0], days[2]]
    # Left to the Spark path: floats, an unknown or too large count.
    assert summary([(1.5, "x")], "id double, region string") is None
    events = spark.createDataFrame([(1, "x")], "id int, region string")
    assert job.event_key_summary(events, ["id"], "region", value, None) is None
    assert job.event_key_summary(events, ["id"], "region", value, job.DRIVER_RANGES_MAX + 1) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=st.lists(st.one_of(st.none(), st.integers(-50, 50)), min_size=1, max_size=40),
    stored=st.lists(st.one_of(st.none(), st.integers(-60, 60)), max_size=40),
)
def test_event_key_summary_never_filters_out_a_stored_key_an_event_has(
    spark: Any, events: list[int | None], stored: list[int | None]
) -> None:
    """Whatever the keys: every stored key equal to an event's key (NULL equal to NULL) passes the filter."""
    frame = spark.createDataFrame([(k, None) for k in events], "id int, region string")
    got = job.event_key_summary(frame, ["id"], "region", "coalesce(region, 'none')", len(events))
    assert got is not None and got[1] == []
    # The same filter cut in Spark (more events than the driver cuts for): a superset too.
    spark_cut = job.key_range_filter(frame, ["id"], len(events) + job.DRIVER_RANGES_MAX)
    # From the contract: a stored key any event has must be kept (a superset is allowed, never fewer).
    must = [k for k in stored if k in events]
    for cond in (got[0], spark_cut):
        kept = [r["id"] for r in spark.createDataFrame([(k,) for k in stored], "id int").filter(cond).collect()]
        assert Counter(must) - Counter(kept) == Counter()


_key_lists = st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 3)), max_size=14)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(written=_key_lists, touched=_key_lists)
def test_duplicate_keys_are_found_among_all_keys_or_the_touched_ones(spark: Any, written: Any, touched: Any) -> None:
    """A key (NULL parts included: NULL equals NULL) written more than once is a duplicate.

    Given the keys the compaction ranked, only those are checked (untouched keys are the parent's,
    unique when it was committed): a duplicate among them must still be found.
    """
    ddl, pk = "k1 string, k2 int", ["k1", "k2"]
    frame = spark.createDataFrame(written, ddl)
    counts = Counter(written)
    assert job.duplicate_keys(frame, pk) == sum(1 for n in counts.values() if n > 1)
    ranked_keys = set(touched)
    got = job.duplicate_keys(frame, pk, spark.createDataFrame(touched, ddl))
    assert got == sum(1 for k, n in counts.items() if n > 1 and k in ranked_keys)


def test_list_on_driver_only_where_the_storage_allows(spark: Any) -> None:
    """Local and HDFS directories are listed by the driver (no listing job); object stores keep Spark's."""
    from cdc_compaction.job.common import DRIVER_LISTING_MAX, PARALLEL_LISTING_CONF, list_on_driver

    before = spark.conf.get(PARALLEL_LISTING_CONF)
    try:
        spark.conf.set(PARALLEL_LISTING_CONF, "32")
        assert not list_on_driver(spark, ["s3a://lake/t/index/_cdc_partition=a", "/lake/t/index/_cdc_partition=b"])
        assert not list_on_driver(spark, [f"/lake/{i}" for i in range(DRIVER_LISTING_MAX + 1)])
        assert not list_on_driver(spark, [])
        assert spark.conf.get(PARALLEL_LISTING_CONF) == "32"
        assert list_on_driver(spark, ["/lake/a", "file:///lake/b", "hdfs://nn/lake/c"])
        assert spark.conf.get(PARALLEL_LISTING_CONF) == str(DRIVER_LISTING_MAX)
    finally:
        spark.conf.set(PARALLEL_LISTING_CONF, before)


# ------------------------------------------------------------ the job's Spark jobs
def _spark_job_ids(spark: Any) -> set[int]:
    """The ids of every Spark job this application ran, from its status store (kept with the UI off)."""
    seq = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    return {j.jobId() for j in spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq)}


#: The most Spark jobs one small compaction may start, per merge path, as measured (bench/job_actions.py,
#: docs/benchmarks.md "The job's Spark jobs"): a job more is a stage more of fixed cost in every run.
MOST_SPARK_JOBS = {"broadcast": 19, "window": 16, "window, every key": 10}


# Four compactions (~20 s): the job's results down every merge path are this file's other tests in make test;
# this count guards the job's fixed cost, which the benchmark measures (make bench).
@pytest.mark.extended
def test_a_small_compaction_starts_no_more_spark_jobs_than_measured(
    spark: Any, make_cfg: MakeCfg, tmp_path: Path
) -> None:
    """Pins the number of Spark jobs of a small compaction down each merge path (a count, not a time).

    Each is a base of 6 keys and an increment of updates, a delete, an insert and a refused row,
    so the quarantine write runs too.
    """
    cfg = lsn_cfg(make_cfg)
    landing, versions = tmp_path / "incremental", tmp_path / "base"
    (versions / "v0").mkdir(parents=True)
    initial = [{"id": i, "full_name": f"n{i}", "op": "r", "ts_ms": 10, "lsn": i} for i in range(1, 7)]
    at1 = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
    kw = {"quarantine": tmp_path / "q", "ingested_at": at1}
    job.run(
        spark,
        make_plan(
            cfg,
            "p1",
            base=versions / "v0",
            files=[write_parquet(landing, cfg, INC0, F0, initial)],
            out=versions / "v1",
            **kw,
        ),
    )
    changes = [
        {"id": 1, "full_name": "newer", "op": "u", "ts_ms": 30, "lsn": 0},
        {"id": 2, "full_name": None, "op": "d", "ts_ms": 30, "lsn": 0},
        {"id": 9, "full_name": "new", "op": "c", "ts_ms": 30, "lsn": 0},
        {"id": None, "full_name": "refused", "op": "c", "ts_ms": 30, "lsn": 0},
    ]
    kw = {"quarantine": tmp_path / "q2", "ingested_at": at1 + timedelta(hours=1)}
    plan = make_plan(
        cfg,
        "p2",
        base=versions / "v1",
        files=[write_parquet(landing, cfg, INC1, F0, changes)],
        out=versions / "x",
        **kw,
    )
    plan |= {"order_by": cfg.order_by, "base_rows": 6, "base_tombstones": 0}
    variants = {
        "broadcast": {"merge_path": "broadcast"},
        "window": {"merge_path": "window"},
        "window, every key": {"merge_path": "window", "key_lookup_max_events": 0},
    }
    started = {}
    for name, extra in variants.items():
        before = _spark_job_ids(spark)
        stats = job.run(spark, {**plan, **extra, "output_location": str(versions / name.replace(", ", "-"))})
        started[name] = len(_spark_job_ids(spark) - before)
        assert (stats["output_visible_rows"], stats["output_tombstones"], stats["duplicate_keys"]) == (6, 1, 0)
    assert all(started[name] <= most for name, most in MOST_SPARK_JOBS.items()), (started, MOST_SPARK_JOBS)
