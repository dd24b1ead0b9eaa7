"""Shared fixtures: a real Thrift metastore, one SparkSession, PostgreSQL, and table factories.

Session-scoped because a JVM start costs 10-15 s on two cores.  Every process a
fixture starts is stopped by the same fixture, by PID.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The registry parse cache (registry.py) is per user under ~/.cache: tests keep theirs in a folder of this run.
if "CDC_PARSE_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["CDC_PARSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cdc-parse-cache-")
# py4j logs "Closing down clientserver connection" from __del__ after pytest closed its streams.
logging.getLogger("py4j").setLevel(logging.WARNING)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Airflow reads its configuration once, at first import: point it at a test-only home
# (SQLite, this project's dags/ and plugins/) before any test imports it.
# One per pytest-xdist worker: its SQLite database takes one writer at a time.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_AIRFLOW_HOME = PROJECT_ROOT / ".run" / ("airflow-tests" + (f"-{_WORKER}" if _WORKER else ""))
if "AIRFLOW_HOME" not in os.environ or os.environ.get("CDC_TESTS_OWN_AIRFLOW_HOME") == "1":
    from cdc_compaction.devtools.devenv import airflow_env

    os.environ.update(airflow_env(_AIRFLOW_HOME, "thrift://127.0.0.1:9083"))
    os.environ["CDC_TESTS_OWN_AIRFLOW_HOME"] = "1"

from cdc_compaction.core.exceptions import PreconditionFailedError  # noqa: E402
from cdc_compaction.core.lake import Lake  # noqa: E402
from cdc_compaction.core.registry import TableConfig, parse_table  # noqa: E402
from cdc_compaction.core.settings import MetastoreEndpoint  # noqa: E402
from cdc_compaction.core.sql import table_names  # noqa: E402
from cdc_compaction.devtools.local_services import LocalMetastore, LocalPostgres, free_port  # noqa: E402
from cdc_compaction.integrations.engine import SessionEngine  # noqa: E402
from cdc_compaction.pipeline.archive import archive  # noqa: E402
from cdc_compaction.pipeline.plan import plan  # noqa: E402
from cdc_compaction.pipeline.publish import publish  # noqa: E402
from cdc_compaction.pipeline.runtime import Runtime  # noqa: E402
from cdc_compaction.pipeline.validate import validate  # noqa: E402

# A SIGTERM (a stopped CI job, a timeout, ``kill``) unwinds the session so that fixtures stop their servers;
# after CDC_TEST_DEADLINE (.ci/run's extended tier) a test not yet started is skipped and counted.
pytest_plugins = ["cdc_compaction.devtools.pytest_unwind", "cdc_compaction.devtools.pytest_deadline"]

SHARED_CONFORMANCE = Path(__file__).resolve().parents[2] / "shared" / "conformance"


#: ``make fuzz`` sets this; unset means the bounded, reproducible ``make test`` run.
FUZZ_EXAMPLES = os.environ.get("CDC_FUZZ_EXAMPLES")


def fuzz_settings(test_examples: int) -> Any:
    """Hypothesis settings of the generative tests: bounded and derandomized under ``make test``,
    ``CDC_FUZZ_EXAMPLES`` fresh examples (shrunk on failure) under ``make fuzz``."""
    from hypothesis import HealthCheck, Phase, settings

    common: dict[str, Any] = {
        "deadline": None,
        # Examples share one SparkSession and create their own tables: slow by design,
        # and the function-scoped fixtures are not per-example state.
        "suppress_health_check": [
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
        ],
        "print_blob": True,
    }
    if FUZZ_EXAMPLES:
        return settings(max_examples=int(FUZZ_EXAMPLES), derandomize=False, **common)
    # No shrinking in make test: a failure there is reported as found; `make fuzz` shrinks.
    return settings(
        max_examples=test_examples, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate], **common
    )


@pytest.fixture(scope="session")
def metastore(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> Iterator[LocalMetastore]:
    """The Thrift metastore of the session; it takes ``s3a://`` locations on moto's server (the ``aws_default``
    connection of :func:`aws_default`) when the S3A jars are in the jar cache (``make jars``), as the session does."""
    from cdc_compaction.core.jarcache import JarError

    home = tmp_path_factory.mktemp("metastore")
    ms = LocalMetastore(home, port=free_port(), warehouse=home / "warehouse")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_default_conn(moto_endpoint))
        try:
            ms.with_s3a("aws_default")
        except JarError as exc:
            logging.getLogger(__name__).info("metastore without S3A (local lakes only): %s", exc)
    ms.start()
    try:
        yield ms
    finally:
        ms.stop()


@pytest.fixture(scope="session")
def endpoint(metastore: LocalMetastore) -> MetastoreEndpoint:
    return MetastoreEndpoint(metastore.host, metastore.port)


@pytest.fixture(scope="session")
def spark(metastore: LocalMetastore, endpoint: MetastoreEndpoint) -> Iterator[Any]:
    from cdc_compaction.integrations.engine import local_session

    session = local_session(endpoint, str(metastore.home / "warehouse"), app_name="cdc-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    """A PostgreSQL server (wal_level=logical, wal2json) on 127.0.0.1, stopped by this fixture."""
    pg = LocalPostgres(tmp_path_factory.mktemp("postgres"), port=free_port())
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture(scope="module")
def airflow_pg_conn(postgres: LocalPostgres, request: pytest.FixtureRequest) -> str:
    """SQLAlchemy URL of a fresh PostgreSQL database for this module's Airflow metadata.

    For tests that run several Airflow processes at once (scheduler, api-server, CLI):
    SQLite's single writer makes them fail with "database is locked".  Pass it to
    ``airflow_env(..., sql_alchemy_conn=...)``; ``ensure_airflow_db`` migrates it.
    """
    from cdc_compaction.devtools.devenv import postgres_metadata_db

    return postgres_metadata_db(postgres, request.module.__name__.rsplit(".", 1)[-1])


#: The seed articles' student table: an int key, a name, Debezium's op and ts_ms.
STUDENT_COLUMNS: tuple[dict[str, str], ...] = (
    {"name": "id", "type": "int"},
    {"name": "full_name", "type": "string"},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": "bigint"},
)


def student_doc(root: Path, table: str = "student", **overrides: Any) -> dict[str, Any]:
    """A registry entry like the seed articles' student table, landing under ``root``."""
    doc: dict[str, Any] = {
        "database": "tests",
        "table": table,
        "columns": [dict(c) for c in STUDENT_COLUMNS],
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": str(root / table),
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "retries": 1,
    }
    doc.update(overrides)
    return doc


@pytest.fixture
def make_cfg(tmp_path: Path) -> Callable[..., TableConfig]:
    """Build a TableConfig for a fresh table under this test's tmp_path."""
    counter = {"n": 0}

    def _make(table: str | None = None, **overrides: Any) -> TableConfig:
        counter["n"] += 1
        name = table or f"t_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}_{counter['n']}"
        return parse_table(student_doc(tmp_path / "lake", name, **overrides))

    return _make


@pytest.fixture
def make_snapshot_cfg(tmp_path: Path) -> Callable[..., TableConfig]:
    """Build a ``mode: snapshot`` TableConfig (key ``id``, compared ``full_name``) for a fresh table."""
    counter = {"n": 0}

    def _make(**overrides: Any) -> TableConfig:
        counter["n"] += 1
        name = f"s_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}_{counter['n']}"
        doc = student_doc(tmp_path / "lake", name, mode="snapshot", columns=[dict(c) for c in STUDENT_COLUMNS[:2]])
        del doc["order_by"]
        doc.update(overrides)
        return parse_table(doc)

    return _make


def snapshot_state(spark: Any, cfg: TableConfig) -> tuple[dict[int, tuple[str, str, str]], dict[str, list[Any]]]:
    """A snapshot table as readers see it through the metastore: the current table (id -> full_name,
    operation, eff_start_date) and ``<t>_history`` (date -> sorted (id, full_name, operation) rows)."""
    names = table_names(cfg)
    base, history = f"`{cfg.database}`.`{names['base_table']}`", f"`{cfg.database}`.`{cfg.table}_history`"
    for t in (base, history):
        spark.catalog.refreshTable(t)
    current = {
        r["id"]: (r["full_name"], r["operation"], str(r["eff_start_date"]))
        for r in spark.sql(f"SELECT id, full_name, operation, eff_start_date FROM {base}").collect()
    }
    dates: dict[str, list[Any]] = {r[0].split("=", 1)[1]: [] for r in spark.sql(f"SHOW PARTITIONS {history}").collect()}
    for r in spark.sql(f"SELECT id, full_name, operation, eff_start_date FROM {history}").collect():
        dates[r["eff_start_date"]].append((r["id"], r["full_name"], r["operation"]))
    return current, {d: sorted(rows) for d, rows in dates.items()}


@pytest.fixture
def lake_of() -> Callable[[TableConfig], Lake]:
    return Lake


@pytest.fixture
def runtime(spark: Any, endpoint: MetastoreEndpoint) -> Callable[[TableConfig], Runtime]:
    """A step runtime on the real metastore, with the compaction job in the session's Spark."""

    def _rt(cfg: TableConfig) -> Runtime:
        return Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=SessionEngine(spark))

    return _rt


def finish_run(rt: Runtime, path: str, now: Any = None) -> None:
    """compact + validate + publish + archive of a planned run, as the DAG's tasks do."""
    import json

    rt.engine.compact(json.loads(rt.lake.storage.read_text(path)))  # type: ignore[attr-defined]
    validate(rt, path)
    publish(rt, path, now=now)
    archive(rt, path)


def compact_once(rt: Runtime, run_id: str, now: Any = None) -> str:
    """One whole run (plan ... archive); returns the plan path, '' if nothing was pending."""
    path = plan(rt, run_id, now=now)
    if path:
        finish_run(rt, path, now=now)
    return path


def visible_names(spark: Any, cfg: TableConfig) -> dict[int, str]:
    """The student-shaped base table's rows, read plainly (it holds the visible rows only): id -> full_name."""
    name = f"`{cfg.database}`.`{table_names(cfg)['base_table']}`"
    spark.catalog.refreshTable(name)
    rows = spark.sql(f"SELECT id, full_name, op FROM {name}").collect()
    assert all(r["op"] != "d" for r in rows), f"{name} shows deleted rows: {rows}"
    return {r["id"]: r["full_name"] for r in rows}


MERGE_PATHS = ["broadcast", "window"]


def merge_paths(keep: str) -> list[Any]:
    """``merge_path``'s values for an indirect parametrize: ``keep`` in make test, the other path in
    make test-extended (marker ``extended``) -- for a test whose examples cost minutes a path."""
    return [p if p == keep else pytest.param(p, marks=pytest.mark.extended) for p in MERGE_PATHS]


def merge_path_cases(values: list[Any], name: Callable[[Any], str], window_only: Callable[[Any], bool]) -> list[Any]:
    """``(value, merge_path)`` params (``merge_path`` indirect) for a test run down each merge path of the job.

    In make test each value runs down one path, the paths alternating by position so that each meets
    half of the values; the other path runs in make test-extended.  A value whose table always takes the
    window (``window_only``: partial rows, a partitioned table) runs down the window in make test; its
    run with broadcast forced takes the window again, so it is in make test-extended only.
    """
    cases = []
    for i, value in enumerate(values):
        keep = "window" if window_only(value) else MERGE_PATHS[i % 2]
        for path in MERGE_PATHS:
            marks = () if path == keep else (pytest.mark.extended,)
            cases.append(pytest.param(value, path, id=f"{path}-{name(value)}", marks=marks))
    return cases


@pytest.fixture(params=MERGE_PATHS)
def merge_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every cdc compaction of the test merges down this path where the table allows it (the job's test hook)."""
    from cdc_compaction.job.modes.cdc import MERGE_PATH_ENV

    monkeypatch.setenv(MERGE_PATH_ENV, request.param)
    return request.param


def merge_paths_taken(root: Path) -> list[str]:
    """The merge path of every cdc compaction whose stats file is under ``root`` (as its commit records it)."""
    import json

    from cdc_compaction.job.contract import STATS_FILE

    docs = [json.loads(p.read_text()) for p in sorted(root.rglob(STATS_FILE))]
    return [d["merge_path"] for d in docs if "merge_path" in d]


@pytest.fixture(scope="module")
def inprocess(spark: Any, endpoint: MetastoreEndpoint) -> Any:
    """Runs scenario compactions in this process: the task functions in the pipeline's order, one SparkSession."""
    from cdc_compaction.devtools import conformance as conf

    return conf.InProcessRunner(spark, endpoint)


def connect_server_on(metastore: LocalMetastore, home: Path) -> Iterator[Any]:
    """A Spark Connect server on 127.0.0.1 under ``home``, on the session's metastore and warehouse, for a
    fixture to yield; stopped by its PID when the fixture ends."""
    from cdc_compaction.devtools.local_services import SparkConnectServer

    server = SparkConnectServer(
        home=home,
        metastore_uri=metastore.uri,
        warehouse_dir=str(metastore.home / "warehouse"),
        port=free_port(),
        master="local[2]",
        extra_conf={"spark.sql.shuffle.partitions": "4"},
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def warm_connect(metastore: LocalMetastore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Spark Connect server per test worker, on the session's metastore: the ``spark_connect`` engine's
    warm server (what ``make demo`` runs on) for the DAG runs of :func:`dag_runner`, so that a DAG run
    pays no JVM start; the tests that pin ``engine: spark_submit`` still start one per run."""
    yield from connect_server_on(metastore, tmp_path_factory.mktemp("warm_connect"))


#: The registry's ``spark`` section of :func:`dag_runner`'s tables: the job and the DDL in the warm server.
OVER_CONNECT = {"engine": "spark_connect", "conf": {"spark.sql.shuffle.partitions": "2"}}


@pytest.fixture(scope="module")
def dag_runner(
    spark: Any,
    endpoint: MetastoreEndpoint,
    metastore: LocalMetastore,
    warm_connect: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Any:
    """Runs scenario compactions as real DAG runs (``airflow dags test``) in a fresh Airflow home.

    The job runs in the worker's warm Spark Connect server (``spark.engine: spark_connect``); a test
    sets ``dag_runner.registry_spark = None`` for spark-submit (one JVM per run, the registry's default).
    """
    from cdc_compaction.devtools import conformance as conf
    from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db

    work = tmp_path_factory.mktemp("dagmode")
    env = airflow_env(
        work / "airflow",
        metastore.uri,
        registry_dir=work / "registry",
        warehouse_dir=metastore.home / "warehouse",
        connect_port=warm_connect.port,
    )
    ensure_airflow_db(env)
    runner = conf.DagRunner(spark, endpoint, env, registry_spark=OVER_CONNECT)
    runner.work = work  # type: ignore[attr-defined]
    return runner


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's server (S3, EMR, Glue APIs) on 127.0.0.1, stopped by this fixture."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def aws_default_conn(moto_endpoint: str) -> str:
    """The Airflow connection ``aws_default`` of the tests (``AIRFLOW_CONN_AWS_DEFAULT``'s value): moto's server."""
    import json

    conn = {
        "conn_type": "aws",
        "login": "testing-access-key",
        "password": "testing-secret-key",
        "extra": {"endpoint_url": moto_endpoint, "region_name": "us-east-1"},
    }
    return json.dumps(conn)


@pytest.fixture
def aws_default(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The Airflow connection ``aws_default`` pointing at moto, defined only through the environment."""
    for var in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", aws_default_conn(moto_endpoint))
    return moto_endpoint


def race(n: int, action: Callable[[int], None]) -> tuple[list[int], list[int], list[BaseException]]:
    """Run ``action(i)`` in ``n`` threads released together: (winners, PreconditionFailed losers, others)."""
    barrier = threading.Barrier(n)
    won: list[int] = []
    lost: list[int] = []
    other: list[BaseException] = []
    lock = threading.Lock()

    def contender(i: int) -> None:
        barrier.wait()
        try:
            action(i)
        except PreconditionFailedError:
            with lock:
                lost.append(i)
        except Exception as exc:  # noqa: BLE001 - any other outcome fails the calling test
            with lock:
                other.append(exc)
        else:
            with lock:
                won.append(i)

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost, other


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once per session (tests/wheel_helpers.py)."""
    from wheel_helpers import build_wheel

    return build_wheel(tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and the test venv's third-party packages (tests/wheel_helpers.py)."""
    from wheel_helpers import install_wheel

    return install_wheel(wheel, tmp_path_factory.mktemp("venv"), tmp_path_factory.mktemp("site-mirror"))


def with_timestamp(doc: dict[str, Any]) -> None:
    """Add ``changed_at``, a timestamp derived from ``ts_ms`` (one day per 100 ms), to every row and expectation."""
    doc["table"]["columns"].insert(-1, {"name": "changed_at", "type": "timestamp"})

    def stamp(row: dict[str, Any]) -> None:
        ts = row.get("ts_ms")
        row["changed_at"] = None if ts is None else f"2026-11-{1 + ts // 100:02d}T{ts % 24:02d}:00:00Z"

    for step in doc["steps"]:
        ((kind, body),) = step.items()
        for rows in body["files"] if kind == "land" else [body.get("expect", [])]:
            for row in rows:
                stamp(row)


def first_version(lake: Any, version: str, stats: dict[str, Any], increments: list[str] | None = None) -> None:
    """Commit ``version`` (its files written already) as the table's first commit, live and archived."""
    from cdc_compaction.core.lake import Commit

    commit = Commit(
        seq=1,
        version=version,
        plan_id="plan1",
        run_id="run1",
        parent_seq=0,
        files=[],
        increments=["increment_2026112200"] if increments is None else increments,
        stats=stats,
        committed_at="2026-11-22T01:10:00+00:00",
    )
    assert lake.try_commit(commit)
    lake.advance_pointer(commit)
    lake.storage.write_text(lake.layout.archived_marker(1), "")
