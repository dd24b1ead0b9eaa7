"""Compaction only when it pays: a simulated day of hourly runs under three ``compaction`` policies.

One deterministic data set: a base of ``--rows`` keys and ``--hours`` hourly increments of
``--hourly-rows`` events each (updates of existing keys, inserts, deletes).  Three tables get
the same files:

* ``always``: every run compacts (the default policy);
* ``files``: ``policy: threshold`` with ``pending_files: --files`` only;
* ``ratio``: ``policy: threshold`` with ``pending_rows_ratio: --ratio`` and ``pending_age: --age``.

Each table's base is loaded and compacted once first (forced; not counted; it also warms the
JVM up).  Then, hour by hour, the tables in turn, each table gets its increment and one whole
run of the pipeline's steps in this process
(``plan`` ... ``refresh_view``; the compaction job in this process's SparkSession: the
in-process ``SessionEngine`` path, one JVM for everything).  The simulated clock is passed to
``plan`` (the age threshold sees simulated hours).  Measured per run: its wall time and whether
it compacted; after each run the view's read time -- a full scan (``count(*)``, ``sum(amount)``)
of ``<t>_view`` with Spark through the metastore, and of the DuckDB view the project publishes
(``views.duckdb``) with DuckDB.  The result checks that the three views end with the same rows.

    python bench/policy_day.py --out bench/results/policy_day.json [--rows 1000000 --hourly-rows 10000]

Target: a threshold policy costs the day less run time than ``always``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from measure import start_logging, write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

from cdc_compaction.core.lake import Lake  # noqa: E402
from cdc_compaction.core.registry import parse_table  # noqa: E402
from cdc_compaction.core.settings import MetastoreEndpoint  # noqa: E402
from cdc_compaction.core.sql import table_names  # noqa: E402
from cdc_compaction.devtools.local_services import LocalMetastore, free_port  # noqa: E402
from cdc_compaction.integrations.engine import SessionEngine, local_session  # noqa: E402
from cdc_compaction.pipeline import order  # noqa: E402
from cdc_compaction.pipeline.plan import plan  # noqa: E402
from cdc_compaction.pipeline.runtime import Runtime, load_plan  # noqa: E402
from cdc_compaction.pipeline.tables import ensure_tables  # noqa: E402

log = logging.getLogger("bench.policy_day")

SEED = 20261126
DATABASE = "bench_policy"
COLUMNS = [
    {"name": "id", "type": "bigint"},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": "bigint"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
]
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.int64()), ("op", pa.string()),
                    ("ts_ms", pa.int64())])  # fmt: skip


def increment_name(hour: datetime) -> str:
    return f"increment_{hour:%Y%m%d%H}"


def generate(data: Path, rows: int, hourly: int, hours: int, start: datetime) -> list[str]:
    """The base (the hour before ``start``) and ``hours`` hourly increments, one Parquet file each."""
    rng = np.random.default_rng(SEED)
    names: list[str] = []
    next_id = rows

    def write(name: str, ids: np.ndarray, ops: np.ndarray, ts: int) -> None:
        n = len(ids)
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "name": pa.array([f"name-{i % 9973}" for i in ids], pa.string()),
                "amount": pa.array(rng.integers(0, 10_000, n), pa.int64()),
                "op": pa.array(ops, pa.string()),
                "ts_ms": pa.array(np.full(n, ts), pa.int64()),
            },
            schema=SCHEMA,
        )
        (data / name).mkdir(parents=True, exist_ok=True)
        pq.write_table(table, data / name / "part-00000.parquet")
        names.append(name)

    base_hour = start - timedelta(hours=1)
    write(increment_name(base_hour), np.arange(rows), np.full(rows, "c"), int(base_hour.timestamp() * 1000))
    for h in range(hours):
        hour = start + timedelta(hours=h)
        n_upd, n_ins = int(hourly * 0.6), int(hourly * 0.3)
        n_del = hourly - n_upd - n_ins
        existing = rng.choice(next_id, size=n_upd + n_del, replace=False)
        inserts = np.arange(next_id, next_id + n_ins)
        next_id += n_ins
        ids = np.concatenate([existing[:n_upd], inserts, existing[n_upd:]])
        ops = np.array(["u"] * n_upd + ["c"] * n_ins + ["d"] * n_del)
        write(increment_name(hour), ids, ops, int(hour.timestamp() * 1000) + 1)
    return names


def registry_doc(table: str, lake: Path, compaction: dict[str, Any]) -> dict[str, Any]:
    return {
        "database": DATABASE,
        "table": table,
        "columns": COLUMNS,
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": str(lake / table),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        # The simulated clock runs behind the real one: a lease taken at a simulated hour must not look expired.
        "lease_timeout": "30d",
        "views": {"duckdb": str(lake / f"{table}.duckdb")},
        "compaction": compaction,
    }


class Table:
    """One bench table: its runtime, one whole run of the pipeline's steps, and its views' read times."""

    def __init__(self, key: str, cfg: Any, endpoint: MetastoreEndpoint, spark: Any) -> None:
        self.key, self.cfg, self.spark = key, cfg, spark
        self.rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=SessionEngine(spark))
        self.names = table_names(cfg)

    def land(self, data: Path, name: str) -> None:
        shutil.copytree(data / name, Path(self.rt.lake.layout.incremental) / name)

    def run(self, run_id: str, now: datetime, force: bool = False) -> dict[str, Any]:
        """plan ... refresh_view, timed; whether it compacted (the plan's decision)."""
        start = time.monotonic()
        path = plan(self.rt, run_id, now=now, force=force)
        for step in order.after(order.PLAN):
            step.call(self.rt, path, run_id)
        wall = time.monotonic() - start
        decision = load_plan(self.rt, path).get("compaction", {}) if path else {}
        return {"wall_s": round(wall, 3), "compacted": bool(decision.get("compact")), "reason": decision.get("reason")}

    def read_spark(self) -> tuple[float, tuple[int, int]]:
        for t in ("base_table", "incremental_table"):
            self.spark.catalog.refreshTable(f"`{DATABASE}`.`{self.names[t]}`")
        start = time.monotonic()
        row = self.spark.sql(f"SELECT count(*) AS n, sum(amount) AS s FROM `{DATABASE}`.`{self.names['view_name']}`")
        n, s = row.collect()[0]
        return round(time.monotonic() - start, 3), (int(n), int(s or 0))

    def read_duckdb(self) -> tuple[float | None, tuple[int, int] | None]:
        import duckdb

        db = self.cfg.views.duckdb
        if not db or not Path(db).exists():
            return None, None
        con = duckdb.connect(db, read_only=True)
        try:
            con.execute("SET TimeZone = 'UTC'")
            start = time.monotonic()
            n, s = con.execute(f'SELECT count(*), sum(amount) FROM "{DATABASE}"."{self.names["view_name"]}"').fetchone()
            return round(time.monotonic() - start, 3), (int(n), int(s or 0))
        finally:
            con.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    work = Path(args.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    now_real = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    # The simulated day ends before the real now: plan's clock and the files' listing agree.
    start = now_real - timedelta(hours=args.hours + 2)
    incs = generate(work / "data", args.rows, args.hourly_rows, args.hours, start)
    policies = {
        "always": {"policy": "always"},
        "files": {"policy": "threshold", "pending_files": args.files, "pending_rows_ratio": None, "pending_age": None},
        "ratio": {
            "policy": "threshold",
            "pending_rows_ratio": args.ratio,
            "pending_files": None,
            "pending_age": args.age,
        },
    }
    ms = LocalMetastore(work / "metastore", port=free_port(), warehouse=work / "warehouse")
    ms.start()
    try:
        endpoint = MetastoreEndpoint(ms.host, ms.port)
        spark = local_session(endpoint, str(work / "warehouse"), app_name="bench-policy-day")
        tables = {
            key: Table(key, parse_table(registry_doc(f"day_{key}", work / "lake", pol)), endpoint, spark)
            for key, pol in policies.items()
        }
        out: dict[str, Any] = {}
        # Every table's base first (they warm the JVM up), then the day hour by hour, the tables in turn:
        # no policy pays the first compactions' warm-up alone.
        for key, t in tables.items():
            ensure_tables(t.rt)
            t.land(work / "data", incs[0])
            initial = t.run("initial", start, force=True)
            log.info("%s: base loaded in %.1f s", key, initial["wall_s"])
            out[key] = {"policy": policies[key], "initial_load_s": initial["wall_s"], "runs": []}
        for h, name in enumerate(incs[1:]):
            now = start + timedelta(hours=h + 1, minutes=5)
            for key, t in tables.items():
                t.land(work / "data", name)
                r = t.run(f"hour_{h:02d}", now)
                r["hour"] = h
                r["view_spark_s"], spark_result = t.read_spark()
                r["view_duckdb_s"], duck_result = t.read_duckdb()
                r["view_rows"] = spark_result[0]
                if duck_result is not None and duck_result != spark_result:
                    raise RuntimeError(f"{key} hour {h}: DuckDB view {duck_result} != Spark view {spark_result}")
                out[key]["runs"].append(r)
                out[key]["final_view"] = spark_result
                log.info("%s hour %d: %s", key, h, r)
        spark.stop()
    finally:
        ms.stop()
    finals = {k: v["final_view"] for k, v in out.items()}
    summary = {k: summarise(v["runs"]) for k, v in out.items()}
    metrics: dict[str, Any] = {}
    for k, s in summary.items():
        for m, value in s.items():
            metrics[f"{k}_{m}"] = value
    met = all(summary[k]["total_run_s"] < summary["always"]["total_run_s"] for k in ("files", "ratio"))
    return {
        "name": "policy_day",
        "description": (
            f"a simulated day: {args.hours} hourly increments of {args.hourly_rows} events into a {args.rows}-row "
            "table under compaction.policy always vs threshold (pending_files "
            f"{args.files}; pending_rows_ratio {args.ratio} + pending_age {args.age}); steps in process, the job "
            "in this process's SparkSession (SessionEngine), local Thrift metastore; views read with Spark and DuckDB"
        ),
        "target": "each threshold policy's total_run_s < always's total_run_s",
        "met": bool(met),
        "metrics": metrics,
        "same_final_view": len(set(map(tuple, finals.values()))) == 1,
        "final_view": finals,
        "tables": out,
        "host": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]},
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "total_s": round(time.monotonic() - started, 1),
        "command": "python bench/policy_day.py " + " ".join(sys.argv[1:]),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A policy's day: total and per-kind run time, compactions, view read times (mean, max, last)."""
    compacting = [r["wall_s"] for r in runs if r["compacted"]]
    refreshing = [r["wall_s"] for r in runs if not r["compacted"]]
    spark_reads = [r["view_spark_s"] for r in runs]
    duck_reads = [r["view_duckdb_s"] for r in runs if r["view_duckdb_s"] is not None]
    return {
        "total_run_s": round(sum(r["wall_s"] for r in runs), 2),
        "compactions": len(compacting),
        "mean_compacting_run_s": round(statistics.mean(compacting), 3) if compacting else None,
        "mean_view_only_run_s": round(statistics.mean(refreshing), 3) if refreshing else None,
        "view_spark_mean_s": round(statistics.mean(spark_reads), 3) if spark_reads else None,
        "view_spark_max_s": max(spark_reads, default=None),
        "view_duckdb_mean_s": round(statistics.mean(duck_reads), 3) if duck_reads else None,
        "view_duckdb_max_s": max(duck_reads, default=None),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "policy_day.json"))
    parser.add_argument("--rows", type=int, default=1_000_000, help="keys of the base")
    parser.add_argument("--hourly-rows", type=int, default=10_000, help="events per hourly increment")
    parser.add_argument("--hours", type=int, default=24, help="hourly increments in the day")
    parser.add_argument("--files", type=int, default=6, help="the 'files' policy's pending_files")
    parser.add_argument("--ratio", type=float, default=0.05, help="the 'ratio' policy's pending_rows_ratio")
    parser.add_argument("--age", default="12h", help="the 'ratio' policy's pending_age")
    parser.add_argument("--work", default=str(ROOT / ".run" / "bench-policy-day"), help="work directory (wiped)")
    args = parser.parse_args(argv)
    start_logging()
    result = run(args)
    write_result(args.out, result)
    m = result["metrics"]
    line = "; ".join(
        f"{k}: {m[f'{k}_total_run_s']} s, {m[f'{k}_compactions']} compactions, view {m[f'{k}_view_spark_mean_s']} s"
        for k in ("always", "files", "ratio")
    )
    # The one-line summary (stdout; the log goes to stderr).
    sys.stdout.write(f"policy_day: {line}; same final view: {result['same_final_view']}; met: {result['met']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
