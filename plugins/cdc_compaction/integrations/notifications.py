"""Per-table alerting: a notifier that logs, and tells the table's alert channels.

Attached to every task of a table's DAG as ``on_failure_callback``; the ``validate``
task also calls :func:`alert_rejected_rows` when a compaction refused rows.

Every alert goes through :func:`send_alert` to each channel the registry's ``alerts:``
configures -- e-mail (``emails`` through ``smtp_conn_id``), Slack (``slack_conn_id``) and
Amazon SNS (``sns_topic_arn``) -- by the providers' own notifiers (``SmtpNotifier``,
``SlackWebhookNotifier``/``SlackNotifier``, ``SnsNotifier``). Each channel fails on its own:
logged and counted, never raised into the task.
"""

from __future__ import annotations

import html
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk import BaseNotifier

from cdc_compaction.core.exceptions import CdcCompactionError
from cdc_compaction.core.sidechannel import count_failure

log = logging.getLogger(__name__)


def error_text(exc: BaseException | None) -> str:
    """``Type: message``; a subclass of this package's errors also names its family (``X (a PlanError)``)."""
    if exc is None:
        return "(no exception in context)"
    cause = exc.__cause__
    if type(exc).__name__ == "AirflowFailException" and isinstance(cause, CdcCompactionError):
        # factory.fail_fast wrapped an error no retry can heal: name the real one.
        return f"{error_text(cause)} (failed at once: retrying cannot fix this)"
    kind = type(exc).__name__
    families = [
        c.__name__ for c in type(exc).__mro__[1:] if issubclass(c, CdcCompactionError) and c is not CdcCompactionError
    ]
    if families:
        kind += f" (a {', '.join(families)})"
    return f"{kind}: {exc}"


def _describe(context: dict[str, Any]) -> dict[str, str]:
    ti = context.get("ti") or context.get("task_instance")
    exc = context.get("exception")
    return {
        "dag_id": str(getattr(ti, "dag_id", "") or context.get("dag", "")),
        "task_id": str(getattr(ti, "task_id", "")),
        "run_id": str(context.get("run_id", getattr(ti, "run_id", ""))),
        "try_number": str(getattr(ti, "try_number", "")),
        "log_url": str(getattr(ti, "log_url", "") or ""),
        "error": error_text(exc),
    }


class CdcAlertNotifier(BaseNotifier):
    """Tell a table's owners that one of its tasks failed: the table, task, error and log URL."""

    # Nothing is templated. Airflow renders a notifier's template_fields before notify(), and the
    # table, addresses and connection id all come from the registry: an address written as
    # "{{ conn.smtp_default.password }}@x.io" would otherwise mail a password to x.io.
    template_fields: Sequence[str] = ()

    def __init__(
        self,
        *,
        table: str,
        emails: list[str],
        smtp_conn_id: str = "smtp_default",
        channels: AlertChannels | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.emails = list(emails)
        self.smtp_conn_id = smtp_conn_id
        self.channels = channels or AlertChannels(emails=self.emails, smtp_conn_id=smtp_conn_id)

    def message(self, context: dict[str, Any]) -> tuple[str, str]:
        d = _describe(context)
        subject = f"[cdc-compaction] {self.table}: task {d['task_id']} failed (try {d['try_number']})"
        body = (
            f"<p>Table <b>{html.escape(self.table)}</b>, DAG {html.escape(d['dag_id'])}, "
            f"run {html.escape(d['run_id'])}</p>"
            f"<p>Task <b>{html.escape(d['task_id'])}</b> failed: <pre>{html.escape(d['error'])}</pre></p>"
            f'<p>Log: <a href="{html.escape(d["log_url"])}">{html.escape(d["log_url"])}</a></p>'
            "<p>Every task is safe to retry: fix the cause, then clear the task in the Airflow UI.</p>"
        )
        return subject, body

    def notify(self, context: dict[str, Any]) -> None:
        subject, body = self.message(context)
        d = _describe(context)
        log.error("%s | error: %s | log: %s", subject, d["error"], d["log_url"])
        send_alert(self.table, subject, body, self.channels)


#: Alerts that could not be delivered in this process, by table (also sent to Airflow's metrics).
DELIVERY_FAILURES: Counter[str] = Counter()
DELIVERY_FAILED_METRIC = "cdc_compaction.alert_delivery_failed"


@dataclass(frozen=True)
class AlertChannels:
    """Where a table's alerts go: the registry's ``alerts:`` without its switches."""

    emails: list[str] = field(default_factory=list)
    smtp_conn_id: str = "smtp_default"
    #: A Slack Incoming Webhook connection (type ``slackwebhook``) or a Slack API one (type ``slack``).
    slack_conn_id: str | None = None
    #: The channel a Slack API connection posts to (a webhook posts where it was created for).
    slack_channel: str | None = None
    sns_topic_arn: str | None = None
    aws_conn_id: str = "aws_default"

    @classmethod
    def of(cls, alerts: Any) -> AlertChannels:
        """The channels of a registry ``alerts:`` section (a ``registry.Alerts``)."""
        return cls(
            emails=list(alerts.emails),
            smtp_conn_id=alerts.smtp_conn_id,
            slack_conn_id=alerts.slack_conn_id,
            slack_channel=alerts.slack_channel,
            sns_topic_arn=alerts.sns_topic_arn,
            aws_conn_id=alerts.aws_conn_id,
        )


def plain_text(body: str) -> str:
    """An alert's HTML body as the plain text Slack and SNS show: paragraphs and list items on their own lines."""
    text = re.sub(r"(?i)</p>|<br\s*/?>|</li>|</ul>|<ul>|</pre>", "\n", body)
    text = re.sub(r"(?i)<li>", "- ", text)
    text = re.sub(r"<[^>]+>", "", text)
    lines = (line.strip() for line in html.unescape(text).splitlines())
    return "\n".join(line for line in lines if line)


def slack_text(subject: str, body: str) -> str:
    """The alert as a Slack message: the subject in bold, then the plain text.

    Slack reads ``<...>`` as links and mentions, so ``&``, ``<`` and ``>`` are escaped as its API
    asks: a file name or error text holding ``<https://x|click>`` shows as written, never as a link.
    """
    return html.escape(f"*{subject}*\n{plain_text(body)}", quote=False)


#: SNS refuses a subject of 100 characters or more, or with line breaks or non-ASCII characters.
SNS_SUBJECT_MAX = 99


def sns_subject(subject: str) -> str:
    """``subject`` as SNS accepts it: printable ASCII on one line, cut to :data:`SNS_SUBJECT_MAX` characters."""
    flat = "".join(c if " " <= c <= "~" else "?" for c in " ".join(subject.split()))
    return flat if len(flat) <= SNS_SUBJECT_MAX else flat[: SNS_SUBJECT_MAX - 3] + "..."


def send_alert(cfg: Any, subject: str, body: str, channels: AlertChannels | None = None) -> dict[str, bool]:
    """Send one alert to every channel of a table; returns channel -> delivered.

    ``cfg`` is the table's ``TableConfig`` (its ``alerts:`` name the channels), or the table's
    name with ``channels`` given. ``body`` is HTML (e-mail); Slack and SNS get it as plain text.
    A channel that fails (missing connection, unreachable service, refused message) is logged
    with the alert's subject and counted, and the other channels are still tried: an alert never
    decides whether data is published.

    The providers' notifiers are called through ``notify()``, never as ``notifier(context)``:
    that would render their ``template_fields`` first, and the table, addresses and the error
    text are data ("{{ conn.x.password }}" in a value must be sent as written).
    """
    table = cfg if isinstance(cfg, str) else cfg.qualified_name
    if channels is None:
        channels = AlertChannels.of(cfg.alerts)
    sent: dict[str, bool] = {}
    if channels.emails:
        sent["email"] = send_email(channels.smtp_conn_id, channels.emails, subject, body, table=table)
    if channels.slack_conn_id:
        sent["slack"] = _deliver(
            table,
            subject,
            f"Slack connection {channels.slack_conn_id!r}",
            _slack,
            channels,
            slack_text(subject, body),
        )
    if channels.sns_topic_arn:
        sent["sns"] = _deliver(
            table,
            subject,
            f"SNS topic {channels.sns_topic_arn} (connection {channels.aws_conn_id!r})",
            _sns,
            channels,
            subject,
            plain_text(body),
        )
    return sent


def _deliver(table: str, subject: str, where: str, send: Any, *args: Any) -> bool:
    """Run one channel's send; a failure is logged and counted, never raised."""
    try:
        send(*args)
        return True
    except Exception:
        log.exception(
            "%s: could not deliver the alert %r to %s; the task goes on. Fix the connection "
            "(Admin > Connections) or the registry's alerts: to receive alerts there",
            table or "cdc-compaction",
            subject,
            where,
        )
        _count_delivery_failure(table)
        return False


def _slack(channels: AlertChannels, text: str) -> None:
    from airflow.sdk import BaseHook

    conn_id = channels.slack_conn_id
    assert conn_id is not None
    if BaseHook.get_connection(conn_id).conn_type == "slack":
        from airflow.providers.slack.notifications.slack import SlackNotifier

        if not channels.slack_channel:
            raise ValueError(
                f"{conn_id!r} is a Slack API connection, which posts to a channel: set alerts.slack_channel, "
                "or use a Slack Incoming Webhook connection (type slackwebhook)"
            )
        SlackNotifier(slack_conn_id=conn_id, channel=channels.slack_channel, text=text).notify({})
        return
    from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

    SlackWebhookNotifier(slack_webhook_conn_id=conn_id, text=text).notify({})


def _sns(channels: AlertChannels, subject: str, message: str) -> None:
    from airflow.providers.amazon.aws.notifications.sns import SnsNotifier

    arn = channels.sns_topic_arn
    assert arn is not None
    # The topic's region is in its ARN (arn:aws:sns:<region>:<account>:<name>): publish there, whatever
    # region the AWS connection defaults to.
    SnsNotifier(
        aws_conn_id=channels.aws_conn_id,
        target_arn=arn,
        subject=sns_subject(subject),
        message=message,
        region_name=arn.split(":")[3],
    ).notify({})


def send_email(smtp_conn_id: str, to: list[str], subject: str, body: str, table: str = "") -> bool:
    """Send one HTML e-mail through an Airflow SMTP connection (the smtp provider's ``SmtpNotifier``).

    True if it was sent. Delivering an alert never decides whether data is published: a missing
    connection, an unreachable server or a refused recipient is logged with the alert's subject
    and counted (``cdc_compaction.alert_delivery_failed`` in Airflow's metrics), and the task
    goes on.
    """
    try:
        from airflow.providers.smtp.hooks.smtp import SmtpHook
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        # The notifier would render the connection's subject/body templates for a missing sender:
        # give it the connection's sender, or the one alerts always used.
        sender = SmtpHook.get_connection(smtp_conn_id).extra_dejson.get("from_email") or "airflow@localhost"
        SmtpNotifier(to=to, from_email=sender, subject=subject, html_content=body, smtp_conn_id=smtp_conn_id).notify({})
        return True
    except Exception:
        log.exception(
            "%s: could not deliver the alert %r to %s through connection %r; the task goes on. Fix the "
            "connection (Admin > Connections) to receive alerts",
            table or "cdc-compaction",
            subject,
            to,
            smtp_conn_id,
        )
        _count_delivery_failure(table)
        return False


def _count_delivery_failure(table: str) -> None:
    count_failure(DELIVERY_FAILURES, table, DELIVERY_FAILED_METRIC, {"table": table})


def _channels(emails: list[str], smtp_conn_id: str, channels: AlertChannels | None) -> AlertChannels:
    """The table's channels: as given (the DAG passes the registry's), else e-mail only (older callers)."""
    return channels if channels is not None else AlertChannels(emails=list(emails), smtp_conn_id=smtp_conn_id)


def alert_rejected_rows(
    table: str,
    emails: list[str],
    smtp_conn_id: str,
    stats: dict[str, Any],
    quarantine: str,
    channels: AlertChannels | None = None,
) -> None:
    """Warn that a compaction refused rows (they are kept in quarantine, not lost)."""
    n = int(stats.get("rejected_rows", 0))
    if n <= 0:
        return
    reasons = stats.get("rejected_by_reason", {})
    log.warning("%s: %d rows refused and quarantined at %s, by reason %s", table, n, quarantine, reasons)
    subject = f"[cdc-compaction] {table}: {n} change events refused"
    body = (
        f"<p>{n} change events of <b>{html.escape(table)}</b> were refused and kept in quarantine at "
        f"<code>{html.escape(quarantine)}</code>.</p><p>By reason: {html.escape(str(reasons))}</p>"
        "<p>Fix them at the source, or correct the files and re-land them as a new increment.</p>"
    )
    send_alert(table, subject, body, _channels(emails, smtp_conn_id, channels))


def alert_quarantined_files(
    table: str,
    emails: list[str],
    smtp_conn_id: str,
    files: list[dict[str, Any]],
    channels: AlertChannels | None = None,
) -> None:
    """Warn that a plan set whole landed files aside (``on_bad_file: quarantine``)."""
    if not files:
        return
    log.warning("%s: %d landed files moved to quarantine: %s", table, len(files), files)
    items = "".join(
        f"<li><code>{html.escape(f['file'])}</code> &rarr; <code>{html.escape(f['quarantined_to'])}</code>: "
        f"{html.escape(f['reason'])}</li>"
        for f in files
    )
    body = (
        f"<p>{len(files)} landed files of <b>{html.escape(table)}</b> cannot be compacted and were moved to "
        f"quarantine:</p><ul>{items}</ul><p>Fix them (or the registry), then re-ingest: "
        f"<code>cdc-compaction quarantine list {html.escape(table)}</code>.</p>"
    )
    subject = f"[cdc-compaction] {table}: {len(files)} files quarantined"
    send_alert(table, subject, body, _channels(emails, smtp_conn_id, channels))


def alert_ignored_landing(
    table: str,
    emails: list[str],
    smtp_conn_id: str,
    entries: list[dict[str, Any]],
    channels: AlertChannels | None = None,
) -> None:
    """Warn that landed files or directories are never compacted (wrong place or name).

    Never raises (see :func:`send_alert`): the next plan alerts again while they stay.
    """
    if not entries:
        return
    log.warning("%s: %d landed entries are never compacted: %s", table, len(entries), entries)
    items = "".join(f"<li><code>{html.escape(e['path'])}</code>: {html.escape(e['reason'])}</li>" for e in entries)
    body = (
        f"<p>{len(entries)} landed files or directories of <b>{html.escape(table)}</b> are not where the "
        f"table's runs take change files, so they are never compacted:</p><ul>{items}</ul>"
        "<p>Move each into the increment directory of its hour, or remove it.</p>"
    )
    subject = f"[cdc-compaction] {table}: {len(entries)} landed entries ignored"
    send_alert(table, subject, body, _channels(emails, smtp_conn_id, channels))


def alert_stalled_increments(
    table: str,
    emails: list[str],
    smtp_conn_id: str,
    increments: list[dict[str, Any]],
    channels: AlertChannels | None = None,
) -> None:
    """Warn that increments have waited longer than ``increments.alert_after`` to be complete.

    A writer's abandoned temporaries or a completion marker that never came keep an increment
    out of every compaction, possibly forever. Never raises (see :func:`send_alert`).
    """
    if not increments:
        return
    log.warning("%s: %d increments are stalled, not complete: %s", table, len(increments), increments)
    items = "".join(f"<li><code>{html.escape(i['path'])}</code>: {html.escape(i['reason'])}</li>" for i in increments)
    body = (
        f"<p>{len(increments)} increments of <b>{html.escape(table)}</b> have waited too long to be complete, "
        f"so they are not compacted and their change events are in no base version yet:</p><ul>{items}</ul>"
        "<p>Remove a dead writer's temporaries, or create the completion marker once the increment is complete; "
        "the next run then compacts it.</p>"
    )
    subject = f"[cdc-compaction] {table}: {len(increments)} increments stalled"
    send_alert(table, subject, body, _channels(emails, smtp_conn_id, channels))


def alert_schema_changes(
    table: str,
    emails: list[str],
    smtp_conn_id: str,
    changes: list[dict[str, Any]],
    channels: AlertChannels | None = None,
) -> None:
    """Tell the owners the source's schema changed and what the run did (``schema_changes``).

    ``added`` and ``widened`` columns were applied to the tables and views, ``dropped`` ones are
    kept (NULL for new rows), ``ignored`` ones were left out. Never raises (see :func:`send_alert`).
    """
    if not changes:
        return
    log.warning("%s: the source's schema changed: %s", table, changes)

    def line(c: dict[str, Any]) -> str:
        types = " -> ".join(t for t in (c.get("old", ""), c.get("new", "")) if t)
        first = html.escape(str(c.get("file", "")))
        return (
            f"<li>{html.escape(c['change'])} <code>{html.escape(c['column'])}</code> {html.escape(types)} "
            f"({c.get('files', 1)} file(s), first <code>{first}</code>)</li>"
        )

    body = (
        f"<p>The landed files of <b>{html.escape(table)}</b> changed its schema:</p>"
        f"<ul>{''.join(line(c) for c in changes)}</ul>"
        "<p>Added and widened columns are in the tables and views now; dropped ones stay and read NULL for new "
        "rows; ignored ones are not compacted. Add them to the registry's columns to make it say so too.</p>"
    )
    subject = f"[cdc-compaction] {table}: schema changed ({len(changes)})"
    send_alert(table, subject, body, _channels(emails, smtp_conn_id, channels))


def _hours(seconds: Any) -> str:
    return "unknown" if seconds is None else f"{float(seconds) / 3600:.2f} h"


def alert_slo(
    table: str,
    emails: list[str],
    smtp_conn_id: str,
    status: dict[str, Any],
    breached: bool,
    channels: AlertChannels | None = None,
) -> None:
    """Tell a table's owners that its freshness SLO is breached, or met again (``slo.check``: once per change).

    Never raises (see :func:`send_alert`).
    """
    compliance = status.get("compliance")
    shown = "unknown" if compliance is None else f"{100 * float(compliance):.2f}%"
    target = f"{100 * float(status.get('target') or 0):.2f}%"
    what = "breached" if breached else "met again"
    log.log(
        logging.WARNING if breached else logging.INFO,
        "%s: freshness SLO %s: within %s for %s of the last %s (target %s); lag now %s",
        table,
        what,
        _hours(status.get("freshness_seconds")),
        shown,
        _hours(status.get("window_seconds")),
        target,
        _hours(status.get("lag_seconds")),
    )
    advice = (
        "<p>Check that change files still land in the table's landing area and that its DAG's runs succeed; "
        "the lag shrinks with the next successful compaction.</p>"
        if breached
        else "<p>No action needed.</p>"
    )
    body = (
        f"<p>The freshness SLO of <b>{html.escape(table)}</b> is {what}: its base was within "
        f"{_hours(status.get('freshness_seconds'))} of the source for {shown} of the last "
        f"{_hours(status.get('window_seconds'))} (target {target}).</p>"
        f"<p>The newest source data it holds is {_hours(status.get('lag_seconds'))} old.</p>{advice}"
    )
    subject = f"[cdc-compaction] {table}: freshness SLO {what} ({shown})"
    send_alert(table, subject, body, _channels(emails, smtp_conn_id, channels))
