"""Fresh views between compactions, and how fresh each thing a reader queries is.

The view refresher (DAG ``cdc__views_refresh``, step ``refresh_pending``) shows
newly landed increments in every view within its schedule, with metastore calls only,
and stays out of a run's way; freshness is recorded as table properties of the base and
the views, in ``_cdc/freshness.json``, and in the publish task's result.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import compact_once

from cdc_compaction.core.lake import TableLease
from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import land
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.operations.status import table_status
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import validate
from cdc_compaction.pipeline.views import refresh_pending, refresh_view

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _rows(*rows: tuple[Any, ...]) -> list[dict[str, Any]]:
    return [dict(zip(["id", "full_name", "op", "ts_ms"], r, strict=True)) for r in rows]


def _props(rt: Runtime, table: str) -> dict[str, str]:
    with connect(rt.metastore) as ms:
        t = ms.get_table(rt.cfg.database, table)
        return {k: v for k, v in (t.parameters or {}).items() if k.startswith("cdc.freshness.")}


def _view(spark: Any, rt: Runtime) -> dict[int, str]:
    name = f"`{rt.cfg.database}`.`{table_names(rt.cfg)['view_name']}`"
    for role in ("base_table", "tombstones_table", "incremental_table"):
        spark.catalog.refreshTable(f"`{rt.cfg.database}`.`{table_names(rt.cfg)[role]}`")
    return {r["id"]: r["full_name"] for r in spark.sql(f"SELECT id, full_name FROM {name}").collect()}


def _duckdb_view(rt: Runtime) -> dict[int, str]:
    with duckdb.connect() as con:
        con.execute(Path(str(rt.cfg.views.duckdb)).read_text())
        rows = con.execute(f'SELECT id, full_name FROM "{rt.cfg.database}"."{rt.cfg.table}_view"').fetchall()
    return dict(rows)


def test_new_increments_reach_the_views_without_a_compaction(
    make_cfg: Any, runtime: Any, spark: Any, tmp_path: Path
) -> None:
    rt = runtime(make_cfg(views={"duckdb": str(tmp_path / "duck" / "views.sql")}, slo={"freshness": "1h"}))
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112210", [_rows((1, "Ann", "c", _ms(T0)), (2, "Bob", "c", _ms(T0)))])
    compact_once(rt, "run-1")
    refresh_view(rt)
    base_props = {
        "cdc.freshness.base.commit": "1",
        "cdc.freshness.base.increment": "increment_2026112210",
        "cdc.freshness.base.event_time": T0.isoformat(),
    }
    got = _props(rt, table_names(rt.cfg)["base_table"])
    assert {k: got[k] for k in base_props} == base_props

    # An increment lands after the run: before this release the views showed it only at the next run.
    later = T0 + timedelta(hours=1, minutes=7)
    land(rt.cfg, "increment_2026112211", [_rows((2, "Bobby", "u", _ms(later)), (3, "Cy", "c", _ms(later)))])
    assert _view(spark, rt) == {1: "Ann", 2: "Bob"}, "nothing registered it yet"
    result = refresh_pending(rt)
    assert result["partitions_added"] == ["increment_2026112211"]
    # The refresher checks the SLO between runs; the breach was alerted once already, by the first publish.
    assert result["slo"]["breached"] and result["slo"]["alerted"] is None
    assert json.loads(Path(rt.lake.layout.control, "slo.json").read_text())["breached"]
    assert _view(spark, rt) == {1: "Ann", 2: "Bobby", 3: "Cy"}
    assert _duckdb_view(rt) == {1: "Ann", 2: "Bobby", 3: "Cy"}
    view_props = _props(rt, table_names(rt.cfg)["view_name"])
    assert view_props["cdc.freshness.view.increment"] == "increment_2026112211"
    assert view_props["cdc.freshness.view.event_time"] == later.isoformat()
    # The base did not move: its freshness says so.
    got = _props(rt, table_names(rt.cfg)["base_table"])
    assert {k: got[k] for k in base_props} == base_props
    doc = json.loads(Path(rt.lake.layout.control, "freshness.json").read_text())
    assert doc["base"]["increment"] == "increment_2026112210"
    assert doc["view"]["increment"] == "increment_2026112211"
    # `status` reads the real commit record: 2 visible rows, fresh as of T0's events, one hour pending.
    st = table_status(rt.cfg, T0 + timedelta(hours=3))
    assert st.last_commit is not None and (st.last_commit.seq, st.last_commit.rows) == (1, 2)
    assert (st.freshness_basis, st.freshness_seconds) == ("event_time", 3 * 3600)
    assert st.pending == ["increment_2026112211"] and st.error == ""

    # The next run compacts it: the publish result reports both, and the base catches up.
    path = plan(rt, "run-2")
    rt.engine.compact(json.loads(Path(path).read_text()))
    validate(rt, path)
    published = publish(rt, path)
    # Committed, not archived yet: still landed, but no longer pending.
    st = table_status(rt.cfg, later + timedelta(hours=1))
    assert st.last_commit is not None and (st.last_commit.seq, st.last_commit.rows) == (2, 3)
    assert (st.freshness_seconds, st.pending) == (3600, [])
    assert published["freshness"]["base"] == {"increment": "increment_2026112211", "event_time": later.isoformat()}
    assert published["freshness"]["view"]["increment"] == "increment_2026112211"
    # The commit records what the run did and how fresh the table was (README, "Metrics and SLOs").
    commit = rt.lake.latest_commit()
    committed = datetime.fromisoformat(commit.committed_at)
    assert commit.metrics is not None and published["metrics"] == commit.metrics
    counts = {k: v for k, v in commit.metrics.items() if isinstance(v, int)}
    # Bob's base row lost to Bobby; Cy is new; nothing tied or came late.
    assert counts == {
        **dict.fromkeys(("rejected", "tombstones", "expired_tombstones", "ties", "late_events"), 0),
        **{"events_in": 2, "events_out": 3, "visible_rows": 3, "superseded": 1},
    }
    assert commit.metrics["freshness_lag_seconds"] == (committed - later).total_seconds()
    assert commit.metrics["landing_lag_seconds"] == (committed - (T0 + timedelta(hours=2))).total_seconds()
    assert sorted(commit.metrics["step_seconds"]) == ["compact", "publish", "validate"]
    assert all(v >= 0 for v in commit.metrics["step_seconds"].values())
    # Data from days ago against a 1 h bound: breached ever since the first commit.
    assert published["slo"]["breached"] and published["slo"]["compliance"] == 0
    # After publish the views no longer read the compacted increment (the base holds it): still right.
    assert _view(spark, rt) == {1: "Ann", 2: "Bobby", 3: "Cy"}
    assert _duckdb_view(rt) == {1: "Ann", 2: "Bobby", 3: "Cy"}
    archive(rt, path)
    assert _duckdb_view(rt) == {1: "Ann", 2: "Bobby", 3: "Cy"}, "the DuckDB views name no archived file"


def test_the_refresher_stays_out_of_a_running_compaction(make_cfg: Any, runtime: Any, spark: Any) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112210", [_rows((1, "Ann", "c", 1))])
    path = plan(rt, "run-1")
    assert path
    land(rt.cfg, "increment_2026112211", [_rows((2, "Bob", "c", 2))])
    skipped = refresh_pending(rt)
    assert "a run holds the table" in skipped["skipped"]
    with connect(rt.metastore) as ms:
        registered = ms.partitions(rt.cfg.database, table_names(rt.cfg)["incremental_table"])
    assert "increment_2026112211" not in registered
    # An expired lease (a dead run) does not keep the views stale.
    later = datetime.now(UTC) + rt.cfg.lease_timeout + timedelta(minutes=1)
    assert refresh_pending(rt, now=later)["partitions_added"] == ["increment_2026112211"]
    TableLease(rt.lake).break_("test")


def test_a_failing_duckdb_target_never_stops_a_publish(make_cfg: Any, runtime: Any, spark: Any, tmp_path: Path) -> None:
    """A side channel: the DuckDB views cannot be written (their directory is a file), the data publishes."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the views' directory should be")
    rt = runtime(make_cfg(views={"duckdb": str(blocker / "views.sql")}))
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112210", [_rows((1, "Ann", "c", 1))])
    from cdc_compaction.pipeline import views

    before = views.FAILURES.get("duckdb_views", 0)
    compact_once(rt, "run-1")
    assert rt.lake.latest_commit().seq == 1
    assert _view(spark, rt) == {1: "Ann"}
    assert views.FAILURES.get("duckdb_views", 0) > before


def test_the_refresher_follows_the_compaction_policy(make_cfg: Any, runtime: Any, caplog: Any) -> None:
    """Under ``policy: threshold`` the refresher measures what it shows as plan does and says when compaction is due."""
    policy = {"policy": "threshold", "pending_files": 2, "pending_rows_ratio": None, "pending_age": None}
    rt = runtime(make_cfg(compaction=policy))
    ensure_tables(rt)
    now = T0 + timedelta(minutes=30)
    first = refresh_pending(rt, now=now)
    assert first["compaction"]["compact"] is False and first["compaction"]["reason"] == "nothing pending"

    land(rt.cfg, "increment_2026112210", [_rows((1, "Ann", "c", _ms(T0)))])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cdc_compaction"):
        one = refresh_pending(rt, now=now)
    # The contract (docs, "Compaction policy"): compact once pending_files (2) complete files wait; one does not.
    assert one["partitions_added"] == ["increment_2026112210"]
    assert one["compaction"]["compact"] is False
    assert one["compaction"]["thresholds"] == [
        {"threshold": "pending_files", "value": 1, "limit": 2, "reached": False, "progress": 0.5}
    ]
    # Not due yet: the refresh is quiet (nothing at WARNING or above).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    land(rt.cfg, "increment_2026112211", [_rows((2, "Bob", "c", _ms(T0)), (3, "Cy", "c", _ms(T0)))])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cdc_compaction"):
        two = refresh_pending(rt, now=now)
    assert two["compaction"]["compact"] is True
    assert two["compaction"]["thresholds"][0]["reached"] is True
    due = [r for r in caplog.records if "compaction is due" in r.getMessage()]
    assert len(due) == 1 and due[0].levelno == logging.WARNING, caplog.text
    message = due[0].getMessage()
    # It names the table, what is pending (2 files in the 2 increments landed above, 3 rows) and who compacts it:
    # the table's DAG at its next scheduled run; the refresher starts no run.
    assert message.startswith(f"{rt.cfg.qualified_name}: compaction is due"), message
    assert "2 pending files in 2 increments (increment_2026112210 ... increment_2026112211), 3 rows" in message
    assert f"the next scheduled run of DAG {rt.cfg.dag_id} (@hourly) compacts them" in message, message
    assert "this refresh starts no run" in message, message
    assert rt.lake.latest_commit().seq == 0 and TableLease(rt.lake).current() is None, "the refresher compacts nothing"

    # The plan of the table's next run decides the same (it compacts what the refresher said was due).
    path = plan(rt, run_id="due", now=now)
    assert json.loads(Path(path).read_text())["compaction"]["compact"] is True


@pytest.mark.parametrize(
    ("overrides", "why"),
    [({"schedule": None}, "its registry schedule is null"), ({"retired": True}, "the table is retired")],
)
def test_the_refresher_says_an_unscheduled_table_must_be_triggered(
    make_cfg: Any, runtime: Any, caplog: Any, overrides: dict[str, Any], why: str
) -> None:
    """A table whose DAG has no schedule has no next scheduled run: the warning says to trigger it instead."""
    policy = {"policy": "threshold", "pending_files": 1, "pending_rows_ratio": None, "pending_age": None}
    rt = runtime(make_cfg(compaction=policy, **overrides))
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112210", [_rows((1, "Ann", "c", _ms(T0)))])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cdc_compaction"):
        assert refresh_pending(rt, now=T0 + timedelta(minutes=30))["compaction"]["compact"] is True
    due = [r.getMessage() for r in caplog.records if "compaction is due" in r.getMessage()]
    assert len(due) == 1, caplog.text
    assert f"DAG {rt.cfg.dag_id} has no schedule ({why})" in due[0], due[0]
    assert f"trigger DAG {rt.cfg.dag_id} to compact them" in due[0], due[0]
    assert "next scheduled run" not in due[0], due[0]


def test_the_refresher_of_an_always_table_reports_no_policy(make_cfg: Any, runtime: Any) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112210", [_rows((1, "Ann", "c", _ms(T0)))])
    assert "compaction" not in refresh_pending(rt, now=T0 + timedelta(minutes=30))
