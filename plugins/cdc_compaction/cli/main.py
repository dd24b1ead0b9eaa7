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
import sys
from pathlib import Path

from cdc_compaction.cli import (
    dev,
    erase,
    job_package,
    lake,
    ops,
    quarantine,
    registry,
    run,
    servers,
    status,
)

# The docstring above is the top-level --help (description=__doc__): keep its list in step with the commands.


def build_parser(prog: str = "cdc-compaction") -> argparse.ArgumentParser:
    """Every command and option: ``main`` parses with it, the docs site's command reference prints its help."""
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    # argparse lists the commands in the order they are added: this order is the --help's and the docs'.
    registry.add_parser(sub)
    dev.add_parser(sub)
    servers.add_parser(sub)
    quarantine.add_parser(sub)
    erase.add_parser(sub)
    lake.add_parser(sub)
    status.add_parser(sub)
    run.add_parser(sub)
    ops.add_parser(sub)
    job_package.add_parser(sub)
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
