"""One CDC compaction Airflow DAG per table of the registry ($CDC_REGISTRY_DIR, else include/registry/).

Thin on purpose, and the same in every deployment: copy it into the DAGs folder of an Airflow whose
environment has the ``cdc_compaction`` package (``pip install cdc-compaction``; the wheel ships this
file as ``cdc_compaction/resources/dags/``). :func:`cdc_compaction.airflow.factory.load_dags` reads and
validates the registry once per process and builds every DAG (a bad registry file becomes a failing
DAG of its own, never an import error of this file).
"""

from cdc_compaction.airflow.factory import load_dags

load_dags(globals())
