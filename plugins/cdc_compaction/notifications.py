"""Per-table alerting: a notifier that logs, and e-mails the table's alert targets.

Attached to every task of a table's DAG as ``on_failure_callback``; the ``validate``
task also calls :func:`alert_rejected_rows` when a compaction refused rows.
"""

from __future__ import annotations

import html
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseNotifier

from cdc_compaction.exceptions import CdcCompactionError

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
            send_email(self.smtp_conn_id, self.emails, subject, body, table=self.table)


#: Alerts that could not be delivered in this process, by table (also sent to Airflow's metrics).
DELIVERY_FAILURES: Counter[str] = Counter()
DELIVERY_FAILED_METRIC = "cdc_compaction.alert_delivery_failed"


def send_email(smtp_conn_id: str, to: list[str], subject: str, body: str, table: str = "") -> bool:
    """Send one HTML e-mail through an Airflow SMTP connection; True if it was sent.

    Delivering an alert never decides whether data is published: a missing connection,
    an unreachable server or a refused recipient is logged with the alert's subject and
    counted (``cdc_compaction.alert_delivery_failed`` in Airflow's metrics), and the task
    goes on.
    """
    try:
        from airflow.providers.smtp.hooks.smtp import SmtpHook

        with SmtpHook(smtp_conn_id=smtp_conn_id) as hook:
            hook.send_email_smtp(
                to=to, subject=subject, html_content=body, from_email=hook.from_email or "airflow@localhost"
            )
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
    DELIVERY_FAILURES[table] += 1
    try:
        from airflow.sdk.observability.stats import Stats

        Stats.incr(DELIVERY_FAILED_METRIC, tags={"table": table})
    except Exception:  # a metrics back end that fails must not fail the task either
        log.warning("could not count the failed alert delivery in Airflow's metrics", exc_info=True)


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
        send_email(smtp_conn_id, emails, subject, body, table=table)


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
        send_email(smtp_conn_id, emails, f"[cdc-compaction] {table}: {len(files)} files quarantined", body, table=table)


def alert_ignored_landing(table: str, emails: list[str], smtp_conn_id: str, entries: list[dict[str, Any]]) -> None:
    """Warn that landed files or directories are never compacted (wrong place or name).

    Never raises (see :func:`send_email`): the next plan alerts again while they stay.
    """
    if not entries:
        return
    log.warning("%s: %d landed entries are never compacted: %s", table, len(entries), entries)
    if not emails:
        return
    items = "".join(f"<li><code>{html.escape(e['path'])}</code>: {html.escape(e['reason'])}</li>" for e in entries)
    body = (
        f"<p>{len(entries)} landed files or directories of <b>{html.escape(table)}</b> are not where the "
        f"table's runs take change files, so they are never compacted:</p><ul>{items}</ul>"
        "<p>Move each into the increment directory of its hour, or remove it.</p>"
    )
    send_email(
        smtp_conn_id, emails, f"[cdc-compaction] {table}: {len(entries)} landed entries ignored", body, table=table
    )


def alert_stalled_increments(
    table: str, emails: list[str], smtp_conn_id: str, increments: list[dict[str, Any]]
) -> None:
    """Warn that increments have waited longer than ``increments.alert_after`` to be complete.

    A writer's abandoned temporaries or a completion marker that never came keep an increment
    out of every compaction, possibly forever. Never raises (see :func:`send_email`).
    """
    if not increments:
        return
    log.warning("%s: %d increments are stalled, not complete: %s", table, len(increments), increments)
    if not emails:
        return
    items = "".join(f"<li><code>{html.escape(i['path'])}</code>: {html.escape(i['reason'])}</li>" for i in increments)
    body = (
        f"<p>{len(increments)} increments of <b>{html.escape(table)}</b> have waited too long to be complete, "
        f"so they are not compacted and their change events are in no base version yet:</p><ul>{items}</ul>"
        "<p>Remove a dead writer's temporaries, or create the completion marker once the increment is complete; "
        "the next run then compacts it.</p>"
    )
    send_email(
        smtp_conn_id, emails, f"[cdc-compaction] {table}: {len(increments)} increments stalled", body, table=table
    )


def _hours(seconds: Any) -> str:
    return "unknown" if seconds is None else f"{float(seconds) / 3600:.2f} h"


def alert_slo(table: str, emails: list[str], smtp_conn_id: str, status: dict[str, Any], breached: bool) -> None:
    """Tell a table's owners that its freshness SLO is breached, or met again (``slo.check``: once per change).

    Never raises (see :func:`send_email`).
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
    if not emails:
        return
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
    send_email(smtp_conn_id, emails, f"[cdc-compaction] {table}: freshness SLO {what} ({shown})", body, table=table)
