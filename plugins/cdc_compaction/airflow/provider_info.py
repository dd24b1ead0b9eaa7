"""The package's ``apache_airflow_provider`` entry point: what Airflow's providers manager lists.

``airflow providers list`` names the installed version, ``airflow providers notifications`` the
failure notifier.  It lists no plugin: the ``airflow.plugins`` entry point registers the CDC
tables page already (a second registration would be reported as a plugin import error).

Airflow reads this while it initializes its configuration, so this module imports nothing of
Airflow (``airflow.configuration`` is half-imported then: importing it here is a circular import).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

DISTRIBUTION = "cdc-compaction"


def get_provider_info() -> dict[str, Any]:
    """The provider info, in the form of Airflow's ``provider_info.schema.json``."""
    try:
        versions = [version(DISTRIBUTION)]
    except PackageNotFoundError:  # imported from a clone that was never installed
        versions = []
    return {
        "package-name": DISTRIBUTION,
        "name": "CDC compaction",
        "description": "Registry-driven DAGs that compact CDC change files into Hive tables with Spark, "
        "and the Airflow UI's CDC tables page.",
        "versions": versions,
        "notifications": ["cdc_compaction.integrations.notifications.CdcAlertNotifier"],
    }
