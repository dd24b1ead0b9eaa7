"""Zero DAGs is never silent: each parse of the DAG file logs where it looked for the registry and what it found.

An installed wheel in an Airflow without ``CDC_REGISTRY_DIR`` (or ``CDC_PROJECT_ROOT``) once parsed to no
DAG at all, with no log line and no import error. The DAG file is parsed here as the DAG processor parses
it (Airflow's ``DagBag``, in a process of its own with the environment of the case), and its log read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import student_doc

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "cdc_compaction_dags.py"


def _parse(tmp_path: Path, **env: str) -> tuple[int, str]:
    """(DAGs the parse made, everything it printed) for the DAG file parsed with ``env`` and no CDC_* else."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CDC_", "AIRFLOW"))}
    clean |= {
        "PYTHONPATH": str(REPO / "plugins"),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "CDC_PARSE_CACHE_DIR": "off",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        **env,
    }
    code = (
        "import json\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAG_FILE)!r})\n"
        "print('RESULT ' + json.dumps({'dags': len(bag.dags), 'errors': len(bag.import_errors)}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean, cwd=tmp_path, timeout=300, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    result = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert result["errors"] == 0, out
    return result["dags"], out


def _lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if "registry directory" in ln]


def test_a_parse_without_a_registry_directory_says_where_it_looked_and_what_to_set(tmp_path: Path) -> None:
    project = tmp_path / "elsewhere"
    project.mkdir()
    dags, out = _parse(tmp_path, CDC_PROJECT_ROOT=str(project))
    assert dags == 0, out
    lines = _lines(out)
    assert len(lines) == 1, out  # once per parse
    assert str(project / "include" / "registry") in lines[0], lines
    assert "CDC_PROJECT_ROOT" in lines[0] and "no table DAGs" in lines[0], lines
    assert "set CDC_REGISTRY_DIR" in lines[0], lines
    assert "warning" in lines[0].lower(), lines

    dags, out = _parse(tmp_path, CDC_REGISTRY_DIR=str(tmp_path / "no-such-registry"))
    (line,) = _lines(out)
    assert str(tmp_path / "no-such-registry") in line and "CDC_REGISTRY_DIR" in line and "no table DAGs" in line


def test_a_parse_says_how_many_tables_and_error_entries_it_found(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "tests.good.yaml").write_text(yaml.safe_dump(student_doc(tmp_path / "lake", "good")))
    (registry / "tests.bad.yaml").write_text(yaml.safe_dump({**student_doc(tmp_path / "lake", "bad"), "retries": -1}))
    dags, out = _parse(tmp_path, CDC_REGISTRY_DIR=str(registry))
    assert dags == 4, out  # two tables (one an error DAG), the view refresher and the erase DAG
    (line,) = _lines(out)
    assert str(registry) in line and "$CDC_REGISTRY_DIR" in line, line
    assert "1 table" in line and "1 error entry" in line and "tests.bad.yaml" in line, line

    empty = tmp_path / "empty"
    empty.mkdir()
    dags, out = _parse(tmp_path, CDC_REGISTRY_DIR=str(empty))
    (line,) = _lines(out)
    assert dags == 0 and str(empty) in line and "no <database>.<table>.yaml files" in line, line
