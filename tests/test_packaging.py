"""The installable package: a wheel built from this repository works without the clone around it.

Built with the venv's pip and setuptools (``--no-build-isolation``: no network), installed into a
fresh venv that sees the test venv's third-party packages (Airflow, pydantic, pyspark) but not
``plugins/``, then driven through its ``cdc-compaction`` console script with no Java on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
#: What a build reads from the repository (copied, so the build leaves no build/ or egg-info behind).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "plugins", "include", "dags")


def _setuptools_builds_wheels() -> bool:
    major, minor = (int(p) for p in version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1)


pytestmark = pytest.mark.skipif(
    not _setuptools_builds_wheels(),
    reason=f"setuptools {version('setuptools')} in the venv cannot build wheels: make install installs "
    "requirements-build.txt (setuptools 70.1+)",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        item = REPO / name
        if item.is_dir():
            shutil.copytree(item, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(item, src / name)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("cdc_compaction-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel; the test venv's site-packages are visible through a .pth file."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    # Only site-packages directories: plugins/ (on this process's path) must not leak into the venv.
    site_dirs = [p for p in sys.path if p.endswith("site-packages")]
    (purelib / "test-venv.pth").write_text("\n".join(site_dirs) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps", str(wheel)],
        capture_output=True,
        check=True,
    )
    return venv


def _env_without_java_or_clone(venv: Path, cwd: Path) -> dict[str, str]:
    """No PYTHONPATH, no CDC_* settings, and a PATH of the venv's bin only (java is in /usr/bin here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "PYTHON", "JAVA_HOME", "SPARK_HOME"))}
    env["PATH"] = str(venv / "bin")
    assert shutil.which("java", path=env["PATH"]) is None
    env["HOME"] = str(cwd)
    return env


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
    assert "cdc-compaction = cdc_compaction.__main__:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_console_script_validates_a_registry_without_java(installed: Path, tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    orders = yaml.safe_load((REPO / "include" / "registry" / "shop.orders.yaml").read_text())
    (registry / "shop.orders.yaml").write_text(yaml.safe_dump(orders))
    (registry / "shop.broken.yaml").write_text(yaml.safe_dump({**orders, "table": "broken", "retries": -1}))
    env = _env_without_java_or_clone(installed, tmp_path)

    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import cdc_compaction.settings as s; print(s.INCLUDE_DIR)"],
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
