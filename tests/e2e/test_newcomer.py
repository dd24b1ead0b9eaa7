"""A newcomer's first table, end to end, as docs/getting-started.md ("Your first table") tells it.

A clean venv with the wheel only (tests/wheel_helpers.py), a project directory of its own, the
registry file and the landed increment taken verbatim from the docs page (its YAML and Python
blocks are read from the page here, so the page and this test cannot drift), ``cdc-compaction
registry validate``, the DAG file of docs/deployment.md in a fresh DAGs folder, a real
``airflow dags test`` (spark-submit, the local Thrift metastore), then the result where the page
says to look: ``cdc-compaction status`` and the CDC tables page.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from wheel_helpers import REPO, installed_airflow_env, needs_wheel

from cdc_compaction.devtools.devenv import airflow_env
from cdc_compaction.devtools.local_services import LocalMetastore

pytestmark = [needs_wheel, pytest.mark.dag, pytest.mark.metastore, pytest.mark.spark]

GETTING_STARTED = REPO / "docs" / "getting-started.md"
DEPLOYMENT = REPO / "docs" / "deployment.md"


def _section(page: Path, heading: str) -> str:
    """The text of a ``## heading`` section of a docs page, up to the next ``## ``."""
    text = page.read_text()
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _blocks(section: str, lang: str) -> list[str]:
    """The fenced ``lang`` code blocks of a section (dedented: a block may sit in a list item)."""
    found = re.findall(rf"^([ \t]*)```{lang}\n(.*?)^[ \t]*```", section, flags=re.M | re.S)
    return [textwrap.dedent(body) for _, body in found]


def _run(venv: Path, env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True, env=env, cwd=cwd, check=False
    )


def test_a_newcomer_compacts_the_docs_first_table_from_the_wheel(
    installed: Path, metastore: LocalMetastore, tmp_path: Path
) -> None:
    first_table = _section(GETTING_STARTED, "Your first table")
    (registry_yaml,) = _blocks(first_table, "yaml")
    (shell,) = _blocks(first_table, "bash")
    # The docs name the file: include/registry/shop.customers.yaml, under the project root.
    assert "(`include/registry/shop.customers.yaml`)" in first_table
    project = tmp_path / "project"
    registry = project / "include" / "registry"
    registry.mkdir(parents=True)
    (registry / "shop.customers.yaml").write_text(registry_yaml)

    # An Airflow of the wheel's venv only; the DAGs folder holds the one-line loader of docs/deployment.md.
    (loader,) = _blocks(_section(DEPLOYMENT, "Running it in a real Airflow"), "python")
    assert "load_dags(globals())" in loader
    env = installed_airflow_env(installed, tmp_path / "airflow", tmp_path / "plugins", registry)
    (tmp_path / "plugins").mkdir()
    for old in (tmp_path / "airflow" / "dags").iterdir():
        old.unlink()
    (tmp_path / "airflow" / "dags" / "cdc_dags.py").write_text(loader)
    # Installed, relative storage roots and the default registry are the working directory's
    # (docs/deployment.md, "Installing the package"): the newcomer works in the project directory.
    env["CDC_PROJECT_ROOT"] = str(project)
    # And no CDC_REGISTRY_DIR: the registry is the page's include/registry under the project root.
    del env["CDC_REGISTRY_DIR"]
    # The connections `make airflow-ui` defines (devenv.airflow_env): Spark local[*] through
    # spark-submit and the local metastore; nothing else of the clone's environment.
    clone = airflow_env(tmp_path / "airflow", metastore.uri, warehouse_dir=metastore.home / "warehouse", base={})
    env.update({k: v for k, v in clone.items() if k.startswith("AIRFLOW_CONN_") or k == "SPARK_SUBMIT_OPTS"})
    env["CDC_METASTORE_URI"] = metastore.uri
    env["AIRFLOW__CORE__EXECUTOR"] = clone["AIRFLOW__CORE__EXECUTOR"]
    # spark-submit is pyspark's (pip installs it beside the package), java the system's.
    pyspark_bin = next((installed / "lib").glob("python3*/site-packages/test-venv.pth")).read_text().strip()
    spark_bin = Path(pyspark_bin) / "pyspark" / "bin"
    env["PATH"] = os.pathsep.join([str(installed / "bin"), str(spark_bin), "/usr/bin", "/bin"])
    env["PYSPARK_PYTHON"] = str(installed / "bin" / "python")

    # Step 2: validate, with the line the docs promise.
    # The command the page names for an installed package (the clone's `make lint-registry` runs it).
    validate_command = re.search(r"\(`(cdc-compaction registry validate)` from an installed package\)", first_table)
    assert validate_command, "step 2 names the installed package's validate command"
    validate = _run(installed, env, project, *validate_command.group(1).split())
    assert validate.returncode == 0, validate.stdout + validate.stderr
    promised = re.search(r"make lint-registry\s+# (.+)", shell).group(1)  # type: ignore[union-attr]
    assert promised.strip() in validate.stdout, validate.stdout

    # Land the increment the docs' way: their Python, run in the project directory.
    script = re.search(r"<<'PY'\n(.*?)^PY$", shell, flags=re.M | re.S).group(1)  # type: ignore[union-attr]
    landed = subprocess.run(
        [str(installed / "bin" / "python"), "-"], input=script, capture_output=True, text=True, env=env, cwd=project
    )
    assert landed.returncode == 0, landed.stderr
    files = list((project / ".lake" / "shop" / "customers" / "incremental").rglob("*.parquet"))
    assert [f.parent.name for f in files] == ["increment_2026010100"], files
    # The docs: an increment is taken once its files have not changed for settle_seconds (120 s).
    # Wait that out by dating the file back instead of sleeping.
    settled = time.time() - 180
    for f in files:
        os.utime(f, (settled, settled))

    # A real DAG run (the docs: "the first run creates the tables and compacts whatever has landed").
    migrate = _run(installed, env, tmp_path / "airflow", "python", "-m", "airflow", "db", "migrate")
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    run = _run(installed, env, tmp_path / "airflow", "python", "-m", "airflow", "dags", "test", "cdc__shop__customers")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-5000:]
    assert "Traceback" not in out, out[-5000:]

    # The result where the docs say to look from a shell ("See it in the UI"): their commands, as written.
    (*_, from_a_shell) = _blocks(_section(GETTING_STARTED, "See it in the UI"), "bash")
    commands = [line.split() for line in from_a_shell.splitlines() if line.startswith("cdc-compaction ")]
    assert [c[1] for c in commands] == ["status", "versions"], from_a_shell
    shown = {}
    for command in commands:
        proc = _run(installed, env, project, *command)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        shown[command[1]] = proc.stdout
    assert "shop.customers" in shown["status"] and "last run success" in shown["status"], shown["status"]
    # ids 1 and 2 once each (the update replaces Ada's row): 2 rows, in the one version the run committed.
    status = _run(installed, env, project, "cdc-compaction", "status", "shop.customers", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    (row,) = json.loads(status.stdout)
    assert row["table"] == "shop.customers", row
    assert row["last_commit"]["rows"] == 2, row
    assert row["last_run"]["state"] == "success" and row["last_run"]["failed_task"] == "", row
    assert row["pending"] == [] and row["quarantine_waiting"] == 0, row
    assert row["live_version"] and row["live_version"] in shown["versions"], shown["versions"]

    # And on the CDC tables page, served by the installed plugin's app on the same Airflow database.
    page = subprocess.run(
        [
            str(installed / "bin" / "python"),
            "-c",
            "from fastapi.testclient import TestClient; from cdc_compaction.airflow.ui import create_app; "
            "app = create_app(lambda: (lambda wanted: wanted)); "
            "r = TestClient(app, root_path='/cdc').get('/cdc/'); "
            # One JSON line, last: Airflow's logging also writes to stdout.
            "import json; print(json.dumps([r.status_code, r.text]))",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=project,
        check=False,
    )
    assert page.returncode == 0, page.stderr[-3000:]
    code, html = json.loads(page.stdout.strip().splitlines()[-1])
    assert code == 200, html
    assert re.findall(r'<tr data-table="([^"]+)">', html) == ["shop.customers"], html
    table_row = html.split('<tr data-table="shop.customers">')[1].split("</tr>")[0]
    assert "(2 rows)" in table_row, table_row
    assert re.search(r'<td class="last-run " data-state="success">success \d{4}-', table_row), table_row
