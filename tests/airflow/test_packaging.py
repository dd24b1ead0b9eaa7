"""The installable package: a wheel built from this repository works without the clone around it.

Built with the venv's pip and setuptools (``--no-build-isolation``: no network), installed into a
fresh venv that sees the test venv's third-party packages (Airflow, pydantic, pyspark) but not
``plugins/``, then driven through its ``cdc-compaction`` console script with no Java on PATH, and
through Airflow's own CLI: the wheel's entry points register the CDC tables page and the provider,
and its DAG file (the one-line loader) builds a registry directory's DAGs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import yaml
from wheel_helpers import REPO, needs_wheel
from wheel_helpers import env_without_java_or_clone as _env_without_java_or_clone
from wheel_helpers import installed_airflow_env as _airflow_env

pytestmark = needs_wheel


def test_the_wheel_holds_the_package_and_its_run_time_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every file the repository keeps under plugins/cdc_compaction, include/sql and include/spark_jobs.
    expected = {
        f"cdc_compaction/{p.relative_to(REPO / 'plugins' / 'cdc_compaction').as_posix()}"
        for p in (REPO / "plugins" / "cdc_compaction").rglob("*.py")
    }
    for source, target in (("include/sql", "sql"), ("include/spark_jobs", "spark_jobs"), ("dags", "dags")):
        expected |= {
            f"cdc_compaction/resources/{target}/{p.relative_to(REPO / source).as_posix()}"
            for p in (REPO / source).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
    assert expected - names == set()
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "cdc-compaction = cdc_compaction.cli.main:main" in text
    assert "cdc_compaction_tables = cdc_compaction.airflow.plugin:CdcTablesPlugin" in text
    assert "provider_info = cdc_compaction.airflow.provider_info:get_provider_info" in text


def test_the_installed_console_script_validates_a_registry_without_java(installed: Path, tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    orders = yaml.safe_load((REPO / "include" / "registry" / "shop.orders.yaml").read_text())
    (registry / "shop.orders.yaml").write_text(yaml.safe_dump(orders))
    (registry / "shop.broken.yaml").write_text(yaml.safe_dump({**orders, "table": "broken", "retries": -1}))
    env = _env_without_java_or_clone(installed, tmp_path)

    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import cdc_compaction.core.settings as s; print(s.INCLUDE_DIR)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    include = Path(where.stdout.strip())
    assert include.is_relative_to(installed), include  # the installed copy, not the clone's plugins/
    assert (include / "sql" / "create_base.sql.j2").is_file() and (include / "spark_jobs" / "compact.py").is_file()

    proc = subprocess.run(
        [str(installed / "bin" / "cdc-compaction"), "registry", "validate", "--dir", str(registry)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # The DAG id is cdc__<database>__<table> (README, "Table registry reference").
    assert "OK    shop.orders.yaml: shop.orders -> DAG cdc__shop__orders" in proc.stdout
    assert "ERROR shop.broken.yaml:" in proc.stdout and "retries" in proc.stdout
    assert "1 invalid of 2 registry files" in proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr


def test_the_installed_package_prints_the_shipped_schema(installed: Path, tmp_path: Path) -> None:
    """Descriptions come from the models' source: the installed copy has it too."""
    proc = subprocess.run(
        [str(installed / "bin" / "cdc-compaction"), "registry", "schema"],
        capture_output=True,
        text=True,
        env=_env_without_java_or_clone(installed, tmp_path),
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (REPO / "registry.schema.json").read_text()


def _airflow(venv: Path, env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "airflow", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=env["AIRFLOW_HOME"],
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def version_of_wheel(venv: Path) -> str:
    """The version the installed wheel's metadata says (its dist-info directory's name)."""
    (dist_info,) = (venv / "lib").glob("python3*/site-packages/cdc_compaction-*.dist-info")
    return dist_info.name.removeprefix("cdc_compaction-").removesuffix(".dist-info")


def _json_output(stdout: str) -> list[dict[str, object]]:
    """The JSON list of an ``-o json`` command (Airflow may print warnings before it on stdout)."""
    line = next(line for line in reversed(stdout.splitlines()) if line.startswith("["))
    return json.loads(line)


def test_airflow_finds_the_installed_page_provider_and_dags(installed: Path, tmp_path: Path) -> None:
    """No file of the clone: the page comes from the entry point, the DAGs from the shipped one-line DAG file."""
    registry = tmp_path / "registry"
    registry.mkdir()
    for name in ("shop.orders.yaml", "school.student.yaml"):
        shutil.copy2(REPO / "include" / "registry" / name, registry / name)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    env = _airflow_env(installed, tmp_path / "airflow", plugins, registry)

    page = [
        p
        for p in _json_output(_airflow(installed, env, "plugins", "-o", "json"))
        if p["name"] == "cdc_compaction_tables"
    ]
    assert len(page) == 1, page
    assert "EntryPoint(name='cdc_compaction_tables'" in str(page[0]["source"])
    assert page[0]["external_views"] == [
        {"name": "CDC tables", "href": "/cdc/", "url_route": "cdc-tables", "destination": "nav"}
    ]

    # The apache_airflow_provider entry point: the installed distribution's name and version.
    providers = _json_output(_airflow(installed, env, "providers", "list", "-o", "json"))
    assert {"package_name": "cdc-compaction", "version": version_of_wheel(installed)} in [
        {k: p.get(k) for k in ("package_name", "version")} for p in providers
    ], providers

    _airflow(installed, env, "db", "migrate")
    dag_ids = {d["dag_id"] for d in _json_output(_airflow(installed, env, "dags", "list", "--local", "-o", "json"))}
    # cdc__<database>__<table> per registry file, plus the view refresher and the erase DAG over every table.
    assert dag_ids == {"cdc__shop__orders", "cdc__school__student", "cdc__views_refresh", "cdc__erase"}


def test_the_plugins_folder_shim_does_not_register_the_page_twice(installed: Path, tmp_path: Path) -> None:
    """plugins/cdc_status_plugin.py in the plugins folder of an Airflow that also has the installed package.

    Airflow registers a plugin name once and reports a second registration as a plugin import error,
    which the UI shows: the shim stays empty when the package's entry point registers the page.
    """
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    shutil.copy2(REPO / "plugins" / "cdc_status_plugin.py", plugins / "cdc_status_plugin.py")
    env = _airflow_env(installed, tmp_path / "airflow", plugins, tmp_path)
    proc = subprocess.run(
        [
            str(installed / "bin" / "python"),
            "-c",
            "import json; from airflow import plugins_manager as pm; "
            "print(json.dumps({'names': [p['name'] for p in pm.get_plugin_info()], "
            "'errors': pm.get_import_errors()}))",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["names"].count("cdc_compaction_tables") == 1, loaded
    assert loaded["errors"] == {}, loaded


def test_the_installed_dag_file_without_its_environment_says_why_no_dags(installed: Path, tmp_path: Path) -> None:
    """No CDC_REGISTRY_DIR and no CDC_PROJECT_ROOT: the wheel's DAG file finds no registry and says so, with what
    to set, in the output of the deployment page's step ``airflow dags reserialize`` (it once made zero DAGs
    without a word)."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    env = _airflow_env(installed, tmp_path / "airflow", plugins, tmp_path)
    del env["CDC_REGISTRY_DIR"], env["CDC_PROJECT_ROOT"]
    _airflow(installed, env, "db", "migrate")
    proc = subprocess.run(
        [str(installed / "bin" / "python"), "-m", "airflow", "dags", "reserialize"],
        capture_output=True,
        text=True,
        env=env,
        cwd=env["AIRFLOW_HOME"],
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "cdc__" not in _airflow(installed, env, "dags", "list"), out
    (line,) = [ln for ln in out.splitlines() if "no registry directory" in ln]
    assert str(tmp_path / "airflow" / "include" / "registry") in line, line
    assert "neither CDC_REGISTRY_DIR nor CDC_PROJECT_ROOT is set" in line and "set CDC_REGISTRY_DIR" in line, line
