"""``quarantine list|reingest DB.TABLE``: a table's refused rows and files, and putting them back after a fix."""

from __future__ import annotations

import argparse

from cdc_compaction.cli.common import add_table_args, table_config


def _quarantine(args: argparse.Namespace) -> int:
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.pipeline.quarantine import Quarantine

    q = Quarantine(Lake(table_config(args)))
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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``quarantine``."""
    qu = sub.add_parser("quarantine", help="refused rows and files of a table")
    qu.add_argument("action", choices=["list", "reingest"])
    add_table_args(qu)
    qu.add_argument("entry", nargs="?", help="reingest: the entry id from 'list' (rows/<version> or files/<plan>)")
    qu.add_argument("--from", dest="source", help="reingest: a corrected copy to land instead of the kept data")
    qu.add_argument("--force", action="store_true", help="reingest an entry again")
    qu.set_defaults(func=_quarantine)
