"""A schema registry that runs here: Apicurio Registry 3.3.3 from Maven Central, on 127.0.0.1, in memory.

:class:`ApicurioRegistry` starts the registry of ``jars.lock``'s ``apicurio-registry`` group (a
Quarkus fast-jar, unpacked by ``make jars``: nothing is downloaded here) on a Java 21 or newer
(:func:`~cdc_compaction.devtools.trino.find_java`; the rest of the stack runs on 17), with H2 in
memory as its storage, and stops it by PID.  It serves

* Apicurio's own API, ``/apis/registry/v2``, that Apicurio's Kafka Connect ``AvroConverter``
  (2.6.13.Final, ``apicurio-converter`` group) registers its schemas through
  (:func:`avro_converter_config`), and
* the Confluent-compatible API, ``/apis/ccompat/v7`` (:attr:`ApicurioRegistry.ccompat_url`), that the
  landing consumer reads writer schemas from by id and ``registry discover`` reads subjects from.

Ids: with ``apicurio.registry.use-id=contentId`` the converter writes Apicurio's *content id* into
the wire format, and ccompat's ``/schemas/ids/<id>`` in 3.3.3 takes content ids (its default, not the
legacy global-id mode): one id, both APIs.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cdc_compaction.devtools import jars
from cdc_compaction.devtools.local_services import ServiceError, free_port, stop_group, tail
from cdc_compaction.devtools.trino import find_java

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
VERSION = "3.3.3"
#: Quarkus 3 on Java 21: the registry's minimum.
MIN_JAVA = 21
GROUP = "apicurio-registry"
#: The Connect plugin of the converter (jars.lock group) and its class.
CONVERTER_GROUP = "apicurio-converter"
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
CONVERTER_VERSION = "2.6.13.Final"


def converter_plugin(dest: Path) -> Path:
    """A Connect plugin directory ``dest`` of Apicurio's converter: its jars (linked from the cache) and a manifest.

    The converter's jar carries no ``META-INF/services`` entry for Connect's ``Converter``, and the stack's worker
    finds plugins by ServiceLoader alone (``plugin.discovery=service_load``, some 15 s faster than a scan), so a
    jar of that one entry, naming :data:`AVRO_CONVERTER`, is written beside them.
    """
    import zipfile

    source = jars.group_dir(CONVERTER_GROUP)
    dest.mkdir(parents=True, exist_ok=True)
    for jar in sorted(source.glob("*.jar")):
        link = dest / jar.name
        if not link.is_symlink():
            link.symlink_to(jar)
    with zipfile.ZipFile(dest / "cdc-converter-services.jar", "w") as z:
        z.writestr("META-INF/services/org.apache.kafka.connect.storage.Converter", AVRO_CONVERTER + "\n")
    return dest


def avro_converter_config(registry_v2_url: str, prefix: str) -> dict[str, str]:
    """The connector settings of Apicurio's ``AvroConverter`` as ``prefix`` (``key.converter``/``value.converter``).

    Confluent's wire format (``as-confluent``: a 4-byte id, no Kafka headers), the content id as that id
    (what ccompat's ``/schemas/ids/<id>`` takes), each new schema registered as it comes (``auto-register``).
    """
    return {
        prefix: AVRO_CONVERTER,
        f"{prefix}.apicurio.registry.url": registry_v2_url,
        f"{prefix}.apicurio.registry.auto-register": "true",
        f"{prefix}.apicurio.registry.find-latest": "true",
        f"{prefix}.apicurio.registry.as-confluent": "true",
        f"{prefix}.apicurio.registry.use-id": "contentId",
        f"{prefix}.apicurio.registry.headers.enabled": "false",
    }


@dataclass
class ApicurioRegistry:
    """Apicurio Registry under ``home`` (its log and PID file), on ``127.0.0.1:port`` (0: a free one)."""

    home: Path
    port: int = 0
    #: Quarkus's management interface (health, metrics): 0.0.0.0:9000 unless told, which a second
    #: registry on the machine (another test worker, a leftover) finds taken and exits on.
    management_port: int = 0
    pid: int | None = None
    heap: str = "256m"
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _java: Path | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.home = Path(self.home)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def v2_url(self) -> str:
        """Apicurio's own API, which its converters use."""
        return f"{self.url}/apis/registry/v2"

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API."""
        return f"{self.url}/apis/ccompat/v7"

    @property
    def log_file(self) -> Path:
        return self.home / "registry.log"

    @property
    def pid_file(self) -> Path:
        return self.home / "registry.pid"

    def command(self, java: Path) -> list[str]:
        return [
            str(java),
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            f"-Dquarkus.http.host={HOST}",
            f"-Dquarkus.http.port={self.port}",
            f"-Dquarkus.management.host={HOST}",
            f"-Dquarkus.management.port={self.management_port}",
            "-Dapicurio.storage.kind=sql",
            "-Dapicurio.storage.sql.kind=h2",
            "-jar",
            "quarkus-run.jar",
        ]

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.ccompat_url}/subjects", timeout=2) as resp:  # our own, 127.0.0.1
                json.loads(resp.read())
            return True
        except (OSError, ValueError):
            return False

    def start(self, timeout_s: float = 120.0) -> ApicurioRegistry:
        """Start the registry and wait until its Confluent API answers; on failure stop it and raise with its log."""
        self.launch()
        self.wait(timeout_s)
        return self

    def launch(self) -> int:
        """Start the registry's JVM and return at once (:meth:`wait` waits for it: other JVMs can start meanwhile)."""
        server = jars.group_dir(GROUP)
        if not (server / "quarkus-run.jar").is_file():
            raise ServiceError(
                f"{server} holds no quarkus-run.jar: the {GROUP} group of jars.lock is not unpacked; run `make jars`"
            )
        self._java = find_java(MIN_JAVA, who=f"Apicurio Registry {VERSION}")
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.management_port = self.management_port or free_port()
        with open(self.log_file, "ab") as out:
            self._proc = subprocess.Popen(
                self.command(self._java),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=server,  # a Quarkus fast-jar finds lib/ and app/ beside quarkus-run.jar
                start_new_session=True,
            )
        self.pid = self._proc.pid
        self.pid_file.write_text(str(self.pid))
        return self.pid

    def wait(self, timeout_s: float = 120.0) -> None:
        """Wait until the launched registry's Confluent API answers; if it exits or stays silent, stop it and raise."""
        proc = self._proc
        if proc is None:
            raise ServiceError("Apicurio Registry was not launched: call launch() (or start()) first")
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if proc.poll() is not None:
                self.pid = None
                raise ServiceError(
                    f"Apicurio Registry ({self._java}) exited with code {proc.returncode} while starting; the last "
                    f"lines of {self.log_file}:\n{tail(self.log_file)}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceError(
                    f"Apicurio Registry did not answer on {self.ccompat_url} within {timeout_s:.0f}s; the last lines "
                    f"of {self.log_file}:\n{tail(self.log_file)}"
                )
            time.sleep(0.5)
        log.info("Apicurio Registry %s started (pid %d)", self.url, proc.pid)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the process group it leads, SIGKILL after ``timeout_s``; nothing if it is not running."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        stop_group(pid, "Apicurio Registry", timeout_s)
        self.pid_file.unlink(missing_ok=True)
        log.info("Apicurio Registry (pid %d) stopped", pid)

    def __enter__(self) -> ApicurioRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
