"""Which Airflow the operations commands act on: one answer for ``status``, ``pause``, ``resume``,
``delete``, ``doctor``, ``erase`` and ``rollback``.

The Airflow home is, in this order:

1. ``$AIRFLOW_HOME`` when the shell sets it (whatever is there);
2. Airflow's default home ``~/airflow`` when it holds an ``airflow.cfg``;
3. this project's local UI, ``<project>/.airflow`` (``make airflow-ui`` writes its ``airflow.cfg``),
   when it holds an ``airflow.cfg`` or an ``airflow.db``;
4. else ``~/airflow``, where nothing is (the commands that need Airflow say so).

Its metadata database is ``$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``, else the home's ``[database]
sql_alchemy_conn``, else Airflow's SQLite default under the home.  ``make airflow-ui`` also leaves
in its home the environment its components run with (:data:`ENVIRONMENT_FILE`: the Airflow
connections ``spark_default``, ``metastore_default`` ..., and ``CDC_METASTORE_URI``), so a shell's
``doctor`` sees the connections the UI's tasks see.  Found without importing Airflow: importing
its configuration writes an ``airflow.cfg`` where none is, and a read-only command must not.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from cdc_compaction.core import settings

log = logging.getLogger(__name__)

#: The environment ``make airflow-ui`` runs its components with, kept in its home (JSON, name -> value).
ENVIRONMENT_FILE = "cdc-environment.json"
#: The variables of that environment a shell's command takes over (the rest is the UI's own business).
RECORDED_PREFIXES = ("AIRFLOW_CONN_", "CDC_METASTORE_URI")


@dataclass(frozen=True)
class AirflowPlace:
    """An Airflow home, its metadata database and the environment a process needs to use both."""

    home: Path
    #: The metadata database's SQLAlchemy URL; "" when nothing names one (no airflow.cfg there).
    conn: str
    #: How the home was found, for messages ("AIRFLOW_HOME", "this project's local UI", ...).
    how: str
    #: Variables to set before importing Airflow (only those the shell does not set already).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def config_file(self) -> Path:
        return self.home / "airflow.cfg"


def _configured_conn(home: Path) -> str:
    """``[database] sql_alchemy_conn`` of ``home/airflow.cfg``; Airflow's SQLite default when the file
    names none; "" without a readable file."""
    cfg = home / "airflow.cfg"
    if not cfg.is_file():
        return f"sqlite:///{home / 'airflow.db'}" if (home / "airflow.db").is_file() else ""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(cfg)
    except configparser.Error as exc:
        log.info("%s is unreadable (%s): its metadata database is unknown", cfg, exc)
        return ""
    return parser.get("database", "sql_alchemy_conn", fallback="") or f"sqlite:///{home / 'airflow.db'}"


def recorded_environment(home: Path) -> dict[str, str]:
    """The connections and metastore URI ``make airflow-ui`` recorded in ``home`` (empty when none)."""
    path = home / ENVIRONMENT_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("%s is unreadable (%s): the local UI's connections are not used", path, exc)
        return {}
    if not isinstance(doc, dict):
        return {}
    return {str(k): str(v) for k, v in doc.items() if str(k).startswith(RECORDED_PREFIXES)}


def record_environment(home: Path, env: dict[str, str]) -> Path:
    """Keep in ``home`` the part of ``env`` a shell's command needs (see :data:`RECORDED_PREFIXES`)."""
    path = home / ENVIRONMENT_FILE
    kept = {k: v for k, v in sorted(env.items()) if k.startswith(RECORDED_PREFIXES)}
    path.write_text(json.dumps(kept, indent=1) + "\n")
    return path


def find_airflow() -> AirflowPlace:
    """The Airflow home, database and environment the operations commands use (module docstring)."""
    set_home = os.environ.get("AIRFLOW_HOME", "")
    default = Path("~/airflow").expanduser()
    local = settings.PROJECT_ROOT / ".airflow"
    if set_home:
        home, how = Path(set_home).expanduser(), "AIRFLOW_HOME"
    elif (default / "airflow.cfg").is_file():
        home, how = default, "Airflow's default home (AIRFLOW_HOME is not set)"
    elif (local / "airflow.cfg").is_file() or (local / "airflow.db").is_file():
        home, how = local, "this project's local UI (make airflow-ui; AIRFLOW_HOME is not set)"
    else:
        home, how = default, "AIRFLOW_HOME is not set, and Airflow's default home"
    conn = os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "") or _configured_conn(home)
    env = {"AIRFLOW_HOME": str(home), **recorded_environment(home)}
    if conn:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = conn
    if conn.startswith("postgresql") and importlib.util.find_spec("asyncpg") is None:
        # Airflow builds an async engine too, postgresql+asyncpg by default, and fails on import without
        # asyncpg: the sync driver (psycopg2) serves everything these commands do, as it serves the local
        # UI's components (devtools/devenv.py airflow_env).
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] = ""
    return AirflowPlace(home, conn, how, env)


def use_airflow() -> AirflowPlace:
    """:func:`find_airflow`, and its environment set in this process (what the shell sets stays): call it
    before anything imports Airflow, whose configuration is read once, on import."""
    place = find_airflow()
    for k, v in place.env.items():
        os.environ.setdefault(k, v)
    return place
