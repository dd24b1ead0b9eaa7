"""The registry's JSON Schema (``registry schema``, shipped as ``registry.schema.json``) and durations.

The schema is checked the way an editor uses it: with a JSON Schema validator on the registry's
YAML files. Expectations come from the README's registry reference, not from the models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_compaction.core.registry import parse_table
from cdc_compaction.core.registry_schema import schema_text

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "registry.schema.json"
EXAMPLES = sorted((REPO / "include" / "registry").glob("*.yaml"))

jsonschema = pytest.importorskip("jsonschema")


def _doc(path: Path) -> dict[str, Any]:
    # As an editor sees YAML: plain JSON values (a YAML date becomes its text).
    return json.loads(json.dumps(yaml.safe_load(path.read_text()), default=str))


@pytest.fixture(scope="module")
def validator() -> Any:
    schema = json.loads(SHIPPED.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_shipped_schema_is_the_generated_one() -> None:
    assert SHIPPED.read_text() == schema_text(), (
        "registry.schema.json is stale: cdc-compaction registry schema --out registry.schema.json"
    )


def test_registry_schema_command_prints_and_writes_it(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins")}
    printed = subprocess.run(
        [sys.executable, "-m", "cdc_compaction", "registry", "schema"], capture_output=True, text=True, env=env
    )
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == json.loads(SHIPPED.read_text())
    out = tmp_path / "schema.json"
    written = subprocess.run(
        [sys.executable, "-m", "cdc_compaction", "registry", "schema", "--out", str(out)], capture_output=True, env=env
    )
    assert written.returncode == 0 and out.read_text() == SHIPPED.read_text()


def test_the_example_registry_files_are_valid_and_name_the_schema(validator: Any) -> None:
    assert EXAMPLES
    for path in EXAMPLES:
        assert list(validator.iter_errors(_doc(path))) == [], path.name
        # The modeline editors read (README, "Editor support").
        assert path.read_text().splitlines()[0] == "# yaml-language-server: $schema=../../registry.schema.json"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"primary_keys": ["id"]}, "a misspelt field"),
        ({"retry_delay": "7 days"}, "a duration not in the documented notation"),
        ({"tombstone_retention": -5}, "a negative number of seconds"),
        ({"mode": "keyless"}, "a keyless table cannot have a primary_key"),
        ({"mode": "upsert"}, "an unknown mode"),
        ({"retries": 101}, "retries above 100"),
        ({"on_bad_file": "skip"}, "on_bad_file outside fail/quarantine"),
        ({"columns": []}, "no columns"),
        ({"alerts": {"emails": ["a@b.c"], "smtp": "x"}}, "an unknown nested field"),
    ],
)
def test_a_broken_entry_fails_the_schema(validator: Any, change: dict[str, Any], why: str) -> None:
    doc = {**_doc(REPO / "include" / "registry" / "school.student.yaml"), **change}
    assert list(validator.iter_errors(doc)), why


def test_the_modes_pick_their_own_fields(validator: Any) -> None:
    """A keyless entry (README, "Table modes"): order_by and no primary_key; a snapshot one: a key and no order."""
    columns = [{"name": "id", "type": "int"}, {"name": "op", "type": "string"}, {"name": "seq", "type": "bigint"}]
    base = {"database": "d", "table": "t", "columns": columns, "storage_root": "/lake/t"}
    assert list(validator.iter_errors({**base, "mode": "keyless", "order_by": ["seq"]})) == []
    assert list(validator.iter_errors({**base, "mode": "snapshot", "primary_key": ["id"]})) == []
    assert list(validator.iter_errors({**base, "mode": "snapshot", "primary_key": ["id"], "order_by": ["seq"]}))
    assert list(validator.iter_errors({**base, "primary_key": ["id"], "order_by": ["seq"]})) == []  # cdc by default


def test_fields_carry_descriptions_and_registry_style_defaults() -> None:
    defs = json.loads(SHIPPED.read_text())["$defs"]
    for model in ("CdcTable", "KeylessTable", "SnapshotTable", "Increments", "Alerts", "SparkSettings", "Views"):
        undocumented = [f for f, p in defs[model]["properties"].items() if not p.get("description")]
        assert undocumented == [], model
    # The README's defaults, in the registry's notation.
    props = defs["CdcTable"]["properties"]
    assert (props["retry_delay"]["default"], props["max_retry_delay"]["default"]) == ("5m", "1h")
    assert (props["tombstone_retention"]["default"], props["lease_timeout"]["default"]) == ("7d", "6h")
    assert defs["EventTime"]["properties"]["unit"]["description"] == (
        "For an integer column: epoch seconds, milliseconds, microseconds or nanoseconds."
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("5m", timedelta(minutes=5)),
        ("90m", timedelta(minutes=90)),
        ("2h", timedelta(hours=2)),
        ("36h", timedelta(hours=36)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(days=14)),
        (600, timedelta(minutes=10)),
    ],
)
def test_durations_in_the_documented_notation(text: Any, expected: timedelta, validator: Any) -> None:
    doc = {**_doc(REPO / "include" / "registry" / "school.student.yaml"), "tombstone_retention": text}
    assert parse_table(doc).tombstone_retention == expected
    assert list(validator.iter_errors(doc)) == []


# pydantic's own forms (ISO 8601 ``PT5M``, ``7 days``, ``01:00:00``) still load, for registries written so;
# the schema offers the documented notation only.
@pytest.mark.parametrize("text", ["5min", "-5m", "1.5h", "h", ""])
def test_durations_outside_the_notation_are_refused(text: str) -> None:
    doc = {**_doc(REPO / "include" / "registry" / "school.student.yaml"), "tombstone_retention": text}
    with pytest.raises(ValueError, match="tombstone_retention"):
        parse_table(doc)
