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

:func:`query_views` runs the DuckDB views script of an S3 lake in that DuckDB with its ``httpfs``
extension (``duckdb-ext-httpfs``, the same 1.4.4 build): the script read from S3 with ``read_text``,
the S3 endpoint and credentials in a ``CREATE SECRET`` as a DuckDB user configures them
(:func:`s3_secret`).
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

#: What every script run in the reading DuckDB starts with: its version checked, a session in UTC, the extensions.
_PREAMBLE = r"""
import json, os, sys
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
"""

_SCRIPT = (
    _PREAMBLE
    + r"""
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
)


class DuckDBReadersError(RuntimeError):
    """The reading DuckDB is not installed, or it failed (its stderr is in the message)."""


def readers_dir() -> Path:
    return Path(os.environ.get("CDC_DUCKDB_READERS") or DEFAULT_DIR)


def extensions(kind: str) -> list[str]:
    """The extension files a ``kind`` (``delta``, ``iceberg``, or ``s3``: httpfs) read loads; raise naming the fix
    if absent."""
    base = readers_dir() / "duckdb_ext" / "extensions" / f"v{VERSION}" / "linux_amd64"
    names = {"delta": ["delta"], "iceberg": ["avro", "iceberg"], "s3": ["httpfs"]}[kind]
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
            "extensions": extensions(kind),
            "kind": kind,
            "target": target,
            "columns": columns,
            "at": at,
            "out": out,
        }
        _run(_SCRIPT, req, f"read the {kind} table {target} (at {at})")
        return pq.read_table(out).to_pylist()  # type: ignore[no-any-return]


def _run(script: str, req: dict[str, Any], doing: str) -> None:
    """Run ``script`` in DuckDB 1.4.4's subprocess with ``req`` (and the version and directory it checks)."""
    req = {"version": VERSION, "dir": str(readers_dir()), **req}
    env = {**os.environ, "PYTHONPATH": str(readers_dir())}
    done = subprocess.run(
        [sys.executable, "-s", "-c", script, json.dumps(req)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise DuckDBReadersError(f"DuckDB {VERSION} could not {doing}: {done.stderr[-2000:]}")


_VIEWS_SCRIPT = (
    _PREAMBLE
    + r"""
for statement in req["setup"]:
    con.execute(statement)
# The script where the pipeline wrote it (on S3 too), as a user reads it: read_text through httpfs.
con.execute(con.execute("SELECT content FROM read_text(?)", [req["script"]]).fetchone()[0])
for name, query in req["queries"].items():
    con.execute(f"COPY ({query}) TO {lit(os.path.join(req['out'], name + '.parquet'))} (FORMAT parquet)")
"""
)


def s3_secret(endpoint_url: str, key_id: str, secret: str, region: str = "us-east-1") -> str:
    """A ``CREATE SECRET`` that points DuckDB's httpfs at an S3 endpoint given as a URL.

    ``http://host:port`` (a local S3 such as moto's server): ``ENDPOINT 'host:port'``, ``USE_SSL false`` and
    path-style URLs (``URL_STYLE 'path'``: a local server has no per-bucket host names); ``https://...``: SSL on.
    """
    from urllib.parse import urlsplit

    url = urlsplit(endpoint_url)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ValueError(f"{endpoint_url!r} is not an http(s) endpoint URL")

    def lit(text: str) -> str:
        return "'" + text.replace("'", "''") + "'"

    return (
        f"CREATE OR REPLACE SECRET cdc_s3 (TYPE s3, KEY_ID {lit(key_id)}, SECRET {lit(secret)}, "
        f"REGION {lit(region)}, ENDPOINT {lit(url.netloc)}, URL_STYLE 'path', "
        f"USE_SSL {'true' if url.scheme == 'https' else 'false'})"
    )


def query_views(script: str, queries: dict[str, str], setup: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Run the DuckDB views ``script`` (a path or ``s3://`` URI) in DuckDB 1.4.4 with httpfs after ``setup``
    (e.g. :func:`s3_secret`), then each of ``queries``; each query's rows under its name."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="cdc-duckdb-views-") as tmp:
        req = {"extensions": extensions("s3"), "setup": setup, "script": script, "queries": queries, "out": tmp}
        _run(_VIEWS_SCRIPT, req, f"run the views script {script} and query it")
        return {name: pq.read_table(os.path.join(tmp, f"{name}.parquet")).to_pylist() for name in queries}
