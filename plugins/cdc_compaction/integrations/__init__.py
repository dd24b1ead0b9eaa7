"""The systems the package talks to: the metastore, Spark engines, alert channels, OpenLineage, PostgreSQL's catalog.

Each wraps one outside system behind the few calls the pipeline needs; none decides data.
"""
