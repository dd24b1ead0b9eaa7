"""Table modes: one module per mode (``cdc``, ``keyless``, ``snapshot`` ...), each its registry model and Airflow side.

A module here that defines ``MODE`` (a :class:`~cdc_compaction.core.mode.TableMode`) is a mode:
:func:`cdc_compaction.core.mode.table_modes` finds it. Beside it, a mode owns its job module
(``cdc_compaction.job.modes.<mode>``), its templates (``include/sql/modes/<mode>/``), its
contract and scenarios (``tests/scenarios/<mode>/``) and its tests (``tests/modes/``).
"""
