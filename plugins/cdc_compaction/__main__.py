"""``python -m cdc_compaction``: the command line of :mod:`cdc_compaction.cli.main` (``cdc-compaction``)."""

from cdc_compaction.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
