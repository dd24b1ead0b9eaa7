"""Run a list of SQL statements against the Hive metastore with Spark SQL.

Used for DDL (create tables, add columns, create views) rendered from the templates
in ``include/sql``.  Part of the job package, like the compaction; ``include/spark_jobs/run_sql.py``
is its entry script:

    spark-submit --conf spark.sql.catalogImplementation=hive \\
        --conf spark.hadoop.hive.metastore.uris=thrift://host:9083 \\
        --py-files cdc_compaction_job-<hash>.zip include/spark_jobs/run_sql.py --statements statements.json
"""

from __future__ import annotations

import argparse
import json
import logging

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def run_statements(spark: SparkSession, statements: list[str]) -> int:
    """Execute ``statements`` in order; stop at the first failure (which is raised)."""
    # Statements carry registry text (column comments) that must reach the metastore verbatim:
    # with substitution on (Spark's default), Spark replaces ``${env:HOME}`` or ``${spark.x}``
    # even inside string literals. Set here too, not only by the submitting engine: the session
    # may come from elsewhere (spark-defaults.conf, a shared in-process session).
    spark.conf.set("spark.sql.variable.substitute", "false")
    for i, stmt in enumerate(statements, 1):
        first_line = stmt.strip().splitlines()[0] if stmt.strip() else ""
        log.info("statement %d/%d: %s", i, len(statements), first_line)
        spark.sql(stmt)
    return len(statements)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run SQL statements from a JSON list with Spark SQL.")
    parser.add_argument("--statements", required=True, help="JSON file holding a list of SQL statements")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # No appName here: it would override spark-submit --name (cdc-ddl-<db>.<table>).
    spark = SparkSession.builder.enableHiveSupport().getOrCreate()
    try:
        text = "\n".join(r.value for r in spark.read.text(args.statements, wholetext=True).collect())
        n = run_statements(spark, json.loads(text))
        print(json.dumps({"cdc_compaction_statements": n}))
    finally:
        spark.stop()
    return 0
