"""At scale: a big table and a big partitioned table through a whole day of hourly runs, and the memory of every task.

Issue 38's scale benchmark. Two tables get deterministic data (the columns of ``bench/partitioned.py``, keys
clustered into ``--partitions`` days), generated and written a file at a time, so the generator's memory does not
grow with the table either:

* ``flat``: ``--rows`` keys (default 50M), unpartitioned: every compaction rewrites the whole base;
* ``parted``: ``--partitioned-rows`` keys (default 20M), ``partition_by`` the day: a compaction rewrites the
  partitions its events touch and finds deleted keys through the key index.

Both have ``change_feed: true``. Each is loaded and compacted once, then gets ``--hours`` hourly increments
(default 24) of ``--hourly-fraction`` of its keys (70 % updates, 10 % key-only deletes, 20 % inserts; the
partitioned table's changes fall on its newest days, where a real table's do), each followed by one whole run
of the DAG's steps with the table's own ``spark.engine: spark_submit`` (the compaction is the DAG's own
spark-submit command line). ``--flat-compact-every K`` gives the unpartitioned table a threshold policy instead,
as a big unpartitioned table runs in production: every run refreshes its view, and the base is rewritten once K
hours wait (a 5M-row rewrite took about three minutes on 2 cores: 24 rewrites of 50M rows would not fit in a day).
After the day: ``status``, ``versions``, ``changes`` between the last two versions, ``erase`` of one key,
``rollback`` to the version before the last, and for the partitioned table ``index verify``; a version is a
compaction's, so under a threshold policy these reach back K hours.

Every Airflow-side task and operation runs in a process of its own (``bench/scale_task.py``), which reports
its own peak resident memory: what one Airflow worker's task process holds. Spark's JVMs are children and are
measured apart (the compaction's whole process tree), because ``spark.driver_memory`` sizes them, not the worker.
The target (issue 38): every Airflow-side peak <= 500 MB, whatever the table's size.

The live rows are checked against a reference computed from the generated events alone (DuckDB, on disk: the
latest event per key, live unless it is a delete), after the day, after the erase (the key gone) and after the
rollback (the day but its last hour, without the erased key).

    python bench/scale_day.py --out bench/results/scale_day.json [--rows 50000000 --partitioned-rows 20000000]
    python bench/scale_day.py --rows 200000 --partitioned-rows 100000 --hours 3 --out /tmp/scale.json   # smoke run

The defaults take hours on a 2-core machine: the 50M-row table's hourly rewrite dominates.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq
from measure import run_measured, sigterm_unwinds, start_logging, write_result
from partitioned import COLUMNS, _rows, day_of, submit_command

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

from cdc_compaction.core import policy  # noqa: E402
from cdc_compaction.core.lake import Lake  # noqa: E402
from cdc_compaction.core.registry import TableConfig, load_table  # noqa: E402
from cdc_compaction.devtools.local_services import LocalMetastore, free_port  # noqa: E402
from cdc_compaction.pipeline import order  # noqa: E402

log = logging.getLogger("bench.scale_day")

SEED = 20261129
DATABASE = "bench_scale"
TARGET_PEAK_MB = 500
ROWS_PER_FILE = 250_000
INITIAL = "increment_2026010100"
#: The first hourly increment's hour; hour h lands as this hour + h.
DAY_START = datetime(2026, 2, 1, 1, tzinfo=UTC)
#: Shares of an hour's events: updates of existing keys, key-only deletes, inserts of new keys.
UPDATES, DELETES = 0.70, 0.10
#: The partitioned table's changes fall on its newest days (this many), as a real table's do.
RECENT_DAYS = 5
#: What the checks compare, of the reference and of the live rows alike: count, and sums over (id, ts_ms).
FIGURES = "count(*), coalesce(sum(id), 0), coalesce(sum(ts_ms), 0), coalesce(sum(hash(id, ts_ms) % 1000003), 0)"
TASK = str(Path(__file__).resolve().parent / "scale_task.py")
#: Files an hour lands (updates, deletes, inserts): a threshold policy counts pending files.
FILES_PER_HOUR = 3


# ---------------------------------------------------------------------------- data
def hour_name(hour: int) -> str:
    return f"increment_{DAY_START + timedelta(hours=hour - 1):%Y%m%d%H}"


def generate_initial(directory: Path, rows: int, partitions: int) -> int:
    """The initial load, a file of :data:`ROWS_PER_FILE` keys at a time (ts_ms = the key: older than any change)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, start in enumerate(range(0, rows, ROWS_PER_FILE)):
        ids = np.arange(start, min(rows, start + ROWS_PER_FILE), dtype=np.int64)
        rng = np.random.default_rng([SEED, rows, i])
        pq.write_table(
            _rows(rng, ids, day_of(ids, rows, partitions, "clustered"), "c", ids), directory / f"part-{i:05d}.parquet"
        )
    return rows


def generate_hour(
    directory: Path, rows: int, partitions: int, hour: int, fraction: float, recent: bool
) -> dict[str, int]:
    """Hour ``hour``'s events (1-based): updates, key-only deletes (every other column NULL) and new keys.

    The keys changed are drawn from the initial keys (``recent``: from the newest :data:`RECENT_DAYS` days'); new
    keys are ids above every key of the initial load and of the earlier hours, on the newest day. Every event's
    ``ts_ms`` is later than every earlier hour's, so the latest event of a key is its last hour's.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([SEED, rows, hour])
    events = max(10, round(rows * fraction))
    n_upd, n_del = round(events * UPDATES), round(events * DELETES)
    n_new = events - n_upd - n_del
    per_day = -(-rows // partitions)
    low = max(0, rows - RECENT_DAYS * per_day) if recent else 0
    changed = rng.choice(np.arange(low, rows, dtype=np.int64), n_upd + n_del, replace=False)
    upd, dele = np.sort(changed[:n_upd]), np.sort(changed[n_upd:])
    new = rows + (hour - 1) * n_new + np.arange(n_new, dtype=np.int64)
    base_ts = rows + hour * 10**7
    parts = [
        _rows(rng, upd, day_of(upd, rows, partitions, "clustered"), "u", base_ts + rng.integers(0, 10**6, n_upd)),
        _rows(rng, dele, np.full(n_del, -1), "d", base_ts + rng.integers(0, 10**6, n_del)),
        _rows(rng, new, np.full(n_new, partitions - 1), "c", base_ts + rng.integers(0, 10**6, n_new)),
    ]
    assert len(parts) == FILES_PER_HOUR
    for i, part in enumerate(parts):
        pq.write_table(part, directory / f"part-{i:05d}.parquet")
    return {"events": events, "updates": n_upd, "deletes": n_del, "inserts": n_new}


def reference(events_glob: list[str], erased: list[int], scratch: Path) -> dict[str, int]:
    """The live rows the contract promises, from the generated events alone: count, and sums over (id, ts_ms).

    The latest event of each key wins (no two events of a key share a ``ts_ms`` here: every hour's are later
    than the hour before, and a key changes at most once an hour); a key whose latest event is a delete is not
    live; an erased key is gone from every version.
    """
    con = duckdb.connect(str(scratch / "reference.duckdb"))
    try:
        con.execute("SET memory_limit = '2GB'; SET threads = 2")
        files = ", ".join(f"'{g}'" for g in events_glob)
        row = con.execute(
            f"""
            WITH latest AS (
                SELECT id, arg_max(op, ts_ms) AS op, max(ts_ms) AS ts_ms
                FROM read_parquet([{files}]) GROUP BY id
            )
            SELECT {FIGURES} FROM latest WHERE op <> 'd' AND NOT list_contains(?, id)
            """,
            [erased],
        ).fetchone()
    finally:
        con.close()
        (scratch / "reference.duckdb").unlink(missing_ok=True)
    assert row is not None
    return {"rows": int(row[0]), "sum_id": int(row[1]), "sum_ts": int(row[2]), "hash": int(row[3])}


def live(cfg: TableConfig) -> dict[str, int]:
    """The same figures of the live version's visible rows, read from its files (no metastore, no project rule)."""
    lake = Lake(cfg)
    commit = lake.latest_commit()
    dirs = list(commit.partitions.values()) if commit.partitions is not None else [lake.live_location()]
    files = [str(p) for d in dirs for p in Path(d).rglob("*.parquet") if not p.name.startswith((".", "_"))]
    con = duckdb.connect()
    try:
        con.execute("SET threads = 2")
        row = con.execute(
            f"SELECT {FIGURES} FROM read_parquet(?, union_by_name = true)",
            [files],
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return {"rows": int(row[0]), "sum_id": int(row[1]), "sum_ts": int(row[2]), "hash": int(row[3])}


# ---------------------------------------------------------------------------- runs
class Runner:
    """Runs tasks and operations each in its own measured process; keeps every measurement."""

    def __init__(self, work: Path, registry: Path, ms: LocalMetastore, env: dict[str, str]) -> None:
        self.work = work
        self.registry = registry
        self.metastore = f"{ms.host}:{ms.port}"
        self.warehouse = str(work / "warehouse")
        self.env = env
        self.count = 0

    def _wrapped(self, name: str, args: list[str]) -> dict[str, Any]:
        self.count += 1
        out = self.work / "peaks" / f"{self.count:04d}-{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        log_file = self.work / "logs" / f"{self.count:04d}-{name}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with open(log_file, "wb") as sink:
            proc = subprocess.run(
                [sys.executable, TASK, "--peak-out", str(out), *args],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=self.env,
                check=False,
                cwd=ROOT,
            )
        wall = time.monotonic() - start
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"{name} failed (exit {proc.returncode}); {log_file}:\n{tail}")
        result = json.loads(out.read_text())
        result["process_wall_s"] = round(wall, 3)
        log.info("%s: %.1f s, peak %.0f MB", name, wall, result["peak_mb"])
        return result

    def step(
        self, cfg: TableConfig, step: str, plan: str = "", run_id: str = "", force: bool = False
    ) -> dict[str, Any]:
        args = [
            "step",
            step,
            cfg.qualified_name,
            "--registry-dir",
            str(self.registry),
            "--metastore",
            self.metastore,
            "--warehouse",
            self.warehouse,
            "--plan",
            plan,
            "--run-id",
            run_id,
        ]
        return self._wrapped(f"{cfg.table}-{step}", [*args, *(["--force"] if force else [])])

    def cli(self, cfg: TableConfig, name: str, argv: list[str]) -> dict[str, Any]:
        return self._wrapped(f"{cfg.table}-{name}", ["cli", *argv])

    def baseline(self) -> dict[str, Any]:
        return self._wrapped("baseline", ["baseline"])

    def run(self, cfg: TableConfig, run_id: str, force: bool = False) -> dict[str, Any]:
        """One whole run of the table's DAG: every step measured; the compaction as the DAG's spark-submit."""
        tasks: dict[str, Any] = {}
        tasks["ensure_tables"] = self.step(cfg, "ensure_tables")
        tasks["plan"] = self.step(cfg, order.PLAN, run_id=run_id, force=force)
        plan = str(tasks["plan"]["result"] or "")
        # As the DAG does: a plan that decided not to compact (compaction.policy) runs no job, and the steps
        # after it skip themselves but refresh_view.
        if plan and policy.deferred(json.loads(Path(plan).read_text(encoding="utf-8"))) is None:
            job = run_measured(
                f"{cfg.table}-compact",
                submit_command(cfg, plan),
                self.work / "logs" / f"{run_id}.log",
                env=self.env,
                timeout_s=6 * 3600,
            )
            if job.returncode != 0:
                raise RuntimeError(f"{cfg.qualified_name}: the compaction failed; see {job.log_file}")
            tasks["compact_spark"] = job.to_dict()
        for step in order.after(order.COMPACT):
            if plan or not step.takes_plan:
                tasks[step.id] = self.step(cfg, step.id, plan=plan, run_id=run_id)
        return tasks


def table_doc(name: str, lake: Path, partitioned: bool, args: argparse.Namespace) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "database": DATABASE,
        "table": name,
        "description": f"bench/scale_day.py: {'partitioned by day' if partitioned else 'unpartitioned'}",
        "columns": COLUMNS,
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": str(lake / name),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "schedule": None,
        "retries": 0,
        "change_feed": True,
        "spark": {"engine": "spark_submit", "driver_memory": args.driver_memory, "target_file_mb": args.target_file_mb},
    }
    if partitioned:
        doc["partition_by"] = {"column": "event_day", "transform": "day"}
    elif args.flat_compact_every > 1:
        # As a 50M-row unpartitioned table would run in production: every run refreshes the view over the base
        # and the pending hours, and the base is rewritten once that many hours' files wait (each hour lands
        # FILES_PER_HOUR files), not every hour.
        doc["compaction"] = {
            "policy": "threshold",
            "pending_files": FILES_PER_HOUR * args.flat_compact_every,
            "pending_rows_ratio": None,
            "pending_age": None,
        }
    return doc


def day(args: argparse.Namespace, runner: Runner, cfg: TableConfig, rows: int, recent: bool) -> dict[str, Any]:
    """One table's load, day of hourly runs, operations and checks."""
    work = runner.work
    data = work / "data" / cfg.table
    landing = Path(Lake(cfg).layout.incremental)
    started = time.monotonic()
    generate_initial(data / INITIAL, rows, args.partitions)
    shutil.copytree(data / INITIAL, landing / INITIAL)
    generated_s = time.monotonic() - started
    load = runner.run(cfg, f"{cfg.table}_load", force=True)
    hours: list[dict[str, Any]] = []
    # (commit seq, the last hour it holds) of every version the day made: the load's, then each compaction's.
    # Under a threshold policy a run that does not compact makes none; the base then holds the hours up to
    # the last compaction (the view the ones after it).
    versions = [(Lake(cfg).latest_commit().seq, 0)]
    for hour in range(1, args.hours + 1):
        name = hour_name(hour)
        made = generate_hour(data / name, rows, args.partitions, hour, args.hourly_fraction, recent)
        shutil.copytree(data / name, landing / name)
        tasks = runner.run(cfg, f"{cfg.table}_{name}")
        if "compact_spark" in tasks:
            versions.append((Lake(cfg).latest_commit().seq, hour))
        hours.append({"hour": hour, "increment": name, **made, "tasks": tasks})
    if len(versions) < 3:
        raise RuntimeError(f"{cfg.qualified_name}: {len(versions) - 1} compactions in the day; the rollback needs 2")

    def events(through: int) -> list[str]:
        """The generated events a version holding the hours up to ``through`` was compacted from."""
        return [str(data / INITIAL / "*.parquet")] + [
            str(data / hour_name(h) / "*.parquet") for h in range(1, through + 1)
        ]

    seqs = [seq for seq, _ in versions]
    checks: dict[str, Any] = {
        "after_day": {"live": live(cfg), "expected": reference(events(versions[-1][1]), [], work)}
    }
    ops: dict[str, Any] = {}
    reg = ["--registry-dir", str(runner.registry)]
    ops["status"] = runner.cli(cfg, "status", ["status", cfg.qualified_name, *reg, "--json"])
    ops["versions"] = runner.cli(cfg, "versions", ["versions", cfg.qualified_name, *reg, "--json"])
    feed = str(work / "feeds" / f"{cfg.table}.parquet")
    Path(feed).parent.mkdir(parents=True, exist_ok=True)
    ops["changes"] = runner.cli(
        cfg,
        "changes",
        [
            "changes",
            cfg.qualified_name,
            *reg,
            "--from",
            str(seqs[-2]),
            "--to",
            str(seqs[-1]),
            "--format",
            "parquet",
            "--out",
            feed,
        ],
    )
    ops["changes"]["rows"] = pq.read_metadata(feed).num_rows
    erased = int(rows // 3)  # an initial key, in a middle partition
    ops["erase"] = runner.cli(cfg, "erase", ["erase", cfg.qualified_name, *reg, "--where", f"id = {erased}", "--yes"])
    checks["after_erase"] = {"live": live(cfg), "expected": reference(events(versions[-1][1]), [erased], work)}
    ops["rollback"] = runner.cli(
        cfg,
        "rollback",
        ["rollback", cfg.qualified_name, *reg, "--to", str(seqs[-2]), "--yes", "--metastore", runner.metastore],
    )
    checks["after_rollback"] = {"live": live(cfg), "expected": reference(events(versions[-2][1]), [erased], work)}
    if cfg.partition_by is not None:
        ops["index_verify"] = runner.cli(cfg, "index_verify", ["index", "verify", cfg.qualified_name, *reg])
    for check in checks.values():
        check["equal"] = check["live"] == check["expected"]
    airflow_peaks = [
        (f"{where}:{task}", t["peak_mb"])
        for where, tasks in [("load", load), *[(h["increment"], h["tasks"]) for h in hours]]
        for task, t in tasks.items()
        if "peak_mb" in t
    ] + [(f"op:{k}", v["peak_mb"]) for k, v in ops.items()]
    worst = max(airflow_peaks, key=lambda kv: kv[1])
    return {
        "table": cfg.qualified_name,
        "rows": rows,
        "partitioned": cfg.partition_by is not None,
        "generated_initial_s": round(generated_s, 1),
        "load": load,
        "hours": hours,
        "operations": ops,
        "checks": checks,
        "all_equal": all(c["equal"] for c in checks.values()),
        "peak_by_task_mb": _peak_by_task(load, hours, ops),
        "worst_airflow_peak": {"what": worst[0], "mb": worst[1]},
        "compact_wall_s": [h["tasks"]["compact_spark"]["wall_s"] for h in hours if "compact_spark" in h["tasks"]],
        "versions": [{"seq": seq, "through_hour": through} for seq, through in versions],
        "total_s": round(time.monotonic() - started, 1),
    }


def _peak_by_task(load: dict[str, Any], hours: list[dict[str, Any]], ops: dict[str, Any]) -> dict[str, float]:
    peaks: dict[str, float] = {}
    for tasks in [load, *[h["tasks"] for h in hours], ops]:
        for task, t in tasks.items():
            if "peak_mb" in t:
                peaks[task] = max(peaks.get(task, 0.0), t["peak_mb"])
    return peaks


def run(args: argparse.Namespace) -> dict[str, Any]:
    from cdc_compaction.devtools.devenv import airflow_env

    started = time.monotonic()
    work = Path(args.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    registry = work / "registry"
    registry.mkdir(parents=True)
    import yaml

    tables = {"flat": (args.rows, False), "parted": (args.partitioned_rows, True)}
    chosen = [t for t in args.tables.split(",") if t]
    for name in chosen:
        rows, partitioned = tables[name]
        (registry / f"{DATABASE}.{name}.yaml").write_text(
            yaml.safe_dump(table_doc(name, work / "lake", partitioned, args))
        )
    ms = LocalMetastore(work / "metastore", port=free_port(), warehouse=work / "warehouse")
    ms.start()
    try:
        env = {**os.environ, **airflow_env(work / "airflow", ms.uri, warehouse_dir=work / "warehouse")}
        env["CDC_REGISTRY_DIR"] = str(registry)
        # The DAG's SparkSubmitOperator (submit_command) reads the spark_default connection from this environment.
        os.environ.update(env)
        runner = Runner(work, registry, ms, env)
        baseline = runner.baseline()
        per_table = []
        for name in chosen:
            rows, partitioned = tables[name]
            cfg = load_table(registry, f"{DATABASE}.{name}")
            per_table.append(day(args, runner, cfg, rows, recent=partitioned))
    finally:
        ms.stop()
    met = all(t["worst_airflow_peak"]["mb"] <= TARGET_PEAK_MB for t in per_table)
    return {
        "name": "scale_day",
        "description": (
            f"{args.hours} hourly runs with the change feed, then status, versions, changes, erase, rollback "
            "(and index verify): every Airflow-side task's own peak memory, in a process of its own"
        ),
        "target": f"every Airflow-side task's peak <= {TARGET_PEAK_MB} MB, whatever the table's size",
        "met": bool(met),
        "all_equal": all(t["all_equal"] for t in per_table),
        "command": "python bench/scale_day.py " + " ".join(sys.argv[1:]),
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]},
        "baseline_peak_mb": baseline["peak_mb"],
        "hourly_fraction": args.hourly_fraction,
        "tables": per_table,
        "total_s": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale_day.json"))
    parser.add_argument("--rows", type=int, default=50_000_000, help="keys of the unpartitioned table")
    parser.add_argument("--partitioned-rows", type=int, default=20_000_000, help="keys of the partitioned table")
    parser.add_argument("--partitions", type=int, default=100, help="days the keys are spread over")
    parser.add_argument("--hours", type=int, default=24, help="hourly runs after the load")
    parser.add_argument("--hourly-fraction", type=float, default=0.001, help="an hour's events, as a share of the keys")
    parser.add_argument("--tables", default="flat,parted", help="which tables: flat, parted")
    parser.add_argument(
        "--flat-compact-every",
        type=int,
        default=1,
        help="the unpartitioned table compacts once this many hours wait (compaction.policy threshold on its"
        " pending files); every run still refreshes its view. 1: every hour (policy always)",
    )
    parser.add_argument("--driver-memory", default="6g", help="spark.driver_memory of the compaction (Spark's side)")
    parser.add_argument("--target-file-mb", type=int, default=128)
    parser.add_argument("--work", default=str(ROOT / ".run" / "bench-scale"), help="work directory (wiped)")
    args = parser.parse_args(argv)
    if args.hours < 2:
        parser.error("--hours must be at least 2 (the rollback goes back one hour)")
    if args.flat_compact_every < 1 or args.hours < 2 * args.flat_compact_every:
        parser.error("--flat-compact-every must be at least 1 and at most half of --hours (the rollback needs two)")
    start_logging()
    # Hours at the default sizes, so being stopped is ordinary: SIGTERM unwinds, and the finally blocks stop
    # the metastore and the running compaction (tests/e2e/test_bench.py).
    with sigterm_unwinds():
        result = run(args)
    write_result(args.out, result)
    for t in result["tables"]:
        sys.stdout.write(
            f"scale_day {t['table']} {t['rows']} rows: worst Airflow-side peak {t['worst_airflow_peak']['mb']} MB "
            f"({t['worst_airflow_peak']['what']}); compactions {t['compact_wall_s']} s; rows equal the reference: "
            f"{t['all_equal']}\n"
        )
    sys.stdout.write(f"target ({result['target']}): {'met' if result['met'] else 'NOT met'}\n")
    return 0 if result["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
