"""BI clients over JDBC: Spark's Thrift server answers with the rows the project's own readers see.

Shared conformance scenarios build real tables through the in-process pipeline (the task
functions in order, the session's SparkSession and Thrift metastore).  Spark's Thrift
JDBC/ODBC server from the pyspark wheel (:class:`SparkThriftServer`) runs in its own JVM
against the same metastore, and the wheel's real ``beeline`` queries it.  At every
checkpoint -- an increment pending over a compacted base, and after each compaction --
``<t>_view`` over JDBC must equal the scenario's expected rows and what the in-process
session reads from the same view, and ``<t>_base`` over JDBC must equal, row for row and
column for column, what the in-process session reads from it, with the compaction's
visible rows.  A connection opened before a compaction must read the new version after it.
``serve-sql`` (``make serve-sql``) must start a metastore and the server, print the JDBC
URL and stop both on Ctrl-C.  The server is stopped by its PID, and the PID must be gone.
A unit test checks the server's command line without starting a JVM.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_compaction.core import sql
from cdc_compaction.core.registry import TableConfig, parse_table
from cdc_compaction.core.settings import PROJECT_ROOT, MetastoreEndpoint
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools.local_services import (
    THRIFT_SERVER_CLASS,
    LocalMetastore,
    ServiceError,
    SparkThriftServer,
    free_port,
    pid_alive,
    port_open,
    pyspark_home,
)
from cdc_compaction.pipeline.views import refresh_view

SHARED_CONFORMANCE = PROJECT_ROOT.parent / "shared" / "conformance"
#: An increment pending over a compacted base: the view shows an update and a re-insert the base does not have
#: yet; then a tombstone in the base that a late, older update must not get past.
SCENARIOS = ["delete_then_reinsert", "late_update_for_deleted_key"]
#: beeline prints its prompt before the first result of ``-e`` and echoes statements read from stdin.
PROMPT = re.compile(r"^\d+: jdbc:hive2://\S*> ")


# ---------------------------------------------------------------- no JVM: the command line
def test_command_line_starts_the_thrift_server_on_loopback_without_auth(tmp_path: Path) -> None:
    server = SparkThriftServer(
        tmp_path, "thrift://127.0.0.1:9999", "/lake/warehouse", port=12345, extra_conf={"spark.sql.x": "1"}
    )
    cmd = server.command()
    assert cmd[0] == str(pyspark_home() / "bin" / "spark-submit")
    assert cmd[cmd.index("--class") + 1] == THRIFT_SERVER_CLASS
    assert cmd[cmd.index("--master") + 1] == "local[*]"
    split = cmd.index("spark-internal")
    conf_ = dict(cmd[i + 1].split("=", 1) for i in range(split) if cmd[i] == "--conf")
    hive = dict(cmd[i + 1].split("=", 1) for i in range(split, len(cmd)) if cmd[i] == "--hiveconf")
    assert "--conf" not in cmd[split:] and "--hiveconf" not in cmd[:split]
    # The catalog and the session settings of the project's own sessions (engine.local_session).
    assert conf_["spark.sql.catalogImplementation"] == "hive"
    assert conf_["spark.hadoop.hive.metastore.uris"] == "thrift://127.0.0.1:9999"
    assert conf_["spark.sql.warehouse.dir"] == "/lake/warehouse"
    assert conf_["spark.sql.session.timeZone"] == "UTC"
    assert conf_["spark.sql.variable.substitute"] == "false"
    assert conf_["spark.ui.enabled"] == "false"
    assert conf_["spark.driver.bindAddress"] == conf_["spark.driver.host"] == "127.0.0.1"
    assert conf_["spark.sql.x"] == "1"
    assert hive == {
        "hive.server2.thrift.bind.host": "127.0.0.1",
        "hive.server2.thrift.port": "12345",
        "hive.server2.transport.mode": "binary",
        "hive.server2.authentication": "NONE",
        "hive.server2.enable.doAs": "false",
        "hive.server2.logging.operation.log.location": str(tmp_path / "operation_logs"),
        "hive.metastore.uris": "thrift://127.0.0.1:9999",
    }
    assert server.jdbc_url == "jdbc:hive2://127.0.0.1:12345/default"
    assert not (tmp_path / "thriftserver.pid").exists(), "building the command starts nothing"


def test_a_glue_catalog_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match=r"needs a Hive metastore's thrift:// URI.*cluster's own Spark Thrift"):
        SparkThriftServer(tmp_path, "glue://default", "/w").command()


# ---------------------------------------------------------------------- the real server
def _listening_addresses(pid: int) -> set[str]:
    """``host:port`` of every TCP socket ``pid`` listens on (from /proc: no ss or netstat needed)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            addr, port = fields[1].split(":")
            raw = bytes.fromhex(addr)
            # /proc prints each 32-bit word of the address in host (little-endian) order.
            packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = socket.inet_ntop(family, packed).removeprefix("::ffff:")  # an IPv4-mapped IPv6 socket
            found.add(f"{ip}:{int(port, 16)}")
    return found


@pytest.fixture(scope="module")
def thrift_server(metastore: LocalMetastore, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkThriftServer]:
    server = SparkThriftServer(
        tmp_path_factory.mktemp("thrift-server"),
        metastore.uri,
        str(metastore.home / "warehouse"),
        port=free_port(),
        master="local[2]",
        driver_memory="768m",
    )
    # The server's JVM runs in another time zone: its SQL sessions must still be in UTC.
    tz = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    try:
        pid = server.start()
    finally:
        if tz is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = tz
    try:
        yield server
    finally:
        assert server.pid() == pid, "the server still runs under the PID it was started with"
        assert server.stop() is True
        assert not pid_alive(pid), f"the Thrift server (pid {pid}) is still running after stop()"
        assert not port_open(server.host, server.port)
        assert server.stop() is False


def _beeline_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SPARK_HOME", None)  # the wheel's own bin/beeline finds its home
    return env


def _csv2(lines: list[str]) -> list[dict[str, str | None]]:
    """beeline's csv2 output (header, then rows) as dicts; ``NULL`` is None."""
    lines = [line for line in lines if line.strip()]
    if not lines:
        return []
    header, *rows = csv.reader(lines)
    return [{k: None if v == "NULL" else v for k, v in zip(header, row, strict=True)} for row in rows]


def beeline(server: SparkThriftServer, query: str) -> list[dict[str, str | None]]:
    """One query through a new connection of the wheel's real ``beeline``."""
    proc = subprocess.run(
        [
            str(pyspark_home() / "bin" / "beeline"),
            *("-u", server.jdbc_url, "-n", "user", "--outputformat=csv2", "--silent=true", "-e", query),
        ],
        capture_output=True,
        text=True,
        env=_beeline_env(),
        stdin=subprocess.DEVNULL,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"beeline failed (exit {proc.returncode}) on {query}:\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    if lines:
        lines[0] = PROMPT.sub("", lines[0])
    return _csv2(lines)


def _sorted(rows: list[dict[str, str | None]]) -> list[tuple[tuple[str, str | None], ...]]:
    return sorted(tuple(sorted(r.items(), key=lambda kv: kv[0])) for r in rows)


class Checker:
    """Compares what beeline reads from a table's view and base with the expectations and with Spark.

    Both sides run the same query, every column cast to a string by Spark SQL (in the session
    time zone, UTC, on both), so any column type compares exactly -- the base's bookkeeping
    columns included, whatever they are.
    """

    def __init__(self, server: SparkThriftServer, spark: Any, cfg: TableConfig) -> None:
        self.server, self.spark, self.cfg = server, spark, cfg
        self.names = sql.table_names(cfg)
        self.view = f"`{cfg.database}`.`{self.names['view_name']}`"
        self.base = f"`{cfg.database}`.`{self.names['base_table']}`"
        self.types = {c.name: c.type for c in cfg.columns if c.name != cfg.op_column}

    def _in_process(self, query: str) -> list[dict[str, str | None]]:
        for t in ("base_table", "tombstones_table", "incremental_table"):  # this session caches table locations
            self.spark.catalog.refreshTable(f"`{self.cfg.database}`.`{self.names[t]}`")
        return [r.asDict() for r in self.spark.sql(query).collect()]

    def _as_text(self, table: str, extra: str = "") -> str:
        cols = ", ".join(f"CAST(`{c}` AS STRING) AS `{c}`" for c in self.spark.table(table).columns)
        return f"SELECT {cols}{extra} FROM {table}"

    def _differ(self, expected: list[dict[str, Any]], rows: list[dict[str, str | None]]) -> list[str]:
        return conf.diff_rows(expected, [{k: r[k] for k in self.types} for r in rows], self.types)

    def view_rows(self, expected: list[dict[str, Any]], where: str) -> None:
        order = ", ".join(f"`{c}`" for c in self.cfg.column_names)
        query = f"{self._as_text(self.view)} ORDER BY {order}"
        jdbc = beeline(self.server, query)
        assert _sorted(jdbc) == _sorted(self._in_process(query)), f"{where}: JDBC and in-process views differ"
        diff = self._differ(expected, jdbc)
        assert not diff, f"{where}: the view over JDBC differs from the scenario\n" + "\n".join(diff)

    def base_rows(self, expected_visible: list[dict[str, Any]], where: str) -> None:
        """Every row and column of the base (tombstones too, while it keeps them), and which are visible."""
        visible = f", CAST(NOT ({sql.rule_sql(self.cfg).is_delete}) AS STRING) AS `cdc_visible`"
        query = self._as_text(self.base, visible)
        jdbc = beeline(self.server, query)
        assert _sorted(jdbc) == _sorted(self._in_process(query)), f"{where}: JDBC and in-process bases differ"
        diff = self._differ(expected_visible, [r for r in jdbc if r["cdc_visible"] == "true"])
        assert not diff, f"{where}: the base's visible rows over JDBC differ from the compaction's\n" + "\n".join(diff)


@pytest.mark.spark
@pytest.mark.metastore
@pytest.mark.parametrize("name", [SCENARIOS[0], *(pytest.param(n, marks=pytest.mark.extended) for n in SCENARIOS[1:])])
def test_beeline_reads_the_view_and_the_base_the_pipeline_built(
    name: str, thrift_server: SparkThriftServer, spark: Any, endpoint: MetastoreEndpoint, tmp_path: Path
) -> None:
    scn = conf.Scenario.load(SHARED_CONFORMANCE / f"{name}.json")
    runner = conf.InProcessRunner(spark, endpoint)
    cfg = parse_table(conf.registry_doc(scn, tmp_path / "lake", suffix="_jdbc"))
    check = Checker(thrift_server, spark, cfg)
    runner.setup(cfg)
    compacted: list[dict[str, Any]] | None = None  # the last compaction's expected rows
    pending_checked = 0
    for i, step in enumerate(scn.steps, 1):
        ((kind, body),) = step.items()
        where = f"{name} step {i} {kind}"
        if kind == "land":
            conf.land(cfg, body["increment"], body["files"])
        elif kind == "check_view":
            refresh_view(runner.runtime(cfg))
            incremental = f"`{cfg.database}`.`{sql.table_names(cfg)['incremental_table']}`"
            assert spark.sql(f"SHOW PARTITIONS {incremental}").count() > 0, f"{where}: nothing is pending"
            check.view_rows(body["expect"], where)
            if compacted is not None:  # a base from an earlier compaction, and an increment pending over it
                check.base_rows(compacted, where + " (base behind the view)")
                pending_checked += 1
        elif kind == "compact":
            runner.compact(cfg)
            compacted = body["expect"]
            check.base_rows(compacted, where)
            check.view_rows(compacted, where)
    assert pending_checked, f"{name}: no checkpoint had an increment pending over a compacted base"
    # The session's time zone, whatever the server JVM's: timestamps read the same as in the project's sessions.
    assert beeline(thrift_server, "SELECT current_timezone() AS tz") == [{"tz": "UTC"}]


@pytest.mark.spark
@pytest.mark.metastore
def test_the_server_listens_on_loopback_only(thrift_server: SparkThriftServer) -> None:
    pid = thrift_server.pid()
    assert pid is not None
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert THRIFT_SERVER_CLASS.encode() in cmdline, "the PID file names the server's JVM itself"
    addresses = _listening_addresses(pid)
    assert f"127.0.0.1:{thrift_server.port}" in addresses, addresses
    assert all(a.startswith("127.0.0.1:") for a in addresses), f"the server listens beyond loopback: {addresses}"
    assert thrift_server.start() == pid, "a second start reuses the running server"


class BeelineSession:
    """One long-lived beeline connection (as a BI tool keeps one): statements in on stdin, rows out."""

    def __init__(self, server: SparkThriftServer) -> None:
        self.proc = subprocess.Popen(
            [
                str(pyspark_home() / "bin" / "beeline"),
                *("-u", server.jdbc_url, "-n", "user", "--outputformat=csv2", "--silent=true"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=_beeline_env(),
        )
        self.n = 0

    def query(self, query: str) -> list[dict[str, str | None]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.n += 1
        marker = f"cdc-end-of-result-{self.n}"
        self.proc.stdin.write(f"{query};\nSELECT '{marker}' AS cdc_marker;\n")
        self.proc.stdin.flush()
        lines = []
        for line in self.proc.stdout:
            if line.strip() == marker:
                break
            lines.append(line.rstrip("\n"))
        else:
            raise AssertionError(f"beeline ended before answering {query}: {lines}")
        # Drop the echoed statements: a prompt, then the statement wrapped at 80 columns up to its ';'.
        output, echo = [], False
        for line in lines:
            echo = echo or bool(PROMPT.match(line))
            if not echo:
                output.append(line)
            elif line.rstrip().endswith(";"):
                echo = False
        assert output[-1:] == ["cdc_marker"], output
        return _csv2(output[:-1])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("!quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.mark.spark
@pytest.mark.metastore
def test_a_connection_opened_before_a_publish_reads_the_new_version(
    thrift_server: SparkThriftServer, spark: Any, endpoint: MetastoreEndpoint, tmp_path: Path
) -> None:
    scn = conf.Scenario.load(SHARED_CONFORMANCE / "update_latest_wins.json")
    runner = conf.InProcessRunner(spark, endpoint)
    cfg = parse_table(conf.registry_doc(scn, tmp_path / "lake", suffix="_jdbc_long"))
    names = sql.table_names(cfg)
    view, base = (f"`{cfg.database}`.`{names[k]}`" for k in ("view_name", "base_table"))
    runner.setup(cfg)
    session = BeelineSession(thrift_server)
    try:
        for i, step in enumerate(scn.steps, 1):
            ((kind, body),) = step.items()
            if kind == "land":
                conf.land(cfg, body["increment"], body["files"])
                continue
            if kind == "check_view":
                refresh_view(runner.runtime(cfg))
            else:
                runner.compact(cfg)
            expected = [{"id": str(r["id"]), "full_name": r["full_name"]} for r in body["expect"]]
            got = session.query(f"SELECT id, full_name FROM {view} ORDER BY id")
            assert got == expected, f"step {i} {kind}: the view over a connection opened before"
            if kind == "compact":
                visible = f"NOT ({sql.rule_sql(cfg).is_delete})"
                got = session.query(f"SELECT id, full_name FROM {base} WHERE {visible} ORDER BY id")
                assert got == expected, f"step {i} compact: the base over a connection opened before"
    finally:
        session.close()


@pytest.mark.spark
@pytest.mark.metastore
def test_serve_sql_starts_a_metastore_and_the_server_and_stops_both_on_ctrl_c(tmp_path: Path) -> None:
    """``make serve-sql``: the metastore is started because none runs, the JDBC URL printed, Ctrl-C stops both."""
    port, ms_port = free_port(), free_port()
    homes = {"metastore": tmp_path / "metastore", "server": tmp_path / "server"}
    command = ["serve-sql", "--port", str(port), "--metastore-home", str(homes["metastore"])]
    command += ["--metastore-port", str(ms_port), "--warehouse", str(tmp_path / "warehouse")]
    command += ["--home", str(homes["server"]), "--master", "local[1]"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc_compaction", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins")},
    )
    server = SparkThriftServer(homes["server"], f"thrift://127.0.0.1:{ms_port}", str(tmp_path / "warehouse"), port)
    metastore = LocalMetastore(homes["metastore"], port=ms_port)
    try:
        assert proc.stdout is not None
        printed = []
        for line in proc.stdout:
            printed.append(line)
            if line.startswith("JDBC URL: "):
                break
        assert printed and printed[-1].strip() == f"JDBC URL: jdbc:hive2://127.0.0.1:{port}/default", printed
        pids = (metastore.pid(), server.pid())
        assert None not in pids, printed
        assert {"namespace": "default"} in beeline(server, "SHOW DATABASES")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0
        for pid in pids:
            assert pid is not None and not pid_alive(pid), f"pid {pid} still runs after Ctrl-C"
        assert not port_open("127.0.0.1", port) and not port_open("127.0.0.1", ms_port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()
        metastore.stop()
