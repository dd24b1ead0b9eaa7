"""Landed files against the registry: unreadable files, schema drift, and the policies for both."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import STUDENT_COLUMNS, compact_once

from cdc_compaction.core.exceptions import BadInputError
from cdc_compaction.core.hive_types import readable_as
from cdc_compaction.core.inputs import check_file
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.sql import table_names
from cdc_compaction.pipeline.plan import plan as run_plan
from cdc_compaction.pipeline.quarantine import Quarantine
from cdc_compaction.pipeline.tables import ensure_tables

# (hive type, arrow type) pairs the policy accepts as safe widening, with a sample value.
WIDENING = [
    ("bigint", pa.int32(), 7),
    ("bigint", pa.int8(), 7),
    ("bigint", pa.uint32(), 7),
    ("int", pa.int16(), 7),
    ("double", pa.float32(), 1.5),
    ("double", pa.int32(), 7),
    ("decimal(10,2)", pa.decimal128(5, 2), Decimal("1.25")),
    ("decimal(10,4)", pa.decimal128(5, 2), Decimal("1.25")),
    ("timestamp", pa.timestamp("ms", tz="UTC"), 1_700_000_000_000),
    ("string", pa.large_string(), "x"),
]
REFUSED = [
    ("int", pa.string()),
    ("int", pa.int64()),  # narrowing loses values
    ("timestamp", pa.timestamp("ns", tz="UTC")),  # Spark cannot read nanoseconds
    ("timestamp", pa.date32()),
    ("decimal(10,2)", pa.decimal128(12, 2)),
    ("decimal(10,2)", pa.decimal128(5, 3)),
    ("boolean", pa.int32()),
    ("date", pa.string()),
]


@pytest.mark.parametrize(("hive", "arrow", "value"), WIDENING, ids=[f"{a}->{h}" for h, a, _ in WIDENING])
def test_accepted_widening(hive: str, arrow: Any, value: Any) -> None:
    assert readable_as(hive, str(arrow))


@pytest.mark.parametrize(("hive", "arrow"), REFUSED, ids=[f"{a}->{h}" for h, a in REFUSED])
def test_refused_types(hive: str, arrow: Any) -> None:
    assert not readable_as(hive, str(arrow))


@pytest.mark.spark
def test_spark_reads_every_accepted_widening(spark: Any, tmp_path: Path) -> None:
    """The policy must not accept anything Spark's Parquet reader then fails on."""
    for i, (hive, arrow, value) in enumerate(WIDENING):
        path = tmp_path / f"f{i}.parquet"
        pq.write_table(pa.table({"c": pa.array([value], type=arrow)}), path)
        for vectorized in ("true", "false"):
            spark.conf.set("spark.sql.parquet.enableVectorizedReader", vectorized)
            rows = spark.read.schema(f"c {hive}").parquet(str(path)).collect()
            assert rows[0]["c"] is not None, (hive, arrow)
    spark.conf.set("spark.sql.parquet.enableVectorizedReader", "true")


def _write(path: Path, columns: dict[str, Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return str(path)


STUDENT = {
    "id": pa.array([1], pa.int32()),
    "full_name": pa.array(["a"]),
    "op": pa.array(["c"]),
    "ts_ms": pa.array([1], pa.int64()),
}


def test_check_file_reports_each_kind_of_drift(make_cfg: Callable[..., TableConfig], tmp_path: Path) -> None:
    cfg = make_cfg()
    ok = check_file(cfg, _write(tmp_path / "ok.parquet", STUDENT))
    assert (ok.rows, ok.problem, ok.ignored_columns, ok.missing_columns) == (1, None, [], [])
    extra = check_file(cfg, _write(tmp_path / "extra.parquet", {**STUDENT, "nickname": pa.array(["x"])}))
    assert extra.ignored_columns == ["nickname"] and "not in the registry" in (extra.problem or "")
    assert "on_extra_columns: ignore" in (extra.problem or "")
    lenient = check_file(make_cfg(on_extra_columns="ignore"), str(tmp_path / "extra.parquet"))
    assert lenient.problem is None and lenient.ignored_columns == ["nickname"]
    missing = check_file(
        cfg, _write(tmp_path / "missing.parquet", {k: v for k, v in STUDENT.items() if k != "full_name"})
    )
    assert missing.problem is None and missing.missing_columns == ["full_name"]
    wrong = check_file(cfg, _write(tmp_path / "wrong.parquet", {**STUDENT, "id": pa.array(["1"])}))
    assert wrong.problem == "incompatible schema: column 'id' is string in the file but int in the registry"
    (tmp_path / "empty.parquet").write_bytes(b"")
    assert check_file(cfg, str(tmp_path / "empty.parquet")).problem == "empty file (0 bytes)"
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 but not really")
    assert "not readable as Parquet" in (check_file(cfg, str(tmp_path / "junk.parquet")).problem or "")


# ------------------------------------------------------------------ through the pipeline
def _base(spark: Any, cfg: TableConfig) -> list[tuple[Any, ...]]:
    name = f"`{cfg.database}`.`{table_names(cfg)['base_table']}`"
    spark.catalog.refreshTable(name)
    return sorted(tuple(r) for r in spark.sql(f"SELECT id, full_name, op, ts_ms FROM {name}").collect())


def _landing(cfg: TableConfig) -> Path:
    return Path(Lake(cfg).layout.incremental) / "increment_2026112200"


@pytest.mark.spark
@pytest.mark.metastore
def test_drift_that_is_safe_is_compacted(make_cfg, runtime, spark) -> None:
    """int -> bigint and a missing column are accepted; an extra column is ignored when the policy says so."""
    rt = runtime(make_cfg(on_extra_columns="ignore"))
    ensure_tables(rt)
    d = _landing(rt.cfg)
    _write(d / "part-0.parquet", {**STUDENT, "ts_ms": pa.array([5], pa.int32())})  # narrower ordering column
    _write(d / "part-1.parquet", {"id": pa.array([2], pa.int16()), "op": pa.array(["c"]), "ts_ms": pa.array([1])})
    _write(d / "part-2.parquet", {**STUDENT, "id": pa.array([3], pa.int32()), "shoe_size": pa.array([44])})
    path = compact_once(rt, "r1")
    files = {f["name"]: f for f in json.loads(Path(path).read_text())["files"]}
    assert files["part-1.parquet"]["missing_columns"] == ["full_name"]
    assert files["part-2.parquet"]["ignored_columns"] == ["shoe_size"]
    assert _base(spark, rt.cfg) == [(1, "a", "c", 5), (2, None, "c", 1), (3, "a", "c", 1)]


@pytest.mark.spark
@pytest.mark.metastore
def test_bad_files_fail_the_run_by_default_and_nothing_moves(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    d = _landing(rt.cfg)
    good = _write(d / "part-0.parquet", STUDENT)
    wrong = _write(d / "part-1.parquet", {**STUDENT, "id": pa.array(["one"])})
    extra = _write(d / "part-2.parquet", {**STUDENT, "nickname": pa.array(["x"])})
    with pytest.raises(BadInputError) as err:
        run_plan(rt, "r1")
    msg = str(err.value)
    assert rt.cfg.qualified_name in msg and "2 landed file(s) cannot be compacted" in msg
    assert f"{wrong}: incompatible schema: column 'id' is string in the file but int in the registry" in msg
    assert f"{extra}: columns ['nickname'] are not in the registry" in msg
    assert "on_bad_file: quarantine" in msg and "Nothing was compacted and nothing was moved" in msg
    assert all(Path(p).exists() for p in (good, wrong, extra))
    assert rt.lake.latest_commit().seq == 0


@pytest.mark.spark
@pytest.mark.metastore
def test_bad_files_are_quarantined_with_reasons_and_the_rest_compacts(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg(on_bad_file="quarantine"))
    ensure_tables(rt)
    d = _landing(rt.cfg)
    _write(d / "part-0.parquet", STUDENT)
    _write(d / "part-1.parquet", {**STUDENT, "id": pa.array(["one"])})
    (d / "part-2.parquet").write_bytes(b"")
    (d / "_SUCCESS").write_text("")  # markers and checksums are not data: never refused
    # (Hadoop writes one beside _SUCCESS; a .crc beside a data file is verified by Hadoop's local FS.)
    (d / "._SUCCESS.crc").write_bytes(b"crc\x00")
    seen: list[list[dict[str, Any]]] = []
    path = run_plan(rt, "r1", on_quarantined=seen.append)
    plan = json.loads(Path(path).read_text())
    assert [f["name"] for f in plan["files"]] == ["part-0.parquet"]
    assert [Path(q["file"]).name for q in plan["quarantined_files"]] == ["part-1.parquet", "part-2.parquet"]
    assert seen == [plan["quarantined_files"]], "the owners are alerted once per plan"
    compact_once(rt, "r1")
    assert _base(spark, rt.cfg) == [(1, "a", "c", 1)]
    (entry,) = Quarantine(rt.lake).entries()
    assert entry.id == f"files/{plan['plan_id']}" and entry.count == 2
    assert entry.reasons == {"empty file (0 bytes)": 1, "incompatible schema": 1}
    kept = Path(entry.path) / "increment_2026112200"
    assert sorted(p.name for p in kept.iterdir()) == ["part-1.parquet", "part-2.parquet"]
    assert not (d / "part-1.parquet").exists(), "moved, not copied: it must not be refused again every hour"


# ------------------------------------------------- what Spark reads / what it cannot
TS_COLUMNS = [*STUDENT_COLUMNS, {"name": "updated_at", "type": "timestamp"}]


@pytest.mark.spark
@pytest.mark.metastore
def test_dictionary_strings_and_int96_timestamps_are_accepted_and_compacted(make_cfg, runtime, spark) -> None:
    """Both are what Spark itself reads (and INT96 is what it writes): no false refusal."""
    rt = runtime(make_cfg(columns=TS_COLUMNS))
    ensure_tables(rt)
    d = _landing(rt.cfg)
    d.mkdir(parents=True)
    at = [datetime(2026, 11, 22, 1, 2, 3, 456789), datetime(2026, 11, 22, 4, 5, 6)]
    table = pa.table(
        {
            "id": pa.array([1, 2], pa.int32()),
            "full_name": pa.array(["Ann", "Ben"]).dictionary_encode(),
            "op": pa.array(["c", "c"]).dictionary_encode(),
            "ts_ms": pa.array([1, 1], pa.int64()),
            "updated_at": pa.array(at, pa.timestamp("us")),
        }
    )
    pq.write_table(table, d / "part-0.parquet", use_deprecated_int96_timestamps=True)
    footer = pq.read_metadata(d / "part-0.parquet")
    assert footer.schema.column(4).physical_type == "INT96"
    assert str(footer.schema.to_arrow_schema().field("full_name").type).startswith("dictionary<values=string")
    assert check_file(rt.cfg, str(d / "part-0.parquet")).problem is None
    compact_once(rt, "r1")
    name = f"`{rt.cfg.database}`.`{table_names(rt.cfg)['base_table']}`"
    spark.catalog.refreshTable(name)
    got = sorted(tuple(r) for r in spark.sql(f"SELECT id, full_name, updated_at FROM {name}").collect())
    assert got == [(1, "Ann", at[0]), (2, "Ben", at[1])]


def test_nanosecond_int64_timestamps_stay_refused(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg(columns=TS_COLUMNS)
    path = tmp_path / "ns.parquet"
    pq.write_table(
        pa.table({**STUDENT, "updated_at": pa.array([1_700_000_000_000_000_001], pa.timestamp("ns"))}),
        path,
        version="2.6",
    )
    assert pq.read_metadata(path).schema.column(4).physical_type == "INT64"
    problem = check_file(cfg, str(path)).problem or ""
    assert "column 'updated_at' is timestamp[ns]" in problem


@pytest.mark.spark
def test_spark_refuses_nanosecond_int64_timestamps(spark: Any, tmp_path: Path) -> None:
    """The other side of the line above: Spark really cannot read them as timestamps."""
    path = tmp_path / "ns.parquet"
    pq.write_table(pa.table({"t": pa.array([1], pa.timestamp("ns"))}), path, version="2.6")
    with pytest.raises(Exception, match=r"(?i)nanos|illegal parquet type"):
        spark.read.schema("t timestamp").parquet(str(path)).collect()


def test_columns_differing_only_by_case_are_a_bad_file(make_cfg, tmp_path: Path) -> None:
    path = _write(tmp_path / "dup.parquet", {**STUDENT, "ID": pa.array([2], pa.int32())})
    problem = check_file(make_cfg(), path).problem
    assert problem == "columns that differ only by case (Spark cannot tell them apart): 'id' and 'ID'"


@pytest.mark.spark
def test_spark_cannot_read_columns_differing_only_by_case(spark: Any, tmp_path: Path) -> None:
    path = _write(tmp_path / "dup.parquet", {**STUDENT, "ID": pa.array([2], pa.int32())})
    with pytest.raises(Exception, match=r"(?i)duplicate|ambiguous"):
        spark.read.schema("id int, full_name string").parquet(path).collect()


@pytest.mark.spark
@pytest.mark.metastore
def test_a_case_clash_file_is_quarantined_and_the_rest_compacts(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg(on_bad_file="quarantine"))
    ensure_tables(rt)
    d = _landing(rt.cfg)
    _write(d / "part-0.parquet", STUDENT)
    _write(d / "part-1.parquet", {**STUDENT, "ID": pa.array([2], pa.int32())})
    compact_once(rt, "r1")
    assert _base(spark, rt.cfg) == [(1, "a", "c", 1)]
    (entry,) = Quarantine(rt.lake).entries()
    assert entry.reasons == {"columns that differ only by case (Spark cannot tell them apart)": 1}


@pytest.mark.spark
@pytest.mark.metastore
def test_a_partition_value_too_long_for_a_directory_name_is_refused_at_plan(make_cfg, runtime) -> None:
    rt = runtime(make_cfg(partition_by={"column": "full_name"}))
    ensure_tables(rt)
    d = _landing(rt.cfg)
    # 200 characters, but ':' is escaped by Spark as %3A and the run of small letters is written ~XX…X~
    # (the partition name's encoding): len("cdc_partition=") 14 + 50 * 3 + 152 = 316 bytes.
    long_value = ":" * 50 + "x" * 150
    names = ["ok", "fine", long_value]
    _write(d / "part-0.parquet", STUDENT)
    _write(
        d / "part-1.parquet",
        {
            "id": pa.array([2, 3, 4], pa.int32()),
            "full_name": pa.array(names),
            "op": pa.array(["c"] * 3),
            "ts_ms": pa.array([1] * 3, pa.int64()),
        },
    )
    with pytest.raises(BadInputError) as err:
        run_plan(rt, "r1")
    msg = str(err.value)
    assert "part-1.parquet" in msg and "row 2:" in msg and "316 bytes" in msg and "over the 255" in msg
    assert "part-0.parquet" not in msg


# ------------------------------------------------------------------ JSON Lines and Avro files (issue 36)
def test_json_and_avro_files_are_checked_cheaply(make_cfg: Callable[..., TableConfig], tmp_path: Path) -> None:
    import io

    import fastavro

    cfg_json = make_cfg(format="json")
    good = tmp_path / "t+0+0.json"
    good.write_text('{"id": 1}\nnull\n\n{"id": 2\n')  # the bad last line is the job's to quarantine, with its line
    assert (check_file(cfg_json, str(good)).rows, check_file(cfg_json, str(good)).problem) == (3, None)
    parquet = tmp_path / "x.json"
    pq.write_table(pa.table({"id": [1]}), parquet)
    assert check_file(cfg_json, str(parquet)).problem.startswith("not JSON Lines (line 1")
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    assert check_file(cfg_json, str(empty)).problem == "empty file (0 bytes)"

    cfg_avro = make_cfg(format="avro")
    buf = io.BytesIO()
    schema = fastavro.parse_schema({"type": "record", "name": "r", "fields": [{"name": "id", "type": "int"}]})
    fastavro.writer(buf, schema, [{"id": i} for i in range(5)], codec="deflate", sync_interval=16)
    avro = tmp_path / "t+0+0.avro"
    avro.write_bytes(buf.getvalue())
    assert (check_file(cfg_avro, str(avro)).rows, check_file(cfg_avro, str(avro)).problem) == (5, None)
    truncated = tmp_path / "cut.avro"
    truncated.write_bytes(buf.getvalue()[:-20])
    assert "not readable as an Avro container file" in (check_file(cfg_avro, str(truncated)).problem or "")
    assert "no Obj" in (check_file(cfg_avro, str(good)).problem or "")
