"""The servers that run in the foreground until Ctrl-C: ``airflow-ui`` and ``serve-sql`` (both on 127.0.0.1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cdc_compaction.core import settings


def _airflow_ui(args: argparse.Namespace) -> int:
    """Airflow (api-server, scheduler, dag-processor, triggerer) on 127.0.0.1 with this project's DAGs.

    The metadata DB is PostgreSQL (SQLite takes one writer at a time: REST triggers failed with
    "Database error" next to the scheduler): the local server of the tests
    (:class:`~cdc_compaction.devtools.local_services.LocalPostgres`, started here if needed) or the
    database ``--sql-alchemy-conn`` names.  The scheduler starts only once the api-server answers
    (its tasks call the api-server's execution API).  No log server listens: the scheduler and
    triggerer run with ``--skip-serve-logs`` (Airflow binds it to every interface) and the
    api-server reads the task logs from their files on this machine.  Ctrl-C (or SIGTERM) stops
    every process this command started, by process group, within :data:`STOP_WITHIN_S`; the
    metastore and PostgreSQL too if it started them.
    """
    import secrets
    import signal
    import subprocess
    import time

    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.devtools.devenv import (
        airflow_env,
        connect_server,
        ensure_airflow_db,
        log_tail,
        wait_until_answers,
    )
    from cdc_compaction.devtools.local_services import LocalMetastore, LocalPostgres, port_open, stop_groups
    from cdc_compaction.operations.airflow_home import record_environment

    if args.reset_database:
        return _reset_database(Path(args.airflow_home), args.postgres_port)
    # SIGTERM (a closed terminal, a supervisor) ends it like Ctrl-C: the finally below stops the services.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started: LocalMetastore | None = None
    started_connect: Any = None
    started_pg: LocalPostgres | None = None
    procs: list[subprocess.Popen[bytes]] = []
    home = Path(args.airflow_home)
    try:
        if args.metastore:
            uri = args.metastore
        else:
            ms = LocalMetastore(Path(args.metastore_home), port=args.metastore_port)
            # Noted before it starts: a Ctrl-C while it comes up stops it too; one running already is left alone.
            if not (ms.pid() is not None and port_open(ms.host, ms.port)):
                started = ms
            ms.start()
            uri = ms.uri
        if args.connect:
            # The warm engine of tables with spark.engine: spark_connect, beside the metastore.
            server = connect_server(uri)
            if not (server.pid() is not None and port_open(server.host, server.port)):
                started_connect = server
            server.start()
        conn = args.sql_alchemy_conn
        if not conn:
            # Persistent: its data (runs, pause flags, the deployment's identity) outlives every stop.
            pg = LocalPostgres(home / "postgres", port=args.postgres_port, persistent=True)
            if not (pg.pid() is not None and port_open(pg.host, pg.port)):
                started_pg = pg
            pg.start()
            conn = _ui_database(pg)
        env = airflow_env(home, uri, sql_alchemy_conn=conn)
        base = f"http://127.0.0.1:{args.port}"
        env.update(
            {
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(args.port),
                "AIRFLOW__API__BASE_URL": base,
                # Tasks report to the api-server of this port, not Airflow's default localhost:8080.
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
                # One secret for every component: the api-server's tokens are checked by the others.
                "AIRFLOW__API_AUTH__JWT_SECRET": env.get("AIRFLOW__API_AUTH__JWT_SECRET") or secrets.token_hex(32),
                "AIRFLOW__API__SECRET_KEY": env.get("AIRFLOW__API__SECRET_KEY") or secrets.token_hex(16),
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS")
                or "admin:admin",
            }
        )
        # One API worker is plenty for one developer (Airflow's default of 4 costs a core's worth of start-up).
        env.setdefault("AIRFLOW__API__WORKERS", "1")
        # The LocalExecutor forks this many workers up front (Airflow's default, 32, is for a server).
        env.setdefault("AIRFLOW__CORE__PARALLELISM", "4")
        ensure_airflow_db(env)
        _record_conn(home, conn)
        # The connections and metastore of the components, for the operations commands of a shell
        # (operations/airflow_home.py): doctor then checks what the DAGs' tasks use.
        record_environment(home, env)
        airflow = str(Path(sys.executable).parent / "airflow")
        logs = home / "components"
        logs.mkdir(parents=True, exist_ok=True)

        def start(*cmd: str) -> subprocess.Popen[bytes]:
            # A process group of its own: a terminal's Ctrl-C reaches this command only, which stops the
            # groups itself (stop_groups), instead of every component racing its own shutdown.
            with (logs / f"{cmd[0]}.log").open("ab") as out:
                proc = subprocess.Popen(
                    [airflow, *cmd], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            procs.append(proc)
            return proc

        api = start("api-server", "--host", "127.0.0.1", "--port", str(args.port))
        print(f"starting the api-server on {base} (logs in {logs}) ...", flush=True)
        wait_until_answers(
            f"{base}/api/v2/monitor/health", api, timeout_s=args.start_timeout, log=logs / "api-server.log"
        )
        for cmd in (["scheduler", "--skip-serve-logs"], ["dag-processor"], ["triggerer", "--skip-serve-logs"]):
            start(*cmd)
        passwords = home / "simple_auth_manager_passwords.json.generated"
        print(f"Airflow UI on {base}: user admin, password in {passwords}; Ctrl-C stops it", flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(1)
        dead = next(p for p in procs if p.poll() is not None)
        name = str(dead.args[1])
        print(
            f"{name} exited ({dead.returncode}); the last lines of {logs / (name + '.log')}:\n"
            f"{log_tail(logs / (name + '.log'))}",
            file=sys.stderr,
        )
        return 1
    except CdcCompactionError as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        # A second Ctrl-C must not cut the shutdown short and leave processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if procs:
            print("stopping Airflow ...", flush=True)
            stop_groups(procs)
        if started_connect is not None:
            started_connect.stop()
        if started_pg is not None:
            started_pg.stop()
        if started is not None:
            started.stop()


def _reset_database(home: Path, port: int) -> int:
    """``airflow-ui --reset-database``: delete the local PostgreSQL's data (runs, pause flags, Variables).

    Refused while its server runs (the UI is up); only the data directories this home owns go
    (:meth:`~cdc_compaction.devtools.local_services.LocalPostgres.destroy`).
    """
    from cdc_compaction.devtools.local_services import LocalPostgres

    pg = LocalPostgres(home / "postgres", port=port, persistent=True)
    pid = pg.pid()
    if pid is not None:
        print(
            f"the local UI's PostgreSQL (pid {pid}, {pg.data_dir()}) is running: stop make airflow-ui first "
            "(Ctrl-C in its terminal), then reset again; nothing was deleted",
            file=sys.stderr,
        )
        return 1
    gone = pg.destroy()
    (home / ".db-migrated").unlink(missing_ok=True)
    if not gone:
        print(f"no database of the local UI under {home}: nothing to delete")
    for path in gone:
        print(f"deleted {path}")
    return 0


def _record_conn(home: Path, conn: str) -> None:
    """Write the metadata DB into ``home/airflow.cfg``: shells with ``AIRFLOW_HOME=home`` (``status``,
    ``pause``, ``airflow dags list``) then use it, not the SQLite default Airflow wrote there.

    Only the ``[database] sql_alchemy_conn`` line changes (the file's comments stay).
    """
    import re

    cfg = home / "airflow.cfg"
    try:
        text = cfg.read_text()
    except OSError:
        text = ""
    section = re.search(r"^\[database\]\s*$", text, flags=re.M)
    if section is None:
        cfg.write_text(text + f"\n[database]\nsql_alchemy_conn = {conn}\n")
        return
    head, body = text[: section.end()], text[section.end() :]
    line = re.compile(r"^sql_alchemy_conn\s*=.*$", flags=re.M)
    nxt = re.search(r"^\[", body, flags=re.M)
    own = body[: nxt.start()] if nxt else body
    if line.search(own):
        own = line.sub(lambda m: f"sql_alchemy_conn = {conn}", own, count=1)
    else:
        own = f"\nsql_alchemy_conn = {conn}" + own
    cfg.write_text(head + own + (body[nxt.start() :] if nxt else ""))


def _ui_database(pg: Any) -> str:
    """The ``airflow_ui`` database of the local PostgreSQL (created the first time): its SQLAlchemy URL."""
    conn = pg.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = 'airflow_ui'")
            exists = cur.fetchone() is not None
    finally:
        conn.close()
    return pg.url_for("airflow_ui") if exists else pg.create_database("airflow_ui")


def _serve_sql(args: argparse.Namespace) -> int:
    """Spark's Thrift JDBC/ODBC server over the metastore's tables, until Ctrl-C; then stop what was started."""
    import signal
    import time

    from cdc_compaction.devtools.local_services import (
        LocalMetastore,
        ServiceError,
        SparkThriftServer,
        port_open,
        pyspark_home,
    )

    # SIGTERM (a closed terminal, a supervisor) ends it like Ctrl-C: the finally below stops the services.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started: list[LocalMetastore | SparkThriftServer] = []
    try:
        if args.metastore:
            uri = args.metastore
        else:
            ms = LocalMetastore(Path(args.metastore_home), port=args.metastore_port)
            # Stop on the way out only what this command starts (listed before it starts: a Ctrl-C
            # while it comes up stops it too), not a metastore or server that was running already.
            if not (ms.pid() is not None and port_open(ms.host, ms.port)):
                started.append(ms)
            ms.start()
            uri = ms.uri
        server = SparkThriftServer(Path(args.home), uri, args.warehouse, port=args.port, master=args.master)
        if not (server.pid() is not None and port_open(server.host, server.port)):
            started.append(server)
        pid = server.start()
        print(f"Spark Thrift server (pid {pid}) over the metastore {uri}; Ctrl-C stops it", flush=True)
        print(f"JDBC URL: {server.jdbc_url}", flush=True)
        print(f"  beeline: {pyspark_home() / 'bin' / 'beeline'} -u {server.jdbc_url} -n $USER", flush=True)
        print(f"  log:     {server.log_file}", flush=True)
        while server.pid() is not None:
            time.sleep(1)
        print(f"the Thrift server exited; see {server.log_file}", file=sys.stderr)
        return 1
    except ServiceError as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for service in reversed(started):
            service.stop()


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``airflow-ui`` and ``serve-sql``."""
    ui = sub.add_parser("airflow-ui", help="run Airflow (UI, scheduler) with this project's DAGs")
    ui.add_argument("--port", type=int, default=8080, help="the UI's port on 127.0.0.1 (default 8080)")
    ui.add_argument(
        "--metastore", help="thrift://HOST:PORT of a running metastore (default: the local one, started if needed)"
    )
    ui.add_argument(
        "--metastore-home", default=str(settings.PROJECT_ROOT / ".metastore"), help="the local metastore's home"
    )
    ui.add_argument("--metastore-port", type=int, default=9083, help="the local metastore's port (default 9083)")
    ui.add_argument("--airflow-home", default=str(settings.PROJECT_ROOT / ".airflow"), help="AIRFLOW_HOME")
    ui.add_argument(
        "--sql-alchemy-conn",
        help="a PostgreSQL database for Airflow's metadata (postgresql+psycopg2://...; default: the local "
        "PostgreSQL under AIRFLOW_HOME/postgres, started if needed)",
    )
    ui.add_argument("--postgres-port", type=int, default=54329, help="the local PostgreSQL's port (default 54329)")
    ui.add_argument(
        "--reset-database",
        action="store_true",
        help="delete the local PostgreSQL's data (runs, pause flags, Variables) and exit; the UI must be stopped",
    )
    ui.add_argument(
        "--start-timeout", type=float, default=300.0, help="seconds to wait for the api-server to answer (default 300)"
    )
    ui.add_argument(
        "--no-connect",
        dest="connect",
        action="store_false",
        help="do not start the local Spark Connect server (only tables with spark.engine: spark_connect need it)",
    )
    ui.set_defaults(func=_airflow_ui)

    sq = sub.add_parser("serve-sql", help="Spark's Thrift JDBC/ODBC server for BI clients (beeline, DBeaver, ...)")
    sq.add_argument("--port", type=int, default=10000, help="the JDBC port on 127.0.0.1 (default 10000)")
    sq.add_argument(
        "--metastore", help="thrift://HOST:PORT of a running metastore (default: the local one, started if needed)"
    )
    sq.add_argument(
        "--metastore-home", default=str(settings.PROJECT_ROOT / ".metastore"), help="the local metastore's home"
    )
    sq.add_argument("--metastore-port", type=int, default=9083, help="the local metastore's port (default 9083)")
    sq.add_argument(
        "--warehouse", default=str(settings.PROJECT_ROOT / ".lake" / "warehouse"), help="Spark's warehouse directory"
    )
    sq.add_argument("--master", default="local[*]", help="the server's Spark master (default local[*])")
    sq.add_argument("--home", default=str(settings.PROJECT_ROOT / ".run" / "thrift-server"), help="pid file and log")
    sq.set_defaults(func=_serve_sql)
