"""The embedded default's Airflow environment: a metadata database is migrated whenever it needs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db, metadata_rows
from cdc_compaction.devtools.local_services import LocalPostgres

pytestmark = [pytest.mark.dag]


def _revision(conn: str) -> list[tuple[object, ...]]:
    return metadata_rows(conn, "SELECT version_num FROM alembic_version", ())


def test_a_recreated_database_is_migrated_again(postgres: LocalPostgres, tmp_path: Path) -> None:
    """The marker of a migration is the database's own: the same URL on a new, empty database migrates.

    That is make airflow-ui's database after its data was lost or reset: skipping the migration made
    the api-server die with "Database migration required".
    """
    from psycopg2 import sql as pgsql

    name = "airflow_recreated"
    conn = postgres.create_database(name)
    env = airflow_env(tmp_path / "airflow", "thrift://127.0.0.1:9", sql_alchemy_conn=conn)
    ensure_airflow_db(env)
    assert _revision(conn), "migrated"
    admin = postgres.connect()
    try:
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(pgsql.SQL("DROP DATABASE {} WITH (FORCE)").format(pgsql.Identifier(name)))
    finally:
        admin.close()
    assert postgres.create_database(name) == conn  # the very same URL, an empty database
    ensure_airflow_db(env)
    assert _revision(conn), "the new database was not migrated: the marker of the old one was trusted"
