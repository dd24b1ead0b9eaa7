"""The embedded default's services: a Thrift Hive metastore from the pyspark wheel.

Used by ``make demo``, ``make test`` and ``python -m cdc_compaction metastore
start|stop``.  The metastore keeps its Derby database under a project-local
directory, binds to 127.0.0.1 only, and is stopped by the PID it was started with.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cdc_compaction import settings
from cdc_compaction.exceptions import CdcCompactionError

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
</configuration>
"""


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


@dataclass
class LocalMetastore:
    """A Thrift Hive metastore backed by Derby under ``home``."""

    home: Path
    port: int = 9083
    host: str = "127.0.0.1"
    warehouse: Path | None = None

    @property
    def uri(self) -> str:
        return f"thrift://{self.host}:{self.port}"

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
        (conf / "hive-site.xml").write_text(_HIVE_SITE.format(db=self.home / "metastore_db", warehouse=warehouse))
        jars = f"{pyspark_home() / 'jars'}/*"
        classes = self._compile_launcher(jars)
        cmd = ["java", "-Xmx768m", "-Dderby.system.home=" + str(self.home), "-cp", f"{conf}:{jars}:{classes}"]
        cmd += ["LoopbackMetaStore", self.host, str(self.port)]
        with open(self.log_file, "ab") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True)
        self.pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServiceError(f"the metastore exited with code {proc.returncode}; see {self.log_file}")
            if port_open(self.host, self.port):
                log.info("metastore %s started (pid %d, home %s)", self.uri, proc.pid, self.home)
                return proc.pid
            time.sleep(0.5)
        self.stop()
        raise ServiceError(
            f"the metastore did not open {self.host}:{self.port} within {timeout_s:.0f}s; see {self.log_file}"
        )

    def stop(self, timeout_s: float = 20.0) -> bool:
        """Stop the service by its PID; True if one was running."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                break
            # Reap it if it is our child; ignore if it is not.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        log.info("metastore (pid %d) stopped", pid)
        return True
