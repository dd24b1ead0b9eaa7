"""Tests of ``cdc_compaction.cli``, one file per command module (a package: ``test_registry`` stays unique)."""
