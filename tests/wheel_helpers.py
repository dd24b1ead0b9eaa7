"""The built and installed wheel, shared by the packaging test and the newcomer's end-to-end test.

The wheel is built once per session (``wheel``/``installed`` fixtures in conftest.py call these):
a build and a fresh venv cost most of a minute on two cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: What a build reads from the repository (copied, so the build leaves no build/ or egg-info behind).
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "plugins", "include", "dags")


def _setuptools_builds_wheels() -> bool:
    major, minor = (int(p) for p in version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1)


#: The mark of every test that needs the wheel.
needs_wheel = pytest.mark.skipif(
    not _setuptools_builds_wheels(),
    reason=f"setuptools {version('setuptools')} in the venv cannot build wheels: make install installs "
    "requirements-build.txt (setuptools 70.1+)",
)


def build_wheel(src: Path, out: Path) -> Path:
    """Build the project's wheel from a copy of its build inputs in ``src`` into ``out``."""
    for name in BUILD_INPUTS:
        item = REPO / name
        if item.is_dir():
            shutil.copytree(item, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(item, src / name)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("cdc_compaction-*.whl")
    return path


def install_wheel(wheel: Path, venv: Path, mirror: Path) -> Path:
    """A fresh venv with the wheel; the test venv's site-packages are visible through a .pth file."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    # Only site-packages directories: plugins/ (on this process's path) must not leak into the venv.
    # And not the project itself: `make install` puts an editable cdc-compaction (its dist-info and
    # entry points) into the test venv, which would register the page a second time beside the wheel's.
    for site in (Path(p) for p in sys.path if p.endswith("site-packages")):
        for entry in site.iterdir():
            own = entry.name.startswith(("cdc_compaction", "__editable__"))
            if not own and not entry.name.endswith(".pth") and not (mirror / entry.name).exists():
                (mirror / entry.name).symlink_to(entry)
    (purelib / "test-venv.pth").write_text(f"{mirror}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps", str(wheel)],
        capture_output=True,
        check=True,
    )
    return venv


def env_without_java_or_clone(venv: Path, cwd: Path) -> dict[str, str]:
    """No PYTHONPATH, no CDC_* settings, and a PATH of the venv's bin only (java is in /usr/bin here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "PYTHON", "JAVA_HOME", "SPARK_HOME"))}
    env["PATH"] = str(venv / "bin")
    assert shutil.which("java", path=env["PATH"]) is None
    env["HOME"] = str(cwd)
    return env


def installed_airflow_env(venv: Path, home: Path, plugins: Path, registry: Path) -> dict[str, str]:
    """An Airflow of its own (SQLite in ``home``), the wheel's venv only, the given plugins folder and registry."""
    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    # The DAG file a deployment copies: the wheel's own, not the clone's.
    packaged = next((venv / "lib").glob("python3*/site-packages/cdc_compaction/resources/dags/cdc_compaction_dags.py"))
    shutil.copy2(packaged, dags / packaged.name)
    # Nothing of the test session's own Airflow (conftest points AIRFLOW__* at its home).
    env = {k: v for k, v in env_without_java_or_clone(venv, home).items() if not k.startswith("AIRFLOW")}
    return {
        **env,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "CDC_REGISTRY_DIR": str(registry),
        "CDC_PROJECT_ROOT": str(home),
    }
