"""The parts every mode's Airflow side shares (the interface is :class:`cdc_compaction.core.mode.TableMode`)."""

from __future__ import annotations

from cdc_compaction.core.registry import TableConfig


def nan_columns(cfg: TableConfig, columns: list[str]) -> list[str]:
    """The floating-point ones of ``columns``: NaN is refused there (Spark sorts it above +inf)."""
    types = {c.name: c.type.lower() for c in cfg.columns}
    return [c for c in columns if types.get(c) in ("float", "double")]
