"""One CDC compaction Airflow DAG per table of the registry ($CDC_REGISTRY_DIR, else include/registry/).

Thin on purpose, and the same in every deployment: copy it into the DAGs folder of an Airflow whose
environment has the ``cdc_compaction`` package (``pip install cdc-compaction``; the wheel ships this
file as ``cdc_compaction/resources/dags/``). :func:`cdc_compaction.airflow.factory.load_dags` reads and
validates the registry once per process and builds every DAG (a bad registry file becomes a failing
DAG of its own, never an import error of this file). Every parse logs one line of where it looked for
the registry and what it found, or, with none there, which variable to set (``CDC_REGISTRY_DIR``).

The two ``airflow`` imports are the modules the factory builds the DAGs with. Airflow's DAG processor
imports the airflow modules a DAG file names once, in its own process, before it forks each parse
(``[dag_processor] parsing_pre_import_modules``): named here, they are not imported again by every
parse (the Spark provider, with the OpenLineage client it loads, was about a quarter of one).
"""

import airflow.providers.apache.spark.operators.spark_submit
import airflow.providers.standard.operators.python  # noqa: F401

from cdc_compaction.airflow.factory import load_dags

load_dags(globals())
