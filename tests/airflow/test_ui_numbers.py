"""The table page's numbers are the commit records' numbers (issue 39, item 6).

A table built through two real compactions, an erase of one row and a rollback; every commit's
"rows" on the page must be what ``cdc-compaction versions`` prints, and its "changed rows" the
number of rows ``cdc-compaction changes --from <parent> --to <commit>`` prints (both commands run
through the CLI's own entry point).  The landed change rows are the ones the commit's run read:
none for an erase or a rollback, which read no increment.  Before, a rollback that changed rows
showed 0, an erase of one row showed its parent's landed count, and the rows after an erase were
the whole version's rows, tombstones aside, as the versions command did not count them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import compact_once, student_doc
from fastapi.testclient import TestClient
from pipeline.helpers import student_rows

from cdc_compaction.airflow.ui import create_app
from cdc_compaction.cli.main import main
from cdc_compaction.core.registry import parse_table
from cdc_compaction.devtools.conformance import land
from cdc_compaction.operations.erase import erase
from cdc_compaction.operations.travel import rollback
from cdc_compaction.pipeline.tables import ensure_tables

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def _page_rows(text: str) -> dict[int, tuple[str, str, str]]:
    """seq -> (rows, changed rows, landed change rows) as the table page shows them."""
    body = text.split('<table id="commits">')[1]
    head = re.findall(r"<th>([^<]+)</th>", body.split("</thead>")[0])
    out = {}
    for seq, row in re.findall(r'<tr data-seq="(\d+)">(.*?)</tr>', body):
        cells = dict(zip(head, re.findall(r"<td[^>]*>([^<]*)</td>", row), strict=True))
        # (Before, one "change rows" column showed the landed rows: read as the changed rows, it failed on numbers.)
        changed = cells.get("changed rows", cells.get("change rows", ""))
        out[int(seq)] = (cells["rows"], changed, cells.get("landed change rows", ""))
    return out


def test_the_table_page_numbers_are_those_of_versions_and_changes(
    tmp_path: Path, runtime: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = student_doc(tmp_path / "lake", f"ui_numbers_{abs(hash(str(tmp_path))) % 10**8}", keep_versions=10)
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / f"{doc['database']}.{doc['table']}.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("CDC_REGISTRY_DIR", str(registry))
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"sqlite:///{tmp_path}/no-airflow.db")
    cfg = parse_table(doc)
    rt = runtime(cfg)
    ensure_tables(rt)
    land(cfg, "increment_2026112200", [student_rows((1, "ann", "c", 1), (2, "bob", "c", 1), (3, "cy", "c", 1))])
    assert compact_once(rt, "run-1")
    # Four landed change rows: ann twice (one superseded), bob deleted, dee inserted.
    land(
        cfg,
        "increment_2026112201",
        [student_rows((1, "ann b", "u", 2), (1, "ann c", "u", 3), (2, None, "d", 2), (4, "dee", "c", 2))],
    )
    assert compact_once(rt, "run-2")
    erase(cfg, "id = 3", actor="test", metastore=rt.metastore)  # commit 3: one row erased
    rollback(cfg, 1, rt.metastore, by="test")  # commit 4: ann, bob and cy again (cy erased there too)

    page = TestClient(create_app(lambda: lambda wanted: wanted), root_path="/cdc").get(
        f"/cdc/table/{cfg.qualified_name}"
    )
    assert page.status_code == 200
    shown = _page_rows(page.text)

    registry_arg = ["--registry-dir", str(registry)]
    assert main(["versions", cfg.qualified_name, *registry_arg, "--json"]) == 0
    out = capsys.readouterr().out  # the JSON array, after any log lines of the run above
    listed, _ = json.JSONDecoder().raw_decode(out[out.index("[\n") :])
    versions = {v["commit"]: v["rows"] for v in listed}
    changes = {}
    capsys.readouterr()
    for seq in range(1, 5):
        args = ["changes", cfg.qualified_name, *registry_arg, "--from", str(seq - 1), "--to", str(seq)]
        assert main([*args, "--format", "json"]) == 0
        lines = capsys.readouterr().out.splitlines()
        changes[seq] = len([line for line in lines if line.startswith("{") and '"_change_type"' in line])

    # The events above, by hand. The erase removes cy from every kept version (history too), so after it
    # version 1 holds ann, bob (2 inserts); version 2 ann c, dee (ann updated: 2 rows, bob deleted, dee
    # inserted); the erase's version the same (no change left); the rollback's ann, bob (version 1: ann
    # updated back, bob inserted, dee deleted).
    assert versions == {0: 0, 1: 2, 2: 2, 3: 2, 4: 2}
    assert changes == {1: 2, 2: 4, 3: 0, 4: 4}
    for seq in range(1, 5):
        rows, changed, _ = shown[seq]
        assert rows == str(versions[seq]), f"commit {seq}: the page's rows are what versions prints"
        assert changed == str(changes[seq]), f"commit {seq}: the page's changed rows are what changes prints"
    assert [shown[s][2] for s in range(1, 5)] == ["3", "4", "0", "0"], "landed rows: an erase and a rollback read none"
    assert "erase: 1 row erased" in page.text and "rollback to 1" in page.text
