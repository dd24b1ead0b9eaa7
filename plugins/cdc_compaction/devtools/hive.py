"""A local HiveServer2: Hive's own query engine, for running the project's Hive views as a Hive user does.

:class:`HiveServer` runs the Hive of ``jars.lock``'s ``hive4`` group (``make jars`` fetches it: nothing
is downloaded here): one HiveServer2 JVM bound to 127.0.0.1 on a free port, with

* its own embedded metastore on Derby under ``home`` (``datanucleus.schema.autoCreateAll``): the
  tables a reader creates there are the server's, gone with its home, never rows in the project's
  metastore;
* MapReduce in the same JVM (``hive.execution.engine=mr``, ``mapreduce.framework.name=local``): Hive 4
  deprecates MapReduce for Tez, but runs it, and it needs no cluster;
* no query results cache and no statistics answering a query: every query reads the files as they are now.

Hive 4.0.1 is the newest Hive whose HiveServer2 (``hive-service``) is on Maven Central; it runs on Java 17
with the ``--add-opens`` of :data:`ADD_OPENS` (Kryo serializes the plan of each MapReduce job by reflection).
:meth:`HiveServer.query` runs one statement through HiveServer2's Thrift protocol (pyhive, no SASL) and
returns the rows as Python values; :meth:`HiveServer.stop` stops the process group it started, by PID.
:meth:`HiveServer.mirror` registers a table of another metastore (the project's) in this one, as an external
Parquet table over the same files and partitions.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from xml.sax.saxutils import escape

from cdc_compaction.devtools import jars
from cdc_compaction.devtools.local_services import (
    GroupLeader,
    ServiceError,
    free_port,
    port_open,
    require_java17,
)

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: jars.lock's group: HiveServer2 4.0.1, hive-exec, Hadoop 3.3.6's client and MapReduce jars.
GROUP = "hive4"
USER = "cdc"
#: What Hive 4.0 (built for Java 8) reaches into on Java 17: Kryo and Hive's own reflection on the JDK's classes.
ADD_OPENS = tuple(
    f"--add-opens=java.base/{package}=ALL-UNNAMED"
    for package in (
        "java.lang",
        "java.lang.invoke",
        "java.lang.reflect",
        "java.io",
        "java.net",
        "java.nio",
        "java.util",
        "java.util.concurrent",
        "java.util.concurrent.atomic",
        "java.util.regex",
        "java.text",
        "java.time",
        "java.security",
        "sun.nio.ch",
        "sun.nio.cs",
        "sun.security.action",
        "sun.util.calendar",
    )
)


class HiveQueryError(ServiceError):
    """HiveServer2 refused or failed a statement: its message."""


def _site(values: dict[str, Any]) -> str:
    props = "".join(
        f"  <property><name>{escape(k)}</name><value>{escape(str(v))}</value></property>\n" for k, v in values.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{props}</configuration>\n'


@dataclass
class HiveServer(GroupLeader):
    """One HiveServer2 with an embedded Derby metastore under ``home``, bound to 127.0.0.1; see the module."""

    service: ClassVar[str] = "HiveServer2"

    home: Path
    port: int = 0
    host: str = HOST
    heap: str = "1g"
    pid: int | None = None
    _conn: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.port:
            self.port = free_port(self.host)

    @property
    def log_file(self) -> Path:
        return self.home / "hiveserver2.log"

    @property
    def pid_file(self) -> Path:
        return self.home / "hiveserver2.pid"

    def configuration(self) -> dict[str, Any]:
        """hive-site.xml: loopback only, no login, the embedded metastore, MapReduce in-process, nothing cached."""
        h = self.home
        return {
            "hive.server2.thrift.bind.host": self.host,
            "hive.server2.thrift.port": self.port,
            "hive.server2.authentication": "NOSASL",
            "hive.server2.enable.doAs": "false",
            "hive.server2.webui.port": 0,  # no web UI
            "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={h / 'metastore_db'};create=true",
            "datanucleus.schema.autoCreateAll": "true",
            "hive.metastore.schema.verification": "false",
            "hive.metastore.warehouse.dir": h / "warehouse",
            "hive.metastore.event.db.notification.api.auth": "false",
            "hive.exec.scratchdir": h / "scratch",
            "hive.exec.local.scratchdir": h / "local-scratch",
            "hive.downloaded.resources.dir": h / "resources",
            "hive.querylog.location": h / "querylog",
            "hive.server2.logging.operation.log.location": h / "operation-logs",
            "mapreduce.cluster.local.dir": h / "mapreduce",
            "hadoop.tmp.dir": h / "hadoop-tmp",
            "hive.execution.engine": "mr",
            "mapreduce.framework.name": "local",
            "hive.support.concurrency": "false",
            "hive.txn.manager": "org.apache.hadoop.hive.ql.lockmgr.DummyTxnManager",
            # Every read sees the files as they are now: a compaction swaps the base's location between reads.
            "hive.query.results.cache.enabled": "false",
            "hive.stats.autogather": "false",
            "hive.compute.query.using.stats": "false",
            "hive.local.time.zone": "UTC",
            # Result columns named as the query names them (not "<view>.<column>").
            "hive.resultset.use.unique.column.names": "false",
            "hive.server2.materializedviews.registry.impl": "DUMMY",
            "hive.scheduled.queries.executor.enabled": "false",
        }

    def command(self, classpath: str) -> list[str]:
        return [
            "java",
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-Duser.timezone=UTC",
            f"-Dderby.system.home={self.home}",
            f"-Dhive.log.dir={self.home}",
            *ADD_OPENS,
            "-cp",
            classpath,
            "org.apache.hive.service.server.HiveServer2",
        ]

    def start(self, timeout_s: float = 240.0) -> int:
        """Start HiveServer2 and wait until it answers a query; on failure stop it and raise with its log's tail."""
        directory = jars.group_dir(GROUP)
        require_java17()
        self.home.mkdir(parents=True, exist_ok=True)
        conf = self.home / "conf"
        conf.mkdir(exist_ok=True)
        (conf / "hive-site.xml").write_text(_site(self.configuration()))
        classpath = f"{conf}{os.pathsep}{directory}/*"
        proc = self.launch(self.command(classpath), self.home)
        pid = self.wait_ready(proc, self._answers, timeout_s, waiting_for=f"answer on {self.host}:{self.port}")
        log.info("HiveServer2 %s:%d started (pid %d, home %s)", self.host, self.port, pid, self.home)
        return pid

    def _answers(self) -> bool:
        """The port is open and a query runs (HiveServer2 opens its port before its metastore is ready)."""
        if not port_open(self.host, self.port):
            return False
        try:
            self.query("SELECT 1")
        except HiveQueryError as exc:  # still opening its metastore
            log.debug("HiveServer2 not ready yet: %s", exc)
            self._close()
            return False
        return True

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def stop(self, timeout_s: float = 30.0) -> None:
        """Close the client's connection, then stop the server's process group by its PID."""
        self._close()
        super().stop(timeout_s)

    # ------------------------------------------------------------- the client
    def _cursor(self) -> Any:
        from pyhive import hive

        if self._conn is None:
            self._conn = hive.connect(host=self.host, port=self.port, auth="NOSASL", username=USER)
        return self._conn.cursor()

    def query(self, statement: str) -> list[dict[str, Any]]:
        """Run ``statement``; its rows as dicts (none for DDL). A failure raises :class:`HiveQueryError`.

        pyhive gives timestamps as naive datetimes (Hive's session zone is UTC), decimals as Decimal,
        dates as ``YYYY-MM-DD`` strings.
        """
        cur = None
        try:
            cur = self._cursor()
            cur.execute(statement)
            if cur.description is None:
                return []
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        except Exception as exc:  # pyhive's and Thrift's errors alike: one error naming the statement
            message = getattr(getattr(getattr(exc, "args", [None])[0], "status", None), "errorMessage", None)
            raise HiveQueryError(f"Hive failed {statement[:2000]!r}: {message or exc}") from exc
        finally:
            if cur is not None:
                with contextlib.suppress(Exception):
                    cur.close()

    def mirror(self, table: Any, partitions: dict[str, str]) -> None:
        """Register ``table`` (a Thrift table of another metastore) here as an external Parquet table over the
        same location, with ``partitions`` (value -> location) of its one partition column; an older one of
        that name is dropped first (an external table: its files stay)."""
        db, name = table.dbName, table.tableName
        cols = ", ".join(f"`{c.name}` {c.type}" for c in table.sd.cols)
        keys = list(table.partitionKeys or [])
        self.query(f"CREATE DATABASE IF NOT EXISTS `{db}`")
        self.query(f"DROP TABLE IF EXISTS `{db}`.`{name}`")
        by = f" PARTITIONED BY ({', '.join(f'`{k.name}` {k.type}' for k in keys)})" if keys else ""
        self.query(
            f"CREATE EXTERNAL TABLE `{db}`.`{name}` ({cols}){by} STORED AS PARQUET LOCATION '{table.sd.location}'"
        )
        if keys and partitions:
            (key,) = keys
            specs = " ".join(
                f"PARTITION (`{key.name}` = '{value}') LOCATION '{location}'"
                for value, location in sorted(partitions.items())
            )
            self.query(f"ALTER TABLE `{db}`.`{name}` ADD {specs}")
