"""Command line: ``cdc-compaction <command>`` (``make install`` puts it in .venv; or ``python -m cdc_compaction``).

The list of commands below is made from the parser itself (:func:`commands_overview`): every command
the CLI has, with its arguments; ``cdc-compaction <command> --help`` shows a command's options.
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

#: The top-level --help's first line: the module docstring's (the rest of it is about this module).
HELP_HEAD = __doc__.split("\n\n", 1)[0]


#: How the overview names a positional argument whose parser gives it no metavar (argparse would show its dest).
_SHOWN = {"table": "DB.TABLE", "tables": "DB.TABLE"}
#: The overview's width: the same on every terminal, as the docs site prints the help at 100 columns.
_WIDTH = 100


def _argument(action: argparse.Action) -> str:
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        return "|".join(map(str, action.choices))
    metavar = action.metavar or _SHOWN.get(action.dest, action.dest.upper())
    return metavar if isinstance(metavar, str) else " ".join(metavar)


def _synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    """``name`` with what it must be given: nested commands as ``a|b|c``, positionals, required options."""
    words = [name]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            words.append("|".join(action.choices))
        elif not action.option_strings and action.help != argparse.SUPPRESS:
            shown = _argument(action)
            words.append(f"[{shown} ...]" if action.nargs in ("*", "?") else shown)
        elif action.required and action.option_strings:
            words.append(action.option_strings[0] + ("" if action.nargs == 0 else f" {_argument(action)}"))
    return " ".join(words)


def commands_overview(sub: argparse._SubParsersAction) -> str:
    """``Commands:`` and one entry per command (its synopsis, then its help), in the parser's order."""
    import textwrap

    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    rows = [(_synopsis(name, parser), helps.get(name, "")) for name, parser in sub.choices.items()]
    column = 2 + min(max(len(s) for s, _ in rows), 36) + 2
    lines = ["Commands:"]
    for synopsis, text in rows:
        wrapped = textwrap.wrap(text, _WIDTH - column) or [""]
        head = f"  {synopsis}"
        if len(head) + 2 > column:
            lines.append(head)
        else:
            lines.append(f"{head:{column}}{wrapped.pop(0)}")
        lines += [f"{'':{column}}{more}" for more in wrapped]
    return "\n".join(line.rstrip() for line in lines)


def build_parser(prog: str = "cdc-compaction") -> argparse.ArgumentParser:
    """Every command and option: ``main`` parses with it, the docs site's command reference prints its help."""
    parser = argparse.ArgumentParser(prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    # Made from the parser after every command is added: a new command cannot be missing from --help.
    parser.description = f"{HELP_HEAD}\n\n{commands_overview(sub)}"
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
