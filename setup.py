"""Build glue pyproject.toml cannot express: the package lives in plugins/, its run-time files in include/ and dags/.

The wheel holds ``cdc_compaction`` (from ``plugins/``) and, as ``cdc_compaction/resources/``, what it reads at
run time: the SQL templates (``include/sql``), the spark-submit main files (``include/spark_jobs``), the local
metastore's launcher (``include/metastore``) and the DAG file (``dags/``) to copy into a deployment's DAG folder.
The repository keeps its layout: from a clone, :mod:`cdc_compaction.core.settings` finds ``include/`` beside
``plugins/``; installed, it finds ``cdc_compaction/resources`` (README, "Installing the package").
Everything else is in pyproject.toml.
"""

from __future__ import annotations

import os

from setuptools import find_packages, setup

#: Repository directory -> where it goes inside the installed package.
RESOURCES = {"include/sql": "sql", "include/spark_jobs": "spark_jobs", "include/metastore": "metastore", "dags": "dags"}
RESOURCE_PACKAGE = "cdc_compaction.resources"


def _resource_packages() -> tuple[dict[str, str], dict[str, list[str]]]:
    """Every resource directory as a (data-only) package: setuptools installs package data of packages only."""
    package_dir: dict[str, str] = {}
    package_data: dict[str, list[str]] = {}
    for source, target in RESOURCES.items():
        for root, dirs, _files in os.walk(source):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = os.path.relpath(root, source)
            name = ".".join([RESOURCE_PACKAGE, target, *([] if rel == "." else rel.split(os.sep))])
            package_dir[name] = root
            package_data[name] = ["*.j2", "*.py", "*.java"]
    return package_dir, package_data


_resource_dirs, _resource_data = _resource_packages()
setup(
    packages=[*find_packages("plugins", include=["cdc_compaction", "cdc_compaction.*"]), *_resource_dirs],
    package_dir={"": "plugins", **_resource_dirs},
    package_data=_resource_data,
    include_package_data=False,
)
