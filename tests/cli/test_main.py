"""The assembled command line (``cdc_compaction.cli.main``): every command wired, started without heavy imports."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib

import cdc_compaction.__main__ as module_shim
from cdc_compaction.cli.main import build_parser, main
from cdc_compaction.core.settings import PROJECT_ROOT

# What --help and argument errors must not wait for: each costs seconds (a JVM, Airflow's config, Arrow).
HEAVY = ("pyspark", "py4j", "airflow", "pyarrow", "duckdb", "pandas", "boto3", "psycopg2")


def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[str, argparse.ArgumentParser]]:
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _leaves(sub, (*words, name)) or [(" ".join((*words, name)), sub)]
    return found


def test_every_command_runs_a_handler_of_a_cli_module() -> None:
    leaves = _leaves(build_parser())
    assert len(leaves) >= 25, [w for w, _ in leaves]
    for words, sub in leaves:
        func = sub.get_default("func")
        assert callable(func), f"command {words!r} sets no handler (set_defaults(func=...) in its cli module)"
        assert func.__module__.startswith("cdc_compaction.cli."), (words, func.__module__)


def test_python_m_and_the_console_script_run_the_same_main() -> None:
    assert module_shim.main is main
    scripts = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["cdc-compaction"] == "cdc_compaction.cli.main:main"


def test_the_parser_is_built_without_loading_spark_airflow_or_arrow() -> None:
    """Handlers import what they run when they run: ``--help`` answers without a second's start-up."""
    code = (
        "import json, sys\n"
        "from cdc_compaction.cli.main import build_parser\n"
        "build_parser()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    loaded = json.loads(proc.stdout)
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert heavy == [], f"building the CLI's parser imported {heavy}: move the import into the handler"
