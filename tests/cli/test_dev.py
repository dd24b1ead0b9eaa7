"""The embedded default's commands (``cdc_compaction.cli.dev``): ``postgres check``."""

from __future__ import annotations

from .helpers import cli


def test_postgres_check_finds_the_server_and_wal2json() -> None:
    """``make test`` runs this first: PostgreSQL with wal2json is a test requirement, not a skip."""
    proc = cli("postgres", "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PostgreSQL server binaries in" in proc.stdout and "with wal2json" in proc.stdout
