"""A table whose ``storage_root`` is ``s3://``: whole runs on moto's S3 and Glue APIs on loopback.

Every step that touches storage or the catalog runs for real: plan (listing, footer
checks by ranged reads, the lease by conditional writes, the plan file), validate
(stats and footers read back from S3), publish (commit record with ``If-None-Match``,
Glue ``UpdateTable`` with its VersionId, the pointer with ``If-Match``), archive
(server-side copy, verify, batched delete), refresh_view (Glue partitions),
quarantine (files set aside, rows re-ingested) and version retention.

What cannot run here, and how the test stands in for it:

* Spark reading ``s3a://`` needs hadoop-aws and the AWS SDK bundle, which cannot be
  downloaded on this machine.  :class:`MirrorEngine` runs the real compaction job on a
  local copy of exactly the plan's inputs and uploads its output to the planned S3
  location, byte for byte; everything after the job reads it back from S3.
* Spark DDL against Glue needs EMR's Glue client factory.  The fixture registers the
  tables and views in Glue as that DDL would (with the registry's fingerprint), so
  ``ensure_tables`` finds them current; :meth:`MirrorEngine.run_sql` fails the test if
  any DDL is attempted.  Views are therefore not queried: scenario ``check_view`` steps
  check the registered increment partitions instead.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import STUDENT_COLUMNS

from cdc_compaction.core import sql
from cdc_compaction.core.lake import EMPTY_VERSION, Lake, Layout, kept_seqs
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.core.storage import Storage, is_data_file, read_parquet
from cdc_compaction.core.storage.s3 import S3Storage
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.integrations.engine import SessionEngine
from cdc_compaction.job import compact as job
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.plan import plan as run_plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.quarantine import Quarantine
from cdc_compaction.pipeline.runtime import Runtime
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import validate
from cdc_compaction.pipeline.views import refresh_view

pytestmark = [pytest.mark.s3, pytest.mark.spark]

GLUE = MetastoreEndpoint(kind="glue")
SHARED = Path(__file__).resolve().parents[3] / "shared" / "conformance"
S3_SCENARIOS = [
    "late_update_for_deleted_key",
    "null_key_rejected",
    "several_files_per_increment",
    "no_pending_increments",
    "composite_key",
    "duplicate_delivery_is_idempotent",
]


def _mirror_down(storage: Storage, src: str, dst: Path) -> None:
    """Copy everything under ``src`` (recursively) to the local directory ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    for e in storage.list_dir(src):
        if e.is_dir:
            _mirror_down(storage, e.path, dst / e.name)
        else:
            with storage.open_read(e.path) as fh:
                (dst / e.name).write_bytes(fh.read())


def _mirror_up(local: Path, storage: Storage, dst: str) -> None:
    for p in sorted(local.rglob("*")):
        if p.is_file() and not p.name.endswith(".crc"):
            storage.write_bytes(posixpath.join(dst, p.relative_to(local).as_posix()), p.read_bytes())


class MirrorEngine:
    """The real compaction job, run on a local copy of its S3 inputs (see the module docstring)."""

    def __init__(self, spark: Any, storage: Storage, work: Path) -> None:
        self.session = SessionEngine(spark)
        self.storage = storage
        self.work = work

    def run_sql(self, cfg: TableConfig, statements: list[str]) -> None:
        raise AssertionError(f"{cfg.qualified_name}: no Spark DDL expected on the Glue fixture: {statements}")

    def compact(self, plan: dict[str, Any]) -> dict[str, Any]:
        w = self.work / plan["plan_id"] / uuid.uuid4().hex[:6]
        _mirror_down(self.storage, plan["base_location"], w / "base")
        if plan.get("base_tombstones_location"):
            _mirror_down(self.storage, plan["base_tombstones_location"], w / "tombstones")
        if self.storage.exists(plan["commit_path"]):
            return {"plan_id": plan["plan_id"], "already_committed": True}  # as the job does on S3A
        local = dict(plan, base_location=str(w / "base"), output_location=str(w / "out"), commit_path=None)
        if plan.get("base_tombstones_location"):
            local["base_tombstones_location"] = str(w / "tombstones")
        local["quarantine_location"] = str(w / "rejected")
        local["files"] = []
        for f in plan["files"]:
            # Keep <increment>/<file>: the job takes the increment from the parent directory.
            dst = w / "in" / f["increment"] / f["name"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            with self.storage.open_read(f["path"]) as fh:
                dst.write_bytes(fh.read())
            local["files"].append(dict(f, path=str(dst)))
        if (w / "rejected").exists():
            raise AssertionError("fresh work directory expected")
        stats = job.run(self.session.spark, local)
        # Upload into this attempt's own directories, as the job writes them on S3A.
        out, rejected = job.attempt_locations(plan, job.new_attempt())
        if (w / "rejected").exists():
            _mirror_up(w / "rejected", self.storage, rejected)
        _mirror_up(w / "out", self.storage, out)
        return stats


class GlueReader:
    """What a reader sees: the base table's location as Glue has it, read from S3."""

    def __init__(self, glue: Any) -> None:
        self.glue = glue

    reads_views = False

    def visible_base(self, cfg: TableConfig) -> list[dict[str, Any]]:
        name = sql.table_names(cfg)["base_table"]
        location = self.glue.get_table(DatabaseName=cfg.database, Name=name)["Table"]["StorageDescriptor"]["Location"]
        lake = Lake(cfg)
        if not any(e for e in lake.storage.list_dir(location) if not e.is_dir and is_data_file(e.name)):
            return []
        # A plain read of the location: it holds the visible rows and nothing else.
        return read_parquet(lake.storage, location).select(cfg.column_names).to_pylist()

    def pending_partitions(self, cfg: TableConfig) -> set[str]:
        name = sql.table_names(cfg)["incremental_table"]
        parts = self.glue.get_partitions(DatabaseName=cfg.database, TableName=name)["Partitions"]
        return {p["Values"][0] for p in parts}


def register_in_glue(glue: Any, cfg: TableConfig) -> None:
    """Register the table's base / incremental / compactor tables and views as the DDL would."""
    lay, names, fp = Layout.for_table(cfg), sql.table_names(cfg), sql.schema_fingerprint(cfg)
    cols = [{"Name": c.name, "Type": c.type} for c in cfg.columns]
    meta = [
        {"Name": "_cdc_increment", "Type": "string"},
        {"Name": "_cdc_file", "Type": "string"},
        {"Name": "_cdc_pos", "Type": "bigint"},
        {"Name": "_cdc_ingested_at", "Type": "timestamp"},
    ]
    params = {"cdc.fingerprint": fp, "EXTERNAL": "TRUE", "spark.sql.sources.provider": "parquet"}
    with contextlib.suppress(glue.exceptions.AlreadyExistsException):
        glue.create_database(DatabaseInput={"Name": cfg.database})

    def table(name: str, location: str, columns: list[dict[str, str]], **extra: Any) -> None:
        sd = {"Columns": columns, "Location": location, "SerdeInfo": {"Parameters": {"path": location}}}
        glue.create_table(
            DatabaseName=cfg.database,
            TableInput={"Name": name, "StorageDescriptor": sd, "Parameters": params, "TableType": "EXTERNAL_TABLE"}
            | extra,
        )

    table(names["base_table"], lay.data_dir(EMPTY_VERSION), cols + meta)
    table(names["tombstones_table"], str(lay.tombstones_dir(EMPTY_VERSION)), cols + meta)
    table(names["compactor_table"], lay.staging, cols + meta)
    table(
        names["incremental_table"],
        lay.incremental,
        cols,
        PartitionKeys=[{"Name": "_cdc_increment", "Type": "string"}],
    )
    for v in (names["view_name"], names["rejects_view"]):
        glue.create_table(
            DatabaseName=cfg.database,
            TableInput={"Name": v, "TableType": "VIRTUAL_VIEW", "Parameters": {"cdc.fingerprint": fp}},
        )


@pytest.fixture
def glue(aws_default: str) -> Any:
    import boto3

    return boto3.client(
        "glue", endpoint_url=aws_default, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
    )


@pytest.fixture
def bucket(aws_default: str) -> str:
    name = f"lake-{uuid.uuid4().hex[:12]}"
    S3Storage().client.create_bucket(Bucket=name)
    return name


class S3Runner(conf.InProcessRunner):
    """The DAG's task functions in order, on an S3 lake with the Glue catalog."""

    def __init__(self, spark: Any, glue: Any, work: Path) -> None:
        super().__init__(spark, GLUE)
        self.glue = glue
        self.work = work

    def runtime(self, cfg: TableConfig) -> Runtime:
        lake = Lake(cfg)
        return Runtime(cfg=cfg, lake=lake, metastore=GLUE, engine=MirrorEngine(self.spark, lake.storage, self.work))

    def setup(self, cfg: TableConfig) -> None:
        register_in_glue(self.glue, cfg)
        super().setup(cfg)

    def compact(self, cfg: TableConfig) -> dict[str, Any] | None:
        rt = self.runtime(cfg)
        ensure_tables(rt)
        plan_path = run_plan(rt, run_id=f"s3__{uuid.uuid4().hex[:12]}")
        if not plan_path:
            refresh_view(rt)
            return None
        rt.engine.compact(json.loads(rt.lake.storage.read_text(plan_path)))  # type: ignore[attr-defined]
        validate(rt, plan_path)
        publish(rt, plan_path)
        archive(rt, plan_path)
        refresh_view(rt)
        return dict(rt.lake.latest_commit().stats)


@pytest.mark.parametrize("name", S3_SCENARIOS)
def test_shared_scenario_on_s3(
    name: str, spark: Any, glue: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scn = conf.Scenario.load(SHARED / f"{name}.json")
    on_s3 = _on_s3(conf.registry_doc, bucket)
    cfg = parse_table(on_s3(scn, tmp_path, "_s3"))
    monkeypatch.setattr(conf, "registry_doc", on_s3)
    runner, reader = S3Runner(spark, glue, tmp_path / "work"), GlueReader(glue)
    result = conf.run_scenario(scn, runner, reader, tmp_path, suffix="_s3")  # type: ignore[arg-type]
    assert result.ok, "\n".join(result.failures)
    # Whatever the scenario, a finished run leaves the landing area empty and the catalog,
    # the pointer and the newest commit in agreement.
    lake = Lake(cfg)
    latest = lake.latest_commit()
    base = glue.get_table(DatabaseName=cfg.database, Name=sql.table_names(cfg)["base_table"])["Table"]
    assert base["StorageDescriptor"]["Location"] == lake.data_location(latest)
    tomb = glue.get_table(DatabaseName=cfg.database, Name=sql.table_names(cfg)["tombstones_table"])["Table"]
    assert tomb["StorageDescriptor"]["Location"] == lake.tombstones_location(latest)
    # On S3 too the data location holds data files only: a glob of it is the table.
    names = [e.name for e in lake.storage.list_dir(lake.data_location(latest))]
    assert all(n.endswith(".parquet") for n in names), names
    assert (lake.read_pointer() or {}).get("version") == latest.version
    assert reader.pending_partitions(cfg) == set()
    assert not [e for e in lake.storage.list_dir(lake.layout.incremental) if e.is_dir]


def _on_s3(make_doc: Any, bucket: str) -> Any:
    def doc(
        scn: conf.Scenario,
        lake_dir: Path,
        suffix: str = "",
        partition_by: dict[str, str] | None = None,
        formats: list[str] | None = None,
        views_metastore: list[str] | None = None,
    ) -> dict[str, Any]:
        d = make_doc(scn, lake_dir, suffix, partition_by, formats, views_metastore)
        d["storage_root"] = f"s3://{bucket}/lake/{d['database']}/{d['table']}"
        return d

    return doc


def _student(bucket: str, **overrides: Any) -> TableConfig:
    doc = {
        "database": "s3_tests",
        "table": f"student_{uuid.uuid4().hex[:8]}",
        "columns": [dict(c) for c in STUDENT_COLUMNS],
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": f"s3a://{bucket}/lake/student",
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "keep_versions": 1,
        **overrides,
    }
    return parse_table(doc)


def _row(i: int | None, name: str, op: str, ts: int) -> dict[str, Any]:
    return {"id": i, "full_name": name, "op": op, "ts_ms": ts}


def test_bad_files_and_rows_are_quarantined_on_s3_and_reingested(
    spark: Any, glue: Any, bucket: str, tmp_path: Path
) -> None:
    cfg = _student(bucket, on_bad_file="quarantine")
    runner, reader = S3Runner(spark, glue, tmp_path / "work"), GlueReader(glue)
    runner.setup(cfg)
    lake = Lake(cfg)
    conf.land(cfg, "increment_2026010100", [[_row(1, "Ann", "c", 10), _row(None, "nobody", "c", 11)]])
    truncated = posixpath.join(lake.layout.incremental, "increment_2026010100", "part-99999.parquet")
    lake.storage.write_bytes(truncated, b"PAR1 truncated")
    stats = runner.compact(cfg)
    assert stats is not None and stats["rejected_rows"] == 1
    assert {r["id"] for r in reader.visible_base(cfg)} == {1}
    q = Quarantine(lake)
    entries = {e.kind: e for e in q.entries()}
    assert set(entries) == {"rows", "files"}
    # The whole file was set aside byte for byte, with its reason; nothing is left in landing.
    doc = json.loads(lake.storage.read_text(posixpath.join(entries["files"].path, "_manifest.json")))
    assert "not readable as Parquet" in doc["files"][0]["reason"]
    assert not lake.storage.exists(truncated)

    # A fixed copy of the refused row, kept locally, goes back through the CLI's code path.
    import pyarrow as pa
    import pyarrow.parquet as pq

    fixed = tmp_path / "fixed.parquet"
    table = read_parquet(lake.storage, entries["rows"].path).to_pylist()
    for r in table:
        r["id"] = 2
    pq.write_table(pa.Table.from_pylist(table), fixed)
    written = q.reingest(entries["rows"].id, source=str(fixed))
    assert written and all(w.startswith(f"s3a://{bucket}/") for w in written)
    runner.compact(cfg)
    assert {r["id"]: r["full_name"] for r in reader.visible_base(cfg)} == {1: "Ann", 2: "nobody"}
    # keep_versions: 1 -- the superseded version is gone from S3, the live one is intact.
    versions = [e.name for e in lake.storage.list_dir(lake.layout.base) if e.is_dir]
    assert versions == [lake.latest_commit().version]


# make test-extended: about a minute on moto's S3 and Glue; Iceberg's sync (the same code but the catalog) is in
# make test on local lakes (tests/pipeline/test_formats_iceberg.py).
@pytest.mark.extended
def test_an_s3_lakes_iceberg_table_commits_through_glue_at_every_kept_version(
    spark: Any, glue: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CDC_ICEBERG_CATALOG=glue``: an S3 lake gets its Iceberg table in Glue (moto's), beside its base table,
    metadata written through the lake's Airflow connection; pyiceberg opens it as a Glue user does (its own
    client and S3 settings, written here from moto's endpoint) and reads every kept snapshot as the scenario
    expects (unpartitioned: this harness registers an unpartitioned base in Glue; the partition spec is the
    same code as on a local lake, tests/pipeline/test_formats_iceberg.py)."""
    from pyiceberg.catalog.glue import GlueCatalog

    monkeypatch.setenv("CDC_ICEBERG_CATALOG", "glue")
    scn = conf.Scenario.load(SHARED / "delete_then_reinsert.json")
    on_s3 = _on_s3(conf.registry_doc, bucket)
    monkeypatch.setattr(conf, "registry_doc", on_s3)
    endpoint = glue.meta.endpoint_url
    s3_props = {
        "s3.endpoint": endpoint,
        "s3.access-key-id": "testing-access-key",
        "s3.secret-access-key": "testing-secret-key",
        "s3.region": "us-east-1",
    }

    def open_glue(cfg: TableConfig) -> Any:
        return GlueCatalog(f"cdc_{cfg.database}", client=glue, **s3_props)

    runner = S3Runner(spark, glue, tmp_path / "work")
    readers = [GlueReader(glue), conf.IcebergReader("pyiceberg", catalog=open_glue)]
    result = conf.run_scenario(scn, runner, readers, tmp_path, suffix="_ig", formats=["iceberg"])  # type: ignore[arg-type]
    assert result.ok, "\n".join(result.failures)
    cfg = parse_table(on_s3(scn, tmp_path, "_ig", None, ["iceberg"]))
    lake = Lake(cfg)
    table = glue.get_table(DatabaseName=cfg.database, Name=f"{cfg.table}_iceberg")["Table"]
    assert table["Parameters"]["table_type"] == "ICEBERG"
    root = lake.layout.root.replace("s3a://", "s3://")
    assert table["Parameters"]["metadata_location"].startswith(f"{root}/iceberg/metadata/"), table["Parameters"]
    # Every kept commit has its snapshot, and nothing local stands in for the catalog.
    iceberg_table = open_glue(cfg).load_table((cfg.database, f"{cfg.table}_iceberg"))
    seqs = sorted(int(s.summary.additional_properties["cdc.commit_seq"]) for s in iceberg_table.snapshots())
    live = lake.latest_commit().seq
    assert seqs == [s for s in kept_seqs(live, cfg.keep_versions) if s > 0] and seqs, seqs
    assert not [e for e in lake.storage.list_dir(f"{lake.layout.root}/iceberg/metadata") if e.name.endswith(".db")]


# Extended: the two scenarios take 40-80 s each on the shared cores (the job's Spark runs, a DuckDB subprocess a read).
@pytest.mark.extended
@pytest.mark.parametrize(("name", "scheme"), [("duplicate_delivery_is_idempotent", "s3"), ("null_key_rejected", "s3a")])
def test_the_duckdb_views_of_an_s3_lake_run_in_duckdb_on_s3(
    name: str,
    scheme: str,
    spark: Any,
    glue: Any,
    aws_default: str,
    bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The views script the pipeline writes to ``s3://`` or ``s3a://`` (views.duckdb), run by DuckDB with httpfs.

    DuckDB 1.4.4 with ``duckdb-ext-httpfs`` (make duckdb-readers) reads the script with ``read_text`` and the
    files it names from moto's server, its endpoint and the test credentials in a ``CREATE SECRET``; at every
    compact step ``<t>_base`` holds the scenario's expected rows, at every check_view step ``<t>_view`` and
    ``<t>_pending_rejects`` what the scenario expects of the view (base and pending increments).
    """
    from conftest import aws_default_conn

    from cdc_compaction.devtools import duckdb_formats

    scn = conf.Scenario.load(SHARED / f"{name}.json")
    on_s3 = _on_s3(conf.registry_doc, bucket)

    def doc(*args: Any, **kwargs: Any) -> dict[str, Any]:
        d = on_s3(*args, **kwargs)
        # An s3a:// root (as Spark's S3A names it) makes views that name s3a:// files: httpfs reads those too.
        d["storage_root"] = d["storage_root"].replace("s3://", f"{scheme}://", 1)
        d["views"]["duckdb"] = f"{scheme}://{bucket}/duckdb/{d['database']}.{d['table']}.sql"
        return d

    monkeypatch.setattr(conf, "registry_doc", doc)
    # The test connection's endpoint (moto's server on 127.0.0.1) and credentials, as a DuckDB user's secret.
    creds = json.loads(aws_default_conn(aws_default))
    secret = duckdb_formats.s3_secret(aws_default, creds["login"], creds["password"])
    runner = S3Runner(spark, glue, tmp_path / "work")
    readers = [GlueReader(glue), conf.DuckDBS3Reader(secret)]
    result = conf.run_scenario(scn, runner, readers, tmp_path, suffix="_duck")  # type: ignore[arg-type]
    assert result.ok, "\n".join(result.failures)
    # The views name the lake's files on S3: DuckDB read them there, not a local copy.
    cfg = parse_table(doc(scn, tmp_path, "_duck"))
    script = Lake(cfg).storage.read_text(cfg.views.duckdb)
    assert f"{scheme}://{bucket}/lake/" in script and str(tmp_path) not in script
