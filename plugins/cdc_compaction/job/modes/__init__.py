"""The compaction of each table mode, one module per mode, ``<mode>.py`` defining ``run_<mode>(spark, plan, attempt)``.

The entry point (:mod:`cdc_compaction.job.compact`) finds a mode's module by the plan's mode name. Spark
side: a mode imports only :mod:`..common`, the contract and the standard library and PySpark, never the entry point.
"""
