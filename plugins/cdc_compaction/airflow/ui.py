"""The "CDC tables" pages of the Airflow UI: a FastAPI app that ``cdc_compaction.airflow.plugin`` mounts.

``/cdc/`` lists every registry table (freshness against its SLO, last commit, pending hours,
quarantine, paused) with a link to its DAG; ``/cdc/table/<db.table>`` shows one table's commit
history and a freshness chart.  The pages are server-rendered HTML with an inline SVG chart and
one inline script (the DAG links inside the UI's iframe): no CDN, so they work on a closed network.

They read what ``cdc-compaction status`` reads (:mod:`cdc_compaction.operations.status`) and
only show the tables whose DAG the signed-in Airflow user may read (the auth manager decides,
with the JWT of the UI's session cookie or an ``Authorization`` header).
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from cdc_compaction.core import settings
from cdc_compaction.core.landing import increment_hour
from cdc_compaction.core.registry import RegistryEntry, TableConfig, load_registry
from cdc_compaction.operations.status import (
    READ_ERRORS,
    AirflowView,
    CommitSummary,
    TableStatus,
    commit_history,
    format_age,
    parse_time,
    read_airflow,
    registry_error_status,
    table_status,
)

log = logging.getLogger(__name__)

# The plugin mounts the app at /cdc; the pages' own links are relative to it.  The cells that hold
# long unbroken text (paths and errors, run lines, DAG ids) may break anywhere: the page fits a
# 1280 px screen, and Airflow's embedded view, without horizontal scrolling when errors are shown.
_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2rem;color:#1a202c}
table{border-collapse:collapse;font-size:.9rem}
th,td{padding:.35rem .6rem;border-bottom:1px solid #e2e8f0;text-align:left}
th{background:#f7fafc}td.num{text-align:right}.late{color:#c53030;font-weight:600}.ok{color:#2f855a}
.err{color:#c53030}.muted{color:#718096}
.err,td.last-run,td.lease,td.commit,a.dag{overflow-wrap:anywhere}.failed{color:#c53030;font-weight:600}h1{font-size:1.3rem}h2{font-size:1.1rem;margin-top:1.5rem}
"""


# Airflow embeds the page in a sandboxed iframe (no allow-top-navigation), so a DAG link's
# target="_top" is refused there.  The frame is same-origin, so the link instead moves the UI's
# own router (a history entry plus the popstate event it listens to), as a click in the UI would.
# Outside an iframe, or if the UI is elsewhere, the link works as a plain link.
_SCRIPT = """
document.addEventListener("click", function (e) {
  var a = e.target.closest && e.target.closest("a.dag");
  if (!a || window.top === window) return;
  try {
    var url = new URL(a.href);
    window.top.history.pushState(null, "", url.pathname);
    window.top.dispatchEvent(new PopStateEvent("popstate", {state: null}));
    e.preventDefault();
  } catch (err) {}
});
"""


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>{body}</body></html>"
    )


def _freshness_cell(st: TableStatus) -> str:
    cls = {"ok": "ok", "late": "late"}.get(st.slo_state, "")
    return f'<td class="freshness {cls}">{html.escape(st.freshness_text)}</td>'


def _run_cells(st: TableStatus) -> str:
    """The last run (state, when, failed task, try, error's first line) and the next run, as two cells."""
    run = st.last_run
    if run is None:
        last = '<td class="last-run muted">no run</td>'
    else:
        cls = "failed" if run.state == "failed" or run.failed_task else ""
        last = f'<td class="last-run {cls}" data-state="{html.escape(run.state)}">{html.escape(run.text)}</td>'
    return last + f'<td class="next-run">{html.escape(st.next_run_text)}</td>'


def _dag_link(dag_id: str) -> str:
    return f'<a class="dag" href="../dags/{quote(dag_id)}" target="_top">{html.escape(dag_id)}</a>'


def render_index(
    items: list[TableStatus], now: datetime, broken: list[tuple[RegistryEntry, TableStatus]] | None = None
) -> str:
    """The list page: one row per table, then one per invalid registry file. Links are relative to ``/cdc/``.

    ``broken`` are the registry files that do not validate, each with the status of its error DAG
    (its runs fail with the registry error): they are tables someone meant to compact.
    """
    rows = []
    for st in items:
        name = html.escape(st.table)
        table_link = f'<a class="table" href="table/{quote(st.table)}">{name}</a>'
        dag_link = _dag_link(st.dag_id)
        if st.error:
            rows.append(
                f'<tr data-table="{name}"><td>{table_link}</td><td colspan="5" class="err">'
                f'{html.escape(st.error)}</td>{_run_cells(st)}<td class="paused">{st.paused_text}</td>'
                f"<td>{dag_link}</td></tr>"
            )
            continue
        c = st.last_commit
        commit = (
            f"{c.seq} at {html.escape(c.committed_at[:19])} ({c.rows if c.rows is not None else '?'} rows)"
            if c is not None and c.seq
            else '<span class="muted">none</span>'
        )
        pending = f'<span title="{html.escape(", ".join(st.pending))}">{len(st.pending)}</span>'
        rows.append(
            f'<tr data-table="{name}"><td>{table_link}</td>{_freshness_cell(st)}'
            f'<td class="commit">{commit}</td><td class="num pending">{pending}</td>'
            f'<td class="num quarantine">{st.quarantine_waiting}</td><td class="lease">{html.escape(st.lease)}</td>'
            f'{_run_cells(st)}<td class="paused">{st.paused_text}</td><td>{dag_link}</td></tr>'
        )
    for entry, st in broken or []:
        err = entry.error
        problems = "; ".join(err.problems) if err is not None else "(unknown error)"
        rows.append(
            f'<tr data-registry-file="{html.escape(entry.path.name)}" class="registry-error">'
            f"<td>{html.escape(entry.path.name)}</td>"
            f'<td colspan="5" class="err">invalid registry entry {html.escape(str(entry.path))}: '
            f"{html.escape(problems)} (fix the file; `cdc-compaction registry validate` checks it)</td>"
            f'{_run_cells(st)}<td class="paused">{st.paused_text}</td><td>{_dag_link(entry.dag_id)}</td></tr>'
        )
    body = (
        "<h1>CDC tables</h1>"
        f'<p class="muted">{len(items)} tables'
        + (f", {len(broken)} invalid registry file{'s' if len(broken) != 1 else ''}" if broken else "")
        + f", as of {now.strftime('%Y-%m-%d %H:%M:%S')} UTC. Freshness: now minus "
        "the newest source event time compacted (against the table's SLO when it has one).</p>"
        '<table id="cdc-tables"><thead><tr><th>table</th><th>freshness</th><th>last commit</th>'
        "<th>pending hours</th><th>quarantine waiting</th><th>lease</th><th>last run</th><th>next run</th>"
        "<th>paused</th><th>DAG</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    return _page("CDC tables", body)


def _basis_time(cfg: TableConfig, c: CommitSummary) -> datetime | None:
    """What a commit's freshness is measured from: its newest event time, else its newest increment's end."""
    event = parse_time(c.event_time)
    if event is not None:
        return event
    hour = increment_hour(cfg, c.increment) if c.increment else None
    return hour + timedelta(hours=1) if hour is not None else None


def freshness_points(cfg: TableConfig, history: list[CommitSummary], now: datetime) -> list[tuple[datetime, float]]:
    """The freshness (seconds) over time: it drops at each commit and grows by the clock until the next.

    Between commits the table holds the same newest event, so its age rises with slope one;
    a commit resets it to ``committed_at - newest event``.  The last segment runs to ``now``.
    """
    points: list[tuple[datetime, float]] = []
    basis: datetime | None = None
    for c in history:
        at, new_basis = parse_time(c.committed_at), _basis_time(cfg, c)
        if at is None or new_basis is None:
            continue
        if basis is not None:
            points.append((at, (at - basis).total_seconds()))  # just before this commit
        basis = new_basis
        points.append((at, (at - basis).total_seconds()))
    if basis is not None and points and now > points[-1][0]:
        points.append((now, (now - basis).total_seconds()))
    return points


def freshness_svg(points: list[tuple[datetime, float]], slo_seconds: float | None, width: int = 720) -> str:
    """An inline SVG line chart of freshness in hours, with the SLO as a dashed line."""
    height, pad = 240, 44
    if len(points) < 2:
        return '<p class="muted" id="freshness-chart">Not enough commits for a chart yet.</p>'
    t0, t1 = points[0][0], points[-1][0]
    span = max((t1 - t0).total_seconds(), 1.0)
    top = max(max(v for _, v in points), slo_seconds or 0.0, 60.0) * 1.1

    def xy(t: datetime, v: float) -> tuple[float, float]:
        x = pad + (t - t0).total_seconds() / span * (width - 2 * pad)
        y = height - pad - max(v, 0.0) / top * (height - 2 * pad)
        return round(x, 1), round(y, 1)

    line = " ".join(f"{x},{y}" for x, y in (xy(t, v) for t, v in points))
    parts = [
        f'<svg id="freshness-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="freshness over time">',
        f'<rect x="{pad}" y="{pad}" width="{width - 2 * pad}" height="{height - 2 * pad}" fill="#f7fafc"/>',
        f'<polyline class="freshness" fill="none" stroke="#3182ce" stroke-width="2" points="{line}"/>',
        f'<text x="{pad}" y="{pad - 8}" font-size="11">{html.escape(format_age(top))}</text>',
        f'<text x="{pad}" y="{height - pad + 16}" font-size="11">{t0.strftime("%m-%d %H:%M")}</text>',
        f'<text x="{width - pad}" y="{height - pad + 16}" font-size="11" text-anchor="end">'
        f"{t1.strftime('%m-%d %H:%M')}</text>",
        f'<text x="4" y="{height / 2}" font-size="11">age</text>',
    ]
    if slo_seconds is not None:
        _, y = xy(t0, slo_seconds)
        parts.append(
            f'<line class="slo" x1="{pad}" x2="{width - pad}" y1="{y}" y2="{y}" stroke="#c53030" '
            f'stroke-dasharray="6 4"/><text x="{width - pad}" y="{y - 4}" font-size="11" text-anchor="end" '
            f'fill="#c53030">SLO {html.escape(format_age(slo_seconds))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def render_table(cfg: TableConfig, st: TableStatus, history: list[CommitSummary], now: datetime) -> str:
    """One table's page (links relative to ``/cdc/table/<name>``)."""
    name = html.escape(st.table)
    rows = "".join(
        f'<tr data-seq="{c.seq}"><td class="num">{c.seq}</td><td>{html.escape(c.committed_at[:19])}</td>'
        f"<td>{html.escape(c.version)}</td><td class='num'>{c.rows if c.rows is not None else '?'}</td>"
        f"<td class='num'>{c.change_rows if c.change_rows is not None else '?'}</td>"
        f"<td class='num'>{c.increment_rows if c.increment_rows is not None else '?'}</td>"
        f"<td>{html.escape(', '.join(c.increments) or c.note)}</td><td>{html.escape(c.event_time[:19] or '-')}</td>"
        f"<td>{html.escape(format_age(c.lag_seconds))}</td></tr>"
        for c in reversed(history)
    )
    body = (
        f'<p><a href="../">&larr; CDC tables</a></p><h1>{name}</h1>'
        f'<p>DAG <a class="dag" href="../../dags/{quote(st.dag_id)}" target="_top">{html.escape(st.dag_id)}</a>'
        f' ({st.paused_text}). Last run: <span class="last-run">{html.escape(st.last_run_text)}</span>. '
        f"Next run: {html.escape(st.next_run_text)}. Live version {html.escape(st.live_version)}. Freshness "
        f'<span class="freshness">{html.escape(st.freshness_text)}</span>. Pending hours {len(st.pending)}'
        f"{': ' + html.escape(', '.join(st.pending)) if st.pending else ''}. Compaction: "
        f'<span class="compaction">{html.escape(st.compaction_text)}</span>. Quarantine: {st.quarantine_waiting} '
        f"waiting of {st.quarantine_entries}. Lease: {html.escape(st.lease)}.</p>"
        + (f'<p class="err">{html.escape(st.error)}</p>' if st.error else "")
        + "<h2>Freshness</h2>"
        + freshness_svg(freshness_points(cfg, history, now), st.slo_seconds)
        + f"<h2>Commits ({len(history)})</h2>"
        '<table id="commits"><thead><tr><th>#</th><th>committed</th><th>version</th><th>rows</th>'
        "<th>changed rows</th><th>landed change rows</th><th>increments</th><th>newest event</th>"
        "<th>age at commit</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
    return _page(f"CDC table {st.table}", body)


def _airflow() -> AirflowView | None:
    """Paused flags and runs, from the database and task logs of the api-server's own configuration."""
    try:
        from airflow.configuration import conf
    except ImportError:  # outside Airflow (the pages' unit tests): as the status command finds them
        return read_airflow()
    return read_airflow(str(conf.get("database", "sql_alchemy_conn")), str(conf.get("logging", "base_log_folder")))


def _entries() -> list[RegistryEntry]:
    return load_registry(settings.registry_dir())


def _configs() -> list[TableConfig]:
    return [e.config for e in _entries() if e.config is not None and e.error is None]


async def airflow_readable_dags(request: Request) -> Callable[[set[str]], set[str]]:
    """A FastAPI dependency: a filter to the DAG ids the signed-in Airflow user may read (401 without a session).

    Airflow's API modules are imported here, per request in the api-server, not when the plugin
    loads: every Airflow process (scheduler, task runners) loads plugins, and these cost seconds.
    """
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    # The same resolution as Airflow's own routes: a bearer token, else the UI's session cookie.
    user = await get_user(request, None, await bearer_scheme(request))
    return lambda dag_ids: get_auth_manager().filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method="GET")


def create_app(readable_dags: Callable[..., Any] | None = None) -> FastAPI:
    """The FastAPI app of the pages; ``readable_dags`` is the access dependency (Airflow's by default)."""
    dependency = readable_dags or airflow_readable_dags
    app = FastAPI(title="CDC tables", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/openlineage/CdcCompactionRunFacet.json")
    def run_facet_schema() -> Any:
        """The JSON schema the OpenLineage run facet names as its ``_schemaURL`` (public: it is a spec)."""
        from cdc_compaction.integrations.lineage import RUN_FACET_SCHEMA

        return RUN_FACET_SCHEMA

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request, allowed: Any = Depends(dependency)) -> Any:  # noqa: B008
        if not request.url.path.endswith("/"):
            # The page's links are relative to the directory: /cdc must become /cdc/.
            return RedirectResponse(str(request.url.replace(path=request.url.path + "/")))
        now = datetime.now(UTC)
        entries = _entries()
        configs = [e.config for e in entries if e.config is not None and e.error is None]
        bad = [e for e in entries if e.error is not None]
        # A bad file's error DAG is guarded like any DAG: shown to those who may read it.
        visible = allowed({c.dag_id for c in configs} | {e.dag_id for e in bad})
        view = _airflow()
        items = [table_status(c, now, airflow=view) for c in configs if c.dag_id in visible]
        broken = [(e, registry_error_status(e, view)) for e in bad if e.dag_id in visible]
        return HTMLResponse(render_index(items, now, broken))

    @app.get("/table/{name}", response_class=HTMLResponse)
    def table(name: str, allowed: Any = Depends(dependency)) -> Any:  # noqa: B008
        cfg = next((c for c in _configs() if c.qualified_name == name), None)
        if cfg is None or cfg.dag_id not in allowed({cfg.dag_id}):
            raise HTTPException(
                status_code=404,
                detail=f"{name}: no valid registry entry of that name, or your Airflow user may not read its DAG; "
                "check the name on the CDC tables page (`cdc-compaction registry validate` lists the "
                "entries) or ask for read access to the DAG",
            )
        now = datetime.now(UTC)
        st = table_status(cfg, now, airflow=_airflow())
        try:
            history = commit_history(cfg)
        except READ_ERRORS as exc:  # the page still shows the status, whose line names the error
            log.warning("%s: commit history unreadable: %s", name, exc)
            history = []
        return HTMLResponse(render_table(cfg, st, history, now))

    return app
