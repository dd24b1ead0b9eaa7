"""Partitioned tables: a compaction's cost follows the change, not the table (registry ``partition_by``).

Per size (``--sizes``, keys of the initial load), deterministic data sets (keys spread over
``--partitions`` days) fed to tables through the real pipeline (``ensure_tables``, ``plan``, the
DAG's spark-submit, ``validate``, ``publish``, ``archive``):

* ``flat``: ``partition_by`` unset: every compaction rewrites the whole base;
* ``parted``: ``partition_by: {column: event_day, transform: day}``, once per key layout
  (``--keys``): ``clustered`` (auto-increment ids in time partitions: a day holds a block of ids)
  and ``scattered`` (a day holds every ``partitions``-th id: the changed keys span the key range).

Each table gets the initial load, then one increment of a fixed size (``--change-rows`` events,
whatever the table's size) that touches ``--touched`` of the partitions: updates, key-only deletes
that find their partition through the key index, and inserts of new keys. Measured per
compaction of that increment: the wall time of the ``compact`` task's spark-submit (the DAG's own
command line) and the job's own time inside it (from its first to its last log line, i.e. without
the JVM and SparkSession start, which costs the same whatever the data). ``flat`` runs on the
clustered data set; the result checks that it ends with the same rows as ``parted``.

    python bench/partitioned.py --out bench/results/partitioned.json [--sizes 1000000,5000000,20000000]

Writes the JSON and prints one summary line per size. The full default takes about an hour on 2
cores (the 20M-row flat table's load and rewrite dominate); ``--sizes 20000`` is a smoke run.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import job_profile
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from measure import start_logging, write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))

from cdc_compaction.core.lake import Lake  # noqa: E402
from cdc_compaction.core.registry import TableConfig, parse_table  # noqa: E402
from cdc_compaction.core.settings import MetastoreEndpoint  # noqa: E402
from cdc_compaction.devtools.local_services import LocalMetastore, free_port  # noqa: E402
from cdc_compaction.integrations.engine import SparkSubmitEngine  # noqa: E402
from cdc_compaction.pipeline import order  # noqa: E402
from cdc_compaction.pipeline.runtime import Runtime  # noqa: E402
from cdc_compaction.pipeline.tables import ensure_tables  # noqa: E402

log = logging.getLogger("bench.partitioned")

SEED = 20261122
TARGET_RATIO = 0.10
#: The size the ratio target is held at (the nearest one run).
TARGET_ROWS = 5_000_000
INITIAL = "increment_2026010100"
CHANGE = "increment_2026020100"
DAY0 = date(2026, 1, 1)
T0_MS = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
ROWS_PER_FILE = 250_000
#: Shares of a touched partition's keys that the increment updates, deletes (key only) and adds.
UPDATES, DELETES, INSERTS = 0.20, 0.02, 0.01

COLUMNS: list[dict[str, str]] = [
    {"name": "id", "type": "bigint"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
    {"name": "event_day", "type": "date"},
    {"name": "customer_id", "type": "bigint"},
    {"name": "full_name", "type": "string"},
    {"name": "email", "type": "string"},
    {"name": "city", "type": "string"},
    {"name": "status", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "balance", "type": "double"},
    {"name": "quantity", "type": "int"},
    {"name": "updated_at", "type": "timestamp"},
]
_ARROW = {
    "bigint": pa.int64(),
    "int": pa.int32(),
    "string": pa.string(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}
SCHEMA = pa.schema([(c["name"], _ARROW[c["type"]]) for c in COLUMNS])


# ---------------------------------------------------------------------------- data
def _pool(rng: np.random.Generator, n: int, length: int) -> pa.Array:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return pa.array(["".join(rng.choice(letters, length)) for _ in range(n)])


def _rows(rng: np.random.Generator, ids: np.ndarray, days: np.ndarray, op: str, ts_ms: np.ndarray) -> pa.Table:
    """Events for ``ids`` (``days`` as day offsets; -1 is a key-only delete: everything else NULL)."""
    n = len(ids)
    names, cities = _pool(rng, 5000, 12), _pool(rng, 300, 8)
    key_only = days < 0
    mask = pa.array(key_only)

    def nulled(arr: pa.Array) -> pa.Array:
        return pc.if_else(mask, pa.nulls(n, arr.type), arr) if key_only.any() else arr

    epoch_day = (DAY0 - date(1970, 1, 1)).days
    day_values = pa.array((np.maximum(days, 0) + epoch_day).astype(np.int32)).cast(pa.date32())
    cols = {
        "id": pa.array(ids, pa.int64()),
        "op": pa.array([op] * n),
        "ts_ms": pa.array(ts_ms, pa.int64()),
        "event_day": nulled(day_values),
        "customer_id": nulled(pa.array(rng.integers(1, 10**7, n), pa.int64())),
        "full_name": nulled(names.take(pa.array(rng.integers(0, len(names), n)))),
        "email": nulled(pc.binary_join_element_wise(names.take(pa.array(rng.integers(0, 5000, n))), "x.io", "@")),
        "city": nulled(cities.take(pa.array(rng.integers(0, len(cities), n)))),
        "status": nulled(pa.array(rng.choice(np.array(["new", "paid", "shipped", "closed"]), n))),
        "amount": nulled(pa.array(np.round(rng.random(n) * 1000, 2))),
        "balance": nulled(pa.array(np.round(rng.random(n) * 10000, 2))),
        "quantity": nulled(pa.array(rng.integers(1, 100, n), pa.int32())),
        "updated_at": nulled(pa.array((T0_MS + ts_ms) * 1000, pa.timestamp("us", tz="UTC"))),
    }
    return pa.table(cols, schema=SCHEMA)


def _write(table: pa.Table, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for i, start in enumerate(range(0, max(table.num_rows, 1), ROWS_PER_FILE)):
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(table.slice(start, ROWS_PER_FILE), path)
        files.append(path)
    return files


def day_of(ids: np.ndarray, rows: int, partitions: int, keys: str) -> np.ndarray:
    """Each key's day (partition offset): a block of ids per day (clustered), or id modulo days (scattered)."""
    if keys == "clustered":
        return ids // math.ceil(rows / partitions)
    return ids % partitions


def generate(
    data: Path, rows: int, partitions: int, touched_fraction: float, change_rows: int, keys: str
) -> dict[str, Any]:
    """The initial load and the change increment (deterministic: same arguments, same files).

    The change has ``change_rows`` events whatever ``rows``: in each touched partition, updates,
    key-only deletes and inserts in the shares :data:`UPDATES`, :data:`DELETES`, :data:`INSERTS`.
    New keys are new ids above every existing one (clustered: as an auto-increment id does).
    """
    rng = np.random.default_rng([SEED, rows, partitions])
    ids = np.arange(rows, dtype=np.int64)
    days = day_of(ids, rows, partitions, keys)
    initial = _rows(rng, ids, days, "c", ids)
    shutil.rmtree(data, ignore_errors=True)
    _write(initial, data / INITIAL)
    touched = sorted(
        {(partitions // 2 + i) % partitions for i in range(max(1, math.ceil(partitions * touched_fraction)))}
    )
    per_partition = max(1, change_rows // len(touched))
    total = UPDATES + DELETES + INSERTS
    parts = []
    for n, p in enumerate(touched):
        in_p = ids[days == p]
        picked = rng.permutation(in_p)
        n_upd = min(len(in_p), round(per_partition * UPDATES / total))
        n_del = min(len(in_p) - n_upd, round(per_partition * DELETES / total))
        n_new = max(0, per_partition - n_upd - n_del)
        upd, dele = picked[:n_upd], picked[n_upd : n_upd + n_del]
        new = rows + n * per_partition + np.arange(n_new, dtype=np.int64)
        for chunk, op, day in ((upd, "u", p), (dele, "d", -1), (new, "c", p)):
            ts = rows + 10**6 + rng.integers(0, 10**6, len(chunk))
            parts.append(_rows(rng, chunk, np.full(len(chunk), day), op, ts))
    change = pa.concat_tables(parts)
    _write(change, data / CHANGE)
    return {
        "keys": keys,
        "initial_rows": initial.num_rows,
        "change_rows": change.num_rows,
        "touched_partitions": [str(DAY0 + timedelta(days=p)) for p in touched],
    }


# --------------------------------------------------------------------------- pipeline
def registry_doc(table: str, lake: Path, partitioned: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "database": "bench",
        "table": table,
        "columns": COLUMNS,
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": str(lake / table),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "schedule": None,
        "retries": 0,
        # 32 MB files: the flat table's rewrite keeps both cores busy (it coalesces to its file count).
        "spark": {"driver_memory": "2g", "target_file_mb": 32},
    }
    if partitioned:
        doc["partition_by"] = {"column": "event_day", "transform": "day"}
    return doc


def submit_command(cfg: TableConfig, plan_path: str) -> list[str]:
    """The spark-submit command line of the table's DAG ``compact`` task (from its SparkSubmitOperator)."""
    from cdc_compaction.airflow.factory import build_dag

    op = build_dag(cfg).get_task("compact")
    op.application_args = ["--plan", plan_path]
    return op._get_hook()._build_spark_submit_command(op.application)


def job_seconds(log_file: Path) -> float | None:
    """The job's own time: from its 'compacting' to its 'compacted' log line (no JVM or session start)."""
    return job_profile.own_seconds(log_file.read_text(errors="replace").splitlines())


class CollectSql:
    """An engine that only collects DDL, so that both tables' DDL runs in one spark-submit (one JVM start)."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def run_sql(self, cfg: TableConfig, statements: list[str]) -> None:
        self.statements += statements


class Table:
    """One bench table: its runtime on the bench metastore, and one whole run of its DAG's steps."""

    def __init__(self, cfg: TableConfig, endpoint: MetastoreEndpoint, warehouse: str, logs: Path) -> None:
        self.cfg = cfg
        self.rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=SparkSubmitEngine(endpoint, warehouse))
        self.logs = logs

    def land(self, source: Path) -> None:
        shutil.copytree(source, Path(self.rt.lake.layout.incremental) / source.name)

    def compact(self, run_id: str) -> dict[str, Any]:
        """plan, the measured spark-submit, validate, publish, archive."""
        plan_path = ""
        for step in order.between(order.STEP_IDS[0], order.PLAN):
            result = step.call(self.rt, run_id=run_id)
            if step.id == order.PLAN:
                plan_path = result
        log_file = self.logs / f"{self.cfg.table}_{run_id}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with open(log_file, "wb") as out:
            proc = subprocess.run(
                submit_command(self.cfg, plan_path), stdout=out, stderr=subprocess.STDOUT, check=False
            )
        wall = round(time.monotonic() - start, 3)
        if proc.returncode != 0:
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(
                f"compaction of {self.cfg.qualified_name} failed ({proc.returncode}); {log_file}:\n{tail}"
            )
        # The steps after the compaction that work on its plan (validate, publish, archive).
        for step in order.after(order.COMPACT):
            if step.takes_plan:
                step.call(self.rt, plan_path)
        stats = self.rt.lake.latest_commit().stats
        keys = (
            "base_rows",
            "increment_rows",
            "output_rows",
            "partitions_rewritten",
            "partitions_reused",
            "key_lookup",
        )
        return {"wall_s": wall, "job_s": job_seconds(log_file), **{k: stats[k] for k in keys if k in stats}}

    def rows(self) -> pa.Table:
        """The live version's rows (id, op, ts_ms), read the way a reader without a metastore would."""
        commit = self.rt.lake.latest_commit()
        dirs = list(commit.partitions.values()) if commit.partitions is not None else [self.rt.lake.live_location()]
        tables = [pq.read_table(d, columns=["id", "op", "ts_ms"]) for d in dirs]
        return pa.concat_tables(tables).sort_by("id")


def _ratio(part: float | None, whole: float | None) -> float | None:
    return round(part / whole, 3) if part and whole else None


def run_size(args: argparse.Namespace, rows: int, work: Path, endpoint: MetastoreEndpoint) -> dict[str, Any]:
    """One size: ``flat`` on the clustered data, ``parted`` on each key layout; the change compacted once each."""
    layouts = [k.strip() for k in args.keys.split(",") if k.strip()]
    data = {
        k: generate(work / f"data_{k}_{rows}", rows, args.partitions, args.touched, args.change_rows, k)
        for k in layouts
    }
    log.info("data %s: %s", rows, data)
    tables = {
        f"parted_{k}": Table(
            parse_table(registry_doc(f"parted_{k}_{rows}", work / "lake", True)),
            endpoint,
            str(work / "warehouse"),
            work / "logs",
        )
        for k in layouts
    }
    tables["flat"] = Table(
        parse_table(registry_doc(f"flat_{rows}", work / "lake", False)),
        endpoint,
        str(work / "warehouse"),
        work / "logs",
    )
    ddl = CollectSql()
    for t in tables.values():
        ensure_tables(Runtime(cfg=t.cfg, lake=t.rt.lake, metastore=endpoint, engine=ddl))
    next(iter(tables.values())).rt.engine.run_sql(next(iter(tables.values())).cfg, ddl.statements)
    initial, change = {}, {}
    for name, t in tables.items():
        source = work / f"data_{layouts[0] if name == 'flat' else name.removeprefix('parted_')}_{rows}"
        t.land(source / INITIAL)
        initial[name] = t.compact("initial")
        log.info("%s %s initial load: %s", rows, name, initial[name])
        t.land(source / CHANGE)
        change[name] = t.compact("change")
        log.info("%s %s change: %s", rows, name, change[name])
    same = tables["flat"].rows().equals(tables[f"parted_{layouts[0]}"].rows())
    full = change["flat"]
    touched = {k: change[f"parted_{k}"] for k in layouts}
    return {
        "rows": rows,
        "data": data,
        "initial_load": initial,
        "full_rewrite": full,
        "touched_only": touched,
        "ratio_job": {k: _ratio(v.get("job_s"), full.get("job_s")) for k, v in touched.items()},
        "ratio_wall": {k: _ratio(v.get("wall_s"), full.get("wall_s")) for k, v in touched.items()},
        "same_rows": same,
        "spark_submit": submit_command(tables["flat"].cfg, "<plan>"),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from cdc_compaction.devtools.devenv import airflow_env

    started = time.monotonic()
    work = Path(args.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    ms = LocalMetastore(work / "metastore", port=free_port(), warehouse=work / "warehouse")
    ms.start()
    try:
        # The DAG's SparkSubmitOperator reads the spark_default connection from this environment.
        os.environ.update(airflow_env(work / "airflow", ms.uri, warehouse_dir=work / "warehouse"))
        endpoint = MetastoreEndpoint(ms.host, ms.port)
        per_size = [run_size(args, rows, work, endpoint) for rows in sizes]
    finally:
        ms.stop()
    # The target: at the size nearest 5M, the touched-only job time of every key layout within 10% of a full rewrite.
    at = min(per_size, key=lambda r: abs(r["rows"] - TARGET_ROWS))
    met = all(v is not None and v <= TARGET_RATIO for v in at["ratio_job"].values()) and all(
        r["same_rows"] for r in per_size
    )
    metrics = {
        f"{r['rows']}": {
            "full_rewrite_job_s": r["full_rewrite"].get("job_s"),
            "full_rewrite_wall_s": r["full_rewrite"].get("wall_s"),
            **{f"touched_{k}_job_s": v.get("job_s") for k, v in r["touched_only"].items()},
            **{f"touched_{k}_wall_s": v.get("wall_s") for k, v in r["touched_only"].items()},
            **{f"ratio_{k}_job": v for k, v in r["ratio_job"].items()},
            "same_rows": r["same_rows"],
        }
        for r in per_size
    }
    return {
        "name": "partitioned",
        "description": (
            f"partition_by with the key index: one increment of {args.change_rows} events touching "
            f"{args.touched:.0%} of {args.partitions} day partitions, touched-only vs a full rewrite, per table size "
            "(job time inside the JVM; wall time includes spark-submit's JVM start)"
        ),
        "target": (
            f"touched-only job time <= {TARGET_RATIO:.0%} of a full rewrite at {at['rows']} rows; "
            "touched-only time flat across sizes"
        ),
        "met": bool(met),
        "command": "python bench/partitioned.py " + " ".join(sys.argv[1:]),
        "metrics": metrics,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]},
        "partitions": args.partitions,
        "touched_fraction": args.touched,
        "change_rows": args.change_rows,
        "sizes": per_size,
        "total_s": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "partitioned.json"))
    parser.add_argument("--sizes", default="1000000,5000000,20000000", help="keys of the initial load, comma-separated")
    parser.add_argument("--partitions", type=int, default=100, help="days the keys are spread over")
    parser.add_argument("--touched", type=float, default=0.01, help="fraction of the partitions the increment touches")
    parser.add_argument("--change-rows", type=int, default=20_000, help="events of the increment, whatever the size")
    parser.add_argument("--keys", default="clustered,scattered", help="key layouts of the partitioned tables")
    parser.add_argument("--work", default=str(ROOT / ".run" / "bench-partitioned"), help="work directory (wiped)")
    args = parser.parse_args(argv)
    start_logging()
    result = run(args)
    write_result(args.out, result)
    for r in result["sizes"]:
        full = r["full_rewrite"]
        touched = ", ".join(
            f"{k} {v['job_s']} s (wall {v['wall_s']} s, ratio {r['ratio_job'][k]})"
            for k, v in r["touched_only"].items()
        )
        sys.stdout.write(
            f"partitioned {r['rows']} rows / {args.partitions} partitions, {args.change_rows} events: full rewrite "
            f"{full['job_s']} s (wall {full['wall_s']} s); touched only: {touched}; same rows: {r['same_rows']}\n"
        )
    sys.stdout.write(f"target ({result['target']}): {'met' if result['met'] else 'NOT met'}\n")
    return 0 if all(r["same_rows"] for r in result["sizes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
