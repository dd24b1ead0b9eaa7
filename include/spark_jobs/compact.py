"""spark-submit's main file for the compaction job, :mod:`cdc_compaction.job.compact`.

spark-submit needs a main ``.py`` file; the job itself ships in the job package, the zip of
``cdc_compaction/__init__.py`` and ``cdc_compaction/job/`` that the DAG's compact task builds
when it runs and passes as ``--py-files`` (``cdc-compaction job-package`` builds it
by hand, e.g. to upload it for EMR):

    spark-submit --py-files cdc_compaction_job-<hash>.zip include/spark_jobs/compact.py --plan <plan.json>
"""

from __future__ import annotations

import sys

from cdc_compaction.job.compact import main

if __name__ == "__main__":
    sys.exit(main())
