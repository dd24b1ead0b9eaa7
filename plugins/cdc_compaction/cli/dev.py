"""The embedded default's short commands: ``conformance``, ``metastore|connect start|stop|status``, ``demo``,
``postgres check``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdc_compaction.core import settings


def _metastore(args: argparse.Namespace) -> int:
    from cdc_compaction.devtools.local_services import LocalMetastore

    ms = LocalMetastore(Path(args.home), port=args.port)
    return _service_action(
        ms, args.action, ms.uri, lambda pid: f"metastore {ms.uri} running (pid {pid}, home {ms.home})"
    )


def _service_action(service: Any, action: str, url: str, started: Callable[[int], str]) -> int:
    """start / stop / status of a local server (metastore, Spark Connect): status exits 3 when it is not running."""
    if action == "start":
        print(started(service.start()))
    elif action == "stop":
        print("stopped" if service.stop() else "not running")
    else:
        pid = service.pid()
        print(f"running (pid {pid}) at {url}" if pid else "not running")
        return 0 if pid else 3
    return 0


def _conformance(args: argparse.Namespace) -> int:
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.devtools import conformance as conf
    from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db
    from cdc_compaction.devtools.local_services import LocalMetastore, free_port
    from cdc_compaction.integrations.engine import local_session

    files = conf.expand(args.scenarios)
    if not files:
        print(f"no scenario files match {args.scenarios}", file=sys.stderr)
        return 2
    work = Path(args.work_dir).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ms = LocalMetastore(work / "metastore", port=free_port(), warehouse=work / "warehouse")
    ms.start()
    failed = 0
    try:
        endpoint = MetastoreEndpoint(ms.host, ms.port)
        spark = local_session(endpoint, str(work / "warehouse"), app_name="cdc-conformance")
        readers: list[conf.Reader | conf.DuckDBReader] = []
        for name in args.readers.split(","):
            if name.strip() == "spark":
                readers.append(conf.Reader(spark))
            elif name.strip() == "duckdb":
                readers.append(conf.DuckDBReader())
            else:
                print(f"unknown reader {name!r}: use spark, duckdb or both (spark,duckdb)", file=sys.stderr)
                return 2
        registry = work / "registry"
        if args.mode == "dag":
            env = airflow_env(work / "airflow", ms.uri, registry_dir=registry, warehouse_dir=work / "warehouse")
            ensure_airflow_db(env)
            runner: conf.InProcessRunner = conf.DagRunner(spark, endpoint, env)
        else:
            runner = conf.InProcessRunner(spark, endpoint)
        for f in files:
            scn = conf.Scenario.load(f)
            res = conf.run_scenario(scn, runner, readers, work / "lake", registry)
            print(f"{'PASS' if res.ok else 'FAIL'} {scn.name} [{args.mode}, {res.seconds:.1f}s]", flush=True)
            for line in res.failures:
                print("    " + line.replace("\n", "\n    "), flush=True)
            failed += not res.ok
        if isinstance(runner, conf.DagRunner) and args.timings:
            for t in runner.timings:
                tasks = ", ".join(f"{x['task_id']} {x['seconds']}s ({x['state']})" for x in t.get("tasks", []))
                print(f"    timing {t['dag_id']} {t.get('state')}: {tasks}")
        spark.stop()
    finally:
        ms.stop()
    print(f"{len(files) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _demo(args: argparse.Namespace) -> int:
    if args.source in ("postgres", "debezium"):
        from cdc_compaction.devtools.local_services import ServiceError, require_postgres

        try:
            require_postgres()
        except ServiceError as exc:
            print(exc, file=sys.stderr)
            return 1
    if args.source == "postgres":
        from cdc_compaction.devtools.pgdemo import main as pg_demo_main

        return pg_demo_main(args.engine)
    if args.source == "debezium":
        from cdc_compaction.devtools import jars
        from cdc_compaction.devtools.dbzdemo import main as dbz_demo_main

        if not jars.is_current(jars.jars_dir()):
            print(f"the jars of jars.lock are not in {jars.jars_dir()}: run `make jars` first", file=sys.stderr)
            return 1
        return dbz_demo_main(args.engine)
    from cdc_compaction.devtools.demo import main as demo_main

    return demo_main(args.engine)


def _postgres(args: argparse.Namespace) -> int:
    """``postgres check``: exit 1 with what to install when the server or wal2json is missing."""
    from cdc_compaction.devtools.local_services import ServiceError, require_postgres

    try:
        bin_dir = require_postgres()
    except ServiceError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"PostgreSQL server binaries in {bin_dir}, with wal2json")
    return 0


def _connect(args: argparse.Namespace) -> int:
    from cdc_compaction.devtools.devenv import connect_server

    server = connect_server(args.metastore, home=Path(args.home), port=args.port)
    if args.s3a and args.action == "start":
        server.with_s3a(args.s3a)
    return _service_action(
        server,
        args.action,
        server.url,
        lambda pid: (
            f"Spark Connect server {server.url} running (pid {pid}, home {server.home}, metastore {args.metastore})"
        ),
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``conformance``, ``metastore``, ``connect``, ``demo`` and ``postgres``, in this order (the --help's)."""
    cf = sub.add_parser("conformance", help="run scenario files through the pipeline")
    cf.add_argument("scenarios", nargs="+", help="scenario files, globs or directories")
    cf.add_argument("--mode", choices=["inprocess", "dag"], default="inprocess")
    cf.add_argument("--work-dir", default=str(settings.PROJECT_ROOT / ".run" / "conformance"))
    cf.add_argument("--timings", action="store_true", help="dag mode: print each DAG run's task durations")
    cf.add_argument(
        "--readers",
        default="spark,duckdb",
        help="who checks every expectation: spark (the metastore's tables and views), duckdb (the base location "
        "read with read_parquet and the DuckDB views), or both (default)",
    )
    cf.set_defaults(func=_conformance)

    ms = sub.add_parser("metastore", help="the local Thrift Hive metastore")
    ms.add_argument("action", choices=["start", "stop", "status"])
    ms.add_argument("--home", default=os.environ.get("CDC_METASTORE_HOME", str(settings.PROJECT_ROOT / ".metastore")))
    ms.add_argument("--port", type=int, default=int(os.environ.get("CDC_METASTORE_PORT", "9083")))
    ms.set_defaults(func=_metastore)

    cn = sub.add_parser("connect", help="the local Spark Connect server (spark.engine: spark_connect)")
    cn.add_argument("action", choices=["start", "stop", "status"])
    cn.add_argument("--home", default=os.environ.get("CDC_CONNECT_HOME", str(settings.PROJECT_ROOT / ".connect")))
    cn.add_argument("--port", type=int, default=int(os.environ.get("CDC_CONNECT_PORT", "15002")))
    cn.add_argument(
        "--metastore",
        default=os.environ.get("CDC_METASTORE_URI", "thrift://127.0.0.1:9083"),
        help="thrift://HOST:PORT of the metastore the server's catalog uses (default: the local one)",
    )
    cn.add_argument(
        "--s3a",
        metavar="CONN_ID",
        help="start it for lakes on S3: the Airflow connection CONN_ID's endpoint and region as the server's own "
        "fs.s3a.* settings, its credentials in the server's environment only (default: none)",
    )
    cn.set_defaults(func=_connect)

    demo = sub.add_parser("demo", help="land CDC files for two tables and compact them with the real DAGs")
    demo.add_argument(
        "--source",
        choices=["files", "postgres", "debezium"],
        default="files",
        help="files: generated change files (default); postgres: a real PostgreSQL table through wal2json; "
        "debezium: a real PostgreSQL table through Debezium, Kafka and Kafka Connect (after make jars)",
    )
    demo.add_argument(
        "--engine",
        choices=["spark_connect", "spark_submit"],
        default="spark_connect",
        help="spark.engine of the demo's tables: spark_connect (default; a warm Spark Connect server the demo "
        "starts beside its metastore) or spark_submit (one JVM per run)",
    )
    demo.set_defaults(func=_demo)

    pgc = sub.add_parser("postgres", help="the local PostgreSQL of the tests and the PostgreSQL demo")
    pgc.add_argument("action", choices=["check"])
    pgc.set_defaults(func=_postgres)
