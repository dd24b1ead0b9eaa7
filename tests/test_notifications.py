"""Failure alerts reach a real SMTP server (aiosmtpd on loopback) through an Airflow connection."""

from __future__ import annotations

import json
from collections.abc import Iterator
from email import message_from_bytes
from types import SimpleNamespace
from typing import Any

import pytest

from cdc_compaction.local_services import free_port
from cdc_compaction.notifications import CdcAlertNotifier, alert_rejected_rows


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd API
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Inbox]:
    from aiosmtpd.controller import Controller

    inbox = _Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    conn = {
        "conn_type": "smtp",
        "host": "127.0.0.1",
        "port": port,
        "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "airflow@example.org", "timeout": 10},
    }
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_ALERTS", json.dumps(conn))
    try:
        yield inbox
    finally:
        controller.stop()


def _context() -> dict[str, Any]:
    """What Airflow passes to on_failure_callback, reduced to what the notifier reads."""
    ti = SimpleNamespace(
        dag_id="cdc__school__student",
        task_id="compact",
        run_id="scheduled__2026-11-22T10:00:00+00:00",
        try_number=2,
        log_url="http://127.0.0.1:8080/dags/cdc__school__student/runs/x/tasks/compact",
    )
    return {"ti": ti, "run_id": ti.run_id, "exception": RuntimeError("spark-submit exited with 1")}


def _body(msg: Any) -> str:
    parts = [p for p in msg.walk() if p.get_content_type() == "text/html"]
    return parts[0].get_payload(decode=True).decode()


def test_task_failure_alert_is_mailed_with_table_task_error_and_log_url(smtp: _Inbox) -> None:
    notifier = CdcAlertNotifier(table="school.student", emails=["owner@example.org"], smtp_conn_id="smtp_alerts")
    notifier.notify(_context())
    assert len(smtp.messages) == 1
    rcpts, msg = smtp.messages[0]
    assert rcpts == ["owner@example.org"]
    assert msg["Subject"] == "[cdc-compaction] school.student: task compact failed (try 2)"
    body = _body(msg)
    assert "spark-submit exited with 1" in body and "RuntimeError" in body
    assert "http://127.0.0.1:8080/dags/cdc__school__student/runs/x/tasks/compact" in body
    assert "scheduled__2026-11-22T10:00:00+00:00" in body


def test_no_recipients_means_log_only(smtp: _Inbox, caplog: pytest.LogCaptureFixture) -> None:
    CdcAlertNotifier(table="school.student", emails=[], smtp_conn_id="smtp_alerts").notify(_context())
    assert smtp.messages == []
    assert "school.student: task compact failed" in caplog.text


def test_rejected_rows_alert(smtp: _Inbox) -> None:
    stats = {"rejected_rows": 3, "rejected_by_reason": {"null_key:id": 2, "unknown_op": 1}}
    alert_rejected_rows("school.student", ["owner@example.org"], "smtp_alerts", stats, "/lake/quarantine/v00000002-x")
    ((_, msg),) = smtp.messages
    assert msg["Subject"] == "[cdc-compaction] school.student: 3 change events refused"
    assert "/lake/quarantine/v00000002-x" in _body(msg) and "null_key:id" in _body(msg)
    alert_rejected_rows("school.student", ["owner@example.org"], "smtp_alerts", {"rejected_rows": 0}, "/q")
    assert len(smtp.messages) == 1, "no alert without refused rows"
