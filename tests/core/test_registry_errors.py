"""Registry errors a new author can act on: ``file:line:column``, a did-you-mean, the fix.

Each case writes a registry file by hand, so the line and column of the mistake are known from the
text itself (counted here, not asked of the project's loader), and checks the exact location and
the hint. The mistakes are the ones a first-time author made: a duration in another notation, a
misspelt field, a YAML syntax error, a preset that chose a column the table lacks, a key written
twice, a registry file that is a dangling symlink, a bad value in the database's defaults file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cdc_compaction.core.exceptions import RegistryError
from cdc_compaction.core.registry import load_registry, parse_entry

REPO = Path(__file__).resolve().parents[2]

# A valid cdc entry, one key per line; line numbers below are counted in this text.
GOOD = """\
database: school
table: pupil
columns:
  - {name: id, type: int}
  - {name: op, type: string}
  - {name: ts_ms, type: bigint}
primary_key: [id]
order_by: [ts_ms]
storage_root: /lake/school/pupil
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def refusal(path: Path) -> RegistryError:
    with pytest.raises(RegistryError) as info:
        parse_entry(path, path.read_text(encoding="utf-8"))
    return info.value


def reports(err: RegistryError, expected: list[str]) -> bool:
    """``err`` shows exactly the ``expected`` lines (``file:line:col: problem; hint``), in any order.

    Checked in the error's text first (what the DAG's failure, the CLI and the UI show), then
    line by line, so nothing else is reported either.
    """
    text = str(err)
    missing = [x for x in expected if x not in text]
    assert not missing, text
    return sorted(err.lines()) == sorted(expected)


def shows(err: RegistryError, start: str, end: str) -> bool:
    """One of ``err``'s lines starts with ``start`` (its location and field) and ends with ``end`` (its hint)."""
    assert start in str(err) and end in str(err), str(err)
    return any(x.startswith(start) and x.endswith(end) for x in err.lines())


def test_the_good_entry_loads(tmp_path: Path) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD)
    assert parse_entry(path, GOOD).qualified_name == "school.pupil"


def test_a_duration_in_another_notation_names_its_line_and_the_accepted_forms(tmp_path: Path) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD + "retry_delay: 5min\nmax_retry_delay: 1h30m\n")
    err = refusal(path)
    forms = (
        "write a duration as a number and one unit (s, m, h, d or w: 90s, 5m, 36h, 7d, 2w; m is minutes), "
        "a number of seconds without quotes (300), or ISO 8601 (PT1H30M)"
    )
    assert reports(
        err,
        [
            f"{path}:10:14: field 'retry_delay': '5min' is not a duration; did you mean '5m'? {forms}",
            f"{path}:11:18: field 'max_retry_delay': '1h30m' is not a duration; did you mean '90m'? {forms}",
        ],
    )
    # Not pydantic's own words, which say nothing to an author.
    assert "identifier in duration" not in str(err)


def test_a_quoted_number_of_seconds_is_told_to_drop_the_quotes(tmp_path: Path) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD + 'retry_delay: "300"\n')
    err = refusal(path)
    assert shows(
        err,
        f"{path}:10:14: field 'retry_delay': '300' is not a duration; "
        "did you mean 300 (a number of seconds: no quotes)? ",
        "or ISO 8601 (PT1H30M)",
    )


def test_misspelt_fields_get_a_did_you_mean_at_their_key(tmp_path: Path) -> None:
    text = GOOD.replace("primary_key:", "primary_keys:") + "retires: 3\n"
    path = write(tmp_path, "school.pupil.yaml", text)
    assert reports(
        refusal(path),
        [
            # The required field is located at the misspelt key too: that is the line to change.
            f"{path}:7:1: field 'primary_key': Field required; line 7 has 'primary_keys': did you mean "
            "primary_key? rename the key to primary_key",
            f"{path}:7:1: field 'primary_keys': Extra inputs are not permitted; did you mean 'primary_key'? "
            "rename the key to primary_key",
            f"{path}:10:1: field 'retires': Extra inputs are not permitted; did you mean 'retries'? "
            "rename the key to retries",
        ],
    )


def test_a_nested_misspelt_field_and_a_field_of_another_mode(tmp_path: Path) -> None:
    text = GOOD + "alerts:\n  email: [ops@example.com]\ndelta: true\n"
    path = write(tmp_path, "school.pupil.yaml", text)
    assert reports(
        refusal(path),
        [
            f"{path}:11:3: field 'alerts.email': Extra inputs are not permitted; did you mean 'emails'? "
            "rename the key to emails",
            f"{path}:12:1: field 'delta': Extra inputs are not permitted; delta is a field of mode: snapshot "
            "tables only; remove it, or set mode: snapshot",
        ],
    )


@pytest.mark.parametrize(
    ("line", "located", "hint"),
    [
        pytest.param("source: debezum\n", "10:9", "did you mean 'debezium'?", id="unknown-preset"),
        pytest.param("mode: keyles\n", "10:7", "did you mean mode: keyless?", id="unknown-mode"),
        pytest.param("schedule: '@daly'\n", "10:11", "did you mean '@daily'?", id="schedule-preset"),
        pytest.param("on_bad_file: quarantaine\n", "10:14", "did you mean 'quarantine'?", id="enum-value"),
    ],
)
def test_unknown_values_get_a_did_you_mean(tmp_path: Path, line: str, located: str, hint: str) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD + line)
    assert shows(refusal(path), f"{path}:{located}: ", f"; {hint}")


@pytest.mark.parametrize(("written", "meant"), [("long", "bigint"), ("integr", "int"), ("datetime", "timestamp")])
def test_an_unknown_hive_type_gets_a_did_you_mean_at_its_value(tmp_path: Path, written: str, meant: str) -> None:
    path = write(
        tmp_path, "school.pupil.yaml", GOOD.replace("{name: ts_ms, type: bigint}", f"{{name: ts_ms, type: {written}}}")
    )
    err = refusal(path)
    assert len(err.problems) == 1
    assert shows(
        err,
        f"{path}:6:25: field 'columns.2.type': unknown Hive type {written!r}: supported are ",
        f"; did you mean {meant!r}?",
    )


def test_a_yaml_syntax_error_names_the_file_and_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD.replace("order_by: [ts_ms]", "order_by: [ts_ms\nenabled: true"))
    err = refusal(path)
    assert reports(
        err,
        [
            f"{path}:9:8: not valid YAML: did not find expected ',' or ']', while parsing a flow sequence "
            "(line 8, column 11); close the [ ] or { } opened before, or quote the value"
        ],
    )
    assert "<unicode string>" not in str(err)


def test_a_preset_column_the_table_lacks_names_the_preset(tmp_path: Path) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD + "source: debezium\n")
    assert reports(
        refusal(path),
        [
            f"{path}:10:9: field 'op_column': '__op' is not among the columns ['id', 'op', 'ts_ms']; op_column is not "
            "set in this file: the source: debezium preset (line 10) chose '__op'; add `op_column: op` to "
            "override the preset"
        ],
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(
            ("primary_key: [id]", "primary_key: [idd]"),
            "7:14: field 'primary_key': ['idd'] not among the columns ['id', 'op', 'ts_ms']; did you mean 'id'?",
            id="key",
        ),
        pytest.param(
            ("storage_root:", "op_column: opp\nstorage_root:"),
            "9:12: field 'op_column': 'opp' is not among the columns ['id', 'op', 'ts_ms']; did you mean 'op'?",
            id="op-column",
        ),
    ],
)
def test_a_misspelt_column_reference_gets_a_did_you_mean(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD.replace(*change))
    assert reports(refusal(path), [f"{path}:{expected}"])


def test_a_missing_op_column_says_the_default_came_from_leaving_it_out(tmp_path: Path) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD.replace("name: op,", "name: kind,"))
    assert reports(
        refusal(path),
        [
            f"{path}:1:1: field 'op_column': 'op' is not among the columns ['id', 'kind', 'ts_ms']; op_column is not "
            "set in this file, so it took its default 'op'; add `op_column: <value>` to the file"
        ],
    )


@pytest.mark.parametrize(
    ("extra", "field", "first", "second", "column"),
    [
        pytest.param("schedule: '@daily'\nschedule: '@hourly'\n", "schedule", 10, 11, 1, id="schedule-twice"),
        pytest.param("storage_root: /lake/school/other\n", "storage_root", 9, 10, 1, id="second-storage-root"),
        pytest.param("spark:\n  conn_id: a\n  conn_id: b\n", "spark.conn_id", 11, 12, 3, id="nested"),
        pytest.param(
            "columns:\n  - {name: id, type: int, type: string}\n", "columns", 3, 10, 1, id="columns-twice-too"
        ),
    ],
)
def test_a_key_written_twice_is_refused_naming_both_lines(
    tmp_path: Path, extra: str, field: str, first: int, second: int, column: int
) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD + extra)
    expected = (
        f"{path}:{second}:{column}: field '{field}': set twice, on line {first} and on line {second}; YAML would "
        "keep only the last value and drop the first without a word: delete one of them"
    )
    err = refusal(path)
    assert expected in str(err) and expected in err.lines(), str(err)


def test_a_key_inside_a_flow_mapping_written_twice_is_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path, "school.pupil.yaml", GOOD.replace("{name: id, type: int}", "{name: id, type: int, type: bigint}")
    )
    assert reports(
        refusal(path),
        [
            f"{path}:4:27: field 'columns.0.type': set twice, on line 4 and on line 4; YAML would keep only the last "
            "value and drop the first without a word: delete one of them"
        ],
    )


def test_a_merge_key_is_no_duplicate(tmp_path: Path) -> None:
    # YAML's merge: an explicit key overrides a merged one on purpose.
    text = (
        GOOD + "alerts: &a\n  emails: [a@example.com]\nspark:\n  <<: {conn_id: x, target_file_mb: 64}\n  conn_id: y\n"
    )
    path = write(tmp_path, "school.pupil.yaml", text)
    assert parse_entry(path, text).spark.conn_id == "y"


def test_a_dangling_symlink_is_an_error_and_the_other_tables_keep_their_dags(tmp_path: Path) -> None:
    from cdc_compaction.airflow import factory

    write(tmp_path, "school.pupil.yaml", GOOD)
    target = tmp_path / "elsewhere" / "school.gone.yaml"
    link = tmp_path / "school.gone.yaml"
    link.symlink_to(target)
    entries = {e.path.name: e for e in load_registry(tmp_path)}
    assert set(entries) == {"school.pupil.yaml", "school.gone.yaml"}
    gone = entries["school.gone.yaml"].error
    assert gone is not None and reports(
        gone,
        [
            f"{link}: is a symbolic link to {target}, which cannot be opened (No such file or directory); "
            f"restore {target}, "
            "point the link at an existing file, or delete the link"
        ],
    )
    assert str(link) in str(gone)
    dags = factory.build_dags(list(entries.values()), view_refresher=False, eraser=False)
    assert sorted(dags) == ["cdc__school__gone", "cdc__school__pupil"]
    assert str(target) in (dags["cdc__school__gone"].doc_md or "")
    assert dags["cdc__school__pupil"].tasks  # the valid table's DAG is whole


def test_a_dangling_defaults_symlink_is_an_error_of_its_databases_tables(tmp_path: Path) -> None:
    write(tmp_path, "school.pupil.yaml", GOOD)
    (tmp_path / "school").mkdir()
    (tmp_path / "school" / "_database.yaml").symlink_to(tmp_path / "nowhere.yaml")
    (entry,) = load_registry(tmp_path)
    assert entry.error is not None and "_database.yaml of database 'school' is invalid" in str(entry.error)
    assert f"is a symbolic link to {tmp_path / 'nowhere.yaml'}" in str(entry.error)


def test_an_error_from_a_default_points_into_the_defaults_file(tmp_path: Path) -> None:
    (tmp_path / "school").mkdir()
    defaults = write(tmp_path / "school", "_database.yaml", "owner: data\nsource: debezium\n")
    path = write(tmp_path, "school.pupil.yaml", GOOD)
    (entry,) = load_registry(tmp_path)
    assert entry.error is not None
    assert reports(
        entry.error,
        [
            f"{defaults}:2:9: field 'op_column': '__op' is not among the columns ['id', 'op', 'ts_ms']; op_column is "
            f"not set in this file: the source: debezium preset (line 2 of {defaults}) chose '__op'; add "
            "`op_column: op` to override the preset"
        ],
    )
    assert entry.path == path


def test_a_bad_value_of_the_defaults_file_is_located_there(tmp_path: Path) -> None:
    (tmp_path / "school").mkdir()
    defaults = write(tmp_path / "school", "_database.yaml", "owner: data\nretires: 5\nretry_delay: 2 hours\n")
    write(tmp_path, "school.pupil.yaml", GOOD)
    (entry,) = load_registry(tmp_path)
    assert entry.error is not None
    from cdc_compaction.core.registry import load_database_defaults

    own = load_database_defaults(tmp_path)["school"].error
    assert own is not None
    assert shows(
        own,
        f"{defaults}:2:1: field 'retires': Extra inputs are not permitted; did you mean 'retries'? ",
        "rename the key to retries",
    )
    assert shows(
        own,
        f"{defaults}:3:14: field 'retry_delay': '2 hours' is not a duration; did you mean '2h'? ",
        "or ISO 8601 (PT1H30M)",
    )
    assert len(own.problems) == 2


def test_a_value_taken_from_the_defaults_file_is_located_there(tmp_path: Path) -> None:
    (tmp_path / "school").mkdir()
    defaults = write(tmp_path / "school", "_database.yaml", "owner: data\nmax_retry_delay: 1m\n")
    write(tmp_path, "school.pupil.yaml", GOOD)
    (entry,) = load_registry(tmp_path)
    assert entry.error is not None and reports(
        entry.error,
        [
            f"{defaults}:2:18: field 'max_retry_delay': must be at least retry_delay (the value comes from the "
            f"database's defaults file {defaults})"
        ],
    )


def test_registry_validate_prints_the_located_problems(tmp_path: Path) -> None:
    write(tmp_path, "school.pupil.yaml", GOOD)
    bad = write(tmp_path, "school.pupal.yaml", GOOD.replace("pupil", "pupal") + "retires: 3\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins")}
    run = subprocess.run(
        [sys.executable, "-m", "cdc_compaction", "registry", "validate", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    assert (
        f"        {bad}:10:1: field 'retires': Extra inputs are not permitted; did you mean 'retries'? "
        "rename the key to retries\n"
    ) in run.stdout, run.stdout


def test_two_tables_on_one_storage_root_are_located_at_their_roots(tmp_path: Path) -> None:
    first = write(tmp_path, "school.pupil.yaml", GOOD)
    second = write(tmp_path, "school.tutor.yaml", GOOD.replace("table: pupil", "table: tutor"))
    entries = {e.path.name: e for e in load_registry(tmp_path)}
    for path, other in ((first, second), (second, first)):
        err = entries[path.name].error
        assert err is not None
        assert str(err).endswith(
            f"{path}:9:15: field 'storage_root': '/lake/school/pupil' overlaps storage_root '/lake/school/pupil' "
            f"of {other} (table school.{other.name.split('.')[1]}); every table needs its own storage root, "
            "neither equal to nor inside another table's"
        ), str(err)


def test_one_table_in_two_files_is_located_at_their_table_lines(tmp_path: Path) -> None:
    yaml_file = write(tmp_path, "school.pupil.yaml", GOOD)
    yml_file = write(tmp_path, "school.pupil.yml", GOOD.replace("/pupil", "/pupil2"))
    for e in load_registry(tmp_path):
        assert e.error is not None
        assert str(e.error).endswith(
            f"{e.path}:2:8: field 'table': school.pupil is defined by several files "
            f"{[yaml_file.name, yml_file.name]}; keep one of them"
        ), str(e.error)


def test_a_too_deep_document_is_located_where_it_gets_too_deep(tmp_path: Path) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD + "tags: " + "[" * 40 + "]" * 40 + "\n")
    # The mapping is level 1, the k-th '[' (column 6 + k) level k + 1: level 33 is the 32nd, column 38.
    assert reports(refusal(path), [f"{path}:10:38: YAML nested deeper than 32 levels"])


def test_a_table_of_a_database_with_a_bad_defaults_file_points_at_the_defaults_problem(tmp_path: Path) -> None:
    (tmp_path / "school").mkdir()
    defaults = write(tmp_path / "school", "_database.yaml", "owner: data\nretires: 5\n")
    write(tmp_path, "school.pupil.yaml", GOOD)
    (entry,) = load_registry(tmp_path)
    assert entry.error is not None
    assert f": {defaults}:2:1: the defaults file {defaults} of database 'school' is invalid" in str(entry.error)


def test_a_key_written_twice_in_the_defaults_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "school").mkdir()
    defaults = write(tmp_path / "school", "_database.yaml", "owner: data\nalerts:\n  emails: [a@x.org]\nowner: ops\n")
    write(tmp_path, "school.pupil.yaml", GOOD)
    from cdc_compaction.core.registry import load_database_defaults

    own = load_database_defaults(tmp_path)["school"].error
    assert own is not None and reports(
        own,
        [
            f"{defaults}:4:1: field 'owner': set twice, on line 1 and on line 4; YAML would keep only the last "
            "value and drop the first without a word: delete one of them"
        ],
    )
    (entry,) = load_registry(tmp_path)
    assert entry.config is None and f"{defaults}:4:1: " in str(entry.error)


def _type_refusal(tmp_path: Path, written: str) -> tuple[Path, str]:
    """The one located problem of an entry whose ts_ms column has the type ``written`` (in the file as is)."""
    path = write(
        tmp_path, "school.pupil.yaml", GOOD.replace("{name: ts_ms, type: bigint}", f"{{name: ts_ms, type: {written}}}")
    )
    err = refusal(path)
    assert len(err.problems) == 1, str(err)
    return path, err.lines()[0]


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        # PostgreSQL
        ('"numeric(12,2)"', "decimal(12,2)"),
        ('"numeric(12, 2)"', "decimal(12,2)"),
        ("numeric(12)", "decimal(12,0)"),
        ("numeric", "decimal(p,s)"),
        ("int8", "bigint"),  # 8 bytes in PostgreSQL; bigint also holds Arrow's 1-byte int8
        ("int4", "int"),
        ("int2", "smallint"),
        ("serial", "int"),
        ("bigserial", "bigint"),
        ("text", "string"),
        ("double precision", "double"),
        ("float8", "double"),
        ("float4", "float"),
        ("real", "float"),
        ("timestamptz", "timestamp"),
        ("timestamp with time zone", "timestamp"),
        ("timestamp(3) without time zone", "timestamp"),
        ("bool", "boolean"),
        ("bytea", "binary"),
        ("uuid", "string"),
        ("jsonb", "string"),
        ("character varying(40)", "varchar(40)"),
        ("character(2)", "char(2)"),
        # MySQL, SQL Server, Oracle, Snowflake
        ("datetime", "timestamp"),
        ("datetime2", "timestamp"),
        ("int(11)", "int"),
        ("tinyint(1)", "tinyint"),  # a display width; the values are -128..127, whatever a driver calls them
        ("bigint unsigned", "decimal(20,0)"),
        ("longtext", "string"),
        ("varbinary(16)", "binary"),
        ('"number(10,0)"', "decimal(10,0)"),
        ("nvarchar(100)", "varchar(100)"),
        ("timestamp_ntz", "timestamp"),
    ],
)
def test_another_systems_type_gets_the_hive_type_that_holds_it(tmp_path: Path, written: str, meant: str) -> None:
    path, line = _type_refusal(tmp_path, written)
    shown = written.strip('"')
    assert line.startswith(f"{path}:6:25: field 'columns.2.type': unknown Hive type {shown!r}: supported are "), line
    assert f"; did you mean {meant!r}?" in line, line


def test_a_valid_parameterized_type_is_accepted_as_written(tmp_path: Path) -> None:
    text = GOOD.replace("type: bigint}", "type: bigint}\n  - {name: code, type: varchar(20)}")
    path = write(tmp_path, "school.pupil.yaml", text)
    assert [c.type for c in parse_entry(path, text).columns][-1] == "varchar(20)"


@pytest.mark.parametrize(
    ("written", "quoted"),
    [("decimal(12,2)", "decimal(12,2)"), ("decimal(12, 2)", "decimal(12,2)"), ("numeric(12,2)", "decimal(12,2)")],
)
def test_an_unquoted_comma_inside_a_type_says_to_quote_it(tmp_path: Path, written: str, quoted: str) -> None:
    """In ``{name: x, type: decimal(12,2)}`` YAML ends the value at the comma: one problem, at the type, saying so."""
    path, line = _type_refusal(tmp_path, written)
    assert line.startswith(f"{path}:6:25: field 'columns.2.type': "), line
    assert "comma" in line and f"type: '{quoted}'" in line, line
    assert "Extra inputs" not in line and "unknown Hive type" not in line, line


@pytest.mark.parametrize(
    ("old", "written", "meant"),  # the key written is the first word of ``written`` unless it says otherwise
    [
        # Hudi, Delta, dbt, Iceberg and the sinks' own words for the registry's fields
        ("primary_key", "pk", "primary_key"),
        ("primary_key", "key", "primary_key"),  # not old_key: a different field
        ("primary_key", "record_key", "primary_key"),
        ("order_by", "precombine_field", "order_by"),
        ("order_by", "sequence_by", "order_by"),
        ("storage_root", "location", "storage_root"),  # not compaction
        ("storage_root", "path", "storage_root"),
        ("columns", "schema", "columns"),  # not schema_changes
        ("columns", "fields", "columns"),
        ("{name", "{column", "name"),  # not comment
        ("type: int}", "data_type: int}", "type"),
        ("type: int}", "type: int, description: the id}", "comment"),
    ],
)
def test_another_systems_field_name_gets_the_registrys(tmp_path: Path, old: str, written: str, meant: str) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD.replace(old, written, 1))
    key = "description" if "description" in written else re.findall(r"\w+", written)[0]
    err = refusal(path)
    # The extra key's line offers the registry's field; a required field it stands for says the same.
    (extra,) = [ln for ln in err.lines() if re.search(rf"'(\w+\.\d+\.)?{key}': Extra inputs are not permitted", ln)]
    assert extra.endswith(f"did you mean {meant!r}? rename the key to {meant}"), extra
    for line in err.lines():
        assert f"'{meant}': Field required" not in line or f"did you mean {meant}?" in line, line


def test_a_schedule_written_as_cron_gets_schedule(tmp_path: Path) -> None:
    path = write(tmp_path, "school.pupil.yaml", GOOD + "cron: '0 * * * *'\n")
    assert shows(refusal(path), f"{path}:10:1: field 'cron'", "did you mean 'schedule'? rename the key to schedule")
