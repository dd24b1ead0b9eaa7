"""Operating a table's pipeline: ``pause|resume DB.TABLE``, ``delete DB.TABLE`` and ``doctor [DB.TABLE ...]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cdc_compaction.cli.common import add_table_args, table_config
from cdc_compaction.core import settings


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
    from cdc_compaction.operations.airflow_home import use_airflow

    use_airflow()  # the metastore the Airflow of status and pause uses ($CDC_METASTORE_URI of the local UI)
    from cdc_compaction.core.settings import MetastoreEndpoint, metastore_from_env
    from cdc_compaction.operations.ops import (
        delete_table,
        planned_deletion,
        refuse_if_leased,
        registry_file_of,
        require_owned_root,
    )

    directory = Path(args.registry_dir or settings.registry_dir())
    try:
        cfg = table_config(args)
        registry_file = registry_file_of(directory, args.table)
        refuse_if_leased(cfg)
        if args.drop_data:
            require_owned_root(cfg)  # before asking: the answer would not matter
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
    from cdc_compaction.operations.airflow_home import use_airflow

    # The Airflow of status and pause, with its connections (spark_default, ...): a shell's doctor
    # checks what the DAGs' tasks use, not Airflow's empty default home.
    use_airflow()
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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``pause``, ``resume``, ``delete`` and ``doctor``."""
    for name, what in (("pause", "pause the table's DAG in Airflow"), ("resume", "unpause the table's DAG")):
        pa = sub.add_parser(name, help=what)
        pa.add_argument("table", help="database.table as in the registry")
        pa.set_defaults(func=_pause)

    de = sub.add_parser("delete", help="remove a table's pipeline (registry file aside, metastore objects dropped)")
    add_table_args(de)
    de.add_argument(
        "--drop-data",
        action="store_true",
        help="also delete the table's files: only those its records name, in a root it owns (its "
        "_cdc/owner.json); anything else under storage_root stays and is listed",
    )
    de.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    de.add_argument("--metastore", help="thrift://HOST:PORT or glue://[CATALOG] (default: $CDC_METASTORE_URI)")
    de.set_defaults(func=_delete)

    dr = sub.add_parser("doctor", help="check registry, metastore, storage, Spark, SMTP and landed files")
    dr.add_argument("tables", nargs="*", help="database.table ... (default: every table of the registry)")
    dr.add_argument("--registry-dir", help="registry directory (default: $CDC_REGISTRY_DIR or include/registry)")
    dr.add_argument("--metastore", help="thrift://HOST:PORT or glue://[CATALOG] (default: $CDC_METASTORE_URI)")
    dr.set_defaults(func=_doctor)
