"""Compaction benchmark: the real pipeline against a Spark floor and peer engines, side by side.

For each base size (``--sizes``, default 1M and 5M keys) the runner generates a
deterministic synthetic CDC table (``bench/datagen.py``), lands its initial load and
compacts it through the pipeline once (so the base is one the pipeline made, with a commit
record). Then, for each change fraction (``--fractions``, default 1 % and 10 %), it lands
one increment, runs ``ensure_tables`` and ``plan``, and measures on the planned files:

* ``floor``: ``bench/floor_job.py`` spark-submitted with the compaction's exact command
  line (conf, driver memory, master): read base + increments, write them back, no dedup;
* ``ours``: ``include/spark_jobs/compact.py`` with the command line the table's DAG
  ``compact`` task runs (taken from the DAG's ``SparkSubmitOperator``), then ``validate``;
* ``duckdb``, ``polars`` and ``delta`` (delta-rs): the same rule in a peer engine (``bench/peer.py``);
  delta-rs MERGEs into a Delta table of the base that ``peer.prepare_delta`` writes before its timed run;
* ``delta_cow`` and ``delta_dv`` (``--spark-peers``): the Spark peers, delta-spark's ``MERGE INTO`` on the same
  pinned Spark and ours' own spark-submit line (``bench/spark_peer.py``; jars.lock's ``delta-spark``
  group), copy-on-write and with deletion vectors (+ one full read), cold (a spark-submit each) and warm (one JVM,
  a warm-up, then the repeats); their tables' rows join the checksums;
* ``iceberg_cow`` and ``iceberg_mor`` (``--spark-peers``): Iceberg's ``MERGE INTO`` copy-on-write and merge-on-read
  (+ one full read), the same way, but on the second Spark, 4.1.4 (``make iceberg-spark``; Iceberg's runtime has no
  build for Spark 4.2), with ours' spark-submit line run by that Spark's spark-submit. Hudi has no build for Spark 4.x
  on Maven Central (``report.SPARK_PEERS_MISSING``).

Then the same floor and ours run warm (``--warm-repeats``, default 3; 0 skips them): in a
session of one Spark Connect server that the run starts once (on 127.0.0.1, a free port, the
bench's metastore and warehouse, the same driver memory and master as spark-submit's) and stops
by its PID at the end, failed or not. Ours runs as the ``spark_connect`` engine runs it
(``ConnectEngine.compact``, a fresh server session per run), the floor as ``floor_job.floor`` in
such a session. Per dataset one untimed warm-up of each, then ``--warm-repeats`` rounds of floor
then ours; the median run counts (``jobs.floor_warm``, ``jobs.ours_warm``, every run kept) and
gives ``ours/floor (warm)`` and ``ours/<peer> (warm)`` beside the cold ``ours/floor``.

Each job's wall time, CPU time and peak RSS of its whole process tree are recorded, with
the output files' count and sizes (warm: the call's wall time, client + server CPU, the server's
peak RSS). Ours and every peer must produce the same rows (an
order-independent hash over all columns, tombstones included): a mismatch fails the run.
The version is then discarded (not published), so every fraction starts from the same base.

Results go to ``bench/results/compaction.json``; ``bench/report.py`` turns them (and the
other benchmarks' JSON files) into ``RESULTS.md`` and ``compaction.png``.

    python bench/compaction.py [--sizes 1000000,5000000] [--fractions 0.01,0.1] [--warm-repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import datagen
import floor_job
import peer as peer_mod
import report
import spark_peer
from measure import JobResult, Stopwatch, run_in_server, run_measured, sigterm_unwinds, start_logging, write_result

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "plugins"))

from cdc_compaction.core.jarcache import group_jars  # noqa: E402
from cdc_compaction.core.lake import Lake, TableLease  # noqa: E402
from cdc_compaction.core.registry import TableConfig, parse_table  # noqa: E402
from cdc_compaction.core.settings import MetastoreEndpoint  # noqa: E402
from cdc_compaction.core.storage import is_data_file  # noqa: E402
from cdc_compaction.devtools import iceberg_spark  # noqa: E402
from cdc_compaction.devtools.local_services import LocalMetastore, SparkConnectServer, free_port  # noqa: E402
from cdc_compaction.integrations.engine import ConnectEngine, SparkSubmitEngine, compaction_conf  # noqa: E402
from cdc_compaction.integrations.metastore import connect  # noqa: E402
from cdc_compaction.pipeline import order  # noqa: E402
from cdc_compaction.pipeline.runtime import Runtime  # noqa: E402
from cdc_compaction.pipeline.tables import ensure_tables  # noqa: E402
from cdc_compaction.pipeline.validate import validate  # noqa: E402

log = logging.getLogger("bench.compaction")

DEFAULT_SIZES = "1000000,5000000"
#: 0.01 %: a tiny change, where what ours takes over the floor is the compaction's fixed part (bench/report.py).
DEFAULT_FRACTIONS = "0.0001,0.01,0.1"
#: The issue's target: the compaction costs at most this much more than reading and writing the data.
TARGET_OURS_OVER_FLOOR = 1.1
#: Measured warm runs of floor and ours per dataset (after one untimed warm-up each); the median counts.
DEFAULT_WARM_REPEATS = 3


def label(n: int) -> str:
    """1000000 -> '1M', 100000 -> '100k'."""
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if n >= div and n % (div // 10) == 0:
            return f"{n / div:g}{unit}"
    return str(n)


def pct(fraction: float) -> str:
    return f"{fraction * 100:g}%"


# ---------------------------------------------------------------------- helpers
def land(src_dir: str, dst_dir: str) -> None:
    """Land an increment's files as the sink would (hard links: no copy, same bytes)."""
    os.makedirs(dst_dir, exist_ok=True)
    for name in sorted(os.listdir(src_dir)):
        if name.endswith(".parquet"):
            try:
                os.link(os.path.join(src_dir, name), os.path.join(dst_dir, name))
            except OSError:
                shutil.copy2(os.path.join(src_dir, name), os.path.join(dst_dir, name))


def output_files(directory: str) -> dict[str, Any]:
    """Count and sizes (MB) of the Parquet data files of an output directory (a version's: data and tombstones)."""
    sizes = sorted(os.path.getsize(f) for f in peer_mod.parquet_files(directory) if is_data_file(os.path.basename(f)))
    mb = [s / 2**20 for s in sizes]
    return {
        "files": len(sizes),
        "total_mb": round(sum(mb), 2),
        "min_mb": round(mb[0], 2) if mb else 0.0,
        "median_mb": round(statistics.median(mb), 2) if mb else 0.0,
        "max_mb": round(mb[-1], 2) if mb else 0.0,
    }


def submit_command(cfg: TableConfig, args: list[str], application: str | None = None) -> list[str]:
    """The spark-submit command line of the table's DAG ``compact`` task (optionally another application).

    Built by the DAG's own ``SparkSubmitOperator`` and its hook, as ``tests/integrations/test_engine.py`` does: the
    connection (master, deploy mode), ``compaction_conf``, driver and executor memory, jars, name.
    """
    from cdc_compaction.airflow.factory import build_dag

    op = build_dag(cfg).get_task("compact")
    op.application_args = args
    hook = op._get_hook()
    return hook._build_spark_submit_command(application or op.application)


def check_job(job: JobResult) -> None:
    if job.returncode != 0:
        tail = "\n".join(Path(job.log_file).read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(f"{job.name} failed with exit code {job.returncode}; log {job.log_file}:\n{tail}")


def peer_spec(cfg: TableConfig, plan: dict[str, Any], threads: int, memory_mb: int) -> dict[str, Any]:
    """What a peer engine needs: the registry's rule inputs and the plan's files."""
    return {
        "columns": [{"name": c.name, "type": c.type} for c in cfg.columns],
        "primary_key": cfg.primary_key,
        "order_by": cfg.order_by,
        "op_column": cfg.op_column,
        "op_codes": cfg.op_codes.model_dump(),
        "base_location": plan["base_location"],
        "base_tombstones_location": plan.get("base_tombstones_location"),
        "files": [f["path"] for f in plan["files"]],
        "ingested_at": plan["ingested_at"],
        "tombstone_cutoff": plan.get("tombstone_cutoff"),
        "threads": threads,
        "memory_limit_mb": memory_mb,
        "target_file_mb": cfg.spark.target_file_mb,
    }


def memory_mb(spec: str | None) -> int:
    """'2g' -> 2048, '512m' -> 512 (spark-submit's memory strings)."""
    if not spec:
        return 1024
    units = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    s = spec.strip().lower().rstrip("b")
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s) // 2**20


def _job_entry(job: JobResult, rows: int, out_dir: str | None) -> dict[str, Any]:
    entry = job.to_dict()
    entry["rows_per_s"] = round(rows / job.wall_s) if job.wall_s else None
    if out_dir and os.path.isdir(out_dir):
        entry["output"] = output_files(out_dir)
    return entry


def _warm_entry(runs: list[JobResult], rows: int, out_dir: str) -> dict[str, Any]:
    """The median run of a warm engine (by wall time), with every run's wall and CPU time."""
    ordered = sorted(runs, key=lambda r: r.wall_s)
    median = ordered[(len(ordered) - 1) // 2]  # the lower median: a run that happened, not an average
    entry = _job_entry(median, rows, out_dir)
    entry["engine"] = "spark_connect"
    entry["repeats"] = len(runs)
    entry["runs_wall_s"] = [round(r.wall_s, 3) for r in runs]
    entry["runs_cpu_s"] = [round(r.cpu_s, 3) for r in runs]
    entry["peak_rss_mb"] = round(max(r.peak_rss_mb for r in runs), 3)
    return entry


# ---------------------------------------------------------------------- the runner
def ensure_and_plan(rt: Runtime, run_id: str, steps: dict[str, float]) -> str:
    """The run's steps up to plan (ensure_tables, plan), each timed into ``steps``; return the plan's path."""
    plan_path = ""
    for step in order.between(order.STEP_IDS[0], order.PLAN):
        with Stopwatch() as sw:
            result = step.call(rt, run_id=run_id)
        steps[f"{step.id}_s"] = sw.seconds
        if step.id == order.PLAN:
            plan_path = result
    return plan_path


class Bench:
    """One benchmark run: a metastore, a work directory, the tables it compacts."""

    def __init__(
        self, args: argparse.Namespace, endpoint: MetastoreEndpoint, server: SparkConnectServer | None = None
    ) -> None:
        self.args = args
        #: The warm engine's Spark Connect server (None: no warm runs).
        self.server = server
        self.work = Path(args.work).resolve()
        self.endpoint = endpoint
        self.warehouse = str(self.work / "warehouse")
        self.peers = [p for p in args.peers.split(",") if p]
        #: delta-spark's variants (bench/spark_peer.py): the Spark tools a Spark shop would run instead.
        self.spark_peers = [p for p in args.spark_peers.split(",") if p]
        unknown = sorted(set(self.spark_peers) - set(spark_peer.VARIANTS))
        if unknown:
            raise SystemExit(f"--spark-peers: unknown {unknown}; choose from {', '.join(spark_peer.VARIANTS)}")

    def config(self, base_rows: int) -> TableConfig:
        table = "cdc_" + label(base_rows).lower().replace(".", "_")
        spark: dict[str, Any] = {"driver_memory": self.args.driver_memory, "target_file_mb": self.args.target_file_mb}
        if self.args.event_log:
            # Profiling only: Spark's event log (per-stage task times) for floor and ours alike.
            os.makedirs(self.args.event_log, exist_ok=True)
            spark["conf"] = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": self.args.event_log}
        return parse_table(datagen.registry_doc(table, str(self.work / "lake" / table), **spark))

    def runtime(self, cfg: TableConfig) -> Runtime:
        return Runtime(
            cfg=cfg, lake=Lake(cfg), metastore=self.endpoint, engine=SparkSubmitEngine(self.endpoint, self.warehouse)
        )

    def logs(self, name: str) -> Path:
        return self.work / "logs" / f"{name}.log"

    def initial_load(self, cfg: TableConfig, manifest: dict[str, Any]) -> dict[str, Any]:
        """The table's base: made by the pipeline in an earlier run if cached, else now (see ``load_now``).

        The cache holds the table's lake directory after its initial load (keyed by the generated
        data: rows, seed, generator version), so re-runs skip the biggest compaction of the
        benchmark. The metastore is new on every run: ``ensure_tables`` registers the cached base.
        """
        cache = self.work / "cache" / f"{cfg.table}_s{self.args.seed}_g{datagen.GENERATOR_VERSION}"
        root = Lake(cfg).layout.root
        done = cache / "initial_load.json"
        if self.args.reuse_initial and done.exists():
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(cache / "lake", root, copy_function=os.link)
            rt = self.runtime(cfg)
            with Stopwatch() as sw:
                ensure_tables(rt)
            load = {**json.loads(done.read_text()), "reused_from_cache": str(cache)}
            load["steps"] = {**load["steps"], "ensure_tables_s": round(sw.seconds, 3)}
            log.info("%s: initial load reused from %s (made %s)", cfg.qualified_name, cache, load.get("made_at"))
            return load
        load = self.load_now(cfg, manifest)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.copytree(root, cache / "lake", copy_function=os.link)
        done.write_text(json.dumps(load, indent=1))
        return load

    def load_now(self, cfg: TableConfig, manifest: dict[str, Any]) -> dict[str, Any]:
        """Land the initial snapshot and compact it through the whole pipeline (publish and archive too)."""
        rt = self.runtime(cfg)
        land(manifest["initial"]["directory"], os.path.join(rt.lake.layout.incremental, datagen.INITIAL_INCREMENT))
        steps: dict[str, float] = {}
        plan_path = ensure_and_plan(rt, f"bench_initial_{cfg.table}", steps)
        job = run_measured("initial", submit_command(cfg, ["--plan", plan_path]), self.logs(f"{cfg.table}_initial"))
        check_job(job)
        # The steps after the compaction that work on its plan (validate, publish, archive).
        for step in order.after(order.COMPACT):
            if step.takes_plan:
                with Stopwatch() as sw:
                    step.call(rt, plan_path)
                steps[f"{step.id}_s"] = sw.seconds
        commit = rt.lake.latest_commit()
        return {
            "made_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "git": _git_commit(),
            "table": cfg.qualified_name,
            "rows": manifest["initial"]["rows"],
            "base_rows": commit.stats["output_rows"],
            "base_tombstones": commit.stats["output_tombstones"],
            "version": commit.version,
            "compact": job.to_dict(),
            "steps": {k: round(v, 3) for k, v in steps.items()},
            "output": output_files(rt.lake.layout.version_dir(commit.version)),
        }

    def dataset(self, cfg: TableConfig, manifest: dict[str, Any], fraction: float) -> dict[str, Any]:
        """Measure floor, ours and the peers on one planned increment; then discard ours' version."""
        rt = self.runtime(cfg)
        name = f"{label(manifest['base_rows'])} x {pct(fraction)}"
        slug = f"{cfg.table}_{round(fraction * 10000)}bp"
        change = manifest["change"]
        landed = os.path.join(rt.lake.layout.incremental, change["increment"])
        land(change["directory"], landed)
        steps: dict[str, float] = {}
        plan_path = ensure_and_plan(rt, f"bench_{slug}", steps)
        plan = json.loads(Path(plan_path).read_text())
        base_out = output_files(plan["base_location"])
        parent = rt.lake.latest_commit()
        base_rows = int(parent.stats["output_rows"])
        inc_rows = sum(int(f["rows"]) for f in plan["files"])
        rows = base_rows + inc_rows
        out = self.work / "out" / slug
        shutil.rmtree(out, ignore_errors=True)
        jobs: dict[str, dict[str, Any]] = {}
        outputs: dict[str, str] = {}
        try:
            # floor, ours, peers: one after the other, on the same files.
            floor_out = str(out / "floor")
            floor = run_measured(
                "floor",
                submit_command(cfg, ["--plan", plan_path, "--out", floor_out], str(BENCH / "floor_job.py")),
                self.logs(f"{slug}_floor"),
            )
            check_job(floor)
            jobs["floor"] = _job_entry(floor, rows, floor_out)
            ours = run_measured("ours", submit_command(cfg, ["--plan", plan_path]), self.logs(f"{slug}_ours"))
            check_job(ours)
            with Stopwatch() as sw:
                stats = validate(rt, plan_path)
            steps["validate_s"] = sw.seconds
            # The job wrote its own attempt directory beside the plan's version name.
            outputs["ours"] = stats["output_location"]
            jobs["ours"] = _job_entry(ours, rows, stats["output_location"])
            spec_path = out / "peer_spec.json"
            spec_path.write_text(
                json.dumps(peer_spec(cfg, plan, os.cpu_count() or 2, memory_mb(cfg.spark.driver_memory)), indent=1)
            )
            for peer in self.peers:
                peer_out = str(out / peer)
                if peer == "delta":
                    # The table a Delta Lake user MERGEs into exists already: made here, outside the timing.
                    with Stopwatch() as sw:
                        peer_mod.prepare_delta(json.loads(spec_path.read_text()), peer_out)
                    steps["delta_prepare_s"] = sw.seconds
                cmd = [sys.executable, str(BENCH / "peer.py"), "--engine", peer, "--spec", str(spec_path)]
                job = run_measured(peer, [*cmd, "--out", peer_out], self.logs(f"{slug}_{peer}"))
                check_job(job)
                outputs[peer] = peer_out
                jobs[peer] = _job_entry(job, rows, peer_out)
            if self.args.change_feed:
                self.feed_side_by_side(rt, cfg, plan, plan_path, parent, slug, rows, stats, jobs, steps)
            if self.spark_peers:
                self.run_spark_peers(cfg, spec_path, out, rows, stats["output_location"], jobs, outputs, steps)
            if self.server is not None:
                warm_ours_out = self.warm(cfg, plan, rows, out, jobs, steps)
                outputs["ours_warm"] = warm_ours_out
            with Stopwatch() as sw:
                checks = {
                    k: peer_mod.checksum(v, [c.model_dump() for c in cfg.columns], cfg.op_column, cfg.op_codes.delete)
                    for k, v in outputs.items()
                }
            steps["checksums_s"] = sw.seconds
            floor_rows = peer_mod.checksum(floor_out, [c.model_dump() for c in cfg.columns], "op", "d")["rows"]
            if "floor_warm" in jobs:
                warm_floor = str(out / "floor_warm")
                cols = [c.model_dump() for c in cfg.columns]
                jobs["floor_warm"]["rows_written"] = peer_mod.checksum(warm_floor, cols, "op", "d")["rows"]
        finally:
            self.discard(rt, plan, landed)
        same = all(c == checks["ours"] for c in checks.values())
        ratios: dict[str, float | None] = {}
        if "ours_feed" in jobs:
            # The price of the change feed in the job: the same compaction with change_feed on, over off.
            ratios["ours_feed/ours"] = round(jobs["ours_feed"]["wall_s"] / jobs["ours"]["wall_s"], 3)
            ratios["ours_feed/ours (cpu)"] = round(jobs["ours_feed"]["cpu_s"] / max(jobs["ours"]["cpu_s"], 1e-9), 3)
        if "ours_feed_warm" in jobs and "ours_warm" in jobs:
            # Warm: the medians of the same rounds.
            fed, plain = jobs["ours_feed_warm"], jobs["ours_warm"]
            ratios["ours_feed/ours (warm)"] = round(fed["wall_s"] / plain["wall_s"], 3)
            ratios["ours_feed/ours (warm, cpu)"] = round(fed["cpu_s"] / max(plain["cpu_s"], 1e-9), 3)
        for other in ("floor", *self.peers):
            if other in jobs:
                ratios[f"ours/{other}"] = round(jobs["ours"]["wall_s"] / jobs[other]["wall_s"], 3)
                ratios[f"ours/{other} (cpu)"] = round(jobs["ours"]["cpu_s"] / max(jobs[other]["cpu_s"], 1e-9), 3)
        for other in self.spark_peers:
            if other in jobs:
                # Cold against cold: a spark-submit each, JVM start included in both.
                ratios[f"ours/{other}"] = round(jobs["ours"]["wall_s"] / jobs[other]["wall_s"], 3)
                ratios[f"ours/{other} (cpu)"] = round(jobs["ours"]["cpu_s"] / max(jobs[other]["cpu_s"], 1e-9), 3)
        if "ours_warm" in jobs:
            warm = jobs["ours_warm"]
            for other in self.spark_peers:
                if f"{other}_warm" in jobs:
                    # Warm against warm: ours in the Connect server, the peer in its own long-lived JVM.
                    peer_warm = jobs[f"{other}_warm"]
                    ratios[f"ours/{other} (warm)"] = round(warm["wall_s"] / peer_warm["wall_s"], 3)
                    if "read_s" in peer_warm:
                        # Merge-on-read: the peer's MERGE and one full read against ours and one full read of ours.
                        ratios[f"ours+read/{other}+read (warm)"] = round(
                            (warm["wall_s"] + peer_warm["ours_read_s"]) / peer_warm["wall_s"], 3
                        )
            # Both in the warm server: the price of the rule when no JVM starts.
            ratios["ours/floor (warm)"] = round(warm["wall_s"] / jobs["floor_warm"]["wall_s"], 3)
            ratios["ours/floor (warm, cpu)"] = round(warm["cpu_s"] / max(jobs["floor_warm"]["cpu_s"], 1e-9), 3)
            # Warm ours against the peers' own runs (they start no JVM either).
            for other in self.peers:
                if other in jobs:
                    ratios[f"ours/{other} (warm)"] = round(warm["wall_s"] / jobs[other]["wall_s"], 3)
        result = {
            "dataset": name,
            "base_rows": base_rows,
            "change_fraction": fraction,
            "increment_rows": inc_rows,
            "input_rows": rows,
            "input_mb": round(sum(int(f["size"]) for f in plan["files"]) / 2**20 + base_out["total_mb"], 2),
            "base_files": base_out,
            "increment": {k: v for k, v in change.items() if k not in ("files", "directory")},
            "plan_sizing": {k: plan.get(k) for k in ("output_files", "max_records_per_file")},
            "jobs": jobs,
            "ratios": ratios,
            "steps": {k: round(v, 3) for k, v in steps.items()},
            "stats": {k: v for k, v in stats.items() if k not in ("finished_at", "rejected_by_file")},
            "floor_rows": floor_rows,
            "checksums": checks,
            "checksums_match": same,
        }
        for key, written in (("floor", floor_rows), ("floor_warm", jobs.get("floor_warm", {}).get("rows_written"))):
            if written is not None and written != rows:
                log.warning("%s: the %s wrote %d rows, expected %d", name, key, written, rows)
        log.info("%s: %s; checksums %s", name, ratios, "match" if same else "DIFFER")
        return result

    def run_spark_peers(
        self,
        cfg: TableConfig,
        spec_path: Path,
        out: Path,
        rows: int,
        ours_out: str,
        jobs: dict[str, dict[str, Any]],
        outputs: dict[str, str],
        steps: dict[str, float],
    ) -> None:
        """delta-spark and Iceberg MERGE (``bench/spark_peer.py``), each variant cold and warm, ours' command line.

        The base is loaded into a Delta table per variant first (one untimed spark-submit). Cold: one
        spark-submit per variant MERGEs (and, with deletion vectors, reads the table whole) into a fresh copy of it,
        measured like ours' (``jobs[variant]``, with its phases). Warm: one more spark-submit runs an untimed
        warm-up and ``--warm-repeats`` MERGEs, each into a fresh copy, timed inside its JVM (``jobs[variant_warm]``:
        the median run); it also exports the cold and the last warm result as Parquet, whose checksums join ours.

        The Iceberg variants run the same command line from Spark 4.1.4's spark-submit (``iceberg_spark.spark_home``)
        with Iceberg's jars; their tables share one Hadoop-catalog warehouse, and a fresh copy is the table set back
        to its base snapshot (``spark_peer.reset_iceberg``), so cold and warm use the one table.
        """
        app = str(BENCH / "spark_peer.py")
        delta = [v for v in self.spark_peers if not spark_peer.is_iceberg(v)]
        iceberg = [v for v in self.spark_peers if spark_peer.is_iceberg(v)]
        extra = spark_peer.submit_extra(group_jars(spark_peer.JAR_GROUP)) if delta else []
        ice_home = iceberg_spark.spark_home() if iceberg else None
        ice_extra = (
            spark_peer.submit_extra(group_jars(iceberg_spark.JAR_GROUP), spark_peer.ICEBERG_CONF) if iceberg else []
        )
        ice_env = spark_peer.iceberg_env(str(ice_home), dict(os.environ)) if ice_home is not None else None

        def command(args: list[str], variant: str = "delta_cow") -> list[str]:
            cmd = submit_command(cfg, [*args, "--spec", str(spec_path)], app)
            if not spark_peer.is_iceberg(variant):
                return spark_peer.with_extra(cmd, app, extra)
            # ours' command line, launched by Spark 4.1.4's own spark-submit.
            return [str(Path(str(ice_home)) / "bin" / "spark-submit"), *spark_peer.with_extra(cmd, app, ice_extra)[1:]]

        def env(variant: str) -> dict[str, str] | None:
            return ice_env if spark_peer.is_iceberg(variant) else None

        slug = out.name
        ice_warehouse = str(out / "iceberg_warehouse")
        bases = {v: ice_warehouse if v in iceberg else str(out / f"{v}_base") for v in self.spark_peers}
        if delta:
            prepare = ["--mode", "prepare", "--table", bases.get("delta_cow", str(out / "delta_cow_base"))]
            if "delta_dv" in bases:
                prepare += ["--dv-table", bases["delta_dv"]]
            job = run_measured("delta_prepare", command(prepare), self.logs(f"{slug}_delta_prepare"))
            check_job(job)
            steps["delta_spark_prepare_s"] = job.wall_s
        if iceberg:
            shutil.rmtree(ice_warehouse, ignore_errors=True)
            prepare = ["--mode", "prepare", "--table", ice_warehouse, "--iceberg", ",".join(iceberg)]
            job = run_measured(
                "iceberg_prepare", command(prepare, iceberg[0]), self.logs(f"{slug}_iceberg_prepare"), env=ice_env
            )
            check_job(job)
            steps["iceberg_spark_prepare_s"] = job.wall_s
        ours_dirs = ",".join(
            d for d in (os.path.join(ours_out, "data"), os.path.join(ours_out, "tombstones")) if os.path.isdir(d)
        )
        for variant in self.spark_peers:
            if spark_peer.is_iceberg(variant):
                cold = bases[variant]  # the table at its base snapshot, as prepare left it
            else:
                cold = spark_peer.fresh_copy(bases[variant], str(out / f"{variant}_cold"))
            times = out / f"{variant}_cold_timings.json"
            job = run_measured(
                variant,
                command(["--mode", "cold", "--variant", variant, "--table", cold, "--timings", str(times)], variant),
                self.logs(f"{slug}_{variant}"),
                env=env(variant),
            )
            check_job(job)
            jobs[variant] = {**_job_entry(job, rows, None), "phases": json.loads(times.read_text())}
            if spark_peer.is_iceberg(variant):
                jobs[variant]["spark"] = iceberg_spark.SPARK_VERSION
            warm_times = out / f"{variant}_warm_timings.json"
            warm_args = ["--mode", "warm", "--variant", variant, "--table", bases[variant]]
            warm_args += ["--work", str(out / f"{variant}_warm"), "--repeats", str(self.args.warm_repeats)]
            warm_args += ["--timings", str(warm_times), "--export", str(out / f"{variant}_warm_rows")]
            warm_args += ["--cold-table", cold, "--cold-export", str(out / f"{variant}_rows"), "--ours", ours_dirs]
            job = run_measured(
                f"{variant}_warm", command(warm_args, variant), self.logs(f"{slug}_{variant}_warm"), env=env(variant)
            )
            check_job(job)
            outputs[variant] = str(out / f"{variant}_rows")
            runs = json.loads(warm_times.read_text())
            if runs:
                median = sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2]
                jobs[f"{variant}_warm"] = {
                    **median,
                    "engine": "spark-submit, one JVM",
                    "repeats": len(runs),
                    "runs_wall_s": [r["wall_s"] for r in runs],
                    "rows_per_s": round(rows / median["wall_s"]) if median["wall_s"] else None,
                    "process": job.to_dict(),
                    **({"spark": iceberg_spark.SPARK_VERSION} if spark_peer.is_iceberg(variant) else {}),
                }
                outputs[f"{variant}_warm"] = str(out / f"{variant}_warm_rows")

    def warm(
        self,
        cfg: TableConfig,
        plan: dict[str, Any],
        rows: int,
        out: Path,
        jobs: dict[str, dict[str, Any]],
        steps: dict[str, float],
    ) -> str:
        """Floor and ours in the warm Spark Connect server: a warm-up each, then the measured rounds.

        Adds ``floor_warm`` and ``ours_warm`` to ``jobs`` (the median run, every run kept) and the
        warm-up's time to ``steps``; returns the directory of ours' last measured output (its rows
        are checksummed with the others'). Earlier warm attempts of ours are removed as they go.
        """
        server = self.server
        server_pid = server.pid() if server is not None else None
        if server is None or server_pid is None:
            where = f"see {server.log_file}:\n{server.log_tail()}" if server else "none was started (--warm-repeats 0)"
            raise RuntimeError(f"{cfg.qualified_name}: no Spark Connect server for the warm runs; {where}")
        engine = ConnectEngine(server.url, cfg)
        floor_out = str(out / "floor_warm")
        server_log = str(server.log_file)

        def floor_call() -> None:
            with engine.session(cfg) as spark:
                floor_job.floor(spark, plan, floor_out)

        def ours_call() -> str:
            stats = engine.compact(plan)
            return f"{plan['output_location'].rstrip('/')}-{stats['attempt']}"

        # --change-feed: the same compaction with the feed on, in the same rounds, so its price is a median of
        # runs side by side with ours' own rather than one cold run against another.
        feed_plan = {**plan, "change_feed": True}

        def feed_call() -> str:
            stats = engine.compact(feed_plan)
            return f"{plan['output_location'].rstrip('/')}-{stats['attempt']}"

        def drop(attempt_dir: str) -> None:
            # ``<version>-<attempt>`` and its quarantine twin: only the last measured one is kept.
            suffix = attempt_dir[len(plan["output_location"].rstrip("/")) :]
            for d in (attempt_dir, plan["quarantine_location"].rstrip("/") + suffix):
                shutil.rmtree(d, ignore_errors=True)

        with Stopwatch() as sw:
            # The warm-up: the server's first run of these files and plans (JIT, metadata), not timed.
            floor_call()
            drop(ours_call())
            if self.args.change_feed:
                drop(feed_call())
        steps["warm_warmup_s"] = sw.seconds
        runs: dict[str, list[JobResult]] = {"floor_warm": [], "ours_warm": []}
        if self.args.change_feed:
            runs["ours_feed_warm"] = []
        last = ""
        for i in range(self.args.warm_repeats):
            # Rounds of floor, ours (and ours with the feed): a slow spell of the machine hits them alike.
            floor, _ = run_in_server(f"floor_warm #{i + 1}", floor_call, server_pid, server_log)
            runs["floor_warm"].append(floor)
            ours, attempt_dir = run_in_server(f"ours_warm #{i + 1}", ours_call, server_pid, server_log)
            runs["ours_warm"].append(ours)
            if last:
                drop(last)
            last = attempt_dir
            if self.args.change_feed:
                fed, feed_dir = run_in_server(f"ours_feed_warm #{i + 1}", feed_call, server_pid, server_log)
                runs["ours_feed_warm"].append(fed)
                drop(feed_dir)
        jobs["floor_warm"] = _warm_entry(runs["floor_warm"], rows, floor_out)
        jobs["ours_warm"] = _warm_entry(runs["ours_warm"], rows, last)
        if runs.get("ours_feed_warm"):
            # Its outputs are dropped as they go: ours' files are the ones kept and checksummed.
            jobs["ours_feed_warm"] = _warm_entry(runs["ours_feed_warm"], rows, "")
        return last

    def feed_side_by_side(
        self,
        rt: Runtime,
        cfg: TableConfig,
        plan: dict[str, Any],
        plan_path: str,
        parent: Any,
        slug: str,
        rows: int,
        stats: dict[str, Any],
        jobs: dict[str, dict[str, Any]],
        steps: dict[str, float],
    ) -> None:
        """``--change-feed``: ours again on the same files with the plan's ``change_feed`` on (``ours_feed``).

        Validated like ours; then the diff ``publish`` falls back to when a job wrote no feed (``changes.write_feed``:
        the parent's and the new version's files paired in DuckDB) is timed, and its rows must equal the job's.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        from cdc_compaction.pipeline import changes

        feed_plan = Path(plan_path).with_name(Path(plan_path).stem + "_feed.json")
        feed_plan.write_text(json.dumps({**plan, "change_feed": True}, indent=1, sort_keys=True))
        try:
            job = run_measured("ours_feed", submit_command(cfg, ["--plan", str(feed_plan)]), self.logs(f"{slug}_feed"))
            check_job(job)
            with Stopwatch() as sw:
                feed_stats = validate(rt, str(feed_plan))
            steps["validate_feed_s"] = sw.seconds
        finally:
            feed_plan.unlink(missing_ok=True)
        jobs["ours_feed"] = {**_job_entry(job, rows, feed_stats["output_location"]), "feed": feed_stats["change_feed"]}
        # What publish does when a commit has no feed from its job (changes.write_feed): both versions' files
        # into DuckDB's on-disk database, paired by key there, the change streamed out.
        lake = rt.lake
        with Stopwatch() as sw, changes.VersionDiff(cfg.qualified_name, changes.feed_key(cfg)) as d:
            d.load_version("before", lake, parent, "the parent")
            new_files = changes.data_files(lake, os.path.join(stats["output_location"], "data"))
            d.load_files("after", new_files, lambda names: changes.row_columns(lake, names), "the new version")
            schema, batches = changes._feed_batches(cfg, d, int(plan["seq"]))  # write_feed's own, without a commit
            diffed = pa.Table.from_batches(list(batches), schema=schema)
        steps["publish_diff_s"] = sw.seconds
        job_feed = pq.read_table(os.path.join(feed_stats["output_location"], feed_stats["change_feed"]["file"]))

        def rows_of(t: pa.Table) -> list[str]:
            return sorted(repr(sorted(r.items())) for r in t.to_pylist())

        if rows_of(job_feed.select(diffed.column_names)) != rows_of(diffed):
            raise RuntimeError(f"{slug}: the job's change feed differs from the publish-time diff")
        jobs["ours_feed"]["feed_equals_publish_diff"] = True

    def discard(self, rt: Runtime, plan: dict[str, Any], landed: str) -> None:
        """Forget a measured run without publishing it: the next fraction starts from the same base."""
        for d in (plan["output_location"], plan["quarantine_location"]):
            for attempt in glob.glob(glob.escape(d.rstrip("/")) + "*"):  # <location>-<attempt> of every run
                shutil.rmtree(attempt, ignore_errors=True)
        plan_file = rt.lake.layout.plan_path(plan["plan_id"])
        if os.path.exists(plan_file):
            os.unlink(plan_file)
        TableLease(rt.lake).release(plan["owner"])
        shutil.rmtree(landed, ignore_errors=True)
        with connect(rt.metastore) as ms:
            ms.drop_partitions(rt.cfg.database, rt.names["incremental_table"], plan["increments"])


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("pyspark", "duckdb", "polars", "pyarrow", "deltalake"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = "not installed"
    out["delta-spark"] = ", ".join(Path(j).name for j in _spark_peer_jars()) or "not fetched"
    # The Iceberg peers' Spark is not the pinned one: the report names it beside their rows.
    out["iceberg-spark"] = ", ".join(Path(j).name for j in _spark_peer_jars(iceberg_spark.JAR_GROUP)) or "not fetched"
    out["iceberg-peers-spark"] = iceberg_spark.SPARK_VERSION
    return out


def _spark_peer_jars(group: str = spark_peer.JAR_GROUP) -> list[str]:
    """The jars of the Spark peers, if make jars fetched them."""
    try:
        return group_jars(group)
    except Exception:  # noqa: BLE001 - a version line of the report: "not fetched" says it
        return []


def _git_commit() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=False)
    return proc.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def connect_server(args: argparse.Namespace, work: Path, ms: LocalMetastore) -> SparkConnectServer:
    """The warm engine's server: on 127.0.0.1, a free port, this run's metastore and warehouse.

    Same driver memory and master as the spark-submit jobs (the connection's ``local[*]``), so
    warm and cold differ in the JVM and session start (and Spark Connect's client round trips).
    A server an earlier, killed run left behind in
    this home is stopped first (by its PID, after checking the process is that server).
    """
    home = work / "connect"
    extra: dict[str, str] = {}
    if args.event_log:
        # A session cannot turn the event log on: the server's own conf, as spark-submit's jobs get it.
        extra = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": args.event_log}
    server = SparkConnectServer(
        home=home,
        metastore_uri=ms.uri,
        warehouse_dir=str(work / "warehouse"),
        port=free_port(),
        master="local[*]",
        driver_memory=args.driver_memory,
        extra_conf=extra,
    )
    stale = server.pid()
    if stale is not None:
        import psutil

        try:
            ours = str(home) in " ".join(psutil.Process(stale).cmdline())
        except psutil.Error:
            ours = False
        if ours:
            log.warning("stopping the Spark Connect server (pid %d) an earlier bench run left in %s", stale, home)
            server.stop()
    shutil.rmtree(home, ignore_errors=True)
    return server


def run(args: argparse.Namespace) -> dict[str, Any]:
    from cdc_compaction.devtools.devenv import airflow_env

    started = time.monotonic()
    work = Path(args.work).resolve()
    for d in ("lake", "warehouse", "metastore", "airflow", "out", "logs"):
        shutil.rmtree(work / d, ignore_errors=True)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    fractions = [float(f) for f in args.fractions.split(",") if f]
    ms = LocalMetastore(work / "metastore", port=free_port(), warehouse=work / "warehouse")
    result: dict[str, Any] = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git": _git_commit(),
        "host": {
            "cpus": os.cpu_count(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            **_versions(),
        },
        "target_ours_over_floor": TARGET_OURS_OVER_FLOOR,
        "initial_loads": [],
        "datasets": [],
    }
    server = connect_server(args, work, ms) if args.warm_repeats > 0 else None
    with Stopwatch() as sw:
        ms.start()
    result["metastore_start_s"] = round(sw.seconds, 1)
    try:
        # The DAG's operator reads the spark_default connection from this environment.
        os.environ.update(airflow_env(work / "airflow", ms.uri, warehouse_dir=work / "warehouse"))
        if server is not None:
            # Started once for the whole run (its start is reported, not counted: the server is long-lived).
            with Stopwatch() as sw:
                server_pid = server.start()
            result["connect_server"] = {
                "start_s": round(sw.seconds, 1),
                "pid": server_pid,
                "url": server.url,
                "master": server.master,
                "driver_memory": server.driver_memory,
                "log": str(server.log_file),
            }
        bench = Bench(args, MetastoreEndpoint(ms.host, ms.port), server)
        for size in sizes:
            cfg = bench.config(size)
            with Stopwatch() as sw:
                manifest = datagen.generate(work / "data" / f"base_{size}_s{args.seed}", size, fractions[0], args.seed)
            log.info("data for %s ready in %.1f s", label(size), sw.seconds)
            load = bench.initial_load(cfg, manifest)
            load["datagen_s"] = round(sw.seconds, 1)
            result["initial_loads"].append(load)
            for fraction in fractions:
                manifest = datagen.generate(work / "data" / f"base_{size}_s{args.seed}", size, fraction, args.seed)
                result["datasets"].append(bench.dataset(cfg, manifest, fraction))
        result["settings"] = {
            "sizes": sizes,
            "fractions": fractions,
            "seed": args.seed,
            "driver_memory": args.driver_memory,
            "target_file_mb": args.target_file_mb,
            "peers": bench.peers,
            "spark_peers": bench.spark_peers,
            "warm_repeats": args.warm_repeats,
            "spark_conf": compaction_conf(bench.config(sizes[0])) if sizes else {},
            "spark_submit": submit_command(bench.config(sizes[0]), ["--plan", "<plan>"]) if sizes else [],
        }
    finally:
        try:
            if server is not None:
                server.stop()
        finally:
            ms.stop()
    result["host"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["total_s"] = round(time.monotonic() - started, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default=os.environ.get("BENCH_SIZES") or DEFAULT_SIZES, help="base rows, comma-separated"
    )
    parser.add_argument("--fractions", default=DEFAULT_FRACTIONS, help="change fractions, comma-separated")
    parser.add_argument("--seed", type=int, default=datagen.SEED)
    parser.add_argument(
        "--peers", default="duckdb,polars,delta", help="peer engines: duckdb, polars, delta (comma-separated)"
    )
    parser.add_argument(
        "--spark-peers",
        default="delta_cow,delta_dv",
        help="Spark peers (bench/spark_peer.py): delta_cow, delta_dv, iceberg_cow, iceberg_mor (comma-separated; empty:"
        " none). Delta's jars are jars.lock's delta-spark group (make jars); Iceberg's run on Spark 4.1.4 (make"
        " iceberg-spark, or CDC_ICEBERG_SPARK) with jars.lock's iceberg-spark group",
    )
    parser.add_argument("--driver-memory", default="2g", help="spark.driver_memory of the bench table")
    parser.add_argument("--target-file-mb", type=int, default=128, help="spark.target_file_mb of the bench table")
    parser.add_argument("--work", default=str(ROOT / ".run" / "bench"), help="work directory (data is cached here)")
    parser.add_argument("--out", default=str(BENCH / "results" / "compaction.json"))
    parser.add_argument(
        "--fresh-initial",
        dest="reuse_initial",
        action="store_false",
        help="compact the initial loads again even if an earlier run cached them",
    )
    parser.add_argument("--event-log", help="profile: write Spark event logs of every job to this directory")
    parser.add_argument(
        "--warm-repeats",
        type=int,
        default=int(os.environ.get("BENCH_WARM_REPEATS") or DEFAULT_WARM_REPEATS),
        help="measured warm runs (Spark Connect) of floor and ours per dataset, after a warm-up; 0: cold only",
    )
    parser.add_argument("--no-report", action="store_true", help="do not rewrite RESULTS.md and the chart")
    parser.add_argument(
        "--change-feed",
        action="store_true",
        help="also run ours with the plan's change_feed on (ours_feed), validate it, and time publish's fallback diff"
        " (its rows must equal the job's feed)",
    )
    args = parser.parse_args(argv)
    start_logging()
    # A SIGTERM (a timeout, a stopped CI job) unwinds like Ctrl-C: the finally blocks stop the servers.
    with sigterm_unwinds():
        result = run(args)
    out = write_result(args.out, result)
    log.info("wrote %s (%.0f s in all)", out, result["total_s"])
    if not args.no_report:
        report.write_report(out.parent)
    bad = [d["dataset"] for d in result["datasets"] if not d["checksums_match"]]
    if bad:
        log.error("ours and a peer produced different rows for %s: see checksums in %s", bad, out)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
