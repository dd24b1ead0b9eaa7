"""The benchmark's own pieces (``bench/``): deterministic data, the peer engines' rule, the report.

Fast (no Spark): the peer engines are checked against a small hand-computed case of the
compaction rule, so that the benchmark's checksum compares the compaction with a peer
that applies the same rule. DuckDB, Polars and matplotlib come from
``requirements-bench.txt``, which ``make test`` installs; a bare ``pytest`` without them
skips those tests.

Two slower ones run ``bench/compaction.py`` itself at a tiny size (2,000 rows), with real
spark-submit jobs, a real metastore and a real Spark Connect server: the warm measurement
lands in ``compaction.json`` and ``RESULTS.md``, and a terminated run leaves no process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import datagen  # noqa: E402
import peer  # noqa: E402
import report  # noqa: E402
import spark_peer  # noqa: E402

from cdc_compaction.core.registry import parse_table  # noqa: E402

INGESTED = "2026-02-01T00:00:00+00:00"
BASE_AT = datetime(2026, 1, 20, tzinfo=UTC)
COLUMNS = [
    {"name": "id", "type": "bigint"},
    {"name": "name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
]


def test_datagen_is_deterministic_and_has_every_kind_of_change(tmp_path: Path) -> None:
    a = datagen.generate(tmp_path / "a", 2000, 0.1, seed=7, reuse=False)
    b = datagen.generate(tmp_path / "b", 2000, 0.1, seed=7, reuse=False)
    for part in ("initial", "change"):
        assert datagen.read_dir(a[part]["directory"]).equals(datagen.read_dir(b[part]["directory"]))
    other = datagen.generate(tmp_path / "c", 2000, 0.1, seed=8, reuse=False)
    assert not datagen.read_dir(a["change"]["directory"]).equals(datagen.read_dir(other["change"]["directory"]))

    initial = datagen.read_dir(a["initial"]["directory"]).to_pylist()
    assert len({r["id"] for r in initial}) == 2000 and a["initial"]["tombstones"] == 10
    change = datagen.read_dir(a["change"]["directory"])
    assert change.schema == datagen.SCHEMA and len(change.schema) == 20
    assert len(a["change"]["files"]) == datagen.CHANGE_FILES
    rows = change.to_pylist()
    ops = {r["op"] for r in rows}
    assert {"u", "d", "c", "x"} <= ops
    assert any(r["ts_ms"] is not None and r["ts_ms"] < datagen.T0_MS for r in rows), "late events"
    assert any(r["id"] is None for r in rows) and any(r["ts_ms"] is None for r in rows), "refused rows"
    assert any(r["id"] is not None and r["id"] > 2000 for r in rows), "inserts"
    # The registry entry the benchmark uses is a valid one.
    parse_table(datagen.registry_doc("cdc_t", str(tmp_path / "lake")))


def _write(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


def _case(tmp_path: Path) -> dict[str, Any]:
    """Base: keys 1-4 (4 a tombstone). Increment: the rule's cases, over two files."""
    types = {"bigint": pa.int64(), "string": pa.string()}
    schema = pa.schema([(c["name"], types[c["type"]]) for c in COLUMNS])
    meta = pa.schema(
        [
            *schema,
            ("_cdc_increment", pa.string()),
            ("_cdc_file", pa.string()),
            ("_cdc_pos", pa.int64()),
            ("_cdc_ingested_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    prov = {"_cdc_increment": "increment_2026011000", "_cdc_file": "part-00000.parquet", "_cdc_ingested_at": BASE_AT}
    base = [
        {"id": 1, "name": "one", "op": "r", "ts_ms": 100, "_cdc_pos": 0, **prov},
        {"id": 2, "name": "two", "op": "r", "ts_ms": 100, "_cdc_pos": 1, **prov},
        {"id": 3, "name": "three", "op": "r", "ts_ms": 100, "_cdc_pos": 2, **prov},
        {"id": 4, "name": "four", "op": "d", "ts_ms": 300, "_cdc_pos": 3, **prov},
    ]
    _write(tmp_path / "base" / "part-0.parquet", base, meta)
    inc = tmp_path / "incremental" / "increment_2026013101"
    f0 = _write(
        inc / "part-00000.parquet",
        [
            {"id": 1, "name": "one-new", "op": "u", "ts_ms": 200},  # newer: wins
            {"id": 2, "name": "two-late", "op": "u", "ts_ms": 50},  # older than the base: loses
            {"id": 3, "name": "three-a", "op": "u", "ts_ms": 500},  # tie on ts_ms with the next file...
            {"id": 4, "name": "four-late", "op": "c", "ts_ms": 200},  # older than the tombstone: loses
            {"id": None, "name": "no key", "op": "c", "ts_ms": 900},  # refused
            {"id": 6, "name": "bad op", "op": "x", "ts_ms": 900},  # refused
        ],
        schema,
    )
    f1 = _write(
        inc / "part-00001.parquet",
        [
            {"id": 3, "name": "three-b", "op": "u", "ts_ms": 500},  # ...the later file wins
            {"id": 5, "name": "five", "op": "c", "ts_ms": 600},  # insert...
            {"id": 5, "name": "five-gone", "op": "d", "ts_ms": 600},  # ...deleted at the same ts, later row
        ],
        schema,
    )
    return {
        "columns": COLUMNS,
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "op_column": "op",
        "op_codes": {"create": "c", "read": "r", "update": "u", "delete": "d"},
        "base_location": str(tmp_path / "base"),
        "files": [f0, f1],
        "ingested_at": INGESTED,
        "tombstone_cutoff": "2026-01-01T00:00:00+00:00",
        "threads": 1,
        "memory_limit_mb": 256,
        "target_file_mb": 16,
    }


EXPECTED = {
    1: ("one-new", "u", "increment_2026013101", "part-00000.parquet", 0),
    2: ("two", "r", "increment_2026011000", "part-00000.parquet", 1),
    3: ("three-b", "u", "increment_2026013101", "part-00001.parquet", 0),
    4: ("four", "d", "increment_2026011000", "part-00000.parquet", 3),
    5: ("five-gone", "d", "increment_2026013101", "part-00001.parquet", 2),
}


@pytest.mark.parametrize("split", [False, True], ids=["one-dir", "tombstones-apart"])
@pytest.mark.parametrize("engine", ["duckdb", "polars", "delta"])
def test_peer_applies_the_compaction_rule(tmp_path: Path, engine: str, split: bool) -> None:
    """Also with the base's tombstones in a directory of their own, as a version keeps them."""
    pytest.importorskip({"delta": "deltalake"}.get(engine, engine))
    spec = _case(tmp_path)
    if split:
        table = pq.read_table(str(tmp_path / "base"))
        dead = pc.equal(table.column("op"), "d")
        pq.write_table(table.filter(pc.invert(dead)), tmp_path / "base" / "part-0.parquet")
        _write(tmp_path / "tomb" / "part-0.parquet", table.filter(dead).to_pylist(), table.schema)
        spec["base_tombstones_location"] = str(tmp_path / "tomb")
    out = tmp_path / f"out-{engine}"
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    assert peer.main(["--engine", engine, "--spec", str(spec_file), "--out", str(out)]) == 0
    rows = pq.read_table(str(out)).to_pylist()
    got = {r["id"]: (r["name"], r["op"], r["_cdc_increment"], r["_cdc_file"], r["_cdc_pos"]) for r in rows}
    assert got == EXPECTED
    ingested = {r["id"]: r["_cdc_ingested_at"].replace(tzinfo=UTC) for r in rows}
    assert ingested[2] == BASE_AT and ingested[1] == datetime.fromisoformat(INGESTED)


@pytest.mark.parametrize("engine", ["duckdb", "polars", "delta"])
def test_peer_drops_expired_tombstones(tmp_path: Path, engine: str) -> None:
    """A cutoff after the base's tombstone (key 4) and before the increment's delete (key 5): 4 goes, 5 stays."""
    pytest.importorskip({"delta": "deltalake"}.get(engine, engine))
    spec = {**_case(tmp_path), "tombstone_cutoff": "2026-01-25T00:00:00+00:00"}
    out = tmp_path / "out"
    peer.ENGINES[engine](spec, str(out))
    got = {r["id"]: r["name"] for r in pq.read_table(str(out)).to_pylist()}
    assert got == {k: v[0] for k, v in EXPECTED.items() if k != 4}


@pytest.mark.spark
@pytest.mark.extended  # three spark-submit JVMs per variant: 250 s each on the loaded 2-core machine
@pytest.mark.parametrize("variant", ["delta_cow", "delta_dv"])
def test_spark_peer_merges_by_the_compaction_rule(tmp_path: Path, variant: str) -> None:
    """delta-spark's MERGE (bench/spark_peer.py) on the rule's cases: ours' rows, and the checksum of them."""
    from cdc_compaction.core.jarcache import JarError, group_jars

    try:
        jars = group_jars(spark_peer.JAR_GROUP)
    except JarError as exc:
        pytest.skip(f"make jars fetches the Spark peers' jars: {exc}")
    spec = {**_case(tmp_path), "tombstone_cutoff": "2026-01-25T00:00:00+00:00"}
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    app = str(BENCH / "spark_peer.py")
    submit = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[1]"]
    submit += [*spark_peer.submit_extra(jars), "--conf", "spark.sql.session.timeZone=UTC"]
    submit += [app, "--spec", str(spec_file)]
    table, out = str(tmp_path / "table"), str(tmp_path / "rows")
    for args in (
        ["--mode", "prepare", "--table", str(tmp_path / "base_cow"), "--dv-table", str(tmp_path / "base_dv")],
        ["--mode", "cold", "--variant", variant, "--table", table],
    ):
        if args[1] == "cold":
            spark_peer.fresh_copy(str(tmp_path / ("base_cow" if variant == "delta_cow" else "base_dv")), table)
        proc = subprocess.run([*submit, *args], env=_bench_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
    export = ["--mode", "warm", "--variant", variant, "--table", table, "--repeats", "0"]
    proc = subprocess.run(
        [*submit, *export, "--cold-table", table, "--cold-export", out],
        env=_bench_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = pq.read_table(out).to_pylist()
    got = {r["id"]: (r["name"], r["op"], r["_cdc_increment"], r["_cdc_file"], r["_cdc_pos"]) for r in rows}
    # The cutoff drops the base's tombstone (4) and keeps the increment's (5), as ours does.
    assert got == {k: v for k, v in EXPECTED.items() if k != 4}
    duck = tmp_path / "duck"
    peer.run_duckdb(spec, str(duck))
    assert peer.checksum(out, COLUMNS, "op", "d") == peer.checksum(str(duck), COLUMNS, "op", "d")


@pytest.mark.extended  # three spark-submit JVMs of the second Spark (4.1.4) per variant
@pytest.mark.parametrize("variant", ["iceberg_cow", "iceberg_mor"])
def test_iceberg_spark_peer_merges_by_the_compaction_rule(tmp_path: Path, variant: str) -> None:
    """Iceberg's MERGE INTO (bench/spark_peer.py, Spark 4.1.4) on the rule's cases: ours' rows, cold and warm."""
    from cdc_compaction.core.jarcache import JarError, group_jars
    from cdc_compaction.devtools import iceberg_spark

    try:
        jars = group_jars(iceberg_spark.JAR_GROUP)
        home = iceberg_spark.spark_home()
    except (JarError, iceberg_spark.IcebergSparkError) as exc:
        pytest.skip(f"make jars and make iceberg-spark install the Iceberg peers' Spark: {exc}")
    spec = {**_case(tmp_path), "tombstone_cutoff": "2026-01-25T00:00:00+00:00"}
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    app = str(BENCH / "spark_peer.py")
    submit = [str(home / "bin" / "spark-submit"), "--master", "local[1]"]
    submit += [*spark_peer.submit_extra(jars, spark_peer.ICEBERG_CONF), "--conf", "spark.sql.session.timeZone=UTC"]
    submit += [app, "--spec", str(spec_file)]
    env = spark_peer.iceberg_env(str(home), _bench_env())
    warehouse, cold, warm = str(tmp_path / "warehouse"), str(tmp_path / "cold"), str(tmp_path / "warm")
    cold_export = ["--cold-table", warehouse, "--cold-export", cold]
    for args in (
        ["--mode", "prepare", "--table", warehouse, "--iceberg", variant],
        ["--mode", "cold", "--variant", variant, "--table", warehouse],
        # One warm run: the table set back to its base snapshot and MERGEd again; the cold result exported first.
        [
            "--mode",
            "warm",
            "--variant",
            variant,
            "--table",
            warehouse,
            "--repeats",
            "1",
            "--export",
            warm,
            *cold_export,
        ],
    ):
        proc = subprocess.run([*submit, *args], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
    # It ran on the second Spark, not the pinned one (the driver log names the Spark version).
    assert f"Spark version {iceberg_spark.SPARK_VERSION}" in proc.stderr, proc.stderr[-2000:]
    duck = tmp_path / "duck"
    peer.run_duckdb(spec, str(duck))
    for out in (cold, warm):
        rows = pq.read_table(out).to_pylist()
        got = {r["id"]: (r["name"], r["op"], r["_cdc_increment"], r["_cdc_file"], r["_cdc_pos"]) for r in rows}
        # The cutoff drops the base's tombstone (4) and keeps the increment's (5), as ours does.
        assert got == {k: v for k, v in EXPECTED.items() if k != 4}, out
        assert peer.checksum(out, COLUMNS, "op", "d") == peer.checksum(str(duck), COLUMNS, "op", "d")


def test_checksum_ignores_row_order_and_file_layout_but_not_values(tmp_path: Path) -> None:
    pytest.importorskip("duckdb")
    spec = _case(tmp_path)
    peer.run_duckdb(spec, str(tmp_path / "a"))
    table = pq.read_table(str(tmp_path / "a"))
    (tmp_path / "b").mkdir()
    reordered = table.take(list(reversed(range(table.num_rows))))
    pq.write_table(reordered.slice(0, 2), tmp_path / "b" / "x.parquet")
    pq.write_table(reordered.slice(2), tmp_path / "b" / "y.parquet")
    (tmp_path / "c").mkdir()
    names = table.column("name").to_pylist()
    changed = table.set_column(1, "name", pa.array(["changed", *names[1:]]))
    pq.write_table(changed, tmp_path / "c" / "z.parquet")
    a, b, c = (peer.checksum(str(tmp_path / d), COLUMNS, "op", "d") for d in "abc")
    assert a == b and a["rows"] == 5 and a["tombstones"] == 2
    assert c["hash_all"] != a["hash_all"] and c["rows"] == a["rows"]


def test_report_renders_the_compaction_and_other_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    job = {"wall_s": 10.0, "cpu_s": 8.0, "peak_rss_mb": 900.0, "rows_per_s": 1000, "returncode": 0}
    out = {"files": 2, "min_mb": 1.0, "median_mb": 1.5, "max_mb": 2.0, "total_mb": 3.0}
    check = {"rows": 10, "tombstones": 1, "hash_all": "1", "hash_visible": "2"}
    dataset = {
        "dataset": "1k x 1%",
        "input_rows": 1010,
        "jobs": {
            "floor": {**job, "output": out},
            "ours": {**job, "wall_s": 12.0, "output": out},
            "delta": {**job, "wall_s": 4.0, "output": out},
        },
        "ratios": {"ours/floor": 1.2, "ours/floor (cpu)": 1.0, "ours/delta": 3.0},
        "steps": {"plan_s": 0.1, "validate_s": 0.2, "ensure_tables_s": 0.0},
        "checksums": {"ours": check, "duckdb": check},
        "checksums_match": True,
    }
    (tmp_path / "compaction.json").write_text(json.dumps({"datasets": [dataset], "initial_loads": []}))
    (tmp_path / "parse.json").write_text(json.dumps({"tables": 500, "seconds": 0.8, "runs": [{"n": 1, "s": 0.1}]}))
    hourly = {"target": "spark_connect plan_to_refresh_view_seconds <= 8", "met": False}
    hourly["metrics"] = {"spark_connect_plan_to_refresh_view_seconds": 9.5, "connect_server_start_seconds": 7.0}
    (tmp_path / "hourly_connect.json").write_text(json.dumps(hourly))
    text = report.write_report(tmp_path).read_text()
    # The targets first: the compaction's ratio per dataset, then each benchmark's own target with the
    # metric it names (not the others) and whether it was met.
    assert text.index("## Targets") < text.index("## Compaction")
    assert "| compaction 1k x 1% | ours / floor (wall) <= 1.3 | 1.20 (CPU 1.00) | yes |" in text
    row = "| hourly_connect | spark_connect plan_to_refresh_view_seconds <= 8 | "
    assert f"{row}spark_connect_plan_to_refresh_view_seconds 9.50 | **no** |" in text
    assert "| 1k x 1% | 1,010 | **ours** | 12.0 |" in text
    # delta-rs by its name, with its ratio beside the others' (those not run shown as -).
    assert "| 1k x 1% | 1,010 | delta-rs | 4.0 |" in text
    assert "| ours / floor | ours / floor (CPU) | <= 1.3x | ours / duckdb | ours / polars | ours / delta-rs |" in text
    assert "| 1k x 1% | 1.20 | 1.00 | yes | - | - | 3.00 |" in text
    assert "## parse" in text and "| tables | 500 |" in text
    assert (tmp_path / "compaction.png").stat().st_size > 0


def test_report_splits_ours_over_the_floor_into_a_fixed_and_a_proportional_part(tmp_path: Path) -> None:
    """At a tiny change ours - floor is the fixed part; a larger change's excess beyond it is proportional."""
    check = {"rows": 10, "tombstones": 1, "hash_all": "1", "hash_visible": "2"}

    def dataset(name: str, fraction: float, events: int, floor: float, ours: float, warm: tuple[float, float]) -> dict:
        job = {"cpu_s": 1.0, "peak_rss_mb": 900.0, "rows_per_s": 1000, "returncode": 0}
        return {
            "dataset": name,
            "base_rows": 1_000_000,
            "change_fraction": fraction,
            "increment_rows": events,
            "input_rows": 1_000_000 + events,
            "jobs": {
                "floor": {**job, "wall_s": floor},
                "ours": {**job, "wall_s": ours},
                "floor_warm": {**job, "wall_s": warm[0]},
                "ours_warm": {**job, "wall_s": warm[1]},
            },
            "ratios": {"ours/floor": round(ours / floor, 3)},
            "steps": {},
            "checksums": {"ours": check},
            "checksums_match": True,
        }

    # Listed out of order: the tiniest change of the size is the split's base whatever the order.
    data = {
        "datasets": [
            dataset("1M x 10%", 0.1, 200_000, 30.0, 42.0, (20.0, 29.0)),
            dataset("1M x 0.01%", 0.0001, 120, 20.0, 24.5, (10.0, 12.5)),
            # Another size with no tiny change: no split for it.
            {**dataset("5M x 1%", 0.01, 60_000, 50.0, 60.0, (40.0, 45.0)), "base_rows": 5_000_000},
        ],
        "initial_loads": [],
    }
    (tmp_path / "compaction.json").write_text(json.dumps(data))
    text = report.write_report(tmp_path).read_text()
    # cold: fixed 24.5 - 20 = 4.5; at 10 %: 42 - 30 = 12 over the floor, 12 - 4.5 = 7.5 of it proportional,
    # 7.5 s per 200,000 events = 3.75 s per 100k. warm: fixed 2.5; 9 over, 6.5 proportional, 3.25 per 100k.
    assert "| 1,000,000 | cold | 1M x 0.01%: 4.50 | 1M x 10% | 12.00 | 7.50 | 3.75 |" in text
    assert "| 1,000,000 | warm | 1M x 0.01%: 2.50 | 1M x 10% | 9.00 | 6.50 | 3.25 |" in text
    assert "5,000,000 |" not in text.split("fixed part s")[1].split("\n\n")[0]
    # The target is the warm fixed part: 2.5 s is within 3 s.
    target = "| compaction 1,000,000 rows, fixed part | ours - floor at a tiny change (1M x 0.01%, warm) <= 3 s |"
    assert f"{target} 2.50 s | yes |" in text
    data["datasets"][1]["jobs"]["ours_warm"]["wall_s"] = 13.5
    (tmp_path / "compaction.json").write_text(json.dumps(data))
    assert "| 3.50 s | **no** |" in report.write_report(tmp_path).read_text()


def test_report_sets_ours_beside_the_spark_peers_and_says_what_is_missing(tmp_path: Path) -> None:
    """A run of its own (spark_peers.json): ours / delta-spark cold and warm, the read, the target, Iceberg and Hudi."""
    job = {"wall_s": 30.0, "cpu_s": 20.0, "peak_rss_mb": 900.0, "rows_per_s": 1000, "returncode": 0}
    check = {"rows": 10, "tombstones": 1, "hash_all": "1", "hash_visible": "2"}
    dataset = {
        "dataset": "1M x 1%",
        "input_rows": 1010000,
        "jobs": {
            "ours": {**job, "wall_s": 24.0},
            "ours_warm": {**job, "wall_s": 12.0},
            "delta_cow": {**job, "phases": {"merge_s": 20.0, "wall_s": 20.0}},
            "delta_cow_warm": {"wall_s": 16.0, "merge_s": 16.0, "ours_read_s": 2.0, "runs_wall_s": [16.0]},
            "delta_dv": {**job, "wall_s": 20.0},
            "delta_dv_warm": {"wall_s": 10.0, "merge_s": 7.0, "read_s": 3.0, "ours_read_s": 2.0, "runs_wall_s": [10.0]},
            "iceberg_mor": {**job, "wall_s": 40.0, "spark": "4.1.4"},
            "iceberg_mor_warm": {"wall_s": 8.0, "merge_s": 5.0, "read_s": 3.0, "ours_read_s": 2.0, "spark": "4.1.4"},
        },
        # ours / peer as the runner writes them: ours' wall time over the peer's.
        "ratios": {"ours/delta_cow": 0.8, "ours/delta_cow (warm)": 0.75, "ours/delta_dv": 1.2, "ours/iceberg_mor": 0.6},
        "steps": {},
        "checksums": {"ours": check, "delta_cow": check, "delta_dv": {**check, "hash_all": "3"}, "iceberg_mor": check},
        "checksums_match": False,
    }
    dataset["ratios"] |= {"ours/delta_dv (warm)": 1.2, "ours+read/delta_dv+read (warm)": 1.4}
    (tmp_path / "spark_peers.json").write_text(json.dumps({"datasets": [dataset], "settings": {"sizes": [1000000]}}))
    text = report.write_report(tmp_path).read_text()
    assert "| compaction 1M x 1% cold | ours faster than delta-spark MERGE (copy-on-write): " in text
    assert "| 0.80 | yes |" in text and "| 0.75 | yes |" in text
    assert "## Compaction against the Spark peers" in text
    cow = (
        "| 1M x 1% | delta-spark MERGE (copy-on-write) | 0.80 | 0.75 | - | 24.0 / 30.0 | 12.0 / 16.0 | 16.0 | - | 2.0 |"
    )
    assert cow in text
    dv = "| 1M x 1% | delta-spark MERGE (deletion vectors) | 1.20 | 1.20 | 1.40 | 24.0 / 20.0 | 12.0 / 10.0 | 7.0 |"
    assert dv in text
    # Iceberg's peers ran on the second Spark: their rows say so, and so does the text above the table.
    ice = "| 1M x 1% | Iceberg MERGE INTO (merge-on-read) on Spark 4.1.4, not ours' 4.2 | 0.60 | - | - | 24.0 / 40.0 |"
    assert ice in text
    assert "Iceberg's peers ran on Spark 4.1.4" in text
    # A peer whose rows differ from ours is shown as such; the missing peers are named with how it was checked.
    assert text.count("same as ours") == 2 and "**DIFFERENT**" in text
    assert "iceberg-spark-runtime-4.2_2.13" not in text
    assert "no `org.apache.hudi:hudi-spark4.2-bundle_2.13`" in text
    assert "## spark_peers" not in text  # not rendered a second time as a generic section


def _driver_log(job_py: Path, package: Path) -> str:
    """A driver log as Spark 4 and the job write it: two stages from a script's chained statement,
    one from the job package's zip, one adaptive stage, a map-stage job and the job's own lines."""
    zipped = f"{package}/cdc_compaction/job/compact.py"
    return "\n".join(
        [
            "26/11/26 18:51:27 INFO InMemoryFileIndex: It took 13 ms to list leaf files for 1 paths.",
            f"26/11/26 18:51:28 INFO DAGScheduler: Got job 0 (collect at {zipped}:2) with 1 output partitions",
            "26/11/26 18:51:28 INFO DAGScheduler: Submitting 1 missing tasks from ResultStage 0 (x) (first 15 ...)",
            f"26/11/26 18:51:28 INFO DAGScheduler: ResultStage 0 (collect at {zipped}:2) finished in 300 ms",
            "2026-11-26 18:51:28,500 INFO cdc_compaction.job.compact: compacting bench.t (plan p): 8 files",
            f"26/11/26 18:51:29 INFO DAGScheduler: Got map stage job 1 (first at {job_py}:4) with 3 output partitions",
            "26/11/26 18:51:29 INFO DAGScheduler: Submitting 3 missing tasks from ShuffleMapStage 1 (x) (first 15 ...)",
            f"26/11/26 18:51:29 INFO DAGScheduler: ShuffleMapStage 1 (first at {job_py}:4) finished in 700 ms",
            f"26/11/26 18:51:30 INFO DAGScheduler: Got job 2 (first at {job_py}:4) with 1 output partitions",
            "26/11/26 18:51:30 INFO DAGScheduler: Submitting 1 missing tasks from ResultStage 3 (x) (first 15 ...)",
            f"26/11/26 18:51:30 INFO DAGScheduler: ResultStage 3 (first at {job_py}:4) finished in 50 ms",
            "26/11/26 18:51:30 INFO InMemoryFileIndex: It took 250 ms to list leaf files for 100 paths.",
            "26/11/26 18:51:33 INFO DAGScheduler: Got job 3 ($anonfun$withThreadLocalCaptured$1 at "
            "CompletableFuture.java:1768) with 2 output partitions",
            "26/11/26 18:51:33 INFO DAGScheduler: Submitting 2 missing tasks from ResultStage 4 (x) (first 15 ...)",
            "26/11/26 18:51:33 INFO DAGScheduler: ResultStage 4 ($anonfun$withThreadLocalCaptured$1 at "
            "CompletableFuture.java:1768) finished in 2500 ms",
            "2026-11-26 18:51:33,000 INFO cdc_compaction.job.compact: compacted bench.t: {}",
        ]
    )


def test_job_profile_counts_a_driver_log_and_names_its_call_sites(tmp_path: Path) -> None:
    import zipfile

    import job_profile

    job_py = tmp_path / "job.py"
    job_py.write_text("def main(df):\n    tally = (\n        df.groupBy('k')\n        .first()\n    )\n")
    package = tmp_path / "pkg.zip"
    with zipfile.ZipFile(package, "w") as z:
        source = "def _read_plan(spark):\n    return spark.read.text('p').collect()\n"
        z.writestr("cdc_compaction/job/compact.py", source)
    log_file = tmp_path / "driver.log"
    log_file.write_text(_driver_log(job_py, package))

    p = job_profile.profile(log_file, top=3)
    assert p is not None
    # Jobs by id (a map-stage job too), stages by id, tasks summed over task sets.
    assert (p["spark_jobs"], p["stages"], p["tasks"]) == (4, 4, 7)
    assert (p["stage_s"], p["longest_stage_s"], p["listing_s"]) == (3.55, 2.5, 0.263)
    assert p["own_s"] == 4.5  # 18:51:28.500 -> 18:51:33.000
    # Longest first; the chained statement shown from its first line, whole and on one line.
    assert [(t["site"], t["stages"], t["s"], t["longest_s"]) for t in p["top"]] == [
        ("adaptive query stage (write, join or broadcast)", 1, 2.5, [2.5]),
        ("job.py:4 main: `tally = (df.groupBy('k') .first())`", 2, 0.75, [0.7, 0.05]),
        ("compact.py:2 _read_plan: `return spark.read.text('p').collect()`", 1, 0.3, [0.3]),
    ]
    assert job_profile.profile(tmp_path / "gone.log") is None


def test_report_shows_where_the_time_goes_and_keeps_it_when_the_logs_are_gone(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results, logs = tmp_path / "results", tmp_path / "logs"
    results.mkdir()
    logs.mkdir()
    job_py = tmp_path / "job.py"
    job_py.write_text("def main(df):\n    tally = (\n        df.groupBy('k')\n        .first()\n    )\n")
    (logs / "ours.log").write_text(_driver_log(job_py, tmp_path / "missing.zip"))
    (logs / "floor.log").write_text(
        "26/11/26 18:51:22 INFO DAGScheduler: Got job 0 (parquet at NativeMethodAccessorImpl.java:0) with 1 output\n"
        "26/11/26 18:51:22 INFO DAGScheduler: ResultStage 0 (parquet at NativeMethodAccessorImpl.java:0) "
        "finished in 9763 ms\n"
    )
    (logs / "parted_clustered_1000000_change.log").write_text(_driver_log(job_py, tmp_path / "missing.zip"))
    job = {"wall_s": 10.0, "cpu_s": 8.0, "peak_rss_mb": 900.0, "rows_per_s": 1000, "returncode": 0, "output": {}}
    check = {"rows": 10, "tombstones": 1}
    dataset = {
        "dataset": "1M x 1%",
        "input_rows": 1010,
        "jobs": {engine: {**job, "log_file": str(logs / f"{engine}.log")} for engine in ("floor", "ours")},
        "ratios": {"ours/floor": 1.0},
        "steps": {},
        "checksums": {"ours": check},
        "checksums_match": True,
    }
    (results / "compaction.json").write_text(json.dumps({"datasets": [dataset], "initial_loads": []}))
    sizes = [{"rows": 1000000, "touched_only": {"clustered": {}}}]
    (results / "partitioned.json").write_text(json.dumps({"sizes": sizes}))

    text = report.write_report(results, logs).read_text()
    section = text[text.index("## Where the time goes") :]
    assert "| compaction | 1M x 1% floor | 1 | 1 | 0 | 9.76 | 9.76 | - | - | 0.00 |" in section
    assert "| compaction | 1M x 1% ours | 4 | 4 | 7 | 3.55 | 2.50 | 4.50 | 0.95 | 0.26 |" in section
    assert "| partitioned | 1M touched-only (clustered) | 4 | 4 | 7 | 3.55 |" in section
    # The flat table's log is missing: no row for it, rather than a row of zeros.
    assert "full rewrite" not in section
    assert "| 1M x 1% ours | 2 | 0.75 | 0.70, 0.05 | job.py:4 main: `tally = (df.groupBy('k') .first())` |" in section
    # A call site in a zip that is gone is still named by its file and line.
    assert "| 1M x 1% ours | 1 | 0.30 | 0.30 | collect at compact.py:2 |" in section

    # The logs live under .run/ and go; the report written again keeps the same section from profile.json.
    for f in logs.iterdir():
        f.unlink()
    again = report.write_report(results, logs).read_text()
    assert again[again.index("## Where the time goes") :] == section


# ---------------------------------------------------------------------- bench/compaction.py, tiny
def _bench_cmd(work: Path, results: Path, *extra: str) -> list[str]:
    """bench/compaction.py at 2,000 rows and one change fraction (the tiny size of the smoke tests).

    Without the Spark peers: their jars are make bench's alone, and test_spark_peer_merges_by_the_compaction_rule
    covers their rule.
    """
    return [
        sys.executable,
        str(BENCH / "compaction.py"),
        "--sizes",
        "2000",
        "--fractions",
        "0.1",
        "--spark-peers",
        "",
        "--work",
        str(work),
        "--out",
        str(results / "compaction.json"),
        "--no-report",
        *extra,
    ]


def _bench_env() -> dict[str, str]:
    """The environment ``make bench`` gives the benchmark (loopback Spark, this venv's Python first)."""
    env = {k: v for k, v in os.environ.items() if k not in ("BENCH_SIZES", "BENCH_WARM_REPEATS")}
    env["PYTHONPATH"] = str(BENCH.parent / "plugins")
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYSPARK_PYTHON"] = sys.executable
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _left_behind(work: Path) -> list[str]:
    """Processes whose command line names the run's work directory (its servers and jobs all do)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(work) in cmd:
            found.append(f"{p.info['pid']}: {cmd[:300]}")
    return found


def _first_compaction_job(proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 900) -> psutil.Process:
    """The benchmark's first spark-submit compaction (``compact.py``) once it runs; fails if the run ends first."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log_path.read_text()[-6000:]
        assert time.monotonic() < deadline, "no compaction job started: " + log_path.read_text()[-6000:]
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                if any(a.endswith("compact.py") for a in child.cmdline()):
                    return child
        time.sleep(0.5)


def _terminate(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the benchmark, as a timeout or a stopped CI job sends it; its exit code once it unwound."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=300)


def _none_left_behind(work: Path, wait_s: float = 60) -> list[str]:
    """``_left_behind`` once the stopped processes had time to exit (a JVM takes a moment)."""
    deadline = time.monotonic() + wait_s
    while (left := _left_behind(work)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


@pytest.mark.spark
@pytest.mark.metastore
@pytest.mark.extended  # a real bench run with seven spark-submit JVMs, two Sparks: make test-extended
def test_bench_runs_the_iceberg_peers_on_spark_4_1_with_ours_checksum(tmp_path: Path) -> None:
    """A tiny run with --spark-peers iceberg_cow,iceberg_mor: their tables' rows are ours', their jobs say Spark 4.1."""
    from cdc_compaction.core.jarcache import JarError, group_jars
    from cdc_compaction.devtools import iceberg_spark

    try:
        group_jars(iceberg_spark.JAR_GROUP)
        iceberg_spark.spark_home()
    except (JarError, iceberg_spark.IcebergSparkError) as exc:
        pytest.skip(f"make jars and make iceberg-spark install the Iceberg peers' Spark: {exc}")
    work, results = tmp_path / "work", tmp_path / "results"
    peers = ["--peers", "", "--spark-peers", "iceberg_cow,iceberg_mor", "--warm-repeats", "0"]
    proc = subprocess.run(
        _bench_cmd(work, results, *peers), env=_bench_env(), capture_output=True, text=True, timeout=1200, check=False
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    (d,) = json.loads((results / "compaction.json").read_text())["datasets"]
    assert d["checksums"]["iceberg_cow"] == d["checksums"]["ours"] == d["checksums"]["iceberg_mor"]
    assert d["checksums_match"] is True
    for variant in ("iceberg_cow", "iceberg_mor"):
        assert d["jobs"][variant]["spark"] == iceberg_spark.SPARK_VERSION
        assert d["ratios"][f"ours/{variant}"] > 0
    # Merge-on-read leaves the delete files to the readers: its run reads the table once after the MERGE.
    assert "read_s" in d["jobs"]["iceberg_mor"]["phases"] and "read_s" not in d["jobs"]["iceberg_cow"]["phases"]
    assert _none_left_behind(work) == []


@pytest.mark.spark
@pytest.mark.metastore
@pytest.mark.extended  # a real bench run (make bench runs it whole): make test-extended
def test_bench_measures_ours_and_the_floor_warm_beside_cold(tmp_path: Path) -> None:
    """A tiny run: floor and ours cold (spark-submit) and warm (Spark Connect), and delta-rs; the report has both.

    With ``--change-feed`` ours runs again with the feed on, cold and in the warm rounds: the feed's price.
    """
    pytest.importorskip("deltalake")
    pytest.importorskip("matplotlib")
    work, results = tmp_path / "work", tmp_path / "results"
    proc = subprocess.run(
        _bench_cmd(work, results, "--peers", "delta", "--warm-repeats", "2", "--change-feed"),
        env=_bench_env(),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    data = json.loads((results / "compaction.json").read_text())

    # One server for the run, on loopback, gone at the end with everything else the run started.
    assert data["connect_server"]["url"].startswith("sc://127.0.0.1:")
    assert data["settings"]["warm_repeats"] == 2
    assert _none_left_behind(work) == []

    (d,) = data["datasets"]
    for key in ("ours/floor", "ours/floor (warm)", "ours/floor (warm, cpu)", "ours/delta (warm)"):
        assert isinstance(d["ratios"][key], float) and d["ratios"][key] > 0, (key, d["ratios"])
    for key in ("ours_feed/ours", "ours_feed/ours (warm)"):
        assert isinstance(d["ratios"][key], float) and d["ratios"][key] > 0, (key, d["ratios"])
    # The job's feed equals the publish-time diff it replaced.
    assert d["jobs"]["ours_feed"]["feed_equals_publish_diff"] is True
    for engine in ("floor_warm", "ours_warm", "ours_feed_warm"):
        job = d["jobs"][engine]
        assert job["engine"] == "spark_connect" and job["repeats"] == 2
        assert len(job["runs_wall_s"]) == 2 and all(w > 0 for w in job["runs_wall_s"])
        assert job["wall_s"] in job["runs_wall_s"]
    # Warm ours wrote the rows cold ours and delta-rs wrote; the warm floor every row it read.
    assert d["checksums"]["ours_warm"] == d["checksums"]["ours"] == d["checksums"]["delta"]
    assert d["checksums_match"] is True
    assert d["jobs"]["floor_warm"]["rows_written"] == d["input_rows"]

    text = report.write_report(results, tmp_path / "no-logs").read_text()
    assert "| compaction 2k x 10% | ours / floor (wall) <= 1.1 |" in text
    assert "| compaction 2k x 10% warm | ours / floor (wall, warm Spark Connect) <= 1.1 |" in text
    header = "| dataset | ours / floor (cold) | ours / floor (warm) | ours / floor (warm, CPU) | ours (warm) / duckdb |"
    assert header in text
    assert f"| 2k x 10% | {d['input_rows']:,} | **ours (warm)** |" in text
    assert f"| 2k x 10% | {d['input_rows']:,} | floor (warm) |" in text
    assert "| compaction 2k x 10% change feed, warm | ours with the feed / without <= 1.10 (warm) |" in text
    assert "| dataset | cold s (off / on) | on / off (cold) | warm s (off / on) | on / off (warm) |" in text


@pytest.mark.spark
@pytest.mark.metastore
@pytest.mark.extended  # a real bench run (make bench runs it whole): make test-extended
def test_a_terminated_bench_leaves_no_server_or_job_behind(tmp_path: Path) -> None:
    """SIGTERM while the first spark-submit job runs: the job, the Spark Connect server and the metastore stop."""
    work, results = tmp_path / "work", tmp_path / "results"
    log_path = tmp_path / "bench.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            _bench_cmd(work, results, "--peers", "", "--warm-repeats", "1"),
            env=_bench_env(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        # The server is up before the initial load: wait for that load's spark-submit job to run.
        job = _first_compaction_job(proc, log_path)
        server_pid = int((work / "connect" / "connect.pid").read_text())
        assert psutil.pid_exists(server_pid)
        rc = _terminate(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 128 + signal.SIGTERM, log_path.read_text()[-6000:]
    # The job was stopped, not left to run to its end (SIGTERM came as its JVM started, long before
    # it could finish): an orphan would write its "compacted" line.
    psutil.wait_procs([job], timeout=300)
    job_log = (work / "logs" / "cdc_2k_initial.log").read_text(errors="replace")
    assert "compacted bench.cdc_2k" not in job_log, job_log[-3000:]
    assert _none_left_behind(work) == [], log_path.read_text()[-6000:]


def test_a_task_s_peak_is_its_own_not_the_process_that_started_it(tmp_path: Path) -> None:
    """bench/scale_task.py reports the task process's own high-water mark, not its parent's.

    Linux carries a parent's ``ru_maxrss`` over fork and exec into the child, so a task started by a fat
    benchmark process would seem to hold what the benchmark holds: here the parent holds 400 MB, the task
    (the imports alone) far less.
    """
    ballast = bytearray(400 * 2**20)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    out = tmp_path / "peak.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "scale_task.py"), "--peak-out", str(out), "baseline"],
        env=_bench_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak = json.loads(out.read_text())["peak_mb"]
    assert 10 < peak < 350, peak
    del ballast


@pytest.mark.spark
@pytest.mark.metastore
@pytest.mark.extended  # two tables through a day of spark-submit runs (make bench-scale runs it at 50M and 20M rows)
def test_scale_day_matches_the_reference_and_measures_every_airflow_side_task(tmp_path: Path) -> None:
    """A tiny ``bench/scale_day.py``: every run, operation and check there, every peak measured, the rows right."""
    out, work = tmp_path / "scale.json", tmp_path / "work"
    cmd = [
        sys.executable,
        str(BENCH / "scale_day.py"),
        "--rows",
        "20000",
        "--partitioned-rows",
        "10000",
        "--partitions",
        "10",
        "--hours",
        "4",
        # The unpartitioned table under a threshold policy: it compacts at hours 2 and 4 only.
        "--flat-compact-every",
        "2",
        "--driver-memory",
        "1g",
        "--out",
        str(out),
        "--work",
        str(work),
    ]
    proc = subprocess.run(cmd, env=_bench_env(), capture_output=True, text=True, timeout=3000, check=False, cwd=BENCH)
    assert proc.returncode == 0, proc.stderr[-6000:]
    data = json.loads(out.read_text())
    assert data["all_equal"] is True
    assert [t["rows"] for t in data["tables"]] == [20000, 10000]
    steps = {"ensure_tables", "plan", "validate", "publish", "archive", "refresh_view"}
    for t in data["tables"]:
        assert set(t["checks"]) == {"after_day", "after_erase", "after_rollback"}
        # The erase took one row away; the rollback went back one hour (other rows, other sums).
        assert t["checks"]["after_erase"]["live"]["rows"] == t["checks"]["after_day"]["live"]["rows"] - 1
        assert t["checks"]["after_rollback"]["live"] != t["checks"]["after_erase"]["live"]
        # Every run refreshes the view; the flat table's base is rewritten every other hour, the partitioned one's
        # every hour. The rollback goes back to the version before the last compaction either way.
        assert len(t["hours"]) == 4 and all("refresh_view" in h["tasks"] for h in t["hours"])
        compacted = [h["hour"] for h in t["hours"] if "compact_spark" in h["tasks"]]
        assert compacted == ([1, 2, 3, 4] if t["partitioned"] else [2, 4]), compacted
        assert [v["through_hour"] for v in t["versions"]] == [0, *compacted]
        ops = {"status", "versions", "changes", "erase", "rollback"} | ({"index_verify"} if t["partitioned"] else set())
        assert set(t["peak_by_task_mb"]) == steps | ops
        assert all(v > 0 for v in t["peak_by_task_mb"].values())
        assert t["operations"]["changes"]["rows"] > 0
    assert _none_left_behind(work) == []


@pytest.mark.spark
@pytest.mark.metastore
@pytest.mark.extended  # a real scale_day run up to its first spark-submit job: make test-extended
def test_a_terminated_scale_day_leaves_no_metastore_or_job_behind(tmp_path: Path) -> None:
    """SIGTERM while the first compaction's spark-submit runs: the benchmark exits, its job and metastore stop.

    A 50M-row run takes hours, so stopping it is an ordinary thing to do; before, SIGTERM ended the Python
    process at once and left the metastore and the compaction's JVM running.
    """
    work = tmp_path / "work"
    log_path = tmp_path / "scale.log"
    cmd = [
        sys.executable,
        str(BENCH / "scale_day.py"),
        "--rows",
        "20000",
        "--tables",
        "flat",
        "--hours",
        "2",
        "--driver-memory",
        "1g",
        "--out",
        str(tmp_path / "scale.json"),
        "--work",
        str(work),
    ]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, env=_bench_env(), stdout=log_file, stderr=subprocess.STDOUT, cwd=BENCH)
    try:
        _first_compaction_job(proc, log_path)
        rc = _terminate(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 128 + signal.SIGTERM, log_path.read_text()[-6000:]
    assert _none_left_behind(work) == [], log_path.read_text()[-6000:]
