"""``cdc-compaction --help`` lists every command the CLI has (it once left out ``erase`` and ``rebuild``).

The commands are read from the CLI's own usage line (argparse prints the choices as ``{a,b,c}``), the
list from the help's ``Commands:`` section, both as a user sees them: the installed console script's output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _help(*words: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins"), "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, "-m", "cdc_compaction", *words, "--help"], capture_output=True, text=True, env=env, check=True
    ).stdout


def _choices(help_text: str) -> list[str]:
    match = re.search(r"\{([a-z,-]+)\}\s+\.\.\.", help_text.split("\n\n", 1)[0])
    return match.group(1).split(",") if match else []


def _commands_section(help_text: str) -> list[str]:
    """The lines of the ``Commands:`` section, up to the next blank line."""
    section = help_text.split("\nCommands:\n", 1)[1].split("\n\n", 1)[0]
    return section.splitlines()


def test_the_top_level_help_lists_every_command_and_its_subcommands() -> None:
    top = _help()
    commands = _choices(top)
    assert {"erase", "rebuild", "registry", "status"} <= set(commands)
    lines = _commands_section(top)
    # A command's entry starts a line: "  <name>" then its arguments (nested commands as a|b|c).
    listed = {m.group(1) for ln in lines if (m := re.match(r"^  ([a-z][a-z-]*)(?:\s|$)", ln))}
    assert sorted(listed) == sorted(commands)
    for name in commands:
        nested = _choices(_help(name))
        if nested:
            (entry,) = [ln for ln in lines if ln.startswith(f"  {name} ")]
            assert "|".join(nested) in entry, (name, nested, entry)
