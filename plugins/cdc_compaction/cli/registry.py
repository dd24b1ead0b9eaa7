"""``registry validate|schema|discover``: check the registry, print its JSON Schema, write a landing root's entries."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cdc_compaction.core import settings


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
            schema_registry=args.schema_registry,
        )
        report = discover(opts)
    except (ValueError, CdcCompactionError) as exc:
        print(f"registry discover: {exc}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``registry`` and its subcommands."""
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
    dis.add_argument(
        "--schema-registry",
        metavar="URL",
        help="read the tables from this schema registry's <topic>-value/-key subjects (its Confluent API, e.g. "
        "http://host:8080/apis/ccompat/v7); the landing root is then where they land",
    )
    dis.set_defaults(func=_registry_discover)
