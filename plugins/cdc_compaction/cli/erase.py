"""``erase DB.TABLE --where PREDICATE``: remove matching rows everywhere the table keeps them (--yes, --verify)."""

from __future__ import annotations

import argparse
import sys

from cdc_compaction.cli.common import add_table_args, table_config


def _erase(args: argparse.Namespace) -> int:
    """Erase rows by predicate everywhere the table keeps them (README, "Erasing personal data")."""
    import json

    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.operations import erase
    from cdc_compaction.operations.airflow_home import use_airflow

    use_airflow()  # the metastore the Airflow of status and pause uses ($CDC_METASTORE_URI of the local UI)
    try:
        cfg = table_config(args)  # an invalid registry entry is a refusal with its file and line, not a traceback
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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``erase``."""
    er = sub.add_parser(
        "erase", help="remove every row matching a predicate from every version, increment and quarantine"
    )
    add_table_args(er)
    er.add_argument("--where", required=True, help='a boolean expression over registry columns, e.g. "id IN (7, 8)"')
    er.add_argument("--yes", action="store_true", help="erase (without it: show what would be erased)")
    er.add_argument(
        "--verify", action="store_true", help="only re-read every file and fail (exit 1) if any row still matches"
    )
    er.add_argument("--actor", help="who asks, for the audit record (default: the OS user)")
    er.set_defaults(func=_erase)
