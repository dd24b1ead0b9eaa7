"""PostgreSQL is the oracle: its table, not the project's code, says what the lake must hold.

A seeded random workload runs against a real ``students`` table, hour by hour:
inserts, updates (several of one row in one transaction), deletes, updates that change
the primary key, delete-and-reinsert of a key, multi-row updates, NULLs, and rolled
back transactions.  wal2json's changes from a logical replication slot are landed as
Debezium-flattened Parquet increments (``cdc_compaction.devtools.pgsource``), one per hour, and
right after each hour the test takes ``SELECT * FROM students`` from PostgreSQL.

After every hour the table's view (base + pending increments) must equal that snapshot;
after the hours where the real DAG runs (``airflow dags test``: spark-submit and all)
the base table's visible rows must equal it too -- as multisets of rows.

The same test runs on a lake on S3 (``s3a://`` on moto's server, the ``aws_default`` connection):
every file of the job and of the DDL goes through Spark's S3A, the catalog is the same Thrift
metastore (it takes ``s3a://`` locations), and the base is read plainly from the pointer's
location(s) on S3 instead of by DuckDB.

Three shapes of the same changes, three tables: Debezium's (a key change is a delete and a
create), a source that carries the old key (registry ``old_key``: key changes and deletes
name the key they had), and a table without a primary key under ``REPLICA IDENTITY FULL``
(``mode: keyless``: updates and deletes carry the whole old row; the workload also inserts
exact duplicates there).

Every table starts with rows: the slot is created after them and their initial snapshot is landed
first, every row stamped with the slot's consistent point as its LSN (op ``r``), as Debezium does
(the keyless table's snapshot holds equal rows).  And one transaction stays open across a
compaction: it inserts before the compaction and commits after it, so its changes' LSNs are below
changes already compacted while PostgreSQL delivers them after (in commit order).  A keyless table
orders by the commit LSN and tells events apart by the change LSN and the row ordinal
(``event_id``); ordering by the change LSN alone loses the snapshot's rows and the late
transaction's.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_compaction.core.registry import parse_table
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.core.storage.s3 import S3Storage
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools import pgsource
from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db
from cdc_compaction.devtools.local_services import LocalMetastore, LocalPostgres
from cdc_compaction.pipeline.views import refresh_view

from .truth_workload import DATA_TYPES, KINDS, Workload, data_only, snapshot

pytestmark = [pytest.mark.dag, pytest.mark.spark, pytest.mark.metastore]

SEED = 20261124
HOURS = 4
#: After these hours (1-based) the real DAG compacts; the view is checked after every hour.
DAG_AFTER = {2, 4}
#: The hour whose start opens the long transaction (it inserts, then stays open over that hour's
#: compaction) and the hour whose start commits it.
LONG_OPENS, LONG_COMMITS = 2, 3
#: The lake's table for each source shape (registry fields besides the shared columns).
SHAPES: dict[str, dict[str, Any]] = {
    # wal2json v2 gives every change its own LSN, several changes of one row in one transaction
    # included: the LSN alone orders a key's events.
    "debezium": {"primary_key": ["id"], "order_by": ["lsn"]},
    "old_key": {"primary_key": ["id"], "old_key": ["_before_id"], "order_by": ["lsn"]},
    # ts_ms is when the change was committed: the event's, not the row's (no before-image). No key
    # orders a keyless log: the position PostgreSQL delivers in (commit LSN), then what tells its
    # events apart (change LSN; the ordinal of a snapshot's rows, which share one LSN).
    "keyless": {
        "mode": "keyless",
        "event_time": {"column": "ts_ms"},
        "order_by": ["commit_lsn"],
        "event_id": ["lsn", "lsn_row"],
    },
}
EXTRA_COLUMNS = {
    "debezium": [],
    "old_key": [{"name": "_before_id", "type": "int"}],
    "keyless": [
        *({"name": f"_before_{c}", "type": t} for c, t in DATA_TYPES.items()),
        {"name": "commit_lsn", "type": "bigint"},
        {"name": "lsn_row", "type": "bigint"},
    ],
}
#: The rows before the slot exists: the initial snapshot. The keyless table's hold equal rows.
INITIAL = {
    "keyed": [(i, f"initial-{i}", i % 13 or None) for i in range(1, 19)],
    "keyless": [(i % 12 + 1, f"initial-{i % 12 + 1}", None if i % 5 == 0 else 7) for i in range(18)],
}
#: What the long transaction inserts (the keyless one two equal rows); ids outside the workload's.
LONG_ROWS = {
    "keyed": [(1001, "long-1", 1), (1002, "long-2", None), (1003, None, 3)],
    "keyless": [(1001, "long-1", 1), (1001, "long-1", 1), (1002, None, None)],
}


#: make test runs the Debezium shape (the source this package is for) on a local lake; the old-key and
#: keyless shapes, some 2-3 minutes each, and the Debezium shape on S3 (S3A), run in make test-extended.
CASES = [
    *(
        pytest.param(s, "local", id=f"{s}-local", marks=() if s == "debezium" else (pytest.mark.extended,))
        for s in sorted(SHAPES)
    ),
    pytest.param("debezium", "s3a", id="debezium-s3a", marks=(pytest.mark.extended, pytest.mark.s3)),
]


def lake_root(lake: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the test's lakes live: a local directory, or a fresh bucket on moto's server (``s3a://``)."""
    if lake == "local":
        return str(tmp_path / "lake")
    request.getfixturevalue("aws_default")  # the connection every S3 client of the test (and the DAG) takes
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    S3Storage().client.create_bucket(Bucket=bucket)
    return f"s3a://{bucket}/lake"


@pytest.fixture
def source(request: pytest.FixtureRequest, postgres: LocalPostgres) -> Any:
    """A fresh database with ``students`` and a wal2json slot on it; dropped afterwards."""
    from psycopg2 import sql as pgsql

    shape = request.param
    name = f"truth_{random.randrange(10**9)}"
    postgres.create_database(name)
    conn = postgres.connect(name)
    kind = "keyless" if shape == "keyless" else "keyed"
    with conn.cursor() as cur:
        if shape == "keyless":
            # No key: PostgreSQL sends the whole old row of an update or delete only under FULL.
            cur.execute("CREATE TABLE students (id int, full_name text, grade int)")
            cur.execute("ALTER TABLE students REPLICA IDENTITY FULL")
        else:
            cur.execute("CREATE TABLE students (id int PRIMARY KEY, full_name text, grade int)")
        cur.executemany("INSERT INTO students VALUES (%s, %s, %s)", INITIAL[kind])
    conn.commit()
    consistent_point = pgsource.create_slot(conn, name)
    # Nothing changes the table between the slot and this read: it is the slot's snapshot.
    initial = pgsource.snapshot_changes(conn, "public.students", consistent_point)
    assert len(initial) == len(INITIAL[kind]) and {c.lsn for c in initial} == {consistent_point}
    long_conn = postgres.connect(name)  # the long transaction's session
    try:
        yield conn, name, shape, initial, long_conn
    finally:
        long_conn.rollback()  # a test that failed may leave it open: the database cannot be dropped then
        long_conn.close()
        conn.rollback()
        pgsource.drop_slot(conn, name)
        conn.close()
        admin = postgres.connect()
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(pgsql.SQL("DROP DATABASE {}").format(pgsql.Identifier(name)))
        admin.close()


@pytest.mark.parametrize(("source", "lake"), CASES, indirect=["source"])
def test_the_lake_matches_postgres_after_every_hour(
    source: tuple[Any, str, str, list[pgsource.Change], Any],
    lake: str,
    spark: Any,
    endpoint: MetastoreEndpoint,
    metastore: LocalMetastore,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    conn, slot, shape, initial, long_conn = source
    scn = conf.Scenario(
        path=tmp_path / "pg_truth.json",
        name=f"pg_students_{shape}",
        about="students, from a PostgreSQL logical replication slot (wal2json)",
        table={
            "columns": [
                {"name": "id", "type": "int"},
                {"name": "full_name", "type": "string"},
                {"name": "grade", "type": "int"},
                *EXTRA_COLUMNS[shape],
                {"name": "op", "type": "string"},
                {"name": "ts_ms", "type": "bigint"},
                {"name": "lsn", "type": "bigint"},
            ],
            **SHAPES[shape],
        },
        steps=[],
    )
    registry = tmp_path / "registry"
    registry.mkdir()
    doc = conf.registry_doc(scn, tmp_path / "lake")
    doc["storage_root"] = f"{lake_root(lake, request, tmp_path)}/{doc['table']}"
    (registry / f"{doc['database']}.{doc['table']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = parse_table(doc)
    env = airflow_env(
        tmp_path / "airflow", metastore.uri, registry_dir=registry, warehouse_dir=metastore.home / "warehouse"
    )
    ensure_airflow_db(env)
    runner = conf.DagRunner(spark, endpoint, env)
    # Spark through the metastore, and DuckDB through the files and its views (on S3: the files, read plainly).
    readers: list[Any] = [conf.Reader(spark), conf.DuckDBReader() if lake == "local" else conf.PointerFilesReader()]
    runner.setup(cfg)

    work = Workload(conn, random.Random(SEED), duplicates=shape == "keyless")
    kind = "keyless" if shape == "keyless" else "keyed"
    events = 0
    failures: list[str] = []
    late: list[pgsource.Change] = []
    max_lsn = compacted_lsn = 0
    for hour in range(0, HOURS + 1):
        if hour == 0:
            changes = initial  # the initial snapshot, landed on its own before any change
        else:
            if hour == LONG_OPENS:
                with long_conn.cursor() as cur:
                    cur.executemany("INSERT INTO students VALUES (%s, %s, %s)", LONG_ROWS[kind])
            if hour == LONG_COMMITS:
                long_conn.commit()
            work.hour()
            changes = pgsource.read_changes(conn, slot, "public.students")
        expected = snapshot(conn)
        if hour == LONG_COMMITS:
            late = [c for c in changes if c.columns.get("id") in {r[0] for r in LONG_ROWS[kind]} and c.action == "I"]
        rows = pgsource.SHAPES[shape](cfg, changes)
        # Each event has its own position: a key's (LSN, key), or a keyless event's (commit LSN, LSN, row).
        ids = Counter(
            (r["commit_lsn"], r["lsn"], r["lsn_row"]) if shape == "keyless" else (r["id"], r["lsn"]) for r in rows
        )
        assert max(ids.values(), default=1) == 1, "two events share a position"
        pgsource.land_changes(cfg, f"increment_20250101{hour:02d}", changes, shape)
        events += len(rows)
        max_lsn = max([max_lsn, *(c.lsn for c in changes)])

        if hour in DAG_AFTER:
            runner.compact(cfg)
            if hour == LONG_OPENS:
                compacted_lsn = max_lsn  # the long transaction's changes will come below it
            for reader in readers:
                diff = conf.diff_rows(expected, data_only(reader.visible_base(cfg)), DATA_TYPES)
                if diff:
                    failures.append(f"hour {hour}: {reader.name} base differs from PostgreSQL\n" + "\n".join(diff))
        refresh_view(runner.runtime(cfg))
        for reader in (r for r in readers if r.reads_views):
            diff = conf.diff_rows(expected, data_only(reader.view(cfg)), DATA_TYPES)
            if diff:
                failures.append(f"hour {hour}: {reader.name} view differs from PostgreSQL\n" + "\n".join(diff))

    assert not failures, "\n".join(failures)
    # The long transaction's inserts were delivered after the compaction, with LSNs below ones it compacted.
    assert len(late) == len(LONG_ROWS[kind]), late
    assert all(c.lsn < compacted_lsn < c.commit_lsn for c in late), (compacted_lsn, late)
    # The workload did what it is meant to exercise.
    assert work.rolled_back >= 3 and work.committed >= 50
    assert set(work.kinds) >= KINDS, work.kinds
    if shape == "keyless":
        assert work.kinds["duplicate"] >= 3 and len(expected) > len({r["id"] for r in expected}), "equal rows"
    assert events >= 200, events
    assert len(expected) >= 20, "the table still has rows to compare"
    assert [t["state"] for t in runner.timings] == ["success"] * len(DAG_AFTER)
