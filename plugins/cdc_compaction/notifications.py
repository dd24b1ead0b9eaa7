"""Per-table alerting: a notifier that logs, and e-mails the table's alert targets.

Attached to every task of a table's DAG as ``on_failure_callback``; the ``validate``
task also calls :func:`alert_rejected_rows` when a compaction refused rows.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseNotifier

from cdc_compaction.exceptions import CdcCompactionError

log = logging.getLogger(__name__)


def _error_text(exc: BaseException | None) -> str:
    """``Type: message``; a subclass of this package's errors also names its family (``X (a PlanError)``)."""
    if exc is None:
        return "(no exception in context)"
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
        "error": _error_text(exc),
    }


class CdcAlertNotifier(BaseNotifier):
    """Tell a table's owners that one of its tasks failed: the table, task, error and log URL."""

    # Nothing is templated. Airflow renders a notifier's template_fields before notify(), and the
    # table, addresses and connection id all come from the registry: an address written as
    # "{{ conn.smtp_default.password }}@x.io" would otherwise mail a password to x.io.
    template_fields: Sequence[str] = ()

    def __init__(self, *, table: str, emails: list[str], smtp_conn_id: str = "smtp_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.emails = list(emails)
        self.smtp_conn_id = smtp_conn_id

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
        if self.emails:
            send_email(self.smtp_conn_id, self.emails, subject, body)


def send_email(smtp_conn_id: str, to: list[str], subject: str, body: str) -> None:
    """Send one HTML e-mail through an Airflow SMTP connection."""
    from airflow.providers.smtp.hooks.smtp import SmtpHook

    with SmtpHook(smtp_conn_id=smtp_conn_id) as hook:
        hook.send_email_smtp(
            to=to, subject=subject, html_content=body, from_email=hook.from_email or "airflow@localhost"
        )


def alert_rejected_rows(
    table: str, emails: list[str], smtp_conn_id: str, stats: dict[str, Any], quarantine: str
) -> None:
    """Warn that a compaction refused rows (they are kept in quarantine, not lost)."""
    n = int(stats.get("rejected_rows", 0))
    if n <= 0:
        return
    reasons = stats.get("rejected_by_reason", {})
    log.warning("%s: %d rows refused and quarantined at %s, by reason %s", table, n, quarantine, reasons)
    if emails:
        subject = f"[cdc-compaction] {table}: {n} change events refused"
        body = (
            f"<p>{n} change events of <b>{html.escape(table)}</b> were refused and kept in quarantine at "
            f"<code>{html.escape(quarantine)}</code>.</p><p>By reason: {html.escape(str(reasons))}</p>"
            "<p>Fix them at the source, or correct the files and re-land them as a new increment.</p>"
        )
        send_email(smtp_conn_id, emails, subject, body)


def alert_quarantined_files(table: str, emails: list[str], smtp_conn_id: str, files: list[dict[str, Any]]) -> None:
    """Warn that a plan set whole landed files aside (``on_bad_file: quarantine``)."""
    if not files:
        return
    log.warning("%s: %d landed files moved to quarantine: %s", table, len(files), files)
    if emails:
        items = "".join(
            f"<li><code>{html.escape(f['file'])}</code> &rarr; <code>{html.escape(f['quarantined_to'])}</code>: "
            f"{html.escape(f['reason'])}</li>"
            for f in files
        )
        body = (
            f"<p>{len(files)} landed files of <b>{html.escape(table)}</b> cannot be compacted and were moved to "
            f"quarantine:</p><ul>{items}</ul><p>Fix them (or the registry), then re-ingest: "
            f"<code>python -m cdc_compaction quarantine list {html.escape(table)}</code>.</p>"
        )
        send_email(smtp_conn_id, emails, f"[cdc-compaction] {table}: {len(files)} files quarantined", body)
