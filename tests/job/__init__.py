"""Tests of cdc_compaction.job (a package, so that its test modules cannot clash with tests/ by name)."""
