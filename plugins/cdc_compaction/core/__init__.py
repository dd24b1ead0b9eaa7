"""The domain, below everything else: registry models, lake layout and commit protocol, the rule's rendering, storage.

It imports no integration and no Spark (``lint-imports``): ``registry validate`` and the DAG file's
parse run with pydantic, PyYAML and Jinja alone. It finds the table modes without importing them
(:mod:`cdc_compaction.core.mode`).
"""
