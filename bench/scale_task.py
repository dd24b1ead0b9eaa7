"""One Airflow-side task in a process of its own, and that process's own peak memory.

``bench/scale_day.py`` runs every task of a table's run (and every operation: ``status``, ``changes``,
``erase``, ``rollback``, ``index verify``) through this wrapper, so that the peak it reports is what
one Airflow worker's task process holds: Python, the project's code and whatever data it reads. A
Spark JVM the task starts is a child process and is not counted (``RUSAGE_SELF``): it is the Spark
side, sized by ``spark.driver_memory``, not the worker's.

    python bench/scale_task.py --peak-out F step PLAN_OR_STEP ...     # a step, as the DAG's task runs it
    python bench/scale_task.py --peak-out F cli ARGV ...              # a cdc-compaction command
    python bench/scale_task.py --peak-out F baseline                  # the imports alone (the floor of every task)

The steps run with the table's own engine as the DAG builds it for ``spark.engine: spark_submit``
(``SparkSubmitEngine`` on the given metastore and warehouse). The result (JSON: peak MB, wall seconds,
the step's return value) goes to ``--peak-out``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))


def peak_mb() -> float:
    """This process's own peak resident set: ``VmHWM``, the high-water mark of its memory since its ``exec``.

    Not ``getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries the forking parent's high-water mark over an
    ``exec`` into it, so a task started by a 400 MB benchmark process would report at least 400 MB.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: an upper bound


def run_step(args: argparse.Namespace) -> Any:
    """One step of the table's run, with the runtime the DAG's task builds (spark_submit engine)."""
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.registry import load_table
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.integrations.engine import SparkSubmitEngine
    from cdc_compaction.pipeline import order
    from cdc_compaction.pipeline.runtime import Runtime

    cfg = load_table(args.registry_dir, args.table)
    endpoint = MetastoreEndpoint.parse(args.metastore)
    rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=SparkSubmitEngine(endpoint, args.warehouse))
    step = order.step(args.step)
    if step.id == order.PLAN:
        return step.function()(rt, run_id=args.run_id, force=args.force)
    return step.call(rt, args.plan or "", args.run_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-out", required=True)
    sub = parser.add_subparsers(dest="what", required=True)
    st = sub.add_parser("step")
    st.add_argument("step")
    st.add_argument("table")
    st.add_argument("--registry-dir", required=True)
    st.add_argument("--metastore", required=True)
    st.add_argument("--warehouse", required=True)
    st.add_argument("--plan", default="")
    st.add_argument("--run-id", default="")
    st.add_argument("--force", action="store_true")
    cli = sub.add_parser("cli")
    cli.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("baseline")
    args = parser.parse_args(argv)
    start = time.monotonic()
    result: Any = None
    rc = 0
    if args.what == "step":
        result = run_step(args)
    elif args.what == "cli":
        from cdc_compaction.cli.main import main as cli_main

        rc = cli_main(args.argv)
    else:
        # What every task process pays before it reads any data: the project's modules and their libraries.
        import pyarrow.parquet  # noqa: F401

        import cdc_compaction.pipeline.publish
        import cdc_compaction.pipeline.validate  # noqa: F401
    out = {"peak_mb": round(peak_mb(), 1), "wall_s": round(time.monotonic() - start, 3), "rc": rc, "result": result}
    Path(args.peak_out).write_text(json.dumps(out, default=str))
    return rc


if __name__ == "__main__":
    sys.exit(main())
