"""Commands over one table's lake: its lease, kept versions (``versions``, ``changes``, ``rollback``) and key index.

One module because argparse lists commands in the order they are added and the --help's order
(lease, versions, changes, index, rollback) puts ``index`` between the time-travel commands.
"""

from __future__ import annotations

import argparse
import os
import sys

from cdc_compaction.cli.common import add_table_args, table_config
from cdc_compaction.core.docs import doc_ref


def _lease(args: argparse.Namespace) -> int:
    from cdc_compaction.core.lake import Lake, TableLease

    lease = TableLease(Lake(table_config(args)))
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
        versions = kept_versions(Lake(table_config(args)))
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
    """The net changes between two kept versions, to stdout (table, JSON lines) or a Parquet file.

    Streamed a batch at a time (``travel.change_batches``): neither the versions nor the change are
    held whole here; ``--format table`` aligns the columns of each batch of rows on its own.
    """
    import contextlib
    import json

    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.operations.travel import change_batches, render_table

    if args.format == "parquet" and not args.out:
        print("changes: --format parquet needs --out FILE", file=sys.stderr)
        return 2
    rows = 0
    try:
        with change_batches(Lake(table_config(args)), args.from_seq, args.to_seq) as (schema, batches):
            if args.format == "parquet":
                import pyarrow.parquet as pq

                with pq.ParquetWriter(args.out, schema) as writer:
                    for batch in batches:
                        writer.write_batch(batch)
                        rows += batch.num_rows
                print(f"wrote {rows} change rows to {args.out}")
                return 0
            with contextlib.ExitStack() as stack:
                out = stack.enter_context(open(args.out, "w", encoding="utf-8")) if args.out else sys.stdout
                for batch in batches:
                    if args.format == "json":
                        out.writelines(json.dumps(r, default=str, sort_keys=True) + "\n" for r in batch.to_pylist())
                    else:
                        out.write(render_table(batch) + "\n")
                    rows += batch.num_rows
                if args.format != "json":
                    if rows == 0:  # the header alone, as for any empty table
                        out.write(render_table(schema.empty_table()) + "\n")
                    out.write(f"({rows} change rows, versions {args.from_seq} -> {args.to_seq})\n")
    except CdcCompactionError as exc:
        print(f"changes: {exc}", file=sys.stderr)
        return 1
    return 0


def _index(args: argparse.Namespace) -> int:
    """``index verify|rebuild DB.TABLE``: the key index of a partitioned table's live version."""
    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.keyindex import rebuild_index, verify_index
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.pipeline.runtime import utcnow

    try:
        lake = Lake(table_config(args))
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
    from cdc_compaction.operations.airflow_home import use_airflow
    from cdc_compaction.operations.travel import kept_commit, rollback

    # The metastore the Airflow of status and pause uses ($CDC_METASTORE_URI of the local UI), as erase
    # does: without it a shell's rollback of a partitioned table tried 127.0.0.1:9083 (issue 39, item 7).
    use_airflow()
    try:
        cfg = table_config(args)
        target = kept_commit(Lake(cfg), args.to_seq)
        if not args.yes:
            print(
                f"rollback {args.table} would publish version {args.to_seq} ({target.version}) as a new commit; the "
                f"increments compacted after it stay archived ({doc_ref('data', 'time-travel-and-rollback')})"
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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``lease``, ``versions``, ``changes``, ``index`` and ``rollback``, in this order (the --help's)."""
    le = sub.add_parser("lease", help="the lease that serializes a table's runs")
    le.add_argument("action", choices=["show", "break"])
    add_table_args(le)
    le.set_defaults(func=_lease)

    ve = sub.add_parser("versions", help="the kept versions of a table: commit, time, rows, location")
    add_table_args(ve)
    ve.add_argument("--json", action="store_true", help="a JSON list instead of one line per version")
    ve.set_defaults(func=_versions)

    ch = sub.add_parser("changes", help="net changes between two kept versions (_change_type, _commit_version)")
    add_table_args(ch)
    ch.add_argument("--from", dest="from_seq", type=int, required=True, help="the older kept version (commit)")
    ch.add_argument("--to", dest="to_seq", type=int, required=True, help="the newer kept version (commit)")
    ch.add_argument("--format", choices=["table", "json", "parquet"], default="table")
    ch.add_argument("--out", help="write to this file (required for parquet)")
    ch.set_defaults(func=_changes)

    ix = sub.add_parser("index", help="the key index of a partitioned table: verify it, or rebuild it from the data")
    ix.add_argument("action", choices=["verify", "rebuild"])
    add_table_args(ix)
    ix.set_defaults(func=_index)

    rb = sub.add_parser("rollback", help="publish a kept version's rows as a new commit")
    add_table_args(rb)
    rb.add_argument("--to", dest="to_seq", type=int, required=True, help="the kept version (commit) to publish")
    rb.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    rb.add_argument(
        "--metastore",
        help="thrift://HOST:PORT or glue://[CATALOG] (default: $CDC_METASTORE_URI, else the local UI's metastore)",
    )
    rb.set_defaults(func=_rollback)
