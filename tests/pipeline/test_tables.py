"""The ``ensure_tables`` step: new columns, refused drops, registry text as data, reserved words.

On real storage, metastore and Spark (moved here from ``tests/test_tasks.py``).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import STUDENT_COLUMNS, compact_once

from cdc_compaction.core.exceptions import (
    SchemaChangeError,
)
from cdc_compaction.core.sql import table_names
from cdc_compaction.devtools.conformance import land
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.views import refresh_view

from .helpers import REGION_COLUMNS, student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def test_ensure_tables_adds_new_columns_and_refuses_dropped_ones(make_cfg, runtime, spark, tmp_path) -> None:
    cfg = make_cfg()
    rt = runtime(cfg)
    first = ensure_tables(rt)
    assert first["ddl_statements"] >= 4
    assert ensure_tables(rt)["ddl_statements"] == 0, "unchanged registry: no DDL, no JVM"
    land(cfg, "increment_2026112200", [student_rows((1, "a", "c", 1))])
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


def test_unchanged_set_on_a_live_table_adds_its_hidden_columns_and_can_be_removed(make_cfg, runtime, spark) -> None:
    """Setting ``unchanged`` later: the base and tombstones tables get the columns that remember where a
    filled value came from (the views read them; files written before read NULL there), and removing
    it again is no dropped column."""
    from cdc_compaction.modes.cdc import Unchanged

    cfg = make_cfg()
    rt = runtime(cfg)
    ensure_tables(rt)
    land(cfg, "increment_2026112200", [student_rows((1, "a", "c", 1), (2, "b", "c", 2))])
    compact_once(rt, "r1")
    partial = cfg.model_copy(update={"unchanged": Unchanged(columns=["full_name"])})
    rt2 = runtime(partial)
    ensure_tables(rt2)
    names = table_names(cfg)
    for role in ("base_table", "tombstones_table"):
        table = f"`{cfg.database}`.`{names[role]}`"
        spark.catalog.refreshTable(table)
        hidden = [c for c in spark.table(table).columns if c.startswith("_cdc_") and "full_name" not in c]
        assert any(c.startswith("_cdc_left_") for c in hidden), (role, hidden)
    placeholder = "__debezium_unavailable_value"
    land(partial, "increment_2026112201", [student_rows((1, placeholder, "u", 3))])
    refresh_view(rt2)
    view = f"`{cfg.database}`.`{names['view_name']}`"
    assert {r["id"]: r["full_name"] for r in spark.sql(f"SELECT id, full_name FROM {view}").collect()} == {
        1: "a",
        2: "b",
    }
    compact_once(rt2, "r2")
    base = f"`{cfg.database}`.`{names['base_table']}`"
    spark.catalog.refreshTable(base)
    assert {r["id"]: r["full_name"] for r in spark.sql(f"SELECT id, full_name FROM {base}").collect()} == {
        1: "a",
        2: "b",
    }
    ensure_tables(runtime(cfg))  # unchanged removed: its hidden columns stay, no SchemaChangeError


def _store(spark: Any) -> Any:
    jvm_sc = spark.sparkContext._jsc.sc()
    jvm_sc.listenerBus().waitUntilEmpty()  # the store is filled by a listener: let it catch up
    return spark._jsparkSession.sharedState().statusStore()


def _executions(spark: Any, since: int = -1) -> list[tuple[int, str]]:
    """The SQL executions Spark itself recorded for the session after execution ``since``, oldest first:
    (id, its command and arguments).

    Read from the session's SQL status store (what Spark's SQL tab shows; it is kept with the UI
    off too): each statement ``spark.sql`` runs, a DDL command included, is one execution there.
    The store lists them by id; only its newest ones are read, a page at a time from the end, because
    every row is a few py4j calls and the session's store holds up to a thousand executions by now.
    """
    store = _store(spark)
    count, page, out = store.executionsCount(), 32, []
    end = count
    while end > 0:
        found = store.executionsList(max(0, end - page), min(page, end))
        rows = []
        for i in range(found.size()):
            execution = found.apply(i)
            if execution.executionId() <= since:
                continue
            plan = execution.physicalPlanDescription().splitlines()
            # "== Physical Plan ==", then the command ("Execute CreateDataSourceTableCommand (1)"), then its arguments.
            args = next((line for line in plan if line.startswith("Arguments")), "")
            rows.append((execution.executionId(), " ".join([*plan[1:2], args])))
        out[:0] = rows
        if found.size() == 0 or found.apply(0).executionId() <= since:
            break  # this page reached back to ``since``: nothing older is new
        end -= page
    return out


def _last_execution(spark: Any) -> int:
    """The id of the session's newest SQL execution (-1: none yet)."""
    store = _store(spark)
    count = store.executionsCount()
    return store.executionsList(count - 1, 1).apply(0).executionId() if count else -1


def _ran_since(spark: Any, before: int) -> list[str]:
    return [text for _, text in _executions(spark, before)]


_CREATE_TABLE = re.compile(r"Create\w*Table\w*Command")


#: A cdc table, a snapshot table (its history table) and a partitioned cdc table (its partitions).
DDL_KINDS = ["cdc", "snapshot", "partitioned"]


@pytest.mark.parametrize("kind", DDL_KINDS)
def test_an_unchanged_table_costs_no_ddl_and_a_changed_or_dropped_one_gets_it(
    kind: str, make_cfg, make_snapshot_cfg, runtime, spark
) -> None:
    """Counted by the engine that runs the DDL (the session's own execution log), not by the step's report."""
    if kind == "snapshot":
        cfg = make_snapshot_cfg()
    elif kind == "partitioned":
        cfg = make_cfg(columns=REGION_COLUMNS, partition_by={"column": "region"})
    else:
        cfg = make_cfg()
    before = _last_execution(spark)
    ensure_tables(runtime(cfg))
    created = _ran_since(spark, before)
    assert any(_CREATE_TABLE.search(s) for s in created), created

    before = _last_execution(spark)
    ensure_tables(runtime(cfg))
    assert _ran_since(spark, before) == [], "an unchanged table ran DDL"

    # A registry change (a new column) reaches every table: ADD COLUMNS and the new fingerprint.
    grown = cfg.model_copy(update={"columns": [*cfg.columns, cfg.columns[1].model_copy(update={"name": "email"})]})
    before = _last_execution(spark)
    ensure_tables(runtime(grown))
    ran = _ran_since(spark, before)
    assert any("AddColumns" in s for s in ran) and any("cdc.fingerprint" in s for s in ran), ran
    before = _last_execution(spark)
    ensure_tables(runtime(grown))
    assert _ran_since(spark, before) == [], "the changed table, once updated, ran DDL again"

    # A table dropped behind the step's back is created again.
    names = table_names(cfg)
    with connect(runtime(cfg).metastore) as ms:
        assert ms.drop_table(cfg.database, names["compactor_table"])
    before = _last_execution(spark)
    ensure_tables(runtime(grown))
    ran = _ran_since(spark, before)
    assert any(_CREATE_TABLE.search(s) and names["compactor_table"] in s for s in ran), ran
    with connect(runtime(cfg).metastore) as ms:
        assert ms.get_table(cfg.database, names["compactor_table"]) is not None
