"""Where the pinned jars of ``jars.lock`` are cached, and the check that the cache is that lock's.

``make jars`` (:mod:`cdc_compaction.devtools.jars`) fills the cache; services and Spark engines
find their jars here with :func:`group_dir`, which refuses a cache that does not match the lock:
nothing is downloaded at run time.  Standard library only (``make jars`` runs before the
virtualenv exists), and below every layer that starts a JVM.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cdc_compaction.core.exceptions import CdcCompactionError

#: The lock at the repository's root.
LOCK = Path(__file__).resolve().parents[3] / "jars.lock"
#: The cache's default place; ``CDC_JARS_DIR`` (the Makefile's ``JARS_DIR``) moves it.
DEFAULT_DIR = Path.home() / ".cache" / "cdc_compaction" / "jars"
STAMP = ".lock-sha256"


class JarError(CdcCompactionError):
    """The jar cache is missing, stale, or a fetched jar does not match ``jars.lock``."""


def jars_dir() -> Path:
    """Where the cache is: ``CDC_JARS_DIR``, else :data:`DEFAULT_DIR`."""
    return Path(os.environ.get("CDC_JARS_DIR") or DEFAULT_DIR)


def lock_digest(lock: Path = LOCK) -> str:
    return hashlib.sha256(lock.read_bytes()).hexdigest()


def is_current(dest: Path, lock: Path = LOCK) -> bool:
    """True if ``dest`` holds the jars of this very ``lock`` (its stamp names the lock's sha256)."""
    try:
        return (dest / STAMP).read_text().strip() == lock_digest(lock)
    except OSError:
        return False


def group_dir(purpose: str, dest: Path | None = None, lock: Path = LOCK) -> Path:
    """The checked directory of ``purpose``'s jars, or an error saying to run ``make jars``."""
    dest = dest or jars_dir()
    if not is_current(dest, lock):
        raise JarError(
            f"the jar cache {dest} does not hold the jars of {lock}: run `make jars` (CDC_JARS_DIR=... for "
            "another place); nothing is downloaded at run time"
        )
    directory = dest / purpose
    if not directory.is_dir():
        raise JarError(f"{lock} has no '# [{purpose}]' group, so {directory} does not exist")
    return directory


def group_jars(purpose: str, dest: Path | None = None) -> list[str]:
    """The jar files of ``purpose``'s group, sorted (a classpath's or ``spark.jars``' entries)."""
    return [str(p) for p in sorted(group_dir(purpose, dest).glob("*.jar"))]


def classpath(*purposes: str, dest: Path | None = None) -> str:
    """The jars of ``purposes``' groups as a Java classpath."""
    return os.pathsep.join(p for purpose in purposes for p in group_jars(purpose, dest))
