"""Airflow UI plugin: the "CDC tables" page (``/cdc/``) in the navigation, one page per table.

Airflow 3 loads this file from the plugins folder (``plugins/.airflowignore`` keeps the
``cdc_compaction`` package out of the loader; this file is the only plugin).  The pages are a
FastAPI app mounted at ``/cdc`` by the api-server; ``external_views`` puts it in the UI's
navigation as an embedded view.  See :mod:`cdc_compaction.ui`.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from cdc_compaction.ui import URL_PREFIX, create_app


class CdcTablesPlugin(AirflowPlugin):
    """Mounts the CDC tables pages and links them from the UI's navigation."""

    name = "cdc_compaction_tables"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "CDC tables"}]
    external_views = [
        {"name": "CDC tables", "href": f"{URL_PREFIX}/", "url_route": "cdc-tables", "destination": "nav"},
    ]
