"""``make demo SOURCE=postgres``: a real PostgreSQL table as the CDC source of the real DAG.

1. starts the local Thrift metastore, a throwaway PostgreSQL (wal_level=logical,
   wal2json) and, for the default engine ``spark_connect``, a Spark Connect server;
   creates ``students`` and a logical replication slot, and prepares a SQLite Airflow
   -- everything under ``.run/pgdemo``;
2. hour by hour, changes the table (inserts, updates, a key change, a delete, several
   updates of one row in one transaction, a rolled-back transaction), reads the slot and
   lands the changes as Debezium-flattened Parquet (``cdc_compaction.devtools.pgsource``);
3. runs the table's DAG (``airflow dags test``: the compaction in the Connect server, or
   spark-submit with ``--engine spark_submit``), and prints PostgreSQL's rows beside the
   Hive base table's and the view's;
4. stops everything it started, by PID, also when a step fails.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from cdc_compaction.core import settings, sql
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.devtools import pgsource
from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db, last_run_timings
from cdc_compaction.devtools.local_services import LocalMetastore, LocalPostgres, SparkConnectServer, free_port

WORK = settings.PROJECT_ROOT / ".run" / "pgdemo"
SLOT = "cdc_demo"
TABLE = "public.students"
COLUMNS = ("id", "full_name", "grade")

#: Each hour: transactions of statements; a transaction whose first item is "ROLLBACK" is rolled back.
HOURS: list[list[list[str]]] = [
    [
        [
            "INSERT INTO students VALUES (1, 'Ada', 9), (2, 'Grace', 10), (3, 'Alan', 11), (4, 'Edsger', 12),"
            " (5, 'Barbara', 10)"
        ],
    ],
    [
        ["UPDATE students SET full_name = 'Grace Hopper' WHERE id = 2"],
        # Three changes to one row in one transaction: each has its own LSN, the last one wins.
        [
            "UPDATE students SET grade = 10 WHERE id = 1",
            "UPDATE students SET grade = 11 WHERE id = 1",
            "UPDATE students SET full_name = 'Ada Lovelace' WHERE id = 1",
        ],
        ["DELETE FROM students WHERE id = 3"],
        # A key change: Debezium lands a delete of 4 and a create of 40.
        ["UPDATE students SET id = 40 WHERE id = 4"],
        ["ROLLBACK", "DELETE FROM students", "INSERT INTO students VALUES (99, 'never', 0)"],
    ],
    [
        ["INSERT INTO students VALUES (3, 'Alan Turing', 12), (6, 'Donald', 9)"],
        ["UPDATE students SET grade = grade + 1 WHERE grade < 12"],
        ["DELETE FROM students WHERE id = 5", "INSERT INTO students VALUES (5, 'Barbara Liskov', 12)"],
    ],
]


def registry_doc(lake: Path) -> dict[str, Any]:
    """The registry entry of ``pgdemo.students``: PostgreSQL's columns plus op, ts_ms and lsn."""
    return {
        "database": "pgdemo",
        "table": "students",
        "description": "students, from a PostgreSQL logical replication slot (wal2json)",
        "columns": [
            {"name": "id", "type": "int"},
            {"name": "full_name", "type": "string"},
            {"name": "grade", "type": "int"},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "bigint"},
            {"name": "lsn", "type": "bigint"},
        ],
        "primary_key": ["id"],
        # Every change has its own LSN, even several of one row in one transaction.
        "order_by": ["lsn"],
        "storage_root": str(lake / "students"),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "schedule": None,
        "retries": 0,
        "owner": "demo",
        "spark": {"conf": {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}},
    }


def _apply(conn: Any, transactions: list[list[str]]) -> None:
    for statements in transactions:
        rollback = statements[0] == "ROLLBACK"
        with conn.cursor() as cur:
            for stmt in statements[1:] if rollback else statements:
                cur.execute(stmt)
                print(f"    {stmt}")
        if rollback:
            conn.rollback()
            print("    -- rolled back")
        else:
            conn.commit()


def _postgres_rows(conn: Any) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(COLUMNS)} FROM students ORDER BY id")
        rows = [tuple(r) for r in cur.fetchall()]
    conn.commit()
    return rows


def _hive_rows(spark: Any, cfg: TableConfig, what: str) -> list[tuple[Any, ...]]:
    names = sql.table_names(cfg)
    for t in ("base_table", "incremental_table"):
        spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
    where = " WHERE op <> 'd'" if what == "base_table" else ""
    query = f"SELECT {', '.join(COLUMNS)} FROM `{cfg.database}`.`{names[what]}`{where} ORDER BY id"
    return [tuple(r) for r in spark.sql(query).collect()]


def _side_by_side(
    pg: list[tuple[Any, ...]], base: list[tuple[Any, ...]], view: list[tuple[Any, ...]], compacted: bool
) -> bool:
    """Print the three row lists in columns; True if the view (and, once compacted, the base) equals PostgreSQL."""
    width = 28
    print(f"  {'PostgreSQL students':<{width}}{'Hive students_base (visible)':<{width + 4}}{'Hive students_view'}")
    for i in range(max(len(pg), len(base), len(view))):
        cells = [str(rows[i]) if i < len(rows) else "" for rows in (pg, base, view)]
        print(f"  {cells[0]:<{width}}{cells[1]:<{width + 4}}{cells[2]}")
    if compacted:
        same = sorted(pg) == sorted(base) == sorted(view)
        print(f"  -> {'base and view hold' if same else 'DIFFERENT rows from'} PostgreSQL's {len(pg)} rows")
    else:
        same = sorted(pg) == sorted(view)
        print(
            f"  -> the view {'holds' if same else 'DIFFERS from'} PostgreSQL's {len(pg)} rows;"
            " the base table still has the last compaction's"
        )
    return same


def _compare(conn: Any, spark: Any, cfg: TableConfig, *, compacted: bool = True) -> bool:
    """PostgreSQL's rows beside the base table's visible rows and the view's."""
    base, view = _hive_rows(spark, cfg, "base_table"), _hive_rows(spark, cfg, "view_name")
    return _side_by_side(_postgres_rows(conn), base, view, compacted)


def _run_dag(env: dict[str, str], cfg: TableConfig, work: Path = WORK) -> None:
    """``airflow dags test`` of the table's DAG; its output goes to ``<work>/dag-<dag id>.log``."""
    airflow = str(Path(sys.executable).parent / "airflow")
    start = time.monotonic()
    proc = subprocess.run([airflow, "dags", "test", cfg.dag_id], env=env, capture_output=True, text=True, check=False)
    log = work / f"dag-{cfg.dag_id}.log"
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"DAG {cfg.dag_id} failed; its output is in {log}")
    t = last_run_timings(Path(env["AIRFLOW_HOME"]), cfg.dag_id)
    steps = ", ".join(f"{x['task_id']} {x['seconds']}s" for x in t["tasks"])
    print(f"  {cfg.dag_id}: {t['state']} in {time.monotonic() - start:.0f}s ({steps})")


def main(engine: str = "spark_connect") -> int:
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.devtools.demo import ENGINES, _hour
    from cdc_compaction.integrations.engine import ConnectEngine, SessionEngine, local_session
    from cdc_compaction.pipeline.runtime import Runtime
    from cdc_compaction.pipeline.tables import ensure_tables
    from cdc_compaction.pipeline.views import refresh_view

    if engine not in ENGINES:
        raise SystemExit(f"demo: engine {engine!r} is not one of {', '.join(ENGINES)}")
    # SIGTERM ends the demo like Ctrl-C: the finally below stops the services it started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    shutil.rmtree(WORK, ignore_errors=True)
    lake = WORK / "lake"
    ms = LocalMetastore(WORK / "metastore", port=free_port(), warehouse=lake / "warehouse")
    pg = LocalPostgres(WORK / "postgres", port=free_port())
    print(f"starting the Hive metastore on {ms.uri} and PostgreSQL on 127.0.0.1:{pg.port} ...")
    ms.start()
    spark = None
    server: SparkConnectServer | None = None
    agree = True
    try:
        if engine == "spark_connect":
            # The warm engine on this demo's metastore and warehouse, loopback only, stopped by PID below.
            server = SparkConnectServer(
                home=WORK / "connect",
                metastore_uri=ms.uri,
                warehouse_dir=str(lake / "warehouse"),
                port=free_port(),
                master="local[*]",
            )
            print(f"starting the Spark Connect server on {server.url} (the warm engine) ...")
            server.start()
        pg.start()
        conn = pg.connect()
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE students (id int PRIMARY KEY, full_name text, grade int)")
        conn.commit()
        pgsource.create_slot(conn, SLOT)
        registry = WORK / "registry"
        registry.mkdir(parents=True)
        doc = registry_doc(lake)
        if server is not None:
            # The server's driver memory is its own: only the session conf a run may set.
            doc["spark"] = {"engine": engine, "conf": {"spark.sql.shuffle.partitions": "2"}}
        (registry / "pgdemo.students.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        cfg = parse_table(doc)
        env = airflow_env(
            WORK / "airflow",
            ms.uri,
            registry_dir=registry,
            warehouse_dir=lake / "warehouse",
            # The DAG run's spark_connect_default connection (AIRFLOW_CONN_SPARK_CONNECT_DEFAULT): this server.
            connect_port=server.port if server is not None else None,
        )
        print("preparing Airflow (SQLite under .run/pgdemo/airflow) ...")
        ensure_airflow_db(env)
        endpoint = MetastoreEndpoint(ms.host, ms.port)
        print(f"engine: {engine} (spark.engine of {cfg.qualified_name})")
        if server is not None:
            from pyspark.sql import SparkSession

            # The demo's own reads and DDL go through the server too: no JVM of its own.
            spark = SparkSession.builder.remote(server.url).create()
            rt = Runtime(cfg, Lake(cfg), endpoint, ConnectEngine(server.url, cfg))
        else:
            spark = local_session(endpoint, str(lake / "warehouse"), "cdc-pg-demo")
            rt = Runtime(cfg, Lake(cfg), endpoint, SessionEngine(spark))
        ensure_tables(rt)

        for h, transactions in enumerate(HOURS):
            increment = _hour(h)[0]
            print(f"\nhour {h}: changes in PostgreSQL")
            _apply(conn, transactions)
            changes = pgsource.read_changes(conn, SLOT, TABLE)
            rows = pgsource.debezium_rows(cfg, changes)
            pgsource.land_changes(cfg, increment, changes)
            ops = ", ".join(f"{r['op']}:{r['id']}" for r in rows)
            print(f"  landed {cfg.qualified_name}/{increment}: {len(rows)} events from the slot ({ops})")
            if h == 1:
                # Not compacted yet: the view already shows it (base + pending increment).
                refresh_view(rt)
                print("\n  before compacting hour 1, the view already shows PostgreSQL's rows:")
                agree = _compare(conn, spark, cfg, compacted=False) and agree
                continue
            print("  running the table's DAG ...")
            _run_dag(env, cfg)
            refresh_view(rt)
            agree = _compare(conn, spark, cfg) and agree
        pgsource.drop_slot(conn, SLOT)
        conn.close()
        commit = Lake(cfg).latest_commit()
        print(f"\n{cfg.qualified_name}: commit {commit.seq}, lake under {lake}")
    finally:
        if spark is not None:
            spark.stop()
        if server is not None:
            server.stop()
        pg.stop()
        ms.stop()
        print(
            "\nPostgreSQL, the metastore and the Spark Connect server stopped."
            if server
            else "\nPostgreSQL and the metastore stopped."
        )
    print(f"demo finished in {time.monotonic() - started:.0f}s (engine {engine})")
    if not agree:
        print("the lake and PostgreSQL DISAGREE (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "spark_connect"))
