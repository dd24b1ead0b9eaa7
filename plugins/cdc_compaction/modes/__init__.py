"""Table modes: one module per mode on the Airflow side (``cdc`` …), chosen by the registry's ``mode``.

Adding a mode means: its registry class in :mod:`cdc_compaction.registry` (a member of
``TableSpec``), a :class:`~cdc_compaction.modes.base.TableMode` here, its job module in
:mod:`cdc_compaction.job.modes`, its templates in ``include/sql/modes/<mode>/`` and its tests.
"""

from __future__ import annotations

from cdc_compaction.modes.append import AppendMode
from cdc_compaction.modes.base import TableMode
from cdc_compaction.modes.cdc import CdcMode
from cdc_compaction.modes.keyless import KeylessMode
from cdc_compaction.modes.snapshot import SnapshotMode
from cdc_compaction.registry import TableConfig

MODES: dict[str, TableMode] = {m.name: m for m in (CdcMode(), KeylessMode(), SnapshotMode(), AppendMode())}


def mode_of(cfg: TableConfig) -> TableMode:
    """The mode of a validated registry table."""
    return MODES[cfg.mode]


def mode_named(name: str | None) -> TableMode:
    """The mode a plan or commit names (``None``: made before modes existed, so ``cdc``)."""
    return MODES[name or "cdc"]
