"""Commit metrics: the numbers a commit records, and their way into Airflow's metrics over real StatsD UDP.

Expected values are worked out here from the commit's recorded times and the job's stats, not
with the package's code.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.pipeline import metrics

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
STATS = {
    "increment_rows": 12,
    "output_rows": 9,
    "output_visible_rows": 7,
    "rejected_rows": 1,
    "superseded_rows": 4,
    "output_tombstones": 2,
    "expired_tombstones": 0,
    "tied_winners": 3,
    "late_events": 2,
    "finished_at": (T0 + timedelta(minutes=4)).isoformat(),
}


def _commit(committed_at: datetime, freshness: dict[str, str], stats: dict[str, Any] | None = None) -> Commit:
    c = Commit(3, "v00000003-p", "p", "r", 2, [], ["increment_2026112608"], stats=dict(stats or STATS))
    c.committed_at, c.freshness = committed_at.isoformat(), freshness
    return c


def test_a_commit_records_counts_lags_and_step_durations(make_cfg: Callable[..., TableConfig]) -> None:
    cfg = make_cfg()
    commit = _commit(T0 + timedelta(minutes=6), {"event_time": "2026-11-26T08:40:00+00:00"})
    got = metrics.commit_metrics(
        cfg,
        commit,
        planned_at=T0.isoformat(),
        validated_at=(T0 + timedelta(minutes=5)).isoformat(),
        landed=["increment_2026112609"],  # waiting when planned: landed, not compacted
    )
    assert got == {
        "events_in": 12,
        "events_out": 9,
        "visible_rows": 7,
        "rejected": 1,
        "superseded": 4,
        "tombstones": 2,
        "expired_tombstones": 0,
        "ties": 3,
        "late_events": 2,
        # 10:06 - 08:40
        "freshness_lag_seconds": 86 * 60,
        # 10:06 - the end of the hour 09:00-10:00
        "landing_lag_seconds": 6 * 60,
        "newest_landed_increment": "increment_2026112609",
        "step_seconds": {"compact": 240, "validate": 60, "publish": 60},
    }


def test_an_older_jobs_stats_leave_its_missing_counts_out_and_the_hour_stands_for_the_event_time(
    make_cfg: Callable[..., TableConfig],
) -> None:
    cfg = make_cfg()
    old = {k: v for k, v in STATS.items() if k not in ("tied_winners", "late_events", "finished_at")}
    commit = _commit(T0 + timedelta(minutes=30), {"increment": "increment_2026112608"}, old)
    got = metrics.commit_metrics(cfg, commit, planned_at=None, validated_at=None)
    assert "ties" not in got and "late_events" not in got
    # The hour 08:00-09:00 is complete up to 09:00: 90 minutes before 10:30.
    assert got["freshness_lag_seconds"] == got["landing_lag_seconds"] == 90 * 60
    assert got["step_seconds"] == {}


@pytest.fixture
def statsd_listener() -> Iterator[socket.socket]:
    """A UDP socket Airflow's StatsD logger sends to (InfluxDB-style tags in the name), as Airflow's ``Stats``."""
    import statsd  # the client Airflow's [metrics] statsd_on uses (pinned in requirements.txt)
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk._shared.observability.metrics.statsd_logger import get_statsd_logger
    from airflow.sdk.observability.stats import Stats

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    port = sock.getsockname()[1]
    Stats.initialize(
        factory=lambda: get_statsd_logger(
            stats_class=statsd.StatsClient,
            host="127.0.0.1",
            port=port,
            prefix="airflow",
            influxdb_tags_enabled=True,
            statsd_influxdb_enabled=True,
        ),
        export_legacy_names=False,
    )
    try:
        yield sock
    finally:
        Stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
        sock.close()


def _received(sock: socket.socket) -> dict[str, tuple[float, str]]:
    """``name,tags`` -> (value, type) of every packet waiting on the socket."""
    out: dict[str, tuple[float, str]] = {}
    sock.settimeout(0.5)  # loopback UDP arrives at once; this only ends the drain
    try:
        while True:
            for line in sock.recv(65535).decode().splitlines():
                name, _, rest = line.rpartition(":")
                value, _, kind = rest.partition("|")
                out[name] = (float(value), kind)
    except TimeoutError:
        return out


def test_emitted_metrics_reach_statsd_with_table_tags(
    statsd_listener: socket.socket, make_cfg: Callable[..., TableConfig]
) -> None:
    cfg = make_cfg(table="student_m")
    numbers = {
        "events_in": 12,
        "ties": 3,
        "late_events": 2,
        "freshness_lag_seconds": 5160.0,
        "step_seconds": {"compact": 240.0},
    }
    assert metrics.emit(cfg, numbers, {"compliance": 0.75, "breached": True})
    got = _received(statsd_listener)
    tags = f"database={cfg.database},table=student_m"
    assert got == {
        f"airflow.cdc_compaction.events_in,{tags}": (12, "c"),
        f"airflow.cdc_compaction.ties,{tags}": (3, "c"),
        f"airflow.cdc_compaction.late_events,{tags}": (2, "c"),
        f"airflow.cdc_compaction.freshness_lag_seconds,{tags}": (5160, "g"),
        f"airflow.cdc_compaction.step_duration,{tags},step=compact": (240_000, "ms"),
        f"airflow.cdc_compaction.slo_compliance,{tags}": (0.75, "g"),
        f"airflow.cdc_compaction.slo_breached,{tags}": (1, "g"),
    }


def test_a_failure_to_emit_is_logged_and_counted_never_raised(
    statsd_listener: socket.socket, make_cfg: Callable[..., TableConfig], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_cfg()
    before = metrics.EMIT_FAILURES[cfg.qualified_name]
    assert not metrics.emit(cfg, {"freshness_lag_seconds": "not a number"})
    assert metrics.EMIT_FAILURES[cfg.qualified_name] == before + 1
    assert "could not emit the metrics" in caplog.text
    assert f"airflow.cdc_compaction.metrics_emit_failed,database={cfg.database},table={cfg.table}" in _received(
        statsd_listener
    )


def test_what_the_table_holds_goes_out_as_gauges_what_a_commit_did_as_counters(
    statsd_listener: socket.socket, make_cfg: Callable[..., TableConfig]
) -> None:
    """Rows out, visible rows and tombstones are the table's size after the commit: levels, so gauges (``|g``).

    Two commits, 7 then 5 visible rows: a StatsD server keeps a gauge's last value (5); as a
    counter it would add them (12 rows the table never held).
    """
    cfg = make_cfg(table="student_g")
    tags = f"database={cfg.database},table=student_g"
    for visible, out, tombstones, events_in in ((7, 9, 2, 12), (5, 8, 3, 4)):
        numbers = {"visible_rows": visible, "events_out": out, "tombstones": tombstones, "events_in": events_in}
        assert metrics.emit(cfg, numbers)
        got = _received(statsd_listener)
        assert got == {
            f"airflow.cdc_compaction.visible_rows,{tags}": (visible, "g"),
            f"airflow.cdc_compaction.events_out,{tags}": (out, "g"),
            f"airflow.cdc_compaction.tombstones,{tags}": (tombstones, "g"),
            f"airflow.cdc_compaction.events_in,{tags}": (events_in, "c"),
        }


def test_table_metrics_shows_the_latest_commit_and_its_slo(make_cfg: Callable[..., TableConfig]) -> None:
    cfg = make_cfg(slo={"freshness": "2h", "window": "1d"})
    lake = Lake(cfg)
    commit = _commit(T0, {"event_time": (T0 - timedelta(minutes=30)).isoformat()})
    commit.seq, commit.parent_seq, commit.metrics = 1, 0, {"events_in": 12}
    assert lake.try_commit(commit)
    got = metrics.table_metrics(cfg, lake, now=T0 + timedelta(hours=2))
    assert (got["commit"], got["metrics"], got["freshness"]["event_time"]) == (
        1,
        {"events_in": 12},
        "2026-11-26T09:30:00+00:00",
    )
    # Fresh until 11:30 of the 2 h since the commit; 2.5 h old now.
    assert got["slo"]["compliance"] == pytest.approx(0.75)
    assert got["slo"]["lag_seconds"] == 2.5 * 3600


#: Run in a child process: Airflow picks its ``Stats`` backend from ``[metrics]`` once per process, as a
#: worker does. The child emits one commit's numbers, then shuts the meter provider down, which exports.
_OTEL_CHILD = """
import json, sys
from opentelemetry import metrics as otel
from cdc_compaction.pipeline import metrics
from cdc_compaction.core.registry import parse_table
cfg = parse_table(json.loads(sys.argv[1]))
ok = metrics.emit(cfg, json.loads(sys.argv[2]), {"compliance": 0.75, "breached": True})
otel.get_meter_provider().shutdown()
print("EMITTED" if ok else "FAILED")
"""


@pytest.fixture
def otlp_collector() -> Iterator[tuple[int, list[Any]]]:
    """An OTLP/HTTP metrics receiver on 127.0.0.1 (what an OpenTelemetry collector accepts), stopped here."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
        ExportMetricsServiceResponse,
    )

    received: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/metrics":
                received.append(ExportMetricsServiceRequest.FromString(body))
            reply = ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _otlp_points(requests: list[Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, float]]:
    """(metric name, its attributes) -> (kind, value) of every data point the collector received."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, float]] = {}
    for req in requests:
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    for p in getattr(m, kind).data_points:
                        attrs = tuple(sorted((a.key, a.value.string_value) for a in p.attributes))
                        if kind == "sum" or kind == "gauge":
                            value = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
                        else:  # a histogram of timings: what this test checks is their sum
                            value = p.sum
                        out[(m.name, attrs)] = (kind, float(value))
    return out


def test_emitted_metrics_reach_an_opentelemetry_collector_with_table_attributes(
    otlp_collector: tuple[int, list[Any]], tmp_path: Any
) -> None:
    """[metrics] otel_on: the same numbers go out over OTLP/HTTP, tagged as attributes (no mocked exporter)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from conftest import student_doc

    port, received = otlp_collector
    doc = student_doc(tmp_path / "lake", table="student_o")
    numbers = {"events_in": 12, "late_events": 2, "freshness_lag_seconds": 5160.0, "step_seconds": {"compact": 240.0}}
    plugins = Path(__file__).resolve().parents[2] / "plugins"
    env = {
        **os.environ,
        "PYTHONPATH": str(plugins),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__METRICS__STATSD_ON": "False",
        "AIRFLOW__METRICS__OTEL_ON": "True",
        "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__OTEL_PORT": str(port),
        "AIRFLOW__METRICS__OTEL_SSL_ACTIVE": "False",
        "AIRFLOW__METRICS__OTEL_PREFIX": "airflow",
        # Long: the export this test sees is the one at shutdown, not a periodic one racing it.
        "AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS": "600000",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _OTEL_CHILD, json.dumps(doc), json.dumps(numbers)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and "EMITTED" in proc.stdout, proc.stdout + proc.stderr
    got = _otlp_points(received)
    tags = (("database", doc["database"]), ("table", "student_o"))
    expected = {
        ("airflow.cdc_compaction.events_in", tags): ("sum", 12.0),
        ("airflow.cdc_compaction.late_events", tags): ("sum", 2.0),
        ("airflow.cdc_compaction.freshness_lag_seconds", tags): ("gauge", 5160.0),
        ("airflow.cdc_compaction.slo_compliance", tags): ("gauge", 0.75),
        ("airflow.cdc_compaction.slo_breached", tags): ("gauge", 1.0),
    }
    assert {k: v for k, v in got.items() if k in expected} == expected, sorted(got)
    timings = {k: v for k, v in got.items() if k[0] == "airflow.cdc_compaction.step_duration"}
    step_tags = tuple(sorted((*tags, ("step", "compact"))))
    assert list(timings) == [("airflow.cdc_compaction.step_duration", step_tags)], sorted(got)
    kind, total = timings[next(iter(timings))]
    assert kind.endswith("histogram") and total == 240_000.0, "one 240 s step, in milliseconds as StatsD has it"
