"""A real Debezium source: PostgreSQL (``pgoutput``), Kafka in KRaft mode, Kafka Connect with Debezium.

:class:`DebeziumStack` starts, in a state directory of its own and on 127.0.0.1 only with free
ports,

* PostgreSQL with ``wal_level=logical`` (:class:`~cdc_compaction.devtools.local_services.LocalPostgres`:
  as root it runs as the ``postgres`` account);
* one Kafka 4.4 process that is broker and KRaft controller at once (``kafka.Kafka``), its storage
  formatted with a cluster id made for it;
* a Kafka Connect worker in **distributed** mode with the Debezium PostgreSQL connector on its
  ``plugin.path``.  Distributed, not standalone: it is what users run, and it keeps the connector's
  configuration and source offsets in Kafka topics, so a restarted worker picks the connector up
  again and resumes from its last committed offset on its own -- the restart the tests exercise;

then :meth:`DebeziumStack.register` creates a publication and registers the connector through
Connect's REST API (``plugin.name=pgoutput``, the ``JsonConverter`` with ``schemas.enable`` as asked)
and waits until the connector and its task are RUNNING.

Every JVM gets only the jars of its group of ``jars.lock`` (``make jars``: nothing is downloaded
here).  Each process leads a process group of its own; :meth:`DebeziumStack.stop` stops every group
it started by PID (SIGTERM, then SIGKILL), also after a failed start.  Logs are written under the
state directory (``kafka/kafka.log``, ``connect/connect.log``, ``postgres/postgres.log``); a start
that fails raises :class:`~cdc_compaction.devtools.local_services.ServiceError` with the last lines
of the component's log.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_compaction.devtools import jars
from cdc_compaction.devtools.local_services import (
    LocalPostgres,
    ServiceError,
    free_port,
    pid_alive,
    port_open,
    stop_group,
    tail,
)
from cdc_compaction.devtools.schema_registry import ApicurioRegistry, avro_converter_config, converter_plugin

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: Connect's name of the connector and the prefix of its topics (``<prefix>.<schema>.<table>``).
CONNECTOR = "cdc-postgres"
TOPIC_PREFIX = "cdc"
SLOT = "cdc_debezium"
PUBLICATION = "cdc_publication"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
#: What ``kafka.Kafka`` logs once its broker and controller serve (KafkaRaftServer).
KAFKA_STARTED = "Kafka Server started"

#: log4j2 for both JVMs: everything to standard output, which goes to the component's log file.
_LOG4J2 = """status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
"""

#: Small heaps and a quick-starting JIT: three JVMs share two cores with the tests.
_JVM_OPTIONS = ("-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")


def _properties(values: dict[str, Any]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


def kafka_cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's ``Uuid``).

    An id whose text starts with ``-`` (one draw in 64) is drawn again, as Kafka's own
    ``Uuid.randomUuid`` does: ``kafka-storage format -t -abc…`` reads the id as an option and fails
    with "argument --cluster-id/-t: expected one argument".
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(draw()).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def format_kafka_storage(classpath: str, config: Path, cluster_id: str) -> None:
    """Format the KRaft storage that ``config`` names, with ``cluster_id`` (``kafka-storage format``).

    Runs in ``config``'s directory and writes ``format.log`` there; a refusal raises
    :class:`~cdc_compaction.devtools.local_services.ServiceError` with the log's last lines.
    """
    home = config.parent
    fmt = subprocess.run(
        [
            *("java", *_JVM_OPTIONS, "-cp", classpath, "kafka.tools.StorageTool", "format"),
            # The ``=`` form: the id is the option's value whatever its first character.
            *(f"--cluster-id={cluster_id}", "-c", str(config), "--ignore-formatted"),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=home,
    )
    (home / "format.log").write_text(fmt.stdout + fmt.stderr)
    if fmt.returncode != 0:
        raise ServiceError(f"formatting Kafka's storage failed (exit {fmt.returncode}):\n{tail(home / 'format.log')}")


def connector_config(
    pg_host: str,
    pg_port: int,
    pg_user: str,
    database: str,
    tables: list[str],
    *,
    schemas_enable: bool = False,
    topic_prefix: str = TOPIC_PREFIX,
    slot: str = SLOT,
    registry_url: str | None = None,
) -> dict[str, str]:
    """The Debezium PostgreSQL connector's configuration that :meth:`DebeziumStack.register` sends.

    ``registry_url``: Apicurio's v2 API; the key and the value are then written by Apicurio's
    ``AvroConverter`` in the Confluent wire format, their schemas registered there
    (:func:`~cdc_compaction.devtools.schema_registry.avro_converter_config`), instead of the ``JsonConverter``.

    ``tables`` are ``schema.table`` names; the publication is made by :meth:`DebeziumStack.register`
    for exactly these tables (``publication.autocreate.mode=disabled``), the slot by the connector.
    The converters are set here, on the connector, so that ``schemas.enable`` is the connector's own.
    """
    schemas = "true" if schemas_enable else "false"
    if registry_url is not None:
        converters = {
            **avro_converter_config(registry_url, "key.converter"),
            **avro_converter_config(registry_url, "value.converter"),
        }
    else:
        converters = {
            "key.converter": JSON_CONVERTER,
            "key.converter.schemas.enable": schemas,
            "value.converter": JSON_CONVERTER,
            "value.converter.schemas.enable": schemas,
        }
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": pg_host,
        "database.port": str(pg_port),
        "database.user": pg_user,
        "database.dbname": database,
        "topic.prefix": topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": PUBLICATION,
        "publication.autocreate.mode": "disabled",
        "table.include.list": ",".join(tables),
        "snapshot.mode": "initial",
        # A delete is followed by a tombstone (a null value with the key), as Debezium does by default.
        "tombstones.on.delete": "true",
        **converters,
    }


def kafka_server_properties(data_dir: Path | str, kafka_port: int, controller_port: int) -> dict[str, Any]:
    """``server.properties`` of the one Kafka process: broker and KRaft controller, one replica of everything."""
    return {
        "process.roles": "broker,controller",
        "node.id": 1,
        "controller.quorum.voters": f"1@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{kafka_port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{kafka_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": data_dir,
        "num.partitions": 1,
        # One broker: every internal topic has one replica.
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 1,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        "group.initial.rebalance.delay.ms": 0,
        "auto.create.topics.enable": "true",
    }


def connect_worker_properties(
    bootstrap_servers: str, rest_port: int, plugins: Path | str, offset_flush_interval_ms: int = 1000
) -> dict[str, Any]:
    """``worker.properties`` of the distributed Connect worker; ``plugins`` holds Debezium's plugin directory.

    ``offset_flush_interval_ms``: how often the worker commits the connector's source offsets; a worker
    killed between two commits re-delivers, after its restart, what it sent since the last one.
    """
    return {
        "bootstrap.servers": bootstrap_servers,
        "group.id": "cdc-connect",
        "listeners": f"http://{HOST}:{rest_port}",
        "rest.advertised.host.name": HOST,
        "rest.advertised.port": rest_port,
        "plugin.path": plugins,
        # Debezium's and Kafka's jars all carry ServiceLoader manifests (Connect says so under the
        # default hybrid_warn): no reflective scan of every class, some 15 s less per start.
        "plugin.discovery": "service_load",
        "key.converter": JSON_CONVERTER,
        "value.converter": JSON_CONVERTER,
        # Connect keeps the connectors' configuration, status and source offsets in these topics.
        "config.storage.topic": "cdc-connect-configs",
        "offset.storage.topic": "cdc-connect-offsets",
        "status.storage.topic": "cdc-connect-status",
        "config.storage.replication.factor": 1,
        "offset.storage.replication.factor": 1,
        "status.storage.replication.factor": 1,
        "offset.storage.partitions": 1,
        "status.storage.partitions": 1,
        # Source offsets are committed every second by default: a restart re-delivers at most that much.
        "offset.flush.interval.ms": offset_flush_interval_ms,
        "scheduled.rebalance.max.delay.ms": 0,
    }


def topic_of(table: str, topic_prefix: str = TOPIC_PREFIX) -> str:
    """The topic the connector writes ``schema.table``'s changes to."""
    return f"{topic_prefix}.{table}"


@dataclass
class JavaService:
    """One JVM of the stack: its command, log and PID file in ``home``; a process group of its own."""

    name: str
    home: Path
    pid: int | None = None

    @property
    def log_file(self) -> Path:
        return self.home / f"{self.name}.log"

    @property
    def pid_file(self) -> Path:
        return self.home / f"{self.name}.pid"

    def start(self, classpath: str, main: str, *args: str) -> int:
        log4j = self.home / "log4j2.properties"
        log4j.write_text(_LOG4J2)
        cmd = ["java", *_JVM_OPTIONS, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath, main, *args]
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.home,
                start_new_session=True,
            )
        self.pid = proc.pid
        self.pid_file.write_text(str(proc.pid))
        log.info("%s started (pid %d), log %s", self.name, proc.pid, self.log_file)
        return proc.pid

    def alive(self) -> bool:
        return self.pid is not None and pid_alive(self.pid)

    def logged(self, text: str) -> bool:
        """True once this service's log holds ``text``."""
        try:
            return text in self.log_file.read_text(errors="replace")
        except OSError:
            return False

    def failed(self, what: str) -> ServiceError:
        """The error of a start that did not come up: what, and the last lines of the log."""
        return ServiceError(f"{self.name} {what}; the last lines of {self.log_file}:\n{tail(self.log_file)}")

    def kill(self) -> None:
        """SIGKILL to the process group this service leads (a crash: no shutdown hook runs)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        self.stop(timeout_s=10.0)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the process group this service leads (a clean shutdown), SIGKILL after ``timeout_s``."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        stop_group(pid, self.name, timeout_s)
        self.pid_file.unlink(missing_ok=True)
        log.info("%s (pid %d) stopped", self.name, pid)


@dataclass
class DebeziumStack:
    """PostgreSQL, a KRaft Kafka and a distributed Connect worker with Debezium, under ``home``."""

    home: Path
    database: str = "cdc"
    #: The JsonConverter's ``schemas.enable`` of the registered connector.
    schemas_enable: bool = False
    pg: LocalPostgres = field(init=False)
    kafka: JavaService = field(init=False)
    connect: JavaService = field(init=False)
    #: 0: a free port, chosen at start.
    kafka_port: int = 0
    controller_port: int = 0
    rest_port: int = 0
    #: The connectors :meth:`register` made, by name.
    connectors: list[str] = field(default_factory=list)
    #: The worker's ``offset.flush.interval.ms`` (a long one: a killed worker re-delivers much).
    offset_flush_interval_ms: int = 1000
    #: Also run a schema registry (Apicurio Registry, :mod:`cdc_compaction.devtools.schema_registry`) and give
    #: Connect Apicurio's ``AvroConverter``: :meth:`register` with ``avro_registry=True`` writes through them.
    schema_registry: bool = False
    registry: ApicurioRegistry | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.home = Path(self.home)
        self.pg = LocalPostgres(home=self.home / "postgres", port=free_port())
        self.kafka = JavaService("kafka", self.home / "kafka")
        self.connect = JavaService("connect", self.home / "connect")
        if self.schema_registry:
            self.registry = ApicurioRegistry(self.home / "registry")

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.kafka_port}"

    @property
    def rest_url(self) -> str:
        return f"http://{HOST}:{self.rest_port}"

    def pids(self) -> list[int]:
        """The PIDs of the processes this stack started and that still run (PostgreSQL's postmaster too)."""
        pids = [s.pid for s in (self.kafka, self.connect) if s.pid is not None and pid_alive(s.pid)]
        if self.registry is not None and self.registry.pid is not None and pid_alive(self.registry.pid):
            pids.append(self.registry.pid)
        pg = self.pg.pid()
        return [*pids, *([pg] if pg is not None else [])]

    # -- start ---------------------------------------------------------------------------------

    def start(self, timeout_s: float = 180.0) -> DebeziumStack:
        """Start PostgreSQL, Kafka and Connect (in that order); on any failure stop what started, and raise."""
        # Fail before starting anything when the jars are not there.
        kafka_cp = jars.classpath("kafka")
        connect_cp = jars.classpath("connect")
        plugin_dir = jars.group_dir("debezium")
        try:
            if self.registry is not None:
                # Its JVM starts first and comes up (some 15 s) while PostgreSQL, Kafka and Connect start.
                self.registry.launch()
            self.pg.start()
            with contextlib.closing(self.pg.connect()) as conn:
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute(f'CREATE DATABASE "{self.database}"')
            self._start_kafka(kafka_cp, timeout_s)
            self._start_connect(connect_cp, plugin_dir, timeout_s)
            if self.registry is not None:
                self.registry.wait(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_kafka(self, classpath: str, timeout_s: float) -> None:
        home = self.kafka.home
        home.mkdir(parents=True, exist_ok=True)
        self.kafka_port = self.kafka_port or free_port()
        self.controller_port = self.controller_port or free_port()
        config = home / "server.properties"
        config.write_text(_properties(kafka_server_properties(home / "data", self.kafka_port, self.controller_port)))
        format_kafka_storage(classpath, config, kafka_cluster_id())
        self.kafka.start(classpath, "kafka.Kafka", str(config))
        deadline = time.monotonic() + timeout_s
        # Ready when our process says so: an open port alone may be another process's (a port taken
        # between free_port() and the bind), and Kafka logs the bind failure before it shuts down.
        while not (self.kafka.logged(KAFKA_STARTED) and port_open(HOST, self.kafka_port)):
            if not self.kafka.alive():
                raise self.kafka.failed("exited during start")
            if time.monotonic() > deadline:
                raise self.kafka.failed(f"did not listen on {HOST}:{self.kafka_port} within {timeout_s:.0f}s")
            time.sleep(0.3)

    def _start_connect(self, classpath: str, plugin_dir: Path, timeout_s: float) -> None:
        home = self.connect.home
        home.mkdir(parents=True, exist_ok=True)
        # plugin.path lists directories whose subdirectories are plugins: one holding only Debezium's.
        plugins = home / "plugins"
        plugins.mkdir(exist_ok=True)
        link = plugins / "debezium-connector-postgres"
        if not link.is_symlink():
            link.symlink_to(plugin_dir, target_is_directory=True)
        if self.registry is not None:
            converter_plugin(plugins / "apicurio-converter")
        if not self.rest_port:
            self.rest_port = free_port()
        config = home / "worker.properties"
        config.write_text(
            _properties(
                connect_worker_properties(
                    self.bootstrap_servers, self.rest_port, plugins, self.offset_flush_interval_ms
                )
            )
        )
        self.connect.start(classpath, "org.apache.kafka.connect.cli.ConnectDistributed", str(config))
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.connect.alive():
                raise self.connect.failed("exited during start")
            with contextlib.suppress(OSError, ValueError):
                plugins_seen = self._get("/connector-plugins")
                if any(p.get("class", "").endswith("PostgresConnector") for p in plugins_seen):
                    return
                raise self.connect.failed(f"does not list Debezium's PostgresConnector among {plugins_seen}")
            if time.monotonic() > deadline:
                raise self.connect.failed(f"did not answer on {self.rest_url} within {timeout_s:.0f}s")
            time.sleep(0.5)

    # -- the connector ---------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.rest_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # our own worker, on 127.0.0.1
            payload = resp.read()
        return json.loads(payload) if payload else None

    def _get(self, path: str) -> Any:
        return self._request("GET", path)

    def register(
        self,
        tables: list[str],
        timeout_s: float = 120.0,
        *,
        name: str = CONNECTOR,
        topic_prefix: str = TOPIC_PREFIX,
        slot: str = SLOT,
        schemas_enable: bool | None = None,
        avro_registry: bool = False,
    ) -> dict[str, str]:
        """Create the publication for ``tables`` (``schema.table``), register the connector, wait until RUNNING.

        Returns the connector's configuration as sent.  The tables must exist.  A second connector
        (another ``name``, ``topic_prefix`` and ``slot``) reads the same tables into topics of its own,
        e.g. with the other ``schemas_enable`` (default: the stack's).  ``avro_registry``: Apicurio's
        ``AvroConverter`` for key and value, registering in the stack's registry (``schema_registry=True``).
        """
        if avro_registry and self.registry is None:
            raise ServiceError(
                f"connector {name}: avro_registry needs the stack's schema registry: make the DebeziumStack with "
                "schema_registry=True"
            )
        with contextlib.closing(self.pg.connect(self.database)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,))
                if cur.fetchone() is None:
                    names = ", ".join(".".join(f'"{p}"' for p in t.split(".", 1)) for t in tables)
                    cur.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {names}")
        config = connector_config(
            self.pg.host,
            self.pg.port,
            self.pg.user,
            self.database,
            tables,
            schemas_enable=self.schemas_enable if schemas_enable is None else schemas_enable,
            topic_prefix=topic_prefix,
            slot=slot,
            registry_url=self.registry.v2_url if avro_registry and self.registry is not None else None,
        )
        try:
            self._request("PUT", f"/connectors/{name}/config", config)
        except urllib.error.HTTPError as exc:
            raise ServiceError(
                f"Connect refused the connector {name}: {exc.code} {exc.read().decode(errors='replace')}"
            ) from exc
        if name not in self.connectors:
            self.connectors.append(name)
        self.wait_running(timeout_s, name)
        return config

    def status(self, name: str = CONNECTOR) -> dict[str, Any]:
        return dict(self._get(f"/connectors/{name}/status"))

    def wait_running(self, timeout_s: float = 120.0, name: str = CONNECTOR) -> None:
        """Wait until the connector and each of its tasks is RUNNING; a FAILED one raises with its trace."""
        deadline = time.monotonic() + timeout_s
        state: Any = None
        while time.monotonic() < deadline:
            if not self.connect.alive():
                raise self.connect.failed("exited while the connector started")
            try:
                state = self.status(name)
            except (OSError, ValueError):  # 404 until the worker has read the config topic
                time.sleep(0.5)
                continue
            states = [state["connector"]["state"], *(t["state"] for t in state.get("tasks", []))]
            if "FAILED" in states:
                traces = [state["connector"].get("trace"), *(t.get("trace") for t in state.get("tasks", []))]
                raise self.connect.failed(f"connector {name} FAILED: {[t for t in traces if t]}")
            if state.get("tasks") and all(s == "RUNNING" for s in states):
                return
            time.sleep(0.5)
        raise self.connect.failed(f"connector {name} was not RUNNING within {timeout_s:.0f}s: {state}")

    def restart_connect(self, timeout_s: float = 180.0, *, kill: bool = False) -> None:
        """Stop the Connect worker and start it again; it resumes from its committed offsets.

        ``kill``: SIGKILL instead of a clean shutdown (a crashed worker): nothing is flushed, so what it
        sent since its last offset commit comes again, re-published under new Kafka offsets.
        """
        if kill:
            self.connect.kill()
        else:
            self.connect.stop()
        try:
            self._start_connect(jars.classpath("connect"), jars.group_dir("debezium"), timeout_s)
            for name in self.connectors:
                self.wait_running(timeout_s, name)
        except BaseException:
            self.stop()
            raise

    # -- stop ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop Connect, Kafka, the registry, then PostgreSQL, each by the PID it started with; never raises for one."""
        services: list[Any] = [self.connect, self.kafka, *([self.registry] if self.registry is not None else [])]
        for service in services:
            try:
                service.stop()
            except Exception:  # the others must still be stopped
                log.exception("stopping %s failed", service)
        self.pg.stop()

    def __enter__(self) -> DebeziumStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
