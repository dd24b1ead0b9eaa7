"""Tests of ``cdc_compaction.pipeline``, one file per module (a package: names like ``test_plan`` stay unique)."""
