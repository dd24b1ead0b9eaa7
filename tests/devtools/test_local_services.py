"""The embedded default's metastore and PostgreSQL: real services, loopback only, stopped by PID."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from cdc_compaction.devtools.local_services import LocalMetastore, LocalPostgres, java_major_version, port_open

pytestmark = pytest.mark.metastore


def _non_loopback_address() -> str | None:
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = []
    candidates = [a for a in out if "." in a and not a.startswith("127.")]
    if not candidates:
        try:
            candidates = [a for a in {socket.gethostbyname(socket.gethostname())} if not a.startswith("127.")]
        except OSError:
            candidates = []
    return candidates[0] if candidates else None


def test_java_17_is_available() -> None:
    assert java_major_version() >= 17


def test_metastore_listens_on_loopback_only(metastore: LocalMetastore) -> None:
    assert port_open("127.0.0.1", metastore.port)
    other = _non_loopback_address()
    if other is None:
        pytest.skip("this machine has no non-loopback IPv4 address to probe")
    assert not port_open(other, metastore.port), f"the metastore answers on {other}:{metastore.port}"


def test_metastore_runs_under_its_pid_file(metastore: LocalMetastore) -> None:
    pid = metastore.pid()
    assert pid is not None
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"LoopbackMetaStore" in cmdline and str(metastore.port).encode() in cmdline
    # Starting again reuses the running service instead of launching a second one.
    assert metastore.start() == pid


def test_stop_kills_the_process_by_pid(tmp_path) -> None:
    from cdc_compaction.devtools.local_services import free_port

    ms = LocalMetastore(tmp_path, port=free_port())
    pid = ms.start()
    assert port_open("127.0.0.1", ms.port)
    assert ms.stop() is True
    with pytest.raises(OSError):
        os.kill(pid, 0)
    assert not port_open("127.0.0.1", ms.port)
    assert ms.stop() is False


# ------------------------------------------------------------------ PostgreSQL
def test_postgres_is_ready_for_logical_decoding_on_loopback_only(postgres: LocalPostgres) -> None:
    with postgres.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT current_setting('wal_level'), current_setting('listen_addresses')")
        assert cur.fetchone() == ("logical", "127.0.0.1")
        cur.execute("SELECT 1 FROM pg_available_extensions LIMIT 1")  # any query: it answers
    other = _non_loopback_address()
    if other is not None:
        assert not port_open(other, postgres.port), f"postgres answers on {other}:{postgres.port}"


def test_postgres_stops_by_pid_and_removes_its_data(tmp_path: Path) -> None:
    from cdc_compaction.devtools.local_services import free_port

    pg = LocalPostgres(tmp_path, port=free_port())
    pid = pg.start()
    data = pg.data_dir()
    assert data is not None and (data / "PG_VERSION").exists()
    assert Path(f"/proc/{pid}/exe").resolve().name == "postgres", "the PID is the postmaster itself"
    assert pg.start() == pid, "a second start reuses the running server"
    assert pg.stop() is True
    with pytest.raises(OSError):
        os.kill(pid, 0)
    assert not port_open("127.0.0.1", pg.port)
    # As root the data lived in a /tmp directory of the postgres account: nothing else would remove it.
    assert data.is_relative_to(tmp_path) or not data.exists()
    assert pg.stop() is False


def test_persistent_postgres_keeps_its_data_across_stop_and_start(tmp_path: Path) -> None:
    """make airflow-ui's server: its data outlives any number of stops, in a place no stop deletes.

    As root, pytest's directory is closed to the postgres account: the data goes to the shared
    root-owned place, named by the home; as a normal user, to ``home/data``.
    """
    from cdc_compaction.devtools.local_services import free_port

    home = tmp_path / "postgres"
    pg = LocalPostgres(home, port=free_port(), persistent=True)
    try:
        pg.start()
        data = pg.data_dir()
        assert data is not None and (data / "PG_VERSION").exists()
        assert not data.is_relative_to(Path("/tmp")) or data.is_relative_to(home), data
        with pg.connect() as conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('run 1')")
        for _ in range(2):
            assert pg.stop() is True
            assert (data / "PG_VERSION").exists(), "a stop deleted the persistent data"
            pg.start()
            assert pg.data_dir() == data
            with pg.connect() as conn, conn.cursor() as cur:
                cur.execute("SELECT v FROM kept")
                assert cur.fetchall() == [("run 1",)]
    finally:
        gone = pg.destroy()
    assert not data.exists() and (data in gone or data.parent in gone), gone
    assert pg.pid() is None


def test_a_persistent_postgres_keeps_its_data_in_its_home_when_the_postgres_account_can_enter_it() -> None:
    """A project directory every account may enter (0755 up to /): the data is ``home/data``, as the docs say."""
    import shutil
    import tempfile

    from cdc_compaction.devtools.local_services import free_port

    top = Path(tempfile.mkdtemp(prefix="cdc-pg-home-test-"))  # pytest's own directory is 0700 (as root)
    try:
        top.chmod(0o755)
        pg = LocalPostgres(top / "postgres", port=free_port(), persistent=True)
        try:
            pg.start()
            assert pg.data_dir() == top / "postgres" / "data"
            pg.stop()
            assert (top / "postgres" / "data" / "PG_VERSION").exists()
        finally:
            pg.destroy()
        assert not (top / "postgres" / "data").exists()
    finally:
        shutil.rmtree(top)


def test_a_throwaway_postgres_is_still_thrown_away(tmp_path: Path) -> None:
    """Tests' servers stay throwaway: without persistent=True a second start is an empty cluster as root."""
    from cdc_compaction.devtools.local_services import free_port

    pg = LocalPostgres(tmp_path, port=free_port())
    pg.start()
    try:
        data = pg.data_dir()
        assert data is not None
    finally:
        pg.stop()
    assert data.is_relative_to(tmp_path) or not data.exists()
