"""Airflow UI plugin: the "CDC tables" page (``/cdc/``) in the navigation, one page per table.

Installed (``pip install cdc-compaction``, or ``make install``'s editable install), Airflow finds
:class:`CdcTablesPlugin` through the package's ``airflow.plugins`` entry point: no file to copy.
A plugins folder without the installed package gets it from ``plugins/cdc_status_plugin.py``, a
thin re-export of this module that stays empty when the entry point exists (Airflow registers a
plugin name once and reports the second registration as a plugin import error).

The pages are a FastAPI app mounted at ``/cdc`` by the api-server; ``external_views`` puts it in
the UI's navigation as an embedded view.  See :mod:`cdc_compaction.airflow.ui`.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/cdc"
#: The ``airflow.plugins`` entry point of the installed distribution (pyproject.toml).
ENTRY_POINT = "cdc_compaction.airflow.plugin:CdcTablesPlugin"


class LazyApp:
    """An ASGI app that builds the pages' FastAPI app on its first request.

    Every Airflow process loads plugins (scheduler, DAG processor, each task runner), but only
    the api-server serves the pages: the others do not pay for importing FastAPI and the pages.
    """

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from cdc_compaction.airflow.ui import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class CdcTablesPlugin(AirflowPlugin):
    """Mounts the CDC tables pages and links them from the UI's navigation."""

    name = "cdc_compaction_tables"
    fastapi_apps = [{"app": LazyApp(), "url_prefix": URL_PREFIX, "name": "CDC tables"}]
    external_views = [
        {"name": "CDC tables", "href": f"{URL_PREFIX}/", "url_route": "cdc-tables", "destination": "nav"},
    ]


def registered_by_entry_point() -> bool:
    """Whether an installed distribution registers :class:`CdcTablesPlugin` through ``airflow.plugins``."""
    return any(ep.value == ENTRY_POINT for ep in entry_points(group="airflow.plugins"))
