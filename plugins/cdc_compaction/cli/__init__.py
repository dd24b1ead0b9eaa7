"""The command line, ``cdc-compaction <command>``: one module per command group, assembled by :mod:`.main`.

Each command module has ``add_parser(sub)``, which adds its commands to the top-level subparsers and
sets each one's handler (``func``).  Handlers import what they run inside the function: ``--help``
and every command start without loading Spark, Airflow or PyArrow.
"""
