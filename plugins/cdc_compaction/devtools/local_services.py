"""The embedded default's services, from the pyspark wheel.

``LocalMetastore`` is a Thrift Hive metastore, used by ``make demo``, ``make test`` and
``cdc-compaction metastore start|stop``.  It keeps its Derby database under a
project-local directory.  ``Hive4Metastore`` is a Hive 4 standalone metastore with
transactions (``jars.lock``'s ``hive4-metastore`` group), for the tests of the Iceberg
``hive`` catalog, whose commits take a metastore lock.  ``SparkStandalone`` is a Spark standalone master plus one
worker, used by the cluster integration test.  ``SparkThriftServer`` is Spark's Thrift
JDBC/ODBC server for BI clients (``make serve-sql``).  ``LocalPostgres`` is a throwaway
PostgreSQL server (the machine's own binaries, with ``wal2json``): the CDC source of
the PostgreSQL demo and test, and the Airflow metadata database of the tests that run
several Airflow processes at once.  Every service binds to 127.0.0.1 only and is
stopped by the PID it was started with.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

from cdc_compaction.core import settings
from cdc_compaction.core.exceptions import CdcCompactionError

log = logging.getLogger(__name__)

LAUNCHER_SOURCE = settings.INCLUDE_DIR / "metastore" / "LoopbackMetaStore.java"

_HIVE_SITE = """<?xml version="1.0"?>
<configuration>
  <property><name>javax.jdo.option.ConnectionURL</name><value>jdbc:derby:;databaseName={db};create=true</value></property>
  <property><name>datanucleus.schema.autoCreateAll</name><value>true</value></property>
  <property><name>hive.metastore.schema.verification</name><value>false</value></property>
  <property><name>hive.async.log.enabled</name><value>false</value></property>
  <property><name>hive.metastore.warehouse.dir</name><value>{warehouse}</value></property>
  <property><name>hive.metastore.event.db.notification.api.auth</name><value>false</value></property>
{extra}</configuration>
"""


def _properties(conf: dict[str, str]) -> str:
    """``conf`` as hive-site.xml ``<property>`` lines (values escaped)."""
    from xml.sax.saxutils import escape

    return "".join(
        f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n" for k, v in sorted(conf.items())
    )


class ServiceError(CdcCompactionError):
    """A local service could not be started or stopped."""


def pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def java_major_version(java: str = "java") -> int:
    """The major version of ``java`` on PATH, or raise with what to install."""
    exe = shutil.which(java)
    if exe is None:
        raise ServiceError(
            "Java is not installed: install a JDK 17 or newer (e.g. apt-get install openjdk-17-jdk-headless)"
        )
    out = subprocess.run([exe, "-version"], capture_output=True, text=True, check=False).stderr
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        raise ServiceError(f"cannot tell the Java version from: {out.strip()!r}")
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


def require_java17() -> None:
    major = java_major_version()
    if major < 17:
        raise ServiceError(
            f"Java {major} found, but Spark 4 needs Java 17 or newer: install a JDK 17+ and put it on PATH"
        )


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file (what a failed start shows)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """True if a process with this PID exists (and is not a zombie we can reap)."""
    # Reap it if it is our child; ignore if it is not.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def stop_pid(pid: int, timeout_s: float = 20.0, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` (SIGTERM) to ``pid``, wait up to ``timeout_s`` for it to exit, then SIGKILL it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.2)
    log.warning("pid %d did not exit within %.0fs of signal %d; sending SIGKILL", pid, timeout_s, sig)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)


def stop_group(pid: int, name: str, timeout_s: float = 30.0) -> None:
    """SIGTERM to the process group ``pid`` leads (a clean shutdown), SIGKILL after ``timeout_s``; ``name`` is
    the service's, for the log."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
        if not pid_alive(pid):
            break
        log.warning("%s (pid %d) did not exit within %.0fs of signal %d", name, pid, wait_s, sig)


def spawn(cmd: list[str], log_file: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a session of its own (so that :func:`stop_group` stops all it starts), its output
    appended to ``log_file``, no input."""
    with open(log_file, "ab") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True
        )


class GroupLeader:
    """What a service whose process leads a group of its own shares: started by :meth:`launch` and
    :meth:`wait_ready`, stopped by its PID (:func:`stop_group`), and a context manager that starts and stops it.
    A subclass has ``pid``, ``pid_file``, ``log_file`` and ``start``."""

    #: The service's name in the log and in its errors.
    service: ClassVar[str] = "service"
    pid: int | None
    pid_file: Path
    log_file: Path

    def start(self) -> int:
        raise NotImplementedError

    def launch(self, cmd: list[str], cwd: Path) -> subprocess.Popen[bytes]:
        """Spawn ``cmd`` in ``cwd`` as the leader of a process group of its own (:func:`spawn`, output to
        ``log_file``); its PID in :attr:`pid` and ``pid_file``, so that :meth:`stop` finds it."""
        proc = spawn(cmd, self.log_file, cwd)
        self.pid = proc.pid
        self.pid_file.write_text(str(proc.pid))
        return proc

    def wait_ready(
        self,
        proc: subprocess.Popen[bytes],
        ready: Callable[[], bool],
        timeout_s: float,
        *,
        waiting_for: str,
        who: str | None = None,
        log_text: Callable[[Path], str] = tail,
        poll_s: float = 1.0,
    ) -> int:
        """Wait until ``ready()`` (the service's own check: it answers a query, says it has started) is true; its PID.

        If ``proc`` exits first, raise at once with its exit code and ``log_text`` of ``log_file`` (default: its
        tail); if ``timeout_s`` passes, :meth:`stop` it and raise the same way. ``waiting_for`` says what did not
        happen ("answer on host:port"), ``who`` names the service in an exit error (default :attr:`service`).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                self.pid = None
                self.pid_file.unlink(missing_ok=True)
                raise ServiceError(
                    f"{who or self.service} exited with code {proc.returncode} while starting; the last lines of "
                    f"{self.log_file}:\n{log_text(self.log_file)}"
                )
            if ready():
                return proc.pid
            if time.monotonic() >= deadline:
                self.stop()
                raise ServiceError(
                    f"{self.service} did not {waiting_for} within {timeout_s:.0f}s; the last lines of "
                    f"{self.log_file}:\n{log_text(self.log_file)}"
                )
            time.sleep(poll_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the process group this service leads (a clean shutdown), SIGKILL after ``timeout_s``."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        stop_group(pid, self.service, timeout_s)
        self.pid_file.unlink(missing_ok=True)
        log.info("%s (pid %d) stopped", self.service, pid)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def stop_process_tree(proc: subprocess.Popen[Any], grace_s: float = 60.0, term_s: float = 15.0) -> list[int]:
    """Stop ``proc`` and every process under it; return the PIDs that needed SIGKILL.

    ``proc`` gets SIGINT first, as from a Ctrl-C, so that it stops its own children in its order
    (``airflow standalone`` terminates its scheduler, API server, DAG processor and triggerer and
    waits for them). Whatever is left after ``grace_s`` gets SIGTERM, then SIGKILL. The tree is
    listed before the first signal and again before the second: task processes put themselves in
    process groups of their own (Airflow's supervisor), so a signal to ``proc``'s group alone
    would miss them. ``proc`` should lead its own process group (``start_new_session=True``).
    """
    import psutil  # Airflow's dependency; only the commands that run Airflow need it

    def tree() -> list[psutil.Process]:
        try:
            root = psutil.Process(proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    known = {p.pid: p for p in tree()}
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    known.update({p.pid: p for p in tree()})
    # is_running() compares start times: a PID the system reused for another process is left alone.
    left = [p for p in known.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    if left:
        log.warning("still running %.0fs after SIGINT: %s; sending SIGTERM", grace_s, sorted(p.pid for p in left))
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _gone, left = psutil.wait_procs(left, timeout=term_s)
    for p in left:
        log.warning("pid %d did not exit within %.0fs of SIGTERM; sending SIGKILL", p.pid, term_s)
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(left, timeout=5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    return sorted(p.pid for p in left)


#: How long stopping a command's Airflow processes may take: SIGTERM, then SIGKILL what is left.
STOP_WITHIN_S = 10.0


def stop_groups(procs: list[subprocess.Popen[Any]], grace_s: float = 5.0) -> list[int]:
    """Stop every process of ``procs``' process groups and their descendants, within :data:`STOP_WITHIN_S`.

    Each of ``procs`` leads its own process group (``start_new_session=True``).  Every process
    of those groups and under them is listed first (task processes put themselves in groups of
    their own), then each group and each process gets SIGTERM; what is still there after
    ``grace_s`` gets SIGKILL.  Returns the PIDs that needed SIGKILL.  Only these PIDs are
    signalled: a reused PID is told apart by its start time (psutil).
    """
    import psutil  # Airflow's dependency; only the commands that run Airflow need it

    known: dict[int, psutil.Process] = {}
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(proc.pid)
            known.update({p.pid: p for p in [root, *root.children(recursive=True)]})
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    for p in known.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _gone, left = psutil.wait_procs(list(known.values()), timeout=grace_s)
    for p in left:
        log.warning("pid %d did not exit within %.0fs of SIGTERM; sending SIGKILL", p.pid, grace_s)
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    psutil.wait_procs(left, timeout=max(STOP_WITHIN_S - grace_s - 1, 1))
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1)
    return sorted(p.pid for p in left)


@dataclass
class LocalMetastore:
    """A Thrift Hive metastore backed by Derby under ``home``."""

    home: Path
    port: int = 9083
    host: str = "127.0.0.1"
    warehouse: Path | None = None
    #: Jars after the pyspark wheel's on its classpath: the S3A group's, so that it takes ``s3a://`` locations.
    extra_jars: list[str] = field(default_factory=list)
    #: Hadoop settings for its hive-site.xml (the ``fs.s3a.*`` endpoint, path style, region): no secret here.
    hadoop_conf: dict[str, str] = field(default_factory=dict)
    #: Its process environment's additions: the credentials (``AWS_*``, which S3A's default chain reads).
    env: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def uri(self) -> str:
        return f"thrift://{self.host}:{self.port}"

    def with_s3a(self, conn_id: str = "aws_default") -> LocalMetastore:
        """This metastore, able to record (and create) ``s3a://`` table and partition locations.

        The Hive 2.3 metastore of the pyspark wheel runs on the wheel's Hadoop (``hadoop-client-api``,
        the version hadoop-aws is pinned to), so the ``s3a`` jar group (hadoop-aws, the AWS SDK
        bundle) loads in it as in Spark.  It checks and creates a table's location with its own file
        system, so it needs S3A's settings too: the ones Spark's engines take, from the same Airflow
        connection (``integrations.engine.s3a_connection_conf``); the credentials go to its
        environment only.
        """
        from cdc_compaction.integrations.engine import s3a_connection_conf, s3a_jars

        hadoop, env = s3a_connection_conf(conn_id, "the metastore's S3A: the Airflow connection")
        self.extra_jars, self.hadoop_conf, self.env = s3a_jars(), hadoop, env
        return self

    @property
    def pid_file(self) -> Path:
        return self.home / "metastore.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "metastore.log"

    def _compile_launcher(self, jars: str) -> Path:
        classes = self.home / "classes"
        target = classes / "LoopbackMetaStore.class"
        if target.exists() and target.stat().st_mtime >= LAUNCHER_SOURCE.stat().st_mtime:
            return classes
        javac = shutil.which("javac")
        if javac is None:
            raise ServiceError(
                "javac is missing: install a full JDK 17+ (not only a JRE), e.g. openjdk-17-jdk-headless"
            )
        classes.mkdir(parents=True, exist_ok=True)
        subprocess.run([javac, "-d", str(classes), "-cp", jars, str(LAUNCHER_SOURCE)], check=True, capture_output=True)
        return classes

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    def start(self, timeout_s: float = 180.0) -> int:
        """Start the service (or reuse the one this home already runs); return its PID."""
        pid = self.pid()
        if pid is not None and port_open(self.host, self.port):
            return pid
        if port_open(self.host, self.port):
            raise ServiceError(f"port {self.port} is taken by another process; stop it or choose another port")
        require_java17()
        self.home.mkdir(parents=True, exist_ok=True)
        conf = self.home / "conf"
        conf.mkdir(exist_ok=True)
        warehouse = self.warehouse or (self.home / "warehouse")
        (conf / "hive-site.xml").write_text(
            _HIVE_SITE.format(db=self.home / "metastore_db", warehouse=warehouse, extra=_properties(self.hadoop_conf))
        )
        jars = f"{pyspark_home() / 'jars'}/*"
        classes = self._compile_launcher(jars)
        classpath = os.pathsep.join([str(conf), jars, str(classes), *self.extra_jars])
        cmd = ["java", "-Xmx768m", "-Dderby.system.home=" + str(self.home), "-cp", classpath]
        cmd += ["LoopbackMetaStore", self.host, str(self.port)]
        return self._launch(cmd, "metastore", timeout_s)

    def _launch(self, cmd: list[str], what: str, timeout_s: float) -> int:
        """Start ``cmd`` in its own session (its PID in :attr:`pid_file`), wait for the port; its PID."""
        with open(self.log_file, "ab") as logf:
            proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        self.pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServiceError(f"the {what} exited with code {proc.returncode}; see {self.log_file}")
            if port_open(self.host, self.port):
                log.info("%s %s started (pid %d, home %s)", what, self.uri, proc.pid, self.home)
                return proc.pid
            time.sleep(0.5)
        self.stop()
        raise ServiceError(
            f"the {what} did not open {self.host}:{self.port} within {timeout_s:.0f}s; see {self.log_file}"
        )

    def stop(self, timeout_s: float = 20.0) -> bool:
        """Stop the service by its PID; True if one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        stop_pid(pid, timeout_s)
        self.pid_file.unlink(missing_ok=True)
        log.info("metastore (pid %d) stopped", pid)
        return True


#: The Hive 4 metastore's configuration (metastore-site.xml). The metastore's lock() needs no setting of its own:
#: it needs the transaction and lock tables (TXNS, HIVE_LOCKS, ...), which MetastoreSchemaTool's schema script
#: creates and datanucleus' autoCreateAll (the Hive 2.3 metastore's way) does not. hive.support.concurrency and
#: hive.txn.manager are HiveServer2's (the client's) settings: pyiceberg's commits were locked without them.
_HIVE4_SITE = """<?xml version="1.0"?>
<configuration>
  <property><name>javax.jdo.option.ConnectionURL</name><value>jdbc:derby:;databaseName={db};create=true</value></property>
  <property><name>javax.jdo.option.ConnectionDriverName</name><value>org.apache.derby.jdbc.EmbeddedDriver</value></property>
  <property><name>metastore.thrift.bind.host</name><value>{host}</value></property>
  <property><name>metastore.thrift.port</name><value>{port}</value></property>
  <property><name>metastore.warehouse.dir</name><value>{warehouse}</value></property>
  <property><name>metastore.event.db.notification.api.auth</name><value>false</value></property>
</configuration>
"""

#: jars.lock's group of the Hive 4 metastore: the server's tar.gz (unpacked) and what Hadoop's classpath would give it.
HIVE4_GROUP = "hive4-metastore"


def hive4_home(dest: Path | None = None) -> Path:
    """The unpacked Hive 4 standalone metastore of ``jars.lock``'s ``hive4-metastore`` group."""
    from cdc_compaction.devtools import jars

    (server,) = [j for j in jars.read_lock() if j.purpose == HIVE4_GROUP and j.type == "tar.gz"]
    home = jars.group_dir(HIVE4_GROUP, dest) / f"apache-hive-metastore-{server.version}-bin"
    if not (home / "lib").is_dir() or not (home / "scripts" / "metastore" / "upgrade" / "derby").is_dir():
        raise ServiceError(f"{home} does not hold an unpacked Hive {server.version} metastore: run `make jars` again")
    return home


@dataclass
class Hive4Metastore(LocalMetastore):
    """A Hive 4 standalone metastore (``jars.lock``'s ``hive4-metastore``) with transactions, Derby under ``home``.

    The Hive 2.3 metastore of :class:`LocalMetastore` has no transaction support, so it refuses the metastore
    lock (``lock()``) pyiceberg's HiveCatalog takes on every commit; this one serves it: its Derby schema is
    made by Hive's own ``MetastoreSchemaTool -initSchema`` (the transaction and lock tables included) on the
    first start. It binds to ``host`` only and is stopped by its PID, like :class:`LocalMetastore`.
    """

    def _classpath(self, server: Path, conf: Path) -> str:
        """The config directory, the server's ``lib/`` and the group's Hadoop jars (what ``$HADOOP_HOME`` gives)."""
        return f"{conf}:{server / 'lib'}/*:{server.parent}/*"

    def _init_schema(self, server: Path, classpath: str, timeout_s: float) -> None:
        """Create the Derby schema with Hive's schema tool, once: a home that has its database keeps it."""
        if (self.home / "metastore_db").is_dir():
            return
        cmd = ["java", "-Xmx512m", "-Dderby.system.home=" + str(self.home), "-cp", classpath]
        cmd += ["org.apache.hadoop.hive.metastore.tools.schematool.MetastoreSchemaTool", "-initSchema"]
        cmd += ["-dbType", "derby"]
        # METASTORE_HOME: where the schema tool finds scripts/metastore/upgrade/derby/hive-schema-<v>.derby.sql.
        env = {**os.environ, "METASTORE_HOME": str(server)}
        with open(self.log_file, "ab") as logf:
            try:
                run = subprocess.run(
                    cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=self.home, env=env, timeout=timeout_s, check=False
                )
            except subprocess.TimeoutExpired as exc:
                raise ServiceError(
                    f"the Hive 4 schema tool did not finish within {timeout_s:.0f}s; see {self.log_file}"
                ) from exc
        if run.returncode != 0:
            # A half-made database would be taken as made by the next start: remove it (this service made it).
            shutil.rmtree(self.home / "metastore_db", ignore_errors=True)
            raise ServiceError(
                f"the Hive 4 schema tool (-initSchema -dbType derby) exited with code {run.returncode}; "
                f"see {self.log_file}"
            )

    def start(self, timeout_s: float = 180.0) -> int:
        """Start the metastore (or reuse the one this home already runs), its schema made first; return its PID."""
        pid = self.pid()
        if pid is not None and port_open(self.host, self.port):
            return pid
        if port_open(self.host, self.port):
            raise ServiceError(f"port {self.port} is taken by another process; stop it or choose another port")
        require_java17()
        server = hive4_home()
        self.home.mkdir(parents=True, exist_ok=True)
        conf = self.home / "conf"
        conf.mkdir(exist_ok=True)
        warehouse = self.warehouse or (self.home / "warehouse")
        (conf / "metastore-site.xml").write_text(
            _HIVE4_SITE.format(db=self.home / "metastore_db", host=self.host, port=self.port, warehouse=warehouse)
        )
        classpath = self._classpath(server, conf)
        self._init_schema(server, classpath, timeout_s)
        cmd = ["java", "-Xmx512m", "-Dderby.system.home=" + str(self.home), "-cp", classpath]
        cmd += ["org.apache.hadoop.hive.metastore.HiveMetaStore"]
        return self._launch(cmd, "Hive 4 metastore", timeout_s)


@dataclass
class SparkStandalone:
    """A Spark standalone master and one worker from the pyspark wheel, under ``home``.

    Both daemons run ``<pyspark>/bin/spark-class`` directly (no ``sbin`` scripts), bind
    to ``host`` (with ``SPARK_LOCAL_IP``, which also keeps their web UIs off other
    interfaces), log to their own file and are stopped by PID.  ``conf_dir`` holds a
    ``spark-defaults.conf`` for clients: point ``SPARK_CONF_DIR`` of ``spark-submit`` at
    it so applications take executors that fit the worker (``executor_memory``,
    ``cores_max``) instead of waiting for resources the worker does not have.
    """

    home: Path
    port: int = 7077
    webui_port: int = 8080
    worker_webui_port: int = 8081
    host: str = "127.0.0.1"
    worker_cores: int = 1
    worker_memory: str = "1g"
    executor_memory: str = "512m"
    cores_max: int = 1
    daemon_memory: str = "256m"

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    @property
    def conf_dir(self) -> Path:
        return self.home / "conf"

    def pid_file(self, role: str) -> Path:
        return self.home / f"{role}.pid"

    def log_file(self, role: str) -> Path:
        return self.home / f"{role}.log"

    def pid(self, role: str) -> int | None:
        """PID of the running ``master`` or ``worker`` started from this home, else None."""
        try:
            pid = int(self.pid_file(role).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def status(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The master's JSON status (``/json/``): workers, active and completed apps."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
        with opener.open(f"{self.webui_url}/json/", timeout=timeout_s) as resp:
            return dict(json.load(resp))

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("SPARK_HOME", None)  # spark-class finds the wheel's own home
        env.update(
            {
                "SPARK_LOCAL_IP": self.host,
                "SPARK_CONF_DIR": str(self.conf_dir),
                "SPARK_WORKER_DIR": str(self.home / "work"),
                "SPARK_LOCAL_DIRS": str(self.home / "local"),
                "SPARK_DAEMON_MEMORY": self.daemon_memory,
                "SPARK_NO_DAEMONIZE": "1",
                # The master's REST submission server would take the fixed port 6066.
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            }
        )
        return env

    def _write_conf(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        for d in ("work", "local"):
            (self.home / d).mkdir(exist_ok=True)
        lines = {
            "spark.master": self.master_url,
            "spark.executor.memory": self.executor_memory,
            "spark.cores.max": str(self.cores_max),
            "spark.executor.cores": str(min(self.cores_max, self.worker_cores)),
        }
        (self.conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in lines.items()))

    def _launch(self, role: str, args: list[str]) -> subprocess.Popen[bytes]:
        spark_class = pyspark_home() / "bin" / "spark-class"
        with open(self.log_file(role), "ab") as logf:
            proc = subprocess.Popen(
                [str(spark_class), *args],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.home,
                env=self._env(),
                start_new_session=True,
            )
        self.pid_file(role).write_text(str(proc.pid))
        log.info("spark %s starting (pid %d, log %s)", role, proc.pid, self.log_file(role))
        return proc

    def _alive_workers(self) -> int:
        try:
            status = self.status(timeout_s=2.0)
        except (OSError, ValueError):
            return -1
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def start(self, timeout_s: float = 120.0) -> tuple[int, int]:
        """Start master and worker; return their PIDs once the master reports the worker ALIVE."""
        running = (self.pid("master"), self.pid("worker"))
        if running[0] is not None and running[1] is not None and self._alive_workers() >= 1:
            return running[0], running[1]
        for port in (self.port, self.webui_port, self.worker_webui_port):
            if port_open(self.host, port):
                raise ServiceError(f"port {port} is taken by another process; stop it or choose other ports")
        require_java17()
        self.home.mkdir(parents=True, exist_ok=True)
        self._write_conf()
        master_args = ["org.apache.spark.deploy.master.Master", "--host", self.host, "--port", str(self.port)]
        master_args += ["--webui-port", str(self.webui_port)]
        worker_args = ["org.apache.spark.deploy.worker.Worker", "--host", self.host]
        worker_args += ["--webui-port", str(self.worker_webui_port), "--cores", str(self.worker_cores)]
        worker_args += ["--memory", self.worker_memory, "--work-dir", str(self.home / "work"), self.master_url]
        procs: dict[str, subprocess.Popen[bytes]] = {}
        deadline = time.monotonic() + timeout_s
        try:
            procs["master"] = self._launch("master", master_args)
            self._wait(procs, deadline, lambda: self._alive_workers() >= 0, "open its web UI")
            procs["worker"] = self._launch("worker", worker_args)
            self._wait(procs, deadline, lambda: self._alive_workers() >= 1, "report the worker ALIVE")
        except BaseException:
            self.stop()
            raise
        log.info("spark standalone %s started (master pid %d, worker pid %d)", self.master_url, *self._pids(procs))
        return self._pids(procs)

    @staticmethod
    def _pids(procs: dict[str, subprocess.Popen[bytes]]) -> tuple[int, int]:
        return procs["master"].pid, procs["worker"].pid

    def _wait(
        self, procs: dict[str, subprocess.Popen[bytes]], deadline: float, ready: Callable[[], bool], what: str
    ) -> None:
        while time.monotonic() < deadline:
            for role, proc in procs.items():
                if proc.poll() is not None:
                    raise ServiceError(
                        f"the spark {role} exited with code {proc.returncode}; see {self.log_file(role)}"
                    )
            if ready():
                return
            time.sleep(0.5)
        raise ServiceError(
            f"the spark master at {self.webui_url} did not {what} in time; see {self.log_file('master')} "
            f"and {self.log_file('worker')}"
        )

    def stop(self, timeout_s: float = 20.0) -> bool:
        """Stop worker, then master, by PID; True if either was running."""
        stopped = False
        for role in ("worker", "master"):
            pid = self.pid(role)
            if pid is not None:
                stop_pid(pid, timeout_s)
                log.info("spark %s (pid %d) stopped", role, pid)
                stopped = True
            self.pid_file(role).unlink(missing_ok=True)
        return stopped


THRIFT_SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"


@dataclass
class SparkThriftServer:
    """Spark's Thrift JDBC/ODBC server (the HiveServer2 protocol) from the pyspark wheel, under ``home``.

    BI clients (beeline, DBeaver, Superset through PyHive) connect to
    ``jdbc:hive2://127.0.0.1:<port>/default`` and query the tables of the Hive metastore at
    ``metastore_uri`` with Spark SQL -- the ``<t>_view`` views too, which only Spark can
    read (they use Spark's ``_metadata`` file columns).  The server is one Spark
    application (``master``, ``local[*]`` by default) started with ``spark-submit --class
    HiveThriftServer2``; it gets the session settings the project's own sessions use
    (:data:`~cdc_compaction.integrations.engine.BASE_SPARK_CONF`: UTC session time zone, ...) and the
    catalog settings of :func:`~cdc_compaction.integrations.engine.hive_conf`.  It binds to ``host``
    (127.0.0.1) only, speaks the binary transport without authentication (NONE), logs to
    ``home/thriftserver.log`` and is stopped by its PID.
    """

    home: Path
    metastore_uri: str
    warehouse_dir: str
    port: int = 10000
    host: str = "127.0.0.1"
    master: str = "local[*]"
    driver_memory: str = "1g"
    extra_conf: dict[str, str] = field(default_factory=dict)
    #: The Spark to run (its ``bin/spark-submit``); None: the project's pyspark wheel. A second Spark
    #: for reading only (:mod:`~cdc_compaction.devtools.iceberg_spark`) gets no S3A jars: they are built
    #: for the project's Hadoop, not for the one of that Spark.
    spark_home: Path | None = None
    #: Hadoop settings of the server's own file systems (``spark.hadoop.<k>``; :meth:`with_s3a`): no credential.
    hadoop_conf: dict[str, str] = field(default_factory=dict)
    #: Variables added to the server's environment only (S3A's credentials; :meth:`with_s3a`).
    env: dict[str, str] = field(default_factory=dict)
    #: How logs and errors name the server.
    service_name: ClassVar[str] = "Spark Thrift server"

    def with_s3a(self, conn_id: str = "aws_default") -> Self:
        """This server, able to read and write ``s3a://`` with the Airflow connection ``conn_id``'s store.

        The S3A jars are the server's anyway when the jar cache has them (:meth:`spark_conf`); this adds
        the connection's endpoint, region and addressing as the server's own Hadoop settings, so that
        its catalog work (a table's or partition's ``s3a://`` location, qualified by the driver's file
        system) and a session that sets nothing reach the store, and its credentials to the server's
        environment, which S3A's default chain reads: never to its command line (``--conf`` is visible
        to every user of the machine) or a file. The settings and credentials come from
        :func:`~cdc_compaction.integrations.engine.s3a_connection_conf`, as the job's, the DDL's and
        the metastore's do.
        """
        from cdc_compaction.integrations.engine import s3a_connection_conf

        self.hadoop_conf, self.env = s3a_connection_conf(
            conn_id, f"the {self.service_name}'s S3A: the Airflow connection"
        )
        return self

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:hive2://{self.host}:{self.port}/default"

    @property
    def endpoint_url(self) -> str:
        """Where clients connect."""
        return self.jdbc_url

    @property
    def pid_file(self) -> Path:
        return self.home / "thriftserver.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "thriftserver.log"

    def pid(self) -> int | None:
        """PID of the server started from this home, if it still runs."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def spark_conf(self) -> dict[str, str]:
        """Spark settings of the server's application: the project's session defaults and its catalog."""
        from cdc_compaction.core.settings import MetastoreEndpoint
        from cdc_compaction.integrations.engine import BASE_SPARK_CONF, hive_conf

        if not self.metastore_uri.startswith("thrift://"):
            raise ServiceError(
                f"the Thrift server needs a Hive metastore's thrift:// URI, not {self.metastore_uri!r}; "
                "on EMR with Glue run the cluster's own Spark Thrift Server"
            )
        return {
            **BASE_SPARK_CONF,
            "spark.ui.enabled": "false",
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            # A Derby database a Hive client may open on its own stays under home, not in a cwd.
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={self.home}",
            # No table plans cached across statements: a BI client's connection outlives publishes (a new
            # base location, archived increments' partitions dropped) and must read the table as it is now.
            # Spark's default cache would serve the old location and partitions until the client reconnects.
            "spark.sql.filesourceTableRelationCacheSize": "0",
            **hive_conf(MetastoreEndpoint.parse(self.metastore_uri), self.warehouse_dir),
            **{f"spark.hadoop.{k}": v for k, v in self.hadoop_conf.items()},
            **self.extra_conf,
        }

    def server_conf(self) -> dict[str, str]:
        """HiveServer2 settings (``--hiveconf``): loopback, binary transport, no authentication."""
        return {
            "hive.server2.thrift.bind.host": self.host,
            "hive.server2.thrift.port": str(self.port),
            "hive.server2.transport.mode": "binary",
            "hive.server2.authentication": "NONE",
            "hive.server2.enable.doAs": "false",
            # Each statement's log (default: /tmp/<user>/operation_logs) stays under home.
            "hive.server2.logging.operation.log.location": str(self.home / "operation_logs"),
            "hive.metastore.uris": self.metastore_uri,
        }

    def command(self) -> list[str]:
        """The ``spark-submit`` command line that starts the server (nothing is run)."""
        cmd = [str(self.home_of_spark() / "bin" / "spark-submit"), "--master", self.master]
        cmd += ["--name", f"cdc-compaction Thrift JDBC/ODBC server {self.host}:{self.port}"]
        cmd += ["--class", THRIFT_SERVER_CLASS, "--driver-memory", self.driver_memory]
        for k, v in self.spark_conf().items():
            cmd += ["--conf", f"{k}={v}"]
        cmd.append("spark-internal")  # spark-submit's name for "the class is in Spark's own jars"
        for k, v in self.server_conf().items():
            cmd += ["--hiveconf", f"{k}={v}"]
        return cmd

    def home_of_spark(self) -> Path:
        """The Spark that runs the server: ``spark_home`` or the project's pyspark wheel."""
        return self.spark_home or pyspark_home()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # spark-submit finds the wheel's own home; a second Spark is named, not found through Python.
        env.pop("SPARK_HOME", None)
        if self.spark_home is not None:
            env["SPARK_HOME"] = str(self.spark_home)
        env.update(
            {
                "SPARK_LOCAL_IP": self.host,
                "SPARK_LOCAL_DIRS": str(self.home / "local"),
                # An empty conf directory: no spark-defaults.conf or hive-site.xml from elsewhere.
                "SPARK_CONF_DIR": str(self.home / "conf"),
                **self.env,
            }
        )
        return env

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def start(self, timeout_s: float = 180.0) -> int:
        """Start the server (or reuse the one this home already runs); return its PID once the port accepts."""
        pid = self.pid()
        if pid is not None and port_open(self.host, self.port):
            return pid
        if port_open(self.host, self.port):
            raise ServiceError(f"port {self.port} is taken by another process; stop it or choose another port")
        require_java17()
        cmd = self.command()
        for d in ("conf", "local"):
            (self.home / d).mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as logf:
            proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.home,
                env=self._env(),
                start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        log.info("%s starting (pid %d, log %s)", self.service_name, proc.pid, self.log_file)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise ServiceError(
                    f"the {self.service_name} exited with code {proc.returncode}; see {self.log_file}:\n"
                    + self.log_tail()
                )
            if port_open(self.host, self.port):
                log.info("%s %s started (pid %d)", self.service_name, self.endpoint_url, proc.pid)
                return proc.pid
            time.sleep(0.5)
        tail = self.log_tail()
        self.stop()
        raise ServiceError(
            f"the {self.service_name} did not open {self.host}:{self.port} within {timeout_s:.0f}s; "
            f"see {self.log_file}:\n{tail}"
        )

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the server by its PID; True if it was running."""
        pid = self.pid()
        if pid is not None:
            stop_pid(pid, timeout_s)
            log.info("%s (pid %d) stopped", self.service_name, pid)
        self.pid_file.unlink(missing_ok=True)
        return pid is not None


CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass
class SparkConnectServer(SparkThriftServer):
    """A Spark Connect server from the pyspark wheel, under ``home``: the warm engine ``spark_connect``.

    One long-lived Spark application (``spark-submit --class SparkConnectServer spark-internal``)
    that the compaction tasks and the DDL of ``ensure_tables`` reach over gRPC at
    ``sc://127.0.0.1:<port>``: an hourly run pays no JVM start.  It gets the project's session
    settings and the catalog settings of :func:`~cdc_compaction.integrations.engine.hive_conf` (the local
    metastore and warehouse), binds to ``host`` (127.0.0.1) only, logs to ``home/connect.log``
    and is stopped by its PID.
    """

    port: int = 15002
    service_name: ClassVar[str] = "Spark Connect server"

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    @property
    def endpoint_url(self) -> str:
        return self.url

    @property
    def pid_file(self) -> Path:
        return self.home / "connect.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "connect.log"

    def spark_conf(self) -> dict[str, str]:
        """The Thrift server's settings plus the gRPC endpoint on loopback."""
        conf = {
            **super().spark_conf(),
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
        }
        # S3A for lakes on s3a:// (jars cannot be added to a running server): each session then gets
        # its table's endpoint and credentials (ConnectEngine). Without `make jars`, local lakes only.
        from cdc_compaction.core.jarcache import JarError
        from cdc_compaction.integrations.engine import s3a_jars, s3a_local_classpath

        if self.spark_home is not None:
            return conf
        try:
            if self.master.startswith("local"):
                conf.update(s3a_local_classpath())
            else:
                conf["spark.jars"] = ",".join(s3a_jars())
        except JarError as exc:
            log.info("Spark Connect server without S3A (local lakes only): %s", exc)
        return conf

    def command(self) -> list[str]:
        """The ``spark-submit`` command line that starts the server (nothing is run)."""
        cmd = [str(self.home_of_spark() / "bin" / "spark-submit"), "--master", self.master]
        cmd += ["--name", f"cdc-compaction Spark Connect server {self.host}:{self.port}"]
        cmd += ["--class", CONNECT_SERVER_CLASS, "--driver-memory", self.driver_memory]
        for k, v in self.spark_conf().items():
            cmd += ["--conf", f"{k}={v}"]
        cmd.append("spark-internal")  # spark-submit's name for "the class is in Spark's own jars"
        return cmd


# ------------------------------------------------------------------ PostgreSQL
#: Where Debian/Ubuntu put each major version's server binaries (they are not on PATH).
_PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
_PG_MISSING = (
    "PostgreSQL server binaries not found (initdb, postgres): install them, e.g. "
    "apt-get install postgresql postgresql-15-wal2json, or set CDC_PG_BIN to their directory"
)


def postgres_bin_dir() -> Path:
    """The directory of ``initdb`` and ``postgres``: ``$CDC_PG_BIN``, the newest Debian one, or PATH."""
    candidates = [os.environ["CDC_PG_BIN"]] if os.environ.get("CDC_PG_BIN") else []
    # Newest major version first: "15" < "16" compares right as integers, not as strings.
    candidates += sorted(glob.glob(_PG_BIN_GLOB), key=lambda d: int(re.sub(r"\D", "", Path(d).parent.name) or 0))[::-1]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for d in candidates:
        if (Path(d) / "initdb").exists() and (Path(d) / "postgres").exists():
            return Path(d)
    raise ServiceError(_PG_MISSING)


def require_postgres(wal2json: bool = True) -> Path:
    """The server's bin directory, or raise with what to install (``wal2json`` included)."""
    bin_dir = postgres_bin_dir()
    if wal2json:
        out = subprocess.run([str(bin_dir / "pg_config"), "--pkglibdir"], capture_output=True, text=True, check=False)
        lib = Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else bin_dir.parent / "lib"
        if not (lib / "wal2json.so").exists():
            version = bin_dir.parent.name if bin_dir.parent.name.isdigit() else "<version>"
            raise ServiceError(
                f"the wal2json logical decoding plugin is missing from {lib}: install it, "
                f"e.g. apt-get install postgresql-{version}-wal2json"
            )
    return bin_dir


def account_groups(account: Any) -> set[int]:
    """The group ids of a ``pwd`` account: its primary group and every group listing it."""
    import grp

    return {account.pw_gid} | {g.gr_gid for g in grp.getgrall() if account.pw_name in g.gr_mem}


def enterable(path: Path, uid: int, gids: set[int]) -> bool:
    """Whether the account ``uid`` (in ``gids``) may enter ``path`` and every directory above it (``x``).

    Checked from the modes, as the kernel checks them for that account (root checks nothing).
    """
    import stat

    p = path.resolve()
    for d in [p, *p.parents]:
        try:
            st = d.stat()
        except OSError:
            return False
        if st.st_uid == uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in gids:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            return False
    return True


@dataclass
class LocalPostgres:
    """A PostgreSQL server on ``host:port``, ready for logical decoding with wal2json.

    ``initdb`` and ``postgres`` run as the calling user, or -- as root, which PostgreSQL
    refuses -- as ``run_as`` (the ``postgres`` account the distribution's package
    creates).  The data directory is recorded in ``home/data-dir``:

    * throwaway (the default: tests, demos): ``home/data``; as root, whose test directories
      the ``postgres`` account cannot enter, a fresh ``/tmp/cdc-pg-*`` owned by that
      account, removed by :meth:`stop`;
    * ``persistent=True`` (``make airflow-ui``'s metadata DB): ``home/data``, kept by
      :meth:`stop`, so any number of stop/start cycles keep the data.  As root that needs
      every directory above ``home`` to be enterable by ``run_as``; where one is not, the
      data lives in ``shared_root/<hash of home>/data`` (``/var/lib/cdc-compaction/postgres``:
      root-owned parents, never cleaned up behind the server's back), whose ``home`` file
      names the home it belongs to.  :meth:`destroy` removes it (a reset).  A persistent
      server keeps PostgreSQL's crash safety (``fsync``) on.

    Only TCP on the loopback address is served (no Unix socket), with trust
    authentication: a local developer's server, not a production database.
    ``stop`` is a fast shutdown (SIGINT to the postmaster's PID).
    """

    home: Path
    port: int = 5432
    host: str = "127.0.0.1"
    user: str = "postgres"
    run_as: str = "postgres"
    max_connections: int = 150
    #: Keep the data across stop/start (see the class docstring); False: a throwaway server.
    persistent: bool = False
    #: Where a persistent server's data lives as root when ``run_as`` cannot enter ``home``.
    shared_root: Path = Path("/var/lib/cdc-compaction/postgres")

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` database (see :meth:`url_for`)."""
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{database}"

    def dsn(self, database: str = "postgres") -> str:
        """libpq connection string, for ``psycopg2.connect``."""
        return f"host={self.host} port={self.port} user={self.user} dbname={database}"

    @property
    def pid_file(self) -> Path:
        return self.home / "postgres.pid"

    @property
    def log_file(self) -> Path:
        return self.home / "postgres.log"

    @property
    def _data_dir_file(self) -> Path:
        return self.home / "data-dir"

    def data_dir(self) -> Path | None:
        try:
            return Path(self._data_dir_file.read_text().strip())
        except OSError:
            return None

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def _as_user(self) -> dict[str, Any]:
        """Popen arguments that drop root to ``run_as`` (nothing when not root)."""
        if os.geteuid() != 0:
            return {}
        return {"user": self.run_as, "group": self.run_as, "extra_groups": []}

    def _shared_dir(self) -> Path:
        """This home's directory under :attr:`shared_root` (a persistent server's data, as root, when
        ``run_as`` cannot enter ``home``): named by a hash of the home's absolute path."""
        import hashlib

        return self.shared_root / hashlib.sha256(str(self.home.resolve()).encode()).hexdigest()[:16]

    def _kept_data_dir(self, data: Path) -> bool:
        """Whether ``data`` is where a persistent server keeps its data (not a throwaway /tmp one)."""
        return data.is_relative_to(self.home) or data.is_relative_to(self._shared_dir())

    def _new_data_dir(self) -> Path:
        if os.geteuid() != 0:
            data = self.home / "data"
            data.mkdir(parents=True, exist_ok=True)
            return data
        import pwd

        account = pwd.getpwnam(self.run_as)
        if not self.persistent:
            data = Path(tempfile.mkdtemp(prefix="cdc-pg-"))
            os.chown(data, account.pw_uid, account.pw_gid)
            return data
        if enterable(self.home, account.pw_uid, account_groups(account)):
            data = self.home / "data"
        else:
            # A directory above home shuts the postgres account out (a root-owned 0700 home or
            # /tmp/pytest-of-root): a root-owned place of our own instead, never one stop deletes.
            shared = self._shared_dir()
            shared.mkdir(parents=True, exist_ok=True, mode=0o755)
            (shared / "home").write_text(f"{self.home.resolve()}\n")
            data = shared / "data"
            if not enterable(shared, account.pw_uid, account_groups(account)):
                raise ServiceError(
                    f"the {self.run_as} account can enter neither {self.home} nor {shared} (a directory above "
                    f"each is closed to it): make one of them reachable (chmod o+x on the closed directory), "
                    "or run as a normal user"
                )
        if data.exists() and any(data.iterdir()):
            raise ServiceError(
                f"{data} is not empty but holds no PostgreSQL cluster (no PG_VERSION): move it aside or remove it, "
                "then start again"
            )
        data.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chown(data, account.pw_uid, account.pw_gid)
        return data

    def start(self, timeout_s: float = 60.0) -> int:
        """initdb a fresh cluster (once per home), start it, wait until it accepts connections; return its PID."""
        pid = self.pid()
        if pid is not None and port_open(self.host, self.port):
            return pid
        if port_open(self.host, self.port):
            raise ServiceError(f"port {self.port} is taken by another process; stop it or choose another port")
        bin_dir = require_postgres()
        self.home.mkdir(parents=True, exist_ok=True)
        data = self.data_dir()
        if self.persistent and data is not None and not self._kept_data_dir(data):
            data = None  # a throwaway one recorded by an older version (under /tmp): not kept, so not used
        env = {**os.environ, "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}
        if data is None or not (data / "PG_VERSION").exists():
            data = self._new_data_dir()
            self._data_dir_file.write_text(str(data))
            init = subprocess.run(
                [str(bin_dir / "initdb"), "-D", str(data), "-U", self.user, "--auth=trust", "-E", "UTF8", "--no-sync"],
                capture_output=True,
                text=True,
                check=False,
                cwd=data,
                env=env,
                **self._as_user(),
            )
            if init.returncode != 0:
                raise ServiceError(f"initdb failed (exit {init.returncode}): {init.stderr.strip()[-2000:]}")
            # Loopback TCP only, no password: the server lives as long as a test session or a demo.
            (data / "pg_hba.conf").write_text(
                "host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n"
            )
        settings_ = {
            "listen_addresses": self.host,
            "port": str(self.port),
            "unix_socket_directories": "",
            "wal_level": "logical",
            "max_replication_slots": "10",
            "max_wal_senders": "10",
            "max_connections": str(self.max_connections),
            "shared_buffers": "32MB",
            # Durability is worthless for a throwaway cluster: skip the fsyncs on a shared disk.  Not
            # synchronous_commit=off, though: logical decoding only sees WAL that was flushed.  A
            # persistent cluster keeps them: a crash of the machine must not corrupt what it keeps.
            "fsync": "on" if self.persistent else "off",
            "full_page_writes": "on" if self.persistent else "off",
            "timezone": "UTC",
            "log_timezone": "UTC",
        }
        cmd = [str(bin_dir / "postgres"), "-D", str(data)]
        for k, v in settings_.items():
            cmd += ["-c", f"{k}={v}"]
        with open(self.log_file, "ab") as logf:
            proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=data,
                env=env,
                start_new_session=True,
                **self._as_user(),
            )
        self.pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServiceError(f"postgres exited with code {proc.returncode}; see {self.log_file}")
            if port_open(self.host, self.port) and self._accepts():
                log.info("postgres %s:%d started (pid %d, data %s)", self.host, self.port, proc.pid, data)
                return proc.pid
            time.sleep(0.3)
        self.stop()
        raise ServiceError(f"postgres did not accept connections on {self.host}:{self.port}; see {self.log_file}")

    def _accepts(self) -> bool:
        import psycopg2

        try:
            psycopg2.connect(self.dsn(), connect_timeout=2).close()
        except psycopg2.OperationalError:  # still starting up ("the database system is starting up")
            return False
        return True

    def connect(self, database: str = "postgres") -> Any:
        """A psycopg2 connection (autocommit off) to ``database``."""
        import psycopg2

        return psycopg2.connect(self.dsn(database))

    def create_database(self, name: str) -> str:
        """CREATE DATABASE ``name`` (must not exist); return its SQLAlchemy URL."""
        from psycopg2 import sql as pgsql

        conn = self.connect()
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run inside a transaction block
            with conn.cursor() as cur:
                cur.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        finally:
            conn.close()
        return self.url_for(name)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Fast shutdown by PID (SIGINT: roll back open transactions, disconnect clients); True if it ran.

        A throwaway server's data directory that :meth:`start` put under /tmp (as root) is removed:
        nothing else knows of it.  A persistent server's data is kept.
        """
        pid = self.pid()
        if pid is not None:
            stop_pid(pid, timeout_s, sig=signal.SIGINT)
            log.info("postgres (pid %d) stopped", pid)
        self.pid_file.unlink(missing_ok=True)
        data = self.data_dir()
        if data is not None and not self.persistent and not data.is_relative_to(self.home):
            shutil.rmtree(data, ignore_errors=True)
            self._data_dir_file.unlink(missing_ok=True)
        return pid is not None

    def destroy(self) -> list[Path]:
        """Stop the server and delete its data (a reset: the next start initdbs an empty cluster).

        Only what this home owns: its ``data`` directory, and its directory under :attr:`shared_root`
        when that directory's ``home`` file names this home.  Returns what was deleted.
        """
        self.stop()
        gone = []
        own = self.home / "data"
        if own.exists():
            shutil.rmtree(own)
            gone.append(own)
        shared = self._shared_dir()
        try:
            owner = (shared / "home").read_text().strip()
        except OSError:
            owner = ""
        if owner == str(self.home.resolve()):
            shutil.rmtree(shared)
            gone.append(shared)
        self._data_dir_file.unlink(missing_ok=True)
        return gone
