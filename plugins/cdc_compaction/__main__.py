"""Command line: ``python -m cdc_compaction <command>``.

Commands:
  registry validate [--dir DIR]          check every registry file; exit 1 on any error
  conformance --mode inprocess|dag GLOB  run scenario files through the pipeline
  metastore start|stop|status            the local Thrift metastore of the embedded default
  demo                                   the embedded default end to end (make demo)
  airflow-ui                             Airflow with this project's DAGs on 127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path

from cdc_compaction import settings


def _registry_validate(args: argparse.Namespace) -> int:
    from cdc_compaction.registry import load_registry, registry_files

    directory = Path(args.dir or settings.registry_dir())
    if not registry_files(directory):
        print(f"no registry files (*.yaml) in {directory}", file=sys.stderr)
        return 1
    bad = 0
    for e in load_registry(directory):
        if e.error is None:
            print(f"OK    {e.path.name}: {e.config.qualified_name} -> DAG {e.dag_id}")
        else:
            bad += 1
            print(f"ERROR {e.path.name}:")
            for p in e.error.problems:
                print(f"        {p}")
    print(f"{bad} invalid of {len(load_registry(directory))} registry files in {directory}")
    return 1 if bad else 0


def _metastore(args: argparse.Namespace) -> int:
    from cdc_compaction.local_services import LocalMetastore

    ms = LocalMetastore(Path(args.home), port=args.port)
    if args.action == "start":
        pid = ms.start()
        print(f"metastore {ms.uri} running (pid {pid}, home {ms.home})")
    elif args.action == "stop":
        print("stopped" if ms.stop() else "not running")
    else:
        pid = ms.pid()
        print(f"running (pid {pid}) at {ms.uri}" if pid else "not running")
        return 0 if pid else 3
    return 0


def _conformance(args: argparse.Namespace) -> int:
    from cdc_compaction import conformance as conf
    from cdc_compaction.devenv import airflow_env, ensure_airflow_db
    from cdc_compaction.engine import local_session
    from cdc_compaction.local_services import LocalMetastore, free_port
    from cdc_compaction.settings import MetastoreEndpoint

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
        reader = conf.Reader(spark)
        registry = work / "registry"
        if args.mode == "dag":
            env = airflow_env(work / "airflow", ms.uri, registry_dir=registry, warehouse_dir=work / "warehouse")
            ensure_airflow_db(env)
            runner: conf.InProcessRunner = conf.DagRunner(spark, endpoint, env)
        else:
            runner = conf.InProcessRunner(spark, endpoint)
        for f in files:
            scn = conf.Scenario.load(f)
            res = conf.run_scenario(scn, runner, reader, work / "lake", registry)
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
    from cdc_compaction.demo import main as demo_main

    return demo_main()


def _airflow_ui(args: argparse.Namespace) -> int:
    """Airflow (api-server, scheduler, dag-processor, triggerer) on 127.0.0.1 with this project's DAGs."""
    import subprocess

    from cdc_compaction.devenv import airflow_env, ensure_airflow_db
    from cdc_compaction.local_services import LocalMetastore

    ms = LocalMetastore(settings.PROJECT_ROOT / ".metastore", port=args.metastore_port)
    ms.start()
    try:
        env = airflow_env(settings.PROJECT_ROOT / ".airflow", ms.uri)
        env.update({"AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(args.port)})
        ensure_airflow_db(env)
        print(f"Airflow UI on http://127.0.0.1:{args.port} (login printed below by 'airflow standalone'); Ctrl-C stops")
        airflow = str(Path(sys.executable).parent / "airflow")
        return subprocess.run([airflow, "standalone"], env=env, check=False).returncode
    except KeyboardInterrupt:
        return 0
    finally:
        ms.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cdc_compaction", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    reg = sub.add_parser("registry", help="registry commands")
    reg_sub = reg.add_subparsers(dest="action", required=True)
    val = reg_sub.add_parser("validate", help="validate every registry file")
    val.add_argument("--dir", help="registry directory (default: $CDC_REGISTRY_DIR or include/registry)")
    val.set_defaults(func=_registry_validate)

    cf = sub.add_parser("conformance", help="run scenario files through the pipeline")
    cf.add_argument("scenarios", nargs="+", help="scenario files, globs or directories")
    cf.add_argument("--mode", choices=["inprocess", "dag"], default="inprocess")
    cf.add_argument("--work-dir", default=str(settings.PROJECT_ROOT / ".run" / "conformance"))
    cf.add_argument("--timings", action="store_true", help="dag mode: print each DAG run's task durations")
    cf.set_defaults(func=_conformance)

    ms = sub.add_parser("metastore", help="the local Thrift Hive metastore")
    ms.add_argument("action", choices=["start", "stop", "status"])
    ms.add_argument("--home", default=os.environ.get("CDC_METASTORE_HOME", str(settings.PROJECT_ROOT / ".metastore")))
    ms.add_argument("--port", type=int, default=int(os.environ.get("CDC_METASTORE_PORT", "9083")))
    ms.set_defaults(func=_metastore)

    demo = sub.add_parser("demo", help="land CDC files for two tables and compact them with the real DAGs")
    demo.set_defaults(func=_demo)

    ui = sub.add_parser("airflow-ui", help="run Airflow (UI, scheduler) with this project's DAGs")
    ui.add_argument("--port", type=int, default=8080)
    ui.add_argument("--metastore-port", type=int, default=9083)
    ui.set_defaults(func=_airflow_ui)

    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("CDC_LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
