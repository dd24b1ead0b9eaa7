"""Failure alerts reach a real SMTP server (aiosmtpd on loopback) through an Airflow connection."""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from email import message_from_bytes
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from conftest import STUDENT_COLUMNS

from cdc_compaction.core.registry import parse_table
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.devtools.devenv import airflow_env, ensure_airflow_db, last_run_timings
from cdc_compaction.devtools.local_services import LocalMetastore, free_port
from cdc_compaction.integrations.notifications import CdcAlertNotifier, alert_rejected_rows


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.conn_json = ""  # the Airflow connection (JSON form) that reaches this server

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
    inbox.conn_json = json.dumps(conn)
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_ALERTS", inbox.conn_json)
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


def test_registry_values_in_an_alert_are_sent_as_written_never_rendered(smtp: _Inbox) -> None:
    """Airflow calls a notifier as ``notifier(context)``, which first renders its ``template_fields``.

    The addresses and connection id come from the registry: rendered, ``{{conn.x.password}}`` in an
    address would mail a connection's password to wherever the rest of the address points.
    """
    rcpt = "{{conn.smtp_alerts.password}}@example.org"
    notifier = CdcAlertNotifier(table="school.student", emails=[rcpt], smtp_conn_id="smtp_alerts")
    conn = SimpleNamespace(smtp_alerts=SimpleNamespace(password="s3cret"))
    notifier({**_context(), "conn": conn, "exception": RuntimeError("bad value {{ 7*7 }}")})
    ((rcpts, msg),) = smtp.messages
    assert rcpts == [rcpt] and msg["To"] == rcpt
    assert msg["Subject"] == "[cdc-compaction] school.student: task compact failed (try 2)"
    assert "bad value {{ 7*7 }}" in html.unescape(_body(msg))
    assert "s3cret" not in msg.as_string()


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


def test_stalled_increments_alert(smtp: _Inbox) -> None:
    from cdc_compaction.integrations.notifications import alert_stalled_increments

    stalled = [
        {
            "increment": "increment_2026112201",
            "path": "/lake/t/incremental/increment_2026112201",
            "reason": "has no _SUCCESS marker yet, unchanged since 2026-11-22 02:00 UTC (longer than ...)",
        }
    ]
    alert_stalled_increments("school.student", ["owner@example.org"], "smtp_alerts", stalled)
    ((_, msg),) = smtp.messages
    assert msg["Subject"] == "[cdc-compaction] school.student: 1 increments stalled"
    assert "/lake/t/incremental/increment_2026112201" in _body(msg) and "no _SUCCESS marker" in _body(msg)


def test_schema_changes_alert(smtp: _Inbox) -> None:
    from cdc_compaction.integrations.notifications import alert_schema_changes

    changes = [
        {"change": "added", "column": "email", "new": "string", "file": "/lake/t/inc/a.parquet", "files": 2},
        {"change": "widened", "column": "score", "old": "int", "new": "bigint", "file": "/lake/t/inc/a.parquet"},
    ]
    alert_schema_changes("school.student", ["owner@example.org"], "smtp_alerts", changes)
    ((_, msg),) = smtp.messages
    assert msg["Subject"] == "[cdc-compaction] school.student: schema changed (2)"
    body = html.unescape(_body(msg))
    assert "added <code>email</code> string (2 file(s)" in body
    assert "widened <code>score</code> int -> bigint (1 file(s), first <code>/lake/t/inc/a.parquet</code>)" in body
    alert_schema_changes("school.student", ["owner@example.org"], "smtp_alerts", [])
    assert len(smtp.messages) == 1, "no alert without changes"


# ------------------------------------------------------------ through a real DAG run
def _dags_test(env: dict[str, str], dag_id: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`airflow dags test <dag_id>` in its own process group, killed whole if it hangs."""
    airflow = str(Path(sys.executable).parent / "airflow")
    with subprocess.Popen(
        [airflow, "dags", "test", dag_id],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the group this test started: airflow and its spark-submit
                out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.dag
@pytest.mark.metastore
def test_a_failing_task_of_a_real_dag_run_mails_the_tables_owners(
    smtp: _Inbox, metastore: LocalMetastore, tmp_path: Path
) -> None:
    """A garbage file in the landing area fails `plan`; its on_failure_callback mails the table's owners."""
    scn = conf.Scenario(
        path=tmp_path / "failure_alert.json",
        name="failure_alert",
        about="A corrupt landed file fails plan, which alerts the table's owners.",
        table={"columns": [dict(c) for c in STUDENT_COLUMNS], "primary_key": ["id"], "order_by": ["ts_ms"]},
        steps=[],
    )
    doc = conf.registry_doc(scn, tmp_path / "lake")
    doc.update(retries=0, alerts={"emails": ["owner@example.org"], "smtp_conn_id": "smtp_alerts"})
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / f"{doc['database']}.{doc['table']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = parse_table(doc)
    (good,) = conf.land(cfg, "increment_2026112200", [[{"id": 1, "full_name": "Alice", "op": "c", "ts_ms": 100}]])
    corrupt = Path(good).parent / "part-00001.parquet"
    corrupt.write_bytes(b"not parquet")

    env = airflow_env(
        tmp_path / "airflow", metastore.uri, registry_dir=registry, warehouse_dir=metastore.home / "warehouse"
    )
    env["AIRFLOW_CONN_SMTP_ALERTS"] = smtp.conn_json
    ensure_airflow_db(env)
    proc = _dags_test(env, cfg.dag_id)
    output = proc.stdout + proc.stderr
    tail = "\n".join(output.splitlines()[-80:])

    assert proc.returncode != 0, f"the DAG run should have failed:\n{tail}"
    tasks = {t["task_id"]: t["state"] for t in last_run_timings(tmp_path / "airflow", cfg.dag_id)["tasks"]}
    assert tasks["ensure_tables"] == "success" and tasks["plan"] == "failed", tasks
    failure_mails = [m for _, m in smtp.messages if "failed" in m["Subject"]]
    assert len(smtp.messages) == len(failure_mails) == 1, f"{[m['Subject'] for _, m in smtp.messages]}\n{tail}"
    rcpts, msg = smtp.messages[0]
    assert rcpts == ["owner@example.org"]
    assert msg["Subject"] == f"[cdc-compaction] {cfg.qualified_name}: task plan failed (try 1)"
    body = _body(msg)
    assert f"Table <b>{cfg.qualified_name}</b>, DAG {cfg.dag_id}" in body
    assert "Task <b>plan</b> failed" in body
    assert "PlanError" in body and str(corrupt) in body, body
    (log_url,) = re.findall(r'Log: <a href="([^"]*)">', body)
    assert log_url.startswith(("http://", "https://")), body
    assert f"/dags/{cfg.dag_id}/runs/" in log_url and "/tasks/plan" in log_url, log_url


# ------------------------------------------------- a side channel never decides data
@pytest.mark.parametrize("conn", ["missing", "unreachable"])
def test_an_alert_that_cannot_be_sent_is_logged_and_counted_never_raised(
    conn: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from cdc_compaction.integrations import notifications

    if conn == "unreachable":
        dead = {
            "conn_type": "smtp",
            "host": "127.0.0.1",
            "port": free_port(),
            "extra": {"disable_ssl": True, "timeout": 2},
        }
        monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEAD", json.dumps(dead))
    conn_id = "smtp_dead" if conn == "unreachable" else "no_such_smtp_connection"
    before = notifications.DELIVERY_FAILURES["school.student"]
    stats = {"rejected_rows": 2, "rejected_by_reason": {"null_key:id": 2}}
    alert_rejected_rows("school.student", ["owner@example.org"], conn_id, stats, "/lake/quarantine/v2")
    CdcAlertNotifier(table="school.student", emails=["owner@example.org"], smtp_conn_id=conn_id).notify(_context())
    assert notifications.DELIVERY_FAILURES["school.student"] == before + 2
    failures = [r for r in caplog.records if "could not deliver the alert" in r.getMessage()]
    assert len(failures) == 2 and all(conn_id in r.getMessage() for r in failures)


# ------------------------------------------------------- every channel: e-mail, Slack, SNS
class _Slack:
    """A local HTTP server standing in for Slack: records each POST (path, JSON body)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.posts: list[tuple[str, dict[str, Any]]] = []
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                ctype = self.headers.get("Content-Type", "")
                if "json" in ctype:
                    body = json.loads(raw)
                else:  # the Web API client posts form fields
                    from urllib.parse import parse_qsl

                    body = dict(parse_qsl(raw.decode()))
                posts.append((self.path, body))
                # A webhook answers "ok"; the Web API answers JSON with "ok": true.
                answer = b'{"ok": true}' if self.path.endswith("chat.postMessage") else b"ok"
                self.send_response(200)
                self.send_header("Content-Type", "application/json" if answer.startswith(b"{") else "text/plain")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slack(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Slack]:
    """Slack on loopback, and Airflow connections reaching it: a webhook one and a Web API one."""
    server = _Slack()
    webhook = {"conn_type": "slackwebhook", "host": server.url, "password": "T000/B000/alerts-token"}
    api = {"conn_type": "slack", "password": "xoxb-test-token", "extra": {"base_url": server.url + "/api/"}}
    monkeypatch.setenv("AIRFLOW_CONN_SLACK_ALERTS", json.dumps(webhook))
    monkeypatch.setenv("AIRFLOW_CONN_SLACK_API", json.dumps(api))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sns_queue(aws_default: str) -> dict[str, Any]:
    """An SNS topic in moto with an SQS queue subscribed to it (raw delivery off: SNS's JSON envelope)."""
    import boto3

    kw = {
        "endpoint_url": aws_default,
        "region_name": "us-east-1",
        "aws_access_key_id": "testing-access-key",
        "aws_secret_access_key": "testing-secret-key",
    }
    sns, sqs = boto3.client("sns", **kw), boto3.client("sqs", **kw)
    suffix = os.urandom(4).hex()
    topic = sns.create_topic(Name=f"cdc-alerts-{suffix}")["TopicArn"]
    queue_url = sqs.create_queue(QueueName=f"cdc-alerts-{suffix}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)

    def received() -> list[dict[str, Any]]:
        msgs = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        return [json.loads(m["Body"]) for m in msgs]

    return {"topic": topic, "received": received}


def _stalled_alert_args() -> tuple[str, list[dict[str, Any]]]:
    stalled = [
        {
            "increment": "increment_2026112201",
            "path": "/lake/t/incremental/increment_2026112201",
            "reason": "has no _SUCCESS marker yet & is {{ 7*7 }} hours old",
        }
    ]
    return "[cdc-compaction] school.student: 1 increments stalled", stalled


def test_an_alert_reaches_email_slack_and_sns_each_as_its_channel_shows_it(
    smtp: _Inbox, slack: _Slack, sns_queue: dict[str, Any]
) -> None:
    from cdc_compaction.integrations.notifications import AlertChannels, alert_stalled_increments

    channels = AlertChannels(
        emails=["owner@example.org"],
        smtp_conn_id="smtp_alerts",
        slack_conn_id="slack_alerts",
        sns_topic_arn=sns_queue["topic"],
    )
    subject, stalled = _stalled_alert_args()
    alert_stalled_increments("school.student", [], "unused", stalled, channels)

    ((rcpts, msg),) = smtp.messages
    assert rcpts == ["owner@example.org"] and msg["Subject"] == subject
    assert "/lake/t/incremental/increment_2026112201" in _body(msg)

    ((path, posted),) = slack.posts
    assert path == "/T000/B000/alerts-token", "the webhook URL is the connection's host + token"
    text = posted["text"]
    assert text.startswith(f"*{subject}*\n"), text
    # Plain text: no HTML tags, every list item on its own line, templates left alone, and only
    # the three characters Slack's format reserves escaped.
    assert "<" not in text
    assert "- /lake/t/incremental/increment_2026112201: has no _SUCCESS marker yet &amp; is {{ 7*7 }} hours old" in text

    (envelope,) = sns_queue["received"]()
    assert envelope["TopicArn"] == sns_queue["topic"]
    assert envelope["Subject"] == subject
    assert "- /lake/t/incremental/increment_2026112201: has no _SUCCESS marker" in envelope["Message"]
    assert "<li>" not in envelope["Message"]


def test_send_alert_takes_the_channels_from_the_registrys_alerts(smtp: _Inbox, slack: _Slack) -> None:
    """The registry's ``alerts:`` names the channels; a Slack API connection posts to ``slack_channel``."""
    from cdc_compaction.integrations.notifications import send_alert

    doc = {
        "database": "school",
        "table": "student",
        "storage_root": "/tmp/lake",
        "columns": [dict(c) for c in STUDENT_COLUMNS],
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "alerts": {
            "emails": ["owner@example.org"],
            "smtp_conn_id": "smtp_alerts",
            "slack_conn_id": "slack_api",
            "slack_channel": "#cdc-alerts",
        },
    }
    cfg = parse_table(doc)
    assert send_alert(cfg, "[cdc-compaction] school.student: test", "<p>hello &amp; bye</p>") == {
        "email": True,
        "slack": True,
    }
    assert [m["Subject"] for _, m in smtp.messages] == ["[cdc-compaction] school.student: test"]
    ((path, posted),) = slack.posts
    assert path == "/api/chat.postMessage"
    assert posted["channel"] == "#cdc-alerts"
    assert posted["text"] == "*[cdc-compaction] school.student: test*\nhello &amp; bye"


def test_a_channel_that_fails_is_counted_and_the_others_still_deliver(
    smtp: _Inbox, sns_queue: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from cdc_compaction.integrations import notifications
    from cdc_compaction.integrations.notifications import AlertChannels, send_alert

    dead = {"conn_type": "slackwebhook", "host": f"http://127.0.0.1:{free_port()}", "password": "T/B/x"}
    monkeypatch.setenv("AIRFLOW_CONN_SLACK_DEAD", json.dumps(dead))
    channels = AlertChannels(
        emails=["owner@example.org"],
        smtp_conn_id="smtp_alerts",
        slack_conn_id="slack_dead",
        sns_topic_arn=sns_queue["topic"],
    )
    before = notifications.DELIVERY_FAILURES["school.student"]
    sent = send_alert("school.student", "[cdc-compaction] school.student: x", "<p>x</p>", channels)
    assert sent == {"email": True, "slack": False, "sns": True}
    assert notifications.DELIVERY_FAILURES["school.student"] == before + 1
    assert len(smtp.messages) == 1 and len(sns_queue["received"]()) == 1
    (failure,) = [r for r in caplog.records if "could not deliver the alert" in r.getMessage()]
    assert "school.student" in failure.getMessage() and "'slack_dead'" in failure.getMessage()

    # A Slack API connection without a channel to post to: refused with what to set, counted, not raised.
    no_channel = AlertChannels(slack_conn_id="slack_api_nochannel")
    monkeypatch.setenv("AIRFLOW_CONN_SLACK_API_NOCHANNEL", json.dumps({"conn_type": "slack", "password": "xoxb-t"}))
    assert send_alert("school.student", "s", "<p>b</p>", no_channel) == {"slack": False}
    assert "set alerts.slack_channel" in caplog.text


def test_plain_text_slack_text_and_sns_subjects() -> None:
    from cdc_compaction.integrations.notifications import SNS_SUBJECT_MAX, plain_text, slack_text, sns_subject

    body = "<p>2 files of <b>a.b</b>:</p><ul><li><code>x&lt;1&gt;</code>: bad</li><li>y</li></ul><p>Fix</p>"
    assert plain_text(body) == "2 files of a.b:\n- x<1>: bad\n- y\nFix"
    assert sns_subject("[cdc] t: task\nfailed") == "[cdc] t: task failed"
    assert sns_subject("caf\u00e9 \u2014 x") == "caf? ? x"
    long = sns_subject("[cdc-compaction] " + "d" * 200)
    assert len(long) == SNS_SUBJECT_MAX < 100 and long.endswith("...")
    # Slack would show <https://evil.example|here> as a link named "here": escaped, it shows as written.
    link = "<p>bad file <code>&lt;https://evil.example|here&gt;</code></p>"
    assert slack_text("s", link) == "*s*\nbad file &lt;https://evil.example|here&gt;"


def test_a_failed_erase_task_alerts_the_owners_of_the_table_it_erased(smtp: _Inbox, tmp_path: Any) -> None:
    """The erase DAG serves every table: its failure alert goes to the channels of the table the run names."""
    from conftest import student_doc

    from cdc_compaction.airflow.factory import build_erase_dag

    def cfg(table: str, owner: str) -> Any:
        doc = student_doc(tmp_path / table, table)
        return parse_table({**doc, "alerts": {"emails": [owner], "smtp_conn_id": "smtp_alerts"}})

    dag = build_erase_dag([cfg("people", "people-owner@example.org"), cfg("other", "other-owner@example.org")])
    (callback,) = dag.get_task("erase").on_failure_callback
    context = {**_context(), "params": {"table": "tests.people", "where": "id = 1", "actor": "dpo"}}
    callback(context)
    callback({**context, "params": {"table": "tests.nope"}})  # no registry table: logged, nothing sent, no error
    assert len(smtp.messages) == 1
    rcpts, msg = smtp.messages[0]
    assert rcpts == ["people-owner@example.org"]
    assert msg["Subject"].startswith("[cdc-compaction] tests.people: task compact failed")
