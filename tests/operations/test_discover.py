"""``registry discover``: a landing root of five tables becomes five valid registry entries and DAGs.

The fixture lands the shapes the presets describe (Debezium from Postgres and from MySQL,
AWS DMS, wal2json) as Parquet written with pyarrow, plus one generic table known only by the
Avro value and key schemas a schema registry serves.  The expected entries below are written
out from that fixture, by hand, from the registry's contract (README, "Source presets").
Pure Python except the one in-process compaction at the end (marked spark and metastore).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cdc_compaction.core.registry import load_registry, load_table
from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.operations.discover import Options, discover, hive_type_of_avro

DB = "shop"
HINTS = {
    "keys": {"customers": ["id"], "orders": ["order_id"], "products": ["product_id"], "accounts": ["account_id"]},
    "order_by": {"events": ["seq"]},
}
UTC_US = pa.timestamp("us", tz="UTC")


def _write(root: Path, table: str, increment: str, name: str, data: dict[str, Any], schema: pa.Schema) -> None:
    d = root / table / "incremental" / increment
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data, schema=schema), d / name)


def _avsc(path: Path, schema: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(schema))


def build_landing(root: Path) -> Path:
    """Five tables, one directory each, as a CDC sink lands them."""
    # Debezium from Postgres (ExtractNewRecordState, add.fields=op,lsn,source.ts_ms, rewrite mode).
    # The second increment adds a column: the footers' union must show it.
    s1 = pa.schema(
        [
            ("id", pa.int32()),
            ("email", pa.string()),
            ("balance", pa.decimal128(12, 2)),
            ("updated_at", UTC_US),
            ("visits", pa.int32()),
            ("__op", pa.string()),
            ("__lsn", pa.int64()),
            ("__source_ts_ms", pa.int64()),
            ("__deleted", pa.string()),
        ]
    )
    row = {
        "id": [1],
        "email": ["a@x.org"],
        "balance": [Decimal("1.50")],
        "updated_at": [1_700_000_000_000_000],
        "visits": [3],
        "__op": ["c"],
        "__lsn": [100],
        "__source_ts_ms": [1_700_000_000_000],
        "__deleted": ["false"],
    }
    _write(root, "customers", "increment_2026112200", "part-0.parquet", row, s1)
    s2 = pa.schema([*s1, ("phone", pa.string())])
    _write(root, "customers", "increment_2026112201", "part-0.parquet", {**row, "phone": ["555"]}, s2)
    # A writer's temporary and a marker are not data: their schemas must not count.
    (root / "customers" / "incremental" / "increment_2026112201" / "_SUCCESS").write_text("")
    _write(
        root,
        "customers",
        "increment_2026112201",
        ".part-1.parquet.tmp",
        {"junk": [1]},
        pa.schema([("junk", pa.int8())]),
    )
    # Debezium from MySQL (add.fields=op,file,pos,row).
    s = pa.schema(
        [
            ("order_id", pa.int64()),
            ("amount", pa.float64()),
            ("note", pa.large_string()),
            ("__op", pa.string()),
            ("__file", pa.string()),
            ("__pos", pa.int64()),
            ("__row", pa.int32()),
        ]
    )
    data = {
        "order_id": [7],
        "amount": [2.5],
        "note": ["n"],
        "__op": ["c"],
        "__file": ["b.1"],
        "__pos": [4],
        "__row": [0],
    }
    _write(root, "orders", "increment_2026112200", "part-0.parquet", data, s)
    # AWS DMS: Op and the transaction sequence as text.
    s = pa.schema(
        [
            ("Op", pa.string()),
            ("AR_H_CHANGE_SEQ", pa.string()),
            ("product_id", pa.int16()),
            ("name", pa.string()),
            ("price", pa.decimal128(10, 2)),
        ]
    )
    data = {"Op": ["I"], "AR_H_CHANGE_SEQ": ["000001"], "product_id": [1], "name": ["p"], "price": [Decimal("9.99")]}
    _write(root, "products", "increment_2026112200", "LOAD00000001.parquet", data, s)
    # wal2json (format-version 1), the LSN landed as a number.
    s = pa.schema(
        [
            ("kind", pa.string()),
            ("lsn", pa.int64()),
            ("account_id", pa.int64()),
            ("holder", pa.string()),
            ("opened", pa.date32()),
            ("active", pa.bool_()),
        ]
    )
    data = {"kind": ["insert"], "lsn": [5], "account_id": [1], "holder": ["h"], "opened": [20000], "active": [True]}
    _write(root, "accounts", "increment_2026112200", "part-0.parquet", data, s)
    # A generic table known only by its schemas (nothing has landed yet).
    _avsc(
        root / "events" / "events-value.avsc",
        {
            "type": "record",
            "name": "Value",
            "namespace": "shop.events",
            "fields": [
                {"name": "event_id", "type": "long"},
                {"name": "op", "type": "string"},
                {"name": "seq", "type": "long"},
                {
                    "name": "amount",
                    "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 18, "scale": 4}],
                },
                {
                    "name": "happened_at",
                    "type": {"type": "long", "logicalType": "timestamp-millis"},
                    "doc": "when it happened",
                },
                {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
                {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
            ],
        },
    )
    _avsc(
        root / "events" / "events-key.avsc",
        {"type": "record", "name": "Key", "fields": [{"name": "event_id", "type": "long"}]},
    )
    return root


def _options(landing: Path, out: Path, **over: Any) -> Options:
    values: dict[str, Any] = {
        "landing_root": str(landing),
        "database": DB,
        "out": out,
        "keys": dict(HINTS["keys"]),
        "order_by": dict(HINTS["order_by"]),
    }
    values.update(over)
    return Options(**values)


def _columns(cfg: Any) -> list[tuple[str, str]]:
    return [(c.name, c.type) for c in cfg.columns]


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins")}
    return subprocess.run(
        [sys.executable, "-m", "cdc_compaction", "registry", "discover", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# -- the five tables, through the real command ------------------------------------------


@pytest.fixture(scope="module")
def discovered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """The landing root and the registry the real CLI wrote for it (run once, as a subprocess)."""
    work = tmp_path_factory.mktemp("discover")
    landing = build_landing(work / "landing")
    out = work / "registry"
    args = [str(landing), "--database", DB, "--out", str(out)]
    for table, cols in HINTS["keys"].items():
        args += ["--key", f"{table}={','.join(cols)}"]
    args += ["--order-by", "events=seq"]
    return landing, out, _run_cli(*args)


def test_cli_writes_one_valid_file_per_table(discovered: Any) -> None:
    _, out, proc = discovered
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "shop.accounts.yaml",
        "shop.customers.yaml",
        "shop.events.yaml",
        "shop.orders.yaml",
        "shop.products.yaml",
    ]
    assert "found 5 table directories: accounts, customers, events, orders, products" in proc.stdout
    assert "5 written (5 valid, 0 to finish), 0 skipped" in proc.stdout
    entries = load_registry(out)
    assert [(e.path.name, e.error) for e in entries if e.error is not None] == []


def test_debezium_postgres_table(discovered: Any) -> None:
    landing, out, _ = discovered
    cfg = load_table(out, "shop.customers")
    assert cfg.source == "debezium"
    assert cfg.storage_root == f"{landing}/customers"
    assert _columns(cfg) == [
        ("id", "int"),
        ("email", "string"),
        ("balance", "decimal(12,2)"),
        ("updated_at", "timestamp"),
        ("visits", "int"),
        ("__op", "string"),
        ("__lsn", "bigint"),
        ("__source_ts_ms", "bigint"),
        ("__deleted", "string"),
        ("phone", "string"),  # only in the second file
    ]
    assert (cfg.primary_key, cfg.order_by, cfg.op_column) == (["id"], ["__lsn"], "__op")
    assert cfg.deleted_column == "__deleted"
    assert cfg.event_time_column == ("__source_ts_ms", "ms")


def test_debezium_mysql_table(discovered: Any) -> None:
    _, out, _ = discovered
    cfg = load_table(out, "shop.orders")
    assert cfg.source == "debezium"
    assert _columns(cfg) == [
        ("order_id", "bigint"),
        ("amount", "double"),
        ("note", "string"),
        ("__op", "string"),
        ("__file", "string"),
        ("__pos", "bigint"),
        ("__row", "int"),
    ]
    assert (cfg.primary_key, cfg.order_by) == (["order_id"], ["__file", "__pos", "__row"])
    assert cfg.order_as == {"__file": "binlog_file"}


def test_dms_table(discovered: Any) -> None:
    _, out, _ = discovered
    cfg = load_table(out, "shop.products")
    assert cfg.source == "dms"
    assert _columns(cfg) == [
        ("Op", "string"),
        ("AR_H_CHANGE_SEQ", "string"),
        ("product_id", "smallint"),
        ("name", "string"),
        ("price", "decimal(10,2)"),
    ]
    assert (cfg.primary_key, cfg.order_by, cfg.op_column, cfg.missing_op) == (
        ["product_id"],
        ["AR_H_CHANGE_SEQ"],
        "Op",
        "read",
    )
    assert (cfg.op_codes.create, cfg.op_codes.update, cfg.op_codes.delete) == ("I", "U", "D")


def test_wal2json_table(discovered: Any) -> None:
    _, out, _ = discovered
    cfg = load_table(out, "shop.accounts")
    assert cfg.source == "wal2json"
    assert _columns(cfg) == [
        ("kind", "string"),
        ("lsn", "bigint"),
        ("account_id", "bigint"),
        ("holder", "string"),
        ("opened", "date"),
        ("active", "boolean"),
    ]
    assert (cfg.primary_key, cfg.order_by, cfg.op_column) == (["account_id"], ["lsn"], "kind")
    assert (cfg.op_codes.create, cfg.op_codes.delete) == ("insert", "delete")


def test_avro_only_generic_table(discovered: Any) -> None:
    _, out, _ = discovered
    cfg = load_table(out, "shop.events")
    assert cfg.source == "generic"
    assert _columns(cfg) == [
        ("event_id", "bigint"),
        ("op", "string"),
        ("seq", "bigint"),
        ("amount", "decimal(18,4)"),
        ("happened_at", "timestamp"),
        ("day", "date"),
        ("kind", "string"),
    ]
    assert [c.comment for c in cfg.columns][4] == "when it happened"
    # The key from events-key.avsc, the order from the --order-by hint.
    assert (cfg.primary_key, cfg.order_by, cfg.op_column) == (["event_id"], ["seq"], "op")


def test_discovered_tables_become_dags(discovered: Any) -> None:
    from cdc_compaction.airflow.factory import build_dags
    from cdc_compaction.core.settings import ERASE_DAG_ID, VIEW_REFRESH_DAG_ID
    from cdc_compaction.pipeline.order import STEP_IDS

    _, out, _ = discovered
    dags = build_dags(load_registry(out))
    assert sorted(dags) == [
        ERASE_DAG_ID,
        "cdc__shop__accounts",
        "cdc__shop__customers",
        "cdc__shop__events",
        "cdc__shop__orders",
        "cdc__shop__products",
        VIEW_REFRESH_DAG_ID,
    ]
    for dag_id in dags:
        if dag_id not in (VIEW_REFRESH_DAG_ID, ERASE_DAG_ID):
            assert {t.task_id for t in dags[dag_id].tasks} == set(STEP_IDS), dag_id
            assert [t.task_id for t in dags[dag_id].tasks] != ["registry_error"]


def test_files_say_where_values_came_from(discovered: Any) -> None:
    _, out, _ = discovered
    text = (out / "shop.customers.yaml").read_text()
    assert "# primary_key: from --key." in text
    assert "# source: recognized from the columns __op, __lsn." in text
    assert "# order_by: filled by the debezium preset: ['__lsn']." in text
    assert "visits, type: int}  # int32 in increment_2026112200/part-0.parquet" in text
    events = (out / "shop.events.yaml").read_text()
    assert "# primary_key: the fields of the key schema events-key.avsc." in events
    assert "the Avro value schema events-value.avsc (no Parquet file has landed yet)" in events
    # Reviewed YAML is still plain data: the comments do not change what it says.
    doc = yaml.safe_load(text)
    assert doc["primary_key"] == ["id"] and "order_by" not in doc


# -- options --------------------------------------------------------------------------


def test_include_and_exclude(tmp_path: Path) -> None:
    landing = build_landing(tmp_path / "landing")
    out = tmp_path / "registry"
    report = discover(_options(landing, out, include=["c*", "o*", "p*"], exclude=["p*"]))
    assert sorted(p.name for p in out.iterdir()) == ["shop.customers.yaml", "shop.orders.yaml"]
    assert dict(report.skipped) == {
        "accounts": "matches no --include pattern ['c*', 'o*', 'p*']",
        "events": "matches no --include pattern ['c*', 'o*', 'p*']",
        "products": "matches --exclude pattern 'p*'",
    }


def test_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    landing = build_landing(tmp_path / "landing")
    out = tmp_path / "registry"
    out.mkdir()
    edited = out / "shop.orders.yaml"
    edited.write_text("# reviewed by hand\n")
    report = discover(_options(landing, out, include=["orders"]))
    assert report.written == []
    assert dict(report.skipped)["orders"] == f"{edited} exists (pass --force to overwrite it)"
    assert edited.read_text() == "# reviewed by hand\n"
    report = discover(_options(landing, out, include=["orders"], force=True))
    assert report.written == [("orders", edited)]
    assert load_table(out, "shop.orders").primary_key == ["order_id"]


def test_a_table_without_a_key_is_written_to_finish(tmp_path: Path) -> None:
    landing = build_landing(tmp_path / "landing")
    out = tmp_path / "registry"
    report = discover(_options(landing, out, include=["accounts"], keys={}))
    path = out / "shop.accounts.yaml"
    assert report.written == [("accounts", path)]
    assert list(report.unfinished) == ["accounts"]
    text = path.read_text()
    assert "# NEEDS EDITS: this file does not validate until you fix:" in text
    (entry,) = load_registry(out)
    assert entry.config is None and entry.error is not None
    message = str(entry.error)
    assert "field 'primary_key'" in message and "ADD_THE_KEY_COLUMNS" in message and "account_id" in message
    assert any("NEEDS EDITS" in line for line in report.lines())
    # Filling in the key is the only edit it needs.
    path.write_text(text.replace("primary_key: [ADD_THE_KEY_COLUMNS]", "primary_key: [account_id]"))
    assert load_table(out, "shop.accounts").order_by == ["lsn"]


def test_a_generic_table_without_order_is_written_to_finish(tmp_path: Path) -> None:
    landing = build_landing(tmp_path / "landing")
    out = tmp_path / "registry"
    report = discover(_options(landing, out, include=["events"], order_by={}))
    assert list(report.unfinished) == ["events"]
    (entry,) = load_registry(out)
    assert entry.error is not None and "ADD_THE_ORDERING_COLUMNS" in str(entry.error)
    assert "field 'order_by'" in str(entry.error)


def test_source_option_overrides_recognition(tmp_path: Path) -> None:
    # A landing with Debezium's op column but no position: recognized as nothing, --source says it.
    landing = tmp_path / "landing"
    s = pa.schema([("id", pa.int32()), ("__op", pa.string()), ("seq", pa.int64())])
    _write(landing, "t", "increment_2026112200", "p.parquet", {"id": [1], "__op": ["c"], "seq": [1]}, s)
    out = tmp_path / "registry"
    report = discover(_options(landing, out, keys={"t": ["id"]}, order_by={"t": ["seq"]}))
    assert list(report.unfinished) == ["t"]  # generic wants an 'op' column
    assert "op_column" in " ".join(report.unfinished["t"])
    discover(_options(landing, out, keys={"t": ["id"]}, order_by={"t": ["seq"]}, source="debezium", force=True))
    cfg = load_table(out, "shop.t")
    assert (cfg.source, cfg.op_column, cfg.order_by) == ("debezium", "__op", ["seq"])


def test_empty_and_badly_named_directories_are_skipped(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    (landing / "empty").mkdir(parents=True)
    (landing / "bad-name").mkdir()
    (landing / "_tmp").mkdir()
    report = discover(_options(landing, tmp_path / "registry", keys={}, order_by={}))
    assert report.found == ["bad-name", "empty"]
    reasons = dict(report.skipped)
    assert "no landed Parquet file and no Avro value schema" in reasons["empty"]
    assert "not a valid identifier" in reasons["bad-name"]
    assert report.written == []


def test_a_column_of_only_nulls_takes_its_type_from_another_file(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    base = {"id": [1], "op": ["c"], "ts_ms": [1]}
    s = [("id", pa.int32()), ("op", pa.string()), ("ts_ms", pa.int64())]
    _write(landing, "t", "increment_2026112200", "a.parquet", {**base, "x": [None]}, pa.schema([*s, ("x", pa.null())]))
    _write(landing, "t", "increment_2026112201", "b.parquet", {**base, "x": ["v"]}, pa.schema([*s, ("x", pa.string())]))
    _write(landing, "u", "increment_2026112200", "a.parquet", {**base, "x": [None]}, pa.schema([*s, ("x", pa.null())]))
    out = tmp_path / "registry"
    report = discover(_options(landing, out, keys={"t": ["id"], "u": ["id"]}, order_by={}))
    assert _columns(load_table(out, "shop.t"))[-1] == ("x", "string")
    assert list(report.unfinished) == ["u"]  # never seen with a value: the reviewer writes the type
    assert "#   - column 'x': only NULLs in every file read" in (out / "shop.u.yaml").read_text()


def test_a_column_whose_type_differs_between_files_gets_a_placeholder_that_fails_validation(tmp_path: Path) -> None:
    """The files disagree: which type the source means is the reviewer's call, never a silent pick."""
    landing = tmp_path / "landing"
    s = [("id", pa.int32()), ("op", pa.string()), ("ts_ms", pa.int64())]
    row = {"id": [1], "op": ["c"], "ts_ms": [1]}
    first = pa.schema([*s, ("n", pa.int32()), ("price", pa.decimal128(12, 2)), ("name", pa.string())])
    second = pa.schema([*s, ("n", pa.int64()), ("price", pa.decimal128(14, 4)), ("name", pa.large_string())])
    third = pa.schema([*s, ("n", pa.string()), ("price", pa.decimal128(12, 2)), ("name", pa.string())])
    data = {**row, "price": [Decimal("1.5")], "name": ["x"]}
    _write(landing, "t", "increment_2026112200", "a.parquet", {**data, "n": [1]}, first)
    _write(landing, "t", "increment_2026112201", "b.parquet", {**data, "n": [2]}, second)
    # Two types another type reads both of: still the reviewer's to write.
    _write(landing, "u", "increment_2026112200", "a.parquet", {**data, "n": [1]}, first)
    _write(landing, "u", "increment_2026112201", "b.parquet", {**data, "n": [2]}, second)
    _write(landing, "u", "increment_2026112202", "c.parquet", {**data, "n": ["3"]}, third)
    out = tmp_path / "registry"
    report = discover(_options(landing, out, keys={"t": ["id"], "u": ["id"]}, order_by={}))
    assert sorted(report.unfinished) == ["t", "u"]
    text = (out / "shop.t.yaml").read_text()
    lines = {line.split("name: ")[1].split(",")[0]: line for line in text.splitlines() if "{name: " in line}
    # int32 and int64; decimal(12,2) and decimal(14,4): each named with its file, in the comment and the todo.
    for col, said in {
        "n": "int32 in increment_2026112200/a.parquet; int64 in increment_2026112201/b.parquet",
        "price": "decimal128(12, 2) in increment_2026112200/a.parquet; "
        "decimal128(14, 4) in increment_2026112201/b.parquet",
    }.items():
        assert "TYPES DIFFER" in lines[col] and f"# types differ: {said}" in lines[col], lines[col]
        assert f"#   - column {col!r}: the files disagree on its type ({said})" in text
    assert "bigint reads every one of them" in lines["n"]
    assert "name, type: string}" in lines["name"]  # string and large_string are one Hive type: no disagreement
    (entry_t, entry_u) = load_registry(out)
    assert entry_t.error is not None and entry_u.error is not None
    assert "columns.3.type" in str(entry_t.error) and "TYPES DIFFER" in str(entry_t.error)
    u = (out / "shop.u.yaml").read_text()
    assert "string in increment_2026112202/c.parquet" in u and "no Hive type reads them all" in u


def test_a_missing_landing_root_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a directory"):
        discover(_options(tmp_path / "nowhere", tmp_path / "registry"))


def test_a_debezium_envelope_schema(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    row = {
        "type": "record",
        "name": "Value",
        "fields": [{"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"]}],
    }
    source = {
        "type": "record",
        "name": "Source",
        "fields": [{"name": "ts_ms", "type": "long"}, {"name": "lsn", "type": ["null", "long"]}],
    }
    envelope = {
        "type": "record",
        "name": "Envelope",
        "fields": [
            {"name": "before", "type": ["null", row]},
            {"name": "after", "type": ["null", "Value"]},
            {"name": "source", "type": source},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"]},
        ],
    }
    _avsc(landing / "people" / "pg.public.people-value.avsc", envelope)
    _avsc(
        landing / "people" / "pg.public.people-key.avsc",
        {"type": "record", "name": "Key", "fields": [row["fields"][0]]},
    )
    out = tmp_path / "registry"
    report = discover(_options(landing, out, keys={}, order_by={}))
    assert report.unfinished == {}, report.lines()
    cfg = load_table(out, "shop.people")
    # 'after' is a reference to the record named in 'before': resolved by name.
    assert _columns(cfg) == [
        ("id", "int"),
        ("name", "string"),
        ("__op", "string"),
        ("__lsn", "bigint"),
        ("__source_ts_ms", "bigint"),
        ("__deleted", "string"),
    ]
    assert (cfg.source, cfg.primary_key, cfg.order_by, cfg.deleted_column) == (
        "debezium",
        ["id"],
        ["__lsn"],
        "__deleted",
    )


def _pg_envelope(row: dict[str, Any]) -> dict[str, Any]:
    """A Debezium PostgreSQL envelope's value schema around ``row``: its source block has ``sequence``."""
    source = {
        "type": "record",
        "name": "Source",
        "fields": [
            {"name": "ts_ms", "type": "long"},
            {"name": "sequence", "type": ["null", "string"]},
            {"name": "lsn", "type": ["null", "long"]},
        ],
    }
    return {
        "type": "record",
        "name": "Envelope",
        "fields": [
            {"name": "before", "type": ["null", row]},
            {"name": "after", "type": ["null", row["name"]]},
            {"name": "source", "type": source},
            {"name": "op", "type": "string"},
        ],
    }


def test_a_postgres_envelope_is_ordered_by_its_commit_position(tmp_path: Path) -> None:
    """source.sequence in the schema: the registry declares __commit_lsn (derived from the record's
    __sequence, never declared itself) and orders by [__commit_lsn, __lsn], which a killed Connect
    worker's re-sent events keep (docs/debezium.md, "A killed Connect worker")."""
    landing = tmp_path / "landing"
    row = {"type": "record", "name": "Value", "fields": [{"name": "id", "type": "int"}]}
    _avsc(landing / "people" / "pg.public.people-value.avsc", _pg_envelope(row))
    _avsc(landing / "people" / "pg.public.people-key.avsc", {"type": "record", "name": "Key", "fields": row["fields"]})
    out = tmp_path / "registry"
    report = discover(_options(landing, out, keys={}, order_by={}))
    assert report.unfinished == {}, report.lines()
    cfg = load_table(out, "shop.people")
    assert [n for n, _ in _columns(cfg)] == ["id", "__op", "__lsn", "__commit_lsn", "__source_ts_ms", "__deleted"]
    assert dict(_columns(cfg))["__commit_lsn"] == "bigint"
    assert cfg.order_by == ["__commit_lsn", "__lsn"]
    text = (out / "shop.people.yaml").read_text()
    assert "add.fields=op,source.ts_ms and lsn,sequence" in text and "__sequence" in text


def test_a_keyless_postgres_envelope_tells_its_events_apart_by_lsn_and_row(tmp_path: Path, pg_shop: str) -> None:
    """A table without a key (the catalog says so): ordered by __commit_lsn, its events told apart by
    [__lsn, __row] -- both derived by the job -- rather than a Kafka offset a re-delivery changes."""
    landing = tmp_path / "landing"
    row = {
        "type": "record",
        "name": "Value",
        "fields": [{"name": "name", "type": ["null", "string"]}, {"name": "visits", "type": ["null", "int"]}],
    }
    _avsc(landing / "visits" / "pg.public.visits-value.avsc", _pg_envelope(row))
    out = tmp_path / "registry"
    discover(_options(landing, out, keys={}, order_by={}, postgres_dsn=pg_shop, include=["visits"]))
    text = (out / "shop.visits.yaml").read_text()
    assert "mode: keyless" in text
    assert "__row" in text and "Kafka offset for a snapshot row" in text
    # The keyless contract also needs before-images, which a flattened record does not carry: the
    # file is written to finish, but its positions are already the ones that survive a re-delivery.
    loaded = yaml.safe_load(text)
    assert {"__commit_lsn": "bigint", "__row": "bigint"}.items() <= {
        c["name"]: c["type"] for c in loaded["columns"]
    }.items()


def test_parquet_with_a_sequence_but_no_commit_position_is_flagged(tmp_path: Path) -> None:
    """Parquet is read as it lands (nothing derived): a sink that wrote __sequence but no __commit_lsn
    gets a CHECK saying what to write, and the order the preset falls back to."""
    landing = tmp_path / "landing"
    schema = pa.schema([("id", pa.int32()), ("__op", pa.string()), ("__lsn", pa.int64()), ("__sequence", pa.string())])
    data = {"id": [1], "__op": ["c"], "__lsn": [7], "__sequence": ['["5","7"]']}
    _write(landing, "people", "increment_2026112200", "p.parquet", data, schema)
    out = tmp_path / "registry"
    discover(_options(landing, out, keys={"people": ["id"]}, order_by={}))
    text = (out / "shop.people.yaml").read_text()
    assert "carry __sequence but no __commit_lsn" in text and "order falls back to ['__lsn']" in text
    assert load_table(out, "shop.people").order_by == ["__lsn"]


def test_an_envelope_without_a_position_and_a_primitive_key_schema(tmp_path: Path) -> None:
    # SQL Server's source block has change_lsn, not lsn: no preset order; a string key names no column.
    landing = tmp_path / "landing"
    row = {"type": "record", "name": "Value", "fields": [{"name": "id", "type": "int"}]}
    source = {"type": "record", "name": "Source", "fields": [{"name": "change_lsn", "type": ["null", "string"]}]}
    fields = [{"name": "before", "type": ["null", row]}, {"name": "after", "type": ["null", "Value"]}]
    fields += [{"name": "source", "type": source}, {"name": "op", "type": "string"}]
    _avsc(landing / "t" / "t-value.avsc", {"type": "record", "name": "Envelope", "fields": fields})
    _avsc(landing / "t" / "t-key.avsc", {"type": "string"})
    out = tmp_path / "registry"
    report = discover(_options(landing, out, keys={}, order_by={}))
    text = (out / "shop.t.yaml").read_text()
    assert "source: debezium" in text and "# source: the value schema is a Debezium envelope." in text
    assert "# primary_key: not found: t-key.avsc names no record fields." in text
    assert "order_by: [ADD_THE_ORDERING_COLUMNS]" in text
    assert list(report.unfinished) == ["t"]


@pytest.mark.parametrize(
    ("avro", "hive"),
    [
        (["null", "long"], "bigint"),
        ("int", "int"),
        ("boolean", "boolean"),
        ("float", "float"),
        ("double", "double"),
        ("bytes", "binary"),
        ({"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10}, "decimal(38,10)"),
        (
            ["null", {"type": "fixed", "size": 8, "name": "F", "logicalType": "decimal", "precision": 9, "scale": 2}],
            "decimal(9,2)",
        ),
        ({"type": "long", "logicalType": "timestamp-millis"}, "timestamp"),
        ({"type": "long", "logicalType": "timestamp-micros"}, "timestamp"),
        (["null", {"type": "int", "logicalType": "date"}], "date"),
        ({"type": "string", "logicalType": "uuid"}, "string"),
        ({"type": "enum", "name": "E", "symbols": ["a"]}, "string"),
    ],
)
def test_avro_types(avro: Any, hive: str) -> None:
    assert hive_type_of_avro(avro)[0] == hive


@pytest.mark.parametrize(
    "avro",
    [
        ["null", "int", "string"],
        {"type": "array", "items": "int"},
        {"type": "record", "name": "R", "fields": []},
        {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 0},
    ],
)
def test_avro_types_without_a_hive_column(avro: Any) -> None:
    hive, why = hive_type_of_avro(avro)
    assert hive is None and why


def test_an_unsupported_column_type_fails_validation_naming_it(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    s = pa.schema([("id", pa.int32()), ("op", pa.string()), ("ts_ms", pa.int64()), ("at", pa.timestamp("ns"))])
    _write(landing, "t", "increment_2026112200", "p.parquet", {"id": [1], "op": ["c"], "ts_ms": [1], "at": [1]}, s)
    out = tmp_path / "registry"
    report = discover(_options(landing, out, keys={"t": ["id"]}, order_by={}))
    assert "Arrow type timestamp[ns] has no Hive type" in " ".join(report.unfinished["t"])
    assert "#   - column 'at': Arrow type timestamp[ns] has no Hive type" in (out / "shop.t.yaml").read_text()
    (entry,) = load_registry(out)
    assert entry.error is not None and "timestamp[ns]" in str(entry.error) and "columns.3.type" in str(entry.error)


def test_database_defaults_apply_to_discovered_files(tmp_path: Path) -> None:
    landing = build_landing(tmp_path / "landing")
    out = tmp_path / "registry"
    (out / DB).mkdir(parents=True)
    (out / DB / "_database.yaml").write_text("owner: shop-team\nalerts: {emails: [shop@example.com]}\n")
    report = discover(_options(landing, out, include=["orders"]))
    assert report.unfinished == {}
    cfg = load_table(out, "shop.orders")
    assert (cfg.owner, cfg.alerts.emails) == ("shop-team", ["shop@example.com"])


def test_the_database_defaults_source_is_used_and_not_overridden(tmp_path: Path) -> None:
    # Debezium's op column but no position column: nothing to recognize, the database says debezium.
    landing = tmp_path / "landing"
    s = pa.schema([("id", pa.int32()), ("__op", pa.string()), ("seq", pa.int64())])
    _write(landing, "t", "increment_2026112200", "p.parquet", {"id": [1], "__op": ["c"], "seq": [1]}, s)
    out = tmp_path / "registry"
    (out / DB).mkdir(parents=True)
    (out / DB / "_database.yaml").write_text("source: debezium\n")
    report = discover(_options(landing, out, keys={"t": ["id"]}, order_by={"t": ["seq"]}))
    assert report.unfinished == {}, report.lines()
    assert "source" not in yaml.safe_load((out / "shop.t.yaml").read_text())
    cfg = load_table(out, "shop.t")
    assert (cfg.source, cfg.op_column) == ("debezium", "__op")


# -- tables without a key --------------------------------------------------------------

KEYLESS_SCHEMA = pa.schema(
    [
        ("name", pa.string()),
        ("visits", pa.int32()),
        ("_before_name", pa.string()),
        ("_before_visits", pa.int32()),
        ("op", pa.string()),
        ("lsn", pa.int64()),
    ]
)
KEYLESS_ROW = {"name": ["a"], "visits": [1], "_before_name": [None], "_before_visits": [None], "op": ["c"], "lsn": [1]}


def test_a_table_whose_files_carry_before_images_is_discovered_keyless(tmp_path: Path) -> None:
    """No key anywhere and a before-image of every data column: the keyless mode's landing shape."""
    landing = tmp_path / "landing"
    _write(landing, "visits", "increment_2026112200", "p.parquet", KEYLESS_ROW, KEYLESS_SCHEMA)
    out = tmp_path / "registry"
    report = discover(_options(landing, out, keys={}, order_by={"visits": ["lsn"]}))
    assert report.unfinished == {}
    text = (out / "shop.visits.yaml").read_text()
    assert "mode: keyless" in text and "primary_key: [" not in text
    cfg = load_table(out, "shop.visits")
    # What the keyless contract says of these columns (tests/scenarios/README.md, "Table shape").
    assert (cfg.mode, cfg.order_by, cfg.op_column, cfg.before_prefix) == ("keyless", ["lsn"], "op", "_before_")
    assert cfg.data_columns == ["name", "visits"]


def test_an_other_before_image_prefix_is_written(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    schema = pa.schema([pa.field(f.name.replace("_before_", "old_"), f.type) for f in KEYLESS_SCHEMA])
    row = {k.replace("_before_", "old_"): v for k, v in KEYLESS_ROW.items()}
    _write(landing, "visits", "increment_2026112200", "p.parquet", row, schema)
    out = tmp_path / "registry"
    assert discover(_options(landing, out, keys={}, order_by={"visits": ["lsn"]})).unfinished == {}
    cfg = load_table(out, "shop.visits")
    assert (cfg.mode, cfg.before_prefix, cfg.data_columns) == ("keyless", "old_", ["name", "visits"])


def test_a_table_without_key_or_before_images_offers_both_ways_to_finish(tmp_path: Path) -> None:
    """Nothing says whether the source has a key: the placeholder stays, and the comment says what keyless needs."""
    landing = build_landing(tmp_path / "landing")
    out = tmp_path / "registry"
    discover(_options(landing, out, include=["accounts"], keys={}))
    text = (out / "shop.accounts.yaml").read_text()
    assert "primary_key: [ADD_THE_KEY_COLUMNS]" in text
    comment = text.split("# primary_key:")[1].split("primary_key: [")[0]
    assert "replace this line with `mode: keyless`" in comment
    assert "_before_X" in comment and "REPLICA IDENTITY FULL" in comment and "order_by" in comment
    assert "mode: keyless" in text.split("# NEEDS EDITS")[1].split("\n# CHECK")[0]


# -- keys and types from a PostgreSQL catalog ---------------------------------------------


@pytest.fixture
def pg_shop(postgres: Any) -> Any:
    """A fresh PostgreSQL database with a keyed table, two keyless ones and one keyed by its replica identity."""
    import random

    from psycopg2 import sql as pgsql

    name = f"discover_{random.randrange(10**9)}"
    postgres.create_database(name)
    conn = postgres.connect(name)
    with conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE items (tenant char(3), item_no bigint, name varchar(40), price numeric(12,2), "
            "weight real, added timestamptz, seen timestamp, note text, active boolean, "
            "PRIMARY KEY (tenant, item_no))"
        )
        cur.execute("CREATE TABLE visits (name text, visits int)")
        cur.execute("ALTER TABLE visits REPLICA IDENTITY FULL")
        cur.execute("CREATE TABLE hits (name text, hits int)")
        cur.execute("CREATE TABLE codes (code varchar(8) NOT NULL, label text)")
        cur.execute("CREATE UNIQUE INDEX codes_code ON codes (code)")
        cur.execute("ALTER TABLE codes REPLICA IDENTITY USING INDEX codes_code")
    conn.commit()
    conn.close()
    try:
        yield postgres.dsn(name)
    finally:
        admin = postgres.connect()
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(pgsql.SQL("DROP DATABASE {}").format(pgsql.Identifier(name)))
        admin.close()


def _pg_landing(root: Path) -> Path:
    """What a Debezium-like sink lands for the tables of ``pg_shop`` (flattened rows plus op, ts_ms, lsn)."""
    control = [("op", pa.string()), ("ts_ms", pa.int64()), ("lsn", pa.int64())]
    items = pa.schema(
        [
            ("tenant", pa.string()),
            ("item_no", pa.int64()),
            ("name", pa.string()),
            ("price", pa.decimal128(12, 2)),
            ("weight", pa.float32()),
            ("added", UTC_US),
            ("seen", pa.timestamp("us")),
            ("note", pa.string()),
            ("active", pa.bool_()),
            *control,
        ]
    )
    row = {
        "tenant": ["ab "],
        "item_no": [1],
        "name": ["n"],
        "price": [Decimal("1.50")],
        "weight": [0.5],
        "added": [1],
        "seen": [1],
        "note": ["x"],
        "active": [True],
        "op": ["c"],
        "ts_ms": [1],
        "lsn": [1],
    }
    _write(root, "items", "increment_2026112200", "p.parquet", row, items)
    _write(
        root,
        "visits",
        "increment_2026112200",
        "p.parquet",
        {**KEYLESS_ROW, "ts_ms": [1]},
        pa.schema([*KEYLESS_SCHEMA, ("ts_ms", pa.int64())]),
    )
    hits = pa.schema([("name", pa.string()), ("hits", pa.int32()), *control])
    _write(
        root,
        "hits",
        "increment_2026112200",
        "p.parquet",
        {"name": ["a"], "hits": [1], "op": ["c"], "ts_ms": [1], "lsn": [1]},
        hits,
    )
    codes = pa.schema([("code", pa.string()), ("label", pa.string()), *control])
    _write(
        root,
        "codes",
        "increment_2026112200",
        "p.parquet",
        {"code": ["c1"], "label": ["l"], "op": ["c"], "ts_ms": [1], "lsn": [1]},
        codes,
    )
    return root


def test_keys_and_types_come_from_the_postgres_catalog(tmp_path: Path, pg_shop: str) -> None:
    """Through the real CLI: the catalog's primary key, exact types and replica identity, no --key hint."""
    landing = _pg_landing(tmp_path / "landing")
    out = tmp_path / "registry"
    args = [str(landing), "--database", DB, "--out", str(out), "--postgres-dsn", pg_shop]
    for t in ("items", "visits", "hits", "codes"):
        args += ["--order-by", f"{t}=lsn"]
    proc = _run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    # PostgreSQL's types as the registry's Hive types (PostgreSQL docs, chapter 8, by hand).
    items = load_table(out, "shop.items")
    assert _columns(items)[:9] == [
        ("tenant", "char(3)"),
        ("item_no", "bigint"),
        ("name", "varchar(40)"),
        ("price", "decimal(12,2)"),
        ("weight", "float"),
        ("added", "timestamp"),
        ("seen", "timestamp"),
        ("note", "string"),
        ("active", "boolean"),
    ]
    assert (items.mode, items.primary_key) == ("cdc", ["tenant", "item_no"])
    text = (out / "shop.items.yaml").read_text()
    assert "# primary_key: the primary key of PostgreSQL public.items." in text
    assert "character(3) in PostgreSQL public.items" in text and "timestamp with time zone" in text
    # No primary key, REPLICA IDENTITY FULL, before-images landed: keyless, and it validates.
    visits = load_table(out, "shop.visits")
    assert (visits.mode, visits.data_columns) == ("keyless", ["name", "visits"])
    assert visits.event_time is not None and visits.event_time.column == "ts_ms"
    vtext = (out / "shop.visits.yaml").read_text()
    assert "public.visits has no primary key (REPLICA IDENTITY FULL)" in vtext
    assert "REPLICA IDENTITY FULL: its updates and deletes log the whole old row" in vtext
    # A unique index as replica identity: its columns are the key.
    assert load_table(out, "shop.codes").primary_key == ["code"]
    assert _columns(load_table(out, "shop.codes"))[0] == ("code", "varchar(8)")
    # No key, REPLICA IDENTITY DEFAULT, no before-images: keyless, to finish, saying what to run.
    (entry,) = [e for e in load_registry(out) if e.path.name == "shop.hits.yaml"]
    assert entry.error is not None and "before-image" in str(entry.error)
    htext = (out / "shop.hits.yaml").read_text()
    assert "mode: keyless" in htext and "ADD_THE_KEY_COLUMNS" not in htext
    assert "ALTER TABLE public.hits REPLICA IDENTITY FULL" in htext
    assert "4 written (3 valid, 1 to finish)" in proc.stdout


def test_the_catalog_type_must_read_every_landed_file(tmp_path: Path, pg_shop: str) -> None:
    """char(3) in PostgreSQL but an integer landed: the catalog does not paper over the files."""
    landing = tmp_path / "landing"
    s = pa.schema([("tenant", pa.int32()), ("item_no", pa.int64()), ("op", pa.string()), ("lsn", pa.int64())])
    _write(
        landing,
        "items",
        "increment_2026112200",
        "p.parquet",
        {"tenant": [1], "item_no": [1], "op": ["c"], "lsn": [1]},
        s,
    )
    out = tmp_path / "registry"
    report = discover(_options(landing, out, keys={}, order_by={"items": ["lsn"]}, postgres_dsn=pg_shop))
    assert list(report.unfinished) == ["items"]
    text = (out / "shop.items.yaml").read_text()
    assert "public.items declares it character(3) (char(3)) but the files hold int32" in text
    assert "columns of PostgreSQL public.items no landed file has" in text


def test_an_unreachable_postgres_is_a_clear_error(tmp_path: Path) -> None:
    from cdc_compaction.devtools.local_services import free_port

    landing = _pg_landing(tmp_path / "landing")
    dsn = f"host=127.0.0.1 port={free_port()} user=postgres password=hunter2 dbname=x connect_timeout=2"
    proc = _run_cli(str(landing), "--database", DB, "--out", str(tmp_path / "registry"), "--postgres-dsn", dsn)
    assert proc.returncode == 2
    assert "cannot connect to PostgreSQL through the DSN" in proc.stderr and "hunter2" not in proc.stderr


def _run_cli_env(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins"), **env}
    cmd = [sys.executable, "-m", "cdc_compaction", "registry", "discover", *args]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=120, check=False)


def test_connection_errors_never_show_a_password(tmp_path: Path, postgres: Any) -> None:
    """A real PostgreSQL refuses the login, or nothing listens, or the DSN does not parse: the error names
    the DSN without its password, in the URI form and in the key-value form, and never PGPASSWORD."""
    from cdc_compaction.devtools.local_services import free_port

    landing = _pg_landing(tmp_path / "landing")
    pg, dead = f"127.0.0.1:{postgres.port}", f"127.0.0.1:{free_port()}"
    cases = {
        # The server answers and refuses: no such role (the fixture's server trusts every known one).
        f"postgresql://nobody:URIPASSWORD1@{pg}/postgres": ["URIPASSWORD1"],
        f"host=127.0.0.1 port={postgres.port} user=nobody password='KV PASSWORD2' dbname=postgres": [
            "KV",
            "PASSWORD2",
        ],
        # Nothing listens.
        f"postgresql://nobody:URIPASSWORD3@{dead}/x?connect_timeout=2": ["URIPASSWORD3"],
        f"host=127.0.0.1 port={dead.split(':')[1]} user=u password=KVPASSWORD4 connect_timeout=2": ["KVPASSWORD4"],
        # libpq cannot read the DSN and quotes from it: an unquoted password with a space.
        f"host=127.0.0.1 port={postgres.port} password=SPACED5 PASSWORD6 dbname=x": ["SPACED5", "PASSWORD6"],
        f"postgresql://u:URI%40PASSWORD7@{pg}/x?sslmode=bogus": ["URI%40PASSWORD7", "URI@PASSWORD7", "PASSWORD7"],
    }
    for dsn, secrets in cases.items():
        out = tmp_path / "registry"
        proc = _run_cli_env(
            str(landing), "--database", DB, "--out", str(out), "--postgres-dsn", dsn, PGPASSWORD="ENVPASSWORD8"
        )
        shown = proc.stdout + proc.stderr
        assert proc.returncode == 2 and "cannot connect to PostgreSQL through the DSN" in proc.stderr, shown
        for secret in [*secrets, "ENVPASSWORD8"]:
            assert secret not in shown, (dsn, shown)
        if dsn.startswith("postgresql://"):
            assert "postgresql://" in proc.stderr and ":******@127.0.0.1" in proc.stderr, shown
        assert not out.exists() or not list(out.iterdir()), "nothing is written when the catalog is unreadable"


#: Type names a source may hold: a newline then a YAML key, a comment mark, quotes, a line separator.
EVIL_ENUM = "mood\ninjected_enum: true"
EVIL_DOMAIN = "code # d'\"\ninjected_domain: {a: 1}\u2028injected_ls: 2"


@pytest.fixture
def pg_evil(postgres: Any) -> Any:
    """A database whose tables use an enum and a domain named to inject YAML keys."""
    import random

    from psycopg2 import sql as pgsql

    name = f"discover_evil_{random.randrange(10**9)}"
    postgres.create_database(name)
    conn = postgres.connect(name)
    enum, domain = pgsql.Identifier(EVIL_ENUM), pgsql.Identifier(EVIL_DOMAIN)
    with conn.cursor() as cur:
        cur.execute(pgsql.SQL("CREATE TYPE {} AS ENUM ('ok', 'sad')").format(enum))
        cur.execute(pgsql.SQL("CREATE DOMAIN {} AS text").format(domain))
        for table in ("landed", "unlanded"):
            cur.execute(
                pgsql.SQL("CREATE TABLE {} (id int PRIMARY KEY, m {}, c {}, note text)").format(
                    pgsql.Identifier(table), enum, domain
                )
            )
    conn.commit()
    conn.close()
    try:
        yield postgres.dsn(name)
    finally:
        admin = postgres.connect()
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(pgsql.SQL("DROP DATABASE {}").format(pgsql.Identifier(name)))
        admin.close()


def test_source_type_names_never_inject_yaml(tmp_path: Path, pg_evil: str) -> None:
    """Enum and domain names with newlines, '#', ':' and quotes reach the comments and a placeholder
    value: the written file is still exactly the keys discover writes, one per line."""
    landing = tmp_path / "landing"
    schema = pa.schema(
        [("id", pa.int32()), ("m", pa.string()), ("c", pa.string()), ("note", pa.string()), ("op", pa.string()),
         ("ts_ms", pa.int64()), ("lsn", pa.int64())]
    )  # fmt: skip
    row = {"id": [1], "m": ["ok"], "c": ["x"], "note": ["n"], "op": ["c"], "ts_ms": [1], "lsn": [1]}
    _write(landing, "landed", "increment_2026112200", "p.parquet", row, schema)
    # Nothing landed yet but an empty value schema: the columns (and their types) come from the catalog.
    _avsc(landing / "unlanded" / "unlanded-value.avsc", {"type": "record", "name": "v", "fields": []})
    out = tmp_path / "registry"
    args = [str(landing), "--database", DB, "--out", str(out), "--postgres-dsn", pg_evil]
    proc = _run_cli(*args, "--order-by", "landed=lsn", "--order-by", "unlanded=lsn")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The unlanded table has no op column landed: discover writes its placeholder.
    for table, keys in (("landed", EXPECTED_KEYS), ("unlanded", EXPECTED_KEYS | {"op_column"})):
        text = (out / f"{DB}.{table}.yaml").read_text()
        assert "injected" in text, "the names are shown (escaped), not dropped"
        for line in text.splitlines():  # every line a comment or a key of the entry, never a name's piece
            assert line.startswith(("#", "  - ")) or line.split(":", 1)[0] in keys, (table, line)
        doc = yaml.safe_load(text)
        assert set(doc) == keys, (table, sorted(doc))
        assert [c["name"] for c in doc["columns"]][:4] == ["id", "m", "c", "note"]
    landed = load_table(out, f"{DB}.landed")  # the files' strings are kept: it validates
    assert _columns(landed)[:4] == [("id", "int"), ("m", "string"), ("c", "string"), ("note", "string")]
    # The catalog's types have no Hive type: refused, naming the file, the field and the type as written.
    val = subprocess.run(
        [sys.executable, "-m", "cdc_compaction", "registry", "validate", "--dir", str(out)],
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert val.returncode == 1, val.stdout + val.stderr
    assert f"OK    {DB}.landed.yaml" in val.stdout, val.stdout
    lines = val.stdout.splitlines()
    at = lines.index(f"ERROR {DB}.unlanded.yaml:")
    problems = lines[at + 1 : at + 3]  # one line per problem, the type names escaped in them
    assert lines[at + 3].startswith("1 invalid of 2"), val.stdout
    for field, problem in zip(("columns.1.type", "columns.2.type"), problems, strict=True):
        assert re.match(rf"^ {{8}}\S*{DB}\.unlanded\.yaml:\d+:\d+: field '{field}': unknown Hive type", problem), (
            problem
        )
        assert "UNSUPPORTED" in problem and "injected" in problem, problem
        assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or ch in "\u2028\u2029" for ch in problem), problem


EXPECTED_KEYS = {"database", "table", "storage_root", "source", "primary_key", "order_by", "columns"}


# -- one discovered table compacts ------------------------------------------------------


@pytest.mark.spark
@pytest.mark.metastore
def test_a_discovered_table_compacts(tmp_path: Path, runtime: Any) -> None:
    """The wal2json table as discovered (no edits), compacted once in-process: its row is in the base."""
    from conftest import compact_once

    from cdc_compaction.core.sql import table_names

    landing = build_landing(tmp_path / "landing")
    out = tmp_path / "registry"
    (out / "dsc").mkdir(parents=True)
    # Settle at once: the fixture's increment is old and complete.
    (out / "dsc" / "_database.yaml").write_text("increments: {settle_seconds: 0, wait_for_hour_end: false}\n")
    discover(_options(landing, out, database="dsc", include=["accounts"]))
    cfg = load_table(out, "dsc.accounts")
    started = time.monotonic()
    rt = runtime(cfg)
    from cdc_compaction.pipeline.tables import ensure_tables

    ensure_tables(rt)
    assert compact_once(rt, "discover-1")
    spark = rt.engine.spark  # type: ignore[attr-defined]
    name = f"`dsc`.`{table_names(cfg)['base_table']}`"
    spark.catalog.refreshTable(name)
    rows = [tuple(r) for r in spark.sql(f"SELECT account_id, holder, active FROM {name}").collect()]
    assert rows == [(1, "h", True)]
    print(f"discovered table compacted in {time.monotonic() - started:.1f}s")


def test_a_schema_registry_that_does_not_answer_is_named_with_what_to_check(tmp_path: Path) -> None:
    import socket

    from cdc_compaction.integrations.schema_registry import SchemaRegistryError
    from cdc_compaction.operations.discover import Options, discover

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/apis/ccompat/v7"
    with pytest.raises(
        SchemaRegistryError, match=rf"the schema registry {re.escape(url)} could not be read .*check the URL"
    ):
        discover(Options(landing_root=str(tmp_path), database="cdc", out=tmp_path / "reg", schema_registry=url))
    assert not (tmp_path / "reg").exists()
