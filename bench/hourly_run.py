"""Benchmark: one hourly run of a table's DAG, end to end, on the embedded default.

Local lake, Spark ``local[*]``, the local Thrift metastore (started here and stopped by
its PID) and Airflow on SQLite, exactly as ``make demo`` runs them:

1. sets up one table (``bench.hourly_orders``) in a fresh registry, lake, metastore and
   Airflow home under a temporary work directory;
2. lands a first increment and runs the DAG once as a warm-up (that run creates the
   tables and views, so it launches the DDL JVM as well);
3. lands a small increment (``--rows`` events: updates, inserts and deletes of a past hour);
4. runs ``airflow dags test`` once more and measures it: the process's wall time, the DAG
   run's span, every task's start, end and duration from the metadata DB, the gaps between
   tasks (Airflow's own overhead), and every JVM launch with its duration. JVMs are counted
   by a ``spark-submit`` shim put first on the run's ``PATH``: it logs each launch, then runs
   the real one.

With ``--probe`` (the default) it also times a no-op ``spark-submit`` with the compaction's
conf, which separates JVM + SparkSession start-up from the compaction's own work.

    python bench/hourly_run.py --out bench/results/hourly_run.json [--rows 300] [--spark-conf k=v ...]

Target (issue 5): the whole run in at most 60 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "plugins") not in sys.path:
    sys.path.insert(0, str(ROOT / "plugins"))

from cdc_compaction.core.registry import TableConfig, load_table  # noqa: E402
from cdc_compaction.devtools.conformance import land  # noqa: E402
from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db  # noqa: E402
from cdc_compaction.devtools.local_services import LocalMetastore, free_port  # noqa: E402
from cdc_compaction.pipeline.order import STEP_IDS  # noqa: E402

TARGET_SECONDS = 60.0
DATABASE, TABLE = "bench", "hourly_orders"
TASK_ORDER = list(STEP_IDS)

log = logging.getLogger("bench.hourly_run")

# Logs every launch (start, end, exit code, user+system CPU, arguments) to $CDC_BENCH_JVM_LOG, then runs the real one.
_SHIM = """#!/bin/sh
start=$(date +%s.%N)
if [ -x /usr/bin/time ]; then
  /usr/bin/time -f '%U %S' -o "$CDC_BENCH_JVM_LOG.cpu.$$" "{real}" "$@"
else
  "{real}" "$@"
fi
rc=$?
end=$(date +%s.%N)
cpu=$(tail -n 1 "$CDC_BENCH_JVM_LOG.cpu.$$" 2>/dev/null)
rm -f "$CDC_BENCH_JVM_LOG.cpu.$$"
printf '%s\\t%s\\t%s\\t%s\\t%s\\n' "$start" "$end" "$rc" "$cpu" "$*" >> "$CDC_BENCH_JVM_LOG"
exit $rc
"""

_NOOP_JOB = """from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
spark.range(1).count()
spark.stop()
"""


def registry_doc(lake: Path, spark_conf: dict[str, str]) -> dict[str, Any]:
    """A realistic orders table: one key, a decimal, a timestamp, events ordered by (ts_ms, lsn)."""
    doc: dict[str, Any] = {
        "database": DATABASE,
        "table": TABLE,
        "description": "Orders, replicated by Debezium (hourly-run benchmark).",
        "columns": [
            {"name": "id", "type": "bigint", "comment": "order id"},
            {"name": "customer", "type": "string"},
            {"name": "status", "type": "string"},
            {"name": "amount", "type": "decimal(12,2)"},
            {"name": "updated_at", "type": "timestamp"},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": "bigint"},
            {"name": "lsn", "type": "bigint"},
        ],
        "primary_key": ["id"],
        "order_by": ["ts_ms", "lsn"],
        "storage_root": str(lake / DATABASE / TABLE),
        "schedule": "@hourly",
        "retries": 0,
    }
    if spark_conf:
        doc["spark"] = {"conf": spark_conf}
    return doc


def events(hour: datetime, first_id: int, rows: int, existing: int, seed_lsn: int) -> list[list[dict[str, Any]]]:
    """``rows`` change events of one hour in two files: updates and deletes of existing keys, then inserts."""
    out: list[dict[str, Any]] = []
    for i in range(rows):
        if existing and i % 10 < 7:  # 70 % updates of existing keys, one in seven of those a delete
            key, op = 1 + (i * 7919) % existing, "d" if i % 7 == 0 else "u"
        else:
            key, op = first_id + i, "c"
        t = hour + timedelta(seconds=5 + i * 3000 // max(rows, 1))
        out.append(
            {
                "id": key,
                "customer": f"customer-{key % 97}",
                "status": {"c": "new", "u": "paid", "d": "cancelled"}[op],
                "amount": f"{(key * 37) % 10000 / 100:.2f}",
                "updated_at": t.isoformat(),
                "op": op,
                "ts_ms": int(t.timestamp() * 1000),
                "lsn": seed_lsn + i,
            }
        )
    half = len(out) // 2
    return [out[:half], out[half:]]


def land_hour(cfg: TableConfig, hour: datetime, files: list[list[dict[str, Any]]]) -> int:
    """Land one past hour's increment, dated inside that hour like a real sink's files."""
    name = f"{cfg.increments.prefix}{hour.strftime(cfg.increments.time_format)}"
    stamp = (hour + timedelta(minutes=50)).timestamp()
    for path in land(cfg, name, files):
        os.utime(path, (stamp, stamp))
    return sum(len(f) for f in files)


def _dt(value: str | None) -> datetime | None:
    if not value:
        return None
    dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def run_timeline(airflow_home: Path, dag_id: str) -> dict[str, Any]:
    """The latest run of ``dag_id`` from the metadata DB: its span and every task's start, end and duration."""
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        run_id, state, start, end = db.execute(
            "SELECT run_id, state, start_date, end_date FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1",
            (dag_id,),
        ).fetchone()
        rows = db.execute(
            "SELECT task_id, state, start_date, end_date, duration FROM task_instance "
            "WHERE dag_id = ? AND run_id = ? ORDER BY start_date",
            (dag_id, run_id),
        ).fetchall()
    tasks = [
        {"task_id": t, "state": st, "start": _dt(s), "end": _dt(e), "seconds": round(float(d or 0.0), 2)}
        for t, st, s, e, d in rows
    ]
    return {"run_id": run_id, "state": state, "start": _dt(start), "end": _dt(end), "tasks": tasks}


def jvm_launches(log_file: Path) -> list[dict[str, Any]]:
    """The spark-submit launches the shim logged: start, end, seconds, CPU seconds, exit code, app name."""
    out: list[dict[str, Any]] = []
    if not log_file.exists():
        return out
    for line in log_file.read_text().splitlines():
        start, end, rc, cpu, args = line.split("\t", 4)
        words = args.split()
        name = words[words.index("--name") + 1] if "--name" in words[:-1] else ""
        app = next((w for w in words if w.endswith(".py")), "")
        user_sys = [float(x) for x in cpu.split()] if cpu.strip() else []
        out.append(
            {
                "start": datetime.fromtimestamp(float(start), UTC),
                "end": datetime.fromtimestamp(float(end), UTC),
                "seconds": round(float(end) - float(start), 2),
                "cpu_seconds": round(sum(user_sys), 2) if user_sys else None,
                "exit_code": int(rc),
                "name": name,
                "application": Path(app).name,
            }
        )
    return out


_LOG_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z ")


def task_phases(log_text: str) -> dict[str, dict[str, datetime]]:
    """Per task, from ``airflow dags test``'s log: Airflow starts it, our callable runs, Airflow finishes it.

    ``start``/``end`` are ``[DAG TEST] starting``/``end task``; the callable runs between the end of
    the task runner's pre-execute log group and the start of its ``Post Execute`` group.
    """
    phases: dict[str, dict[str, datetime]] = {}
    current: str | None = None
    for line in log_text.splitlines():
        m = _LOG_TS.match(line)
        if not m:
            continue
        ts = datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC)
        if "[DAG TEST] starting task_id=" in line:
            current = line.split("task_id=", 1)[1].split()[0]
            phases[current] = {"start": ts}
        elif current is None:
            continue
        elif "::endgroup::" in line and "execute_start" not in phases[current]:
            phases[current]["execute_start"] = ts
        elif "::group::Post Execute" in line:
            phases[current]["execute_end"] = ts
        elif "[DAG TEST] end task task_id=" in line:
            phases[current]["end"] = ts
            current = None
    return phases


def _span(a: datetime | None, b: datetime | None) -> float:
    return (b - a).total_seconds() if a is not None and b is not None else 0.0


def analyse(
    timeline: dict[str, Any],
    phases: dict[str, dict[str, datetime]],
    jvms: list[dict[str, Any]],
    wall: float,
    cpu: float,
) -> dict[str, Any]:
    """Where one run's time went: outside the DAG run, Airflow around each task, our Python, the JVMs."""
    per_task = []
    for t in timeline["tasks"]:
        ph = phases.get(t["task_id"], {})
        lo, hi = ph.get("start") or t["start"], ph.get("end") or t["end"]
        mine = [j for j in jvms if lo and hi and lo <= j["start"] <= hi]
        jvm_s = sum(j["seconds"] for j in mine)
        execute = _span(ph.get("execute_start"), ph.get("execute_end"))
        per_task.append(
            {
                "task_id": t["task_id"],
                "state": t["state"],
                "seconds": t["seconds"],  # as Airflow records it (task_instance.duration)
                "execute_seconds": round(execute, 2),  # our callable, JVMs included
                "jvm_launches": len(mine),
                "jvm_seconds": round(jvm_s, 2),
                "jvm_cpu_seconds": round(sum(j["cpu_seconds"] or 0.0 for j in mine), 2) if mine else 0.0,
                "our_python_seconds": round(max(execute - jvm_s, 0.0), 2),
                "airflow_seconds": round(_span(lo, ph.get("execute_start")) + _span(ph.get("execute_end"), hi), 2),
            }
        )
    ordered = sorted((p for p in phases.values() if "start" in p and "end" in p), key=lambda p: p["start"])
    between = sum(max(_span(a["end"], b["start"]), 0.0) for a, b in itertools.pairwise(ordered))
    span = _span(ordered[0]["start"], ordered[-1]["end"]) if ordered else 0.0
    jvm_sum = sum(j["seconds"] for j in jvms)
    return {
        "tasks": per_task,
        "summary": {
            "run_wall_seconds": round(wall, 2),
            "run_cpu_seconds": round(cpu, 2),
            "jvm_launches": len(jvms),
            "jvm_seconds": round(jvm_sum, 2),
            "jvm_cpu_seconds": round(sum(j["cpu_seconds"] or 0.0 for j in jvms), 2),
            "our_python_seconds": round(sum(t["our_python_seconds"] for t in per_task), 2),
            "airflow_in_tasks_seconds": round(sum(t["airflow_seconds"] for t in per_task), 2),
            "airflow_between_tasks_seconds": round(between, 2),
            # CLI start-up, DAG file parse, DB sync and run creation before the first task; teardown after.
            "airflow_outside_tasks_seconds": round(wall - span, 2),
            "dag_run_seconds": round(_span(timeline["start"], timeline["end"]), 2),
        },
    }


def airflow_dags_test(env: dict[str, str], dag_id: str, log_path: Path) -> tuple[float, float]:
    """One ``airflow dags test`` run: its wall and CPU seconds (children included). Raises if the run failed."""
    airflow = str(Path(sys.executable).parent / "airflow")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([airflow, "dags", "test", dag_id], env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    log_path.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RuntimeError(f"the DAG run failed (exit {proc.returncode}); log {log_path}:\n{tail}")
    return wall, cpu


def startup_probe(env: dict[str, str], conf: dict[str, str], work: Path) -> float:
    """Wall time of a no-op spark-submit with the compaction's conf: the JVM + SparkSession floor."""
    job = work / "noop_job.py"
    job.write_text(_NOOP_JOB)
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[*]"]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    start = time.perf_counter()
    subprocess.run([*cmd, str(job)], env=env, capture_output=True, check=True)
    return time.perf_counter() - start


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    spark_conf = dict(kv.split("=", 1) for kv in args.spark_conf)
    registry, lake, warehouse = work / "registry", work / "lake", work / "lake" / "warehouse"
    registry.mkdir(parents=True)
    import yaml

    (registry / f"{DATABASE}.{TABLE}.yaml").write_text(yaml.safe_dump(registry_doc(lake, spark_conf), sort_keys=False))
    cfg = load_table(registry, f"{DATABASE}.{TABLE}")

    shim_dir = work / "shim"
    shim_dir.mkdir()
    shim = shim_dir / "spark-submit"
    shim.write_text(_SHIM.format(real=Path(sys.executable).parent / "spark-submit"))
    shim.chmod(0o755)
    jvm_log = work / "jvm-launches.tsv"

    ms = LocalMetastore(work / "metastore", port=free_port(), warehouse=warehouse)
    t0 = time.perf_counter()
    ms.start()
    setup: dict[str, float] = {"metastore_start_seconds": round(time.perf_counter() - t0, 1)}
    try:
        home = Path(args.airflow_home) if args.airflow_home else work / "airflow"
        env = airflow_env(home, ms.uri, registry_dir=registry, warehouse_dir=warehouse)
        env["PATH"] = os.pathsep.join([str(shim_dir), env["PATH"]])
        env["CDC_BENCH_JVM_LOG"] = str(jvm_log)
        t0 = time.perf_counter()
        ensure_airflow_db(env)
        setup["airflow_db_seconds"] = round(time.perf_counter() - t0, 1)

        now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        first_rows = land_hour(cfg, now - timedelta(hours=3), events(now - timedelta(hours=3), 1, 500, 0, 1000))
        log.info("warm-up: landed %d events; first run (creates the tables) ...", first_rows)
        warm_wall, warm_cpu = airflow_dags_test(env, cfg.dag_id, work / "warmup-run.log")
        warm_phases = task_phases((work / "warmup-run.log").read_text())
        warm = analyse(run_timeline(home, cfg.dag_id), warm_phases, jvm_launches(jvm_log), warm_wall, warm_cpu)
        jvm_log.unlink(missing_ok=True)

        rows = land_hour(cfg, now - timedelta(hours=2), events(now - timedelta(hours=2), 10_000, args.rows, 500, 5000))
        log.info("landed %d events; the measured hourly run ...", rows)
        wall, cpu = airflow_dags_test(env, cfg.dag_id, work / "measured-run.log")
        timeline = run_timeline(home, cfg.dag_id)
        jvms = jvm_launches(jvm_log)
        measured = analyse(timeline, task_phases((work / "measured-run.log").read_text()), jvms, wall, cpu)
        if timeline["state"] != "success" or any(t["state"] != "success" for t in timeline["tasks"]):
            raise RuntimeError(f"the measured run did not succeed: {timeline}")

        probe = None
        if args.probe:
            from cdc_compaction.integrations.engine import compaction_conf

            probe = round(startup_probe(env, compaction_conf(cfg), work), 2)
    finally:
        ms.stop()

    s = measured["summary"]
    metrics: dict[str, Any] = {
        **s,
        **{f"task_{t['task_id']}_seconds": t["seconds"] for t in measured["tasks"]},
        "increment_rows": rows,
        "noop_spark_submit_seconds": probe,
        "warmup_run_wall_seconds": warm["summary"]["run_wall_seconds"],
        "warmup_jvm_launches": warm["summary"]["jvm_launches"],
    }
    return {
        "name": "hourly_run",
        "description": (
            f"one hourly run of cdc__{DATABASE}__{TABLE} (airflow dags test) with a {rows}-event increment "
            "on the embedded default: local lake, Spark local[*], local Thrift metastore, Airflow on SQLite"
        ),
        "metrics": metrics,
        "target": f"run_wall_seconds <= {TARGET_SECONDS:.0f}",
        "met": bool(s["run_wall_seconds"] <= TARGET_SECONDS),
        "tasks": measured["tasks"],
        "jvm": [{k: v for k, v in j.items() if k not in ("start", "end")} for j in jvms],
        "warmup": warm,
        "setup": setup,
        "spark_conf": spark_conf,
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "load_average": os.getloadavg()},
        "command": "python bench/hourly_run.py " + " ".join(sys.argv[1:]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the result JSON here")
    ap.add_argument("--rows", type=int, default=300, help="events in the measured increment (default 300)")
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="the table's spark.conf")
    ap.add_argument("--no-probe", dest="probe", action="store_false", help="skip the no-op spark-submit timing")
    ap.add_argument("--airflow-home", help="reuse this (migrated) Airflow home instead of a fresh one")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, lake) for inspection")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-hourly-"))
    try:
        result = bench(args, work)
    finally:
        if args.keep:
            log.info("work directory kept: %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(_jsonable(result), indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
        log.info("wrote %s", args.out)
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
