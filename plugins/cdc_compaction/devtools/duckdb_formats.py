"""DuckDB's own ``delta`` and ``iceberg`` extensions reading the lake's Delta and Iceberg tables.

A DuckDB user reads a Delta table with ``delta_scan('<root>')`` (an older version: ``ATTACH '<root>'
AS t (TYPE delta, VERSION n)``) and an Iceberg table with ``iceberg_scan('<root>', version_name_format
=> '%s%s.metadata.json')`` (through ``version-hint.text``; an older snapshot: ``iceberg_scan('<metadata
json>', snapshot_from_id => id)``).  The extensions are on PyPI
(``duckdb-ext-delta``, ``duckdb-ext-iceberg``, ``duckdb-ext-avro``) for DuckDB 1.4.4 only, while the
project pins DuckDB 2.0 (no extension is published for it, and the extensions repository is out of
reach here), so a second DuckDB, 1.4.4, is installed for reading only (``make duckdb-readers``:
``requirements-duckdb-readers.txt``, hashes checked, into ``.venv/duckdb-readers``) and run in a
subprocess with that directory first on its path.  The rows come back as a Parquet file DuckDB
writes (types kept), read here with pyarrow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cdc_compaction.core.settings import PROJECT_ROOT

#: The DuckDB the extensions are built for (requirements-duckdb-readers.txt).
VERSION = "1.4.4"
#: Where ``make duckdb-readers`` installs it; ``CDC_DUCKDB_READERS`` points elsewhere.
DEFAULT_DIR = PROJECT_ROOT / ".venv" / "duckdb-readers"

_SCRIPT = r"""
import json, sys
import duckdb

req = json.loads(sys.argv[1])
if duckdb.__version__ != req["version"]:
    sys.exit(f"DuckDB {duckdb.__version__} was imported, not {req['version']}: check {req['dir']} comes first")

def lit(text):
    return "'" + str(text).replace("'", "''") + "'"

con = duckdb.connect()
con.execute("SET TimeZone = 'UTC'")
for ext in req["extensions"]:
    con.execute(f"LOAD {lit(ext)}")
cols = ", ".join('"' + c.replace('"', '""') + '"' for c in req["columns"])
if req["kind"] == "delta" and req["at"] is None:
    source = f"delta_scan({lit(req['target'])})"
elif req["kind"] == "delta":
    # delta_scan takes no version: an attached table pinned to one does.
    con.execute(f"ATTACH {lit(req['target'])} AS t (TYPE delta, VERSION {int(req['at'])})")
    source = "t"
else:
    pin = f", snapshot_from_id => {int(req['at'])}" if req["at"] is not None else ""
    if not req["target"].endswith(".json"):
        # The table's directory: its metadata/version-hint.text names the current metadata file by its stem.
        pin += ", version_name_format => '%s%s.metadata.json'"
    source = f"iceberg_scan({lit(req['target'])}{pin})"
con.execute(f"COPY (SELECT {cols} FROM {source}) TO {lit(req['out'])} (FORMAT parquet)")
"""


class DuckDBReadersError(RuntimeError):
    """The reading DuckDB is not installed, or it failed (its stderr is in the message)."""


def readers_dir() -> Path:
    return Path(os.environ.get("CDC_DUCKDB_READERS") or DEFAULT_DIR)


def extensions(kind: str) -> list[str]:
    """The extension files a ``kind`` (``delta`` or ``iceberg``) read loads; raise naming the fix if absent."""
    base = readers_dir() / "duckdb_ext" / "extensions" / f"v{VERSION}" / "linux_amd64"
    names = ["delta"] if kind == "delta" else ["avro", "iceberg"]
    files = [base / f"{n}.duckdb_extension" for n in names]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise DuckDBReadersError(
            f"DuckDB {VERSION}'s extensions {missing} are not installed: run `make duckdb-readers` "
            "(requirements-duckdb-readers.txt)"
        )
    return [str(f) for f in files]


def read(kind: str, target: str, columns: list[str], at: int | None = None) -> list[dict[str, Any]]:
    """The rows of ``columns`` of a Delta table at ``target`` (its root; ``at``: a Delta version) or an
    Iceberg table (``target``: its metadata JSON, or its directory, read through ``version-hint.text``;
    ``at``: a snapshot id), as DuckDB 1.4.4 reads them."""
    import pyarrow.parquet as pq

    if kind not in ("delta", "iceberg"):
        raise ValueError(f"kind is delta or iceberg, not {kind!r}")
    with tempfile.TemporaryDirectory(prefix="cdc-duckdb-read-") as tmp:
        out = os.path.join(tmp, "rows.parquet")
        req = {
            "version": VERSION,
            "dir": str(readers_dir()),
            "extensions": extensions(kind),
            "kind": kind,
            "target": target,
            "columns": columns,
            "at": at,
            "out": out,
        }
        env = {**os.environ, "PYTHONPATH": str(readers_dir())}
        done = subprocess.run(
            [sys.executable, "-s", "-c", _SCRIPT, json.dumps(req)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            raise DuckDBReadersError(
                f"DuckDB {VERSION} could not read the {kind} table {target} (at {at}): {done.stderr[-2000:]}"
            )
        return pq.read_table(out).to_pylist()  # type: ignore[no-any-return]
