"""What several commands share: the ``DB.TABLE --registry-dir`` arguments and the registry entry they name."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cdc_compaction.core import settings


def add_table_args(p: argparse.ArgumentParser) -> None:
    """``table`` (DB.TABLE) and ``--registry-dir``: the arguments of every command over one registry table."""
    p.add_argument("table", help="database.table as in the registry")
    p.add_argument("--registry-dir", help="registry directory (default: $CDC_REGISTRY_DIR or include/registry)")


def table_config(args: argparse.Namespace) -> Any:
    """The valid registry entry of ``args.table``; its file's own error if that file is broken, else a RegistryError."""
    from cdc_compaction.core.exceptions import RegistryError
    from cdc_compaction.core.registry import load_registry

    directory = Path(args.registry_dir or settings.registry_dir())
    for e in load_registry(directory):
        if e.error is None and e.config.qualified_name == args.table:
            return e.config
        if e.error is not None and e.path.name.startswith(f"{args.table}."):
            raise e.error
    raise RegistryError(str(directory), args.table, [f"no valid registry entry for table {args.table}"])
