"""The Spark side of cdc_compaction: what spark-submit ships to the cluster.

A leaf package: its modules import the standard library, pyspark and each other, never
Airflow and never a ``cdc_compaction`` module outside ``job/`` (``tests/job`` checks it), so
that ``cdc_compaction/__init__.py`` plus this directory, zipped by :mod:`.bundle`, is all a
cluster needs (``spark-submit --py-files``).

* :mod:`.contract` -- every name and file format the Airflow side and the job share
  (pure standard library: the DAG's modules import it at parse time);
* :mod:`.faults` -- the named fault points of the crash tests, for both sides;
* :mod:`.compact`, :mod:`.run_sql` -- the jobs (``include/spark_jobs`` holds their entry scripts);
  ``compact`` dispatches by the plan's mode to ``modes/<mode>.py`` (``run_<mode>``);
* :mod:`.common` -- what every mode's compaction shares (the modes never import ``compact``);
* :mod:`.bundle` -- builds the zip that ships them (the job package).
"""

from __future__ import annotations
