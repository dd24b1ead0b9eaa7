"""Environment of the embedded default: a project-local Airflow on SQLite.

One function builds the environment variables that make ``airflow`` use the
project's ``dags/`` and ``plugins/``, a SQLite database under ``AIRFLOW_HOME``, and
connections for Spark (``local[*]``) and the local metastore.  The Makefile, the demo,
the DAG-mode conformance runner and the tests all use it, so they cannot disagree.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from cdc_compaction import settings


def airflow_env(
    airflow_home: Path,
    metastore_uri: str,
    *,
    registry_dir: Path | None = None,
    spark_master: str = "local[*]",
    warehouse_dir: Path | None = None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """Environment for running ``airflow`` against this project."""
    env = dict(os.environ if base is None else base)
    host, _, port = metastore_uri.split("://", 1)[-1].partition(":")
    venv_bin = str(Path(sys.executable).parent)
    env.update(
        {
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(settings.PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(settings.PROJECT_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home}/airflow.db",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
                {
                    "conn_type": "spark",
                    "host": spark_master,
                    "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"},
                }
            ),
            "AIRFLOW_CONN_METASTORE_DEFAULT": json.dumps(
                {
                    "conn_type": "hive_metastore",
                    "host": host,
                    "port": int(port or 9083),
                    "extra": {"warehouse_dir": str(warehouse_dir or settings.PROJECT_ROOT / ".lake" / "warehouse")},
                }
            ),
            "CDC_METASTORE_URI": metastore_uri,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(settings.PROJECT_ROOT / "plugins"), env.get("PYTHONPATH")])
            ),
            "PATH": os.pathsep.join([venv_bin, env.get("PATH", "")]),
            "PYSPARK_PYTHON": sys.executable,
        }
    )
    # The embedded default's Spark JVMs live for seconds to minutes: C1-only JIT halves their CPU
    # (hourly-run compaction: 42 -> 22 CPU-s; bench/hourly_run.py). spark-submit puts this on the
    # driver JVM only, before any spark.driver.extraJavaOptions; a value already set is kept.
    env.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")
    if registry_dir is not None:
        env["CDC_REGISTRY_DIR"] = str(registry_dir)
    return env


def ensure_airflow_db(env: dict[str, str]) -> None:
    """Create or migrate the SQLite metadata database of ``env['AIRFLOW_HOME']``."""
    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    marker = home / ".db-migrated"
    if marker.exists() and (home / "airflow.db").exists():
        return
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True
    )
    marker.write_text("ok\n")


def last_run_timings(airflow_home: Path, dag_id: str) -> dict[str, Any]:
    """State and per-task durations of the latest run of ``dag_id``, from the metadata DB."""
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        run = db.execute(
            "SELECT run_id, state, start_date, end_date FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1",
            (dag_id,),
        ).fetchone()
        if run is None:
            return {"dag_id": dag_id, "run_id": None}
        tasks = db.execute(
            "SELECT task_id, state, duration FROM task_instance WHERE dag_id = ? AND run_id = ? ORDER BY start_date",
            (dag_id, run[0]),
        ).fetchall()
    return {
        "dag_id": dag_id,
        "run_id": run[0],
        "state": run[1],
        "tasks": [{"task_id": t, "state": st, "seconds": round(d or 0.0, 1)} for t, st, d in tasks],
    }
