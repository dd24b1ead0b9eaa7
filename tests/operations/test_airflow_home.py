"""One Airflow for every operations command: $AIRFLOW_HOME, ~/airflow, else the project's local UI (make airflow-ui)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cdc_compaction.core import settings
from cdc_compaction.operations.airflow_home import find_airflow, use_airflow
from cdc_compaction.operations.status import metadata_conn, task_log_folder

UI_CONN = "postgresql+psycopg2://postgres@127.0.0.1:54329/airflow_ui"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose local UI ran (its airflow.cfg and recorded environment), in a shell with no Airflow."""
    root = tmp_path / "project"
    home = root / ".airflow"
    home.mkdir(parents=True)
    (home / "airflow.cfg").write_text(f"[core]\nload_examples = False\n\n[database]\nsql_alchemy_conn = {UI_CONN}\n")
    recorded = {
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
        "CDC_METASTORE_URI": "thrift://127.0.0.1:9999",
        "AIRFLOW__API_AUTH__JWT_SECRET": "not for shells",
    }
    (home / "cdc-environment.json").write_text(json.dumps(recorded))
    monkeypatch.setattr(settings, "PROJECT_ROOT", root)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/airflow/airflow.cfg
    for name in ("AIRFLOW_HOME", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AIRFLOW_CONN_SPARK_DEFAULT", "CDC_METASTORE_URI", "AIRFLOW__API_AUTH__JWT_SECRET"):
        monkeypatch.delenv(name, raising=False)
    return root


def test_without_airflow_home_the_commands_find_the_projects_local_ui(project: Path) -> None:
    place = find_airflow()
    assert place.home == project / ".airflow" and place.conn == UI_CONN
    assert "local UI" in place.how
    assert metadata_conn() == UI_CONN, "status reads the same database"
    assert task_log_folder() == str(project / ".airflow" / "logs"), "and the same task logs"
    assert place.env["AIRFLOW_HOME"] == str(project / ".airflow")
    assert place.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == UI_CONN
    assert place.env["CDC_METASTORE_URI"] == "thrift://127.0.0.1:9999"
    assert json.loads(place.env["AIRFLOW_CONN_SPARK_DEFAULT"])["host"] == "local[*]"
    assert "AIRFLOW__API_AUTH__JWT_SECRET" not in place.env, "only connections and the metastore are taken over"
    if importlib.util.find_spec("asyncpg") is None:
        assert place.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] == "", "the sync driver, not a traceback"


def test_the_shell_wins(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("CDC_METASTORE_URI", "thrift://10.0.0.1:9083")
    before = dict(os.environ)
    try:
        use_airflow()  # sets this process's environment: put back below
        assert os.environ["CDC_METASTORE_URI"] == "thrift://10.0.0.1:9083", "a value the shell sets stays"
        assert os.environ["AIRFLOW_HOME"] == str(project / ".airflow")
        assert os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == UI_CONN
    finally:
        os.environ.clear()
        os.environ.update(before)

    other = tmp_path / "other"
    other.mkdir()
    (other / "airflow.cfg").write_text("[core]\n")
    monkeypatch.setenv("AIRFLOW_HOME", str(other))
    place = find_airflow()
    assert (place.home, place.conn, place.how) == (other, f"sqlite:///{other / 'airflow.db'}", "AIRFLOW_HOME")
    assert "CDC_METASTORE_URI" not in place.env, "that home recorded no environment"

    monkeypatch.delenv("AIRFLOW_HOME")
    default = tmp_path / "home" / "airflow"
    default.mkdir(parents=True)
    (default / "airflow.cfg").write_text("[database]\nsql_alchemy_conn = sqlite:////srv/af.db\n")
    assert (find_airflow().home, find_airflow().conn) == (default, "sqlite:////srv/af.db"), "Airflow's default home"
