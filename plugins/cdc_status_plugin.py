"""The "CDC tables" page for a plugins folder: a re-export of :mod:`cdc_compaction.airflow.plugin`.

Airflow 3 loads this file from the plugins folder (``plugins/.airflowignore`` keeps the
``cdc_compaction`` package out of the loader).  When the package is installed (``make install``,
``pip install cdc-compaction``) its ``airflow.plugins`` entry point registers the plugin instead:
this file then exports nothing, because Airflow registers a plugin name once and reports a second
registration as a plugin import error.
"""

from __future__ import annotations

from cdc_compaction.airflow.plugin import registered_by_entry_point

if not registered_by_entry_point():
    from cdc_compaction.airflow.plugin import CdcTablesPlugin

    __all__ = ["CdcTablesPlugin"]
