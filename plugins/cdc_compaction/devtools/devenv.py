"""Environment of the embedded default: a project-local Airflow on SQLite.

One function builds the environment variables that make ``airflow`` use the
project's ``dags/`` and ``plugins/``, a SQLite database under ``AIRFLOW_HOME``, and
connections for Spark (``local[*]``) and the local metastore.  The Makefile, the demo,
the DAG-mode conformance runner and the tests all use it, so they cannot disagree.

SQLite takes one writer at a time: one ``airflow dags test`` is fine, but a scheduler
next to a backfill CLI (or several Airflow processes at once) fails with "database is
locked".  Those pass ``sql_alchemy_conn``, a PostgreSQL database of their own
(:func:`postgres_metadata_db`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_compaction.core import settings
from cdc_compaction.core.exceptions import AirflowSetupError

if TYPE_CHECKING:
    from cdc_compaction.devtools.local_services import LocalPostgres


def connect_port_default() -> int:
    """The embedded Spark Connect server's port: ``$CDC_CONNECT_PORT`` or 15002 (Spark's own default)."""
    return int(os.environ.get("CDC_CONNECT_PORT", "15002"))


def connect_server(metastore_uri: str, home: Path | None = None, port: int | None = None) -> Any:
    """The embedded default's Spark Connect server (not started): the local metastore's catalog and warehouse.

    Its warehouse is the one the Airflow connection names (``airflow_env``), so tables created
    through it and through spark-submit land in the same place.
    """
    from cdc_compaction.devtools.local_services import SparkConnectServer

    return SparkConnectServer(
        home=home or settings.PROJECT_ROOT / ".connect",
        metastore_uri=metastore_uri,
        warehouse_dir=str(settings.PROJECT_ROOT / ".lake" / "warehouse"),
        port=port or connect_port_default(),
        master="local[*]",
    )


def airflow_env(
    airflow_home: Path,
    metastore_uri: str,
    *,
    registry_dir: Path | None = None,
    spark_master: str = "local[*]",
    warehouse_dir: Path | None = None,
    base: dict[str, str] | None = None,
    sql_alchemy_conn: str | None = None,
    connect_port: int | None = None,
) -> dict[str, str]:
    """Environment for running ``airflow`` against this project.

    The metadata database is SQLite under ``airflow_home`` unless ``sql_alchemy_conn``
    names another (``postgresql+psycopg2://…``).
    """
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
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql_alchemy_conn or f"sqlite:///{airflow_home}/airflow.db",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
                {
                    "conn_type": "spark",
                    "host": spark_master,
                    "extra": {"deploy-mode": "client", "spark-binary": "spark-submit"},
                }
            ),
            # registry spark.engine: spark_connect (the embedded server: cdc-compaction connect start).
            "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps(
                {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect_port or connect_port_default()}
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
    if sql_alchemy_conn and sql_alchemy_conn.startswith("postgresql") and importlib.util.find_spec("asyncpg") is None:
        # Airflow 3 also builds an async engine, postgresql+asyncpg by default, and fails at startup
        # without asyncpg (not pinned here: psycopg2 is).  An empty async URL makes Airflow build no
        # async engine; the components these tests run use the sync one (async sessions serve
        # multi-team and a few API routes, which would fail loudly, not silently use another DB).
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] = ""
    if registry_dir is not None:
        env["CDC_REGISTRY_DIR"] = str(registry_dir)
    return env


def ensure_airflow_db(env: dict[str, str]) -> None:
    """Create or migrate the metadata database of ``env`` (SQLite under ``AIRFLOW_HOME``, or PostgreSQL).

    ``airflow db migrate`` costs seconds even when there is nothing to do, so it is skipped when
    ``AIRFLOW_HOME/.db-migrated`` says this very database was migrated by this Airflow version:
    the marker holds the database's URL, Airflow's version and the schema revision the migration
    left in the database's ``alembic_version``, and the database is asked for that revision again.
    A new or recreated database (no such row, or another one) is therefore always migrated.
    """
    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    conn = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    marker = home / ".db-migrated"
    wanted = {"conn": conn, "airflow": _airflow_version()}
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        recorded = None  # none yet, or an older version's plain-text marker: migrate once
    if isinstance(recorded, dict) and {k: recorded.get(k) for k in wanted} == wanted:
        revision = schema_revision(conn)
        if revision is not None and revision == recorded.get("revision"):
            return
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise AirflowSetupError(f"airflow db migrate failed (exit {proc.returncode}):\n{tail}")
    marker.write_text(json.dumps({**wanted, "revision": schema_revision(conn)}) + "\n")


def _airflow_version() -> str:
    """The installed Airflow's version, from its package metadata (importing Airflow costs seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("apache-airflow-core")
    except PackageNotFoundError:
        return ""


def schema_revision(conn: str) -> str | None:
    """The schema revision ``airflow db migrate`` left in the database (``alembic_version``); None when
    the database is not there, not reachable, or never migrated (a missing SQLite file is not created)."""
    if conn.startswith("sqlite:///") and not Path(conn.removeprefix("sqlite:///")).exists():
        return None
    try:
        rows = metadata_rows(conn, "SELECT version_num FROM alembic_version", ())
    except Exception:  # noqa: BLE001 - sqlite3's or psycopg2's: no such table or database, not reachable
        return None
    return str(rows[0][0]) if rows else None


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, indented, for a message; "" when it cannot be read."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(f"    {line}" for line in text.splitlines()[-lines:])


def wait_until_answers(
    url: str, proc: subprocess.Popen[Any], timeout_s: float = 300.0, log: Path | None = None
) -> None:
    """Wait until ``url`` answers over HTTP (any status) while ``proc`` runs; AirflowSetupError otherwise,
    with the last lines of ``proc``'s ``log`` (why it died is there, not in its exit code)."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            tail = log_tail(log) if log is not None else ""
            raise AirflowSetupError(
                f"{' '.join(map(str, proc.args))} exited ({proc.returncode}) before {url} answered"
                + (f"; the last lines of {log}:\n{tail}" if tail else "")
            )
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # an HTTP answer, whatever its status
        except OSError:
            pass
        if time.monotonic() > deadline:
            tail = log_tail(log) if log is not None else ""
            raise AirflowSetupError(
                f"{url} did not answer within {timeout_s:.0f}s"
                + (f"; the last lines of {log}:\n{tail}" if tail else "; see the api-server's log")
            )
        time.sleep(0.5)


def postgres_metadata_db(postgres: LocalPostgres, label: str) -> str:
    """A new, empty PostgreSQL database on ``postgres`` for Airflow's metadata; its SQLAlchemy URL.

    Named ``airflow_<label>_<random>`` (``label`` reduced to ``[a-z0-9_]``), so every
    caller -- a test module, a demo -- gets a database no other one has written to.
    Pass the URL to :func:`airflow_env` as ``sql_alchemy_conn``, then :func:`ensure_airflow_db`.
    """
    import re
    import secrets

    name = f"airflow_{re.sub(r'[^a-z0-9_]', '_', label.lower())[:40]}_{secrets.token_hex(4)}"
    return postgres.create_database(name)


def metadata_rows(conn: str, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Rows of a ``?``-parameterized query on the metadata DB named by a SQLAlchemy URL."""
    if conn.startswith("sqlite:///"):
        with sqlite3.connect(conn.removeprefix("sqlite:///")) as db:
            return list(db.execute(query, params).fetchall())
    import psycopg2

    # libpq takes the URL without SQLAlchemy's "+driver".
    pg = psycopg2.connect(conn.replace("+psycopg2", "", 1))
    try:
        with pg.cursor() as cur:
            cur.execute(query.replace("?", "%s"), params)
            return list(cur.fetchall())
    finally:
        pg.close()


def last_run_timings(airflow_home: Path, dag_id: str, sql_alchemy_conn: str | None = None) -> dict[str, Any]:
    """State and per-task durations of the latest run of ``dag_id``, from the metadata DB.

    That is SQLite under ``airflow_home``, or the database ``sql_alchemy_conn`` names.
    """
    conn = sql_alchemy_conn or f"sqlite:///{airflow_home}/airflow.db"
    runs = metadata_rows(
        conn,
        "SELECT run_id, state, start_date, end_date FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1",
        (dag_id,),
    )
    if not runs:
        return {"dag_id": dag_id, "run_id": None}
    run = runs[0]
    tasks = metadata_rows(
        conn,
        "SELECT task_id, state, duration FROM task_instance WHERE dag_id = ? AND run_id = ? ORDER BY start_date",
        (dag_id, run[0]),
    )
    return {
        "dag_id": dag_id,
        "run_id": run[0],
        "state": run[1],
        "tasks": [{"task_id": t, "state": st, "seconds": round(d or 0.0, 1)} for t, st, d in tasks],
    }
