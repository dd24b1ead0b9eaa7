"""The pinned jar cache: ``jars.lock`` fetched with Maven from Maven Central, checked, cached.

``make jars`` runs :func:`fetch` (``python -m cdc_compaction.devtools.jars fetch``): every group of
``jars.lock`` (``# [name]`` starts one) is copied by Maven into ``<jars dir>/<name>/``, each jar's
sha256 is checked against the lock (an archive, ``@tar.gz``, is then unpacked into the group's
directory and not kept), and a stamp holding the lock's own sha256 is written, so that
a second run with the same lock does nothing.  Services find their classpath with
:func:`~cdc_compaction.core.jarcache.group_dir` (re-exported here), which refuses a cache that does
not match the lock: nothing is downloaded at run time.

This module uses the standard library only: ``make jars`` runs it before the virtualenv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from cdc_compaction.core.jarcache import (
    DEFAULT_DIR,
    LOCK,
    STAMP,
    JarError,
    classpath,
    group_dir,
    group_jars,
    is_current,
    jars_dir,
    lock_digest,
)

__all__ = [
    "DEFAULT_DIR",
    "LOCK",
    "STAMP",
    "Jar",
    "JarError",
    "classpath",
    "fetch",
    "group_dir",
    "group_jars",
    "is_current",
    "jars_dir",
    "lock_digest",
    "read_lock",
    "verify",
]

_LINE = re.compile(
    r"^(?P<group>[\w.-]+):(?P<artifact>[\w.-]+):(?P<version>[\w.+-]+)(?::(?P<classifier>[\w.-]+))?"
    r"(?:@(?P<type>[\w.-]+))?\s+(?P<sha256>[0-9a-f]{64})$"
)
_GROUP = re.compile(r"^#\s*\[(?P<name>[a-z0-9_-]+)\]")


@dataclass(frozen=True)
class Jar:
    """One line of ``jars.lock``."""

    group: str
    artifact: str
    version: str
    classifier: str | None
    type: str
    sha256: str
    #: The ``# [name]`` group it belongs to: the subdirectory of the cache.
    purpose: str

    @property
    def file_name(self) -> str:
        """The name ``dependency:copy-dependencies`` gives it."""
        suffix = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{suffix}.{self.type}"

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}" + (f":{self.classifier}" if self.classifier else "")


def read_lock(lock: Path = LOCK) -> list[Jar]:
    """Every jar of ``lock``; a malformed line or a jar outside a group is an error naming its line."""
    jars: list[Jar] = []
    purpose: str | None = None
    for number, raw in enumerate(lock.read_text().splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _GROUP.match(line)
            if m:
                purpose = m.group("name")
            continue
        m = _LINE.match(line)
        if m is None:
            raise JarError(
                f"{lock}:{number}: {line!r} is not 'group:artifact:version[:classifier][@type] sha256': fix the line"
            )
        if purpose is None:
            raise JarError(f"{lock}:{number}: {m.group('artifact')} comes before any '# [group]' line: add one above")
        jars.append(
            Jar(
                m.group("group"),
                m.group("artifact"),
                m.group("version"),
                m.group("classifier"),
                m.group("type") or "jar",
                m.group("sha256"),
                purpose,
            )
        )
    return jars


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _say(line: str) -> None:
    """A line of ``make jars``' own output (it is a command-line tool, not a service: no logging set up)."""
    sys.stdout.write(line + "\n")


def _pom(jars: list[Jar]) -> str:
    """A throwaway pom naming ``jars`` without their dependencies: the lock already lists every one."""
    deps = "".join(
        "<dependency>"
        f"<groupId>{escape(j.group)}</groupId><artifactId>{escape(j.artifact)}</artifactId>"
        f"<version>{escape(j.version)}</version><type>{escape(j.type)}</type>"
        + (f"<classifier>{escape(j.classifier)}</classifier>" if j.classifier else "")
        + "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>"
        "</dependency>"
        for j in jars
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>cdc-compaction</groupId><artifactId>jar-cache</artifactId><version>0</version>"
        f"<dependencies>{deps}</dependencies></project>"
    )


def verify(jars: list[Jar], directory: Path) -> None:
    """Check every jar in ``directory`` against its sha256; the first mismatch or missing jar raises, named."""
    for j in jars:
        path = directory / j.file_name
        if not path.is_file():
            raise JarError(f"{j.coordinate} ({j.purpose}/{j.file_name}) was not fetched: see Maven's output above")
        got = sha256_of(path)
        if got != j.sha256:
            raise JarError(
                f"{j.coordinate} ({path}): sha256 {got} is not the {j.sha256} that jars.lock pins. The jar is not "
                "the one the lock was made with: do not use it; re-resolve the group and check the new hash"
            )


#: The lock's types that are archives: checked like a jar, then unpacked into the group's directory (a server
#: such as Trino's ships as one, with its own plugins and launcher inside).
ARCHIVES = ("tar.gz",)


def unpack(jars: list[Jar], directory: Path) -> None:
    """Unpack every checked archive of ``jars`` in ``directory`` into it, as the archive lays it out, and delete it.

    A member that would leave ``directory`` (an absolute path, ``..``, a link out) or overwrite a file already
    there (two archives of one group sharing a path) is refused, naming the archive and the member.
    """
    for j in jars:
        if j.type not in ARCHIVES:
            continue
        archive = directory / j.file_name
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            for m in members:
                if not m.isdir() and (directory / m.name).exists():
                    raise JarError(
                        f"{j.coordinate} ({j.purpose}/{j.file_name}): its member {m.name} is already in "
                        f"{directory}: two archives of the {j.purpose} group share a path; put them in groups of "
                        "their own"
                    )
            try:
                # The "data" filter refuses members that leave the directory, device files and setuid bits.
                tar.extractall(directory, members=members, filter="data")
            except tarfile.FilterError as exc:
                raise JarError(f"{j.coordinate} ({j.purpose}/{j.file_name}): refused to unpack it: {exc}") from exc
        archive.unlink()


def fetch(dest: Path | None = None, lock: Path = LOCK, mvn: str = "mvn") -> Path:
    """Fetch, check and stamp every group of ``lock`` into ``dest``; nothing if its stamp matches already.

    Each group is copied by one Maven run (``dependency:copy-dependencies`` of a throwaway pom that
    names the group's jars, each without its dependencies) into a new directory beside the group's,
    checked there, its archives unpacked there (:func:`unpack`), and only then renamed into place: a
    failed or interrupted fetch leaves the old group as it was, and a jar the lock no longer names does
    not linger on a classpath.
    """
    dest = dest or jars_dir()
    if is_current(dest, lock):
        _say(f"jars: {dest} matches {lock.name}")
        return dest
    exe = shutil.which(mvn)
    if exe is None:
        raise JarError("Maven (mvn) is not installed: install it (apt-get install maven); make jars needs it")
    jars = read_lock(lock)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / STAMP).unlink(missing_ok=True)
    for purpose in dict.fromkeys(j.purpose for j in jars):
        group = [j for j in jars if j.purpose == purpose]
        work = Path(tempfile.mkdtemp(prefix=f".{purpose}-", dir=dest))
        try:
            (work / "pom.xml").write_text(_pom(group))
            out = work / "jars"
            run = subprocess.run(
                [
                    exe,
                    *("-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies"),
                    *(f"-DoutputDirectory={out}", "-DexcludeTransitive=true", "-DincludeScope=runtime"),
                ],
                check=False,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            if run.returncode != 0:
                raise JarError(f"Maven could not fetch the {purpose} jars of {lock.name}:\n{run.stdout[-4000:]}")
            verify(group, out)
            unpack(group, out)
            final = dest / purpose
            if final.exists():
                shutil.rmtree(final)
            out.rename(final)
            _say(f"jars: {purpose}: {len(group)} jars checked in {final}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    (dest / STAMP).write_text(lock_digest(lock) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_compaction.devtools.jars", description=__doc__)
    parser.add_argument("command", choices=["fetch", "path"])
    parser.add_argument("--dir", type=Path, default=None, help="the cache (default: CDC_JARS_DIR or ~/.cache/...)")
    parser.add_argument("--lock", type=Path, default=LOCK)
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            fetch(args.dir, args.lock)
        else:
            _say(str(args.dir or jars_dir()))
    except JarError as exc:
        sys.stderr.write(f"make jars: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
