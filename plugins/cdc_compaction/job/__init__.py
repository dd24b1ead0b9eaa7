"""The Spark side of cdc_compaction: what spark-submit ships to the cluster.

A leaf package: its modules import the standard library, pyspark and each other, never
Airflow and never a ``cdc_compaction`` module outside ``job/`` (``tests/job`` checks it).

* :mod:`.contract` -- every name and file format the Airflow side and the job share
  (pure standard library: the DAG's modules import it at parse time);
* :mod:`.faults` -- the named fault points of the crash tests, for both sides.
"""

from __future__ import annotations
