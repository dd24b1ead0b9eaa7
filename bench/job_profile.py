"""Where a Spark job's time goes, from its driver log (log4j INFO lines), for the benchmark report.

The benchmarks keep each spark-submit's driver log. Spark's ``DAGScheduler`` writes one line
per finished stage with its call site and duration, and one per submitted task set; the job
writes ``compacting`` / ``compacted`` lines around its own work. From those this module
counts Spark jobs, stages and tasks, sums the time spent in stages, and names the longest
stages by the source line that started them (read from the job package's zip or the script),
so that ``bench/report.py`` can show, for the same run as the ratios, why ours is slower than
the floor or a touched-only run slower than its target.

Stage times are summed: adaptive execution can run two stages at once, so the sum may exceed
the wall time it covers. The rest of the job's own time is the driver's: planning, listing
files, metastore and Python between Spark jobs.

    python bench/job_profile.py LOG [LOG ...]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import zipfile
from collections import defaultdict
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

_STAGE = re.compile(r"INFO DAGScheduler: (?:ResultStage|ShuffleMapStage) (\d+) \((.*)\) finished in (\d+) ms")
_TASKS = re.compile(r"INFO DAGScheduler: Submitting (\d+) missing tasks from (?:ResultStage|ShuffleMapStage) (\d+) ")
_JOB = re.compile(r"INFO DAGScheduler: Got (?:map stage )?job (\d+) ")
_LISTING = re.compile(r"INFO InMemoryFileIndex: It took (\d+) ms to list leaf files")
_OWN = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO cdc_compaction\.(?:job\.)?compact: (compacting|compacted) "
)
_CALL = re.compile(r"^(\S+) at (.+):(\d+)$")
#: Call sites Spark gives to stages it starts on its own threads (adaptive execution's query
#: stages, broadcasts) and to writes started through py4j: no Python line to show.
_GENERIC = {
    "NativeMethodAccessorImpl.java": "write or action started through py4j",
    "CompletableFuture.java": "adaptive query stage (write, join or broadcast)",
}


@lru_cache(maxsize=256)
def _source(path: str) -> str:
    """The text of a call site's file: inside the job package's zip, or a plain script."""
    try:
        if ".zip/" in path:
            archive, member = path.split(".zip/", 1)
            with zipfile.ZipFile(archive + ".zip") as z:
                return z.read(member).decode("utf-8", "replace")
        return Path(path).read_text(errors="replace")
    except (OSError, KeyError, zipfile.BadZipFile):
        return ""


@lru_cache(maxsize=256)
def _tree(path: str) -> ast.Module | None:
    try:
        return ast.parse(_source(path))
    except SyntaxError:
        return None


def _statement(path: str, line: int) -> tuple[str, int, int] | None:
    """The innermost function and simple statement holding ``line`` (a call site is often a
    chained statement's last line, such as ``.first()``: show where the statement starts)."""
    tree = _tree(path)
    if tree is None:
        return None
    function, function_line, start, stop = "<module>", 0, None, line
    for node in ast.walk(tree):
        end = getattr(node, "end_lineno", None)
        if end is None or not node.lineno <= line <= end:
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.lineno > function_line:
                function, function_line = node.name, node.lineno
        elif isinstance(node, ast.stmt) and not hasattr(node, "body") and (start is None or node.lineno > start):
            start, stop = node.lineno, end
    return (function, start or line, stop) if start or function != "<module>" else None


def site_label(call_site: str) -> str:
    """A short name for a stage's call site: file:line, its function and the statement there."""
    m = _CALL.match(call_site.strip())
    if not m:
        return call_site.strip()
    action, path, line = m.group(1), m.group(2), int(m.group(3))
    name = Path(path).name
    if name in _GENERIC:
        return _GENERIC[name]
    lines = _source(path).splitlines()
    found = _statement(path, line) if 0 < line <= len(lines) else None
    if found is None:
        return f"{action} at {name}:{line}"
    function, start, stop = found
    code = re.sub(r"([(\[]) | ([)\]])", r"\1\2", " ".join(" ".join(lines[start - 1 : stop]).split()))
    if len(code) > 80:
        code = code[:77] + "..."
    return f"{name}:{line} {function}: `{code}`"


def own_seconds(lines: list[str]) -> float | None:
    """The job's own time: from its ``compacting`` to its ``compacted`` line (no JVM or session start)."""
    own: dict[str, datetime] = {}
    for line in lines:
        if m := _OWN.match(line):
            own[m.group(2)] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return round((own["compacted"] - own["compacting"]).total_seconds(), 3) if len(own) == 2 else None


def profile(log_file: str | Path, top: int = 5) -> dict[str, Any] | None:
    """Counts and times of one driver log, or None if the log is gone."""
    path = Path(log_file)
    if not path.is_file():
        return None
    jobs: set[int] = set()
    stages: dict[int, tuple[str, int]] = {}
    tasks: dict[int, int] = {}
    listing_ms = 0
    lines = path.read_text(errors="replace").splitlines()
    for line in lines:
        if m := _STAGE.search(line):
            stages[int(m.group(1))] = (m.group(2), int(m.group(3)))
        elif m := _TASKS.search(line):
            tasks[int(m.group(2))] = tasks.get(int(m.group(2)), 0) + int(m.group(1))
        elif m := _JOB.search(line):
            jobs.add(int(m.group(1)))
        elif m := _LISTING.search(line):
            listing_ms += int(m.group(1))
    by_site: dict[str, list[int]] = defaultdict(list)
    for call_site, ms in stages.values():
        by_site[site_label(call_site)].append(ms)
    ranked = sorted(by_site.items(), key=lambda kv: -sum(kv[1]))
    own_s = own_seconds(lines)
    return {
        "log_file": str(path),
        "spark_jobs": len(jobs),
        "stages": len(stages),
        "tasks": sum(tasks.values()),
        "stage_s": round(sum(ms for _, ms in stages.values()) / 1000, 3),
        "longest_stage_s": round(max((ms for _, ms in stages.values()), default=0) / 1000, 3),
        "listing_s": round(listing_ms / 1000, 3),
        "own_s": own_s,
        "top": [
            {
                "site": site,
                "stages": len(ms),
                "s": round(sum(ms) / 1000, 3),
                "longest_s": [round(x / 1000, 3) for x in sorted(ms, reverse=True)[:3]],
            }
            for site, ms in ranked[:top]
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args(argv)
    for log_file in args.logs:
        sys.stdout.write(json.dumps(profile(log_file, args.top), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
