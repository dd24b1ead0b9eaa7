"""The embedded default and the demos: local metastore, Spark Connect and PostgreSQL, the conformance runner.

Only the command line and the tests import it (``lint-imports``): a deployment never runs it.
"""
