"""Views in every reader's dialect, from the one rule (cdc_compaction.core.dialects, duckdb_views).

What runs here runs for real: Spark and DuckDB execute their views in the conformance
and generative suites (against the compaction and a reference model); this module checks
what cannot run on this machine as far as it can be checked -- Hive's view text with
Hive's own parser from the pyspark wheel, Hive's NaN comparison with Hive's own
comparison operator, Trino's encoding as Trino stores it -- and pins the Hive and Trino
renderings (tests/golden/; regenerate with ``CDC_UPDATE_GOLDEN=1``).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlglot
from sqlglot import exp

from cdc_compaction.core import dialects, duckdb_views, sql
from cdc_compaction.core.registry import TableConfig, load_table, parse_table

SHIPPED_REGISTRY = Path(__file__).resolve().parents[2] / "include" / "registry"
GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def orders(**views: Any) -> TableConfig:
    cfg = load_table(SHIPPED_REGISTRY, "shop.orders")
    return cfg.model_copy(update={"views": cfg.views.model_copy(update=views)}) if views else cfg


def _subtrees(tree: exp.Expression) -> list[exp.Expression]:
    return list(tree.walk())


@pytest.mark.parametrize("dialect", ["spark", "hive", "trino"])
@pytest.mark.parametrize("kind", ["view", "rejects"])
def test_every_dialect_applies_the_jobs_rule(dialect: str, kind: str) -> None:
    """Each rendering parses in its own dialect and holds the job's rule expressions, translated."""
    cfg = orders()
    text = dialects.query(cfg, kind, dialect, dialects.metastore_sources(cfg))
    tree = sqlglot.parse_one(text, read=dialect)
    rule = sql.rule_sql(cfg)
    parts = [rule.reject_reason] + ([rule.rank, rule.is_delete] if kind == "view" else [])
    nodes = _subtrees(tree)
    for part in parts:
        want = sqlglot.parse_one(sqlglot.transpile(part, read="spark", write=dialect)[0], read=dialect)
        assert any(n == want for n in nodes), f"{dialect} {kind}: the rule's {part[:40]!r}... is not in\n{text}"


def test_nan_is_refused_in_every_dialect() -> None:
    cfg = parse_table(
        {
            "database": "d",
            "table": "t",
            "columns": [
                {"name": "id", "type": "int"},
                {"name": "op", "type": "string"},
                {"name": "seq", "type": "double"},
            ],
            "primary_key": ["id"],
            "order_by": ["seq"],
            "storage_root": "/tmp/nan-dialects",
        }
    )
    src = dialects.metastore_sources(cfg)
    assert "ISNAN(`seq`)" in dialects.query(cfg, "view", "spark", src)
    assert 'IS_NAN("seq")' in dialects.query(cfg, "view", "trino", src)
    # Hive has no isnan(), and its operators hold NaN equal to NaN (checked with Hive's own operators below).
    hive = dialects.query(cfg, "view", "hive", src)
    assert "`seq` = CAST('NaN' AS DOUBLE)" in hive and "ISNAN(" not in hive.upper()


@pytest.mark.parametrize(("dialect", "kind"), [(d, k) for d in ("hive", "trino") for k in ("view", "rejects")])
def test_renderings_are_pinned(dialect: str, kind: str) -> None:
    """What cannot run here is pinned: a change to it must be looked at (CDC_UPDATE_GOLDEN=1 rewrites)."""
    cfg = orders()
    text = dialects.query(cfg, kind, dialect, dialects.metastore_sources(cfg)) + "\n"
    path = GOLDEN / f"shop.orders.{kind}.{dialect}.sql"
    if os.environ.get("CDC_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs from the rendering; CDC_UPDATE_GOLDEN=1 to accept it"


def test_trino_views_use_trinos_own_encoding() -> None:
    cfg = orders(metastore=["trino"], trino_catalog="awsdatacatalog")
    view = next(v for v in dialects.metastore_views(cfg) if v.kind == "view")
    assert view.name == "orders_view" and view.dialect == "trino"
    text = dialects.trino_view_text(view, "awsdatacatalog")
    assert text.startswith("/* Presto View: ") and text.endswith(" */")
    doc = dialects.decode_trino_view_text(text)
    assert doc["catalog"] == "awsdatacatalog" and doc["schema"] == "shop"
    assert doc["columns"] == [
        {"name": "tenant", "type": "varchar"},
        {"name": "order_no", "type": "bigint"},
        {"name": "amount", "type": "decimal(12,2)"},
        {"name": "status", "type": "varchar"},
        {"name": "timestamp", "type": "timestamp(6)"},
        {"name": "order", "type": "integer"},
        {"name": "op", "type": "varchar"},
        {"name": "ts_ms", "type": "bigint"},
        {"name": "lsn", "type": "bigint"},
    ]
    tree = sqlglot.parse_one(doc["originalSql"], read="trino")
    assert {t.name for t in tree.find_all(exp.Table)} == {"orders_base", "orders_tombstones", "orders_incremental"}
    assert '"$path"' in doc["originalSql"]


def test_view_names_of_further_dialects_are_suffixed() -> None:
    cfg = orders(metastore=["spark", "hive", "trino"])
    assert dialects.view_names(cfg) == {
        "spark": {"view": "orders_view", "rejects": "orders_pending_rejects"},
        "hive": {"view": "orders_view_hive", "rejects": "orders_pending_rejects_hive"},
        "trino": {"view": "orders_view_trino", "rejects": "orders_pending_rejects_trino"},
    }


# ---------------------------------------------------------------------- DuckDB, executed
def _write(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def _duck_table(tmp_path: Path, **more: str) -> TableConfig:
    """Table ``d.t`` (key ``id``, ordered by ``ts``, ``op`` c/u/d) with the columns ``more`` (name=type), its
    DuckDB views in ``views.sql`` under ``tmp_path``."""
    columns = [("id", "int"), *more.items(), ("op", "string"), ("ts", "bigint")]
    return parse_table(
        {
            "database": "d",
            "table": "t",
            "columns": [{"name": n, "type": t} for n, t in columns],
            "primary_key": ["id"],
            "order_by": ["ts"],
            "storage_root": str(tmp_path / "lake"),
            "views": {"duckdb": str(tmp_path / "views.sql")},
        }
    )


def test_duckdb_views_rank_dedupe_and_hide_deletes(tmp_path: Path) -> None:
    """The DuckDB script over real files: base, tombstones and pending events, ranked by the contract's rule.

    Expectations are the contract's, written out by hand: greatest order_by wins, then the later
    increment, file and row; a tombstone hides its key from older events; refused rows are listed.
    """
    cfg = _duck_table(tmp_path, name="string")
    stored = pa.schema(
        [
            ("id", pa.int32()),
            ("name", pa.string()),
            ("op", pa.string()),
            ("ts", pa.int64()),
            ("_cdc_increment", pa.string()),
            ("_cdc_file", pa.string()),
            ("_cdc_pos", pa.int64()),
            ("_cdc_ingested_at", pa.timestamp("us")),
        ]
    )
    landed = pa.schema([("id", pa.int32()), ("name", pa.string()), ("op", pa.string()), ("ts", pa.int64())])
    base = _write(
        tmp_path / "v1" / "data" / "part-0.parquet",
        [
            {"id": 1, "name": "Ann", "op": "c", "ts": 1, "_cdc_increment": "increment_2026010100"},
            {"id": 2, "name": "Bob", "op": "c", "ts": 1, "_cdc_increment": "increment_2026010100"},
            {"id": 3, "name": "Cy", "op": "c", "ts": 5, "_cdc_increment": "increment_2026010100"},
        ],
        stored,
    )
    tomb = _write(
        tmp_path / "v1" / "tombstones" / "part-0.parquet",
        [{"id": 4, "name": None, "op": "d", "ts": 9, "_cdc_increment": "increment_2026010100"}],
        stored,
    )
    inc = tmp_path / "lake" / "incremental" / "increment_2026010101"
    f0 = _write(
        inc / "part-00000.parquet",
        [
            {"id": 1, "name": "Ann B", "op": "u", "ts": 2},  # newer: wins
            {"id": 2, "name": None, "op": "d", "ts": 2},  # a delete: hides Bob
            {"id": 3, "name": "stale", "op": "u", "ts": 4},  # older than the base row: loses
            {"id": 4, "name": "late", "op": "c", "ts": 8},  # older than the tombstone: stays deleted
            {"id": 5, "name": "first", "op": "c", "ts": 7},  # a full tie with the next row: the later row wins
            {"id": 5, "name": "second", "op": "c", "ts": 7},
            {"id": None, "name": "keyless", "op": "c", "ts": 7},  # refused
        ],
        landed,
    )
    f1 = _write(inc / "part-00001.parquet", [{"id": 6, "name": "odd", "op": "x", "ts": 1}], landed)  # refused
    files = duckdb_views.Files(data=[base], tombstones=[tomb], pending=[f0, f1])
    script = duckdb_views.script(cfg, files)
    with duckdb.connect() as con:
        con.execute(script)
        view = con.execute('SELECT id, name FROM "d"."t_view" ORDER BY id').fetchall()
        rejects = con.execute(
            'SELECT id, _cdc_file, _cdc_pos, _cdc_reject_reason FROM "d"."t_pending_rejects" ORDER BY _cdc_file'
        ).fetchall()
        base_rows = con.execute('SELECT id, name FROM "d"."t_base" ORDER BY id').fetchall()
    assert view == [(1, "Ann B"), (3, "Cy"), (5, "second")]
    assert rejects == [(None, "part-00000.parquet", 6, "null_key:id"), (6, "part-00001.parquet", 0, "unknown_op")]
    assert base_rows == [(1, "Ann"), (2, "Bob"), (3, "Cy")]


def test_duckdb_views_of_an_empty_table_answer(tmp_path: Path) -> None:
    """No files anywhere (a new table): the views answer with no rows instead of DuckDB's 'no files found'."""
    cfg = orders(duckdb=str(tmp_path / "v.sql"))
    with duckdb.connect() as con:
        con.execute(duckdb_views.script(cfg, duckdb_views.Files()))
        assert con.execute('SELECT count(*) FROM "shop"."orders_view"').fetchone() == (0,)
        assert con.execute('SELECT count(*) FROM "shop"."orders_pending_rejects"').fetchone() == (0,)
        assert con.execute('SELECT count(*) FROM "shop"."orders_base"').fetchone() == (0,)


def test_duckdb_views_go_to_a_database_file(tmp_path: Path) -> None:
    from cdc_compaction.core.storage import LocalStorage

    cfg = orders(duckdb=str(tmp_path / "lake.duckdb"))
    assert duckdb_views.write(cfg, duckdb_views.Files(), LocalStorage()) == str(tmp_path / "lake.duckdb")
    with duckdb.connect(str(tmp_path / "lake.duckdb"), read_only=True) as con:
        names = {
            r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE schema_name = 'shop'").fetchall()
        }
    assert names == {"orders_base", "orders_view", "orders_pending_rejects"}


@pytest.mark.s3
def test_a_local_duckdb_script_of_an_s3_lake_is_written_locally(tmp_path: Path, aws_default: str) -> None:
    """``views.duckdb`` is a local script while the lake is on S3 (the lake's storage is S3's): the script
    is written where it says, on local disk, not refused by the lake's S3 storage."""
    from cdc_compaction.core.storage.s3 import S3Storage

    cfg = orders(duckdb=str(tmp_path / "views" / "orders.sql"))
    cfg = cfg.model_copy(update={"storage_root": "s3a://lake-bucket/lake/orders"})
    assert duckdb_views.write(cfg, duckdb_views.Files(), S3Storage()) == str(tmp_path / "views" / "orders.sql")
    with duckdb.connect() as con:
        con.execute((tmp_path / "views" / "orders.sql").read_text())
        assert con.execute('SELECT count(*) FROM "shop"."orders_view"').fetchone() == (0,)


#: Microsecond instants: a reader that shifts by a zone's offset, or rounds, differs.
AT = {i: datetime(2026, 11, 22, i, 2, 3, 100_000 + i * 1_001, tzinfo=UTC) for i in range(1, 7)}


def test_duckdb_views_show_int96_and_int64_timestamps_as_the_same_instants_in_any_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live version mixing Spark's INT96 files (older versions, no zone flag, written in UTC) with INT64
    microseconds adjusted to UTC (what the job writes now), and pending files of both kinds: every view
    shows each row's instant, as Spark does, in a process and a DuckDB session whose zone is New York.

    The instants are the ones written here (the contract: a ``timestamp`` is an instant, INT96 holds it in
    UTC); DuckDB's own reading of the mixed files casts INT96 through the session's zone."""
    import time

    from cdc_compaction.core.storage import LocalStorage

    cfg = _duck_table(tmp_path, updated_at="timestamp")
    utc = pa.timestamp("us", tz="UTC")
    stored = pa.schema(
        [
            ("id", pa.int32()),
            ("op", pa.string()),
            ("ts", pa.int64()),
            ("updated_at", utc),
            ("_cdc_increment", pa.string()),
            ("_cdc_file", pa.string()),
            ("_cdc_pos", pa.int64()),
            ("_cdc_ingested_at", utc),
        ]
    )
    landed = pa.schema([("id", pa.int32()), ("op", pa.string()), ("ts", pa.int64()), ("updated_at", utc)])

    def parquet(path: Path, rows: list[dict[str, Any]], schema: pa.Schema, int96: bool) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, use_deprecated_int96_timestamps=int96)
        return str(path)

    def stored_row(i: int) -> dict[str, Any]:
        return {"id": i, "op": "c", "ts": 1, "updated_at": AT[i], "_cdc_increment": "increment_2026010100"}

    data = tmp_path / "v2" / "data"
    base = [
        parquet(data / "_cdc_partition=a" / "part-0.parquet", [stored_row(1)], stored, int96=True),
        parquet(data / "_cdc_partition=b" / "part-0.parquet", [stored_row(2)], stored, int96=False),
    ]
    inc = tmp_path / "lake" / "incremental" / "increment_2026010101"
    pending = [
        parquet(inc / "part-00000.parquet", [{"id": 3, "op": "c", "ts": 2, "updated_at": AT[3]}], landed, int96=True),
        parquet(inc / "part-00001.parquet", [{"id": 4, "op": "c", "ts": 2, "updated_at": AT[4]}], landed, int96=False),
        # Refused (no key): the rejects view shows its instant too.
        parquet(
            inc / "part-00002.parquet", [{"id": None, "op": "c", "ts": 2, "updated_at": AT[5]}], landed, int96=True
        ),
    ]
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        where = duckdb_views.write(cfg, duckdb_views.Files(data=base, pending=pending), LocalStorage())
        assert where is not None
        with duckdb.connect() as con:
            con.execute("SET TimeZone = 'America/New_York'")
            con.execute(Path(where).read_text())

            def instants(query: str) -> dict[Any, datetime]:
                # A naive value is read as UTC (how a session set to UTC shows Spark's values).
                rows = con.execute(query).fetchall()
                return {k: at if at.tzinfo else at.replace(tzinfo=UTC) for k, at in rows}

            assert instants('SELECT id, updated_at FROM "d"."t_base"') == {i: AT[i] for i in (1, 2)}
            assert instants('SELECT id, updated_at FROM "d"."t_view"') == {i: AT[i] for i in (1, 2, 3, 4)}
            assert instants('SELECT _cdc_file, updated_at FROM "d"."t_pending_rejects"') == {
                "part-00002.parquet": AT[5]
            }
            # Instants, displayed in the session's zone (as Spark's timestamp is in spark.sql.session.timeZone).
            for view in ("t_base", "t_view", "t_pending_rejects"):
                (kind,) = con.execute(f'SELECT DISTINCT typeof(updated_at) FROM "d"."{view}"').fetchone()
                assert kind == "TIMESTAMP WITH TIME ZONE", view
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


# ----------------------------------------------------------------- Hive, from the wheel
@pytest.mark.spark
@pytest.mark.parametrize("kind", ["view", "rejects"])
def test_hive_views_parse_with_hives_own_parser(spark: Any, kind: str) -> None:
    """HiveQL is checked by Hive 2.3's parser (hive-exec from the pyspark wheel), not only by sqlglot."""
    cfg = orders(metastore=["spark", "hive"])
    text = dialects.query(cfg, kind, "hive", dialects.metastore_sources(cfg))
    driver = spark._jvm.org.apache.hadoop.hive.ql.parse.ParseDriver()
    dump = driver.parse(text).dump()
    assert "TOK_QUERY" in dump and "INPUT__FILE__NAME" in dump
    assert ("TOK_WINDOWSPEC" in dump) == (kind == "view")
    with pytest.raises(Exception, match=r"ParseException|cannot recognize"):
        driver.parse(text + " WHERE WHERE")


@pytest.mark.spark
def test_hives_own_equality_is_how_the_hive_view_finds_nan(spark: Any) -> None:
    """Hive has no isnan(), and its comparison operators treat NaN as equal to itself (Java's compareTo):
    ``x <> x`` would never find a NaN.  The Hive view asks ``x = CAST('NaN' AS DOUBLE)``; Hive's own
    operators (their UDFs from the wheel's hive-exec, run in Spark) show that this finds NaN, float
    NaN too, and nothing else."""
    for name, cls in (("hive_eq", "GenericUDFOPEqual"), ("hive_ne", "GenericUDFOPNotEqual")):
        spark.sql(f"CREATE TEMPORARY FUNCTION {name} AS 'org.apache.hadoop.hive.ql.udf.generic.{cls}'")
    nan = "CAST('NaN' AS DOUBLE)"
    row = spark.sql(
        f"SELECT hive_ne({nan}, {nan}) AS ne_self, hive_eq({nan}, {nan}) AS nan, "
        f"hive_eq(CAST(CAST('NaN' AS FLOAT) AS DOUBLE), {nan}) AS float_nan, hive_eq(1.5D, {nan}) AS num, "
        f"hive_eq(CAST('Infinity' AS DOUBLE), {nan}) AS inf, hive_eq(CAST(NULL AS DOUBLE), {nan}) AS nul"
    ).first()
    assert row.asDict() == {"ne_self": False, "nan": True, "float_nan": True, "num": False, "inf": False, "nul": None}


def _table(name: str, columns: str, **fields: Any) -> TableConfig:
    """A table ``crm.<name>`` with ``columns`` ("name:type ...") and views in three metastore dialects."""
    cols = [dict(zip(("name", "type"), c.split(":"), strict=True)) for c in columns.split()]
    doc = {"database": "crm", "table": name, "columns": cols, "storage_root": f"/lake/crm/{name}"}
    return parse_table({**doc, "views": {"metastore": ["spark", "hive", "trino"]}, **fields})


def _mode_tables() -> dict[str, TableConfig]:
    """A table of every mode and cdc option whose view SQL differs from the plain cdc rule."""
    return {
        "keyless": _table(
            "visits",
            "name:string n:int _before_name:string _before_n:int op:string lsn:bigint",
            mode="keyless",
            order_by=["lsn"],
        ),
        "cdc-options": _table(
            "people",
            "id:int bio:string _before_id:int op:string lsn:bigint",
            primary_key=["id"],
            order_by=["lsn"],
            old_key=["_before_id"],
            unchanged={"columns": ["bio"]},
        ),
        # Source presets: a binlog file compared as a number, a boolean delete marker, full-load
        # rows without op or order (NULLS FIRST/LAST spelled out).
        "debezium-mysql": _table(
            "binlog",
            "id:int bio:string __op:string __file:string __pos:bigint __deleted:boolean",
            source="debezium",
            primary_key=["id"],
            unchanged={"columns": ["bio"]},
        ),
        "dms": _table(
            "dms",
            "id:int bio:string Op:string AR_H_CHANGE_SEQ:string",
            source="dms",
            primary_key=["id"],
            unchanged={"columns": ["bio"], "marker": "null"},
        ),
        # The snapshot mode's rejects view hashes the key in SQL (sha2 over the canonical text).
        "snapshot": _table(
            "accounts",
            "id:int bank:string bal:decimal(12,2) as_of:date",
            mode="snapshot",
            primary_key=["bank", "id"],
            business_date={"column": "as_of"},
        ),
    }


@pytest.mark.spark
@pytest.mark.parametrize("name", ["keyless", "cdc-options", "debezium-mysql", "dms", "snapshot"])
def test_every_modes_hive_view_parses_with_hives_own_parser(spark: Any, name: str) -> None:
    """The keyless fold (sequence() spelled for Hive) and the cdc options' windows and unions parse in Hive 2.3."""
    cfg = _mode_tables()[name]
    driver = spark._jvm.org.apache.hadoop.hive.ql.parse.ParseDriver()
    for kind in ("view", "rejects"):
        text = dialects.query(cfg, kind, "hive", dialects.metastore_sources(cfg))
        assert "TOK_QUERY" in driver.parse(text).dump(), text
        if name == "keyless" and kind == "view":
            assert "SEQUENCE" not in text.upper() and "SPLIT(SPACE(" in text.upper()
        # The other dialects at least parse in sqlglot (no engine of theirs runs here).
        for dialect in ("trino", "duckdb"):
            sources = dialects.metastore_sources(cfg)
            sqlglot.parse_one(dialects.query(cfg, kind, dialect, sources), read=dialect)
