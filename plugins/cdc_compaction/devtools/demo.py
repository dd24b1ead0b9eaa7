"""``make demo``: two tables, a few hours of Debezium-style change files, the real DAGs.

1. starts the local Thrift metastore and, for the default engine ``spark_connect``, a
   Spark Connect server beside it (both from the pyspark wheel, on 127.0.0.1), and
   prepares a SQLite Airflow under ``.airflow``;
2. lands change files for ``school.student`` and ``shop.orders`` (composite key,
   reserved-word columns, decimals, ordered by lsn, one refused row);
3. runs both tables' DAGs at the same time (``airflow dags test``: ensure tables,
   plan, compaction in the warm Connect server -- or one spark-submit per run with
   ``--engine spark_submit`` --, validate, publish, archive, refresh view);
4. lands more hours, including a late event that must lose, shows the view
   (base + pending increments) before compaction, and compacts again;
5. prints the base tables and views, and where every file went; stops the services
   it started by their PIDs, also when a step fails.

The engine is the registry's ``spark.engine``: the demo runs the tables of
``include/registry`` from a copy under ``.run/demo/registry`` with ``spark.engine`` set
to the chosen one (the registry itself defaults to ``spark_submit``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from cdc_compaction.core import settings, sql
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig, load_table
from cdc_compaction.devtools.conformance import land
from cdc_compaction.devtools.devenv import airflow_env, connect_server, ensure_airflow_db, last_run_timings
from cdc_compaction.devtools.local_services import LocalMetastore, free_port, port_open
from cdc_compaction.pipeline.quarantine import Quarantine

ROOT = settings.PROJECT_ROOT
TABLES = ["school.student", "shop.orders"]
#: The demo's engines (registry ``spark.engine``), its default first: the warm Spark Connect server.
ENGINES = ("spark_connect", "spark_submit")
#: Port of the demo's Spark Connect server when it is free (Spark's default), else any free one.
CONNECT_PORT = 15002


def demo_registry(engine: str, target: Path) -> Path:
    """A copy of the demo tables' registry files in ``target`` with ``spark.engine: engine``; returns ``target``.

    The DAG file reads the registry directory ``CDC_REGISTRY_DIR`` names, so the engine is set
    where every DAG run and task reads it. Everything else is the registry's own text.
    """
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in TABLES:
        src = settings.registry_dir() / f"{name}.yaml"
        doc = yaml.safe_load(src.read_text())
        doc.setdefault("spark", {})["engine"] = engine
        (target / src.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


def _hour(h: int) -> tuple[str, datetime]:
    """Increment name and time of an hour h hours after 'six hours ago' (all in the past)."""
    start = (datetime.now(UTC) - timedelta(hours=6)).replace(minute=0, second=0, microsecond=0)
    t = start + timedelta(hours=h)
    return f"increment_{t:%Y%m%d%H}", t


def _land(cfg: TableConfig, h: int, files: list[list[dict[str, Any]]]) -> None:
    name, t = _hour(h)
    for path in land(cfg, name, files):
        # The sink wrote these during that hour: date them so, like a real landing area.
        stamp = (t + timedelta(minutes=50)).timestamp()
        os.utime(path, (stamp, stamp))
    print(f"  landed {cfg.qualified_name}/{name}: {sum(len(f) for f in files)} events in {len(files)} file(s)")


def _ms(h: int, minute: int) -> int:
    return int((_hour(h)[1] + timedelta(minutes=minute)).timestamp() * 1000)


def student_events(h: int) -> list[list[dict[str, Any]]]:
    def ev(i: int, name: str | None, op: str, minute: int) -> dict[str, Any]:
        return {"id": i, "full_name": name, "op": op, "ts_ms": _ms(h, minute)}

    return {
        0: [[ev(i, n, "r", 1) for i, n in enumerate(["Ada", "Grace", "Alan", "Edsger", "Barbara"], 1)]],
        1: [[ev(2, "Grace Hopper", "u", 10), ev(3, None, "d", 20)], [ev(6, "Donald", "c", 30)]],
        2: [[ev(3, "Alan Turing", "c", 5), ev(5, "Barbara Liskov", "u", 15)]],
        # Late: an update of id 2 from hour 0, delivered now. The newer hour-1 update must win.
        3: [[{"id": 2, "full_name": "Grace (stale)", "op": "u", "ts_ms": _ms(0, 30)}, ev(4, None, "d", 40)]],
    }[h]


def orders_events(h: int) -> list[list[dict[str, Any]]]:
    def ev(tenant: str | None, no: int, amount: str, status: str, op: str, minute: int, lsn: int) -> dict[str, Any]:
        t = (_hour(h)[1] + timedelta(minutes=minute)).isoformat()
        return {
            "tenant": tenant,
            "order_no": no,
            "amount": amount,
            "status": status,
            "timestamp": t,
            "order": no % 7,
            "op": op,
            "ts_ms": _ms(h, minute),
            "lsn": lsn,
        }

    return {
        0: [[ev("acme", 1, "10.50", "new", "c", 5, 100), ev("acme", 2, "99.99", "new", "c", 6, 101)]],
        1: [
            [
                ev("globex", 1, "5.00", "new", "c", 1, 200),
                # The same ts_ms, but the table orders by lsn: the later lsn (paid) wins, whatever the file order.
                ev("acme", 1, "10.50", "paid", "u", 20, 203),
                ev("acme", 1, "10.50", "cancelled", "u", 20, 202),
                # A row without its key: refused, kept in quarantine, counted.
                ev(None, 9, "1.00", "new", "c", 21, 204),
            ]
        ],
        2: [[ev("acme", 2, "0.00", "deleted", "d", 3, 300), ev("globex", 2, "42.00", "new", "c", 4, 301)]],
        3: [[ev("globex", 1, "5.00", "shipped", "u", 30, 400)]],
    }[h]


def _run_dag(env: dict[str, str], cfg: TableConfig) -> dict[str, Any]:
    airflow = str(Path(sys.executable).parent / "airflow")
    start = time.monotonic()
    proc = subprocess.run([airflow, "dags", "test", cfg.dag_id], env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    log = Path(env["AIRFLOW_HOME"]) / f"demo-{cfg.dag_id}.log"
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"DAG {cfg.dag_id} failed; its output is in {log}")
    timings = last_run_timings(Path(env["AIRFLOW_HOME"]), cfg.dag_id, env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"))
    timings["wall_seconds"] = round(took, 1)
    return timings


def _run_all(env: dict[str, str], cfgs: list[TableConfig]) -> None:
    # Two tables' DAGs at the same time, sharing the metastore.  Each `dags test` writes
    # every DAG of the file to the metadata DB: serialize them once first, so two
    # processes do not race to insert the same rows into SQLite.
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "dags", "reserialize"], env=env, capture_output=True, check=True)
    with ThreadPoolExecutor(max_workers=len(cfgs)) as pool:
        for t in pool.map(lambda c: _run_dag(env, c), cfgs):
            steps = ", ".join(f"{x['task_id']} {x['seconds']}s" for x in t["tasks"])
            print(f"  {t['dag_id']}: {t['state']} in {t['wall_seconds']}s ({steps})")


def _show(spark: Any, cfg: TableConfig) -> None:
    names = sql.table_names(cfg)
    for t in ("base_table", "tombstones_table", "incremental_table"):
        spark.catalog.refreshTable(f"`{cfg.database}`.`{names[t]}`")
    keys = ", ".join(f"`{k}`" for k in cfg.primary_key)
    print(f"\n{cfg.database}.{names['base_table']} (compacted: the live rows, as any engine reads them):")
    spark.sql(f"SELECT * FROM `{cfg.database}`.`{names['base_table']}` ORDER BY {keys}").show(truncate=False)
    print(f"{cfg.database}.{names['tombstones_table']} (deleted keys, kept for tombstone_retention):")
    spark.sql(f"SELECT * FROM `{cfg.database}`.`{names['tombstones_table']}` ORDER BY {keys}").show(truncate=False)
    print(f"{cfg.database}.{names['view_name']} (what readers see):")
    spark.sql(f"SELECT * FROM `{cfg.database}`.`{names['view_name']}` ORDER BY {keys}").show(truncate=False)


def _where(cfg: TableConfig) -> None:
    lake = Lake(cfg)
    lay = lake.layout
    commit = lake.latest_commit()
    print(f"{cfg.qualified_name}: commit {commit.seq}, live version {lay.data_dir(commit.version, commit.layout)}")
    print(f"  pointer:    {lay.pointer} -> {json.loads(Path(lay.pointer).read_text())['version']}")
    print(f"  archive:    {lay.archive} ({sum(1 for _ in Path(lay.archive).rglob('*.parquet'))} files)")
    entries = Quarantine(lake).entries()
    print(f"  quarantine: {lay.quarantine} ({len(entries)} entries; cdc-compaction quarantine list ...)")
    for e in entries:
        print(f"    {e.line()}")
    print(f"  pending:    {lay.incremental} ({sum(1 for _ in Path(lay.incremental).rglob('*.parquet'))} files)")
    print(f"  last run:   {json.dumps({k: v for k, v in commit.stats.items() if k != 'finished_at'})}")


def _readers(cfg: TableConfig) -> None:
    """The same table as DuckDB reads it: the base location from the pointer, and the DuckDB views."""
    import duckdb

    lake = Lake(cfg)
    pointer = lake.read_pointer() or {}
    locations = list((pointer.get("partitions") or {}).values()) or [pointer.get("location", "")]
    cols = ", ".join(f'"{c}"' for c in cfg.column_names if c != cfg.op_column)
    keys = ", ".join(f'"{k}"' for k in cfg.primary_key)
    target = str(cfg.views.duckdb)
    with duckdb.connect(target if target.endswith((".duckdb", ".db")) else ":memory:", read_only=False) as con:
        con.execute("SET TimeZone = 'UTC'")
        globs = [f"{loc}/*.parquet" for loc in locations]
        print(f"DuckDB, SELECT {cols} FROM read_parquet({globs}) -- the base location, a plain glob:")
        print(con.sql(f"SELECT {cols} FROM read_parquet(?) ORDER BY {keys}", params=[globs]))
        if target.endswith(".sql"):
            con.execute(Path(settings.resolve_storage_root(target)).read_text())
        view = f'"{cfg.database}"."{sql.table_names(cfg)["view_name"]}"'
        print(f"DuckDB, SELECT * FROM {view} (views from {target}):")
        print(con.sql(f"SELECT {cols} FROM {view} ORDER BY {keys}"))


def _freshness(spark: Any, cfg: TableConfig) -> None:
    names = sql.table_names(cfg)
    for t in ("base_table", "view_name"):
        rows = spark.sql(f"SHOW TBLPROPERTIES `{cfg.database}`.`{names[t]}`").collect()
        props = {r["key"]: r["value"] for r in rows if r["key"].startswith("cdc.freshness.")}
        print(f"  {cfg.database}.{names[t]}: " + ", ".join(f"{k}={v}" for k, v in sorted(props.items())))


def _reader_session(engine: str, connect_url: str | None, ms: LocalMetastore) -> Any:
    """The demo's own Spark for its reads and view refreshes: the Connect server's, or a local one.

    With ``spark_connect`` the demo starts no JVM of its own either: it reads through the server.
    """
    if engine == "spark_connect" and connect_url is not None:
        from pyspark.sql import SparkSession

        return SparkSession.builder.remote(connect_url).create()
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.integrations.engine import local_session

    return local_session(MetastoreEndpoint(ms.host, ms.port), str(ROOT / ".lake" / "warehouse"), "cdc-demo")


def main(engine: str = ENGINES[0]) -> int:
    if engine not in ENGINES:
        raise SystemExit(f"demo: engine {engine!r} is not one of {', '.join(ENGINES)}; pass --engine (ENGINE=) again")
    # SIGTERM ends the demo like Ctrl-C: the finally below stops the services it started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    for d in (ROOT / ".lake", ROOT / ".metastore"):
        shutil.rmtree(d, ignore_errors=True)
    port = 9083 if not port_open("127.0.0.1", 9083) else free_port()
    ms = LocalMetastore(ROOT / ".metastore", port=port, warehouse=ROOT / ".lake" / "warehouse")
    server: Any = None
    spark: Any = None
    print(f"starting the Hive metastore on {ms.uri} ...")
    ms.start()
    try:
        if engine == "spark_connect":
            # A home of the demo's own: a server `make connect-start` runs (.connect/) is left alone.
            cport = CONNECT_PORT if not port_open("127.0.0.1", CONNECT_PORT) else free_port()
            server = connect_server(ms.uri, home=ROOT / ".run" / "demo" / "connect", port=cport)
            print(f"starting the Spark Connect server on {server.url} (the warm engine; log {server.log_file}) ...")
            t0 = time.monotonic()
            server.start()
            print(f"  up in {time.monotonic() - t0:.0f}s")
        registry = demo_registry(engine, ROOT / ".run" / "demo" / "registry")
        env = airflow_env(
            ROOT / ".airflow",
            ms.uri,
            registry_dir=registry,
            warehouse_dir=ROOT / ".lake" / "warehouse",
            # The DAG runs' spark_connect_default connection (AIRFLOW_CONN_SPARK_CONNECT_DEFAULT): this server.
            connect_port=server.port if server is not None else None,
        )
        print("preparing Airflow (SQLite under .airflow) ...")
        ensure_airflow_db(env)
        cfgs = [load_table(registry, t) for t in TABLES]
        student, orders = cfgs
        how = f"in the Spark Connect server {server.url}" if server is not None else "one spark-submit JVM per run"
        print(f"engine: {engine} (spark.engine of {', '.join(TABLES)}; the compaction runs {how})")

        print("\nhours 0-1 land:")
        for h in (0, 1):
            _land(student, h, student_events(h))
            _land(orders, h, orders_events(h))
        print(f"running both DAGs at once (engine {engine}) ...")
        _run_all(env, cfgs)

        print("\nhours 2-3 land (with a late update for student 2 from hour 0):")
        for h in (2, 3):
            _land(student, h, student_events(h))
            _land(orders, h, orders_events(h))

        from cdc_compaction.core.settings import MetastoreEndpoint
        from cdc_compaction.integrations.engine import ConnectEngine, SessionEngine
        from cdc_compaction.pipeline.runtime import Runtime
        from cdc_compaction.pipeline.views import refresh_pending, refresh_view

        spark = _reader_session(engine, server.url if server is not None else None, ms)
        endpoint = MetastoreEndpoint(ms.host, ms.port)

        def runtime(cfg: TableConfig) -> Runtime:
            eng: Any = ConnectEngine(server.url, cfg) if server is not None else SessionEngine(spark)
            return Runtime(cfg, Lake(cfg), endpoint, eng)

        for cfg in cfgs:
            refresh_view(runtime(cfg))
        print("\nbefore the second compaction, the view already shows the pending hours:")
        _show(spark, student)

        print(f"running both DAGs again (engine {engine}) ...")
        _run_all(env, cfgs)
        print("\nafter the second compaction:")
        for cfg in cfgs:
            _show(spark, cfg)
        print("where the files went:")
        for cfg in cfgs:
            _where(cfg)
        print("\nthe same tables read by DuckDB (no metastore):")
        for cfg in cfgs:
            _readers(cfg)

        print("\nfreshness after the second compaction (table properties):")
        _freshness(spark, student)
        print("hour 4 lands; the view refresher (DAG cdc__views_refresh, every 5 minutes) shows it, no compaction:")
        _land(student, 4, [[{"id": 4, "full_name": "Dora", "op": "c", "ts_ms": _ms(4, 5)}]])
        print(f"  refresh_pending: {json.dumps(refresh_pending(runtime(student))['freshness'])}")
        _freshness(spark, student)
        _show(spark, student)
    finally:
        if spark is not None:
            spark.stop()
        if server is not None:
            server.stop()
            print("\nSpark Connect server stopped.")
        ms.stop()
        print("metastore stopped." if server is not None else "\nmetastore stopped.")
    print(f"demo finished in {time.monotonic() - started:.0f}s (engine {engine})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ENGINES[0]))
