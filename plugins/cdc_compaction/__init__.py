"""cdc_compaction: registry-driven Airflow DAGs that compact CDC change files with Spark.

Import the sub-modules you need; this package module stays import-light so that DAG
parsing does not pay for Spark, boto3 or the metastore client.
"""

from __future__ import annotations

__version__ = "0.1.0"
