"""Helpers of the command-line tests: run ``python -m cdc_compaction`` as a user does, in a child process."""

from __future__ import annotations

import os
import subprocess
import sys

from cdc_compaction.core.settings import PROJECT_ROOT


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m cdc_compaction ARGS``: its exit code, stdout and stderr (never raises on a non-zero exit)."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins")}
    return subprocess.run(
        [sys.executable, "-m", "cdc_compaction", *args], capture_output=True, text=True, env=env, check=False
    )
