"""spark-submit's main file for the DDL job, :mod:`cdc_compaction.job.run_sql`.

Like ``compact.py`` beside it: the job ships in the job package, passed as ``--py-files``:

    spark-submit --py-files cdc_compaction_job-<hash>.zip include/spark_jobs/run_sql.py --statements <file.json>
"""

from __future__ import annotations

import sys

from cdc_compaction.job.run_sql import main

if __name__ == "__main__":
    sys.exit(main())
