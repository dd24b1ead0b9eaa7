"""The job package: the zip spark-submit ships to the cluster (``--py-files``).

It holds ``cdc_compaction/__init__.py`` and every ``cdc_compaction/job/**.py`` -- the job
needs nothing else of the package (``tests/job`` checks the imports).  The zip is
deterministic: entries sorted by name, stored uncompressed (deflate's output may differ
between zlib versions), with a fixed timestamp and fixed permissions, so the same source
gives the same bytes on every machine; its name carries a hash of those bytes,
``cdc_compaction_job-<hash>.zip``, so a cluster never runs a stale copy under a current name.

Built on demand, at task run time or by ``cdc-compaction job-package``, never
while a DAG file is parsed.  Standard library only, like the contract.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import time
import zipfile
from pathlib import Path

#: ``plugins/cdc_compaction``: the package whose job sub-package is shipped.
PACKAGE_DIR = Path(__file__).resolve().parents[1]
PREFIX = "cdc_compaction_job-"
#: The earliest time a zip entry can record: any fixed value would do.
_TIMESTAMP = (1980, 1, 1, 0, 0, 0)
_MODE = 0o644


def sources(package_dir: Path = PACKAGE_DIR) -> list[tuple[str, Path]]:
    """(name in the zip, file) of everything the job package holds, sorted by name."""
    job_dir = package_dir / "job"
    files = [(f"cdc_compaction/job/{p.relative_to(job_dir).as_posix()}", p) for p in job_dir.rglob("*.py")]
    return sorted([("cdc_compaction/__init__.py", package_dir / "__init__.py"), *files])


def build_bytes(package_dir: Path = PACKAGE_DIR) -> bytes:
    """The job package's zip, in memory."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, path in sources(package_dir):
            info = zipfile.ZipInfo(name, date_time=_TIMESTAMP)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3  # Unix, whichever system builds it: the mode bits below are Unix ones
            info.external_attr = (0o100000 | _MODE) << 16  # a regular file, rw-r--r--
            zf.writestr(info, path.read_bytes())
    return buf.getvalue()


def file_name(data: bytes) -> str:
    """``cdc_compaction_job-<first 16 hex digits of the SHA-256 of the zip>.zip``."""
    return f"{PREFIX}{hashlib.sha256(data).hexdigest()[:16]}.zip"


def build(out_dir: str | os.PathLike[str], package_dir: Path = PACKAGE_DIR) -> Path:
    """The job package in ``out_dir``, written unless a zip of the same name is there already.

    The name is the content's hash, so a file of that name holds these bytes: it is written
    to a temporary file and renamed into place, never seen half-written by a concurrent task
    (tasks of several tables may build it at once on one worker).
    """
    data = build_bytes(package_dir)
    out = Path(out_dir)
    target = out / file_name(data)
    if target.is_file():
        return target
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{PREFIX}", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, _MODE)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    prune(out, keep=target)
    return target


#: A superseded job package is removed once it is this old: a job submitted before the upgrade
#: may still be reading it (local mode's Python workers import from the zip while the job runs),
#: and no job lives longer than a run's lease (``lease_timeout``, 6 hours by default).
PRUNE_AFTER_SECONDS = 2 * 24 * 3600


def prune(out_dir: str | os.PathLike[str], keep: Path, now: float | None = None) -> list[Path]:
    """Remove the job packages in ``out_dir`` other than ``keep`` older than :data:`PRUNE_AFTER_SECONDS`.

    Called when a new package is written, i.e. once per code change, so that upgrades do not
    pile up zips. Returns what it removed; one it cannot remove is left for the next time.
    """
    now = time.time() if now is None else now
    removed = []
    for old in Path(out_dir).glob(f"{PREFIX}*.zip"):
        try:
            if old.name != keep.name and now - old.stat().st_mtime > PRUNE_AFTER_SECONDS:
                old.unlink()
                removed.append(old)
        except OSError:
            continue  # gone already (another task pruned it), or not ours to remove
    return removed
