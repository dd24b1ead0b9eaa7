"""A mode's own outputs go through ``TableMode``: the shared steps never name a mode for them (issue 28 §3).

The snapshot mode's history is the one such output today: its table, its version directory, its
entry of the commit record (``Commit.outputs``; records from before keep it at the top level),
its validation and what retention keeps for it. Expectations come from the on-disk contract
(docs "Table modes", tests/scenarios/snapshot/README.md), not from the modules under test.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from cdc_compaction.core.lake import Commit
from cdc_compaction.core.mode import mode_of, table_modes
from cdc_compaction.core.registry import TableConfig, parse_table

PACKAGE = Path(__file__).resolve().parents[2] / "plugins" / "cdc_compaction"
#: The shared steps and modules that used to name the snapshot or keyless mode for their outputs.
SHARED = [
    *sorted((PACKAGE / "pipeline").glob("*.py")),
    *(
        PACKAGE / name
        for name in (
            "core/lake.py",
            "core/sql.py",
            "integrations/lineage.py",
            "operations/ops.py",
            "operations/erase.py",
            "operations/travel.py",
        )
    ),
]
OUTPUT_MODES = ("snapshot", "keyless")


def _names_a_mode(path: Path) -> list[str]:
    """Where ``path`` imports a mode's own module or registry class, or compares something with its name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(m.startswith(f"cdc_compaction.modes.{n}") for m in mods for n in OUTPUT_MODES):
                found.append(f"{path.name}:{node.lineno} imports {node.module}")
            if any(a.name in ("SnapshotTable", "KeylessTable") for a in node.names):
                found.append(f"{path.name}:{node.lineno} imports a mode's registry class")
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value in OUTPUT_MODES:
                    found.append(f"{path.name}:{node.lineno} compares with {side.value!r}")
    return found


def test_the_shared_steps_do_not_name_a_mode_for_its_outputs() -> None:
    assert SHARED and all(p.is_file() for p in SHARED)
    assert [f for p in SHARED for f in _names_a_mode(p)] == []


def _snapshot_cfg(tmp_path: Path) -> TableConfig:
    return parse_table(
        {
            "database": "bank",
            "table": "accounts",
            "mode": "snapshot",
            "storage_root": str(tmp_path / "lake"),
            "primary_key": ["id"],
            "columns": [{"name": "id", "type": "int"}, {"name": "v", "type": "string"}],
        }
    )


def test_the_snapshot_mode_declares_its_history_and_the_others_declare_nothing(tmp_path: Path) -> None:
    from cdc_compaction.core import sql

    cfg = _snapshot_cfg(tmp_path)
    mode = mode_of(cfg)
    (table,) = mode.extra_tables(cfg)
    assert table.name == "accounts_history" and table.partitions_key == "history"
    # The DDL is the mode's own template, and creates that table with the columns lineage reports.
    ddl = sql.render(table.template, cfg, location="/lake/bank/accounts/base")
    assert table.template.startswith("modes/snapshot/")
    assert "CREATE TABLE IF NOT EXISTS `bank`.`accounts_history` (" in ddl
    body = ddl[ddl.index("(") + 1 : ddl.index("\n)")]
    ddl_columns = [line.strip().split(" ", 2)[:2] for line in body.strip().splitlines()]
    assert [[f"`{n}`", t] for n, t, _ in table.columns] == [[n, t.rstrip(",")] for n, t in ddl_columns]
    assert "PARTITIONED BY (`eff_start_date`)" in ddl and table.columns[-1][:2] == ("eff_start_date", "string")
    (out_dir,) = mode.output_dirs(cfg)
    assert (out_dir.name, out_dir.prefix) == ("history", "eff_start_date=")
    for name, other in table_modes().items():
        if name in ("snapshot",):
            continue
        assert other.output_dirs(cfg) == [] and other.extra_tables(cfg) == [], name
        assert other.commit_outputs(cfg, Commit(0, "v0", "", "", -1, [], []), {}) is None, name


def test_a_commit_record_from_before_outputs_is_read_into_them_and_written_back_in_the_new_form(tmp_path: Path) -> None:
    cfg = _snapshot_cfg(tmp_path)
    mode = mode_of(cfg)
    v1 = "/lake/bank/accounts/base/v00000001-a"
    legacy = {
        "seq": 1,
        "version": "v00000001-a",
        "plan_id": "a",
        "run_id": "r",
        "parent_seq": 0,
        "files": [],
        "increments": [],
        "stats": {},
        "committed_at": "",
        "layout": 2,
        "history": {"2026-11-22": f"{v1}/history/eff_start_date=2026-11-22"},
    }
    old = Commit.from_json(json.dumps(legacy))
    # The mode reads it as it wrote it: its last applied date, the location retention keeps.
    assert mode.plan_fields(cfg, old)["last_applied"] == "2026-11-22"
    assert mode.referenced_locations(cfg, old) == [f"{v1}/history/eff_start_date=2026-11-22"]
    # The next commit carries the parent's partitions on, in the new form only.
    stats = {"history": {"2026-11-23": {"location": "/b/v2/history/eff_start_date=2026-11-23", "rows": 1}}}
    new = Commit(2, "v2", "b", "r", 1, [], [], outputs=mode.commit_outputs(cfg, old, stats))
    doc = json.loads(new.to_json())
    assert "history" not in doc
    assert doc["outputs"] == {
        "history": {
            "2026-11-22": f"{v1}/history/eff_start_date=2026-11-22",
            "2026-11-23": "/b/v2/history/eff_start_date=2026-11-23",
        }
    }
    assert Commit.from_json(new.to_json()) == new
    # A record of any other mode is written as it always was: no outputs key.
    assert "outputs" not in json.loads(Commit.from_json(json.dumps({**legacy, "history": None})).to_json())
    assert "outputs" not in json.loads(Commit(1, "v1", "a", "r", 0, [], []).to_json())


@pytest.mark.parametrize("record", ['{"seq": 1, "history": {}, "outputs": {"history": {"d": "/x"}}}'])
def test_a_record_with_both_forms_keeps_the_new_one(record: str) -> None:
    doc = {"version": "v1", "plan_id": "", "run_id": "", "parent_seq": 0, "files": [], "increments": []}
    commit = Commit.from_json(json.dumps({**json.loads(record), **doc}))
    assert commit.outputs == {"history": {"d": "/x"}}


def test_validate_refuses_data_files_in_a_directory_the_tables_mode_does_not_write(tmp_path: Path) -> None:
    """A history/ in a cdc table's version (or any other unknown directory with data) is refused by name."""
    from cdc_compaction.core.storage.local import LocalStorage
    from cdc_compaction.pipeline.validate import foreign_outputs

    out = tmp_path / "base" / "v00000002-p-a1"
    for rel in ("data/part-0.parquet", "tombstones/part-0.parquet", "history/eff_start_date=2026-11-22/part-0.parquet"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(b"PAR1")
    (out / "_cdc_stats.json").write_text("{}")
    (out / "empty" / "_SUCCESS").parent.mkdir()
    (out / "empty" / "_SUCCESS").write_text("")
    storage = LocalStorage()
    snapshot = table_modes()["snapshot"].output_dirs(_snapshot_cfg(tmp_path))
    assert foreign_outputs(storage, str(out), []) == ["history"]
    assert foreign_outputs(storage, str(out), snapshot) == []
