"""The names of a registry table's Hive objects, derived from its name alone (the registry checks their length)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdc_compaction.core.registry import TableConfig


def table_names(cfg: TableConfig) -> dict[str, str]:
    """Names of the Hive objects of one registry table."""
    t = cfg.table
    return {
        "base_table": f"{t}_base",
        "tombstones_table": f"{t}_tombstones",
        "incremental_table": f"{t}_incremental",
        "compactor_table": f"{t}_compactor",
        "view_name": f"{t}_view",
        "rejects_view": f"{t}_pending_rejects",
    }
