"""The CDC tables pages in a real Airflow api-server, loaded by headless Chromium (playwright).

One Airflow api-server on 127.0.0.1 (SQLite metadata DB, the simple auth manager with a known
password) with the plugins folder of this project, over the sample lake of status_helpers
(two commits, pending hours, a quarantined file; the registry's two tables are serialized so
Airflow knows their paused flags, and one is unpaused through the REST API).  The test signs
in through Airflow's token endpoint, then checks the list page, the per-table page, the page
embedded in Airflow's navigation and its DAG link.  Screenshots go to the test's tmp
directory (their paths are printed).  Every process it starts is stopped by its id.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from status_helpers import FAILING, NOW, SAMPLE, add_failing_entries, build_sample_lake, run_failing_dags, version_of

from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db
from cdc_compaction.devtools.local_services import free_port, port_open

pytestmark = [pytest.mark.browser]

AIRFLOW = str(Path(sys.executable).parent / "airflow")
# make check-browser installs Debian's chromium; CDC_CHROMIUM names another binary.
CHROMIUM = os.environ.get("CDC_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _request(url: str, token: str | None = None, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def airflow_ui(tmp_path: Path) -> Iterator[tuple[str, str, datetime]]:
    """(base URL, a user's JWT, the sample's "now") of an api-server with the plugin, over the sample lake."""
    registry = tmp_path / "registry"
    built = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    build_sample_lake(tmp_path / "lake", registry, now=built)
    add_failing_entries(tmp_path / "lake", registry)  # a table whose runs fail, and an invalid registry file
    passwords = tmp_path / "passwords.json"
    password = secrets.token_hex(8)
    passwords.write_text(json.dumps({"admin": password}))
    port = free_port()
    # No metastore is needed: the pages read the lake only.  Nothing listens on this port, so the failing
    # table's first task fails at once when its DAG runs (airflow dags test, below).
    env = airflow_env(tmp_path / "airflow", f"thrift://127.0.0.1:{free_port()}", registry_dir=registry)
    env.update(
        {
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        }
    )
    ensure_airflow_db(env)
    for cmd in (["dags", "reserialize"], ["dags", "unpause", FAILING["dag_id"]]):
        proc = subprocess.run([AIRFLOW, *cmd], env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # Real failed runs, recorded by Airflow: the table's (its first task, try 1) and the invalid file's DAG.
    run_failing_dags(env)
    log_file = tmp_path / "api-server.log"
    with log_file.open("wb") as out:
        server = subprocess.Popen(
            [AIRFLOW, "api-server", "--port", str(port), "--host", "127.0.0.1"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers share its process group: stopped with it below
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while not port_open("127.0.0.1", port):
            assert server.poll() is None, log_file.read_text()[-3000:]
            assert time.monotonic() < deadline, log_file.read_text()[-3000:]
            time.sleep(0.5)
        status, doc = _request(f"{base}/auth/token", method="POST", body={"username": "admin", "password": password})
        assert status == 201, doc
        yield base, doc["access_token"], built
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def test_cdc_tables_pages_in_airflow(airflow_ui: tuple[str, str, datetime], tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    base, token, built = airflow_ui
    committed = datetime.fromisoformat(SAMPLE["commits"][-1][2]) + (built - NOW)
    student, dag_id = SAMPLE["table"], SAMPLE["dag_id"]
    # Airflow's auth guards the pages: no session, no table list.
    assert _request(f"{base}/cdc/")[0] == 401
    status, doc = _request(f"{base}/api/v2/dags/{dag_id}", token, method="PATCH", body={"is_paused": False})
    assert status == 200 and doc["is_paused"] is False, doc

    shots = tmp_path / "screenshots"  # printed at the end; pytest keeps the last runs' tmp directories
    shots.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1400, "height": 800})
            # The UI keeps its session in this cookie; the pages' requests carry it like the UI's.
            ctx.add_cookies([{"name": "_token", "value": token, "url": base}])
            page = ctx.new_page()

            page.goto(f"{base}/cdc/")
            row = page.locator(f'tr[data-table="{student}"]')
            expect(row.locator("td.commit")).to_have_text(f"2 at {committed.isoformat()[:19]} (3 rows)")
            # The sample's newest event is 2h05m old at the hour it was built in, plus the minutes since.
            # Against its SLO (1 h, 99% of a day): late, compliance measured since commit 1.
            late = re.compile(r"^[23]h\d\dm slo 1h00m LATE \d+\.\d%/99%$")
            expect(row.locator("td.freshness")).to_have_text(late)
            expect(row.locator("td.freshness")).to_have_class(re.compile(r"\blate\b"))
            expect(row.locator("td.pending")).to_have_text("2")
            expect(row.locator("td.quarantine")).to_have_text("1")
            expect(row.locator("td.paused")).to_have_text("active")
            expect(page.locator(f'tr[data-table="{SAMPLE["empty_table"]}"] td.paused')).to_have_text("paused")
            link = row.locator("a.dag")
            expect(link).to_have_attribute("href", f"../dags/{dag_id}")
            # The failing table: never compacted, and its last run says so -- failed, which task, which try.
            bad = page.locator(f'tr[data-table="{FAILING["table"]}"]')
            expect(bad.locator("td.last-run")).to_have_class(re.compile(r"\bfailed\b"))
            expect(bad.locator("td.last-run")).to_contain_text("failed ")
            expect(bad.locator("td.last-run")).to_contain_text(f"{FAILING['first_task']} try 1")
            expect(bad.locator("td.paused")).to_have_text("active")
            expect(bad.locator("td.next-run")).not_to_have_text(re.compile("none|unknown"))
            # The invalid registry file has its row, with the registry's error and its error DAG's failed run.
            broken = page.locator(f'tr[data-registry-file="{FAILING["broken_file"]}"]')
            expect(broken.locator("td.err")).to_contain_text("invalid registry entry")
            expect(broken.locator("td.last-run")).to_contain_text(f"{FAILING['broken_task']} try 1")
            page.screenshot(path=str(shots / "list.png"), full_page=True)
            # At 1280 px, with a failed table's and an invalid file's errors shown: no horizontal scrolling.
            page.set_viewport_size({"width": 1280, "height": 800})
            width = page.evaluate("document.scrollingElement.scrollWidth")
            assert width <= 1280, f"the tables page is {width} px wide at a 1280 px viewport (errors shown)"
            page.set_viewport_size({"width": 1400, "height": 800})

            row.locator("a.table").click()
            page.wait_for_url(f"{base}/cdc/table/{student}")
            expect(page.locator("tr[data-seq]")).to_have_count(2)
            expect(page.locator('tr[data-seq="2"]')).to_contain_text(version_of(2))
            expect(page.locator("#freshness-chart polyline.freshness")).to_have_count(1)
            page.screenshot(path=str(shots / "table.png"), full_page=True)

            # The page in Airflow's navigation (an embedded view), and its DAG link into Airflow's UI.
            page.goto(f"{base}/plugin/cdc-tables")
            frame = page.frame_locator("iframe")
            expect(frame.locator(f'tr[data-table="{student}"] td.pending')).to_have_text("2", timeout=30_000)
            expect(frame.locator(f'tr[data-table="{FAILING["table"]}"] td.last-run')).to_contain_text("failed")
            page.screenshot(path=str(shots / "embedded.png"))
            frame.locator(f'tr[data-table="{student}"] a.dag').click()
            page.wait_for_url(f"{base}/dags/{dag_id}", timeout=30_000)
            expect(page.get_by_text(dag_id).first).to_be_visible(timeout=30_000)
            page.screenshot(path=str(shots / "dag.png"))
        finally:
            browser.close()
    print(f"screenshots: {shots}")


def test_the_tables_page_fits_1280_px_with_long_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An invalid registry file under a long path without a break opportunity (underscores only) shows
    its error in the table: before, the row stretched the page to about 2,100 px at a 1280 px
    viewport (horizontal scrolling). The page is rendered by the app (no Airflow: seconds)."""
    from fastapi.testclient import TestClient
    from playwright.sync_api import sync_playwright

    from cdc_compaction.airflow.ui import create_app

    deep = tmp_path / ("a_registry_directory_of_a_deployment_with_a_long_name_" * 3)
    registry = deep / "registry"
    build_sample_lake(tmp_path / "lake", registry)
    add_failing_entries(tmp_path / "lake", registry)
    monkeypatch.setenv("CDC_REGISTRY_DIR", str(registry))
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{tmp_path}/no-airflow.db")
    text = TestClient(create_app(lambda: lambda wanted: wanted), root_path="/cdc").get("/cdc/").text
    assert "invalid registry entry" in text
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
            page.set_content(text)
            width = page.evaluate("document.scrollingElement.scrollWidth")
        finally:
            browser.close()
    assert width <= 1280, f"the tables page is {width} px wide at a 1280 px viewport (errors shown)"
