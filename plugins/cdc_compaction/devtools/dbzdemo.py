"""``make demo SOURCE=debezium``: a real PostgreSQL table through the real Debezium into the real DAG.

1. starts the local Thrift metastore, the Debezium stack (:class:`~cdc_compaction.devtools.debezium.DebeziumStack`:
   PostgreSQL with ``pgoutput``, KRaft Kafka, a distributed Kafka Connect worker with Debezium's
   PostgreSQL connector) and, for the default engine ``spark_connect``, a Spark Connect server;
   creates ``students`` and registers the connector (its initial snapshot is the table's first rows);
   prepares a SQLite Airflow -- everything under ``.run/dbzdemo``;
2. hour by hour, changes the table (the SQL of ``make demo SOURCE=postgres``: inserts, updates, a key
   change, a delete, several updates of one row in one transaction, a rolled-back transaction), and
   lands the connector's records with our landing consumer (:mod:`cdc_compaction.devtools.kafka_landing`)
   as Debezium's raw envelope in JSON Lines (registry ``format: json``, ``envelope: debezium``);
3. runs the table's DAG (``airflow dags test``), and prints PostgreSQL's rows beside the Hive base
   table's and the view's;
4. stops everything it started, by PID, also when a step fails.
"""

from __future__ import annotations

import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from cdc_compaction.core import settings, sql
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.devtools.debezium import DebeziumStack, topic_of
from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db
from cdc_compaction.devtools.kafka_landing import LandingConsumer, Route
from cdc_compaction.devtools.local_services import LocalMetastore, SparkConnectServer, free_port
from cdc_compaction.devtools.pgdemo import COLUMNS, HOURS, _apply, _run_dag, _side_by_side

WORK = settings.PROJECT_ROOT / ".run" / "dbzdemo"
TABLE = "public.students"
#: The row each hour ends with: once the landing has it, it has the hour's changes.
MARK_ID = 1000
WAIT_S = 120.0


def registry_doc(lake: Path) -> dict[str, Any]:
    """The registry entry of ``dbzdemo.students``: PostgreSQL's columns plus what Debezium's envelope adds."""
    return {
        "database": "dbzdemo",
        "table": "students",
        "description": "students, from PostgreSQL through Debezium (raw envelope, JSON Lines)",
        "source": "debezium",
        "format": "json",
        "envelope": "debezium",
        "columns": [
            {"name": "id", "type": "int"},
            {"name": "full_name", "type": "string"},
            {"name": "grade", "type": "int"},
            {"name": "__op", "type": "string"},
            {"name": "__lsn", "type": "bigint"},
            {"name": "__deleted", "type": "string"},
        ],
        # The debezium preset orders by __lsn: every change has its own LSN.
        "primary_key": ["id"],
        "storage_root": str(lake / "students"),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "schedule": None,
        "retries": 0,
        "owner": "demo",
        "spark": {"conf": {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}},
    }


def _rows(spark: Any, cfg: TableConfig, what: str) -> list[tuple[Any, ...]]:
    names = sql.table_names(cfg)
    for t in ("base_table", "incremental_table"):
        spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
    query = f"SELECT {', '.join(COLUMNS)} FROM `{cfg.database}`.`{names[what]}` ORDER BY id"
    return [tuple(r) for r in spark.sql(query).collect()]


def _postgres_rows(conn: Any) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(COLUMNS)} FROM students ORDER BY id")
        rows = [tuple(r) for r in cur.fetchall()]
    conn.commit()
    return rows


def _land_hour(consumer: LandingConsumer, conn: Any, hour: int) -> int:
    """Write the hour's mark row, land until it is there, delete it again; the records landed."""
    import json

    with conn.cursor() as cur:
        cur.execute("INSERT INTO students VALUES (%s, 'mark', %s)", (MARK_ID + hour, hour))
        cur.execute("DELETE FROM students WHERE id = %s", (MARK_ID + hour,))
    conn.commit()
    landed = 0
    deadline = time.monotonic() + WAIT_S
    while True:
        seen = False
        for path in consumer.land(idle_s=0.5):
            lines = [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
            landed += len(lines)
            seen = seen or any(
                isinstance(v, dict) and ((v.get("payload") or v).get("before") or {}).get("id") == MARK_ID + hour
                for v in lines
            )
        if seen:
            return landed
        if time.monotonic() > deadline:
            raise SystemExit(f"the connector's records of hour {hour} did not land within {WAIT_S:.0f}s")


def main(engine: str = "spark_connect") -> int:
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.devtools.demo import ENGINES
    from cdc_compaction.integrations.engine import ConnectEngine, SessionEngine, local_session
    from cdc_compaction.pipeline.runtime import Runtime
    from cdc_compaction.pipeline.tables import ensure_tables
    from cdc_compaction.pipeline.views import refresh_view

    if engine not in ENGINES:
        raise SystemExit(f"demo: engine {engine!r} is not one of {', '.join(ENGINES)}")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    shutil.rmtree(WORK, ignore_errors=True)
    lake = WORK / "lake"
    ms = LocalMetastore(WORK / "metastore", port=free_port(), warehouse=lake / "warehouse")
    stack = DebeziumStack(WORK / "debezium")
    print(f"starting the Hive metastore on {ms.uri} ...")
    ms.start()
    spark = None
    server: SparkConnectServer | None = None
    consumer: LandingConsumer | None = None
    agree = True
    try:
        if engine == "spark_connect":
            server = SparkConnectServer(
                home=WORK / "connect",
                metastore_uri=ms.uri,
                warehouse_dir=str(lake / "warehouse"),
                port=free_port(),
                master="local[*]",
            )
            print(f"starting the Spark Connect server on {server.url} (the warm engine) ...")
            server.start()
        print("starting PostgreSQL (pgoutput), Kafka (KRaft) and Kafka Connect with Debezium ...")
        stack.start()
        conn = stack.pg.connect(stack.database)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE students (id int PRIMARY KEY, full_name text, grade int)")
        conn.commit()
        print("hour 0: the rows before the connector starts (its initial snapshot)")
        _apply(conn, HOURS[0])
        config = stack.register([TABLE])
        print(f"  connector {config['connector.class']} RUNNING (plugin.name={config['plugin.name']})")
        registry = WORK / "registry"
        registry.mkdir(parents=True)
        doc = registry_doc(lake)
        if server is not None:
            doc["spark"] = {"engine": engine, "conf": {"spark.sql.shuffle.partitions": "2"}}
        (registry / "dbzdemo.students.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        cfg = parse_table(doc)
        consumer = LandingConsumer(stack.bootstrap_servers, [Route.for_table(cfg, topic_of(TABLE))], "dbzdemo")
        env = airflow_env(
            WORK / "airflow",
            ms.uri,
            registry_dir=registry,
            warehouse_dir=lake / "warehouse",
            connect_port=server.port if server is not None else None,
        )
        print("preparing Airflow (SQLite under .run/dbzdemo/airflow) ...")
        ensure_airflow_db(env)
        endpoint = MetastoreEndpoint(ms.host, ms.port)
        if server is not None:
            from pyspark.sql import SparkSession

            spark = SparkSession.builder.remote(server.url).create()
            rt = Runtime(cfg, Lake(cfg), endpoint, ConnectEngine(server.url, cfg))
        else:
            spark = local_session(endpoint, str(lake / "warehouse"), "cdc-debezium-demo")
            rt = Runtime(cfg, Lake(cfg), endpoint, SessionEngine(spark))
        ensure_tables(rt)

        for h, transactions in enumerate(HOURS):
            if h:
                print(f"\nhour {h}: changes in PostgreSQL")
                _apply(conn, transactions)
            landed = _land_hour(consumer, conn, h)
            print(f"  landed {landed} Kafka records of {topic_of(TABLE)} as JSON Lines under {cfg.storage_root}")
            print("  running the table's DAG ...")
            _run_dag(env, cfg, WORK)
            refresh_view(rt)
            base, view = _rows(spark, cfg, "base_table"), _rows(spark, cfg, "view_name")
            agree = _side_by_side(_postgres_rows(conn), base, view, True) and agree
        conn.close()
        commit = Lake(cfg).latest_commit()
        stats = commit.stats
        print(
            f"\n{cfg.qualified_name}: commit {commit.seq}, lake under {lake}; the last run skipped "
            f"{stats.get('skipped_by_kind') or {}} (Kafka tombstones after deletes are counted, never rows)"
        )
    finally:
        if consumer is not None:
            consumer.close()
        if spark is not None:
            spark.stop()
        if server is not None:
            server.stop()
        stack.stop()
        ms.stop()
        print(
            "\nConnect, Kafka, PostgreSQL, the metastore"
            + (" and the Spark Connect server" if server else "")
            + " stopped."
        )
    print(f"demo finished in {time.monotonic() - started:.0f}s (engine {engine})")
    if not agree:
        print("the lake and PostgreSQL DISAGREE (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "spark_connect"))
