"""Command line: ``cdc-compaction <command>`` (``make install`` puts it in .venv; or ``python -m cdc_compaction``).

Commands:
  registry validate [--dir DIR]          check every registry file; exit 1 on any error
  registry discover ROOT --database DB   write a registry entry per table directory of a landing root
  registry schema [--out FILE]           the registry's JSON Schema (editors; registry.schema.json)
  conformance --mode inprocess|dag GLOB  run scenario files through the pipeline
  metastore start|stop|status            the local Thrift metastore of the embedded default
  connect start|stop|status              the local Spark Connect server (registry spark.engine: spark_connect)
  demo [--source files|postgres] [--engine spark_connect|spark_submit]
                                         the embedded default end to end (make demo [SOURCE=postgres] [ENGINE=...])
  postgres check                         are PostgreSQL's server and wal2json installed? (make test)
  airflow-ui                             Airflow with this project's DAGs on 127.0.0.1:8080
  serve-sql [--port N]                   Spark's Thrift JDBC/ODBC server for BI clients on 127.0.0.1:10000
  quarantine list|reingest DB.TABLE      refused rows and files: reasons, and putting them back after a fix
  lease show|break DB.TABLE              who compacts a table right now; give up a dead run's lease
  versions DB.TABLE [--json]             the kept versions: commit, time, rows, location
  changes DB.TABLE --from N --to M       net changes between two kept versions (--format table|json|parquet)
  rollback DB.TABLE --to N [--yes]       publish kept version N's rows as a new commit
  index verify|rebuild DB.TABLE          check the live key index (partition_by) against the data; write it anew
  status [DB.TABLE ...] [--json]         each table's live version, last commit, freshness, pending, quarantine
  step STEP DB.TABLE [--force]           run one step of a table's DAG by hand (outside Airflow; plan --force:
                                         compact regardless of compaction.policy)
  pause|resume DB.TABLE                  Airflow's pause flag of the table's DAG (its metadata database)
  delete DB.TABLE [--drop-data] [--yes]  remove a table's pipeline: registry file aside, metastore objects dropped
  doctor [DB.TABLE ...]                  check registry, metastore, storage, Spark, SMTP and landed files
  job-package [--out DIR]                build the Spark job's zip (spark-submit --py-files); print its path
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdc_compaction.core import settings
from cdc_compaction.pipeline.order import STEP_IDS


def _registry_validate(args: argparse.Namespace) -> int:
    from cdc_compaction.core.registry import load_registry, registry_files

    directory = Path(args.dir or settings.registry_dir())
    if not registry_files(directory):
        print(f"no registry files (*.yaml) in {directory}", file=sys.stderr)
        return 1
    from cdc_compaction.core.mode import mode_of
    from cdc_compaction.integrations.engine import check_jars, spark_hadoop_version

    hadoop = spark_hadoop_version()
    bad = 0
    from cdc_compaction.core.registry import load_database_defaults

    for db, d in sorted(load_database_defaults(directory).items()):
        if d.error is None:
            print(f"OK    {d.path.relative_to(directory)}: defaults of database {db}")
        else:
            print(f"ERROR {d.path.relative_to(directory)} (defaults of database {db}, so of every table of it):")
            for p in d.error.lines():
                print(f"        {p}")
    for e in load_registry(directory):
        if e.error is None:
            print(f"OK    {e.path.name}: {e.config.qualified_name} -> DAG {e.dag_id}")
            # A warning, not an error: a cluster's Spark may differ from the one installed here.
            for problem in [*check_jars(e.config, hadoop), *mode_of(e.config).warnings(e.config)]:
                print(f"WARN  {problem}")
        else:
            bad += 1
            print(f"ERROR {e.path.name}:")
            for p in e.error.lines():
                print(f"        {p}")
    print(f"{bad} invalid of {len(load_registry(directory))} registry files in {directory}")
    return 1 if bad else 0


def _registry_schema(args: argparse.Namespace) -> int:
    from cdc_compaction.core.registry_schema import schema_text

    text = schema_text()
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        sys.stdout.write(text)
    return 0


def _registry_discover(args: argparse.Namespace) -> int:
    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.operations.discover import Options, discover, parse_hints

    try:
        opts = Options(
            landing_root=args.landing_root,
            database=args.database,
            out=Path(args.out or settings.registry_dir()),
            include=args.include,
            exclude=args.exclude,
            keys=parse_hints(args.key, "--key"),
            order_by=parse_hints(args.order_by, "--order-by"),
            source=args.source,
            force=args.force,
            conn_id=args.conn_id,
            max_files=args.max_files,
            postgres_dsn=args.postgres_dsn,
            postgres_conn_id=args.postgres_conn_id,
            postgres_schema=args.postgres_schema,
        )
        report = discover(opts)
    except (ValueError, CdcCompactionError) as exc:
        print(f"registry discover: {exc}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    return 0


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
    if args.source == "postgres":
        from cdc_compaction.devtools.local_services import ServiceError, require_postgres

        try:
            require_postgres()
        except ServiceError as exc:
            print(exc, file=sys.stderr)
            return 1
        from cdc_compaction.devtools.pgdemo import main as pg_demo_main

        return pg_demo_main(args.engine)
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
    return _service_action(
        server,
        args.action,
        server.url,
        lambda pid: (
            f"Spark Connect server {server.url} running (pid {pid}, home {server.home}, metastore {args.metastore})"
        ),
    )


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
    from cdc_compaction.devtools.devenv import airflow_env, connect_server, ensure_airflow_db, wait_until_answers
    from cdc_compaction.devtools.local_services import LocalMetastore, LocalPostgres, port_open, stop_groups

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
            pg = LocalPostgres(home / "postgres", port=args.postgres_port)
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
        wait_until_answers(f"{base}/api/v2/monitor/health", api, timeout_s=args.start_timeout)
        for cmd in (["scheduler", "--skip-serve-logs"], ["dag-processor"], ["triggerer", "--skip-serve-logs"]):
            start(*cmd)
        passwords = home / "simple_auth_manager_passwords.json.generated"
        print(f"Airflow UI on {base}: user admin, password in {passwords}; Ctrl-C stops it", flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(1)
        dead = next(p for p in procs if p.poll() is not None)
        print(f"{' '.join(map(str, dead.args[1:2]))} exited ({dead.returncode}); see {logs}", file=sys.stderr)
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


def _table(args: argparse.Namespace) -> Any:
    from cdc_compaction.core.exceptions import RegistryError
    from cdc_compaction.core.registry import load_registry

    directory = Path(args.registry_dir or settings.registry_dir())
    for e in load_registry(directory):
        if e.error is None and e.config.qualified_name == args.table:
            return e.config
        if e.error is not None and e.path.name.startswith(f"{args.table}."):
            raise e.error
    raise RegistryError(str(directory), args.table, [f"no valid registry entry for table {args.table}"])


def _status(args: argparse.Namespace) -> int:
    """One line (or a JSON object) per table: where it stands, read from its lake and Airflow."""
    from datetime import UTC, datetime

    from cdc_compaction.core.registry import load_registry, registry_files
    from cdc_compaction.operations.status import read_airflow, registry_error_status, table_status, to_json

    directory = Path(args.registry_dir or settings.registry_dir())
    if not directory.is_dir() or not registry_files(directory):
        # Nothing to show is not a healthy "all fine": say where it looked and how to point it elsewhere.
        where = "does not exist" if not directory.exists() else "holds no registry files (*.yaml)"
        print(
            f"status: the registry directory {directory.resolve()} {where}; point at your registry with "
            "--registry-dir DIR or $CDC_REGISTRY_DIR (default: include/registry of the project)",
            file=sys.stderr,
        )
        return 2
    entries = load_registry(directory)
    wanted = set(args.tables)
    configs = [e.config for e in entries if e.error is None and (not wanted or e.config.qualified_name in wanted)]
    broken = [e for e in entries if e.error is not None and (not wanted or e.path.stem in wanted)]
    unknown = sorted(wanted - {c.qualified_name for c in configs} - {e.path.stem for e in broken})
    if unknown:
        print(
            f"no registry entry for {', '.join(unknown)} in {directory}: name tables as DATABASE.TABLE "
            "(`registry validate` lists them)",
            file=sys.stderr,
        )
        return 2
    now = datetime.now(UTC)
    view = read_airflow()
    result = [table_status(c, now, airflow=view) for c in configs if c is not None]
    bad = [registry_error_status(e, view) for e in broken]
    if args.json:
        print(to_json(result + bad))
    else:
        for st in result:
            print(st.line())
        for st in bad:
            print(
                f"{st.table:<28} ERROR {st.error} (fix the file; `registry validate`)  "
                f"last run {st.last_run_text}  {st.paused_text}"
            )
    return 1 if broken or any(st.error for st in result) else 0


def _quarantine(args: argparse.Namespace) -> int:
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.pipeline.quarantine import Quarantine

    q = Quarantine(Lake(_table(args)))
    if args.action == "list":
        entries = q.entries()
        for e in entries:
            print(e.line())
        print(f"{len(entries)} quarantine entries of {args.table} under {q.root}")
        return 0
    for path in q.reingest(args.entry, source=args.source, force=args.force):
        print(f"landed {path}")
    print(f"{args.entry} re-ingested; the table's next run compacts it")
    return 0


def _erase(args: argparse.Namespace) -> int:
    """Erase rows by predicate everywhere the table keeps them (README, "Erasing personal data")."""
    import json

    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.operations import erase

    cfg = _table(args)
    try:
        if args.verify:
            found = erase.verify(Lake(cfg), erase.parse_predicate(cfg, args.where))
            print(json.dumps(found, indent=1, sort_keys=True))
            if found["matching"] or found["naming"] or found["unhandled"]:
                print(
                    f"{cfg.qualified_name}: {len(found['matching'])} files still hold rows matching {args.where!r}, "
                    f"{len(found['naming'])} paths or records still name an erased value, {len(found['unhandled'])} "
                    "files are neither Parquet nor records of the lake; run the erase with --yes (it refuses "
                    "while unhandled files remain: move or convert them first)",
                    file=sys.stderr,
                )
                return 1
            return 0
        if not args.yes:
            print(json.dumps(erase.preview(cfg, args.where), indent=1))
            print("nothing was changed; run again with --yes to erase these rows")
            return 0
        audit = erase.erase(cfg, args.where, actor=args.actor)
    except CdcCompactionError as exc:
        print(f"erase refused or failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(audit, indent=1, sort_keys=True))
    return 0


def _lease(args: argparse.Namespace) -> int:
    from cdc_compaction.core.lake import Lake, TableLease

    lease = TableLease(Lake(_table(args)))
    held = lease.current()
    if args.action == "show":
        print("no lease taken yet" if held is None else held.describe() + (" (released)" if held.released else ""))
        return 0
    broken = lease.break_(by=f"cli:{os.environ.get('USER', 'unknown')}")
    print(f"broke {broken.describe()}" if broken else "nothing to break: the lease is free")
    return 0


def _versions(args: argparse.Namespace) -> int:
    import json

    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.operations.travel import kept_versions

    try:
        versions = kept_versions(Lake(_table(args)))
    except CdcCompactionError as exc:
        print(f"versions: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([v.to_dict() for v in versions], indent=1))
        return 0
    print(f"{'commit':>6}  {'committed_at':<32}  {'rows':>10}  version  location")
    for v in versions:
        print(v.line())
    return 0


def _changes(args: argparse.Namespace) -> int:
    """The net changes between two kept versions, to stdout (table, JSON lines) or a Parquet file."""
    import json

    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.operations.travel import change_feed, render_table

    if args.format == "parquet" and not args.out:
        print("changes: --format parquet needs --out FILE", file=sys.stderr)
        return 2
    try:
        feed = change_feed(Lake(_table(args)), args.from_seq, args.to_seq)
    except CdcCompactionError as exc:
        print(f"changes: {exc}", file=sys.stderr)
        return 1
    if args.format == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(feed, args.out)
        print(f"wrote {feed.num_rows} change rows to {args.out}")
        return 0
    if args.format == "json":
        text = "\n".join(json.dumps(r, default=str, sort_keys=True) for r in feed.to_pylist())
    else:
        text = render_table(feed) + f"\n({feed.num_rows} change rows, versions {args.from_seq} -> {args.to_seq})"
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


def _index(args: argparse.Namespace) -> int:
    """``index verify|rebuild DB.TABLE``: the key index of a partitioned table's live version."""
    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.keyindex import rebuild_index, verify_index
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.pipeline.runtime import utcnow

    try:
        lake = Lake(_table(args))
        if args.action == "rebuild":
            result = rebuild_index(lake, by=f"cli:{os.environ.get('USER', 'unknown')}", now=utcnow())
            print(f"{args.table}: {result.line()}")
            return 0
        report = verify_index(lake)
    except CdcCompactionError as exc:
        print(f"index {args.action}: {exc}", file=sys.stderr)
        return 1
    print(f"{args.table}: {report.line()}")
    for problem in report.problems:
        print(f"  {problem}", file=sys.stderr)
    return 1 if report.problems else 0


def _rollback(args: argparse.Namespace) -> int:
    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.settings import MetastoreEndpoint, metastore_from_env
    from cdc_compaction.operations.travel import kept_commit, rollback

    try:
        cfg = _table(args)
        target = kept_commit(Lake(cfg), args.to_seq)
        if not args.yes:
            print(
                f"rollback {args.table} would publish version {args.to_seq} ({target.version}) as a new commit; the "
                "increments compacted after it stay archived (README, 'Time travel and rollback')"
            )
            if not sys.stdin.isatty() or input(f"type {args.table} to go on: ").strip() != args.table:
                print("nothing was changed; add --yes to roll back", file=sys.stderr)
                return 1
        endpoint = MetastoreEndpoint.parse(args.metastore) if args.metastore else metastore_from_env()
        result = rollback(cfg, args.to_seq, endpoint, by=f"cli:{os.environ.get('USER', 'unknown')}")
    except CdcCompactionError as exc:
        print(f"rollback: {exc}", file=sys.stderr)
        return 1
    print(f"{args.table}: {result.line()}")
    return 0


def _step(args: argparse.Namespace) -> int:
    """One step of a table's run, as its DAG task does it (the compaction in a local SparkSession)."""
    import json

    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.pipeline import order
    from cdc_compaction.pipeline.runtime import Runtime

    cfg = _table(args)
    # host:port, thrift://host:port or h1,h2 (see settings.metastore_hosts), as a connection's host is written.
    endpoint = MetastoreEndpoint.parse(args.metastore)

    class _LazySession:
        """Starts Spark only for the steps that need it (a JVM costs 10-15 s)."""

        def _engine(self) -> Any:
            from cdc_compaction.integrations.engine import SessionEngine, local_session

            return SessionEngine(local_session(endpoint, args.warehouse, app_name=f"cdc-step-{args.step}"))

        def run_sql(self, c: Any, statements: list[str]) -> None:
            self._engine().run_sql(c, statements)

        def compact(self, plan: dict[str, Any]) -> dict[str, Any]:
            return self._engine().compact(plan)

    rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=_LazySession())
    step = order.step(args.step)
    if step.takes_plan and not args.plan:
        print(f"step {args.step} needs --plan (the path the plan step printed)", file=sys.stderr)
        return 2
    if args.force and step.id != order.PLAN:
        print("--force applies to the plan step only (it decides whether the run compacts)", file=sys.stderr)
        return 2
    if args.force:
        result = step.function()(rt, run_id=args.run_id, force=True)
    else:
        result = step.call(rt, args.plan or "", args.run_id)
    print(json.dumps(result, default=str))
    return 0


def _rebuild(args: argparse.Namespace) -> int:
    """``rebuild DB.TABLE``: replay the archived increments and compare with the live version (README, "Rebuild")."""
    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.integrations.engine import SessionEngine, local_session
    from cdc_compaction.pipeline.rebuild import check_rebuildable, rebuild
    from cdc_compaction.pipeline.runtime import Runtime

    try:
        cfg = _table(args)
        check_rebuildable(cfg)  # before Spark starts: a JVM costs 10-15 s
        endpoint = MetastoreEndpoint.parse(args.metastore)
        engine = SessionEngine(local_session(endpoint, args.warehouse, app_name=f"cdc-rebuild-{cfg.qualified_name}"))
        rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=engine)
        report = rebuild(rt, since=args.since, publish=args.publish, force=args.force)
    except CdcCompactionError as exc:
        print(f"rebuild: {exc}", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line)
    # Exit 1 on a difference: a scheduled verification fails loudly.
    return 0 if report.equal else 1


def _pause(args: argparse.Namespace) -> int:
    """``pause|resume DB.TABLE``: Airflow's own pause flag, as ``airflow dags pause|unpause`` sets it."""
    from cdc_compaction.core.exceptions import AirflowSetupError
    from cdc_compaction.core.registry import dag_id_for
    from cdc_compaction.operations.ops import set_paused

    paused = args.command == "pause"
    try:
        was = set_paused(args.table, paused)
    except (ValueError, AirflowSetupError) as exc:
        print(f"{args.command}: {exc}", file=sys.stderr)
        return 1
    dag_id = dag_id_for(*args.table.split(".", 1))
    state = "paused" if paused else "active (unpaused)"
    print(f"{dag_id} was already {state}" if was is None else f"{dag_id} is now {state}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.settings import MetastoreEndpoint, metastore_from_env
    from cdc_compaction.operations.ops import (
        delete_table,
        planned_deletion,
        refuse_foreign_data,
        refuse_if_leased,
        registry_file_of,
    )

    directory = Path(args.registry_dir or settings.registry_dir())
    try:
        cfg = _table(args)
        registry_file = registry_file_of(directory, args.table)
        refuse_if_leased(cfg)
        if args.drop_data:
            refuse_foreign_data(cfg, directory, registry_file)  # before asking: the answer would not matter
        if not args.yes:
            print(f"delete {args.table} would:")
            for line in planned_deletion(cfg, registry_file, args.drop_data):
                print(f"  {line}")
            if not sys.stdin.isatty() or input(f"type {args.table} to go on: ").strip() != args.table:
                print("nothing was changed; add --yes to delete", file=sys.stderr)
                return 1
        endpoint = MetastoreEndpoint.parse(args.metastore) if args.metastore else metastore_from_env()
        report = delete_table(cfg, registry_file, endpoint, drop_data=args.drop_data)
    except CdcCompactionError as exc:
        print(f"delete: {exc}", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line)
    print(f"{args.table} deleted")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """Print one OK/FAIL line per check; exit 1 on any FAIL."""
    from cdc_compaction.core.settings import MetastoreEndpoint, metastore_from_env
    from cdc_compaction.operations import doctor

    directory = Path(args.registry_dir or settings.registry_dir())
    endpoint = MetastoreEndpoint.parse(args.metastore) if args.metastore else metastore_from_env()
    checks = doctor.run(directory, args.tables, endpoint)
    if not checks:
        print(f"no registry files (*.yaml) in {directory}: nothing to check", file=sys.stderr)
        return 1
    for c in checks:
        print(c.line(), flush=True)
    failed = sum(not c.ok for c in checks)
    print(f"{failed} of {len(checks)} checks failed" if failed else f"all {len(checks)} checks OK")
    return 1 if failed else 0


def _job_package(args: argparse.Namespace) -> int:
    from cdc_compaction.integrations.engine import job_package_dir
    from cdc_compaction.job import bundle

    print(bundle.build(args.out or job_package_dir()))
    return 0


def build_parser(prog: str = "cdc-compaction") -> argparse.ArgumentParser:
    """Every command and option: ``main`` parses with it, the docs site's command reference prints its help."""
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    reg = sub.add_parser("registry", help="registry commands")
    reg_sub = reg.add_subparsers(dest="action", required=True)
    val = reg_sub.add_parser("validate", help="validate every registry file")
    val.add_argument("--dir", help="registry directory (default: $CDC_REGISTRY_DIR or include/registry)")
    val.set_defaults(func=_registry_validate)
    sch = reg_sub.add_parser("schema", help="print (or write) the registry's JSON Schema, for editors")
    sch.add_argument("--out", help="write it to this file (the repository ships it as registry.schema.json)")
    sch.set_defaults(func=_registry_schema)
    dis = reg_sub.add_parser("discover", help="write a registry entry for every table directory of a landing root")
    dis.add_argument("landing_root", help="directory (or s3:// prefix) holding one directory per table")
    dis.add_argument("--database", required=True, help="the database every discovered table belongs to")
    dis.add_argument("--out", help="registry directory to write to (default: $CDC_REGISTRY_DIR or include/registry)")
    dis.add_argument("--include", action="append", default=[], metavar="GLOB", help="only tables matching (repeat)")
    dis.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="leave out tables matching")
    dis.add_argument("--key", action="append", default=[], metavar="TABLE=COL[,COL]", help="a table's primary key")
    dis.add_argument("--order-by", action="append", default=[], metavar="TABLE=COL[,COL]", help="a table's order")
    dis.add_argument("--source", choices=["generic", "debezium", "dms", "wal2json"], help="the preset of every table")
    dis.add_argument("--force", action="store_true", help="overwrite registry files that exist")
    dis.add_argument("--conn-id", default="aws_default", help="Airflow AWS connection for an s3:// landing root")
    dis.add_argument("--max-files", type=int, default=500, help="footers read per table (the newest files)")
    pg = dis.add_mutually_exclusive_group()
    pg.add_argument("--postgres-dsn", help="read keys and types from this PostgreSQL (libpq DSN) catalog")
    pg.add_argument("--postgres-conn-id", help="read keys and types from the PostgreSQL of this Airflow connection")
    dis.add_argument("--postgres-schema", default="public", help="the PostgreSQL schema of the tables")
    dis.set_defaults(func=_registry_discover)

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
    cn.set_defaults(func=_connect)

    demo = sub.add_parser("demo", help="land CDC files for two tables and compact them with the real DAGs")
    demo.add_argument(
        "--source",
        choices=["files", "postgres"],
        default="files",
        help="files: generated change files (default); postgres: a real PostgreSQL table through wal2json",
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

    def table_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("table", help="database.table as in the registry")
        p.add_argument("--registry-dir", help="registry directory (default: $CDC_REGISTRY_DIR or include/registry)")

    qu = sub.add_parser("quarantine", help="refused rows and files of a table")
    qu.add_argument("action", choices=["list", "reingest"])
    table_args(qu)
    qu.add_argument("entry", nargs="?", help="reingest: the entry id from 'list' (rows/<version> or files/<plan>)")
    qu.add_argument("--from", dest="source", help="reingest: a corrected copy to land instead of the kept data")
    qu.add_argument("--force", action="store_true", help="reingest an entry again")
    qu.set_defaults(func=_quarantine)

    er = sub.add_parser(
        "erase", help="remove every row matching a predicate from every version, increment and quarantine"
    )
    table_args(er)
    er.add_argument("--where", required=True, help='a boolean expression over registry columns, e.g. "id IN (7, 8)"')
    er.add_argument("--yes", action="store_true", help="erase (without it: show what would be erased)")
    er.add_argument(
        "--verify", action="store_true", help="only re-read every file and fail (exit 1) if any row still matches"
    )
    er.add_argument("--actor", help="who asks, for the audit record (default: the OS user)")
    er.set_defaults(func=_erase)

    le = sub.add_parser("lease", help="the lease that serializes a table's runs")
    le.add_argument("action", choices=["show", "break"])
    table_args(le)
    le.set_defaults(func=_lease)

    ve = sub.add_parser("versions", help="the kept versions of a table: commit, time, rows, location")
    table_args(ve)
    ve.add_argument("--json", action="store_true", help="a JSON list instead of one line per version")
    ve.set_defaults(func=_versions)

    ch = sub.add_parser("changes", help="net changes between two kept versions (_change_type, _commit_version)")
    table_args(ch)
    ch.add_argument("--from", dest="from_seq", type=int, required=True, help="the older kept version (commit)")
    ch.add_argument("--to", dest="to_seq", type=int, required=True, help="the newer kept version (commit)")
    ch.add_argument("--format", choices=["table", "json", "parquet"], default="table")
    ch.add_argument("--out", help="write to this file (required for parquet)")
    ch.set_defaults(func=_changes)

    ix = sub.add_parser("index", help="the key index of a partitioned table: verify it, or rebuild it from the data")
    ix.add_argument("action", choices=["verify", "rebuild"])
    table_args(ix)
    ix.set_defaults(func=_index)

    rb = sub.add_parser("rollback", help="publish a kept version's rows as a new commit")
    table_args(rb)
    rb.add_argument("--to", dest="to_seq", type=int, required=True, help="the kept version (commit) to publish")
    rb.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    rb.add_argument("--metastore", help="thrift://HOST:PORT or glue://[CATALOG] (default: $CDC_METASTORE_URI)")
    rb.set_defaults(func=_rollback)

    sta = sub.add_parser("status", help="each table's live version, last commit, freshness, pending hours, quarantine")
    sta.add_argument("tables", nargs="*", metavar="DB.TABLE", help="only these tables (default: every registry table)")
    sta.add_argument("--json", action="store_true", help="a JSON list of objects instead of one line per table")
    sta.add_argument("--registry-dir", help="registry directory (default: $CDC_REGISTRY_DIR or include/registry)")
    sta.set_defaults(func=_status)

    st = sub.add_parser("step", help="run one step of a table's run by hand")
    st.add_argument("step", choices=STEP_IDS)
    table_args(st)
    st.add_argument("--plan", help="the plan file (the steps after plan that read it: compact, validate, ...)")
    st.add_argument("--run-id", default="manual", help="plan: the run id that owns the lease and the plan")
    st.add_argument(
        "--force",
        action="store_true",
        help="plan: compact whatever is pending, regardless of compaction.policy (the DAG param compact: force)",
    )
    st.add_argument(
        "--metastore", default=os.environ.get("CDC_METASTORE", "127.0.0.1:9083"), help="HOST:PORT or thrift://HOST:PORT"
    )
    st.add_argument("--warehouse", default=str(settings.PROJECT_ROOT / ".lake" / "warehouse"))
    st.set_defaults(func=_step)

    rb = sub.add_parser(
        "rebuild", help="recompute a table from its archived increments and compare it with the live one"
    )
    table_args(rb)
    rb.add_argument("--since", metavar="INCREMENT", help="start at the newest kept version before this increment")
    how = rb.add_mutually_exclusive_group()
    how.add_argument("--verify-only", action="store_true", help="compare only, publish nothing (the default)")
    how.add_argument("--publish", action="store_true", help="publish the rebuilt version as a new commit")
    rb.add_argument("--force", action="store_true", help="with --publish: publish even if it differs from live")
    rb.add_argument(
        "--metastore", default=os.environ.get("CDC_METASTORE", "127.0.0.1:9083"), help="HOST:PORT or thrift://HOST:PORT"
    )
    rb.add_argument("--warehouse", default=str(settings.PROJECT_ROOT / ".lake" / "warehouse"))
    rb.set_defaults(func=_rebuild)

    for name, what in (("pause", "pause the table's DAG in Airflow"), ("resume", "unpause the table's DAG")):
        pa = sub.add_parser(name, help=what)
        pa.add_argument("table", help="database.table as in the registry")
        pa.set_defaults(func=_pause)

    de = sub.add_parser("delete", help="remove a table's pipeline (registry file aside, metastore objects dropped)")
    table_args(de)
    de.add_argument("--drop-data", action="store_true", help="also delete the table's lake (its storage_root)")
    de.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    de.add_argument("--metastore", help="thrift://HOST:PORT or glue://[CATALOG] (default: $CDC_METASTORE_URI)")
    de.set_defaults(func=_delete)

    dr = sub.add_parser("doctor", help="check registry, metastore, storage, Spark, SMTP and landed files")
    dr.add_argument("tables", nargs="*", help="database.table ... (default: every table of the registry)")
    dr.add_argument("--registry-dir", help="registry directory (default: $CDC_REGISTRY_DIR or include/registry)")
    dr.add_argument("--metastore", help="thrift://HOST:PORT or glue://[CATALOG] (default: $CDC_METASTORE_URI)")
    dr.set_defaults(func=_doctor)

    jp = sub.add_parser(
        "job-package",
        help="build the Spark job's zip for spark-submit --py-files (upload it next to spark.emr.application)",
    )
    jp.add_argument("--out", help="directory to write it to (default: $CDC_JOB_PACKAGE_DIR or .run/job-package)")
    jp.set_defaults(func=_job_package)
    return parser


def main(argv: list[str] | None = None) -> int:
    # The installed console script says its own name in usage and errors.
    prog = "cdc-compaction" if Path(sys.argv[0]).name == "cdc-compaction" else "python -m cdc_compaction"
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.command == "quarantine" and args.action == "reingest" and not args.entry:
        parser.error("quarantine reingest needs the entry id (see 'quarantine list')")
    logging.basicConfig(level=os.environ.get("CDC_LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
