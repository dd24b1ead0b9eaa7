"""Benchmark: how long Airflow takes to parse the DAG file with N registry tables.

Writes N valid, varied registry files (different columns, keys, schedules, alerts,
Spark settings) into a temporary registry directory, points the DAG file at it with
``$CDC_REGISTRY_DIR`` and fills Airflow's own ``DagBag`` in a fresh interpreter. It
reports what Airflow reports (``dagbag_stats``: the file's parse duration), the wall
time of the fill, the DAG count and import errors, and a second fill in the same
process, which shows the registry cache (``_load_cached.cache_info()``: parsed once per
process). It also runs a 1-table baseline.

The measured process is set up as Airflow's DAG processor sets up the one it forks for a parse:
Airflow imported, the airflow modules the DAG file names imported (``parsing_pre_import_modules``:
the processor does it before it forks, so they are not part of the parse; ``pre_import_seconds``),
and ``gc.freeze()`` before that (``DagFileProcessorManager.before_run``), so the collector does not
walk Airflow's own objects during the parse.  The main case is measured in
two fresh processes: the first right after the registry was written (``parse_seconds``: the
registry parse cache, ``$CDC_PARSE_CACHE_DIR``, is empty, as after every registry change), the
second with that cache filled by the first (``cached_parse_seconds``: every later parse of an
unchanged registry, i.e. what the DAG processor does every 30 s).

    python bench/parse_dags.py --out bench/results/parse.json [--tables 500] [--profile FILE]

Target (issue 5): 500 tables parse in at most 1 s (the ``dagbag_stats`` duration).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DAG_FILE = ROOT / "dags" / "cdc_compaction_dags.py"
TARGET_SECONDS = 1.0

log = logging.getLogger("bench.parse_dags")

# ----------------------------------------------------------------------------- registry
_DATABASES = ["sales", "billing", "inventory", "hr", "crm", "logistics", "payments", "catalog", "support", "iot"]
_TYPES = [
    "int",
    "bigint",
    "string",
    "double",
    "boolean",
    "date",
    "timestamp",
    "decimal(12,2)",
    "decimal(38,10)",
    "varchar(64)",
    "char(3)",
    "smallint",
    "float",
    "binary",
]
_WORDS = [
    "name",
    "status",
    "amount",
    "created_at",
    "updated_at",
    "email",
    "country",
    "currency",
    "quantity",
    "price",
    "note",
    "order",
    "group",
    "timestamp",
    "user",
    "region",
    "sku",
    "score",
    "flag",
    "payload",
    "version",
    "level",
    "source",
    "channel",
]
_SCHEDULES: list[str | None] = [
    "@hourly",
    "@hourly",
    "@hourly",
    "@daily",
    "*/15 * * * *",
    "5 * * * *",
    "0 */6 * * *",
    None,
]
_OWNERS = ["data-platform", "commerce-data", "finance-data", "people-analytics", "ops"]


def registry_doc(i: int, rng: random.Random, lake_dir: Path) -> dict[str, Any]:
    """One valid, realistic registry entry; ``i`` makes the table name unique."""
    database = _DATABASES[i % len(_DATABASES)]
    table = f"t{i:04d}_{rng.choice(['orders', 'events', 'accounts', 'items', 'tickets', 'readings'])}"
    key_cols = [{"name": "id", "type": rng.choice(["int", "bigint", "string"]), "comment": "source key"}]
    if rng.random() < 0.3:
        key_cols.insert(0, {"name": "tenant", "type": "string", "comment": "tenant of a multi-tenant source"})
    value_cols = [
        {"name": w, "type": rng.choice(_TYPES)} for w in rng.sample(_WORDS, rng.randint(2, min(18, len(_WORDS))))
    ]
    order_cols = [{"name": "ts_ms", "type": "bigint", "comment": "source commit time in ms"}]
    if rng.random() < 0.4:
        order_cols.append({"name": "lsn", "type": "bigint", "comment": "log position (tie-break)"})
    op_column = rng.choice(["op", "op", "__op"])
    doc: dict[str, Any] = {
        "database": database,
        "table": table,
        "description": f"{table} of the {database} database, replicated by Debezium (bench entry {i}).",
        "columns": [*key_cols, *value_cols, {"name": op_column, "type": "string"}, *order_cols],
        "primary_key": [c["name"] for c in key_cols],
        "order_by": [c["name"] for c in order_cols],
        "op_column": op_column,
        "storage_root": str(lake_dir / database / table),
        "schedule": rng.choice(_SCHEDULES),
        "owner": rng.choice(_OWNERS),
        "retries": rng.randint(1, 5),
        "retry_delay": rng.choice(["30s", "1m", "5m"]),
        "max_retry_delay": rng.choice(["1h", "2h"]),
        "tags": rng.sample(["pii", "gold", "silver", "finance", "debezium", "postgres", "mysql"], rng.randint(0, 3)),
        "tombstone_retention": rng.choice(["7d", "14d", "36h"]),
        "keep_versions": rng.randint(2, 6),
    }
    if rng.random() < 0.5:
        doc["alerts"] = {
            "emails": [f"{doc['owner']}@example.com", *(["oncall@example.com"] if rng.random() < 0.3 else [])],
            "on_rejected_rows": rng.random() < 0.8,
        }
    if rng.random() < 0.2:
        doc["op_codes"] = {"create": "I", "read": "S", "update": "U", "delete": "D"}
    if rng.random() < 0.25:
        doc["increments"] = {"completion": "marker", "marker_file": "_SUCCESS", "settle_seconds": 0}
    if rng.random() < 0.2:
        doc["start_date"] = "2026-03-01T00:00:00Z"
        doc["catchup"] = rng.random() < 0.5
    if rng.random() < 0.3:
        doc["on_bad_file"] = "quarantine"
        doc["on_extra_columns"] = "ignore"
    if rng.random() < 0.4:
        doc["spark"] = {
            "conf": {"spark.sql.shuffle.partitions": str(rng.choice([4, 16, 64]))},
            "driver_memory": rng.choice(["1g", "2g"]),
        }
    return doc


def write_registry(directory: Path, tables: int, lake_dir: Path, seed: int = 5) -> list[str]:
    """Write ``tables`` registry files into ``directory``; return the qualified names."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    names = []
    for i in range(tables):
        doc = registry_doc(i, rng, lake_dir)
        name = f"{doc['database']}.{doc['table']}"
        (directory / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        names.append(name)
    return names


#: The DAGs over every table (set in the measured process, which has the package on its path).
_SHARED_DAGS: set[str] = set()


# -------------------------------------------------------------------- measured process
def measure(dag_file: Path, profile: str | None) -> dict[str, Any]:
    """Fill a DagBag twice in this (fresh) process; return Airflow's and our own numbers."""
    global _SHARED_DAGS
    from cdc_compaction.core.settings import ERASE_DAG_ID, VIEW_REFRESH_DAG_ID

    _SHARED_DAGS = {VIEW_REFRESH_DAG_ID, ERASE_DAG_ID}
    t0 = time.perf_counter()
    from airflow.dag_processing.dagbag import DagBag

    import_airflow = time.perf_counter() - t0
    # As the DAG processor's manager does: freeze its heap for the collector once, when it starts
    # (airflow.dag_processing.manager), then, before it forks the process that parses the file, import
    # the airflow modules the DAG file names ([dag_processor] parsing_pre_import_modules, .processor).
    from airflow.dag_processing.processor import _pre_import_airflow_modules

    gc.freeze()
    t0 = time.perf_counter()
    _pre_import_airflow_modules(str(dag_file), log)
    pre_import = time.perf_counter() - t0

    def fill() -> tuple[Any, float, float]:
        start, cpu = time.perf_counter(), time.process_time()
        # Airflow 3.3's DagBag has no include_examples: example DAGs come from a bundle, not from here.
        bag = DagBag(dag_folder=str(dag_file))
        return bag, time.perf_counter() - start, time.process_time() - cpu

    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    bag, wall, cpu = fill()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    from cdc_compaction.core.registry import _load_cached

    after_first = _load_cached.cache_info()
    bag2, wall2, cpu2 = fill()
    after_second = _load_cached.cache_info()
    stats = bag.dagbag_stats
    stats2 = bag2.dagbag_stats
    return {
        "import_airflow_seconds": round(import_airflow, 3),
        "pre_import_seconds": round(pre_import, 3),
        "dagbag_stats_seconds": round(sum(s.duration.total_seconds() for s in stats), 3),
        "dagbag_fill_wall_seconds": round(wall, 3),
        "dagbag_fill_cpu_seconds": round(cpu, 3),
        # The per-table DAGs: the view refresher and the erase DAG cover every table and are not counted.
        "dags": len([d for d in bag.dags if d not in _SHARED_DAGS]),
        "tasks": sum(s.task_num for s in stats),
        "import_errors": len(bag.import_errors),
        "import_error_sample": [str(v)[:500] for v in list(bag.import_errors.values())[:3]],
        "second_parse_dagbag_stats_seconds": round(sum(s.duration.total_seconds() for s in stats2), 3),
        "second_parse_wall_seconds": round(wall2, 3),
        "second_parse_cpu_seconds": round(cpu2, 3),
        "second_parse_dags": len(bag2.dags),
        "registry_cache_misses_after_first_parse": after_first.misses,
        "registry_cache_misses_after_second_parse": after_second.misses,
        "registry_cache_hits_after_second_parse": after_second.hits,
    }


def run_case(tables: int, work: Path, profile: str | None = None, project: Path = ROOT) -> dict[str, Any]:
    """Write a registry of ``tables`` tables under ``work`` and measure it in a fresh interpreter.

    ``project`` is the checkout whose DAG file and package are measured (another one, e.g. an
    export of an older commit, gives a before/after comparison on the same registry).  The
    registry parse cache is ``work``'s own: empty for a new registry, filled by its first run.
    """
    sys.path.insert(0, str(ROOT / "plugins"))
    from cdc_compaction.devtools.devenv import airflow_env

    registry = work / f"registry-{tables}"
    if not registry.is_dir():
        write_registry(registry, tables, work / "lake")
    env = airflow_env(work / "airflow-home", "thrift://127.0.0.1:9083", registry_dir=registry)
    env.update(
        {
            "CDC_PROJECT_ROOT": str(project),
            "PYTHONPATH": str(project / "plugins"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(project / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(project / "plugins"),
            "CDC_PARSE_CACHE_DIR": str(work / f"parse-cache-{tables}"),
        }
    )
    dag_file = project / DAG_FILE.relative_to(ROOT)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", str(dag_file)]
    if profile:
        cmd += ["--profile", profile]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {tables} tables failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["tables"] = tables
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the result JSON here")
    ap.add_argument("--tables", type=int, default=500, help="registry tables (default 500)")
    ap.add_argument("--baseline", type=int, default=1, help="tables of the baseline run (default 1; 0: none)")
    ap.add_argument("--profile", help="cProfile the first DagBag fill of the main case into this file")
    ap.add_argument("--project", type=Path, default=ROOT, help="checkout to measure (default: this one)")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # internal: the measured subprocess
    args = ap.parse_args(argv)
    if args.measure:
        sys.stdout.write(json.dumps(measure(args.measure, args.profile)) + "\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="cdc-bench-parse-") as tmp:
        work = Path(tmp)
        baseline = run_case(args.baseline, work, project=args.project) if args.baseline else None
        main_case = run_case(args.tables, work, args.profile, project=args.project)
        # The same registry again in a fresh process: the parse cache the first run filled is used.
        cached_case = run_case(args.tables, work, project=args.project)
    parse_s = main_case["dagbag_stats_seconds"]
    ok = main_case["dags"] == args.tables and main_case["import_errors"] == 0
    cached = (
        main_case["registry_cache_misses_after_first_parse"] == 1
        and main_case["registry_cache_misses_after_second_parse"] == 1
    )
    result: dict[str, Any] = {
        "name": "parse_dags",
        "description": f"DagBag parse of dags/cdc_compaction_dags.py with {args.tables} registry tables",
        "metrics": {
            "tables": args.tables,
            "dags": main_case["dags"],
            "import_errors": main_case["import_errors"],
            "parse_seconds": parse_s,
            "dagbag_fill_wall_seconds": main_case["dagbag_fill_wall_seconds"],
            "dagbag_fill_cpu_seconds": main_case["dagbag_fill_cpu_seconds"],
            "second_parse_seconds": main_case["second_parse_dagbag_stats_seconds"],
            "cached_parse_seconds": cached_case["dagbag_stats_seconds"],
            "cached_parse_dags": cached_case["dags"],
            "registry_parsed_once_per_process": cached,
            "baseline_tables": args.baseline or None,
            "baseline_parse_seconds": baseline["dagbag_stats_seconds"] if baseline else None,
            "baseline_second_parse_seconds": baseline["second_parse_dagbag_stats_seconds"] if baseline else None,
            "import_airflow_seconds": main_case["import_airflow_seconds"],
            "pre_import_seconds": main_case["pre_import_seconds"],
        },
        "target": f"parse_seconds <= {TARGET_SECONDS} (Airflow's dagbag_stats duration), {args.tables} DAGs, 0 errors",
        "met": bool(ok and parse_s <= TARGET_SECONDS),
        "cached_target": f"cached_parse_seconds <= {TARGET_SECONDS} (the parse of an unchanged registry)",
        "cached_met": bool(
            ok and cached_case["dags"] == args.tables and cached_case["dagbag_stats_seconds"] <= TARGET_SECONDS
        ),
        "runs": {"main": main_case, "cached": cached_case, "baseline": baseline},
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "command": "python bench/parse_dags.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
        log.info("wrote %s", args.out)
    sys.stdout.write(text + "\n")
    # A missed time target is a result (``met``), not a failure; a wrong DAG count or an import error is.
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
