"""The compaction of each table mode other than ``cdc``, one module per mode (Spark side; stdlib and PySpark only)."""
