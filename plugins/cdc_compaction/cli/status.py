"""``status [DB.TABLE ...] [--json]``: where each table stands, read from its lake and Airflow."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cdc_compaction.core import settings
from cdc_compaction.core.printable import printable


def _say(text: str, err: bool = False) -> None:
    """Print one line of ``status``: its registry names, paths and errors are shown, never obeyed by the terminal."""
    print(printable(text), file=sys.stderr if err else sys.stdout)


def _status(args: argparse.Namespace) -> int:
    """One line (or a JSON object) per table: where it stands, read from its lake and Airflow."""
    from datetime import UTC, datetime

    from cdc_compaction.core.registry import load_registry, registry_files
    from cdc_compaction.operations.status import read_airflow, registry_error_status, table_status, to_json

    directory = Path(args.registry_dir or settings.registry_dir())
    if not directory.is_dir() or not registry_files(directory):
        # Nothing to show is not a healthy "all fine": say where it looked and how to point it elsewhere.
        where = "does not exist" if not directory.exists() else "holds no registry files (*.yaml)"
        _say(
            f"status: the registry directory {directory.resolve()} {where}; point at your registry with "
            "--registry-dir DIR or $CDC_REGISTRY_DIR (default: include/registry of the project)",
            err=True,
        )
        return 2
    entries = load_registry(directory)
    wanted = set(args.tables)
    configs = [e.config for e in entries if e.error is None and (not wanted or e.config.qualified_name in wanted)]
    broken = [e for e in entries if e.error is not None and (not wanted or e.path.stem in wanted)]
    unknown = sorted(wanted - {c.qualified_name for c in configs} - {e.path.stem for e in broken})
    if unknown:
        _say(
            f"no registry entry for {', '.join(unknown)} in {directory}: name tables as DATABASE.TABLE "
            "(`registry validate` lists them)",
            err=True,
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
            _say(st.line())
        for st in bad:
            _say(
                f"{st.table:<28} ERROR {st.error} (fix the file; `registry validate`)  "
                f"last run {st.last_run_text}  {st.paused_text}"
            )
    return 1 if broken or any(st.error for st in result) else 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``status``."""
    sta = sub.add_parser("status", help="each table's live version, last commit, freshness, pending hours, quarantine")
    sta.add_argument("tables", nargs="*", metavar="DB.TABLE", help="only these tables (default: every registry table)")
    sta.add_argument("--json", action="store_true", help="a JSON list of objects instead of one line per table")
    sta.add_argument("--registry-dir", help="registry directory (default: $CDC_REGISTRY_DIR or include/registry)")
    sta.set_defaults(func=_status)
