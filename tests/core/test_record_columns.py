"""The plan judges a JSON file's columns from its records (``schema_changes``), without Spark.

Bare JSON (``schemas.enable=false``) has values only: a new column is typed by its JSON value, and a
column that is null in every record is carried (neither dropped nor half of a rename) but not added
until a value types it.  Written from the registry's documented rules (docs/data.md), not the code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cdc_compaction.core.inputs import check_file
from cdc_compaction.core.registry import parse_table


def _cfg(tmp_path: Path, policy: str) -> Any:
    return parse_table(
        {
            "database": "tests",
            "table": "bare_json",
            "source": "debezium",
            "format": "json",
            "envelope": "debezium",
            "schema_changes": policy,
            "columns": [
                {"name": "id", "type": "int"},
                {"name": "note", "type": "string"},
                {"name": "__op", "type": "string"},
                {"name": "__lsn", "type": "bigint"},
            ],
            "primary_key": ["id"],
            "storage_root": str(tmp_path / "lake"),
        }
    )


def _file(tmp_path: Path, *afters: dict[str, Any]) -> str:
    lines = [json.dumps({"before": None, "after": a, "source": {"lsn": 5}, "op": "c", "ts_ms": 1}) for a in afters]
    path = tmp_path / "t+0+0.json"
    path.write_text("\n".join([*lines, "null"]) + "\n")
    return str(path)


def test_bare_json_new_columns_are_typed_by_their_values_and_all_null_ones_wait(tmp_path: Path) -> None:
    path = _file(tmp_path, {"id": 1, "note": None, "score": 7, "ratio": None}, {"id": 2, "note": None, "score": 8})
    check = check_file(_cfg(tmp_path, "evolve"), path)
    assert check.problem is None
    # score is added as a bigint; ratio (null everywhere) waits; note (null everywhere) is not dropped.
    assert [(c.change, c.column, c.new) for c in check.changes] == [("added", "score", "bigint")]
    assert check.missing_columns == []


def test_bare_json_new_columns_are_a_bad_file_under_fail(tmp_path: Path) -> None:
    check = check_file(_cfg(tmp_path, "fail"), _file(tmp_path, {"id": 1, "note": "x", "score": 7}))
    assert check.problem is not None and "score" in check.problem
