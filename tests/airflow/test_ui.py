"""The CDC tables pages (cdc_compaction.airflow.ui) served by their FastAPI app, on the sample lake; no Airflow here.

The access dependency is the app's one seam: here it lets every DAG through or none; the
browser test (tests/airflow/test_browser.py) runs the pages inside a real Airflow with its auth.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from status_helpers import NOW, SAMPLE, build_sample_lake, version_of

from cdc_compaction.airflow.ui import create_app, freshness_points, freshness_svg


def _allow(dag_ids: set[str]) -> Any:
    def dependency() -> Any:
        return lambda wanted: wanted & dag_ids

    return dependency


@pytest.fixture
def sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    registry = tmp_path / "registry"
    configs = build_sample_lake(tmp_path / "lake", registry)
    monkeypatch.setenv("CDC_REGISTRY_DIR", str(registry))
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{tmp_path}/no-airflow.db")
    return configs


def test_the_freshness_line_drops_at_each_commit_and_grows_until_the_next(sample: Any) -> None:
    from cdc_compaction.operations.status import commit_history

    student = sample[0]
    points = freshness_points(student, commit_history(student), NOW)

    def t(hh: int, mm: int) -> datetime:
        return datetime(2026, 11, 22, hh, mm, tzinfo=UTC)

    # commit 1 at 01:10 holds events up to 00:50; commit 2 at 02:20 up to 01:55; now is 04:00.
    assert points == [(t(1, 10), 20 * 60), (t(2, 20), 90 * 60), (t(2, 20), 25 * 60), (NOW, 125 * 60)]
    svg = freshness_svg(points, slo_seconds=3 * 3600)
    assert svg.startswith('<svg id="freshness-chart"') and 'class="slo"' in svg and "SLO 3h00m" in svg
    assert len(re.search(r'points="([^"]+)"', svg).group(1).split()) == 4  # type: ignore[union-attr]
    assert "Not enough commits" in freshness_svg(points[:1], None)


def test_the_list_page_has_a_row_per_readable_table_with_links(sample: Any) -> None:
    client = TestClient(create_app(_allow({SAMPLE["dag_id"]})), root_path="/cdc")
    page = client.get("/cdc/")
    assert page.status_code == 200
    rows = re.findall(r'<tr data-table="([^"]+)">', page.text)
    assert rows == [SAMPLE["table"]], "a table whose DAG the user may not read is listed"
    row = page.text.split(f'<tr data-table="{SAMPLE["table"]}">')[1].split("</tr>")[0]
    assert f'href="table/{SAMPLE["table"]}"' in row
    assert f'href="../dags/{SAMPLE["dag_id"]}" target="_top"' in row
    assert "2 at 2026-11-22T02:20:00 (3 rows)" in row
    assert '<td class="num pending"><span title="increment_2026112202, increment_2026112203">2</span>' in row
    assert '<td class="num quarantine">1</td>' in row and '<td class="paused">unknown</td>' in row


def test_the_table_page_lists_commits_newest_first(sample: Any) -> None:
    client = TestClient(create_app(_allow({SAMPLE["dag_id"]})), root_path="/cdc")
    page = client.get(f"/cdc/table/{SAMPLE['table']}")
    assert page.status_code == 200
    assert re.findall(r'<tr data-seq="(\d+)">', page.text) == ["2", "1"]
    assert version_of(2) in page.text and 'id="freshness-chart"' in page.text
    assert '<span class="compaction">always</span>' in page.text, "the compaction policy (README, 'Compaction policy')"
    assert f'href="../../dags/{SAMPLE["dag_id"]}"' in page.text
    hidden = TestClient(create_app(_allow(set())), root_path="/cdc").get(f"/cdc/table/{SAMPLE['table']}")
    assert hidden.status_code == 404 and SAMPLE["table"] in hidden.json()["detail"]


def test_a_late_table_is_marked_and_an_unreadable_one_says_why(sample: Any) -> None:
    from cdc_compaction.airflow.ui import render_index
    from cdc_compaction.operations.status import table_status

    student, fresh = sample
    from cdc_compaction.core.registry import Slo

    # Freshness at NOW is 2h05m; within 1h for 75 of the 170 minutes since the first commit.
    late = student.model_copy(update={"slo": Slo(freshness=timedelta(hours=1), target=0.99, window=timedelta(days=1))})
    Path(fresh.storage_root, "_cdc", "commits").mkdir(parents=True)
    Path(fresh.storage_root, "_cdc", "commits", "00000001.json").write_text("[]")
    page = render_index([table_status(late, NOW), table_status(fresh, NOW)], NOW)
    assert '<td class="freshness late">2h05m slo 1h00m LATE 44.1%/99%</td>' in page
    broken = page.split(f'<tr data-table="{SAMPLE["empty_table"]}">')[1].split("</tr>")[0]
    assert '<td colspan="5" class="err">CommitLogError: commit record' in broken and "00000001.json" in broken


def test_a_failed_table_and_an_invalid_registry_file_are_in_sight(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table whose runs fail shows its last run (failed, task, try) and an invalid file its row and error."""
    from status_helpers import FAILING, airflow_with_failed_runs

    _registry, env = airflow_with_failed_runs(tmp_path_factory.mktemp("ui_failed"))
    for key in ("CDC_REGISTRY_DIR", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW_HOME"):
        monkeypatch.setenv(key, env[key])
    dags = {SAMPLE["dag_id"], FAILING["dag_id"], FAILING["broken_dag_id"], "cdc__tests__fresh"}
    page = TestClient(create_app(_allow(dags)), root_path="/cdc").get("/cdc/")
    assert page.status_code == 200
    row = page.text.split(f'<tr data-table="{FAILING["table"]}">')[1].split("</tr>")[0]
    last = re.search(r'<td class="last-run ([^"]*)" data-state="([^"]+)">([^<]+)</td>', row)
    assert last is not None, row
    assert last.group(1) == "failed" and last.group(2) == "failed", row
    assert f"{FAILING['first_task']} try 1" in last.group(3), row
    assert '<td class="paused">active</td>' in row and "never compacted" in row, row
    broken = page.text.split(f'<tr data-registry-file="{FAILING["broken_file"]}"')[1].split("</tr>")[0]
    assert "invalid registry entry" in broken and FAILING["broken_file"] in broken, broken
    assert f"{FAILING['broken_task']} try 1" in broken and f'href="../dags/{FAILING["broken_dag_id"]}"' in broken
    # Every row spans the header's columns, error rows too (their message spans what they cannot show).
    head = len(re.findall(r"<th>", page.text.split("</thead>")[0]))
    for row_html in page.text.split("<tbody>")[1].split("</tbody>")[0].split("</tr>")[:-1]:
        spans = [int(n) if n else 1 for n in re.findall(r'<td(?: colspan="(\d+)")?[^>]*>', row_html)]
        assert sum(spans) == head, row_html
        # A user who may not read the error DAG does not see the file's row.
    hidden = TestClient(create_app(_allow({SAMPLE["dag_id"]})), root_path="/cdc").get("/cdc/")
    assert "data-registry-file" not in hidden.text
