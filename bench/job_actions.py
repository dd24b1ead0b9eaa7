"""The Spark jobs of one warm compaction, each with its phase, call site and seconds.

Runs the cdc job in process (``job.compact.run``) on the benchmark's synthetic table
(``bench/datagen.py``): the initial load once, untimed, then the change increment as a
plan like the pipeline's, ``--repeats`` times in one warm session (each into a new attempt
directory; the first is a warm-up). For the last run it lists every Spark job the
compaction started -- from the session's status store, which keeps them whether or not the
UI runs -- with the phase the job names (``describe``), the call site and the job's seconds,
and prints the counts as JSON. This is the profile behind docs/benchmarks.md's list of the
job's actions; the benchmark proper (``bench/compaction.py``) times the same job by spark-submit.

    python bench/job_actions.py --base-rows 10000 --fraction 0.01 [--merge-path window] [--work DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import datagen

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

from cdc_compaction.core.registry import parse_table  # noqa: E402
from cdc_compaction.core.sql import rule_sql, spark_schema_ddl  # noqa: E402


def _files(directory: str) -> list[dict[str, Any]]:
    inc = Path(directory).name
    return [
        {"increment": inc, "name": p.name, "path": str(p), "size": p.stat().st_size}
        for p in sorted(Path(directory).glob("*.parquet"))
    ]


def plan_of(
    cfg: Any, plan_id: str, seq: int, base: Path | None, stats: dict[str, Any] | None, files: list, out: Path
) -> dict[str, Any]:
    """A plan as ``pipeline.plan`` writes it (the keys the job reads)."""
    at = datetime(2026, 2, 1, seq, tzinfo=UTC)
    plan: dict[str, Any] = {
        "plan_id": plan_id,
        "run_id": "bench",
        "owner": "bench",
        "table": cfg.qualified_name,
        "seq": seq,
        "parent_seq": seq - 1,
        "parent_version": f"v{seq - 1:08d}",
        "version": f"v{seq:08d}-{plan_id}",
        "increments": sorted({f["increment"] for f in files}),
        "column_names": cfg.column_names,
        "primary_key": cfg.primary_key,
        "order_by": cfg.order_by,
        "schema_ddl": spark_schema_ddl(cfg),
        "rule": rule_sql(cfg).to_dict(),
        "files": files,
        "output_location": str(out),
        "quarantine_location": str(out) + "-quarantine",
        "ingested_at": at.isoformat(),
        "tombstone_cutoff": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
    }
    if stats is None:
        assert base is not None
        base.mkdir(parents=True, exist_ok=True)
        plan |= {"base_location": str(base), "base_rows": 0}
    else:
        plan |= {
            "base_layout": 2,
            "base_location": str(base / "data"),
            "base_tombstones_location": str(base / "tombstones"),
            "base_rows": stats["output_visible_rows"],
            "base_tombstones": stats["output_tombstones"],
        }
    return plan


def _jobs(spark: Any) -> list[Any]:
    """The application's jobs as the status store keeps them (Scala's ``v1.JobData``)."""
    seq = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    return list(spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq))


def jobs_since(spark: Any, first_id: int) -> list[dict[str, Any]]:
    """Every Spark job of this application with an id from ``first_id`` on, oldest first."""
    out = []
    for j in _jobs(spark):
        if j.jobId() < first_id:
            continue
        sub, done = j.submissionTime(), j.completionTime()
        seconds = (done.get().getTime() - sub.get().getTime()) / 1000 if sub.isDefined() and done.isDefined() else None
        desc = j.description()
        out.append(
            {
                "job": j.jobId(),
                "phase": (desc.get() if desc.isDefined() else "").split(": ", 1)[-1],
                "site": j.name(),
                "stages": j.stageIds().size(),
                "s": seconds,
            }
        )
    return sorted(out, key=lambda r: r["job"])


def next_job_id(spark: Any) -> int:
    return 1 + max((j.jobId() for j in _jobs(spark)), default=-1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-rows", type=int, default=10_000)
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--merge-path", default=None)
    parser.add_argument("--work", default=None)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--profile", action="store_true", help="cProfile the last run's driver (to stderr)")
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    from cdc_compaction.job import compact as job

    work = Path(args.work or tempfile.mkdtemp(prefix="job-actions-"))
    manifest = datagen.generate(work / "data", args.base_rows, args.fraction)
    cfg = parse_table(datagen.registry_doc("actions", str(work / "lake")))
    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "8")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    try:
        v1 = work / "lake" / "v1"
        if not (v1 / "_cdc_stats.json").exists() and not v1.exists():
            first = plan_of(cfg, "p1", 1, work / "lake" / "v0", None, _files(manifest["initial"]["directory"]), v1)
            stats1 = job.run(spark, first)
            (work / "stats1.json").write_text(json.dumps(stats1))
        stats1 = json.loads((work / "stats1.json").read_text())
        runs = []
        for _ in range(args.repeats):
            out = work / "lake" / f"v2-{uuid.uuid4().hex[:8]}"
            plan = plan_of(cfg, "p2", 2, v1, stats1, _files(manifest["change"]["directory"]), out)
            if args.merge_path:
                plan["merge_path"] = args.merge_path
            first_id = next_job_id(spark)
            profiler = cProfile.Profile() if args.profile and len(runs) == args.repeats - 1 else None
            t = time.monotonic()
            if profiler:
                profiler.enable()
            stats = job.run(spark, plan)
            seconds = time.monotonic() - t
            if profiler:
                profiler.disable()
                pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_callees("run_cdc")
            runs.append((seconds, jobs_since(spark, first_id), stats))
        seconds, jobs, stats = runs[-1]
        report = {
            "base_rows": args.base_rows,
            "fraction": args.fraction,
            "merge_path": stats.get("merge_path"),
            "seconds": [round(r[0], 3) for r in runs],
            "spark_jobs": len(jobs),
            "stages": sum(j["stages"] for j in jobs),
            "job_s": round(sum(j["s"] or 0 for j in jobs), 3),
            "jobs": jobs,
        }
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
